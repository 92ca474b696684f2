"""The bfloat16 gate: a statistical, per-op verdict on the precision the RDU runs.

A flat tolerance at bf16's level passes real bugs whose effect is below bf16's rounding noise but
systematic (a 0.4% gain, a norm's epsilon off by ten, a softmax accumulated in bf16). So each op is
judged against its own rounding floor: the same op computed in float64 from the VM's inputs rounded
as the precision policy feeds them (bf16 or fp32), its result rounded to its output precision. Per
op, in the probe pass (each op on the VM's inputs, so upstream error does not count twice), with
`noise` = rms(floor − VM), never below the compute precision's own grain (COMPUTE_GRAIN × rms(VM)):

- excess: rms(module − VM) / noise, bounded per op kind (each op's `excess`, beside its meaning in
  emitter/ops/; EXCESS_OTHER where it declares none);
- deviation: rms(module − floor) / rms(floor − VM), where a value larger than the rms counts
  relative to its own size (so the few largest values do not speak for all) and the one value
  furthest from the floor is left out (one rounding tipped by fp32 arithmetic in a 16-value op is
  not a precision), at most DEVIATION. The module is fed exactly the floor's rounded inputs, so a
  module that follows the policy lands on its floor but where its fp32 arithmetic tips a bf16
  rounding the other way (one value in a few hundred: up to 0.2 on smollm2 with the furthest value
  kept in). An op run in another precision than the policy declares (a residual add rounded to
  bf16, a softmax accumulated in bf16) or a systematic change smaller than a bf16 step (a gain of
  0.1%) moves it off the floor by about the floor's own noise, where the excess (module and floor
  share their input rounding) barely moves;
- gain: the module's values regressed on the floor's; |z| = |slope − 1| / its standard error (the
  heteroscedasticity-consistent one: rounding noise grows with |value|) above Z_LIMIT is a
  systematic gain, not noise (norms are skipped, their output renormalised: an op's
  `gain_test`). On the floor, not on the VM as the design's sentence has it: bf16 weights carry
  gains of their own (a conv tap of 0.3 everywhere is 0.30078 in bf16, +0.26% on every value,
  which qwen38's conv taps show at |z| up to 22 on the VM), and the floor holds exactly those;
- cosine(module, VM) at least COSINE_MIN;
- an op that computes nothing (`moves`: a row written into a table) has an exact floor: it passes
  where, and only where, the module is its floor value for value (its tensor's noise may be
  another row's: a KV cache's unwritten rows' mask of -1e9, rounded to bf16, hid a negated row
  written beside them).

An argmax the module flips is excused only where the VM's logit of the module's token lies within
the bf16 noise of the logits (MARGIN_NOISE times their rms error) of the VM's top; a router's
other choice of experts likewise,
inside the noise of its own scores (emitter.verify.routing). Each bound is a named constant a config can
override (`bf16:` in the program's config). The check's judge (emitter.verify.judges.Bf16) holds
the gate's state, hands each step here (`gate_step`) and sums the figures up.
"""

import math
from types import SimpleNamespace

import numpy as np

from ..ops import ALL_OPS
from ..ops.base import WIDEN_BYTES
from .compare import SMALL
from .rounding import COMPUTE_GRAIN, rounded
from .routing import ROUTERS, judge_router
from .verdict import describe_flip
from .vm import bind_result, run_stage

EXCESS = {op.name: op.excess for op in ALL_OPS if op.excess is not None}   # each op declares its own
EXCESS_OTHER = 8.0          # elementwise ops and the rest (an op whose `excess` is None)
DEVIATION = 0.5             # rms(module − floor) over rms(floor − VM), relative per value
Z_LIMIT = 6.0
GAIN_MIN = 2.0 ** -16       # a gain under this is no bug the gate calls, however significant: fp32
#                             accumulation over gemma3's 262144 logits has a slope of 1 + 2.4e-9 at
#                             |z| 7.5; the bugs it is for are 0.4% (2.6e2 times this)
GAIN_SKIP = tuple(op.name for op in ALL_OPS if not op.gain_test)   # the norms: renormalised
COSINE_MIN = 0.999
NMSE_MAX = 0.01             # the free pass's output and states: a gain moves no cosine (a state
#                             written back doubled, an output scaled after its tap); the zoo's
#                             worst is 0.0011 (gemma3's value cache)
MARGIN_NOISE = 3.0
MIN_VALUES = 16             # fewer values than this give no gain or cosine test (too few to judge)


