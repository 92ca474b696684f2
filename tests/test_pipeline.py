"""The doit pipeline end to end: real `doit` runs in a temporary copy of a tiny zoo.

Which tasks ran is read from doit's own `.  TASK` lines (the reporter keeps them on short runs);
reports are parsed (JSON, JUnit XML), the history is read with sqlite3, exit codes are asserted.
"""

import dataclasses
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROG_A = """Let x be a 1 by 4 tensor of Real.
Let w be a 4 by 4 tensor of Real.
Set item 1 of x to 1.5.
Set item 3 of x to -0.5.
Let h be x matmul w.
Let y be rmsnorm of h.
"""
PROG_B = """Let x be a 1 by 3 tensor of Real.
Set item 2 of x to 2.
Let y be rmsnorm of x.
"""


def _weights(path, seed):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.random.default_rng(seed).standard_normal((4, 4)).astype("<f8").tofile(path)


def make_zoo(tmp, programs):
    """A repo copy: dodo.py, the emitter package, and `programs` {name: (source, yaml or None)}."""
    tmp.mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "dodo.py"), tmp / "dodo.py")
    shutil.copytree(os.path.join(ROOT, "emitter"), tmp / "emitter",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp / "programs").mkdir()
    for name, (source, config) in programs.items():
        (tmp / "programs" / f"{name}.logos").write_text(source)
        if config is not None:
            (tmp / "programs" / f"{name}.yaml").write_text(config)
    return tmp


def doit(cwd, *args, env=None):
    """(exit code, set of tasks that ran, output) of one real doit run in `cwd`."""
    e = {**os.environ, "LOGOS_PROGRESS": "names", **(env or {})}
    p = subprocess.run([sys.executable, "-m", "doit", *args], cwd=cwd, capture_output=True,
                       text=True, env=e, timeout=300)
    ran = {line[3:].strip() for line in p.stdout.splitlines() if line.startswith(".  ")}
    return p.returncode, ran, p.stdout + p.stderr


@pytest.fixture
def zoo(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "dtypes: [float64, float32]\n"),
                                    "b": (PROG_B, None)})
    _weights(z / "weights" / "a" / "w.f64", 0)
    return z


# `doit` runs the report and what it needs (`cache`, with no cache=URL, has nothing to do)
ALL_A_B = {"emit:a", "emit:b", "lock:a", "lock:b", "report"}


def test_incremental_scenarios(zoo, tmp_path):
    rc, ran, out = doit(zoo)
    assert rc == 0, out
    assert ran == ALL_A_B
    for f in ("model.py", "manifest.json", "compile.py"):
        assert (zoo / "build" / "bundles" / "a" / f).is_file()
    assert json.loads((zoo / "build/results/a/float32.json").read_text())["verdict"] == "pass"

    rc, ran, out = doit(zoo)                          # no-op
    assert (rc, ran) == (0, set()), out

    now = time.time() + 5                             # touched, unchanged
    for p in ("programs/a.logos", "programs/a.yaml", "weights/a/w.f64", "emitter/sambaflow/emit.py"):
        os.utime(zoo / p, (now, now))
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()), out

    with open(zoo / "programs/b.logos", "a") as f:   # one program edited
        f.write("Let z be sigmoid of y.\n")
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, {"emit:b", "lock:b", "report"}), out

    _weights(zoo / "weights/a/w.f64", 1)              # one weight file changed
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, {"lock:a", "report"}), out

    with open(zoo / "emitter/sambaflow/emit.py", "a") as f:    # the emitter changed
        f.write("\n# changed\n")
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, {"emit:a", "emit:b", "lock:a", "lock:b", "report"}), out

    with open(zoo / "emitter/verify/vm.py", "a") as f:      # only the VM changed: no emit reruns
        f.write("\n# changed\n")
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, {"lock:a", "lock:b", "report"}), out

    clone = tmp_path / "clone"                        # fresh clone, build/ restored: new mtimes
    shutil.copytree(zoo, clone, ignore=shutil.ignore_patterns("__pycache__"))
    later = time.time() + 60
    for dirpath, _, files in os.walk(clone):
        for f in files:
            os.utime(os.path.join(dirpath, f), (later, later))
    rc, ran, out = doit(clone)
    assert (rc, ran) == (0, set()), out

    con = sqlite3.connect(zoo / "build/results.sqlite")
    runs = con.execute("SELECT name, dtype, verdict FROM runs ORDER BY id").fetchall()
    # a: first build, weight change, emitter change, VM change; b: first, edit, emitter, VM
    assert sorted(set(runs)) == [("a", "float32", "pass"), ("a", "float64", "pass"),
                                 ("b", "float32", "pass"), ("b", "float64", "pass")]
    assert sum(1 for r in runs if r[0] == "a") == 8 and sum(1 for r in runs if r[0] == "b") == 8


