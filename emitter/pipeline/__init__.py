"""The zoo pipeline: program configs, the doit actions, the lock history, the report and the
progress line. Standard library (and doit) only at import: a no-op run loads no numpy."""
