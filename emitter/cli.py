"""`logos …` (or `python -m emitter …`): emit a bundle, run the VM, lock a bundle, read results,
import weights, run the zoo's doit tasks.

Each subcommand lives in the module that owns its work; a module is imported only when its
subcommand runs, so `emit` and `run` never import torch.
"""

import argparse
import importlib
import os
import sys

from .importers import IMPORTERS
from .language.errors import ProgramError

# subcommand -> (module, help). Each module has `add_arguments(parser)` and `main(args) -> int`.
COMMANDS = {
    "emit": ("emitter.cli", "write a program's bundle (model.py, manifest.json, compile.py)"),
    "run": ("emitter.cli", "run a program on the VM and write its output as raw float64"),
    "lock": ("emitter.verify.lock_cli", "check a bundle's module against the VM, op by op and step by step"),
    "check": ("emitter.pipeline.lint", "read and check programs and configs (no emit, no torch): "
                                       "every error of every file, exit 1 on any"),
    "results": ("emitter.pipeline.results_cli", "the latest lock verdict per program, or one program's history"),
    **{f"import-{name}": entry for name, entry in IMPORTERS.items()},
    "doit": ("emitter.zoo", "the zoo's doit tasks in this folder: `logos doit [doit's arguments]`"),
}


def add_emit_arguments(p):
    p.add_argument("program", help="PROGRAM.logos")
    p.add_argument("-o", "--out", required=True, help="bundle directory")
    p.add_argument("--bfloat16", action="store_true",
                   help="with the precision policy a bfloat16 module follows (its PRECISION table; the "
                        "default policy, or --precision's): what `logos lock --dtype bfloat16` needs")
    p.add_argument("--precision", action="append", default=[], metavar="OP=COMPUTE,OUTPUT",
                   help="with --bfloat16: the program's policy, as its config's `precision:` (repeatable; "
                        "e.g. sigmoid=fp32,fp32)")


def emit_main(args):
    from .language.reader import read_file
    from .ops.precision import parse_policy
    from .sambaflow.emit import emit_program, write_bundle
    if args.precision and not args.bfloat16:
        print("--precision is a bfloat16 policy: give --bfloat16 with it", file=sys.stderr)
        return 2
    try:
        policy = parse_policy(args.precision) if args.bfloat16 else None
    except ValueError as e:
        print(f"--precision: {e}", file=sys.stderr)
        return 2
    write_bundle(emit_program(read_file(args.program), policy), args.out)
    return 0


