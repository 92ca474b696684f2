"""The lock check: passes on honest bundles, names the op a wrong helper breaks, sees write-backs."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import emit_bundle, run_cli, write_weights
from emitter import read_file
from emitter.verify import verdict, vm
from emitter.verify.lock import compare, lock_bundle


@pytest.fixture(scope="module")
def zoo(tmp_path_factory, request):
    """The all-ops program with random weights (tok/pos keep their fills) and its bundle."""
    from conftest import DATA
    d = tmp_path_factory.mktemp("lock")
    src = os.path.join(DATA, "all_ops.logos")
    shutil.copy(src, d / "all_ops.logos")
    program = read_file(str(d / "all_ops.logos"))
    weights = write_weights(program, d / "weights", seed=3)
    bundle = emit_bundle(program.source, d / "bundle")
    return {"dir": d, "program": str(d / "all_ops.logos"), "weights": weights, "bundle": bundle}


@pytest.mark.parametrize("dtype,steps", [("float64", 1), ("float64", 3), ("float32", 1), ("float32", 3)])
def test_lock_passes_every_op(zoo, dtype, steps):
    r = lock_bundle(zoo["bundle"], zoo["program"], zoo["weights"], dtype, steps)
    assert r["verdict"] == "pass", r["reason"] or r["first_divergence"]
    program = read_file(zoo["program"])
    assert [s["op"] for s in r["stages"]] == [s.op.name for s in program.stages]
    assert len(r["steps_detail"]) == steps
    assert set(r["steps_detail"][-1]["states"]) == {"K0", "V0", "cs", "S"}
    assert r["output"]["argmax_agree"] and r["output"]["cosine"] > 0.999999
    if dtype == "float64":
        assert r["output"]["max_abs"] <= 1e-12
    else:
        assert 0 < r["output"]["max_abs"] < 1e-4
    assert r["hashes"]["source"] and r["hashes"]["weights"] and r["hashes"]["bundle"]["model.py"]
    assert r["environment"]["torch"].startswith("2.13") and r["environment"]["digest"]
    assert r["timings"]["vm_s"] > 0 and r["timings"]["module_s"] > 0


def _sabotage(zoo, tmp_path, old, new):
    bundle = tmp_path / "bundle"
    shutil.copytree(zoo["bundle"], bundle)
    text = (bundle / "model.py").read_text()
    assert old in text
    (bundle / "model.py").write_text(text.replace(old, new))
    return str(bundle)


def test_wrong_helper_names_op_and_stage(zoo, tmp_path):
    bundle = _sabotage(zoo, tmp_path, "    return F.silu(g) * u\n", "    return F.silu(g) * u * 1.001\n")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 2)
    assert r["verdict"] == "fail"
    program = read_file(zoo["program"])
    sw = next(s for s in program.stages if s.op.name == "swiglu")
    f = r["first_divergence"]
    assert (f["stage"], f["out"], f["op"], f["line"], f["step"]) == (sw.index, "sw", "swiglu", sw.line, 1)
    assert 1e-4 < f["max_rel"] < 2e-3
    bad = [s["stage"] for s in r["stages"] if not s["pass"]]
    assert bad[0] == sw.index  # ops before it agree


RING = """Let x be a 1 by 3 tensor of Real.
Let wc be a 2 by 3 tensor of Real.
Let cs be a 2 by 3 tensor of Real.
Let h be causal conv of x with weight wc state cs over 2 taps.
Let y be silu of h.
"""


def test_wrong_state_write_back_fails_at_its_step_and_each_step_is_teacher_forced(tmp_path):
    """Each step starts the module from the VM's states (teacher-forced), so a wrong write-back is
    named at the step that writes it, and the next step's output is that step's own (it passes)."""
    (tmp_path / "ring.logos").write_text(RING)
    program = read_file(str(tmp_path / "ring.logos"))
    weights = write_weights(program, tmp_path / "w", seed=1)
    bundle = emit_bundle(RING, tmp_path / "good")
    text = open(os.path.join(bundle, "model.py")).read()
    old = 'self.leaf_cs.copy_(cs)'
    assert old in text
    open(os.path.join(bundle, "model.py"), "w").write(text.replace(old, 'self.leaf_cs.copy_(cs * 0.5)'))
    one = lock_bundle(bundle, str(tmp_path / "ring.logos"), weights, "float64", 1)
    two = lock_bundle(bundle, str(tmp_path / "ring.logos"), weights, "float64", 2)
    for r in (one, two):
        assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"])  # every op agrees
        f = r["first_divergence"]                 # the write-back is named: its state and step
        assert (f["stage"], f["out"], f["op"], f["step"], f["line"]) == ("write-back", "cs", "causal conv", 1, 4)
        assert r["steps_detail"][0]["output"]["pass"]  # the output of step 1 is right
        assert not r["steps_detail"][0]["states"]["cs"]["pass"]  # the ring it carries is not
        # the worst is that write-back (no stage fails), at its own figures
        worst_cs = max([d["states"]["cs"]["worst_ratio"] for d in r["steps_detail"]]   # (the fresh pass's too:
                       + [r["fresh"]["states"]["cs"]["worst_ratio"]])                   # its ring other values)
        assert worst_cs > 1 and r["worst"] == {"stage": "write-back", "out": "cs", "op": "causal conv", "line": 4,
                                               "ratio": worst_cs, "max_abs": r["worst"]["max_abs"],
                                               "guarded_rel": r["worst"]["guarded_rel"]}
        assert "worst: write-back `cs = causal conv` (line 4) at " in verdict.describe(r)
    assert two["steps_detail"][1]["output"]["pass"]      # step 2 starts from the VM's ring
    assert not two["steps_detail"][1]["states"]["cs"]["pass"]


def test_an_output_wrong_past_its_last_op_is_the_worst(zoo, tmp_path):
    """A value no stage covers (the output, scaled after its last op) that fails is the worst,
    not the passing stage nearest its tolerance."""
    import math
    program = read_file(zoo["program"])
    y = program.output
    text = open(os.path.join(zoo["bundle"], "model.py")).read()
    old = f"        return {program.output}\n"
    assert text.count(old) == 1
    bundle = _sabotage(zoo, tmp_path, old, f"        return {program.output} * (1 + 1e-6)\n")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"])
    out = r["steps_detail"][0]["output"]
    assert not out["pass"] and r["worst"]["stage"] == "output" and r["worst"]["out"] == program.output
    seen = [out] + ([r["fresh"]["output"]] if r.get("fresh") else [])   # the step's and the fresh pass's
    assert r["worst"]["ratio"] == max(o["worst_ratio"] for o in seen) > 1
    nan = _sabotage(zoo, tmp_path / "nan", old, f"        {y} = {y}.clone()\n        {y}[0, 0] = float('nan')\n"
                    f"        return {y}\n")   # NaN on one side only: past any tolerance, whatever its figures
    r = lock_bundle(nan, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "fail" and (r["worst"]["stage"], r["worst"]["ratio"]) == ("output", math.inf), r["worst"]
    ok = lock_bundle(zoo["bundle"], zoo["program"], zoo["weights"], "float64", 1)   # a pass names its stage
    assert ok["verdict"] == "pass" and isinstance(ok["worst"]["stage"], int)


def test_state_read_before_its_write_back_keeps_the_old_value(tmp_path):
    """A literal row (a view in torch) read before `Set row` must not see the new row."""
    src = ("Let K0 be a 2 by 2 tensor of Real.\nSet item 1 of K0 to 1.\nSet item 2 of K0 to 2.\n"
           "Let k be a 1 by 2 tensor of Real.\nSet item 1 of k to 5.\nSet item 2 of k to 6.\n"
           "Let r be row 0 of K0.\nLet t be transpose of K0.\nSet row 0 of K0 to k.\n"
           "Let y be r plus k.\nLet z be r matmul t.\n")
    (tmp_path / "p.logos").write_text(src)
    bundle = emit_bundle(src, tmp_path / "b")
    r = lock_bundle(bundle, str(tmp_path / "p.logos"), None, "float64", 2)
    assert r["verdict"] == "pass", r["steps_detail"]
    program = read_file(str(tmp_path / "p.logos"))
    trace = vm.run(program, vm.load_leaves(program).values, keep_stages=True)[0]
    np.testing.assert_array_equal(trace.output, [[5.0, 0.0]])  # r = [1, 2], t = the old K0 transposed
    np.testing.assert_array_equal(trace.stages[3], [[6.0, 8.0]])  # y = r + k


@pytest.mark.parametrize("atol,rtol", [(-1.0, 0.0), (0.0, float("nan")), (float("inf"), 0.0)])
def test_bad_tolerances_cannot_pass(zoo, atol, rtol):
    r = lock_bundle(zoo["bundle"], zoo["program"], zoo["weights"], "float64", 1, atol, rtol)
    assert r["verdict"] == "error" and "tolerances must be finite and >= 0" in r["reason"]


def test_bundle_of_another_source_is_refused(zoo, tmp_path):
    prog = tmp_path / "p.logos"
    prog.write_text(open(zoo["program"]).read() + "\n# edited\n")
    r = lock_bundle(zoo["bundle"], str(prog), zoo["weights"])
    assert r["verdict"] == "error" and "emit it again" in r["reason"]


def test_a_leaf_with_no_value_and_no_weights_is_named_at_its_program_line(tmp_path):
    """No weights directory for a program that reads an input: the error is the program's, at the
    line that declares the input (never `<program>`)."""
    src = "Let q be a 1 by 2 tensor of Real.\nLet x be a 1 by 2 tensor of Real.\nLet y be silu of x.\n"
    prog = tmp_path / "p.logos"
    prog.write_text(src)
    r = lock_bundle(emit_bundle(src, tmp_path / "b"), str(prog))
    assert r["verdict"] == "error" and r["reason"].startswith(f"{prog}:2: the input `x` is read but has no "
                                                            "declared value"), r["reason"]


def test_module_that_raises_names_the_stage(zoo, tmp_path):
    """A module that raises on the program's inputs is a wrong bundle: a fail at that stage."""
    bundle = _sabotage(zoo, tmp_path, "def gelu_tanh(x):\n", "def gelu_tanh(x):\n    raise RuntimeError('boom')\n")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"])
    assert r["verdict"] == "fail"
    f = r["first_divergence"]
    assert (f["out"], f["op"], f["raised"]) == ("ge", "gelu", "RuntimeError: boom")
    assert "stage" in r["reason"] and "= gelu" in r["reason"] and "boom" in r["reason"]


