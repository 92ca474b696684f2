"""How many threads a lock check computes with: set explicitly (torch's pool, and the BLAS's
through threadpoolctl) and recorded in its result, whether doit, a Dask worker or `logos lock` runs
it. On a 2-core machine a smollm2 float32 lock took 2.7-3.3 s at 1 thread and 6-12 s at torch's
default 2 (torch's and the BLAS's pools fight for the cores), so the default is 1: for more
throughput, run more checks at once, not more threads per check."""

import contextlib
import functools
import threading

DEFAULT_THREADS = 1
MAX_THREADS = 4096   # torch's pool crashes the process (a segfault, after the verdict) at 65536


def thread_count(text):
    """A thread count as a user writes it (`doit threads=N`, `logos results --threads N`), or a
    ValueError saying what it must be."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_THREADS:
        raise ValueError(f"must be a whole number from 1 to {MAX_THREADS}")
    return int(text)


@functools.lru_cache(maxsize=None)
def _controller():
    """threadpoolctl's view of the BLAS libraries loaded (numpy's and torch's are, by the time a
    check starts), found once per process: finding them walks every loaded library (2 ms a
    check); None without threadpoolctl."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:   # the BLAS keeps what its environment variables gave it at start
        return None
    return ThreadpoolController()


_STATE = {"n": None, "users": 0, "undo": None}   # the process's setting, and the checks under it
_CHANGE = threading.Condition()


@contextlib.contextmanager
def thread_limits(n):
    """torch's and the BLAS's thread pools at `n` for the block; what was set. Both are the
    process's: checks that run at once in its threads (`doit -P thread`) share the setting (each
    sets it for its own thread's OpenMP too), and the last to end puts back what was before (the
    first to end would undo it under the others, which then computed at another count than their
    key names); one asking another count waits."""
    import torch
    with _CHANGE:
        _CHANGE.wait_for(lambda: _STATE["users"] == 0 or _STATE["n"] == n)
        if _STATE["users"] == 0:
            controller = _controller()
            limiter = contextlib.nullcontext() if controller is None else \
                controller.limit(limits=n, user_api="blas")
            _STATE.update(n=n, undo=(torch.get_num_threads(), limiter))
            limiter.__enter__()
        _STATE["users"] += 1
    try:   # (from here on, the last to end undoes it, whatever raises)
        torch.set_num_threads(n)
        yield {"threads": n, "torch_threads": torch.get_num_threads(),
               "blas_limit": "environment" if _controller() is None else "threadpoolctl"}
    finally:
        with _CHANGE:
            _STATE["users"] -= 1
            if _STATE["users"] == 0:
                before, limiter = _STATE["undo"]
                limiter.__exit__(None, None, None)
                torch.set_num_threads(before)
                _CHANGE.notify_all()
