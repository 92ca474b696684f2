"""Process-wide guards of a doit run: one run per build/ at a time, SIGTERM kept as an interrupt
(doit then keeps the finished tasks), and the cyclic collector paused while doit loads the zoo."""

import atexit
import contextlib
import fcntl
import gc
import os
import shutil
import signal
import sys
import threading

from ..files import PARTIAL


_LOCK_FD = None


class BuildBusy(SystemExit):
    pass


class TimeLimit(Exception):
    """A task's work ran past its wall-time limit."""


@contextlib.contextmanager
def deadline(seconds, what):
    """Raise TimeLimit in this (main) thread once `seconds` of wall time have passed; a worker
    thread (`doit -P thread`) cannot take a signal, so there the limit is not kept."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeLimit(f"{what} took over {seconds} s (limits.seconds)")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def safe_build(root, build_dir):
    """Refuse a build/ that is a link or resolves outside the repository: targets would escape it."""
    path = os.path.join(root, build_dir)
    real = os.path.realpath(path)
    if os.path.islink(path) or not real.startswith(os.path.realpath(root) + os.sep):
        sys.stderr.write(f"doit: refused: {build_dir}/ is a link or lies outside {root} ({real}); "
                         "make it a plain folder inside the repository\n")
        raise BuildBusy(3)


def sweep(build_dir):
    """After a run that did not end (SIGKILL, a power cut), remove what it left half done: the
    temporary folder build/tmp (imports unpack there) and staged files (`*.partial`). A marker
    says a run is going on; only this process holds the build/ lock, so nothing else is writing."""
    marker = os.path.join(build_dir, ".running")
    if os.path.exists(marker):
        shutil.rmtree(os.path.join(build_dir, "tmp"), ignore_errors=True)
        for dirpath, _, files in os.walk(build_dir):
            for f in files:
                if f.endswith(PARTIAL):
                    try:
                        os.unlink(os.path.join(dirpath, f))
                    except OSError:
                        pass
    with open(marker, "w"):
        pass
    atexit.register(lambda: os.path.exists(marker) and os.unlink(marker))


def exclusive(build_dir):
    """Hold `build_dir/.doit.lock` for this process's life; refuse clearly if another run holds it.

    doit's dependency DB allows one process at a time (pydoit issues #121, #380)."""
    global _LOCK_FD
    if _LOCK_FD is not None:
        return
    os.makedirs(build_dir, exist_ok=True)
    path = os.path.join(build_dir, ".doit.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            other = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
        finally:
            os.close(fd)
        sys.stderr.write(f"doit: refused: another doit run (pid {other}) is using {build_dir}/ and "
                         "its dependency DB; wait for it to finish and run again\n")
        raise BuildBusy(3)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _LOCK_FD = fd


def sigterm_to_interrupt(signum, frame):
    """SIGTERM as Ctrl-C: doit then flushes the finished tasks' state instead of losing the run."""
    raise KeyboardInterrupt(signum)


_PREVIOUS_HOOK = sys.excepthook
REPORT_FILES = ("report.json", "junit.xml", "summary.md", "report.html")
_BUILD = None


def _interrupted(kind, value, tb):
    """An interrupt that reached the top ends the run with one line, not a traceback (doit has
    already saved the finished tasks' state); SIGTERM then ends the process as SIGTERM would.
    The signal number comes as an int from `sigterm_to_interrupt`, or as its text when doit's
    parallel runner re-raises a worker's interrupt; anything else is taken as Ctrl-C."""
    if not issubclass(kind, KeyboardInterrupt):
        return _PREVIOUS_HOOK(kind, value, tb)
    try:
        sig = signal.Signals(int(value.args[0]))
    except (IndexError, TypeError, ValueError):
        sig = signal.SIGINT
    removed = _remove_report()
    sys.stderr.write(f"doit: interrupted ({sig.name}); the finished tasks are kept: run doit "
                     "again to go on" + ("; the report of an earlier run was removed" if removed else "")
                     + "\n")
    if sig == signal.SIGTERM:
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _remove_report():
    """An interrupted run has no report, and an earlier run's must not stand in for it."""
    removed = False
    for f in REPORT_FILES if _BUILD else ():
        try:
            os.unlink(os.path.join(_BUILD, f))
            removed = True
        except OSError:
            pass
    return removed


def install_sigterm(build_dir=None):
    """SIGTERM as an interrupt, and one line (not a traceback) for an interrupt; the report files
    under `build_dir` are removed when a run is interrupted."""
    global _PREVIOUS_HOOK, _BUILD
    _BUILD = build_dir
    signal.signal(signal.SIGTERM, sigterm_to_interrupt)
    if sys.excepthook is not _interrupted:
        _PREVIOUS_HOOK, sys.excepthook = sys.excepthook, _interrupted


def pause_collector():
    """The cyclic collector off while doit loads and checks the zoo's tasks: thousands of
    long-lived objects and no cycles worth finding, yet every pass would rescan them all (measured:
    about a tenth of a 1000-program no-op). Each action turns it back on before its own work."""
    gc.disable()


def freeze_heap():
    """Move what exists now (doit's thousands of task objects) out of the cyclic collector's view
    and turn the collector back on: otherwise every collection during an action's heavy imports
    (numpy, torch) rescans them all (measured: half a second of a one-edit rebuild at 1000
    programs)."""
    gc.freeze()
    gc.enable()
