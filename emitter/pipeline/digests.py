"""Code and environment digests: what every emit, lock and import depends on beyond its own files."""

import os

from ..verify import environment
from ..verify.tolerances import tolerance
from ..fingerprint import sha256 as sha256_file
from .files_io import uptodate_check, dumps, sha256_text, stamp_targets, write_if_changed

CODE = {
    "emit": ("files.py", "ops", "language", "sambaflow"),
    "lock": ("files.py", "ops", "language", "sambaflow", "verify", "pipeline/check_worker.py"),
    "import": ("importers",),
}
# the libraries whose code makes an import's numbers as much as the importers' own: a gguf upgrade
# that dequantises differently must re-derive the weights and change the verdict cache's keys
PACKAGES = {"import": ("gguf", "safetensors", "ml_dtypes", "numpy", "torch")}
PACKAGE_CHECKED = ("lock",)   # code a Dask worker runs: its digest.json says it independent of paths


PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the emitter package


def package_path(root, rel):
    """A file of the emitter package as a task dependency: repo-relative when the package lives in
    the repository (so a restored build/ in a fresh clone names the same files), else absolute (an
    installed package)."""
    full = os.path.join(PACKAGE, rel)
    inside = os.path.relpath(full, root)
    return full if inside.startswith("..") else inside.replace(os.sep, "/")


def code_files(root, kind):
    """The emitter package's .py files that tasks of `kind` ("emit", "lock", "import") depend on,
    sorted (see `package_path`)."""
    out = []
    for part in CODE[kind]:
        if part.endswith(".py"):
            out.append(package_path(root, part))
            continue
        for dirpath, dirnames, filenames in os.walk(os.path.join(PACKAGE, part)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            rel = os.path.relpath(dirpath, PACKAGE)
            out += [package_path(root, os.path.join(rel, f)) for f in sorted(filenames) if f.endswith(".py")]
    return sorted(out)


def package_digest(kind):
    """The sha256 of the `kind` code as the package holds it, wherever it is installed (its paths
    relative to the package): what a Dask worker reports of the lock code it loaded, and what the
    driver compares with its own."""
    shas = {rel: sha256_file(os.path.join(PACKAGE, rel)) for rel in code_files(PACKAGE, kind)}
    return sha256_text(dumps(shas))


def _digest_of(files, packages=(), kind=None):
    """The digest of `files` (and of `packages`' versions); with `kind`, also the location-free
    `package_digest` of that code, which Dask workers' reports are compared with."""
    shas = {f: sha256_file(f) for f in files}
    out = {"files": shas}
    if kind in PACKAGE_CHECKED:
        out["package"] = package_digest(kind)
    if not packages:
        return {**out, "digest": sha256_text(dumps(shas))}
    versions = environment.versions(packages)
    return {**out, "packages": versions, "digest": sha256_text(dumps([shas, versions]))}


@uptodate_check
def digest_current(task, values, target, files, packages=(), kind=None):
    """Up to date when `target` already holds the digest of `files` and the installed versions of
    `packages` (hashing a few sources is cheap)."""
    try:
        with open(target, encoding="utf-8") as f:
            return f.read() == dumps(_digest_of(files, packages, kind))
    except OSError:
        return False


def write_digest(target, files, packages=(), kind=None):
    write_if_changed(target, dumps(_digest_of(files, packages, kind)))
    return stamp_targets([target])   # (what a plain run's stat snapshot records of it)


@uptodate_check
def env_current(task, values, target):
    """Up to date when `target` holds this environment's fingerprint (python, numpy, torch, CPU)."""
    try:
        with open(target, encoding="utf-8") as f:
            return f.read() == env_text()
    except OSError:
        return False


def env_text():
    """What build/digests/env.json holds for this environment."""
    fp = environment.fingerprint()
    return dumps({"fingerprint": fp, "digest": environment.digest(fp)})


def run_env_text():
    """What a no-op's snapshot keys on beyond the files: the environment, and the versions of the
    libraries a digest task reads (an upgrade of one hands doit its tasks again)."""
    return env_text() + dumps({k: environment.versions(v) for k, v in sorted(PACKAGES.items())})


def write_env(target):
    write_if_changed(target, env_text())
    return stamp_targets([target])


def check_digest(dtype, steps, atol, rtol, weights, allow_nonfinite=(), bf16=None):
    """The digest of what a check's verdict depends on from the merged config (the bf16 gate's
    bounds for a bfloat16 check)."""
    return sha256_text(dumps({"dtype": dtype, "steps": steps, "tolerance": tolerance(dtype, atol, rtol),
                              "weights": weights, "allow_nonfinite": sorted(allow_nonfinite),
                              "bf16": (bf16 or {}) if dtype == "bfloat16" else None}))
