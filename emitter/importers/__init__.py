"""Importers: checkpoints (GGUF, safetensors) to weights directories of <var>.f32 / <var>.f64 files."""
