"""Importers: checkpoints (GGUF, safetensors) to weights directories of <var>.f32 / <var>.f64 files."""

import importlib.util
import os

from ..errors import ProgramError


def resolve_checkpoint(spec):
    """A checkpoint path; `package:MODULE/rel/path` is a file inside an installed package."""
    if not spec.startswith("package:"):
        return spec
    module, _, rel = spec[len("package:"):].partition("/")
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise ProgramError(f"no installed package `{module}` holds the checkpoint", path=spec)
    for base in found.submodule_search_locations:
        path = os.path.join(base, rel)
        if os.path.isfile(path):
            return path
    raise ProgramError(f"package `{module}` has no file `{rel}`", path=spec)
