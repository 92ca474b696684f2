"""A synthetic zoo for the report's tests and bench/bench_report.py: each program's emit status and
lock results written as the pipeline writes them, each result recorded under the key its inputs
have now by the pipeline's own rule (keys.current_parts), so report.build_rows takes them as
current verdicts: a report of 1,000 programs without 1,000 locks."""

import json
import os
import re

import numpy as np

from emitter.pipeline import keys
from emitter.pipeline.checks import Check, Entry
from emitter.pipeline.config import ProgramConfig
from emitter.pipeline.report import build_rows

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]   # Chromium's, in tests
DTYPES = ("float64", "float32", "bfloat16")
TOLERANCES = {"float64": (1e-9, 1e-9), "float32": (1e-4, 1e-3), "bfloat16": (1e-2, 2e-2)}
SCALE = {"float64": 1e-15, "float32": 1e-6, "bfloat16": 1e-2}   # a stage's error, roughly
GATE = {"cosine": 0.999, "deviation": 0.5, "excess": {"matmul": 4.0, "rmsnorm": 32.0}, "excess_other": 8.0,
        "margin_noise": 3.0, "z": 6.0}
OPS = ("matmul", "rmsnorm", "plus", "softmax")


def _result(name, dtype, key, rng, stages):
    atol, rtol = TOLERANCES[dtype]
    errs = SCALE[dtype] * rng.uniform(0.1, 3.0, stages)
    st = [{"stage": i, "out": f"h{i}", "op": OPS[i % 4], "line": 3 + i, "max_abs": float(e),
           "guarded_rel": float(e * 5), "cosine": 1.0 - float(e) ** 2, "pass": True,
           "worst_ratio": float(e / atol)} for i, e in enumerate(errs)]
    w = max(st, key=lambda s: s["worst_ratio"])
    out = {"max_abs": w["max_abs"], "guarded_rel": w["guarded_rel"], "cosine": w["cosine"], "integer": False,
           "pass": True, "worst_ratio": w["worst_ratio"], "argmax_agree": True}
    r = {"schema": "logos.lock.result", "name": name, "dtype": dtype, "verdict": "pass", "reason": None,
         "key": key, "tolerance": {"abs": atol, "rel": rtol}, "steps": 1, "first_divergence": None,
         "output": out, "stages": st, "timings": {"total_s": float(rng.uniform(0.01, 2.0))},
         "worst": {k: w[k] for k in ("stage", "out", "op", "line", "max_abs", "guarded_rel")} | {"ratio": w["worst_ratio"]}}
    if dtype == "bfloat16":
        excess = float(rng.uniform(0.2, 3.0))
        g = {"stage": w["stage"], "out": w["out"], "op": "matmul", "line": w["line"], "step": 1}
        r["worst"] = {**g, "ratio": excess / 4.0, "by": "excess", "max_abs": None, "guarded_rel": None}
        r["bf16"] = {"bounds": GATE, "worst": dict(r["worst"]), "worst_excess": {**g, "excess": excess, "limit": 4.0},
                     "worst_deviation": {**g, "deviation": 0.01}, "worst_z": {**g, "z": 1.0},
                     "min_cosine": {**g, "cosine": 0.9999}, "ops_failing": 0, "argmax_flips": 0,
                     "argmax_excused": 0}
    return r


def synthetic_rows(directory, programs, dtypes=DTYPES, stages=40, seed=0):
    """Write `programs` passing programs (each checked in `dtypes`, `stages` stages) under
    `directory` and return the report's rows of them, as report.build_rows makes them."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    entries = []
    for p in range(programs):
        name = f"prog{p:04d}"
        base = os.path.join(directory, name)
        checks = tuple(Check(dt, *TOLERANCES[dt], f"{base}.{dt}.json", {"dtype": dt}) for dt in dtypes)
        pc = ProgramConfig(name=name, source=f"programs/{name}.logos", config=None, weights=None,
                           dtypes=list(dtypes))
        entry = Entry(pc, (), base + ".bundle", base + ".emit.json", base + ".lock.json", directory, checks)
        status = {"status": "ok", "key": f"emit-{p}", "source_sha": f"{p:064x}", "bundle": {"model.py": "0" * 64}}
        with open(entry.status, "w") as f:
            json.dump(status, f)
        now = keys.current_keys(entry, 1, status)
        for c in checks:
            with open(c.result, "w") as f:
                json.dump(_result(name, c.dtype, now[c.dtype], rng, stages), f)
        entries.append(entry)
    made, keys.made_current = keys.made_current, lambda *a: True   # no program or bundle files:
    try:                                                           # taken as their emits left them
        return build_rows(entries, os.path.join(directory, ".report-cache"), 1)
    finally:
        keys.made_current = made


def pdf_pages(path):
    """The pages of a PDF Chromium printed (`path`: a pathlib.Path): how long the laid-out page is."""
    return len(re.findall(rb"/Type\s*/Page[^s]", path.read_bytes()))
