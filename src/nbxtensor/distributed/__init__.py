"""`nbx.distributed`: one process per GPU, collectives through NCCL (torch.distributed's names).

    import nbxtensor.distributed as dist
    dist.init_process_group("nccl")             # env:// from `python -m nbxtensor.distributed.run`
    dist.all_reduce(t)                          # in place, on nbx.cuda's current stream
    dist.destroy_process_group()

Rendezvous: rank 0 makes the NCCL unique id and hands it to the others through a store of
our own -- a TCP store served by a thread of rank 0 (`env://`: MASTER_ADDR/MASTER_PORT,
`tcp://host:port`) or a file store (`file:///a/fresh/folder`). Every wait is bounded by
`timeout`; a rank that does not arrive is named ("rank 1 did not join within 30 s").

Collectives: all_reduce, all_gather, all_gather_into_tensor, reduce_scatter_tensor,
broadcast, send, recv, barrier. Each checks its tensors on the local side first (Tensor,
device, contiguous, dtype NCCL reduces, shapes that fit the world size) and raises naming
the argument. With NBX_DIST_DEBUG=1 the ranks also compare (op, shape, dtype) through the
store before each call and raise naming the ranks that differ (a round trip per call, so
off by default). The collective path itself does no host synchronisation: it can be
captured in a CUDA graph. NCCL's NVLink multicast (NVLS) stays off.

backend="fake" is FOR TESTS: host tensors (cpu, interp), collectives through the store
(comm.FakeCommunicator).
"""
from __future__ import annotations

import datetime
import json
import os
import threading

from .. import config as _config
from ..tensor import Tensor
from . import nccl as _nccl
from .comm import Communicator, FakeCommunicator, NcclCommunicator
from .nccl import NcclError, NcclUnavailable
from .store import FileStore, Store, StoreError, StoreTimeout, TCPStore, exchange

__all__ = ["init_process_group", "destroy_process_group", "is_initialized", "get_rank",
           "get_world_size", "get_backend", "barrier", "all_reduce", "all_gather",
           "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "send", "recv",
           "ReduceOp", "DistError", "NcclError", "NcclUnavailable", "StoreError", "StoreTimeout",
           "TCPStore", "FileStore", "Store", "Communicator", "is_nccl_available", "get_device",
           "communicator"]

DEFAULT_TIMEOUT_S = 300.0


class DistError(RuntimeError):
    """A process-group call made in the wrong state (before init, twice, after destroy)."""


class ReduceOp:
    """torch.distributed.ReduceOp's names; the values are the strings the communicators take."""
    SUM = "sum"
    PRODUCT = "prod"
    MAX = "max"
    MIN = "min"
    AVG = "avg"


_OPS = {"sum", "prod", "max", "min", "avg"}
_DTYPES = set(_nccl._DTYPES) | set(_nccl._FP8)


class _Group:
    def __init__(self, backend, rank, world_size, store, comm, device, timeout):
        self.backend, self.rank, self.world_size = backend, rank, world_size
        self.store, self.comm, self.device, self.timeout = store, comm, device, timeout
        self.seq = 0               # collectives so far (the debug check's tag)
        self.barriers = 0
        self.p2p: dict = {}        # (src, dst) -> send/recv pairs so far (the debug check's tag)


_group: _Group | None = None
_lock = threading.Lock()


def is_nccl_available() -> bool:
    return _nccl.availability()[0]


# ----------------------------------------------------------------------------- init
def _seconds(timeout) -> float:
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"init_process_group: timeout must be a positive number of seconds or "
                         f"a timedelta, got {timeout!r}")
    return float(timeout)


def _env_int(env, name, given, what):
    if given is not None:
        return given
    raw = env.get(name)
    if raw is None:
        raise ValueError(f"init_process_group: {what} is not given and {name} is not set "
                         f"(run under `python -m nbxtensor.distributed.run`, or pass {what}=)")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"init_process_group: {name}={raw!r} is not an integer") from None


def _check_rank(rank, world_size):
    for name, v in (("world_size", world_size), ("rank", rank)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"init_process_group: {name} must be an int, got "
                            f"{type(v).__name__} {v!r}")
    if world_size < 1:
        raise ValueError(f"init_process_group: world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"init_process_group: rank {rank} is out of range for world_size "
                         f"{world_size} (expected 0..{world_size - 1})")