def test_cli_exit_codes_and_result_file(zoo, tmp_path):
    out = tmp_path / "r.json"
    r = run_cli("lock", zoo["bundle"], "--program", zoo["program"], "--weights", zoo["weights"],
                "--steps", "2", "-o", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["schema"] == "logos.lock.result" and res["verdict"] == "pass" and res["steps"] == 2
    assert "PASS" in r.stdout
    # one thread unless told, as doit's locks (torch's and the BLAS's pools), said in the result
    assert res["execution"]["threads"] == 1 and res["execution"]["torch_threads"] == 1
    r = run_cli("lock", zoo["bundle"], "--program", zoo["program"], "--weights", zoo["weights"],
                "--threads", "2", "-o", str(out))
    assert r.returncode == 0 and json.loads(out.read_text())["execution"]["torch_threads"] == 2
    r = run_cli("lock", zoo["bundle"], "--program", zoo["program"], "-o", str(out), "--threads", "0")
    assert r.returncode == 2 and "--threads must be from 1 to 4096, got 0" in r.stderr
    for where, said in ((tmp_path, "is a folder, where the result file is to be written"),
                        (tmp_path / "nothere" / "r.json", f"{tmp_path / 'nothere'} is not a folder")):
        r = run_cli("lock", zoo["bundle"], "--program", zoo["program"], "--weights", zoo["weights"],
                    "-o", str(where))   # said before the lock runs (its verdict was lost), exit 2
        assert r.returncode == 2 and r.stderr.strip() == f"-o {where}: {said}", r.stderr
        assert "PASS" not in r.stdout

    bundle = _sabotage(zoo, tmp_path, "    return F.silu(g) * u\n", "    return F.silu(g) * u * 1.001\n")
    r = run_cli("lock", bundle, "--program", zoo["program"], "--weights", zoo["weights"], "-o", str(out))
    assert r.returncode == 1 and "first diverging op: stage" in r.stderr and "sw = swiglu" in r.stderr
    assert json.loads(out.read_text())["verdict"] == "fail"

    bad = tmp_path / "badw"
    shutil.copytree(zoo["weights"], bad)
    np.zeros(3).tofile(bad / "emb.f64")
    r = run_cli("lock", zoo["bundle"], "--program", zoo["program"], "--weights", str(bad), "-o", str(out))
    assert r.returncode == 2 and "emb.f64" in r.stderr and "expected 320 bytes" in r.stderr
    res = json.loads(out.read_text())
    assert res["verdict"] == "error" and "emb.f64" in res["reason"]


def test_model_py_command_line_matches_vm(zoo, tmp_path):
    out = tmp_path / "m.bin"
    r = subprocess.run([sys.executable, os.path.join(zoo["bundle"], "model.py"), "--weights", zoo["weights"],
                        "--dtype", "float64", "--steps", "2", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["output"] == "y"
    program = read_file(zoo["program"])
    want = vm.run(program, vm.load_leaves(program, zoo["weights"]).values, steps=2)[-1].output
    np.testing.assert_allclose(np.fromfile(out, dtype="<f8").reshape(want.shape), want, rtol=1e-12, atol=1e-12)


def test_compare_metrics():
    m = compare(np.array([1.0, 2.0, np.nan]), np.array([1.0, 2.1, 3.0]), {"abs": 1e-9, "rel": 1e-9})
    assert m["nonfinite_mismatch"] == 1 and not m["pass"]
    assert m["max_abs"] == pytest.approx(0.1) and m["max_rel"] == pytest.approx(0.1 / 2.1)
    m = compare(np.array([1.0, -1.0]), np.array([1.0, -1.0]), {"abs": 0, "rel": 0})
    assert m["pass"] and m["nmse"] == 0 and m["cosine"] == pytest.approx(1.0)
    m = compare(np.array([2.0, 0.0]), np.array([1.0, 0.0]), {"abs": 0.5, "rel": 0.0})
    assert m["nmse"] == pytest.approx(1.0) and m["worst_ratio"] == pytest.approx(2.0) and not m["pass"]


TIED = """Let E be a 300 by 8 tensor of Real.
Let x be a 1 by 8 tensor of Real.
Let t be transpose of E.
Let y be x matmul t.
"""


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_tied_projection_view_is_checked_bit_for_bit_and_a_wrong_one_named(tmp_path, dtype):
    """`transpose of E` computes nothing: the probe checks the module's view against the VM's
    rounded as the module holds E (the load stage's rule) and passes it on without a copy; a view
    spelled wrong is a failure at its stage."""
    from emitter.language.reader import read_program
    (tmp_path / "t.logos").write_text(TIED)
    program = read_program(TIED)
    assert program.roles["E"] == "weight" and program.roles["x"] == "input"
    w = tmp_path / "w"
    w.mkdir()
    rng = np.random.default_rng(5)
    rng.standard_normal((300, 8)).astype("<f4").tofile(w / "E.f32")
    rng.standard_normal((1, 8)).astype("<f4").tofile(w / "x.f32")
    bundle = emit_bundle(TIED, tmp_path / "b")
    r = lock_bundle(bundle, str(tmp_path / "t.logos"), str(w), dtype, 1)
    assert r["verdict"] == "pass", r["reason"] or r["first_divergence"]
    view = next(s for s in r["stages"] if s["op"] == "transpose")
    assert view["max_abs"] == 0 and view["pass"]
    text = (tmp_path / "b" / "model.py").read_text()
    assert "E.transpose(0, 1)" in text
    (tmp_path / "b" / "model.py").write_text(text.replace("E.transpose(0, 1)", "E.transpose(0, 1).roll(1, 1)"))
    bad = lock_bundle(bundle, str(tmp_path / "t.logos"), str(w), dtype, 1)
    assert bad["verdict"] == "fail"
    assert bad["first_divergence"]["op"] == "transpose" and bad["first_divergence"]["out"] == "t"


def test_weights_digest_sees_an_edit_that_keeps_size_and_mtime(tmp_path):
    """The lock remembers file hashes per process (three dtypes hash a checkpoint once), keyed by
    the file's stat with its ctime, which no write keeps: a same-size edit with its mtime put back
    is hashed again."""
    from emitter.verify.weights_read import weights_digest
    (tmp_path / "W.f32").write_bytes(np.arange(64, dtype="<f4").tobytes())
    first = weights_digest(str(tmp_path), {"W": "W.f32"})
    st = os.stat(tmp_path / "W.f32")
    with open(tmp_path / "W.f32", "r+b") as f:
        f.write(np.float32(7).tobytes())
    os.utime(tmp_path / "W.f32", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(tmp_path / "W.f32").st_mtime_ns == st.st_mtime_ns
    assert weights_digest(str(tmp_path), {"W": "W.f32"}) != first
    assert weights_digest(str(tmp_path), {"W": "W.f32"}) == weights_digest(str(tmp_path), {"W": "W.f32"})


def test_a_lock_hashes_weights_through_the_one_stat_cache(tmp_path):
    """The lock reads a weights file's sha256 through the one fingerprint rule: what the stat cache
    holds for a file stands while its stat (ctime included) is the same, so a model's weights are
    not hashed again; a file edited since, its mtime put back, is hashed."""
    import hashlib
    from emitter import fingerprint
    from emitter.verify.weights_read import weights_digest
    w = tmp_path / "w"
    w.mkdir()
    (w / "W.f32").write_bytes(np.arange(64, dtype="<f4").tobytes())
    cache = fingerprint.bind(str(tmp_path / "fp.json"))
    try:
        st = os.stat(w / "W.f32")
        cache.files[str(w / "W.f32")] = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:" + "f" * 64
        want = hashlib.sha256(f"W.f32\0{'f' * 64}\n".encode()).hexdigest()
        assert weights_digest(str(w), {"W": "W.f32"}) == want      # what the cache holds stands...
        with open(w / "W.f32", "r+b") as f:                          # ...until the file's stat moves
            f.write(np.float32(7).tobytes())
        os.utime(w / "W.f32", ns=(st.st_atime_ns, st.st_mtime_ns))
        real = hashlib.sha256((w / "W.f32").read_bytes()).hexdigest()
        assert weights_digest(str(w), {"W": "W.f32"}) == hashlib.sha256(f"W.f32\0{real}\n".encode()).hexdigest()
    finally:
        fingerprint.bind(None)


def test_a_renamed_folders_hashes_stay_on_record(tmp_path):
    """Derived weights are hashed where the import writes them, then their folder is renamed into
    place: the hashes move with them (same stamp), so the lock reads none of them again."""
    from emitter import fingerprint
    made, out = tmp_path / "tmp" / "out", tmp_path / "weights"
    made.mkdir(parents=True)
    (made / "W.f32").write_bytes(np.arange(64, dtype="<f4").tobytes())
    cache = fingerprint.bind(str(tmp_path / "fp.json"))
    try:
        st = os.stat(made / "W.f32")
        cache.files[str(made / "W.f32")] = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:" + "e" * 64
        os.rename(made, out)
        fingerprint.moved(str(made / "W.f32"), str(out / "W.f32"))
        assert fingerprint.sha256(str(out / "W.f32")) == "e" * 64      # on record: not read
        assert str(made / "W.f32") not in cache.files
    finally:
        fingerprint.bind(None)


def test_a_lock_by_hand_inside_a_zoo_takes_the_zoos_hashes(tmp_path, monkeypatch):
    """`logos lock` run in a zoo reads its build/.fingerprints.json: a weights file the zoo hashed
    (its stamp on record) is not read again, whether named from the zoo's root, by an absolute
    path, or from a folder inside the zoo; its recorded hash is the one the result names."""
    import hashlib
    from emitter import fingerprint
    from emitter.cli import main
    (tmp_path / "p.logos").write_text(RING)
    program = read_file(str(tmp_path / "p.logos"))
    monkeypatch.chdir(tmp_path)
    write_weights(program, tmp_path / "w", seed=1)
    emit_bundle(RING, tmp_path / "b")
    (tmp_path / "build").mkdir()
    record = {}
    for f in sorted(os.listdir("w")):
        st = os.stat(os.path.join("w", f))
        record[os.path.join("w", f)] = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:" + "d" * 64
    (tmp_path / "build" / ".fingerprints.json").write_text(json.dumps({"version": fingerprint.VERSION,
                                                                       "files": record}))
    try:
        main(["lock", "b", "--program", "p.logos", "--weights", "w", "-o", "r.json"])
    finally:
        fingerprint.bind(None)
    want = hashlib.sha256("".join(f"{f}\0{'d' * 64}\n" for f in sorted(os.listdir("w"))).encode()).hexdigest()
    assert json.load(open("r.json"))["hashes"]["weights"] == want
    # the weights named by absolute paths: their entries, none read (the check runs in a forked
    # child: what it reads goes to a file)
    log, digest = tmp_path / "read.log", hashlib.file_digest

    def reads():
        return log.read_text().splitlines() if log.exists() else []

    def reading(f, *a):
        with open(log, "a") as out:
            out.write(f.name + "\n")
        return digest(f, *a)
    monkeypatch.setattr(hashlib, "file_digest", reading)
    try:
        main(["lock", str(tmp_path / "b"), "--program", str(tmp_path / "p.logos"), "--weights",
              str(tmp_path / "w"), "-o", str(tmp_path / "r2.json")])
    finally:
        fingerprint.bind(None)
    assert json.load(open("r2.json"))["hashes"]["weights"] == want
    assert reads() and not [f for f in reads() if f.startswith(str(tmp_path / "w"))], reads()   # (the bundle's: fresh)
    log.write_text("")   # run in a folder of the zoo, its paths relative to there: the zoo's record all the same
    monkeypatch.chdir(tmp_path / "b")
    try:
        main(["lock", ".", "--program", "../p.logos", "--weights", "../w", "-o", "../r3.json"])
    finally:
        fingerprint.bind(None)
    assert json.load(open("../r3.json"))["hashes"]["weights"] == want
    assert not [f for f in reads() if "/w/" in os.path.abspath(f)], reads()
    os.chmod(tmp_path / "build", 0o777)   # a build/ others may write names no hashes, keeps nothing
    try:
        main(["lock", ".", "--program", "../p.logos", "--weights", "../w", "-o", "../r4.json"])
    finally:
        fingerprint.bind(None)
        os.chmod(tmp_path / "build", 0o755)
    assert json.load(open("../r4.json"))["hashes"]["weights"] != want


def test_a_record_bound_in_a_folder_of_the_zoo_keys_paths_where_they_lead(tmp_path, monkeypatch):
    """Bound from a folder inside the zoo, a relative path is keyed from the zoo's root; one whose
    `..` follows a link out of the zoo is keyed where it leads, never as the zoo's file of that
    name (`x/../w/f` with x a link elsewhere names elsewhere's w/f)."""
    from emitter import fingerprint
    zoo, other = tmp_path / "zoo", tmp_path / "other"
    for d in (zoo / "build", zoo / "sub", zoo / "w", other / "deep", other / "w"):
        d.mkdir(parents=True)
    (zoo / "x").symlink_to(other / "deep")
    monkeypatch.chdir(zoo / "sub")
    try:
        record = fingerprint.bind(str(zoo / "build" / ".fingerprints.json"))
        assert record._key("../w/f") == "w/f" and record._key(str(zoo / "w" / "f")) == "w/f"
        assert record._key("../x/../w/f") == str(other / "w" / "f")
    finally:
        fingerprint.bind(None)


def test_weights_changed_after_their_manifest_are_an_error(zoo):
    """A lock told the weights' hashes (doit's locks are: those its key names) checks the files it read
    against them: weights edited after the manifest was taken (say while the run waited for a
    worker) give an error, not a verdict that the manifest and its cache key would pin on other
    weights."""
    import hashlib
    w = zoo["weights"]
    shas = {f: hashlib.sha256(open(os.path.join(w, f), "rb").read()).hexdigest() for f in os.listdir(w)}
    assert lock_bundle(zoo["bundle"], zoo["program"], w, "float64", 1, weights_shas=shas)["verdict"] == "pass"
    moved = sorted(shas)[0]
    r = lock_bundle(zoo["bundle"], zoo["program"], w, "float64", 1, weights_shas={**shas, moved: "0" * 64})
    assert r["verdict"] == "error" and moved in r["reason"], r["reason"]
    assert "changed after the check's key was taken" in r["reason"]


@pytest.mark.parametrize("who", ["another process", "the bundle"])
def test_weights_rewritten_while_the_lock_runs_are_an_error_or_the_bundles_fault(zoo, tmp_path, who):
    """The weights are maps of their files, read to the end of the check: a file rewritten in place
    after the first look by another process (started here by the bundle's import) is an error, said
    as such; by the bundle's own code (its import opening it to write), a fail naming the file."""
    import hashlib
    w, bundle = tmp_path / "w", tmp_path / "b"
    shutil.copytree(zoo["weights"], w)
    shutil.copytree(zoo["bundle"], bundle)
    shas = {f: hashlib.sha256((w / f).read_bytes()).hexdigest() for f in os.listdir(w)}
    victim = sorted(shas)[0]
    head = (w / victim).read_bytes()[:8]
    write = f"with open({str(w / victim)!r}, 'r+b') as _f:\n    _f.write({bytes(255 - b for b in head)!r})\n"
    with open(bundle / "model.py", "a") as f:
        f.write(f"\nimport subprocess, sys\nsubprocess.run([sys.executable, '-c', {write!r}], check=True)\n"
                if who == "another process" else "\n" + write)
    r = lock_bundle(str(bundle), zoo["program"], str(w), "float64", 1, weights_shas=shas)
    assert r["stale_weights"] == [victim], r["reason"]
    if who == "another process":
        assert r["verdict"] == "error" and "changed after the check's key was taken" in r["reason"], r["reason"]
    else:
        assert r["verdict"] == "fail" and f"the bundle wrote into the weights file {victim}" in r["reason"], r["reason"]
        assert r["first_divergence"]["stage"] == "load"


def test_a_bundle_that_opens_its_weights_to_write_fails_though_it_changes_nothing(zoo, tmp_path):
    """A forward that opens a weights file to write and puts back what it held (or a second run
    over what a first one wrote) leaves the file as read: still the bundle's fault, a fail naming
    it, where it once passed."""
    w, bundle = tmp_path / "w", tmp_path / "b"
    shutil.copytree(zoo["weights"], w)
    victim = sorted(os.listdir(w))[0]
    bundle = _sabotage(zoo, tmp_path, "        return y\n", f"        _f = open({str(w / victim)!r}, 'r+b')\n"
                       "        _f.write(_f.read(8)) if False else _f.close()\n        return y\n")
    r = lock_bundle(bundle, zoo["program"], str(w), "float64", 1)
    assert r["verdict"] == "fail" and f"the bundle opened {os.path.realpath(w / victim)} to write" in r["reason"], r["reason"]
    assert r["first_divergence"]["stage"] == "load"


@pytest.mark.parametrize("call", [
    "os.link({victim!r}, {folder!r} + '/extra.npy')",            # the next check would read it
    "os.symlink({victim!r}, {folder!r} + '/extra.f32')",
    "os.mkdir({folder!r} + '/extra.f32')",
    "os.chmod({victim!r}, 0o644)",
    "os.chmod(os.open({victim!r}, os.O_RDONLY), 0o644)",   # through a descriptor
])
def test_a_bundle_that_makes_an_entry_in_its_weights_folder_fails(zoo, tmp_path, call):
    """A forward that makes a hard or symbolic link or a folder in its weights folder, or chmods a
    file of it, changes what the next check reads: the bundle's fault, a fail naming the path, as
    an open to write is (Python's audit hook sees each call)."""
    w = tmp_path / "w"
    shutil.copytree(zoo["weights"], w)
    victim = os.path.realpath(w / sorted(os.listdir(w))[0])
    code = call.format(victim=victim, folder=os.path.realpath(w))
    bundle = _sabotage(zoo, tmp_path, "        return y\n", f"        import os\n        try:\n            {code}\n"
                       "        except FileExistsError:   # (a forward after the first)\n            pass\n        return y\n")
    r = lock_bundle(bundle, zoo["program"], str(w), "float64", 1)
    assert r["verdict"] == "fail" and "the bundle opened" in r["reason"] and str(w.resolve()) in r["reason"], r["reason"]
    assert r["first_divergence"]["stage"] == "load"


def test_a_bundle_that_makes_a_folder_already_there_changes_nothing_and_passes(zoo, tmp_path):
    """`os.makedirs(weights, exist_ok=True)` in a forward: the call is audited before it fails on
    the folder there, and makes nothing: no blame."""
    w = tmp_path / "w"
    shutil.copytree(zoo["weights"], w)
    bundle = _sabotage(zoo, tmp_path, "        return y\n", f"        import os\n        os.makedirs({str(w)!r}, "
                       "exist_ok=True)\n        return y\n")
    r = lock_bundle(bundle, zoo["program"], str(w), "float64", 1)
    assert r["verdict"] == "pass", r["reason"]


@pytest.mark.parametrize("old,new,where", [
    ("        return y\n", "        return y * (1 + 1e-9)\n", ("output", "y", "output")),
    ("self.leaf_S.copy_(S)", "self.leaf_S.copy_(S * (1 + 1e-9))", ("write-back", "S", None)),
    ("self.leaf_cs.copy_(cs)", "self.leaf_cs.copy_(cs); cs.mul_(1 + 1e-9)", None),   # its own copy: harmless
])
def test_what_changes_after_its_stage_within_tolerance_fails(zoo, tmp_path, old, new, where):
    """An output or a state changed after its stage handed it on (a gain on the output, a state
    scaled as it is written back) is a fail naming it, however small: in the probe pass it must be
    exactly what its stage handed on, whatever the tolerance of the free pass lets through."""
    bundle = _sabotage(zoo, tmp_path, old, new)
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 2)
    if where is None:
        assert r["verdict"] == "pass", r["first_divergence"]
        return
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"])
    f = r["first_divergence"]
    assert (f["stage"], f["out"], f["step"]) == (where[0], where[1], 1) and "changed after its stage" in f["raised"]
    if where[2]:
        assert f["op"] == where[2]
    assert all(d["changed_after_tap"] for d in r["steps_detail"])
    assert all(d["output"]["pass"] and all(m["pass"] for m in d["states"].values()) for d in r["steps_detail"])


OWN_CACHE = ("        Kc = self.leaf_Kc\n", "        Kc = self.leaf_Kc if getattr(self, '_kc', None) is None%s else self._kc\n",
             '        Kc = self.tap(7, set_row(Kc, pos, kr, "pos"))\n',
             '        Kc = self.tap(7, set_row(Kc, pos, kr, "pos"))\n        self._kc = Kc.detach().clone()\n')


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("probed", ["", " or self.probe is not None"])
def test_a_module_that_reads_a_cache_of_its_own_fails(tmp_path, dtype, probed):
    """A module that keeps its own copy of its KV cache (written on as it goes; in its free passes
    alone, or in every pass) and reads it in place of its buffer matches the VM step by step, each
    step's cache rows being the VM's, yet a caller who sets the buffer (a new sequence) is not
    heard: step 1's free pass, run again after the last step, is what gives it away."""
    from conftest import ROOT
    program = os.path.join(ROOT, "programs", "rope_attention.logos")
    weights = os.path.join(ROOT, "weights", "rope_attention")
    good = emit_bundle(read_file(program).source, tmp_path / "good")
    a, b, c, d = OWN_CACHE
    bundle = _sabotage({"bundle": good}, tmp_path, a, b % probed)
    text = open(os.path.join(bundle, "model.py")).read()
    assert c in text
    open(os.path.join(bundle, "model.py"), "w").write(text.replace(c, d))
    r = lock_bundle(bundle, program, weights, dtype, 2)
    assert r["verdict"] == "fail" and not r["replay"]["pass"], r["reason"]
    assert all(d["pass"] for d in r["steps_detail"]) and all(s["pass"] for s in r["stages"])   # step by step: the VM's
    f = r["first_divergence"]
    assert (f["step"], f["stage"], f["out"]) == (2, "write-back", "Kc") and \
        "run again after step 2 from the same states" in f["raised"], f
    assert r["replay"]["states"]["Kc"]["max_abs"] > 0.01 and r["replay"]["states"]["Vc"]["max_abs"] == 0, r["replay"]
    ok = lock_bundle(good, program, weights, dtype, 2)
    assert ok["verdict"] == "pass" and ok["replay"]["pass"], ok["reason"]
    assert ok["replay"]["output"]["max_abs"] == 0 and all(m["max_abs"] == 0 for m in ok["replay"]["states"].values())


def test_a_module_that_raises_in_the_replay_fails_naming_where(zoo, tmp_path):
    """A forward that raises when called once more (step 1's free pass again, after the last
    step) is the bundle's fault, as a raise in any step is: a fail naming where, not an error."""
    bundle = _sabotage(zoo, tmp_path, "        return y\n", "        self._n = getattr(self, '_n', 0) + 1\n"
                       "        if self._n == 5:\n            raise RuntimeError('a fifth call')\n        return y\n")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 2)
    assert r["verdict"] == "fail" and not r["replay"]["pass"], r["reason"]
    assert "a fifth call" in r["reason"] and "the free pass of step 1 again (after step 2)" in r["reason"], r["reason"]
    assert r["first_divergence"]["step"] == 2 and "a fifth call" in r["first_divergence"]["raised"]
    assert all(d["pass"] for d in r["steps_detail"]), r["steps_detail"]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_module_handing_back_what_the_probe_handed_it_fails(zoo, tmp_path, dtype):
    """A module that keeps the output the probe pass handed it (the VM's) and returns it from the
    free pass, computing its own wrongly: the free pass runs first, before the step's VM values
    reach the module, so the output it computed itself is what is judged."""
    bundle = _sabotage(zoo, tmp_path, "        return y\n",
                       "        if self.probe is not None:\n            self._kept = y.detach().clone()\n"
                       "            return y\n"
                       "        return self._kept.clone() if hasattr(self, '_kept') else y * 7\n")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], dtype, 2)
    assert r["verdict"] == "fail", r["reason"]
    f = r["first_divergence"]
    assert (f["stage"], f["step"]) == ("output", 1) and all(s["pass"] for s in r["stages"]), f


