"""What `python model.py --weights DIR` runs, as the lock vouches for it. The lock runs the bundle's
`load_weights` and `LogosModule` as the emitter's `main` does; where model.py's `main` is the
emitter's (its code, compiled from emitter/sambaflow/runtime.py) and its `__main__` block calls it
alone, that is all a user's run runs. An edited `main` is run beside the emitter's on the same
module, the same weights and arguments: the two must write the same output, bit for bit."""

import contextlib
import io
import os
import tempfile
import types

from .compare import KEYS

LABEL = {"stage": "main", "out": None, "op": "main", "line": None}
GUARD = '\n\nif __name__ == "__main__":\n    main()\n'


def _emitters_main():
    """The text of the emitter's `main`, as runtime.py holds it (nothing imported), and its code."""
    from ..sambaflow.runtime_source import source
    text = source("runtime").defs["main"].rstrip("\n") + "\n"
    code = compile(text, "<the emitter's main>", "exec")
    return text, next(c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == "main")


def _is_ours(main, module, text, reference):
    """Whether `main` is a function of model.py (`text`) whose whole text is `reference`'s, run in
    the module's globals with the emitter's defaults."""
    code = getattr(main, "__code__", None)
    if not isinstance(main, types.FunctionType) or main.__globals__ is not vars(module) or \
            main.__defaults__ != (None,) or code.co_filename != getattr(module, "__file__", None):
        return False
    lines, want = text.splitlines(keepends=True), reference.splitlines(keepends=True)
    start = code.co_firstlineno - 1
    rest = [ln for ln in lines[start + len(want):] if ln.strip()]
    return "".join(lines[start:start + len(want)]) == reference and (not rest or not rest[0][:1].isspace())


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


def check_main(torch, module, model_py, weights_dir, dtype, steps):
    """None where model.py's `main` and `__main__` block are the emitter's; else {"pass", "edited"
    (what is not the emitter's), "first" (where it fails)}. An edited block is not run (it is
    what the file runs as a program, not a function to call): a fail."""
    text = model_py.decode("utf-8", "replace")
    main = getattr(module, "main", None)
    reference, code = _emitters_main()
    ours = _is_ours(main, module, text, reference)
    guarded = text.count("__main__") == 1 and text.endswith(GUARD)
    if ours and guarded:
        return None
    if not guarded:
        return _failed("its `if __name__ == \"__main__\":` block", "the block that runs as `python model.py` is not "
                       "the emitter's (main() alone, at the end): what a user's run runs is not what the lock ran")
    if not isinstance(main, types.FunctionType):
        return _failed("its main", "model.py has no main function: `python model.py` cannot run the program")
    flat = dtype if dtype in ("float32", "float64") else "float32"   # (main's choices)
    argv = (["--weights", weights_dir] if weights_dir else []) + ["--dtype", flat, "--steps", str(steps)]
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="logos-main-") as tmp:
        try:
            got = _run(main, argv, os.path.join(tmp, "edited"))
            want = _run(types.FunctionType(code, vars(module), "main", (None,)), argv, os.path.join(tmp, "ours"))
        finally:
            torch.set_num_threads(threads)
    if got == want:
        return {"pass": True, "edited": "its main", "ran": f"python model.py {' '.join(argv)}"}
    said = f"{got[0]}, wrote {'nothing' if got[1] is None else f'{len(got[1])} bytes'}"
    return _failed("its main", f"model.py's main is not the emitter's, and `python model.py {' '.join(argv)} --out F` "
                   f"{said}, where the emitter's main on the same module {want[0]} and wrote "
                   f"{'nothing' if want[1] is None else f'{len(want[1])} bytes'}"
                   f"{', other values' if got[1] is not None and want[1] is not None else ''}")


def _failed(edited, why):
    return {"pass": False, "edited": edited, "reason": why,
            "first": {"step": None, **LABEL, **dict.fromkeys(KEYS), "after": "main", "raised": why}}
