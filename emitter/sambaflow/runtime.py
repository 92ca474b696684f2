"""The torch side of every bundle: the functions model.py is made of, as a real module.

The emitter copies from this file, verbatim and without importing it (emission never imports
torch), the functions a program's calls name, `ProgramModule`, `load_weights` and `main` into each
bundle's model.py, with the weights folder's reader they use (weight_files.py); the tests import it and check each function against the VM. The module-level
names below are what model.py defines for its own program.
"""

import argparse
import json
import math
import mmap
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .weight_files import WeightsError, weight_array, weight_places  # copied into model.py

EPS = 1e-6
PROGRAM = None
LEAVES = {}     # name -> ((rows, cols), role, "real" | "int")
FILLS = {}      # name -> ((flat index, value), ...)
INPUTS = ()
STATES = ()
REQUIRED = ()   # leaves read with no declared value: each needs a value from the weights
PRECISION = {}  # stage -> (compute, output), "fp32" or "bf16": followed when the module runs in bfloat16
OUTPUT = None


def rmsnorm(x, w, nr, nc, eps):
    """RMSNorm of x viewed as nr rows of nc: x / sqrt(mean(x^2) + eps), then times w (nc values)."""
    v = x.reshape(nr, nc)
    y = v / torch.sqrt((v * v).mean(dim=1, keepdim=True) + eps)
    if w is not None:
        y = y * w.reshape(1, nc)
    return y.reshape(x.shape)


def l2norm(x, nr, nc):
    """x viewed as nr rows of nc, each row divided by sqrt(sum(x^2) + EPS)."""
    v = x.reshape(nr, nc)
    return (v / torch.sqrt((v * v).sum(dim=1, keepdim=True) + EPS)).reshape(x.shape)


def layernorm(x, w, b, eps):
    """Per row: (x - mean) / sqrt(biased variance + eps) * w + b."""
    mean = x.mean(dim=1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w.reshape(1, -1) + b.reshape(1, -1)


def rope(q, rc, rs, heads, hd, half):
    """NEOX rotary per head of hd: pairs (i, i + half) for i < half turn by (cos, sin); the rest pass."""
    v = q.reshape(heads, hd)
    x, y = v[:, :half], v[:, half:2 * half]
    c, s = rc.reshape(1, half), rs.reshape(1, half)
    return torch.cat([x * c - y * s, x * s + y * c, v[:, 2 * half:]], dim=1).reshape(q.shape)


def attention(q, k, v, heads, groups, hd):
    """One query over L cached rows; query head h reads KV group h // (heads // groups)."""
    group = torch.arange(heads) // (heads // groups)
    kh = k.reshape(k.shape[0], groups, hd)[:, group, :]
    vh = v.reshape(v.shape[0], groups, hd)[:, group, :]
    scores = torch.einsum("lhd,hd->hl", kh, q.reshape(heads, hd)) / math.sqrt(hd)
    return torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=1), vh).reshape(1, heads * hd)


def full_attention(q, k, v, heads, hd):
    """Unmasked self-attention of T rows per head: softmax(Q K^T / sqrt(hd)) V."""
    rows = q.shape[0]
    qh, kh, vh = (t.reshape(rows, heads, hd).transpose(0, 1) for t in (q, k, v))
    p = torch.softmax(qh @ kh.transpose(1, 2) / math.sqrt(hd), dim=2)
    return (p @ vh).transpose(0, 1).reshape(rows, heads * hd)


def gelu_tanh(x):
    """The tanh GELU written with one exponential: x / (1 + e^(-2z)), z = sqrt(2/pi)(x + 0.044715 x^3)."""
    z = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return x / (1.0 + torch.exp(-2.0 * z))


def softmax_rows(x):
    """Softmax of each row."""
    return torch.softmax(x, dim=1)


def swiglu(g, u):
    """silu(g) * u."""
    return F.silu(g) * u


def causal_conv(x, wc, cs):
    """Depthwise causal conv of one token: the ring drops its oldest row and takes x; returns
    (column sums of ring * wc, the new ring)."""
    ring = torch.cat([cs[1:], x.reshape(1, -1)], dim=0)
    return (ring * wc).sum(dim=0, keepdim=True), ring


def decay(ar, dt, alog):
    """Gated DeltaNet's forget gate as the sugar defines it: (1 + e^(ar + dt)) ^ alog."""
    return torch.pow(1.0 + torch.exp(ar + dt), alog)


