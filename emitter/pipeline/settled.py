"""The stat snapshot of a settled zoo, `build/.stamps.json`, renewed at the end of each run.

It serves two checks, both of them only ever leaving out work that doit would find up to date:

- per task (`begin`): a task whose stamped files did not move since a run last found it up to date
  or ran it needs no integrity check (`files_io.targets_intact`) this run;
- per run (`whole`): a plain `doit` (the default tasks, no options) that found every task it
  reached up to date, or ran it, also records what doit's checks read: each task's graph entry
  (file deps, targets, the tasks it names, `uptodate` arguments), the (mtime, size) of every file
  the tasks read, write or stamp, of the tasks' own code and of the dodo, the dependency DB and
  the environment. A later plain run hands doit only the tasks whose entry or files changed since,
  and what follows them (see `whole`); when nothing moved, the report task alone, so a no-op costs
  a stat per file instead of doit's work per task. A changed environment, DB or code: every task.

What is recorded is never a stat taken after the check it stands for: a file no task of the run
wrote counts as it was when the run began (doit checked it later, so a file edited meanwhile
differs from the record and the next run checks it), a file a task wrote counts as its action
stamped it right after writing (`files_io.stamp_targets`); a task that wrote files without stamps
leaves no record, and the next plain run hands doit every task.
"""

import hashlib
import os

from ..files import read_json, write_atomic

VERSION = 4
_RUN = {}   # this run's: the snapshot file, what it held, the stats taken at load, what `whole` saw


def stat(path):
    """[mtime_ns, size, ctime_ns, inode] of `path` (links followed), None when it cannot be
    stat'ed. The ctime is what no write can keep (`touch -r`, `cp -p` and a build's fixed times
    keep the mtime): an edit that keeps size and mtime still moves it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino]


def begin(snapshot, stamped):
    """Read `snapshot` and stat every stamped file; the names (of `stamped`: {name: [files]})
    whose files' stats differ from it, all of them when there is none."""
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


def _sha(text):
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def whole(key, specs, made, reads, named, shared, db):
    """Which tasks a plain run must hand doit: None for every task, else the names of those whose
    check could come out otherwise than in the last complete plain run (possibly none: the report
    alone then goes to doit). `key` (text): what every task depends on (the environment, doit);
    `specs` ({task: text}): each task's graph entry; `made`, `reads` ({task: [files]}): the files
    it writes and reads; `named` ({task: [task names]}): its task_dep, setup and calc_dep;
    `shared`: files every task depends on (the tasks' own code, the dodo); `db`: doit's
    dependency file. A task is handed when its entry is new or changed, a file of its own moved,
    or it follows one handed (reads what it writes, or names it); and what a handed task names,
    so doit knows every task it is given a name of. Call it only on a plain run."""
    if not _RUN:
        raise RuntimeError("settled.begin first")
    now = _RUN["now"]
    for group in (made, reads):
        for paths in group.values():
            for f in paths:
                if f not in now:
                    now[f] = stat(f)
    for f in shared:
        if f not in now:
            now[f] = stat(f)
    hashes = {t: _sha(text)[:16] for t, text in specs.items()}   # (64 bits: to see an edit)
    _RUN.update(key=_sha(key), specs=hashes, made=made, db=db, shared=list(shared), handed=None)
    v = _RUN["old"].get("verified")
    if not isinstance(v, dict) or v.get("key") != _RUN["key"] or v.get("db") != stat(db) \
            or not isinstance(v.get("stats"), dict) or not isinstance(v.get("specs"), dict):
        return None
    was, old_specs = v["stats"], v["specs"]
    if any(now[f] != was.get(f, False) for f in shared):
        return None
    redo = v.get("redo") if isinstance(v.get("redo"), list) else []
    if not all(isinstance(t, str) for t in redo):    # a damaged snapshot: every task, never a crash
        return None
    todo = [t for t in specs if old_specs.get(t) != hashes[t]
            or any(now[f] != was.get(f, False) for f in made[t])
            or any(now[f] != was.get(f, False) for f in reads[t])] + [t for t in redo if t in specs]
    handed = set()
    if todo:   # what follows a handed task: it reads a file that one writes, or names it
        maker = {f: t for t, fs in made.items() for f in fs}
        after = {}
        for t in specs:
            for u in {maker.get(f) for f in reads[t]} | set(named[t]):
                after.setdefault(u, []).append(t)
        while todo:
            t = todo.pop()
            if t not in handed:
                handed.add(t)
                todo.extend(after.get(t, ()))
        todo = [u for t in handed for u in named[t]]
        while todo:   # what a handed task names comes along (doit finds it up to date)
            u = todo.pop()
            if u not in handed and u in specs:
                handed.add(u)
                todo.extend(named[u])
    _RUN["handed"] = handed
    return handed


def handed():
    """What `whole` found: None (every task) or the tasks to hand doit beside the report."""
    return _RUN.get("handed")


def load_in_full():
    """The run loads every task after all (the dodo has creators that may use them)."""
    _RUN["handed"] = None


def settle(settled, uptodate=(), values=None, complete=False, redo=()):
    """After a run: the snapshot takes the stamped files of the tasks `settled` (found up to date,
    or run and succeeded): as they were at load for the tasks found up to date, as their action
    stamped them for the tasks that ran (`values`: {task: its doit values}); every other task keeps
    what it had, so a task this run did not check (not selected, failed) is checked next time.

    `complete`: a plain run that reached its end, where every task it reached was settled or is
    in `redo` (failed, not run because one before it failed, ignored). Then what the next plain
    run compares with is renewed: every file as this run checked it (see the module's doc), each
    task's graph entry, the dependency DB as doit left it, and `redo`, which the next plain run
    hands doit whatever moved. A plain run that is not complete drops it (the next one hands doit
    every task); other runs keep it (what they change, they change in files or in the DB). Returns
    a line for the run's output when doit was handed fewer tasks than the zoo has, else None."""
    if not _RUN:
        return None
    uptodate, values = set(uptodate), values or {}
    files, now = dict(_RUN["files"]), _RUN["now"]
    stats = dict(now)             # every file as this run checked it
    ok = "key" in _RUN and complete
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
                    stats[f] = _stamp(stamps[f])
                    ok = ok and stats[f] is not None
                else:   # a file the action did not stamp counts only if it removed it
                    stats[f] = None
                    ok = ok and stat(f) is None
    snap = {"version": VERSION, "files": files, "verified": _RUN["old"].get("verified")}
    if ok:
        snap["verified"] = {"key": _RUN["key"], "db": stat(_RUN["db"]), "specs": _RUN["specs"],
                            "stats": stats, "redo": sorted(redo)}
    elif "key" in _RUN:
        snap["verified"] = None
    if snap != _RUN["old"]:
        try:
            write_atomic(_RUN["path"], _dumps(snap))
        except OSError:
            pass
    handed = _RUN.get("handed")
    if handed is None or not ok:
        return None
    if not handed and not set(settled) - uptodate and not redo:
        return "nothing moved since the last run: every task is up to date\n"
    return (f"{len(handed | {'report'})} of {len(_RUN['specs'])} tasks handed to doit: the others "
            "did not move since the last run\n")


def _stamp(rec):
    """A target stamp (`files_io.stamp_targets`) as `stat` gives it."""
    return [rec[0], rec[1], rec[3], rec[4]] if isinstance(rec, list) and len(rec) == 5 else None


def _dumps(obj):
    import json
    return json.dumps(obj)
