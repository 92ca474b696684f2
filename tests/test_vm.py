"""The VM: fills, states across steps, leaf files and their errors, the `run` command."""

import json
import os

import numpy as np
import pytest

import reference as ref
from conftest import run_cli
from emitter import ProgramError, read_program
from emitter.verify import vm

RING = """Let x be a 1 by 3 tensor of Real.
Set item 1 of x to 1.
Set item 3 of x to -2.5.
Let wc be a 2 by 3 tensor of Real.
Set item 1 of wc to 1.
Set item 4 of wc to 2.
Set item 6 of wc to 0.5.
Let cs be a 2 by 3 tensor of Real.
Let y be causal conv of x with weight wc state cs over 2 taps.
"""


def test_fills_count_from_one_row_major():
    p = read_program(RING)
    np.testing.assert_array_equal(vm.declared_value(p, "x"), [[1.0, 0.0, -2.5]])
    np.testing.assert_array_equal(vm.declared_value(p, "wc"), [[1.0, 0, 0], [2.0, 0, 0.5]])


def test_states_carry_across_steps():
    p = read_program(RING)
    leaves = vm.load_leaves(p).values
    traces = vm.run(p, leaves, steps=3)
    ring = leaves["cs"]
    for t in traces:
        want, ring = ref.causal_conv(leaves["x"], leaves["wc"], ring)
        np.testing.assert_allclose(t.output, want)
        np.testing.assert_allclose(t.states["cs"], ring)
    # step 1 sees an empty ring: only the newest tap weighs in; step 2 sees x in the old slot too
    np.testing.assert_allclose(traces[0].output, [[2.0, 0, -1.25]])
    np.testing.assert_allclose(traces[1].output, [[3.0, 0, -1.25]])


def test_kv_table_written_back_and_read_in_same_step():
    p = read_program("Let t be a 3 by 2 tensor of Real.\nLet r be a 1 by 2 tensor of Real.\n"
                     "Set item 1 of r to 4.\nSet row 1 of t to r.\nLet y be row 1 of t.\n")
    tr = vm.run(p, vm.load_leaves(p).values, steps=2)
    np.testing.assert_array_equal(tr[0].output, [[4.0, 0.0]])
    np.testing.assert_array_equal(tr[1].states["t"], [[0, 0], [4.0, 0], [0, 0]])


def _write(path, values, dtype):
    np.asarray(values, dtype=dtype).tofile(path)


def test_weights_files_f64_f32_and_unmatched(tmp_path):
    p = read_program(RING)
    _write(tmp_path / "x.f32", [1, 2, 3], "<f4")
    _write(tmp_path / "wc.f64", np.arange(6), "<f8")
    (tmp_path / "notes.txt").write_text("hi")
    leaves = vm.load_leaves(p, str(tmp_path))
    assert leaves.sources == {"x": "x.f32", "wc": "wc.f64", "cs": "declared"}
    assert leaves.unmatched == ["notes.txt"]
    assert leaves.values["x"].dtype == np.float32  # widened where read
    out = vm.run(p, leaves.values)[0].output
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, [[3.0, 8.0, 15.0]])


def test_a_folder_of_thousands_of_stray_files_is_warned_of_in_a_few_lines():
    from emitter.verify.verdict import UNMATCHED_SAID, unmatched
    lines = unmatched("weights/p", [f"junk{i:04d}.bin" for i in range(3000)])
    assert len(lines) == UNMATCHED_SAID + 1 and "`junk0000.bin` matches no leaf" in lines[0]
    assert lines[-1] == f"warning: weights/p: {3000 - UNMATCHED_SAID} more files match no leaf of the program (ignored)"
    assert unmatched("w", ["a.f64"]) == ["warning: w: `a.f64` matches no leaf of the program (ignored)"]


