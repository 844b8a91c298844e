"""Matrix products: matmul, mm, bmm, mv, addmm, baddbmm, linear, dot, outer, fused_linear.

Every product is reduced here to one 4-D strided problem
    out[B0, B1, M, N] = act(alpha * a[B0, B1, M, K] @ b[B0, B1, K, N] + bias[N])
                        + beta * residual[B0, B1, M, N]
where broadcast batch dims have stride 0 and transposes are only strides: inputs are
never copied. `dispatch.impl("matmul", device)` fills `out`.

fp32 policy (documented in docs/design/matmul-and-gemv.md): by default fp32 products are full
IEEE fp32 (`tl.dot(..., input_precision="ieee")`), as torch's default. Call
`nbx.set_float32_matmul_precision("high")` (or "medium") to allow TF32 tensor cores,
"highest" to go back. fp16/bf16 always accumulate in fp32.

This module is also the `nbx.linalg` namespace (`nbx.linalg.vector_norm`, ...).
"""
from __future__ import annotations

import math
import numbers

from .. import plans as _plans
from ..dispatch import impl
from ..tensor import Size, Tensor, _view_strides, broadcast_shapes, cached_contiguous_strides, \
    new_contiguous
from . import _methods
from ._common import check_out as _check_out, check_tensor, out_overlaps

__all__ = ["matmul", "mm", "bmm", "mv", "addmm", "baddbmm", "linear", "dot", "outer", "ger",
           "inner", "fused_linear", "set_float32_matmul_precision",
           "get_float32_matmul_precision"]

# for docs/ops.md: integer products run on cpu only (cuda/interp refuse them)
SUPPORTED_DTYPES = {"matmul": ("float16", "bfloat16", "float32", "float64", "uint8", "int8",
                               "int16", "int32", "int64")}

_PRECISIONS = {"highest": "ieee", "high": "tf32", "medium": "tf32"}
_fp32_precision = "highest"


def set_float32_matmul_precision(precision: str) -> None:
    """torch's switch: 'highest' (IEEE fp32, default) or 'high'/'medium' (TF32 allowed)."""
    global _fp32_precision
    if precision not in _PRECISIONS:
        raise ValueError(f"set_float32_matmul_precision: precision must be one of "
                         f"{sorted(_PRECISIONS)}, got {precision!r}")
    _fp32_precision = precision


def get_float32_matmul_precision() -> str:
    return _fp32_precision


_ACTIVATIONS = (None, "none", "gelu", "gelu_tanh", "silu", "relu")


# ------------------------------------------------------------------ validation helpers
def _check_pair(a, b, op, an="input", bn="other"):
    check_tensor(a, an, op), check_tensor(b, bn, op)
    if a.device != b.device:
        raise ValueError(f"{op}: {an} is on {a.device} but {bn} is on {b.device}; "
                         f"expected both on one device")
    if a.dtype is not b.dtype:
        raise TypeError(f"{op}: expected {an} and {bn} to have the same dtype, got "
                        f"{a.dtype.name} and {b.dtype.name}")
    if a.dtype.kind == "b" or a.dtype.is_float8:
        raise TypeError(f"{op}: dtype {a.dtype.name} is not supported (expected a float "
                        f"or integer dtype)")


def _batch_views(ts, batch):
    """Collapse the batch dims of tensors (all expanded to `batch`) as far as strides allow.

    Size-1 dims are dropped; adjacent dims i-1, i merge when every tensor has
    stride[i-1] == stride[i] * size[i] (stride-0 broadcast dims merge with each other).
    Returns (shapes, strides-per-tensor).
    """
    keep = [i for i, n in enumerate(batch) if n != 1]
    shapes = [batch[i] for i in keep]
    strides = [[t.stride()[i] for i in keep] for t in ts]
    i = len(shapes) - 1
    while i > 0:
        if all(s[i - 1] == s[i] * shapes[i] for s in strides):
            shapes[i] *= shapes[i - 1]
            del shapes[i - 1]
            for s in strides:
                del s[i - 1]
        i -= 1
    return shapes, strides


