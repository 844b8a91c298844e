"""CudaStorage: device memory from the caching allocator, with the storage interface.

A storage owns one allocator block (none when it is empty) and gives it back when it
dies. Copies to and from the host are synchronous: when the current stream is not the
legacy default stream, it is synchronised first, so a copy sees (and does not overtake)
the kernels queued on it.
"""
from __future__ import annotations

import numpy as np

from . import driver
from .memory import allocator_for
from .streams import check_sync_errors, current_streams
# the current stream of a device; a module global so that tests can stand a fake in for it
from .streams import current_handle as _stream_handle

__all__ = ["CudaStorage", "ForeignCudaStorage"]


# The launch check's mark: a storage whose `_nbx_launch` is `launch_token(d)` is known to be
# memory of device d's allocator, so a launch on d needs no allocator lookup for it. The
# launcher marks a storage after checking it once; `allocate` marks what it allocates (that
# memory is the allocator's by construction), so a fresh op output takes the fast launchers
# at once. `forget_launch_tokens` (tests) makes every earlier mark stale.
_launch_tokens: dict = {}   # device index -> the mark


def launch_token(index: int):
    t = _launch_tokens.get(index)
    if t is None:
        t = _launch_tokens.setdefault(index, ("verified on cuda", index))
    return t


def forget_launch_tokens() -> None:
    _launch_tokens.clear()


class CudaStorage:
    """`nbytes` of device memory on `device` (a cuda Device)."""

    # _nbx_launch: the launch check's mark (launch_token): set at allocation, or by the
    # launcher once it verified the storage (launcher._verify)
    __slots__ = ("device", "nbytes", "ptr", "_block", "_alloc", "_nbx_launch", "__weakref__")

    def __init__(self, device, nbytes: int, block, allocator):
        self.device = device
        self.nbytes = nbytes
        self.ptr = block.ptr if block is not None else 0
        self._block = block
        self._alloc = allocator

    @classmethod
    def allocate(cls, device, nbytes: int) -> "CudaStorage":
        if nbytes.__class__ is not int or nbytes < 0:
            raise ValueError(f"CudaStorage.allocate: nbytes must be an int >= 0, got {nbytes!r}")
        if nbytes == 0:
            return cls(device, 0, None, None)
        return allocate(device, nbytes)

    def __del__(self):
        b = self._block
        if b is not None:
            self._block = None
            try:
                self._alloc.free(b)
            except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to return it to
                pass

    def _check(self, what, offset, nbytes):
        # an empty range reads or writes nothing: an empty view may keep an offset past the
        # end of its (possibly empty) storage, as torch's do
        if offset < 0 or nbytes < 0 or (nbytes and offset + nbytes > self.nbytes):
            raise ValueError(f"CudaStorage.{what}: bytes [{offset}, {offset + nbytes}) lie outside "
                             f"the storage of {self.nbytes} bytes on {self.device}")

    def _sync_current(self, index):
        h = _stream_handle(index)
        if h:   # the sync copy orders after the legacy stream only; wait for ours explicitly
            driver.stream_synchronize(h)

    def to_host(self, offset: int, nbytes: int) -> np.ndarray:
        """A NumPy uint8 copy of bytes [offset, offset + nbytes)."""
        self._check("to_host", offset, nbytes)
        if driver._capturing:       # [graphs hook] a host read cannot be recorded in a graph
            driver.capture_refuse("Tensor.numpy() / .item() / .tolist() (a device-to-host read)")
        out = np.empty(nbytes, np.uint8)
        if nbytes:
            index = self.device.index or 0
            driver.set_device(index)
            self._sync_current(index)
            driver.memcpy_dtoh(out.ctypes.data, self.ptr + offset, nbytes)
        check_sync_errors()
        return out

    def from_host(self, offset: int, arr: np.ndarray) -> None:
        """Write the bytes of `arr` (made contiguous) at `offset`."""
        src = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        self._check("from_host", offset, src.nbytes)
        if driver._capturing:       # [graphs hook] a synchronous host write cannot be recorded
            driver.capture_refuse("a tensor made from host data (a synchronous host-to-device copy)")
        if src.nbytes:
            index = self.device.index or 0
            driver.set_device(index)
            self._sync_current(index)
            driver.memcpy_htod(self.ptr + offset, src.ctypes.data, src.nbytes)

    def __repr__(self):
        return f"<CudaStorage {self.device} ptr={self.ptr:#x} nbytes={self.nbytes}>"


class ForeignCudaStorage(CudaStorage):
    """Device memory another library owns (imported through DLPack or the CUDA array
    interface). `owner` keeps that memory alive and gives it back when this storage dies; the
    caching allocator never sees it, so it neither frees nor reuses it."""

    __slots__ = ("_owner",)

    def __init__(self, device, nbytes: int, ptr: int, owner):
        self.device = device
        self.nbytes = nbytes
        self.ptr = ptr
        self._block = self._alloc = None    # CudaStorage.__del__ then has nothing to free
        self._owner = owner

    @property
    def _nbx_launch(self):
        # the launch check's mark, always current: the producer handed this memory over as
        # device memory of `device`, so kernels on that device may read and write it
        return launch_token(self.device.index or 0)

    def __repr__(self):
        return f"<ForeignCudaStorage {self.device} ptr={self.ptr:#x} nbytes={self.nbytes}>"


_new = object.__new__


def allocate(device, nbytes: int) -> CudaStorage:
    """CudaStorage.allocate, flattened for the per-op output (Tensor._empty): no __init__ frame,
    the stream looked up in place."""
    if nbytes.__class__ is not int or nbytes <= 0:
        return CudaStorage.allocate(device, nbytes)     # the empty storage, or the error
    index = device.index or 0
    driver.set_device(index)    # (cheap when current; later driver calls may rely on it)
    alloc = allocator_for(index)
    s = current_streams.get(index)     # _stream_handle(index), inlined
    block = alloc.malloc(nbytes, 0 if s is None else s.handle)
    st = _new(CudaStorage)
    st.device = device
    st.nbytes = nbytes
    st.ptr = block.ptr
    st._block = block
    st._alloc = alloc
    st._nbx_launch = _launch_tokens.get(index) or launch_token(index)
    return st
