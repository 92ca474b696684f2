"""The zoo's doit tasks, for any repository of programs: `from emitter.tasks import *` in a dodo.py
(beside tasks of its own), or `logos doit` in a folder with programs/ and no dodo.py.

The current folder is the zoo: `programs/NAME.logos` with an optional `programs/NAME.yaml` (zoo
defaults in `programs/defaults.yaml`), weights in `weights/NAME`, everything made under `build/`.
Importing this module takes build/'s lock (one doit run at a time), sweeps what a killed run left
and reads the zoo: import it only to run doit.

doit's command-line variables choose where locks run and whether verdicts are shared (README,
"Beyond one machine"): `executor=inline|dask:local|dask:tcp://HOST:PORT`, `workers=N` (a local
cluster's), `threads=N` (per lock; default 1) and `cache=URL` (a signed verdict cache, with the
key in LOGOS_CACHE_KEY).

A plain `doit` (no arguments) hands doit only the tasks whose files moved since the last complete
plain run, the report task alone on a no-op (`pipeline.settled`). A dodo's own task creators keep
that when marked `@standalone` (they name none of the zoo's tasks); an unmarked one has doit load
every task on every run.
"""

import os
import sys

from . import zoo
from . import fingerprint
from .importers import declared_reads
from .pipeline import actions, digests, executors, fastpath, files_io, guards, keys, settled, weights
from .pipeline import cache as vcache
from .pipeline.config import discover
from .pipeline.progress import ProgressReporter
from .verify.threads import DEFAULT_THREADS

__all__ = ["DOIT_CONFIG", "task_digest", "task_weights", "task_wmanifest", "task_emit", "task_lock",
           "task_report", "task_cachelookup", "task_cache", "standalone"]

ROOT = os.getcwd()   # doit runs a dodo.py from its own folder; `logos doit` from the zoo's
PACKAGE = os.path.dirname(os.path.abspath(__file__))
BUILD = "build"
DIGESTS = f"{BUILD}/digests"
DB = f"{BUILD}/results.sqlite"

guards.safe_build(ROOT, BUILD)
guards.exclusive(BUILD)
guards.sweep(BUILD)
guards.install_sigterm(BUILD)
guards.pause_collector()
fingerprint.bind(f"{BUILD}/.fingerprints.json")

DOIT_CONFIG = {
    "dep_file": f"{BUILD}/.doit.db",
    "backend": "sqlite3",
    "check_file_uptodate": files_io.FingerprintChecker,   # the one fingerprint rule
    "continue": True,          # one program's failure never stops the others
    "reporter": ProgressReporter,
    # `doit` alone walks the report's dependencies program by program (emit, lock, then the next),
    # so the progress line's ETA knows what each kind of task costs early in the run
    "default_tasks": ["report"],
}


def _var(name, default=None):
    """A doit command-line variable (`doit executor=dask:local`): doit's once it has read the
    command line; before that (`logos doit` imports this module first) from sys.argv."""
    from doit import doit_cmd
    if doit_cmd._CMDLINE_VARS is not None:
        return doit_cmd.get_var(name, default)
    for arg in sys.argv[1:]:
        k, eq, v = arg.partition("=")
        if eq and k == name and not k.startswith("-"):
            return v
    return default


def _run_settings():
    """executor=, workers=, threads=, cache=, checked before anything runs: a bad one, or a
    scheduler nobody answers at, is one line and exit 3."""
    try:
        ex = executors.parse(_var("executor"), _var("workers"))
        threads = str(_var("threads") or DEFAULT_THREADS)
        if not threads.isdigit() or int(threads) < 1:
            raise executors.ExecutorError(f"threads={threads}: must be a whole number of at least 1")
        executors.probe(ex)
        store, warning = vcache.open_cache(_var("cache"))
    except (executors.ExecutorError, vcache.CacheError) as e:
        sys.stderr.write(f"doit: refused: {e}\n")
        raise guards.BuildBusy(3) from None
    if warning:
        sys.stderr.write(f"warning: {warning}\n")
    run = {"executor": ex["spec"], "workers": ex["workers"], "threads": int(threads),
           "cache": store.url if store else None}
    return run, ex


RUN, _EX = _run_settings()
if _EX["kind"] != "inline":   # each lock waits on the cluster: doit's threads keep many in flight,
    # so every program's checks wait in one queue and the longest start first (executors.cost)
    DOIT_CONFIG.update(par_type="thread", num_process=4 * (_EX["workers"] or 4))
