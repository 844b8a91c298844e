"""Reductions, scans and the sort family, with torch's names and semantics.

Every reduction goes through one dispatch entry, `reduce`:

    impl("reduce", device)(kind, x, dims, values, indices, **params)

`x` is the (already cast) input, `dims` the sorted tuple of reduced dims, `values` /
`indices` freshly allocated contiguous outputs in the *keepdim* shape (either may be
None). The op layer here does the validation, the result dtype and shape, the empty
cases and `out=`; the backends only compute. Kinds:

    sum prod mean amax amin max min (values+indices) argmax argmin var std
    norm (params ord) lse any all nnz

Scans (`cumsum`, `cumprod`) dispatch `scan`; the sort family dispatches `sort`,
`topk`, `nonzero` and `unique`.
"""
from __future__ import annotations

import builtins
import math
from collections import namedtuple

from .. import dtypes as _dt
from ..declarations import REDUCTIONS, parameter_list as _param_list, parameters as _params
from ..declarations import subscribe_reductions as _subscribe_reductions
from ..dispatch import impl, register
from ..plans import memoize
from ..tensor import _CONTIG, Size, Tensor, cached_contiguous_strides, normalize_dim
from . import _declare, _methods  # noqa: F401 - _declare: the table, declared on import
from ._common import check_tensor, out_overlaps

__all__ = ["sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "var", "std",
           "logsumexp", "any", "all", "count_nonzero", "cumsum", "cumprod", "sort", "argsort",
           "topk", "nonzero", "unique", "vector_norm", "aminmax", "norm", "std_mean", "var_mean",
           "nansum", "nanmean"]

# torch.return_types.* equivalents: tuples with .values / .indices
max_result = namedtuple("max", ["values", "indices"])
min_result = namedtuple("min", ["values", "indices"])
sort_result = namedtuple("sort", ["values", "indices"])
topk_result = namedtuple("topk", ["values", "indices"])
aminmax_result = namedtuple("aminmax", ["min", "max"])


# ------------------------------------------------------------------ helpers
def _norm_dims(x: Tensor, dim, fname) -> tuple[int, ...]:
    """dim as None (all), int, or tuple/list of ints -> sorted unique tuple of dims."""
    if dim is None or dim.__class__ is int:     # (not bool: True == 1 would hash alike)
        return _dims_of(len(x._shape), dim, fname)
    return _norm_dims_full(len(x._shape), dim, fname)


@memoize("ops.reduction.dims", 1024)
def _dims_of(ndim, dim, fname):
    return _norm_dims_full(ndim, dim, fname)


def _norm_dims_full(ndim, dim, fname) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, (tuple, list)):
        if len(dim) == 0:  # torch: an empty dim list reduces everything
            return tuple(range(ndim))
        ds = [normalize_dim(d, ndim, "dim") for d in dim]
        if len(set(ds)) != len(ds):
            raise ValueError(f"{fname}: dim {tuple(dim)} names a dimension more than once")
        return tuple(sorted(set(ds))) if ndim else ()
    d = normalize_dim(dim, ndim, "dim")
    return (d,) if ndim else ()


def _out_shape(x: Tensor, dims, keepdim):
    """(keepdim shape, final shape) of reducing `dims` of x."""
    if keepdim is False or keepdim is True:
        return _shapes_of(x._shape, dims, keepdim)
    return _shapes_full(x._shape, dims, keepdim)


@memoize("ops.reduction.shapes", 4096)
def _shapes_of(shape, dims, keepdim):
    return _shapes_full(shape, dims, keepdim)


def _shapes_full(shape, dims, keepdim):
    keep = [1 if i in dims else n for i, n in enumerate(shape)]
    final = keep if keepdim else [n for i, n in enumerate(shape) if i not in dims]
    return Size(keep), Size(final)


def _reduced_numel(x, dims):
    return math.prod(x.shape[d] for d in dims)


def _cast_input(x: Tensor, dtype, fname):
    if dtype is None:
        return x, None
    dt = _dt.as_dtype(dtype, "dtype")
    return (x if x.dtype is dt else x.to(dt)), dt


