"""The cyclic collector during a check. What the process holds when a check starts (torch's and
numpy's modules, a driver's tasks: hundreds of thousands of long-lived objects) holds no garbage
the check makes, yet each full collection its allocations set off would rescan it all (measured:
80 ms of a 600-stage program's lock, the first in a process). A check's own garbage is freed as
its references go (arrays, tensors); what cycles it leaves are collected once it is over.

Checks may run at once on threads (`doit -P thread`, a Dask worker): the collector is off from
the first one's start to the last one's end, then as it was when the first began."""

import gc
import threading

_LOCK = threading.Lock()
_UNDER_WAY = [0, False]   # checks under way; whether the collector was on when the first began


def pause():
    """The collector off for a check; True (each `pause` is matched by one `resume`)."""
    with _LOCK:
        if _UNDER_WAY[0] == 0:
            _UNDER_WAY[1] = gc.isenabled()
            gc.disable()
        _UNDER_WAY[0] += 1
    return True


def resume():
    with _LOCK:
        _UNDER_WAY[0] -= 1
        if _UNDER_WAY[0] == 0 and _UNDER_WAY[1]:
            gc.enable()
