"""Verdicts that cannot lie: the bundle is locked as a user runs it (its own loader, fills and
write-backs; mutants of each are caught and named), missing leaves are errors, the report is always
this run's and refuses results that do not match build/, formats carry versions.

The pipeline scenarios run real `doit` in a temporary copy of a small zoo."""

import json
import os
import sqlite3
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from conftest import emit_bundle, run_cli, write_weights
from emitter.language.errors import ProgramError
from emitter.language.reader import read_file, read_program
from emitter.verify import vm
from emitter.verify.lock import lock_bundle
from test_pipeline import PROG_A, PROG_B, _weights, doit, make_zoo

RING = """Let x be a 1 by 3 tensor of Real.
Let wc be a 2 by 3 tensor of Real.
Let cs be a 2 by 3 tensor of Real.
Let g be a 1 by 3 tensor of Real.
Set item 2 of g to 0.5.
Let h be causal conv of x with weight wc state cs over 2 taps.
Let k be h hadamard g.
Let y be silu of k.
"""


@pytest.fixture
def ring(tmp_path):
    (tmp_path / "ring.logos").write_text(RING)
    program = read_file(str(tmp_path / "ring.logos"))
    weights = write_weights(program, tmp_path / "w", seed=4, skip=("g",))
    bundle = emit_bundle(RING, tmp_path / "b")
    return {"program": str(tmp_path / "ring.logos"), "weights": weights, "bundle": bundle}


def _mutate(bundle, old, new):
    path = os.path.join(bundle, "model.py")
    text = open(path).read()
    assert old in text, old
    open(path, "w").write(text.replace(old, new, 1))


def _lock(r, dtype="float64", steps=2):
    return lock_bundle(r["bundle"], r["program"], r["weights"], dtype, steps)


def test_the_good_bundle_passes(ring):
    for dtype in ("float64", "float32"):
        r = _lock(ring, dtype)
        assert r["verdict"] == "pass", r["reason"] or r["first_divergence"]
        assert r["load"] == {"pass": True, "leaves": 4, "failed": []}


@pytest.mark.parametrize("old, new, leaf", [
    # a loader that scales one weight: the user's model.py --weights would run with it
    ("weights[name] = out.reshape(shape)",
     "weights[name] = out.reshape(shape) * (1.5 if name == 'wc' else 1)",
     "wc"),
    # a loader that drops a state's file: the state starts from zeros, not from its file
    ("weights[name] = out.reshape(shape)",
     "weights[name] = out.reshape(shape)\n"
     "        weights.pop('cs') if name == 'cs' else None", "cs"),
    # a loader that scales a mapped weight in place: its pages are no longer the file's
    ("weights[name] = out.reshape(shape)",
     "weights[name] = out.reshape(shape)\n"
     "        weights[name].mul_(1.5) if name == 'wc' else None", "wc"),
    # a wrong fill
    ('"g": ((1, 0.5),),', '"g": ((1, 0.25),),', "g"),
    # a fill at the wrong item
    ('"g": ((1, 0.5),),', '"g": ((2, 0.5),),', "g"),
])
def test_a_wrong_loader_or_fill_fails_at_the_load_stage_naming_the_tensor(ring, old, new, leaf):
    _mutate(ring["bundle"], old, new)
    r = _lock(ring)
    assert r["verdict"] == "fail"
    f = r["first_divergence"]
    assert (f["stage"], f["out"], f["op"], f["step"]) == ("load", leaf, "load", 0)
    assert f["line"] == read_program(RING).decls[leaf].line
    assert [x["leaf"] for x in r["load"]["failed"]] == [leaf]
    assert r["worst"]["stage"] == "load" and r["worst"]["out"] == leaf


@pytest.mark.parametrize("new", ["", "self.leaf_cs.copy_(cs.flip(0))"])
def test_a_dropped_or_wrong_write_back_names_the_state_and_step(ring, new):
    _mutate(ring["bundle"], "self.leaf_cs.copy_(cs)", new)
    r = _lock(ring)
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"])
    f = r["first_divergence"]
    assert (f["stage"], f["out"], f["op"], f["step"], f["line"]) == ("write-back", "cs", "causal conv", 1, 6)
    assert not r["steps_detail"][0]["states"]["cs"]["pass"]


