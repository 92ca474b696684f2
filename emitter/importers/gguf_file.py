"""What every GGUF importer shares: reading the file and its metadata, dequantising a tensor into the
layout a program uses, and writing a weights directory with its `.import.json` record.

Layout: GGUF lists dims in reverse of numpy, so a linear map stored as GGUF dims (in, out) reads as a
numpy (out, in) array, torch's layout; the sugar computes `x matmul W` with W (in, out), so it gets
the transpose. A table read by `row TOK of TABLE` (the token embedding) keeps numpy's (rows, cols).
"""

import contextlib
import hashlib
import json
import math
import os

import numpy as np

from ..extras import require
from ..files import write_atomic
from ..language.errors import ProgramError
from ..language.names import gguf_name
from .leaves import drop_other_forms, unfilled, write_leaf
from .packages import chunks, resolve_checkpoint


@contextlib.contextmanager
def checkpoint_file(checkpoint, scratch):
    """The GGUF a checkpoint spec names, as a path: a chunked spec's parts joined into
    `scratch/.checkpoint.gguf` (under build/ when doit runs the import) for as long as the block
    runs, then deleted; anything else where `resolve_checkpoint` finds it."""
    if chunks(checkpoint) is None:
        yield resolve_checkpoint(checkpoint)
        return
    os.makedirs(scratch, exist_ok=True)
    path = os.path.join(scratch, ".checkpoint.gguf")
    try:
        yield resolve_checkpoint(checkpoint, path)
    finally:
        if os.path.exists(path):
            os.unlink(path)


def import_record(checkpoint, path, meta, program):
    """What `.import.json` says of an import: the spec, the file read (not for a chunked spec,
    whose join is deleted after), the metadata and the program."""
    where = {"path": os.path.abspath(path)} if chunks(checkpoint) is None else {}
    return {"checkpoint": checkpoint[:2000], **where, "meta": meta, "program": program.path}


def open_gguf(path):
    """The GGUF's metadata and tensors (`gguf_reader.GGUFFile`: gguf-py's layout, read in one
    pass); gguf-py itself is what dequantises them."""
    require("gguf", "import", "reading a GGUF checkpoint", lambda m: ProgramError(m, path=str(path)))
    from .gguf_reader import GGUFFile
    try:
        return GGUFFile(path)
    except (OSError, ValueError) as e:
        raise ProgramError(f"cannot read the GGUF file: {e}", path=str(path)) from None