def _finish(res: Tensor, final_shape, out, fname, argname="out"):
    if out is not None and res._storage is getattr(out, "_storage", None):
        return out      # the kernel wrote into out itself (`_run`'s direct view)
    if out is None and res._offset == 0 and res._stride == _CONTIG.get(res._shape):
        # a fresh contiguous result: its final shape only drops (or keeps) size-1 dims
        return Tensor._make(res._storage, final_shape, cached_contiguous_strides(final_shape), 0,
                            res._dtype)
    res = res.view(final_shape)
    if out is None:
        return res
    if not isinstance(out, Tensor):
        raise TypeError(f"{fname}: {argname} must be a Tensor, got {type(out).__name__}")
    if out.dtype is not res.dtype:
        raise TypeError(f"{fname}: {argname} has dtype {out.dtype.name}, expected {res.dtype.name}")
    if out.device != res.device:
        raise ValueError(f"{fname}: {argname} is on {out.device}, expected {res.device}")
    if tuple(out.shape) != tuple(final_shape):
        if out.numel() != 0:
            raise ValueError(f"{fname}: {argname} has shape {tuple(out.shape)}, expected "
                             f"{tuple(final_shape)} (only empty out tensors are resized)")
        raise ValueError(f"{fname}: {argname} has shape {tuple(out.shape)}; resizing out is not "
                         f"supported, pass shape {tuple(final_shape)}")
    out.copy_(res)
    return out


def _run(kind, x, dims, keep_shape, vdtype, idx=False, vals=True, out=None, final=None,
         **params):
    """Allocate keepdim-shaped outputs and dispatch the reduction. With `out` (and the
    `final` shape) the values go straight into out where `_direct` allows it."""
    dev = x._storage.device
    v = None
    if out is not None and vals:
        v = _direct(out, x, keep_shape, final, vdtype)
    if v is None and vals:
        v = Tensor._empty(keep_shape, vdtype, dev)
    i = Tensor._empty(keep_shape, _dt.int64, dev) if idx else None
    if math.prod(keep_shape) and math.prod(x._shape):
        impl("reduce", dev)(kind, x, dims, v, i, **params)
    return v, i


def _direct(out, x, keep_shape, final, vdtype):
    """A keepdim-shaped view of `out` for the kernel to write into (no temporary, no copy
    launch): out a plain Tensor with exactly the result's final shape, dtype and device,
    contiguous, not sharing bytes with x. Else None: the result is computed into a fresh
    buffer and `_finish` checks out and copies it in (torch's semantics either way)."""
    if (out.__class__ is not Tensor or out._dtype is not vdtype
            or out._storage.device != x._storage.device or tuple(out._shape) != tuple(final)
            or out._stride != cached_contiguous_strides(out._shape) or out_overlaps(out, x)):
        return None
    keep = Size(keep_shape)
    return Tensor._make(out._storage, keep, cached_contiguous_strides(keep), out._offset, vdtype)


def _sum_dtype(d: _dt.DType) -> _dt.DType:
    return _dt.int64 if d.kind in "bui" else d


def _require_float(x, fname, what="input"):
    if not x.dtype.is_floating_point:
        raise TypeError(f"{fname}: {what} dtype must be floating point, got {x.dtype.name}; pass "
                        f"dtype= or cast with .float()")
    if x.dtype.is_float8:
        raise TypeError(f"{fname}: float8 inputs are not supported ({x.dtype.name}); cast first")


def _no_float8(x, fname):
    if x.dtype.is_float8:
        raise TypeError(f"{fname}: float8 inputs are not supported ({x.dtype.name}); cast to a "
                        f"wider float first")


def _nonempty(x, dims, fname):
    for d in dims:
        if x.shape[d] == 0:
            raise IndexError(f"{fname}: expected reduction dim {d} to have non-zero size "
                             f"(input shape {tuple(x.shape)})")
    if x.numel() == 0 and not dims:
        raise IndexError(f"{fname}: cannot reduce an empty tensor")


def _bool_dtype(x):
    return _dt.uint8 if x.dtype is _dt.uint8 else _dt.bool


# ------------------------------------------------------------------ declared reductions
# sum, prod, mean, amax, amin, any, all, count_nonzero, argmax and argmin are declarations
# (ops/_declare.py `reduction(...)`): their functions and methods are generated at the end of
# this module; each takes the memoised plan (`_fast_plan`) where the call allows it, else
# `_reduce_full` with the declaration.
_STAND_IN = object()


@memoize("ops.reduction.fast", 4096)
def _fast_plan(kind, dtype, shape, dim, keepdim):
    """The plan of a declared reduction with an int or None dim, a bool keepdim and no dtype= /
    out=, from the input's dtype and shape: (dims, keepdim shape, final shape and strides,
    values dtype, mean's scale, indices only). None where the full path decides (an empty
    input or result); raises where it refuses (the caller runs it for the message)."""
    op = REDUCTIONS[kind]
    x = Tensor._make(_STAND_IN, shape, cached_contiguous_strides(shape), 0, dtype)
    if dtype.kind == "c" or dtype.is_float8:
        raise TypeError(kind)
    if op.rule == "float" and not dtype.is_floating_point:
        raise TypeError(kind)
    dims = _norm_dims(x, dim, kind)
    keep, final = _out_shape(x, dims, keepdim)
    if not math.prod(shape) or not math.prod(final):
        return None
    vdtype = _RESULT[op.rule](dtype)
    scale = 1.0 / _reduced_numel(x, dims) if op.tl[2] == "Q_SCALE" else None
    return dims, keep, final, cached_contiguous_strides(final), vdtype, scale, op.rule == "index"