def _make_store(init_method, rank, world_size, timeout) -> Store:
    env = _config.launch_env()
    if init_method is None or init_method == "env://":
        addr = env.get("MASTER_ADDR") or "127.0.0.1"
        raw = env.get("MASTER_PORT")
        if raw is None:
            raise ValueError("init_process_group: init_method env:// needs MASTER_PORT (and "
                             "MASTER_ADDR, default 127.0.0.1) set")
        try:
            port = int(raw)
        except ValueError:
            raise ValueError(f"init_process_group: MASTER_PORT={raw!r} is not an integer") from None
        return TCPStore(addr, port, is_server=rank == 0, timeout=timeout)
    if not isinstance(init_method, str):
        raise TypeError(f"init_process_group: init_method must be a str, got "
                        f"{type(init_method).__name__}")
    if init_method.startswith("tcp://"):
        host, sep, port = init_method[6:].rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"init_process_group: init_method {init_method!r}: expected "
                             f"tcp://host:port")
        return TCPStore(host.strip("[]"), int(port), is_server=rank == 0, timeout=timeout)
    if init_method.startswith("file://"):
        path = init_method[7:]
        if not path:
            raise ValueError("init_process_group: init_method file:// needs a folder path")
        return FileStore(path, timeout=timeout)
    raise ValueError(f"init_process_group: init_method {init_method!r}: expected env://, "
                     f"tcp://host:port or file://path")


def init_process_group(backend: str = "nccl", init_method: str | None = None,
                       rank: int | None = None, world_size: int | None = None,
                       timeout=None, store: Store | None = None, device=None) -> None:
    """Join the process group: rank `rank` of `world_size` (default: RANK, WORLD_SIZE).

    backend "nccl": this process drives cuda:LOCAL_RANK (default: `device`, else cuda:rank);
    "fake" (tests): host tensors, collectives through the store. `store` replaces the
    init_method's store. Bounded by `timeout` (seconds or a timedelta, default 300 s)."""
    global _group
    if backend not in ("nccl", "fake"):
        raise ValueError(f"init_process_group: backend must be 'nccl' or 'fake', got {backend!r}")
    with _lock:
        if _group is not None:
            raise DistError(f"init_process_group: this process is already rank {_group.rank} of "
                            f"{_group.world_size} ({_group.backend}); call "
                            f"destroy_process_group() first")
        env = _config.launch_env()
        world_size = _env_int(env, "WORLD_SIZE", world_size, "world_size")
        rank = _env_int(env, "RANK", rank, "rank")
        _check_rank(rank, world_size)
        t = _seconds(timeout)
        dev = _device_for(backend, device, env, rank)
        if backend == "nccl":        # fail before the rendezvous when NCCL cannot work here
            ok, why = _nccl.availability()
            if not ok:
                raise NcclUnavailable(f"init_process_group(backend='nccl'): {why}")
            _config.set_nccl_env()
        st = store if store is not None else _make_store(init_method, rank, world_size, t)
        try:
            _rendezvous(st, rank, world_size, t)
            if backend == "nccl":
                uid = _nccl.get_unique_id() if rank == 0 else None
                if rank == 0:
                    st.set("nccl/uid", uid)
                else:
                    uid = _get(st, "nccl/uid", t, "init_process_group: rank 0 did not publish "
                                                   "the NCCL unique id")
                comm = NcclCommunicator(uid, rank, world_size, dev.index or 0)
            else:
                comm = FakeCommunicator(st, rank, world_size, t)
        except BaseException:
            if store is None:
                st.close()
            raise
        _group = _Group(backend, rank, world_size, st, comm, dev, t)


def _device_for(backend, device, env, rank):
    from ..device import as_device
    if backend == "fake":
        d = as_device(device if device is not None else "cpu")
        if not d.is_host:
            raise ValueError(f"init_process_group(backend='fake'): device must be cpu or interp "
                             f"(the fake communicator works on host tensors), got {d}")
        return d
    if device is None:
        local = env.get("LOCAL_RANK")
        try:
            index = int(local) if local is not None else rank
        except ValueError:
            raise ValueError(f"init_process_group: LOCAL_RANK={local!r} is not an integer") from None
        device = f"cuda:{index}"
    d = as_device(device)
    if d.type != "cuda":
        raise ValueError(f"init_process_group(backend='nccl'): device must be a cuda device, "
                         f"got {d}")
    return d


