"""The VM's golden outputs, which the lock hands back as the files of the bundle's golden/ so that
the bundle checks itself: `python compile.py test` runs model.py on the weights the lock used and
compares with them. Small on purpose: per step the output (raw float64) and a few stage summaries
(shape, mean, rms, first values), with the tolerances the lock applied. The lock writes nothing:
its callers (`logos lock`, the pipeline's driver) write the files where they belong."""

import json
import os

import numpy as np

from ..sambaflow.marks import program_name


SCHEMA, VERSION = "logos.golden", 1
STAGES = 8   # stage summaries per step, spread over the program, and always the output's


def summary(value):
    v = np.asarray(value[0] if isinstance(value, tuple) else value, dtype=np.float64)
    flat = v.reshape(-1)
    return {"shape": list(v.shape), "mean": float(flat.mean()) if flat.size else 0.0,
            "rms": float(np.sqrt(np.mean(flat * flat))) if flat.size else 0.0,
            "head": [float(x) for x in flat[:4]]}


def picked(program):
    """The stages summarised: up to STAGES spread evenly over those that bind a value (not a view of
    another, such as a transposed table), the last of them last (a program of views alone: its
    output's stage)."""
    binding = [st.index for st in program.stages if st.binds and not st.op.view]   # a view: its operand
    step = max(1, len(binding) // STAGES)
    last = binding[-1:] or [st.index for st in program.stages if st.binds][-1:]   # (all views: the output's)
    return sorted(set(binding[::step][:STAGES - 1]) | set(last))


class Golden:
    """Collects each step of the VM's run; `files()` is then golden/'s content, {name: bytes}.
    `bundle_dir` is where golden/ is to go: the weights directory is recorded relative to it, with
    `weights_sha256` ({file: sha256} of those read: compile.py test says so when it runs on others)."""

    def __init__(self, bundle_dir, program, weights_dir, tolerances, weights_sha256=None):
        self.program, self.tolerances, self.weights_sha256 = program, tolerances, weights_sha256
        self.weights = None if weights_dir is None else os.path.relpath(
            os.path.abspath(weights_dir), os.path.abspath(bundle_dir))
        self.outputs, self.stages, self.indices = {}, [], picked(program)

    def add(self, step, trace):
        self.outputs[f"output.{step}.f64"] = np.ascontiguousarray(trace.output, dtype="<f8").tobytes()
        self.stages.append([{"stage": i, "out": self.program.stages[i].out,
                             "op": self.program.stages[i].op.name, **summary(trace.stages[i])}
                            for i in self.indices])

    def files(self):
        """{name: bytes} of golden/: each step's output, then golden.json (last, so that a writer
        renaming them into place in this order shows golden.json only beside its outputs)."""
        steps = len(self.stages)
        body = {"schema": SCHEMA, "version": VERSION, "program": program_name(self.program.source),
                "weights": self.weights, "steps": steps,
                "tolerances": self.tolerances, "output": self.program.output,
                "outputs": [f"output.{s}.f64" for s in range(1, steps + 1)], "stages": self.stages,
                **({"weights_sha256": dict(sorted(self.weights_sha256.items()))} if self.weights_sha256 else {})}
        return {**self.outputs, "golden.json": _encoded(body)}


def _encoded(body):
    return (json.dumps(body, indent=1) + "\n").encode("utf-8")


def keyed(files, key):
    """golden/'s `files` with golden.json naming `key` (the pipeline's: the checks it is about)."""
    body = json.loads(files["golden.json"])
    body["key"] = key
    return {**files, "golden.json": _encoded(body)}


def key_of(files):
    """The key golden/'s `files` name in their golden.json, or None."""
    try:
        body = json.loads(files["golden.json"])
    except (KeyError, ValueError, RecursionError):
        return None
    return body.get("key") if isinstance(body, dict) else None


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def merged(bundle_dir, files, defaults=None):
    """`files` (golden/'s, from a lock) with the tolerances of the golden.json already in the
    bundle kept where it records the same run (the same weights, steps and outputs, byte for
    byte): a bundle locked by hand at float64, then at float32, tests at both. Then `defaults`
    ({dtype: tolerance}) for the dtypes neither records. The new lock's tolerances win."""
    new = json.loads(files["golden.json"])
    tolerances = {**(defaults or {}), **_same_run(bundle_dir, new, files), **new["tolerances"]}
    if tolerances == new["tolerances"]:
        return files
    new["tolerances"] = tolerances
    return {**files, "golden.json": _encoded(new)}


def _same_run(bundle_dir, new, files):
    """The tolerances of the bundle's golden.json where it records the run `new` describes, else {}."""
    try:
        with open(os.path.join(bundle_dir, "golden", "golden.json"), encoding="utf-8") as f:
            old = json.load(f)
        same = all(old.get(k) == new.get(k) for k in ("weights", "weights_sha256", "steps", "outputs",
                                                     "stages")) and all(
            _read(os.path.join(bundle_dir, "golden", n)) == files[n] for n in new["outputs"])
    except (OSError, ValueError, TypeError, AttributeError):
        return {}
    return old["tolerances"] if same and isinstance(old.get("tolerances"), dict) else {}
