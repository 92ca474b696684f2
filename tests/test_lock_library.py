"""The lock's semantics as a library: what is the bundle's fault is a verdict (fail, exit 1) and
what is not is an error (exit 2); the code that runs is the code that was hashed; golden/ comes
back as data and only its callers write it."""

import hashlib
import importlib.util
import json
import os
import py_compile
import shutil
import subprocess
import sys
import threading

import pytest

from conftest import DATA, ROOT, check_record, emit_bundle, run_cli, write_weights
from emitter import read_file
from emitter.verify.lock import lock_bundle


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """The all-ops program with random weights (tok/pos keep their fills) and its bundle."""
    d = tmp_path_factory.mktemp("library")
    shutil.copy(os.path.join(DATA, "all_ops.logos"), d / "all_ops.logos")
    program = read_file(str(d / "all_ops.logos"))
    return {"dir": d, "program": str(d / "all_ops.logos"), "stages": program.stages,
            "weights": write_weights(program, d / "weights", seed=3),
            "bundle": emit_bundle(program.source, d / "bundle")}


def _mutated(zoo, tmp_path, old, new, name="bundle"):
    """A copy of the bundle with `old` replaced by `new` in model.py (exactly once)."""
    bundle = tmp_path / name
    shutil.copytree(zoo["bundle"], bundle)
    text = (bundle / "model.py").read_text()
    assert text.count(old) == 1, old
    (bundle / "model.py").write_text(text.replace(old, new))
    return str(bundle)


def _stage(zoo, op):
    return next(s for s in zoo["stages"] if s.op.name == op)


# 1. a wrong leaf found by the load stage wins over the module raising on it afterwards

def test_a_wrong_fill_that_makes_the_module_raise_fails_at_load(zoo, tmp_path):
    """`tok`'s fill is 2 (emb has 5 rows); the bundle's says 7, so the load stage finds `tok`
    wrong and the probe pass then raises in `row tok of emb`: the load failure is the verdict."""
    bundle = _mutated(zoo, tmp_path, '"tok": ((0, 2),),', '"tok": ((0, 7),),')
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 2)
    assert r["verdict"] == "fail", r["reason"]
    f = r["first_divergence"]
    tok = read_file(zoo["program"]).decls["tok"]
    assert (f["stage"], f["out"], f["op"], f["line"], f["step"]) == ("load", "tok", "load", tok.line, 0)
    assert f["max_abs"] == 5.0
    assert [x["leaf"] for x in r["load"]["failed"]] == ["tok"]
    assert r["worst"]["stage"] == "load" and r["worst"]["out"] == "tok"
    # what the module then did is said too: the stage it raised in, and the exception
    emb = zoo["stages"][0]
    assert r["raised"]["stage"] == emb.index and r["raised"]["out"] == "x"
    assert "IndexError" in r["raised"]["error"] or "index" in r["raised"]["error"].lower()

    out = tmp_path / "r.json"
    p = run_cli("lock", bundle, "--program", zoo["program"], "--weights", zoo["weights"], "-o", str(out))
    assert p.returncode == 1, p.stderr
    assert f"first diverging op: load `tok = load` (line {tok.line}, step 0)" in p.stderr
    res = json.loads(out.read_text())
    assert res["verdict"] == "fail" and res["first_divergence"]["out"] == "tok"


# 2. a module that raises on the program's inputs is a wrong bundle: fail, naming stage and exception

def test_a_gated_delta_head_index_out_of_range_fails_at_its_stage(zoo, tmp_path):
    bundle = _mutated(zoo, tmp_path, "    key = torch.arange(hv) % hk\n", "    key = torch.arange(hv) % hk + 1\n")
    gd = _stage(zoo, "gated delta")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 2)
    assert r["verdict"] == "fail", r["reason"]
    f = r["first_divergence"]
    assert (f["stage"], f["out"], f["op"], f["line"], f["step"]) == (gd.index, "gd", "gated delta", gd.line, 1)
    assert f["raised"].startswith("IndexError: ") and f["max_abs"] is None
    assert r["raised"] == {"step": 1, "stage": gd.index, "out": "gd", "op": "gated delta", "line": gd.line,
                           "in": "the probe pass of step 1", "error": f["raised"]}
    assert r["reason"].startswith(f"the module raised at stage {gd.index} `gd = gated delta` (line {gd.line}) "
                                  "in the probe pass of step 1: IndexError: ")
    assert r["load"]["pass"] and r["worst"]["stage"] == gd.index
    # every stage before it was compared (and agrees); the check stops at the step that raised
    assert [s["stage"] for s in r["stages"]] == list(range(gd.index)) and all(s["pass"] for s in r["stages"])
    assert len(r["steps_detail"]) == 1 and r["steps_detail"][0]["raised"] == f["raised"]

    out = tmp_path / "r.json"
    p = run_cli("lock", bundle, "--program", zoo["program"], "--weights", zoo["weights"], "-o", str(out))
    assert p.returncode == 1, p.stderr
    assert f"FAIL: first diverging op: stage {gd.index} `gd = gated delta` (line {gd.line}, step 1)" in p.stderr
    assert "in the probe pass of step 1: IndexError: " in p.stderr and "Traceback" not in p.stderr
    assert json.loads(out.read_text())["verdict"] == "fail"


