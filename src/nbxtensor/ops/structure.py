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

__all__ = ["diagonal", "diag", "diag_embed", "meshgrid", "tensor_split", "kron", "broadcast_to",
           "broadcast_tensors", "take_along_dim", "diff", "bincount", "isin", "cartesian_prod",
           "triu_indices", "tril_indices", "rot90", "block_diag", "hsplit", "vsplit", "dsplit",
           "column_stack", "row_stack", "dstack", "trace", "cross", "histc", "combinations",
           "vander", "cov", "corrcoef", "trapezoid", "trapz", "cumulative_trapezoid"]


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


def broadcast_to(input, size):  # noqa: A002
    """`input` expanded to `size` (a view), with broadcasting's rules (-1 keeps a size)."""
    return check_tensor(input, "input", "broadcast_to").expand(*_sizes(size, "broadcast_to"))


def _sizes(size, op):
    if isinstance(size, int) and not isinstance(size, builtins.bool):
        return (size,)
    if not isinstance(size, (list, tuple)):
        raise TypeError(f"{op}: size must be a tuple of ints, got {type(size).__name__}")
    return tuple(size)


def broadcast_tensors(*tensors):
    """Views of the tensors expanded to their common broadcast shape."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    from ..tensor import broadcast_shapes
    for i, t in enumerate(tensors):
        check_tensor(t, f"tensors[{i}]", "broadcast_tensors")
    shape = broadcast_shapes(*[tuple(t.shape) for t in tensors])
    return tuple(t.expand(*shape) for t in tensors)


def take_along_dim(input, indices, dim=None, *, out=None):  # noqa: A002
    """Values of `input` at `indices` along `dim` (input and indices broadcast over the other
    dims); dim=None indexes the flattened input."""
    from . import indexing as _ix
    x = check_tensor(input, "input", "take_along_dim")
    idx = check_tensor(indices, "indices", "take_along_dim")
    if idx.dtype.kind not in "iu":
        raise TypeError(f"take_along_dim: indices must be an integer tensor, got "
                        f"{idx.dtype.name}")
    if dim is None:
        return _ix.gather(x.reshape(-1), 0, idx.reshape(-1), out=out)
    d = normalize_dim(dim, x.ndim, "dim")
    if idx.ndim != x.ndim:
        raise ValueError(f"take_along_dim: input and indices should have the same number of "
                         f"dimensions, got {x.ndim} and {idx.ndim}")
    from ..tensor import broadcast_shapes
    xs, js = list(x.shape), list(idx.shape)
    xs[d] = js[d] = 1
    common = list(broadcast_shapes(tuple(xs), tuple(js)))
    xe, je = list(common), list(common)
    xe[d], je[d] = x.shape[d], idx.shape[d]
    return _ix.gather(x.expand(*xe), d, idx.expand(*je), out=out)


def diff(input, n=1, dim=-1, prepend=None, append=None):  # noqa: A002
    """The n-th forward difference along `dim` (x[i+1] - x[i]; for bool, x[i+1] != x[i]),
    after `prepend` and `append` are concatenated along `dim`."""
    from . import shape as _sh
    x = check_tensor(input, "input", "diff")
    if x.ndim == 0:
        raise ValueError("diff: expected input to be at least one-dimensional")
    _int(n, "n", "diff")
    if n < 0:
        raise ValueError(f"diff: order must be non-negative but got {n}")
    d = normalize_dim(dim, x.ndim, "dim")
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        parts = [p if p.ndim == x.ndim else p.unsqueeze(d) if p.ndim == x.ndim - 1
                 else p.expand(*[1 if i == d else x.shape[i] for i in range(x.ndim)])
                 for p in parts]
        x = _sh.cat(parts, dim=d)
    for _ in range(n):
        L = x.shape[d]
        if L == 0:
            break
        hi, lo = x.narrow(d, 1, L - 1), x.narrow(d, 0, L - 1)
        x = _ew.ne(hi, lo) if x.dtype is _dt.bool else _ew.sub(hi, lo)
    return x


def bincount(input, weights=None, minlength=0):  # noqa: A002
    """Counts (or summed weights) of each value of a 1-D non-negative integer tensor; length
    max(input.max() + 1, minlength). int64 counts; float32/float64 weights keep their dtype,
    other weights give float64, as torch. Syncs with the host once (the length)."""
    x = check_tensor(input, "input", "bincount")
    if x.ndim != 1 or x.dtype.kind not in "iu":
        raise TypeError(f"bincount: input must be a 1-D integer tensor, got {x.dtype.name} "
                        f"shape {tuple(x.shape)}")
    _int(minlength, "minlength", "bincount")
    if minlength < 0:
        raise ValueError(f"bincount: minlength should be >= 0, got {minlength}")
    if x.numel() and int(x.min().item()) < 0:
        raise ValueError("bincount: input must contain only non-negative values")
    length = builtins.max(int(x.max().item()) + 1 if x.numel() else 0, minlength)
    if weights is None:
        dt, w = _dt.int64, None
    else:
        w = check_tensor(weights, "weights", "bincount")
        if tuple(w.shape) != tuple(x.shape):
            raise ValueError(f"bincount: weights should be 1-D and have the same length as "
                             f"input, got {tuple(w.shape)} for input {tuple(x.shape)}")
        dt = w.dtype if w.dtype in (_dt.float32, _dt.float64) else _dt.float64
        w = w.to(dt)
    out = Tensor._empty((length,), dt, x.device)
    out.zero_()
    if x.numel():
        src = w if w is not None else Tensor._empty(tuple(x.shape), dt, x.device).fill_(1)
        out.scatter_add_(0, x.long(), src)
    return out


def isin(elements, test_elements, *, assume_unique=False, invert=False):
    """Whether each element of `elements` is in `test_elements` (either may be a Python
    number); a bool tensor of elements' shape."""
    from ..creation import tensor as _tensor
    if not isinstance(elements, Tensor) and not isinstance(test_elements, Tensor):
        raise TypeError("isin: at least one of elements and test_elements must be a Tensor")
    if not isinstance(elements, Tensor):
        elements = _tensor(elements, device=test_elements.device)
    if not isinstance(test_elements, Tensor):
        test_elements = _tensor(test_elements, device=elements.device)
    e = check_tensor(elements, "elements", "isin")
    t = check_tensor(test_elements, "test_elements", "isin").reshape(-1)
    if t.numel() == 0:
        hit = Tensor._empty(tuple(e.shape), _dt.bool, e.device).fill_(False)
    else:
        hit = _ew.eq(e.unsqueeze(-1), t).any(-1)
    return _ew.logical_not(hit) if invert else hit


