"""The fixed parts of every bundle's compile.py, as a real module: a SambaFlow app that compiles
the bundle's model.py for the RDU, runs it, tests it against the VM's golden outputs that the lock
wrote into the bundle, and times it.

The emitter copies these functions verbatim into compile.py, which binds `bundle` to its model.py
module; the tests bind it to a bundle's module and call them. `test` and `measure-performance` run
on CPU where SambaFlow is absent; every line that touches the vendor SDK carries the TEMPLATE mark:
nobody here has run it.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

bundle = None  # compile.py: the bundle's model.py module


def add_args(parser):
    """The app's own arguments beside SambaFlow's."""
    parser.add_argument("--weights", default=None, help="directory of the leaves' files (<var>.f64, "
                        ".f32, .npy, or .safetensors files; default: the one the lock used, recorded "
                        "in golden/golden.json)")


def golden_record(weights=None):
    """(golden.json, its folder, the weights directory to use) of this bundle."""
    here = os.path.join(os.path.dirname(os.path.abspath(bundle.__file__)), "golden")
    path = os.path.join(here, "golden.json")
    if not os.path.isfile(path):
        raise SystemExit(f"{path}: no golden outputs: lock the bundle first (`doit lock:NAME`, "
                         "without cache=: a shared cache holds none; or `python -m emitter lock`)")
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    if record.get("program") != bundle.PROGRAM:   # an emit of another program over a locked bundle
        raise SystemExit(f"{path}: golden/ is of program {record.get('program')}, this bundle's model.py "
                         f"of {bundle.PROGRAM}: lock the bundle again (`doit lock:NAME`, or "
                         "`python -m emitter lock`)")
    if weights is None and record["weights"] is not None:
        weights = os.path.normpath(os.path.join(os.path.dirname(here), record["weights"]))
    return record, here, weights


def build(weights, dtype):
    """The module as model.py --weights builds it; a bad weights file is one line naming it."""
    try:
        return bundle.LogosModule(bundle.load_weights(weights, dtype) if weights else {}, dtype)
    except (ValueError, OSError) as e:
        raise SystemExit(f"compile.py: {e}") from None


def forward(model):
    """One step of the module; a bad input it meets (a row index out of its table) is one line."""
    try:
        with torch.no_grad():
            return model()
    except ValueError as e:
        raise SystemExit(f"compile.py: {e}") from None


def ratio(got, want, tol):
    """|got − want| as a share of the check's bound (abs + rel · max |want|): 1 is at the limit."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    bound = tol["abs"] + tol["rel"] * (float(np.abs(want).max()) if want.size else 0.0)
    diff = float(np.abs(got - want).max()) if want.size else 0.0
    return 0.0 if diff == 0 else diff / bound if bound > 0 else float("inf")


