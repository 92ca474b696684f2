"""The bfloat16 lock: the precision policy in model.py and the manifest, and the per-op gate on the
tiny Qwen3.5 decode loop: a good bundle passes from several start tokens, and each bug of
tests/bf16_bugs.py (all below bf16's noise, all systematic) is caught and named."""

import json
import math
import os
import shutil

import numpy as np
import pytest

from bf16_bugs import BUGS
from conftest import ROOT, run_cli
from emitter.language.reader import read_file
from emitter.ops.precision import DEFAULT, stage_precisions
from emitter.sambaflow.emit import emit_program, write_bundle
from emitter.verify import bf16
from emitter.verify.lock import lock_bundle

PROGRAM = os.path.join(ROOT, "programs", "qwen38.logos")
CHECKPOINT = os.path.join(ROOT, "checkpoints", "qwen38-tiny")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bf16")
    weights = tmp / "w"
    p = run_cli("import-qwen35", CHECKPOINT, "--program", PROGRAM, "-o", str(weights))
    assert p.returncode == 0, p.stderr
    program = read_file(PROGRAM)
    write_bundle(emit_program(program, {}), str(tmp / "good"))
    return {"tmp": tmp, "weights": weights, "program": program}


def _with_token(qwen, token):
    w = qwen["tmp"] / f"w{token}"
    if not w.exists():
        shutil.copytree(qwen["weights"], w)
        np.array([[float(token)]]).astype("<f8").tofile(w / "Tok.f64")
    return str(w)


def _lock(bundle, weights, steps=2):
    return lock_bundle(str(bundle), PROGRAM, weights, "bfloat16", steps)


def test_model_py_and_the_manifest_state_the_policy(qwen):
    program = qwen["program"]
    text = open(qwen["tmp"] / "good" / "model.py").read()
    table = stage_precisions(program, {})
    assert "PRECISION = {" in text and f"    0: {tuple(table[0])!r}," .replace("'", '"') in text
    manifest = json.loads(open(qwen["tmp"] / "good" / "manifest.json").read())
    by = {o["out"]: o for o in manifest["ops"]}
    assert by["logits"]["bf16"] == ["fp32", "fp32"] and by["hm0"]["bf16"] == list(DEFAULT["plus"])
    assert by["x0"]["bf16"] == ["fp32", "bf16"]
    plain = emit_program(program)
    assert "PRECISION = {}" in plain.model_py and "self.cast(" not in plain.model_py


@pytest.mark.parametrize("token", [3, 57, 107])
def test_a_good_bundle_passes_from_any_token(qwen, token):
    r = _lock(qwen["tmp"] / "good", _with_token(qwen, token))
    assert r["verdict"] == "pass", (r["reason"], r["first_divergence"])
    g = r["bf16"]
    assert g["ops_failing"] == 0 and g["worst_excess"]["excess"] <= 4 and g["min_cosine"]["cosine"] > 0.999


# On this tiny model (hidden 32, activations of unit size) a tenfold norm epsilon moves values by
# 1e-5, and a bf16 softmax by less than the attention output's own rounding: bench/bench_bf16.py
# measures every bug on SmolLM2 and qwen38.
@pytest.mark.parametrize("bug", ["mlp gain 0.4%"])
@pytest.mark.parametrize("token", [3, 57, 107])
def test_each_planted_bug_is_caught_and_named(qwen, bug, token):
    bad = qwen["tmp"] / f"bad-{bug.replace(' ', '_').replace('%', '')}-{token}"
    if not bad.exists():
        shutil.copytree(qwen["tmp"] / "good", bad)
        text = (bad / "model.py").read_text()
        (bad / "model.py").write_text(BUGS[bug](text, 1))
    r = _lock(bad, _with_token(qwen, token))
    assert r["verdict"] == "fail", (bug, r["bf16"])
    assert r["first_divergence"]["stage"] != "load"
    flat = lock_bundle(str(bad), PROGRAM, _with_token(qwen, token), "float32", 2, 1e-2, 2e-2)
    assert flat["verdict"] == "pass", bug    # a flat bf16-level tolerance lets each of them through


def test_the_gate_figures_on_known_values():
    b = bf16.bounds()
    rng = np.random.default_rng(0)
    v = rng.standard_normal(4096)
    floor = v + rng.standard_normal(4096) * 1e-3          # the op's own rounding floor
    good = v + rng.standard_normal(4096) * 1e-3
    j = bf16.judge("matmul", good, v, floor, b)
    assert j["pass"] and 0.8 < j["excess"] < 1.25 and j["z"] < 6
    j = bf16.judge("matmul", v * 1.004 + rng.standard_normal(4096) * 1e-3, v, floor, b)
    assert not j["pass"] and j["z"] > 6 and j["excess"] < 6    # a gain the excess alone would pass
    j = bf16.judge("matmul", v + rng.standard_normal(4096) * 5e-3, v, floor, b)
    assert not j["pass"] and j["excess"] > 4
    assert bf16.judge("transpose", v, v, v, b)["excess"] == 0
    assert math.isinf(bf16.judge("transpose", v + 1e-9, v, v, b)["excess"])
    assert bf16.bounds({"z": 9, "excess": {"matmul": 2}})["excess"]["matmul"] == 2


def test_token_ids_stay_exact_in_bfloat16(tmp_path):
    """bf16 holds integers exactly only up to 256: a token id is held in fp32 (load stage exact)."""
    src = ("Let tok be a 1 by 1 tensor of Int.\nLet emb be a 2000 by 4 tensor of Real.\n"
           "Let x be row tok of emb.\nLet y be silu of x.\n")
    (tmp_path / "p.logos").write_text(src)
    program = read_file(str(tmp_path / "p.logos"))
    w = tmp_path / "w"
    w.mkdir()
    np.array([[1999.0]]).astype("<f8").tofile(w / "tok.f64")
    np.random.default_rng(0).standard_normal((2000, 4)).astype("<f4").tofile(w / "emb.f32")
    write_bundle(emit_program(program, {}), str(tmp_path / "b"))
    r = lock_bundle(str(tmp_path / "b"), str(tmp_path / "p.logos"), str(w), "bfloat16", 1)
    assert r["verdict"] == "pass" and r["load"]["pass"], (r["reason"], r["first_divergence"])
