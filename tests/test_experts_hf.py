"""The routers and experts against transformers' own MoE layers at tiny configs, in float64:
DeepSeek-V3's `DeepseekV3MoE` (sigmoid scores, bias-corrected group-limited choice, scaled weights,
a shared expert) and Qwen3-Next's `Qwen3NextSparseMoeBlock` (softmax top-k, a sigmoid-gated shared
expert), each within 1e-12 of the VM on random tokens.

transformers computes each router in float32 whatever the model's dtype (DeepSeek-V3 casts the
hidden states and the router's weight; Qwen3-Next asks softmax for float32): `_float64_routers`
patches those two forwards to the same code in float64, and the controls show that without the
patch the layers differ from the VM by far more than 1e-12."""

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from emitter import read_program
from emitter.verify import vm

import transformers
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds  
from transformers.models.qwen3_next import modeling_qwen3_next as qn  

TOKENS = 64


def _deepseek_router_f64(self, hidden_states):
    """DeepseekV3TopkRouter.forward as transformers 5.25 writes it, without the float32 casts."""
    hidden_states = hidden_states.view(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    scores = router_logits.sigmoid()
    scores_for_choice = scores + self.e_score_correction_bias
    group_scores = (scores_for_choice.view(-1, self.num_group, self.num_experts // self.num_group)
                    .topk(2, dim=-1)[0].sum(dim=-1))
    group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = (group_mask.unsqueeze(-1).expand(-1, self.num_group, self.num_experts // self.num_group)
                  .reshape(-1, self.num_experts))
    scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
    topk_indices = torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_indices)
    if self.norm_topk_prob:
        topk_weights /= topk_weights.sum(dim=-1, keepdim=True) + 1e-20
    return router_logits, topk_weights * self.routed_scaling_factor, topk_indices


def _qwen_router_f64(self, hidden_states):
    """Qwen3NextTopKRouter.forward as transformers 5.25 writes it, its softmax in the model's dtype."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    router_probs = torch.nn.functional.softmax(router_logits, dim=-1)
    top, indices = torch.topk(router_probs, self.top_k, dim=-1)
    if self.norm_topk_prob:
        top /= top.sum(dim=-1, keepdim=True)
    return router_logits, top, indices


@contextlib.contextmanager
def _float64_routers(on=True):
    saved = ds.DeepseekV3TopkRouter.forward, qn.Qwen3NextTopKRouter.forward
    if on:
        ds.DeepseekV3TopkRouter.forward, qn.Qwen3NextTopKRouter.forward = _deepseek_router_f64, _qwen_router_f64
    try:
        yield
    finally:
        ds.DeepseekV3TopkRouter.forward, qn.Qwen3NextTopKRouter.forward = saved


def _randomised(module, seed, bias_std=0.0):
    """Every parameter redrawn (N(0, 1/fan_in); the router N(0, 1) so its scores spread), and the
    correction bias N(0, bias_std): module.double() with no zero left that would hide a mistake."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            std = 1.0 if name == "gate.weight" else p.shape[-1] ** -0.5
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * std)
        for name, b in module.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen, dtype=torch.float64) * bias_std)
    return module


def _np(t):
    return t.detach().to(torch.float64).numpy()


def _experts_tables(experts, f):
    """transformers' (E, 2F, D) gate_up_proj and (E, D, F) down_proj as the sugar's three tables:
    G, U `D by E·F` (expert e's columns e·F ..), D `E·F by D` (expert e's rows e·F ..)."""
    gu, down = _np(experts.gate_up_proj), _np(experts.down_proj)
    return (np.concatenate([g[:f].T for g in gu], axis=1), np.concatenate([g[f:].T for g in gu], axis=1),
            np.concatenate([d.T for d in down], axis=0))


# ── DeepSeek-V3 ──────────────────────────────────────────────────────────────────────────────────

DS = dict(hidden_size=16, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
          moe_intermediate_size=6, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True)

DS_PROGRAM = f"""Let x be a {TOKENS} by 16 tensor of Real.
Let Wr be a 16 by 16 tensor of Real.
Let Bias be a 1 by 16 tensor of Real.
Let G be a 16 by 96 tensor of Real.
Let U be a 16 by 96 tensor of Real.
Let D be a 96 by 16 tensor of Real.
Let Sg be a 16 by 6 tensor of Real.
Let Su be a 16 by 6 tensor of Real.
Let Sd be a 6 by 16 tensor of Real.
Let l be x matmul Wr.
Let r be sigmoid routing of l with bias Bias choosing 4 in 2 of 4 groups renormalised scaled by 2.5.
Let m be experts of x weighted by r with gate G up U down D.
Let sg be x matmul Sg.
Let su be x matmul Su.
Let sh be swiglu of sg and su.
Let so be sh matmul Sd.
Let y be m plus so.
"""


