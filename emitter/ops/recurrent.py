"""Recurrent layers of one decode step, each carrying a state: causal conv (a ring of the last
inputs), decay (the Gated DeltaNet forget gate) and gated delta (the delta-rule memory)."""

import math


from .base import EPS, Op, ShapeError, fmt, holds, divides, np_silu, row_vector, same, np


def conv_shape(a):
    row_vector(a, "X")
    taps, cols = a.int("T"), a.shape("X")[1]
    for p in ("WC", "CS"):
        if a.shape(p) != (taps, cols):
            raise ShapeError(f"`{a.name(p)}` is {fmt(a.shape(p))}, must be {taps} taps by {cols}")
    return a.shape("X")


def conv_vm(a):
    """The ring drops its oldest row and takes X; (column sums of ring ⊙ WC, the new ring)."""
    ring = np.concatenate([a["CS"][1:], a["X"]], axis=0)
    return (ring * a["WC"]).sum(axis=0, keepdims=True), ring


def conv_call(a):
    return f"causal_conv({a.name('X')}, {a.name('WC')}, {a.name('CS')})"


def decay_shape(a):
    same(a, "Ar", "Dt")
    same(a, "Ar", "Alog")
    return a.shape("Ar")


def decay_vm(a):
    """Elementwise (1 + e^(Ar + Dt)) ^ Alog."""
    return np.power(1.0 + np.exp(a["Ar"] + a["Dt"]), a["Alog"])


def decay_call(a):
    return f"decay({a.name('Ar')}, {a.name('Dt')}, {a.name('Alog')})"


def delta_dims(a):
    """(hv, hk, d) of a gated delta step."""
    hv, hk = a.int("HV"), a.int("HK")
    row_vector(a, "Q")
    divides(a.shape("Q")[1], hk, f"{hk} key heads")
    d = a.shape("Q")[1] // hk
    same(a, "Q", "K")
    for p in ("V", "Z"):
        if a.shape(p) != (1, hv * d):
            raise ShapeError(f"`{a.name(p)}` is {fmt(a.shape(p))}, must be 1 by {hv * d} "
                             f"({hv} value heads of {d})")
    holds(a, "B", hv, "one per value head")
    holds(a, "A", hv, "one per value head")
    holds(a, "S", hv * d * d, f"{hv} value heads of {d} by {d}")
    holds(a, "GN", d, "one per head column")
    return hv, hk, d


def delta_shape(a):
    hv, _, d = delta_dims(a)
    return 1, hv * d


def delta_vm(a):
    """Value head h reads key head h mod HK. u = S k; S ← α S + β (v − α u) kᵀ; o = S q / sqrt(d);
    out = gn · o / sqrt(mean(o²) + eps) · silu(z). Returns (out, the new memory)."""
    hv, hk, d = delta_dims(a)
    state = a["S"].reshape(hv, d, d).copy()
    q, k = a["Q"].reshape(hk, d), a["K"].reshape(hk, d)
    v, z = a["V"].reshape(hv, d), a["Z"].reshape(hv, d)
    beta, alpha = a["B"].reshape(hv), a["A"].reshape(hv)
    gn = a["GN"].reshape(d)
    out = np.empty((hv, d))
    for h in range(hv):
        kh, qh = k[h % hk], q[h % hk]
        u = state[h] @ kh
        state[h] = alpha[h] * state[h] + np.outer(beta[h] * (v[h] - alpha[h] * u), kh)
        o = state[h] @ qh / math.sqrt(d)
        out[h] = gn * (o / np.sqrt(np.mean(o * o) + EPS)) * np_silu(z[h])
    return out.reshape(1, hv * d), state.reshape(a["S"].shape)


def delta_call(a):
    hv, hk, d = delta_dims(a)
    names = ", ".join(a.name(p) for p in ("Q", "K", "V", "Z", "B", "A", "S", "GN"))
    return f"gated_delta({names}, {hv}, {hk}, {d})"


OPS = (
    Op("causal conv", "causal conv of X with weight WC state CS over T taps", shape=conv_shape,
       vm=conv_vm, call=conv_call, spelling="causal_conv(x, wc, cs)",
       ints=("T",), params=("WC",), writes="CS"),
    Op("decay", "decay of Ar with bias Dt rate Alog", shape=decay_shape, vm=decay_vm,
       call=decay_call, spelling="decay(ar, dt, alog)", params=("Dt", "Alog")),
    Op("gated delta", "gated delta of Q over K and V with gate Z beta B decay A state S norm GN "
       "with HV heads HK groups", shape=delta_shape, vm=delta_vm, call=delta_call,
       spelling="gated_delta(q, k, v, z, b, a, s, gn, hv, hk, d)",
       ints=("HV", "HK"), params=("GN",), writes="S"),
)
