"""The lock check's cost: VM time vs module forward time, and what the lock adds beyond them.

Target: the lock's own overhead under 20% of the VM and module time. Prints its figures; the
program is a decoder-like chain (8 blocks at width 512, with a KV table) on random weights.
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

import numpy as np  # noqa: E402

from emitter import emit_torch_module, read_file, write_bundle  # noqa: E402
from emitter.verify.lock import lock_bundle  # noqa: E402


def program(blocks=8, width=512, ffn=1536, rows=16):
    lines = [f"Let x0 be a 1 by {width} tensor of Real.", "Let pos be a 1 by 1 tensor of Int.",
             "Set item 1 of pos to 3."]
    for i in range(blocks):
        lines += [f"Let an{i} be a 1 by {width} tensor of Real.",
                  f"Let Wq{i} be a {width} by {width} tensor of Real.",
                  f"Let Wk{i} be a {width} by {width} tensor of Real.",
                  f"Let K{i} be a {rows} by {width} tensor of Real.",
                  f"Let Wg{i} be a {width} by {ffn} tensor of Real.",
                  f"Let Wu{i} be a {width} by {ffn} tensor of Real.",
                  f"Let Wd{i} be a {ffn} by {width} tensor of Real.",
                  f"Let h{i} be rmsnorm of x{i} with weight an{i}.",
                  f"Let q{i} be h{i} matmul Wq{i}.",
                  f"Let k{i} be h{i} matmul Wk{i}.",
                  f"Set row pos of K{i} to k{i}.",
                  f"Let a{i} be attention of q{i} over K{i} and K{i} with 8 heads 8 groups.",
                  f"Let r{i} be a{i} plus x{i}.",
                  f"Let g{i} be r{i} matmul Wg{i}.",
                  f"Let u{i} be r{i} matmul Wu{i}.",
                  f"Let s{i} be swiglu of g{i} and u{i}.",
                  f"Let d{i} be s{i} matmul Wd{i}.",
                  f"Let x{i + 1} be d{i} plus r{i}."]
    return "\n".join(lines) + "\n"


def main():
    d = tempfile.mkdtemp(prefix="bench_lock_")
    src = program()
    with open(os.path.join(d, "p.logos"), "w") as f:
        f.write(src)
    p = read_file(os.path.join(d, "p.logos"))
    os.makedirs(os.path.join(d, "w"))
    rng = np.random.default_rng(0)
    for name in p.leaves:
        dd = p.decls[name]
        if dd.real:
            scale = 1.0 / np.sqrt(dd.rows) if dd.rows > 1 else 1.0
            (rng.standard_normal((dd.rows, dd.cols)) * scale).astype("<f4").tofile(
                os.path.join(d, "w", name + ".f32"))
    write_bundle(emit_torch_module(src), os.path.join(d, "b"))
    size = sum(os.path.getsize(os.path.join(d, "w", f)) for f in os.listdir(os.path.join(d, "w")))
    print(f"program: {len(p.stages)} ops, {len(p.leaves)} leaves, weights {size / 2**20:.1f} MiB float32")
    for dtype in ("float64", "float32"):
        t = time.perf_counter()
        r = lock_bundle(os.path.join(d, "b"), os.path.join(d, "p.logos"), os.path.join(d, "w"), dtype, 3)
        wall = time.perf_counter() - t
        tm = r["timings"]
        work = tm["vm_s"] + tm["module_s"] + tm["probe_s"]
        print(f"{dtype}: verdict {r['verdict']}, wall {wall:.2f} s (3 steps)")
        print(f"  VM {tm['vm_s']:.3f} s | module free pass {tm['module_s']:.3f} s | module probe pass "
              f"{tm['probe_s']:.3f} s | setup (imports, reading, hashing) {tm['setup_s']:.3f} s")
        print(f"  VM / module forward: {tm['vm_s'] / tm['module_s']:.2f}x")
        print(f"  lock's own overhead (comparisons, bookkeeping): {tm['overhead_s']:.3f} s = "
              f"{100 * tm['overhead_s'] / work:.1f}% of VM + both module passes "
              f"(target < 20%: {'met' if tm['overhead_s'] < 0.2 * work else 'MISSED'})")
        print(f"  the probe pass costs {tm['probe_s'] / tm['module_s']:.2f}x a free forward "
              f"(counted as module time above)")


if __name__ == "__main__":
    main()