@pytest.mark.parametrize("old, new, where", [
    ("import torch.nn.functional as F\n", "import torch.nn.functional as F\nF = undefined_name\n",
     ("import", "model.py", 0)),
    ("import torch.nn.functional as F\n", "import torch.nn.functional as F\ndef oops(:\n",   # no Python
     ("import", "model.py", 0)),
    ("    if not os.path.isdir(directory):", "    1 / 0\n    if not os.path.isdir(directory):",
     ("load", "load_weights", 0)),
    ("k = self.tap(1, h * g)", "k = h * g", (1, "hadamard", 1)),   # a stage never tapped
])
def test_a_bundle_that_fails_where_no_stage_runs_is_a_fail_naming_that_part(ring, tmp_path, old, new, where):
    """A model.py that does not import, a loader that raises on the weights the VM read, a forward
    that skips a stage: the bundle is wrong, so the check fails (exit 1) naming that part of it;
    exit 2 stays for what is not the bundle's fault."""
    _mutate(ring["bundle"], old, new)
    r = _lock(ring)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["stage"], f["op"], f["step"]) == where, r["reason"]
    assert f["raised"] == r["reason"] and r["worst"]["stage"] == where[0]
    p = run_cli("lock", ring["bundle"], "--program", ring["program"], "--weights", ring["weights"],
                "-o", str(tmp_path / "r.json"))
    said = p.stdout + p.stderr
    assert p.returncode == 1 and "FAIL" in said, said
    assert r["reason"].split(": ", 1)[1][:40] in said
    assert not [x for x in ("`None", "line None", "-×") if x in said], said   # what is known, said


def test_a_loader_that_writes_into_its_weight_files_fails_naming_them(ring):
    """A hand lock's weights are the files as the VM read them: a bundle whose load_weights
    writes into one (then the VM's maps read the written bytes too) is no verdict on the weights
    but on the bundle, which holds the file open to write: a fail naming the file and its leaf."""
    _mutate(ring["bundle"], 'mode="c")', 'mode="r+")\n        if name == "wc":\n'
            '            data[0, 0] = 3.0\n            data.flush()')
    r = _lock(ring)
    assert r["verdict"] == "fail" and r["stale_weights"] == ["wc.f64"], r["reason"]
    assert "the bundle wrote into the weights file wc.f64 (`wc`) while it ran" in r["reason"]


def test_a_hand_lock_takes_the_programs_precision_policy(tmp_path):
    """A bundle emitted with a program's own bf16 policy (its config's `precision:`) is locked by
    hand under it (`--precision OP=COMPUTE,OUTPUT`); without it, the lock says which stage's
    precision differs from the default policy; a bad one is one line, exit 2."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    src = "Let x be a 1 by 64 tensor of Real.\nLet w be a 64 by 64 tensor of Real.\n" \
          "Let h be x matmul w.\nLet y be sigmoid of h.\n"
    (tmp_path / "s.logos").write_text(src)
    program = read_file(str(tmp_path / "s.logos"))
    weights = write_weights(program, tmp_path / "w", seed=2)
    write_bundle(emit_program(program, {"sigmoid": ("fp32", "fp32")}), str(tmp_path / "b"))
    args = ["lock", str(tmp_path / "b"), "--program", str(tmp_path / "s.logos"), "--weights", weights,
            "--dtype", "bfloat16", "-o", str(tmp_path / "r.json")]
    p = run_cli(*args)
    assert p.returncode == 2 and "stage 1 `y = sigmoid`" in p.stderr and "emit it again" in p.stderr, p.stderr
    p = run_cli(*args, "--precision", "sigmoid=fp32,fp32")
    assert p.returncode == 0 and "PASS" in p.stdout, p.stdout + p.stderr
    p = run_cli(*args, "--precision", "sigmod=fp32,fp32")
    assert p.returncode == 2 and p.stderr.strip() == "--precision: `sigmod` is not an op", p.stderr


DECODE = """Let tok be a 1 by 1 tensor of Int.
Let pos be a 1 by 1 tensor of Int.
Set item 1 of tok to 3.
Set item 1 of pos to 5000.
Let one be a 1 by 1 tensor of Int.
Set item 1 of one to 1.
Let emb be a 8 by 32 tensor of Real.
Let W be a 32 by 8 tensor of Real.
Let S be a 1 by 32 tensor of Real.
Let pn be pos plus one.
Let x be row tok of emb.
Let s2 be S plus x.
Let logits be s2 matmul W.
Let nxt be argmax of logits.
Set row 0 of tok to nxt.
Set row 0 of pos to pn.
Set row 0 of S to s2.
"""


def _decode(tmp_path):
    """DECODE's bundle (emitted with the bf16 policy), its source and its weights."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    (tmp_path / "d.logos").write_text(DECODE)
    program = read_file(str(tmp_path / "d.logos"))
    weights = write_weights(program, tmp_path / "w", seed=1, skip=("S",))
    write_bundle(emit_program(program, {}), str(tmp_path / "b"))
    return str(tmp_path / "b"), str(tmp_path / "d.logos"), weights


