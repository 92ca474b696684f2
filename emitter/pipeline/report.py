"""The zoo's report: build/report.json, build/junit.xml (one testcase per program and dtype, with the
program's file and line for GitHub's JUnit actions and GitLab), build/junit-jenkins.xml (the same
without them: the Jenkins xunit plugin's junit-10 schema has no file or line on a testcase and
skips a file that has them, as pytest's xunit2 family does), build/summary.md (a CI job summary)
and build/report.html. Failures come first, each with its first diverging op.

The rows are a function of the status and result files only; the headers add the commit, the
time (SOURCE_DATE_EPOCH, where set, makes it reproducible), the host and the environment."""

import os
import re
import xml.etree.ElementTree as ET

from ..files import json_lines, read_json, write_atomic, write_files
from ..verify.verdict import decided, decisive, describe, number, one_minus_cos, short
from ..fingerprint import sha256_or_none, sha256_text
from .keys import check_key, moved
from .report_aside import HELD, JUDGED, REPORT_FORMATS, STALE, appeared_since, changed_since, drop_aside
from .report_facts import context, counts, headline, tally, warnings

ORDER = {"fail": 0, "error": 1, "pass": 2}
_OUTPUT = ("max_abs", "max_rel", "guarded_rel", "nmse", "cosine", "argmax_agree", "integer",
           "integer_mismatches", "feeding", "pass", "worst_ratio")
_GATE = ("bounds", "worst_excess", "worst_deviation", "worst_z", "min_cosine", "ops_failing",
         "argmax_flips", "argmax_excused")   # the bf16 gate's summary, all the report shows
_HASHES = ("source", "bundle", "weights", "config", "code", "environment")
PROGRAM_TASKS = ("weights", "emit", "lock")   # a program's: one failing makes every check of it an error


def _slim(r):
    """What a row keeps of a RESULT.json (the report never needs its stages or steps)."""
    out = r.get("output") or None
    return {"verdict": r.get("verdict", "error"), "reason": r.get("reason"),
            "unmatched_weights": list(r.get("unmatched_weights") or [])[:50],
            "version": r.get("version"), "first_divergence": r.get("first_divergence"),
            "worst": r.get("worst"), "output": {k: out.get(k) for k in _OUTPUT if k in out} if out else None,
            "hashes": {k: (r.get("hashes") or {}).get(k) for k in _HASHES},
            "driver_environment": (r.get("execution") or {}).get("driver_environment"),
            "bf16": {k: r["bf16"].get(k) for k in _GATE} if isinstance(r.get("bf16"), dict) else None,
            "seconds": (r.get("timings") or {}).get("total_s"),
            "steps": r.get("steps"), "tolerance": r.get("tolerance"), "program": r.get("program"),
            "key": r.get("key"), "inputs": r.get("inputs"), "about": r.get("about"),
            **({"from_cache": True, "cache": r.get("cache")} if r.get("from_cache") else {})}


def _row(name, source, check, verdict, reason, path=None, **extra):
    return {"name": name, "source": source, "check": check, "verdict": verdict, "reason": reason,
            "first_divergence": None, "worst": None, "output": None, "seconds": None, "result": path, **extra}


def _elsewhere(r):
    """Where a verdict computed in another environment than the run's came from, or None."""
    h, env = r.get("hashes") or {}, r.get("driver_environment")
    if env and h.get("environment") and h["environment"] != env:
        return f"computed in another environment (digest {h['environment'][:12]}, this run's {env[:12]})"
    return None


