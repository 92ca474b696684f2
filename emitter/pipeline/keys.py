"""One key per check: the sha256 of one canonical record of everything its verdict depends on, and
the one rule of currency built on it.

A check's record holds the program's text, the bundle's files, the weights (each file a leaf reads
by its sha256, the folder's other files by name and size, never read; for derived weights their
import key instead: every file the importer reads, its code, the versions and origins of the
libraries it computes with and the environment), the lock code, the environment, the merged config, the dtype, the precision policy,
the tolerance, the steps and the thread count: contents and repository-relative names only, so
clones and CI share keys. An emit and an import are keyed the same way.

Each task records the key it ran under (the emit status, the import's .derived.json, the lock
status); a task is current when its recorded key is the key of its inputs as they are now, and
nothing else decides it: doit's up-to-date checks, the pre-check that hands doit only what is not
current, the report, `logos results` and the shared cache. File contents come from
`emitter.fingerprint`, the one stat cache."""

import os

from ..files import read_json
from ..fingerprint import sha256_or_none, sha256_text
from ..sambaflow.weight_files import LEAF_SUFFIXES, TENSOR_FILES, claimed_files, size_refusal
from ..verify.memory import default_tensor_bytes
from ..verify.links import refused_link, refused_links
from . import digests
from .digests import digest
from .files_io import uptodate_check

SCHEMA, VERSION = "logos.check-key", 3
DERIVED = ".derived.json"


def entries(folder):
    """{name: os.DirEntry} of everything in a weights folder (dot files are the pipeline's); an
    OSError when it cannot be listed."""
    with os.scandir(folder) as it:
        return {e.name: e for e in it if not e.name.startswith(".")}


def is_file(e):
    """Whether a folder's entry is a plain file or a link to one (a link that loops, or that
    cannot be followed, is neither: its kind names it)."""
    try:
        return e.is_file()
    except OSError:
        return False


def _kind(e):
    """What a folder's entry that is not a plain file is (a reader refuses it where a leaf's file
    goes: a key must move with it)."""
    if e.is_symlink():
        return "link to nothing" if not os.path.exists(e.path) else "link"
    return "folder" if e.is_dir() else "not a regular file"


def files(folder):
    """{name: os.DirEntry} of a weights folder's plain files; an OSError when it cannot be listed."""
    return {n: e for n, e in entries(folder).items() if is_file(e)}


def plain(folder):
    """The names of a weights folder's plain files, or an empty set when it cannot be listed."""
    try:
        return set(files(folder))
    except OSError:
        return set()


def listed(folder):
    """The names of everything in a weights folder (plain files or not), or an empty set when it
    cannot be listed."""
    try:
        return set(entries(folder))
    except OSError:
        return set()


def check_key(parts):
    """The key of one check: sha256 of the canonical JSON of what its verdict depends on."""
    return digest({"schema": SCHEMA, "version": VERSION, **parts})


def import_inputs(pc):
    """What a program's derived weights are made from: the importer, the checkpoint as the config
    names it (`spec_name`), the sha256 of every file the importer declares it reads, the program's sentences
    (the importer reads its leaves and ops; its comments and line numbers make nothing) and the
    importer's code with its libraries' versions and origins, and the environment it runs in (the
    same inputs in another make other bits, and a verdict on those is not about these). None when
    one cannot be read (the import then says why)."""
    from ..importers import declared_reads, spec_name
    from ..language.lines import sentences_only
    derive = pc.derive
    try:
        reads = {name: _read_sha(name, path) for name, path in
                 declared_reads(derive.importer, derive.checkpoint, derive.checkpoint_path)}
        with open(pc.source, "rb") as f:
            text = f.read(pc.limits["program_bytes"] + 1)
        program = sentences_only(text.decode("utf-8"))   # (not UTF-8: a ValueError)
    except (OSError, ValueError):
        return None
    if any(v is None for v in reads.values()) or len(text) > pc.limits["program_bytes"]:
        return None
    return {"importer": derive.importer, "checkpoint": spec_name(derive.checkpoint), "reads": reads,
            "program": sha256_text(program), "code": digests.code("import"), "environment": digests.env()}


def _read_sha(name, path):
    """A file an importer reads: its sha256, or its size where it is over the size the importer
    refuses it at (read_limit: never hashed, the import says why), or None where it cannot be read."""
    from ..importers import read_limit
    limit = read_limit(name)
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"over the limit: {st.st_size} bytes" if limit is not None and st.st_size > limit else sha256_or_none(path, st)


