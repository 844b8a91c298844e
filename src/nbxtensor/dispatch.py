"""The one seam between an op and its implementation.

An op (in `nbxtensor.ops`) validates its inputs, works out the result's shape and
dtype, allocates the output, and then calls `impl(name, device)(...)` to fill it.

Two implementation families exist:
  "numpy"   for the cpu device       -- modules in nbxtensor.backends.cpu
  "triton"  for cuda and interp      -- modules in nbxtensor.kernels (the same kernels;
                                         the launcher picks the driver from the device)

Implementations register themselves with `@register("name", "numpy")` at import time.
The modules of a family are imported on the first dispatch to that family, so
`import nbxtensor` never imports triton.
"""
from __future__ import annotations

import importlib
import pkgutil

from .device import Device

__all__ = ["register", "impl", "family_of", "NotImplementedOnDevice"]

_FAMILY_PACKAGES = {"numpy": "nbxtensor.backends.cpu", "triton": "nbxtensor.kernels"}
_IMPLS: dict[tuple[str, str], object] = {}
_loaded: set[str] = set()
_BY_DEVTYPE: dict[tuple[str, str], object] = {}   # (name, device.type) -> fn: impl()'s hot path


class DeviceValueError(str):
    """The `what` of an error record (kernels/indexing's flag) for a value check a kernel
    makes rather than an index range: the flag reports it as ValueError(f"{op}: {what}")."""


class NotImplementedOnDevice(NotImplementedError):
    """An op has no implementation for the device it was called on."""


def family_of(device: Device) -> str:
    return "numpy" if device.type == "cpu" else "triton"


def register(name: str, family: str):
    """Decorator: register `fn` as the `family` implementation of op `name`."""
    if family not in _FAMILY_PACKAGES:
        raise ValueError(f"register: family must be one of {sorted(_FAMILY_PACKAGES)}, got {family!r}")

    def deco(fn):
        key = (name, family)
        if key in _IMPLS and _IMPLS[key] is not fn:
            raise RuntimeError(f"register: op {name!r} already has a {family} implementation "
                               f"({_IMPLS[key].__module__})")
        _IMPLS[key] = fn
        _BY_DEVTYPE.clear()
        return fn
    return deco


def _load(family: str) -> None:
    if family in _loaded:
        return
    pkg = importlib.import_module(_FAMILY_PACKAGES[family])
    for mod in pkgutil.iter_modules(pkg.__path__):
        if not mod.name.startswith("_"):
            # a module that fails to import raises here, every time, instead of leaving its
            # ops silently "not implemented on this device"
            importlib.import_module(f"{pkg.__name__}.{mod.name}")
    _loaded.add(family)


def impl(name: str, device: Device):
    """The implementation of op `name` for `device`, or NotImplementedOnDevice."""
    fn = _BY_DEVTYPE.get((name, device.type))
    if fn is not None:
        return fn
    family = family_of(device)
    fn = _IMPLS.get((name, family))
    if fn is None:
        _load(family)
        fn = _IMPLS.get((name, family))
        if fn is None:
            raise NotImplementedOnDevice(f"{name} is not implemented on device {device}")
    _BY_DEVTYPE[(name, device.type)] = fn
    return fn
