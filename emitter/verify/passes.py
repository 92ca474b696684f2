"""The module's free passes: alone, from the VM's states, as a user runs it. Each step has one
(emitter.verify.lock); under bf16 the same again with its taps hooked, which must give it bit for
bit (`same_when_tapped`); once every step ran, step 1's again (`replay`), which a module that
reads a state of its own fails, and the last step's with other inputs by that instance and a new
one (`fresh`), which a module that computes from what it kept of an earlier call fails."""

import contextlib
import functools
import itertools
import math
import time

import numpy as np

from ..language.errors import ProgramError
from ..ops.experts import ROUTERS
from . import vm
from .compare import KEYS, figures
from .fresh_inputs import FreshStep, other_states, varied
from .probe import BundleFault, argument_label, as_arguments, held_sum, output_label, run_module, same_values
from .resident import Releasing, as_a_user_runs
from .rounding import rounded


def writer(program, state):
    """The label of the last stage that writes `state` back."""
    st = [s for s in program.stages if s.writes == state][-1]
    return {"stage": "write-back", "out": state, "op": st.op.name, "line": st.line}


def free_pass(torch, model, program, states, resident, stage_reads, timings, step, what, runs=as_a_user_runs,
              given=None, summed=False, caller=None, as_main=False):
    """The module alone from `states` (the VM's), its inputs passed as forward's arguments (`given`
    values where given, else its buffers'), autograd on (a user's call, a trace): (its output, the
    states it wrote back, copies (or `summed`, their held_sums), and what a caller sees it do:
    [(label, message)]). `runs`: how its taps are (as a user runs it: none of the lock's;
    `_tapped`). `caller` (probe.Returned): holds the arguments, as a caller does, for later passes
    to be checked against. `as_main`: called as model.py's main and compile.py call it instead:
    `model()`, its inputs in their buffers, autograd off."""
    set_states(torch, model, program, states, step)
    inputs = [n for n in program.leaves if program.roles[n] == "input"] if not as_main else []
    with as_arguments(torch, model, inputs, given) as args, runs(model, resident, stage_reads) as seen:
        sent = {n: held_sum(torch, a, a.dtype) for n, a in args.items()}
        hook = getattr(seen, "hook", None)
        t, let_go, own = time.perf_counter(), resident.seconds, getattr(hook, "seconds", 0.0)
        try:   # (autograd on, as a user's call and compile.py's trace have it: the buffers need no
            with torch.set_grad_enabled(not as_main):   # grad, so nothing is recorded)
                out = run_module(model, program, f"{what} (its inputs passed as arguments, their buffers NaN)"
                                 if args else what, step, args, seen)
        finally:
            timings["module_s"] += time.perf_counter() - t - (resident.seconds - let_go) - \
                (getattr(hook, "seconds", 0.0) - own)
        late = [(argument_label(program, n), f"{what} wrote into its argument `{n}`: a caller's input changes")
                for n, a in args.items() if held_sum(torch, a, a.dtype) != sent[n]]
        if caller is not None:
            caller.hold(args, step, "free")
    bufs = {s: state_buffer(torch, model, program, s, step).detach() for s in program.states}
    return out, {s: held_sum(torch, b, b.dtype) if summed else b.clone() for s, b in bufs.items()}, late


@contextlib.contextmanager
def _tapped(model, resident, stage_reads, hook=None):
    """A hook on the module's taps that hands each stage's value back as it came (`hook`'s, where
    given, sees it first; its weights are let go after it): the free pass, with its stages tapped."""
    model.probe = Releasing(hook, resident, stage_reads)
    try:
        yield model.probe
    finally:
        model.probe = None


class _Sums:
    """A tap hook that keeps (stage, held_sum of each of its values) of every tap, in order, and
    hands each value back as it came. A view's stage (`views`: a transposed table, 670 MB of
    gemma3's in float32, which a sum would copy whole) computes nothing: its values are its
    input's, and the stages that read it sum what they made of it."""

    def __init__(self, torch, views):
        self.torch, self.views, self.seen = torch, views, []
        self.seconds = 0.0   # (the lock's, not the module's)

    def __call__(self, index, value):
        t = time.perf_counter()
        values = value if isinstance(value, (tuple, list)) else (value,)
        self.seen.append((index, "view" if index in self.views else tuple(
            held_sum(self.torch, v.detach(), v.dtype) if isinstance(v, self.torch.Tensor) else repr(v)
            for v in values)))
        self.seconds += time.perf_counter() - t
        return value


