"""The VM: a NumPy float64 interpreter of the Program IR, the program's meaning. It never imports torch.

Leaf values come from `<name>.f64` / `<name>.f32` files in the program's weights directory, else the
declared value (zeros with their fills) where the program has one: a leaf it reads with neither is
an error. A `.f32` leaf is held as a read-only map of its file and widened to float64
where an op reads it (exact), a block at a time for a big matmul parameter; after each op the pages
of what it read are released, so the VM's resident memory is its activations, not the checkpoint. Each step runs every
stage in order; states written back carry into the next step.
"""

import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..language.errors import ProgramError
from ..ops import ShapeError, release

_EXTS = ((".f64", "<f8"), (".f32", "<f4"))
BLOCK = 1 << 22   # values checked at a time


def declared_value(program, name):
    d = program.decls[name]
    value = np.zeros((d.rows, d.cols))
    flat = value.reshape(-1)
    for index, item in program.fills[name]:
        flat[index] = item
    return value


def _read_leaf(program, name, path, dtype, nonfinite_ok=False):
    d = program.decls[name]
    itemsize = np.dtype(dtype).itemsize
    size = os.path.getsize(path)
    if size != d.rows * d.cols * itemsize:
        raise ProgramError(f"`{name}` is {d.rows} by {d.cols}: expected {d.rows * d.cols * itemsize} "
                           f"bytes of {np.dtype(dtype).name}, the file has {size}", path=path)
    # mapped, not read, and checked a block at a time with its pages released after: what the VM
    # holds of a 1 GB checkpoint is the map, not the memory (`release`)
    value = np.memmap(path, dtype=dtype, mode="r", shape=(d.rows, d.cols))
    flat = value.reshape(-1)
    for start in range(0, flat.size, BLOCK):
        block = flat[start:start + BLOCK]
        if not nonfinite_ok and not np.isfinite(block).all():
            bad = start + int(np.flatnonzero(~np.isfinite(block))[0])
            raise ProgramError(f"`{name}` holds a non-finite value ({flat[bad]}) at flat index {bad}",
                               path=path)
        if not d.real and not np.array_equal(block, np.round(block)):
            raise ProgramError(f"`{name}` is an Int tensor but the file holds non-integers", path=path)
        release(value)
    return value


@dataclass
class Leaves:
    """Every leaf's value, where each came from, and the directory's files no leaf claimed."""
    values: dict
    sources: dict
    unmatched: list = field(default_factory=list)


def leaf_file(name, weights_dir):
    """(file name, numpy dtype) of the leaf's file in `weights_dir`, or None when it has none. Both
    extensions at once, a link leaving the directory, or something other than a regular file in a
    leaf's place is a ProgramError naming it."""
    if weights_dir is None:
        return None
    found = [(name + ext, dt) for ext, dt in _EXTS if os.path.lexists(os.path.join(weights_dir, name + ext))]
    if len(found) > 1:
        raise ProgramError(f"both `{found[0][0]}` and `{found[1][0]}` exist for `{name}`; keep one",
                           path=str(weights_dir))
    if not found:
        return None
    fname = found[0][0]
    path = os.path.join(weights_dir, fname)
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(weights_dir):
        raise ProgramError(f"`{fname}` links outside the weights directory; copy the file in",
                           path=str(weights_dir))
    if not os.path.isfile(path):
        raise ProgramError(f"`{fname}` is not a regular file (the leaf `{name}`)", path=str(weights_dir))
    return found[0]


def load_leaves(program, weights_dir=None, ignore=(), allow_nonfinite=()):
    """Leaf values for `program`: its file in `weights_dir` where there is one (a state's file is
    how a caller feeds a token or resumes a decode), else its declared value. A leaf in
    `program.required` (read, not a state, not filled) with no file is a ProgramError naming the
    leaf and the directory. `ignore` names files that belong to the directory without being leaves
    (its manifest); `allow_nonfinite` names leaves whose files may hold NaN or Inf."""
    if weights_dir is not None and not os.path.isdir(weights_dir):
        raise ProgramError("the weights directory does not exist", path=str(weights_dir))
    values, sources, claimed = {}, {}, set()
    required = set(program.required)
    for name in program.leaves:
        found = leaf_file(name, weights_dir)
        if found:
            fname, dtype = found
            claimed.add(fname)
            values[name] = _read_leaf(program, name, os.path.join(weights_dir, fname), dtype,
                                      name in allow_nonfinite)
            sources[name] = fname
        elif name in required:
            where = f"there is no `{name}.f64` or `{name}.f32` in the weights directory" \
                if weights_dir else "no weights directory was given"
            raise ProgramError(f"the {program.roles[name]} `{name}` (line {program.decls[name].line}) "
                               f"is read but has no declared value (no `Set item` fills it), and {where}",
                               path=None if weights_dir is None else str(weights_dir))
        else:
            values[name] = declared_value(program, name)
            sources[name] = "declared"
    unmatched = []
    if weights_dir is not None:
        unmatched = sorted(f for f in os.listdir(weights_dir)
                           if f not in claimed and f not in ignore and not f.startswith("."))
    return Leaves(values, sources, unmatched)


@dataclass
class StepTrace:
    """One step: every stage's value (the op's result as the stage returns it), the output, the
    states after the step, and the step's wall time."""
    stages: list
    output: np.ndarray
    states: dict
    seconds: float


def run_stage(program, stage, env):
    """One stage's result on the values in `env` (a ProgramError at its line on a bad index)."""
    try:
        return stage.op.vm(stage.args(program.shapes, env))
    except ShapeError as e:
        raise ProgramError(f"`{stage.text}`: {e}", stage.line, program.path) from None


def bind_result(stage, env, result):
    """Put a stage's result into `env`: its output, and the state it writes back."""
    if stage.writes is None:
        env[stage.out] = result
    elif stage.binds:
        env[stage.out], env[stage.writes] = result
    else:
        env[stage.writes] = result


def step(program, leaves, keep_stages=True):
    """Run every stage once on `leaves`; returns the StepTrace (its states are the next leaves')."""
    start = time.perf_counter()
    env = dict(leaves)
    stages = []
    with np.errstate(all="ignore"):
        for stage in program.stages:
            result = run_stage(program, stage, env)
            for name in stage.inputs:     # a weight read is paged out of this process again
                release(env[name])
            bind_result(stage, env, result)
            if keep_stages:
                stages.append(result)
    return StepTrace(stages, env[program.output], {s: env[s] for s in program.states},
                     time.perf_counter() - start)


def run(program, leaves, steps=1, keep_stages=False):
    """`steps` steps from `leaves`, each starting from the states the last one wrote."""
    if steps < 1:
        raise ValueError("steps must be at least 1")
    current, traces = dict(leaves), []
    for _ in range(steps):
        trace = step(program, current, keep_stages)
        current.update(trace.states)
        traces.append(trace)
    return traces


def output_summary(program, output):
    flat = output.reshape(-1)
    first = float(flat[0]) if flat.size else math.nan
    return {"output": program.output, "shape": list(output.shape), "first": first,
            "argmax": int(np.argmax(flat))}
