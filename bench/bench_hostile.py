"""The hostile zoo's cost: every case of tests/hostile_corpus.py planted beside good programs, one
full `doit -n 2` run and one no-op run, timed, with the peak memory of the doit process tree.

    python bench/bench_hostile.py [--good 20]

Prints one JSON object: the number of hostile cases, the wall time of the full run and of the no-op,
the peak RSS (MiB) of the largest process of each run, and the checks by verdict."""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from hostile_corpus import GOOD, plant  # noqa: E402


def run(zoo, *args):
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "doit", *args], cwd=zoo, capture_output=True, text=True,
                       errors="replace", env={**os.environ, "LOGOS_PROGRESS": "line"})
    seconds = time.monotonic() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return p, seconds, max(peak, before) / 1024


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--good", type=int, default=20, help="good programs beside the hostile ones")
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="bench_hostile_")
    try:
        zoo, outside = os.path.join(tmp, "zoo"), os.path.join(tmp, "outside")
        os.makedirs(outside)
        shutil.copytree(os.path.join(ROOT, "emitter"), os.path.join(zoo, "emitter"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(os.path.join(ROOT, "dodo.py"), zoo)
        os.makedirs(os.path.join(zoo, "programs"))
        for i in range(args.good):
            with open(os.path.join(zoo, "programs", f"good{i}.logos"), "w") as f:
                f.write(GOOD)
            os.makedirs(os.path.join(zoo, "weights", f"good{i}"))
            np.random.default_rng(i).standard_normal((4, 4)).astype("<f8").tofile(
                os.path.join(zoo, "weights", f"good{i}", "w.f64"))
        cases = plant(zoo, outside)
        full, full_s, full_mib = run(zoo, "-n", "2")
        noop, noop_s, _ = run(zoo)
        report = json.load(open(os.path.join(zoo, "build", "report.json")))
        print(json.dumps({
            "hostile_cases": len(cases), "good_programs": args.good,
            "full_run_s": round(full_s, 2), "full_run_rc": full.returncode,
            "traceback_in_output": "Traceback" in full.stdout + full.stderr,
            "peak_rss_mib": round(full_mib, 1), "noop_s": round(noop_s, 2),
            "checks": report["counts"],
        }, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
