"""The lock check: the bundle as a user runs it, against the VM, leaf by leaf, op by op, step by step.

The module is built the way `model.py --weights` and compile.py build it: the bundle's own
`load_weights(directory, dtype)` and `LogosModule`. Then:
- a `load` stage: every leaf the module holds must be the VM's leaf in the lock's dtype, exactly
  (a wrong loader or fill is a failure naming the tensor);
- each step, a free pass: the module alone from the VM's states; its output and states after the
  step against the VM's, so a wrong write-back is named (state and step);
- then a probe pass: the module from the VM's states, its `tap` hook handing every stage the VM's
  values, so the first op that diverges is named even where the error would grow later. It comes
  second: a module could keep what the probe hands it and return it in a free pass after;
- once every step ran, step 1's free pass again against its first (emitter.verify.passes.replay):
  a module that reads a state of its own, not its buffer, gives other values.
What passes is the check's judge's (emitter.verify.judges): the dtype's tolerance, or in bfloat16
the per-op gate against each op's rounding floor. The VM's steps come from the program's shared
trace where there is one (emitter.verify.trace)."""

import hashlib
import math
import os
import time

import numpy as np

from ..fingerprint import sha256 as _sha256   # one stat cache: weights the keys hashed are not read again
from ..files import BUNDLE_FILES, size_text
from ..language.errors import ProgramError
from ..language.reader import read_file
from ..sambaflow.marks import program_name
from . import environment, heap, trace as trace_file, untouched, verdict, vm
from .compare import KEYS, compare, figures, worse, worst_of  # noqa: F401
from .leaf_check import exact_leaves, known_view_of, load_stage, unholdable
from .bundle_main import check_main
from .bundle_module import build_module, load_bundle_module, read_model as _read_model
from .fresh_inputs import feeding, integer_output, varied
from .judges import judge_for
from .passes import (as_main as called_as_main, excuse_tokens, fresh as fresh_instance, free_pass,
                     replay as replay_step_1, same_when_tapped, set_states, worst_value, writer)
from .probe import (BundleFault, CouldNotRun, Probe, Raised, Returned, absurd, changed_after_tap, output_label,
                    run_module, watched)
from .resident import Releasing, Resident, Watching, reads, worth_releasing
from .result import unfinished
from .tolerances import DEFAULT_TOLERANCES as TOLERANCES
from .weights_read import as_manifest as _as_manifest, still_as_read as _still_as_read, weights_digest


def _load_divergence(f):
    """The first divergence a leaf the load stage failed makes (`written`: the step after which
    the module was found to have written it)."""
    return {"step": f.get("written") or 0, "stage": "load", "out": f["leaf"], "line": f["line"],
            "op": "written while it ran" if f.get("written") else "load", **{k: f[k] for k in figures(f)}}


def _load_wins(result):
    """A leaf the load stage found wrong is the verdict (a fail, the leaf named) whatever stopped
    the check after it, unless the weights moved under the check (what it compared is not what
    its key names: stale_weights)."""
    f = ((result.get("load") or {}).get("failed") or [None])[0]
    if f is not None and not result.get("stale_weights"):
        result.update(verdict="fail", first_divergence=_load_divergence(f),
                      worst=worst_of([], result["load"]))


def _bundles_fault(result, e):
    """The result of a check the bundle's BundleFault `e` ended: a fail naming where (a leaf the
    load stage found wrong is the first divergence still)."""
    result.update(verdict="fail", reason=str(e), first_divergence={
        "step": e.step, **e.where, **{k: None for k in KEYS}, "raised": str(e)},
        worst={**e.where, "ratio": None, "max_abs": None, "guarded_rel": None})
    _load_wins(result)


def _label(program, index):
    st = program.stages[index]
    return {"stage": st.index, "out": st.out, "op": st.op.name, "line": st.line}


def _raised_label(program, e):
    """The label of the stage a module raised in; after the last stage, its write-backs."""
    if e.stage is not None:
        return _label(program, e.stage)
    if not program.states:   # (no write-back: on its way to the output)
        return output_label(program)
    if len(program.states) == 1:
        return writer(program, program.states[0])
    return {"stage": "write-back", "out": ", ".join(program.states) or program.output,
            "op": "write-back", "line": None}


def _raised_at(program, e, step):
    """(where the module raised, as a result records it; the first divergence that makes)."""
    label = _raised_label(program, e)
    return ({"step": step, **label, "in": e.where, "error": e.error},
            {"step": step, **label, **{k: None for k in KEYS}, "raised": e.error})


