"""`nbx.cuda`: devices, streams and events, with torch.cuda's names.

    nbx.cuda.is_available()                 never raises; False with a reason in
    nbx.cuda.availability()                 (False, "libcuda.so.1 not found: ...")
    nbx.cuda.device_count(), get_device_name(i), get_device_properties(i), get_device_capability(i)
    nbx.cuda.set_device(i), current_device()
    nbx.cuda.Stream(), current_stream(), default_stream(), with nbx.cuda.stream(s): ...
    nbx.cuda.Event(enable_timing=True): record(), synchronize(), query(), elapsed_time(end)
    nbx.cuda.synchronize()

Kernels launched by nbxtensor go to `current_stream()` of their device. The current
stream is process-wide per device (not per thread, unlike torch); the default is the
legacy NULL stream (handle 0).
Importing this module does not load libcuda; the first call that needs it does.
"""
from __future__ import annotations

import contextlib
import ctypes

from .backends.cuda import driver as _drv
from .backends.cuda.driver import CudaError, CudaUnavailable  # noqa: F401 - public names
from .backends.cuda.storage import check_index_errors as _index_hook  # [indexing hook]
from .device import Device

__all__ = ["is_available", "availability", "device_count", "get_device_name",
           "get_device_properties", "get_device_capability", "set_device", "current_device",
           "Stream", "Event", "current_stream", "default_stream", "set_stream", "stream",
           "synchronize", "CudaError", "CudaUnavailable"]


def availability() -> tuple[bool, str]:
    """(True, description) or (False, the reason the cuda device cannot be used)."""
    return _drv.availability()


def is_available() -> bool:
    return _drv.availability()[0]


def device_count() -> int:
    """Number of visible CUDA devices (0 where libcuda is absent)."""
    ok, _ = _drv.availability()
    return _drv.device_count() if ok else 0


def _index(device) -> int:
    if device is None:
        return _drv.current_device()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    d = device if isinstance(device, Device) else Device(device)
    if d.type != "cuda":
        raise ValueError(f"device: expected a cuda device, got {d}")
    return d.index or 0


def get_device_properties(device=None) -> dict:
    return _drv.device_properties(_index(device))


def get_device_name(device=None) -> str:
    return get_device_properties(device)["name"]


def get_device_capability(device=None) -> tuple[int, int]:
    p = get_device_properties(device)
    return p["major"], p["minor"]


def set_device(device) -> None:
    _drv.set_device(_index(device))


def current_device() -> int:
    return _drv.current_device()


class Stream:
    """A CUDA stream. `Stream()` creates a new non-blocking one; `.handle` is the raw CUstream."""

    __slots__ = ("handle", "device", "_owned", "__weakref__")

    def __init__(self, device=None, *, nonblocking: bool = True, handle: int | None = None):
        self.device = _index(device)
        if handle is not None:      # wrap an existing stream (0 = the legacy default stream)
            self.handle, self._owned = int(handle), False
        else:
            _drv.set_device(self.device)
            self.handle, self._owned = _drv.stream_create(nonblocking), True

    def synchronize(self) -> None:
        _drv.set_device(self.device)
        _drv.stream_synchronize(self.handle)
        _index_hook()

    def query(self) -> bool:
        """True when all work queued on the stream has finished."""
        _drv.set_device(self.device)
        return _drv.stream_query(self.handle)

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event(device=self.device)
        event.record(self)
        return event

    def wait_stream(self, other: "Stream") -> None:
        # without cuStreamWaitEvent in the contract, order by blocking the host
        other.synchronize()

    def __eq__(self, other):
        return isinstance(other, Stream) and (self.handle, self.device) == (other.handle, other.device)

    def __hash__(self):
        return hash((self.handle, self.device))

    def __repr__(self):
        return f"<nbxtensor.cuda.Stream device=cuda:{self.device} cuda_stream={self.handle:#x}>"

    def __del__(self):
        if getattr(self, "_owned", False) and _drv is not None:
            try:
                _drv.stream_destroy(self.handle)
            except Exception:  # noqa: BLE001 - interpreter shutdown or a dead context
                pass


_default: dict = {}   # device index -> the default (handle 0) Stream
_current: dict = {}   # device index -> current Stream
_current_cstreams: dict = {}  # device index -> its CUstream as c_void_p; read by the launcher


