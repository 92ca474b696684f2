"""The code that runs is the code that was hashed: Python's default bytecode cache trusts a .pyc
while its source keeps its mtime and size, so an edit that puts both back (`cp -p`, `touch -r`,
`tar x`) would run the old code under the new source's digest. `check_sources` turns the package's
.pyc files into checked-hash ones (PEP 552): the import system then compares each with its
source's bytes on every import, and rewrites it in the same mode when they differ. Standard library
only; a read-only install is left as it is (its sources cannot be edited either)."""

import hashlib
import importlib.machinery
import importlib.util
import os
import sys

CHECKED = 0b11   # the pyc header's flags: hash-based, checked against the source


def _checked(pyc):
    try:
        with open(pyc, "rb") as f:
            header = f.read(8)
    except OSError:
        return False
    return len(header) == 8 and int.from_bytes(header[4:8], "little") & CHECKED == CHECKED


def check_sources(package_dir):
    """Make every .py under `package_dir` have a checked-hash .pyc (compiled from the source as it
    is now); returns how many were (re)written. A file that does not compile is left to its import."""
    written = 0
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in filenames:
            if not f.endswith(".py"):
                continue
            source = os.path.join(dirpath, f)
            pyc = importlib.util.cache_from_source(source)
            if _checked(pyc) or (sys.dont_write_bytecode and not os.path.exists(pyc)):
                continue   # (with PYTHONDONTWRITEBYTECODE no new .pyc, but an old one is still read)
            import py_compile   # (only when a .pyc is written: 2 ms of a `logos check`)
            try:
                py_compile.compile(source, cfile=pyc, doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
                written += 1
            except (OSError, py_compile.PyCompileError):
                pass
    return written


IMPORTED = {}   # a module file's absolute path -> the sha256 of its source as its import read it


class _Recording(importlib.machinery.SourceFileLoader):
    """The loader of the package's own modules: the source bytes an import reads (to check the
    .pyc's hash, or to compile) are the bytes that run, and their sha256 is kept (`IMPORTED`), so
    a code digest can name the code this process runs, not the files as an edit since left them."""

    _read = None

    def get_data(self, path):
        data = super().get_data(path)
        if path == self.path:
            self._read = data
        return data

    def get_code(self, fullname):
        """The module's code (an import's, a reload's): the source read for it is what runs (a
        read of the file for another purpose, `get_source`, records nothing)."""
        self._read = None
        code = super().get_code(fullname)
        if self._read is not None:
            IMPORTED[os.path.abspath(self.path)] = hashlib.sha256(self._read).hexdigest()
            self._read = None
        return code


class _Finder:
    """The package's submodules found as the path finder finds them, loaded by `_Recording`."""
    prefix = __name__.rsplit(".", 1)[0] + "."

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if not name.startswith(cls.prefix):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = _Recording(spec.loader.name, spec.loader.path)
        return spec


def record_imports(*loaded):
    """From now on, keep the sha256 of each of the package's modules as it is imported; `loaded`:
    the files of modules imported before (the package's __init__, this module), hashed now."""
    for path in loaded:
        try:
            with open(path, "rb") as f:
                IMPORTED.setdefault(os.path.abspath(path), hashlib.sha256(f.read()).hexdigest())
        except OSError:
            pass
    if _Finder not in sys.meta_path:
        sys.meta_path.insert(0, _Finder)
