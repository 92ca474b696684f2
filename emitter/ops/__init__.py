"""The op table: every op of the tensor sugar, one family per module, each op's sentence pattern,
shape rule, VM meaning and torch spelling side by side. Adding an op is adding it to its family's
`OPS` (and its torch function to `emitter.sambaflow.runtime` when the call needs one)."""

from . import activations, attention, experts, linear, norms, recurrent, rope, tables
from .base import EPS, Args, Op, ShapeError, pattern_words, release

OPS = (linear.OPS + norms.OPS + rope.OPS + attention.OPS + activations.OPS + recurrent.OPS
       + experts.OPS + tables.OPS)
SET_ROW = tables.SET_ROW
ALL_OPS = OPS + (SET_ROW,)
BY_NAME = {op.name: op for op in ALL_OPS}

__all__ = ["ALL_OPS", "Args", "BY_NAME", "EPS", "OPS", "Op", "SET_ROW", "ShapeError",
           "pattern_words", "release", "torch_spelling"]


def torch_spelling(name):
    """The torch expression an op is spelled with, or a ValueError naming an op that has none."""
    op = BY_NAME.get(name)
    if op is None or op.spelling is None:
        raise ValueError(f"`{name}` has no torch spelling in the SambaFlow emitter: anything outside "
                         "the tensor sugar is refused, never dropped")
    return op.spelling