def _run(torch, model, dtype, program, leaves, steps, judge, timings, resident, loaded, golden=None, vm_steps=None,
         another=None, asked=None):
    """The stepwise comparison: (steps_detail, worst per stage, first divergence, output figures,
    where the module raised or None: the run stops at the step it raised in, {"replay", "fresh", "as_main"}:
    the passes after the last step, emitter.verify.passes; `another()` builds the module's new
    instance). Each step has a
    teacher-forced free pass (the module alone from the VM's states, so each step's error is its
    own), then a probe pass (every op on the VM's inputs): the free pass runs before the module is
    handed any of the step's VM values, which it could otherwise keep and hand back. Its VM step
    also goes to `golden` (a Golden) when given; `vm_steps`, the VM's steps
    (emitter.verify.trace.steps, given `asked`, a dict it puts the fresh pass's VM step in),
    computed here when not given.
    `judge` (emitter.verify.judges) says what passes: each stage after the probe pass, the
    output and each state after the free pass. `loaded`: leaf_check.exact_leaves."""
    current = dict(leaves)
    details, stages_worst, first, output_worst, argmax_all = [], {}, None, None, True
    integer = integer_output(program)
    feed = feeding(program)
    stage_reads = reads(program)
    raised = None
    returned = Returned(torch, program, model)   # what a caller keeps of the outputs
    for s in program.states:
        if not isinstance(getattr(model, "leaf_" + s, None), torch.Tensor):
            raise BundleFault(writer(program, s), f"the module holds no buffer `leaf_{s}` for the state `{s}`")
    watch = watched(program, model)
    own_first = None

    def compared(step, probe):
        nonlocal first
        for i, m in sorted(probe.results.items()):
            stages_worst[i] = worse(stages_worst.get(i), m)
            if first is None and not m["pass"]:
                first = {"step": step, **_label(program, i), **figures(m)}
    def known_view(index, value, want):   # a view of one leaf, the VM's by where it points
        read = stage_reads.get(index) or ()
        leaf = getattr(model, "leaf_" + read[0], None) if len(read) == 1 else None
        return leaf is not None and known_view_of(torch, value, want, read[0], leaf, leaves[read[0]],
                                                  resident, loaded)
    def judged(trace, probe, step):   # the judge on a step's probe pass, its time the judge's
        t = time.perf_counter()
        judge.step(torch, program, current, trace, probe, step, _label)
        timings["judge_s"] += time.perf_counter() - t
    asked = {} if asked is None else asked
    vm_steps = iter(vm_steps or trace_file.steps(program, leaves, steps, timings, fresh=asked))
    for step in range(1, steps + 1):
        start, trace = dict(current), next(vm_steps)
        if golden is not None:
            golden.add(step, trace)

        probe = Probe(torch, dtype, trace.stages, judge.tol, judge.precisions,
                      {st.index for st in program.stages if st.op.view}, known_view, watch,
                      {st.index for st in program.stages if st.op.integer})
        try:
            with torch.no_grad():
                # the free pass first, from the VM's states (teacher-forced): nothing of this
                # step's VM values has been handed to the module yet, so none can be handed back
                free_raised = None
                try:
                    out, written, late = free_pass(torch, model, program, current, resident, stage_reads,
                                                    timings, step, f"the free pass of step {step}", caller=returned)
                    late += returned.check(out, step, "free")
                    if judge.loose:
                        late += same_when_tapped(torch, model, program, current, resident, stage_reads, timings,
                                                 step, out, written)
                    if step == 1:   # what the replay and the pass as model.py's main calls it give again
                        own_first = (out.detach().double().numpy().copy(), written)
                except (Raised, BundleFault) as e:   # the probe pass still names what diverged before it
                    free_raised = e
                set_states(torch, model, program, current, step)
                model.probe = Releasing(probe, resident, stage_reads)
                t, let_go = time.perf_counter(), resident.seconds
                try:
                    pout = run_module(model, program, f"the probe pass of step {step}", step)
                finally:
                    timings["probe_s"] += time.perf_counter() - t - probe.seconds - (resident.seconds - let_go)
                    model.probe = None
                if free_raised is not None:
                    raise free_raised
                late = changed_after_tap(torch, program, model, pout, probe.handed) + late + \
                    returned.check(pout, step, "probe")
        except Raised as e:   # the stages compared before it still count (bf16: as its gate judges
            judged(trace, probe, step)   # them); the check stops here
            compared(step, probe)
            raised, at = _raised_at(program, e, step)
            first = first or at
            details.append({"step": step, "output": None, "states": {}, "pass": False,
                            "raised": e.error})
            break
        if len(probe.results) != len(program.stages):
            missing = [i for i in range(len(program.stages)) if i not in probe.results]
            raise BundleFault(_label(program, missing[0]), f"the module's forward never tapped stage "
                              f"{missing[0]}: the bundle does not match the program", step)
        judged(trace, probe, step)   # bf16: the rounding floors

        out_m = judge.compare(out.double().numpy(), trace.output)
        out_m["argmax_agree"] = bool(out.numel() == trace.output.size and   # (of any dtype: an integer one
                                     int(torch.argmax(out.double())) == int(np.argmax(trace.output)))   # too)
        if integer:
            got_i = np.rint(out.double().numpy()).astype(np.int64)
            out_m["integer_mismatches"] = int(np.count_nonzero(got_i != np.rint(trace.output)))
            out_m["pass"] = out_m["argmax_agree"] = out_m["integer_mismatches"] == 0   # (a token is its argmax)
            if out_m["integer_mismatches"] and feed is not None:
                judge.flip(out_m, probe, trace, feed, got_i)
        state_m = {s: judge.compare(written[s], trace.states[s], not program.real[s]) for s in program.states}
        if integer:   # (a token written back as the output flipped it: excused as it is)
            excuse_tokens(program, out_m, state_m, written, got_i)
        compared(step, probe)
        for s, m in state_m.items():
            if first is None and not m["pass"]:
                first = {"step": step, **writer(program, s), **figures(m)}
        if first is None and not out_m["pass"]:
            first = {"step": step, **output_label(program), **figures(out_m)}
        for label, message in late:   # changed after its stage, within the tolerance of the VM's
            first = first or {"step": step, **label, **{k: None for k in KEYS}, "raised": message}
        output_worst = worse(output_worst, out_m)
        argmax_all = argmax_all and out_m["argmax_agree"]
        ok = out_m["pass"] and all(m["pass"] for m in state_m.values()) and \
            all(m["pass"] for m in probe.results.values()) and not late
        details.append({"step": step, "output": out_m, "states": state_m, "pass": ok,
                        **({"changed_after_tap": [message for _, message in late]} if late else {})})
        current.update(trace.states)
    after = dict.fromkeys(("replay", "fresh", "as_main"))
    passes = {   # the passes after the steps, in order: (whether it runs, how, its result where it raised)
        "replay": (own_first is not None and program.states, lambda: replay_step_1(
            torch, model, program, leaves, resident, stage_reads, timings, judge, steps, own_first, integer, returned),
            {"output": None, "states": {}}),
        "fresh": (another is not None, lambda: fresh_instance(
            torch, model, another, program, leaves, start, trace, resident, stage_reads, timings, judge, steps,
            integer, feed, asked["ask"], returned, dtype), {"inputs": sorted(varied(program, leaves)), "same": False}),
        "as_main": (own_first is not None, lambda: called_as_main(
            torch, model, program, leaves, resident, stage_reads, timings, judge, steps, own_first, integer),
            {"output": None, "states": {}})}
    for name, (runs, run, broken) in passes.items():
        if raised is None and runs:
            try:
                after[name] = run()
                first = first or (after[name] or {}).get("first")
            except Raised as e:   # (as in a step: the bundle's fault, named where it raised)
                raised, at = _raised_at(program, e, 1 if name == "as_main" else steps)
                first = first or {**at, "after": name}
                after[name] = {"pass": False, **broken, "raised": e.error}
    stages = [{**_label(program, i), **figures(m), "pass": m["pass"]}
              for i, m in sorted(stages_worst.items())]
    output = None if output_worst is None else {**output_worst, "argmax_agree": argmax_all, "integer": integer}
    if feed is not None and output is not None:
        output["feeding"] = next((s for s in stages if s["stage"] == feed), None)
    return details, stages, first, output, raised, after


