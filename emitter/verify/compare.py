"""How one tensor of the module compares with the VM's: the figures a verdict is made of; and the
lock's load stage, every leaf the module holds against the VM's, bit for bit."""

import math
import zlib

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
    if getattr(want, "ndim", 0) == 2 and want.flags.f_contiguous and not want.flags.c_contiguous:
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


def same_in_dtype(got, want):
    """Whether `got` (a torch tensor) is `want` rounded to got's dtype, bit for bit, compared a
    block at a time (a mapped want's pages released after each)."""
    import torch
    if tuple(got.shape) != tuple(want.shape):
        return False
    got, scratch = got.resolve_neg(), {}   # (a lazily negated view has no bits to compare)
    for g, w in _blocks(got, want, widen=False):
        b = _as_dtype(torch, scratch, w, g.dtype)
        same = _same_bits(torch, g, b) or torch.equal(g, b)
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
    todo = [i for i, (g, _) in enumerate(pairs) if g.size]
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
            if math.isfinite(top[k]):
                d, gi, wi = diff[lo:hi], g[lo:hi], w[lo:hi]
                out[i] = _figures(top[k], max_rel[k], guarded[k], scale[k], (float(dot(d, d)), float(dot(wi, wi)),
                                  float(dot(gi, gi)), float(dot(gi, wi))), 0, hi - lo, tol)
    return [m if m is not None else compare(*pairs[i], tol) for i, m in enumerate(out)]


def flat_pair(got, want):
    """A small (got, want), float64 and flat, in compare's order (a transposed VM value's columns
    first, as _blocks reads it), for compare_many."""
    want = np.asarray(want, dtype=np.float64)
    if want.ndim == 2 and want.flags.f_contiguous and not want.flags.c_contiguous:
        got, want = got.T, want.T
    return np.asarray(got, dtype=np.float64).reshape(-1), want.reshape(-1)


def _figures(max_abs, max_rel, guarded, scale, sums, mismatch, size, tol):
    """A comparison's figures from its maxima and its sums (|d|², |w|², |g|², g·w)."""
    sq, power, gg, gw = sums
    bound = tol["abs"] + tol["rel"] * scale
    norms = math.sqrt(gg) * math.sqrt(power)
    m = {
        "max_abs": max_abs,
        "max_rel": max_rel,
        "guarded_rel": guarded,
        "scaled_err": max_abs / scale if size and scale > 0 else 0.0,
        "nmse": sq / power if power > 0 else sq,
        "cosine": gw / norms if norms > 0 else (1.0 if max_abs == 0 else 0.0),
        "nonfinite_mismatch": mismatch,
        "worst_ratio": 0.0 if max_abs == 0 else (max_abs / bound if bound > 0 else math.inf),
    }
    m["pass"] = bool(mismatch == 0 and m["worst_ratio"] <= 1.0)
    return m