def _check_rows(e, status, now, parts_now, written):
    """The rows of `e`'s checks from their result files: `now`, their keys now; `written`, the
    sha256 the lock status recorded of each result file (one edited since is not the lock's; with
    no record, the next run locks it again, as its key is all there is to go by)."""
    rows, refused = [], status.get("status") != "ok"
    for c in e.checks:
        r = read_json(c.result)
        r = r and _slim(r)
        if r is None or (refused and r["verdict"] == "error"):   # refused now: the emit says why
            reason = status.get("reason") if refused else f"{c.result}: not written (the lock did not run)"
            rows.append(_row(e.name, e.pc.source, c.dtype, "error", reason, c.result, current=False))
            continue
        r = {**_row(e.name, e.pc.source, c.dtype, r["verdict"], r["reason"], c.result), **r}
        inputs, about = r.pop("inputs", None), r.pop("about", None)
        as_written = c.dtype not in written or sha256_or_none(c.result) == written[c.dtype]
        r["current"] = as_written and bool(now.get(c.dtype)) and r.get("key") == now[c.dtype]
        if r["verdict"] == "error" and about != now.get(c.dtype):
            r["reason"] = (f"not current: recorded on inputs that have moved since (before this run's "
                           f"end, or after it; run doit to lock it again): {r['reason']}")
        if not r["current"] and r["verdict"] in ("pass", "fail"):
            if refused:
                why = f"the program has no bundle now ({status.get('reason')})"
            elif not r.get("key"):
                why = ("it was recorded under no key (by an older version, or its inputs moved "
                       "while it ran)")
            elif not as_written:
                why = "the file is not the one the lock wrote (it was edited or copied in since)"
            elif now.get(c.dtype) is None:
                why = "its program or bundle changed after its emit (during this run, or by hand)"
            else:
                stale = moved(inputs, parts_now[c.dtype])
                why = f"its {', '.join(stale)} {'differ' if len(stale) > 1 else 'differs'} from the inputs now"
            r.update(verdict="error", reason=f"{c.result}: refused: not current: {why}; run doit to lock it "
                     "again", **dict.fromkeys(("first_divergence", "worst", "output", "bf16", "seconds")))   # (void)
        note = _elsewhere(r)
        if note:
            r["environment_note"] = note
        rows.append(r)
    return rows


def make_report(entries, out_dir, threads, failures=None):
    """Every report format from each program's status and results, each check's currency judged by
    its key; fails the task (the run exits non-zero) where a check did not pass. `failures` ({task:
    message}): this run's failed tasks, their programs' checks errors saying so. Every program is
    judged again after the tasks ran (by the currency check just before, in this process, or here)."""
    from .guards import freeze_heap
    freeze_heap()
    from doit.exceptions import TaskFailed
    judged = JUDGED.pop(out_dir, None)
    rows, key = judged[2:] if not failures and judged and judged[:2] == (id(entries), threads) \
        else judge_rows(entries, out_dir, threads, failures)
    bad = [r for r in rows if r["verdict"] != "pass"]
    # only a report of every check passing is ever current: a failing one runs (and fails) again
    write_reports(rows, out_dir, os.path.join(out_dir, ".report-plots.json"),
                  key=None if bad or failures else key, threads=threads)
    if not rows:   # (a moved programs/ or a misplaced dodo must not read as a green run)
        return TaskFailed(f"no programs: {os.path.abspath('programs')}/ holds no NAME.logos: nothing was checked")
    if bad:
        names = ", ".join(f"{r['name']}[{r['check']}]={r['verdict']}" for r in bad[:10])
        more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
        return TaskFailed(f"{len(bad)} of {len(rows)} checks did not pass: {names}{more} "
                          f"(see {out_dir}/summary.md)")
    return True


def judge_rows(entries, out_dir, threads, failures=None):
    """(every check's row, the report key) as the inputs are now."""
    from .guards import began_ns
    from .keys import report_key
    key_rows = []
    rows = build_rows(entries, os.path.join(out_dir, ".report-cache"), threads, failures, key_rows,
                      began_ns())
    return rows, report_key(entries, threads, key_rows)


def build_rows(entries, cache_dir=None, threads=None, failures=None, key_rows=None, began=None):
    """One row per check: (program, dtype) for locked programs, (program, "emit") for the rest.

    `entries`: the run's `checks.Entry` records. A result recorded under another key than its
    inputs' now is refused as an error that names what moved (and `current` is false); so is
    every check of a program one of whose tasks failed in this run (`failures`: {task name:
    message}), and a failed task of no program is a row of its own. `cache_dir`, if given, keeps
    each program's rows between runs under the digest of its `keys.report_row` (what they are
    made of) and the report's code, a file per program (a rebuild after one edit reads each and
    rewrites one).
    `key_rows`, if given, gets each program's `keys.report_row` from the same reads. A config
    changed since the run `began` (ns, the file system's clock), after the run read it (a task
    of the dodo's own wrote it, an edit): its programs' checks are errors, not current."""
    from .spread import spread
    failures = dict(failures or {})
    changed = changed_since(entries, began)
    made = spread(lambda e: _program_rows(e, cache_dir, threads, failures, changed), entries, least=100)
    rows = [r for mine, _ in made for r in mine]
    if key_rows is not None:
        key_rows += [k for _, k in made]
    mine = {f"{t}:{e.name}" for e in entries for t in PROGRAM_TASKS}
    for task, message in sorted(failures.items()):
        if task != "report" and task not in mine:
            rows.append(_row(task, None, "task", "error", f"{task} failed in this run: {message}"))
    rows += [_row(name, src, "emit", "error", f"{src}: made during this run, after the run read the zoo: none "
                  "of its checks ran: run doit again", current=False) for name, src in appeared_since(entries, began)]
    rows.sort(key=lambda r: (ORDER.get(r["verdict"], 1), r["name"], r["check"]))
    return rows


