"""The lock check: the bundle's own `LogosModule` against the VM, output, op by op, state by state.

Each step runs the VM once and the module twice:
- a probe pass: the module starts from the VM's states, and its `tap` hook hands every stage the
  VM's values, so each op is compared on the VM's inputs and the first op that diverges is named
  even where the error would grow later;
- a free pass: the module runs alone, carrying its own states, and its output and states are
  compared with the VM's after every step (a wrong write-back shows at the next step).
"""

import hashlib
import importlib.util
import json
import math
import os
import platform
import sys
import time
import uuid

import numpy as np

from ..files import BUNDLE_FILES, write_atomic
from ..language.errors import ProgramError
from ..language.reader import read_file
from ..sambaflow.marks import program_name
from . import verdict, vm
from .tolerances import DEFAULT_TOLERANCES as TOLERANCES

SCHEMA = "logos.lock.result"


class CouldNotRun(Exception):
    """The lock could not compare at all (bad program, weights, bundle, or a module that raises)."""


def compare(got, want, tol):
    """Metrics of `got` (module) against `want` (VM), both float64 arrays of one shape."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return {"max_abs": math.inf, "max_rel": math.inf, "nmse": math.inf, "cosine": 0.0,
                "nonfinite_mismatch": 0, "worst_ratio": math.inf, "pass": False,
                "shape": [list(got.shape), list(want.shape)]}
    fin_g, fin_w = np.isfinite(got), np.isfinite(want)
    if fin_g.all() and fin_w.all():
        mismatch, g, w = 0, got.reshape(-1), want.reshape(-1)
    else:  # a NaN or Inf on one side only, or of another kind, is a mismatch by itself
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        mismatch = int(np.count_nonzero(fin_g != fin_w) + np.count_nonzero(~fin_g & ~fin_w & ~same))
        g, w = got[fin_g & fin_w], want[fin_g & fin_w]
    diff = np.abs(g - w)
    # rel is taken against the tensor's largest magnitude: rounding in a float32 sum scales with
    # its terms, so a small element of a large vector carries the vector's absolute error
    scale = float(np.abs(w).max()) if w.size else 0.0
    bound = tol["abs"] + tol["rel"] * scale
    nz = np.abs(w) > 0
    power = float(np.sum(w * w))
    norms = float(np.linalg.norm(g) * np.linalg.norm(w))
    with np.errstate(all="ignore"):
        m = {
            "max_abs": float(diff.max()) if diff.size else 0.0,
            "max_rel": float((diff[nz] / np.abs(w[nz])).max()) if nz.any() else 0.0,
            "scaled_err": float(diff.max() / scale) if diff.size and scale > 0 else 0.0,
            "nmse": float(np.sum(diff * diff) / power) if power > 0 else float(np.sum(diff * diff)),
            "cosine": float(np.dot(g, w) / norms) if norms > 0 else (1.0 if not diff.any() else 0.0),
            "nonfinite_mismatch": mismatch,
            "worst_ratio": float(np.where(diff == 0, 0.0, diff / bound).max()) if diff.size else 0.0,
        }
    m["pass"] = bool(mismatch == 0 and m["worst_ratio"] <= 1.0)
    return m


def _worse(a, b):
    """The comparison that is further from passing."""
    if a is None:
        return b
    return b if (not b["pass"], b["worst_ratio"]) > (not a["pass"], a["worst_ratio"]) else a


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def weights_digest(weights_dir, sources):
    """One sha256 over the leaf files the run read (name and content), or None for none."""
    files = sorted(f for f in sources.values() if f != "declared")
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f}\0{_sha(os.path.join(weights_dir, f))}\n".encode())
    return h.hexdigest()


def load_bundle_module(bundle_dir):
    """The bundle's model.py as a fresh module (its own LogosModule and helpers)."""
    path = os.path.join(bundle_dir, "model.py")
    if not os.path.isfile(path):
        raise CouldNotRun(f"{path}: no model.py in the bundle")
    name = f"logos_bundle_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the bundle is generated text: any failure to import is a finding
        raise CouldNotRun(f"{path}: importing the module failed: {type(e).__name__}: {e}") from None
    return module


