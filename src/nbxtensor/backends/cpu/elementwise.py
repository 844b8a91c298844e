"""cpu: element-wise ops with NumPy.

Each entry gets (out, inputs, params, compute_dtype) from ops.elementwise: inputs are
host tensors expanded to out's shape or Python numbers. Every input is converted to
the compute dtype (float32 for every float below float64, so a float16 add computes in
float32 and rounds once), the op runs in NumPy, and the result is cast into `out` by the
dtype table's cast rule (dtypes.copy_into).
"""
from __future__ import annotations

import math
import operator

import numpy as np

from ... import dtypes as _dt
from ...dispatch import register

# math.erf is exact; NumPy has no erf (and SciPy is not a dependency)
_erf64 = np.frompyfunc(math.erf, 1, 1)


def _erf(x):
    return _erf64(x.astype(np.float64)).astype(x.dtype) if x.size else x.copy()


def _int_div_trunc(x, y):
    ys = np.where(y == 0, 1, y).astype(x.dtype)
    q = x // ys
    q = np.where((x % ys != 0) & ((x < 0) != (ys < 0)), q + 1, q)
    return np.where(y == 0, 0, q).astype(x.dtype)


def _div_trunc(x, y):
    if x.dtype.kind == "f":
        return np.trunc(x / y)
    return _int_div_trunc(x, y)


def _pow(x, y):
    if x.dtype.kind in "fc":
        return np.power(x, y)
    if x.dtype.kind == "b":
        return np.where(y, x, True)
    r = np.power(x, np.maximum(y, 0).astype(x.dtype))
    odd = (y & 1) != 0
    neg = np.where(x == 1, 1, np.where(x == -1, np.where(odd, -1, 1), 0)).astype(x.dtype)
    return np.where(y < 0, neg, r).astype(x.dtype)


def _shift(x, y, left):
    bits = x.dtype.itemsize * 8
    ok = (y >= 0) & (y < bits)
    sh = np.where(ok, y, 0).astype(x.dtype)
    if left:
        return np.where(ok, np.left_shift(x, sh), 0).astype(x.dtype)
    sh = np.where(ok, y, bits - 1).astype(x.dtype)
    return np.where(ok | (x < 0), np.right_shift(x, sh), 0).astype(x.dtype)


def _softplus(x, beta, threshold):
    bx = x * beta
    return np.where(bx > threshold, x, np.log1p(np.exp(bx)) / beta)


def _hard(x):
    return np.minimum(np.maximum(x + 3, 0), 6) / 6


def _on_x(f):
    # every entry takes (x, y, z, p, q); most apply one function to x, or to x and y
    return lambda x, y, z, p, q: f(x)


def _on_xy(f):
    return lambda x, y, z, p, q: f(x, y)


