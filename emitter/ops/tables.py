"""Tables and indices: a row of a table (embedding), a row written back (set row), argmax, and
`selective scan` and `moe`, which the reader knows and nothing can spell: refused by name."""

import math


from .base import FP32, Op, ShapeError, fmt, np


def row_number(value, rows, what):
    """A data-dependent row index (a 1 by 1 tensor's value) as an int, or a ShapeError."""
    v = float(np.asarray(value).reshape(-1)[0])
    if not (math.isfinite(v) and v == int(v) and 0 <= v < rows):
        raise ShapeError(f"{what} is {v!r}, not a row number in 0..{rows - 1}")
    return int(v)


def _index_check(a, p, table):
    """A literal row index must lie in the table; a tensor index must be 1 by 1."""
    rows = a.shape(table)[0]
    idx = a.bound[p]
    if isinstance(idx, int):
        if idx >= rows:
            raise ShapeError(f"row {idx} is outside `{a.name(table)}`, which has {rows} rows")
    elif a.shapes[idx] != (1, 1):
        raise ShapeError(f"the row index `{idx}` must be 1 by 1, is {fmt(a.shapes[idx])}")


def _index(a, p, table):
    idx = a.bound[p]
    if isinstance(idx, int):
        return idx
    return row_number(a.values[idx], a.values[a.bound[table]].shape[0], f"the row index `{idx}`")


def row_shape(a):
    _index_check(a, "TOK", "TABLE")
    return 1, a.shape("TABLE")[1]


def row_vm(a):
    table = a.values[a.bound["TABLE"]]  # widen the one row, not the table
    return np.array(table[_index(a, "TOK", "TABLE")], dtype=np.float64).reshape(1, -1)


def row_call(a):
    tok = a.bound["TOK"]
    if isinstance(tok, int):
        return f"{a.name('TABLE')}[{tok}:{tok + 1}]"
    return f"row_of({a.name('TABLE')}, {tok}, \"{tok}\")"   # the name, for model.py's message


def set_row_shape(a):
    _index_check(a, "P", "TABLE")
    if a.shape("ROW") != (1, a.shape("TABLE")[1]):
        raise ShapeError(f"`{a.name('ROW')}` is {fmt(a.shape('ROW'))}, must be 1 by "
                         f"{a.shape('TABLE')[1]} (a row of `{a.name('TABLE')}`)")
    return a.shape("TABLE")


def set_row_vm(a):
    table = a["TABLE"].copy()
    table[_index(a, "P", "TABLE")] = a["ROW"].reshape(-1)
    return table


def set_row_call(a):
    pos = a.bound["P"]
    named = "" if isinstance(pos, int) else f', "{pos}"'   # a tensor's name, for model.py's message
    return f"set_row({a.name('TABLE')}, {pos}, {a.name('ROW')}{named})"


def argmax_shape(a):
    return 1, 1


def argmax_vm(a):
    """The row-major flat index of the largest value, first on ties, as 1 by 1."""
    return np.array([[float(np.argmax(a["X"]))]])


def argmax_call(a):
    return f"torch.argmax({a.name('X')}).reshape(1, 1).to({a.name('X')}.dtype)"


def refused_shape(a):
    return a.shape("X")


def refused_vm(name, instead=""):
    def vm(a):
        raise ShapeError(f"`{name}` has no meaning the VM or the emitter can give it{instead}")
    return vm


OPS = (
    # Mamba's selective state-space scan, and the original emitter's `moe of X` (docs/SUGAR.md):
    # read, then refused by name at emission and in the VM
    Op("selective scan", "selective scan of X", shape=refused_shape, vm=refused_vm("selective scan"),
       call=None, spelling=None),
    Op("moe", "moe of X", shape=refused_shape, call=None, spelling=None, vm=refused_vm(
        "moe", ": a mixture of experts is a routing sentence and `experts` (`logos check --forms`)")),
    Op("argmax", "argmax of X", shape=argmax_shape, vm=argmax_vm, call=argmax_call,
       spelling="torch.argmax(x).reshape(1, 1).to(x.dtype)", integer=True, precision=(FP32, FP32)),
    Op("embedding", "row TOK of TABLE", shape=row_shape, vm=row_vm, call=row_call,
       spelling="table[tok]", index=("TOK",), params=("TABLE",),
       inputs_order=("TABLE", "TOK"), view=True, keeps_int=True),
)

# `Set row P of TABLE to ROW.` is a sentence of its own (no `Let`): the op that writes TABLE back.
# Its pattern is matched after the leading `Set`.
SET_ROW = Op("set row", "row P of TABLE to ROW", shape=set_row_shape, vm=set_row_vm,
             call=set_row_call, spelling="set_row(table, pos, row)",
             index=("P",), writes="TABLE", inputs_order=("TABLE", "P", "ROW"), moves=True)
