"""One key per check: a verdict is current only for the inputs its key names, whatever kind of edit
moved them (one that keeps size and mtime, a file the importer reads beside the checkpoint, the
emitter's own code, a config edited while the run is under way, a task doit ignores)."""

import json
import os
import shutil
import sqlite3
import sys
import time

import numpy as np
import pytest

from conftest import ROOT
from test_pipeline import FAKE_IMPORTER, PROG_A, PROG_B, _weights, doit, make_zoo, zoo  # noqa: F401 (a fixture)


def _results(z):
    out = {}
    for d in (z / "build/results").iterdir():
        for f in d.glob("*.json"):
            out[(d.name, f.stem)] = json.loads(f.read_text())
    return out


def _same_stat_edit(path, edit):
    """Rewrite `path` through `edit(bytes) -> bytes` (same size), then put its mtime back."""
    st = os.stat(path)
    data = edit(open(path, "rb").read())
    assert len(data) == st.st_size
    with open(path, "wb") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _derived_zoo(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"d": (PROG_A, "derive:\n  importer: fake\n  checkpoint: ckpt/w.bin\n")})
    (z / "emitter/importers/fake.py").write_text(FAKE_IMPORTER)
    with open(z / "emitter/importers/__init__.py", "a") as f:
        f.write('\nIMPORTERS["fake"] = ("emitter.importers.fake", "test importer")\n')
    _weights(str(z / "ckpt/w.bin"), 0)
    return z


def test_a_checkpoint_edited_with_its_size_and_mtime_kept_is_no_cache_hit(tmp_path):
    url, key = (tmp_path / "cache").as_uri(), {"LOGOS_CACHE_KEY": "k"}
    z = _derived_zoo(tmp_path)
    rc, ran, out = doit(z, f"cache={url}", env=key)
    assert rc == 0 and len(list((tmp_path / "cache").rglob("*.json"))) == 2, out
    before = {n: r["key"] for n, r in _results(z).items()}
    # flip a bit of the checkpoint's last float (its sign): same size, mtime put back
    _same_stat_edit(z / "ckpt/w.bin", lambda b: b[:-1] + bytes([b[-1] ^ 0x80]))
    rc, ran, out = doit(z, f"cache={url}", env=key)
    assert rc == 0 and {"weights:d", "lock:d"} <= ran, out
    after = _results(z)
    assert all(not r.get("from_cache") for r in after.values()), out
    assert all(r["key"] != before[n] for n, r in after.items())
    w = (z / "build/weights/d/w.f64").read_bytes()
    assert w == (z / "ckpt/w.bin").read_bytes()     # derived from the edited checkpoint
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 4


def test_a_file_the_importer_reads_beside_the_checkpoint_is_an_input(tmp_path):
    """qwen35 reads config.json beside model.safetensors: editing it re-derives the weights and
    relocks, where it once left the old verdicts standing."""
    z = make_zoo(tmp_path / "zoo", {})
    shutil.copy(os.path.join(ROOT, "programs/qwen38.logos"), z / "programs/q.logos")
    (z / "programs/q.yaml").write_text("derive:\n  importer: qwen35\n  checkpoint: ck/model.safetensors\n"
                                       "dtypes: [float64]\n")
    shutil.copytree(os.path.join(ROOT, "checkpoints/qwen38-tiny"), z / "ck")
    rc, ran, out = doit(z)
    assert rc == 0, out
    first = _results(z)[("q", "float64")]
    cfg = z / "ck/config.json"
    _same_stat_edit(cfg, lambda b: b.replace(b'"rope_theta": 10000.0', b'"rope_theta": 90000.0'))
    rc, ran, out = doit(z)
    assert rc == 0 and {"weights:q", "lock:q"} <= ran, out
    second = _results(z)[("q", "float64")]
    assert second["key"] != first["key"] and second["inputs"]["weights"] != first["inputs"]["weights"]
    rc, ran, out = doit(z)
    assert rc == 0 and not ran & {"weights:q", "lock:q"}, out


def test_a_config_json_over_the_importers_limit_is_keyed_by_its_size_unread(tmp_path, monkeypatch):
    """An importer refuses a config.json over CONFIG_BYTES: the import key holds its size, and
    nothing reads it (a 6 GB one cost 17 s of hashing before the refusal); one within is hashed."""
    from types import SimpleNamespace
    from emitter.importers import CONFIG_BYTES
    from emitter.pipeline import keys
    ck = tmp_path / "ck"
    shutil.copytree(os.path.join(ROOT, "checkpoints/qwen38-tiny"), ck)
    program = tmp_path / "q.logos"
    shutil.copy(os.path.join(ROOT, "programs/qwen38.logos"), program)
    derive = SimpleNamespace(importer="qwen35", checkpoint="ck/model.safetensors",
                             checkpoint_path=str(ck / "model.safetensors"))
    pc = SimpleNamespace(derive=derive, source=str(program), limits={"program_bytes": 8 << 20})
    read = []
    real = keys.sha256_or_none
    monkeypatch.setattr(keys, "sha256_or_none", lambda p, st=None: read.append(os.path.basename(p)) or real(p, st))
    within = keys.import_inputs(pc)["reads"]
    assert len(within["ck/config.json"]) == 64 and "config.json" in read
    with open(ck / "config.json", "r+b") as f:
        f.truncate(CONFIG_BYTES + 1)   # (sparse: no disk taken)
    read.clear()
    over = keys.import_inputs(pc)["reads"]
    assert over["ck/config.json"] == f"over the limit: {CONFIG_BYTES + 1} bytes" and "config.json" not in read
    assert over["ck/model.safetensors"] == within["ck/model.safetensors"]


