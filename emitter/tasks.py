"""The zoo's doit tasks, for any repository of programs: `from emitter.tasks import *` in a dodo.py
(beside tasks of its own), or `logos doit` in a folder with programs/ (the same creators, loaded
through doit's module loader).

The current folder is the zoo: `programs/NAME.logos` with an optional `programs/NAME.yaml` (zoo
defaults in `programs/defaults.yaml`), weights in `weights/NAME`, everything made under `build/`.
Importing this module defines the creators and DOIT_CONFIG (from doit's command-line variables,
through doit's `get_var`) and does nothing else. The run begins when doit opens its dependency DB
(its file checker, `pipeline.run.ZooChecker`, is made then): build/'s lock, what a killed run left
swept, a damaged DB set aside, the report of the last run set aside until this one ends. The first
creator doit calls reads the zoo into records (`pipeline.checks`) and the run's variables
(`executor=inline|dask:local|dask:tcp://HOST:PORT`, `workers=N`, `threads=N`, `cache=URL`;
README, "Beyond one machine").

Each task is current when the key it recorded is the key of its inputs now (`pipeline.keys`): that
is every task's `uptodate`, and on a plain run the creators hand doit only what is not current
(`pipeline.handing`), so a no-op is a stat per input file. A dodo's own tasks run beside them on a
plain `doit`; one that names the zoo's weights, emit or lock tasks as a dependency, or writes a
file they read, has every task handed (doit then orders them).
"""

from .pipeline.progress import ProgressReporter
from .pipeline.run import ZooChecker

__all__ = ["DOIT_CONFIG", "task_weights", "task_emit", "task_lock", "task_report",
           "task_cachelookup", "task_cache"]

BUILD = "build"
DEFAULT_TASKS = ["report", "cache"]



def _config():
    """doit's settings for the zoo (doit has parsed its command-line variables before it imports
    a dodo, and `logos doit` imports this module after): with a Dask executor each lock waits on
    the cluster, so doit's threads keep many in flight and every program's checks wait in one
    queue, the longest first (executors.cost)."""
    from doit import get_var
    config = {
        "dep_file": f"{BUILD}/.doit.db",
        "backend": "sqlite3",
        "check_file_uptodate": ZooChecker,   # the one fingerprint rule; it begins the run
        "continue": True,          # one program's failure never stops the others
        "reporter": ProgressReporter,
        # the report covers every check; `cache` publishes with cache=URL (else it does nothing);
        # a dodo's own tasks join this list when the run starts (`pipeline.run.Run`), so a plain
        # `doit` runs them too, with no marker (derived weights a cache makes needless do not run)
        "default_tasks": DEFAULT_TASKS,
    }
    executor, workers = get_var("executor") or "inline", get_var("workers")
    if executor != "inline":
        n = int(workers) if str(workers).isdigit() and int(workers) > 0 else 4
        config.update(par_type="thread", num_process=4 * n)
    return config


DOIT_CONFIG = _config()
OWN_CONFIG = ("dep_file", "backend", "check_file_uptodate", "reporter")


def run():
    """This process's run (set up by the first creator doit calls)."""
    from .pipeline.run import start
    return start(BUILD, DOIT_CONFIG, OWN_CONFIG, {globals()[n] for n in __all__ if n.startswith("task_")},
                 DEFAULT_TASKS)


def task_weights():
    """Derived weights: a program's `derive:` checkpoint through its importer."""
    yield from run().weights_tasks()


def task_emit():
    """Bundles: model.py, manifest.json, compile.py per program (and its emit status)."""
    yield from run().emit_tasks()


def task_lock():
    """Lock checks: each program's bundle against the VM, one RESULT.json per dtype."""
    yield from run().lock_tasks()


def task_report():
    """build/report.json, junit.xml, summary.md, report.html; fails the run when a check did not pass."""
    return run().report_task()


def task_cachelookup():
    """With cache=URL: whether the cache holds every verdict of a derived program.

    Where it does, its lock needs no import; else its lock waits for the weights."""
    yield from run().cachelookup_tasks()


def task_cache():
    """With cache=URL: publish every current verdict the shared cache lacks."""
    return run().cache_task()

