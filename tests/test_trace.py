"""The VM once per program (issue 28): the VM's trace stored under the key of what it reads, read
by a program's other checks, rebuilt where a stage is a view, recomputed where the file is damaged."""

import json
import os
import shutil
import struct

import numpy as np
import pytest

from conftest import DATA, emit_bundle, write_weights
from emitter import read_file
from emitter.verify import trace as trace_file
from emitter.verify.lock import lock_bundle
from test_lock import TIED
from test_pipeline import PROG_A, _weights, doit, make_zoo

FIGURES = ("verdict", "stages", "output", "first_divergence", "worst", "steps_detail", "load", "fresh")


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    """The all-ops program (states, views of stages, row lookups) with random weights, its bundle."""
    d = tmp_path_factory.mktemp("trace")
    shutil.copy(os.path.join(DATA, "all_ops.logos"), d / "all_ops.logos")
    program = read_file(str(d / "all_ops.logos"))
    return {"program": str(d / "all_ops.logos"), "weights": write_weights(program, d / "weights", seed=3),
            "bundle": emit_bundle(program.source, d / "bundle"), "source": program.source}


def _spec(path, lock_result):
    """A trace spec for the inputs `lock_result` (a hand lock of the same check) read."""
    return {"path": str(path), "key": "k" * 64, "source": lock_result["hashes"]["source"],
            "environment": lock_result["environment"]["digest"]}


def _lock(ops, dtype, spec=None, steps=3):
    return lock_bundle(ops["bundle"], ops["program"], ops["weights"], dtype, steps, trace=spec)


def _same(a, b):
    assert {k: a[k] for k in FIGURES} == {k: b[k] for k in FIGURES}


def test_a_programs_second_dtype_reads_the_trace_and_runs_no_vm(ops, tmp_path):
    hand = {dt: _lock(ops, dt) for dt in ("float64", "float32")}
    assert all(r["verdict"] == "pass" and r["timings"]["vm_s"] > 0 for r in hand.values())
    spec = _spec(tmp_path / "traces" / "kk" / "t.trace", hand["float64"])
    first = _lock(ops, "float64", spec)
    assert first["trace"]["written"] and not first["trace"]["hit"] and first["timings"]["vm_s"] > 0
    assert os.path.getsize(spec["path"]) == first["trace"]["bytes"]
    second = _lock(ops, "float32", spec)
    assert second["trace"]["hit"] and not second["trace"]["written"]
    assert second["timings"]["vm_s"] == 0.0 and second["timings"]["trace_s"] > 0
    # the fresh pass's VM step too (other inputs and states): stored once, read by both
    assert first["trace"]["fresh"] == second["trace"]["fresh"] == "read"
    assert second["fresh"]["inputs"], second["fresh"]
    _same(first, hand["float64"])      # the same figures as the VM computed in the lock
    _same(second, hand["float32"])
    assert not [p for p in os.listdir(os.path.dirname(spec["path"])) if p.endswith(".partial")]


def test_a_trace_of_another_program_or_environment_is_not_used(ops, tmp_path):
    hand = _lock(ops, "float64", steps=1)
    for wrong in ({"source": "0" * 64}, {"environment": "0" * 64}):
        spec = {**_spec(tmp_path / "t.trace", hand), **wrong}
        r = _lock(ops, "float64", spec, steps=1)
        assert r["trace"]["why"].startswith("not used") and r["timings"]["vm_s"] > 0
        assert not os.path.exists(spec["path"])