_RESULT = {"sum": lambda d: _sum_dtype(d), "float": lambda d: d, "keep": lambda d: d,
           "bool": lambda d: _dt.uint8 if d is _dt.uint8 else _dt.bool,
           "count": lambda d: _dt.int64, "index": lambda d: _dt.int64}


def _fast_run(kind, x, plan):
    dims, keep, final, fstride, vdtype, scale, idx = plan
    dev = x._storage.device
    v = Tensor._empty(keep, vdtype, dev)
    if idx:                     # argmax / argmin: indices only
        impl("reduce", dev)(kind, x, dims, None, v)
    elif scale is None:
        impl("reduce", dev)(kind, x, dims, v, None)
    else:
        impl("reduce", dev)(kind, x, dims, v, None, scale=scale)
    return Tensor._make(v._storage, final, fstride, 0, vdtype)


def _reduce_full(op, fname, input, dim, keepdim, dtype, out):  # noqa: A002
    """Validate, infer the result dtype and shape, dispatch `reduce`, fill the identity of an
    empty reduction, and write out=."""
    if op.complex and input.__class__ is Tensor and input._dtype.kind == "c":
        from .complex import reduce_complex
        return reduce_complex(op.name, input, dim, keepdim, dtype, out)
    if op.rule == "index":
        return _arg_full(op.kind, input, dim, keepdim, out)
    check_tensor(input, "input", fname)
    if op.rule != "float":
        _no_float8(input, fname)
    if op.dims == "one" and isinstance(dim, (tuple, list)):
        raise TypeError(f"{fname}: dim must be an int or None (torch's {fname} reduces one dim)")
    x, dt = _cast_input(input, dtype, fname)
    if op.rule == "float":
        _require_float(x, fname)
    vdtype = dt if dt is not None and op.rule == "sum" else _RESULT[op.rule](x.dtype)
    dims = _norm_dims(x, dim, fname)
    if op.identity is None:
        _nonempty(x, dims, fname)
    keep, final = _out_shape(x, dims, keepdim)
    params = {}
    if op.tl[2] == "Q_SCALE":            # mean's 1/n
        n = _reduced_numel(x, dims)
        params["scale"] = (1.0 / n) if n else float("nan")
    v, _ = _run(op.kind, x, dims, keep, vdtype, out=out, final=final, **params)
    if op.identity is not None and math.prod(keep) and x.numel() == 0:
        v.fill_(float("nan") if op.identity == "nan" else op.identity)
    return _finish(v, final, out, fname)

def _var_std(kind, input, dim, correction, keepdim, out, unbiased):
    check_tensor(input, "input", kind)
    _require_float(input, kind)
    if unbiased is not None:
        if correction is not None:
            raise ValueError(f"{kind}: pass either unbiased or correction, not both")
        correction = 1 if unbiased else 0
    correction = 1 if correction is None else correction
    if not isinstance(correction, (int, float)) or isinstance(correction, bool):
        raise TypeError(f"{kind}: correction must be a number, got {correction!r}")
    x = input
    dims = _norm_dims(x, dim, kind)
    keep, final = _out_shape(x, dims, keepdim)
    n = _reduced_numel(x, dims)
    denom = n - correction
    scale = 1.0 / denom if denom > 0 else (float("inf") if n else float("nan"))
    v, _ = _run(kind, x, dims, keep, x.dtype, out=out, final=final, scale=scale, count=n)
    if math.prod(keep) and x.numel() == 0:
        v.fill_(float("nan"))
    return _finish(v, final, out, kind)


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None):
    """Variance with `correction` (default 1, Bessel); divides by max(0, N - correction)."""
    if isinstance(unbiased, (int, tuple, list)) and not isinstance(unbiased, bool) and dim is None:
        dim, unbiased = unbiased, None  # var(x, 1) is var(x, dim=1)
    return _var_std("var", input, dim, correction, keepdim, out, unbiased)


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None):
    if isinstance(unbiased, (int, tuple, list)) and not isinstance(unbiased, bool) and dim is None:
        dim, unbiased = unbiased, None
    return _var_std("std", input, dim, correction, keepdim, out, unbiased)


