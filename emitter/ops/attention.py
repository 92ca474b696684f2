"""Attention: single-query decode attention over a KV table (GQA), and unmasked full attention."""

import math


from .base import Op, ShapeError, divides, np_softmax, row_vector, same, np


def attention_dims(a):
    """(heads, groups, hd) of a decode attention."""
    row_vector(a, "Q")
    heads, groups = a.int("H"), a.int("KV")
    divides(a.shape("Q")[1], heads, f"{heads} heads")
    divides(heads, groups, f"{heads} heads in {groups} KV groups")
    hd = a.shape("Q")[1] // heads
    same(a, "K", "V")
    if a.shape("K")[1] != groups * hd:
        raise ShapeError(f"`{a.name('K')}` has {a.shape('K')[1]} columns, not {groups} groups × "
                         f"{hd} (the head size)")
    return heads, groups, hd


def attention_shape(a):
    attention_dims(a)
    return a.shape("Q")


def attention_vm(a):
    """Query head h reads KV group h // (H/KV); softmax(K_g q_h / sqrt(hd)) over every row, · V_g."""
    heads, groups, hd = attention_dims(a)
    k, v = a["K"], a["V"]
    q = a["Q"].reshape(heads, hd)
    out = np.empty((heads, hd))
    for h in range(heads):
        g = h // (heads // groups)
        kg, vg = k[:, g * hd:(g + 1) * hd], v[:, g * hd:(g + 1) * hd]
        out[h] = np_softmax(kg @ q[h] / math.sqrt(hd), axis=0) @ vg
    return out.reshape(1, heads * hd)


def attention_call(a):
    heads, groups, hd = attention_dims(a)
    return f"attention({a.name('Q')}, {a.name('K')}, {a.name('V')}, {heads}, {groups}, {hd})"


def full_attention_shape(a):
    same(a, "Q", "K")
    same(a, "Q", "V")
    divides(a.shape("Q")[1], a.int("H"), f"{a.int('H')} heads")
    return a.shape("Q")


def full_attention_vm(a):
    """Per head: softmax(Q Kᵀ / sqrt(hd)) V over all T×T pairs, no mask."""
    heads = a.int("H")
    q, k, v = a["Q"], a["K"], a["V"]
    hd = q.shape[1] // heads
    out = np.empty_like(q)
    for h in range(heads):
        cols = slice(h * hd, (h + 1) * hd)
        p = np_softmax(q[:, cols] @ k[:, cols].T / math.sqrt(hd), axis=1)
        out[:, cols] = p @ v[:, cols]
    return out


def full_attention_call(a):
    heads = a.int("H")
    hd = a.shape("Q")[1] // heads
    return f"full_attention({a.name('Q')}, {a.name('K')}, {a.name('V')}, {heads}, {hd})"


# in bfloat16 both accumulate in fp32 (the default precision), the bf16 gate bounding their excess at 4
OPS = (
    Op("attention", "attention of Q over K and V with H heads KV groups", shape=attention_shape,
       vm=attention_vm, call=attention_call, spelling="attention(q, k, v, heads, groups, hd)",
       ints=("H", "KV"), excess=4.0),
    Op("full attention", "full attention of Q over K and V with H heads",
       shape=full_attention_shape, vm=full_attention_vm, call=full_attention_call,
       spelling="full_attention(q, k, v, heads, hd)", ints=("H",), excess=4.0,
       scratch=lambda a: 3 * a.int("H") * a.shape("Q")[0] ** 2),   # the module's scores, softmax, scaled
)
