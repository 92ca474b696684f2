"""`import-gguf` and `import-gemma3` on a GGUF that does not fill the program, through the command
line: exit 1, one line naming the checkpoint and the leaves, and nothing written (no folder, no
file, an existing weights folder as it was); a full import still writes every leaf."""

import os

import pytest

from conftest import run_cli
from test_smollm2 import TINY, write_tiny_gguf

pytest.importorskip("gguf")

MLP = """Let x be a 1 by 32 tensor of Real.
Let W1 be a 32 by 8 tensor of Real.
Let y be x matmul W1.
"""


def write_tiny_gemma3(path, seed=0):
    """A random 2-layer Gemma 3 (both layers local) as llama.cpp writes one: tied embeddings."""
    import gguf
    import numpy as np
    rng = np.random.default_rng(seed)
    r = lambda *shape: (rng.standard_normal(shape) * 0.3).astype(np.float32)  # noqa: E731
    d, heads, kv, hd, ff, vocab = 16, 2, 1, 8, 24, 20
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tensor("token_embd.weight", r(vocab, d))
    for i in range(2):
        for name, shape in [("attn_norm", (d,)), ("attn_q", (heads * hd, d)), ("attn_k", (kv * hd, d)),
                            ("attn_v", (kv * hd, d)), ("attn_output", (d, heads * hd)),
                            ("attn_q_norm", (hd,)), ("attn_k_norm", (hd,)),
                            ("post_attention_norm", (d,)), ("ffn_norm", (d,)), ("ffn_gate", (ff, d)),
                            ("ffn_up", (ff, d)), ("ffn_down", (d, ff)), ("post_ffw_norm", (d,))]:
            w.add_tensor(f"blk.{i}.{name}.weight", r(*shape))
    w.add_tensor("output_norm.weight", r(d))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _snapshot(folder):
    if not os.path.isdir(folder):
        return None
    return {f: open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder))}


@pytest.fixture(scope="module", params=["gguf", "gemma3"])
def tiny(tmp_path_factory, request):
    """(importer, checkpoint, the program it writes from the checkpoint's metadata)."""
    base = tmp_path_factory.mktemp(request.param)
    ckpt = str(base / "tiny.gguf")
    if request.param == "gguf":
        write_tiny_gguf(ckpt, tied=True)
    else:
        write_tiny_gemma3(ckpt)
    prog = str(base / "tiny.logos")
    done = run_cli(f"import-{request.param}", ckpt, "--program", prog, "--write-program",
                   "--context", "6")
    assert done.returncode == 0, done.stderr
    return request.param, ckpt, prog


def test_a_program_no_tensor_maps_to_is_refused_and_nothing_written(tiny, tmp_path):
    importer, ckpt, _ = tiny
    prog = tmp_path / "mlp.logos"
    prog.write_text(MLP)
    out = tmp_path / "w" / "mlp"
    done = run_cli(f"import-{importer}", ckpt, "--program", str(prog), "-o", str(out))
    assert done.returncode == 1, (done.stdout, done.stderr)
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"{ckpt}: no leaf of the program maps to a tensor of this checkpoint")
    assert "`token_embd.weight`" in line and line.endswith("nothing was written")
    assert not (tmp_path / "w").exists()


def test_a_program_leaf_left_unfilled_is_refused_and_the_folder_kept(tiny, tmp_path):
    """The tiny llama's own program with one more weight no tensor maps to (`W9`, read by an op):
    refused naming `W9`; a weights folder already there keeps every file as it was."""
    importer, ckpt, prog = tiny
    text = open(prog).read()
    vocab = TINY["vocab"] if importer == "gguf" else 20
    assert "Let nxt be argmax of logits." in text
    text = text.replace("Let nxt be argmax of logits.", f"Let W9 be a {vocab} by 1 tensor of Real.\n"
                        "Let extra be logits matmul W9.\nLet nxt be argmax of logits.")
    bad = tmp_path / "bad.logos"
    bad.write_text(text)
    out = tmp_path / "weights"
    out.mkdir()
    (out / "emb.f32").write_bytes(b"old!")
    before = _snapshot(str(out))
    done = run_cli(f"import-{importer}", ckpt, "--program", str(bad), "-o", str(out))
    assert done.returncode == 1, (done.stdout, done.stderr)
    line = done.stderr.strip()
    assert line.startswith(f"{ckpt}: the program reads `W9`, which no tensor of this checkpoint maps to")
    assert line.endswith("nothing was written") and "\n" not in line
    assert _snapshot(str(out)) == before


def test_the_full_import_writes_every_leaf_and_no_staging_folder(tiny, tmp_path):
    importer, ckpt, prog = tiny
    out = tmp_path / "weights"
    done = run_cli(f"import-{importer}", ckpt, "--program", prog, "-o", str(out))
    assert done.returncode == 0, done.stderr
    from emitter.language.reader import read_file
    program = read_file(prog)
    files = sorted(os.listdir(out))
    assert not [f for f in files if f.startswith(".import-")]
    names = {os.path.splitext(f)[0] for f in files if not f.startswith(".")}
    assert set(program.required) <= names
    assert ".import.json" in files


