"""CUDA graphs: capture the work issued on a stream once, replay it with one launch.

    g = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g):              # a side stream is current inside the block
        y = f(x)                         # launches / async copies / memsets are recorded
    x.copy_(new_x); g.replay(); ...      # replay on the current stream; y holds the result

Rules (each refusal raises CaptureError, before the driver is called):
* Capture happens on a non-default stream. `graph()` uses a side stream per device (made
  once, reused) or the `stream=` given, makes it current for the block and restores the
  previous current stream afterwards. Before capture the device is synchronised, so work
  already queued (on any stream) that wrote the inputs is finished.
* One capture at a time in the process. nbxtensor's current stream is process-wide, so
  every thread's launches would land in the capture: the default capture mode is
  CU_STREAM_CAPTURE_MODE_GLOBAL (the driver also refuses unsafe calls from other threads),
  and our own guard (driver.capture_refuse) is process-wide too.
* No host synchronisation: ctx/stream/event synchronize, synchronous copies and memsets,
  Tensor.numpy()/.item() (a device-to-host read) and cuMemFree raise.
* Memory: every allocation during the capture comes from the graph's private pool (the
  allocator's `private_pool`), on the capture stream. An allocation on another stream (it
  would be a shared-pool allocation) raises. The pool lives as long as the graph: tensors
  made during capture (the graph's outputs and temporaries) keep their addresses for every
  replay; `reset()` or the graph's death releases the pool (segments still holding a live
  tensor the user kept are released when that tensor dies).
* Kernels must be compiled and loaded before capture (run the step once eagerly: the
  first launch compiles through Triton and loads a module, which is not recorded).
* Static addresses: a replay reads and writes the memory the captured launches named.
  Inputs must be updated in place (`x.copy_(...)`); tensors the graph reads must stay
  alive as long as the graph (like torch, nothing keeps them alive for you).
"""
from __future__ import annotations

import contextlib
import threading

from . import driver as _drv
from .driver import CaptureError
from .memory import allocator_for
from . import streams as _streams

__all__ = ["CUDAGraph", "graph", "CaptureError", "is_current_stream_capturing"]

_MODES = {"global": _drv.CAPTURE_MODE_GLOBAL, "thread_local": _drv.CAPTURE_MODE_THREAD_LOCAL,
          "relaxed": _drv.CAPTURE_MODE_RELAXED}
_side_streams: dict = {}      # device index -> the side Stream graph() captures on by default
_lock = threading.Lock()
_active = [None]              # the CUDAGraph being captured (one capture at a time)


def capturing_graph():
    """The CUDAGraph being captured now, or None (random generators register their replay
    prologue with it: each replay then draws fresh numbers, as torch's)."""
    return _active[0]


def is_current_stream_capturing(device=None) -> bool:
    """True when the current stream of `device` is being captured by nbx.cuda.graph."""
    s = _streams.current_stream(device)
    return s.handle in _drv._capturing


def _allocation_guard(pool_id: int, stream: int, what: str):
    """The allocator hook installed for the duration of a capture."""
    def guard(alloc, req_stream):
        if req_stream != stream or alloc._pool != pool_id:
            raise CaptureError(
                f"allocation during the capture of {what}: requested on stream {req_stream:#x} "
                f"(pool {alloc._pool}), but while a graph is captured memory can only come from "
                f"the graph's private pool {pool_id} on the capture stream {stream:#x}; an "
                f"allocation from the shared pool (another stream) would not be ordered with the "
                f"graph. Allocate it before the capture or on the capture stream.")
    return guard


