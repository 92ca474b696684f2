"""The lock's probe pass: the module's `tap` hook, which compares each stage's value with the VM's
and hands the VM's value on, so each op is judged on the VM's inputs; and the module's forward as
the lock runs it, where an exception the module raises is a finding about the bundle."""

import contextlib
import math
import os
import re
import time

import numpy as np

from ..ops import release
from .compare import EXACT, SMALL, compare, compare_many, flat_pair, nan_equal, numpy_dtype, same_in_dtype, worse
from .leaf_check import bytes_hash
from .memory import memory_bytes
from .forward_line import stage_raised_in


class CouldNotRun(Exception):
    """The lock could not compare at all (bad program or weights, a bundle of another program, a
    check that ran out of time or memory): not the bundle's fault, an error."""


class Raised(Exception):
    """The bundle's module raised while it ran on the program's inputs: the bundle is wrong, a
    finding (the check fails). `stage` is the index of the stage it raised in (None: after the
    last, in its write-backs), `where` the pass ("the probe pass of step 2"), `error` the
    exception as `Type: message`."""

    def __init__(self, stage, where, error):
        super().__init__(f"{error} (stage {stage}, {where})")
        self.stage, self.where, self.error = stage, where, error


class BundleFault(Exception):
    """The bundle is wrong where no stage of the program runs (its model.py does not import, its
    loader or constructor refuses the weights the VM read, its forward skips a stage): the check
    fails (exit 1), `where` naming that part of it ({stage, out, op, line}) and `step` when."""

    def __init__(self, where, message, step=0):
        super().__init__(message)
        self.where, self.step = where, step


class Wrong(Exception):
    """The module handed the probe what no stage of the program is (a value that is not a tensor,
    a wrong count of values): the bundle's fault."""


PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the emitter package


def absurd(program):
    """Bytes beyond which one allocation is the bundle's own fault, not the machine's: more than
    the machine (its container) holds and more than four times every tensor of the program with its largest
    temporary (Program.tensor_bytes) in float64. Below it, memory refused is the machine's."""
    return max(memory_bytes(), 4 * program.tensor_bytes)


def _requested(e):
    """The bytes a refused allocation asked for, where its error says (NumPy's, torch's), or None."""
    n = getattr(e, "_total_size", None)
    if n is None:
        m = re.search(r"tried to allocate (\d+) bytes", str(e))
        n = m and int(m.group(1))
    return n


def bundles_fault(e, limit=None):
    """Whether an exception the module let through is the bundle's: raised by its own code or by
    what it calls (torch, numpy), not for want of memory (unless it asked for more than `limit`
    bytes at once: absurd()), nor by this package's own code (the lock's hooks, a deadline's
    signal handler: its innermost frame, or its class, is ours)."""
    if isinstance(e, MemoryError) or "can't allocate memory" in str(e):   # (torch's)
        return limit is not None and (_requested(e) or 0) > limit
    if isinstance(e, CouldNotRun):
        return False
    if isinstance(e, Wrong):
        return True
    if type(e).__module__.partition(".")[0] == __name__.partition(".")[0]:   # TimeLimit...
        return False
    tb, last = e.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is None or not os.path.abspath(last.tb_frame.f_code.co_filename).startswith(PACKAGE + os.sep)


def odd_kind(torch, v, output=False):
    """What a tensor is that no value of a program is (a sparse, nested, complex, quantized one, one
    on a device without its values; for the `output`, a bool or 1-byte float one too, which no
    argmax reads), or None for a dense real tensor on the CPU."""
    if v.is_nested or v.layout != torch.strided or v.device.type != "cpu" or v.is_complex() or v.is_quantized \
            or output and (v.dtype == torch.bool or v.is_floating_point() and v.element_size() == 1):
        layout = "nested" if v.is_nested else str(v.layout).replace("torch.", "")
        return f"{layout} {str(v.dtype).replace('torch.', '')} tensor on {v.device.type}"
    return None