def test_code_edited_with_its_size_and_mtime_kept_runs_as_edited(tmp_path):
    """Python's bytecode cache trusts a .pyc while its source keeps mtime and size: the package's
    are checked against the source's bytes, so the code that runs is the code the key hashed."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, "dtypes: [float64]\n")})
    writes = {"PYTHONDONTWRITEBYTECODE": ""}    # as most users run: Python writes its .pyc files
    rc, ran, out = doit(z, env=writes)
    assert rc == 0 and _results(z)[("b", "float64")]["tolerance"]["abs"] == 1e-9, out
    _same_stat_edit(z / "emitter/verify/tolerances.py",
                    lambda b: b.replace(b'"float64": {"abs": 1e-9', b'"float64": {"abs": 7e-9'))
    rc, ran, out = doit(z, env=writes)
    assert rc == 0 and "lock:b" in ran, out
    assert _results(z)[("b", "float64")]["tolerance"]["abs"] == 7e-9


EDITING_IMPORTER = FAKE_IMPORTER.replace(
    "    return 0\n",
    "    y = os.path.join(os.path.dirname(os.path.dirname(args.program)), 'programs', 'd.yaml')\n"
    "    with open(y, 'a') as f:\n"
    "        f.write('steps: 2\\n')   # the config moves while the run is under way\n"
    "    return 0\n")


def test_a_config_edited_while_the_run_is_under_way_is_locked_again(tmp_path):
    z = _derived_zoo(tmp_path)
    (z / "emitter/importers/fake.py").write_text(EDITING_IMPORTER)
    rc, ran, out = doit(z)
    assert rc == 1 and "lock:d" in ran, out                 # the run's report: not current
    assert _results(z)[("d", "float64")]["steps"] == 1      # the config as the run loaded it
    report = json.loads((z / "build/report.json").read_text())["results"]
    assert all(r["verdict"] == "error" and not r["current"] and "programs/d.yaml: changed during this run"
               in r["reason"] for r in report), report
    assert "steps: 2" in (z / "programs/d.yaml").read_text()
    (z / "emitter/importers/fake.py").write_text(FAKE_IMPORTER)
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:d" in ran, out
    assert _results(z)[("d", "float64")]["steps"] == 2
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:d" not in ran, out


def test_weights_derived_before_the_checkpoint_moved_are_never_locked_under_its_new_key(tmp_path):
    """A lock keys derived weights by the import of the checkpoint as it is when the lock runs:
    weights derived from it as it was (it moved between `weights:d` and `lock:d`, here by a user's
    task doit runs between them) are not what that key names, so no verdict is computed on them
    and recorded under it; the next run derives them again and locks."""
    z = _derived_zoo(tmp_path)
    with open(z / "dodo.py", "a") as f:
        f.write("\n\ndef task_move():\n    import numpy as np\n    return {'actions': [lambda: "
                "os.environ.get('MOVE') and np.full(16, 3.0).tofile('ckpt/w.bin') or None], "
                "'uptodate': [False]}\n")
    rc, ran, out = doit(z, "weights:d", "move", "lock:d", env={"MOVE": "1"})
    assert rc != 0 and {"weights:d", "move", "lock:d"} <= ran, out
    for r in _results(z).values():
        assert r["verdict"] == "error" and r["key"] is None and "derived from other inputs" in r["reason"], r
    rc, ran, out = doit(z)
    assert rc == 0 and {"weights:d", "lock:d"} <= ran, out
    assert (z / "build/weights/d/w.f64").read_bytes() == (z / "ckpt/w.bin").read_bytes()
    assert all(r["verdict"] == "pass" and r["key"] for r in _results(z).values())


def test_a_limit_a_check_can_run_into_is_in_its_key(tmp_path):
    """`limits.seconds` (a check over it is an error) is part of the merged config the key holds:
    a verdict taken under another limit is not current; the tensor limit by default (half this
    machine's memory) is not, so clones on other machines share keys."""
    import subprocess
    import sys
    from emitter.pipeline.checks import entries
    from emitter.pipeline.config import discover
    z = make_zoo(tmp_path / "zoo", {"p": (PROG_B, None)})
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:p" in ran, out
    spec = entries(discover(str(z)))[0].checks[0].spec
    assert spec["config"]["limits"] == {"seconds": 3600, "tensor_bytes": None}
    (z / "programs/p.yaml").write_text("limits: {seconds: 600}\n")
    res = subprocess.run([sys.executable, "-m", "emitter", "results", "p"], cwd=z, capture_output=True, text=True)
    assert res.returncode == 1 and "not current" in res.stdout, res.stdout + res.stderr
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:p" in ran, out
    (z / "programs/p.yaml").write_text("limits: {seconds: 600, tensor_bytes: 1000000}\n")
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:p" in ran, out           # a tensor limit the config sets: in the key
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:p" not in ran, out
    # the history read from outside its zoo: no currency can be told, and none is claimed
    db = str(z / "build/results.sqlite")
    res = subprocess.run([sys.executable, "-m", "emitter", "results", "--db", db], cwd=tmp_path,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(z)})
    assert res.returncode == 1 and "whether each is current is not known" in res.stdout, res.stdout + res.stderr
    res = subprocess.run([sys.executable, "-m", "emitter", "results", "--db", db, "--json"], cwd=tmp_path,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(z)})
    assert res.returncode == 1 and json.loads(res.stdout)["not_current"] is None
    # a program's history as JSON, oldest first; --prune with a name is refused, never ignored
    res = subprocess.run([sys.executable, "-m", "emitter", "results", "--history", "p", "--json"], cwd=z,
                         capture_output=True, text=True)
    runs = json.loads(res.stdout)["runs"]
    assert res.returncode == 0 and len(runs) == 6 and {r["verdict"] for r in runs} == {"pass"}, res.stdout
    assert [r["id"] for r in runs] == sorted(r["id"] for r in runs) and runs[0]["name"] == "p"
    newest = {r["dtype"]: r["id"] for r in runs}   # each check's newest run is its verdict now
    assert [(r["latest"], r["current"]) for r in runs] == [(r["id"] in newest.values(),) * 2 for r in runs]
    with open(z / "programs/p.logos", "a") as f:   # the program moves: no run of it is current
        f.write("Let later be sigmoid of y.\n")
    res = subprocess.run([sys.executable, "-m", "emitter", "results", "--history", "p", "--json"], cwd=z,
                         capture_output=True, text=True)
    assert [r["current"] for r in json.loads(res.stdout)["runs"]] == [False] * 6, res.stdout
    res = subprocess.run([sys.executable, "-m", "emitter", "results", "--history", "p"], cwd=z,
                         capture_output=True, text=True)
    assert res.stdout.count("NOT CURRENT") == 2 * len(newest), res.stdout   # each newest run, and the tally
    assert "6 runs of `p`; the latest of each check: float32 pass (NOT CURRENT)" in res.stdout, res.stdout
    res = subprocess.run([sys.executable, "-m", "emitter", "results", "--prune", "p"], cwd=z,
                         capture_output=True, text=True)
    assert res.returncode == 2 and "give no NAME" in res.stderr


def test_the_report_covers_a_check_doit_ignores(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0
    assert doit(z, "ignore", "lock:a")[0] == 0
    with open(z / "programs/a.logos", "a") as f:
        f.write("Let q be nonsense of h.\n")
    rc, ran, out = doit(z)
    assert rc != 0 and "emit:a" in ran and "lock:a" not in ran, out    # the run fails, as it says
    assert out.count("lock:a: ignored (`doit ignore`), so it does not run; `doit forget lock:a` lifts that") == 1, out
    report = json.loads((z / "build/report.json").read_text())
    rows = {(r["name"], r["check"]): r for r in report["results"]}
    assert rows[("a", "float64")]["verdict"] == "error" and not rows[("a", "float64")]["current"]
    assert rows[("b", "float64")]["verdict"] == "pass" and rows[("b", "float64")]["current"]
    assert (z / "build/summary.md").read_text().startswith("## ❌")
    assert 'errors="0"' not in (z / "build/junit.xml").read_text()
    # the program alone, its lock ignored: the refused emit fails the run, each time it is asked
    for args in (("lock:a",), ("emit:a",), ("emit:a",)):
        rc, ran, out = doit(z, *args)
        assert rc == 1 and ran == {"emit:a"} and "programs/a.logos:7: `Let q be nonsense of h.`" in out, out
    assert doit(z, "lock:b")[:2] == (0, set())
    for args in (("--reporter", "executed-only", "emit:a"), ("-r", "json", "lock:a")):   # another reporter
        assert doit(z, *args)[0] == 1, args
    assert doit(z, "--reporter", "executed-only", "lock:b")[0] == 0


def test_an_error_recorded_on_inputs_that_moved_since_says_it_is_not_current(tmp_path):
    """A lock that erred is rerun by every run, unless doit ignores it: then its recorded reason
    is about inputs that are not the zoo's now, and every view says so at the head of it."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    bad = np.random.default_rng(0).standard_normal((4, 4))
    bad[1, 2] = np.nan
    os.makedirs(z / "weights/a")
    bad.astype("<f8").tofile(z / "weights/a/w.f64")
    assert doit(z)[0] != 0

    def row(dtype="float64"):
        report = json.loads((z / "build/report.json").read_text())
        return next(r for r in report["results"] if (r["name"], r["check"]) == ("a", dtype))
    first = row()
    assert first["verdict"] == "error" and "non-finite" in first["reason"], first
    assert not first["reason"].startswith("not current"), first
    assert doit(z, "ignore", "lock:a")[0] == 0
    rc, ran, out = doit(z)                             # the same inputs: the error stands as it was
    assert rc != 0 and "lock:a" not in ran and row()["reason"] == first["reason"], out
    _weights(str(z / "weights/a/w.f64"), 0)            # fixed, the lock still ignored
    rc, ran, out = doit(z)
    assert rc != 0 and "lock:a" not in ran, out
    for dtype in ("float64", "float32"):
        r = row(dtype)
        assert r["verdict"] == "error" and not r["current"], r
        assert r["reason"].startswith("not current: recorded on inputs that have moved since (before "
                                      "this run's end, or after it; run doit to lock it again): "), r
    summary = (z / "build/summary.md").read_text()
    assert "not current: recorded on inputs that have moved since" in summary, summary
    assert "not current: recorded on inputs that have moved since" in (z / "build/junit.xml").read_text()
    assert doit(z, "forget", "lock:a")[0] == 0 and doit(z)[0] == 0   # locked again: it passes


def test_a_result_file_edited_by_hand_is_never_a_current_verdict(tmp_path):
    """A failing result edited to say pass: the history made again from it, and a report whose
    lock doit ignores, each say it is not the lock's, never a current pass."""
    import subprocess
    import sys
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "tolerances:\n  float32: {abs: 1.0e-12, rel: 1.0e-12}\n"),
                                    "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 1    # a fails at its tolerance
    result = z / "build/results/a/float32.json"
    text = result.read_text()
    assert '"verdict": "fail"' in text
    result.write_text(text.replace('"verdict": "fail"', '"verdict": "pass"'))
    (z / "build/results.sqlite").unlink()
    assert doit(z, "ignore", "lock:a")[0] == 0
    rc, ran, out = doit(z)                    # the history is made again from the files
    assert rc == 1 and "lock:a" not in ran, out
    report = json.loads((z / "build/report.json").read_text())
    row = next(r for r in report["results"] if (r["name"], r["check"]) == ("a", "float32"))
    assert row["verdict"] == "error" and not row["current"], row
    assert "not the one the lock wrote" in row["reason"], row
    # the void verdict's figures and place are none of the row's (junit would point at its line)
    assert (row["first_divergence"], row["worst"], row["output"], row["seconds"]) == (None, None, None, None), row
    junit = (z / "build/junit.xml").read_text()
    case = junit[junit.index('classname="a" name="float32"'):]
    assert ' line="' not in case[:case.index(">")], case[:300]
    assert "not the one the lock wrote" in (z / "build/summary.md").read_text()
    p = subprocess.run([sys.executable, "-m", "emitter", "results", "--json", "a"], cwd=z,
                       capture_output=True, text=True)
    runs = {r["dtype"]: (r["verdict"], r["current"]) for r in json.loads(p.stdout)["runs"]}
    assert p.returncode == 1 and runs["float32"] == ("pass", False) and runs["float64"] == ("pass", True), p.stdout
    result.write_text(text)                    # the lock's own file back: its fail stands again
    rc, ran, out = doit(z)
    row = next(r for r in json.loads((z / "build/report.json").read_text())["results"]
               if (r["name"], r["check"]) == ("a", "float32"))
    assert rc == 1 and row["verdict"] == "fail" and row["current"], row