def test_an_output_in_memory_the_module_writes_again_fails(zoo, tmp_path):
    """A module that returns the same buffer every call changes a caller's earlier outputs: a fail
    at the output, naming the pass whose output changed; each pass's own figures pass."""
    bundle = _sabotage(zoo, tmp_path, "        return y\n",
                       "        if not hasattr(self, '_out'):\n            self._out = torch.empty_like(y)\n"
                       "        self._out.copy_(y)\n        return self._out\n")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float32", 2)
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"])
    f = r["first_divergence"]
    assert (f["stage"], f["step"]) == ("output", 1)
    assert "probe pass of step 1" in f["raised"] and "free pass of step 1" in f["raised"]
    assert "a caller's earlier outputs change" in f["raised"]
    one = lock_bundle(bundle, zoo["program"], zoo["weights"], "float32", 1)
    assert one["verdict"] == "fail"   # the free pass overwrote the probe pass's output already


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_forward_that_ignores_an_input_passed_as_its_argument_fails(zoo, tmp_path, dtype):
    """compile.py hands forward its inputs as arguments; the free pass does too (their buffers NaN
    meanwhile), so a forward that reads an input's buffer instead of its argument fails, while the
    honest bundle passes and its buffers hold their values after the lock."""
    program = read_file(zoo["program"])
    name = next(n for n in program.leaves if program.roles[n] == "input" and program.real[n])
    bundle = _sabotage(zoo, tmp_path, f"{name} = self.leaf_{name} if {name} is None else {name}",
                       f"{name} = self.leaf_{name}")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], dtype, 1)
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"])
    assert r["first_divergence"]["stage"] in ("output", "write-back")
    assert r["steps_detail"][0]["output"]["nonfinite_mismatch"] or \
        any(m["nonfinite_mismatch"] for m in r["steps_detail"][0]["states"].values())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_forward_that_writes_into_its_argument_fails(zoo, tmp_path, dtype):
    """A caller's input is as it was after forward: a free pass that writes into its argument
    (after its output is computed, every figure right) fails naming the argument."""
    program = read_file(zoo["program"])
    name = next(n for n in program.leaves if program.roles[n] == "input" and program.real[n])
    bundle = _sabotage(zoo, tmp_path, "        return y\n",
                       f"        if {name} is not self.leaf_{name}:\n            {name}.mul_(1.5)\n        return y\n")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], dtype, 2)
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"])
    f = r["first_divergence"]
    assert (f["stage"], f["out"], f["step"]) == ("argument", name, 1), f
    assert f"wrote into its argument `{name}`" in f["raised"] and f["line"] == program.bound_at[name]
    assert all(d["output"]["pass"] for d in r["steps_detail"])


