"""Writing a weights directory: the one leaf writer every importer uses."""

import os

import numpy as np

from ..files import write_atomic
from ..language.errors import ProgramError
from ..sambaflow.weight_files import LEAF_SUFFIXES

EXTENSIONS = {"<f4": ".f32", "<f8": ".f64"}


def write_leaf(out_dir, var, value, dtype="<f4"):
    """`value` as `out_dir/<var>.f32` (or `.f64` for dtype "<f8"), raw little-endian row-major,
    written whole (temporary file, then rename); the leaf's own file of another form (`.f32`,
    `.f64`, `.npy`) goes, so exactly one file of its own holds it. Returns the file name."""
    ext = EXTENSIONS[dtype]
    os.makedirs(out_dir, exist_ok=True)
    write_atomic(os.path.join(out_dir, var + ext), np.ascontiguousarray(value, dtype=dtype))
    drop_other_forms(out_dir, var + ext)
    return var + ext


def drop_other_forms(out_dir, fname):
    """Unlink the files of `out_dir` that hold the same leaf as `fname` in another form."""
    var, ext = os.path.splitext(fname)
    for other in LEAF_SUFFIXES:
        if other != ext and os.path.exists(os.path.join(out_dir, var + other)):
            os.unlink(os.path.join(out_dir, var + other))


def _some(names, limit=6):
    names = sorted(names)
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def unfilled(program, mapped, checkpoint, unmapped=(), layout=""):
    """The ProgramError of an import that would write no leaf of `program`, or leave one it reads
    with no declared value unfilled (`mapped`: the leaves the importer found a tensor for), naming
    the checkpoint, those leaves and the checkpoint's tensors it did not map (`unmapped`); None
    when the import fills the program. Checked before anything is written."""
    missing = [n for n in program.required if n not in mapped]
    if mapped and not missing:
        return None
    head = "no leaf of the program maps to a tensor of this checkpoint" if not mapped else \
        f"the program reads {_some(missing)}, which no tensor of this checkpoint maps to"
    rest = f"; its tensors {_some(unmapped)} map to no leaf" if unmapped else ""
    return ProgramError(f"{head}{rest}{layout}: nothing was written", path=checkpoint)
