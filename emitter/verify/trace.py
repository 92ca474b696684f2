"""The VM's trace of a program on its weights, computed once and shared by the program's checks.

Every dtype of a program is locked against the same float64 VM: the lock's pipeline names a file
(build/store/traces/, keyed by what the VM reads: program text, weights, steps, VM code,
environment, threads) and each check takes its steps from there. The first check computes every
step (under a file lock, so checks running beside each other on Dask workers wait for it rather
than compute it again), streams it to a temporary file and renames it; the others read it. A hand
lock (`python -m emitter lock`) is given no file and computes its own VM, as before.

The file's format is emitter.verify.trace_format's: a truncated or damaged file is a miss from
the point it is damaged (its file removed; the VM computes the rest from the states read so
far), never a number. A program whose VM reads fewer weights than a file is worth
(limits.trace_bytes) keeps its trace in the memory of the process that runs its checks, in the
same format, read afresh by each."""

import os
import time

import numpy as np

from ..files import open_regular
from . import fresh_inputs, vm
from .trace_format import LIMIT, Damaged, Reader, Unstorable, Writer, estimate, remove as _remove

MEMORY_LIMIT = 64 << 20    # a small program's trace kept in memory (`_small`): at most this
_MEMORY = {}               # {key: the trace's bytes}: the last small program's, in this process
FOLDER_LIMIT = 4 << 30     # past this, the least recently used traces are removed


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


def shared(spec, result, program, leaves, n, check, fresh=None):
    """The lock's VM steps from the trace file `spec` names ({"path", "key", "source",
    "environment", and what decides whether a trace is worth writing: "min_bytes", the weights its
    VM must read, and "alone", no other check of the program to read it}), or None (computed by the lock) where there is none, or where the program the
    lock read (`result`'s hashes) or its environment is not the one the key names; `result["trace"]`
    says which. `check()` raises where the weights are no longer those keyed; `fresh`: see `steps`."""
    if spec is None:
        return None
    env = (result.get("environment") or {}).get("digest")
    if spec.get("source") != result["hashes"]["source"] or spec.get("environment") != env:
        result["trace"] = {"key": spec.get("key"), "hit": False, "written": False,
                           "why": "not used: the program or environment is not the one its key names"}
        return None
    result["trace"] = {}
    return steps(program, leaves, n, result["timings"], spec, result["trace"], check, fresh)


def steps(program, leaves, n, timings, spec=None, info=None, check=None, fresh=None):
    """Each of `n` steps' StepTrace from `leaves`: the VM's own (no `spec`), or the trace file
    `spec["path"]` under `spec["key"]`: read where it is whole, else computed (every step first,
    under a lock) and written (`check()`, raising, keeps a trace of inputs that moved from being
    stored). `timings`: vm_s (the VM's compute), trace_s (the file's writing and reading);
    `info`: a dict told what happened (hit, written, bytes, why, and "fresh": whether the fresh
    pass's step was the file's); `fresh`: a dict given, by the last step, "ask", the fresh pass's
    `vm_fresh` (emitter.verify.passes.fresh): the file's step where it was asked the same, else
    the VM's."""
    timings.setdefault("trace_s", 0.0)
    info = {} if info is None else info
    current, reader = dict(leaves), None
    if spec is not None:
        reader = _open(program, leaves, n, timings, spec, info, check)
    for i in range(n):
        if i == n - 1 and fresh is not None:
            fresh["ask"] = _asking(program, leaves, dict(current), timings, info, reader, spec and spec["path"])
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


def _asking(program, leaves, start, timings, info, reader, path):
    """The fresh pass's `vm_fresh` from the last step's start: the step `reader`'s file holds (read
    now: the reader is closed before the pass) where it was asked the same, else the VM's own. A
    damaged one is a damaged trace: its file (`path`) removed, said in `info["fresh_why"]`."""
    stored, t = None, time.perf_counter()
    try:
        stored = reader and reader.fresh(program)
    except (Damaged, KeyError, TypeError, ValueError, IndexError) as e:
        info["fresh_why"] = f"its fresh step damaged ({e}): computed here"
        if path:
            _remove(path)
    finally:
        timings["trace_s"] += time.perf_counter() - t

    def ask(other, tries, feed):
        if stored is not None and stored.request == fresh_inputs.request(other, tries, feed):
            info["fresh"] = "read"
            return stored
        info["fresh"] = "computed"
        t = time.perf_counter()
        try:
            return fresh_inputs.step(program, leaves, start, other, tries, feed)
        finally:
            timings["vm_s"] += time.perf_counter() - t
    return ask


