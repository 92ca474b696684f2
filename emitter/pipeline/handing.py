"""Which of the zoo's tasks a run hands doit. A plain run (`doit` or `logos doit` with nothing but
command-line variables and options of how it runs, `-n 2`) hands doit the tasks that are not current by their keys (`keys`: the same
functions doit's up-to-date checks call, so nothing current is left out by construction), what
they name, and the report; a no-op then costs a stat per input file and doit one task. Any other
run (tasks named, another command, a doit config file, a dodo whose own task creators may name
the zoo's tasks) is handed every task."""

import os
import sys

# the zoo's task kinds a dodo's own task may not name on a plain run (`report` and `cache` are
# always handed: naming them keeps the run plain)
ZOO_TASKS = {"weights", "emit", "lock", "cachelookup"}
NOT_RUNS = {"list", "info", "clean", "forget", "ignore", "dumpdb", "strace", "help", "reset-dep",
            "tabcompletion", "auto"}


def doit_args():
    """doit's arguments in this process (`doit ARGS`, `logos doit ARGS`, `python -m emitter doit
    ARGS`), or None when they cannot be told (doit driven from Python)."""
    argv = sys.argv
    if argv[1:2] == ["doit"] and os.path.basename(argv[0]) in ("logos", "__main__.py", "-m"):
        return argv[2:]
    a0 = argv[0] if argv else ""
    if os.path.basename(a0) == "doit" or a0.endswith(os.path.join(os.sep, "doit", "__main__.py")):
        return argv[1:]
    return None


def is_run(args):
    """Whether the command runs tasks (anything but doit's list, info, clean, …)."""
    return not any(a in NOT_RUNS for a in args or ())


# doit's options that change how a run runs, never what it runs or finds current: a run with
# them is plain too (`doit -n 2` hands doit the same tasks as `doit`)
HOW = {"-n": True, "--process": True, "-P": True, "--parallel-type": True, "-v": True,
       "--verbosity": True, "-c": False, "--continue": False}


def selection(args):
    """The task names (and patterns) `doit ARGS` selects, [] for the default tasks; None when the
    arguments cannot be told. Options and their values, and command-line variables, are skipped."""
    if args is None or not is_run(args):
        return None
    valued = set()
    if any(a.startswith("-") for a in args):   # (doit's options that take a value, from doit)
        from doit.cmd_base import DodoTaskLoader
        from doit.cmd_run import Run
        for o in Run(task_loader=DodoTaskLoader(), config={}, bin_name="doit").get_options():
            if o.type is not bool:
                valued |= {f"-{o.short}" if o.short else None, f"--{o.long}" if o.long else None}
    out, rest = [], iter(a for a in args if a != "run")
    for a in rest:
        if a.startswith("-"):
            if a in valued:
                next(rest, None)
        elif "=" not in a:
            out.append(a)
    return out


def plain(args):
    """A run of the default tasks with no option but how it runs (HOW; command-line variables
    allowed) and no doit config file that could set one."""
    if args is None:
        return False
    rest = iter(args)
    for a in rest:
        if a.startswith("-"):
            name, joined = (a.split("=", 1)[0], "=" in a) if a.startswith("--") else (a[:2], len(a) > 2)
            if name not in HOW or (HOW[name] and not joined and next(rest, None) is None):
                return False
        elif "=" not in a:
            return False
    if os.path.exists("doit.cfg"):
        return False
    try:
        f = open("pyproject.toml", "rb")
    except OSError:
        return True
    import tomllib   # (only where there is one to read: a no-op's imports count)
    try:
        with f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False                 # doit will say what is wrong with it
    tool = data.get("tool")
    return not (isinstance(tool, dict) and "doit" in tool)


def dodo():
    """The dodo.py doit loaded from this folder (the zoo's), or None (`logos doit`, or doit
    driven from elsewhere)."""
    mod = sys.modules.get("dodo")
    if mod is None or not os.path.samefile(os.path.dirname(os.path.abspath(mod.__file__)), os.getcwd()):
        return None
    return mod


