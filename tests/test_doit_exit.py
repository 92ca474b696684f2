"""doit as Make's and CI's users read it: a run whose checks do not all pass exits non-zero and
says which, whether or not it runs the report; the terminal's last line counts the verdicts and
points at the report; failures are one line each (no empty block of doit's); the progress line
never counts past its total; a cache URL with no location is refused in one line; `doit dumpdb`
reads the zoo's sqlite3 DB. Real doit runs in a copy of a small zoo."""

import os
import json
import re
import subprocess
import sys

import test_pipeline
from conftest import ROOT, logos
from test_pipeline import doit


def last_line(cwd, *args, env=None):
    """doit's exit code and the last line it printed on stdout."""
    e = {**os.environ, "LOGOS_PROGRESS": "names", **(env or {})}
    p = subprocess.run([sys.executable, "-m", "doit", *args], cwd=cwd, capture_output=True,
                       text=True, env=e, timeout=300)
    return p.returncode, (p.stdout.rstrip().splitlines() or [""])[-1]

zoo = test_pipeline.zoo   # programs a (weights, float64 and float32) and b

EXACT_F32 = "dtypes: [float64, float32]\ntolerances:\n  float32: {abs: 0.0, rel: 0.0}\n"


def test_a_named_lock_whose_check_fails_exits_1_on_every_run(zoo):
    (zoo / "programs/a.yaml").write_text(EXACT_F32)   # float32 held to float64's exact figures
    for _ in range(2):   # the failing check runs again; the passing one is kept
        rc, ran, out = doit(zoo, "lock:a")
        assert rc == 1 and "lock:a" in ran, out
        assert "lock:a [float32] FAIL" in out, out
        assert "2 checks: 1 pass, 1 fail (a float32) · build/results/ (`logos results`)" \
            in out.splitlines(), out
        assert "<stdout>" not in out and "TaskFailed" not in out and "#####" not in out, out
    assert last_line(zoo, "lock:a")[1].startswith("2 checks: 1 pass, 1 fail")   # the run's last word
    (zoo / "programs/a.yaml").write_text("dtypes: [float64, float32]\n")
    rc, ran, out = doit(zoo, "lock:a")
    assert rc == 0 and "2 checks: 2 pass · build/results/ (`logos results`)" in out.splitlines(), out


def test_a_plain_run_with_a_failing_check_exits_1_and_its_report_says_which(zoo):
    (zoo / "programs/a.yaml").write_text(EXACT_F32)
    for _ in range(2):
        rc, ran, out = doit(zoo)
        assert rc == 1 and {"lock:a", "report"} <= ran, out
        assert "a[float32]=fail" in out, out     # the report's own failure, one line
        assert "4 checks: 3 pass, 1 fail (a float32) · build/report.html" in out.splitlines(), out
        assert "<stdout>" not in out and "#####" not in out, out


def test_a_refused_program_fails_a_named_lock_every_run(zoo):
    (zoo / "programs/b.logos").write_text("Let y be frobnicate of x.\n")
    for _ in range(2):
        rc, ran, out = doit(zoo, "lock:b")
        assert rc == 1 and "lock:b" in ran, out
        assert "2 checks: 2 error (b float32, b float64) · build/results/ (`logos results`)" in out.splitlines(), out


AFTER = '''

def task_deploy():
    return {"actions": ["touch build/deployed"], "task_dep": [%r], "targets": ["build/deployed"]}
'''


def test_a_dodos_task_that_waits_for_a_lock_never_runs_on_a_check_that_did_not_pass(zoo):
    """A task of the dodo's own scripted after `lock:a` (or the `lock` group) runs after a passing
    lock and never after a failing one, whether or not the report follows; the report still
    covers every check, and the run fails."""
    for dep in ("lock:a", "lock"):
        (zoo / "programs/a.yaml").write_text("dtypes: [float64, float32]\n")
        dodo = (zoo / "dodo.py").read_text()
        (zoo / "dodo.py").write_text(dodo + AFTER % dep)
        rc, ran, out = doit(zoo)
        assert rc == 0 and "deploy" in ran and (zoo / "build/deployed").exists(), out
        (zoo / "build/deployed").unlink()
        (zoo / "programs/a.yaml").write_text(EXACT_F32)
        for args in ((), ("deploy",), ("deploy", "report")):
            rc, ran, out = doit(zoo, *args)
            assert rc == 2 and "lock:a" in ran and "deploy" not in ran, (args, out)
            assert not (zoo / "build/deployed").exists(), (args, out)
            assert "lock:a [float32] FAIL" in out, out
        report = json.loads((zoo / "build/report.json").read_text())   # the last run's, whole
        verdicts = {(r["name"], r["check"]): r["verdict"] for r in report["results"]}
        assert verdicts[("a", "float32")] == "fail" and verdicts[("a", "float64")] == "pass", verdicts
        assert verdicts[("b", "float64")] == "pass" and verdicts[("deploy", "task")] == "error", verdicts
        (zoo / "dodo.py").write_text(dodo)
    rc, ran, out = doit(zoo)   # no task of the dodo's waits for it: the report fails the run
    assert rc == 1 and {"lock:a", "report"} <= ran and "a[float32]=fail" in out, out