def same_when_tapped(torch, model, program, states, resident, stage_reads, timings, step, out, written):
    """[(label, message)] where the free pass of `step` (`out`, `written`) and the same pass with a
    hook on the module's taps that hands each value back as it came differ, bit for bit: a module
    that computes otherwise when no hook is set (a path of its own for a user's run) has its
    stages judged, by the probe, on a path a user's run does not take. The bf16 judge asks it,
    which judges the free pass on its cosine and nmse alone (`loose`: emitter.verify.judges)."""
    what = f"the free pass of step {step} with its taps hooked"
    got, wrote, _ = free_pass(torch, model, program, states, resident, stage_reads, timings, step, what, _tapped)
    parts = [(output_label(program), out, got, "its output")]
    parts += [(writer(program, s), written[s], wrote[s], f"the state `{s}` it wrote back") for s in program.states]
    for label, a, b, which in parts:
        if not same_values(torch, a, b):
            return [(label, f"the free pass of step {step} and the same pass with a hook on its taps (each "
                            f"value handed back as it came) gave other values for {which}: the module computes "
                            "otherwise when no hook is set, so the stages the probe judged are not what a user's "
                            "run computes")]
    return []


def int_bounds(torch, program, model):
    """{Int state: the largest integer its module buffer holds exactly} (float32: 2^24)."""
    out = {}
    for s in program.states:
        buf = getattr(model, "leaf_" + s, None)
        if not program.real[s] and isinstance(buf, torch.Tensor):
            out[s] = 2.0 / torch.finfo(buf.dtype).eps if buf.dtype.is_floating_point else 2.0 ** 53
    return out


def excuse_tokens(program, out_m, state_m, written, tokens):
    """An Int state the module wrote back as its output's token, whose flip the judge excused
    (`out_m`), is excused as the output is."""
    for s, m in state_m.items():
        if out_m.get("flip_excused") and not m["pass"] and not program.real[s] and np.array_equal(
                written[s].double().numpy().reshape(-1), np.asarray(tokens).reshape(-1)):
            m.update(**{"pass": True, "flip_excused": True})


def named(step, label, after, raised, m=None):
    """The first divergence a pass after the steps names (`after`: "replay", "fresh", "as_main"), at `step`:
    where (`label`), its figures where it has some (`m`), and why."""
    return {"step": step, **label, **(figures(m) if m is not None else dict.fromkeys(KEYS)), "after": after,
            "raised": raised}


def failing(program, out_m, state_m):
    """[(label, figures)] of the output and the states that did not pass, the output first."""
    found = [] if out_m["pass"] else [(output_label(program), out_m)]
    return found + [(writer(program, s), m) for s, m in state_m.items() if not m["pass"]]


def fresh(torch, model, build, program, leaves, start, last, resident, stage_reads, timings, judge, steps, integer,
          feed, vm_fresh, caller=None, dtype=None):
    """The last step's free pass again, from the VM's states before it (`start`) and with other
    inputs where the program has some (`varied`; the inputs as they were where the VM refuses
    those, an index out of range), three times: by the instance that ran the steps and by a new one
    from the same weights (`build()`: (instance, "afresh" where model.py ran again, else why not)),
    each stage's values summed through a hook that hands them back as they came, which must agree
    bit for bit: one that computes from what it kept (on the instance, its class or its module; a
    copy of its cache of its own read for the earlier positions, which no output may show) fails,
    named at the first stage that differs; then by the first as a user runs it (no hook), against
    the VM's step on those inputs, judged as a step's free pass is (under bfloat16, on its cosine
    and nmse): a value outside the tolerance fails, named as not moving with its inputs where it is what the VM gave on the
    lock's own inputs (`last`: the VM's last step; a forward that ignores its input), else as
    right on the lock's own inputs alone (a branch on their values). Its states take other values
    too (a Real one its rows rolled and a ramp added, an Int one, a token or a position, the first
    of `other_states` the VM takes): the VM's step on all of it is `vm_fresh(other, tries, feed)`'s
    (a fresh_inputs.FreshStep).
    {"pass", "inputs", "varied_states" (those given other values), "same", "module", "output"?,
    "states"?} and, where it fails,
    "first" (at the last step); None where each would be step 1's first call again (no input to
    vary; one step, or no state)."""
    other, tries = varied(program, leaves), other_states(program, start, int_bounds(torch, program, model))
    if not other and not tries and not (steps > 1 and program.states):
        return None
    got = vm_fresh(other, tries, feed) if other or tries else FreshStep("", None, {}, ())
    trace, far, other = got.trace, got.far, {n: v for n, v in other.items() if n in got.other}
    env = {**leaves, **start, **far, **other}
    start = {**start, **far}
    varied_names = [*other, *far]   # (a few by name: a reason's cause comes after them, and views cut its end)
    what = f"the free pass of step {steps} again" + (f" with other values of {', '.join(varied_names[:4])}" + (
        f" and {len(varied_names) - 4} more" if len(varied_names) > 4 else "") if varied_names else "")
    given = {n: torch.from_numpy(v) for n, v in other.items()}
    against = {}
    if trace is not None:   # (first: the call after the replay's, whose arguments a caller holds)
        with torch.no_grad():
            out, written, late = free_pass(torch, model, program, start, resident, stage_reads, timings, steps,
                                           f"{what}, as a user runs it", given=given, caller=caller)
        late += caller.check(out, steps, "fresh") if caller is not None else []
        against = {"pass": False, "first": named(steps, late[0][0], "fresh", late[0][1])} if late else \
            _against(torch, program, judge, (trace, last), out, written, integer, feed, what, steps,
                     functools.partial(_rounded_step, torch, program, env, dtype, timings))
    r = {"pass": True, "inputs": sorted(other), "varied_states": sorted(far),
         **_both(torch, model, build, program, start, resident, stage_reads, timings, steps, what, given)}
    r.update({**against, "pass": r["pass"] and against.get("pass", True), "first": r.get("first") or against.get("first")})
    return {k: v for k, v in r.items() if v is not None}


