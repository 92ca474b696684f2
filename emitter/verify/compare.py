"""How one tensor of the module compares with the VM's: the figures a verdict is made of."""

import math

import numpy as np

KEYS = ("max_abs", "max_rel", "guarded_rel", "scaled_err", "nmse", "cosine", "worst_ratio")


def compare(got, want, tol):
    """Figures of `got` (the module's) against `want` (the VM's), both widened to float64.

    - worst_ratio: max |a − b| / (abs + rel · max|b|), the check's own bound (1.0 = at the limit);
    - guarded_rel: max |a − b| / (abs + rel · |b|), element by element, guarded where |b| is tiny;
    - max_rel: the raw element-wise max |a − b| / |b| (meaningless near zero; kept for reference);
    - cosine over the whole tensor in float64; NaN/Inf on one side only are counted apart.
    """
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return {**{k: math.inf for k in KEYS}, "cosine": 0.0, "nonfinite_mismatch": 0, "pass": False,
                "shape": [list(got.shape), list(want.shape)]}
    fin_g, fin_w = np.isfinite(got), np.isfinite(want)
    if fin_g.all() and fin_w.all():
        mismatch, g, w = 0, got.reshape(-1), want.reshape(-1)
    else:  # a NaN or Inf on one side only, or of another kind, is a mismatch by itself
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        mismatch = int(np.count_nonzero(fin_g != fin_w) + np.count_nonzero(~fin_g & ~fin_w & ~same))
        g, w = got[fin_g & fin_w], want[fin_g & fin_w]
    diff = np.abs(g - w)
    scale = float(np.abs(w).max()) if w.size else 0.0
    bound = tol["abs"] + tol["rel"] * scale
    nz = np.abs(w) > 0
    power = float(np.sum(w * w))
    norms = float(np.linalg.norm(g) * np.linalg.norm(w))
    with np.errstate(all="ignore"):
        m = {
            "max_abs": float(diff.max()) if diff.size else 0.0,
            "max_rel": float((diff[nz] / np.abs(w[nz])).max()) if nz.any() else 0.0,
            "guarded_rel": float(np.where(diff == 0, 0.0, diff / (tol["abs"] + tol["rel"] * np.abs(w))).max())
            if diff.size else 0.0,
            "scaled_err": float(diff.max() / scale) if diff.size and scale > 0 else 0.0,
            "nmse": float(np.sum(diff * diff) / power) if power > 0 else float(np.sum(diff * diff)),
            "cosine": float(np.dot(g, w) / norms) if norms > 0 else (1.0 if not diff.any() else 0.0),
            "nonfinite_mismatch": mismatch,
            "worst_ratio": float(np.where(diff == 0, 0.0, diff / bound).max()) if diff.size else 0.0,
        }
    m["pass"] = bool(mismatch == 0 and m["worst_ratio"] <= 1.0)
    return m


def worse(a, b):
    """The comparison that is further from passing."""
    if a is None:
        return b
    return b if (not b["pass"], b["worst_ratio"]) > (not a["pass"], a["worst_ratio"]) else a


def figures(m):
    """The figures of a comparison, without its pass flag and extras."""
    return {k: m[k] for k in KEYS}
