"""What a bundle may not change in the lock's process: the functions, classes and modules the VM,
the judges and the lock compute with (NumPy's, math's, the builtins, torch's top level and its
Tensor class, the emitter's own). A model.py that rebinds one (`np.sqrt = …` as it is imported)
would move the program's meaning the lock compares it with, and a pass would be about another
program; the lock fails it, naming the first it finds, and puts every one back (a process that
goes on to lock other bundles computes with the originals)."""

import sys
import types

from .probe import BundleFault

_MODULES = ("math", "builtins", "numpy", "torch")


def _spaces():
    """(name, namespace) of each module the lock computes with, as loaded now, and torch.Tensor's."""
    for name, mod in list(sys.modules.items()):
        if mod is not None and (name in _MODULES or name.startswith(("numpy.", "emitter."))):
            space = getattr(mod, "__dict__", None)
            if isinstance(space, dict):
                yield name, mod, space
    torch = sys.modules.get("torch")
    if torch is not None:
        yield "torch.Tensor", torch.Tensor, torch.Tensor.__dict__


def snapshot():
    """{namespace name: (its owner, {name: the callable or module it holds})}: about 6,000 names, 3 ms."""
    return {name: (owner, {k: v for k, v in space.items() if callable(v) or isinstance(v, types.ModuleType)})
            for name, owner, space in _spaces()}


def put_back(before):
    """The `module.name`s whose value is not the one `before` saw (rebound or removed since), each
    put back as it was; [] where none. A module imported since is the bundle's own to change."""
    moved = []
    for name, (owner, was) in before.items():
        space = owner.__dict__
        for k, v in was.items():
            if space.get(k) is not v:
                moved.append(f"{name}.{k}")
                setattr(owner, k, v)
    return moved


def kept(before):
    """A BundleFault at `import` where the bundle rebound a function or module the lock computes
    with, since `before` (each put back)."""
    moved = put_back(before)
    if moved:
        raise BundleFault({"stage": "import", "out": None, "op": "model.py", "line": None},
                          f"the bundle rebound `{moved[0]}`" + (f" and {len(moved) - 1} more" if len(moved) > 1 else "")
                          + ", which the lock's VM and judges compute with (put back since): a bundle changes "
                          "nothing outside itself")