def _nan_zeroed(input, op):
    from . import elementwise as _ew
    x = check_tensor(input, "input", op)
    if not x.dtype.is_floating_point:
        return x, None
    nan = _ew.isnan(x)
    return _ew.where(nan, 0.0, x), nan


def nansum(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """sum treating NaN as zero."""
    x, _ = _nan_zeroed(input, "nansum")
    return sum(x, dim, keepdim, dtype=dtype) if dim is not None else sum(x, dtype=dtype)


def nanmean(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """mean over the non-NaN elements (NaN where all are NaN)."""
    x, nan = _nan_zeroed(input, "nanmean")
    if nan is None:
        raise TypeError(f"nanmean(): expected a floating point tensor as input, got "
                        f"{x.dtype.name}")
    from . import elementwise as _ew
    d = () if dim is None else dim
    total = sum(x, d, keepdim, dtype=dtype) if dim is not None else sum(x, dtype=dtype)
    count = sum(_ew.logical_not(nan), d, keepdim) if dim is not None else sum(_ew.logical_not(nan))
    return _ew.div(total, count.to(total.dtype))


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):  # noqa: A002
    """(var, mean) over the same dims, as torch.var_mean."""
    if isinstance(unbiased, (int, tuple, list)) and not isinstance(unbiased, bool) and dim is None:
        dim, unbiased = unbiased, None
    v = _var_std("var", input, dim, correction, keepdim, None, unbiased)
    return v, mean(input, dim, keepdim) if dim is not None else mean(input)


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):  # noqa: A002
    """(std, mean) over the same dims, as torch.std_mean."""
    if isinstance(unbiased, (int, tuple, list)) and not isinstance(unbiased, bool) and dim is None:
        dim, unbiased = unbiased, None
    v = _var_std("std", input, dim, correction, keepdim, None, unbiased)
    return v, mean(input, dim, keepdim) if dim is not None else mean(input)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):  # noqa: A002
    """torch.linalg.vector_norm: ord 2, 1, inf, -inf, 0 or any other float p."""
    check_tensor(x, "x", "vector_norm")
    x, _ = _cast_input(x, dtype, "vector_norm")
    _require_float(x, "vector_norm", "x")
    if isinstance(ord, bool) or not isinstance(ord, (int, float)):
        raise TypeError(f"vector_norm: ord must be a number, got {ord!r}")
    ord = float(ord)
    dims = _norm_dims(x, dim, "vector_norm")
    keep, final = _out_shape(x, dims, keepdim)
    if ord < 0 or ord == math.inf:
        if x.numel() == 0:
            raise IndexError(f"vector_norm: cannot compute the {ord} norm of an empty tensor, "
                             f"because the operation does not have an identity")
    v, _ = _run("norm", x, dims, keep, x.dtype, out=out, final=final, ord=ord)
    if math.prod(keep) and x.numel() == 0:
        v.fill_(0)
    return _finish(v, final, out, "vector_norm")


def norm(input, p="fro", dim=None, keepdim=False, dtype=None, *, out=None):  # noqa: A002
    """torch.norm / Tensor.norm for vector norms: p a number, 'fro' or None (both 2) over
    `dim` (None: all elements, flattened). Matrix norms ('nuc') are not supported."""
    if p is None or p == "fro":
        p = 2
    if isinstance(p, str):
        raise NotImplementedError(f"norm: p={p!r} is not supported (vector norms and 'fro' only)")
    return vector_norm(input, p, dim, keepdim, dtype=dtype, out=out)


def _is_matrix_ord(ord):  # noqa: A002
    if isinstance(ord, str):
        return ord in ("fro", "nuc")
    if isinstance(ord, bool) or not isinstance(ord, (int, float)):
        return False
    return float(ord) in (math.inf, -math.inf, 1.0, -1.0, 2.0, -2.0)


