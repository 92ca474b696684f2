"""Every op of the tensor sugar, defined once: sentence pattern, shape rule, VM meaning, torch spelling.

An op's entry in `OPS` is all there is to it: the reader matches its `pattern`, checks its `shape`
rule, the VM runs its `vm` meaning (NumPy, float64) and the emitter prints its `helper` source and
its `call`. An op whose `call` is None (`moe`) is read, and refused by name at emission.

Patterns: lowercase words are literal, words that start with a capital are placeholders (a tensor
name, or an integer literal when listed in `ints`, or either when listed in `index`), and `[...]`
is an optional group.
"""

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

EPS = 1e-6


class ShapeError(Exception):
    """A shape rule's refusal; the reader turns it into a ProgramError at the sentence's line."""


class Args:
    """One op's bound placeholders, as a shape rule, a VM meaning or a torch renderer sees them."""

    def __init__(self, bound, shapes, values=None):
        self.bound = bound
        self.shapes = shapes
        self.values = values

    def has(self, p):
        return p in self.bound

    def name(self, p):
        return self.bound[p]

    def int(self, p):
        return self.bound[p]

    def shape(self, p):
        return self.shapes[self.bound[p]]

    def size(self, p):
        rows, cols = self.shape(p)
        return rows * cols

    def __getitem__(self, p):
        """The value bound to a tensor placeholder, widened to float64 (a no-op when it is)."""
        return np.asarray(self.values[self.bound[p]], dtype=np.float64)


@dataclass(frozen=True)
class Op:
    name: str
    pattern: str
    shape: Callable[[Args], tuple]
    vm: Callable[[Args], object]
    call: Optional[Callable[[Args], str]]
    spelling: Optional[str]
    helper: str = ""
    ints: tuple = ()
    index: tuple = ()
    writes: Optional[str] = None
    inputs_order: tuple = field(default=())

    def placeholders(self):
        return [w for w in _words(self.pattern) if w[0].isupper()]

    def tensor_inputs(self, bound):
        """The tensor names this op reads, in its pattern's (or `inputs_order`'s) order."""
        order = self.inputs_order or tuple(self.placeholders())
        out = []
        for p in order:
            if p in bound and p not in self.ints and isinstance(bound[p], str):
                out.append(bound[p])
        return out


def _words(pattern):
    return pattern.replace("[", " ").replace("]", " ").split()


def parse_pattern(pattern):
    """A pattern as a list of items: a word, or a list of words for an optional group."""
    items, group = [], None
    for tok in pattern.replace("[", " [ ").replace("]", " ] ").split():
        if tok == "[":
            group = []
        elif tok == "]":
            items.append(group)
            group = None
        elif group is not None:
            group.append(tok)
        else:
            items.append(tok)
    return items


def match(items, words):
    """Bind `words` to a parsed pattern: a dict placeholder -> word, or None if they do not fit."""

    def go(i, j, bound):
        if i == len(items):
            return bound if j == len(words) else None
        item = items[i]
        if isinstance(item, list):
            got = go_seq(item, j, bound)
            if got is not None:
                done = go(i + 1, got[0], got[1])
                if done is not None:
                    return done
            return go(i + 1, j, bound)
        got = go_seq([item], j, bound)
        return None if got is None else go(i + 1, got[0], got[1])

    def go_seq(seq, j, bound):
        if j + len(seq) > len(words):
            return None
        new = dict(bound)
        for k, tok in enumerate(seq):
            w = words[j + k]
            if tok[0].isupper():
                new[tok] = w
            elif w != tok:
                return None
        return j + len(seq), new

    return go(0, 0, {})


def key_of(items):
    """(position, word) of the pattern's first literal word: what names the op in a sentence."""
    for pos, item in enumerate(items):
        if isinstance(item, list):
            break
        if not item[0].isupper():
            return pos, item
    raise AssertionError("a pattern starts with a literal word within its fixed part")


# ── shape rules and helpers shared by several ops ─────────────────────────────────────────────────

