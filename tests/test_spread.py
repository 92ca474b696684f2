"""`emitter.pipeline.spread`: a function over many items spread over the cores by fork gives what
the plain loop gives, keeps the hashes the children recorded, and falls back to the loop where a
child fails or other threads run; and a zoo big enough to be spread (the pre-check, the report's
rows) hands doit exactly what moved, wherever in the zoo it is."""

import json
import os
import time

from emitter import fingerprint
from emitter.pipeline import spread
from test_pipeline import PROG_B, ROOT, doit, make_zoo

FORKS = spread.cores() >= 2 and hasattr(os, "fork")


def _fresh(code, *args):
    """The stdout of `code` run in a fresh interpreter (this one may hold other tests' threads,
    and spread never forks beside threads)."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_results_are_the_loops_in_order_and_the_children_did_part():
    out = _fresh("import os\n"
                 "from emitter.pipeline.spread import spread\n"
                 "got = spread(lambda x: (x * x, os.getpid()), range(450))\n"
                 "assert [v for v, _ in got] == [x * x for x in range(450)]\n"
                 "print(len({p for _, p in got}), os.getpid() in {p for _, p in got})\n"
                 "print(len(set(spread(lambda x: os.getpid(), range(10)))))\n")   # too few to fork
    assert out.split() == [str(2 if FORKS else 1), "True", "1"], out


def test_a_failing_child_is_done_again_by_the_parent():
    out = _fresh("import os\n"
                 "from emitter.pipeline.spread import spread\n"
                 "parent = os.getpid()\n"
                 "def fn(x):\n"
                 "    if os.getpid() != parent:\n"
                 "        raise RuntimeError('dies in the child')\n"
                 "    return x + 1\n"
                 "print(spread(fn, range(500)) == [x + 1 for x in range(500)])\n")
    assert out.split() == ["True"], out


def test_no_fork_while_other_threads_run():
    out = _fresh("import os, threading\n"
                 "from emitter.pipeline.spread import spread\n"
                 "stop = threading.Event()\n"
                 "t = threading.Thread(target=stop.wait)\n"
                 "t.start()\n"
                 "print(set(spread(lambda x: os.getpid(), range(500))) == {os.getpid()})\n"
                 "stop.set()\n")
    assert out.split() == ["True"], out


def test_spreading_starts_no_worker_watch_and_a_started_watch_does_not_stop_it():
    """The run's second spread (the report's rows and files, after the pre-check's) still forks:
    its own forks start no watch of doit's workers, and that watch (a thread holding no lock)
    does not count as a thread a child could wait on."""
    out = _fresh("import os, threading\n"
                 "from emitter.pipeline import guards\n"
                 "from emitter.pipeline.spread import spread\n"
                 "guards.bind_children()\n"
                 "got = spread(lambda x: os.getpid(), range(500))\n"
                 "print(len(set(got)), [t.name for t in threading.enumerate()])\n"
                 "import multiprocessing\n"
                 "p = multiprocessing.Process(target=int)\n"   # doit's `-n` worker: the watch starts
                 "p.start(); p.join()\n"
                 "print(sorted(t.name for t in threading.enumerate()))\n"
                 "print(len(set(spread(lambda x: os.getpid(), range(500)))))\n")
    first, watched, again = out.splitlines()
    assert first == f"{2 if FORKS else 1} ['MainThread']", out
    assert watched == "['MainThread', 'logos-workers']", out
    assert again == str(2 if FORKS else 1), out


def test_what_children_record_comes_back(tmp_path):
    import hashlib
    paths = []
    for i in range(300):
        p = tmp_path / f"f{i}"
        p.write_text(f"file {i}\n")
        paths.append(str(p))
    time.sleep(fingerprint.RACY_S + 0.1)   # old enough to be recorded
    record = tmp_path / "fingerprints.json"
    out = _fresh("import json, sys\n"
                 "from emitter import fingerprint\n"
                 "from emitter.pipeline.spread import spread\n"
                 "fingerprint.bind(sys.argv[1])\n"
                 "paths = json.load(open(sys.argv[2]))\n"
                 "print(json.dumps(spread(fingerprint.sha256, paths, least=100)))\n",
                 record, _json(tmp_path / "paths.json", paths))
    shas = [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths]
    assert json.loads(out) == shas
    held = json.loads(record.read_text())["files"]   # saved at exit by the parent: the children's too
    assert all(held.get(p, "").endswith(s) for p, s in zip(paths, shas))


def _json(path, obj):
    path.write_text(json.dumps(obj))
    return path


def test_a_spread_zoo_hands_doit_what_moved_wherever_it_is(tmp_path):
    """A zoo of 420 programs (the pre-check, two children of 200 and more, and the report's
    rows are spread): a no-op runs
    nothing; an edit of a program at either end of the zoo (the parent's slice, a child's) runs
    that program's tasks and the report, nothing else; the report names every program."""
    programs = {f"p{i:03d}": (PROG_B, None) for i in range(420)}
    programs["p000"] = (PROG_B, "lock: true\n")
    programs["p419"] = (PROG_B, "lock: true\n")
    z = make_zoo(tmp_path / "zoo", programs)
    (z / "programs/defaults.yaml").write_text("lock: false\ndtypes: [float64]\n")
    rc, ran, out = doit(z)
    assert rc == 0 and len(ran) == 420 + 2 + 1, out
    rc, ran, out = doit(z)
    assert (rc, ran) == (0, set()) and "nothing moved since the last run" in out, out
    for edited, tasks in (("p419", {"emit:p419", "lock:p419"}), ("p000", {"emit:p000", "lock:p000"}),
                          ("p300", {"emit:p300"}), ("p010", {"emit:p010"})):
        with open(z / f"programs/{edited}.logos", "a") as f:
            f.write("Let z be sigmoid of y.\n")
        rc, ran, out = doit(z)
        assert (rc, ran) == (0, tasks | {"report"}), (edited, out)
        rc, ran, out = doit(z)
        assert (rc, ran) == (0, set()), (edited, out)
    rows = json.loads((z / "build/report.json").read_text())["results"]
    assert {r["name"] for r in rows} == set(programs) and all(r["verdict"] == "pass" for r in rows)
    assert all(r["current"] for r in rows)
    caches = z / "build/.report-cache"   # the report's rows: a file per program, a gone one's goes
    assert sorted(f.name for f in caches.iterdir()) == sorted(f"{n}.json" for n in programs)
    (z / "programs/p419.logos").unlink()
    (z / "programs/p419.yaml").unlink()
    (z / "build/.report-cache.json").write_text("{}")   # an earlier version's one file: it goes
    rc, ran, out = doit(z)
    assert rc == 0 and ran == {"report"}, out
    assert sorted(f.name for f in caches.iterdir()) == sorted(f"{n}.json" for n in programs if n != "p419")
    assert not (z / "build/.report-cache.json").exists()