@pytest.mark.parametrize("dtype,release", [("float64", False), ("float64", True), ("float32", False)])
def test_the_free_pass_runs_as_a_user_does_with_no_hook_set(zoo, tmp_path, monkeypatch, dtype, release):
    """A user's run sets no hook (`probe` None), and so does the free pass, whether or not weights
    are let go as it runs (through the instance's `tap`): a forward that computes otherwise with
    no hook fails at its output, and one that raises then fails naming the stage it raised in;
    the honest bundle passes, its class's `tap` as it was."""
    from emitter.verify import resident
    if release:
        monkeypatch.setattr(resident, "RELEASE_FROM", 0)
    assert lock_bundle(zoo["bundle"], zoo["program"], zoo["weights"], dtype, 2)["verdict"] == "pass"
    bundle = _sabotage(zoo, tmp_path, "        return y\n", "        return y * 1.5 if self.probe is None else y\n")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], dtype, 2)
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"])
    assert (r["first_divergence"]["stage"], r["first_divergence"]["step"]) == ("output", 1), r["first_divergence"]
    shutil.rmtree(bundle)
    tap = "        return value if self.probe is None else self.probe(stage, value)\n"
    bundle = _sabotage(zoo, tmp_path, tap, "        if self.probe is None and stage == 4:\n"
                       "            raise ValueError('only in a user run')\n" + tap)
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], dtype, 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["stage"], f["step"]) == (4, 1), (r["reason"], f)
    assert "only in a user run" in f["raised"]
    text = open(os.path.join(bundle, "model.py")).read()   # a forward that hands the work on
    assert text.count("    def forward(self") == 1
    open(os.path.join(bundle, "model.py"), "w").write(text.replace(
        "    def forward(self", "    def forward(self, *args, **kwargs):\n        return self.body(*args, **kwargs)\n\n"
        "    def body(self"))
    f = lock_bundle(bundle, zoo["program"], zoo["weights"], dtype, 2)["first_divergence"]
    assert (f["stage"], f["step"]) == (4, 1) and "only in a user run" in f["raised"], f
    shutil.rmtree(bundle)
    bundle = _sabotage(zoo, tmp_path, "= self.tap(0, ", "= self.tap(stage=0, value=")   # a user's call
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], dtype, 2)
    assert r["verdict"] == "pass", (r["reason"], r["first_divergence"])


