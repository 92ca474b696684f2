"""The doit pipeline's actions, as module-level functions: emit a bundle, lock it, report the zoo.

They live here, not in dodo.py, so `doit -n N` can pickle them and a worker never re-imports the
dodo file (which takes the build/ lock). Every file they write is written whole and renamed into
place, so an interrupted run leaves old targets or new ones, never half of one; each action returns
the stamps of its targets, so a target edited after its task ran is rebuilt (`targets_intact`).

A program's problems are results, not task crashes: `emit` records a refused program in its status
file and `lock` turns it into an `error` verdict, so the report (which depends on every program)
runs; the report task is what fails the run when any program did not pass. A task that fails all
the same is reported by the progress reporter (`report_failures`), so the report is always this
run's.
"""

import os
import sys

from ..files import BUNDLE_FILES, json_lines, read_json, write_atomic, write_files
from .digests import check_digest, package_digest
from .files_io import dumps, sha256_text, stamp_targets, uptodate_check, write_if_changed
from .guards import REPORT_FILES, freeze_heap
from .weights import made_by_import
from ..verify.threads import DEFAULT_THREADS

RESULT_SCHEMA, RESULT_VERSION = "logos.lock.result", 2


def _too_big(program, limits):
    """Why a program may not run here (its tensors exceed limits.tensor_bytes), or None."""
    need, have = program.tensor_bytes, limits["tensor_bytes"]
    if need <= have:
        return None
    return (f"{program.path}: its tensors take {need / 2**30:.1f} GiB in float64, over the limit of "
            f"{have / 2**30:.1f} GiB (limits.tensor_bytes; the default is half this machine's memory)")


def emit_bundle(name, source, bundle_dir, status, config_error=None, limits=None, policy=None,
                digests_dir=None):
    """Write NAME's bundle and its status (ok + the source's and bundle's hashes, or the refusal).

    A refused program or config leaves no bundle (a stale one is removed, so nothing locks it) and
    succeeds as a task: its lock records the error, and the report fails the run. So does any
    other failure to emit: whatever the file holds, no traceback stops the zoo. `policy` is the
    bf16 precision policy (None: the program is not locked in bfloat16)."""
    freeze_heap()
    from ..language.errors import ProgramError
    from .config import LIMITS
    limits = {**LIMITS, **(limits or {})}
    state = {"schema": "logos.pipeline.emit", "version": 2, "name": name, "source": source,
             "source_sha": None}
    key = emit_key(source, config_error, limits, policy, digests_dir)   # the inputs as read now
    error = config_error
    if error is None:
        try:
            from ..language.reader import read_file
            from ..sambaflow.emit import emit_program
            program = read_file(source, limits["program_bytes"])
            state["source_sha"] = sha256_text(program.source)
            error = _too_big(program, limits)
            artifact = None if error else emit_program(program, policy)
        except ProgramError as e:
            error = str(e)
        except OSError as e:
            error = f"{source}: {e.strerror}"
        except Exception as e:   # RecursionError, MemoryError, a bug: this program's error only
            error = f"{source}: emitting it failed: {type(e).__name__}: {str(e)[:300]}"
    targets = [status]
    if error is None:
        files = artifact.files()
        write_files(bundle_dir, files)
        state.update(status="ok", reason=None,
                     bundle={f: sha256_text(files[f]) for f in BUNDLE_FILES})
        targets += [os.path.join(bundle_dir, f) for f in BUNDLE_FILES]
    else:
        for f in BUNDLE_FILES:
            try:
                os.unlink(os.path.join(bundle_dir, f))
            except FileNotFoundError:
                pass
        state.update(status="error", reason=error, bundle=None)
        sys.stderr.write(f"emit:{name}: {error}\n")
    # a program edited while it was emitted is not recorded as done: the next run emits it again
    state["key"] = key if key == emit_key(source, config_error, limits, policy, digests_dir) else None
    write_if_changed(status, dumps(state))
    return stamp_targets(targets)


def emit_key(source, config_error, limits, policy, digests_dir):
    """The key of an emit: the program's bytes, what of the config it uses (a refusal, the limits,
    the precision policy) and the emit code; what its status records, and its up-to-date check
    compares with the inputs as they are when it is asked."""
    from ..fingerprint import sha256_or_none
    from .keys import digest
    code = (read_json(os.path.join(digests_dir, "emit.json")) or {}).get("digest") if digests_dir else None
    limits = {k: (limits or {}).get(k) for k in ("program_bytes", "tensor_bytes")}
    return digest({"source": None if config_error else sha256_or_none(source), "error": config_error,
                   "limits": limits, "policy": policy, "code": code})


@uptodate_check
def emit_current(task, values, source, status, config_error, limits, policy, digests_dir):
    """doit's `uptodate` of an emit: its status records the key of the inputs as they are now."""
    return (read_json(status) or {}).get("key") == emit_key(source, config_error, limits, policy,
                                                               digests_dir)


