"""The one IR: what the reader makes of a tensor program, and all the emitter, VM and lock consume."""

from __future__ import annotations   # (annotations unevaluated: `typing` is not loaded)

from dataclasses import dataclass, field

from ..ops import Args, Op


@dataclass(frozen=True)
class Decl:
    """`Let V be a R by C tensor of Real|Int.`"""
    var: str
    rows: int
    cols: int
    real: bool
    line: int


@dataclass(frozen=True)
class Fill:
    """`Set item N of V to VALUE.` — `index` is the 1-based row-major item number."""
    var: str
    index: int
    value: Union[int, float]
    line: int


@dataclass(frozen=True)
class OpSentence:
    """`Let OUT be <op> …` or `Set row P of TABLE to ROW.`; `bound` maps the op's placeholders."""
    out: str
    op: Op
    bound: dict
    line: int
    text: str


@dataclass(frozen=True)
class Show:
    """`Show …` — host output, nothing for the module."""
    words: tuple
    line: int


@dataclass
class Stage:
    """One op in program order: the unit the emitter prints and the lock compares."""
    index: int
    out: str
    op: Op
    bound: dict
    line: int
    text: str
    inputs: list
    writes: Optional[str]

    def args(self, shapes, values=None, wrap=None):
        return Args(self.bound, shapes, values, wrap)

    @property
    def binds(self):
        """Whether the stage binds `out` (every op but `Set row`, which writes its table back)."""
        return self.writes != self.out


@dataclass
class Program:
    source: str
    sentences: list
    shapes: dict            # every bound name -> (rows, cols)
    real: dict              # every bound name -> Real (True) or Int (False)
    decls: dict             # declared name -> Decl, in declaration order
    fills: dict             # declared name -> [(flat index from 0, value), ...] in line order
    stages: list
    output: str
    states: list            # leaves an op writes back, in declaration order
    roles: dict             # leaf -> "state" (written back), "input" (read as data) or "weight"
    attention_layers: frozenset
    path: Optional[str] = None
    bound_at: dict = field(default_factory=dict)   # name -> line that binds it

    @property
    def leaves(self):
        return list(self.decls)

    @property
    def tensor_bytes(self):
        """What every tensor of the program takes in float64 (the VM's type), with the largest
        temporary of one of its ops (Op.scratch): the memory a run needs, known before anything
        is allocated."""
        scratch = max((st.op.scratch(Args(st.bound, self.shapes)) for st in self.stages if st.op.scratch), default=0)
        return 8 * (sum(r * c for r, c in self.shapes.values()) + scratch)

    def over_limits(self, limits):
        """Why this program may not run within `limits` (said of its file), or None: more
        sentences than limits.sentences (emitting, importing and locking cost each one: a 400 000-
        stage chain took 156 s and 2.6 GB in the run's own process), or tensors over
        limits.tensor_bytes. (Emit code: what it refuses moves the emit's key.)"""
        from ..files import size_text
        if len(self.sentences) > limits["sentences"]:
            return (f"{len(self.sentences)} sentences (tensors, fills and ops), over the limit of "
                    f"{limits['sentences']} (limits.sentences)")
        need, have = self.tensor_bytes, limits["tensor_bytes"]
        if need <= have:
            return None
        return (f"its tensors take {size_text(need)} in float64, over the limit of {size_text(have)} "
                "(limits.tensor_bytes; the default is half this machine's memory)")

    @property
    def required(self):
        """The leaves that need a file: read by an op, not a state (a state starts from its declared
        value) and not filled (a filled leaf's declared value is its value)."""
        read = {name for st in self.stages for name in st.inputs}
        return [v for v in self.decls if v in read and self.roles[v] != "state" and not self.fills[v]]