def _get(store, key, timeout, message):
    try:
        return store.get(key, timeout)
    except StoreTimeout:
        raise StoreTimeout([key], timeout, f"{message} within {timeout:g} s") from None


def _rendezvous(store, rank, world_size, timeout):
    """Every rank checks in; a rank that does not is named. A key of this rank left by an
    earlier job (a reused file store folder) is refused: its values would mix two jobs."""
    if isinstance(store, FileStore) and os.path.exists(store._file(f"join/{rank}")):
        raise StoreError(f"init_process_group: the file store {store.path!r} holds a rank "
                         f"{rank} of an earlier job; use a fresh folder per job")
    store.set(f"join/{rank}", b"1")
    keys = [f"join/{r}" for r in range(world_size)]
    try:
        store.wait(keys, timeout)
    except StoreTimeout as e:
        late = [k.split("/")[1] for k in e.missing]
        raise StoreTimeout(e.missing, timeout,
                           f"init_process_group: rank{'s' if len(late) > 1 else ''} "
                           f"{', '.join(late)} did not join within {timeout:g} s "
                           f"(world_size {world_size})") from None


def destroy_process_group() -> None:
    """Leave the group: destroy the communicator; rank 0 keeps the store up until every
    rank has left (bounded by the timeout), since the others may still be reading it."""
    global _group
    with _lock:
        g = _group
        if g is None:
            raise DistError("destroy_process_group: no process group (init_process_group first)")
        _group = None
    try:
        g.comm.close()
    finally:
        try:
            left = g.store.add("leave", 1)
            if g.rank == 0 and isinstance(g.store, TCPStore):
                _wait_count(g.store, "leave", left, g.world_size, g.timeout)
        except (StoreError, StoreTimeout):
            pass        # a rank that died cannot leave; destroy still succeeds locally
        g.store.close()


def _wait_count(store, key, value, target, timeout):
    import time
    deadline = time.monotonic() + timeout
    while value < target and time.monotonic() < deadline:
        time.sleep(0.01)
        value = store.add(key, 0)


def _require(op: str) -> _Group:
    g = _group
    if g is None:
        raise DistError(f"{op}: the default process group is not initialised; call "
                        f"nbx.distributed.init_process_group() first")
    return g


def is_initialized() -> bool:
    return _group is not None


def get_rank() -> int:
    return _require("get_rank").rank


def get_world_size() -> int:
    return _require("get_world_size").world_size


def get_backend() -> str:
    return _require("get_backend").backend


def get_device():
    """The device this rank's collectives take (cuda:LOCAL_RANK for nccl)."""
    return _require("get_device").device


def communicator() -> Communicator:
    return _require("communicator").comm


# ----------------------------------------------------------------------------- checks
def _check(g, op, name, t, *, device_only=False):
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
    if g.backend == "nccl":
        if t.device != g.device:
            raise ValueError(f"{op}: {name} is on {t.device}; the nccl backend of rank "
                             f"{g.rank} takes tensors on {g.device}")
    elif not t.device.is_host:
        raise ValueError(f"{op}: {name} is on {t.device}; the fake backend takes host tensors "
                         f"(cpu, interp)")
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous (shape {tuple(t.shape)}, strides "
                         f"{tuple(t.stride())}); call .contiguous() first")
    if t.dtype.name not in _DTYPES:
        raise TypeError(f"{op}: {name} has dtype {t.dtype.name}, which NCCL does not reduce; "
                        f"expected one of {', '.join(sorted(_DTYPES))}")


def _check_op(op_name, op):
    if op not in _OPS:
        raise ValueError(f"{op_name}: op must be a ReduceOp (sum, prod, max, min, avg), got {op!r}")


def _check_peer(g, op, name, peer):
    if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < g.world_size:
        raise ValueError(f"{op}: {name} must be a rank in 0..{g.world_size - 1}, got {peer!r}")


