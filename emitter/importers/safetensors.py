"""A safetensors checkpoint to a weights directory, and the tensor program of a BERT-style encoder.

Two halves:

* `bert_program(config, token_ids)` writes the LOGOS program of a BERT encoder (BertModel: word +
  position + token-type embeddings, layernorm, then per layer full self-attention with biases,
  residual + layernorm, a GELU FFN, residual + layernorm) over a fixed sequence of token ids.
  The output is the last hidden state, `T by hidden`. Everything the model computes happens in
  the program: each token's word row and position row are looked up with `row … of`, summed and
  written into the `T by hidden` embedding table `E` with `Set row`; the token-type row (type 0 for
  every token, as BertModel does without `token_type_ids`) is broadcast over the rows. Every
  layernorm carries config.json's `layer_norm_eps` (BERT's default 1e-12), and the FFN's GELU is
  config.json's `hidden_act`: `gelu` is the erf form (`exact gelu of`), `gelu_new` and
  `gelu_pytorch_tanh` the tanh form (`gelu of`); any other activation is refused.
* `import_checkpoint(checkpoint, program, out_dir)` reads a safetensors file with
  `safe_open(path, framework="np")`, finds the checkpoint tensor of each of the program's leaves by
  the naming convention of `bert_names` (a Linear's `(out, in)` weight is transposed to the
  sugar's `in by out`; a 1-D tensor becomes `1 by C`), checks its shape against the declaration,
  and writes `<var>.f32` (`<var>.f64` for a float64 tensor) by temporary file and rename. Leaves no
  checkpoint tensor maps to (the token ids, the embedding table `E`) keep their declared values.

Command line: `python -m emitter import-safetensors CHECKPOINT --program PROG.logos -o OUT_DIR`
(`CHECKPOINT` may be `package:DIST_MODULE/relative/path`, a file inside an installed package);
with `--write-program --tokens 101,…` it first writes the program from the `config.json` beside
the checkpoint.
"""

import json
import os
import sys

import numpy as np

from ..extras import require
from ..files import write_atomic
from ..language.errors import ProgramError
from .bounds import read_json_config, size_problems
from .leaves import unfilled, write_leaf
from .packages import resolve_checkpoint

# ── the program ───────────────────────────────────────────────────────────────────────────────────

LINEAR, ROW, TABLE = "linear", "row", "table"
# config.json's hidden_act -> the sugar's GELU sentence
GELUS = {"gelu": "exact gelu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu"}

# per-layer variable stem -> (checkpoint name under `encoder.layer.N.`, how it becomes a leaf)
_LAYER = (
    ("Wquery", "attention.self.query.weight", LINEAR),
    ("bquery", "attention.self.query.bias", ROW),
    ("Wkey", "attention.self.key.weight", LINEAR),
    ("bkey", "attention.self.key.bias", ROW),
    ("Wvalue", "attention.self.value.weight", LINEAR),
    ("bvalue", "attention.self.value.bias", ROW),
    ("Wattn", "attention.output.dense.weight", LINEAR),
    ("battn", "attention.output.dense.bias", ROW),
    ("ln1w", "attention.output.LayerNorm.weight", ROW),
    ("ln1b", "attention.output.LayerNorm.bias", ROW),
    ("Wup", "intermediate.dense.weight", LINEAR),
    ("bup", "intermediate.dense.bias", ROW),
    ("Wdown", "output.dense.weight", LINEAR),
    ("bdown", "output.dense.bias", ROW),
    ("ln2w", "output.LayerNorm.weight", ROW),
    ("ln2b", "output.LayerNorm.bias", ROW),
)
_EMBEDDINGS = (
    ("Wword", "embeddings.word_embeddings.weight", TABLE),
    ("Wpos", "embeddings.position_embeddings.weight", TABLE),
    ("Wtype", "embeddings.token_type_embeddings.weight", TABLE),
    ("lnEw", "embeddings.LayerNorm.weight", ROW),
    ("lnEb", "embeddings.LayerNorm.bias", ROW),
)


