"""A feature whose package comes with an extra, asked for where that package is not installed,
stops with one line naming the extra and the pip command (not a traceback, not a bare
ModuleNotFoundError); every extra the code names exists in pyproject.toml and holds the
distribution of the module it checks."""

import ast
import os
import sys
import tomllib
from importlib.metadata import packages_distributions

import pytest
from packaging.requirements import Requirement

from conftest import ROOT
from emitter.extras import require
from emitter.language.errors import ProgramError
from test_pipeline import PROG_B, doit, make_zoo


def _hint(extra, module):
    return (f"needs the [{extra}] extra: pip install 'logos-sambaflow-emitter[{extra}]' "
            f"({module} is not installed)")


def _missing(monkeypatch, *modules):
    for m in modules:   # (a None in sys.modules is how Python marks a module that cannot be imported)
        monkeypatch.setitem(sys.modules, m, None)


def test_require_names_the_extra_and_raises_the_callers_error(monkeypatch):
    require("numpy", "x", "anything")   # installed: nothing happens
    _missing(monkeypatch, "distributed")
    with pytest.raises(KeyError) as e:
        require("distributed", "dask", "executor=dask:local", KeyError)
    assert e.value.args[0] == "executor=dask:local " + _hint("dask", "distributed")


def test_a_dask_executor_without_distributed_is_refused_before_any_check(monkeypatch):
    from emitter.pipeline import executors
    _missing(monkeypatch, "distributed")
    for spec in ("dask:local", "dask:tcp://127.0.0.1:1"):
        ex = executors.parse(spec)
        with pytest.raises(executors.ExecutorError) as e:
            executors.probe(ex)
        assert str(e.value) == f"executor={spec} " + _hint("dask", "distributed")


def test_an_s3_cache_without_s3fs_is_refused(monkeypatch):
    from emitter.pipeline.cache import CacheError, VerdictCache
    _missing(monkeypatch, "s3fs")
    with pytest.raises(CacheError) as e:
        VerdictCache("s3://bucket/prefix", "k")
    assert str(e.value) == "cache=s3://bucket/prefix " + _hint("cache", "s3fs")
    VerdictCache("memory://no-s3fs-needed", "k")   # other protocols do not need s3fs


def test_the_importers_without_their_packages_name_the_checkpoint_and_the_extra(monkeypatch, tmp_path):
    from emitter.importers import gguf_file, qwen35, safetensors
    ckpt = str(tmp_path / "model.gguf")
    _missing(monkeypatch, "gguf", "safetensors", "ml_dtypes")
    with pytest.raises(ProgramError) as e:
        gguf_file.open_gguf(ckpt)
    assert str(e.value) == f"{ckpt}: reading a GGUF checkpoint " + _hint("import", "gguf")
    with pytest.raises(ProgramError) as e:
        safetensors.import_checkpoint("m.safetensors", None, str(tmp_path / "out"))
    assert str(e.value) == "m.safetensors: reading a safetensors checkpoint " + _hint("import", "safetensors")
    with pytest.raises(ProgramError) as e:
        qwen35._read_tensors("ckpt/")
    assert str(e.value) == "ckpt/: reading a safetensors checkpoint " + _hint("import", "safetensors")
    assert not (tmp_path / "out").exists()


def test_a_tiny_checkpoint_without_transformers_names_the_tiny_extra(monkeypatch, tmp_path):
    from emitter.importers import qwen35
    _missing(monkeypatch, "transformers")
    with pytest.raises(ProgramError) as e:
        qwen35.make_tiny_checkpoint(str(tmp_path / "ckpt"), 1)
    assert str(e.value) == f"{tmp_path / 'ckpt'}: a tiny random checkpoint (--tiny-seed) " + _hint("tiny", "transformers")
    assert not (tmp_path / "ckpt").exists()


# the import names of the extras' packages (a plain `pip install` has none of them)
EXTRA_MODULES = ("dask", "distributed", "s3fs", "gguf", "safetensors", "ml_dtypes")


def blocking(tmp_path, modules):
    """{"PYTHONPATH": a folder whose sitecustomize marks `modules` as not installed}, for a
    process and its children: as if they were not installed."""
    d = tmp_path / "block"
    d.mkdir(parents=True)
    (d / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules))
    return {"PYTHONPATH": str(d)}


def test_doit_says_one_line_and_exits_3(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    rc, ran, out = doit(z, "executor=dask:local", env=blocking(tmp_path, ["distributed", "dask"]))
    assert rc == 3 and not ran, out
    assert out.strip() == "doit: refused: executor=dask:local " + _hint("dask", "distributed")
    rc, ran, out = doit(z, "cache=s3://bucket/zoo", env={**blocking(tmp_path / "2", ["s3fs"]),
                                                         "LOGOS_CACHE_KEY": "k"})
    assert rc == 3 and not ran, out
    assert out.strip() == "doit: refused: cache=s3://bucket/zoo " + _hint("cache", "s3fs")


def test_every_extra_the_code_names_holds_its_module():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    named = set()
    for d, _, files in os.walk(os.path.join(ROOT, "emitter")):
        for f in files:
            if f.endswith(".py"):
                for node in ast.walk(ast.parse(open(os.path.join(d, f)).read())):
                    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require":
                        named.add((node.args[0].value, node.args[1].value))
    assert {m for m, _ in named} == {"distributed", "s3fs", "gguf", "safetensors", "ml_dtypes", "transformers"}
    dists = packages_distributions()
    for module, extra in named:
        listed = set()
        for r in map(Requirement, extras[extra]):   # (dask[distributed] brings distributed)
            listed |= {r.name.lower(), *r.extras}
        assert {d.lower().replace("_", "-") for d in dists[module]} & listed, (module, extra)
