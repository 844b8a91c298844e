"""nn ops: softmax, log_softmax, layer_norm, rms_norm, group_norm, batch_norm (inference),
and the fused residual forms add_rms_norm / add_layer_norm for transformer blocks.

Rules (torch's unless noted):
  * softmax/log_softmax(input, dim, dtype=None): with dtype the input is cast first (in
    the kernel, no copy); otherwise the result has the input's (floating) dtype. A row
    of all -inf gives NaN, as torch.
  * layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5) and
    rms_norm(input, normalized_shape, weight=None, eps=None) -- eps=None means
    finfo(input.dtype).eps, as torch. The result has the input's dtype; weight and bias
    may have another float dtype (mixed precision, as torch's CUDA kernels).
    Statistics are computed in fp32 (fp64 for fp64 input).
  * add_rms_norm(x, residual, weight, eps) -> (normed, x + residual) and
    add_layer_norm(x, residual, weight, bias, eps) likewise (extensions): the sum is
    rounded to the input dtype exactly as `x + residual` would be, then normalised.
  * group_norm(input, num_groups, weight=None, bias=None, eps=1e-5).
  * batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
    momentum=0.1, eps=1e-5): inference form only; training=True is refused.
"""
from __future__ import annotations

import math
import numbers

from .. import dtypes as _dt
from .. import plans as _plans
from ..dispatch import impl
from ..tensor import Size, Tensor, _view_strides, cached_contiguous_strides, new_contiguous, normalize_dim
from . import _methods

SUPPORTED_DTYPES = {n: ("float16", "bfloat16", "float32", "float64")
                    for n in ("softmax", "layer_norm", "rms_norm", "group_norm", "batch_norm")}

__all__ = ["softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm", "batch_norm",
           "add_rms_norm", "add_layer_norm"]


def _check_float(x, name, op):
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: {name} must be a Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point or x.dtype.is_float8:
        raise TypeError(f"{op}: {name} must have a float16, bfloat16, float32 or float64 "
                        f"dtype, got {x.dtype.name}")
    return x


