"""The hand-written programs in programs/ (one per op family) on the VM, against NumPy written here
from docs/SUGAR.md — never by calling emitter.ops. Weights are read straight from weights/NAME/*.f64."""

import math
import os

import numpy as np
import pytest

from emitter.verify import vm
from emitter.ops import OPS
from emitter.language.reader import read_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ("mlp", "norms", "full_attention", "embedding", "rope_attention", "delta", "moe")
STEPS = {"embedding": 2, "rope_attention": 2, "delta": 2}
EPS = 1e-6
TOL = 1e-12


def weights(name, **shapes):
    """The named .f64 files of weights/NAME, with the shapes the reference expects."""
    out = {}
    for var, shape in shapes.items():
        flat = np.fromfile(os.path.join(ROOT, "weights", name, f"{var}.f64"), dtype="<f8")
        assert flat.size == shape[0] * shape[1], var
        out[var] = flat.reshape(shape)
    return out


def run_vm(name, keep_stages=False):
    program = read_file(os.path.join(ROOT, "programs", f"{name}.logos"))
    leaves = vm.load_leaves(program, os.path.join(ROOT, "weights", name))
    assert leaves.unmatched == []
    return program, vm.run(program, leaves.values, steps=STEPS.get(name, 1), keep_stages=keep_stages)


# ── plain NumPy from docs/SUGAR.md ─────────────────────────────────────────────────────────────────

def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def softmax_rows(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rms(v):
    return v / np.sqrt(np.mean(v * v) + EPS)


# ── the three-plus independent checks ────────────────────────────────────────────────────────────

def test_mlp():
    w = weights("mlp", X=(2, 8), W1=(8, 16), b1=(1, 16), W2=(16, 8), b2=(1, 8), Wg=(8, 12),
                Wu=(8, 12), Wd=(12, 8))
    y = np.zeros((2, 8))
    for r in range(2):                                    # token by token
        x = w["X"][r]
        z = x @ w["W1"] + w["b1"][0]
        h = gelu_tanh(z) + gelu_erf(z)
        yr = x + h @ w["W2"] + w["b2"][0]
        g, u = yr @ w["Wg"], yr @ w["Wu"]
        y[r] = (2.0 * silu(g) * u) @ w["Wd"]             # swiglu and silu·u are the same thing
    _, traces = run_vm("mlp")
    assert traces[0].output.shape == (2, 8)
    np.testing.assert_allclose(traces[0].output, y, rtol=0, atol=TOL)


def test_norms():
    w = weights("norms", X=(2, 8), R=(2, 8), W=(1, 8), Wh=(1, 4), Lw=(1, 8), Lb=(1, 8))
    x, res = w["X"], w["R"]
    total = np.zeros((2, 8))
    for r in range(2):
        total[r] += rms(x[r])                                         # rmsnorm of X
        total[r] += rms(x[r]) * w["W"][0]                             # with weight W
        total[r] += rms(x[r] + res[r]) * w["W"][0]                    # plus R with weight W
        total[r] += x[r] / np.sqrt(np.sum(x[r] ** 2) + EPS)            # l2norm of X
        m = x[r].mean()
        total[r] += (x[r] - m) / np.sqrt(np.mean((x[r] - m) ** 2) + EPS) * w["Lw"][0] + w["Lb"][0]
    flat = x.reshape(-1)                                  # the 16 values, row-major
    for heads, weight in ((4, w["Wh"][0]), (8, np.ones(2))):
        n = 16 // heads
        out = np.concatenate([rms(flat[i * n:(i + 1) * n]) * weight for i in range(heads)])
        total += out.reshape(2, 8)
    l2 = np.concatenate([flat[i * 4:(i + 1) * 4] / np.sqrt(np.sum(flat[i * 4:(i + 1) * 4] ** 2) + EPS)
                         for i in range(4)])
    total += l2.reshape(2, 8)
    _, traces = run_vm("norms")
    np.testing.assert_allclose(traces[0].output, total, rtol=0, atol=TOL)


def test_full_attention():
    w = weights("full_attention", X=(4, 8), Wq=(8, 8), Wk=(8, 8), Wv=(8, 8), Wo=(8, 8))
    q, k, v = w["X"] @ w["Wq"], w["X"] @ w["Wk"], w["X"] @ w["Wv"]
    two = np.zeros((4, 8))
    for h in range(2):
        c = slice(4 * h, 4 * h + 4)
        for i in range(4):                                # query token i over every key token j
            s = np.array([q[i, c] @ k[j, c] for j in range(4)]) / 2.0
            two[i, c] = softmax_rows(s) @ v[:, c]
    one = softmax_rows(q @ k.T / math.sqrt(8)) @ v
    expected = (two + one) @ w["Wo"]
    _, traces = run_vm("full_attention")
    np.testing.assert_allclose(traces[0].output, expected, rtol=0, atol=TOL)


def rope_head(vec, c, s):
    """NEOX rotation of one head of 4: pairs (0, 2), (1, 3)."""
    a, b = vec[:2], vec[2:]
    return np.concatenate([a * c - b * s, a * s + b * c])


def test_rope_attention_two_steps():
    w = weights("rope_attention", x=(1, 16), Wq=(16, 16), Wk=(16, 8), Wv=(16, 8), Wo=(16, 16),
                Wlm=(16, 10), Cos=(2, 2), Sin=(2, 2))
    # the committed tables are what their comment says, snapped to make_small's 2^-24 grid
    angles = np.arange(2)[:, None] * 10000.0 ** (-np.arange(2) / 2.0)[None, :]
    np.testing.assert_allclose(w["Cos"], np.cos(angles), rtol=0, atol=2.0 ** -25 + 1e-15)
    np.testing.assert_allclose(w["Sin"], np.sin(angles), rtol=0, atol=2.0 ** -25 + 1e-15)
    x = w["x"][0]
    kc, vc = np.zeros((2, 8)), np.zeros((2, 8))
    logits_per_step, best_per_step = [], []
    for pos in range(2):
        c, s = w["Cos"][pos], w["Sin"][pos]
        q, k, v = x @ w["Wq"], x @ w["Wk"], x @ w["Wv"]
        q = np.concatenate([rope_head(q[4 * h:4 * h + 4], c, s) for h in range(4)])
        k = np.concatenate([rope_head(k[4 * g:4 * g + 4], c, s) for g in range(2)])
        kc[pos], vc[pos] = k, v
        att = np.zeros(16)
        for h in range(4):
            g = h // 2                                    # 4 heads over 2 groups
            kg, vg = kc[:, 4 * g:4 * g + 4], vc[:, 4 * g:4 * g + 4]
            att[4 * h:4 * h + 4] = softmax_rows(kg @ q[4 * h:4 * h + 4] / 2.0) @ vg   # all L = 2 rows
        logits = (att @ w["Wo"] + x) @ w["Wlm"]
        logits_per_step.append(logits)
        best_per_step.append(float(np.argmax(logits)))
    program, traces = run_vm("rope_attention", keep_stages=True)
    index = {st.out: st.index for st in program.stages if st.binds}
    for t, trace in enumerate(traces):
        np.testing.assert_allclose(trace.stages[index["logits"]].reshape(-1), logits_per_step[t],
                                   rtol=0, atol=TOL)
        assert trace.output.tolist() == [[best_per_step[t]]]
    assert traces[-1].states["pos"].tolist() == [[2.0]]
    np.testing.assert_allclose(traces[-1].states["Kc"], kc, rtol=0, atol=TOL)
    np.testing.assert_allclose(traces[-1].states["Vc"], vc, rtol=0, atol=TOL)


def test_delta_two_steps():
    w = weights("delta", x=(1, 8), WC=(3, 8), Wq=(8, 8), Wk=(8, 8), Wv=(8, 16), Wz=(8, 16), Wb=(8, 4),
                Wa=(8, 4), Dt=(1, 4), Alog=(1, 4), GN=(1, 4), Wo=(16, 8))
    x = w["x"][0]
    ring = np.zeros((3, 8))
    mem = np.zeros((4, 4, 4))                             # 4 value heads of a 4 by 4 memory
    outs = []
    for _ in range(2):
        ring = np.vstack([ring[1:], x])
        cv = silu((ring * w["WC"]).sum(axis=0))
        q, k = cv @ w["Wq"], cv @ w["Wk"]
        q = np.concatenate([q[4 * i:4 * i + 4] / np.sqrt(np.sum(q[4 * i:4 * i + 4] ** 2) + EPS) for i in range(2)])
        k = np.concatenate([k[4 * i:4 * i + 4] / np.sqrt(np.sum(k[4 * i:4 * i + 4] ** 2) + EPS) for i in range(2)])
        v, z = cv @ w["Wv"], x @ w["Wz"]
        beta = sigmoid(x @ w["Wb"])
        alpha = (1.0 + np.exp(x @ w["Wa"] + w["Dt"][0])) ** w["Alog"][0]
        assert np.all((alpha > 0) & (alpha < 1))
        o = np.zeros(16)
        for h in range(4):
            g = h % 2                                     # value head h reads key head h mod 2
            kh, qh, vh = k[4 * g:4 * g + 4], q[4 * g:4 * g + 4], v[4 * h:4 * h + 4]
            u = mem[h] @ kh
            mem[h] = alpha[h] * mem[h] + beta[h] * np.outer(vh - alpha[h] * u, kh)
            oh = mem[h] @ qh / 2.0
            o[4 * h:4 * h + 4] = w["GN"][0] * rms(oh) * silu(z[4 * h:4 * h + 4])
        outs.append(o @ w["Wo"])
    _, traces = run_vm("delta")
    for t in range(2):
        np.testing.assert_allclose(traces[t].output.reshape(-1), outs[t], rtol=0, atol=TOL)
    assert not np.allclose(outs[0], outs[1])              # the states really carried over
    np.testing.assert_allclose(traces[-1].states["CS"], ring, rtol=0, atol=TOL)
    np.testing.assert_allclose(traces[-1].states["S"].reshape(4, 4, 4), mem, rtol=0, atol=TOL)


def test_embedding():
    w = weights("embedding", Emb=(10, 6))
    emb = w["Emb"]
    h = emb[7] + emb[0]
    best = int(np.argmax(emb @ h))
    seen = np.vstack([emb[0], emb[7]])
    y = softmax_rows(seen @ emb[best]) @ seen
    _, traces = run_vm("embedding")
    for trace in traces:                                  # the buffer is rewritten alike each step
        np.testing.assert_allclose(trace.output.reshape(-1), y, rtol=0, atol=TOL)
        np.testing.assert_allclose(trace.states["Seen"], seen, rtol=0, atol=TOL)


# ── every small program: reads, runs, finite; together they use every op with a spelling ────────

@pytest.mark.parametrize("name", SMALL)
def test_reads_runs_finite_and_has_a_config(name):
    import yaml
    with open(os.path.join(ROOT, "programs", f"{name}.yaml"), encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    assert cfg["weights"] == f"weights/{name}"
    assert cfg.get("steps", 1) == STEPS.get(name, 1)
    program, traces = run_vm(name)
    assert bool(program.states) == (name in STEPS)
    for trace in traces:
        assert np.all(np.isfinite(trace.output))
        for value in trace.states.values():
            assert np.all(np.isfinite(value))
    with open(program.path, encoding="utf-8") as f:
        assert sum(line.lstrip().startswith("#") for line in f) >= 3, "a newcomer's program is commented"


def test_the_small_programs_cover_every_op_but_the_refused():
    used = set()
    for name in SMALL:
        used |= {st.op.name for st in read_file(os.path.join(ROOT, "programs", f"{name}.logos")).stages}
    assert {op.name for op in OPS} - used == {"selective scan", "moe"}   # read, refused by name
    assert "set row" in used


def test_the_committed_weights_are_what_make_small_makes():
    """The committed weights are made with exactly reproducible operations, compared byte for byte:
    make_small.py snaps every value computed through a transcendental function (exp, cos, sin, power:
    SIMD results that differ by an ulp between CPUs) to a 2^-24 grid, so --check passes on any CPU."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_small", os.path.join(ROOT, "weights", "make_small.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0
    total = sum(os.path.getsize(os.path.join(ROOT, "weights", n, f))
                for n in SMALL for f in os.listdir(os.path.join(ROOT, "weights", n)))
    assert total < 200_000


def test_the_repos_weights_check_names_the_file_that_differs(tmp_path):
    """The repository's small_weights task (dodo.py) fails naming each weights file that is not
    what make_small.py makes, missing or edited, never a bare `returned False`."""
    import shutil
    import subprocess
    import sys
    shutil.copytree(os.path.join(ROOT, "weights"), tmp_path / "weights",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "dodo.py"), tmp_path / "dodo.py")
    shutil.copytree(os.path.join(ROOT, "programs"), tmp_path / "programs")
    os.unlink(tmp_path / "weights/mlp/W1.f64")
    data = bytearray((tmp_path / "weights/norms/Lw.f64").read_bytes())
    data[0] ^= 1
    (tmp_path / "weights/norms/Lw.f64").write_bytes(bytes(data))
    p = subprocess.run([sys.executable, "-m", "doit", "small_weights"], cwd=tmp_path, capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": ROOT})
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "weights/mlp/W1.f64" in out and "weights/norms/Lw.f64" in out, out
    assert "not what weights/make_small.py makes" in out, out


def test_the_repos_weights_check_depends_on_what_make_small_writes_and_nothing_else(tmp_path, monkeypatch):
    """doit's checker hashes a task's file_dep whole: small_weights names only the files
    make_small.py reads and writes (a stray 16 GiB file beside them is never read), and one that is
    not a small plain file (a sparse 16 GiB one in its place) is no dependency but makes the task
    run, which reads its head and names it."""
    import runpy
    import shutil
    shutil.copytree(os.path.join(ROOT, "weights"), tmp_path / "weights",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "dodo.py"), tmp_path / "dodo.py")
    shutil.copytree(os.path.join(ROOT, "emitter"), tmp_path / "emitter", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(ROOT, "programs"), tmp_path / "programs")
    with open(tmp_path / "weights/mlp/zzz.f64", "wb") as f:
        f.truncate(16 << 30)
    monkeypatch.chdir(tmp_path)   # (dodo.py goes to its folder: back where the test began after)
    task = runpy.run_path(str(tmp_path / "dodo.py"))["task_small_weights"]()
    deps = task["file_dep"]
    assert "weights/mlp/zzz.f64" not in deps and "weights/mlp/W1.f64" in deps and task["uptodate"] == [True]
    assert len(deps) == 1 + len(SMALL) + 51   # make_small.py, the programs it reads, what it writes
    assert {f"programs/{n}.logos" for n in SMALL} <= set(deps)   # (a program's shape edited: it runs)
    with open(tmp_path / "weights/mlp/W1.f64", "r+b") as f:
        f.truncate(16 << 30)
    task = runpy.run_path(str(tmp_path / "dodo.py"))["task_small_weights"]()
    assert "weights/mlp/W1.f64" not in task["file_dep"] and task["uptodate"] == [False]
    assert "weights/mlp/W1.f64" in str(task["actions"][0]())