def _same(a, p, q, what="the same shape"):
    if a.shape(p) != a.shape(q):
        raise ShapeError(f"`{a.name(q)}` is {_fmt(a.shape(q))} but must have {what} as "
                         f"`{a.name(p)}` ({_fmt(a.shape(p))})")


def _fmt(shape):
    return f"{shape[0]} by {shape[1]}"


def _values(a, p, n, what):
    if a.size(p) != n:
        raise ShapeError(f"`{a.name(p)}` ({_fmt(a.shape(p))}) must hold {n} values ({what})")


def _divides(n, by, what):
    if by <= 0 or n % by:
        raise ShapeError(f"{what}: {by} does not divide {n}")


def _row_vector(a, p):
    if a.shape(p)[0] != 1:
        raise ShapeError(f"`{a.name(p)}` must be 1 by C, is {_fmt(a.shape(p))}")


def _broadcast_shape(a):
    (r, c), (rb, cb) = a.shape("A"), a.shape("B")
    if (rb, cb) != (r, c) and not (rb == 1 and cb == c):
        raise ShapeError(f"`{a.name('B')}` is {_fmt((rb, cb))}: it must be {_fmt((r, c))} like "
                         f"`{a.name('A')}`, or 1 by {c} to broadcast over its rows")
    return r, c


def _view(a):
    """(nr, nc): the rows a norm works on, across heads or X's own."""
    rows, cols = a.shape("X")
    if a.has("H"):
        h = a.int("H")
        _divides(rows * cols, h, f"across {h} heads")
        return h, rows * cols // h
    return rows, cols


def _norm_shape(a):
    nr, nc = _view(a)
    if a.has("R"):
        _same(a, "X", "R")
    if a.has("R") and not a.has("W"):
        raise ShapeError("a fused-add rmsnorm (`plus R`) carries a weight (`with weight W`)")
    if a.has("W"):
        _values(a, "W", nc, "one per column of the normalised view")
    return a.shape("X")


def _rope_dims(a):
    """(heads, hd, half) of a rope."""
    _row_vector(a, "Q")
    _row_vector(a, "RC")
    _same(a, "RC", "RS")
    cols, half = a.shape("Q")[1], a.shape("RC")[1]
    if a.has("H"):
        heads = a.int("H")
        _divides(cols, heads, f"across {heads} heads")
        hd = cols // heads
    else:
        hd = 2 * half
        _divides(cols, hd, f"a rope without heads rotates 2·half = {hd} values at a time")
        heads = cols // hd
    if 2 * half > hd:
        raise ShapeError(f"the cos/sin tables hold {half} values, more than half a head ({hd})")
    return heads, hd, half


def _rope_shape(a):
    _rope_dims(a)
    return a.shape("Q")


def _attention_dims(a):
    _row_vector(a, "Q")
    heads, groups = a.int("H"), a.int("KV")
    _divides(a.shape("Q")[1], heads, f"{heads} heads")
    _divides(heads, groups, f"{heads} heads in {groups} KV groups")
    hd = a.shape("Q")[1] // heads
    _same(a, "K", "V")
    if a.shape("K")[1] != groups * hd:
        raise ShapeError(f"`{a.name('K')}` has {a.shape('K')[1]} columns, not {groups} groups × "
                         f"{hd} (the head size)")
    return heads, groups, hd


def _attention_shape(a):
    _attention_dims(a)
    return a.shape("Q")


def _full_attention_shape(a):
    _same(a, "Q", "K")
    _same(a, "Q", "V")
    _divides(a.shape("Q")[1], a.int("H"), f"{a.int('H')} heads")
    return a.shape("Q")


def _layernorm_shape(a):
    cols = a.shape("X")[1]
    _values(a, "W", cols, "one per column")
    _values(a, "B", cols, "one per column")
    return a.shape("X")


