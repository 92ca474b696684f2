"""One small program per op form, with random leaves and the reference's expected output.

Each case: (id, leaf shapes, the op sentence, reference(values) -> output or (output, {state: value})).
Leaf values are drawn by `draw`; `tok`/`pos` leaves hold row numbers.
"""

import numpy as np

import reference as ref

CASES = [
    ("matmul", {"a": (3, 4), "b": (4, 2)}, "Let y be a matmul b.", lambda v: v["a"] @ v["b"]),
    ("plus", {"a": (3, 4), "b": (3, 4)}, "Let y be a plus b.", lambda v: v["a"] + v["b"]),
    ("plus broadcast", {"a": (3, 4), "b": (1, 4)}, "Let y be a plus b.", lambda v: v["a"] + v["b"]),
    ("hadamard", {"a": (2, 4), "b": (1, 4)}, "Let y be a hadamard b.", lambda v: v["a"] * v["b"]),
    ("rmsnorm", {"x": (2, 6)}, "Let y be rmsnorm of x.", lambda v: ref.rmsnorm(v["x"])),
    ("rmsnorm weight", {"x": (2, 6), "w": (1, 6)}, "Let y be rmsnorm of x with weight w.",
     lambda v: ref.rmsnorm(v["x"], v["w"])),
    ("rmsnorm heads", {"x": (1, 12), "w": (1, 4)}, "Let y be rmsnorm of x with weight w across 3 heads.",
     lambda v: ref.rmsnorm(v["x"], v["w"], heads=3)),
    ("rmsnorm plus", {"x": (1, 6), "r": (1, 6), "w": (1, 6)},
     "Let y be rmsnorm of x plus r with weight w.", lambda v: ref.rmsnorm(v["x"], v["w"], residual=v["r"])),
    ("rmsnorm epsilon", {"x": (1, 12), "w": (1, 4)},
     "Let y be rmsnorm of x with weight w across 3 heads with epsilon 0.25.",
     lambda v: ref.rmsnorm(v["x"], v["w"], heads=3, eps=0.25)),
    ("rmsnorm scientific epsilon", {"x": (2, 6), "r": (2, 6), "w": (1, 6)},
     "Let y be rmsnorm of x plus r with weight w with epsilon 1e-5.",
     lambda v: ref.rmsnorm(v["x"], v["w"], residual=v["r"], eps=1e-5)),
    ("l2norm", {"x": (2, 5)}, "Let y be l2norm of x.", lambda v: ref.l2norm(v["x"])),
    ("l2norm heads", {"x": (1, 8)}, "Let y be l2norm of x across 4 heads.",
     lambda v: ref.l2norm(v["x"], heads=4)),
    ("rope", {"q": (1, 12), "c": (1, 3), "s": (1, 3)}, "Let y be rope of q with cos c and sin s.",
     lambda v: ref.rope(v["q"], v["c"], v["s"])),
    ("rope partial", {"q": (1, 16), "c": (1, 2), "s": (1, 2)},
     "Let y be rope of q with cos c and sin s across 2 heads.",
     lambda v: ref.rope(v["q"], v["c"], v["s"], heads=2)),
    ("attention", {"q": (1, 12), "k": (5, 6), "v": (5, 6)},
     "Let y be attention of q over k and v with 4 heads 2 groups.",
     lambda v: ref.attention(v["q"], v["k"], v["v"], 4, 2)),
    ("full attention", {"q": (4, 6), "k": (4, 6), "v": (4, 6)},
     "Let y be full attention of q over k and v with 2 heads.",
     lambda v: ref.full_attention(v["q"], v["k"], v["v"], 2)),
    ("sigmoid", {"x": (2, 5)}, "Let y be sigmoid of x.", lambda v: ref.sigmoid(v["x"])),
    ("silu", {"x": (2, 5)}, "Let y be silu of x.", lambda v: ref.silu(v["x"])),
    ("gelu", {"x": (2, 5)}, "Let y be gelu of x.", lambda v: ref.gelu(v["x"])),
    ("exact gelu", {"x": (3, 7)}, "Let y be exact gelu of x.", lambda v: ref.exact_gelu(v["x"])),
    ("softmax", {"x": (3, 5)}, "Let y be softmax of x.", lambda v: ref.softmax(v["x"])),
    ("transpose", {"x": (2, 5)}, "Let y be transpose of x.", lambda v: v["x"].T),
    ("layernorm", {"x": (3, 5), "w": (1, 5), "b": (1, 5)},
     "Let y be layernorm of x with weight w and bias b.", lambda v: ref.layernorm(v["x"], v["w"], v["b"])),
    ("layernorm epsilon", {"x": (3, 5), "w": (1, 5), "b": (1, 5)},
     "Let y be layernorm of x with weight w and bias b with epsilon 1.0e-12.",
     lambda v: ref.layernorm(v["x"], v["w"], v["b"], eps=1e-12)),
    ("causal conv", {"x": (1, 4), "wc": (3, 4), "cs": (3, 4)},
     "Let y be causal conv of x with weight wc state cs over 3 taps.",
     lambda v: (lambda o, ring: (o, {"cs": ring}))(*ref.causal_conv(v["x"], v["wc"], v["cs"]))),
    ("decay", {"ar": (1, 3), "dt": (1, 3), "al": (1, 3)}, "Let y be decay of ar with bias dt rate al.",
     lambda v: ref.decay(v["ar"], v["dt"], v["al"])),
    ("gated delta", {"q": (1, 6), "k": (1, 6), "v": (1, 12), "z": (1, 12), "b": (1, 4), "a": (1, 4),
                     "st": (4, 9), "gn": (1, 3)},
     "Let y be gated delta of q over k and v with gate z beta b decay a state st norm gn "
     "with 4 heads 2 groups.",
     lambda v: (lambda o, s: (o, {"st": s}))(*ref.gated_delta(
         v["q"], v["k"], v["v"], v["z"], v["b"], v["a"], v["st"], v["gn"], 4, 2))),
    ("swiglu", {"g": (2, 5), "u": (2, 5)}, "Let y be swiglu of g and u.", lambda v: ref.swiglu(v["g"], v["u"])),
    ("hadamard row scale", {"a": (3, 4), "b": (3, 1)}, "Let y be a hadamard b.",
     lambda v: v["a"] * v["b"]),
    ("softmax routing", {"l": (4, 6)}, "Let y be softmax routing of l choosing 2.",
     lambda v: ref.softmax_routing(v["l"], 2, False)),
    ("softmax routing renormalised", {"l": (4, 8)},
     "Let y be softmax routing of l choosing 3 renormalised.",
     lambda v: ref.softmax_routing(v["l"], 3, True)),
    ("sigmoid routing", {"l": (3, 6)}, "Let y be sigmoid routing of l choosing 2.",
     lambda v: ref.sigmoid_routing(v["l"], None, 2)),
    ("sigmoid routing groups", {"l": (5, 16), "bias": (1, 16)},
     "Let y be sigmoid routing of l with bias bias choosing 3 in 2 of 4 groups renormalised "
     "scaled by 2.5.",
     lambda v: ref.sigmoid_routing(v["l"], v["bias"], 3, 2, 4, True, 2.5)),
    ("experts", {"x": (3, 4), "r": (3, 4), "wg": (4, 12), "wu": (4, 12), "wd": (12, 4)},
     "Let y be experts of x weighted by r with gate wg up wu down wd.",
     lambda v: ref.experts(v["x"], v["r"], v["wg"], v["wu"], v["wd"])),
    ("argmax", {"x": (3, 5)}, "Let y be argmax of x.", lambda v: ref.argmax(v["x"])),
    ("embedding literal", {"t": (6, 4)}, "Let y be row 4 of t.", lambda v: ref.row(v["t"], 4)),
    ("embedding tensor", {"t": (6, 4), "tok": (1, 1)}, "Let y be row tok of t.",
     lambda v: ref.row(v["t"], v["tok"][0, 0])),
]

