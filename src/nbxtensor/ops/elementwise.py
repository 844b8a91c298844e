"""Element-wise ops: unary, activations, binary, ternary, and the Python operators.

Every element-wise op is a declaration (ops/_declare.py): its function, in-place form, Tensor
methods and operators are generated at the end of this module. What is written here by hand is
the path they share (`_run`, the `_binary` fast path), the runners the declarations name for
arguments that are not a formula (alpha=, rounding_mode=, pow's exponent, clamp's bounds,
where's condition, lerp's weight, addcmul's value), and the few functions over other ops
(round's decimals, square, rsub, float_power, gelu's approximate=, glu's halves).

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
from ..declarations import parameter_list as _param_list, parameters as _params
from ..dispatch import impl, register
from ..plans import memoize
from ..tensor import Tensor, broadcast_shapes, normalize_dim
from . import _declare, _methods

# the hand-written functions; every declared op (ops/_declare.py) appends its names in `_build`
__all__ = ["round", "square", "gelu", "glu", "can_cast", "logit", "rsub", "float_power",
           "positive"]

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


# long: the per-call path of every element-wise op, kept in one frame (a call costs ~0.1 us)
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
    return _pow(_declare.OPS["pow"], "float_power_", True, self,
                _to_f64(exponent, "float_power_", "exponent"), None)


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


# ----------------------------------------------------------------------------- runners
# A declaration of form "call" (ops/_declare.py) names one of these: its generated function
# calls runner(op, fname, inplace, *its parameters), `op` the declaration.
def _nan_to_num(op, fname, inplace, input, nan, posinf, neginf, out):  # noqa: A002
    """NaN -> nan, +inf -> posinf (default: dtype max), -inf -> neginf; ints/bool copied."""
    if not isinstance(input, Tensor):
        raise TypeError(f"{fname}: {'self' if inplace else 'input'} must be a Tensor, got "
                        f"{type(input).__name__}")
    for an, v in (("nan", nan), ("posinf", posinf), ("neginf", neginf)):
        if v is not None and (not isinstance(v, _NUMBER) or isinstance(v, (bool, np.bool_))):
            raise TypeError(f"{fname}: {an} must be a float or None, got {v!r}")
    d = input.dtype
    if d.kind != "f":
        if inplace:
            return input
        return input.clone() if out is None else out.copy_(input)
    fi = _dt.finfo(d)
    posinf = fi.max if posinf is None else float(posinf)
    neginf = fi.min if neginf is None else float(neginf)
    return _run(op.entry, fname, [input, posinf, neginf], ["input", "posinf", "neginf"], d,
                out=out, params=(float(nan), 0), inplace=input if inplace else None)


def _clamp(op, fname, inplace, input, lo, hi, out):  # noqa: A002
    """clamp with scalar or tensor bounds, either optional: the clamp, clamp_min or clamp_max
    entry."""
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
    entry = "clamp" if lo is not None and hi is not None else ("clamp_min" if lo is not None
                                                               else "clamp_max")
    return _run(entry, fname, ops, names, res, out=out, inplace=input if inplace else None)


def _clamp_min(op, fname, inplace, input, lo, out):  # noqa: A002
    return _clamp(op, fname, inplace, input, lo, None, out)


def _clamp_max(op, fname, inplace, input, hi, out):  # noqa: A002
    return _clamp(op, fname, inplace, input, None, hi, out)


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
_PY_NUMBER = (int, float, bool)
_ZERO_OF = {int: 0, float: 0.0, bool: False}
# the bool refusal of each entry under kind "nobool" (sub), filled by `_build`
_BOOL_ERRORS: dict = {}


@memoize("ops.elementwise.expand", 4096)
def _expand_strides(shape, strides, target):
    """The strides of x.expand(target) for an x of (shape, strides) that broadcasts to it."""
    return Tensor._make(None, shape, strides, 0, _dt.float32).expand(target)._stride


def _expanded(x, shape):
    """x.expand(shape) for an x known to broadcast to `shape`, with the strides memoised."""
    if x._shape == shape:
        return x
    return Tensor._make(x._storage, shape, _expand_strides(x._shape, x._stride, shape),
                        x._offset, x._dtype)


class _Kind:
    """An operand as promotion sees it: a dtype and a number of dims (dtypes.result_type)."""
    __slots__ = ("dtype", "ndim")

    def __init__(self, dtype, shape):
        self.dtype, self.ndim = dtype, len(shape)


def _binary_checks(fname, name, kind, res):
    """(compute dtype or None, out dtype or None) of a binary of promoted dtype `res` under
    `kind`; raises for operands the kind refuses."""
    if kind in ("truediv", "float"):
        return None, None, _default_float_if_int(res)
    if kind in ("cmp", "logical"):
        return _compute_dtype(res), _dt.bool, res
    if kind == "int":
        if res.kind == "f":
            raise TypeError(f"{fname}: expected integer or bool operands, got {res.name}")
    elif kind == "nobool":
        if res is _dt.bool:
            raise TypeError(f"{fname}: {_BOOL_ERRORS[name]}")
    elif kind == "shift":
        if res.kind not in "ui":
            raise TypeError(f"{fname}: expected integer operands, got {res.name}")
    elif kind == "floatonly":
        if res.kind != "f":
            raise TypeError(f"{fname}: expected floating point operands, got {res.name}")
    elif kind == "f3264":
        if res not in (_dt.float32, _dt.float64):
            raise TypeError(f"{fname}: expected float32 or float64 operands, got {res.name}")
    return None, None, res


@memoize("ops.elementwise.binary", 4096)
def _binary_plan(name, kind, ka, kb, default_float, sa, sb, self_stride):
    """The inference of a binary call from its operands' kinds, memoised: ka / kb a DType
    (a tensor of shape sa / sb) or a Python number class (shape None); default_float keys the
    promotion of ints with floats; self_stride: a's strides when a is written in place (None:
    a fresh or out= result). -> (out dtype, compute dtype, result shape). Raises where the
    full path refuses; the caller then runs the full path for its message. The operands'
    values (an int scalar that must fit) are checked per call."""
    a = _Kind(ka, sa) if sa is not None else _ZERO_OF[ka]
    b = _Kind(kb, sb) if sb is not None else _ZERO_OF[kb]
    ct, out_dtype, res = _binary_checks("", name, kind, _dt.result_type(a, b))
    ct = ct or _compute_dtype(res)
    out_dtype = out_dtype or res
    if ct.kind == "c" and name not in COMPLEX_NAMES:
        raise TypeError("complex")
    if sa is None or sb is None:
        shape = sa if sb is None else sb
    else:
        shape = sa if sa == sb else broadcast_shapes(sa, sb)
    if self_stride is not None:
        # in place into a: the result has a's shape, casts into a's dtype, and a owns every
        # element (no stride-0 dims)
        if shape != sa or not can_cast(out_dtype, ka) or any(
                st == 0 and n > 1 for n, st in zip(sa, self_stride)):
            raise ValueError("in place")
    return out_dtype, ct, shape


def _binary(name, fname, a, b, out=None, inplace=False, params=(0, 0), kind="arith"):
    """kind: arith (result_type), truediv / float (ints -> default float), cmp and logical
    (bool result), int (integer/bool only), nobool (a bool result refused), shift, floatonly,
    f3264. Two tensors on one device, or a tensor and a Python number, take the memoised
    inference (`_binary_plan`); everything else, and every refusal, the full path."""
    ca, cb = a.__class__, b.__class__
    hit = None
    try:
        if ca is Tensor:
            if cb is Tensor:
                da, db = a._storage.device, b._storage.device
                if (da is db or da == db) and not (inplace and (
                        kind == "cmp" or kind == "logical" or b._storage is a._storage)):
                    hit = _binary_plan(name, kind, a._dtype, b._dtype, _dt._default_float,
                                       a._shape, b._shape, a._stride if inplace else None)
            elif cb in _PY_NUMBER and not (inplace and (kind == "cmp" or kind == "logical")):
                hit = _binary_plan(name, kind, a._dtype, cb, _dt._default_float, a._shape,
                                   None, a._stride if inplace else None)
        elif cb is Tensor and ca in _PY_NUMBER and not inplace:
            hit = _binary_plan(name, kind, ca, b._dtype, _dt._default_float, None, b._shape,
                               None)
    except (TypeError, ValueError):
        hit = None
    if hit is not None:
        out_dtype, ct, shape = hit
        if out is not None:
            if not inplace and out.__class__ is Tensor and _binary_into(
                    name, fname, a, b, out, hit, params):
                return out
        elif inplace:
            if cb is not Tensor:
                if cb is int and ct.kind in "ui":
                    _check_int_scalar(b, ct, fname, "other")
            elif b._shape != shape:
                b = _expanded(b, shape)
            if math.prod(shape):
                impl(name, a._storage.device)(a, [a, b], params, ct)
            return a
        elif cb is Tensor and ca is Tensor:
            return _fresh(name, shape, out_dtype, ct, a._storage.device,
                          [_expanded(a, shape), _expanded(b, shape)], params)
        else:
            t, s = (a, b) if ca is Tensor else (b, a)
            if s.__class__ is int and ct.kind in "ui":
                _check_int_scalar(s, ct, fname, "other" if t is a else "input")
            return _fresh(name, shape, out_dtype, ct, t._storage.device, [a, b], params)
    if inplace:
        _check_self(a, fname)
    a = _check_operand(a, fname, "input")
    b = _check_operand(b, fname, "other")
    ct, out_dtype, res = _binary_checks(fname, name, kind, _dt.result_type(a, b))
    if kind in ("cmp", "logical") and inplace:
        # torch writes the bool result into self's dtype
        return _run(name, fname, [a, b], ["input", "other"], _dt.bool, compute_dtype=ct,
                    out_dtype=_dt.bool, inplace=a)
    return _run(name, fname, [a, b], ["input", "other"], res, out=out, params=params,
                compute_dtype=ct, out_dtype=out_dtype, inplace=a if inplace else None)


def _binary_into(name, fname, a, b, out, hit, params) -> bool:
    """The inferred binary call (`hit` from _binary_plan) written into `out` when `_out_fits`:
    True when done, else False (the full path)."""
    out_dtype, ct, shape = hit
    t = a if a.__class__ is Tensor else b
    sc = None if b.__class__ is Tensor and a.__class__ is Tensor else (b if t is a else a)
    ops = [_expanded(a, shape) if a.__class__ is Tensor else a,
           _expanded(b, shape) if b.__class__ is Tensor else b]
    if not _out_fits(out, shape, out_dtype, t._storage.device, ops):
        return False
    if sc.__class__ is int and ct.kind in "ui":
        _check_int_scalar(sc, ct, fname, "other" if sc is b else "input")
    if math.prod(shape):
        impl(name, t._storage.device)(out, ops, params, ct)
    return True


def _alpha_op(op, fname, input, other, alpha, out=None, inplace=False):  # noqa: A002
    """A binary with alpha= (add, sub): the op's entry for alpha == 1, else its `alpha` entry
    (x + p0 * y) with alpha checked against the operands' dtype."""
    base, kind = op.entry, op.kind
    res = _dt.result_type(_check_operand(input, fname, "input"), _check_operand(other, fname, "other"))
    if not isinstance(alpha, _NUMBER):
        raise TypeError(f"{fname}: alpha must be a number, got {type(alpha).__name__}")
    alpha = _number(alpha)
    if res.kind not in "fc" and isinstance(alpha, (float, complex)):
        raise TypeError(f"{fname}: for integral input tensors, argument alpha must not be a "
                        f"floating point number")
    if res.kind != "c" and isinstance(alpha, complex):
        raise TypeError(f"{fname}: a complex alpha needs complex operands, got {res.name}")
    if res is _dt.bool and kind == "nobool":
        raise TypeError(f"{fname}: {op.bool_error}")
    if alpha == 1:
        return _binary(base, fname, input, other, out=out, inplace=inplace, kind=kind)
    _check_int_scalar(alpha, _compute_dtype(res), fname, "alpha")
    return _binary(op.alpha, fname, input, other, out=out, inplace=inplace,
                   params=(alpha, 0), kind=kind)


