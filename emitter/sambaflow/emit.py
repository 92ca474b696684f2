"""The bundle: a Program printed as model.py, manifest.json and compile.py (no torch imported here).

model.py reads like torch.fx's generated code: the functions the program's calls name, copied from
`runtime.py`, the program's tables, and `LogosModule.forward`, one statement per op in dataflow
order, taking the program's inputs as parameters. compile.py is `app.py`'s functions bound to the
bundle's model.py.
"""

import functools
from dataclasses import dataclass

from ..files import BUNDLE_FILES, write_files
from ..language.errors import ProgramError
from ..language.program import Program
from ..language.reader import read_program
from ..ops import EPS, torch_spelling
from ..ops.precision import stage_precisions
from .manifest import render_manifest
from .marks import TEMPLATE_MARK, VENDOR_HEADER, program_name
from .runtime_source import source

# The ops of the qwen35 hybrid decode step: each has a torch spelling.
QWEN38_OPS = ("rmsnorm", "rope", "attention", "sigmoid", "hadamard", "causal conv", "silu", "l2norm",
              "decay", "gated delta", "swiglu", "matmul", "argmax", "embedding")
# What every model.py holds beside the functions its calls name.
_FIXED = ("ProgramModule", "load_weights", "main")


@dataclass(frozen=True)
class TorchArtifact:
    model_py: str
    compile_py: str
    manifest_json: str

    def files(self):
        return dict(zip(BUNDLE_FILES, (self.model_py, self.manifest_json, self.compile_py)))


def stage_call(p: Program, stage, cast=False):
    """The torch expression of one stage (a ProgramError naming an op that has no spelling); with
    `cast`, each tensor operand goes through `self.cast` (the stage's precision in bfloat16), told
    when the op only moves its values (a view, a gather), so that a cast tap undoes is left out,
    and when the op widens the operand itself (so that no whole widened copy is made)."""
    if stage.op.call is None:
        raise _refusal(p, stage)
    moved = ", moved=True" if stage.op.view else ""

    def wrap(name, placeholder):
        widened = ", widened=True" if placeholder in stage.op.widens else ""
        return f"self.cast({stage.index}, {name}{moved}{widened})"
    return stage.op.call(stage.args(p.shapes, wrap=wrap if cast else None))


def unspelled(p: Program):
    """A ProgramError for each stage of `p` no torch call spells (emission refuses the first;
    `logos check` names them all)."""
    return [_refusal(p, s) for s in p.stages if s.op.call is None]


def _refusal(p, stage):
    return ProgramError(f"`{stage.text}`: {_no_spelling(stage.op.name)}", stage.line, p.path)


def _no_spelling(name):
    try:
        torch_spelling(name)
    except ValueError as e:
        return str(e)
    raise AssertionError(name)


def _stage_lines(stage, call):
    lines = [f"# stage {stage.index}: {stage.out} = {stage.op.name}"]
    if stage.writes is None:
        lines.append(f"{stage.out} = self.tap({stage.index}, {call})")
    elif stage.binds:
        lines.append(f"{stage.out}, {stage.writes} = self.tap({stage.index}, {call})")
    else:
        lines.append(f"{stage.writes} = self.tap({stage.index}, {call})")
    return lines


def _q(name):
    """A checked tensor name as a string literal (names are identifiers: nothing to escape)."""
    return f'"{name}"'


def _tuple(items):
    """A Python tuple literal of already-rendered items."""
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _forward(p: Program, calls):
    inputs = [v for v in p.leaves if p.roles[v] == "input"]
    body = [f"{v} = self.leaf_{v} if {v} is None else {v}" if v in inputs else f"{v} = self.leaf_{v}"
            for v in p.leaves]
    for stage, call in zip(p.stages, calls):
        body += _stage_lines(stage, call)
    if p.states:
        out_stage = next(st for st in reversed(p.stages) if st.binds)
        if out_stage.op.view:   # a view of a state's buffer would change with its write-back
            body.append(f"{p.output} = {p.output}.clone()   # (before the write-back: what the step computed)")
        body.append("# write-back: the states this step hands to the next")
        body += [f"self.leaf_{s}.copy_({s})" for s in p.states]
    body.append(f"return {p.output}")
    params = "".join(f", {v}=None" for v in inputs)
    return [
        "class LogosModule(ProgramModule):",
        f'    """The tensor program: forward is its {len(p.stages)} ops in dataflow order; each input is a',
        '    parameter that defaults to its buffer, and each state is written back to its buffer."""',
        "",
        f"    def forward(self{params}):",
    ] + ["        " + line for line in body]


