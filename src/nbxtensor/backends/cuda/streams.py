"""Devices, streams and events of the cuda backend: the per-device current-stream table.

The launcher reads `current_cstreams` (device index -> the current CUstream as a c_void_p) on
every launch; storage copies and graph capture read `current_streams` (device index -> Stream). The
public `nbx.cuda` re-exports these with torch.cuda's names. The current stream is
process-wide per device (not per thread, unlike torch); the default is the legacy NULL
stream (handle 0). Importing this module does not load libcuda; the first call that needs
it does.
"""
from __future__ import annotations

import contextlib
import ctypes

from . import driver as _drv
from ...device import Device


# What every synchronising call checks once the device is idle: the device error flags that
# earlier ops recorded (the out-of-range index flag of kernels/indexing.py registers here).
# Each entry is (pending, check): `pending[0]` says a check is due, so an idle sync costs
# one list read per entry.
_sync_checks: list = []


def register_sync_check(pending: list, check) -> None:
    """Run `check()` at every synchronising call while `pending[0]` is set."""
    if not any(p is pending and c is check for p, c in _sync_checks):
        _sync_checks.append((pending, check))


def check_sync_errors() -> None:
    """Raise the errors that earlier cuda ops recorded on the device (a host read here;
    nbx.cuda.synchronize, Stream.synchronize, Event.synchronize and device->host copies)."""
    for pending, check in _sync_checks:
        if pending[0]:
            check()


def availability() -> tuple[bool, str]:
    """(True, description) or (False, the reason the cuda device cannot be used)."""
    return _drv.availability()


def is_available() -> bool:
    return _drv.availability()[0]


def device_count() -> int:
    """Number of visible CUDA devices (0 where libcuda is absent)."""
    ok, _ = _drv.availability()
    return _drv.device_count() if ok else 0


def device_index(device) -> int:
    if device is None:
        return _drv.current_device()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    d = device if isinstance(device, Device) else Device(device)
    if d.type != "cuda":
        raise ValueError(f"device: expected a cuda device, got {d}")
    return d.index or 0


def get_device_properties(device=None) -> dict:
    return _drv.device_properties(device_index(device))


def get_device_name(device=None) -> str:
    return get_device_properties(device)["name"]


def get_device_capability(device=None) -> tuple[int, int]:
    p = get_device_properties(device)
    return p["major"], p["minor"]


def set_device(device) -> None:
    _drv.set_device(device_index(device))


def current_device() -> int:
    return _drv.current_device()


class Stream:
    """A CUDA stream. `Stream()` creates a new non-blocking one; `.handle` is the raw CUstream."""

    __slots__ = ("handle", "device", "_owned", "__weakref__")

    def __init__(self, device=None, *, nonblocking: bool = True, handle: int | None = None):
        self.device = device_index(device)
        if handle is not None:      # wrap an existing stream (0 = the legacy default stream)
            self.handle, self._owned = int(handle), False
        else:
            _drv.set_device(self.device)
            self.handle, self._owned = _drv.stream_create(nonblocking), True

    def synchronize(self) -> None:
        _drv.set_device(self.device)
        _drv.stream_synchronize(self.handle)
        check_sync_errors()

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


default_streams: dict = {}    # device index -> the default (handle 0) Stream
current_streams: dict = {}    # device index -> current Stream
current_cstreams: dict = {}   # device index -> its CUstream as c_void_p; read by the launcher


def default_stream(device=None) -> Stream:
    i = device_index(device)
    s = default_streams.get(i)
    if s is None:
        s = default_streams[i] = Stream(i, handle=0)
    return s


def current_stream(device=None) -> Stream:
    i = device_index(device)
    s = current_streams.get(i)
    return s if s is not None else default_stream(i)


def current_handle(index: int) -> int:
    """The raw CUstream of device `index`'s current stream (0: the legacy default stream)."""
    s = current_streams.get(index)
    return 0 if s is None else s.handle


def set_stream(s: Stream) -> None:
    if not isinstance(s, Stream):
        raise TypeError(f"set_stream: expected an nbxtensor.cuda.Stream, got {type(s).__name__}")
    current_streams[s.device] = s
    current_cstreams[s.device] = ctypes.c_void_p(s.handle)


@contextlib.contextmanager
def stream(s: Stream | None):
    """Make `s` the current stream of its device inside the block (None: no change)."""
    if s is None:
        yield None
        return
    prev = current_streams.get(s.device)
    set_stream(s)
    try:
        yield s
    finally:
        if prev is None:
            current_streams.pop(s.device, None)
            current_cstreams.pop(s.device, None)
        else:
            set_stream(prev)


class Event:
    """A CUDA event for ordering and timing."""

    __slots__ = ("handle", "device", "_timing", "__weakref__")

    def __init__(self, enable_timing: bool = False, device=None):
        self.device = device_index(device)
        _drv.set_device(self.device)
        self._timing = enable_timing
        self.handle = _drv.event_create(enable_timing)

    def record(self, stream: Stream | None = None) -> None:
        s = stream if stream is not None else current_stream(self.device)
        _drv.event_record(self.handle, s.handle)

    def synchronize(self) -> None:
        _drv.event_synchronize(self.handle)
        check_sync_errors()

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
    """Wait for all work on `device` (default_streams: the current one) to finish."""
    _drv.set_device(device_index(device))
    _drv.ctx_synchronize()
    check_sync_errors()
