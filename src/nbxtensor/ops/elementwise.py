"""Element-wise ops: unary, activations, binary, ternary, and the Python operators.

Every op follows one path (`_run`): validate the operands (tensors or Python numbers),
work out the result dtype with torch's promotion (`result_type`, which knows about
Python scalars and 0-dim tensors) and the broadcast shape, allocate the output (or
check `out=` / the in-place target), and dispatch

    impl(name, device)(out, inputs, params, compute_dtype)

where `inputs` are tensors already expanded to the output shape (stride 0 where
broadcast, never materialised) or Python numbers, `params` two op parameters (alpha,
negative_slope, ...), and `compute_dtype` the dtype the op computes in: float32 for
every float narrower than float64 (so a float16 add rounds once), the result dtype
otherwise. The backends convert each input to it, apply the op, and cast the result
to `out`'s dtype with the documented cast rules.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from ..dispatch import impl
from ..tensor import Tensor, broadcast_shapes, normalize_dim
from . import _methods

__all__ = [
    # unary
    "abs", "absolute", "neg", "negative", "sign", "exp", "exp2", "expm1", "log", "log2", "log10",
    "log1p", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan", "tanh", "sigmoid", "erf",
    "floor", "ceil", "round", "trunc", "isnan", "isinf", "isfinite", "logical_not",
    "bitwise_not", "nan_to_num", "clamp", "clip", "clamp_min", "clamp_max", "square",
    # activations
    "relu", "gelu", "silu", "mish", "softplus", "elu", "leaky_relu", "hardswish", "hardsigmoid",
    "glu",
    # binary
    "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "floor_divide",
    "remainder", "fmod", "pow", "maximum", "minimum", "atan2", "eq", "ne", "lt", "le", "gt",
    "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
    "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
    # ternary
    "where", "lerp", "addcmul", "addcdiv",
    # casts
    "can_cast",
]

_NUMBER = (bool, int, float, complex, np.bool_, np.integer, np.floating, np.complexfloating)


# ----------------------------------------------------------------------------- helpers
def _category(d) -> int:
    return {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}[d.kind]


def can_cast(from_, to) -> bool:
    """torch.can_cast: whether a result of dtype `from_` may be written to `to` (no
    float -> integer and no non-bool -> bool)."""
    from_, to = _dt.as_dtype(from_, "from_"), _dt.as_dtype(to, "to")
    return _category(to) >= _category(from_)


def _number(x):
    """A Python number from a NumPy scalar; other numbers unchanged."""
    if isinstance(x, np.generic):
        return x.item()
    return x


def _check_operand(x, fname, argname):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, _NUMBER):
        return _number(x)
    raise TypeError(f"{fname}: {argname} must be a Tensor or a number, got {type(x).__name__}")


def _compute_dtype(d):
    if d.kind == "f":
        return _dt.float64 if d is _dt.float64 else _dt.float32
    return d


def _default_float_if_int(d):
    return d if d.kind in "fc" else _dt.get_default_dtype()


def _same_memory(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage() is b.untyped_storage()


def _identical_layout(a: Tensor, b: Tensor) -> bool:
    return (a.storage_offset() == b.storage_offset() and a.stride() == b.stride()
            and a.dtype.itemsize == b.dtype.itemsize)


def _check_int_scalar(v, ct, fname, argname):
    """A number operand of an integer computation must fit its dtype (dtypes.check_scalar)."""
    if ct.kind in "ui":
        _dt.check_scalar(v, ct, fname, argname)


def _fresh(name, shape, out_dtype, ct, dev, prepared, params):
    """Allocate the result and dispatch: the whole of `_run` once the operands are reconciled."""
    result = Tensor._empty(shape, out_dtype, dev)
    if result._storage.nbytes:
        impl(name, dev)(result, prepared, params, ct)
    return result


def _out_fits(out, shape, out_dtype, dev, operands) -> bool:
    """Whether a kernel may write the result straight into `out=`: exactly the result's shape
    and dtype on the operands' device, one element per address, and memory shared with an
    operand only in the same layout and dtype (an in-place style call). Anything else (casts,
    broadcast outs, an overlap in another layout, the checks' errors) is `_run`'s full path."""
    if (out._shape != shape or out._dtype is not out_dtype
            or (out._storage.device is not dev and out._storage.device != dev)):
        return False
    for n, st in zip(shape, out._stride):
        if st == 0 and n > 1:
            return False
    for x in operands:
        if x.__class__ is Tensor and x._storage is out._storage and (
                x._offset != out._offset or x._stride != out._stride or x._dtype is not out._dtype):
            return False
    return True


def _into_same_shape(name, inputs, out, out_dtype, ct, params) -> bool:
    """out= for tensors of one shape on one device (unary ops, same-shape binaries): dispatched
    into out (True) when `_out_fits`; else False."""
    x0 = inputs[0]
    shape, dev = x0._shape, x0._storage.device
    for x in inputs:
        if x.__class__ is not Tensor or x._shape != shape or (
                x._storage.device is not dev and x._storage.device != dev):
            return False
    if not _out_fits(out, shape, out_dtype, dev, inputs):
        return False
    if math.prod(shape):
        impl(name, dev)(out, inputs, params, ct)
    return True


def _run(name, fname, inputs, argnames, result_dtype, *, out=None, params=(0, 0),
         compute_dtype=None, out_dtype=None, inplace=None):
    """Validate, broadcast, allocate and dispatch one element-wise op.

    inputs: operands (Tensors or Python numbers) already checked; result_dtype: the
    promoted dtype (what out= must be castable from); out_dtype: the dtype a fresh
    output gets (defaults to result_dtype); inplace: the tensor written in place.
    """
    if (compute_dtype or result_dtype).kind == "c" and name not in COMPLEX_NAMES:
        raise TypeError(f"{fname}: not supported for complex tensors (the operands promote to "
                        f"{result_dtype.name})")
    if out is None and inplace is None and inputs[0].__class__ is Tensor:
        # tensors of one shape on one device: no broadcasting, scalars or targets to check
        x0 = inputs[0]
        shape, dev = x0._shape, x0._storage.device
        for x in inputs:
            if x.__class__ is not Tensor or x._shape != shape or (
                    x._storage.device is not dev and x._storage.device != dev):
                break
        else:
            return _fresh(name, shape, out_dtype or result_dtype,
                          compute_dtype or _compute_dtype(result_dtype), dev, inputs, params)
    elif out is not None and inplace is None and out.__class__ is Tensor \
            and inputs[0].__class__ is Tensor:
        ct = compute_dtype or _compute_dtype(result_dtype)
        if _into_same_shape(name, inputs, out, out_dtype or result_dtype, ct, params):
            return out
    tensors = [x for x in inputs if isinstance(x, Tensor)]
    if not tensors:
        raise TypeError(f"{fname}: expected at least one Tensor operand")
    dev = None
    for x, an in zip(inputs, argnames):
        if isinstance(x, Tensor) and x._shape:
            if dev is None:
                dev = x._storage.device
            elif x._storage.device != dev:
                raise ValueError(f"{fname}: expected all tensors on one device, but {an} is on "
                                 f"{x.device} and an earlier operand on {dev}")
    if dev is None:
        dev = tensors[0].device
    shape = tensors[0]._shape
    if len(tensors) > 1 and any(t._shape != shape for t in tensors):   # (same shapes: common)
        try:
            shape = broadcast_shapes(*[x.shape for x in tensors])
        except ValueError as e:
            raise ValueError(f"{fname}: {e}") from None
    ct = compute_dtype or _compute_dtype(result_dtype)
    out_dtype = out_dtype or result_dtype
    target = inplace if inplace is not None else out
    if target is not None:
        tn = "self" if inplace is not None else "out"
        if not isinstance(target, Tensor):
            raise TypeError(f"{fname}: {tn} must be a Tensor, got {type(target).__name__}")
        if target.device != dev:
            raise ValueError(f"{fname}: {tn} is on {target.device}, but the operands are on {dev}")
        if tuple(target.shape) != tuple(shape):
            raise ValueError(f"{fname}: {tn} has shape {tuple(target.shape)}, but the result has "
                             f"shape {tuple(shape)}" + (" (an in-place op cannot broadcast self)"
                                                         if inplace is not None else ""))
        if not can_cast(out_dtype, target.dtype):
            raise TypeError(f"{fname}: result type {out_dtype.name} can't be cast to the desired "
                            f"output type {target.dtype.name} of {tn}")
        if any(st == 0 and n > 1 for n, st in zip(target.shape, target.stride())):
            raise ValueError(f"{fname}: {tn} has overlapping elements (a broadcast view); write "
                             f"to a tensor that owns each element")
    prepared = []
    for x, an in zip(inputs, argnames):
        if isinstance(x, Tensor):
            if x.device != dev:           # a 0-dim tensor from another device acts as a number
                x = x.item()
                _check_int_scalar(x, ct, fname, an)
            elif x.shape != shape:
                x = x.expand(shape)
        else:
            _check_int_scalar(x, ct, fname, an)
        prepared.append(x)
    if target is None:
        return _fresh(name, shape, out_dtype, ct, dev, prepared, params)
    if target.numel() == 0:
        return target
    # a destination that overlaps an input in a different layout is written via a temporary
    clash = any(isinstance(x, Tensor) and _same_memory(x, target)
                and not _identical_layout(x, target) for x in prepared)
    if clash:
        tmp = Tensor._empty(shape, target.dtype, dev)
        impl(name, dev)(tmp, prepared, params, ct)
        target.copy_(tmp)
    else:
        impl(name, dev)(target, prepared, params, ct)
    return target


# ----------------------------------------------------------------------------- unary
# kind: "float"   ints/bool promote to the default float (torch's int-to-float ops)
#       "same"    result has the input dtype
#       "intcopy" float: the op; ints/bool: unchanged copy (floor, ceil, round, trunc)
#       "pred"    result is bool
_UNARY = {
    "exp": "float", "exp2": "float", "expm1": "float", "log": "float", "log2": "float",
    "log10": "float", "log1p": "float", "sqrt": "float", "rsqrt": "float", "reciprocal": "float",
    "sin": "float", "cos": "float", "tan": "float", "tanh": "float", "sigmoid": "float",
    "erf": "float",
    "abs": "same", "neg": "same", "sign": "same",
    "floor": "intcopy", "ceil": "intcopy", "round": "intcopy", "trunc": "intcopy",
    "isnan": "pred", "isinf": "pred", "isfinite": "pred", "logical_not": "pred",
    "bitwise_not": "same",
}


def _unary(name, x, out=None, inplace=False, fname=None):
    fname = fname or name
    if not isinstance(x, Tensor):
        raise TypeError(f"{fname}: input must be a Tensor, got {type(x).__name__}")
    kind = _UNARY[name]
    d = x.dtype
    op = name
    if kind == "float":
        res = _default_float_if_int(d)
    elif kind == "pred":
        res = _dt.bool
    else:
        res = d
    if name == "neg" and d is _dt.bool:
        raise TypeError(f"{fname}: negation of a bool tensor is not supported; use logical_not")
    if name in ("abs", "sign") and d is _dt.bool:
        raise TypeError(f"{fname}: not supported for bool tensors")
    if name == "abs" and d.kind == "c":     # |z| is real, computed from the complex value
        if inplace:
            raise TypeError(f"{fname}: in-place abs is not supported for complex tensors")
        return _run(op, fname, [x], ["input"], _dt.to_real(d), out=out, compute_dtype=d)
    if name == "bitwise_not":
        if d.kind == "f":
            raise TypeError(f"{fname}: expected an integer or bool tensor, got {d.name}")
        if d is _dt.bool:
            op = "logical_not"
    if kind == "intcopy" and d.kind in "bui":
        op = "copy"
    if kind == "pred" and inplace and d is not _dt.bool:
        raise TypeError(f"{fname}: the bool result can't be written in place into {d.name}")
    ct = _compute_dtype(res) if kind != "pred" else (_compute_dtype(d) if d.kind == "f" else d)
    return _run(op, fname, [x], ["input"], res, out=out, compute_dtype=ct,
                inplace=x if inplace else None)


def _make_unary(name, public=None):
    public = public or name

    def f(input, *, out=None):  # noqa: A002
        return _unary(name, input, out=out, fname=public)

    def f_(self):
        return _unary(name, self, inplace=True, fname=public + "_")

    f.__name__ = public
    f.__qualname__ = public
    f.__doc__ = f"torch.{public}: element-wise {name}."
    f_.__name__ = public + "_"
    return f, f_


abs, abs_ = _make_unary("abs")  # noqa: A001
absolute, absolute_ = abs, abs_
neg, neg_ = _make_unary("neg")
negative, negative_ = neg, neg_
sign, sign_ = _make_unary("sign")
exp, exp_ = _make_unary("exp")
exp2, exp2_ = _make_unary("exp2")
expm1, expm1_ = _make_unary("expm1")
log, log_ = _make_unary("log")
log2, log2_ = _make_unary("log2")
log10, log10_ = _make_unary("log10")
log1p, log1p_ = _make_unary("log1p")
sqrt, sqrt_ = _make_unary("sqrt")
rsqrt, rsqrt_ = _make_unary("rsqrt")
reciprocal, reciprocal_ = _make_unary("reciprocal")
sin, sin_ = _make_unary("sin")
cos, cos_ = _make_unary("cos")
tan, tan_ = _make_unary("tan")
tanh, tanh_ = _make_unary("tanh")
sigmoid, sigmoid_ = _make_unary("sigmoid")
erf, erf_ = _make_unary("erf")
floor, floor_ = _make_unary("floor")
ceil, ceil_ = _make_unary("ceil")
trunc, trunc_ = _make_unary("trunc")
isnan, _ = _make_unary("isnan")
isinf, _ = _make_unary("isinf")
isfinite, _ = _make_unary("isfinite")
logical_not, _ = _make_unary("logical_not")
bitwise_not, bitwise_not_ = _make_unary("bitwise_not")


def logical_not_(self):
    # in place keeps self's dtype (torch): the bool result is cast back
    return _run("logical_not", "logical_not_", [self], ["self"], _dt.bool,
                compute_dtype=_compute_dtype(self.dtype), out_dtype=_dt.bool,
                inplace=_check_self(self, "logical_not_"))


def _check_self(x, fname):
    if not isinstance(x, Tensor):
        raise TypeError(f"{fname}: self must be a Tensor, got {type(x).__name__}")
    return x


def round(input, *, decimals=0, out=None):  # noqa: A001,A002
    """torch.round: to the nearest integer, ties to even; `decimals` scales by 10**decimals."""
    if not isinstance(decimals, int) or isinstance(decimals, bool):
        raise TypeError(f"round: decimals must be an int, got {decimals!r}")
    if decimals == 0:
        return _unary("round", input, out=out)
    if not isinstance(input, Tensor) or not input.dtype.is_floating_point:
        raise TypeError("round: decimals is only supported for floating tensors")
    scale = 10.0 ** decimals
    r = div(_unary("round", mul(input, scale)), scale)
    return r if out is None else out.copy_(r)


def round_(self, *, decimals=0):
    return _check_self(self, "round_").copy_(round(self, decimals=decimals))


def square(input, *, out=None):  # noqa: A002
    return mul(input, input, out=out)


def nan_to_num(input, nan=0.0, posinf=None, neginf=None, *, out=None):  # noqa: A002
    """torch.nan_to_num: NaN -> nan, +inf -> posinf (default: dtype max), -inf -> neginf."""
    if not isinstance(input, Tensor):
        raise TypeError(f"nan_to_num: input must be a Tensor, got {type(input).__name__}")
    for an, v in (("nan", nan), ("posinf", posinf), ("neginf", neginf)):
        if v is not None and (not isinstance(v, _NUMBER) or isinstance(v, (bool, np.bool_))):
            raise TypeError(f"nan_to_num: {an} must be a float or None, got {v!r}")
    d = input.dtype
    if d.kind != "f":
        return input.clone() if out is None else out.copy_(input)
    fi = _dt.finfo(d)
    posinf = fi.max if posinf is None else float(posinf)
    neginf = fi.min if neginf is None else float(neginf)
    return _run("nan_to_num", "nan_to_num", [input, posinf, neginf],
                ["input", "posinf", "neginf"], d, out=out, params=(float(nan), 0))


def nan_to_num_(self, nan=0.0, posinf=None, neginf=None):
    return _check_self(self, "nan_to_num_").copy_(nan_to_num(self, nan, posinf, neginf))


def clamp(input, min=None, max=None, *, out=None):  # noqa: A001,A002
    """torch.clamp with scalar or tensor bounds; NaN propagates; min > max gives max."""
    return _clamp(input, min, max, out=out, fname="clamp")


def _clamp(input, lo, hi, out=None, inplace=False, fname="clamp"):  # noqa: A002
    if not isinstance(input, Tensor):
        raise TypeError(f"{fname}: input must be a Tensor, got {type(input).__name__}")
    if lo is None and hi is None:
        raise ValueError(f"{fname}: at least one of min and max must be given")
    ops = [input]
    names = ["input"]
    if lo is not None:
        ops.append(_check_operand(lo, fname, "min"))
        names.append("min")
    if hi is not None:
        ops.append(_check_operand(hi, fname, "max"))
        names.append("max")
    res = _dt.result_type(*ops)
    if input.dtype is _dt.bool and res is _dt.bool:
        raise TypeError(f"{fname}: not supported for bool tensors")
    op = "clamp" if lo is not None and hi is not None else ("clamp_min" if lo is not None
                                                            else "clamp_max")
    return _run(op, fname, ops, names, res, out=out, inplace=input if inplace else None)


clip = clamp


def clamp_(self, min=None, max=None):  # noqa: A002
    return _clamp(self, min, max, inplace=True, fname="clamp_")


def clamp_min(input, min, *, out=None):  # noqa: A002
    return _clamp(input, min, None, out=out, fname="clamp_min")


def clamp_max(input, max, *, out=None):  # noqa: A002
    return _clamp(input, None, max, out=out, fname="clamp_max")


# ----------------------------------------------------------------------------- activations
def _float_input(x, fname, allow_int=False):
    if not isinstance(x, Tensor):
        raise TypeError(f"{fname}: input must be a Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point and not allow_int:
        raise TypeError(f"{fname}: expected a floating point tensor, got {x.dtype.name}")
    return x


def _activation(op, x, fname, params=(0, 0), inplace=False, out=None):
    _float_input(x, fname)
    return _run(op, fname, [x], ["input"], x.dtype, params=params, out=out,
                inplace=x if inplace else None)


def relu(input, inplace=False):  # noqa: A002
    """torch.relu: max(x, 0) (NaN stays NaN); integer tensors allowed."""
    if not isinstance(input, Tensor):
        raise TypeError(f"relu: input must be a Tensor, got {type(input).__name__}")
    if input.dtype is _dt.bool:
        raise TypeError("relu: not supported for bool tensors")
    return _run("relu", "relu", [input], ["input"], input.dtype, inplace=input if inplace else None)


def relu_(self):
    return relu(self, inplace=True)


def gelu(input, approximate="none"):  # noqa: A002
    """torch.nn.functional.gelu: exact (erf) or approximate='tanh'."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _activation("gelu" if approximate == "none" else "gelu_tanh", input, "gelu")


def silu(input, inplace=False):  # noqa: A002
    return _activation("silu", input, "silu", inplace=inplace)


def mish(input, inplace=False):  # noqa: A002
    return _activation("mish", input, "mish", inplace=inplace)


def softplus(input, beta=1.0, threshold=20.0):  # noqa: A002
    """torch.nn.functional.softplus: log(1 + exp(beta x)) / beta, linear above threshold."""
    return _activation("softplus", input, "softplus", params=(float(beta), float(threshold)))


def elu(input, alpha=1.0, inplace=False):  # noqa: A002
    return _activation("elu", input, "elu", params=(float(alpha), 0), inplace=inplace)


def leaky_relu(input, negative_slope=0.01, inplace=False):  # noqa: A002
    return _activation("leaky_relu", input, "leaky_relu", params=(float(negative_slope), 0),
                       inplace=inplace)


def hardswish(input, inplace=False):  # noqa: A002
    return _activation("hardswish", input, "hardswish", inplace=inplace)


def hardsigmoid(input, inplace=False):  # noqa: A002
    return _activation("hardsigmoid", input, "hardsigmoid", inplace=inplace)


def glu(input, dim=-1):  # noqa: A002
    """torch.nn.functional.glu: a * sigmoid(b) for the two halves of `dim`."""
    _float_input(input, "glu")
    if input.ndim == 0:
        raise ValueError("glu: does not support 0-dim tensors")
    d = normalize_dim(dim, input.ndim)
    n = input.shape[d]
    if n % 2:
        raise ValueError(f"glu: halving dimension must be even, but dimension {dim} is size {n}")
    a = input.narrow(d, 0, n // 2)
    b = input.narrow(d, n // 2, n // 2)
    return _run("glu", "glu", [a, b], ["input", "input"], input.dtype)


# ----------------------------------------------------------------------------- binary
# (name, kind, dtype-or-number-class of a, of b, default float) -> (out dtype, compute dtype),
# recorded by the full path of `_binary` after it accepted those operand kinds. Promotion
# of two same-shaped tensors, or of a tensor and a Python number, depends on nothing else.
_BINARY_FAST: dict = {}
_PY_NUMBER = (int, float, bool)


_EXPAND: dict = {}      # (shape, strides, target shape) -> strides of x.expand(target)


def _expanded(x, shape):
    """x.expand(shape) for an x known to broadcast to `shape`, with the strides cached."""
    if x._shape == shape:
        return x
    key = (x._shape, x._stride, shape)
    st = _EXPAND.get(key)
    if st is None:
        st = x.expand(shape)._stride
        if len(_EXPAND) < 4096:
            _EXPAND[key] = st
    return Tensor._make(x._storage, shape, st, x._offset, x._dtype)


def _binary_fast_key(name, kind, a, b):
    """The cache key of a fresh-output binary call of two tensors on one device, or of a
    tensor and a Python number; None for anything else (the full path decides those)."""
    ca, cb = a.__class__, b.__class__
    if ca is Tensor:
        if cb is Tensor:
            da, db = a._storage.device, b._storage.device
            if da is not db and da != db:
                return None
            # the shapes decide the broadcast and, for 0-dim operands, the promotion
            return (name, kind, a._dtype, b._dtype, _dt._default_float, a._shape, b._shape)
        if cb in _PY_NUMBER:
            return (name, kind, a._dtype, cb, _dt._default_float)
    elif cb is Tensor and ca in _PY_NUMBER:
        return (name, kind, ca, b._dtype, _dt._default_float)
    return None


def _binary(name, fname, a, b, out=None, inplace=False, params=(0, 0), kind="arith"):
    """kind: arith (result_type), truediv (ints -> default float), cmp (bool result),
    logical (bool result), int (integer/bool only), float (ints -> default float)."""
    key = out_key = None
    if out is not None:
        if not inplace and out.__class__ is Tensor:
            # the cached operand kinds write into out when it fits (`_binary_into`); else the
            # full path, whose verdict on these kinds is recorded for the next call
            out_key = _binary_fast_key(name, kind, a, b)
            hit = _BINARY_FAST.get(out_key) if out_key is not None else None
            if hit is not None:
                if _binary_into(name, fname, a, b, out, hit, params):
                    return out
                out_key = None
    else:
        if not inplace:
            key = _binary_fast_key(name, kind, a, b)
        elif a.__class__ is Tensor and kind != "cmp" and kind != "logical":
            key = _binary_fast_key(name, kind, a, b)
            if key is not None:
                # in place: a's strides decide the overlap check, b's memory the clash check
                key += (a._stride,)
                if b.__class__ is Tensor and b._storage is a._storage:
                    key = None
    if key is not None:
        hit = _BINARY_FAST.get(key)
        if hit is not None and inplace:
            ct = hit[1]
            if b.__class__ is not Tensor:
                if b.__class__ is int and ct.kind in "ui":
                    _check_int_scalar(b, ct, fname, "other")
            elif b._shape != a._shape:
                b = _expanded(b, a._shape)
            if math.prod(a._shape):
                impl(name, a._storage.device)(a, [a, b], params, ct)
            return a
        if hit is not None:
            out_dtype, ct, shape = hit
            if shape is not None:                   # two tensors
                return _fresh(name, shape, out_dtype, ct, a._storage.device,
                              [_expanded(a, shape), _expanded(b, shape)], params)
            if a.__class__ is Tensor:
                t, s = a, b
            else:
                t, s = b, a
            if s.__class__ is int and ct.kind in "ui":
                _check_int_scalar(s, ct, fname, "other" if t is a else "input")
            return _fresh(name, t._shape, out_dtype, ct, t._storage.device, [a, b], params)
    if inplace:
        _check_self(a, fname)
    a = _check_operand(a, fname, "input")
    b = _check_operand(b, fname, "other")
    res = _dt.result_type(a, b)
    ct = None
    out_dtype = None
    if kind in ("truediv", "float"):
        res = _default_float_if_int(res)
    elif kind in ("cmp", "logical"):
        ct, out_dtype = _compute_dtype(res), _dt.bool
    elif kind == "int":
        if res.kind == "f":
            raise TypeError(f"{fname}: expected integer or bool operands, got {res.name}")
    elif kind == "shift":
        if res.kind not in "ui":
            raise TypeError(f"{fname}: expected integer operands, got {res.name}")
    if kind in ("cmp", "logical") and inplace:
        # torch writes the bool result into self's dtype
        return _run(name, fname, [a, b], ["input", "other"], _dt.bool, compute_dtype=ct,
                    out_dtype=_dt.bool, inplace=a)
    r = _run(name, fname, [a, b], ["input", "other"], res, out=out, params=params,
             compute_dtype=ct, out_dtype=out_dtype, inplace=a if inplace else None)
    key = key if key is not None else out_key
    if key is not None and len(_BINARY_FAST) < 4096:
        # accepted: later calls with these operand kinds skip to _fresh
        _BINARY_FAST[key] = (out_dtype or res, ct or _compute_dtype(res),
                             r._shape if isinstance(b, Tensor) and isinstance(a, Tensor)
                             and not inplace else None)
    return r


def _binary_into(name, fname, a, b, out, hit, params) -> bool:
    """The cached binary call (`hit` from _BINARY_FAST) written into `out` when `_out_fits`:
    True when done, else False (the full path)."""
    out_dtype, ct, shape = hit
    if shape is None:                        # a tensor and a Python number
        t, sc = (a, b) if a.__class__ is Tensor else (b, a)
        shape = t._shape
    else:
        t, sc = a, None
    ops = [_expanded(a, shape) if a.__class__ is Tensor else a,
           _expanded(b, shape) if b.__class__ is Tensor else b]
    if not _out_fits(out, shape, out_dtype, t._storage.device, ops):
        return False
    if sc.__class__ is int and ct.kind in "ui":
        _check_int_scalar(sc, ct, fname, "other" if sc is b else "input")
    if math.prod(shape):
        impl(name, t._storage.device)(out, ops, params, ct)
    return True


def _alpha_op(base, fname, input, other, alpha, out=None, inplace=False):  # noqa: A002
    if alpha == 1 and base == "add" and not isinstance(alpha, float):      # the common case
        return _binary(base, fname, input, other, out=out, inplace=inplace)
    res = _dt.result_type(_check_operand(input, fname, "input"), _check_operand(other, fname, "other"))
    if not isinstance(alpha, _NUMBER):
        raise TypeError(f"{fname}: alpha must be a number, got {type(alpha).__name__}")
    alpha = _number(alpha)
    if res.kind not in "fc" and isinstance(alpha, (float, complex)):
        raise TypeError(f"{fname}: for integral input tensors, argument alpha must not be a "
                        f"floating point number")
    if res.kind != "c" and isinstance(alpha, complex):
        raise TypeError(f"{fname}: a complex alpha needs complex operands, got {res.name}")
    if res is _dt.bool and base == "sub":
        raise TypeError(f"{fname}: subtraction with two bool tensors is not supported; use "
                        f"logical_xor or bitwise_xor")
    if alpha == 1:
        return _binary(base, fname, input, other, out=out, inplace=inplace)
    _check_int_scalar(alpha, _compute_dtype(res), fname, "alpha")
    return _binary(base + "_alpha", fname, input, other, out=out, inplace=inplace,
                   params=(alpha, 0))


def add(input, other, *, alpha=1, out=None):  # noqa: A002
    """torch.add: input + alpha * other."""
    if alpha.__class__ is int and alpha == 1:       # the common case: no alpha to validate
        return _binary("add", "add", input, other, out=out)
    return _alpha_op("add", "add", input, other, alpha, out=out)


def sub(input, other, *, alpha=1, out=None):  # noqa: A002
    """torch.sub: input - alpha * other."""
    return _alpha_op("sub", "sub", input, other, alpha, out=out)


subtract = sub


def mul(input, other, *, out=None):  # noqa: A002
    return _binary("mul", "mul", input, other, out=out)


multiply = mul


def div(input, other, *, rounding_mode=None, out=None):  # noqa: A002
    """torch.div: true division (ints give the default float), or rounding_mode 'trunc' /
    'floor' (result dtype by promotion). Integer division by zero gives 0 (NumPy's value;
    torch's cpu raises and its cuda returns garbage)."""
    return _div(input, other, rounding_mode, out=out)


def _div(input, other, rounding_mode, out=None, inplace=False, fname="div"):  # noqa: A002
    if rounding_mode is None:
        return _binary("div", fname, input, other, out=out, inplace=inplace, kind="truediv")
    if rounding_mode == "floor":
        return _binary("div_floor", fname, input, other, out=out, inplace=inplace)
    if rounding_mode == "trunc":
        return _binary("div_trunc", fname, input, other, out=out, inplace=inplace)
    raise ValueError(f"{fname}: rounding_mode must be None, 'trunc' or 'floor', got "
                     f"{rounding_mode!r}")


divide = div


def true_divide(input, other, *, out=None):  # noqa: A002
    return _div(input, other, None, out=out, fname="true_divide")


def floor_divide(input, other, *, out=None):  # noqa: A002
    return _div(input, other, "floor", out=out, fname="floor_divide")


def remainder(input, other, *, out=None):  # noqa: A002
    """torch.remainder: the result has the sign of the divisor (Python's %)."""
    return _binary("remainder", "remainder", input, other, out=out)


def fmod(input, other, *, out=None):  # noqa: A002
    """torch.fmod: C's fmod; the result has the sign of the dividend."""
    return _binary("fmod", "fmod", input, other, out=out)


def pow(input, exponent, *, out=None):  # noqa: A002,A001
    """torch.pow. Integer tensors to negative integer powers: 0, except bases 1 and -1."""
    return _pow(input, exponent, out=out)


def _pow(input, exponent, out=None, inplace=False, fname="pow"):  # noqa: A002
    a = _check_operand(input, fname, "input")
    b = _check_operand(exponent, fname, "exponent")
    res = _dt.result_type(a, b)
    if res.kind in "ui" and not isinstance(b, Tensor) and b < 0:
        raise ValueError(f"{fname}: integers to negative integer powers are not allowed "
                         f"(exponent {b})")
    return _run("pow", fname, [a, b], ["input", "exponent"], res, out=out,
                compute_dtype=_dt.uint8 if res is _dt.bool else None,
                inplace=a if inplace else None)


def maximum(input, other, *, out=None):  # noqa: A002
    """torch.maximum: NaN propagates."""
    return _binary("maximum", "maximum", input, other, out=out)


def minimum(input, other, *, out=None):  # noqa: A002
    return _binary("minimum", "minimum", input, other, out=out)


def atan2(input, other, *, out=None):  # noqa: A002
    return _binary("atan2", "atan2", input, other, out=out, kind="float")


def _binary_pair(name, public, kind, doc=None):
    # (out-of-place, in-place) pair of one binary op family: comparison, logical, bitwise
    def f(input, other, *, out=None):  # noqa: A002
        return _binary(name, public, input, other, out=out, kind=kind)
    f.__name__ = f.__qualname__ = public
    if doc is not None:
        f.__doc__ = doc

    def f_(self, other):
        return _binary(name, public + "_", self, other, inplace=True, kind=kind)
    return f, f_


def _cmp(name):
    return _binary_pair(name, name, "cmp", f"torch.{name}: element-wise comparison, a bool tensor.")


eq, eq_ = _cmp("eq")
ne, ne_ = _cmp("ne")
lt, lt_ = _cmp("lt")
le, le_ = _cmp("le")
gt, gt_ = _cmp("gt")
ge, ge_ = _cmp("ge")

logical_and, logical_and_ = _binary_pair("logical_and", "logical_and", "logical")
logical_or, logical_or_ = _binary_pair("logical_or", "logical_or", "logical")
logical_xor, logical_xor_ = _binary_pair("logical_xor", "logical_xor", "logical")

bitwise_and, bitwise_and_ = _binary_pair("bitwise_and", "bitwise_and", "int")
bitwise_or, bitwise_or_ = _binary_pair("bitwise_or", "bitwise_or", "int")
bitwise_xor, bitwise_xor_ = _binary_pair("bitwise_xor", "bitwise_xor", "int")
bitwise_left_shift, bitwise_left_shift_ = _binary_pair("lshift", "bitwise_left_shift", "shift")
bitwise_right_shift, bitwise_right_shift_ = _binary_pair("rshift", "bitwise_right_shift", "shift")


# ----------------------------------------------------------------------------- ternary
def where(condition, input=None, other=None, *, out=None):  # noqa: A002
    """torch.where(condition, input, other): input where condition is true, else other."""
    if input is None and other is None:
        from .reduction import nonzero
        return nonzero(condition, as_tuple=True)
    if not isinstance(condition, Tensor):
        raise TypeError(f"where: condition must be a Tensor, got {type(condition).__name__}")
    if condition.dtype not in (_dt.bool, _dt.uint8):
        raise TypeError(f"where: condition must be a bool tensor, got {condition.dtype.name}")
    a = _check_operand(input, "where", "input")
    b = _check_operand(other, "where", "other")
    res = _dt.result_type(a, b)
    return _run("where", "where", [condition, a, b], ["condition", "input", "other"], res,
                out=out)


def lerp(input, end, weight, *, out=None):  # noqa: A002
    """torch.lerp: input + weight * (end - input) (torch's form that is exact at weight 1)."""
    return _lerp(input, end, weight, out=out)


def _lerp(input, end, weight, out=None, inplace=False, fname="lerp"):  # noqa: A002
    _float_input(input, fname)
    if not isinstance(end, Tensor):
        raise TypeError(f"{fname}: end must be a Tensor, got {type(end).__name__}")
    if end.dtype is not input.dtype:
        raise TypeError(f"{fname}: expected end to have dtype {input.dtype.name}, got "
                        f"{end.dtype.name}")
    w = _check_operand(weight, fname, "weight")
    if isinstance(w, Tensor) and w.dtype is not input.dtype:
        raise TypeError(f"{fname}: expected weight to have dtype {input.dtype.name}, got "
                        f"{w.dtype.name}")
    return _run("lerp", fname, [input, end, w], ["input", "end", "weight"], input.dtype, out=out,
                inplace=input if inplace else None)


def addcmul(input, tensor1, tensor2, *, value=1, out=None):  # noqa: A002
    """torch.addcmul: input + value * tensor1 * tensor2."""
    return _addc("addcmul", input, tensor1, tensor2, value, out=out)


def addcdiv(input, tensor1, tensor2, *, value=1, out=None):  # noqa: A002
    """torch.addcdiv: input + value * tensor1 / tensor2 (floating point only)."""
    return _addc("addcdiv", input, tensor1, tensor2, value, out=out)


def _addc(op, input, t1, t2, value, out=None, inplace=False):  # noqa: A002
    fname = op + ("_" if inplace else "")
    ops = [_check_operand(input, fname, "input"), _check_operand(t1, fname, "tensor1"),
           _check_operand(t2, fname, "tensor2")]
    res = _dt.result_type(*ops)
    if not isinstance(value, _NUMBER):
        raise TypeError(f"{fname}: value must be a number, got {type(value).__name__}")
    value = _number(value)
    if op == "addcdiv" and res.kind != "f":
        raise TypeError(f"{fname}: integer division with addcdiv is not supported; use "
                        f"floating point tensors")
    if res.kind != "f" and isinstance(value, float):
        raise TypeError(f"{fname}: for integer tensors, value must be an integer, got {value}")
    return _run(op, fname, ops, ["input", "tensor1", "tensor2"], res, out=out,
                params=(value, 0), inplace=input if inplace else None)


# ----------------------------------------------------------------------------- Tensor methods
def _rev(fn):
    """Reflected operator: other OP self; NotImplemented for operands we do not handle."""
    def r(self, other):
        if not isinstance(other, _NUMBER):
            return NotImplemented
        return fn(other, self)
    return r


_OPERAND = (Tensor,) + _NUMBER


def _fwd(fn):
    def f(self, other):
        if other.__class__ is not Tensor and not isinstance(other, _OPERAND):
            return NotImplemented
        return fn(self, other)
    return f


def _inplace(fn_):
    def f(self, other):
        if not isinstance(other, (Tensor,) + _NUMBER):
            return NotImplemented
        return fn_(self, other)
    return f


def _add_(self, other, *, alpha=1):
    return _alpha_op("add", "add_", self, other, alpha, inplace=True)


def _sub_(self, other, *, alpha=1):
    return _alpha_op("sub", "sub_", self, other, alpha, inplace=True)


def _mul_(self, other):
    return _binary("mul", "mul_", self, other, inplace=True)


def _div_(self, other, *, rounding_mode=None):
    return _div(self, other, rounding_mode, inplace=True, fname="div_")


def _floor_divide_(self, other):
    return _div(self, other, "floor", inplace=True, fname="floor_divide_")


def _remainder_(self, other):
    return _binary("remainder", "remainder_", self, other, inplace=True)


def _fmod_(self, other):
    return _binary("fmod", "fmod_", self, other, inplace=True)


def _pow_(self, exponent):
    return _pow(self, exponent, inplace=True, fname="pow_")


def _atan2_(self, other):
    return _binary("atan2", "atan2_", self, other, inplace=True, kind="float")


def _where_method(self, condition, other):
    return where(condition, self, other)


def _lerp_(self, end, weight):
    return _lerp(self, end, weight, inplace=True, fname="lerp_")


def _addcmul_(self, tensor1, tensor2, *, value=1):
    return _addc("addcmul", self, tensor1, tensor2, value, inplace=True)


def _addcdiv_(self, tensor1, tensor2, *, value=1):
    return _addc("addcdiv", self, tensor1, tensor2, value, inplace=True)


def _rpow(self, other):
    if not isinstance(other, _NUMBER):
        return NotImplemented
    return pow(other, self)


def _floordiv(a, b):
    return div(a, b, rounding_mode="floor")


def _method(fn):
    """A method spelling of a function whose first argument is the tensor."""
    def m(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    m.__name__ = fn.__name__
    m.__doc__ = fn.__doc__
    return m


_methods.install(
    abs=_method(abs), abs_=abs_, absolute=_method(abs), absolute_=abs_,
    neg=_method(neg), neg_=neg_, negative=_method(neg), negative_=neg_,
    sign=_method(sign), sign_=sign_,
    exp=_method(exp), exp_=exp_, exp2=_method(exp2), exp2_=exp2_, expm1=_method(expm1),
    expm1_=expm1_, log=_method(log), log_=log_, log2=_method(log2), log2_=log2_,
    log10=_method(log10), log10_=log10_, log1p=_method(log1p), log1p_=log1p_,
    sqrt=_method(sqrt), sqrt_=sqrt_, rsqrt=_method(rsqrt), rsqrt_=rsqrt_,
    reciprocal=_method(reciprocal), reciprocal_=reciprocal_, sin=_method(sin), sin_=sin_,
    cos=_method(cos), cos_=cos_, tan=_method(tan), tan_=tan_, tanh=_method(tanh), tanh_=tanh_,
    sigmoid=_method(sigmoid), sigmoid_=sigmoid_, erf=_method(erf), erf_=erf_,
    floor=_method(floor), floor_=floor_, ceil=_method(ceil), ceil_=ceil_,
    round=_method(round), round_=round_, trunc=_method(trunc), trunc_=trunc_,
    isnan=_method(isnan), isinf=_method(isinf), isfinite=_method(isfinite),
    logical_not=_method(logical_not), logical_not_=logical_not_,
    bitwise_not=_method(bitwise_not), bitwise_not_=bitwise_not_,
    nan_to_num=_method(nan_to_num), nan_to_num_=nan_to_num_,
    clamp=_method(clamp), clamp_=clamp_, clip=_method(clamp), clip_=clamp_,
    clamp_min=_method(clamp_min), clamp_max=_method(clamp_max),
    square=_method(square), relu=_method(relu), relu_=relu_,
    add=_method(add), add_=_add_, sub=_method(sub), sub_=_sub_, subtract=_method(sub),
    mul=_method(mul), mul_=_mul_, multiply=_method(mul), div=_method(div), div_=_div_,
    divide=_method(div), true_divide=_method(true_divide), floor_divide=_method(floor_divide),
    floor_divide_=_floor_divide_, remainder=_method(remainder), remainder_=_remainder_,
    fmod=_method(fmod), fmod_=_fmod_, pow=_method(pow), pow_=_pow_,
    maximum=_method(maximum), minimum=_method(minimum), atan2=_method(atan2), atan2_=_atan2_,
    eq=_method(eq), eq_=eq_, ne=_method(ne), ne_=ne_, lt=_method(lt), lt_=lt_,
    le=_method(le), le_=le_, gt=_method(gt), gt_=gt_, ge=_method(ge), ge_=ge_,
    logical_and=_method(logical_and), logical_and_=logical_and_,
    logical_or=_method(logical_or), logical_or_=logical_or_,
    logical_xor=_method(logical_xor), logical_xor_=logical_xor_,
    bitwise_and=_method(bitwise_and), bitwise_and_=bitwise_and_,
    bitwise_or=_method(bitwise_or), bitwise_or_=bitwise_or_,
    bitwise_xor=_method(bitwise_xor), bitwise_xor_=bitwise_xor_,
    bitwise_left_shift=_method(bitwise_left_shift), bitwise_left_shift_=bitwise_left_shift_,
    bitwise_right_shift=_method(bitwise_right_shift),
    bitwise_right_shift_=bitwise_right_shift_,
    where=_where_method, lerp=_method(lerp), lerp_=_lerp_,
    addcmul=_method(addcmul), addcmul_=_addcmul_, addcdiv=_method(addcdiv), addcdiv_=_addcdiv_,
    # Python operators
    __add__=_fwd(add), __radd__=_rev(add), __iadd__=_inplace(_add_),
    __sub__=_fwd(sub), __rsub__=_rev(sub), __isub__=_inplace(_sub_),
    __mul__=_fwd(mul), __rmul__=_rev(mul), __imul__=_inplace(_mul_),
    __truediv__=_fwd(div), __rtruediv__=_rev(div), __itruediv__=_inplace(_div_),
    __floordiv__=_fwd(_floordiv), __rfloordiv__=_rev(_floordiv),
    __ifloordiv__=_inplace(_floor_divide_),
    __mod__=_fwd(remainder), __rmod__=_rev(remainder), __imod__=_inplace(_remainder_),
    __pow__=_fwd(pow), __rpow__=_rpow, __ipow__=_inplace(_pow_),
    __and__=_fwd(bitwise_and), __rand__=_rev(bitwise_and), __iand__=_inplace(bitwise_and_),
    __or__=_fwd(bitwise_or), __ror__=_rev(bitwise_or), __ior__=_inplace(bitwise_or_),
    __xor__=_fwd(bitwise_xor), __rxor__=_rev(bitwise_xor), __ixor__=_inplace(bitwise_xor_),
    __lshift__=_fwd(bitwise_left_shift), __rlshift__=_rev(bitwise_left_shift),
    __ilshift__=_inplace(bitwise_left_shift_),
    __rshift__=_fwd(bitwise_right_shift), __rrshift__=_rev(bitwise_right_shift),
    __irshift__=_inplace(bitwise_right_shift_),
    __invert__=lambda self: bitwise_not(self), __neg__=lambda self: neg(self),
    __pos__=lambda self: self, __abs__=lambda self: abs(self),
    __eq__=_fwd(eq), __ne__=_fwd(ne), __lt__=_fwd(lt), __le__=_fwd(le), __gt__=_fwd(gt),
    __ge__=_fwd(ge),
)
# __matmul__ / __rmatmul__ are installed by ops.linalg (matmul lives there).

# ops registered by the backends under these dispatch names (the op-support table reads them)
DISPATCH_NAMES = (
    "copy", "neg", "abs", "sign", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p",
    "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan", "tanh", "sigmoid", "erf", "floor",
    "ceil", "round", "trunc", "isnan", "isinf", "isfinite", "logical_not", "bitwise_not",
    "nan_to_num", "clamp", "clamp_min", "clamp_max", "relu", "gelu", "gelu_tanh", "silu", "mish",
    "softplus", "elu", "leaky_relu", "hardsigmoid", "hardswish", "glu", "add", "add_alpha",
    "sub", "sub_alpha", "mul", "div", "div_floor", "div_trunc", "remainder", "fmod", "pow",
    "maximum", "minimum", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
    "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "lshift", "rshift",
    "where", "lerp", "addcmul", "addcdiv",
)

# the dispatch names that take complex operands (cpu: NumPy; cuda/interp: kernels/complex.py);
# every other element-wise op refuses a complex compute dtype in `_run`
COMPLEX_NAMES = frozenset((
    "copy", "neg", "abs", "exp", "log", "sqrt", "reciprocal", "sin", "cos", "isnan", "isinf",
    "isfinite", "add", "add_alpha", "sub", "sub_alpha", "mul", "div", "pow", "eq", "ne"))

# dtypes each dispatch entry accepts (the op-support table in docs/ops.md shows them)
_FLOATS = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
_INTS = ("uint8", "int8", "int16", "int32", "int64")
_ALL = ("bool",) + _INTS + _FLOATS
SUPPORTED_DTYPES = {name: _ALL for name in DISPATCH_NAMES}
SUPPORTED_DTYPES.update({n: _FLOATS for n in (
    "gelu", "gelu_tanh", "silu", "mish", "softplus", "elu", "leaky_relu", "hardsigmoid",
    "hardswish", "glu", "lerp", "addcdiv", "nan_to_num")})
SUPPORTED_DTYPES.update({n: _INTS for n in ("lshift", "rshift")})
SUPPORTED_DTYPES.update({n: ("bool",) + _INTS for n in ("bitwise_not", "bitwise_and",
                                                       "bitwise_or", "bitwise_xor")})
SUPPORTED_DTYPES.update({n: _INTS + _FLOATS for n in ("neg", "abs", "sign", "relu", "sub",
                                                      "sub_alpha")})