def output_label(program):
    """The label of the program's output, where a first divergence or a raise names it."""
    return {"stage": "output", "out": program.output, "op": "output", "line": program.bound_at.get(program.output)}


def argument_label(program, name):
    """The label of the input `name` as forward's argument, where a write into it is named."""
    return {"stage": "argument", "out": name, "op": "input", "line": program.bound_at.get(name)}


def run_module(model, program, what, step=0, args=None, hook=None):
    """The module's forward. An exception it raises on the program's inputs is a finding about the
    bundle (Raised, naming the stage after the last one tapped); one that is not the bundle's
    (out of time or memory, the lock's own) is CouldNotRun. An output that is a state's buffer,
    which the next step overwrites under a caller's feet, is a BundleFault. `args`: the inputs
    passed to forward as arguments, in the program's order, by position (compile.py hands
    SambaFlow's tracer a list in INPUTS order: a forward whose parameters are in another order
    computes on the wrong ones); `hook`: what sees each tap (its `last`), where it is not the
    module's `probe`."""
    try:
        out = model(*(args or {}).values())
        if not hasattr(out, "untyped_storage") or not hasattr(out, "resolve_neg"):
            odd = f"a {type(out).__name__}, not a tensor"
        else:
            import torch
            kind = odd_kind(torch, out, output=True)
            odd = kind and f"a {kind}, not a dense real one on the CPU"
        if odd:
            raise BundleFault(output_label(program), f"in {what} the module's forward returned {odd}", step)
        out = out.detach().resolve_neg()   # (one that requires grad is a caller's to detach)
        mine = out.untyped_storage().data_ptr()
        alias = next((s for s in program.states if mine and mine == getattr(
            model, "leaf_" + s).untyped_storage().data_ptr()), None)
        if alias is None:
            return out
    except (CouldNotRun, BundleFault, KeyboardInterrupt):   # (Ctrl-C: the run's to stop)
        raise
    except BaseException as e:   # (a bundle's sys.exit(), or an exception of its own kind, is its fault too)
        hook = hook or model.probe
        nxt = getattr(hook, "last", -1) + 1 if hook else stage_raised_in(e, model)
        nxt = nxt if nxt is not None and nxt < len(program.stages) else None
        if bundles_fault(e, absurd(program)):
            raise Raised(nxt, what, str(e) if isinstance(e, Wrong) else f"{type(e).__name__}: {e}") from None
        where = "" if nxt is None else (f" at stage {nxt} ({program.stages[nxt].out} = "
                                        f"{program.stages[nxt].op.name}, line {program.stages[nxt].line})")
        did = "was stopped" if getattr(e, "stops", False) else "raised"   # (a time limit)
        raise CouldNotRun(f"the module {did}{where} in {what}: {type(e).__name__}: {e}") from None
    raise BundleFault(output_label(program), f"in {what} the module's output is the buffer of its state `{alias}`, "
                      "which the next step overwrites: a caller's earlier outputs would change", step)


