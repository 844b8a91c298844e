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
    pre = _merge(t.shape[:d], t.stride()[:d])
    post = _merge(t.shape[d + 1:], t.stride()[d + 1:])
    if pre is None or post is None:
        return None
    N = t.shape[d] if t.ndim else 1
    sn = t.stride()[d] if t.ndim else 1
    return pre[0] * post[0], post[0], N, (pre[1], post[1], sn)


# Plans of the common call (a float tensor viewable as rows, dim an int, dtype None or a
# DType): (input dtype, shape, strides, dim, dtype, log, device) -> (d, out dtype, out shape,
# out strides, nbytes, rows). Everything the full path derives from the input depends only
# on these, so a hit skips it; a miss runs the full path and records its result.
_SMX_PLANS: dict = {}
_SMX_MAX = 4096


def _softmax(input, dim, dtype, log, op):  # noqa: A002
    if input.__class__ is Tensor and dim.__class__ is int:
        dev = input._storage.device
        key = (input._dtype, input._shape, input._stride, dim, dtype, log, dev)
        plan = _SMX_PLANS.get(key)
        if plan is not None:
            d, odt, oshape, ostride, nbytes, rows = plan
            out = new_contiguous(oshape, ostride, odt, dev, nbytes)
            if nbytes:
                impl("softmax", dev)(out, input, rows, dim=d, log=log)
            return out
        out = _softmax_full(input, dim, dtype, log, op)
        if (input._dtype.is_floating_point and out._shape.__class__ is Size
                and (dtype is None or dtype.__class__ is _dt.DType)):
            d = normalize_dim(dim, input.ndim)
            rows = _rows(input, d)
            if rows is not None:    # (a layout that needs a copy first keeps the full path)
                orows = _rows(out, d)
                if len(_SMX_PLANS) >= _SMX_MAX:
                    _SMX_PLANS.clear()
                _SMX_PLANS[key] = (d, out._dtype, out._shape, cached_contiguous_strides(out._shape),
                                   out.numel() * out._dtype.itemsize,
                                   rows[:3] + (rows[3], orows[3]))
        return out
    return _softmax_full(input, dim, dtype, log, op)


def _softmax_full(input, dim, dtype, log, op):  # noqa: A002
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    if dim is None:
        raise TypeError(f"{op}: dim must be given (an int), got None")
    d = normalize_dim(dim, input.ndim)
    if dtype is not None:
        dtype = _dt.as_dtype(dtype)
    out_dtype = dtype if dtype is not None else input.dtype
    if not out_dtype.is_floating_point or out_dtype.is_float8:
        raise TypeError(f"{op}: expected a floating-point input or dtype=, got "
                        f"{out_dtype.name} (pass dtype=nbx.float32 for integer inputs)")
    x = input if input.dtype.is_floating_point else input.to(out_dtype)  # integer + dtype=
    rows = _rows(x, d)
    if rows is None:
        x = x.contiguous()
        rows = _rows(x, d)
    out = Tensor._empty(input.shape, out_dtype, input.device)
    if out.numel():
        orows = _rows(out, d)
        impl("softmax", input.device)(out, x, rows[:3] + (rows[3], orows[3]),
                                          dim=d, log=log)
    return out


def softmax(input, dim=None, dtype=None, *, _stacklevel=None):  # noqa: A002
    return _softmax(input, dim, dtype, False, "softmax")


def log_softmax(input, dim=None, dtype=None, *, _stacklevel=None):  # noqa: A002
    return _softmax(input, dim, dtype, True, "log_softmax")


# ------------------------------------------------------------------ layer_norm / rms_norm
def _norm_shape(normalized_shape, x, op):
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (int(normalized_shape),)
    ns = tuple(int(n) for n in normalized_shape)
    k = len(ns)
    if k == 0 or k > x.ndim or tuple(x.shape[x.ndim - k:]) != ns:
        raise ValueError(f"{op}: normalized_shape {ns} must match the last {k} dims of the "
                         f"input of shape {tuple(x.shape)}")
    return ns


def _as_rows(t, k):
    """View t as [R, N] (N = product of the last k dims, unit stride), copying if needed."""
    R = math.prod(t.shape[:t.ndim - k])
    N = math.prod(t.shape[t.ndim - k:])
    st = _view_strides(tuple(t.shape), tuple(t.stride()), (R, N))
    if st is None or (N > 1 and st[1] != 1):
        t = t.contiguous()
        st = (N, 1)
    return t.as_strided((R, N), (st[0], 1), t.storage_offset())


def _norm(x, ns, weight, bias, eps, residual, rms, op):
    _check_float(x, "input", op)
    ns = _norm_shape(ns, x, op)
    weight = _check_param(weight, "weight", ns, x, op)
    bias = _check_param(bias, "bias", ns, x, op)
    if eps is None:
        eps = _dt.finfo(x.dtype).eps
    if not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: eps must be a number, got {type(eps).__name__}")
    k = len(ns)
    out = Tensor._empty(x.shape, x.dtype, x.device)
    h = None
    if residual is not None:
        if not isinstance(residual, Tensor):
            raise TypeError(f"{op}: residual must be a Tensor, got {type(residual).__name__}")
        if residual.dtype is not x.dtype or tuple(residual.shape) != tuple(x.shape) \
                or residual.device != x.device:
            raise ValueError(f"{op}: residual must match input (shape {tuple(x.shape)}, "
                             f"{x.dtype.name}, {x.device}), got shape {tuple(residual.shape)}, "
                             f"{residual.dtype.name}, {residual.device}")
        h = Tensor._empty(x.shape, x.dtype, x.device)
    if out.numel():
        w = weight.reshape(-1) if weight is not None else None
        b = bias.reshape(-1) if bias is not None else None
        args = (_as_rows(out, k), _as_rows(x, k))
        kw = {}
        if residual is not None:
            kw = dict(residual=_as_rows(residual, k), h_out=_as_rows(h, k))
        if rms:
            impl("rms_norm", x.device)(*args, w, float(eps), **kw)
        else:
            impl("layer_norm", x.device)(*args, w, b, float(eps), **kw)
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
