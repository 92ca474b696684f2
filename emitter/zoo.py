"""`logos doit [doit's own arguments]`: the zoo's doit tasks (`emitter.tasks`) in the current folder,
a folder with programs/ (and weights/, programs/defaults.yaml when present) and no dodo.py of its
own; `build/` is made there. `logos doit list`, `-n 4`, `clean`, `info NAME` behave as doit's."""

import os
import sys

ARGV = None   # doit's arguments when `logos doit` runs the tasks (emitter.tasks reads them at import)


def main(argv):
    if os.path.isfile("dodo.py"):
        print("logos doit: this folder has a dodo.py of its own: run `doit` (a dodo.py gets the zoo's "
              "tasks with `from emitter.tasks import *`)", file=sys.stderr)
        return 2
    if not os.path.isdir("programs"):
        print(f"logos doit: no programs/ folder in {os.getcwd()}: a zoo is programs/NAME.logos "
              "(with weights/NAME/ and programs/NAME.yaml where needed)", file=sys.stderr)
        return 2
    global ARGV
    ARGV = list(argv)
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain
    from . import tasks
    return DoitMain(ModuleTaskLoader(tasks)).run(argv)
