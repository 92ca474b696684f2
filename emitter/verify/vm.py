"""The VM: a NumPy float64 interpreter of the Program IR, the program's meaning. It never imports torch.

Leaf values come from the program's weights directory (`<name>.f64`, `.f32` or `.npy`, or a tensor
of a `.safetensors` file: emitter.sambaflow.weight_files, the reader model.py copies), else the
declared value (zeros with their fills) where the program has one: a leaf it reads with neither is
an error. A `.f32` leaf is held as a read-only map of its file and widened to float64
where an op reads it (exact), a block at a time for a big matmul parameter; after each op the pages
of what it read are released, so the VM's resident memory is its activations, not the checkpoint. Each step runs every
stage in order; states written back carry into the next step.
"""

import math
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .. import fingerprint
from ..bytecode import IMPORTED
from ..language.errors import ProgramError
from ..ops import ShapeError, release
from ..sambaflow import weight_files
from ..sambaflow.weight_files import WeightsError, weight_array, weight_places

BLOCK = 1 << 22   # values checked at a time


def declared_value(program, name):
    d = program.decls[name]
    value = np.zeros((d.rows, d.cols))
    flat = value.reshape(-1)
    for index, item in program.fills[name]:
        flat[index] = item
    return value


# the leaf checks this process passed, by the checked bytes' sha256 as the hash record holds it
# (emitter.fingerprint.recorded: never hashed for this) and what was checked of them: a program's
# other checks in one process (a zoo run, a Dask worker) do not read a checkpoint again for it;
# nor does a later process where the record is bound (fingerprint.checked: a zoo's, a hand lock's
# in a zoo)
_PASSED, _PASSED_LOCK = OrderedDict(), threading.Lock()
PASSED_LIMIT = 1 << 14
# what a kept finding was found by: this module and the reader of weight files, as this process
# imported them (bytecode.IMPORTED; None, where they were not recorded: nothing is kept past it)
_SCANNED_BY = [IMPORTED.get(os.path.abspath(f)) for f in (__file__, weight_files.__file__)]
_SCAN_CODE = None if None in _SCANNED_BY else "".join(sha[:16] for sha in _SCANNED_BY)


def _read_leaf(program, name, directory, place, nonfinite_ok=False):
    """(the leaf's values at `place` (emitter.sambaflow.weight_files: the reader model.py copies),
    its finite value of the largest magnitude): a read-only map checked a block at a time for
    non-finite values and, for an Int leaf, non-integers, its pages released after: what the VM holds of a 1 GB checkpoint is the map,
    not the memory (`release`). Bytes this process checked the same way already are not read."""
    d = program.decls[name]
    path = os.path.join(directory, place[0])
    try:
        before = os.stat(path)
        value = weight_array(directory, place, name, d.rows, d.cols, "r")
    except WeightsError as e:
        raise ProgramError(e.message, path=e.path) from None
    except OSError as e:
        raise ProgramError(f"cannot be read: {e.strerror}", path=path) from None
    sha = fingerprint.recorded(path, before)   # the stamp around the map: the bytes mapped
    done = sha and (sha, place[1:], d.rows, d.cols, d.real, nonfinite_ok)
    if done:
        with _PASSED_LOCK:
            peak = _PASSED.pop(done, None)
            if peak is not None:
                _PASSED[done] = peak   # (the most recently used)
                return value, peak
        peak = _SCAN_CODE and fingerprint.checked(f"leaf:{_SCAN_CODE}:{done!r}")
        if type(peak) is float and math.isfinite(peak):
            _passed(done, peak)
            return value, peak
    what = f"`{name}` (tensor `{place[1]}`)" if place[1] else f"`{name}`"
    flat, peak = value.reshape(-1), 0.0
    for start in range(0, flat.size, BLOCK):
        block = flat[start:start + BLOCK]
        finite = block[np.isfinite(block)] if nonfinite_ok else block   # (NaN, Inf allowed: the rest's extremes)
        hi, lo = (float(finite.max()), float(finite.min())) if finite.size else (0.0, 0.0)
        if not (math.isfinite(hi) and math.isfinite(lo)):   # (a NaN makes both NaN)
            bad = start + int(np.flatnonzero(~np.isfinite(block))[0])
            raise ProgramError(f"{what} holds a non-finite value ({flat[bad]}) at flat index {bad}",
                               path=path)
        peak = max(peak, hi, lo, key=abs)
        if not d.real and (wrong := _non_integers(block)).size:   # (nor Inf)
            bad = start + int(wrong[0])
            raise ProgramError(f"{what} is an Int tensor but the file holds non-integers "
                               f"({flat[bad]} at flat index {bad})", path=path)
        release(value)
    if done and fingerprint.recorded(path, before) == sha:   # (not written while it was checked)
        _passed(done, peak)
        if _SCAN_CODE:
            fingerprint.remember(f"leaf:{_SCAN_CODE}:{done!r}", peak)
    return value, peak


def _passed(done, peak):
    with _PASSED_LOCK:
        _PASSED[done] = peak
        if len(_PASSED) > PASSED_LIMIT:
            _PASSED.popitem(last=False)


