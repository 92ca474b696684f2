"""Bundles wrong in ways a user's run would show, each judged as the bundle's fault (a fail naming
where, exit 1) and never the lock's (an error, exit 2); and a right bundle on weights whose logits
nearly tie, which passes at every dtype."""

import os
import shutil

import numpy as np
import pytest

from conftest import ROOT, emit_bundle
from emitter import read_file
from emitter.verify.lock import lock_bundle

ROPE = os.path.join(ROOT, "programs", "rope_attention.logos")
ROPE_WEIGHTS = os.path.join(ROOT, "weights", "rope_attention")


@pytest.fixture(scope="module")
def rope(tmp_path_factory):
    return emit_bundle(read_file(ROPE).source, tmp_path_factory.mktemp("rope") / "bundle")


def _changed(bundle, tmp_path, *pairs):
    out = tmp_path / "bundle"
    shutil.copytree(bundle, out)
    text = (out / "model.py").read_text()
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    (out / "model.py").write_text(text)
    return str(out)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_state_rebound_to_another_shape_fails_at_its_write_back(rope, tmp_path, dtype):
    """`self.leaf_Vc = Vc.reshape(-1)` in place of the write-back's copy: the buffer a caller's
    next step reads is no longer the state's; named there, not the lock's own copy failing."""
    bundle = _changed(rope, tmp_path, ("        self.leaf_Vc.copy_(Vc)\n", "        self.leaf_Vc = Vc.reshape(-1)\n"))
    r = lock_bundle(bundle, ROPE, ROPE_WEIGHTS, dtype, 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["stage"], f["out"], f["step"]) == ("write-back", "Vc", 1), r["reason"]
    assert "`leaf_Vc` is of shape (16,), not the state `Vc` (2 by 8)" in r["reason"], r["reason"]


@pytest.mark.parametrize("returned", ["best.to(torch.uint16)", "best.requires_grad_() if self.probe is None else best",
                                      "best.to(torch.int64)"])
def test_a_right_token_of_another_kind_passes(rope, tmp_path, returned):
    """The token as an unsigned or a 64-bit integer, or a tensor that requires grad (a caller
    detaches it): the values are the VM's, and the lock reads them as a caller does."""
    bundle = _changed(rope, tmp_path, ("        return best\n", f"        return {returned}\n"))
    for dtype in ("float64", "float32"):
        r = lock_bundle(bundle, ROPE, ROPE_WEIGHTS, dtype, 2)
        assert r["verdict"] == "pass" and r["output"]["argmax_agree"], r["reason"]


def test_a_forward_raising_an_exception_of_its_own_kind_fails_naming_the_stage(rope, tmp_path):
    """A BaseException of the bundle's own (neither an interrupt nor an exit) is its fault too."""
    bundle = _changed(rope, tmp_path,
                      ("class LogosModule(ProgramModule):", "class Abort(BaseException):\n    pass\n\n\n"
                                                            "class LogosModule(ProgramModule):"),
                      ("        # stage 15: best = argmax\n",
                       "        # stage 15: best = argmax\n        if self.probe is None:\n"
                       "            raise Abort('the fast path')\n"))
    r = lock_bundle(bundle, ROPE, ROPE_WEIGHTS, "float32", 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["stage"], f["out"], f["step"]) == (15, "best", 1), r["reason"]
    assert "Abort: the fast path" in r["reason"] and "in the free pass of step 1" in r["reason"], r["reason"]


EMB = os.path.join(ROOT, "programs", "embedding.logos")


def _tied_weights(folder, gap):
    """embedding's table with the logits of tokens 3 and 2 `gap` apart (3 on top, in float64):
    h = Emb[7] + Emb[0] and Emb[3] = Emb[2] + gap·h/|h|²; every other token far below them."""
    rng = np.random.default_rng(5)
    emb = rng.normal(size=(10, 6)) * 0.1
    h = emb[7] + emb[0]
    emb[2] = 40 * h / (h @ h)
    emb[3] = emb[2] + gap * h / (h @ h)
    os.makedirs(folder)
    emb.astype("<f8").tofile(os.path.join(folder, "Emb.f64"))
    logits = (emb[7] + emb[0]) @ emb.T
    top = np.argsort(logits)[::-1]
    assert top[0] == 3 and top[1] == 2 and logits[3] - logits[2] == pytest.approx(gap, rel=0.01)
    assert logits[2] - logits[top[2]] > 1.0
    return str(folder)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_an_argmax_of_logits_the_dtype_ties_passes_a_far_one_fails(tmp_path, dtype):
    """Two logits 1e-8 apart are one float32 (the module's argmax, first on ties, takes the lower
    token; the VM's the higher): a near-tie within the check's tolerance passes, the stage's
    ratio the margin's share of the bound; the same bundle handed a token the VM ranks far down
    fails."""
    bundle = emit_bundle(read_file(EMB).source, tmp_path / "bundle")
    weights = _tied_weights(tmp_path / "tied", 1e-8)
    r = lock_bundle(bundle, EMB, weights, dtype, 2)
    assert r["verdict"] == "pass", r["reason"] or r["first_divergence"]
    best = next(s for s in r["stages"] if s["out"] == "best")
    assert best["pass"] and best["worst_ratio"] <= 1.0, best
    if dtype == "float32":   # (the flip happened, and was excused)
        assert best["max_abs"] == 1.0, best
    wrong = _changed(bundle, tmp_path / "w", ("torch.argmax(logits)", "(torch.argmax(logits) - 2)"))
    os.makedirs(tmp_path / "w", exist_ok=True)
    r = lock_bundle(wrong, EMB, weights, dtype, 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and f["out"] == "best", f
