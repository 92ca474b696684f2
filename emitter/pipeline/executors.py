"""Where a lock check runs: here (`executor=inline`, the default) or on a Dask cluster
(`executor=dask:local`, a LocalCluster of `workers=N` single-threaded processes started on demand;
`executor=dask:tcp://HOST:PORT`, a scheduler started with `dask scheduler` / `dask worker`).

doit still decides what runs; the lock action hands each check to the executor and waits. A worker
runs one pure function (`run_check`) and returns the verdict as JSON-able data with the VM's golden
outputs beside it; the driver alone writes result files, golden/, the history and the report.

Every check runs with an explicit thread count (torch's, and the BLAS's through threadpoolctl),
recorded in its result under `execution`. One thread is the default: measured on this project's
2-core machine, a smollm2 float32 lock takes 2.7-3.2 s at 1 thread and 6-12 s at torch's default 2
(its own threads fight the VM's BLAS and each other).

Faults are results, never hangs: a worker that dies mid-lock gives an error verdict naming it (a
LocalCluster never retries; a scheduler that reruns it elsewhere is said in the result); a check
past limits.seconds is cancelled; an unreachable scheduler is one line; an interrupt cancels the
cluster's work.
"""

import atexit
import contextlib
import os
import socket
import tempfile
import threading
import time
import uuid

from ..verify.environment import THREAD_VARS

DEFAULT_THREADS = 1
# the *_NUM_THREADS variables only size thread pools, which each check sets explicitly (below)
POOL_VARS = tuple(v for v in THREAD_VARS if v.endswith("_NUM_THREADS"))
CONNECT_S = 5


class ExecutorError(Exception):
    """The executor cannot run anything (a bad spec, a scheduler nobody answers at): one line."""


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
    if spec == "inline":
        return {"kind": "inline", "address": None, "workers": None, "spec": spec}
    if spec == "dask:local":
        return {"kind": "local", "address": None, "workers": n or os.cpu_count() or 1, "spec": spec}
    if spec.startswith("dask:tcp://"):
        address = spec[len("dask:"):]
        host, _, port = address[len("tcp://"):].rpartition(":")
        if host and port.isdigit():
            return {"kind": "tcp", "address": address, "workers": None, "spec": spec}
    raise ExecutorError(f"executor={spec}: must be inline, dask:local or dask:tcp://HOST:PORT")


def probe(ex, timeout=CONNECT_S):
    """For a tcp scheduler: can anything be reached at its address (a plain socket, no Dask)?"""
    if ex["kind"] != "tcp":
        return
    host, _, port = ex["address"][len("tcp://"):].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ExecutorError(f"executor={ex['spec']}: no Dask scheduler can be reached at "
                            f"{ex['address']} ({e.strerror or type(e).__name__}); start one with "
                            "`dask scheduler` and `dask worker`, or run with executor=inline") from None