def import_key(pc):
    inputs = import_inputs(pc)
    return inputs and digest(inputs)


def over_limit(pc, st=None):
    """The program file's size where it is over limits.program_bytes (the emit refuses it
    unread: never hashed, a 20 GiB file costs a stat), else None; `st`: its os.stat, if taken."""
    try:
        size = (st or os.stat(pc.source)).st_size
    except OSError:
        return None
    return size if size > pc.limits["program_bytes"] else None


def source_sha(pc):
    """The program file's sha256, or its size where it is over the limit (`over_limit`): one stat."""
    try:
        st = os.stat(pc.source)
    except OSError:
        return None
    size = over_limit(pc, st)
    return f"over the limit: {size} bytes" if size else sha256_or_none(pc.source, st)


def emit_key(entry):
    """The key of an emit: the program's bytes, what of the config it uses (a refusal, the limits
    it checks, the precision policy) and the emit code."""
    pc = entry.pc
    limits = {k: pc.limits.get(k) for k in ("program_bytes", "sentences")}   # (the machine's default
    limits["tensor_bytes"] = None if pc.limits["tensor_bytes"] == default_tensor_bytes() else \
        pc.limits["tensor_bytes"]   # tensor_bytes, half its memory, is none: emit_current checks the need)
    return digest({"source": None if pc.error else source_sha(pc), "error": pc.error,
                   "limits": limits, "policy": pc.precision, "code": digests.code("emit")})


def shapes(leaves):
    """{leaf: (rows, cols)} of the emit status's `leaves` ({} where it names no shapes)."""
    return {n: tuple(s) for n, s in leaves.items()} if isinstance(leaves, dict) else {}


def weights_part(entry, leaves):
    """The weights a check reads, as its key names them: the import key of derived weights; else
    the sha256 of each file a leaf (`leaves`, from the emit status: {leaf: [rows, cols]}) claims
    (or, for one its size alone refuses, that refusal: never read) and the name and size of every
    other file of the folder; None for none."""
    pc = entry.pc
    if pc.derive:
        key = import_key(pc)
        return key and {"import": key}
    if not pc.weights:
        return None
    try:
        everything = entries(pc.weights)
    except OSError:
        return {"missing": pc.weights}
    found = {n: e for n, e in everything.items() if is_file(e)}
    strange = {n: _kind(e) for n, e in everything.items() if n not in found}
    claimed, held = claimed_files(found, leaves), shapes(leaves)
    shas, others, links = {}, {}, [n for n in claimed if found[n].is_symlink()]
    refused = links and refused_links(pc.weights, links)   # the roots decide those
    for n in sorted(found):
        if refused and n in refused:   # a file outside the roots: never read
            shas[n] = {"refused": refused_link(pc.weights, n)}
            continue
        try:
            st = found[n].stat()
        except OSError:
            st = None
        unread = n in claimed and st and size_refusal(n, st.st_size, held, pc.limits["tensor_bytes"])
        if unread:
            shas[n] = {"refused": unread}
        elif n in claimed:
            shas[n] = st and sha256_or_none(found[n].path, st)
        else:
            others[n] = st and st.st_size
    return {"files": shas, "others": others, **({"refused_links": refused} if refused else {}),
            **({"not_files": strange} if strange else {})}


def readable(pc, names, leaves):
    """The files of `names` a leaf of `leaves` claims (any leaf's, where `leaves` names no shapes:
    before an emit) whose size does not refuse them: those a reader reads (doit's file checker
    too), sorted."""
    held = shapes(leaves)
    claimed = claimed_files(names, held) if held else \
        {n for n in names if n.endswith(LEAF_SUFFIXES + (TENSOR_FILES,))}

    def ok(n):
        try:
            return not size_refusal(n, os.path.getsize(os.path.join(pc.weights, n)), held,
                                    pc.limits["tensor_bytes"])
        except OSError:   # (gone since it was listed: the key says so)
            return False
    return sorted(n for n in claimed if ok(n))


_NONE = object()


