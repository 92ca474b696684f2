"""Values as a bfloat16 or float32 computation holds them, in float64: what the bf16 gate's floors
(bf16.py) and its router judge (routing.py) both round with."""

import numpy as np

# the relative grain of a computation in each precision, under which no noise is judged: an op
# whose floor is (nearly) exact, all fp32 in and out, still differs from float64 by its fp32
# accumulation (about sqrt(K) ulps of 2^-24 for K terms; 2^-14 leaves room for cancellation)
COMPUTE_GRAIN = {"fp32": 2.0 ** -14, "bf16": 2.0 ** -6}


def rounded(torch, x, precision):
    """`x` (float64 or float32 values) rounded to "bf16" or "fp32", as float64."""
    if isinstance(x, tuple):
        return tuple(rounded(torch, v, precision) for v in x)
    x = np.asarray(x)
    t = torch.from_numpy(x if x.flags.writeable and x.flags.c_contiguous else np.array(x))
    t = t.to(torch.bfloat16 if precision == "bf16" else torch.float32)
    return t.to(torch.float64).numpy()