def cartesian_prod(*tensors):
    """The Cartesian product of 1-D tensors as rows of an (N, len(tensors)) tensor (one
    tensor: itself)."""
    from . import shape as _sh
    for i, t in enumerate(tensors):
        check_tensor(t, f"tensors[{i}]", "cartesian_prod")
        if t.ndim != 1:
            raise ValueError(f"cartesian_prod: expect a 1D vector, but got shape "
                             f"{tuple(t.shape)} for tensors[{i}]")
    if len(tensors) == 1:
        return tensors[0]
    grids = meshgrid(*tensors, indexing="ij")
    return _sh.stack([g.reshape(-1) for g in grids], dim=1)


def _tri_indices(row, col, offset, dtype, device, op, upper):
    import numpy as np
    from ..creation import tensor as _tensor
    for v, name in ((row, "row"), (col, "col"), (offset, "offset")):
        _int(v, name, op)
    if row < 0 or col < 0:
        raise ValueError(f"{op}: row and col must be non-negative, got {row} and {col}")
    dtype = _dt.int64 if dtype is None else dtype
    r, c = np.triu_indices(row, offset, col) if upper else np.tril_indices(row, offset, col)
    return _tensor(np.stack([r, c]).astype(np.int64).reshape(2, -1), dtype=dtype,
                   device=device)


def triu_indices(row, col, offset=0, *, dtype=None, device=None, layout=None):
    """The (2, N) row and column indices of the upper triangle of a row x col matrix."""
    return _tri_indices(row, col, offset, dtype, device, "triu_indices", True)


def tril_indices(row, col, offset=0, *, dtype=None, device=None, layout=None):
    """The (2, N) row and column indices of the lower triangle of a row x col matrix."""
    return _tri_indices(row, col, offset, dtype, device, "tril_indices", False)


def rot90(input, k=1, dims=(0, 1)):  # noqa: A002
    """`input` rotated by 90 degrees k times in the plane of `dims` (from the first towards
    the second), a new tensor as torch."""
    x = check_tensor(input, "input", "rot90")
    _int(k, "k", "rot90")
    if len(dims) != 2:
        raise ValueError(f"rot90: expected total rotation dims == 2, but got dims = {len(dims)}")
    d0, d1 = (normalize_dim(d, x.ndim, "dims") for d in dims)
    if d0 == d1:
        raise ValueError(f"rot90: expected rotation dims to be different, got {dims}")
    k %= 4
    if k == 1:
        return x.flip(d1).transpose(d0, d1)
    if k == 2:
        return x.flip((d0, d1))
    if k == 3:
        return x.flip(d0).transpose(d0, d1)
    return x.clone()


