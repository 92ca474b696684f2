"""Benchmark the pipeline on a generated zoo: full build, no-op, one-edit rebuild, against bare doit's
own no-op on a trivial dodo with the same number of tasks, all in one run.

    python bench/bench_zoo.py [--programs 1000] [--jobs 2] [--keep DIR]

Targets (issue 24): a no-op within 1.0x bare doit's no-op on the same task count (one file_dep and
one target per task: `noop_ratio_vs_bare`); one edit within no-op + that program's own work (its
emit and lock checks run alone in one fresh Python process); a full build no slower than before.
Also timed: doit on the zoo's own graph shape with trivial tasks (doit's own cost for that graph),
a no-op after one program file was touched (one hash, nothing handed) and a no-op that is not a
plain run (`doit -n 1`: every task handed to doit, each found current by its key). Prints one
JSON object.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# bare doit: one task per zoo task, each with one file_dep and one target, or (BENCH_SHAPE) with
# as many file_deps and targets as its zoo task: doit's own cost for the zoo's graph
TRIVIAL_DODO = '''
import json, os
DOIT_CONFIG = {"dep_file": "build/.doit.db", "backend": "sqlite3", "check_file_uptodate": "md5",
               "verbosity": 0}
SHAPE = json.load(open(os.environ["BENCH_SHAPE"]))


def touch(srcs, dsts):
    for dst in dsts:
        with open(dst, "w") as f:
            f.write("".join(open(s).read() for s in srcs))


def task_t():
    for i, (deps, targets) in enumerate(SHAPE):
        srcs = ["src/%d.%d" % (i, k) for k in range(deps)]
        dsts = ["build/%d.%d" % (i, k) for k in range(targets)]
        yield {"name": str(i), "actions": [(touch, [srcs, dsts])], "file_dep": srcs,
               "targets": dsts}
'''

SHAPE_CODE = """import json, sys
sys.path.insert(0, ".")
import dodo
shape = []
for k in sorted(vars(dodo)):
    if k.startswith("task_"):
        made = getattr(dodo, k)()
        for t in ([made] if isinstance(made, dict) else made or []):
            # at least one file_dep: a trivial task with none would run every time
            shape.append([max(1, len(t.get("file_dep", []))), len(t.get("targets", []))])
