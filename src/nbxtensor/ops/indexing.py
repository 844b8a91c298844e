"""Indexing ops: gather/scatter, index_*, masked_*, take, embedding, advanced indexing.

Every op here is reduced to four primitives, implemented by NumPy (cpu) and Triton
(cuda, interp):

  index_gather(out, src, idx, sdim, lo, hi, wrap, err)
      out[c] = src[off(c) + wrap(idx[c]) * sdim] over the iteration shape out.shape;
      src and idx are views of that shape (stride 0 where they do not vary).
  index_scatter(dst, src, idx, ddim, lo, hi, wrap, mode, err, value=, alpha=)
      dst[off(c) + wrap(idx[c]) * ddim] (store|add|amax|amin|prod)= src[c] or value.
  index_linearize(acc, idx, stride, lo, hi, wrap, init, err)
      acc (=|+=) wrap(idx) * stride: several advanced indices -> one element offset.
  masked_fill(out, x, mask, value)

Each primitive checks `lo <= idx < hi` and raises IndexError naming the op, the bad
value and the valid range (`err` = (op, what, lo, hi)): at the op on cpu and interp, at
the next synchronising call on cuda (see set_index_check). Bool masks become indices on
the host (as torch, this synchronises on cuda: the result's size depends on the data).
"""
from __future__ import annotations

import contextlib
import math
from .. import config as _config

import numpy as np

from .. import dtypes as _dt
from .. import plans as _plans
from ..dispatch import impl
from ..index_errors import CHECK_MODE as _CHECK_MODE, CHECK_MODES as _CHECK_MODES
from ..index_errors import DEFER as _DEFER, read_flags as _read_flags
from ..tensor import Tensor, broadcast_shapes, new_contiguous, normalize_dim
from . import _methods
from ._common import check_tensor, out_overlaps

__all__ = ["gather", "scatter", "scatter_add", "scatter_reduce", "index_select", "index_add",
           "index_copy", "index_fill", "index_put", "masked_fill", "masked_select",
           "masked_scatter", "take", "embedding"]

_BIG = 1 << 62  # a bound that no already-checked element offset reaches (a linearised offset
#                 of a bad index is kernels.indexing.BAD_OFFSET, below -_BIG: masked, not used)
# cuda: 'async' reads the out-of-range flag at the next synchronising call, 'sync' after
# every op (a device->host read each time; for debugging, as CUDA_LAUNCH_BLOCKING). The
# state is index_errors' (shared with the kernels that read the flags).
_CHECK_MODE[0] = _config.get("NBX_INDEX_CHECK")


def set_index_check(mode: str) -> str:
    """When cuda ops report out-of-range indices; returns the previous mode.

    'async' (default): the kernels mask bad indices (no memory outside the tensors is read or
    written) and record the first one in a per-device flag; the flag is read at the next
    call that synchronises anyway (Tensor.item/numpy/tolist/to('cpu'), nbx.cuda.synchronize,
    Stream/Event.synchronize), which raises IndexError naming the op and the bad index.
    'sync': the flag is read after every indexing op (one device->host copy, a sync), so the
    error is raised by the op itself. Also set by the environment variable NBX_INDEX_CHECK.
    cpu and interp always raise at the op.
    """
    if mode not in _CHECK_MODES:
        raise ValueError(f"set_index_check: mode must be one of {_CHECK_MODES}, got {mode!r}")
    prev = _CHECK_MODE[0]
    check_index_errors()   # errors of the old mode are not carried into the new one silently
    _CHECK_MODE[0] = mode
    return prev


def check_index_errors() -> None:
    """Read the cuda out-of-range flags now (a sync) and raise IndexError for a bad index."""
    if not _DEFER[0]:
        _read_flags()


@contextlib.contextmanager
def deferred_index_checks():
    """Read the out-of-range flags only once, on exit from this block.

    Outside it, the flag is read at the op (interp; cuda in 'sync' mode) or at the next
    synchronising call (cuda, 'async'). Inside it neither happens: the kernels still mask
    bad indices (no memory is touched out of bounds) and record them in the sticky flag;
    the flag is read once on exit, raising IndexError if any op saw a bad index. Use it
    around CUDA-graph capture/replay or a decode loop. cpu ops still raise at once.
    """
    _DEFER[0] += 1
    try:
        yield
    finally:
        _DEFER[0] -= 1
        if not _DEFER[0]:
            _read_flags()


# ---------------------------------------------------------------------------- helpers
from ..index_errors import oob_error as _oob_error  # noqa: E402,F401 - one formatter for every layer


def _check_index(index, argname, op, device):
    check_tensor(index, argname, op)
    if index._dtype is not _dt.int64 and index._dtype is not _dt.int32:
        raise TypeError(f"{op}: {argname} must be an int64 or int32 tensor, got {index.dtype.name}")
    if index._storage.device is not device and index.device != device:
        raise ValueError(f"{op}: {argname} is on {index.device}, but the input is on {device}")
    return index