def gated_delta(q, k, v, z, beta, alpha, s, gn, hv, hk, d):
    """One Gated DeltaNet step; value head h reads key head h % hk. Per head:
    u = S k; S = alpha S + beta (v - alpha u) k^T; o = S q / sqrt(d); out = gn * rmsnorm(o) * silu(z).
    Returns (out, the new memory)."""
    key = torch.arange(hv) % hk
    qh, kh = q.reshape(hk, d)[key], k.reshape(hk, d)[key]
    S = s.reshape(hv, d, d)
    a, b = alpha.reshape(hv, 1), beta.reshape(hv, 1)
    u = (S @ kh.unsqueeze(2)).squeeze(2)
    S = a.unsqueeze(2) * S + (b * (v.reshape(hv, d) - a * u)).unsqueeze(2) * kh.unsqueeze(1)
    o = (S @ qh.unsqueeze(2)).squeeze(2) / math.sqrt(d)
    o = o / torch.sqrt((o * o).mean(dim=1, keepdim=True) + EPS)
    out = gn.reshape(1, d) * o * F.silu(z.reshape(hv, d))
    return out.reshape(1, hv * d), S.reshape(s.shape)


def top_mask(s, k):
    """1 where an entry is among the k largest of its row (its last dimension), else 0; ties go to
    the lower index. An entry's rank is how many entries beat it (larger, or equal and earlier):
    comparisons of fixed shape, no sort or topk (whose ties torch leaves unspecified)."""
    a, b = s.unsqueeze(-2), s.unsqueeze(-1)                  # [..., e, j]: s_j, s_e
    beats = (a > b) | (a == b).tril(-1)                      # tril(-1): j comes before e
    return (beats.sum(dim=-1) < k).to(s.dtype)


def softmax_routing(l, k, renormalised):
    """Softmax over each row's experts, the top k kept (ties to the lower index), the rest 0;
    renormalised: the kept divided by their sum."""
    p = torch.softmax(l, dim=1)
    w = p * top_mask(p, k)
    return w / w.sum(dim=1, keepdim=True) if renormalised else w


def sigmoid_routing(l, bias, k, kept, groups, renormalised, factor):
    """DeepSeek-V3's router: s = sigmoid(l), c = s + bias; the best `kept` of `groups` groups by
    the sum of each group's two best c; the top k of c within them (ties to the lower index);
    the weights s there, renormalised if said, times factor."""
    s = torch.sigmoid(l)
    c = s if bias is None else s + bias
    if groups > 1:
        g = c.reshape(c.shape[0], groups, -1)
        score = (g * top_mask(g, 2)).sum(dim=2)
        keep = top_mask(score, kept).repeat_interleave(g.shape[2], dim=1)
        c = torch.where(keep > 0, c, torch.full_like(c, -math.inf))
    w = s * top_mask(c, k)
    if renormalised:
        w = w / w.sum(dim=1, keepdim=True)
    return w * factor


