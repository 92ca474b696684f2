"""The lock's default tolerance per dtype (standard library only: the pipeline's config reads it).

A check passes where |module − VM| ≤ abs + rel · (the VM tensor's largest magnitude) everywhere:
rounding in a float32 sum scales with its terms, so a small element of a large vector carries the
vector's absolute error."""

DEFAULT_TOLERANCES = {"float64": {"abs": 1e-9, "rel": 1e-9}, "float32": {"abs": 1e-4, "rel": 1e-3}}
DTYPES = tuple(DEFAULT_TOLERANCES)