def _index_fits(input, dim, index, op):  # noqa: A002
    """gather's and scatter's rule: index has input's dims (0-dim and 1-D mix) and no larger
    size than input's outside `dim`; the normalised dim."""
    d = normalize_dim(dim, input.ndim)
    if index.ndim != input.ndim and not (index.ndim <= 1 and input.ndim <= 1):
        raise ValueError(f"{op}: index must have as many dims as input ({input.ndim}), got shape "
                         f"{tuple(index.shape)}")
    for k in range(index.ndim):
        if k != d and index.shape[k] > input.shape[k]:
            raise ValueError(f"{op}: index.size({k}) = {index.shape[k]} exceeds input.size({k}) = "
                             f"{input.shape[k]} (shapes {tuple(index.shape)}, "
                             f"{tuple(input.shape)})")
    return d


def _check_out(out, shape, dtype, device, op):
    check_tensor(out, "out", op)
    if tuple(out.shape) != tuple(shape) or out.dtype is not dtype or out.device != device:
        raise ValueError(f"{op}: out must have shape {tuple(shape)}, dtype {dtype.name} and device "
                         f"{device}; got shape {tuple(out.shape)}, dtype {out.dtype.name}, device "
                         f"{out.device}")
    return out


def _cast_scalar(value, dtype, op, argname="value"):
    """A Python number or 0-dim tensor as a Python scalar exactly representable in `dtype`."""
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise ValueError(f"{op}: {argname} must be a number or a 0-dim tensor, got a tensor "
                             f"of shape {tuple(value.shape)}")
        value = value.item()
    value = _dt.check_scalar(value, dtype, op, argname)
    if dtype.kind != "f":
        return value
    with np.errstate(all="ignore"):
        v = float(_dt.cast(float(value), dtype).astype(np.float64))
    if math.isfinite(value) and not math.isfinite(v):
        raise OverflowError(f"{op}: {argname} {value} cannot be converted to {dtype.name} without "
                            f"overflow")
    return v


def _run(name, device, *args, **kwargs):
    impl(name, device)(*args, **kwargs)


def _along(t, dim, shape) -> Tensor:
    """A view of `t` over `shape` that does not move along `dim` (the index supplies it)."""
    stride = list(t.stride())
    if t.ndim:
        stride[dim] = 0
    return Tensor._make(t._storage, shape, stride, t._offset, t.dtype)


def _with(t, shape, strides) -> Tensor:
    return Tensor._make(t._storage, shape, strides, t._offset, t.dtype)


def _contig(t) -> Tensor:
    """A contiguous copy made by the gather primitive (no dependency on other families)."""
    if t.is_contiguous():
        return t
    out = Tensor._empty(t.shape, t.dtype, t.device)
    if out.numel():
        _run("index_gather", t.device, out, t, None, 0, 0, 0, False, None)
    return out


def _clone_into(out, src):
    if out.numel():
        _run("index_gather", src.device, out, src, None, 0, 0, 0, False, None)
    return out


def _to_host(t) -> np.ndarray:
    if t.device.is_host:
        return t._host_view()
    return _contig(t).numpy()


def _from_host(a: np.ndarray, device) -> Tensor:
    from ..creation import tensor
    return tensor(np.ascontiguousarray(a), device=device)


def _gather(out, src, idx, sdim, lo, hi, wrap, err):
    if out.numel():
        _run("index_gather", out.device, out, src, idx, sdim, lo, hi, wrap, err)
    return out


def _scatter(dst, src, idx, ddim, lo, hi, wrap, mode, err, value=None, alpha=None):
    if idx.numel():
        _run("index_scatter", dst.device, dst, src, idx, ddim, lo, hi, wrap, mode, err,
             value=value, alpha=alpha)
    return dst


def _fill(t, value):
    """t[...] = value through the masked_fill primitive (a 0-dim True mask, broadcast)."""
    if t.numel():
        mask = _from_host(np.ones((), np.bool_), t.device)
        _run("masked_fill", t.device, t, t, _with(mask, t.shape, (0,) * t.ndim), value)
    return t


def _dim_info(t, d):
    """(size, stride) of dim d; a 0-dim tensor behaves as one of size 1."""
    return (t.shape[d], t.stride(d)) if t.ndim else (1, 0)


# ---------------------------------------------------------------------------- gather family
# Fast path of gather / index_select / embedding: after the full path has accepted a call,
# its plan (result shape, the two views' strides, the index bounds and the error text) is
# cached under everything it depends on (op, dim, dtypes, shapes, strides, device). A later
# call with the same key checks only the classes and the device, allocates and dispatches.
# On cuda the plan holds a launch prepared for the first call's output, so the full path
# records it (a PlanCache) rather than a pure inference computing it.
_FAST = _plans.PlanCache("ops.indexing.gather", 4096)


def _plan_key(op, dim, src, index, dev):
    # keyed by the device itself, not its type: a prepared cuda launch holds that device's
    # index-error flag
    return (op, dim, src._dtype, src._shape, src._stride, index._dtype, index._shape,
            index._stride, dev)


def _planned_or_checked(op, dim, src, src_name, index, index_name, fast):
    """The result of op(src, dim, index) through its cached plan when `fast` and there is one;
    otherwise None, after checking that src is a tensor and index an integer tensor on its
    device (the full path then runs, raises or caches its plan through _remember)."""
    if fast:
        dev = src._storage.device
        db = index._storage.device
        p = _FAST.get(_plan_key(op, dim, src, index, dev)) if dev is db or dev == db else None
        if p is not None:
            run = p[6]
            if run is not None:     # cuda: the launch is prepared; the views only carried strides
                out = new_contiguous(p[0], p[7], src._dtype, dev, p[8])
                run(out, src, index)
                return out
            return _fast_gather(p, src, index, dev)
    check_tensor(src, src_name, op)
    _check_index(index, index_name, op, src.device)
    return None