@pytest.mark.parametrize("second", ["sw[:1] * 7", "sw * 1.001"])
def test_a_stage_tapped_twice_is_judged_on_its_last_tap(zoo, tmp_path, second):
    """A module that taps a stage again with another value (of another shape, or off by 0.1%)
    is judged on that last tap, whatever the first handed on: a fail at that stage."""
    import re
    bundle = tmp_path / "bundle"
    shutil.copytree(zoo["bundle"], bundle)
    text = (bundle / "model.py").read_text()
    line = re.search(r"\n( +)sw = self\.tap\((\d+), swiglu\(.*\)\)\n", text)
    index = int(line.group(2))
    (bundle / "model.py").write_text(text.replace(
        line.group(0), line.group(0) + f"{line.group(1)}self.tap({index}, {second})\n"))
    r = lock_bundle(str(bundle), zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "fail" and r["first_divergence"]["stage"] == index, r["first_divergence"]
    assert [s["stage"] for s in r["stages"] if not s["pass"]] == [index]


def test_the_free_pass_hands_inputs_of_any_dtype_as_arguments_and_puts_their_buffers_back():
    """The free pass's inputs: forward's arguments are the buffers' values; meanwhile a float
    buffer holds NaN, an integer one its least value, a bool one each value flipped; after, each
    holds its values again, though the module wrote into its argument or raised."""
    import torch
    from emitter.verify.probe import as_arguments
    model = torch.nn.Module()
    values = {"f": torch.arange(4.0), "i": torch.arange(4), "b": torch.tensor([True, False])}
    for n, v in values.items():
        model.register_buffer("leaf_" + n, v.clone())
    with pytest.raises(ZeroDivisionError):
        with as_arguments(torch, model, ["f", "i", "b", "missing"]) as args:
            assert set(args) == {"f", "i", "b"} and all(torch.equal(args[n], values[n]) for n in args)
            assert torch.isnan(model.leaf_f).all() and (model.leaf_i == torch.iinfo(torch.int64).min).all()
            assert torch.equal(model.leaf_b, ~values["b"])
            args["f"].mul_(2)
            1 / 0
    assert all(torch.equal(getattr(model, "leaf_" + n), v) for n, v in values.items())


def test_inputs_sharing_memory_are_put_back_whole():
    """Two inputs whose buffers share memory: both arguments hold the values, and the memory
    holds them again after (each input's copy taken before any is poisoned)."""
    import torch
    from types import SimpleNamespace
    from emitter.verify.probe import as_arguments
    base = torch.arange(6, dtype=torch.float64)
    model = SimpleNamespace(leaf_a=base[:3], leaf_b=base[:3])
    with as_arguments(torch, model, ["a", "b"]) as args:
        assert torch.equal(args["a"], torch.arange(3.0, dtype=torch.float64)) and torch.equal(args["a"], args["b"])
        assert torch.isnan(base[:3]).all()
    assert torch.equal(base, torch.arange(6, dtype=torch.float64))
    mask = torch.tensor([True, False, False, True])   # a mask two share: flipped once, not twice
    model = SimpleNamespace(leaf_a=mask[:2], leaf_b=mask[:2])
    with as_arguments(torch, model, ["a", "b"]) as args:
        assert torch.equal(args["a"], torch.tensor([True, False])) and torch.equal(mask[:2], ~args["b"])
    assert torch.equal(mask, torch.tensor([True, False, False, True]))


@pytest.mark.parametrize("old,new,stage,said", [
    ("        return y\n", "        return float(y.sum())\n", "output", "returned a float, not a tensor"),
    ('            self.register_buffer("leaf_" + name, value)\n',
     '            if name != "cs":\n                self.register_buffer("leaf_" + name, value)\n',
     "load", "holds no buffer `leaf_cs`"),   # (the load stage named the leaf first)
])
def test_a_module_without_a_tensor_output_or_a_states_buffer_fails_naming_it(zoo, tmp_path, old, new, stage, said):
    bundle = _sabotage(zoo, tmp_path, old, new)
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "fail" and r["first_divergence"]["stage"] == stage and said in r["reason"], r["reason"]
    if stage == "load":
        assert r["first_divergence"]["out"] == "cs"


@pytest.mark.parametrize("old,new,stage,said", [
    ("class LogosModule(", "class LogosModel(", "load", "defines no LogosModule"),
    ("def load_weights(", "def load_weight(", "load", "defines no load_weights"),
    ("\nclass LogosModule(", "\nraise SystemExit(2)\n\n\nclass LogosModule(", "import", "SystemExit: 2"),
    ("\nclass LogosModule(", "\nTABLE = torch.zeros(2 ** 42)\n\n\nclass LogosModule(", "import", "importing the module failed"),
    ('    if not os.path.isdir(directory):\n', '    raise SystemExit("model.py: refused")\n    if not os.path.isdir(directory):\n',
     "load", "raised: SystemExit: model.py: refused"),
])
def test_a_bundle_wrong_before_any_stage_fails_naming_the_part(zoo, tmp_path, old, new, stage, said):
    """A model.py without what every bundle defines, or one that exits (or asks for 32 TiB) as it
    is imported or as it loads the weights the VM read, is the bundle's fault: a fail (exit 1)
    naming the part, never an error of the lock's (exit 2)."""
    bundle = _sabotage(zoo, tmp_path, old, new)
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "fail" and r["first_divergence"]["stage"] == stage and said in r["reason"], r["reason"]


def test_a_one_value_tensor_at_any_stride_has_its_hash():
    """One value is contiguous whatever its stride (an argmax's expanded index): its hash is its
    bytes', not a crash of the lock on a correct bundle."""
    import torch
    import xxhash
    from emitter.verify.leaf_check import bytes_hash
    one = torch.arange(4.0, dtype=torch.float64)[2::2][:1].reshape(1, 1)
    assert one.is_contiguous() and one.stride() != (1, 1)
    assert bytes_hash(torch, one) == xxhash.xxh3_64_intdigest(np.float64(2.0).tobytes())


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_the_load_stage_hashes_each_leaf_as_it_compares_it(tmp_path, dtype):
    """A leaf the load stage reads in blocks (a float64 or bfloat16 copy of a float32 table) is
    hashed as it is compared, once: its hash is the hash of its bytes, and a leaf that fails is not
    hashed."""
    import torch
    from types import SimpleNamespace
    from emitter.verify.leaf_check import bytes_hash, load_stage, leaf_sums
    (tmp_path / "t.logos").write_text("Let W be a 3000 by 700 tensor of Real.\nLet V be a 2 by 3 tensor of Real.\n"
                                      "Let y be W hadamard W.\nLet z be V hadamard V.\n")
    program = read_file(str(tmp_path / "t.logos"))
    rng = np.random.default_rng(2)
    leaves = {"W": rng.standard_normal((3000, 700)).astype(np.float32), "V": np.ones((2, 3), np.float32)}
    t = getattr(torch, dtype)
    model = SimpleNamespace(leaf_W=torch.from_numpy(leaves["W"]).to(t), leaf_V=torch.zeros(2, 3, dtype=t))
    resident = SimpleNamespace(release=lambda names: None, ranges={}, maps_as=lambda *a: False)
    sums = {}
    load = load_stage(torch, model, program, leaves, t, {"abs": 0, "rel": 0}, resident, sums=sums)
    assert [f["leaf"] for f in load["failed"]] == ["V"] and set(sums) == {"W"}
    assert sums["W"][0] is model.leaf_W and sums["W"][5] == bytes_hash(torch, model.leaf_W)
    assert leaf_sums(torch, model, ["W"], resident, sums)["W"] is sums["W"]


OVERFLOWING = """Let x be a 1 by 2 tensor of Real.
Set item 1 of x to {big}.
Set item 2 of x to 2.
Let y be x hadamard x.
"""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_leaves_a_dtype_cannot_hold_are_an_error_naming_them(tmp_path, dtype):
    """A value finite in float64 that a float32 or bfloat16 module cannot hold (it rounds to Inf),
    in a weights file or a program's fill, is an error naming the file or line and the leaf: no
    module of that dtype computes the program's meaning (where it was a fail with tiny figures, or
    the module's constructor raising). float64 locks it."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    for where in ("file", "fill"):
        source = OVERFLOWING.format(big="1e39" if where == "fill" else "1")
        path = tmp_path / f"{where}.logos"
        path.write_text(source)
        program = read_file(str(path))
        bundle = str(tmp_path / f"b_{where}")
        write_bundle(emit_program(program, {}), bundle)
        w = None
        if where == "file":
            w = tmp_path / "w"
            w.mkdir()
            np.array([[1e39, 2.0]]).astype("<f8").tofile(w / "x.f64")
            w = str(w)
        assert lock_bundle(bundle, str(path), w, "float64", 1)["verdict"] == "pass"
        r = lock_bundle(bundle, str(path), w, dtype, 1)
        said = f"{os.path.join(w, 'x.f64')}: `x` holds" if where == "file" else \
            f"{path}: `x` (declared at line 1) is filled with"
        assert r["verdict"] == "error" and r["reason"].startswith(f"{said} 1e+39, beyond what torch."), r["reason"]
    # the sign said; a NaN beside it allowed (allow_nonfinite) hides nothing; an overridden fill is what it ends as
    w = str(tmp_path / "w")
    np.array([[-1e39, np.nan]]).astype("<f8").tofile(os.path.join(w, "x.f64"))
    r = lock_bundle(str(tmp_path / "b_file"), str(tmp_path / "file.logos"), w, dtype, 1, allow_nonfinite=("x",))
    assert r["verdict"] == "error" and "`x` holds -1e+39, beyond" in r["reason"], r["reason"]
    path = tmp_path / "over.logos"
    path.write_text(OVERFLOWING.format(big="1e39").replace("Set item 2 of x to 2.", "Set item 1 of x to 3."))
    write_bundle(emit_program(read_file(str(path)), {}), str(tmp_path / "b_over"))
    assert lock_bundle(str(tmp_path / "b_over"), str(path), None, dtype, 1)["verdict"] == "pass"


INT_PAST_FLOAT32 = """Let t be a 1 by 2 tensor of Int.
Set item 1 of t to {big}.
Set item 2 of t to 16777216.
Let one be a 1 by 2 tensor of Int.
Set item 1 of one to 1.
Let y be t plus one.
"""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int_leaves_the_module_cannot_hold_exactly_are_an_error_naming_them(tmp_path, dtype):
    """An Int leaf past 2^24 that float32 (where Int leaves are held, under bfloat16 too) rounds is
    an error naming the fill's line or the file and the leaf (it failed a correct bundle, blaming
    its output); one float32 holds exactly (2^25) runs."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    path = tmp_path / "p.logos"
    path.write_text(INT_PAST_FLOAT32.format(big=16777217))
    bundle = str(tmp_path / "b")
    write_bundle(emit_program(read_file(str(path)), {}), bundle)
    assert lock_bundle(bundle, str(path), None, "float64", 1)["verdict"] == "pass"
    r = lock_bundle(bundle, str(path), None, dtype, 1)
    assert r["verdict"] == "error" and r["reason"] == (
        f"{path}: `t` (declared at line 1) is filled with the integer 16777217, which float32 rounds (it "
        f"holds every integer up to 2^24 only): a {dtype} check cannot run on it"), r["reason"]
    w = tmp_path / "w"
    w.mkdir()
    np.array([[3.0, -16777219.0]]).astype("<f8").tofile(w / "t.f64")
    r = lock_bundle(bundle, str(path), str(w), dtype, 1)
    assert r["verdict"] == "error" and r["reason"].startswith(
        f"{w / 't.f64'}: `t` holds the integer -16777219, which float32 rounds"), r["reason"]
    path.write_text(INT_PAST_FLOAT32.format(big=2 ** 25).replace("of one to 1.", "of one to 4."))
    write_bundle(emit_program(read_file(str(path)), {}), str(tmp_path / "b2"))
    assert lock_bundle(str(tmp_path / "b2"), str(path), None, dtype, 1)["verdict"] == "pass"