@pytest.mark.parametrize("dtype, state, new", [
    ("float32", "pos", "pos + 1"),       # 5002 for 5001: inside float32's relative tolerance
    ("bfloat16", "pos", "pos + 1"),
    ("bfloat16", "tok", "tok + 1"),
    ("bfloat16", "S", "S * 2"),          # a gain: the cosine is 1
    ("bfloat16", "S", "S * 0.5"),
])
def test_a_state_written_back_wrong_fails_whatever_its_cosine(tmp_path, dtype, state, new):
    """An Int state (a token, a position) is the VM's value for value at every dtype; a real one
    at bfloat16 is judged on its nmse too, as a gain leaves its cosine 1."""
    bundle, source, weights = _decode(tmp_path)
    good = lock_bundle(bundle, source, weights, dtype, 3)
    assert good["verdict"] == "pass", good["first_divergence"]
    assert good["steps_detail"][2]["states"]["pos"]["integer_mismatches"] == 0
    _mutate(bundle, f"self.leaf_{state}.copy_({state})", f"self.leaf_{state}.copy_({new})")
    r = lock_bundle(bundle, source, weights, dtype, 3)
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"]), r["first_divergence"]
    f = r["first_divergence"]
    assert (f["stage"], f["out"], f["step"]) == ("write-back", state, 1)


