"""The lock history: every lock run appended to an embedded SQLite DB (build/results.sqlite), read
by `logos results` (`results_cli.py`) and made again from the result files where it is lost.

SQLite because it ships with Python, takes concurrent appends from `doit -n N` workers (WAL and a
busy timeout) and is one file that a CI cache can carry.
"""

import contextlib
import datetime
import json
import os
import sqlite3
import time

from .. import fingerprint
from ..files import read_json, remove_whatever
from .guards import BEHIND, SUSPECT, corrupt, disk_failed

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
BUSY_S = 60   # how long a writer waits for a history another process holds
_BUSY = []    # (this process met the history held)
_ADDED = {2: (("worst_stage", "TEXT"), ("worst_op", "TEXT"), ("worst_ratio", "REAL"),
              ("guarded_rel", "REAL"), ("code_sha", "TEXT"), ("env_sha", "TEXT")),
          3: (("key", "TEXT"), ("threads", "INTEGER"))}


class HistoryError(Exception):
    """A history DB this project cannot read (written by a newer version, or not a DB)."""


class HistoryHeld(HistoryError):
    """A history another process holds past BUSY_S: it is behind (`behind`) until `catch_up`."""


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
    if os.path.lexists(db) and not os.path.isfile(db):
        raise _not_a_file(db)
    try:
        con = sqlite3.connect(db, timeout=1 if _BUSY else BUSY_S)   # (held once: no wait each lock)
    except sqlite3.Error as e:
        raise HistoryError(f"{db}: cannot be opened ({e})") from e
    with _or_closed(con, db):
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version > VERSION:
            raise _newer(db, version)
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
    return con


@contextlib.contextmanager
def _or_closed(con, db):
    """`con` closed where reading it as a history fails (sqlite's error said as the history's)."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        con.close()
        raise _unreadable(db, e) from e
    except HistoryError:
        con.close()
        raise


def reading(db):
    """A connection that only reads the history at `db`: a view (`logos results`) never makes the
    schema, switches a file to WAL or stamps a version (a --db naming another program's SQLite file
    leaves it as it was); a file that holds no history of runs is a HistoryError."""
    from urllib.parse import quote
    if os.path.lexists(db) and not os.path.isfile(db):
        raise _not_a_file(db)
    try:
        con = sqlite3.connect(f"file:{quote(os.fsencode(os.path.abspath(db)))}?mode=ro", uri=True, timeout=BUSY_S)
    except sqlite3.Error as e:
        raise _unreadable(db, e) from e
    with _or_closed(con, db):
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version > VERSION:
            raise _newer(db, version)
        have = {row[1] for row in con.execute("PRAGMA table_info(runs)")}
        if not {"id", "at", "name", "dtype", "verdict", "result"} <= have:
            raise HistoryError(f"{db}: not a lock history (no table of runs this project writes): "
                               f"point --db at a zoo's {DEFAULT_DB}")
    con.row_factory = sqlite3.Row
    return con


# every column a version added, None in a run an older version's history holds (read as it is)
_LATER = dict.fromkeys(c for added in _ADDED.values() for c, _ in added)


def _newer(db, version):
    return HistoryError(f"{db}: written by a newer version of this project (history schema {version}; "
                        f"this one reads up to {VERSION}): use that version, or move the file aside "
                        "to start a new history")


def _not_a_file(db):
    return HistoryError(f"{db}: not a file (a folder, or a link to nothing): move it aside; the next "
                        "`doit` makes the history again from build/results/")


def _unreadable(db, e):
    """The error for sqlite3's `e` on `db`: a damaged file is flagged for the next run to set aside
    (`guards.history_lost`)."""
    if disk_failed(e):
        return HistoryError(f"{db}: could not be written or read ({e}): is the disk full? The "
                            f"verdicts stand in build/results/; with the history removed ({os.path.basename(db)} "
                            "and its -wal and -shm files beside it), the next `doit` makes it again from there")
    folder = os.path.dirname(os.path.abspath(db))
    if "unable to open" in str(e) and not os.access(folder, os.W_OK):
        return HistoryError(f"{db}: cannot be opened: {folder} is not writable (a reader of the "
                            "history writes its WAL files beside it); the history itself is as it was")
    if "locked" in str(e) or "busy" in str(e):
        _BUSY.append(time.monotonic())
        return HistoryHeld(f"{db}: held by another process ({e}): the verdicts stand in "
                           "build/results/; the next `doit` adds their rows")
    if not corrupt(e):
        return HistoryError(f"{db}: not a history this project can read ({e}); if it stays so, move "
                            "it aside: the next `doit` makes it again from build/results/")
    with contextlib.suppress(OSError):
        open(db + SUSPECT, "a").close()
    return HistoryError(f"{db}: not a history this project can read: damaged ({e}); the next `doit` "
                        "sets it aside and makes it again from build/results/")


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


def behind(db):
    """The marker beside the history `db` that a lock's rows did not go in (the history was held)."""
    return db + BEHIND


def catch_up(db, entries):
    """Where the history is behind (`behind(db)`): each check of `entries` whose result file is
    the one its lock wrote and whose newest row is not that result gets that result as its newest
    row (in the order of the zoo), then the marker goes; a history that cannot take them yet keeps
    it. Only the lock's own result files are read: nothing kept in between to go stale."""
    if not os.path.exists(behind(db)):
        return
    from .keys import lock_records
    try:
        newest = {(x["name"], x["dtype"]): x for x in latest(db)}
        add = []
        for e in entries:
            wrote = lock_records(read_json(e.lock_status))
            for c in e.checks:
                r, x = read_json(c.result), newest.get((e.name, c.dtype)) or {}
                if r and r.get("verdict") and fingerprint.sha256_or_none(c.result) == \
                        (wrote.get(c.dtype) or {}).get("sha256") and (x.get("key"), x.get("verdict")) != \
                        (r.get("key"), r.get("verdict")):
                    add.append(r)
        record_all(db, add)
        remove_whatever(behind(db))
    except (HistoryError, OSError) as e:
        from .log import LOG
        LOG.warning(f"warning: the history is behind its results and was not brought up to date: {e}")


