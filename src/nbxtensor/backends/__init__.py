"""Device backends: cpu (NumPy implementations), cuda (driver, allocator, launcher), interp."""
from __future__ import annotations

from .. import storage as _storage


def _first_cuda_allocate(device, nbytes):
    # the cuda backend (driver, allocator) is imported on the first cuda allocation, then
    # takes this function's place in the storage table
    from .cuda.storage import allocate
    _storage.register_allocator("cuda", allocate)
    return allocate(device, nbytes)


def _first_pinned_allocate(device, nbytes):
    # page-locked host memory (Tensor.pin_memory): the cuda backend's pinned allocator
    from .cuda.memory import PinnedHostStorage
    _storage.register_allocator("pinned", PinnedHostStorage.allocate)
    return PinnedHostStorage.allocate(device, nbytes)


_storage.register_allocator("cuda", _first_cuda_allocate)
_storage.register_allocator("pinned", _first_pinned_allocate)