def test_failures_are_isolated_and_reported(tmp_path):
    z = make_zoo(tmp_path / "zoo", {
        "good": (PROG_B, None),
        "tight": (PROG_A, "dtypes: [float32, float64]\ntolerances: {float32: {abs: 0, rel: 0}}\n"),
        "broken": ("Let x be a 1 by 3 tensor of Real.\nLet y be frobnicate of x.\n", None),
        "badcfg": (PROG_B, "steps: 1\ncolour: blue\n"),
    })
    _weights(z / "weights" / "tight" / "w.f64", 3)
    rc, ran, out = doit(z)
    assert rc != 0
    assert {"emit:good", "lock:good", "emit:tight", "lock:tight", "emit:broken", "lock:broken",
            "emit:badcfg", "lock:badcfg", "report"} <= ran, out
    assert "5 of 8 checks did not pass" in out
    assert json.loads((z / "build/results/good/float32.json").read_text())["verdict"] == "pass"

    report = json.loads((z / "build/report.json").read_text())
    assert report["counts"] == {"pass": 3, "fail": 1, "error": 4}
    order = [(r["name"], r["check"], r["verdict"]) for r in report["results"]]
    assert order[0] == ("tight", "float32", "fail")             # failures first
    assert [v for *_, v in order[:5]] == ["fail", "error", "error", "error", "error"]
    fail = report["failures"][0]
    assert fail["first_divergence"]["op"] in ("matmul", "rmsnorm")
    assert "first diverging op" in fail["why"]
    cfg_err = next(r for r in report["results"] if r["name"] == "badcfg")
    assert "programs/badcfg.yaml:2" in cfg_err["reason"] and "`colour`" in cfg_err["reason"]
    broken = next(r for r in report["results"] if r["name"] == "broken")
    assert broken["reason"].startswith("programs/broken.logos:2:")
    assert not (z / "build/bundles/broken/model.py").exists()

    suite = ET.parse(z / "build/junit.xml").getroot().find("testsuite")
    cases = {(c.get("classname"), c.get("name")): c for c in suite.findall("testcase")}
    assert len(cases) == 8 and suite.get("tests") == "8"
    assert suite.get("failures") == "1" and suite.get("errors") == "4"
    assert cases[("tight", "float32")].find("failure") is not None
    assert cases[("tight", "float64")].find("failure") is None
    assert cases[("broken", "float64")].find("error") is not None
    assert list(cases[("good", "float64")]) == []

    summary = (z / "build/summary.md").read_text()
    assert summary.startswith("## ❌ LOGOS lock: 4 programs, 8 checks — 3 pass, 1 fail, 4 error")
    assert summary.index("### Failures") < summary.index("### All checks")
    assert summary.index("`tight` | float32 | **fail**") < summary.index("`broken`")

    # a no-op rerun still fails (the report reruns and fails); a passing check is not redone, a
    # failing or erroring one is checked again (as Bazel reruns failed tests)
    rc, ran, out = doit(z)
    assert rc != 0 and "lock:good" not in ran and "lock:tight" in ran, out
    assert "lock:tight [float64] PASS" not in out     # its passing dtype kept, not recomputed
    assert json.loads((z / "build/report.json").read_text())["counts"] == {"pass": 3, "fail": 1, "error": 4}

    # `results`: latest per program; --history shows where a regression began
    res = subprocess.run([sys.executable, "-m", "emitter", "results"], cwd=z, capture_output=True,
                         text=True)
    assert res.returncode == 1
    assert "4 programs, 8 checks, 5 not passing" in res.stdout
    one = lambda *names: subprocess.run([sys.executable, "-m", "emitter", "results", *names], cwd=z,
                                        capture_output=True, text=True)
    res = one("good")      # one program's gate: `doit lock:good && python -m emitter results good`
    assert res.returncode == 0 and "1 programs, 2 checks, 0 not passing" in res.stdout, res.stdout
    res = one("good", "badcfg")
    assert res.returncode == 1 and "2 programs, 4 checks, 2 not passing" in res.stdout, res.stdout
    res = one("good", "nosuch")
    assert res.returncode == 2 and "no runs of `nosuch`" in res.stderr
    res = one("--history", "good", "badcfg")
    assert res.returncode == 2 and "give no other NAME" in res.stderr
    (z / "programs/good.yaml").write_text("tolerances: {float32: {abs: 0, rel: 0}}\n")
    rc, ran, out = doit(z, "lock:good")   # one program's lock says FAIL, the run's gate is `results`
    assert ran == {"lock:good"} and "lock:good [float32] FAIL" in out, out   # (its emit: current)
    assert one("good").returncode == 1
    hist = subprocess.run([sys.executable, "-m", "emitter", "results", "--history", "good"], cwd=z,
                          capture_output=True, text=True)
    lines = [ln for ln in hist.stdout.splitlines() if "float32" in ln and ln[2:3] == "#"]   # (its runs)
    assert len(lines) == 2 and " pass " in lines[0] and lines[1].startswith("! ") and " fail " in lines[1]
    assert hist.stdout.splitlines()[-1].startswith("3 runs of `good`; the latest of each check: float32 fail "
                                                   "(current), float64 pass (current)"), hist.stdout
    # a program refused after an emit, then deleted: nothing of it is left in build/, not even
    # the bundle's folder its refusal emptied
    (z / "programs/good.logos").write_text("Let y be frobnicate of x.\n")
    doit(z)
    assert os.listdir(z / "build/bundles/good") == []
    (z / "programs/good.logos").unlink()
    doit(z)
    assert not os.path.exists(z / "build/bundles/good") and not os.path.exists(z / "build/results/good")


