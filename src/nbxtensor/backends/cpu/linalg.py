"""cpu: matrix products with NumPy, the same 4-D contract and epilogue as kernels/matmul.py.

16-bit inputs are multiplied in fp32 (fp32 accumulation, as on the GPU) and rounded once
at the store; fp32 and fp64 stay in their own precision; integers use NumPy's integer
matmul (wrapping on overflow, as torch on cpu).
"""
from __future__ import annotations


import numpy as np

from ...dispatch import register
from .elementwise import _erf


def _gelu_erf(x):
    return 0.5 * x * (1.0 + _erf(x * 0.7071067811865476))


def apply_activation(acc, act):
    if act in (None, "none"):
        return acc
    with np.errstate(all="ignore"):
        if act == "gelu":
            return _gelu_erf(acc)
        if act == "gelu_tanh":
            return 0.5 * acc * (1.0 + np.tanh(0.7978845608028654 * (acc + 0.044715 * acc ** 3)))
        if act == "silu":
            return acc / (1.0 + np.exp(-acc))
        if act == "relu":
            return np.where(acc < 0, acc.dtype.type(0), acc)
    raise ValueError(f"unknown activation {act!r}")


@register("matmul", "numpy")
def matmul(out, a, b, *, bias=None, residual=None, alpha=1.0, beta=1.0, activation=None,
           precision="ieee"):
    dt = out.dtype
    if dt.kind == "f":
        work = np.float64 if dt.itemsize == 8 else np.float32
    else:
        work = dt.np
    A = a._host_view().astype(work, copy=False)
    B = b._host_view().astype(work, copy=False)
    with np.errstate(all="ignore"):
        if a.shape[-1] == 0:
            acc = np.zeros(out.shape, work)
        else:
            acc = np.matmul(A, B)
        if alpha != 1:
            acc = acc * (work(alpha) if dt.kind == "f" else int(alpha))
        if bias is not None:
            acc = acc + bias._host_view().astype(work)
        acc = apply_activation(acc, activation)
        if residual is not None:
            r = residual._host_view().astype(work)
            acc = acc + (r * (work(beta) if dt.kind == "f" else int(beta)) if beta != 1 else r)
        np.copyto(out._host_view(), acc, casting="unsafe")
    return out
