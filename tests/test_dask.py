"""Locks on a Dask cluster: a real LocalCluster of processes, and a scheduler with two workers
started as separate processes (`dask scheduler` / `dask worker`, on 127.0.0.1 only). Verdicts equal
the inline ones; the driver alone writes results, golden/ and the history; a worker that dies, a
check past its time limit, a lock too big for every worker and a scheduler nobody answers at are
each one clear error, never a hang."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from test_pipeline import PROG_A, PROG_B, _weights, doit, make_zoo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
pytest.importorskip("distributed")


def _zoo(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "limits: {trace_bytes: 1}\n"),   # (tiny: traced all the same)
                                    "b": (PROG_B, "steps: 2\nlimits: {trace_bytes: 1}\n")})
    _weights(str(z / "weights/a/w.f64"), 1)
    return z


def _result(z, name, dtype):
    return json.loads((z / f"build/results/{name}/{dtype}.json").read_text())


SAME = ("verdict", "output", "worst", "first_divergence", "stages", "steps_detail", "load", "hashes",
        "program", "program_path", "bundle", "weights", "tolerance")


def test_dask_local_gives_the_inline_verdicts(tmp_path):
    z = _zoo(tmp_path)
    rc, ran, out = doit(z)
    assert rc == 0, out
    inline = {(n, d): _result(z, n, d) for n in "ab" for d in ("float64", "float32")}
    shutil.rmtree(z / "build/bundles/a/golden")
    for n in "ab":
        shutil.rmtree(z / f"build/results/{n}")
    shutil.rmtree(z / "build/store")          # every keyed verdict: now computed again
    # (a short one: multiprocessing's forkserver puts its socket there, 107 bytes at most)
    system_tmp = tempfile.mkdtemp(prefix="tmp", dir="/tmp")
    try:
        rc, ran, out = doit(z, "executor=dask:local", "workers=2", env={"TMPDIR": system_tmp})
        # the workers' scratch in build/tmp/dask, nothing left outside the repository
        assert not os.listdir(system_tmp), os.listdir(system_tmp)
    finally:
        shutil.rmtree(system_tmp, ignore_errors=True)
    assert rc == 0, out
    assert {"lock:a", "lock:b", "report"} <= ran and "Traceback" not in out
    assert (z / "build/tmp/dask/dask-scratch-space").is_dir()
    for (n, d), before in inline.items():
        r = _result(z, n, d)
        assert {k: r.get(k) for k in SAME} == {k: before.get(k) for k in SAME}, (n, d)
        ex = r["execution"]
        assert ex["executor"] == "dask:local" and ex["worker"].startswith("tcp://127.0.0.1:")
        assert ex["threads"] == ex["torch_threads"] == 1 and ex["pid"] != os.getpid()
    for n in "ab":   # the VM once per program on the workers too: one check wrote it, one read it
        traces = sorted((_result(z, n, d)["trace"]["written"], _result(z, n, d)["trace"]["hit"],
                         _result(z, n, d)["timings"]["vm_s"] == 0) for d in ("float64", "float32"))
        assert traces == [(False, True, True), (True, False, False)], n
    # the golden outputs came back from a worker and the driver wrote them
    assert json.loads((z / "build/bundles/a/golden/golden.json").read_text())["steps"] == 1
    report = json.loads((z / "build/report.json").read_text())
    assert report["counts"] == {"pass": 4, "fail": 0, "error": 0}
    # the executor is no dependency: a no-op stays a no-op
    rc, ran, out = doit(z, "executor=dask:local", "workers=2")
    assert (rc, ran) == (0, set()), out


def _job(tmp_path, name, source, **extra):
    from conftest import check_record, emit_bundle
    bundle = emit_bundle(source, tmp_path / name)
    path = tmp_path / f"{name}.logos"
    path.write_text(source)
    return {"name": name, "root": str(tmp_path), "bundle": os.path.relpath(bundle, tmp_path),
            "source": f"{name}.logos", "weights": None, "golden": None,
            "thread_env": {}, "memory": None,
            "record": check_record(), **extra}


def _ending(tmp_path, name, code):
    """A job whose model.py runs `code` as it is imported."""
    job = _job(tmp_path, name, PROG_B)
    with open(tmp_path / name / "model.py", "a") as f:
        f.write("\n" + code)
    return job


def test_a_dead_worker_a_slow_check_and_a_too_big_one_are_errors_not_hangs(tmp_path):
    from emitter.pipeline import dask_executor, executors
    ok = _job(tmp_path, "ok", PROG_B)
    dies = _ending(tmp_path, "dies", "import os\nos._exit(3)   # the worker process dies mid-lock\n")
    slow = _ending(tmp_path, "slow", "import time\ntime.sleep(60)\n")
    ex = dask_executor.Dask(executors.parse("dask:local", 2))
    try:
        t = time.monotonic()
        out = ex.run([ok, dies], 120)
        assert out[0]["result"]["verdict"] == "pass" and out[0]["execution"]["worker"]
        assert out[1].get("infrastructure") and "died while running it" in out[1]["error"], out[1]
        assert "worker tcp://127.0.0.1:" in out[1]["error"]
        out = ex.run([slow], 3)
        assert "took over 3 s (limits.seconds) and was cancelled" in out[0]["error"]
        assert time.monotonic() - t < 60
    finally:
        ex.close()


def test_a_checks_limit_counts_from_its_start_and_ends_it_on_its_worker(tmp_path):
    """One worker: a check that waited in the queue behind others is not past its limit for that
    wait (each of these takes under it); one past its limit ends there, on its worker, which then
    takes the next check at once (a cancelled task Dask cannot stop kept it busy)."""
    from emitter.pipeline import dask_executor, executors
    # (model.py runs twice a check: its module, and the fresh pass's new instance)
    jobs = [_ending(tmp_path, name, "import time\ntime.sleep(1.25)\n") for name in ("slow1", "slow2")]
    jobs.append(_job(tmp_path, "ok", PROG_B))
    spin = _ending(tmp_path, "spin", "while True:\n    pass\n")
    ex = dask_executor.Dask(executors.parse("dask:local", 1))
    try:
        out = ex.run(jobs, 4)
        assert [o.get("result", {}).get("verdict") for o in out] == ["pass"] * 3, out
        out = ex.run([spin], 2)
        r = out[0]["result"]   # (ended inside lock_bundle: its error verdict, as inline)
        assert r["verdict"] == "error" and "the float64 lock check on dask:local took over 2 s (limits.seconds)" \
            in r["reason"], r["reason"]
        t = time.monotonic()
        out = ex.run([_job(tmp_path, "next", PROG_B)], 60)
        assert out[0]["result"]["verdict"] == "pass" and time.monotonic() - t < 30, out
    finally:
        ex.close()


def test_a_limit_counts_from_a_workers_start_and_one_no_limit_ends_frees_its_worker(tmp_path):
    """A scheduler of its own (tcp) is handed every check at once, and a worker holds more than it
    runs: a check waiting in a queue, the worker's own too, is not past its limit for that wait.
    A check its worker's limit cannot end (a blocking sleep) is cancelled GRACE later and its
    worker restarted, so the check beside it runs, not waits behind it; where the worker runs
    another check, that one is left to end as it would (no restart kills it)."""
    import threading
    from distributed import LocalCluster
    from emitter.pipeline import dask_executor, executors
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None)
    ex = dask_executor.Dask(executors.parse("dask:" + cluster.scheduler_address))
    try:
        jobs = [_ending(tmp_path, f"s{i}", "import time\ntime.sleep(1.25)\n") for i in range(3)]   # (run twice)
        out = ex.run(jobs, 3)
        assert [o.get("result", {}).get("verdict") for o in out] == ["pass"] * 3, out
        t = time.monotonic()
        out = ex.run([_ending(tmp_path, "stuck", "import time\ntime.sleep(600)\n"), _job(tmp_path, "ok", PROG_B)], 3)
        assert out[0]["error"].endswith("took over 3 s (limits.seconds) and was cancelled (its worker restarted)")
        assert out[1]["result"]["verdict"] == "pass" and time.monotonic() - t < 120, out
    finally:
        ex.close()
        cluster.close()
    cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                           dashboard_address=None)
    ex = dask_executor.Dask(executors.parse("dask:" + cluster.scheduler_address))
    try:
        ex.run([_job(tmp_path, "warm", PROG_B)], 60)   # (the worker's imports made)
        beside = []
        healthy = threading.Thread(target=lambda: beside.append(ex.run(
            [_ending(tmp_path, "healthy", "import time\ntime.sleep(8)\n")], 30)))
        healthy.start()
        time.sleep(1)
        out = ex.run([_ending(tmp_path, "stuck2", "import time\ntime.sleep(600)\n")], 2)
        assert "and was cancelled (its worker, running other work," in out[0]["error"], out
        healthy.join(120)
        assert beside and beside[0][0]["result"]["verdict"] == "pass", beside
    finally:
        ex.close()
        cluster.close()


WATCH = """
import json, sys
from emitter.pipeline import check_worker
from emitter.pipeline.digests import code_files, package_digest
out = check_worker.run_check(json.loads(sys.argv[1]))
from emitter.pipeline.worker_code import _module
print(json.dumps({"unloaded": [r for r in code_files("lock") if _module(r) not in sys.modules],
                  "code": out["execution"]["code"], "now": package_digest("lock")}))
