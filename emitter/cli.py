"""`python -m emitter …`: emit a bundle, run the VM, lock a bundle, read results, import weights.

Each subcommand lives in the module that owns its work; a module is imported only when its
subcommand runs, so `emit` and `run` never import torch.
"""

import argparse
import importlib
import json
import sys

from .importers import IMPORTERS
from .language.errors import ProgramError

# subcommand -> (module, help). Each module has `add_arguments(parser)` and `main(args) -> int`.
COMMANDS = {
    "emit": ("emitter.cli", "write a program's bundle (model.py, manifest.json, compile.py)"),
    "run": ("emitter.cli", "run a program on the VM and write its output as raw float64"),
    "lock": ("emitter.verify.lock", "check a bundle's module against the VM, op by op and step by step"),
    "results": ("emitter.pipeline.results", "the latest lock verdict per program, or one program's history"),
    **{f"import-{name}": entry for name, entry in IMPORTERS.items()},
}


def add_emit_arguments(p):
    p.add_argument("program", help="PROGRAM.logos")
    p.add_argument("-o", "--out", required=True, help="bundle directory")


def emit_main(args):
    from .language.reader import read_file
    from .sambaflow.emit import emit_program, write_bundle
    write_bundle(emit_program(read_file(args.program)), args.out)
    return 0


def add_run_arguments(p):
    p.add_argument("program", help="PROGRAM.logos")
    p.add_argument("--weights", help="directory of <var>.f64 / <var>.f32 files")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--out", required=True, help="the output as raw little-endian float64")


def run_main(args):
    from .files import write_atomic
    from .language.reader import read_file
    from .verify import vm
    program = read_file(args.program)
    leaves = vm.load_leaves(program, args.weights)
    for f in leaves.unmatched:
        print(f"{args.weights}: `{f}` matches no leaf of the program (ignored)", file=sys.stderr)
    trace = vm.run(program, leaves.values, args.steps)[-1]
    write_atomic(args.out, trace.output.astype("<f8").tobytes())
    print(json.dumps({**vm.output_summary(program, trace.output), "steps": args.steps}))
    return 0


_LOCAL = {"emit": (add_emit_arguments, emit_main), "run": (add_run_arguments, run_main)}


def _command(name):
    if name in _LOCAL:
        return _LOCAL[name]
    module = importlib.import_module(COMMANDS[name][0])
    return module.add_arguments, module.main


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m emitter", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == chosen:
            _command(name)[0](p)
    args = ap.parse_args(argv)
    try:
        return _command(args.command)[1](args)
    except ProgramError as e:
        print(e, file=sys.stderr)
        return 1
