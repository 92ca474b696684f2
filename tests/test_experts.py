"""Routed experts: the small program against plain loops, both routers against transformers' own MoE
layers in float64 (DeepSeek-V3's `DeepseekV3MoE`, Qwen3-Next's `Qwen3NextSparseMoeBlock`), ties,
shape refusals, and the emitted module against the VM through the lock at every dtype."""

import os

import numpy as np
import pytest
import torch

import reference as ref
from conftest import ROOT, emit_bundle, load_model
from emitter import ProgramError, read_file, read_program
from emitter.verify import vm
from emitter.verify.lock import lock_bundle

SMALL = os.path.join(ROOT, "programs", "moe.logos")
WEIGHTS = os.path.join(ROOT, "weights", "moe")


def _small():
    program = read_file(SMALL)
    values = vm.load_leaves(program, WEIGHTS).values
    return program, {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}


def test_the_small_program_against_plain_loops():
    program, w = _small()
    x = w["X"]
    r1 = ref.softmax_routing(x @ w["Wr"], 2, True)
    shared = ref.swiglu(x @ w["Sg"], x @ w["Su"]) @ w["Sd"]
    y = x + ref.experts(x, r1, w["G"], w["U"], w["D"]) + shared * ref.sigmoid(x @ w["Ws"])
    r2 = ref.sigmoid_routing(y @ w["Wr2"], w["Bias"], 3, 2, 4, True, 2.5)
    z = y + ref.experts(y, r2, w["G"], w["U"], w["D"])
    trace = vm.run(program, w, keep_stages=True)[0]
    np.testing.assert_allclose(trace.output, z, rtol=1e-12, atol=1e-12)
    # the program's weights exercise what the routers do: the bias and the groups change choices
    unbiased = ref.sigmoid_routing(y @ w["Wr2"], None, 3, 2, 4, True, 2.5) != 0
    ungrouped = ref.sigmoid_routing(y @ w["Wr2"], w["Bias"], 3, 4, 4, True, 2.5) != 0
    assert (unbiased != (r2 != 0)).any() and (ungrouped != (r2 != 0)).any()
    assert ((r1 != 0).sum(axis=1) == 2).all() and ((r2 != 0).sum(axis=1) == 3).all()


# ── ties: the lower expert index, in the VM and the module alike ─────────────────────────────────

TIE_LOGITS = np.array([[0.0, 3.0, 3.0, 3.0, 1.0, 1.0],    # a three-way tie for the top
                       [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]])   # every expert (and group) ties


@pytest.mark.parametrize("sentence, chosen", [
    # softmax: experts 1 and 2 of the three at 3; all equal: 0 and 1
    ("Let y be softmax routing of l choosing 2.", [[1, 2], [0, 1]]),
    # groups of 2 score 0.5 + s(3), 2 s(3), 2 s(1): groups 1 and 2, then 2 and 3 (tied at s(3));
    # all equal: groups 0 and 1, experts 0 and 1
    ("Let y be sigmoid routing of l with bias b choosing 2 in 2 of 3 groups.", [[2, 3], [0, 1]]),
])
def test_ties_go_to_the_lower_index_in_vm_and_module(sentence, chosen, tmp_path):
    text = "Let l be a 2 by 6 tensor of Real.\nLet b be a 1 by 6 tensor of Real.\n" + sentence + "\n"
    values = {"l": TIE_LOGITS, "b": np.zeros((1, 6))}
    want = vm.run(read_program(text), values)[0].output
    module = load_model(emit_bundle(text, tmp_path)).LogosModule(
        {k: torch.from_numpy(v) for k, v in values.items()}, torch.float64)
    with torch.no_grad():
        got = module().numpy()
    assert [list(np.flatnonzero(row)) for row in want] == chosen
    np.testing.assert_array_equal(got != 0, want != 0)
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("sentence, message", [
    ("Let y be softmax routing of l choosing 7.", "cannot choose 7 of the 6 experts `l` scores"),
    ("Let y be sigmoid routing of l choosing 2 in 1 of 4 groups.", "4 groups do not divide the 6"),
    ("Let y be sigmoid routing of l choosing 2 in 1 of 6 groups.", "a group's score is its two best"),
    ("Let y be sigmoid routing of l choosing 5 in 1 of 3 groups.", "cannot choose 5 experts within 1"),
    ("Let y be sigmoid routing of l with bias w choosing 2.", "the bias `w` is 6 by 12, must be 1 by 6"),
    ("Let y be experts of x weighted by l with gate w up w down d.", "`w` is 6 by 12, must be 4 by 6·F"),
    ("Let y be experts of x weighted by r with gate g up g down g.", "`g` is 4 by 12, must be 12 by 4"),
])
def test_shape_refusals_name_the_line_and_the_rule(sentence, message):
    decls = ("Let l be a 2 by 6 tensor of Real.\nLet w be a 6 by 12 tensor of Real.\n"
             "Let x be a 2 by 4 tensor of Real.\nLet d be a 12 by 4 tensor of Real.\n"
             "Let r be a 2 by 3 tensor of Real.\nLet g be a 4 by 12 tensor of Real.\n")
    with pytest.raises(ProgramError) as e:
        read_program(decls + sentence + "\n")
    assert e.value.line == 7 and message in e.value.message, e.value.message