def _product(a, b, out, *, bias=None, residual=None, alpha=1.0, beta=1.0, activation=None,
             op="matmul"):
    """Batched core: a (*batch, M, K), b (*batch, K, N), out (*batch, M, N), all already
    broadcast to one batch shape; residual broadcast to out's shape or None."""
    batch = tuple(out._shape[:-2])
    M, N = out._shape[-2:]
    K = a._shape[-1]
    ts = [a, b, out] + ([residual] if residual is not None else [])
    shapes, strides = _batch_views(ts, batch)
    if len(shapes) > 2:   # strides cannot be merged: loop over the outermost dim
        for i in range(batch[0]):
            _product(a[i], b[i], out[i], bias=bias,
                     residual=residual[i] if residual is not None else None,
                     alpha=alpha, beta=beta, activation=activation, op=op)
        return out
    shapes = [1] * (2 - len(shapes)) + shapes
    views = []
    for t, s, (r, c) in zip(ts, strides, [(M, K), (K, N), (M, N), (M, N)]):
        s = [0] * (2 - len(s)) + s
        # the same elements as t (batch dims merged or broadcast), so no bounds to re-check:
        # built directly (as_strided re-validates at ~4 us a view)
        views.append(t._view((shapes[0], shapes[1], r, c), (s[0], s[1]) + t._stride[-2:]))
    a4, b4, o4 = views[:3]
    r4 = views[3] if residual is not None else None
    if alpha is None:
        alpha = 1.0
    impl("matmul", out.device)(o4, a4, b4, bias=bias, residual=r4, alpha=alpha, beta=beta,
                               activation=activation,
                               precision=_PRECISIONS[_fp32_precision])
    return out


def _fold_batch_into_m(a):
    """(…, M, K) viewed as (prod(…)*M, K) when the strides allow (no copy), else None."""
    if a.ndim <= 2:
        return a
    shape = (math.prod(a.shape[:-1]), a.shape[-1])
    st = _view_strides(a.shape, a.stride(), shape)
    return None if st is None else a._view(shape, st)    # a view of a's own elements


def _scalar(x, name, op):
    if isinstance(x, Tensor):
        if x.numel() != 1:
            raise ValueError(f"{op}: {name} must be a number, got a tensor of shape {tuple(x.shape)}")
        x = x.item()
    if not isinstance(x, numbers.Number) or isinstance(x, complex):
        raise TypeError(f"{op}: {name} must be a real number, got {type(x).__name__}")
    return float(x)


