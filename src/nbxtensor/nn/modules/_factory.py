"""The device/dtype keywords every layer's constructor takes (torch's factory_kwargs)."""
from __future__ import annotations

from ...creation import empty, ones, zeros
from .module import Parameter


def param(shape, device=None, dtype=None) -> Parameter:
    return Parameter(empty(tuple(shape), dtype=dtype, device=device))


def zeros_buf(shape, device=None, dtype=None):
    return zeros(tuple(shape), dtype=dtype, device=device)


def ones_buf(shape, device=None, dtype=None):
    return ones(tuple(shape), dtype=dtype, device=device)
