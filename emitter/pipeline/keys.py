"""One key per check: the sha256 of one canonical record of everything its verdict depends on.

The record holds the program's text, the bundle's files, the weights (each file's sha256; for
derived weights the import key instead: every file the importer reads, its code and the versions
of the libraries it computes with), the lock code, the environment, the merged config, the dtype,
the precision policy, the tolerance, the steps and the thread count; contents and repository-
relative names only, so clones and CI share keys. A lock records the key it ran under; a result
is current when its key is the key of the inputs as they are now, and nothing else decides it
(the lock's up-to-date check, the report, `logos results`, the shared cache's hits and publishing).
File contents come from `emitter.fingerprint`, the one stat cache."""

import hashlib
import json
import os

from ..files import read_json
from ..fingerprint import sha256_or_none
from .files_io import uptodate_check

SCHEMA, VERSION = "logos.check-key", 2


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True, ensure_ascii=True)


def digest(obj):
    return hashlib.sha256(canonical(obj).encode("ascii")).hexdigest()


def check_key(parts):
    """The key of one check: sha256 of the canonical JSON of what its verdict depends on."""
    return digest({"schema": SCHEMA, "version": VERSION, **parts})


def _file_digest(digests_dir, kind):
    return (read_json(os.path.join(digests_dir, f"{kind}.json")) or {}).get("digest")


def import_inputs(derive, digests_dir):
    """What derived weights are made from: the importer, the checkpoint as the config names it,
    the sha256 of every file the importer declares it reads, and the importer's code (with the
    versions of the libraries it computes with: build/digests/import.json). None when a declared
    file cannot be read (the import then fails and says why)."""
    from ..importers import declared_reads
    try:
        reads = {name: sha256_or_none(path) for name, path in
                 declared_reads(derive.importer, derive.checkpoint, derive.checkpoint_path)}
    except (OSError, ValueError):
        return None
    if any(v is None for v in reads.values()):
        return None
    return {"importer": derive.importer, "checkpoint": derive.checkpoint, "reads": reads,
            "import_code": _file_digest(digests_dir, "import")}


def import_key(derive, digests_dir):
    inputs = import_inputs(derive, digests_dir)
    return inputs and digest(inputs)


def key_specs(pc, checks):
    """{dtype: the parts of its check's key known from the config} for a ProgramConfig `pc` and
    its checks [(dtype, atol, rtol, path)]."""
    from ..verify.tolerances import tolerance
    from .digests import check_digest
    return {dtype: {"dtype": dtype, "steps": pc.steps, "tolerance": tolerance(dtype, atol, rtol),
                    "config": check_digest(dtype, pc.steps, atol, rtol, pc.weights, pc.allow_nonfinite,
                                           getattr(pc, "bf16", None)),
                    "precision": getattr(pc, "precision", None), "derive": pc.derive}
            for dtype, atol, rtol, _ in checks}


def key_parts(spec, status, manifest, digests_dir, threads):
    """Everything a check's verdict depends on, from its `spec` and the files build/ holds now;
    None when there is nothing to key (no bundle: an emit error; derived weights whose inputs
    cannot be read)."""
    st = read_json(status) or {}
    if st.get("status") != "ok" or not st.get("source_sha") or not st.get("bundle"):
        return None
    parts = {k: v for k, v in spec.items() if k != "derive"}
    if spec.get("derive"):
        weights = import_key(spec["derive"], digests_dir)
        if weights is None:
            return None
        weights = {"import": weights}
    else:
        weights = (read_json(manifest) or {}).get("digest") if manifest else None
    parts.update(source=st["source_sha"], bundle=st["bundle"], weights=weights,
                 code=_file_digest(digests_dir, "lock"), environment=_file_digest(digests_dir, "env"),
                 threads=threads)
    return parts


def current_key(spec, status, manifest, digests_dir, threads):
    parts = key_parts(spec, status, manifest, digests_dir, threads)
    return parts and check_key(parts)


def moved(recorded, parts):
    """The names of the parts that differ between a result's recorded key record and now."""
    if not isinstance(recorded, dict) or parts is None:
        return ["inputs"]
    return sorted(k for k in set(recorded) | set(parts) if recorded.get(k) != parts.get(k))


@uptodate_check
def lock_current(task, values, checks, status, manifest, digests_dir, threads):
    """doit's `uptodate` of a lock: every check's result is a pass recorded under the key of its
    inputs as they are now. `checks`: [(result path, key spec)], or None (a refused config)."""
    if not checks:
        return False
    for path, spec in checks:
        r = read_json(path)
        if not isinstance(r, dict) or r.get("verdict") != "pass" or not r.get("key") \
                or r["key"] != current_key(spec, status, manifest, digests_dir, threads):
            return False
    return True

