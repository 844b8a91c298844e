"""CudaStorage: device memory from the caching allocator, with the storage interface.

A storage owns one allocator block (none when it is empty) and gives it back when it
dies. Copies to and from the host run on the current stream, so they are ordered with the
kernels queued there, and, as torch's, return only when done unless `non_blocking`:

* from pinned memory (memory.pinned_allocator holds it): one cuMemcpyHtoDAsync / DtoHAsync;
  non_blocking returns at once and records the use on the pinned block (not reused before
  the copy completed);
* from pageable memory of STAGE_MIN_BYTES or more: chunks copied by host threads into a ring
  of pinned buffers while the previous chunk's DMA runs (an event per buffer guards its
  reuse); non_blocking returns once the last chunk is queued (the source may be reused then);
* smaller pageable copies: the driver's synchronous copy, after the current stream.
A large device-to-host copy into pageable memory (Tensor.numpy()) is staged the same way,
in reverse: the DMA fills buffer k+1 while host threads copy buffer k out.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from . import driver
from .memory import allocator_for, pinned_allocator, pinned_array
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
            self._read_pageable(index, offset, out)
        check_sync_errors()
        return out

    def _read_pageable(self, index, offset, out) -> None:
        """Blocking copy into pageable `out`: staged when large, else the driver's copy."""
        if out.nbytes >= STAGE_MIN_BYTES:
            staging_ring(index).copy_out(out, self.ptr + offset, _stream_handle(index))
        else:
            self._sync_current(index)
            driver.memcpy_dtoh(out.ctypes.data, self.ptr + offset, out.nbytes)

    def from_host(self, offset: int, arr: np.ndarray, non_blocking: bool = False) -> None:
        """Write the bytes of `arr` (made contiguous) at `offset`, on the current stream."""
        src = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        self._check("from_host", offset, src.nbytes)
        if driver._capturing:       # [graphs hook] a host write cannot be recorded
            driver.capture_refuse("a tensor made from host data (a host-to-device copy)")
        n = src.nbytes
        if not n:
            return
        index = self.device.index or 0
        driver.set_device(index)
        dst, h = self.ptr + offset, _stream_handle(index)
        host = src.ctypes.data
        if pinned_allocator().holds(host, n):
            driver.memcpy_htod(dst, host, n, stream=h)
            _finish(index, h, host, non_blocking)
        elif n >= STAGE_MIN_BYTES:
            staging_ring(index).copy(dst, src, h)
            if not non_blocking:
                driver.stream_synchronize(h)
        else:
            self._sync_current(index)
            driver.memcpy_htod(dst, host, n)

    def to_host_into(self, offset: int, out: np.ndarray, non_blocking: bool = False) -> None:
        """Copy bytes [offset, offset + out.nbytes) into the contiguous host array `out`, on the
        current stream; non_blocking needs `out` in pinned memory (then the copy is async)."""
        n = out.nbytes
        self._check("to_host_into", offset, n)
        if driver._capturing:       # [graphs hook] a host read cannot be recorded in a graph
            driver.capture_refuse("a device-to-host copy")
        if not n:
            return
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("CudaStorage.to_host_into: out must be a writeable contiguous array")
        index = self.device.index or 0
        driver.set_device(index)
        host, h = out.ctypes.data, _stream_handle(index)
        if pinned_allocator().holds(host, n):
            driver.memcpy_dtoh(host, self.ptr + offset, n, stream=h)
            _finish(index, h, host, non_blocking)
        else:
            if non_blocking:
                raise ValueError("CudaStorage.to_host_into: non_blocking=True needs pinned memory "
                                 "for out (Tensor.pin_memory())")
            self._read_pageable(index, offset, out)
        if not non_blocking:
            check_sync_errors()

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


# ------------------------------------------------------------------ host -> device staging
# A pageable copy goes through pinned buffers: the driver's own pageable path stages through
# one bounce buffer, synchronously (2.4 GB/s measured for 256 MiB from a NumPy array, against
# torch's 8.4). Here host threads fill chunk k+1 (NumPy copies drop the GIL) while the DMA
# engine copies chunk k. The sizes are set from bench_transfer.py's sweep on the H200.
STAGE_MIN_BYTES = 2 << 20       # pageable copies from this size are staged
STAGE_CHUNK_BYTES = 8 << 20     # bytes a buffer holds (one DMA each)
STAGE_BUFFERS = 3               # ring size (>= 2 for overlap)
STAGE_SPLIT = 4                 # a copy is cut into at least this many chunks (overlap for
STAGE_MIN_CHUNK = 2 << 20       # mid sizes), none smaller than this
FILL_THREADS = max(1, min(4, os.cpu_count() or 1))
FILL_PART_MIN = 1 << 20         # a chunk is split over the threads in parts of at least this