def _program_rows(e, cache_dir, threads, failures, changed):
    """(the rows of `e`'s checks, its `keys.report_row`): see `build_rows`."""
    from .keys import current_parts, lock_records, made_current, report_row
    failed = [(t, failures[f"{t}:{e.name}"]) for t in PROGRAM_TASKS if f"{t}:{e.name}" in failures]
    edited = [changed[e.name]] if e.name in changed else []
    cache = cache_dir and not (failed or edited) and os.path.join(cache_dir, f"{e.name}.json")
    raw = read_json(e.status)
    status = raw or {"status": "error", "reason": f"{e.status}: not written (emit did not run)"}
    lock = read_json(e.lock_status)
    parts = current_parts(e, threads, status)
    now = {dt: p and check_key(p) for dt, p in parts.items()}
    made = made_current(e, raw or {})
    key_row = report_row(e, threads, raw or {}, lock, now, made)
    rows = _cached_rows(cache, key_row) if cache else None
    if rows is not None:
        return rows, key_row
    rows = []
    if not e.checks:
        ok = status.get("status") == "ok"
        rows.append(_row(e.name, e.pc.source, "emit", "pass" if ok else "error", status.get("reason"),
                         current=True))
    if not made:   # the program or bundle moved since its emit: no check of it is current
        now = dict.fromkeys(now)
    written = {dt: x.get("sha256") for dt, x in lock_records(lock).items()}
    rows += _check_rows(e, status, now, parts, written)
    if cache:
        _keep_rows(cache, key_row, rows)
    if failed:   # the first of its tasks to fail says why (the later ones waited for it)
        task, message = failed[0]
        for r in rows:
            r.update(verdict="error", reason=f"{task}:{e.name} failed in this run: {message}")
    for r in rows if edited else ():
        r.update(verdict="error", current=False, reason=f"{edited[0]}: changed during this run (written, made or "
                 "removed after the run read it: its checks are about the zoo as it was): run doit again")
    return rows, key_row


ROWS_VERSION = 8   # v8: a program's rows under its report row's digest


def _rows_key(key_row):
    from .digests import code, digest
    return digest([ROWS_VERSION, key_row, code("report")])


def _cached_rows(path, key_row):
    """The rows kept at `path` under `key_row`, or None (missing, damaged, or of other inputs)."""
    kept = read_json(path)
    if kept and kept.get("key") == _rows_key(key_row) and isinstance(kept.get("rows"), list) \
            and all(isinstance(r, dict) for r in kept["rows"]):
        return kept["rows"]
    return None


def _keep_rows(path, key_row, rows):
    """Best effort: a cache that cannot be written costs a rebuild of these rows, nothing more."""
    import json
    try:
        write_atomic(path, json.dumps({"key": _rows_key(key_row), "rows": rows}, allow_nan=True))
    except (OSError, TypeError, ValueError):
        pass


def render_json(rows, _plots=None, header=None):
    """(`header`: `threads`, the thread count each row's currency was judged at, where told.)"""
    programs, checks, tasks = tally(rows)
    body = {"schema": "logos.pipeline.report", "version": 2,
            **({"threads": header["threads"]} if (header or {}).get("threads") else {}),
            "programs": programs, "checks": checks, "failed_tasks": tasks, "counts": counts(rows),
            "failures": [dict(r, why=describe(r)) for r in rows if r["verdict"] != "pass"],
            "results": rows}
    return json_lines(body)   # a row per line: a diff of two reports reads row by row


