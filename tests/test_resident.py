"""The lock lets go of the module's mapped weight pages after each op that reads them, and never of
a page the module wrote to: a module that writes into its weights fails as it would for a user."""

import os
import sys

import numpy as np
import pytest

from conftest import emit_bundle, write_weights
from emitter import read_file
from emitter.verify.lock import load_bundle_module, lock_bundle
from emitter.verify.resident import PAGE, Resident, reads

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pagemap is Linux's")

PROGRAM = """Let x be a 1 by 64 tensor of Real.
Let W be a 64 by 1024 tensor of Real.
Let y be x matmul W.
Let z be silu of y.
"""


def _present(t):
    """Pages of tensor `t` mapped in this process now (pagemap's present bit)."""
    lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    lo -= lo % PAGE
    n = -(-(hi - lo) // PAGE)
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        flags = np.frombuffer(os.pread(fd, 8 * n, 8 * (lo // PAGE)), dtype=np.uint64)
    finally:
        os.close(fd)
    return int(np.count_nonzero(flags & np.uint64(1 << 63)))


@pytest.fixture
def made(tmp_path):
    (tmp_path / "p.logos").write_text(PROGRAM)
    program = read_file(str(tmp_path / "p.logos"))
    weights = write_weights(program, tmp_path / "w", seed=4)
    return program, weights, emit_bundle(PROGRAM, tmp_path / "b"), str(tmp_path / "p.logos")


def _pagemaps():
    """How many of this process's open files are its pagemap (other tests' files may close meanwhile)."""
    out = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            out += os.readlink(f"/proc/self/fd/{fd}").endswith("/pagemap")
        except OSError:
            pass
    return out


def test_pages_are_let_go_after_reading_and_kept_once_written(made):
    program, weights, bundle, _ = made
    module = load_bundle_module(bundle)
    model = module.LogosModule(module.load_weights(weights, torch.float64), torch.float64)
    w = model.leaf_W
    assert _present(w) == 0            # load_weights' finiteness check let its pages go
    total = float(w.sum())             # read: every page of W's map is resident
    assert _present(w) == 64 * 1024 * 8 // PAGE
    assert _pagemaps() == 0
    resident = Resident(model, program.leaves)
    assert set(resident.ranges) == {"W", "x"}
    resident.release(["W"])
    assert _present(w) == 0 and float(w.sum()) == total    # the file's values come back
    w[0, 0] += 1.0                     # the module writes into its weight: that page is its own
    resident.release(["W"])
    assert "W" in resident.kept and _present(w) > 0
    assert float(w.sum()) == total + 1.0
    assert _pagemaps() == 1
    resident.close()
    assert _pagemaps() == 0     # its pagemap handle is closed
    with Resident(model, []):   # nothing mapped: closed all the same
        pass
    assert _pagemaps() == 0


def test_a_module_that_writes_into_a_weight_still_fails(made):
    """It scales W in place right after reading it, before its tap: letting that page go would
    put the file's values back before the next pass and hide the drift a user sees."""
    program, weights, bundle, source = made
    assert lock_bundle(bundle, source, weights, "float64", 2)["verdict"] == "pass"
    path = os.path.join(bundle, "model.py")
    text = open(path).read()
    old = "        y = self.tap(0, x @ W)\n"
    assert old in text
    open(path, "w").write(text.replace(old, "        y = x @ W\n        W.mul_(1.5)\n        y = self.tap(0, y)\n"))
    r = lock_bundle(bundle, source, weights, "float64", 2)
    assert r["verdict"] == "fail" and r["first_divergence"]["step"] == 1, r["first_divergence"]


def test_a_stage_reads_the_table_behind_a_view():
    from emitter.language.reader import read_program
    program = read_program("Let E be a 300 by 8 tensor of Real.\nLet x be a 1 by 8 tensor of Real.\n"
                           "Let t be transpose of E.\nLet y be x matmul t.\n")
    assert reads(program) == {0: ["E"], 1: ["E", "x"]}


def test_an_untouched_map_of_the_vms_own_bytes_is_known_without_reading_it(made):
    """The load stage takes a leaf the module maps from the very bytes the VM maps as equal: only
    while every page is still the file's, at the same file and offset."""
    program, weights, bundle, _ = made
    module = load_bundle_module(bundle)
    model = module.LogosModule(module.load_weights(weights, torch.float64), torch.float64)
    path = os.path.join(weights, "W.f64")
    with Resident(model, program.leaves) as resident:
        assert resident.maps_as("W", path, 0, model.leaf_W)
        assert not resident.maps_as("W", path, 8, model.leaf_W)                        # another offset
        assert not resident.maps_as("W", os.path.join(weights, "x.f64"), 0, model.leaf_W)   # another file
        assert not resident.maps_as("W", path, 0, model.leaf_W.clone())                # another buffer
        model.leaf_W[3, 5] += 1.0                                           # now the module's own page
        assert not resident.maps_as("W", path, 0, model.leaf_W)


TABLE = """Let E be a 300 by 64 tensor of Real.
Let x be a 1 by 64 tensor of Real.
Let t be transpose of E.
Let y be x matmul t.
"""


@pytest.mark.parametrize("dtype, policy", [("float64", None), ("float32", {}), ("bfloat16", {})])
def test_a_view_of_a_table_the_vms_by_where_it_points_is_known_equal_unread(tmp_path, monkeypatch, dtype, policy):
    """A transposed table is the VM's, bit for bit, without a read of either where the module's
    leaf is a map of the very bytes the VM maps (float64 weights at float64), or its own copy that
    the load stage found bit for bit the VM's in its dtype (at float32, bfloat16) and that nothing
    wrote since, the views selecting the same elements. Once the module has written into the table
    (its pages its own, its version counter moved), rebound the leaf to another tensor or swapped
    its storage, the view is compared in full, and the write is found."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    from emitter.verify import compare, probe, resident
    monkeypatch.setattr(resident, "RELEASE_FROM", 0)       # the weights count, however few
    read = []
    monkeypatch.setattr(probe, "same_in_dtype", lambda got, want: read.append(1) or compare.same_in_dtype(got, want))
    (tmp_path / "p.logos").write_text(TABLE)
    weights = write_weights(read_file(str(tmp_path / "p.logos")), tmp_path / "w", seed=5)
    bundle = str(tmp_path / "b")
    write_bundle(emit_program(read_file(str(tmp_path / "p.logos")), policy), bundle)   # {}: bf16's
    r = lock_bundle(bundle, str(tmp_path / "p.logos"), weights, dtype, 2)
    assert r["verdict"] == "pass" and read == [], (r["reason"], read)
    assert r["stages"][0]["op"] == "transpose" and r["stages"][0]["max_abs"] == 0.0
    path = os.path.join(bundle, "model.py")
    text = open(path).read()
    old = "E.transpose(0, 1)" if policy is None else "self.cast(0, E, moved=True).transpose(0, 1)"
    assert text.count(old) == 1
    for edit in ("E.mul_(1.5)", "self.rebound(E)", "self.swapped(E)"):   # written into; the leaf
        read.clear()                                     # rebound to another; its storage swapped
        open(path, "w").write(text.replace(old, old.replace("E", edit, 1)).replace(
            "    def forward(", "    def rebound(self, E):\n        self.leaf_E = E * 1.5\n"
            "        return self.leaf_E\n\n    def swapped(self, E):\n        E.data = E * 1.5\n"
            "        return E\n\n    def forward(", 1))
        r = lock_bundle(bundle, str(tmp_path / "p.logos"), weights, dtype, 2)
        assert r["verdict"] == "fail" and read, (edit, r["first_divergence"])
        f = r["first_divergence"]
        if dtype == "bfloat16":   # the free pass wrote (or rebound) E before the probe
            # pass read it: the gate's floors follow the module's weights, the load stage run again
            # after the step names the write
            assert (f["stage"], f["out"], f["op"], f["step"]) == ("load", "E", "written while it ran", 1), f
        else:
            assert f["op"] == "transpose" and f["step"] == 1, (edit, f)


def test_a_weight_the_module_writes_behind_torchs_back_fails_the_bf16_lock(tmp_path, monkeypatch):
    """A write torch does not count (through `.data`) leaves the leaf's version counter where it
    was: the bf16 gate's floors, which read the module's own weights, would follow the written
    values and pass a table scaled by 1.5. The load stage run again after the steps finds it: a
    failure naming the leaf, written while the module ran."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    from emitter.verify import resident
    monkeypatch.setattr(resident, "RELEASE_FROM", 0)       # the weights count, however few
    (tmp_path / "p.logos").write_text(TABLE.replace("300 by 64", "20000 by 64"))   # floors read its view
    weights = write_weights(read_file(str(tmp_path / "p.logos")), tmp_path / "w", seed=5)
    bundle = str(tmp_path / "b")
    write_bundle(emit_program(read_file(str(tmp_path / "p.logos")), {}), bundle)
    assert lock_bundle(bundle, str(tmp_path / "p.logos"), weights, "bfloat16", 2)["verdict"] == "pass"
    path = os.path.join(bundle, "model.py")
    text = open(path).read()
    old = "self.cast(0, E, moved=True)"
    assert text.count(old) == 1
    open(path, "w").write(text.replace(old, "self.cast(0, self.scaled(E), moved=True)").replace(
        "    def forward(", "    def scaled(self, E):\n        if not getattr(self, 'done', False):\n"
        "            self.done = True\n            E.data.mul_(1.5)\n        return E\n\n"
        "    def forward(", 1))
    r = lock_bundle(bundle, str(tmp_path / "p.logos"), weights, "bfloat16", 2)
    assert r["verdict"] == "fail" and not r["load"]["pass"], r["first_divergence"]   # (a pass before)
    assert r["load"]["failed"][0]["leaf"] == "E" and r["load"]["failed"][0]["written"]
    f = r["first_divergence"]
    assert (f["stage"], f["out"], f["op"], f["step"]) == ("load", "E", "written while it ran", 1), f
    text = open(path).read()
    open(path, "w").write(text.replace(   # written in step 1, put back in step 2: seen all the same
        "            E.data.mul_(1.5)\n", "            self.was = E.clone()\n            E.data.mul_(1.5)\n"
        "        self.calls = getattr(self, 'calls', 0) + 1\n"
        "        if self.calls == 4:   # step 2's first pass (step 1: free, tapped, probe)\n"
        "            E.data.copy_(self.was)\n", 1))
    r = lock_bundle(bundle, str(tmp_path / "p.logos"), weights, "bfloat16", 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and (f["stage"], f["op"], f["step"]) == ("load", "written while it ran", 1), (f, r["reason"])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("edit", ["E[3].add_(1.0)", "E.mul_(1.5)", "self.leaf_E = E * 1.5", "E.data = E * 1.5",
                                  "E.data.mul_(1.5)", "E.detach().numpy()[3] += 1.0"])
def test_a_weight_written_in_the_last_pass_fails_at_every_dtype(tmp_path, dtype, edit):
    """A module that writes into a weight in its last call, after reading it (every figure of the
    check computed before): a caller's next call reads the written weight. The load stage run
    again once the steps ran finds it, in float64 and float32 as in bfloat16 (which runs it after
    every step): a fail naming the leaf, written while it ran; before, the same bundle passed.
    A write torch does not count (through `.data` or NumPy) is found too: from the leaf's pages
    where it maps its file, from the hash of its bytes where it is the module's own memory.)"""
    from emitter.sambaflow.emit import emit_program, write_bundle
    (tmp_path / "p.logos").write_text(TABLE)
    weights = write_weights(read_file(str(tmp_path / "p.logos")), tmp_path / "w", seed=5)
    bundle = str(tmp_path / "b")
    write_bundle(emit_program(read_file(str(tmp_path / "p.logos")), {}), bundle)
    path = os.path.join(bundle, "model.py")
    text = open(path).read()
    assert text.count("        return y\n") == 1
    open(path, "w").write(text.replace("        return y\n", "        self.calls = getattr(self, 'calls', 0) + 1\n"
                                       f"        if self.calls == 4:   # step 2's last pass\n            {edit}\n"
                                       "        return y\n"))
    r = lock_bundle(bundle, str(tmp_path / "p.logos"), weights, dtype, 2)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and all(s["pass"] for s in r["stages"]), (f, r["reason"])
    assert (f["stage"], f["out"], f["op"], f["step"]) == ("load", "E", "written while it ran", 2), f
    one = lock_bundle(bundle, str(tmp_path / "p.logos"), weights, dtype, 1)   # (its 4th call: the fresh pass's)
    assert one["verdict"] == "fail" and one["first_divergence"]["stage"] == "load", one["first_divergence"]


@pytest.mark.parametrize("edit", ["E.data.mul_(1.5)", "E.data = E * 1.5", "self.leaf_E = E * 1.5"])
def test_the_bf16_lock_reads_a_weight_again_only_where_it_moved(tmp_path, monkeypatch, edit):
    """After each step the bf16 lock knows a constant leaf unchanged from its tensor, place and
    bytes' hash (one read, no cast): a passing bundle's leaves are compared with the VM's once,
    at the load stage. A leaf written in place, whose storage was swapped, or rebound to another
    tensor, each between the forward's calls, is compared again and fails, written at step 1."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    from emitter.verify import leaf_check
    again, load_stage = [], leaf_check.load_stage
    monkeypatch.setattr(leaf_check, "load_stage", lambda *a: again.append(list(a[7])) or load_stage(*a))
    (tmp_path / "p.logos").write_text(TABLE.replace("300 by 64", "20000 by 64"))   # floors read its view
    weights = write_weights(read_file(str(tmp_path / "p.logos")), tmp_path / "w", seed=5)
    bundle = str(tmp_path / "b")
    write_bundle(emit_program(read_file(str(tmp_path / "p.logos")), {}), bundle)
    r = lock_bundle(bundle, str(tmp_path / "p.logos"), weights, "bfloat16", 3)
    # after each of 3 steps, and after the passes that follow them (the fresh pass): none
    assert r["verdict"] == "pass" and again == [[], [], [], []] and r["fresh"]["same"], again
    path = os.path.join(bundle, "model.py")
    text = open(path).read()
    old = "self.cast(0, E, moved=True)"
    open(path, "w").write(text.replace(old, "self.cast(0, self.edited(E), moved=True)").replace(
        "    def forward(", "    def edited(self, E):\n        if not getattr(self, 'done', False):\n"
        f"            self.done = True\n            {edit}\n        return E\n\n    def forward(", 1))
    again.clear()
    r = lock_bundle(bundle, str(tmp_path / "p.logos"), weights, "bfloat16", 3)
    f = r["first_divergence"]
    assert r["verdict"] == "fail" and again[0] == ["E"], (again, f)
    assert (f["stage"], f["out"], f["op"], f["step"]) == ("load", "E", "written while it ran", 1), (f, r["reason"])