def test_checks_of_a_program_changed_after_its_emit_or_refused_are_not_current(tmp_path):
    """With doit ignoring a program's emit and lock, its program edited: no view says its old
    verdicts are current. A refusal recorded by an earlier lock is told as the emit says it now."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0
    assert doit(z, "ignore", "emit:b")[0] == 0 and doit(z, "ignore", "lock:b")[0] == 0
    with open(z / "programs/b.logos", "a") as f:
        f.write("Let z be sigmoid of y.\n")
    rc, ran, out = doit(z)
    assert rc == 1 and not ran & {"emit:b", "lock:b"}, out

    def rows():
        report = json.loads((z / "build/report.json").read_text())
        return {(r["name"], r["check"]): r for r in report["results"]}
    for dtype in ("float64", "float32"):
        r = rows()[("b", dtype)]
        assert r["verdict"] == "error" and not r["current"], r
        assert "its program or bundle changed after its emit" in r["reason"], r
    assert rows()[("a", "float64")]["current"]
    # b refused, locked in that state, then refused otherwise while its lock is ignored
    assert doit(z, "forget", "emit:b", "lock:b")[0] == 0
    (z / "programs/b.logos").write_text(PROG_B + "Let q be nonsense of y.\n")
    assert doit(z)[0] == 1 and "nonsense" in rows()[("b", "float64")]["reason"]
    assert doit(z, "ignore", "lock:b")[0] == 0
    (z / "programs/b.logos").write_text(PROG_B + "Let q be sigmoidd of y.\n")
    rc, ran, out = doit(z)
    assert rc == 1 and "emit:b" in ran and "lock:b" not in ran, out
    for dtype in ("float64", "float32"):
        r = rows()[("b", dtype)]
        assert r["verdict"] == "error" and "sigmoidd" in r["reason"] and "nonsense" not in r["reason"], r


def test_a_check_that_fails_fails_the_run_whatever_task_before_its_lock_doit_ignores(tmp_path):
    """`doit ignore emit:a` has doit skip lock:a after it, and the report too where it waited for
    lock:a: the report runs all the same, covering a by its recorded verdict, and the run exits 1
    while a's check fails (it exited 0, a report saying fail)."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "tolerances:\n  float32: {abs: 1.0e-12, rel: 1.0e-12}\n"),
                                    "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 1    # a fails at its tolerance
    assert doit(z, "ignore", "emit:a")[0] == 0
    rc, ran, out = doit(z)
    assert rc == 1 and "report" in ran and not ran & {"emit:a", "lock:a"}, out
    rows = {(r["name"], r["check"]): r for r in json.loads((z / "build/report.json").read_text())["results"]}
    assert rows[("a", "float32")]["verdict"] == "fail" and rows[("a", "float32")]["current"], rows
    (z / "programs/a.logos").write_text(PROG_A + "Let z be sigmoid of y.\n")   # moved, still ignored
    rc, ran, out = doit(z)
    rows = {(r["name"], r["check"]): r for r in json.loads((z / "build/report.json").read_text())["results"]}
    assert rc == 1 and not rows[("a", "float64")]["current"], out
    assert doit(z, "forget", "emit:a")[0] == 0
    (z / "programs/a.yaml").write_text("")
    (z / "programs/a.logos").write_text(PROG_A)
    assert doit(z)[0] == 0


def test_a_run_naming_a_lock_doit_ignores_exits_1_where_its_checks_are_not_current(tmp_path):
    """`doit lock:a` with lock:a ignored: doit skips it, and the run covers its checks by their
    verdicts as they are: current and passing, exit 0; after a's config moved (its verdict is no
    longer about it), exit 1 naming the task, never a 0 for checks nobody ran."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0
    assert doit(z, "ignore", "lock:a")[0] == 0
    rc, ran, out = doit(z, "lock:a")
    assert rc == 0 and "lock:a" not in ran, out
    (z / "programs/a.yaml").write_text("tolerances:\n  float64: {abs: 1.0e-30, rel: 1.0e-30}\n")
    rc, ran, out = doit(z, "lock:a")
    assert rc == 1 and "lock:a" not in ran, out
    assert "lock:a: not run (`doit ignore`, or `-s`, which runs the first task named alone) and not current" in out, out
    assert doit(z, "lock:b")[0] == 0
    assert doit(z, "forget", "lock:a")[0] == 0
    rc, ran, out = doit(z, "-s", "emit:a", "lock:a")   # (doit's -s runs the first task named alone)
    assert rc == 1 and "lock:a" not in ran and "lock:a: not run" in out, out
    assert doit(z, "-s", "emit:b", "lock:b")[0] == 0


def test_results_say_whether_each_verdict_is_current_and_the_history_is_made_again(tmp_path):
    import subprocess
    import sys
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0

    def results(*args):
        p = subprocess.run([sys.executable, "-m", "emitter", "results", *args], cwd=z,
                           capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr
    rc, out = results()
    assert rc == 0 and "2 programs, 4 checks, 0 not passing, 0 not current" in out, out
    _weights(str(z / "weights/a/w.f64"), 1)            # a's inputs move; nothing locked yet
    rc, out = results()
    assert rc == 1 and "0 not passing, 2 not current" in out, out
    assert sum("NOT CURRENT" in line for line in out.splitlines()) == 2
    rc, out = results("--json")
    runs = {(r["name"], r["dtype"]): r["current"] for r in json.loads(out)["runs"]}
    assert rc == 1 and runs == {("a", "float64"): False, ("a", "float32"): False,
                                ("b", "float64"): True, ("b", "float32"): True}, out
    rc, out = results("b")
    assert rc == 0, out
    (z / "programs/b.logos").rename(z / "programs/c.logos")   # renamed: b's verdicts are not the zoo's
    (z / "build/results.sqlite").unlink()              # and the history deleted
    assert doit(z)[0] == 0
    rc, out = results()
    assert rc == 0 and "2 programs, 4 checks, 0 not passing, 0 not current" in out, out
    assert " b " not in out
    with open(z / "programs/c.logos", "a") as f:          # edited, not locked since
        f.write("# a comment\n")
    assert results("c")[0] == 1 and results()[0] == 1
    assert doit(z)[0] == 0 and results()[0] == 0
    (z / "programs/a.yaml").write_text("dtypes: [float64]\n")    # a dtype dropped: not the zoo's
    (z / "programs/c.yaml").write_text("lock: false\n")           # not locked: no checks
    (z / "programs/d e.logos").write_text(PROG_B)                 # a name doit renames; no run yet
    rc, out = results("--json")
    runs = {(r["name"], r["dtype"]): (r["verdict"], r["current"]) for r in json.loads(out)["runs"]}
    d = next(n for n, _ in runs if n.startswith("invalid-name"))
    assert rc == 1 and runs == {("a", "float64"): ("pass", True), (d, "float64"): ("none", False),
                                (d, "float32"): ("none", False)}, out
    assert doit(z)[0] == 1     # `d e` is refused (its name): an error, as the run's report says
    rc, out = results()
    assert rc == 1 and "2 programs, 3 checks, 2 not passing" in out and d in out, out
    rc, out = results("c")
    assert rc == 2 and "the zoo locks it no more" in out and results("a")[0] == 0, out
    import sqlite3   # the history's newest row of a current result edited by hand: said so, and how
    with sqlite3.connect(z / "build/results.sqlite") as con:
        con.execute("UPDATE runs SET verdict = 'fail' WHERE id = (SELECT MAX(id) FROM runs WHERE name = 'a')")
    con.close()   # (each connection closed: one left open keeps a WAL the deleted history's next one reads)
    rc, out = results("a")
    assert rc == 1 and "fail  NOT CURRENT" in out and "its result in build/results/ is current" in out, out
    rc, out = results("a", "--json")
    assert [(r["current"], r["history_differs"]) for r in json.loads(out)["runs"]] == [(False, True)], out
    rc, out = results("--history", "a")
    assert rc == 0 and "its result in build/results/ is current" in out and "float64 fail (NOT CURRENT)" in out, out
    with sqlite3.connect(z / "build/results.sqlite") as con:   # its figures edited, key and verdict kept
        con.execute("UPDATE runs SET verdict = 'pass', max_abs = 0.5 WHERE id = (SELECT MAX(id) FROM runs "
                    "WHERE name = 'a')")
    rc, out = results("a", "--json")
    con.close()
    assert rc == 1 and [(r["current"], r["history_differs"], r["max_abs"]) for r in json.loads(out)["runs"]] \
        == [(False, True, 0.5)], out
    (z / "build/results.sqlite").unlink()
    assert doit(z)[0] == 1 and results("a")[0] == 0


def test_a_deleted_history_is_made_again_by_the_next_run_whatever_it_runs(tmp_path):
    """results.sqlite deleted: the next run, a no-op or one lock, makes it again from every
    check's result before any lock adds to it, so `logos results` covers the whole zoo (a failing
    check included) and never a part of it."""
    import subprocess
    import sys
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "tolerances:\n  float32: {abs: 1.0e-12, rel: 1.0e-12}\n"),
                                    "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 1    # a fails at its tolerance

    def results(*args):
        p = subprocess.run([sys.executable, "-m", "emitter", "results", *args], cwd=z,
                           capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr
    assert results()[0] == 1
    (z / "build/results.sqlite").unlink()
    rc, ran, out = doit(z, "lock:b")          # b is current: nothing of it runs
    assert "lock:b" not in ran, out
    rc, out = results()
    assert rc == 1 and "2 programs, 4 checks, 1 not passing" in out, out
    (z / "build/results.sqlite").unlink()
    with open(z / "programs/b.logos", "a") as f:
        f.write("Let z be silu of y.\n")
    rc, ran, out = doit(z, "lock:b")          # b's lock runs and records after the others are back
    assert "lock:b" in ran, out
    rc, out = results()
    assert rc == 1 and "2 programs, 4 checks, 1 not passing" in out, out
    rc, out = results("--history", "a")
    assert rc == 0 and out.count(" a ") == 2, out


@pytest.mark.parametrize("damage", ["garbage", "truncated", "broken page", "empty"])
def test_a_damaged_history_is_set_aside_and_made_again(tmp_path, damage):
    """results.sqlite damaged (overwritten, cut short, a page broken) or emptied: `logos results`
    says so in one line (exit 2; a check with no run where it is empty); the next run, a no-op,
    sets it aside as .damaged in one line (its header tells of garbage or a cut file; a broken
    page is told by the reader that met it) and fills a new one from every check's result. An
    earlier damaged copy is kept."""
    import subprocess
    import sys
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0
    db = z / "build/results.sqlite"
    with sqlite3.connect(db) as con:   # a history of some size, so a cut or a page can miss
        con.executemany("INSERT INTO runs (at, name, dtype, verdict, result) VALUES (?,?,?,?,?)",
                        [("-", f"old{i}", "float32", "pass", "x" * 3000) for i in range(200)])
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = db.read_bytes()
    (z / "build/results.sqlite.damaged").write_bytes(b"an earlier one")
    if damage == "garbage":
        db.write_bytes(b"not a database at all" * 100)
    elif damage == "truncated":
        db.write_bytes(data[:len(data) // 2])
    elif damage == "empty":
        db.write_bytes(b"")
    else:   # the root page of the runs table overwritten: the header is fine
        page = int.from_bytes(data[16:18], "big")
        db.write_bytes(data[:page] + b"\xff" * page + data[2 * page:])

    def results(*args):
        p = subprocess.run([sys.executable, "-m", "emitter", "results", *args], cwd=z,
                           capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr
    rc, out = results()
    if damage == "empty":
        assert rc == 2 and "no lock history yet (run `doit`)" in out and db.stat().st_size == 0, out
    else:
        assert rc == 2 and "sets it aside" in out, out
        assert "build/results.sqlite: not a history this project can read: damaged (" in out, out
        assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
    rc, ran, out = doit(z)   # a no-op
    assert rc == 0 and ran == set(), out
    if damage != "empty":
        assert out.count("build/results.sqlite was damaged") == 1, out
        assert "set aside as build/results.sqlite.damaged.2;" in out and "made again" in out, out
        assert (z / "build/results.sqlite.damaged").read_bytes() == b"an earlier one"
    rc, out = results("--json")
    assert rc == 0, out
    got = json.loads(out)
    assert (got["programs"], got["checks"], got["not_current"]) == (2, 4, 0), got
    rc, ran, out = doit(z)
    assert ran == set() and "damaged" not in out, out


def test_a_damaged_page_met_by_a_lock_is_a_warning_and_flags_the_history(tmp_path):
    """A lock whose history write meets a damaged page records its verdict all the same (a
    HistoryError, which the lock task says as a warning) and leaves the flag that has the next
    run walk the history's pages."""
    from emitter.pipeline import results
    db = str(tmp_path / "results.sqlite")
    results.record_all(db, [{"name": "a", "dtype": "float32", "verdict": "pass"}] * 300)
    data = open(db, "rb").read()
    page = int.from_bytes(data[16:18], "big")
    with open(db, "wb") as f:
        f.write(data[:page] + b"\xff" * page + data[2 * page:])
    with pytest.raises(results.HistoryError, match="damaged .*the next `doit` sets it aside"):
        results.record_all(db, [{"name": "a", "dtype": "float32", "verdict": "pass"}])
    assert os.path.exists(db + ".suspect")