def junit_place(r):
    """(file, line) a failing or erroring check points at: its first diverging op's line, its
    furthest op's, else the `file:line:` its reason names where the file is the program or its
    config (a config error is at its YAML line), else the `(line N)` of the program it names;
    the program and None where no line is known."""
    source = r.get("source")
    for s in (r.get("first_divergence"), r.get("worst")):
        if s and isinstance(s.get("line"), int):
            return source, s["line"]
    reason = str(r.get("reason") or "")
    if source:
        folder, stem = os.path.split(os.path.splitext(source)[0])
        files = (source, os.path.join(folder, f"{stem}.yaml"), os.path.join(folder, "defaults.yaml"))
        m = re.search("(" + "|".join(map(re.escape, files)) + r"):(\d+):", reason)
        if m:
            return m.group(1), int(m.group(2))
    m = re.search(r"[(,] ?line (\d+)", reason)   # `(line 9)`, `(m38 = matmul, line 80)`
    return source, int(m.group(1)) if m else None


def render_jenkins(rows, _plots=None, header=None):
    return render_junit(rows, header=header, locate=False)


def render_junit(rows, _plots=None, header=None, locate=True):
    """junit.xml: `locate` puts each testcase's `file` (and, on a failure or an error, `line`) on
    it, as GitHub's JUnit actions and GitLab read them; without (junit-jenkins.xml) it passes the
    Jenkins xunit plugin's junit-10 schema, the place in each message. `header`: `context()`'s."""
    header = header or context()
    c = counts(rows)
    total = sum(r.get("seconds") or 0 for r in rows)
    suite = ET.Element("testsuite", name="logos-lock", tests=str(len(rows)), failures=str(c["fail"]),
                       errors=str(c["error"]), skipped="0", time=f"{total:.3f}",
                       timestamp=header["time"], hostname=header["hostname"])
    props = ET.SubElement(suite, "properties")
    env = header["environment"]
    for name, value in (("commit", header["commit"]), ("environment", header["environment_digest"]),
                        ("threads", header.get("threads")),
                        ("python", env.get("python")), ("torch", env.get("torch")), ("numpy", env.get("numpy"))):
        if value:
            ET.SubElement(props, "property", name=name, value=str(value))
    for r in rows:
        case = ET.SubElement(suite, "testcase", classname=short(r["name"]), name=r["check"],
                             time=f"{r.get('seconds') or 0:.3f}")
        where, line = junit_place(r) if r["verdict"] != "pass" else (r["source"], None)
        if where and locate:
            case.set("file", where)
            if line is not None:
                case.set("line", str(line))
        if r["verdict"] != "pass":   # (a pass says nothing: its description is never made)
            text = describe(r)
            if not locate and where and not text.startswith(where):
                text = f"{where}{':' + str(line) if line else ''}: {text}"
            tag, kind = ("failure", "lock-fail") if r["verdict"] == "fail" else ("error", "lock-error")
            ET.SubElement(case, tag, message=text, type=kind).text = text
        said = [r.get("environment_note"), r.get("from_cache") and "taken from the verdict cache "
                f"{(r.get('cache') or {}).get('url')} (its time: the run's that computed it)"]
        if any(said):
            ET.SubElement(case, "system-out").text = "; ".join(x for x in said if x)
    root = ET.Element("testsuites", name="logos", tests=str(len(rows)), failures=str(c["fail"]),
                      errors=str(c["error"]), time=f"{total:.3f}")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


_MD = str.maketrans({"|": "\\|", "\\": "\\\\", "[": "\\[", "]": "\\]", "\n": " ", "\r": " ", "`": "'",
                     "<": "&lt;", ">": "&gt;", "&": "&amp;"})


def _md(text):
    """Text from programs and configs as Markdown shows it, and only as text: no table cell ends,
    no link, image or HTML tag starts (a GitHub step summary renders both; a bare URL it links
    as it would in any text)."""
    return str(text).translate(_MD)


def _code(text):
    """Text for inside a `code span` (where nothing but a backtick or a cell's end is markup)."""
    return str(text).replace("|", "\\|").replace("\n", " ").replace("\r", " ").replace("`", "'")


