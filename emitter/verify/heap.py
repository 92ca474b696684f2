"""The cyclic collector during a check. What the process holds when a check starts (torch's and
numpy's modules, a driver's tasks: hundreds of thousands of long-lived objects) holds no garbage
the check makes, yet each full collection its allocations set off would rescan it all (measured:
80 ms of a 600-stage program's lock, the first in a process). A check's own garbage is freed as
its references go (arrays, tensors); what cycles it leaves are collected once it is over."""

import gc


def pause():
    """The collector off for a check; True where it was on (the caller then `resume`s)."""
    on = gc.isenabled()
    gc.disable()
    return on


def resume(on):
    if on:
        gc.enable()
