"""Make the small deterministic weights of the hand-written programs: weights/NAME/<var>.f64.

    python weights/make_small.py            # rewrite every directory
    python weights/make_small.py --check    # exit 1 if a committed file differs from what this makes

Every leaf of programs/NAME.logos that is listed below gets a file; the rest (states, which start
at zero, and tensors the program fills itself) keep their declared values. Each tensor's values
come from its own generator, seeded by (SEED, program name, variable name), so adding a tensor
changes no other. Shapes are read from the program, so a file always fits its declaration.

The files are compared byte for byte (--check, and a test runs it), so every value must come out
the same on every CPU. Normal draws are bitwise reproducible (numpy's Generator), and so are +, −,
×, ÷ and sqrt (IEEE exactly rounded). Transcendental functions (exp, cos, sin, power) are not:
NumPy computes them with SIMD kernels chosen for the CPU (AVX2, AVX-512, ...) whose results
differ in the last bit. So every value computed through one is snapped to the grid of multiples
of GRID = 2^−24 (snap: dividing by a power of two, rounding, multiplying back are all exact). A
wobble of an ulp or two before snapping changes the snapped value only if a midpoint between grid
points lies within it: a chance of about ulp/GRID per value, 2^−28 for a value in [1, 2).
"""

import argparse
import math
import os
import sys
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from emitter.language.reader import read_file  # noqa: E402

SEED = 20260512
GRID = 2.0 ** -24


def snap(x):
    """x rounded to the nearest multiple of GRID, exactly, so the same on every CPU (see above)."""
    return np.round(np.asarray(x, dtype=np.float64) / GRID) * GRID


def normal(scale=1.0):
    return lambda rng, r, c: scale * rng.standard_normal((r, c))


def fan_in(rng, r, c):
    """A matrix that keeps the activations' size: N(0, 1/rows)."""
    return rng.standard_normal((r, c)) / math.sqrt(r)


def near_one(rng, r, c):
    """A norm's weight: 1 + N(0, 0.1²)."""
    return 1.0 + 0.1 * rng.standard_normal((r, c))


def negative_rate(rng, r, c):
    """A decay rate −exp(A_log): negative, so (1 + e^(·))^rate lies in (0, 1). Snapped: exp."""
    return -snap(np.exp(0.5 * rng.standard_normal((r, c))))


def rope_table(fn, half=2, hd=4, theta=10000.0):
    """Row p: fn(p · theta^(−2i/hd)) for i < half, snapped to GRID (fn and the power vary by a few
    ulps between CPUs; the snap absorbs both)."""
    def make(rng, r, c):
        inv = theta ** (-2.0 * np.arange(half) / hd)
        return snap(fn(np.arange(r)[:, None] * inv[None, :]))
    return make


PROGRAMS = {
    "mlp": {"X": normal(), "W1": fan_in, "b1": normal(0.1), "W2": fan_in, "b2": normal(0.1),
            "Wg": fan_in, "Wu": fan_in, "Wd": fan_in},
    "norms": {"X": normal(), "R": normal(), "W": near_one, "Wh": near_one, "Lw": near_one,
              "Lb": normal(0.1)},
    "full_attention": {"X": normal(), "Wq": fan_in, "Wk": fan_in, "Wv": fan_in, "Wo": fan_in},
    "embedding": {"Emb": normal()},
    "rope_attention": {"x": normal(), "Wq": fan_in, "Wk": fan_in, "Wv": fan_in, "Wo": fan_in,
                       "Wlm": fan_in, "Cos": rope_table(np.cos), "Sin": rope_table(np.sin)},
    "delta": {"x": normal(), "WC": normal(0.5), "Wq": fan_in, "Wk": fan_in, "Wv": fan_in,
              "Wz": fan_in, "Wb": fan_in, "Wa": fan_in, "Dt": normal(0.5), "Alog": negative_rate,
              "GN": near_one, "Wo": fan_in},
    "moe": {"X": normal(), "Wr": normal(), "G": fan_in, "U": fan_in, "D": fan_in, "Sg": fan_in,
            "Su": fan_in, "Sd": fan_in, "Ws": fan_in, "Wr2": fan_in, "Bias": normal(0.1)},
}


def values(name):
    """{var: float64 array} for programs/NAME.logos."""
    program = read_file(os.path.join(ROOT, "programs", f"{name}.logos"))
    out = {}
    for var, make in PROGRAMS[name].items():
        d = program.decls[var]
        rng = np.random.default_rng([SEED, zlib.crc32(name.encode()), zlib.crc32(var.encode())])
        out[var] = np.asarray(make(rng, d.rows, d.cols), dtype="<f8").reshape(d.rows, d.cols)
    return out


def _head(path, size):
    """At most `size` bytes of `path`: a huge file is not read whole to say it differs."""
    with open(path, "rb") as f:
        return f.read(size)


def differing():
    """The files of weights/ that are not what this script makes (missing ones too)."""
    out = []
    for name in PROGRAMS:
        for var, value in values(name).items():
            path = os.path.join(HERE, name, f"{var}.f64")
            want = value.tobytes()
            if not os.path.isfile(path) or _head(path, len(want) + 1) != want:   # (a FIFO, a
                out.append(path)                    # device or a folder is not a file it made)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    if args.check:
        stale = differing()
        for path in stale:
            print(f"{path}: differs from what weights/make_small.py makes", file=sys.stderr)
        return 1 if stale else 0
    for name in PROGRAMS:
        directory = os.path.join(HERE, name)
        os.makedirs(directory, exist_ok=True)
        for var, value in values(name).items():
            path = os.path.join(directory, f"{var}.f64")
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(value.tobytes())
            os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
