"""Linear algebra and elementwise arithmetic: matmul, plus, hadamard, transpose."""


from .base import FP32, Op, ShapeError, fmt, widened_product, np


def matmul_shape(a):
    (m, k), (k2, n) = a.shape("A"), a.shape("B")
    if k != k2:
        raise ShapeError(f"inner dimensions disagree: `{a.name('A')}` is {fmt((m, k))}, "
                         f"`{a.name('B')}` is {fmt((k2, n))}")
    return m, n


def matmul_vm(a):
    b = a.held("B")
    return a["A"] @ b if isinstance(b, np.ndarray) and b.dtype == np.float64 else widened_product(a["A"], b)


def matmul_call(a):
    """`a @ b`; in a module that follows a bfloat16 policy (its operands cast), through the module's
    `matmul`, which widens a bf16 weight a block at a time."""
    if a.wrap is None:
        return f"{a.name('A')} @ {a.name('B')}"
    return f"self.matmul({a.name('A')}, {a.name('B')})"


def broadcast_shape(a):
    """B has A's shape, or is 1 by C and is broadcast over A's rows."""
    (r, c), (rb, cb) = a.shape("A"), a.shape("B")
    if (rb, cb) != (r, c) and not (rb == 1 and cb == c):
        raise ShapeError(f"`{a.name('B')}` is {fmt((rb, cb))}: it must be {fmt((r, c))} like "
                         f"`{a.name('A')}`" + (f", or 1 by {c} to broadcast over its rows" if r > 1 else ""))
    return r, c


def hadamard_shape(a):
    """As `plus`, or B is R by 1 and scales each of A's rows (a gate per token: the shared
    expert's sigmoid)."""
    (r, c), (rb, cb) = a.shape("A"), a.shape("B")
    if (rb, cb) == (r, 1):
        return r, c
    try:
        return broadcast_shape(a)
    except ShapeError:
        raise ShapeError(f"`{a.name('B')}` is {fmt((rb, cb))}: it must be {fmt((r, c))} like "
                         f"`{a.name('A')}`" + (f", 1 by {c} to broadcast over its rows," if r > 1 else "")
                         + f" or {r} by 1 to scale each row") from None


def plus_vm(a):
    return a["A"] + a["B"]


def plus_call(a):
    return f"{a.name('A')} + {a.name('B')}"


def hadamard_vm(a):
    return a["A"] * a["B"]


def hadamard_call(a):
    return f"{a.name('A')} * {a.name('B')}"


def transpose_shape(a):
    rows, cols = a.shape("X")
    return cols, rows


def transpose_vm(a):
    """A view, as torch's is: the transposed table of a tied output projection costs nothing (a
    float32 leaf's stays float32, exact; the matmul that reads it widens it a block at a time)."""
    x = a.held("X")
    return (x if isinstance(x, np.ndarray) else np.asarray(x, dtype=np.float64)).T


def transpose_call(a):
    return f"{a.name('X')}.transpose(0, 1)"


# in bfloat16 a matmul accumulates in fp32 and a residual add (plus) keeps an fp32 sum; the bf16
# gate bounds the excess of both at 4 (an op that declares no bound gets the gate's EXCESS_OTHER)
OPS = (
    Op("matmul", "A matmul B", shape=matmul_shape, vm=matmul_vm, call=matmul_call, spelling="a @ b",
       params=("B",), widens=("B",), excess=4.0, keeps_int=True),
    Op("plus", "A plus B", shape=broadcast_shape, vm=plus_vm, call=plus_call, spelling="a + b",
       params=("B",), precision=(FP32, FP32), excess=4.0, keeps_int=True),   # a residual add: its sum kept in fp32
    Op("hadamard", "A hadamard B", shape=hadamard_shape, vm=hadamard_vm, call=hadamard_call,
       spelling="a * b", params=("B",), keeps_int=True),
    Op("transpose", "transpose of X", shape=transpose_shape, vm=transpose_vm, call=transpose_call,
       spelling="x.transpose(0, 1)", view=True, keeps_int=True),
)
