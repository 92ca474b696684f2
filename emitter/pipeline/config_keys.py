"""One validator per config key, and the collector that keeps every refusal of one config.

A config is checked key by key and each refusal is kept (`Problems`), so a user who fixes a config
sees all of its errors in one run, each at its YAML file:line, not one per run. A misspelt key,
dtype, limit or importer is answered with the nearest known one.
"""

import math
import os
import re

from ..importers import IMPORTERS, chunked_spec, chunks, declared_reads, resolve_package_file
from ..language.errors import excerpt
from ..language.hints import did_you_mean, unknown
from ..verify.links import (PATH_BYTES, ROOTS_ENV, env_roots, path_bytes,  # noqa: F401  (config reads env_roots here)
                            root_problem)
from ..verify.tolerances import DTYPES
from .paths import in_build, inside, resolved
from ..yamlfile import ConfigError

IMPORTER_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")
# the largest value a limit can take where 2**62 is more than its consumer can: seconds become a
# deadline (time.monotonic() + seconds) that the OS's timers hold: a year is past any real check
LIMIT_MAX = {"seconds": 366 * 24 * 3600}


class Problems:
    """The refusals of one config file, in file order: `add` keeps one, `check` runs a validator
    and keeps its refusal instead of stopping at it."""

    def __init__(self, path, lines):
        self.path, self.lines, self.errors = path, lines, []

    def error(self, key, message):
        """A refusal of `key` (dotted: `bf16.excess.matmul`) at its line, else its nearest
        parent's that has one."""
        line, at = None, key
        while at and line is None:
            line, at = self.lines.get(at), at.rpartition(".")[0]
        return ConfigError(f"`{excerpt(key, 120)}`: {message}", line, self.path)   # (a key is anyone's text)

    def add(self, key, message):
        self.errors.append(self.error(key, message))

    def check(self, fn, *args):
        """`fn(*args)`, or None with its ConfigError kept."""
        try:
            return fn(*args)
        except ConfigError as e:
            self.errors.append(e)
            return None


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_lock(p, v):
    if not isinstance(v, bool):
        raise p.error("lock", f"must be true or false, got {excerpt(repr(v), 40)}")
    return v


def check_dtypes(p, d):
    d = [d] if isinstance(d, str) else d
    if not isinstance(d, list) or not d or not all(isinstance(x, str) for x in d):
        raise p.error("dtypes", f"must be a non-empty list of {', '.join(DTYPES)}")
    for x in d:
        if x not in DTYPES:
            raise p.error("dtypes", unknown("a dtype", x, DTYPES))
    if len(set(d)) != len(d):
        raise p.error("dtypes", "lists a dtype twice")
    return list(d)


def check_limits(p, lim, known):
    if not isinstance(lim, dict):
        raise p.error("limits", f"must map a limit ({', '.join(known)}) to a number")
    out = {}
    for k, v in lim.items():
        if k not in known:
            p.add(f"limits.{k}", unknown("a limit", k, known))
        elif not _is_int(v) or not 1 <= v <= LIMIT_MAX.get(k, 1 << 62):
            p.add(f"limits.{k}", f"must be a whole number from 1 to {LIMIT_MAX.get(k, 1 << 62)}, "
                  f"got {excerpt(repr(v), 40)}")
        else:
            out[k] = v
    return out


def check_steps(p, v):
    if not _is_int(v) or v < 1:
        raise p.error("steps", f"must be a positive integer, got {excerpt(repr(v), 40)}")
    return v


def check_tolerances(p, t):
    if not isinstance(t, dict):
        raise p.error("tolerances", "must map a dtype to {abs: A, rel: R}")
    tol = {}
    for dt, v in t.items():
        key = f"tolerances.{dt}"
        if dt not in DTYPES:
            p.add(key, unknown("a dtype", dt, DTYPES))
        elif not isinstance(v, dict):
            p.add(key, "must be {abs: A, rel: R}")
        else:
            for k, x in v.items():
                if k not in ("abs", "rel"):
                    p.add(key, f"unknown key `{excerpt(k, 40)}` (known: abs, rel)"
                          + did_you_mean(k, ("abs", "rel")))
                elif not _is_num(x) or not x >= 0 or x == float("inf"):
                    p.add(key, f"`{k}` must be a finite number >= 0, got {excerpt(repr(x), 40)}")
            tol[dt] = {k: float(x) for k, x in v.items() if k in ("abs", "rel") and _is_num(x)}
    return tol


def _short_path(p, key, x):
    """`x`, a path from a config, refused before anything resolves it where it is over PATH_BYTES."""
    n = path_bytes(x)
    if n > PATH_BYTES:
        raise p.error(key, f"`{excerpt(x, 120)}` is a path of {n} bytes, over the {PATH_BYTES} a file's path "
                      "can have")
    return x


