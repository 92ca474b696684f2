"""`doit dumpdb` for the zoo's dependency DB: doit's own command opens the file with `dbm`, which
cannot read the sqlite3 DB the zoo's tasks keep (build/.doit.db), and ends in a traceback. This
command (a doit plugin, `doit.COMMAND` entry point of the package) dumps a sqlite3 DB in doit's
format, one `task -> values` per task, and leaves every other DB to doit's command."""

import json
import os
import pprint
import sqlite3
from dbm import whichdb

from doit.cmd_dumpdb import DumpDB as DoitDumpDB
from doit.exceptions import InvalidCommand

SQLITE_MAGIC = b"SQLite format 3\0"
ZOO_DB = ("build/.doit.db", ".doit.db")   # the zoo's DB, and doit's default path


class DumpDB(DoitDumpDB):
    """dump dependency DB (dbm, or the sqlite3 one the zoo's tasks use)"""

    def execute(self, opt_values, pos_args):
        path = opt_values["dep_file"]
        if path == ZOO_DB[1] and not os.path.exists(path) and os.path.exists(ZOO_DB[0]):
            path = opt_values["dep_file"] = ZOO_DB[0]   # (dumpdb reads no dodo, nor its dep_file)
        try:
            with open(path, "rb") as f:
                magic = f.read(len(SQLITE_MAGIC))
        except OSError as e:
            if whichdb(path):   # another dbm's files beside the name (dbm.dumb's .dat, .dir)
                return super().execute(opt_values, pos_args)
            raise InvalidCommand(f"dumpdb: {path}: cannot be read ({e.strerror}); no run has "
                                 "made it yet?") from None
        if magic != SQLITE_MAGIC:
            return super().execute(opt_values, pos_args)
        print("DB type is 'sqlite3'")
        try:
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                rows = con.execute("select task_id, task_data from doit order by task_id").fetchall()
            finally:
                con.close()
        except sqlite3.DatabaseError as e:
            raise InvalidCommand(f"dumpdb: {path}: not a doit DB sqlite3 can read ({e})") from None
        for task, data in rows:
            try:
                value = json.loads(data)
            except (TypeError, ValueError):
                value = data
            print(f"{task} -> {pprint.pformat(value, indent=4, width=100)}")