def error_result(name, source, dtype, steps, reason):
    """The RESULT.json of a check that could not run at all."""
    return {"schema": RESULT_SCHEMA, "version": RESULT_VERSION, "program": None, "name": name,
            "program_path": source, "dtype": dtype, "steps": steps, "verdict": "error",
            "reason": reason, "tolerance": None, "output": None, "worst": None,
            "first_divergence": None, "stages": [], "steps_detail": [], "timings": {},
            "hashes": {}, "environment": None, "unmatched_weights": []}


def lock_program(name, source, bundle_dir, status, weights, checks, steps, db, manifest=None,
                 allow_nonfinite=(), digests_dir="build/digests", limits=None, bf16=None,
                 precision=None, run=None):
    """Lock NAME's bundle once per dtype: each RESULT.json written whole, with the digests of what
    it is about, and each run appended to the history DB. `checks` is [(dtype, atol, rtol,
    result_path)]. Verdicts are recorded, not raised; a check running past limits.seconds is an
    error verdict.

    `run` (from doit's command-line variables, see emitter.tasks): "executor" (inline, or a Dask
    cluster the checks are handed to: see executors.py), "threads" per check, and "cache" (a
    shared verdict cache's URL) with "keys" ({dtype: the key's static parts}): a valid entry is
    the verdict (`from_cache`), and a verdict computed here is published. The driver alone writes
    results, golden/ and the history. A cluster that lost a check (a dead worker, no scheduler)
    still records it as an error, and the task fails so that the next run tries again."""
    freeze_heap()
    from doit.exceptions import TaskFailed
    from ..verify import verdict
    from . import cache, executors, keys as keys_mod, results as history
    from .config import LIMITS
    limits = {**LIMITS, **(limits or {})}
    run = run or {}
    state = read_json(status) or {"status": "error", "reason": f"{status}: missing or unreadable"}
    man = read_json(manifest) if manifest else None
    stamped = read_json(os.path.join(digests_dir, "lock.json")) or {}
    code = stamped.get("digest")
    own = stamped.get("package") or package_digest("lock")   # what workers must have run
    here = (read_json(os.path.join(digests_dir, "env.json")) or {}).get("digest")
    from ..verify.tolerances import tolerance
    golden = {dtype: tolerance(dtype, atol, rtol) for dtype, atol, rtol, _ in checks}
    threads = run.get("threads") or DEFAULT_THREADS
    store = cache.store(run.get("cache"))
    specs = run.get("keys") or {}
    done, keys, parts_of, jobs = {}, {}, {}, []
    shas = {n: f.get("sha256") for n, f in (man.get("files") or {}).items()} \
        if weights and isinstance(man, dict) else None
    edited = None   # derived weights that are not what their import wrote: no key stands for them
    for dtype, atol, rtol, out in checks:
        if state.get("status") != "ok":
            done[dtype] = error_result(name, source, dtype, steps, state.get("reason"))
            continue
        parts = keys_mod.key_parts(specs[dtype], status, manifest, digests_dir, threads) \
            if dtype in specs else None
        if parts and isinstance(parts["weights"], dict):
            if edited is None:   # (no folder or manifest yet: the cache may spare the import)
                edited = bool(man) and os.path.isdir(weights) and not made_by_import(weights, man)
            parts = None if edited else parts
        keys[dtype], parts_of[dtype] = parts and keys_mod.check_key(parts), parts
        hit = store.get(keys[dtype]) if keys[dtype] and store is not None else None
        if hit is not None:
            done[dtype] = hit
            continue
        if weights and not os.path.isdir(weights):
            done[dtype] = error_result(name, source, dtype, steps,
                                       f"{weights}: the weights directory does not exist")
            continue
        kwargs = dict(dtype=dtype, steps=steps, atol=atol, rtol=rtol,
                      allow_nonfinite=tuple(allow_nonfinite), max_tensor_bytes=limits["tensor_bytes"],
                      bf16_bounds=bf16, precision=precision,
                      weights_shas=shas)
        # the VM's outputs are the same for every dtype: golden/ is written once
        jobs.append({"name": name, "root": os.getcwd(), "bundle": bundle_dir, "source": source,
                     "weights": weights, "kwargs": kwargs, "golden": golden, "threads": threads,
                     "thread_env": {k: os.environ[k] for k in executors.POOL_VARS if k in os.environ},
                     "memory": executors.memory_need(os.path.join(bundle_dir, "manifest.json"))})
        golden = golden if (run.get("executor") or "inline") != "inline" else None
    if edited:
        sys.stderr.write(f"lock:{name}: {weights} is not what its import wrote (its .derived.json is "
                         "missing or lists other files: edited by hand, or imported by an older "
                         "version; delete the folder to import it again): its verdicts are not "
                         "looked up in, nor published to, a verdict cache\n")
    lost = None
    try:
        ex = executors.executor(run.get("executor"), run.get("workers"))
        outcomes = ex.run(jobs, limits["seconds"]) if jobs else []
    except executors.ExecutorError as e:
        outcomes = [{"error": str(e), "infrastructure": True}] * len(jobs)
    wrote_golden = False
    for job, o in zip(jobs, outcomes):
        dtype = job["kwargs"]["dtype"]
        remote = "error" not in o and o["execution"].get("executor", "inline") != "inline"
        ran = o["execution"].get("code") if remote else None
        if remote and ran != own:
            o = {"error": f"the {dtype} lock check ran on worker {o['execution'].get('worker')} with "
                          f"other lock code than this run's (digest {str(ran)[:12]}, this run's "
                          f"{str(own)[:12]}): a worker keeps the code it loaded; restart the Dask "
                          "workers after the emitter changes, or install this emitter on them",
                 "infrastructure": True}
        if "error" in o:
            done[dtype] = error_result(name, source, dtype, steps, o["error"])
            lost = lost or (o["error"] if o.get("infrastructure") else None)
            continue
        done[dtype] = r = o["result"]
        r["execution"] = o["execution"]
        if remote:   # computed on a worker, maybe in another environment: which run it belongs to
            r["execution"]["driver_environment"] = here
        if r.get("stale_weights"):   # an error this run's manifest caused: the next run tries again
            lost = lost or r["reason"]
        if o.get("golden") and not wrote_golden:
            write_files(os.path.join(bundle_dir, "golden"), o["golden"])
            wrote_golden = True
    for dtype, atol, rtol, out in checks:
        r = done[dtype]
        r["name"] = name
        r["hashes"].update(weights_manifest=man.get("digest") if man else None, code=code,
                           config=check_digest(dtype, steps, atol, rtol, weights, allow_nonfinite, bf16),
                           environment=(r.get("environment") or {}).get("digest"))
        if keys.get(dtype) and not _about(r, parts_of[dtype]):
            keys[dtype] = None   # the files it read are not those the key names: changed meanwhile
        r["key"], r["inputs"] = keys.get(dtype), parts_of.get(dtype) if keys.get(dtype) else None
        if keys.get(dtype) and not r.get("from_cache"):
            r["cache"] = {"url": store and store.url, "key": keys[dtype]}
            if store is not None:
                r["from_cache"] = False
        os.makedirs(os.path.dirname(out), exist_ok=True)
        write_atomic(out, json_lines(r))
        publish = store is not None and keys.get(dtype) and not r.get("from_cache") \
            and r["verdict"] in cache.CACHEABLE
        if publish and not cache.publishable(r, parts_of[dtype]):
            publish = False
            sys.stderr.write(f"lock:{name}: [{dtype}] not published to {store.url}: computed in "
                             "another environment than this checkout's (a worker with other "
                             "versions or another CPU); the key names this one\n")
        if publish:
            try:
                store.put(keys[dtype], r)
            except Exception as e:   # the verdict stands; the cache is best effort
                sys.stderr.write(f"lock:{name}: [{dtype}] not published to {store.url}: "
                                 f"{type(e).__name__}: {str(e)[:200]}\n")
        line = verdict.line(r) + (" (from the cache)" if r.get("from_cache") else "")
        (sys.stdout if r["verdict"] == "pass" else sys.stderr).write(f"lock:{name} {line}\n")
    try:
        history.record_all(db, [done[c[0]] for c in checks])
    except history.HistoryError as e:   # the verdicts stand in their RESULT.json all the same
        sys.stderr.write(f"lock:{name}: the history was not appended to: {e}\n")
    stamps = stamp_targets([c[3] for c in checks])
    if lost:
        return TaskFailed(f"lock:{name}: {lost} (recorded as an error; the next run tries again)")
    return {**stamps, **(run.get("values") or {})}


