"""The report a run writes (or finds current) comes into build/ only when the run ends: a run
killed or interrupted after its report task, while a task of the dodo's own still runs, leaves
no report there that says pass; a task of the dodo's own that waits for the report reads it in
build/. And a lock skipped past its emit (`doit -s lock:NAME`) is not current on an earlier
bundle's verdict."""

import json
import os
import signal
import subprocess
import sys

import pytest

from test_pipeline import PROG_A, PROG_B, _weights, doit, make_zoo

SLOW = ("\n\ndef task_zz_slow():\n    import time\n    return {'actions': [lambda: print('slow started', "
        "flush=True) or time.sleep(60)], 'uptodate': [False], 'verbosity': 2}\n")


@pytest.fixture
def zoo(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "dtypes: [float64, float32]\n"), "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    return z


REPORT = ("report.json", "junit.xml", "summary.md", "report.html")


def _stopped(zoo, how, *args):
    """`doit ARGS` with a slow task of the dodo's own, sent `how` once that task runs: (the
    process, the lines it printed until then, the rest)."""
    with open(zoo / "dodo.py", "a") as f:
        f.write(SLOW)
    p = subprocess.Popen([sys.executable, "-u", "-m", "doit", *args], cwd=zoo, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env={**os.environ, "LOGOS_PROGRESS": "names"})
    seen = []
    for line in p.stdout:
        seen.append(line)
        if "slow started" in line:
            break
    p.send_signal(how)
    return p, seen, p.communicate(timeout=120)[0]


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_a_run_stopped_after_its_report_task_leaves_no_report_in_build(zoo, how):
    (zoo / "programs/b.logos").write_text("Let q be frobnicate of y.\n")   # the last complete run: red
    rc, _, out = doit(zoo)
    assert rc == 1 and (zoo / "build/summary.md").read_text().startswith("## ❌"), out
    (zoo / "programs/b.logos").write_text(PROG_B)
    p, seen, rest = _stopped(zoo, how)
    assert ".  report\n" in seen, seen   # (the report task ran before the dodo's own)
    for f in REPORT:
        assert not (zoo / "build" / f).exists(), (f, seen, rest)
    held = (zoo / "build/stale/summary.md").read_text()
    assert held.startswith("## ✅"), held   # (this run's, held: not in build/, not current)
    if how == signal.SIGINT:
        assert p.returncode == -signal.SIGINT and "no report is in build/ until a run ends" in rest, rest
        assert "checks:" not in rest, rest   # (no last line counting verdicts for a run that did not end)
    (zoo / "dodo.py").write_text((zoo / "dodo.py").read_text().replace(SLOW, ""))
    rc, ran, out = doit(zoo)   # a run that ends: the report comes into place
    assert rc == 0 and (zoo / "build/summary.md").read_text().startswith("## ✅"), out
    assert not (zoo / "build/stale/summary.md").exists()
    assert json.loads((zoo / "build/report.json").read_text())["checks"], out


def test_a_lock_run_past_its_emit_is_not_current_on_the_old_bundle(zoo):
    """`doit -s lock:a` (doit's: run the task, skip what it waits for) after the program changed:
    the lock's record is of the bundle the emit status lists, which is no longer the program's,
    so the lock runs (on that bundle: an error that says to emit again), never a pass."""
    assert doit(zoo)[0] == 0
    (zoo / "programs/a.logos").write_text(PROG_A.replace("Let y be rmsnorm of h.", "Let y be rmsnorm of x."))
    rc, ran, out = doit(zoo, "-s", "lock:a")
    assert rc != 0 and "lock:a" in ran and "2 pass" not in out, out
    assert "emit it again" in out, out
    assert doit(zoo, "lock:a")[0] == 0   # (with its emit, it passes)


@pytest.mark.parametrize("waits", ["'task_dep': ['report']", "'file_dep': ['build/summary.md']",
                                   "'file_dep': [os.path.abspath('build/summary.md')]"])
def test_a_dodo_task_that_waits_for_the_report_reads_it_in_build(zoo, waits):
    """A task of the dodo's own that waits for the report, or names a file of it (the report task
    has no targets: doit runs it after the report as it orders them), reads it in build/."""
    with open(zoo / "dodo.py", "a") as f:
        f.write("\n\ndef task_zz_post():\n    return {'actions': [lambda: print('posted:', open('build/summary.md')"
                f".read().splitlines()[0], flush=True)], {waits}, 'uptodate': [False], 'verbosity': 2}}\n")
    rc, ran, out = doit(zoo)
    assert rc == 0 and "zz_post" in ran and "posted: ## ✅" in out, out


def test_an_interrupt_under_another_reporter_claims_no_report_held(zoo):
    """`doit --reporter executed-only` runs without the zoo's reporter, which holds the report: an
    interrupt's line then says nothing of where the report is."""
    _, _, rest = _stopped(zoo, signal.SIGINT, "--reporter", "executed-only")
    assert "doit: interrupted (SIGINT); the finished tasks are kept" in rest and "no report is in build/" not in rest, rest


def test_a_lock_run_past_its_weights_task_is_not_current_on_edited_derived_weights(tmp_path):
    """`doit -s lock:d` after a derived file was edited by hand: the key names the import of the
    checkpoint, which did not change, but the folder holds other than that import made: an error
    that says to import again, never the earlier pass."""
    from test_keys import _derived_zoo, _results
    z = _derived_zoo(tmp_path)
    assert doit(z)[0] == 0
    path = z / "build/weights/d/w.f64"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x80
    path.write_bytes(bytes(data))
    rc, ran, out = doit(z, "-s", "lock:d")
    assert rc != 0 and "lock:d" in ran, out
    for r in _results(z).values():
        assert r["verdict"] == "error" and "import them again (doit weights:d)" in r["reason"], r
    assert doit(z)[0] == 0 and all(r["verdict"] == "pass" for r in _results(z).values())
