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
legacy NULL stream (handle 0). The devices, streams and events live in the cuda backend
(backends/cuda/streams.py, the stream table the launcher reads); this module is their
public face. Importing it does not load libcuda; the first call that needs it does.
"""
from __future__ import annotations

from .backends.cuda.driver import CudaError, CudaUnavailable  # noqa: F401 - public names
from .backends.cuda.streams import (Event, Stream, availability, current_device,  # noqa: F401
                                    current_stream, default_stream, device_count,
                                    device_index as _index, get_device_capability,
                                    get_device_name, get_device_properties, is_available,
                                    set_device, set_stream, stream, synchronize)

__all__ = ["is_available", "availability", "device_count", "get_device_name",
           "get_device_properties", "get_device_capability", "set_device", "current_device",
           "Stream", "Event", "current_stream", "default_stream", "set_stream", "stream",
           "synchronize", "CudaError", "CudaUnavailable"]


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
# f = nbx.cuda.graphed(fn) (or make_graphed_callables(fn, sample_args)): f(x) captures once
# per input signature, then copies the inputs into the graph's static buffers and replays.
# See backends/cuda/graphs.py for the capture rules and docs/design/graphs.md.

from .backends.cuda.graphs import (CUDAGraph, GraphedCallable, GraphPool, graph,  # noqa: E402
                                   graph_pool_handle, graphed, is_current_stream_capturing,
                                   make_graphed_callables)
from .backends.cuda.driver import CaptureError  # noqa: E402,F401 - public name

__all__ += ["CUDAGraph", "graph", "is_current_stream_capturing", "CaptureError", "GraphPool",
            "graph_pool_handle", "GraphedCallable", "graphed", "make_graphed_callables"]
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
