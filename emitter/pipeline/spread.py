"""A pure function over many items spread over the machine's cores by fork, as git spreads its index
preload over threads: the pre-check of a thousand-program zoo is a thousand independent key
computations, each a few stats, two small reads and a few digests, and a report's rows and files
are as independent; Python's interpreter holds one core. Each forked child computes a slice and
hands back its results and the hashes it added to the fingerprint record. Where fork is not
there, one core is, other threads run (a Dask client's: a lock one of them holds would never be
let go in the child; the run's watch of doit's workers holds none) or a child fails, the parent
computes that slice itself, so the result is the same either way."""

import os
import pickle
import signal

from .. import fingerprint
from .guards import fork_safe, own_fork

MIN_PER_CHILD = 200   # items: below this a fork costs about what it saves (a pre-check's programs)


def cores():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def spread(fn, items, least=MIN_PER_CHILD):
    """[fn(x) for x in items], the slices after the first computed by forked children of at least
    `least` items each."""
    items = list(items)
    n = min(cores(), len(items) // least) \
        if hasattr(os, "fork") and fork_safe() else 1
    if n <= 1:
        return [fn(x) for x in items]
    size = -(-len(items) // n)
    slices = [items[i:i + size] for i in range(0, len(items), size)]
    children = [_fork(fn, s) for s in slices[1:]]
    out = [fn(x) for x in slices[0]]
    for s, child in zip(slices[1:], children):
        got = _collect(child)
        if got is None:
            out += [fn(x) for x in s]
            continue
        results, hashes = got
        fingerprint.merge(hashes)
        out += results
    return out


def fork_piped(inbound=False):
    """(pid, the pipe's read end) in the parent, (0, its write end) in a child this process waits
    for itself, or None where none can start; `inbound`: a second pipe, the parent's write end
    and the child's read end added to each. The child runs none of the parent's signal handlers
    (one the parent ignores stays ignored); it must end by os._exit."""
    pipes = []
    try:
        for _ in range(1 + inbound):
            pipes += os.pipe()
    except OSError:
        _close(pipes)
        return None
    try:
        with own_fork():
            pid = os.fork()
    except OSError:
        _close(pipes)
        return None
    r, w, *more = pipes
    if pid:
        _close([w, *more[:1]])
        return (pid, r, *more[1:])
    try:
        _close([r, *more[1:]])
        for sig in (signal.SIGTERM, signal.SIGINT):
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)
    except BaseException:
        os._exit(1)   # (never the parent's code, in the child)
    return (0, w, *more[:1])


def _close(fds):
    for fd in fds:
        os.close(fd)


def _fork(fn, items):
    """(pid, read end) of a child computing fn over `items`, or None where it cannot start."""
    forked = fork_piped()
    if forked is None or forked[0]:
        return forked
    w = forked[1]   # the child: nothing of the parent's is flushed or saved
    code = 1
    try:
        before = fingerprint.snapshot()
        results = [fn(x) for x in items]
        body = pickle.dumps((results, fingerprint.added_since(before)), pickle.HIGHEST_PROTOCOL)
        with os.fdopen(w, "wb") as f:
            f.write(body)
        code = 0
    finally:
        os._exit(code)


def _collect(child):
    """What a child handed back, or None when it failed (its slice is then computed again)."""
    if child is None:
        return None
    pid, r = child
    with os.fdopen(r, "rb") as f:
        body = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not body:
        return None
    try:
        return pickle.loads(body)
    except (pickle.PickleError, EOFError, ValueError, TypeError, AttributeError):
        return None