_OPS = {
    "copy": lambda x, y, z, p, q: x,
    "neg": _on_x(np.negative),
    "abs": _on_x(np.abs),
    "sign": _on_x(np.sign),
    "exp": _on_x(np.exp),
    "exp2": _on_x(np.exp2),
    "expm1": _on_x(np.expm1),
    "log": _on_x(np.log),
    "log2": _on_x(np.log2),
    "log10": _on_x(np.log10),
    "log1p": _on_x(np.log1p),
    "sqrt": _on_x(np.sqrt),
    "rsqrt": lambda x, y, z, p, q: 1 / np.sqrt(x),
    "reciprocal": lambda x, y, z, p, q: 1 / x,
    "sin": _on_x(np.sin),
    "cos": _on_x(np.cos),
    "tan": _on_x(np.tan),
    "tanh": _on_x(np.tanh),
    "sigmoid": lambda x, y, z, p, q: 1 / (1 + np.exp(-x)),
    "erf": _on_x(_erf),
    "floor": _on_x(np.floor),
    "ceil": _on_x(np.ceil),
    "round": _on_x(np.round),
    "trunc": _on_x(np.trunc),
    "isnan": _on_x(np.isnan),
    "isinf": _on_x(np.isinf),
    "isfinite": _on_x(np.isfinite),
    "logical_not": lambda x, y, z, p, q: x == 0,
    "bitwise_not": _on_x(np.invert),
    "nan_to_num": lambda x, y, z, p, q: np.where(np.isnan(x), p, np.where(
        x == np.inf, y, np.where(x == -np.inf, z, x))),
    "clamp": lambda x, y, z, p, q: np.minimum(np.maximum(x, y), z),
    "clamp_min": _on_xy(np.maximum),
    "clamp_max": _on_xy(np.minimum),
    # activations
    "relu": lambda x, y, z, p, q: np.where(x < 0, x.dtype.type(0), x),
    "gelu": lambda x, y, z, p, q: 0.5 * x * (1 + _erf(x * x.dtype.type(0.7071067811865476))),
    "gelu_tanh": lambda x, y, z, p, q: 0.5 * x * (1 + np.tanh(
        x.dtype.type(0.7978845608028654) * (x + x.dtype.type(0.044715) * x * x * x))),
    "silu": lambda x, y, z, p, q: x / (1 + np.exp(-x)),
    "mish": lambda x, y, z, p, q: x * np.tanh(_softplus(x, x.dtype.type(1), x.dtype.type(20))),
    "softplus": lambda x, y, z, p, q: _softplus(x, p, q),
    "elu": lambda x, y, z, p, q: np.where(x > 0, x, p * np.expm1(x)),
    "leaky_relu": lambda x, y, z, p, q: np.where(x > 0, x, x * p),
    "hardsigmoid": _on_x(_hard),
    "hardswish": lambda x, y, z, p, q: x * _hard(x),
    "glu": lambda x, y, z, p, q: x / (1 + np.exp(-y)),
    # binary
    "add": _on_xy(operator.add),
    "add_alpha": lambda x, y, z, p, q: x + p * y,
    "sub": _on_xy(operator.sub),
    "sub_alpha": lambda x, y, z, p, q: x - p * y,
    "mul": _on_xy(operator.mul),
    "div": _on_xy(operator.truediv),
    "div_floor": _on_xy(np.floor_divide),
    "div_trunc": _on_xy(_div_trunc),
    "remainder": _on_xy(np.remainder),
    "fmod": _on_xy(np.fmod),
    "pow": _on_xy(_pow),
    "maximum": _on_xy(np.maximum),
    "minimum": _on_xy(np.minimum),
    "atan2": _on_xy(np.arctan2),
    "eq": _on_xy(operator.eq),
    "ne": _on_xy(operator.ne),
    "lt": _on_xy(operator.lt),
    "le": _on_xy(operator.le),
    "gt": _on_xy(operator.gt),
    "ge": _on_xy(operator.ge),
    "logical_and": lambda x, y, z, p, q: (x != 0) & (y != 0),
    "logical_or": lambda x, y, z, p, q: (x != 0) | (y != 0),
    "logical_xor": lambda x, y, z, p, q: (x != 0) ^ (y != 0),
    "bitwise_and": _on_xy(operator.and_),
    "bitwise_or": _on_xy(operator.or_),
    "bitwise_xor": _on_xy(operator.xor),
    "lshift": lambda x, y, z, p, q: _shift(x, y, True),
    "rshift": lambda x, y, z, p, q: _shift(x, y, False),
    # ternary
    "where": lambda x, y, z, p, q: np.where(x != 0, y, z),
    "lerp": lambda x, y, z, p, q: np.where(np.abs(z) < 0.5, x + z * (y - x),
                                           y - (y - x) * (1 - z)),
    "addcmul": lambda x, y, z, p, q: x + p * (y * z),
    "addcdiv": lambda x, y, z, p, q: x + p * (y / z),
}


def _as_ct(x, ct):
    if x is None:
        return None
    if hasattr(x, "_host_view"):
        return x._host_view().astype(ct.np, copy=False)
    return np.asarray(x).astype(ct.np)


def _make(name):
    fn = _OPS[name]

    def run(out, inputs, params, ct):
        args = [_as_ct(x, ct) for x in inputs] + [None] * (3 - len(inputs))
        p = [np.asarray(v).astype(ct.np)[()] for v in params]
        with np.errstate(all="ignore"):
            r = np.asarray(fn(*args, *p))
            _dt.copy_into(out._host_view(), r)
    run.__name__ = f"numpy_{name}"
    return run


for _name in _OPS:
    register(_name, "numpy")(_make(_name))
