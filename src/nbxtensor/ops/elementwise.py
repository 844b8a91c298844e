"""Element-wise ops: unary, activations, binary, ternary, and the Python operators.

The unary, activation, comparison, logical, bitwise and most binary ops are declarations
(ops/_declare.py): their functions, methods and operators are generated at the end of this
module; the rest (add/sub/mul/div/pow with alpha and rounding modes, clamp, nan_to_num, round's
decimals, the ternaries) are written here by hand.

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
from ..backends.cpu import elementwise as _cpu
from ..dispatch import impl, register
from ..tensor import Tensor, broadcast_shapes, normalize_dim
from . import _declare, _methods

# the hand-written functions; every declared op (ops/_declare.py) appends its names in `_build`
__all__ = [
    "round", "nan_to_num", "clamp", "clip", "clamp_min", "clamp_max", "square", "gelu", "glu",
    "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "floor_divide",
    "pow", "where", "lerp", "addcmul", "addcdiv", "can_cast", "logit", "rsub", "float_power",
    "positive",
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
# The unary, activation and binary ops declared in ops/_declare.py get their functions from
# `_build` (end of this module); these run them. `op` is the declaration (an _declare.Op).
def _unary(op, x, out, inplace, fname):
    """A declared unary op (form "math") by its dtype rule; see _declare.RULES."""
    if x.__class__ is not Tensor and not isinstance(x, Tensor):
        raise TypeError(f"{fname}: input must be a Tensor, got {type(x).__name__}")
    d = x._dtype
    rule = op.rule
    name = op.entry
    if rule == "float":
        res = _default_float_if_int(d)
        ct = _compute_dtype(res)
    elif rule == "pred":
        if inplace and d is not _dt.bool:
            raise TypeError(f"{fname}: the bool result can't be written in place into {d.name}")
        res = _dt.bool
        ct = _compute_dtype(d) if d.kind == "f" else d
    else:
        res = d
        if rule == "floatonly" and d.kind != "f":
            raise TypeError(f"{fname}: expected a floating point tensor, got {d.name}")
        if d is _dt.bool:
            if rule == "nobool":
                raise TypeError(f"{fname}: {op.bool_error}")
            if rule == "bits":
                name = "logical_not"
            elif rule == "round":
                name = "copy"
        elif d.kind == "c" and op.complex == "real":     # |z| is real, computed from z
            if inplace:
                raise TypeError(f"{fname}: in-place {op.name} is not supported for complex "
                                f"tensors")
            return _run(name, fname, [x], ["input"], _dt.to_real(d), out=out, compute_dtype=d)
        elif rule == "bits" and d.kind == "f":
            raise TypeError(f"{fname}: expected an integer or bool tensor, got {d.name}")
        elif rule == "round" and d.kind in "ui":
            name = "copy"
        ct = _compute_dtype(d)
    return _run(name, fname, [x], ["input"], res, out=out, compute_dtype=ct,
                inplace=x if inplace else None)


def _unary_cast_(op, self, fname):
    """In place keeps self's dtype (torch's logical_not_): the bool result is cast back."""
    return _run(op.entry, fname, [self], ["self"], _dt.bool,
                compute_dtype=_compute_dtype(self.dtype), out_dtype=_dt.bool,
                inplace=_check_self(self, fname))


def _check_self(x, fname):
    if not isinstance(x, Tensor):
        raise TypeError(f"{fname}: self must be a Tensor, got {type(x).__name__}")
    return x


def round(input, *, decimals=0, out=None):  # noqa: A001,A002
    """torch.round: to the nearest integer, ties to even; `decimals` scales by 10**decimals."""
    if not isinstance(decimals, int) or isinstance(decimals, bool):
        raise TypeError(f"round: decimals must be an int, got {decimals!r}")
    if decimals == 0:
        return _unary(_ROUND, input, out, False, "round")
    if not isinstance(input, Tensor) or not input.dtype.is_floating_point:
        raise TypeError("round: decimals is only supported for floating tensors")
    scale = 10.0 ** decimals
    r = div(_unary(_ROUND, mul(input, scale), None, False, "round"), scale)
    return r if out is None else out.copy_(r)


def round_(self, *, decimals=0):
    return _check_self(self, "round_").copy_(round(self, decimals=decimals))


def square(input, *, out=None):  # noqa: A002
    return mul(input, input, out=out)


def logit(input, eps=None, *, out=None):  # noqa: A002
    """torch.logit: log(x / (1 - x)); with `eps`, x is first clamped to [eps, 1 - eps]
    (NaN stays NaN). Integer/bool inputs give the default float."""
    return _logit(input, eps, out, False, "logit")


def logit_(self, eps=None):
    return _logit(_check_self(self, "logit_"), eps, None, True, "logit_")


def _logit(x, eps, out, inplace, fname):
    if not isinstance(x, Tensor):
        raise TypeError(f"{fname}: input must be a Tensor, got {type(x).__name__}")
    if eps is not None and (not isinstance(eps, (int, float)) or isinstance(eps, bool)):
        raise TypeError(f"{fname}: eps must be a float or None, got {eps!r}")
    res = _default_float_if_int(x.dtype)
    params = (0.0, 0.0) if eps is None else (float(eps), 1.0)
    return _run("logit", fname, [x], ["input"], res, out=out, params=params,
                compute_dtype=_compute_dtype(res), inplace=x if inplace else None)


def rsub(input, other, *, alpha=1):  # noqa: A002
    """torch.rsub: other - alpha * input."""
    return sub(other, input, alpha=alpha)


def float_power(input, exponent, *, out=None):  # noqa: A002
    """torch.float_power: pow computed and returned in float64."""
    return pow(_to_f64(input, "float_power", "input"), _to_f64(exponent, "float_power",
                                                               "exponent"), out=out)


def float_power_(self, exponent):
    _check_self(self, "float_power_")
    if self.dtype is not _dt.float64:
        raise TypeError(f"float_power_: the float64 result can't be written in place into "
                        f"{self.dtype.name} (self must be float64)")
    return _pow(self, _to_f64(exponent, "float_power_", "exponent"), inplace=True,
                fname="float_power_")


def _to_f64(x, fname, argname):
    x = _check_operand(x, fname, argname)
    if isinstance(x, Tensor):
        if x.dtype.kind == "c":
            raise TypeError(f"{fname}: complex {argname} is not supported")
        return x if x.dtype is _dt.float64 else x.to(_dt.float64)
    if isinstance(x, complex):
        raise TypeError(f"{fname}: complex {argname} is not supported")
    return float(x)


def positive(input):  # noqa: A002
    """torch.positive: input itself (bool refused, as torch)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"positive: input must be a Tensor, got {type(input).__name__}")
    if input.dtype is _dt.bool:
        raise TypeError("positive: not supported for bool tensors")
    return input


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


