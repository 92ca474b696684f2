"""One doit run over the zoo: its settings, its records and the tasks it hands doit.

`begin` runs when doit opens its dependency DB (the zoo's file checker is constructed then, in
every command that uses the DB, through a dodo.py or `logos doit` alike): build/'s lock, what a
killed run left swept, a damaged DB set aside, the fingerprint cache bound, and on a command that
runs tasks the report of the last complete run set aside (build/stale/) until this run writes or
confirms one. `Run` is made by the first task creator doit calls: the zoo read into records once,
and on a plain run the pre-check that hands doit only what is not current (`handing`)."""

import os
import sys

from .. import fingerprint
from ..files import read_json
from . import build_dir, digests, executors, files_io, guards, handing, keys, log
from .actions import (cache_lookup, cache_publish, clean_report, emit_bundle, import_weights, lock_program,
                      make_report, report_aside, report_current)
from .log import LOG
from .checks import entries
from .doit_db import said_when_unwritable
from .config import discover
from ..importers import declared_reads
from ..verify.threads import DEFAULT_THREADS, thread_count

_BEGUN = []


class ZooChecker(files_io.FingerprintChecker):
    """doit's file checker (`check_file_uptodate`), which doit makes just before it opens its
    dependency DB: the run begins here, before anything touches build/."""

    def __init__(self):
        begin("build")


def begin(build):
    """Set the run up before doit opens its DB (once per process)."""
    if _BEGUN:
        return
    _BEGUN.append(build)
    root = os.getcwd()
    build_dir.safe_build(root, build)
    guards.exclusive(build)
    build_dir.sweep(build)
    guards.install_sigterm()
    guards.pause_collector()
    fingerprint.bind(f"{build}/.fingerprints.json")
    if handing.is_run(handing.doit_args()):
        from .actions import report_aside_for_run
        report_aside_for_run(build, current)


def _cache(url, ask):
    """(the verdict cache cache= names, a warning): none without a URL (fsspec, hmac, sockets are
    loaded only for a run that may use one); one that cannot be used is one line and exit 3."""
    if not url:
        return None, None
    from . import cache as vcache
    try:
        return vcache.open_cache(url, reach=ask)
    except vcache.CacheError as e:
        _refuse(e)


def _refuse(e):
    sys.stderr.write(f"doit: refused: {e}\n")
    raise guards.BuildBusy(3) from None


def settings(get_var, ask=True):
    """executor=, workers=, threads=, cache= (doit's command-line variables), checked: a bad one,
    a scheduler nobody answers at or (`ask`: a command that runs tasks) a cache that cannot be
    used, is one line and exit 3."""
    try:
        ex = executors.parse(get_var("executor"), get_var("workers"))
        threads = str(get_var("threads") or DEFAULT_THREADS)
        try:
            thread_count(threads)
        except ValueError as e:
            raise executors.ExecutorError(f"threads={threads[:20]}: {e}") from None
        executors.probe(ex)
        store, warning = _cache(get_var("cache"), ask)
    except executors.ExecutorError as e:
        _refuse(e)
    if warning:
        LOG.warning(f"warning: {warning}")
    if get_var("workers") not in (None, "") and ex["workers"] is None:   # (an int where one is read)
        LOG.warning(f"warning: workers={get_var('workers')} is read by executor=dask:local only; "
                    f"executor={ex['spec']} ignores it")
    return {"executor": ex["spec"], "workers": ex["workers"], "threads": int(threads),
            "cache": store.url if store else None, "kind": ex["kind"]}


_CURRENT = []


def current():
    """This process's Run, once the first task creator made it (else None)."""
    return _CURRENT[0] if _CURRENT else None


def start(build, config, own_config, ours, default_tasks):
    """The process's Run, made on first use (see `Run`); a dodo's own tasks join `default_tasks`
    (doit selected that very list before it loaded the tasks), unless the dodo chose its own."""
    if not _CURRENT:
        from doit import Globals
        if Globals.dep_manager is not None:   # (opened by now, with its checker: `begin`)
            said_when_unwritable(Globals.dep_manager)
        _CURRENT.append(Run(build, config, own_config, ours))
        cfg = getattr(handing.dodo(), "DOIT_CONFIG", None)
        if isinstance(cfg, dict) and cfg.get("default_tasks") is default_tasks:
            default_tasks.extend(n for n in _CURRENT[0].own_basenames if n not in default_tasks)
    return _CURRENT[0]


