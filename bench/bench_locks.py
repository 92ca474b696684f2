"""Benchmark: the real models' lock checks against their compute floor, and the zoo's full build
against its floor, in one run; one JSON object at the end.

    python bench/bench_locks.py [NAME ...] [--dtype float32 ...] [--steps N] [--no-zoo]

Per check (default: smollm2 qwen38 minilm gemma3 qwen3next, each at its config's dtypes) it uses
what `doit` made (build/weights/NAME, build/bundles/NAME: run `doit` first), runs
`python -m emitter lock BUNDLE --program … --weights … --dtype D --steps N -o R.json` as a child
(a hand lock: it computes its own VM) and prints the result's own `timings` (total_s: the lock's
wall time, imports excluded; vm_s, module_s, probe_s: the compute; setup_s: building the module
and load_weights, the load stage; judge_s: the judge's own work each step, the bf16 gate's
rounding floors, part of what the lock spends on itself) and `ratio` = (total − (vm + module + probe)) / (vm + module +
probe), the target 0.25 (issue 28); and the child's peak RSS (os.wait4) against the weights'
float32 size.

The zoo (unless --no-zoo): the working tree's files (tracked and untracked, not ignored) copied to
a fresh folder, `doit` there timed (`full_s`), then its imports alone timed again (build/weights
removed, `doit weights`: `imports_s`); its floor is the checks' compute (per program the VM once,
the largest vm_s of its checks, plus every check's module_s + probe_s, from the results the
build wrote) + the imports + one interpreter start that imports what a run imports (`start_s`);
`vs_floor` = full_s / floor, the target 1.3. Then the same full `doit` in another fresh copy with
`executor=dask:local workers=2` (`dask_local_full_s`).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RSS_TARGET, RATIO_TARGET, ZOO_TARGET = 1.5, 0.25, 1.3
NAMES = ["smollm2", "qwen38", "minilm", "gemma3", "qwen3next"]
COLUMNS = ("total_s", "vm_s", "module_s", "probe_s", "setup_s", "judge_s")


def _child(cmd, cwd=ROOT):
    """Run `cmd`; (exit status, wall seconds, peak RSS in bytes) of that child alone."""
    start = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, "PYTHONPATH": cwd},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    return os.waitstatus_to_exitcode(status), time.perf_counter() - start, usage.ru_maxrss * 1024


def weights_f32(program):
    """Float32 bytes of the program's weights: the leaves whose role is `weight`."""
    return sum(d.rows * d.cols * 4 for v, d in program.decls.items() if program.roles[v] == "weight")


def compute(t):
    """A check's compute floor: the VM's steps and the module's two passes."""
    return t.get("vm_s", 0.0) + t.get("module_s", 0.0) + t.get("probe_s", 0.0)


def ratio(t):
    """What the lock spends on itself, as a share of its compute."""
    c = compute(t)
    return (t["total_s"] - c) / c if c > 0 else None


def lock_row(pc, dtype, steps, size):
    """One hand lock of `pc` at `dtype`: its row (timings, ratio, peak RSS)."""
    out = os.path.join(ROOT, "build", "bench", f"{pc.name}.{dtype}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    rc, wall, rss = _child([sys.executable, "-m", "emitter", "lock", os.path.join("build", "bundles", pc.name),
                            "--program", pc.source, "--weights", pc.weights, "--dtype", dtype,
                            "--steps", str(steps), "-o", out])
    with open(out) as f:
        result = json.load(f)
    t = result["timings"]
    return {"program": pc.name, "dtype": dtype, "steps": steps, "verdict": result["verdict"],
            **{k: round(t.get(k, 0.0), 3) for k in COLUMNS},
            "other_s": round(t["total_s"] - compute(t), 3), "ratio": ratio(t) and round(ratio(t), 3),
            "wall_s": round(wall, 2), "peak_rss": rss, "weights_f32_bytes": size,
            "rss_ratio": round(rss / size, 3) if size else None}