def _creators(ours):
    """[(name, creator, whether it may be called early)] of the dodo's own task creators, named as
    doit names them (an object's `create_doit_tasks` and a delayed creator may not)."""
    from doit.loader import task_params
    mod = dodo()
    out = []
    for key, ref in list(vars(mod).items()) if mod is not None else ():
        if ref is task_params:   # (doit's decorator, imported: no creator)
            continue
        if key.startswith("task_") and callable(ref) and not isinstance(ref, type) and ref not in ours:
            out.append((key[len("task_"):], ref, not getattr(ref, "doit_create_after", None)))
        elif hasattr(ref, "create_doit_tasks"):
            ref = ref.create_doit_tasks
            out.append((getattr(ref, "basename", key), ref, False))
    return out


def _called(name, ref):
    """[(doit's full name, task dict)] of one creator, called here as doit calls it (with its
    parameters' defaults; its dicts copied), or None when it raises."""
    import copy
    try:
        params = getattr(ref, "_task_creator_params", None) or ()
        got = ref(**{p["name"]: p.get("default") for p in params})
        single = isinstance(got, dict)
        made = copy.deepcopy([got] if single else list(got or ()))
    except Exception:
        return None
    if not all(isinstance(t, dict) for t in made):
        return None
    out = []
    for t in made:   # doit's names: a returned dict's basename (doit, having called the creator
        # first, may have turned it into `name`), a yielded one's basename:name
        if single:
            full = t.get("basename") or t.get("name") or name
        else:
            base = t.get("basename") or name
            full = f"{base}:{t['name']}" if t.get("name") else base
        out.append((full, t))
    return out


def own_tasks(ours):
    """([(doit's full name, task dict)] of the dodo's own tasks, or None when a creator cannot be
    called early; their basenames, a plain run's default tasks: those a creator makes, else (not
    called) its name, a delayed one's `creates`). Each creator is called once."""
    tasks, basenames = [], []
    for name, ref, early in _creators(ours):
        made = _called(name, ref) if early else None
        if made is None:
            tasks = None
            basenames += list(getattr(getattr(ref, "doit_create_after", None), "creates", None) or [name])
            continue
        if tasks is not None:
            tasks += made
        basenames += [n.split(":")[0] for n, _ in made]
    return tasks, list(dict.fromkeys(basenames))


class Writers:
    """The dodo's own tasks (`own`, from `own_tasks`) by what they write: each task's doit name
    with its targets resolved in `root` (absolute or relative, through links), so a zoo's task
    waits (task_dep) for those that write what it reads, however the path is spelt."""

    def __init__(self, own, root):
        self.root, self.tasks = root, []
        for name, t in own or ():
            targets = [self._real(x) for x in t.get("targets", ())]
            if targets:
                self.tasks.append((name, targets))

    def _real(self, path):
        return os.path.realpath(os.path.join(self.root, os.fspath(path)))

    def of(self, paths):
        """The names of the tasks that write one of `paths` (files, or folders: a file in one, or
        a folder holding one, counts)."""
        if not self.tasks:   # (no task of the dodo's own writes anything: nothing to resolve)
            return []
        real = [self._real(p) for p in paths if p]
        return sorted({n for n, targets in self.tasks for t in targets for p in real
                       if t == p or t.startswith(p + os.sep) or p.startswith(t + os.sep)})

    def makes(self, path):
        """Whether a task of the dodo's own writes `path` or something in it (a task that writes a
        folder holding it may not make it)."""
        if not self.tasks:
            return False
        p = self._real(path)
        return any(t == p or t.startswith(p + os.sep) for _, targets in self.tasks for t in targets)


def dodo_ok(own, config, own_keys, writes):
    """Whether the dodo doit loaded (if any) lets a plain run hand doit fewer tasks: each task of
    its own (`own`, from `own_tasks`) names none of the zoo's tasks but those always handed
    (`report`, `cache`) as a dependency, none writes what the zoo's tasks read (`writes`: doit
    must then order the two), and the settings that decide what is current (`own_keys`) are
    `config`'s."""
    mod = dodo()
    if mod is None:
        return True   # `logos doit`: the zoo's tasks alone
    if own is None or writes:
        return False
    for _, t in own:
        named = [str(d).split(":")[0] for k in ("task_dep", "setup", "calc_dep") for d in t.get(k, ())]
        if any(n in ZOO_TASKS for n in named):
            return False
    cfg = vars(mod).get("DOIT_CONFIG")
    return isinstance(cfg, dict) and all(cfg.get(k) == config[k] for k in own_keys)


