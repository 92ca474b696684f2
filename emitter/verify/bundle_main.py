"""What `python model.py --weights DIR` runs, as the lock vouches for it. The lock runs the bundle's
`load_weights` and `LogosModule` as the emitter's `main` does; where model.py's `main` is the
emitter's (its text, as emitter/sambaflow/runtime.py holds it, reading the globals the emitter's
does) and its `__main__` block calls it alone, that is all a user's run runs. An edited `main` is
run beside the emitter's on the same module and weights, with its defaults and at float64 and
float32 for the check's steps: the two must write the same output, bit for bit. (What it finds is
an edit, not one built to hide: model.py may tell a run as a program apart in other ways.)"""

import builtins
import contextlib
import dis
import functools
import io
import os
import re
import sys
import tempfile
import types

from .compare import KEYS

LABEL = {"stage": "main", "out": None, "op": "main", "line": None}
GUARD = re.compile(r"""^if __name__ == (["'])__main__\1:[ \t]*(#[^\n]*)?\n[ \t]+main\(\)[ \t]*(#[^\n]*)?\n"""
                   r"(?:[ \t]*(?:#[^\n]*)?\n)*(?=\S|\Z)", re.M)
NAME = re.compile(r"(?<![.\w])__name__(?!\w)")   # (a name, not an attribute: `type(e).__name__`)
MODULES = ("argparse", "json", "torch")   # the modules the emitter's main reads, as imported


@functools.lru_cache(maxsize=1)
def _emitters_main():
    """The text of the emitter's `main`, as runtime.py holds it (nothing imported), its code, and
    the globals it reads."""
    from ..sambaflow.runtime_source import source
    text = source("runtime").defs["main"].rstrip("\n") + "\n"
    code = next(c for c in compile(text, "<the emitter's main>", "exec").co_consts
                if isinstance(c, types.CodeType) and c.co_name == "main")
    return text, code, frozenset(i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL")


def _is_ours(main, module, lines, model):
    """Whether `main` is a function of model.py (`lines`, its text's) whose whole text is the
    emitter's, with its defaults, reading the globals the emitter's does as they are meant: the
    modules as imported, the module class the lock built, the builtins not shadowed."""
    text, _, reads = _emitters_main()
    code = getattr(main, "__code__", None)
    if not isinstance(main, types.FunctionType) or main.__globals__ is not vars(module) or \
            main.__defaults__ != (None,) or code.co_filename != getattr(module, "__file__", None):
        return False
    want, start = text.splitlines(keepends=True), code.co_firstlineno - 1
    rest = [ln for ln in lines[start + len(want):] if ln.strip()]
    if "".join(lines[start:start + len(want)]) != text or (rest and rest[0][:1].isspace()):
        return False
    g = vars(module)
    return all(n not in g or (g[n] is sys.modules.get(n) if n in MODULES else type(model) is g[n] if n == "LogosModule"
                              else callable(g[n]) if n == "load_weights" else isinstance(g[n], str)
                              if n in ("PROGRAM", "OUTPUT") else g[n] is getattr(builtins, n, None)) for n in reads)


def _run(main, argv, out):
    """(how `main(argv + --out out)` ended, the bytes it wrote to `out` or None); its printing kept."""
    ended = "returned"
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            main(argv + ["--out", out])
    except SystemExit as e:
        ended = f"exited with {e.code!r}"
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        ended = f"raised {type(e).__name__}: {str(e)[:200]}"
    try:
        with open(out, "rb") as f:
            return ended, f.read()
    except OSError:
        return ended, None


def check_main(torch, module, model_py, weights_dir, steps, model):
    """None where model.py's `main` and `__main__` block are the emitter's; else {"pass", "edited"
    (what is not the emitter's), "ran" (the commands both mains ran), "first" (where it fails)}.
    An edited block is not run (it is what the file runs as a program, not a function to call):
    a fail. `model`: the module the lock built (its class is the one main must build)."""
    text = model_py.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    if not text.endswith("\n"):
        text += "\n"
    if len(NAME.findall(text)) != 1 or len(GUARD.findall(text)) != 1:
        return _failed("its `if __name__ == \"__main__\":` block", "the block that runs as `python model.py` is not "
                       "the emitter's (main() alone): what a user's run runs is not what the lock ran")
    main = getattr(module, "main", None)
    if _is_ours(main, module, text.splitlines(keepends=True), model):
        return None
    if not isinstance(main, types.FunctionType):
        return _failed("its main", "model.py has no main function: `python model.py` cannot run the program")
    given = ["--weights", weights_dir] if weights_dir else []
    runs = [given] + [given + ["--dtype", d, "--steps", str(steps)] for d in ("float64", "float32")]
    # the emitter's main, in the module's globals with what it reads put right (the modules as
    # imported, the builtins unshadowed): an edit of those is an edit of what main runs
    ours = {**vars(module), **{n: sys.modules[n] for n in MODULES if n in sys.modules}}
    for n in _emitters_main()[2]:
        if hasattr(builtins, n):
            ours.pop(n, None)
    threads, ran = torch.get_num_threads(), []
    with tempfile.TemporaryDirectory(prefix="logos-main-") as tmp:
        try:
            for argv in runs:
                got = _run(main, argv, os.path.join(tmp, "edited"))
                want = _run(types.FunctionType(_emitters_main()[1], ours, "main", (None,)), argv, os.path.join(tmp, "ours"))
                ran.append(f"python model.py {' '.join(argv)}")
                if got != want:
                    break
        finally:
            torch.set_num_threads(threads)
    if got == want:
        return {"pass": True, "edited": "its main", "ran": ran}
    said = f"{got[0]}, wrote {'nothing' if got[1] is None else f'{len(got[1])} bytes'}"
    return _failed("its main", f"model.py's main (or a global it reads) is not the emitter's, and `{ran[-1]} --out F` {said}, where the "
                   f"emitter's main on the same module {want[0]} and wrote "
                   f"{'nothing' if want[1] is None else f'{len(want[1])} bytes'}"
                   f"{', other values' if got[1] is not None and want[1] is not None else ''}", ran)


def _failed(edited, why, ran=None):
    return {"pass": False, "edited": edited, "reason": why, **({"ran": ran} if ran else {}),
            "first": {"step": None, **LABEL, **dict.fromkeys(KEYS), "after": "main", "raised": why}}
