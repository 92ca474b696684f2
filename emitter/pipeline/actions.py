"""The doit pipeline's actions and up-to-date checks, as module-level functions.

They live here, not in dodo.py, so `doit -n N` can pickle them and a worker never re-imports the
dodo file (which takes the build/ lock). Every file they write is written whole and renamed into
place, so an interrupted run leaves old targets or new ones, never half of one.

A program's problems are results, not task crashes: `emit` records a refused program in its status
file and `lock` turns it into an `error` verdict, so the report (which depends on every program)
always runs; the report task is what fails the run when any program did not pass.
"""

import fcntl
import gc
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from ..files import BUNDLE_FILES, read_json, write_atomic, write_files

# What each kind of task's code is, under emitter/: a folder is a unit of dependency. The pipeline
# itself (pipeline/, cli.py) makes no bundle and no verdict: editing it reruns only the report,
# which depends on the modules it renders with directly.
CODE = {
    "emit": ("files.py", "ops", "language", "sambaflow"),
    "lock": ("files.py", "ops", "language", "sambaflow", "verify"),
    "import": ("importers",),
}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_text(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def dumps(obj):
    """Canonical JSON: sorted keys, so equal content is equal bytes (and equal md5 for doit)."""
    return json.dumps(obj, indent=1, sort_keys=True, allow_nan=True) + "\n"


def write_if_changed(path, text):
    """Write `text` atomically unless the file already holds it (its mtime then stays)."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return False
    except OSError:
        pass
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_atomic(path, text)
    return True


# --- process-wide guards --------------------------------------------------------------------------

_LOCK_FD = None


class BuildBusy(SystemExit):
    pass


def exclusive(build_dir):
    """Hold `build_dir/.doit.lock` for this process's life; refuse clearly if another run holds it.

    doit's dependency DB allows one process at a time (pydoit issues #121, #380)."""
    global _LOCK_FD
    if _LOCK_FD is not None:
        return
    os.makedirs(build_dir, exist_ok=True)
    path = os.path.join(build_dir, ".doit.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            other = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
        finally:
            os.close(fd)
        sys.stderr.write(f"doit: refused: another doit run (pid {other}) is using {build_dir}/ and "
                         "its dependency DB; wait for it to finish and run again\n")
        raise BuildBusy(3)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _LOCK_FD = fd


def sigterm_to_interrupt(signum, frame):
    """SIGTERM as Ctrl-C: doit then flushes the finished tasks' state instead of losing the run."""
    raise KeyboardInterrupt(signum)


_PREVIOUS_HOOK = sys.excepthook


def _interrupted(kind, value, tb):
    """An interrupt that reached the top ends the run with one line, not a traceback (doit has
    already saved the finished tasks' state); SIGTERM then ends the process as SIGTERM would.
    The signal number comes as an int from `sigterm_to_interrupt`, or as its text when doit's
    parallel runner re-raises a worker's interrupt; anything else is taken as Ctrl-C."""
    if not issubclass(kind, KeyboardInterrupt):
        return _PREVIOUS_HOOK(kind, value, tb)
    try:
        sig = signal.Signals(int(value.args[0]))
    except (IndexError, TypeError, ValueError):
        sig = signal.SIGINT
    sys.stderr.write(f"doit: interrupted ({sig.name}); the finished tasks are kept: run doit "
                     "again to go on\n")
    if sig == signal.SIGTERM:
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def install_sigterm():
    global _PREVIOUS_HOOK
    signal.signal(signal.SIGTERM, sigterm_to_interrupt)
    if sys.excepthook is not _interrupted:
        _PREVIOUS_HOOK, sys.excepthook = sys.excepthook, _interrupted


# --- code digests ---------------------------------------------------------------------------------

def code_files(root, kind):
    """The emitter package's .py files that tasks of `kind` ("emit", "lock", "import") depend on,
    repo-relative and sorted."""
    out = []
    for part in CODE[kind]:
        path = os.path.join(root, "emitter", part)
        if part.endswith(".py"):
            out.append(f"emitter/{part}")
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
            out += [f"{rel_dir}/{f}" for f in sorted(filenames) if f.endswith(".py")]
    return sorted(out)


def _digest_of(files):
    shas = {f: sha256_file(f) for f in files}
    return {"files": shas, "digest": sha256_text(dumps(shas))}


def digest_current(task, values, target, files):
    """Up to date when `target` already holds the digest of `files` (hashing a few sources is cheap)."""
    try:
        with open(target, encoding="utf-8") as f:
            return f.read() == dumps(_digest_of(files))
    except OSError:
        return False


def write_digest(target, files):
    write_if_changed(target, dumps(_digest_of(files)))


# --- weights manifest -----------------------------------------------------------------------------

def _weight_entries(weights_dir):
    """The plain files of a weights directory (dot files ignored), sorted by name: none when it
    does not exist; an unreadable one raises."""
    if not weights_dir or not os.path.isdir(weights_dir):
        return []
    with os.scandir(weights_dir) as it:
        return sorted((e for e in it if not e.name.startswith(".") and e.is_file()),
                      key=lambda e: e.name)


def _listing(weights_dir):
    """name -> (size, mtime_ns) of a weights directory's files (as `_weight_entries` counts them)."""
    return {e.name: (st.st_size, st.st_mtime_ns)
            for e in _weight_entries(weights_dir) for st in (e.stat(),)}


def weight_files(weights_dir):
    """A weights directory's files (as `_weight_entries` counts them) as paths, with no stat: the
    dodo lists a thousand of these on every run. An unreadable directory lists none."""
    try:
        return [f"{weights_dir}/{e.name}" for e in _weight_entries(weights_dir)]
    except OSError:
        return []


def _stat_path(manifest):
    return manifest + ".stat"


def weights_current(task, values, weights_dir, manifest):
    """Up to date when the directory's names, sizes and contents match the manifest.

    Files whose mtime moved are re-hashed; if their content is unchanged the stat cache is updated
    here, so a touched (or freshly cloned) weight file reruns nothing and is hashed only once."""
    man, cache = read_json(manifest), read_json(_stat_path(manifest))
    if man is None or cache is None or man.get("dir") != weights_dir:
        return False
    listing = _listing(weights_dir)
    files = man.get("files", {})
    if set(listing) != set(files):
        return False
    moved = {}
    for name, (size, mtime) in listing.items():
        if files[name]["size"] != size:
            return False
        if cache.get(name) != [size, mtime]:
            moved[name] = (size, mtime)
    for name in moved:
        if sha256_file(os.path.join(weights_dir, name)) != files[name]["sha256"]:
            return False
    if moved:
        cache.update({n: list(v) for n, v in moved.items()})
        write_atomic(_stat_path(manifest), dumps(cache))
    return True


def write_weights_manifest(weights_dir, manifest):
    """names, sizes and sha256 of the weights directory; rewritten only when they change."""
    _freeze_heap()
    listing = _listing(weights_dir)
    files = {n: {"size": s, "sha256": sha256_file(os.path.join(weights_dir, n))}
             for n, (s, _) in listing.items()}
    body = {"schema": "logos.weights.manifest", "version": 1, "dir": weights_dir,
            "exists": bool(weights_dir) and os.path.isdir(weights_dir), "files": files,
            "digest": sha256_text(dumps(files))}
    write_if_changed(manifest, dumps(body))
    write_atomic(_stat_path(manifest), dumps({n: list(v) for n, v in listing.items()}))


# --- derived weights ------------------------------------------------------------------------------

def checkpoint_identity(spec, path):
    """What stands for a package checkpoint's content across machines: its spec and size (its
    absolute path and mtime differ per install, and hashing hundreds of MB each run costs seconds)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    return f"{spec}|{size}"


def checkpoint_same(task, values, identity):
    return values.get("checkpoint") == identity


def import_weights(importer, checkpoint, source, out_dir, identity=None):
    """`python -m emitter import-IMPORTER CHECKPOINT --program SOURCE -o DIR` into a fresh
    directory beside `out_dir`, then swapped into place: the old weights stay until the new exist."""
    _freeze_heap()
    parent = os.path.dirname(out_dir) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(out_dir)}.")
    try:
        cmd = [sys.executable, "-m", "emitter", f"import-{importer}", checkpoint, "--program", source,
               "-o", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        if done.returncode != 0:
            from doit.exceptions import TaskFailed
            return TaskFailed(f"{' '.join(cmd[1:])} exited {done.returncode}")
        old = None
        if os.path.exists(out_dir):
            old = tmp + ".old"
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        return {"checkpoint": identity}
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


# --- emit -----------------------------------------------------------------------------------------

def pause_collector():
    """The cyclic collector off while doit loads and checks the zoo's tasks: thousands of
    long-lived objects and no cycles worth finding, yet every pass would rescan them all (measured:
    about a tenth of a 1000-program no-op). Each action turns it back on before its own work."""
    gc.disable()


def _freeze_heap():
    """Move what exists now (doit's thousands of task objects) out of the cyclic collector's view
    and turn the collector back on: otherwise every collection during an action's heavy imports
    (numpy, torch) rescans them all (measured: half a second of a one-edit rebuild at 1000
    programs)."""
    gc.freeze()
    gc.enable()


def emit_bundle(name, source, bundle_dir, status, config_error=None):
    """Write NAME's bundle and its status (ok + bundle hashes, or the refusal).

    A refused program or config leaves no bundle (a stale one is removed, so nothing locks it) and
    succeeds as a task: its lock records the error, and the report fails the run."""
    _freeze_heap()
    from ..language.errors import ProgramError
    state = {"schema": "logos.pipeline.emit", "version": 1, "name": name, "source": source}
    error = config_error
    if error is None:
        try:
            from ..language.reader import read_file
            from ..sambaflow.emit import emit_program
            artifact = emit_program(read_file(source))
        except ProgramError as e:
            error = str(e)
        except OSError as e:
            error = f"{source}: {e.strerror}"
    if error is None:
        files = artifact.files()
        write_files(bundle_dir, files)
        state.update(status="ok", reason=None,
                     bundle={f: sha256_text(files[f]) for f in BUNDLE_FILES})
    else:
        for f in BUNDLE_FILES:
            try:
                os.unlink(os.path.join(bundle_dir, f))
            except FileNotFoundError:
                pass
        state.update(status="error", reason=error, bundle=None)
        sys.stderr.write(f"emit:{name}: {error}\n")
    write_if_changed(status, dumps(state))
    return True


# --- lock -----------------------------------------------------------------------------------------

def _error_result(name, source, bundle_dir, weights, dtype, steps, reason):
    return {"schema": "logos.lock.result", "version": 1, "program": None, "name": name,
            "program_path": source, "bundle": bundle_dir, "weights": weights, "dtype": dtype,
            "steps": steps, "verdict": "error", "reason": reason, "tolerance": None, "output": None,
            "first_divergence": None, "stages": [], "steps_detail": [], "timings": {},
            "hashes": {"source": None, "bundle": {}, "weights": None}, "versions": {},
            "unmatched_weights": []}


def lock_program(name, source, bundle_dir, status, weights, checks, steps, db, manifest=None,
                 config_files=()):
    """Lock NAME's bundle once per dtype: each RESULT.json written whole, each run appended to the
    history DB. `checks` is [(dtype, atol, rtol, result_path)]. Verdicts are recorded, not raised."""
    _freeze_heap()
    from ..verify import verdict
    from . import results as history
    state = read_json(status) or {"status": "error", "reason": f"{status}: missing or unreadable"}
    man = read_json(manifest) if manifest else None
    config_sha = sha256_text("".join(sha256_file(c) for c in config_files if os.path.isfile(c)))
    for dtype, atol, rtol, out in checks:
        if state.get("status") != "ok":
            r = _error_result(name, source, bundle_dir, weights, dtype, steps, state.get("reason"))
        elif weights and not os.path.isdir(weights):
            r = _error_result(name, source, bundle_dir, weights, dtype, steps,
                              f"{weights}: the weights directory does not exist")
        else:
            try:
                from ..verify.lock import lock_bundle
                r = lock_bundle(bundle_dir, source, weights, dtype=dtype, steps=steps, atol=atol,
                                rtol=rtol)
            except Exception as e:   # a lock that crashes is this program's error, not the run's
                r = _error_result(name, source, bundle_dir, weights, dtype, steps,
                                  f"the lock check raised {type(e).__name__}: {e}")
        r["name"] = name
        r.setdefault("hashes", {})["weights_manifest"] = man.get("digest") if man else None
        r["hashes"]["config"] = config_sha
        os.makedirs(os.path.dirname(out), exist_ok=True)
        write_atomic(out, json.dumps(r, indent=2, sort_keys=True, allow_nan=True) + "\n")
        history.record(db, r)
        line = verdict.line(r)
        (sys.stdout if r["verdict"] == "pass" else sys.stderr).write(f"lock:{name} {line}\n")
    return True


# --- report ---------------------------------------------------------------------------------------

def make_report(entries, out_dir):
    """report.json, junit.xml and summary.md from every program's status and results; fails the
    task (so the run exits non-zero) when any check did not pass."""
    _freeze_heap()
    from doit.exceptions import TaskFailed
    from .report import build_rows, write_reports
    rows = build_rows(entries, os.path.join(out_dir, ".report-cache.json"))
    write_reports(rows, out_dir)
    bad = [r for r in rows if r["verdict"] != "pass"]
    if bad:
        names = ", ".join(f"{r['name']}[{r['check']}]={r['verdict']}" for r in bad[:10])
        more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
        return TaskFailed(f"{len(bad)} of {len(rows)} checks did not pass: {names}{more} "
                          f"(see {out_dir}/summary.md)")
    return True