def test_sigterm_keeps_progress_and_second_run_is_refused(zoo):
    e = dict(os.environ, LOGOS_PROGRESS="names")
    p = subprocess.Popen([sys.executable, "-u", "-m", "doit"], cwd=zoo, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=e)
    seen = []
    for line in p.stdout:                 # wait until the emits are done and a lock has started
        seen.append(line)
        if line.startswith(".  lock:"):
            break
    rc2, ran2, out2 = doit(zoo)           # a second run while the first holds build/
    assert rc2 == 3 and ran2 == set() and "refused: another doit run" in out2
    p.send_signal(signal.SIGTERM)
    rest, _ = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGTERM                 # ends as a SIGTERM'd process does
    assert "doit: interrupted (SIGTERM); the finished tasks are kept" in rest, rest
    assert "Traceback" not in rest
    for f in (zoo / "build/results").rglob("*.json"):
        json.loads(f.read_text())         # no half-written target
    rc, ran, out = doit(zoo)
    assert rc == 0, out
    assert not any(t.startswith("emit:") or t.startswith("digest:") for t in ran), (seen, out)
    assert "report" in ran


def test_parallel_with_progress_line(zoo):
    rc, ran, out = doit(zoo, "-n", "2", env={"LOGOS_PROGRESS": "line"})
    assert rc == 0, out
    assert ran == set()                   # the progress line replaces the task names
    assert out.count("[6/6] ran 5, failures 0") == 1, out   # the final line, printed once
    for n in ("a", "b"):
        for dt in ("float64", "float32"):
            assert json.loads((zoo / f"build/results/{n}/{dt}.json").read_text())["verdict"] == "pass"
    rc, ran, out = doit(zoo, "-n", "2")
    assert (rc, ran) == (0, set()), out