def _rounded_step(torch, program, env, dtype, timings):
    """The VM's step on `env` with every Real leaf and state rounded to the module's `dtype` (None
    at float64): how far rounding what the program is given moves its own values there."""
    precision = {"torch.float32": "fp32", "torch.bfloat16": "bf16"}.get(str(dtype))
    if precision is None:
        return None
    t = time.perf_counter()
    try:
        return vm.step(program, {n: rounded(torch, v, precision) if program.real.get(n, False) else v
                                 for n, v in env.items()}, keep_stages=False)
    except ProgramError:
        return None
    finally:
        timings["fresh_s"] = timings.get("fresh_s", 0.0) + time.perf_counter() - t


def _ill_conditioned(judge, got, want, moved):
    """Whether `got` is off the VM's `want` by no more, at each value, than the tolerance and four
    times `moved` (how far the VM's own value moves when what it is given is rounded to the dtype;
    once under bfloat16, whose rounding moves an ill-conditioned program's values by far more than
    a right module's error: four times let a value 0.2 off pass delta at step 1): the dtype's
    rounding on inputs nobody chose, where they make the program ill-conditioned (a cancelling
    sum, a norm over a row a few ulps wide)."""
    g, w, r = (np.asarray(x.detach().double().numpy() if hasattr(x, "double") else x, np.float64).reshape(-1)
               for x in (got, want, moved))
    if g.shape != w.shape or w.shape != r.shape:
        return False
    with np.errstate(all="ignore"):
        bound = judge.tol["abs"] + judge.tol["rel"] * np.abs(w) + (1 if judge.loose else 4) * np.abs(r - w)
        return bool(np.all((np.abs(g - w) <= bound) | (np.isnan(g) & np.isnan(w))))


def after_a_choice(program):
    """The names whose values a choice (an argmax, a routing op) feeds within a step: the stages
    after one in the dataflow and the states they write. A state written before any choice (a
    key cache of the step's token) does not move with a flip of it."""
    fed = set()
    for st in program.stages:
        if st.op.integer or st.op.name in ROUTERS or fed.intersection(st.inputs):
            fed.update(n for n in (st.out, st.writes) if n)
    return fed


