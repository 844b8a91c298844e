"""Order statistics and searches: searchsorted, bucketize, kthvalue, median, nanmedian,
cummax, cummin, logcumsumexp, argwhere (torch's semantics, NaN included).

Written over the sort, gather, compare and where ops, so every device runs them:
  * searchsorted: a vectorised binary search, ceil(log2(n + 1)) rounds of gather + compare;
  * kthvalue / median / nanmedian: one stable sort (NaN sorts last) and a gather at the rank;
  * cummax / cummin: a log-step (Hillis-Steele) scan of (value, index) pairs;
  * logcumsumexp: its own scan (dispatched: NumPy's logaddexp.accumulate on cpu, a Triton
    log-add-exp scan, kernels/scan.py, on cuda and interp).
"""
from __future__ import annotations

import builtins
from collections import namedtuple

from .. import dtypes as _dt
from ..dispatch import impl
from ..tensor import Tensor, normalize_dim
from . import _methods
from . import elementwise as _ew
from . import indexing as _ix
from . import reduction as _red
from . import shape as _sh
from ._common import check_tensor

__all__ = ["searchsorted", "bucketize", "kthvalue", "median", "nanmedian", "cummax", "cummin",
           "logcumsumexp", "argwhere", "unique_consecutive", "msort", "quantile", "nanquantile"]

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


def logcumsumexp(input, dim, *, out=None):  # noqa: A002
    """log(cumsum(exp(input), dim)) computed stably (a running log-add-exp): -inf is the
    identity, +inf absorbs everything but NaN, NaN propagates. Floating inputs only (torch
    refuses integers and bool too); the result keeps the input's dtype, fp16/bf16 computed in
    float32."""
    x = check_tensor(input, "input", "logcumsumexp")
    if not x.dtype.is_floating_point or x.dtype.is_float8:
        raise TypeError(f"logcumsumexp: input must be float16, bfloat16, float32 or float64, "
                        f"got {x.dtype.name}")
    if dim is None or isinstance(dim, builtins.bool) or not isinstance(dim, int):
        raise TypeError(f"logcumsumexp: dim must be an int, got {dim!r}")
    d = normalize_dim(dim, x.ndim, "dim") if x.ndim else normalize_dim(dim, 1, "dim")
    res = Tensor._empty(x.shape, x.dtype, x.device)
    if res.numel():
        impl("logcumsumexp", x.device)(x, d, res)
    if out is not None:
        return _red._finish(res, x.shape, out, "logcumsumexp")
    return res


def argwhere(input):  # noqa: A002
    """Indices of the non-zero elements, (n, ndim) int64 (torch.nonzero(input))."""
    return _red.nonzero(check_tensor(input, "input", "argwhere"))


def unique_consecutive(input, return_inverse=False, return_counts=False, dim=None):  # noqa: A002
    """Each run of equal consecutive elements (dim=None: of the flattened input) or slices
    along `dim` kept once; optionally the inverse (run number of each element) and the run
    lengths. NaN equals nothing, so each NaN is its own run, as torch. Syncs with the host
    once (the number of runs sizes the output)."""
    x = check_tensor(input, "input", "unique_consecutive")
    if dim is None:
        flat, d = x.reshape(-1), 0
    else:
        flat, d = x, normalize_dim(dim, x.ndim, "dim")
    n = flat.shape[d]
    dev = x.device
    start = Tensor._empty((n,), _dt.bool, dev)
    if n:
        start[:1] = True
        if n > 1:
            ne = _ew.ne(flat.narrow(d, 1, n - 1), flat.narrow(d, 0, n - 1))
            if flat.ndim > 1:
                ne = ne.movedim(d, 0).reshape(n - 1, -1).any(1)
            start[1:] = ne
    pos = _red.nonzero(start).reshape(-1)
    vals = _ix.index_select(flat, d, pos)
    res = [vals]
    if return_inverse:
        inv = _red.cumsum(start.long(), 0) - 1
        res.append(inv.view(x.shape) if dim is None else inv)
    if return_counts:
        ends = _sh.cat([pos[1:], Tensor._empty((1,), _dt.int64, dev).fill_(n)]) if n else pos
        res.append(ends - pos)
    return tuple(res) if len(res) > 1 else vals


def _quantile(input, q, dim, keepdim, interpolation, op, ignore_nan):
    """torch.quantile: sort along dim (NaN last), then interpolate between the ranks
    q * (n - 1) (n: the non-NaN count for nanquantile); a NaN in a row gives NaN (quantile)."""
    from ..creation import tensor as _tensor
    x = check_tensor(input, "input", op)
    if x.dtype not in (_dt.float32, _dt.float64):
        raise TypeError(f"{op}() input tensor must be either float or double dtype, got "
                        f"{x.dtype.name}")
    if interpolation not in ("linear", "lower", "higher", "midpoint", "nearest"):
        raise ValueError(f"{op}() interpolation must be one of linear, lower, higher, midpoint "
                         f"or nearest. Got {interpolation}")
    scalar_q = not isinstance(q, Tensor)
    qt = _tensor(float(q), dtype=x.dtype, device=x.device) if scalar_q else q
    if qt.ndim > 1:
        raise ValueError(f"{op}() q must be a scalar or 1D tensor, got shape {tuple(qt.shape)}")
    if qt.dtype is not x.dtype:
        raise TypeError(f"{op}() q tensor must be same dtype as the input tensor, got "
                        f"{qt.dtype.name} and {x.dtype.name}")
    qv = qt.cpu().numpy().reshape(-1)
    if ((qv < 0) | (qv > 1)).any():
        raise ValueError(f"{op}() q values must be in the range [0, 1]")
    if dim is None:
        src, d = x.reshape(-1), 0
    else:
        src, d = x, normalize_dim(dim, x.ndim, "dim")
    n = src.shape[d]
    if n == 0:
        raise IndexError(f"{op}() input tensor must be non-empty")
    srt = _red.sort(src, dim=d).values.movedim(d, -1)          # NaN sorts last
    nan = _ew.isnan(srt)
    if ignore_nan:
        count = _ew.logical_not(nan).sum(-1, keepdim=True).to(x.dtype)
    else:
        count = Tensor._empty(tuple(srt.shape[:-1]) + (1,), x.dtype, x.device).fill_(n)
    outs = []
    for qi in qv.tolist():
        rank = _ew.mul(_ew.sub(count, 1.0).clamp(min=0.0), qi)
        lo = rank.floor()
        hi = rank.ceil()
        if interpolation == "lower":
            hi = lo
        elif interpolation == "higher":
            lo = hi
        elif interpolation == "nearest":
            lo = hi = rank.round()
        li, hi_i = lo.long(), hi.long()
        a = _ix.gather(srt, -1, li)
        b = _ix.gather(srt, -1, hi_i)
        if interpolation == "midpoint":
            w = _ew.where(_ew.eq(li, hi_i), 0.0, 0.5).to(x.dtype)
        elif interpolation == "linear":
            w = _ew.sub(rank, lo)
        else:
            w = None
        v = a if w is None else _ew.add(a, _ew.mul(_ew.sub(b, a), w))
        if ignore_nan:
            v = _ew.where(_ew.eq(count, 0.0), float("nan"), v)
        else:
            v = _ew.where(nan.any(-1, keepdim=True), float("nan"), v)
        v = v.squeeze(-1)
        if keepdim:
            if dim is None:
                v = v.reshape((1,) * x.ndim)
            else:
                v = v.unsqueeze(d)
        outs.append(v)
    if scalar_q or qt.ndim == 0:
        return outs[0]
    return _sh.stack(outs, 0)


def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear", out=None):  # noqa: A002
    """The q-th quantiles along dim (None: of the flattened input), torch's interpolation
    modes; a row holding NaN gives NaN."""
    v = _quantile(input, q, dim, keepdim, interpolation, "quantile", False)
    return v if out is None else out.copy_(v)


def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear", out=None):  # noqa: A002
    """quantile ignoring NaN (a row of only NaN gives NaN)."""
    v = _quantile(input, q, dim, keepdim, interpolation, "nanquantile", True)
    return v if out is None else out.copy_(v)


def msort(input, *, out=None):  # noqa: A002
    """`input` sorted along dim 0 (the values of sort(input, dim=0))."""
    v = _red.sort(check_tensor(input, "input", "msort"), dim=0).values
    if out is not None:
        return out.copy_(v)
    return v


_methods.install(kthvalue=kthvalue, median=median, nanmedian=nanmedian, cummax=cummax,
                 cummin=cummin, logcumsumexp=logcumsumexp, argwhere=argwhere, unique_consecutive=unique_consecutive,
                 msort=msort, quantile=quantile, nanquantile=nanquantile)