def compare(got, want, tol):
    """Figures of `got` (the module's: a torch tensor or an array) against `want` (the VM's),
    widened to float64 a block at a time.

    - worst_ratio: max |a − b| / (abs + rel · max|b|), the check's own bound (1.0 = at the limit);
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
    mismatch, size = 0, 0
    max_abs = max_rel = guarded = scale = 0.0
    sq = power = gg = gw = 0.0
    with np.errstate(all="ignore"):
        for g, w in _blocks(got, want):
            diff = np.subtract(g, w)
            np.abs(diff, out=diff)
            top = diff.max() if diff.size else 0.0
            if not np.isfinite(top):   # NaN/Inf on one side only, or of another kind: counted apart
                fin_g, fin_w = np.isfinite(g), np.isfinite(w)
                same = (g == w) | (np.isnan(g) & np.isnan(w))
                mismatch += int(np.count_nonzero(fin_g != fin_w) + np.count_nonzero(~fin_g & ~fin_w & ~same))
                g, w = g[fin_g & fin_w], w[fin_g & fin_w]
                diff = np.abs(g - w)
                top = diff.max() if diff.size else 0.0
            if not g.size:
                continue
            size += g.size
            aw = np.abs(w)
            max_abs = max(max_abs, float(top))
            scale = max(scale, float(aw.max()))
            if top > 0:   # (all equal: no element's relative error is above 0)
                max_rel = max(max_rel, _ratio_max(diff, aw, None if aw.min() > 0 else aw > 0))
                np.multiply(aw, tol["rel"], out=aw)
                aw += tol["abs"]   # each value's own bound; a difference of 0 is within any
                guarded = max(guarded, _ratio_max(diff, aw, None if tol["abs"] > 0 else diff != 0))
            sq += float(np.dot(diff, diff))
            power += float(np.dot(w, w))
            gg += float(np.dot(g, g))
            gw += float(np.dot(g, w))
    return _figures(max_abs, max_rel, guarded, scale, (sq, power, gg, gw), mismatch, size, tol)


def worse(a, b):
    """The comparison that is further from passing."""
    if a is None:
        return b
    return b if (not b["pass"], b["worst_ratio"]) > (not a["pass"], a["worst_ratio"]) else a


def figures(m):
    """The figures of a comparison, without its pass flag and extras."""
    return {k: m[k] for k in KEYS}


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


def _held(torch, program, name, dtype):
    """The dtype the module holds a leaf in: the lock's, but an Int leaf in fp32 under bfloat16."""
    if dtype == torch.bfloat16 and not program.decls[name].real:
        return torch.float32
    return dtype


def _viewed(torch, block):
    """A block of the VM's leaf as a tensor without a copy (a read-only map's pages, read as they are)."""
    import warnings
    with warnings.catch_warnings():   # torch warns of a read-only array; the block is only read
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(block))


_NUMPY = {"torch.float32": np.dtype("<f4"), "torch.float64": np.dtype("<f8")}


def _numpy(dtype):
    """The NumPy dtype of a torch dtype the maps hold, or None (never compare None with a NumPy
    dtype: NumPy takes it for float64)."""
    return _NUMPY.get(str(dtype))


def _same_bytes(torch, got, want, name, resident):
    """Whether the module's leaf is an untouched map of the very bytes of the VM's (a map of the same
    file at the same offset, in the same dtype): equal bit for bit without reading either."""
    return (isinstance(want, np.memmap) and want.filename is not None and want.flags.c_contiguous
            and got.is_contiguous() and _numpy(got.dtype) is not None and _numpy(got.dtype) == want.dtype
            and resident.maps_as(name, want.filename, want.offset, got))


def same_view_bytes(torch, got, want, leaf, vm_leaf, name, resident):
    """Whether `got`, a view the module made of its leaf `leaf` (a transposed table), selects the
    very elements of the very bytes that `want`, the VM's same view of its leaf `vm_leaf`, does:
    the leaf an untouched map of the VM's bytes (`_same_bytes`), the view at the same offset with
    the same shape and strides. Then they are equal bit for bit, unread."""
    if not isinstance(want, np.ndarray) or got.dtype != leaf.dtype or leaf.numel() != vm_leaf.size \
            or tuple(got.shape) != want.shape or got.element_size() != want.itemsize:
        return False
    offset = want.__array_interface__["data"][0] - vm_leaf.__array_interface__["data"][0]
    return (got.data_ptr() - leaf.data_ptr() == offset
            and tuple(s * want.itemsize for s in got.stride()) == want.strides
            and _same_bytes(torch, leaf, vm_leaf, name, resident))