if RUN["cache"]:             # after the report: publish what the cache lacks
    DOIT_CONFIG["default_tasks"] = DOIT_CONFIG["default_tasks"] + ["cache"]

WARNINGS = []
PROGRAMS = discover(ROOT, cache_file=f"{BUILD}/.config-cache.json", warnings=WARNINGS)
for _w in WARNINGS:
    sys.stderr.write(f"warning: {_w}\n")
CODE = {kind: digests.code_files(ROOT, kind) for kind in ("emit", "lock", "import")}
REPORT_CODE = [digests.package_path(ROOT, f) for f in ("pipeline/report.py", "pipeline/report_html.py",
                                                      "verify/verdict.py")]
INTACT = [files_io.targets_intact]   # a target edited since its task wrote it reruns the task


def _paths(pc):
    s = pc.name   # a plain name, or `invalid-<hash>` for a file name that is not one
    return {
        "bundle": f"{BUILD}/bundles/{s}",
        "status": f"{BUILD}/status/{s}.emit.json",
        "manifest": f"{BUILD}/weights-manifests/{s}.json",
        "results": f"{BUILD}/results/{s}",
    }


DEFAULTS = [f for f in ("programs/defaults.yaml",) if os.path.isfile(f)]


def _config_files(pc):
    return DEFAULTS + ([pc.config] if pc.config else [])


def _checks(pc, p):
    return [(dt, *pc.tolerance(dt), f"{p['results']}/{dt}.json") for dt in pc.dtypes]


# each program's paths and checks, worked out once for all its tasks (a zoo has thousands)
PATHS = {pc.name: _paths(pc) for pc in PROGRAMS}
CHECKS = {pc.name: _checks(pc, PATHS[pc.name]) for pc in PROGRAMS}
BUNDLE_FILES = ("model.py", "manifest.json", "compile.py")
# the files each task stamps; only the tasks whose files moved since the last run started get the
# per-task check that they are still what the task wrote (a no-op pays one stat per file)
STAMPED = {**{f"emit:{n}": [p["status"]] + [f"{p['bundle']}/{f}" for f in BUNDLE_FILES]
              for n, p in PATHS.items()},
           **{f"lock:{n}": [c[3] for c in CHECKS[n]] for n in PATHS},
           "report": [f"{BUILD}/{f}" for f in guards.REPORT_FILES]}
MOVED = settled.begin(f"{BUILD}/.stamps.json", STAMPED)
_NOT_RUNS = {"list", "info", "clean", "forget", "ignore", "dumpdb", "strace", "help", "reset-dep"}
if _EX["kind"] != "inline" and any(n.startswith("lock:") for n in MOVED) \
        and not _NOT_RUNS & set(zoo.ARGV if zoo.ARGV is not None else sys.argv[1:]):
    # a lock's results moved or are missing: it will run, so the cluster starts while doit loads
    executors.executor(RUN["executor"], RUN["workers"]).warm()


def _intact(task_name):
    return INTACT if task_name in MOVED else []


# each check's key parts known from its config ({name: {dtype: spec}}): the rest is read when it runs
KEYS = {pc.name: keys.key_specs(pc, CHECKS[pc.name]) for pc in PROGRAMS if not pc.error}


def _skips_import(pc):
    """With cache=, a derived program's lock looks its verdicts up before its weights are made."""
    return bool(RUN["cache"] and pc.derive and not pc.error)


def _run(pc):
    """What the lock action needs of the run's settings (executor, threads, cache) and its checks'
    key parts."""
    return {**RUN, "keys": KEYS.get(pc.name) or {}}


def _make_digest():
    """Digests of the emitter's code and of the environment: what every emit, lock and import
    depends on beyond its own files (a torch or numpy upgrade reruns every lock)."""
    for kind, files in CODE.items():
        target, packages = f"{DIGESTS}/{kind}.json", digests.PACKAGES.get(kind, ())
        yield {
            "name": kind,
            "doc": f"keep {target} the sha256 of the {kind} code ({len(files)} files)" +
                   (f" and the versions of {', '.join(packages)}" if packages else ""),
            "actions": [(digests.write_digest, [target, files, packages, kind])],
            "targets": [target],
            "uptodate": [(digests.digest_current, [target, files, packages, kind])],
            "clean": True,
        }
    target = f"{DIGESTS}/env.json"
    yield {
        "name": "env",
        "doc": f"keep {target} the fingerprint of python, numpy, torch and the CPU",
        "actions": [(digests.write_env, [target])],
        "targets": [target],
        "uptodate": [(digests.env_current, [target])],
        "clean": True,
    }


