"""The bundle's model.py as the lock runs it: a fresh module from the bytes the lock hashed, and
its LogosModule built as a user builds it."""

import hashlib
import os
import sys
import threading
import types
import uuid

from . import compiled_store
from .probe import BundleFault, CouldNotRun, absurd, bundles_fault

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


def build_module(torch, module, program, weights_dir, dtype, allow_nonfinite, read=(), again=None, threads=1):
    """The module as a user builds it: the bundle's loader, then its LogosModule; and how to build
    another from the same weights (passes.fresh): from `again()`, model.py run afresh (its own
    classes and globals: nothing an instance kept there is shared), at the check's `threads`.
    `read`: the weights files the VM read (real paths): a file the bundle looks for that is not
    there and is none of them is the bundle's own doing (a loader after another suffix)."""
    missing = [n for n in ("load_weights", "LogosModule") if not callable(getattr(module, n, None))]
    if missing:   # (what every bundle defines: compile.py calls both)
        raise BundleFault({"stage": "load", "out": None, "op": missing[0], "line": None},
                          f"the bundle's model.py defines no {' and no '.join(missing)}")
    try:
        if weights_dir is None:
            weights = {}
        elif allow_nonfinite:
            weights = module.load_weights(weights_dir, dtype, allow_nonfinite=tuple(allow_nonfinite))
        else:
            weights = module.load_weights(weights_dir, dtype)
        model = module.LogosModule(weights, dtype)
    except KeyboardInterrupt:
        raise
    except BaseException as e:   # the VM read these weights: the bundle's refusal is its own fault
        message = f"the bundle's load_weights / LogosModule raised: {type(e).__name__}: {e}"
        looked = isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)) and \
            e.filename is not None and os.path.realpath(os.fsdecode(e.filename)) not in read
        if bundles_fault(e, absurd(program)) and (looked or not isinstance(e, OSError)):
            raise BundleFault({"stage": "load", "out": None, "op": "load_weights", "line": None}, message) from None
        raise CouldNotRun(message) from None

    def another():   # (instance, from where): model.py run afresh, else (one whose import cannot
        # run twice in one process: an interop thread count, an op library, a folder it makes) the
        # same module's; a second instance that raises where the first did not is the bundle's fault
        try:
            try:
                return again().LogosModule(weights, dtype), "afresh"
            except KeyboardInterrupt:
                raise
            except BaseException as e:
                why = f"model.py would not run again in this process ({type(e).__name__}: {str(e)[:200]})"
            try:
                return module.LogosModule(weights, dtype), why
            except KeyboardInterrupt:
                raise
            except BaseException as e:
                raise BundleFault({"stage": "load", "out": None, "op": "LogosModule", "line": None},
                                  f"a second LogosModule of the same weights raised: {type(e).__name__}: {e}") from None
        finally:
            torch.set_num_threads(threads)
    return model, another
