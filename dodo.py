"""doit tasks for this repository's zoo: the packaged ones (`emitter.tasks`, what any repository of
programs gets from `from emitter.tasks import *`), and a check of the small programs' weights.

`doit` builds everything; `doit lock:NAME` one program; `doit -n 2` in parallel; `doit list --all`
shows every task. See the README.
"""

import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)   # this checkout's emitter, whether or not it is installed
os.chdir(ROOT)

from emitter.tasks import *  # noqa: E402,F401,F403

SMALL = "weights/make_small.py"


def _check_small():
    """weights/make_small.py --check, in this process (no second interpreter to start): a failure
    names the files that differ."""
    import importlib.util
    from doit.exceptions import TaskFailed
    spec = importlib.util.spec_from_file_location("make_small", SMALL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stale = [os.path.relpath(p) for p in module.differing()]
    if stale:
        return TaskFailed(f"{', '.join(stale[:5])}{' and more' if stale[5:] else ''}: not what "
                          f"{SMALL} makes (missing or edited; `python {SMALL}` writes them)")
    return True


def _plain(path):
    """A regular file, links followed (os.stat: a FIFO is never opened)."""
    import stat
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def task_small_weights():
    """weights/*: the small programs' committed weights are what weights/make_small.py makes."""
    if not os.path.isfile(SMALL):
        return
    files = sorted(f"weights/{d}/{f}" for d in os.listdir("weights") if os.path.isdir(f"weights/{d}")
                   for f in os.listdir(f"weights/{d}") if f.endswith(".f64")
                   and _plain(f"weights/{d}/{f}"))   # what it writes: a file of another name
    #   there is never read (nor hashed); nor is a FIFO, a device or a folder (doit would hang on
    #   it or crash): the packaged lock tasks name such a leaf as an error
    return {
        "actions": [_check_small],
        "file_dep": [SMALL] + files,
        "verbosity": 0,
    }
