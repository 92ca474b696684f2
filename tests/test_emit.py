"""Emission: model.py, manifest.json, compile.py, their determinism and the command line."""

import json
import os
import py_compile
import subprocess
import sys

import pytest

from conftest import ROOT, load_model, run_cli
from emitter import (QWEN38_OPS, TEMPLATE_MARK, VENDOR_HEADER, ProgramError, emit_torch_module,
                     gguf_name, program_name, read_file, torch_spelling)
from emitter.sambaflow.marks import fnv1a64


@pytest.fixture
def all_ops(all_ops_path):
    with open(all_ops_path) as f:
        return f.read()


def test_fnv1a64_known_vectors():
    # FNV-1a 64 test vectors (the offset basis for "", the published value for "a").
    assert fnv1a64("") == 0xCBF29CE484222325
    assert fnv1a64("a") == 0xAF63DC4C8601EC8C
    assert program_name("a") == "logos_af63dc4c8601ec8c"


def test_deterministic(all_ops):
    a, b = emit_torch_module(all_ops), emit_torch_module(all_ops)
    assert (a.model_py, a.manifest_json, a.compile_py) == (b.model_py, b.manifest_json, b.compile_py)
    other = emit_torch_module(all_ops + "\n")
    assert other.model_py != a.model_py  # the program name follows the source


def test_model_py_shape(all_ops, all_ops_path):
    art = emit_torch_module(all_ops)
    lines = art.model_py.splitlines()
    assert lines[0] == VENDOR_HEADER
    program = read_file(all_ops_path)
    stage_lines = [l.strip() for l in lines if l.strip().startswith("# stage ")]
    assert stage_lines == [f"# stage {s.index}: {s.out} = {s.op.name}" for s in program.stages]
    assert f'OUTPUT = "{program.output}"' in lines
    assert 'STATES = ("K0", "V0", "cs", "S")' in lines
    assert '        self.leaf_cs.copy_(cs)' in lines       # the state written back
    assert f"        return {program.output}" in lines
    compile(art.model_py, "model.py", "exec")


def test_model_imports_and_leaves(all_ops, tmp_path):
    from conftest import emit_bundle
    module = load_model(emit_bundle(all_ops, tmp_path))
    assert module.LEAVES["tok"] == ((1, 1), "input", "int")
    assert module.LEAVES["Wq0"] == ((8, 8), "weight", "real")
    assert module.LEAVES["cs"] == ((4, 8), "state", "real")
    assert module.FILLS["tok"] == ((0, 2),)
    import torch
    with pytest.raises(ValueError, match="no value for emb, an0, Wq0"):
        module.LogosModule({}, torch.float64)        # read, unfilled leaves need weights
    weights = {n: torch.ones(module.LEAVES[n][0]) for n in module.REQUIRED}
    m = module.LogosModule(weights, torch.float64)
    assert m.leaf_tok.item() == 2.0 and m.leaf_pos.item() == 1.0 and m.leaf_K0.abs().sum() == 0


def test_manifest_fields(all_ops):
    m = json.loads(emit_torch_module(all_ops).manifest_json)
    assert m["schema"] == "logos.sambaflow.manifest" and m["version"] == 1
    assert m["program"] == program_name(all_ops)
    assert m["output"] == "y" and m["states"] == ["K0", "V0", "cs", "S"]
    by = {t["var"]: t for t in m["tensors"]}
    assert by["Wq0"] == {"var": "Wq0", "shape": [8, 8], "dtype": "Real", "role": "weight",
                         "gguf": "blk.0.attn_qkv.weight", "file": "Wq0.f64", "line": 9}
    assert by["tok"]["dtype"] == "Int" and by["tok"]["role"] == "input" and by["tok"]["gguf"] is None
    assert by["K0"]["role"] == "state"
    assert by["att"]["role"] == "computed" and by["att"]["file"] is None and by["att"]["shape"] == [1, 8]
    assert "tok" in m["inputs"] and "Wq0" not in m["inputs"]
    ops = m["ops"]
    assert [o["index"] for o in ops] == list(range(len(ops)))
    gd = next(o for o in ops if o["op"] == "gated delta")
    assert gd["inputs"] == ["qdn", "qdn", "sv", "zd", "bb", "dc", "S", "gn"] and gd["writes"] == "S"
    assert gd["torch"] == torch_spelling("gated delta")
    assert gd["call"] == "gated_delta(qdn, qdn, sv, zd, bb, dc, S, gn, 2, 1, 4)"
    sr = next(o for o in ops if o["op"] == "set row")
    assert sr["out"] == "K0" and sr["writes"] == "K0" and sr["inputs"] == ["K0", "pos", "kr"]


STEMS = ["an", "fn", "Qn", "Kn", "Wq", "Wqg", "Wk", "Wv", "Wo", "Wz", "Wcq", "Wck", "Wcv", "Wb", "Wa",
         "Dt", "Al", "Gn", "Wg", "Wu", "Wd"]