def test_a_stage_that_overflows_in_float32_fails_saying_so(tmp_path):
    """1e20 squared is 1e40: float32's module computes Inf where the VM has a number. A fail whose
    first divergence counts the values NaN or Inf on one side only (no other figure does)."""
    from emitter.verify.verdict import describe
    path = tmp_path / "p.logos"
    path.write_text(OVERFLOWING.format(big="1e20"))
    bundle = emit_bundle(path.read_text(), tmp_path / "b")
    r = lock_bundle(bundle, str(path), None, "float32", 1)
    assert r["verdict"] == "fail" and r["first_divergence"]["nonfinite"] == 1, r["first_divergence"]
    assert "1 value(s) NaN or Inf on one side only" in describe(r), describe(r)


@pytest.mark.parametrize("how", [
    "os.unlink({P})", "os.rename({P}, {P} + '.bak'); os.rename({P} + '.bak', {P})",
    "_d = os.open({D}, os.O_RDONLY); os.close(os.open({N}, os.O_RDWR, dir_fd=_d)); os.close(_d)",
    "import shutil; shutil.copytree({D}, {D} + '.x'); shutil.rmtree({D}); os.rename({D} + '.x', {D})",
    "_d = os.open({D}, os.O_RDONLY); _h = open({N}, 'wb', opener=lambda p, fl: os.open(p, fl, dir_fd=_d)); "
    "_h.write(b'x'); _h.close(); os.close(_d)",
    "os.rename({D}, {D} + '.gone')",
])
def test_a_bundle_that_removes_renames_or_opens_its_weights_through_a_folder_fails(zoo, tmp_path, how):
    """Removing a weights file, renaming it (and back), opening it to write relative to a folder's
    descriptor, or removing the folder (shutil's rmtree, through descriptors) and putting a copy
    back: the bundle's doing, a fail naming the file, not an error of a file gone missing."""
    w = tmp_path / "w"
    shutil.copytree(zoo["weights"], w)
    victim = sorted(os.listdir(w))[0]
    code = how.format(P=repr(str(w / victim)), D=repr(str(w)), N=repr(victim))
    bundle = _sabotage(zoo, tmp_path, "        return y\n", f"        {code}\n        return y\n")
    r = lock_bundle(bundle, zoo["program"], str(w), "float64", 1)
    assert r["verdict"] == "fail" and r["first_divergence"]["stage"] == "load", r["reason"]
    assert str(os.path.realpath(w)) in r["reason"] or victim in r["reason"], r["reason"]


