"""Emission time of a 600-sentence program (target: under 50 ms). Prints its figures."""

import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

from emitter import emit_program, emit_torch_module, read_program  # noqa: E402


def program(sentences=600):
    """A decoder-like chain: per block 2 weights declared, then norm, matmul, silu, plus, swiglu."""
    lines = ["Let x0 be a 1 by 64 tensor of Real.", "Let w be a 1 by 64 tensor of Real."]
    i = 0
    while len(lines) < sentences:
        lines += [f"Let W{i} be a 64 by 64 tensor of Real.",
                  f"Let U{i} be a 64 by 64 tensor of Real.",
                  f"Let n{i} be rmsnorm of x{i} with weight w.",
                  f"Let m{i} be n{i} matmul W{i}.",
                  f"Let u{i} be n{i} matmul U{i}.",
                  f"Let g{i} be swiglu of m{i} and u{i}.",
                  f"Let s{i} be silu of g{i}.",
                  f"Let x{i + 1} be s{i} plus x{i}."]
        i += 1
    return "\n".join(lines[:sentences]) + "\n"


def main():
    src = program()
    n = src.count("\n")
    emit_torch_module(src)  # warm the imports
    runs = {"read": [], "emit (read + render)": []}
    for _ in range(30):
        t = time.perf_counter()
        p = read_program(src)
        runs["read"].append(time.perf_counter() - t)
        t = time.perf_counter()
        emit_program(read_program(src))
        runs["emit (read + render)"].append(time.perf_counter() - t)
    print(f"program: {n} sentences, {len(p.stages)} ops, {len(p.leaves)} leaves")
    for k, v in runs.items():
        print(f"{k:>22}: median {statistics.median(v) * 1e3:.1f} ms, min {min(v) * 1e3:.1f} ms (30 runs)")
    med = statistics.median(runs["emit (read + render)"]) * 1e3
    print(f"target < 50 ms: {'met' if med < 50 else 'MISSED'} ({med:.1f} ms)")


if __name__ == "__main__":
    main()
