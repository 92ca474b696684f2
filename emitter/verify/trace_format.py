"""The VM trace's file format (emitter.verify.trace): each array's bytes (C or Fortran order, as
the VM made it), then a JSON index (per step: each stage's value, the output and the states, as
arrays or as references to a stage's value or a leaf), its length, its sha256 and a magic. A
stage whose op is a view, or whose value shares memory with its inputs, is a marker rebuilt from
them on reading. Each array carries its own sha256, checked as it is read. A file, or bytes in
memory (a small program's trace, kept in the process that runs its checks)."""

import hashlib
import io
import json
import os
import struct
import uuid

import numpy as np

from ..files import open_regular
from . import vm
from .fresh_inputs import FreshStep

MAGIC = b"LOGOSTR1"
SCHEMA, VERSION = "logos.vm-trace", 2   # v2: the fresh pass's step (`fresh`)
LIMIT = 1 << 30            # a trace over this many bytes is not stored (its checks compute the VM)
_FOOTER = struct.Struct("<Q32s8s")


class Unstorable(Exception):
    """A trace that is not written: too big, or a value that is not a plain array."""


class Damaged(Exception):
    """A trace file that is not whole: read no further."""


def _layout(a):
    """(the array as a C-contiguous block, its order): a Fortran-ordered array as its transpose."""
    if a.flags.f_contiguous and not a.flags.c_contiguous:
        return a.T, "F"
    return np.ascontiguousarray(a), "C"


class Writer:
    """Arrays streamed into a temporary file beside `path`, the index last; `commit` renames it."""

    def __init__(self, path, key, limit=LIMIT, memory=False):
        self.path, self.key, self.limit = path, key, limit
        if memory:   # (the trace kept in this process's memory: `_small`)
            self.tmp, self.f = None, io.BytesIO()
        else:
            self.tmp = f"{path}.{uuid.uuid4().hex[:12]}.partial"
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.f = open(self.tmp, "wb")
        self.f.write(MAGIC)
        self.offset, self.steps, self.fresh_step = len(MAGIC), [], None

    def blob(self, a):
        if not isinstance(a, np.ndarray) or a.dtype.kind not in "biuf":
            raise Unstorable(f"a VM value of type {type(a).__name__} is not stored")
        block, order = _layout(a)
        view = memoryview(block).cast("B")
        if self.offset + view.nbytes > self.limit:
            raise Unstorable(f"over {self.limit >> 20} MiB")
        self.f.write(view)
        rec = {"o": self.offset, "n": view.nbytes, "dtype": a.dtype.str, "shape": list(a.shape),
               "order": order, "sha": hashlib.sha256(view).hexdigest()}
        self.offset += view.nbytes
        return rec

    def step(self, program, current, trace):
        """One step's StepTrace (`current`: the leaves and states it started from)."""
        known, stages, env = {}, [], dict(current)
        for st, value in zip(program.stages, trace.stages):
            items = value if isinstance(value, tuple) else (value,)
            if _rebuilt(st, env, items):
                stages.append({"rebuild": True})
            elif isinstance(value, tuple):
                stages.append({"tuple": [self.blob(a) for a in value]})
            else:
                stages.append(self.blob(value))
            for j, a in enumerate(items):
                known.setdefault(id(a), {"stage": st.index, **({"item": j} if isinstance(value, tuple) else {})})
            vm.bind_result(st, env, value)

        def ref(name, a):
            if id(a) in known:
                return known[id(a)]
            if a is current.get(name):
                return {"leaf": name}
            return self.blob(a)
        self.steps.append({"stages": stages, "output": ref(program.output, trace.output),
                           "states": {s: ref(s, a) for s, a in trace.states.items()}})

    def fresh(self, got, feed):
        """The fresh pass's VM step (a fresh_inputs.FreshStep; `feed`: the stage it kept), or none
        where a value is not a plain array or the file would pass its limit (`estimate` counts
        the steps alone): each check then computes its own."""
        try:
            rec = {"request": got.request, "other": list(got.other),
                   "far": {s: self.blob(np.asarray(v)) for s, v in got.far.items()}, "trace": None}
            t = got.trace
            if t is not None:
                rec["trace"] = {"output": self.blob(np.asarray(t.output)), "feed": feed,
                                "states": {s: self.blob(np.asarray(a)) for s, a in t.states.items()},
                                "fed": None if feed is None else self.blob(t.stages[feed])}
            self.fresh_step = rec
        except Unstorable:
            self.fresh_step = None

    def commit(self, check=None):
        """Write the index, then (`check()` not raising: the inputs are still those keyed) rename."""
        index = json.dumps({"schema": SCHEMA, "version": VERSION, "key": self.key,
                            "steps": self.steps, "fresh": self.fresh_step}).encode()
        self.f.write(index)
        self.f.write(_FOOTER.pack(len(index), hashlib.sha256(index).digest(), MAGIC))
        if self.tmp is not None:
            self.f.close()
        if check is not None:
            check()
        if self.tmp is not None:
            os.replace(self.tmp, self.path)
        return self.offset + len(index) + _FOOTER.size

    def abandon(self):
        self.f.close()
        if self.tmp is not None:
            remove(self.tmp)


