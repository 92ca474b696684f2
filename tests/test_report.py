"""The report's files hold any reason a program can produce: valid XML, one-line Markdown."""

import json
import xml.etree.ElementTree as ET

from emitter.pipeline.report import render_junit, render_summary

ROW = {"name": "bad\x01name", "source": "programs/x.logos", "check": "float64", "verdict": "error",
       "reason": "programs/x.logos:1: `Let \x01 be\r\n`: a sentence ends with a period",
       "first_divergence": None, "output": None, "result": None}


def test_control_characters_do_not_break_junit():
    root = ET.fromstring(render_junit([ROW]))
    case = root.find("testsuite").find("testcase")
    assert case.get("classname") == "bad name" and case.find("error") is not None
    assert "a sentence ends with a period" in case.find("error").get("message")


def test_summary_rows_stay_one_line():
    line = [l for l in render_summary([ROW]).splitlines() if l.startswith("| `bad")][0]
    assert "\r" not in line and "\x01" not in line and "a sentence ends with a period" in line


def test_summary_shows_program_text_as_text_never_as_markup():
    """A reason quoting a program's line is shown, not rendered: no image, link or HTML tag of a
    program's text reaches summary.md (a GitHub step summary renders Markdown and HTML)."""
    said = "Let y be silu of a|b<img src=https://evil.invalid/x.png>[link](https://evil.invalid) & <script>"
    line = [l for l in render_summary([{**ROW, "reason": said}]).splitlines() if l.startswith("| `bad")][0]
    assert "<img" not in line and "<script" not in line and "[link](" not in line and "a\\|b" in line
    assert "&lt;img src=https://evil.invalid/x.png&gt;\\[link\\](https://evil.invalid) &amp; &lt;script&gt;" in line


def test_result_cache_follows_the_files_and_survives_a_bad_cache(tmp_path, monkeypatch):
    import json
    import os

    from emitter.pipeline import keys
    from emitter.pipeline.checks import Check, Entry
    from emitter.pipeline.config import ProgramConfig
    from emitter.pipeline.report import build_rows
    res, status, caches = tmp_path / "r.json", tmp_path / "s.json", tmp_path / "cache"
    cache = caches / "p.json"   # (a file per program)
    status.write_text('{"status": "ok", "bundle": {}}')
    monkeypatch.setattr(keys, "check_parts", lambda *a: {"the": "inputs"})   # current, whatever they are
    monkeypatch.setattr(keys, "made_current", lambda *a: True)                # as its emit left it
    key = keys.check_key({"the": "inputs"})
    res.write_text(json.dumps({"verdict": "pass", "key": key, "output": {"max_abs": 0.5},
                               "stages": [1] * 99}))
    pc = ProgramConfig(name="p", source="programs/p.logos", config=None, weights=None,
                       dtypes=["float64"])
    entries = [Entry(pc, (), str(tmp_path / "b"), str(status), str(tmp_path / "l.json"), str(tmp_path),
                     (Check("float64", None, None, str(res), {}),))]
    first = build_rows(entries, str(caches), 1)
    assert first[0]["verdict"] == "pass" and first[0]["output"]["max_abs"] == 0.5
    assert build_rows(entries, str(caches), 1) == first        # from the cache: the same rows
    assert "stages" not in cache.read_text()                  # slim copies only
    res.write_text(json.dumps({"verdict": "fail", "key": key, "output": {"max_abs": 7.0}}))
    os.utime(res, ns=(1, 1))
    assert build_rows(entries, str(caches), 1)[0]["verdict"] == "fail"
    for junk in ("[]", '{"version": 2, "entries": {"%s": 5}}' % res, "not json"):
        cache.write_text(junk)
        assert build_rows(entries, str(caches), 1)[0]["output"]["max_abs"] == 7.0