def _conv_shape(a):
    _row_vector(a, "X")
    taps, cols = a.int("T"), a.shape("X")[1]
    for p in ("WC", "CS"):
        if a.shape(p) != (taps, cols):
            raise ShapeError(f"`{a.name(p)}` is {_fmt(a.shape(p))}, must be {taps} taps by {cols}")
    return a.shape("X")


def _decay_shape(a):
    _same(a, "Ar", "Dt")
    _same(a, "Ar", "Alog")
    return a.shape("Ar")


def _delta_dims(a):
    hv, hk = a.int("HV"), a.int("HK")
    _row_vector(a, "Q")
    _divides(a.shape("Q")[1], hk, f"{hk} key heads")
    d = a.shape("Q")[1] // hk
    _same(a, "Q", "K")
    for p in ("V", "Z"):
        if a.shape(p) != (1, hv * d):
            raise ShapeError(f"`{a.name(p)}` is {_fmt(a.shape(p))}, must be 1 by {hv * d} "
                             f"({hv} value heads of {d})")
    _values(a, "B", hv, "one per value head")
    _values(a, "A", hv, "one per value head")
    _values(a, "S", hv * d * d, f"{hv} value heads of {d} by {d}")
    _values(a, "GN", d, "one per head column")
    return hv, hk, d


def _delta_shape(a):
    hv, _, d = _delta_dims(a)
    return 1, hv * d


def _index_check(a, p, table):
    """A literal row index must lie in the table; a tensor index must be 1 by 1."""
    rows = a.shape(table)[0]
    idx = a.bound[p]
    if isinstance(idx, int):
        if idx >= rows:
            raise ShapeError(f"row {idx} is outside `{a.name(table)}`, which has {rows} rows")
    elif a.shapes[idx] != (1, 1):
        raise ShapeError(f"the row index `{idx}` must be 1 by 1, is {_fmt(a.shapes[idx])}")


def _row_shape(a):
    _index_check(a, "TOK", "TABLE")
    return 1, a.shape("TABLE")[1]


def _set_row_shape(a):
    _index_check(a, "P", "TABLE")
    if a.shape("ROW") != (1, a.shape("TABLE")[1]):
        raise ShapeError(f"`{a.name('ROW')}` is {_fmt(a.shape('ROW'))}, must be 1 by "
                         f"{a.shape('TABLE')[1]} (a row of `{a.name('TABLE')}`)")
    return a.shape("TABLE")


# ── VM meanings (NumPy float64) ───────────────────────────────────────────────────────────────────

def np_sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))


def np_silu(x):
    return x * np_sigmoid(x)


def np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _vm_rmsnorm(a):
    x = a["X"] + a["R"] if a.has("R") else a["X"]
    nr, nc = _view(a)
    v = x.reshape(nr, nc)
    y = v / np.sqrt((v * v).mean(axis=1, keepdims=True) + EPS)
    if a.has("W"):
        y = y * a["W"].reshape(1, nc)
    return y.reshape(x.shape)


def _vm_l2norm(a):
    nr, nc = _view(a)
    v = a["X"].reshape(nr, nc)
    return (v / np.sqrt((v * v).sum(axis=1, keepdims=True) + EPS)).reshape(a["X"].shape)


def _vm_rope(a):
    heads, hd, half = _rope_dims(a)
    v = a["Q"].reshape(heads, hd)
    x, y = v[:, :half], v[:, half:2 * half]
    c, s = a["RC"].reshape(1, half), a["RS"].reshape(1, half)
    return np.concatenate([x * c - y * s, x * s + y * c, v[:, 2 * half:]], axis=1).reshape(1, -1)


def _vm_attention(a):
    heads, groups, hd = _attention_dims(a)
    k, v = a["K"], a["V"]
    q = a["Q"].reshape(heads, hd)
    out = np.empty((heads, hd))
    for h in range(heads):
        g = h // (heads // groups)
        kg, vg = k[:, g * hd:(g + 1) * hd], v[:, g * hd:(g + 1) * hd]
        out[h] = np_softmax(kg @ q[h] / math.sqrt(hd), axis=0) @ vg
    return out.reshape(1, heads * hd)


