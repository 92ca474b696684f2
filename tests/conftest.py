import importlib.util
import os
import sys
import uuid

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")


def emit_bundle(source, directory):
    """Emit `source` into `directory` (through the library) and return the path."""
    from emitter import emit_torch_module, write_bundle
    write_bundle(emit_torch_module(source), str(directory))
    return str(directory)


def load_model(bundle_dir):
    """Import a bundle's model.py as a fresh module."""
    spec = importlib.util.spec_from_file_location(f"model_{uuid.uuid4().hex}",
                                                  os.path.join(bundle_dir, "model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_record(dtype="float64", steps=1, threads=1):
    """A lock job's record (what check_worker.lock_arguments makes lock_bundle's arguments of) for a
    check with the default tolerances and no config of its own."""
    return {"dtype": dtype, "steps": steps, "tolerance": {"abs": None, "rel": None},
            "config": {"allow_nonfinite": [], "bf16": None, "limits": {"tensor_bytes": None}},
            "precision": None, "threads": threads}


def write_weights(program, directory, seed=0, skip=()):
    """Random float64 weights for every Real leaf of `program` (skipping `skip`)."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in program.leaves:
        d = program.decls[name]
        if d.real and name not in skip:
            rng.standard_normal((d.rows, d.cols)).astype("<f8").tofile(os.path.join(directory, name + ".f64"))
    return str(directory)


@pytest.fixture
def all_ops_path():
    return os.path.join(DATA, "all_ops.logos")


def run_cli(*args, **kw):
    import subprocess
    return subprocess.run([sys.executable, "-m", "emitter", *args], capture_output=True, text=True,
                          cwd=kw.get("cwd", ROOT), env={**os.environ, "PYTHONPATH": ROOT})


def logos(*args, cwd=ROOT, env=None):
    """`python -m emitter ARGS` as a user runs it (this checkout's package), with `env` added."""
    import subprocess
    return subprocess.run([sys.executable, "-m", "emitter", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})


def write_tree(base, files):
    """Write {relative path: text} under `base` (folders made); returns `base`."""
    for rel, text in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return base


def assert_same_files(made, committed):
    """`made` holds the files of `committed`, byte for byte (a committed checkpoint is what its
    maker makes)."""
    assert sorted(os.listdir(made)) == sorted(os.listdir(committed))
    for f in os.listdir(committed):
        with open(os.path.join(committed, f), "rb") as a, open(os.path.join(made, f), "rb") as b:
            assert a.read() == b.read(), f
