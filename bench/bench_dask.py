"""Beyond one machine, measured on this one: locks inline (at the best thread setting) against
`executor=dask:local` with 2 single-threaded workers, for the issue's real models (smollm2, qwen38,
minilm) and for the whole zoo (gemma3 too: one of its checks, bfloat16, is over half its lock
time, so it bounds the whole zoo's ratio), a Dask round trip's overhead per check, and a fresh
clone with a warm verdict cache against a no-op run plus the emits. Each line gives the load
average before and after: on a busy machine the ratios say little.

    .venv/bin/python bench/bench_dask.py [--keep DIR] [--real-only]

Everything runs through real `doit` in copies of this repository's zoo under a temporary folder
(this checkout's build/ is not touched); the derived weights are imported once, in the first copy.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPY = ("dodo.py", "emitter", "programs", "weights", "checkpoints")


def clone(dst):
    os.makedirs(dst)
    for p in COPY:
        src = os.path.join(ROOT, p)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dst, p), ignore=shutil.ignore_patterns("__pycache__"))
        elif os.path.exists(src):
            shutil.copy(src, dst)
    return dst


def doit(cwd, *args, env=None):
    """Seconds a real doit run took, and its process."""
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "doit", *args], cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, "LOGOS_PROGRESS": "names", **(env or {})})
    return time.perf_counter() - t, p


def results(zoo, names=None):
    out = {}
    for name in sorted(os.listdir(os.path.join(zoo, "build/results"))):
        if names is not None and name not in names:
            continue
        for f in sorted(os.listdir(os.path.join(zoo, "build/results", name))):
            with open(os.path.join(zoo, "build/results", name, f)) as fh:
                r = json.load(fh)
            out[(name, f[:-5])] = r
    return out


def drop_results(zoo, names=None):
    for name in names or os.listdir(os.path.join(zoo, "build/results")):
        shutil.rmtree(os.path.join(zoo, "build/results", name), ignore_errors=True)


def load():
    return "load %.1f/%.1f" % os.getloadavg()[:2]


def lock_seconds(rs, key="seconds"):
    return sum((r.get("execution") or {}).get(key) or 0 for r in rs.values())


def locks(zoo, names, *args, env=None):
    """`doit lock:NAME…` (or `doit lock` for the whole zoo) after dropping those results: the
    wall time and the results."""
    drop_results(zoo, names)
    wall, p = doit(zoo, *([f"lock:{n}" for n in names] if names else ["lock"]), *args, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return wall, results(zoo, names)


def compare(zoo, names, title, threads=(1, 2), cache=None):
    """The locks of `names` (None: every program) inline at each thread count, then on dask:local
    with 2 single-threaded workers (publishing to `cache`, (url, env), when given): the ratio."""
    walls, rss = {}, {}
    for n in threads:
        before = load()
        walls[n], rss[n] = locks(zoo, names, f"threads={n}")
        print(f"{title}: inline, {n} thread(s) per lock: {len(rss[n])} checks in {walls[n]:.1f} s "
              f"wall (locks {lock_seconds(rss[n]):.1f} s, CPU {lock_seconds(rss[n], 'cpu_seconds'):.1f} "
              f"s; {before} -> {load()})", flush=True)
    best = min(walls, key=walls.get)
    extra, env = ((f"cache={cache[0]}",), cache[1]) if cache else ((), None)
    before = load()
    wall, rs = locks(zoo, names, "executor=dask:local", "workers=2", "threads=1", *extra, env=env)
    same = all(rs[k]["verdict"] == rss[best][k]["verdict"]
               and rs[k].get("output") == rss[best][k].get("output") for k in rs)
    workers = sorted({r["execution"]["worker"] for r in rs.values()})
    first = min(r["execution"]["started"] for r in rs.values())
    last = max(r["execution"]["started"] + r["execution"]["seconds"] for r in rs.values())
    print(f"{title}: dask:local, 2 workers x 1 thread{' (publishing to the cache)' if cache else ''}: "
          f"{len(rs)} checks in {wall:.1f} s wall, cluster start included, on {len(workers)} "
          f"workers (checks from first start to last end {last - first:.1f} s; locks "
          f"{lock_seconds(rs):.1f} s, CPU {lock_seconds(rs, 'cpu_seconds'):.1f} s); verdicts and "
          f"figures equal inline: {same}; {before} -> {load()}", flush=True)
    print(f"  => {title}: inline at {best} thread(s) {walls[best]:.1f} s / dask:local {wall:.1f} s = "
          f"{walls[best] / wall:.2f}x", flush=True)
    return walls[best] / wall


def one_check_overhead(zoo, n=30):
    """Seconds a Dask round trip adds to one small check (mlp float64), against running it here:
    the medians of `n` runs each, the two alternated (a busy machine slows both alike)."""
    import statistics
    sys.path.insert(0, zoo)
    os.chdir(zoo)
    from emitter.pipeline import executors
    job = {"name": "mlp", "root": zoo, "bundle": "build/bundles/mlp", "source": "programs/mlp.logos",
           "weights": "weights/mlp", "golden": None, "threads": 1, "thread_env": {}, "memory": None,
           "kwargs": {"dtype": "float64", "steps": 1, "atol": None, "rtol": None,
                      "allow_nonfinite": (), "max_tensor_bytes": None}}
    inline = executors.Inline()
    inline.run([job], 600)   # warm: torch imported, the bundle's module compiled
    ex = executors.Dask(executors.parse("dask:local", 1))
    here, there = [], []
    try:
        ex.run([job], 600)
        for _ in range(n):
            t = time.perf_counter()
            inline.run([job], 600)
            here.append(time.perf_counter() - t)
            t = time.perf_counter()
            assert "result" in ex.run([job], 600)[0]
            there.append(time.perf_counter() - t)
    finally:
        ex.close()
    return statistics.median(here), statistics.median(there)


CEILING = """
import os, sys, time
os.chdir(sys.argv[1]); sys.path.insert(0, sys.argv[1])
from emitter.pipeline import executors
jobs = [{"name": n, "root": sys.argv[1], "bundle": f"build/bundles/{n}", "source": f"programs/{n}.logos",
         "weights": f"build/weights/{n}", "golden": None, "threads": 1, "thread_env": {}, "memory": None,
         "kwargs": {"dtype": d, "steps": int(s), "atol": None, "rtol": None, "allow_nonfinite": (),
                    "max_tensor_bytes": None}} for n, s in (a.split(":") for a in sys.argv[2:])
        for d in ("float64", "float32", "bfloat16")]
