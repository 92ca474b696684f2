"""Derived weights: a program's `derive:` checkpoint imported through its importer into a fresh
folder, swapped into place, with `.derived.json` recording the import key it was made under and
each file's sha256 (keys.import_current: a folder that is not what the current inputs make is
imported again)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from ..files import write_atomic
from ..importers.entry import command
from ..fingerprint import moved, sha256
from ..lifetime import DIE_WITH
from . import digests
from .guards import freeze_heap
from .keys import DERIVED, entries, import_key, is_file, listed

def import_weights(pc, tmp_root="build/tmp"):
    """`python -m emitter.importers IMPORTER CHECKPOINT --program SOURCE -o DIR` (`pc`: the program's
    config: its importer and checkpoint, its source, its weights folder) into a fresh folder
    under `tmp_root` (the importer's own temporary files go there too), then swapped into place:
    the old weights stay until the new exist, and what a killed import leaves is swept at the next
    run. An import that runs past limits.seconds is stopped and fails; so does one whose inputs
    changed while it ran (its key, taken before, is what .derived.json records)."""
    derive, source, out_dir, seconds = pc.derive, pc.source, pc.weights, pc.limits["seconds"]
    freeze_heap()
    from doit.exceptions import TaskFailed
    os.makedirs(tmp_root, exist_ok=True)
    os.makedirs(os.path.dirname(out_dir) or ".", exist_ok=True)
    key = import_key(pc)
    if not digests.unchanged("import"):   # its process loads the code as it is now, not the key's
        return TaskFailed("the importers' code changed since this run started: run doit again")
    tmp = tempfile.mkdtemp(dir=tmp_root, prefix=f"import-{os.path.basename(out_dir)}.")
    try:
        cmd = command(derive.importer, derive.checkpoint_path, source, os.path.join(tmp, "out"))
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds,
                                  env={**os.environ, "TMPDIR": os.path.abspath(tmp),
                                       DIE_WITH: str(os.getpid())})   # it ends with this run
        except subprocess.TimeoutExpired:
            return TaskFailed(f"import-{derive.importer} {derive.checkpoint_path} ran past {seconds} s "
                              "(limits.seconds) and was stopped")
        sys.stdout.write(done.stdout[-20000:])
        sys.stderr.write(done.stderr[-20000:])
        if done.returncode != 0:
            last = ([x for x in done.stderr.splitlines() if x.strip()][-1:] or [""])[0]
            last = last if len(last) <= 300 else f"{last[:100]}…{last[-200:]}"   # (its reason is at its end)
            return TaskFailed(f"import-{derive.importer} {derive.checkpoint_path} --program {source} (into "
                              f"{out_dir}) exited {done.returncode}: {last}")
        if not digests.unchanged("import"):
            return TaskFailed("the importers' code changed while the import ran: run doit again")
        if key is None or import_key(pc) != key:
            return TaskFailed(f"the checkpoint {derive.checkpoint} (or a file its importer reads) "
                              "changed or could not be read while it was imported: run doit again")
        made = os.path.join(tmp, "out")
        if not os.path.isdir(made):
            return TaskFailed(f"import-{derive.importer} {derive.checkpoint_path} --program {source} exited 0 "
                              f"but wrote no weights folder")
        odd = sorted(n for n, e in entries(made).items() if not is_file(e) or e.is_symlink())
        if odd:   # (a leaf's file is a plain file: every reader refuses anything else)
            return TaskFailed(f"import-{derive.importer} {derive.checkpoint_path} made `{odd[0]}` in "
                              f"{out_dir}, which is not a plain file: an importer writes plain files only")
        write_atomic(os.path.join(made, DERIVED), json.dumps(
            {"schema": "logos.derived", "version": 2, "key": key,
             "files": {n: sha256(os.path.join(made, n)) for n in sorted(listed(made))}}, sort_keys=True))
        if os.path.exists(out_dir):
            os.rename(out_dir, os.path.join(tmp, "old"))
        os.rename(os.path.join(tmp, "out"), out_dir)
        for n in listed(out_dir):   # the hashes just taken stay on record: the lock reads none again
            moved(os.path.join(made, n), os.path.join(out_dir, n))
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

