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

Device memory comes from the caching allocator for the CURRENT stream (as every tensor);
the current stream is synchronised before each allocation so a block it freed is idle
before our side stream writes into it (no cuStreamWaitEvent in the driver contract).
"""
from __future__ import annotations

import ctypes
import time

import numpy as np

from .. import dtypes as _dt
from ..device import as_device

__all__ = ["Uploader", "UploadError", "upload_many", "DEFAULT_CHUNK_BYTES", "DEFAULT_BUFFERS"]

DEFAULT_CHUNK_BYTES = 32 * 2**20
DEFAULT_BUFFERS = 3
# a single tensor smaller than this (SafetensorsFile.get_tensor) takes the plain synchronous
# copy: pinning a buffer and making a stream costs more than it saves
SINGLE_MIN_BYTES = 1 << 20
_ALIGN = 256        # pieces start at 256-byte offsets in a buffer (DMA-friendly)


class UploadError(RuntimeError):
    """A host -> device upload failed; the message names the tensor."""


def _driver():
    from ..backends.cuda import driver
    return driver


class Uploader:
    """Copies host arrays into new cuda tensors through pinned staging buffers.

    up = Uploader("cuda:0")              # or: with Uploader(...) as up:
    t = up.upload(arr, name="w")         # a Tensor; ready after up.synchronize()/close()
    up.close()                           # synchronises, frees the pinned buffers

    chunk_bytes  size of each pinned buffer (largest piece copied at once)
    num_buffers  ring size (>= 2 for overlap)
    total_bytes  optional hint: buffers are no larger than this (a 1 KB load does not
                 pin 32 MiB)
    progress     optional object with .update(nbytes) (safetensors' _Progress)
    """

    def __init__(self, device="cuda", *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 num_buffers: int = DEFAULT_BUFFERS, total_bytes: int | None = None,
                 progress=None):
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
        self._drv = _driver()
        self._refuse_in_capture()
        self._bufs: list = [None] * num_buffers      # pinned host pointers, allocated lazily
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
                from ..backends.cuda.storage import _stream_handle
                d.stream_synchronize(_stream_handle(self.index))
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
            p = self._drv.mem_host_alloc(self.chunk_bytes)
            self._bufs[k] = p
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
            view[f:f + take] = src[off:off + take]      # page faults on the map happen here
            self._drv.memcpy_htod(dst + off, self._bufs[self._k] + f, take, stream=self._stream)
            off += take
            self._fill = min(cap, -(-(f + take) // _ALIGN) * _ALIGN)

    def _abort(self) -> None:
        """After a failure: wait for what is in flight (best effort), then free everything."""
        if self._closed:
            return
        if self._stream is not None and not self._drv._capturing:
            try:
                self._drv.stream_synchronize(self._stream)
            except Exception:  # noqa: BLE001 - the context may be dead; free anyway
                pass
        self._release()

    def _release(self) -> None:
        d = self._drv
        self._closed = True
        self._inflight.clear()
        errors = []
        for k in range(self.num_buffers):
            for kind, h, free in (("event", self._events[k], d.event_destroy),
                                  ("pinned buffer", self._bufs[k], d.mem_free_host)):
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


def upload_many(items, device="cuda", *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                num_buffers: int = DEFAULT_BUFFERS, progress=None) -> dict:
    """{name: cuda tensor} for (name, host array) pairs or a dict; ready on return."""
    pairs = list(items.items() if isinstance(items, dict) else items)
    total = sum(int(a.nbytes) for _, a in pairs)
    with Uploader(device, chunk_bytes=chunk_bytes, num_buffers=num_buffers,
                  total_bytes=total, progress=progress) as up:
        out = up.upload_many(pairs)
    return out