def bounds(overrides=None):
    """The gate's bounds: the defaults, with a config's `bf16:` overrides."""
    o = overrides or {}
    return {"excess": {**EXCESS, **o.get("excess", {})}, "excess_other": o.get("excess_other", EXCESS_OTHER),
            "deviation": o.get("deviation", DEVIATION), "z": o.get("z", Z_LIMIT),
            "cosine": o.get("cosine", COSINE_MIN), "margin_noise": o.get("margin_noise", MARGIN_NOISE),
            "nmse": o.get("nmse", NMSE_MAX)}


def _large(value):
    return len(value.shape) == 2 and 8 * value.shape[0] * value.shape[1] > WIDEN_BYTES


def _operand(torch, value, held, compute):
    """An op's input as the policy feeds it: held in `held`, cast to `compute`; a large one
    (a table) rounded a block at a time as it is read (`Rounded`), or, the module's own view
    that the probe found exact (a torch tensor: already held), only widened."""
    if (isinstance(value, np.ndarray) or isinstance(value, torch.Tensor)) and _large(value):
        return Rounded(torch, value, held, compute)
    return _computed(torch, rounded(torch, value, held), held, compute)


def _computed(torch, x, held, compute):
    """A value already `held` (as float64), cast to `compute`: only fp32 held and bf16 compute
    rounds (widening a bf16 value is exact)."""
    return x if compute == held or held == "bf16" else rounded(torch, x, compute)


class Rounded:
    """A large operand as the policy feeds it, rounded when read and only what is read: the VM's
    matmul widens its B operand a block at a time (ops.base.widened_product), so a tied
    embedding's 262144 by 640 table is never whole in float64 each step; any other reader gets it
    whole through __array__. `base` is what it reads: a VM value (rounded to `held` as read, its
    blocks' pages released through `base`) or the module's own copy of a weight (a torch tensor,
    already held as the policy holds it: only widened)."""

    def __init__(self, torch, x, held, compute):
        self.torch, self.base, self.held, self.compute = torch, x, held, compute
        self.shape = tuple(x.shape)
        if isinstance(x, np.ndarray):
            self.flags = x.flags
        else:
            self.flags = SimpleNamespace(c_contiguous=x.is_contiguous(),
                                         f_contiguous=x.dim() == 2 and x.t().is_contiguous())

    def __getitem__(self, key):
        return Rounded(self.torch, self.base[key], self.held, self.compute)

    def __array__(self, dtype=None, copy=None):
        if isinstance(self.base, np.ndarray):
            x = rounded(self.torch, self.base, self.held)
        else:
            x = self.base.to(self.torch.float64).numpy()
        x = _computed(self.torch, x, self.held, self.compute)
        return x if dtype is None else x.astype(dtype, copy=False)


SHARED_BYTES = 64 << 20     # float64 copies of weights read by several ops, kept for a whole lock


def _weight(torch, model, name, held, compute, shared, slot=0):
    """A constant leaf as the policy feeds it, from the module's own copy (checked bit for bit by
    the load stage: the leaf rounded to `held`), so a big weight is not rounded again; a weight
    several ops read is converted once per lock (`shared`, while it holds under SHARED_BYTES).
    Any other weight up to WIDEN_BYTES in float64 is widened into the stage's `slot`-th scratch
    buffer, kept for the lock (the floor copies what it computes from it), and a larger one a
    block at a time as it is read (`Rounded`): each step's float64 copies of every weight were
    fresh pages, 270 000 page faults of a smollm2 check's 490 000."""
    if name in shared:
        return shared[name]
    leaf = getattr(model, "leaf_" + name).detach()
    readers = shared.setdefault("_readers", {}).get(name, 0)
    keep = readers > 1 and shared.get("_bytes", 0) + 8 * leaf.numel() <= SHARED_BYTES
    if 8 * leaf.numel() > WIDEN_BYTES and not keep:
        return Rounded(torch, leaf, held, compute)
    if keep:
        x = leaf.to(torch.float64).numpy()
    else:
        scratch = shared.setdefault("_scratch", {})
        if slot not in scratch or scratch[slot].numel() < leaf.numel():
            scratch[slot] = torch.empty(leaf.numel(), dtype=torch.float64)
        x = scratch[slot][:leaf.numel()].view(leaf.shape)
        x.copy_(leaf)
        x = x.numpy()
    x = _computed(torch, x, held, compute)
    if keep:
        shared[name] = x
        shared["_bytes"] = shared.get("_bytes", 0) + x.nbytes
    return x