class _Probe:
    """The module's `tap` hook in the probe pass: compare each stage with the VM, hand back the VM's."""

    def __init__(self, torch, dtype, program, vm_stages, tol):
        self.torch, self.dtype, self.program = torch, dtype, program
        self.vm_stages, self.tol = vm_stages, tol
        self.results = {}
        self.last = -1
        self.seconds = 0.0  # spent comparing and converting: the lock's, not the module's

    def to_torch(self, value):
        return self.torch.from_numpy(np.ascontiguousarray(value, dtype=np.float64)).to(self.dtype)

    def __call__(self, index, value):
        start = time.perf_counter()
        try:
            return self._compare(index, value)
        finally:
            self.seconds += time.perf_counter() - start

    def _compare(self, index, value):
        want = self.vm_stages[index]
        if isinstance(want, tuple):
            got = tuple(value) if isinstance(value, (tuple, list)) else (value,)
            if len(got) != len(want):
                raise CouldNotRun(f"stage {index} returned {len(got)} values, expected {len(want)}")
            m = None
            for g, w in zip(got, want):
                m = _worse(m, compare(g.detach().double().numpy(), w, self.tol))
            back = tuple(self.to_torch(w) for w in want)
        else:
            if isinstance(value, (tuple, list)):
                raise CouldNotRun(f"stage {index} returned {len(value)} values, expected one")
            m = compare(value.detach().double().numpy(), want, self.tol)
            back = self.to_torch(want)
        self.results[index] = m
        self.last = index
        return back


def _stage_label(program, index):
    st = program.stages[index]
    return {"stage": st.index, "out": st.out, "op": st.op.name, "line": st.line}


def _run(torch, module, dtype, program, leaves, steps, tol, timings):
    """The stepwise comparison; returns (steps_detail, worst per stage, first divergence, output)."""
    t = time.perf_counter()
    model = module.LogosModule({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in leaves.items()},
                               dtype)
    timings["setup_s"] += time.perf_counter() - t
    current = dict(leaves)
    details, stages_worst, first, output_worst, argmax_all = [], {}, None, None, True
    for step in range(1, steps + 1):
        t = time.perf_counter()
        trace = vm.step(program, current, keep_stages=True)
        timings["vm_s"] += time.perf_counter() - t

        own = {s: getattr(model, "leaf_" + s).clone() for s in program.states}
        probe = _Probe(torch, dtype, program, trace.stages, tol)
        with torch.no_grad():
            for s in program.states:
                getattr(model, "leaf_" + s).copy_(torch.from_numpy(np.asarray(current[s], np.float64)))
            model.probe = probe
            t = time.perf_counter()
            try:
                model()
            except CouldNotRun:
                raise
            except Exception as e:  # a helper that raises is a finding about the bundle
                nxt = probe.last + 1
                where = (f" at stage {nxt} ({program.stages[nxt].out} = {program.stages[nxt].op.name}, "
                         f"line {program.stages[nxt].line})") if nxt < len(program.stages) else ""
                raise CouldNotRun(f"the module raised{where}: {type(e).__name__}: {e}") from None
            finally:
                timings["probe_s"] += time.perf_counter() - t - probe.seconds
                model.probe = None
            for s in program.states:
                getattr(model, "leaf_" + s).copy_(own[s])
            t = time.perf_counter()
            try:
                out = model()
            except Exception as e:
                raise CouldNotRun(f"the module raised in step {step}: {type(e).__name__}: {e}") from None
            timings["module_s"] += time.perf_counter() - t

        out_m = compare(out.double().numpy(), trace.output, tol)
        out_m["argmax_agree"] = bool(out.numel() == trace.output.size and
                                     int(torch.argmax(out)) == int(np.argmax(trace.output)))
        state_m = {s: compare(getattr(model, "leaf_" + s).double().numpy(), trace.states[s], tol)
                   for s in program.states}
        for i, m in sorted(probe.results.items()):
            stages_worst[i] = _worse(stages_worst.get(i), m)
            if first is None and not m["pass"]:
                first = {"step": step, **_stage_label(program, i),
                         **{k: m[k] for k in ("max_abs", "max_rel", "scaled_err", "nmse", "worst_ratio")}}
        if len(probe.results) != len(program.stages):
            missing = [i for i in range(len(program.stages)) if i not in probe.results]
            raise CouldNotRun(f"the module's forward never tapped stage {missing[0]}: "
                              "the bundle does not match the program")
        output_worst = _worse(output_worst, out_m)
        argmax_all = argmax_all and out_m["argmax_agree"]
        ok = out_m["pass"] and all(m["pass"] for m in state_m.values()) and \
            all(m["pass"] for m in probe.results.values())
        details.append({"step": step, "output": out_m, "states": state_m, "pass": ok})
        current.update(trace.states)
    stages = [{**_stage_label(program, i), **{k: m[k] for k in
               ("max_abs", "max_rel", "scaled_err", "nmse", "cosine", "worst_ratio", "pass")}}
              for i, m in sorted(stages_worst.items())]
    return details, stages, first, {**output_worst, "argmax_agree": argmax_all}


