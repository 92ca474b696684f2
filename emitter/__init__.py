"""LOGOS tensor programs to verified SambaFlow ingestion bundles: reader, emitter, VM, lock check."""

from .emit import (QWEN38_OPS, TEMPLATE_MARK, VENDOR_HEADER, TorchArtifact, emit_program,
                   emit_torch_module, program_name, write_bundle)
from .errors import ProgramError
from .names import gguf_name
from .ops import torch_spelling
from .reader import read_file, read_program, read_tensor_sentences

__all__ = [
    "QWEN38_OPS", "TEMPLATE_MARK", "VENDOR_HEADER", "ProgramError", "TorchArtifact", "emit_program",
    "emit_torch_module", "gguf_name", "program_name", "read_file", "read_program",
    "read_tensor_sentences", "torch_spelling", "write_bundle",
]
