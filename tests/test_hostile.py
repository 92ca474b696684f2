"""A hostile zoo: every case of tests/hostile_corpus.py beside good programs, through real doit.
Whatever one file holds, the others get their verdicts, the report is written (valid XML), each
hostile program is an error row naming its file (and line) and what was wrong, and no traceback
reaches the user."""

import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import numpy as np

from hostile_corpus import GOOD, plant

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_hostile_zoo_keeps_the_good_programs_and_says_what_is_wrong(tmp_path):
    zoo, outside = tmp_path / "zoo", tmp_path / "outside"
    outside.mkdir()
    shutil.copytree(os.path.join(ROOT, "emitter"), zoo / "emitter", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "dodo.py"), zoo / "dodo.py")
    (zoo / "programs").mkdir()
    for name in ("good1", "good2"):
        (zoo / "programs" / f"{name}.logos").write_text(GOOD)
        (zoo / "weights" / name).mkdir(parents=True)
        np.random.default_rng(1).standard_normal((4, 4)).astype("<f8").tofile(zoo / "weights" / name / "w.f64")
    cases = plant(str(zoo), str(outside))
    assert len(cases) >= 35
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "doit", "-n", "2"], cwd=zoo, capture_output=True,
                       text=True, errors="replace", timeout=600, env={**os.environ, "LOGOS_PROGRESS": "line"})
    seconds = time.monotonic() - start
    out = p.stdout + p.stderr
    assert p.returncode not in (0, 3) and "Traceback" not in out, out[-3000:]
    assert seconds < 180, seconds
    assert "warning: programs/renamed_away.yaml: a config with no program beside it" in out
    ET.parse(zoo / "build/junit.xml")                     # valid XML, control characters and all
    rows = json.loads((zoo / "build/report.json").read_text())["results"]
    by_name = {}
    for r in rows:
        by_name.setdefault(r["name"], []).append(r)
    for good in ("good1", "good2", "ok_bom", "ok_crlf", "ok_cr", "ok_loop"):
        assert [r["verdict"] for r in by_name[good]] == ["pass", "pass"], by_name[good]
    invalid = [r for n, rs in by_name.items() if n.startswith("invalid-") for r in rs]
    for case, (name, expect) in cases.items():
        if expect is None:
            continue
        mine = by_name[name] if name else invalid
        assert mine and all(r["verdict"] == "error" for r in mine), (case, mine)
        assert any(expect in (r["reason"] or "") for r in mine), (case, [r["reason"] for r in mine])
    assert "renamed_away" not in by_name
    # a second run over the same zoo keeps every pass; a lock whose checks ran and did not pass
    # runs again (as Bazel reruns failed tests), a refused program's too, and its emit (its
    # refusal said again); nothing else is emitted again
    p = subprocess.run([sys.executable, "-m", "doit"], cwd=zoo, capture_output=True, text=True,
                       errors="replace", timeout=600, env={**os.environ, "LOGOS_PROGRESS": "names"})
    ran = {x[3:].strip() for x in p.stdout.splitlines() if x.startswith(".  ")} - {"report"}
    erred = {f"lock:{n}" for n, rs in by_name.items() if any(r["verdict"] != "pass" for r in rs)}
    refused = {"emit:" + json.loads(f.read_text())["name"] for f in (zoo / "build/status").glob("*.emit.json")
               if json.loads(f.read_text())["status"] != "ok"}
    assert ran and {t for t in ran if t.startswith("lock:")}, p.stdout
    assert not ran & {f"{k}:{g}" for g in ("good1", "good2", "ok_bom", "ok_crlf", "ok_cr", "ok_loop")
                      for k in ("lock", "emit")}, p.stdout
    assert ran <= erred | refused, (ran - erred - refused, p.stdout)


def _small_zoo(tmp_path):
    from test_pipeline import PROG_A, PROG_B, _weights, make_zoo
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    _weights(z / "weights" / "a" / "w.f64", 0)
    return z


