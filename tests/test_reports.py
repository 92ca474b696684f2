"""The reports people and CI tools read: junit.xml against a strict JUnit schema (tests/data/junit.xsd),
report.html as one self-contained page that headless Chromium (Debian's `chromium`, installed by
`setup.sh --tests`) renders, built by real doit over a zoo with a passing and a failing program."""

import re
import shutil
import subprocess

import numpy as np
import pytest
import xmlschema

from conftest import DATA
from test_pipeline import PROG_A, PROG_B, _weights, doit, make_zoo

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    z = make_zoo(tmp_path_factory.mktemp("reports") / "zoo", {
        "good": (PROG_A, None), "tight": (PROG_A, "tolerances: {float32: {abs: 0, rel: 0}}\n"),
        "refused": (PROG_B + "Let z be selective scan of y.\n", None)})
    for name in ("good", "tight"):
        _weights(z / "weights" / name / "w.f64", 0)
    rc, _, out = doit(z)
    assert rc == 1, out
    return z


def test_junit_passes_a_strict_schema_with_times_files_and_lines(zoo):
    xmlschema.XMLSchema(str(DATA + "/junit.xsd")).validate(str(zoo / "build/junit.xml"))
    text = (zoo / "build/junit.xml").read_text()
    cases = re.findall(r"<testcase [^>]*>", text)
    assert len(cases) == 6 and all(' time="' in c for c in cases)
    fail = [c for c in cases if 'classname="tight"' in c and 'name="float32"' in c][0]
    assert 'file="programs/tight.logos"' in fail and 'line="5"' in fail   # `Let h be x matmul w.`
    assert text.count("<failure ") == 1 and text.count("<error ") == 2


def test_report_html_is_self_contained_and_failures_come_first(zoo):
    page = (zoo / "build/report.html").read_text()
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page, re.I)   # nothing to fetch
    assert page.index("<h2>refused</h2>") < page.index("<h2>good</h2>")
    assert page.index("<h2>tight</h2>") < page.index("<h2>good</h2>")
    assert page.count("<svg") == 2                      # a plot per locked program
    assert "error / tolerance" in page and "tolerance" in page


def test_headless_chromium_renders_the_report(zoo, tmp_path):
    assert CHROMIUM, "Chromium renders the report: `bash setup.sh --tests` installs it (Debian's chromium)"
    url = (zoo / "build/report.html").as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0 and "<h1>LOGOS lock: 3 programs, 6 checks" in dom.stdout, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") == 2 and "first diverging op" in dom.stdout
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *flags, "--window-size=1000,1600", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120, check=True)
    from PIL import Image
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float64) / 255
    assert pixels.shape == (1600, 1000, 3)
    assert pixels.std() > 0.05                         # text and plots, not a blank page
