"""Diagonals, grids and splits: diagonal (a view), diag, diag_embed, meshgrid, tensor_split,
kron. Views are metadata only; the rest is zeros plus a copy into a diagonal view, or one
broadcast multiply (kron), so every device runs them with the ops it already has.
"""
from __future__ import annotations

import builtins

from .. import dtypes as _dt
from ..tensor import Tensor, normalize_dim
from . import _methods
from . import elementwise as _ew
from ._common import check_tensor

__all__ = ["diagonal", "diag", "diag_embed", "meshgrid", "tensor_split", "kron"]


def _int(v, argname, op):
    if isinstance(v, builtins.bool) or not isinstance(v, int):
        raise TypeError(f"{op}: {argname} must be an int, got {type(v).__name__} {v!r}")
    return v


def diagonal(input, offset=0, dim1=0, dim2=1):  # noqa: A002
    """The diagonal of the (dim1, dim2) planes as a view: those dims are removed and one of the
    diagonal's length is appended; offset > 0 is above the main diagonal, < 0 below."""
    x = check_tensor(input, "input", "diagonal")
    _int(offset, "offset", "diagonal")
    d1 = normalize_dim(dim1, x.ndim, "dim1")
    d2 = normalize_dim(dim2, x.ndim, "dim2")
    if d1 == d2:
        raise ValueError(f"diagonal: dim1 and dim2 must differ, got {dim1} and {dim2}")
    n1, n2 = x.shape[d1], x.shape[d2]
    s1, s2 = x.stride(d1), x.stride(d2)
    if offset >= 0:
        length = builtins.max(0, builtins.min(n1, n2 - offset))
        start = offset * s2
    else:
        length = builtins.max(0, builtins.min(n1 + offset, n2))
        start = -offset * s1
    if length == 0:
        start = 0   # no element is addressed: keep the view inside its storage
    keep = [i for i in range(x.ndim) if i not in (d1, d2)]
    shape = [x.shape[i] for i in keep] + [length]
    stride = [x.stride(i) for i in keep] + [s1 + s2]
    return x._view(tuple(shape), tuple(stride), x.storage_offset() + start)


def diag_embed(input, offset=0, dim1=-2, dim2=-1):  # noqa: A002
    """A tensor whose (dim1, dim2) diagonals (at `offset`) hold the last dim of `input`; the
    other elements are zero."""
    x = check_tensor(input, "input", "diag_embed")
    _int(offset, "offset", "diag_embed")
    if x.ndim == 0:
        raise ValueError("diag_embed: input must have at least one dimension, got a 0-D tensor")
    nd = x.ndim + 1
    d1 = normalize_dim(dim1, nd, "dim1")
    d2 = normalize_dim(dim2, nd, "dim2")
    if d1 == d2:
        raise ValueError(f"diag_embed: dim1 and dim2 must differ, got {dim1} and {dim2}")
    n = x.shape[-1] + builtins.abs(offset)
    rest = list(x.shape[:-1])
    shape = []
    for i in range(nd):
        shape.append(n if i in (d1, d2) else rest.pop(0))
    out = Tensor._empty(tuple(shape), x.dtype, x.device)
    out.zero_()
    if out.numel():
        diagonal(out, offset, d1, d2).copy_(x)
    return out


def diag(input, diagonal=0):  # noqa: A002
    """1-D input: a square matrix with `input` on its `diagonal`-th diagonal; 2-D input: a copy
    of that diagonal (1-D)."""
    x = check_tensor(input, "input", "diag")
    _int(diagonal, "diagonal", "diag")
    if x.ndim == 1:
        return diag_embed(x, diagonal, 0, 1)
    if x.ndim == 2:
        return globals()["diagonal"](x, diagonal, 0, 1).clone()
    raise ValueError(f"diag: input must be 1-D or 2-D, got {x.ndim}-D shape {tuple(x.shape)}")


