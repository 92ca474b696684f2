"""A doit reporter that, on a run longer than a few seconds (or of many tasks), replaces the
task-name stream with one live progress line: done/total, failures so far and an ETA. Short runs
keep doit's usual `.  task` / `-- task` lines.

`LOGOS_PROGRESS=line|names|auto` (default auto: the line once a run has taken LINE_AFTER seconds
or holds over PROGRESS_THRESHOLD tasks). On a terminal the line is tqdm's, rewritten in place;
elsewhere (CI logs) it is printed every 10% or 15 s; either way one final line. The ETA weighs the
work left by what each kind of task (emit, lock, …) has cost so far and how many of its kind were
up to date, so a no-op's thousand skips do not make a lock look instant.
"""

import os
import sys
import time

from doit.reporter import ConsoleReporter

from . import guards
from .handing import counted, reachable
from .log import LOG
from .report_aside import ZOO_REPORTER

PROGRESS_THRESHOLD = 40
LINE_AFTER = 3.0


class Work:
    """Per kind of task (the part before `:`): how many there are, were checked, ran, and the
    seconds the ones that ran took."""

    def __init__(self, names):
        self.kinds = {}
        for n in names:
            self._kind(n)["total"] += 1
        self.started = {}

    def _kind(self, name):
        return self.kinds.setdefault(name.split(":")[0], {"total": 0, "checked": 0, "ran": 0, "s": 0.0})

    def start(self, name, now):
        self.started[name] = now

    def finish(self, name, now):
        k = self._kind(name)
        k["checked"] += 1
        if name in self.started:
            k["ran"] += 1
            k["s"] += now - self.started.pop(name)

    def eta(self, elapsed):
        """Seconds left: the work left, in the seconds its kinds have cost per task, scaled by
        the wall time the work done took (so parallel workers count)."""
        done = sum(k["s"] for k in self.kinds.values())
        if done <= 0:
            return None
        ran = sum(k["ran"] for k in self.kinds.values())
        mean_s = done / ran
        left = 0.0
        for k in self.kinds.values():
            remaining = k["total"] - k["checked"]
            share = k["ran"] / k["checked"] if k["checked"] else 1.0
            cost = k["s"] / k["ran"] if k["ran"] else mean_s
            left += remaining * share * cost
        return elapsed * left / done


def _unmet(message):
    """Whether a failed task's message (`_message`) is doit's: it could not run after one it waits for."""
    return bool(message) and message.startswith("UnmetDependency")


def _message(fail):
    """A failure as one line: its kind and the last line of its message (a traceback's error)."""
    lines = [x.strip() for x in str(fail.get_msg()).splitlines() if x.strip()]
    return f"{type(fail).__name__}: {lines[-1] if lines else ''}"


