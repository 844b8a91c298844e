"""cpu: softmax and the normalisations with NumPy, the same contracts as kernels/softmax.py and
kernels/norm.py. Work is done in fp32 (fp64 for fp64 tensors) and rounded once at the end."""
from __future__ import annotations

import numpy as np

from ...dispatch import register


def _work(*ts):
    return np.float64 if any(t is not None and t.dtype.itemsize == 8 for t in ts) else np.float32


@register("softmax", "numpy")
def softmax(out, x, rows, *, dim, log=False):
    wt = _work(x, out)
    a = x._host_view().astype(wt)
    ax = dim if a.ndim else None
    with np.errstate(all="ignore"):
        m = a.max(axis=ax, keepdims=True)
        e = np.exp(a - m)
        s = e.sum(axis=ax, keepdims=True)
        y = (a - m - np.log(s)) if log else e / s
    out._host_view()[...] = y.astype(out.dtype.np)
    return out


_PER_CHANNEL = (slice(None), None)  # [:, None]: weight/bias of shape (C,) against (n, C, rest)


def _affine(y, weight, bias, wt, index):
    """y * weight + bias (either may be None), each cast to `wt` and indexed by `index`
    (`...` for a last-dim weight, _PER_CHANNEL for group/batch norm)."""
    if weight is not None:
        y = y * weight._host_view().astype(wt)[index]
    if bias is not None:
        y = y + bias._host_view().astype(wt)[index]
    return y


def _norm(out, x, weight, bias, eps, residual, h_out, rms):
    wt = _work(x, out)
    a = x._host_view()
    if residual is not None:
        a = (a.astype(wt) + residual._host_view().astype(wt)).astype(x.dtype.np)
        h_out._host_view()[...] = a
    a = a.astype(wt)
    with np.errstate(all="ignore"):
        if rms:
            y = a / np.sqrt((a * a).mean(axis=-1, keepdims=True) + wt(eps))
        else:
            mu = a.mean(axis=-1, keepdims=True)
            d = a - mu
            y = d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + wt(eps))
        y = _affine(y, weight, bias, wt, ...)
    out._host_view()[...] = y.astype(out.dtype.np)
    return out


@register("layer_norm", "numpy")
def layer_norm(out, x, weight, bias, eps, residual=None, h_out=None):
    return _norm(out, x, weight, bias, eps, residual, h_out, rms=False)


@register("rms_norm", "numpy")
def rms_norm(out, x, weight, eps, residual=None, h_out=None):
    return _norm(out, x, weight, None, eps, residual, h_out, rms=True)


@register("group_norm", "numpy")
def group_norm(out, x, num_groups, weight, bias, eps):
    wt = _work(x, out)
    n, C, HW = x.shape
    a = x._host_view().astype(wt).reshape(n, num_groups, -1)
    with np.errstate(all="ignore"):
        mu = a.mean(axis=-1, keepdims=True)
        d = a - mu
        y = (d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + wt(eps))).reshape(n, C, HW)
        y = _affine(y, weight, bias, wt, _PER_CHANNEL)
    out._host_view()[...] = y.astype(out.dtype.np)
    return out


@register("batch_norm", "numpy")
def batch_norm(out, x, running_mean, running_var, weight, bias, eps):
    wt = _work(x, out)
    a = x._host_view().astype(wt)
    with np.errstate(all="ignore"):
        y = (a - running_mean._host_view().astype(wt)[:, None]) \
            / np.sqrt(running_var._host_view().astype(wt)[:, None] + wt(eps))
        y = _affine(y, weight, bias, wt, _PER_CHANNEL)
    out._host_view()[...] = y.astype(out.dtype.np)
    return out