def test_deleted_programs_leave_their_history_and_prune_drops_it(tmp_path):
    from conftest import run_cli
    from test_pipeline import doit
    z = _small_zoo(tmp_path)
    rc, _, out = doit(z)
    assert rc == 0, out
    assert (z / "build/bundles/b/model.py").is_file() and (z / "build/results/b").is_dir()
    (z / "programs" / "b.logos").unlink()             # deleted (or renamed away)
    rc, _, out = doit(z)
    assert rc == 0, out
    for gone in ("bundles/b", "results/b", "status/b.emit.json", "status/b.lock.json"):
        assert not (z / "build" / gone).exists(), gone   # nothing of b is left to test itself
    (z / "build/bundles/notes").mkdir()                 # what the zoo did not make there stays
    (z / "build/bundles/notes/README").write_text("mine\n")
    (z / "build/status/x.emit.json").write_text("{}")
    (z / "build/bundles/extra").mkdir()                 # a dodo's own model.py: no manifest of ours
    (z / "build/bundles/extra/model.py").write_text("# mine\n")
    (z / "build/bundles/odd/model.py").mkdir(parents=True)   # what cannot be removed stays, no traceback
    (z / "build/bundles/odd/manifest.json").write_text('{"schema": "logos.sambaflow.manifest"}')
    rc, _, out = doit(z)
    assert rc == 0 and (z / "build/bundles/notes/README").is_file() and (z / "build/status/x.emit.json").is_file()
    assert (z / "build/bundles/extra/model.py").is_file() and (z / "build/bundles/odd/model.py").is_dir(), out
    assert not (z / "build/bundles/odd/manifest.json").exists() and "Traceback" not in out
    assert (z / "build/bundles/a/model.py").is_file() and (z / "build/status/a.lock.json").is_file()
    db = str(z / "build/results.sqlite")
    p = run_cli("results", "--db", db, "--programs", str(z / "programs"))
    assert p.returncode == 0 and "1 programs, 2 checks, 0 not passing" in p.stdout, p.stdout + p.stderr
    p = run_cli("results", "--db", db, "--programs", str(z / "programs"), "--prune")
    assert p.returncode == 0 and "pruned the history of 1 program(s)" in p.stdout and ": b" in p.stdout
    p = run_cli("results", "--db", db, "--history", "b")
    assert p.returncode == 2 and "no runs of `b`" in p.stderr


def test_doit_clean_removes_what_the_tasks_made_and_keeps_the_history(tmp_path):
    from test_pipeline import doit
    z = _small_zoo(tmp_path)
    rc, _, out = doit(z)
    assert rc == 0, out
    assert (z / "build/bundles/a/model.py").is_file() and (z / "build/results/a/float64.json").is_file()
    rc, _, out = doit(z, "clean")
    assert rc == 0, out
    for made in ("bundles/a/model.py", "bundles/b/compile.py", "status/a.emit.json",
                 "results/a/float64.json", "weights-manifests/a.json", "report.json", "junit.xml"):
        assert not (z / "build" / made).exists(), made
    assert (z / "build/results.sqlite").is_file()
    rc, ran, out = doit(z)                             # and everything is made again
    assert rc == 0 and {"emit:a", "lock:a", "report"} <= ran, out


def test_doit_clean_of_one_task_leaves_no_report_that_says_pass(tmp_path):
    """`doit clean lock:a` takes a's results away: the last report, about them, is set aside
    (build/stale/) until a run writes one about what is there; a whole `doit clean` leaves none."""
    from test_pipeline import doit
    z = _small_zoo(tmp_path)
    assert doit(z)[0] == 0
    rc, _, out = doit(z, "clean", "lock:a")
    assert rc == 0 and not (z / "build/results/a/float64.json").exists(), out
    for f in ("report.json", "junit.xml", "summary.md", "report.html"):
        assert not (z / "build" / f).exists() and (z / "build/stale" / f).is_file(), f
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:a" in ran and (z / "build/report.json").is_file(), out
    assert doit(z, "clean")[0] == 0
    assert not (z / "build/report.json").exists() and not (z / "build/stale/report.json").exists()


