"""Program build configs: discovery of `programs/NAME.logos` + `NAME.yaml`, defaults, validation.

A config is data a stranger may have written, so it is read with `yaml.safe_load` and every key is
checked before any task uses it (`config_keys.py`): an unknown key, a wrong type, a name that is not
a plain file name or a path that leaves the repository (and every shared root `roots:` or
LOGOS_ROOTS names) is a `ConfigError` naming the file, line and key; all of one file's refusals are
reported together. Discovery never raises for one program's config: the error is kept on that
program, so only its tasks fail.
"""

from __future__ import annotations   # (annotations unevaluated: `typing` is not loaded)

import os
import stat
import re
from dataclasses import dataclass, field

from ..language.errors import excerpt
from .names import NAME_RE, slug
from ..verify.memory import default_tensor_bytes
from ..verify.tolerances import DEFAULT_TOLERANCES
from .config_keys import (Problems, check_bf16, check_common, check_derive, check_precision,
                          check_weights, env_roots, leaves_message)
from ..verify.links import ROOTS_ENV, resolved, root_problem
from .paths import Tree, in_build, inside
from ..yamlfile import ConfigError, ConfigErrors, ParseCache, load_yaml

DEFAULTS_FILE = "defaults.yaml"


# What one program may cost, each raised per program (or zoo-wide in defaults.yaml) under `limits:`.
LIMITS = {
    "tensor_bytes": default_tensor_bytes(),   # every tensor of the program in float64, checked at read
    "seconds": 3600,                        # wall time of one lock check, and of one import
    "steps": 100_000,                       # the largest `steps:`
    "program_bytes": 8 << 20,               # the program file (gemma3's: 141 KiB)
    "sentences": 50_000,                    # its sentences: tensors, fills, ops (gemma3: 3734)
    "trace_bytes": 16 << 20,                # weights (float64) from which a VM trace is stored
}
BUILTIN = {
    "lock": True,
    "dtypes": ["float64", "float32"],
    "steps": 1,
    "tolerances": DEFAULT_TOLERANCES,
    "limits": LIMITS,
}
PROGRAM_KEYS = ("weights", "lock", "dtypes", "steps", "tolerances", "derive", "allow_nonfinite",
                "limits", "precision", "bf16")
LEAF_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEFAULT_KEYS = ("lock", "dtypes", "steps", "tolerances", "limits", "roots")
DERIVE_KEYS = ("importer", "checkpoint", "sha256")


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
    lock: bool = True
    dtypes: list = field(default_factory=list)
    steps: int = 1
    tolerances: dict = field(default_factory=dict)
    derive: Optional[Derive] = None
    allow_nonfinite: list = field(default_factory=list)   # leaves whose files may hold NaN/Inf
    limits: dict = field(default_factory=lambda: dict(LIMITS))
    precision: Optional[dict] = None      # the bf16 precision policy's overrides (a bf16 lock: {})
    bf16: dict = field(default_factory=dict)   # the bf16 gate's bound overrides
    error: Optional[str] = None           # a config error: this program's tasks fail with it

    def tolerance(self, dtype):
        t = self.tolerances.get(dtype, {})
        return t.get("abs"), t.get("rel")


def _finish(p, value=None):
    """`value`, or every refusal `p` kept (in file order) as one ConfigError, holding `value` as
    far as it was read (`partial`: a program's dtypes and `lock`, so its checks are still rows)."""
    if not p.errors:
        return value
    e = p.errors[0] if len(p.errors) == 1 else \
        ConfigErrors(sorted(p.errors, key=lambda e: (e.path != p.path, e.line or 0)))
    e.partial = value
    raise e


def load_defaults(root, programs_dir="programs", cache=None):
    """The zoo-wide defaults: the built-in ones updated by `programs/defaults.yaml` if present;
    `roots` are the folders it and LOGOS_ROOTS name."""
    merged = load_defaults_builtin(root)
    for x in os.environ.get(ROOTS_ENV, "").split(os.pathsep):
        if x and "\0" not in x and resolved(os.path.join(root, x)) is None:
            raise ConfigError(f"names `{excerpt(x, 120)}`, which cannot be resolved (a link on the way cannot be "
                              "read)", None, ROOTS_ENV)
    for r in merged["roots"]:   # (LOGOS_ROOTS: held to the rule `roots:` is)
        why = root_problem(os.path.realpath(root), r)
        if why:
            raise ConfigError(f"names `{excerpt(r, 120)}`, which {why}", None, ROOTS_ENV)
    path = os.path.join(programs_dir, DEFAULTS_FILE)
    full = os.path.join(root, path)
    if not os.path.lexists(full):
        return merged
    if not os.path.isfile(full):   # a link whose target is gone: never read as no defaults
        raise ConfigError(f"cannot read the config: {_unreadable(full)}", None, path)
    if inside(root, path, None, merged["roots"]) is None:
        raise _linked_out(path, merged["roots"])
    data, lines = load_yaml(full, path, cache)
    p = Problems(path, lines)
    given = check_common(p, data, DEFAULT_KEYS, LIMITS, root)
    _finish(p)
    tol = given.pop("tolerances", {})
    merged["limits"] = {**merged["limits"], **given.pop("limits", {})}
    merged["roots"] = tuple(dict.fromkeys(given.pop("roots", ()) + merged["roots"]))
    merged.update(given)
    merged["tolerances"] = {**merged["tolerances"], **{k: {**merged["tolerances"].get(k, {}), **v}
                                                       for k, v in tol.items()}}
    return merged


