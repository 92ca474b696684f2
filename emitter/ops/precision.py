"""Precision policies: in which precision each op of a program runs when its module runs in
bfloat16, as SambaNova's RDU runs models. Each op kind gets (compute, output), each "fp32" or
"bf16": its inputs are cast to `compute` before the op, its result rounded to `output` after.

The default is each op's own `precision` (declared with the op, in its family's file under
emitter/ops/), how SambaNova's model zoo runs: weights and activations stored in bf16; matmul and
attention accumulate in fp32; residual adds, the softmax, the norms' statistics and the logits in
fp32 (residual adds and the logits stage, the one that feeds an argmax or is named `logits`, keep
an fp32 output: LOGITS); the elementwise ops take bf16 in and give bf16 out, computing in fp32
between (as bf16 hardware's vector units do: a bf16 silu rounded twice has a measurable bias that
no RDU kernel has). Int tensors (token ids, positions) stay fp32 (exact to 2^24)."""

from .base import BF16, FP32

LOGITS = (FP32, FP32)   # the logits stage, whatever op computes it

__all__ = ["BF16", "FP32", "LOGITS", "check_policy", "logits_stage", "parse_policy", "stage_precisions"]


def logits_stage(program):
    """The stage whose value is the logits: named `logits`, else the input of an argmax output."""
    for st in program.stages:
        if st.binds and st.out == "logits":
            return st.index
    bound = {st.out: st.index for st in program.stages if st.binds}
    out = next(st for st in reversed(program.stages) if st.binds)
    if out.op.integer:
        return next((bound[n] for n in out.inputs if n in bound), None)
    return None


def stage_precisions(program, policy=None):
    """{stage index: (compute, output)} of every stage under `policy` (op kind or "logits" ->
    (compute, output)) over the defaults: LOGITS for the logits stage, each op's `precision`; a
    stage whose value is Int (a token written back, a position plus one) fp32 whatever the policy:
    a token id rounded to bf16 (1195 to 1192) reads another row at the next step."""
    policy = policy or {}
    logits = logits_stage(program)
    out = {}
    for st in program.stages:
        if not program.real.get(st.out, True):
            out[st.index] = (FP32, FP32)
        elif st.index == logits:
            out[st.index] = tuple(policy.get("logits", LOGITS))
        else:
            out[st.index] = tuple(policy.get(st.op.name, st.op.precision))
    return out


def check_policy(policy):
    """A config's `precision` mapping, validated: a list of problems (empty when it is fine)."""
    from . import BY_NAME
    problems = []
    if not isinstance(policy, dict):
        return ["must map an op (or `logits`) to [compute, output], each fp32 or bf16"]
    for k, v in policy.items():
        if k not in BY_NAME and k != "logits":
            problems.append(f"`{k}` is not an op")
        elif not (isinstance(v, list) and len(v) == 2 and all(x in (FP32, BF16) for x in v)):
            problems.append(f"`{k}` must be [compute, output], each fp32 or bf16, got {v!r}")
    return problems


def parse_policy(items):
    """A policy from `OP=COMPUTE,OUTPUT` items (`logos lock --precision`, as a config's
    `precision: {OP: [COMPUTE, OUTPUT]}`), or a ValueError saying what is wrong."""
    policy = {}
    for item in items:
        op, _, pair = item.partition("=")
        policy[op.strip()] = [x.strip() for x in pair.split(",")] if pair else pair
    problems = check_policy(policy)
    if problems:
        raise ValueError("; ".join(problems))
    return {k: tuple(v) for k, v in policy.items()}