HELD = {"bf16": "bfloat16", "fp32": "float32"}


def floors(torch, program, leaves, vm_stages, precisions, model=None, shared=None, exact=None):
    """Each stage's rounding floor on the VM's inputs (see the module docstring), as float64. With
    `model` (whose leaves passed the load stage), its buffers stand for the constant leaves;
    `shared` (a dict kept across a lock's steps) holds those several ops read. The stages in
    `exact` ({index: the module's value}, views the probe found bit for bit the VM's in the
    precision the module holds them: nothing to judge) get None, not a floor (a transposed
    table's would be a float64 copy of it each step), and a large one's value, where it is a
    view of a constant leaf (never of a state, which the passes write after the probe), stands
    for the VM's where later stages read it: the VM's rounded as held, without rounding a
    262144-row table of the VM's again each step."""
    exact = exact or {}
    fixed = set(program.leaves) - set(program.states)
    env = dict(leaves)
    held = {v: ("fp32" if not program.decls[v].real else "bf16") for v in program.leaves}
    constant = set() if model is None else fixed   # read from the module's own copies
    shared = {} if shared is None else shared
    if "_readers" not in shared:
        shared["_readers"] = {}
        for st in program.stages:
            for name in set(st.inputs):
                shared["_readers"][name] = shared["_readers"].get(name, 0) + 1
    out = []
    for st in program.stages:
        compute, output = precisions[st.index]
        indices = {st.bound[p] for p in st.op.index if isinstance(st.bound.get(p), str)}
        if st.index in exact:
            out.append(None)
        elif st.op.name == "embedding":   # a gather: rounding the gathered row rounds the table's
            table = st.bound["TABLE"]
            out.append(rounded(torch, _operand(torch, vm_stages[st.index], held[table], compute), output))
        else:
            renv = dict(env)
            for slot, name in enumerate(sorted(set(st.inputs) - indices)):
                renv[name] = _weight(torch, model, name, held[name], compute, shared, slot) if name in constant \
                    else _operand(torch, env[name], held[name], compute)
            for name in indices & set(renv):   # (an index read from the module's own view)
                if isinstance(renv[name], torch.Tensor):
                    renv[name] = renv[name].to(torch.float64).numpy()
            out.append(rounded(torch, run_stage(program, st, renv), output))
        bind_result(st, env, vm_stages[st.index])
        for name in filter(None, (st.out if st.binds else None, st.writes)):
            held[name] = output
        mine = exact.get(st.index)
        if st.binds and mine is not None and _large(mine) and mine.dtype == getattr(torch, HELD[output]) \
                and set(st.inputs) <= fixed:
            env[st.out] = mine
    return out


def _flat(x):
    return np.asarray(x, dtype=np.float64).reshape(-1)


def _rms(x):
    return math.sqrt(float(np.dot(x, x)) / x.size) if x.size else 0.0


def _ratio(err, noise):
    return 0.0 if err == 0 else (err / noise if noise > 0 else math.inf)


def _agreeing_nonfinite_out(m, v, f):
    """m, v and f without the places where all three hold the same NaN or Inf: what the program
    allows (`allow_nonfinite`: a mask of -inf), moved or added as it is, is no error and no noise
    (its inf − inf made every figure of the stage NaN: a right `h plus mask` failed at inf×)."""
    with np.errstate(invalid="ignore"):
        odd = ~(np.isfinite(m) & np.isfinite(v) & np.isfinite(f))
        if not odd.any():
            return m, v, f
        keep = ~(odd & (((m == v) & (f == v)) | (np.isnan(m) & np.isnan(v) & np.isnan(f))))
    return m[keep], v[keep], f[keep]