def other_weights(record, weights):
    """The files of `weights` that are not those golden/ was made from (golden.json's
    `weights_sha256`), each with why; [] where they are, or nothing is recorded."""
    import hashlib
    out = []
    for name, sha in sorted((record.get("weights_sha256") or {}).items()) if weights else ():
        h = hashlib.sha256()
        try:
            with open(os.path.join(weights, name), "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
        except OSError as e:
            out.append(f"{name} ({e.strerror})")
            continue
        if h.hexdigest() != sha:
            out.append(f"{name} (edited since)")
    return out


def cpu_test(args):
    """Each step's output against the golden one and the summarised stages against theirs, within
    the recorded tolerance of args.dtype; prints the worst and exits 0 or 1. The recorded weights
    folder's files that are not those golden/ was made from are named first: the outputs compared
    are then about others."""
    record, here, weights = golden_record(args.weights)
    if args.dtype is None:   # float32 where the lock recorded it, else what it recorded
        args.dtype = next((d for d in ("float32", "float64") if d in record["tolerances"]), "float32")
    tol = record["tolerances"].get(args.dtype)
    if tol is None:
        raise SystemExit(f"the lock recorded no tolerance for {args.dtype} "
                         f"(it has {', '.join(record['tolerances'])})")
    model = build(weights, getattr(torch, args.dtype))
    moved = other_weights(record, weights) if args.weights is None else []
    if moved:
        print(f"note: golden/ was made from other weights than {weights} holds: "
              f"{', '.join(moved[:3])}{' and more' if moved[3:] else ''}; lock the bundle again "
              "(`doit lock:NAME`) to compare with these", file=sys.stderr)
    seen = {}
    model.probe = lambda stage, value: seen.setdefault(stage, value)
    worst = (0.0, "nothing")
    for step in range(1, record["steps"] + 1):
        seen.clear()
        out = forward(model)
        want = np.fromfile(os.path.join(here, record["outputs"][step - 1]), dtype="<f8")
        r = ratio(out.double().reshape(-1).numpy(), want, tol)
        worst = max(worst, (r, f"the output `{record['output']}` at step {step}"))
        for s in record["stages"][step - 1]:
            value = seen[s["stage"]]
            flat = (value[0] if isinstance(value, tuple) else value).double().reshape(-1).numpy()
            got = [float(flat.mean()), float(np.sqrt(np.mean(flat * flat)))] + [float(x) for x in flat[:4]]
            r = ratio(got, [s["mean"], s["rms"]] + s["head"], tol)
            worst = max(worst, (r, f"stage {s['stage']} `{s['out']} = {s['op']}` at step {step}"))
    verdict = "PASS" if worst[0] <= 1.0 else "FAIL"
    print(f"{bundle.PROGRAM} [{args.dtype}, {record['steps']} step(s), weights {weights}]: {verdict}; "
          f"worst: {worst[1]} at {worst[0]:.3g}× the tolerance")
    return 0 if verdict == "PASS" else 1


def cpu_measure(args):
    """The module's forward on CPU, off the RDU: median milliseconds per step."""
    record, _, weights = golden_record(args.weights) if args.weights is None else (None, None, args.weights)
    model = build(weights, getattr(torch, args.dtype or "float32"))
    times = []
    forward(model)                                   # warm-up
    for _ in range(args.iterations):
        start = time.perf_counter()
        forward(model)
        times.append(time.perf_counter() - start)
    times.sort()
    print(json.dumps({"program": bundle.PROGRAM, "dtype": args.dtype or "float32", "device": "cpu",
                      "iterations": args.iterations, "threads": torch.get_num_threads(),
                      "median_ms": round(1000 * times[len(times) // 2], 3),
                      "min_ms": round(1000 * times[0], 3)}))
    return 0


def _positive(text):
    """A whole number of at least 1 (argparse's type)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return n


def cpu_main(argv):
    """`test` and `measure-performance` where SambaFlow is absent: on CPU, through model.py."""
    ap = argparse.ArgumentParser(prog="compile.py", description="the bundle on CPU (no SambaFlow here)")
    ap.add_argument("command", choices=["test", "measure-performance"])
    add_args(ap)
    ap.add_argument("--dtype", default=None, choices=["float32", "float64"],
                    help="default float32 (test: float64 where the lock recorded no float32 tolerance)")
    ap.add_argument("--iterations", type=_positive, default=20, help="measure-performance: timed steps")
    args = ap.parse_args(argv)
    return cpu_test(args) if args.command == "test" else cpu_measure(args)


def main(argv=None):
    """`compile`, `run`, `test` or `measure-performance` the bundle's program: through SambaFlow
    on a SambaNova host; `test` and `measure-performance` on CPU elsewhere."""
    argv = sys.argv[1:] if argv is None else list(argv)
    commands = ("compile", "run", "test", "measure-performance")
    if not argv or argv[0] not in commands:
        raise SystemExit(f"usage: compile.py {{{','.join(commands)}}} [options]: `test` checks the "
                         "bundle against its golden outputs, `measure-performance` times it")
    try:
        from sambaflow import samba  # TEMPLATE — SambaFlow API unverified
        import sambaflow.samba.utils as utils  # TEMPLATE — SambaFlow API unverified
        from sambaflow.samba.utils.argparser import parse_app_args  # TEMPLATE — SambaFlow API unverified
        from sambaflow.samba.utils.pef_utils import get_pefmeta  # TEMPLATE — SambaFlow API unverified
    except ImportError:
        if argv[0] in ("test", "measure-performance"):
            return cpu_main(argv)
        raise SystemExit("compile.py needs SambaNova's SambaFlow SDK (a SambaNova host) to "
                         f"`{argv[0]}`; `test` and `measure-performance` run on CPU here")
    args = parse_app_args(argv=argv, common_parser_fn=add_args)  # TEMPLATE — SambaFlow API unverified
    record, here, weights = golden_record(args.weights)
    model = build(weights, torch.float32)
    samba.from_torch_model_(model)  # TEMPLATE — SambaFlow API unverified
    inputs = [samba.from_torch_tensor(getattr(model, "leaf_" + n), name=n)  # TEMPLATE — SambaFlow API unverified
              for n in bundle.INPUTS]
    if args.command == "compile":
        samba.session.compile(model, inputs, None, name=args.pef_name or bundle.PROGRAM,  # TEMPLATE — SambaFlow API unverified
                              app_dir=args.output_folder, config_dict=vars(args),  # TEMPLATE — SambaFlow API unverified
                              pef_metadata=get_pefmeta(args, model))  # TEMPLATE — SambaFlow API unverified
        return 0
    utils.trace_graph(model, inputs, None, pef=args.pef, mapping=args.mapping)  # TEMPLATE — SambaFlow API unverified
    if args.command == "measure-performance":
        start = time.perf_counter()
        samba.session.run(input_tensors=inputs, output_tensors=model.output_tensors,  # TEMPLATE — SambaFlow API unverified
                          section_types=["fwd"])  # TEMPLATE — SambaFlow API unverified
        print(json.dumps({"program": bundle.PROGRAM, "device": "rdu",
                          "ms": round(1000 * (time.perf_counter() - start), 3)}))
        return 0
    outputs = samba.session.run(input_tensors=inputs, output_tensors=model.output_tensors,  # TEMPLATE — SambaFlow API unverified
                                section_types=["fwd"])  # TEMPLATE — SambaFlow API unverified
    out = samba.to_torch(outputs[0])  # TEMPLATE — SambaFlow API unverified
    if args.command == "run":
        print(bundle.OUTPUT, tuple(out.shape))
        return 0
    want = np.fromfile(os.path.join(here, record["outputs"][0]), dtype="<f8")
    r = ratio(out.double().reshape(-1).numpy(), want, record["tolerances"]["float32"])
    print(f"{bundle.PROGRAM} [rdu, step 1]: {'PASS' if r <= 1 else 'FAIL'}; output at {r:.3g}× the tolerance")
    return 0 if r <= 1 else 1