def meshgrid(*tensors, indexing=None):
    """Coordinate grids (views, as torch: expanded inputs) from 1-D (or 0-D) tensors.

    indexing='ij' (the default) gives shape (len(t0), len(t1), ...); 'xy' swaps the first two.
    """
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if not tensors:
        raise ValueError("meshgrid: expected at least one tensor")
    indexing = "ij" if indexing is None else indexing
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    for i, t in enumerate(tensors):
        check_tensor(t, f"tensors[{i}]", "meshgrid")
        if t.ndim > 1:
            raise ValueError(f"meshgrid: tensors[{i}] must be 0-D or 1-D, got shape "
                             f"{tuple(t.shape)}")
        if t.dtype is not tensors[0].dtype or t.device != tensors[0].device:
            raise TypeError(f"meshgrid: every tensor must have the dtype and device of "
                            f"tensors[0] ({tensors[0].dtype.name}, {tensors[0].device}); "
                            f"tensors[{i}] has {t.dtype.name}, {t.device}")
    ts = [t.reshape(-1) for t in tensors]
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(t.shape[0] for t in ts)
    grids = []
    for i, t in enumerate(ts):
        view = [1] * len(ts)
        view[i] = shape[i]
        grids.append(t.reshape(view).expand(shape))
    if swap:
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


def tensor_split(input, indices_or_sections, dim=0):  # noqa: A002
    """Views of `input` split along `dim`: into n nearly equal parts (an int: the first
    size % n parts one longer), or at the given indices (a list, tuple or 1-D int tensor)."""
    x = check_tensor(input, "input", "tensor_split")
    d = normalize_dim(dim, x.ndim, "dim")
    n = x.shape[d]
    ios = indices_or_sections
    if isinstance(ios, Tensor):
        if ios.dtype.kind not in "iu" or ios.device.type != "cpu" or ios.ndim > 1:
            raise TypeError(f"tensor_split: a tensor indices_or_sections must be a 0-D or 1-D "
                            f"integer tensor on cpu, got {ios.dtype.name} shape "
                            f"{tuple(ios.shape)} on {ios.device}")
        ios = ios.item() if ios.ndim == 0 else ios.tolist()
    if isinstance(ios, int) and not isinstance(ios, builtins.bool):
        if ios <= 0:
            raise ValueError(f"tensor_split: number of sections must be larger than 0, got {ios}")
        q, r = divmod(n, ios)
        bounds, start = [], 0
        for i in range(ios):
            start += q + (1 if i < r else 0)
            bounds.append(start)
        bounds = bounds[:-1]
    elif isinstance(ios, (list, tuple)):
        bounds = [_int(b, "indices_or_sections", "tensor_split") for b in ios]
    else:
        raise TypeError(f"tensor_split: indices_or_sections must be an int, a list or tuple of "
                        f"ints, or an integer tensor, got {type(ios).__name__}")
    # part i is x[bounds[i-1]:bounds[i]] with Python's slice rules (negative bounds count from
    # the end; a bound below its predecessor gives an empty part), as torch
    parts = []
    for lo, hi in zip([0] + bounds, bounds + [n]):
        lo, hi, _ = slice(lo, hi).indices(n)
        parts.append(x.narrow(d, lo, builtins.max(hi - lo, 0)))
    return tuple(parts)


def kron(input, other):  # noqa: A002
    """Kronecker product: block (i, j, ...) of the result is input[i, j, ...] * other, with
    torch's type promotion (one broadcast multiply)."""
    a = check_tensor(input, "input", "kron")
    b = check_tensor(other, "other", "kron")
    nd = builtins.max(a.ndim, b.ndim)
    ash = (1,) * (nd - a.ndim) + tuple(a.shape)
    bsh = (1,) * (nd - b.ndim) + tuple(b.shape)
    a2 = a.reshape([v for s in ash for v in (s, 1)])
    b2 = b.reshape([v for s in bsh for v in (1, s)])
    return _ew.mul(a2, b2).reshape([p * q for p, q in zip(ash, bsh)])


_methods.install(diagonal=diagonal, diag=diag, diag_embed=diag_embed,
                 tensor_split=tensor_split, kron=kron)