@pytest.mark.parametrize("damage", ["array", "index", "truncated", "empty"])
def test_a_damaged_trace_is_recomputed_with_the_same_verdict(ops, tmp_path, damage):
    hand = _lock(ops, "float32")
    spec = _spec(tmp_path / "t.trace", hand)
    assert _lock(ops, "float64", spec)["trace"]["written"]
    data = bytearray(open(spec["path"], "rb").read())
    n = struct.unpack("<Q", data[-48:-40])[0]
    if damage == "array":            # a byte of step 2's arrays: steps 1 read, the rest computed
        index = json.loads(bytes(data[-48 - n:-48]))
        rec = next(s for s in index["steps"][1]["stages"] if "o" in s and s["n"])
        data[rec["o"]] ^= 0x40
    elif damage == "index":
        data[-48 - n + 10] ^= 0x01
    elif damage == "truncated":
        data = data[:len(data) // 2]
    else:
        data = bytearray()
    open(spec["path"], "wb").write(bytes(data))
    r = _lock(ops, "float32", spec)
    assert "damaged" in r["trace"]["why"] and r["timings"]["vm_s"] > 0
    _same(r, hand)
    if damage == "array":            # removed: the next check writes it again
        assert not r["trace"]["written"] and not os.path.exists(spec["path"])
    else:                            # computed again under the lock and written whole
        assert r["trace"]["written"] and _lock(ops, "float32", spec)["trace"]["hit"]


def test_a_fifo_where_a_trace_or_its_lock_goes_is_a_damaged_trace_not_a_hang(ops, tmp_path):
    """A FIFO planted at the trace's path and at its lock's: opening either would wait for a
    writer for ever; the trace is said damaged, computed again and written in its place."""
    import signal

    class Hung(RuntimeError):   # (no OSError: the trace's reader takes those for damage)
        pass

    def hung(*_):
        raise Hung("the lock waited on a FIFO")
    hand = _lock(ops, "float32")
    spec = _spec(tmp_path / "t.trace", hand)
    os.mkfifo(spec["path"])
    os.mkfifo(spec["path"] + ".lock")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        r = _lock(ops, "float64", spec)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert r["trace"]["why"].startswith("damaged (") and "not a regular file" in r["trace"]["why"], r["trace"]
    assert r["trace"]["written"] and os.path.isfile(spec["path"]) and r["verdict"] == "pass"
    assert _lock(ops, "float32", spec)["trace"]["hit"]


def test_a_view_of_a_leaf_is_stored_as_a_marker_and_rebuilt(tmp_path):
    """`transpose of E` (gemma3's tied table, here 3000×64) is not written out: it is rebuilt
    from the leaf on reading, exactly as the VM made it."""
    (tmp_path / "t.logos").write_text(TIED.replace("300 by 8", "3000 by 64").replace("1 by 8", "1 by 64"))
    w = tmp_path / "w"
    w.mkdir()
    rng = np.random.default_rng(5)
    rng.standard_normal((3000, 64)).astype("<f4").tofile(w / "E.f32")
    rng.standard_normal((1, 64)).astype("<f4").tofile(w / "x.f32")
    bundle = emit_bundle((tmp_path / "t.logos").read_text(), tmp_path / "b")
    hand = lock_bundle(bundle, str(tmp_path / "t.logos"), str(w), "float32", 2)
    spec = _spec(tmp_path / "t.trace", hand)
    first = lock_bundle(bundle, str(tmp_path / "t.logos"), str(w), "float64", 2, trace=spec)
    assert first["trace"]["written"]
    assert os.path.getsize(spec["path"]) < 3 * 3000 * 8 + 4096   # y at 2 steps and the fresh pass's; E is 768 kB
    from emitter.verify.trace_format import Reader
    r = Reader(spec["path"], spec["key"], 2)
    assert [s.get("rebuild") for s in r.index["steps"][0]["stages"]] == [True, None]
    program = read_file(str(tmp_path / "t.logos"))
    from emitter.verify import vm
    leaves = vm.load_leaves(program, str(w)).values
    got, want = r.step(program, leaves, 0), vm.step(program, leaves)
    assert np.shares_memory(got.stages[0], leaves["E"]) and got.stages[0].shape == (64, 3000)
    assert np.array_equal(got.stages[1], want.stages[1]) and got.output is got.stages[1]
    r.close()
    _same(lock_bundle(bundle, str(tmp_path / "t.logos"), str(w), "float32", 2, trace=spec), hand)


def test_a_damaged_fresh_step_is_a_damaged_trace_and_computed_with_the_same_verdict(ops, tmp_path):
    """A byte of the stored fresh step changed: the check computes that step itself (the same
    figures), says why, and the file is removed (the next check writes it again); a trace of an
    earlier format is named as one."""
    hand = _lock(ops, "float32")
    spec = _spec(tmp_path / "t.trace", hand)
    assert _lock(ops, "float64", spec)["trace"]["written"]
    from emitter.verify.trace_format import Reader
    r = Reader(spec["path"], spec["key"], 3)
    at = r.index["fresh"]["trace"]["output"]["o"]
    r.close()
    with open(spec["path"], "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
    got = _lock(ops, "float32", spec)
    assert got["trace"]["hit"] and got["trace"]["fresh"] == "computed", got["trace"]
    assert "fresh step damaged" in got["trace"]["fresh_why"] and not os.path.exists(spec["path"])
    _same(got, hand)
    again = _lock(ops, "float32", spec)
    assert again["trace"]["written"] and again["trace"]["fresh"] == "read"
    with open(spec["path"], "rb") as f:
        body = f.read()
    n, _, magic = struct.unpack("<Q32s8s", body[-48:])
    index = json.loads(body[-48 - n:-48])
    index["version"] = 1
    raw = json.dumps(index).encode()
    import hashlib
    with open(spec["path"], "wb") as f:
        f.write(body[:-48 - n] + raw + struct.pack("<Q32s8s", len(raw), hashlib.sha256(raw).digest(), magic))
    old = _lock(ops, "float32", spec)
    assert "not a trace of this format (version 1" in old["trace"]["why"], old["trace"]


def test_a_fresh_step_asked_for_other_values_than_the_trace_holds_is_computed(tmp_path):
    """The trace holds the fresh pass's VM step as a float32 module's check asks it (an Int state's
    tries no greater than 2^24). A float64 module holds a counter at 2^24 + 2 too, so its check asks
    for other values: it computes its own step, whose figures are a hand lock's, and never takes the
    stored one."""
    from test_bundle_faults import COUNTER
    text = COUNTER.replace("16777116", "16777216")
    (tmp_path / "c.logos").write_text(text)
    os.makedirs(tmp_path / "w")
    np.array([[0.5, 0.25]]).astype("<f8").tofile(tmp_path / "w" / "x.f64")
    bundle = emit_bundle(text, tmp_path / "b")
    args = (bundle, str(tmp_path / "c.logos"), str(tmp_path / "w"), "float64", 2)
    hand = lock_bundle(*args)
    spec = _spec(tmp_path / "t.trace", hand)
    first = lock_bundle(*args, trace=spec)
    assert first["trace"]["written"] and first["trace"]["fresh"] == "computed", first["trace"]
    from emitter.verify.trace_format import Reader
    stored = Reader(spec["path"], spec["key"], 2).fresh(read_file(str(tmp_path / "c.logos")))
    assert float(stored.far["n"].item()) == 16777216.0   # after step 1, n is 2^24 + 1: float32's ask is v - 1 alone
    assert hand["fresh"]["varied_states"] == ["n"] and first["verdict"] == hand["verdict"] == "pass"
    _same(first, hand)


def test_a_trace_over_its_limit_is_not_stored_and_the_lock_computes_the_vm(ops, tmp_path):
    hand = _lock(ops, "float32", steps=1)
    spec = {**_spec(tmp_path / "t.trace", hand), "limit": 64}
    r = _lock(ops, "float32", spec, steps=1)
    assert r["trace"]["why"].startswith("not stored") and r["timings"]["vm_s"] > 0
    assert os.listdir(tmp_path) == []
    _same(r, hand)


def test_the_least_recently_used_traces_go_past_the_folders_limit(tmp_path):
    for i, name in enumerate(("old", "mid", "new")):
        p = tmp_path / name[:2] / f"{name}.trace"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"x" * 100)
        os.utime(p, (1000 + i, 1000 + i))
    trace_file.prune(str(tmp_path), str(tmp_path / "ol" / "old.trace"), limit=250)
    assert sorted(p.name for p in tmp_path.rglob("*.trace")) == ["new.trace", "old.trace"]


def _results(z):
    return {p.stem: json.loads(p.read_text()) for p in (z / "build/results/a").glob("*.json")}


def test_the_zoo_computes_the_vm_once_per_program_and_keys_it_by_what_it_reads(tmp_path):
    traced = "limits: {trace_bytes: 1}\n"   # (a tiny program: traced all the same)
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "dtypes: [float64, float32]\n" + traced)})
    _weights(str(z / "weights/a/w.f64"), 0)
    rc, ran, out = doit(z)
    r = _results(z)
    assert rc == 0 and r["float64"]["verdict"] == r["float32"]["verdict"] == "pass", out
    key = r["float64"]["trace"]["key"]
    assert r["float64"]["trace"]["written"] and r["float32"]["trace"] == {**r["float64"]["trace"],
                                                                          "hit": True, "written": False}
    assert r["float32"]["timings"]["vm_s"] == 0.0 < r["float64"]["timings"]["vm_s"]
    assert (z / "build/store/traces" / key[:2] / f"{key}.trace").is_file()
    (z / "weights/a/notes.txt").write_text("not a leaf")      # a file the VM does not read
    (z / "programs/a.yaml").write_text("dtypes: [float64, float32]\ntolerances: {float32: {abs: 0.001, rel: 0.001}}\n"
                                       + traced)
    rc, ran, out = doit(z)
    r = _results(z)
    assert rc == 0 and "lock:a" in ran, out
    assert {dt: (x["trace"]["key"], x["trace"]["hit"]) for dt, x in r.items()} == \
        {"float64": (key, True), "float32": (key, True)}
    _weights(str(z / "weights/a/w.f64"), 1)                     # other weights: another trace
    rc, ran, out = doit(z)
    r = _results(z)
    assert rc == 0 and r["float64"]["trace"]["key"] not in (key, None) and r["float64"]["trace"]["written"], out
    key2 = r["float64"]["trace"]["key"]
    (z / "programs/a.logos").write_text(PROG_A.replace("-0.5", "-0.25"))   # another program: another
    rc, ran, out = doit(z)
    r = _results(z)
    assert rc == 0 and r["float64"]["trace"]["key"] not in (key, key2) and r["float32"]["trace"]["hit"], out


