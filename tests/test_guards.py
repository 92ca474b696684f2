"""guards: build/'s lock never outlives its run (a killed run's forked workers end with it and never
held the lock), a second live run is still refused, and a damaged doit DB is set aside instead of
ending every run in doit's traceback. Real processes: doit over a tiny zoo in a temporary folder,
and small Python processes that take the lock, fork and are killed."""

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from test_pipeline import FAKE_IMPORTER, PROG_B, doit, make_zoo, zoo  # noqa: F401  (zoo: the fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="/proc and PR_SET_PDEATHSIG are Linux's")
B = {"emit:b", "lock:b", "report"}          # the program's tasks (beside the zoo-wide ones)


def _state(pid):
    """The process's state letter from /proc (Z: a zombie), None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def _alive(pid):
    return _state(pid) not in (None, "Z")


def _children(pid):
    """The pids of `pid`'s children, from /proc."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if len(fields) > 1 and fields[1] == str(pid):
                kids.append(int(entry))
    return kids


def _gone(pids, seconds=60):
    """Wait (up to `seconds`) for every one of `pids` to end; whether they all did."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return not any(_alive(p) for p in pids)


def _end(pids):
    """Kill what a failed test left running (only the pids it was handed)."""
    for p in pids:
        if _alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _python(cwd, code, **kw):
    """A Python process running `code` in `cwd`, with this checkout's emitter importable."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.Popen([sys.executable, "-u", "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _killed_run(cwd, code):
    """Run `code`, which prints the pids it forked on one line and SIGKILLs itself; those pids.
    Its children may keep its stdout open: read the line, not to the end; stderr goes to a file."""
    with open(os.path.join(cwd, "stderr.txt"), "w+") as err:
        p = subprocess.Popen([sys.executable, "-u", "-c", textwrap.dedent(code)], cwd=cwd,
                             env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
                             stderr=err, text=True)
        line = p.stdout.readline()
        p.wait(timeout=120)
        p.stdout.close()
        err.seek(0)
        assert p.returncode == -signal.SIGKILL and line.strip(), (p.returncode, line, err.read())
    return [int(x) for x in line.split()]


def _take_lock(cwd):
    """(exit code, stderr) of a process that takes build/'s lock the way a run does."""
    p = _python(cwd, "from emitter.pipeline import guards\n"
                     "guards.exclusive('build')\nprint('held')")
    out, err = p.communicate(timeout=120)
    assert p.returncode != 0 or out.strip() == "held", (out, err)
    return p.returncode, err


# 1. a killed run: its workers end with it, and the next run is not refused

@linux
def test_a_killed_parallel_run_takes_its_workers_along_and_the_next_run_goes_on(zoo):
    """`doit -n 2` SIGKILLed mid-run: its worker processes end too (they would go on writing under
    build/), and the next run takes build/ (the workers once inherited the lock: every later run
    was refused, naming the dead run)."""
    p = subprocess.Popen([sys.executable, "-u", "-m", "doit", "-n", "2"], cwd=zoo,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "LOGOS_PROGRESS": "names"})
    seen = []
    for line in p.stdout:                 # a worker has started a task: the workers are running
        seen.append(line)
        if line.startswith(".  "):
            break
    workers = _children(p.pid)
    p.kill()
    p.wait()
    p.stdout.close()
    try:
        assert workers, seen
        assert _gone(workers), [(w, _state(w)) for w in workers]
    finally:
        _end(workers)
    rc, ran, out = doit(zoo)
    assert rc == 0 and "refused" not in out and "report" in ran, out
    rc, ran, out = doit(zoo)
    assert (rc, ran) == (0, set()), out


# the test importer's arguments, and a main that says its pid, then takes its time
SLOW_IMPORTER = FAKE_IMPORTER.split("def main")[0].replace("import os, shutil", "import os, time") + \
    """def main(args):
    with open(os.path.join(os.path.dirname(args.checkpoint), "importer.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)
    return 0
"""