def load_program(root, name, defaults, programs_dir="programs", tree=None, cache=None):
    """One program's config, validated (raises ConfigError, every refusal of the file in one);
    `tree` as for `inside`, `cache` a ParseCache or None."""
    tree = tree or Tree(root)
    roots = defaults.get("roots", ())
    source = f"{programs_dir}/{name}.logos"
    cfg_rel = f"{programs_dir}/{name}.yaml"
    cfg_path = os.path.join(root, cfg_rel)
    has_cfg = tree.is_file(programs_dir, f"{name}.yaml")
    if not NAME_RE.fullmatch(name):
        raise ConfigError(f"`{excerpt(name, 60)}` is not a plain program name (a letter or digit, then "
                          "letters, digits, _ and -, at most 128 in all)", None,
                          excerpt(cfg_rel if has_cfg else source, 200))
    if name == DEFAULTS_FILE[:-len(".yaml")]:   # its config would be every program's
        raise ConfigError(f"a program cannot be named `{name}`: {programs_dir}/{DEFAULTS_FILE} is the "
                          "zoo-wide config, not its own; rename the program", None, source)
    if inside(root, source, tree, roots) is None:
        raise ConfigError(f"{leaves_message(source, roots)} (a link?)", None, source)
    if not tree.is_file(programs_dir, f"{name}.logos"):
        raise ConfigError(f"cannot read the program: {_unreadable(os.path.join(root, source))}", None, source)
    if not has_cfg and f"{name}.yaml" in tree.entries(programs_dir):
        raise ConfigError(f"cannot read the config: {_unreadable(cfg_path)}", None, cfg_rel)
    if has_cfg and inside(root, cfg_rel, tree, roots) is None:
        raise _linked_out(cfg_rel, roots)
    data, lines = load_yaml(cfg_path, cfg_rel, cache) if has_cfg else ({}, {})
    p = Problems(cfg_rel, lines)
    given = check_common(p, data, PROGRAM_KEYS, LIMITS, root)
    pc = ProgramConfig(name=name, source=source, config=cfg_rel if has_cfg else None,
                       weights=None, lock=defaults["lock"],
                       dtypes=list(defaults["dtypes"]), steps=defaults["steps"],
                       tolerances={k: dict(v) for k, v in defaults["tolerances"].items()},
                       limits={**defaults["limits"], **given.get("limits", {})})
    for k in ("lock", "dtypes", "steps"):
        if k in given:
            setattr(pc, k, given[k])
    if pc.steps > pc.limits["steps"]:
        p.add("steps", f"{pc.steps} steps is over the limit of {pc.limits['steps']} (raise "
              "`limits: {steps: N}` if this program needs more)")
    for dt, v in given.get("tolerances", {}).items():
        pc.tolerances[dt] = {**pc.tolerances.get(dt, {}), **v}
    if "precision" in data:
        pc.precision = p.check(check_precision, p, data["precision"])
    elif "bfloat16" in pc.dtypes:
        pc.precision = {}
    if "bf16" in data:
        pc.bf16 = p.check(check_bf16, p, data["bf16"]) or {}
    if "allow_nonfinite" in data:
        names = data["allow_nonfinite"]
        bad = [n for n in names if not (isinstance(n, str) and LEAF_RE.fullmatch(n))] \
            if isinstance(names, list) else [names]
        if bad:
            p.add("allow_nonfinite", "must be a list of leaf names whose files may hold NaN or Inf, "
                  f"got {excerpt(repr(bad[0]), 60)}" + (" among them" if isinstance(names, list) else ""))
        else:
            pc.allow_nonfinite = sorted(set(names))
    if "derive" in data:
        got = p.check(check_derive, p, data["derive"], DERIVE_KEYS, root, tree, roots)
        if "weights" in data:
            p.add("weights", "a derived program's weights are build/weights/NAME")
        if got:
            pc.derive = Derive(*got)
        pc.weights = f"build/weights/{name}"
    elif "weights" in data:
        pc.weights = p.check(check_weights, p, data["weights"], root, tree, roots)
    else:
        default = f"weights/{name}"
        pc.weights = default if tree.is_dir("weights", name) else None
        if pc.weights is None and name in tree.entries("weights"):   # (read as none: a misleading error)
            p.errors.append(ConfigError(f"`{default}` is there but is not a folder of weights "
                                        f"({_not_folder(os.path.join(root, default))})", None, source))
        rel = pc.weights and inside(root, default, tree, roots)
        if pc.weights and rel is None:
            p.errors.append(ConfigError(f"{leaves_message(default, roots)} (a link?)", None,
                                        cfg_rel if has_cfg else source))
        elif rel and in_build(rel):
            p.errors.append(ConfigError(f"`{default}` is a link under build/, which a run rewrites (derived "
                                        "weights are made there by `derive:`)", None, cfg_rel if has_cfg else source))
    return _finish(p, pc)