def test_a_malformed_routing_sentence_quotes_both_forms_that_start_alike():
    with pytest.raises(ProgramError) as e:
        read_program("Let l be a 2 by 6 tensor of Real.\nLet y be softmax routing of l.\n")
    assert "`Let OUT be softmax of X.` or `Let OUT be softmax routing of L choosing K " \
           "[renormalised].`" in e.value.message


# ── the emitted module against the VM through the lock ───────────────────────────────────────────

@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_the_lock_holds_the_module_to_the_vm(dtype, tmp_path):
    from emitter.sambaflow.emit import emit_program, write_bundle
    write_bundle(emit_program(read_file(SMALL), {}), str(tmp_path / "b"))
    r = lock_bundle(str(tmp_path / "b"), SMALL, WEIGHTS, dtype, 1)
    assert r["verdict"] == "pass", r["reason"]
    ops = {s["op"] for s in r["stages"]}
    assert {"softmax routing", "sigmoid routing", "experts"} <= ops
    if dtype == "float64":
        assert r["output"]["max_abs"] < 1e-13


OVERFLOWING = """Let x be a 1 by 2 tensor of Real.
Set item 1 of x to 1e20.
Let lg be a 1 by 2 tensor of Real.
Set item 1 of lg to 5.
Let wg be a 2 by 2 tensor of Real.
Set item 1 of wg to 1e-20.
Set item 2 of wg to 1e20.
Let wu be a 2 by 2 tensor of Real.
Set item 1 of wu to 1e-20.
Set item 2 of wu to 1e20.
Let wd be a 2 by 2 tensor of Real.
Set item 1 of wd to 1.
Set item 4 of wd to 1.
Let r be softmax routing of lg choosing 1.
Let e be experts of x weighted by r with gate wg up wu down wd.
"""


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_an_expert_not_chosen_adds_nothing_though_its_activation_overflows(dtype, tmp_path):
    """Expert 2 (not chosen) overflows in float32 (1e40): inf × its routing weight 0 was NaN in the
    module's dense form, where the VM, which never runs it, gives [0.726, 0]."""
    (tmp_path / "x.logos").write_text(OVERFLOWING)
    program = read_file(str(tmp_path / "x.logos"))
    out = vm.run(program, vm.load_leaves(program, None).values)[-1].output
    assert np.all(np.isfinite(out)) and out[0, 1] == 0
    r = lock_bundle(emit_bundle(OVERFLOWING, tmp_path / "b"), str(tmp_path / "x.logos"), None, dtype, 1)
    assert r["verdict"] == "pass", (r["reason"], r["first_divergence"])


def test_the_lock_catches_an_expert_reading_its_neighbours_weights(tmp_path):
    from emitter.sambaflow.emit import emit_program, write_bundle
    write_bundle(emit_program(read_file(SMALL), {}), str(tmp_path / "b"))
    model = tmp_path / "b" / "model.py"
    text = model.read_text()
    old = "    w = r.repeat_interleave(wg.shape[1] // n, dim=1)"
    assert text.count(old) == 1
    model.write_text(text.replace(old, old.replace("r.repeat", "r.roll(1, dims=1).repeat")))
    r = lock_bundle(str(tmp_path / "b"), SMALL, WEIGHTS, "float64", 1)
    assert r["verdict"] == "fail"
    assert r["first_divergence"]["op"] == "experts" and r["first_divergence"]["out"] == "routed1"


# ── bfloat16: a routing flip inside the router's noise is excused, a wrong router is not ──────────

FLIP = """Let x be a 6 by 8 tensor of Real.
Let l be a 6 by 8 tensor of Real.
Let G be a 8 by 24 tensor of Real.
Let U be a 8 by 24 tensor of Real.
Let D be a 24 by 8 tensor of Real.
Let r be softmax routing of l choosing 2 renormalised.
Let m be experts of x weighted by r with gate G up U down D.
Let y be x plus m.
"""


