"""A lock check on whichever process runs it (`run_check`): this one (executor=inline) or an
executor's worker, whose own wrapper (dask_executor.run_on_worker) passes its address in, so this
module stays free of any executor's library (it is lock code: every lock's key hashes it).
Either way it writes nothing: the verdict and the golden/ files (the lock hands them back as data)
go back to the driver, which writes them.
Every check runs under an explicit thread count (torch's, and the BLAS's through threadpoolctl),
recorded in its result."""

import os
import socket
import time

from .. import fingerprint
from ..verify.environment import THREAD_VARS
from ..verify.memory import memory_bytes
from ..verify.threads import thread_limits
from .digests import digest

# the *_NUM_THREADS variables only size thread pools, which each check sets explicitly
POOL_VARS = tuple(v for v in THREAD_VARS if v.endswith("_NUM_THREADS"))


def loaded_code():
    """The digest of the lock code this process loaded (`worker_code`: all of it, at its first
    import, before any check of this process ran)."""
    from .worker_code import LOADED
    return LOADED


def loaded_vm():
    """The digest of the VM's code this process loaded, taken with `loaded_code`'s."""
    from .worker_code import LOADED_VM
    return LOADED_VM


def trace_key(record):
    """The key of the VM's trace a check reads (emitter.verify.trace), of the parts of its key's
    record the VM reads: the program's text, the weights' files (not the folder's others, never
    read), the steps, the VM's code, the environment and the thread count (the BLAS's sums)."""
    weights = {k: v for k, v in (record["weights"] or {}).items() if k != "others"} or None
    return digest({"schema": "logos.vm-trace-key", "version": 1, "source": record["source"],
                   "weights": weights, "steps": record["steps"], "code": loaded_vm(),
                   "environment": record["environment"], "threads": record["threads"]})


def lock_arguments(record, traces=None, trace_bytes=0, alone=False):
    """lock_bundle's arguments for a check, from its key's record alone: this is lock code, so how
    a record becomes a run is in every check's key. `traces`: the store's folder of VM traces, for
    a keyed record (None: the lock computes its VM); `trace_bytes`: the weights a VM reads for its
    trace to be worth a file (limits.trace_bytes); `alone`: no other check of the program reads it.
    A record's tensor limit of None is the default: half the memory of the machine it runs on."""
    config = record["config"]
    trace = None
    if traces is not None:
        key = trace_key(record)
        trace = {"path": os.path.join(traces, key[:2], f"{key}.trace"), "key": key, "source": record["source"],
                 "environment": record["environment"], "min_bytes": trace_bytes, "alone": alone}
    return dict(dtype=record["dtype"], steps=record["steps"], atol=record["tolerance"]["abs"],
                rtol=record["tolerance"]["rel"], allow_nonfinite=tuple(config["allow_nonfinite"]),
                max_tensor_bytes=_tensor_limit(config["limits"]["tensor_bytes"]),
                bf16_bounds=config["bf16"], precision=record["precision"], trace=trace)


def _tensor_limit(limit):
    """The bytes a check's tensors may take: its config's limit (None: half the memory of the
    machine it runs on), never past that machine's memory, whatever a config raised it to (the
    VM and the module would not fit: an allocation that fails, or the kernel's OOM killer)."""
    machine = memory_bytes()
    return machine // 2 if limit is None else min(limit, machine)


def run_check(job, worker=None):
    """One lock check, on whichever process runs it: {"result", "golden" ({name: bytes} of the
    bundle's golden/ when the job asked for them and the check ran through, else None),
    "execution"}.

    `job`: {"root", "bundle", "source", "weights", "record" (the check's key's record, or its
    config's part where nothing is keyed, with "threads": what it runs with, `lock_arguments`),
    "traces" and "trace_bytes" and "alone" (its VM's trace), "weights_shas" (what the weights
    files must hold), "golden" (tolerances, or None), "thread_env" (the driver's
    *_NUM_THREADS), "stamps" (the driver's host and its hash record of the weights files),
    "code" (the lock code's digest the key names), "remote" (run by a worker, not the driver)}.
    Paths are relative to `root`, the driver's folder (a worker elsewhere sees it through a shared
    filesystem). `worker`: the worker's address, as its executor knows it."""
    remote = job.get("remote", False)
    code = loaded_code()   # all of the lock code, before this check imports any of it
    from ..verify.lock import lock_bundle
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
    stamps = job.get("stamps") or {}
    if remote and job["weights"] is not None and stamps.get("host") == socket.gethostname():
        # the driver's hashes, each checked by a stat here (on its host: another's may be stale)
        fingerprint.known({os.path.join(path(job["weights"]), f): e for f, e in stamps["files"].items()})
    golden = {} if job.get("golden") is not None else None
    traces = job.get("traces")   # the VM's trace file: only by the code its key names, and here
    kwargs = lock_arguments(job["record"], path(traces) if traces and job.get("code") == code else None,
                            job.get("trace_bytes", 0), job.get("alone", False))
    start, cpu, began = time.perf_counter(), time.process_time(), time.time()
    with thread_limits(job["record"]["threads"]) as threads:
        r = lock_bundle(path(job["bundle"]), path(job["source"]), path(job["weights"]),
                        golden=job.get("golden"), golden_files=golden, weights_shas=job.get("weights_shas"),
                        **kwargs)
    r.update(program_path=str(job["source"]), bundle=str(job["bundle"]),
             weights=None if job["weights"] is None else str(job["weights"]))
    execution = {"executor": job.get("executor", "inline"), "worker": worker, "pid": os.getpid(),
                 **threads, "seconds": round(time.perf_counter() - start, 3),
                 "cpu_seconds": round(time.process_time() - cpu, 3), "started": round(began, 3),
                 "code": code}
    if remote:
        execution["worker_thread_env"] = own_env
    return {"result": r, "golden": golden or None, "execution": execution}
