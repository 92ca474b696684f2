"""Program build configs: discovery of `programs/NAME.logos` + `NAME.yaml`, defaults, validation.

A config is data a stranger may have written, so it is read with `yaml.safe_load` and every key is
checked before any task uses it: an unknown key, a wrong type, a name that is not a plain file name
or a path that leaves the repository is a `ConfigError` naming the file, line and key. Discovery
never raises for one program's config: the error is kept on that program, so only its tasks fail.
"""

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Optional

from ..importers import IMPORTERS, chunked_spec, chunks, resolve_package_file
from ..language.errors import excerpt
from ..verify.tolerances import DEFAULT_TOLERANCES, DTYPES
from .paths import Tree, inside
from .yamlfile import ConfigError, ParseCache, load_yaml

DEFAULTS_FILE = "defaults.yaml"
def _memory_bytes():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


# What one program may cost, each raised per program (or zoo-wide in defaults.yaml) under `limits:`.
LIMITS = {
    "tensor_bytes": _memory_bytes() // 2,   # every tensor of the program in float64, checked at read
    "seconds": 3600,                        # wall time of one lock check, and of one import
    "steps": 100_000,                       # the largest `steps:`
    "program_bytes": 64 << 20,              # the program file
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
BF16_KEYS = ("excess", "excess_other", "deviation", "z", "cosine", "margin_noise")
LEAF_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEFAULT_KEYS = ("lock", "dtypes", "steps", "tolerances", "limits")
DERIVE_KEYS = ("importer", "checkpoint", "sha256")
# A program name becomes a task name (`emit:NAME`), a directory under build/ and a JUnit class name.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
# A file name that is not a plain name goes by its slug: SLUG_PREFIX and the sha256 of the name.
# The `~` is in no plain name, so no slug is a plain name and no two programs share a task name
# (`invalid-<hex>` was itself a plain name: such a program beside the one it was the slug of made
# doit stop the whole run on a duplicated task). `~` is safe in a path component, a doit task name
# (doit refuses only `=`; `:` opens a sub-task), a shell word (not at its start) and a JUnit class
# name (a `.` would split it into a package); names keep the `invalid-` start that tools look for.
SLUG_PREFIX = "invalid-name~"
IMPORTER_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")


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
    allow_nonfinite: list = field(default_factory=list)   # leaves whose files may hold NaN/Inf
    limits: dict = field(default_factory=lambda: dict(LIMITS))
    precision: Optional[dict] = None      # the bf16 precision policy's overrides (a bf16 lock: {})
    bf16: dict = field(default_factory=dict)   # the bf16 gate's bound overrides
    error: Optional[str] = None           # a config error: this program's tasks fail with it

    def tolerance(self, dtype):
        t = self.tolerances.get(dtype, {})
        return t.get("abs"), t.get("rel")


def _chunks(spec, cfg_rel, lines):
    """Whether `spec` is a chunked checkpoint (each part installed), or the config error why not."""
    try:
        found = chunks(spec)
        for part in found[0] if found else ():
            resolve_package_file(part[len("package:"):])
    except ValueError as e:
        raise _err(cfg_rel, lines, "derive.checkpoint", str(e)) from None
    return found is not None


def _err(path, lines, key, message):
    return ConfigError(f"`{key}`: {message}", lines.get(key), path)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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
    if "limits" in data:
        lim = data["limits"]
        if not isinstance(lim, dict):
            raise _err(path, lines, "limits", f"must map a limit ({', '.join(LIMITS)}) to a number")
        for k, v in lim.items():
            if k not in LIMITS:
                raise _err(path, lines, f"limits.{k}", f"unknown limit (known: {', '.join(LIMITS)})")
            if not _is_int(v) or not 1 <= v <= 1 << 62:
                raise _err(path, lines, f"limits.{k}", f"must be a positive integer, got {excerpt(repr(v), 40)}")
        out["limits"] = dict(lim)
    if "steps" in data:
        if not _is_int(data["steps"]) or data["steps"] < 1:
            raise _err(path, lines, "steps", f"must be a positive integer, got {excerpt(repr(data['steps']), 40)}")
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
    merged["limits"] = {**merged["limits"], **given.pop("limits", {})}
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
        raise ConfigError(f"`{excerpt(name, 60)}` is not a plain program name (letters, digits, _ "
                          "and -, at most 128)", None, excerpt(cfg_rel if has_cfg else source, 200))
    if inside(root, source, tree) != source:
        raise ConfigError(f"`{source}` leaves the repository (a link?)", None, source)
    if has_cfg and inside(root, cfg_rel, tree) is None:
        raise ConfigError(f"`{cfg_rel}` is a link that leaves the repository", None, cfg_rel)
    data, lines = load_yaml(cfg_path, cfg_rel, cache) if has_cfg else ({}, {})
    given = _check_common(data, cfg_rel, lines, PROGRAM_KEYS)
    pc = ProgramConfig(name=name, source=source, config=cfg_rel if has_cfg else None,
                       weights=None, weights_required=False, lock=defaults["lock"],
                       dtypes=list(defaults["dtypes"]), steps=defaults["steps"],
                       tolerances={k: dict(v) for k, v in defaults["tolerances"].items()},
                       limits={**defaults["limits"], **given.get("limits", {})})
    for k in ("lock", "dtypes", "steps"):
        if k in given:
            setattr(pc, k, given[k])
    if pc.steps > pc.limits["steps"]:
        raise _err(cfg_rel, lines, "steps", f"{pc.steps} steps is over the limit of "
                   f"{pc.limits['steps']} (raise `limits: {{steps: N}}` if this program needs more)")
    for dt, v in given.get("tolerances", {}).items():
        pc.tolerances[dt] = {**pc.tolerances.get(dt, {}), **v}
    if "precision" in data:
        from ..ops.precision import check_policy   # (the op table loads numpy: only when asked)
        problems = check_policy(data["precision"])
        if problems:
            raise _err(cfg_rel, lines, "precision", "; ".join(problems))
        pc.precision = {k: tuple(v) for k, v in data["precision"].items()}
    elif "bfloat16" in pc.dtypes:
        pc.precision = {}
    if "bf16" in data:
        b = data["bf16"]
        if not isinstance(b, dict) or any(k not in BF16_KEYS for k in b) or not all(
                _is_num(v) or (k == "excess" and isinstance(v, dict) and all(_is_num(x) for x in v.values()))
                for k, v in b.items()):
            raise _err(cfg_rel, lines, "bf16", f"must map some of {', '.join(BF16_KEYS)} to numbers "
                       "(`excess` to {op: number})")
        pc.bf16 = dict(b)
    if "allow_nonfinite" in data:
        names = data["allow_nonfinite"]
        if not isinstance(names, list) or not all(isinstance(n, str) and LEAF_RE.fullmatch(n)
                                                  for n in names):
            raise _err(cfg_rel, lines, "allow_nonfinite",
                       f"must be a list of leaf names whose files may hold NaN or Inf, got {names!r}")
        pc.allow_nonfinite = sorted(set(names))
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
        known = sorted(IMPORTERS)
        if imp not in known:
            raise _err(cfg_rel, lines, "derive.importer",
                       f"`{imp}` is not an importer (known: {', '.join(known)})")
        if isinstance(ck, list) or "sha256" in d:     # chunks, joined by the importer
            sha = d.get("sha256")
            if not (isinstance(ck, list) and ck and all(isinstance(p, str) for p in ck)
                    and isinstance(sha, str)):
                raise _err(cfg_rel, lines, "derive.checkpoint" if "checkpoint" in d else "derive",
                           "a checkpoint in chunks is a list of `package:MODULE/path` parts, in "
                           "order, with `sha256:` the joined file's")
            ck = chunked_spec(ck, sha)
        if not isinstance(ck, str) or not ck:
            raise _err(cfg_rel, lines, "derive.checkpoint" if "checkpoint" in d else "derive",
                       "must be `package:MODULE/path` or a repository path")
        if _chunks(ck, cfg_rel, lines):
            resolved = ck       # the importer joins the parts: it is handed the spec
        elif ck.startswith("package:"):
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


def slug(name):
    """A program name safe as a task name and a path under build/: the name itself when it is a
    plain one, else SLUG_PREFIX and the whole sha256 of its text (any file name: not UTF-8,
    control characters), so a hostile name still gets its own tasks and error row. One to one: a
    slug is never a plain name, and the hash is of the name's UTF-8 with surrogates passed through
    (the bytes os.listdir could not decode, a lone surrogate), which tells any two names apart; a
    truncated digest would not (12 hex digits collide after ~2**24 tries)."""
    if NAME_RE.fullmatch(name):
        return name
    return SLUG_PREFIX + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()


def discover(root, programs_dir="programs", cache_file=None, warnings=None):
    """Every program of the zoo, sorted by name; a bad config is kept as `error`, never raised.

    A YAML file with no program beside it (a renamed or deleted program's) is a warning appended
    to `warnings`, never a failure. `cache_file` (a path under build/) keeps the configs' parses
    between runs."""
    tree = Tree(root)
    cache = ParseCache(cache_file) if cache_file else None
    files = tree.entries(programs_dir)
    names = {f[:-6] for f, e in files.items() if f.endswith(".logos") and e.is_file()}
    orphans = {f[:-5] for f in files if f.endswith(".yaml") and f != DEFAULTS_FILE} - names
    if warnings is not None:
        warnings += [f"{programs_dir}/{excerpt(n, 80)}.yaml: a config with no program beside it "
                     f"(no {programs_dir}/{excerpt(n, 80)}.logos): ignored" for n in sorted(orphans)]
    try:
        defaults = load_defaults(root, programs_dir, cache)
        default_error = None
    except ConfigError as e:
        defaults, default_error = load_defaults_builtin(), str(e)
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
            pc = ProgramConfig(name=slug(name), source=source if plain else excerpt(source, 200),
                               config=cfg if plain and tree.is_file(programs_dir, f"{name}.yaml") else None,
                               weights=None, weights_required=False, lock=defaults["lock"],
                               dtypes=list(defaults["dtypes"]), steps=1,
                               tolerances=defaults["tolerances"], limits=dict(defaults["limits"]),
                               error=str(e) if not default_error else default_error)
        out.append(pc)
    if cache:
        cache.save()
    return out


def load_defaults_builtin():
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in BUILTIN.items()}