def block_diag(*tensors):
    """A block-diagonal matrix of the (0-, 1- or 2-D) tensors, with torch's type promotion."""
    mats = []
    for i, t in enumerate(tensors):
        check_tensor(t, f"tensors[{i}]", "block_diag")
        if t.ndim > 2:
            raise ValueError(f"block_diag: Input tensors must have 2 or fewer dimensions. "
                             f"Input {i} has {t.ndim} dimensions")
        mats.append(t.reshape(1, 1) if t.ndim == 0 else t.reshape(1, -1) if t.ndim == 1 else t)
    if not mats:
        return Tensor._empty((1, 0), _dt.get_default_dtype(), "cpu")
    dev = mats[0].device
    dt = mats[0].dtype
    for i, m in enumerate(mats[1:], 1):
        if m.device != dev:
            raise ValueError(f"block_diag: tensors[{i}] is on {m.device}, tensors[0] on {dev}")
        dt = _dt.promote_types(dt, m.dtype)
    out = Tensor._empty((builtins.sum(m.shape[0] for m in mats),
                         builtins.sum(m.shape[1] for m in mats)), dt, dev)
    out.zero_()
    r = c = 0
    for m in mats:
        if m.numel():
            out[r:r + m.shape[0], c:c + m.shape[1]] = m.to(dt)
        r += m.shape[0]
        c += m.shape[1]
    return out


def _nsplit(x, ios, dim, op, need):
    x = check_tensor(x, "input", op)
    if x.ndim < need:
        raise ValueError(f"{op}: requires a tensor with at least {need} dimension(s), but got a "
                         f"tensor with {x.ndim} dimensions")
    if isinstance(ios, int) and not isinstance(ios, builtins.bool):
        if ios <= 0 or x.shape[dim] % ios:
            raise ValueError(f"{op}: dimension {dim} of size {x.shape[dim]} is not divisible "
                             f"by {ios} sections")
    return tensor_split(x, ios, dim)


def hsplit(input, indices_or_sections):  # noqa: A002
    return _nsplit(input, indices_or_sections, 0 if input.ndim == 1 else 1, "hsplit", 1)


def vsplit(input, indices_or_sections):  # noqa: A002
    return _nsplit(input, indices_or_sections, 0, "vsplit", 2)


def dsplit(input, indices_or_sections):  # noqa: A002
    return _nsplit(input, indices_or_sections, 2, "dsplit", 3)


def column_stack(tensors, *, out=None):
    """1-D (and 0-D) tensors as columns, then hstack."""
    from . import shape as _sh
    cols = [t.reshape(-1, 1) if t.ndim <= 1 else t for t in tensors]
    return _sh.hstack(cols, out=out) if out is not None else _sh.hstack(cols)


def row_stack(tensors, *, out=None):
    from . import shape as _sh
    return _sh.vstack(tensors, out=out) if out is not None else _sh.vstack(tensors)


def dstack(tensors, *, out=None):
    """Stack along the third dim, after making each tensor at least 3-D (a 1-D (n,) becomes
    (1, n, 1), a 2-D (m, n) becomes (m, n, 1))."""
    from . import shape as _sh
    ts = []
    for t in tensors:
        t = t.reshape(1, -1, 1) if t.ndim <= 1 else t.unsqueeze(-1) if t.ndim == 2 else t
        ts.append(t)
    return _sh.cat(ts, dim=2, out=out) if out is not None else _sh.cat(ts, dim=2)


def trace(input):  # noqa: A002
    """The sum of the main diagonal of a 2-D tensor (integer inputs sum to int64)."""
    x = check_tensor(input, "input", "trace")
    if x.ndim != 2:
        raise ValueError(f"trace: expected a matrix, but got tensor with dim {x.ndim}")
    return diagonal(x).sum()