def test_a_token_flipped_inside_the_noise_is_excused_where_it_is_written_back(tmp_path):
    """Greedy decoding at bfloat16: two logits a hair apart (1e-6 relative) tie in bf16 and the
    module picks the other token; the flip is excused (inside the logits' noise), and so is that
    token written back as the next step's input, which is the module's own output."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    src = ("Let tok be a 1 by 1 tensor of Int.\nLet Emb be a 4 by 64 tensor of Real.\n"
           "Let W be a 64 by 32 tensor of Real.\nLet e be row tok of Emb.\nLet logits be e matmul W.\n"
           "Let nxt be argmax of logits.\nSet row 0 of tok to nxt.\n")
    (tmp_path / "t.logos").write_text(src)
    rng = np.random.default_rng(0)
    (tmp_path / "w").mkdir()
    W = 0.1 * rng.standard_normal((64, 32))
    W[:, 2] = np.abs(W[:, 2]) + 0.2
    W[:, 3] = W[:, 2] * (1 + 1e-6)
    np.abs(rng.standard_normal((4, 64))).astype("<f8").tofile(tmp_path / "w" / "Emb.f64")
    W.astype("<f8").tofile(tmp_path / "w" / "W.f64")
    write_bundle(emit_program(read_file(str(tmp_path / "t.logos")), {}), str(tmp_path / "b"))
    r = lock_bundle(str(tmp_path / "b"), str(tmp_path / "t.logos"), str(tmp_path / "w"), "bfloat16", 2)
    assert r["verdict"] == "pass" and r["bf16"]["argmax_excused"] == r["bf16"]["argmax_flips"] >= 1, r["first_divergence"]
    assert any(d["states"]["tok"].get("flip_excused") for d in r["steps_detail"])
    _mutate(str(tmp_path / "b"), "self.leaf_tok.copy_(tok)", "self.leaf_tok.copy_(tok * 0 + 1)")   # neither's
    r = lock_bundle(str(tmp_path / "b"), str(tmp_path / "t.logos"), str(tmp_path / "w"), "bfloat16", 2)
    assert r["verdict"] == "fail" and r["first_divergence"]["stage"] == "write-back", r["first_divergence"]
    # the module's token is the one the VM ranks last: no near-tie, however close the VM's top two
    _mutate(str(tmp_path / "b"), "self.leaf_tok.copy_(tok * 0 + 1)", "self.leaf_tok.copy_(tok)")
    _mutate(str(tmp_path / "b"), "torch.argmax(self.cast(2, logits))",
            "(torch.argmin if self.probe is None else torch.argmax)(self.cast(2, logits))")
    r = lock_bundle(str(tmp_path / "b"), str(tmp_path / "t.logos"), str(tmp_path / "w"), "bfloat16", 2)
    out = r["steps_detail"][0]["output"]
    assert r["verdict"] == "fail" and not out["flip_excused"] and not out["argmax_agree"], out
    assert out["flip_margin"] > 10 * out["flip_noise"], out


def test_an_output_that_is_a_states_buffer_fails(tmp_path):
    """A forward that returns its token state's buffer gives the right values at each step, but a
    caller's earlier outputs change under it as the next step writes the state back: a fail."""
    bundle, source, weights = _decode(tmp_path)
    _mutate(bundle, "return nxt", "return self.leaf_tok")
    r = lock_bundle(bundle, source, weights, "float64", 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["stage"], f["out"], f["step"]) == ("output", "nxt", 1), r["reason"]
    assert "the buffer of its state `tok`" in r["reason"]


def test_the_lock_command_locks_a_hand_edited_bundle_on_its_merits(ring, tmp_path):
    _mutate(ring["bundle"], "# stage 0", "# a comment a person added\n        # stage 0")
    out = tmp_path / "r.json"
    p = run_cli("lock", ring["bundle"], "--program", ring["program"], "--weights", ring["weights"],
                "-o", str(out))
    assert p.returncode == 0, p.stderr               # edited, still right: it passes
    _mutate(ring["bundle"], "h * g", "h * g * 1.001")
    p = run_cli("lock", ring["bundle"], "--program", ring["program"], "--weights", ring["weights"],
                "-o", str(out))
    assert p.returncode == 1 and "stage 1 `k = hadamard` (line 7, step 1)" in p.stderr


def test_a_read_leaf_without_file_or_value_is_an_error_everywhere(ring, tmp_path):
    os.unlink(os.path.join(ring["weights"], "wc.f64"))
    program = read_file(ring["program"])
    with pytest.raises(ProgramError, match=r"the weight `wc` \(line 2\) is read but has no declared "
                                           r"value .* no file in the weights directory holds it \(wc.f64, .f32, .npy"):
        vm.load_leaves(program, ring["weights"])
    r = _lock(ring)
    assert r["verdict"] == "error" and "`wc`" in r["reason"] and ring["weights"] in r["reason"]
    from conftest import load_model
    import torch
    module = load_model(ring["bundle"])
    with pytest.raises(ValueError, match=r"no file holds the weight `wc` \(wc.f64, .f32, .npy"):
        module.load_weights(ring["weights"], torch.float64)
    # a state with no file starts from its declared value; a directory in a leaf's place is refused
    os.unlink(os.path.join(ring["weights"], "cs.f64"))
    os.mkdir(os.path.join(ring["weights"], "wc.f64"))
    with pytest.raises(ProgramError, match="`wc.f64` is not a regular file"):
        vm.load_leaves(program, ring["weights"])


