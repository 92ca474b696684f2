"""`logos doit [doit's own arguments]`: the zoo's doit tasks (`emitter.tasks`, the same creators a
dodo.py gets from `from emitter.tasks import *`) in the zoo this folder is in: the nearest folder
upward with programs/ (and weights/, programs/defaults.yaml when present) and no dodo.py of its
own; `build/` is made there. `logos doit list`, `-n 4`, `clean`, `info NAME` behave as doit's."""

import os
import sys


def main(argv, commands=()):
    """Run doit over the zoo with `argv`; `commands`: logos's own, named by the completion script."""
    from .pipeline.zoo_cli import BIN_NAME, enter_zoo, tabcompletion
    asks_help = argv[:1] in (["help"], ["--help"], ["-h"])
    if enter_zoo() is None and not asks_help:
        print(f"logos doit: no programs/ folder in {os.getcwd()} or any folder above it: a zoo is "
              "programs/NAME.logos (with weights/NAME/ and programs/NAME.yaml where needed)", file=sys.stderr)
        return 3   # as doit's own refusal where it finds no dodo.py
    if os.path.isfile("dodo.py"):
        print(f"logos doit: the zoo at {os.getcwd()} has a dodo.py of its own: run `doit` there (a dodo.py "
              "gets the zoo's tasks with `from emitter.tasks import *`)", file=sys.stderr)
        return 3
    from doit.cmd_base import NamespaceTaskLoader
    from doit.doit_cmd import DoitMain

    class ZooLoader(NamespaceTaskLoader):
        """doit's loader (TaskLoader2) over `emitter.tasks`, imported once doit has read its
        command-line variables (its DOIT_CONFIG depends on them)."""

        def setup(self, opt_values):
            from . import tasks
            self.namespace = {k: getattr(tasks, k) for k in tasks.__all__}

    class ZooMain(DoitMain):
        pass
    ZooMain.BIN_NAME = BIN_NAME      # doit's help and errors name `logos doit CMD`, as typed

    if argv[:1] == ["tabcompletion"]:
        return tabcompletion(ZooMain(ZooLoader()).run, argv, sorted(commands))
    return ZooMain(ZooLoader()).run(argv)
