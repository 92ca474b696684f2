"""Elementwise and per-row activations: sigmoid, silu, gelu (tanh form), exact gelu (erf form),
softmax, swiglu. Both GELUs are here because models are trained with one or the other, and they
differ by up to about 1e-3."""

import functools
import math


from .base import Op, np_sigmoid, np_silu, np_softmax, same, shape_of_x, np


def sigmoid_vm(a):
    return np_sigmoid(a["X"])


def sigmoid_call(a):
    return f"torch.sigmoid({a.name('X')})"


def silu_vm(a):
    return np_silu(a["X"])


def silu_call(a):
    return f"F.silu({a.name('X')})"


def gelu_vm(a):
    """The tanh GELU with one exponential: x / (1 + e^(-2z)), z = sqrt(2/pi)(x + 0.044715 x^3)."""
    x = a["X"]
    z = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return x / (1.0 + np.exp(-2.0 * z))


def gelu_call(a):
    return f"gelu_tanh({a.name('X')})"


@functools.cache
def _erf():
    return np.frompyfunc(math.erf, 1, 1)  # NumPy has no erf; the C library's, element by element


def exact_gelu_vm(a):
    """The erf GELU: x/2 · (1 + erf(x / sqrt(2)))."""
    x = a["X"]
    return 0.5 * x * (1.0 + _erf()(x / math.sqrt(2.0)).astype(np.float64))


def exact_gelu_call(a):
    return f"F.gelu({a.name('X')})"


def softmax_vm(a):
    return np_softmax(a["X"], axis=1)


def softmax_call(a):
    return f"softmax_rows({a.name('X')})"


def swiglu_shape(a):
    same(a, "G", "U")
    return a.shape("G")


def swiglu_vm(a):
    return np_silu(a["G"]) * a["U"]


def swiglu_call(a):
    return f"swiglu({a.name('G')}, {a.name('U')})"


OPS = (
    Op("sigmoid", "sigmoid of X", shape=shape_of_x, vm=sigmoid_vm, call=sigmoid_call,
       spelling="torch.sigmoid(x)"),
    Op("silu", "silu of X", shape=shape_of_x, vm=silu_vm, call=silu_call, spelling="F.silu(x)"),
    Op("gelu", "gelu of X", shape=shape_of_x, vm=gelu_vm, call=gelu_call, spelling="gelu_tanh(x)"),
    Op("exact gelu", "exact gelu of X", shape=shape_of_x, vm=exact_gelu_vm, call=exact_gelu_call,
       spelling="F.gelu(x)"),
    Op("softmax", "softmax of X", shape=shape_of_x, vm=softmax_vm, call=softmax_call,
       spelling="softmax_rows(x)",),
    Op("swiglu", "swiglu of G and U", shape=swiglu_shape, vm=swiglu_vm, call=swiglu_call,
       spelling="swiglu(g, u)",),
)