# ------------------------------------------------------------------ the ops
def matmul(input, other, *, out=None):  # noqa: A002 - torch's names
    """torch.matmul: 1-D/2-D/batched with broadcast batch dims."""
    a, b = input, other
    _check_pair(a, b, "matmul")
    if a.dtype.kind == "c":
        from .complex import matmul_complex
        return matmul_complex(a, b, out=out)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: both arguments need at least 1 dim, got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    if a.ndim == 1 and b.ndim == 1:
        return dot(a, b, out=out)
    a2 = a.unsqueeze(0) if a.ndim == 1 else a
    b2 = b.unsqueeze(-1) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be "
                         f"multiplied ({a2.shape[-2]}x{a2.shape[-1]} and "
                         f"{b2.shape[-2]}x{b2.shape[-1]})")
    M, K, N = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    batch = tuple(broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    shape = batch + (M, N)
    final = list(shape)
    if a.ndim == 1:
        del final[-2]
    if b.ndim == 1:
        del final[-1]
    o = _check_out(out, final, a.dtype, a.device, "matmul")
    if out_overlaps(out, a, b):          # the kernels read a and b while they write out
        return out.copy_(matmul(a, b))
    o_full = o.reshape(shape) if out is None else _unsqueeze_out(o, a.ndim == 1, b.ndim == 1)
    if o.numel() == 0:
        return o
    if b2.ndim == 2 and a2.ndim > 2 and out is None:
        # (..., M, K) @ (K, N): one big (prod*M, K) @ (K, N) when a's layout allows
        af = _fold_batch_into_m(a2)
        if af is not None:
            _product(af, b2, o_full.reshape(af.shape[0], N), op="matmul")
            return o
    _product(a2.expand(batch + (M, K)), b2.expand(batch + (K, N)), o_full, op="matmul")
    return o


def _unsqueeze_out(o, a1, b1):
    if a1:
        o = o.unsqueeze(-2)
    if b1:
        o = o.unsqueeze(-1)
    return o


def _mm_like(input, mat2, out, op, ndim):
    # mm and bmm: matmul restricted to exactly `ndim`-D operands (bmm: equal batch sizes)
    _check_pair(input, mat2, op, "input", "mat2")
    if input.ndim != ndim or mat2.ndim != ndim:
        raise ValueError(f"{op}: expected {ndim}-D tensors, got shapes {tuple(input.shape)} and "
                         f"{tuple(mat2.shape)}")
    if ndim == 3 and input.shape[0] != mat2.shape[0]:
        raise ValueError(f"{op}: batch sizes differ: {input.shape[0]} and {mat2.shape[0]}")
    _same_k(input, mat2, op)
    return matmul(input, mat2, out=out)


def mm(input, mat2, *, out=None):  # noqa: A002
    return _mm_like(input, mat2, out, "mm", 2)


def _same_k(a, b, op):
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be "
                         f"multiplied ({a.shape[-2]}x{a.shape[-1]} and "
                         f"{b.shape[-2]}x{b.shape[-1]})")
    return True


def bmm(input, mat2, *, out=None):  # noqa: A002
    return _mm_like(input, mat2, out, "bmm", 3)


def mv(input, vec, *, out=None):  # noqa: A002
    _check_pair(input, vec, "mv", "input", "vec")
    if input.ndim != 2 or vec.ndim != 1:
        raise ValueError(f"mv: expected a 2-D input and a 1-D vec, got shapes "
                         f"{tuple(input.shape)} and {tuple(vec.shape)}")
    return matmul(input, vec, out=out)


def dot(input, other, *, out=None):  # noqa: A002
    _check_pair(input, other, "dot")
    if input.ndim != 1 or other.ndim != 1 or input.shape[0] != other.shape[0]:
        raise ValueError(f"dot: expected two 1-D tensors of one length, got shapes "
                         f"{tuple(input.shape)} and {tuple(other.shape)}")
    o = _check_out(out, (), input.dtype, input.device, "dot")
    if out_overlaps(out, input, other):
        return out.copy_(dot(input, other))
    K = input.shape[0]
    _product(input.as_strided((1, K), (0, input.stride(0)), input.storage_offset()),
             other.as_strided((K, 1), (other.stride(0), 0), other.storage_offset()),
             o.as_strided((1, 1), (0, 0), o.storage_offset()), op="dot")
    return o


def inner(input, other, *, out=None):  # noqa: A002
    if isinstance(input, Tensor) and isinstance(other, Tensor) and input.ndim == 1 and other.ndim == 1:
        return dot(input, other, out=out)
    _check_pair(input, other, "inner")
    if input.ndim == 0 or other.ndim == 0:
        raise ValueError("inner: 0-dim operands are not supported (use mul)")
    if other.ndim > 2:
        raise NotImplementedError(f"inner: an `other` with more than 2 dims is not supported, "
                                  f"got shape {tuple(other.shape)}")
    return matmul(input, other.mT if other.ndim == 2 else other, out=out)


