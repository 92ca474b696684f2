"""The last complete report's files while a run is under way: set aside (build/stale/) when a run
starts, so that a run that does not end leaves no report that says pass; brought back when the run
finds that report current, replaced when it writes a new one. While the zoo's reporter runs a run
(`hold`), the report it writes or finds current waits there too, and comes into place when the
run ends (`settle`): a run killed or interrupted after its report task (a task of the dodo's own
still running) leaves none in build/. Apart from the report's renderers, so that a no-op run
loads none of them."""

import os
import re

from ..files import read_json
from ..fingerprint import sha256_or_none

# The report's formats, its one registry: file -> (module of emitter.pipeline, its renderer: (rows,
# plots cache, header) -> text). The files the report writes, sets aside, brings back and cleans
# come from it (with those the last report recorded: a format dropped since is set aside too);
# the renderers are imported only to write (report.formats).
REPORT_FORMATS = {"report.json": ("report", "render_json"), "junit.xml": ("report", "render_junit"),
                  "junit-jenkins.xml": ("report", "render_jenkins"), "summary.md": ("report", "render_summary"),
                  "report.html": ("report_html", "render")}
STALE = "stale"   # build/stale/: the last complete report while a run is under way


# [True] while the zoo's reporter runs a run whose report no task of the dodo's own waits for (one
# that does reads it in build/ as its task ends); READY: the report folders found current meanwhile
HELD, READY = [], set()

# [True] once the zoo's reporter runs this process's run: it settles the report at the run's end
ZOO_REPORTER = []

# the rows and key the report's currency check judged, for its action next in the same process
# (doit runs a task's action right after its `uptodate`; a `-n N` worker judges them again)
JUDGED = {}


def recorded_key(out_dir):
    """The key the last complete report was made under, while its files (where the run set them
    aside) are what it wrote; else None."""
    st = read_json(os.path.join(out_dir, "status", "report.json"))
    if not isinstance(st, dict) or not isinstance(st.get("files"), dict):
        return None
    aside = os.path.join(out_dir, STALE)
    intact = all(sha256_or_none(os.path.join(aside, f)) == sha or sha256_or_none(os.path.join(out_dir, f)) == sha
                 for f, sha in st["files"].items())
    return st.get("key") if intact else None


_REPORT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\.(json|xml|md|html)")   # what a renderer names


def report_files(out_dir):
    """The registry's files, and any other report file the last report recorded writing (a format
    dropped since; a name of a report file's form only: never a folder, the history or a dot file)."""
    st = read_json(os.path.join(out_dir, "status", "report.json"))
    files = st.get("files") if isinstance(st, dict) else None
    more = [f for f in files if isinstance(f, str) and _REPORT_NAME.fullmatch(f) and f not in REPORT_FORMATS
            and not os.path.isdir(os.path.join(out_dir, f))] if isinstance(files, dict) else []
    return [*REPORT_FORMATS, *sorted(more)]


def set_aside(out_dir):
    """At the start of a run: the report of the last complete run moves to build/stale/ (a rename
    each), so a run that does not end (SIGKILL, a full disk, a crash) leaves no report that says
    pass; `restore` brings it back once the run finds it current, a new report replaces it."""
    for f in report_files(out_dir):
        try:
            os.makedirs(os.path.join(out_dir, STALE), exist_ok=True)
            os.replace(os.path.join(out_dir, f), os.path.join(out_dir, STALE, f))
        except OSError:
            pass


def restore(out_dir):
    for f in report_files(out_dir):
        try:
            os.replace(os.path.join(out_dir, STALE, f), os.path.join(out_dir, f))
        except OSError:
            pass


def hold():
    HELD[:] = [True]
    READY.clear()


def reads_report(tasks, reachable, out_dir):
    """Whether a task of this run names a file of the report as a file_dep (doit then runs it on
    what is in build/ as its turn comes, the report task having no targets to order it by)."""
    files = {os.path.abspath(os.path.join(out_dir, f)) for f in (*REPORT_FORMATS, "status/report.json")}
    return any(os.path.abspath(f) in files for n in reachable for f in tasks[n].file_dep)


