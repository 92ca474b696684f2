"""A GGUF checkpoint to a weights directory, and the llama decode step written from its metadata.

`python -m emitter import-gguf CHECKPOINT --program PROG.logos -o OUT_DIR [--write-program]
[--context L]`

- With `--write-program`, PROG.logos is first (re)written from the checkpoint's own metadata by
  `llama_decode_program` (n_layer, n_embd, n_head, n_head_kv, FFN length, vocab, rope theta, rms
  epsilon; the KV tables hold `--context` rows, default 256). Without `-o` nothing else happens.
- With `-o`, every leaf of PROG.logos whose checkpoint name (`emitter.language.names.gguf_name`)
  names a tensor of the checkpoint is dequantised (`gguf.quants.dequantize`), un-permuted (llama.cpp
  permutes the Q and K rows of llama models to GPT-J pairs; the sugar's rope is NEOX) and laid out as
  the program uses it, then written as OUT_DIR/<var>.f32 (raw little-endian, row-major, by temporary
  file and rename). The leaves the decode step derives rather than reads (the first token and
  position, the rope tables COS and SIN as float64, the K caches' initial mask column) are written
  too (`derived_leaves`); every other leaf keeps its declared value. OUT_DIR/.import.json lists
  what was written (name, bytes, sha256).
- Tied embeddings (no `output.weight`): `Wout` (gguf name `output.weight`) is written from
  `token_embd.weight`, transposed, like any linear map.
- CHECKPOINT is a path, or `package:DIST_MODULE/relative/path` for a file inside an installed package
  (found without importing the package).

Reading, dequantising, laying out and writing are `gguf_file`'s, shared with the Gemma 3 importer.

Why the decode step pads heads: the sugar's `attention` softmaxes over *all* L rows of the cache,
while a decode step at position P must see rows 0..P only. Each head gets one extra column (hd + 1):
the query's is 1 (the `qmask` fills), a cached key's is 0 for a written row (the zero column of the
padding `Pkv`) and -1e5 for a row not yet written (the initial K cache, written here), so unwritten
rows score -1e5/sqrt(hd + 1) and get no weight, exactly. The padding matrices `Pq` (scaled by
sqrt((hd + 1)/hd) so that the scores keep the model's 1/sqrt(hd)), `Pkv` and `Po` (which drops the
extra columns before the output projection) are fills of the program; the GGUF weights themselves are
written unpadded, as their gguf names say.
"""

import itertools
import math
import os
import re

import numpy as np

from ..files import write_atomic
from ..language.errors import ProgramError
from ..ops.rope import rope_tables
from .bounds import context, size_problems
from .gguf_file import (check_fills, checkpoint_file, embedding_rows, field_value, gguf_leaves, gguf_plan,
                        import_record, nothing_left, open_gguf, shortest_f32, write_weights)
from .packages import resolve_checkpoint

MASK = -1e5            # a not-yet-written cache row's key in the mask column
DEFAULT_CONTEXT = 256  # rows of the KV caches and rope tables
# Where a gguf name by the project's convention is absent, the tensor this architecture has instead:
# llama's pre-FFN norm is `ffn_norm`; a tied output projection is the token embedding (as llama.cpp
# itself falls back to it).
ALIASES = {"llama": {"post_attention_norm.weight": "ffn_norm.weight",
                     "output.weight": "token_embd.weight"}}


# ── the checkpoint ────────────────────────────────────────────────────────────────────────────────

def llama_meta(reader):
    """The decode step's hyperparameters from a llama-architecture GGUF's own metadata."""
    arch = field_value(reader, "general.architecture")
    if arch != "llama":
        raise ProgramError(f"the llama decode step needs a llama GGUF, this one is `{arch}`", path=reader.path)
    k = lambda key, default=None: field_value(reader, f"{arch}.{key}", default)  # noqa: E731
    tensors = {t.name: t for t in reader.tensors}
    n_embd, n_head = int(k("embedding_length")), int(k("attention.head_count"))
    vocab = k("vocab_size", -1)
    if vocab == -1:
        vocab = embedding_rows(reader)
    meta = {
        "arch": arch,
        "name": str(field_value(reader, "general.name", "")),
        "n_layer": int(k("block_count")),
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": int(k("attention.head_count_kv", n_head)),
        "n_ff": int(k("feed_forward_length")),
        "vocab": int(vocab),
        "rope_theta": float(k("rope.freq_base", 10000.0)),
        "rms_eps": shortest_f32(k("attention.layer_norm_rms_epsilon", 1e-5)),
        "context_length": int(k("context_length", 0)),
        "tied": "output.weight" not in tensors,
        "bos": int(field_value(reader, "tokenizer.ggml.bos_token_id", 0)),
    }
    problems = size_problems(("block_count", meta["n_layer"]), {
        "embedding_length": n_embd, "attention.head_count": n_head,
        "attention.head_count_kv": meta["n_head_kv"], "feed_forward_length": meta["n_ff"]})
    if problems:
        raise ProgramError("; ".join(problems), path=reader.path)
    hd = n_embd // n_head
    rot = int(k("rope.dimension_count", hd))
    if n_embd % n_head or rot != hd or hd % 2:
        raise ProgramError(f"the decode step needs full rotary over an even head size: "
                           f"n_embd {n_embd}, {n_head} heads, rope dims {rot}", path=reader.path)
    meta["head_dim"] = hd
    return meta


