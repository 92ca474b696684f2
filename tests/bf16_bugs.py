"""Bugs below bf16's rounding noise but systematic, planted into a bundle's model.py, for the
bfloat16 gate's tests and bench/bench_bf16.py. Each takes the model.py text and a layer number and
returns the mutated text (a ValueError when the program has no such place)."""

import re


def _once(text, pattern, replace):
    new, n = re.subn(pattern, replace, text, count=1)
    if not n:
        raise ValueError(f"no place for the bug: {pattern}")
    return new


def mlp_gain(text, layer):
    """A 0.4% gain in one layer's MLP down projection (`… @ self.cast(i, Wd<layer>)`)."""
    return _once(text, rf"(= self\.tap\((\d+), self\.cast\(\2, \w+\) @ self\.cast\(\2, Wd{layer}\))\)",
                 r"\1 * 1.004)")


def eps_tenfold(text, layer):
    """One layer's first rmsnorm with ten times its epsilon (1e-5 where 1e-6 was meant)."""
    m = re.search(rf"(rmsnorm\(self\.cast\((\d+), \w+\), self\.cast\(\2, \w*{layer}\), \d+, \d+, )([0-9.e+-]+)\)",
                  text)
    if m is None:
        raise ValueError(f"no rmsnorm with a layer-{layer} weight")
    return text[:m.start(3)] + repr(float(m.group(3)) * 10) + text[m.end(3):]


def softmax_bf16(text, layer):
    """Attention's softmax accumulated in bf16 (the policy says fp32)."""
    return _once(text, r"torch\.softmax\(scores, dim=1\)",
                 "torch.softmax(scores.to(torch.bfloat16), dim=1).to(scores.dtype)")


def residual_bf16(text, layer):
    """One layer's residual add rounded through bf16 (the policy keeps the residual stream fp32)."""
    adds = re.findall(r"= self\.tap\((\d+), (self\.cast\(\1, \w+\) \+ self\.cast\(\1, \w+\))\)", text)
    if len(adds) <= layer + 1:
        raise ValueError("not enough residual adds")
    i, expr = adds[layer + 1]          # (the first add of a decode step is its position's)
    return text.replace(f"self.tap({i}, {expr})", f"self.tap({i}, ({expr}).to(torch.bfloat16))", 1)


BUGS = {"mlp gain 0.4%": mlp_gain, "norm eps x10": eps_tenfold, "softmax in bf16": softmax_bf16,
        "residual add in bf16": residual_bf16}
