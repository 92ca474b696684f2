"""Program build configs: discovery of `programs/NAME.logos` + `NAME.yaml`, defaults, validation.

A config is data a stranger may have written, so it is read with `yaml.safe_load` and every key is
checked before any task uses it: an unknown key, a wrong type, a name that is not a plain file name
or a path that leaves the repository is a `ConfigError` naming the file, line and key. Discovery
never raises for one program's config: the error is kept on that program, so only its tasks fail.
"""

import functools
import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from typing import Optional

from .errors import ProgramError
from .files import StampedCache

DEFAULTS_FILE = "defaults.yaml"
DTYPES = ("float64", "float32")
# float32 follows the lock's own defaults (CONTRACTS.md); float64 is the VM's own precision.
BUILTIN = {
    "lock": True,
    "dtypes": ["float64", "float32"],
    "steps": 1,
    "tolerances": {"float32": {"abs": 1e-4, "rel": 1e-3}, "float64": {"abs": 1e-9, "rel": 1e-9}},
}
PROGRAM_KEYS = ("weights", "lock", "dtypes", "steps", "tolerances", "derive")
DEFAULT_KEYS = ("lock", "dtypes", "steps", "tolerances")
DERIVE_KEYS = ("importer", "checkpoint")
# A program name becomes a task name (`emit:NAME`), a directory under build/ and a JUnit class name.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
IMPORTER_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")
MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class ConfigError(ProgramError):
    """A refused config: `PATH:LINE: `key`: message`."""


@dataclass
class Derive:
    importer: str
    checkpoint: str          # as written in the config
    checkpoint_path: str     # the resolved file (repo-relative, or absolute inside a package)


@dataclass
class ProgramConfig:
    """One program's resolved build settings (paths relative to the repository root)."""
    name: str
    source: str
    config: Optional[str]                 # programs/NAME.yaml, or None when there is none
    weights: Optional[str]                # weights directory, or None: declared values only
    weights_required: bool                # the config named it, so it must exist
    lock: bool = True
    dtypes: list = field(default_factory=list)
    steps: int = 1
    tolerances: dict = field(default_factory=dict)
    derive: Optional[Derive] = None
    error: Optional[str] = None           # a config error: this program's tasks fail with it

    def tolerance(self, dtype):
        t = self.tolerances.get(dtype, {})
        return t.get("abs"), t.get("rel")


@functools.lru_cache(maxsize=None)
def _yaml():
    """(yaml, loader class), imported on first use: a no-op run whose configs all come from the
    parse cache never loads PyYAML. libyaml's safe loader where PyYAML was built with it (the same
    safe constructors, in C), else the pure-Python one; either refuses a key written twice in one
    mapping (YAML would keep the last silently, so `steps: 1` above `steps: 3` would pass)."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):
        def construct_mapping(self, node, deep=False):
            keys = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in keys:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"the key `{key.value}` is given twice", key.start_mark)
                    keys.add(key.value)
            return super().construct_mapping(node, deep)

    return yaml, Loader


def _key_lines(text):
    """Top-level (and one level down) key -> 1-based line, for errors that point at the key."""
    yaml, loader = _yaml()
    lines = {}
    try:
        node = yaml.compose(text, Loader=loader)
    except yaml.YAMLError:
        return lines
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            lines[str(k.value)] = k.start_mark.line + 1
            if isinstance(v, yaml.MappingNode):
                for k2, _ in v.value:
                    lines[f"{k.value}.{k2.value}"] = k2.start_mark.line + 1
    return lines


class ParseCache(StampedCache):
    """Parsed configs kept under build/ by the sha256 of their text: a no-op run of a
    thousand-config zoo reads each file but parses none and never imports PyYAML. Only a value
    that JSON gives back exactly, key order included, is kept (a date or an integer key is parsed
    every time), so a hit is what parsing would give, errors and their order too."""

    VERSION = 3   # a cache another version wrote (v1 sorted the keys) is not read

    def __init__(self, path):
        super().__init__(path, self.VERSION)

    def get(self, rel, digest):
        data = super().get(rel, digest)
        return data if isinstance(data, dict) else None

    def put(self, rel, digest, data):
        try:
            text = json.dumps(data)
        except (TypeError, ValueError):
            return
        if json.dumps(json.loads(text)) == text:   # same types, same key order
            super().put(rel, digest, data)


def load_yaml(path, shown=None, cache=None):
    """(mapping, key lines) of a YAML file; an empty file is an empty mapping. Errors name the
    file as `shown` (its repo-relative path); `cache` is a ParseCache or None."""
    shown = shown or path
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the config: {e}", None, shown) from None
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest() if cache else None
    data = cache.get(shown, digest) if cache else None
    if data is not None:
        return data, _KeyLines(text)
    yaml, loader = _yaml()
    try:
        data = yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError(f"not valid YAML: {getattr(e, 'problem', None) or e}",
                          mark.line + 1 if mark else None, shown) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"a config is a mapping of keys, got {type(data).__name__}", 1, shown)
    if cache:
        cache.put(shown, digest, data)
    return data, _KeyLines(text)


class _KeyLines:
    """Key -> line, worked out only when an error asks (most configs are fine, and composing the
    YAML a second time for every one of a thousand would be wasted)."""

    def __init__(self, text):
        self.text, self.lines = text, None

    def get(self, key):
        if self.lines is None:
            self.lines = _key_lines(self.text)
        return self.lines.get(key)


def _err(path, lines, key, message):
    return ConfigError(f"`{key}`: {message}", lines.get(key), path)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Tree:
    """What one discovery has learned of the repository: resolved directories and one listing per
    directory, so each of a zoo's thousand programs costs a dictionary lookup, not a path walk."""

    def __init__(self, root):
        self.root = root
        self._real, self._dirs = {}, {}

    def real(self, path):
        if path not in self._real:
            self._real[path] = os.path.realpath(path)
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
        e = self.entries(rel_dir).get(name)
        return e is not None and e.is_file()

    def is_dir(self, rel_dir, name):
        e = self.entries(rel_dir).get(name)
        return e is not None and e.is_dir()