def unpermute(w, n_head):
    """Undo llama.cpp's Q/K row permutation of a numpy (out, in) weight: GPT-J pairs back to NEOX."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def permute(w, n_head):
    """llama.cpp's permutation (convert_hf_to_gguf `LlamaModel.permute`), for tests."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, -1).swapaxes(1, 2).reshape(w.shape)


# ── the program ───────────────────────────────────────────────────────────────────────────────────

def _lit(x):
    return repr(float(x)) if x != int(x) else str(int(x))


def _printable(text):
    """Checkpoint metadata made safe for a `#` comment: no line breaks or control characters."""
    return "".join(c for c in str(text or "") if c.isprintable())[:120]


def decode_head(V, d):
    """A decode step's first lines: its token and position states, the constant 1, the embedding."""
    return ["", "## The token and its position, tables and the head padding",
            "Let tok be a 1 by 1 tensor of Int.", "Let pos be a 1 by 1 tensor of Int.",
            "Let one be a 1 by 1 tensor of Int.", "Set item 1 of one to 1.",
            f"Let emb be a {V} by {d} tensor of Real."]


def head_padding(H, KV, hd, scale):
    """The declarations and fills of the head padding (see the module's docstring): `Pq` (query
    heads widened to hd + 1 columns, times `scale`), `Pkv` (key and value heads), `Po` (back to hd)
    and `qmask` (the query's extra column, 1)."""
    hp = hd + 1
    out = [f"Let Pq be a {H * hd} by {H * hp} tensor of Real."]
    out += [f"Set item {(h * hd + j) * H * hp + h * hp + j + 1} of Pq to {scale!r}."
            for h in range(H) for j in range(hd)]
    out.append(f"Let Pkv be a {KV * hd} by {KV * hp} tensor of Real.")
    out += [f"Set item {(g * hd + j) * KV * hp + g * hp + j + 1} of Pkv to 1."
            for g in range(KV) for j in range(hd)]
    out.append(f"Let Po be a {H * hp} by {H * hd} tensor of Real.")
    out += [f"Set item {(h * hp + j) * H * hd + h * hd + j + 1} of Po to 1."
            for h in range(H) for j in range(hd)]
    out.append(f"Let qmask be a 1 by {H * hp} tensor of Real.")
    out += [f"Set item {h * hp + hd + 1} of qmask to 1." for h in range(H)]
    return out


