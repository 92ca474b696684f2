"""A no-op over a settled zoo: a plain `doit` after a run that settled every task it reached hands
doit the report task alone (`emitter.pipeline.settled`, `fastpath`); whatever moved since has doit
load every task again, so exactly the tasks that should rerun do. Real doit runs in a temporary
copy of a small zoo, and the snapshot's rules checked on files directly."""

import json
import os
import sys
import time

import test_pipeline
import test_verdicts
from emitter.pipeline import fastpath, files_io, settled
from test_pipeline import ALL_A_B, PROG_B, _weights, doit

FAST = "nothing moved since the last run"
zoo = test_pipeline.zoo   # the fixture: programs a (with weights, two dtypes) and b
derived_zoo = test_verdicts.zoo   # a, b and d, whose weights a (fake) importer derives


def test_a_settled_noop_is_fast_and_whatever_moved_reruns_its_tasks(zoo):
    rc, ran, out = doit(zoo)
    assert rc == 0 and ran == ALL_A_B and FAST not in out, out
    rc, ran, out = doit(zoo)                         # the build settled every task: fast at once
    assert (rc, ran) == (0, set()) and FAST in out, out

    with open(zoo / "programs/b.logos", "a") as f:   # an edited program: its tasks only
        f.write("Let z be sigmoid of y.\n")
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, {"emit:b", "lock:b", "report"}) and FAST not in out, out
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out

    result = zoo / "build/results/a/float32.json"    # a result edited by hand (same size)
    locked = result.read_text()
    result.write_text(locked.replace('"pass"', '"PASS"', 1))
    rc, ran, out = doit(zoo)
    assert rc == 0 and "lock:a" in ran and not ran & {"emit:a", "wmanifest:a", "lock:b"}, out
    assert json.loads(result.read_text())["verdict"] == "pass"

    (zoo / "weights/a/extra.f64").write_bytes(b"\0" * 8)    # a weight file added
    rc, ran, out = doit(zoo)
    assert rc == 0 and {"wmanifest:a", "lock:a"} <= ran and "emit:a" not in ran, out

    (zoo / "programs/c.logos").write_text(PROG_B)     # a new program
    rc, ran, out = doit(zoo)
    assert rc == 0 and {"emit:c", "lock:c", "report"} <= ran and not ran & {"emit:a", "emit:b"}, out

    rc, _, out = doit(zoo, "forget", "lock:b")       # doit's own DB changed under the snapshot
    assert rc == 0, out
    rc, ran, out = doit(zoo)
    assert rc == 0 and "lock:b" in ran and FAST not in out, out
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out

    now = time.time() + 5                            # touched, unchanged: checked in full, no rerun
    os.utime(zoo / "programs/a.logos", (now, now))
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST not in out, out
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out


def test_a_failing_zoo_hands_doit_what_failed_each_run(zoo):
    (zoo / "programs/b.logos").write_text("Let y be frobnicate of x.\n")   # refused: the report fails
    rc, ran, out = doit(zoo)
    assert rc != 0 and "report" in ran, out
    for _ in range(2):        # the failed report (only) runs again, the others are not handed
        rc, ran, out = doit(zoo)
        assert rc != 0 and ran == {"report"} and "1 of 10 tasks handed to doit" in out, out
    (zoo / "programs/b.logos").write_text(PROG_B)
    rc, ran, out = doit(zoo)
    assert rc == 0 and ran == {"emit:b", "lock:b", "report"}, out
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out


def test_derived_weights_under_the_snapshot(derived_zoo):
    z = derived_zoo                                  # d: weights imported from ckpt/w.bin
    rc, ran, out = doit(z)
    assert rc == 0 and {"weights:d", "lock:d"} <= ran, out
    rc, ran, out = doit(z)       # the import stamps no files: this run checks every task
    assert (rc, ran) == (0, set()) and FAST not in out, out
    rc, ran, out = doit(z)
    assert (rc, ran) == (0, set()) and FAST in out, out
    _weights(z / "build/weights/d/w.f64", 7)         # an imported weight edited: its manifest
    rc, ran, out = doit(z)
    assert rc == 0 and {"wmanifest:d", "lock:d"} <= ran and not ran & {"lock:a", "weights:d"}, out
    _weights(z / "ckpt/w.bin", 6)                    # another checkpoint: imported again
    rc, ran, out = doit(z)
    assert rc == 0 and {"weights:d", "wmanifest:d", "lock:d"} <= ran and "lock:a" not in ran, out
    for _ in range(2):
        rc, ran, out = doit(z)
        assert (rc, ran) == (0, set()), out
    assert FAST in out