def test_non_finite_weights_are_refused_unless_allowed(ring):
    np.array([[1.0, np.nan, 2.0], [0.0, 1.0, 2.0]]).astype("<f8").tofile(os.path.join(ring["weights"], "wc.f64"))
    r = _lock(ring)
    assert r["verdict"] == "error" and "non-finite" in r["reason"] and "wc.f64" in r["reason"]
    r = lock_bundle(ring["bundle"], ring["program"], ring["weights"], "float64", 1, allow_nonfinite=("wc",))
    assert r["verdict"] == "pass", r["reason"] or r["first_divergence"]   # NaN on both sides agrees


# ── the pipeline ───────────────────────────────────────────────────────────────────────────────

FAKE_IMPORTER = '''
import os, shutil, sys


def add_arguments(p):
    p.add_argument("checkpoint")
    p.add_argument("--program", required=True)
    p.add_argument("-o", "--out", required=True)


def main(args):
    if os.path.getsize(args.checkpoint) != 128:
        print(f"{args.checkpoint}: truncated checkpoint", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    shutil.copy(args.checkpoint, os.path.join(args.out, "w.f64"))
    return 0
'''


@pytest.fixture
def zoo(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None),
                                    "d": (PROG_A, "derive:\n  importer: fake\n  checkpoint: ckpt/w.bin\n")})
    _weights(z / "weights" / "a" / "w.f64", 0)
    (z / "emitter/importers/fake.py").write_text(FAKE_IMPORTER)
    with open(z / "emitter/importers/__init__.py", "a") as f:
        f.write('\nIMPORTERS["fake"] = ("emitter.importers.fake", "test importer")\n')
    _weights(z / "ckpt" / "w.bin", 5)
    return z


def _junit(z):
    root = ET.parse(z / "build/junit.xml").getroot()
    return {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}


def test_a_failed_task_makes_this_runs_report_not_the_last_ones(zoo):
    rc, ran, out = doit(zoo)
    assert rc == 0 and "report" in ran, out
    assert all(c.find("error") is None and c.find("failure") is None for c in _junit(zoo).values())
    (zoo / "ckpt/w.bin").write_bytes((zoo / "ckpt/w.bin").read_bytes()[:64])   # truncated
    rc, ran, out = doit(zoo)
    assert rc != 0 and "weights:d" in ran and "report" not in ran, out
    assert "written with 1 failed task(s) and 1 that could not run after one that failed as errors" in out, out
    cases = _junit(zoo)                                  # written this run, by the reporter
    for dtype in ("float64", "float32"):
        err = cases[("d", dtype)].find("error")
        assert err is not None and "weights:d failed in this run" in err.get("message")
        assert "exited 1" in err.get("message")
        assert cases[("a", dtype)].find("error") is None   # the others keep their verdicts
    summary = (zoo / "build/summary.md").read_text()
    assert "❌" in summary and "weights:d failed in this run" in summary
    report = json.loads((zoo / "build/report.json").read_text())
    assert report["counts"] == {"pass": 4, "fail": 0, "error": 2}, report["failures"]


def test_edited_targets_are_rebuilt_and_a_noop_runs_nothing(zoo):
    rc, _, out = doit(zoo)
    assert rc == 0, out
    result = zoo / "build/results/a/float64.json"
    locked = result.read_text()
    r = json.loads(locked)
    r["output"]["max_abs"] = 0.0
    result.write_text(json.dumps(r))                   # hand-edited
    with open(zoo / "build/bundles/b/model.py", "a") as f:
        f.write("\n# edited\n")
    rc, ran, out = doit(zoo)
    # each is written again as its task made it (the lock's from build/store/, under its key), so
    # the report, made from the same files, is current as it stands
    assert rc == 0 and ran == {"lock:a", "emit:b"}, out
    assert json.loads(result.read_text())["output"] == json.loads(locked)["output"]   # the lock's own
    assert result.read_text() == locked
    assert "# edited" not in (zoo / "build/bundles/b/model.py").read_text()
    os.utime(zoo / "build/results/a/float64.json", (1, 1))                # touched, same content
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()), out


