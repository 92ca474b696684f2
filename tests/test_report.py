"""The report's files hold any reason a program can produce: valid XML, one-line Markdown."""

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


def test_result_cache_follows_the_files_and_survives_a_bad_cache(tmp_path, monkeypatch):
    import json
    import os

    from emitter.pipeline import keys
    from emitter.pipeline.checks import Check, Entry
    from emitter.pipeline.config import ProgramConfig
    from emitter.pipeline.report import build_rows
    res, status, cache = tmp_path / "r.json", tmp_path / "s.json", tmp_path / "cache.json"
    status.write_text('{"status": "ok", "bundle": {}}')
    monkeypatch.setattr(keys, "check_parts", lambda *a: {"the": "inputs"})   # current, whatever they are
    key = keys.check_key({"the": "inputs"})
    res.write_text(json.dumps({"verdict": "pass", "key": key, "output": {"max_abs": 0.5},
                               "stages": [1] * 99}))
    pc = ProgramConfig(name="p", source="programs/p.logos", config=None, weights=None,
                       weights_required=False, dtypes=["float64"])
    entries = [Entry(pc, (), str(tmp_path / "b"), str(status), str(tmp_path / "l.json"), str(tmp_path),
                     (Check("float64", None, None, str(res), {}),))]
    first = build_rows(entries, str(cache), 1)
    assert first[0]["verdict"] == "pass" and first[0]["output"]["max_abs"] == 0.5
    assert build_rows(entries, str(cache), 1) == first        # from the cache: the same rows
    assert "stages" not in cache.read_text()                  # slim copies only
    res.write_text(json.dumps({"verdict": "fail", "key": key, "output": {"max_abs": 7.0}}))
    os.utime(res, ns=(1, 1))
    assert build_rows(entries, str(cache), 1)[0]["verdict"] == "fail"
    for junk in ("[]", '{"version": 2, "entries": {"%s": 5}}' % res, "not json"):
        cache.write_text(junk)
        assert build_rows(entries, str(cache), 1)[0]["output"]["max_abs"] == 7.0


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
    assert "its tolerance" in describe({**r, "worst": {**r["worst"], "by": None}, "bf16": None}, 1000)