def test_a_tensor_of_the_wrong_shape_half_way_leaves_nothing_written(tmp_path):
    """`emb` is read (and staged) before `on`'s tensor turns out to hold 16 values, not 32: the
    refusal names `on`, and no file, folder or staging folder is left."""
    import gguf
    import numpy as np
    ckpt = str(tmp_path / "odd.gguf")
    w = gguf.GGUFWriter(ckpt, "llama")
    for key, value in [("block_count", 1), ("embedding_length", 32), ("feed_forward_length", 8),
                       ("attention.head_count", 4)]:
        w.add_uint32(f"llama.{key}", value)
    w.add_tensor("token_embd.weight", np.ones((40, 32), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(16, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    prog = tmp_path / "p.logos"
    prog.write_text("Let tok be a 1 by 1 tensor of Int.\nLet emb be a 40 by 32 tensor of Real.\n"
                    "Let on be a 1 by 32 tensor of Real.\nLet e be row tok of emb.\n"
                    "Let y be rmsnorm of e with weight on.\n")
    out = tmp_path / "w" / "p"
    done = run_cli("import-gguf", ckpt, "--program", str(prog), "-o", str(out))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.strip() == (f"{prog}:3: `on` is 1 by 32 but `output_norm.weight` is 16 as "
                                   "the program uses it")
    assert not (tmp_path / "w").exists()


def test_a_tensor_the_file_says_is_huge_is_refused_by_its_shape_before_it_is_read(tmp_path):
    """A Q8_0 `token_embd.weight` the tensor list says is 10,000,000 by 32 (a sparse file of 340 MB,
    3 GB dequantised) for a 40 by 32 `emb`: refused from the tensor list, its blocks never read."""
    import subprocess
    import sys
    import gguf
    import numpy as np
    from conftest import ROOT
    ckpt = str(tmp_path / "huge.gguf")
    w = gguf.GGUFWriter(ckpt, "llama")
    for key, value in [("block_count", 1), ("embedding_length", 32), ("feed_forward_length", 8),
                       ("attention.head_count", 4)]:
        w.add_uint32(f"llama.{key}", value)
    n_bytes = 10_000_000 * 34   # (Q8_0: 34 bytes a block of 32)
    w.add_tensor_info("token_embd.weight", (10_000_000, 34), np.dtype(np.uint8), n_bytes,
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    os.truncate(ckpt, -(-os.path.getsize(ckpt) // 32) * 32 + n_bytes)
    prog = tmp_path / "p.logos"
    prog.write_text("Let tok be a 1 by 1 tensor of Int.\nLet emb be a 40 by 32 tensor of Real.\n"
                    "Let e be row tok of emb.\n")
    p = subprocess.Popen([sys.executable, "-m", "emitter", "import-gguf", ckpt, "--program", str(prog), "-o",
                          str(tmp_path / "w")], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1
    assert err.strip() == f"{prog}:2: `emb` is 40 by 32 but `token_embd.weight` is 10000000 by 32 as the program uses it"
    assert usage.ru_maxrss * 1024 < 1 << 30   # (reading it took 3 GB)
    assert not (tmp_path / "w").exists()


def test_a_quantised_tensor_of_a_big_endian_gguf_is_refused_naming_it(tmp_path, monkeypatch):
    """gguf-py dequantises little-endian blocks alone: a big-endian file's Q8_0 `ffn_up` would be
    other numbers (finite, at times, and passing a lock), so it is refused, the file named."""
    import sys
    from gguf.scripts import gguf_convert_endian
    ckpt = str(tmp_path / "be.gguf")
    write_tiny_gguf(ckpt, tied=True)
    prog = str(tmp_path / "tiny.logos")
    assert run_cli("import-gguf", ckpt, "--program", prog, "--write-program", "--context", "6").returncode == 0
    monkeypatch.setattr("builtins.input", lambda *a: "YES")
    monkeypatch.setattr(sys, "argv", ["gguf-convert-endian", ckpt, "big"])
    gguf_convert_endian.main()
    out = tmp_path / "w"
    done = run_cli("import-gguf", ckpt, "--program", prog, "-o", str(out))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.strip().startswith(f"{ckpt}: `blk.0.ffn_up.weight` is a Q8_0 tensor of a big-endian GGUF")
    assert not out.exists()


def test_a_gguf_whose_metadata_names_a_billion_layers_is_refused_before_a_program_is_made(tmp_path):
    """`--write-program` from a small GGUF that says `block_count: 1e9` grew without bound (7 GB in
    30 s); it is refused from its metadata, naming the file and the value. One with no token
    embedding is refused naming that (it was a KeyError)."""
    import gguf
    import numpy as np

    def write(name, layers, embedding):
        ckpt = str(tmp_path / name)
        w = gguf.GGUFWriter(ckpt, "llama")
        for key, value in [("block_count", layers), ("embedding_length", 32), ("feed_forward_length", 8),
                           ("attention.head_count", 4)]:
            w.add_uint32(f"llama.{key}", value)
        if embedding:
            w.add_tensor("token_embd.weight", np.ones((40, 32), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return ckpt
    prog = tmp_path / "p.logos"
    for ckpt, said in [(write("big.gguf", 10 ** 9, True), "block_count 1000000000 is not a whole number from 1 "
                        "to 4096 (what a program is generated with)"),
                       (write("none.gguf", 1, False), "the GGUF has no 2-D `token_embd.weight` (the token embedding)")]:
        done = run_cli("import-gguf", ckpt, "--program", str(prog), "--write-program")
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert done.stderr.strip() == f"{ckpt}: {said}"
        assert not prog.exists()


@pytest.mark.parametrize("context", ["0", "-3", "x", str((1 << 20) + 1)])
def test_a_context_that_is_no_count_of_positions_is_refused_by_the_command(tiny, tmp_path, context):
    importer, ckpt, _ = tiny
    prog = tmp_path / "p.logos"
    done = run_cli(f"import-{importer}", ckpt, "--program", str(prog), "--write-program", f"--context={context}")
    assert done.returncode == 2 and f"--context: must be a whole number from 1 to 1048576, got '{context}'" in done.stderr
    assert not prog.exists()