def _matrix_dims(A, dim, fname):
    if not isinstance(dim, (tuple, list)) or len(dim) != 2:
        raise ValueError(f"{fname}: dim must be a 2-tuple of ints, got {dim!r}")
    d0, d1 = (normalize_dim(d, A.ndim, "dim") for d in dim)
    if d0 == d1:
        raise ValueError(f"{fname}: dim must name two different dimensions, got {tuple(dim)}")
    return d0, d1


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None, out=None):  # noqa: A002
    """torch.linalg.matrix_norm over the two dims `dim` (batched over the others).

    ord: 'fro' (sqrt of the sum of squares), 1 / -1 (max / min column abs-sum), inf / -inf
    (max / min row abs-sum) on every device; 'nuc' (sum of singular values) and 2 / -2 (largest /
    smallest singular value) need an SVD, computed on the cpu device only."""
    fname = "linalg.matrix_norm"
    check_tensor(A, "A", fname)
    if A.ndim < 2:
        raise ValueError(f"{fname}: A must have at least 2 dimensions, got {A.ndim}-D "
                         f"(shape {tuple(A.shape)})")
    if not _is_matrix_ord(ord):
        raise ValueError(f"{fname}: ord must be one of 'fro', 'nuc', inf, -inf, 1, -1, 2, -2; "
                         f"got {ord!r}")
    d0, d1 = _matrix_dims(A, dim, fname)
    x, _ = _cast_input(A, dtype, fname)
    _require_float(x, fname, "A")
    if ord == "fro":
        return vector_norm(x, 2, (d0, d1), keepdim, out=out)
    if ord in (1, -1, math.inf, -math.inf):
        # abs-sums along one dim, then the max/min over the other (inf: the 1-norm transposed)
        s, r = (d0, d1) if abs(ord) == 1 else (d1, d0)
        sums = vector_norm(x, 1, s, keepdim=True)
        red = amax if ord > 0 else amin
        v = red(sums, r, keepdim=True)
        keep, final = _out_shape(x, (d0, d1), keepdim)
        return _finish(v, final, out, fname)
    # 'nuc', 2, -2: singular values, on the cpu only (never a silent host round trip)
    if x.device.type != "cpu":
        raise NotImplementedError(
            f"{fname}: ord={ord!r} needs singular values, which nbxtensor computes on the cpu "
            f"device only; call .cpu() first (got a tensor on {x.device})")
    if x.dtype not in (_dt.float32, _dt.float64):
        raise TypeError(f"{fname}: ord={ord!r} (an SVD) supports float32 and float64 inputs, got "
                        f"{x.dtype.name}; pass dtype= or cast first")
    perm = [i for i in range(x.ndim) if i not in (d0, d1)] + [d0, d1]
    xm = x.permute(perm)
    k = builtins.min(x.shape[d0], x.shape[d1])
    batch = list(xm.shape[:-2])
    sv = Tensor._empty(batch + [k], x.dtype, x.device)
    if sv.numel():
        impl("svdvals", x.device)(xm, sv)
    if ord == "nuc":
        v = sum(sv, -1)
    else:
        if k == 0:
            raise IndexError(f"{fname}: ord={ord!r} of an empty matrix (shape "
                             f"{tuple(x.shape)}) is undefined")
        v = (amax if ord == 2 else amin)(sv, -1)
    keep, final = _out_shape(x, (d0, d1), keepdim)
    # v is laid out in the batch order of `perm`, which is the input order of the kept dims
    return _finish(v.contiguous(), final, out, fname)


def linalg_norm(A, ord=None, dim=None, keepdim=False, *, dtype=None, out=None):  # noqa: A002
    """torch.linalg.norm: a matrix norm when `dim` is a 2-tuple (or dim is None and A is 2-D
    with ord given or a string ord), else a vector norm; ord=None is the 2-norm of the
    flattened input (or over `dim`)."""
    fname = "linalg.norm"
    check_tensor(A, "A", fname)
    if isinstance(dim, int) and not isinstance(dim, bool):
        dim = (dim,)
    if dim is not None:
        if not isinstance(dim, (tuple, list)) or len(dim) not in (1, 2):
            raise ValueError(f"{fname}: dim must be an int or a tuple of 1 or 2 ints, got "
                             f"{dim!r}")
    elif ord is not None and A.ndim not in (1, 2):
        raise ValueError(f"{fname}: if dim is not given but ord is, A must be 1-D or 2-D; got "
                         f"{A.ndim}-D (pass dim=)")
    if isinstance(ord, str) or (ord is not None and (len(dim) == 2 if dim is not None
                                                       else A.ndim == 2)):
        if dim is not None and len(dim) != 2:
            raise ValueError(f"{fname}: ord={ord!r} is a matrix norm and needs a 2-tuple dim, "
                             f"got {tuple(dim)}")
        return matrix_norm(A, ord, tuple(dim) if dim is not None else (0, 1), keepdim,
                           dtype=dtype, out=out)
    return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype, out=out)


def logsumexp(input, dim, keepdim=False, *, out=None):
    """log(sum(exp(x))) computed as max + log(sum(exp(x - max))); integers give float32."""
    check_tensor(input, "input", "logsumexp")
    _no_float8(input, "logsumexp")
    x = input if input.dtype.is_floating_point else input.to(_dt.get_default_dtype())
    dims = _norm_dims(x, dim, "logsumexp")
    keep, final = _out_shape(x, dims, keepdim)
    v, _ = _run("lse", x, dims, keep, x.dtype, out=out, final=final)
    if math.prod(keep) and x.numel() == 0:
        v.fill_(float("-inf"))
    return _finish(v, final, out, "logsumexp")


