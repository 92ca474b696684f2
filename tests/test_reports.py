"""The reports people and CI tools read, built by real doit over a zoo with a passing, a failing and a
refused program: junit.xml against the project's strict JUnit schema (tests/data/junit.xsd) with
the `file` and `line` GitHub's JUnit actions and GitLab read, junit-jenkins.xml against the Jenkins
xunit plugin's own junit-10 schema (tests/data/jenkins-junit-10.xsd), both validated by lxml;
report.html as one self-contained page that headless Chromium (Debian's `chromium`, installed by
`setup.sh --tests`) renders, here and for a synthetic zoo of 1,000 passing programs."""

import datetime
import re
import shutil
import socket
import subprocess
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from lxml import etree

from conftest import DATA
from report_zoo import FLAGS, pdf_pages, synthetic_rows
from test_pipeline import PROG_A, PROG_B, _weights, doit, make_zoo

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REFUSED = PROG_B + "Let z be selective scan of y.\n"


def _line(source, sentence):
    return next(i for i, text in enumerate(source.splitlines(), 1) if text.startswith(sentence))


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    z = make_zoo(tmp_path_factory.mktemp("reports") / "zoo", {
        "good": (PROG_A, None), "tight": (PROG_A, "tolerances: {float32: {abs: 0, rel: 0}}\n"),
        "refused": (REFUSED, None)})
    for name in ("good", "tight"):
        _weights(z / "weights" / name / "w.f64", 0)
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0, tzinfo=None)
    rc, _, out = doit(z)
    assert rc == 1, out
    return z, before


def _schema(name):
    return etree.XMLSchema(etree.parse(f"{DATA}/{name}"))


def _cases(path):
    return {(c.get("classname"), c.get("name")): c for c in ET.parse(path).getroot().iter("testcase")}


def test_junit_passes_a_strict_schema_and_locates_each_failure_and_error(zoo):
    z, before = zoo
    schema = _schema("junit.xsd")
    doc = etree.parse(str(z / "build/junit.xml"))
    assert schema.validate(doc), schema.error_log
    cases = _cases(z / "build/junit.xml")
    assert len(cases) == 6 and all(c.get("time") for c in cases.values())
    assert all(c.get("file") == f"programs/{n}.logos" for (n, _), c in cases.items())
    matmul, scan = _line(PROG_A, "Let h be x matmul w."), _line(REFUSED, "Let z be selective scan of y.")
    lines = {k: c.get("line") for k, c in cases.items()}
    assert lines == {("tight", "float32"): str(matmul), ("refused", "float32"): str(scan),
                     ("refused", "float64"): str(scan), ("good", "float32"): None,
                     ("good", "float64"): None, ("tight", "float64"): None}   # where it failed, only
    assert cases["tight", "float32"].find("failure") is not None
    assert all(cases["refused", d].find("error") is not None for d in ("float32", "float64"))
    suite = ET.parse(z / "build/junit.xml").getroot().find("testsuite")
    stamp = datetime.datetime.strptime(suite.get("timestamp"), "%Y-%m-%dT%H:%M:%S")
    assert before <= stamp <= datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    assert suite.get("hostname") == socket.gethostname()


def test_junit_for_jenkins_passes_the_xunit_plugins_junit_10_schema(zoo):
    """The xunit plugin validates a JUnit report against its junit-10.xsd and skips one that fails;
    that schema has no `file` or `line` on a testcase, so junit.xml differs from it by those two
    attributes exactly, and junit-jenkins.xml (the same cases, the place in each message) passes."""
    z, _ = zoo
    jenkins = _schema("jenkins-junit-10.xsd")
    assert jenkins.validate(etree.parse(str(z / "build/junit-jenkins.xml"))), jenkins.error_log
    assert not jenkins.validate(etree.parse(str(z / "build/junit.xml")))
    assert {re.search(r"attribute '(\w+)'", e.message).group(1) for e in jenkins.error_log} == {"file", "line"}
    located, plain = _cases(z / "build/junit.xml"), _cases(z / "build/junit-jenkins.xml")
    assert located.keys() == plain.keys()
    assert all(c.get("file") is None and c.get("line") is None for c in plain.values())
    fail = plain["tight", "float32"].find("failure")
    assert fail.get("message").startswith(f"programs/tight.logos:{_line(PROG_A, 'Let h be x matmul w.')}: ")
    assert plain["refused", "float32"].find("error").get("message").startswith("programs/refused.logos:")
    suite = ET.parse(z / "build/junit-jenkins.xml").getroot().find("testsuite")
    assert suite.get("timestamp") and suite.get("hostname") == socket.gethostname()


