"""The lock's judges (emitter/verify/judges.py) and what each op declares for bfloat16 beside its
meaning (emitter/ops/): its default precision, its gate bound and whether its gain is tested."""

import ast
import os
import types

import numpy as np
import pytest

from conftest import ROOT
from emitter.language.reader import read_program
from emitter.ops import ALL_OPS, BY_NAME
from emitter.ops.precision import BF16, FP32, LOGITS, stage_precisions
from emitter.verify import bf16, judges
from emitter.verify.compare import compare, worst_of
from emitter.verify.probe import CouldNotRun


def test_each_op_declares_its_bf16_precision_and_gate_bound():
    """The tables keyed by op name that stood apart from the ops (the default policy, the gate's
    excess bounds, the ops whose gain is not tested) are what the ops declare, no more."""
    assert bf16.EXCESS == {"matmul": 4.0, "attention": 4.0, "full attention": 4.0, "plus": 4.0,
                           "rmsnorm": 32.0, "layernorm": 32.0, "l2norm": 32.0}
    assert sorted(bf16.GAIN_SKIP) == ["l2norm", "layernorm", "rmsnorm"]
    assert {op.name: op.precision for op in ALL_OPS if op.precision != (FP32, BF16)} == \
        {"plus": (FP32, FP32), "argmax": (FP32, FP32)}
    assert LOGITS == (FP32, FP32)
    b = bf16.bounds({"excess": {"silu": 2.0}})
    assert b["excess"]["silu"] == 2.0 and b["excess"]["matmul"] == 4.0 and b["excess_other"] == 8.0


SRC = """Let X be a 1 by 4 tensor of Real.
Let W be a 4 by 4 tensor of Real.
Let B be a 1 by 4 tensor of Real.
Let y be X matmul W.
Let z be y plus B.
Let s be silu of z.
Let logits be s matmul W.
Let t be argmax of logits.
"""


def test_a_policy_overrides_an_ops_own_precision():
    p = read_program(SRC, "p.logos")
    got = stage_precisions(p)
    assert [got[i] for i in range(5)] == [(FP32, BF16), (FP32, FP32), (FP32, BF16), LOGITS, (FP32, FP32)]
    got = stage_precisions(p, {"plus": (BF16, BF16), "logits": (FP32, BF16), "matmul": (BF16, BF16)})
    assert [got[i] for i in range(5)] == [(BF16, BF16), (BF16, BF16), (FP32, BF16), (FP32, BF16),
                                          (FP32, FP32)]
    assert BY_NAME["plus"].precision == (FP32, FP32)    # the op's own is untouched


def test_the_flat_judge_is_the_tolerance():
    tol = {"abs": 1e-4, "rel": 1e-3}
    j = judges.judge_for("float32", tol)
    assert type(j) is judges.Flat and j.precisions is None and j.tol is tol
    got, want = np.array([[1.0, 2.0]]), np.array([[1.0, 2.01]])
    assert j.compare(got, want) == compare(got, want, tol) and not j.compare(got, want)["pass"]
    logits = types.SimpleNamespace(stages={3: np.array([[1.0, 2.0, 2.0 + 1e-9, 0.5]])})
    m = {"pass": False}
    j.flip(m, None, logits, 3, np.array([[1]]))   # the VM's top is token 2, the module's 1: a near-tie
    assert m["pass"] and m["flip_excused"] and m["flip_margin"] == pytest.approx(1e-9, rel=1e-3), m
    assert m["flip_bound"] == pytest.approx(1e-4 + 1e-3 * (2.0 + 1e-9)), m
    for token in (0, 3, 4, -1):   # ranked 1.0 below, or none of the row's: wrong
        m = {"pass": False}
        j.flip(m, None, logits, 3, np.array([[token]]))
        assert not m["pass"] and not m["flip_excused"], (token, m)
    load = {"pass": True, "failed": []}
    stages = [{"stage": 0, "out": "y", "op": "matmul", "line": 4, "worst_ratio": 2.0, "max_abs": 1.0,
               "guarded_rel": 0.1, "pass": False}]
    assert j.report(stages, load) == {"worst": worst_of(stages, load)}


def test_the_bf16_judge_checks_the_bundles_policy_and_judges_by_cosine():
    p = read_program(SRC, "p.logos")
    tol = {"abs": 1e-2, "rel": 2e-2}
    with pytest.raises(CouldNotRun, match="no precision policy"):
        judges.judge_for("bfloat16", tol, types.SimpleNamespace(PRECISION={}), p)
    wrong = {i: v for i, v in stage_precisions(p).items()}
    wrong[1] = (FP32, BF16)
    with pytest.raises(CouldNotRun, match=r"stage 1 `z = plus` \(line 5\)"):
        judges.judge_for("bfloat16", tol, types.SimpleNamespace(PRECISION=wrong), p)
    j = judges.judge_for("bfloat16", tol, types.SimpleNamespace(PRECISION=stage_precisions(p)), p)
    assert type(j) is judges.Bf16 and j.precisions == stage_precisions(p)
    want = np.linspace(1.0, 2.0, 32).reshape(1, 32)
    m = j.compare(want * 1.05, want)      # 5% off: over the flat tolerance, on the cosine
    assert m["worst_ratio"] > 1 and m["pass"] and not j.compare(-want, want)["pass"]
    load = {"pass": True, "failed": []}
    r = j.report([], load)
    assert r["worst"] is None and r["bf16"]["worst"] is None and r["bf16"]["argmax_flips"] == 0


def test_the_lock_does_not_tell_its_judges_apart():
    """lock.py orchestrates: no bf16 branch, no gate of its own (the judge is asked)."""
    path = os.path.join(ROOT, "emitter", "verify", "lock.py")
    text = open(path).read()
    names = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}
    assert "gate" not in names and '"bfloat16"' not in text and "from .bf16" not in text
    assert len(text.splitlines()) <= 400