class CUDAGraph:
    """A captured CUDA graph: `with nbx.cuda.graph(g): ...` records, `g.replay()` runs it."""

    def __init__(self):
        self._graph = None        # CUgraph
        self._exec = None         # CUgraphExec
        self._pool = None         # the allocator's MemPool
        self._alloc = None
        self._device = None
        self._stream = None       # the Stream captured on (kept alive while capturing)
        self._capturing = False
        self.node_types: dict = {}
        self._replay_hooks: list = []   # called before each launch (random generators' state)

    # ------------------------------------------------------------------ capture
    def capture_begin(self, stream, capture_error_mode: str = "global") -> None:
        """Begin capturing `stream` (an nbx.cuda.Stream, made current by the caller)."""
        if self._capturing:
            raise CaptureError("capture_begin: this graph is already capturing")
        if self._exec is not None or self._graph is not None:
            raise CaptureError("capture_begin: this graph already holds a capture; call "
                               "reset() first")
        if capture_error_mode not in _MODES:
            raise ValueError(f"capture_error_mode: expected one of {sorted(_MODES)}, got "
                             f"{capture_error_mode!r}")
        if stream.handle == 0:
            raise CaptureError("capture_begin: the legacy default stream (handle 0) cannot be "
                               "captured; pass a stream made with nbx.cuda.Stream()")
        if _drv._capturing:
            raise CaptureError(f"capture_begin: another capture is in progress "
                               f"({', '.join(_drv._capturing.values())}); nbxtensor captures "
                               f"one graph at a time")
        dev = stream.device
        _drv.set_device(dev)
        alloc = allocator_for(dev)
        if getattr(alloc, "capture_guard", None) is not None:
            raise CaptureError("capture_begin: the allocator of cuda:%d is already in a capture" % dev)
        # queued work (the inputs' writes, frees of memory the pool may not reuse yet) is done
        _drv.ctx_synchronize()
        ctx = alloc.private_pool()
        pool = ctx.__enter__()
        what = f"graph {id(self):#x} on cuda:{dev}"
        alloc.capture_guard = _allocation_guard(pool.id, stream.handle, what)
        try:
            _drv.stream_begin_capture(stream.handle, _MODES[capture_error_mode], what)
        except BaseException:
            alloc.capture_guard = None
            ctx.__exit__(None, None, None)
            raise
        self._pool_ctx = ctx
        self._pool, self._alloc, self._device, self._stream = pool, alloc, dev, stream
        self._capturing = True
        self._replay_hooks = []
        _active[0] = self

    def capture_end(self, failed: bool = False) -> None:
        """End the capture; instantiate the graph unless `failed` (then discard it)."""
        if not self._capturing:
            raise CaptureError("capture_end: this graph is not capturing")
        self._capturing = False
        _active[0] = None
        alloc, stream = self._alloc, self._stream
        graph = None
        try:
            graph = _drv.stream_end_capture(stream.handle)
        except _drv.CudaError:
            if not failed:      # an invalidated capture; when failing already, keep the cause
                raise
        finally:
            alloc.capture_guard = None
            self._pool_ctx.__exit__(None, None, None)
            self._pool_ctx = None
            if failed or graph is None:
                if graph:
                    _drv.graph_destroy(graph)
                self._release_pool()
        if failed:
            return
        self._graph = graph
        try:
            self.node_types = _drv.graph_node_types(graph)
            # (no cuGraphUpload on the capture stream: the first replay, on whatever stream is
            # current then, uploads it, so no cross-stream ordering question arises)
            self._exec = _drv.graph_instantiate(graph)
        except BaseException:
            self.reset()
            raise

    # ------------------------------------------------------------------ use
    def replay(self) -> None:
        """Launch the graph on the current stream of its device."""
        e = self._exec
        if e is None:
            raise RuntimeError("CUDAGraph.replay: nothing captured (capture with "
                               "`with nbx.cuda.graph(g): ...` first, or the graph was reset)")
        if _drv._capturing:
            raise CaptureError("CUDAGraph.replay: cannot replay a graph while a capture is in "
                               "progress")
        _drv.set_device(self._device)
        for hook in self._replay_hooks:
            hook()
        _drv.graph_launch(e, _streams.current_stream(self._device).handle)

    def reset(self) -> None:
        """Destroy the graph and release its private pool (memory of tensors the caller still
        holds goes back when they die)."""
        if self._capturing:
            raise CaptureError("CUDAGraph.reset: the graph is still capturing")
        e, g = self._exec, self._graph
        self._exec = self._graph = None
        self.node_types = {}
        self._replay_hooks = []
        if e is not None:
            _drv.graph_exec_destroy(e)
        if g is not None:
            _drv.graph_destroy(g)
        self._release_pool()
        self._stream = None

    def _release_pool(self):
        pool, alloc = self._pool, self._alloc
        self._pool = None
        if pool is not None and alloc is not None:
            alloc.release_pool(pool)

    def pool(self):
        """The private memory pool (an allocator MemPool) of this graph, or None."""
        return self._pool

    @property
    def kernel_count(self) -> int:
        """Kernel nodes in the captured graph (0 before capture)."""
        return self.node_types.get("kernel", 0)

    def __repr__(self):
        state = ("capturing" if self._capturing else "captured" if self._exec is not None
                 else "empty")
        return f"<nbxtensor.cuda.CUDAGraph {state} nodes={self.node_types}>"

    def __del__(self):
        if getattr(self, "_capturing", False):
            return     # never tear down a capture from a finalizer
        try:
            self.reset()
        except Exception:  # noqa: BLE001 - interpreter shutdown / dead context
            pass


def _side_stream(device: int):
    with _lock:
        s = _side_streams.get(device)
        if s is None:
            s = _side_streams[device] = _streams.Stream(device)
        return s


@contextlib.contextmanager
def graph(cuda_graph: CUDAGraph, stream=None, capture_error_mode: str = "global"):
    """Capture the work issued inside the block into `cuda_graph` (torch.cuda.graph's form).

    stream: the (non-default) nbx.cuda.Stream to capture on; default: a side stream of the
    current device, reused across captures. (Sharing one pool between graphs, torch's
    `pool=`, is not supported: each graph owns its pool.)
    capture_error_mode: 'global' (default), 'thread_local' or 'relaxed' (CUstreamCaptureMode).
    """
    if not isinstance(cuda_graph, CUDAGraph):
        raise TypeError(f"graph: expected an nbx.cuda.CUDAGraph, got {type(cuda_graph).__name__}")
    if stream is None:
        stream = _side_stream(_drv.current_device())
    elif not isinstance(stream, _streams.Stream):
        raise TypeError(f"graph: stream must be an nbx.cuda.Stream, got {type(stream).__name__}")
    with _streams.stream(stream):
        cuda_graph.capture_begin(stream, capture_error_mode=capture_error_mode)
        try:
            yield cuda_graph
        except BaseException:
            cuda_graph.capture_end(failed=True)
            raise
        cuda_graph.capture_end()