def render_model(p: Program, name, calls, precisions=None):
    runtime = source("runtime")
    used = {n for call in calls for n in runtime.called(call)}
    defs = runtime.closure(used | set(_FIXED))
    helpers = [runtime.defs[n] for n in defs if n not in _FIXED]
    leaves = p.leaves
    out = [
        VENDOR_HEADER,
        f"# Generated by the LOGOS SambaFlow emitter from the tensor program `{name}`:",
        f"# {len(leaves)} leaves, {len(p.stages)} ops, output `{p.output}`. forward is the program, one op",
        "# per statement in dataflow order; the functions above it spell the ops' meaning. Weights are",
        "# files named by variable (`<var>.f64`, `.f32`, `.npy`) or tensors of a `.safetensors` file",
        "# named by variable: see load_weights.",
        *runtime.imports, "", f"EPS = {EPS!r}", "",
    ]
    for text in helpers:
        out += ["", text, ""]
    out += ["", f'PROGRAM = "{name}"', "LEAVES = {"]
    for v in leaves:
        d = p.decls[v]
        out.append(f'    "{v}": (({d.rows}, {d.cols}), "{p.roles[v]}", '
                   f'"{"real" if d.real else "int"}"),')
    out.append("}")
    out.append("FILLS = {")
    for v in leaves:
        if p.fills[v]:   # (an index filled twice: its last value only, where the first stood)
            last = dict(p.fills[v])
            kept = [(i, last.pop(i)) for i, _ in p.fills[v] if i in last]
            out.append(f'    "{v}": {_tuple([f"({i}, {val!r})" for i, val in kept])},')
    inputs = [v for v in leaves if p.roles[v] == "input"]
    out += ["}", f"INPUTS = {_tuple([_q(v) for v in inputs])}",
            f"STATES = {_tuple([_q(v) for v in p.states])}",
            f"REQUIRED = {_tuple([_q(v) for v in p.required])}", f"OUTPUT = {_q(p.output)}"]
    if precisions:
        out.append("# each stage's (compute, output) precision when the module runs in bfloat16")
        out.append("PRECISION = {")
        out += [f'    {i}: ("{c}", "{o}"),' for i, (c, o) in sorted(precisions.items())]
        out.append("}")
    else:
        out.append("PRECISION = {}  # no precision policy: in bfloat16 every stage runs in bf16")
    out += ["", ""]
    out += [runtime.defs["ProgramModule"], "", ""]
    out += _forward(p, calls)
    out += _weight_readers(out[-1][:1].isupper())
    for n in ("load_weights", "main"):
        out += ["", "", runtime.defs[n]]
    out += ["", "", 'if __name__ == "__main__":', "    main()", ""]
    return "\n".join(out)


@functools.lru_cache(maxsize=None)
def _weight_readers(after_constant):
    """The lines of weight_files.py's definitions load_weights needs (the weights folder's reader,
    shared with the VM), the same for every program; `after_constant`: the line before them is a
    constant's, which a constant follows without blank lines."""
    runtime, files, out = source("runtime"), source("weight_files", constants=True), []
    assert set(files.imports) <= set(runtime.imports), "weight_files.py imports what model.py does"
    for n in files.closure(files.used_by(runtime.defs["load_weights"])):
        constant = not files.defs[n].startswith(("def ", "class "))
        last = out[-1][:1].isupper() if out else after_constant
        out += ([] if constant and last else ["", ""]) + [files.defs[n]]
    return tuple(out)


def _with_types(imports):
    """app.py's imports and `types` (which loads model.py), among the standard library's."""
    lines = list(imports)
    lines.insert(lines.index("import time") + 1, "import types")
    return lines


def render_compile(name):
    app = source("app")
    out = [
        VENDOR_HEADER,
        TEMPLATE_MARK,
        f'"""Compile `model.py` (the LOGOS tensor program `{name}`) for the RDU through SambaFlow, then run it.',
        "",
        "The shape of a SambaNova app: `parse_app_args` gives the `compile` and `run` subcommands (with",
        "`--pef`, `--pef-name`, `--output-folder`, `--inference`); weights are loaded before tracing; inputs",
        "are fixed-shape SDK tensors. Every line that touches the vendor SDK carries the TEMPLATE mark:",
        "nobody here has run it.",
        '"""',
        *_with_types(app.imports),
        "",
        "# model.py beside this file, run from its bytes as they are now: an import would run a",
        "# __pycache__ copy whose source kept its size and mtime through an edit (what it imports",
        "# itself is found beside it, as before; through a link to this file, beside what it links to)",
        "sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))",
        "bundle = types.ModuleType(\"model\")",
        "bundle.__file__ = os.path.join(sys.path[0], \"model.py\")",
        "sys.modules[\"model\"] = bundle",
        "with open(bundle.__file__, \"rb\") as _source:",
        "    exec(compile(_source.read(), bundle.__file__, \"exec\"), bundle.__dict__)",
    ]
    for n in app.closure(app.defs):
        out += ["", "", app.defs[n]]
    out += ["", "", 'if __name__ == "__main__":', "    sys.exit(main())", ""]
    return "\n".join(out)


def emit_program(p: Program, policy=None):
    """The bundle of a read Program (a ProgramError if an op has no spelling: nothing is made).
    With a precision `policy` ({} for the default; see emitter.ops.precision), model.py follows it
    when it runs in bfloat16, and the manifest says which op runs in which precision."""
    name = program_name(p.source)
    precisions = None if policy is None else stage_precisions(p, policy)
    calls = [stage_call(p, st, precisions is not None) for st in p.stages]
    return TorchArtifact(render_model(p, name, calls, precisions), render_compile(name),
                         render_manifest(p, name, calls, precisions))


def emit_torch_module(source_text, path=None):
    """The bundle of a program's text: `TorchArtifact(model_py, compile_py, manifest_json)`."""
    return emit_program(read_program(source_text, path))


def write_bundle(artifact, directory):
    write_files(directory, artifact.files())
