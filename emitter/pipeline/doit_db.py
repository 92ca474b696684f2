"""doit's dependency DB when it cannot be written (a full disk, an I/O error): one line, not
doit's traceback at the end of a run that did its work. Nothing is lost that a verdict stands on:
each task is current by its key (`pipeline.keys`), so a run after one whose DB write failed finds
what is done by its key and redoes nothing else."""

import sqlite3
import sys


UNWRITTEN = []   # the error of this process's failed DB write, if one failed: the run exits 3


def said_when_unwritable(dep):
    """Wrap the writes of `dep` (doit's Dependency, `doit.Globals.dep_manager`: the public handle
    on it once doit opened the DB) so that a failed write is one line on stderr, said once; the
    run still writes its report and says its last line, then exits 3 (progress.complete_run)."""

    def guarded(write):
        def call(*args, **kwargs):
            try:
                return write(*args, **kwargs)
            except (sqlite3.OperationalError, OSError) as e:
                if not UNWRITTEN:
                    UNWRITTEN.append(e)
                    sys.stderr.write(f"doit: {dep.name} could not be written ({e}): doit's record of "
                                     "this run is lost; the next run finds what is current by its key\n")
        return call

    dep.close, dep.remove, dep.remove_all = (guarded(dep.close), guarded(dep.remove),
                                             guarded(dep.remove_all))
