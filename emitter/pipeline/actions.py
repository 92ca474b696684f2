"""The doit pipeline's actions: the emit and the report's currency here, the others loaded when
doit runs one (a no-op loads none: the import's, the lock's, the report's, the cache's), as
module-level functions taking the run's records (`checks.Entry`), so `doit -n N` can pickle them and a worker
never re-imports the dodo file. Every file they write is written whole and renamed into place, so
an interrupted run leaves old files or new ones, never half of one; each records the key it ran
under (`keys`), so what a task finds current is what it made from the inputs as they are now.

A program's problems are results, not task crashes: `emit` records a refused program in its status
file and `lock` turns it into an `error` verdict, so the report (which covers every program) runs;
the report task is what fails the run when any check did not pass. A task that fails all the same
is reported by the progress reporter, so the report is always this run's.
"""

import os
import sys

from ..files import BUNDLE_FILES, json_lines, read_json, write_atomic
from ..fingerprint import sha256_text
from . import digests, files_io
from .guards import freeze_heap
from .keys import check_key, current_parts, emit_key


def emit_bundle(entry, run=None):
    """Write the program's bundle and its status: the emit key it was made under, the source's
    and the bundle's hashes and the leaves (whose files the weights key reads), or the refusal.

    A refused program or config leaves no bundle (a stale one is removed, so nothing locks it) and
    succeeds as a task where its lock records the error or the report fails the run; in a run
    with neither (`doit emit:NAME`, its lock ignored: `run`'s settings say) it fails, so the run
    exits 1 as it says, and so it does where a task of the dodo's own waits for it. So does any
    other failure to emit: whatever the file holds, no traceback stops the zoo."""
    freeze_heap()
    from ..files import write_files
    from ..language.errors import ProgramError
    pc = entry.pc
    state = {"schema": "logos.pipeline.emit", "version": 4, "name": pc.name, "source": pc.source,
             "source_sha": None, "leaves": None, "tensor_bytes": None}
    key = emit_key(entry)   # the inputs as they are when it starts
    error = pc.error
    if error is None:
        try:
            from ..language.reader import read_file
            from ..sambaflow.emit import emit_program
            program = read_file(pc.source, pc.limits["program_bytes"])
            state.update(source_sha=sha256_text(program.source),   # leaves: {name: [rows, cols]}
                         leaves={n: [program.decls[n].rows, program.decls[n].cols] for n in sorted(program.leaves)},
                         tensor_bytes=program.tensor_bytes)   # (float64: what limits.tensor_bytes bounds)
            error = program.over_limits(pc.limits)
            error = error and f"{program.path}: {error}"
            artifact = None if error else emit_program(program, pc.precision)
        except ProgramError as e:
            error = str(e)
        except OSError as e:
            error = f"{pc.source}: {e.strerror}"
        except Exception as e:   # RecursionError, MemoryError, a bug: this program's error only
            error = f"{pc.source}: emitting it failed: {type(e).__name__}: {str(e)[:300]}"
    if error is None:
        files = artifact.files()
        write_files(entry.bundle, files)
        state.update(status="ok", reason=None, bundle={f: sha256_text(files[f]) for f in BUNDLE_FILES})
    else:
        for f in entry.bundle_files():
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass
        state.update(status="error", reason=error, bundle=None)
        if f"emit:{pc.name}" not in (run or {}).get("waited_on", ()):   # (else its failure says it)
            sys.stderr.write(f"emit:{pc.name}: {error}\n")
    if error is not None or not entry.locked:   # no lock settles golden/ (golden_store): none
        from .golden_store import remove
        remove(entry.bundle)
    if not entry.locked:   # `lock: false`: no verdict of an earlier lock stays beside the bundle
        from .files_io import remove_dir, remove_files
        remove_dir(entry.results)
        remove_files([entry.lock_status])
    # a program (or the emit's code) edited while it was emitted is not recorded as done: the next
    # run emits it again
    state["key"] = key if key == emit_key(entry) and digests.unchanged("emit") else None
    write_atomic(entry.status, json_lines(state))
    if error is not None and run is not None and run.get("report_follows") is False \
            and pc.name not in run.get("locks_follow", ()):
        from doit.exceptions import TaskFailed
        return TaskFailed(f"emit:{pc.name}: refused, and no lock or report of this run records it")
    if error is not None and run is not None and f"emit:{pc.name}" in run.get("waited_on", ()):
        from doit.exceptions import TaskFailed   # (a task of the dodo's own waits for this emit)
        return TaskFailed(f"emit:{pc.name}: refused (a task of the dodo's own waits for it): {error}")
    return True