class Probe:
    """The module's `tap` hook in the probe pass: compare each stage with the VM, hand back the VM's."""

    def __init__(self, torch, dtype, vm_stages, tol, precisions=None, views=(), known=None, watch=(), keep=()):
        self.torch, self.dtype, self.vm_stages, self.tol, self.views = torch, dtype, vm_stages, tol, views
        self.keep = keep   # the stages whose values are kept (bf16: every one; an argmax's token)
        # known(index, value, want): the module's view is the VM's by where it points (no read)
        self.known = known or (lambda index, value, want: False)
        self.precisions = precisions   # bf16: each stage's (compute, output); its values are kept
        self._results, self.values, self.exact = {}, {}, {}
        self._pending = {}   # small stages' {index: (the module's value, the VM's)}: compared together
        # {stage index: [(which of its values or None, the state buffer's dtype, or None for the
        # output)]}: what its tap handed on is kept (the output's) or summed (a state's): handed
        self.watch, self.handed = dict(watch), {}
        self.last = -1
        self.seconds = 0.0  # spent comparing and converting: the lock's, not the module's

    @property
    def results(self):
        """{stage index: its figures}, in the order the stages were tapped; the small stages'
        figured here, together, the first time they are asked for (compare_many)."""
        if self._pending:
            start = time.perf_counter()
            figured = compare_many([flat_pair(g, w) for g, w in self._pending.values()], self.tol)
            self._results.update(zip(self._pending, figured))
            self._pending = {}
            self.seconds += time.perf_counter() - start
        return self._results

    def _settled(self, index, m):
        """A stage's figures known now (a tapped stage's last tap is what counts: one it was
        queued with before is dropped)."""
        self._pending.pop(index, None)
        self._results[index], self.last = m, index

    def out_dtype(self, index):
        """The dtype a stage's value goes on in: the lock's, or under bf16 its output precision."""
        if self.precisions is not None:
            return self.torch.float32 if self.precisions[index][1] == "fp32" else self.torch.bfloat16
        return self.dtype

    def to_torch(self, value, index):
        """The VM's value as the module gets it: a copy (never the VM's memory, which a module
        writing in place, `Z.mul_(2)`, would change under the comparisons still to come)."""
        dtype = self.out_dtype(index)
        if numpy_dtype(dtype) is not None:   # float32, float64: NumPy rounds as torch does, sooner
            with np.errstate(over="ignore"):
                return self.torch.from_numpy(np.array(value, dtype=numpy_dtype(dtype), order="C"))
        return self.torch.from_numpy(np.ascontiguousarray(value, dtype=np.float64)).to(dtype, copy=True)

    def _own(self, value):
        """The module's value as float64 NumPy, a copy of its own (the module may write into it after the stage)."""
        v = value.detach()
        if v.dtype in (self.torch.float32, self.torch.float64) and not v.is_neg() and v.device.type == "cpu":
            return np.array(v.numpy(), dtype=np.float64)
        return v.resolve_neg().to(self.torch.float64, copy=True).numpy()

    def _tensors(self, index, values):
        for v in values:
            if not isinstance(v, self.torch.Tensor):
                raise Wrong(f"stage {index} returned a {type(v).__name__}, not a tensor")
            odd = odd_kind(self.torch, v)
            if odd:
                raise Wrong(f"stage {index} returned a {odd}, not a dense real one on the CPU")

    def __call__(self, index, value):
        start = time.perf_counter()
        try:
            back = self._compare(index, value)
            for part, dtype in self.watch.get(index, ()):   # as handed on (the module may write into it later)
                v = (back[part] if part is not None and isinstance(back, tuple) else back).detach()
                self.handed[(index, part)] = v.clone() if dtype is None else held_sum(self.torch, v, dtype)
            return back
        finally:
            self.seconds += time.perf_counter() - start

    def _compare(self, index, value):
        if not isinstance(index, int) or not 0 <= index < len(self.vm_stages):
            raise Wrong(f"the module tapped a stage {index!r} the program does not have")
        want = self.vm_stages[index]
        if isinstance(want, tuple):
            got = tuple(value) if isinstance(value, (tuple, list)) else (value,)
            if len(got) != len(want):
                raise Wrong(f"stage {index} returned {len(got)} values, expected {len(want)}")
            self._tensors(index, got)
            m = None
            for g, w in zip(got, want):
                m = worse(m, compare(g.detach(), w, self.tol))
            back = tuple(self.to_torch(w, index) for w in want)
            kept = got
        else:
            if isinstance(value, (tuple, list)):
                raise Wrong(f"stage {index} returned {len(value)} values, expected one")
            self._tensors(index, (value,))
            known = index in self.views and self.known(index, value.detach(), want)
            if known or (index in self.views and same_in_dtype(value.detach(), want)):
                # a view computes nothing: the VM's, rounded as the module holds its operand (the
                # load stage's rule), is all there is to check, and the module's own goes on
                self._settled(index, dict(EXACT, view=True))
                if known and self.precisions is not None:   # of a constant leaf: the floors read
                    self.exact[index] = value.detach()      # it for the VM's (bf16.floors)
                return value
            if value.numel() <= SMALL and tuple(value.shape) == tuple(np.shape(want)):
                # its own copy (the module may write into its value later), figured with the others
                mine = self._own(value)
                if self.precisions is not None or index in self.keep:
                    self.values[index] = mine
                self._settled(index, None)
                self._pending[index] = (mine, want)
                return self.to_torch(want, index)
            m = compare(value.detach(), want, self.tol)
            # exactly the VM's in the dtype it goes on in: its own (a transposed table is not copied)
            same = m["max_abs"] == 0 and m["nonfinite_mismatch"] == 0 and value.dtype == self.out_dtype(index)
            back = value if same else self.to_torch(want, index)
            release(want)
            kept = value
        if self.precisions is not None or index in self.keep:   # (each value of a stage that has two)
            self.values[index] = tuple(v.detach().double().numpy() for v in kept) if isinstance(kept, tuple) \
                else kept.detach().double().numpy()
        self._settled(index, m)
        return back


