"""The lock's judges: what passes. The lock computes the figures (emitter.verify.compare) and asks
its check's judge, which it does not tell apart, for the verdict on each of them:

- `compare(got, want)`: a real tensor the free pass ends with (the output, each state), its figures
  and its pass;
- `step(...)`: after each step's probe pass, each stage's pass (the probe's figures in hand);
- `flip(...)`: an integer output (an argmax's token) the module got wrong: whether it is excused;
- `loose`: whether the free pass is judged on cosine and nmse alone (then run again with its taps
  hooked, to give it bit for bit);
- `settled(...)`: after the steps, the load stage's record as the judge stands on it;
- `report(stages, load)`: the result's fields the judge adds (the worst stage, a summary).

`Flat` (float64, float32): every tensor within the check's tolerance (compare's own pass), a
flipped token only inside it, and the constant leaves, once the steps ran, still as loaded. Both:
an Int state (a token, a position) passes only where it is the VM's, value for value. `Bf16`
(bfloat16): the per-op gate of emitter.verify.bf16, each op against its rounding floor under the
program's precision policy, which the bundle's PRECISION table must be; a real output or state
passes on its cosine and nmse, a flipped token only inside the logits' noise; its summary is the result's
`bf16` and its furthest op the result's `worst`."""

import math

import numpy as np

from ..ops.precision import stage_precisions
from . import bf16
from .compare import compare, numpy_dtype, worst_of
from .leaf_check import leaf_sums, still_loaded
from .probe import CouldNotRun
from .vm import bind_result


