"""Weights directories under doit: the per-directory manifest a lock depends on, and derived
weights imported from a checkpoint into a fresh directory swapped into place."""

import os
import shutil
import subprocess
import sys
import tempfile

from ..files import read_json, write_atomic
from .files_io import uptodate_check, dumps, sha256_file, sha256_text, stamp_targets, write_if_changed
from .guards import freeze_heap

def _weight_entries(weights_dir):
    """The plain files of a weights directory (dot files ignored), sorted by name: none when it
    does not exist; an unreadable one raises."""
    if not weights_dir or not os.path.isdir(weights_dir):
        return []
    with os.scandir(weights_dir) as it:
        return sorted((e for e in it if not e.name.startswith(".") and e.is_file()),
                      key=lambda e: e.name)


def _listing(weights_dir):
    """name -> (size, mtime_ns, ctime_ns, inode) of a weights directory's files (as
    `_weight_entries` counts them): an edit that puts its mtime back still moves the ctime."""
    return {e.name: (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
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


@uptodate_check
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
    for name, stamp in listing.items():
        if files[name]["size"] != stamp[0]:
            return False
        if cache.get(name) != list(stamp):
            moved[name] = stamp
    for name in moved:
        if sha256_file(os.path.join(weights_dir, name)) != files[name]["sha256"]:
            return False
    if moved:
        cache.update({n: list(v) for n, v in moved.items()})
        write_atomic(_stat_path(manifest), dumps(cache))
    return True


def write_weights_manifest(weights_dir, manifest):
    """names, sizes and sha256 of the weights directory; rewritten only when they change."""
    freeze_heap()
    listing = _listing(weights_dir)
    files = {n: {"size": s, "sha256": sha256_file(os.path.join(weights_dir, n))}
             for n, (s, *_) in listing.items()}
    body = {"schema": "logos.weights.manifest", "version": 1, "dir": weights_dir,
            "exists": bool(weights_dir) and os.path.isdir(weights_dir), "files": files,
            "digest": sha256_text(dumps(files))}
    write_if_changed(manifest, dumps(body))
    write_atomic(_stat_path(manifest), dumps({n: list(v) for n, v in listing.items()}))
    return stamp_targets([manifest])


DERIVED = ".derived.json"   # what `import_weights` made: each file's sha256


def made_by_import(weights_dir, man):
    """Whether a derived weights folder holds just what its import made (the `.derived.json` that
    `import_weights` wrote), as `man`, its weights manifest, lists it: a verdict on weights edited
    by hand does not stand for "this checkpoint through this importer", the derived cache key."""
    record = read_json(os.path.join(weights_dir, DERIVED))
    files = man.get("files") if isinstance(man, dict) else None
    if not isinstance(record, dict) or not isinstance(files, dict):
        return False
    return record.get("files") == {n: (f or {}).get("sha256") for n, f in files.items()}


def known_hashes(weights_dir, manifest):
    """{name: [size, mtime_ns, ctime_ns, inode, sha256]} of the files the manifest hashed, each
    with the stat taken before hashing it (so a file changed since has another stat): what a lock
    need not hash again."""
    man, stats = read_json(manifest), read_json(_stat_path(manifest))
    if not isinstance(man, dict) or not isinstance(stats, dict) or man.get("dir") != weights_dir:
        return {}
    return {n: [*stats[n], f["sha256"]] for n, f in (man.get("files") or {}).items()
            if isinstance(stats.get(n), list) and len(stats[n]) == 4 and stats[n][0] == f.get("size")}


# --- derived weights ------------------------------------------------------------------------------

def checkpoint_identity(spec, path, sha):
    """What stands for a package checkpoint's content across machines: its spec, size and the sha256
    its distribution's RECORD gives (`sha`: what the derived cache key names; its absolute path and
    mtime differ per install, and hashing hundreds of MB each run costs seconds). A new release of
    the same size imports again."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    return f"{spec}|{size}|{sha}"


@uptodate_check
def checkpoint_same(task, values, identity):
    return values.get("checkpoint") == identity


def import_weights(importer, checkpoint, source, out_dir, identity=None, seconds=3600,
                   tmp_root="build/tmp"):
    """`python -m emitter import-IMPORTER CHECKPOINT --program SOURCE -o DIR` into a fresh folder
    under `tmp_root` (the importer's own temporary files go there too), then swapped into place:
    the old weights stay until the new exist, and what a killed import leaves is swept at the next
    run. An import that runs past `seconds` is stopped and fails."""
    freeze_heap()
    from doit.exceptions import TaskFailed
    os.makedirs(tmp_root, exist_ok=True)
    os.makedirs(os.path.dirname(out_dir) or ".", exist_ok=True)
    tmp = tempfile.mkdtemp(dir=tmp_root, prefix=f"import-{os.path.basename(out_dir)}.")
    try:
        cmd = [sys.executable, "-m", "emitter", f"import-{importer}", checkpoint, "--program", source,
               "-o", os.path.join(tmp, "out")]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds,
                                  env={**os.environ, "TMPDIR": os.path.abspath(tmp)})
        except subprocess.TimeoutExpired:
            return TaskFailed(f"{' '.join(cmd[1:4])} ran past {seconds} s (limits.seconds) and was stopped")
        sys.stdout.write(done.stdout[-20000:])
        sys.stderr.write(done.stderr[-20000:])
        if done.returncode != 0:
            last = [x for x in done.stderr.splitlines() if x.strip()][-1:] or [""]
            return TaskFailed(f"{' '.join(cmd[1:])} exited {done.returncode}: {last[0][:300]}")
        made = os.path.join(tmp, "out")
        write_atomic(os.path.join(made, DERIVED), dumps(
            {"schema": "logos.derived", "version": 1,
             "files": {e.name: sha256_file(e.path) for e in _weight_entries(made)}}))
        old = None
        if os.path.exists(out_dir):
            old = os.path.join(tmp, "old")
            os.rename(out_dir, old)
        os.rename(os.path.join(tmp, "out"), out_dir)
        return {"checkpoint": identity}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