def _positive(text):
    """A whole number of at least 1 (argparse's type; `abc` is said so, not `invalid _positive`)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return n


def add_run_arguments(p):
    p.add_argument("program", help="PROGRAM.logos")
    p.add_argument("--weights", help="directory of the leaves' files: <var>.f64 / .f32 / .npy, or "
                   ".safetensors files of tensors named by variable")
    p.add_argument("--steps", type=_positive, default=1,
                   help="steps to run, each from the states the last one wrote (default 1)")
    p.add_argument("--out", required=True, help="the output as raw little-endian float64")
    p.add_argument("--stage", action="append", default=[], metavar="NAME=PATH",
                   help="also write the stage NAME's value at the last step to PATH, as raw "
                        "little-endian float64 (repeatable)")
    p.add_argument("--state-out", metavar="DIR",
                   help="write a weights directory: every leaf read from --weights, and every state "
                        "as it stands after the last step (<name>.f64), so that `run --weights DIR` "
                        "resumes from there")


def _stage_requests(program, requests):
    """[(stage index, path)] for `--stage NAME=PATH`s, or a message naming what is wrong."""
    named = {st.out: st.index for st in program.stages if st.binds}
    out = []
    for request in requests:
        name, eq, path = request.partition("=")
        if not eq or not path:
            return None, f"--stage `{request}`: expected NAME=PATH"
        if name not in named:
            from .language.hints import did_you_mean
            return None, (f"--stage `{request}`: {program.path} has no stage `{name}` (a stage is "
                          "the name an op's `Let` binds)" + did_you_mean(name, named))
        out.append((named[name], path))
    return out, None


def _write_state_dir(program, leaves, states, directory, weights):
    """Every state after the last step as .f64 and, unless `directory` is the --weights directory
    itself, every leaf that came from a file, as held (a .f32 leaf stays .f32): a weights
    directory that a later run resumes from."""
    import numpy as np
    from .importers.leaves import write_leaf
    in_place = weights is not None and os.path.isdir(directory) and os.path.samefile(directory, weights)
    shared = [s for s in states if in_place and leaves.sources[s].endswith(".safetensors")]
    if shared:   # one tensor of a .safetensors file cannot be replaced, and a .f64 beside it clashes
        raise ProgramError(f"the state `{shared[0]}` is a tensor of `{leaves.sources[shared[0]]}`, "
                           "which --state-out cannot rewrite in place: give --state-out another "
                           "folder", path=directory)
    os.makedirs(directory, exist_ok=True)   # (a program with no state and no file: a folder of none)
    for name in program.leaves:
        if name in states:
            write_leaf(directory, name, states[name], "<f8")
        elif leaves.sources[name] != "declared" and not in_place:
            value = leaves.values[name]
            write_leaf(directory, name, value, "<f4" if value.dtype == np.float32 else "<f8")


def _out_of_memory(path, program):
    from .files import size_text
    print(f"{path}: could not run: out of memory (its tensors take {size_text(program.tensor_bytes)} "
          "in float64)", file=sys.stderr)
    return 2


def run_main(args):
    from .files import write_out
    from .language.reader import read_file
    from .verify import vm
    program = read_file(args.program)
    stages, problem = _stage_requests(program, args.stage)
    targets = [args.out] + [path for _, path in stages or ()]
    folder = next((p for p in targets if os.path.isdir(p)), None)
    if folder is not None and not problem:   # said before any output is written
        problem = f"{folder}: is a folder, where an output file is to be written"
    real = [os.path.realpath(p) for p in targets]
    twice = next((p for p, r in zip(targets, real) if real.count(r) > 1), None)
    if twice is not None and not problem:   # (the last written would stand for all of them)
        problem = f"{twice}: named for two outputs (--out and --stage each write a file of their own)"
    if args.state_out and os.path.lexists(args.state_out) and not os.path.isdir(args.state_out) \
            and not problem:
        problem = f"{args.state_out}: is a file, where the --state-out folder is to be written"
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        leaves = vm.load_leaves(program, args.weights)
    except ProgramError as e:   # (no --weights: the error is the program's, named by its path)
        raise e.at(args.program) from None
    except MemoryError:
        return _out_of_memory(args.program, program)
    from .verify.verdict import unmatched
    for line in unmatched(args.weights, leaves.unmatched):
        print(line, file=sys.stderr)
    current = dict(leaves.values)
    try:
        for i in range(args.steps):
            trace = vm.step(program, current, keep_stages=bool(stages) and i == args.steps - 1)
            current.update(trace.states)
    except MemoryError:
        return _out_of_memory(args.program, program)
    write_out(args.out, trace.output.astype("<f8").tobytes())
    for index, path in stages:
        value = trace.stages[index]
        value = value[0] if program.stages[index].writes else value   # (out, the state written)
        write_out(path, value.astype("<f8").tobytes())
    if args.state_out:
        _write_state_dir(program, leaves, trace.states, args.state_out, args.weights)
    import json
    print(json.dumps({**vm.output_summary(program, trace.output), "steps": args.steps}))
    return 0


_LOCAL = {"emit": (add_emit_arguments, emit_main), "run": (add_run_arguments, run_main)}


def _command(name):
    if name in _LOCAL:
        return _LOCAL[name]
    if name.startswith("import-"):   # (emitter.importers.entry: what the pipeline's imports run)
        from .importers import entry
        return (lambda p: entry.parser(name[7:], p)), (lambda args: entry.run(name[7:], args))
    module = importlib.import_module(COMMANDS[name][0])
    return module.add_arguments, module.main


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doit"]:   # doit's own arguments, untouched by argparse
        from .zoo import main as zoo_main
        return zoo_main(argv[1:], COMMANDS)
    from . import __version__
    ap = argparse.ArgumentParser(prog="logos", description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--version", action="version", version=f"logos {__version__}")
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
    except BrokenPipeError:   # the reader went (`logos results | head -1`): quiet, as a shell's tools are
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # (nothing more to flush at exit)
        return 141   # (128 + SIGPIPE: what a tool the pipe ended shows)
    except OSError as e:   # a full disk, a file that went: one line, no traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"logos {args.command}: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:   # Ctrl-C (or a bundle's forward raising it): no verdict, no traceback
        print(f"logos {args.command}: interrupted: nothing more was written", file=sys.stderr)
        return 130