def outer(input, vec2, *, out=None):  # noqa: A002
    check_tensor(input, "input", "outer"), check_tensor(vec2, "vec2", "outer")
    if input.device != vec2.device:
        raise ValueError(f"outer: input is on {input.device} but vec2 is on {vec2.device}; "
                         f"expected both on one device")
    if input.ndim != 1 or vec2.ndim != 1:
        raise ValueError(f"outer: expected 1-D tensors, got shapes {tuple(input.shape)} and "
                         f"{tuple(vec2.shape)}")
    # a broadcast multiply: exact, and torch's type promotion (outer(int64, float32) is
    # float32), which a matrix product of mixed dtypes would refuse
    from .elementwise import mul
    return mul(input.unsqueeze(1), vec2.unsqueeze(0), out=out)


ger = outer


def addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):  # noqa: A002
    """beta * input + alpha * (mat1 @ mat2); input broadcasts to (M, N). beta=0 ignores input."""
    _check_pair(mat1, mat2, "addmm", "mat1", "mat2")
    if mat1.ndim != 2 or mat2.ndim != 2:
        raise ValueError(f"addmm: expected 2-D mat1 and mat2, got shapes {tuple(mat1.shape)} "
                         f"and {tuple(mat2.shape)}")
    return _addmm_like(input, mat1, mat2, beta, alpha, out, "addmm")


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):  # noqa: A002
    _check_pair(batch1, batch2, "baddbmm", "batch1", "batch2")
    if batch1.ndim != 3 or batch2.ndim != 3 or batch1.shape[0] != batch2.shape[0]:
        raise ValueError(f"baddbmm: expected 3-D batch1 and batch2 with one batch size, got "
                         f"shapes {tuple(batch1.shape)} and {tuple(batch2.shape)}")
    return _addmm_like(input, batch1, batch2, beta, alpha, out, "baddbmm")


def _addmm_like(input, m1, m2, beta, alpha, out, op):
    _check_pair(m1, input, op, "mat1", "input")
    _same_k(m1, m2, op)
    beta, alpha = _scalar(beta, "beta", op), _scalar(alpha, "alpha", op)
    shape = tuple(m1.shape[:-1]) + (m2.shape[-1],)
    try:
        r = input.expand(shape)
    except ValueError:
        raise ValueError(f"{op}: input of shape {tuple(input.shape)} cannot be broadcast to "
                         f"the product's shape {shape}") from None
    o = _check_out(out, shape, m1.dtype, m1.device, op)
    if out_overlaps(out, input, m1, m2):
        return out.copy_(_addmm_like(input, m1, m2, beta, alpha, None, op))
    if o.numel():
        _product(m1, m2, o, residual=r if beta != 0 else None, alpha=alpha, beta=beta, op=op)
    return o


# Plans of the common linear call (input of >= 2 dims whose batch folds into M, a 2-D weight,
# bias None or 1-D, no residual): everything the full path derives -- the checks' verdict,
# the output's shape and the 4-D views handed to the matmul impl -- depends only on the key
# (dtypes, shapes, strides, devices, activation, fp32 precision), so a hit allocates (or takes
# an `out=` of exactly the planned shape, contiguous strides, dtype and device), builds the
# views and dispatches. The values passed on (tensors, offsets) are per call.
_LIN_PLANS = _plans.PlanCache("ops.linalg.linear", 4096)
_S11 = (1, 1)


def _lin_key(input, weight, bias, activation):  # noqa: A002
    # plans.kinds(input, weight, bias) + (activation, precision), spelled out: this runs on
    # every call, and the helper's loop costs more than the whole lookup
    if bias is None:
        bk = None
    elif bias.__class__ is Tensor:
        bk = (bias._dtype, bias._shape, bias._stride, bias._storage.device)
    else:
        return None
    return (input._dtype, input._shape, input._stride, input._storage.device, weight._dtype,
            weight._shape, weight._stride, weight._storage.device, bk, activation,
            _fp32_precision)


