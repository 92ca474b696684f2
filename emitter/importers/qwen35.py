"""Qwen3.5 ("qwen35") checkpoints, for transformers' `Qwen3_5ForCausalLM` (text config, dense MLP):

- `import_checkpoint(checkpoint, program, out_dir)`: config.json + model.safetensors (as
  `save_pretrained` writes them) to a weights directory of `<var>.f64` files, with the layout
  changes llama.cpp's converter also makes (`convert`), plus the rope tables COS/SIN
  (rows = positions) and the first token and position;
- `make_tiny_checkpoint(out_dir, seed)`: a tiny random `Qwen3_5ForCausalLM` saved offline.

The decode step's program is `qwen35_program.generate_program` (its names are this module's too).
"""

import argparse
import json
import math
import os
import sys

import numpy as np

from ..extras import require
from .bounds import context, read_json_config
from ..files import write_atomic
from ..language.errors import ProgramError
from ..ops.rope import rope_tables
from .leaves import unfilled, write_leaf
from .qwen35_config import DEFAULT_CTX, TINY_CONFIG, ConfigError, Dims, dims_of, text_config  # noqa: F401
from .qwen35_program import MASK, generate_program  # noqa: F401


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
    """The config.json dict of a checkpoint (its directory, or a safetensors file inside it):
    bounds.read_json_config."""
    return read_json_config(os.path.join(checkpoint_files(checkpoint)[0], "config.json"))


class _Tensors(dict):
    """The checkpoint's tensors by name, each read (as float64) when it is asked for: a tensor no
    leaf reads (an unused 400M-value one cost 4.7 GB) is never read. {name: the file holding it,
    or an array put in (a fused tensor split)}."""

    def __getitem__(self, name):
        from safetensors import safe_open
        path = dict.__getitem__(self, name)
        if not isinstance(path, str):
            return path
        try:
            with safe_open(path, framework="np") as f:
                return f.get_tensor(name).astype(np.float64)
        except TypeError:  # bf16 needs ml_dtypes, or torch
            import torch
            with safe_open(path, framework="pt") as f:
                return f.get_tensor(name).to(torch.float64).numpy()

    def get(self, name, default=None):
        return self[name] if name in self else default


def _read_tensors(checkpoint):
    """The checkpoint's tensors (`_Tensors`): their names and files, read from the headers alone."""
    require("safetensors", "import", "reading a safetensors checkpoint",
            lambda m: ProgramError(m, path=str(checkpoint)))
    from safetensors import safe_open
    tensors = _Tensors()
    for path in checkpoint_files(checkpoint)[1]:
        with safe_open(path, framework="np") as f:
            tensors.update(dict.fromkeys(f.keys(), path))
    return tensors


def _prefix(tensors):
    for p in ("model.language_model.", "model.", ""):
        if p + "embed_tokens.weight" in tensors:
            return p
    raise ProgramError("no `embed_tokens.weight` in the checkpoint: not a Qwen3_5 text model")


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
        if layer in m.moe_layers:
            out.update(_experts(t, b + "mlp.", layer, m))
        else:
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

            if pre + a + "in_proj_qkvz.weight" in tensors:   # Qwen3-Next's fused projections
                tensors.update({pre + a + k: v for k, v in _unfused(t, a, m).items()})
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


def _unfused(t, a, m):
    """Qwen3-Next's in_proj_qkvz and in_proj_ba (grouped by key head: per key head g its q, k,
    then the values and gates of value heads g·r .. g·r + r − 1) as Qwen3_5's separate
    in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (q, k and v each in head order): the same
    values, so the rest of `convert` reads both."""
    r, d = m.ratio, m.d
    qkvz = t(a + "in_proj_qkvz.weight").reshape(m.hk, 2 * d + 2 * r * d, -1)
    ba = t(a + "in_proj_ba.weight").reshape(m.hk, 2 * r, -1)
    q, k = qkvz[:, :d], qkvz[:, d:2 * d]
    v, z = qkvz[:, 2 * d:2 * d + r * d], qkvz[:, 2 * d + r * d:]
    flat = [x.reshape(-1, x.shape[-1]) for x in (q, k, v, z, ba[:, :r], ba[:, r:])]
    return {"in_proj_qkv.weight": np.concatenate(flat[:3]), "in_proj_z.weight": flat[3],
            "in_proj_b.weight": flat[4], "in_proj_a.weight": flat[5]}


def _experts(t, mlp, layer, m):
    """A Qwen3-Next mixture as the sugar's tables: the router, the experts (expert e's gate_proj
    and up_proj, F by D as the checkpoint holds them, one tensor per expert, give columns e·F ..
    of Weg and Weu transposed; its down_proj, D by F, rows e·F .. of Wed), the shared expert and
    its gate."""
    def each(kind):
        return [t(f"{mlp}experts.{e}.{kind}_proj.weight").T for e in range(m.experts)]
    shared = {f"Ws{k}{layer}": t(f"{mlp}shared_expert.{kind}_proj.weight").T
              for k, kind in (("g", "gate"), ("u", "up"), ("d", "down"))}
    return {f"Wr{layer}": t(mlp + "gate.weight").T,
            f"Weg{layer}": np.concatenate(each("gate"), axis=1),
            f"Weu{layer}": np.concatenate(each("up"), axis=1),
            f"Wed{layer}": np.concatenate(each("down"), axis=0),
            f"Wsi{layer}": t(mlp + "shared_expert_gate.weight").T, **shared}