def test_an_op_that_diverges_before_the_raise_is_the_first_divergence(zoo, tmp_path):
    bundle = _mutated(zoo, tmp_path, "    return F.silu(g) * u\n", "    return F.silu(g) * u * 1.001\n")
    text = open(os.path.join(bundle, "model.py")).read()
    with open(os.path.join(bundle, "model.py"), "w") as f:
        f.write(text.replace("def gelu_tanh(x):\n", "def gelu_tanh(x):\n    raise RuntimeError('boom')\n"))
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
    sw, ge = _stage(zoo, "swiglu"), _stage(zoo, "gelu")
    assert r["verdict"] == "fail" and r["first_divergence"]["stage"] == sw.index < ge.index
    assert r["first_divergence"]["max_abs"] > 0 and "raised" not in r["first_divergence"]
    assert r["raised"]["stage"] == ge.index and r["raised"]["error"] == "RuntimeError: boom"


def test_a_forward_that_exits_or_is_interrupted(zoo, tmp_path):
    """A bundle whose forward calls sys.exit() is wrong: a fail naming the stage, its RESULT.json
    written (the lock exited 0 and wrote nothing); so is one that raises what no exception of the
    lock's is (GeneratorExit). A KeyboardInterrupt (Ctrl-C) is one line and
    exit 130, never a traceback, and RESULT.json holds no earlier verdict, only the error that the
    lock did not finish. The check runs in a child of its own: a bundle that ends that process
    (os._exit, an exit handler of its own) is an error saying so (exit 2, never 0)."""
    ge = _stage(zoo, "gelu")
    out = tmp_path / "r.json"

    def lock(line, name):
        bundle = _mutated(zoo, tmp_path, "def gelu_tanh(x):\n", f"def gelu_tanh(x):\n    {line}\n", name=name)
        p = run_cli("lock", bundle, "--program", zoo["program"], "--weights", zoo["weights"], "-o", str(out))
        return p, json.loads(out.read_text())
    p, r = lock("raise SystemExit(0)", "exit")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert r["verdict"] == "fail" and r["raised"]["stage"] == ge.index and "SystemExit" in r["raised"]["error"]
    p, r = lock("raise KeyboardInterrupt", "interrupt")
    assert r["verdict"] == "error" and r["reason"].startswith("the lock did not finish"), r
    assert p.returncode == 130 and p.stderr.strip() == "logos lock: interrupted: nothing more was written", p.stderr
    # what no exception of the lock's is (GeneratorExit, a BaseException of its own): the bundle's
    # fault, a fail naming the stage
    p, r = lock("raise GeneratorExit('x')", "genexit")
    assert p.returncode == 1 and r["verdict"] == "fail" and r["raised"]["stage"] == ge.index, r["reason"]
    assert "GeneratorExit: x" in r["raised"]["error"] and "Traceback" not in p.stderr, p.stderr
    # a bundle that ends its process, at once or at its exit: never exit 0, always a verdict
    # written that says so
    for line, name, said in (("os._exit(0)", "gone", "process ended with exit status 0 before its verdict"),
                             ("os._exit(7)", "gone7", "process ended with exit status 7 before its verdict"),
                             ("import atexit; atexit.register(lambda: os._exit(0)); x = x * 1.01", "atexit", None)):
        p, r = lock(line, name)
        if said is None:   # (its exit handler never runs: the verdict, a fail here, stands)
            assert p.returncode == 1 and r["verdict"] == "fail", (p.returncode, r["reason"])
            continue
        assert p.returncode == 2 and r["verdict"] == "error" and said in r["reason"], (p.returncode, r["reason"])
        assert "Traceback" not in p.stderr, p.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child's life is bound to its parent's on Linux")