def same_values(torch, a, b):
    """Whether tensors `a` and `b` hold the same values (NaN where NaN), whatever their dtypes."""
    if not isinstance(a, torch.Tensor) or tuple(a.shape) != tuple(b.shape):
        return False
    return nan_equal(torch, a.detach().resolve_neg().double(), b.detach().resolve_neg().double())


def held_sum(torch, value, dtype):
    """(shape, dtype, the hash of its bytes) of `value` as a buffer of `dtype` holds it (copy_'s
    rounding): what a state's buffer holds after its write-back, without keeping a copy of it."""
    held = value.resolve_neg().to(dtype).contiguous()
    return tuple(held.shape), held.dtype, bytes_hash(torch, held)


class Returned:
    """The outputs a module returned, and the arguments it was handed, in its last WINDOW passes,
    held (so their memory is not another's) with the hash of their bytes: a later pass that
    writes into one, or returns an output's memory again, changes what a caller kept of an
    earlier step. (A module cycling more buffers than the window holds escapes it: a bound on
    what a check keeps, whatever its steps.)"""

    WINDOW = 8

    def __init__(self, torch, program, model):
        self.torch, self.program, self.kept, self.handed = torch, program, [], []
        self.leaves = {t.untyped_storage().data_ptr() for n in program.leaves if n not in program.states
                       and isinstance(t := getattr(model, "leaf_" + n, None), torch.Tensor)}

    def hold(self, args, step, which):
        """Hold the arguments `args` ({input: tensor}) the `which` pass of `step` was handed."""
        if args:
            self.handed = (self.handed + [(args, {n: held_sum(self.torch, a, a.dtype) for n, a in args.items()},
                                           step, which)])[-self.WINDOW:]

    def check(self, out, step, which):
        """[(label, message)] of an earlier output `out` (the `which` pass's of `step`) changed or
        shares memory with, or an earlier argument changed, at most one; then `out` is held."""
        torch, label = self.torch, output_label(self.program)
        mine = out.untyped_storage().data_ptr() if isinstance(out, torch.Tensor) else None
        found = [(argument_label(self.program, n), f"the argument `{n}` handed to the {w} pass of step {s} changed "
                  f"in or after the {which} pass of step {step}: a caller's earlier inputs change")
                 for args, sums, s, w in self.handed for n, a in args.items()
                 if held_sum(torch, a, a.dtype) != sums[n]]
        for t, was, s, w in self.kept:
            if held_sum(torch, t.detach(), t.dtype) != was:
                found.append((label, f"the output the module returned in the {w} pass of step {s} changed in the "
                                     f"{which} pass of step {step}: a caller's earlier outputs change"))
            elif mine and mine == t.untyped_storage().data_ptr() and mine not in self.leaves:
                found.append((label, f"the output of the {which} pass of step {step} is in the memory of the one "
                                     f"returned in the {w} pass of step {s}: a caller's earlier outputs change"))
        if isinstance(out, torch.Tensor):
            self.kept = (self.kept + [(out, held_sum(torch, out.detach(), out.dtype), step, which)])[-self.WINDOW:]
        return found[:1]