def test_plot_points_sit_where_their_values_say():
    """report.html's plot, computed independently: x linear over the stages, y log10 between the
    decades around the data (the tolerance line at 1 inside), NaN left out, infinity at the top."""
    import math
    import re
    from emitter.pipeline import plot_svg as P
    svg = P.log_plot("p<1>", {"float64": [(0, 1e-3), (5, float("nan")), (10, 1.0)],
                              "float32": [(0, float("inf")), (10, 0.0)]}, "stage", "ratio")
    assert svg.startswith("<svg") and svg.endswith("</svg>") and "p&lt;1&gt;" in svg
    w, h = P.WIDTH - P.LEFT - P.RIGHT, P.HEIGHT - P.TOP - P.BOTTOM
    lo, hi = -12, 13                 # floor(log10 1e-12) .. ceil(log10 1e12 + 0.3)

    def at(x, y):
        return f"{P.LEFT + x / 10 * w:.1f},{P.TOP + (hi - math.log10(y)) / (hi - lo) * h:.1f}"
    lines = re.findall(r'<polyline points="([^"]+)" fill="none" stroke="([^"]+)"', svg)
    assert lines == [(f"{at(0, 1e12)} {at(10, 1e-12)}", P.COLOURS[0]),
                     (f"{at(0, 1e-3)} {at(10, 1.0)}", P.COLOURS[1])]
    mark = P.TOP + (hi - 0) / (hi - lo) * h
    assert f'y1="{mark:.1f}" x2="{P.LEFT + w}" y2="{mark:.1f}" stroke="#b00020"' in svg
    assert svg == P.log_plot("p<1>", {"float32": [(0, float("inf")), (10, 0.0)],
                                      "float64": [(0, 1e-3), (5, float("nan")), (10, 1.0)]},
                             "stage", "ratio")


def test_a_bf16_verdict_names_the_bound_its_worst_op_is_nearest_and_the_worst_deviation():
    from emitter.verify.verdict import describe
    r = {"verdict": "fail", "first_divergence": None,
         "worst": {"stage": 3, "out": "h", "op": "rmsnorm", "line": 9, "ratio": 2.5, "by": "deviation"},
         "bf16": {"worst_excess": {"excess": 1.2, "limit": 32.0, "out": "h", "op": "rmsnorm"},
                  "worst_deviation": {"deviation": 1.25, "out": "h"}, "bounds": {"deviation": 0.5},
                  "worst_z": {"z": 0.7, "out": "y"}, "min_cosine": {"cosine": 0.99999}, "ops_failing": 1},
         "output": {"max_abs": 1e-3, "guarded_rel": 1e-2, "cosine": 0.9999}}
    text = describe(r, 1000)
    assert "stage 3 `h = rmsnorm` (line 9) at 2.5× its deviation bound" in text
    assert "worst deviation 1.25 (bound 0.5) at `h`" in text and "1 op(s) failing" in text
    assert "worst 1−cos 1e-05" in text   # (a cosine of 0.99999 read as 1 would hide a failing one)
    assert "its tolerance" in describe({**r, "worst": {**r["worst"], "by": None}, "bf16": None}, 1000)


# a bf16 row as the lock writes smollm2's: the gate's furthest op at 0.25 of its excess bound, the
# token agreeing, its logits' guarded rel 10.8 (far past the flat tolerance, which decides nothing)
GATED = {"name": "m", "source": "programs/m.logos", "check": "bfloat16", "verdict": "pass", "reason": None,
         "first_divergence": None, "result": None, "tolerance": {"abs": 0.01, "rel": 0.02},
         "worst": {"stage": 264, "out": "u11", "op": "matmul", "line": 1797, "ratio": 1.0017 / 4.0, "by": "excess"},
         "output": {"integer": True, "integer_mismatches": 0, "pass": True, "max_abs": 0.0,
                    "feeding": {"out": "logits", "max_abs": 0.158, "guarded_rel": 10.8, "cosine": 0.99999}},
         "bf16": {"bounds": {"cosine": 0.999, "deviation": 0.5, "z": 6.0},
                  "worst_excess": {"excess": 1.0017, "limit": 4.0, "out": "u11", "op": "matmul"},
                  "worst_deviation": {"deviation": 0.0109, "out": "d29"}, "worst_z": {"z": 1.0012},
                  "min_cosine": {"cosine": 0.99997}, "ops_failing": 0}}