@pytest.mark.parametrize("files,needle", [
    ({"x.f64": ([1, 2], "<f8")}, "expected 24 bytes of float64, the file has 16"),
    ({"x.f32": ([1, 2, 3, 4], "<f4")}, "expected 12 bytes of float32, the file has 16"),
    ({"x.f64": ([1, np.nan, 3], "<f8")}, "non-finite value (nan) at flat index 1"),
    ({"x.f32": ([1, np.inf, 3], "<f4")}, "non-finite value (inf)"),
    ({"x.f64": ([1, 2, 3], "<f8"), "x.f32": ([1, 2, 3], "<f4")}, "both `x.f32` and `x.f64` hold `x`; keep one"),
])
def test_bad_weights(tmp_path, files, needle):
    p = read_program(RING)
    for name, (vals, dt) in files.items():
        _write(tmp_path / name, vals, dt)
    with pytest.raises(ProgramError) as e:
        vm.load_leaves(p, str(tmp_path))
    assert needle in e.value.message
    assert str(tmp_path) in str(e.value)


def test_leaf_checks_not_repeated_on_bytes_they_passed(tmp_path, monkeypatch):
    """A program's other checks in one process do not read its weights again for the VM's leaf
    checks: the same bytes (their sha256 on the hash record under the file's stamp now), checked
    the same way, passed. An edit that puts size and mtime back, or a check that allows less, reads."""
    from emitter import fingerprint
    monkeypatch.setattr(fingerprint, "RACY_S", 0.0)   # a file just written is recorded all the same
    monkeypatch.setattr(fingerprint, "_CURRENT", [fingerprint.Fingerprints()])
    p = read_program(RING)
    path = tmp_path / "x.f64"
    _write(path, [1, 2, 3], "<f8")
    real, read = vm.release, []   # (the check lets go of each block it read)
    monkeypatch.setattr(vm, "release", lambda a: read.append(a.size) or real(a))
    vm.load_leaves(p, str(tmp_path))
    assert read == [3]   # not on record yet: checked, and nothing remembered (never hashed for it)
    vm.load_leaves(p, str(tmp_path))
    assert read == [3, 3]
    fingerprint.sha256(str(path))   # as a lock's weights digest records it
    vm.load_leaves(p, str(tmp_path))
    vm.load_leaves(p, str(tmp_path))
    assert read == [3, 3, 3]
    st = os.stat(path)
    with open(path, "r+b") as f:   # NaN in place, size and mtime put back: its ctime moved
        f.seek(8)
        f.write(np.float64(np.nan).tobytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ProgramError, match=r"non-finite value \(nan\) at flat index 1"):
        vm.load_leaves(p, str(tmp_path))
    fingerprint.sha256(str(path))
    vm.load_leaves(p, str(tmp_path), allow_nonfinite=("x",))   # passes where NaN is allowed...
    with pytest.raises(ProgramError, match="non-finite value"):   # ...and that pass is not this one
        vm.load_leaves(p, str(tmp_path))


def test_int_leaf_file_must_hold_integers(tmp_path):
    p = read_program("Let t be a 1 by 2 tensor of Int.\nLet y be silu of t.\n")
    _write(tmp_path / "t.f64", [1, 2.5], "<f8")
    with pytest.raises(ProgramError, match="Int tensor but the file holds non-integers"):
        vm.load_leaves(p, str(tmp_path))


def test_missing_weights_dir():
    with pytest.raises(ProgramError, match="does not exist"):
        vm.load_leaves(read_program(RING), "/nonexistent/weights")


@pytest.mark.parametrize("value,needle", [("7", "not a row number in 0..2"), ("-1", "not a row number"),
                                          ("1.5", "is 1.5, not a row number")])
def test_row_index_out_of_range_names_line(value, needle):
    p = read_program(f"Let t be a 3 by 2 tensor of Real.\nSet item 1 of t to 1.\n"
                     f"Let i be a 1 by 1 tensor of Real.\nSet item 1 of i to {value}.\nLet y be row i of t.\n")
    with pytest.raises(ProgramError) as e:
        vm.run(p, vm.load_leaves(p).values)
    assert e.value.line == 5 and needle in e.value.message


