"""`emitter.sambaflow.runtime` as a library: each function, called as the emitter's call for its op
spells it, against the VM's meaning of that op (float64), and the bundle's copies of it."""

import ast
import os

import numpy as np
import pytest
import torch

from cases import ALL_CASES, draw, source
from conftest import emit_bundle
from emitter.language.names import RESERVED
from emitter.language.reader import read_program
from emitter.ops import EPS
from emitter.sambaflow import app, runtime
from emitter.sambaflow.emit import stage_call
from emitter.sambaflow.runtime_source import source as runtime_source
from emitter.verify import vm

IDS = [c[0] for c in ALL_CASES]
# the weights folder's reader (emitter/sambaflow/weight_files.py) every model.py carries
READER = {"WeightsError", "npy_place", "safetensors_places", "file_place", "weight_places", "weight_array"}


@pytest.mark.parametrize("case", ALL_CASES, ids=IDS)
def test_each_runtime_function_is_its_ops_meaning(case):
    """The call model.py makes, evaluated over the runtime module itself (not a bundle's copy)."""
    program = read_program(source(case))
    values = draw(case, seed=7)
    stage = program.stages[0]
    want = vm.run_stage(program, stage, dict(values))
    env = {k: torch.from_numpy(v) for k, v in values.items()}
    got = eval(stage_call(program, stage), vars(runtime), env)  # noqa: S307 (our own rendered call)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.dtype == torch.float64
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-12, atol=1e-12)


def _top_level(text):
    tree = ast.parse(text)
    return {n.name: ast.get_source_segment(text, n) for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def test_model_py_functions_are_the_librarys_verbatim_and_only_those_used(all_ops_path, tmp_path):
    with open(all_ops_path) as f:
        text = f.read()
    bundle = emit_bundle(text, tmp_path)
    with open(os.path.join(bundle, "model.py")) as f:
        model = _top_level(f.read())
    runtime_lib, reader = runtime_source("runtime"), runtime_source("weight_files", constants=True)
    lib = {**runtime_lib.defs, **reader.defs}
    program = read_program(text)
    for name, code in model.items():
        if name != "LogosModule":
            assert code == lib[name], name            # docstring included
    called = {n for st in program.stages for n in runtime_lib.called(stage_call(program, st))}
    assert "top_mask" not in called     # named by no call: there because the routers call it
    fixed = {"LogosModule", "ProgramModule", "load_weights", "main"}
    assert set(model) - fixed - set(reader.defs) == set(runtime_lib.closure(called)) and "row_index" in model
    assert set(model) & set(reader.defs) == READER
    with open(os.path.join(bundle, "compile.py")) as f:
        assert _top_level(f.read()) == runtime_source("app").defs


def test_a_two_matmul_program_carries_no_other_helper(tmp_path):
    bundle = emit_bundle("Let x be a 1 by 2 tensor of Real.\nLet w be a 2 by 2 tensor of Real.\n"
                         "Let h be x matmul w.\nLet y be h matmul w.\n", tmp_path)
    with open(os.path.join(bundle, "model.py")) as f:
        assert set(_top_level(f.read())) == {"ProgramModule", "LogosModule", "load_weights", "main"} | READER


def test_runtime_constants_and_reserved_names():
    """model.py's own names can never be a tensor's (compile.py never names a tensor)."""
    assert runtime.EPS == EPS
    for module in ("runtime", "weight_files"):
        src = runtime_source(module, constants=module == "weight_files")
        assert set(src.defs) <= RESERVED, set(src.defs) - RESERVED
        imported = {a.asname or a.name.split(".")[0] for line in src.imports
                    for a in ast.parse(line).body[0].names}
        assert imported <= RESERVED, imported - RESERVED


def test_every_name_an_emitted_file_binds_at_its_top_level_is_reserved(all_ops_path, tmp_path):
    """Every name model.py binds at its top level (functions, classes, constants, imports), with
    every op and under a bfloat16 precision policy, is no tensor's name: a program naming one is
    refused, not emitted over it (compile.py never names a tensor)."""
    from emitter.sambaflow.emit import emit_program, write_bundle
    program = read_program(open(all_ops_path).read())
    bound = set()
    for i, precision in enumerate((None, {})):
        out = str(tmp_path / f"b{i}")
        write_bundle(emit_program(program, precision), out)
        for node in ast.parse(open(os.path.join(out, "model.py")).read()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                bound.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    assert {"PRECISION", "LogosModule", "main"} <= bound
    assert bound <= RESERVED, sorted(bound - RESERVED)


def test_app_main_without_the_sdk_says_so(monkeypatch, tmp_path):
    from conftest import load_model
    bundle = load_model(emit_bundle("Let x be a 1 by 2 tensor of Real.\nLet y be silu of x.\n", tmp_path))
    monkeypatch.setattr(app, "bundle", bundle)
    with pytest.raises(SystemExit, match="needs SambaNova's SambaFlow SDK"):
        app.main(["compile"])


def test_a_value_past_what_the_dtype_holds_is_one_line_from_model_py(tmp_path):
    """A fill of 1e308 (torch raised a RuntimeError, a traceback) or a weights file's 1e308 (cast to
    Inf, then NaN written out with exit 0) at float32: one line naming the leaf, exit 1; at float64
    both run."""
    import subprocess
    import sys
    src = ("Let x be a 1 by 2 tensor of Real.\nSet item 1 of x to 1e308.\nLet W be a 2 by 2 tensor of Real.\n"
           "Let y be x matmul W.\n")
    bundle = emit_bundle(src, tmp_path / "b")
    for name, big in (("ok", 1.0), ("big", 1e308)):
        (tmp_path / name).mkdir()
        np.array([[big, 0], [0, 1]], "<f8").tofile(tmp_path / name / "W.f64")

    def model(*args):
        return subprocess.run([sys.executable, os.path.join(bundle, "model.py"), *args], capture_output=True,
                              text=True)
    done = model("--weights", str(tmp_path / "ok"))
    assert done.returncode == 1 and done.stderr.strip() == "model.py: `x` item 1 is 1e+308, past what float32 holds"
    text = open(os.path.join(bundle, "model.py")).read()
    assert text.count("1e+308") == 1
    with open(os.path.join(bundle, "model.py"), "w") as f:   # (the fill made finite: the weights' turn)
        f.write(text.replace("1e+308", "1.0"))
    done = model("--weights", str(tmp_path / "big"))
    assert done.returncode == 1 and done.stderr.strip() == (
        f"model.py: {tmp_path / 'big' / 'W.f64'}: `W` holds a value past what float32 holds (it would be Inf)")
    assert model("--weights", str(tmp_path / "big"), "--dtype", "float64").returncode == 0