def test_the_bound_that_decides_a_bf16_check_is_named_with_its_figure():
    from emitter.verify.verdict import decided, decisive
    assert decided(decisive(GATED)) == ("0.25× its excess bound at stage 264 `u11 = matmul` (line 1797): "
                                        "excess 1, bound 4; output token agrees")
    dev = {**GATED, "verdict": "fail", "worst": {**GATED["worst"], "ratio": 1.25 / 0.5, "by": "deviation"},
           "bf16": {**GATED["bf16"], "worst_deviation": {"deviation": 1.25}, "ops_failing": 2}}
    assert decided(decisive(dev)) == ("decided by its deviation bound: 2.5× at stage 264 `u11 = matmul` "
                                      "(line 1797): deviation 1.25, bound 0.5; output token agrees")
    assert decided(decisive(dev), compact=True) == "2.5× deviation bound"
    cos = {**GATED, "verdict": "fail", "output": {"integer": False, "pass": False, "cosine": 0.99}}
    assert decided(decisive(cos)) == "decided by its output's cosine: 1−cos 0.01 (bound 0.001)"
    flat = {**GATED, "check": "float32", "bf16": None, "verdict": "fail",
            "worst": {"stage": 2, "out": "h", "op": "plus", "line": 4, "ratio": 3.0}}
    assert decided(decisive(flat)) == ("decided by its tolerance: 3× at stage 2 `h = plus` (line 4): abs 0.01, "
                                       "rel 0.02; output token agrees")
    assert decisive(ROW) is None and decisive({**GATED, "worst": None, "output": None}) is None


def test_a_bf16_row_in_the_page_marks_the_flat_figures_as_not_judged():
    from emitter.pipeline.report_html import _table
    row = _table([GATED], "p-m")
    assert "<td>0.25× its excess bound at stage 264 <code>u11 = matmul</code> (line 1797)" in row
    assert '<td class="info">10.8†</td>' in row and '<td class="info">0.158†</td>' in row


def test_junit_place_comes_from_the_op_or_the_reason():
    from emitter.pipeline.report import junit_place
    src = "programs/x.logos"
    err = {**ROW, "reason": "emit:x failed in this run: programs/x.logos:7: `Let y be q of x.`: unknown"}
    assert junit_place(err) == (src, 7)
    assert junit_place({**ROW, "reason": "the bundle's PRECISION says stage 3 `h = plus` (line 9) runs in"}) == (src, 9)
    assert junit_place({**ROW, "reason": "build/results/x/float64.json: refused: not current"}) == (src, None)
    assert junit_place({**ROW, "reason": "the module was stopped at stage 76 (m38 = matmul, line 80) in the probe "
                                         "pass of step 1: TimeLimit: the float32 lock check took over 2 s"}) == (src, 80)
    assert junit_place({**GATED, "first_divergence": {"line": 12}}) == ("programs/m.logos", 12)
    assert junit_place(GATED) == ("programs/m.logos", 1797)
    # a config's refusal is at its YAML line, the program's own config or the zoo's defaults
    for conf in ("programs/x.yaml", "programs/defaults.yaml"):
        assert junit_place({**ROW, "reason": f"{conf}:3: `steps`: must be a positive integer"}) == (conf, 3)
    # another file's line is not taken for the program's
    assert junit_place({**ROW, "reason": "weights/other.yaml:3: no (line 4)"}) == (src, 4)
    root = ET.fromstring(render_junit([{**err, "source": "programs/x.logos"}]))
    assert root.find("testsuite/testcase").get("line") == "7"
    conf = {**ROW, "reason": "programs/x.yaml:3: `steps`: must be a positive integer, got 0"}
    case = ET.fromstring(render_junit([conf])).find("testsuite/testcase")
    assert (case.get("file"), case.get("line")) == ("programs/x.yaml", "3")
    case = ET.fromstring(render_junit([conf], locate=False)).find("testsuite/testcase")
    assert case.find("error").text.startswith("programs/x.yaml:3: ")


