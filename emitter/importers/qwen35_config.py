"""The sizes of a Qwen3_5 or Qwen3-Next text config (config.json) as the decode step spells them
(`dims_of`: a `Dims`, or a ConfigError naming every value it cannot spell, a size that is no
positive whole number first), and the tiny config the tests' checkpoint is built from."""

import math
from dataclasses import dataclass

import numpy as np

from ..ops import EPS
from .bounds import size_problems

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
    # routed experts (Qwen3-Next): the layers whose FFN is a mixture, E experts of F, top k
    moe_layers: tuple = ()
    experts: int = 0
    top_k: int = 0
    moe_ffn: int = 0
    shared_ffn: int = 0
    renormalised: bool = True

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


def _not_whole(sizes):
    """The problems of `sizes` ({key: value}) that are no positive whole number."""
    return [f"{k} {v!r} is not a positive whole number" for k, v in sizes.items()
            if not (isinstance(v, int) and not isinstance(v, bool) and v > 0)]


def _moe_dims(get, n_layers, problems):
    """The routed-expert fields of Dims from a Qwen3-Next config (none when it has no experts)."""
    experts = get("num_experts", 0) or 0
    if not experts:
        return {}
    bad = _not_whole({k: get(k, d) for k, d in (("num_experts", 0), ("decoder_sparse_step", 1),
                     ("num_experts_per_tok", 0), ("moe_intermediate_size", None), ("shared_expert_intermediate_size", 0))})
    if bad or not isinstance(get("mlp_only_layers") or [], list):
        raise ConfigError(UNSPELT + "; ".join(bad or ["mlp_only_layers is not a list of layer numbers"]))
    step, dense = get("decoder_sparse_step", 1), set(get("mlp_only_layers") or [])
    layers = tuple(i for i in range(n_layers) if i not in dense and (i + 1) % step == 0)
    top_k, shared = get("num_experts_per_tok", 0), get("shared_expert_intermediate_size", 0)
    if top_k > experts:
        problems.append(f"num_experts_per_tok {top_k!r} of {experts} experts")
    return dict(moe_layers=layers, experts=experts, top_k=top_k, moe_ffn=get("moe_intermediate_size"),
                shared_ffn=shared, renormalised=bool(get("norm_topk_prob", True)))


# each size a config gives, with HF's default where its class has one: a positive whole number
SIZES = {"hidden_size": None, "vocab_size": None, "intermediate_size": None, "num_hidden_layers": 32,
         "num_attention_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
         "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_conv_kernel_dim": 4,
         "full_attention_interval": 4}
UNSPELT = "this Qwen3_5 config cannot be spelt by the tensor sugar: "


def dims_of(config, ctx=DEFAULT_CTX):
    """The decode step's sizes from a Qwen3_5 or Qwen3-Next text config (a config.json dict), or a
    ConfigError naming what it cannot be (a size no positive whole number, first)."""
    c = text_config(config)
    get = c.get
    n = {k: get(k, d) for k, d in {**SIZES, "num_key_value_heads": get("num_attention_heads", 16),
                                   "head_dim": None}.items()}
    rope = get("rope_parameters") if isinstance(get("rope_parameters"), dict) else {}
    theta = rope.get("rope_theta", get("rope_theta", 10000.0))
    factor = rope.get("partial_rotary_factor", get("partial_rotary_factor", 0.25))
    problems = _not_whole({k: v for k, v in n.items() if k != "head_dim" or v is not None}) + \
        [f"{k} {v!r} is not a positive number" for k, v in (("rope_theta", theta), ("partial_rotary_factor", factor))
         if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf]
    if not problems:   # (before a list of its layers is made)
        problems = size_problems(("num_hidden_layers", n["num_hidden_layers"]), {
            k: v for k, v in n.items() if k not in ("num_hidden_layers", "vocab_size", "full_attention_interval")
            and v is not None})
    if problems:
        raise ConfigError(UNSPELT + "; ".join(problems))
    rope_type = rope.get("rope_type", "default")
    heads, n_layers = n["num_attention_heads"], n["num_hidden_layers"]
    head_dim = n["head_dim"] or n["hidden_size"] // heads
    types = get("layer_types") or [
        "linear_attention" if (i + 1) % n["full_attention_interval"] else "full_attention"
        for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or not all(isinstance(t, str) for t in types):
        raise ConfigError(UNSPELT + f"layer_types is not a list of {n_layers} layer kinds")
    dk, dv = n["linear_key_head_dim"], n["linear_value_head_dim"]
    hk, hv = n["linear_num_key_heads"], n["linear_num_value_heads"]
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
    moe = _moe_dims(get, n_layers, problems)
    bad = sorted(set(types) - {"linear_attention", "full_attention"})
    if bad:
        problems.append(f"layer types {bad}")
    eps = get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not (isinstance(eps, (int, float)) and 0 < eps < math.inf):
        problems.append(f"rms_norm_eps {eps!r} is not a positive number")
    elif eps != EPS and "linear_attention" in types:
        problems.append(f"rms_norm_eps {eps!r} with Gated DeltaNet layers (`gated delta`'s own "
                        f"rmsnorm has epsilon {EPS!r})")
    rotary = int(head_dim * factor)
    if rotary % 2 or rotary <= 0:
        problems.append(f"rotary dim {rotary} is not a positive even number")
    if problems:
        raise ConfigError(UNSPELT + "; ".join(problems))
    return Dims(hidden=n["hidden_size"], vocab=n["vocab_size"], ffn=n["intermediate_size"],
                layer_types=tuple(types), heads=heads, kv_heads=n["num_key_value_heads"],
                head_dim=head_dim, rotary_dim=rotary, rope_theta=float(theta), hk=hk, hv=hv, d=dk,
                taps=n["linear_conv_kernel_dim"], eps=float(eps),
                tied=bool(get("tie_word_embeddings", False)), ctx=ctx, **moe)
