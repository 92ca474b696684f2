"""The one resolver of `package:MODULE/relative/path`: a checkpoint file inside an installed package,
found without importing the package (standard library only)."""

import importlib.util
import os
import re

from ..language.errors import ProgramError

MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
PREFIX = "package:"


def resolve_package_file(spec):
    """`MOD/rel/path` -> the absolute path of that file inside the installed package MOD."""
    mod, _, rel = spec.partition("/")
    if not MODULE_RE.fullmatch(mod) or not rel:
        raise ValueError(f"`package:{spec}` must be `package:MODULE/relative/path`")
    try:
        found = importlib.util.find_spec(mod)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ValueError(f"package `{mod}` is not installed")
    if found.submodule_search_locations:
        base = list(found.submodule_search_locations)[0]
    elif found.origin:
        base = os.path.dirname(found.origin)
    else:
        raise ValueError(f"package `{mod}` has no files on disk")
    if os.path.isabs(rel):
        raise ValueError(f"`{rel}` must be relative to the package")
    base = os.path.realpath(base)
    full = os.path.realpath(os.path.join(base, rel))
    if not full.startswith(base + os.sep):
        raise ValueError(f"`{rel}` leaves the package `{mod}`")
    if not os.path.isfile(full):
        raise ValueError(f"`{rel}` is not a file in package `{mod}` ({base})")
    return full



def resolve_checkpoint(spec):
    """A checkpoint path as given, or the file a `package:MODULE/path` spec names (a ProgramError
    naming the spec when there is none)."""
    if not spec.startswith(PREFIX):
        return spec
    try:
        return resolve_package_file(spec[len(PREFIX):])
    except ValueError as e:
        raise ProgramError(str(e), path=spec) from None