FAKE_IMPORTER = '''"""A test importer: the checkpoint is raw float64 bytes of w."""
import os, shutil


def add_arguments(p):
    p.add_argument("checkpoint")
    p.add_argument("--program", required=True)
    p.add_argument("-o", "--out", required=True)


def main(args):
    os.makedirs(args.out, exist_ok=True)
    shutil.copy(args.checkpoint, os.path.join(args.out, "w.f64"))
    return 0
'''


def test_derived_weights_task(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"d": (PROG_A, "derive:\n  importer: fake\n"
                                                  "  checkpoint: ckpt/w.bin\n")})
    (z / "emitter/importers/fake.py").write_text(FAKE_IMPORTER)
    with open(z / "emitter/importers/__init__.py", "a") as f:
        f.write('\nIMPORTERS["fake"] = ("emitter.importers.fake", "test importer")\n')
    _weights(z / "ckpt" / "w.bin", 5)
    rc, ran, out = doit(z)
    assert rc == 0, out
    assert {"weights:d", "lock:d"} <= ran
    assert (z / "build/weights/d/w.f64").read_bytes() == (z / "ckpt/w.bin").read_bytes()
    r = json.loads((z / "build/results/d/float64.json").read_text())
    assert r["verdict"] == "pass" and r["weights"] == "build/weights/d"
    _weights(z / "ckpt" / "w.bin", 6)
    rc, ran, out = doit(z)
    assert (rc, ran) == (0, {"weights:d", "lock:d", "report"}), out


def test_an_importer_edited_while_it_imports_leaves_no_weights_as_current(tmp_path):
    """An edit of the importers' code that lands while an import runs (here the importer edits
    itself, as a person's save would land) fails that import: what it made is not recorded under
    the key of the code the run started with. The next run imports with the code as it is."""
    z = make_zoo(tmp_path / "zoo", {"d": (PROG_A, "derive:\n  importer: fake\n  checkpoint: ckpt/w.bin\n")})
    fake = z / "emitter/importers/fake.py"
    fake.write_text(FAKE_IMPORTER.replace("    return 0\n", "    with open(__file__, 'a') as f:\n"
                                          "        f.write('# edited while it ran\\n')\n    return 0\n"))
    with open(z / "emitter/importers/__init__.py", "a") as f:
        f.write('\nIMPORTERS["fake"] = ("emitter.importers.fake", "test importer")\n')
    _weights(z / "ckpt" / "w.bin", 5)
    rc, ran, out = doit(z)
    assert rc != 0 and "weights:d" in ran and "the importers' code changed while the import ran" in out, out
    assert not (z / "build/weights/d").exists()
    fake.write_text(FAKE_IMPORTER)
    rc, ran, out = doit(z)
    assert rc == 0 and {"weights:d", "lock:d"} <= ran, out


@pytest.mark.parametrize("odd", ["os.makedirs(os.path.join(args.out, 'sub'))",
                                 "os.symlink('w.f64', os.path.join(args.out, 'v.f64'))"])
def test_an_importer_that_makes_no_plain_file_fails_naming_it(tmp_path, odd):
    """What an importer makes is plain files (every reader refuses anything else where a leaf's
    file goes): a folder or a link among them fails the import, naming it, and leaves no weights."""
    z = make_zoo(tmp_path / "zoo", {"d": (PROG_A, "derive:\n  importer: fake\n  checkpoint: ckpt/w.bin\n")})
    (z / "emitter/importers/fake.py").write_text(FAKE_IMPORTER.replace("    return 0\n", f"    {odd}\n    return 0\n"))
    with open(z / "emitter/importers/__init__.py", "a") as f:
        f.write('\nIMPORTERS["fake"] = ("emitter.importers.fake", "test importer")\n')
    _weights(z / "ckpt" / "w.bin", 5)
    rc, ran, out = doit(z)
    name = "sub" if "makedirs" in odd else "v.f64"
    assert rc != 0 and "weights:d" in ran and f"made `{name}` in build/weights/d, which is not a plain file" in out, out
    assert not (z / "build/weights/d").exists()


