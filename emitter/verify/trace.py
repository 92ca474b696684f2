"""The VM's trace of a program on its weights, computed once and shared by the program's checks.

Every dtype of a program is locked against the same float64 VM: the lock's pipeline names a file
(build/store/traces/, keyed by what the VM reads: program text, weights, steps, VM code,
environment, threads) and each check takes its steps from there. The first check computes every
step (under a file lock, so checks running beside each other on Dask workers wait for it rather
than compute it again), streams it to a temporary file and renames it; the others read it. A hand
lock (`python -m emitter lock`) is given no file and computes its own VM, as before.

The file: each array's bytes (C or Fortran order, as the VM made it), then a JSON index (per
step: each stage's value, the output and the states, as arrays or as references to a stage's
value or a leaf), its length, its sha256 and a magic. A stage whose op is a view (a transposed
table, an embedding's rows), or whose value shares memory with its inputs, is stored as a marker
and rebuilt from them on reading: gemma3's 262144×640 table is never written out. Each array
carries its own sha256, checked as it is read: a truncated or damaged file is a miss from that
point (its file removed; the VM computes the rest from the states read so far), never a number."""

import hashlib
import json
import os
import struct
import time
import uuid

import numpy as np

from ..files import open_regular
from . import vm

MAGIC = b"LOGOSTR1"
SCHEMA, VERSION = "logos.vm-trace", 1
LIMIT = 1 << 30            # a trace over this many bytes is not stored (its checks compute the VM)
FOLDER_LIMIT = 4 << 30     # past this, the least recently used traces are removed
_FOOTER = struct.Struct("<Q32s8s")


class Unstorable(Exception):
    """A trace that is not written: too big, or a value that is not a plain array."""


class Damaged(Exception):
    """A trace file that is not whole: read no further."""


def _layout(a):
    """(the array as a C-contiguous block, its order): a Fortran-ordered array as its transpose."""
    if a.flags.f_contiguous and not a.flags.c_contiguous:
        return a.T, "F"
    return np.ascontiguousarray(a), "C"


class Writer:
    """Arrays streamed into a temporary file beside `path`, the index last; `commit` renames it."""

    def __init__(self, path, key, limit=LIMIT):
        self.path, self.key, self.limit = path, key, limit
        self.tmp = f"{path}.{uuid.uuid4().hex[:12]}.partial"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.f = open(self.tmp, "wb")
        self.f.write(MAGIC)
        self.offset, self.steps = len(MAGIC), []

    def blob(self, a):
        if not isinstance(a, np.ndarray) or a.dtype.kind not in "biuf":
            raise Unstorable(f"a VM value of type {type(a).__name__} is not stored")
        block, order = _layout(a)
        view = memoryview(block).cast("B")
        if self.offset + view.nbytes > self.limit:
            raise Unstorable(f"over {self.limit >> 20} MiB")
        self.f.write(view)
        rec = {"o": self.offset, "n": view.nbytes, "dtype": a.dtype.str, "shape": list(a.shape),
               "order": order, "sha": hashlib.sha256(view).hexdigest()}
        self.offset += view.nbytes
        return rec

    def step(self, program, current, trace):
        """One step's StepTrace (`current`: the leaves and states it started from)."""
        known, stages, env = {}, [], dict(current)
        for st, value in zip(program.stages, trace.stages):
            items = value if isinstance(value, tuple) else (value,)
            if _rebuilt(st, env, items):
                stages.append({"rebuild": True})
            elif isinstance(value, tuple):
                stages.append({"tuple": [self.blob(a) for a in value]})
            else:
                stages.append(self.blob(value))
            for j, a in enumerate(items):
                known.setdefault(id(a), {"stage": st.index, **({"item": j} if isinstance(value, tuple) else {})})
            vm.bind_result(st, env, value)

        def ref(name, a):
            if id(a) in known:
                return known[id(a)]
            if a is current.get(name):
                return {"leaf": name}
            return self.blob(a)
        self.steps.append({"stages": stages, "output": ref(program.output, trace.output),
                           "states": {s: ref(s, a) for s, a in trace.states.items()}})

    def commit(self, check=None):
        """Write the index, then (`check()` not raising: the inputs are still those keyed) rename."""
        index = json.dumps({"schema": SCHEMA, "version": VERSION, "key": self.key,
                            "steps": self.steps}).encode()
        self.f.write(index)
        self.f.write(_FOOTER.pack(len(index), hashlib.sha256(index).digest(), MAGIC))
        self.f.close()
        if check is not None:
            check()
        os.replace(self.tmp, self.path)
        return self.offset + len(index) + _FOOTER.size

    def abandon(self):
        self.f.close()
        _remove(self.tmp)


def _rebuilt(st, env, items):
    """A stage stored as a marker: a view op, or a value sharing memory with what it read."""
    if st.op.view:
        return True
    ins = [env[n] for n in st.inputs if isinstance(env.get(n), np.ndarray)]
    return any(np.may_share_memory(a, b) for a in items if isinstance(a, np.ndarray) for b in ins)


