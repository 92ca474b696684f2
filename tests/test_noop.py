"""A no-op over a current zoo: a plain `doit` hands doit only the tasks that are not current by
their keys (`emitter.pipeline.handing`, `keys`), the report alone when nothing moved, so exactly
the tasks that should rerun do. Real doit runs in a temporary copy of a small zoo, and which runs
count as plain checked directly."""

import json
import os
import sys
import time

import test_pipeline
import test_verdicts
from emitter.pipeline import handing
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
    assert rc == 0 and "lock:a" in ran and not ran & {"emit:a", "lock:b"}, out
    assert json.loads(result.read_text())["verdict"] == "pass"

    (zoo / "weights/a/extra.f64").write_bytes(b"\0" * 8)    # a weight file added
    rc, ran, out = doit(zoo)
    assert rc == 0 and "lock:a" in ran and "emit:a" not in ran, out

    (zoo / "programs/c.logos").write_text(PROG_B)     # a new program
    rc, ran, out = doit(zoo)
    assert rc == 0 and {"emit:c", "lock:c", "report"} <= ran and not ran & {"emit:a", "emit:b"}, out

    os.unlink(zoo / "build/.doit.db")                # doit's own DB gone: the keys still hold
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out

    now = time.time() + 5                            # touched, unchanged: one hash, no rerun
    os.utime(zoo / "programs/a.logos", (now, now))
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out
    rc, ran, out = doit(zoo, "-n", "2", "--continue")   # how it runs: the same pre-check
    assert (rc, ran) == (0, set()) and FAST in out, out


def test_a_failing_zoo_hands_doit_what_failed_each_run(zoo):
    (zoo / "programs/b.logos").write_text("Let y be frobnicate of x.\n")   # refused: the report fails
    rc, ran, out = doit(zoo)
    assert rc != 0 and "report" in ran, out
    for _ in range(2):        # a refused program's emit (its refusal said again), lock and the
        rc, ran, out = doit(zoo)   # failing report run again
        assert rc == 1 and ran == {"emit:b", "lock:b", "report"} and "frobnicate" in out, out
    (zoo / "programs/b.logos").write_text(PROG_B)
    rc, ran, out = doit(zoo)
    assert rc == 0 and ran == {"emit:b", "lock:b", "report"}, out
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out


def test_derived_weights_under_the_snapshot(derived_zoo):
    z = derived_zoo                                  # d: weights imported from ckpt/w.bin
    rc, ran, out = doit(z)
    assert rc == 0 and {"weights:d", "lock:d"} <= ran, out
    rc, ran, out = doit(z)
    assert (rc, ran) == (0, set()) and FAST in out, out
    _weights(z / "build/weights/d/w.f64", 7)         # an imported weight edited: imported again,
    rc, ran, out = doit(z)                           # so its verdicts still stand
    assert rc == 0 and "weights:d" in ran and not ran & {"lock:a", "lock:d"}, out
    _weights(z / "ckpt/w.bin", 6)                    # another checkpoint: imported again
    rc, ran, out = doit(z)
    assert rc == 0 and {"weights:d", "lock:d"} <= ran and "lock:a" not in ran, out
    for _ in range(2):
        rc, ran, out = doit(z)
        assert (rc, ran) == (0, set()), out
    assert FAST in out


STANDALONE = '''


def task_notes():
    return {"actions": ["cp notes.txt build/notes.copy"], "file_dep": ["notes.txt"],
            "targets": ["build/notes.copy"]}
'''

NAMES_A_LOCK = '''

def task_after_lock():
    return {"actions": ["touch build/after"], "task_dep": ["lock:a"], "targets": ["build/after"],
            "file_dep": ["notes.txt"]}
'''


def test_a_dodos_own_tasks_run_on_a_plain_doit_and_one_naming_a_lock_keeps_the_full_load(zoo):
    """The README's recipe: a task of the dodo's own, no marker, runs on a plain `doit` beside the
    zoo's (DOIT_CONFIG names no default tasks) and the no-op stays the pre-check's."""
    (zoo / "notes.txt").write_text("one\n")
    with open(zoo / "dodo.py", "a") as f:
        f.write(STANDALONE)
    rc, ran, out = doit(zoo)
    assert rc == 0 and ran == ALL_A_B | {"notes"}, out
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out
    (zoo / "notes.txt").write_text("two\n")          # the dodo's own task is still checked
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, {"notes"}) and FAST not in out, out
    assert "every task of the zoo is current by its key (the dodo's own ran)" in out, out
    assert (zoo / "build/notes.copy").read_text() == "two\n"
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()), out
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out

    with open(zoo / "dodo.py", "a") as f:            # a creator that names a zoo task
        f.write(NAMES_A_LOCK)
    rc, ran, out = doit(zoo, "after_lock")
    assert rc == 0 and ran == {"after_lock"}, out
    for _ in range(2):                               # every run loads every task: no missing task_dep
        rc, ran, out = doit(zoo)
        assert (rc, ran) == (0, set()) and FAST not in out, out