def test_a_history_another_process_holds_is_said_so_and_waited_for_once(tmp_path, monkeypatch):
    """A history another process holds past the wait is no damaged one: said so (the verdicts
    stand); the process's later writers do not wait it out again."""
    import sqlite3
    import time
    from emitter.pipeline import results
    monkeypatch.setattr(results, "BUSY_S", 0.3)
    monkeypatch.setattr(results, "_BUSY", [])
    db = str(tmp_path / "build" / "results.sqlite")
    results.record_all(db, [{"name": "a", "dtype": "float32", "verdict": "pass"}])
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    with pytest.raises(results.HistoryHeld, match="held by another process .*the next `doit` adds their rows"):
        results.record_all(db, [{"name": "a", "dtype": "float32", "verdict": "fail"}])
    start = time.monotonic()
    with pytest.raises(results.HistoryHeld):
        results.record_all(db, [{"name": "a", "dtype": "float32", "verdict": "fail"}])
    assert time.monotonic() - start < 5 and results._BUSY
    holder.execute("ROLLBACK")
    holder.close()


def test_a_history_behind_its_results_is_brought_up_to_date_at_the_next_run(tmp_path, monkeypatch):
    """Rows a held history did not take: the history is marked behind, and the next run's start
    gives each check whose result file is its lock's own, and whose newest row is not that
    result, that result as its newest row; a result edited since is not taken; then the mark
    goes, and `logos results` agrees with the run."""
    import sqlite3
    from emitter.pipeline import results
    from test_pipeline import _entries
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None), "c": (PROG_B, "dtypes: [float64]\n")})
    assert doit(z)[0] == 0
    db = z / "build/results.sqlite"
    con = sqlite3.connect(db)
    con.execute("DELETE FROM runs WHERE name = 'b'")   # (the rows the held history did not take)
    con.commit()
    con.close()
    (z / "build/results.sqlite.behind").write_text("")
    edited = z / "build/results/c/float64.json"
    edited.write_text(edited.read_text().replace('"pass"', '"pass" ', 1))
    monkeypatch.chdir(z)
    results.catch_up(str(db), list(_entries(z).values()))
    rows = {(x["name"], x["dtype"]): x for x in results.latest(str(db))}
    assert {k for k in rows if k[0] == "b"} == {("b", "float64"), ("b", "float32")}
    assert rows[("b", "float32")]["key"] == json.loads((z / "build/results/b/float32.json").read_text())["key"]
    assert not (z / "build/results.sqlite.behind").exists()
    n = len(results.history(str(db), "c"))
    (z / "build/results.sqlite.behind").mkdir()   # (a folder as the mark: gone all the same)
    results.catch_up(str(db), list(_entries(z).values()))   # nothing behind now: nothing added
    assert len(results.history(str(db), "b")) == 2 and len(results.history(str(db), "c")) == n
    assert not (z / "build/results.sqlite.behind").exists()


@pytest.mark.parametrize("kind", ["folder", "dangling link"])
def test_a_history_that_cannot_be_opened_is_a_warning_never_a_failed_lock(tmp_path, kind):
    """results.sqlite a folder (a botched restore) or a link to nothing (a volume not mounted):
    the run's locks pass and it ends 0 with a warning naming it; `logos results` says what it is
    (exit 2). Neither is a traceback."""
    import subprocess
    import sys
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    db = z / "build/results.sqlite"
    db.parent.mkdir()
    db.mkdir() if kind == "folder" else db.symlink_to(tmp_path / "nowhere" / "x.sqlite")
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:b" in ran and "2 checks: 2 pass" in out, out
    assert "build/results.sqlite: not a file (a folder, or a link to nothing)" in out and "Traceback" not in out, out
    p = subprocess.run([sys.executable, "-m", "emitter", "results"], cwd=z, capture_output=True, text=True)
    assert p.returncode == 2 and "not a file" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_rows_judged_before_a_config_moved_are_judged_again_by_the_report(tmp_path, monkeypatch):
    """The report's currency check hands its judged rows to the report's action only where no
    config moved since the run began; else the action judges them again (and says so)."""
    from emitter.pipeline import actions, report_aside
    from test_pipeline import _entries
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    assert doit(z)[0] == 0
    monkeypatch.chdir(z)
    entries = list(_entries(z).values())
    assert actions.report_current(entries, "build", 1, None, True) is True and not report_aside.JUDGED
    with open(z / "programs/b.logos", "a") as f:
        f.write("Let z be silu of y.\n")
    assert actions.report_current(entries, "build", 1, None, True) is False
    assert list(report_aside.JUDGED) == ["build"]
    report_aside.JUDGED.clear()
    monkeypatch.setattr(report_aside, "changed_since", lambda entries, began: {"programs/b.yaml"})
    assert actions.report_current(entries, "build", 1, None, True) is False and not report_aside.JUDGED


