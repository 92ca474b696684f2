"""The lock history: every lock run appended to an embedded SQLite DB (build/results.sqlite), and
`python -m emitter results` to read it — the latest verdict per program, or one program's runs so a
regression shows the run where it began.

SQLite because it ships with Python, takes concurrent appends from `doit -n N` workers (WAL and a
busy timeout) and is one file that a CI cache can carry.
"""

import argparse
import contextlib
import datetime
import json
import os
import sqlite3
import sys
import time

from .. import fingerprint
from ..files import read_json
from ..verify.threads import DEFAULT_THREADS, thread_count
from ..verify.verdict import number, short
from .guards import SUSPECT, corrupt

DEFAULT_DB = "build/results.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    name TEXT NOT NULL,
    dtype TEXT NOT NULL,
    steps INTEGER,
    verdict TEXT NOT NULL,
    reason TEXT,
    program TEXT,
    source_sha TEXT,
    bundle_sha TEXT,
    weights_sha TEXT,
    config_sha TEXT,
    max_abs REAL, max_rel REAL, nmse REAL, cosine REAL,
    first_stage INTEGER, first_out TEXT, first_op TEXT, first_line INTEGER,
    total_s REAL,
    result TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_name ON runs (name, dtype, id);
"""
# The schema's version (SQLite's user_version) and the columns each version added: a DB an older
# project wrote (a restored CI cache) is brought up to date; one a newer project wrote is refused.
VERSION = 3
_ADDED = {2: (("worst_stage", "TEXT"), ("worst_op", "TEXT"), ("worst_ratio", "REAL"),
              ("guarded_rel", "REAL"), ("code_sha", "TEXT"), ("env_sha", "TEXT")),
          3: (("key", "TEXT"), ("threads", "INTEGER"))}


class HistoryError(Exception):
    """A history DB this project cannot read (written by a newer version, or not a DB)."""


def _wal(con, seconds=60):
    """WAL mode: SQLite's switch to it does not wait for another connection's (a new DB opened by
    several locks at once), so it is tried again until it takes."""
    end = time.monotonic() + seconds
    while True:
        try:
            con.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > end:
                raise
            time.sleep(0.05)


def connect(db):
    os.makedirs(os.path.dirname(os.path.abspath(db)), exist_ok=True)
    con = sqlite3.connect(db, timeout=60)
    try:
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version > VERSION:
            raise HistoryError(f"{db}: written by a newer version of this project (history schema "
                               f"{version}; this one reads up to {VERSION}): use that version, or "
                               "move the file aside to start a new history")
        con.execute("PRAGMA synchronous=NORMAL")   # WAL stays consistent; a power cut may lose the last runs
        if version == VERSION:   # made by this version: WAL (kept in the file) and the schema are there
            return con
        _wal(con)
        # one writer makes or brings up the schema (several locks may open a new DB at once): the
        # version and columns are read again inside the write lock
        con.isolation_level = None
        con.execute("BEGIN IMMEDIATE")
        try:
            version = con.execute("PRAGMA user_version").fetchone()[0]
            for statement in (x for x in _SCHEMA.split(";") if x.strip()):
                con.execute(statement)
            have = {row[1] for row in con.execute("PRAGMA table_info(runs)")}
            for v in range(version + 1, VERSION + 1):
                for column, kind in _ADDED.get(v, ()):
                    if column not in have:
                        con.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
            con.execute(f"PRAGMA user_version = {VERSION}")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        finally:
            con.isolation_level = ""
    except sqlite3.DatabaseError as e:
        con.close()
        raise _unreadable(db, e) from e
    except HistoryError:
        con.close()
        raise
    return con


def _unreadable(db, e):
    """The error for sqlite3's `e` on `db`: a damaged file is flagged for the next run to set aside
    (`guards.history_lost`)."""
    if not corrupt(e):
        return HistoryError(f"{db}: not a history this project can read ({e}); if it stays so, move "
                            "it aside: the next `doit` makes it again from build/results/")
    with contextlib.suppress(OSError):
        open(db + SUSPECT, "a").close()
    return HistoryError(f"{db}: damaged ({e}); the next `doit` sets it aside and makes it again "
                        "from build/results/")


@contextlib.contextmanager
def _readable(db):
    try:
        yield
    except sqlite3.DatabaseError as e:
        raise _unreadable(db, e) from e


def _bundle_sha(hashes):
    b = hashes.get("bundle") or {}
    if not b:
        return None
    return "|".join(f"{k}={b[k]}" for k in sorted(b))


def refill(db, results):
    """A history that was deleted is made again from the result files build/ holds (`results`:
    their paths), so `logos results` has every check's last verdict once more."""
    if os.path.isfile(db) and os.path.getsize(db):
        return 0
    rs = [r for r in (read_json(p) for p in results) if isinstance(r, dict) and r.get("verdict")]
    try:
        if rs:
            record_all(db, rs)
    except HistoryError as e:
        from .log import LOG
        LOG.warning(f"warning: the history was not made again: {e}")
    return len(rs)