# `Set row` binds nothing: its case ends with a read of the table so the program has an output.
SET_ROW_CASE = ("set row", {"t": (4, 3), "r": (1, 3), "pos": (1, 1)},
                "Set row pos of t to r.\nLet y be silu of t.",
                lambda v: (lambda t: (ref.silu(t), {"t": t}))(ref.set_row(v["t"], v["pos"][0, 0], v["r"])))

ALL_CASES = CASES + [SET_ROW_CASE]


def source(case):
    _, shapes, sentence, _ = case
    decls = "".join(f"Let {n} be a {r} by {c} tensor of Real.\n" for n, (r, c) in shapes.items())
    return decls + sentence + "\n"


def draw(case, seed=0):
    _, shapes, _, _ = case
    rng = np.random.default_rng(seed)
    values = {}
    for n, (r, c) in shapes.items():
        if n in ("tok", "pos"):
            values[n] = np.array([[2.0]])
        elif n == "a" and case[0] == "gated delta":
            values[n] = rng.uniform(0.2, 0.95, (r, c))
        elif n == "r":                     # routing weights: two experts per row, the rest 0
            two = np.tile(np.arange(c) < 2, (r, 1))
            values[n] = rng.uniform(0.1, 1.0, (r, c)) * rng.permuted(two, axis=1)
        elif case[0] == "exact gelu":       # out to the tails, where 1 + erf cancels
            values[n] = 4.0 * rng.standard_normal((r, c))
        else:
            values[n] = rng.standard_normal((r, c))
    return values


def expected(case, values):
    got = case[3](values)
    return got if isinstance(got, tuple) else (got, {})
