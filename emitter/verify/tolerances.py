"""The lock's default tolerance per dtype (standard library only: the pipeline's config reads it).

A check passes where |module − VM| ≤ abs + rel · (the largest magnitude of the VM value's row, or
of the whole value where it is one row or one column) everywhere: rounding in a float32 sum
scales with its terms, so a small element carries the absolute error of the values beside it
(emitter.verify.compare)."""

# bfloat16's flat tolerance is for the figures only: its verdict is the per-op gate (verify/bf16.py)
DEFAULT_TOLERANCES = {"float64": {"abs": 1e-9, "rel": 1e-9}, "float32": {"abs": 1e-4, "rel": 1e-3},
                      "bfloat16": {"abs": 1e-2, "rel": 2e-2}}
DTYPES = tuple(DEFAULT_TOLERANCES)


def tolerance(dtype, atol=None, rtol=None):
    """The tolerance of a check: the dtype's default, with `atol` / `rtol` where given."""
    tol = dict(DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES["float32"]))
    if atol is not None:
        tol["abs"] = float(atol)
    if rtol is not None:
        tol["rel"] = float(rtol)
    return tol
