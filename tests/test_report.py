"""The report's files hold any reason a program can produce: valid XML, one-line Markdown."""

import xml.etree.ElementTree as ET

from emitter.report import render_junit, render_summary

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
