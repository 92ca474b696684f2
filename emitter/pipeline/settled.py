"""The stat snapshot of a settled zoo, `build/.stamps.json`, renewed at the end of each run.

It serves two checks, both of them only ever skipping work that doit would find up to date:

- per task (`begin`): a task whose stamped files did not move since a run last found it up to date
  or ran it needs no integrity check (`files_io.targets_intact`) this run;
- whole run (`whole`): a plain `doit` (the default tasks, no options) that found every task it
  reached up to date, or ran it, also keeps a digest of all that doit's checks read: the graph of
  tasks (names, file deps, targets, task deps, `uptodate` arguments), the (mtime, size) of every
  file the tasks depend on, make or stamp, of the code and of the dodo, the dependency DB and the
  environment's fingerprint. A later plain run whose digest is the same has nothing to run: the
  zoo then hands doit only its report task (see `emitter.tasks`), and a no-op costs a stat per
  file instead of doit's work per task.

What the digest records is never a stat taken after the check it stands for: a file no task of the
run wrote counts as it was when the run began (doit checked it later, so a file edited meanwhile
differs from the record and the next run checks it in full), a file a task wrote counts as its
action stamped it right after writing (`files_io.stamp_targets`); a task that wrote files without
stamps leaves no digest, and the next plain run checks everything.
"""

import hashlib
import os

from ..files import read_json, write_atomic

VERSION = 2
_RUN = {}   # this run's: the snapshot file, what it held, the stats taken at load, the digest's parts


def stat(path):
    """[mtime_ns, size] of `path` (links followed), None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def begin(snapshot, stamped):
    """Read `snapshot` and stat every stamped file; the names (of `stamped`: {name: [files]})
    whose files' (mtime, size) differ from it, all of them when there is none."""
    old = read_json(snapshot)
    old = old if isinstance(old, dict) and old.get("version") == VERSION else {}
    files = old.get("files") if isinstance(old.get("files"), dict) else {}
    now, out = {}, set()
    for name, paths in stamped.items():
        for f in paths:
            st = now[f] = stat(f)
            if files.get(f, False) != st:
                out.add(name)
    _RUN.clear()
    _RUN.update(path=snapshot, old=old, files=files, stamped=stamped, now=now)
    return out


def _digest(key, stats, db):
    """sha256 of the parts, the stats in their order (the same graph lists its files in the same
    order: no sorting of thousands of paths on every run)."""
    text = "\0".join(f"{f}\0{st}" for f, st in stats.items())
    return hashlib.sha256(f"{key}\0{db}\0{text}".encode("utf-8", "surrogateescape")).hexdigest()


def whole(key, made, files, db):
    """Whether the zoo is as a complete plain run last left it: `key` (text) stands for the graph
    and the environment, `made` ({task: [files it writes]}) and `files` (every other file the
    checks read) are stat'ed now, `db` is doit's dependency file. Call it only on a plain run."""
    if not _RUN:
        raise RuntimeError("settled.begin first")
    now = _RUN["now"]
    for paths in (*made.values(), files):
        for f in paths:
            if f not in now:
                now[f] = stat(f)
    _RUN.update(key=key, made=made, db=db, fast=False)
    _RUN["fast"] = _RUN["old"].get("settled") == _digest(key, now, stat(db))
    return _RUN["fast"]


def fast():
    """Whether `whole` found the zoo as a complete plain run left it (and nobody since refused)."""
    return bool(_RUN.get("fast"))


def load_in_full():
    """The run loads every task after all (the dodo has creators that may use them)."""
    _RUN["fast"] = False


def settle(settled, uptodate=(), values=None, complete=False):
    """After a run: the snapshot takes the stamped files of the tasks `settled` (found up to date,
    or run and succeeded): as they were at load for the tasks found up to date, as their action
    stamped them for the tasks that ran (`values`: {task: its doit values}); every other task keeps
    what it had, so a task this run did not check (not selected, failed) is checked next time.

    `complete`: a plain run that reached no failure and settled every task it reached. Then the
    whole-run digest is renewed; a run that loaded the zoo in full keeps the digest it found, and a
    fast run (`whole` matched) in which anything ran or failed drops it. Returns a line for the
    run's output when the run was a fast one, else None."""
    if not _RUN:
        return None
    uptodate, values = set(uptodate), values or {}
    files, now = dict(_RUN["files"]), _RUN["now"]
    verified = dict(now)          # what the whole-run digest records: see the module's doc
    whole_ok = "key" in _RUN and complete
    for name in settled:
        ran = name not in uptodate
        stamps = (values.get(name) or {}).get("targets") if ran else None
        stamps = stamps if isinstance(stamps, dict) else {}
        for f in _RUN["stamped"].get(name, ()):
            st = now.get(f) if not ran else _stamp(stamps.get(f))
            if st is None:
                files.pop(f, None)
            else:
                files[f] = st
        if ran and "made" in _RUN:
            for f in _RUN["made"].get(name, ()):
                if f in stamps:
                    verified[f] = _stamp(stamps[f])
                    whole_ok = whole_ok and verified[f] is not None
                else:   # a file the action did not stamp counts only if it removed it
                    verified[f] = None
                    whole_ok = whole_ok and stat(f) is None
    snap = {"version": VERSION, "files": files, "settled": _RUN["old"].get("settled")}
    fast = _RUN.get("fast")
    if fast and (not complete or set(settled) - uptodate):
        snap["settled"] = None   # a fast run ran something after all: the next one loads in full
    elif whole_ok and not fast:
        snap["settled"] = _digest(_RUN["key"], verified, stat(_RUN["db"]))
    if snap != _RUN["old"]:
        try:
            write_atomic(_RUN["path"], _dumps(snap))
        except OSError:
            pass
    if fast and snap["settled"]:
        return "nothing moved since the last run: every task is up to date\n"
    return None


def _stamp(rec):
    return [rec[0], rec[1]] if isinstance(rec, list) and len(rec) == 3 else None


def _dumps(obj):
    import json
    return json.dumps(obj)