def report_current(entries, out_dir, threads, now=None, judge=False):
    """doit's `uptodate` of the report: the last complete report records the report key of the
    inputs as they are now (it records one only when every check passed); it is then brought back
    from where the run set it aside (at the run's end where the run holds it: report_aside.ready).
    `now`: that key as the run's pre-check took it, when no task ran before the report (where any
    did, every program is read again: a file may have moved). `judge`: read every check's row with
    it, kept for the report's action (which then needs no second reading) where the report is not
    current."""
    from .guards import began_ns
    from .keys import report_key
    from .report_aside import JUDGED, appeared_since, changed_since, mark_read, ready, recorded_key
    JUDGED.pop(out_dir, None)   # (only this judgement is handed on)
    mark_read(out_dir)
    ran = now is None
    if ran and judge:
        from .report import judge_rows
        judged = judge_rows(entries, out_dir, threads)
        now = judged[1]
    moved = ran and (changed_since(entries, began_ns()) or appeared_since(entries, began_ns()))   # (tasks ran)
    if recorded_key(out_dir) != (now or report_key(entries, threads)) or moved:
        if ran and judge and not moved:   # (where one moved, the action judges the rows again)
            JUDGED[out_dir] = (id(entries), threads, *judged)
        return False
    ready(out_dir)
    return True


def cache_lookup(entry, threads, url):
    """`cachelookup:NAME` (doit's calc_dep of `lock:NAME`) for a derived program: when every check
    holds its pass here or is in the cache under its key (the import key names the checkpoint, not
    the derived files), the lock needs no import; else (or where the weights were made before,
    and are kept current) it waits for `weights:NAME`."""
    from .cache import store
    need = {"task_dep": [f"weights:{entry.name}"]}
    if os.path.isdir(entry.pc.weights):
        return need
    cache = store(url)
    status = read_json(entry.status)
    recorded = (read_json(entry.lock_status) or {}).get("checks") or {}
    for dtype, parts in current_parts(entry, threads, status).items():
        if parts is None:   # no bundle: the lock records the emit's error, no weights needed
            return {}
        key = check_key(parts)
        if (recorded.get(dtype) or {}).get("key") == key and recorded[dtype].get("verdict") == "pass":
            continue
        if cache is None or not cache.has(key, parts["environment"]):   # (the entry the lock takes)
            return need
    return {}


def cache_publish(*args):
    from .publish import publish_all
    return publish_all(*args)


def import_weights(*args):
    from .weights import import_weights
    return import_weights(*args)


def lock_program(*args):
    from .lock_task import lock_program
    return lock_program(*args)


def make_report(*args):
    from .report import make_report
    return make_report(*args)


def clean_report(build):
    """`doit clean` of the report's files."""
    from .report_aside import STALE, report_files
    files_io.remove_files([f"{build}/{d}{f}" for f in report_files(build) for d in ("", f"{STALE}/")])


def report_aside(build):
    """`doit clean` of what a report is about (a bundle, weights, results): the last report no
    longer describes build/, so it goes to build/stale/ until a run finds it current again."""
    from .report_aside import set_aside
    set_aside(build)


def report_aside_for_run(build, current):
    """As this process's run begins: the last report set aside (report_aside.set_aside), and
    `unreported` at the process's exit (`current()`: the run, once its first task creator made it)."""
    import atexit
    from .report_aside import set_aside
    set_aside(build)
    atexit.register(unreported, build, current)


def unreported(out_dir, current):
    """At the exit of a run that no zoo reporter ran (`doit --reporter json lock:NAME`): the report
    set aside as it began comes back where it is current now, by its key, as the zoo's reporter
    brings it back at a run's end (one the run wrote is in place already). Best effort: else it
    stays aside, not current."""
    from .report_aside import STALE, ZOO_REPORTER, report_files
    run = current()
    if ZOO_REPORTER or run is None or not any(os.path.exists(os.path.join(out_dir, STALE, f))
                                              for f in report_files(out_dir)):
        return   # (nothing aside: the run wrote its report, or brought it back, or had none)
    from .keys import made_current
    try:
        if all(made_current(e) for e in run.entries):   # (what the report key takes from records)
            report_current(run.entries, out_dir, run.settings["threads"])
    except Exception:   # noqa: BLE001 (at exit: nothing left to tell it to)
        pass


def report_again(entries, out_dir, threads):
    """Whether a program, config or weights file moved after this run's report read the zoo
    (report_aside's moved_after_read) so that a check is no longer current: the report is then
    written again, as the zoo is now (those rows errors), said."""
    from .log import LOG
    from .report_aside import moved_after_read
    moved = moved_after_read(entries, out_dir)
    if not moved or make_report(entries, out_dir, threads) is True:   # (touched, its bytes the same)
        return False
    LOG.error(f"{moved[0]}{f' and {len(moved) - 1} more' if len(moved) > 1 else ''}: changed after the report "
              "read the zoo (by a task that ran after it, or by hand): the report says so; run doit again")
    return True
