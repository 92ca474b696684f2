"""Importers: checkpoints (GGUF, safetensors, a Qwen3.5 HF directory) to weights directories of
<var>.f32 / <var>.f64 files. `IMPORTERS` names each one's module without importing it (the
pipeline's config checks `derive.importer` against it); `common` holds what they share."""

# name -> (module, help): `python -m emitter import-NAME`
IMPORTERS = {
    "gguf": ("emitter.importers.gguf", "a GGUF checkpoint to a weights directory"),
    "safetensors": ("emitter.importers.safetensors", "a safetensors checkpoint to a weights directory"),
    "qwen35": ("emitter.importers.qwen35", "a Qwen3_5 HF checkpoint to a qwen35 decode step's weights"),
    "gemma3": ("emitter.importers.gemma3", "a Gemma 3 GGUF to a gemma3 decode step's weights"),
    "qwen3next": ("emitter.importers.qwen3next",
                  "a Qwen3-Next HF checkpoint to a qwen3next decode step's weights"),
}

from .packages import chunked_spec, chunks, resolve_checkpoint, resolve_package_file  # noqa: E402

__all__ = ["CONFIG_BYTES", "IMPORTERS", "READS", "declared_reads", "read_limit", "spec_name", "chunked_spec", "chunks", "resolve_checkpoint", "resolve_package_file"]


# What each importer reads of its checkpoint beyond the file itself (the program it is handed is
# the task's own dependency): "file" the checkpoint alone, "hf" a Hugging Face folder's
# *.safetensors (or the one file named) and the config.json beside them. These files are the
# derived weights' inputs: every one is in their import key, so an edit of any re-derives them.
# An importer not listed reads its checkpoint file alone.
READS = {"qwen35": "hf", "qwen3next": "hf"}
CONFIG_BYTES = 16 << 20   # a model's config.json is kilobytes: an importer refuses one over this


def spec_name(spec):
    """A checkpoint spec as a key names it: a path's normal spelling (`./a//b/` is `a/b`: one file,
    one name), a `package:` or chunked spec as written."""
    import posixpath
    return spec if spec.startswith("package:") else posixpath.normpath(spec)   # (a chunked spec is one)


def declared_reads(importer, spec, path):
    """[(name, path)] of every file `importer` reads of the checkpoint `spec` (as a config writes
    it) resolved to `path`: the name is the spec's own (a `package:` spec, a repository path in
    its normal spelling), so a key built from names and contents is the same on every clone."""
    import os
    import posixpath
    found = chunks(spec)
    if found is not None:
        return [(p, resolve_package_file(p[len("package:"):])) for p in found[0]]
    spec = spec_name(spec)
    if READS.get(importer, "file") == "file":
        return [(spec, path)]
    if os.path.isdir(path):
        base_spec, base = spec.rstrip("/"), path
        files = [(f"{base_spec}/{f}", os.path.join(base, f)) for f in sorted(os.listdir(base))
                 if f.endswith(".safetensors")]
    else:
        base_spec, base = posixpath.dirname(spec), os.path.dirname(path)
        files = [(spec, path)]
    return files + [(posixpath.join(base_spec, "config.json"), os.path.join(base, "config.json"))]


def read_limit(name):
    """The size past which an importer refuses a file `declared_reads` names (its config.json:
    CONFIG_BYTES), so that nothing reads more of it; None for the checkpoint's tensors, which
    are read whole whatever their size."""
    return CONFIG_BYTES if name.rsplit("/", 1)[-1] == "config.json" else None
