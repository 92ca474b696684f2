"""How one tensor of the module compares with the VM's: the figures a verdict is made of, one
tensor at a time or a pass's small ones together; and the bit-level helpers the load stage
(emitter.verify.leaf_check) shares."""

import math

import numpy as np

from ..ops import release

KEYS = ("max_abs", "max_rel", "guarded_rel", "scaled_err", "nmse", "cosine", "worst_ratio")


BLOCK = 1 << 20   # values compared at a time: a 1 GB table is never widened whole


def _f64(x):
    """A block as float64 numpy: a torch tensor's (detached) or an array's (a map's pages read)."""
    if hasattr(x, "detach"):
        x = x.detach().resolve_neg()   # (a lazily negated view made real: NumPy reads memory)
        if x.dtype.is_floating_point and x.dtype.itemsize >= 4:
            return np.asarray(x.numpy(), dtype=np.float64)   # NumPy widens as torch does, sooner
        return x.double().numpy()
    return np.asarray(x, dtype=np.float64)


def _blocks(got, want, widen=True):
    """(got, want) in blocks of rows, each widened to float64 and flat (or as they are); a
    transposed table (a view whose columns are contiguous) in blocks of its columns, so each block
    reads its own pages; a mapped `want`'s pages are released after each block."""
    if _transposed(want):
        got, want = got.T, want.T
    rows = max(1, BLOCK // max(1, math.prod(got.shape[1:])))
    if got.ndim < 2 or rows >= got.shape[0]:   # one block: no slices
        yield (_f64(got).reshape(-1), _f64(want).reshape(-1)) if widen else (got, want)
        release(want)
        return
    for r in range(0, got.shape[0], rows):
        g, w = got[r:r + rows], want[r:r + rows]
        yield (_f64(g).reshape(-1), _f64(w).reshape(-1)) if widen else (g, w)
        release(want)


def _transposed(want):
    """Whether `want` is a transposed view (its columns contiguous): compare reads it by columns."""
    return getattr(want, "ndim", 0) == 2 and want.flags.f_contiguous and not want.flags.c_contiguous


def _frame(got, want):
    """(rows, columns) of a 2-D value as compare reads it (a transposed view's, those of what it
    transposes), or None for a value of one row or one column, or not 2-D: its bound is its
    largest |b|."""
    if got.ndim != 2:
        return None
    r, c = got.shape
    if _transposed(want):
        r, c = c, r
    return (r, c) if r > 1 and c > 1 else None


def _row_max(want, frame):
    """The largest finite |b| of each of the value's own rows, where compare reads them as the
    columns of what a transposed view transposes (one pass over `want` alone)."""
    out = np.zeros(frame[1])
    for _, w in _blocks(want, want, widen=False):
        w = np.abs(_f64(w).reshape(-1, frame[1]))
        w[~np.isfinite(w)] = 0.0
        np.maximum(out, w.max(axis=0), out=out)
    return out


def _cell_ratio(diff, aw, length, rows, tol):
    """max over a block of whole rows (`length` long, as compare reads them) of |a − b| / (abs +
    rel · the largest |b| of the value's row: each read row's own, or `rows` where compare reads
    the value's rows as columns): 0 where equal, inf past a bound of 0."""
    d = diff.reshape(-1, length)
    bound = (aw.reshape(-1, length).max(axis=1)[:, None] if rows is None else rows[None, :]) * tol["rel"]
    bound = bound + tol["abs"]
    return float(np.divide(d, bound, out=np.where(d > 0, np.inf, 0.0), where=bound > 0).max()) if d.size else 0.0


def same_in_dtype(got, want):
    """Whether `got` (a torch tensor) is `want` rounded to got's dtype, bit for bit, compared a
    block at a time (a mapped want's pages released after each)."""
    import torch
    if tuple(got.shape) != tuple(want.shape):
        return False
    got, scratch = got.resolve_neg(), {}   # (a lazily negated view has no bits to compare)
    for g, w in _blocks(got, want, widen=False):
        b = as_dtype(torch, scratch, w, g.dtype)
        same = same_bits(torch, g, b) or torch.equal(g, b)
        release(want)
        if not same:
            return False
    return True


def _identical(got, want):
    """Whether a big `got` (a torch tensor) holds exactly `want`: a float array whose dtype got's
    holds exactly, so that equal in got's dtype is equal."""
    return (hasattr(got, "detach") and isinstance(want, np.ndarray) and want.dtype.kind == "f"
            and got.dtype.is_floating_point and got.dtype.itemsize >= want.dtype.itemsize
            and got.ndim == want.ndim == 2 and want.size > BLOCK and same_in_dtype(got.detach(), want))


EXACT = {"max_abs": 0.0, "max_rel": 0.0, "guarded_rel": 0.0, "scaled_err": 0.0, "nmse": 0.0,
         "cosine": 1.0, "nonfinite_mismatch": 0, "worst_ratio": 0.0, "pass": True}


def _ratio_max(diff, bound, where):
    """max(diff / bound) over the elements `where` selects, the others counted as 0; `where`
    None: no bound is 0, so a plain division says the same at half a masked one's cost."""
    if where is None:
        return float(np.divide(diff, bound).max())
    return float(np.divide(diff, bound, out=np.zeros_like(diff), where=where).max())


SMALL = 1 << 14   # values up to which a stage's comparison waits for its pass's others (compare_many)


def compare_many(pairs, tol):
    """compare(got, want, tol) of each (got, want) pair, both float64 and flat, as many small ones
    as a pass has, figured together (one difference and one maximum each of them all, each pair's
    sums its own dot products), so that a small stage costs microseconds, not a hundred: the same
    figures to the bit (a maximum does not depend on its order). A pair whose difference is not
    finite everywhere, or that is empty, goes through compare()."""
    out = [None] * len(pairs)
    todo = [i for i, (g, _, _) in enumerate(pairs) if g.size]
    if todo:
        sizes = np.array([pairs[i][0].size for i in todo], dtype=np.int64)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        g = np.concatenate([pairs[i][0] for i in todo])
        w = np.concatenate([pairs[i][1] for i in todo])
        with np.errstate(all="ignore"):
            diff = np.abs(np.subtract(g, w))
            aw = np.abs(w)
            rel = np.divide(diff, aw, out=np.zeros_like(diff), where=aw > 0)
            bound = np.multiply(aw, tol["rel"])
            bound += tol["abs"]
            guard = np.divide(diff, bound) if tol["abs"] > 0 else \
                np.divide(diff, bound, out=np.zeros_like(diff), where=diff != 0)
            top, scale, max_rel, guarded = (np.maximum.reduceat(x, starts).tolist() for x in (diff, aw, rel, guard))
            dot = np.dot
            for k, (i, lo, hi) in enumerate(zip(todo, starts.tolist(), ends.tolist())):
                if math.isfinite(top[k]) and pairs[i][2] is None:   # (2-D ones: compare's own bound)
                    d, gi, wi = diff[lo:hi], g[lo:hi], w[lo:hi]
                    out[i] = _figures(top[k], max_rel[k], guarded[k], scale[k], (float(dot(d, d)), float(dot(wi, wi)),
                                      float(dot(gi, gi)), float(dot(gi, wi))), 0, hi - lo, tol)
    return [m if m is not None else compare(*(_shaped(x, pairs[i][2]) for x in pairs[i][:2]), tol)
            for i, m in enumerate(out)]


def _shaped(flat, table):
    """A flat_pair's value as the table it was (`table`: its (rows, columns) as read, and whether
    it was a transposed view), or flat where it is no table."""
    if table is None:
        return flat
    (r, c), transposed = table
    x = flat.reshape(r, c)
    return x.T if transposed else x


def flat_pair(got, want):
    """A small (got, want, ((rows, columns) as read, transposed) where it is a table of several of
    each, else None), float64 and flat, in compare's order (a transposed VM value's columns first,
    as _blocks reads it), for compare_many."""
    want = np.asarray(want, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    frame, transposed = _frame(got, want), _transposed(want)
    if transposed:
        got, want = got.T, want.T
    return got.reshape(-1), want.reshape(-1), frame and (frame, transposed)


def _figures(max_abs, max_rel, guarded, scale, sums, mismatch, size, tol, worst=None):
    """A comparison's figures from its maxima, its sums (|d|², |w|², |g|², g·w) and its values'
    worst ratio to their bounds (`worst`; None: the largest |b|, `scale`, is every value's)."""
    sq, power, gg, gw = sums
    if worst is None:
        bound = tol["abs"] + tol["rel"] * scale
        worst = max_abs / bound if bound > 0 else math.inf
    norms = math.sqrt(gg) * math.sqrt(power)
    m = {
        "max_abs": max_abs,
        "max_rel": max_rel,
        "guarded_rel": guarded,
        "scaled_err": max_abs / scale if size and scale > 0 else 0.0,
        "nmse": sq / power if power > 0 else sq,
        "cosine": gw / norms if norms > 0 else (1.0 if max_abs == 0 else 0.0),
        "nonfinite_mismatch": mismatch,
        "worst_ratio": 0.0 if max_abs == 0 else worst,
    }
    m["pass"] = bool(mismatch == 0 and m["worst_ratio"] <= 1.0)
    return m


def compare(got, want, tol):
    """Figures of `got` (the module's: a torch tensor or an array) against `want` (the VM's),
    widened to float64 a block at a time.

    - worst_ratio: max |a − b| / (abs + rel · max|b|), max|b| its row's largest (a value of one
      row or one column: the whole value's), the check's own bound (1.0 = at the limit): rounding
      in a sum scales with its terms, so a small value carries the absolute error of its row; the
      rows of a table are values of their own (a KV cache's positions, a batch's tokens), so one
      row's large values (an unwritten cache row's mask of -1e9) loosen no other row's bound;
    - guarded_rel: max |a − b| / (abs + rel · |b|), element by element, guarded where |b| is tiny;
    - max_rel: the raw element-wise max |a − b| / |b| (meaningless near zero; kept for reference);
    - cosine over the whole tensor in float64; NaN/Inf on one side only are counted apart.
    """
    want = want if hasattr(want, "shape") else np.asarray(want, dtype=np.float64)
    got = got if hasattr(got, "shape") else np.asarray(got, dtype=np.float64)
    if tuple(got.shape) != tuple(want.shape):
        return {**{k: math.inf for k in KEYS}, "cosine": 0.0, "nonfinite_mismatch": 0, "pass": False,
                "shape": [list(got.shape), list(want.shape)]}
    if _identical(got, want):   # exactly the VM's (a table's view, a copied leaf): nothing to widen
        return dict(EXACT)
    mismatch, size, frame = 0, 0, _frame(got, want)
    rows = _row_max(want, frame) if frame is not None and _transposed(want) else None
    max_abs = max_rel = guarded = scale = worst = 0.0
    sq = power = gg = gw = 0.0
    with np.errstate(all="ignore"):
        for g, w in _blocks(got, want):
            diff = np.subtract(g, w)
            np.abs(diff, out=diff)
            top = diff.max() if diff.size else 0.0
            finite = g.size
            if not np.isfinite(top):   # NaN/Inf on one side only, or of another kind: counted apart,
                fin_g, fin_w = np.isfinite(g), np.isfinite(w)   # the rest as 0 (rows kept whole)
                same = (g == w) | (np.isnan(g) & np.isnan(w))
                mismatch += int(np.count_nonzero(fin_g != fin_w) + np.count_nonzero(~fin_g & ~fin_w & ~same))
                both = fin_g & fin_w
                finite = int(np.count_nonzero(both))
                g, w = np.where(both, g, 0.0), np.where(both, w, 0.0)
                diff = np.abs(g - w)
                top = diff.max() if diff.size else 0.0
            if not finite:
                continue
            size += finite
            aw = np.abs(w)
            max_abs = max(max_abs, float(top))
            scale = max(scale, float(aw.max()))
            if top > 0 and frame is not None:
                worst = max(worst, _cell_ratio(diff, aw, frame[1], rows, tol))
            if top > 0:   # (all equal: no element's relative error is above 0)
                max_rel = max(max_rel, _ratio_max(diff, aw, None if aw.min() > 0 else aw > 0))
                np.multiply(aw, tol["rel"], out=aw)
                aw += tol["abs"]   # each value's own bound; a difference of 0 is within any
                guarded = max(guarded, _ratio_max(diff, aw, None if tol["abs"] > 0 else diff != 0))
            sq += float(np.dot(diff, diff))
            power += float(np.dot(w, w))
            gg += float(np.dot(g, g))
            gw += float(np.dot(g, w))
    return _figures(max_abs, max_rel, guarded, scale, (sq, power, gg, gw), mismatch, size, tol,
                    None if frame is None else worst)


def worse(a, b):
    """The comparison that is further from passing."""
    if a is None:
        return b
    return b if (not b["pass"], b["worst_ratio"]) > (not a["pass"], a["worst_ratio"]) else a


def figures(m):
    """The figures of a comparison, without its pass flag and extras; `nonfinite`, where values are
    NaN or Inf on one side only (which no other figure counts: a float32 overflow to Inf)."""
    out = {k: m[k] for k in KEYS}
    n = m.get("nonfinite_mismatch") or m.get("nonfinite")   # (a comparison's, or figures' own)
    if n:
        out["nonfinite"] = n
    return out


def worst_of(stages, load):
    """The stage furthest from its tolerance (load failures first); the bf16 judge names its own
    (emitter.verify.judges.Bf16.report)."""
    if load["failed"]:
        f = load["failed"][0]
        return {"stage": "load", "out": f["leaf"], "op": "load", "line": f["line"],
                "ratio": f["worst_ratio"], "max_abs": f["max_abs"], "guarded_rel": f["guarded_rel"]}
    if not stages:
        return None
    s = max(stages, key=lambda s: (not s["pass"], s["worst_ratio"]))
    return {**{k: s[k] for k in ("stage", "out", "op", "line")}, "ratio": s["worst_ratio"],
            "max_abs": s["max_abs"], "guarded_rel": s["guarded_rel"]}


def _viewed(torch, block):
    """A block of the VM's leaf as a tensor without a copy (a read-only map's pages, read as they are)."""
    import warnings
    with warnings.catch_warnings():   # torch warns of a read-only array; the block is only read
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(block))


_NUMPY = {"torch.float32": np.dtype("<f4"), "torch.float64": np.dtype("<f8")}


def numpy_dtype(dtype):
    """The NumPy dtype of a torch dtype the maps hold, or None (never compare None with a NumPy
    dtype: NumPy takes it for float64)."""
    return _NUMPY.get(str(dtype))


def as_dtype(torch, buffers, block, dtype):
    """A block of the VM's values as a tensor of `dtype`: viewed as it is, or cast into `buffers`'
    one buffer of that dtype (grown as needed, reused: no fresh pages for each block)."""
    b = _viewed(torch, block)
    if b.dtype == dtype:
        return b
    n = math.prod(b.shape)
    if dtype not in buffers or buffers[dtype].numel() < n:
        buffers[dtype] = torch.empty(n, dtype=dtype)
    return buffers[dtype][:n].view(b.shape).copy_(b)


_BITS = {2: "int16", 4: "int32", 8: "int64"}


def nan_equal(torch, a, b):
    """Whether tensors `a` and `b` of one dtype hold equal values, NaN where NaN."""
    return torch.equal(a, b) or (torch.equal(torch.isnan(a), torch.isnan(b)) and
                                 torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))


def same_bits(torch, a, b):
    """Whether `a` and `b` hold the same bits (then equal; where not, equal may still hold: -0.0, NaN),
    compared by NumPy as integers (torch.equal took 10 times as long on a bfloat16 table here)."""
    bits = _BITS.get(a.element_size())
    if bits is None or a.dtype != b.dtype or a.shape != b.shape or not (a.is_contiguous() and b.is_contiguous()):
        return False
    if a.device.type != "cpu" or b.device.type != "cpu" or a.is_neg() or b.is_neg() or a.is_conj() or b.is_conj():
        return torch.equal(a.view(getattr(torch, bits)), b.view(getattr(torch, bits)))
    return bool(np.array_equal(a.detach().view(getattr(torch, bits)).numpy(), b.detach().view(getattr(torch, bits)).numpy()))


