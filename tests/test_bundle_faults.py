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


MEMO = [("        q = self.tap(0, x @ Wq)\n",
         "        if not hasattr(self, '_memo'):\n            self._memo = (x @ Wq, x @ Wk, x @ Wv)\n"
         "        q = self.tap(0, self._memo[0])\n"),
        ("        k = self.tap(1, x @ Wk)\n", "        k = self.tap(1, self._memo[1])\n"),
        ("        v = self.tap(2, x @ Wv)\n", "        v = self.tap(2, self._memo[2])\n")]
OWN_ROWS = [("        att = self.tap(9, attention(qr, Kc, Vc, 4, 2, 4))\n",
             "        own = getattr(self, '_K', None)\n        own = torch.zeros_like(Kc) if own is None else own\n"
             "        p = int(pos.reshape(-1)[0])\n        mix = torch.cat([own[:p], Kc[p:]], dim=0)\n"
             "        self._K = set_row(own, pos, kr, 'pos')\n"
             "        att = self.tap(9, attention(qr, mix, Vc, 4, 2, 4))\n")]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("change,stage", [(MEMO, (0, "q")), (OWN_ROWS, (9, "att"))])
def test_a_module_that_computes_from_what_it_kept_fails_naming_the_stage(rope, tmp_path, dtype, change, stage):
    """Projections of its input kept from its first call (the input never changes from step to
    step), or a copy of its key cache of its own read for the earlier positions (handed the VM's
    rows each step, it matched the VM): the last step once more, with other inputs, by the
    instance that ran the steps and by a new one from the same weights, differs at that stage."""
    r = lock_bundle(_changed(rope, tmp_path, *change), ROPE, ROPE_WEIGHTS, dtype, 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["step"], f["stage"], f["out"]) == (2, *stage), (r["reason"], f)
    assert "by the instance that ran the steps and by a new one from the same weights" in f["raised"], f
    assert all(d["pass"] for d in r["steps_detail"]) and r["replay"]["pass"], r["steps_detail"]
    assert r["fresh"] == {**r["fresh"], "pass": False, "same": False, "inputs": ["x"]}, r["fresh"]


def test_a_right_bundle_gives_the_same_in_a_new_instance_on_other_inputs(rope):
    for dtype in ("float64", "float32"):
        r = lock_bundle(rope, ROPE, ROPE_WEIGHTS, dtype, 2)
        f = r["fresh"]
        assert r["verdict"] == "pass" and (f["pass"], f["same"], f["inputs"], f["module"]) == (True, True, ["x"], "afresh"), f
        assert f["output"]["worst_ratio"] <= 1.0 and set(f["states"]) == {"pos", "Kc", "Vc"}, f   # (against the VM)
    program = read_file(ROPE)
    from emitter.verify import vm
    from emitter.verify.passes import varied
    leaves = vm.load_leaves(program, ROPE_WEIGHTS).values
    x = varied(program, leaves)["x"]
    assert not np.array_equal(x, leaves["x"]) and sorted(x.reshape(-1)) == sorted(leaves["x"].reshape(-1))


MOE = os.path.join(ROOT, "programs", "moe.logos")


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    from emitter.sambaflow.emit import emit_program, write_bundle
    d = tmp_path_factory.mktemp("moe") / "bundle"
    write_bundle(emit_program(read_file(MOE), {}), str(d))
    return str(d)