def test_only_a_plain_doit_hands_doit_fewer_tasks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doit_main = os.path.join(os.sep, "venv", "lib", "doit", "__main__.py")
    for argv, plain in ((["/venv/bin/doit"], True), ([doit_main], True),
                        (["/venv/bin/doit", "-n", "2"], True),           # how it runs: plain
                        (["/venv/bin/doit", "-n2", "-v", "2", "--continue"], True),
                        (["/venv/bin/doit", "-n", "2", "lock:a"], False),
                        (["/venv/bin/doit", "-a"], False),               # always: not plain
                        (["/venv/bin/doit", "-s", "lock:a"], False),
                        (["/venv/bin/doit", "lock:a"], False),
                        (["/venv/bin/doit", "cache=file:///c"], True),   # a variable: still plain
                        (["pytest", "tests"], False),
                        (["/venv/bin/logos", "doit"], True),
                        (["/venv/bin/logos", "doit", "list"], False)):
        monkeypatch.setattr(sys, "argv", argv)
        assert handing.plain(handing.doit_args()) is plain, argv
    monkeypatch.setattr(sys, "argv", ["/venv/bin/doit"])
    (tmp_path / "pyproject.toml").write_text("[tool.doit]\nverbosity = 2\n")   # options there
    assert not handing.plain(handing.doit_args())
    (tmp_path / "pyproject.toml").write_text("[tool]\ndoit.commands.run.always = true\n")
    assert not handing.plain(handing.doit_args())    # doit honours the dotted spelling too
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert handing.plain(handing.doit_args())
    (tmp_path / "doit.cfg").write_text("[GLOBAL]\n")
    assert not handing.plain(handing.doit_args())
    assert [handing.is_run(a) for a in ([], ["lock:a"], ["list"], ["-n", "2", "info", "x"])] == \
        [True, True, False, False]


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
    """Found in review: a code edit with its mtime put back gave a green no-op. The keys hold each
    file's fingerprint, whose stat cache holds the ctime, which no write keeps."""
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


def test_a_dodos_task_writing_what_the_zoo_reads_loads_every_task(zoo):
    """Found in review: a dodo's own task that writes a weight the zoo reads ran alone
    and the report stayed green for a run. Now such a dodo loads every task (doit orders them)."""
    (zoo / "gen").mkdir()
    (zoo / "gen/w.f64").write_bytes((zoo / "weights/a/w.f64").read_bytes())
    with open(zoo / "dodo.py", "a") as f:
        f.write('\n\n\ndef task_gen():\n    return {"actions": ["cp gen/w.f64 weights/a/w.f64"],'
                ' "file_dep": ["gen/w.f64"], "targets": ["weights/a/w.f64"]}\n')
    for _ in range(3):
        rc, ran, out = doit(zoo)
        assert rc == 0, out
    assert FAST not in out
    (zoo / "gen/w.f64").write_bytes(b"\0" * 8)       # the generated weight is now the wrong size
    rc, ran, out = doit(zoo)
    assert rc != 0 and {"gen", "lock:a"} <= ran, out
    assert json.loads((zoo / "build/results/a/float64.json").read_text())["verdict"] == "error"


def test_a_program_edit_that_keeps_size_and_mtime_reruns_its_tasks(zoo):
    """doit's md5 checker took an unchanged mtime for unchanged content: the old bundle and verdict
    stood for the new program. The emit's key holds the program's fingerprint (the ctime moves
    with any write)."""
    assert doit(zoo)[0] == 0 and FAST in doit(zoo)[2]
    _same_stat_edit(zoo / "programs/b.logos", "to 2.", "to 3.")
    rc, ran, out = doit(zoo)
    assert rc == 0 and {"emit:b", "lock:b"} <= ran and not ran & {"emit:a", "lock:a"}, out
    assert "3.0" in (zoo / "build/bundles/b/model.py").read_text()
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()) and FAST in out, out
    _same_stat_edit(zoo / "programs/a.yaml", "[float64, float32]", "[float64,bfloat16]")   # a config
    rc, ran, out = doit(zoo)
    assert rc == 0 and "emit:a" in ran and not ran & {"emit:b", "lock:b"}, out


NOOP_IMPORTS = """
import runpy, sys
sys.argv = ["doit"]
try:
    runpy.run_module("doit", run_name="__main__")
except SystemExit as e:
    code = e.code
print("\\nIMPORTED", code, sorted(m for m in ("numpy", "torch", "yaml", "distributed") if m in sys.modules))
"""


def test_a_noop_loads_neither_numpy_nor_torch(zoo):
    """A run that locks nothing pays for none of the lock's libraries: every task creator (the
    lock's among them) and the currency checks stay in the standard library (numpy alone costs a
    1000-program no-op a quarter more)."""
    import subprocess
    assert doit(zoo)[0] == 0
    p = subprocess.run([sys.executable, "-c", NOOP_IMPORTS], cwd=zoo, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(zoo)})
    assert p.stdout.strip().splitlines()[-1] == "IMPORTED 0 []", p.stdout + p.stderr