def field_value(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise ProgramError(f"the GGUF metadata has no `{key}`", path=reader.path)
        return default
    return f.contents()


def embedding_rows(reader):
    """The vocabulary a GGUF's `token_embd.weight` holds (its rows), or a ProgramError naming the
    file where it has none."""
    t = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if t is None or len(t.shape) != 2:
        raise ProgramError("the GGUF has no 2-D `token_embd.weight` (the token embedding)", path=reader.path)
    return int(t.shape[1])


def shortest_f32(x):
    """A float32 metadata value as the shortest decimal that rounds to it: GGUF stores the rms
    epsilon as float32, so 1e-5 reads back as 9.999999747378752e-06; the model's config said 1e-5."""
    return float(str(np.float32(x)))


def tensor_array(tensor, order="<", path=None):
    """A GGUF tensor as float32 in numpy's layout (dims reversed from the GGUF's). `order`: the
    file's byte order; a quantised tensor of a big-endian file is refused (`path` named): gguf-py
    dequantises little-endian blocks alone, and would read its scales as other numbers."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize
    shape = tuple(int(d) for d in reversed(tensor.shape))
    if tensor.tensor_type in (Q.F32, Q.F16):
        data = np.asarray(tensor.data, dtype=np.float32)
    elif order != "<":
        raise ProgramError(f"`{tensor.name}` is a {Q(tensor.tensor_type).name} tensor of a big-endian GGUF: its "
                           "blocks cannot be dequantised here (gguf-py reads little-endian blocks alone; "
                           "gguf-py's gguf_convert_endian makes the file little-endian)", path=path)
    else:
        data = dequantize(np.asarray(tensor.data), tensor.tensor_type)   # (a plain view: no memmap per row)
    return np.ascontiguousarray(data, dtype=np.float32).reshape(shape)


def _tables(program):
    """The leaves read whole as a table (`row TOK of TABLE`, or transposed): kept in numpy's layout."""
    views = {st.out: st.bound["X"] for st in program.stages if st.op.name == "transpose"}
    return {st.bound["TABLE"] for st in program.stages if st.op.name == "embedding"} | \
        {views[st.bound["B"]] for st in program.stages
         if st.op.name == "matmul" and st.bound["B"] in views}


def gguf_plan(program, reader, aliases=None):
    """[(var, GGUF tensor name)] for every leaf whose checkpoint name
    (`emitter.language.names.gguf_name`) names a tensor of the GGUF, from the tensor list alone
    (nothing read yet). `aliases` maps a tensor name (without `blk.N.`) to the one this
    architecture has instead; a leaf the convention names but the GGUF lacks is refused."""
    tensors = {t.name for t in reader.tensors}
    aliases = aliases or {}
    plan = []
    for var, decl in program.decls.items():
        name = gguf_name(var, program.attention_layers)
        if name is None:
            continue
        if name not in tensors:
            stem = name.split(".", 2)[-1] if name.startswith("blk.") else name
            alt = aliases.get(stem)
            alt = None if alt is None else name[: len(name) - len(stem)] + alt
            if alt not in tensors:
                raise ProgramError(f"`{var}`: the GGUF has no tensor `{name}`"
                                   + (f" (nor `{alt}`)" if alt else ""), decl.line, program.path)
            name = alt
        plan.append((var, name))
    return plan


def check_fills(program, reader, plan, derived, checkpoint):
    """Refuse, before anything is written, an import that maps no leaf of `program` or leaves one
    it reads unfilled (`leaves.unfilled`): `plan` from `gguf_plan`, `derived` the leaves the
    importer computes itself."""
    used = {name for _, name in plan}
    problem = unfilled(program, {var for var, _ in plan} | set(derived), checkpoint,
                       sorted(t.name for t in reader.tensors if t.name not in used),
                       " (leaves are read by the GGUF names `emitter.language.names.gguf_name` "
                       "gives them: `Wq3` is `blk.3.attn_q.weight`, `emb` `token_embd.weight`, ...)")
    if problem:
        raise problem


def gguf_leaves(program, reader, aliases=None, fix=None, plan=None):
    """Yield (var, float32 array in the program's shape) for each leaf of `plan` (`gguf_plan`'s,
    worked out here when not given). `fix(name, array)` adjusts a tensor in numpy's layout before
    it is laid out (llama's Q/K un-permutation)."""
    tensors = {t.name: t for t in reader.tensors}
    tables = _tables(program)
    for var, name in gguf_plan(program, reader, aliases) if plan is None else plan:
        decl = program.decls[var]
        rows, cols, line = decl.rows, decl.cols, decl.line
        shape = tuple(int(d) for d in reversed(tensors[name].shape))   # (numpy's layout)
        if len(shape) == 2 and var not in tables:
            shape = shape[::-1]   # a linear map: numpy (out, in) -> the sugar's (in, out)
        if math.prod(shape) != rows * cols or (len(shape) == 2 and shape != (rows, cols)):   # (before it is read:
            raise ProgramError(f"`{var}` is {rows} by {cols} but `{name}` is "   # a tensor the file only says is
                               f"{' by '.join(map(str, shape))} as the program uses it",   # huge costs nothing)
                               line, program.path)
        w = tensor_array(tensors[name], reader.order, reader.path)
        if fix is not None:
            w = fix(name, w)
        yield var, (w.T if w.ndim == 2 and var not in tables else w).reshape(rows, cols)


@contextlib.contextmanager
def nothing_left(out_dir):
    """Remove, if the block fails, the folders it made for `out_dir` (the outermost that did not
    exist before, and all under it): a refused import leaves no empty weights folder behind, nor
    the scratch a chunked checkpoint is joined in."""
    path, made = os.path.abspath(out_dir), None
    while not os.path.exists(path):
        made, path = path, os.path.dirname(path)
    try:
        yield
    except BaseException:
        if made:
            import shutil
            shutil.rmtree(made, ignore_errors=True)
        raise


def write_weights(out_dir, leaves, record):
    """Write each (var, array) of `leaves` as `out_dir/<var>.f32` (`.f64` for a float64 array),
    then `out_dir/.import.json`: `record` plus every file's name, bytes and sha256. Staged: the
    files are written one at a time into a folder inside `out_dir` and moved into place only once
    every leaf was read, so a checkpoint that fails half way (a tensor of the wrong shape, a full
    disk) leaves `out_dir` as it was (`nothing_left` removes a folder the import made). Returns
    the file names."""
    import shutil
    import tempfile
    os.makedirs(out_dir, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=".import-", dir=out_dir)
    try:
        written = []
        for var, array in leaves:
            written.append(write_leaf(stage, var, array, "<f8" if array.dtype == np.float64 else "<f4"))
            del array
        files = []
        for f in written:
            with open(os.path.join(stage, f), "rb") as fh:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
            files.append({"file": f, "bytes": os.path.getsize(os.path.join(stage, f)), "sha256": digest})
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    for f in written:
        os.replace(os.path.join(stage, f), os.path.join(out_dir, f))
        drop_other_forms(out_dir, f)
    shutil.rmtree(stage, ignore_errors=True)
    write_atomic(os.path.join(out_dir, ".import.json"),
                 json.dumps({**record, "files": files}, indent=1) + "\n")
    return written