def check_roots(p, v, root):
    """`roots:` (programs/defaults.yaml): the folders outside the repository that weights and
    checkpoints may come from, each resolved (a relative one from the repository's root)."""
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) and x and "\0" not in x for x in v):
        raise p.error("roots", "must be a list of folders (absolute, or relative to the repository)")
    v = [_short_path(p, "roots", x) for x in v]
    out = tuple(resolved(os.path.join(root, x)) for x in v)
    for x, r in zip(v, out):
        why = "cannot be resolved (a link on the way cannot be read)" if r is None else \
            root_problem(os.path.realpath(root), r)
        if why:
            raise p.error("roots", f"`{excerpt(x, 120)}` {why}")
    return out


def leaves_message(path, roots):
    """Why a path is refused: no file system's path (a NUL in it), or it leaves the repository,
    and every named root when there are any."""
    if "\0" in path:
        return f"`{excerpt(path, 120)}` is no path: it holds a NUL character"
    if roots:
        return (f"`{excerpt(path, 120)}` leaves the repository and every named root "
                f"({', '.join(excerpt(r, 200) for r in roots)})")
    return (f"`{excerpt(path, 120)}` leaves the repository (a shared folder outside it may be named "
            f"in programs/defaults.yaml `roots:` or {ROOTS_ENV})")


def check_common(p, data, allowed, limits, root):
    """The keys a program's config and defaults.yaml share: {key: checked value}, each refusal
    kept in `p`."""
    for key in data:
        if key not in allowed:
            extra = (" (`roots` is zoo-wide: it goes in programs/defaults.yaml)" if key == "roots"
                     else "")
            p.add(key, f"unknown key{extra}" + (did_you_mean(key, allowed) or
                                               f" (known: {', '.join(allowed)})"))
    checks = {"lock": check_lock, "dtypes": check_dtypes, "steps": check_steps,
              "tolerances": check_tolerances,
              "limits": lambda p, v: check_limits(p, v, limits),
              "roots": lambda p, v: check_roots(p, v, root)}
    out = {}
    for key, fn in checks.items():
        if key in data and key in allowed:
            got = p.check(fn, p, data[key])
            if got is not None:
                out[key] = got
    return out


def check_precision(p, policy):
    from ..ops import BY_NAME                  # (the op table loads numpy: only when asked)
    from ..ops.precision import check_policy
    problems = check_policy(policy)
    if isinstance(policy, dict):
        names = list(BY_NAME) + ["logits"]
        problems = [m + (did_you_mean(m.split("`")[1], names) if m.endswith("is not an op") else "")
                    for m in problems]
    if problems:
        raise p.error("precision", "; ".join(problems))
    return {k: tuple(v) for k, v in policy.items()}


# the bf16 gate's bounds: each a finite number in its range (a cosine above 1 never passes, a
# NaN bound never compares, an infinite one excuses anything)
BF16_RANGES = {"excess": (0, False, None), "excess_other": (0, False, None), "deviation": (0, False, None),
               "z": (0, False, None), "cosine": (0, False, 1), "margin_noise": (0, True, None),
               "nmse": (0, False, None)}


def _bound(x, low, closed, high):
    """Whether `x` is a finite number above `low` (at `low` too where `closed`), at most `high`."""
    return _is_num(x) and math.isfinite(x) and (x >= low if closed else x > low) and (high is None or x <= high)


def _range(low, closed, high):
    return f"a finite number {'>=' if closed else '>'} {low}" + (f" and <= {high}" if high is not None else "")


def check_bf16(p, b):
    """`bf16:`, the gate's bounds overrides: {bound: number}, `excess` {op: number}; every bad
    bound is said (kept in `p`), not only the first."""
    if not isinstance(b, dict):
        raise p.error("bf16", f"must map some of {', '.join(BF16_RANGES)} to numbers (`excess` to {{op: number}})")
    before = len(p.errors)
    for k, v in b.items():
        if k not in BF16_RANGES:
            p.add(f"bf16.{k}", f"unknown bound (known: {', '.join(BF16_RANGES)})" + did_you_mean(str(k), list(BF16_RANGES)))
        elif k == "excess":
            from ..ops import BY_NAME          # (the op table loads numpy: only when asked)
            if not isinstance(v, dict):
                p.add("bf16.excess", "must map op names to numbers, e.g. {matmul: 4}")
                continue
            for op, x in v.items():
                if op not in BY_NAME:
                    p.add(f"bf16.excess.{op}", f"`{excerpt(str(op), 40)}` is not an op" + did_you_mean(str(op), list(BY_NAME)))
                elif not _bound(x, *BF16_RANGES[k]):
                    p.add(f"bf16.excess.{op}", f"must be {_range(*BF16_RANGES[k])}, got {excerpt(repr(x), 40)}")
        elif not _bound(v, *BF16_RANGES[k]):
            p.add(f"bf16.{k}", f"must be {_range(*BF16_RANGES[k])}, got {excerpt(repr(v), 40)}")
    return dict(b) if len(p.errors) == before else None