executors.Inline().run(jobs[:1], 600)   # torch imported, the module compiled
print("ready", flush=True)
sys.stdin.readline()
t = time.perf_counter()
executors.Inline().run(jobs, 600)
print(time.perf_counter() - t, flush=True)
"""


def ceiling(zoo, programs):
    """What this machine gives a second process now, without Dask: the same locks (each real
    model's three checks) in one process alone, then in two side by side; 2 x alone / together
    is the most any 2-worker executor could gain here."""
    import yaml
    args = []
    for n in programs:
        with open(os.path.join(zoo, "programs", f"{n}.yaml")) as f:
            args.append(f"{n}:{(yaml.safe_load(f) or {}).get('steps', 1)}")

    def together(k):
        ps = [subprocess.Popen([sys.executable, "-c", CEILING, zoo, *args], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True) for _ in range(k)]
        for p in ps:
            assert p.stdout.readline().strip() == "ready"
        for p in ps:
            p.stdin.write("\n")
            p.stdin.flush()
        out = [float(p.stdout.readline()) for p in ps]
        for p in ps:
            p.wait()
        return max(out)
    before = load()
    alone, two = together(1), together(2)
    print(f"ceiling: the real models' checks in one process {alone:.1f} s, in two side by side "
          f"{two:.1f} s: 2 processes give {2 * alone / two:.2f}x the throughput of one here "
          f"({before} -> {load()})", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", help="work in this folder and keep it (default: a temporary one)")
    ap.add_argument("--real-only", action="store_true",
                    help="leave out the whole zoo's comparison (gemma3's locks take minutes)")
    a = ap.parse_args(argv)
    base = a.keep or tempfile.mkdtemp(prefix="bench-dask.")
    if a.keep and os.path.exists(base):
        shutil.rmtree(base)
    try:
        run(base, whole=not a.real_only)
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)


REAL = ("smollm2", "qwen38", "minilm")   # the real models the 1.6x is about


def run(base, whole=True):
    zoo = clone(os.path.join(base, "zoo"))
    cache_url = "file://" + os.path.join(base, "cache")
    key = {"LOGOS_CACHE_KEY": "bench"}
    print(f"machine: {os.cpu_count()} cores, {load()}; zoo copied to {zoo}", flush=True)

    s, p = doit(zoo, "emit", "wmanifest")
    print(f"setup: emits and derived imports {s:.1f} s (rc {p.returncode})", flush=True)

    ceiling(zoo, REAL)
    compare(zoo, list(REAL), "real models (" + ", ".join(REAL) + ")")
    here, there = one_check_overhead(zoo)
    print(f"per-check overhead: mlp float64 {here * 1000:.1f} ms here, {there * 1000:.1f} ms through a "
          f"warm 1-worker LocalCluster: {1000 * (there - here):.1f} ms per task (target <= 20 ms)",
          flush=True)
    if whole:
        # gemma3's locks take minutes at 2 threads: the whole zoo inline at 1 thread, the best above
        compare(zoo, None, "the whole zoo", threads=(1,), cache=(cache_url, key))
    else:
        s, p = doit(zoo, "lock", "cache", f"cache={cache_url}", env=key)   # `cache`: those that did not rerun too
        print(f"the zoo's locks that did not run yet, published: {s:.1f} s", flush=True)
    # the cache: CI's run above published every verdict; a fresh clone takes them all
    noop, p = doit(zoo)
    noop, p = doit(zoo)   # the first plain run records the snapshot; the second is the no-op
    emits_clone = clone(os.path.join(base, "emits"))
    emits, p = doit(emits_clone, "emit")
    fresh = clone(os.path.join(base, "fresh"))
    began = time.time()
    warm, p = doit(fresh, f"cache={cache_url}", env=key)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    frs = results(fresh)
    hits = sum(1 for r in frs.values() if r.get("from_cache"))
    imported = os.path.isdir(os.path.join(fresh, "build/weights"))
    print(f"fresh clone, warm cache: {hits}/{len(frs)} verdicts from the cache, derived weights "
          f"imported: {imported}, report written: {p.returncode == 0}, {warm:.1f} s ({load()})",
          flush=True)
    print(f"  against a no-op run {noop:.2f} s + the emits in a fresh clone {emits:.1f} s = "
          f"{noop + emits:.1f} s: {warm / (noop + emits):.2f}x (target < 2x)", flush=True)
    verdicts = max(os.stat(os.path.join(fresh, "build/results", n, d + ".json")).st_mtime
                   for n, d in frs) - began
    print(f"  every verdict written {verdicts:.1f} s after the start ({verdicts / (noop + emits):.2f}x); "
          f"the rest is the report, report.html's plots drawn for the first time", flush=True)


if __name__ == "__main__":
    main()
