"""A bundle's golden/ kept about its verdicts, whatever gave them.

golden/ is what `compile.py test` compares model.py with: the VM's outputs and the checks'
tolerances. Its golden.json names the key it is about (the digest of the program's check keys).
A check run now makes it, and this checkout keeps a copy under that key in build/store/golden/;
where no check ran (verdicts kept from build/store/, or inputs that came back to an earlier key)
the copy is put back; where there is none (a verdict taken from a shared cache, which holds no
golden/) or a check has no key, golden/ is removed rather than left about other inputs, and
`compile.py test` says so; a run without cache= then runs one of the program's checks again
for it (lock_task). The VM is never run on the driver for it."""

import contextlib
import os
import re

from ..files import own_folder, write_atomic, write_files
from .digests import digest

SUFFIX = ".golden"
NAME = re.compile(r"golden\.json|output\.[0-9]{1,6}\.f64")   # what a copy may hold
STORE_LIMIT = 1 << 30    # past this, the least recently used copies are removed
_PRUNED = []             # (a process prunes at its first copy: a walk of the store per lock costs
#                          a thousand-program zoo a second)
ENTRY_LIMIT = 1 << 30    # what one copy may unpack to


def _key(keys):
    """The key golden/ about the checks' `keys` ({dtype: key or None}) names, or None (a check has none)."""
    return digest({"golden": keys}) if keys and all(keys.values()) else None


def _path(store, key):
    return os.path.join(store, key[:2], key + SUFFIX)


def held(store, keys, bundle=None):
    """Whether `store` keeps a copy of golden/ about the checks' `keys` that can be read; else,
    with `bundle` (whose golden/ is as the lock settled it: the caller knows), whether golden/
    there is about those keys: then it is kept as the copy again (one evicted from the store)."""
    key = _key(keys)
    if key is None:
        return False
    path = _path(store, key)
    if _get(path, key) is not None:
        return True
    folder = os.path.join(bundle, "golden") if bundle else None
    try:
        files = {n: _read(os.path.join(folder, n)) for n in os.listdir(folder)} if folder else {}
        from ..verify.golden import key_of
        if not files or not all(NAME.fullmatch(n) for n in files) or key_of(files) != key:
            return False
        _put(path, files)
        return True
    except (OSError, ValueError):
        return False


def _read(path):
    with open(path, "rb") as f:
        return f.read(ENTRY_LIMIT + 1)


def settle(bundle, store, keys, made):
    """Make `bundle`/golden/ about the checks' `keys` ({dtype: key or None}): `made` (golden/'s
    files from a check run now: kept in `store` too), else `store`'s copy for those keys, else
    none."""
    from ..verify import golden   # (numpy: loaded by a lock, never by a run that locks nothing)
    from ..verify.trace import prune
    folder = os.path.join(bundle, "golden")
    own_folder(folder)
    key = _key(keys)
    path = key and _path(store, key)
    if key is None:
        made = None
    elif made is not None:
        made = golden.keyed(made, key)
        try:   # the copy is best effort: golden/ itself is written all the same
            _put(path, made)
            if not _PRUNED:   # once a process: the store holds at most the limit and one run's copies
                _PRUNED.append(path)
                prune(store, path, STORE_LIMIT, SUFFIX)
        except OSError:
            pass
    else:
        made = _get(path, key)
    if made is None:
        _clear(folder, ())
        return
    if not _holds(folder, made):   # (a hand edit that kept the key is undone too)
        write_files(folder, made)   # golden.json last: beside its outputs only
    _clear(folder, made)


def _holds(folder, files):
    """Whether `folder` holds `files`, byte for byte."""
    try:
        for name, data in files.items():
            with open(os.path.join(folder, name), "rb") as f:
                if f.read(len(data) + 1) != data:
                    return False
    except OSError:
        return False
    return True


def remove(bundle):
    """golden/ removed (best effort): what cannot be settled is never left about other inputs."""
    with contextlib.suppress(OSError):
        own_folder(os.path.join(bundle, "golden"))
    _clear(os.path.join(bundle, "golden"), ())


def _put(path, files):
    """One uncompressed zip of golden/'s files, written whole or not at all."""
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    write_atomic(path, buf.getvalue())


def _get(path, key):
    """The files of the copy at `path`, or None: absent, damaged (whatever zipfile, zlib or json
    make of it), too big or of another key."""
    import zipfile
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            if sum(i.file_size for i in infos) > ENTRY_LIMIT or \
                    not all(NAME.fullmatch(i.filename) for i in infos):
                return None
            files = {i.filename: z.read(i) for i in infos}
        os.utime(path)   # recently used: the last to be pruned
        from ..verify.golden import key_of
        return files if key_of(files) == key else None
    except Exception:   # (a bad deflate stream, an unknown method, an "encrypted" bit, deep JSON)
        return None


def _clear(folder, keep):
    """Remove what golden/ holds that is not in `keep`, a folder or a link too (and golden/ itself
    when it is left empty)."""
    import shutil
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for n in names:
        if n not in keep:
            path = os.path.join(folder, n)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
            except OSError:
                pass
    if not keep:
        try:
            os.rmdir(folder)
        except OSError:
            pass
