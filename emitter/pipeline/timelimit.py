"""A wall-time limit on a block of work (limits.seconds), in whatever thread runs it."""

import contextlib
import signal
import threading


class TimeLimit(Exception):
    """A task's work ran past its wall-time limit."""
    stops = True   # (what it interrupts did not raise: it was stopped, the lock says)


@contextlib.contextmanager
def deadline(seconds, what):
    """Raise TimeLimit in this thread once `seconds` of wall time have passed: by SIGALRM in the
    main thread; in another (`doit -P thread`), which cannot take a signal, by a timer thread
    that sets it as this thread's asynchronous exception. Either is raised between two bytecodes,
    so a long NumPy or torch call ends first, and in a worker thread a blocking call (a sleep, a
    read) too. Not nested: an inner limit's end clears an outer one's pending exception."""
    message = f"{what} took over {seconds} s (limits.seconds)"
    if threading.current_thread() is not threading.main_thread():
        with _async_deadline(seconds, message):
            yield
        return

    def expire(signum, frame):
        raise TimeLimit(message)
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _async_deadline(seconds, message):
    import ctypes
    expired = type("TimeLimit", (TimeLimit,), {"__init__": lambda self: TimeLimit.__init__(self, message),
                                                "__module__": __name__})   # (raised as a class: no arguments)
    tid, state, guard = ctypes.c_ulong(threading.get_ident()), {"on": True}, threading.Lock()

    def expire():
        with guard:
            if state["on"]:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(tid, ctypes.py_object(expired))
    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with guard:
            state["on"] = False
            ctypes.pythonapi.PyThreadState_SetAsyncExc(tid, None)   # (one set but not yet raised)