def _against(torch, program, judge, traces, out, written, integer, feed, what, steps, again=lambda: None):
    """The pass's output and states against the VM's step on the same inputs, judged as a step's
    free pass is (a near-tie's flipped token excused, and the states that follow it); a value
    outside the tolerance that is what the lock's own inputs gave (`traces`: the VM's last step)
    is named as not moving with its inputs: see `fresh`. Under bfloat16, a value a choice feeds
    (`after_a_choice`) fails only on that: its choices flip on near-ties of inputs nobody chose,
    which a step's probe excuses by their margins and this pass has no probe to."""
    (trace, last), got = traces, out.double().numpy()
    out_m = judge.compare(got, trace.output, integer)
    if integer and not out_m["pass"] and feed is not None:   # (a near-tie of the VM's: as in a step)
        judge.near_tie(out_m, trace.stages[feed], np.rint(got))
    cached = {st.writes for st in program.stages if st.op.name == "set row"}   # (judged row by row: no probe)
    state_m = {s: judge.compare(written[s], trace.states[s], not program.real[s], rows=s in cached)
               for s in program.states}
    excuse_tokens(program, out_m, state_m, written, np.rint(got))
    for m in state_m.values() if out_m.get("flip_excused") else ():   # (what the flipped token fed)
        m.update(**{"pass": True, "flip_excused": True} if not m["pass"] else {})
    parts = [(output_label(program), out_m, got, last.output, integer, "output")]
    parts += [(writer(program, s), state_m[s], written[s], last.states[s], not program.real[s], s)
              for s in program.states]
    chosen = after_a_choice(program) if judge.loose else set()
    moved = again() if any(not m["pass"] and not exact for _, m, _, _, exact, _ in parts) else None
    for _, m, mine, old, exact, name in parts:
        want, by = (trace.output, moved and moved.output) if name == "output" else \
            (trace.states[name], moved and moved.states[name])
        if not m["pass"] and not exact and by is not None and _ill_conditioned(judge, mine, want, by):
            m.update(**{"pass": True, "rounding_excused": True})
        m["stayed"] = not m["pass"] and judge.compare(mine, old, exact)["pass"]
        m["pass"] = m["pass"] or ((program.output if name == "output" else name) in chosen and not m["stayed"])
    r = {"output": {**figures(out_m), "pass": out_m["pass"]},
         "states": {s: {**figures(m), "pass": m["pass"]} for s, m in state_m.items()}}
    found = [p for p in parts if not p[1]["pass"]]
    if found:
        label, m = found[0][:2]
        why = ("gave what the VM gives on the lock's own inputs, not on these: the forward does not compute from "
               "its inputs") if m["stayed"] else (
               "computes otherwise than the VM on these values: the forward is right on the lock's own alone (a "
               "branch on their values, a token rounded on its way to a row index, or what it kept of them)")
        r.update({"pass": False, "first": named(steps, label, "fresh", f"{what}, by the instance that ran the steps "
                                                                        f"as a user runs it, {why}", m)})
    return r


def _both(torch, model, build, program, start, resident, stage_reads, timings, steps, what, given):
    views = {st.index for st in program.stages if st.op.view}
    sums = (_Sums(torch, views), _Sums(torch, views))
    with torch.no_grad():
        kept, kept_states, _ = free_pass(torch, model, program, start, resident, stage_reads, timings, steps,
                                         f"{what}, by the instance that ran the steps",
                                         functools.partial(_tapped, hook=sums[0]), given, summed=True)
        new, how = build()
        out, written, _ = free_pass(torch, new, program, start, resident, stage_reads, timings, steps,
                                    f"{what}, by a new instance", functools.partial(_tapped, hook=sums[1]), given,
                                    summed=True)
    stage = next((a if a != b else None for a, b in itertools.zip_longest(*(s.seen for s in sums))
                  if a != b), None)   # (the first stage whose values differ, or that one alone tapped)
    st = program.stages[stage[0]] if stage and isinstance(stage[0], int) and 0 <= stage[0] < len(program.stages) \
        else None
    differ = [({"stage": st.index, "out": st.out, "op": st.op.name, "line": st.line},
               f"stage {st.index} (`{st.out} = {st.op.name}`)")] if st else []
    differ += [(output_label(program), "its output")] if not same_values(torch, kept, out) else []
    differ += [(writer(program, s), f"the state `{s}` it wrote back") for s in program.states
               if kept_states[s] != written[s]]
    r = {"same": not differ, "module": how}
    if differ:
        r["pass"] = False
        r["first"] = named(steps, differ[0][0], "fresh", (
            f"{what}, by the instance that ran the steps and by a new one from the same weights (each handed the "
            f"VM's states before step {steps}), gave other values for {differ[0][1]}: the module computes from "
            "something it kept of an earlier call (a memo of its inputs, a copy of its cache of its own), not "
            "from what it is handed"))
    return r


def _step_1_again(torch, model, program, leaves, resident, stage_reads, timings, judge, steps, first, integer,
                  after, what, why, **how):
    """Step 1's free pass run again (`how`: free_pass's), against what it gave the first time
    (`first`: its output and states), judged as the dtype judges a step's (Int values exactly):
    {"pass", "output", "states"} and, where it fails, "first", `why` it fails, named `after`."""
    out0, states0 = first
    with torch.no_grad():
        out, written, _ = free_pass(torch, model, program, leaves, resident, stage_reads, timings, 1, what, **how)
    out_m = judge.compare(out.double().numpy(), out0, integer)
    state_m = {s: judge.compare(written[s], states0[s].double().numpy(), not program.real[s])
               for s in program.states}
    found = failing(program, out_m, state_m)
    r = {"pass": not found, "output": figures(out_m), "states": {s: figures(m) for s, m in state_m.items()}}
    if found:
        r["first"] = named(steps, found[0][0], after, why, found[0][1])
    return r