def test_lock_false_and_list(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_B, "lock: false\n")})
    rc, ran, out = doit(z, "list", "--all")
    assert rc == 0
    assert "emit:a" in out and "lock:a" not in out and "report" in out
    rc, ran, out = doit(z)
    assert rc == 0 and ran == {"emit:a", "report"}, out
    suite = ET.parse(z / "build/junit.xml").getroot().find("testsuite")
    assert [(c.get("classname"), c.get("name")) for c in suite.findall("testcase")] == [("a", "emit")]


def _entries(z):
    """The run's records of the zoo in `z` (the current folder)."""
    from emitter.pipeline.checks import entries
    from emitter.pipeline.config import discover
    return {e.name: e for e in entries(discover(str(z)))}


RUN = {"executor": "inline", "workers": None, "threads": 1, "cache": None, "kind": "inline"}


def test_every_heavy_action_turns_the_paused_collector_back_on(tmp_path, monkeypatch):
    """The run pauses the cyclic GC while doit loads tasks; each action that does real work
    (imports, parsing, hashing weights) resumes it before starting."""
    import gc
    from emitter.pipeline import actions as pipeline, guards, lock_task, report, weights
    from emitter.pipeline.config import Derive
    z = make_zoo(tmp_path / "zoo", {"p": (PROG_B, None)})
    monkeypatch.chdir(z)
    e = _entries(z)["p"]
    actions = {
        "emit_bundle": lambda: pipeline.emit_bundle(e),
        "lock_program": lambda: lock_task.lock_program(e, RUN, "build/h.sqlite"),
        "make_report": lambda: report.make_report([], "build/report", 1),
        "import_weights": lambda: weights.import_weights(dataclasses.replace(
            e.pc, derive=Derive("nosuch", e.pc.source, e.pc.source), weights="build/imported")),
    }
    was = gc.isenabled()
    try:
        for name, action in actions.items():
            guards.pause_collector()
            action()
            assert gc.isenabled(), f"{name} left the collector paused"
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("raised, rc, line", [
    ("KeyboardInterrupt(15)", -signal.SIGTERM, "doit: interrupted (SIGTERM); the finished tasks"),
    ("KeyboardInterrupt('15')", -signal.SIGTERM, "doit: interrupted (SIGTERM)"),  # doit -n re-raise
    ("KeyboardInterrupt()", -signal.SIGINT, "doit: interrupted (SIGINT)"),
    ("KeyboardInterrupt(99)", -signal.SIGINT, "doit: interrupted (SIGINT)"),
    ("ValueError('boom')", 1, "ValueError: boom"),                # anything else: the usual traceback
])
def test_interrupt_ends_the_run_in_one_line(raised, rc, line):
    code = f"from emitter.pipeline import guards; guards.install_sigterm(); raise {raised}"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == rc and line in p.stderr, p.stderr
    assert ("Traceback" in p.stderr) == (rc == 1)


def test_the_eta_is_right_within_a_fifth_after_a_tenth_of_the_work():
    """A simulated zoo run as doit runs it (program by program: emit, lock), with kinds of task of
    different costs and a share of them up to date: after the first tenth of the work, the ETA is
    within 20% of the time the rest takes."""
    from emitter.pipeline.progress import Work
    rng = np.random.default_rng(0)
    order = [(f"{k}:p{i}", cost, rng.random() < up) for i in range(300)
             for k, cost, up in (("wmanifest", 0.01, 0.5), ("emit", 0.05, 0.0), ("lock", 0.8, 0.0))]
    work = Work([n for n, _, _ in order])
    total = sum(c * rng.uniform(0.8, 1.2) for _, c, skip in order if not skip)
    now, checked_eta = 0.0, []
    for name, cost, skip in order:
        if not skip:
            work.start(name, now)
            now += cost * rng.uniform(0.8, 1.2)
        work.finish(name, now)
        if now > total / 10 and not checked_eta:
            checked_eta.append((now, work.eta(now)))
    at, eta = checked_eta[0]
    assert abs(eta - (now - at)) <= 0.2 * (now - at), (eta, now - at)