def test_a_program_with_one_check_to_run_writes_no_trace(tmp_path):
    """Nothing to share the VM with: no trace file is written (a zoo of single-dtype programs
    would pay the write for nothing); a trace already there is still read."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "dtypes: [float64]\nlimits: {trace_bytes: 1}\n")})
    _weights(str(z / "weights/a/w.f64"), 0)
    rc, ran, out = doit(z)
    r = _results(z)
    assert rc == 0 and r["float64"]["verdict"] == "pass" and r["float64"]["timings"]["vm_s"] > 0, out
    assert not r["float64"]["trace"]["written"] and "no other check" in r["float64"]["trace"]["why"]
    assert not list((z / "build/store").glob("traces/*/*.trace"))


def test_a_lone_check_reads_a_trace_already_there(tmp_path):
    """A check that runs alone (its program's others current) still reads the trace they left."""
    cfg = "dtypes: [float64, float32]\nlimits: {trace_bytes: 1}\n"
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, cfg)})
    _weights(str(z / "weights/a/w.f64"), 0)
    rc, ran, out = doit(z)
    assert rc == 0 and _results(z)["float64"]["trace"]["written"], out
    (z / "programs/a.yaml").write_text(cfg + "tolerances: {float32: {abs: 0.0002}}\n")
    rc, ran, out = doit(z)
    r = _results(z)
    assert rc == 0 and r["float32"]["verdict"] == "pass" and r["float32"]["trace"]["hit"], out
    assert r["float32"]["timings"]["vm_s"] == 0.0 and r["float32"]["tolerance"]["abs"] == 0.0002


