"""What an importer takes from a checkpoint's own description (its config.json, a GGUF's metadata)
before it builds anything from it: the config read within CONFIG_BYTES, and the sizes a program
generated from it (`--write-program`) may have. A hostile `block_count: 1e9` had the generator
build a billion layers' sentences (7 GB in 30 s, and growing) that the reader's own limit
(limits.sentences) would refuse only once written."""

import json

from ..language.errors import ProgramError
from . import CONFIG_BYTES

MAX_LAYERS = 4096         # layers of a generated program (real models: up to about 128)
MAX_WIDTH = 1 << 17       # a hidden size, an FFN's, a head count or width (real models: up to about 53 248)
MAX_CONTEXT = 1 << 20     # a generated program's positions (its KV cache's rows: `--context`)


def read_json_config(path):
    """The config.json dict at `path`; one that cannot be read, is over CONFIG_BYTES, is not JSON
    (or nests too deep) or is not an object is a ProgramError naming it."""
    try:
        with open(path, "rb") as f:
            data = f.read(CONFIG_BYTES + 1)
    except OSError as e:
        raise ProgramError(f"cannot read the config: {e.strerror or e}", path=path) from None
    if len(data) > CONFIG_BYTES:
        raise ProgramError(f"the config is over {CONFIG_BYTES} bytes", path=path)
    try:
        config = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ProgramError("cannot read the config: its JSON nests too deep", path=path) from None
    except ValueError as e:
        raise ProgramError(f"cannot read the config: {str(e)[:200]}", path=path) from None
    if not isinstance(config, dict):
        raise ProgramError(f"the config is a JSON {type(config).__name__}, not an object", path=path)
    return config


def size_problems(layers, widths):
    """What of a generated program's sizes is past its bound ([] where none): `layers` (name,
    count) at most MAX_LAYERS, each of `widths` ({name: size}) at most MAX_WIDTH, each a whole
    number from 1."""
    out = []
    for (name, v), most in [(layers, MAX_LAYERS)] + [(w, MAX_WIDTH) for w in widths.items()]:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
            out.append(f"{name} {v!r} is not a whole number from 1 to {most} (what a program is "
                       "generated with)")
    return out


def context(text):
    """A `--context` (or `--ctx`, `--window`) as argparse reads it: a whole number from 1 to
    MAX_CONTEXT (0 or -3 wrote a program the reader refuses)."""
    import argparse
    if not text.isdigit() or not 1 <= int(text) <= MAX_CONTEXT:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_CONTEXT}, got {text!r}")
    return int(text)
