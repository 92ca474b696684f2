"""A doit reporter that, on long runs, replaces the task-name stream with one progress line:
done/total, failures so far, ETA. Short runs keep doit's usual `.  task` / `-- task` lines.

`LOGOS_PROGRESS=line|names|auto` (default auto: the line above PROGRESS_THRESHOLD tasks). On a
terminal the line is rewritten in place (at most ten times a second); elsewhere (CI logs) it is
printed every 10% or 15 s.
"""

import os
import time

from doit.reporter import ConsoleReporter

PROGRESS_THRESHOLD = 40


def _counted(task):
    """A task the line counts: not a group (`emit`, whose sub-tasks are the work) nor hidden.
    (`task.actions` would say the same but builds every task's action objects to say it.)"""
    return not task.has_subtask and not task.name.startswith("_")


def _message(fail):
    """A failure as one line: its kind and the last line of its message (a traceback's error)."""
    lines = [x.strip() for x in str(fail.get_msg()).splitlines() if x.strip()]
    return f"{type(fail).__name__}: {lines[-1] if lines else ''}"


def _reachable(tasks, selected):
    seen, todo = set(), list(selected)
    while todo:
        n = todo.pop()
        if n in seen or n not in tasks:
            continue
        seen.add(n)
        t = tasks[n]
        todo.extend(t.task_dep)
        todo.extend(t.setup_tasks)
    return [n for n in seen if _counted(tasks[n])]


class ProgressReporter(ConsoleReporter):
    desc = "task names on short runs, one progress line (done/total, failures, ETA) on long ones"

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.mode = os.environ.get("LOGOS_PROGRESS", "auto")
        self.line = False
        self.total = self.done = self.ran = self.failed = 0
        self.start = time.monotonic()
        self.last_print = 0.0
        self.last_frac = -1
        self.last_counts = None
        self.tty = hasattr(outstream, "isatty") and outstream.isatty()
        self.tasks, self.reachable, self.failed_tasks = {}, [], {}

    def initialize(self, tasks, selected_tasks):
        self.tasks = tasks
        self.reachable = _reachable(tasks, selected_tasks)
        self.total = len(self.reachable)
        self.line = self.mode == "line" or (self.mode == "auto" and self.total > PROGRESS_THRESHOLD)
        self.start = time.monotonic()

    def _tick(self, final=False):
        if not self.line:
            return
        now = time.monotonic()
        frac = int(10 * self.done / self.total) if self.total else 10
        if self.tty:   # rewritten in place, ten times a second at most
            due = final or now - self.last_print >= 0.1
        else:
            due = final or frac != self.last_frac or now - self.last_print > 15
        if not due:
            return
        elapsed = now - self.start
        left = max(self.total - self.done, 0)
        # tasks still to check cost about what the finished ones did on average
        eta = elapsed / self.done * left if self.done else 0.0
        counts = (self.done, self.total, self.ran, self.failed)
        text = (f"[{self.done}/{self.total}] ran {self.ran}, failures {self.failed}, "
                f"elapsed {elapsed:.0f}s, ETA {eta:.0f}s")
        if self.tty:
            self.write("\r" + text.ljust(79) + ("\n" if final else ""))
            self.outstream.flush()
        elif not (final and counts == self.last_counts):   # the last task's line, not twice
            self.write(text + "\n")
        self.last_frac, self.last_print, self.last_counts = frac, now, counts

    def execute_task(self, task):
        if not self.line:
            return super().execute_task(task)
        if _counted(task):
            self.ran += 1

    def add_success(self, task):
        if _counted(task):
            self.done += 1
        self._tick()

    def add_failure(self, task, fail):
        if _counted(task):   # a group (`lock`) fails with its sub-tasks: they say why
            self.failed_tasks[task.name] = _message(fail)
            self.done += 1
            self.failed += 1
        if self.line and self.tty:
            self.write("\n")
        super().add_failure(task, fail)
        self._tick()

    def skip_uptodate(self, task):
        if _counted(task):
            self.done += 1
        if not self.line:
            return super().skip_uptodate(task)
        self._tick()

    def skip_ignore(self, task):
        self.done += 1
        if not self.line:
            return super().skip_ignore(task)
        self._tick()

    def complete_run(self):
        self._tick(final=True)
        self._report_failures()
        super().complete_run()

    def _report_failures(self):
        """A task that failed (or could not run because one before it failed) keeps the report
        task from running: write the report here, with those tasks' programs as errors that say
        why, so the report is always this run's and never an earlier run's green."""
        failed = self.failed_tasks
        if "report" not in self.reachable or not failed or \
                (set(failed) == {"report"} and not failed["report"].startswith("UnmetDependency")):
            return
        from .actions import make_report
        action = self.tasks["report"].actions[0]
        entries, build_dir = action.args[:2]
        make_report(entries, build_dir, failed)
        self.write(f"report: written with {len(failed) - ('report' in failed)} "
                   f"failed task(s) as errors (see {build_dir}/summary.md)\n")
