"""The lock's load stage: every leaf the module holds against the VM's, bit for bit, before the first
step and (where the floors read the module's own weights) after each; and what a leaf known so
lets the lock skip reading: a view of it, a map of the very bytes the VM maps."""

import math
import os

import numpy as np
import xxhash

from ..ops import release
from .compare import as_dtype, compare, figures, nan_equal, numpy_dtype, same_bits


def _held(torch, program, name, dtype):
    """The dtype the module holds a leaf in: the lock's, but an Int leaf in fp32 under bfloat16."""
    if dtype == torch.bfloat16 and not program.decls[name].real:
        return torch.float32
    return dtype


def unholdable(torch, program, weights_dir, leaves, dtype):
    """Why a module of `dtype` cannot hold the leaves the VM read (`vm.Leaves`, with each one's
    largest finite value: one that rounds to Inf there, 1e39 in float32), naming the file or the
    program's line and the leaf, or None: the program's float64 meaning needs the value, so no
    module of that dtype computes it (an error of the check, not the bundle's fault)."""
    for name, peak in leaves.peaks.items():
        held = _held(torch, program, name, dtype)
        if held == torch.float64:
            continue
        source = leaves.sources[name]
        where = (f"{program.path or 'the program'}: `{name}` (declared at line {program.decls[name].line}) "
                 "is filled with" if source == "declared" else f"{os.path.join(weights_dir, source)}: `{name}` holds")
        check = f"a {str(dtype).split('.')[-1]} check cannot run on it"
        if math.isinf(torch.tensor(peak, dtype=torch.float64).to(held).item()):
            return (f"{where} {peak:.4g}, beyond what {held} holds (its largest value is "
                    f"{torch.finfo(held).max:.4g}): {check}")
        inexact = _inexact_integer(program, name, leaves, held, torch)
        if inexact is not None:   # (an Int leaf: a token id, a position, compared exactly)
            return (f"{where} the integer {inexact}, which {str(held).split('.')[-1]} rounds (it holds every integer "
                    f"up to 2^{_whole_bits(torch, held)} only): {check}")
    return None


def _whole_bits(torch, dtype):
    """n where `dtype` holds every integer up to 2^n (its significand's bits: 24 for float32)."""
    return round(math.log2(2 / torch.finfo(dtype).eps))


def _inexact_integer(program, name, leaves, held, torch):
    """An Int leaf's first value that `held` does not hold exactly, or None (looked for only where
    its largest magnitude is past the integers `held` holds all of)."""
    if program.decls[name].real or abs(leaves.peaks[name]) <= 2 ** _whole_bits(torch, held):
        return None
    v = np.array(leaves.values[name], dtype=np.float64).reshape(-1)   # (a copy: small, writable)
    bad = np.flatnonzero(torch.from_numpy(v).to(held).to(torch.float64).numpy() != v)
    return int(v[bad[0]]) if bad.size else None