def _about(r, parts):
    """Whether a result is about the inputs its key names: the program text and the bundle files
    it read are those the key was computed from (a file edited between the two is not)."""
    h = r.get("hashes") or {}
    return r.get("from_cache") or (h.get("source") == parts["source"] and h.get("bundle") == parts["bundle"])


def make_report(entries, out_dir, failures=None):
    """report.json, junit.xml and summary.md from every program's status and results; fails the
    task (so the run exits non-zero) when any check did not pass. `failures` ({task: message})
    are this run's failed tasks: their programs' checks become errors that say so."""
    freeze_heap()
    from doit.exceptions import TaskFailed
    from .report import build_rows, write_reports
    rows = build_rows(entries, os.path.join(out_dir, ".report-cache.json"), out_dir, failures)
    write_reports(rows, out_dir, os.path.join(out_dir, ".report-plots.json"))
    bad = [r for r in rows if r["verdict"] != "pass"]
    if bad:
        names = ", ".join(f"{r['name']}[{r['check']}]={r['verdict']}" for r in bad[:10])
        more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
        return TaskFailed(f"{len(bad)} of {len(rows)} checks did not pass: {names}{more} "
                          f"(see {out_dir}/summary.md)")
    return stamp_targets([os.path.join(out_dir, f) for f in REPORT_FILES])