def test_a_program_whose_vm_reads_few_weights_keeps_its_trace_in_memory(tmp_path):
    """Under limits.trace_bytes (16 MiB by default) a trace's file costs more than the VM it
    saves: the trace is kept in the memory of the process that runs the program's checks (an
    inline run's child), in the file's format, so its VM is still computed once; no file is
    written, and each check's figures are those of a check that computes its own VM."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "dtypes: [float64, float32]\n")})
    _weights(str(z / "weights/a/w.f64"), 0)
    rc, ran, out = doit(z)
    r = _results(z)
    assert rc == 0 and r["float64"]["verdict"] == r["float32"]["verdict"] == "pass", out
    assert all("trace_bytes" in x["trace"]["why"] for x in r.values()), r
    computed = [x for x in r.values() if x["timings"]["vm_s"] > 0]
    assert len(computed) == 1 and computed[0]["trace"]["written"] and not computed[0]["trace"]["hit"], r
    read = [x for x in r.values() if x["timings"]["vm_s"] == 0]
    assert len(read) == 1 and read[0]["trace"]["hit"] and read[0]["trace"]["bytes"] > 0, r
    assert not list((z / "build/store").glob("traces/**/*.trace"))
    for dtype, x in r.items():   # the same figures as a check that computes its VM itself
        hand = lock_bundle(str(z / "build/bundles/a"), str(z / "programs/a.logos"), str(z / "weights/a"), dtype, 1)
        assert all(hand[k] == x[k] for k in FIGURES), dtype


KEY_NOW = """
import sys
sys.path.insert(0, ".")
if sys.argv[1] == "loaded":
    import emitter.pipeline.worker_code  # noqa: F401  (the lock code loaded: a worker, or a run's first check)
    with open("emitter/verify/vm.py", "a") as f:   # the VM edited after it was loaded
        f.write("# edited\\n")
