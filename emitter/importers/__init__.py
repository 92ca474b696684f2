"""Importers: checkpoints (GGUF, safetensors, a Qwen3.5 HF directory) to weights directories of
<var>.f32 / <var>.f64 files. `IMPORTERS` names each one's module without importing it (the
pipeline's config checks `derive.importer` against it); `common` holds what they share."""

# name -> (module, help): `python -m emitter import-NAME`
IMPORTERS = {
    "gguf": ("emitter.importers.gguf", "a GGUF checkpoint to a weights directory"),
    "safetensors": ("emitter.importers.safetensors", "a safetensors checkpoint to a weights directory"),
    "qwen35": ("emitter.importers.qwen35", "a Qwen3_5 HF checkpoint to a qwen35 decode step's weights"),
    "gemma3": ("emitter.importers.gemma3", "a Gemma 3 GGUF to a gemma3 decode step's weights"),
}

from .packages import chunked_spec, chunks, resolve_checkpoint, resolve_package_file  # noqa: E402

__all__ = ["IMPORTERS", "chunked_spec", "chunks", "resolve_checkpoint", "resolve_package_file"]
