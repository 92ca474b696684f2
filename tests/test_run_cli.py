"""`python -m emitter run` beyond its output: `--stage NAME=PATH` and `--state-out DIR`, through the
command line, on a toy greedy decode loop (token and position written back, a cache written at
row pos). A decode resumed from a state directory is the decode run in one go, and a token fed
by replacing the state's file is what the VM computes from that token (a teacher-forced step)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import run_cli
from emitter.language.reader import read_program
from emitter.verify import vm

LOOP = """# a toy decode loop
Let tok be a 1 by 1 tensor of Int.
Let pos be a 1 by 1 tensor of Int.
Let one be a 1 by 1 tensor of Int.
Set item 1 of one to 1.
Let emb be a 4 by 3 tensor of Real.
Let W be a 3 by 4 tensor of Real.
Let K be a 6 by 3 tensor of Real.
Let pn be pos plus one.
Let x be row tok of emb.
Set row pos of K to x.
Let kt be transpose of K.
Let s be x matmul kt.
Let logits be x matmul W.
Let nxt be argmax of logits.
Set row 0 of tok to nxt.
Set row 0 of pos to pn.
"""


@pytest.fixture
def loop(tmp_path):
    """The program's path, its Program, and a weights directory (emb as .f32, W as .f64)."""
    path = tmp_path / "loop.logos"
    path.write_text(LOOP)
    weights = tmp_path / "w"
    weights.mkdir()
    rng = np.random.default_rng(3)
    rng.standard_normal((4, 3)).astype("<f4").tofile(weights / "emb.f32")
    rng.standard_normal((3, 4)).astype("<f8").tofile(weights / "W.f64")
    np.array([2.0], dtype="<f4").tofile(weights / "tok.f32")
    return str(path), read_program(LOOP), str(weights)


def run(*args):
    return run_cli("run", *map(str, args))


def f64(path):
    return np.fromfile(path, dtype="<f8")


def vm_steps(program, values, steps):
    """The VM's traces over `steps` steps, stages kept."""
    return vm.run(program, values, steps=steps, keep_stages=True)


def stage(program, name):
    return [st.out for st in program.stages].index(name)


def test_stage_writes_the_named_stages_at_the_last_step(loop, tmp_path):
    path, program, weights = loop
    done = run(path, "--weights", weights, "--steps", 3, "--out", tmp_path / "o.f64",
               "--stage", f"logits={tmp_path / 'l.f64'}", "--stage", f"s={tmp_path / 's.f64'}")
    assert done.returncode == 0, done.stderr
    traces = vm_steps(program, vm.load_leaves(program, weights).values, 3)
    last = traces[-1].stages
    assert np.array_equal(f64(tmp_path / "l.f64"), last[stage(program, "logits")].reshape(-1))
    assert np.array_equal(f64(tmp_path / "s.f64"), last[stage(program, "s")].reshape(-1))
    assert np.array_equal(f64(tmp_path / "o.f64"), traces[-1].output.reshape(-1))
    # the steps differ: the stage is the last step's, not the first's
    assert not np.array_equal(last[stage(program, "s")], traces[0].stages[stage(program, "s")])


@pytest.mark.parametrize("request_, needle", [
    ("nope={}", "has no stage `nope`"),
    ("K={}", "has no stage `K`"),          # a state written by `Set row` binds no stage
    ("logits", "expected NAME=PATH"),
    ("logits=", "expected NAME=PATH"),
    ("logits={}/../o.f64", "named for two outputs"),   # (--out's file: the last written would stand)
])
def test_a_bad_stage_request_exits_2_and_writes_nothing(loop, tmp_path, request_, needle):
    path, _, weights = loop
    done = run(path, "--weights", weights, "--out", tmp_path / "o.f64",
               "--stage", request_.format(tmp_path / "x.f64" if "/.." not in request_ else tmp_path / "d"))
    assert done.returncode == 2
    assert needle in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "o.f64").exists() and not (tmp_path / "x.f64").exists()