def _open(program, leaves, n, timings, spec, info, check):
    """The trace file's reader: the one there, or one written now (None when it cannot be)."""
    path, key, limit = spec["path"], spec["key"], spec.get("limit", LIMIT)
    info.update(key=key, hit=False, written=False)
    if estimate(program, n) > limit:
        info["why"] = f"not stored: over {limit >> 20} MiB"
        return None
    if 8 * sum(np.size(v) for v in leaves.values()) < spec.get("min_bytes", 0):
        return _small(program, leaves, n, timings, spec, info, check)
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
        if not _fill(writer, program, leaves, n, timings, info, check):
            return None
    prune(os.path.dirname(os.path.dirname(path)), path, spec.get("folder_limit", FOLDER_LIMIT))
    t = time.perf_counter()
    try:
        return _reader(path, key, n, info, hit=False)
    except Damaged as e:
        info["why"] = f"written but not readable ({e})"
        return None
    finally:
        timings["trace_s"] += time.perf_counter() - t


def _fill(writer, program, leaves, n, timings, info, check):
    """Compute `n` steps into `writer` and commit it; whether it was (else `info` says why: the
    lock's loop then computes the VM again)."""
    current, vm_s, start = dict(leaves), 0.0, time.perf_counter()
    try:
        for _ in range(n):
            t = time.perf_counter()
            trace = vm.step(program, current, keep_stages=True)
            vm_s += time.perf_counter() - t
            writer.step(program, current, trace)
            last = dict(current)
            current.update(trace.states)
            del trace
        other, tries, feed = fresh_inputs.standard(program, leaves, last)
        if other or tries:   # (the fresh pass's step, as an emitted module's check asks it; where the
            t = time.perf_counter()   # VM fails on it, each check meets that in its own fresh pass)
            try:
                writer.fresh(fresh_inputs.step(program, leaves, last, other, tries, feed), feed)
            except Exception as e:   # (stored without it, said: a bug here must not pass unseen)
                info["fresh_why"] = f"not stored: {type(e).__name__}: {e}"
            vm_s += time.perf_counter() - t
        info["bytes"] = writer.commit(check)
    except (Unstorable, OSError) as e:
        writer.abandon()
        info["why"] = f"not stored: {e}"
        return False
    except BaseException:
        writer.abandon()
        raise
    finally:
        timings["vm_s"] += vm_s
        timings["trace_s"] += time.perf_counter() - start - vm_s
    info["written"] = True
    return True


def _small(program, leaves, n, timings, spec, info, check):
    """A program whose VM reads fewer weights than a file is worth (limits.trace_bytes): its trace
    in this process's memory, not in a file, in the file's format (its arrays read afresh by each
    check, its views rebuilt): its other checks in this process (an inline run's child serves a
    program's checks one after another) read it there. The last program's alone is kept."""
    key, why = spec["key"], "kept in this process's memory, not in a file (limits.trace_bytes)"
    if estimate(program, n) > MEMORY_LIMIT:
        info["why"] = f"not stored: over {MEMORY_LIMIT >> 20} MiB, in memory"
        return None
    body = _MEMORY.get(key)
    if body is None:
        if spec.get("alone"):
            info["why"] = "not stored: no other check of the program runs to read it"
            return None
        writer = Writer(None, key, MEMORY_LIMIT, memory=True)
        if not _fill(writer, program, leaves, n, timings, info, check):
            return None
        _MEMORY.clear()
        body = _MEMORY[key] = writer.f.getvalue()
    info.update(hit=not info["written"], bytes=len(body), why=why)
    t = time.perf_counter()
    try:
        return Reader(None, key, n, body)
    finally:
        timings["trace_s"] += time.perf_counter() - t


def _reader(path, key, n, info, hit):
    try:
        r = Reader(path, key, n)
    except FileNotFoundError:
        raise Damaged("no such file") from None
    except OSError as e:
        raise Damaged(str(e)) from None
    info["hit"], info["bytes"] = hit, r.size
    if hit:
        try:
            os.utime(path)   # recently used: the last to be pruned
        except OSError:
            pass
    return r
