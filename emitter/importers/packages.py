"""The one resolver of `package:MODULE/relative/path`: a checkpoint file that an installed
distribution ships, found through its metadata (the dist-info folders on sys.path: `top_level.txt`
names its modules, `RECORD` lists every file with its sha256 and size). Nothing is imported, so a
config can name a package but never run its code; a module no distribution ships (the standard
library, a stray folder) holds no checkpoint. Standard library only."""

import base64
import functools
import os
import re
import sys

from ..language.errors import ProgramError

MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PREFIX = "package:"


@functools.lru_cache(maxsize=None)
def _record(path):
    """RECORD of a dist-info folder: {file: (sha256 hex or None, size or None)}."""
    out = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                name, _, rest = line.rstrip("\n").partition(",")
                digest, _, size = rest.partition(",")
                sha = None
                if digest.startswith("sha256="):
                    raw = digest[len("sha256="):]
                    sha = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
                out[name] = (sha, int(size) if size.isdigit() else None)
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return out


def _shippers(base, module):
    """The dist-info folders in `base` whose distribution ships `module`, best guesses first."""
    try:
        infos = sorted(e for e in os.listdir(base) if e.endswith(".dist-info"))
    except OSError:
        return []
    key = module.lower()
    named = [i for i in infos if i.split("-")[0].lower().replace(".", "_") == key]
    out = list(named)
    for info in infos:
        if info in named:
            continue
        try:
            with open(os.path.join(base, info, "top_level.txt"), encoding="utf-8") as f:
                if module in f.read().split():
                    out.append(info)
        except OSError:
            pass
    return out


def package_file(spec):
    """(absolute path, sha256, size) of the file `MODULE/relative/path` names, as its
    distribution's RECORD lists it; a ValueError that says why when there is none."""
    module, _, rel = spec.partition("/")
    parts = rel.split("/")
    if not MODULE_RE.fullmatch(module) or not rel or rel.startswith("/") or ".." in parts \
            or "" in parts:
        raise ValueError(f"`{PREFIX}{spec}` must be `{PREFIX}MODULE/relative/path` (one module name, "
                         "a path inside it)")
    target = f"{module}/{rel}"
    for base in sys.path:
        base = base or "."
        if not os.path.isdir(os.path.join(base, module)):
            continue
        for info in _shippers(base, module):
            entry = _record(os.path.join(base, info, "RECORD")).get(target)
            if entry is None:
                continue
            root = os.path.realpath(os.path.join(base, module))
            full = os.path.realpath(os.path.join(base, target))
            if not full.startswith(root + os.sep) or not os.path.isfile(full):
                raise ValueError(f"`{target}` is listed by {info} but is not a file inside the package")
            return full, entry[0], entry[1]
        raise ValueError(f"no installed distribution ships `{target}` (package `{module}` in {base})")
    raise ValueError(f"no installed distribution ships a package `{module}`")


def resolve_package_file(spec):
    """`MODULE/rel/path` -> the absolute path of that file inside the installed package MODULE."""
    return package_file(spec)[0]


def resolve_checkpoint(spec):
    """A checkpoint path as given, or the file a `package:MODULE/path` spec names (a ProgramError
    naming the spec when there is none)."""
    if not spec.startswith(PREFIX):
        return spec
    try:
        return resolve_package_file(spec[len(PREFIX):])
    except ValueError as e:
        raise ProgramError(str(e), path=spec) from None
