"""Bugs below bf16's rounding noise but systematic, planted into a bundle's model.py, for the
bfloat16 gate's tests and bench/bench_bf16.py. Each takes the model.py text and a layer number and
returns the mutated text (a ValueError when the program has no such place). Some are planted in
one layer (the seed's), some everywhere their cause would act (a config's epsilon, a runtime
function, the logits' precision)."""

import re


def _once(text, pattern, replace):
    new, n = re.subn(pattern, replace, text, count=1)
    if not n:
        raise ValueError(f"no place for the bug: {pattern}")
    return new


def _all(text, pattern, replace):
    new, n = re.subn(pattern, replace, text)
    if not n:
        raise ValueError(f"no place for the bug: {pattern}")
    return new


def mlp_gain(text, layer):
    """A 0.4% gain in one layer's MLP down projection (`self.matmul(…, self.cast(i, Wd<layer>, …))`)."""
    return _once(text, rf"(= self\.tap\((\d+), self\.matmul\(self\.cast\(\2, \w+\), self\.cast\(\2, Wd{layer}, "
                 r"widened=True\)\))\)", r"\1 * 1.004)")


def eps_tenfold(text, layer):
    """Every rmsnorm with ten times its epsilon (1e-5 where 1e-6 was meant: a config's epsilon
    misread acts in every norm). Its effect is eps·9/(2·mean(x²)) relative, so it shows where the
    activations are small (SmolLM2's first layer); where they are not it moves no bf16 value."""
    def tenfold(m):
        return m.group(1) + repr(float(m.group(2)) * 10) + ")"
    return _all(text, r"(rmsnorm\(self\.cast\(\d+, \w+\), self\.cast\(\d+, \w+\), \d+, \d+, )([0-9.e+-]+)\)",
                tenfold)


def softmax_bf16(text, layer):
    """Attention's softmax accumulated in bf16 (the policy says fp32)."""
    return _once(text, r"torch\.softmax\(scores, dim=1\)",
                 "torch.softmax(scores.to(torch.bfloat16), dim=1).to(scores.dtype)")


def _leaves(text):
    return set(re.findall(r"^\s+(\w+) = self\.leaf_\w+$", text, flags=re.M))


def residual_bf16(text, layer):
    """One layer's MLP residual add (its second add of two activations) rounded through bf16: the
    policy keeps the residual stream fp32."""
    leaves = _leaves(text)
    adds = [(i, expr) for i, expr, a, b in re.findall(
        r"= self\.tap\((\d+), (self\.cast\(\1, (\w+)\) \+ self\.cast\(\1, (\w+)\))\)", text)
        if a not in leaves and b not in leaves]
    if len(adds) < 2 * layer + 2:
        raise ValueError("not enough residual adds")
    i, expr = adds[2 * layer + 1]
    return text.replace(f"self.tap({i}, {expr})", f"self.tap({i}, ({expr}).to(torch.bfloat16))", 1)


def swiglu_bf16(text, layer):
    """One layer's swiglu computed in bf16 (silu rounded before the product; the policy computes
    it in fp32 and rounds once)."""
    found = re.findall(r"swiglu\(self\.cast\((\d+), (\w+)\), self\.cast\(\1, (\w+)\)\)", text)
    if len(found) <= layer:
        raise ValueError("no swiglu in that layer")
    i, g, u = found[layer]
    return text.replace(f"swiglu(self.cast({i}, {g}), self.cast({i}, {u}))",
                        f"swiglu(self.cast({i}, {g}).to(torch.bfloat16), self.cast({i}, {u}).to(torch.bfloat16))", 1)


def logits_bf16(text, layer):
    """The logits rounded to bf16 (the policy keeps them fp32)."""
    return _once(text, r"(logits = self\.tap\((\d+), )(self\.matmul\(self\.cast\(\2, \w+\), self\.cast\(\2, \w+, "
                 r"widened=True\)\))\)",
                 r"\1(\3).to(torch.bfloat16))")


def attention_scale(text, layer):
    """Attention scaled by 1/sqrt(hd - 1) (a head width counted without its padding column)."""
    return _once(text, r"/ math\.sqrt\(hd\)", "/ math.sqrt(hd - 1)")


def norm_n_minus_1(text, layer):
    """rmsnorm's mean square over n - 1 values (a variance's habit): a gain of 1 - 1/(2n)."""
    return _once(text, r"\(v \* v\)\.mean\(dim=1, keepdim=True\)", "(v * v).sum(dim=1, keepdim=True) / (nc - 1)")


# ── routed experts: bugs of the routers and the experts (emitter/sambaflow/runtime.py's functions,
# acting in every mixture; the shared expert's gate in one layer's) ─────────────────────────────

def renorm_dropped(text, layer):
    """Softmax routing's top-k weights left unrenormalised (norm_topk_prob ignored)."""
    return _once(text, r"return w / w\.sum\(dim=1, keepdim=True\) if renormalised else w", "return w")


def topk_short(text, layer):
    """Both routers keep one expert fewer than K."""
    return _all(text, r"top_mask\((p|c), k\)", r"top_mask(\1, k - 1)")


def shared_gate_dropped(text, layer):
    """A mixture's shared expert added without its sigmoid gate (in the seed's layer, or the
    mixture after it)."""
    found = re.findall(r"self\.cast\((\d+), (sd\d+)\) \* self\.cast\(\1, se\d+\)", text)
    if not found:
        raise ValueError("no shared expert gate")
    i, sd = found[layer % len(found)]
    return _once(text, rf"self\.cast\({i}, {sd}\) \* self\.cast\({i}, se\d+\)", f"self.cast({i}, {sd})")


def neighbour_expert(text, layer):
    """Each expert weighted by its neighbour's routing weight (its tables read one expert off)."""
    return _once(text, r"w = r\.repeat_interleave", "w = r.roll(1, dims=1).repeat_interleave")


def bias_in_weights(text, layer):
    """DeepSeek-V3's correction bias leaking into the routing weights (c, not s, weighted)."""
    return _once(text, r"w = s \* top_mask\(c, k\)", "w = c * top_mask(c, k)")


def scaling_dropped(text, layer):
    """DeepSeek-V3's routed scaling factor missing."""
    return _once(text, r"return w \* factor", "return w")


MOE_BUGS = {"renormalisation dropped": renorm_dropped, "top-k one short": topk_short,
            "shared expert gate dropped": shared_gate_dropped, "neighbour's expert": neighbour_expert,
            "bias in the weights": bias_in_weights, "routed scaling missing": scaling_dropped}

BUGS = {"mlp gain 0.4%": mlp_gain, "norm eps x10": eps_tenfold, "softmax in bf16": softmax_bf16,
        "residual add in bf16": residual_bf16, "swiglu in bf16": swiglu_bf16,
        "logits in bf16": logits_bf16, "attention scale": attention_scale,
        "rmsnorm over n-1": norm_n_minus_1, **MOE_BUGS}
