"""What every op definition is made of: the Op record, the placeholders an op sees (Args), and the
shape checks several families share.

An op is its sentence pattern, a shape rule, a VM meaning (NumPy, float64) and a torch spelling:
a renderer of the call model.py makes, whose functions are those of `emitter.sambaflow.runtime`
(copied into model.py where a call names them). Patterns: lowercase words are literal; a word that
starts with a capital is a placeholder (a tensor name; an integer literal when listed in `ints`;
either when listed in `index`; a positive real literal such as `1e-5` when listed in `reals`);
`[...]` is an optional group. `params` names the placeholders that take a parameter (a
weight, a bias, a table) rather than data: a leaf read only there is a weight of the program.
An op also declares how it runs in bfloat16 and how the lock's bf16 gate judges it: `precision`,
its (compute, output) under the default policy (emitter.ops.precision), `excess`, its bound on
rms(module − VM) over its rounding floor's noise, and `gain_test` (emitter.verify.bf16).
"""

from __future__ import annotations   # (annotations unevaluated: `typing` is not loaded)

import functools
import mmap
from dataclasses import dataclass



class _Numpy:
    """numpy, imported on first use: reading and checking a program (`logos check`, a pre-commit
    hook) needs the op table's patterns and shape rules, not NumPy (half of such a run's time)."""

    def __getattr__(self, name):
        import numpy
        return getattr(numpy, name)


np = _Numpy()   # every op module's `np`
EPS = 1e-6
FP32, BF16 = "fp32", "bf16"   # the precisions a bfloat16 module computes and holds values in
WIDEN_BYTES = 1 << 23   # a float32 parameter is widened to float64 at most this many bytes at a time


class ShapeError(Exception):
    """A shape rule's refusal; the reader turns it into a ProgramError at the sentence's line."""


class Args:
    """One op's bound placeholders, as a shape rule, a VM meaning or a torch renderer sees them."""

    def __init__(self, bound, shapes, values=None, wrap=None):
        self.bound = bound
        self.shapes = shapes
        self.values = values
        self.wrap = wrap   # how a renderer spells a tensor operand (its precision cast), or None

    def has(self, p):
        return p in self.bound

    def name(self, p):
        return self.bound[p] if self.wrap is None else self.wrap(self.bound[p], p)

    def int(self, p):
        return self.bound[p]

    def real(self, p, default):
        """The real literal bound to `p`, or `default` where the sentence leaves it out."""
        return self.bound.get(p, default)

    def shape(self, p):
        return self.shapes[self.bound[p]]

    def size(self, p):
        rows, cols = self.shape(p)
        return rows * cols

    def __getitem__(self, p):
        """The value bound to a tensor placeholder, widened to float64 (a no-op when it is)."""
        return np.asarray(self.values[self.bound[p]], dtype=np.float64)

    def held(self, p):
        """The value bound to a tensor placeholder as held: a float32 checkpoint's map, not widened."""
        return self.values[self.bound[p]]


def release(array):
    """Drop the resident pages of the file `array` maps, if it maps one (np.memmap, or a view of
    one): they stay in the page cache and come back on the next touch, but the process's resident
    size stops counting them, so a weight the VM has read costs no memory beside the module's own
    map of the same file."""
    while array is not None:
        m = getattr(array, "_mmap", None)
        if isinstance(m, mmap.mmap):
            m.madvise(mmap.MADV_DONTNEED)
            return
        array = getattr(array, "base", None)