STANDALONE = '''
DOIT_CONFIG = {**DOIT_CONFIG, "default_tasks": DOIT_CONFIG["default_tasks"] + ["notes"]}


@standalone
def task_notes():
    return {"actions": ["cp notes.txt build/notes.copy"], "file_dep": ["notes.txt"],
            "targets": ["build/notes.copy"]}
'''

NAMES_A_LOCK = '''

def task_after_lock():
    return {"actions": ["touch build/after"], "task_dep": ["lock:a"], "targets": ["build/after"]}
'''


def test_a_dodos_own_tasks_are_checked_and_an_unmarked_one_keeps_the_full_load(zoo):
    (zoo / "notes.txt").write_text("one\n")
    with open(zoo / "dodo.py", "a") as f:
        f.write(STANDALONE)
    rc, ran, out = doit(zoo)
    assert rc == 0 and ran == ALL_A_B | {"notes"}, out
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out
    (zoo / "notes.txt").write_text("two\n")          # the dodo's own task is still checked
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, {"notes"}), out
    assert (zoo / "build/notes.copy").read_text() == "two\n"
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()), out
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out

    with open(zoo / "dodo.py", "a") as f:            # a creator that names a zoo task, unmarked
        f.write(NAMES_A_LOCK)
    rc, ran, out = doit(zoo, "after_lock")
    assert rc == 0 and ran == {"after_lock"}, out
    for _ in range(2):                               # every run loads every task: no missing task_dep
        rc, ran, out = doit(zoo)
        assert (rc, ran) == (0, set()) and FAST not in out, out


def _run(tmp_path, uptodate, values=None, complete=True, edit=None):
    """One plain run over one task `t` (reads src.txt, writes out.txt): load, `edit` (during the
    run), settle; whether doit was handed the report alone (nothing moved since the last run)."""
    settled.begin("snap.json", {"t": ["out.txt"]})
    handed = settled.whole("env", {"t": "graph"}, {"t": ["out.txt"]}, {"t": ["src.txt"]},
                           {"t": []}, ["code.py"], "db")
    if edit:
        edit()
    settled.settle(["t"], uptodate, values, complete)
    return handed == set()


def _write(path, text, mtime_s):
    with open(path, "w") as f:
        f.write(text)
    os.utime(path, (mtime_s, mtime_s))


def test_the_snapshot_records_files_as_checked_never_as_found_at_the_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("src.txt", "out.txt", "db", "code.py"):
        _write(name, "0", 1000)
    up = {"t"}
    assert not _run(tmp_path, up)                    # no snapshot yet
    assert _run(tmp_path, up) and _run(tmp_path, up)

    # an input edited during a run, after doit checked it: the next run loads in full
    _write("src.txt", "1", 2000)
    assert not _run(tmp_path, up, edit=lambda: _write("src.txt", "2", 2500))
    assert not _run(tmp_path, up)
    assert _run(tmp_path, up)

    # a task that ran counts its file as its action stamped it: an edit after the stamp shows,
    # and the task gets its integrity check
    _write("src.txt", "3", 3000)
    stamps = files_io.stamp_targets(["out.txt"])
    assert not _run(tmp_path, set(), {"t": stamps}, edit=lambda: _write("out.txt", "x", 3500))
    assert settled.begin("snap.json", {"t": ["out.txt"]}) == {"t"}
    assert not _run(tmp_path, up)
    assert _run(tmp_path, up)

    # a run in which the task ran and stamped what it wrote: the next one is a no-op again
    assert _run(tmp_path, set(), {"t": files_io.stamp_targets(["out.txt"])})
    assert _run(tmp_path, up)

    # a task that ran without stamping what it wrote leaves no record, even with nothing edited
    _write("src.txt", "4", 4000)
    assert not _run(tmp_path, set(), {"t": {}})
    assert not _run(tmp_path, up) and _run(tmp_path, up)

    # a run that is not complete (not plain, a failure, a task not reached) writes none
    _write("src.txt", "5", 5000)
    assert not _run(tmp_path, up, complete=False)
    assert not _run(tmp_path, up) and _run(tmp_path, up)

    _write("db", "1", 6000)                          # doit's DB moved
    assert not _run(tmp_path, up) and _run(tmp_path, up)
    _write("code.py", "1", 7000)                     # the tasks' code
    assert not _run(tmp_path, up) and _run(tmp_path, up)


