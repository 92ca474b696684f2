"""The bfloat16 gate against planted bugs: each bug of tests/bf16_bugs.py planted into the real
bundles of smollm2 and qwen38 (in a layer and from a start token chosen by the seed), and the good
bundles from the same seeds; prints, per bug and program, how many seeds the gate caught it on and
on how many the bug moved any bf16 value the module computes at all, and how many values it moved
(fewest-most over the seeds: a bug that changes no bit of what bf16 computes is beyond any bf16
gate, and one value is beyond telling from noise; the float64 lock, the semantic gate, catches them),
the false-alarm rate, and the bf16 lock's time beside the float32 lock's (wall and CPU seconds,
medians over the seeds, measured in the same run).

    python bench/bench_bf16.py [--seeds 3] [--first-seed 0] [--steps 3] [--programs smollm2,qwen38] [--bugs ...]

(after `doit lock:smollm2 lock:qwen38 lock:qwen3next`, which derive build/weights/). The mixtures
of experts (qwen3next, and moe: its input X drawn by the seed) also say how many routing flips the
gate excused on the good bundles, at what margins against the router's noise. More than one step matters:
the first step of a decode attends to one key, where softmax's precision and scale change nothing.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from bf16_bugs import BUGS  # noqa: E402
from emitter.language.reader import read_file  # noqa: E402
from emitter.sambaflow.emit import emit_program, write_bundle  # noqa: E402
from emitter.verify import bf16  # noqa: E402
from emitter.verify.lock import lock_bundle  # noqa: E402

# name: (the leaf the seed sets, layers, its range: a start token's vocabulary, or None for a real
# input drawn N(0, 1)), and its weights' folder
PROGRAMS = {"smollm2": ("tok", 30, 49152, "build/weights/smollm2"),
            "qwen38": ("Tok", 4, 128, "build/weights/qwen38"),
            "qwen3next": ("Tok", 4, 96, "build/weights/qwen3next"),
            "moe": ("X", 2, None, "weights/moe")}


def weights_from(src, dst, tok_name, token):
    """A weights folder of links to `src`'s files (hard links; copies where `src` is on another
    file system; a symbolic link leaving the folder is refused), the start token replaced (or the
    input `tok_name`, when `token` is an array)."""
    os.makedirs(dst)
    for f in os.listdir(src):
        if not f.startswith(f"{tok_name}.") and not f.startswith("."):
            try:
                os.link(os.path.join(src, f), os.path.join(dst, f))
            except OSError:
                shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    value = np.array([[float(token)]]) if np.isscalar(token) else token
    value.astype("<f8").tofile(os.path.join(dst, f"{tok_name}.f64"))
    return dst


class Prints:
    """Every value the module computed in the probe passes (each op on the VM's inputs), by step
    and stage, as float32 (which holds bf16 and fp32 values exactly): two bundles whose prints
    agree computed the same bits; `changed` counts the values where they do not."""

    def __init__(self):
        self.values, self._gate_step = {}, bf16.gate_step

    def __enter__(self):
        def spy(torch, program, current, trace, probe, gate, step, label):
            for i, v in probe.values.items():
                parts = v if isinstance(v, tuple) else (v,)   # (a stage of two values: gated delta's)
                self.values[(step, i)] = np.concatenate([np.asarray(x, dtype=np.float32).reshape(-1) for x in parts])
            return self._gate_step(torch, program, current, trace, probe, gate, step, label)
        bf16.gate_step = spy
        return self

    def __exit__(self, *exc):
        bf16.gate_step = self._gate_step

    def changed(self, other):
        return sum(int(np.count_nonzero(v != other.values[k])) if k in other.values else v.size
                   for k, v in self.values.items())


def timed_lock(bundle, path, weights, dtype, steps):
    wall, cpu = time.perf_counter(), time.process_time()
    r = lock_bundle(bundle, path, weights, dtype, steps)
    return r, time.perf_counter() - wall, time.process_time() - cpu


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds FIRST .. FIRST + SEEDS - 1")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--bugs", default=",".join(BUGS), help="comma-separated names of tests/bf16_bugs.py")
    args = ap.parse_args(argv)
    bugs = {b: BUGS[b] for b in args.bugs.split(",")}
    os.makedirs(os.path.join(ROOT, "build", "tmp"), exist_ok=True)   # beside build/weights: hard links
    tmp = tempfile.mkdtemp(prefix="bench_bf16_", dir=os.path.join(ROOT, "build", "tmp"))
    out = {"seeds": f"{args.first_seed}..{args.first_seed + args.seeds - 1}", "steps": args.steps,
           "caught": {}, "false_alarms": {}, "seconds": {}}
    try:
        for name in args.programs.split(","):
            tok_name, layers, vocab, folder = PROGRAMS[name]
            path = os.path.join(ROOT, "programs", f"{name}.logos")
            program = read_file(path)
            good = os.path.join(tmp, name, "good")
            write_bundle(emit_program(read_file(path), {}), good)
            text = open(os.path.join(good, "model.py")).read()
            alarms, times = 0, {"bfloat16": [], "float32": [], "bfloat16 cpu": [], "float32 cpu": []}
            flips, excused, margins = 0, 0, []
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                rng = np.random.default_rng(seed)
                if vocab is None:
                    d = program.decls[tok_name]
                    token = rng.standard_normal((d.rows, d.cols))
                else:
                    token = int(rng.integers(0, vocab))
                layer = int(rng.integers(0, layers))
                w = weights_from(os.path.join(ROOT, folder),
                                 os.path.join(tmp, name, f"w{seed}"), tok_name, token)
                r, wall, cpu = timed_lock(good, path, w, "float32", args.steps)
                times["float32"].append(wall)
                times["float32 cpu"].append(cpu)
                with Prints() as clean:
                    r, wall, cpu = timed_lock(good, path, w, "bfloat16", args.steps)
                times["bfloat16"].append(wall)
                times["bfloat16 cpu"].append(cpu)
                alarms += r["verdict"] != "pass"
                g = r.get("bf16") or {}
                flips += g.get("routing_flips", 0)
                excused += g.get("routing_excused", 0)
                margins += [f"{f['margin']:.2g} (noise {f['noise']:.2g})" for f in g.get("routing_margins", [])]
                if r["verdict"] != "pass":
                    print(f"false alarm: {name} seed {seed}: {r['verdict']} {r['reason']} "
                          f"{r['first_divergence']}", file=sys.stderr)
                for bug, plant in bugs.items():
                    try:
                        mutated = plant(text, layer)
                    except ValueError:
                        continue
                    bad = os.path.join(tmp, name, "bad")
                    shutil.rmtree(bad, ignore_errors=True)
                    shutil.copytree(good, bad)
                    with open(os.path.join(bad, "model.py"), "w") as f:
                        f.write(mutated)
                    with Prints() as prints:
                        r = lock_bundle(bad, path, w, "bfloat16", args.steps)
                    got = out["caught"].setdefault(f"{name}: {bug}", {"caught": 0, "visible": 0, "planted": 0,
                                                                      "values": []})
                    changed = prints.changed(clean)
                    visible = changed > 0
                    got["caught"] += r["verdict"] == "fail"
                    got["visible"] += visible
                    got["planted"] += 1
                    got["values"].append(changed)
                    if r["verdict"] != "fail":   # then the semantic gate's verdict on it
                        f64 = lock_bundle(bad, path, w, "float64", args.steps)["verdict"] == "fail"
                        got["float64"] = got.get("float64", 0) + f64
                        print(f"missed: {name} {bug} seed {seed} (layer {layer}, token {token}, {changed} "
                              f"values changed; float64 lock {'fails' if f64 else 'passes'} it): "
                              f"{r['verdict']} {r['reason']} {r.get('bf16')}", file=sys.stderr)
            out["false_alarms"][name] = f"{alarms}/{args.seeds}"
            if any(st.op.name.endswith("routing") for st in program.stages):
                out.setdefault("routing_flips", {})[name] = (
                    f"{flips} on good bundles, {excused} excused" + (f", margins {margins}" if margins else ""))
            sec = {d: round(float(np.median(t)), 2) for d, t in times.items()}
            sec["ratio"] = round(sec["bfloat16"] / sec["float32"], 2)
            sec["cpu ratio"] = round(sec["bfloat16 cpu"] / sec["float32 cpu"], 2)
            out["seconds"][name] = sec
        out["caught"] = {k: f"{v['caught']}/{v['planted']} caught, {v['visible']}/{v['planted']} visible in bf16 "
                            f"({min(v['values'])}-{max(v['values'])} values changed)"
                            + (f", the float64 lock fails {v['float64']} of the missed" if "float64" in v else "")
                         for k, v in out["caught"].items()}
        print(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
