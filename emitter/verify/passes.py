"""The module's free passes: alone, from the VM's states, as a user runs it. Each step has one
(emitter.verify.lock), and once every step ran, step 1's again (`replay`), which a module that
reads a state of its own fails."""

import time

import numpy as np

from .compare import figures
from .probe import BundleFault, as_arguments, held_sum, run_module
from .resident import as_a_user_runs


def writer(program, state):
    """The label of the last stage that writes `state` back."""
    st = [s for s in program.stages if s.writes == state][-1]
    return {"stage": "write-back", "out": state, "op": st.op.name, "line": st.line}


def free_pass(torch, model, program, states, resident, stage_reads, timings, step, what):
    """The module alone from `states` (the VM's), its inputs passed as forward's arguments:
    (its output, the states it wrote back, copies, and what a caller sees it do: [(label, message)])."""
    set_states(torch, model, program, states, step)
    inputs = [n for n in program.leaves if program.roles[n] == "input"]
    with as_arguments(torch, model, inputs) as args, as_a_user_runs(model, resident, stage_reads) as seen:
        sent = {n: held_sum(torch, a, a.dtype) for n, a in args.items()}
        t, let_go = time.perf_counter(), resident.seconds
        try:
            out = run_module(model, program, f"{what} (its inputs passed as arguments, their buffers NaN)"
                             if args else what, step, args, seen)
        finally:
            timings["module_s"] += time.perf_counter() - t - (resident.seconds - let_go)
        late = [({"stage": "argument", "out": n, "op": "input", "line": program.bound_at.get(n)},
                 f"{what} wrote into its argument `{n}`: a caller's input changes")
                for n, a in args.items() if held_sum(torch, a, a.dtype) != sent[n]]
    return out, {s: state_buffer(torch, model, program, s, step).detach().clone() for s in program.states}, late


def replay(torch, model, program, leaves, resident, stage_reads, timings, judge, steps, first, integer):
    """Step 1's free pass again once every step ran, from the same states and inputs, against
    what it gave the first time: a module whose forward reads its buffers and arguments alone
    gives it again; one that reads a state of its own (a copy of its cache it goes on writing)
    does not, though each step, handed the VM's states, matched the VM. {"pass", "output",
    "states"} and, where it fails, "first" (the first divergence it makes, at the last step: a
    leaf the module wrote then is named before it)."""
    out0, states0 = first
    with torch.no_grad():
        out, written, _ = free_pass(torch, model, program, leaves, resident, stage_reads, timings, 1,
                                     f"the free pass of step 1 again (after step {steps})")
    out_m = judge.compare(out.double().numpy(), out0, integer)
    state_m = {s: judge.compare(written[s], states0[s].double().numpy(), not program.real[s])
               for s in program.states}
    found = [({"stage": "output", "out": program.output, "op": "output",
               "line": program.bound_at.get(program.output)}, out_m)] if not out_m["pass"] else []
    found += [(writer(program, s), m) for s, m in state_m.items() if not m["pass"]]
    r = {"pass": not found, "output": figures(out_m), "states": {s: figures(m) for s, m in state_m.items()}}
    if found:
        label, m = found[0]
        r["first"] = {"step": steps, **label, **figures(m), "raised": (   # (after the last step)
            f"the free pass of step 1, run again after step {steps} from the same states and inputs, "
            "gave other values: the module reads something besides its buffers and arguments "
            "(a state it keeps of its own?)")}
    return r


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
