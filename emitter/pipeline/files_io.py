"""Small file helpers of the pipeline: content hashes, canonical JSON, write-if-changed, and the
stamps that let doit rebuild a target whose content changed since its task wrote it."""

import hashlib
import inspect
import json
import os
import shutil

from doit.dependency import FileChangedChecker

from .. import fingerprint
from ..files import write_atomic


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


# a stamp keeps 64 bits of the sha256: enough to see an edit, and doit decodes every task's stamps
# (twice: as its values and its result) on every run
STAMP_HEX = 16


def uptodate_check(fn):
    """Mark `fn` as a doit `uptodate` callable: its signature is worked out once here, not by doit
    for every task on every run (measured: a sixth of a 1000-program no-op)."""
    fn.__signature__ = inspect.signature(fn)
    return fn


def stamp_targets(paths):
    """{path: [mtime_ns, size, sha256, ctime_ns, inode]} of files a task just wrote: returned by
    the action, doit keeps it with the task's state for `targets_intact`."""
    out = {}
    for p in paths:
        st = os.stat(p)
        out[p] = [st.st_mtime_ns, st.st_size, sha256_file(p)[:STAMP_HEX], st.st_ctime_ns, st.st_ino]
    return {"targets": out}


@uptodate_check
def targets_intact(task, values):
    """Up to date only while every target, and every other file the action stamped, is what the
    task wrote: the same (mtime, size, ctime, inode) costs a stat; any of them moved with the same
    size costs a hash (a restored build/ has new ctimes; an edit that puts its mtime back keeps
    none: no write keeps the ctime); anything else reruns it. A stamp of an older version (no
    ctime) is checked by its hash."""
    recorded = values.get("targets")
    if not isinstance(recorded, dict):
        return False
    for path in set(task.targets) | set(recorded):
        rec = recorded.get(path)
        try:
            st = os.stat(path)
        except OSError:
            return False
        if not (isinstance(rec, list) and len(rec) in (3, 5)) or st.st_size != rec[1]:
            return False
        same = len(rec) == 5 and [st.st_mtime_ns, st.st_ctime_ns, st.st_ino] == [rec[0], rec[3], rec[4]]
        if not same and sha256_file(path)[:STAMP_HEX] != rec[2]:
            return False
    return True


class FingerprintChecker(FileChangedChecker):
    """doit's file checker (`check_file_uptodate`) as the one fingerprint rule: a dependency's
    state is its sha256 (`emitter.fingerprint`), so an edit that keeps size and mtime (`cp -p`,
    `touch -r`, `tar x`) is seen, and a touch or a restored build/ costs one hash and no rerun."""

    def check_modified(self, file_path, file_stat, state):
        return fingerprint.sha256(file_path) != state

    def get_state(self, dep, current_state):
        sha = fingerprint.sha256(dep)
        return None if sha == current_state else sha


def remove_dir(path):
    """`doit clean` of a folder a task made whole (derived weights)."""
    shutil.rmtree(path, ignore_errors=True)


def remove_files(paths):
    """`doit clean` of the files a task made beside its targets (a bundle, a stat cache)."""
    for p in paths:
        if os.path.exists(p):
            os.unlink(p)