def _act(op, x, params, inplace, fname):
    """A declared activation (form "activation"): floats only, or (relu) anything but bool."""
    if op.rule == "nobool":
        if not isinstance(x, Tensor):
            raise TypeError(f"{fname}: input must be a Tensor, got {type(x).__name__}")
        if x.dtype is _dt.bool:
            raise TypeError(f"{fname}: {op.bool_error}")
    else:
        _float_input(x, fname)
    return _run(op.entry, fname, [x], ["input"], x.dtype, params=params,
                inplace=x if inplace else None)


def gelu(input, approximate="none"):  # noqa: A002
    """torch.nn.functional.gelu: exact (erf) or approximate='tanh'."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _act(_GELU if approximate == "none" else _GELU_TANH, input, (0, 0), False, "gelu")


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
    return _run(_GLU.entry, "glu", [a, b], ["input", "input"], input.dtype)


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
    elif kind == "floatonly":
        if res.kind != "f":
            raise TypeError(f"{fname}: expected floating point operands, got {res.name}")
    elif kind == "f3264":
        if res not in (_dt.float32, _dt.float64):
            raise TypeError(f"{fname}: expected float32 or float64 operands, got {res.name}")
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


def _pow_(self, exponent):
    return _pow(self, exponent, inplace=True, fname="pow_")


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
    round=_method(round), round_=round_,
    nan_to_num=_method(nan_to_num), nan_to_num_=nan_to_num_,
    clamp=_method(clamp), clamp_=clamp_, clip=_method(clamp), clip_=clamp_,
    clamp_min=_method(clamp_min), clamp_max=_method(clamp_max),
    square=_method(square), logit=_method(logit), logit_=logit_,
    float_power=_method(float_power), float_power_=float_power_, positive=positive,
    # torch's spellings of the in-place arithmetic
    subtract_=lambda self, other, *, alpha=1: _sub_(self, other, alpha=alpha),
    multiply_=lambda self, other: _mul_(self, other),
    divide_=lambda self, other, *, rounding_mode=None: _div_(self, other,
                                                             rounding_mode=rounding_mode),
    true_divide_=lambda self, other: _div_(self, other),
    add=_method(add), add_=_add_, sub=_method(sub), sub_=_sub_, subtract=_method(sub),
    mul=_method(mul), mul_=_mul_, multiply=_method(mul), div=_method(div), div_=_div_,
    divide=_method(div), true_divide=_method(true_divide), floor_divide=_method(floor_divide),
    floor_divide_=_floor_divide_, pow=_method(pow), pow_=_pow_,
    where=_where_method, lerp=_method(lerp), lerp_=_lerp_,
    addcmul=_method(addcmul), addcmul_=_addcmul_, addcdiv=_method(addcdiv), addcdiv_=_addcdiv_,
    # Python operators
    __add__=_fwd(add), __radd__=_rev(add), __iadd__=_inplace(_add_),
    __sub__=_fwd(sub), __rsub__=_rev(sub), __isub__=_inplace(_sub_),
    __mul__=_fwd(mul), __rmul__=_rev(mul), __imul__=_inplace(_mul_),
    __truediv__=_fwd(div), __rtruediv__=_rev(div), __itruediv__=_inplace(_div_),
    __floordiv__=_fwd(_floordiv), __rfloordiv__=_rev(_floordiv),
    __ifloordiv__=_inplace(_floor_divide_),
    __pow__=_fwd(pow), __rpow__=_rpow, __ipow__=_inplace(_pow_),
    __pos__=lambda self: self,
)
# __matmul__ / __rmatmul__ are installed by ops.linalg (matmul lives there).


# ----------------------------------------------------------------------------- declared ops
# Every op of ops/_declare.py gets here: its public function(s) in this module (and so in
# nbx.ops / nbx), its Tensor methods and operators, its cpu entry (the NumPy expression, by
# backends/cpu/elementwise.py), its dtypes for docs/ops.md. kernels/elementwise.py subscribes
# to the same table for the kernel branch. The functions are generated as source so that
# each has torch's signature and calls its runner (`_unary`, `_act`, `_binary`) directly.

HAND_NAMES = (     # dispatch entries of the ops not declared (yet): hand-written here
    "copy", "nan_to_num", "clamp", "clamp_min", "clamp_max", "add", "add_alpha", "sub",
    "sub_alpha", "mul", "div", "div_floor", "div_trunc", "pow", "where", "lerp", "addcmul",
    "addcdiv",
)
# the dispatch names that take complex operands (cpu: NumPy; cuda/interp: kernels/complex.py);
# every other element-wise op refuses a complex compute dtype in `_run`. Declared ops join
# with complex=True.
COMPLEX_NAMES = {"copy", "add", "add_alpha", "sub", "sub_alpha", "mul", "div", "pow"}

# dtypes each dispatch entry accepts (the op-support table in docs/ops.md shows them)
_FLOATS = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
_INTS = ("uint8", "int8", "int16", "int32", "int64")
_ALL = ("bool",) + _INTS + _FLOATS
SUPPORTED_DTYPES = {name: _ALL for name in HAND_NAMES}
SUPPORTED_DTYPES.update({n: _FLOATS for n in ("lerp", "addcdiv", "nan_to_num")})
SUPPORTED_DTYPES.update({n: _INTS + _FLOATS for n in ("sub", "sub_alpha")})


def _source(op) -> list:
    """(name, python source) of the functions and methods `op`'s form calls for."""
    n, e = op.name, op.entry
    fns = []
    if op.form == "math":
        fns.append((n, f"def {n}(input, *, out=None):\n"
                       f"    return _unary(_OP, input, out, False, {n!r})\n"))
        if op.inplace == "cast":
            fns.append((n + "_", f"def {n}_(self):\n"
                                 f"    return _unary_cast_(_OP, self, {n + '_'!r})\n"))
        elif op.inplace:
            fns.append((n + "_", f"def {n}_(self):\n"
                                 f"    return _unary(_OP, self, None, True, {n + '_'!r})\n"))
    elif op.form == "activation":
        names = [p for p, _ in op.params]
        sig = "".join(f", {p}={v!r}" for p, v in op.params)
        conv = [f"float({p})" for p in names] + ["0"] * (2 - len(names))
        args = f"({conv[0]}, {conv[1]})"
        if op.inplace:
            fns.append((n, f"def {n}(input{sig}, inplace=False):\n"
                           f"    return _act(_OP, input, {args}, inplace, {n!r})\n"))
            if op.method:
                fns.append((n + "_", f"def {n}_(self):\n"
                                     f"    return _act(_OP, self, (0, 0), True, {n!r})\n"))
        else:
            fns.append((n, f"def {n}(input{sig}):\n"
                           f"    return _act(_OP, input, {args}, False, {n!r})\n"))
    elif op.form == "binary":
        k = op.kind
        fns.append((n, f"def {n}(input, other, *, out=None):\n"
                       f"    return _binary({e!r}, {n!r}, input, other, out=out, kind={k!r})\n"))
        if op.inplace:
            fns.append((n + "_", f"def {n}_(self, other):\n    return _binary("
                                 f"{e!r}, {n + '_'!r}, self, other, inplace=True, kind={k!r})\n"))
    return fns