def same_view_elements(got, want, leaf, vm_leaf):
    """Whether `got`, a view the module made of its leaf `leaf`, selects the very elements that
    `want`, the VM's same view of its leaf `vm_leaf`, does: both leaves whole and contiguous, the
    views at the same offset with the same shape and strides, counted in elements. Where the load
    stage found `leaf` to be `vm_leaf` in leaf's dtype bit for bit and nothing wrote it since (the
    caller's part), `got` is `want` in that dtype, unread (a bfloat16 copy of a tied table)."""
    if not isinstance(want, np.ndarray) or want.dtype != vm_leaf.dtype or got.dtype != leaf.dtype \
            or got.is_neg() or got.is_conj() or not vm_leaf.flags.c_contiguous or not leaf.is_contiguous() \
            or tuple(leaf.shape) != vm_leaf.shape or tuple(got.shape) != want.shape:
        return False
    size, base = want.itemsize, vm_leaf.__array_interface__["data"][0]
    offset = want.__array_interface__["data"][0] - base
    if offset < 0 or offset % size or any(s < 0 or s % size for s in want.strides):
        return False
    last = offset + sum((n - 1) * s for n, s in zip(want.shape, want.strides))
    if want.size == 0 or not 0 <= last < vm_leaf.nbytes:   # inside the VM's leaf: a view of it
        return False
    at = got.data_ptr() - leaf.data_ptr()
    return (at == offset // size * got.element_size()
            and tuple(got.stride()) == tuple(s // size for s in want.strides))


def exact_leaves(model, program, load):
    """{constant leaf: (the module's tensor, its version counter, where its values are)} of those
    the load stage passed."""
    wrong = {f["leaf"] for f in load["failed"]}
    return {n: (t, t._version, t.data_ptr()) for n in program.leaves if n not in wrong and n not in program.states
            for t in (getattr(model, "leaf_" + n),)}


def known_view_of(torch, got, want, name, leaf, vm_leaf, resident, loaded):
    """Whether `got`, the module's view of its leaf `name` (the tensor `leaf`), is `want`, the VM's
    same view of `vm_leaf`, unread: the leaf the copy the load stage found exact (`loaded`:
    `exact_leaves`) and written by nothing torch counts since (in place, through a view; its
    storage not swapped), or an untouched map of the VM's own bytes; the views selecting the same
    elements. A leaf in the dtype of the VM's map is judged as a map (its pages show any write,
    whatever wrote them; a copy of it is read). A write torch does not count (through `.data` or
    NumPy) is found where a later stage reads the table, not at the view."""
    if same_view_bytes(torch, got, want, leaf.detach(), vm_leaf, name, resident):
        return True
    if isinstance(vm_leaf, np.memmap) and _numpy(leaf.dtype) is not None and _numpy(leaf.dtype) == vm_leaf.dtype:
        return False
    was = loaded.get(name)
    return was is not None and was[0] is leaf and leaf._version == was[1] and leaf.data_ptr() == was[2] \
        and same_view_elements(got, want, leaf.detach(), vm_leaf)


def _as_dtype(torch, buffers, block, dtype):
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


def _widened_equal(got, want, scratch):
    """Whether a block of a float64 leaf is a block of the VM's float32 leaf widened, value for
    value, compared as NumPy reads them (each read once, no widened copy; rounding to a wider
    dtype is exact, so equal is the load stage's rule). False where it cannot tell (NaN, another
    pair of dtypes): the caller compares its own way."""
    if str(got.dtype) != "torch.float64" or getattr(want, "dtype", None) != np.float32 or got.is_neg() \
            or not got.is_contiguous() or got.device.type != "cpu" or tuple(got.shape) != want.shape:
        return False
    n = want.size
    if "equal" not in scratch or scratch["equal"].size < n:
        scratch["equal"] = np.empty(n, dtype=bool)
    eq = scratch["equal"][:n].reshape(want.shape)
    np.equal(got.numpy(), want, out=eq)
    return bool(eq.all())


def _same_bits(torch, a, b):
    """Whether `a` and `b` hold the same bits (then equal; where not, equal may still hold: -0.0, NaN)."""
    bits = _BITS.get(a.element_size())
    return (bits is not None and a.dtype == b.dtype and a.shape == b.shape and a.is_contiguous()
            and b.is_contiguous() and torch.equal(a.view(getattr(torch, bits)), b.view(getattr(torch, bits))))


def load_stage(torch, model, program, leaves, dtype, tol, resident, names=None):
    """Every leaf buffer (of `names`, where given) against the VM's leaf rounded to the dtype the
    module holds it in: equal, bit for bit. Returns {"pass", "leaves", "failed": [{leaf, line,
    figures}]} (rows in blocks: a 1 GB table costs no copy)."""
    failed, scratch = [], {}
    names = program.leaves if names is None else names
    for name in names:
        want = leaves[name]
        held = _held(torch, program, name, dtype)
        buf = getattr(model, "leaf_" + name, None)
        got = None if buf is None else buf.detach()
        ok = got is not None and tuple(got.shape) == want.shape and got.dtype == held
        rows = 1 + (1 << 20) // max(1, want.shape[1])
        same = ok and _same_bytes(torch, got, want, name, resident)   # then nothing to read
        for r in range(0, want.shape[0], rows) if ok and not same else ():
            if _widened_equal(got[r:r + rows], want[r:r + rows], scratch):
                release(want)
                continue
            a, b = got[r:r + rows], _as_dtype(torch, scratch, want[r:r + rows], held)
            release(want)
            if not (_same_bits(torch, a, b) or torch.equal(a, b) or (
                    torch.equal(torch.isnan(a), torch.isnan(b)) and
                    torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))):
                ok = False
                break
        if not ok:
            m = compare(got if got is not None else np.zeros(0), want, tol)
            m["pass"] = False
            failed.append({"leaf": name, "line": program.decls[name].line, **figures(m),
                           "dtype": None if got is None else str(got.dtype)})
        release(want)
        resident.release([name])
    return {"pass": not failed, "leaves": len(names), "failed": failed}


def _crc(torch, t):
    """The CRC-32 of a contiguous CPU tensor's bytes (zlib's: ~3 GB/s here), else None."""
    t = t.detach()
    if t.device.type != "cpu" or not t.is_contiguous() or t.is_neg() or t.is_conj():
        return None
    return zlib.crc32(t.reshape(-1).view(torch.uint8).numpy())


def _sum(torch, t):
    return None if t is None else (t, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, _crc(torch, t))


def leaf_sums(torch, model, names, resident):
    """{leaf: (its tensor, where its values start, shape, strides, dtype, its bytes' CRC-32)} of
    the module's leaves `names` that are its own memory, what still_loaded holds such a leaf to,
    to know it unchanged with one read of its bytes, not a cast and a comparison of the VM's
    values. (A leaf that maps its file is known unchanged from its pages: resident.maps_as.)"""
    return {n: _sum(torch, getattr(model, "leaf_" + n, None)) for n in names if n not in resident.ranges}


def _unchanged(torch, model, name, was):
    t = getattr(model, "leaf_" + name, None)
    return was is not None and t is was[0] and was[5] is not None and _sum(torch, t) == was


def still_loaded(torch, model, program, leaves, dtype, tol, resident, load, step, sums):
    """The load stage again after a step, over the constant leaves: a weight the module wrote
    while it ran (through `.data` or NumPy, which torch does not count) is a failure naming it,
    where the bf16 gate's floors, which read the module's own weights, would pass it. `load` as
    it was, or the failures, each `written` at `step`. `sums` (leaf_sums', kept up to date here):
    a leaf still the tensor, place and bytes' CRC-32 it passed with is not compared again (a
    change of at most 4 bytes always moves a CRC-32; any other keeps it by a chance of 2^-32).
    What it finds is a module's writes, not one built to hide them: a CRC-32 can be kept on
    purpose, as a weight can be put back before the step ends, which no check between steps sees."""
    moved = [n for n in program.leaves if n not in program.states and not _unchanged(torch, model, n, sums.get(n))]
    again = load_stage(torch, model, program, leaves, dtype, tol, resident, moved)
    if again["pass"]:
        sums.update(leaf_sums(torch, model, moved, resident))
        return load
    return {**load, "pass": False, "failed": [{**f, "written": step} for f in again["failed"]]}
