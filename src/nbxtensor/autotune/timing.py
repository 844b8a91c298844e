"""Timing candidates: CUDA events through nbxtensor's driver, an L2 flush before every
timed run, warm-up, median, and a per-candidate budget.

The flush writes a 256 MB buffer (cuMemsetD8Async, larger than the H200's 50 MB L2) on the
same stream just before the start event, so every timed run starts with cold caches, as a
layer in a model does (its weights were evicted by the layers before it). The memset also
keeps the GPU busy while Python launches the candidate, so launch overhead is not timed --
but only if the GPU is busy for longer than the host takes to enqueue the candidate. One
flush is ~60-90 us of GPU time, while an op's Python can take longer (seen on the H200: a
576x576 GEMV "took" 95 us, its host enqueue time), so the flush is repeated until it covers
twice the measured host time of one call (`flushes_to_cover`).

A timer's `measure(fn, ...)` returns a `Timing` or raises `OverBudget` when the first
(probe) run alone is slower than `budget_ms`: one pathological candidate cannot stall a
sweep. Tests pass a fake timer with the same interface (deterministic "speed" on interp).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

FLUSH_BYTES = 256 << 20


class OverBudget(Exception):
    def __init__(self, ms: float, budget_ms: float):
        super().__init__(f"one run took {ms:.3f} ms, over the budget of {budget_ms:.3f} ms")
        self.ms, self.budget_ms = ms, budget_ms


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    reps: int
    method: str

    def as_dict(self) -> dict:
        return dict(median_ms=round(self.median_ms, 6), min_ms=round(self.min_ms, 6),
                    reps=self.reps, method=self.method)


def flushes_to_cover(host_ms: float, flush_ms: float, limit: int = 64) -> int:
    """How many back-to-back flushes keep the GPU busy for twice `host_ms` (at least one)."""
    if flush_ms <= 0:
        return 1
    return int(max(1, min(limit, -(-2.0 * host_ms // flush_ms))))


class CudaTimer:
    """CUDA-event timing with an L2 flush between timed runs (device = an nbx Device)."""

    method = "cuda events, 256 MB L2 flush, median"

    def __init__(self, device, flush_bytes: int = FLUSH_BYTES):
        from .. import dtypes
        from ..tensor import Tensor
        self.device = device
        self._buf = Tensor._empty((flush_bytes,), dtypes.uint8, device) if flush_bytes else None
        self._n = 0
        self._flush_cost: float | None = None

    def _flush(self, stream) -> None:
        if self._buf is not None:
            from ..backends.cuda import driver as drv
            self._n += 1      # a different value each time: no write can be skipped
            drv.memset_d8(self._buf.data_ptr(), self._n & 0xFF, self._buf.numel(), stream)

    def _timed(self, fn, reps: int, flushes: int = 1) -> list[float]:
        from ..backends.cuda import streams
        stream = streams.current_stream(self.device)
        evs = [(streams.Event(True, self.device), streams.Event(True, self.device)) for _ in range(reps)]
        for s, e in evs:
            for _ in range(flushes):
                self._flush(stream.handle)
            s.record(stream)
            fn()
            e.record(stream)
        evs[-1][1].synchronize()
        return [s.elapsed_time(e) for s, e in evs]

    def _flush_ms(self) -> float:
        """GPU time of one flush (measured once per timer)."""
        if self._buf is None:
            return 0.0
        if self._flush_cost is None:
            self._flush_cost = min(self._timed(lambda: self._flush(self._stream_handle()), 3))
        return self._flush_cost

    def _stream_handle(self):
        from ..backends.cuda import streams
        return streams.current_stream(self.device).handle

    def measure(self, fn, *, warmup: int = 3, reps: int = 10, budget_ms: float | None = None):
        probe = self._timed(fn, 1)[0]
        if budget_ms is not None and probe > budget_ms:
            raise OverBudget(probe, budget_ms)
        for _ in range(warmup):
            fn()
        # the host time of one call (enqueue only: fn launches asynchronously) decides how
        # many flushes hide it, so the events time the GPU's work, not the Python
        from ..backends.cuda import streams
        streams.synchronize()
        t0 = time.perf_counter()
        fn()
        host_ms = (time.perf_counter() - t0) * 1e3
        ts = self._timed(fn, reps, flushes_to_cover(host_ms, self._flush_ms()))
        return Timing(statistics.median(ts), min(ts), reps, self.method)


class HostTimer:
    """Wall-clock timing for interp (no L2 to flush; speed there means little)."""

    method = "host perf_counter, median"

    def __init__(self, device=None):
        self.device = device

    def measure(self, fn, *, warmup: int = 0, reps: int = 3, budget_ms: float | None = None):
        def one():
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        probe = one()
        if budget_ms is not None and probe > budget_ms:
            raise OverBudget(probe, budget_ms)
        for _ in range(warmup):
            fn()
        ts = [one() for _ in range(reps)]
        return Timing(statistics.median(ts), min(ts), reps, self.method)


def timer_for(device):
    return CudaTimer(device) if device.type == "cuda" else HostTimer(device)