def _signature(name, *tensors, **extra) -> str:
    return json.dumps([name, [[list(t.shape), t.dtype.name] for t in tensors],
                       sorted(extra.items())])


def _debug_check(g, name, *tensors, **extra):
    """NBX_DIST_DEBUG: every rank's (op, shapes, dtypes) for call g.seq, compared."""
    g.seq += 1
    if not _config.get("NBX_DIST_DEBUG"):
        return
    sig = _signature(name, *tensors, **extra)
    sigs = [v.decode() for v in exchange(g.store, f"debug/{g.seq}", g.rank, g.world_size,
                                        sig.encode(), g.timeout, f"{name} (debug check)")]
    if all(s == sigs[0] for s in sigs):
        return
    groups: dict = {}
    for r, s in enumerate(sigs):
        groups.setdefault(s, []).append(r)

    def say(s):
        o, ts, ex = json.loads(s)
        parts = ", ".join(f"{tuple(shape)} {dt}" for shape, dt in ts)
        return f"{o}({parts}{''.join(f', {k}={v!r}' for k, v in ex)})"
    desc = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {say(s)}"
                     for s, rs in groups.items())
    # rank 0 hosts the TCP store: it raises once every rank has read the signatures, so that
    # each rank reports the mismatch rather than a lost store
    g.store.set(f"debug/{g.seq}/seen/{g.rank}", b"")
    if g.rank == 0:
        try:
            g.store.wait([f"debug/{g.seq}/seen/{r}" for r in range(g.world_size)],
                         min(g.timeout, 10.0))
        except StoreTimeout:
            pass
    raise ValueError(f"{name} (collective #{g.seq}): the ranks disagree: {desc}")


# ----------------------------------------------------------------------------- collectives
def all_reduce(tensor, op: str = ReduceOp.SUM) -> None:
    """Reduce `tensor` over the ranks, in place."""
    g = _require("all_reduce")
    _check(g, "all_reduce", "tensor", tensor)
    _check_op("all_reduce", op)
    _debug_check(g, "all_reduce", tensor, op=op)
    g.comm.all_reduce(tensor, op)


def _gather_shape_ok(out, inp, world):
    o, i = tuple(out.shape), tuple(inp.shape)
    cat = (i[0] * world,) + i[1:] if i else (world,)
    return o in (cat, (world,) + i)


def all_gather_into_tensor(output_tensor, input_tensor) -> None:
    """Every rank's `input_tensor` into `output_tensor`, rank blocks along dim 0: output of
    shape (world*n, ...) (concatenated) or (world, n, ...) (stacked)."""
    g = _require("all_gather_into_tensor")
    op = "all_gather_into_tensor"
    _check(g, op, "input_tensor", input_tensor)
    _check(g, op, "output_tensor", output_tensor)
    if output_tensor.dtype is not input_tensor.dtype:
        raise TypeError(f"{op}: output_tensor has dtype {output_tensor.dtype.name}, "
                        f"input_tensor {input_tensor.dtype.name}")
    if not _gather_shape_ok(output_tensor, input_tensor, g.world_size):
        raise ValueError(f"{op}: output_tensor has shape {tuple(output_tensor.shape)}; for "
                         f"input_tensor {tuple(input_tensor.shape)} and world_size "
                         f"{g.world_size} expected the rank blocks along dim 0")
    _debug_check(g, op, output_tensor, input_tensor)
    g.comm.all_gather(output_tensor, input_tensor)


def all_gather(tensor_list, tensor) -> None:
    """Every rank's `tensor` into `tensor_list[rank]` (a list of world_size tensors of its
    shape and dtype)."""
    g = _require("all_gather")
    _check(g, "all_gather", "tensor", tensor)
    if not isinstance(tensor_list, (list, tuple)) or len(tensor_list) != g.world_size:
        raise ValueError(f"all_gather: tensor_list must be a list of world_size "
                         f"({g.world_size}) tensors, got "
                         f"{len(tensor_list) if isinstance(tensor_list, (list, tuple)) else type(tensor_list).__name__}")
    for i, t in enumerate(tensor_list):
        if not isinstance(t, Tensor) or tuple(t.shape) != tuple(tensor.shape) or \
                t.dtype is not tensor.dtype or t.device != tensor.device:
            raise ValueError(f"all_gather: tensor_list[{i}] must be a tensor of shape "
                             f"{tuple(tensor.shape)} {tensor.dtype.name} on {tensor.device}, "
                             f"got {_describe(t)}")
    from .. import empty
    buf = empty((g.world_size,) + tuple(tensor.shape), dtype=tensor.dtype, device=tensor.device)
    _debug_check(g, "all_gather", tensor)
    g.comm.all_gather(buf, tensor)
    for i, t in enumerate(tensor_list):
        t.copy_(buf[i])