_GENERATED: dict = {}     # entry -> {attribute name: object} placed in this module
_METHODS: dict = {}       # entry -> the Tensor attributes installed for it
_PUBLISHED = False        # set once the module is loaded: later ops also go to nbx.ops / nbx


def _build(op) -> None:
    ns = {"__name__": __name__, "_OP": op, "_unary": _unary, "_unary_cast_": _unary_cast_,
          "_act": _act, "_binary": _binary}
    made = {}
    for fname, src in _source(op):
        exec(compile(src, f"<declared element-wise op {op.name}>", "exec"), ns)
        f = ns[fname]
        if fname != op.name:
            f.__doc__ = f"In-place {op.name} (Tensor.{fname})."
        elif op.doc:
            f.__doc__ = op.doc
        elif op.rule == "cmp":
            f.__doc__ = f"torch.{fname}: element-wise comparison, a bool tensor."
        else:
            f.__doc__ = f"torch.{fname}: element-wise {op.name}."
        made[fname] = f
    fn, fn_ = made.get(op.name), made.get(op.name + "_")
    for alias in op.aliases:
        made[alias] = fn
        if fn_ is not None:
            made[alias + "_"] = fn_
    methods = {}
    if op.method and fn is not None:
        for m in (op.name,) + op.aliases:
            methods[m] = fn
            if fn_ is not None:
                methods[m + "_"] = fn_
    for dunder in op.operators:
        if op.arity == 1:
            methods[dunder] = _dunder_unary(fn)
        elif dunder.startswith("__r") and dunder[3:] != "shift__":
            methods[dunder] = _rev(fn)
        elif dunder.startswith("__i"):
            methods[dunder] = _inplace(fn_)
        else:
            methods[dunder] = _fwd(fn)
    if op.entry in HAND_NAMES:
        raise ValueError(f"declare {op.name}: entry {op.entry!r} is hand-written here")
    g = globals()
    for k in made:
        if k in g:
            raise ValueError(f"declare {op.name}: nbx.{k} already exists")
    for k in methods:
        if k in Tensor.__dict__:
            raise ValueError(f"declare {op.name}: Tensor.{k} already exists")
    cpu_entry = _cpu.numpy_entry(op.entry, op.np)       # refuses a bad expression
    register(op.entry, "numpy")(cpu_entry)
    if op.complex:
        COMPLEX_NAMES.add(op.entry)
    SUPPORTED_DTYPES[op.entry] = op.dtypes
    for k, v in made.items():
        g[k] = v
    public = [k for k in made if not k.endswith("_")]
    __all__.extend(k for k in public if k not in __all__)
    if _PUBLISHED:
        import importlib
        for mod in (importlib.import_module("nbxtensor.ops"), importlib.import_module("nbxtensor")):
            for k in public:
                setattr(mod, k, made[k])
    _methods.install(**methods)
    _GENERATED[op.entry] = made
    _METHODS[op.entry] = methods