def _rebuilt(st, env, items):
    """A stage stored as a marker: a view op, or a value sharing memory with what it read."""
    if st.op.view:
        return True
    ins = [env[n] for n in st.inputs if isinstance(env.get(n), np.ndarray)]
    return any(np.may_share_memory(a, b) for a in items if isinstance(a, np.ndarray) for b in ins)


def estimate(program, n):
    """An upper bound of the bytes of `n` steps' trace: every stage that is not a view, the
    states beside them (a stage's value written back is stored once, as the stage)."""
    per = sum(r * c for st in program.stages if not st.op.view
              for r, c in [program.shapes.get(st.out) or program.shapes.get(st.writes) or (0, 0)])
    states = sum(r * c for s in program.states for r, c in [program.shapes.get(s, (0, 0))])
    return 8 * n * (per + states)


class Reader:
    """A trace file checked as far as its index: `index["steps"]`, each array read on demand."""

    def __init__(self, path, key, steps, body=None):
        self.f = open_regular(path) if body is None else io.BytesIO(body)
        try:
            self.size = size = self.f.seek(0, os.SEEK_END)
            self.f.seek(0)
            if size < len(MAGIC) + _FOOTER.size or self.f.read(len(MAGIC)) != MAGIC:
                raise Damaged("not a trace file")
            self.f.seek(size - _FOOTER.size)
            n, sha, magic = _FOOTER.unpack(self.f.read(_FOOTER.size))
            if magic != MAGIC or n > size - len(MAGIC) - _FOOTER.size:
                raise Damaged("truncated")
            self.f.seek(size - _FOOTER.size - n)
            raw = self.f.read(n)
            if hashlib.sha256(raw).digest() != sha:
                raise Damaged("its index does not match its sha256")
            index = json.loads(raw)
            if index.get("schema") != SCHEMA or index.get("version") != VERSION:
                raise Damaged(f"not a trace of this format (version {index.get('version')!r}, this one reads {VERSION})")
            if index.get("key") != key or len(index.get("steps", ())) != steps:
                raise Damaged("a trace of other inputs")
        except (Damaged, OSError, ValueError, struct.error) as e:
            self.f.close()
            raise Damaged(str(e)) from None
        self.index, self.data_end = index, size - _FOOTER.size - n

    def blob(self, rec):
        shape = rec["shape"] if rec["order"] == "C" else rec["shape"][::-1]
        a = np.empty(shape, np.dtype(rec["dtype"]))
        view = memoryview(a).cast("B") if a.nbytes else memoryview(b"")
        if rec["o"] + rec["n"] > self.data_end or view.nbytes != rec["n"]:
            raise Damaged("an array outside the file")
        self.f.seek(rec["o"])
        if self.f.readinto(view) != rec["n"] or hashlib.sha256(view).hexdigest() != rec["sha"]:
            raise Damaged("an array does not match its sha256")
        return a if rec["order"] == "C" else a.T

    def step(self, program, current, i):
        """Step `i`'s StepTrace, the view stages rebuilt from `current` as the VM made them."""
        rec, env, stages = self.index["steps"][i], dict(current), []
        for st, s in zip(program.stages, rec["stages"]):
            if s.get("rebuild"):
                with np.errstate(all="ignore"):   # as the VM ran it
                    value = vm.run_stage(program, st, env)
            elif "tuple" in s:
                value = tuple(self.blob(b) for b in s["tuple"])
            else:
                value = self.blob(s)
            vm.bind_result(st, env, value)
            stages.append(value)

        def ref(r):
            if "stage" in r:
                v = stages[r["stage"]]
                return v[r["item"]] if "item" in r else v
            return current[r["leaf"]] if "leaf" in r else self.blob(r)
        return vm.StepTrace(stages, ref(rec["output"]), {k: ref(r) for k, r in rec["states"].items()}, 0.0)

    def fresh(self, program):
        """The fresh pass's VM step stored beside the steps (a fresh_inputs.FreshStep), or None."""
        rec = self.index.get("fresh")
        if not isinstance(rec, dict):
            return None
        t, trace = rec.get("trace"), None
        if t is not None:
            stages = [None] * len(program.stages)
            if t["feed"] is not None:
                stages[t["feed"]] = self.blob(t["fed"])
            trace = vm.StepTrace(stages, self.blob(t["output"]), {s: self.blob(b) for s, b in t["states"].items()},
                                 0.0)
        return FreshStep(rec["request"], trace, {s: self.blob(b) for s, b in rec["far"].items()}, tuple(rec["other"]))

    def close(self):
        self.f.close()


def remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass
