"""Order statistics and searches: searchsorted, bucketize, kthvalue, median, nanmedian,
cummax, cummin, argwhere (torch's semantics, NaN included).

Written over the sort, gather, compare and where ops, so every device runs them:
  * searchsorted: a vectorised binary search, ceil(log2(n + 1)) rounds of gather + compare;
  * kthvalue / median / nanmedian: one stable sort (NaN sorts last) and a gather at the rank;
  * cummax / cummin: a log-step (Hillis-Steele) scan of (value, index) pairs.
"""
from __future__ import annotations

import builtins
from collections import namedtuple

from .. import dtypes as _dt
from ..tensor import Tensor, normalize_dim
from . import _methods
from . import elementwise as _ew
from . import indexing as _ix
from . import reduction as _red
from . import shape as _sh
from ._common import check_tensor

__all__ = ["searchsorted", "bucketize", "kthvalue", "median", "nanmedian", "cummax", "cummin",
           "argwhere"]

kthvalue_result = namedtuple("kthvalue", ["values", "indices"])
median_result = namedtuple("median", ["values", "indices"])
nanmedian_result = namedtuple("nanmedian", ["values", "indices"])
cummax_result = namedtuple("cummax", ["values", "indices"])
cummin_result = namedtuple("cummin", ["values", "indices"])


# ------------------------------------------------------------------ searchsorted
def _side(side, right, op):
    if side is None:
        return builtins.bool(right)
    if side not in ("left", "right"):
        raise ValueError(f"{op}: side must be 'left' or 'right', got {side!r}")
    if right and side == "left":
        raise ValueError(f"{op}: side and right can't be set to opposites, got side of left "
                         f"while right was True")
    return side == "right"


def _binary_search(b, v, right: bool) -> Tensor:
    """For each value of v (same leading dims as b, or any shape when b is 1-D), the number of
    entries of b's last dim that sort before it: `< v` (left) or `<= v` (right); NaN values
    sort after every number. int64, v's shape."""
    n = b.shape[-1]
    flat = b.ndim == 1
    vv = v.reshape(-1) if flat else v
    lo = Tensor._empty(vv.shape, _dt.int64, v.device).zero_()
    hi = Tensor._empty(vv.shape, _dt.int64, v.device).fill_(n)
    for _ in range(n.bit_length()):   # each round halves every [lo, hi) range
        mid = _ew.floor_divide(_ew.add(lo, hi), 2)
        bm = _ix.gather(b, b.ndim - 1, _ew.clamp_max(mid, n - 1))
        # torch's comparisons: lower bound moves right unless b[mid] >= v, upper bound unless
        # v < b[mid]; both move right for a NaN value
        go = _ew.logical_not(_ew.lt(vv, bm) if right else _ew.ge(bm, vv))
        active = _ew.lt(lo, hi)
        go = _ew.logical_and(go, active)
        lo = _ew.where(go, _ew.add(mid, 1), lo)
        hi = _ew.where(_ew.logical_and(active, _ew.logical_not(go)), mid, hi)
    return lo.reshape(v.shape)


def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None,  # noqa: A002
                 sorter=None, out=None):
    """Indices where `input`'s values would be inserted into `sorted_sequence` (its last dim)
    to keep it sorted; as torch.searchsorted (int64, or int32 with out_int32)."""
    b = check_tensor(sorted_sequence, "sorted_sequence", "searchsorted")
    r = _side(side, right, "searchsorted")
    if b.ndim == 0:
        raise ValueError("searchsorted: sorted_sequence must have at least one dimension, got "
                         "a 0-D tensor")
    if not isinstance(input, Tensor):
        if b.ndim != 1:
            raise ValueError(f"searchsorted: a scalar input needs a 1-D sorted_sequence, got "
                             f"shape {tuple(b.shape)}")
        from ..creation import tensor as _tensor
        input = _tensor(input, device=b.device)
    v = input
    if v.device != b.device:
        raise ValueError(f"searchsorted: input is on {v.device} but sorted_sequence is on "
                         f"{b.device}")
    if b.ndim > 1 and (v.ndim != b.ndim or tuple(v.shape[:-1]) != tuple(b.shape[:-1])):
        raise ValueError(f"searchsorted: sorted_sequence should be 1-D or its first N-1 dims "
                         f"must match input's, got sorted_sequence {list(b.shape)} and input "
                         f"{list(v.shape)}")
    for t, name in ((b, "sorted_sequence"), (v, "input")):
        if t.dtype is _dt.bool or t.dtype.is_float8:
            raise TypeError(f"searchsorted: {name} has dtype {t.dtype.name}; expected a float "
                            f"or integer dtype")
    if sorter is not None:
        check_tensor(sorter, "sorter", "searchsorted")
        if tuple(sorter.shape) != tuple(b.shape):
            raise ValueError(f"searchsorted: sorter must have the shape of sorted_sequence "
                             f"{list(b.shape)}, got {list(sorter.shape)}")
        if sorter.dtype is not _dt.int64:
            raise TypeError(f"searchsorted: sorter must be int64, got {sorter.dtype.name}")
        b = _ix.gather(b, b.ndim - 1, sorter)
    res = _binary_search(b, v, r)
    if out_int32:
        res = res.to(_dt.int32)
    if out is not None:
        from ._common import check_out
        check_out(out, res.shape, res.dtype, res.device, "searchsorted").copy_(res)
        return out
    return res


def bucketize(input, boundaries, *, out_int32=False, right=False, out=None):  # noqa: A002
    """The bucket of each value of `input` in the 1-D `boundaries` (searchsorted's index)."""
    b = check_tensor(boundaries, "boundaries", "bucketize")
    if b.ndim != 1:
        raise ValueError(f"bucketize: boundaries must be 1-D, got shape {tuple(b.shape)}")
    return searchsorted(b, input, out_int32=out_int32, right=right, out=out)


# ------------------------------------------------------------------ rank statistics
def _rankable(x, op):
    check_tensor(x, "input", op)
    if x.dtype is _dt.bool or x.dtype.is_float8:
        raise TypeError(f"{op}: dtype {x.dtype.name} is not supported (expected a float or "
                        f"integer dtype)")
    return x


def _at_rank(x, d, pos, keepdim, result):
    """Sorted values and indices of x along d at rank `pos` (an int, or an int64 tensor with
    size 1 along d)."""
    s = _red.sort(x, d, stable=True)
    if isinstance(pos, int):
        vals, idx = s.values.narrow(d, pos, 1), s.indices.narrow(d, pos, 1)
        vals, idx = vals.contiguous(), idx.contiguous()
    else:
        vals, idx = _ix.gather(s.values, d, pos), _ix.gather(s.indices, d, pos)
    if not keepdim:
        vals, idx = vals.squeeze(d), idx.squeeze(d)
    return result(vals, idx)


def _dim_of(x, dim, op):
    if x.ndim == 0:
        if dim not in (0, -1):
            raise IndexError(f"{op}: dim {dim} is out of range for a 0-D tensor")
        return None
    d = normalize_dim(dim, x.ndim, "dim")
    if x.shape[d] == 0:
        raise IndexError(f"{op}: expected reduction dim {d} to have non-zero size")
    return d


def kthvalue(input, k, dim=-1, keepdim=False, *, out=None):  # noqa: A002
    """The k-th smallest value along `dim` (k from 1) and its index; NaN counts as the largest.
    Among equal values the lowest index is returned."""
    x = _rankable(input, "kthvalue")
    if isinstance(k, builtins.bool) or not isinstance(k, int):
        raise TypeError(f"kthvalue: k must be an int, got {k!r}")
    d = _dim_of(x, dim, "kthvalue")
    n = 1 if d is None else x.shape[d]
    if not 1 <= k <= n:
        raise IndexError(f"kthvalue: k ({k}) is out of range for dimension {dim} of size {n}")
    if d is None:
        return kthvalue_result(x.clone(), Tensor._empty((), _dt.int64, x.device).zero_())
    return _finish_pair(_at_rank(x, d, k - 1, keepdim, kthvalue_result), out, "kthvalue")


def _finish_pair(res, out, op):
    if out is None:
        return res
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"{op}: out must be a (values, indices) pair of tensors")
    from ._common import check_out
    for o, r, nm in zip(out, res, ("out[0]", "out[1]")):
        check_out(o, r.shape, r.dtype, r.device, f"{op} {nm}").copy_(r)
    return type(res)(*out)


def _median(x, dim, keepdim, out, op, skip_nan):
    x = _rankable(x, op)
    result = median_result if not skip_nan else nanmedian_result
    if dim is None:
        flat = x.reshape(-1)
        if flat.numel() == 0:
            if not x.dtype.is_floating_point:
                raise IndexError(f"{op}: an empty {x.dtype.name} tensor has no median")
            return Tensor._empty((), x.dtype, x.device).fill_(float("nan"))
        return _median(flat, 0, False, None, op, skip_nan).values
    d = _dim_of(x, dim, op)
    if d is None:
        return _finish_pair(result(x.clone(), Tensor._empty((), _dt.int64, x.device).zero_()),
                            out, op)
    n = x.shape[d]
    if not x.dtype.is_floating_point:
        pos = (n - 1) // 2
    else:
        # NaN sorts last: `valid` numbers come first in every sorted row
        valid = _red.sum(_ew.logical_not(_ew.isnan(x)), d, keepdim=True)
        if skip_nan:
            pos = _ew.clamp_min(_ew.floor_divide(_ew.sub(valid, 1), 2), 0)
        else:   # a row with NaN has the median NaN, at the first NaN's index (torch)
            pos = _ew.where(_ew.lt(valid, n), valid, (n - 1) // 2)
    return _finish_pair(_at_rank(x, d, pos, keepdim, result), out, op)


def median(input, dim=None, keepdim=False, *, out=None):  # noqa: A002
    """The lower median (of an even count, the smaller middle value), as torch: of all elements
    (a 0-D tensor), or along `dim` with the index. A NaN makes the median NaN."""
    return _median(input, dim, keepdim, out, "median", False)


def nanmedian(input, dim=None, keepdim=False, *, out=None):  # noqa: A002
    """median ignoring NaN: the lower median of the numbers; NaN only where all are NaN."""
    return _median(input, dim, keepdim, out, "nanmedian", True)


# ------------------------------------------------------------------ cumulative max / min
def _cumext(input, dim, op, take_later, result):
    x = check_tensor(input, "input", op)
    if x.dtype.is_float8:
        raise TypeError(f"{op}: float8 inputs are not supported ({x.dtype.name}); cast first")
    if x.ndim == 0:
        _dim_of(x, dim, op)
        return result(x.clone(), Tensor._empty((), _dt.int64, x.device).zero_())
    d = normalize_dim(dim, x.ndim, "dim")
    n = x.shape[d]
    from ..creation import arange
    shape = [1] * x.ndim
    shape[d] = n
    vals = x.contiguous()
    idx = arange(n, device=x.device).reshape(shape).expand(x.shape).contiguous()
    isf = x.dtype.is_floating_point
    s = 1
    while s < n:
        lv, li = vals.narrow(d, 0, n - s), idx.narrow(d, 0, n - s)
        rv, ri = vals.narrow(d, s, n - s), idx.narrow(d, s, n - s)
        # the later element wins ties; a NaN beats every number and the later NaN wins
        take = take_later(rv, lv)
        if isf:
            take = _ew.logical_or(_ew.isnan(rv),
                                  _ew.logical_and(_ew.logical_not(_ew.isnan(lv)), take))
        vals = _sh.cat([vals.narrow(d, 0, s), _ew.where(take, rv, lv)], d)
        idx = _sh.cat([idx.narrow(d, 0, s), _ew.where(take, ri, li)], d)
        s *= 2
    return result(vals, idx)


def cummax(input, dim):  # noqa: A002
    """Running maximum along `dim` and the index where it was reached (the latest one among
    equal values; NaN propagates, with the latest NaN's index)."""
    return _cumext(input, dim, "cummax", _ew.ge, cummax_result)


def cummin(input, dim):  # noqa: A002
    """Running minimum along `dim` and its index (as cummax)."""
    return _cumext(input, dim, "cummin", _ew.le, cummin_result)


def argwhere(input):  # noqa: A002
    """Indices of the non-zero elements, (n, ndim) int64 (torch.nonzero(input))."""
    return _red.nonzero(check_tensor(input, "input", "argwhere"))


_methods.install(kthvalue=kthvalue, median=median, nanmedian=nanmedian, cummax=cummax,
                 cummin=cummin, argwhere=argwhere)