def _chunk_for(n: int) -> int:
    """The chunk a staged copy of n bytes is cut into: n / STAGE_SPLIT, within
    [STAGE_MIN_CHUNK, STAGE_CHUNK_BYTES], page-aligned."""
    c = max(STAGE_MIN_CHUNK, -(-n // STAGE_SPLIT))
    return min(STAGE_CHUNK_BYTES, -(-c // 4096) * 4096)


def _finish(index, stream, host, non_blocking):
    """After an async copy from/to pinned memory: wait for it, or mark the block in use."""
    if non_blocking:
        pinned_allocator().record_use(host, stream, index)
    else:
        driver.stream_synchronize(stream)


class StagingRing:
    """The pinned buffers of one device's staged copies (made on first use, kept for the
    process; one copy at a time, so threads take turns)."""

    def __init__(self, index: int):
        self.index = index
        self._lock = threading.Lock()
        self._bufs = []         # [(uint8 pinned array, event, pending)]
        self._shape = None      # (chunk bytes, buffers) the ring was made for

    def _ensure(self, chunk, nbuf):
        if self._shape == (chunk, nbuf):
            return
        self.release()
        # the pinned allocator's cache keeps idle buffers, so a new ring of the same sizes
        # pins nothing
        self._bufs = [[pinned_array(chunk), driver.event_create(timing=False), False]
                      for _ in range(nbuf)]
        self._shape = (chunk, nbuf)

    def release(self) -> None:
        """Drop the buffers (waiting for their copies); the pinned cache keeps the memory."""
        for buf in self._bufs:
            if buf[2]:
                driver.event_synchronize(buf[1])
            driver.event_destroy(buf[1])
        self._bufs, self._shape = [], None

    def copy(self, dst: int, src: np.ndarray, stream: int) -> None:
        """Queue the copy of the uint8 array `src` to device address `dst` on `stream`; returns
        when every chunk is queued (the source is no longer read)."""
        nbuf = STAGE_BUFFERS
        with self._lock:
            self._ensure(STAGE_CHUNK_BYTES, nbuf)
            n, k = src.nbytes, 0
            chunk = _chunk_for(n)
            for off in range(0, n, chunk):
                buf = self._bufs[k]
                if buf[2]:
                    driver.event_synchronize(buf[1])     # this buffer's last DMA is done
                take = min(chunk, n - off)
                fill(buf[0][:take], src[off:off + take])
                driver.memcpy_htod(dst + off, buf[0].ctypes.data, take, stream=stream)
                driver.event_record(buf[1], stream)
                buf[2] = True
                k = (k + 1) % nbuf

    def copy_out(self, out: np.ndarray, src: int, stream: int) -> None:
        """Copy device bytes at `src` into the uint8 array `out` on `stream`: chunk i lands in
        buffer i % n by DMA while host threads copy the chunk before it out; returns when all
        of `out` is written."""
        nbuf = STAGE_BUFFERS
        with self._lock:
            self._ensure(STAGE_CHUNK_BYTES, nbuf)
            n = out.nbytes
            chunk = _chunk_for(n)
            starts = range(0, n, chunk)

            def queue(i):
                buf = self._bufs[i % nbuf]
                if buf[2]:
                    driver.event_synchronize(buf[1])
                take = min(chunk, n - starts[i])
                driver.memcpy_dtoh(buf[0].ctypes.data, src + starts[i], take, stream=stream)
                driver.event_record(buf[1], stream)
                buf[2] = True
            for i in range(min(nbuf, len(starts))):
                queue(i)
            for i, off in enumerate(starts):
                buf = self._bufs[i % nbuf]
                driver.event_synchronize(buf[1])        # chunk i has landed in buffer i % n
                buf[2] = False
                take = min(chunk, n - off)
                fill(out[off:off + take], buf[0][:take])
                if i + nbuf < len(starts):
                    queue(i + nbuf)


_rings: dict = {}
_rings_lock = threading.Lock()


def staging_ring(index: int) -> StagingRing:
    r = _rings.get(index)
    if r is None:
        with _rings_lock:
            r = _rings.setdefault(index, StagingRing(index))
    return r


_executor = [None]


def fill(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[:] = src, split over FILL_THREADS host threads when large."""
    n = src.nbytes
    parts = min(FILL_THREADS, n // FILL_PART_MIN)
    if parts <= 1:
        np.copyto(dst, src)
        return
    ex = _executor[0]
    if ex is None or ex._max_workers < parts - 1:
        from concurrent.futures import ThreadPoolExecutor
        if ex is not None:
            ex.shutdown(wait=False)
        ex = _executor[0] = ThreadPoolExecutor(max_workers=max(1, FILL_THREADS - 1),
                                               thread_name_prefix="nbx-fill")
    step = -(-(-(-n // parts)) // 4096) * 4096          # page-aligned parts
    futs = [ex.submit(np.copyto, dst[a:a + step], src[a:a + step]) for a in range(step, n, step)]
    try:
        np.copyto(dst[:step], src[:step])
    finally:
        for f in futs:      # every worker done before the caller may reuse dst (or raise)
            f.result()