def widened_product(x, b):
    """x @ b in float64, `b` (a float32 map, say) widened a block at a time and its pages released
    after each: a 262144-column output projection is never whole in float64. The blocks follow
    b's layout, so each reads only its own pages: rows of a row-major b (their products summed),
    columns of a transposed one (a tied embedding's table)."""
    rows, cols = b.shape
    if 8 * rows * cols <= WIDEN_BYTES:
        out = x @ np.asarray(b, dtype=np.float64)
    elif b.flags.f_contiguous and not b.flags.c_contiguous:
        out = np.empty((x.shape[0], cols))
        step = max(1, WIDEN_BYTES // (8 * rows))
        for j in range(0, cols, step):
            out[:, j:j + step] = x @ np.asarray(b[:, j:j + step], dtype=np.float64)
            release(b)
    else:
        out = np.zeros((x.shape[0], cols))
        step = max(1, WIDEN_BYTES // (8 * cols))
        for k in range(0, rows, step):
            out += x[:, k:k + step] @ np.asarray(b[k:k + step], dtype=np.float64)
            release(b)
    release(b)
    return out


def pattern_words(pattern):
    """A pattern's words, optional groups flattened."""
    return pattern.replace("[", " ").replace("]", " ").split()


@functools.lru_cache(maxsize=None)
def _order(pattern):
    """A pattern's placeholders in order, worked out once per pattern (the reader asks per sentence)."""
    return tuple(w for w in pattern_words(pattern) if w[0].isupper())


@dataclass(frozen=True)
class Op:
    name: str
    pattern: str
    shape: Callable[[Args], tuple]
    vm: Callable[[Args], object]
    call: Optional[Callable[[Args], str]]   # None: read, then refused at emission (selective scan)
    spelling: Optional[str]                 # the torch expression the manifest names
    ints: tuple = ()
    index: tuple = ()
    reals: tuple = ()
    params: tuple = ()
    writes: Optional[str] = None
    inputs_order: tuple = ()
    view: bool = False                      # the torch call may return a view of its input
    widens: tuple = ()                      # operands the torch call widens itself, a block at a time
    integer: bool = False                   # the result holds integers (an index), whatever its type
    keeps_int: bool = False                 # integers in, integers out (a sum, a product, a gather)
    # in bfloat16: (compute, output) by default, as SambaNova's model zoo runs it (an elementwise op
    # bf16 in and out, computing in fp32 between); its bf16 gate's bound on the excess over its
    # rounding floor (None: the gate's bound for the rest); whether the gate tests its gain
    precision: tuple = (FP32, BF16)
    excess: Optional[float] = None
    gain_test: bool = True
    moves: bool = False                     # computes nothing (it moves values): its floor is exact,
    #                                         so the gate passes it only where the module is its floor
    # the float64 values the op holds at its peak beside its inputs and output (the VM's meaning
    # or the module's call, the larger), where they can outgrow the program's tensors (attention's
    # T×T scores): what limits.tensor_bytes counts before anything is allocated
    scratch: Optional[Callable[[Args], int]] = None

    def tensor_inputs(self, bound):
        """The tensor names this op reads, in its pattern's (or `inputs_order`'s) order."""
        order = self.inputs_order or _order(self.pattern)
        return [bound[p] for p in order
                if p in bound and p not in self.ints and isinstance(bound[p], str)]

    def result_real(self, bound, real):
        """Whether the result is Real (`real`: {name: whether it is Real}): an index's (argmax) as
        its first input is; one that keeps integers Int where every input it takes values from
        (an index aside) is Int; any other Real, since it makes non-integers (docs/SUGAR.md:
        Real where the first input is; Int tensors hold integers)."""
        inputs = self.tensor_inputs(bound)
        if self.integer:
            return real[inputs[0]]
        return not self.keeps_int or any(real[bound[p]] for p in self.inputs_order or _order(self.pattern)
                                         if p in bound and p not in self.index and bound[p] in inputs)

    def data_inputs(self, bound):
        """The tensor names this op reads in a data slot (not in one of its `params`)."""
        order = self.inputs_order or _order(self.pattern)
        return [bound[p] for p in order if p in bound and p not in self.ints
                and p not in self.params and isinstance(bound[p], str)]


# ── shape checks shared by several families ──────────────────────────────────────────────────────

def fmt(shape):
    return f"{shape[0]} by {shape[1]}"


def same(a, p, q, what="the same shape"):
    if a.shape(p) != a.shape(q):
        raise ShapeError(f"`{a.name(q)}` is {fmt(a.shape(q))} but must have {what} as "
                         f"`{a.name(p)}` ({fmt(a.shape(p))})")


def holds(a, p, n, what):
    if a.size(p) != n:
        raise ShapeError(f"`{a.name(p)}` ({fmt(a.shape(p))}) must hold {n} values ({what})")


def divides(n, by, what):
    if by <= 0 or n % by:
        raise ShapeError(f"{what}: {by} does not divide {n}")


def row_vector(a, p):
    if a.shape(p)[0] != 1:
        raise ShapeError(f"`{a.name(p)}` must be 1 by C, is {fmt(a.shape(p))}")


def shape_of_x(a):
    """The shape rule of an op whose result is shaped like its X."""
    return a.shape("X")


# ── NumPy pieces several meanings share ──────────────────────────────────────────────────────────

def np_sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))


def np_silu(x):
    return x * np_sigmoid(x)


def np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
