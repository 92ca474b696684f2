"""`logos results` (`python -m emitter results`): the latest verdict per program, each marked
current or not against the key of its inputs now, or one program's runs, so a regression shows
the run where it began. The history itself is `results.py`."""

import argparse
import json
import os
import sqlite3
import sys

from ..verify.threads import DEFAULT_THREADS, thread_count
from ..verify.verdict import number, short
from .results import DEFAULT_DB, HistoryError, _not_a_file, _unreadable, currency, history, latest, prune


def _row_line(x, mark=""):
    first = f" first: stage {x['first_stage']} `{x['first_out']} = {x['first_op']}` line " \
            f"{x['first_line']}" if x["first_op"] else ""
    why = f" ({short(x['reason'], 160)})" if x["verdict"] == "error" and x["reason"] else ""
    if x.get("history_differs") and x.get("latest", True):
        why += (" (its result in build/results/ is current; this history row is not that result: "
                "where the history was held during a run the next `doit` adds the result's row, "
                "else remove the history and `doit` fills it again from the results)")
    now = ("NOT CURRENT " if x.get("current") is False and x.get("latest", True) else "") + (
        f"(computed in another environment, env {str(x['env_sha'])[:10]}) " if x.get("elsewhere") else "") + (
        "(from the cache) " if x.get("from_cache") else "")
    return (f"{mark}#{x['id'] or '-':<5} {x['at']}  {x['name']:<24} {x['dtype']:<8} {x['verdict']:<5} {now}"
            f"max_abs {number(x['max_abs']):<9} worst {number(x.get('worst_ratio')):<8}x tol "
            f"src {str(x['source_sha'] or '-')[:10]} w {str(x['weights_sha'] or '-')[:10]}{first}{why}")


def _history_currency(runs, args):
    """Mark each of one program's `runs` `latest` (the newest of its check) and `current` (that
    newest run is the check's verdict under the key of its inputs now; an older run never is),
    or `current` None where no zoo is here to tell; whether it could be told."""
    newest = {}
    for x in runs:
        newest[x["dtype"]] = x
    known = os.path.isdir(args.programs)
    now = {}
    if known:
        zoo, _ = currency([dict(x) for x in newest.values()], args.programs, args.threads)
        now = {x["dtype"]: x for x in zoo if x["name"] == args.history}
    for x in runs:
        x["latest"] = newest[x["dtype"]] is x
        judged = now.get(x["dtype"], {}) if x["latest"] else {}
        x["current"] = bool(judged.get("current")) if known else None
        x["history_differs"] = bool(judged.get("history_differs"))
    return known


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
                   help="only these programs (exit 1 if any of their checks does not pass or is not "
                        "current, 2 if one has no runs): `doit lock:NAME && python -m emitter results "
                        "NAME` gates one")


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
    if os.path.lexists(args.db) and not os.path.isfile(args.db):
        raise _not_a_file(args.db)
    if not os.path.isfile(args.db) or not os.path.getsize(args.db):   # (an emptied one: a run refills it)
        run = "doit" if os.path.isfile("dodo.py") else "logos doit"
        print(f"{args.db}: no lock history yet (run `{run}`)", file=sys.stderr)
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
        known = _history_currency(runs, args)
        if args.json:   # every run, oldest first, with what the text rows show
            print(json.dumps({"name": args.history, "runs": [
                {k: x.get(k) for k in (*RUN_FIELDS, "latest", "current", "history_differs")} for x in runs]},
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
        latest_runs = sorted((x for x in runs if x["latest"]), key=lambda x: x["dtype"])
        print(f"{len(runs)} runs of `{args.history}`; the latest of each check: " + (", ".join(
            f"{x['dtype']} {x['verdict']} ({'current' if x['current'] else 'NOT CURRENT'})" for x in latest_runs)
            + f" (against the key of its inputs now, at threads={args.threads})" if known else
            ", ".join(f"{x['dtype']} {x['verdict']}" for x in latest_runs)
            + f"; whether each is current is not known: no {args.programs}/ here (run it in the zoo)"))
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
                                                          "current", "elsewhere", "from_cache", "history_differs",
                                                          *RUN_FIELDS[6:])}
                                   for x in rows]},
                         indent=1, allow_nan=True))
        return 1 if bad or stale else 0
    for x in rows:
        print(_row_line(x))
    elsewhere = sum(1 for x in rows if x.get("elsewhere"))
    cached = sum(1 for x in rows if x.get("from_cache"))
    print(f"{len({x['name'] for x in rows})} programs, {len(rows)} checks, {bad} not passing, " + (
        f"{elsewhere} computed in another environment than this checkout's, " if elsewhere else "") + (
        f"{cached} taken from the verdict cache, " if cached else "") + (
        f"{stale} not current (each verdict against the key of its inputs now, at threads="
        f"{args.threads})" if known else
        f"whether each is current is not known: no {args.programs}/ here (run it in the zoo)"))
    return 1 if bad or stale else 0
