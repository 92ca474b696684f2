"""`executor=dask:local` (a LocalCluster of `workers=N` single-threaded processes started on demand,
dask_local.py) and `executor=dask:tcp://HOST:PORT` (a scheduler started with `dask scheduler` /
`dask worker`): the one place, with dask_local.py, that imports Distributed, and only when a check
is handed to it, so that parsing and probing the spec stay cheap.

Faults are results, never hangs: a worker that dies mid-lock gives an error verdict naming it (a
LocalCluster never retries; a scheduler that reruns it elsewhere is said in the result, from the
event `run_on_worker` logs when it starts); a check past limits.seconds ends there, on its worker,
which is free for the next, timed from its start (the lock code imported first), never from its
wait in a queue; one its worker's limit cannot end is cancelled GRACE later and its worker
restarted (a cancelled task Dask cannot stop would keep it busy); an unreachable scheduler is one
line; an interrupt cancels the cluster's work.
"""

import atexit
import contextlib
import functools
import heapq
import itertools
import os
import socket
import threading
import time
import uuid

from ..extras import require
from .check_worker import POOL_VARS, loaded_code, run_check
from .executors import Executor, ExecutorError, cost
from .timelimit import TimeLimit, deadline

CONNECT_S = 5


# --- the worker's side --------------------------------------------------------------------------

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


def run_on_worker(job):
    """What a Dask worker runs: `run_check` under the check's own limits.seconds, told the worker's
    address, after logging the start when the job asks (`log_start`: a scheduler that may rerun it
    elsewhere, so the driver can say it was rerun)."""
    worker = None
    try:
        from distributed import get_worker
        w = get_worker()
        worker = w.address
        if job.get("log_start", True):
            w.log_event(f"logos-lock-{job['key']}", {"worker": worker, "pid": os.getpid()})
    except (ImportError, ValueError):
        pass
    _malloc_as_usual()
    loaded_code()   # the lock code and torch imported before any limit runs: one cut mid-import
    #                 leaves torch half made for good
    try:
        with deadline(job["seconds"], _what(job, job["executor"])):
            return run_check(job, worker=worker)
    except TimeLimit as e:
        return {"error": str(e)}


# --- the driver's side --------------------------------------------------------------------------