class Run:
    """The run's settings, its records (`entries`) and the tasks it hands doit."""

    def __init__(self, build, config, own_config, ours):
        from doit import get_var
        begin(build)
        args = handing.doit_args()
        log.setup(log.verbosity(args))
        self.build, self.db = build, f"{build}/results.sqlite"
        self.settings = settings(get_var, handing.is_run(args))
        warnings = handing.near_variables(args)
        build_dir.listable("programs")
        # the dodo's own tasks, as their creators make them (None: one cannot be called early)
        self.own, self.own_basenames = handing.own_tasks(ours)
        # what they write: the zoo's tasks that read it wait for them (a folder or checkpoint a
        # config names counts as there when one of them makes it)
        self.writers = handing.Writers(self.own, os.getcwd())
        programs = discover(os.getcwd(), cache_file=f"{build}/.config-cache.json", warnings=warnings,
                            makes=self.writers.makes)
        for w in warnings:
            LOG.warning(f"warning: {w}")
        for pc in programs:   # a weights folder a task of the dodo's own makes: the program's
            default = f"weights/{pc.name}"
            if pc.weights is None and not pc.error and self.writers.makes(default):
                pc.weights = default
        defaults = [f for f in ("programs/defaults.yaml",) if os.path.isfile(f)]
        self.entries = entries(programs, build, defaults)
        if handing.is_run(args):
            files_io.drop_gone(build, {e.name for e in self.entries})
        self._follows(args)
        self.handed = None   # None: every task; else the names of those handed beside the report
        self.report_now = None   # the report's key as the pre-check read it, when nothing is handed
        # the keys alone decide (`uptodate`), whatever doit's DB holds; a zoo task waits for the
        # dodo's tasks that write what it reads (task_dep). Where those cannot be told (a creator
        # that cannot be called early), doit orders them by the files (file_dep), and then
        # decides by them too
        self.ordered = self.own is None and handing.dodo() is not None
        writes = self.ordered or bool(self.writers.of(self._inputs()))
        if handing.plain(args) and handing.dodo_ok(self.own, config, own_config, writes):
            self.handed = self._not_current()
        LOG.debug(f"{len(self.entries)} programs, {sum(len(e.checks) for e in self.entries)} checks; "
                  + ("every task handed to doit (not a plain run, or a dodo task names the zoo's)"
                     if self.handed is None else f"{len(self.handed)} task(s) not current by their keys"))
        locks = [e for e in self.entries if e.locked and self._hands(f"lock:{e.name}")]
        if handing.is_run(args) and guards.history_lost(self.db):   # made again before any lock adds to it
            from .results import refill
            refill(self.db, [c.result for e in self.entries for c in e.checks])
        if handing.is_run(args) and os.path.exists(self.db + guards.BEHIND):
            from .results import catch_up   # rows a held history did not take last run
            catch_up(self.db, self.entries)
        if self.settings["kind"] != "inline" and locks and handing.is_run(args):
            executors.executor(self.settings["executor"], self.settings["workers"]).warm()

    def _follows(self, args):
        """Whether the report, and which programs' locks, this run's selection reaches: a lock
        whose checks fail and a refused emit fail the run themselves where neither does. Told
        from the arguments here; the zoo's progress reporter tells it from doit's own selection."""
        from fnmatch import fnmatch
        sel = handing.selection(args)
        if sel is None:
            return
        if not sel:   # the default tasks: the dodo's own list where it sets one
            cfg = getattr(handing.dodo(), "DOIT_CONFIG", None)
            sel = list((cfg.get("default_tasks") if isinstance(cfg, dict) else None) or ["report"])
        for w in handing.near_tasks(sel, self.entries, self.own_basenames):
            LOG.warning(f"warning: {w}")
        follows = any(fnmatch("report", n) for n in sel) and not handing.ignored("report")
        self.settings["report_follows"] = follows
        if not follows:
            self.settings["locks_follow"] = {e.name for e in self.entries if e.locked and any(
                n == "lock" or fnmatch(f"lock:{e.name}", n) for n in sel) and not handing.ignored(f"lock:{e.name}")}

    # --- what is handed ------------------------------------------------------------------------
    def _inputs(self, e=None, kind=None):
        """The files and folders the zoo's tasks read (`e`, `kind`: that task's alone): a dodo task
        writing one is waited for, and every task is handed."""
        if e is None:
            return ["programs"] + [p for e in self.entries for k in ("weights", "emit", "lock")
                                   for p in self._inputs(e, k)]
        if kind == "emit":
            return [e.pc.source, *e.could_configure()]
        if kind == "weights":
            return [e.pc.source, *e.configs, *self._reads(e)] if e.pc.derive else []
        return [e.pc.weights] if e.pc.weights and not e.pc.derive else []

    def _reads(self, e):
        """What a derived program's importer reads: the files of its checkpoint it declares."""
        d = e.pc.derive
        try:
            return [p for _, p in declared_reads(d.importer, d.checkpoint, d.checkpoint_path)]
        except (OSError, ValueError):
            return []

    def _not_current(self):
        """The zoo's tasks that are not current, and what they name (doit must know each): each
        program judged on its own, the programs spread over the machine's cores."""
        from .spread import spread
        for kind in ("lock", "emit", "report") + (("import",) if any(e.pc.derive for e in self.entries) else ()):
            digests.code(kind)   # (taken once, before a fork)
        digests.env()
        out, rows = set(), []
        for names, row in spread(self._judge, self.entries):
            out.update(names)
            rows.append(row)
        for name in sorted(out):   # (doit keeps an ignore in its DB, run after run)
            if handing.ignored(name):
                guards.say_once(handing.ignored_line(name), LOG.warning)
        if not out:   # nothing runs before the report: its key is the one these reads make
            self.report_now = keys.report_key(self.entries, self.settings["threads"], rows)
        return out

    def _judge(self, e):
        """(the names of `e`'s tasks that are not current, its row of the report key)."""
        threads, cache, out = self.settings["threads"], self.settings["cache"], []
        st, lock = read_json(e.status) or {}, read_json(e.lock_status)
        now = keys.current_keys(e, threads, st)
        derived = e.pc.derive is not None and not e.pc.error
        have = derived and os.path.isdir(e.pc.weights)
        imported = have and keys.import_current(e)
        w = derived and not imported and not (cache and not have)   # (cachelookup decides)
        em, shas = not keys.emit_current(e, st), keys.result_shas(e)
        row = keys.report_row(e, threads, st, lock, now, not em and (not have or imported), shas)
        lk = e.locked and (w or em or not keys.lock_current(e, threads, st, lock, now, not cache, shas))
        if lk or w or em:
            out.append(f"emit:{e.name}")
        if w or (lk and cache and derived):
            out.append(f"weights:{e.name}")   # (what cachelookup may name)
        if lk:
            out.append(f"lock:{e.name}")
            if cache and derived:
                out.append(f"cachelookup:{e.name}")
        return out, row

    def _hands(self, name):
        return self.handed is None or name in self.handed

    def say(self, ran=0):
        """A line for the run's end when doit was handed fewer tasks than the zoo has (`ran`: how
        many tasks ran, a dodo's own among them)."""
        if self.handed is None:
            return None
        if not self.handed:
            return ("nothing moved since the last run: every task is current\n" if not ran else
                    "every task of the zoo is current by its key (the dodo's own ran)\n")
        total = sum(1 + e.locked + bool(e.pc.derive and not e.pc.error) for e in self.entries) + 1
        return (f"{len(self.handed) + 1} of {total} tasks handed to doit: the others are current "
                "by their keys\n")

    # --- the tasks -----------------------------------------------------------------------------
    def weights_tasks(self):
        for e in self.entries:
            if e.pc.error or not e.pc.derive or not self._hands(f"weights:{e.name}"):
                continue
            d = e.pc.derive
            yield {
                "name": e.name,
                "doc": f"import {d.checkpoint} with import-{d.importer} into {e.pc.weights}",
                "actions": [(import_weights, [e.pc, f"{self.build}/tmp"])],
                **self._after(e, "weights"),
                "uptodate": [(keys.uptodate, ["weights", e])],
                "clean": [(files_io.remove_dir, [e.pc.weights]), (report_aside, [self.build])],
            }

    def emit_tasks(self):
        for e in self.entries:
            if not self._hands(f"emit:{e.name}"):
                continue
            yield {
                "name": e.name,
                "doc": f"emit {e.pc.source} to {e.bundle}/",
                "actions": [(emit_bundle, [e, self.settings])],
                **self._after(e, "emit"),
                "uptodate": [(keys.uptodate, ["emit", e])],
                "clean": [(files_io.remove_files, [[e.status] + e.bundle_files()]), (report_aside, [self.build])],
            }

    def lock_tasks(self):
        for e in self.entries:
            if not e.locked or not self._hands(f"lock:{e.name}"):
                continue
            deps = self._lock_deps(e)
            more = {"calc_dep": [f"cachelookup:{e.name}"]} if e.pc.derive and not e.pc.error \
                and self.settings["cache"] else {}
            after = self._after(e, "lock")
            yield {
                "name": e.name,
                "doc": f"lock {e.name} ({', '.join(c.dtype for c in e.checks)}, {e.pc.steps} step(s))",
                "actions": [(lock_program, [e, self.settings, self.db])],
                "task_dep": deps + after.pop("task_dep", []),
                **after,
                "uptodate": [(keys.uptodate, ["lock", e, self.settings["threads"], self.settings["cache"]])],
                # the history in results.sqlite stays: `logos results --prune` drops a program's
                "clean": [(files_io.remove_files, [[c.result for c in e.checks] + [e.lock_status]]),
                          (files_io.remove_dir, [f"{e.bundle}/golden"]), (report_aside, [self.build])],
                **more,
            }

    def _after(self, e, kind):
        """What a zoo task waits for: the dodo's own tasks that write what it reads (task_dep); or,
        where those cannot be told, the files themselves (file_dep: doit orders by them)."""
        if not self.ordered:
            waits = self.writers.of(self._inputs(e, kind))
            return {"task_dep": waits} if waits else {}
        if kind == "lock":
            there = self._claimable(e) if e.pc.weights and not e.pc.derive and os.path.isdir(e.pc.weights) else ()
            return {"file_dep": [f"{e.pc.weights}/{n}" for n in there]}
        files = [p for p in self._inputs(e, kind) if not os.path.isabs(p)   # (doit refuses a dep not there)
                 and (os.path.isfile(p) or self.writers.makes(p))]
        return {"file_dep": [p for p in files if p != e.pc.source or not (e.pc.error or keys.over_limit(e.pc))]}

    @staticmethod
    def _claimable(e):
        """The files of a weights folder its leaves may read (by name: the emit status's leaves,
        before an emit every file named as a leaf's could be): what doit orders the lock by. The
        others count in the key by name and size and are never read, by doit's checker neither,
        nor are those whose size alone refuses them (keys.weights_part)."""
        from .keys import plain, readable
        st = read_json(e.status) or {}
        return readable(e.pc, plain(e.pc.weights), st.get("status") == "ok" and st.get("leaves"))

    def cachelookup_tasks(self):
        if not self.settings["cache"]:
            return
        for e in self.entries:
            if e.pc.error or not e.pc.derive or not e.locked or not self._hands(f"lock:{e.name}"):
                continue
            yield {
                "name": e.name,
                "doc": f"look {e.name}'s verdicts up in {self.settings['cache']}",
                "actions": [(cache_lookup, [e, self.settings["threads"], self.settings["cache"]])],
                "task_dep": [f"emit:{e.name}"],
                "verbosity": 2,   # a bad entry is said here (once)
            }

    def report_task(self):
        """The report: after every task handed that it covers, except those `doit ignore` marks
        (a dependency doit ignores would have it ignore the report too: it covers every check
        all the same, each by its currency)."""
        return {
            "doc": f"report {len(self.entries)} programs into {self.build}/report.json, junit.xml, "
                   "summary.md, report.html",
            "actions": [(make_report, [self.entries, self.build, self.settings["threads"]])],
            # (and the dodo's own tasks that write programs/: one made there has an error row)
            "task_dep": self._last_of_each() + ([] if self.ordered else self.writers.of(["programs"])),
            "uptodate": [(report_current, [self.entries, self.build, self.settings["threads"],
                                           self.report_now, True])],
            "clean": [(clean_report, [self.build])],
        }

    def _last_of_each(self):
        """Each program's last task doit is handed and will not skip as ignored (doit skips a
        task after an ignored one, and the report after that): its lock, else its emit."""
        deps = []
        for e in self.entries:
            for n in ([f"lock:{e.name}"] if e.locked else []) + [f"emit:{e.name}"]:
                if self._hands(n) and not self._skipped(e, n):
                    deps.append(n)
                    break
        return deps

    def _lock_deps(self, e):
        """The zoo's tasks lock:NAME waits for: its emit, and its import where it is handed (with
        a cache, the lookup decides that, as a calc_dep)."""
        derived = e.pc.derive and not e.pc.error and not self.settings["cache"]
        return [f"emit:{e.name}"] + ([f"weights:{e.name}"] if derived and self._hands(f"weights:{e.name}") else [])

    def _skipped(self, e, name):
        """Whether doit skips the zoo task `name` of `e` as ignored: it or a task it waits for is."""
        kind = name.partition(":")[0]
        waits = () if self.ordered else self._after(e, kind).get("task_dep", ())   # the dodo's own
        return handing.ignored(name) or any(handing.ignored(n) for n in waits) \
            or any(self._skipped(e, n) for n in (self._lock_deps(e) if kind == "lock" else ()))

    def cache_task(self):
        """Always a task (the default tasks name it); with no cache=URL, one with nothing to do."""
        if not self.settings["cache"]:
            return {"actions": [], "uptodate": [True], "doc": "publish verdicts (cache=URL: none)"}
        return {
            "doc": f"publish the verdicts {self.settings['cache']} lacks",
            "actions": [(cache_publish, [[e for e in self.entries if e.locked and not e.pc.error],
                                              self.settings["threads"], self.settings["cache"]])],
            # after the locks, not the report: a report that fails (a check did) publishes all the same
            "task_dep": self._last_of_each(),
            "verbosity": 2,
        }
