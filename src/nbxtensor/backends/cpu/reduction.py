"""cpu: reductions and scans with NumPy (float inputs computed in float64, ints in int64)."""
from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...dispatch import register


def _acc(a: np.ndarray) -> np.ndarray:
    """The input widened to the accumulation type (exact for every dtype we hold)."""
    if a.dtype.kind in "biu":
        return a.astype(np.int64)
    return a.astype(np.float64)


def _store(dst, value):
    with np.errstate(all="ignore"):
        _dt.copy_into(dst._host_view(), value)


def _norm(a, axis, ord):
    a = np.abs(a)
    if ord == np.inf:
        return np.max(a, axis=axis, keepdims=True)
    if ord == -np.inf:
        return np.min(a, axis=axis, keepdims=True)
    if ord == 0:
        return np.sum(a != 0, axis=axis, keepdims=True).astype(np.float64)
    if ord == 1:
        return np.sum(a, axis=axis, keepdims=True)
    if ord == 2:
        return np.sqrt(np.sum(a * a, axis=axis, keepdims=True))
    return np.sum(a ** ord, axis=axis, keepdims=True) ** (1.0 / ord)


@register("reduce", "numpy")
def reduce(kind, x, dims, values, indices, **params):
    a = x._host_view()
    axis = tuple(dims)
    with np.errstate(all="ignore"):
        if kind in ("sum", "mean"):
            r = np.sum(_acc(a), axis=axis, keepdims=True)
            if kind == "mean":
                r = r * params["scale"]
        elif kind == "prod":
            r = np.prod(_acc(a), axis=axis, keepdims=True)
        elif kind in ("amax", "amin"):
            f = np.max if kind == "amax" else np.min
            r = f(_acc(a), axis=axis, keepdims=True)
        elif kind in ("max", "min", "argmax", "argmin"):
            # one dim (or a 0-dim input); NumPy's argmax/argmin pick the first NaN, as torch
            w = _acc(a)
            if not axis:
                idx = np.zeros(a.shape, np.int64)
            else:
                f = np.argmax if kind in ("max", "argmax") else np.argmin
                idx = np.expand_dims(f(w, axis=axis[0]), axis[0])
            if indices is not None:
                _store(indices, idx)
            if values is None:
                return
            r = np.take_along_axis(w, idx, axis=axis[0]) if axis else w
        elif kind in ("var", "std"):
            w = _acc(a)
            m = np.mean(w, axis=axis, keepdims=True)
            r = np.sum((w - m) ** 2, axis=axis, keepdims=True) * params["scale"]
            if kind == "std":
                r = np.sqrt(r)
        elif kind == "norm":
            r = _norm(_acc(a), axis, params["ord"])
        elif kind == "lse":
            w = _acc(a)
            m = np.max(w, axis=axis, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            r = np.log(np.sum(np.exp(w - m), axis=axis, keepdims=True)) + m
        elif kind in ("any", "all", "nnz"):
            nz = a != 0
            if kind == "any":
                r = np.any(nz, axis=axis, keepdims=True)
            elif kind == "all":
                r = np.all(nz, axis=axis, keepdims=True)
            else:
                r = np.sum(nz, axis=axis, keepdims=True, dtype=np.int64)
        else:
            raise ValueError(f"reduce: unknown kind {kind!r}")
    _store(values, r)


@register("scan", "numpy")
def scan(kind, x, dim, out):
    a = x._host_view()
    w = a.astype(np.int64) if out.dtype.kind in "biu" else a.astype(np.float64)
    if w.ndim == 0:
        _store(out, w)
        return
    with np.errstate(all="ignore"):
        r = np.cumsum(w, axis=dim) if kind == "cumsum" else np.cumprod(w, axis=dim)
    _store(out, r)