def _deepseek(seed, bias_std):
    config = transformers.DeepseekV3Config(**DS)
    config._experts_implementation = "eager"
    layer = _randomised(ds.DeepseekV3MoE(config).double(), seed, bias_std)
    g, u, d = _experts_tables(layer.experts, 6)
    sh = layer.shared_experts
    values = {"Wr": _np(layer.gate.weight).T, "Bias": _np(layer.gate.e_score_correction_bias)[None],
              "G": g, "U": u, "D": d, "Sg": _np(sh.gate_proj.weight).T,
              "Su": _np(sh.up_proj.weight).T, "Sd": _np(sh.down_proj.weight).T}
    return layer, values


def _run(program_text, layer, values, x):
    trace = vm.run(read_program(program_text), dict(values, x=x), keep_stages=True)[0]
    with torch.no_grad():
        want = _np(layer(torch.from_numpy(x)[None]))[0]
    return trace, want


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_deepseek_v3_moe_within_1e_12_and_the_bias_changes_choices(seed):
    layer, values = _deepseek(seed, bias_std=0.3)
    x = np.random.default_rng(seed).standard_normal((TOKENS, 16))
    with _float64_routers():
        trace, want = _run(DS_PROGRAM, layer, values, x)
        np.testing.assert_allclose(trace.output, want, rtol=0, atol=1e-12)
        _, weights, chosen = layer.gate(torch.from_numpy(x))
    route = trace.stages[1]
    for t in range(TOKENS):   # the same experts, with the same weights
        assert sorted(chosen[t].tolist()) == list(np.flatnonzero(route[t]))
        np.testing.assert_allclose(np.sort(route[t][route[t] != 0]), np.sort(_np(weights[t])), atol=1e-14)
    # the inputs are ones where the bias matters: without it, other experts for some tokens
    unbiased = vm.run(read_program(DS_PROGRAM), dict(values, x=x, Bias=0 * values["Bias"]),
                      keep_stages=True)[0].stages[1]
    flips = ((unbiased != 0) != (route != 0)).any(axis=1).sum()
    assert flips >= TOKENS // 8, flips


def test_deepseek_v3_in_transformers_float32_router_is_what_the_patch_removes():
    layer, values = _deepseek(0, bias_std=0.3)
    x = np.random.default_rng(0).standard_normal((TOKENS, 16))
    trace, want = _run(DS_PROGRAM, layer, values, x)
    assert np.abs(trace.output - want).max() > 1e-9


# ── Qwen3-Next ───────────────────────────────────────────────────────────────────────────────────

QN = dict(hidden_size=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=6,
          shared_expert_intermediate_size=10, norm_topk_prob=True)


def _qn_program(renormalised):
    flag = " renormalised" if renormalised else ""
    return f"""Let x be a {TOKENS} by 16 tensor of Real.
Let Wr be a 16 by 8 tensor of Real.
Let G be a 16 by 48 tensor of Real.
Let U be a 16 by 48 tensor of Real.
Let D be a 48 by 16 tensor of Real.
Let Sg be a 16 by 10 tensor of Real.
Let Su be a 16 by 10 tensor of Real.
Let Sd be a 10 by 16 tensor of Real.
Let Ws be a 16 by 1 tensor of Real.
Let l be x matmul Wr.
Let r be softmax routing of l choosing 2{flag}.
Let m be experts of x weighted by r with gate G up U down D.
Let sg be x matmul Sg.
Let su be x matmul Su.
Let sh be swiglu of sg and su.
Let so be sh matmul Sd.
Let gl be x matmul Ws.
Let gs be sigmoid of gl.
Let sc be so hadamard gs.
Let y be m plus sc.
"""


def _qwen(seed, renormalised):
    config = transformers.Qwen3NextConfig(**dict(QN, norm_topk_prob=renormalised))
    config._experts_implementation = "eager"
    layer = _randomised(qn.Qwen3NextSparseMoeBlock(config).double(), seed)
    g, u, d = _experts_tables(layer.experts, 6)
    sh = layer.shared_expert
    values = {"Wr": _np(layer.gate.weight).T, "G": g, "U": u, "D": d,
              "Sg": _np(sh.gate_proj.weight).T, "Su": _np(sh.up_proj.weight).T,
              "Sd": _np(sh.down_proj.weight).T, "Ws": _np(layer.shared_expert_gate.weight).T}
    return layer, values


@pytest.mark.parametrize("seed, renormalised", [(0, True), (1, True), (2, False)])
def test_qwen3_next_sparse_moe_block_within_1e_12(seed, renormalised):
    layer, values = _qwen(seed, renormalised)
    x = np.random.default_rng(seed).standard_normal((TOKENS, 16))
    with _float64_routers():
        trace, want = _run(_qn_program(renormalised), layer, values, x)
    np.testing.assert_allclose(trace.output, want, rtol=0, atol=1e-12)
    sums = trace.stages[1].sum(axis=1)
    assert np.allclose(sums, 1.0) == renormalised       # the setting matters on these inputs


def test_qwen3_next_float32_softmax_is_what_the_patch_removes():
    layer, values = _qwen(0, True)
    x = np.random.default_rng(0).standard_normal((TOKENS, 16))
    trace, want = _run(_qn_program(True), layer, values, x)
    assert np.abs(trace.output - want).max() > 1e-9