@pytest.mark.parametrize("how", ["open({P}, 'r+b').close()", "os.unlink({P}); os.symlink({T}, {P})"])
def test_a_weights_file_that_is_a_link_is_watched_where_it_leads(zoo, tmp_path, how, monkeypatch):
    """A leaf's file may link elsewhere (a shared root's blobs): opening it to write writes where it
    leads, and removing the link removes the leaf's file; both are the bundle's doing."""
    blobs, w = tmp_path / "blobs", tmp_path / "w"
    monkeypatch.setenv("LOGOS_ROOTS", str(blobs))
    shutil.copytree(zoo["weights"], blobs)
    w.mkdir()
    for f in os.listdir(blobs):
        os.symlink(blobs / f, w / f)
    victim = sorted(os.listdir(w))[0]
    code = how.format(P=repr(str(w / victim)), T=repr(str(blobs / victim)))
    bundle = _sabotage(zoo, tmp_path, "        return y\n", f"        {code}\n        return y\n")
    r = lock_bundle(bundle, zoo["program"], str(w), "float64", 1)
    assert r["verdict"] == "fail" and r["first_divergence"]["stage"] == "load", r["reason"]


@pytest.mark.parametrize("how", ["open({N}, 'wb').close()", "os.close(os.open({N}, os.O_WRONLY | os.O_CREAT))"])
def test_a_relative_file_written_elsewhere_is_not_the_weights(zoo, tmp_path, monkeypatch, how):
    """A bundle writing `W.f64` in the current folder, where a weights file has that name too,
    wrote no weights file (os.open's audit says no folder: the weights' file, unchanged, is not
    blamed)."""
    w, here = tmp_path / "w", tmp_path / "here"
    shutil.copytree(zoo["weights"], w)
    here.mkdir()
    monkeypatch.chdir(here)
    victim = sorted(os.listdir(w))[0]
    bundle = _sabotage(zoo, tmp_path, "        return y\n", f"        {how.format(N=repr(victim))}\n        return y\n")
    r = lock_bundle(bundle, zoo["program"], str(w), "float64", 1)
    assert r["verdict"] == "pass" and (here / victim).exists(), r["reason"]


