"""Where a weight file may link. A leaf's file that is a link out of its weights folder is followed
when its target lies inside the repository (the nearest folder upward holding programs/) or inside
a shared root the zoo names (programs/defaults.yaml `roots:`, LOGOS_ROOTS), as a config's paths
are; anywhere else it is refused, naming the file and its target."""

import os

ROOTS_ENV = "LOGOS_ROOTS"
PATH_BYTES = 4096   # the longest path Linux opens (PATH_MAX): a longer one names no file, and
#                    resolving one costs a stat per part (a 1 MB `a/a/…` took a minute each run)


def path_bytes(x):
    """The bytes of the path `x` as the system takes it (UTF-8; a name that is no UTF-8 as it came)."""
    return len(x.encode("utf-8", "surrogatepass"))


def find_zoo_root(start):
    """The nearest folder from `start` upward that holds programs/ (a zoo's root), or None."""
    here = os.path.abspath(start)
    while True:
        if os.path.isdir(os.path.join(here, "programs")):
            return here
        up = os.path.dirname(here)
        if up == here:
            return None
        here = up


def resolved(path):
    """`path` with its links followed, or None where one on the way cannot be read (a link to
    /proc/1/root: EACCES, which os.path.realpath raises rather than stops at)."""
    try:
        return os.path.realpath(path)
    except OSError:
        return None


def env_roots(root="."):
    """The roots LOGOS_ROOTS names (os.pathsep between folders), each resolved (one that cannot be
    is none: the defaults' check says so, naming it)."""
    got = (resolved(os.path.join(root, x)) for x in os.environ.get(ROOTS_ENV, "").split(os.pathsep)
           if x and "\0" not in x and path_bytes(x) <= PATH_BYTES)
    return tuple(r for r in got if r is not None)


def _named_roots(zoo):
    """The `roots:` of the zoo's programs/defaults.yaml (read as every config is: its size, its
    nesting and its aliases bounded), resolved; () when it names none or is refused (the config's
    own check reports that, naming its line)."""
    path = os.path.join(zoo, "programs", "defaults.yaml")
    if not os.path.isfile(path):
        return ()
    from ..yamlfile import ConfigError, load_yaml
    try:
        v = load_yaml(path)[0].get("roots", ())
    except ConfigError:
        return ()
    v = [v] if isinstance(v, str) else v
    if not isinstance(v, list) or not all(isinstance(x, str) and x and "\0" not in x
                                          and path_bytes(x) <= PATH_BYTES for x in v):
        return ()   # (no longer than a path can be: the config's check says so)
    return tuple(r for r in (resolved(os.path.join(zoo, x)) for x in v) if r is not None)


def root_problem(repo, r):
    """Why the resolved folder `r` cannot be a root of the repository at (resolved) `repo`, or
    None: a root is a shared folder outside the repository, which neither holds it (`/`: its
    build/ and every file of the machine would be in reach) nor lies inside it."""
    if r == repo or repo.startswith(r.rstrip("/") + "/"):
        return "holds the repository (a root is a shared folder outside it)"
    if r.startswith(repo.rstrip("/") + "/"):
        return "is inside the repository (a path there needs no root)"
    return None


def allowed_roots(weights_dir):
    """The resolved folders a weight file of `weights_dir` may link into: the repository the
    folder is in (and the one this process runs in), with its named roots (none that holds the
    repository or lies in it: the config's check refuses those)."""
    out = []
    for zoo in dict.fromkeys(z for z in (find_zoo_root(weights_dir), find_zoo_root(os.getcwd())) if z):
        repo = os.path.realpath(zoo)
        out += [repo, *(r for r in (*_named_roots(zoo), *env_roots(zoo)) if root_problem(repo, r) is None)]
    return tuple(dict.fromkeys(out or env_roots()))


def under(path, roots):
    """Whether the resolved `path` is one of `roots` or inside one."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _outside(weights_dir, fname, roots=None):
    """(target, roots) where `weights_dir/fname` links outside its folder and every allowed root
    (`roots`, resolved here when None) or into the zoo's build/ (target None: through a link that
    cannot be read), else None."""
    path = os.path.join(weights_dir, fname)
    if os.sep not in fname and "/" not in fname and not os.path.islink(path):
        return None   # an entry of the folder itself, no link: it resolves inside the folder
    target = resolved(path)
    if target is not None and os.path.dirname(target) == os.path.realpath(weights_dir):
        return None
    roots = allowed_roots(weights_dir) if roots is None else roots
    if target is None:   # (a link on the way that cannot be read: followed nowhere)
        return None, roots
    return None if under(target, roots) and not _in_build(weights_dir, target) else (target, roots)


def _in_build(weights_dir, target):
    """Whether the resolved `target` is in the build/ of the zoo `weights_dir` is in (what runs
    rewrite: another program's output)."""
    zoo = find_zoo_root(weights_dir)
    return bool(zoo) and under(target, [os.path.join(os.path.realpath(zoo), "build")])


def refused_links(weights_dir, names):
    """The names among `names` (files of `weights_dir`) whose link the lock refuses: what a check's
    key holds of the roots, so naming or dropping a root moves the key of the checks it decides."""
    roots = allowed_roots(weights_dir)
    return sorted(n for n in names if _outside(weights_dir, n, roots))


def refused_link(weights_dir, fname):
    """Why `weights_dir/fname`, a link out of its folder, may not be followed, or None when it may."""
    out = _outside(weights_dir, fname)
    if out is None:
        return None
    target, roots = out
    if target is None:
        target = f"{os.path.join(weights_dir, fname)}, through a link that cannot be read"
    elif _in_build(weights_dir, target):
        return (f"`{fname}` links into the zoo's build/, to `{target}`, which a run rewrites (another "
                "program's output): a weights file is the author's; copy it in")
    return (f"`{fname}` links outside the weights directory, to `{target}`, which is outside the "
            f"repository and every named root ({', '.join(roots) or 'none'}); copy the file in, or "
            f"name its folder in programs/defaults.yaml `roots:` or {ROOTS_ENV}")