def record_all(db, rs, at=None):
    """Append RESULT.json dicts as runs, in one transaction (one commit per lock task, not per
    check); returns their ids."""
    at = at or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    con = connect(db)
    try:
        with con, _readable(db):
            return [con.execute(
                "INSERT INTO runs (at, name, dtype, steps, verdict, reason, program, source_sha, "
                "bundle_sha, weights_sha, config_sha, max_abs, max_rel, nmse, cosine, first_stage, "
                "first_out, first_op, first_line, total_s, result, worst_stage, worst_op, "
                "worst_ratio, guarded_rel, code_sha, env_sha, key, threads) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", _row(r, at)).lastrowid
                for r in rs]
    finally:
        con.close()


def _row(r, at):
    o = r.get("output") or {}
    if o.get("integer") and isinstance(o.get("feeding"), dict):   # a token: its logits' figures
        o = o["feeding"]
    f = r.get("first_divergence") or {}
    h = r.get("hashes") or {}
    w = r.get("worst") or {}
    return (at, r.get("name"), r.get("dtype"), r.get("steps"), r.get("verdict"), r.get("reason"),
            r.get("program"), h.get("source"), _bundle_sha(h), h.get("weights_manifest") or h.get("weights"),
            h.get("config"), o.get("max_abs"), o.get("max_rel"), o.get("nmse"), o.get("cosine"),
            f.get("stage"), f.get("out"), f.get("op"), f.get("line"),
            (r.get("timings") or {}).get("total_s"), json.dumps(r, sort_keys=True, allow_nan=True),
            None if w.get("stage") is None else str(w.get("stage")), w.get("op"), w.get("ratio"),
            o.get("guarded_rel"), h.get("code"), h.get("environment"), r.get("key"),
            (r.get("execution") or {}).get("threads"))


def latest(db):
    """The newest run per (program, dtype), sorted by program then dtype."""
    con = connect(db)
    try:
        con.row_factory = sqlite3.Row
        return [dict(x) for x in con.execute(
            "SELECT r.* FROM runs r JOIN (SELECT name, dtype, MAX(id) AS id FROM runs "
            "GROUP BY name, dtype) m ON r.id = m.id ORDER BY r.name, r.dtype")]
    finally:
        con.close()


def history(db, name):
    """Every run of one program, oldest first."""
    con = connect(db)
    try:
        con.row_factory = sqlite3.Row
        return [dict(x) for x in con.execute(
            "SELECT * FROM runs WHERE name = ? ORDER BY id", (name,))]
    finally:
        con.close()


def currency(rows, programs_dir, threads):
    """The zoo's checks now (the programs in `programs_dir`, its build/ beside it), each with its
    latest run in `rows` marked `current` when its recorded key is the key of its inputs as they
    are now, at `threads` (a run's `threads=`: what a `doit` with it would find), what the key
    takes from records is what is on disk (the program the emit read, its bundle, derived
    weights) and the check's result file is the one its lock wrote, under that key and verdict
    (an edited one, refilled into a deleted history, is not): the one rule the pipeline uses; a
    check with no run is a row of
    verdict `none`. Then the runs of programs the zoo no longer has (not current). A run of a
    check its program no longer has (a dtype dropped, `lock: false`) is in neither."""
    from .checks import entries
    from .config import discover
    from .keys import check_key, check_parts, lock_records, made_current
    here, runs, zoo, names = os.getcwd(), {(x["name"], x["dtype"]): x for x in rows}, [], set()
    try:
        os.chdir(os.path.dirname(os.path.abspath(programs_dir)))
        with fingerprint.reading(os.path.join("build", ".fingerprints.json")):   # the run's hashes
            for e in entries(discover(".", os.path.basename(programs_dir))):
                names.add(e.name)
                st = read_json(e.status) if e.checks else None
                made = bool(e.checks) and made_current(e, st)
                written = lock_records(read_json(e.lock_status)) if e.checks else {}
                for c in e.checks:
                    x = runs.get((e.name, c.dtype)) or _none(e.name, c.dtype)
                    parts = made and check_parts(e, c, st, threads)
                    mine = written.get(c.dtype, {})
                    x["current"] = bool(parts) and bool(x.get("key")) and x["key"] == check_key(parts) \
                        and mine.get("key") == x["key"] and mine.get("verdict") == x["verdict"] \
                        and fingerprint.sha256_or_none(c.result) == mine.get("sha256")   # as the lock wrote it
                    zoo.append(x)
    finally:
        os.chdir(here)
    gone = [{**x, "current": False} for x in rows if x["name"] not in names]
    return sorted(zoo, key=lambda x: (x["name"], x["dtype"])), gone