def test_a_dodos_task_after_the_cache_never_runs_on_a_failed_check_and_the_cache_publishes(zoo, tmp_path):
    """`cache` (cache=URL) waits for the locks: a task of the dodo's own after it does not run
    after a failing check, and the verdicts are published at the run's end all the same."""
    assert doit(zoo)[0] == 0   # every verdict there before the cache is named
    (zoo / "dodo.py").write_text((zoo / "dodo.py").read_text() + AFTER % "cache")
    (zoo / "programs/a.yaml").write_text(EXACT_F32)
    url, env = (tmp_path / "cache").as_uri(), {"LOGOS_CACHE_KEY": "k"}
    rc, ran, out = doit(zoo, f"cache={url}", env=env)
    assert rc == 2 and "deploy" not in ran and not (zoo / "build/deployed").exists(), out
    assert ran == {"lock:a"} and "cache failed" not in (zoo / "build/summary.md").read_text(), out
    # the lock's fresh fail went to the cache as it ran; the 3 verdicts it kept, at the run's end
    assert "cache: published 3 verdict(s)" in out and len(list((tmp_path / "cache").rglob("*.json"))) == 4, out


def test_a_dodos_task_set_up_by_a_lock_leaves_the_run_as_it_was(zoo):
    """doit runs a task whose `setup` task failed: a lock set up for one is no dependency, so the
    run is as without it (the report task runs and fails the run, exit 1)."""
    (zoo / "dodo.py").write_text((zoo / "dodo.py").read_text() +
                                 AFTER.replace('"task_dep"', '"setup"') % "lock:a")
    (zoo / "programs/a.yaml").write_text(EXACT_F32)
    rc, ran, out = doit(zoo)
    assert rc == 1 and {"lock:a", "report"} <= ran and "a[float32]=fail" in out, out


def test_a_dodos_task_that_waits_for_an_emit_never_runs_on_a_refused_program(zoo):
    (zoo / "dodo.py").write_text((zoo / "dodo.py").read_text() + AFTER % "emit:b")
    (zoo / "programs/b.logos").write_text("Let y be frobnicate of x.\n")
    rc, ran, out = doit(zoo)
    assert rc == 2 and "emit:b" in ran and "deploy" not in ran, out
    assert not (zoo / "build/deployed").exists() and out.count("frobnicate") == 1, out
    rows = {(r["name"], r["check"]): r for r in json.loads((zoo / "build/report.json").read_text())["results"]}
    assert rows[("b", "float64")]["verdict"] == "error" and "frobnicate" in rows[("b", "float64")]["reason"], rows
    assert rows[("a", "float32")]["verdict"] == "pass", rows


def test_the_progress_line_never_counts_past_its_total(zoo):
    rc, ran, out = doit(zoo, "lock:a", env={"LOGOS_PROGRESS": "line"})
    assert rc == 0, out
    counts = [tuple(map(int, m)) for m in re.findall(r"^\[(\d+)/(\d+)\]", out, re.M)]
    assert counts and all(done <= total for done, total in counts), out
    assert counts[-1][0] == counts[-1][1], out
    assert not re.search(r"ETA -", out), out


def test_a_progress_setting_that_is_none_is_said_and_taken_as_auto(zoo):
    rc, ran, out = doit(zoo, "lock:a", env={"LOGOS_PROGRESS": "bogus"})
    assert rc == 0 and out.count("LOGOS_PROGRESS='bogus' is none of line, names, auto: auto") == 1, out


def test_a_cache_url_that_names_no_location_is_refused_in_one_line(zoo):
    for url in ("file://", "s3://", "::"):
        rc, ran, out = doit(zoo, f"cache={url}", env={"LOGOS_CACHE_KEY": "k"})
        assert rc == 3 and not ran, out
        assert f"doit: refused: cache={url}: names no location" in out, out
        assert "Traceback" not in out, out
    assert not any(p.name.startswith(":") for p in zoo.iterdir())


