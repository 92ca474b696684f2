"""Qwen3-Next: the hybrid decode step with routed experts (programs/qwen3next.logos) against
transformers' `Qwen3NextForCausalLM` in float64.

The tiny random checkpoint committed in checkpoints/qwen3next-tiny (`qwen3next.make_tiny_checkpoint
(..., seed=0)`: 4 layers [delta, attention, delta, attention], layers 0, 1, 3 a mixture of 8
experts, top 2, with a shared expert; layer 2 dense) is imported by `python -m emitter
import-qwen3next`; the VM runs 6 teacher-forced steps (their tokens written into Tok) and then 6
greedy ones (the program's own argmax), and transformers decodes the same tokens one at a time with
its cache. With transformers' float32 islands made float64 (tests/hf_float64.py) the logits agree
to 5e-15 at every step (measured); without them, by 3e-7 to 1.4e-6: the patches matter.
"""

import json
import os

import numpy as np
import pytest
import torch

from conftest import assert_same_files, run_cli
from emitter.importers import qwen35, qwen3next
from emitter.language.reader import read_file
from emitter.sambaflow.emit import emit_program
from emitter.verify import vm
from hf_float64 import float64_qwen3_next

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKPOINT = os.path.join(ROOT, "checkpoints", "qwen3next-tiny")
PROGRAM = os.path.join(ROOT, "programs", "qwen3next.logos")
FORCED = [5, 77, 12, 90, 33, 61]
GREEDY = 6


@pytest.fixture(scope="module")
def program():
    return read_file(PROGRAM)


@pytest.fixture(scope="module")
def values(tmp_path_factory, program):
    out = str(tmp_path_factory.mktemp("qwen3next") / "weights")
    done = run_cli("import-qwen3next", os.path.join(CHECKPOINT, "model.safetensors"), "--program",
                   PROGRAM, "-o", out)
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout.strip().splitlines()[-1])["declared"]) == \
        set(program.states) - {"Tok", "Pos"} | {"One", "Eq", "Ek", "Dq", "Mq"}
    leaves = vm.load_leaves(program, out)
    assert leaves.unmatched == []
    return leaves.values


def _index(program, out):
    return [s.out for s in program.stages].index(out)


@pytest.fixture(scope="module")
def decode(program, values):
    """(tokens read, logits per step, routing weights per MoE layer and step) of 6 forced and 6
    greedy VM steps."""
    li = _index(program, "logits")
    routes = {L: _index(program, f"rw{L}") for L in (0, 1, 3)}
    current, tokens, logits, chosen = dict(values), [], [], {L: [] for L in routes}
    trace = None
    for i in range(len(FORCED) + GREEDY):
        tok = FORCED[i] if i < len(FORCED) else int(trace.output[0, 0])
        current["Tok"] = np.array([[float(tok)]])
        trace = vm.step(program, current)
        current.update(trace.states)
        tokens.append(tok)
        logits.append(trace.stages[li].reshape(-1))
        for L, s in routes.items():
            chosen[L].append(trace.stages[s].reshape(-1))
    return tokens, logits, chosen


def _hf_logits(tokens):
    from transformers import Qwen3NextForCausalLM
    model = Qwen3NextForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float64,
                                                 experts_implementation="eager").eval()
    cache, out = None, []
    with torch.no_grad():
        for tok in tokens:
            o = model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
            cache = o.past_key_values
            out.append(o.logits[0, -1].numpy().copy())
    return out


def test_vm_logits_match_transformers_in_float64(decode):
    tokens, logits, _ = decode
    with float64_qwen3_next():
        hf = _hf_logits(tokens)
    for step, (got, want) in enumerate(zip(logits, hf)):
        assert np.abs(got - want).max() < 1e-9, step
        assert int(np.argmax(got)) == int(np.argmax(want)), step
        if step >= len(FORCED):      # greedy: the token read is the last step's argmax
            assert tokens[step] == int(np.argmax(logits[step - 1]))
    assert len({int(np.argmax(x)) for x in logits}) >= 8     # the steps really differ


def test_without_the_float64_patches_transformers_differs(decode):
    tokens, logits, _ = decode
    errors = [np.abs(a - b).max() for a, b in zip(logits, _hf_logits(tokens))]
    assert min(errors) > 1e-8, errors


def test_the_routers_choose_every_expert_and_two_per_token(decode):
    _, _, chosen = decode
    for layer, rows in chosen.items():
        rows = np.array(rows)
        assert ((rows != 0).sum(axis=1) == 2).all(), layer
        np.testing.assert_allclose(rows.sum(axis=1), 1.0, rtol=0, atol=1e-15)   # renormalised
        assert (rows != 0).any(axis=0).all(), f"layer {layer}: an expert never chosen"


def test_the_config_is_what_the_issue_asks():
    c = qwen35.read_config(CHECKPOINT)
    assert c["model_type"] == "qwen3_next" and c["vocab_size"] >= 64
    assert c["num_experts"] >= 8 and c["num_experts_per_tok"] == 2 and c["shared_expert_intermediate_size"]
    assert set(c["layer_types"]) == {"linear_attention", "full_attention"}


def test_committed_program_is_the_generated_one(program):
    with open(PROGRAM, encoding="utf-8") as f:
        assert f.read() == qwen35.generate_program(qwen35.read_config(CHECKPOINT), ctx=12)
    assert program.decls["COS"].rows == 12


def test_committed_checkpoint_is_the_seeded_one(tmp_path):
    qwen3next.make_tiny_checkpoint(str(tmp_path), seed=0)
    assert_same_files(str(tmp_path), CHECKPOINT)


def test_manifest_names_the_mixtures_tensors_as_llama_cpp_does(program):
    manifest = json.loads(emit_program(program).manifest_json)
    gguf = {t["var"]: t["gguf"] for t in manifest["tensors"] if t["role"] == "weight"}
    for L in (0, 1, 3):
        assert {gguf[f"{s}{L}"] for s in ("Wr", "Weg", "Weu", "Wed", "Wsg", "Wsu", "Wsd", "Wsi")} == {
            f"blk.{L}.ffn_{n}.weight" for n in ("gate_inp", "gate_exps", "up_exps", "down_exps",
                                                "gate_shexp", "up_shexp", "down_shexp", "gate_inp_shexp")}
    assert gguf["Wg2"] == "blk.2.ffn_gate.weight" and "Wr2" not in gguf
    ops = [s.op.name for s in program.stages]
    assert ops.count("softmax routing") == ops.count("experts") == 3