@dataclass
class Leaves:
    """Every leaf's value, where each came from, and the directory's files no leaf claimed; and
    each leaf's finite value of the largest magnitude (`peaks`: whether a float32 or bfloat16
    module can hold it)."""
    values: dict
    sources: dict
    unmatched: list = field(default_factory=list)
    peaks: dict = field(default_factory=dict)


def leaf_places(program, weights_dir):
    """({leaf: place}, the names of the files they are in) in `weights_dir` (weight_files'
    reading, the one model.py copies); a file that links outside the directory, the repository
    and every named root (`links`; any a leaf may claim, every .safetensors file among them: no
    such file is opened) is a ProgramError naming it, as is anything weight_places refuses."""
    if weights_dir is None:
        return {}, set()
    from .links import refused_link, refused_links
    try:   # every file a leaf may claim, refused before any is opened or looked at through its link
        refused = refused_links(weights_dir, weight_files.claimed_files(os.listdir(weights_dir), program.leaves))
        if refused:
            raise ProgramError(refused_link(weights_dir, refused[0]), path=str(weights_dir))
        return weight_places(weights_dir, program.leaves)
    except WeightsError as e:
        raise ProgramError(e.message, path=e.path) from None
    except OSError as e:
        raise ProgramError(f"cannot be read: {e.strerror}", path=str(weights_dir)) from None


def load_leaves(program, weights_dir=None, ignore=(), allow_nonfinite=()):
    """Leaf values for `program`: its file in `weights_dir` where there is one (a state's file is
    how a caller feeds a token or resumes a decode), else its declared value. A leaf in
    `program.required` (read, not a state, not filled) with no file is a ProgramError naming the
    leaf and the directory. `ignore` names files that belong to the directory without being leaves
    (its manifest); `allow_nonfinite` names leaves whose files may hold NaN or Inf. `sources` names
    each leaf's file (a .safetensors file may be the source of several)."""
    if weights_dir is not None and not os.path.isdir(weights_dir):
        raise ProgramError("the weights directory does not exist", path=str(weights_dir))
    places, claimed = leaf_places(program, weights_dir)
    values, sources, peaks = {}, {}, {}
    required = set(program.required)
    for name in program.leaves:
        place = places.get(name)
        if place:
            values[name], peaks[name] = _read_leaf(program, name, weights_dir, place, name in allow_nonfinite)
            sources[name] = place[0]
        elif name in required:
            what = f"the {program.roles[name]} `{name}`"
            if weights_dir is None:   # the program's own line (its path: the caller's, `at`)
                raise ProgramError(f"{what} is read but has no declared value (no `Set item` fills "
                                   "it), and no weights directory was given (`--weights DIR`; in a zoo, the folder "
                                   "weights/NAME/ or a config's `weights:`)", line=program.decls[name].line)
            raise ProgramError(f"{what} (line {program.decls[name].line}) is read but has no declared "
                               "value (no `Set item` fills it), and no file in the weights directory "
                               f"holds it ({name}.f64, .f32, .npy or a tensor of a .safetensors file)",
                               path=str(weights_dir))
        else:
            values[name] = declared_value(program, name)
            sources[name] = "declared"
            v = values[name].reshape(-1)   # (a fill given twice: the value it ends with)
            peaks[name] = float(v[np.argmax(np.abs(v))]) if v.size else 0.0
    unmatched = []
    if weights_dir is not None:
        unmatched = sorted(f for f in os.listdir(weights_dir)
                           if f not in claimed and f not in ignore and not f.startswith("."))
    return Leaves(values, sources, unmatched, peaks)


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


def _non_integers(flat):
    """The flat indices of the values of `flat` that are no integer (NaN and Inf among them)."""
    return np.flatnonzero(~np.isfinite(flat) | (flat != np.round(flat)))


def _holds_integers(program, stage, value):
    """An Int state written back holds integers (a file of it would be refused when read back:
    `--state-out`, then `--weights`): else a ProgramError at the writing line."""
    flat = np.asarray(value).reshape(-1)
    bad = _non_integers(flat)
    if bad.size:
        raise ProgramError(f"`{stage.text}`: writes {float(flat[bad[0]])!r} into `{stage.writes}`, an Int "
                           "tensor, which holds integers only", stage.line, program.path)


def step(program, leaves, keep_stages=True):
    """Run every stage once on `leaves`; returns the StepTrace (its states are the next leaves').
    `keep_stages`: every stage's value, none, or (a set of stage indices) those alone, the others
    None in their places."""
    start = time.perf_counter()
    env = dict(leaves)
    stages = []
    with np.errstate(all="ignore"):
        for stage in program.stages:
            result = run_stage(program, stage, env)
            for name in stage.inputs:     # a weight read is paged out of this process again
                release(env[name])
            bind_result(stage, env, result)
            if stage.writes is not None and not program.real[stage.writes]:
                _holds_integers(program, stage, env[stage.writes])
            if keep_stages is True:
                stages.append(result)
            elif keep_stages:
                stages.append(result if stage.index in keep_stages else None)
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
