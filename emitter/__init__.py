"""LOGOS tensor programs to verified SambaFlow ingestion bundles: reader, emitter, VM, lock check.

The public names load on first use (PEP 562), so importing a submodule such as `emitter.config`
does not pay for the op table and numpy.
"""

import importlib

_EXPORTS = {
    "QWEN38_OPS": "emit", "TEMPLATE_MARK": "emit", "VENDOR_HEADER": "emit", "TorchArtifact": "emit",
    "emit_program": "emit", "emit_torch_module": "emit", "program_name": "emit", "write_bundle": "emit",
    "ProgramError": "errors", "gguf_name": "names", "torch_spelling": "ops",
    "read_file": "reader", "read_program": "reader", "read_tensor_sentences": "reader",
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
