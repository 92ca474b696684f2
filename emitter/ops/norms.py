"""Normalisations: rmsnorm (optionally fused with a residual add, across heads), l2norm, layernorm.

rmsnorm and layernorm take their epsilon from the sentence (`with epsilon 1e-5`; EPS, 1e-6, where it
is left out), since models differ there and the difference shows in their outputs; l2norm's is EPS."""


from .base import EPS, Op, ShapeError, divides, holds, same, np


def norm_view(a):
    """(nr, nc): the rows a norm works on, across H heads or X's own."""
    rows, cols = a.shape("X")
    if a.has("H"):
        h = a.int("H")
        divides(rows * cols, h, f"across {h} heads")
        return h, rows * cols // h
    return rows, cols


def rmsnorm_shape(a):
    _, nc = norm_view(a)
    if a.has("R"):
        same(a, "X", "R")
        if not a.has("W"):
            raise ShapeError("a fused-add rmsnorm (`plus R`) carries a weight (`with weight W`)")
    if a.has("W"):
        holds(a, "W", nc, "one per column of the normalised view")
    return a.shape("X")


def epsilon(a):
    """The sentence's epsilon, or EPS where it gives none."""
    return a.real("EPS", EPS)


def rmsnorm_vm(a):
    """Each row of the view: x / sqrt(mean(x²) + eps) · w."""
    x = a["X"] + a["R"] if a.has("R") else a["X"]
    nr, nc = norm_view(a)
    v = x.reshape(nr, nc)
    y = v / np.sqrt((v * v).mean(axis=1, keepdims=True) + epsilon(a))
    if a.has("W"):
        y = y * a["W"].reshape(1, nc)
    return y.reshape(x.shape)


def _normed(a):
    return f"{a.name('X')} + {a.name('R')}" if a.has("R") else a.name("X")


def rmsnorm_call(a):
    nr, nc = norm_view(a)
    w = a.name("W") if a.has("W") else "None"
    return f"rmsnorm({_normed(a)}, {w}, {nr}, {nc}, {epsilon(a)!r})"


def l2norm_shape(a):
    norm_view(a)
    return a.shape("X")


def l2norm_vm(a):
    """Each row of the view: x / sqrt(sum(x²) + eps)."""
    nr, nc = norm_view(a)
    v = a["X"].reshape(nr, nc)
    return (v / np.sqrt((v * v).sum(axis=1, keepdims=True) + EPS)).reshape(a["X"].shape)


def l2norm_call(a):
    nr, nc = norm_view(a)
    return f"l2norm({a.name('X')}, {nr}, {nc})"


def layernorm_shape(a):
    cols = a.shape("X")[1]
    holds(a, "W", cols, "one per column")
    holds(a, "B", cols, "one per column")
    return a.shape("X")


def layernorm_vm(a):
    """Per row: (x − mean) / sqrt(biased variance + eps) · w + b."""
    x = a["X"]
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon(a)) * a["W"].reshape(1, -1) + a["B"].reshape(1, -1)


def layernorm_call(a):
    return f"layernorm({a.name('X')}, {a.name('W')}, {a.name('B')}, {epsilon(a)!r})"


# in bfloat16 a norm's statistics are fp32 (the default precision); the bf16 gate bounds its excess
# at 32 and tests no gain (the output is renormalised)
OPS = (
    Op("rmsnorm", "rmsnorm of X [plus R] [with weight W] [across H heads] [with epsilon EPS]",
       shape=rmsnorm_shape, vm=rmsnorm_vm, call=rmsnorm_call, spelling="rmsnorm(x, w, nr, nc, eps)",
       ints=("H",), reals=("EPS",), params=("W",), excess=32.0, gain_test=False),
    Op("l2norm", "l2norm of X [across H heads]", shape=l2norm_shape, vm=l2norm_vm, call=l2norm_call,
       spelling="l2norm(x, nr, nc)", ints=("H",), excess=32.0, gain_test=False),
    Op("layernorm", "layernorm of X with weight W and bias B [with epsilon EPS]", shape=layernorm_shape,
       vm=layernorm_vm, call=layernorm_call, spelling="layernorm(x, w, b, eps)",
       reals=("EPS",), params=("W", "B"), excess=32.0, gain_test=False),
)