def _copy_tree(dest):
    """The working tree's files (tracked and untracked, not ignored) copied into `dest`."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for n in filter(None, names):
        src = os.path.join(ROOT, n)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, n)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, n))


def zoo(keep=None):
    """A full `doit` of the zoo in a fresh copy, its imports alone, and its floor (see the doc)."""
    from emitter.pipeline.config import discover
    dest = keep or tempfile.mkdtemp(prefix="bench-locks-")
    try:
        _copy_tree(dest)
        doit = [sys.executable, "-m", "doit"]
        rc, full, _ = _child(doit, dest)
        _, start, _ = _child([sys.executable, "-c", "import doit, numpy, torch, emitter.tasks, "
                              "emitter.verify.lock, emitter.pipeline.lock_task"], dest)
        floors, checks = {}, 0
        for pc in discover(dest):
            rows = []
            for dtype in pc.dtypes:
                try:
                    with open(os.path.join(dest, "build", "results", pc.name, f"{dtype}.json")) as f:
                        rows.append(json.load(f)["timings"])
                except (OSError, ValueError, KeyError):
                    continue
            checks += len(rows)
            floors[pc.name] = max((t.get("vm_s", 0.0) for t in rows), default=0.0) + \
                sum(t.get("module_s", 0.0) + t.get("probe_s", 0.0) for t in rows)
        derived = [d for d in os.listdir(os.path.join(dest, "build", "weights"))]
        for d in derived:
            shutil.rmtree(os.path.join(dest, "build", "weights", d))
        _, imports, _ = _child(doit + ["weights"], dest)
        floor = sum(floors.values()) + imports + start
        dask = tempfile.mkdtemp(prefix="bench-locks-dask-")   # the same, on two Dask workers
        try:
            _copy_tree(dask)
            dask_rc, dask_full, _ = _child(doit + ["executor=dask:local", "workers=2"], dask)
        finally:
            shutil.rmtree(dask, ignore_errors=True)
        return {"exit": rc, "checks": checks, "full_s": round(full, 2), "imports_s": round(imports, 2),
                "dask_local_exit": dask_rc, "dask_local_full_s": round(dask_full, 2),
                "start_s": round(start, 2), "compute_s": round(sum(floors.values()), 2),
                "floor_s": round(floor, 2), "vs_floor": round(full / floor, 3), "target": ZOO_TARGET,
                "compute_by_program": {k: round(v, 3) for k, v in floors.items()}}
    finally:
        if keep is None:
            shutil.rmtree(dest, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=NAMES)
    ap.add_argument("--dtype", action="append", choices=("float32", "float64", "bfloat16"),
                    help="only these dtypes (default: each program's own)")
    ap.add_argument("--steps", type=int, help="decode steps (default: the program's config)")
    ap.add_argument("--no-zoo", action="store_true", help="skip the zoo's full build")
    ap.add_argument("--keep", help="build the zoo in this folder and keep it")
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    from emitter.language.reader import read_file
    from emitter.pipeline.config import discover

    configs = {pc.name: pc for pc in discover(ROOT)}
    _, _, floor_rss = _child([sys.executable, "-c", "import numpy, torch, emitter.verify.lock"])
    rows = []
    for name in args.names:
        pc = configs[name]
        if not os.path.isfile(os.path.join(ROOT, "build", "bundles", name, "model.py")) \
                or not os.path.isdir(pc.weights):
            print(f"{name}: no bundle or weights in build/: run `doit` first", file=sys.stderr)
            return 2
        size = weights_f32(read_file(pc.source))
        for dtype in [d for d in pc.dtypes if not args.dtype or d in args.dtype]:
            r = lock_row(pc, dtype, args.steps or pc.steps, size)
            rows.append(r)
            print(f"{name:10} {dtype:9} {r['verdict']:5} " + " ".join(f"{k[:-2]} {r[k]:6.2f}" for k in COLUMNS)
                  + f"  other {r['other_s']:5.2f}  ratio {r['ratio']}  peak {r['peak_rss'] / 2**20:.0f} MiB"
                  f" ({r['rss_ratio']}x weights)", file=sys.stderr)
    report = {"bench": "locks", "target_ratio": RATIO_TARGET, "floor_rss": floor_rss, "checks": rows,
              "worst_ratio": max((r["ratio"] for r in rows if r["ratio"] is not None), default=None)}
    if not args.no_zoo:
        report["zoo"] = zoo(args.keep)
        z = report["zoo"]
        print(f"zoo: full doit {z['full_s']} s against a floor of {z['floor_s']} s (compute "
              f"{z['compute_s']}, imports {z['imports_s']}, start {z['start_s']}): {z['vs_floor']}x; "
              f"on dask:local with 2 workers {z['dask_local_full_s']} s", file=sys.stderr)
    print(json.dumps(report))
    # (where the weights outweigh an interpreter with numpy and torch: a tiny model's peak is that)
    worst_rss = max((r["rss_ratio"] for r in rows if r["dtype"] == "float32" and r["rss_ratio"]
                     and r["weights_f32_bytes"] > floor_rss), default=0)
    return 0 if worst_rss <= RSS_TARGET else 3


if __name__ == "__main__":
    sys.exit(main())