def _lin_plan(key, input, weight, bias, o):  # noqa: A002
    """Record the plan after the full path accepted the call (None: not the common case)."""
    if input.ndim < 2 or weight.ndim != 2 or o.numel() == 0 or (bias is not None and bias.ndim != 1):
        return
    M = math.prod(input._shape[:-1])
    K = input._shape[-1]
    N = weight._shape[0]
    # (2-D: the input's own strides, as the full path passes them)
    st = input._stride if input.ndim == 2 else _view_strides(input._shape, input._stride, (M, K))
    if st is None:
        return
    a4 = (Size(_S11 + (M, K)), (0, 0) + tuple(st))
    b4 = (Size(_S11 + (K, N)), (0, 0, weight._stride[1], weight._stride[0]))
    o4 = (Size(_S11 + (M, N)), (0, 0, N, 1))
    final = o._shape
    _LIN_PLANS.put(key, (final, cached_contiguous_strides(final), M * N * o._dtype.itemsize,
                         a4, b4, o4, _PRECISIONS[_fp32_precision]))


def fused_linear(input, weight, bias=None, *, activation=None, residual=None, out=None):  # noqa: A002
    """act(input @ weight.T + bias) + residual in one kernel (extension of F.linear).

    activation: None, 'gelu' (erf), 'gelu_tanh', 'silu' or 'relu'. residual broadcasts to
    the output shape and is added after the activation.
    """
    if (residual is None and input.__class__ is Tensor
            and weight.__class__ is Tensor and (activation is None or activation.__class__ is str)):
        key = _lin_key(input, weight, bias, activation)
        if key is not None:
            plan = _LIN_PLANS.get(key)
            if plan is None:
                o = _fused_linear(input, weight, bias, activation, None, out)
                _lin_plan(key, input, weight, bias, o)
                return o
            final, fstride, nbytes, a4, b4, o4, prec = plan
            dt = input._dtype
            dev = input._storage.device
            if out is None:
                o = new_contiguous(final, fstride, dt, dev, nbytes)
            elif (out.__class__ is Tensor and out._shape == final and out._stride == fstride
                    and out._dtype is dt and out._storage.device == dev
                    and not out_overlaps(out, input, weight, bias)):
                o = out     # what check_out accepts, laid out as the plan's output view
            else:
                return _fused_linear(input, weight, bias, activation, None, out)
            _make = Tensor._make
            impl("matmul", dev)(_make(o._storage, o4[0], o4[1], o._offset, dt),
                                _make(input._storage, a4[0], a4[1], input._offset, dt),
                                _make(weight._storage, b4[0], b4[1], weight._offset, dt),
                                bias=bias, residual=None, alpha=1.0, beta=1.0,
                                activation=activation, precision=prec)
            return o
    return _fused_linear(input, weight, bias, activation, residual, out)