# a small zoo's graph: e1 -> l1, e2 -> l2, both -> report; w names e1 (a task_dep)
GRAPH = {"e1": (["p1"], ["s1"], []), "l1": (["s1", "d"], ["r1"], []), "e2": (["p2"], ["s2"], []),
         "l2": (["s2", "d"], ["r2"], []), "report": (["r1", "r2"], ["rep"], []),
         "w": (["x"], ["wx"], ["e1"])}


def _whole(specs=None):
    settled.begin("snap.json", {})
    specs = specs or {t: "spec" for t in GRAPH}
    return settled.whole("env", specs, {t: g[1] for t, g in GRAPH.items()},
                         {t: g[0] for t, g in GRAPH.items()}, {t: g[2] for t, g in GRAPH.items()},
                         ["code.py"], "db")


def test_a_plain_run_hands_doit_what_moved_and_what_follows_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files = sorted({f for g in GRAPH.values() for f in g[0] + g[1]} | {"code.py", "db"})
    for i, name in enumerate(files):
        _write(name, "0", 1000 + i)

    def settle_all():
        settled.settle(list(GRAPH), set(GRAPH), None, True)

    assert _whole() is None                          # nothing recorded yet: every task
    settle_all()
    assert _whole() == set()                         # a no-op: the report alone
    _write("p2", "1", 2000)                          # a program edited: its emit, lock, the report
    assert _whole() == {"e2", "l2", "report"}
    settle_all()
    _write("s1", "1", 2001)                          # a status edited: its emit (its integrity
    assert _whole() == {"e1", "l1", "report", "w"}   # check) and what follows; what names e1
    settle_all()
    _write("d", "1", 2002)                           # a file both locks read
    assert _whole() == {"l1", "l2", "report"}
    settle_all()
    os.unlink("r2")                                  # a target gone
    assert _whole() == {"l2", "report"}
    settle_all()
    assert _whole({**{t: "spec" for t in GRAPH}, "l1": "other deps"}) == {"l1", "report"}
    settle_all()
    assert _whole() == {"l1", "report"}              # (back to the first entry: changed again)
    settled.settle(list(GRAPH), set(GRAPH) - {"l1"}, {"l1": {}}, True)   # l1 ran, no stamps
    assert _whole() is None
    settle_all()
    ok = set(GRAPH) - {"l2", "report"}
    settled.settle(sorted(ok), ok, None, True, redo={"l2", "report"})
    assert _whole() == {"l2", "report"}              # l2 failed, the report did not run: again
    settle_all()
    assert _whole() == set()
    _write("w", "1", 2003)                           # a file no task reads or writes
    assert _whole() == set()
    settle_all()
    _write("code.py", "1", 2004)                     # the tasks' own code: every task
    assert _whole() is None
    settle_all()
    assert _whole() == set()
    for junk in ('{"version": 3, "verified": {"key": 1, "stats": []}}', "[1, 2", ""):
        with open("snap.json", "w") as f:            # a snapshot no run of this version wrote
            f.write(junk)
        assert _whole() is None


def test_only_a_plain_doit_takes_the_fast_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doit_main = os.path.join(os.sep, "venv", "lib", "doit", "__main__.py")
    for argv, zoo_argv, plain in ((["/venv/bin/doit"], None, True), ([doit_main], None, True),
                                  (["/venv/bin/doit", "-n", "2"], None, False),
                                  (["/venv/bin/doit", "lock:a"], None, False),
                                  (["/venv/bin/doit", "executor=dask:local"], None, False),
                                  (["pytest", "tests"], None, False),
                                  (["/venv/bin/logos", "doit"], [], True),
                                  (["/venv/bin/logos", "doit", "list"], ["list"], False)):
        monkeypatch.setattr(sys, "argv", argv)
        assert fastpath.plain_run(zoo_argv) is plain, argv
    monkeypatch.setattr(sys, "argv", ["/venv/bin/doit"])
    (tmp_path / "pyproject.toml").write_text("[tool.doit]\nverbosity = 2\n")   # options there
    assert not fastpath.plain_run(None)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert fastpath.plain_run(None)
    (tmp_path / "doit.cfg").write_text("[GLOBAL]\n")
    assert not fastpath.plain_run(None)


