"""Weights folders as users make them: `<leaf>.npy` and `.safetensors` files beside raw `.f64`/`.f32`,
read the same by the VM (`logos run`), the lock and model.py run by hand; every bad file one line
naming it (and the tensor), exit 1; stray files a warning on the terminal; the key claims every
file a reader reads."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

from conftest import ROOT, run_cli
from emitter.sambaflow.weight_files import claimed_files, weight_places

AFFINE = ("Let X be a 2 by 3 tensor of Real.\nLet W be a 3 by 4 tensor of Real.\n"
          "Let b be a 1 by 4 tensor of Real.\nLet h be X matmul W.\nLet y be h plus b.\n")
RNG = np.random.default_rng(5)
X, W, B = RNG.standard_normal((2, 3)), RNG.standard_normal((3, 4)), RNG.standard_normal((1, 4))


@pytest.fixture(scope="module")
def affine(tmp_path_factory):
    """The program, its bundle (emitted through the command line) and the expected output."""
    d = tmp_path_factory.mktemp("affine")
    (d / "affine.logos").write_text(AFFINE)
    p = run_cli("emit", str(d / "affine.logos"), "-o", str(d / "bundle"))
    assert p.returncode == 0, p.stderr
    return d


def _folder(d, name, files):
    """A weights folder: {file name: array (saved by its suffix) or {tensor: array} (.safetensors)
    or bytes}."""
    w = d / name
    w.mkdir()
    for fname, value in files.items():
        if isinstance(value, bytes):
            (w / fname).write_bytes(value)
        elif fname.endswith(".safetensors"):
            save_file(value, str(w / fname))
        elif fname.endswith(".npy"):
            np.save(w / fname, value)
        else:
            value.astype("<f8" if fname.endswith(".f64") else "<f4").tofile(w / fname)
    return str(w)


def _run(d, weights):
    """`logos run` (the VM) on `weights`: (the process, its output as float64 or None)."""
    out = d / "vm.bin"
    if out.exists():
        out.unlink()
    p = run_cli("run", str(d / "affine.logos"), "--weights", weights, "--out", str(out))
    return p, (np.fromfile(out, dtype="<f8") if out.exists() else None)


def _model_py(bundle, *args, cwd=None):
    """model.py run by hand, as a user runs it."""
    return subprocess.run([sys.executable, os.path.join(bundle, "model.py"), *args],
                          capture_output=True, text=True, cwd=cwd or os.path.dirname(bundle))


def _one_line(p):
    """A refusal as users must see it: exit 1, one line on stderr, no traceback."""
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 1 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


# 1. .npy and .safetensors hold the same values as raw files, for the VM, the lock and model.py

@pytest.mark.parametrize("layout", ["npy", "safetensors"])
def test_npy_and_safetensors_folders_run_lock_and_load_by_hand(affine, tmp_path, layout):
    w32 = W.astype(np.float32)
    want = (X @ w32.astype(np.float64) + B).reshape(-1)     # W held as float32 and widened exactly
    if layout == "npy":   # 2-D float64, 1-D float32 (rows·cols values), and a raw file beside them
        weights = _folder(tmp_path, "w", {"X.npy": X, "W.npy": w32.reshape(-1), "b.f64": B})
    else:                 # one file; b 1-D as checkpoints hold biases; a tensor no leaf names
        weights = _folder(tmp_path, "w", {"model.safetensors": {"X": X, "W": w32, "b": B.reshape(-1),
                                                                 "unused": np.zeros(3)}})
    p, got = _run(affine, weights)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    bundle = str(affine / "bundle")
    out = tmp_path / "model.bin"
    p = _model_py(bundle, "--weights", weights, "--dtype", "float64", "--out", str(out))
    assert p.returncode == 0 and p.stderr == "", p.stderr   # (float32 values read at float64: no warning)
    np.testing.assert_allclose(np.fromfile(out, dtype="<f8"), want, rtol=1e-13, atol=0)
    p = run_cli("lock", bundle, "--program", str(affine / "affine.logos"), "--weights", weights,
                "-o", str(tmp_path / "r.json"))
    r = json.loads((tmp_path / "r.json").read_text())
    assert p.returncode == 0 and r["verdict"] == "pass" and r["load"]["pass"], p.stderr
    assert r["unmatched_weights"] == [] and r["hashes"]["weights"]
    manifest = json.loads((affine / "bundle" / "manifest.json").read_text())
    assert "<var>.npy" in manifest["weight_files"] and manifest["tensors"][0]["file"] == "X.f64"


def _npy(a):
    """The bytes np.save writes for `a`."""
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


# 2. a bad file is one line naming it (and the tensor), from the VM and from model.py alike

BAD = [
    ("st_shape", {"m.safetensors": {"X": X, "W": W.T.copy(), "b": B}},
     "m.safetensors: tensor `W` is 4 by 3, the program's `W` is 3 by 4"),
    ("st_dtype", {"m.safetensors": {"X": X, "W": W.astype(np.float16), "b": B}},
     "m.safetensors: tensor `W` holds F16 values; a leaf's must be float64 or float32"),
    ("st_garbage", {"m.safetensors": b"\xff" * 40, "X.f64": X, "W.f64": W, "b.f64": B},
     "m.safetensors: not a safetensors file"),
    # a header nested past the JSON parser's depth: its RecursionError named no file
    ("st_deep", {"m.safetensors": len(b'{"W":' + b"[" * 200000 + b"]" * 200000 + b"}").to_bytes(8, "little")
     + b'{"W":' + b"[" * 200000 + b"]" * 200000 + b"}", "X.f64": X, "W.f64": W, "b.f64": B},
     "m.safetensors: the safetensors header is not JSON (maximum recursion depth"),
    ("npy_int", {"X.npy": X, "W.npy": W.astype(np.int64), "b.npy": B}, "W.npy: `W` holds <i8 values"),
    ("npy_shape", {"X.npy": X.T.copy(), "W.npy": W, "b.npy": B}, "X.npy: `X` is 3 by 2, the program's `X` is 2 by 3"),
    ("npy_fortran", {"X.f64": X, "W.npy": np.asfortranarray(W), "b.f64": B}, "W.npy: the array is in Fortran"),
    ("npy_garbage", {"X.npy": b"not numpy", "W.f64": W, "b.f64": B}, "X.npy: not a .npy file"),
    # a header cut short: numpy's own parser raises tokenize's TokenError, no ValueError
    ("npy_cut", {"X.npy": b"\x93NUMPY\x01\x00\x05\x00{'des\n", "W.f64": W, "b.f64": B},
     "X.npy: not a .npy file numpy can read (TokenError"),
    # values past the array's: a .npy file is its header and its values, nothing after them
    ("npy_trailing", {"X.npy": _npy(X) + b"\0" * 8, "W.f64": W, "b.f64": B},
     "X.npy: `X` should take 48 bytes, the file holds 56"),
    ("f64_odd_size", {"X.f64": b"\0" * 17, "W.f64": W, "b.f64": B},
     "X.f64: `X` is 2 by 3: expected 48 bytes of float64, the file has 17"),
    ("twice", {"m.safetensors": {"X": X}, "X.f64": X, "W.f64": W, "b.f64": B},
     "both `X.f64` and `m.safetensors` hold `X`; keep one"),
    ("missing", {"X.f64": X, "W.f64": W}, "`b`"),
]


@pytest.mark.parametrize("name,files,needle", BAD, ids=[b[0] for b in BAD])
def test_a_bad_weights_file_is_one_line_naming_it(affine, tmp_path, name, files, needle):
    weights = _folder(tmp_path, "w", files)
    p, _ = _run(affine, weights)
    assert needle in _one_line(p)
    line = _one_line(_model_py(str(affine / "bundle"), "--weights", weights))
    assert line.startswith("model.py: ") and needle in line, line


# 3. model.py run by hand: bad row indices, a missing folder; the VM refuses the same

EMBED = ("Let Emb be a 10 by 6 tensor of Real.\nLet tok be a 1 by 1 tensor of Int.\nSet item 1 of tok to 7.\n"
         "Let i be a 1 by 1 tensor of Real.\nLet e be row tok of Emb.\nLet r be row i of Emb.\n"
         "Let y be e plus r.\n")


@pytest.mark.parametrize("tok,i,needle", [
    (7.5, 0, "tok.f64: `tok` is an Int tensor"),          # truncated to 7 by index_select before
    (12, 0, "the row index `tok` is 12.0, not a row number in 0..9"),    # an IndexError traceback
    (3, 2.5, "the row index `i` is 2.5, not a row number in 0..9"),      # a Real index: at the op
    (3, -1, "the row index `i` is -1.0, not a row number in 0..9"),
])
def test_model_py_refuses_a_bad_row_index_in_one_line(tmp_path, tok, i, needle):
    (tmp_path / "e.logos").write_text(EMBED)
    assert run_cli("emit", str(tmp_path / "e.logos"), "-o", str(tmp_path / "b")).returncode == 0
    weights = _folder(tmp_path, "w", {"Emb.f64": RNG.standard_normal((10, 6)),
                                      "tok.f64": np.array([tok], float), "i.f64": np.array([i], float)})
    assert needle in _one_line(_model_py(str(tmp_path / "b"), "--weights", weights))
    vm = run_cli("run", str(tmp_path / "e.logos"), "--weights", weights, "--out", str(tmp_path / "o"))
    assert vm.returncode == 1 and ("not a row number" in vm.stderr or "Int tensor" in vm.stderr)
    line = _one_line(_model_py(str(tmp_path / "b"), "--weights", str(tmp_path / "nowhere")))
    assert line == f"model.py: {tmp_path / 'nowhere'}: the weights directory does not exist"
    assert "no value for Emb" in _one_line(_model_py(str(tmp_path / "b")))   # no --weights at all


# 4. a file no leaf claims is a warning on the terminal (run, lock)

def test_a_stray_weights_file_is_a_warning_on_the_terminal(affine, tmp_path):
    weights = _folder(tmp_path, "w", {"X.f64": X, "W.f64": W, "b.f64": B, "b1_old.f64": B,
                                      "other.safetensors": {"Wq": W}})
    p, _ = _run(affine, weights)
    for p in (p, run_cli("lock", str(affine / "bundle"), "--program", str(affine / "affine.logos"),
                         "--weights", weights, "-o", str(tmp_path / "r.json"))):
        assert p.returncode == 0, p.stderr
        assert f"warning: {weights}: `b1_old.f64` matches no leaf of the program (ignored)" in p.stderr
        assert f"warning: {weights}: `other.safetensors` matches no leaf" in p.stderr
    assert json.loads((tmp_path / "r.json").read_text())["unmatched_weights"] == ["b1_old.f64", "other.safetensors"]


# 5. what the pipeline's key claims: every file a reader reads, by name alone

def test_claimed_files_cover_every_file_the_readers_read(tmp_path):
    names = {"X.f64", "X.npy", "W.f32", "b.npy", "model.safetensors", "b1_old.f64", "notes.txt", "Xf64"}
    assert claimed_files(names, ["X", "W", "b"]) == {"X.f64", "X.npy", "W.f32", "b.npy", "model.safetensors"}
    weights = _folder(tmp_path, "w", {"X.npy": X, "m.safetensors": {"W": W, "b": B}, "b1_old.f64": B,
                                      "n.safetensors": {"Wq": W}})
    places, claimed = weight_places(weights, ["X", "W", "b"])
    assert claimed == {"X.npy", "m.safetensors"} and places["W"][:2] == ("m.safetensors", "W")
    assert claimed <= claimed_files(os.listdir(weights), ["X", "W", "b"])
    assert "b1_old.f64" not in claimed_files(os.listdir(weights), ["X", "W", "b"])


# 6. an import that fills no leaf, or leaves a read leaf unfilled, is an error writing nothing

def test_import_safetensors_of_an_unknown_layout_exits_1_naming_what_it_did_not_map(tmp_path):
    ck = tmp_path / "ck.safetensors"
    save_file({"layer.0.weight": W.T.copy(), "layer.0.bias": B.reshape(-1)}, str(ck))
    (tmp_path / "a.logos").write_text(AFFINE)
    p = run_cli("import-safetensors", str(ck), "--program", str(tmp_path / "a.logos"), "-o", str(tmp_path / "out"))
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith(f"{ck}: no leaf of the program maps to a tensor of this checkpoint; its "
                               "tensors `layer.0.bias`, `layer.0.weight` map to no leaf"), p.stderr
    assert "nothing was written" in p.stderr and not (tmp_path / "out").exists()
    # a known tensor, but a leaf the program reads left with no value
    (tmp_path / "e.logos").write_text("Let Wword be a 4 by 3 tensor of Real.\nLet X be a 1 by 4 tensor of Real.\n"
                                      "Let y be X matmul Wword.\n")
    save_file({"embeddings.word_embeddings.weight": W.T.copy()}, str(ck))
    p = run_cli("import-safetensors", str(ck), "--program", str(tmp_path / "e.logos"), "-o", str(tmp_path / "out"))
    assert p.returncode == 1 and "the program reads `X`, which no tensor of this checkpoint maps to" in p.stderr
    assert not (tmp_path / "out").exists()


# 7. a bundle locked by hand tests itself: golden/ for every dtype compile.py test runs

def test_a_bundle_emitted_and_locked_by_hand_runs_compile_py_test(affine, tmp_path):
    bundle = tmp_path / "bundle"
    assert run_cli("emit", str(affine / "affine.logos"), "-o", str(bundle)).returncode == 0
    weights = _folder(tmp_path, "w", {"X.npy": X, "W.f64": W, "b.f64": B})
    lock = ("lock", str(bundle), "--program", str(affine / "affine.logos"), "--weights", weights)
    p = run_cli(*lock, "--atol", "1e-8", "-o", str(tmp_path / "r.json"))     # float64, as by default
    assert p.returncode == 0, p.stderr
    tolerances = json.loads((bundle / "golden" / "golden.json").read_text())["tolerances"]
    assert tolerances == {"float32": {"abs": 1e-4, "rel": 1e-3}, "float64": {"abs": 1e-8, "rel": 1e-9}}

    def compile_py(*args):
        return subprocess.run([sys.executable, str(bundle / "compile.py"), "test", *args],
                              capture_output=True, text=True, cwd=str(tmp_path))
    p = compile_py()
    assert p.returncode == 0 and "[float32, 1 step(s)" in p.stdout and "PASS" in p.stdout, p.stdout + p.stderr
    p = compile_py("--dtype", "float64")
    assert p.returncode == 0 and "[float64, 1 step(s)" in p.stdout and "PASS" in p.stdout, p.stdout + p.stderr
    # a second lock of the same run keeps the first one's tolerance; its own wins for its dtype
    assert run_cli(*lock, "--dtype", "float32", "--atol", "2e-4", "-o", str(tmp_path / "r2.json")).returncode == 0
    tolerances = json.loads((bundle / "golden" / "golden.json").read_text())["tolerances"]
    assert tolerances == {"float32": {"abs": 2e-4, "rel": 1e-3}, "float64": {"abs": 1e-8, "rel": 1e-9}}
    # other weights make another run: the earlier lock's tolerances go with it
    other = _folder(tmp_path, "w2", {"X.f64": X + 1, "W.f64": W, "b.f64": B})
    assert run_cli(*lock[:-1], other, "-o", str(tmp_path / "r3.json")).returncode == 0
    tolerances = json.loads((bundle / "golden" / "golden.json").read_text())["tolerances"]
    assert tolerances == {"float32": {"abs": 1e-4, "rel": 1e-3}, "float64": {"abs": 1e-9, "rel": 1e-9}}
    # and a bad file among the weights compile.py test reads is one line too
    os.unlink(os.path.join(other, "W.f64"))
    (tmp_path / "w2" / "W.npy").write_bytes(b"junk")
    line = _one_line(compile_py())
    assert line.startswith("compile.py: ") and "W.npy: not a .npy file" in line


# 8. `run --state-out` into the weights folder itself: a .npy state is replaced by its .f64, a
#    tensor of a .safetensors file cannot be, and is refused

def test_state_out_in_place_replaces_a_npy_state_and_refuses_a_safetensors_one(tmp_path):
    prog = tmp_path / "s.logos"
    prog.write_text("Let T be a 2 by 3 tensor of Real.\nLet r be a 1 by 3 tensor of Real.\n"
                    "Set item 1 of r to 1.\nLet q be row 1 of T.\nLet s be q plus r.\nSet row 1 of T to s.\n"
                    "Let y be row 1 of T.\n")
    w = _folder(tmp_path, "w", {"T.npy": np.zeros((2, 3))})
    run = ("run", str(prog), "--weights", w, "--out", str(tmp_path / "o"), "--state-out", w)
    assert run_cli(*run).returncode == 0
    assert sorted(os.listdir(w)) == ["T.f64"]
    assert run_cli(*run).returncode == 0           # resumed from T.f64: row 1 is now 2, 0, 0
    np.testing.assert_array_equal(np.fromfile(tmp_path / "o", dtype="<f8"), [2.0, 0, 0])
    s = _folder(tmp_path, "s", {"m.safetensors": {"T": np.zeros((2, 3))}})
    p = run_cli("run", str(prog), "--weights", s, "--out", str(tmp_path / "o"), "--state-out", s)
    assert p.returncode == 1 and "the state `T` is a tensor of `m.safetensors`" in p.stderr, p.stderr
    assert sorted(os.listdir(s)) == ["m.safetensors"]


def test_a_short_write_of_a_leaf_names_the_file_and_the_full_disk(tmp_path):
    """numpy's tofile on a full disk says only "N requested and 0 written": the writer's error
    names the file and ENOSPC, and leaves no partial file behind."""
    import errno

    from emitter.files import write_atomic

    class Full:
        def tofile(self, f):
            raise OSError("655360 requested and 0 written")
    try:
        write_atomic(str(tmp_path / "W.f32"), Full())
    except OSError as e:
        assert e.errno == errno.ENOSPC and e.filename == str(tmp_path / "W.f32"), e
        assert "655360 requested and 0 written: is the disk full?" in str(e), e
    else:
        raise AssertionError("no error")
    assert list(tmp_path.iterdir()) == []
