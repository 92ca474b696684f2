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

import json
import os
import sys

from ..files import BUNDLE_FILES, read_json, write_atomic, write_files
from .digests import check_digest
from .files_io import dumps, sha256_text, stamp_targets, write_if_changed
from .guards import REPORT_FILES, freeze_heap

RESULT_SCHEMA, RESULT_VERSION = "logos.lock.result", 2


def _too_big(program, limits):
    """Why a program may not run here (its tensors exceed limits.tensor_bytes), or None."""
    need, have = program.tensor_bytes, limits["tensor_bytes"]
    if need <= have:
        return None
    return (f"{program.path}: its tensors take {need / 2**30:.1f} GiB in float64, over the limit of "
            f"{have / 2**30:.1f} GiB (limits.tensor_bytes; the default is half this machine's memory)")


def emit_bundle(name, source, bundle_dir, status, config_error=None, limits=None, policy=None):
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
    write_if_changed(status, dumps(state))
    return stamp_targets(targets)


def error_result(name, source, dtype, steps, reason):
    """The RESULT.json of a check that could not run at all."""
    return {"schema": RESULT_SCHEMA, "version": RESULT_VERSION, "program": None, "name": name,
            "program_path": source, "dtype": dtype, "steps": steps, "verdict": "error",
            "reason": reason, "tolerance": None, "output": None, "worst": None,
            "first_divergence": None, "stages": [], "steps_detail": [], "timings": {},
            "hashes": {}, "environment": None, "unmatched_weights": []}


def lock_program(name, source, bundle_dir, status, weights, checks, steps, db, manifest=None,
                 allow_nonfinite=(), digests_dir="build/digests", limits=None, bf16=None):
    """Lock NAME's bundle once per dtype: each RESULT.json written whole, with the digests of what
    it is about, and each run appended to the history DB. `checks` is [(dtype, atol, rtol,
    result_path)]. Verdicts are recorded, not raised; a check running past limits.seconds is an
    error verdict."""
    freeze_heap()
    from ..verify import verdict
    from . import results as history
    from .config import LIMITS
    from .guards import TimeLimit, deadline
    limits = {**LIMITS, **(limits or {})}
    state = read_json(status) or {"status": "error", "reason": f"{status}: missing or unreadable"}
    man = read_json(manifest) if manifest else None
    code = (read_json(os.path.join(digests_dir, "lock.json")) or {}).get("digest")
    from ..verify.tolerances import tolerance
    golden = {dtype: tolerance(dtype, atol, rtol) for dtype, atol, rtol, _ in checks}
    for dtype, atol, rtol, out in checks:
        if state.get("status") != "ok":
            r = error_result(name, source, dtype, steps, state.get("reason"))
        elif weights and not os.path.isdir(weights):
            r = error_result(name, source, dtype, steps,
                             f"{weights}: the weights directory does not exist")
        else:
            try:
                from ..verify.lock import lock_bundle
                with deadline(limits["seconds"], f"the {dtype} lock check"):
                    r = lock_bundle(bundle_dir, source, weights, dtype=dtype, steps=steps, atol=atol,
                                    rtol=rtol, allow_nonfinite=tuple(allow_nonfinite),
                                    max_tensor_bytes=limits["tensor_bytes"], golden=golden,
                                    bf16_bounds=bf16)
                golden = None   # the VM's outputs are the same for every dtype: written once
            except TimeLimit as e:
                r = error_result(name, source, dtype, steps, str(e))
            except Exception as e:   # a lock that crashes is this program's error, not the run's
                r = error_result(name, source, dtype, steps,
                                 f"the lock check raised {type(e).__name__}: {e}")
        r["name"] = name
        r["hashes"].update(weights_manifest=man.get("digest") if man else None, code=code,
                           config=check_digest(dtype, steps, atol, rtol, weights, allow_nonfinite, bf16),
                           environment=(r.get("environment") or {}).get("digest"))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        write_atomic(out, json.dumps(r, indent=2, sort_keys=True, allow_nan=True) + "\n")
        try:
            history.record(db, r)
        except history.HistoryError as e:   # the verdict stands in its RESULT.json all the same
            sys.stderr.write(f"lock:{name}: the history was not appended to: {e}\n")
        line = verdict.line(r)
        (sys.stdout if r["verdict"] == "pass" else sys.stderr).write(f"lock:{name} {line}\n")
    return stamp_targets([c[3] for c in checks])


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
