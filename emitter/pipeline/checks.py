"""The zoo as typed records, built once per run from the discovered programs and their merged
configs: an `Entry` per program (its config, where its files go, its checks) and a `Check` per
(program, dtype). Every task, key, action and report row of a run is made from these; nothing
reshapes a check's facts on the way."""

import os
from dataclasses import dataclass
from typing import Optional

from ..files import BUNDLE_FILES
from ..verify.tolerances import tolerance
from .config import DEFAULTS_FILE, LIMITS, ProgramConfig


@dataclass(frozen=True)
class Check:
    """One (program, dtype) check: its tolerance, where its result goes, and the parts of its key
    that its config decides (`spec`; None for a refused config: nothing to key)."""
    dtype: str
    atol: Optional[float]
    rtol: Optional[float]
    result: str
    spec: Optional[dict]

    @property
    def tolerance(self):
        return tolerance(self.dtype, self.atol, self.rtol)


@dataclass(frozen=True)
class Entry:
    """One program of the run: its resolved config and where its files go under build/."""
    pc: ProgramConfig
    configs: tuple        # the YAML files its config was merged from
    bundle: str
    status: str           # build/status/NAME.emit.json: the emit's key and the bundle's hashes
    lock_status: str      # build/status/NAME.lock.json: each check's key, verdict, result's sha256; golden/
    results: str
    checks: tuple

    @property
    def name(self):
        return self.pc.name

    @property
    def locked(self):
        return bool(self.checks)

    def bundle_files(self):
        return [f"{self.bundle}/{f}" for f in BUNDLE_FILES]

    def could_configure(self):
        """The files its config was merged from and those it would be were they there (the zoo's
        defaults, its own YAML; none for a refused name), and its default weights folder where
        it had none (one it has is read as its lock runs): one made, rewritten or removed
        changes its checks."""
        folder, name = os.path.dirname(self.pc.source), self.pc.name
        if self.pc.error or not self.pc.source.endswith(f"/{name}.logos"):
            return self.configs
        could = (os.path.join(folder, DEFAULTS_FILE), os.path.join(folder, f"{name}.yaml"))
        weights = (f"weights/{name}",) if self.pc.weights is None else ()
        return tuple(dict.fromkeys(self.configs + could)) + weights


def _spec(pc, dtype, atol, rtol):
    return {"dtype": dtype, "steps": pc.steps, "tolerance": tolerance(dtype, atol, rtol),
            # the rest of the merged config a verdict depends on (the bf16 gate's bounds for a
            # bfloat16 check; the limits a check can run into), as values: the key's record holds
            # them as they are. The tensor limit by default is half this machine's memory: not
            # the config's, and no part of a key that clones and CI share
            "config": {"weights": pc.weights, "allow_nonfinite": sorted(pc.allow_nonfinite),
                       "bf16": (pc.bf16 or {}) if dtype == "bfloat16" else None,
                       "limits": {"seconds": pc.limits["seconds"], "tensor_bytes": None if
                                  pc.limits["tensor_bytes"] == LIMITS["tensor_bytes"] else pc.limits["tensor_bytes"]}},
            "precision": pc.precision}


def entries(programs, build="build", defaults=()):
    """An Entry per ProgramConfig, in the given (sorted) order."""
    out = []
    for pc in programs:
        s = pc.name
        results = f"{build}/results/{s}"
        checks = tuple(Check(dt, *pc.tolerance(dt), f"{results}/{dt}.json",
                             None if pc.error else _spec(pc, dt, *pc.tolerance(dt)))
                       for dt in pc.dtypes) if (pc.lock or pc.error) else ()
        out.append(Entry(pc=pc, configs=tuple(defaults) + ((pc.config,) if pc.config else ()),
                         bundle=f"{build}/bundles/{s}", status=f"{build}/status/{s}.emit.json",
                         lock_status=f"{build}/status/{s}.lock.json", results=results, checks=checks))
    return out