def _vm_full_attention(a):
    heads = a.int("H")
    q, k, v = a["Q"], a["K"], a["V"]
    hd = q.shape[1] // heads
    out = np.empty_like(q)
    for h in range(heads):
        cols = slice(h * hd, (h + 1) * hd)
        p = np_softmax(q[:, cols] @ k[:, cols].T / math.sqrt(hd), axis=1)
        out[:, cols] = p @ v[:, cols]
    return out


def _vm_gelu(a):
    x = a["X"]
    z = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return x / (1.0 + np.exp(-2.0 * z))


def _vm_layernorm(a):
    x = a["X"]
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * a["W"].reshape(1, -1) + a["B"].reshape(1, -1)


def _vm_conv(a):
    ring = np.concatenate([a["CS"][1:], a["X"]], axis=0)
    return (ring * a["WC"]).sum(axis=0, keepdims=True), ring


def _vm_decay(a):
    return np.power(1.0 + np.exp(a["Ar"] + a["Dt"]), a["Alog"])


def _vm_delta(a):
    hv, hk, d = _delta_dims(a)
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


def _vm_argmax(a):
    return np.array([[float(np.argmax(a["X"]))]])


def row_number(value, rows, what):
    """A data-dependent row index (a 1 by 1 tensor's value) as an int, or a ShapeError."""
    v = float(np.asarray(value).reshape(-1)[0])
    if not (math.isfinite(v) and v == int(v) and 0 <= v < rows):
        raise ShapeError(f"{what} is {v!r}, not a row number in 0..{rows - 1}")
    return int(v)


def _index(a, p, table):
    idx = a.bound[p]
    if isinstance(idx, int):
        return idx
    return row_number(a.values[idx], a.values[a.bound[table]].shape[0], f"the row index `{idx}`")


def _vm_row(a):
    table = a.values[a.bound["TABLE"]]  # widen the one row, not the table
    return np.array(table[_index(a, "TOK", "TABLE")], dtype=np.float64).reshape(1, -1)


def _vm_set_row(a):
    table = a["TABLE"].copy()
    table[_index(a, "P", "TABLE")] = a["ROW"].reshape(-1)
    return table


def _vm_moe(a):
    raise ShapeError("`moe` has no meaning the VM or the emitter can give it")


# ── torch helpers (source text printed into model.py) ────────────────────────────────────────────

_RMSNORM_PY = '''
def rmsnorm(x, w, nr, nc):
    """RMSNorm of x viewed as nr rows of nc: x / sqrt(mean(x^2) + EPS), then times w (nc values)."""
    v = x.reshape(nr, nc)
    y = v / torch.sqrt((v * v).mean(dim=1, keepdim=True) + EPS)
    if w is not None:
        y = y * w.reshape(1, nc)
    return y.reshape(x.shape)
'''

_L2NORM_PY = '''
def l2norm(x, nr, nc):
    """x viewed as nr rows of nc, each row divided by sqrt(sum(x^2) + EPS)."""
    v = x.reshape(nr, nc)
    return (v / torch.sqrt((v * v).sum(dim=1, keepdim=True) + EPS)).reshape(x.shape)
'''

_ROPE_PY = '''
def rope(q, rc, rs, heads, hd, half):
    """NEOX rotary per head of hd: pairs (i, i + half) for i < half turn by (cos, sin); the rest pass."""
    v = q.reshape(heads, hd)
    x, y = v[:, :half], v[:, half:2 * half]
    c, s = rc.reshape(1, half), rs.reshape(1, half)
    return torch.cat([x * c - y * s, x * s + y * c, v[:, 2 * half:]], dim=1).reshape(q.shape)
'''

