"""Routing flips under the bf16 gate. A router in bfloat16 may choose other experts than the VM
for a token whose K-th and (K+1)-th scores lie within rounding of each other: that is the
precision, not a bug, and its routing weights then differ from the VM's by whole weights. So a
routing stage (an op in emitter.ops.experts.ROUTERS) is judged in two parts:

- the choice: per token where the module's experts differ from the VM's, the VM's margin (the
  gap its choice was made by) against the router's own bf16 noise at that token, rms(scores on
  the inputs as the policy rounds them − scores on the VM's inputs), never below the compute
  grain. A flip inside MARGIN_NOISE times that noise is excused where the module's experts are
  a choice the router makes with its scores moved by at most that much (the near-tied ones
  swapped, not any other: each op's `choosable` in emitter.ops.experts); any other, or a token
  with a number of experts other than the VM's, fails the stage, naming the step, the token and
  the two expert sets;
- the weights: the module's against the VM's and the floor's meanings computed with the module's
  own choice, by the gate's usual figures (emitter.verify.bf16.judge).
"""

import numpy as np

from ..ops.experts import ROUTERS
from ..ops.precision import FP32
from .rounding import COMPUTE_GRAIN, rounded


def _rms_rows(x):
    """Each row's rms over its finite values (a -inf score counts 0)."""
    return np.sqrt(np.mean(np.where(np.isfinite(x), x, 0.0) ** 2, axis=1))


def judge_router(torch, program, st, env, module, gate, step):
    """(the VM's and the floor's routing weights under the module's choice, the flips found) for
    the routing stage `st` on one probe step; `env` holds the VM's values of its inputs."""
    select, weights, choosable = ROUTERS[st.op.name]
    compute, output = gate.precisions[st.index]
    a = st.args(program.shapes, values=env)
    mask_vm, margin, scores = select(a)
    fed = {name: rounded(torch, env[name], _held(program, gate, name)) for name in st.inputs}
    if compute != FP32:   # computed in bf16: an fp32 input rounds again (widening is exact)
        fed = {k: rounded(torch, v, compute) for k, v in fed.items()}
    af = st.args(program.shapes, values={**env, **fed})
    scores_fed = select(af)[2]
    with np.errstate(invalid="ignore"):   # -inf (a group not kept) on both sides: no noise
        noise = np.maximum(_rms_rows(scores_fed - scores), COMPUTE_GRAIN[compute] * _rms_rows(scores))
    got = np.asarray(module[0] if isinstance(module, tuple) else module, dtype=np.float64)
    mask = got != 0
    flipped = np.flatnonzero((mask != mask_vm).any(axis=1))
    flips, near = [], choosable(a, mask, gate.bounds["margin_noise"] * noise, flipped) if flipped.size else None
    for t in flipped:
        same_size = mask[t].sum() == mask_vm[t].sum()
        flips.append({"step": step, "token": int(t), "vm": np.flatnonzero(mask_vm[t]).tolist(),
                      "module": np.flatnonzero(mask[t]).tolist(), "margin": float(margin[t]),
                      "noise": float(noise[t]),
                      "excused": bool(same_size and margin[t] <= gate.bounds["margin_noise"] * noise[t]
                                      and near[t])})
    vm = weights(a, mask)
    floor = rounded(torch, weights(af, mask), output)
    return vm, floor, flips


def _held(program, gate, name):
    """The precision a routing op's input is held in: its stage's output precision, a leaf's
    (Real bf16, Int fp32)."""
    for st in program.stages:
        if st.binds and st.out == name:
            return gate.precisions[st.index][1]
    return "bf16" if program.decls[name].real else FP32