def _fast_gather(p, src, index, dev):
    shape, sstr, istr, sdim, hi, err = p[:6]
    out = new_contiguous(shape, p[7], src._dtype, dev, p[8])
    if 0 not in shape:
        impl("index_gather", dev)(out, Tensor._make(src._storage, shape, sstr, src._offset,
                                                    src._dtype),
                                  Tensor._make(index._storage, shape, istr, index._offset,
                                               index._dtype), sdim, 0, hi, False, err)
    return out


def _remember(op, dim, src, index, out, sv, iv, sdim, hi, err):
    """Cache the plan of op(src, dim, index), a call the full path accepted (so src and index
    share a device); `sv`/`iv` are views of the source and index with their storage offsets
    (what the prepared cuda launch relies on)."""
    run = None
    dev = out._storage.device
    key = _plan_key(op, dim, src, index, src._storage.device)
    if out.numel() and dev.type == "cuda":
        prepare = getattr(impl("index_gather", dev), "prepared", None)
        if prepare is not None:
            run = prepare(out, sv, iv, sdim, 0, hi, False, err)
    _FAST.put(key, (out._shape, sv._stride, iv._stride, sdim, hi, err, run, out._stride,
                    out.numel() * out._dtype.itemsize))


def gather(input, dim, index, *, sparse_grad=False, out=None):  # noqa: A002
    """out[i][j][k] = input[index[i][j][k]][j][k] (for dim=0); index values in [0, size)."""
    fast = out is None and input.__class__ is Tensor and index.__class__ is Tensor \
        and dim.__class__ is int
    r = _planned_or_checked("gather", dim, input, "input", index, "index", fast)
    if r is not None:
        return r
    op = "gather"
    d = _index_fits(input, dim, index, op)
    if out is None:
        out = Tensor._empty(index.shape, input.dtype, input.device)
    else:
        _check_out(out, index.shape, input.dtype, input.device, op)
        if out_overlaps(out, input, index):     # the kernel reads them while it writes
            return out.copy_(gather(input, d, index))
    n, st = _dim_info(input, d)
    # 0-dim and 1-D mix as torch allows: the 0-dim side has one element
    src = _along(input, d, index.shape) if input.ndim == index.ndim else \
        _with(input, index.shape, (0,) * index.ndim)
    err = (op, f"dim {d} of size {n}", 0, n)
    if fast:
        _remember(op, dim, input, index, out, src, index, st, n, err)
    return _gather(out, src, index, st, 0, n, False, err)


def index_select(input, dim, index, *, out=None):  # noqa: A002
    """input's slices at `index` (1-D, values in [0, size)) along `dim`."""
    fast = out is None and input.__class__ is Tensor and index.__class__ is Tensor \
        and dim.__class__ is int
    r = _planned_or_checked("index_select", dim, input, "input", index, "index", fast)
    if r is not None:
        return r
    if index.ndim > 1:
        raise ValueError(f"index_select: index must be 0-dim or 1-D, got shape "
                         f"{tuple(index.shape)}")
    op = "index_select"
    d = normalize_dim(dim, input.ndim)
    m = index.numel()
    shape = list(input.shape) if input.ndim else []
    if input.ndim:
        shape[d] = m
    elif m != 1:
        shape = [m]
    if out is None:
        out = Tensor._empty(shape, input.dtype, input.device)
    else:
        _check_out(out, shape, input.dtype, input.device, op)
        if out_overlaps(out, input, index):
            return out.copy_(index_select(input, d, index))
    n, st = _dim_info(input, d)
    istr = [0] * len(shape)
    if shape:
        istr[d] = index.stride(0) if index.ndim else 0
    src = input if input.ndim else _with(input, (1,) * len(shape), (0,) * len(shape))
    sv, iv = _along(src, d, shape), _with(index, shape, istr)
    err = (op, f"dim {d} of size {n}", 0, n)
    if fast and src is input:
        _remember(op, dim, input, index, out, sv, iv, st, n, err)
    return _gather(out, sv, iv, st, 0, n, False, err)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,  # noqa: A002
              scale_grad_by_freq=False, sparse=False):
    """weight's rows at `input` (int64/int32, any shape): shape input.shape + (dim,).

    padding_idx only affects gradients in torch; it is validated and otherwise ignored.
    """
    fast = input.__class__ is Tensor and weight.__class__ is Tensor and max_norm is None \
        and padding_idx is None
    op = "embedding"
    r = _planned_or_checked(op, None, weight, "weight", input, "input", fast)
    if r is not None:
        return r
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), got "
                         f"shape {tuple(weight.shape)}")
    if max_norm is not None:
        raise NotImplementedError("embedding: max_norm (renormalising weight in place) is not "
                                  "supported")
    v, h = weight.shape
    if padding_idx is not None:
        if not isinstance(padding_idx, int) or not -v <= padding_idx < v:
            raise ValueError(f"embedding: padding_idx must be an int in [{-v}, {v - 1}], got "
                             f"{padding_idx!r}")
    shape = input._shape + (h,)
    out = Tensor._empty(shape, weight.dtype, weight.device)
    idx = _with(input, shape, input._stride + (0,))
    src = _with(weight, shape, (0,) * len(input._shape) + (weight._stride[1],))
    err = (op, f"a weight of {v} rows", 0, v)
    if fast:
        _remember(op, None, weight, input, out, src, idx, weight._stride[0], v, err)
    return _gather(out, src, idx, weight._stride[0], 0, v, False, err)


def take(input, index, *, out=None):  # noqa: A002
    """input viewed as 1-D, at `index` (any shape); negative indices count from the end."""
    op = "take"
    check_tensor(input, "input", op)
    _check_index(index, "index", op, input.device)
    if out is None:
        out = Tensor._empty(index.shape, input.dtype, input.device)
    else:
        _check_out(out, index.shape, input.dtype, input.device, op)
        if out_overlaps(out, input, index):
            return out.copy_(take(input, index))
    src = _contig(input)
    n = src.numel()
    return _gather(out, _with(src, index.shape, (0,) * index.ndim), index, 1, -n, n, True,
                   (op, f"an input of {n} elements", -n, n))


# ---------------------------------------------------------------------------- scatter family
_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def _identity(reduce, dtype):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype.kind == "f":
        return -math.inf if reduce == "amax" else math.inf
    if dtype.kind == "b":
        return reduce == "amin"
    info = np.iinfo(dtype.np)
    return int(info.min) if reduce == "amax" else int(info.max)


def _check_like_input(src, argname, input, op):  # noqa: A002
    """A scatter's values tensor: on input's device, with input's dtype."""
    if src.device != input.device:
        raise ValueError(f"{op}: {argname} is on {src.device}, but input is on {input.device}")
    if src.dtype is not input.dtype:
        raise TypeError(f"{op}: {argname} must have input's dtype {input.dtype.name}, got "
                        f"{src.dtype.name}")


def _scatter_target(input, index, src, out, inplace, op):  # noqa: A002
    """The tensor a scatter writes into: input itself in place; else a copy of input, in `out`
    unless out shares memory with an operand (then a temporary, copied into out at the end)."""
    if inplace:
        return input
    if out is not None:
        _check_out(out, input.shape, input.dtype, input.device, op)
    if out is None or out_overlaps(out, input, index, src):
        return _clone_into(Tensor._empty(input.shape, input.dtype, input.device), input)
    return _clone_into(out, input)


def _scatter_common(input, dim, index, src, op, out, inplace):
    check_tensor(input, "input", op)
    _check_index(index, "index", op, input.device)
    d = _index_fits(input, dim, index, op)
    if isinstance(src, Tensor):
        _check_like_input(src, "src", input, op)
        if src.ndim != index.ndim and not (src.ndim <= 1 and index.ndim <= 1):
            raise ValueError(f"{op}: src must have as many dims as index ({index.ndim}), got shape "
                             f"{tuple(src.shape)}")
        for k in range(index.ndim if src.ndim == index.ndim else 0):
            if index.shape[k] > src.shape[k]:
                raise ValueError(f"{op}: index.size({k}) = {index.shape[k]} exceeds src.size({k}) "
                                 f"= {src.shape[k]}")
    res = _scatter_target(input, index, src if isinstance(src, Tensor) else None, out, inplace,
                          op)
    n, st = _dim_info(res, d)
    base = res if res.ndim == index.ndim else _with(res, index.shape, (0,) * index.ndim)
    dst = _along(base, d, index.shape)
    sv = None
    if isinstance(src, Tensor):
        sv = _with(src, index.shape, src.stride() if src.ndim == index.ndim
                   else (0,) * index.ndim)
        if sv._storage is res._storage:  # reading what the scatter writes: copy first
            sv = _clone_into(Tensor._empty(index.shape, src.dtype, src.device), sv)
    return res, dst, sv, st, n, d


def _scatter_impl(input, dim, index, src, reduce, include_self, op, out=None, inplace=False):
    res = _scatter_run(input, dim, index, src, reduce, include_self, op, out, inplace)
    return res if out is None or res is out else out.copy_(res)


def _scatter_run(input, dim, index, src, reduce, include_self, op, out, inplace):
    res, dst, sv, st, n, d = _scatter_common(input, dim, index, src, op, out, inplace)
    err = (op, f"dim {d} of size {n}", 0, n)
    value = None if sv is not None else _cast_scalar(src, res.dtype, op, "value")
    if reduce is None:
        _scatter(dst, sv, index, st, 0, n, False, "store", err, value=value)
        return res
    if not include_self:
        _scatter(dst, None, index, st, 0, n, False, "store", err,
                 value=_cast_scalar(_identity(reduce, res.dtype), res.dtype, op))
    mode = {"sum": "add", "mean": "add", "prod": "prod", "amax": "amax", "amin": "amin"}[reduce]
    _scatter(dst, sv, index, st, 0, n, False, mode, err, value=value)
    if reduce == "mean":
        count = _fill(Tensor._empty(res.shape, _dt.int64, res.device), 1 if include_self else 0)
        cbase = count if count.ndim == index.ndim else _with(count, index.shape,
                                                             (0,) * index.ndim)
        cst = _dim_info(count, d)[1]
        _scatter(_along(cbase, d, index.shape), None, index, cst, 0, n, False, "add", err, value=1)
        if res.numel():
            _run("scatter_mean_finish", res.device, res, count)
    return res


def scatter(input, dim, index, src=None, *, value=None, reduce=None, out=None):  # noqa: A002
    """A copy of input with src (tensor or number) written at index along dim.

    reduce: None, 'add'/'multiply' (torch's scatter) or 'sum'/'prod'/'mean'/'amax'/'amin'
    (as scatter_reduce with include_self=True).
    """
    return _scatter_dispatch(input, dim, index, src, value, reduce, out, False)


def _scatter_dispatch(input, dim, index, src, value, reduce, out, inplace):  # noqa: A002
    op = "scatter_" if inplace else "scatter"
    if src is None and value is None:
        raise TypeError(f"{op}: give src (a tensor or number) or value")
    if src is not None and value is not None:
        raise TypeError(f"{op}: give src or value, not both")
    src = value if src is None else src
    r = {"add": "sum", "multiply": "prod"}.get(reduce, reduce)
    if r is not None and r not in _REDUCES:
        raise ValueError(f"{op}: reduce must be one of 'add', 'multiply', "
                         f"{', '.join(map(repr, _REDUCES))}, got {reduce!r}")
    return _scatter_impl(input, dim, index, src, r, True, op, out, inplace)


def scatter_add(input, dim, index, src, *, out=None):  # noqa: A002
    """A copy of input with src added at index along dim (duplicates accumulate)."""
    check_tensor(src, "src", "scatter_add")
    return _scatter_impl(input, dim, index, src, "sum", True, "scatter_add", out)


def scatter_reduce(input, dim, index, src, reduce, *, include_self=True, out=None):  # noqa: A002
    """A copy of input with src reduced in at index along dim ('sum', 'prod', 'mean', 'amax',
    'amin'); include_self=False leaves input's values out of the reduction where indexed."""
    op = "scatter_reduce"
    check_tensor(src, "src", op)
    if reduce not in _REDUCES:
        raise ValueError(f"{op}: reduce must be one of {', '.join(map(repr, _REDUCES))}, got "
                         f"{reduce!r}")
    return _scatter_impl(input, dim, index, src, reduce, include_self, op, out)


def _index_dim_common(input, dim, index, op):
    check_tensor(input, "input", op)
    _check_index(index, "index", op, input.device)
    if index.ndim > 1:
        raise ValueError(f"{op}: index must be 0-dim or 1-D, got shape {tuple(index.shape)}")
    d = normalize_dim(dim, input.ndim)
    shape = list(input.shape) if input.ndim else [1]
    shape[d] = index.numel()
    return d, shape


def _index_scatter_op(input, dim, index, source, op, mode, out, inplace, alpha=None, value=None):
    d, shape = _index_dim_common(input, dim, index, op)
    if source is not None:
        check_tensor(source, "source", op)
        _check_like_input(source, "source", input, op)
        if tuple(source.shape) != tuple(shape) and not (input.ndim == 0 and source.ndim <= 1
                                                        and source.numel() == index.numel()):
            raise ValueError(f"{op}: source must have shape {tuple(shape)} (input's with dim {d} "
                             f"of size len(index) = {index.numel()}), got {tuple(source.shape)}")
    res = _scatter_target(input, index, source, out, inplace, op)
    r = res if res.ndim else _with(res, (1,), (0,))
    n, st = r.shape[d], r.stride(d)
    istr = [0] * len(shape)
    istr[d] = index.stride(0) if index.ndim else 0
    idx = _with(index, shape, istr)
    sv = None
    if source is not None:
        sv = source if tuple(source.shape) == tuple(shape) else source.reshape(shape)
        if sv._storage is res._storage:
            sv = _clone_into(Tensor._empty(shape, sv.dtype, sv.device), sv)
    if value is not None:
        value = _cast_scalar(value, res.dtype, op)
    if alpha is not None:
        alpha = _cast_scalar(alpha, res.dtype, op, "alpha")
        if alpha == 1:
            alpha = None
    _scatter(_along(r, d, shape), sv, idx, st, 0, n, False, mode,
             (op, f"dim {d} of size {n}", 0, n), value=value, alpha=alpha)
    return res if out is None or res is out else out.copy_(res)


def index_add(input, dim, index, source, *, alpha=1, out=None):  # noqa: A002
    """A copy of input with alpha * source added at index (1-D) along dim."""
    return _index_scatter_op(input, dim, index, source, "index_add", "add", out, False, alpha)


def index_copy(input, dim, index, source, *, out=None):  # noqa: A002
    """A copy of input with source's slices written at index along dim."""
    return _index_scatter_op(input, dim, index, source, "index_copy", "store", out, False)


def index_fill(input, dim, index, value):  # noqa: A002
    """A copy of input with `value` written at index along dim."""
    return _index_scatter_op(input, dim, index, None, "index_fill", "store", None, False,
                             value=value)


# ---------------------------------------------------------------------------- masks
def _check_mask(mask, op, device):
    check_tensor(mask, "mask", op)
    if mask.dtype is not _dt.bool:
        raise TypeError(f"{op}: mask must be a bool tensor, got {mask.dtype.name}")
    if mask.device != device:
        raise ValueError(f"{op}: mask is on {mask.device}, but input is on {device}")


def _masked_fill(input, mask, value, inplace, op):
    check_tensor(input, "input", op)
    _check_mask(mask, op, input.device)
    value = _cast_scalar(value, input.dtype, op)
    if inplace:
        try:
            m = mask.expand(input.shape)
        except ValueError:
            raise ValueError(f"{op}: mask of shape {tuple(mask.shape)} cannot be broadcast to "
                             f"input's shape {tuple(input.shape)}") from None
        out, x = input, input
    else:
        shape = broadcast_shapes(input.shape, mask.shape)
        out = Tensor._empty(shape, input.dtype, input.device)
        m, x = mask.expand(shape), input.expand(shape)
    if out.numel():
        _run("masked_fill", out.device, out, x, m, value)
    return out


def masked_fill(input, mask, value):  # noqa: A002
    """input with `value` (number or 0-dim tensor) where mask (bool, broadcast) is True."""
    return _masked_fill(input, mask, value, False, "masked_fill")


def _mask_positions(mask, shape, strides, offset=0):
    """Host: element offsets (int64, row-major order) of the True entries of mask over shape."""
    m = np.broadcast_to(_to_host(mask), shape)
    if m.ndim == 0:
        return np.full(int(bool(m)), offset, np.int64)
    off = np.full(int(m.sum()), offset, np.int64)
    for c, s in zip(np.nonzero(m), strides):
        off += c.astype(np.int64) * s
    return off


def masked_select(input, mask, *, out=None):  # noqa: A002
    """The elements of input (broadcast with mask) where mask is True, as a 1-D tensor."""
    op = "masked_select"
    check_tensor(input, "input", op)
    _check_mask(mask, op, input.device)
    shape = broadcast_shapes(input.shape, mask.shape)
    x = input.expand(shape)
    off = _mask_positions(mask, shape, x.stride())  # broadcast on the host, not the GPU
    n = off.size
    if out is None:
        out = Tensor._empty((n,), input.dtype, input.device)
    else:
        _check_out(out, (n,), input.dtype, input.device, op)
        if out_overlaps(out, input, mask):
            return out.copy_(masked_select(input, mask))
    if n:
        idx = _from_host(off, input.device)
        base = Tensor._make(x._storage, (n,), (0,), 0, x.dtype)
        _gather(out, base, idx, 1, 0, _BIG, False, (op, "input", None, None))
    return out


def _masked_scatter(input, mask, source, inplace, op):
    check_tensor(input, "input", op)
    _check_mask(mask, op, input.device)
    check_tensor(source, "source", op)
    if source.device != input.device or source.dtype is not input.dtype:
        raise TypeError(f"{op}: source must have input's dtype {input.dtype.name} and device "
                        f"{input.device}, got {source.dtype.name} on {source.device}")
    if inplace:
        try:
            mask.expand(input.shape)
        except ValueError:
            raise ValueError(f"{op}: mask of shape {tuple(mask.shape)} cannot be broadcast to "
                             f"input's shape {tuple(input.shape)}") from None
        res = input
    else:
        shape = broadcast_shapes(input.shape, mask.shape)
        res = _clone_into(Tensor._empty(shape, input.dtype, input.device), input.expand(shape))
    off = _mask_positions(mask, res.shape, res.stride(), res.storage_offset())
    n = off.size
    if n > source.numel():
        raise ValueError(f"{op}: mask has {n} True entries but source has only "
                         f"{source.numel()} elements")
    if n:
        src = _contig(source)
        if src._storage is res._storage:
            src = _clone_into(Tensor._empty(src.shape, src.dtype, src.device), src)
        sv = _with(src, (n,), (1,))
        idx = _from_host(off, input.device)
        dst = Tensor._make(res._storage, (n,), (0,), 0, res.dtype)
        _scatter(dst, sv, idx, 1, 0, _BIG, False, "store", (op, "input", None, None))
    return res


def masked_scatter(input, mask, source):  # noqa: A002
    """A copy of input with source's first elements written, in order, where mask is True."""
    return _masked_scatter(input, mask, source, False, "masked_scatter")


# ---------------------------------------------------------------------------- advanced indexing
def _to_index_tensor(it, device):
    from ..creation import tensor
    if isinstance(it, Tensor):
        t = it
    else:
        a = np.asarray(it)
        if a.size == 0 and a.dtype.kind not in "bui":
            a = a.astype(np.int64)
        if a.dtype.kind not in "bui":
            raise IndexError(f"tensors used as indices must be int64, int32 or bool; got a "
                             f"{type(it).__name__} of {a.dtype}")
        t = tensor(a.astype(np.bool_ if a.dtype.kind == "b" else np.int64))
    if t.dtype.kind == "b":
        pass
    elif t.dtype not in (_dt.int64, _dt.int32):
        raise IndexError(f"tensors used as indices must be int64, int32 or bool tensors, got "
                         f"{t.dtype.name}")
    if t.device != device:
        t = t.to(device)
    return t