_ATTENTION_PY = '''
def attention(q, k, v, heads, groups, hd):
    """One query over L cached rows; query head h reads KV group h // (heads // groups)."""
    group = torch.arange(heads) // (heads // groups)
    kh = k.reshape(k.shape[0], groups, hd)[:, group, :]
    vh = v.reshape(v.shape[0], groups, hd)[:, group, :]
    scores = torch.einsum("lhd,hd->hl", kh, q.reshape(heads, hd)) / math.sqrt(hd)
    return torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=1), vh).reshape(1, heads * hd)
'''

_FULL_ATTENTION_PY = '''
def full_attention(q, k, v, heads, hd):
    """Unmasked self-attention of T rows per head: softmax(Q K^T / sqrt(hd)) V."""
    rows = q.shape[0]
    qh, kh, vh = (t.reshape(rows, heads, hd).transpose(0, 1) for t in (q, k, v))
    p = torch.softmax(qh @ kh.transpose(1, 2) / math.sqrt(hd), dim=2)
    return (p @ vh).transpose(0, 1).reshape(rows, heads * hd)
'''

_GELU_PY = '''
def gelu_tanh(x):
    """The tanh GELU written with one exponential: x / (1 + e^(-2z)), z = sqrt(2/pi)(x + 0.044715 x^3)."""
    z = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return x / (1.0 + torch.exp(-2.0 * z))
'''

_SOFTMAX_PY = '''
def softmax_rows(x):
    return torch.softmax(x, dim=1)
'''

_LAYERNORM_PY = '''
def layernorm(x, w, b):
    """Per row: (x - mean) / sqrt(biased variance + EPS) * w + b."""
    mean = x.mean(dim=1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=1, keepdim=True)
    return (x - mean) / torch.sqrt(var + EPS) * w.reshape(1, -1) + b.reshape(1, -1)
'''

_CONV_PY = '''
def causal_conv(x, wc, cs):
    """Depthwise causal conv of one token: the ring drops its oldest row and takes x; returns
    (column sums of ring * wc, the new ring)."""
    ring = torch.cat([cs[1:], x.reshape(1, -1)], dim=0)
    return (ring * wc).sum(dim=0, keepdim=True), ring
'''

_DECAY_PY = '''
def decay(ar, dt, alog):
    """Gated DeltaNet's forget gate as the sugar defines it: (1 + e^(ar + dt)) ^ alog."""
    return torch.pow(1.0 + torch.exp(ar + dt), alog)
'''

_DELTA_PY = '''
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
'''

_SWIGLU_PY = '''
def swiglu(g, u):
    return F.silu(g) * u
'''

_ROW_PY = '''
def row_of(table, tok):
    """Row tok (a 1 by 1 tensor holding a row number) of table, as 1 by C."""
    return table.index_select(0, tok.reshape(1).long())
'''

_SET_ROW_PY = '''
def set_row(table, pos, row):
    """The table with row pos (an int, or a 1 by 1 tensor) replaced by row, out of place."""
    index = pos.reshape(1).long() if torch.is_tensor(pos) else torch.tensor([pos])
    return table.index_copy(0, index, row.reshape(1, -1))
'''


# ── torch call renderers ─────────────────────────────────────────────────────────────────────────

def _call_norm(a, helper):
    nr, nc = _view(a)
    x = f"{a.name('X')} + {a.name('R')}" if a.has("R") else a.name("X")
    if helper == "l2norm":
        return f"l2norm({x}, {nr}, {nc})"
    w = a.name("W") if a.has("W") else "None"
    return f"rmsnorm({x}, {w}, {nr}, {nc})"


def _call_rope(a):
    heads, hd, half = _rope_dims(a)
    return f"rope({a.name('Q')}, {a.name('RC')}, {a.name('RS')}, {heads}, {hd}, {half})"


def _call_attention(a):
    heads, groups, hd = _attention_dims(a)
    return f"attention({a.name('Q')}, {a.name('K')}, {a.name('V')}, {heads}, {groups}, {hd})"


def _call_full_attention(a):
    heads = a.int("H")
    hd = a.shape("Q")[1] // heads
    return f"full_attention({a.name('Q')}, {a.name('K')}, {a.name('V')}, {heads}, {hd})"


