"""Qwen3.5 ("qwen35") as the sugar: the sizes of a `Qwen3_5ForCausalLM` text config and the text
of one greedy decode step (`generate_program`). The step reads the token `Tok` and the position `Pos`
(two 1 by 1 states), embeds the token, runs every layer (its kind from `layer_types`), and ends with
`Let nxt be argmax of logits.`, `Set row 0 of Tok to nxt.` and `Set row 0 of Pos to Pn.` (Pn = Pos
plus One, One a filled constant). So the program alone defines the whole decode: the VM's
`run(..., steps=N)` is N greedy steps, each starting from the states (KV tables, conv rings, delta
memories, token, position) the last one wrote. The program's output is the next token; the logits
are the stage `logits`.

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

import math

from .qwen35_config import DEFAULT_CTX, dims_of

MASK = -1e9

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


def _moe_decls(w, m, layer):
    """A Qwen3-Next mixture's weights: the router Wr, the experts' three tables (expert e's gate
    and up projections are columns e·F .. of Weg and Weu, its down projection the same rows of
    Wed), the shared expert Wsg, Wsu, Wsd and its gate's projection Wsi (D by 1)."""
    w.decl(f"Wr{layer}", m.hidden, m.experts)
    w.decl(f"Weg{layer}", m.hidden, m.experts * m.moe_ffn)
    w.decl(f"Weu{layer}", m.hidden, m.experts * m.moe_ffn)
    w.decl(f"Wed{layer}", m.experts * m.moe_ffn, m.hidden)
    w.decl(f"Wsg{layer}", m.hidden, m.shared_ffn)
    w.decl(f"Wsu{layer}", m.hidden, m.shared_ffn)
    w.decl(f"Wsd{layer}", m.shared_ffn, m.hidden)
    w.decl(f"Wsi{layer}", m.hidden, 1)


def _moe_step(w, m, L):
    """A mixture's sentences: the routed experts plus the shared expert scaled by sigmoid(xf Wsi),
    their sum `fd`, the FFN's output."""
    renorm = " renormalised" if m.renormalised else ""
    w(f"Let rl{L} be xf{L} matmul Wr{L}.")
    w(f"Let rw{L} be softmax routing of rl{L} choosing {m.top_k}{renorm}.")
    w(f"Let fe{L} be experts of xf{L} weighted by rw{L} with gate Weg{L} up Weu{L} down Wed{L}.")
    w(f"Let fg{L} be xf{L} matmul Wsg{L}.")
    w(f"Let fu{L} be xf{L} matmul Wsu{L}.")
    w(f"Let fs{L} be swiglu of fg{L} and fu{L}.")
    w(f"Let sd{L} be fs{L} matmul Wsd{L}.")
    w(f"Let sl{L} be xf{L} matmul Wsi{L}.")
    w(f"Let se{L} be sigmoid of sl{L}.")
    w(f"Let ss{L} be sd{L} hadamard se{L}.")
    w(f"Let fd{L} be fe{L} plus ss{L}.")


def generate_program(config, ctx=DEFAULT_CTX):
    """The LOGOS text of one greedy decode step of `config` (a Qwen3_5 config.json dict) with a KV
    cache of `ctx` rows (positions 0 .. ctx-1)."""
    m = dims_of(config, ctx)
    H, KV, hd, W = m.heads, m.kv_heads, m.head_dim, m.wide
    eps = f"with epsilon {m.eps!r}"
    kd, vd = m.hk * m.d, m.hv * m.d
    w = _Writer()
    kinds = ", ".join("attention" if t == "full_attention" else "delta" for t in m.layer_types)
    if m.experts:
        w("# Qwen3-Next (qwen3next) hybrid decoder with routed experts: one greedy decode step, "
          "generated by emitter.importers.qwen3next.")
        w(f"# experts on layers {list(m.moe_layers)}: {m.experts} of {m.moe_ffn}, top {m.top_k}"
          f"{' renormalised' if m.renormalised else ''}, a shared expert of {m.shared_ffn} gated "
          "by sigmoid(x Wsi);")
    else:
        w("# Qwen3.5 (qwen35) hybrid decoder: one greedy decode step, generated by emitter.importers.qwen35.")
    w(f"# hidden {m.hidden}, vocab {m.vocab}, ffn {m.ffn}, layers [{kinds}];")
    w(f"# attention {H} heads / {KV} KV heads of {hd}, rotary {m.rotary_dim} (theta {m.rope_theta:g});")
    w(f"# Gated DeltaNet {m.hv} value heads / {m.hk} key heads of {m.d}, conv {m.taps} taps; "
      f"KV cache {ctx} rows; rms epsilon {m.eps!r}.")
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
        if layer in m.moe_layers:
            _moe_decls(w, m, layer)
        else:
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
        w(f"Let x{L} be rmsnorm of {prev} with weight an{L} {eps}.")
        if kind == "full_attention":
            w(f"Let q{L} be x{L} matmul Wq{L}.")
            w(f"Let gate{L} be x{L} matmul Wqg{L}.")
            w(f"Let k{L} be x{L} matmul Wk{L}.")
            w(f"Let v{L} be x{L} matmul Wv{L}.")
            w(f"Let qn{L} be rmsnorm of q{L} with weight Qn{L} across {H} heads {eps}.")
            w(f"Let kn{L} be rmsnorm of k{L} with weight Kn{L} across {KV} heads {eps}.")
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
        w(f"Let xf{L} be rmsnorm of hm{L} with weight fn{L} {eps}.")
        if L in m.moe_layers:
            _moe_step(w, m, L)
        else:
            w(f"Let fg{L} be xf{L} matmul Wg{L}.")
            w(f"Let fu{L} be xf{L} matmul Wu{L}.")
            w(f"Let fs{L} be swiglu of fg{L} and fu{L}.")
            w(f"Let fd{L} be fs{L} matmul Wd{L}.")
        w(f"Let h{L} be hm{L} plus fd{L}.")
        prev = f"h{L}"
    w()
    w("## Output: the logits, then the next token and position written back")
    w(f"Let hn be rmsnorm of {prev} with weight on {eps}.")
    w("Let logits be hn matmul Wout.")
    w("Let nxt be argmax of logits.")
    w("Set row 0 of Tok to nxt.")
    w("Set row 0 of Pos to Pn.")
    return "\n".join(w.lines) + "\n"