class ProgressReporter(ConsoleReporter):
    desc = "task names on short runs, one progress line (done/total, failures, ETA) on long ones"

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        ZOO_REPORTER.append(True)   # (it settles the report at the run's end)
        self.mode = os.environ.get("LOGOS_PROGRESS", "auto")
        if self.mode not in ("line", "names", "auto"):
            LOG.warning(f"LOGOS_PROGRESS={self.mode[:40]!r} is none of line, names, auto: auto")
            self.mode = "auto"
        self.line = False
        self.total = self.done = self.ran = self.failed = 0
        self.start = time.monotonic()
        self.last_print = 0.0
        self.last_frac = -1
        self.last_counts = None
        self.tty = hasattr(outstream, "isatty") and outstream.isatty()
        self.tasks, self.reachable, self.failed_tasks, self.known = {}, [], {}, set()
        self.reported = False   # the report written here (`_report_failures`)
        self.unwritten = False  # the report could not be written (its task raised, or here)
        self.verdicts_failed = set()   # lock tasks whose recorded checks did not all pass
        self.work, self.bar = Work([]), None
        self.settled = []   # tasks found up to date or run with success
        self.uptodate, self.executed = [], False
        self.ignored = []   # `doit ignore`d, or skipped as following one that was

    def initialize(self, tasks, selected_tasks):
        self.tasks = tasks
        self.reachable = reachable(tasks, selected_tasks)
        self.known = set(self.reachable)
        self.total = len(self.reachable)
        self.work = Work(self.reachable)
        guards.RUNNING[:] = [lambda: sorted(self.work.started)]   # (named where a worker dies)
        self.line = self.mode == "line" or (self.mode == "auto" and self.total > PROGRESS_THRESHOLD)
        from .handing import ignored, waited_on
        from .report_aside import hold, reads_report
        from .run import current
        if current() is not None:   # a lock whose checks fail fails the run itself when no report
            s = current().settings  # will; a refused emit when neither its lock nor the report will
            s["report_follows"] = "report" in self.reachable and not ignored("report")
            s["locks_follow"] = {n[5:] for n in self.reachable if n.startswith("lock:") and not ignored(n)}
            s["waited_on"] = waited_on(tasks, reachable(tasks, selected_tasks, groups=True))
            if "report" not in s["waited_on"] and not reads_report(tasks, self.reachable, current().build):
                hold()   # (where one waits for it, or names a file of it, it reads it in build/)
        self.start = time.monotonic()

    def _maybe_line(self):
        """In auto mode, a run that has taken a few seconds gets the line from then on."""
        if not self.line and self.mode == "auto" and time.monotonic() - self.start > LINE_AFTER:
            self.line = True

    def _tick(self, final=False):
        self._maybe_line()
        if not self.line:
            return
        now = time.monotonic()
        elapsed = now - self.start
        eta = 0.0 if final else self.work.eta(elapsed)
        eta_text = "?" if eta is None else f"{eta:.0f}s"
        if self.tty:
            self._bar(final, f"ran {self.ran}, failures {self.failed}, ETA {eta_text}")
            return
        frac = int(10 * self.done / self.total) if self.total else 10
        if not (final or frac != self.last_frac or now - self.last_print > 15):
            return
        counts = (self.done, self.total, self.ran, self.failed)
        if not (final and counts == self.last_counts):   # the last task's line, not twice
            self.write(f"[{self.done}/{self.total}] ran {self.ran}, failures {self.failed}, "
                       f"elapsed {elapsed:.0f}s, ETA {eta_text}\n")
        self.last_frac, self.last_print, self.last_counts = frac, now, counts

    def _bar(self, final, postfix):
        """tqdm's line on a terminal, rewritten in place."""
        if self.bar is None:
            from tqdm import tqdm
            self.bar = tqdm(total=self.total, file=self.outstream, dynamic_ncols=True, mininterval=0.1,
                            bar_format="{n_fmt}/{total_fmt} |{bar}| {elapsed} {postfix}")
        self.bar.n = self.done
        self.bar.set_postfix_str(postfix, refresh=False)
        self.bar.refresh()
        if final:
            self.bar.close()

    def _seen(self, task):
        """A task doit reached that the selection did not show (one a calc_dep added): counted
        from now on, so done never passes total."""
        if counted(task) and task.name not in self.known:
            self.known.add(task.name)
            self.total += 1
            self.work.kinds.setdefault(task.name.split(":")[0], {"total": 0, "checked": 0, "ran": 0,
                                                                 "s": 0.0})["total"] += 1

    def execute_task(self, task):
        self._seen(task)
        self.executed = True   # (any task, a hidden one too: it may have moved a file)
        if counted(task):
            self.work.start(task.name, time.monotonic())
            self.ran += 1
        self._maybe_line()
        if not self.line:
            return super().execute_task(task)

    def add_success(self, task):
        self._seen(task)
        self.settled.append(task.name)
        if counted(task):
            self.done += 1
            self.work.finish(task.name, time.monotonic())
        self._tick()

    def add_failure(self, task, fail):
        """One line per failure (doit's block of captured output only where there is some): a
        lock whose checks did not pass has said why on its own lines already."""
        from .lock_task import ChecksFailed
        from doit.exceptions import TaskError, UnmetDependency
        self._seen(task)
        if task.name == "report" and isinstance(fail, TaskError) and not isinstance(fail, UnmetDependency):
            self.unwritten = True   # (it raised; a TaskFailed is a report written that fails the run)
        if counted(task):   # a group (`lock`) fails with its sub-tasks: they say why
            self.done += 1
            self.failed += 1
            self.work.finish(task.name, time.monotonic())
            if isinstance(fail, ChecksFailed):
                self.verdicts_failed.add(task.name)
            else:
                self.failed_tasks[task.name] = _message(fail)
        if self.line and self.tty and self.bar is not None:
            self.bar.clear()
        if counted(task) and not isinstance(fail, (ChecksFailed, UnmetDependency)) and fail.report:
            self.write(f"FAILED {task.name}: {_message(fail)}\n")
            if any((a.out or "").strip() for a in task.actions):   # (doit's block shows it)
                self.failures.append({"task": task, "exception": fail})
        self._tick()

    def skip_uptodate(self, task):
        self._seen(task)
        self.settled.append(task.name)
        self.uptodate.append(task.name)
        if counted(task):
            self.done += 1
            self.work.finish(task.name, time.monotonic())
        if not self.line:
            return super().skip_uptodate(task)
        self._tick()

    def skip_ignore(self, task):
        from .handing import ZOO_TASKS, ignored, ignored_line
        self._seen(task)
        self.ignored.append(task.name)
        if task.name.partition(":")[0] in ZOO_TASKS and ignored(task.name):   # (doit keeps it)
            guards.say_once(ignored_line(task.name), LOG.warning)
        self.done += 1
        if not self.line:
            return super().skip_ignore(task)
        self._tick()

    def complete_run(self):
        ended = sys.exc_info()[0] is None   # (not an interrupt or a crash on its way out)
        self._tick(final=True)
        if ended:
            self._report_failures()
        self._publish_named()
        from .run import current
        if "report" not in self.reachable and current() is not None:
            # a run that names its tasks: the last report, set aside as the run began, comes back
            # where it is still about every check as it is now (else it stays aside, not current)
            from .actions import report_current
            from .keys import made_current
            run = current()
            if all(made_current(e) for e in run.entries):   # (what the report key takes from records)
                report_current(run.entries, run.build, run.settings["threads"])
        own = self.ran - ("cache" in self.settled and "cache" not in self.uptodate)   # (the zoo's cache
        note = current().say(own) if current() is not None and "report" in self.uptodate else None   # task ran)
        if note:
            LOG.info(note.rstrip("\n"))
        moved = ended and self.executed and "report" in self.settled and self._moved_after_report()
        if current() is not None:   # the report this run wrote or found current, into place
            from .report_aside import settle
            settle(current().build, ended)
        super().complete_run()
        summary = self._summary() if ended or "report" not in self.reachable else None
        if summary:
            self.write(summary + "\n")
        from .doit_db import UNWRITTEN
        if UNWRITTEN:   # doit's DB could not be written (said): a full disk fails the run
            raise SystemExit(3)
        if moved:
            raise SystemExit(1)
        stale = self._unsettled() if ended and "report" not in self.reachable and not self.failed_tasks else []
        if stale:   # (a run that names its tasks: those it covers and did not settle count)
            LOG.error(f"{', '.join(stale)}: not run (`doit ignore`, or `-s`, which runs the first task named "
                      "alone) and not current: not passing")
            raise SystemExit(1)

    def _moved_after_report(self):
        from .actions import report_again
        from .run import current
        return current() is not None and report_again(current().entries, current().build, current().settings["threads"])

    def _unsettled(self):
        """The zoo's tasks of the run's selection that neither ran nor were found up to date (`doit
        ignore` skipped them, or doit left them out: `doit -s A B` runs A alone) and are not current
        (a lock: its key's entry not there and passing): a run that names them exits 1, as the report would."""
        from .handing import ZOO_TASKS, doit_args, selection
        from .keys import uptodate
        from .run import current
        run, settled = current(), set(self.settled) | self.verdicts_failed   # (ran: its checks said why)
        by = {e.name: e for e in run.entries} if run is not None else {}
        named = [n for n in selection(doit_args()) or () if n in self.tasks and n not in self.reachable]
        return [n for n in [*self.reachable, *named] if n not in settled for kind, _, name in (n.partition(":"),)
                if kind in ZOO_TASKS - {"cachelookup"} and name in by
                and not uptodate(kind, by[name], run.settings["threads"], run.settings["cache"])]

    def _publish_named(self):
        """With cache=URL, a run that names its tasks (`doit lock:NAME cache=URL`) leaves out the
        `cache` task, which publishes for the whole zoo: the verdicts of the locks this run ran
        or found up to date are published here instead, so every run that holds the key shares
        what it settled. Best effort, like the task: the verdicts stand whatever the cache does."""
        task = self.tasks.get("cache")
        unmet = "cache" in self.reachable and _unmet(self.failed_tasks.get("cache"))   # (a lock failed)
        if task is None or ("cache" in self.reachable and not unmet) or not task.actions:
            return
        done = {n[len("lock:"):] for n in self.settled if n.startswith("lock:")}
        try:
            entries, threads, url = task.actions[0].args
            mine = entries if unmet else [e for e in entries if e.name in done]
            if mine:
                from .publish import publish_all
                publish_all(mine, threads, url)
        except Exception as e:
            LOG.warning(f"cache: not published: {type(e).__name__}: {str(e)[:200]}")

    def _report_failures(self):
        """A task that failed (or could not run because one before it failed), or one that doit
        ignores, keeps the report task from running: write the report here, with failed tasks'
        programs as errors that say why and every other check as current or not, so the report is
        always this run's and never an earlier run's green."""
        failed = self.failed_tasks
        ignored = "report" in self.ignored
        if "report" not in self.reachable or not (failed or ignored or self.verdicts_failed) or (
                set(failed) == {"report"} and not _unmet(failed["report"])):
            return
        # (the cache, held back by a lock that failed, publishes at the run's end all the same)
        failed = {k: v for k, v in failed.items() if k != "report" and not (k == "cache" and _unmet(v))}
        from .report import make_report
        action = self.tasks["report"].actions[0]
        entries, build_dir, threads = action.args[:3]
        try:
            make_report(entries, build_dir, threads, failed)
        except OSError as e:   # a full disk: one line; the last complete report stays aside
            LOG.error(f"report: could not be written: {e}")
            self.unwritten = True
            return
        self.reported = True
        after = sum(1 for m in failed.values() if _unmet(m))
        why = [" and ".join(([f"{len(failed) - after} failed task(s)"] if len(failed) > after else []) +
                            ([f"{after} that could not run after one that failed"] if after else [])) +
               " as errors"] if failed else []
        why += ["the checks that did not pass"] if self.verdicts_failed else []
        why += ["ignored tasks' checks as current or not"] if ignored else []
        LOG.info(f"report: written with {' and '.join(why)} (see {build_dir}/summary.md)")

    def _summary(self):
        """The run's last line: its checks' verdicts and where the report is, e.g. `24 checks:
        23 pass, 1 fail (smollm2 float32) · build/report.html`. The report's rows when the run
        covers the report, else the recorded verdicts of the locks it ran or found current."""
        from ..files import read_json
        from .run import current
        run = current()
        if run is None:
            return None
        rows, bad = None, []
        github = os.environ.get("GITHUB_ACTIONS") == "true"
        if "report" in self.reachable:
            if not (self.reported or "report" in self.settled or "report" in self.failed_tasks):
                return None   # (an interrupted run: no report of this run to sum up)
            if self.unwritten:
                return (f"no report of this run (it could not be written): {run.build}/stale/ keeps "
                        "the last complete run's, which is not current; `logos results` says each "
                        "check's verdict and whether it is current")
            rows = [tuple(v) for v in (read_json(f"{run.build}/status/report.json") or {}).get("verdicts") or ()
                    if isinstance(v, list) and len(v) == 3]
            bad = ((read_json(f"{run.build}/report.json") or {}).get("failures") or []) if github else []
        else:
            names = {n[len("lock:"):] for n in self.settled + sorted(self.verdicts_failed)
                     if n.startswith("lock:")}
            rows = [(e.name, dt, (r or {}).get("verdict", "error"))
                    for e in run.entries if e.name in names
                    for dt, r in (((read_json(e.lock_status) or {}).get("checks")) or {}).items()]
            results = {(e.name, c.dtype): c.result for e in run.entries if e.name in names for c in e.checks}
            bad = [dict(read_json(results.get((n, dt), "")) or {}, name=n, check=dt, verdict=v)
                   for n, dt, v in rows if v != "pass"]
        if not rows:
            return None
        if github:
            self._annotate(bad, run)
        counts = {}
        for name, check, verdict in rows:
            counts.setdefault(verdict, []).append(f"{name} {check}")
        parts = []
        for v in ("pass", "fail", "error"):
            if v in counts:
                shown = counts[v][:5] + ([f"{len(counts[v]) - 5} more"] if len(counts[v]) > 5 else [])
                parts.append(f"{len(counts[v])} {v}" + ("" if v == "pass" else f" ({', '.join(shown)})"))
        where = f" · {run.build}/report.html" if "report" in self.reachable else \
            f" · {run.build}/results/ (`logos results`)"
        tasks = sum(1 for _, check, _ in rows if check == "task")   # a dodo's own that failed
        head = f"{len(rows) - tasks} check{'s' if len(rows) - tasks != 1 else ''}" + \
            (f" and {tasks} failed task{'s' if tasks != 1 else ''}" if tasks else "")
        return f"{head}: {', '.join(parts)}{where}"

    def _annotate(self, bad, run):
        """Under GitHub Actions: each check that did not pass as an `::error` annotation at the
        program's line where one is known, a config's refusal at its YAML line (the workflow's
        run page lists them by file)."""
        from ..verify.verdict import describe
        from .lint import annotation
        from .report import junit_place
        sources = {e.name: e.pc.source for e in run.entries}
        for r in bad:
            r.setdefault("source", sources.get(r.get("name")))
            self.write(annotation(*junit_place(r), f"{r.get('name')} {r.get('check')} "
                                  f"{str(r.get('verdict')).upper()}: {describe(r, 300)}") + "\n")