def bert_names(num_layers):
    """Program variable -> (checkpoint tensor name, LINEAR | ROW | TABLE) for a BERT encoder."""
    names = {var: (ck, kind) for var, ck, kind in _EMBEDDINGS}
    for n in range(num_layers):
        for stem, ck, kind in _LAYER:
            names[f"{stem}{n}"] = (f"encoder.layer.{n}.{ck}", kind)
    return names


def _check_config(config):
    need = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
            "vocab_size", "max_position_embeddings", "type_vocab_size")
    missing = [k for k in need if k not in config]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}")
    problems = size_problems(("num_hidden_layers", config["num_hidden_layers"]), {
        k: config[k] for k in ("hidden_size", "num_attention_heads", "intermediate_size")})
    if problems:
        raise ValueError("; ".join(problems))
    if config.get("model_type", "bert") != "bert":
        raise ValueError(f"model_type `{config['model_type']}` is not a BERT encoder")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("only absolute position embeddings are in the sugar")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise ValueError("the heads do not divide hidden_size")
    if config.get("hidden_act", "gelu") not in GELUS:
        raise ValueError(f"hidden_act `{config['hidden_act']}` is not in the sugar (it has "
                         f"{', '.join(GELUS)})")
    eps = config.get("layer_norm_eps", 1e-12)
    if not (isinstance(eps, (int, float)) and 0 < eps < float("inf")):
        raise ValueError(f"layer_norm_eps {eps!r} is not a positive number")


def bert_program(config, token_ids, title=None):
    """The LOGOS text of a BERT encoder (config.json as a dict) over `token_ids`; output `T by C`."""
    _check_config(config)
    c, heads = config["hidden_size"], config["num_attention_heads"]
    ffn, layers = config["intermediate_size"], config["num_hidden_layers"]
    act, epsilon = config.get("hidden_act", "gelu"), float(config.get("layer_norm_eps", 1e-12))
    eps = f"with epsilon {epsilon!r}"
    t = len(token_ids)
    if not 1 <= t <= config["max_position_embeddings"]:
        raise ValueError(f"{t} tokens: a program needs 1..{config['max_position_embeddings']}")
    for tok in token_ids:
        if not (isinstance(tok, int) and 0 <= tok < config["vocab_size"]):
            raise ValueError(f"token id {tok!r} is outside the vocabulary (0..{config['vocab_size'] - 1})")
    out = []
    say = out.append
    say(f"# {title or 'A BERT encoder'}: {layers} layers, hidden {c}, {heads} heads, FFN {ffn}, "
        f"over {t} tokens.")
    say("# Generated by emitter/importers/safetensors.py (bert_program); weights by "
        "`python -m emitter import-safetensors`.")
    say(f"# From config.json: layernorm epsilon {epsilon!r}, hidden_act {act} (`{GELUS[act]} of`). "
        "Output: the last hidden state.")
    say("")
    say("## Embeddings: word row + position row per token, then the token-type-0 row, then layernorm")
    say(f"Let Wword be a {config['vocab_size']} by {c} tensor of Real.")
    say(f"Let Wpos be a {config['max_position_embeddings']} by {c} tensor of Real.")
    say(f"Let Wtype be a {config['type_vocab_size']} by {c} tensor of Real.")
    say(f"Let lnEw be a 1 by {c} tensor of Real.")
    say(f"Let lnEb be a 1 by {c} tensor of Real.")
    say(f"Let E be a {t} by {c} tensor of Real.")
    for i, tok in enumerate(token_ids):
        say(f"Let tok{i} be a 1 by 1 tensor of Int.")
        say(f"Set item 1 of tok{i} to {tok}.")
    for i in range(t):
        say(f"Let word{i} be row tok{i} of Wword.")
        say(f"Let pos{i} be row {i} of Wpos.")
        say(f"Let emb{i} be word{i} plus pos{i}.")
        say(f"Set row {i} of E to emb{i}.")
    say("Let type0 be row 0 of Wtype.")
    say("Let Esum be E plus type0.")
    say(f"Let X0 be layernorm of Esum with weight lnEw and bias lnEb {eps}.")
    for n in range(layers):
        x, nxt = f"X{n}", f"X{n + 1}"
        say("")
        say(f"## Layer {n}")
        for stem, rows, cols in (("Wquery", c, c), ("bquery", 1, c), ("Wkey", c, c), ("bkey", 1, c),
                                 ("Wvalue", c, c), ("bvalue", 1, c), ("Wattn", c, c), ("battn", 1, c),
                                 ("ln1w", 1, c), ("ln1b", 1, c), ("Wup", c, ffn), ("bup", 1, ffn),
                                 ("Wdown", ffn, c), ("bdown", 1, c), ("ln2w", 1, c), ("ln2b", 1, c)):
            say(f"Let {stem}{n} be a {rows} by {cols} tensor of Real.")
        for p, w in (("q", "Wquery"), ("k", "Wkey"), ("v", "Wvalue")):
            say(f"Let {p}m{n} be {x} matmul {w}{n}.")
            say(f"Let {p}{n} be {p}m{n} plus b{w[1:]}{n}.")
        say(f"Let ctx{n} be full attention of q{n} over k{n} and v{n} with {heads} heads.")
        say(f"Let om{n} be ctx{n} matmul Wattn{n}.")
        say(f"Let o{n} be om{n} plus battn{n}.")
        say(f"Let r1_{n} be o{n} plus {x}.")
        say(f"Let h{n} be layernorm of r1_{n} with weight ln1w{n} and bias ln1b{n} {eps}.")
        say(f"Let um{n} be h{n} matmul Wup{n}.")
        say(f"Let u{n} be um{n} plus bup{n}.")
        say(f"Let g{n} be {GELUS[act]} of u{n}.")
        say(f"Let dm{n} be g{n} matmul Wdown{n}.")
        say(f"Let d{n} be dm{n} plus bdown{n}.")
        say(f"Let r2_{n} be d{n} plus h{n}.")
        say(f"Let {nxt} be layernorm of r2_{n} with weight ln2w{n} and bias ln2b{n} {eps}.")
    return "\n".join(out) + "\n"