def _call_delta(a):
    hv, hk, d = _delta_dims(a)
    names = ", ".join(a.name(p) for p in ("Q", "K", "V", "Z", "B", "A", "S", "GN"))
    return f"gated_delta({names}, {hv}, {hk}, {d})"


def _call_row(a):
    tok = a.bound["TOK"]
    if isinstance(tok, int):
        return f"{a.name('TABLE')}[{tok}:{tok + 1}]"
    return f"row_of({a.name('TABLE')}, {tok})"


def _unary(name, pattern_word, vm, call, spelling, helper=""):
    return Op(name, f"{pattern_word} of X", shape=lambda a: a.shape("X"), vm=vm, call=call,
              spelling=spelling, helper=helper)


def _binary(name, vm, fmt, spelling):
    return Op(name, f"A {name} B", shape=_broadcast_shape, vm=vm,
              call=lambda a: fmt.format(a=a.name("A"), b=a.name("B")), spelling=spelling)


def _matmul_shape(a):
    (m, k), (k2, n) = a.shape("A"), a.shape("B")
    if k != k2:
        raise ShapeError(f"inner dimensions disagree: `{a.name('A')}` is {_fmt((m, k))}, "
                         f"`{a.name('B')}` is {_fmt((k2, n))}")
    return m, n