def test_manifest_gguf_names_for_every_stem():
    """Layer 1 is an attention layer (its attention reads `Wq1`-numbered q1), layer 0 is not."""
    decls = "".join(f"Let {s}{l} be a 1 by 4 tensor of Real.\n" for l in (0, 1) for s in STEMS)
    src = decls + ("Let on be a 1 by 4 tensor of Real.\nLet Wout be a 4 by 4 tensor of Real.\n"
                   "Let emb be a 4 by 4 tensor of Real.\nLet K be a 2 by 4 tensor of Real.\n"
                   "Let q1 be Wq1 plus Wk1.\nLet a be attention of q1 over K and K with 1 heads 1 groups.\n")
    m = json.loads(emit_torch_module(src).manifest_json)
    got = {t["var"]: t["gguf"] for t in m["tensors"] if t["role"] != "computed"}
    want = {
        "an0": "blk.0.attn_norm.weight", "an1": "blk.1.attn_norm.weight",
        "fn0": "blk.0.post_attention_norm.weight", "Qn1": "blk.1.attn_q_norm.weight",
        "Kn0": "blk.0.attn_k_norm.weight",
        "Wq1": "blk.1.attn_q.weight", "Wqg1": "blk.1.attn_q.weight", "Wk1": "blk.1.attn_k.weight",
        "Wv1": "blk.1.attn_v.weight", "Wo1": "blk.1.attn_output.weight",
        "Wq0": "blk.0.attn_qkv.weight", "Wk0": "blk.0.attn_qkv.weight", "Wv0": "blk.0.attn_qkv.weight",
        "Wo0": "blk.0.ssm_out.weight", "Wz0": "blk.0.attn_gate.weight", "Wqg0": None, "Wz1": None,
        "Wcq0": "blk.0.ssm_conv1d.weight", "Wck1": "blk.1.ssm_conv1d.weight",
        "Wcv0": "blk.0.ssm_conv1d.weight", "Wb0": "blk.0.ssm_beta.weight", "Wa1": "blk.1.ssm_alpha.weight",
        "Dt0": "blk.0.ssm_dt.bias", "Al0": "blk.0.ssm_a", "Gn1": "blk.1.ssm_norm.weight",
        "Wg0": "blk.0.ffn_gate.weight", "Wu1": "blk.1.ffn_up.weight", "Wd0": "blk.0.ffn_down.weight",
        "on": "output_norm.weight", "Wout": "output.weight", "emb": "token_embd.weight", "K": None,
    }
    for var, name in want.items():
        assert got[var] == name, var
        assert gguf_name(var, frozenset({1})) == name
    # a leading zero names no tensor (Wq01 beside Wq1 would read blk.1's twice); layer 10 does
    assert [gguf_name(v, frozenset({1, 10})) for v in ("Wq01", "Wq001", "Wq10", "an00")] == \
        [None, None, "blk.10.attn_q.weight", None]
    # roles come from how the program reads a leaf, not from its checkpoint name: `K` and `Wq1`
    # are read as data (attention's K, plus's A), the rest are never read (weights)
    roles = {t["var"]: t["role"] for t in m["tensors"]}
    assert roles["K"] == roles["Wq1"] == "input" and roles["Wk1"] == "weight"
    assert roles["Wq0"] == roles["Wqg0"] == roles["emb"] == "weight"


def test_compile_py_marks_every_vendor_line(all_ops):
    c = emit_torch_module(all_ops).compile_py
    lines = c.splitlines()
    assert lines[0] == VENDOR_HEADER and lines[1] == TEMPLATE_MARK
    vendor = [l for l in lines if any(k in l for k in ("samba", "utils.", "parse_app_args(", "get_pefmeta("))
              and not l.lstrip().startswith(("#", '"'))]
    assert len(vendor) >= 10
    for l in vendor:
        assert l.endswith(TEMPLATE_MARK), l
    for needle in ("parse_app_args(", "samba.from_torch_model_(", "samba.session.compile(",
                   "utils.trace_graph(", "samba.session.run(", "pef_metadata=get_pefmeta(args, model)",
                   "args.pef_name", "args.output_folder", "args.command == \"compile\"",
                   "args.command == \"run\""):
        assert needle in c, needle
    compile(c, "compile.py", "exec")


def test_compile_py_without_sdk_says_so(all_ops, tmp_path):
    from conftest import emit_bundle
    d = emit_bundle(all_ops, tmp_path)
    r = subprocess.run([sys.executable, os.path.join(d, "compile.py"), "compile"], capture_output=True,
                       text=True)
    assert r.returncode == 1 and "needs SambaNova's SambaFlow SDK" in r.stderr


