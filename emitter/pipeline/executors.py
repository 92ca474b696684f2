"""Where a lock check runs, behind one interface (`Executor`): `executor=SPEC` names one by its
scheme, the text before the first ":", and REGISTRY maps the scheme to the class that parses the
rest. `inline` (the default: here, one check after another) lives here; `dask:local` and
`dask:tcp://HOST:PORT` in dask_executor.py, imported only when named, so that a run that never asks
for Dask never loads it and nothing but the dask_* modules imports Distributed. A new executor is
one module and one REGISTRY line.

doit still decides what runs; the lock action hands each check to the executor and waits. Whatever
runs a check runs one pure function (`check_worker.run_check`) and returns the verdict as JSON-able
data with the VM's golden outputs beside it; the driver alone writes result files, golden/, the
history and the report.

Every check runs with an explicit thread count (torch's, and the BLAS's through threadpoolctl),
recorded in its result under `execution`. One thread is the default: measured on this project's
2-core machine, a smollm2 float32 lock takes 2.7-3.2 s at 1 thread and 6-12 s at torch's default 2
(its own threads fight the VM's BLAS and each other).

Faults are results, never hangs: a check past limits.seconds is an error verdict, and so is one
that raises; an executor that cannot run anything (a bad spec, a scheduler nobody answers at) is one
line, an ExecutorError.
"""

import importlib
import threading

from .check_worker import POOL_VARS, run_check  # noqa: F401 (POOL_VARS: what the driver hands on)

# scheme -> "module:Class", the module relative to this package (or absolute), imported when named
REGISTRY = {"inline": ".executors:Inline",
            "dask": ".dask_executor:Dask"}


class ExecutorError(Exception):
    """The executor cannot run anything (a bad spec, a scheduler nobody answers at): one line."""


class Executor:
    """What the lock's driver sees of an executor. Made from its parsed spec (`parse`'s dict), it
    runs jobs (`run_check`'s) and gives one outcome per job, in order: run_check's result, or
    {"error": one line, "infrastructure": True when the executor, not the bundle, failed it}."""
    FORMS = ()   # the specs it takes, as the one-line refusal of any other lists them

    def __init__(self, ex=None):
        self.ex = ex

    @classmethod
    def parse(cls, spec, workers):
        """{"kind", "address", "workers", "spec"} for a spec this class takes, else None; `workers`
        is the checked workers=N (an int) or None."""
        raise NotImplementedError

    @classmethod
    def probe(cls, ex):
        """Raise an ExecutorError now if nothing can run (said before doit starts, not per lock)."""

    def run(self, jobs, seconds):
        raise NotImplementedError

    def warm(self):
        """Get ready in the background while doit loads its tasks (nothing to do for most)."""

    def close(self):
        """Let go of what it holds (the run is over)."""


class Inline(Executor):
    """Each check on this machine, one after another, each under limits.seconds, in a forked
    child of this process (`isolated`): a bundle that ends or stalls its process costs its own
    check alone."""
    kind = "inline"
    FORMS = ("inline",)

    def __init__(self, ex=None):
        super().__init__(ex)
        self.child = None

    @classmethod
    def parse(cls, spec, workers):
        return {"kind": "inline", "address": None, "workers": None, "spec": spec} if spec == "inline" else None

    def run(self, jobs, seconds):
        from .check_worker import loaded_code
        from .isolated import Child
        try:   # the lock code and torch imported before any limit runs: one cut mid-import
            loaded_code()   # would leave torch half made for every later check of this process
        except Exception as e:
            return [{"error": f"the lock check raised {type(e).__name__}: {e}"}] * len(jobs)
        self.child = self.child or Child(_within)
        out = []
        for job in jobs:
            o = self.child.run(job, seconds)
            out.append(o if o is not None else _within(job, seconds))
        return out

    def close(self):
        if self.child is not None:
            self.child.close()


