"""cpu: the indexing primitives (see nbxtensor.ops.indexing) over NumPy views of storage.

Views may alias one storage with stride 0 (the op layer's iteration views), so the
element offsets of a view are computed explicitly and the storage is addressed as a
flat typed array.
"""
from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...dispatch import register


def _flat(t) -> np.ndarray:
    """The whole storage of `t` as a 1-D array of its dtype."""
    a = t.untyped_storage().host_array()
    n = a.nbytes // t.dtype.itemsize
    return a[:n * t.dtype.itemsize].view(t.dtype.np)


def _offsets(t) -> np.ndarray:
    """Element offsets (into _flat(t)) of every element of view t, shape t.shape."""
    off = np.full(t.shape, t.storage_offset(), np.int64)
    for d, (n, s) in enumerate(zip(t.shape, t.stride())):
        if s and n > 1:
            off += (np.arange(n, dtype=np.int64) * s).reshape([n if i == d else 1
                                                               for i in range(t.ndim)])
    return off


def _checked(idx, lo, hi, wrap, err) -> np.ndarray:
    iv = idx._host_view().astype(np.int64)
    bad = (iv < lo) | (iv >= hi)
    if bad.any():
        from ...index_errors import oob_error
        raise oob_error(err, int(iv[bad].max()))
    if wrap:
        iv = np.where(iv < 0, iv + hi, iv)
    return iv


@register("index_gather", "numpy")
def index_gather(out, src, idx, sdim, lo, hi, wrap, err):
    o = out._host_view()
    if idx is None:
        o[...] = src._host_view()
        return
    iv = _checked(idx, lo, hi, wrap, err)
    o[...] = _flat(src)[_offsets(src) + iv * sdim]


_UFUNC = {"add": np.add, "amax": np.maximum, "amin": np.minimum, "prod": np.multiply}


@register("index_scatter", "numpy")
def index_scatter(dst, src, idx, ddim, lo, hi, wrap, mode, err, value=None, alpha=None):
    iv = _checked(idx, lo, hi, wrap, err)
    off = (_offsets(dst) + iv * ddim).ravel()
    dt = dst.dtype.np
    with np.errstate(all="ignore"):
        if src is None:
            vals = np.full(off.shape, value, dtype=dt)
        else:
            vals = np.ascontiguousarray(src._host_view()).ravel()
        if alpha is not None:
            vals = vals.astype(np.float64 if dst.dtype.kind == "f" else np.int64) * alpha
        vals = vals.astype(dt)
    flat = _flat(dst)
    if mode == "store":
        flat[off] = vals  # duplicates: one of the writes wins (unspecified, as torch)
        return
    ufunc = _UFUNC[mode]
    if dst.dtype.kind == "b" and mode == "add":
        ufunc = np.logical_or
    with np.errstate(all="ignore"):
        ufunc.at(flat, off, vals)


@register("index_linearize", "numpy")
def index_linearize(acc, idx, stride, lo, hi, wrap, init, err):
    iv = _checked(idx, lo, hi, wrap, err) * stride
    a = acc._host_view()
    if init:
        a[...] = iv
    else:
        a += iv


@register("masked_fill", "numpy")
def masked_fill(out, x, mask, value):
    o = out._host_view()
    with np.errstate(all="ignore"):
        o[...] = np.where(mask._host_view(), _dt.cast(value, out.dtype), x._host_view())


@register("scatter_mean_finish", "numpy")
def scatter_mean_finish(out, count):
    o = out._host_view()
    n = np.maximum(count._host_view(), 1)
    if out.dtype.kind == "f":
        o[...] = (o.astype(np.float64) / n).astype(o.dtype)
    else:
        o[...] = np.floor_divide(o.astype(np.int64), n).astype(o.dtype)