def test_the_report_refuses_results_that_are_not_current(zoo, monkeypatch):
    rc, _, out = doit(zoo)
    assert rc == 0, out
    import dataclasses
    from emitter.pipeline import digests
    from emitter.pipeline.checks import entries
    from emitter.pipeline.config import discover
    from emitter.pipeline.report import build_rows
    monkeypatch.chdir(zoo)
    a = [e for e in entries(discover(str(zoo))) if e.name == "a"]
    rows = build_rows(a, None, 1)
    assert {(r["check"], r["verdict"], r["current"]) for r in rows} == {("float64", "pass", True),
                                                                        ("float32", "pass", True)}
    other = [dataclasses.replace(a[0], checks=tuple(dataclasses.replace(
        c, spec={**c.spec, "steps": 2, "config": "0" * 64}) for c in a[0].checks))]   # another config
    def row(es, threads=1):
        return {r["check"]: r for r in build_rows(es, None, threads)}["float64"]
    r = row(other)
    assert r["verdict"] == "error" and not r["current"] and "its config, steps differ" in r["reason"]
    r = row(a, 2)                                                           # another thread count
    assert r["verdict"] == "error" and "its threads differs" in r["reason"]
    monkeypatch.setattr(digests, "env", lambda: "0" * 64)                   # another machine's
    r = row(a)
    assert r["verdict"] == "error" and "its environment differs" in r["reason"]
    monkeypatch.undo()
    monkeypatch.chdir(zoo)
    r = json.loads((zoo / "build/results/a/float64.json").read_text())
    del r["key"], r["inputs"]                                               # an older project's
    (zoo / "build/results/a/float64.json").write_text(json.dumps(r))
    r = row(a)
    assert r["verdict"] == "error" and "recorded under no key" in r["reason"]


def test_a_torch_or_numpy_upgrade_reruns_every_lock(zoo, tmp_path):
    rc, _, out = doit(zoo)
    assert rc == 0, out
    upgraded = tmp_path / "site"                        # a torch 9.9.9's metadata first on the path
    (upgraded / "torch-9.9.9.dist-info").mkdir(parents=True)
    rc, ran, out = doit(zoo, env={"PYTHONPATH": str(upgraded)})
    # (the importers compute with torch too: the derived weights are made again, the same bytes)
    assert rc == 0 and ran == {"weights:d", "lock:a", "lock:b", "lock:d", "report"}, out
    r = json.loads((zoo / "build/results/a/float64.json").read_text())
    import torch   # (the version is the one that runs; the stray metadata is named beside its RECORD)
    assert r["environment"]["torch"] == torch.__version__
    assert r["environment"]["records"]["torch"][1] == ["torch-9.9.9.dist-info"], r["environment"]["records"]
    rc, ran, out = doit(zoo, env={"PYTHONPATH": str(upgraded)})
    assert (rc, ran) == (0, set()), out


def test_history_db_versions(tmp_path):
    from emitter.pipeline import results
    old = tmp_path / "old.sqlite"
    con = sqlite3.connect(old)                          # what the first version of the project wrote
    con.executescript(results._SCHEMA)
    con.execute("INSERT INTO runs (at, name, dtype, verdict, result) VALUES ('t', 'p', 'float64', 'pass', '{}')")
    con.commit()
    con.close()
    before = old.read_bytes()                           # a view reads it as it is: nothing brought up
    assert [(r["verdict"], r["worst_ratio"], r["key"]) for r in results.history(str(old), "p")] == [("pass", None, None)]
    assert old.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["old.sqlite"]
    results.record_all(str(old), [{"name": "p", "dtype": "float64", "verdict": "fail",
                                   "worst": {"stage": 3, "op": "matmul", "ratio": 2.5}}])
    rows = results.history(str(old), "p")
    assert [r["verdict"] for r in rows] == ["pass", "fail"] and rows[1]["worst_ratio"] == 2.5
    newer = tmp_path / "newer.sqlite"
    con = sqlite3.connect(newer)
    con.execute("PRAGMA user_version = 99")
    con.close()
    p = run_cli("results", "--db", str(newer))
    assert p.returncode == 2 and "written by a newer version" in p.stderr and "Traceback" not in p.stderr
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    p = run_cli("results", "--db", str(junk))
    assert p.returncode == 2 and "not a history" in p.stderr and "Traceback" not in p.stderr
    other = tmp_path / "other" / "notes.sqlite"         # another program's SQLite file: left as it was
    other.parent.mkdir()
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE notes (body TEXT)")
    con.commit()
    con.close()
    before = other.read_bytes()
    for args in ((), ("p",), ("--json",), ("--history", "p")):
        p = run_cli("results", "--db", str(other), *args)
        assert p.returncode == 2 and "not a lock history" in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert other.read_bytes() == before and os.listdir(other.parent) == ["notes.sqlite"]
    odd = os.path.join(os.fsencode(tmp_path), b"h\xff #?%41.sqlite")   # a name that is no UTF-8, and URI marks
    with open(odd, "wb") as f:
        f.write(old.read_bytes())
    assert [r["verdict"] for r in results.history(os.fsdecode(odd), "p")] == ["pass", "fail"]