# ── the importer ──────────────────────────────────────────────────────────────────────────────────

def _leaf_value(array, kind):
    if kind == LINEAR:
        if array.ndim != 2:
            raise ValueError(f"a Linear weight is 2-D (out, in), this one is {array.shape}")
        return np.ascontiguousarray(array.T)          # (out, in) -> in by out: X matmul W
    if kind == ROW:
        if array.ndim != 1:
            raise ValueError(f"expected a 1-D tensor, got {array.shape}")
        return array.reshape(1, -1)
    if array.ndim != 2:
        raise ValueError(f"an embedding table is 2-D, this one is {array.shape}")
    return array


def _file_dtype(array):
    """Float64 stays float64; float32, float16 and bfloat16 are exact in float32."""
    if array.dtype == np.float64:
        return "<f8"
    if array.dtype.kind not in "fV" and str(array.dtype) != "bfloat16":
        raise ValueError(f"dtype {array.dtype} is not a floating-point weight")
    return "<f4"


def _prefix(keys):
    """A head model's checkpoint nests BertModel under `bert.`; a bare one has no prefix."""
    return "bert." if "embeddings.word_embeddings.weight" not in keys and \
        "bert.embeddings.word_embeddings.weight" in keys else ""


def import_checkpoint(checkpoint, program, out_dir, names=None):
    """Write every leaf of `program` that the checkpoint holds into `out_dir`.

    Returns {"written": {var: checkpoint name}, "declared": [leaves left to their declared value],
    "unused": [checkpoint tensors no leaf took]}. A shape that disagrees with the declaration is a
    ProgramError naming the variable, the tensor and both shapes; so is a checkpoint that fills no
    leaf, or leaves one the program reads unfilled (`leaves.unfilled`); nothing is written then."""
    def missing(message):
        return ProgramError(message, path=str(checkpoint))
    require("safetensors", "import", "reading a safetensors checkpoint", missing)
    require("ml_dtypes", "import", "reading a safetensors checkpoint", missing)
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy before safetensors reads one)
    from safetensors import safe_open

    if names is None:
        layers = sum(1 for v in program.leaves if v.startswith("Wquery"))
        names = bert_names(layers)
    plan = []
    with safe_open(checkpoint, framework="np") as f:
        keys = set(f.keys())
        prefix = _prefix(keys)
        declared = []
        for var in program.leaves:
            if var not in names:
                declared.append(var)
                continue
            ck, kind = names[var]
            ck = prefix + ck
            if ck not in keys:
                raise ProgramError(f"`{var}` maps to `{ck}`, which the checkpoint does not hold",
                                   path=checkpoint)
            array = f.get_tensor(ck)
            try:
                value = _leaf_value(array, kind)
                dtype = _file_dtype(array)
            except ValueError as e:
                raise ProgramError(f"`{ck}` for `{var}`: {e}", path=checkpoint) from None
            d = program.decls[var]
            if value.shape != (d.rows, d.cols):
                raise ProgramError(f"`{var}` is declared {d.rows} by {d.cols} but `{ck}` gives "
                                   f"{value.shape[0]} by {value.shape[1]} ({kind})", path=checkpoint)
            if not np.all(np.isfinite(value.astype(np.float64))):
                raise ProgramError(f"`{ck}` holds a non-finite value", path=checkpoint)
            plan.append((var, ck, value, dtype))
        used = {ck for _, ck, _, _ in plan}
        unused = sorted(keys - used)
    problem = unfilled(program, {var for var, _, _, _ in plan}, checkpoint, unused,
                       " (this importer knows the BERT layout: `embeddings.word_embeddings.weight`, "
                       "`encoder.layer.N.attention.self.query.weight`, ...)")
    if problem:
        raise problem
    for var, _, value, dtype in plan:
        write_leaf(out_dir, var, value, dtype)
    return {"written": {var: ck for var, ck, _, _ in plan}, "declared": declared, "unused": unused}