def test_a_killed_runs_leftovers_are_swept_and_build_must_stay_inside(tmp_path):
    from test_pipeline import doit
    z = _small_zoo(tmp_path)
    rc, _, out = doit(z)
    assert rc == 0, out
    (z / "build/.running").write_text("")             # what a SIGKILLed run leaves
    (z / "build/tmp/import-x.123/out").mkdir(parents=True)
    (z / "build/tmp/import-x.123/out/big.f32").write_bytes(b"\0" * 4096)
    (z / "build/results/a/.float64.json.abc.partial").write_text("{")
    rc, ran, out = doit(z)
    assert rc == 0 and ran == set(), out
    assert not (z / "build/tmp").exists() and not (z / "build/results/a/.float64.json.abc.partial").exists()
    assert not (z / "build/.running").exists()
    shutil.rmtree(z / "build")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", z / "build")   # targets would land outside the repository
    rc, _, out = doit(z)
    assert rc == 3 and "build/ is a link or lies outside" in out and "Traceback" not in out
    assert os.listdir(tmp_path / "elsewhere") == []
    os.unlink(z / "build")
    (z / "build").write_text("mine")                  # a file where build/ goes: refused, kept
    rc, _, out = doit(z)
    assert rc == 3 and "build is a file, where the zoo's build/ folder goes" in out, out
    assert "Traceback" not in out and (z / "build").read_text() == "mine"


def test_a_record_of_the_pipeline_that_is_json_but_no_object_is_made_again(tmp_path):
    """A status file holding `"x"` (valid JSON, not an object) crashed every run's loading."""
    from test_pipeline import PROG_B, doit, make_zoo
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    assert doit(z)[0] == 0
    for f in ("build/status/b.emit.json", "build/status/b.lock.json", "build/results/b/float64.json"):
        (z / f).write_text('"x"')
    rc, ran, out = doit(z)
    assert rc == 0 and {"emit:b", "lock:b"} <= ran and "Traceback" not in out, out
    assert json.loads((z / "build/status/b.emit.json").read_text())["status"] == "ok"


def test_a_size_reads_at_its_own_scale():
    from emitter.files import size_text
    assert [size_text(n) for n in (100, 1536, 50_000_000, 3 << 30, 5 << 40)] == \
        ["100 bytes", "1.5 KiB", "47.7 MiB", "3.0 GiB", "5.0 TiB"]


def test_an_ops_temporaries_count_against_the_memory_limit(tmp_path):
    """limits.tensor_bytes bounds what a run allocates, not only what the program declares: full
    attention over T rows holds T×T scores per head (the module all heads at once), which outgrow
    its T-row tensors, and routed experts T rows by every expert's columns; `logos check` refuses
    the program before anything is allocated."""
    from conftest import run_cli
    from emitter.language.reader import read_program
    rows, heads = 8000, 2
    src = "".join(f"Let {n} be a {rows} by 4 tensor of Real.\n" for n in "QKV") + \
        f"Let O be full attention of Q over K and V with {heads} heads.\n"
    declared = 4 * rows * 4                                   # Q, K, V and O
    assert read_program(src).tensor_bytes == 8 * (declared + 3 * heads * rows * rows)
    # routed experts in the module's dense form hold T rows by every expert's columns, five times
    t, d, n, f = 4096, 8, 16, 64
    moe = (f"Let X be a {t} by {d} tensor of Real.\nLet R be a {t} by {n} tensor of Real.\n"
           f"Let WG be a {d} by {n * f} tensor of Real.\nLet WU be a {d} by {n * f} tensor of Real.\n"
           f"Let WD be a {n * f} by {d} tensor of Real.\n"
           "Let Y be experts of X weighted by R with gate WG up WU down WD.\n")
    assert read_program(moe).tensor_bytes == 8 * (2 * t * d + t * n + 3 * d * n * f + 5 * t * n * f)
    (tmp_path / "programs").mkdir()
    (tmp_path / "programs/att.logos").write_text(src)
    (tmp_path / "programs/att.yaml").write_text("limits: {tensor_bytes: 100000000}\n")
    p = run_cli("check", cwd=str(tmp_path))
    assert p.returncode == 1 and "programs/att.logos" in p.stdout + p.stderr, p.stdout + p.stderr
    assert "its tensors take" in p.stdout + p.stderr


