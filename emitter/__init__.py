"""LOGOS tensor programs to verified SambaFlow ingestion bundles.

The data flows one way, and each folder is one part of it (docs/ARCHITECTURE.md):
text → `language` (reader, Program IR) → `sambaflow` (the bundle) | `verify` (VM, lock check) →
verdict → `pipeline` (doit tasks, results, report); `ops` defines every op once; `importers` make
weights directories from checkpoints. The public names below load on first use (PEP 562), so
importing a submodule such as `emitter.pipeline.config` does not pay for the op table and numpy.

Before any submodule loads, the package's .pyc files are made checked-hash (`bytecode`): the code
that runs is always the source that was hashed, even after an edit that kept size and mtime; and
each module's source is hashed as its import reads it, so a code digest names the code that runs.
"""

import importlib
import os

from .bytecode import check_sources, record_imports

check_sources(os.path.dirname(os.path.abspath(__file__)))
record_imports(__file__, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bytecode.py"))

__version__ = "0.2.0"

_EXPORTS = {
    "QWEN38_OPS": "sambaflow.emit", "TorchArtifact": "sambaflow.emit",
    "emit_program": "sambaflow.emit", "emit_torch_module": "sambaflow.emit",
    "write_bundle": "sambaflow.emit", "TEMPLATE_MARK": "sambaflow.marks",
    "VENDOR_HEADER": "sambaflow.marks", "program_name": "sambaflow.marks",
    "ProgramError": "language.errors", "gguf_name": "language.names", "torch_spelling": "ops",
    "read_file": "language.reader", "read_program": "language.reader",
    "read_tensor_sentences": "language.reader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'emitter' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