@pytest.mark.parametrize("change", [
    ("3, 2, 4, True, 2.5))", "3, 2, 4, True, 2.5 if self.probe is not None else 2.2))"),
    ('        """An operand in its stage\'s compute precision when the module runs in bfloat16.',
     '        if self.probe is None and self.low and x.is_floating_point():\n            return x.to(torch.bfloat16)\n'
     '        """An operand in its stage\'s compute precision when the module runs in bfloat16.'),
])
def test_a_path_of_its_own_when_no_hook_is_set_fails_under_bf16(moe, tmp_path, change):
    """Under bf16 the free pass is judged on its cosine and nmse alone, which a routing scale of
    2.2 for 2.5, or the policy ignored, in the path a user's run takes (no hook set) stays within:
    the same pass with its taps hooked (each value handed back as it came) gives other bits."""
    weights = os.path.join(ROOT, "weights", "moe")
    good = lock_bundle(moe, MOE, weights, "bfloat16", 2)
    assert good["verdict"] == "pass" and good["fresh"]["same"], good["reason"]
    r = lock_bundle(_changed(moe, tmp_path, change), MOE, weights, "bfloat16", 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["step"], f["stage"]) == (1, "output"), (r["reason"], f)
    assert "the same pass with a hook on its taps" in f["raised"] and "computes otherwise when no hook" in f["raised"]
    assert all(s["pass"] for s in r["stages"]), r["stages"]   # (the probe's path is right)


@pytest.mark.parametrize("where", ["LogosModule._K", "globals()['_K']"])
def test_a_module_that_keeps_its_copy_on_its_class_or_module_fails(rope, tmp_path, where):
    """The new instance comes from model.py run afresh: a copy kept on the class, or in the
    module's globals, is not shared with it (two processes, or two instances, of a caller's)."""
    (old, new), = OWN_ROWS
    new = new.replace("getattr(self, '_K', None)", f"{where.replace('globals()', 'globals().get').replace('[', '(').replace(']', ', None)')}"
                      if "globals" in where else "getattr(LogosModule, '_K', None)")
    new = new.replace("self._K = ", f"{where} = ")
    r = lock_bundle(_changed(rope, tmp_path, (old, new)), ROPE, ROPE_WEIGHTS, "float32", 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["step"], f["stage"], f["out"]) == (2, 9, "att"), (r["reason"], f)


