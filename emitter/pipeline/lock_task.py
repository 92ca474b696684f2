"""The lock task's action: each check of one program under the key of its inputs as they are now.

A check whose key already holds its pass here is kept (its result, or build/store/'s entry for that
key: inputs that came back to an earlier state); one the shared cache holds (`cache=URL`) is taken
from it; the rest go to the executor (inline, or a Dask cluster) as jobs. The driver alone
writes: each result (with its key and the record it was computed from), golden/, the lock status
(each check's key, verdict and result's sha256, and golden/'s files: what `keys.lock_current`
reads) and the history.
A result is recorded under its key only when it is about that key: the code that ran is the code
the key names (a worker reports what it loaded), and the program, bundle and weights files it read
are those the key hashed; else it is recorded with no key, so the next run checks it again.
A cluster that lost a check (a dead worker, no scheduler) records an error, as a check that fails
or errs does: the report fails the run (exit 1); in a run without the report, the lock task fails
(`ChecksLost`, `ChecksFailed`: exit 1). An error is never current: the next run tries again."""

import contextlib
import os
import socket
import sys

from doit.exceptions import TaskFailed

from ..files import json_lines, read_json, write_atomic
from ..fingerprint import entry as on_record, sha256_or_none
from ..verify.result import SCHEMA as RESULT_SCHEMA, VERSION as RESULT_VERSION
from . import digests, golden_store
from .guards import freeze_heap
from .keys import (DERIVED, check_key, check_parts, emit_current, golden_as_recorded, golden_record, import_current,
                   import_key)
from .log import LOG



class ChecksFailed(TaskFailed):
    """A lock whose checks ran and were recorded, some not passing, in a run without the report
    (`doit lock:NAME`): the run fails as Make's and CI's users read it (exit 1); the verdicts are
    recorded as any other (not an error of the task)."""


class ChecksLost(ChecksFailed):
    """A lock some of whose checks could not run through no fault of the bundle (a dead worker, an
    unreachable cluster, weights changed under it): each recorded as an error of its own, its
    siblings' verdicts standing; in a run without the report the task fails, so the run does not
    pass (with it, the report fails it)."""


def error_result(name, source, dtype, steps, reason):
    """The RESULT.json of a check that could not run at all."""
    return {"schema": RESULT_SCHEMA, "version": RESULT_VERSION, "program": None, "name": name,
            "program_path": source, "dtype": dtype, "steps": steps, "verdict": "error",
            "reason": reason, "tolerance": None, "output": None, "worst": None,
            "first_divergence": None, "stages": [], "steps_detail": [], "timings": {},
            "hashes": {}, "environment": None, "unmatched_weights": []}


def _kept(entry, check, key, recorded):
    """The result already recorded for `key` with a pass, its file intact, or None."""
    r = recorded.get(check.dtype)
    if key and isinstance(r, dict) and r.get("key") == key and r.get("verdict") == "pass" \
            and sha256_or_none(check.result) == r.get("sha256"):
        return read_json(check.result)
    return None


def _weights_shas(entry, parts):
    """{file: sha256} the check's weights files must still hold when it reads them."""
    w = (parts or {}).get("weights") or {}
    if "files" in w:
        return w["files"]
    if "import" in w:
        return (read_json(os.path.join(entry.pc.weights, DERIVED)) or {}).get("files")
    return None


def _unread(entry, parts):
    """Why a check's weights cannot be read, from a file's size alone (keys.weights_part), or None."""
    files = ((parts or {}).get("weights") or {}).get("files") or {}
    return next((f"{os.path.join(entry.pc.weights, n)}: {v['refused']}"
                 for n, v in sorted(files.items()) if isinstance(v, dict)), None)


def _derived_from_others(entry):
    """Why a program's derived weights are not the import of its checkpoint as it is now (it, or a
    file the importer reads, changed after this run derived them; a derived file edited or added
    since), or None: computed on them, a verdict would stand under a key it is not about."""
    pc = entry.pc
    key = pc.derive and not pc.error and os.path.isdir(pc.weights) and import_key(pc)
    if not key:
        return None
    record = read_json(os.path.join(pc.weights, DERIVED))
    if not isinstance(record, dict) or record.get("key") != key:
        return (f"{pc.weights} holds weights derived from other inputs than the checkpoint's "
                "files now (changed while the run was under way?)")
    if not import_current(entry):   # (`doit -s lock:NAME` after a hand edit of a derived file)
        return (f"{pc.weights} holds files other than its import made (edited or added since): "
                f"import them again (doit weights:{entry.name})")
    return None


