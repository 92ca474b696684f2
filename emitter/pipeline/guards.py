"""Process-wide guards of a doit run: one run per build/ at a time (whose forked workers end with
it), doit's dependency DB set aside when damaged, SIGTERM kept as an interrupt (doit then keeps the
finished tasks), and the cyclic collector paused while doit loads the zoo."""

import atexit
import contextlib
import errno
import fcntl
import gc
import hashlib
import os
import signal
import stat
import sys
import threading
import time

from ..files import remove_whatever
from ..lifetime import PR_SET_PDEATHSIG as _PR_SET_PDEATHSIG, prctl as _prctl


_LOCK_FD = None


class BuildBusy(SystemExit):
    pass


def exclusive(build_dir, db=".doit.db"):
    """Hold `build_dir/.doit.lock` for this process's life; refuse clearly if another live run
    holds it. Then bind the processes this one forks to it (`bind_children`) and set doit's DB
    (`build_dir/db`) aside if it is damaged (`check_db`): once per run, under the lock.

    doit's dependency DB allows one process at a time (pydoit issues #121, #380). The lock is a
    POSIX record lock (`lockf`): it belongs to this process alone, so a forked worker never holds
    it, and it goes when this process does, however it ends (a killed run's lock is free)."""
    global _LOCK_FD
    if _LOCK_FD is not None:
        return
    path = os.path.join(build_dir, ".doit.lock")
    try:
        os.makedirs(build_dir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file")
    except OSError as e:   # (build/ read-only, full; the lock's name a folder, a FIFO)
        sys.stderr.write(f"doit: refused: {path} cannot be opened to hold the run's lock ({e.strerror})\n")
        raise BuildBusy(3) from None
    waited = time.monotonic() + _UNNAMED_WAIT
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                os.close(fd)
                raise
        # busy: a live process holds it (the kernel frees a dead one's). The pid in the file is
        # that run's once it has written it; a run that has only just taken the lock has not yet,
        # and the file still names the run before it (dead), so wait a moment for the pid
        other = _recorded_pid(fd)
        if (other is not None and _alive(other)) or time.monotonic() > waited:
            os.close(fd)
            sys.stderr.write(f"doit: refused: another doit run (pid {other or '?'}) is using "
                             f"{build_dir}/ and its dependency DB; wait for it to finish and run "
                             "again\n")
            raise BuildBusy(3)
        time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _LOCK_FD = fd     # kept open: closing any descriptor of the file would drop a POSIX lock
    _SAID[:] = [os.path.join(build_dir, "tmp", "said")]   # (say_once's markers: this run's alone)
    with contextlib.suppress(OSError):
        remove_whatever(_SAID[0])
    bind_children()
    check_db(os.path.join(build_dir, db))


_UNNAMED_WAIT = 2.0   # seconds a busy lock may name no live process before the run is refused


_SAID = []   # the folder of this run's said-once markers


def say_once(message, say):
    """`say(message)` once a run, in whichever of its processes (`doit -n`'s workers) comes to it
    first (a marker under build/tmp/said/, made afresh by each run); outside a run, each time."""
    began = began_ns()
    if began is not None and _SAID:
        name = hashlib.sha256(f"{began} {message}".encode()).hexdigest()[:24]
        try:
            os.makedirs(_SAID[0], exist_ok=True)
            os.close(os.open(os.path.join(_SAID[0], name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError as e:
            if e.filename == os.path.join(_SAID[0], name):   # (said by another; else no folder)
                return
        except OSError:
            pass
    say(message)


def began_ns():
    """When this run began, on the file system's clock: the lock file's ctime as the run wrote its
    pid (a file changed since has a ctime no earlier); None outside a run."""
    return None if _LOCK_FD is None else os.fstat(_LOCK_FD).st_ctime_ns


def _recorded_pid(fd):
    """The pid the lock's holder wrote into the file, None if there is none (yet)."""
    text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _alive(pid):
    """Whether a process `pid` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# bind_children: PR_SET_PDEATHSIG on Linux; elsewhere nothing (the lock is still never inherited)
_BOUND = False
_FORKER = (0, False, None)   # (pid, main thread?, prctl) of the forking process and thread


def bind_children():
    """Every process this one forks from now on (doit's `-n` workers, theirs in turn) is SIGKILLed
    when this one ends: a killed run (SIGKILL, the OOM killer) leaves no workers behind to go on
    writing under build/. A child forked from another thread than the main one is left unbound:
    the kernel takes the death of the forking *thread* for its parent's. Children made by
    `subprocess` (fork and exec in C) are not covered: no Python runs in them before exec (a
    program the run starts binds itself: `emitter.lifetime.die_with_parent`)."""
    global _BOUND
    if _BOUND or not sys.platform.startswith("linux"):
        return
    os.register_at_fork(before=_before_fork, after_in_child=_bind_this_child)
    _BOUND = True


def _before_fork():
    global _FORKER
    main = threading.current_thread() is threading.main_thread()
    if main and not _WATCHED and not _OWN_FORK:   # doit's `-n` workers start
        _WATCHED.append(threading.Thread(target=_watch_workers, name="logos-workers", daemon=True))
        _WATCHED[0].start()
    _FORKER = (os.getpid(), main, _prctl())


_WATCHED, WORKER_DIED = [], []
RUNNING = []   # (the run's reporter's: a callable giving the tasks started and not ended)
_OWN_FORK = []   # set while `spread` forks: it waits for its own children


@contextlib.contextmanager
def own_fork():
    """A fork whose child the caller waits for itself (`spread`): no worker watch starts for it."""
    _OWN_FORK.append(True)
    try:
        yield
    finally:
        _OWN_FORK.pop()


def fork_safe():
    """Whether no thread but the main one, the worker watch and a `-n` worker's queue feeder runs:
    the watch holds no lock a forked child could wait on (it sleeps and reads a set), the feeder
    only its queue's, which no child uses; any other thread might."""
    return all(t is threading.main_thread() or (_WATCHED and t is _WATCHED[0]) or t.name == "QueueFeederThread"
               for t in threading.enumerate())


def _watch_workers(every=0.2):
    """doit's `-n` runner waits for each worker's result forever: a worker killed (the OOM killer,
    a bundle's own os._exit) would hang the run. Watch them; when one ends other than as doit ends
    it (exit 0, or SIGTERM from doit itself), say so and stop the run as an interrupt does (doit
    keeps the finished tasks; the report of the last complete run stays marked stale), exit 1.
    The children are read from multiprocessing's own set, unreaped (active_children() reaps a
    dead one before it could be seen)."""
    import multiprocessing
    while True:
        time.sleep(every)
        # (doit's workers are the default context's Process; a Dask cluster's are spawned)
        for p in list(getattr(multiprocessing.process, "_children", ())):
            code = p.exitcode if type(p) is multiprocessing.Process else None
            if code not in (None, 0, -signal.SIGTERM, -signal.SIGINT):   # (doit ending it, a Ctrl-C)
                how = f"killed by signal {-code}" if code < 0 else f"ended with exit status {code}"
                with contextlib.suppress(ValueError):
                    how = f"killed by {signal.Signals(-code).name}" if code < 0 else how
                running = ", ".join(RUNNING[0]()) if RUNNING else ""
                WORKER_DIED.append(f"a doit worker process (pid {p.pid}) was {how} while the run went on "
                                   "(out of memory? a bundle's own exit?), and doit would wait for it forever"
                                   + (f"; the tasks running then: {running}" if running else ""))
                os.kill(os.getpid(), signal.SIGTERM)
                return


def _bind_this_child():
    """In a fresh child: die with the parent. Set, then look: a parent that died before the
    setting took effect sends no signal, and this child then has another parent already. SIGTERM
    (doit's end of a worker) ends it as SIGTERM does, not as an interrupt with a traceback."""
    if signal.getsignal(signal.SIGTERM) is sigterm_to_interrupt:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    forker, main, prctl = _FORKER
    if not main or prctl is None:
        return
    if prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return
    if os.getppid() != forker:
        os.kill(os.getpid(), signal.SIGKILL)


_DOIT_THEN = "doit makes a new one (what is current is decided by each task's key)"


def check_db(path, then=_DOIT_THEN, pages=True, keep=False, odd=True):
    """Set an SQLite DB aside as `path.damaged` when sqlite3 cannot read it (garbage, a truncated
    file, a broken page), with one line on stderr saying what comes `then`: doit makes a new one
    and checks every task again, instead of each run ending in doit's traceback. On a good DB:
    one open and `PRAGMA quick_check` (its b-tree pages walked, no index cross-check), nothing
    written; with `pages` false, its 100-byte header alone (a file that is no DB, or shorter than
    its header says with no write-ahead log beside it to finish it). `keep`: an earlier damaged
    copy stays (`path.damaged.2`, … for this one). `odd`: what is there but no file (a folder, a
    FIFO, a link to nothing) is set aside too; else left to the reader to name."""
    if os.path.isfile(path):
        reason = _damage(path) if pages else _header_damage(path)
    elif odd and os.path.lexists(path):   # (sqlite's traceback, or a hang)
        reason = "it is not a regular file"
    else:
        return
    if reason is None:
        return
    reason = " ".join(str(reason).split())   # (sqlite's own text may hold a newline: one line)
    aside, n = path + ".damaged", 1
    while keep and os.path.lexists(aside):
        n += 1
        aside = f"{path}.damaged.{n}"
    try:
        for suffix in SQLITE_COMPANIONS:      # an older damaged DB's own journal goes with it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(aside + suffix)
        os.replace(path, aside)
        for suffix in SQLITE_COMPANIONS:      # a journal left beside it would be rolled back
            with contextlib.suppress(FileNotFoundError):   # into the new DB
                os.replace(path + suffix, aside + suffix)
    except OSError as e:
        sys.stderr.write(f"doit: {path} is damaged ({reason}) and could not be set aside ({e}): "
                         "remove it and run again\n")
        raise BuildBusy(3) from None
    sys.stderr.write(f"doit: {path} was damaged ({reason}): set aside as {aside}; {then}\n")


def history_lost(db):
    """Whether the history at `db` is to be made again before any lock of the run adds to it:
    deleted, empty, or found damaged and set aside now. Its header is read on every run; its
    pages are walked where a reader or writer of it met a damaged one (`db.suspect` beside it)."""
    flagged = os.path.exists(db + SUSPECT)
    check_db(db, "it is made again from the results build/ holds", pages=flagged, keep=True,
             odd=False)   # (a link to nothing may be a volume not mounted: the reader names it)
    if flagged:
        with contextlib.suppress(OSError):
            os.unlink(db + SUSPECT)
    try:
        return os.stat(db).st_size == 0
    except FileNotFoundError:
        return True


SUSPECT = ".suspect"
BEHIND = ".behind"   # beside the history: a lock's rows did not go in (it was held): `results.catch_up`


def corrupt(e):
    """Whether sqlite3's error `e` says the file is damaged (not busy, unreadable or full)."""
    return _primary(e) in (_SQLITE_CORRUPT, _SQLITE_NOTADB)


def disk_failed(e):
    """Whether sqlite3's error `e` says the disk failed it (full, or an I/O error), not the file."""
    return _primary(e) in (_SQLITE_IOERR, _SQLITE_FULL)


def _primary(e):
    return getattr(e, "sqlite_errorcode", 0) & 0xFF


def _damage(path):
    import sqlite3
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=1.0)) as con:
            rows = con.execute("PRAGMA quick_check").fetchall()
        if rows != [("ok",)]:
            return "; ".join(str(r[0]) for r in rows[:3]) or "no answer to quick_check"
    except sqlite3.DatabaseError as e:
        if corrupt(e):
            return str(e)
    return None    # good, or busy, unreadable, a full disk: not the file's fault; the reader says it


def _header_damage(path):
    """What SQLite's file format says of the file's first 100 bytes and its size, unopened."""
    try:
        with open(path, "rb") as f:
            head, size = f.read(100), os.fstat(f.fileno()).st_size
    except OSError:
        return None
    if size == 0:
        return None     # an empty file is an empty DB
    if len(head) < 100 or not head.startswith(b"SQLite format 3\x00"):
        return "file is not a database"
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    try:   # a checkpoint writes page 1 first: the log beside it holds the pages still to come
        logged = os.stat(path + "-wal").st_size > 0
    except OSError:
        logged = False
    if head[24:28] == head[92:96] and size < pages * page and not logged:   # a cut file
        return f"truncated: {size} bytes of its {pages * page}"
    return None


_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_NOTADB = 10, 11, 13, 26
SQLITE_COMPANIONS = ("-journal", "-wal", "-shm")


def sigterm_to_interrupt(signum, frame):
    """SIGTERM as Ctrl-C: doit then flushes the finished tasks' state instead of losing the run.
    One that arrives while a fork hook runs (logging's, this module's), where an exception is
    printed and dropped and the run would go on as if none came, is sent again a moment later."""
    import logging
    hooks = {f.__code__ for f in (logging._acquireLock, logging._releaseLock, _before_fork, _bind_this_child)
             if hasattr(f, "__code__")}
    while frame is not None:
        if frame.f_code in hooks:
            threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()
            return
        frame = frame.f_back
    raise KeyboardInterrupt(signum)


_PREVIOUS_HOOK = sys.excepthook


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
    why = f"stopped: {WORKER_DIED[0]}" if WORKER_DIED else f"interrupted ({sig.name})"
    aside = getattr(sys.modules.get(f"{__package__}.report_aside"), "HELD", None)   # (the zoo's reporter's run)
    sys.stderr.write(f"doit: {why}; the finished tasks are kept: run doit again to go on" + (
        " (no report is in build/ until a run ends: build/stale/ keeps the last, not current)" if aside else "")
        + "\n")
    if WORKER_DIED:   # the run failed: exit 1 (an interrupt's own exit would say Ctrl-C)
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(1)
    if sig == signal.SIGTERM:
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def install_sigterm():
    """SIGTERM as an interrupt, and one line (not a traceback) for an interrupt."""
    global _PREVIOUS_HOOK
    signal.signal(signal.SIGTERM, sigterm_to_interrupt)
    if sys.excepthook is not _interrupted:
        _PREVIOUS_HOOK, sys.excepthook = sys.excepthook, _interrupted


def pause_collector():
    """The cyclic collector off while doit loads and checks the zoo's tasks (thousands of objects,
    no cycles worth finding: a tenth of a 1000-program no-op). Each action turns it back on."""
    gc.disable()


def freeze_heap():
    """Move what exists now (doit's thousands of task objects) out of the cyclic collector's view
    and turn the collector back on: otherwise every collection during an action's heavy imports
    (numpy, torch) rescans them all (measured: half a second of a one-edit rebuild at 1000
    programs)."""
    gc.freeze()
    gc.enable()
