"""The bfloat16 gate against planted bugs: each bug of tests/bf16_bugs.py planted into the real
bundles of smollm2 and qwen38 (in a layer and from a start token chosen by the seed), and the good
bundles from the same seeds; prints the catch rate per bug and program, the false-alarm rate, and
the bf16 lock's time beside the float32 lock's.

    python bench/bench_bf16.py [--seeds 3] [--steps 1]     (after `doit lock:smollm2 lock:qwen38`)
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
from emitter.verify.lock import lock_bundle  # noqa: E402

PROGRAMS = {"smollm2": ("tok", 30, 49152), "qwen38": ("Tok", 4, 128)}


def weights_from(src, dst, tok_name, token):
    """A weights folder of hard links to `src`'s files (a symbolic link leaving the folder is
    refused), the start token replaced."""
    os.makedirs(dst)
    for f in os.listdir(src):
        if not f.startswith(f"{tok_name}.") and not f.startswith("."):
            os.link(os.path.join(src, f), os.path.join(dst, f))
    np.array([[float(token)]]).astype("<f8").tofile(os.path.join(dst, f"{tok_name}.f64"))
    return dst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1)
    args = ap.parse_args(argv)
    os.makedirs(os.path.join(ROOT, "build", "tmp"), exist_ok=True)   # beside build/weights: hard links
    tmp = tempfile.mkdtemp(prefix="bench_bf16_", dir=os.path.join(ROOT, "build", "tmp"))
    out = {"seeds": args.seeds, "steps": args.steps, "caught": {}, "false_alarms": {}, "seconds": {}}
    try:
        for name, (tok_name, layers, vocab) in PROGRAMS.items():
            path = os.path.join(ROOT, "programs", f"{name}.logos")
            program = read_file(path)
            good = os.path.join(tmp, name, "good")
            write_bundle(emit_program(program, {}), good)
            text = open(os.path.join(good, "model.py")).read()
            alarms, times = 0, {"bfloat16": [], "float32": []}
            for seed in range(args.seeds):
                rng = np.random.default_rng(seed)
                token, layer = int(rng.integers(0, vocab)), int(rng.integers(0, layers))
                w = weights_from(os.path.join(ROOT, "build", "weights", name),
                                 os.path.join(tmp, name, f"w{seed}"), tok_name, token)
                for dtype in ("bfloat16", "float32"):
                    start = time.perf_counter()
                    r = lock_bundle(good, path, w, dtype, args.steps)
                    times[dtype].append(time.perf_counter() - start)
                    if dtype == "bfloat16":
                        alarms += r["verdict"] != "pass"
                        if r["verdict"] != "pass":
                            print(f"false alarm? {name} seed {seed}: {r['verdict']} {r['reason']} "
                                  f"{r['first_divergence']}", file=sys.stderr)
                for bug, plant in BUGS.items():
                    bad = os.path.join(tmp, name, f"{bug}-{seed}".replace(" ", "_").replace("%", ""))
                    shutil.copytree(good, bad)
                    try:
                        mutated = plant(text, layer)
                    except ValueError:
                        continue
                    with open(os.path.join(bad, "model.py"), "w") as f:
                        f.write(mutated)
                    r = lock_bundle(bad, path, w, "bfloat16", args.steps)
                    key = f"{name}: {bug}"
                    got = out["caught"].setdefault(key, [0, 0])
                    got[0] += r["verdict"] == "fail"
                    got[1] += 1
            out["false_alarms"][name] = f"{alarms}/{args.seeds}"
            out["seconds"][name] = {d: round(float(np.median(t)), 2) for d, t in times.items()}
            out["seconds"][name]["ratio"] = round(out["seconds"][name]["bfloat16"] / out["seconds"][name]["float32"], 2)
        out["caught"] = {k: f"{a}/{b}" for k, (a, b) in out["caught"].items()}
        print(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