def cross(input, other, dim=None, *, out=None):  # noqa: A002
    """The 3-vector cross product along `dim` (None: the first dim of size 3), the inputs
    broadcast."""
    from . import indexing as _ix
    from ..creation import tensor as _tensor
    a = check_tensor(input, "input", "cross")
    b = check_tensor(other, "other", "cross")
    a, b = broadcast_tensors(a, b)
    if dim is None:
        dims = [i for i, n in enumerate(a.shape) if n == 3]
        if not dims:
            raise ValueError(f"cross: no dimension of size 3 in input of shape {tuple(a.shape)}")
        d = dims[0]
    else:
        d = normalize_dim(dim, a.ndim, "dim")
    if a.shape[d] != 3:
        raise ValueError(f"cross: inputs dimension {d} must have length 3, got {a.shape[d]}")
    i1 = _tensor([1, 2, 0], device=a.device)
    i2 = _tensor([2, 0, 1], device=a.device)
    a1, a2 = _ix.index_select(a, d, i1), _ix.index_select(a, d, i2)
    b1, b2 = _ix.index_select(b, d, i1), _ix.index_select(b, d, i2)
    res = _ew.sub(_ew.mul(a1, b2), _ew.mul(a2, b1))
    return res if out is None else out.copy_(res)


def histc(input, bins=100, min=0, max=0, *, out=None):  # noqa: A002
    """A histogram of `bins` equal bins over [min, max] (both 0: the data's range); values
    outside are ignored, max falls in the last bin. The result has the input's dtype."""
    x = check_tensor(input, "input", "histc")
    if not x.dtype.is_floating_point:
        raise TypeError(f"histc: input must be a floating point tensor, got {x.dtype.name}")
    _int(bins, "bins", "histc")
    if bins <= 0:
        raise ValueError(f"histc: bins must be > 0, got {bins}")
    lo, hi = float(min), float(max)
    if lo > hi:
        raise ValueError(f"histc: max must be larger than min, got min={lo}, max={hi}")
    flat = x.reshape(-1)
    if lo == hi and flat.numel():
        lo, hi = float(flat.min().item()), float(flat.max().item())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    keep = _ew.logical_and(_ew.ge(flat, lo), _ew.le(flat, hi))
    pos = _ew.mul(_ew.sub(flat, lo), bins / (hi - lo)).nan_to_num(0.0)
    idx = _ew.where(keep, pos, 0.0).floor().long().clamp(0, bins - 1)
    res = Tensor._empty((bins,), x.dtype, x.device)
    res.zero_()
    if flat.numel():
        res.scatter_add_(0, idx, keep.to(x.dtype))
    return res if out is None else out.copy_(res)


def combinations(input, r=2, with_replacement=False):  # noqa: A002
    """The length-r combinations of a 1-D tensor's elements as rows of a (N, r) tensor, in
    itertools' order."""
    import itertools

    from . import indexing as _ix
    from ..creation import tensor as _tensor
    x = check_tensor(input, "input", "combinations")
    if x.ndim != 1:
        raise ValueError(f"combinations: expect a 1D vector, but got shape {tuple(x.shape)}")
    _int(r, "r", "combinations")
    if r < 0:
        raise ValueError(f"combinations: r must be non-negative, got {r}")
    if r == 0:
        return Tensor._empty((0,), x.dtype, x.device)
    gen = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    rows = list(gen(range(x.shape[0]), r))
    if not rows:
        return Tensor._empty((0, r), x.dtype, x.device)
    idx = _tensor(rows, dtype=_dt.int64, device=x.device)
    return _ix.index_select(x, 0, idx.reshape(-1)).reshape(len(rows), r)


def vander(x, N=None, increasing=False):
    """The Vandermonde matrix of a 1-D tensor: columns x**(N-1) ... x**0 (increasing: the
    reverse), by a cumulative product as torch (integer inputs give int64)."""
    from . import reduction as _red
    from . import shape as _sh
    v = check_tensor(x, "x", "vander")
    if v.ndim != 1:
        raise ValueError(f"vander: x must be a one-dimensional tensor, got shape "
                         f"{tuple(v.shape)}")
    n = v.shape[0] if N is None else _int(N, "N", "vander")
    if n < 0:
        raise ValueError(f"vander: N must be non-negative, got {n}")
    dt = _dt.int64 if v.dtype.kind in "biu" else v.dtype
    if n == 0:
        return Tensor._empty((v.shape[0], 0), dt, v.device)
    ones = Tensor._empty((v.shape[0], 1), dt, v.device).fill_(1)
    if n > 1:
        reps = v.to(dt).unsqueeze(1).expand(v.shape[0], n - 1)
        res = _sh.cat([ones, _red.cumprod(reps, 1)], dim=1)
    else:
        res = ones
    return res if increasing else res.flip(1)