def _about(r, parts):
    """Whether a computed result is about the inputs its key names: the program text and bundle
    files it read are those the key was computed from (a file edited between the two is not),
    and it ran at the key's dtype, steps and tolerance."""
    h = r.get("hashes") or {}
    return h.get("source") == parts["source"] and h.get("bundle") == parts["bundle"] and \
        (r.get("dtype"), r.get("steps"), r.get("tolerance")) == (parts["dtype"], parts["steps"], parts["tolerance"])


def _job(entry, check, parts, run, golden, traces):
    from . import executors
    pc = entry.pc
    shas = _weights_shas(entry, parts)
    # what the check runs with is its key's record (its config's part, where no key names it), made
    # into lock_bundle's arguments by the lock code that runs it (check_worker.lock_arguments): so
    # the verdict is about what the key says. A check runs only for a program whose config was read
    record = parts or {**check.spec, "threads": run["threads"]}
    # the driver's hash record of those files: a worker on this host whose stat agrees does not
    # hash them again (another host's stat of a network filesystem may be stale: it hashes)
    stamps = {f: e for f in shas or () if (e := on_record(os.path.join(pc.weights, f)))}
    return {"code": digests.code("lock"), "name": pc.name, "root": os.getcwd(), "bundle": entry.bundle, "source": pc.source,
            "weights": pc.weights, "record": record, "traces": traces if parts else None,
            "trace_bytes": pc.limits.get("trace_bytes", 0), "weights_shas": shas, "golden": golden,
            "stamps": {"host": socket.gethostname(), "files": stamps},
            "thread_env": {k: os.environ[k] for k in executors.POOL_VARS if k in os.environ},
            "memory": executors.memory_need(os.path.join(entry.bundle, "manifest.json"))}


def _refused(o, dtype, own):
    """An outcome from code other than the code this run's keys name is an error, not a verdict."""
    if "error" in o:
        return o
    ex = o["execution"]
    ran = ex.get("code")
    if ran == own:
        return o
    where = f"on worker {ex.get('worker')}" if ex.get("executor", "inline") != "inline" else "here"
    hint = ("a worker keeps the code it loaded; restart the Dask workers after the emitter changes, "
            "or install this emitter on them" if where != "here" else
            "the emitter's code changed while the run was under way; run doit again")
    return {"error": f"the {dtype} lock check ran {where} with other lock code than this run's "
                     f"(digest {str(ran)[:12]}, this run's {str(own)[:12]}): {hint}",
            "infrastructure": True}


