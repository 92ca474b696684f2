"""`emitter.pipeline.spread`: a function over many items spread over the cores by fork gives what
the plain loop gives, keeps what the children added to the records they share, and falls back to
the loop where a child fails or other threads run (a child's file writes are its own); and a zoo big enough to be spread (the pre-check,
the report's rows) hands doit exactly what moved, wherever in the zoo it is."""

import os
import threading
import time

from emitter import fingerprint
from emitter.pipeline import spread
from test_pipeline import PROG_B, doit, make_zoo

FORKS = spread.cores() >= 2 and hasattr(os, "fork")


def test_results_are_the_loops_in_order_and_the_children_did_part():
    items = list(range(450))
    got = spread.spread(lambda x: (x * x, os.getpid()), items)
    assert [v for v, _ in got] == [x * x for x in items]
    pids = {p for _, p in got}
    assert os.getpid() in pids and (len(pids) > 1) == FORKS, pids
    few = spread.spread(lambda x: os.getpid(), range(10))   # too few to be worth a fork
    assert set(few) == {os.getpid()}


def test_a_failing_child_is_done_again_by_the_parent():
    parent = os.getpid()

    def fn(x):
        if os.getpid() != parent:
            raise RuntimeError("dies in the child")
        return x + 1
    assert spread.spread(fn, range(500)) == [x + 1 for x in range(500)]


def test_no_fork_while_other_threads_run():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert set(spread.spread(lambda x: os.getpid(), range(500))) == {os.getpid()}
    finally:
        stop.set()
        t.join()


def test_what_children_record_comes_back(tmp_path):
    paths = []
    for i in range(300):
        p = tmp_path / f"f{i}"
        p.write_text(f"file {i}\n")
        paths.append(str(p))
    time.sleep(fingerprint.RACY_S + 0.1)   # old enough to be recorded
    record = tmp_path / "fingerprints.json"
    old = fingerprint._CURRENT[0]
    fingerprint.bind(str(record))
    try:
        shas = spread.spread(fingerprint.sha256, paths, least=100)
        import hashlib
        assert shas == [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths]
        held = fingerprint._CURRENT[0].files
        assert all(held.get(p, "").endswith(s) for p, s in zip(paths, shas))   # the children's too
        fingerprint.save()
    finally:
        fingerprint._CURRENT[0] = old
    assert all(p in record.read_text() for p in paths)   # saved by the parent


def test_a_spread_zoo_hands_doit_what_moved_wherever_it_is(tmp_path):
    """A zoo of 220 programs (the pre-check and the report's rows are spread): a no-op runs
    nothing; an edit of a program at either end of the zoo (the parent's slice, a child's) runs
    that program's tasks and the report, nothing else; the report names every program."""
    import json
    programs = {f"p{i:03d}": (PROG_B, None) for i in range(220)}
    programs["p000"] = (PROG_B, "lock: true\n")
    programs["p219"] = (PROG_B, "lock: true\n")
    z = make_zoo(tmp_path / "zoo", programs)
    (z / "programs/defaults.yaml").write_text("lock: false\ndtypes: [float64]\n")
    rc, ran, out = doit(z)
    assert rc == 0 and len(ran) == 220 + 2 + 1, out
    rc, ran, out = doit(z)
    assert (rc, ran) == (0, set()) and "nothing moved since the last run" in out, out
    for edited, tasks in (("p219", {"emit:p219", "lock:p219"}), ("p000", {"emit:p000", "lock:p000"}),
                          ("p150", {"emit:p150"}), ("p010", {"emit:p010"})):
        with open(z / f"programs/{edited}.logos", "a") as f:
            f.write("Let z be sigmoid of y.\n")
        rc, ran, out = doit(z)
        assert (rc, ran) == (0, tasks | {"report"}), (edited, out)
        rc, ran, out = doit(z)
        assert (rc, ran) == (0, set()), (edited, out)
    rows = json.loads((z / "build/report.json").read_text())["results"]
    assert {r["name"] for r in rows} == set(programs) and all(r["verdict"] == "pass" for r in rows)
    assert all(r["current"] for r in rows)
    caches = z / "build/.report-cache"   # the report's cache: a file per locked program, a gone one's goes
    assert sorted(f.name for f in caches.iterdir()) == ["p000.json", "p219.json"]
    (z / "programs/p219.logos").unlink()
    (z / "programs/p219.yaml").unlink()
    rc, ran, out = doit(z)
    assert rc == 0 and ran == {"report"}, out
    assert sorted(f.name for f in caches.iterdir()) == ["p000.json"]