def test_doit_dumpdb_reads_the_zoos_sqlite_db(zoo):
    assert doit(zoo)[0] == 0
    p = subprocess.run([sys.executable, "-m", "doit", "dumpdb"], cwd=zoo, capture_output=True,
                       text=True, timeout=120)   # (the package's doit.COMMAND plugin)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "DB type is 'sqlite3'" in p.stdout and "Traceback" not in p.stderr
    assert re.search(r"^report -> ", p.stdout, re.M), p.stdout


def test_a_weights_file_no_leaf_claims_is_a_warning_on_the_terminal_and_in_the_report(zoo):
    (zoo / "weights/a/b1_old.f64").write_bytes(b"\0" * 8)
    rc, ran, out = doit(zoo)
    assert rc == 0 and "lock:a" in ran, out
    assert "lock:a warning: weights/a: `b1_old.f64` matches no leaf of the program (ignored)" in out, out
    summary = (zoo / "build/summary.md").read_text()
    assert "### Warnings" in summary and "a: weights file 'b1_old.f64' matches no leaf" in summary
    page = (zoo / "build/report.html").read_text()
    assert "<h2>Warnings</h2>" in page and "<code>b1_old.f64</code> matches no leaf" in page


def test_under_github_actions_each_check_that_did_not_pass_is_an_error_annotation(zoo):
    (zoo / "programs/a.yaml").write_text(EXACT_F32)
    (zoo / "programs/b.logos").write_text("Let x be a 1 by 3 tensor of Real.\nLet y be frobnicate of x.\n")
    for args in ((), ("lock:a", "lock:b")):   # the report's rows, or the named locks' results
        rc, ran, out = doit(zoo, *args, env={"GITHUB_ACTIONS": "true"})
        assert rc == 1, out
        notes = [ln for ln in out.splitlines() if ln.startswith("::error ")]
        assert any(ln.startswith("::error file=programs/a.logos,line=5::a float32 FAIL: ") for ln in notes), out
        assert any(ln.startswith("::error file=programs/b.logos,line=2::b float64 ERROR: ") for ln in notes), out
        assert len(notes) == 3, notes          # a float32, b float32, b float64
    rc, ran, out = doit(zoo)                  # elsewhere: no annotations
    assert "::error" not in out
    # a zoo in a folder of the workspace: each file as GitHub names it, from the workspace
    rc, ran, out = doit(zoo, env={"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(zoo.parent)})
    assert f"::error file={zoo.name}/programs/b.logos,line=2::b float64 ERROR: " in out, out


def test_doits_verbosity_sets_what_the_pipeline_logs(zoo):
    (zoo / "programs/gone.yaml").write_text("dtypes: [float64]\n")   # a config with no program
    warn = "warning: programs/gone.yaml: a config with no program beside it"
    debug = "2 programs, 4 checks;"
    rc, _, out = doit(zoo)
    assert rc == 0 and warn in out and debug not in out, out
    rc, _, out = doit(zoo, "--verbosity", "2")
    assert rc == 0 and warn in out and f"{debug} 0 task(s) not current by their keys" in out, out
    rc, _, out = doit(zoo, "-v", "0")
    assert rc == 0 and warn in out and debug not in out, out
    rc, _, out = doit(zoo)
    assert rc == 0 and "nothing moved since the last run" in out, out   # information, at -v 1


def _file_size_limit(limit):
    """A child's file size limit (RLIMIT_FSIZE, SIGXFSZ ignored): a write past `limit` bytes fails
    with EFBIG, as a write to a full disk fails with ENOSPC."""
    import resource
    import signal

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limited


def test_a_run_that_cannot_write_says_so_in_lines_and_leaves_no_report_that_passes(zoo):
    """Writes that fail mid-run (the bundle, the history, the report, doit's DB): one line each,
    no traceback, exit 3 (doit's DB); the last complete report stays aside in build/stale/ (not
    current) and the run's last line says there is no report of this run; `logos results` says
    the edited program's verdicts are not current. The next run with room writes everything."""
    assert doit(zoo)[0] == 0
    with open(zoo / "programs/a.logos", "a") as f:
        f.write("# edited\n")
    p = subprocess.run([sys.executable, "-m", "doit"], cwd=zoo, capture_output=True, text=True,
                       env={**os.environ, "LOGOS_PROGRESS": "names"}, timeout=300,
                       preexec_fn=_file_size_limit(4096))
    out = p.stdout + p.stderr
    assert p.returncode == 3 and "Traceback" not in out, out   # (3: doit's DB was not written)
    assert "doit: build/.doit.db could not be written (" in out, out
    assert "FAILED emit:a: TaskError: OSError: [Errno 27] File too large" in out, out
    assert "report: could not be written: [Errno 27] File too large" in out, out
    assert p.stdout.rstrip().splitlines()[-1] == (
        "no report of this run (it could not be written): build/stale/ keeps the last complete "
        "run's, which is not current; `logos results` says each check's verdict and whether it is "
        "current"), out
    assert not (zoo / "build/report.json").exists() and (zoo / "build/stale/report.json").is_file()
    r = logos("results", cwd=zoo)
    assert r.returncode == 1 and "2 not current" in r.stdout, r.stdout + r.stderr
    rc, ran, out = doit(zoo)
    assert rc == 0 and {"emit:a", "lock:a", "report"} <= ran and "Traceback" not in out, out
    assert (zoo / "build/report.json").is_file() and not (zoo / "build/stale/report.json").exists()
    assert logos("results", cwd=zoo).returncode == 0


OWN_TASK = """

def _gen():
    import os
    with open("out.txt", "w") as f:
        if os.path.exists("fail"):
            raise RuntimeError("gen fails")
        f.write("good")


def task_gen():
    return {"actions": [_gen], "file_dep": ["src.txt"], "targets": ["out.txt"]}
"""


def test_a_dodos_own_task_that_failed_in_a_run_whose_db_was_not_written_runs_again(zoo):
    """doit could not delete the failed task's earlier success from its DB (a full disk): the DB
    is removed, so the next run runs the task again instead of finding it current."""
    with open(zoo / "dodo.py", "a") as f:
        f.write(OWN_TASK)
    (zoo / "src.txt").write_text("x")
    rc, ran, out = doit(zoo)
    assert rc == 0 and "gen" in ran and (zoo / "out.txt").read_text() == "good", out
    (zoo / "fail").write_text("")
    os.unlink(zoo / "out.txt")
    p = subprocess.run([sys.executable, "-m", "doit"], cwd=zoo, capture_output=True, text=True,
                       env={**os.environ, "LOGOS_PROGRESS": "names"}, timeout=300,
                       preexec_fn=_file_size_limit(4096))
    out = p.stdout + p.stderr
    assert p.returncode == 3 and "FAILED gen" in out and "Traceback" not in out, out
    assert "doit: build/.doit.db could not be written (" in out and not (zoo / "build/.doit.db").exists(), out
    os.unlink(zoo / "fail")
    rc, ran, out = doit(zoo)
    assert rc == 0 and "gen" in ran and (zoo / "out.txt").read_text() == "good", out
    assert not {"lock:a", "lock:b"} & ran, out   # (the zoo's, current by their keys)


DB_WRITE = """
import sys
from doit.dependency import Dependency, SqliteDB
from emitter.pipeline.doit_db import said_when_unwritable
dep = Dependency(SqliteDB, sys.argv[1])
said_when_unwritable(dep)
for i in range(200):
    dep._set(f"task{i}", "value", "x" * 1000)
dep.remove("task0")
dep.close()
print("went on")
"""


def test_doits_db_that_cannot_be_written_is_one_line_said_once(tmp_path):
    p = subprocess.run([sys.executable, "-c", DB_WRITE, str(tmp_path / "d.db")], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, preexec_fn=_file_size_limit(64 * 1024))
    assert p.returncode == 0 and p.stdout == "went on\n", p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"doit: {tmp_path / 'd.db'} could not be written ("), p.stderr
    assert lines[0].endswith("): removed, so the next run checks every task again (the zoo's "
                             "find what is current by their keys)"), p.stderr
    assert not os.path.exists(tmp_path / "d.db") and not os.path.exists(tmp_path / "d.db-journal")
    p = subprocess.run([sys.executable, "-c", DB_WRITE, str(tmp_path / "e.db")], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)   # with room: nothing said
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_doit_dumpdb_hands_another_projects_dumb_dbm_to_doits_own_command(tmp_path):
    # the package's plugin replaces `doit dumpdb` in its environment: a plain project's DB kept by
    # dbm.dumb (files .doit.db.dat and .dir, none named .doit.db) must still dump as doit's does
    import dbm.dumb
    with dbm.dumb.open(str(tmp_path / ".doit.db"), "c") as db:
        db["hi"] = json.dumps({"_values_:": {}})
    assert not (tmp_path / ".doit.db").exists()
    p = subprocess.run([sys.executable, "-m", "doit", "dumpdb"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "DBM type is 'dbm.dumb'" in p.stdout, p.stdout + p.stderr
    assert re.search(r"^b?'?hi'? -> \{", p.stdout, re.M), p.stdout