def llama_decode_program(meta, context=DEFAULT_CONTEXT, source=""):
    """The LOGOS text of one greedy llama decode step (every layer) for `meta` (see `llama_meta`).

    States: `tok` (the token id) and `pos` (its position, from 0), both 1 by 1, which the step
    writes back as the argmax of the logits and pos + 1, so N steps decode N tokens; the K and V
    caches `Kc<i>`, `Vc<i>` (context by KV·(hd+1)), written at row `pos`. Output: the next token;
    the logits are the stage `logits`. Every rmsnorm carries the GGUF's epsilon.
    """
    L, d, H, KV = meta["n_layer"], meta["n_embd"], meta["n_head"], meta["n_head_kv"]
    hd, ff, V = meta["head_dim"], meta["n_ff"], meta["vocab"]
    hp, half = hd + 1, hd // 2
    scale = math.sqrt(hp / hd)
    eps = f"with epsilon {meta['rms_eps']!r}"
    out = [
        f"# {_printable(meta.get('name')) or 'llama'}: a greedy llama decode step, {L} layers, hidden {d}, "
        f"{H} heads / {KV} KV heads of {hd}, FFN {ff}, vocab {V}, rope theta {_lit(meta['rope_theta'])}, "
        f"rms epsilon {meta['rms_eps']!r}.",
        "# Generated by emitter/importers/gguf.py (llama_decode_program) from the GGUF's metadata"
        + (f" ({source})" if source else "") + ";",
        "# weights by `python -m emitter import-gguf CHECKPOINT --program THIS -o DIR`.",
        "# States: tok and pos (1 by 1: the token this step reads and its position), which the step writes",
        "# back as the next token (the argmax of the logits) and pos + 1, so N steps decode N tokens; the",
        f"# KV caches Kc<i>, Vc<i> ({context} rows), written at row pos. Output: the next token; the",
        "# logits are the stage `logits`.",
        f"# Each head is padded to {hp} columns so that cache rows not yet written get no attention",
        f"# weight: the query's extra column is 1, a written key's 0, an unwritten key's {_lit(MASK)}"
        " (the initial K cache).",
        f"# Pq also scales the query by sqrt({hp}/{hd}), so that attention's 1/sqrt({hp}) is the "
        f"model's 1/sqrt({hd}).",
        *decode_head(V, d),
        f"Let COS be a {context} by {half} tensor of Real.",
        f"Let SIN be a {context} by {half} tensor of Real.",
    ]
    out += head_padding(H, KV, hd, scale)
    out += [
        "Let pn be pos plus one.",
        "Let x0 be row tok of emb.",
        "Let cs be row pos of COS.",
        "Let sn be row pos of SIN.",
    ]
    for i in range(L):
        out += [
            "",
            f"## Layer {i}",
            f"Let an{i} be a 1 by {d} tensor of Real.",
            f"Let Wq{i} be a {d} by {H * hd} tensor of Real.",
            f"Let Wk{i} be a {d} by {KV * hd} tensor of Real.",
            f"Let Wv{i} be a {d} by {KV * hd} tensor of Real.",
            f"Let Wo{i} be a {H * hd} by {d} tensor of Real.",
            f"Let fn{i} be a 1 by {d} tensor of Real.",
            f"Let Wg{i} be a {d} by {ff} tensor of Real.",
            f"Let Wu{i} be a {d} by {ff} tensor of Real.",
            f"Let Wd{i} be a {ff} by {d} tensor of Real.",
            f"Let Kc{i} be a {context} by {KV * hp} tensor of Real.",
            f"Let Vc{i} be a {context} by {KV * hp} tensor of Real.",
            f"Let h{i}n be rmsnorm of x{i} with weight an{i} {eps}.",
            f"Let qp{i} be h{i}n matmul Wq{i}.",
            f"Let qs{i} be qp{i} matmul Pq.",
            f"Let qm{i} be qs{i} plus qmask.",
            f"Let q{i} be rope of qm{i} with cos cs and sin sn across {H} heads.",
            f"Let kp{i} be h{i}n matmul Wk{i}.",
            f"Let ks{i} be kp{i} matmul Pkv.",
            f"Let k{i} be rope of ks{i} with cos cs and sin sn across {KV} heads.",
            f"Let vp{i} be h{i}n matmul Wv{i}.",
            f"Let v{i} be vp{i} matmul Pkv.",
            f"Set row pos of Kc{i} to k{i}.",
            f"Set row pos of Vc{i} to v{i}.",
            f"Let a{i} be attention of q{i} over Kc{i} and Vc{i} with {H} heads {KV} groups.",
            f"Let ap{i} be a{i} matmul Po.",
            f"Let o{i} be ap{i} matmul Wo{i}.",
            f"Let r{i} be x{i} plus o{i}.",
            f"Let f{i}n be rmsnorm of r{i} with weight fn{i} {eps}.",
            f"Let g{i} be f{i}n matmul Wg{i}.",
            f"Let u{i} be f{i}n matmul Wu{i}.",
            f"Let s{i} be swiglu of g{i} and u{i}.",
            f"Let d{i} be s{i} matmul Wd{i}.",
            f"Let x{i + 1} be r{i} plus d{i}.",
        ]
    out += ["", "## Output: the logits, then the next token and position written back"]
    if meta["tied"]:
        out += ["# Tied embeddings: Wout is the token embedding transposed, written by the importer as a",
                "# leaf of its own: `transpose of emb` would cost the VM a float64 transposed copy of the",
                f"# table in every step ({V * d * 8 / 1e6:.0f} MB)."]
    out += [f"Let on be a 1 by {d} tensor of Real.", f"Let Wout be a {d} by {V} tensor of Real.",
            f"Let xf be rmsnorm of x{L} with weight on {eps}.", "Let logits be xf matmul Wout.",
            "Let nxt be argmax of logits.", "Set row 0 of tok to nxt.", "Set row 0 of pos to pn."]
    return "\n".join(out) + "\n"