def _within(job, seconds):
    """One check under its wall-time limit: run_check's outcome, or {"error"} naming what stopped it."""
    from .timelimit import TimeLimit, deadline
    try:
        with deadline(seconds, f"the {job['record']['dtype']} lock check"):
            return run_check(job)
    except TimeLimit as e:
        return {"error": str(e)}
    except Exception as e:   # a lock that crashes is this program's error, not the run's
        return {"error": f"the lock check raised {type(e).__name__}: {e}"}


def executor_class(scheme):
    """The class REGISTRY names for `scheme`, or None."""
    where = REGISTRY.get(scheme)
    if where is None:
        return None
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module, __package__), name)


def _forms():
    forms = [f for scheme in REGISTRY for f in executor_class(scheme).FORMS]
    return ", ".join(forms[:-1]) + " or " + forms[-1] if len(forms) > 1 else "".join(forms)


def _scheme(spec):
    return spec.partition(":")[0]


def parse(spec, workers=None):
    """`inline` | `dask:local` | `dask:tcp://HOST:PORT` (and `workers=N` for a local cluster) as
    {"kind", "address", "workers", "spec"}; an ExecutorError that says what is accepted."""
    spec = (spec or "inline").strip()
    n = None
    if workers not in (None, ""):
        try:
            n = int(workers)
        except (TypeError, ValueError):
            n = 0
        if n < 1:
            raise ExecutorError(f"workers={workers}: must be a whole number of at least 1")
    cls = executor_class(_scheme(spec))
    ex = cls.parse(spec, n) if cls is not None else None
    if ex is None:
        raise ExecutorError(f"executor={spec}: must be {_forms()}")
    return ex


def probe(ex):
    """Whether the parsed executor can run anything at all (for a tcp scheduler: can anything be
    reached at its address); an ExecutorError of one line if not."""
    executor_class(_scheme(ex["spec"])).probe(ex)


def memory_need(manifest_path):
    """Bytes a lock of this bundle takes, from its manifest's tensors in float64: its weights about
    once (mapped from their files, a float64 copy where the file is narrower: smollm2's float64
    lock peaked at 1.14 times them), every other tensor (an input, a state, a computed value)
    about eight times (the VM's, the module's, the passes' arguments and copies, the varied
    inputs: 8.2 times at float64, 5.8 at float32, for a program of one 134 MB input and its
    norm), with a margin, plus the interpreter and torch (227 MB for a tiny program)."""
    from ..files import read_json
    m = read_json(manifest_path) or {}
    weights = other = 0
    for t in m.get("tensors") or []:
        n = 1
        for d in t.get("shape") or []:
            n *= int(d)
        if t.get("role") == "weight":
            weights += n
        else:
            other += n
    return int(1.5 * 8 * weights) + 9 * 8 * other + (512 << 20)


# how much longer a check of each dtype takes than a float32 one of the same program (measured on
# smollm2 and gemma3 on 2026-12-03, one check alone at 1 thread, torch's import left out: float64
# 1.35x and 1.75x, the module's float64 copy of the weights; bfloat16 1.43x and 1.45x, the gate's
# floors, since the bf16 module's matmul widens its weight a block at a time)
DTYPE_COST = {"float32": 1.0, "float64": 1.55, "bfloat16": 1.45}


def cost(job, need=None):
    """A check's expected cost, for an executor that orders its checks (Dask's priority): the
    longest start first, so a zoo's last check is a short one and no worker idles while another
    finishes a long one."""
    need = need or job.get("memory") or 0
    r = job["record"]
    return int(need * r["steps"] * DTYPE_COST.get(r["dtype"], 1.0) / (1 << 10))


_EXECUTORS = {}
_MAKE = threading.Lock()


def executor(spec, workers=None):
    """The run's executor for this spec, one per process: the threads of `doit -P thread` share
    it (a Dask client and cluster, and the queue of the run's checks)."""
    ex = parse(spec, workers)
    with _MAKE:
        key = (ex["spec"], ex["workers"])
        if key not in _EXECUTORS:
            _EXECUTORS[key] = executor_class(_scheme(ex["spec"]))(ex)
        return _EXECUTORS[key]