# ------------------------------------------------------------------ max / min family
def _max_min(kind, input, dim, keepdim, out):
    check_tensor(input, "input", kind)
    _no_float8(input, kind)
    if isinstance(dim, Tensor):
        # torch.max(a, b): the element-wise maximum (torch's overload)
        from . import elementwise as _ew
        fn = _ew.maximum if kind == "max" else _ew.minimum
        return fn(input, dim) if out is None else fn(input, dim, out=out)
    if dim is None:
        if input.numel() == 0:
            raise IndexError(f"{kind}(): expected reduction dim to be specified for "
                             f"input.numel() == 0; specify the reduction dim with the 'dim' argument")
        return amax(input) if kind == "max" else amin(input)
    dims = _norm_dims(input, dim, kind)
    _nonempty(input, dims, kind)
    keep, final = _out_shape(input, dims, keepdim)
    v, i = _run(kind, input, dims, keep, input.dtype, idx=True)
    res = (max_result if kind == "max" else min_result)
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"{kind}: out must be a (values, indices) pair of tensors")
        return res(_finish(v, final, out[0], kind, "out[0]"), _finish(i, final, out[1], kind, "out[1]"))
    return res(v.view(final), i.view(final))


def max(input, dim=None, keepdim=False, *, out=None):  # noqa: A001
    """max(x) -> value; max(x, dim) -> (values, indices), first occurrence; NaN wins."""
    return _max_min("max", input, dim, keepdim, out)


def min(input, dim=None, keepdim=False, *, out=None):  # noqa: A001
    return _max_min("min", input, dim, keepdim, out)


def aminmax(input, *, dim=None, keepdim=False):
    return aminmax_result(amin(input, dim if dim is not None else (), keepdim),
                          amax(input, dim if dim is not None else (), keepdim))


def _arg_full(kind, input, dim, keepdim, out):
    check_tensor(input, "input", kind)
    _no_float8(input, kind)
    if dim is None:
        if input.numel() == 0:
            raise IndexError(f"{kind}(): expected reduction dim to be specified for "
                             f"input.numel() == 0")
        flat = input.reshape(-1)
        _, i = _run(kind, flat, (0,), (1,), None, idx=True, vals=False)
        final = (1,) * input.ndim if keepdim else ()
        return _finish(i, final, out, kind)
    if isinstance(dim, (tuple, list)):
        raise TypeError(f"{kind}: dim must be an int or None, got {dim!r}")
    dims = _norm_dims(input, dim, kind)
    _nonempty(input, dims, kind)
    keep, final = _out_shape(input, dims, keepdim)
    _, i = _run(kind, input, dims, keep, None, idx=True, vals=False)
    return _finish(i, final, out, kind)


# ------------------------------------------------------------------ scans
def _scan(kind, input, dim, dtype, out):
    check_tensor(input, "input", kind)
    _no_float8(input, kind)
    x, dt = _cast_input(input, dtype, kind)
    if dim is None:
        raise TypeError(f"{kind}: dim is required (got None)")
    d = normalize_dim(dim, x.ndim, "dim")
    rdt = dt or _sum_dtype(x.dtype)
    res = Tensor._empty(x.shape, rdt, x.device)
    if res.numel():
        impl("scan", x.device)(kind, x, d if x.ndim else 0, res)
    return _finish(res, x.shape, out, kind)


def cumsum(input, dim, *, dtype=None, out=None):
    """Inclusive prefix sum along `dim`; integers and bool give int64; fp16/bf16 carry in fp32."""
    return _scan("cumsum", input, dim, dtype, out)


def cumprod(input, dim, *, dtype=None, out=None):
    return _scan("cumprod", input, dim, dtype, out)


# ------------------------------------------------------------------ sort family
def _sortable(x, fname):
    check_tensor(x, "input", fname)
    if x.dtype.is_float8:
        raise TypeError(f"{fname}: float8 inputs are not supported ({x.dtype.name}); cast first")


