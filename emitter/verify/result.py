"""A lock check's RESULT.json: its schema, the record of a check before its verdict (an error,
which `logos lock` leaves at its path while it runs, so a process ended mid-way leaves no earlier
verdict there) and its writing (whole or not at all)."""

import os

from ..files import json_lines, write_out
from .tolerances import tolerance

SCHEMA, VERSION = "logos.lock.result", 2


def unfinished(bundle_dir, program_path, weights_dir, dtype, steps, atol=None, rtol=None,
               reason="the lock did not finish: its process ended before a verdict (killed, out of "
                      "memory, or the bundle's own code ended it)"):
    """A check's RESULT.json before its verdict: an error, as `logos lock` leaves it while it runs."""
    return {
        "schema": SCHEMA, "version": VERSION, "program": None,
        "name": os.path.splitext(os.path.basename(str(program_path)))[0],
        "program_path": str(program_path), "bundle": str(bundle_dir),
        "weights": None if weights_dir is None else str(weights_dir), "dtype": dtype, "steps": steps,
        "verdict": "error", "reason": reason, "tolerance": tolerance(dtype, atol, rtol), "output": None,
        "worst": None, "first_divergence": None, "load": None, "stages": [], "steps_detail": [],
        "timings": {"vm_s": 0.0, "module_s": 0.0, "probe_s": 0.0, "judge_s": 0.0},
        "hashes": {"source": None, "bundle": {}, "weights": None}, "environment": None,
        "unmatched_weights": [],
    }


def write_result(result, path):
    write_out(path, json_lines(result))