def test_a_lock_by_hand_ended_by_sigterm_ends_its_check_too(zoo, tmp_path):
    """`logos lock` runs its check in a forked child: a SIGTERM (a CI step's timeout, `kill`) or a
    SIGKILL of the lock leaves no check running on under PID 1."""
    import signal
    import time
    from conftest import ROOT
    bundle = _mutated(zoo, tmp_path, "def gelu_tanh(x):\n", "def gelu_tanh(x):\n    import time; time.sleep(600)\n")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        p = subprocess.Popen([sys.executable, "-m", "emitter", "lock", bundle, "--program", zoo["program"],
                              "--weights", zoo["weights"], "-o", str(tmp_path / "r.json")], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        children = f"/proc/{p.pid}/task/{p.pid}/children"
        child, end = None, time.monotonic() + 120
        while child is None and time.monotonic() < end and p.poll() is None:
            kids = open(children).read().split() if os.path.exists(children) else []
            child = int(kids[0]) if kids else None
            time.sleep(0.1)
        assert child is not None, "the lock forked no child"
        time.sleep(1.0)   # (into the check: the forward sleeps)
        os.kill(p.pid, sig)
        p.wait(timeout=60)
        def running():   # (a zombie of PID 1's until it reaps it: gone all the same)
            try:
                return open(f"/proc/{child}/stat").read().split(") ")[1][0] != "Z"
            except OSError:
                return False
        end = time.monotonic() + 30
        while running() and time.monotonic() < end:
            time.sleep(0.1)
        alive = running()
        if alive:
            os.kill(child, signal.SIGKILL)
        assert not alive, f"the check went on after its lock got {sig.name}"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_module_writing_in_place_into_what_the_probe_handed_it_fails(zoo, tmp_path, dtype):
    """What the probe hands the module is a copy of the VM's value: a module scaling it in place
    (its output, a state before its write-back) is compared with the VM's own values, and fails;
    at float64 the handed tensor was the VM's memory, so the reference moved with the module and
    both passed."""
    for name, old, new, stage in (
            ("out", "        return y\n", "        y.mul_(2)\n        return y\n", "output"),
            ("state", "        self.leaf_S.copy_(S)\n", "        S.mul_(1.5)\n        self.leaf_S.copy_(S)\n",
             "write-back")):
        bundle = _mutated(zoo, tmp_path / dtype, old, new, name=name)
        r = lock_bundle(bundle, zoo["program"], zoo["weights"], dtype, 2)
        assert r["verdict"] == "fail" and r["first_divergence"]["stage"] == stage, (name, r["first_divergence"])


def test_a_stage_that_hands_on_no_tensor_fails_at_that_stage(zoo, tmp_path):
    sig = _stage(zoo, "sigmoid")
    bundle = _mutated(zoo, tmp_path, f"self.tap({sig.index}, torch.sigmoid(att))", f"self.tap({sig.index}, 0.5)")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "fail", r["reason"]
    assert r["first_divergence"]["stage"] == sig.index
    assert r["raised"]["error"] == f"stage {sig.index} returned a float, not a tensor"


@pytest.mark.parametrize("value, what", [
    ("torch.sigmoid(att).to_sparse()", "a sparse_coo float64 tensor on cpu"),
    ("torch.sigmoid(att).to(torch.complex128)", "a strided complex128 tensor on cpu"),
    ("torch.sigmoid(att).to('meta')", "a strided float64 tensor on meta"),
])
def test_a_value_that_is_no_dense_real_tensor_fails_at_its_stage(zoo, tmp_path, value, what):
    """A stage or an output that is a sparse, complex or meta tensor (a complex RoPE left without
    view_as_real) is the bundle's: a fail naming the stage or the output, never an error of the
    lock's own code meeting it."""
    sig = _stage(zoo, "sigmoid")
    bundle = _mutated(zoo, tmp_path, f"self.tap({sig.index}, torch.sigmoid(att))", f"self.tap({sig.index}, {value})")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "fail" and r["first_divergence"]["stage"] == sig.index, r["reason"]
    assert r["raised"]["error"] == f"stage {sig.index} returned {what}, not a dense real one on the CPU"
    out = _mutated(zoo, tmp_path, "        return y\n", f"        return {value.replace('torch.sigmoid(att)', 'y')}\n",
                   name="out")
    r = lock_bundle(out, zoo["program"], zoo["weights"], "float64", 1)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["stage"], f["out"]) == ("output", "y"), r["reason"]
    assert r["reason"] == f"in the probe pass of step 1 the module's forward returned {what}, not a dense real one on the CPU"


@pytest.mark.parametrize("value, what", [
    ("y > 0", "a strided bool tensor on cpu"),
    ("y.to(torch.float8_e4m3fn)", "a strided float8_e4m3fn tensor on cpu"),
    ("torch.nested.nested_tensor([y])", "a nested float64 tensor on cpu"),
])
def test_an_output_no_argmax_reads_fails_at_the_output(zoo, tmp_path, value, what):
    """An output of bools or of 1-byte floats, or a nested tensor, is the bundle's: a fail at the
    output, never the lock's own argmax raising on it."""
    out = _mutated(zoo, tmp_path, "        return y\n", f"        return {value}\n")
    r = lock_bundle(out, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "fail" and r["first_divergence"]["stage"] == "output", r["reason"]
    assert r["reason"] == f"in the probe pass of step 1 the module's forward returned {what}, not a dense real one on the CPU"


def test_a_bundle_that_sets_its_own_thread_count_runs_at_the_checks(zoo, tmp_path):
    """The thread count is the check's (its key's, recorded in its result): a model.py that sets
    another as it is imported runs its forward at the check's all the same."""
    import torch
    seen = tmp_path / "threads.txt"
    bundle = _mutated(zoo, tmp_path, "        return y\n",
                      f"        open({str(seen)!r}, 'a').write(str(torch.get_num_threads()) + '\\n')\n        return y\n")
    with open(os.path.join(bundle, "model.py"), "a") as f:
        f.write("\ntorch.set_num_threads(3)\n")
    before = torch.get_num_threads()
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "pass", r["reason"]
    assert set(seen.read_text().split()) == {str(before)} and torch.get_num_threads() == before


@pytest.mark.parametrize("then", [
    ("def gelu_tanh(x):\n", "def gelu_tanh(x):\n    raise MemoryError('no room')\n"),   # an error by itself
    ("        return y\n", "        return y.to(torch.complex128)\n"),                 # a fail by itself
])
def test_a_wrong_leaf_wins_over_whatever_stops_the_check_after_it(zoo, tmp_path, then):
    """The load stage found `tok` wrong (a fill of 7 for 2): that is the verdict, a fail naming it
    (exit 1), whether the module then runs out of memory or returns what no program's value is."""
    bundle = _mutated(zoo, tmp_path, '"tok": ((0, 2),),', '"tok": ((0, 7),),')
    text = open(os.path.join(bundle, "model.py")).read()
    open(os.path.join(bundle, "model.py"), "w").write(text.replace("row_of(emb, tok, \"tok\")", "row_of(emb, tok % 5, \"tok\")", 1)
                                                      .replace(*then, 1))
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["stage"], f["out"], f["op"], f["step"]) == ("load", "tok", "load", 0), r["reason"]
    assert r["worst"]["stage"] == "load" and r["worst"]["out"] == "tok"
    p = run_cli("lock", bundle, "--program", zoo["program"], "--weights", zoo["weights"], "-o", str(tmp_path / "r.json"))
    assert p.returncode == 1 and "first diverging op: load `tok = load`" in p.stderr, p.stderr


