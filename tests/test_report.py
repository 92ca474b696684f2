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


def test_result_cache_follows_the_files_and_survives_a_bad_cache(tmp_path):
    import json
    import os

    from emitter.pipeline.report import build_rows
    res, status, cache = tmp_path / "r.json", tmp_path / "s.json", tmp_path / "cache.json"
    status.write_text('{"status": "ok"}')
    from emitter.pipeline.digests import check_digest
    digests = {"config": check_digest("float64", 1, None, None, None)}
    res.write_text(json.dumps({"verdict": "pass", "version": 2, "output": {"max_abs": 0.5},
                               "hashes": digests, "stages": [1] * 99}))
    entries = [{"name": "p", "source": "programs/p.logos", "status": str(status), "steps": 1,
                "weights": None, "checks": [("float64", str(res), None, None)]}]
    build = str(tmp_path / "build")
    first = build_rows(entries, str(cache), build)
    assert first[0]["verdict"] == "pass" and first[0]["output"]["max_abs"] == 0.5
    assert build_rows(entries, str(cache), build) == first    # from the cache: the same rows
    assert "stages" not in cache.read_text()                  # slim copies only
    res.write_text(json.dumps({"verdict": "fail", "version": 2, "output": {"max_abs": 7.0},
                               "hashes": digests}))
    os.utime(res, ns=(1, 1))                                  # a new stamp
    assert build_rows(entries, str(cache), build)[0]["verdict"] == "fail"
    for junk in ("[]", '{"version": 2, "entries": {"%s": 5}}' % res, "not json"):
        cache.write_text(junk)
        assert build_rows(entries, str(cache), build)[0]["output"]["max_abs"] == 7.0
