"""The inline executor's checks in a forked child of the process that runs them (doit's, or one of
its `-n` workers): a bundle that ends its process (os._exit, a segfault in a native call, the OOM
killer) or hangs where no signal reaches Python (a long native call past limits.seconds) ends or
stalls that child alone. Its check is an error verdict that says so, the next check gets a new
child, and the run goes on to its report.

One child serves every check of the process while it lives, as the process itself did: forked
once the lock code and torch are imported and before any of it ran here, so no thread pool is
copied mid-work, and what a check warms (torch's first ops, the leaves a program's checks share)
stays warm for the next. Jobs go to it and outcomes come back pickled through two pipes, each
with what it added to the hash record and its findings. It ends when this process closes its
pipe, or dies with it (guards.bind_children). Where fork is not there or other threads run (a
fork would copy a lock one of them holds), the caller runs the checks itself."""

import contextlib
import io
import os
import pickle
import select
import signal
import struct
import sys
import time

from .. import fingerprint
from ..lifetime import ended, leave
from .guards import fork_safe
from .spread import fork_piped

GRACE = 10   # seconds past a check's limit, with nothing coming back, before its child is killed
_LEN = struct.Struct("<Q")


class Lost(Exception):
    """The child ended or stalled before it handed a check's outcome back (the message: how,
    `{}` standing for the check)."""


class Child:
    """The forked child that runs `one(job, seconds)` for this process's checks."""

    def __init__(self, one):
        self.one, self.proc = one, None   # proc: (pid, outcomes' read end, jobs' write end, owner)

    def run(self, job, seconds):
        """one(job, seconds) computed in the child; {"error"} where the child ended or stalled on
        it (killed; the next job forks a new one); None where none can be forked."""
        for attempt in (0, 1):
            if self.proc is None or self.proc[3] != os.getpid():   # (one forked from a parent's)
                self.proc = _start(self.one)
                if self.proc is None:
                    return None
            try:
                _flush()   # (doit's lines before the check's)
                _send(self.proc[2], pickle.dumps((job, seconds), pickle.HIGHEST_PROTOCOL))
            except OSError:   # it ended between two checks (the OOM killer): one more, new
                self.close()
                if attempt:
                    return None
                continue
            try:
                outcome, added, said, warned, logged = pickle.loads(_receive(self.proc, seconds))
            except Lost as e:
                self.close()
                return {"error": str(e).format(f"the {job['record']['dtype']} lock check")}
            except BaseException:   # (the run interrupted: the child goes with it)
                self.close(kill=True)
                raise
            fingerprint.merge(added)
            sys.stdout.write(said)   # (into the task's own output, as a check here wrote it)
            sys.stderr.write(warned)
            for h in _log_handlers() if logged else ():
                h.stream.write(logged)
                h.flush()
            return outcome

    def close(self, kill=False):
        """End the child (it ends itself once its jobs' pipe closes) and reap it."""
        if self.proc is None or self.proc[3] != os.getpid():
            self.proc = None
            return
        pid, r, w, _ = self.proc
        self.proc = None
        if kill:
            _kill(pid)
        for fd in (w, r):
            os.close(fd)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:   # (reaped already: `_ended`)
            pass


def _start(one):
    """(pid, read end, write end, this pid) of a new child serving jobs, or None."""
    if not hasattr(os, "fork") or not fork_safe():
        return None
    _flush()   # (empty, so the child's own lines alone are flushed)
    forked = fork_piped(inbound=True)
    if forked is None:
        return None
    if forked[0]:
        return (*forked, os.getpid())
    _, w, r = forked   # the child: serve until the jobs' pipe closes
    code = 1
    try:
        with os.fdopen(r, "rb") as jobs, os.fdopen(w, "wb") as out:
            while True:
                head = jobs.read(_LEN.size)
                if len(head) < _LEN.size:
                    break
                job, seconds = pickle.loads(jobs.read(_LEN.unpack(head)[0]))
                body = _serve(one, job, seconds)
                out.write(_LEN.pack(len(body)))
                out.write(body)
                out.flush()
        code = 0
    finally:
        leave(code)


def _serve(one, job, seconds):
    """One job's reply, pickled: its outcome (or {"error"} naming what escaped it), what it added
    to the hash record, and what it printed (handed to the task that sent it: the streams this
    child was forked with are the first task's)."""
    before = fingerprint.snapshot(findings=True)
    said, warned, logged = io.StringIO(), io.StringIO(), io.StringIO()
    handlers = _log_handlers()
    kept = [h.setStream(logged) for h in handlers]   # (the log's lines: to the stream it writes to)
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(warned):
            outcome = one(job, seconds)
    except BaseException as e:   # (KeyboardInterrupt, SystemExit a check raised: its error)
        outcome = {"error": f"the lock check raised {type(e).__name__}: {e}"}
    finally:
        for h, stream in zip(handlers, kept):
            h.setStream(stream)
    reply = (outcome, fingerprint.added_since(before), said.getvalue(), warned.getvalue(), logged.getvalue())
    try:
        return pickle.dumps(reply, pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        return pickle.dumps(({"error": f"the lock check's outcome cannot be handed back: {type(e).__name__}: "
                                       f"{e}"}, *reply[1:]), pickle.HIGHEST_PROTOCOL)


def _flush():
    for stream in (sys.stdout, sys.stderr):
        stream.flush()


def _log_handlers():
    """The handlers of the pipeline's log (`log.setup`'s, on the stream stderr was then)."""
    from .log import LOG
    return [h for h in LOG.handlers if getattr(h, "logos", False)]


def _send(fd, body):
    view = memoryview(_LEN.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view):]


def _receive(proc, seconds):
    """One outcome's bytes from the child: read as they come, into one buffer of the length its
    prefix gives. A Lost where the child ends first, or sends nothing for `seconds` + GRACE (a
    transfer going on is no stall)."""
    pid, r = proc[0], proc[1]
    head, body, got = bytearray(_LEN.size), None, 0
    deadline = time.monotonic() + seconds + GRACE
    while True:
        buf = head if body is None else body
        if body is not None and got == len(body):
            return body
        left = deadline - time.monotonic()
        if left <= 0:
            _kill(pid)
            raise Lost(f"{{}} took over {seconds} s (limits.seconds) in a call no signal stops: its "
                       f"process was killed {GRACE} s later")
        if not select.select([r], [], [], left)[0]:
            continue
        n = os.readv(r, [memoryview(buf)[got:]])
        if not n:
            raise Lost(_ended(pid))
        got += n
        deadline = time.monotonic() + seconds + GRACE
        if body is None and got == _LEN.size:
            body, got = bytearray(_LEN.unpack(head)[0]), 0


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _ended(pid):
    """How a child that handed back too little ended, in words ({} for the check); reaped here."""
    return "{}'s process " + ended(os.waitpid(pid, 0)[1]) + " before the check ended"