def judge(op_name, module, vm, floor, b, compute="fp32"):
    """The gate's figures for one op on one step (its compute precision gives the noise's grain),
    and whether it passes."""
    m, v, f = _agreeing_nonfinite_out(_flat(module), _flat(vm), _flat(floor))
    rv = _rms(v)
    w = 1.0 / np.maximum(np.abs(v), rv + np.finfo(float).tiny)   # values over the rms: relative
    moved = ((m - f) * w) ** 2
    fv = f - v
    return _judged(op_name, compute, b, (m, v, f), (fv, m - v, fv * w, moved), moved.max() if v.size else 0.0, rv,
                   (np.isfinite(m).all(), np.isfinite(f).all(), np.isfinite(v).all(), np.any(v)))


def _judged(op_name, compute, b, values, derived, top, rv, flags):
    """judge()'s figures from one stage's values (module, VM, floor), what is derived of them
    elementwise (floor − VM, module − VM, (floor − VM)·w, ((module − floor)·w)²), the largest of
    the last, rms(VM) and (module finite, floor finite, VM finite, any VM value not 0): the part
    of the gate judge and judge_many share."""
    m, v, f = values
    fv, mv, fvw, moved = derived
    finite_m, finite_f, finite_v, some = flags
    n = v.size
    grain = COMPUTE_GRAIN[compute]
    noise = max(_rms(fv), grain * rv)
    excess = _ratio(_rms(mv), noise)
    spread = math.sqrt(max(float(moved.sum() - top), 0.0) / n) if n else 0.0
    deviation = _ratio(spread, max(_rms(fvw), grain))
    limit = b["excess"].get(op_name, b["excess_other"])
    z, cosine, gain = 0.0, 1.0, 0.0
    if n >= MIN_VALUES and some and finite_m and finite_f:
        ff = float(np.dot(f, f))
        slope = float(np.dot(m, f)) / ff if ff > 0 else 1.0
        gain = slope - 1.0
        if op_name not in GAIN_SKIP and abs(gain) > GAIN_MIN:
            resid = m - slope * f      # its standard error robust to noise that grows with |f|
            se = math.sqrt(float(np.dot(f * f, resid * resid)) * n / (n - 1)) / ff
            z = abs(slope - 1.0) / se if se > 0 else math.inf
        norms = math.sqrt(float(np.dot(m, m)) * float(np.dot(v, v)))
        cosine = float(np.dot(m, v)) / norms if norms > 0 else 0.0
    ok = bool(finite_m == finite_v) and excess <= limit and deviation <= b["deviation"] and z <= b["z"] \
        and cosine >= b["cosine"]
    return {"excess": excess, "excess_limit": limit, "deviation": deviation, "z": z, "gain": gain,
            "cosine": cosine, "pass": ok}


def judge_many(items, b):
    """judge(op_name, module, vm, floor, b, compute) of each of `items` (a step's stages), the same
    figures to the bit, the elementwise work done once over them all (a small stage cost two
    hundred microseconds of NumPy calls; each stage's sums stay its own dot products)."""
    flats = [(_flat(m), _flat(v), _flat(f)) for _, m, v, f, _ in items]
    out = [None] * len(items)
    todo = [k for k, (_, v, _) in enumerate(flats) if v.size and flats[k][0].size == v.size == flats[k][2].size]
    if todo:
        sizes = np.array([flats[k][1].size for k in todo], dtype=np.int64)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        m, v, f = (np.concatenate([flats[k][j] for k in todo]) for j in range(3))
        spans = list(zip(starts.tolist(), ends.tolist()))
        rv = [_rms(v[lo:hi]) for lo, hi in spans]
        with np.errstate(all="ignore"):
            fv, mv = f - v, m - v
            w = 1.0 / np.maximum(np.abs(v), np.repeat(np.array(rv) + np.finfo(float).tiny, sizes))
            moved = ((m - f) * w) ** 2
            fvw = fv * w
            top = np.maximum.reduceat(moved, starts).tolist()
            finite = [np.logical_and.reduceat(np.isfinite(x), starts).tolist() for x in (m, f, v)]
            some = np.logical_or.reduceat(v != 0, starts).tolist()
        for k, (i, (lo, hi)) in enumerate(zip(todo, spans)):
            if not (finite[0][k] and finite[1][k] and finite[2][k]):   # (judge's: the NaN or Inf it may allow)
                continue
            out[i] = _judged(items[i][0], items[i][4], b, (m[lo:hi], v[lo:hi], f[lo:hi]),
                             (fv[lo:hi], mv[lo:hi], fvw[lo:hi], moved[lo:hi]), top[k], rv[k],
                             (finite[0][k], finite[1][k], finite[2][k], some[k]))
    return [j if j is not None else judge(*items[i][:4], b, items[i][4]) for i, j in enumerate(out)]