print(json.dumps(shape))
"""


def program(i):
    """A small real program: matmul, rmsnorm and a nonlinearity, of a size that varies with i."""
    n = 2 + i % 7
    ops = ["sigmoid", "silu", "gelu", "softmax"]
    return (f"Let x be a 1 by {n} tensor of Real.\n"
            f"Let w be a {n} by {n} tensor of Real.\n"
            f"Set item 1 of x to {1 + i % 5}.5.\n"
            f"Let h be x matmul w.\n"
            f"Let g be {ops[i % 4]} of h.\n"
            f"Let y be rmsnorm of g.\n"), n


def make_zoo(base, count):
    os.makedirs(base)
    shutil.copy(os.path.join(ROOT, "dodo.py"), base)
    shutil.copytree(os.path.join(ROOT, "emitter"), os.path.join(base, "emitter"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    # compiled once, as an installed package is (bare doit's own modules are): with
    # PYTHONDONTWRITEBYTECODE set, the zoo's copy would otherwise be compiled on every run
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(base, "emitter")], check=True)
    os.makedirs(os.path.join(base, "programs"))
    rng = np.random.default_rng(0)
    for i in range(count):
        name = f"p{i:04d}"
        src, n = program(i)
        with open(os.path.join(base, "programs", name + ".logos"), "w") as f:
            f.write(src)
        os.makedirs(os.path.join(base, "weights", name))
        rng.standard_normal((n, n)).astype("<f8").tofile(os.path.join(base, "weights", name, "w.f64"))
        if i % 2:
            with open(os.path.join(base, "programs", name + ".yaml"), "w") as f:
                f.write("dtypes: [float32]\n")


def timed(cmd, cwd, env=None):
    start = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    secs = time.perf_counter() - start
    ran = sum(1 for ln in p.stdout.splitlines() if ln.startswith(".  "))
    return secs, p.returncode, ran, p


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2, help="doit -n for the full build")
    ap.add_argument("--repeat", type=int, default=9, help="interleaved no-op runs (medians count)")
    ap.add_argument("--edits", type=int, default=5, help="edit rounds (medians count)")
    ap.add_argument("--keep", help="build the zoo in this (new) directory and keep it")
    args = ap.parse_args(argv)
    tmp = args.keep or tempfile.mkdtemp(prefix="bench_zoo_")
    zoo = os.path.join(tmp, "zoo") if not args.keep else tmp
    doit = [sys.executable, "-m", "doit"]
    names = {"LOGOS_PROGRESS": "names"}
    out = {"programs": args.programs}
    try:
        make_zoo(zoo, args.programs)
        full = timed(doit + ["-n", str(args.jobs)], zoo, names)
        out["full_build_s"] = round(full[0], 2)
        out["full_build_rc"] = full[1]
        out["tasks_run_full"] = full[2]
        timed(doit, zoo, names)       # settle doit's state after the parallel build
        shape = json.loads(subprocess.run([sys.executable, "-c", SHAPE_CODE], cwd=zoo, check=True,
                                          capture_output=True, text=True).stdout)
        n_tasks = len(shape)
        bares = {}
        for kind, spec in (("bare", [[1, 1]] * n_tasks), ("shaped", shape)):
            d = os.path.join(tmp, kind)
            os.makedirs(os.path.join(d, "src"))
            os.makedirs(os.path.join(d, "build"))
            with open(os.path.join(d, "dodo.py"), "w") as f:
                f.write(TRIVIAL_DODO)
            with open(os.path.join(d, "shape.json"), "w") as f:
                json.dump(spec, f)
            for i, (deps, _) in enumerate(spec):
                for k in range(deps):
                    with open(os.path.join(d, "src", f"{i}.{k}"), "w") as f:
                        f.write(str(i))
            bares[kind] = (d, {"BENCH_SHAPE": os.path.join(d, "shape.json")})
            timed(doit, *bares[kind])
        # no-ops interleaved (this machine is noisy: neighbours' load hits all of them alike); the
        # touched ones leave the zoo settled again for the next round's plain no-op
        victim = f"p{args.programs // 2:04d}"
        runs = {"zoo": [], "bare": [], "shaped": [], "touched": [], "full": []}
        for k in range(args.repeat):
            runs["zoo"].append(timed(doit, zoo, names))
            for kind in ("bare", "shaped"):
                runs[kind].append(timed(doit, *bares[kind]))
            later = time.time() + 10 + k
            os.utime(os.path.join(zoo, "programs", victim + ".logos"), (later, later))
            runs["touched"].append(timed(doit, zoo, names))
            runs["full"].append(timed(doit + ["-n", "1"], zoo, names))
        med = {k: statistics.median(r[0] for r in v) for k, v in runs.items()}
        out["noop_s"] = round(med["zoo"], 3)
        out["noop_tasks_run"] = max(r[2] for r in runs["zoo"])
        out["noop_one_touched_s"] = round(med["touched"], 3)
        out["noop_full_load_s"] = round(med["full"], 3)
        out["touched_tasks_run"] = max(r[2] for r in runs["touched"] + runs["full"])

        # one edit against its budget: each round edits one program (a new sentence), rebuilds,
        # then does that program's own work alone in one fresh process (interpreter start, the
        # imports a lock needs, torch included, and its emit and lock checks), then a no-op;
        # interleaved, so the machine's drifting load hits all three alike. Medians count.
        dtypes = ["float32"] if int(victim[1:]) % 2 else ["float64", "float32"]
        own_code = ("import sys, tempfile; sys.path.insert(0, '.')\n"
                    "from emitter.sambaflow.emit import emit_program, write_bundle\n"
                    "from emitter.verify.lock import lock_bundle\nfrom emitter.language.reader import read_file\n"
                    f"d = tempfile.mkdtemp(); p = 'programs/{victim}.logos'\n"
                    "write_bundle(emit_program(read_file(p)), d)\n"
                    f"for dt in {dtypes!r}:\n"
                    f"    assert lock_bundle(d, p, 'weights/{victim}', dt)['verdict'] == 'pass'\n")
        edits, owns, noops = [], [], []
        for k in range(args.edits):
            with open(os.path.join(zoo, "programs", victim + ".logos"), "a") as f:
                f.write(f"Let z{k} be sigmoid of y.\n")
            edits.append(timed(doit, zoo, names))
            own = timed([sys.executable, "-c", own_code], zoo)
            if own[1] != 0:
                raise SystemExit(f"own work failed: {own[3].stderr}")
            owns.append(own[0])
            noops.append(timed(doit, zoo, names)[0])
        edit, own, noop_here = (statistics.median(x) for x in ([r[0] for r in edits], owns, noops))
        out["one_edit_s"] = round(edit, 3)
        out["one_edit_tasks_run"] = max(r[2] for r in edits)
        out["own_work_s"] = round(own, 3)
        out["noop_beside_edits_s"] = round(noop_here, 3)

        out["tasks"] = n_tasks
        out["file_deps"], out["targets"] = (sum(x[i] for x in shape) for i in (0, 1))
        out["bare_doit_noop_s"] = round(med["bare"], 3)
        out["noop_ratio_vs_bare"] = round(med["zoo"] / med["bare"], 2)
        out["noop_target_met"] = med["zoo"] <= 1.0 * med["bare"]
        out["full_load_ratio_vs_bare"] = round(med["full"] / med["bare"], 2)
        # the same graph (deps and targets per task) with nothing of ours: what is doit's own cost
        out["shaped_doit_noop_s"] = round(med["shaped"], 3)
        out["noop_ratio_vs_shaped"] = round(med["zoo"] / med["shaped"], 2)
        out["one_edit_budget_s"] = round(noop_here + own, 3)
        out["one_edit_target_met"] = edit <= noop_here + own
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