def default_stream(device=None) -> Stream:
    i = _index(device)
    s = _default.get(i)
    if s is None:
        s = _default[i] = Stream(i, handle=0)
    return s


def current_stream(device=None) -> Stream:
    i = _index(device)
    s = _current.get(i)
    return s if s is not None else default_stream(i)


def set_stream(s: Stream) -> None:
    if not isinstance(s, Stream):
        raise TypeError(f"set_stream: expected an nbxtensor.cuda.Stream, got {type(s).__name__}")
    _current[s.device] = s
    _current_cstreams[s.device] = ctypes.c_void_p(s.handle)


@contextlib.contextmanager
def stream(s: Stream | None):
    """Make `s` the current stream of its device inside the block (None: no change)."""
    if s is None:
        yield None
        return
    prev = _current.get(s.device)
    set_stream(s)
    try:
        yield s
    finally:
        if prev is None:
            _current.pop(s.device, None)
            _current_cstreams.pop(s.device, None)
        else:
            set_stream(prev)


class Event:
    """A CUDA event for ordering and timing."""

    __slots__ = ("handle", "device", "_timing", "__weakref__")

    def __init__(self, enable_timing: bool = False, device=None):
        self.device = _index(device)
        _drv.set_device(self.device)
        self._timing = enable_timing
        self.handle = _drv.event_create(enable_timing)

    def record(self, stream: Stream | None = None) -> None:
        s = stream if stream is not None else current_stream(self.device)
        _drv.event_record(self.handle, s.handle)

    def synchronize(self) -> None:
        _drv.event_synchronize(self.handle)
        _index_hook()

    def query(self) -> bool:
        return _drv.event_query(self.handle)

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds from this event to `end` (both recorded, both with timing)."""
        if not (self._timing and end._timing):
            raise ValueError("elapsed_time: both events need enable_timing=True")
        return _drv.event_elapsed_ms(self.handle, end.handle)

    def __del__(self):
        if _drv is not None and getattr(self, "handle", None):
            try:
                _drv.event_destroy(self.handle)
            except Exception:  # noqa: BLE001
                pass


def synchronize(device=None) -> None:
    """Wait for all work on `device` (default: the current one) to finish."""
    _drv.set_device(_index(device))
    _drv.ctx_synchronize()
    _index_hook()


# ============================================================================================
# Memory API (allocator engineer's section below this line: memory_allocated, empty_cache, ...)
# ============================================================================================
# Memory: the caching allocator of each device (backends/cuda/memory.py), with torch.cuda's names.
# Statistics count rounded blocks, as torch does; a device's allocator is created on first use.

from .backends.cuda import memory as _mem  # noqa: E402 - the memory section starts here
from .backends.cuda.memory import OutOfMemoryError  # noqa: E402,F401 - public name

__all__ += ["memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
            "reset_peak_memory_stats", "reset_accumulated_memory_stats", "memory_stats",
            "memory_snapshot", "empty_cache", "OutOfMemoryError", "record_memory_trace"]


def _allocator(device):
    return _mem.allocator_for(_index(device))


def memory_allocated(device=None) -> int:
    """Bytes in live blocks (rounded to the allocator's 512-byte granularity)."""
    return _allocator(device).allocated


def memory_reserved(device=None) -> int:
    """Bytes held from the driver (live blocks plus the cache)."""
    return _allocator(device).reserved


def max_memory_allocated(device=None) -> int:
    return _allocator(device).peak_allocated


def max_memory_reserved(device=None) -> int:
    return _allocator(device).peak_reserved


def reset_peak_memory_stats(device=None) -> None:
    _allocator(device).reset_peak_stats()


def reset_accumulated_memory_stats(device=None) -> None:
    _allocator(device).reset_accumulated_stats()


def memory_stats(device=None) -> dict:
    """Current and peak allocated/reserved/requested bytes, counts, segments, largest free block."""
    return _allocator(device).stats()


def memory_snapshot(device=None) -> list:
    """Every segment with its blocks (address, size, requested, allocated), for debugging."""
    return _allocator(device).snapshot()


def empty_cache(device=None) -> None:
    """Return cached segments that hold no live block to the driver (all devices when None)."""
    if device is None:
        for a in _mem.allocators().values():
            a.empty_cache()
    else:
        _allocator(device).empty_cache()


def record_memory_trace(path):
    """Context manager: write every allocation and free (with its call site) to the TSV `path`.
    Replay it with `python -m nbxtensor.backends.cuda.memtrace replay PATH`."""
    from .backends.cuda import memtrace
    return memtrace.record(path)
# ============================================================================================
# end of the memory section
# ============================================================================================


# ============================================================================================
# CUDA graphs (graphs engineer's section): nbx.cuda.CUDAGraph, nbx.cuda.graph
# ============================================================================================
# g = nbx.cuda.CUDAGraph(); with nbx.cuda.graph(g): y = f(x)   -> g.replay() re-runs f on x.
# See backends/cuda/graphs.py for the capture rules and docs/design/graphs.md.

from .backends.cuda.graphs import (CUDAGraph, graph, is_current_stream_capturing)  # noqa: E402
from .backends.cuda.driver import CaptureError  # noqa: E402,F401 - public name

__all__ += ["CUDAGraph", "graph", "is_current_stream_capturing", "CaptureError"]
# ============================================================================================
# end of the CUDA graphs section
# ============================================================================================


# ============================================================================================
# Seeding (torch.cuda.manual_seed & co): the per-device default generators of nbx.random
# ============================================================================================
# As torch's lazy seeding, these do nothing without a GPU (torch queues the call for a CUDA
# that never initialises); with one they seed nbx.random.default_generator_for("cuda:i"), the
# generator nbx.sample and the random fills on that device draw from.

def _default_generator(i):
    from . import random as _random
    return _random.default_generator_for(f"cuda:{i}")


def _check_seed(seed, op):
    from . import random as _random
    return _random._check_seed(seed, op)


def manual_seed(seed) -> None:
    """Seed the current cuda device's default generator (a no-op without a GPU)."""
    seed = _check_seed(seed, "cuda.manual_seed")
    if is_available():
        _default_generator(current_device()).manual_seed(seed)


def manual_seed_all(seed) -> None:
    """Seed every cuda device's default generator (a no-op without a GPU)."""
    seed = _check_seed(seed, "cuda.manual_seed_all")
    if is_available():
        for i in range(device_count()):
            _default_generator(i).manual_seed(seed)


def seed() -> None:
    """Seed the current cuda device's default generator with a random number."""
    if is_available():
        _default_generator(current_device()).seed()


def seed_all() -> None:
    """Seed every cuda device's default generator with one random number."""
    if is_available():
        import secrets
        manual_seed_all(secrets.randbits(64))


def initial_seed() -> int:
    """The current cuda device's default generator's seed (torch.cuda.initial_seed)."""
    if not is_available():
        raise CudaUnavailable(f"cuda.initial_seed: no cuda device ({availability()[1]})")
    return _default_generator(current_device()).initial_seed()


__all__ += ["manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed"]


# ============================================================================================
# torch.backends.cuda.matmul flags: allow_tf32 is set_float32_matmul_precision's switch
# ============================================================================================
class _MatmulFlags:
    """torch.backends.cuda.matmul: `allow_tf32` reads and sets nbx's float32 matmul precision
    ("high" allows TF32, "highest" is IEEE), as torch's does; the reduced-precision reduction
    flags are accepted and read back (nbxtensor's half-precision GEMMs accumulate in fp32)."""

    allow_fp16_reduced_precision_reduction = True
    allow_bf16_reduced_precision_reduction = True

    @property
    def allow_tf32(self) -> bool:
        from .ops.linalg import get_float32_matmul_precision
        return get_float32_matmul_precision() != "highest"

    @allow_tf32.setter
    def allow_tf32(self, value) -> None:
        from .ops.linalg import set_float32_matmul_precision
        if not isinstance(value, bool):
            raise TypeError(f"backends.cuda.matmul.allow_tf32 must be a bool, got {value!r}")
        set_float32_matmul_precision("high" if value else "highest")


def _install_backend_flags() -> None:
    from .backends import cuda as _backends_cuda
    if not hasattr(_backends_cuda, "matmul"):
        _backends_cuda.matmul = _MatmulFlags()


_install_backend_flags()
