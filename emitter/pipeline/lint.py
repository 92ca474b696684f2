"""`logos check [PATHS…]`: read and check programs and their configs, as a pre-commit hook or a CI
step runs it: nothing emitted, nothing written, torch never imported.

Every error of every file is printed in one run (`PATH:LINE: message`, paths as the user reaches
them from here), and the exit status is 1 when there is any. Under GitHub Actions each error is
also a `::error file=…,line=…::` annotation. With no PATHS it checks the zoo this folder is in
(the nearest folder upward holding programs/). A YAML file that is not a zoo's config (no program
beside it, not programs/defaults.yaml) is not read: a hook is handed every YAML of a repository.
"""

import os
import sys
import time

from ..language.errors import ProgramError
from .config import (DEFAULTS_FILE, load_defaults, load_defaults_builtin, load_program,
                     stray_configs)
from .paths import find_zoo_root, inside
from ..yamlfile import ConfigError


def add_arguments(p):
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="programs (.logos), configs (.yaml) or folders (a zoo, or its programs/); "
                        "default: the programs/ of the zoo this folder is in")
    p.add_argument("--forms", action="store_true", help="list every sentence form the reader knows")


def annotation(path, line, message):
    """A GitHub Actions `::error` workflow command (`path`, `line` where known): its data and
    properties escaped as the runner reads them (also each failed check of a doit run's)."""
    esc = lambda s, extra="": "".join({"%": "%25", "\r": "%0D", "\n": "%0A", ":": "%3A", ",": "%2C"}  # noqa: E731
                                      .get(c, c) if c in "%\r\n" + extra else c for c in str(s))
    workspace = os.environ.get("GITHUB_WORKSPACE")   # (GitHub names a file from there: a zoo in a
    if path and workspace:                            # subfolder, or a run from another folder)
        inside = os.path.relpath(os.path.abspath(path), os.path.abspath(workspace))
        path = path if inside.startswith("..") else inside
    where = ",".join(x for x in (path and f"file={esc(path, ':,')}", line and f"line={line}") if x)
    return f"::error {where}::{esc(message)}"


class Report:
    """The errors found, printed as they come (and as annotations under GitHub Actions)."""

    def __init__(self):
        self.count, self.seen = 0, set()
        self.github = os.environ.get("GITHUB_ACTIONS") == "true"

    def error(self, e, base=None):
        """Print each refusal `e` stands for once, its path as reached from here."""
        for one in getattr(e, "errors", [e]):
            path = one.path or "?"
            if base is not None and one.path and not os.path.isabs(one.path):
                path = os.path.relpath(os.path.join(base, one.path))
            key = (path, one.line, one.message)
            if key in self.seen:
                continue
            self.seen.add(key)
            self.count += 1
            print(f"{path}:{one.line}: {one.message}" if one.line else f"{path}: {one.message}")
            if self.github:
                print(annotation(path, one.line, one.message))


def _programs_in(folder):
    return {f[:-6] for f in os.listdir(folder) if f.endswith(".logos") and not f.startswith(".")}


def _targets(paths):
    """({programs folder: {program names}}, [loose programs], [paths that are none of these]): a
    folder, or a zoo's defaults.yaml (which every program of it depends on), stands for every
    program in it."""
    folders, loose, unusable = {}, [], []
    for path in paths:
        if os.path.isdir(path):
            folder = os.path.join(path, "programs") if os.path.isdir(os.path.join(path, "programs")) else path
            names = _programs_in(folder)
            folders.setdefault(os.path.normpath(folder), set()).update(names)
            for w in stray_configs(os.listdir(folder), names, os.path.normpath(folder)):
                print(f"warning: {w}", file=sys.stderr)
            continue
        folder, base = os.path.split(os.path.normpath(path))
        folder = folder or "."
        in_zoo = os.path.basename(os.path.abspath(folder)) == "programs"
        stem = base.rsplit(".", 1)[0]
        if base.endswith(".logos"):
            if in_zoo:
                folders.setdefault(folder, set()).add(stem)
            else:
                loose.append(path)
        elif base == DEFAULTS_FILE and in_zoo:
            folders.setdefault(folder, set()).update(_programs_in(folder))
        elif base.endswith(".yaml") and os.path.isfile(os.path.join(folder, stem + ".logos")):
            folders.setdefault(folder, set()).add(stem)
        elif base.endswith((".yaml", ".yml")) and in_zoo:
            for w in stray_configs([base], (), folder):
                print(f"warning: {w}", file=sys.stderr)
        elif not base.endswith((".yaml", ".yml")):   # (other YAML, a CI workflow: a hook names it too)
            unusable.append(path)
    return folders, loose, unusable