def _remove(op) -> None:
    """Undo `_build` (ops/_declare.undeclare)."""
    import importlib
    made = _GENERATED.pop(op.entry, {})
    g = globals()
    mods = [importlib.import_module("nbxtensor.ops"), importlib.import_module("nbxtensor")]
    for k in made:
        g.pop(k, None)
        if k in __all__:
            __all__.remove(k)
        for mod in mods:
            if getattr(mod, k, None) is made[k]:
                delattr(mod, k)
    _methods.uninstall(_METHODS.pop(op.entry, {}))
    if op.entry in HAND_NAMES:
        return
    _unregister(op.entry, "numpy")
    _unregister(op.entry, "triton")
    COMPLEX_NAMES.discard(op.entry)
    SUPPORTED_DTYPES.pop(op.entry, None)


def _unregister(name, family) -> None:
    from .. import dispatch
    dispatch._IMPLS.pop((name, family), None)
    dispatch._BY_DEVTYPE.clear()


def _dunder_unary(fn):
    def f(self):
        return fn(self)
    return f


def subscribe_declared(build, remove=None) -> None:
    """kernels/elementwise.py's hook into the declarations (ops/_declare.subscribe)."""
    _declare.subscribe(build, remove)


_declare.subscribe(_build, _remove)
_ROUND, _GELU, _GELU_TANH, _GLU = (_declare.OPS[n] for n in ("round", "gelu", "gelu_tanh", "glu"))
# every element-wise dispatch entry at import (the kernels register the declared ones as
# they are declared)
DISPATCH_NAMES = HAND_NAMES + tuple(_declare.OPS)
_PUBLISHED = True
