"""Benchmark: a real model's lock check, its wall time and peak memory, per program and dtype.

    python bench/bench_locks.py [NAME ...] [--dtype float32 ...] [--steps N]

For each program (default: smollm2 gemma3) it uses what `doit` made (the weights in
build/weights/NAME, the bundle in build/bundles/NAME: run `doit lock:NAME` first), runs
`python -m emitter lock BUNDLE --program programs/NAME.logos --weights W --dtype D -o R.json` as
a child process and reads its wall time and peak RSS from `os.wait4`. Prints per lock the peak RSS,
the weights' float32 size (every leaf the program reads only as a parameter, once), their ratio
(the target for float32: within 1.5x), and the peak of a child that only imports what the lock
imports (python, numpy, torch: the floor no lock can go under); then one JSON line per lock.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = 1.5


def _child(cmd):
    """Run `cmd`; (exit status, wall seconds, peak RSS in bytes) of that child alone."""
    start = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                         stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    return os.waitstatus_to_exitcode(status), time.perf_counter() - start, usage.ru_maxrss * 1024


def weights_f32(program):
    """Float32 bytes of the program's weights: the leaves whose role is `weight`."""
    return sum(d.rows * d.cols * 4 for v, d in program.decls.items() if program.roles[v] == "weight")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=["smollm2", "gemma3"])
    ap.add_argument("--dtype", action="append", choices=("float32", "float64", "bfloat16"))
    ap.add_argument("--steps", type=int, help="decode steps (default: the program's config)")
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    from emitter.language.reader import read_file
    from emitter.pipeline.config import discover

    configs = {pc.name: pc for pc in discover(ROOT)}
    py = sys.executable
    _, _, floor = _child([py, "-c", "import numpy, torch, emitter.verify.lock"])
    print(f"floor: a python that imports numpy, torch and the lock peaks at {floor / 2**20:.0f} MiB")
    worst = 0.0
    for name in args.names:
        pc = configs[name]
        program = read_file(pc.source)
        size = weights_f32(program)
        bundle = os.path.join(ROOT, "build", "bundles", name)
        if not os.path.isfile(os.path.join(bundle, "model.py")) or not os.path.isdir(pc.weights):
            print(f"{name}: no bundle or weights in build/: run `doit lock:{name}` first")
            return 2
        for dtype in args.dtype or ["float32"]:
            out = os.path.join(ROOT, "build", "bench", f"{name}.{dtype}.json")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            steps = args.steps or pc.steps
            rc, wall, rss = _child([py, "-m", "emitter", "lock", bundle, "--program", pc.source,
                                    "--weights", pc.weights, "--dtype", dtype, "--steps", str(steps),
                                    "-o", out])
            with open(out) as f:
                result = json.load(f)
            ratio = rss / size
            if dtype == "float32":
                worst = max(worst, ratio)
            print(f"{name} [{dtype}, {steps} step(s)]: {result['verdict']}, wall {wall:.1f} s, peak RSS "
                  f"{rss / 2**20:.0f} MiB = {ratio:.2f}x the float32 weights ({size / 2**20:.0f} MiB); "
                  f"above the floor {(rss - floor) / 2**20:.0f} MiB = {(rss - floor) / size:.2f}x")
            print("  timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in result["timings"].items()))
            print(json.dumps({"bench": "lock", "program": name, "dtype": dtype, "steps": steps,
                              "verdict": result["verdict"], "wall_s": round(wall, 2), "peak_rss": rss,
                              "floor_rss": floor, "weights_f32_bytes": size, "ratio": round(ratio, 3),
                              "target": TARGET if dtype == "float32" else None}))
    return 0 if worst <= TARGET else 3


if __name__ == "__main__":
    sys.exit(main())