def _make_weights():
    """Derived weights: a program's `derive:` checkpoint through its importer."""
    for pc in PROGRAMS:
        if pc.error or not pc.derive:
            continue
        d = pc.derive
        deps = [pc.source, f"{DIGESTS}/import.json", f"{DIGESTS}/emit.json"] + _config_files(pc)
        task = {
            "name": pc.name,
            "doc": f"import {d.checkpoint} with import-{d.importer} into {pc.weights}",
            "file_dep": deps,
            "targets": [pc.weights],
            "clean": [(files_io.remove_dir, [pc.weights])],
        }
        # every file the importer reads, by its fingerprint and its key (.derived.json records it)
        task["file_dep"] = [path for _, path in declared_reads(d.importer, d.checkpoint, d.checkpoint_path)
                            if not os.path.isabs(path)] + deps
        task["uptodate"] = [(weights.import_current, [pc.weights, d, DIGESTS])]
        task["actions"] = [(weights.import_weights, [d.importer, d.checkpoint_path, pc.source,
                                                     pc.weights, d, DIGESTS, pc.limits["seconds"],
                                                     f"{BUILD}/tmp"])]
        yield task


def _make_wmanifest():
    """Per-directory weights manifests (names, sizes, sha256): a lock's one weights dependency."""
    for pc in PROGRAMS:
        if pc.error or not pc.weights or not pc.lock:
            continue
        p = PATHS[pc.name]
        task = {
            "name": pc.name,
            "doc": f"keep {p['manifest']} current with {pc.weights}/",
            "actions": [(weights.write_weights_manifest, [pc.weights, p["manifest"]])],
            "targets": [p["manifest"]],
            # the stat cache's ctimes see an edit that put its mtime back (doit's md5 check does not)
            "uptodate": INTACT + [(weights.weights_current, [pc.weights, p["manifest"]])],
            "clean": [(files_io.remove_files, [[p["manifest"], p["manifest"] + ".stat"]])],
        }
        if pc.derive:
            # made by weights:NAME during the run: listed when this task runs, not at load
            task["task_dep"] = [f"weights:{pc.name}"]
        else:
            # the directory's files as listed now: doit's md5 checker sees edits, touches cost a
            # hash and no rerun, and an added or removed file changes the set and reruns it
            task["file_dep"] = weights.weight_files(pc.weights)
        yield task


def _make_emit():
    """Bundles: model.py, manifest.json, compile.py per program (and its emit status)."""
    for pc in PROGRAMS:
        p = PATHS[pc.name]
        yield {
            "name": pc.name,
            "doc": f"emit {pc.source} to {p['bundle']}/",
            "actions": [(actions.emit_bundle, [pc.name, pc.source, p["bundle"], p["status"],
                                               pc.error, pc.limits, pc.precision, DIGESTS])],
            # a refused config is refused whatever the program holds: its text is no dependency
            "file_dep": ([] if pc.error else [pc.source]) + _config_files(pc) + [f"{DIGESTS}/emit.json"],
            # the bundle's files are stamped by the action (a refused program has none, and a
            # missing target would rerun it on every run); the status records them
            "targets": [p["status"]],
            "uptodate": _intact(f"emit:{pc.name}") + [(actions.emit_current, [
                pc.source, p["status"], pc.error, pc.limits, pc.precision, DIGESTS])],
            "clean": [(files_io.remove_files, [[p["status"]] + [f"{p['bundle']}/{f}" for f in
                                                                ("model.py", "manifest.json", "compile.py")]])],
        }


