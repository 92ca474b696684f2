"""A bundle's compiled model.py kept for later processes, in a zoo's build/.compiled/ (where its
record is bound: a zoo run's driver, a hand lock in the zoo; a Dask worker binds none and
keeps its code in memory only). An entry is named by the sha256 of the file's path, its bytes'
sha256, the interpreter's bytecode version and its optimisation level (-O strips asserts), and
holds a sha256 of the bytes' sha256 and the marshalled code before them: an entry that is not
what its digest names (damaged), or names other bytes (another entry linked in its place), is
compiled over, never run. That digest is no signature: entries are kept and run only where
they, .compiled/ and build/ are this user's and writable by no one else (files.private: under a
umask of 002, or in a shared folder, nothing is kept). No .pyc: one is trusted while its source
keeps its size and mtime. Best effort throughout: a folder that cannot be read or written costs
a compile, never a check."""

import hashlib
import importlib.util
import marshal
import os
import sys
import types

from .. import fingerprint
from ..files import open_regular, private, write_atomic

FILES_KEPT, FILE_BYTES = 1024, 64 << 20   # the most recently used entries kept; each at most this big
_DIGEST = 32


def entry(path, sha):
    """The entry's path for model.py at `path` with bytes of sha256 `sha`, or None (no zoo bound,
    a build/ others may write, or a path that cannot be named)."""
    folder = fingerprint.folder()
    if folder is None or not private(folder):
        return None
    try:
        name = hashlib.sha256(os.fsencode(path) + b"\0" + sha.encode()).hexdigest()
    except (TypeError, ValueError):
        return None
    return os.path.join(folder, ".compiled", f"{name}-{importlib.util.MAGIC_NUMBER.hex()}-o{sys.flags.optimize}")


def read(kept, path, sha):
    """The code kept at `kept` for model.py at `path` with bytes of sha256 `sha`, or None; a hit
    is marked used (its mtime)."""
    if not private(os.path.dirname(kept)):
        return None
    try:
        with open_regular(kept) as f:
            if not private(None, os.fstat(f.fileno())):
                return None
            data = f.read(FILE_BYTES + 1)
        if len(data) > FILE_BYTES or hashlib.sha256(data[_DIGEST:]).digest() != data[:_DIGEST] \
                or data[_DIGEST:_DIGEST + 64] != sha.encode():   # (another entry's, linked here)
            return None
        code = marshal.loads(data[_DIGEST + 64:])
    except (OSError, ValueError, EOFError, TypeError):
        return None
    if not (isinstance(code, types.CodeType) and code.co_filename == path):
        return None
    try:
        os.utime(kept)
    except OSError:
        pass
    return code


def keep(kept, sha, code):
    """`code` (of bytes of sha256 `sha`) into its entry, and the folder held near its FILES_KEPT
    most recently used."""
    try:
        data = sha.encode() + marshal.dumps(code)
        write_atomic(kept, hashlib.sha256(data).digest() + data)
        folder = os.path.dirname(kept)
        names = os.listdir(folder)
    except (OSError, ValueError):
        return
    if len(names) <= FILES_KEPT + FILES_KEPT // 4:   # (pruned now and then: a stat of each)
        return
    used = []
    for name in names:
        try:
            used.append((os.lstat(os.path.join(folder, name)).st_mtime_ns, name))
        except OSError:
            pass
    for _, name in sorted(used)[:-FILES_KEPT]:
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass
