"""Qwen3.8: the qwen35 hybrid decode step (programs/qwen38.logos) against transformers.

The tiny random `Qwen3_5ForCausalLM` committed in checkpoints/qwen38-tiny (made by
`make_tiny_checkpoint(..., seed=0)`: 4 layers [delta, attention, delta, attention], hv 4 > hk 2,
rotary 4 of head 8, eps 1e-6) is imported by `python -m emitter import-qwen35` and the program runs
on the VM by its own steps: it reads Tok and Pos and writes back argmax and Pos + 1, so
`vm.run(steps=5)` is five greedy decode steps. transformers (float64 model; it computes norms, rope,
softmax and the delta rule in float32 inside) decodes the same tokens one at a time with its cache.

Measured here (start token 107): logits max abs 2.8e-7, 4.1e-7, 4.0e-7, 3.6e-7, 1.2e-6 over the
five steps (max |logit| 2.4..3.1, so max abs / max |logit| <= 4.7e-7; element-wise max rel up to
1.9e-4, from logits near 0), argmax equal at every step with top-2 margins >= 0.31. Asserted:
max abs < 1e-4 and max abs / max |logit| < 1e-4 per step, argmax equal.

The controls show the comparison fails where it must (measured max abs per step 0.45..3.2):
without the value-head reordering, without the mask column, and with a wrong decay rate
(-A_log instead of -exp(A_log)) the logits are off by > 1e-2 - the wrong decay only from the
second step on, as the delta state is zero before it (there 2.8e-7).
"""

import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from conftest import assert_same_files, run_cli  # noqa: E402
from emitter.verify import vm  # noqa: E402
from emitter.sambaflow.emit import QWEN38_OPS, emit_program  # noqa: E402
from emitter.importers import qwen35 as q  # noqa: E402
from emitter.language.reader import read_file, read_program  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKPOINT = os.path.join(ROOT, "checkpoints", "qwen38-tiny")
PROGRAM = os.path.join(ROOT, "programs", "qwen38.logos")
STEPS = 5
FIRST_TOKEN = 107   # its 5 greedy steps have top-2 logit margins >= 0.31 (token 0: 0.12)


@pytest.fixture(scope="module")
def program():
    return read_file(PROGRAM)


@pytest.fixture(scope="module")
def weights(tmp_path_factory, program):
    out = str(tmp_path_factory.mktemp("qwen38") / "weights")
    done = run_cli("import-qwen35", os.path.join(CHECKPOINT, "model.safetensors"), "--program", PROGRAM,
                   "-o", out, "--token", str(FIRST_TOKEN))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    # the states and the program's filled constants are left to the program
    assert set(summary["declared"]) == set(program.states) - {"Tok", "Pos"} | {"One", "Eq", "Ek", "Dq", "Mq"}
    return out


@pytest.fixture(scope="module")
def vm_run(program, weights):
    leaves = vm.load_leaves(program, weights)
    assert leaves.unmatched == []
    return vm.run(program, leaves.values, steps=STEPS, keep_stages=True)


def _stage(program, out):
    return [s.out for s in program.stages].index(out)


def _tokens(program, traces):
    """The token each VM step read: the first from Tok.f64, then each step's argmax."""
    return [FIRST_TOKEN] + [int(t.output[0, 0]) for t in traces[:-1]]


@pytest.fixture(scope="module")
def hf_logits(program, vm_run):
    import torch
    from transformers import Qwen3_5ForCausalLM
    model = Qwen3_5ForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float64).eval()
    cache, out = None, []
    with torch.no_grad():
        for tok in _tokens(program, vm_run):
            o = model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
            cache = o.past_key_values
            out.append(o.logits[0, -1].numpy().copy())
    return out


def test_vm_logits_match_transformers_over_decode_steps(program, vm_run, hf_logits):
    li = _stage(program, "logits")
    for step, (trace, hf) in enumerate(zip(vm_run, hf_logits)):
        got = trace.stages[li].reshape(-1)
        diff = np.abs(got - hf).max()
        assert diff < 1e-4, f"step {step}: max abs {diff}"
        assert diff / np.abs(hf).max() < 1e-4
        assert int(np.argmax(got)) == int(np.argmax(hf)) == int(trace.output[0, 0]), step
        assert trace.states["Pos"][0, 0] == step + 1
    # the steps really differ: new tokens, new positions, new logits
    assert len({round(float(h[0]), 6) for h in hf_logits}) == STEPS


def _forced(program, values, tokens):
    """A loop around vm.step feeding `tokens` (not the program's own argmax); logits per step."""
    li, current, out = _stage(program, "logits"), dict(values), []
    for tok in tokens:
        current["Tok"] = np.array([[float(tok)]])
        trace = vm.step(program, current)
        current.update(trace.states)
        out.append(trace.stages[li].reshape(-1))
    return out


def _errors(program, values, tokens, hf_logits):
    return [float(np.abs(a - b).max()) for a, b in zip(_forced(program, values, tokens), hf_logits)]


def test_controls_fail_where_they_must(program, weights, vm_run, hf_logits, tmp_path, monkeypatch):
    tokens = _tokens(program, vm_run)
    values = vm.load_leaves(program, weights).values
    assert max(_errors(program, values, tokens, hf_logits)) < 1e-4

    # no mask column: unwritten KV rows (zeros) take softmax weight
    unmasked = dict(values)
    for name in program.states:
        if name.startswith("Kc"):
            unmasked[name] = np.zeros_like(values[name])
    assert min(_errors(program, unmasked, tokens, hf_logits)[:-1]) > 1e-2

    # a wrong decay rate: invisible on the first step (zero state), visible after
    wrong = dict(values)
    for name in program.leaves:
        if name.startswith("Al"):
            wrong[name] = -np.log(-values[name])       # -A_log instead of -exp(A_log)
    errs = _errors(program, wrong, tokens, hf_logits)
    assert errs[0] < 1e-4 and min(errs[1:]) > 1e-2

    # HF's value-head order kept: the sugar's head h reads key head h mod hk, not h // (hv/hk)
    monkeypatch.setattr(q.Dims, "value_order", lambda self: np.arange(self.hv))
    q.import_checkpoint(CHECKPOINT, program, str(tmp_path), token=FIRST_TOKEN)
    unordered = vm.load_leaves(program, str(tmp_path)).values
    assert min(_errors(program, unordered, tokens, hf_logits)) > 1e-2


CACHE_ROWS = 8   # qwen38's KV cache (Kc1, Vc1, ...): every row written and read once the steps reach it


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_the_bundle_locks_over_its_whole_kv_cache_and_a_conv_ring_that_forgets_fails(program, weights, tmp_path, dtype):
    """The zoo locks qwen38 over 2 steps (its summary rows are fixed); here over all 8 rows of its
    KV cache and twice round its 4-tap conv rings, where a ring that drops one tap too many (a
    bug 2 steps never reach: its oldest rows are still the declared zeros) fails."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    from emitter.verify.lock import lock_bundle
    bundle = str(tmp_path / "b")
    write_bundle(emit_program(program, {}), bundle)   # (with its bf16 precision policy, as the zoo's)
    r = lock_bundle(bundle, PROGRAM, weights, dtype, CACHE_ROWS)
    assert r["verdict"] == "pass" and len(r["steps_detail"]) == CACHE_ROWS, r.get("reason")
    if dtype != "float64":
        return
    model = os.path.join(bundle, "model.py")
    with open(model) as f:
        text = f.read()
    ring = "    ring = torch.cat([cs[1:], x.reshape(1, -1)], dim=0)\n"
    assert ring in text
    with open(model, "w") as f:
        f.write(text.replace(ring, "    ring = torch.cat([torch.zeros_like(cs[:1]), cs[2:], x.reshape(1, -1)], dim=0)\n"))
    r = lock_bundle(bundle, PROGRAM, weights, dtype, 2)   # 2 steps' own rings hold zeros there, and the
    f = r["first_divergence"]                            # fresh pass's ring other values
    assert r["verdict"] == "fail" and f["after"] == "fresh", f
    r = lock_bundle(bundle, PROGRAM, weights, dtype, CACHE_ROWS)
    assert r["verdict"] == "fail" and r["first_divergence"]["op"] == "causal conv", r["first_divergence"]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_attention_over_the_last_rows_alone_fails_at_the_zoos_own_steps(program, weights, tmp_path, dtype):
    """A sliding window of 2 rows where the program attends to every row written matches each of
    2 steps (2 rows written); the fresh pass hands the cache its rows moved apart from the one its
    step writes (their mask with them), where the window misses one: a fail, at the attention."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    from emitter.verify.lock import lock_bundle
    bundle = str(tmp_path / "b")
    write_bundle(emit_program(program, {}), bundle)
    assert lock_bundle(bundle, PROGRAM, weights, dtype, 2)["verdict"] == "pass"
    model = os.path.join(bundle, "model.py")
    with open(model) as f:
        text = f.read()
    head = "def attention(q, k, v, heads, groups, hd):\n"
    call = "self.cast(45, Vc1), 4, 2, 9))"
    assert head in text and call in text
    with open(model, "w") as f:
        f.write(text.replace(head, head.replace("hd)", "hd, pos=None)") + "    if pos is not None:\n"
                             "        p = int(pos.reshape(-1)[0]); k, v = k[max(0, p - 1):p + 1], v[max(0, p - 1):p + 1]\n")
                .replace(call, call[:-2] + ", Pos))"))
    r = lock_bundle(bundle, PROGRAM, weights, dtype, 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and f["after"] == "fresh" and all(d["pass"] for d in r["steps_detail"]), f


def test_program_uses_all_qwen38_ops(program):
    used = {s.op.name for s in program.stages}
    assert set(QWEN38_OPS) <= used, sorted(set(QWEN38_OPS) - used)
    assert {"set row"} <= used


def test_committed_program_is_the_generated_one():
    with open(PROGRAM, encoding="utf-8") as f:
        assert f.read() == q.generate_program(q.read_config(CHECKPOINT))


def test_committed_checkpoint_is_the_seeded_one(tmp_path):
    q.make_tiny_checkpoint(str(tmp_path), seed=0)
    assert_same_files(str(tmp_path), CHECKPOINT)


def _expected_gguf(dims):
    names = {"emb": "token_embd.weight", "on": "output_norm.weight", "Wout": "output.weight"}
    for i, kind in enumerate(dims.layer_types):
        stems = {"an": "attn_norm.weight", "fn": "post_attention_norm.weight",
                 "Wg": "ffn_gate.weight", "Wu": "ffn_up.weight", "Wd": "ffn_down.weight"}
        if kind == "full_attention":
            stems.update(Wq="attn_q.weight", Wqg="attn_q.weight", Wk="attn_k.weight", Wv="attn_v.weight",
                         Wo="attn_output.weight", Qn="attn_q_norm.weight", Kn="attn_k_norm.weight")
        else:
            stems.update(Wq="attn_qkv.weight", Wk="attn_qkv.weight", Wv="attn_qkv.weight",
                         Wz="attn_gate.weight", Wcq="ssm_conv1d.weight", Wck="ssm_conv1d.weight",
                         Wcv="ssm_conv1d.weight", Wb="ssm_beta.weight", Wa="ssm_alpha.weight",
                         Dt="ssm_dt.bias", Al="ssm_a", Gn="ssm_norm.weight", Wo="ssm_out.weight")
        names.update({f"{s}{i}": f"blk.{i}.{n}" for s, n in stems.items()})
    return names


def test_manifest_gguf_names(program):
    dims = q.dims_of(q.read_config(CHECKPOINT))
    assert program.attention_layers == frozenset(dims.attention_layers) == frozenset({1, 3})
    manifest = json.loads(emit_program(program).manifest_json)
    leaves = {t["var"]: t for t in manifest["tensors"] if t["role"] != "computed"}
    expected = _expected_gguf(dims)
    weights = {v: t["gguf"] for v, t in leaves.items() if t["role"] == "weight"}
    # the checkpoint's tensors, and the constants the step reads as parameters (no checkpoint name)
    assert {v: g for v, g in weights.items() if g is not None} == expected
    assert {v for v, g in weights.items() if g is None} == {"One", "COS", "SIN", "Eq", "Ek", "Dq", "Mq"}
    assert set(manifest["states"]) == set(program.states) == (
        {"Tok", "Pos"} | {f"{s}{i}" for i in (1, 3) for s in ("Kc", "Vc")}
        | {f"{s}{i}" for i in (0, 2) for s in ("Cq", "Ck", "Cv", "S")})
    assert manifest["inputs"] == []      # a decode loop: its token and position are states
    assert all(leaves[v]["gguf"] is None for v in manifest["states"])


def test_generator_follows_the_config():
    cfg = dict(q.TINY_CONFIG, layer_types=["full_attention", "linear_attention"], num_hidden_layers=2,
               linear_num_value_heads=6, linear_num_key_heads=3)
    p = read_program(q.generate_program(cfg, ctx=3))
    assert p.attention_layers == frozenset({0})
    assert p.shapes["S1"] == (6 * 8, 8) and p.shapes["Kc0"] == (3, 2 * 9) and p.shapes["COS"] == (3, 2)
    with pytest.raises(q.ConfigError, match="key head dim"):
        q.generate_program(dict(q.TINY_CONFIG, linear_value_head_dim=16))


def test_every_rmsnorm_carries_the_configs_epsilon(program):
    norms = [s for s in program.stages if s.op.name == "rmsnorm"]
    assert len(norms) == 4 * 2 + 2 * 2 + 1 and all(s.bound["EPS"] == 1e-6 for s in norms)
    attention_only = dict(q.TINY_CONFIG, layer_types=["full_attention"], num_hidden_layers=1,
                          rms_norm_eps=1e-5)
    norms = [s for s in read_program(q.generate_program(attention_only)).stages if s.op.name == "rmsnorm"]
    assert len(norms) == 5 and all(s.bound["EPS"] == 1e-5 for s in norms)
    # `gated delta` normalises with the sugar's 1e-6: another epsilon cannot be spelt there
    with pytest.raises(q.ConfigError, match="rms_norm_eps 1e-05 with Gated DeltaNet layers"):
        q.generate_program(dict(q.TINY_CONFIG, rms_norm_eps=1e-5))


def test_value_order_pairs_key_heads():
    d = q.dims_of(q.TINY_CONFIG)
    order = d.value_order()
    assert sorted(order) == list(range(d.hv))
    for j, hf in enumerate(order):       # the sugar's head j reads key j mod hk; HF's head reads hf // r
        assert j % d.hk == hf // d.ratio


def test_a_tensor_no_leaf_reads_is_never_read(tmp_path, weights):
    """The checkpoint with one more F16 tensor of 400M values no leaf reads (a sparse file: 3.2 GB
    as float64, where every tensor of the file was read): the same leaves, the big one never read."""
    import shutil
    import struct
    import subprocess
    import sys
    ckpt = tmp_path / "ckpt"
    shutil.copytree(CHECKPOINT, ckpt)
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header, body = json.loads(data[8:8 + n]), data[8 + n:]
    header["unused.weight"] = {"dtype": "F16", "shape": [400_000_000], "data_offsets": [len(body), len(body) + 800_000_000]}
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)
    os.truncate(path, 8 + len(text) + len(body) + 800_000_000)
    out = tmp_path / "w"
    p = subprocess.Popen([sys.executable, "-m", "emitter", "import-qwen35", str(path), "--program", PROGRAM, "-o",
                          str(out), "--token", str(FIRST_TOKEN)], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, err
    assert usage.ru_maxrss * 1024 < 1.5 * (1 << 30)   # (reading it took 4.7 GB)
    for f in sorted(os.listdir(weights)):
        if not f.startswith("."):
            assert (out / f).read_bytes() == open(os.path.join(weights, f), "rb").read(), f


def test_a_config_of_a_billion_layers_is_refused_before_its_layers_are_listed():
    c = json.load(open(os.path.join(CHECKPOINT, "config.json")))
    c["num_hidden_layers"] = 10 ** 9
    with pytest.raises(q.ConfigError, match="num_hidden_layers 1000000000 is not a whole number from 1 to 4096"):
        q.dims_of(c)


def test_under_bf16_a_key_row_written_wrong_in_the_fresh_pass_fails(program, weights, tmp_path):
    """Under bfloat16 the fresh pass judges a cache a `Set row` writes row by row: the rounding of
    its unwritten rows' mask (-1e9) was the whole cache's noise, so a key row written 1.5 times over
    from position 2 on (the fresh pass's, past 2 steps') kept its cosine and nmse to 13 digits."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    from emitter.verify.lock import lock_bundle
    bundle = str(tmp_path / "b")
    write_bundle(emit_program(program, {}), bundle)
    assert lock_bundle(bundle, PROGRAM, weights, "bfloat16", 2)["verdict"] == "pass"
    model = os.path.join(bundle, "model.py")
    with open(model) as f:
        text = f.read()
    old = "    return table.index_copy(0, index, row.reshape(1, -1))\n"
    assert text.count(old) == 1
    with open(model, "w") as f:
        f.write(text.replace(old, "    if table.shape[1] == 18 and int(index[0]) >= 2:\n        row = row * 1.5\n" + old))
    r = lock_bundle(bundle, PROGRAM, weights, "bfloat16", 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and f["after"] == "fresh" and f["out"] in ("Kc1", "Kc3"), (f, r["fresh"])
    assert all(d["pass"] for d in r["steps_detail"]), r["steps_detail"]