def test_set_row_index_out_of_range_names_line():
    p = read_program("Let t be a 3 by 2 tensor of Real.\nLet i be a 1 by 1 tensor of Int.\n"
                     "Set item 1 of i to 3.\nLet r be a 1 by 2 tensor of Real.\nSet item 2 of r to 1.\n"
                     "Set row i of t to r.\nLet y be silu of r.\n")
    with pytest.raises(ProgramError) as e:
        vm.run(p, vm.load_leaves(p).values)
    assert e.value.line == 6


def test_run_cli(tmp_path):
    prog = tmp_path / "ring.logos"
    prog.write_text(RING)
    (tmp_path / "w").mkdir()
    _write(tmp_path / "w" / "x.f64", [1, 2, 3], "<f8")
    _write(tmp_path / "w" / "extra.f64", [1], "<f8")
    r = run_cli("run", str(prog), "--weights", str(tmp_path / "w"), "--steps", "2", "--out",
                str(tmp_path / "o.bin"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"output": "y", "shape": [1, 3], "first": 3.0, "argmax": 0, "steps": 2}
    assert "`extra.f64` matches no leaf" in r.stderr
    got = np.fromfile(tmp_path / "o.bin", dtype="<f8")
    assert os.path.getsize(tmp_path / "o.bin") == 24
    np.testing.assert_allclose(got, [3.0, 0.0, 1.5])


def test_run_cli_bad_weight_exit_1(tmp_path):
    prog = tmp_path / "ring.logos"
    prog.write_text(RING)
    _write(tmp_path / "x.f64", [1, 2], "<f8")
    r = run_cli("run", str(prog), "--weights", str(tmp_path), "--out", str(tmp_path / "o.bin"))
    assert r.returncode == 1 and "x.f64" in r.stderr and "expected 24 bytes" in r.stderr
    assert not (tmp_path / "o.bin").exists()


def test_leaf_file_linking_outside_is_refused(tmp_path):
    p = read_program(RING)
    (tmp_path / "w").mkdir()
    _write(tmp_path / "x_real.f64", [1, 2, 3], "<f8")
    os.symlink(tmp_path / "x_real.f64", tmp_path / "w" / "x.f64")
    with pytest.raises(ProgramError, match="links outside the weights directory"):
        vm.load_leaves(p, str(tmp_path / "w"))


@pytest.mark.parametrize("name, content", [("x.f64", b"\0" * 5),   # a leaf's: of the wrong size
                                           ("t.safetensors", b"no header")])   # no leaf's it holds
def test_a_file_linking_outside_is_refused_before_it_is_opened_or_sized(tmp_path, name, content):
    """A file of the folder a leaf may claim (every .safetensors file) that links outside the
    folder, the repository and every named root is refused by its link alone: never opened (a
    header outside is not parsed) nor sized (its size is not said)."""
    p = read_program(RING)
    (tmp_path / "w").mkdir()
    (tmp_path / "outside").write_bytes(content)
    os.symlink(tmp_path / "outside", tmp_path / "w" / name)
    if name != "x.f64":
        _write(tmp_path / "w" / "x.f64", [1, 2, 3], "<f8")
    with pytest.raises(ProgramError, match=f"`{name}` links outside the weights directory") as e:
        vm.load_leaves(p, str(tmp_path / "w"))
    assert "bytes" not in str(e.value) and "header" not in str(e.value)


def test_an_int_leaf_allowed_nan_is_still_refused_as_no_integer(tmp_path):
    """allow_nonfinite lets a leaf hold NaN; an Int leaf's NaN (or 2.5) is no integer all the same,
    said with its own value and index."""
    p = read_program("Let t be a 1 by 3 tensor of Int.\nLet y be silu of t.\n")
    for values, said in (([1, np.nan, 2], r"\(nan at flat index 1\)"), ([1, 2.5, np.nan], r"\(2.5 at flat index 1\)"),
                         ([1, 2, -np.inf], r"\(-inf at flat index 2\)")):
        _write(tmp_path / "t.f64", values, "<f8")
        with pytest.raises(ProgramError, match="Int tensor but the file holds non-integers " + said):
            vm.load_leaves(p, str(tmp_path), allow_nonfinite=("t",))


def test_a_weights_scan_is_kept_by_the_bytes_sha_and_never_outlives_them(tmp_path, monkeypatch):
    """The VM's scan of a weights file (NaN, extremes) is kept beside the hash record by the bytes'
    sha256 and the code that scanned: a later process does not read the file for it; other code,
    or bytes edited with their size and mtime put back, scan again (a NaN there is found)."""
    from emitter import fingerprint
    monkeypatch.setattr(fingerprint, "RACY_S", 0.0)   # (a file written just now may be remembered)
    p = read_program(RING)
    weights = tmp_path / "weights"
    weights.mkdir()
    wc = weights / "wc.f64"
    np.array([[1.0, -7.5, 2.0], [0.25, 3.0, -1.0]]).tofile(wc)
    record = str(tmp_path / "build" / ".fingerprints.json")
    os.makedirs(os.path.dirname(record))
    kept = fingerprint._CURRENT[0]
    scans = []
    real_release = vm.release
    monkeypatch.setattr(vm, "release", lambda v: scans.append(1) or real_release(v))

    def fresh_process():
        vm._PASSED.clear()
        fingerprint._CURRENT[0] = fingerprint.Fingerprints(record)
        scans.clear()
    try:
        fresh_process()
        fingerprint.sha256(str(wc))
        assert vm.load_leaves(p, str(weights)).peaks["wc"] == -7.5 and scans
        fingerprint.save()
        found = json.load(open(record[:-len(".json")] + ".checked.json"))["found"]
        assert list(found.values()) == [-7.5] and fingerprint.sha256(str(wc)) in next(iter(found))
        fresh_process()
        assert vm.load_leaves(p, str(weights)).peaks["wc"] == -7.5 and not scans
        code = vm._SCAN_CODE
        monkeypatch.setattr(vm, "_SCAN_CODE", "other code")     # found by other code: scanned
        fresh_process()
        assert code and vm.load_leaves(p, str(weights)).peaks["wc"] == -7.5 and scans
        monkeypatch.setattr(vm, "_SCAN_CODE", code)
        st = os.stat(wc)
        np.array([[1.0, -7.5, 2.0], [0.25, np.nan, -1.0]]).tofile(wc)
        os.utime(wc, ns=(st.st_atime_ns, st.st_mtime_ns))
        fresh_process()
        fingerprint.sha256(str(wc))
        with pytest.raises(ProgramError, match="non-finite value"):
            vm.load_leaves(p, str(weights))
        findings = open(record[:-len(".json")] + ".checked.json").read()
        os.chmod(os.path.dirname(record), 0o775)   # a build/ others may write: nothing read, nothing written over
        np.array([[1.0, -7.5, 2.0], [0.25, 9.0, -1.0]]).tofile(wc)
        fresh_process()
        fingerprint.sha256(str(wc))
        assert vm.load_leaves(p, str(weights)).peaks["wc"] == 9.0 and scans
        fingerprint.save()
        assert open(record[:-len(".json")] + ".checked.json").read() == findings
    finally:
        os.chmod(os.path.dirname(record), 0o755)
        fingerprint._CURRENT[0] = kept
        vm._PASSED.clear()


def test_non_integers_written_back_into_an_int_state_are_an_error_at_the_writing_line():
    # an Int tensor holds integers: a file of the state written back would be refused when read
    src = ("Let t be a 1 by 1 tensor of Int.\nSet item 1 of t to 1.\nLet h be a 1 by 1 tensor of Real.\n"
           "Set item 1 of h to {h}.\nLet y be t hadamard h.\nSet row 0 of t to y.\nLet z be t plus t.\n")
    p = read_program(src.format(h="0.5"))
    with pytest.raises(ProgramError) as e:
        vm.run(p, vm.load_leaves(p).values, steps=2)
    assert e.value.line == 6 and e.value.message == \
        "`Set row 0 of t to y.`: writes 0.5 into `t`, an Int tensor, which holds integers only"
    p = read_program(src.format(h="3"))   # integers, though Real-typed: written, and read back
    out = vm.run(p, vm.load_leaves(p).values, steps=2)
    assert out[-1].states["t"].tolist() == [[9.0]] and out[-1].output.tolist() == [[18.0]]