def cov(input, *, correction=1, fweights=None, aweights=None):  # noqa: A002
    """The covariance matrix of the variables in the rows of `input` (observations in the
    columns); a 1-D input is one variable (a 0-D result)."""
    from . import reduction as _red
    x = check_tensor(input, "input", "cov")
    if x.ndim > 2:
        raise ValueError(f"cov(): expected input to have two or fewer dimensions but got an "
                         f"input with {x.ndim} dimensions")
    if fweights is not None or aweights is not None:
        raise NotImplementedError("cov: fweights and aweights are not supported")
    m = x.reshape(1, -1) if x.ndim < 2 else x
    if not m.dtype.is_floating_point:
        m = m.to(_dt.get_default_dtype())
    n = m.shape[1]
    centred = _ew.sub(m, _red.mean(m, 1, keepdim=True))
    c = _ew.div(centred @ centred.transpose(0, 1), builtins.max(n - correction, 0))
    return c.reshape(()) if x.ndim < 2 else c


def corrcoef(input):  # noqa: A002
    """Pearson correlation coefficients of the rows of `input`, clipped to [-1, 1]."""
    c = cov(input)
    if c.ndim == 0:
        return _ew.div(c, c)
    d = diagonal(c)
    s = _ew.sqrt(d)
    return _ew.div(_ew.div(c, s.unsqueeze(1)), s.unsqueeze(0)).clamp(-1, 1)


def _trap_parts(y, x, dx, dim, op):
    yy = check_tensor(y, "y", op)
    d = normalize_dim(dim, yy.ndim, "dim")
    n = yy.shape[d]
    avg = _ew.mul(_ew.add(yy.narrow(d, 1, builtins.max(n - 1, 0)),
                          yy.narrow(d, 0, builtins.max(n - 1, 0))), 0.5)
    if x is not None:
        if dx is not None:
            raise TypeError(f"{op}: pass x or dx, not both")
        xx = check_tensor(x, "x", op)
        if xx.ndim == 1:
            shape = [1] * yy.ndim
            shape[d] = xx.shape[0]
            xx = xx.reshape(shape)
        step = diff(xx, dim=d if xx.ndim == yy.ndim else -1)
        return _ew.mul(avg, step), d
    return _ew.mul(avg, 1.0 if dx is None else dx), d


def trapezoid(y, x=None, *, dx=None, dim=-1):
    """The trapezoidal rule along `dim`, with sample points `x` or spacing `dx` (default 1)."""
    parts, d = _trap_parts(y, x, dx, dim, "trapezoid")
    return parts.sum(d)


trapz = trapezoid


def cumulative_trapezoid(y, x=None, *, dx=None, dim=-1):
    """The running trapezoidal integral along `dim` (one element shorter than y there)."""
    from . import reduction as _red
    parts, d = _trap_parts(y, x, dx, dim, "cumulative_trapezoid")
    return _red.cumsum(parts, d)


def _fill_diagonal_(self, fill_value, wrap=False):
    """Fill the main diagonal in place (all dims equal, or 2-D; a tall matrix with wrap=True
    restarts the diagonal every cols + 1 rows, as torch)."""
    x = check_tensor(self, "self", "fill_diagonal_")
    if x.ndim < 2:
        raise ValueError("fill_diagonal_: dimensions must larger than 1")
    if x.ndim > 2 and len(set(x.shape)) != 1:
        raise ValueError("fill_diagonal_: all dimensions of input must be of equal length")
    if x.ndim > 2:
        n = x.shape[0]
        x._view((n,), (builtins.sum(x.stride()),), x.storage_offset()).fill_(fill_value)
        return x
    rows, cols = x.shape
    start = 0
    while start < rows:
        diagonal(x.narrow(0, start, rows - start)).fill_(fill_value)
        if not wrap:
            break
        start += cols + 1
    return x


def _tensor_diff(self, n=1, dim=-1, prepend=None, append=None):
    return diff(self, n, dim, prepend, append)


_methods.install(diagonal=diagonal, diag=diag, diag_embed=diag_embed,
                 tensor_split=tensor_split, kron=kron,
                 take_along_dim=take_along_dim, diff=_tensor_diff, bincount=bincount,
                 rot90=rot90, hsplit=hsplit, vsplit=vsplit, dsplit=dsplit, trace=trace,
                 cross=cross, histc=histc, fill_diagonal_=_fill_diagonal_)