def test_an_op_without_spelling_is_refused_by_name():
    with pytest.raises(ProgramError) as e:
        emit_torch_module("Let a be a 1 by 2 tensor of Real.\nLet y be selective scan of a.\n")
    assert e.value.line == 2 and "`selective scan` has no torch spelling" in e.value.message
    with pytest.raises(ValueError, match="`selective scan` has no torch spelling"):
        torch_spelling("selective scan")
    for op in ("softmax routing", "sigmoid routing", "experts"):   # routed experts have a spelling
        assert torch_spelling(op)
    # the original emitter's `moe of X` (docs/SUGAR.md): read, and refused by name
    with pytest.raises(ProgramError) as e:
        emit_torch_module("Let a be a 1 by 2 tensor of Real.\nLet y be moe of a.\n")
    assert e.value.line == 2 and "`Let y be moe of a.`: `moe` has no torch spelling" in e.value.message
    with pytest.raises(ValueError, match="`conv2d` has no torch spelling"):
        torch_spelling("conv2d")


def test_qwen38_ops_all_spelled():
    assert len(QWEN38_OPS) == 14
    for op in QWEN38_OPS:
        assert torch_spelling(op)


def test_cli_emit_writes_three_files(tmp_path, all_ops_path):
    r = run_cli("emit", all_ops_path, "-o", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "b")) == ["compile.py", "manifest.json", "model.py"]
    py_compile.compile(str(tmp_path / "b" / "model.py"), doraise=True)
    with open(all_ops_path) as f:
        assert (tmp_path / "b" / "model.py").read_text() == emit_torch_module(f.read()).model_py


def test_cli_refusal_leaves_dir_untouched(tmp_path):
    bad = tmp_path / "bad.logos"
    bad.write_text("Let a be a 1 by 2 tensor of Real.\nLet y be selective scan of a.\n")
    out = tmp_path / "b"
    out.mkdir()
    (out / "model.py").write_text("old")
    r = run_cli("emit", str(bad), "-o", str(out))
    assert r.returncode == 1
    assert r.stderr.startswith(f"{bad}:2: `Let y be selective scan of a.`: `selective scan` has no "
                               "torch spelling")
    assert sorted(os.listdir(out)) == ["model.py"] and (out / "model.py").read_text() == "old"


def test_emission_does_not_import_torch(all_ops_path, tmp_path):
    code = ("import sys; from emitter.cli import main; rc = main(['emit', %r, '-o', %r]); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(rc)") % (all_ops_path, str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr


def test_emit_over_a_folder_where_a_file_goes_writes_nothing_and_names_it(tmp_path, all_ops_path):
    out = tmp_path / "b"
    (out / "manifest.json").mkdir(parents=True)
    r = run_cli("emit", all_ops_path, "-o", str(out))
    assert r.returncode == 1 and f"{out / 'manifest.json'}: is a folder" in r.stderr, r.stderr
    assert ".partial" not in r.stderr and sorted(os.listdir(out)) == ["manifest.json"]


def test_a_set_of_files_is_all_or_none_when_a_rename_fails(tmp_path, monkeypatch):
    """A rename that fails midway puts back what the set's earlier renames replaced, and removes
    what they added: the folder holds the old set, nothing staged."""
    from emitter import files
    (tmp_path / "a").write_text("old a")
    (tmp_path / "c").write_text("old c")
    real, calls = os.replace, []

    def failing(src, dst):
        calls.append(dst)
        if str(dst).endswith("/c") and src.endswith(files.PARTIAL) and ".was" not in src:
            raise OSError(28, "No space left on device", dst)
        return real(src, dst)
    monkeypatch.setattr(files.os, "replace", failing)
    with pytest.raises(OSError):
        files.write_files(str(tmp_path), {"a": "new a", "b": "new b", "c": "new c"})
    monkeypatch.setattr(files.os, "replace", real)
    assert sorted(os.listdir(tmp_path)) == ["a", "c"]
    assert (tmp_path / "a").read_text() == "old a" and (tmp_path / "c").read_text() == "old c"
    files.write_files(str(tmp_path), {"a": "new a", "b": "new b", "c": "new c"})
    assert [(tmp_path / n).read_text() for n in "abc"] == ["new a", "new b", "new c"]
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c"]


def test_the_row_index_of_a_view_read_as_a_parameter_is_an_input():
    """`row pos of COS` read only as rope's cos (a parameter slot) keeps COS a weight, but the row it
    selects is read as data: `pos` is an input (forward's argument; the fresh pass varies it), as
    it is where the row is read as data (`plus`)."""
    from emitter.language.reader import read_program
    head = ("Let pos be a 1 by 1 tensor of Int.\nLet COS be a 8 by 2 tensor of Real.\n"
            "Let SIN be a 8 by 2 tensor of Real.\nLet q be a 1 by 4 tensor of Real.\n"
            "Let c be row pos of COS.\nLet s be row pos of SIN.\n")
    for tail in ("Let qr be rope of q with cos c and sin s.\n", "Let qr be c plus s.\n"):
        roles = read_program(head + tail).roles
        assert roles["pos"] == "input", tail
        assert roles["COS"] == roles["SIN"] == "weight", tail   # (a table: a parameter slot)