@contextlib.contextmanager
def thread_limits(n):
    """torch's and the BLAS's thread pools at `n` for the block (restored after); what was set."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:   # the BLAS keeps what its environment variables gave it at start
        blas, limiter = "environment", contextlib.nullcontext()
    else:
        blas, limiter = "threadpoolctl", threadpool_limits(n)
    try:
        with limiter:
            yield {"threads": n, "torch_threads": torch.get_num_threads(), "blas_limit": blas}
    finally:
        torch.set_num_threads(before)


def memory_need(manifest_path):
    """Bytes a lock of this bundle takes, from its manifest's tensors: the VM holds them in float64
    and the module and the comparisons about as much again, plus the interpreter and torch."""
    from ..files import read_json
    m = read_json(manifest_path) or {}
    total = 0
    for t in m.get("tensors") or []:
        n = 1
        for d in t.get("shape") or []:
            n *= int(d)
        total += n
    return 2 * 8 * total + (512 << 20)


# how much longer a check of each dtype takes than a float32 one of the same program (measured on
# smollm2 and gemma3: the float64 VM-side copies, the bf16 gate's floors)
DTYPE_COST = {"float32": 1.0, "float64": 1.5, "bfloat16": 3.0}


def cost(job, need=None):
    """A check's expected cost, as a Dask priority: the longest checks start first, so a zoo's
    last check is a short one and no worker idles while another finishes a long one."""
    need = need or job.get("memory") or 0
    k = job["kwargs"]
    return int(need * (k.get("steps") or 1) * DTYPE_COST.get(k.get("dtype"), 1.0) / (1 << 20))


# --- the worker's side --------------------------------------------------------------------------

_CAPTURE = threading.local()
_PATCH = threading.Lock()


def _capture_golden():
    """In a worker, the lock's golden/ files are returned to the driver instead of written: the
    Golden class is wrapped (once per process) to write into a temporary folder and read it back."""
    from ..verify import golden
    with _PATCH:
        if getattr(golden.Golden, "_to_driver", False):
            return
        base = golden.Golden

        class ToDriver(base):
            _to_driver = True

            def write(self):
                box = getattr(_CAPTURE, "box", None)
                if box is None:
                    return super().write()
                real = self.directory
                with tempfile.TemporaryDirectory(prefix="logos-golden.") as tmp:
                    self.directory = tmp
                    try:
                        super().write()
                    finally:
                        self.directory = real
                    for f in sorted(os.listdir(tmp)):
                        with open(os.path.join(tmp, f), "rb") as fh:
                            box[f] = fh.read()
        golden.Golden = ToDriver


_MALLOC = []


def _malloc_as_usual():
    """A `dask worker` nanny starts workers with MALLOC_TRIM_THRESHOLD_ set, which turns off glibc's
    adaptive thresholds: large arrays then go back to the system on every free (a smollm2 lock
    7.3 s instead of 3.3 s). Raise the thresholds again, once per process (glibc only)."""
    if _MALLOC or "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        return
    _MALLOC.append(True)
    with contextlib.suppress(Exception):
        import ctypes
        libc = ctypes.CDLL(None)
        libc.mallopt(-1, 64 << 20)   # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)   # M_MMAP_THRESHOLD (its largest)


def run_check(job):
    """One lock check, on whichever process runs it: {"result", "golden", "execution"}.

    `job`: {"root", "bundle", "source", "weights", "kwargs" (lock_bundle's), "golden" (tolerances,
    or None), "threads", "thread_env" (the driver's *_NUM_THREADS), "key"}. Paths are relative to
    `root`, the driver's folder (a worker elsewhere sees it through a shared filesystem)."""
    from ..verify.lock import lock_bundle
    remote = job.get("remote", False)
    worker = None
    if remote:
        try:
            from distributed import get_worker
            w = get_worker()
            worker = w.address
            if job.get("log_start", True):   # for a scheduler that may rerun it elsewhere
                w.log_event(f"logos-lock-{job['key']}", {"worker": worker, "pid": os.getpid()})
        except (ImportError, ValueError):
            pass
        _capture_golden()
        _malloc_as_usual()
    own_env = {k: os.environ[k] for k in POOL_VARS if k in os.environ}
    if remote:
        # pools are sized below through the libraries, so these variables no longer act; they are
        # set as on the driver so the environment digest compares like with like (the worker's
        # own values are kept in the result)
        for k in POOL_VARS:
            os.environ.pop(k, None)
        os.environ.update(job.get("thread_env") or {})
    root = job.get("root") or os.getcwd()
    here = os.path.realpath(root) == os.path.realpath(os.getcwd())

    def path(p):
        return p if p is None or here or os.path.isabs(p) else os.path.join(root, p)
    box = {} if job.get("golden") is not None else None
    _CAPTURE.box = box if remote else None
    start, cpu, began = time.perf_counter(), time.process_time(), time.time()
    try:
        with thread_limits(job["threads"]) as threads:
            r = lock_bundle(path(job["bundle"]), path(job["source"]), path(job["weights"]),
                            golden=job.get("golden"), **job["kwargs"])
    finally:
        _CAPTURE.box = None
    r.update(program_path=str(job["source"]), bundle=str(job["bundle"]),
             weights=None if job["weights"] is None else str(job["weights"]))
    execution = {"executor": job.get("executor", "inline"), "worker": worker, "pid": os.getpid(),
                 **threads, "seconds": round(time.perf_counter() - start, 3),
                 "cpu_seconds": round(time.process_time() - cpu, 3), "started": round(began, 3)}
    if remote:
        execution["worker_thread_env"] = own_env
    return {"result": r, "golden": box or None, "execution": execution}


# --- the driver's side --------------------------------------------------------------------------

class Inline:
    """Each check in this process, one after another, each under limits.seconds."""
    kind = "inline"

    def run(self, jobs, seconds):
        from .guards import TimeLimit, deadline
        out = []
        for job in jobs:
            try:
                with deadline(seconds, f"the {job['kwargs']['dtype']} lock check"):
                    out.append(run_check(job))
            except TimeLimit as e:
                out.append({"error": str(e)})
            except Exception as e:   # a lock that crashes is this program's error, not the run's
                out.append({"error": f"the lock check raised {type(e).__name__}: {e}"})
        return out


class Dask:
    """Checks submitted to a Dask scheduler, all of a program's at once; the client (and for
    `dask:local` the cluster) is made on first use and shared by the run's threads."""

    def __init__(self, ex):
        self.ex, self.kind = ex, ex["spec"]
        self._client = self._cluster = None
        self._failed = None
        self._lock = threading.Lock()
        self._pending = set()
        self._largest = (None, 0.0)   # (the largest MEMORY advertised, when it was asked)
        self._warming = None

    def client(self):
        with self._lock:
            if self._failed:
                raise ExecutorError(self._failed)
            if self._client is None:
                try:
                    self._client = self._connect()
                except ExecutorError as e:
                    self._failed = str(e)
                    raise
                atexit.register(self.close)
            return self._client

    def warm(self):
        """Start the cluster (or connect to the scheduler) in the background now, while doit
        loads and checks its tasks, rather than when the first lock asks for it; a failure is
        kept and said by that lock, as without it."""
        with self._lock:
            if self._client is not None or self._failed or self._warming:
                return
            self._warming = threading.Thread(target=self._warm, name="logos-dask-start", daemon=True)
            self._warming.start()
        atexit.register(self.close)

    def _warm(self):
        with contextlib.suppress(Exception):
            self.client()

    def _connect(self):
        if self.ex["kind"] == "local":
            from .dask_local import start_cluster
            self._cluster = start_cluster(self.ex["workers"], POOL_VARS)
        from distributed import Client
        if self._cluster is not None:
            return Client(self._cluster, set_as_default=False)
        try:
            return Client(self.ex["address"], timeout=CONNECT_S, set_as_default=False)
        except (OSError, TimeoutError) as e:
            raise ExecutorError(f"executor={self.kind}: the Dask scheduler at {self.ex['address']} "
                                f"did not answer ({str(e).splitlines()[0][:200]})") from None

    def close(self):
        warming = self._warming
        if warming is not None and warming is not threading.current_thread():
            warming.join()   # a cluster half started is closed once it is up, not left behind
        with self._lock:
            client, cluster, self._client, self._cluster = self._client, self._cluster, None, None
        for thing in (client, cluster):
            if thing is not None:
                with contextlib.suppress(Exception):
                    if thing is client and self._pending:
                        client.cancel(list(self._pending), force=True)
                    thing.close()
        if cluster is not None:
            from .dask_local import stop_forkserver
            stop_forkserver()

    def _memory(self, client):
        """The largest MEMORY any worker advertises, or None when none does (asked again after
        a few seconds: workers come and go)."""
        largest, at = self._largest
        if time.monotonic() - at < 5:
            return largest
        info = client.scheduler_info(n_workers=-1).get("workers", {})
        have = [w.get("resources", {}).get("MEMORY") for w in info.values()]
        have = [m for m in have if m is not None]
        self._largest = (max(have) if have else None, time.monotonic())
        return self._largest[0]

    def run(self, jobs, seconds):
        client = self.client()
        largest = self._memory(client)
        futures, out = {}, [None] * len(jobs)
        # the longest first, also among those a free worker takes at once
        for i, job in sorted(enumerate(jobs), key=lambda ij: -cost(ij[1])):
            job = {**job, "remote": True, "executor": self.kind, "log_start": self.ex["kind"] == "tcp",
                   "key": f"{job['name']}-{job['kwargs']['dtype']}-{uuid.uuid4().hex[:12]}"}
            need = job.pop("memory", None)
            resources = None
            if largest is not None and need:
                if need > largest:
                    out[i] = {"error": f"{_what(job, self.kind)}: it needs {need / 2**30:.2f} GiB "
                                       "(the Dask resource MEMORY) and "
                                       f"the largest worker advertises {largest / 2**30:.2f} GiB"}
                    continue
                resources = {"MEMORY": need}
            f = client.submit(run_check, job, key=f"logos-lock-{job['key']}", pure=False,
                              resources=resources, priority=cost(job, need))
            futures[f] = (i, job)
        self._pending.update(futures)
        try:
            self._wait(client, futures, out, seconds)
        except BaseException:   # an interrupt: the cluster stops this work too
            with contextlib.suppress(Exception):
                client.cancel(list(futures), force=True)
            raise
        finally:
            self._pending.difference_update(futures)
        return out

    def _wait(self, client, futures, out, seconds):
        from distributed import wait
        end = time.monotonic() + seconds
        left = dict(futures)
        while left:
            done = ()
            if _until(end) > 0:
                try:
                    with client.as_current():
                        done = wait(list(left), timeout=min(1.0, _until(end)),
                                    return_when="FIRST_COMPLETED").done
                except TimeoutError:
                    pass
            for f in done:
                i, job = left.pop(f)
                out[i] = self._outcome(client, f, job)
            if left and (_until(end) <= 0 or not threading.main_thread().is_alive()):
                why = (f"took over {seconds} s (limits.seconds) and was cancelled"
                       if _until(end) <= 0 else "was cancelled: the run was interrupted")
                client.cancel(list(left), force=True)
                for f, (i, job) in left.items():
                    out[i] = {"error": f"{_what(job, self.kind)} {why}"}
                return

    def _outcome(self, client, f, job):
        try:
            got = f.result()
        except Exception as e:
            from distributed import KilledWorker
            if isinstance(e, KilledWorker):
                who = getattr(e.last_worker, "address", None) or str(e.last_worker)
                return {"error": f"{_what(job, self.kind)}: worker {who} died while running it "
                                 "(the check was not retried)", "infrastructure": True}
            return {"error": f"{_what(job, self.kind)} raised: {type(e).__name__}: {str(e)[:300]}",
                    "infrastructure": True}
        starts = []
        if self.ex["kind"] == "tcp":   # a LocalCluster never retries: nothing to ask
            with contextlib.suppress(Exception):
                starts = [m.get("worker") for _, m in client.get_events(f"logos-lock-{job['key']}")]
        if len(starts) > 1:
            got["execution"]["attempts"] = starts
            got["execution"]["note"] = (f"rerun on {starts[-1]} after "
                                        f"{', '.join(starts[:-1])} was lost while running it")
        return got


def _what(job, kind):
    return f"the {job['kwargs']['dtype']} lock check on {kind}"


def _until(end):
    return end - time.monotonic()


_EXECUTORS = {}
_MAKE = threading.Lock()


def executor(spec, workers=None):
    """The run's executor for this spec (one per process: the threads of `doit -P thread` share
    the client and cluster)."""
    ex = parse(spec, workers)
    if ex["kind"] == "inline":
        return Inline()
    with _MAKE:
        key = (ex["spec"], ex["workers"])
        if key not in _EXECUTORS:
            _EXECUTORS[key] = Dask(ex)
        return _EXECUTORS[key]