def sort(input, dim=-1, descending=False, stable=False, *, out=None):
    """Sorted values and their indices along `dim`; always stable (equal keys keep input order),
    NaN sorts as the largest value, as torch."""
    _sortable(input, "sort")
    if not isinstance(stable, bool) or not isinstance(descending, bool):
        raise TypeError("sort: stable and descending must be bools")
    d = normalize_dim(dim, input.ndim, "dim") if input.ndim else 0
    v = Tensor._empty(input.shape, input.dtype, input.device)
    i = Tensor._empty(input.shape, _dt.int64, input.device)
    if input.numel():
        impl("sort", input.device)(input, d, bool(descending), v, i)
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError("sort: out must be a (values, indices) pair of tensors")
        return sort_result(_finish(v, input.shape, out[0], "sort", "out[0]"),
                           _finish(i, input.shape, out[1], "sort", "out[1]"))
    return sort_result(v, i)


def argsort(input, dim=-1, descending=False, stable=False):
    """Indices that sort `input` along `dim` (always stable)."""
    return sort(input, dim, descending, stable).indices


def topk(input, k, dim=-1, largest=True, sorted=True, *, out=None):  # noqa: A002
    """The k largest (or smallest) values along `dim` and their indices, in sorted order.

    NaN counts as larger than every number. Among equal values the lower index comes first
    (torch leaves tie order unspecified)."""
    _sortable(input, "topk")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"topk: k must be an int, got {k!r}")
    d = normalize_dim(dim, input.ndim, "dim") if input.ndim else 0
    n = input.shape[d] if input.ndim else 1
    if not 0 <= k <= n:
        raise IndexError(f"topk: k ({k}) is out of range for dim {dim} of size {n}")
    shape = list(input.shape)
    if input.ndim:
        shape[d] = k
    v = Tensor._empty(shape, input.dtype, input.device)
    i = Tensor._empty(shape, _dt.int64, input.device)
    if v.numel():
        impl("topk", input.device)(input, k, d, bool(largest), v, i)
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError("topk: out must be a (values, indices) pair of tensors")
        return topk_result(_finish(v, tuple(shape), out[0], "topk", "out[0]"),
                           _finish(i, tuple(shape), out[1], "topk", "out[1]"))
    return topk_result(v, i)


def nonzero(input, *, as_tuple=False):
    """Indices of the non-zero elements, (n, ndim) int64 in row-major order.

    On cuda this syncs with the host once to learn n (the output's size)."""
    check_tensor(input, "input", "nonzero")
    _no_float8(input, "nonzero")
    res = impl("nonzero", input.device)(input)
    if as_tuple:
        if input.ndim == 0:   # torch: a 0-dim input acts as 1-D of one element: ([0],) or ([],)
            from ..creation import zeros
            return (zeros(res.shape[0], dtype=_dt.int64, device=input.device),)
        return tuple(res[:, j] for j in range(input.ndim))
    return res


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):  # noqa: A002
    """Sorted unique values of the flattened input (dim=None), or the unique slices along `dim`
    sorted lexicographically; optionally the inverse and the counts. Each NaN is its own value,
    as torch. `sorted=False` still sorts (torch on cuda does too). Syncs with the host once
    (the number of unique values sizes the output)."""
    _sortable(input, "unique")
    if dim is not None:
        return _unique_dim(input, dim, bool(return_inverse), bool(return_counts))
    vals, inv, counts = impl("unique", input.device)(input, bool(return_inverse),
                                                      bool(return_counts))
    res = [vals]
    if return_inverse:
        res.append(inv.view(input.shape))
    if return_counts:
        res.append(counts)
    return tuple(res) if len(res) > 1 else vals