class Dask(Executor):
    """Checks handed to a Dask scheduler from one queue that every lock of the run shares; the
    client (and for `dask:local` the cluster) is made on first use and shared by the run's threads."""
    FORMS = ("dask:local", "dask:tcp://HOST:PORT")

    @classmethod
    def parse(cls, spec, workers):
        if spec == "dask:local":
            return {"kind": "local", "address": None, "workers": workers or os.cpu_count() or 1, "spec": spec}
        if spec.startswith("dask:tcp://"):
            address = spec[len("dask:"):]
            host, _, port = address[len("tcp://"):].rpartition(":")
            if host and port.isdigit():
                return {"kind": "tcp", "address": address, "workers": None, "spec": spec}
        return None

    @classmethod
    def probe(cls, ex, timeout=CONNECT_S):
        """Distributed is installed (the [dask] extra) and, for a tcp scheduler, something can be
        reached at its address (a plain socket, no Dask)."""
        require("distributed", "dask", f"executor={ex['spec']}", ExecutorError)
        if ex["kind"] != "tcp":
            return
        host, _, port = ex["address"][len("tcp://"):].rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        except OSError as e:
            raise ExecutorError(f"executor={ex['spec']}: no Dask scheduler can be reached at "
                                f"{ex['address']} ({e.strerror or type(e).__name__}); start one with "
                                "`dask scheduler` and `dask worker`, or run with executor=inline") from None

    def __init__(self, ex):
        super().__init__(ex)
        self.kind = ex["spec"]
        self._client = self._cluster = None
        self._failed = None
        self._lock = threading.Lock()
        self._pending = set()
        self._largest = (None, 0.0)   # (the largest MEMORY advertised, when it was asked)
        self._warming = None
        self._cv = threading.Condition()       # the run's queue of checks, longest first
        self._queue, self._order, self._in_flight = [], itertools.count(), 0

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
        require("distributed", "dask", f"executor={self.kind}", ExecutorError)
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
        """Queue the checks with every other lock's of the run, then wait for them. The queue is
        the run's, longest first (`cost`): a local cluster gets one check per worker at a time,
        the longest waiting handed to the first worker that frees (the scheduler, handed them
        all, gave each worker its own line, and a short check that came first could keep a long
        one waiting behind another long one); a scheduler of its own (tcp) gets them all at once
        as Dask priorities, so an adaptive cluster sees what waits and scales."""
        mine = []
        for i, job in enumerate(jobs):
            job = {**job, "remote": True, "executor": self.kind, "log_start": True,
                   "seconds": seconds,
                   "key": f"{job['name']}-{job['record']['dtype']}-{uuid.uuid4().hex[:12]}"}
            need = job.pop("memory", None)
            mine.append(_Check(i, job, need, cost(job, need)))
        with self._cv:   # queued before the cluster is up: it starts on the run's longest
            for c in mine:
                heapq.heappush(self._queue, (-c.priority, next(self._order), c))
        client, out = None, [None] * len(jobs)
        try:
            client = self.client()
            self._pump(client)
            self._wait(client, mine, out, seconds)
        except BaseException:   # an interrupt, or no cluster: the cluster stops this work too
            self._drop(client, mine)
            raise
        return out

    def _pump(self, client):
        """Hand queued checks to the cluster while it has room."""
        largest = self._memory(client)
        room = self.ex["workers"] if self.ex["kind"] == "local" else float("inf")
        with self._cv:
            while self._queue and self._in_flight < room:
                c = heapq.heappop(self._queue)[2]
                if c.done:
                    continue
                resources = None
                if largest is not None and c.need:
                    if c.need > largest:
                        c.outcome, c.done = {"error": f"{_what(c.job, self.kind)}: it needs "
                                             f"{c.need / 2**30:.2f} GiB (the Dask resource MEMORY) and "
                                             f"the largest worker advertises {largest / 2**30:.2f} GiB"}, True
                        continue
                    resources = {"MEMORY": c.need}
                c.future = client.submit(run_on_worker, c.job, key=f"logos-lock-{c.job['key']}", pure=False,
                                         resources=resources, priority=c.priority)
                self._in_flight += 1
                self._pending.add(c.future)
                c.future.add_done_callback(functools.partial(self._landed, client, c))
            self._cv.notify_all()

    def _landed(self, client, c, future):
        """A check finished (or failed, or was cancelled): its worker takes the next."""
        with self._cv:
            self._in_flight -= 1
            self._pending.discard(future)
            c.done = True
            self._cv.notify_all()
        with contextlib.suppress(Exception):
            self._pump(client)

    def _drop(self, client, checks, restart=()):
        """Cancel `checks`, and restart the workers `restart` names (running one of them)."""
        with self._cv:
            futures = [c.future for c in checks if c.future is not None and not c.done]
            for c in checks:
                c.done = True
        if futures and client is not None:
            with contextlib.suppress(Exception):
                client.cancel(futures, force=True)
        if restart and client is not None:
            with contextlib.suppress(Exception):
                client.restart_workers(sorted(restart), timeout=60, raise_for_error=False)

    def _wait(self, client, mine, out, seconds):
        """Until every check is done. Each one's time counts from its start on a worker (the
        event `run_on_worker` logs, read once the scheduler shows the check at a worker: it may
        wait there behind another), never from a wait in a queue; one still running GRACE past
        its limit, which its worker's own limit did not end (a blocking call), is cancelled, and
        its worker restarted where it runs no other check (Dask cannot stop a running task, which
        would keep the worker from the next); every one left when the run is interrupted."""
        left = []
        while True:
            with self._cv:
                left = [c for c in mine if not c.done]
                if not left or not threading.main_thread().is_alive():
                    break
            running = _processing(client)
            for c in left:
                if c.since is None and c.future is not None and c.future.key in running:
                    c.since = _started(client, c.future.key)
            now = time.monotonic()
            late = [c for c in left if c.since is not None and now - c.since > seconds + GRACE]
            if late:
                keys = {c.future.key for c in late}
                busy = {w for k, w in running.items() if k not in keys and _started(client, k) is not None}
                restart = {running[k] for k in keys if k in running} - busy
                self._drop(client, late, restart=restart)
                for c in late:
                    again = "its worker restarted" if running.get(c.future.key) in restart else \
                        "its worker, running other work, goes on with it until the call returns"
                    out[c.index] = {"error": f"{_what(c.job, self.kind)} took over {seconds} s (limits.seconds) "
                                             f"and was cancelled ({again})"}
                continue
            with self._cv:
                if any(not c.done for c in mine):
                    self._cv.wait(timeout=1.0)
        if left:
            self._drop(client, left)
            for c in left:
                out[c.index] = {"error": f"{_what(c.job, self.kind)} was cancelled: the run was interrupted"}
        for c in mine:
            if out[c.index] is None:
                out[c.index] = c.outcome or self._outcome(client, c.future, c.job)

    def _outcome(self, client, f, job):
        try:
            got = f.result()
        except Exception as e:
            from distributed import KilledWorker
            if isinstance(e, KilledWorker):
                who = getattr(e.last_worker, "address", None) or str(e.last_worker)
                return {"error": f"{_what(job, self.kind)}: worker {who} died while running it, or while it "
                                 "was queued there (the check was not retried)", "infrastructure": True}
            return {"error": f"{_what(job, self.kind)} raised: {type(e).__name__}: {str(e)[:300]}",
                    "infrastructure": True}
        starts = []
        if self.ex["kind"] == "tcp":   # a LocalCluster never retries: nothing to ask
            with contextlib.suppress(Exception):
                starts = [m.get("worker") for _, m in client.get_events(f"logos-lock-{job['key']}")]
        if len(starts) > 1 and "execution" in got:   # (a check its limit ended has none)
            got["execution"]["attempts"] = starts
            got["execution"]["note"] = (f"rerun on {starts[-1]} after "
                                        f"{', '.join(starts[:-1])} was lost while running it")
        return got


class _Check:
    """One queued check: where its outcome goes, what it needs, its future once handed over."""

    def __init__(self, index, job, need, priority):
        self.index, self.job, self.need, self.priority = index, job, need, priority
        self.future = self.outcome = self.since = None   # (since: when its time began to count)
        self.done = False


def _what(job, kind):
    return f"the {job['record']['dtype']} lock check on {kind}"


GRACE = 10   # seconds past a check's limit the driver waits for its worker's own limit to end it


def _started(client, key):
    """When (time.monotonic()'s clock) a worker started the check of task `key`, from the event
    it logged under that name; None before it has (one assigned to a worker may wait there)."""
    try:
        events = client.get_events(key)
    except Exception:
        return None
    return time.monotonic() - max(0.0, time.time() - events[-1][0]) if events else None


def _processing(client):
    """{task key: the worker running it} as the scheduler sees it now ({} where it cannot say)."""
    try:
        return {k: w for w, keys in client.processing().items() for k in keys}
    except Exception:
        return {}