def _fused_linear(input, weight, bias, activation, residual, out):  # noqa: A002
    op = "linear"
    _check_pair(input, weight, op, "input", "weight")
    if weight.ndim not in (1, 2):
        raise ValueError(f"linear: weight must be 1-D or 2-D [out_features, in_features], got "
                         f"shape {tuple(weight.shape)}")
    if input.ndim == 0:
        raise ValueError("linear: input must have at least 1 dim, got a 0-dim tensor")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {_ACTIVATIONS}, got {activation!r}")
    K = input.shape[-1]
    if weight.shape[-1] != K:
        raise ValueError(f"linear: input has {K} features (last dim of shape "
                         f"{tuple(input.shape)}) but weight has shape {tuple(weight.shape)}; "
                         f"expected weight [out_features, {K}]")
    w1 = weight.ndim == 1
    # (K, N); weight.t() built directly (transpose re-normalises its dims at ~3 us)
    wt = weight.unsqueeze(1) if w1 else weight._view(
        (weight._shape[1], weight._shape[0]), (weight._stride[1], weight._stride[0]))
    N = wt.shape[1]
    if bias is not None:
        _check_pair(input, bias, op, "input", "bias")
        if bias.ndim > 1 or (bias.ndim == 1 and bias.shape[0] != N) :
            raise ValueError(f"linear: bias must have shape ({N},), got {tuple(bias.shape)}")
        bias = bias.expand(N) if bias.ndim == 0 else bias
    x = input.unsqueeze(0) if input.ndim == 1 else input
    shape = tuple(x.shape[:-1]) + (N,)
    final = tuple(input.shape[:-1]) + (() if w1 else (N,))
    r = None
    if residual is not None:
        _check_pair(input, residual, op, "input", "residual")
        try:
            r = residual.expand(final).reshape(shape) if residual.ndim else residual.expand(shape)
        except (ValueError, RuntimeError):
            raise ValueError(f"linear: residual of shape {tuple(residual.shape)} cannot be "
                             f"broadcast to the output shape {final}") from None
    o = _check_out(out, final, input.dtype, input.device, op)
    if out_overlaps(out, input, weight, bias, residual):
        return out.copy_(_fused_linear(input, weight, bias, activation, residual, None))
    if o.numel() == 0:
        return o
    if shape == final:      # input has >= 2 dims and weight 2: o already has the shape
        o_full = o
    else:
        o_full = o.view(shape) if not w1 else o.unsqueeze(-1).view(shape)   # never a copy
    xf = _fold_batch_into_m(x)
    if xf is not None:
        rf = _fold_batch_into_m(r) if r is not None else None
        of = _fold_batch_into_m(o_full)
        if of is not None and (r is None or rf is not None):
            _product(xf, wt, of, bias=bias, residual=rf, activation=activation, op=op)
            return o
    batch = tuple(x.shape[:-2])
    _product(x, wt.expand(batch + (K, N)), o_full, bias=bias, residual=r,
             activation=activation, op=op)
    return o


def linear(input, weight, bias=None, *, activation=None, residual=None, out=None):  # noqa: A002
    """torch.nn.functional.linear: input @ weight.T + bias, weight [out_features, in_features].

    Extension: activation= ('gelu', 'gelu_tanh', 'silu', 'relu') and residual= are fused into
    the store (see fused_linear)."""
    if getattr(weight, "_nbx_quantized", False):      # ops/quantized.QuantizedTensor
        if activation is not None or residual is not None or out is not None:
            raise ValueError("linear: activation=, residual= and out= are not supported with "
                             "a QuantizedTensor weight")
        from .quantized import linear as _qlinear
        return _qlinear(input, weight, bias)
    return fused_linear(input, weight, bias, activation=activation, residual=residual, out=out)


def __getattr__(name):
    # nbx.linalg.vector_norm & co. live with the reductions; re-exported lazily
    # (norm is torch.linalg.norm -- matrix norms for a 2-D dim -- not torch.norm)
    _names = {"vector_norm": "vector_norm", "norm": "linalg_norm", "matrix_norm": "matrix_norm"}
    if name in _names:
        from . import reduction
        return getattr(reduction, _names[name])
    raise AttributeError(f"module 'nbxtensor.linalg' has no attribute {name!r}")


def _method_matmul(self, other):
    return matmul(self, other)


def _method_rmatmul(self, other):
    if not isinstance(other, Tensor):
        return NotImplemented
    return matmul(other, self)


_methods.install(matmul=_method_matmul, mm=lambda self, mat2: mm(self, mat2),
                 bmm=lambda self, mat2: bmm(self, mat2), mv=lambda self, vec: mv(self, vec),
                 dot=lambda self, other: dot(self, other),
                 outer=lambda self, vec2: outer(self, vec2), ger=lambda self, vec2: outer(self, vec2),
                 inner=lambda self, other: inner(self, other),
                 addmm=lambda self, mat1, mat2, *, beta=1, alpha=1: addmm(self, mat1, mat2,
                                                                          beta=beta, alpha=alpha),
                 baddbmm=lambda self, b1, b2, *, beta=1, alpha=1: baddbmm(self, b1, b2,
                                                                          beta=beta, alpha=alpha),
                 __matmul__=_method_matmul, __rmatmul__=_method_rmatmul)
