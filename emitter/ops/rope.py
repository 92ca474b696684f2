"""Rotary position embedding: NEOX pairs (i, i + half) per head; a partial rotary passes the rest."""


from .base import Op, ShapeError, divides, row_vector, same, np


def rope_dims(a):
    """(heads, hd, half) of a rope."""
    row_vector(a, "Q")
    row_vector(a, "RC")
    same(a, "RC", "RS")
    cols, half = a.shape("Q")[1], a.shape("RC")[1]
    if a.has("H"):
        heads = a.int("H")
        divides(cols, heads, f"across {heads} heads")
        hd = cols // heads
    else:
        hd = 2 * half
        divides(cols, hd, f"a rope without heads rotates 2·half = {hd} values at a time")
        heads = cols // hd
    if 2 * half > hd:
        raise ShapeError(f"the cos/sin tables hold {half} values, more than half a head ({hd})")
    return heads, hd, half


def rope_shape(a):
    rope_dims(a)
    return a.shape("Q")


def rope_vm(a):
    """Per head: (a, b) -> (a·c − b·s, a·s + b·c) for the pairs; values from 2·half on pass."""
    heads, hd, half = rope_dims(a)
    v = a["Q"].reshape(heads, hd)
    x, y = v[:, :half], v[:, half:2 * half]
    c, s = a["RC"].reshape(1, half), a["RS"].reshape(1, half)
    return np.concatenate([x * c - y * s, x * s + y * c, v[:, 2 * half:]], axis=1).reshape(1, -1)


def rope_call(a):
    heads, hd, half = rope_dims(a)
    return f"rope({a.name('Q')}, {a.name('RC')}, {a.name('RS')}, {heads}, {hd}, {half})"


def rope_tables(rows, rotary_dim, theta):
    """The cos and sin tables a rope reads: row p holds cos/sin(p · theta^(-2i / rotary_dim)) for
    i < rotary_dim / 2 (float64). The one builder every importer uses."""
    inv = 1.0 / theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    angles = np.arange(rows, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(angles), np.sin(angles)


OPS = (
    Op("rope", "rope of Q with cos RC and sin RS [across H heads]", shape=rope_shape, vm=rope_vm,
       call=rope_call, spelling="rope(q, rc, rs, heads, hd, half)", ints=("H",),
       params=("RC", "RS")),
)
