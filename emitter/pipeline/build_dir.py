"""build/ and programs/ as a run finds them: build/ a plain folder inside the repository holding no
links (through one the run would write into, or sweep, wherever it leads), programs/ a folder it
can list. What is wrong refuses the run in one line (exit 3), a link in build/ is removed."""

import atexit
import os
import shutil
import sys

from ..files import PARTIAL
from .files_io import unlink_quietly
from .guards import BuildBusy


def safe_build(root, build_dir):
    """Refuse a build/ that is a link or resolves outside the repository (targets would escape it),
    or is no folder."""
    path = os.path.join(root, build_dir)
    real = os.path.realpath(path)
    if os.path.islink(path) or not real.startswith(os.path.realpath(root) + os.sep):
        sys.stderr.write(f"doit: refused: {build_dir}/ is a link or lies outside {root} ({real}); "
                         "make it a plain folder inside the repository\n")
        raise BuildBusy(3)
    if os.path.lexists(path) and not os.path.isdir(path):
        sys.stderr.write(f"doit: refused: {build_dir} is a file, where the zoo's {build_dir}/ folder "
                         "goes; move it away and run again\n")
        raise BuildBusy(3)
    for said, removed in remove_links(root, path):
        sys.stderr.write(f"doit: {said}: removed, as the zoo writes only into {build_dir}/ itself\n"
                         if removed else f"doit: refused: {said}, which cannot be removed: remove it\n")
        if not removed:
            raise BuildBusy(3)


# build/'s folders whose entries are folders the pipeline writes into (status/ holds files only,
# each written whole and renamed over whatever held its name, a link too)
BUILD_FOLDERS = ("bundles", "results", "weights", "store", "stale", "tmp")
# what may be a link all the same: the history kept on another volume (one not mounted, a link to
# nothing, is named by its readers)
LINKED_BY_CHOICE = ("results.sqlite",)


def links_in(build):
    """The links in `build` and in its BUILD_FOLDERS, none followed: build/ holds only what the
    pipeline writes, and through a link there (one committed as build/bundles/NAME, build/.running)
    a run would write into, or sweep, wherever it leads."""
    found = []
    try:
        with os.scandir(build) as it:
            top = list(it)
    except OSError:
        return found
    for e in top:
        if e.is_symlink() and e.name not in LINKED_BY_CHOICE:
            found.append(e.path)
        elif e.name in BUILD_FOLDERS and e.is_dir(follow_symlinks=False):
            try:
                with os.scandir(e.path) as it:
                    found += [x.path for x in it if x.is_symlink()]
            except OSError:
                pass
    return sorted(found)


def remove_links(root, build):
    """Remove the links `links_in` finds (never what they lead to): (what each was, removed) of
    each, up to the first that cannot be removed."""
    for link in links_in(build):
        try:
            said = f"{os.path.relpath(link, root)} was a link (to {os.readlink(link)[:200]})"
            os.unlink(link)
        except FileNotFoundError:   # (gone meanwhile)
            continue
        except OSError as e:
            yield f"{os.path.relpath(link, root)} is a link ({e.strerror})", False
            return
        yield said, True


def listable(folder):
    """A zoo's programs/ that is there but cannot be listed (a link whose target is gone, a loop)
    refuses the run (exit 3): read as empty, it would pass with no checks and sweep every result."""
    if not os.path.lexists(folder):
        return
    try:
        os.listdir(folder)
    except OSError as e:
        link = f" (a link to {os.readlink(folder)})" if os.path.islink(folder) else ""
        sys.stderr.write(f"doit: refused: {folder}/ cannot be listed: {e.strerror}{link}\n")
        raise BuildBusy(3) from None


def sweep(build_dir):
    """After a run that did not end (SIGKILL, a power cut), remove what it left half done: the
    temporary folder build/tmp (imports unpack there) and staged files (`*.partial`). A marker
    says a run is going on; only this process holds the build/ lock, so nothing else is writing."""
    marker = os.path.join(build_dir, ".running")
    if os.path.exists(marker):
        shutil.rmtree(os.path.join(build_dir, "tmp"), ignore_errors=True)
        for dirpath, _, files in os.walk(build_dir):
            unlink_quietly(os.path.join(dirpath, f) for f in files if f.endswith(PARTIAL))
    with open(marker, "w"):
        pass
    atexit.register(unlink_quietly, [marker])   # (quietly: build/ made read-only, or gone, by then)