def _same_bytes(torch, got, want, name, resident):
    """Whether the module's leaf is an untouched map of the very bytes of the VM's (a map of the same
    file at the same offset, in the same dtype): equal bit for bit without reading either."""
    return (isinstance(want, np.memmap) and want.filename is not None and want.flags.c_contiguous
            and got.is_contiguous() and numpy_dtype(got.dtype) is not None and numpy_dtype(got.dtype) == want.dtype
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
    if isinstance(vm_leaf, np.memmap) and numpy_dtype(leaf.dtype) is not None and numpy_dtype(leaf.dtype) == vm_leaf.dtype:
        return False
    was = loaded.get(name)
    return was is not None and was[0] is leaf and leaf._version == was[1] and leaf.data_ptr() == was[2] \
        and same_view_elements(got, want, leaf.detach(), vm_leaf)


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


def load_stage(torch, model, program, leaves, dtype, tol, resident, names=None, sums=None):
    """Every leaf buffer (of `names`, where given) against the VM's leaf rounded to the dtype the
    module holds it in: equal, bit for bit. Returns {"pass", "leaves", "failed": [{leaf, line,
    figures}]} (rows in blocks: a 1 GB table costs no copy). `sums`: a dict given the `_sum` of
    each leaf compared that passed, its bytes hashed block by block as they were compared (read
    once, where hashing it after took a second read of every float64 weight)."""
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
        hashed = xxhash.xxh3_64() if sums is not None and ok and not same and _hashable(got) else None
        for r in range(0, want.shape[0], rows) if ok and not same else ():
            block = got[r:r + rows]
            if not _widened_equal(block, want[r:r + rows], scratch):
                b = as_dtype(torch, scratch, want[r:r + rows], held)
                if not (same_bits(torch, block, b) or nan_equal(torch, block, b)):
                    ok = False
            release(want)
            if not ok:
                break
            if hashed is not None:
                hashed.update(block.reshape(-1).view(torch.uint8).numpy())
        if not ok:
            m = compare(got if got is not None else np.zeros(0), want, tol)
            m["pass"] = False
            failed.append({"leaf": name, "line": program.decls[name].line, **figures(m),
                           "dtype": None if got is None else str(got.dtype)})
        elif hashed is not None:
            sums[name] = (buf, buf.data_ptr(), tuple(buf.shape), buf.stride(), buf.dtype, hashed.intdigest())
        release(want)
        resident.release([name])
    return {"pass": not failed, "leaves": len(names), "failed": failed}


def _hashable(t):
    """Whether `bytes_hash` hashes `t` as its blocks of rows, in order (contiguous, on the CPU)."""
    return t.device.type == "cpu" and t.is_contiguous() and not t.is_neg() and not t.is_conj() and t.numel() > 1


def bytes_hash(torch, t):
    """The 64-bit XXH3 hash of a contiguous CPU tensor's bytes, else None: one read at about 7 GB/s
    here, where zlib's CRC-32 took 1 (any change of the bytes keeps it by a chance of 2^-64)."""
    t = t.detach()
    if t.device.type != "cpu" or not t.is_contiguous() or t.is_neg() or t.is_conj():
        return None
    flat = t.reshape(-1)
    if flat.numel() <= 1 and flat.stride(0) != 1:   # (one value: contiguous at any stride)
        flat = flat.clone(memory_format=torch.contiguous_format)
    return xxhash.xxh3_64_intdigest(flat.view(torch.uint8).numpy())


def _sum(torch, t):
    """A leaf's tensor, where its values start, shape, strides, dtype, and its bytes' hash."""
    return None if t is None else (t, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, bytes_hash(torch, t))


def leaf_sums(torch, model, names, resident, known=None):
    """{leaf: _sum} of the module's leaves `names` that are its own memory, what still_loaded holds
    such a leaf to, to know it unchanged with one read of its bytes (a write through any view,
    `.data` or NumPy; a leaf rebound or its storage swapped), not a cast and a comparison of the
    VM's values. (A leaf that maps its file is known unchanged from its pages, whatever wrote it:
    resident.maps_as.) `known`: load_stage's `sums`, taken where they are of the leaf's tensor."""
    known = known or {}
    return {n: known[n] if n in known and known[n][0] is getattr(model, "leaf_" + n, None)
            else _sum(torch, getattr(model, "leaf_" + n, None)) for n in names if n not in resident.ranges}


def _unchanged(torch, model, name, was):
    t = getattr(model, "leaf_" + name, None)
    return was is not None and t is was[0] and was[5] is not None and _sum(torch, t) == was


def still_loaded(torch, model, program, leaves, dtype, tol, resident, load, step, sums):
    """The load stage again after a step, over the constant leaves: a weight the module wrote
    while it ran (through any view, `.data` or NumPy) is a failure naming it, `written` at `step`
    (else `load` as it was). `sums` (leaf_sums', kept up to date here): a leaf still the tensor,
    place and bytes' hash it passed with is not compared again (a change keeps the hash by a
    chance of 2^-64). What it finds is a module's writes, not one built to hide them: a hash can
    be kept on purpose, as a weight can be put back before the step ends, which no check between
    steps sees."""
    moved = [n for n in program.leaves if n not in program.states and not _unchanged(torch, model, n, sums.get(n))]
    hashed = {}
    again = load_stage(torch, model, program, leaves, dtype, tol, resident, moved, hashed)
    if again["pass"]:
        sums.update(leaf_sums(torch, model, moved, resident, hashed))
        return load
    return {**load, "pass": False, "failed": [{**f, "written": step} for f in again["failed"]]}