def _rounded(op, fname, input, other, rounding_mode, out=None, inplace=False):  # noqa: A002
    """A binary with rounding_mode= (div): the entry the declaration's `rounding` names, in
    that entry's own dtype rule (floor and trunc keep integer results)."""
    for mode, entry in op.rounding:
        if rounding_mode == mode:
            return _binary(entry, fname, input, other, out=out, inplace=inplace,
                           kind=_declare.OPS[entry].kind)
    modes = ", ".join(repr(m) for m, _ in op.rounding)
    raise ValueError(f"{fname}: rounding_mode must be None, {modes}, got {rounding_mode!r}")


def _pow(op, fname, inplace, input, exponent, out):  # noqa: A002
    """pow. Integer tensors to negative integer powers: 0, except bases 1 and -1."""
    if inplace:
        _check_self(input, fname)
    a = _check_operand(input, fname, "input")
    b = _check_operand(exponent, fname, "exponent")
    res = _dt.result_type(a, b)
    if res.kind in "ui" and not isinstance(b, Tensor) and b < 0:
        raise ValueError(f"{fname}: integers to negative integer powers are not allowed "
                         f"(exponent {b})")
    return _run(op.entry, fname, [a, b], ["input", "exponent"], res, out=out,
                compute_dtype=_dt.uint8 if res is _dt.bool else None,
                inplace=a if inplace else None)


