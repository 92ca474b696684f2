"""build/report.html: one self-contained page (no network, no JavaScript: it reads in a CI artifact
viewer or an e-mail) that stays short for a zoo of thousands. A header (commit, time, host,
environment, counts), a table of contents of the checks that did not pass, those programs in full
(each check with an anchor, the bound that decided it and its first diverging op, a plot), then
each passing program as one line whose figures and plot fold out of a <details>.

The plot of a program draws each stage's error as a ratio of its tolerance (log scale, the
tolerance at 1), one line per dtype, as inline SVG (plot_svg.py). Plots are cached by their result
files' stamps, so a rebuild after one edit draws one program's plot; a zoo of more than MAX_PLOTS
programs plots only those that did not pass.
"""

import hashlib
import html
import json
import re

from ..files import StampedCache, read_json
from .plot_svg import log_plot
from .report_facts import context, headline, warnings
from ..fingerprint import sha256_or_none
from ..verify.verdict import decided, decisive, number, one_minus_cos, short, where

MAX_PLOTS = 200
# a dtype's line in the plots: its label (bf16's figures against the flat tolerance decide nothing)
# and colour, in drawing order (bf16 last: on top)
LABELS = {"bfloat16": "bfloat16 (not judged by tolerance)"}
DTYPE_COLOURS = {"float64": "#2ca02c", "float32": "#ff7f0e", LABELS["bfloat16"]: "#1f77b4"}
_STYLE = """body{font-family:sans-serif;margin:1em;color:#222;font-size:14px}
table{border-collapse:collapse}.wide{overflow-x:auto;max-width:100%}
td,th{border:1px solid #ccc;padding:2px 5px;font-size:13px;text-align:left;vertical-align:top}
.pass{color:#176f2c}.fail,.error{color:#b00020;font-weight:bold}.info{color:#777}
h1{font-size:20px}h2{font-size:17px;margin:1em 0 .3em}h3{font-size:15px;margin:.8em 0 .2em}
.meta{margin:.2em 0;color:#444}code{font-size:12px;background:#f3f3f3;padding:0 2px}
details{border-bottom:1px solid #eee}summary{cursor:pointer;white-space:nowrap;overflow:hidden;
text-overflow:ellipsis;padding:1px 0}summary b{display:inline-block;min-width:14em}
summary span{margin-right:1.2em;font-size:13px}details>div{margin:.3em 0 .6em 1.2em}
svg{max-width:100%;height:auto}nav li{margin:.1em 0}"""
_NOTE = "A figure N× a bound is that share of it: 1 is at the bound, above it fails."
_NOTE_BF16 = ("† Not judged: under the bf16 gate each op is judged against its rounding floor by its "
              "own bounds (the one it came nearest is named) and the output by its cosine (a token by "
              "the logits' noise); max abs and guarded rel are shown for reference only.")


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
            out[LABELS.get(dtype, dtype)] = stages
    return out


def _stamp(paths):
    """The plots' stamp: the result files' contents, by the one fingerprint rule."""
    h = hashlib.sha256()
    for _, p in paths:
        h.update(f"{p}:{sha256_or_none(p) or '-'};".encode())
    return h.hexdigest()


def _text(text):
    """Escaped text, a `quoted` piece (the verdicts' own markup) set as <code>."""
    return re.sub(r"`([^`\n]+)`", r"<code>\1</code>", html.escape(str(text)))


def _anchors(names):
    """A stable, unique id per program: its name with what an id or URL mangles replaced."""
    ids, taken = {}, set()
    for name in names:
        base = "p-" + re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80]
        anchor, n = base, 1
        while anchor in taken:
            n += 1
            anchor = f"{base}-{n}"
        ids[name] = anchor
        taken.add(anchor)
    return ids


def _first(r):
    """The first diverging op: where, and by how much."""
    f = r.get("first_divergence")
    if not f:
        return ""
    text = f"{where(f)}: max abs {number(f.get('max_abs'))}"
    if not r.get("bf16") and f.get("worst_ratio") is not None:
        text += f", {number(f.get('worst_ratio'))}× tolerance"
    return text