def _read(report, path, limit=None):
    """Read one program: its refusal reported, else the Program."""
    from ..language.reader import read_file
    from ..sambaflow.emit import unspelled
    try:
        program = read_file(path, limit) if limit else read_file(path)
        for e in unspelled(program):   # (read, but refused at emission: no commit of a sure failure)
            report.error(e)
        return program
    except ProgramError as e:
        report.error(e)
    except OSError as e:
        report.error(ProgramError(f"cannot read the program: {e.strerror or e}", path=path))


def check(paths):
    """(programs read, errors) of checking `paths`; the errors are printed (a path that is no
    program, config or folder is one)."""
    folders, loose, unusable = _targets(paths)
    report, read = Report(), 0
    for path in unusable:
        report.error(ProgramError("not a program (NAME.logos), a program's config (NAME.yaml beside "
                                  "it) or a folder of programs: nothing to check", path=path))
    for folder, names in sorted(folders.items()):
        root, programs_dir = os.path.split(os.path.abspath(folder))
        try:
            defaults = load_defaults(root, programs_dir)
        except ConfigError as e:
            defaults = load_defaults_builtin(root)
            report.error(e, root)
        for name in sorted(names):
            source = f"{programs_dir}/{name}.logos"
            try:
                pc = load_program(root, name, defaults, programs_dir)
            except ConfigError as e:
                report.error(e, root)
                pc = None
                if any(x.path == source for x in e.errors):
                    continue   # the program file itself refused (a folder, a FIFO): said once
            read += 1
            if pc is None and inside(root, source, None, defaults.get("roots", ())) is None:
                continue   # a link out of the repository (refused above): never read, never shown
            program = _read(report, os.path.relpath(os.path.join(folder, f"{name}.logos")),
                            pc.limits["program_bytes"] if pc else None)
            why = program is not None and pc is not None and program.over_limits(pc.limits)
            if why:
                report.error(ProgramError(why, path=program.path))
    for path in loose:
        read += 1
        _read(report, path)
    return read, report.count


def main(args):
    import gc
    gc.freeze()   # the imports' objects are not scanned by each collection the reader's sentences set off
    try:
        return _main(args)
    finally:
        gc.unfreeze()


def _main(args):
    start = time.perf_counter()
    if args.forms:
        if args.paths:
            print("logos check: --forms lists the sentence forms and checks nothing: give no PATH", file=sys.stderr)
            return 2
        from ..language.reader import FORMS
        print("\n".join(FORMS))
        return 0
    paths = args.paths
    if not paths:
        root = find_zoo_root(os.getcwd())
        if root is None:
            print(f"logos check: no zoo here: no programs/ folder in {os.getcwd()} or any folder above "
                  "it (or name the files to check)", file=sys.stderr)
            return 2
        paths = [os.path.relpath(os.path.join(root, "programs"))]
    missing = [p for p in paths if not os.path.exists(p)]
    for p in missing:
        print(f"{p}: no such file or folder", file=sys.stderr)
    read, errors = check([p for p in paths if p not in missing])
    errors += len(missing)
    empty = bool(args.paths) and not read and not missing and all(map(os.path.isdir, args.paths))
    if empty:   # folders named that hold no program: a mistyped folder is no pass
        print(f"{', '.join(args.paths)}: no program (NAME.logos) there", file=sys.stderr)
    seconds = time.perf_counter() - start
    print(f"logos check: {read} program(s), {errors} error(s) ({seconds * 1000:.0f} ms)", file=sys.stderr)
    return 1 if errors or missing or empty else 0