def test_the_header_names_the_commit_of_a_git_zoo_and_a_reproducible_time(tmp_path, monkeypatch):
    import datetime
    import os
    import subprocess
    import time
    from emitter.pipeline.report_facts import context
    from emitter.pipeline.report_html import render
    assert context(str(tmp_path))["commit"] is None                  # not a git checkout
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.logos").write_text("Let x be a 1 by 1 tensor of Real.\n")
    subprocess.run([*git, "add", "a.logos"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    for epoch in ("99999999999999999999", "253402300800", "²", "abc"):   # no time here: the clock's
        monkeypatch.setenv("SOURCE_DATE_EPOCH", epoch)
        assert abs(datetime.datetime.strptime(context(str(tmp_path))["time"], "%Y-%m-%dT%H:%M:%S").replace(
            tzinfo=datetime.timezone.utc).timestamp() - time.time()) < 3600, epoch
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    c = context(str(tmp_path))
    assert c["commit"] == head and not c["dirty"]
    assert c["time"] == datetime.datetime.fromtimestamp(1700000000, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    page = render([GATED], None, c)
    assert f"commit <code>{head[:12]}</code> · 2023-11-14T22:13:20 UTC" in page
    # a page is about the run that made it: it never claims its verdicts are current now
    assert "as they are now" not in page and "<code>logos results</code> says whether each still is" in page
    (tmp_path / "build").mkdir()   # the zoo's build/ is the run's own, ignored by git or not
    (tmp_path / "build" / "x").write_text("x")
    assert not context(str(tmp_path))["dirty"]
    (tmp_path / ".gitignore").write_text("build/\n")   # what git ignores is no local change
    subprocess.run([*git, "add", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-qm", "i"], check=True)
    assert not context(str(tmp_path))["dirty"]
    (tmp_path / "b.logos").write_text("Let y be a 1 by 1 tensor of Real.\n")   # a new program: no commit's
    assert context(str(tmp_path))["dirty"]
    os.unlink(tmp_path / "b.logos")
    (tmp_path / "a.logos").write_text("changed\n")
    assert context(str(tmp_path))["dirty"]
    junit = ET.fromstring(render_junit([GATED], header=c))
    assert {p.get("name"): p.get("value") for p in junit.iter("property")}["commit"] == head


def test_plot_legend_sits_below_the_frame_and_bf16_is_drawn_last():
    import re
    from emitter.pipeline import plot_svg as P
    from emitter.pipeline.report_html import DTYPE_COLOURS, LABELS
    series = {LABELS["bfloat16"]: [(0, 0.5), (1, 0.9)], "float64": [(0, 0.5), (1, 0.9)], "float32": [(0, 0.5)]}
    svg = P.log_plot("p", series, "stage", "ratio", colours=DTYPE_COLOURS)
    strokes = re.findall(r'<polyline [^>]*stroke="([^"]+)"', svg)
    assert strokes == [DTYPE_COLOURS["float64"], DTYPE_COLOURS["float32"], DTYPE_COLOURS[LABELS["bfloat16"]]]
    assert svg.index('stroke-dasharray="5 3"/>') < svg.index("<polyline")   # the tolerance under the data
    frame_bottom = P.HEIGHT - P.BOTTOM
    legend = re.findall(r'<text x="[\d.]+" y="([\d.]+)">(float64|float32|bfloat16[^<]*|tolerance)</text>', svg)
    assert len(legend) == 4 and all(float(y) > frame_bottom + 20 for y, _ in legend)


def test_a_failed_task_of_no_program_is_neither_a_program_nor_a_check():
    """A dodo's own task that failed is a row of its own: counted among the errors, named as a
    failed task, never as a program or a check (report.json, summary.md, report.html)."""
    import json
    from emitter.pipeline.report import render_json
    from emitter.pipeline.report_html import render as render_html
    ok = {**ROW, "name": "a", "verdict": "pass", "reason": None}
    task = {**ROW, "name": "gen", "check": "task", "reason": "gen failed in this run: boom"}
    body = json.loads(render_json([ok, {**ok, "check": "float32"}, task]))
    assert (body["programs"], body["checks"], body["failed_tasks"]) == (1, 2, 1)
    assert body["counts"] == {"pass": 2, "fail": 0, "error": 1}
    head = "1 program, 2 checks and 1 failed task — 2 pass, 0 fail, 1 error"
    assert render_summary([ok, {**ok, "check": "float32"}, task]).splitlines()[0] == f"## ❌ LOGOS lock: {head}"
    assert f"<h1>LOGOS lock: {head}</h1>" in render_html([ok, {**ok, "check": "float32"}, task])
    bad = {**ok, "check": "float32", "verdict": "fail", "reason": "x"}
    assert "<h2>Did not pass: 0 checks and 1 failed task</h2>" in render_html([ok, task])
    assert "<h2>Did not pass: 1 check and 1 failed task</h2>" in render_html([ok, bad, task])
    assert "2 programs, 2 checks — 2 pass" in render_summary([ok, {**ok, "name": "b"}])


def test_the_report_formats_come_from_one_registry(tmp_path):
    """Each file of the registry is written by its renderer, set aside when a run starts and
    brought back, and its renderer's module is in the report's code (an edit of it remakes the
    report); nothing else names the files."""
    from emitter.pipeline import report, report_aside
    from emitter.pipeline.digests import code_files
    from emitter.pipeline.report_aside import REPORT_FORMATS
    assert set(report.formats()) == set(REPORT_FORMATS)
    assert {f"pipeline/{m}.py" for m, _ in REPORT_FORMATS.values()} <= set(code_files("report"))
    assert "pipeline/report_aside.py" not in code_files("lock")   # a new format moves no lock's key
    out = tmp_path / "build"
    report.write_reports([ROW], str(out))
    written = {f: (out / f).read_bytes() for f in REPORT_FORMATS}
    assert all(written.values())
    report_aside.set_aside(str(out))
    assert not any((out / f).exists() for f in REPORT_FORMATS)
    assert {f: (out / "stale" / f).read_bytes() for f in REPORT_FORMATS} == written
    report_aside.restore(str(out))
    assert {f: (out / f).read_bytes() for f in REPORT_FORMATS} == written
    # a format the last report wrote and the registry has dropped since: set aside and cleaned too
    status = json.loads((out / "status" / "report.json").read_text())
    status["files"]["old.md"] = "0" * 64
    status["files"]["../escape.md"] = "0" * 64   # (never a path out of build/, a folder or the history)
    for other in ("results.sqlite", "bundles", "bundles.json", ".fingerprints.json", "a\x00.md"):
        status["files"][other] = "0" * 64
    (out / "bundles.json").mkdir()
    (out / "results.sqlite").write_text("history\n")
    (out / "status" / "report.json").write_text(json.dumps(status))
    (out / "old.md").write_text("all pass\n")
    (tmp_path / "escape.md").write_text("mine\n")
    report_aside.set_aside(str(out))
    assert not (out / "old.md").exists() and (out / "stale" / "old.md").exists()
    from emitter.pipeline.actions import clean_report
    clean_report(str(out))
    assert not (out / "stale" / "old.md").exists() and (tmp_path / "escape.md").exists()
    assert (out / "results.sqlite").read_text() == "history\n" and (out / "bundles.json").is_dir()
    assert not any((out / f).exists() or (out / "stale" / f).exists() for f in REPORT_FORMATS)


def test_a_reason_cut_short_closes_the_quoted_piece_it_cuts():
    """A long reason is cut to one line; a `quoted` piece (set as code in report.html) cut open
    is closed, so the page shows no stray backtick."""
    from emitter.pipeline.report_html import _text
    from emitter.verify.verdict import short
    reason = "programs/bad.logos:3: unknown op in `Let y be frobnicate of x with many words after it`"
    cut = short(reason, 40)
    assert len(cut) <= 40 and cut.count("`") == 2 and cut.endswith("…`"), cut
    assert "`" not in _text(cut) and _text(cut).endswith("…</code>")
    assert short("no quote here at all, long enough", 10) == "no quote …"
    assert short("a" * 38 + "`xyz` more", 40) == "a" * 38 + "…"   # cut right after a quote opens


def test_the_commit_is_read_from_packed_refs_never_past_a_limit(tmp_path, monkeypatch):
    """A branch whose ref lives only in .git/packed-refs is read from there; a packed-refs file
    over its limit (one line of gigabytes, say) is not read whole: the commit is not told."""
    from emitter.pipeline import report_facts
    git = tmp_path / ".git"
    (git / "refs/heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text("# pack-refs with: peeled\n" + "1" * 40 + " refs/heads/other\n"
                                     + "2" * 40 + " refs/heads/main\n")
    assert report_facts.git_head(str(tmp_path)) == "2" * 40
    monkeypatch.setattr(report_facts, "PACKED_REFS_LIMIT", 64)
    assert report_facts.git_head(str(tmp_path)) is None
    (git / "refs/heads/main").write_text("3" * 40 + "\n")   # a loose ref wins
    assert report_facts.git_head(str(tmp_path)) == "3" * 40