def _flip_case(tmp_path):
    """Logits where tokens 1 and 4 have their 2nd and 3rd experts 1e-4 apart (bf16 holds both as
    one value: the module ties them and takes the lower index, the VM the larger), the rest well
    apart; the experts small beside the residual, so the free pass's output holds its cosine."""
    from conftest import write_weights  # noqa: F401  (the weights are written here by hand)
    rng = np.random.default_rng(5)
    l = rng.uniform(-1.0, 1.0, (6, 4)).repeat(2, axis=1) + np.arange(8) * 0.37
    l[:, 7] = l[:, 7] + 2.0   # expert 7 first everywhere
    for t, (lo, hi) in ((1, (2, 5)), (4, (3, 6))):
        l[t, lo] = 2.3                  # second and third: 2.3 and 2.3001
        l[t, hi] = 2.3001
    values = {"x": rng.standard_normal((6, 8)), "l": l, "G": 0.1 * rng.standard_normal((8, 24)),
              "U": 0.1 * rng.standard_normal((8, 24)), "D": 0.1 * rng.standard_normal((24, 8))}
    weights = tmp_path / "w"
    weights.mkdir()
    for name, v in values.items():
        v.astype("<f8").tofile(weights / f"{name}.f64")
    program = tmp_path / "flip.logos"
    program.write_text(FLIP)
    from emitter.sambaflow.emit import emit_program, write_bundle
    write_bundle(emit_program(read_file(str(program)), {}), str(tmp_path / "b"))
    return str(program), str(weights), tmp_path / "b"


def test_a_bf16_routing_flip_inside_the_noise_is_excused(tmp_path):
    program, weights, bundle = _flip_case(tmp_path)
    r = lock_bundle(str(bundle), program, weights, "bfloat16", 1)
    assert r["verdict"] == "pass", r["reason"]
    g = r["bf16"]
    assert (g["routing_flips"], g["routing_excused"], g["routing_failed"]) == (2, 2, None)
    from emitter.verify.verdict import describe
    assert "2 routing flip(s) excused" in describe(r, 1000)


def test_a_router_one_expert_short_fails_naming_the_token_and_both_sets(tmp_path):
    program, weights, bundle = _flip_case(tmp_path)
    model = bundle / "model.py"
    text = model.read_text()
    old = "    w = p * top_mask(p, k)\n"
    assert text.count(old) == 1
    model.write_text(text.replace(old, "    w = p * top_mask(p, k - 1)\n"))
    r = lock_bundle(str(bundle), program, weights, "bfloat16", 1)
    assert r["verdict"] == "fail"
    f = r["bf16"]["routing_failed"]
    assert (f["op"], f["out"], f["step"], f["token"], f["excused"]) == ("softmax routing", "r", 1, 0, False)
    assert len(f["vm"]) == 2 and len(f["module"]) == 1 and f["module"][0] in f["vm"]
    from emitter.verify.verdict import describe
    assert describe(r, 1000).startswith(
        f"routing: stage 0 `r = softmax routing` (line 6, step 1) token 0: the VM chose experts "
        f"{f['vm']}, the module {f['module']}")


def test_a_flip_to_an_expert_far_from_the_tie_is_not_excused(tmp_path):
    """Where the VM's K-th and (K+1)-th are near-tied, a router that then takes its worst expert
    instead of either chooses as many experts and the VM's margin is inside the noise, but no
    rounding of the scores makes that choice: the flip fails, naming the token."""
    program, weights, bundle = _flip_case(tmp_path)
    model = bundle / "model.py"
    text = model.read_text()
    old = "    w = p * top_mask(p, k)\n"
    assert text.count(old) == 1
    model.write_text(text.replace(old, old + (
        "    top = p.sort(dim=1, descending=True).values\n"
        "    for t in range(p.shape[0]):\n"
        "        if top[t, k - 1] - top[t, k] < 1e-3:   # near-tied: swap the k-th for the worst\n"
        "            kth = int((p[t] * (w[t] > 0)).masked_fill(w[t] == 0, 2.0).argmin())\n"
        "            w[t, kth] = 0\n"
        "            w[t, int(p[t].argmin())] = p[t].min()\n")))
    r = lock_bundle(str(bundle), program, weights, "bfloat16", 1)
    assert r["verdict"] == "fail"
    f = r["bf16"]["routing_failed"]
    assert f["token"] in (1, 4) and not f["excused"] and len(f["module"]) == len(f["vm"]) == 2
    assert f["margin"] <= 3.0 * f["noise"]   # the old rule (the VM's margin alone) excused it


@pytest.mark.parametrize("sentence", ["Let y be softmax routing of l choosing 3.",
                                      "Let y be sigmoid routing of l with bias b choosing 3 in 2 of 4 groups.",
                                      "Let y be sigmoid routing of l with bias b choosing 3 in 3 of 4 groups."])