def ready(out_dir):
    """The report in `out_dir` is current: into place now, or where the run holds it, at its end."""
    if HELD:
        READY.add(out_dir)
    else:
        restore(out_dir)


def settle(out_dir, ended):
    """At the run's end: the report it wrote (its status written since the run began: a `-n N`
    worker may have written it) or found current comes into place, where the run `ended` (not an
    interrupt or a crash on its way out: then build/stale/ keeps it, not current)."""
    from .guards import began_ns
    found, began = out_dir in READY, began_ns()
    if ended:   # (an interrupt's line says where the report is while HELD stands)
        HELD.clear()
    READY.clear()
    try:
        written = began is not None and os.stat(os.path.join(out_dir, "status", "report.json")).st_ctime_ns >= began
    except OSError:
        written = False
    if ended and (found or written):
        restore(out_dir)


def drop_aside(out_dir, keep=()):
    for f in set(report_files(out_dir)) - set(keep):
        try:
            os.unlink(os.path.join(out_dir, STALE, f))
        except OSError:
            pass


def changed_since(entries, began):
    """{program: the first of the files its checks are configured from (Entry.could_configure)
    changed since the run `began` (ns, the file system's clock: after the run read them)}: a
    config rewritten, made or removed, a default weights folder made where there was none. Each file
    looked at once."""
    if began is None:
        return {}
    seen, out = {}, {}
    for e in entries:
        for f in e.could_configure():
            if f not in seen:
                try:
                    seen[f] = os.stat(f).st_ctime_ns >= began
                except OSError:
                    seen[f] = None   # not there now
            if seen[f] or (seen[f] is None and f in e.configs):
                out[e.name] = f
                break
    return out


def appeared_since(entries, began, folder="programs"):
    """[(name, source)] of the programs made in `folder` since the run `began` (ns, the file
    system's clock) that are none of `entries`: a task of the dodo's own wrote one after the run
    read the zoo, so no check of it ran. Only the names the run did not read are stat'd."""
    from ..language.errors import excerpt
    from .names import slug
    known = {e.pc.source for e in entries}
    try:
        names = sorted(os.listdir(folder)) if began is not None else []
    except OSError:
        names = []
    out = []
    for f in names:
        path = f"{folder}/{f}"
        if f.endswith(".logos") and not f.startswith(".") and path not in known:
            try:
                if os.lstat(path).st_ctime_ns >= began:
                    out.append((slug(f[:-len(".logos")]), excerpt(path, 200)))
            except OSError:
                pass
    return out


READ = {}   # {build folder: when this run's report read the zoo, on the file system's clock (ns)}


def mark_read(out_dir):
    """Note when the report reads the zoo (its currency check, which its action follows): a file
    under build/ written and its ctime read."""
    path = os.path.join(out_dir, ".report-read")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"r")
            READ[out_dir] = os.fstat(fd).st_ctime_ns
        finally:
            os.close(fd)
    except OSError:
        READ.pop(out_dir, None)


def moved_after_read(entries, out_dir):
    """[path] of the programs, configs and weights files changed, made or removed after this run's
    report read the zoo (a task of the dodo's own that ran after it and declared no target the
    report could wait for, a checkout): that report may not be about the zoo as the run leaves it."""
    read = READ.get(out_dir)
    if read is None:
        return []
    moved = [src for _, src in appeared_since(entries, read)]
    for e in entries:
        try:
            if os.stat(e.pc.source).st_ctime_ns >= read:
                moved.append(e.pc.source)
        except OSError:
            moved.append(e.pc.source)
        try:   # (a weights folder's files: a derived one is the import's, before the report)
            with os.scandir(e.pc.weights if e.pc.weights and not e.pc.derive else ()) as files:
                moved += [f.path for f in files if f.stat(follow_symlinks=False).st_ctime_ns >= read]
        except (OSError, TypeError):
            pass
    return moved + [f for f in changed_since(entries, read).values() if f not in moved]

