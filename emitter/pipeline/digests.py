"""What every emit, lock and import depends on beyond its own files: the emitter's code (by the
sha256 of each file, named relative to the package, so the digest is the same wherever it is
installed: a Dask worker's report is compared with it), the versions of the libraries an import
computes with, and the environment. Each is taken once per process, when a key first needs it: the
keys of one run name the code and environment the run started with."""

import functools
import hashlib
import json
import os

from ..bytecode import IMPORTED
from ..fingerprint import sha256
from ..verify import environment

# each kind's code: the files its work runs, every module they import (at the top or in a function)
# with the packages' __init__ that an import runs (tests/test_keys.py checks the closure)
_BASE = ("__init__.py", "bytecode.py", "files.py")
CODE = {
    "emit": _BASE + ("ops", "language", "sambaflow"),
    "lock": _BASE + ("fingerprint.py", "yamlfile.py", "lifetime.py", "ops", "language", "sambaflow", "verify",
                     "pipeline/__init__.py", "pipeline/check_worker.py", "pipeline/digests.py",
                     "pipeline/worker_code.py"),
    "import": _BASE + ("extras.py", "importers", "language", "ops", "sambaflow/__init__.py",
                       "sambaflow/weight_files.py", "lifetime.py"),
    # what the VM's trace is computed and stored by (emitter.verify.trace): a trace is shared by a
    # program's checks until this code changes, whatever else of the lock's does
    "vm": _BASE + ("fingerprint.py", "yamlfile.py", "ops", "language", "sambaflow/__init__.py",
                   "sambaflow/weight_files.py", "verify/__init__.py", "verify/fresh_inputs.py", "verify/links.py",
                   "verify/vm.py", "verify/trace.py", "verify/trace_format.py"),
    "report": _BASE + ("fingerprint.py", "importers/__init__.py", "importers/packages.py", "lifetime.py",
                       "language/__init__.py", "language/errors.py", "language/lines.py",
                       "pipeline/__init__.py", "pipeline/digests.py", "pipeline/files_io.py",
                       "pipeline/guards.py", "pipeline/keys.py", "pipeline/names.py",
                       "pipeline/plot_svg.py", "pipeline/report.py", "pipeline/report_aside.py",
                       "pipeline/report_facts.py", "pipeline/spread.py",
                       "sambaflow/__init__.py", "sambaflow/weight_files.py",
                       "verify/__init__.py", "verify/cpu.py", "verify/environment.py", "verify/links.py",
                       "verify/memory.py",
                       "verify/verdict.py", "yamlfile.py",
                       # the renderers report_aside.REPORT_FORMATS names (tests/test_report.py holds
                       # them equal: here, an edit of a format would move every lock's key)
                       "pipeline/report_html.py"),
}
# the libraries whose code makes an import's numbers as much as the importers' own: a gguf upgrade
# that dequantises differently, or a `safetensors/` folder on the path in place of the library,
# must re-derive the weights and change the verdict cache's keys
PACKAGES = {"import": ("gguf", "safetensors", "ml_dtypes", "numpy", "torch")}

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the emitter package


# (no circular check: a key's record is a tree of plain values; the check costs a fifth of a
# no-op's encoding)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=True, ensure_ascii=True,
                              check_circular=False)


def canonical(obj):
    return _CANONICAL.encode(obj)


def digest(obj):
    """The sha256 of `obj`'s canonical JSON: equal content, equal digest, on every machine."""
    return hashlib.sha256(canonical(obj).encode("ascii")).hexdigest()


def code_files(kind):
    """The emitter package's .py files (relative to the package) that `kind`'s work runs, sorted."""
    out = []
    for part in CODE[kind]:
        if part.endswith(".py"):
            out.append(part)
            continue
        for dirpath, dirnames, filenames in os.walk(os.path.join(PACKAGE, part)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            rel = os.path.relpath(dirpath, PACKAGE).replace(os.sep, "/")
            out += [f"{rel}/{f}" for f in sorted(filenames) if f.endswith(".py")]
    return sorted(out)


def package_digest(kind, loaded=False):
    """The digest of the `kind` code as the package holds it now (and of its libraries' versions);
    `loaded`: each module this process imported as its import read it (bytecode.IMPORTED), the
    others as they are now: the code that runs here."""
    shas = {rel: loaded and IMPORTED.get(os.path.join(PACKAGE, rel)) or sha256(os.path.join(PACKAGE, rel))
            for rel in code_files(kind)}
    if kind in PACKAGES:   # their versions, and whether they are what runs (not shadowed)
        return digest([shas, environment.versions(PACKAGES[kind]), environment.records(PACKAGES[kind]),
                       environment.origins(PACKAGES[kind])])
    return digest(shas)


def unchanged(kind):
    """Whether the `kind` code this process ran (its modules as imported, the others as on disk)
    is still what this run's keys name: checked after an emit (which loads its code lazily) and
    around an import's own process, so that what they made under the key was made by that code
    (a module imported as an edit left it, reverted since, is seen; an edit made and reverted in
    another process between two such checks is not)."""
    return package_digest(kind, loaded=True) == code(kind)


@functools.lru_cache(maxsize=None)
def code(kind):
    """`package_digest(kind)` of the code this process loaded, as it first took it: what this
    run's keys name."""
    return package_digest(kind, loaded=True)


@functools.lru_cache(maxsize=None)
def env():
    """This process's environment fingerprint's digest, taken once."""
    return environment.digest(environment.fingerprint())
