"""Tensor.new_* factories and type_as: a new tensor with this tensor's dtype and device
unless others are given (torch's rules; new_tensor copies its data)."""
from __future__ import annotations

from .. import creation as _cr
from ..tensor import Tensor, normalize_size
from . import _methods

__all__: list = []


def _dd(self, dtype, device):
    return (self.dtype if dtype is None else dtype, self.device if device is None else device)


def _new_empty(self, *size, dtype=None, device=None, requires_grad=False, layout=None,
               pin_memory=False):
    dtype, device = _dd(self, dtype, device)
    return _cr.empty(*size, dtype=dtype, device=device)


def _new_zeros(self, *size, dtype=None, device=None, requires_grad=False, layout=None,
               pin_memory=False):
    return _new_empty(self, *size, dtype=dtype, device=device).fill_(0)


def _new_ones(self, *size, dtype=None, device=None, requires_grad=False, layout=None,
              pin_memory=False):
    return _new_empty(self, *size, dtype=dtype, device=device).fill_(1)


def _new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False,
              layout=None, pin_memory=False):
    dtype, device = _dd(self, dtype, device)
    return _cr.full(normalize_size((size,)), fill_value, dtype=dtype, device=device)


def _new_tensor(self, data, dtype=None, device=None, requires_grad=False, pin_memory=False):
    dtype, device = _dd(self, dtype, device)
    return _cr.tensor(data, dtype=dtype, device=device)


def logspace(start, end, steps, base=10.0, *, dtype=None, device=None, layout=None,
             requires_grad=False, out=None):
    """base ** linspace(start, end, steps), in float64 before the cast to `dtype` (default:
    the default float dtype), as torch computes its steps."""
    from .. import dtypes as _dt
    dt = _dt.get_default_dtype() if dtype is None else _dt.as_dtype(dtype)
    exps = _cr.linspace(start, end, steps, dtype=_dt.float64, device=device)
    res = (float(base) ** exps).to(dt)
    return res if out is None else out.copy_(res)


def _type_as(self, other):
    """This tensor as `other`'s dtype and device (a no-op when they already match)."""
    if not isinstance(other, Tensor):
        raise TypeError(f"type_as: other must be a Tensor, got {type(other).__name__}")
    return self.to(device=other.device, dtype=other.dtype)


_methods.install(new_empty=_new_empty, new_zeros=_new_zeros, new_ones=_new_ones,
                 new_full=_new_full, new_tensor=_new_tensor, type_as=_type_as)
