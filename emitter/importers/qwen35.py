"""Qwen3.5 ("qwen35"): the hybrid Gated DeltaNet + gated-attention decoder as one LOGOS decode step.

Three things live here, all for transformers' `Qwen3_5ForCausalLM` (text config, dense MLP):

- `generate_program(config, ctx)`: the tensor sugar of one greedy decode step for a config
  (config.json as a dict). The step reads the token `Tok` and the position `Pos` (two 1 by 1
  states), embeds the token, runs every layer (its kind from `layer_types`), and ends with
  `Let nxt be argmax of logits.`, `Set row 0 of Tok to nxt.` and `Set row 0 of Pos to Pn.`
  (Pn = Pos plus One, One a filled constant). So the program alone defines the whole decode: the
  VM's `run(..., steps=N)` is N greedy steps, each starting from the states (KV tables, conv rings,
  delta memories, token, position) the last one wrote. The program's output is the next token;
  the logits are the stage `logits`.
- `import_checkpoint(checkpoint, program, out_dir)`: config.json + model.safetensors (as
  `save_pretrained` writes them) to a weights directory of `<var>.f64` files, with the layout
  changes of REFERENCES.md ("How qwen35 maps onto the sugar"), plus the rope tables COS/SIN
  (rows = positions) and the first token and position.
- `make_tiny_checkpoint(out_dir, seed)`: a tiny random `Qwen3_5ForCausalLM` saved offline.

The causal mask. The sugar's `attention` softmaxes over every row of the KV table, and a decode
step's table has rows that no token has written yet (zeros: score 0, which would take weight).
The step masks them exactly with sugar ops: each head is widened by one column (hd -> hd + 1).
The query's extra column is 1 (`Qx = qr matmul Eq plus Mq`), a key's is 0 (`Ke = kr matmul Ek`),
and the KV table is declared with MASK in every row's extra key column (`Set item` fills), so a
row not yet written scores MASK / sqrt(hd + 1) (e^that is exactly 0.0 in float64 and float32)
and a written row scores exactly q.k / sqrt(hd): Eq scales by sqrt((hd + 1) / hd) to undo the
wider head's 1/sqrt(hd + 1). Values get a 0 column (`Ve = v matmul Ek`) and `Dq` drops the
extra columns after attention. Eq, Ek, Mq, Dq are 0/1 (and one scale) placement matrices filled
in the program; they are no weights and have no GGUF name.
"""

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass

import numpy as np

from ..files import write_atomic, write_files
from ..errors import ProgramError

MASK = -1e9
DEFAULT_CTX = 8

# The tiny config `make_tiny_checkpoint` builds: both layer kinds, hv > hk, partial rotary.
TINY_CONFIG = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False,
    tie_word_embeddings=False, max_position_embeddings=64,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
)


class ConfigError(ValueError):
    """A config the decode step cannot spell exactly."""


def text_config(config):
    """The text part of a config.json dict (a `Qwen3_5ForConditionalGeneration` nests it)."""
    return config.get("text_config", config) if isinstance(config.get("text_config"), dict) else config


