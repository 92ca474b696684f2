"""The zoo's report: build/report.json, build/junit.xml (one testcase per program and dtype) and
build/summary.md (a CI job summary). Failures come first, each with its first diverging op.

The output is a function of the status and result files only (no clock, no host), so an unchanged
zoo gives byte-identical reports.
"""

import json
import os
import xml.etree.ElementTree as ET

from ..files import StampedCache, read_json, write_files
from ..verify.verdict import describe, number, short

ORDER = {"fail": 0, "error": 1, "pass": 2}


def _divergence(r):
    f = (r or {}).get("first_divergence")
    if not f:
        return None
    return {k: f.get(k) for k in ("step", "stage", "out", "op", "line", "max_abs", "max_rel", "nmse")}


def _slim(r):
    """What a row keeps of a RESULT.json (the report never needs its stages or steps)."""
    out = r.get("output") or None
    return {"verdict": r.get("verdict", "error"), "reason": r.get("reason"),
            "first_divergence": _divergence(r),
            "output": {k: out.get(k) for k in ("max_abs", "max_rel", "nmse", "cosine", "argmax_agree")}
            if out else None,
            "steps": r.get("steps"), "tolerance": r.get("tolerance"), "program": r.get("program")}


def _slim_result(cache, path):
    """The slim copy of one RESULT.json, from `cache` while the file's (mtime_ns, size) stay: a
    rebuild after one edit re-reads one program's results, not the zoo's."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = [st.st_mtime_ns, st.st_size]
    slim = cache.get(path, stamp)
    if slim is None:
        r = read_json(path)
        if r is None:
            return None
        slim = _slim(r)
        cache.put(path, stamp, slim)
    return slim


def _emit_status(path):
    return read_json(path) or {"status": "error", "reason": f"{path}: not written (emit did not run)"}


def build_rows(entries, cache_path=None):
    """One row per check: (program, dtype) for locked programs, (program, "emit") for the rest.

    `entries`: [{"name", "source", "status", "checks": [(dtype, result_path)]}]. `cache_path`, if
    given, keeps slim copies of the results between runs."""
    cache = StampedCache(cache_path, 1)
    rows = []
    for e in entries:
        status = None
        if not e["checks"]:
            status = _emit_status(e["status"])
            ok = status.get("status") == "ok"
            rows.append({"name": e["name"], "source": e["source"], "check": "emit",
                         "verdict": "pass" if ok else "error", "reason": status.get("reason"),
                         "first_divergence": None, "output": None, "result": None})
        for dtype, path in e["checks"]:
            r = _slim_result(cache, path)
            if r is None:
                status = status or _emit_status(e["status"])
                reason = status.get("reason") if status.get("status") != "ok" else \
                    f"{path}: not written (the lock did not run)"
                r = {"verdict": "error", "reason": reason, "first_divergence": None, "output": None,
                     "steps": None, "tolerance": None, "program": None}
            rows.append({"name": e["name"], "source": e["source"], "check": dtype, **r, "result": path})
    cache.save()
    rows.sort(key=lambda r: (ORDER.get(r["verdict"], 1), r["name"], r["check"]))
    return rows


def counts(rows):
    c = {"pass": 0, "fail": 0, "error": 0}
    for r in rows:
        c[r["verdict"]] = c.get(r["verdict"], 0) + 1
    return c


def render_json(rows):
    body = {"schema": "logos.pipeline.report", "version": 1,
            "programs": len({r["name"] for r in rows}), "checks": len(rows), "counts": counts(rows),
            "failures": [dict(r, why=describe(r)) for r in rows if r["verdict"] != "pass"],
            "results": rows}
    # one row per line: the C encoder serves each (indent= would fall back to the Python one,
    # seconds on a zoo of thousands), and a diff of two reports reads row by row
    def value(v):
        if isinstance(v, list) and v and isinstance(v[0], dict):
            return "[\n" + ",\n".join("  " + json.dumps(x, sort_keys=True, allow_nan=True)
                                       for x in v) + "\n ]"
        return json.dumps(v, sort_keys=True, allow_nan=True)
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {value(body[k])}" for k in sorted(body)) + "\n}\n"


def render_junit(rows):
    c = counts(rows)
    suite = ET.Element("testsuite", name="logos-lock", tests=str(len(rows)),
                       failures=str(c["fail"]), errors=str(c["error"]), skipped="0")
    for r in rows:
        case = ET.SubElement(suite, "testcase", classname=short(r["name"]), name=r["check"],
                             file=r["source"])
        if r["verdict"] == "fail":
            ET.SubElement(case, "failure", message=describe(r), type="lock-fail").text = describe(r)
        elif r["verdict"] != "pass":
            ET.SubElement(case, "error", message=describe(r), type="lock-error").text = describe(r)
    root = ET.Element("testsuites", name="logos", tests=str(len(rows)), failures=str(c["fail"]),
                      errors=str(c["error"]))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _md(text):
    return str(text).replace("|", "\\|").replace("\n", " ").replace("\r", " ").replace("`", "'")


def render_summary(rows):
    c = counts(rows)
    names = {r["name"] for r in rows}
    mark = "✅" if c["fail"] == c["error"] == 0 else "❌"
    out = [f"## {mark} LOGOS lock: {len(names)} programs, {len(rows)} checks — "
           f"{c['pass']} pass, {c['fail']} fail, {c['error']} error", ""]
    bad = [r for r in rows if r["verdict"] != "pass"]
    if bad:
        out += ["### Failures", "", "| program | check | verdict | why |", "|---|---|---|---|"]
        out += [f"| `{_md(short(r['name']))}` | {r['check']} | **{r['verdict']}** | {_md(describe(r))} |"
                for r in bad]
        out.append("")
    out += ["### All checks", "", "| program | check | verdict | max abs | max rel | cosine |",
            "|---|---|---|---|---|---|"]
    for r in rows:
        o = r["output"] or {}
        out.append(f"| `{_md(short(r['name']))}` | {r['check']} | {r['verdict']} | {number(o.get('max_abs'))} | "
                   f"{number(o.get('max_rel'))} | {number(o.get('cosine'))} |")
    return "\n".join(out) + "\n"


def write_reports(rows, out_dir):
    """All three files, each whole (staged, then renamed together)."""
    os.makedirs(out_dir, exist_ok=True)
    write_files(out_dir, {"report.json": render_json(rows), "junit.xml": render_junit(rows),
                          "summary.md": render_summary(rows)})
