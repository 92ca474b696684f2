"""Weights directories under doit: the per-directory manifest a lock depends on, and derived
weights imported from a checkpoint into a fresh directory swapped into place."""

import os
import shutil
import subprocess
import sys
import tempfile

from ..files import read_json, write_atomic
from ..fingerprint import sha256, sha256_or_none
from .files_io import uptodate_check, dumps, sha256_text, stamp_targets, write_if_changed
from .keys import import_key
from .guards import freeze_heap

def _weight_entries(weights_dir):
    """The plain files of a weights directory (dot files ignored), sorted by name: none when it
    does not exist; an unreadable one raises."""
    if not weights_dir or not os.path.isdir(weights_dir):
        return []
    with os.scandir(weights_dir) as it:
        return sorted((e for e in it if not e.name.startswith(".") and e.is_file()),
                      key=lambda e: e.name)


def weight_files(weights_dir):
    """A weights directory's files (as `_weight_entries` counts them) as paths, with no stat: the
    dodo lists a thousand of these on every run. An unreadable directory lists none."""
    try:
        return [f"{weights_dir}/{e.name}" for e in _weight_entries(weights_dir)]
    except OSError:
        return []


def _files(weights_dir):
    """name -> size of a weights directory's files (as `_weight_entries` counts them)."""
    return {e.name: e.stat().st_size for e in _weight_entries(weights_dir)}


@uptodate_check
def weights_current(task, values, weights_dir, manifest):
    """Up to date when the directory's names, sizes and contents (fingerprints) match the manifest."""
    man = read_json(manifest)
    if not isinstance(man, dict) or man.get("dir") != weights_dir:
        return False
    listing, files = _files(weights_dir), man.get("files") or {}
    if set(listing) != set(files):
        return False
    return all(files[n].get("size") == size and files[n].get("sha256") == sha256_or_none(
        os.path.join(weights_dir, n)) for n, size in listing.items())


def write_weights_manifest(weights_dir, manifest):
    """names, sizes and sha256 of the weights directory; rewritten only when they change."""
    freeze_heap()
    files = {n: {"size": size, "sha256": sha256(os.path.join(weights_dir, n))}
             for n, size in _files(weights_dir).items()}
    body = {"schema": "logos.weights.manifest", "version": 1, "dir": weights_dir,
            "exists": bool(weights_dir) and os.path.isdir(weights_dir), "files": files,
            "digest": sha256_text(dumps(files))}
    write_if_changed(manifest, dumps(body))
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


@uptodate_check
def import_current(task, values, out_dir, derive, digests_dir):
    """Up to date when `out_dir` holds what an import of the checkpoint as it is now made: its
    .derived.json names the current import key (every file the importer reads, its code and
    libraries) and each file it lists is still that file (a hand edit re-derives the folder)."""
    record = read_json(os.path.join(out_dir, DERIVED))
    if not isinstance(record, dict) or record.get("key") != import_key(derive, digests_dir):
        return False
    files = record.get("files")
    if not isinstance(files, dict):
        return False
    try:
        listed = {e.name for e in _weight_entries(out_dir)}
    except OSError:
        return False
    return listed == set(files) and all(sha256_or_none(os.path.join(out_dir, n)) == sha
                                        for n, sha in files.items())


def import_weights(importer, checkpoint, source, out_dir, derive, digests_dir, seconds=3600,
                   tmp_root="build/tmp"):
    """`python -m emitter import-IMPORTER CHECKPOINT --program SOURCE -o DIR` into a fresh folder
    under `tmp_root` (the importer's own temporary files go there too), then swapped into place:
    the old weights stay until the new exist, and what a killed import leaves is swept at the next
    run. An import that runs past `seconds` is stopped and fails; so does one whose inputs changed
    while it ran (its key, taken before, is what .derived.json records)."""
    freeze_heap()
    from doit.exceptions import TaskFailed
    os.makedirs(tmp_root, exist_ok=True)
    os.makedirs(os.path.dirname(out_dir) or ".", exist_ok=True)
    key = import_key(derive, digests_dir)
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
        if key is None or import_key(derive, digests_dir) != key:
            return TaskFailed(f"the checkpoint {derive.checkpoint} (or a file its importer reads) "
                              "changed or could not be read while it was imported: run doit again")
        made = os.path.join(tmp, "out")
        write_atomic(os.path.join(made, DERIVED), dumps(
            {"schema": "logos.derived", "version": 2, "key": key,
             "files": {e.name: sha256(e.path) for e in _weight_entries(made)}}))
        old = None
        if os.path.exists(out_dir):
            old = os.path.join(tmp, "old")
            os.rename(out_dir, old)
        os.rename(os.path.join(tmp, "out"), out_dir)
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