def _unique_dim(x, dim, return_inverse, return_counts):
    """torch.unique(dim=d): the unique slices x.select(d, i), sorted lexicographically (slices
    compared as their row-major flattening). inverse (size(d),) maps each slice to its unique
    slice, counts how often each occurs. Rows holding a NaN are all distinct (NaN != NaN) and
    sort after every number in that column (torch leaves NaN here unspecified)."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"unique: dim must be an int or None, got {dim!r}")
    if x.ndim == 0:
        raise IndexError(f"unique: dim={dim} needs an input with at least one dimension, got a "
                         f"0-dim tensor (use dim=None)")
    d = normalize_dim(dim, x.ndim, "dim")
    n = x.shape[d]
    dev = x.device
    if n == 0:  # no slices: an empty result of the input's shape (torch)
        e = Tensor._empty((0,), _dt.int64, dev)
        res = [Tensor._empty(x.shape, x.dtype, dev)]
    else:
        rows = x.movedim(d, 0).reshape(n, -1).contiguous()
        first, inv, counts = impl("unique_dim", dev)(rows)
        rest = [s for i, s in enumerate(x.shape) if i != d]
        vals = rows.index_select(0, first).view([first.shape[0]] + rest)
        res = [vals.movedim(0, d).contiguous()]
    if return_inverse:
        res.append(e if n == 0 else inv)
    if return_counts:
        res.append(e if n == 0 else counts)
    return tuple(res) if len(res) > 1 else res[0]


@register("unique_dim", "triton")
def _unique_dim_composite(rows):
    """cuda/interp: unique rows of a contiguous (n, m) tensor from existing device ops.

    Lexicographic order by m stable argsorts, last column first (each pass keeps the order of
    the later columns among equal keys); a row starts a run when it differs from the previous
    sorted row; a scan of those flags numbers the runs. The one host sync is nonzero's count
    of run starts. m argsorts of length n: fine for modest m, slow for very wide slices."""
    from ..creation import arange
    n, m = rows.shape
    dev = rows.device
    perm = arange(n, dtype=_dt.int64, device=dev)
    for j in range(m - 1, -1, -1):
        key = rows[:, j].index_select(0, perm)
        perm = perm.index_select(0, sort(key).indices)
    s = rows.index_select(0, perm)
    flags = Tensor._empty((n,), _dt.bool, dev)
    flags[:1].fill_(True)
    if n > 1:
        flags[1:].copy_(any(s[1:] != s[:-1], dim=1))
    starts = nonzero(flags).reshape(-1)       # the one host sync: the number of unique rows
    ids = cumsum(flags, 0) - 1
    inv = Tensor._empty((n,), _dt.int64, dev)
    inv.index_put_((perm,), ids)
    ends = Tensor._empty(starts.shape, _dt.int64, dev)
    k = starts.shape[0]
    ends[:k - 1].copy_(starts[1:])
    ends[k - 1:].fill_(n)
    return perm.index_select(0, starts), inv, ends - starts


# ------------------------------------------------------------------ Tensor methods
def _m_max(self, dim=None, keepdim=False):
    return max(self, dim, keepdim)


def _m_min(self, dim=None, keepdim=False):
    return min(self, dim, keepdim)


_methods.install(
    max=_m_max, min=_m_min, var=var, std=std, logsumexp=logsumexp,
    cumsum=cumsum, cumprod=cumprod, sort=sort, argsort=argsort,
    topk=topk, nonzero=nonzero, unique=unique, aminmax=aminmax, norm=norm,
    nansum=nansum, nanmean=nanmean,
    cumsum_=lambda self, dim, *, dtype=None: self.copy_(cumsum(self, dim, dtype=dtype)),
    cumprod_=lambda self, dim, *, dtype=None: self.copy_(cumprod(self, dim, dtype=dtype)),
)


# ------------------------------------------------------------------ generated functions
# Each declared reduction (ops/_declare.py) gets its function here (so in nbx.ops / nbx) and
# its Tensor method: source with torch's signature that calls `_reduce` with the declaration.
def _build(op) -> None:
    params = _params(op.signature)
    names = {p for p, _, _ in params}
    args = ", ".join(a if a in names else d for a, d in (
        ("input", "input"), ("dim", "None"), ("keepdim", "False"), ("dtype", "None"),
        ("out", "None")))
    src = f"def {op.name}({_param_list(params)}):\n"
    if op.fast:
        # the memoised plan where the call allows it (inline: one frame fewer per call)
        dim_ok = "dim.__class__ is int" + (" or dim is None" if op.rule != "index" else "")
        src += (f"    if {'dtype is None and ' if 'dtype' in names else ''}out is None and "
                f"input.__class__ is _Tensor and ({dim_ok}) and "
                f"(keepdim is False or keepdim is True):\n"
                f"        try:\n"
                f"            plan = _fast_plan({op.kind!r}, input._dtype, input._shape, dim, "
                f"keepdim)\n"
                f"        except (TypeError, ValueError, IndexError):\n"
                f"            plan = None\n"
                f"        if plan is not None:\n"
                f"            return _fast_run({op.kind!r}, input, plan)\n")
    src += f"    return _reduce_full(_OP, {op.name!r}, {args})\n"
    ns = {"__name__": __name__, "_OP": op, "_reduce_full": _reduce_full, "_Tensor": Tensor,
          "_fast_plan": _fast_plan, "_fast_run": _fast_run}
    exec(compile(src, f"<declared reduction {op.name}>", "exec"), ns)
    fn = ns[op.name]
    fn.__doc__ = op.doc or f"torch.{op.name}: a reduction over `dim`."
    g = globals()
    for k in (op.name,) + op.aliases:
        if k in g:
            raise ValueError(f"declare {op.name}: nbx.{k} already exists")
        g[k] = fn
        if k not in __all__:
            __all__.append(k)
    _methods.install(**{k: fn for k in (op.name,) + op.aliases})


_subscribe_reductions(_build)
