"""Writing a weights directory: the one leaf writer every importer uses."""

import os

import numpy as np

from ..files import write_atomic

EXTENSIONS = {"<f4": ".f32", "<f8": ".f64"}


def write_leaf(out_dir, var, value, dtype="<f4"):
    """`value` as `out_dir/<var>.f32` (or `.f64` for dtype "<f8"), raw little-endian row-major,
    written whole (temporary file, then rename); the leaf's file of the other extension goes, so
    exactly one file holds it. Returns the file name."""
    ext = EXTENSIONS[dtype]
    os.makedirs(out_dir, exist_ok=True)
    write_atomic(os.path.join(out_dir, var + ext), np.ascontiguousarray(value, dtype=dtype))
    for other in EXTENSIONS.values():
        if other != ext and os.path.exists(os.path.join(out_dir, var + other)):
            os.unlink(os.path.join(out_dir, var + other))
    return var + ext
