"""Which tensor names may reach emitted Python, and the checkpoint names the naming convention gives
them (the `gguf` field of the manifest; the GGUF importer reads checkpoints by it)."""

import builtins
import keyword
import re

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_NAME = 128   # a leaf's weights file is named after it (`<name>.f32`), within a file name's 255 bytes

# Names model.py and compile.py use themselves: imports, module-level names, forward's locals, and
# every top-level name of emitter/sambaflow/runtime.py, weight_files.py and app.py (a test keeps
# this list complete).
EMITTED = frozenset({
    "argparse", "json", "math", "mmap", "os", "sys", "np", "torch", "nn", "F",
    "self", "inputs", "args", "LEAVES", "FILLS", "INPUTS", "STATES", "REQUIRED", "OUTPUT", "PROGRAM",
    "EPS", "PRECISION",
    "weights", "LogosModule", "ProgramModule", "load_weights", "main", "add_args", "bundle", "name",
    "value", "shape", "role", "kind", "dtype", "path", "model", "out", "samba", "utils",
    "parse_app_args", "get_pefmeta",
    "rmsnorm", "l2norm", "layernorm", "rope", "attention", "full_attention", "gelu_tanh",
    "softmax_rows", "swiglu", "causal_conv", "decay", "gated_delta", "row_of", "set_row", "row_index",
    "WeightsError", "npy_place", "safetensors_places", "file_place", "weight_places", "weight_array",
    "claimed_files", "size_refusal", "LEAF_SUFFIXES", "TENSOR_FILES", "DTYPE_NAMES", "SAFETENSORS_DTYPES",
    "HEADER_LIMIT", "NPY_HEADER_LIMIT",
    "top_mask", "softmax_routing", "sigmoid_routing", "experts",
})

RESERVED = frozenset(set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins)) | EMITTED)


def unsafe_name(name):
    """Why `name` cannot be a tensor name, or None when it can."""
    if not _IDENT.fullmatch(name):
        return "is not a name ([A-Za-z_][A-Za-z0-9_]*)"
    if len(name) > MAX_NAME:
        return f"is {len(name)} characters long, past {MAX_NAME} (its weights file is named after it)"
    if name.startswith("__"):
        return "starts with `__`, which Python mangles or reserves"
    if name in RESERVED:
        return "is a Python keyword or a name the emitted model.py uses itself"
    return None


def layer_of(var):
    """The layer number a variable name ends in (`Wq12` → 12), or None."""
    m = re.search(r"[0-9]+\Z", var)
    return int(m.group()) if m else None


_WHOLE = {"on": "output_norm.weight", "Wout": "output.weight", "emb": "token_embd.weight",
          "Emb": "token_embd.weight"}
# stem -> (on an attention layer, on a Gated DeltaNet layer)
_STEMS = {
    "an": ("attn_norm.weight",) * 2,
    "fn": ("post_attention_norm.weight",) * 2,
    "Qn": ("attn_q_norm.weight",) * 2,
    "Kn": ("attn_k_norm.weight",) * 2,
    "Pan": ("post_attention_norm.weight",) * 2,   # Gemma 3: after attention, before the residual
    "Fn": ("ffn_norm.weight",) * 2,               # Gemma 3: before the feed-forward
    "Pfn": ("post_ffw_norm.weight",) * 2,         # Gemma 3: after the feed-forward
    "Wq": ("attn_q.weight", "attn_qkv.weight"),
    "Wqg": ("attn_q.weight", None),
    "Wk": ("attn_k.weight", "attn_qkv.weight"),
    "Wv": ("attn_v.weight", "attn_qkv.weight"),
    "Wo": ("attn_output.weight", "ssm_out.weight"),
    "Wz": (None, "attn_gate.weight"),
    "Wcq": ("ssm_conv1d.weight",) * 2,
    "Wck": ("ssm_conv1d.weight",) * 2,
    "Wcv": ("ssm_conv1d.weight",) * 2,
    "Wb": ("ssm_beta.weight",) * 2,
    "Wa": ("ssm_alpha.weight",) * 2,
    "Dt": ("ssm_dt.bias",) * 2,
    "Al": ("ssm_a",) * 2,
    "Gn": ("ssm_norm.weight",) * 2,
    "Wg": ("ffn_gate.weight",) * 2,
    "Wu": ("ffn_up.weight",) * 2,
    "Wd": ("ffn_down.weight",) * 2,
    "Wr": ("ffn_gate_inp.weight",) * 2,           # routed experts (llama.cpp's names): the router,
    "Weg": ("ffn_gate_exps.weight",) * 2,         # the experts' tables,
    "Weu": ("ffn_up_exps.weight",) * 2,
    "Wed": ("ffn_down_exps.weight",) * 2,
    "Wsg": ("ffn_gate_shexp.weight",) * 2,        # the shared expert
    "Wsu": ("ffn_up_shexp.weight",) * 2,
    "Wsd": ("ffn_down_shexp.weight",) * 2,
    "Wsi": ("ffn_gate_inp_shexp.weight",) * 2,    # and its gate
}


def gguf_name(var, attention_layers):
    """The GGUF tensor a weight variable comes from by the extractor's naming convention, or None.

    `Wq3` is `blk.3.attn_q.weight` when layer 3 is an attention layer (its `attention` op reads a
    layer-numbered query) and `blk.3.attn_qkv.weight` on a Gated DeltaNet layer. A layer number
    written with a leading zero (`Wq01`) names none: it would be `Wq1`'s tensor read twice.
    """
    if var in _WHOLE:
        return _WHOLE[var]
    digits = re.search(r"[0-9]+\Z", var)
    if digits is None or (len(digits.group()) > 1 and digits.group()[0] == "0"):
        return None
    layer = int(digits.group())
    stem = var[: len(var) - len(digits.group())]
    names = _STEMS.get(stem)
    if names is None:
        return None
    name = names[0] if layer in attention_layers else names[1]
    return None if name is None else f"blk.{layer}.{name}"