# ----------------------------------------------------------------------------- ternary
def _where(op, fname, inplace, condition, input, other, out):  # noqa: A002
    """input where condition is true, else other; where(condition) alone is nonzero's tuple."""
    if input is None and other is None:
        from .reduction import nonzero
        return nonzero(condition, as_tuple=True)
    if not isinstance(condition, Tensor):
        raise TypeError(f"{fname}: condition must be a Tensor, got {type(condition).__name__}")
    if condition.dtype not in (_dt.bool, _dt.uint8):
        raise TypeError(f"{fname}: condition must be a bool tensor, got {condition.dtype.name}")
    a = _check_operand(input, fname, "input")
    b = _check_operand(other, fname, "other")
    res = _dt.result_type(a, b)
    return _run(op.entry, fname, [condition, a, b], ["condition", "input", "other"], res,
                out=out)


def _lerp(op, fname, inplace, input, end, weight, out):  # noqa: A002
    """input + weight * (end - input), torch's form that is exact at weight 1."""
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
    return _run(op.entry, fname, [input, end, w], ["input", "end", "weight"], input.dtype,
                out=out, inplace=input if inplace else None)


def _addc(op, fname, inplace, input, t1, t2, value, out):  # noqa: A002
    """addcmul / addcdiv: input + value * (tensor1 op tensor2)."""
    ops = [_check_operand(input, fname, "input"), _check_operand(t1, fname, "tensor1"),
           _check_operand(t2, fname, "tensor2")]
    res = _dt.result_type(*ops)
    if not isinstance(value, _NUMBER):
        raise TypeError(f"{fname}: value must be a number, got {type(value).__name__}")
    value = _number(value)
    if op.rule == "floatonly" and res.kind != "f":
        raise TypeError(f"{fname}: integer division with addcdiv is not supported; use "
                        f"floating point tensors")
    if res.kind != "f" and isinstance(value, float):
        raise TypeError(f"{fname}: for integer tensors, value must be an integer, got {value}")
    return _run(op.entry, fname, ops, ["input", "tensor1", "tensor2"], res, out=out,
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


def _method(fn):
    """A method spelling of a function whose first argument is the tensor."""
    def m(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    m.__name__ = fn.__name__
    m.__doc__ = fn.__doc__
    return m


_methods.install(
    round=_method(round), round_=round_, square=_method(square), logit=_method(logit),
    logit_=logit_, float_power=_method(float_power), float_power_=float_power_,
    positive=positive, __pos__=lambda self: self,
)
# __matmul__ / __rmatmul__ are installed by ops.linalg (matmul lives there).


# ----------------------------------------------------------------------------- declared ops
# Every op of ops/_declare.py gets here: its public function(s) in this module (and so in
# nbx.ops / nbx), its Tensor methods and operators, its cpu entry (the NumPy expression, by
# backends/cpu/elementwise.py), its dtypes for docs/ops.md. kernels/elementwise.py subscribes
# to the same table for the kernel branch. The functions are generated as source so that
# each has torch's signature and calls its runner (`_unary`, `_act`, `_binary`) directly.

# the dispatch names that take complex operands (cpu: NumPy; cuda/interp: kernels/complex.py);
# every other element-wise op refuses a complex compute dtype in `_run`. Declared ops join
# with complex=True.
COMPLEX_NAMES: set = set()
# dtypes each dispatch entry accepts (the op-support table in docs/ops.md shows them)
SUPPORTED_DTYPES: dict = {}


def _call_source(op, fname, params, inplace, values) -> str:
    """def fname(<params>): return <runner>(_OP, fname, inplace, <values>)."""
    return (f"def {fname}({_param_list(params)}):\n"
            f"    return {op.runner}(_OP, {fname!r}, {inplace}, {', '.join(values)})\n")


def _source(op) -> list:
    """(name, python source) of the functions (and a method of its own, "method") that `op`'s
    form calls for."""
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
        for fname, a, tail in ((n, "input", "out=out"), (n + "_", "self", "inplace=True")):
            if fname != n and not op.inplace:
                continue
            call = f"_binary({e!r}, {fname!r}, {a}, other, {tail}, kind={k!r})"
            out = ", out=None" if fname == n else ""
            io = "out, False" if fname == n else "None, True"
            # alpha= / rounding_mode=: the common value goes straight to _binary, any other
            # to the runner that picks the declared entry
            extra = (("alpha=1", "alpha.__class__ is int and alpha == 1",
                      f"_alpha_op(_OP, {fname!r}, {a}, other, alpha, {io})") if op.alpha else
                     ("rounding_mode=None", "rounding_mode is None",
                      f"_rounded(_OP, {fname!r}, {a}, other, rounding_mode, {io})")
                     if op.rounding else None)
            if extra is not None:
                kw, common, other = extra
                fns.append((fname, f"def {fname}({a}, other, *, {kw}{out}):\n"
                                   f"    if {common}:\n        return {call}\n"
                                   f"    return {other}\n"))
            else:
                sig = "other, *, out=None" if fname == n else "other"
                fns.append((fname, f"def {fname}({a}, {sig}):\n    return {call}\n"))
    elif op.form == "call":
        params = _params(op.signature)
        names = [p for p, _, _ in params]
        fns.append((n, _call_source(op, n, params, False, names)))
        if op.inplace:
            # f_(self, <the rest but out>): the first parameter is self, no out=
            rest = [p for p in params[1:] if p[0] != "out"]
            fns.append((n + "_", _call_source(
                op, n + "_", [("self", None, False)] + rest, True,
                ["self"] + [p if p != "out" else "None" for p in names[1:]])))
        if isinstance(op.method, str):
            # a method with its own argument order: the string lists the function's leading
            # parameters, `self` in the place of the one the tensor fills
            given = [a.strip() for a in op.method.split(",")]
            values = given + [d or "None" for _, d, _ in params[len(given):]]
            mparams = [("self", None, False)] + [p for p, g in zip(params, given) if g != "self"]
            fns.append(("method " + n, _call_source(op, n, mparams, False, values)))
    return fns


_GENERATED: dict = {}     # entry -> {attribute name: object} placed in this module
_METHODS: dict = {}       # entry -> the Tensor attributes installed for it
_PUBLISHED = False        # set once the module is loaded: later ops also go to nbx.ops / nbx


def _build(op) -> None:
    ns = {"__name__": __name__, "_OP": op, "_unary": _unary, "_unary_cast_": _unary_cast_,
          "_act": _act, "_binary": _binary, "_alpha_op": _alpha_op, "_rounded": _rounded}
    if op.runner:
        if not callable(globals().get(op.runner)):
            raise ValueError(f"declare {op.name}: runner {op.runner!r} is not a function of "
                             f"ops/elementwise.py")
        ns[op.runner] = globals()[op.runner]
    made = {}
    own_method = None
    for fname, src in _source(op):
        exec(compile(src, f"<declared element-wise op {op.name}>", "exec"), ns)
        f = ns[fname.split()[-1]]
        if fname.startswith("method "):     # a method with its own parameters
            f.__doc__ = op.doc or f"Tensor.{op.name}."
            own_method = f
            continue
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
            methods[m] = own_method or fn
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
    _BOOL_ERRORS[op.entry] = op.bool_error
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
    _unregister(op.entry, "numpy")
    _unregister(op.entry, "triton")
    COMPLEX_NAMES.discard(op.entry)
    SUPPORTED_DTYPES.pop(op.entry, None)
    _binary_plan.cache_clear()     # its answers read COMPLEX_NAMES and _BOOL_ERRORS


def _unregister(name, family) -> None:
    from .. import dispatch
    dispatch._IMPLS.pop((name, family), None)
    dispatch._BY_DEVTYPE.clear()


def _dunder_unary(fn):
    def f(self):
        return fn(self)
    return f


_declare.subscribe(_build, _remove)
_ROUND, _GELU, _GELU_TANH, _GLU = (_declare.OPS[n] for n in ("round", "gelu", "gelu_tanh", "glu"))
# every element-wise dispatch entry at import (the kernels register the declared ones as
# they are declared)
DISPATCH_NAMES = tuple(_declare.OPS)
_PUBLISHED = True
