"""Reading a YAML config that a stranger may have written: a safe loader that refuses a key given
twice, the key lines an error points at, and a parse cache under build/ so that a no-op run of a
thousand-config zoo never imports PyYAML."""

import functools
import os
import re

from .files import StampedCache
from .language.errors import ProgramError


MAX_CONFIG_BYTES = 1 << 20   # a config is a few keys: a megabyte is far past any real one
MAX_DEPTH = 32               # nesting of mappings and lists
MAX_NODES = 100_000          # values after aliases are expanded (a YAML "billion laughs" is refused)
STR_TAG = "tag:yaml.org,2002:str"


class ConfigError(ProgramError):
    """A refused config: `PATH:LINE: `key`: message`."""

    @property
    def errors(self):
        """Each refusal this one stands for (itself; a ConfigErrors holds several)."""
        return [self]


class ConfigErrors(ConfigError):
    """Every refusal of one config, one `PATH:LINE: `key`: message` per line."""

    def __init__(self, errors):
        self._errors = list(errors)
        super().__init__("\n".join(str(e) for e in self._errors), None, self._errors[0].path)

    @property
    def errors(self):
        return list(self._errors)

    def __str__(self):
        return self.message


def _check_graph(node, shown):
    """Refuse a composed YAML document that nests too deep or expands (aliases followed) into too
    many values, before anything is built from it: an alias bomb costs a walk of MAX_NODES."""
    count, todo = 0, [(node, 1)]
    while todo:
        n, depth = todo.pop()
        count += 1
        if count > MAX_NODES or depth > MAX_DEPTH:
            what = (f"expands (aliases followed) to over {MAX_NODES} values" if count > MAX_NODES
                    else f"nests deeper than {MAX_DEPTH} levels")
            raise ConfigError(f"the config {what}", n.start_mark.line + 1, shown)
        if isinstance(n.value, list):
            for item in n.value:
                if isinstance(item, tuple) and item[0].tag != STR_TAG:   # `1: 2`, `true:`, `? [a]`
                    k = item[0]
                    said = (f"`{k.value}`: a key is a name, got {k.tag.rpartition(':')[2]} (quote "
                            "it to mean the text)") if isinstance(k.value, str) else \
                        "a key is a name, got a list or mapping"
                    raise ConfigError(said, k.start_mark.line + 1, shown)
                todo.extend(((k, depth + 1) for k in item) if isinstance(item, tuple)
                            else [(item, depth + 1)])


@functools.lru_cache(maxsize=None)
def _yaml():
    """(yaml, loader class), imported on first use: a no-op run whose configs all come from the
    parse cache never loads PyYAML. libyaml's safe loader where PyYAML was built with it (the same
    safe constructors, in C), else the pure-Python one; either refuses a key written twice in one
    mapping (YAML would keep the last silently, so `steps: 1` above `steps: 3` would pass), and
    reads scalars as YAML 1.2's core schema does: `1e-5` is a float (YAML 1.1, PyYAML's, wants
    `1.0e-5` and would read `1e-5` as a string), `010` is ten, `no` is text."""
    import re

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

    # YAML 1.2's core schema, not PyYAML's 1.1 one: `010` is 10 (not octal 8), `1:30` and `1_0` are
    # text (not 90 and 10), `no`/`off`/`yes`/`on` are text (not booleans), `1e-5` is a float
    Loader.yaml_implicit_resolvers = {}
    for tag, pattern, first in (
            ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
            ("bool", r"true|True|TRUE|false|False|FALSE", list("tTfF")),
            ("int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", list("-+0123456789")),
            ("float", r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                      r"|\.(?:nan|NaN|NAN)", list("-+.0123456789"))):
        Loader.add_implicit_resolver(f"tag:yaml.org,2002:{tag}", re.compile(f"^(?:{pattern})$"), first)

    def integer(loader, node):
        text = loader.construct_scalar(node)
        if text.startswith(("0o", "0x")):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text, 10)
    Loader.add_constructor("tag:yaml.org,2002:int", integer)
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
    """Parsed configs kept under build/ by the sha256 of their file: a no-op run of a
    thousand-config zoo stats each file (the fingerprint record) and neither reads nor parses one,
    nor imports PyYAML. Only a value
    that JSON gives back exactly, key order included, is kept (a date or an integer key is parsed
    every time), so a hit is what parsing would give, errors and their order too."""

    VERSION = 6   # a cache another version wrote (v1 sorted keys, v3 read `1e-5` as text, v4 keyed
    #               by the text's digest, not the file's; v5 read YAML 1.1's `010`, `no`) is not read

    def __init__(self, path):
        super().__init__(path, self.VERSION)

    def get(self, rel, digest):
        data = super().get(rel, digest)
        return data if isinstance(data, dict) else None

    def put(self, rel, digest, data):
        import json
        try:
            text = json.dumps(data)
        except (TypeError, ValueError):
            return
        if json.dumps(json.loads(text)) == text:   # same types, same key order
            super().put(rel, digest, data)