def check_parts(entry, check, status, threads, weights=_NONE):
    """Everything `check`'s verdict depends on, from its config and the files as they are now;
    None when there is nothing to key (a refused program, no bundle, unreadable import inputs).
    `weights`: the entry's `weights_part`, worked out here when not given."""
    if check.spec is None or not isinstance(status, dict) or status.get("status") != "ok" \
            or not status.get("bundle"):
        return None
    if weights is _NONE:
        weights = weights_part(entry, status.get("leaves") or ())
    if entry.pc.derive and weights is None:
        return None
    return {**check.spec, "source": status.get("source_sha"), "bundle": status["bundle"],
            "weights": weights, "code": digests.code("lock"), "environment": digests.env(),
            "threads": threads}


def moved(recorded, parts):
    """The names of the parts that differ between a result's recorded key record and now."""
    if not isinstance(recorded, dict) or parts is None:
        return ["inputs"]
    return sorted(k for k in set(recorded) | set(parts) if recorded.get(k) != parts.get(k))


# --- currency: each task's recorded key against the key of its inputs now ---------------------

def emit_current(entry, st=None):
    """The emit status (`st`, read here when not given) records this emit's key, and the bundle it
    lists is on disk as written. A refused program's emit is never current: as its checks' errors
    are recorded again by every run, its refusal is said again (and fails an emit run alone)."""
    st = read_json(entry.status) if st is None else st
    if not isinstance(st, dict) or st.get("key") != emit_key(entry):
        return False
    if not entry.locked and (os.path.exists(f"{entry.bundle}/golden") or os.path.exists(entry.lock_status)):
        return False   # locked before `lock: false`: the emit removes what its lock left
    need = st.get("tensor_bytes")   # (within this machine's limit, where the key names none)
    return st.get("status") == "ok" and isinstance(need, int) and need <= entry.pc.limits["tensor_bytes"] \
        and bundle_as_recorded(entry, st)


def bundle_as_recorded(entry, st):
    """The bundle the emit status `st` lists (what a check's key names) is on disk as written."""
    bundle = st.get("bundle") if isinstance(st, dict) else None
    return isinstance(bundle, dict) and all(
        sha256_or_none(f"{entry.bundle}/{f}") == sha for f, sha in bundle.items())


def made_current(entry, st=None):
    """The program's emit is current (its bundle on disk as the emit status lists it: what a
    check's key takes from records) and so are its derived weights, where they were made (a hand
    edit of either is seen; a verdict from a shared cache needs none: its key names what the
    import reads): the rule `logos results` and a restored report follow (`st`: the emit status,
    read here when not given)."""
    st = read_json(entry.status) if st is None else st
    return emit_current(entry, st) and (
        not entry.pc.derive or not os.path.isdir(entry.pc.weights) or import_current(entry))


def import_current(entry):
    """The derived folder holds what an import of the inputs as they are now makes: its
    .derived.json names the current import key, and each file it lists is still that file."""
    record = read_json(os.path.join(entry.pc.weights, DERIVED))
    if not isinstance(record, dict) or record.get("key") != import_key(entry.pc):
        return False
    files = record.get("files")
    return isinstance(files, dict) and listed(entry.pc.weights) == set(files) and all(
        sha256_or_none(os.path.join(entry.pc.weights, n)) == sha for n, sha in files.items())


def current_parts(entry, threads, st):
    """{dtype: `check_parts` now} of every check of `entry` (`st`: its emit status), the weights
    looked at once for them all."""
    if not isinstance(st, dict) or st.get("status") != "ok":
        return {c.dtype: None for c in entry.checks}
    weights = weights_part(entry, st.get("leaves") or ())
    return {c.dtype: check_parts(entry, c, st, threads, weights) for c in entry.checks}


def current_keys(entry, threads, st=None):
    """{dtype: the check's key now, or None} (`st`: the emit status, read here when not given)."""
    st = read_json(entry.status) if st is None else st
    return {dt: p and check_key(p) for dt, p in current_parts(entry, threads, st).items()}


def result_shas(entry):
    """{dtype: the sha256 of its result file now, or None}."""
    return {c.dtype: sha256_or_none(c.result) for c in entry.checks}


