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
  tensor the user kept are released when that tensor dies). Graphs may share one pool
  (`pool=graph_pool_handle()` or `pool=other.pool()`, torch's form): it is released when the
  last graph using it and the handle are gone. Sharing is safe when the graphs are replayed
  in one stream order, as a GraphedCallable does (each graph's live outputs are never reused;
  one graph's temporaries may reuse another's, which only stream order keeps apart).
* Kernels must be compiled and loaded before capture (run the step once eagerly: the
  first launch compiles through Triton and loads a module, which is not recorded).
* Static addresses: a replay reads and writes the memory the captured launches named.
  Inputs must be updated in place (`x.copy_(...)`); tensors the graph reads must stay
  alive as long as the graph (like torch, nothing keeps them alive for you).
"""
from __future__ import annotations

import contextlib
import threading
import weakref

from ...device import Device as _Device
from . import driver as _drv
from .driver import CaptureError
from .memory import MemPool, allocator_for
from . import streams as _streams

__all__ = ["CUDAGraph", "graph", "CaptureError", "is_current_stream_capturing", "GraphPool",
           "graph_pool_handle", "GraphedCallable", "graphed", "make_graphed_callables"]

_MODES = {"global": _drv.CAPTURE_MODE_GLOBAL, "thread_local": _drv.CAPTURE_MODE_THREAD_LOCAL,
          "relaxed": _drv.CAPTURE_MODE_RELAXED}
_side_streams: dict = {}      # device index -> the side Stream graph() captures on by default
_pool_handles: dict = {}      # (device index, pool id) -> weakref to its GraphPool
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


class GraphPool:
    """A graph memory pool (an allocator MemPool) that graphs share: `graph(g, pool=p)`. The
    pool goes back to the allocator when the last graph using it and this handle die."""

    def __init__(self, device: int):
        self.device = device
        self.alloc = allocator_for(device)
        with self.alloc.private_pool() as pool:     # a fresh id; memory comes with captures
            self.mempool = pool
        with _lock:
            _pool_handles[(device, pool.id)] = weakref.ref(self)

    def __repr__(self):
        return f"<GraphPool cuda:{self.device} id={self.mempool.id}>"

    def __del__(self):
        try:
            with _lock:
                _pool_handles.pop((self.device, self.mempool.id), None)
            self.alloc.release_pool(self.mempool)
        except Exception:  # noqa: BLE001 - interpreter shutdown / inside another capture
            pass


def graph_pool_handle(device=None) -> GraphPool:
    """A new pool for graphs to share (torch.cuda.graph_pool_handle)."""
    return GraphPool(_streams.device_index(device))


def _shared_pool(pool, device: int) -> GraphPool:
    """The GraphPool `pool=` names: a GraphPool, or the MemPool of a live graph's pool()."""
    if isinstance(pool, GraphPool):
        found = pool
    elif isinstance(pool, MemPool):
        ref = _pool_handles.get((device, pool.id))
        found = ref() if ref is not None else None
        if found is None or pool.released:
            raise CaptureError(f"capture_begin: pool {pool!r} is not the pool of a live graph "
                               f"on cuda:{device}")
    else:
        raise TypeError(f"capture_begin: pool must be a GraphPool (graph_pool_handle()) or "
                        f"another graph's pool(), got {type(pool).__name__}")
    if found.device != device:
        raise ValueError(f"capture_begin: pool is on cuda:{found.device}, the capture on "
                         f"cuda:{device}")
    return found


class CUDAGraph:
    """A captured CUDA graph: `with nbx.cuda.graph(g): ...` records, `g.replay()` runs it."""

    def __init__(self):
        self._graph = None        # CUgraph
        self._exec = None         # CUgraphExec
        self._pool = None         # the GraphPool this graph allocates from (its own or shared)
        self._alloc = None
        self._device = None
        self._stream = None       # the Stream captured on (kept alive while capturing)
        self._capturing = False
        self.node_types: dict = {}
        self._replay_hooks: list = []   # called before each launch (random generators' state)

    # ------------------------------------------------------------------ capture
    def capture_begin(self, stream, capture_error_mode: str = "global", pool=None) -> None:
        """Begin capturing `stream` (an nbx.cuda.Stream, made current by the caller); memory
        comes from `pool` (shared, see GraphPool) or a pool of this graph's own."""
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
        shared = GraphPool(dev) if pool is None else _shared_pool(pool, dev)
        # queued work (the inputs' writes, frees of memory the pool may not reuse yet) is done
        _drv.ctx_synchronize()
        ctx = alloc.private_pool(shared.mempool)
        ctx.__enter__()
        what = f"graph {id(self):#x} on cuda:{dev}"
        alloc.capture_guard = _allocation_guard(shared.mempool.id, stream.handle, what)
        try:
            _drv.stream_begin_capture(stream.handle, _MODES[capture_error_mode], what)
        except BaseException:
            alloc.capture_guard = None
            ctx.__exit__(None, None, None)
            raise
        self._pool_ctx = ctx
        self._pool, self._alloc, self._device, self._stream = shared, alloc, dev, stream
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
        self._pool = None       # the pool is released with its last user (GraphPool.__del__)

    def pool(self):
        """The memory pool (an allocator MemPool) of this graph, or None; `pool=` of another
        capture accepts it to share the pool."""
        return self._pool.mempool if self._pool is not None else None

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
def graph(cuda_graph: CUDAGraph, pool=None, stream=None, capture_error_mode: str = "global"):
    """Capture the work issued inside the block into `cuda_graph` (torch.cuda.graph's form).

    pool: a GraphPool (graph_pool_handle()) or another graph's pool() to share; default: a
    pool of the graph's own.
    stream: the (non-default) nbx.cuda.Stream to capture on; default: a side stream of the
    current device, reused across captures.
    capture_error_mode: 'global' (default), 'thread_local' or 'relaxed' (CUstreamCaptureMode).
    """
    if not isinstance(cuda_graph, CUDAGraph):
        raise TypeError(f"graph: expected an nbx.cuda.CUDAGraph, got {type(cuda_graph).__name__}")
    if stream is None:
        stream = _side_stream(_drv.current_device())
    elif not isinstance(stream, _streams.Stream):
        raise TypeError(f"graph: stream must be an nbx.cuda.Stream, got {type(stream).__name__}")
    with _streams.stream(stream):
        cuda_graph.capture_begin(stream, capture_error_mode=capture_error_mode, pool=pool)
        try:
            yield cuda_graph
        except BaseException:
            cuda_graph.capture_end(failed=True)
            raise
        cuda_graph.capture_end()


# ============================================================================================
# Graphed callables: any function of tensors with static shapes, replayed from CUDA graphs
# ============================================================================================
# g = graphed(fn)            # or make_graphed_callables(fn, sample_args), torch's form
# y = g(x)                   # first call with these shapes: warm-up, capture; later: replay
#
# Inference only (there is no autograd): a call copies its tensor inputs into the static
# input buffers of the graph captured for their signature (shapes, dtypes, devices and the
# non-tensor arguments, which are baked into the capture as constants) and replays it. The
# outputs are the graph's static output tensors, as torch's graphed callables return them:
# the next call with the same signature overwrites them (clone() what must be kept). Host
# inputs (NumPy arrays, cpu tensors) are copied to the device, so the function sees cuda
# tensors. The graphs of one callable share one memory pool and are replayed in one stream
# order (a call on another stream than the last waits for the last replay first), which is
# what makes the sharing safe.

def _leaves(tree, path="output"):
    """[(path, leaf)] of a nest of tuples, lists and str-keyed dicts."""
    if isinstance(tree, (tuple, list)):
        return [x for i, t in enumerate(tree) for x in _leaves(t, f"{path}[{i}]")]
    if isinstance(tree, dict):
        return [x for k, t in tree.items() for x in _leaves(t, f"{path}[{k!r}]")]
    return [(path, tree)]


def _fresh(tree):
    """The output nest with new containers around the same static tensors (a caller that
    edits the list or dict it got does not edit the next call's)."""
    if tree.__class__ in (tuple, list):
        return tree.__class__(_fresh(t) for t in tree)
    if tree.__class__ is dict:
        return {k: _fresh(t) for k, t in tree.items()}
    return tree


class _Captured:
    """One signature's graph: its static inputs (by argument position) and outputs."""

    __slots__ = ("graph", "inputs", "outputs")

    def __init__(self, graph, inputs, outputs):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs


@contextlib.contextmanager
def _index_checks_deferred():
    # the kernels' out-of-range flag is read on exit, after the capture ended (inside, its
    # read would be a host read, which a capture refuses); index_errors holds the state
    from ... import index_errors
    index_errors.DEFER[0] += 1
    try:
        yield
    finally:
        index_errors.DEFER[0] -= 1
        if not index_errors.DEFER[0]:
            index_errors.read_flags()


class GraphedCallable:
    """`fn` replayed from CUDA graphs, one per input signature (see the section comment).

    device       the cuda device of the graphs; default: that of the first cuda tensor argument
    warmup       eager calls before a capture (they compile and load every kernel)
    max_graphs   signatures kept; the least recently used graph beyond it is reset
    pool         a GraphPool to share with other graphs (default: one of this callable's own)
    """

    def __init__(self, fn, *, device=None, warmup: int = 1, max_graphs: int = 64, pool=None,
                 name: str | None = None):
        if not callable(fn):
            raise TypeError(f"graphed: fn must be callable, got {type(fn).__name__}")
        if warmup.__class__ is not int or warmup < 1:
            raise ValueError(f"graphed: warmup must be an int >= 1, got {warmup!r}")
        if max_graphs.__class__ is not int or max_graphs < 1:
            raise ValueError(f"graphed: max_graphs must be an int >= 1, got {max_graphs!r}")
        self.fn, self.warmup, self.max_graphs = fn, warmup, max_graphs
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        self._device = None if device is None else _streams.device_index(device)
        self._pool = pool
        self._graphs: dict = {}          # signature -> _Captured, least recently used first
        self._lock = threading.RLock()
        self._event = None               # recorded after each replay on self._stream
        self._stream = None
        self.captures = self.replays = 0

    # ------------------------------------------------------------------ signature
    def _signature(self, args, kwargs):
        """(key, device, [(position, tensor or array)]) of one call."""
        from ...tensor import Tensor
        np = _np()
        key, tensors, device = [], [], self._device
        items = list(enumerate(args)) + sorted(kwargs.items())
        for pos, a in items:
            if isinstance(a, Tensor):
                if a.device.type == "cuda":
                    idx = a.device.index or 0
                    if device is None:
                        device = idx
                    elif idx != device:
                        raise ValueError(f"{self.name}: argument {pos!r} is on cuda:{idx}, the "
                                         f"graphs on cuda:{device}")
                elif a.device.type != "cpu":
                    raise ValueError(f"{self.name}: argument {pos!r} is on {a.device}; a graphed "
                                     f"callable takes cuda tensors, or cpu tensors and NumPy "
                                     f"arrays (copied to the device)")
                key.append((pos, "tensor", tuple(a.shape), a.dtype.name))
                tensors.append((pos, a))
            elif isinstance(a, np.ndarray):
                key.append((pos, "tensor", a.shape, _dtype_of(a).name))
                tensors.append((pos, a))
            else:
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(f"{self.name}: argument {pos!r} ({type(a).__name__}) is "
                                    f"neither a tensor nor hashable; a non-tensor argument is "
                                    f"a constant of the captured graph, keyed by its value"
                                    ) from None
                key.append((pos, "value", type(a).__name__, a))
        if device is None:
            raise ValueError(f"{self.name}: no cuda tensor among the arguments and no device= "
                             f"given: the graphs need a cuda device")
        return tuple(key), device, tensors

    # ------------------------------------------------------------------ call
    def __call__(self, *args, **kwargs):
        key, device, tensors = self._signature(args, kwargs)
        with self._lock:
            entry = self._graphs.pop(key, None)
            if entry is None:
                entry = self._capture(key, device, args, kwargs, tensors)
            self._graphs[key] = entry                 # most recently used last
            self._replay(entry, device, tensors)
        return _fresh(entry.outputs)

    def capture(self, *args, **kwargs) -> None:
        """Capture the graph for this signature now (make_graphed_callables' sample_args)."""
        key, device, tensors = self._signature(args, kwargs)
        with self._lock:
            if key not in self._graphs:
                self._graphs[key] = self._capture(key, device, args, kwargs, tensors)

    def _replay(self, entry, device, tensors) -> None:
        cur = _streams.current_stream(device).handle
        _drv.set_device(device)
        if self._event is None:
            self._event = _drv.event_create(timing=False)
        elif self._stream != cur:                # the last replay ran on another stream
            _drv.stream_wait_event(cur, self._event)
        for (pos, a), static in zip(tensors, entry.inputs):
            _copy_in(static, a, cur)
        entry.graph.replay()
        _drv.event_record(self._event, cur)
        self._stream = cur
        self.replays += 1

    # ------------------------------------------------------------------ capture
    def _capture(self, key, device, args, kwargs, tensors):
        from ...tensor import Tensor
        _drv.set_device(device)
        dev = _Device("cuda", device)
        statics = [Tensor._empty(tuple(a.shape), _dtype_of(a), dev) for _, a in tensors]
        cur = _streams.current_stream(device).handle
        for (pos, a), s in zip(tensors, statics):
            _copy_in(s, a, cur)
        sargs, skw = list(args), dict(kwargs)
        for (pos, _), s in zip(tensors, statics):
            if isinstance(pos, int):
                sargs[pos] = s
            else:
                skw[pos] = s
        side = _side_stream(device)
        desc = ", ".join(f"{k[0]}: {k[2]} {k[3]}" if k[1] == "tensor" else f"{k[0]}: {k[3]!r}"
                         for k in key)
        _drv.ctx_synchronize()                     # the static inputs are written
        with _streams.stream(side):
            for _ in range(self.warmup):
                warm = self.fn(*sargs, **skw)
            warm_shapes = [(p, _shape_of(x)) for p, x in _leaves(warm)]
            del warm
        if self._pool is None:
            self._pool = GraphPool(device)
        g = CUDAGraph()
        try:
            with _index_checks_deferred(), graph(g, pool=self._pool, stream=side):
                out = self.fn(*sargs, **skw)
        except CaptureError as e:
            raise CaptureError(f"{self.name} cannot be graphed (inputs {desc}): {e}") from None
        _check_outputs(self.name, desc, g, out, warm_shapes, dev)
        self.captures += 1
        while len(self._graphs) >= self.max_graphs:
            oldest = next(iter(self._graphs))
            self._graphs.pop(oldest).graph.reset()
        return _Captured(g, statics, out)

    # ------------------------------------------------------------------ state
    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def reset(self) -> None:
        """Drop every captured graph and the pool (tensors returned earlier stay valid)."""
        with self._lock:
            for e in self._graphs.values():
                e.graph.reset()
            self._graphs.clear()
            self._pool = None

    def __repr__(self):
        return f"<GraphedCallable {self.name} graphs={len(self._graphs)} replays={self.replays}>"

    def __del__(self):
        e = getattr(self, "_event", None)
        if e is not None:
            try:
                _drv.event_destroy(e)
            except Exception:  # noqa: BLE001 - interpreter shutdown / dead context
                pass


def _dtype_of(a):
    from ... import dtypes as _dt
    return _dt.as_dtype(a.dtype) if isinstance(a, _np().ndarray) else a.dtype


def _np():
    import numpy
    return numpy


def _shape_of(x):
    return tuple(x.shape) if hasattr(x, "shape") else type(x).__name__


def _check_outputs(name, desc, g, out, warm_shapes, dev) -> None:
    """Outputs must be cuda tensors (or None) of the warm-up's shapes."""
    from ...tensor import Tensor
    leaves = _leaves(out)
    for path, x in leaves:
        if x is not None and not (isinstance(x, Tensor) and x.device == dev):
            g.reset()
            raise TypeError(f"{name}: {path} is {type(x).__name__}"
                            f"{' on ' + str(x.device) if isinstance(x, Tensor) else ''}; a graphed "
                            f"callable returns tensors on {dev} (or None), nests of tuples, "
                            f"lists and dicts of them")
    shapes = [(p, _shape_of(x)) for p, x in leaves]
    if shapes != warm_shapes:
        g.reset()
        raise CaptureError(f"{name} changes shapes from call to call (inputs {desc}): the "
                           f"warm-up returned {warm_shapes}, the capture {shapes}; a graph "
                           f"replays fixed shapes")


def _copy_in(static, a, stream: int) -> None:
    """Copy argument `a` into its static input buffer, on `stream` (the current one)."""
    from ...tensor import Tensor
    if a is static:
        return
    if isinstance(a, Tensor):
        if a.device.type == "cuda" and a.is_contiguous():
            if a.nbytes:
                _drv.memcpy_dtod(static.data_ptr(), a.data_ptr(), a.nbytes, stream=stream)
            return
        static.copy_(a, non_blocking=True)
        return
    from ...creation import from_numpy
    static.copy_(from_numpy(a), non_blocking=True)


def graphed(fn=None, *, device=None, warmup: int = 1, max_graphs: int = 64, pool=None):
    """GraphedCallable(fn, ...); usable as a decorator, with or without arguments."""
    if fn is None:
        return lambda f: GraphedCallable(f, device=device, warmup=warmup, max_graphs=max_graphs,
                                         pool=pool)
    return GraphedCallable(fn, device=device, warmup=warmup, max_graphs=max_graphs, pool=pool)


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool=None):
    """torch.cuda.make_graphed_callables for inference: each callable (a function or a module,
    whose forward is replaced) is captured for its sample arguments now; other signatures are
    captured on their first call. A tuple of callables takes a tuple of argument tuples.
    allow_unused_input is accepted for torch's signature: without autograd, an input the
    callable does not read needs no check."""
    single = not isinstance(callables, tuple)
    cs = (callables,) if single else callables
    samples = (sample_args,) if single else sample_args
    if not isinstance(samples, tuple) or len(samples) != len(cs):
        raise ValueError(f"make_graphed_callables: sample_args must be a tuple with one "
                         f"argument tuple per callable ({len(cs)}), got {type(sample_args).__name__}")
    out = []
    for c, sample in zip(cs, samples):
        sample = sample if isinstance(sample, tuple) else (sample,)
        forward = getattr(c, "forward", None) if not _is_plain_function(c) else None
        g = GraphedCallable(forward or c, warmup=num_warmup_iters, pool=pool,
                            name=type(c).__name__ + ".forward" if forward else None)
        g.capture(*sample)
        if forward is not None:
            c.forward = g           # the module's __call__ (hooks included) now replays
            out.append(c)
        else:
            out.append(g)
    return out[0] if single else tuple(out)


def _is_plain_function(c) -> bool:
    import types
    return isinstance(c, (types.FunctionType, types.MethodType, types.BuiltinFunctionType,
                          GraphedCallable))
