"""Importers declare the files they read (`emitter.importers.declared_reads`): those files are the
derived weights' inputs, in their import key, so an edit of any of them re-derives the weights.
Each of the zoo's derived programs is imported here as doit imports it, under an audit hook that
records every file Python opens: a file of the checkpoint's folder (or of the package that ships
it), or any file outside the interpreter's own and the kernel's, that the importer opens but did
not declare fails the test. Files read natively (safetensors'
Rust reader opens its file itself) are covered the other way round: the repository checkpoint is
imported again from a folder holding its declared files alone, and must give the same weights."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from emitter.importers import declared_reads
from emitter.pipeline.config import discover

AUDIT = """
import json, os, sys
opened = set()
def hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes)):
        p = args[0].decode() if isinstance(args[0], bytes) else args[0]
        opened.add(os.path.realpath(p))
sys.addaudithook(hook)
from emitter.importers.entry import main   # what the weights task runs: -m emitter.importers
rc = main(sys.argv[1:])
package = os.path.dirname(os.path.abspath(sys.modules["emitter"].__file__))
code = sorted(os.path.relpath(m.__file__, package) for m in list(sys.modules.values())
              if (getattr(m, "__file__", None) or "").startswith(package + os.sep))
with open(os.environ["AUDIT_OUT"], "w") as f:
    json.dump({"opened": sorted(opened), "code": code}, f)
sys.exit(rc)
"""

DERIVED = sorted(pc.name for pc in discover(ROOT) if pc.derive and not pc.error)


def _import(pc, checkpoint, tmp):
    out = tmp / "out"
    env = {**os.environ, "AUDIT_OUT": str(tmp / "opened.json"), "TMPDIR": str(tmp),
           "LOGOS_DIE_WITH": str(os.getpid())}   # as the weights task starts it
    p = subprocess.run([sys.executable, "-c", AUDIT, pc.derive.importer, checkpoint,
                        "--program", os.path.join(ROOT, pc.source), "-o", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    made = {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in sorted(os.listdir(out))}
    audit = json.loads((tmp / "opened.json").read_text())
    return audit["opened"], made, audit["code"]


def _homes(paths):
    """The folders a checkpoint's files live in: a file's own, and for a package's file its
    distribution's top folder (whatever else the package ships is the checkpoint's too)."""
    out = set()
    for p in paths:
        real = os.path.realpath(p)
        out.add(os.path.dirname(real))
        parts = real.split(os.sep)
        if "site-packages" in parts:
            out.add(os.sep.join(parts[:parts.index("site-packages") + 2]))
    return out


@pytest.mark.parametrize("name", DERIVED)
def test_an_importer_opens_no_file_of_its_checkpoint_it_did_not_declare(name, tmp_path):
    pc = next(p for p in discover(ROOT) if p.name == name)
    d = pc.derive
    declared = {os.path.realpath(p if os.path.isabs(p) else os.path.join(ROOT, p))
                for _, p in declared_reads(d.importer, d.checkpoint, d.checkpoint_path)}
    checkpoint = d.checkpoint_path if os.path.isabs(d.checkpoint_path) or "#" in d.checkpoint_path \
        else os.path.join(ROOT, d.checkpoint_path)
    opened, made, code = _import(pc, checkpoint, tmp_path)
    homes = _homes(declared)
    theirs = {p for p in opened if any(p.startswith(h + os.sep) for h in homes)
              and not p.endswith((".py", ".pyc")) and not p.startswith(str(tmp_path))}
    assert os.path.realpath(os.path.join(ROOT, pc.source)) in opened   # (the audit sees its reads)
    assert theirs <= declared, sorted(theirs - declared)
    # nor any other file outside the interpreter's own, the kernel's and its output folder: a
    # file beside the program, in the zoo, or in the home folder is an input like the checkpoint
    own = {os.path.realpath(r) for r in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                         os.path.dirname(os.__file__), tmp_path)}
    own |= {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p) and p != ROOT}
    own |= {os.path.realpath(os.path.join(ROOT, "emitter")), "/proc", "/sys", "/dev"}
    elsewhere = {p for p in opened if not any(p == r or p.startswith(r + os.sep) for r in own)
                 and p != os.path.realpath(os.path.join(ROOT, pc.source))}
    assert elsewhere <= declared, sorted(elsewhere - declared)
    assert made
    # and the code it ran is the code its import key names: an edit of any of it derives again
    from emitter.pipeline.digests import code_files
    assert "importers/entry.py" in code and set(code) <= set(code_files("import")), \
        sorted(set(code) - set(code_files("import")))


def test_a_checkpoint_folder_holding_its_declared_files_alone_imports_the_same(tmp_path):
    """qwen38's checkpoint (config.json + model.safetensors, read natively): its declared files
    copied alone into a folder import to the same weights, so nothing else of it is read."""
    pc = next(p for p in discover(ROOT) if p.name == "qwen38")
    d = pc.derive
    alone = tmp_path / "alone"
    alone.mkdir()
    for _, p in declared_reads(d.importer, d.checkpoint, d.checkpoint_path):
        shutil.copy(os.path.join(ROOT, p), alone / os.path.basename(p))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, made, _ = _import(pc, os.path.join(ROOT, d.checkpoint_path), tmp_path / "a")
    _, again, _ = _import(pc, str(alone / os.path.basename(d.checkpoint_path)), tmp_path / "b")
    assert again == made and len(made) > 10
    os.unlink(alone / "config.json")     # and the declaration is not wider than it needs: without
    env = {**os.environ, "AUDIT_OUT": str(tmp_path / "x.json")}    # config.json it cannot import
    p = subprocess.run([sys.executable, "-c", AUDIT, "qwen35", str(alone / "model.safetensors"),
                        "--program", os.path.join(ROOT, pc.source), "-o", str(tmp_path / "c")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode != 0 and "config.json" in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize("text, said", [("[" * 100000 + "]" * 100000, "its JSON nests too deep"),
                                        ("[1]", "the config is a JSON list, not an object"),
                                        ("{", "cannot read the config: Expecting"),
                                        (" " * (17 << 20), "the config is over 16777216 bytes")])
def test_a_checkpoint_config_it_cannot_use_is_one_line_naming_it(tmp_path, text, said):
    """config.json nested thousands deep (a RecursionError, said of model.safetensors), not an
    object, not JSON or over its limit: one line naming config.json, exit 1."""
    ck = tmp_path / "ck"
    shutil.copytree(os.path.join(ROOT, "checkpoints/qwen38-tiny"), ck)
    (ck / "config.json").write_text(text)
    p = subprocess.run([sys.executable, "-m", "emitter", "import-qwen35", str(ck), "--program",
                        os.path.join(ROOT, "programs/qwen38.logos"), "-o", str(tmp_path / "out")],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"{ck}/config.json: "), p.stderr
    assert said in p.stderr and "Traceback" not in p.stderr and not (tmp_path / "out").exists(), p.stderr