def lock_current(entry, threads, st=None, lock=None, now=None, golden=True, shas=None):
    """Every check's result is a pass recorded under the key of its inputs as they are now, and
    the result file is the one the lock wrote (a failing or erroring check reruns, a refused
    program's too), the checks are the program's (none dropped), and golden/ is as the lock
    settled it, and there, unless the run takes verdicts from a shared cache (`golden` False:
    the cache holds no golden/). `st`, `lock`: the emit and lock statuses, `now` the current
    keys, `shas` the `result_shas`, worked out here when not given."""
    lock = (read_json(entry.lock_status) if lock is None else lock) or {}
    rec = lock.get("checks")
    settled = lock.get("golden")   # golden/ as the lock left it
    if not entry.checks or not isinstance(rec, dict) or set(rec) != {c.dtype for c in entry.checks}:
        return False
    if golden and not (isinstance(settled, dict) and settled.get("golden.json")):
        return False
    st = (read_json(entry.status) if st is None else st) or {}
    if st.get("status") != "ok":   # refused: its checks are errors, recorded again by every run
        return False
    now = current_keys(entry, threads, st) if now is None else now
    shas = result_shas(entry) if shas is None else shas
    for c in entry.checks:
        r = rec.get(c.dtype)
        if not isinstance(r, dict) or r.get("verdict") != "pass" or not now[c.dtype] \
                or r.get("key") != now[c.dtype] or shas[c.dtype] != r.get("sha256"):
            return False
    return golden_as_recorded(entry.bundle, settled)


def lock_records(lock):
    """{dtype: what the lock status `lock` records of that check (its key, verdict and the
    sha256 of the result file it wrote)}, or {} for none."""
    rec = (lock or {}).get("checks")
    return {dt: x for dt, x in rec.items() if isinstance(x, dict)} if isinstance(rec, dict) else {}


def golden_record(bundle):
    """What the bundle's golden/ holds now, {file: sha256}, golden.json's None where there is none:
    the lock status keeps it, so that golden/ written since (a hand lock of a zoo bundle, an edit)
    makes the lock task settle it again (emitter.pipeline.golden_store)."""
    folder = os.path.join(bundle, "golden")
    try:
        names = os.listdir(folder)
    except OSError:
        names = []
    return {"golden.json": None, **{n: sha256_or_none(os.path.join(folder, n)) for n in sorted(names)}}


def golden_as_recorded(bundle, rec):
    """golden/'s files are those `golden_record` gave (a stat each, through the hash record), and
    no others: what no lock made (a stray file, folder or link dropped in) is removed by the lock
    task."""
    if not (isinstance(rec, dict) and "golden.json" in rec):
        return False
    try:
        names = os.listdir(os.path.join(bundle, "golden"))
    except OSError:
        names = ()
    # (a name recorded without a hash, a folder or a link to nothing, is none the lock made)
    return all(rec.get(n) is not None for n in names) and all(
        sha is not None and sha256_or_none(os.path.join(bundle, "golden", n)) == sha
        for n, sha in rec.items() if n != "golden.json" or sha is not None)


def report_row(e, threads, st, lock, now=None, made=None, shas=None):
    """One program's part of the report key (`st`, `lock`: its emit and lock statuses; `now`: its
    current keys, `made`: whether what they take from records is on disk (`made_current`),
    `shas` its `result_shas`, each worked out here when not given), with each result file's
    sha256: a result edited by hand makes the report again, whatever doit ignores. Its digest:
    rows are worked out apart (on the pre-check's cores) and the report key is theirs'."""
    return digest([e.name, e.pc.source, st.get("key"), st.get("status"), st.get("reason"),
                   current_keys(e, threads, st) if now is None else now,
                   (lock or {}).get("checks") or {}, made_current(e, st) if made is None else made,
                   result_shas(e) if shas is None else shas])


def report_key(entries, threads, rows=None):
    """What the report is made of: every program's emit status and every check's recorded entry
    beside its current key, and the report code (`rows`: the digests `report_row` gives, read
    here when not given), the commit its headers name and the thread count they state. A report
    recording this key is current."""
    from .report_facts import git_head
    if rows is None:
        rows = [report_row(e, threads, read_json(e.status) or {}, read_json(e.lock_status))
                for e in entries]
    return digest({"rows": rows, "code": digests.code("report"), "commit": git_head(), "threads": threads})


@uptodate_check
def uptodate(kind, entry, threads=None, cache=None):
    """doit's `uptodate` of the zoo's weights, emit and lock tasks (`cache`: the run's cache=). A
    lock's key takes the program's and bundle's hashes from the emit status: it is current only
    where they are (`doit -s lock:NAME` skips the emit)."""
    if kind == "lock":
        return made_current(entry) and lock_current(entry, threads, golden=not cache)
    return emit_current(entry) if kind == "emit" else import_current(entry)
