"""cpu: sort, topk, nonzero and unique with NumPy (stable sorts; NaN sorts as the largest)."""
from __future__ import annotations

import numpy as np

from ...dispatch import register
from ...tensor import Tensor


def _widen(x, a: np.ndarray) -> np.ndarray:
    # floats (bf16 included, whose NumPy kind is 'V') in float64: exact, NaN sorts last
    return a.astype(np.float64) if x.dtype.is_floating_point else a


def _stable_order(a: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Stable argsort along `axis`. Descending keeps equal keys in input order: sort the
    reversed row ascending (stable), reverse the result and map the indices back."""
    if not descending:
        return np.argsort(a, axis=axis, kind="stable")
    n = a.shape[axis]
    rev = np.flip(a, axis)
    o = np.argsort(rev, axis=axis, kind="stable")
    return (n - 1) - np.flip(o, axis)


@register("sort", "numpy")
def sort(x, dim, descending, values, indices):
    a = x._host_view()
    if a.ndim == 0:
        values._host_view()[...] = a
        indices._host_view()[...] = 0
        return
    o = _stable_order(_widen(x, a), dim, descending)
    indices._host_view()[...] = o
    values._host_view()[...] = np.take_along_axis(a, o, axis=dim)


@register("topk", "numpy")
def topk(x, k, dim, largest, values, indices):
    a = x._host_view()
    if a.ndim == 0:
        values._host_view()[...] = a
        indices._host_view()[...] = 0
        return
    o = np.take(_stable_order(_widen(x, a), dim, largest), np.arange(k), axis=dim)
    indices._host_view()[...] = o
    values._host_view()[...] = np.take_along_axis(a, o, axis=dim)


@register("nonzero", "numpy")
def nonzero(x):
    a = x._host_view()
    r = np.argwhere(a != 0).astype(np.int64)
    return Tensor._from_numpy_unchecked(np.ascontiguousarray(r))


@register("unique", "numpy")
def unique(x, return_inverse, return_counts):
    a = np.ascontiguousarray(x._host_view()).reshape(-1)
    # NaNs stay distinct, as torch (each compares unequal to its neighbour after the sort)
    vals, inv, counts = np.unique(_widen(x, a), return_inverse=True, return_counts=True,
                                  equal_nan=False)
    vals = vals.astype(a.dtype)
    t = Tensor._from_numpy_unchecked
    return (t(np.ascontiguousarray(vals)), t(inv.astype(np.int64).reshape(-1)),
            t(counts.astype(np.int64)))


@register("unique_dim", "numpy")
def unique_dim(rows):
    """Unique rows of a contiguous 2-D (n, m) tensor, n >= 1: (row starts in sorted order as
    indices into `rows`, inverse (n,), counts). np.unique(axis=0)'s semantics, written out so
    that NaN is defined: rows sort lexicographically with NaN largest (as the device path's
    stable sorts), and rows holding a NaN never equal another row (NaN != NaN)."""
    a = rows._host_view()
    w = _widen(rows, a)
    n, m = w.shape
    # np.lexsort sorts by its last key first: pass the columns last-to-first, stable
    perm = np.lexsort(w.T[::-1]) if m else np.arange(n)
    s = w[perm]
    starts = np.ones(n, dtype=bool)
    if n > 1:
        starts[1:] = np.any(s[1:] != s[:-1], axis=1)
    ids = np.cumsum(starts) - 1
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = ids
    first = np.flatnonzero(starts)
    counts = np.diff(np.append(first, n)).astype(np.int64)
    t = Tensor._from_numpy_unchecked
    return (t(np.ascontiguousarray(perm[first].astype(np.int64))), t(inv),
            t(np.ascontiguousarray(counts)))


@register("svdvals", "numpy")
def svdvals(a, out):
    """Singular values of the trailing 2 dims (descending), in float64 then cast: the matrix
    norms 'nuc' and +-2 (kept here with the other NumPy-only helpers of the reductions)."""
    h = np.ascontiguousarray(a._host_view()).astype(np.float64)
    out._host_view()[...] = np.linalg.svd(h, compute_uv=False).astype(out._host_view().dtype)