def _table(checks, anchor):
    """A program's checks: the verdict, the bound that decided it and how far, the first diverging
    op, the output's figures (under the bf16 gate marked †: shown, not judged), why; a column no
    check fills is left out (a passing program's table is its figures only)."""
    first = [_first(r) for r in checks]
    why = ["; ".join(x for x in (r.get("reason") if r["verdict"] == "error" else None, r.get("environment_note"))
                     if x) for r in checks]
    cols = ["check", "verdict", "decided by"] + (["first diverging op"] if any(first) else []) + \
        ["output max abs", "guarded rel", "1−cos"] + (["why"] if any(why) else [])
    out = ['<div class="wide"><table><tr>' + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"]
    for r, f, y in zip(checks, first, why):
        o = r.get("output") or {}
        shown = (o.get("feeding") or {}) if o.get("integer") else o
        mark, info = ("†", "info") if r.get("bf16") else ("", "")
        rid = f' id="{anchor}-{html.escape(r["check"])}"' if r["verdict"] != "pass" else ""
        cells = [(html.escape(r["check"]), ""), (r["verdict"] + (" (cached)" if r.get("from_cache") else ""),
                                                 r["verdict"]), (_text(decided(decisive(r))), "")]
        cells += [(_text(f), "")] if any(first) else []
        cells += [(f"{number(shown.get('max_abs'))}{mark}", info), (f"{number(shown.get('guarded_rel'))}{mark}", info),
                  (number(one_minus_cos(shown) if shown else None), "")]
        cells += [(_text(short(y, 600)), "")] if any(why) else []
        out.append(f"<tr{rid}>" + "".join(f'<td class="{c}">{t}</td>' if c else f"<td>{t}</td>"
                                          for t, c in cells) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def _plot(name, checks, cache):
    paths = [(r["check"], r["result"]) for r in checks if r.get("result")]
    if not paths:
        return ""
    key, stamp = json.dumps(paths), _stamp(paths)
    svg = cache.get(key, stamp)
    if svg is None:
        series = _series(paths)
        svg = _svg(name, series) if series else ""
        cache.put(key, stamp, svg)
    return svg


def _header(rows, header):
    env = header["environment"]
    out = [f"<header><h1>LOGOS lock: {html.escape(headline(rows))}</h1>"]
    when = f"{html.escape(header['time'])} UTC on <code>{html.escape(header['hostname'])}</code>"
    if header.get("commit"):
        dirty = " (files changed or added since)" if header.get("dirty") else ""
        out.append(f'<p class="meta">commit <code>{html.escape(header["commit"][:12])}</code>{dirty} · {when}</p>')
    else:
        out.append(f'<p class="meta">{when}</p>')
    threads = ", ".join(f"{k}={v}" for k, v in sorted((env.get("thread_env") or {}).items()))
    parts = [f"Python {env.get('python')}", f"torch {env.get('torch') or '-'}", f"numpy {env.get('numpy') or '-'}",
             f"{env.get('machine')} {env.get('system')} {env.get('isa')}", f"{env.get('cpu_count')} CPUs", threads,
             f"currency judged at threads={header['threads']}" if header.get("threads") else ""]
    out.append(f'<p class="meta">environment <code>{header["environment_digest"][:12]}</code>: '
               f"{html.escape(', '.join(p for p in parts if p))}</p>")
    kinds = {}
    for r in rows:
        k = kinds.setdefault(r["check"], {"pass": 0, "fail": 0, "error": 0, "cached": 0, "elsewhere": 0})
        k[r["verdict"]] = k.get(r["verdict"], 0) + 1
        k["cached"] += bool(r.get("from_cache"))
        k["elsewhere"] += bool(r.get("environment_note"))
    out.append('<div class="wide"><table><tr><th>check</th><th>pass</th><th>fail</th><th>error</th>'
               "<th>from the cache</th><th>computed in another environment</th></tr>")
    out += [f"<tr><td>{html.escape(name)}</td><td>{k['pass']}</td><td>{k['fail']}</td><td>{k['error']}</td>"
            f"<td>{k['cached']}</td><td>{k['elsewhere']}</td></tr>" for name, k in sorted(kinds.items())]
    out.append('</table></div><p class="meta">Every pass or fail on this page was current when the page '
               "was made (at the time above): recorded under the key of its inputs as they were "
               "then; <code>logos results</code> says whether each still is. A verdict whose inputs had "
               "moved is shown as an error that says what moved.</p>")
    gated = any(r.get("bf16") for r in rows)
    out.append(f'<p class="meta">{_NOTE}{" " + _NOTE_BF16 if gated else ""}</p></header>')
    return out


def render(rows, cache_path=None, header=None):
    """The page, from the report's rows (failures first, as the rows are sorted); `header`:
    report.context()'s (taken here when not given)."""
    header = header or context()
    cache = StampedCache(cache_path, 3)   # 3: the legend below the frame
    programs = {}
    for r in rows:
        programs.setdefault(r["name"], []).append(r)
    anchors = _anchors(programs)
    plot_all = len(programs) <= MAX_PLOTS
    bad = {n: cs for n, cs in programs.items() if any(r["verdict"] != "pass" for r in cs)}
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           "<title>LOGOS lock report</title>", f"<style>{_STYLE}</style></head><body>"]
    out += _header(rows, header)
    notes = warnings(rows)
    if notes:
        out.append('<section class="warnings"><h2>Warnings</h2><ul>'
                   + "".join(f"<li>{_text(n)}</li>" for n in notes) + "</ul></section>")
    if bad:
        bad_checks = sum(r["verdict"] != "pass" and r["check"] != "task" for r in rows)
        tasks = sum(r["check"] == "task" for r in rows)   # (a failed task of no program is no check)
        out.append(f'<nav><h2>Did not pass: {bad_checks} check{"s" * (bad_checks != 1)}'
                   f'{f" and {tasks} failed task" + "s" * (tasks != 1) if tasks else ""}</h2><ol>')
        for name, checks in bad.items():
            for r in checks:
                if r["verdict"] != "pass":
                    what = decided(decisive(r), compact=True) or short(r.get("reason") or "", 160)
                    out.append(f'<li><a href="#{anchors[name]}-{html.escape(r["check"])}">{html.escape(name)} · '
                               f'{html.escape(r["check"])}</a> <span class="{r["verdict"]}">{r["verdict"]}</span>'
                               f" {_text(what)}</li>")
        out.append("</ol></nav><h2>Failures and errors</h2>")
    for name, checks in bad.items():
        source = checks[0].get("source")
        out.append(f'<section id="{anchors[name]}"><h3>{html.escape(name)}'
                   f"{' <small>' + html.escape(source) + '</small>' if source else ''}</h3>")
        out.append(_table(checks, anchors[name]))
        out.append(_plot(name, checks, cache))
        out.append("</section>")
    passed = [n for n in programs if n not in bad]
    if passed:
        out.append(f"<h2>Passed: {len(passed)} programs</h2>")
        if not plot_all:
            out.append(f'<p class="meta">Over {MAX_PLOTS} programs: plots are drawn for the programs '
                       "that did not pass only.</p>")
    for name in passed:
        checks = programs[name]
        line = "".join(f'<span>{html.escape(r["check"])}{" (cached)" if r.get("from_cache") else ""} '
                       f"{_text(decided(decisive(r), compact=True))}</span>" for r in checks)
        out.append(f'<details id="{anchors[name]}"><summary><b>{html.escape(name)}</b>{line}</summary><div>')
        out.append(_table(checks, anchors[name]))
        if plot_all:
            out.append(_plot(name, checks, cache))
        out.append("</div></details>")
    out.append("</body></html>")
    cache.save()
    return "\n".join(x for x in out if x) + "\n"
