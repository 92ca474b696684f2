"""How much memory this process may take: a check's tensor limit by default, and what a trace
may hold in memory (the machine's, or its container's where that is less)."""

import functools
import os


def memory_bytes():
    """The memory this process may take: the machine's, or less where its container's (a cgroup's
    limit, v2 or v1, its own or an enclosing one's) is less; 16 GiB where neither can be told. A
    check's tensor limit by default is half of it: a CI container's cap, not its host's."""
    try:
        machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        machine = 16 << 30
    return min([machine, *_cgroup_limits()])


@functools.lru_cache(maxsize=None)
def default_tensor_bytes():
    """limits.tensor_bytes by default: half the memory this process may take (no part of a key:
    clones on other machines share keys)."""
    return memory_bytes() // 2


CGROUPS = ("/proc/self/cgroup", "/sys/fs/cgroup")   # (where this process's cgroups are named, mounted)


def _cgroup_limits():
    """The memory limits of the cgroups this process is in, and of those enclosing them."""
    out = []
    try:
        with open(CGROUPS[0], encoding="ascii") as f:
            lines = f.read(65536).splitlines()
    except (OSError, UnicodeDecodeError):
        return out
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":   # v2
            root, name = CGROUPS[1], "memory.max"
        elif "memory" in controllers.split(","):
            root, name = os.path.join(CGROUPS[1], "memory"), "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):
            try:
                with open(os.path.join(root, *parts[:depth], name), encoding="ascii") as f:
                    text = f.read(64).strip()
            except (OSError, UnicodeDecodeError):
                continue
            if text.isdigit() and 0 < int(text) < 1 << 60:   # ("max", or v1's page-rounded 2^63)
                out.append(int(text))
    return out