def check_derive(p, d, keys, root, tree, roots):
    """(importer, checkpoint as written, resolved checkpoint) of `derive:`."""
    if not isinstance(d, dict):
        raise p.error("derive", "must be {importer: NAME, checkpoint: PATH}")
    for k in d:
        if k not in keys:
            p.add(f"derive.{k}", f"unknown key (known: {', '.join(keys)})" + did_you_mean(k, keys))
    imp, ck = d.get("importer"), d.get("checkpoint")
    known = sorted(IMPORTERS)
    if not isinstance(imp, str) or not IMPORTER_RE.fullmatch(imp):
        raise p.error("derive.importer" if "importer" in d else "derive",
                      f"must name an importer (`python -m emitter import-NAME`), got {excerpt(repr(imp), 40)}")
    if imp not in known:
        raise p.error("derive.importer", f"`{excerpt(imp, 40)}` is not an importer (known: "
                      f"{', '.join(known)})" + did_you_mean(imp, known))
    if isinstance(ck, list) or "sha256" in d:     # chunks, joined by the importer
        sha = d.get("sha256")
        if not (isinstance(ck, list) and ck and all(isinstance(x, str) for x in ck)
                and isinstance(sha, str)):
            raise p.error("derive.checkpoint" if "checkpoint" in d else "derive",
                          "a checkpoint in chunks is a list of `package:MODULE/path` parts, in "
                          "order, with `sha256:` the joined file's")
        if not all(x.startswith("package:") for x in ck):
            raise p.error("derive.checkpoint", "each part of a chunked checkpoint must be a `package:MODULE/path` file")
        ck = chunked_spec(ck, sha)
    if not isinstance(ck, str) or not ck:
        raise p.error("derive.checkpoint" if "checkpoint" in d else "derive",
                      "must be `package:MODULE/path` or a repository path")
    try:
        found = chunks(ck)
        for part in found[0] if found else ():
            resolve_package_file(part[len("package:"):])
        if found is not None:
            return imp, ck, ck            # the importer joins the parts: it is handed the spec
        if ck.startswith("package:"):
            return imp, ck, resolve_package_file(ck[len("package:"):])
    except ValueError as e:
        raise p.error("derive.checkpoint", str(e)) from None
    resolved = inside(root, _short_path(p, "derive.checkpoint", ck), tree, roots)
    if resolved is None:
        raise p.error("derive.checkpoint", leaves_message(ck, roots))
    if not os.path.isfile(os.path.join(root, resolved)) and not (tree and tree.to_be_made(resolved)):
        raise p.error("derive.checkpoint", f"`{excerpt(ck, 120)}` is not a file")
    if os.path.isabs(ck) and not os.path.isabs(resolved):   # in the repository: named as it is
        ck = resolved                                       # there (keys hold no absolute path)
    for _, path in declared_reads(imp, ck, os.path.join(root, resolved)):   # (the checkpoint,
        _read_beside(p, path, root, tree, roots)          # a folder's parts, the config.json)
    return imp, ck, resolved


def _read_beside(p, path, root, tree, roots):
    """A file the importer reads beside its checkpoint (at `path`: beside the resolved one, links
    followed, as the importer and the import key read it) is held as the checkpoint is: inside
    the repository or a root, and a regular file where it is there at all (missing: the import
    says)."""
    shown = os.path.relpath(path, root) if path.startswith(os.path.join(root, "")) else path
    rel = inside(root, shown, tree, roots)
    if rel is None:
        raise p.error("derive.checkpoint", f"{leaves_message(shown, roots)}: the importer reads it "
                      "beside the checkpoint (a link?)")
    full = os.path.join(root, rel)
    if os.path.lexists(full) and not os.path.isfile(full):
        raise p.error("derive.checkpoint", f"`{excerpt(shown, 120)}`, which the importer reads, is not a file")


def check_weights(p, w, root, tree, roots):
    """The weights folder a config names, as `inside` gives it; it must exist."""
    if not isinstance(w, str) or not w:
        raise p.error("weights", f"must be a directory path, got {excerpt(repr(w), 40)}")
    rel = inside(root, _short_path(p, "weights", w), tree, roots)
    if rel is None:
        raise p.error("weights", leaves_message(w, roots))
    if rel == "." or in_build(rel):
        raise p.error("weights", f"`{excerpt(w, 120)}` is the repository or under build/ "
                      "(derived weights are made there by `derive:`)")
    if not os.path.isdir(os.path.join(root, rel)) and not (tree and tree.to_be_made(rel)):
        raise p.error("weights", f"`{excerpt(w, 120)}` is not a directory")
    return rel