def test_report_html_has_a_header_contents_anchors_and_folds_what_passed(zoo):
    from emitter.verify import environment
    z, _ = zoo
    page = (z / "build/report.html").read_text()
    assert "<script" not in page.lower() and "`" not in page            # no literal markup
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page, re.I)   # nothing to fetch
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert "commit" not in page                                          # the zoo is no git checkout
    assert "1 is at the bound" in page and "† Not judged" not in page   # no bf16 check here
    assert f"<code>{environment.digest(environment.fingerprint())[:12]}</code>" in page
    assert f"on <code>{socket.gethostname()}</code>" in page
    assert "<tr><td>float32</td><td>1</td><td>1</td><td>1</td>" in page  # pass, fail, error
    targets = re.findall(r'<a href="#([^"]+)">', page)
    assert sorted(targets) == ["p-refused-float32", "p-refused-float64", "p-tight-float32"]
    assert all(page.count(f'id="{t}"') == 1 for t in targets)
    assert page.index('id="p-tight"') < page.index("Passed: 1 programs") < page.index('<details id="p-good">')
    row = re.search(r'<tr id="p-tight-float32">(.*?)</tr>', page).group(1)
    line = _line(PROG_A, "Let h be x matmul w.")
    assert f"decided by its tolerance: inf× at stage 0 <code>h = matmul</code> (line {line}): abs 0, rel 0" in row
    assert f"stage 0 <code>h = matmul</code> (line {line}, step 1): max abs" in row   # the first diverging op
    assert page.count("<svg") == 2                                       # a plot per locked program
    good = page[page.index('<details id="p-good">'):]
    assert "<svg" in good[:good.index("</details>")]                    # folded with its figures


def test_headless_chromium_renders_the_report(zoo, tmp_path):
    assert CHROMIUM, "Chromium renders the report: `bash setup.sh --tests` installs it (Debian's chromium)"
    z, _ = zoo
    url = (z / "build/report.html").as_uri()
    dom = subprocess.run([CHROMIUM, *FLAGS, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0 and "<h1>LOGOS lock: 3 programs, 6 checks" in dom.stdout, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") == 2 and "first diverging op" in dom.stdout
    assert _screenshot(url, tmp_path / "report.png").std() > 0.05        # text and plots, not blank


def _screenshot(url, shot):
    subprocess.run([CHROMIUM, *FLAGS, "--window-size=1000,1600", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120, check=True)
    from PIL import Image
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float64) / 255
    assert pixels.shape == (1600, 1000, 3)
    return pixels


def test_chromium_renders_1000_passing_programs_as_a_short_page(tmp_path):
    """1,000 passing programs (3,000 checks, keyed and read as the pipeline does) are one line each:
    Chromium lays the page out on at most 40 printed pages (a section per program took 137)."""
    assert CHROMIUM, "Chromium renders the report: `bash setup.sh --tests` installs it (Debian's chromium)"
    from emitter.pipeline.report import write_reports
    rows = synthetic_rows(str(tmp_path / "zoo"), 1000)
    assert len(rows) == 3000 and all(r["verdict"] == "pass" and r["current"] for r in rows)
    write_reports(rows, str(tmp_path / "build"), str(tmp_path / "plots.json"))
    page = tmp_path / "build/report.html"
    text = page.read_text()
    assert text.count("<details ") == 1000 and "<nav>" not in text and "Passed: 1000 programs" in text
    assert text.count("× excess bound</span>") == 1000 and page.stat().st_size < 1_500_000
    assert text.count("† Not judged") == 1                               # said once, not per program
    dom = subprocess.run([CHROMIUM, *FLAGS, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=300)
    assert dom.returncode == 0 and dom.stdout.count("<details ") == 1000, dom.stderr[-2000:]
    assert _screenshot(page.as_uri(), tmp_path / "1000.png").std() > 0.05
    pdf = tmp_path / "1000.pdf"
    subprocess.run([CHROMIUM, *FLAGS, "--no-pdf-header-footer", f"--print-to-pdf={pdf}", page.as_uri()],
                   capture_output=True, timeout=300, check=True)
    assert 10 <= pdf_pages(pdf) <= 40