def experts(x, r, wg, wu, wd, n):
    """Routed SwiGLU experts in dense form: every expert on every row, each expert's F columns
    weighted by its routing weight (0 when not chosen), then the stacked down projections:
    sum over e of r[:, e] * (silu(x wg_e) * (x wu_e)) wd_e, in three matmuls of fixed shape. An
    expert not chosen adds nothing, even where its activation overflows (inf × 0 is NaN): its
    columns are 0, as the VM, which never runs it, has them."""
    h = F.silu(x @ wg) * (x @ wu)
    w = r.repeat_interleave(wg.shape[1] // n, dim=1)
    return torch.where(w != 0, h * w, torch.zeros((), dtype=h.dtype)) @ wd


def row_index(index, rows, name):
    """A row index's value checked as the VM checks it: a whole number in 0..rows-1, else a
    ValueError naming the index tensor (index_select would truncate 1.5 and fail on 12 with no
    name). Only where the value can be read: not while torch.fx, jit or export trace the module."""
    if type(index) is torch.Tensor and not torch.jit.is_tracing() and not torch.compiler.is_compiling():
        v = float(index.reshape(-1)[0])
        if not (math.isfinite(v) and v == int(v) and 0 <= v < rows):
            raise ValueError(f"the row index `{name}` is {v!r}, not a row number in 0..{rows - 1}")


def row_of(table, tok, name="tok"):
    """Row tok (a 1 by 1 tensor holding a row number; `name`, the tensor's) of table, as 1 by C."""
    row_index(tok, table.shape[0], name)
    return table.index_select(0, tok.reshape(1).long())


def set_row(table, pos, row, name="pos"):
    """The table with row pos (an int, or a 1 by 1 tensor named `name`) replaced by row, out of place."""
    row_index(pos, table.shape[0], name)
    index = torch.tensor([pos]) if isinstance(pos, int) else pos.reshape(1).long()
    return table.index_copy(0, index, row.reshape(1, -1))


class ProgramModule(nn.Module):
    """What every program's module shares. Every leaf is a buffer `leaf_<name>` holding its value
    from `weights` (shared, not copied, when already of `dtype`; a state is copied, since each
    step writes it back in place), else its declared zeros with the program's fills; a leaf in
    REQUIRED must be in `weights`. `forward` (the subclass's: the program) takes the inputs as
    parameters, each defaulting to its buffer."""

    probe = None  # the lock check's hook: sees each stage's value and may hand back its own

    def __init__(self, weights=None, dtype=torch.float32):
        super().__init__()
        weights = weights or {}
        self.low = dtype == torch.bfloat16   # then each stage follows PRECISION
        missing = [name for name in REQUIRED if name not in weights]
        if missing:
            raise ValueError(f"no value for {', '.join(missing)}: read by the program with no "
                             "declared value, so the weights must hold them")
        for name, (shape, role, kind) in LEAVES.items():
            held = torch.float32 if self.low and kind == "int" else dtype   # ids exact in fp32
            if name in weights:
                value = torch.as_tensor(weights[name]).to(held).reshape(shape)
                if name in STATES:  # written back in place: never into the caller's tensor
                    value = value.clone()
            else:
                value = torch.zeros(shape, dtype=held)
                for index, item in FILLS.get(name, ()):
                    if abs(item) > torch.finfo(held).max:   # (torch refuses it with a RuntimeError)
                        raise ValueError(f"`{name}` item {index + 1} is {item!r}, past what {str(held)[6:]} holds")
                    value.view(-1)[index] = item
            self.register_buffer("leaf_" + name, value)

    def cast(self, stage, x, moved=False, widened=False):
        """An operand in its stage's compute precision when the module runs in bfloat16. An op that
        only `moved` its operand's values (a view, a gather) gets it uncast unless the cast rounds
        what the output keeps (bf16 compute of a float32 operand, float32 output): a widening cast
        is exact and tap rounds the output anyway, so the values are the same, without a widened
        copy of a whole table each step. An operand the op `widened` itself (matmul's weight, a
        block at a time) is left as it is held where the stage computes in fp32."""
        if self.low and x.is_floating_point():
            compute, out = PRECISION.get(stage, "bb")
            if moved and not (compute != "fp32" and out == "fp32" and x.dtype == torch.float32):
                return x
            if widened and compute == "fp32":
                return x
            return x.to(torch.float32 if compute == "fp32" else torch.bfloat16)
        return x

    def matmul(self, a, b):
        """a @ b. In bfloat16, where b is held otherwise than a (a bf16 weight beside the stage's
        fp32 activations: the RDU reads its weights as they are and accumulates in fp32), b is
        widened to a's precision a block at a time (about 1 MiB in fp32), never whole: gemma3's
        tied 262144 by 640 table widened whole was 671 MB of fresh pages at every step, a third of
        its bf16 check. The blocks follow b's layout: columns of a transposed table or of a
        row-major b with short columns (each block reads whole cache lines), else rows, their
        products summed."""
        if not self.low or a.dtype == b.dtype:
            return a @ b
        k, n = b.shape
        cols = max(1, (1 << 18) // max(1, k))
        if b.stride(0) == 1 or cols >= 64:
            out = a.new_empty((a.shape[0], n))     # every column written once
            for j in range(0, n, cols):
                out[:, j:j + cols] = a @ b[:, j:j + cols].to(a.dtype)
        else:
            out = a.new_zeros((a.shape[0], n))     # the rows' products summed into it
            rows = max(1, (1 << 18) // max(1, n))
            for i in range(0, k, rows):
                out += a[:, i:i + rows] @ b[i:i + rows].to(a.dtype)
        return out

    def tap(self, stage, value):
        """Each stage's value passes here: rounded to its output precision when the module runs in
        bfloat16, and handed to the lock check's probe when one is set."""
        if self.low:
            out = torch.float32 if PRECISION.get(stage, "bb")[1] == "fp32" else torch.bfloat16
            value = tuple(v.to(out) for v in value) if isinstance(value, tuple) else value.to(out)
        return value if self.probe is None else self.probe(stage, value)


def load_weights(directory, dtype=torch.float32, allow_nonfinite=()):
    """Every leaf's values in `directory` (`<name>.f64`, `.f32` or `.npy`, or a tensor of a
    `.safetensors` file: weight_places), as a tensor of `dtype` (a copy-on-write map of the file
    when it is of `dtype`: no copy in memory). A leaf in REQUIRED that no file holds, a file of
    another shape, size or dtype, a leaf in two files, NaN or Inf (outside `allow_nonfinite`) and
    a non-integer in an Int leaf are WeightsErrors naming the file. A leaf of another dtype is
    cast block by block as it is checked: the file is read once."""
    if not os.path.isdir(directory):
        raise WeightsError(directory, "the weights directory does not exist")
    places, _ = weight_places(directory, LEAVES)
    weights = {}
    for name, (shape, role, kind) in LEAVES.items():
        if name not in places:
            if name in REQUIRED:
                raise WeightsError(directory, f"no file holds the {role} `{name}` ({name}.f64, "
                                   f".f32, .npy or a tensor of a .safetensors file), which has no "
                                   "declared value")
            continue
        data = weight_array(directory, places[name], name, shape[0], shape[1], mode="c")
        path = os.path.join(directory, places[name][0])
        what = f"`{name}`" + (f" (tensor `{places[name][1]}`)" if places[name][1] else "")
        held = torch.float32 if dtype == torch.bfloat16 and kind == "int" else dtype   # ids exact
        source = torch.from_numpy(data).reshape(-1)
        out = source if source.dtype == held else torch.empty(data.size, dtype=held)
        flat, block = data.reshape(-1), 1 << 18   # in blocks: no whole-table temporary
        check = not (name in allow_nonfinite and kind != "int")
        base = data.offset % mmap.ALLOCATIONGRANULARITY if isinstance(data, np.memmap) else 0
        for i in range(0, flat.size, block) if check or out is not source else ():
            part = flat[i:i + block]
            hi, lo = (part.max(), part.min()) if check and part.size else (0.0, 0.0)   # (NaN: both NaN)
            finite = name in allow_nonfinite or bool(np.isfinite(hi) and np.isfinite(lo))
            whole = kind != "int" or bool(np.array_equal(part, np.round(part)))
            if out is not source:
                out[i:i + part.size].copy_(source[i:i + part.size])
            if isinstance(data, np.memmap):   # read: a map's pages come back when the forward reads them
                start = base + i * data.itemsize
                start -= start % mmap.PAGESIZE
                data._mmap.madvise(mmap.MADV_DONTNEED, start, base + (i + part.size) * data.itemsize - start)
            if not finite:
                raise WeightsError(path, f"{what} holds a non-finite value")
            if name not in allow_nonfinite and max(float(hi), -float(lo)) > torch.finfo(held).max:   # (Inf)
                raise WeightsError(path, f"{what} holds a value past what {str(held)[6:]} holds (it would be Inf)")
            if not whole:
                raise WeightsError(path, f"{what} is an Int tensor (a row index, a token) but holds "
                                         "a non-integer")
        weights[name] = out.reshape(shape)
    return weights


def main(argv=None):
    """`python model.py --weights DIR --dtype float64 --steps N --out FILE`: run the program. A bad
    input (a weights file, a row index, the output's path) is one line naming it, exit 1."""
    ap = argparse.ArgumentParser(description=f"run the LOGOS tensor program {PROGRAM} in torch")
    ap.add_argument("--weights", help="directory of the leaves' files: <var>.f64 / .f32 / .npy, "
                    "or .safetensors files of tensors named by variable (else declared values)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--steps", type=int, default=1, help="run forward this many times, states carried")
    ap.add_argument("--out", help="write the output as raw little-endian values of --dtype")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error(f"--steps must be at least 1, got {args.steps}")
    dtype = getattr(torch, args.dtype)
    try:
        model = LogosModule(load_weights(args.weights, dtype) if args.weights else {}, dtype)
        with torch.no_grad():
            for _ in range(args.steps):
                out = model()
        if args.out:
            out.reshape(-1).numpy().astype("<f8" if args.dtype == "float64" else "<f4").tofile(args.out)
    except (ValueError, OSError) as e:   # the input's fault: said in one line, no traceback
        raise SystemExit(f"model.py: {e}") from None
    print(json.dumps({"program": PROGRAM, "output": OUTPUT, "shape": list(out.shape),
                      "dtype": args.dtype, "steps": args.steps}))


LogosModule = ProgramModule  # model.py defines its own: the program's forward
