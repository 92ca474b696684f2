"""doit's dependency DB when it cannot be written (a full disk, an I/O error): one line, not
doit's traceback at the end of a run that did its work, and the DB removed, since what it holds
is no longer this run's (a failed task's earlier success, which doit could not delete, would
make that task current next time). The next run starts a new DB: the zoo's tasks are found
current by their keys (`pipeline.keys`) and redo nothing; a dodo's own tasks run again."""

import contextlib
import os
import sqlite3
import sys

from .guards import SQLITE_COMPANIONS

UNWRITTEN = []   # the error of this process's failed DB write, if one failed: the run exits 3


def said_when_unwritable(dep):
    """Wrap the writes of `dep` (doit's Dependency, `doit.Globals.dep_manager`: the public handle
    on it once doit opened the DB): a failed write is one line on stderr and the DB file removed;
    no later write is tried. The run still writes its report and says its last line, then exits
    3 (progress.complete_run)."""

    def guarded(write):
        def call(*args, **kwargs):
            if UNWRITTEN:
                return None
            try:
                return write(*args, **kwargs)
            except (sqlite3.OperationalError, OSError) as e:
                UNWRITTEN.append(e)
                for suffix in ("",) + SQLITE_COMPANIONS:   # (a journal left would roll into the next)
                    with contextlib.suppress(OSError):
                        os.unlink(dep.name + suffix)
                sys.stderr.write(f"doit: {dep.name} could not be written ({e}): removed, so the next "
                                 "run checks every task again (the zoo's find what is current by "
                                 "their keys)\n")
        return call

    dep.close, dep.remove, dep.remove_all = (guarded(dep.close), guarded(dep.remove),
                                             guarded(dep.remove_all))