def test_state_out_resumes_the_decode(loop, tmp_path):
    path, program, weights = loop
    state = tmp_path / "state"
    done = run(path, "--weights", weights, "--steps", 2, "--out", tmp_path / "a.f64",
               "--state-out", state)
    assert done.returncode == 0, done.stderr
    # every leaf read from a file, as it was (float32 stays float32), and every state as .f64;
    # the filled constant keeps its declared value and gets no file
    assert sorted(os.listdir(state)) == ["K.f64", "W.f64", "emb.f32", "pos.f64", "tok.f64"]
    assert np.array_equal(np.fromfile(state / "emb.f32", "<f4"), np.fromfile(f"{weights}/emb.f32", "<f4"))
    assert f64(state / "pos.f64").tolist() == [2.0]

    done = run(path, "--weights", state, "--steps", 3, "--out", tmp_path / "b.f64",
               "--stage", f"logits={tmp_path / 'l.f64'}")
    assert done.returncode == 0, done.stderr
    whole = vm_steps(program, vm.load_leaves(program, weights).values, 5)
    assert np.array_equal(f64(tmp_path / "b.f64"), whole[-1].output.reshape(-1))
    assert np.array_equal(f64(tmp_path / "l.f64"), whole[-1].stages[stage(program, "logits")].reshape(-1))


def test_a_token_fed_through_the_state_file_is_a_teacher_forced_step(loop, tmp_path):
    path, program, weights = loop
    state = tmp_path / "state"
    assert run(path, "--weights", weights, "--out", tmp_path / "a.f64", "--state-out", state).returncode == 0
    forced = 3.0
    np.array([forced]).astype("<f8").tofile(state / "tok.f64")
    done = run(path, "--weights", state, "--out", tmp_path / "b.f64",
               "--stage", f"logits={tmp_path / 'l.f64'}", "--state-out", state)   # in place
    assert done.returncode == 0, done.stderr

    values = vm.load_leaves(program, weights).values
    first = vm.step(program, values)
    after = {**values, **first.states, "tok": np.array([[forced]])}
    second = vm.step(program, after)
    assert np.array_equal(f64(tmp_path / "l.f64"), second.stages[stage(program, "logits")].reshape(-1))
    assert sorted(os.listdir(state)) == ["K.f64", "W.f64", "emb.f32", "pos.f64", "tok.f64"]
    for name, value in second.states.items():
        assert np.array_equal(f64(state / f"{name}.f64"), value.reshape(-1)), name
    assert not [f for f in os.listdir(state) if f.startswith(".")], "a temporary file was left behind"


def test_the_logos_script_takes_them_too(loop, tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "logos")
    if not os.path.exists(script):
        pytest.skip("the `logos` console script is not installed (pip install -e .)")
    path, program, weights = loop
    done = subprocess.run([script, "run", path, "--weights", weights, "--steps", "2", "--out",
                           str(tmp_path / "o.f64"), "--stage", f"logits={tmp_path / 'l.f64'}"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    traces = vm_steps(program, vm.load_leaves(program, weights).values, 2)
    assert np.array_equal(f64(tmp_path / "l.f64"), traces[-1].stages[stage(program, "logits")].reshape(-1))


def test_run_out_of_memory_or_a_bad_step_count_is_one_line(tmp_path):
    """A program too big for the memory at hand was a numpy traceback; `--steps abc` named
    argparse's type function."""
    import resource
    prog = tmp_path / "big.logos"
    prog.write_text("Let x be a 40000 by 40000 tensor of Real.\nSet item 1 of x to 1.\n"
                    "Let y be rmsnorm of x.\n")

    def capped():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    r = subprocess.run([sys.executable, "-m", "emitter", "run", str(prog), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, preexec_fn=capped,
                       env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))})
    assert r.returncode == 2 and r.stderr.strip() == \
        f"{prog}: could not run: out of memory (its tensors take 23.8 GiB in float64)", r.stderr
    assert not (tmp_path / "o").exists()
    r = run_cli("run", str(prog), "--out", str(tmp_path / "o"), "--steps", "abc")
    assert r.returncode == 2 and "--steps: must be a whole number of at least 1, got 'abc'" in r.stderr


