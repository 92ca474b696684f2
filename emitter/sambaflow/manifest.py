"""manifest.json: every tensor (shape, dtype, role, checkpoint name, file) and every op of a bundle."""

import json

from ..language.names import gguf_name
from ..language.program import Program
from ..ops.norms import epsilon
from .marks import VENDOR_HEADER

SCHEMA, VERSION = "logos.sambaflow.manifest", 1


def render_manifest(p: Program, name, calls, precisions=None):
    tensors = []
    for v in p.leaves:
        d = p.decls[v]
        tensors.append({"var": v, "shape": [d.rows, d.cols], "dtype": "Real" if d.real else "Int",
                        "role": p.roles[v], "gguf": gguf_name(v, p.attention_layers),
                        "file": f"{v}.f64", "line": d.line})
    for st in p.stages:
        if st.binds:
            tensors.append({"var": st.out, "shape": list(p.shapes[st.out]),
                            "dtype": "Real" if p.real[st.out] else "Int", "role": "computed",
                            "gguf": None, "file": None, "line": st.line})
    ops = [_op(p, st, call, (precisions or {}).get(st.index)) for st, call in zip(p.stages, calls)]
    manifest = {
        "schema": SCHEMA,
        "version": VERSION,
        "provenance": VENDOR_HEADER[2:],
        "program": name,
        "inputs": [v for v in p.leaves if p.roles[v] == "input"],
        "states": list(p.states),
        "output": p.output,
        "output_shape": list(p.shapes[p.output]),
        # where a weights folder may hold a leaf (emitter/sambaflow/weight_files.py); `file` below
        # is its raw float64 spelling, the one the importers and `run --state-out` write
        "weight_files": ["<var>.f64", "<var>.f32", "<var>.npy", "*.safetensors (a tensor named <var>)"],
        "tensors": tensors,
        "ops": ops,
    }
    return _layout(manifest)


def _op(p: Program, st, call, precision=None):
    """One op's entry; a norm's carries its epsilon (the sentence's, else the default), and under a
    precision policy each op its [compute, output] precision in bfloat16."""
    entry = {"index": st.index, "line": st.line, "out": st.out, "op": st.op.name, "inputs": st.inputs,
             "writes": st.writes, "torch": st.op.spelling, "call": call}
    if precision is not None:
        entry["bf16"] = list(precision)
    if "EPS" in st.op.reals:
        entry["eps"] = epsilon(st.args(p.shapes))
    return entry


def _layout(manifest):
    """Pretty JSON with one tensor or op per line: readable, diffable, and fast (the C encoder
    serves each line; `indent=` would fall back to the pure-Python one)."""
    def value(v):
        if isinstance(v, list) and v and isinstance(v[0], dict):
            return "[\n" + ",\n".join("    " + json.dumps(x, ensure_ascii=False) for x in v) + "\n  ]"
        return json.dumps(v, ensure_ascii=False)
    body = ",\n".join(f"  {json.dumps(k)}: {value(v)}" for k, v in manifest.items())
    return "{\n" + body + "\n}\n"
