"""The bundle checks itself: after the lock, `python compile.py test` runs model.py on the weights
the lock used and compares with the VM's golden outputs the lock wrote into the bundle; the `logos`
command runs the zoo's tasks in any folder and reads results as JSON."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from test_pipeline import PROG_A, _weights, doit, make_zoo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = PROG_A.replace("Let y be rmsnorm of h.", "Let y be rmsnorm of h.\nLet z be y hadamard x.")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    z = make_zoo(tmp_path_factory.mktemp("self") / "zoo", {"a": (STEP, "steps: 2\n")})
    _weights(z / "weights" / "a" / "w.f64", 0)
    rc, _, out = doit(z)
    assert rc == 0, out
    return z


def _compile(z, *args):
    return subprocess.run([sys.executable, str(z / "build/bundles/a/compile.py"), *args],
                          capture_output=True, text=True, cwd=str(z.parent))


def test_compile_py_test_passes_on_the_locked_weights(zoo):
    golden = json.loads((zoo / "build/bundles/a/golden/golden.json").read_text())
    assert golden["steps"] == 2 and golden["weights"] == "../../../weights/a"
    assert set(golden["tolerances"]) == {"float64", "float32"} and len(golden["outputs"]) == 2
    for dtype in ("float32", "float64"):
        p = _compile(zoo, "test", "--dtype", dtype)
        assert p.returncode == 0 and f"[{dtype}, 2 step(s), weights " in p.stdout and "PASS" in p.stdout, p.stderr


def test_compile_py_test_fails_on_a_wrong_module_or_other_weights(zoo, tmp_path):
    other = tmp_path / "w"
    _weights(other / "w.f64", 7)
    p = _compile(zoo, "test", "--weights", str(other))
    assert p.returncode == 1 and "FAIL" in p.stdout and "worst: stage" in p.stdout
    shutil.copytree(zoo / "build/bundles/a", tmp_path / "b")
    model = tmp_path / "b" / "model.py"
    assert "y * x" in model.read_text()
    model.write_text(model.read_text().replace("y * x", "y * x * 1.01"))   # a wrong hadamard
    b = tmp_path / "b"
    p = subprocess.run([sys.executable, str(b / "compile.py"), "test", "--weights", str(zoo / "weights/a")],
                       capture_output=True, text=True)
    assert p.returncode == 1 and ("`z = hadamard`" in p.stdout or "the output `z`" in p.stdout), p.stdout


def test_no_subcommand_silently_does_nothing(zoo):
    p = _compile(zoo)
    assert p.returncode == 1 and "usage: compile.py {compile,run,test,measure-performance}" in p.stderr
    p = _compile(zoo, "run")
    assert p.returncode == 1 and "needs SambaNova's SambaFlow SDK" in p.stderr
    p = _compile(zoo, "measure-performance", "--iterations", "3")
    figures = json.loads(p.stdout)
    assert p.returncode == 0 and figures["device"] == "cpu" and figures["median_ms"] > 0
    for n in ("0", "-2"):   # an argument error, never a traceback
        p = _compile(zoo, "measure-performance", "--iterations", n)
        assert p.returncode == 2 and "must be a whole number of at least 1" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr


def test_golden_of_another_program_is_never_tested_against(zoo, tmp_path):
    """A bundle emitted again from another program over a locked one keeps the old golden/ until a
    lock: `compile.py test` names the mismatch instead of a false FAIL (or a crash)."""
    golden = json.loads((zoo / "build/bundles/a/golden/golden.json").read_text())
    assert golden["program"].startswith("logos_")
    b = tmp_path / "b"
    shutil.copytree(zoo / "build/bundles/a", b)
    other = tmp_path / "o.logos"
    other.write_text("Let x be a 1 by 4 tensor of Real.\nLet y be silu of x.\n")
    e = subprocess.run([sys.executable, "-m", "emitter", "emit", str(other), "-o", str(b)],
                       capture_output=True, text=True, cwd=ROOT)
    assert e.returncode == 0, e.stderr
    for cmd in (["test"], ["measure-performance", "--iterations", "1"]):
        p = subprocess.run([sys.executable, str(b / "compile.py"), *cmd], capture_output=True, text=True)
        assert p.returncode == 1 and f"golden/ is of program {golden['program']}" in p.stderr, p.stderr
        assert "lock the bundle again" in p.stderr and "Traceback" not in p.stderr


def test_logos_runs_the_zoo_in_any_folder_and_results_as_json(tmp_path):
    logos = os.path.join(os.path.dirname(sys.executable), "logos")
    assert os.path.exists(logos), "`bash setup.sh` installs the project, and with it the logos command"
    repo = tmp_path / "their-models"
    (repo / "programs").mkdir(parents=True)
    (repo / "programs" / "p.logos").write_text(STEP)
    _weights(repo / "weights" / "p" / "w.f64", 3)
    env = {**os.environ, "LOGOS_PROGRESS": "names"}
    p = subprocess.run([logos, "doit", "-n", "2"], cwd=repo, capture_output=True, text=True, env=env)
    assert p.returncode == 0 and "lock:p" in p.stdout, p.stdout + p.stderr
    assert (repo / "build/bundles/p/model.py").is_file() and (repo / "build/report.html").is_file()
    p = subprocess.run([logos, "doit", "list"], cwd=repo, capture_output=True, text=True, env=env)
    assert p.returncode == 0 and "report" in p.stdout and "lock" in p.stdout
    p = subprocess.run([logos, "results", "--json"], cwd=repo, capture_output=True, text=True)
    got = json.loads(p.stdout)
    assert p.returncode == 0 and got["programs"] == 1 and {r["verdict"] for r in got["runs"]} == {"pass"}
    p = subprocess.run([logos, "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("logos ")
    (repo / "dodo.py").write_text("")
    p = subprocess.run([logos, "doit"], cwd=repo, capture_output=True, text=True)
    assert p.returncode == 3 and "has a dodo.py of its own" in p.stderr   # refused, as doit refuses
    p = subprocess.run([logos, "doit"], cwd=tmp_path, capture_output=True, text=True)   # no zoo above
    assert p.returncode == 3 and "no programs/ folder in" in p.stderr and "Traceback" not in p.stderr