def derived_leaves(program, meta):
    """The decode step's leaves that are no GGUF tensor but not zeros either: {name: array}. The
    first step's token is the tokenizer's BOS and its position 0 (a caller feeds another by
    replacing `tok.f32` / `pos.f32`). The rope tables are float64: they are computed here, and
    float32 would round them."""
    out = decode_start(program, meta)
    if "COS" in program.decls and "SIN" in program.decls:
        rows = program.decls["COS"].rows
        out["COS"], out["SIN"] = rope_tables(rows, meta["head_dim"], meta["rope_theta"])
    return out


def decode_start(program, meta):
    """What a padded decode step starts from: the token (BOS) and position (0), and every K cache
    `Kc<i>` with its mask column at the not-yet-written value."""
    out = {}
    hd = meta["head_dim"]
    for name, value in (("tok", meta.get("bos", 0)), ("pos", 0)):
        if name in program.decls:
            out[name] = np.array([[value]], dtype=np.float32)
    for name, d in program.decls.items():
        if re.fullmatch(r"Kc[0-9]+", name):
            if d.cols != meta["n_head_kv"] * (hd + 1):
                raise ProgramError(f"`{name}` is {d.rows} by {d.cols}, not a padded K cache of "
                                   f"{meta['n_head_kv']} heads of {hd} + 1", d.line, program.path)
            k = np.zeros((d.rows, d.cols), dtype=np.float32)
            k[:, hd::hd + 1] = MASK
            out[name] = k
    return out


# ── the import ────────────────────────────────────────────────────────────────────────────────────

def _unpermuter(meta):
    """llama.cpp permutes the Q and K rows of llama models: undo it as each tensor is read."""
    def fix(name, w):
        if name.endswith("attn_q.weight"):
            return unpermute(w, meta["n_head"])
        if name.endswith("attn_k.weight"):
            return unpermute(w, meta["n_head_kv"])
        return w
    return fix


def import_gguf(checkpoint, program, out_dir):
    """Write `out_dir/<var>.f32` for every leaf of `program` the GGUF or the decode step provides;
    returns the list of files written."""
    with nothing_left(out_dir), checkpoint_file(checkpoint, out_dir) as path:
        reader = open_gguf(path)
        meta = llama_meta(reader)
        plan = gguf_plan(program, reader, ALIASES.get(meta["arch"]))
        derived = derived_leaves(program, meta)
        check_fills(program, reader, plan, derived, checkpoint)
        leaves = gguf_leaves(program, reader, fix=_unpermuter(meta), plan=plan)
        return write_weights(out_dir, itertools.chain(leaves, derived.items()),
                             import_record(checkpoint, path, meta, program))


def write_program(checkpoint, program_path, context=DEFAULT_CONTEXT):
    """Generate the decode step from the checkpoint's metadata into `program_path`."""
    reader = open_gguf(resolve_checkpoint(checkpoint))
    text = llama_decode_program(llama_meta(reader), context, source=checkpoint)
    write_atomic(program_path, text)
    return text


# ── command line ──────────────────────────────────────────────────────────────────────────────────

def add_arguments(p):
    p.add_argument("checkpoint", help="a .gguf file, or package:MODULE/relative/path")
    p.add_argument("--program", required=True, help="the program whose leaves to write (PROG.logos)")
    p.add_argument("-o", "--out", help="the weights directory (<var>.f32 files)")
    p.add_argument("--write-program", action="store_true",
                   help="first write PROG.logos: the llama decode step from the GGUF's metadata")
    p.add_argument("--context", type=context, default=DEFAULT_CONTEXT,
                   help=f"rows of the KV caches and rope tables (default {DEFAULT_CONTEXT})")


def main(args):
    return run_import(args, lambda: write_program(args.checkpoint, args.program, args.context),
                      import_gguf)


def run_import(args, write, do_import):
    """An import command's body: `write()` the program when asked, then `do_import(checkpoint,
    program, out)` into `-o`; exit 2 when asked for neither."""
    from ..language.reader import read_file
    if args.write_program:
        write()
        print(f"wrote {args.program}")
    if args.out:
        program = read_file(args.program)
        written = do_import(args.checkpoint, program, args.out)
        total = sum(os.path.getsize(os.path.join(args.out, f)) for f in written)
        print(f"wrote {len(written)} files ({total / 1e6:.1f} MB) to {args.out}")
    elif not args.write_program:
        print("nothing to do: give -o OUT_DIR and/or --write-program")
        return 2
    return 0
