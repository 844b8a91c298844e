"""cpu: reductions and scans with NumPy (float inputs computed in float64, ints in int64).

The declared reductions (ops/_declare.py) come as NumPy expressions over `a` (the input), `w`
(it widened), `axis` and `scale`, compiled once each (`_declared`); max/min with their indices,
var/std, the norms and logsumexp are written here.
"""
from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...declarations import subscribe_reductions
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


def _first_index(f, w, axis):
    """np.argmax / np.argmin over one dim (or a 0-dim input), kept: NumPy picks the first NaN,
    as torch."""
    if not axis:
        return np.zeros(w.shape, np.int64)
    return np.expand_dims(f(w, axis=axis[0]), axis[0])


_DECLARED: dict = {}      # kind -> (fn(a, w, axis, scale), reads w, writes indices)


def _declared(op) -> None:
    import ast
    fn = eval(compile(f"lambda a, w, axis, scale: ({op.np})", f"<numpy reduction {op.name}>",
                      "eval"), {"np": np, "_first_index": _first_index})
    uses_w = any(isinstance(n, ast.Name) and n.id == "w" for n in ast.walk(ast.parse(op.np)))
    _DECLARED[op.kind] = (fn, uses_w, op.rule == "index")


subscribe_reductions(_declared)


@register("reduce", "numpy")
def reduce(kind, x, dims, values, indices, **params):
    a = x._host_view()
    axis = tuple(dims)
    declared = _DECLARED.get(kind)
    with np.errstate(all="ignore"):
        if declared is not None:
            fn, uses_w, index = declared
            r = fn(a, _acc(a) if uses_w else None, axis, params.get("scale"))
            if index:
                _store(indices, r)
                return
        elif kind in ("max", "min"):
            # one dim (or a 0-dim input); NumPy's argmax/argmin pick the first NaN, as torch
            w = _acc(a)
            idx = _first_index(np.argmax if kind == "max" else np.argmin, w, axis)
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