def test_a_choice_rounding_can_make_is_choosable_and_a_far_one_is_not(sentence):
    """A router's `choosable`: the choice its own selection makes on scores moved within the
    bound (logits moved by less than it: p and sigmoid move less) is choosable, for every token
    of many near-tied rows; a choice that swaps in the token's worst expert for a chosen one is
    not, unless every score lies within the bound."""
    from emitter.ops.experts import ROUTERS
    text = "Let l be a 64 by 8 tensor of Real.\nLet b be a 1 by 8 tensor of Real.\n" + sentence + "\n"
    program = read_program(text)
    st = program.stages[0]
    select, _, choosable = ROUTERS[st.op.name]
    rng = np.random.default_rng(3)
    base = {"l": np.round(rng.standard_normal((64, 8)), 1), "b": np.round(0.1 * rng.standard_normal((1, 8)), 1)}
    a = st.args(program.shapes, values=base)
    tol = 1e-3
    for _ in range(40):   # each score moved by under tol / 2: any two by under tol
        moved = {"l": base["l"] + rng.uniform(-tol / 2, tol / 2, base["l"].shape),
                 "b": base["b"] + rng.uniform(-tol / 8, tol / 8, base["b"].shape)}
        mask = select(st.args(program.shapes, values=moved))[0]
        assert choosable(a, mask, tol).all()
    mask = select(a)[0]
    worst = np.where(mask, np.inf, select(a)[2]).argmin(axis=1)
    far = mask.copy()
    rows = np.arange(64)
    far[rows, np.argmax(mask, axis=1)] = False   # a chosen one out, the worst unchosen in
    far[rows, worst] = True
    assert not choosable(a, far, tol).any()
    keep = 3 if "3 of 4" in sentence else 2
    groups = far.reshape(64, 4, 2).any(axis=2).sum(axis=1) if "groups" in sentence else np.ones(64)
    np.testing.assert_array_equal(choosable(a, far, 1e9), groups <= keep)   # (never in more groups than G)


def test_a_choice_that_keeps_another_near_tied_group_is_choosable():
    """G of N groups: the VM keeps groups 0, 1, 2 (group 3 a hair behind group 1), the module 0,
    2, 3, and so takes group 2's expert over group 1's better one, its experts in two groups only:
    a choice within rounding, though the best group it did not use (1) would rule it out."""
    from emitter.ops.experts import ROUTERS
    text = ("Let l be a 1 by 8 tensor of Real.\nLet b be a 1 by 8 tensor of Real.\n"
            "Let y be sigmoid routing of l with bias b choosing 3 in 3 of 4 groups.\n")
    program = read_program(text)
    st = program.stages[0]
    select, _, choosable = ROUTERS[st.op.name]
    c = np.array([[0.90, 0.80, 0.745, 0.005, 0.74, 0.0101, 0.4499, 0.30]])   # groups of two
    a = st.args(program.shapes, values={"l": np.log(c / (1 - c)), "b": np.zeros((1, 8))})
    assert np.flatnonzero(select(a)[0][0]).tolist() == [0, 1, 2]   # the VM: group 1's expert
    module = np.zeros((1, 8), dtype=bool)
    module[0, [0, 1, 4]] = True
    assert choosable(a, module, 1e-3).all()
    assert not choosable(a, module, 1e-5).any()   # group 3 is 1e-4 behind group 1


@pytest.mark.parametrize("bug", sorted(__import__("bf16_bugs").MOE_BUGS))
def test_each_planted_moe_bug_fails_the_bf16_lock_and_a_good_bundle_passes(bug, tmp_path):
    """Every bug of tests/bf16_bugs.py's MOE_BUGS in the small program's bundle, on three inputs X:
    the bf16 lock fails it each time, and passes the good bundle on the same inputs."""
    import shutil
    from bf16_bugs import MOE_BUGS
    from emitter.sambaflow.emit import emit_program, write_bundle
    good = tmp_path / "good"
    write_bundle(emit_program(read_file(SMALL), {}), str(good))
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    (bad / "model.py").write_text(MOE_BUGS[bug]((good / "model.py").read_text(), 1))
    for seed in range(3):
        w = tmp_path / f"w{seed}"
        shutil.copytree(WEIGHTS, w)
        np.random.default_rng(seed).standard_normal((4, 8)).astype("<f8").tofile(w / "X.f64")
        assert lock_bundle(str(good), SMALL, str(w), "bfloat16", 1)["verdict"] == "pass", seed
        r = lock_bundle(str(bad), SMALL, str(w), "bfloat16", 1)
        assert r["verdict"] == "fail" and r["bf16"]["ops_failing"] >= 1, (bug, seed)