def test_the_lock_digest_covers_the_code_that_runs_a_check_anywhere():
    """Editing what runs a check (the VM, the lock, the worker side that sets its threads) reruns
    every lock; the report's code does not."""
    from emitter.pipeline.digests import code_files
    files = set(code_files("lock"))
    assert {"verify/lock.py", "verify/resident.py", "pipeline/check_worker.py", "files.py"} <= files
    assert not {"pipeline/report.py", "pipeline/executors.py", "importers/gguf.py"} & files


def test_a_weights_edit_that_puts_its_mtime_back_is_locked_again(zoo):
    """doit's md5 check took a file whose mtime did not move as unchanged: the weights' part of
    the key is each file's fingerprint (its ctime moves with any write), so the lock runs again,
    on the new weights, rather than an error every run or a verdict on the old ones."""
    assert doit(zoo)[0] == 0
    w = zoo / "weights" / "a" / "w.f64"
    st = os.stat(w)
    _weights(str(w), 7)
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))
    rc, ran, out = doit(zoo)
    assert rc == 0 and "lock:a" in ran, out
    r = json.loads((zoo / "build/results/a/float64.json").read_text())
    import hashlib
    assert r["verdict"] == "pass" and r["inputs"]["weights"]["files"] == {
        "w.f64": hashlib.sha256(w.read_bytes()).hexdigest()}


def _one_lock(tmp_path, monkeypatch, **run):
    from emitter.pipeline import actions as pipeline, lock_task
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "dtypes: [float64]\n")})
    _weights(str(z / "weights/a/w.f64"), 1)
    monkeypatch.chdir(z)
    e = _entries(z)["a"]
    pipeline.emit_bundle(e)
    got = lock_task.lock_program(e, {**RUN, **run}, "build/results.sqlite")
    return got, json.loads((z / "build/results/a/float64.json").read_text())


def test_weights_moved_during_the_check_fail_the_lock_task_so_it_runs_again(tmp_path, monkeypatch):
    """The error of weights that are not the key's (rewritten after the key was taken, while the
    check waited) is this run's doing, not the bundle's: the lock task fails (its result says
    why), so the next run locks again rather than keeping it."""
    from doit.exceptions import TaskFailed
    from emitter.pipeline import executors
    got, r = _one_lock(tmp_path, monkeypatch)
    assert not isinstance(got, TaskFailed) and r["verdict"] == "pass"

    class Editing(executors.Inline):
        value = 1

        def run(self, jobs, seconds):
            Editing.value += 1
            _weights("weights/a/w.f64", Editing.value)     # after the key was taken
            return super().run(jobs, seconds)
    (tmp_path / "zoo/programs/a.yaml").write_text("dtypes: [float64]\nsteps: 2\n")   # a new key
    monkeypatch.setattr(executors, "executor", lambda *a, **k: Editing())
    from emitter.pipeline import lock_task
    got = lock_task.lock_program(_entries(tmp_path / "zoo")["a"], RUN, "build/results.sqlite")
    r = json.loads((tmp_path / "zoo/build/results/a/float64.json").read_text())
    assert isinstance(got, TaskFailed) and "changed after" in str(got.message)
    assert r["verdict"] == "error" and r["stale_weights"] == ["w.f64"] and r["key"] is None
    # a run with the report: the lock task stands (a failed one would make the report doit's unmet
    # dependency, exit 2) and the report fails the run naming the error, exit 1 as for any error
    (tmp_path / "zoo/programs/a.yaml").write_text("dtypes: [float64]\nsteps: 3\n")
    entries = _entries(tmp_path / "zoo")
    got = lock_task.lock_program(entries["a"], {**RUN, "report_follows": True}, "build/results.sqlite")
    r = json.loads((tmp_path / "zoo/build/results/a/float64.json").read_text())
    assert got is True and r["verdict"] == "error" and r["stale_weights"] == ["w.f64"], got
    from emitter.pipeline.report import make_report
    failed = make_report(list(entries.values()), "build", RUN.get("threads"))
    assert isinstance(failed, TaskFailed) and "a[float64]=error" in failed.message, failed