def estimate(program, n):
    """An upper bound of the bytes of `n` steps' trace: every stage that is not a view, the
    states beside them (a stage's value written back is stored once, as the stage)."""
    per = sum(r * c for st in program.stages if not st.op.view
              for r, c in [program.shapes.get(st.out) or program.shapes.get(st.writes) or (0, 0)])
    states = sum(r * c for s in program.states for r, c in [program.shapes.get(s, (0, 0))])
    return 8 * n * (per + states)


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


class Reader:
    """A trace file checked as far as its index: `index["steps"]`, each array read on demand."""

    def __init__(self, path, key, steps):
        self.f = open_regular(path)
        try:
            size = os.fstat(self.f.fileno()).st_size
            if size < len(MAGIC) + _FOOTER.size or self.f.read(len(MAGIC)) != MAGIC:
                raise Damaged("not a trace file")
            self.f.seek(size - _FOOTER.size)
            n, sha, magic = _FOOTER.unpack(self.f.read(_FOOTER.size))
            if magic != MAGIC or n > size - len(MAGIC) - _FOOTER.size:
                raise Damaged("truncated")
            self.f.seek(size - _FOOTER.size - n)
            raw = self.f.read(n)
            if hashlib.sha256(raw).digest() != sha:
                raise Damaged("its index does not match its sha256")
            index = json.loads(raw)
            if index.get("schema") != SCHEMA or index.get("key") != key or len(index.get("steps", ())) != steps:
                raise Damaged("a trace of other inputs")
        except (Damaged, OSError, ValueError, struct.error) as e:
            self.f.close()
            raise Damaged(str(e)) from None
        self.index, self.data_end = index, size - _FOOTER.size - n

    def blob(self, rec):
        shape = rec["shape"] if rec["order"] == "C" else rec["shape"][::-1]
        a = np.empty(shape, np.dtype(rec["dtype"]))
        view = memoryview(a).cast("B") if a.nbytes else memoryview(b"")
        if rec["o"] + rec["n"] > self.data_end or view.nbytes != rec["n"]:
            raise Damaged("an array outside the file")
        self.f.seek(rec["o"])
        if self.f.readinto(view) != rec["n"] or hashlib.sha256(view).hexdigest() != rec["sha"]:
            raise Damaged("an array does not match its sha256")
        return a if rec["order"] == "C" else a.T

    def step(self, program, current, i):
        """Step `i`'s StepTrace, the view stages rebuilt from `current` as the VM made them."""
        rec, env, stages = self.index["steps"][i], dict(current), []
        for st, s in zip(program.stages, rec["stages"]):
            if s.get("rebuild"):
                with np.errstate(all="ignore"):   # as the VM ran it
                    value = vm.run_stage(program, st, env)
            elif "tuple" in s:
                value = tuple(self.blob(b) for b in s["tuple"])
            else:
                value = self.blob(s)
            vm.bind_result(st, env, value)
            stages.append(value)

        def ref(r):
            if "stage" in r:
                v = stages[r["stage"]]
                return v[r["item"]] if "item" in r else v
            return current[r["leaf"]] if "leaf" in r else self.blob(r)
        return vm.StepTrace(stages, ref(rec["output"]), {k: ref(r) for k, r in rec["states"].items()}, 0.0)

    def close(self):
        self.f.close()


class _Locked:
    """An exclusive lock on `path` (fcntl, where there is one): one process computes a trace. It
    is waited for a step at a time, so a check's time limit ends the wait (in a thread, where no
    signal breaks a blocking call), and at most `wait` seconds: a holder that is stopped, not dead,
    keeps it for good, and the check then computes its trace itself."""

    def __init__(self, path, wait=300):
        self.path, self.f, self.wait = path, None, wait

    def __enter__(self):
        try:
            import fcntl
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.f = open_regular(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, "a")
            end = time.monotonic() + self.wait
            while True:
                try:
                    fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.05)
        except (ImportError, OSError):
            if self.f is not None:
                self.f.close()
            self.f = None
        return self

    def __exit__(self, *exc):
        if self.f is not None:
            self.f.close()   # (closing lets the lock go)


def prune(folder, keep, limit=FOLDER_LIMIT, suffix=".trace"):
    """Remove the least recently used files of `folder` named `*suffix` (traces) until they take
    at most `limit` bytes; never `keep`."""
    found = []
    for d, _, names in os.walk(folder):
        for n in names:
            if n.endswith(suffix):
                p = os.path.join(d, n)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                found.append((st.st_mtime, st.st_size, p))
    total = sum(s for _, s, _ in found)
    for _, size, p in sorted(found):
        if total <= limit:
            break
        if p != keep:
            _remove(p)
            total -= size