def replay(torch, model, program, leaves, resident, stage_reads, timings, judge, steps, first, integer, caller=None):
    """Step 1's free pass again once every step ran, from the same states and inputs, against
    what it gave the first time: a module whose forward reads its buffers and arguments alone
    gives it again; one that reads a state of its own (a copy of its cache it goes on writing)
    does not, though each step, handed the VM's states, matched the VM. {"pass", "output",
    "states"} and, where it fails, "first" (the first divergence it makes, at the last step: a
    leaf the module wrote then is named before it)."""
    return _step_1_again(
        torch, model, program, leaves, resident, stage_reads, timings, judge, steps, first, integer, "replay",
        f"the free pass of step 1 again (after step {steps})",
        f"the free pass of step 1, run again after step {steps} from the same states and inputs, gave other "
        "values: the module reads something besides its buffers and arguments (a state it keeps of its own?)",
        caller=caller)


def as_main(torch, model, program, leaves, resident, stage_reads, timings, judge, steps, first, integer):
    """Step 1's free pass again, last, called as model.py's main and compile.py call it (`model()`,
    its inputs in their buffers, autograd off: the one way of calling it no other pass takes),
    against what it gave the first time (its inputs as arguments, autograd on): a module that
    computes otherwise when called as a user's script calls it fails here, though every pass
    before matched the VM. {"pass", "output", "states"} and, where it fails, "first"."""
    return _step_1_again(
        torch, model, program, leaves, resident, stage_reads, timings, judge, steps, first, integer, "as_main",
        "step 1 again, as model.py's main calls it",
        "step 1, run again last as model.py's main and compile.py call it (`model()`: no arguments, its inputs in "
        "their buffers, autograd off), gave other values than its free pass (its inputs as arguments, autograd "
        "on): the module computes otherwise when a user's script calls it", as_main=True)


def state_buffer(torch, model, program, state, step=0):
    """The module's buffer of `state`, still a tensor of the state's shape: a forward that rebound
    it to another (`self.leaf_Vc = Vc.reshape(-1)`) wrote the state back wrong, where a caller's
    next step reads it (a BundleFault at the state's write-back, `step` the pass's)."""
    buf = getattr(model, "leaf_" + state, None)
    d = program.decls[state]
    if not isinstance(buf, torch.Tensor) or tuple(buf.shape) != (d.rows, d.cols):
        kind = f"of shape {tuple(buf.shape)}" if isinstance(buf, torch.Tensor) else f"a {type(buf).__name__}"
        raise BundleFault(writer(program, state), f"after its forward the module's buffer `leaf_{state}` is {kind}, "
                          f"not the state `{state}` ({d.rows} by {d.cols}): the forward rebound it, where a "
                          "caller's next step reads the state", step)
    return buf


def set_states(torch, model, program, values, step=0):
    for s in program.states:   # (one copy: into the buffer; a read-only map is copied to hand it on)
        v = np.asarray(values[s], np.float64)
        state_buffer(torch, model, program, s, step).copy_(torch.from_numpy(v if v.flags.writeable else v.copy()))


def worst_value(program, result):
    """The worst where no leaf and no stage fails but a value no stage covers does (the output or a
    write-back, of a step or of the fresh pass: a value wrong past its last op), the furthest of
    those from its tolerance; else None (the judge's stage stands). Under bfloat16 the gate names
    its own."""
    if result["load"]["failed"] or result.get("bf16") or any(not s["pass"] for s in result["stages"]):
        return None
    found = [x for d in result["steps_detail"] + [result.get("fresh")] if d and d.get("output") is not None
             for x in failing(program, d["output"], d.get("states") or {})]
    if not found:
        return None

    def ratio(m):   # (a value NaN or Inf on one side only is past any tolerance: no figure counts it)
        return math.inf if m.get("nonfinite_mismatch") else m.get("worst_ratio") or 0.0
    label, m = max(found, key=lambda x: ratio(x[1]))
    return {**label, "ratio": ratio(m), "max_abs": m.get("max_abs"), "guarded_rel": m.get("guarded_rel")}