def test_an_argmax_in_another_precision_fails_though_its_logits_are_near(tmp_path):
    """The module's argmax is handed the VM's logits: in float32 it can only differ from theirs on
    a tie float32 makes; one that takes its argmax in half precision picks the other of two logits
    0.01 apart (within float32's tolerance) and fails."""
    bundle = emit_bundle(read_file(EMB).source, tmp_path / "bundle")
    weights = _tied_weights(tmp_path / "near", 0.01)
    assert lock_bundle(bundle, EMB, weights, "float32", 2)["verdict"] == "pass"
    half = _changed(bundle, tmp_path / "h", ("torch.argmax(logits)", "torch.argmax(logits.half())"))
    r = lock_bundle(half, EMB, weights, "float32", 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and f["out"] == "best", f


EMB_LOOKUP = '        e = self.tap(0, row_of(Emb, tok, "tok"))\n'


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("new", [
    '        e = self.tap(0, Emb[7:8] + 0 * tok)\n',                       # the lock's token, always
    '        if not hasattr(torch, "_logos_memo"):\n            torch._logos_memo = row_of(Emb, tok, "tok").clone()\n'
    '        e = self.tap(0, torch._logos_memo)\n',                        # kept where both instances see it
    '        if self.probe is None:\n            if not hasattr(self, "_memo"):\n'
    '                self._memo = row_of(Emb, tok, "tok").clone()\n            e = self._memo\n'
    '        else:\n            e = self.tap(0, row_of(Emb, tok, "tok"))\n',   # kept where no hook is set
])
def test_a_forward_right_on_the_locks_input_alone_fails(tmp_path, dtype, new):
    """A forward that ignores its input, or uses what it kept of it (where a new instance would
    share it, or only where no hook is set), is right on the lock's token at every step: run as a
    user runs it on another token, it computes otherwise than the VM on that token."""
    new = new.replace("_logos_memo", f"_logos_memo_{abs(hash(str(tmp_path)))}")   # (torch outlives the test)
    bundle = _changed(emit_bundle(read_file(EMB).source, tmp_path / "good"), tmp_path, (EMB_LOOKUP, new))
    r = lock_bundle(bundle, EMB, os.path.join(ROOT, "weights", "embedding"), dtype, 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["step"], f["stage"], f.get("after")) == (2, "output", "fresh"), f
    assert "gave what the VM gives on the lock's own inputs" in f["raised"], f


def test_a_model_py_that_will_not_run_twice_in_a_process_passes(tmp_path):
    """An import that cannot run again in one process (torch's interop thread count is set once):
    the new instance comes from the same module, and the result says why."""
    bundle = emit_bundle(read_file(EMB).source, tmp_path / "good")
    text = open(os.path.join(bundle, "model.py")).read()
    i = text.index("\nclass ")
    open(os.path.join(bundle, "model.py"), "w").write(text[:i] + "\ntorch.set_num_interop_threads(1)\n" + text[i:])
    r = lock_bundle(bundle, EMB, os.path.join(ROOT, "weights", "embedding"), "float32", 2)
    assert r["verdict"] == "pass" and r["fresh"]["same"], r["reason"]
    assert r["fresh"]["module"].startswith("model.py would not run again in this process"), r["fresh"]


LN = ("Let X be a {r} by {c} tensor of Real.\nLet Lw be a 1 by {c} tensor of Real.\nLet Lb be a 1 by {c} tensor of Real.\n"
      "Let Y be layernorm of X with weight Lw and bias Lb with epsilon 1e-12.\n")


@pytest.mark.parametrize("x", [np.full((1, 6), 0.1), np.full((4096, 16), 3.0),
                               np.array([[1, 1.0000003, 5], [2, 7, 1.0000006]])])
def test_other_inputs_are_no_rows_a_norm_cannot_tell_from_rounding(tmp_path, x):
    """The fresh pass's inputs are none the author chose, so they must be no worse conditioned
    than the author's: a constant row one less is -0.9 six times, whose float32 mean is not exact
    (a layer norm at epsilon 1e-12 made that 0.059 where the VM has 0); a ramp over a whole large
    input left each row's values an ulp apart; rolling the whole input by one place made a row of
    1.0000006, 1, 1.0000003. Each row's values rolled within it, or a ramp across each row: the
    module passes, judged within the tolerance."""
    r_, c_ = x.shape
    (tmp_path / "ln.logos").write_text(LN.format(r=r_, c=c_))
    os.makedirs(tmp_path / "w")
    for name, value in (("X", x), ("Lw", np.ones((1, c_))), ("Lb", np.zeros((1, c_)))):
        value.astype("<f8").tofile(tmp_path / "w" / f"{name}.f64")
    bundle = emit_bundle((tmp_path / "ln.logos").read_text(), tmp_path / "b")
    r = lock_bundle(bundle, str(tmp_path / "ln.logos"), str(tmp_path / "w"), "float32", 1)
    f = r["fresh"]
    assert r["verdict"] == "pass" and f["inputs"] == ["X"] and f["output"]["pass"], (f, r["reason"])
    assert f["output"]["worst_ratio"] < 1, f


ILL = {   # programs whose other inputs (or states) the dtype rounds badly: (program, weights, dtype)
    "a cancelling sum": ("Let x be a 1 by 4 tensor of Real.\nLet B be a 1 by 4 tensor of Real.\nLet y be x plus B.\n",
                         {"x": [[1e6, 2e6, 3e6, 4e6]], "B": [[-4e6 + 0.3, -1e6 + 0.1, -2e6 + 0.2, -3e6 + 0.4]]},
                         "float32"),
    "a norm over a row of 1e6": (LN.format(r=1, c=8).replace("1e-12", "1e-5"),
                                 {"X": [[1e6] * 8], "Lw": [np.linspace(0.5, 1.5, 8)], "Lb": [np.linspace(-0.1, 0.1, 8)]},
                                 "float32"),
    "a cancelling sum in bfloat16": ("Let x be a 1 by 4 tensor of Real.\nLet B be a 1 by 4 tensor of Real.\n"
                                     "Let y be x plus B.\n",
                                     {"x": [[1, 2, 3, 4]], "B": [[-4 + 0.03, -1 + 0.01, -2 + 0.02, -3 + 0.04]]},
                                     "bfloat16"),
    "a counter that scales logits": ("Let x be a 1 by 8 tensor of Real.\nLet c be a 1 by 1 tensor of Int.\n"
                                     "Let one be a 1 by 1 tensor of Int.\nSet item 1 of one to 1.\n"
                                     "Let cn be c plus one.\nSet row 0 of c to cn.\nLet s be x hadamard c.\n"
                                     "Let y be softmax of s.\n",
                                     {"x": [[1, 0.996, 0.992, 0.988, 0.3, -0.2, 0.5, 0.1]]}, "bfloat16"),
}


@pytest.mark.parametrize("case", sorted(ILL))
def test_other_values_the_dtype_rounds_badly_are_no_finding(tmp_path, case):
    """The fresh pass's values are none the author chose: where they make the program
    ill-conditioned (a cancelling sum, a norm over values an ulp apart), the module's value off
    the VM's by no more than rounding what the VM is given to the dtype moves the VM's own (four
    times over) is the dtype's rounding, and passes; a counter that scales a value keeps its size
    (v + 1, not 257)."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    source, weights, dtype = ILL[case]
    (tmp_path / "p.logos").write_text(source)
    os.makedirs(tmp_path / "w")
    for name, value in weights.items():
        np.asarray(value, np.float64).astype("<f8").tofile(tmp_path / "w" / f"{name}.f64")
    write_bundle(emit_program(read_file(str(tmp_path / "p.logos")), {} if dtype == "bfloat16" else None),
                 str(tmp_path / "b"))
    r = lock_bundle(str(tmp_path / "b"), str(tmp_path / "p.logos"), str(tmp_path / "w"), dtype, 1)
    assert r["verdict"] == "pass" and r["fresh"]["pass"], (r["fresh"], r["reason"])


def test_a_branch_within_what_bfloat16_rounding_moves_four_times_over_fails(tmp_path):
    """delta at step 1 under bfloat16 is ill-conditioned on the fresh pass's inputs (its memory is
    zero): rounding the VM's inputs to bfloat16 moves its output by up to 0.06, and four times
    that let an output 0.2 off (a branch on the input's values) pass. Once over, it fails; the
    right bundle passes (its error there is 0.026)."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    program, weights = os.path.join(ROOT, "programs", "delta.logos"), os.path.join(ROOT, "weights", "delta")
    good = str(tmp_path / "good")
    write_bundle(emit_program(read_file(program), {}), good)
    assert lock_bundle(good, program, weights, "bfloat16", 1)["verdict"] == "pass"
    bad = _changed(good, tmp_path, ("        return Y\n", "        return Y + (1.0 if bool(x[0, 0] < x[0, 1]) else 0.0) * "
                                    "torch.tensor([[0, 0, 0, 0.2, 0, 0, 0.25, 0]], dtype=Y.dtype)\n"))
    r = lock_bundle(bad, program, weights, "bfloat16", 1)
    assert r["verdict"] == "fail" and (r["first_divergence"] or {}).get("after") == "fresh", r["reason"]


COUNTER = """Let x be a 1 by 2 tensor of Real.
Let n be a 1 by 1 tensor of Int.
Set item 1 of n to 16777116.
Let one be a 1 by 1 tensor of Int.
Set item 1 of one to 1.
Let m be n plus one.
Set row 0 of n to m.
Let y be x hadamard m.
"""


def test_an_int_state_takes_no_value_its_buffer_cannot_hold(tmp_path):
    """A counter at 16777116: v + 257 is past 2^24, which float32 cannot hold (the lock refuses
    such values as the program's, and must not choose one itself): the fresh pass takes 257,
    and the right bundle passes at float32 as at float64."""
    (tmp_path / "c.logos").write_text(COUNTER)
    os.makedirs(tmp_path / "w")
    np.array([[0.5, 0.25]]).astype("<f8").tofile(tmp_path / "w" / "x.f64")
    bundle = emit_bundle(COUNTER, tmp_path / "b")
    for dtype in ("float64", "float32"):
        r = lock_bundle(bundle, str(tmp_path / "c.logos"), str(tmp_path / "w"), dtype, 1)
        assert r["verdict"] == "pass" and r["fresh"]["varied_states"] == ["n"], (dtype, r["fresh"], r["reason"])


MLP_BRANCHES = [" * (2.0 if bool(X[0, 2] < X[0, 3]) else 1.0)",   # a branch on the input's values
                " + (0.3 if bool(X[0, 1] > X[0, 2]) else 0.0)"]   # a shift on them


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("branch", MLP_BRANCHES)
def test_a_forward_right_on_the_locks_inputs_alone_fails(tmp_path, dtype, branch):
    """A forward whose value moves with its input, but not as the program's does (a branch on the
    input's values that the lock's own input does not take): on the fresh pass's other inputs it is
    off the VM's there (far outside the tolerance; under bfloat16, below its cosine bound), and
    fails at its output, named."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    program = os.path.join(ROOT, "programs", "mlp.logos")
    good = str(tmp_path / "good")
    write_bundle(emit_program(read_file(program), {} if dtype == "bfloat16" else None), good)
    weights = os.path.join(ROOT, "weights", "mlp")
    assert lock_bundle(good, program, weights, dtype, 1)["verdict"] == "pass"
    bias = "self.cast(1, b1)" if dtype == "bfloat16" else "b1"
    line = f"        hb = self.tap(1, {'self.cast(1, hm)' if dtype == 'bfloat16' else 'hm'} + {bias})\n"
    bundle = _changed(good, tmp_path, (line, line.replace(f"{bias})\n", f"{bias}{branch})\n")))
    r = lock_bundle(bundle, program, weights, dtype, 1)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["stage"], f.get("after")) == ("output", "fresh"), (f, r["reason"])
    assert "computes otherwise than the VM on these values" in f["raised"], f
    assert not r["fresh"]["output"]["pass"], r["fresh"]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("write,steps", [("prev.mul_(2)", 2), ("prev.data.mul_(2)", 2), ("prev.copy_(x)", 2),
                                         ("prev.copy_(x)", 1)])
def test_a_forward_that_writes_into_an_earlier_calls_argument_fails(tmp_path, dtype, write, steps):
    """A caller keeps the input it handed step 1; a forward that writes into it on a later call
    (in place, behind torch's back, or the new input copied over it, which only other inputs
    show: the fresh pass's) changes it: a fail naming the argument and the pass that was handed
    it, though every value the module computed passes."""
    program = os.path.join(ROOT, "programs", "rope_attention.logos")
    good = emit_bundle(read_file(program).source, tmp_path / "good")
    weights = os.path.join(ROOT, "weights", "rope_attention")
    first = "        x = self.leaf_x if x is None else x\n"
    bundle = _changed(good, tmp_path, (first, first + "        prev = self.__dict__.get('_prev')\n"
                                       "        if prev is not None and prev is not x:\n"
                                       f"            {write}\n        self.__dict__['_prev'] = x\n"))
    r = lock_bundle(bundle, program, weights, dtype, steps)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"]), (f, r["reason"])
    assert (f["stage"], f["out"]) == ("argument", "x") and "handed to the free pass of step 1" in f["raised"], f
    assert "a caller's earlier inputs change" in f["raised"], f


MAIN_EDITS = {   # model.py's main, what it reads, or the block that runs it, edited: (old, new, passes)
    "a dtype of its own": ("    dtype = getattr(torch, args.dtype)\n", "    dtype = torch.float32\n", False),
    "float32 for float64 alone": ("    dtype = getattr(torch, args.dtype)\n", "    dtype = getattr(torch, args.dtype)\n"
                                  "    if args.dtype == 'float64':\n        dtype = torch.float32\n", False),
    "an output it changes": ("                out = model()\n", "                out = model().clamp(min=0)\n", False),
    "a step less": ("            for _ in range(args.steps):\n", "            for _ in range(args.steps - 1 or 1):\n", False),
    "another default": ('default=1, help="run forward', 'default=3, help="run forward', False),
    "a module it reads": ("\n\ndef main(", "\n\nargparse = __import__('types').SimpleNamespace(ArgumentParser=None)"
                          "\n\n\ndef main(", False),
    "the block that runs it": ('if __name__ == "__main__":\n    main()\n',
                               'if __name__ == "__main__":\n    LogosModule = None\n    main()\n', False),
    "a second block": ("\n\ndef main(", '\n\nif __name__ == "__" "main__":\n    LogosModule = None\n\n\ndef main(', False),
    "a line it prints": ("                out = model()\n",
                         "                out = model()\n                print('a step', file=__import__('sys').stderr)\n",
                         True),
    "windows line ends": ("\n", "\r\n", None),
    "no newline at the end": ("    main()\n", "    main()", None),
    "a comment on its call": ("    main()\n", "    main()  # run the program\n\n", None),
    "code after it": ("    main()\n", "    main()\n\ntorch.set_num_threads(1)\n", None),
}


@pytest.mark.parametrize("edit", sorted(MAIN_EDITS))
def test_what_python_model_py_runs_is_what_the_lock_ran(tmp_path, edit):
    """`python model.py --weights DIR` runs main: where it (or a global it reads) is not the
    emitter's, the lock runs it beside the emitter's main on the same module (its defaults, then
    float64 and float32 at the check's steps) and their outputs must be the same bits; an edited
    `__main__` block (what runs as a program) fails as it is. The emitter's own main, however the
    file's lines end, is not run again (passes: None), and the result has no `main`."""
    program = os.path.join(ROOT, "programs", "delta.logos")
    weights = os.path.join(ROOT, "weights", "delta")
    good = emit_bundle(read_file(program).source, tmp_path / "good")
    r = lock_bundle(good, program, weights, "float64", 2)
    assert r["verdict"] == "pass" and "main" not in r, r.get("main")
    old, new, passes = MAIN_EDITS[edit]
    out = tmp_path / "bundle"
    shutil.copytree(good, out)
    text = (out / "model.py").read_text()
    assert old in text, old
    (out / "model.py").write_bytes((text.replace(old, new) if old == "\n" else text.replace(old, new, 1)).encode())
    r = lock_bundle(str(out), program, weights, "float64", 2)
    if passes is None:
        assert r["verdict"] == "pass" and "main" not in r, (r.get("main"), r["reason"])
        return
    assert r["main"]["pass"] is passes and r["verdict"] == ("pass" if passes else "fail"), (r["main"], r["reason"])
    if not passes:
        f = r["first_divergence"]
        assert (f["stage"], f["after"]) == ("main", "main") and all(s["pass"] for s in r["stages"]), f
        assert ("block that runs as `python model.py`" if "block" in edit else "is not the emitter's, and") \
            in f["raised"], f


TOKEN = """Let Emb be a 300 by 4 tensor of Real.
Let tok be a 1 by 1 tensor of Int.
Set item 1 of tok to 3.
Let x be row tok of Emb.
Let EmbT be transpose of Emb.
Let logits be x matmul EmbT.
Let nxt be argmax of logits.
Set row 0 of tok to nxt.
"""


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_token_rounded_on_its_way_to_a_row_index_fails_though_the_locks_tokens_are_exact(tmp_path, dtype):
    """A module that rounds its token state through bfloat16 before the lookup is right on every
    token under 257 (those bfloat16 holds): the lock's own steps reach 3 and 176 alone. The fresh
    pass gives its Int states other values (an odd one past 256 where the table has the row: 257
    here), and the module is off the VM's there: a fail at the output, naming the state."""
    (tmp_path / "tk.logos").write_text(TOKEN)
    os.makedirs(tmp_path / "w")
    np.random.default_rng(1).standard_normal((300, 4)).astype("<f8").tofile(tmp_path / "w" / "Emb.f64")
    program, weights = str(tmp_path / "tk.logos"), str(tmp_path / "w")
    good = emit_bundle(TOKEN, tmp_path / "good")
    r = lock_bundle(good, program, weights, dtype, 2)
    assert r["verdict"] == "pass" and r["fresh"]["varied_states"] == ["tok"] and r["fresh"]["output"]["pass"], r["fresh"]
    bad = _changed(good, tmp_path, ('row_of(Emb, tok, "tok")', 'row_of(Emb, tok.to(torch.bfloat16).to(tok.dtype), "tok")'))
    r = lock_bundle(bad, program, weights, dtype, 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"]), (f, r["reason"])
    assert (f["stage"], f["after"]) == ("output", "fresh") and "other values of tok" in f["raised"], f


def test_under_bf16_a_state_written_before_the_choice_is_judged_on_other_tokens(tmp_path):
    """Under bfloat16 the fresh pass cannot judge a token (a near-tie of inputs nobody chose may flip
    it, and it has no probe to tell), so what the argmax feeds fails there only where it did not
    move. A cache the step writes before its argmax is not fed by it: it is judged as any value. A
    module rounding its token through bfloat16 on the way to its row reads another row at 257 and
    more, and fails at that cache, named; the same module right on it passes."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    text = TOKEN.replace("Let x be row tok of Emb.\n", "Let x be row tok of Emb.\nLet C be a 1 by 4 tensor of Real.\n"
                         "Set row 0 of C to x.\n")
    (tmp_path / "tk.logos").write_text(text)
    os.makedirs(tmp_path / "w")
    np.random.default_rng(1).standard_normal((300, 4)).astype("<f8").tofile(tmp_path / "w" / "Emb.f64")
    program, weights = str(tmp_path / "tk.logos"), str(tmp_path / "w")
    good = str(tmp_path / "good")
    write_bundle(emit_program(read_file(program), {}), good)
    r = lock_bundle(good, program, weights, "bfloat16", 2)
    assert r["verdict"] == "pass" and r["fresh"]["varied_states"] == ["C", "tok"], (r["fresh"], r["reason"])
    bad = _changed(good, tmp_path, (', tok, "tok")', ', tok.to(torch.bfloat16).to(tok.dtype), "tok")'))
    r = lock_bundle(bad, program, weights, "bfloat16", 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"]), (f, r["reason"])
    assert (f["stage"], f["out"], f["after"]) == ("write-back", "C", "fresh") and "other values of tok" in f["raised"], f
    assert r["fresh"]["output"]["pass"] and not r["fresh"]["states"]["C"]["pass"], r["fresh"]


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_a_forward_wrong_only_as_model_py_main_calls_it_fails(tmp_path, dtype):
    """model.py's main and compile.py call `model()`: no arguments, the inputs in their buffers, no
    hook, autograd off, which no step's pass does (the free pass hands arguments, the probe sets a
    hook). A forward wrong only so fails at the pass that calls it so, after the steps, at step 1."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    program = os.path.join(ROOT, "programs", "mlp.logos")
    good = str(tmp_path / "good")
    write_bundle(emit_program(read_file(program), {} if dtype == "bfloat16" else None), good)
    weights = os.path.join(ROOT, "weights", "mlp")
    r = lock_bundle(good, program, weights, dtype, 1)
    assert r["verdict"] == "pass" and r["as_main"]["pass"], (r["reason"], r.get("as_main"))
    line = "        X = self.leaf_X if X is None else X\n"
    bad = _changed(good, tmp_path, (line, "        X = (self.leaf_X * 1.5 if self.probe is None else self.leaf_X) "
                                          "if X is None else X\n"))
    r = lock_bundle(bad, program, weights, dtype, 1)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"]), (f, r["reason"])
    assert (f["stage"], f["after"], f["step"]) == ("output", "as_main", 1) and "model.py's main" in f["raised"], f


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_conv_that_drops_its_oldest_tap_fails_at_the_zoos_own_steps(tmp_path, dtype):
    """delta's ring has 3 taps and starts at zero: over its 2 steps its oldest row is always 0, so
    a conv that drops that tap matched every step. The fresh pass hands the module its Real states
    rolled with a ramp added (rows no step wrote hold values too): it fails there, named at the
    conv's state."""
    program = os.path.join(ROOT, "programs", "delta.logos")
    weights = os.path.join(ROOT, "weights", "delta")
    good = emit_bundle(read_file(program).source, tmp_path / "good")
    r = lock_bundle(good, program, weights, dtype, 2)
    assert r["verdict"] == "pass" and r["fresh"]["varied_states"], (r["reason"], r["fresh"])
    bad = _changed(good, tmp_path, ("    return (ring * wc).sum(dim=0, keepdim=True), ring\n",
                                    "    return (ring[1:] * wc[1:]).sum(dim=0, keepdim=True), ring\n"))
    r = lock_bundle(bad, program, weights, dtype, 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and f["after"] == "fresh", (f, r["reason"])
    assert all(d["pass"] for d in r["steps_detail"]), r["steps_detail"]   # (every step of its own matched)


TABLE = """Let x be a 1 by 3 tensor of Real.
Let pos be a 1 by 1 tensor of Int.
Let one be a 1 by 1 tensor of Int.
Set item 1 of one to 1.
Let T be a 4 by 3 tensor of Real.
Let W be a 3 by 2 tensor of Real.
Set row pos of T to x.
Let pn be pos plus one.
Set row 0 of pos to pn.
Let y be T matmul W.
"""


def test_a_table_written_at_an_int_position_keeps_its_other_values_in_the_fresh_pass(tmp_path):
    """Where the VM refuses the fresh pass's first position (past the table) at the `Set row` that
    writes the table, the position takes its next try and the table keeps its rolled rows (it was
    dropped with the position, so a set_row that zeroes the table's other rows passed)."""
    (tmp_path / "t.logos").write_text(TABLE)
    os.makedirs(tmp_path / "w")
    rng = np.random.default_rng(2)
    rng.standard_normal((1, 3)).tofile(tmp_path / "w" / "x.f64")
    rng.standard_normal((3, 2)).tofile(tmp_path / "w" / "W.f64")
    program, weights = str(tmp_path / "t.logos"), str(tmp_path / "w")
    good = emit_bundle(TABLE, tmp_path / "good")
    r = lock_bundle(good, program, weights, "float64", 1)
    assert r["verdict"] == "pass" and r["fresh"]["varied_states"] == ["T", "pos"], (r["reason"], r["fresh"])
    bad = _changed(good, tmp_path, ("    return table.index_copy(0, index, row.reshape(1, -1))\n",
                                    "    return torch.zeros_like(table).index_copy(0, index, row.reshape(1, -1))\n"))
    r = lock_bundle(bad, program, weights, "float64", 1)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and f["after"] == "fresh", (f, r["reason"])


def test_a_forward_that_raises_only_as_model_py_main_calls_it_is_named_after_the_steps(tmp_path):
    """A raise in a pass after the steps is that pass's: the first divergence says `after`."""
    program = os.path.join(ROOT, "programs", "mlp.logos")
    good = emit_bundle(read_file(program).source, tmp_path / "good")
    line = "        X = self.leaf_X if X is None else X\n"
    bad = _changed(good, tmp_path, (line, "        if X is None and self.probe is None and not torch.is_grad_enabled():\n"
                                          "            raise RuntimeError('boom')\n" + line))
    r = lock_bundle(bad, program, os.path.join(ROOT, "weights", "mlp"), "float64", 1)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["after"], f["step"]) == ("as_main", 1) and "boom" in r["reason"], (f, r["reason"])


def test_a_forward_whose_parameters_are_in_another_order_fails(tmp_path):
    """compile.py hands SambaFlow's tracer the inputs as a list in INPUTS order: the free passes
    pass them so, by position, and a forward whose parameters are swapped computes on the wrong
    ones (by name it was right)."""
    program = os.path.join(ROOT, "programs", "norms.logos")
    good = emit_bundle(read_file(program).source, tmp_path / "good")
    weights = os.path.join(ROOT, "weights", "norms")
    assert lock_bundle(good, program, weights, "float64", 1)["verdict"] == "pass"
    bad = _changed(good, tmp_path, ("    def forward(self, X=None, R=None):\n", "    def forward(self, R=None, X=None):\n"))
    r = lock_bundle(bad, program, weights, "float64", 1)
    assert r["verdict"] == "fail", (r["reason"], r["first_divergence"])