def test_an_output_named_as_a_fifo_or_a_link_is_written_into_never_replaced(loop, tmp_path):
    """`--out`, `--stage` and `lock -o` named as a FIFO (a terminal, /dev/stdout: anything that is
    no regular file) are written into as they are, never renamed over; a link keeps being a link
    and its target is written whole."""
    import stat
    import threading
    path, program, weights = loop
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    (tmp_path / "target.f64").write_bytes(b"old")
    os.symlink(tmp_path / "target.f64", tmp_path / "link.f64")
    done = run(path, "--weights", weights, "--out", fifo, "--stage", f"logits={tmp_path / 'link.f64'}")
    reader.join(60)
    assert done.returncode == 0, done.stderr
    want = vm_steps(program, vm.load_leaves(program, weights).values, 1)[-1]
    assert got and np.array_equal(np.frombuffer(got[0], "<f8"), want.output.reshape(-1))
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.path.islink(tmp_path / "link.f64")
    assert np.array_equal(f64(tmp_path / "target.f64"), want.stages[stage(program, "logits")].reshape(-1))
    from emitter.sambaflow.emit import emit_program, write_bundle
    write_bundle(emit_program(program), str(tmp_path / "b"))
    got.clear()
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    done = run_cli("lock", str(tmp_path / "b"), "--program", path, "--weights", weights, "-o", str(fifo))
    reader.join(120)
    assert done.returncode == 0, done.stderr
    import json
    assert got and json.loads(got[0])["verdict"] == "pass" and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    os.symlink(tmp_path / "nowhere" / "r.json", tmp_path / "r.json")   # said before the lock runs
    done = run_cli("lock", str(tmp_path / "b"), "--program", path, "--weights", weights, "-o", str(tmp_path / "r.json"))
    assert done.returncode == 2 and f"{tmp_path / 'nowhere'} is not a folder" in done.stderr, done.stderr


def test_a_bundle_emitted_by_hand_for_bfloat16_is_locked_at_bfloat16(tmp_path):
    """`logos emit --bfloat16` writes the precision policy a bfloat16 module follows (PRECISION):
    `logos lock --dtype bfloat16` takes that bundle, and refuses a plain one naming the option."""
    from conftest import ROOT
    program, weights = os.path.join(ROOT, "programs", "mlp.logos"), os.path.join(ROOT, "weights", "mlp")
    assert run_cli("emit", program, "-o", str(tmp_path / "bf"), "--bfloat16").returncode == 0
    assert run_cli("emit", program, "-o", str(tmp_path / "plain")).returncode == 0
    assert "PRECISION = {\n" in (tmp_path / "bf" / "model.py").read_text()
    assert "PRECISION = {}" in (tmp_path / "plain" / "model.py").read_text()
    done = run_cli("lock", str(tmp_path / "bf"), "--program", program, "--weights", weights, "--dtype", "bfloat16",
                   "-o", str(tmp_path / "r.json"))
    assert done.returncode == 0 and "PASS" in done.stdout, done.stdout + done.stderr
    done = run_cli("lock", str(tmp_path / "plain"), "--program", program, "--weights", weights, "--dtype", "bfloat16",
                   "-o", str(tmp_path / "r2.json"))
    assert done.returncode == 2 and "`logos emit --bfloat16`" in done.stdout + done.stderr, done.stdout + done.stderr
    for args, said in (((), "--precision is a bfloat16 policy: give --bfloat16 with it"),
                       (("--bfloat16",), "--precision: `nosuch` is not an op")):
        done = run_cli("emit", program, "-o", str(tmp_path / "x"), "--precision", "nosuch=fp32", *args)
        assert done.returncode == 2 and said in done.stderr and not (tmp_path / "x").exists(), done.stderr


def test_output_into_a_pipe_its_reader_closed_ends_quietly():
    """`logos check --forms | head -1`: the reader goes, the command ends as a shell's tools do
    (status 141, 128 + SIGPIPE), no `Broken pipe` line, no traceback."""
    from conftest import ROOT
    code = ("import os, sys\nr, w = os.pipe()\nos.close(r)\nos.dup2(w, 1)\n"
            "from emitter.cli import main\nsys.exit(main(['check', '--forms']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 141 and done.stderr == "", done.stderr


def test_state_out_of_a_program_with_no_state_or_file_is_a_folder_to_resume_from(tmp_path):
    """A program of declared values and no state writes no file to --state-out, yet the folder is
    made: `run --weights DIR` from it runs as the first did (it said the folder did not exist)."""
    path = tmp_path / "hello.logos"
    path.write_text("Let x be a 1 by 2 tensor of Real.\nSet item 1 of x to 3.\nSet item 2 of x to 4.\n"
                    "Let y be rmsnorm of x.\n")
    state = tmp_path / "state"
    done = run(path, "--out", tmp_path / "a.f64", "--state-out", state)
    assert done.returncode == 0 and os.path.isdir(state) and os.listdir(state) == [], done.stderr
    again = run(path, "--weights", state, "--out", tmp_path / "b.f64")
    assert again.returncode == 0, again.stderr
    assert np.array_equal(f64(tmp_path / "a.f64"), f64(tmp_path / "b.f64"))