def _on_floor(module, floor):
    """Whether an op that moves values moved them as its floor did: value for value (NaN for NaN)."""
    m, f = _flat(module), _flat(floor)
    return m.size == f.size and bool(np.array_equal(m, f, equal_nan=True))


def judge_values(op_name, module, vm, floor, b, compute="fp32"):
    """judge() of a stage's value, or of each of a stage's values (gated delta's output and the
    memory it writes back): the first that fails, else the one nearest its excess bound, with
    `value` (its place) where there are several."""
    if not isinstance(vm, tuple):
        return judge(op_name, module, vm, floor, b, compute)
    each = [{**judge(op_name, m, v, f, b, compute), "value": k} for k, (m, v, f) in enumerate(zip(module, vm, floor))]
    return next((j for j in each if not j["pass"]), None) or max(each, key=lambda j: j["excess"] / j["excess_limit"])


def gate_step(torch, program, current, trace, probe, gate, step, label):
    """The bf16 gate on one step's probe pass: each op's figures replace its flat-tolerance pass.
    `gate` is the check's judge (emitter.verify.judges.Bf16: its precisions, bounds, the module
    whose weights the floors read, and `seen`, where each op's figures go)."""
    found = floors(torch, program, current, trace.stages, gate.precisions, gate.model,
                   gate.shared, {i: probe.exact.get(i) for i, m in probe.results.items() if m.get("view")})
    plain = [i for i, m in probe.results.items() if not m.get("view") and program.stages[i].op.name not in ROUTERS
             and not isinstance(trace.stages[i], tuple) and np.size(trace.stages[i]) <= SMALL]   # judged together
    judged = dict(zip(plain, judge_many([(program.stages[i].op.name, probe.values[i], trace.stages[i], found[i],
                                          gate.precisions[i][0]) for i in plain], gate.bounds)))
    for i, m in probe.results.items():
        st = program.stages[i]
        if m.get("view"):      # a view computes nothing: the probe checked it bit for bit
            continue
        vm, floor, flips = trace.stages[i], found[i], []
        if st.op.name in ROUTERS:   # judged under the module's own choice of experts
            env = {**current, **{s.out: trace.stages[s.index] for s in program.stages[:i] if s.binds}}
            vm, floor, flips = judge_router(torch, program, st, env, probe.values[i], gate, step)
        j = judged[i] if i in judged else \
            judge_values(st.op.name, probe.values[i], vm, floor, gate.bounds, gate.precisions[i][0])
        if st.op.moves and not isinstance(vm, tuple):   # its floor is exact: on it or not is all
            # (a row written into a KV cache whose unwritten rows hold a mask of -1e9: their rounding
            # is the whole tensor's noise, under which a wrong row's error hides; NaN or Inf the
            # program allows moved as they are is no excess)
            on = _on_floor(probe.values[i], floor)
            j = {**j, "pass": on, **({} if on else {"off_floor": True})}
        if flips:
            wrong = [f for f in flips if not f["excused"]]
            j.update(routing_flips=len(flips), routing_excused=len(flips) - len(wrong))
            if wrong:
                j.update({"pass": False, "routing": describe_flip(wrong[0])})
            gate.routing.extend({**f, **label(program, i)} for f in flips)
        m.update(bf16=j, pass_flat=m["pass"], **{"pass": j["pass"]})
        gate.seen.append({"step": step, **label(program, i), **j})
