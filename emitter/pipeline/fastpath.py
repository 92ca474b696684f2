"""What a plain `doit` over the zoo needs to hand doit only the tasks whose files moved: whether the
run is a plain one, what `settled.whole` compares (from the zoo's tasks), and whether the dodo's
own task creators and settings allow handing doit fewer than every task.

A plain run is `doit` or `logos doit` with no argument at all (the default tasks, no option, no
variable) and no doit config file that could set an option; anything else loads every task."""

import os
import sys
import tomllib

from . import files_io


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
        with open("pyproject.toml", "rb") as f:
            data = tomllib.load(f)
    except OSError:
        return True
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False                 # doit will say what is wrong with it
    tool = data.get("tool")
    return not (isinstance(tool, dict) and "doit" in tool)   # `[tool.doit]` or a dotted `doit.` key


def task_name(base, t):
    return f"{base}:{t['name']}" if "name" in t else base


def _uptodate_spec(us):
    # `targets_intact` is left out: whether a task has it follows from the stamped files' stats
    # (which the digest holds), not from the graph
    return [f"{u[0].__module__}.{u[0].__qualname__}{u[1:]!r}" if isinstance(u, tuple) else repr(u)
            for u in us if u is not files_io.targets_intact]


def whole_parts(tasks, stamped, extra_reads, package, env_text, root):
    """What `settled.whole` compares, from the zoo's `tasks` ({base: [task dicts]}): the text of
    what all of them depend on (the environment, doit), each task's graph entry as text, the files
    it writes (targets and `stamped` files) and reads (file deps and `extra_reads`, the files its
    `uptodate` callables read), the tasks it names, and the files every task depends on (the
    `package`'s own code, the dodo). Dicts and lists, no sets: their order is the same every run."""
    from doit import __version__ as doit_version
    key = repr((root, sys.executable, doit_version, env_text))
    specs, made, reads, named = {}, {}, {}, {}
    for base, ts in tasks.items():
        for t in ts:
            name = task_name(base, t)
            names = list(t.get("task_dep", ())) + list(t.get("setup", ())) + list(t.get("calc_dep", ()))
            specs[name] = repr((list(t.get("file_dep", ())), list(t.get("targets", ())), names,
                                _uptodate_spec(t.get("uptodate", ()))))
            made[name] = list(t.get("targets", ())) + stamped.get(name, [])
            reads[name] = list(t.get("file_dep", ())) + extra_reads.get(name, [])
            named[name] = names
    shared = []
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        shared += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return key, specs, made, reads, named, shared + ["dodo.py", "pyproject.toml"]


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


def own_targets(ns, ours):
    """The files the dodo's own standalone task creators in `ns` say they write (each creator
    called once more here: a standalone creator only describes its tasks). A plain run hands
    doit every task when one of them is a file a zoo task reads, as doit's own target-to-file_dep
    ordering then must run the writer first."""
    out = set()
    for key, ref in list((ns or {}).items()):
        if not (key.startswith("task_") and callable(ref) and ref not in ours
                and getattr(ref, "zoo_standalone", False)):
            continue
        made = ref()
        for t in [made] if isinstance(made, dict) else list(made or ()):
            if isinstance(t, dict):
                out.update(os.path.normpath(str(f)) for f in t.get("targets", ()))
    return out