def test_a_history_whose_checkpoint_is_under_way_is_not_damaged(tmp_path):
    """A history in WAL mode whose main file is shorter than its header says while its log holds
    the pages to come (a checkpoint under way, or stopped by a kill: SQLite finishes it) is left
    as it is by the header's check; the same file with no log beside it is a cut file."""
    from emitter.pipeline import guards
    db = tmp_path / "results.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("CREATE TABLE t (x TEXT)")
        con.executemany("INSERT INTO t VALUES (?)", [("x" * 3000,) for _ in range(100)])
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        data = db.read_bytes()
    db.write_bytes(data[:len(data) // 2])
    (tmp_path / "results.sqlite-wal").write_bytes(b"\x37\x7f\x06\x82" + bytes(60))
    guards.check_db(str(db), pages=False, keep=True)
    assert db.read_bytes() == data[:len(data) // 2] and not (tmp_path / "results.sqlite.damaged").exists()
    (tmp_path / "results.sqlite-wal").unlink()
    guards.check_db(str(db), pages=False, keep=True)
    assert not db.exists() and (tmp_path / "results.sqlite.damaged").read_bytes() == data[:len(data) // 2]


def test_results_are_not_current_where_a_bundle_or_derived_weights_were_edited_by_hand(tmp_path):
    """`logos results` takes a check's bundle and derived weights from the records its key names
    (the emit status, .derived.json): a hand edit of either on disk, even one that keeps size and
    mtime, makes its verdicts not current (exit 1), as the next run treats them; so does an edit
    of the golden/ the lock settled (the next run locks again to settle it)."""
    import subprocess
    import sys
    z = _derived_zoo(tmp_path)
    assert doit(z)[0] == 0

    def results(*args):
        p = subprocess.run([sys.executable, "-m", "emitter", "results", *args], cwd=z,
                           capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr
    assert results("d")[0] == 0
    for path, edit in ((z / "build/bundles/d/model.py", lambda b: b.replace(b"eps", b"epz", 1)),
                       (z / "build/weights/d/w.f64", lambda b: b[:-1] + bytes([b[-1] ^ 0x80])),
                       (z / "build/bundles/d/golden/golden.json", lambda b: b.replace(b"0", b"9", 1))):
        before = path.read_bytes()
        _same_stat_edit(path, edit)
        rc, out = results("d")
        assert rc == 1 and "NOT CURRENT" in out, (path, out)
        rc, out = results("--json")
        assert rc == 1 and not any(r["current"] for r in json.loads(out)["runs"]), out
        path.write_bytes(before)
        assert results("d")[0] == 0, path
    _same_stat_edit(z / "build/weights/d/w.f64", lambda b: b[:-1] + bytes([b[-1] ^ 0x80]))
    rc, ran, out = doit(z)
    assert rc == 0 and "weights:d" in ran, out    # made again: current again
    assert results("d")[0] == 0


# the test importer computing with a library of the import's: w scaled by safetensors.SCALE (the
# installed safetensors has none: 1)
SHADOWED_IMPORTER = FAKE_IMPORTER.replace("import os, shutil", "import os\nimport numpy as np\nimport safetensors").replace(
    '    shutil.copy(args.checkpoint, os.path.join(args.out, "w.f64"))',
    '    (np.fromfile(args.checkpoint) * getattr(safetensors, "SCALE", 1.0)).tofile(os.path.join(args.out, "w.f64"))')
assert "SCALE" in SHADOWED_IMPORTER and "shutil" not in SHADOWED_IMPORTER


def test_a_library_of_the_import_shadowed_on_the_path_is_in_the_import_key(tmp_path):
    """A `safetensors/` folder in the zoo, which the run's path finds before the installed library,
    makes other derived weights from the same checkpoint: the import key moves (weights derived
    and locked again, never the old verdicts standing on the new weights), and moves back with the
    folder gone. The import's child finds its libraries where the run does, the folder included."""
    z = _derived_zoo(tmp_path)
    (z / "emitter/importers/fake.py").write_text(SHADOWED_IMPORTER)
    ckpt = np.fromfile(z / "ckpt/w.bin")
    rc, ran, out = doit(z)
    assert rc == 0 and {"weights:d", "lock:d"} <= ran, out
    first = {n: r["key"] for n, r in _results(z).items()}
    (z / "safetensors").mkdir()
    (z / "safetensors/__init__.py").write_text("SCALE = 2.0\n")
    rc, ran, out = doit(z)
    assert {"weights:d", "lock:d"} <= ran, out
    assert np.array_equal(np.fromfile(z / "build/weights/d/w.f64"), 2 * ckpt)
    shadowed = _results(z)
    assert all(r["key"] != first[n] or r["verdict"] != "pass" for n, r in shadowed.items()), shadowed
    shutil.rmtree(z / "safetensors")
    rc, ran, out = doit(z)
    assert rc == 0 and {"weights:d", "lock:d"} <= ran, out
    assert np.array_equal(np.fromfile(z / "build/weights/d/w.f64"), ckpt)
    assert {n: r["key"] for n, r in _results(z).items()} == first


def test_the_import_runs_with_the_path_of_the_run(tmp_path, monkeypatch):
    """The import's command finds modules where the process that keyed it does, not first in its
    working folder (where `python -m` would look)."""
    import subprocess
    from emitter.importers.entry import same_path
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib/probe_where.py").write_text("import json, sys, safetensors\n"
                                                  "print(json.dumps([sys.argv[1:], sys.path, safetensors.__file__]))\n")
    (tmp_path / "cwd/safetensors").mkdir(parents=True)
    (tmp_path / "cwd/safetensors/__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    p = subprocess.run(same_path("probe_where", ["a", "--b", "c d"]), cwd=tmp_path / "cwd",
                       capture_output=True, text=True, timeout=120)
    args, path, found = json.loads(p.stdout)
    assert args == ["a", "--b", "c d"] and path[:len(sys.path)] == [x or os.getcwd() for x in sys.path]
    assert not found.startswith(str(tmp_path / "cwd"))


def test_a_run_that_does_not_end_leaves_no_report_that_says_pass(tmp_path):
    import signal
    import subprocess
    import sys
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0 and (z / "build/summary.md").read_text().startswith("## ✅")
    with open(z / "programs/b.logos", "a") as f:
        f.write("Let q be frobnicate of y.\n")
    p = subprocess.Popen([sys.executable, "-u", "-m", "doit"], cwd=z, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env={**os.environ, "LOGOS_PROGRESS": "names"})
    for line in p.stdout:
        if line.startswith(".  emit:b"):
            break
    p.send_signal(signal.SIGKILL)                       # no handler runs
    p.wait()
    for f in ("report.json", "junit.xml", "summary.md", "report.html"):
        assert not (z / "build" / f).exists(), f        # the last complete run's is set aside
    assert (z / "build/stale/summary.md").read_text().startswith("## ✅")
    rc, ran, out = doit(z)                              # the next run reports this zoo
    assert rc != 0 and (z / "build/summary.md").read_text().startswith("## ❌"), out
    assert not (z / "build/stale/summary.md").exists()


def test_inputs_that_come_back_take_their_verdict_from_the_store(tmp_path):
    """build/store/ holds every keyed verdict under its key, in the shared cache's entry format: a
    config edited and then put back locks nothing the second time."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "dtypes: [float64]\n")})
    _weights(str(z / "weights/a/w.f64"), 0)
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:a" in ran, out
    first = _results(z)[("a", "float64")]
    (z / "programs/a.yaml").write_text("dtypes: [float64]\nsteps: 2\n")
    rc, ran, out = doit(z)
    second = _results(z)[("a", "float64")]
    assert rc == 0 and "lock:a" in ran and second["steps"] == 2, out
    (z / "programs/a.yaml").write_text("dtypes: [float64]\n")          # back as it was
    rc, ran, out = doit(z)
    back = _results(z)[("a", "float64")]
    assert rc == 0 and back["key"] == first["key"] and back["timings"] == first["timings"], out
    entries = {p.stem: json.loads(p.read_text()) for p in (z / "build/store").rglob("*.json")}
    assert set(entries) == {first["key"], second["key"]}
    assert entries[first["key"]]["schema"] == "logos.verdict-cache"


def test_golden_is_about_the_verdicts_wherever_they_came_from(tmp_path):
    """golden/ (what `compile.py test` compares with: the VM's outputs and the checks' tolerances)
    names the checks' keys: verdicts kept from build/store/ bring back the golden/ their lock made
    (this checkout keeps a copy under the key), a verdict from the shared cache (which holds none)
    or golden/ that cannot be written leaves none, never the last lock's. Once a loose tolerance,
    then put back, and a broken model.py passed `compile.py test`."""
    import subprocess
    import sys
    url, secret = (tmp_path / "cache").as_uri(), {"LOGOS_CACHE_KEY": "k"}
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "dtypes: [float64, float32]\n")})
    _weights(str(z / "weights/a/w.f64"), 0)
    golden = z / "build/bundles/a/golden"

    def files():
        return {p.name: p.read_bytes() for p in golden.iterdir()}
    assert doit(z, f"cache={url}", env=secret)[0] == 0
    first = files()
    tol = json.loads(first["golden.json"])["tolerances"]
    keys = {dt: r["key"] for (n, dt), r in _results(z).items()}
    assert json.loads(first["golden.json"])["key"] and set(tol) == {"float64", "float32"}
    (z / "programs/a.yaml").write_text("dtypes: [float64, float32]\ntolerances:\n  float32: {abs: 2000.0, rel: 1.0}\n")
    rc, ran, out = doit(z, f"cache={url}", env=secret)
    assert rc == 0 and json.loads((golden / "golden.json").read_text())["tolerances"]["float32"]["abs"] == 2000.0
    (z / "programs/a.yaml").write_text("dtypes: [float64, float32]\n")   # back: verdicts from the store
    rc, ran, out = doit(z, f"cache={url}", env=secret)
    assert rc == 0 and "lock:a" in ran and {dt: r["key"] for (n, dt), r in _results(z).items()} == keys, out
    assert files() == first
    shutil.rmtree(z / "build")                                # a fresh clone: verdicts from the cache
    rc, ran, out = doit(z, f"cache={url}", env=secret)
    assert rc == 0 and all(r.get("from_cache") for r in _results(z).values()), out
    assert not golden.exists(), out
    p = subprocess.run([sys.executable, "build/bundles/a/compile.py", "test"], cwd=z, capture_output=True,
                       text=True)
    assert p.returncode != 0 and "no golden outputs" in p.stderr, p.stderr
    import sqlite3

    def rows():
        with sqlite3.connect(z / "build/results.sqlite") as con:
            return [tuple(r) for r in con.execute("SELECT dtype FROM runs ORDER BY id")]
    before = rows()
    rc, ran, out = doit(z)            # without cache=: the cache's verdicts stand, one check runs again
    assert rc == 0 and "lock:a" in ran and files() == first, out
    assert rows() == before + [("float32",)]     # the kept one is in the history already
    results = _results(z)
    assert results[("a", "float64")].get("from_cache") and not results[("a", "float32")].get("from_cache")
    assert doit(z)[:2] == (0, set())
    shutil.rmtree(z / "build/store/golden", ignore_errors=True)
    (z / "build/store/golden").write_text("not a folder")    # a copy cannot be kept: golden/ is made
    (z / "programs/a.yaml").write_text("dtypes: [float64, float32]\nsteps: 2\n")
    rc, ran, out = doit(z, f"cache={url}", env=secret)
    assert rc == 0 and "lock:a" in ran and json.loads((golden / "golden.json").read_text())["steps"] == 2, out
    assert doit(z)[:2] == (0, set())                         # and nothing runs again for it


def test_golden_is_never_left_where_no_lock_settles_it(tmp_path):
    """A copy in build/store/golden that cannot be read (a broken deflate stream: zlib's error,
    not zipfile's) is a miss, never a failed task: the lock keeps its verdicts and runs one check
    again for golden/ (and a good copy). A refused program, or one that is not locked, has no golden/ once emitted."""
    import zipfile
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "dtypes: [float64, float32]\n")})
    _weights(str(z / "weights/a/w.f64"), 0)
    golden = z / "build/bundles/a/golden"
    assert doit(z)[0] == 0
    key = json.loads((golden / "golden.json").read_text())["key"]
    copy = z / "build/store/golden" / key[:2] / f"{key}.golden"
    with zipfile.ZipFile(copy) as f:
        files = {n: f.read(n) for n in f.namelist()}
    with zipfile.ZipFile(copy, "w", zipfile.ZIP_DEFLATED) as f:
        for n, data in files.items():
            f.writestr(n, data)
    raw = bytearray(copy.read_bytes())
    at = raw.index(b"output.1.f64") + len("output.1.f64")
    raw[at + 4:at + 12] = bytes(b ^ 0xFF for b in raw[at + 4:at + 12])
    copy.write_bytes(bytes(raw))
    (z / "programs/a.yaml").write_text("dtypes: [float64, float32]\nsteps: 2\n")
    assert doit(z)[0] == 0
    (z / "programs/a.yaml").write_text("dtypes: [float64, float32]\n")   # its verdicts come back,
    rc, ran, out = doit(z)                                 # golden/ made again by one check
    assert rc == 0 and "lock:a" in ran and json.loads((golden / "golden.json").read_text())["key"] == key, out
    assert all(r["verdict"] == "pass" for r in _results(z).values())
    rc, ran, out = doit(z)
    assert (rc, ran) == (0, set()), out
    copy.write_bytes(bytes(raw))                           # damaged again, golden/ gone: the same
    shutil.rmtree(golden)
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:a" in ran and json.loads((golden / "golden.json").read_text())["key"] == key, out
    assert doit(z)[:2] == (0, set())
    (z / "programs/a.yaml").write_text("dtypes: [float64, float32]\nsteps: 2\n")
    assert doit(z)[0] == 0 and golden.exists()
    (z / "programs/a.yaml").write_text("lock: false\n")
    with open(z / "programs/a.logos", "a") as f:
        f.write("Let z be silu of y.\n")
    rc, ran, out = doit(z)
    assert rc == 0 and "emit:a" in ran and not golden.exists(), out
    (z / "programs/a.yaml").write_text("dtypes: [float64]\n")
    assert doit(z)[0] == 0 and golden.exists()
    with open(z / "programs/a.logos", "a") as f:
        f.write("Let q be frobnicate of y.\n")
    rc, ran, out = doit(z)
    assert rc != 0 and not golden.exists(), out


def test_golden_written_by_a_hand_lock_is_settled_again_by_the_next_run(tmp_path):
    """`logos lock` by hand on a zoo bundle (a loose --atol) writes golden/ with its own
    tolerance: the next run is not a no-op, keeps its verdicts (nothing recomputed) and puts the
    zoo's golden/ back; a hand-deleted golden/ too. Once the hand lock's golden/ stood for good."""
    import subprocess
    import sys
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "dtypes: [float64, float32]\n")})
    _weights(str(z / "weights/a/w.f64"), 0)
    golden = z / "build/bundles/a/golden"
    assert doit(z)[0] == 0
    zoo_golden = {p.name: p.read_bytes() for p in golden.iterdir()}
    results = {n: (z / "build/results/a" / f"{n}.json").read_bytes() for n in ("float64", "float32")}
    p = subprocess.run([sys.executable, "-m", "emitter", "lock", "build/bundles/a", "--program",
                        "programs/a.logos", "--weights", "weights/a", "--dtype", "float32", "--atol",
                        "1000", "-o", str(tmp_path / "r.json")], cwd=z, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(z)})
    assert p.returncode == 0, p.stderr
    hand = json.loads((golden / "golden.json").read_text())
    assert "key" not in hand and hand["tolerances"]["float32"]["abs"] == 1000.0
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:a" in ran, out
    assert {p.name: p.read_bytes() for p in golden.iterdir()} == zoo_golden
    assert {n: (z / "build/results/a" / f"{n}.json").read_bytes() for n in results} == results   # kept
    assert doit(z)[:2] == (0, set())
    shutil.rmtree(golden)
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:a" in ran and {p.name: p.read_bytes() for p in golden.iterdir()} == zoo_golden
    body = json.loads((golden / "golden.json").read_text())          # edited, its key kept
    body["tolerances"]["float32"]["abs"] = 1000.0
    (golden / "golden.json").write_text(json.dumps(body))
    (golden / "output.1.f64").write_bytes(b"\0" * len(zoo_golden["output.1.f64"]))
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:a" in ran and {p.name: p.read_bytes() for p in golden.iterdir()} == zoo_golden
    for stray in ("file", "folder", "link"):   # what no lock made: removed, nothing recomputed
        if stray == "file":
            (golden / "output.2.f64").write_bytes(b"hi\n")
        elif stray == "folder":
            (golden / "sub").mkdir()
            (golden / "sub" / "x").write_text("x")
        else:
            (golden / "output.3.f64").symlink_to(tmp_path / "nowhere")
        rc, ran, out = doit(z)
        assert rc == 0 and "lock:a" in ran and sorted(os.listdir(golden)) == sorted(zoo_golden), (stray, out)
        assert {p.name: p.read_bytes() for p in golden.iterdir()} == zoo_golden
        assert "PASS" not in out and doit(z)[:2] == (0, set()), out


def test_golden_follows_the_checks_a_program_has(tmp_path):
    """A dtype dropped from the config: its result goes, the next no-op keeps nothing about it and
    golden/ holds the checks left (their verdicts kept; one check runs again for golden/, of which
    no copy is kept for that set). Verdicts from a shared cache (which holds no golden/): a run
    without cache= makes golden/ the same way. `lock: false`: golden/, the results and the lock
    status go with the next emit."""
    url, secret = (tmp_path / "cache").as_uri(), {"LOGOS_CACHE_KEY": "k"}
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "dtypes: [float64, float32]\n")})
    _weights(str(z / "weights/a/w.f64"), 0)
    golden = z / "build/bundles/a/golden"
    assert doit(z, f"cache={url}", env=secret)[0] == 0
    (z / "programs/a.yaml").write_text("dtypes: [float64]\n")
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:a" in ran and sorted(os.listdir(z / "build/results/a")) == ["float64.json"], out
    assert set(json.loads((golden / "golden.json").read_text())["tolerances"]) == {"float64"}
    assert doit(z)[:2] == (0, set())
    shutil.rmtree(z / "build")                                   # a fresh clone, the cache warm
    rc, ran, out = doit(z, f"cache={url}", env=secret)
    assert rc == 0 and all(r.get("from_cache") for r in _results(z).values()) and not golden.exists(), out
    rc, ran, out = doit(z, f"cache={url}", env=secret)
    assert rc == 0 and not ran & {"lock:a", "emit:a"}, out
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:a" in ran and (golden / "golden.json").is_file(), out
    assert not _results(z)[("a", "float64")].get("from_cache")
    assert doit(z)[:2] == (0, set())
    (z / "programs/a.yaml").write_text("lock: false\n")
    rc, ran, out = doit(z)
    assert rc == 0 and "emit:a" in ran and not golden.exists() and not (z / "build/results/a").exists(), out
    assert not (z / "build/status/a.lock.json").exists() and doit(z)[:2] == (0, set())


def test_a_run_that_names_its_tasks_leaves_the_report_where_it_is_current(tmp_path):
    """`doit lock:b` with nothing moved: the report of the last complete run is back in build/ at
    the end (CI reads junit.xml after it); with b edited and relocked it stays aside (not about
    the checks now) until a run writes one."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0
    junit = (z / "build/junit.xml").read_bytes()
    assert doit(z, "lock:b")[:2] == (0, set()) and (z / "build/junit.xml").read_bytes() == junit
    with open(z / "programs/b.logos", "a") as f:
        f.write("# a comment\n")
    rc, ran, out = doit(z, "lock:b")
    assert rc == 0 and "lock:b" in ran and not (z / "build/junit.xml").exists(), out
    rc, ran, out = doit(z)
    assert rc == 0 and ran == {"report"} and (z / "build/junit.xml").exists(), out
    with open(z / "build/bundles/a/model.py", "a") as f:   # a's bundle edited: a's verdicts not current
        f.write("# edited\n")
    rc, ran, out = doit(z, "lock:b")
    assert rc == 0 and not ran and not (z / "build/junit.xml").exists(), out


def test_golden_whose_copy_was_evicted_is_kept_again_not_recomputed(tmp_path):
    """build/store/golden emptied (evicted past its limit): a lock task that runs keeps golden/ as
    the lock settled it (its key, its files as recorded) as the copy again, running no check."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "dtypes: [float64, float32]\n")})
    _weights(str(z / "weights/a/w.f64"), 0)
    golden = z / "build/bundles/a/golden"
    assert doit(z)[0] == 0
    before = {n: r["timings"] for n, r in _results(z).items()}
    settled = {p.name: p.read_bytes() for p in golden.iterdir()}
    shutil.rmtree(z / "build/store/golden")
    (z / "build/results/a/float32.json").unlink()        # the lock task runs: its result from the store
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:a" in ran and {n: r["timings"] for n, r in _results(z).items()} == before, out
    assert {p.name: p.read_bytes() for p in golden.iterdir()} == settled
    assert len(list((z / "build/store/golden").rglob("*.golden"))) == 1 and doit(z)[:2] == (0, set())


def test_a_failing_check_fails_the_run_whatever_reaches_the_report(tmp_path):
    """The report ignored, `cache` named without a cache, another reporter: a failing check
    exits 1 all the same; with cache=, a failing check is one fail (exit 1), never an error of
    the cache task that follows."""
    url, secret = (tmp_path / "cache").as_uri(), {"LOGOS_CACHE_KEY": "k"}
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "tolerances:\n  float32: {abs: 1.0e-30, rel: 1.0e-30}\n"),
                                    "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 1
    for args in (("-r", "json", "lock:a", "cache"), ("-r", "json", "lock:a", "ca*")):
        assert doit(z, *args)[0] == 1, args
    rc, ran, out = doit(z, f"cache={url}", env=secret)
    assert rc == 1 and "cache task" not in out and "3 pass, 1 fail" in out, out
    assert "cache" not in (z / "build/summary.md").read_text().split("### All checks")[0]
    assert doit(z, "ignore", "report")[0] == 0
    for args in ((), ("-r", "json"), ("lock:a", "report")):
        assert doit(z, *args)[0] == 1, args


def test_a_program_comment_edit_never_imports_its_checkpoint_again(tmp_path):
    """The import is current by its key whatever doit's DB holds: a derived program's comments
    and blank lines edited, or build/ restored without its statuses and doit's DB (a CI cache of
    build/weights alone), rerun what moved and never the import (gemma3's: 30 s, 1 GB); an edited
    sentence (what the importer reads: leaves, shapes, ops) imports again."""
    z = _derived_zoo(tmp_path)
    assert doit(z)[0] == 0
    derived = (z / "build/weights/d/.derived.json").stat().st_mtime_ns
    text = (z / "programs/d.logos").read_text()
    (z / "programs/d.logos").write_text("# a comment\n\n" + text.replace("\n", "\r\n") + "   # another\n")
    rc, ran, out = doit(z)
    assert rc == 0 and "emit:d" in ran and "weights:d" not in ran, out
    for gone in ("status", ".doit.db"):
        p = z / "build" / gone
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    rc, ran, out = doit(z)
    assert rc == 0 and "emit:d" in ran and "weights:d" not in ran, out
    assert (z / "build/weights/d/.derived.json").stat().st_mtime_ns == derived
    (z / "programs/d.logos").write_text(text.replace("Set item 3 of x to -0.5.", "Set item 3 of x to -0.25."))
    rc, ran, out = doit(z)
    assert rc == 0 and {"weights:d", "emit:d", "lock:d"} <= ran, out
    assert (z / "build/weights/d/.derived.json").stat().st_mtime_ns != derived


def _emitter_imports(rel):
    """The emitter package's files that importing `rel` runs: every module it imports (at the top
    or inside a function, relative or absolute) and the __init__.py of each package on the way."""
    import ast
    from emitter.pipeline.digests import PACKAGE

    def found(mod):
        path = mod.replace(".", "/")
        return [c for c in (path + ".py", path + "/__init__.py", "__init__.py" if not mod else None)
                if c and os.path.isfile(os.path.join(PACKAGE, c))][:1]

    here = rel.split("/")[:-1]
    mods = set()
    for node in ast.walk(ast.parse(open(os.path.join(PACKAGE, rel), encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "emitter"):
            base = here[:len(here) - node.level + 1] if node.level else []
            mod = ".".join(base + (node.module.split(".")[node.level == 0:] if node.module else []))
            mods |= {mod} | {f"{mod}.{a.name}".lstrip(".") for a in node.names}
        elif isinstance(node, ast.Import):
            mods |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("emitter.")}
    files = {f for m in mods for f in found(m)}
    return files | {"/".join(f.split("/")[:i] + ["__init__.py"]) for f in files | {rel}
                    for i in range(f.count("/") + 1)}


@pytest.mark.parametrize("kind", ["emit", "lock", "import", "vm", "report"])
def test_each_code_digest_covers_every_module_its_code_imports(kind):
    """An edit of any code a kind's work runs changes that kind's digest: what its files import,
    to the end (rope_tables, which writes an import's COS and SIN, is in ops/, not importers/)."""
    from emitter.pipeline.digests import code_files
    have = set(code_files(kind))
    seen, todo = set(), list(have)
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo += _emitter_imports(f)
    assert sorted(seen - have) == [], f"{kind}: digests.CODE misses what its code imports"
    if kind == "import":
        assert {"ops/rope.py", "language/reader.py"} <= have


def test_a_file_no_leaf_claims_is_never_read(zoo):
    """A file in a weights folder that no leaf claims is in the key by name and size and never
    read: not by the keys, not by doit's file checker (a 16 GB file left there cost a minute a
    run), so it is on no hash record; a touch of it changes nothing."""
    from emitter import fingerprint
    assert doit(zoo)[0] == 0
    big = zoo / "weights" / "a" / "big.bin"
    with open(big, "wb") as f:
        f.truncate(64 << 20)   # sparse: its size is all the key reads of it
    time.sleep(fingerprint.RACY_S + 0.5)   # a hash taken now would be recorded
    rc, ran, out = doit(zoo)
    assert rc == 0 and "lock:a" in ran, out
    record = json.loads((zoo / "build/.fingerprints.json").read_text())["files"]
    assert any(p.endswith("w.f64") for p in record) and not [p for p in record if "big.bin" in p]
    r = json.loads((zoo / "build/results/a/float64.json").read_text())
    assert r["inputs"]["weights"]["others"] == {"big.bin": 64 << 20}
    os.utime(big)
    rc, ran, out = doit(zoo)
    assert rc == 0 and "lock:a" not in ran, (ran, out)


def test_a_program_over_its_size_limit_is_never_hashed(tmp_path, monkeypatch):
    """The emit refuses a program over limits.program_bytes unread; its key holds its size, so a
    sparse 4 GiB file costs a stat, not a read of 4 GiB, and a change of its size moves the key."""
    from emitter import fingerprint
    from emitter.pipeline import keys
    from emitter.pipeline.checks import entries
    from emitter.pipeline.config import discover
    (tmp_path / "programs").mkdir()
    big = tmp_path / "programs" / "p.logos"
    with open(big, "wb") as f:
        f.truncate(4 << 30)
    monkeypatch.chdir(tmp_path)
    read = []
    real = fingerprint.sha256_or_none
    monkeypatch.setattr(keys, "sha256_or_none", lambda p, *a: read.append(p) or real(p, *a))
    e = entries(discover(str(tmp_path)))[0]
    first = keys.emit_key(e)
    assert keys.over_limit(e.pc) == 4 << 30 and not [p for p in read if p.endswith("p.logos")], read
    with open(big, "r+b") as f:
        f.truncate((4 << 30) + 1)
    assert keys.emit_key(e) != first


IMPORTED_AS_READ = """
import importlib, os, sys
sys.path.insert(0, ".")
import emitter.tasks  # noqa: F401  (as doit loads a dodo)
from emitter.bytecode import IMPORTED
from emitter.pipeline import digests
if sys.argv[1] == "source":   # a read of a module's file for its text records nothing; a reload does
    path = os.path.abspath(digests.__file__)
    first = IMPORTED[path]
    with open(path, "a") as f:
        f.write("# edited\\n")
    sys.modules["emitter.pipeline.digests"].__loader__.get_source("emitter.pipeline.digests")
    kept = IMPORTED[path] == first
    importlib.reload(digests)
    print(kept, IMPORTED[path] != first)
else:   # an emit module imported lazily as an edit left it, then put back: not the key's code
    key = digests.code("emit")
    lazy = "emitter.language.lines" not in sys.modules
    path = "emitter/language/lines.py"
    text = open(path).read()
    with open(path, "a") as f:
        f.write("# edited\\n")
    import emitter.language.lines  # noqa: F401
    with open(path, "w") as f:
        f.write(text)
    print(lazy, digests.package_digest("emit") == key, digests.unchanged("emit"))
"""


def test_a_module_is_hashed_as_its_import_read_it(tmp_path):
    """bytecode.IMPORTED holds each module's source as its import (or a reload) read it, never a
    later read of the file for its text; an emit whose lazily imported module was an edit, put
    back since, is not the code its key names (`unchanged`)."""
    from test_pipeline import make_zoo
    from test_trace import _printed
    zoo = make_zoo(tmp_path / "zoo", {})
    assert _printed(zoo, IMPORTED_AS_READ, "source") == "True True"
    assert _printed(zoo, IMPORTED_AS_READ, "emit") == "True True False"


def test_a_named_lock_that_ran_and_failed_is_a_failure_not_a_task_not_run(tmp_path):
    """`doit lock:a` whose check fails: the run exits 1 with the check's FAIL line, and never says
    the lock did not run (it ran; `doit -s` after an edit runs it too)."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0
    for i, args in enumerate((("lock:a",), ("-n", "2", "lock:a", "lock:b"), ("-s", "lock:a"))):
        (z / "programs/a.yaml").write_text(f"dtypes: [float32]\ntolerances:\n  float32: {{abs: 1.0e-3{i}, rel: 0}}\n")
        rc, ran, out = doit(z, *args)
        assert rc == 1 and "lock:a [float32] FAIL" in out and "not run" not in out, (args, out)


def test_a_named_run_under_another_reporter_brings_a_current_report_back(tmp_path):
    """The zoo's reporter brings the report set aside as a run began back where it is current at
    the run's end; under another reporter (`doit --reporter json lock:a`) the run's exit does:
    a no-op leaves the report in build/, a run that moved a check leaves it aside."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0
    files = ("report.json", "junit.xml", "summary.md", "report.html")
    wrote = {f: (z / "build" / f).read_bytes() for f in files}
    for args in (("--reporter", "json", "lock:a"), ("-r", "executed-only", "emit:b", "lock:b")):
        assert doit(z, *args)[0] == 0, args
        assert {f: (z / "build" / f).read_bytes() for f in files if (z / "build" / f).exists()} == wrote, args
    (z / "programs/a.yaml").write_text("dtypes: [float32]\ntolerances:\n  float32: {abs: 1.0e-30, rel: 0}\n")
    assert doit(z, "--reporter", "json", "lock:a")[0] == 1
    assert not any((z / "build" / f).exists() for f in files)   # aside: a check no longer passes


def test_a_build_made_on_a_machine_with_other_memory_is_current_where_its_programs_fit(tmp_path):
    """The tensor limit by default is half the machine's memory: no part of an emit's key (a build/
    restored on a machine with other memory reruns nothing and every verdict is current there),
    though a program whose tensors are over the limit there is not current (its emit refuses it)."""
    import subprocess
    import sys
    z = make_zoo(tmp_path / "zoo", {"p": (PROG_B, None)})
    assert doit(z)[0] == 0

    def other(memory, *args):   # `python -m doit` / `logos` on a machine with `memory` bytes
        code = ("import os, sys\nsysconf = os.sysconf\n"   # (before anything reads it)
                "os.sysconf = lambda n: %d // sysconf('SC_PAGE_SIZE') if n == 'SC_PHYS_PAGES' else sysconf(n)\n"
                "sys.argv[0] = 'doit'\n" % memory + ("from doit.__main__ import main; sys.exit(main())" if args[0] == "doit"
                                                     else "from emitter.cli import main; sys.exit(main())"))
        return subprocess.run([sys.executable, "-c", code, *args[1:]], cwd=z, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(z), "LOGOS_PROGRESS": "names"})
    for memory in (3 << 30, 64 << 30):
        res = other(memory, "logos", "results")
        assert res.returncode == 0 and "0 not current" in res.stdout, res.stdout + res.stderr
        res = other(memory, "doit")
        assert res.returncode == 0 and not [line for line in res.stdout.splitlines() if line.startswith(".  ")], \
            res.stdout + res.stderr
    res = other(0, "logos", "results")   # its tensors (float64) are over half of no memory there
    assert res.returncode == 1 and "not current" in res.stdout, res.stdout + res.stderr
    assert other(0, "doit").returncode == 1
    rc, ran, out = doit(z)   # and back here: emitted again, its lock taken from the store
    assert rc == 0 and "emit:p" in ran, out
    assert subprocess.run([sys.executable, "-m", "emitter", "results"], cwd=z, capture_output=True).returncode == 0


def test_a_checkpoint_is_keyed_by_the_file_it_names_not_its_spelling(tmp_path):
    """`./ckpt//w.bin` is `ckpt/w.bin`: no import and no lock again; a path holding a `+` is a path,
    not a chunked `package:` spec, and one named `--help` a file, not the importer's option."""
    z = _derived_zoo(tmp_path)
    assert doit(z)[0] == 0
    (z / "programs/d.yaml").write_text("derive:\n  importer: fake\n  checkpoint: ./ckpt//w.bin\n")
    rc, ran, out = doit(z)
    assert rc == 0 and not {"weights:d", "lock:d"} & ran, out
    os.rename(z / "ckpt", z / "ckpt+v2")
    (z / "programs/d.yaml").write_text("derive:\n  importer: fake\n  checkpoint: ckpt+v2/w.bin\n")
    rc, ran, out = doit(z)
    assert rc == 0 and {"weights:d", "lock:d"} <= ran, out
    assert _results(z)[("d", "float64")]["verdict"] == "pass"
    os.rename(z / "ckpt+v2/w.bin", z / "--help")   # a file named like an option is a file
    (z / "programs/d.yaml").write_text("derive:\n  importer: fake\n  checkpoint: --help\n")
    rc, ran, out = doit(z)
    assert rc == 0 and {"weights:d", "lock:d"} <= ran, out
    assert (z / "build/weights/d/w.f64").read_bytes() == (z / "--help").read_bytes()