def test_a_remote_result_that_names_no_code_is_refused(tmp_path, monkeypatch):
    """A worker's result must say which lock code it ran: one that does not (an older emitter on
    the worker) is an error naming the worker, and the task fails so the next run tries again."""
    from doit.exceptions import TaskFailed
    from emitter.pipeline import executors

    class Older:
        def run(self, jobs, seconds):
            return [{"result": {"verdict": "pass", "hashes": {}}, "golden": None,
                     "execution": {"executor": "dask:tcp://w:8786", "worker": "tcp://10.0.0.9:4000"}}
                    for _ in jobs]
    monkeypatch.setattr(executors, "executor", lambda *a, **k: Older())
    got, r = _one_lock(tmp_path, monkeypatch, executor="dask:tcp://w:8786")
    assert isinstance(got, TaskFailed) and r["verdict"] == "error"
    assert "other lock code than this run's" in r["reason"] and "tcp://10.0.0.9:4000" in r["reason"]


def test_a_check_run_at_other_settings_than_its_key_names_is_not_recorded_current(tmp_path, monkeypatch):
    """What a check runs with comes from its key's record; a verdict computed at another
    tolerance (code between the key and the lock that hands it another, as an edited lock task
    would) is not about its key: kept without one, so the next run locks it again."""
    from emitter.pipeline import executors, lock_task
    got, r = _one_lock(tmp_path, monkeypatch)
    assert r["verdict"] == "pass" and r["key"] and r["tolerance"] == r["inputs"]["tolerance"]

    class Loose(executors.Inline):
        def run(self, jobs, seconds):
            for job in jobs:
                job["record"] = {**job["record"], "tolerance": {**job["record"]["tolerance"], "abs": 1e9}}
            return super().run(jobs, seconds)
    (tmp_path / "zoo/programs/a.yaml").write_text("dtypes: [float64]\nsteps: 2\n")   # a new key
    monkeypatch.setattr(executors, "executor", lambda *a, **k: Loose())
    lock_task.lock_program(_entries(tmp_path / "zoo")["a"], RUN, "build/results.sqlite")
    r = json.loads((tmp_path / "zoo/build/results/a/float64.json").read_text())
    assert r["tolerance"]["abs"] == 1e9 and r["key"] is None and r["inputs"] is None


@pytest.mark.parametrize("make", ["folder", "dangling link"])
def test_an_entry_beside_a_leafs_file_that_is_no_file_moves_the_key(zoo, make):
    """A folder or a link to nothing named as a leaf's file (`w.npy` beside `w.f64`), which every
    reader refuses, is in the key by name and kind: the verdict is not current and the lock runs
    again, an error naming it, rather than the last pass standing."""
    assert doit(zoo)[0] == 0
    beside = zoo / "weights" / "a" / "w.npy"
    if make == "folder":
        beside.mkdir()
    else:
        os.symlink("nowhere.npy", beside)
    p = subprocess.run([sys.executable, "-m", "emitter", "results", "a"], cwd=zoo, capture_output=True, text=True)
    assert p.returncode == 1, p.stdout + p.stderr
    rc, ran, out = doit(zoo)
    assert "lock:a" in ran, out
    r = json.loads((zoo / "build/results/a/float64.json").read_text())
    assert r["verdict"] == "error" and "w.npy" in r["reason"], r["reason"]


def test_an_emit_under_other_code_than_the_runs_is_not_recorded_done(tmp_path, monkeypatch):
    """The emit's code is loaded when the first program is emitted: where the code on disk is not
    the code the run's keys name (edited since the run started), the bundle is written but its
    status keeps no key, so the next run emits it again."""
    from emitter.pipeline import actions, digests
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_B, None)})
    monkeypatch.chdir(z)
    e = _entries(z)["a"]
    actions.emit_bundle(e)
    assert json.loads((z / e.status).read_text())["key"]
    taken = digests.code("emit")
    monkeypatch.setattr(digests, "code", lambda kind: "0" * 64 if kind == "emit" else taken)
    actions.emit_bundle(e)
    st = json.loads((z / e.status).read_text())
    assert st["status"] == "ok" and st["key"] is None
