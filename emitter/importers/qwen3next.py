"""Qwen3-Next ("qwen3next") checkpoints, for transformers' `Qwen3NextForCausalLM`: the Qwen3.5
hybrid decoder (Gated DeltaNet and gated attention) whose FFNs are mixtures of routed experts
with a sigmoid-gated shared expert. The decode step, the import and the command are qwen35's
(`qwen35.convert` reads Qwen3-Next's fused Gated DeltaNet projections and its mixtures); this
module holds the tiny checkpoint.

- `make_tiny_checkpoint(out_dir, seed)`: a tiny random `Qwen3NextForCausalLM` saved offline.
"""

import argparse

from . import qwen35
from .qwen35 import add_arguments, import_checkpoint  # noqa: F401  (the command's, as qwen35's)

# 4 layers [delta, attention, delta, attention]; layers 0, 1, 3 a mixture of 8 experts (top 2,
# renormalised, a shared expert), layer 2 a dense FFN (mlp_only_layers); hv 4 > hk 2, rotary 4 of 8
TINY_CONFIG = dict(
    qwen35.TINY_CONFIG, vocab_size=96, intermediate_size=48,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[2],
)


def make_tiny_checkpoint(out_dir, seed=0, config=None):
    """Save a tiny random `Qwen3NextForCausalLM` (TINY_CONFIG unless given) to `out_dir`, every
    parameter drawn from `seed` as qwen35's are (the experts' tables and the router N(0, 1/fan_in),
    so the router's logits are about N(0, 1) and the top 2 of 8 differ from token to token)."""
    return qwen35.make_tiny_checkpoint(out_dir, seed, config or TINY_CONFIG,
                                       classes=("Qwen3NextForCausalLM", "Qwen3NextConfig"))


def main(args):
    return qwen35.main(args, make=make_tiny_checkpoint)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m emitter.importers.qwen3next")
    add_arguments(ap)
    raise SystemExit(main(ap.parse_args()))
