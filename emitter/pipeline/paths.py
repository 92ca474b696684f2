"""Where a path from a program or a config lands: inside the repository (links followed), inside a
shared root the zoo names (`roots:`, LOGOS_ROOTS), or neither. A Tree keeps what one discovery has
listed and resolved, so a zoo of thousands costs lookups."""

import os

from ..verify.links import find_zoo_root, resolved, under  # noqa: F401  (find_zoo_root, resolved: used from here)


class Tree:
    """What one discovery has learned of the repository: resolved directories and one listing per
    directory, so each of a zoo's thousand programs costs a dictionary lookup, not a path walk."""

    def __init__(self, root, makes=None):
        self.root = root
        self._makes = makes   # whether a task of this run makes a path
        self._real, self._dirs = {}, {}

    def to_be_made(self, rel):
        """Whether `rel`, not there, is made by a task of this run (a config may name it)."""
        return self._makes is not None and not os.path.lexists(os.path.join(self.root, rel)) \
            and self._makes(rel)

    def real(self, path):
        if path not in self._real:
            self._real[path] = resolved(path)
        return self._real[path]

    def entries(self, rel_dir):
        """name -> os.DirEntry of `root/rel_dir` ({} when it is not a readable directory)."""
        if rel_dir not in self._dirs:
            try:
                with os.scandir(os.path.join(self.root, rel_dir)) as it:
                    self._dirs[rel_dir] = {e.name: e for e in it}
            except OSError:
                self._dirs[rel_dir] = {}
        return self._dirs[rel_dir]

    def is_file(self, rel_dir, name):
        return self._is(rel_dir, name, "is_file")

    def is_dir(self, rel_dir, name):
        return self._is(rel_dir, name, "is_dir")

    def _is(self, rel_dir, name, how):
        """Whether the entry is a file (a folder) by its target; False where it cannot be told (a
        link in a loop, a target gone)."""
        e = self.entries(rel_dir).get(name)
        try:
            return e is not None and getattr(e, how)()
        except OSError:
            return False


def in_build(rel):
    """Whether the repository-relative `rel` (as `inside` gives it) is build/ or under it: what runs
    write, which no weights folder may be."""
    return rel == "build" or rel.startswith("build/")


def inside(root, rel, tree=None, roots=()):
    """The repo-relative normal form of `rel` (symlinks followed; an absolute path too); else, where
    it lands inside one of `roots` (resolved folders outside the repository), its absolute resolved
    path; else None.

    `tree` (a Tree of `root`) caches what earlier calls of one discovery resolved."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        return None
    tree = tree or Tree(root)
    root_real = tree.real(root)
    parts = rel.split("/")
    if rel.startswith("/"):   # (one that lands inside the repository is held as a relative one)
        full = resolved(rel)
    elif ".." in parts:
        full = resolved(f"{root_real}/{rel}")   # `..` may follow a link: walk it all
    else:
        parent = "/".join(p for p in parts[:-1] if p not in ("", "."))
        full = tree.real(f"{root_real}/{parent}") if parent else root_real
        leaf = parts[-1]
        if leaf not in ("", ".") and full is not None:
            full = f"{full}/{leaf}"
            entry = tree.entries(parent or ".").get(leaf)
            # not listed (an unreadable folder, a name that differs in case, a missing file) or a
            # link: what the listing cannot vouch for is resolved in full
            if entry is None or entry.is_symlink():
                full = resolved(full)
    if full is None or root_real is None:   # (a link on the way that cannot be read lands nowhere)
        return None
    if full == root_real:
        return "."
    prefix = root_real.rstrip("/") + "/"
    if full.startswith(prefix):
        return full[len(prefix):]
    return full if roots and under(full, roots) else None
