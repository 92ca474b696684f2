"""The bundle's model.py as the lock runs it: a fresh module from the bytes the lock hashed."""

import hashlib
import os
import sys
import threading
import types
import uuid

from . import compiled_store
from .probe import BundleFault, CouldNotRun, bundles_fault

_CODE, _KEPT = {}, 8   # (path, sha256 of the bytes, -O): their code object, the last few compiled
_LOCK = threading.Lock()   # (a worker may run checks on several threads)


def _compiled(source, path):
    """`source` compiled, once per content: a program's checks at other dtypes (one lock task, one
    Dask worker) run the same bytes, and a 3,000-line model.py takes 50 ms to compile. Keyed by
    the bytes' digest, never by the file's stat; kept for later processes where a zoo is bound
    (compiled_store)."""
    key = (path, hashlib.sha256(source).hexdigest(), sys.flags.optimize)
    code = _CODE.get(key)
    if code is None:
        kept = compiled_store.entry(path, key[1])
        code = kept and compiled_store.read(kept, path, key[1])
        if code is None:
            code = compile(source, path, "exec", dont_inherit=True)
            if kept:
                compiled_store.keep(kept, key[1], code)
        with _LOCK:
            while len(_CODE) >= _KEPT:
                _CODE.pop(next(iter(_CODE)))
            _CODE[key] = code
    return code


def load_bundle_module(bundle_dir, source=None, limit=None):
    """The bundle's model.py as a fresh module (its own LogosModule, loader and helpers): `source`
    (its bytes as the lock hashed them; read here when not given) compiled and run as they are.
    No .pyc is read or written (one is trusted while its source keeps its size and mtime, so a
    hand edit that puts them back, `cp -p` or `touch -r`, would run the old code): what is kept is
    keyed by the bytes' sha256.
    `limit`: the bytes past which one allocation is the bundle's fault (probe.absurd)."""
    path = os.path.join(bundle_dir, "model.py")
    if source is None:
        source = read_model(path)
        if source is None:
            raise CouldNotRun(f"{path}: no model.py in the bundle")
    module = types.ModuleType(f"logos_bundle_{uuid.uuid4().hex}")
    module.__file__ = path
    try:
        exec(_compiled(source, path), module.__dict__)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # the bundle is generated text: its own failure to import is a finding
        message = f"{path}: importing the module failed: {type(e).__name__}: {e}"
        if isinstance(e, (SyntaxError, ValueError)) or bundles_fault(e, limit):   # (compile's: its text's)
            raise BundleFault({"stage": "import", "out": None, "op": "model.py", "line": None}, message) from None
        raise CouldNotRun(message) from None
    return module


def read_model(path):
    """model.py's bytes, or None where there is no such file."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None