def test_a_loader_that_looks_for_a_file_that_is_not_there_fails_at_load(zoo, tmp_path):
    """A loader after another suffix (X.f32 where the VM read X.f64), or a constructor opening a
    file of its own that is not there, is the bundle's doing: a fail at load, exit 1. A weights
    file the VM read and the loader then cannot open stays an error (not the bundle's doing)."""
    bundle = _mutated(zoo, tmp_path, "    places, _ = weight_places(directory, LEAVES)\n",
                      "    places, _ = weight_places(directory, LEAVES)\n"
                      "    places = {k: (v[0].replace('.f64', '.f32'),) + v[1:] for k, v in places.items()}\n")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["stage"], f["op"]) == ("load", "load_weights"), r["reason"]
    assert "FileNotFoundError" in r["reason"] and ".f32" in r["reason"]
    gone = _mutated(zoo, tmp_path, "    places, _ = weight_places(directory, LEAVES)\n",
                    "    places, _ = weight_places(directory, LEAVES)\n"
                    "    raise FileNotFoundError(2, 'No such file or directory', os.path.join(directory, 'emb.f64'))\n",
                    name="gone")
    r = lock_bundle(gone, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "error" and "emb.f64" in r["reason"], r["reason"]


def test_what_is_not_the_bundles_fault_stays_an_error(zoo, tmp_path):
    """Out of time (the pipeline's deadline, raised by its signal handler while the module runs)
    or out of memory is the run's, not the bundle's: an error, exit 2."""
    from emitter.pipeline.timelimit import deadline
    slow = _mutated(zoo, tmp_path, "def gelu_tanh(x):\n", "def gelu_tanh(x):\n    import time\n    time.sleep(30)\n",
                    name="slow")
    lock_bundle(zoo["bundle"], zoo["program"], zoo["weights"], "float64", 1)   # (imports made first)
    with deadline(1, "the float64 lock check"):
        r = lock_bundle(slow, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "error" and "TimeLimit: the float64 lock check took over 1 s" in r["reason"], r["reason"]
    assert r["first_divergence"] is None and "raised" not in r
    assert r["reason"].startswith("the module was stopped at stage "), r["reason"]   # (it raised nothing)
    spin = _mutated(zoo, tmp_path, "def gelu_tanh(x):\n", "def gelu_tanh(x):\n    while True:\n        pass\n",
                    name="spin")
    got = []

    def in_a_thread():   # (`doit -P thread`: no signal reaches it; the timer's exception does)
        with deadline(1, "the float32 lock check"):
            got.append(lock_bundle(spin, zoo["program"], zoo["weights"], "float32", 1))
    t = threading.Thread(target=in_a_thread, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive() and got, "the limit was not kept in a thread"
    assert got[0]["verdict"] == "error" and "TimeLimit: the float32 lock check took over 1 s" in got[0]["reason"]
    memory = _mutated(zoo, tmp_path, "def gelu_tanh(x):\n", "def gelu_tanh(x):\n    raise MemoryError('no room')\n",
                      name="memory")
    r = lock_bundle(memory, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "error" and "MemoryError: no room" in r["reason"]
    out = tmp_path / "r.json"
    p = run_cli("lock", memory, "--program", zoo["program"], "--weights", zoo["weights"], "-o", str(out))
    assert p.returncode == 2 and "MemoryError: no room" in p.stderr
    refused = _mutated(zoo, tmp_path, "def gelu_tanh(x):\n", "def gelu_tanh(x):\n    raise RuntimeError("
                       "\"DefaultCPUAllocator: can't allocate memory: you tried to allocate 65536 bytes.\")\n",
                       name="refused")   # torch's allocator says so with a RuntimeError: the same
    r = lock_bundle(refused, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "error" and "can't allocate memory" in r["reason"] and "raised" not in r, r["reason"]


def test_the_cyclic_collector_rests_while_a_check_runs_and_is_given_back(zoo, tmp_path):
    """The process's objects (torch's, a driver's tasks) are not rescanned by a check's full
    collections: the collector is off while the bundle runs, on again after, whether the check
    passed or raised, and still off after where the caller had turned it off."""
    import gc
    log = tmp_path / "collector"
    seen = _mutated(zoo, tmp_path, "def gelu_tanh(x):\n", "def gelu_tanh(x):\n    with open("
                    f"{str(log)!r}, 'a') as f:\n        f.write(str(int(__import__('gc').isenabled())))\n",
                    name="seen")
    assert gc.isenabled()
    r = lock_bundle(seen, zoo["program"], zoo["weights"], "float32", 2)
    assert r["verdict"] == "pass", r["reason"]
    assert set(log.read_text()) == {"0"} and gc.isenabled()
    raising = _mutated(zoo, tmp_path, "def gelu_tanh(x):\n", "def gelu_tanh(x):\n    raise RuntimeError('no')\n",
                       name="raising")
    r = lock_bundle(raising, zoo["program"], zoo["weights"], "float32", 1)
    assert r["verdict"] == "fail" and "RuntimeError: no" in r["reason"] and gc.isenabled()
    with pytest.raises(ValueError):   # (refused before the check starts: the collector as it was)
        lock_bundle(seen, zoo["program"], zoo["weights"], "float32", 1, atol="1e-3x")
    assert gc.isenabled()
    gc.disable()
    try:
        lock_bundle(seen, zoo["program"], zoo["weights"], "float32", 1)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_checks_at_once_on_threads_give_the_collector_back_when_the_last_ends():
    """Two checks on threads, the second starting while the first runs and ending after it: the
    collector stays off until the last ends, then is on again (each check looking at the
    collector for itself, the first turned it on under the second, and the second, having found
    it off, left it off for good)."""
    import gc
    from emitter.verify import heap
    a_paused, b_paused, a_done, seen = threading.Event(), threading.Event(), threading.Event(), []

    def first():
        heap.pause()
        a_paused.set()
        b_paused.wait(30)
        heap.resume()
        a_done.set()

    def second():
        a_paused.wait(30)
        heap.pause()
        b_paused.set()
        a_done.wait(30)
        seen.append(gc.isenabled())
        heap.resume()
    try:
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert seen == [False] and gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("huge", ["torch.empty(1 << 50)", "np.empty(1 << 50)"])
def test_an_allocation_no_machine_holds_is_the_bundles_fault(zoo, tmp_path, huge):
    """One allocation of more than the machine holds and four times every tensor of the program
    (a broadcast gone wrong) is the bundle's own: a fail naming the stage, not an error."""
    gelu = _stage(zoo, "gelu")
    bundle = _mutated(zoo, tmp_path, "def gelu_tanh(x):\n", f"def gelu_tanh(x):\n    {huge}\n")
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 1)
    assert r["verdict"] == "fail", r["reason"]
    assert r["first_divergence"]["stage"] == gelu.index and "allocate" in r["raised"]["error"]


# 3. the code that runs is the code that was hashed

def test_an_edit_that_keeps_size_and_mtime_runs_the_new_code(zoo, tmp_path):
    """model.py is read once, hashed, and those bytes run: no bytecode cache is written (here, with
    Python writing bytecode) nor trusted (a .pyc such as `import model` leaves, which Python takes
    while its source keeps its size and mtime)."""
    bundle = tmp_path / "bundle"
    shutil.copytree(zoo["bundle"], bundle)
    model = bundle / "model.py"
    out = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def lock():
        return subprocess.run([sys.executable, "-m", "emitter", "lock", str(bundle), "--program", zoo["program"],
                               "--weights", zoo["weights"], "-o", str(out)], capture_output=True, text=True,
                              cwd=ROOT, env={**env, "PYTHONPATH": ROOT})
    p = lock()
    assert p.returncode == 0, p.stderr
    first = json.loads(out.read_text())
    assert first["hashes"]["bundle"]["model.py"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert not (bundle / "__pycache__").exists()                    # the lock wrote no bytecode
    py_compile.compile(str(model), cfile=importlib.util.cache_from_source(str(model)), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    st = os.stat(model)
    old = model.read_bytes()
    new = old.replace(b"    return F.silu(g) * u\n", b"    return F.silu(g) * g\n")   # swiglu of g and g
    assert new != old and len(new) == len(old)
    model.write_bytes(new)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(model).st_size, os.stat(model).st_mtime_ns) == (st.st_size, st.st_mtime_ns)

    p = lock()
    assert p.returncode == 1 and "sw = swiglu" in p.stderr, p.stdout + p.stderr
    second = json.loads(out.read_text())
    assert second["hashes"]["bundle"]["model.py"] == hashlib.sha256(new).hexdigest() != \
        first["hashes"]["bundle"]["model.py"]
    r = lock_bundle(str(bundle), zoo["program"], zoo["weights"])     # in this process, the same
    assert r["verdict"] == "fail" and r["first_divergence"]["op"] == "swiglu"
    assert r["hashes"]["bundle"]["model.py"] == hashlib.sha256(new).hexdigest()


def test_compiled_code_is_kept_by_its_bytes_and_an_edit_compiles_anew(zoo, tmp_path, monkeypatch):
    """At a zoo's root, model.py's compiled code is kept in build/.compiled/ by the sha256 of its
    path and bytes (and -O): a later process runs it without compiling; an edit that keeps size
    and mtime compiles anew and runs; a kept entry whose code is not what its digest names (a
    byte changed, garbage, another entry's code in its place) is compiled over, never run, as is
    one in a folder others may write; a path that is no UTF-8 is kept too."""
    from emitter import fingerprint
    from emitter.verify import bundle_module, compiled_store
    bundle = tmp_path / "bundle"
    shutil.copytree(zoo["bundle"], bundle)
    model, kept = bundle / "model.py", tmp_path / "build" / ".compiled"
    (tmp_path / "build").mkdir()
    compiled, real = [], compile
    monkeypatch.setattr(bundle_module, "compile", lambda *a, **k: compiled.append(a[1]) or real(*a, **k),
                        raising=False)
    monkeypatch.setattr(compiled_store, "FILES_KEPT", 1)

    def lock(at=bundle):   # (as a fresh process would: nothing compiled in memory)
        bundle_module._CODE.clear()
        compiled.clear()
        return lock_bundle(str(at), zoo["program"], zoo["weights"])
    fingerprint.bind(str(tmp_path / "build" / ".fingerprints.json"))
    try:
        assert lock()["verdict"] == "pass" and compiled == [str(model)] and len(os.listdir(kept)) == 1
        assert os.listdir(kept)[0].endswith(f"-o{sys.flags.optimize}")
        assert lock()["verdict"] == "pass" and compiled == []
        st, original = os.stat(model), model.read_bytes()
        model.write_bytes(original.replace(b"    return F.silu(g) * u\n", b"    return F.silu(g) * g\n"))
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
        r = lock()
        assert r["verdict"] == "fail" and r["first_divergence"]["op"] == "swiglu" and compiled == [str(model)]
        assert len(os.listdir(kept)) == 1                                    # (the most recently used kept)
        (entry,) = [kept / f for f in os.listdir(kept)]
        data = entry.read_bytes()
        assert b"silu" in data[32:]
        entry.write_bytes(data[:32] + data[32:].replace(b"silu", b"relu"))   # still marshal: not run
        r = lock()
        assert r["verdict"] == "fail" and r["first_divergence"]["op"] == "swiglu" and compiled == [str(model)]
        assert lock()["verdict"] == "fail" and compiled == []
        entry.write_bytes(b"\xe3 not marshal")
        assert lock()["verdict"] == "fail" and compiled == [str(model)]
        os.chmod(kept, 0o777)                       # a folder others may write: nothing run from it
        assert lock()["verdict"] == "fail" and compiled == [str(model)]
        os.chmod(kept, 0o755)
        assert lock()["verdict"] == "fail" and compiled == []
        edited = entry.read_bytes()          # the edit's entry put where the original's goes: not run
        model.write_bytes(original)
        with open(compiled_store.entry(str(model), hashlib.sha256(original).hexdigest()), "wb") as f:
            f.write(edited)
        assert lock()["verdict"] == "pass" and compiled == [str(model)]
        odd = tmp_path / os.fsdecode(b"m\xffx")
        shutil.copytree(zoo["bundle"], odd)
        assert lock(odd)["verdict"] == "pass" and lock(odd)["verdict"] == "pass" and compiled == []
    finally:
        fingerprint.bind(None)
        bundle_module._CODE.clear()


# 4. the lock is a library: golden/ comes back as data, its callers write it

def test_lock_bundle_hands_golden_back_and_writes_nothing(zoo, tmp_path):
    import numpy as np
    from emitter.verify import vm
    from emitter.verify.tolerances import tolerance
    bundle = tmp_path / "bundle"
    shutil.copytree(zoo["bundle"], bundle)
    before = sorted(os.listdir(bundle))
    files = {}
    tol = {"float64": tolerance("float64"), "float32": tolerance("float32")}
    r = lock_bundle(str(bundle), zoo["program"], zoo["weights"], "float64", 2, golden=tol, golden_files=files)
    assert r["verdict"] == "pass" and sorted(os.listdir(bundle)) == before     # no golden/ written
    assert list(files) == ["output.1.f64", "output.2.f64", "golden.json"]
    assert all(isinstance(v, bytes) for v in files.values())
    record = json.loads(files["golden.json"])
    assert record["steps"] == 2 and record["tolerances"] == tol and record["output"] == "y"
    assert os.path.normpath(os.path.join(str(bundle), record["weights"])) == os.path.normpath(zoo["weights"])
    program = read_file(zoo["program"])
    traces = vm.run(program, vm.load_leaves(program, zoo["weights"]).values, steps=2)
    for step, trace in enumerate(traces, 1):
        assert files[f"output.{step}.f64"] == np.ascontiguousarray(trace.output, dtype="<f8").tobytes()
    # nothing asked, nothing made; a check that did not run through hands back none
    assert lock_bundle(str(bundle), zoo["program"], zoo["weights"], golden=tol)["verdict"] == "pass"
    assert sorted(os.listdir(bundle)) == before
    raising = _mutated(zoo, tmp_path, "def gelu_tanh(x):\n", "def gelu_tanh(x):\n    raise RuntimeError('boom')\n",
                       name="raising")
    files = {}
    assert lock_bundle(raising, zoo["program"], zoo["weights"], golden=tol, golden_files=files)["verdict"] == "fail"
    assert files == {}


@pytest.mark.parametrize("remote", [False, True])
def test_run_check_returns_golden_and_swaps_no_class(zoo, tmp_path, remote):
    """run_check hands the golden/ files back in its result, inline as on a worker, with the
    lock's own Golden class (no class swapped at run time) and nothing written into the bundle."""
    from emitter.pipeline.check_worker import run_check
    from emitter.verify import golden
    bundle = tmp_path / "bundle"
    shutil.copytree(zoo["bundle"], bundle)
    cls = golden.Golden
    tol = {"float64": {"abs": 1e-9, "rel": 1e-9}}
    job = {"root": str(zoo["dir"]), "bundle": str(bundle), "source": zoo["program"], "weights": zoo["weights"],
           "golden": tol, "thread_env": {}, "remote": remote, "key": "k",
           "executor": "dask:local" if remote else "inline",
           "record": check_record()}
    env = dict(os.environ)
    try:
        o = run_check(job)
    finally:   # a remote check sets the driver's pool variables in its process
        os.environ.clear()
        os.environ.update(env)
    assert golden.Golden is cls and not hasattr(cls, "_to_driver")
    assert o["result"]["verdict"] == "pass" and set(o) == {"result", "golden", "execution"}
    assert sorted(o["golden"]) == ["golden.json", "output.1.f64"]
    assert json.loads(o["golden"]["golden.json"])["tolerances"] == tol
    assert not (bundle / "golden").exists()
    assert run_check({**job, "golden": None})["golden"] is None


def test_a_check_runs_with_what_its_record_says_made_into_arguments_by_lock_code(zoo):
    """A check's tolerance, steps, dtype and limits reach the lock from its key's record, through
    lock code (every lock key's digest holds the file that does it): the pipeline's driver code,
    which is in no lock key, does not choose what a verdict is computed with."""
    import inspect
    from emitter.pipeline import check_worker, digests
    here = os.path.relpath(inspect.getsourcefile(check_worker.lock_arguments), digests.PACKAGE)
    assert here.replace(os.sep, "/") in digests.code_files("lock")
    job = {"root": str(zoo["dir"]), "bundle": zoo["bundle"], "source": zoo["program"], "weights": zoo["weights"],
           "golden": None, "record": {**check_record("float32", steps=2), "tolerance": {"abs": 0.5, "rel": 0.25}}}
    r = check_worker.run_check(job)["result"]
    assert (r["verdict"], r["dtype"], r["steps"], r["tolerance"]) == ("pass", "float32", 2, {"abs": 0.5, "rel": 0.25})
    small = {**job["record"], "config": {**job["record"]["config"], "limits": {"tensor_bytes": 64}}}
    r = check_worker.run_check({**job, "record": small})["result"]
    assert r["verdict"] == "error" and "over the limit of 64 bytes" in r["reason"], r["reason"]
    # a config's limit past the machine's memory: held to the memory (no MemoryError, no OOM)
    from emitter.verify.memory import memory_bytes
    huge = {**job["record"], "config": {**job["record"]["config"], "limits": {"tensor_bytes": 1 << 60}}}
    assert check_worker.lock_arguments(huge)["max_tensor_bytes"] == memory_bytes()
    assert check_worker.lock_arguments(job["record"])["max_tensor_bytes"] == memory_bytes() // 2


VIEW_OF_A_STATE = """Let T be a 2 by 2 tensor of Real.
Set item 1 of T to 1.
Set item 2 of T to 2.
Set item 3 of T to 3.
Set item 4 of T to 4.
Let r be a 1 by 2 tensor of Real.
Set item 1 of r to 10.
Set item 2 of r to 20.
Let s be silu of r.
Let y be transpose of T.
Set row 0 of T to s.
"""
VIEWS_ALONE = """Let x be a 1 by 2 tensor of Real.
Set item 1 of x to 1.
Let y be transpose of x.
"""


@pytest.mark.parametrize("source", [VIEW_OF_A_STATE, VIEWS_ALONE])
def test_an_output_that_is_a_view_is_what_the_step_computed(tmp_path, source):
    """An output that views a state is copied before the write-back (after it, the copy held the
    next step's state: (9.9995, 3, 20, 4) where the VM says (1, 3, 2, 4)); a program whose every
    op is a view has its golden/ (its output's stage summarised), not an IndexError."""
    import torch
    from conftest import load_model
    path = tmp_path / "p.logos"
    path.write_text(source)
    bundle = emit_bundle(source, tmp_path / "b")
    for dtype in ("float64", "float32"):
        files = {}
        r = lock_bundle(bundle, str(path), None, dtype, 2, golden={dtype: None}, golden_files=files)
        assert r["verdict"] == "pass", r.get("reason") or r["first_divergence"]
        assert sorted(files) == ["golden.json", "output.1.f64", "output.2.f64"]
    model = load_model(bundle).LogosModule(dtype=torch.float64)
    first = model().reshape(-1).tolist()
    assert first == ([1.0, 3.0, 2.0, 4.0] if "T" in source else [1.0, 0.0])


def test_the_lock_command_writes_golden_beside_the_bundle_for_compile_py_test(zoo, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(zoo["bundle"], bundle)
    out = tmp_path / "r.json"
    p = run_cli("lock", str(bundle), "--program", zoo["program"], "--weights", zoo["weights"], "--steps", "2",
                "--dtype", "float32", "-o", str(out))
    assert p.returncode == 0, p.stderr
    record = json.loads((bundle / "golden" / "golden.json").read_text())
    # the tolerance applied, and the other dtype compile.py test runs at its default
    assert record["steps"] == 2 and record["tolerances"] == {"float32": {"abs": 1e-4, "rel": 1e-3},
                                                             "float64": {"abs": 1e-9, "rel": 1e-9}}
    assert sorted(os.listdir(bundle / "golden")) == ["golden.json", "output.1.f64", "output.2.f64"]
    p = subprocess.run([sys.executable, str(bundle / "compile.py"), "test", "--dtype", "float32"],
                       capture_output=True, text=True, cwd=str(tmp_path))
    assert p.returncode == 0 and "PASS" in p.stdout and "2 step(s)" in p.stdout, p.stdout + p.stderr


def test_a_module_raising_after_its_last_stage_names_the_output_where_nothing_is_written_back(tmp_path):
    """A program with no states (mlp): a forward that raises past its last stage fails at the
    output, its line the output's, not at a write-back the program does not have."""
    program = read_file(os.path.join(ROOT, "programs/mlp.logos"))
    bundle = emit_bundle(program.source, tmp_path / "b")
    text = open(os.path.join(bundle, "model.py")).read()
    assert text.count("        return Z\n") == 1
    open(os.path.join(bundle, "model.py"), "w").write(text.replace("        return Z\n",
                                                                   "        raise RuntimeError('late')\n"))
    r = lock_bundle(bundle, os.path.join(ROOT, "programs/mlp.logos"), os.path.join(ROOT, "weights/mlp"), "float64", 1)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["stage"], f["out"], f["line"]) == ("output", "Z", program.bound_at["Z"]), f


def test_checks_at_once_in_threads_keep_their_thread_count_until_the_last_ends():
    """`doit -P thread` runs checks at once in one process, whose BLAS thread count is the
    process's: the first check to end put it back while another still computed, at a count its
    key does not name. Now the last to end puts it back."""
    import torch
    from threadpoolctl import threadpool_info
    from emitter.verify.threads import thread_limits

    def counts():   # torch's pool and the BLAS's, both the process's
        return [torch.get_num_threads()] + [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    before = counts()
    inside, ended, seen = threading.Event(), threading.Event(), []

    def other():
        with thread_limits(1):
            inside.set()
            ended.wait(60)
            seen.append(counts())
    t = threading.Thread(target=other)
    with thread_limits(1):
        t.start()
        assert inside.wait(60)
    ended.set()    # this check has ended; the other computes on
    t.join(60)
    assert seen == [[1] * len(before)], (seen, before)


def test_a_thread_count_that_fails_to_set_leaves_the_next_check_free():
    """torch refusing a count (0) inside the block is undone like any end: the next check, at
    another count, is not kept waiting for a check that is gone."""
    import torch
    from emitter.verify.threads import thread_limits
    with pytest.raises(RuntimeError):
        with thread_limits(0):
            pass
    done = []

    def other():
        with thread_limits(2) as set_to:
            done.append(set_to["threads"])
    t = threading.Thread(target=other)
    t.start()
    t.join(60)
    assert done == [2] and torch.get_num_threads() >= 1


def test_a_bundle_that_writes_into_its_weight_files_fails_naming_the_file(zoo, tmp_path):
    """A loader that maps the weight files writable and a forward that writes through the map
    change the user's files while the check runs: the bundle's doing (it holds them open to
    write), a fail naming the file and its leaf, not an error to run again (which would find the
    file changed again, forever)."""
    program = read_file(zoo["program"])
    w = next(n for n in program.leaves if program.roles[n] == "weight"
             and os.path.exists(os.path.join(zoo["weights"], n + ".f64")))
    weights = tmp_path / "w"
    shutil.copytree(zoo["weights"], weights)
    bundle = _mutated(zoo, tmp_path, "        return y\n", f"        self.leaf_{w}.add_(1.0)\n        return y\n")
    text = open(os.path.join(bundle, "model.py")).read()
    assert text.count('mode="c")') == 1
    open(os.path.join(bundle, "model.py"), "w").write(text.replace('mode="c")', 'mode="r+")'))
    r = lock_bundle(bundle, zoo["program"], str(weights), "float64", 1)
    assert r["verdict"] == "fail", r["reason"]
    assert f"wrote into the weights file {w}.f64 (`{w}`)" in r["reason"]
    assert r["first_divergence"]["stage"] == "load" and r["stale_weights"] == [f"{w}.f64"]
    out = tmp_path / "r.json"
    shutil.rmtree(weights)
    shutil.copytree(zoo["weights"], weights)
    p = run_cli("lock", bundle, "--program", zoo["program"], "--weights", str(weights), "-o", str(out))
    assert p.returncode == 1 and f"wrote into the weights file {w}.f64" in p.stderr, p.stderr
