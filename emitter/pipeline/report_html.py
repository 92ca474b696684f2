"""build/report.html: one self-contained page (no network, no JavaScript: it reads in a CI artifact
viewer or an e-mail), failures first, with a plot per program of each stage's error as a ratio of
its tolerance (log scale, the tolerance drawn at 1), one line per dtype, drawn as inline SVG
(plot_svg.py). Plots are cached by their result files' stamps, so a rebuild after one edit
draws one program's plot; a zoo of more than MAX_PLOTS programs plots only those that did not pass.
"""

import hashlib
import html
import json

from ..files import StampedCache, read_json
from .plot_svg import log_plot
from ..fingerprint import sha256_or_none
from ..verify.verdict import describe, number, one_minus_cos

MAX_PLOTS = 200
DTYPE_COLOURS = {"float64": "#2ca02c", "float32": "#ff7f0e", "bfloat16": "#1f77b4"}
_STYLE = """body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px;text-align:left;vertical-align:top}
.pass{color:#176f2c}.fail,.error{color:#b00020;font-weight:bold}section{margin:1.2em 0}
h2{font-size:17px;margin:0.3em 0}svg{max-width:100%;height:auto}"""


def _svg(name, series):
    """The plot of one program: {dtype: [(stage index, ratio to tolerance)]} as SVG text."""
    return log_plot(name, series, "stage", "error / tolerance", colours=DTYPE_COLOURS)


def _series(paths):
    out = {}
    for dtype, path in paths:
        r = read_json(path) or {}
        stages = [(s["stage"], s.get("worst_ratio") or 0.0) for s in r.get("stages") or []
                  if isinstance(s.get("stage"), int)]
        if stages:
            out[dtype] = stages
    return out


def _stamp(paths):
    """The plots' stamp: the result files' contents, by the one fingerprint rule."""
    h = hashlib.sha256()
    for _, p in paths:
        h.update(f"{p}:{sha256_or_none(p) or '-'};".encode())
    return h.hexdigest()


def _why(r):
    why = describe(r) if r["verdict"] != "pass" else ""
    note = r.get("environment_note")
    return f"{why} ({note})" if why and note else (note or why)


def render(rows, cache_path=None):
    """The page, from the report's rows (failures first, as the rows are sorted)."""
    cache = StampedCache(cache_path, 2)   # 2: drawn by plot_svg
    programs = {}
    for r in rows:
        programs.setdefault(r["name"], []).append(r)
    plot_all = len(programs) <= MAX_PLOTS
    c = {"pass": 0, "fail": 0, "error": 0}
    for r in rows:
        c[r["verdict"]] = c.get(r["verdict"], 0) + 1
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           "<title>LOGOS lock report</title>", f"<style>{_STYLE}</style></head><body>",
           f"<h1>LOGOS lock: {len(programs)} programs, {len(rows)} checks — {c['pass']} pass, "
           f"{c['fail']} fail, {c['error']} error</h1>"]
    if not plot_all:
        out.append(f"<p>Over {MAX_PLOTS} programs: plots are drawn for the programs that did not pass.</p>")
    for name, checks in programs.items():
        bad = any(r["verdict"] != "pass" for r in checks)
        out.append(f"<section><h2>{html.escape(name)}</h2><table><tr><th>check</th><th>verdict</th>"
                   "<th>worst stage</th><th>× tolerance</th><th>max abs</th><th>guarded rel</th>"
                   "<th>1−cos</th><th>why</th></tr>")
        for r in checks:
            w, o = r.get("worst") or {}, r.get("output") or {}
            shown = (o.get("feeding") or {}) if o.get("integer") else o
            stage = f"{w['stage']} `{w['out']} = {w['op']}`" if w else ""
            out.append(
                f"<tr><td>{html.escape(r['check'])}</td><td class=\"{r['verdict']}\">{r['verdict']}</td>"
                f"<td>{html.escape(stage)}</td>"
                f"<td>{number(w.get('ratio'))}</td><td>{number(shown.get('max_abs'))}</td>"
                f"<td>{number(shown.get('guarded_rel'))}</td>"
                f"<td>{number(one_minus_cos(shown) if shown else None)}</td>"
                f"<td>{html.escape(_why(r))}</td></tr>")
        out.append("</table>")
        paths = [(r["check"], r["result"]) for r in checks if r.get("result")]
        if paths and (plot_all or bad):
            key, stamp = json.dumps(paths), _stamp(paths)
            svg = cache.get(key, stamp)
            if svg is None:
                series = _series(paths)
                svg = _svg(name, series) if series else ""
                cache.put(key, stamp, svg)
            out.append(svg)
        out.append("</section>")
    out.append("</body></html>")
    cache.save()
    return "\n".join(out) + "\n"