def _check_param(p, name, shape, x, op):
    if p is None:
        return None
    _check_float(p, name, op)
    if p.device != x.device:
        raise ValueError(f"{op}: {name} is on {p.device} but input is on {x.device}")
    if tuple(p.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {tuple(p.shape)}")
    return p


def _merge(shape, stride):
    """Merge a run of dims into one (size, stride) if their strides allow, else None."""
    n = math.prod(shape)
    if n <= 1 or not shape:
        return n, 1
    st = _view_strides(tuple(shape), tuple(stride), (n,))
    return None if st is None else (n, st[0])


def _rows(t, d):
    """Describe t as rows around dim d: (R, R1, N, (s0, s1, sn)) or None if not viewable."""
    return _rows_of(t._shape, t._stride, d)


def _rows_of(shape, stride, d):
    pre = _merge(shape[:d], stride[:d])
    post = _merge(shape[d + 1:], stride[d + 1:])
    if pre is None or post is None:
        return None
    N = shape[d] if shape else 1
    sn = stride[d] if shape else 1
    return pre[0] * post[0], post[0], N, (pre[1], post[1], sn)


@_plans.memoize("ops.nn.softmax", 4096)
def _softmax_infer(in_dtype, shape, stride, dim, dtype, op):
    """softmax / log_softmax of an input of this dtype, shape and strides: the one validation,
    and everything the call derives from the input's kind:
    (d, out dtype, out shape, out strides, nbytes, rows, out row strides), `rows` the kernel's
    row description of the input (with the output's strides), or None where the input is
    first cast (an integer input with dtype=) or copied (a layout not viewable as rows)."""
    if dim is None:
        raise TypeError(f"{op}: dim must be given (an int), got None")
    d = normalize_dim(dim, len(shape))
    if dtype is not None:
        dtype = _dt.as_dtype(dtype)
    out_dtype = dtype if dtype is not None else in_dtype
    if not out_dtype.is_floating_point or out_dtype.is_float8:
        raise TypeError(f"{op}: expected a floating-point input or dtype=, got "
                        f"{out_dtype.name} (pass dtype=nbx.float32 for integer inputs)")
    oshape = shape if shape.__class__ is Size else Size(shape)
    ostride = cached_contiguous_strides(oshape)
    orows = _rows_of(oshape, ostride, d)[3]
    rows = _rows_of(shape, stride, d) if in_dtype.is_floating_point else None
    if rows is not None:
        rows = rows[:3] + (rows[3], orows)
    return d, out_dtype, oshape, ostride, math.prod(oshape) * out_dtype.itemsize, rows, orows


def _softmax(input, dim, dtype, log, op):  # noqa: A002
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    # (the inference's arguments are its cache key: an int dim and a DType or None)
    if dim is not None and dim.__class__ is not int:
        dim = normalize_dim(dim, input.ndim)
    if dtype is not None and dtype.__class__ is not _dt.DType:
        dtype = _dt.as_dtype(dtype)
    d, odt, oshape, ostride, nbytes, rows, orows = _softmax_infer(
        input._dtype, input._shape, input._stride, dim, dtype, op)
    dev = input._storage.device
    out = new_contiguous(oshape, ostride, odt, dev, nbytes)
    if not nbytes:
        return out
    x = input
    if rows is None:     # cast, or copy into rows, first
        if not x._dtype.is_floating_point:
            x = x.to(odt)
        r = _rows(x, d)
        if r is None:
            x = x.contiguous()
            r = _rows(x, d)
        rows = r[:3] + (r[3], orows)
    impl("softmax", dev)(out, x, rows, dim=d, log=log)
    return out


def softmax(input, dim=None, dtype=None, *, _stacklevel=None):  # noqa: A002
    return _softmax(input, dim, dtype, False, "softmax")


def log_softmax(input, dim=None, dtype=None, *, _stacklevel=None):  # noqa: A002
    return _softmax(input, dim, dtype, True, "log_softmax")


# ------------------------------------------------------------------ layer_norm / rms_norm
def _as_rows(t, k):
    """View t as [R, N] (N = product of the last k dims, unit stride), copying if needed."""
    R = math.prod(t.shape[:t.ndim - k])
    N = math.prod(t.shape[t.ndim - k:])
    st = _view_strides(tuple(t.shape), tuple(t.stride()), (R, N))
    if st is None or (N > 1 and st[1] != 1):
        t = t.contiguous()
        st = (N, 1)
    return t.as_strided((R, N), (st[0], 1), t.storage_offset())


@_plans.memoize("ops.nn.norm", 4096)
def _norm_infer(xk, ns, wk, bk, rk, op):
    """layer_norm / rms_norm (and their residual forms) of operands of these kinds
    (plans.kind: dtype, shape, strides, device; None for an absent one): the one validation,
    and (k, R, N, x's row stride or None where x is first copied, the weight's and the
    bias's element strides or None where they are first reshaped, the residual's row
    stride or None)."""
    xd, xs, xst, dev = xk
    if not xd.is_floating_point or xd.is_float8:
        raise TypeError(f"{op}: input must have a float16, bfloat16, float32 or float64 "
                        f"dtype, got {xd.name}")
    if ns.__class__ is int:
        ns = (ns,)
    ns = tuple(int(n) for n in ns)
    k = len(ns)
    if k == 0 or k > len(xs) or tuple(xs[len(xs) - k:]) != ns:
        raise ValueError(f"{op}: normalized_shape {ns} must match the last {k} dims of the "
                         f"input of shape {tuple(xs)}")
    R = math.prod(xs[:len(xs) - k])
    N = math.prod(ns)

    def row_stride(shape, stride):
        st = _view_strides(tuple(shape), tuple(stride), (R, N))
        return None if st is None or (N > 1 and st[1] != 1) else st[0]

    def flat(pk, name):
        if pk is None:
            return None
        pd, ps, pst, pdev = pk
        if not pd.is_floating_point or pd.is_float8:
            raise TypeError(f"{op}: {name} must have a float16, bfloat16, float32 or float64 "
                            f"dtype, got {pd.name}")
        if pdev != dev:
            raise ValueError(f"{op}: {name} is on {pdev} but input is on {dev}")
        if tuple(ps) != ns:
            raise ValueError(f"{op}: {name} must have shape {ns}, got {tuple(ps)}")
        st = _view_strides(tuple(ps), tuple(pst), (N,))
        return None if st is None else st[0]
    ws, bs = flat(wk, "weight"), flat(bk, "bias")
    rs = None
    if rk is not None:
        rd, rsh, rst, rdev = rk
        if rd is not xd or tuple(rsh) != tuple(xs) or rdev != dev:
            raise ValueError(f"{op}: residual must match input (shape {tuple(xs)}, "
                             f"{xd.name}, {dev}), got shape {tuple(rsh)}, {rd.name}, {rdev}")
        rs = row_stride(rsh, rst)
    return k, R, N, row_stride(xs, xst), ws, bs, rs


def _kind(t, name, op):
    if t is None:
        return None
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
    return (t._dtype, t._shape, t._stride, t._storage.device)


def _rows_view(t, rs, k, R, N):
    """t as (R, N) rows: a view with row stride rs, or (rs None) through _as_rows."""
    if rs is None:
        return _as_rows(t, k)
    return Tensor._make(t._storage, (R, N), (rs, 1), t._offset, t._dtype)


def _flat_view(p, st, N):
    if p is None:
        return None
    if st is None:
        return p.reshape(-1)
    return Tensor._make(p._storage, (N,), (st,), p._offset, p._dtype)


def _norm(x, ns, weight, bias, eps, residual, rms, op):
    if ns.__class__ is int or ns.__class__ is tuple:
        ns_key = ns
    elif isinstance(ns, numbers.Integral):
        ns_key = int(ns)
    else:
        ns_key = tuple(ns)
    k, R, N, xs, ws, bs, rs = _norm_infer(
        _kind(x, "input", op), ns_key, _kind(weight, "weight", op), _kind(bias, "bias", op),
        _kind(residual, "residual", op), op)
    if eps is None:
        eps = _dt.finfo(x._dtype).eps
    elif eps.__class__ is not float and not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: eps must be a number, got {type(eps).__name__}")
    dev = x._storage.device
    out = Tensor._empty(x._shape, x._dtype, dev)
    h = Tensor._empty(x._shape, x._dtype, dev) if residual is not None else None
    if R and N:
        orow = Tensor._make(out._storage, (R, N), (N, 1), out._offset, out._dtype)
        args = (orow, _rows_view(x, xs, k, R, N))
        w = _flat_view(weight, ws, N)
        kw = {}
        if residual is not None:
            kw = dict(residual=_rows_view(residual, rs, k, R, N),
                      h_out=Tensor._make(h._storage, (R, N), (N, 1), h._offset, h._dtype))
        if rms:
            impl("rms_norm", dev)(*args, w, float(eps), **kw)
        else:
            impl("layer_norm", dev)(*args, w, _flat_view(bias, bs, N), float(eps), **kw)
    return out if residual is None else (out, h)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):  # noqa: A002
    return _norm(input, normalized_shape, weight, bias, eps, None, False, "layer_norm")


