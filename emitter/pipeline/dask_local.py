"""`executor=dask:local`'s cluster (dask_executor.py starts it on first use): a LocalCluster of
single-threaded worker processes, started warm.

Its workers are forked from one forkserver process that has imported torch, the lock code and
Distributed already (multiprocessing's forkserver, preloaded), so a worker's first check pays no
import and the imports are paid once, not once per worker; they run without Dask's statistical
profiler (a stack sample of the running lock every 10 ms) or its 20 ms event-loop tick, without
Dask's MALLOC_TRIM_THRESHOLD_ (a lock's large arrays went back to the system on every free: a
smollm2 lock 2.2x slower), and take one check at a time, so the longest waiting check goes to the
next free worker.
"""

import contextlib
import os
import signal

LOCAL_CONFIG = {"distributed.worker.profile.enabled": False,
                "distributed.worker.multiprocessing-method": "forkserver",
                # a worker holds no check beyond the one it runs: the next free one takes the
                # longest waiting (at Dask's default 1.1, each took a second one when it started)
                "distributed.scheduler.worker-saturation": 1.0,
                # the event loop's 20 ms latency tick takes the GIL from the running check 50 times
                # a second, a wait for a free core each time on a machine the workers fill: 2 s
                # (the real models' 9 checks 4-5% faster, 5 of 6 alternated runs)
                "distributed.admin.tick.interval": "2s"}
# the workers' scratch space (Dask's lock files): in build/tmp (inside the repository, swept
# after a run that did not end), never in the system's temporary folder
SCRATCH = os.path.join("build", "tmp", "dask")
_PKG = __name__.rsplit(".", 2)[0]   # the emitter package, as this process imports it
# in this order: worker_code (all of the lock code, its digest taken) before the modules that
# import parts of it; dask_executor holds `run_on_worker`, the function a worker runs
WARM_IMPORTS = ("distributed", "numpy", "torch", "threadpoolctl", f"{_PKG}.pipeline.worker_code",
                f"{_PKG}.pipeline.check_worker", f"{_PKG}.pipeline.dask_executor")


def start_forkserver():
    """Start the forkserver now, so it imports what a worker needs (WARM_IMPORTS; a module it
    cannot import is left out by multiprocessing itself) while this process imports Distributed
    and starts the scheduler. Distributed sets its own, shorter list once per process unless told
    it is set."""
    import multiprocessing
    from multiprocessing import forkserver
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(WARM_IMPORTS))
    forkserver.ensure_running()


def stop_forkserver():
    """Stopped with the cluster: left alone, the forkserver outlives this process by a second or
    so (an interpreter with torch loaded shutting down), holding its stdout and stderr, which a
    caller that reads them to the end (CI, a benchmark) waits for. It holds nothing to save: killed."""
    with contextlib.suppress(Exception):
        from multiprocessing import forkserver
        server = forkserver._forkserver
        if server._forkserver_pid:
            with contextlib.suppress(OSError):
                os.kill(server._forkserver_pid, signal.SIGKILL)
        server._stop()


def start_cluster(workers, pool_vars):
    """A LocalCluster of `workers` single-threaded processes on 127.0.0.1; its workers get the
    driver's `pool_vars` (the *_NUM_THREADS) and nothing else of Dask's pre-spawn environment."""
    start_forkserver()
    import dask
    from distributed import LocalCluster, utils
    utils._forkserver_preload_set = True
    env = {k: os.environ[k] for k in pool_vars if k in os.environ}
    with dask.config.set({"distributed.scheduler.allowed-failures": 0,
                          "distributed.nanny.pre-spawn-environ": env,
                          "temporary-directory": os.path.abspath(SCRATCH), **LOCAL_CONFIG}):
        return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                            dashboard_address=None, host="127.0.0.1", silence_logs=50)