def _prepare(x, idx, op):
    """Apply the basic parts of `idx`; return (view, [(pos, index tensor)]) of the rest."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    items = []
    for it in idx:
        if it is None or it is Ellipsis or isinstance(it, slice):
            items.append(it)
        elif isinstance(it, (bool, np.bool_)):
            items.append(_to_index_tensor(np.array(bool(it)), x.device))
        elif isinstance(it, (int, np.integer)):
            items.append(int(it))
        elif isinstance(it, (Tensor, list, np.ndarray)):
            items.append(_to_index_tensor(it, x.device))
        else:
            raise IndexError(f"{op}: unsupported index of type {type(it).__name__}; use ints, "
                             f"slices, None, ..., lists, arrays or int/bool tensors")
    used = sum(it.ndim if isinstance(it, Tensor) and it.dtype.kind == "b" else
               0 if it is None or it is Ellipsis else 1 for it in items)
    n_ell = sum(it is Ellipsis for it in items)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if used > x.ndim:
        raise IndexError(f"too many indices for tensor of dimension {x.ndim} (got {used})")
    if n_ell:
        i = next(k for k, it in enumerate(items) if it is Ellipsis)
        items = items[:i] + [slice(None)] * (x.ndim - used) + items[i + 1:]
    shape, stride, offset, d = [], [], x._offset, 0
    adv = []
    for it in items:
        if it is None:
            shape.append(1), stride.append(0)
        elif isinstance(it, slice):
            n = x.shape[d]
            if it.step is not None and it.step <= 0:
                raise ValueError(f"slice step must be positive, got {it.step} (negative steps are "
                                 f"not supported; use flip)")
            start, stop, step = it.indices(n)
            length = max(0, -(-(stop - start) // step))
            if length:
                offset += start * x.stride(d)
            shape.append(length), stride.append(x.stride(d) * step)
            d += 1
        elif isinstance(it, int):
            n = x.shape[d]
            if not -n <= it < n:
                raise IndexError(f"index {it} is out of bounds for dimension {d} with size {n}")
            offset += (it % n) * x.stride(d)
            d += 1
        elif it.dtype.kind == "b":
            k = it.ndim
            if k == 0:  # a scalar mask adds a dim of size 1 indexed by [0] or []
                shape.append(1), stride.append(0)
                ind = np.zeros(1 if bool(_to_host(it)) else 0, np.int64)
                adv.append((len(shape) - 1, _from_host(ind, x.device), d))
                continue
            want = tuple(x.shape[d:d + k])
            if tuple(it.shape) != want:
                raise IndexError(f"the shape of the mask {tuple(it.shape)} at index {d} does not "
                                 f"match the shape of the indexed tensor {want}")
            coords = np.nonzero(_to_host(it))
            for j in range(k):
                shape.append(x.shape[d]), stride.append(x.stride(d))
                adv.append((len(shape) - 1, _from_host(coords[j].astype(np.int64), x.device), d))
                d += 1
        else:
            shape.append(x.shape[d]), stride.append(x.stride(d))
            adv.append((len(shape) - 1, it, d))
            d += 1
    shape += x.shape[d:]
    stride += x.stride()[d:]
    return x._view(shape, stride, offset), adv


def _advanced(x, idx, op):
    """(iteration shape, base view over it (stride 0 on index dims), index view, sdim, lo, hi,
    wrap, err) for x[idx] with at least one advanced index."""
    v, adv = _prepare(x, idx, op)
    try:
        bshape = tuple(broadcast_shapes(*[t.shape for _, t, _ in adv]))
    except ValueError:
        raise IndexError(f"shape mismatch: indexing tensors could not be broadcast together with "
                         f"shapes {', '.join(str(tuple(t.shape)) for _, t, _ in adv)}") from None
    pos = [p for p, _, _ in adv]
    rest = [i for i in range(v.ndim) if i not in pos]
    consecutive = pos == list(range(pos[0], pos[0] + len(pos)))
    nb = len(bshape)
    if len(adv) == 1:
        p, t, d = adv[0]
        n = v.shape[p]
        index = t.expand(bshape)
        sdim, lo, hi, wrap = v.stride(p), -n, n, True
        err = ("index", f"dimension {d} with size {n}", -n, n)
    else:
        index = Tensor._empty(bshape, _dt.int64, x.device)
        if index.numel():
            for j, (p, t, d) in enumerate(adv):
                n = v.shape[p]
                _run("index_linearize", x.device, index, t.expand(bshape), v.stride(p), -n, n, True,
                     j == 0, ("index", f"dimension {d} with size {n}", -n, n))
        sdim, lo, hi, wrap, err = 1, -_BIG, _BIG, False, ("index", "the input", None, None)
    if consecutive:
        p0 = pos[0]
        before, after = list(range(p0)), list(range(pos[-1] + 1, v.ndim))
    else:
        before, after = [], rest
    shape = [v.shape[i] for i in before] + list(bshape) + [v.shape[i] for i in after]
    sstr = [v.stride(i) for i in before] + [0] * nb + [v.stride(i) for i in after]
    istr = [0] * len(before) + list(index.stride()) + [0] * len(after)
    return (tuple(shape), _with(v, shape, sstr), _with(index, shape, istr), sdim, lo, hi, wrap,
            err)


def getitem(x, idx):
    """x[idx] where idx holds an integer/bool tensor, list or array (advanced indexing).

    torch's rules: ints and slices are applied first as views (so an int next to an index
    tensor does not count as advanced, unlike NumPy); adjacent index tensors keep their
    place in the result, separated ones move to the front; bool masks index by nonzero.
    """
    shape, src, index, sdim, lo, hi, wrap, err = _advanced(x, idx, "index")
    out = Tensor._empty(shape, x.dtype, x.device)
    return _gather(out, src, index, sdim, lo, hi, wrap, err)


def _put(x, idx, value, accumulate, op, cast_ok):
    shape, dst, index, sdim, lo, hi, wrap, err = _advanced(x, idx, op)
    sv, scalar = None, None
    if isinstance(value, Tensor) and value.ndim == 0 and value.device != x.device:
        value = value.item()
    if isinstance(value, Tensor):
        if value.device != x.device:
            raise ValueError(f"{op}: values are on {value.device}, but the tensor is on {x.device}")
        if value.dtype is not x.dtype and not cast_ok:
            raise TypeError(f"{op}: values must have the tensor's dtype {x.dtype.name}, got "
                            f"{value.dtype.name}")
        vv = value
        while vv.ndim > len(shape) and vv.shape[0] == 1:
            vv = vv.squeeze(0)
        try:
            vv = vv.expand(shape)
        except ValueError:
            raise ValueError(f"{op}: values of shape {tuple(value.shape)} cannot be broadcast to "
                             f"the indexed shape {shape}") from None
        if vv.dtype is not x.dtype:  # the dtype table's cast rules live in copy_
            vv = Tensor._empty(shape, x.dtype, x.device).copy_(vv)
        elif vv._storage is x._storage:  # reading what the scatter writes: copy first
            vv = _clone_into(Tensor._empty(shape, x.dtype, x.device), vv)
        sv = vv
    else:
        scalar = _cast_scalar(value, x.dtype, op)
    if index.numel():
        _run("index_scatter", x.device, dst, sv, index, sdim, lo, hi, wrap,
             "add" if accumulate else "store", (op,) + err[1:], value=scalar)
    return x


def setitem(x, idx, value):
    """x[idx] = value (a tensor broadcast to the indexed shape, or a number)."""
    _put(x, idx, value, False, "index_put", True)


def _index_put(input, indices, values, accumulate, inplace):  # noqa: A002
    op = "index_put_" if inplace else "index_put"
    check_tensor(input, "input", op)
    if not isinstance(indices, (tuple, list)):
        raise TypeError(f"{op}: indices must be a tuple of tensors, got {type(indices).__name__}")
    for i, t in enumerate(indices):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{op}: indices[{i}] must be a Tensor or None, got {type(t).__name__}")
    if not any(t is not None for t in indices):
        raise ValueError(f"{op}: indices must hold at least one tensor")
    idx = tuple(slice(None) if t is None else t for t in indices)
    res = input if inplace else _clone_into(Tensor._empty(input.shape, input.dtype,
                                                          input.device), input)
    return _put(res, idx, values, accumulate, op, False)


def index_put(input, indices, values, accumulate=False):  # noqa: A002
    """A copy of input with values written (or added, accumulate=True) at indices."""
    return _index_put(input, indices, values, accumulate, False)


# ---------------------------------------------------------------------------- Tensor methods
def _scatter_(self, dim, index, src=None, *, value=None, reduce=None):
    return _scatter_dispatch(self, dim, index, src, value, reduce, None, True)


def _scatter_add_(self, dim, index, src):
    check_tensor(src, "src", "scatter_add_")
    return _scatter_impl(self, dim, index, src, "sum", True, "scatter_add_", None, True)


def _scatter_reduce_(self, dim, index, src, reduce, *, include_self=True):
    if reduce not in _REDUCES:
        raise ValueError(f"scatter_reduce_: reduce must be one of {', '.join(map(repr, _REDUCES))}"
                         f", got {reduce!r}")
    check_tensor(src, "src", "scatter_reduce_")
    return _scatter_impl(self, dim, index, src, reduce, include_self, "scatter_reduce_", None, True)


def _index_add_(self, dim, index, source, *, alpha=1):
    return _index_scatter_op(self, dim, index, source, "index_add_", "add", None, True, alpha)


def _index_copy_(self, dim, index, source):
    return _index_scatter_op(self, dim, index, source, "index_copy_", "store", None, True)


def _index_fill_(self, dim, index, value):
    return _index_scatter_op(self, dim, index, None, "index_fill_", "store", None, True,
                             value=value)


def _index_put_(self, indices, values, accumulate=False):
    return _index_put(self, indices, values, accumulate, True)


def _masked_fill_(self, mask, value):
    return _masked_fill(self, mask, value, True, "masked_fill_")


def _masked_scatter_(self, mask, source):
    return _masked_scatter(self, mask, source, True, "masked_scatter_")


_methods.install(
    gather=gather, scatter=scatter, scatter_=_scatter_, scatter_add=scatter_add,
    scatter_add_=_scatter_add_, scatter_reduce=scatter_reduce, scatter_reduce_=_scatter_reduce_,
    index_select=index_select, index_add=index_add, index_add_=_index_add_,
    index_copy=index_copy, index_copy_=_index_copy_, index_fill=index_fill,
    index_fill_=_index_fill_, index_put=index_put, index_put_=_index_put_,
    masked_fill=masked_fill, masked_fill_=_masked_fill_, masked_select=masked_select,
    masked_scatter=masked_scatter, masked_scatter_=_masked_scatter_, take=take,
)