def lock_bundle(bundle_dir, program_path, weights_dir=None, dtype="float64", steps=1, atol=None,
                rtol=None):
    """Lock one bundle against its program; the RESULT.json dict (verdict pass, fail or error)."""
    start = time.perf_counter()
    tol = dict(TOLERANCES.get(dtype, TOLERANCES["float32"]))
    if atol is not None:
        tol["abs"] = float(atol)
    if rtol is not None:
        tol["rel"] = float(rtol)
    result = {
        "schema": SCHEMA, "version": 1, "program": None,
        "name": os.path.splitext(os.path.basename(str(program_path)))[0],
        "program_path": str(program_path), "bundle": str(bundle_dir),
        "weights": None if weights_dir is None else str(weights_dir), "dtype": dtype, "steps": steps,
        "verdict": "error", "reason": None, "tolerance": tol, "output": None,
        "first_divergence": None, "stages": [], "steps_detail": [],
        "timings": {"vm_s": 0.0, "module_s": 0.0, "probe_s": 0.0},
        "hashes": {"source": None, "bundle": {}, "weights": None},
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "torch": None},
        "unmatched_weights": [],
    }
    try:
        if dtype not in TOLERANCES:
            raise CouldNotRun(f"dtype must be float64 or float32, not {dtype!r}")
        if not all(math.isfinite(v) and v >= 0 for v in tol.values()):
            raise CouldNotRun(f"tolerances must be finite and >= 0, got {tol}")
        if steps < 1:
            raise CouldNotRun("steps must be at least 1")
        program = read_file(program_path)
        result["program"] = program_name(program.source)
        result["hashes"]["source"] = hashlib.sha256(program.source.encode("utf-8")).hexdigest()
        for f in BUNDLE_FILES:
            p = os.path.join(bundle_dir, f)
            result["hashes"]["bundle"][f] = _sha(p) if os.path.isfile(p) else None
        leaves = vm.load_leaves(program, weights_dir)
        result["unmatched_weights"] = leaves.unmatched
        if weights_dir is not None:
            result["hashes"]["weights"] = weights_digest(weights_dir, leaves.sources)
        import torch
        result["versions"]["torch"] = torch.__version__
        module = load_bundle_module(bundle_dir)
        if getattr(module, "PROGRAM", None) != result["program"]:
            raise CouldNotRun(f"the bundle is of program {getattr(module, 'PROGRAM', None)!r}, the source "
                              f"is {result['program']!r}: emit it again")
        result["timings"]["setup_s"] = time.perf_counter() - start  # the module's build adds to it
        details, stages, first, output = _run(torch, module, getattr(torch, dtype), program,
                                              leaves.values, steps, tol, result["timings"])
        result.update(steps_detail=details, stages=stages, first_divergence=first, output=output)
        result["verdict"] = "pass" if all(d["pass"] for d in details) else "fail"
    except (ProgramError, CouldNotRun) as e:
        result["reason"] = str(e)
    except Exception as e:  # anything else is still "could not run" (exit 2), never a numeric fail
        result["reason"] = f"the lock check raised {type(e).__name__}: {e}"
    t = result["timings"]
    t["total_s"] = time.perf_counter() - start
    # what the lock itself adds per run beyond setup (imports, reading, hashing) and the two sides
    t["overhead_s"] = t["total_s"] - t.get("setup_s", t["total_s"]) - t["vm_s"] - t["module_s"] - t["probe_s"]
    t["probe_s"] = max(t["probe_s"], 0.0)
    return result


def write_result(result, path):
    write_atomic(path, json.dumps(result, indent=2, allow_nan=True) + "\n")


EXIT = {"pass": 0, "fail": 1, "error": 2}


def add_arguments(p):
    p.add_argument("bundle", help="bundle directory (model.py, manifest.json, compile.py)")
    p.add_argument("--program", required=True, help="PROGRAM.logos the bundle was emitted from")
    p.add_argument("--weights", help="directory of <var>.f64 / <var>.f32 files")
    p.add_argument("--dtype", default="float64", choices=sorted(TOLERANCES))
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--atol", type=float, help="absolute tolerance (default by dtype)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default by dtype)")
    p.add_argument("-o", "--out", required=True, help="RESULT.json")


def main(args):
    r = lock_bundle(args.bundle, args.program, args.weights, args.dtype, args.steps, args.atol, args.rtol)
    write_result(r, args.out)
    print(f"{r['name']} [{r['steps']} step(s)] {verdict.line(r)}", file=sys.stderr if r["verdict"] != "pass" else sys.stdout)
    return EXIT[r["verdict"]]
