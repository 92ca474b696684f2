"""The lock's semantics as a library: what is the bundle's fault is a verdict (fail, exit 1) and
what is not is an error (exit 2); the code that runs is the code that was hashed; golden/ comes
back as data and only its callers write it."""

import json
import os
import shutil

import pytest

from conftest import DATA, emit_bundle, run_cli, write_weights
from emitter import read_file
from emitter.verify.lock import lock_bundle


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """The all-ops program with random weights (tok/pos keep their fills) and its bundle."""
    d = tmp_path_factory.mktemp("library")
    shutil.copy(os.path.join(DATA, "all_ops.logos"), d / "all_ops.logos")
    program = read_file(str(d / "all_ops.logos"))
    return {"dir": d, "program": str(d / "all_ops.logos"), "stages": program.stages,
            "weights": write_weights(program, d / "weights", seed=3),
            "bundle": emit_bundle(program.source, d / "bundle")}


def _mutated(zoo, tmp_path, old, new, name="bundle"):
    """A copy of the bundle with `old` replaced by `new` in model.py (exactly once)."""
    bundle = tmp_path / name
    shutil.copytree(zoo["bundle"], bundle)
    text = (bundle / "model.py").read_text()
    assert text.count(old) == 1, old
    (bundle / "model.py").write_text(text.replace(old, new))
    return str(bundle)


def _stage(zoo, op):
    return next(s for s in zoo["stages"] if s.op.name == op)


# 1. a wrong leaf found by the load stage wins over the module raising on it afterwards

def test_a_wrong_fill_that_makes_the_module_raise_fails_at_load(zoo, tmp_path):
    """`tok`'s fill is 2 (emb has 5 rows); the bundle's says 7, so the load stage finds `tok`
    wrong and the probe pass then raises in `row tok of emb`: the load failure is the verdict."""
    bundle = _mutated(zoo, tmp_path, '"tok": ((0, 2),),', '"tok": ((0, 7),),')
    r = lock_bundle(bundle, zoo["program"], zoo["weights"], "float64", 2)
    assert r["verdict"] == "fail", r["reason"]
    f = r["first_divergence"]
    tok = read_file(zoo["program"]).decls["tok"]
    assert (f["stage"], f["out"], f["op"], f["line"], f["step"]) == ("load", "tok", "load", tok.line, 0)
    assert f["max_abs"] == 5.0
    assert [x["leaf"] for x in r["load"]["failed"]] == ["tok"]
    assert r["worst"]["stage"] == "load" and r["worst"]["out"] == "tok"
    # what the module then did is said too: the stage it raised in, and the exception
    emb = zoo["stages"][0]
    assert r["raised"]["stage"] == emb.index and r["raised"]["out"] == "x"
    assert "IndexError" in r["raised"]["error"] or "index" in r["raised"]["error"].lower()

    out = tmp_path / "r.json"
    p = run_cli("lock", bundle, "--program", zoo["program"], "--weights", zoo["weights"], "-o", str(out))
    assert p.returncode == 1, p.stderr
    assert f"first diverging op: load `tok = load` (line {tok.line}, step 0)" in p.stderr
    res = json.loads(out.read_text())
    assert res["verdict"] == "fail" and res["first_divergence"]["out"] == "tok"