"""


def test_a_worker_loads_all_of_the_lock_code_with_its_first_check(tmp_path):
    """A worker's first check loads all of the lock code and takes its digest then (none of it is
    imported later, by a bfloat16 check say, after an edit, under the digest taken before)."""
    job = _job(tmp_path, "ok", PROG_B, remote=True)
    p = subprocess.run([sys.executable, "-c", WATCH, json.dumps(job)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.splitlines()[-1])
    assert got["unloaded"] == [] and got["code"] == got["now"], got


HASHED = """
import hashlib, json, sys
from emitter import fingerprint
hashed, real = [], hashlib.file_digest
fingerprint.hashlib.file_digest = lambda f, name: hashed.append(f.name) or real(f, name)
from emitter.pipeline import check_worker
out = check_worker.run_check(json.loads(sys.argv[1]))
print(json.dumps({"verdict": out["result"]["verdict"], "hashed": hashed}))
"""


def test_a_worker_takes_the_drivers_hashes_of_the_weights_where_its_stat_agrees(tmp_path, monkeypatch):
    """A job carries the driver's hash record of its weights files: a worker whose stat of a file
    agrees reads it only to compute (the check's weights are not hashed a second time); a file
    whose stamp differs there is hashed, and so is every file on a worker of another host (a
    network filesystem's stat may be stale there)."""
    from emitter import fingerprint
    monkeypatch.setattr(fingerprint, "RACY_S", 0.0)   # a file just written is recorded all the same
    monkeypatch.chdir(tmp_path)
    job = _job(tmp_path, "a", PROG_A, remote=True)
    _weights(str(tmp_path / "w" / "w.f64"), 1)
    record = fingerprint.Fingerprints()
    sha = record.sha256(os.path.join("w", "w.f64"))
    job.update(weights="w", stamps={"host": socket.gethostname(),
                                    "files": {"w.f64": record.entry(os.path.join("w", "w.f64"))}})
    job["weights_shas"] = {"w.f64": sha}

    def run(job):
        p = subprocess.run([sys.executable, "-c", HASHED, json.dumps(job)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
        assert p.returncode == 0, p.stderr[-2000:]
        got = json.loads(p.stdout.splitlines()[-1])   # (the lock code's and the bundle's files too)
        return {**got, "hashed": [h for h in got["hashed"] if h.startswith("w" + os.sep)]}
    assert run(job) == {"verdict": "pass", "hashed": []}
    # (a file written under RACY_S ago is hashed at each look, as the lock looks more than once)
    for stamps in ({}, {**job["stamps"], "files": {"w.f64": "1:2:3:4:" + sha}},   # none; not this file's
                   {**job["stamps"], "host": job["stamps"]["host"] + "-other"}):   # another host's stat
        alone = run({**job, "stamps": stamps})
        assert alone["verdict"] == "pass" and set(alone["hashed"]) == {os.path.join("w", "w.f64")}, stamps


def _in_worker():
    import sys
    return {m: m in sys.modules for m in ("torch", "emitter.verify.lock", "emitter.pipeline.dask_executor")}


def test_a_local_cluster_starts_warm_runs_the_longest_first_and_leaves_nothing(tmp_path):
    """warm() starts the LocalCluster in the background; its workers have imported torch and
    the lock code before their first check; one worker, two checks of one lock: the costlier
    runs first whatever the order they came in; close stops the forkserver the workers came from."""
    from multiprocessing import forkserver
    from emitter.pipeline import dask_executor, executors
    small = _job(tmp_path, "small", PROG_B, memory=1 << 20)
    big = _job(tmp_path, "big", PROG_B, memory=1 << 30)
    assert executors.cost(big) > executors.cost(small)
    by_dtype = [executors.cost({**small, "record": {**small["record"], "dtype": d}})
                for d in ("float32", "bfloat16", "float64")]
    assert by_dtype == sorted(set(by_dtype))     # as measured: float64's module copy costs most
    ex = dask_executor.Dask(executors.parse("dask:local", 1))
    try:
        ex.warm()
        assert ex._warming.is_alive()   # doit goes on loading meanwhile
        ex._warming.join(120)
        assert ex._client is not None
        assert list(ex._client.run(_in_worker).values()) == [{"torch": True, "emitter.verify.lock": True,
                                                           "emitter.pipeline.dask_executor": True}]
        server = forkserver._forkserver._forkserver_pid
        out = ex.run([small, big], 120)
        assert [o["result"]["verdict"] for o in out] == ["pass", "pass"]
        assert out[1]["execution"]["started"] < out[0]["execution"]["started"]
    finally:
        ex.close()
    assert server and forkserver._forkserver._forkserver_pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(server, 0)


def test_checks_of_every_lock_share_one_queue_longest_first(tmp_path):
    """Two locks' checks, queued while the cluster starts (doit's threads each run a lock): the
    costliest of all starts first, though the other lock's came first and asked for the cluster."""
    import threading
    from emitter.pipeline import dask_executor, executors
    small = [_job(tmp_path, f"s{i}", PROG_B, memory=1 << 20) for i in range(2)]
    big = _job(tmp_path, "big", PROG_B, memory=1 << 30)
    ex = dask_executor.Dask(executors.parse("dask:local", 1))
    outs = {}
    try:
        first = threading.Thread(target=lambda: outs.update(small=ex.run(small, 120)))
        first.start()
        deadline = time.monotonic() + 30
        while not ex._queue and time.monotonic() < deadline:   # its checks wait for the cluster
            time.sleep(0.005)
        assert ex._client is None
        outs["big"] = ex.run([big], 120)
        first.join(120)
        assert [o["result"]["verdict"] for o in outs["small"] + outs["big"]] == ["pass"] * 3
        assert outs["big"][0]["execution"]["started"] < min(o["execution"]["started"] for o in outs["small"])
        assert ex._in_flight == 0 and not ex._pending
    finally:
        ex.close()


def test_an_unreachable_scheduler_is_one_line(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    with socket.socket() as held:   # bound, never listening: refused, and no other process's for the test
        held.bind(("127.0.0.1", 0))
        rc, ran, out = doit(z, f"executor=dask:tcp://127.0.0.1:{held.getsockname()[1]}")
    assert rc == 3 and ran == set(), out
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1 and "no Dask scheduler can be reached at tcp://127.0.0.1:" in lines[0], out
    rc, ran, out = doit(z, "executor=ray:local")
    assert rc == 3 and "must be inline, dask:local or dask:tcp://HOST:PORT" in out


ONLY_DASK = """
import sys
from emitter.pipeline import executors, lock_task, run
for spec in ("inline", "dask:local", "dask:tcp://127.0.0.1:1"):
    executors.parse(spec, 2)
executors.probe(executors.parse("dask:local"))
executors.executor("inline").warm()
print(sorted(m for m in sys.modules if m.split(".")[0] in ("distributed", "dask")))
"""


def test_only_the_dask_modules_import_distributed():
    """Distributed is the Dask executor's business: no other module imports it, and parsing and
    probing any spec (the run's settings) or running inline loads none of it."""
    import ast
    base = os.path.join(ROOT, "emitter")
    uses = []
    for dirpath, _, files in os.walk(base):
        for f in files:
            if not f.endswith(".py") or f.startswith("dask_"):
                continue
            with open(os.path.join(dirpath, f)) as fh:
                tree = ast.parse(fh.read())
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                uses += [f"{f}:{node.lineno}" for n in names if n.split(".")[0] in ("distributed", "dask")]
    assert uses == []
    p = subprocess.run([sys.executable, "-c", ONLY_DASK], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["[]"], p.stdout


class Echo:
    """A made-up executor (`echo:N`), registered by one line: every check errs with its N."""
    FORMS = ("echo:N",)

    def __init__(self, ex):
        self.ex = ex

    @classmethod
    def parse(cls, spec, workers):
        n = spec.partition(":")[2]
        return {"kind": "echo", "address": n, "workers": workers, "spec": spec} if n.isdigit() else None

    @classmethod
    def probe(cls, ex):
        if ex["address"] == "0":
            from emitter.pipeline.executors import ExecutorError
            raise ExecutorError(f"executor={ex['spec']}: nothing answers")

    def run(self, jobs, seconds):
        return [{"error": f"echo {self.ex['address']}"} for _ in jobs]


def test_an_executor_is_one_registry_line(monkeypatch):
    from emitter.pipeline import executors
    monkeypatch.setitem(executors.REGISTRY, "echo", "test_dask:Echo")
    monkeypatch.setattr(executors, "_EXECUTORS", {})   # this process's executors, echo's with them
    ex = executors.parse("echo:7", 3)
    assert ex == {"kind": "echo", "address": "7", "workers": 3, "spec": "echo:7"}
    executors.probe(ex)
    with pytest.raises(executors.ExecutorError, match="echo:0: nothing answers"):
        executors.probe(executors.parse("echo:0"))
    one = executors.executor("echo:7", 3)
    assert one is executors.executor("echo:7", "3") and one.run([{}], 1) == [{"error": "echo 7"}]
    with pytest.raises(executors.ExecutorError) as e:
        executors.parse("echo:x")
    assert str(e.value) == "executor=echo:x: must be inline, dask:local, dask:tcp://HOST:PORT or echo:N"
    monkeypatch.delitem(executors.REGISTRY, "echo")
    with pytest.raises(executors.ExecutorError) as e:
        executors.parse("dask:tcp://nohost")
    assert str(e.value) == "executor=dask:tcp://nohost: must be inline, dask:local or dask:tcp://HOST:PORT"
    assert executors.parse("inline")["kind"] == "inline" and executors.parse("dask:local", 2)["workers"] == 2


def _scheduler_port(path, proc, seconds=60):
    """The port the scheduler `proc` listens on, once its scheduler file says (no port picked
    here and bound there later, which another test's cluster could take in between)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited {proc.returncode}")
        try:
            port = int(json.loads(path.read_text())["address"].rsplit(":", 1)[1])
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return port
        except (OSError, ValueError, KeyError):
            time.sleep(0.2)
    raise AssertionError(f"the scheduler wrote no address to {path}")


def _workers(z, port, logs, env, n=2):
    return [subprocess.Popen(
        [f"{BIN}/dask", "worker", f"tcp://127.0.0.1:{port}", "--host", "127.0.0.1", "--nthreads", "1",
         "--nworkers", "1", "--no-dashboard", "--resources", f"MEMORY={2 << 30}", "--name", f"w{i}"],
        stdout=logs, stderr=logs, env=env, cwd=z) for i in range(n)]


def _stop(procs):
    for p in reversed(procs):
        p.terminate()
    for p in reversed(procs):
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def _wait_workers(port, n):
    from distributed import Client
    with Client(f"tcp://127.0.0.1:{port}", timeout=30) as c:
        c.wait_for_workers(n, timeout=60)
        return c.scheduler_info()["workers"]


def test_a_scheduler_and_two_workers_started_by_hand(tmp_path):
    """`dask scheduler` and two `dask worker --resources MEMORY=…` processes: each lock declares
    its MEMORY, both workers take locks, and a lock bigger than any worker is refused at once.
    Workers keep the code they loaded: after an edit of the lock code, their checks are errors
    that say so (not verdicts on the new code) until they are restarted; and a verdict computed by
    a worker in another environment (another torch) is not published under this checkout's key."""
    from emitter.pipeline import dask_executor, executors
    z = _zoo(tmp_path)
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False", "PYTHONPATH": str(z)}
    logs = open(tmp_path / "dask.log", "w")
    scheduler = subprocess.Popen([f"{BIN}/dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                                  "--no-dashboard", "--scheduler-file", str(tmp_path / "scheduler.json")],
                                 stdout=logs, stderr=logs, env=env, cwd=z)   # a port of its own choosing
    workers = []
    try:
        port = _scheduler_port(tmp_path / "scheduler.json", scheduler)
        tcp = f"executor=dask:tcp://127.0.0.1:{port}"
        workers = _workers(z, port, logs, env)
        assert all(w["resources"] == {"MEMORY": 2 << 30} for w in _wait_workers(port, 2).values())
        rc, ran, out = doit(z, tcp, "-n", "4")
        assert rc == 0, out + (tmp_path / "dask.log").read_text()[-3000:]
        where = {_result(z, n, d)["execution"]["worker"] for n in "ab" for d in ("float64", "float32")}
        assert len(where) == 2 and all(w.startswith("tcp://127.0.0.1:") for w in where)
        ex = dask_executor.Dask(executors.parse(f"dask:tcp://127.0.0.1:{port}"))
        try:
            big = _job(tmp_path, "big", PROG_B, memory=3 << 30)
            t = time.monotonic()
            out = ex.run([big], 60)
            assert "needs 3.00 GiB (the Dask resource MEMORY)" in out[0]["error"], out
            assert "largest worker advertises 2.00 GiB" in out[0]["error"]
            assert time.monotonic() - t < 10
        finally:
            ex.close()

        with open(z / "emitter/verify/compare.py", "a") as f:   # the lock code changes here
            f.write("\n# an edit the running workers never loaded\n")
        rc, ran, out = doit(z, tcp, "-n", "4")
        assert rc != 0 and {"lock:a", "lock:b"} <= ran, out
        for n in "ab":
            r = _result(z, n, "float64")
            assert r["verdict"] == "error" and "other lock code than this run's" in r["reason"], r
            assert "tcp://127.0.0.1:" in r["reason"] and "restart the Dask workers" in r["reason"]
        _stop(workers)
        workers = _workers(z, port, logs, env)
        _wait_workers(port, 2)
        rc, ran, out = doit(z, tcp, "-n", "4")
        assert rc == 0 and all(_result(z, n, d)["verdict"] == "pass" for n in "ab"
                               for d in ("float64", "float32")), out

        _stop(workers)
        fake = tmp_path / "site"
        (fake / "torch-9.9.9.dist-info").mkdir(parents=True)
        workers = _workers(z, port, logs, {**env, "PYTHONPATH": f"{fake}{os.pathsep}{z}"})
        _wait_workers(port, 2)
        shutil.rmtree(z / "build/results")
        shutil.rmtree(z / "build/store")
        url = (tmp_path / "cache").as_uri()
        rc, ran, out = doit(z, tcp, "-n", "4", f"cache={url}", env={"LOGOS_CACHE_KEY": "k"})
        assert rc == 0 and out.count("computed in another environment") == 4, out
        r = _result(z, "a", "float64")   # a verdict all the same, in the report too
        assert r["verdict"] == "pass" and r["environment"]["records"]["torch"][1] == ["torch-9.9.9.dist-info"]
        here = r["inputs"]["environment"]     # the key names the driver's environment
        assert r["hashes"]["environment"] != here and r["execution"]["driver_environment"] == here
        report = json.loads((z / "build/report.json").read_text())
        assert report["counts"]["pass"] == 4      # and every view says where it was computed
        assert all("computed in another environment" in row["environment_note"] for row in report["results"])
        assert "computed in another environment" in (z / "build/summary.md").read_text()
        assert "computed in another environment" in (z / "build/junit.xml").read_text()
        p = subprocess.run([sys.executable, "-m", "emitter", "results"], cwd=z, capture_output=True, text=True)
        rows = [x for x in p.stdout.splitlines() if x.startswith("#")]   # `logos results` says so too
        assert len(rows) == 4 and all("(computed in another environment, env " in x for x in rows), p.stdout
        assert "4 computed in another environment than this checkout's" in p.stdout
        p = subprocess.run([sys.executable, "-m", "emitter", "results", "--json"], cwd=z, capture_output=True, text=True)
        assert [x["elsewhere"] for x in json.loads(p.stdout)["runs"]] == [True] * 4, p.stdout
        assert not list((tmp_path / "cache").rglob("*.json"))
    finally:
        _stop(workers + [scheduler])
        logs.close()


def test_a_locks_declared_memory_holds_what_it_takes(tmp_path):
    """A lock declares its need (the Dask resource MEMORY) from its manifest: a program of one big
    input and its norm, whose lock holds each many times over (the VM's, the module's, the passes'
    copies), takes no more than it declares, measured as its process's peak."""
    from conftest import emit_bundle
    from emitter.pipeline.executors import memory_need
    src = "Let x be a 2048 by 2048 tensor of Real.\nSet item 1 of x to 3.\nLet y be rmsnorm of x.\n"
    (tmp_path / "big.logos").write_text(src)
    bundle = emit_bundle(src, tmp_path / "b")
    code = ("import resource, subprocess, sys\n"
            "p = subprocess.run([sys.executable, '-m', 'emitter', 'lock', sys.argv[1], '--program', sys.argv[2], "
            "'--dtype', 'float64', '-o', sys.argv[3]], capture_output=True)\n"
            "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n")
    out = subprocess.run([sys.executable, "-c", code, bundle, str(tmp_path / "big.logos"), str(tmp_path / "r.json")],
                         capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rc, peak = map(int, out.stdout.split())
    assert rc == 0, out.stderr
    need = memory_need(os.path.join(bundle, "manifest.json"))
    assert peak <= need, (peak, need)