def _none(name, dtype):
    """The row of a check the zoo has and the history has no run of."""
    return {"id": None, "at": "-", "name": name, "dtype": dtype, "verdict": "none", "reason": None,
            "first_op": None, "max_abs": None, "worst_ratio": None, "source_sha": None,
            "weights_sha": None, "key": None}


def _row_line(x, mark=""):
    first = f" first: stage {x['first_stage']} `{x['first_out']} = {x['first_op']}` line " \
            f"{x['first_line']}" if x["first_op"] else ""
    why = f" ({short(x['reason'], 160)})" if x["verdict"] == "error" and x["reason"] else ""
    now = "" if x.get("current", True) else "NOT CURRENT "
    return (f"{mark}#{x['id'] or '-':<5} {x['at']}  {x['name']:<24} {x['dtype']:<8} {x['verdict']:<5} {now}"
            f"max_abs {number(x['max_abs']):<9} worst {number(x.get('worst_ratio')):<8}x tol "
            f"src {str(x['source_sha'] or '-')[:10]} w {str(x['weights_sha'] or '-')[:10]}{first}{why}")


def existing(programs_dir):
    """The names of the programs `programs_dir` holds now (as the zoo names them: a file whose name
    is no task name has the name a run gives it), or None when there is no such folder."""
    if not os.path.isdir(programs_dir):
        return None
    from .config import discover
    here = os.getcwd()
    try:
        os.chdir(os.path.dirname(os.path.abspath(programs_dir)))
        return {pc.name for pc in discover(".", os.path.basename(programs_dir))}
    finally:
        os.chdir(here)


def prune(db, keep):
    """Drop the history of every program not in `keep`; returns the names dropped."""
    con = connect(db)
    try:
        gone = sorted({r[0] for r in con.execute("SELECT DISTINCT name FROM runs")} - set(keep))
        with con:
            con.executemany("DELETE FROM runs WHERE name = ?", [(n,) for n in gone])
        return gone
    finally:
        con.close()


# a run's fields in --json (the latest verdicts add "current" after "verdict")
RUN_FIELDS = ("id", "at", "name", "dtype", "steps", "verdict", "reason", "max_abs", "guarded_rel",
              "worst_stage", "worst_op", "worst_ratio", "first_stage", "first_out", "first_op",
              "first_line", "source_sha", "weights_sha", "code_sha", "env_sha", "key")


def add_arguments(p):
    p.add_argument("--db", default=DEFAULT_DB, help=f"history DB (default {DEFAULT_DB})")
    p.add_argument("--programs", default="programs",
                   help="the zoo's programs folder: the latest verdicts cover the programs it holds "
                        "(default programs)")
    p.add_argument("--json", action="store_true",
                   help="the latest verdicts as JSON (one object: programs, checks, runs), for scripts")
    p.add_argument("--prune", action="store_true",
                   help="drop the history of programs that are no longer in --programs")
    p.add_argument("--history", metavar="NAME", help="every run of program NAME, oldest first")
    p.add_argument("--threads", type=_threads, default=DEFAULT_THREADS, metavar="N",
                   help=f"judge currency as `doit threads=N` would (default {DEFAULT_THREADS}, a "
                        "plain `doit`'s): the thread count is part of every check's key")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="only these programs (exit 1 if any of their checks does not pass, 2 if one "
                        "has no runs): `doit lock:NAME && python -m emitter results NAME` gates one")


