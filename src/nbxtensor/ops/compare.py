"""Closeness and equality of whole tensors: isclose, allclose, equal (torch's rules).

Written over the element-wise ops (eq, sub, abs, mul, le, isnan, isfinite), so they run on
every device those run on.
"""
from __future__ import annotations

import builtins

from .. import dtypes as _dt
from . import _methods
from . import elementwise as _ew
from . import reduction as _red
from ._common import check_tensor

__all__ = ["isclose", "allclose", "equal"]


def _pair(a, b, op):
    check_tensor(a, "input", op), check_tensor(b, "other", op)
    if a.device != b.device:
        raise ValueError(f"{op}: input is on {a.device} but other is on {b.device}; expected "
                         f"both on one device")


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):  # noqa: A002
    """|input - other| <= atol + rtol * |other|, element-wise, as torch.isclose.

    Both tensors must have one dtype (torch's rule). Equal values (inf included) are close;
    NaN is close to NaN only with equal_nan. Integer inputs subtract in their own dtype and
    compare with the tolerance in the default float dtype; bool inputs are compared as floats.
    """
    _pair(input, other, "isclose")
    if input.dtype is not other.dtype:
        raise TypeError(f"isclose: input and other must have the same dtype, got "
                        f"{input.dtype.name} and {other.dtype.name}")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if v < 0:
            raise ValueError(f"isclose: {name} must be greater than or equal to zero, got {v}")
    close = _ew.eq(input, other)
    if equal_nan and input.dtype.is_floating_point:
        close = _ew.logical_or(close, _ew.logical_and(_ew.isnan(input), _ew.isnan(other)))
    if rtol == 0 and atol == 0:
        return close
    a, b = input, other
    if a.dtype is _dt.bool:
        a, b = a.to(_dt.get_default_dtype()), b.to(_dt.get_default_dtype())
    allowed = _ew.add(_ew.abs(_ew.mul(b, rtol)), atol)
    actual = _ew.abs(_ew.sub(a, b))
    return _ew.logical_or(close, _ew.logical_and(_ew.isfinite(actual), _ew.le(actual, allowed)))


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> builtins.bool:  # noqa: A002
    """Whether every element of `input` is close to `other` (isclose(...).all())."""
    return builtins.bool(_red.all(isclose(input, other, rtol, atol, equal_nan)).item())


def equal(input, other) -> builtins.bool:  # noqa: A002
    """True when both tensors have one shape and equal elements (NaN is never equal).

    Tensors of different dtypes compare their values after promotion, as torch.equal."""
    _pair(input, other, "equal")
    if tuple(input.shape) != tuple(other.shape):
        return False
    if input.numel() == 0:
        return True
    return builtins.bool(_red.all(_ew.eq(input, other)).item())


_methods.install(isclose=isclose, allclose=allclose, equal=equal)