def _make_lock():
    """Lock checks: each program's bundle against the VM, one RESULT.json per dtype."""
    for pc in PROGRAMS:
        if not pc.lock and not pc.error:
            continue
        p = PATHS[pc.name]
        checks = CHECKS[pc.name]
        deps = [p["status"], f"{DIGESTS}/lock.json", f"{DIGESTS}/env.json"] + _config_files(pc)
        manifest = None
        if pc.weights and not pc.error:
            manifest = p["manifest"]
            deps.append(manifest)
        more = {}
        if _skips_import(pc):
            # the key covers the checkpoint and the importer's code: the weights (and so their
            # manifest) come in only when `cachelookup:NAME` finds a check the cache lacks, else
            # the lock depends on the file of its checks' keys
            deps = [d for d in deps if d != manifest]
            more = {"calc_dep": [f"cachelookup:{pc.name}"]}
        yield {
            "name": pc.name,
            "doc": f"lock {pc.name} ({', '.join(pc.dtypes)}, {pc.steps} step(s))",
            "actions": [(actions.lock_program, [pc.name, pc.source, p["bundle"], p["status"],
                                                pc.weights, checks, pc.steps, DB, manifest,
                                                pc.allow_nonfinite, DIGESTS, pc.limits, pc.bf16,
                                                pc.precision], {"run": _run(pc)})],
            "file_dep": deps,
            "targets": [c[3] for c in checks],
            # current when each check's result holds a pass under the key of its inputs as they
            # are now (a fail or error reruns)
            "uptodate": _intact(f"lock:{pc.name}") + [(keys.lock_current, [
                [(c[3], KEYS[pc.name][c[0]]) for c in checks] if pc.name in KEYS else None,
                p["status"], manifest, DIGESTS, RUN["threads"]])],
            # the history in results.sqlite stays: `logos results --prune` drops a program's
            "clean": [(files_io.remove_files, [[c[3] for c in checks]]),
                      (files_io.remove_dir, [f"{p['bundle']}/golden"])],
            **more,
        }


def task_cachelookup():
    """With cache=URL: whether the cache holds every verdict of a derived program (then its lock
    needs no import); else its lock waits for the weights and their manifest."""
    for pc in PROGRAMS:
        if not _skips_import(pc):
            continue
        p = PATHS[pc.name]
        checks = [(c[3], KEYS[pc.name][c[0]]) for c in CHECKS[pc.name]]
        yield {
            "name": pc.name,
            "doc": f"look {pc.name}'s verdicts up in {RUN['cache']}",
            "actions": [(vcache.lookup_deps, [pc.name, checks, p["status"], DIGESTS, RUN["threads"],
                                              RUN["cache"], p["manifest"],
                                              f"{BUILD}/cache-keys/{pc.name}.json"])],
            "task_dep": [f"emit:{pc.name}", "digest:lock", "digest:env", "digest:import"],
            "verbosity": 2,   # a bad entry is said here (once)
        }


def task_cache():
    """With cache=URL: publish every current verdict the shared cache lacks, including those of
    locks that did not rerun (a no-op run over a restored build/ fills a new cache)."""
    if not RUN["cache"]:
        return None
    checks = [(c[3], KEYS[pc.name][c[0]], PATHS[pc.name]["status"],
               PATHS[pc.name]["manifest"] if pc.weights and not pc.derive else None)
              for pc in PROGRAMS if KEYS.get(pc.name) and pc.lock for c in CHECKS[pc.name]]
    return {
        "doc": f"publish the verdicts {RUN['cache']} lacks",
        "actions": [(vcache.publish_all, [checks, RUN["cache"], DIGESTS,
                                          f"{BUILD}/.cache-published.json"])],
        "verbosity": 2,
    }


def report_entries():
    """What the report covers: every program, its checks and the files their digests are read from
    (also what the progress reporter writes the report from when a task fails)."""
    entries = []
    for pc in PROGRAMS:
        p = PATHS[pc.name]
        checks = [(dt, path, atol, rtol) for dt, atol, rtol, path in CHECKS[pc.name]] \
            if (pc.lock or pc.error) else []
        entries.append({"name": pc.name, "source": pc.source, "status": p["status"],
                        "manifest": p["manifest"] if pc.weights and not pc.error else None,
                        "steps": pc.steps, "weights": pc.weights,
                        "allow_nonfinite": pc.allow_nonfinite, "bf16": pc.bf16, "checks": checks,
                        "keys": KEYS.get(pc.name), "threads": RUN["threads"]})
    return entries