@contextlib.contextmanager
def as_arguments(torch, model, inputs, given=None):
    """The inputs `inputs` as forward's arguments ({name: value}, in their order), copies of their
    buffers (or of `given` values, held as their buffers hold them), which meanwhile hold what no
    input does (NaN; an integer buffer its least value; a mask each value flipped), so a forward
    that reads a buffer instead of its argument computes on it; the buffers put back after, from
    copies of their own (the module may write into its arguments)."""
    bufs = {n: b.detach() for n in inputs if isinstance(b := getattr(model, "leaf_" + n, None), torch.Tensor)}
    given = given or {}
    args = {n: given[n].to(b.dtype).reshape(b.shape).clone() if n in given else b.clone() for n, b in bufs.items()}
    saved = {n: (b, b.clone()) for n, b in bufs.items()}   # all taken first: two may share memory
    try:
        for b, was in saved.values():
            fill = math.nan if b.dtype.is_floating_point or b.is_complex() else None if b.dtype == torch.bool \
                else torch.iinfo(b.dtype).min if b.dtype.is_signed else torch.iinfo(b.dtype).max
            if not b.is_neg():
                try:   # (a mask: each value the other; from the copy, so memory two share flips once)
                    b.fill_(fill) if fill is not None else b.copy_(was.logical_not())
                except RuntimeError:   # (memory it cannot write: an expanded tensor)
                    pass
        yield args
    finally:
        for b, was in saved.values():
            if not b.is_neg():
                b.copy_(was)


def watched(program, model):
    """Probe's `watch` for the output and the states (last_writers): the output's value is kept,
    a state's summed in its buffer's dtype."""
    out = {}
    for name, (st, part) in last_writers(program).items():
        buf = getattr(model, "leaf_" + name, None) if name != program.output else None
        out.setdefault(st.index, []).append((part, getattr(buf, "dtype", None)))
    return out


def last_writers(program):
    """{name: (the last stage that gives it its value, which of the stage's values or None)} of the
    output and the states: what changed_after_tap holds them to."""
    last = {}
    for st in program.stages:
        if st.binds:
            last[st.out] = (st, None if st.writes is None else 0)
        if st.writes is not None:
            last[st.writes] = (st, 1 if st.binds else None)
    return {n: last[n] for n in [program.output, *program.states] if n in last}


def changed_after_tap(torch, program, model, out, handed):
    """After a probe pass: the output and the states that are not what their stages' taps handed
    on (the VM's values), as [(label, message)]: something the module did after the stage (a
    gain on the output, a state scaled as it is written back, a later op writing into it) that no
    stage's comparison sees. The output is its stage's value in any dtype that holds it; a state's
    buffer holds its last writer's value as a copy into the buffer's dtype holds it."""
    found, last = [], last_writers(program)

    where = last.get(program.output)
    want = where and handed.get((where[0].index, where[1]))
    if want is not None and not same_values(torch, out, want):
        found.append((output_label(program),
                      f"the module's output is not what stage {where[0].index} (`{program.output} = "
                      f"{where[0].op.name}`) handed on: changed after its stage, or not the value its tap "
                      "returned (a module returns what its last stage's tap hands back)"))
    for s in program.states:
        st, part = last[s]
        want, buf = handed.get((st.index, part)), getattr(model, "leaf_" + s, None)
        if want is not None and buf is not None and not isinstance(want, torch.Tensor) and \
                held_sum(torch, buf.detach(), want[1]) != want:
            found.append(({"stage": "write-back", "out": s, "op": st.op.name, "line": st.line},
                          f"the state `{s}` the module wrote back is not what stage {st.index} "
                          f"(`{st.op.name}`) handed on: changed after its stage, or written other than from "
                          "its tap (a state is written back from what its stage's tap hands back)"))
    return found