_BREAKS = re.compile("\r\n|[\r\n\x85\u2028\u2029]")   # the line breaks PyYAML counts


def load_yaml(path, shown=None, cache=None):
    """(mapping, key lines) of a YAML file; an empty file is an empty mapping. Errors name the
    file as `shown` (its repo-relative path); `cache` is a ParseCache or None."""
    shown = shown or path
    hit = cache and _cached(path, shown, cache)
    if hit:
        return hit
    try:
        with open(path, "rb") as f:
            # a small read first: read(1 MB) sets aside 1 MB for each of a zoo's thousand configs
            data = f.read(1 << 16)
            if len(data) == 1 << 16:
                data += f.read(MAX_CONFIG_BYTES + 1 - len(data))
    except OSError as e:
        raise ConfigError(f"cannot read the config: {e.strerror or e}", None, shown) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"the config is over {MAX_CONFIG_BYTES} bytes", None, shown)
    digest = None
    if cache:
        import hashlib
        digest = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start}",
                          data.count(b"\n", 0, e.start) + 1, shown) from None
    yaml, loader = _yaml()
    try:
        node = yaml.compose(text, Loader=loader)
        if node is not None:
            _check_graph(node, shown)
        data = yaml.load(text, Loader=loader)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"the config nests deeper than {MAX_DEPTH} levels", None, shown) from None
    except yaml.reader.ReaderError as e:   # a control character: its line, not PyYAML's offset
        at, c = e.position if isinstance(e.position, int) else 0, e.character
        raise ConfigError(f"not valid YAML: the character {'U+%04X' % c if isinstance(c, int) else repr(c)} "
                          f"({e.reason})", len(_BREAKS.findall(text, 0, at)) + 1, shown) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError(f"not valid YAML: {getattr(e, 'problem', None) or e}",
                          mark.line + 1 if mark else None, shown) from None
    except (ValueError, TypeError, OverflowError) as e:   # a value its tag cannot make (2001-13-01)
        raise ConfigError(f"not valid YAML: {e}", None, shown) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"a config is a mapping of keys, got {type(data).__name__}", 1, shown)
    if cache:
        cache.put(shown, digest, data)
    return data, _KeyLines(text)


def _cached(path, shown, cache):
    """(mapping, key lines) of a plain file within the limit whose bytes (by the fingerprint
    record: a stat) were parsed before, unread; else None."""
    import stat
    from .fingerprint import sha256_or_none
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CONFIG_BYTES:
        return None
    sha = sha256_or_none(path, st)
    data = cache.get(shown, sha) if sha else None
    return None if data is None else (data, _KeyLines(None, path, sha))


class _KeyLines:
    """Key -> line, worked out only when an error asks (most configs are fine, and composing the
    YAML a second time for every one of a thousand would be wasted)."""

    def __init__(self, text, path=None, sha=None):
        self.text, self.lines, self.path, self.sha = text, None, path, sha

    def get(self, key):
        if self.lines is None:
            self.lines = _key_lines(self._text())
        return self.lines.get(key)

    def _text(self):
        """The text (read now for a parse from the cache: no lines if it is not those bytes)."""
        if self.text is None:
            import hashlib
            try:
                with open(self.path, "rb") as f:
                    data = f.read(MAX_CONFIG_BYTES + 1)
                ok = hashlib.sha256(data).hexdigest() == self.sha
                self.text = data.decode("utf-8").removeprefix("\ufeff") if ok else ""
            except (OSError, UnicodeDecodeError):
                self.text = ""
        return self.text


