"""Host -> GPU uploads through a small ring of pinned staging buffers, with overlap.

A memory-mapped weight file cannot be DMA'd from directly (pageable memory: the driver
would stage it through its own bounce buffer, synchronously). So:

    for each piece (a chunk of a large tensor, or a whole small tensor):
        buffer k full?  -> record event k on our stream, move to buffer k+1 and, if that
                           buffer was used before, wait for ITS event (its last copy done)
        numpy-copy the piece from the map into buffer k at the fill offset   (CPU / disk)
        cuMemcpyHtoDAsync(dst, buffer k + offset, n, our stream)              (DMA)

so while the DMA engine copies buffer k, the CPU fills buffer k+1 (page faults on the
map included: that is the "read rate"). Small tensors are packed one after another into
the same buffer (one event per buffer, not per tensor). The stream is synchronised in
`synchronize()` / `close()` / on context exit: only then are the returned tensors ready.
A failure synchronises what it can, frees the pinned buffers and raises UploadError
naming the tensor. Uploading is refused during CUDA-graph capture.

Speed (H200 run at a9f9a1c: the ring was slower than a plain synchronous copy, and slower
the bigger the ring): every Uploader pinned its ring with cuMemHostAlloc and freed it with
cuMemFreeHost, ~0.8 ms per MiB together (64 MiB x 4 = 256 MiB: +190 ms on a 275 MiB load),
and one thread filled the buffers (~5.5 GB/s on that host). Now:
  * pinned buffers come from a process-wide pool (`_POOL`) and go back to it on close, so
    only the first load of a process pins (default ring 4 x 4 MiB: ~12 ms once);
    `release_pinned_memory()` hands the pool back to the driver;
  * large pieces are copied into the pinned buffer by `threads` workers at once (NumPy
    copies release the GIL), so the fill runs at several threads' memory bandwidth.

Device memory comes from the caching allocator for the CURRENT stream (as every tensor);
the current stream is synchronised before each allocation so a block it freed is idle
before our side stream writes into it (no cuStreamWaitEvent in the driver contract).
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import dtypes as _dt
from ..device import as_device

__all__ = ["Uploader", "UploadError", "upload_many", "release_pinned_memory", "pinned_pool_bytes",
           "DEFAULT_CHUNK_BYTES", "DEFAULT_BUFFERS", "DEFAULT_THREADS"]

# 4 x 4 MiB: small enough that the one-time pinning is cheap (~12 ms), big enough that the
# per-chunk Python/driver overhead (~20 us) is a few % of a chunk's fill
DEFAULT_CHUNK_BYTES = 4 * 2**20
DEFAULT_BUFFERS = 4
# threads filling one piece (the host memcpy is the bottleneck: the DMA is 25-50 GB/s)
DEFAULT_THREADS = max(1, min(4, os.cpu_count() or 1))
# a piece is split over the threads from this size up, in parts of at least PART_MIN_BYTES
PARALLEL_MIN_BYTES = 1 << 20
PART_MIN_BYTES = 256 << 10
# the pool keeps at most this many pinned bytes between uploaders (the smallest go first)
POOL_MAX_BYTES = 256 * 2**20
_POOL_GRAIN = 64 << 10     # pinned sizes are rounded up to a power of two >= this
# a single tensor smaller than this (SafetensorsFile.get_tensor) takes the plain synchronous
# copy: pinning a buffer and making a stream costs more than it saves
SINGLE_MIN_BYTES = 1 << 20
_ALIGN = 256        # pieces start at 256-byte offsets in a buffer (DMA-friendly)


class UploadError(RuntimeError):
    """A host -> device upload failed; the message names the tensor."""


def _driver():
    from ..backends.cuda import driver
    return driver


class _PinnedPool:
    """Pinned host buffers kept between uploaders: pinning costs ~0.8 ms/MiB (alloc + free),
    so a process pins its ring once. Thread-safe. Buffers handed back must be idle (no copy
    in flight): the uploader synchronises its stream first."""

    def __init__(self):
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = []     # (nbytes, ptr), idle
        self.allocated = 0                         # pinned bytes this pool made (in use or idle)

    @staticmethod
    def size_for(nbytes: int) -> int:
        n = _POOL_GRAIN
        while n < nbytes:
            n *= 2
        return n

    def take(self, nbytes: int) -> tuple[int, int]:
        """(ptr, size >= nbytes): the smallest idle buffer that fits, else a new one."""
        with self._lock:
            fits = [i for i, (n, _) in enumerate(self._free) if n >= nbytes]
            if fits:
                i = min(fits, key=lambda j: self._free[j][0])
                n, p = self._free.pop(i)
                return p, n
        size = self.size_for(nbytes)
        p = _driver().mem_host_alloc(size)
        with self._lock:
            self.allocated += size
        return p, size

    def give(self, ptr: int, size: int) -> None:
        drop = []
        with self._lock:
            self._free.append((size, ptr))
            self._free.sort()
            while sum(n for n, _ in self._free) > POOL_MAX_BYTES:
                drop.append(self._free.pop(0))
        self._free_now(drop)

    def discard(self, ptr: int, size: int) -> None:
        """Free a buffer that may not be idle-safe to reuse (after a failed synchronise)."""
        self._free_now([(size, ptr)])

    def _free_now(self, items) -> None:
        d = _driver()
        for n, p in items:
            with self._lock:
                self.allocated -= n
            d.mem_free_host(p)

    def idle_bytes(self) -> int:
        with self._lock:
            return sum(n for n, _ in self._free)

    def release(self) -> None:
        with self._lock:
            items, self._free = self._free, []
        self._free_now(items)


_POOL = _PinnedPool()
_EXECUTOR = None
_EXECUTOR_LOCK = threading.Lock()


def release_pinned_memory() -> int:
    """Free the idle pinned staging buffers kept for later loads; returns the bytes freed."""
    n = _POOL.idle_bytes()
    _POOL.release()
    return n


def pinned_pool_bytes() -> int:
    """Idle pinned bytes kept by the staging pool."""
    return _POOL.idle_bytes()


def _executor(threads: int) -> ThreadPoolExecutor:
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None or _EXECUTOR._max_workers < threads:
            _EXECUTOR = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="nbx-stage")
        return _EXECUTOR


class Uploader:
    """Copies host arrays into new cuda tensors through pinned staging buffers.

    up = Uploader("cuda:0")              # or: with Uploader(...) as up:
    t = up.upload(arr, name="w")         # a Tensor; ready after up.synchronize()/close()
    up.close()                           # synchronises, frees the pinned buffers

    chunk_bytes  size of each pinned buffer (largest piece copied at once)
    num_buffers  ring size (>= 2 for overlap)
    total_bytes  optional hint: buffers are no larger than this (a 1 KB load does not
                 pin 4 MiB)
    progress     optional object with .update(nbytes) (safetensors' _Progress)
    threads      host threads filling a large piece (1 = the calling thread only)

    The pinned buffers come from a process-wide pool and return to it on close().
    """

    def __init__(self, device="cuda", *, chunk_bytes: int | None = None,
                 num_buffers: int | None = None, total_bytes: int | None = None,
                 progress=None, threads: int | None = None):
        # defaults read at call time (tests and benchmarks change the module constants)
        chunk_bytes = DEFAULT_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        num_buffers = DEFAULT_BUFFERS if num_buffers is None else num_buffers
        threads = DEFAULT_THREADS if threads is None else threads
        if threads.__class__ is not int or threads < 1:
            raise ValueError(f"Uploader: threads must be an int >= 1, got {threads!r}")
        dev = as_device(device)
        if dev.type != "cuda":
            raise ValueError(f"Uploader: device must be a cuda device, got {dev}")
        if chunk_bytes.__class__ is not int or chunk_bytes < _ALIGN:
            raise ValueError(f"Uploader: chunk_bytes must be an int >= {_ALIGN}, got {chunk_bytes!r}")
        if num_buffers.__class__ is not int or num_buffers < 1:
            raise ValueError(f"Uploader: num_buffers must be an int >= 1, got {num_buffers!r}")
        if total_bytes is not None:
            chunk_bytes = max(_ALIGN, min(chunk_bytes, -(-total_bytes // _ALIGN) * _ALIGN))
        self.device = dev
        self.index = dev.index or 0
        self.chunk_bytes = chunk_bytes
        self.num_buffers = num_buffers
        self.progress = progress
        self.threads = threads
        self._drv = _driver()
        self._refuse_in_capture()
        self._bufs: list = [None] * num_buffers      # pinned host pointers, taken lazily
        self._sizes: list = [0] * num_buffers        # their pool sizes (>= chunk_bytes)
        self._poisoned = False                       # a synchronise failed: do not pool
        self._views: list = [None] * num_buffers     # uint8 numpy views of them
        self._events: list = [None] * num_buffers
        self._pending = [False] * num_buffers        # event recorded and not yet waited for
        self._k = 0                                  # current buffer
        self._fill = 0                               # bytes used in the current buffer
        self._stream = None
        self._closed = False
        # tensors whose copies may still be in flight: held so that dropping one early cannot
        # hand its block back to the allocator (and the current stream) while we write it
        self._inflight: list = []
        self.bytes = 0
        self.tensors = 0
        self._t0 = None
        self.seconds = 0.0

    # ------------------------------------------------------------------ public
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self._abort()

    def upload(self, arr, name: str | None = None, dtype=None):
        """A new cuda tensor with the contents of host array `arr` (any size, any layout).

        `dtype` (optional) must equal the array's dtype: casting is not done here.
        """
        from ..tensor import Tensor
        label = f"tensor {name!r}" if name is not None else "a tensor"
        if self._closed:
            raise UploadError(f"Uploader: cannot upload {label}: the uploader is closed")
        self._refuse_in_capture(label)
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Uploader.upload: {label} must be a NumPy array, got "
                            f"{type(arr).__name__}")
        dt = _dt.as_dtype(arr.dtype, f"dtype of {label}")
        if dtype is not None and _dt.as_dtype(dtype) is not dt:
            raise TypeError(f"Uploader.upload: {label} is {dt.name} but dtype={dtype!r} was asked; "
                            f"cast on the host first (the uploader copies bytes)")
        src = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        src = src.reshape(-1).view(np.uint8)
        if self._t0 is None:
            self._t0 = time.perf_counter()
        try:
            d = self._drv
            d.set_device(self.index)
            if src.nbytes:
                # the block may have been freed by the current stream's queued work
                from ..backends.cuda.streams import current_handle
                d.stream_synchronize(current_handle(self.index))
            t = Tensor._empty(tuple(arr.shape), dt, self.device)
            if src.nbytes:
                self._put(t.data_ptr(), src)
                self._inflight.append(t)
        except Exception as e:
            self._abort()
            if isinstance(e, d.CaptureError):
                raise
            raise UploadError(f"upload of {label} ({tuple(arr.shape)} {dt.name}, {src.nbytes} "
                              f"bytes) to {self.device} failed: {type(e).__name__}: {e}") from e
        self.bytes += src.nbytes
        self.tensors += 1
        if self.progress is not None:
            self.progress.update(src.nbytes)
        return t

    def upload_many(self, items) -> dict:
        """{name: tensor} for (name, array) pairs or a {name: array} dict."""
        pairs = items.items() if isinstance(items, dict) else items
        return {name: self.upload(a, name=name) for name, a in pairs}

    def synchronize(self) -> None:
        """Wait until every upload so far has landed (the tensors are ready after this)."""
        if self._stream is None:
            return
        self._refuse_in_capture()
        try:
            self._drv.set_device(self.index)
            self._seal()
            self._drv.stream_synchronize(self._stream)
        except Exception as e:
            self._abort()
            if isinstance(e, self._drv.CaptureError):
                raise
            raise UploadError(f"Uploader: waiting for the uploads to {self.device} failed: "
                              f"{type(e).__name__}: {e}") from e
        for k in range(self.num_buffers):
            self._pending[k] = False
        self._inflight.clear()
        self.seconds = time.perf_counter() - self._t0 if self._t0 is not None else 0.0

    def close(self) -> None:
        """Synchronise, then free the pinned buffers, events and stream. Idempotent."""
        if self._closed:
            return
        try:
            self.synchronize()
        finally:
            self._release()

    @property
    def rate_mb_s(self) -> float:
        """Achieved MB/s (10^6 bytes) from the first upload to the last synchronize()."""
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def stats(self) -> dict:
        return {"bytes": self.bytes, "tensors": self.tensors, "seconds": self.seconds,
                "mb_per_s": self.rate_mb_s, "chunk_bytes": self.chunk_bytes,
                "num_buffers": self.num_buffers,
                "buffers_used": sum(b is not None for b in self._bufs)}

    def __repr__(self):
        return (f"<Uploader {self.device} {self.num_buffers}x{self.chunk_bytes} B "
                f"{self.tensors} tensors {self.bytes} B{' closed' if self._closed else ''}>")

    def __del__(self):
        if not getattr(self, "_closed", True):
            try:
                self._abort()
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass

    # ------------------------------------------------------------------ internals
    def _refuse_in_capture(self, label: str = "") -> None:
        d = self._drv
        if d._capturing:
            what = "nbxtensor.io.staging: uploading " + (label or "host data") + " to the GPU"
            d.capture_refuse(what + " (it synchronises streams and allocates pinned memory)")

    def _ensure_stream(self) -> None:
        if self._stream is None:
            self._stream = self._drv.stream_create(nonblocking=True)

    def _buffer(self, k: int):
        """Buffer k, ready to be overwritten (its previous copies finished)."""
        if self._bufs[k] is None:
            p, size = _POOL.take(self.chunk_bytes)
            self._bufs[k], self._sizes[k] = p, size
            self._views[k] = np.frombuffer((ctypes.c_uint8 * self.chunk_bytes).from_address(p),
                                           np.uint8)
            self._events[k] = self._drv.event_create(timing=False)
        elif self._pending[k]:
            self._drv.event_synchronize(self._events[k])
            self._pending[k] = False
        return self._views[k]

    def _seal(self) -> None:
        """Mark the current buffer's copies with its event and move to the next buffer."""
        if self._fill == 0:
            return
        k = self._k
        self._drv.event_record(self._events[k], self._stream)
        self._pending[k] = True
        self._k = (k + 1) % self.num_buffers
        self._fill = 0

    def _put(self, dst: int, src: np.ndarray) -> None:
        self._ensure_stream()
        n, off, cap = src.nbytes, 0, self.chunk_bytes
        while off < n:
            if self._fill >= cap:
                self._seal()
            view = self._buffer(self._k)       # waits for this buffer's last copies
            take = min(n - off, cap - self._fill)
            f = self._fill
            self._fill_piece(view[f:f + take], src[off:off + take])  # map page faults here
            self._drv.memcpy_htod(dst + off, self._bufs[self._k] + f, take, stream=self._stream)
            off += take
            self._fill = min(cap, -(-(f + take) // _ALIGN) * _ALIGN)

    def _fill_piece(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst[:] = src, split over the fill threads when large (NumPy drops the GIL)."""
        n = src.nbytes
        parts = min(self.threads, n // PART_MIN_BYTES) if n >= PARALLEL_MIN_BYTES else 1
        if parts <= 1:
            np.copyto(dst, src)
            return
        step = -(-n // parts)
        step = -(-step // 4096) * 4096          # page-aligned parts
        bounds = [(a, min(n, a + step)) for a in range(0, n, step)]
        ex = _executor(self.threads)
        futs = [ex.submit(np.copyto, dst[a:b], src[a:b]) for a, b in bounds[1:]]
        a, b = bounds[0]
        err = None
        try:
            np.copyto(dst[a:b], src[a:b])
        except BaseException as e:  # noqa: BLE001 - wait for the workers before raising
            err = e
        for fu in futs:
            try:
                fu.result()
            except BaseException as e:  # noqa: BLE001
                err = err or e
        if err is not None:
            raise err

    def _abort(self) -> None:
        """After a failure: wait for what is in flight (best effort), then free everything."""
        if self._closed:
            return
        if self._stream is not None and not self._drv._capturing:
            try:
                self._drv.stream_synchronize(self._stream)
            except Exception:  # noqa: BLE001 - the context may be dead; free anyway
                self._poisoned = True
        elif self._stream is not None:
            self._poisoned = True      # capture: cannot wait, so the buffers may be busy
        self._release()

    def _release(self) -> None:
        d = self._drv
        self._closed = True
        self._inflight.clear()
        errors = []
        # idle buffers go back to the pool; after a failed wait they are freed instead
        back = _POOL.discard if self._poisoned else _POOL.give
        for k in range(self.num_buffers):
            size = self._sizes[k]
            for kind, h, free in (("event", self._events[k], d.event_destroy),
                                  ("pinned buffer", self._bufs[k], lambda p: back(p, size))):
                if h is not None:
                    try:
                        free(h)
                    except Exception as e:  # noqa: BLE001 - free the rest, report after
                        errors.append(f"{kind} {k}: {e}")
            self._events[k] = self._bufs[k] = self._views[k] = None
        if self._stream is not None:
            try:
                d.stream_destroy(self._stream)
            except Exception as e:  # noqa: BLE001
                errors.append(f"stream: {e}")
            self._stream = None
        if errors:
            raise UploadError(f"Uploader: releasing staging resources on {self.device} failed: "
                              + "; ".join(errors))


def upload_many(items, device="cuda", *, chunk_bytes: int | None = None,
                num_buffers: int | None = None, progress=None, threads: int | None = None) -> dict:
    """{name: cuda tensor} for (name, host array) pairs or a dict; ready on return."""
    pairs = list(items.items() if isinstance(items, dict) else items)
    total = sum(int(a.nbytes) for _, a in pairs)
    with Uploader(device, chunk_bytes=chunk_bytes, num_buffers=num_buffers,
                  total_bytes=total, progress=progress, threads=threads) as up:
        out = up.upload_many(pairs)
    return out