OPS = (
    Op("matmul", "A matmul B", shape=_matmul_shape, vm=lambda a: a["A"] @ a["B"],
       call=lambda a: f"{a.name('A')} @ {a.name('B')}", spelling="a @ b"),
    _binary("plus", lambda a: a["A"] + a["B"], "{a} + {b}", "a + b"),
    _binary("hadamard", lambda a: a["A"] * a["B"], "{a} * {b}", "a * b"),
    Op("rmsnorm", "rmsnorm of X [plus R] [with weight W] [across H heads]", shape=_norm_shape,
       vm=_vm_rmsnorm, call=lambda a: _call_norm(a, "rmsnorm"), spelling="rmsnorm(x, w, nr, nc)",
       helper=_RMSNORM_PY, ints=("H",)),
    Op("rope", "rope of Q with cos RC and sin RS [across H heads]", shape=_rope_shape,
       vm=_vm_rope, call=_call_rope, spelling="rope(q, rc, rs, heads, hd, half)",
       helper=_ROPE_PY, ints=("H",)),
    Op("attention", "attention of Q over K and V with H heads KV groups",
       shape=_attention_shape, vm=_vm_attention, call=_call_attention,
       spelling="attention(q, k, v, heads, groups, hd)", helper=_ATTENTION_PY, ints=("H", "KV")),
    Op("full attention", "full attention of Q over K and V with H heads",
       shape=_full_attention_shape, vm=_vm_full_attention, call=_call_full_attention,
       spelling="full_attention(q, k, v, heads, hd)", helper=_FULL_ATTENTION_PY, ints=("H",)),
    _unary("sigmoid", "sigmoid", lambda a: np_sigmoid(a["X"]),
           lambda a: f"torch.sigmoid({a.name('X')})", "torch.sigmoid(x)"),
    _unary("silu", "silu", lambda a: np_silu(a["X"]), lambda a: f"F.silu({a.name('X')})",
           "F.silu(x)"),
    _unary("gelu", "gelu", _vm_gelu, lambda a: f"gelu_tanh({a.name('X')})", "gelu_tanh(x)",
           _GELU_PY),
    _unary("softmax", "softmax", lambda a: np_softmax(a["X"], axis=1),
           lambda a: f"softmax_rows({a.name('X')})", "softmax_rows(x)", _SOFTMAX_PY),
    Op("transpose", "transpose of X", shape=lambda a: a.shape("X")[::-1],
       vm=lambda a: a["X"].T.copy(), call=lambda a: f"{a.name('X')}.transpose(0, 1)",
       spelling="x.transpose(0, 1)"),
    Op("layernorm", "layernorm of X with weight W and bias B", shape=_layernorm_shape,
       vm=_vm_layernorm, call=lambda a: f"layernorm({a.name('X')}, {a.name('W')}, {a.name('B')})",
       spelling="layernorm(x, w, b)", helper=_LAYERNORM_PY),
    Op("causal conv", "causal conv of X with weight WC state CS over T taps", shape=_conv_shape,
       vm=_vm_conv, call=lambda a: f"causal_conv({a.name('X')}, {a.name('WC')}, {a.name('CS')})",
       spelling="causal_conv(x, wc, cs)", helper=_CONV_PY, ints=("T",), writes="CS"),
    Op("l2norm", "l2norm of X [across H heads]", shape=_norm_shape, vm=_vm_l2norm,
       call=lambda a: _call_norm(a, "l2norm"), spelling="l2norm(x, nr, nc)", helper=_L2NORM_PY,
       ints=("H",)),
    Op("decay", "decay of Ar with bias Dt rate Alog", shape=_decay_shape, vm=_vm_decay,
       call=lambda a: f"decay({a.name('Ar')}, {a.name('Dt')}, {a.name('Alog')})",
       spelling="decay(ar, dt, alog)", helper=_DECAY_PY),
    Op("gated delta", "gated delta of Q over K and V with gate Z beta B decay A state S norm GN "
       "with HV heads HK groups", shape=_delta_shape, vm=_vm_delta, call=_call_delta,
       spelling="gated_delta(q, k, v, z, b, a, s, gn, hv, hk, d)", helper=_DELTA_PY,
       ints=("HV", "HK"), writes="S"),
    Op("swiglu", "swiglu of G and U", shape=lambda a: (_same(a, "G", "U"), a.shape("G"))[1],
       vm=lambda a: np_silu(a["G"]) * a["U"], call=lambda a: f"swiglu({a.name('G')}, {a.name('U')})",
       spelling="swiglu(g, u)", helper=_SWIGLU_PY),
    Op("moe", "moe of X", shape=lambda a: a.shape("X"), vm=_vm_moe, call=None, spelling=None),
    Op("argmax", "argmax of X", shape=lambda a: (1, 1), vm=_vm_argmax,
       call=lambda a: f"torch.argmax({a.name('X')}).reshape(1, 1).to({a.name('X')}.dtype)",
       spelling="torch.argmax(x).reshape(1, 1).to(x.dtype)"),
    Op("embedding", "row TOK of TABLE", shape=_row_shape, vm=_vm_row, call=_call_row,
       spelling="table[tok]", helper=_ROW_PY, index=("TOK",), inputs_order=("TABLE", "TOK")),
)

# `Set row P of TABLE to ROW.` is a sentence of its own (no `Let`): the op that writes TABLE back.
# Its pattern is matched after the leading `Set`.
SET_ROW = Op("set row", "row P of TABLE to ROW", shape=_set_row_shape, vm=_vm_set_row,
             call=lambda a: f"set_row({a.name('TABLE')}, {a.bound['P']}, {a.name('ROW')})",
             spelling="set_row(table, pos, row)", helper=_SET_ROW_PY, index=("P",),
             writes="TABLE", inputs_order=("TABLE", "P", "ROW"))

ALL_OPS = OPS + (SET_ROW,)
BY_NAME = {op.name: op for op in ALL_OPS}

# The names model.py defines at module level for its helpers.
HELPER_NAMES = tuple(sorted(
    line.split("(")[0][4:] for op in ALL_OPS for line in op.helper.splitlines()
    if line.startswith("def ")))


def torch_spelling(name):
    """The torch expression an op is spelled with, or a ValueError naming an op that has none."""
    op = BY_NAME.get(name)
    if op is None or op.spelling is None:
        raise ValueError(f"`{name}` has no torch spelling in the SambaFlow emitter: the routed-expert "
                         "FFN (moe) and anything outside the tensor sugar are refused, never dropped")
    return op.spelling
