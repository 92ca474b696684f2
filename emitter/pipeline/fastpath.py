"""What a plain `doit` over the zoo needs to skip doit's per-task work when nothing moved: whether
the run is a plain one, the whole-run digest's parts (`settled.whole`) from the zoo's tasks, and
whether the dodo's own task creators and settings allow handing doit the report task alone.

A plain run is `doit` or `logos doit` with no argument at all (the default tasks, no option, no
variable) and no doit config file that could set an option; anything else loads every task."""

import os
import sys

from . import files_io, weights


def plain_run(zoo_argv):
    """Whether this process is a plain doit run: `zoo_argv` is what `logos doit` was given (None
    when doit runs a dodo.py itself, whose command line is then sys.argv)."""
    if zoo_argv is not None:
        args = zoo_argv
    else:
        a0 = sys.argv[0] if sys.argv else ""
        if not (os.path.basename(a0) == "doit" or a0.endswith(os.path.join(os.sep, "doit", "__main__.py"))):
            return False
        args = sys.argv[1:]
    if args or os.path.exists("doit.cfg"):
        return False
    try:
        with open("pyproject.toml", encoding="utf-8", errors="replace") as f:
            return "tool.doit" not in f.read()
    except OSError:
        return True


def task_name(base, t):
    return f"{base}:{t['name']}" if "name" in t else base


def _uptodate_spec(us):
    # `targets_intact` is left out: whether a task has it follows from the stamped files' stats
    # (which the digest holds), not from the graph
    return [f"{u[0].__module__}.{u[0].__qualname__}{u[1:]!r}" if isinstance(u, tuple) else repr(u)
            for u in us if u is not files_io.targets_intact]


def whole_parts(tasks, stamped, code_files, derived_weights, package, env_text, root):
    """(key, made, read) for `settled.whole`: the graph of `tasks` ({base: [task dicts]}) and the
    environment as text, the files each task writes (its targets and `stamped` files), and every
    other file the checks read: file deps, the code digests' `code_files`, the `derived_weights`
    directories' files, the `package`'s own code, the dodo. Dicts, not sets: their order is the
    digest's, the same on every run."""
    from doit import __version__ as doit_version
    lines = [repr((root, sys.executable, doit_version, env_text))]
    made, read = {}, {}
    for base, ts in tasks.items():
        for t in ts:
            name = task_name(base, t)
            deps = list(t.get("file_dep", ()))
            lines.append(repr((name, deps, list(t.get("targets", ())), list(t.get("task_dep", ())),
                               list(t.get("setup", ())), list(t.get("calc_dep", ())),
                               _uptodate_spec(t.get("uptodate", ())))))
            made[name] = list(t.get("targets", ())) + stamped.get(name, [])
            read.update(dict.fromkeys(deps))
    read.update(dict.fromkeys(code_files))
    for d in derived_weights:   # what `weights.weights_current` lists
        read.update(dict.fromkeys(weights.weight_files(d)))
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        read.update(dict.fromkeys(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")))
    read.update(dict.fromkeys(("dodo.py", "pyproject.toml")))
    return "\n".join(lines), made, read


def dodo_namespace(zoo_argv, root, own):
    """The namespace doit takes task creators from: `own` (the tasks module's) under `logos doit`,
    else the dodo module a plain doit imported from `root` (None if it cannot be told)."""
    if zoo_argv is not None:
        return own
    mod = sys.modules.get("dodo")
    path = getattr(mod, "__file__", None)
    if not path or os.path.realpath(path) != os.path.realpath(os.path.join(root, "dodo.py")):
        return None
    return vars(mod)


def namespace_ok(ns, ours, config, safe_keys, own_keys):
    """Whether the creators doit loads from `ns` beside `ours` are all marked standalone, the
    default tasks are the report and theirs, and the settings in `own_keys` (what decides what is
    up to date) are `config`'s, with no key outside `safe_keys`."""
    if ns is None:
        return False
    names = {"report"}
    for key, ref in list(ns.items()):
        if key.startswith("task_") and callable(ref) and not isinstance(ref, type):
            if ref in ours:
                continue
            names.add(key[5:])
        elif hasattr(ref, "create_doit_tasks"):
            names.add(getattr(ref.create_doit_tasks, "basename", key))
        else:
            continue
        if not getattr(ref, "zoo_standalone", False):
            return False
    cfg = ns.get("DOIT_CONFIG")
    return (isinstance(cfg, dict) and set(cfg) <= safe_keys
            and all(cfg.get(k) == config[k] for k in own_keys)
            and bool(cfg.get("default_tasks")) and set(cfg["default_tasks"]) <= names)
