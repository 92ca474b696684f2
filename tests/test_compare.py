"""The figures of a module's tensor against the VM's, against a plain element-by-element reading
of their definitions (emitter.verify.compare's docstring), on finite values, NaN and Inf on
either side, zeros, an overflowing difference and a zero tolerance."""

import math

import numpy as np
import pytest

from emitter.verify.compare import compare

torch = pytest.importorskip("torch")


def _over(d, bound):
    return d / bound if bound > 0 else math.inf   # a difference beyond a bound of zero


def reference(got, want, tol):
    got = got.resolve_neg().to(torch.float64).numpy() if isinstance(got, torch.Tensor) else got
    g, w = np.asarray(got, dtype=np.float64).ravel(), np.asarray(want, dtype=np.float64).ravel()
    mismatch, pairs = 0, []
    for a, b in zip(g.tolist(), w.tolist()):
        if math.isfinite(a) and math.isfinite(b):
            pairs.append((a, b))
        elif math.isfinite(a) != math.isfinite(b) or not (a == b or (math.isnan(a) and math.isnan(b))):
            mismatch += 1
    diffs = [abs(a - b) for a, b in pairs]
    max_abs = max(diffs, default=0.0)
    scale = max((abs(b) for _, b in pairs), default=0.0)
    max_rel = max((d / abs(b) for d, (_, b) in zip(diffs, pairs) if b != 0), default=0.0)
    guarded = max((0.0 if d == 0 else _over(d, tol["abs"] + tol["rel"] * abs(b)) for d, (_, b) in zip(diffs, pairs)),
                  default=0.0)
    sq, power = sum(d * d for d in diffs), sum(b * b for _, b in pairs)
    gg, gw = sum(a * a for a, _ in pairs), sum(a * b for a, b in pairs)
    norms = math.sqrt(gg) * math.sqrt(power)
    # each value's difference over abs + rel · its row's largest finite |b| (a value of one row or
    # one column, or not 2-D: the whole value's largest)
    W = np.asarray(want, dtype=np.float64)
    G = np.asarray(got, dtype=np.float64)
    if W.ndim == 2 and min(W.shape) > 1:
        A = np.where(np.isfinite(W) & np.isfinite(G), np.abs(W), 0.0)
        D = np.where(np.isfinite(W) & np.isfinite(G), np.abs(G - W), 0.0)
        bound = tol["abs"] + tol["rel"] * A.max(axis=1)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = np.where(D == 0, 0.0, np.where(bound > 0, D / bound, np.inf))
        worst = 0.0 if max_abs == 0 else float(ratios.max())
    else:
        worst = 0.0 if max_abs == 0 else _over(max_abs, tol["abs"] + tol["rel"] * scale)
    return {"max_abs": max_abs, "max_rel": max_rel, "guarded_rel": guarded,
            "scaled_err": max_abs / scale if pairs and scale > 0 else 0.0,
            "nmse": sq / power if power > 0 else sq,
            "cosine": gw / norms if norms > 0 else (1.0 if max_abs == 0 else 0.0),
            "nonfinite_mismatch": mismatch, "worst_ratio": worst,
            "pass": mismatch == 0 and worst <= 1.0}


