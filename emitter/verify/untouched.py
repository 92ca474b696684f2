"""What a bundle may not change in the lock's process: what the VM, the judges and the lock compute
with. NumPy's, math's, the builtins' and torch's top-level names (every value: `math.pi` is the
VM's gelu's), torch.Tensor's methods (none added: its own methods are inherited, so a new one
overrides them), the emitter's names but the pipeline's (`EPS`, which the VM's norms read), and the
code and defaults of every function among them. A model.py that rebinds one (`np.sqrt = …` as it
is imported, a function's `__code__` swapped) would move the program's meaning the lock compares
it with, and a pass would be about another program; the lock fails it, naming the first it finds,
and puts every one back (a process that goes on to lock other bundles computes with the
originals). torch wrapping one of its own (importing torch._dynamo wraps `torch.manual_seed`) is
torch's, not the bundle's."""

import operator
import os
import sys
import types

from .probe import BundleFault

_MODULES = ("math", "builtins", "numpy", "torch")
_MISSING = object()


def _spaces():
    """(name, owner, namespace, every value or callables and modules alone, keys kept as they are)
    of each namespace the lock computes with, as loaded now."""
    for name, mod in list(sys.modules.items()):
        if mod is not None and (name in _MODULES or name.startswith(("numpy.", "emitter."))):
            space = getattr(mod, "__dict__", None)
            if isinstance(space, dict):   # (the pipeline's own state, `_RUN`, moves as a run goes)
                yield name, mod, space, not name.startswith("emitter.pipeline."), False
    torch = sys.modules.get("torch")
    if torch is not None:
        yield "torch.Tensor", torch.Tensor, torch.Tensor.__dict__, True, True


_PARTS = tuple(map(operator.attrgetter, ("__code__", "__defaults__", "__kwdefaults__")))


def _same(xs, ys):
    """Whether two sequences hold the same objects, in order (identity: nothing of theirs runs)."""
    return all(map(operator.is_, xs, ys))


def snapshot():
    """What the lock computes with as it is now: ({namespace name: (its owner, a copy of its dict,
    every value held or callables and modules alone, keys fixed)}, [(namespace name, name, a
    function among them)], [each one's code, defaults, keyword defaults]): about 8,000 names (1 ms)."""
    spaces = {name: (owner, dict(space), every, keys) for name, owner, space, every, keys in _spaces()}
    funcs = [(name, k, v) for name, (_, copy, _, _) in spaces.items() for k, v in copy.items()
             if type(v) is types.FunctionType]
    return spaces, funcs, [list(map(part, (f for _, _, f in funcs))) for part in _PARTS]


def _torchs(name, now, was):
    """Whether `now`, in torch's namespace, is torch's own wrapper of its `was` (functools.wraps,
    its code in torch's package), read without running anything of `now`'s."""
    torch = sys.modules.get("torch")
    if name != "torch" or torch is None or type(now) is not types.FunctionType:   # (a plain function:
        return False                                                            # nothing of it runs)
    return now.__dict__.get("__wrapped__") is was and \
        now.__code__.co_filename.startswith(os.path.dirname(torch.__file__) + os.sep)


def put_back(before):
    """The `namespace.name`s that moved since `before` (rebound, removed, a function's code or
    defaults swapped, a method added to torch.Tensor), each put back as it was; [] where none. A
    module imported since is the bundle's own to change. (A namespace whose values are those it
    held, in order, is passed by their identity at once: a few hundred µs for them all.)"""
    spaces, funcs, codes = before
    moved = []
    for name, (owner, copy, every, keys) in spaces.items():
        space = owner.__dict__
        if len(space) == len(copy) and _same(space.values(), copy.values()) and _same(space, copy):
            continue
        for k, v in copy.items():
            if every or callable(v) or isinstance(v, types.ModuleType):
                now = space.get(k, _MISSING)
                if now is not v and not _torchs(name, now, v):
                    moved.append(f"{name}.{k}")
                    setattr(owner, k, v)
        for k in sorted(set(space) - set(copy)) if keys else ():
            moved.append(f"{name}.{k}")
            delattr(owner, k)
    if not all(_same(map(part, (f for _, _, f in funcs)), was) for part, was in zip(_PARTS, codes)):
        for (name, k, f), *was in zip(funcs, *codes):
            if not _same([part(f) for part in _PARTS], was):
                moved.append(f"{name}.{k}.__code__")
                f.__code__, f.__defaults__, f.__kwdefaults__ = was
    return moved


def kept(before):
    """A BundleFault at `import` where the bundle changed what the lock computes with, since
    `before` (each put back)."""
    moved = put_back(before)
    if moved:
        raise BundleFault({"stage": "import", "out": None, "op": "model.py", "line": None},
                          f"the bundle rebound `{moved[0]}`" + (f" and {len(moved) - 1} more" if len(moved) > 1 else "")
                          + ", which the lock's VM and judges compute with (put back since): a bundle changes "
                          "nothing outside itself")