class Flat:
    """float64 / float32: every tensor passes within the tolerance `tol`. `model`: the module whose
    leaves passed the load stage, or None; its constant leaves are checked again once the steps
    ran: one the module wrote while it ran (in place through any view, `.data` or NumPy) fails,
    named (a leaf that maps its file is known unchanged from its pages, one of the module's own
    memory from the hash of its bytes: smollm2's 1.3 GB at float64 in about 0.2 s, twice)."""

    precisions = None   # the module runs in the lock's dtype: no precision per stage
    each_step = False   # the constant leaves checked again after every step, not once at the end
    loose = False       # its free passes are judged by the tolerance (else: passes.same_when_tapped)

    def __init__(self, tol, model=None):
        self.tol, self.model = tol, model
        self.watched = self.load = None   # (watch: what the weights are checked against)
        self.sums = {}       # (watch: the constant leaves as they passed the load stage)
        self.last = 0        # the last step judged

    def compare(self, got, want, integer=False, rows=False):
        """A tensor's figures (the module's against the VM's) and its pass; an Int one (`integer`:
        a token, a position) passes only where each value is the VM's. (`rows`: the bf16 judge's;
        the tolerance here bounds each row on its own values already.)"""
        m = compare(got, want, self.tol)
        if integer:
            got = np.asarray(got.double() if hasattr(got, "double") else got, np.float64).reshape(-1)
            want = np.asarray(want, np.float64).reshape(-1)
            m["integer_mismatches"] = int(np.count_nonzero(got != want)) if got.size == want.size \
                else max(got.size, want.size)
            m["pass"] = m["integer_mismatches"] == 0
        return m

    def watch(self, torch, program, leaves, dtype, resident, load, hashed=None):
        """The run's leaves and its load stage's record, before the steps (`hashed`: the hashes
        the load stage took, leaf_check.load_stage's `sums`)."""
        self.watched = (torch, program, leaves, dtype, resident)
        self.load = load
        if self.model is not None and load["pass"]:
            self.sums = leaf_sums(torch, self.model, [n for n in program.leaves if n not in program.states], resident,
                                  hashed)

    def step(self, torch, program, current, trace, probe, step, label):
        """One step's probe pass judged: each stage's pass is the tolerance's, as the probe set it,
        but an argmax's token that is the argmax of the VM's input to it as the module was handed
        it (in the lock's dtype, first on ties: two logits 1e-8 apart are one float32) passes."""
        self.last = step
        if self.each_step:
            self._again(step)
        for i, m in probe.results.items() if self.precisions is None else ():
            st = program.stages[i]
            if st.op.integer and not m["pass"] and i in probe.values and st.inputs:
                logits = np.asarray(self._before(program, current, trace, i).get(st.inputs[0]), np.float64)
                held = logits.astype(numpy_dtype(probe.dtype) or np.float64)
                got = np.asarray(probe.values[i], np.float64).reshape(-1)
                if logits.size and got.size == 1 and got[0] == np.argmax(held):
                    margins = _margins(logits, got)[1]
                    m.update(**{"pass": True, "flip_excused": True, "worst_ratio": 0.0,
                                "flip_margin": margins[0] if margins else None, "flip_bound": 0.0})

    @staticmethod
    def _before(program, current, trace, index):
        """The VM's values as stage `index` reads them: the leaves and states, each earlier stage's."""
        env = dict(current)
        for s in program.stages[:index]:
            bind_result(s, env, trace.stages[s.index])
        return env

    def _again(self, step):
        """The load stage again over the constant leaves (leaf_check.still_loaded): one the module
        wrote in its passes, as `sums` tell it (the hashes of their bytes), fails, named,
        `written` at `step`."""
        if self.model is not None and self.load is not None and self.load["pass"]:
            t, program, leaves, dtype, resident = self.watched
            self.load = still_loaded(t, self.model, program, leaves, dtype, self.tol, resident, self.load, step,
                                     self.sums)

    def flip(self, out_m, probe, trace, feed, got):
        """A flipped token (`got`: the module's tokens) passes only where it is a near-tie of the
        VM's (`near_tie`, on the logits of the stage `feed`)."""
        self.near_tie(out_m, trace.stages[feed], got)

    def near_tie(self, out_m, logits, got):
        """Whether the VM's logit of each token `got` (`logits`: the VM's) is within the check's
        tolerance of the VM's top logit (abs + rel times the row's largest |logit|, compare's
        bound): a near-tie the dtype cannot tell apart (two logits 1e-8 apart are one float32). A
        token the VM ranks further down stays wrong. Its figures into `out_m`, and its pass."""
        rows, margins = _margins(logits, got)
        bounds = [self.tol["abs"] + self.tol["rel"] * float(np.abs(r).max()) for r in rows] if margins else []
        i = max(range(len(margins)), key=lambda k: margins[k] - bounds[k]) if margins else None
        excused = i is not None and all(m <= b for m, b in zip(margins, bounds))
        out_m.update(flip_margin=math.inf if i is None else margins[i], flip_bound=None if i is None else bounds[i],
                     flip_excused=excused)
        out_m["pass"] = excused

    def settled(self, load, replayed=False):
        """The load stage's record after the steps: every figure was judged against the VM, the
        constant leaves checked again (once here, unless after every step; and here after a
        replay, `replayed`: a pass after the last step's)."""
        if self.last and (not self.each_step or replayed):
            self._again(self.last)
        return load if self.load is None else self.load

    def report(self, stages, load):
        """The result's fields this judge gives: the stage furthest from its tolerance."""
        return {"worst": worst_of(stages, load)}