def shared(spec, result, program, leaves, n, check):
    """The lock's VM steps from the trace file `spec` names ({"path", "key", "source",
    "environment", and what decides whether a trace is worth writing: "min_bytes", the weights its
    VM must read, and "alone", no other check of the program to read it}), or None (computed by the lock) where there is none, or where the program the
    lock read (`result`'s hashes) or its environment is not the one the key names; `result["trace"]`
    says which. `check()` raises where the weights are no longer those keyed."""
    if spec is None:
        return None
    env = (result.get("environment") or {}).get("digest")
    if spec.get("source") != result["hashes"]["source"] or spec.get("environment") != env:
        result["trace"] = {"key": spec.get("key"), "hit": False, "written": False,
                           "why": "not used: the program or environment is not the one its key names"}
        return None
    result["trace"] = {}
    return steps(program, leaves, n, result["timings"], spec, result["trace"], check)


def steps(program, leaves, n, timings, spec=None, info=None, check=None):
    """Each of `n` steps' StepTrace from `leaves`: the VM's own (no `spec`), or the trace file
    `spec["path"]` under `spec["key"]`: read where it is whole, else computed (every step first,
    under a lock) and written (`check()`, raising, keeps a trace of inputs that moved from being
    stored). `timings`: vm_s (the VM's compute), trace_s (the file's writing and reading);
    `info`: a dict told what happened (hit, written, bytes, why)."""
    timings.setdefault("trace_s", 0.0)
    info = {} if info is None else info
    current, reader = dict(leaves), None
    if spec is not None:
        reader = _open(program, leaves, n, timings, spec, info, check)
    for i in range(n):
        if reader is not None:
            t = time.perf_counter()
            try:
                trace = reader.step(program, current, i)
            except Damaged as e:
                reader.close()
                reader = None
                _remove(spec["path"])
                info.update(hit=False, why=f"damaged at step {i + 1} ({e}): computed here")
            finally:
                timings["trace_s"] += time.perf_counter() - t
        if reader is None:
            t = time.perf_counter()
            trace = vm.step(program, current, keep_stages=True)
            timings["vm_s"] += time.perf_counter() - t
        yield trace
        current.update(trace.states)
    if reader is not None:
        reader.close()


def _open(program, leaves, n, timings, spec, info, check):
    """The trace file's reader: the one there, or one written now (None when it cannot be)."""
    path, key, limit = spec["path"], spec["key"], spec.get("limit", LIMIT)
    info.update(key=key, hit=False, written=False)
    if estimate(program, n) > limit:
        info["why"] = f"not stored: over {limit >> 20} MiB"
        return None
    if 8 * sum(np.size(v) for v in leaves.values()) < spec.get("min_bytes", 0):
        info["why"] = "not stored: its VM reads fewer weights than a file is worth (limits.trace_bytes)"
        return None
    t = time.perf_counter()
    try:
        return _reader(path, key, n, info, hit=True)
    except Damaged as e:
        if os.path.exists(path):
            info["why"] = f"damaged ({e}): computed again"
    finally:
        timings["trace_s"] += time.perf_counter() - t
    if spec.get("alone"):   # read where there is one, but not written for no other check
        info["why"] = "not stored: no other check of the program runs to read it"
        return None
    with _Locked(path + ".lock"):
        t = time.perf_counter()
        try:   # another check may have written it while this one waited
            return _reader(path, key, n, info, hit=True)
        except Damaged:
            pass
        finally:
            timings["trace_s"] += time.perf_counter() - t
        try:
            writer = Writer(path, key, limit)
        except OSError as e:
            info["why"] = f"not stored: {e}"
            return None
        current, vm_s, start = dict(leaves), 0.0, time.perf_counter()
        try:
            for _ in range(n):
                t = time.perf_counter()
                trace = vm.step(program, current, keep_stages=True)
                vm_s += time.perf_counter() - t
                writer.step(program, current, trace)
                current.update(trace.states)
                del trace
            info["bytes"] = writer.commit(check)
        except (Unstorable, OSError) as e:   # (the lock's loop computes the VM again)
            writer.abandon()
            info["why"] = f"not stored: {e}"
            return None
        except BaseException:
            writer.abandon()
            raise
        finally:
            timings["vm_s"] += vm_s
            timings["trace_s"] += time.perf_counter() - start - vm_s
        info["written"] = True
    prune(os.path.dirname(os.path.dirname(path)), path, spec.get("folder_limit", FOLDER_LIMIT))
    t = time.perf_counter()
    try:
        return _reader(path, key, n, info, hit=False)
    except Damaged as e:
        info["why"] = f"written but not readable ({e})"
        return None
    finally:
        timings["trace_s"] += time.perf_counter() - t


def _reader(path, key, n, info, hit):
    try:
        r = Reader(path, key, n)
    except FileNotFoundError:
        raise Damaged("no such file") from None
    except OSError as e:
        raise Damaged(str(e)) from None
    info["hit"], info["bytes"] = hit, os.fstat(r.f.fileno()).st_size
    if hit:
        try:
            os.utime(path)   # recently used: the last to be pruned
        except OSError:
            pass
    return r