def _describe(t):
    if not isinstance(t, Tensor):
        return type(t).__name__
    return f"{tuple(t.shape)} {t.dtype.name} on {t.device}"


def reduce_scatter_tensor(output, input, op: str = ReduceOp.SUM) -> None:  # noqa: A002
    """Reduce `input` over the ranks and keep this rank's block (along dim 0) in `output`:
    input of shape (world*n, ...) or (world, n, ...), output (n, ...)."""
    g = _require("reduce_scatter_tensor")
    name = "reduce_scatter_tensor"
    _check(g, name, "input", input)
    _check(g, name, "output", output)
    _check_op(name, op)
    if output.dtype is not input.dtype:
        raise TypeError(f"{name}: output has dtype {output.dtype.name}, input {input.dtype.name}")
    if not _gather_shape_ok(input, output, g.world_size):
        raise ValueError(f"{name}: input has shape {tuple(input.shape)}; for output "
                         f"{tuple(output.shape)} and world_size {g.world_size} expected the "
                         f"rank blocks along dim 0")
    _debug_check(g, name, output, input, op=op)
    g.comm.reduce_scatter(output, input, op)


def broadcast(tensor, src: int) -> None:
    """`tensor` of rank `src` into `tensor` of every rank."""
    g = _require("broadcast")
    _check(g, "broadcast", "tensor", tensor)
    _check_peer(g, "broadcast", "src", src)
    _debug_check(g, "broadcast", tensor, src=src)
    g.comm.broadcast(tensor, src)


def send(tensor, dst: int) -> None:
    """`tensor` to rank `dst` (which calls recv with src = this rank)."""
    g = _p2p_group("send", tensor, "dst", dst)
    _p2p_debug(g, "send", tensor, g.rank, dst)
    g.comm.send(tensor, dst)


def recv(tensor, src: int) -> None:
    """Into `tensor`, what rank `src` sends."""
    g = _p2p_group("recv", tensor, "src", src)
    _p2p_debug(g, "recv", tensor, src, g.rank)
    g.comm.recv(tensor, src)


def _p2p_group(op, t, peer_name, peer):
    """The group of a send/recv of `t` with rank `peer` (another one than this), checked."""
    g = _require(op)
    _check(g, op, "tensor", t)
    _check_peer(g, op, peer_name, peer)
    if peer == g.rank:
        raise ValueError(f"{op}: {peer_name} {peer} is this rank")
    return g


def _p2p_debug(g, op, t, src, dst):
    """NBX_DIST_DEBUG for a send/recv pair: the sender publishes its (shape, dtype), the
    receiver compares with its own."""
    if not _config.get("NBX_DIST_DEBUG"):
        return
    n = g.p2p[(src, dst)] = g.p2p.get((src, dst), 0) + 1
    key = f"debug/p2p/{src}/{dst}/{n}"
    mine = f"{tuple(t.shape)} {t.dtype.name}"
    if op == "send":
        g.store.set(key, mine.encode())
        return
    theirs = _get(g.store, key, g.timeout, f"recv (debug check): rank {src} did not send").decode()
    g.store.delete(key)
    if theirs != mine:
        raise ValueError(f"recv (debug check): rank {src} sends {theirs}, rank {dst} receives "
                         f"into {mine}")


def barrier() -> None:
    """Wait until every rank reaches the barrier (and, on nccl, until this rank's queued
    collectives have finished). A rank that does not arrive within the timeout is named."""
    g = _require("barrier")
    g.comm.synchronize()
    g.barriers += 1
    exchange(g.store, f"barrier/{g.barriers}", g.rank, g.world_size, b"", g.timeout, "barrier",
             "did not reach the barrier")