# ── command line ──────────────────────────────────────────────────────────────────────────────────

def add_arguments(p):
    p.add_argument("checkpoint", help="model.safetensors, or package:DIST_MODULE/relative/path")
    p.add_argument("--program", required=True, help="the PROGRAM.logos whose leaves to write")
    p.add_argument("-o", "--out", required=True, help="weights directory (<var>.f32 files)")
    p.add_argument("--write-program", action="store_true",
                   help="first write --program from the config.json beside the checkpoint")
    p.add_argument("--tokens", help="with --write-program: comma-separated token ids")
    p.add_argument("--title", help="with --write-program: the program's first comment")


def main(args):
    from ..language.reader import read_file

    checkpoint = resolve_checkpoint(args.checkpoint)
    if args.write_program:
        if not args.tokens:
            print("--write-program needs --tokens", file=sys.stderr)
            return 2
        config_path = os.path.join(os.path.dirname(checkpoint), "config.json")
        config = read_json_config(config_path)
        try:
            tokens = [int(t) for t in args.tokens.split(",")]
        except ValueError:
            print(f"--tokens: comma-separated token ids, got {args.tokens!r}", file=sys.stderr)
            return 2
        try:
            text = bert_program(config, tokens, args.title)
        except ValueError as e:
            print(f"{config_path}: {e}", file=sys.stderr)
            return 1
        write_atomic(args.program, text)
    program = read_file(args.program)
    report = import_checkpoint(checkpoint, program, args.out)
    print(json.dumps({"checkpoint": checkpoint, "out": args.out, "written": len(report["written"]),
                      "declared": report["declared"], "unused": report["unused"]}))
    return 0
