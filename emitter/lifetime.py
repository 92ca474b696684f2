"""A process's life bound to another's (Linux's PR_SET_PDEATHSIG): a program a run starts (an
import) ends with that run, whoever kills it. Standard library only: an import loads it."""

import os
import signal
import sys

PR_SET_PDEATHSIG = 1
DIE_WITH = "LOGOS_DIE_WITH"   # set for a program a run starts (an import): the starting pid
_PRCTL = []


def prctl():
    """libc's prctl, loaded at the first use (ctypes costs a no-op run milliseconds); None where
    it cannot be."""
    if not _PRCTL:
        try:
            import ctypes
            call = ctypes.CDLL(None, use_errno=True).prctl
            call.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
            call.restype = ctypes.c_int
            _PRCTL.append(call)
        except (OSError, AttributeError, ImportError):
            _PRCTL.append(None)
    return _PRCTL[0]


def die_with(pid):
    """Be SIGKILLed when the process `pid` (this one's parent) ends; already gone: end now. Linux
    only (elsewhere nothing is bound)."""
    call = prctl() if sys.platform.startswith("linux") else None
    if call is None or call(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return
    if os.getppid() != pid:
        os.kill(os.getpid(), signal.SIGKILL)


def die_with_parent():
    """In a program a run started with `DIE_WITH` naming the starting process (`subprocess`
    children are not bound by the run's fork hook: no Python runs between their fork and exec):
    be SIGKILLed when that process ends, so a killed run leaves no import going on under
    build/tmp. Already gone: end now."""
    pid = os.environ.pop(DIE_WITH, "")
    if pid.isdigit():
        die_with(int(pid))


def ended(status):
    """How a process ended, in words, from its wait status (os.waitpid's)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        return f"was killed by signal {sig} ({name}{': the OOM killer?' if sig == signal.SIGKILL else ''})"
    return f"ended with exit status {os.WEXITSTATUS(status)}"


def leave(code):
    """End this (forked) process now with `code`, what it printed flushed first (os._exit flushes
    nothing, and runs none of the exit handlers a bundle may have set)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