def _cases():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((3, 700))
    yield torch.from_numpy((w + rng.standard_normal(w.shape) * 1e-5).astype(np.float32)), w
    w = rng.standard_normal(500)
    w[::9] = 0.0
    g = w + rng.standard_normal(500) * 1e-3
    g[2], g[4], w[6], g[6], w[8], g[8], w[10], g[10], g[12] = np.nan, np.inf, np.inf, np.inf, np.nan, np.nan, -np.inf, np.inf, -np.inf
    g[18] = w[18]   # an exact zero difference where |b| is 0 under a zero tolerance
    yield torch.from_numpy(g), w
    yield torch.from_numpy(np.array([-1e308, 1e308, 0.0, 1.5])), np.array([1e308, -1e308, 0.0, 1.0])
    yield torch.from_numpy(np.array([np.nan, np.inf])), np.array([1.0, 2.0])
    w = rng.standard_normal((40, 30))   # every kind of tensor the module hands the lock
    yield torch.from_numpy(w).to(torch.bfloat16), w
    yield torch.from_numpy(w).to(torch.float16).T, w.T
    yield torch._neg_view(torch.from_numpy(-w)), w   # a negated view: -(-w) is w
    yield torch.from_numpy(w.astype(np.float32)).double(), w.astype(np.float32).astype(np.float64)   # all equal
    w = rng.standard_normal((3, (1 << 20) // 2 + 5))   # more values than one block holds
    w[1, ::7] = 0.0
    yield torch.from_numpy((w + rng.standard_normal(w.shape) * 1e-4).astype(np.float32)), w
    yield torch._neg_view(torch.from_numpy(-w)), w   # negated, and big: its bits compared first


@pytest.mark.parametrize("tol", [{"abs": 1e-4, "rel": 1e-3}, {"abs": 0.0, "rel": 0.0}, {"abs": 0.0, "rel": 1e-2}])
@pytest.mark.parametrize("case", range(10))
def test_figures_are_their_definitions(tol, case):
    got, want = list(_cases())[case]
    m, r = compare(got, want, tol), reference(got, want, tol)
    for k, v in r.items():
        assert m[k] == pytest.approx(v, rel=1e-12, abs=0.0, nan_ok=True), (k, m[k], v)


def _same(a, b):
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("tol", [{"abs": 1e-4, "rel": 1e-3}, {"abs": 0.0, "rel": 0.0}])
def test_a_pass_figures_its_small_stages_together_as_one_by_one(dtype, tol):
    """The probe figures a pass's small stages together (compare_many): each stage's figures are
    compare()'s to the bit, in the order the stages were tapped, and what it hands on is the VM's
    value rounded as torch rounds it, whatever the stage held (NaN, Inf, a transposed VM value,
    subnormals, values past float32's range, an empty one)."""
    from emitter.verify.probe import Probe
    rng = np.random.default_rng(11)
    cases = [c for c in _cases() if c[0].numel() <= 1 << 14]
    w = rng.standard_normal((30, 20))
    cases += [(torch.from_numpy(w.T.copy()).float() * 1.001, w.T),   # an F-ordered VM value
              (torch.zeros(1, 1), np.zeros((1, 1))), (torch.ones(0, 4), np.ones((0, 4))),
              (torch.tensor([[1e-40, 3e38, 1e-310]]), np.array([[1e-40, 4e38, 1e-310]]))]
    torch_dtype = getattr(torch, dtype)
    order = list(range(len(cases)))[::-1]   # tapped out of index order
    probe = Probe(torch, torch_dtype, [want for _, want in cases], tol)
    for i in order:
        got, want = cases[i]
        back = probe(i, got)
        expect = torch.from_numpy(np.ascontiguousarray(want, dtype=np.float64)).to(torch_dtype)
        assert back.dtype == torch_dtype and back.shape == expect.shape
        assert torch.equal(back.view(-1).view(torch.int16 if dtype == "bfloat16" else getattr(torch, f"int{8 * back.element_size()}")),
                           expect.reshape(-1).view(torch.int16 if dtype == "bfloat16" else getattr(torch, f"int{8 * back.element_size()}"))), i
    assert list(probe.results) == order
    for i, (got, want) in enumerate(cases):
        m, one = probe.results[i], compare(got, want, tol)
        assert m.keys() == one.keys() and all(_same(m[k], one[k]) for k in one), (i, m, one)


@pytest.mark.parametrize("tol", [{"abs": 1e-4, "rel": 1e-3}, {"abs": 1e-9, "rel": 1e-9}])
def test_one_rows_large_values_loosen_no_other_rows_bound(tol):
    """A KV cache: its unwritten rows hold a mask of -1e9 in their last column, its written rows
    keys of about 1 and a mask of 0. A written row 1% off fails, one by one and figured with a
    pass's others, as a value and transposed (against the whole tensor's largest value, -1e9, its
    bound was 1e6 at float32, 1 at float64); so does a written row's mask set to -5e5 (the key no
    longer counts: of the transposed value, whose rows are the cache's columns, the mask's row
    is all masks), and an unwritten row's mask 1% off; a copy passes."""
    from emitter.verify.compare import compare_many, flat_pair
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 9))
    w[:3, 8], w[3:, 8] = 0.0, -1e9
    masked = w.copy()
    masked[0, 8] = -5e5
    g = torch.from_numpy(masked)
    assert not compare(g, w, tol)["pass"]
    for row, cols in ((1, slice(0, 8)), (5, slice(8, 9))):
        g = w.copy()
        g[row, cols] *= 1.01
        for m in (compare(torch.from_numpy(g), w, tol), compare_many([flat_pair(g, w)], tol)[0],
                  compare(torch.from_numpy(g.T.copy()).T, w.T.copy().T, tol)):
            assert not m["pass"] and m["worst_ratio"] > 1.0, (row, m)
    assert compare(torch.from_numpy(w.copy()), w, tol)["pass"]


def test_a_vector_small_by_cancellation_keeps_the_bound_of_its_largest_value():
    """A column (N×1) whose first value cancels (10000.0004 − 10000 in float32: off by the input's
    own rounding, 4e-4) beside 10000: a vector's bound is its largest value's, and float32's
    tolerance holds it, as a column and as a row. In a table (more than one row and column) each
    row has its own: a row scaled by 1.05 beside one of thousands fails."""
    tol = {"abs": 1e-4, "rel": 1e-3}
    x = np.array([[10000.0004, -10000.0], [5000.0, 5000.0]])
    want = x @ np.ones((2, 1))
    got = torch.from_numpy(x).float() @ torch.ones(2, 1)
    assert compare(got, want, tol)["pass"] and compare(got.T, want.T, tol)["pass"]
    t = np.array([[1000.0, 2000.0, -1500.0, 1200.0], [0.5, -0.7, 0.3, 0.9]])
    off = t * np.array([[1.0], [1.05]])
    assert not compare(torch.from_numpy(off).float(), t, tol)["pass"]