def test_the_locks_own_trace_inside_the_weights_folder_is_not_the_bundles_write(zoo, tmp_path):
    """The VM's trace the lock stores (build/store/traces) may lie inside a weights folder that holds
    the repository: the lock's own writes there are not the bundle's."""
    import hashlib
    import torch
    from emitter.verify import environment
    w = tmp_path / "w"
    shutil.copytree(zoo["weights"], w)
    spec = {"path": str(w / "build/store/traces/ab/k.trace"), "key": "ab" + "0" * 62, "min_bytes": 0,
            "source": hashlib.sha256(read_file(zoo["program"]).source.encode()).hexdigest(),
            "environment": environment.describe(np, torch)["digest"]}
    r = lock_bundle(zoo["bundle"], zoo["program"], str(w), "float64", 2, trace=spec)
    assert r["verdict"] == "pass" and r["trace"]["written"], (r["reason"], r.get("trace"))


def test_a_leaf_the_module_holds_as_inf_says_so_in_its_first_divergence(zoo, tmp_path):
    """A module whose copy of a weight holds Inf where the file holds a number: the load stage's
    first divergence counts it (no other figure does: max abs is over the finite values)."""
    from emitter.verify.verdict import describe
    program = read_file(zoo["program"])
    w = next(n for n in program.leaves if program.roles[n] == "weight"
             and os.path.exists(os.path.join(zoo["weights"], n + ".f64")))
    bundle = _sabotage(zoo, tmp_path, '            self.register_buffer("leaf_" + name, value)\n',
                       f'            if name == {w!r}:\n                value = value.clone()\n'
                       '                value.view(-1)[0] = float("inf")\n'
                       '            self.register_buffer("leaf_" + name, value)\n')
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["stage"], f["out"], f.get("nonfinite")) == ("load", w, 1), f
    assert "1 value(s) NaN or Inf on one side only" in describe(r), describe(r)



@pytest.mark.parametrize("when", ["torch.is_grad_enabled()", "not torch.is_grad_enabled()"])
def test_a_forward_that_computes_otherwise_with_autograd_on_or_off_fails(zoo, tmp_path, when):
    """A user's call runs with autograd on (torch's default; compile.py traces it so), the probe
    pass with it off: a forward wrong in either mode fails."""
    program = read_file(zoo["program"])
    y = program.output
    bundle = _sabotage(zoo, tmp_path, f"        return {y}\n", f"        if {when}:\n            {y} = {y} * 1.5\n"
                       f"        return {y}\n")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float32", 1)
    assert r["verdict"] == "fail" and r["first_divergence"]["stage"] == "output", r["first_divergence"]


_REBINDS = {   # (what model.py runs, where, once per process; what the lock names)
    "sqrt": ("import numpy as _np\nif not hasattr(_np, '_p'):\n    _np._p = 1\n"
             "    _s = _np.sqrt; _np.sqrt = lambda x, *a, **k: _s(x * 1.01, *a, **k)\n"
             "    _t = torch.sqrt; torch.sqrt = lambda x, *a, **k: _t(x * 1.01, *a, **k)\n", "numpy.sqrt` and 1 more"),
    "pi": ("import math as _m\n_m.pi = 3.3\n", "math.pi`"),
    "code": ("import emitter.verify.compare as _c\n_c.compare.__code__ = (lambda got, want, tol: None).__code__\n",
             "emitter.verify.compare.compare.__code__`"),
    "tensor": ("torch.Tensor.numpy = lambda self, force=False: torch._C.TensorBase.numpy(self) * 0.5\n",
               "torch.Tensor.numpy`"),
    "wraps": ("import numpy as _np, functools as _ft\n_real = getattr(_np.sqrt, '__wrapped__', _np.sqrt)\n"
              "_fake = _ft.wraps(_real)(lambda x, *a, **k: 2 * _real(x, *a, **k))\n"
              "_fake.__module__ = 'torch.anything'\n_np.sqrt = _fake\n", "numpy.sqrt`"),
    "evil": ("import numpy as _np\nclass _Evil:\n    def __getattr__(self, n):\n        raise ValueError(n)\n"
             "_np.e = _Evil()\n", "numpy.e`"),
    "eps": ("import sys as _sys\n_sys.modules['emitter.ops.norms'].EPS = 0.5\n", "emitter.ops.norms.EPS`"),
}


@pytest.mark.parametrize("when", ["import", "forward"])
@pytest.mark.parametrize("what", sorted(_REBINDS))
def test_a_bundle_that_rebinds_what_the_vm_computes_with_fails_and_it_is_put_back(zoo, tmp_path, when, what):
    """model.py rebinding numpy.sqrt (the VM's rmsnorm) and torch.sqrt alike, math.pi (the VM's
    gelu), the norms' EPS, a judge's code, numpy.sqrt dressed as torch's own wrapper, a value that
    raises when read, or adding a method to torch.Tensor (which the lock reads values with), as
    it is imported or in its forward, would move the meaning it is compared with: a fail at import,
    and each is put back for what the process locks next."""
    import math
    import torch
    import emitter.ops.norms as norms
    import emitter.verify.compare as cmp
    patch, said = _REBINDS[what]
    sqrt, tsqrt, pi, code, e, eps = np.sqrt, torch.sqrt, math.pi, cmp.compare.__code__, np.e, norms.EPS
    y = read_file(zoo["program"]).output
    if when == "import":
        bundle = _sabotage(zoo, tmp_path, "import torch\n", "import torch\n" + patch)
    else:
        bundle = _sabotage(zoo, tmp_path, f"        return {y}\n",
                           "".join("        " + line + "\n" for line in patch.splitlines()) + f"        return {y}\n")
    try:
        r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
        assert (np.sqrt, torch.sqrt, math.pi, cmp.compare.__code__, np.e, norms.EPS) == (sqrt, tsqrt, pi, code, e, eps)
        assert "numpy" not in torch.Tensor.__dict__
    finally:
        np.sqrt, torch.sqrt, math.pi, cmp.compare.__code__, np.e, norms.EPS = sqrt, tsqrt, pi, code, e, eps
        vars(np).pop("_p", None)
        if "numpy" in torch.Tensor.__dict__:
            del torch.Tensor.numpy
    assert r["verdict"] == "fail", r["reason"]
    f = r["first_divergence"]
    assert (f["stage"], f["op"]) == ("import", "model.py") and f"rebound `{said}" in f["raised"], f
    assert lock_bundle(zoo["bundle"], zoo["program"], zoo["weights"], "float64", 1)["verdict"] == "pass"


def test_torch_wrapping_its_own_as_a_bundle_runs_is_not_the_bundles_doing(zoo, tmp_path):
    """torch.utils.checkpoint (non-reentrant) imports torch._dynamo, which wraps torch.manual_seed:
    a correct bundle that uses it passes, in a process whatever it locked before."""
    y = read_file(zoo["program"]).output
    bundle = _sabotage(zoo, tmp_path, f"        return {y}\n", "        import torch.utils.checkpoint as _ck\n"
                       f"        return _ck.checkpoint(lambda t: t, {y}, use_reentrant=False)\n")
    for _ in range(2):
        r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
        assert r["verdict"] == "pass", (r["reason"], r["first_divergence"])
