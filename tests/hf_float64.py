"""transformers' Qwen3-Next with the places it computes in float32 whatever the model's dtype made
float64: each patched function is transformers' own source (read from its module file) with the
float32 casts edited to float64 and compiled in that module's namespace, so nothing else of it
changes. The places: the zero-centred RMSNorm (`x.float()`, `weight.float()`), the gated RMSNorm
of Gated DeltaNet, the rotary table (inv_freq and the angles), attention's softmax, both delta
rules (which cast q, k, v, beta and the decay to float32), the decay `g` (`A_log.float()`,
`a.float()`), and the router's softmax (`dtype=torch.float`)."""

import ast
import contextlib
import textwrap

from transformers.models.qwen3_next import modeling_qwen3_next as qn

PATCHES = [
    ("Qwen3NextRMSNorm.forward", [("x.float()", "x.double()"),
                                  ("self.weight.float()", "self.weight.double()")]),
    ("Qwen3NextRMSNormGated.forward", [("torch.float32", "torch.float64")]),
    ("Qwen3NextRotaryEmbedding.compute_default_rope_parameters",
     [("dtype=torch.float)", "dtype=torch.float64)")]),
    ("Qwen3NextRotaryEmbedding.forward", [(".float()", ".double()"),
                                          ("dtype=torch.float)", "dtype=torch.float64)")]),
    ("eager_attention_forward", [("torch.float32", "torch.float64")]),
    ("torch_chunk_gated_delta_rule", [("torch.float32", "torch.float64")]),
    ("torch_recurrent_gated_delta_rule", [("torch.float32", "torch.float64")]),
    ("Qwen3NextGatedDeltaNet.forward", [(".float()", ".double()")]),
    ("Qwen3NextTopKRouter.forward", [("dtype=torch.float,", "dtype=torch.float64,")]),
]


def _sources():
    """{`name` or `Class.method`: source} of the module's top-level functions and methods (their
    decorators left out: none of them changes what a float64 decode step computes)."""
    with open(qn.__file__, encoding="utf-8") as f:
        text = f.read()
    out = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = ast.get_source_segment(text, node)
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef):
                    out[f"{node.name}.{sub.name}"] = ast.get_source_segment(text, sub)
    return out


def _compiled(source, edits):
    src = textwrap.dedent(source)
    for old, new in edits:
        assert old in src, f"transformers changed: `{old}` is gone"
        src = src.replace(old, new)
    namespace = {}
    exec(compile(src, "<float64 patch>", "exec"), vars(qn), namespace)
    return next(iter(namespace.values()))


@contextlib.contextmanager
def float64_qwen3_next():
    sources, saved = _sources(), []
    for name, edits in PATCHES:
        owner, attr = (getattr(qn, name.split(".")[0]), name.split(".")[1]) if "." in name else (qn, name)
        old = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        new = _compiled(sources[name], edits)
        saved.append((owner, attr, old))
        setattr(owner, attr, staticmethod(new) if isinstance(old, staticmethod) else new)
    try:
        yield
    finally:
        for owner, attr, old in reversed(saved):
            setattr(owner, attr, old)