def _threads(text):
    try:
        return thread_count(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(args):
    try:
        return _main(args)
    except sqlite3.DatabaseError as e:   # a page broken past what opening it reads
        print(_unreadable(args.db, e), file=sys.stderr)
        return 2
    except HistoryError as e:
        print(e, file=sys.stderr)
        return 2


def _main(args):
    if args.db == DEFAULT_DB and args.programs == "programs" and not os.path.isdir("programs"):
        from .zoo_cli import enter_zoo   # from a folder inside the zoo, as `logos doit`
        enter_zoo(who="logos results")
    if not os.path.isfile(args.db) or not os.path.getsize(args.db):   # (an emptied one: a run refills it)
        print(f"{args.db}: no lock history yet (run `doit`)", file=sys.stderr)
        return 2
    if args.history and args.names:
        print("`--history NAME` shows one program's runs: give no other NAME", file=sys.stderr)
        return 2
    if args.prune and (args.names or args.history or args.json):
        print("`--prune` drops the history of every program no longer in --programs: give no NAME, "
              "--history or --json", file=sys.stderr)
        return 2
    if args.prune:
        present = existing(args.programs)
        if present is None:
            print(f"{args.programs}: no such folder: nothing to prune against", file=sys.stderr)
            return 2
        gone = prune(args.db, present)
        print(f"pruned the history of {len(gone)} program(s) no longer in {args.programs}/"
              + (f": {', '.join(gone)}" if gone else ""))
        return 0
    if args.history:
        runs = history(args.db, args.history)
        if not runs:
            print(f"{args.db}: no runs of `{args.history}`", file=sys.stderr)
            return 2
        if args.json:   # every run, oldest first, with what the text rows show
            print(json.dumps({"name": args.history, "runs": [{k: x.get(k) for k in RUN_FIELDS} for x in runs]},
                             indent=1, allow_nan=True))
            return 0
        last = {}
        for x in runs:
            prev = last.get(x["dtype"])
            mark = "  "
            if prev is not None and prev == "pass" and x["verdict"] != "pass":
                mark = "! "   # the run where a regression began
            elif prev is not None and prev != "pass" and x["verdict"] == "pass":
                mark = "+ "   # fixed
            last[x["dtype"]] = x["verdict"]
            print(_row_line(x, mark))
        return 0
    rows = ran = latest(args.db)
    known = os.path.isdir(args.programs)   # else no verdict's currency can be told (exit 1 all the same)
    if known:   # the zoo's checks (a deleted program's only asked by name)
        zoo, gone = currency(rows, args.programs, args.threads)
        rows = zoo + gone if args.names else zoo
    if args.names:
        wanted = set(args.names)
        missing = sorted(wanted - {x["name"] for x in rows if x["id"] is not None})
        if missing:
            unchecked = {x["name"] for x in ran} - {x["name"] for x in rows}
            print(f"{args.db}: no runs of {', '.join(f'`{n}`' for n in missing)}" + (
                f" (runs of {', '.join(f'`{n}`' for n in sorted(unchecked & set(missing)))} are in the "
                "history, but the zoo locks it no more: `lock: false`)" if unchecked & set(missing) else ""),
                file=sys.stderr)
            return 2
        rows = [x for x in rows if x["name"] in wanted]
    bad = sum(1 for x in rows if x["verdict"] != "pass")
    stale = sum(1 for x in rows if not x.get("current", False))
    if args.json:
        print(json.dumps({"programs": len({x["name"] for x in rows}), "checks": len(rows),
                          "not_passing": bad, "not_current": stale if known else None,
                          "runs": [{k: x.get(k) for k in ("id", "at", "name", "dtype", "steps", "verdict",
                                                          "current", *RUN_FIELDS[6:])} for x in rows]},
                         indent=1, allow_nan=True))
        return 1 if bad or stale else 0
    for x in rows:
        print(_row_line(x))
    print(f"{len({x['name'] for x in rows})} programs, {len(rows)} checks, {bad} not passing, " + (
        f"{stale} not current (each verdict against the key of its inputs now, at threads="
        f"{args.threads})" if known else
        f"whether each is current is not known: no {args.programs}/ here (run it in the zoo)"))
    return 1 if bad or stale else 0
