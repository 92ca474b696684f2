"""The pipeline's log lines (warnings, what a run did beside its verdicts, why it chose what it
handed doit) go through `logging`, logger "logos", to stderr as the message alone. doit's own
`--verbosity` sets the level: 0 warnings and errors only, 1 (doit's default) information too, 2
debugging lines as well. Verdicts, the progress line and the run's last line are output, not logs."""

import logging
import sys

LOG = logging.getLogger("logos")
LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}


def verbosity(args):
    """doit's `-v N` / `--verbosity N` (`-vN`, `--verbosity=N`) among its arguments, else 1."""
    args = list(args or ())
    for i, a in enumerate(args):
        for flag in ("-v", "--verbosity"):
            value = args[i + 1] if a == flag and i + 1 < len(args) else \
                a[len(flag):].lstrip("=") if a.startswith(flag) and a != flag else None
            if value is not None and value.isdigit():
                return min(int(value), 2)
    return 1


def setup(level_of_verbosity):
    """One handler on stderr (once per process), at the level doit's verbosity asks."""
    if not any(getattr(h, "logos", False) for h in LOG.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(message)s"))
        h.logos = True
        LOG.addHandler(h)
        LOG.propagate = False
    LOG.setLevel(LEVELS.get(level_of_verbosity, logging.INFO))
