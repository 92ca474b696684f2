"""The layout holds: imports only run down the layers, no module grows past 450 lines, and a bundle
is readable, traceable PyTorch (torch.fx, torch.jit.trace and torch.export all take it)."""

import ast
import os

import pytest
import torch

from conftest import ROOT, emit_bundle, load_model, write_weights
from emitter.language.reader import read_file

# bottom to top: a module may import its own part and the parts before it, never one after
LAYERS = ["files", "extras", "fingerprint", "bytecode", "ops", "language", "yamlfile", "sambaflow", "verify",
          "importers", "pipeline", "cli"]
MODULES = {"files", "extras", "fingerprint", "bytecode", "yamlfile"}   # parts that are one module
TOP = {"__init__": "cli", "__main__": "cli", "tasks": "cli", "zoo": "cli"}


def _part(rel):
    first = rel.split("/")[0].removesuffix(".py")
    return TOP.get(first, first)


def _modules():
    base = os.path.join(ROOT, "emitter")
    for dirpath, _, files in os.walk(base):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                yield os.path.relpath(path, base).replace(os.sep, "/"), path


def _imported_parts(rel, path):
    """The emitter parts a module imports (relative or absolute), with the line of each."""
    with open(path) as f:
        tree = ast.parse(f.read())
    package = rel.split("/")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package[:len(package) - node.level + 1] + (node.module or "").split(".")
                parts = [p for p in parts if p]
                names = [parts] if node.module else [parts + [a.name] for a in node.names]
            elif node.module and node.module.split(".")[0] == "emitter":
                names = [node.module.split(".")[1:]]
            else:
                continue
            for p in names:
                if p:
                    yield TOP.get(p[0], p[0]), node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                p = a.name.split(".")
                if p[0] == "emitter" and len(p) > 1:
                    yield TOP.get(p[1], p[1]), node.lineno


def test_imports_only_run_down():
    rank = {p: i for i, p in enumerate(LAYERS)}
    up = []
    for rel, path in _modules():
        mine = _part(rel)
        for part, line in _imported_parts(rel, path):
            if part in rank and rank[part] > rank[mine]:   # (`from . import __version__`: a name)
                up.append(f"emitter/{rel}:{line} ({mine}) imports {part}")
    assert up == []


def test_no_module_over_450_lines():
    long = {rel: n for rel, path in _modules() if (n := sum(1 for _ in open(path))) > 450}
    assert long == {}


def test_every_document_the_project_names_is_in_it():
    """The project stands alone: a document its docs, code, tests or benches cite by name (`LOCK.md`)
    is one of its own (the specification it was written from is not: carry the facts into docs/)."""
    import re
    have = {f for d in ("", "docs", "bench") for f in os.listdir(os.path.join(ROOT, d)) if f.endswith(".md")}
    cited = {}
    for folder in ("", "docs", "emitter", "tests", "bench"):
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [] if not folder else [d for d in dirs if d != "__pycache__"]
            for f in files:
                if f.endswith((".py", ".md")):
                    with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                        for name in re.findall(r"\b[A-Z][A-Z0-9_-]*\.md\b", fh.read()):
                            cited.setdefault(name, os.path.relpath(os.path.join(dirpath, f), ROOT))
    assert {n: at for n, at in cited.items() if n not in have} == {}
    assert not [f for d in ("", "docs") for f in os.listdir(os.path.join(ROOT, d)) if f.endswith(".md")
                and re.search(r"shared/(spec|design)\b", open(os.path.join(ROOT, d, f), encoding="utf-8").read())]


def test_every_part_is_a_package_with_a_docstring():
    for part in [p for p in LAYERS[:-1] if p not in MODULES]:
        init = os.path.join(ROOT, "emitter", part, "__init__.py")
        with open(init) as f:
            assert ast.get_docstring(ast.parse(f.read())), part


STEP = """Let x be a 1 by 4 tensor of Real.
Let w be a 4 by 4 tensor of Real.
Let wc be a 2 by 4 tensor of Real.
Let ring be a 2 by 4 tensor of Real.
Let T be a 3 by 4 tensor of Real.
Let p be a 1 by 1 tensor of Int.
Set item 1 of p to 1.
Let h be x matmul w.
Let cv be causal conv of h with weight wc state ring over 2 taps.
Set row p of T to cv.
Let a be attention of cv over T and T with 2 heads 2 groups.
Let y be a plus h.
"""


def _bundle(text, tmp_path):
    module = load_model(emit_bundle(text, tmp_path / "b"))
    program_path = tmp_path / "p.logos"
    program_path.write_text(text)
    weights = write_weights(read_file(str(program_path)), tmp_path / "w", seed=3)

    def fresh():
        return module.LogosModule(module.load_weights(weights, torch.float64), torch.float64)
    return module, fresh


def _steps(model, args, states):
    """Two steps' outputs and the states after them."""
    with torch.no_grad():
        outs = [model(*args) for _ in range(2)]
    return outs + [getattr(model, "leaf_" + s).clone() for s in states]


@pytest.mark.parametrize("which", ["decode step", "every op"])
def test_fx_jit_and_export_take_a_bundle_and_keep_its_write_backs(which, all_ops_path, tmp_path):
    with open(all_ops_path) as f:
        text = STEP if which == "decode step" else f.read()
    module, fresh = _bundle(text, tmp_path)
    args = tuple(getattr(fresh(), "leaf_" + n).clone() for n in module.INPUTS)
    assert module.INPUTS and module.STATES          # inputs as parameters, states as buffers
    want = _steps(fresh(), args, module.STATES)
    if which == "decode step":
        assert not torch.equal(want[0], want[1])  # the states carry: step 2 differs from step 1
    gm = torch.fx.symbolic_trace(fresh())
    assert "copy_" in gm.code
    with torch.no_grad():
        jit = torch.jit.trace(fresh(), args, check_trace=False)
        for s in module.STATES:     # tracing ran one step: start again from the loaded states
            getattr(jit, "leaf_" + s).copy_(getattr(fresh(), "leaf_" + s))
    exported = torch.export.export(fresh(), args).module()
    for name, traced in (("fx", gm), ("jit", jit), ("export", exported)):
        got = _steps(traced, args, module.STATES)
        for g, w in zip(got, want):
            assert torch.equal(g, w), name


def test_forward_takes_the_inputs_by_name(tmp_path):
    module, fresh = _bundle(STEP, tmp_path)
    import inspect
    params = list(inspect.signature(module.LogosModule.forward).parameters)
    assert params == ["self", "x", "p"] and module.INPUTS == ("x", "p")
    x = torch.ones(1, 4, dtype=torch.float64)
    p = torch.tensor([[2.0]], dtype=torch.float64)
    with torch.no_grad():
        by_name = fresh()(p=p, x=x)
        positional = fresh()(x, p)
        default = fresh()()
    assert torch.equal(by_name, positional) and not torch.equal(by_name, default)
def test_minilm_manifest_calls_its_weights_weights():
    import json
    from emitter import emit_program
    program = read_file(os.path.join(ROOT, "programs", "minilm.logos"))
    tensors = json.loads(emit_program(program).manifest_json)["tensors"]
    roles = {t["var"]: t["role"] for t in tensors}
    checkpoint = [v for v in program.leaves if v[0] in "Wbl"]        # Wquery0, bkey3, ln1w0, lnEb ...
    assert len(checkpoint) == 3 + 2 + 16 * 6
    assert {roles[v] for v in checkpoint} == {"weight"}
    assert roles["E"] == "state" and {roles[f"tok{i}"] for i in range(8)} == {"input"}
