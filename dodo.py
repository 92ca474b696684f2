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


SMALL_BYTES = 1 << 20


def _plain(path):
    """A regular file of at most SMALL_BYTES, links followed (os.stat: a FIFO is never opened)."""
    import stat
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size <= SMALL_BYTES


def task_small_weights():
    """weights/*: the small programs' committed weights are what weights/make_small.py makes."""
    if not os.path.isfile(SMALL):
        return
    made = _made()
    files = [f for f in made if _plain(f)]
    # only what it writes is a dependency: another file there is never read (nor hashed), nor is
    # a FIFO, a device, a folder or a file of over SMALL_BYTES in its place (it is checked: its
    # head read, it differs); the packaged lock tasks name such a leaf as an error
    # make_small.py reads each program's shapes too: an edit of one reruns the check
    programs = sorted({f"programs/{f.split('/')[1]}.logos" for f in made})
    return {
        "actions": [_check_small],
        "file_dep": [SMALL] + [p for p in programs if _plain(p)] + files,
        "uptodate": [len(files) == len(made)],
        "verbosity": 0,
    }


def _made():
    """weights/NAME/VAR.f64 of every VAR of every NAME in make_small.py's PROGRAMS, read from its
    text (its import would load NumPy into every run)."""
    import ast
    with open(SMALL, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    table = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "PROGRAMS" for t in n.targets))
    return sorted(f"weights/{k.value}/{v.value}.f64" for k, d in zip(table.keys, table.values) for v in d.keys)
