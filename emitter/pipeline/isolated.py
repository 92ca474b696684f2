"""The inline executor's checks in a forked child of the process that runs them (doit's, or one of
its `-n` workers): a bundle that ends its process (os._exit, a segfault in a native call, the OOM
killer) or hangs where no signal reaches Python (a long native call past limits.seconds) ends or
stalls that child alone. Its check is an error verdict that says so, the checks after it run in a
new child, and the run goes on to its report. The child is forked after the lock code and torch
are imported and before any of it ran in the parent, so it starts warm and no thread pool is
copied mid-work; it dies with its parent (guards.bind_children). Where fork is not there or other
threads run (a fork would copy a lock one of them holds), the caller runs the checks itself."""

import os
import pickle
import select
import signal
import struct
import sys
import time

from .. import fingerprint
from .guards import fork_safe
from .spread import fork_piped

GRACE = 10   # seconds past a check's limit before its child is killed (its own limit says it first)
_LEN = struct.Struct("<Q")


def run_isolated(one, jobs, seconds):
    """[one(job) for job in jobs], each computed in a forked child (one child for as many checks as
    it lives through); a check whose child ended or stalled gets {"error"} naming what happened.
    None where no child can be forked (the caller runs them itself)."""
    if not hasattr(os, "fork") or not fork_safe():
        return None
    out = []
    while len(out) < len(jobs):
        child = _fork(one, jobs[len(out):])
        if child is None:
            return None if not out else out + [one(j) for j in jobs[len(out):]]
        got, why = _gather(child, len(jobs) - len(out), seconds)
        out += got
        if why is not None:
            job = jobs[len(out)]
            out.append({"error": why.format(f"the {job['record']['dtype']} lock check")})
    return out


def _fork(one, jobs):
    """(pid, read end) of a child handing back one(job) for each of `jobs` as each comes, or None
    where none can start."""
    for stream in (sys.stdout, sys.stderr):   # (empty, so the child's own lines alone are flushed)
        stream.flush()
    forked = fork_piped()
    if forked is None or forked[0]:
        return forked
    w, code = forked[1], 1
    try:
        with os.fdopen(w, "wb") as f:
            for job in jobs:
                before = fingerprint.snapshot()
                body = pickle.dumps((one(job), fingerprint.added_since(before)), pickle.HIGHEST_PROTOCOL)
                f.write(_LEN.pack(len(body)) + body)
                f.flush()
        code = 0
    finally:
        for stream in (sys.stdout, sys.stderr):   # (what the checks said: os._exit flushes nothing)
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _gather(child, count, seconds):
    """(the outcomes the child handed back, in order; None when it handed back all `count`, else
    what became of it: ended, or killed for stalling past `seconds` + GRACE on one check)."""
    pid, r = child
    got, buf, why = [], b"", None
    deadline = time.monotonic() + seconds + GRACE
    try:
        while len(got) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                why = (f"{{}} took over {seconds} s (limits.seconds) in a call no signal stops: its "
                       f"process was killed {GRACE} s later")
                break
            if not select.select([r], [], [], left)[0]:
                continue
            data = os.read(r, 1 << 20)
            if not data:
                break
            buf += data
            while len(buf) >= _LEN.size and len(buf) >= _LEN.size + _LEN.unpack_from(buf)[0]:
                n = _LEN.unpack_from(buf)[0]
                outcome, hashes = pickle.loads(buf[_LEN.size:_LEN.size + n])
                buf = buf[_LEN.size + n:]
                fingerprint.merge(hashes)
                got.append(outcome)
                deadline = time.monotonic() + seconds + GRACE
    except BaseException:   # (the run interrupted: the child goes with it)
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    if len(got) < count and why is None:
        why = _ended(status)
    return got, (why if len(got) < count else None)


def _ended(status):
    """How a child that handed back too little ended, in words ({} for the check)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        how = f"was killed by signal {sig} ({name}{': the OOM killer?' if sig == signal.SIGKILL else ''})"
    else:
        how = f"ended with exit status {os.WEXITSTATUS(status)}"
    return "{}'s process " + how + " before the check ended"