def test_locks_that_open_a_new_history_at_once_each_record_their_run(tmp_path):
    """Several locks (Dask workers' results, threads of one driver) make a new results.sqlite at
    the same moment: each appends its run; none is refused with `duplicate column` or `locked`."""
    import threading
    from emitter.pipeline import results
    for trial in range(12):
        db, gate, errors = str(tmp_path / f"h{trial}.sqlite"), threading.Barrier(4), []

        def lock(i):
            gate.wait()
            try:
                results.record_all(db, [{"name": f"p{i}", "dtype": "float32", "verdict": "pass"}])
            except Exception as e:
                errors.append(e)
        threads = [threading.Thread(target=lock, args=(i,)) for i in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert not errors, errors
        assert sorted(r["name"] for r in results.latest(db)) == ["p0", "p1", "p2", "p3"]


def test_an_edited_target_is_rebuilt_even_after_a_run_that_did_not_select_it(zoo):
    """The per-task check runs only for tasks whose files moved since a run last checked them: a
    run that does not select a task leaves it to be checked by the next one."""
    rc, _, out = doit(zoo)
    assert rc == 0, out
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()), out                     # settled: nothing moves, nothing runs
    result = zoo / "build/results/a/float64.json"
    locked = result.read_text()
    result.write_text(locked.replace('"verdict": "pass"', '"verdict": "pass" '))   # hand-edited
    rc, ran, out = doit(zoo, "lock:b")                      # a run that does not look at lock:a
    assert rc == 0 and "lock:a" not in ran, out
    rc, ran, out = doit(zoo)
    assert rc == 0 and "lock:a" in ran, out
    assert json.loads(result.read_text())["output"] == json.loads(locked)["output"]   # the lock's own


def test_the_environment_names_numpys_bundled_blas(tmp_path, monkeypatch):
    """The same numpy version built against another BLAS is another environment: the fingerprint
    names the libraries its wheel carries (numpy.libs/, the OpenBLAS build in the file name), as
    found beside the numpy that import takes, without importing it."""
    import numpy
    from emitter.verify import environment
    beside = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
    real = sorted(os.listdir(beside)) if os.path.isdir(beside) else None
    assert environment.fingerprint()["numpy_libs"] == real
    prints = []
    for blas in ("libopenblas-aaaa.so", "libopenblas-bbbb.so"):
        site = tmp_path / blas
        (site / "numpy").mkdir(parents=True)
        (site / "numpy" / "__init__.py").write_text("")
        (site / "numpy.libs").mkdir()
        (site / "numpy.libs" / blas).write_text("")
        monkeypatch.setattr(sys, "path", [str(site)] + sys.path)
        prints.append(environment.fingerprint())
        monkeypatch.undo()
    assert [p["numpy_libs"] for p in prints] == [["libopenblas-aaaa.so"], ["libopenblas-bbbb.so"]]
    assert environment.digest(prints[0]) != environment.digest(prints[1])