def record_all(db, rs, at=None):
    """Append RESULT.json dicts as runs, in one transaction (one commit per lock task, not per
    check); returns their ids."""
    at = at or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    con = connect(db)
    try:
        with _readable(db), con:   # (the commit, at the end of `con`, may fail too: a full disk)
            return [con.execute(f"INSERT INTO runs ({', '.join(_COLUMNS)}) VALUES "
                                f"({','.join('?' * len(_COLUMNS))})", _row(r, at)).lastrowid for r in rs]
    finally:
        con.close()


_COLUMNS = ("at", "name", "dtype", "steps", "verdict", "reason", "program", "source_sha", "bundle_sha",
            "weights_sha", "config_sha", "max_abs", "max_rel", "nmse", "cosine", "first_stage", "first_out",
            "first_op", "first_line", "total_s", "result", "worst_stage", "worst_op", "worst_ratio",
            "guarded_rel", "code_sha", "env_sha", "key", "threads")   # (what _row gives, in order)


def _as_recorded(row, result):
    """Whether the history's `row` holds what the result file `result` records, every column (its
    figures too: a row edited with its key and verdict kept is not that result; SQLite keeps a
    NaN as NULL)."""
    norm = lambda v: None if isinstance(v, float) and v != v else v   # noqa: E731
    return isinstance(result, dict) and all(norm(row.get(k)) == norm(v)
                                            for k, v in zip(_COLUMNS, _row(result, row.get("at"))))


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
    con = reading(db)
    try:
        return [{**_LATER, **x} for x in con.execute(
            "SELECT r.* FROM runs r JOIN (SELECT name, dtype, MAX(id) AS id FROM runs "
            "GROUP BY name, dtype) m ON r.id = m.id ORDER BY r.name, r.dtype")]
    finally:
        con.close()


def history(db, name):
    """Every run of one program, oldest first."""
    con = reading(db)
    try:
        return [{**_LATER, **x} for x in con.execute(
            "SELECT * FROM runs WHERE name = ? ORDER BY id", (name,))]
    finally:
        con.close()


def currency(rows, programs_dir, threads):
    """The zoo's checks now (the programs in `programs_dir`, its build/ beside it), each with its
    latest run in `rows` marked `current` when its recorded key is the key of its inputs as they
    are now, at `threads` (a run's `threads=`: what a `doit` with it would find), what the key
    takes from records is what is on disk (the program the emit read, its bundle, derived
    weights) and the check's result file is the one its lock wrote, under that key and verdict
    (an edited one, refilled into a deleted history, is not), with golden/ as that lock settled
    it: the one rule the pipeline uses; a
    check with no run is a row of
    verdict `none`. Then the runs of programs the zoo no longer has (not current). A run of a
    check its program no longer has (a dtype dropped, `lock: false`) is in neither."""
    from .checks import entries
    from .config import discover
    from .digests import env
    from .keys import check_key, check_parts, golden_as_recorded, lock_records, made_current
    here, runs, zoo, names = os.getcwd(), {(x["name"], x["dtype"]): x for x in rows}, [], set()
    try:
        os.chdir(os.path.dirname(os.path.abspath(programs_dir)))
        with fingerprint.reading(os.path.join("build", ".fingerprints.json")):   # the run's hashes
            for e in entries(discover(".", os.path.basename(programs_dir))):
                names.add(e.name)
                st = read_json(e.status) if e.checks else None
                made = bool(e.checks) and made_current(e, st)
                lock = read_json(e.lock_status) if e.checks else None
                written = lock_records(lock if isinstance(lock, dict) else None)
                # golden/ as the lock settled it, where it settled one (a plain doit locks again
                # to settle it where it was edited; a run that took every verdict from a cache
                # settles none)
                settled = lock.get("golden") if isinstance(lock, dict) else None
                golden = not (isinstance(settled, dict) and settled.get("golden.json")) or \
                    golden_as_recorded(e.bundle, settled)
                for c in e.checks:
                    x = runs.get((e.name, c.dtype)) or _none(e.name, c.dtype)
                    parts = made and check_parts(e, c, st, threads)
                    mine = written.get(c.dtype, {})
                    key = parts and check_key(parts)
                    written_now = bool(key) and mine.get("key") == key \
                        and fingerprint.sha256_or_none(c.result) == mine.get("sha256")   # as the lock wrote it
                    result = read_json(c.result) if written_now else None   # (read once: as the lock wrote it)
                    same = x.get("key") == key and mine.get("verdict") == x["verdict"] and \
                        (not written_now or _as_recorded(x, result))
                    x["current"] = written_now and same and golden
                    # the result on disk is current, the history's newest row of it is not that result
                    x["history_differs"] = written_now and not same and x.get("id") is not None
                    # computed in another environment than the key names (a Dask worker elsewhere)
                    x["elsewhere"] = bool(x.get("env_sha")) and x["env_sha"] != env()
                    # taken from the shared verdict cache (signed, under this key), not computed here
                    x["from_cache"] = x["current"] and bool((result or {}).get("from_cache"))
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