def lock_program(entry, run, db):
    """Lock one program's checks (see the module's doc); `run`: the run's settings (executor,
    workers, threads, cache). Verdicts are recorded, not raised."""
    freeze_heap()
    from ..verify import verdict
    from . import cache, executors, results as history
    pc, threads = entry.pc, run["threads"]
    store = cache.store(run.get("cache"))
    local = cache.LocalStore(os.path.dirname(db) or ".")
    traces = os.path.join(os.path.dirname(db) or ".", "store", "traces")   # the VM's, per program
    status = read_json(entry.status) or {"status": "error", "reason": f"{entry.status}: missing or unreadable"}
    if status.get("status") == "ok" and not emit_current(entry, status):   # (`doit -s lock:NAME`)
        status = {"status": "error", "reason": f"{entry.bundle}/ is not the bundle of {pc.source} as it is now "
                  "(its emit did not run since either changed): emit it again"}
    prior = read_json(entry.lock_status)
    prior = prior if isinstance(prior, dict) else {}
    recorded = prior.get("checks") or {}
    own = digests.code("lock")
    done, parts_of, keys, jobs, fresh, restored, intact, taken = {}, {}, {}, [], set(), set(), set(), set()
    golden = {c.dtype: c.tolerance for c in entry.checks}
    lost = _derived_from_others(entry) if status.get("status") == "ok" else None
    for c in entry.checks:
        if status.get("status") != "ok":
            done[c.dtype] = error_result(pc.name, pc.source, c.dtype, pc.steps, status.get("reason") or pc.error)
            continue
        parts = parts_of[c.dtype] = check_parts(entry, c, status, threads)
        key = keys[c.dtype] = parts and check_key(parts)
        if lost:   # (an error this run's inputs caused: the next run derives and locks again)
            done[c.dtype] = {**error_result(pc.name, pc.source, c.dtype, pc.steps, lost), "stale_weights": [DERIVED]}
            fresh.add(c.dtype)
            continue
        kept = _kept(entry, c, key, recorded)
        if kept is not None:
            intact.add(c.dtype)
        elif key:   # a pass this checkout locked under this key before
            kept = local.get(key)
            kept = kept if isinstance(kept, dict) and kept.get("verdict") == "pass" else None
            if kept is not None:
                restored.add(c.dtype)
        if kept is not None:
            done[c.dtype] = kept
            continue
        hit = store.get(key, parts["environment"]) if key and store is not None else None
        if hit is not None:
            done[c.dtype] = hit
            taken.add(c.dtype)
            continue
        if pc.weights and not os.path.isdir(pc.weights):   # (derived: the import was skipped for the
            # cache's entry, which the lock then could not take)
            why = ("; the import was skipped for the shared cache's entry of this check, which was not there "
                   "to take when the lock read it: run again" if pc.derive is not None and store is not None else "")
            done[c.dtype] = error_result(pc.name, pc.source, c.dtype, pc.steps,
                                         f"{pc.weights}: the weights directory does not exist{why}")
            fresh.add(c.dtype)   # (this run's verdict: in the history too)
            continue
        unread = _unread(entry, parts)
        if unread:   # (the reader would refuse it; it is not read whole first)
            done[c.dtype] = error_result(pc.name, pc.source, c.dtype, pc.steps, unread)
            fresh.add(c.dtype)
            continue
        jobs.append(_job(entry, c, parts, run, golden, traces))
        golden = golden if (run.get("executor") or "inline") != "inline" else None
    golden_copies = os.path.join(os.path.dirname(db) or ".", "store", "golden")
    if not jobs and not lost and not run.get("cache") and status.get("status") == "ok" and \
            all(keys.get(c.dtype) for c in entry.checks) and \
            not golden_store.held(golden_copies, keys, golden_as_recorded(entry.bundle, prior.get("golden"))
                                  and entry.bundle):
        # verdicts known (a shared cache's, a dtype dropped) but no golden/ for them: one check
        # runs again, for its golden/ (the VM's outputs are the same for every dtype): float32's,
        # the cheapest, where there is one
        c = next((c for c in entry.checks if c.dtype == "float32"), entry.checks[0])
        if not _unread(entry, parts_of[c.dtype]):
            jobs.append(_job(entry, c, parts_of[c.dtype], run, golden, traces))
            done.pop(c.dtype)
            intact.discard(c.dtype)
            restored.discard(c.dtype)
    if len(jobs) == 1:   # no other check to share the VM's trace with
        jobs[0]["alone"] = True
    try:
        ex = executors.executor(run.get("executor"), run.get("workers"))
        outcomes = ex.run(jobs, pc.limits["seconds"]) if jobs else []
    except executors.ExecutorError as e:
        outcomes = [{"error": str(e), "infrastructure": True}] * len(jobs)
    made_golden = None
    for job, o in zip(jobs, outcomes):
        dtype = job["record"]["dtype"]
        o = _refused(o, dtype, own)
        fresh.add(dtype)
        if "error" in o:
            done[dtype] = error_result(pc.name, pc.source, dtype, pc.steps, o["error"])
            lost = lost or (o["error"] if o.get("infrastructure") else None)
            continue
        done[dtype] = r = o["result"]
        r["execution"] = o["execution"]
        if r["execution"].get("executor", "inline") != "inline":   # maybe in another environment
            r["execution"]["driver_environment"] = digests.env()
        if r.get("stale_weights"):   # an error this run's inputs caused: the next run tries again
            lost = lost or r["reason"]
        made_golden = made_golden or o.get("golden")
    statuses = {}
    for c in entry.checks:
        r, key, parts = done[c.dtype], keys.get(c.dtype), parts_of.get(c.dtype)
        r["name"] = pc.name   # (a verdict kept by key may come from a program since renamed)
        r["program_path"] = pc.source
        if "bundle" in r:
            r["bundle"] = entry.bundle
        if c.dtype in fresh:
            if r["verdict"] == "error" and not r.get("stale_weights"):
                r["about"] = key   # the inputs it erred on: a view tells a stale error by it
            if key and (r["verdict"] == "error" or not _about(r, parts)):
                key = None   # about other inputs than its key's (or no verdict): checked again
            r["key"], r["inputs"] = key, parts if key else None
            r["cache"] = {"url": store and store.url, "key": key}
            if store is not None:
                r["from_cache"] = False
            r["hashes"].update(code=own, config=c.spec and digests.digest(c.spec),
                               weights_manifest=parts and digests.digest(parts["weights"]),
                               environment=(r.get("environment") or {}).get("digest"))
        elif r.get("from_cache") and store is not None:   # (kept from an earlier cache= run: as it was)
            r["cache"]["url"] = store.url
        elif c.dtype in restored:   # this checkout's own verdict under this key, as recorded then
            r["cache"] = {"url": store and store.url, "key": key}
        if c.dtype not in intact:   # (a result kept as the lock wrote it is not written again)
            write_atomic(c.result, json_lines(r))
        statuses[c.dtype] = {"key": r.get("key"), "verdict": r["verdict"], "sha256": sha256_or_none(c.result)}
        if c.dtype in fresh and key:
            for shared in ([local] + ([store] if store is not None else [])):
                _publish(shared, pc.name, c.dtype, key, r, parts, quiet=shared is local)
        line = verdict.line(r) + (" (from the cache)" if r.get("from_cache") else "")
        (sys.stdout if r["verdict"] == "pass" else sys.stderr).write(f"lock:{pc.name} {line}\n")
    if status.get("status") == "ok":   # before the status: a run killed here locks again
        try:
            golden_store.settle(entry.bundle, golden_copies,
                                {c.dtype: done[c.dtype].get("key") for c in entry.checks}, made_golden)
        except Exception as e:   # (the verdicts stand; golden/ may be missing, never about others)
            golden_store.remove(entry.bundle)
            LOG.warning(f"lock:{pc.name}: golden/ removed, not settled: {type(e).__name__}: {e}")
    _drop_others(entry)
    write_atomic(entry.lock_status, json_lines({"schema": "logos.pipeline.lock", "version": 1,
                                                "checks": statuses,
                                                "golden": golden_record(entry.bundle)}))
    stray = next((done[c.dtype]["unmatched_weights"] for c in entry.checks
                  if done[c.dtype].get("unmatched_weights")), ())
    for w in verdict.unmatched(pc.weights, stray):   # a leaf renamed, a file for another program
        LOG.warning(f"lock:{pc.name} {w}")
    new = [done[c.dtype] for c in entry.checks if c.dtype in fresh | restored | taken
           or status.get("status") != "ok"]   # (a result kept as it was is in the history already)
    try:
        if new:
            history.record_all(db, new)
    except history.HistoryError as e:   # the verdicts stand in their RESULT.json all the same
        LOG.warning(f"lock:{pc.name}: the history was not appended to: {e}")
        if isinstance(e, history.HistoryHeld):   # (its rows go in at the next run's start)
            with contextlib.suppress(OSError):
                open(history.behind(db), "a").close()
    # with the report following, it fails the run naming them (exit 1, as for any check that errs:
    # a failed lock would make the report doit's unmet dependency, 2), unless a task of the dodo's
    # own waits for this lock: it must never run on a verdict that did not pass
    fails = not run.get("report_follows") or f"lock:{pc.name}" in run.get("waited_on", ())
    if lost and fails:
        return ChecksLost(f"lock:{pc.name}: {lost} (recorded as an error; the next run tries again)")
    bad = [f"{c.dtype} {done[c.dtype]['verdict']}" for c in entry.checks if done[c.dtype]["verdict"] != "pass"]
    if bad and fails:
        return ChecksFailed(f"lock:{pc.name}: {len(bad)} of {len(entry.checks)} check(s) did not "
                            f"pass: {', '.join(bad)}")
    return True


def _drop_others(entry):
    """Remove the results of checks the program no longer has (a dtype dropped from its config)."""
    from .files_io import listing, unlink_quietly
    keep = {os.path.basename(c.result) for c in entry.checks}
    unlink_quietly([os.path.join(entry.results, n) for n in listing(entry.results)
                    if n.endswith(".json") and n not in keep])


def _publish(store, name, dtype, key, r, parts, quiet=False):
    """Store a verdict computed here under its key (best effort: the verdict stands regardless);
    one computed in another environment than the key names (a Dask worker elsewhere) is not."""
    from .publish import publishable
    if r["verdict"] not in ("pass", "fail"):
        return
    if not publishable(r, parts):
        if quiet:
            return
        LOG.warning(f"lock:{name}: [{dtype}] not published to {store.url}: computed in another "
                    "environment than this checkout's (a worker with other versions or another "
                    "CPU); the key names this one")
        return
    try:
        store.put(key, r)
    except Exception as e:
        LOG.warning(f"lock:{name}: [{dtype}] not published to {store.url}: "
                    f"{type(e).__name__}: {str(e)[:200]}")