def inside(root, rel, tree=None):
    """The repo-relative normal form of `rel`, or None if it leaves `root` (symlinks followed).

    `tree` (a Tree of `root`) caches what earlier calls of one discovery resolved."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        return None
    tree = tree or Tree(root)
    root_real = tree.real(root)
    parts = rel.split("/")
    if ".." in parts:
        full = os.path.realpath(f"{root_real}/{rel}")   # `..` may follow a link: walk it all
    else:
        parent = "/".join(p for p in parts[:-1] if p not in ("", "."))
        full = tree.real(f"{root_real}/{parent}") if parent else root_real
        leaf = parts[-1]
        if leaf not in ("", "."):
            full = f"{full}/{leaf}"
            entry = tree.entries(parent or ".").get(leaf)
            # not listed (an unreadable folder, a name that differs in case, a missing file) or a
            # link: what the listing cannot vouch for is resolved in full
            if entry is None or entry.is_symlink():
                full = os.path.realpath(full)
    if full == root_real:
        return "."
    prefix = root_real.rstrip("/") + "/"
    return full[len(prefix):] if full.startswith(prefix) else None


def resolve_package_file(spec):
    """`MOD/rel/path` -> the absolute path of that file inside the installed package MOD."""
    mod, _, rel = spec.partition("/")
    if not MODULE_RE.fullmatch(mod) or not rel:
        raise ValueError(f"`package:{spec}` must be `package:MODULE/relative/path`")
    try:
        found = importlib.util.find_spec(mod)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ValueError(f"package `{mod}` is not installed")
    if found.submodule_search_locations:
        base = list(found.submodule_search_locations)[0]
    elif found.origin:
        base = os.path.dirname(found.origin)
    else:
        raise ValueError(f"package `{mod}` has no files on disk")
    if os.path.isabs(rel):
        raise ValueError(f"`{rel}` must be relative to the package")
    base = os.path.realpath(base)
    full = os.path.realpath(os.path.join(base, rel))
    if not full.startswith(base + os.sep):
        raise ValueError(f"`{rel}` leaves the package `{mod}`")
    if not os.path.isfile(full):
        raise ValueError(f"`{rel}` is not a file in package `{mod}` ({base})")
    return full


def _check_common(data, path, lines, allowed):
    for key in data:
        if key not in allowed:
            raise _err(path, lines, key, f"unknown key (known: {', '.join(allowed)})")
    out = {}
    if "lock" in data:
        if not isinstance(data["lock"], bool):
            raise _err(path, lines, "lock", f"must be true or false, got {data['lock']!r}")
        out["lock"] = data["lock"]
    if "dtypes" in data:
        d = data["dtypes"]
        if isinstance(d, str):
            d = [d]
        if not isinstance(d, list) or not d or not all(isinstance(x, str) for x in d):
            raise _err(path, lines, "dtypes", f"must be a non-empty list of {', '.join(DTYPES)}")
        for x in d:
            if x not in DTYPES:
                raise _err(path, lines, "dtypes", f"`{x}` is not one of {', '.join(DTYPES)}")
        if len(set(d)) != len(d):
            raise _err(path, lines, "dtypes", "lists a dtype twice")
        out["dtypes"] = list(d)
    if "steps" in data:
        if not _is_int(data["steps"]) or data["steps"] < 1:
            raise _err(path, lines, "steps", f"must be a positive integer, got {data['steps']!r}")
        out["steps"] = data["steps"]
    if "tolerances" in data:
        t = data["tolerances"]
        if not isinstance(t, dict):
            raise _err(path, lines, "tolerances", "must map a dtype to {abs: A, rel: R}")
        tol = {}
        for dt, v in t.items():
            key = f"tolerances.{dt}"
            if dt not in DTYPES:
                raise _err(path, lines, key, f"`{dt}` is not one of {', '.join(DTYPES)}")
            if not isinstance(v, dict):
                raise _err(path, lines, key, "must be {abs: A, rel: R}")
            for k, x in v.items():
                if k not in ("abs", "rel"):
                    raise _err(path, lines, key, f"unknown key `{k}` (known: abs, rel)")
                if not _is_num(x) or not x >= 0 or x == float("inf"):
                    raise _err(path, lines, key, f"`{k}` must be a finite number >= 0, got {x!r}")
            tol[dt] = {k: float(x) for k, x in v.items()}
        out["tolerances"] = tol
    return out


def load_defaults(root, programs_dir="programs", cache=None):
    """The zoo-wide defaults: the built-in ones updated by `programs/defaults.yaml` if present."""
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BUILTIN.items()}
    path = os.path.join(programs_dir, DEFAULTS_FILE)
    if not os.path.isfile(os.path.join(root, path)):
        return merged
    data, lines = load_yaml(os.path.join(root, path), path, cache)
    given = _check_common(data, path, lines, DEFAULT_KEYS)
    tol = given.pop("tolerances", {})
    merged.update(given)
    merged["tolerances"] = {**merged["tolerances"], **{k: {**merged["tolerances"].get(k, {}), **v}
                                                       for k, v in tol.items()}}
    return merged


def load_program(root, name, defaults, programs_dir="programs", tree=None, cache=None):
    """One program's config, validated (raises ConfigError); `tree` as for `inside`, `cache` a
    ParseCache or None."""
    tree = tree or Tree(root)
    source = f"{programs_dir}/{name}.logos"
    cfg_rel = f"{programs_dir}/{name}.yaml"
    cfg_path = os.path.join(root, cfg_rel)
    has_cfg = tree.is_file(programs_dir, f"{name}.yaml")
    if not NAME_RE.fullmatch(name):
        raise ConfigError(f"`{name}` is not a plain program name (letters, digits, _ and -)",
                          None, cfg_rel if has_cfg else source)
    if inside(root, source, tree) != source:
        raise ConfigError(f"`{source}` leaves the repository (a link?)", None, source)
    data, lines = load_yaml(cfg_path, cfg_rel, cache) if has_cfg else ({}, {})
    given = _check_common(data, cfg_rel, lines, PROGRAM_KEYS)
    pc = ProgramConfig(name=name, source=source, config=cfg_rel if has_cfg else None,
                       weights=None, weights_required=False, lock=defaults["lock"],
                       dtypes=list(defaults["dtypes"]), steps=defaults["steps"],
                       tolerances={k: dict(v) for k, v in defaults["tolerances"].items()})
    for k in ("lock", "dtypes", "steps"):
        if k in given:
            setattr(pc, k, given[k])
    for dt, v in given.get("tolerances", {}).items():
        pc.tolerances[dt] = {**pc.tolerances.get(dt, {}), **v}
    if "derive" in data:
        d = data["derive"]
        if not isinstance(d, dict):
            raise _err(cfg_rel, lines, "derive", "must be {importer: NAME, checkpoint: PATH}")
        for k in d:
            if k not in DERIVE_KEYS:
                raise _err(cfg_rel, lines, f"derive.{k}", f"unknown key (known: {', '.join(DERIVE_KEYS)})")
        imp, ck = d.get("importer"), d.get("checkpoint")
        if not isinstance(imp, str) or not IMPORTER_RE.fullmatch(imp):
            raise _err(cfg_rel, lines, "derive.importer" if "importer" in d else "derive",
                       f"must name an importer (`python -m emitter import-NAME`), got {imp!r}")
        from .cli import COMMANDS   # only a derived program pays for the command table
        known = sorted(c[len("import-"):] for c in COMMANDS if c.startswith("import-"))
        if imp not in known:
            raise _err(cfg_rel, lines, "derive.importer",
                       f"`{imp}` is not an importer (known: {', '.join(known)})")
        if not isinstance(ck, str) or not ck:
            raise _err(cfg_rel, lines, "derive.checkpoint" if "checkpoint" in d else "derive",
                       "must be `package:MODULE/path` or a repository path")
        if ck.startswith("package:"):
            try:
                resolved = resolve_package_file(ck[len("package:"):])
            except ValueError as e:
                raise _err(cfg_rel, lines, "derive.checkpoint", str(e)) from None
        else:
            resolved = inside(root, ck, tree)
            if resolved is None:
                raise _err(cfg_rel, lines, "derive.checkpoint", f"`{ck}` leaves the repository")
            if not os.path.isfile(os.path.join(root, resolved)):
                raise _err(cfg_rel, lines, "derive.checkpoint", f"`{ck}` is not a file")
        if "weights" in data:
            raise _err(cfg_rel, lines, "weights", "a derived program's weights are build/weights/NAME")
        pc.derive = Derive(imp, ck, resolved)
        pc.weights, pc.weights_required = f"build/weights/{name}", True
    elif "weights" in data:
        w = data["weights"]
        if not isinstance(w, str) or not w:
            raise _err(cfg_rel, lines, "weights", f"must be a directory path, got {w!r}")
        rel = inside(root, w, tree)
        if rel is None or rel == "." or rel == "build" or rel.startswith("build/"):
            raise _err(cfg_rel, lines, "weights", f"`{w}` leaves the repository (or is build/)")
        pc.weights, pc.weights_required = rel, True
    else:
        default = f"weights/{name}"
        pc.weights = default if tree.is_dir("weights", name) else None
        if pc.weights and inside(root, default, tree) != default:
            raise ConfigError(f"`{default}` leaves the repository (a link?)", None, cfg_rel if has_cfg
                              else source)
    return pc


def discover(root, programs_dir="programs", cache_file=None):
    """Every program of the zoo, sorted by name; a bad config is kept as `error`, never raised.

    A YAML file with no program beside it is reported as an error entry of that name too, so a
    renamed program's stale config does not pass silently. `cache_file` (a path under build/)
    keeps the configs' parses between runs."""
    tree = Tree(root)
    cache = ParseCache(cache_file) if cache_file else None
    files = tree.entries(programs_dir)
    names = {f[:-6] for f, e in files.items() if f.endswith(".logos") and e.is_file()}
    orphans = {f[:-5] for f in files if f.endswith(".yaml") and f != DEFAULTS_FILE} - names
    try:
        defaults = load_defaults(root, programs_dir, cache)
        default_error = None
    except ConfigError as e:
        defaults, default_error = load_defaults_builtin(), str(e)
    out = []
    for name in sorted(names | orphans):
        source = f"{programs_dir}/{name}.logos"
        cfg = f"{programs_dir}/{name}.yaml"
        try:
            if default_error:
                raise ConfigError(default_error)
            if name in orphans:
                raise ConfigError("a config with no program beside it "
                                  f"(expected {source})", None, cfg)
            pc = load_program(root, name, defaults, programs_dir, tree, cache)
        except ConfigError as e:
            pc = ProgramConfig(name=name, source=source,
                               config=cfg if tree.is_file(programs_dir, f"{name}.yaml") else None,
                               weights=None, weights_required=False, lock=defaults["lock"],
                               dtypes=list(defaults["dtypes"]), steps=defaults["steps"],
                               tolerances=defaults["tolerances"], error=str(e) if not default_error
                               else default_error)
        out.append(pc)
    if cache:
        cache.save()
    return out


def load_defaults_builtin():
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in BUILTIN.items()}