def _same_stat_edit(path, old, new):
    """Replace `old` by `new` (same length) in `path` and put its mtime back, as `cp -p`,
    `touch -r` or a build's fixed file times would leave it."""
    st = os.stat(path)
    text = open(path).read()
    assert old in text and len(old) == len(new)
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


def test_edits_that_keep_size_and_mtime_are_seen(zoo):
    """Found in review: a code edit with its mtime put back gave a green no-op. The snapshot and
    the target stamps hold each file's ctime, which no write keeps."""
    assert doit(zoo)[0] == 0 and FAST in doit(zoo)[2]
    _same_stat_edit(zoo / "emitter/sambaflow/runtime.py", "v / torch.sqrt", "v * torch.sqrt")
    rc, ran, out = doit(zoo)                         # rmsnorm is now wrong in every bundle
    assert FAST not in out and {"emit:a", "lock:a"} <= ran, out
    assert json.loads((zoo / "build/results/a/float64.json").read_text())["verdict"] == "fail"
    assert rc != 0
    result = zoo / "build/results/a/float32.json"    # a target edited with its mtime put back
    _same_stat_edit(result, '"fail"', '"pass"')
    rc, ran, out = doit(zoo)
    assert "lock:a" in ran and json.loads(result.read_text())["verdict"] == "fail", out


def test_a_standalone_task_writing_what_the_zoo_reads_loads_every_task(zoo):
    """Found in review: a dodo's own standalone task that writes a weight the zoo reads ran alone
    and the report stayed green for a run. Now such a dodo loads every task (doit orders them)."""
    (zoo / "gen").mkdir()
    (zoo / "gen/w.f64").write_bytes((zoo / "weights/a/w.f64").read_bytes())
    with open(zoo / "dodo.py", "a") as f:
        f.write('\nDOIT_CONFIG = {**DOIT_CONFIG, "default_tasks": DOIT_CONFIG["default_tasks"] + ["gen"]}'
                '\n\n\n@standalone\ndef task_gen():\n    return {"actions": ["cp gen/w.f64 weights/a/w.f64"],'
                ' "file_dep": ["gen/w.f64"], "targets": ["weights/a/w.f64"]}\n')
    for _ in range(3):
        rc, ran, out = doit(zoo)
        assert rc == 0, out
    assert FAST not in out
    (zoo / "gen/w.f64").write_bytes(b"\0" * 8)       # the generated weight is now the wrong size
    rc, ran, out = doit(zoo)
    assert rc != 0 and {"gen", "lock:a"} <= ran, out
    assert json.loads((zoo / "build/results/a/float64.json").read_text())["verdict"] == "error"


def test_damaged_snapshots_and_dotted_doit_keys(zoo, tmp_path, monkeypatch):
    assert doit(zoo)[0] == 0 and FAST in doit(zoo)[2]
    snap = zoo / "build/.stamps.json"
    d = json.loads(snap.read_text())
    d["verified"]["redo"] = [["lock:a"]]             # not names: every task, never a crash
    snap.write_text(json.dumps(d))
    rc, ran, out = doit(zoo)
    assert rc == 0 and FAST not in out and "Traceback" not in out, out
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["/venv/bin/doit"])
    (tmp_path / "pyproject.toml").write_text("[tool]\ndoit.commands.run.always = true\n")
    assert not fastpath.plain_run(None)              # doit honours the dotted spelling too
    (tmp_path / "pyproject.toml").write_text("[tool.black]\nline-length = 99\n")
    assert fastpath.plain_run(None)


def test_a_program_edit_that_keeps_size_and_mtime_reruns_its_tasks(zoo):
    """The snapshot saw such an edit and handed doit the program's tasks, but doit's md5 checker
    takes an unchanged mtime for unchanged content: the old bundle and verdict stood for the new
    program. Its states hold the ctime too, which no write keeps."""
    assert doit(zoo)[0] == 0 and FAST in doit(zoo)[2]
    _same_stat_edit(zoo / "programs/b.logos", "to 2.", "to 3.")
    rc, ran, out = doit(zoo)
    assert rc == 0 and {"emit:b", "lock:b"} <= ran and not ran & {"emit:a", "lock:a"}, out
    assert "3.0" in (zoo / "build/bundles/b/model.py").read_text()
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out
    _same_stat_edit(zoo / "programs/a.yaml", "[float64, float32]", "[float32, float64]")   # a config
    rc, ran, out = doit(zoo)
    assert rc == 0 and "emit:a" in ran and not ran & {"emit:b", "lock:b"}, out