def lock_bundle(bundle_dir, program_path, weights_dir=None, dtype="float64", steps=1, atol=None,
                rtol=None, allow_nonfinite=(), max_tensor_bytes=None, golden=None, bf16_bounds=None,
                precision=None, weights_shas=None, golden_files=None, trace=None):
    """Lock one bundle, as it stands on disk, against its program; the RESULT.json dict (verdict
    pass, fail or error). A program whose tensors take more than `max_tensor_bytes` (float64) is
    refused before anything is allocated. Nothing is written: with `golden` ({dtype: tolerance})
    and `golden_files` (a dict), the files of the bundle's golden/ for `compile.py test` (the VM's
    outputs and stage summaries, {name: bytes}) are put into `golden_files` once every step ran,
    for the caller to write (`write_golden`). `trace`: the VM's trace file this check shares with
    its program's others ({"path", "key", "source", "environment"}: emitter.verify.trace), used
    only where the program read and this process's environment are those its key names."""
    start, watch, paused, before = time.perf_counter(), None, False, None
    result = unfinished(bundle_dir, program_path, weights_dir, dtype, steps, atol, rtol, None)
    tol = result["tolerance"]
    try:
        paused = heap.pause()
        if dtype not in TOLERANCES:
            raise CouldNotRun(f"dtype must be one of {', '.join(TOLERANCES)}, not {dtype!r}")
        if not all(math.isfinite(v) and v >= 0 for v in tol.values()):
            raise CouldNotRun(f"tolerances must be finite and >= 0, got {tol}")
        if steps < 1:
            raise CouldNotRun("steps must be at least 1")
        program = read_file(program_path)
        if max_tensor_bytes is not None and program.tensor_bytes > max_tensor_bytes:
            raise CouldNotRun(f"the program's tensors take {size_text(program.tensor_bytes)} in "
                              f"float64, over the limit of {size_text(max_tensor_bytes)} "
                              "(limits.tensor_bytes, and never past the machine's memory)")
        result["program"] = program_name(program.source)
        result["hashes"]["source"] = hashlib.sha256(program.source.encode("utf-8")).hexdigest()
        model_py = _read_model(os.path.join(bundle_dir, "model.py"))   # read once: hashed, then run
        for f in BUNDLE_FILES:
            p = os.path.join(bundle_dir, f)
            result["hashes"]["bundle"][f] = (_sha256(p) if os.path.isfile(p) else None) if f != "model.py" \
                else None if model_py is None else hashlib.sha256(model_py).hexdigest()
        leaves = vm.load_leaves(program, weights_dir, allow_nonfinite=allow_nonfinite)
        result["unmatched_weights"] = leaves.unmatched
        import torch
        threads = torch.get_num_threads()   # the check's own (its key's): a bundle setting another runs at it
        beyond = unholdable(torch, program, weights_dir, leaves, getattr(torch, dtype))
        if beyond:
            raise CouldNotRun(beyond)
        if weights_dir is not None:
            result["hashes"]["weights"] = weights_digest(weights_dir, leaves.sources)
            if weights_shas is None:   # by hand: the files as the VM read them (hashed just now)
                weights_shas = {f: _sha256(os.path.join(weights_dir, f)) for f in set(leaves.sources.values()) - {"declared"}}
            _as_manifest(result, weights_dir, leaves.sources, weights_shas)
        result["environment"] = environment.describe(np, torch)
        if model_py is None:
            raise CouldNotRun(f"{os.path.join(bundle_dir, 'model.py')}: no model.py in the bundle")
        # from the bundle's first line: a bundle reads its weights only (what the lock itself writes
        # meanwhile, its VM's trace, is its own wherever the store lies)
        watch = Watching(weights_dir, own=trace and os.path.dirname(os.path.dirname(trace["path"])),
                         files=[os.path.join(weights_dir, f) for f in set(leaves.sources.values()) - {"declared"}]
                         if weights_dir is not None else ())
        before = untouched.snapshot()   # (what the VM and the judges compute with, as the bundle finds it)
        module = load_bundle_module(bundle_dir, model_py, absurd(program))
        untouched.kept(before)
        if getattr(module, "PROGRAM", None) != result["program"]:
            raise CouldNotRun(f"the bundle is of program {getattr(module, 'PROGRAM', None)!r}, the source "
                              f"is {result['program']!r}: emit it again")
        torch_dtype = getattr(torch, dtype)
        files = {os.path.realpath(os.path.join(weights_dir, f)) for f in set(leaves.sources.values())
                 - {"declared"}} if weights_dir is not None else set()
        model, another = build_module(torch, module, program, weights_dir, torch_dtype, allow_nonfinite, files,
                                      lambda: load_bundle_module(bundle_dir, model_py, absurd(program)), threads)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        mapped = files if worth_releasing(leaves.values) else set()
        with Resident(model, program.leaves, mapped) as resident:
            hashed = {}
            result["load"] = load = load_stage(torch, model, program, leaves.values, torch_dtype,
                                               tol, resident, sums=hashed)
            result["timings"]["setup_s"] = time.perf_counter() - start
            judge = judge_for(dtype, tol, module, program, precision, bf16_bounds,
                              model if load["pass"] else None)   # its leaves: a floor's weights
            judge.watch(torch, program, leaves.values, torch_dtype, resident, load, hashed)
            keep = None
            if golden is not None and golden_files is not None:
                from .golden import Golden
                keep = Golden(bundle_dir, program, weights_dir, golden, weights_dir and {
                    f: _sha256(os.path.join(weights_dir, f)) for f in set(leaves.sources.values()) - {"declared"}})
            asked = {}
            vm_steps = trace_file.shared(trace, result, program, leaves.values, steps, lambda: weights_dir
                                         and _as_manifest(result, weights_dir, leaves.sources, weights_shas), asked)
            details, stages, first, output, raised, after = _run(
                torch, model, torch_dtype, program, leaves.values, steps, judge, result["timings"], resident,
                exact_leaves(model, program, load), keep, vm_steps, another, asked)
            load = result["load"] = judge.settled(load, replayed=any(after.values()))
            after["main"] = check_main(torch, module, model_py, weights_dir, steps, model)
            untouched.kept(before)
            before = None   # (nothing of the bundle's runs after it)
            first = first or (after["main"] or {}).get("first")
        opened = watch.stop()
        if weights_dir is not None:   # the maps read the files to the end: still those hashed?
            _still_as_read(result, weights_dir, leaves.sources, weights_shas, opened, watch.maybe)
        if opened:   # (though what it wrote was what the file held)
            raise BundleFault({"stage": "load", "out": None, "op": "load_weights", "line": None},
                              f"the bundle opened {min(opened)} to write, or made, linked, renamed, removed or "
                              f"chmod-ed it, while it ran ({len(opened)} path(s) of its weights folder): a bundle "
                              "reads its weights, never writes them")
        # a wrong leaf is the first divergence, whatever the module did then; one the module wrote
        # (`written`: the step it was seen after) is, unless a stage diverged at that step or before
        # (the free pass's output and states, compared after the probe pass, may have read it written)
        f = load["failed"][0] if load["failed"] else None
        w = f and f.get("written")   # (a pass after the steps, at the last: a leaf written then is named)
        if f and not (w and first and (first["step"] < w or first["step"] == w and isinstance(first["stage"], int)
                                       and not first.get("after"))):
            first = _load_divergence(f)
        result.update(steps_detail=details, stages=stages, first_divergence=first, output=output,
                      **judge.report(stages, load))
        if raised is not None:
            result["raised"] = raised
            at = verdict.where({k: raised[k] for k in ("stage", "out", "op", "line")})
            result["reason"] = f"the module raised at {at} in {raised['in']}: {raised['error']}"
            if load["pass"]:   # the stage that raised is the furthest from passing
                result["worst"] = {**{k: raised[k] for k in ("stage", "out", "op", "line")},
                                   "ratio": None, "max_abs": None, "guarded_rel": None}
        for name, r in after.items():
            if r is not None:
                result[name] = {k: v for k, v in r.items() if k != "first"}
        if raised is None:
            result["worst"] = worst_value(program, result) or result["worst"]
        result["verdict"] = "pass" if load["pass"] and all(d["pass"] for d in details) and \
            all(r is None or r["pass"] for r in after.values()) else "fail"
        if keep is not None and raised is None:   # a verdict, every step run: the VM's outputs
            golden_files.update(keep.files())
    except ProgramError as e:   # one that names no file is about the program
        result["reason"] = str(e.at(program_path))
    except CouldNotRun as e:
        result["reason"] = str(e)
        _load_wins(result)
    except BundleFault as e:   # (a leaf the load stage found wrong is the first divergence still)
        _bundles_fault(result, e)
    except (Exception, SystemExit) as e:  # anything else is still "could not run" (exit 2), never a fail,
        try:   # unless the bundle changed what the lock computes with (and the lock raised for it)
            if before is not None:
                untouched.kept(before)
            result["reason"] = f"the lock check raised {type(e).__name__}: {e}"
            _load_wins(result)
        except BundleFault as fault:
            _bundles_fault(result, fault)
    finally:
        if watch is not None:
            watch.stop()
        if before is not None:
            untouched.put_back(before)
        if paused:
            heap.resume()
    t = result["timings"]
    t["total_s"] = time.perf_counter() - start
    # what the lock itself adds per run beyond setup (imports, reading, hashing) and the two sides
    t["overhead_s"] = t["total_s"] - t.get("setup_s", t["total_s"]) - t["vm_s"] - t["module_s"] - t["probe_s"]
    t["probe_s"] = max(t["probe_s"], 0.0)
    return result