@dataclass(frozen=True)
class Dims:
    hidden: int
    vocab: int
    ffn: int
    layer_types: tuple
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    hk: int
    hv: int
    d: int
    taps: int
    eps: float
    tied: bool
    ctx: int

    @property
    def half(self):
        return self.rotary_dim // 2

    @property
    def wide(self):
        """The attention head widened by the mask column."""
        return self.head_dim + 1

    @property
    def attention_layers(self):
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    @property
    def ratio(self):
        return self.hv // self.hk

    def value_order(self):
        """order[j] = the HF value head that the sugar's value head j is: the sugar's head
        s·hk + g reads key head g (h mod hk); HF's head g·r + s reads key head g (h // r)."""
        r = self.ratio
        return np.array([(j % self.hk) * r + j // self.hk for j in range(self.hv)])


def dims_of(config, ctx=DEFAULT_CTX):
    """The decode step's sizes from a Qwen3_5 text config (a config.json dict), or a ConfigError."""
    c = text_config(config)
    get = c.get
    rope = dict(get("rope_parameters") or {})
    theta = rope.get("rope_theta", get("rope_theta", 10000.0))
    factor = rope.get("partial_rotary_factor", get("partial_rotary_factor", 0.25))
    rope_type = rope.get("rope_type", "default")
    heads = get("num_attention_heads", 16)
    head_dim = get("head_dim") or get("hidden_size") // heads
    n_layers = get("num_hidden_layers", 32)
    types = get("layer_types") or [
        "linear_attention" if (i + 1) % get("full_attention_interval", 4) else "full_attention"
        for i in range(n_layers)]
    dk, dv = get("linear_key_head_dim", 128), get("linear_value_head_dim", 128)
    hk, hv = get("linear_num_key_heads", 16), get("linear_num_value_heads", 32)
    problems = []
    if rope_type != "default":
        problems.append(f"rope_type {rope_type!r} (only the default rope is spelt)")
    if dk != dv:
        problems.append(f"linear key head dim {dk} != value head dim {dv} (`gated delta` has one d)")
    if hv % hk:
        problems.append(f"{hk} key heads do not divide {hv} value heads")
    if get("attention_bias", False):
        problems.append("attention_bias (the sugar's projections have no bias)")
    if get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {get('hidden_act')!r} (swiglu and the conv's activation are silu)")
    if get("num_experts", 0):
        problems.append("a routed-expert MLP (`moe` has no spelling)")
    bad = sorted(set(types) - {"linear_attention", "full_attention"})
    if bad:
        problems.append(f"layer types {bad}")
    rotary = int(head_dim * factor)
    if rotary % 2 or rotary <= 0:
        problems.append(f"rotary dim {rotary} is not a positive even number")
    if problems:
        raise ConfigError("this Qwen3_5 config cannot be spelt by the tensor sugar: " + "; ".join(problems))
    return Dims(hidden=get("hidden_size"), vocab=get("vocab_size"), ffn=get("intermediate_size"),
                layer_types=tuple(types), heads=heads, kv_heads=get("num_key_value_heads", heads),
                head_dim=head_dim, rotary_dim=rotary, rope_theta=float(theta), hk=hk, hv=hv, d=dk,
                taps=get("linear_conv_kernel_dim", 4), eps=float(get("rms_norm_eps", 1e-6)),
                tied=bool(get("tie_word_embeddings", False)), ctx=ctx)


# ── the program ──────────────────────────────────────────────────────────────────────────────────

def _placements(m):
    """Eq, Ek, Dq, Mq as (rows, cols, {flat index: value}) for the mask column."""
    hd, wide = m.head_dim, m.wide
    scale = math.sqrt(wide / hd)
    eq = {(h * hd + i) * (m.heads * wide) + h * wide + i: scale
          for h in range(m.heads) for i in range(hd)}
    ek = {(g * hd + i) * (m.kv_heads * wide) + g * wide + i: 1
          for g in range(m.kv_heads) for i in range(hd)}
    dq = {(h * wide + i) * (m.heads * hd) + h * hd + i: 1 for h in range(m.heads) for i in range(hd)}
    cq = {h * wide + hd: 1 for h in range(m.heads)}
    return {"Eq": (m.heads * hd, m.heads * wide, eq), "Ek": (m.kv_heads * hd, m.kv_heads * wide, ek),
            "Dq": (m.heads * wide, m.heads * hd, dq), "Mq": (1, m.heads * wide, cq)}


class _Writer:
    def __init__(self):
        self.lines = []

    def __call__(self, text=""):
        self.lines.append(text)

    def decl(self, name, rows, cols, kind="Real"):
        self(f"Let {name} be a {rows} by {cols} tensor of {kind}.")

    def fills(self, name, items):
        for index in sorted(items):
            value = items[index]
            self(f"Set item {index + 1} of {name} to {value!r}.")


def generate_program(config, ctx=DEFAULT_CTX):
    """The LOGOS text of one greedy decode step of `config` (a Qwen3_5 config.json dict) with a KV
    cache of `ctx` rows (positions 0 .. ctx-1)."""
    m = dims_of(config, ctx)
    H, KV, hd, W = m.heads, m.kv_heads, m.head_dim, m.wide
    kd, vd = m.hk * m.d, m.hv * m.d
    w = _Writer()
    kinds = ", ".join("attention" if t == "full_attention" else "delta" for t in m.layer_types)
    w("# Qwen3.5 (qwen35) hybrid decoder: one greedy decode step, generated by emitter.importers.qwen35.")
    w(f"# hidden {m.hidden}, vocab {m.vocab}, ffn {m.ffn}, layers [{kinds}];")
    w(f"# attention {H} heads / {KV} KV heads of {hd}, rotary {m.rotary_dim} (theta {m.rope_theta:g});")
    w(f"# Gated DeltaNet {m.hv} value heads / {m.hk} key heads of {m.d}, conv {m.taps} taps; "
      f"KV cache {ctx} rows.")
    w("# Tok and Pos are the step's token and position; the step writes back the next token (argmax)")
    w("# and Pos + 1. Each attention head carries one extra mask column (see qwen35.py): rows of the")
    w(f"# KV table no token has written hold {MASK!r} there and take no weight.")
    w()
    w("## Inputs and constants")
    w.decl("Tok", 1, 1, "Int")
    w.decl("Pos", 1, 1, "Int")
    w.decl("One", 1, 1, "Int")
    w.fills("One", {0: 1})
    w.decl("emb", m.vocab, m.hidden)
    w.decl("COS", ctx, m.half)
    w.decl("SIN", ctx, m.half)
    if m.attention_layers:
        for name, (rows, cols, items) in _placements(m).items():
            w.decl(name, rows, cols)
            w.fills(name, items)
    for layer, kind in enumerate(m.layer_types):
        w()
        w(f"## Layer {layer} weights and states ({'gated attention' if kind == 'full_attention' else 'Gated DeltaNet'})")
        w.decl(f"an{layer}", 1, m.hidden)
        w.decl(f"fn{layer}", 1, m.hidden)
        if kind == "full_attention":
            w.decl(f"Wq{layer}", m.hidden, H * hd)
            w.decl(f"Wqg{layer}", m.hidden, H * hd)
            w.decl(f"Wk{layer}", m.hidden, KV * hd)
            w.decl(f"Wv{layer}", m.hidden, KV * hd)
            w.decl(f"Qn{layer}", 1, hd)
            w.decl(f"Kn{layer}", 1, hd)
            w.decl(f"Wo{layer}", H * hd, m.hidden)
            w.decl(f"Kc{layer}", ctx, KV * W)
            w.fills(f"Kc{layer}", {r * KV * W + g * W + hd: MASK for r in range(ctx) for g in range(KV)})
            w.decl(f"Vc{layer}", ctx, KV * W)
        else:
            w.decl(f"Wq{layer}", m.hidden, kd)
            w.decl(f"Wk{layer}", m.hidden, kd)
            w.decl(f"Wv{layer}", m.hidden, vd)
            w.decl(f"Wz{layer}", m.hidden, vd)
            w.decl(f"Wcq{layer}", m.taps, kd)
            w.decl(f"Wck{layer}", m.taps, kd)
            w.decl(f"Wcv{layer}", m.taps, vd)
            w.decl(f"Cq{layer}", m.taps, kd)
            w.decl(f"Ck{layer}", m.taps, kd)
            w.decl(f"Cv{layer}", m.taps, vd)
            w.decl(f"Wb{layer}", m.hidden, m.hv)
            w.decl(f"Wa{layer}", m.hidden, m.hv)
            w.decl(f"Dt{layer}", 1, m.hv)
            w.decl(f"Al{layer}", 1, m.hv)
            w.decl(f"Gn{layer}", 1, m.d)
            w.decl(f"S{layer}", m.hv * m.d, m.d)
            w.decl(f"Wo{layer}", vd, m.hidden)
        w.decl(f"Wg{layer}", m.hidden, m.ffn)
        w.decl(f"Wu{layer}", m.hidden, m.ffn)
        w.decl(f"Wd{layer}", m.ffn, m.hidden)
    w()
    w.decl("on", 1, m.hidden)
    w.decl("Wout", m.hidden, m.vocab)
    w()
    w("## The step")
    w("Let Pn be Pos plus One.")
    w("Let hin be row Tok of emb.")
    if m.attention_layers:
        w("Let rc be row Pos of COS.")
        w("Let rs be row Pos of SIN.")
    prev = "hin"
    for layer, kind in enumerate(m.layer_types):
        L = layer
        w()
        w(f"## Layer {L}")
        w(f"Let x{L} be rmsnorm of {prev} with weight an{L}.")
        if kind == "full_attention":
            w(f"Let q{L} be x{L} matmul Wq{L}.")
            w(f"Let gate{L} be x{L} matmul Wqg{L}.")
            w(f"Let k{L} be x{L} matmul Wk{L}.")
            w(f"Let v{L} be x{L} matmul Wv{L}.")
            w(f"Let qn{L} be rmsnorm of q{L} with weight Qn{L} across {H} heads.")
            w(f"Let kn{L} be rmsnorm of k{L} with weight Kn{L} across {KV} heads.")
            w(f"Let qr{L} be rope of qn{L} with cos rc and sin rs across {H} heads.")
            w(f"Let kr{L} be rope of kn{L} with cos rc and sin rs across {KV} heads.")
            w(f"Let qe{L} be qr{L} matmul Eq.")
            w(f"Let Qx{L} be qe{L} plus Mq.")
            w(f"Let Ke{L} be kr{L} matmul Ek.")
            w(f"Let Ve{L} be v{L} matmul Ek.")
            w(f"Set row Pos of Kc{L} to Ke{L}.")
            w(f"Set row Pos of Vc{L} to Ve{L}.")
            w(f"Let ax{L} be attention of Qx{L} over Kc{L} and Vc{L} with {H} heads {KV} groups.")
            w(f"Let ao{L} be ax{L} matmul Dq.")
            w(f"Let sg{L} be sigmoid of gate{L}.")
            w(f"Let ag{L} be ao{L} hadamard sg{L}.")
            w(f"Let y{L} be ag{L} matmul Wo{L}.")
        else:
            w(f"Let q{L} be x{L} matmul Wq{L}.")
            w(f"Let k{L} be x{L} matmul Wk{L}.")
            w(f"Let v{L} be x{L} matmul Wv{L}.")
            w(f"Let cq{L} be causal conv of q{L} with weight Wcq{L} state Cq{L} over {m.taps} taps.")
            w(f"Let ck{L} be causal conv of k{L} with weight Wck{L} state Ck{L} over {m.taps} taps.")
            w(f"Let cv{L} be causal conv of v{L} with weight Wcv{L} state Cv{L} over {m.taps} taps.")
            w(f"Let sq{L} be silu of cq{L}.")
            w(f"Let sk{L} be silu of ck{L}.")
            w(f"Let sv{L} be silu of cv{L}.")
            w(f"Let nq{L} be l2norm of sq{L} across {m.hk} heads.")
            w(f"Let nk{L} be l2norm of sk{L} across {m.hk} heads.")
            w(f"Let z{L} be x{L} matmul Wz{L}.")
            w(f"Let bl{L} be x{L} matmul Wb{L}.")
            w(f"Let beta{L} be sigmoid of bl{L}.")
            w(f"Let ar{L} be x{L} matmul Wa{L}.")
            w(f"Let alpha{L} be decay of ar{L} with bias Dt{L} rate Al{L}.")
            w(f"Let o{L} be gated delta of nq{L} over nk{L} and sv{L} with gate z{L} beta beta{L} "
              f"decay alpha{L} state S{L} norm Gn{L} with {m.hv} heads {m.hk} groups.")
            w(f"Let y{L} be o{L} matmul Wo{L}.")
        w(f"Let hm{L} be {prev} plus y{L}.")
        w(f"Let xf{L} be rmsnorm of hm{L} with weight fn{L}.")
        w(f"Let fg{L} be xf{L} matmul Wg{L}.")
        w(f"Let fu{L} be xf{L} matmul Wu{L}.")
        w(f"Let fs{L} be swiglu of fg{L} and fu{L}.")
        w(f"Let fd{L} be fs{L} matmul Wd{L}.")
        w(f"Let h{L} be hm{L} plus fd{L}.")
        prev = f"h{L}"
    w()
    w("## Output: the logits, then the next token and position written back")
    w(f"Let hn be rmsnorm of {prev} with weight on.")
    w("Let logits be hn matmul Wout.")
    w("Let nxt be argmax of logits.")
    w("Set row 0 of Tok to nxt.")
    w("Set row 0 of Pos to Pn.")
    return "\n".join(w.lines) + "\n"


# ── the importer ─────────────────────────────────────────────────────────────────────────────────

def checkpoint_files(checkpoint):
    """(directory, [safetensors paths]) of a checkpoint given as its directory or as its one
    `model.safetensors` file (config.json beside it)."""
    if os.path.isfile(checkpoint):
        return os.path.dirname(os.path.abspath(checkpoint)), [checkpoint]
    if not os.path.isdir(checkpoint):
        raise ProgramError("no such checkpoint file or directory", path=checkpoint)
    files = sorted(os.path.join(checkpoint, f) for f in os.listdir(checkpoint)
                   if f.endswith(".safetensors"))
    if not files:
        raise ProgramError("no *.safetensors file in the checkpoint directory", path=checkpoint)
    return checkpoint, files


def read_config(checkpoint):
    """The config.json dict of a checkpoint (its directory, or a safetensors file inside it)."""
    path = os.path.join(checkpoint_files(checkpoint)[0], "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ProgramError(f"cannot read the config: {e}", path=path) from None


def _read_tensors(checkpoint):
    from safetensors import safe_open
    tensors = {}
    for path in checkpoint_files(checkpoint)[1]:
        try:
            with safe_open(path, framework="np") as f:
                for key in f.keys():
                    tensors[key] = f.get_tensor(key).astype(np.float64)
        except TypeError:  # bf16 needs ml_dtypes, or torch
            import torch
            from safetensors.torch import load_file
            for key, t in load_file(path).items():
                tensors[key] = t.to(torch.float64).numpy()
    return tensors


def _prefix(tensors):
    for p in ("model.language_model.", "model.", ""):
        if p + "embed_tokens.weight" in tensors:
            return p
    raise ProgramError("no `embed_tokens.weight` in the checkpoint: not a Qwen3_5 text model")


def rope_tables(m):
    """COS, SIN: row p holds cos/sin(p · inv_freq), inv_freq_i = theta^(-2i / rotary_dim)."""
    inv = 1.0 / m.rope_theta ** (np.arange(0, m.rotary_dim, 2, dtype=np.float64) / m.rotary_dim)
    angles = np.arange(m.ctx, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(angles), np.sin(angles)


def convert(tensors, m):
    """Every weight leaf of the decode step (var -> 2-D float64 array) from HF tensors."""
    pre = _prefix(tensors)

    def t(name):
        try:
            return tensors[pre + name]
        except KeyError:
            raise ProgramError(f"the checkpoint has no tensor `{pre + name}`") from None

    out = {"emb": t("embed_tokens.weight"), "on": (t("norm.weight") + 1.0).reshape(1, -1)}
    lm = tensors.get("lm_head.weight")
    out["Wout"] = (out["emb"] if lm is None else lm).T
    order = m.value_order()
    kd, d = m.hk * m.d, m.d
    for layer, kind in enumerate(m.layer_types):
        b = f"layers.{layer}."
        out[f"an{layer}"] = (t(b + "input_layernorm.weight") + 1.0).reshape(1, -1)
        out[f"fn{layer}"] = (t(b + "post_attention_layernorm.weight") + 1.0).reshape(1, -1)
        out[f"Wg{layer}"] = t(b + "mlp.gate_proj.weight").T
        out[f"Wu{layer}"] = t(b + "mlp.up_proj.weight").T
        out[f"Wd{layer}"] = t(b + "mlp.down_proj.weight").T
        if kind == "full_attention":
            a = b + "self_attn."
            qg = t(a + "q_proj.weight").reshape(m.heads, 2, m.head_dim, m.hidden)  # per head [q | gate]
            out[f"Wq{layer}"] = qg[:, 0].reshape(-1, m.hidden).T
            out[f"Wqg{layer}"] = qg[:, 1].reshape(-1, m.hidden).T
            out[f"Wk{layer}"] = t(a + "k_proj.weight").T
            out[f"Wv{layer}"] = t(a + "v_proj.weight").T
            out[f"Wo{layer}"] = t(a + "o_proj.weight").T
            out[f"Qn{layer}"] = (t(a + "q_norm.weight") + 1.0).reshape(1, -1)
            out[f"Kn{layer}"] = (t(a + "k_norm.weight") + 1.0).reshape(1, -1)
        else:
            a = b + "linear_attn."

            def heads(x, axis=0):
                """x with its value-head blocks (d wide along `axis`) in the sugar's order."""
                x = np.moveaxis(x, axis, 0)
                x = x.reshape(m.hv, d, *x.shape[1:])[order].reshape(m.hv * d, *x.shape[1:])
                return np.moveaxis(x, 0, axis)

            qkv = t(a + "in_proj_qkv.weight")
            conv = t(a + "conv1d.weight").reshape(-1, m.taps)      # (channels, taps)
            out[f"Wq{layer}"] = qkv[:kd].T
            out[f"Wk{layer}"] = qkv[kd:2 * kd].T
            out[f"Wv{layer}"] = heads(qkv[2 * kd:]).T
            out[f"Wcq{layer}"] = conv[:kd].T
            out[f"Wck{layer}"] = conv[kd:2 * kd].T
            out[f"Wcv{layer}"] = heads(conv[2 * kd:]).T
            out[f"Wz{layer}"] = heads(t(a + "in_proj_z.weight")).T
            out[f"Wb{layer}"] = t(a + "in_proj_b.weight")[order].T
            out[f"Wa{layer}"] = t(a + "in_proj_a.weight")[order].T
            out[f"Dt{layer}"] = t(a + "dt_bias")[order].reshape(1, -1)
            out[f"Al{layer}"] = -np.exp(t(a + "A_log")[order]).reshape(1, -1)
            out[f"Gn{layer}"] = t(a + "norm.weight").reshape(1, -1)        # gated norm: not zero-centred
            out[f"Wo{layer}"] = heads(t(a + "out_proj.weight"), axis=1).T
    return {k: np.ascontiguousarray(v, dtype=np.float64) for k, v in out.items()}


def import_checkpoint(checkpoint, program, out_dir, token=0, position=0, dtype="f64"):
    """`checkpoint` is a directory or its safetensors file. Write every leaf of `program` the
    checkpoint defines (plus COS, SIN, Tok, Pos) into `out_dir`
    as `<var>.f64` (or `.f32`). Returns {"written": [...], "declared": [...]}: the leaves left to
    their declared values (states, filled constants)."""
    config = read_config(checkpoint)
    m = dims_of(config, ctx=program.decls["COS"].rows if "COS" in program.decls else DEFAULT_CTX)
    values = convert(_read_tensors(checkpoint), m)
    values["COS"], values["SIN"] = rope_tables(m)
    values["Tok"] = np.array([[float(token)]])
    values["Pos"] = np.array([[float(position)]])
    if not 0 <= token < m.vocab:
        raise ProgramError(f"token {token} is outside the vocabulary (0..{m.vocab - 1})")
    if not 0 <= position < m.ctx:
        raise ProgramError(f"position {position} is outside the KV cache (0..{m.ctx - 1})")
    files, declared = {}, []
    np_dtype, ext = ("<f4", ".f32") if dtype == "f32" else ("<f8", ".f64")
    for name in program.leaves:
        if name not in values:
            declared.append(name)
            continue
        d = program.decls[name]
        v = values[name]
        if v.shape != (d.rows, d.cols):
            raise ProgramError(f"`{name}` is {d.rows} by {d.cols} in the program but the checkpoint "
                               f"gives {v.shape[0]} by {v.shape[1]}", d.line, program.path)
        files[name + ext] = v.astype(np_dtype).tobytes()
    write_files(out_dir, files)
    return {"written": sorted(files), "declared": declared, "eps": m.eps}


# ── the tiny checkpoint ──────────────────────────────────────────────────────────────────────────

def make_tiny_checkpoint(out_dir, seed=0, config=None):
    """Save a tiny random `Qwen3_5ForCausalLM` (TINY_CONFIG unless given) to `out_dir` with
    `save_pretrained`, offline. Every parameter is drawn from `seed`: projections N(0, 1/fan_in),
    embeddings N(0, 1), the zero-centred norms N(0, 0.3) (so w + 1 is tested), the gated norm
    1 + N(0, 0.3), conv taps N(0, 0.5), dt_bias N(0, 0.5), A_log = log U(0.1, 1) (decays well
    inside (0, 1), so the memory carries from step to step)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(**(config or TINY_CONFIG))
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std

    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("A_log"):
                p.copy_(torch.log(0.1 + 0.9 * torch.rand(p.shape, generator=gen)))
            elif name.endswith("dt_bias"):
                p.copy_(normal(p.shape, 0.5))
            elif name.endswith("conv1d.weight"):
                p.copy_(normal(p.shape, 0.5))
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + normal(p.shape, 0.3))
            elif "norm" in name:
                p.copy_(normal(p.shape, 0.3))
            elif "embed_tokens" in name:
                p.copy_(normal(p.shape, 1.0))
            else:
                p.copy_(normal(p.shape, 1.0 / math.sqrt(p.shape[-1])))
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    extra = os.path.join(out_dir, "generation_config.json")  # nothing here reads it
    if os.path.exists(extra):
        os.unlink(extra)
    return out_dir


# ── command line ─────────────────────────────────────────────────────────────────────────────────

def add_arguments(p):
    p.add_argument("checkpoint", help="HF checkpoint: its directory (config.json + *.safetensors), "
                                      "or its model.safetensors with config.json beside it")
    p.add_argument("--program", required=True, help="the decode-step program (PROG.logos)")
    p.add_argument("-o", "--out", required=True, help="weights directory to write")
    p.add_argument("--token", type=int, default=0, help="the first step's token (Tok.f64)")
    p.add_argument("--position", type=int, default=0, help="the first step's position (Pos.f64)")
    p.add_argument("--dtype", choices=["f64", "f32"], default="f64")
    p.add_argument("--ctx", type=int, default=DEFAULT_CTX,
                   help="KV cache rows when the program is written (--write-program)")
    p.add_argument("--write-program", action="store_true",
                   help="first write the program generated from the checkpoint's config to --program")
    p.add_argument("--tiny-seed", type=int, default=None,
                   help="first make the tiny random checkpoint with this seed in the directory "
                        "CHECKPOINT (if it has no config.json yet)")


def main(args):
    from ..reader import read_file
    if args.tiny_seed is not None and not os.path.isfile(os.path.join(args.checkpoint, "config.json")):
        make_tiny_checkpoint(args.checkpoint, args.tiny_seed)
    try:
        if args.write_program:
            write_atomic(args.program, generate_program(read_config(args.checkpoint), args.ctx))
        program = read_file(args.program)
        done = import_checkpoint(args.checkpoint, program, args.out, args.token, args.position,
                                 args.dtype)
    except (ConfigError, OSError) as e:
        print(f"{args.checkpoint}: {e}", file=sys.stderr)
        return 2
    if done["eps"] != 1e-6:
        print(f"{args.checkpoint}: rms_norm_eps is {done['eps']}, the sugar's is 1e-6: the step "
              "is near the checkpoint's model, not equal to it", file=sys.stderr)
    print(json.dumps({"weights": args.out, "written": len(done["written"]),
                      "declared": done["declared"]}))
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m emitter.importers.qwen35")
    add_arguments(ap)
    raise SystemExit(main(ap.parse_args()))
