"""One import as a command: `logos import-NAME …`, and `python -m emitter.importers NAME …`, which
the pipeline's weights task runs. This entry, the importers and what they import are the code an
import key names (emitter.pipeline.digests), so an edit of any code an import runs derives the
weights again; nothing else of the package runs in it."""

import argparse
import importlib
import json
import os
import sys

from . import IMPORTERS
from ..lifetime import die_with_parent
from ..language.errors import ProgramError


def parser(name, p=None):
    """The arguments of the importer `name` (on `p`, a subcommand's parser, when given)."""
    p = p or argparse.ArgumentParser(prog=f"logos import-{name}", description=IMPORTERS[name][1])
    importlib.import_module(IMPORTERS[name][0]).add_arguments(p)
    return p


def run(name, args):
    """The importer `name` on its parsed `args`: its exit status; a failure, one line naming the
    checkpoint (LOGOS_DEBUG=1 shows the traceback)."""
    die_with_parent()   # started by a run: it ends with that run
    try:
        return importlib.import_module(IMPORTERS[name][0]).main(args)
    except ProgramError as e:
        print(e, file=sys.stderr)
        return 1
    except OSError as e:   # a full disk, a file that went: one line, no traceback
        print(f"logos import-{name}: {e.filename + ': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"logos import-{name}: interrupted: nothing more was written", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("LOGOS_DEBUG"):
            raise
        # a checkpoint the importer does not understand (a damaged file, a config lacking a key)
        print(f"logos import-{name}: {getattr(args, 'checkpoint', '')}: cannot be imported: "
              f"{type(e).__name__}: {str(e)[:300]} (LOGOS_DEBUG=1 shows where)", file=sys.stderr)
        return 1


# a child that finds its modules where this process does: `python -m` would put its working folder
# first on its path, where a `safetensors/` folder there would run in place of the library the
# import key names (emitter.pipeline.digests: the key holds where this process finds it)
_SAME_PATH = "import json, runpy, sys; sys.path[:] = json.loads(sys.argv.pop(1)); " \
             "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"


def same_path(module, args):
    """`python -m module args…` in a child whose sys.path is this process's, in its order."""
    path = json.dumps([p or os.getcwd() for p in sys.path])
    return [sys.executable, "-c", _SAME_PATH, path, module, *args]


def command(name, checkpoint, program, out):
    """The command the pipeline's weights task runs to derive a program's weights: here, in the
    code an import key names, so how an import is asked for moves that key (and the verdicts
    computed on what it made) as any edit of an importer does; its libraries found where this
    process finds them, which the key names."""
    return same_path("emitter.importers", [name, "--program", program, "-o", out, "--", checkpoint])   # (a
    # checkpoint named `--help` or `-h.gguf` is a file, not an option)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in IMPORTERS:
        print(f"usage: python -m emitter.importers {{{','.join(IMPORTERS)}}} CHECKPOINT ...", file=sys.stderr)
        return 2
    return run(argv[0], parser(argv[0]).parse_args(argv[1:]))
