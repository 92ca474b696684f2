"""doit's side of files: its file checker as the one fingerprint rule, the marker of an `uptodate`
callable, `doit clean`'s removers, and what a run removes of programs gone."""

import inspect
import os
import shutil

from doit.dependency import FileChangedChecker

from .. import fingerprint


def uptodate_check(fn):
    """Mark `fn` as a doit `uptodate` callable: its signature is worked out once here, not by doit
    for every task on every run (measured: a sixth of a 1000-program no-op)."""
    fn.__signature__ = inspect.signature(fn)
    return fn


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
    """`doit clean` of a folder a task made whole (derived weights, golden/)."""
    shutil.rmtree(path, ignore_errors=True)


def remove_files(paths):
    """`doit clean` of the files a task made."""
    for p in paths:
        if os.path.exists(p):
            os.unlink(p)


def drop_gone(build, names):
    """Remove what the zoo made for programs it no longer has (deleted or renamed: a bundle of a
    program that is gone, its golden/ beside it, would still test itself): a bundle (a folder whose
    manifest.json is the emitter's) with its golden/, results and statuses, each by its schema,
    and an empty folder; anything else there (a dodo's own) stays. Best effort: what cannot be removed stays. Their
    history stays (`logos results --prune` drops it)."""
    from ..files import BUNDLE_FILES
    for n in _others(os.path.join(build, "bundles"), names):
        folder = os.path.join(build, "bundles", n)
        if _schema(os.path.join(folder, "manifest.json")) == "logos.sambaflow.manifest":
            unlink_quietly([os.path.join(folder, f) for f in BUNDLE_FILES])
            remove_dir(os.path.join(folder, "golden"))
        _rmdir(folder)   # (and one left empty: a refused program's, its bundle removed)
    for n in _others(os.path.join(build, "results"), names):
        folder = os.path.join(build, "results", n)
        unlink_quietly([os.path.join(folder, f) for f in listing(folder)
                 if f.endswith(".json") and _schema(os.path.join(folder, f)) == "logos.lock.result"])
        _rmdir(folder)
    status = os.path.join(build, "status")
    for n in listing(status):
        for kind in ("emit", "lock"):
            if n.endswith(f".{kind}.json") and n[:-len(f".{kind}.json")] not in names and \
                    _schema(os.path.join(status, n)) == f"logos.pipeline.{kind}":
                unlink_quietly([os.path.join(status, n)])
    caches = os.path.join(build, ".report-cache")   # (the report's, a file per program)
    unlink_quietly([os.path.join(caches, f) for f in listing(caches)
                    if f.endswith(".json") and f[:-len(".json")] not in names]
                   + [caches + ".json"])   # an earlier version's one file for all, read by none


def unlink_quietly(paths):
    """Unlink each of `paths`, best effort."""
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass


def _schema(path):
    from ..files import read_json
    body = read_json(path)
    return body.get("schema") if isinstance(body, dict) else None


def listing(folder):
    """`folder`'s names, none where it cannot be listed."""
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _others(folder, names):
    """The folders (not links) in `folder` that name no program of `names`."""
    return [n for n in listing(folder) if n not in names and not os.path.islink(os.path.join(folder, n))
            and os.path.isdir(os.path.join(folder, n))]


def _rmdir(folder):
    try:
        os.rmdir(folder)
    except OSError:
        pass