VARIABLES = ("executor", "workers", "threads", "cache")   # the zoo's doit command-line variables


def near_variables(args):
    """A command-line variable that is none of the zoo's but near one (`worker=4`): a warning (a
    dodo's own variables, far from these, pass unremarked)."""
    from ..language.hints import did_you_mean
    out = []
    for a in args or ():
        name = a.split("=", 1)[0]
        hint = "=" in a and not a.startswith("-") and name not in VARIABLES and did_you_mean(name, VARIABLES)
        if hint:
            out.append(f"`{name}=` is no variable of the zoo's{hint} It is ignored")
    return out


def near_tasks(sel, entries, own_basenames):
    """A task `sel` names that the zoo has not, near one it has (`lock:mlpp`): a warning, said
    before doit's own refusal, which names none. A dodo's own task, or a pattern, passes."""
    base = {"report", "cache", *ZOO_TASKS}
    odd = [n for n in sel if not set(n) & set("*?[") and n.split(":")[0] not in (own_basenames or ())
           and n not in base]
    if not odd:   # (a plain run's: checked for nothing)
        return []
    from ..language.hints import did_you_mean
    known = base | {f"{k}:{e.name}" for e in entries for k in ZOO_TASKS}
    return [f"`{n}` is no task of the zoo's{hint}" for n in odd if n not in known
            for hint in (did_you_mean(n, known, 0.75),) if hint]


def ignored(name):
    """Whether `doit ignore NAME` marked the task (in doit's DB, open by the time tasks load)."""
    from types import SimpleNamespace
    from doit.globals import Globals
    dm = getattr(Globals, "dep_manager", None)
    return bool(dm is not None and dm.status_is_ignore(SimpleNamespace(name=name)))


def ignored_line(name):
    """What a run says of a task `doit ignore` marked that is not current."""
    return f"{name}: ignored (`doit ignore`), so it does not run; `doit forget {name}` lifts that"


def counted(task):
    """A task the line counts: not a group (`emit`, whose sub-tasks are the work) nor hidden.
    (`task.actions` would say the same but builds every task's action objects to say it.)"""
    return not task.has_subtask and not task.name.startswith("_")


def reachable(tasks, selected, groups=False):
    """The tasks this run reaches from `selected` (the groups among them where `groups`)."""
    seen, todo = set(), list(selected)
    while todo:
        n = todo.pop()
        if n not in seen and n in tasks:
            seen.add(n)
            todo.extend((*tasks[n].task_dep, *tasks[n].setup_tasks))
    return [n for n in seen if groups or counted(tasks[n])]


def waited_on(tasks, reachable):
    """The zoo's lock and emit tasks a task of the dodo's own in this run waits for (task_dep,
    calc_dep; through groups such as `lock`, and `cache`): those fail where a check does not pass
    or an emit is refused, so that such a task never runs on a failed verdict; the report then
    writes itself at the run's end (`_report_failures`). (doit runs a task whose `setup` failed.)
    And the report, where one waits for it: it is then put in place as its task ends."""
    stops, deps = ZOO_TASKS | {"report"}, lambda n: (*tasks[n].task_dep, *tasks[n].calc_dep)
    out, seen = set(), set()
    todo = [d for n in reachable if n.partition(":")[0] not in stops | {"cache"} for d in deps(n)]
    while todo:
        n = todo.pop()
        if n in seen or n not in tasks:
            continue
        seen.add(n)
        kind = n.partition(":")[0]
        if kind in ("lock", "emit", "report") and not tasks[n].has_subtask:
            out.add(n)
        elif kind not in stops or tasks[n].has_subtask:   # (a group's sub-tasks; the report fails itself)
            todo.extend(deps(n))
    return out