def _row_figures(g, w):
    """compare()'s nonfinite_mismatch, cosine and nmse of each row of `g` against `w`'s, for all
    rows at once (a cache of 1,024 rows compared row by row cost 20 ms)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        fin_g, fin_w = np.isfinite(g), np.isfinite(w)
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        mismatch = np.count_nonzero((fin_g != fin_w) | (~fin_g & ~fin_w & ~same), axis=1)
        both = fin_g & fin_w
        g, w = np.where(both, g, 0.0), np.where(both, w, 0.0)
        d = g - w
        sq, power = np.einsum("ij,ij->i", d, d), np.einsum("ij,ij->i", w, w)
        norms = np.sqrt(np.einsum("ij,ij->i", g, g)) * np.sqrt(power)
        nmse = np.where(power > 0, sq / power, sq)
        cosine = np.where(norms > 0, np.einsum("ij,ij->i", g, w) / norms,
                          np.where(np.abs(d).max(axis=1, initial=0.0) == 0, 1.0, 0.0))
    return mismatch, cosine, nmse


class Bf16(Flat):
    """bfloat16: the per-op gate. `module` (the bundle's model.py) must hold the program's
    precision under `policy` (the config's, else each op's default); `overrides`, the config's
    `bf16:` bounds; `model`, the module whose leaves passed the load stage (the floors read its
    weights), or None."""

    each_step = True   # the floors read the module's own weights: checked before each step's
    loose = True       # its free pass is judged on cosine and nmse alone: the stages the probe judges
    #                    must be what that pass computes, bit for bit (passes.same_when_tapped)

    def __init__(self, tol, module, program, policy=None, overrides=None, model=None):
        super().__init__(tol, model)
        self.precisions = _precisions(module, program, policy)
        self.bounds = bf16.bounds(overrides)
        self.shared = {}     # the floors' float64 weights, kept across the lock's steps
        self.seen, self.flips, self.excused = [], 0, 0
        self.routing = []    # each routing flip: its stage, step, token, expert sets, margin, noise

    def compare(self, got, want, integer=False, rows=False):
        """An Int tensor exactly (the policy holds it in fp32); a real one on its cosine and, as a
        gain moves no cosine, its nmse; with `rows` (a cache a `Set row` writes, where no probe
        judges the row written: the fresh pass's), each row of it so too, as a row's values are
        its own (an unwritten row's mask of -1e9, rounded, is the whole tensor's noise: a key row
        written at the wrong position kept the whole cache's cosine and nmse to 13 digits)."""
        if integer:
            return super().compare(got, want, integer)
        m = compare(got, want, self.tol)
        m["pass"] = m["nonfinite_mismatch"] == 0 and m["cosine"] >= self.bounds["cosine"] and \
            m["nmse"] <= self.bounds["nmse"]
        if rows and m["pass"] and len(getattr(want, "shape", ())) == 2:
            g = np.asarray(got.double() if hasattr(got, "double") else got, np.float64).reshape(want.shape)
            mismatch, cosine, nmse = _row_figures(g, np.asarray(want, np.float64))
            bad = np.flatnonzero((mismatch > 0) | (cosine < self.bounds["cosine"]) | (nmse > self.bounds["nmse"]))
            if bad.size:
                i = int(bad[0])
                m.update({"pass": False, "row": i, "row_cosine": float(cosine[i]), "row_nmse": float(nmse[i])})
        return m

    def step(self, torch, program, current, trace, probe, step, label):
        """The floors read the module's own weights: before they do, the load stage again over
        the constant leaves, so one the module wrote behind torch's back (through `.data` or
        NumPy) in this step's passes, which the floors would follow, fails, named, whether or not
        the module puts it back later (leaf_check.still_loaded)."""
        super().step(torch, program, current, trace, probe, step, label)
        # looked up on the module each step: bench/bench_bf16.py puts its spy there
        bf16.gate_step(torch, program, current, trace, probe, self, step, label)

    def flip(self, out_m, probe, trace, feed, got):
        """A flipped token (`got`: the module's tokens) passes only where the VM's own logits hold
        it as likely as theirs within the logits' noise: the VM's top logit less the VM's logit
        of the module's token (the largest of a row's), inside the noise's bound. A token the VM
        ranks far down is no near-tie, however wide the noise."""
        vm = np.asarray(trace.stages[feed], dtype=np.float64).reshape(-1)
        noise = float(np.sqrt(np.mean((probe.values[feed].reshape(-1) - vm) ** 2)))
        margin = max(_margins(vm, got)[1] or [math.inf])
        excused = margin <= self.bounds["margin_noise"] * noise
        out_m.update(flip_margin=margin, flip_noise=noise, flip_excused=excused)
        out_m["pass"] = excused
        self.flips += 1
        self.excused += int(excused)

    def report(self, stages, load):
        """The gate's summary (`bf16`) and, load failures aside, its furthest op as the worst."""
        s = self.summary()
        w = s["worst"]
        if load["failed"] or not w:
            return {"worst": worst_of(stages, load), "bf16": s}
        return {"worst": {**{k: w[k] for k in ("stage", "out", "op", "line", "ratio", "by")},
                          "max_abs": None, "guarded_rel": None}, "bf16": s}

    def summary(self):
        """The gate's columns: the op furthest towards any of its bounds (`worst`: its share of
        that bound and which), its worst op by excess (as a share of its bound), the worst deviation
        from the floor, the worst |z|, the lowest cosine, and the argmax flips and how many were
        excused."""
        seen, b = self.seen, self.bounds

        def pick(key, what):
            s = max(seen, key=key) if seen else None
            return None if s is None else {k: s[k] for k in ("step", "stage", "out", "op", "line", what)}
        worst = pick(lambda s: s["excess"] / s["excess_limit"], "excess")
        if worst is not None:
            worst["limit"] = max(seen, key=lambda s: s["excess"] / s["excess_limit"])["excess_limit"]
        furthest = None
        if seen:   # (one failing first; an op off its exact floor has no share of a bound)
            s = max(seen, key=lambda s: (not s["pass"], math.inf if s.get("off_floor") else _share(s, b)[0]))
            ratio, by = (None, "floor") if s.get("off_floor") else _share(s, b)
            furthest = {**{k: s[k] for k in ("step", "stage", "out", "op", "line")}, "ratio": ratio, "by": by}
        return {"bounds": b, "worst": furthest, "worst_excess": worst, "worst_z": pick(lambda s: s["z"], "z"),
                "worst_deviation": pick(lambda s: s["deviation"], "deviation"),
                "min_cosine": pick(lambda s: -s["cosine"], "cosine"),
                "argmax_flips": self.flips, "argmax_excused": self.excused,
                "routing_flips": len(self.routing),
                "routing_excused": sum(1 for f in self.routing if f["excused"]),
                "routing_failed": next((f for f in self.routing if not f["excused"]), None),
                "routing_margins": [{k: f[k] for k in ("step", "out", "token", "margin", "noise", "excused")}
                                    for f in self.routing[:20]],
                "ops_failing": sum(1 for s in seen if not s["pass"])}


def _margins(logits, got):
    """(the VM's `logits` a row per token, each row's top logit less its logit of the module's
    token `got`), ([], []) where a token is none a logit of its row stands for."""
    if logits is None:
        return [], []
    vm = np.asarray(logits, dtype=np.float64).reshape(-1)
    tokens = np.asarray(got, dtype=np.float64).reshape(-1)
    if not (np.isfinite(tokens) & (tokens == np.round(tokens))).all():
        return [], []
    tokens = tokens.astype(np.int64)
    rows = vm.reshape(tokens.size, -1) if tokens.size and vm.size % tokens.size == 0 else None
    if rows is None or not ((tokens >= 0) & (tokens < rows.shape[1])).all():
        return [], []
    return list(rows), [float(rows[i].max() - rows[i, t]) for i, t in enumerate(tokens)]


def _share(s, b):
    """How far one op's figures went towards their bounds (1.0: at a bound), and which bound."""
    shares = {"excess": s["excess"] / s["excess_limit"], "deviation": s["deviation"] / b["deviation"],
              "z": s["z"] / b["z"],
              "cosine": (1.0 - s["cosine"]) / (1.0 - b["cosine"]) if b["cosine"] < 1 else 0.0}
    by = max(shares, key=shares.get)
    return shares[by], by


def _precisions(module, program, policy):
    """The program's precision under its policy, which the bundle's PRECISION table must be."""
    want = stage_precisions(program, policy or {})
    have = {int(k): tuple(v) for k, v in (getattr(module, "PRECISION", None) or {}).items()}
    if not have:
        raise CouldNotRun("the bundle has no precision policy (PRECISION): emit it for bfloat16 "
                          "(`logos emit --bfloat16`; in the pipeline, a program whose dtypes include bfloat16 is)")
    wrong = [i for i in sorted(want) if have.get(i) != want[i]]
    if wrong:
        st = program.stages[wrong[0]]
        raise CouldNotRun(f"the bundle's PRECISION says stage {st.index} `{st.out} = {st.op.name}` (line "
                          f"{st.line}) runs in {have.get(st.index)}, the policy says {want[st.index]}: "
                          "emit it again with the program's policy")
    return want


JUDGES = {"bfloat16": Bf16}   # any other dtype: Flat


def judge_for(dtype, tol, module=None, program=None, policy=None, overrides=None, model=None):
    """The judge of a check in `dtype` with tolerance `tol` (the rest: Bf16's)."""
    if dtype in JUDGES:
        return JUDGES[dtype](tol, module, program, policy, overrides, model)
    return Flat(tol, model)