def _slow_zoo(tmp_path, more=None):
    """A zoo whose program `d` derives its weights through an importer that sleeps (its pid in
    ckpt/importer.pid), beside `more` programs."""
    from test_pipeline import PROG_A
    z = make_zoo(tmp_path / "zoo", {"d": (PROG_A, "derive:\n  importer: slow\n  checkpoint: ckpt/w.bin\n"),
                                    **(more or {})})
    (z / "emitter/importers/slow.py").write_text(SLOW_IMPORTER)
    with open(z / "emitter/importers/__init__.py", "a") as f:
        f.write('\nIMPORTERS["slow"] = ("emitter.importers.slow", "test importer")\n')
    (z / "ckpt").mkdir()
    (z / "ckpt/w.bin").write_bytes(bytes(128))
    return z


def _importer(z):
    """The slow importer's pid, once it runs (up to 2 minutes)."""
    pid_file, end = z / "ckpt/importer.pid", time.monotonic() + 120
    while time.monotonic() < end and not (pid_file.exists() and pid_file.read_text()):
        time.sleep(0.1)
    return int(pid_file.read_text())


@linux
@pytest.mark.parametrize("jobs", [[], ["-n", "2"]])
def test_a_killed_run_takes_its_import_along(tmp_path, jobs):
    """An import is a program the run starts (`python -m emitter.importers …`), not a fork: SIGKILL
    the run, inline or with workers, and the import ends too, rather than going on writing under
    build/tmp after the run is gone (and past the next run's sweep)."""
    z = _slow_zoo(tmp_path)
    p = subprocess.Popen([sys.executable, "-m", "doit", *jobs], cwd=z, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    importer = None
    try:
        importer = _importer(z)
        assert _alive(importer)
        p.kill()
        p.wait()
        assert _gone([importer], 30), _state(importer)
    finally:
        _end([importer] if importer else [])
        if p.poll() is None:
            p.kill()


@linux
def test_a_killed_worker_stops_the_run_it_would_hang(tmp_path):
    """doit's `-n` runner waits for each worker's result forever: a worker killed under it (the OOM
    killer) hung the run, holding build/'s lock. The run now says which worker died and how, and
    stops as an interrupt does (exit 1, the last complete report marked stale); the next run goes on."""
    z = _slow_zoo(tmp_path, {"b": (PROG_B, None)})
    p = subprocess.Popen([sys.executable, "-m", "doit", "-n", "2"], cwd=z, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    importer = None
    try:
        importer = _importer(z)
        with open(f"/proc/{importer}/stat") as f:
            worker = int(f.read().rpartition(")")[2].split()[1])   # the importer's parent
        assert worker != p.pid
        os.kill(worker, signal.SIGKILL)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 1, out + err
        assert f"doit: stopped: a doit worker process (pid {worker}) was killed by SIGKILL" in err, err
        assert "; the tasks running then: " in err and "weights:d" in err.partition("running then")[2], err
        assert _gone([importer], 30) and (z / "build/stale").exists()
    finally:
        _end([importer] if importer else [])
        if p.poll() is None:
            p.kill()
    (z / "emitter/importers/slow.py").write_text(FAKE_IMPORTER)
    rc, ran, out = doit(z)
    assert rc == 0 and "weights:d" in ran, out


@linux
def test_a_forked_child_that_outlives_its_run_does_not_hold_the_lock(tmp_path):
    """The lock is this process's own: a child it forked (one that clears its death signal and so
    outlives the run) does not keep build/ locked once the run is killed."""
    code = """
        import ctypes, os, signal, time
        from emitter.pipeline import guards
        guards.exclusive("build")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)      # PR_SET_PDEATHSIG off: it outlives the run
            os.write(w, b"x")
            time.sleep(300)
            os._exit(0)
        os.read(r, 1)
        print(pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    [child] = _killed_run(tmp_path, code)
    try:
        assert _alive(child)
        rc, err = _take_lock(tmp_path)
        assert rc == 0, err
    finally:
        _end([child])


@linux
def test_the_processes_a_run_forks_end_when_it_is_killed(tmp_path):
    """After `exclusive`, a child forked by hand, a multiprocessing (fork) worker like doit's, and
    a child of that worker all end when the run is SIGKILLed."""
    code = """
        import multiprocessing, os, signal, time
        from emitter.pipeline import guards
        guards.exclusive("build")

        def work(q):
            pid = os.fork()
            if pid == 0:
                time.sleep(300)
                os._exit(0)
            q.put((os.getpid(), pid))
            time.sleep(300)

        pid = os.fork()
        if pid == 0:
            time.sleep(300)
            os._exit(0)
        q = multiprocessing.get_context("fork").Queue()
        multiprocessing.get_context("fork").Process(target=work, args=(q,)).start()
        worker, grandchild = q.get(timeout=60)
        print(pid, worker, grandchild, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    pids = _killed_run(tmp_path, code)
    try:
        assert len(pids) == 3, pids
        assert _gone(pids), [(x, _state(x)) for x in pids]
    finally:
        _end(pids)


@linux
def test_a_child_whose_parent_died_before_it_was_bound_ends_itself(tmp_path):
    """The race: the death signal is set in the child after the fork; a parent that died before
    then sends none, so the child looks at its parent after setting it, and ends."""
    code = """
        import os, signal, time
        from emitter.pipeline import guards
        r, w = os.pipe()

        def hold():      # runs in the child before guards' hook: wait until the parent is dead
            os.close(w)
            os.read(r, 1)

        os.register_at_fork(after_in_child=hold)
        guards.exclusive("build")
        pid = os.fork()
        if pid == 0:
            time.sleep(300)
            os._exit(0)
        print(pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    [child] = _killed_run(tmp_path, code)
    try:
        assert _gone([child]), _state(child)
    finally:
        _end([child])


@linux
def test_a_child_forked_from_another_thread_outlives_that_thread(tmp_path):
    """The kernel signals a child when the *thread* that forked it ends: a child forked from a
    passing thread is left unbound, else it would die with that thread while the run goes on."""
    code = """
        import os, threading, time
        from emitter.pipeline import guards
        guards.exclusive("build")
        pids = []

        def fork():
            pid = os.fork()
            if pid == 0:
                time.sleep(300)
                os._exit(0)
            pids.append(pid)

        t = threading.Thread(target=fork)
        t.start()
        t.join()
        time.sleep(1)
        print(pids[0], os.waitpid(pids[0], os.WNOHANG)[0] == 0, flush=True)
        os.kill(pids[0], 9)
        """
    p = _python(tmp_path, code)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    child, running = out.split()
    _end([int(child)])
    assert running == "True", out


# the refusal of a second live run is kept

def _refused_while_held(tmp_path, code):
    """While a process running `code` holds the lock (it prints "held", then waits for its stdin
    to close), a second run is refused with exit 3, naming that process."""
    holder = _python(tmp_path, code, stdin=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "held"
        rc, err = _take_lock(tmp_path)
        assert rc == 3, err
        assert f"doit: refused: another doit run (pid {holder.pid}) is using build/" in err, err
    finally:
        holder.communicate(input="", timeout=60)


def test_a_second_live_run_is_refused_naming_the_first(tmp_path):
    _refused_while_held(tmp_path, """
        import sys
        from emitter.pipeline import guards
        guards.exclusive("build")
        print("held", flush=True)
        sys.stdin.read()
        """)
    rc, err = _take_lock(tmp_path)               # it ended: the lock is free
    assert rc == 0, err


def test_a_run_that_has_only_just_taken_the_lock_is_waited_for_and_named(tmp_path):
    """The holder takes the lock, then writes its pid: meanwhile the file names the run before it,
    which is dead. The second run does not take that name for the holder's: it waits for the
    holder's pid and is refused naming it."""
    (tmp_path / "build").mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "build/.doit.lock").write_text(str(dead.pid))
    _refused_while_held(tmp_path, """
        import fcntl, os, sys, time
        fd = os.open("build/.doit.lock", os.O_RDWR)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("held", flush=True)
        time.sleep(0.5)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        sys.stdin.read()
        """)


# 2. a damaged dependency DB

def _garbage(data):
    return os.urandom(len(data))


def _truncated(data):
    return data[:len(data) // 3]


def _broken_page(data):          # a page of the doit table: doit opens it and fails mid-run
    return data[:4096] + os.urandom(4096) + data[8192:]


@pytest.mark.parametrize("damage", [_garbage, _truncated, _broken_page])
def test_a_damaged_doit_db_is_set_aside_and_the_run_goes_on(tmp_path, damage):
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    rc, ran, out = doit(z)
    assert rc == 0 and B <= ran, out
    db = z / "build/.doit.db"
    damaged = damage(db.read_bytes())
    db.write_bytes(damaged)
    rc, ran, out = doit(z)
    assert rc == 0 and "Traceback" not in out, out
    line = next((x for x in out.splitlines()
                 if x.startswith("doit: build/.doit.db was damaged")), "")
    assert line.endswith("): set aside as build/.doit.db.damaged; doit makes a new one "
                         "(what is current is decided by each task's key)"), out
    assert "(" in line and line.index("(") < line.rindex(")"), line      # the reason, in brackets
    assert (z / "build/.doit.db.damaged").read_bytes() == damaged
    assert db.is_file() and sqlite3.connect(db).execute("PRAGMA quick_check").fetchall() == \
        [("ok",)]                                                        # doit made a new one
    rc, ran, out = doit(z)
    assert (rc, ran) == (0, set()) and "damaged" not in out, out

    again = os.urandom(db.stat().st_size)                                # damaged once more:
    db.write_bytes(again)                                                # the older copy replaced
    rc, ran, out = doit(z)
    assert rc == 0 and "set aside as build/.doit.db.damaged" in out, out
    assert (z / "build/.doit.db.damaged").read_bytes() == again


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_doit_db_that_is_no_file_is_set_aside_and_the_run_goes_on(tmp_path, kind):
    """A folder (or a FIFO) where doit's DB belongs: one line, set aside, the run goes on."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    rc, ran, out = doit(z)
    assert rc == 0 and B <= ran, out
    db = z / "build/.doit.db"
    db.unlink()
    db.mkdir() if kind == "folder" else os.mkfifo(db)
    rc, ran, out = doit(z)
    assert rc == 0 and "Traceback" not in out, out
    assert "doit: build/.doit.db was damaged (it is not a regular file): set aside as " \
           "build/.doit.db.damaged; doit makes a new one" in out, out
    assert db.is_file() and (z / "build/.doit.db.damaged").exists()
    rc, ran, out = doit(z)
    assert (rc, ran) == (0, set()) and "damaged" not in out, out


def _good_db(path):
    con = sqlite3.connect(path)
    con.execute("create table doit (task_id text not null primary key, task_data json)")
    con.executemany("insert into doit values (?, ?)",
                    [(f"lock:p{i}", '{"x": "%s"}' % ("y" * 500)) for i in range(200)])
    con.commit()
    con.close()


def _check(path, capsys):
    from emitter.pipeline import guards
    guards.check_db(str(path))
    return capsys.readouterr().err


def test_check_db_leaves_a_good_a_missing_and_a_busy_db_alone(tmp_path, capsys):
    db = tmp_path / ".doit.db"
    assert _check(db, capsys) == "" and not db.exists()                 # none: nothing made

    _good_db(db)
    before = os.stat(db)
    assert _check(db, capsys) == ""
    after = os.stat(db)                  # not even touched: the settled snapshot stats this file
    assert (after.st_mtime_ns, after.st_ctime_ns, after.st_size, after.st_ino) == \
           (before.st_mtime_ns, before.st_ctime_ns, before.st_size, before.st_ino)

    other = sqlite3.connect(db, isolation_level=None)   # someone else holds it: not damage
    other.execute("BEGIN EXCLUSIVE")
    try:
        assert _check(db, capsys) == ""
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert db.exists() and not (tmp_path / ".doit.db.damaged").exists()

    (tmp_path / ".doit.db").write_bytes(b"")           # an empty file is an empty DB to sqlite
    assert _check(db, capsys) == "" and db.exists()


def test_check_db_takes_a_damaged_dbs_journal_along(tmp_path, capsys):
    """A journal left beside the damaged DB would be rolled back into the new one."""
    db = tmp_path / ".doit.db"
    _good_db(db)
    db.write_bytes(_broken_page(db.read_bytes()))
    journal = bytes(4096)                              # (one sqlite leaves where it is)
    (tmp_path / ".doit.db-journal").write_bytes(journal)
    (tmp_path / ".doit.db.damaged-journal").write_bytes(b"an older one's")
    err = _check(db, capsys)
    assert err.startswith(f"doit: {db} was damaged (database disk image is malformed): set aside "
                          f"as {db}.damaged; doit makes a new one (what is current is decided by "
                          "each task's key)"), err
    assert not db.exists() and not (tmp_path / ".doit.db-journal").exists()
    assert (tmp_path / ".doit.db.damaged-journal").read_bytes() == journal


def test_a_damaged_dbs_reason_is_one_line(tmp_path, capsys):
    """sqlite's quick_check may answer in lines ('*** in database main ***' then the page): said
    in one line all the same."""
    db = tmp_path / ".doit.db"
    _good_db(db)
    data = db.read_bytes()
    db.write_bytes(data[:8192] + os.urandom(4096) + data[12288:])   # page 3
    err = _check(db, capsys)
    assert len(err.splitlines()) == 1 and "set aside as" in err and "Page 3" in err, err


def test_links_in_build_are_removed_never_written_through(zoo, tmp_path):
    """A link committed (or dropped) into build/, at its top or as a program's folder, would have
    the run write into wherever it leads, and sweep it: each is removed, said in one line, and the
    run goes on with folders of its own; what the links led to is untouched, a clean too."""
    outside = tmp_path / "outside"
    (outside / "victim/golden").mkdir(parents=True)
    (outside / "victim/golden/notes.txt").write_text("precious")
    (outside / "marker").write_text("keep")
    (outside / "results").mkdir()
    before = sorted(str(p.relative_to(outside)) + ":" + (p.read_text() if p.is_file() else "")
                    for p in outside.rglob("*"))
    (zoo / "build/bundles").mkdir(parents=True)
    os.symlink(outside / "victim", zoo / "build/bundles/a")
    os.symlink(outside / "marker", zoo / "build/.running")
    os.symlink(outside / "results", zoo / "build/results")
    os.symlink(outside / "gone", zoo / "build/status")          # (to nothing)
    rc, ran, out = doit(zoo)
    assert rc == 0 and {"emit:a", "lock:a"} <= ran, out
    for link in ("build/bundles/a", "build/.running", "build/results", "build/status"):
        assert f"doit: {link} was a link (to {outside}" in out and not os.path.islink(zoo / link), out
    assert (zoo / "build/bundles/a/model.py").is_file() and (zoo / "build/results/a/float32.json").is_file()
    shutil.rmtree(zoo / "build/bundles/a/golden")   # golden/ a link: the lock settles it again
    os.symlink(outside / "victim/golden", zoo / "build/bundles/a/golden")
    rc, ran, out = doit(zoo)
    assert rc == 0 and "lock:a" in ran and not os.path.islink(zoo / "build/bundles/a/golden"), out
    assert (zoo / "build/bundles/a/golden/golden.json").is_file()
    os.symlink(outside / "victim", zoo / "build/bundles/zz")
    rc, ran, out = doit(zoo, "clean")
    assert rc == 0 and "build/bundles/zz was a link" in out, out
    assert sorted(str(p.relative_to(outside)) + ":" + (p.read_text() if p.is_file() else "")
                  for p in outside.rglob("*")) == before


def test_a_sigterm_to_a_parallel_run_ends_its_workers_quietly(zoo):
    """`doit -n 2` stopped by SIGTERM (a CI job cancelled, `timeout`) while a worker runs a task:
    doit ends its workers with SIGTERM, and they end as SIGTERM ends a process, not as an
    interrupt (a traceback each, and the run blaming a worker that 'ended with exit status 1')."""
    with open(zoo / "dodo.py", "a") as f:
        f.write("\n\ndef task_slow():\n    import time\n    return {'actions': [lambda: print('slow started', "
                "flush=True) or time.sleep(60)], 'uptodate': [False], 'verbosity': 2}\n")
    p = subprocess.Popen([sys.executable, "-u", "-m", "doit", "-n", "2", "slow", "report"], cwd=zoo,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "LOGOS_PROGRESS": "names"})
    seen = []
    for line in p.stdout:
        seen.append(line)
        if "slow started" in line:
            break
    workers = _children(p.pid)
    p.send_signal(signal.SIGTERM)
    rest, _ = p.communicate(timeout=120)
    try:
        assert workers and _gone(workers), seen
    finally:
        _end(workers)
    assert p.returncode == -signal.SIGTERM and "doit: interrupted (SIGTERM)" in rest, rest
    assert "Traceback" not in rest and "doit worker process" not in rest, rest


def test_a_warning_said_once_a_run_is_said_once_by_all_its_processes(tmp_path, monkeypatch):
    """`doit -n`'s workers each open the cache: a bad entry, or a cache of another key, is said
    by whichever comes to it first, once a run; a run of its own says it again."""
    from emitter.pipeline import guards
    monkeypatch.setattr(guards, "_SAID", [str(tmp_path / "tmp" / "said")])
    monkeypatch.setattr(guards, "began_ns", lambda: 1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # a worker
        guards.say_once("cache: bad entry", lambda m: os.write(w, m.encode()))
        os._exit(0)
    os.close(w)
    assert os.waitpid(pid, 0)[1] == 0 and os.read(r, 100) == b"cache: bad entry"
    said = []
    guards.say_once("cache: bad entry", said.append)
    guards.say_once("cache: another", said.append)
    guards.say_once("cache: another", said.append)
    assert said == ["cache: another"]
    monkeypatch.setattr(guards, "began_ns", lambda: 2)   # the next run
    guards.say_once("cache: bad entry", said.append)
    assert said == ["cache: another", "cache: bad entry"]
    monkeypatch.setattr(guards, "began_ns", lambda: None)   # outside a run: each time
    guards.say_once("x", said.append)
    guards.say_once("x", said.append)
    assert said[-2:] == ["x", "x"]
    (tmp_path / "file").write_text("")   # no folder for the markers (a file in its place): said
    monkeypatch.setattr(guards, "_SAID", [str(tmp_path / "file")])
    monkeypatch.setattr(guards, "began_ns", lambda: 3)
    guards.say_once("y", said.append)
    assert said[-1] == "y"


@pytest.mark.parametrize("how", ["read-only", "lock a folder", "lock a FIFO"])
def test_a_build_folder_the_run_cannot_lock_in_refuses_it_in_one_line(tmp_path, how):
    """build/ that cannot be written (a read-only mount, a restore's permissions) or whose lock's
    name is a folder: the run is refused in one line naming the lock (exit 3), no traceback."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    (z / "build").mkdir()
    if how == "read-only":
        if os.geteuid() == 0:   # (root writes through a mode: a read-only bind mount stands in)
            if subprocess.run(["mount", "--bind", str(z / "build"), str(z / "build")]).returncode or \
                    subprocess.run(["mount", "-o", "remount,bind,ro", str(z / "build")]).returncode:
                subprocess.run(["umount", str(z / "build")])
                (z / "build" / ".doit.lock").mkdir()   # (no mounts here: the other way to fail)
        else:
            os.chmod(z / "build", 0o555)
    elif how == "lock a FIFO":
        os.mkfifo(z / "build" / ".doit.lock")
    else:
        (z / "build" / ".doit.lock").mkdir()
    try:
        rc, ran, out = doit(z)
    finally:
        subprocess.run(["umount", str(z / "build")], capture_output=True)
        os.chmod(z / "build", 0o755)
    assert rc == 3 and "Traceback" not in out and "build/.doit.lock cannot be opened" in out, out


def test_a_fifo_where_the_runs_markers_go_is_removed_never_waited_on(tmp_path):
    """build/tmp/said (say_once's markers) as a FIFO: removed as the run starts, which never
    waits for a writer (rmtree would open it), and the run goes on."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    (z / "build" / "tmp").mkdir(parents=True)
    os.mkfifo(z / "build" / "tmp" / "said")
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:b" in ran, out