def render_summary(rows, _plots=None, header=None):
    c = counts(rows)
    mark = "✅" if rows and c["fail"] == c["error"] == 0 else "❌"
    out = [f"## {mark} LOGOS lock: {headline(rows)}", ""]
    if (header or {}).get("threads"):
        at = header.get("commit")   # (a report says when its currency was judged: `logos results` says now)
        at = f" as of commit {at[:12]}{' with local edits' if header.get('dirty') else ''}" if at else ""
        out += [f"Each pass or fail is current against its check's key at threads={header['threads']}{at}"
                f"{', ' + header['time'] + ' UTC' if header.get('time') else ''} (`logos results` says "
                "whether it still is).", ""]
    notes = warnings(rows)
    if notes:
        out += ["### Warnings", ""] + [f"- {_md(n)}" for n in notes] + [""]
    bad = [r for r in rows if r["verdict"] != "pass"]
    if bad:
        out += ["### Failures", "", "| program | check | verdict | why |", "|---|---|---|---|"]
        out += [f"| `{_code(short(r['name']))}` | {r['check']} | **{r['verdict']}** | {_md(describe(r))} |"
                for r in bad]
        out.append("")
    out += ["### All checks", "",
            "| program | check | verdict | worst stage | × its bound (bf16: the gate's) | output | max abs | guarded rel | 1−cos |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| `{_code(short(r['name']))}` | {r['check']} | {r['verdict']}"
                   f"{' (cached)' if r.get('from_cache') else ''}"
                   f"{' (' + _md(r['environment_note']) + ')' if r.get('environment_note') else ''} | "
                   + _figures(r))
    gated = [r for r in rows if r.get("bf16")]
    if gated:
        out += ["", "### bfloat16 gate (per op, against its own rounding floor)", "",
                "| program | verdict | worst excess (bound) | its op | worst \\|z\\| | worst 1−cos | ops failing |",
                "|---|---|---|---|---|---|---|"]
        for r in gated:
            g = r["bf16"]
            we, wz, mc = g.get("worst_excess") or {}, g.get("worst_z") or {}, g.get("min_cosine") or {}
            out.append(f"| `{_code(short(r['name']))}` | {r['verdict']} | {number(we.get('excess'))} "
                       f"({number(we.get('limit'))}) | {_md(we.get('out'))} = {_md(we.get('op'))} | "
                       f"{number(wz.get('z'))} | {number(one_minus_cos(mc))} | {g.get('ops_failing')} |")
    return "\n".join(out) + "\n"


def _figures(r):
    """The honest columns: the stage furthest from its tolerance and by how much, then the output's
    figures (an integer output: whether it agrees, beside the figures of the stage feeding it)."""
    w, o = r.get("worst") or {}, r.get("output") or {}
    stage = _md(f"{w['stage']} `{w['out']} = {w['op']}`") if w else ""
    shown = o
    if o.get("integer"):
        what = "token agrees" if not o.get("integer_mismatches") else "token DIFFERS"
        shown = o.get("feeding") or {}
        what += f"; `{_code(shown.get('out'))}`:" if shown else ""
    else:
        what = "tensor" if o else ""
    return (f"{stage} | {_md(decided(decisive(r), compact=True))} | {what} | {number(shown.get('max_abs'))} | "
            f"{number(shown.get('guarded_rel'))} | {number(one_minus_cos(shown) if shown else None)} |")


def formats():
    """The report's files, each with its renderer (rows, plots cache, header) -> text, as the
    registry (report_aside.REPORT_FORMATS) names them: a new format is one entry there."""
    import importlib
    return {f: getattr(importlib.import_module(f"{__package__}.{m}"), fn) for f, (m, fn) in REPORT_FORMATS.items()}


def write_reports(rows, out_dir, plots_cache=None, key=None, threads=None):
    """All the files (REPORT_FORMATS), each whole (staged, then renamed together), then the report's
    status: the key it was made under (None: never current), each file's sha256 and its rows'
    verdicts (name, check, verdict): what the run's last line counts without reading report.json.
    `threads`: the run's threads=, each row's currency judged at it; every file states it (to
    build/stale/ while the run holds its report until it ends: report_aside.HELD)."""
    header = {**context(os.path.dirname(os.path.abspath(out_dir))), "threads": threads}
    from .spread import spread
    renderers = formats()   # (each its own work: they share the cores; the plots cache is the page's)
    files = dict(zip(renderers, spread(lambda f: renderers[f](rows, plots_cache, header), renderers,
                                       least=1)))
    write_files(os.path.join(out_dir, STALE) if HELD else out_dir, files)
    drop_aside(out_dir, keep=files if HELD else ())
    write_files(os.path.join(out_dir, "status"), {"report.json": json_lines(
        {"key": key, "files": {f: sha256_text(t) for f, t in files.items()},
         "verdicts": [[r["name"], r["check"], r["verdict"]] for r in rows]})})
