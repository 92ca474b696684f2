"""What the lock's fresh pass (emitter.verify.passes.fresh) is handed, and the VM's step on it: the
last step again with other values of the program's inputs and states. It is a function of the
program, its weights and the VM's states alone, so it is VM work done once per program: the trace
(emitter.verify.trace) computes it beside the steps, and a check takes it there where it asks for
the same values (`request`: its digest), else computes it itself."""

import hashlib
from typing import NamedTuple, Optional

import numpy as np

from ..language.errors import ProgramError
from . import vm

FLOAT32_EXACT = 2.0 ** 24   # every integer up to this is a float32 (the emitted module's Int buffer but at float64)


class FreshStep(NamedTuple):
    request: str                  # the digest of what was asked (`request`)
    trace: Optional[vm.StepTrace]  # None: the VM refused every try
    far: dict                     # {state: the value it was given}
    other: tuple                  # the inputs given other values


def _output_stage(program):
    return next(st for st in reversed(program.stages) if st.binds)


def integer_output(program):
    """Whether the program's output is an integer (an argmax's token, an Int result)."""
    return _output_stage(program).op.integer or not program.real[program.output]


def feeding(program):
    """The stage whose value an integer output is computed from (the logits of an argmax), or None
    where the output is Real."""
    if not integer_output(program):
        return None
    out = _output_stage(program)
    bound = {st.out: st.index for st in program.stages if st.binds}
    return next((bound[n] for n in out.inputs if n in bound and program.real.get(n)), None)


def varied(program, leaves):
    """{input: other values of it} for each of the program's inputs: each row's values rolled by one
    place (a column's, for a one-column input), so each row holds the values it held (a norm or
    a softmax over it as well conditioned as on the author's inputs), or where that moves none
    (rows of values all alike), a Real one one less with a ramp of -0.5 to 0.5 across each row
    (down the column), an Int one one less (of no more than 0, one more): what a module that
    kept anything of its inputs from an earlier call, or computes otherwise on inputs the lock
    did not choose, is found out by."""
    out = {}
    for n in program.leaves:
        if program.roles[n] != "input":
            continue
        v = np.asarray(leaves[n], np.float64)
        axis = 1 if v.ndim == 2 and v.shape[1] > 1 else 0
        w = np.roll(v, 1, axis=axis)
        if np.array_equal(w, v, equal_nan=True):
            if program.real[n]:
                ramp = np.linspace(-0.5, 0.5, v.shape[axis]) if v.shape[axis] > 1 else np.zeros(1)
                w = v - 1 + (ramp.reshape(1, -1) if axis == 1 else ramp.reshape(-1, *([1] * (v.ndim - 1))))
            else:
                w = v - 1 if (v >= 1).all() else v + 1
        out[n] = w
    return out


def other_states(program, states, exact):
    """{state: [other values, the first tried first]}. A Real one (a cache's rows, a conv's ring, a
    memory) takes one: its rows rolled down by half their count (one at least; a one-row state's
    values along it) plus a ramp of -0.5 to 0.5 across it, so a row no step has written yet (zero)
    holds values too and a module that drops a tap or row of it is found, though the lock's own
    steps write only as many rows as it has steps; and a cache's written rows (their mask moves
    with them) lie apart from the one the step writes, so one that reads only its last rows (a
    window of the steps' count) is found too. An Int one a stage reads as a row index (a token, a
    position), each value v as v + 257, or v + 256 where v is odd (an odd number past 256, which
    bfloat16's 8 bits cannot hold, so a module that rounds it on its way to the index is found,
    though the lock's own steps may reach small ones alone), then 257, the least such (259 for
    v = 257: a table of fewer rows); any Int one v + 1 (v - 1 where that is past every row): a
    counter keeps its size (one that scales a value makes no number the dtype cannot hold). An Int
    one only where it is at most `exact[state]` (what the module's buffer of the state holds
    exactly: float32's 2^24); an Int state `exact` does not name keeps its value."""
    out = {}
    index = {st.bound.get(slot) for st in program.stages for slot in st.op.index}
    for s in program.states:
        v = np.asarray(states[s], np.float64)
        if program.real[s]:
            axis = 0 if v.shape[0] > 1 else v.ndim - 1
            ramp = np.linspace(-0.5, 0.5, v.size).reshape(v.shape)
            out[s] = [np.roll(v, max(1, v.shape[axis] // 2), axis=axis) + ramp]
            continue
        if s not in exact:
            continue
        tries = [v + 257 - np.mod(v, 2), np.where(v == 257, 259.0, 257.0) + 0 * v] if s in index else []
        tries += [v + 1, v - 1]
        out[s] = [c for c in tries if np.abs(c).max(initial=0) <= exact[s]]
    return {s: c for s, c in out.items() if c}


def request(other, tries, feed):
    """The digest of a fresh step's inputs: the inputs' other values, each state's tries in order,
    the stage kept (`feed`). Not the weights or the states it starts from: the trace's key and
    its steps fix those (a trace file is read only under the key of what its VM read)."""
    h = hashlib.sha256(repr(feed).encode())
    for kind, items in (("input", {n: [v] for n, v in other.items()}), ("state", tries)):
        for name in sorted(items):
            h.update(f"|{kind}:{name}:{len(items[name])}".encode())
            for v in items[name]:
                a = np.ascontiguousarray(v, np.float64)
                h.update(repr(a.shape).encode())
                h.update(a.tobytes())
    return h.hexdigest()


def standard(program, leaves, start):
    """(other, tries, feed) as the lock asks them of an emitted module whose Int buffers are
    float32 (at float64 the same but past 2^24): what the trace computes for a program's checks."""
    exact = {s: FLOAT32_EXACT for s in program.states if not program.real[s]}
    return varied(program, leaves), other_states(program, start, exact), feeding(program)


def step(program, leaves, start, other, tries, feed):
    """The VM's step from the states `start` with the inputs `other` and each state's first try of
    `tries`: where the VM refuses (an index out of range), a state the refusing stage reads as its
    row index takes its next try (none left: it keeps its value; a table the stage writes keeps
    its own); a refusal no state explains: the inputs as they were. Only `feed`'s stage value is
    kept."""
    digest, trace = request(other, tries, feed), None
    while other or tries:
        far = {s: c[0] for s, c in tries.items()}
        try:
            trace = vm.step(program, {**leaves, **start, **far, **other}, keep_stages={feed})
            break
        except ProgramError as e:
            refused = {st.bound.get(slot) for st in program.stages if st.line == e.line   # (what it reads
                       for slot in st.op.index} & set(tries)                               # as a row index)
            tries = {s: c[1:] if s in refused else c for s, c in tries.items() if s not in refused or c[1:]} \
                if refused else {}
            other = other if refused or far else {}
    return FreshStep(digest, trace, {s: c[0] for s, c in tries.items()}, tuple(sorted(other)))
