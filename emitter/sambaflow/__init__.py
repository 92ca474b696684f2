"""The bundle for SambaFlow: model.py (the program over `runtime.py`'s functions), manifest.json and
compile.py (`app.py`'s functions). Emission reads those two files as text and never imports torch."""