def import_checkpoint(checkpoint, program, out_dir, token=0, position=0, dtype="f64"):
    """`checkpoint` is a directory or its safetensors file. Write every leaf of `program` the
    checkpoint defines (plus COS, SIN, Tok, Pos) into `out_dir`
    as `<var>.f64` (or `.f32`). Returns {"written": [...], "declared": [...]}: the leaves left to
    their declared values (states, filled constants)."""
    config = read_config(checkpoint)
    m = dims_of(config, ctx=program.decls["COS"].rows if "COS" in program.decls else DEFAULT_CTX)
    values = convert(_read_tensors(checkpoint), m)
    values["COS"], values["SIN"] = rope_tables(m.ctx, m.rotary_dim, m.rope_theta)
    values["Tok"] = np.array([[float(token)]])
    values["Pos"] = np.array([[float(position)]])
    if not 0 <= token < m.vocab:
        raise ProgramError(f"token {token} is outside the vocabulary (0..{m.vocab - 1})")
    if not 0 <= position < m.ctx:
        raise ProgramError(f"position {position} is outside the KV cache (0..{m.ctx - 1})")
    leaves, declared = {}, []
    for name in program.leaves:
        if name not in values:
            declared.append(name)
            continue
        d = program.decls[name]
        v = values[name]
        if v.shape != (d.rows, d.cols):
            raise ProgramError(f"`{name}` is {d.rows} by {d.cols} in the program but the checkpoint "
                               f"gives {v.shape[0]} by {v.shape[1]}", d.line, program.path)
        leaves[name] = v
    problem = unfilled(program, set(leaves), checkpoint, layout=" (this importer knows the "
                       "layout of the program generate_program writes from its config.json)")
    if problem:
        raise problem
    np_dtype = "<f4" if dtype == "f32" else "<f8"
    written = [write_leaf(out_dir, name, v, np_dtype) for name, v in leaves.items()]
    return {"written": sorted(written), "declared": declared}


# ── the tiny checkpoint ──────────────────────────────────────────────────────────────────────────

def make_tiny_checkpoint(out_dir, seed=0, config=None,
                         classes=("Qwen3_5ForCausalLM", "Qwen3_5TextConfig")):
    """Save a tiny random `Qwen3_5ForCausalLM` (TINY_CONFIG unless given; `classes` names another
    model and config class of transformers, Qwen3-Next's say) to `out_dir` with
    `save_pretrained`, offline. Every parameter is drawn from `seed`: projections N(0, 1/fan_in),
    embeddings N(0, 1), the zero-centred norms N(0, 0.3) (so w + 1 is tested), the gated norm
    1 + N(0, 0.3), conv taps N(0, 0.5), dt_bias N(0, 0.5), A_log = log U(0.1, 1) (decays well
    inside (0, 1), so the memory carries from step to step)."""
    require("transformers", "tiny", "a tiny random checkpoint (--tiny-seed)",
            lambda m: ProgramError(m, path=out_dir))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    model_class, config_class = (getattr(transformers, name) for name in classes)

    cfg = config_class(**(config or TINY_CONFIG))
    torch.manual_seed(seed)
    model = model_class(cfg)
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
    # the config names the transformers that wrote it: left out, so the same seed gives the same
    # bytes whatever transformers is installed (5.24 and 5.25 differed only there)
    path = os.path.join(out_dir, "config.json")
    with open(path, encoding="utf-8") as f:
        written = json.load(f)
    written.pop("transformers_version", None)
    write_atomic(path, json.dumps(written, indent=2, sort_keys=True) + "\n")
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
    p.add_argument("--ctx", type=context, default=DEFAULT_CTX,
                   help="KV cache rows when the program is written (--write-program)")
    p.add_argument("--write-program", action="store_true",
                   help="first write the program generated from the checkpoint's config to --program")
    p.add_argument("--tiny-seed", type=int, default=None,
                   help="first make the tiny random checkpoint with this seed in the directory "
                        "CHECKPOINT (if it has no config.json yet)")


def main(args, make=None):
    """The command; `make` makes the tiny checkpoint (--tiny-seed), this family's by default."""
    from ..language.reader import read_file
    if args.tiny_seed is not None and not os.path.isfile(os.path.join(args.checkpoint, "config.json")):
        (make or make_tiny_checkpoint)(args.checkpoint, args.tiny_seed)
    try:
        if args.write_program:
            write_atomic(args.program, generate_program(read_config(args.checkpoint), args.ctx))
        program = read_file(args.program)
        done = import_checkpoint(args.checkpoint, program, args.out, args.token, args.position,
                                 args.dtype)
    except ConfigError as e:   # (what config.json says)
        print(f"{os.path.join(checkpoint_files(args.checkpoint)[0], 'config.json')}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{args.checkpoint}: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"weights": args.out, "written": len(done["written"]),
                      "declared": done["declared"]}))
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m emitter.importers.qwen35")
    add_arguments(ap)
    raise SystemExit(main(ap.parse_args()))