def _linked_out(rel, roots):
    """The ConfigError of a config that is a link out of the repository and every root."""
    return ConfigError(f"`{rel}` is a link that {leaves_message(rel, roots).split(' ', 1)[1]}", None, rel)


def _not_folder(path):
    """What `path`, listed but no folder, is."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"a link to {excerpt(os.readlink(path), 120)}: {e.strerror}" if os.path.islink(path) else e.strerror
    return "a file" if stat.S_ISREG(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a folder"


def _unreadable(path):
    """Why `path`, listed but not a file, cannot be read as one (a link whose target is gone, a
    link in a loop, a fifo)."""
    try:
        os.stat(path)
    except OSError as e:
        return f"{e.strerror} (a link to {excerpt(os.readlink(path), 120)})" if os.path.islink(path) else e.strerror
    return "it is a folder" if os.path.isdir(path) else "it is not a regular file"


def stray_configs(files, names, programs_dir="programs"):
    """The warnings of a programs folder's files that no run reads: a YAML file with no program
    beside it (`names`: the programs of `files`, the folder's entries), a `.yml` one, a hidden
    `.NAME.logos` (not an editor's `.#NAME.logos` lock)."""
    orphans = {f[:-5] for f in files if f.endswith(".yaml") and f != DEFAULTS_FILE} - set(names)
    return [f"{programs_dir}/{excerpt(n, 80)}.yaml: a config with no program beside it (no "
            f"{programs_dir}/{excerpt(n, 80)}.logos): ignored" for n in sorted(orphans)] + \
           [f"{programs_dir}/{excerpt(f, 80)}: not read (a config is NAME.yaml, {DEFAULTS_FILE} the "
            f"zoo's): rename it to {excerpt(f[:-4], 80)}.yaml" for f in sorted(files) if f.endswith(".yml")] + \
           [f"{programs_dir}/{excerpt(f, 80)}: a hidden file is not a program: ignored" for f in sorted(files)
            if f.endswith(".logos") and f.startswith(".") and not f.startswith(".#")]


def discover(root, programs_dir="programs", cache_file=None, warnings=None, makes=None):
    """Every program of the zoo, sorted by name; a bad config is kept as `error`, never raised.

    A YAML file with no program beside it (a renamed or deleted program's) is a warning appended
    to `warnings`, never a failure. `cache_file` (a path under build/) keeps the configs' parses
    between runs; `makes(path)` says whether a task of the run makes a path a config names (then
    it need not be there yet)."""
    tree = Tree(root, makes)
    cache = ParseCache(cache_file) if cache_file else None
    files = tree.entries(programs_dir)
    # every entry a program's name (a link whose target is gone, a folder: an error row, never
    # left out); hidden ones (an editor's `.#NAME.logos` lock link) are not programs
    names = {f[:-6] for f in files if f.endswith(".logos") and not f.startswith(".")}
    if warnings is not None:
        warnings += stray_configs(files, names, programs_dir)
    try:
        defaults = load_defaults(root, programs_dir, cache)
        default_error = None
    except ConfigError as e:
        defaults, default_error = load_defaults_builtin(root), str(e)
    out = []
    for name in sorted(names):
        source = f"{programs_dir}/{name}.logos"
        cfg = f"{programs_dir}/{name}.yaml"
        try:
            if default_error:
                raise ConfigError(default_error)
            pc = load_program(root, name, defaults, programs_dir, tree, cache)
        except ConfigError as e:
            plain = NAME_RE.fullmatch(name) is not None
            read = getattr(e, "partial", None) if isinstance(getattr(e, "partial", None), ProgramConfig) else None
            pc = ProgramConfig(name=slug(name), source=source if plain else excerpt(source, 200),
                               config=cfg if plain and tree.is_file(programs_dir, f"{name}.yaml") else None,
                               weights=None, lock=read.lock if read else defaults["lock"],
                               dtypes=list(read.dtypes if read else defaults["dtypes"]), steps=1,
                               tolerances=defaults["tolerances"], limits=dict(defaults["limits"]),
                               error=str(e) if not default_error else default_error)
        out.append(pc)
    if cache:
        cache.save()
    return out


def load_defaults_builtin(root="."):
    """The built-in defaults, with the roots LOGOS_ROOTS names."""
    return {**{k: (dict(v) if isinstance(v, dict) else v) for k, v in BUILTIN.items()},
            "roots": env_roots(root)}