def test_limits_are_per_program_and_can_be_raised(tmp_path):
    from test_pipeline import doit, make_zoo
    big = "".join(f"Let t{i} be a 2000 by 2000 tensor of Real.\nSet item 1 of t{i} to 1.\n" for i in range(2))
    big += "Let y be t0 plus t1.\n"
    z = make_zoo(tmp_path / "zoo", {"tight": (big, "limits: {tensor_bytes: 50000000}\n"),
                                    "roomy": (big, "limits: {tensor_bytes: 200000000}\n"),
                                    "bad": (big, "limits: {tensr_bytes: 1}\n"),
                                    "wordy": (big, "limits: {sentences: 4}\n")})
    rc, _, out = doit(z)
    rows = {(r["name"], r["check"]): r for r in json.loads((z / "build/report.json").read_text())["results"]}
    assert rows[("roomy", "float64")]["verdict"] == "pass"
    assert "its tensors take 91.6 MiB in float64, over the limit of 47.7 MiB" in rows[("tight", "float64")]["reason"]
    assert "`limits.tensr_bytes`: `tensr_bytes` is not a limit; did you mean `tensor_bytes`?" in rows[("bad", "float64")]["reason"]
    assert "programs/wordy.logos: 5 sentences (tensors, fills and ops), over the limit of 4 (limits.sentences)" \
        in rows[("wordy", "float64")]["reason"]


def test_a_weights_file_its_size_refuses_is_never_read(tmp_path):
    """A leaf's file whose size no reader accepts (a raw file of another size, any file over
    limits.tensor_bytes) is an error of its program naming the file, the size and what was
    expected, and is never read: neither the check's key nor doit's file checker hashes it (the
    hash record holds no entry for it). The file put right, the program passes."""
    from test_pipeline import PROG_A, _weights, doit, make_zoo
    z = make_zoo(tmp_path / "zoo", {"raw": (PROG_A, None), "tensors": (PROG_A, "limits: {tensor_bytes: 1000000}\n"),
                                    "good": (PROG_A, None)})
    for name in ("raw", "good"):
        _weights(str(z / "weights" / name / "w.f64"), 0)
    junk = {z / "weights/raw/w.f64": 3 << 30, z / "weights/tensors/m.safetensors": 2 << 30}
    for path, size in junk.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:   # sparse: no disk, but a hash would read every byte
            f.truncate(size)
    import time
    from emitter import fingerprint
    time.sleep(fingerprint.RACY_S + 0.2)   # old enough to be recorded when hashed (a fast run: at once)
    for run in range(2):
        rc, ran, out = doit(z)
        rows = {(r["name"], r["check"]): r for r in json.loads((z / "build/report.json").read_text())["results"]}
        assert rc == 1 and rows[("good", "float64")]["verdict"] == "pass", out
        raw, tensors = rows[("raw", "float64")], rows[("tensors", "float64")]
        assert raw["verdict"] == "error" and "weights/raw/w.f64: `w` is 4 by 4: expected 128 bytes of " \
            "float64, the file has 3221225472" in raw["reason"], raw
        assert tensors["verdict"] == "error" and "weights/tensors/m.safetensors: a file of 2147483648 bytes" \
            in tensors["reason"] and "limits.tensor_bytes, 1000000" in tensors["reason"], tensors
        hashed = json.loads((z / "build/.fingerprints.json").read_text())["files"]
        assert not [p for p in hashed if p.endswith(("raw/w.f64", "m.safetensors"))], sorted(hashed)
        assert any(p.endswith("good/w.f64") for p in hashed)
    _weights(str(z / "weights/raw/w.f64"), 0)
    rc, ran, out = doit(z, "lock:raw")
    assert rc == 0 and json.loads((z / "build/results/raw/float64.json").read_text())["verdict"] == "pass", out
