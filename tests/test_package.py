"""The package as others install it: the wheel builds without touching the zoo's build/, passes
`twine check`, asks for ranges (not the pins) with the optional packages behind extras, and, once
installed in a venv of its own, `logos --help` and `logos doit` run a sample zoo from it; the
pins setup.sh installs satisfy those ranges, one pin for each."""

import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from conftest import ROOT
from test_extras import EXTRA_MODULES, blocking

PY = sys.executable
DIST = "logos-sambaflow-emitter"
# what the package is built from (pyproject.toml names the readme and the license)
SOURCES = ["pyproject.toml", "setup.cfg", "LICENSE", "docs/PYPI.md", "emitter"]


def _pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _tree(path):
    """{relative path: bytes} of every file under `path`."""
    out = {}
    for d, _, files in os.walk(path):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, path)] = open(p, "rb").read()
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built by `pip wheel .` from a copy of the project whose build/ holds a zoo's files."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        a, b = os.path.join(ROOT, name), src / name
        if os.path.isdir(a):
            shutil.copytree(a, b, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            b.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(a, b)
    (src / "build/results/mlp").mkdir(parents=True)
    (src / "build/results/mlp/float32.json").write_text('{"verdict": "pass"}')
    (src / "build/.doit.db").write_bytes(b"doit's db")
    before = _tree(src / "build")
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run([PY, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "-q", "-w", str(dist)],
                          cwd=src, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _tree(src / "build") == before        # the zoo's build/ is left as it was
    assert os.path.isdir(src / ".setuptools-build/lib/emitter")   # setuptools' own went here
    (whl,) = dist.glob("*.whl")
    return whl


def test_the_wheel_passes_twine_check_and_carries_the_license(wheel):
    done = subprocess.run([PY, "-m", "twine", "check", "--strict", str(wheel)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "PASSED" in done.stdout, done.stdout + done.stderr
    with zipfile.ZipFile(wheel) as z:
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = z.read(f"{info}/METADATA").decode()
        license_text = z.read(f"{info}/licenses/LICENSE").decode()
        names = z.namelist()
    assert license_text == open(os.path.join(ROOT, "LICENSE")).read()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "License-Expression: Apache-2.0" in meta and "Classifier: Programming Language" in meta
    assert meta.count("Project-URL: ") >= 3
    # the PyPI description is the short page, not the repository's README
    assert meta.split("\n\n", 1)[1].strip() == open(os.path.join(ROOT, "docs/PYPI.md")).read().strip()
    assert all(n.startswith(("emitter/", info)) for n in names)
    assert "emitter/sambaflow/runtime.py" in names and "emitter/extras.py" in names


def test_the_metadata_asks_for_ranges_with_the_optional_packages_behind_extras(wheel):
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode()
    reqs = [Requirement(line.split(": ", 1)[1]) for line in meta.splitlines()
            if line.startswith("Requires-Dist: ")]
    plain = {r.name: r for r in reqs if r.marker is None}
    assert set(plain) == {"numpy", "pyyaml", "doit", "torch", "tqdm", "threadpoolctl", "fsspec", "xxhash"}
    assert not [r for r in reqs if any(s.operator in ("==", "===") for s in r.specifier)]
    assert Version("2.13.0") in plain["torch"].specifier and Version("2.14.1") in plain["torch"].specifier
    extra = {}
    for r in reqs:
        if r.marker is not None:
            e = re.search(r'extra == "(\w+)"', str(r.marker)).group(1)
            extra.setdefault(e, set()).add(r.name)
    assert extra["dask"] == {"dask"} and extra["cache"] == {"fsspec", "s3fs"}
    assert extra["import"] == {"gguf", "safetensors", "ml-dtypes"}
    assert {"pytest", "moto", "twine", DIST} <= extra["test"]


def _pins(name):
    out = {}
    for line in open(os.path.join(ROOT, name)):
        line = line.split("#")[0].strip()
        if line:
            r = Requirement(line)
            (spec,) = r.specifier
            assert spec.operator == "==", line
            out[r.name.lower().replace("_", "-")] = Version(spec.version)
    return out


def test_each_dependency_has_one_pin_inside_its_range():
    """requirements.txt pins the dependencies and the [dask], [cache] and [import] extras,
    requirements-test.txt the [test] extra's own and the [tiny] extra (tiny checkpoints: only the
    tests and a checkpoint's recipe make them); every pin is a package the project names, in its
    range, and so is what the running environment has (the tests ran with the pins)."""
    from importlib.metadata import version
    project = _pyproject()
    runtime, test = _pins("requirements.txt"), _pins("requirements-test.txt")
    assert runtime["torch"] == Version("2.13.0") and not set(runtime) & set(test)
    wanted = {"requirements.txt": project["dependencies"] + sum(
        (project["optional-dependencies"][e] for e in ("dask", "cache", "import")), []),
        "requirements-test.txt": [r for r in project["optional-dependencies"]["test"]
                                  if not r.startswith(DIST)] + project["optional-dependencies"]["tiny"]}
    for name, pins in (("requirements.txt", runtime), ("requirements-test.txt", test)):
        names = set()
        for line in wanted[name]:
            r = Requirement(line)
            key = r.name.lower()
            # dask[distributed] is pinned as its two distributions (a constraints file takes no extras)
            for dist in [key, *sorted(r.extras)] if key == "dask" else [key]:
                names.add(dist)
                assert dist in pins, (name, dist)
                assert pins[dist] in r.specifier, (name, dist, pins[dist], str(r.specifier))
                assert Version(version(dist)).release == pins[dist].release, dist
        assert names == set(pins), name


def _venv(tmp_path):
    """A venv of its own that sees this environment's packages through a .pth line (site.addsitedir
    is not run on them, so this checkout's editable install is not seen), made in milliseconds."""
    v = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(v)], check=True, timeout=120)
    py = v / "bin/python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    main = [p for p in site.getsitepackages() if os.path.isdir(p)]
    with open(os.path.join(purelib, "zz_main_env.pth"), "w") as f:
        f.write("".join(p + "\n" for p in main))
    return v, py


def test_the_installed_wheel_runs_logos_doit_on_a_sample_zoo(wheel, tmp_path):
    v, py = _venv(tmp_path)
    done = subprocess.run([PY, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                           "--disable-pip-version-check", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    env = {k: val for k, val in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{v / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # the installed package is the one that runs, and what it asks for is installed, in range
    probe = ("import emitter, json, importlib.metadata as m; d = m.distribution('" + DIST + "');"
             "print(json.dumps([emitter.__file__, d.requires, {n: m.version(n) for n in "
             "['numpy','pyyaml','doit','torch','tqdm','threadpoolctl','xxhash','dask','fsspec','s3fs',"
             "'gguf','safetensors','ml-dtypes']}]))")
    where, requires, have = json.loads(subprocess.run(
        [str(py), "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path,
        check=True).stdout)
    assert where.startswith(sysconfig.get_path("purelib", vars={"base": str(v), "platbase": str(v)}))
    for line in requires:
        r = Requirement(line)
        if r.marker is None or re.search(r'extra == "(dask|cache|import)"', str(r.marker)):
            assert Version(have[r.name]) in r.specifier, (line, have[r.name])
    logos = str(v / "bin/logos")
    done = subprocess.run([logos, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0 and "doit" in done.stdout and "emit" in done.stdout, done.stderr

    # the sample zoo runs on a plain install: none of the extras' packages importable
    env.update(blocking(tmp_path, EXTRA_MODULES))
    for module in EXTRA_MODULES:
        assert subprocess.run([str(py), "-c", f"import {module}"], env=env, capture_output=True).returncode
    zoo = tmp_path / "zoo"
    (zoo / "programs").mkdir(parents=True)
    for f in ("norms.logos", "norms.yaml"):
        shutil.copy(os.path.join(ROOT, "programs", f), zoo / "programs" / f)
    shutil.copytree(os.path.join(ROOT, "weights/norms"), zoo / "weights/norms")
    done = subprocess.run([logos, "doit"], capture_output=True, text=True, env=env, cwd=zoo,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((zoo / "build/report.json").read_text())
    assert report["counts"]["pass"] >= 1 and report["counts"]["fail"] == report["counts"]["error"] == 0
    assert {r["name"] for r in report["results"]} == {"norms"}
    assert (zoo / "build/bundles/norms/model.py").is_file()