def _make_report():
    """build/report.json, junit.xml, summary.md; fails the run when any check did not pass."""
    entries = report_entries()
    # a locked program's results already follow its emit status (the lock depends on it)
    deps = [path for e in entries for path in ([c[1] for c in e["checks"]] or [e["status"]])]
    return {
        "doc": f"report {len(PROGRAMS)} programs into {BUILD}/report.json, junit.xml, summary.md",
        "actions": [(actions.make_report, [entries, BUILD])],
        # the entries follow from these paths: a program or check added or removed changes the set
        "file_dep": deps + [f"{DIGESTS}/lock.json", f"{DIGESTS}/env.json"] + REPORT_CODE,
        "targets": [f"{BUILD}/{f}" for f in guards.REPORT_FILES],
        "uptodate": _intact("report"),
        "clean": True,
    }

# --- what doit is handed --------------------------------------------------------------------------
# A plain `doit` works out every task here, then compares with the stat snapshot of the last
# complete plain run (`pipeline.settled`): doit is handed the report task, the dodo's own
# `standalone` tasks and only those of the zoo's whose files moved since (and what follows them);
# every task when anything it cannot vouch for changed, as any other command gets.

MAKERS = {"digest": _make_digest, "weights": _make_weights, "wmanifest": _make_wmanifest,
          "emit": _make_emit, "lock": _make_lock, "report": _make_report}
# DOIT_CONFIG keys a dodo may set and keep the fast path; of those, the ones that must be ours
SAFE_CONFIG = set(DOIT_CONFIG) | {"verbosity", "failure_verbosity", "minversion"}
OWN_CONFIG = ("dep_file", "backend", "check_file_uptodate", "reporter")


def standalone(creator):
    """Mark a task creator of a dodo's own (beside `from emitter.tasks import *`) as using none of
    the zoo's tasks (no task_dep, setup or calc_dep naming them). A plain run over a settled zoo
    then still hands doit only the zoo's tasks whose files moved (the report task alone on a
    no-op) and the dodo's own; a dodo with an unmarked creator has doit load and check every task
    on every run (correct, only slower)."""
    creator.zoo_standalone = True
    return creator


_HANDED = []


def _handed():
    """None (hand doit every task) or the names of the zoo's tasks to hand it beside the report."""
    if not _HANDED:
        ours = {globals()[n] for n in __all__ if n.startswith("task_")}
        ns = fastpath.dodo_namespace(zoo.ARGV, ROOT, globals())
        ok = settled.handed() is not None and fastpath.namespace_ok(ns, ours, DOIT_CONFIG,
                                                                     SAFE_CONFIG, OWN_CONFIG)
        if ok:   # a dodo task that writes what a zoo task reads: doit must order them itself
            reads = {os.path.normpath(f) for fs in PARTS[3].values() for f in fs}
            dirs = tuple(os.path.normpath(d) + os.sep for d in
                         ["programs"] + [pc.weights for pc in PROGRAMS if pc.weights])
            made = fastpath.own_targets(ns, ours)
            ok = not (made & reads or any(f.startswith(dirs) for f in made))
        if not ok:
            settled.load_in_full()
        _HANDED.append(settled.handed())
    return _HANDED[0]


def _tasks(base):
    if TASKS is None:
        return MAKERS[base]()
    handed = _handed()
    if base == "report":   # always handed (a dodo's own tasks may name it)
        return TASKS["report"][0]
    if handed is None:
        return (t for t in TASKS[base])
    ts = [t for t in TASKS[base] if fastpath.task_name(base, t) in handed]
    return (t for t in ts) if ts else None


def _creator(base):
    def creator():
        return _tasks(base)
    creator.__name__ = creator.__qualname__ = f"task_{base}"
    creator.__doc__ = MAKERS[base].__doc__
    return creator


task_digest, task_weights, task_wmanifest, task_emit, task_lock, task_report = (
    _creator(b) for b in ("digest", "weights", "wmanifest", "emit", "lock", "report"))

TASKS = None
if fastpath.plain_run(zoo.ARGV):
    TASKS = {b: (lambda r: [r] if isinstance(r, dict) else list(r))(m()) for b, m in MAKERS.items()}
    # what the tasks' uptodate callables read beyond their file deps
    READS = {f"digest:{kind}": files for kind, files in CODE.items()}
    READS.update({f"wmanifest:{pc.name}": weights.weight_files(pc.weights) for pc in PROGRAMS
                  if pc.derive and not pc.error})
    # (key, specs, made, reads, named, shared): what the snapshot compares, and what each task reads
    PARTS = fastpath.whole_parts(TASKS, STAMPED, READS, PACKAGE, digests.run_env_text(), ROOT)
    settled.whole(*PARTS, DOIT_CONFIG["dep_file"])