def rms_norm(input, normalized_shape, weight=None, eps=None):  # noqa: A002
    return _norm(input, normalized_shape, weight, None, eps, None, True, "rms_norm")


def add_rms_norm(input, residual, weight, eps=None):  # noqa: A002
    """(rms_norm(input + residual, weight), input + residual) in one pass (extension).

    The normalised shape is the last dim (weight's shape, or the last dim when weight is None)."""
    ns = tuple(weight.shape) if isinstance(weight, Tensor) else (input.shape[-1],)
    return _norm(input, ns, weight, None, eps, residual, True, "add_rms_norm")


def add_layer_norm(input, residual, weight, bias=None, eps=1e-5):  # noqa: A002
    """(layer_norm(input + residual, weight, bias), input + residual) in one pass (extension)."""
    ns = tuple(weight.shape) if isinstance(weight, Tensor) else (input.shape[-1],)
    return _norm(input, ns, weight, bias, eps, residual, False, "add_layer_norm")


# ------------------------------------------------------------------ group_norm / batch_norm
def _nchw(x, op):
    """x (N, C, *) as a contiguous (N, C, HW) view (copying if needed)."""
    if x.ndim < 2:
        raise ValueError(f"{op}: expected an input of shape (N, C, *), got {tuple(x.shape)}")
    n, c = x.shape[:2]
    hw = math.prod(x.shape[2:])
    x = x.contiguous()
    return x.as_strided((n, c, hw), (c * hw, hw, 1), x.storage_offset())


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):  # noqa: A002
    op = "group_norm"
    _check_float(input, "input", op)
    if input.ndim < 2:
        raise ValueError(f"{op}: expected an input of shape (N, C, *), got {tuple(input.shape)}")
    C = input.shape[1]
    if not isinstance(num_groups, numbers.Integral) or num_groups <= 0 or C % num_groups:
        raise ValueError(f"{op}: num_groups must be a positive int dividing the {C} channels, "
                         f"got {num_groups!r}")
    weight = _check_param(weight, "weight", (C,), input, op)
    bias = _check_param(bias, "bias", (C,), input, op)
    out = Tensor._empty(input.shape, input.dtype, input.device)
    if out.numel():
        impl("group_norm", input.device)(_nchw(out, op), _nchw(input, op), int(num_groups),
                                         weight, bias, float(eps))
    return out


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,  # noqa: A002
               momentum=0.1, eps=1e-5):
    op = "batch_norm"
    _check_float(input, "input", op)
    if training:
        raise NotImplementedError("batch_norm: only the inference form (training=False, with "
                                  "running_mean and running_var) is implemented")
    if input.ndim < 2:
        raise ValueError(f"{op}: expected an input of shape (N, C, *), got {tuple(input.shape)}")
    C = input.shape[1]
    if running_mean is None or running_var is None:
        raise ValueError(f"{op}: running_mean and running_var are required when training=False")
    running_mean = _check_param(running_mean, "running_mean", (C,), input, op)
    running_var = _check_param(running_var, "running_var", (C,), input, op)
    weight = _check_param(weight, "weight", (C,), input, op)
    bias = _check_param(bias, "bias", (C,), input, op)
    out = Tensor._empty(input.shape, input.dtype, input.device)
    if out.numel():
        impl("batch_norm", input.device)(_nchw(out, op), _nchw(input, op), running_mean,
                                         running_var, weight, bias, float(eps))
    return out


_methods.install(softmax=lambda self, dim=None, dtype=None: softmax(self, dim, dtype),
                 log_softmax=lambda self, dim=None, dtype=None: log_softmax(self, dim, dtype))