from emitter.pipeline.check_worker import trace_key
print(trace_key({"source": "s" * 64, "weights": None, "steps": 2, "environment": "e" * 64, "threads": 1}))
"""


def _printed(cwd, code, mode):
    """What a fresh interpreter running `code` with the argument `mode` in `cwd` prints."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-c", code, mode], cwd=cwd, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


LOADED_NOW = """
import sys
sys.path.insert(0, ".")
if sys.argv[1] == "dodo":
    import emitter.tasks, emitter.verify.links  # noqa: F401,E401  (as doit loads a dodo)
    with open("emitter/verify/links.py", "a") as f:   # lock code edited after its import
        f.write("# edited\\n")
from emitter.pipeline.worker_code import LOADED
print(LOADED)
"""


def test_the_loaded_code_digest_is_of_modules_as_imported_before_it_too(tmp_path):
    """A lock module imported while doit loaded the dodo, then edited before the lock code's
    digest was taken: the digest is of the code that runs (the module as it was imported), so
    a key that names the edit never takes this process's verdicts."""
    zoo = make_zoo(tmp_path / "zoo", {})

    def loaded(mode):
        return _printed(zoo, LOADED_NOW, mode)
    before = loaded("fresh")
    assert not before.startswith("moved:")
    assert loaded("dodo") == before     # (links.py ran as it was before the edit)
    assert loaded("fresh") != before    # (the edit's own digest)


def test_a_trace_key_names_the_vm_code_that_was_loaded_not_an_edit_after(tmp_path):
    """vm.py edited after the lock code was loaded (before the process's first check): the trace
    that process computes is of the loaded VM, and its key says so; the edited code's key is
    another (else a later run of the edited VM would read the old VM's numbers)."""
    zoo = make_zoo(tmp_path / "zoo", {})

    def key(mode):
        return _printed(zoo, KEY_NOW, mode)
    before = key("fresh")
    assert key("loaded") == before      # (the process loaded the code `before` names)
    assert key("fresh") != before       # (the edit's own key)


def test_a_trace_lock_held_for_good_is_waited_for_a_while_and_a_limit_ends_the_wait(tmp_path):
    """A process stopped while it holds a program's trace lock (SIGSTOP, a debugger) keeps it for
    good: the next check waits for it at most a while, then computes its trace itself; and its
    own time limit ends the wait, in a thread too (where no signal breaks a blocking call)."""
    import subprocess
    import sys
    import threading
    import time
    from emitter.pipeline.timelimit import TimeLimit, deadline
    path = tmp_path / "traces" / "p.lock"
    path.parent.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\nf = open(sys.argv[1], 'a')\n"
                               "fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)\n",
                               str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t = time.monotonic()
        with trace_file._Locked(str(path), wait=1) as lock:
            assert lock.f is None and 1 <= time.monotonic() - t < 30
        got = []

        def limited():
            try:
                with deadline(1, "the check"), trace_file._Locked(str(path), wait=60):
                    got.append("entered")
            except TimeLimit as e:
                got.append(str(e))
        waiter = threading.Thread(target=limited, daemon=True)
        waiter.start()
        waiter.join(30)
        assert got == ["the check took over 1 s (limits.seconds)"], got
    finally:
        holder.kill()
        holder.wait()


def test_a_small_programs_trace_in_memory_is_read_under_its_own_key_alone(ops, tmp_path):
    """A check whose VM reads fewer weights than limits.trace_bytes: the first computes the VM and
    keeps its trace in this process's memory (no file), a second under the same key reads it (its
    figures those of a check that computes its VM), one under another key computes its own, and
    one alone (no other check to read it) keeps nothing."""
    hand = _lock(ops, "float32")
    spec = {**_spec(tmp_path / "m.trace", hand), "min_bytes": 1 << 40}
    first = _lock(ops, "float64", spec)
    assert first["trace"]["written"] and not first["trace"]["hit"] and first["timings"]["vm_s"] > 0
    again = _lock(ops, "float32", spec)
    assert again["trace"]["hit"] and again["timings"]["vm_s"] == 0.0, again["trace"]
    _same(again, hand)
    assert not os.path.exists(spec["path"])
    other = _lock(ops, "float32", {**spec, "key": "j" * 64})
    assert not other["trace"]["hit"] and other["timings"]["vm_s"] > 0
    _same(other, hand)
    alone = _lock(ops, "float32", {**spec, "key": "i" * 64, "alone": True})
    assert not alone["trace"]["written"] and "no other check" in alone["trace"]["why"]
    assert _lock(ops, "float32", {**spec, "key": "i" * 64})["timings"]["vm_s"] > 0
