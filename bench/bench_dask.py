"""Beyond one machine, measured on this one: locks inline (at the best thread setting: 1 and 2
threads on the smaller real models) against `executor=dask:local` with 2 single-threaded workers,
for the zoo's real models (smollm2, qwen38, minilm, gemma3), with the ceiling for the same split in
plain processes (no doit, no Dask), and for the whole zoo; a Dask round trip's overhead per check,
and a fresh clone with a warm verdict cache against a no-op run plus the emits. Each line gives the
load average before and after: on a busy machine the ratios say little.

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
    return walls[best] / wall, rs


def one_check_overhead(zoo, n=30):
    """Seconds a Dask round trip adds to one small check (mlp float64), against running it here:
    the medians of `n` runs each, the two alternated (a busy machine slows both alike)."""
    import statistics
    sys.path.insert(0, zoo)
    os.chdir(zoo)
    from emitter.pipeline import executors
    job = {"name": "mlp", "root": zoo, "bundle": "build/bundles/mlp", "source": "programs/mlp.logos",
           "weights": "weights/mlp", "golden": None, "thread_env": {}, "memory": None,
           "record": {"dtype": "float64", "steps": 1, "tolerance": {"abs": None, "rel": None},
                      "config": {"allow_nonfinite": [], "bf16": None, "limits": {"tensor_bytes": None}},
                      "precision": None, "threads": 1}}
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


CAPTURE = """
import json, os, shutil, sys
os.chdir(sys.argv[1]); sys.path.insert(0, sys.argv[1])
from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain
from emitter.pipeline import executors
jobs, run = [], executors.Inline.run
executors.Inline.run = lambda self, js, seconds: jobs.extend(js) or run(self, js, seconds)
import dodo
for n in sys.argv[3:]:
    shutil.rmtree(os.path.join("build/results", n), ignore_errors=True)
assert DoitMain(ModuleTaskLoader(dodo)).run([f"lock:{n}" for n in sys.argv[3:]] + ["threads=1"]) == 0
with open(sys.argv[2], "w") as f:
    json.dump([dict(j, golden=None) for j in jobs], f)
"""

PLAIN = """
import json, os, sys
jobs = json.load(open(sys.argv[1]))
os.chdir(jobs[0]["root"]); sys.path.insert(0, jobs[0]["root"])
from emitter.pipeline import executors
for i in sys.argv[2].split(","):
    assert executors.Inline().run([jobs[int(i)]], 600)[0]["result"]["verdict"] == "pass"
"""


def ceiling(zoo, names, dask_results, base):
    """What two plain processes give here for the same checks split as the Dask run split them
    (each process's checks in the order its worker ran them), against one plain process running
    them all in inline's order: each process imports torch itself, as inline does inside its
    first check. Which checks run side by side matters on this machine (smollm2's bfloat16 check
    beside its float64 one takes a third longer than beside another bfloat16 one), so this, not
    two copies of the same work, is what any 2-worker executor could reach with this split."""
    path = os.path.join(base, "jobs.json")
    p = subprocess.run([sys.executable, "-c", CAPTURE, zoo, path, *names], cwd=zoo,
                       capture_output=True, text=True, env={**os.environ, "LOGOS_PROGRESS": "names"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    with open(path) as f:
        jobs = json.load(f)
    index = {(j["name"], j["record"]["dtype"]): i for i, j in enumerate(jobs)}
    split = {}
    for (name, dtype), r in sorted(dask_results.items(), key=lambda kv: kv[1]["execution"]["started"]):
        split.setdefault(r["execution"]["pid"], []).append(str(index[name, dtype]))

    def plain(groups):
        t = time.perf_counter()
        ps = [subprocess.Popen([sys.executable, "-c", PLAIN, path, ",".join(g)]) for g in groups]
        assert all(q.wait() == 0 for q in ps)
        return time.perf_counter() - t
    before = load()
    one = plain([[str(i) for i in range(len(jobs))]])
    two = plain(list(split.values()))
    print(f"ceiling: the same checks in plain processes, no doit, no Dask: one process {one:.1f} s, two "
          f"side by side split as the Dask workers ran them {two:.1f} s: {one / two:.2f}x "
          f"({before} -> {load()})", flush=True)
    return one / two


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", help="work in this folder and keep it (default: a temporary one)")
    ap.add_argument("--real-only", action="store_true",
                    help="leave out the whole zoo's comparison (the real models' locks are most of it)")
    a = ap.parse_args(argv)
    base = a.keep or tempfile.mkdtemp(prefix="bench-dask.")
    if a.keep and os.path.exists(base):
        shutil.rmtree(base)
    try:
        run(base, whole=not a.real_only)
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)


REAL = ("smollm2", "qwen38", "minilm", "gemma3")   # the zoo's real models: the 1.6x
THREADS_SHOWN_ON = ("smollm2", "qwen38", "minilm")   # (gemma3 at 2 threads takes minutes)


def run(base, whole=True):
    zoo = clone(os.path.join(base, "zoo"))
    cache_url = "file://" + os.path.join(base, "cache")
    key = {"LOGOS_CACHE_KEY": "bench"}
    print(f"machine: {os.cpu_count()} cores, {load()}; zoo copied to {zoo}", flush=True)

    s, p = doit(zoo, "emit", "wmanifest")
    print(f"setup: emits and derived imports {s:.1f} s (rc {p.returncode})", flush=True)

    for n in (1, 2):   # the best thread setting for inline, on the smaller real models
        before = load()
        wall, rs = locks(zoo, list(THREADS_SHOWN_ON), f"threads={n}")
        print(f"real models but gemma3: inline, {n} thread(s) per lock: {len(rs)} checks in {wall:.1f} s "
              f"wall (locks {lock_seconds(rs):.1f} s, CPU {lock_seconds(rs, 'cpu_seconds'):.1f} s; "
              f"{before} -> {load()})", flush=True)
    ratio, rs = compare(zoo, list(REAL), "real models (" + ", ".join(REAL) + ")", threads=(1,))
    best = ceiling(zoo, list(REAL), rs, base)
    print(f"  => dask:local reaches {ratio / best:.0%} of that ceiling", flush=True)
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
