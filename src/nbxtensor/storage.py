"""Storage: a flat run of bytes on one device. Tensors are views over a storage.

Every storage kind offers the same small interface, so `Tensor` never asks which
device it is on:

    device         the Device
    nbytes         size in bytes
    ptr            address of byte 0 (host address for cpu/interp, device address for cuda)
    to_host(off, n)       -> NumPy uint8 array with bytes [off, off+n)  (a copy)
    from_host(off, arr)   writes a contiguous NumPy array's bytes at off
    host_array()          cpu/interp only: the uint8 NumPy array itself (no copy)

cuda storage lives in backends/cuda/storage.py; the backends register it (register_allocator)
and it is imported only when first used.
"""
from __future__ import annotations

import numpy as np

from .device import Device

__all__ = ["HostStorage", "new_storage"]


class HostStorage:
    """Host memory held as a 1-D uint8 NumPy array (cpu and interp devices)."""

    __slots__ = ("device", "_array", "__weakref__")

    def __init__(self, device: Device, array: np.ndarray):
        assert array.dtype == np.uint8 and array.ndim == 1
        self.device = device
        self._array = array

    @classmethod
    def allocate(cls, device: Device, nbytes: int) -> "HostStorage":
        # 64-byte aligned, so Triton's 16-byte-alignment specialisation applies on interp too
        raw = np.empty(nbytes + 64, np.uint8)
        start = (-raw.ctypes.data) % 64
        return cls(device, raw[start:start + nbytes])

    @property
    def nbytes(self) -> int:
        return self._array.nbytes

    @property
    def ptr(self) -> int:
        return self._array.ctypes.data

    def host_array(self) -> np.ndarray:
        return self._array

    def to_host(self, offset: int, nbytes: int) -> np.ndarray:
        return self._array[offset:offset + nbytes].copy()

    def from_host(self, offset: int, arr: np.ndarray) -> None:
        src = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        self._array[offset:offset + src.nbytes] = src


def new_storage(device: Device, nbytes: int) -> "HostStorage":
    """Allocate `nbytes` of uninitialised memory on `device`."""
    return (ALLOCATE.get(device.type) or _allocator_of(device.type))(device, nbytes)


def _allocator_of(kind):
    raise RuntimeError(f"no storage for device type {kind!r}: its backend registered no "
                       f"allocator (storage.register_allocator)")


def register_allocator(kind: str, allocate) -> None:
    """Make `allocate(device, nbytes)` the storage of device type `kind`. The backends above
    this layer register theirs (backends/__init__.py: cuda's, which imports the driver on the
    first cuda allocation)."""
    ALLOCATE[kind] = allocate


# device type -> allocate(device, nbytes) (Tensor._empty looks here directly: a function call
# less per op)
ALLOCATE: dict = {"cpu": HostStorage.allocate, "interp": HostStorage.allocate}
