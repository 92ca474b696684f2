"""The bfloat16 gate: a statistical, per-op verdict on the precision the RDU runs.

A flat tolerance at bf16's level passes real bugs whose effect is below bf16's rounding noise but
systematic (a 0.4% gain, a norm's epsilon off by ten, a softmax accumulated in bf16). So each op is
judged against its own rounding floor: the same op computed in float64 from the VM's inputs rounded
as the precision policy feeds them (bf16 or fp32), its result rounded to its output precision. Per
op (in the probe pass, each op on the VM's inputs, so upstream error does not count twice):

- excess: rms(module − VM) / rms(floor − VM), bounded per op kind (EXCESS);
- gain: the slope of the module's values regressed on the floor's; |z| = |slope − 1| / its standard
  error above Z_LIMIT is a systematic gain, not noise;
- cosine(module, VM) at least COSINE_MIN.

An argmax the module flips is excused only where the VM's top-2 margin lies inside the bf16 noise
of the logits (MARGIN_NOISE times their rms error). Each bound is a named constant a config can
override (`bf16:` in the program's config).
"""

import math

import numpy as np

from .vm import bind_result, run_stage

EXCESS = {"matmul": 4.0, "attention": 4.0, "full attention": 4.0, "plus": 4.0,
          "rmsnorm": 32.0, "layernorm": 32.0, "l2norm": 32.0}
EXCESS_OTHER = 8.0          # elementwise ops and the rest
Z_LIMIT = 6.0
COSINE_MIN = 0.999
MARGIN_NOISE = 3.0
MIN_VALUES = 16             # fewer values than this give no gain or cosine test (too few to judge)


def bounds(overrides=None):
    """The gate's bounds: the defaults, with a config's `bf16:` overrides."""
    o = overrides or {}
    return {"excess": {**EXCESS, **o.get("excess", {})}, "excess_other": o.get("excess_other", EXCESS_OTHER),
            "z": o.get("z", Z_LIMIT), "cosine": o.get("cosine", COSINE_MIN),
            "margin_noise": o.get("margin_noise", MARGIN_NOISE)}


def rounded(torch, x, precision):
    """`x` (float64 or float32 values) rounded to "bf16" or "fp32", as float64."""
    if isinstance(x, tuple):
        return tuple(rounded(torch, v, precision) for v in x)
    x = np.asarray(x)
    t = torch.from_numpy(x if x.flags.writeable and x.flags.c_contiguous else np.array(x))
    t = t.to(torch.bfloat16 if precision == "bf16" else torch.float32)
    return t.to(torch.float64).numpy()


def floors(torch, program, leaves, vm_stages, precisions):
    """Each stage's rounding floor on the VM's inputs (see the module docstring), as float64."""
    env = dict(leaves)
    held = {v: ("fp32" if not program.decls[v].real else "bf16") for v in program.leaves}
    out = []
    for st in program.stages:
        compute, output = precisions[st.index]
        renv = dict(env)
        indices = {st.bound[p] for p in st.op.index if isinstance(st.bound.get(p), str)}
        for name in set(st.inputs) - indices:
            renv[name] = rounded(torch, rounded(torch, env[name], held[name]), compute)
        out.append(rounded(torch, run_stage(program, st, renv), output))
        bind_result(st, env, vm_stages[st.index])
        for name in filter(None, (st.out if st.binds else None, st.writes)):
            held[name] = output
    return out


def _flat(x):
    return np.asarray(x[0] if isinstance(x, tuple) else x, dtype=np.float64).reshape(-1)


def judge(op_name, module, vm, floor, b):
    """The gate's figures for one op on one step, and whether it passes."""
    m, v, f = _flat(module), _flat(vm), _flat(floor)
    err_m = math.sqrt(float(np.mean((m - v) ** 2))) if v.size else 0.0
    err_f = math.sqrt(float(np.mean((f - v) ** 2))) if v.size else 0.0
    excess = 0.0 if err_m == 0 else (err_m / err_f if err_f > 0 else math.inf)
    limit = b["excess"].get(op_name, b["excess_other"])
    z, cosine = 0.0, 1.0
    if v.size >= MIN_VALUES and np.any(f):
        ff = float(np.dot(f, f))
        slope = float(np.dot(m, f)) / ff
        resid = m - slope * f
        se = math.sqrt(float(np.dot(resid, resid)) / (v.size - 1) / ff)
        z = 0.0 if slope == 1.0 else (abs(slope - 1.0) / se if se > 0 else math.inf)
        norms = float(np.linalg.norm(m) * np.linalg.norm(v))
        cosine = float(np.dot(m, v)) / norms if norms > 0 else (1.0 if not np.any(m - v) else 0.0)
    finite = bool(np.isfinite(m).all() == np.isfinite(v).all())
    ok = finite and excess <= limit and z <= b["z"] and cosine >= b["cosine"]
    return {"excess": excess, "excess_limit": limit, "z": z, "cosine": cosine, "pass": ok}


def gate_step(torch, program, current, trace, probe, gate, step, label):
    """The bf16 gate on one step's probe pass: each op's figures replace its flat-tolerance pass."""
    found = floors(torch, program, current, trace.stages, gate["precisions"])
    for i, m in probe.results.items():
        st = program.stages[i]
        j = judge(st.op.name, probe.values[i], trace.stages[i], found[i], gate["bounds"])
        m.update(bf16=j, pass_flat=m["pass"], **{"pass": j["pass"]})
        gate["seen"].append({"step": step, **label(program, i), **j})


def summary(gate):
    """The bf16 gate's columns: its worst op by excess (as a share of its bound), the worst |z|,
    the lowest cosine, and the argmax flips and how many were excused."""
    seen = gate["seen"]

    def pick(key, what):
        s = max(seen, key=key) if seen else None
        return None if s is None else {k: s[k] for k in ("step", "stage", "out", "op", "line", what)}
    worst = pick(lambda s: s["excess"] / s["excess_limit"], "excess")
    if worst is not None:
        worst["limit"] = max(seen, key=lambda s: s["excess"] / s["excess_limit"])["excess_limit"]
    return {"bounds": gate["bounds"], "worst_excess": worst, "worst_z": pick(lambda s: s["z"], "z"),
            "min_cosine": pick(lambda s: -s["cosine"], "cosine"),
            "argmax_flips": gate["flips"], "argmax_excused": gate["excused"],
            "ops_failing": sum(1 for s in seen if not s["pass"])}
