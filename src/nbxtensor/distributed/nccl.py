"""NCCL through ctypes on libnccl.so.2: the one place that knows the NCCL ABI.

The library is found in the `nvidia-nccl-cu13` (or -cu12) wheel's lib folder, else on
the system's library path; it is opened on the first call that needs it (never at
import). Where it is absent, `availability()` says why and every other call raises
`NcclUnavailable`.

A failing call raises `NcclError` carrying NCCL's result name (ncclInvalidUsage), NCCL's
own text for it (ncclGetErrorString), the communicator's last error message where there
is one (ncclGetLastError) and the call that failed. Collectives take raw device pointers
and a CUstream handle: they only enqueue (no host synchronisation), so they can be
captured in a CUDA graph.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys
import threading
from ctypes import POINTER, Structure, byref, c_char, c_char_p, c_int, c_size_t, c_uint, c_void_p

from ..backends.native import load_once
from ..dtypes import DType

__all__ = ["NcclError", "NcclUnavailable", "availability", "version", "RESULTS", "REDUCE_OPS",
           "nccl_dtype", "UniqueId", "get_unique_id", "comm_init_rank", "comm_destroy",
           "comm_abort", "comm_async_error", "all_reduce", "all_gather", "reduce_scatter",
           "broadcast", "send", "recv", "group_start", "group_end", "library_candidates"]

# ncclResult_t
RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError",
           3: "ncclInternalError", 4: "ncclInvalidArgument", 5: "ncclInvalidUsage",
           6: "ncclRemoteError", 7: "ncclInProgress", 8: "ncclTimeout"}
IN_PROGRESS = 7

# ncclRedOp_t (ncclAvg since NCCL 2.10)
REDUCE_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}

# ncclDataType_t by our dtype name; the float8 types exist from NCCL 2.24 on
_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "int64": 4, "float16": 6, "float32": 7,
           "float64": 8, "bfloat16": 9}
_FP8 = {"float8_e4m3fn": 10, "float8_e5m2": 11}
_FP8_SINCE = 22400


class NcclError(RuntimeError):
    """An NCCL call failed. `.code`, `.name`, `.text`, `.detail` and `.call` say which and why."""

    def __init__(self, code: int, call: str, text: str | None = None, detail: str | None = None):
        self.code = int(code)
        self.call = call
        self.name = RESULTS.get(self.code, f"ncclResult({self.code})")
        self.text = text or "(no description)"
        self.detail = detail or ""
        msg = f"{call} failed: {self.name} ({self.code}): {self.text}"
        super().__init__(msg + (f"; NCCL says: {self.detail}" if self.detail else ""))

    def __reduce__(self):
        return (type(self), (self.code, self.call, self.text, self.detail))


class NcclUnavailable(RuntimeError):
    """libnccl cannot be used on this machine."""


class UniqueId(Structure):
    """ncclUniqueId: 128 opaque bytes, passed by value to ncclCommInitRank."""
    _fields_ = [("internal", c_char * 128)]

    def to_bytes(self) -> bytes:
        return ctypes.string_at(ctypes.addressof(self), 128)

    @classmethod
    def from_bytes(cls, b: bytes) -> "UniqueId":
        if len(b) != 128:
            raise ValueError(f"an ncclUniqueId has 128 bytes, got {len(b)}")
        u = cls()
        ctypes.memmove(ctypes.addressof(u), b, 128)
        return u


class _Config(Structure):
    """The leading fields of ncclConfig_t, as NCCL 2.18 declared them. NCCL reads the
    struct by its `version` field, so declaring the 2.18 layout with version 2.18 is valid
    for every later library."""
    _fields_ = [("size", c_size_t), ("magic", c_uint), ("version", c_uint),
                ("blocking", c_int), ("cgaClusterSize", c_int), ("minCTAs", c_int),
                ("maxCTAs", c_int), ("netName", c_char_p), ("splitShare", c_int)]


_UNDEF_INT = -2147483648
_CONFIG_VERSION = 21800


def config(blocking: bool = True) -> _Config:
    """An ncclConfig_t as NCCL_CONFIG_INITIALIZER makes it, with `blocking` set."""
    c = _Config()
    c.size, c.magic, c.version = ctypes.sizeof(_Config), 0xcafebeef, _CONFIG_VERSION
    c.blocking = 1 if blocking else 0
    c.cgaClusterSize = c.minCTAs = c.maxCTAs = c.splitShare = _UNDEF_INT
    c.netName = None
    return c


_P = c_void_p
_SIGNATURES = {
    "ncclGetVersion": [POINTER(c_int)],
    "ncclGetUniqueId": [POINTER(UniqueId)],
    "ncclCommInitRank": [POINTER(c_void_p), c_int, UniqueId, c_int],
    "ncclCommInitRankConfig": [POINTER(c_void_p), c_int, UniqueId, c_int, POINTER(_Config)],
    "ncclCommDestroy": [_P],
    "ncclCommAbort": [_P],
    "ncclCommGetAsyncError": [_P, POINTER(c_int)],
    # sendbuff, recvbuff, count, datatype, op, comm, stream
    "ncclAllReduce": [_P, _P, c_size_t, c_int, c_int, _P, _P],
    # sendbuff, recvbuff, sendcount, datatype, comm, stream
    "ncclAllGather": [_P, _P, c_size_t, c_int, _P, _P],
    # sendbuff, recvbuff, recvcount, datatype, op, comm, stream
    "ncclReduceScatter": [_P, _P, c_size_t, c_int, c_int, _P, _P],
    # sendbuff, recvbuff, count, datatype, root, comm, stream
    "ncclBroadcast": [_P, _P, c_size_t, c_int, c_int, _P, _P],
    # buff, count, datatype, peer, comm, stream
    "ncclSend": [_P, c_size_t, c_int, c_int, _P, _P],
    "ncclRecv": [_P, c_size_t, c_int, c_int, _P, _P],
    "ncclGroupStart": [],
    "ncclGroupEnd": [],
}
_lib = None
_fns: dict = {}
_version = 0
_load_error: str | None = None
_lock = threading.Lock()


def library_candidates() -> list:
    """Where libnccl.so.2 is looked for, in order: the nvidia-nccl wheel's lib folder, then
    the bare name (the system's library path)."""
    out = []
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        out += sorted(glob.glob(os.path.join(folder, "lib", "libnccl.so*")))
    return out + ["libnccl.so.2"]


def _load():
    if _lib is not None:
        return _lib
    return load_once(sys.modules[__name__], _open_libnccl, NcclUnavailable)


def _open_libnccl():
    global _lib, _version
    errors, lib = [], None
    for cand in library_candidates():
        try:
            lib = ctypes.CDLL(cand)
            break
        except OSError as e:
            errors.append(f"{cand}: {e}")
    if lib is None:
        raise NcclUnavailable("libnccl.so.2 not found (install the nvidia-nccl-cu13 wheel or put "
                              "NCCL on the library path): " + "; ".join(errors))
    fns = {}
    for name, argtypes in _SIGNATURES.items():
        f = getattr(lib, name, None)
        if f is not None:
            f.argtypes, f.restype = argtypes, c_int
            fns[name] = f
    for name in ("ncclGetErrorString", "ncclGetLastError"):
        f = getattr(lib, name, None)
        if f is not None:
            f.argtypes = [c_int] if name == "ncclGetErrorString" else [_P]
            f.restype = c_char_p
            fns[name] = f
    missing = [n for n in _SIGNATURES if n not in fns and n != "ncclCommInitRankConfig"]
    if missing or "ncclGetErrorString" not in fns:
        raise NcclUnavailable(f"{cand} lacks {', '.join(missing) or 'ncclGetErrorString'} "
                              f"(too old?)")
    v = c_int()
    if fns["ncclGetVersion"](byref(v)) != 0:
        raise NcclUnavailable(f"{cand}: ncclGetVersion failed")
    _fns.update(fns)
    _version = v.value
    _lib = lib
    return lib


def availability() -> tuple[bool, str]:
    """(True, "NCCL 2.x.y at <path>") or (False, the reason libnccl cannot be used)."""
    try:
        lib = _load()
    except NcclUnavailable as e:
        return False, str(e)
    return True, f"NCCL {version_string()} ({lib._name})"


def version() -> int:
    """NCCL_VERSION_CODE of the loaded library (2.21.5 -> 22105)."""
    _load()
    return _version


def version_string() -> str:
    v = version()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 20900 else str(v)


def _error(code: int, call: str, comm=None) -> NcclError:
    text = _fns["ncclGetErrorString"](code)
    detail = None
    if "ncclGetLastError" in _fns:
        d = _fns["ncclGetLastError"](comm)
        detail = d.decode(errors="replace") if d else None
    return NcclError(code, call, text.decode(errors="replace") if text else None, detail)


def _check(rc: int, call: str, comm=None) -> None:
    if rc != 0:
        raise _error(rc, call, comm)


def nccl_dtype(dt: DType) -> int:
    """ncclDataType_t of an nbx dtype; TypeError naming the dtype where NCCL has none."""
    code = _DTYPES.get(dt.name)
    if code is None and dt.name in _FP8:
        if version() < _FP8_SINCE:
            raise TypeError(f"NCCL {version_string()} has no {dt.name} type (NCCL 2.24+ has)")
        code = _FP8[dt.name]
    if code is None:
        raise TypeError(f"NCCL has no data type for {dt.name}; it reduces "
                        f"{', '.join(list(_DTYPES) + list(_FP8))}")
    return code


def reduce_op(op: str) -> int:
    try:
        return REDUCE_OPS[op]
    except KeyError:
        raise ValueError(f"op must be one of {sorted(REDUCE_OPS)}, got {op!r}") from None


# ----------------------------------------------------------------------------- calls
def get_unique_id() -> bytes:
    _load()
    u = UniqueId()
    _check(_fns["ncclGetUniqueId"](byref(u)), "ncclGetUniqueId")
    return u.to_bytes()


def comm_init_rank(unique_id: bytes, world_size: int, rank: int, blocking: bool = True) -> int:
    """A communicator (its handle) for `rank` of `world_size` on the current CUDA device.
    blocking=False uses ncclCommInitRankConfig; the caller then polls comm_async_error."""
    _load()
    comm = c_void_p()
    uid = UniqueId.from_bytes(unique_id)
    if blocking:
        _check(_fns["ncclCommInitRank"](byref(comm), world_size, uid, rank), "ncclCommInitRank")
    else:
        if "ncclCommInitRankConfig" not in _fns:
            raise NcclUnavailable(f"NCCL {version_string()} lacks ncclCommInitRankConfig")
        cfg = config(blocking=False)
        rc = _fns["ncclCommInitRankConfig"](byref(comm), world_size, uid, rank, byref(cfg))
        if rc not in (0, IN_PROGRESS):
            raise _error(rc, "ncclCommInitRankConfig", comm)
    return comm.value


def comm_async_error(comm: int) -> int:
    """The communicator's state: 0 (ncclSuccess), 7 (ncclInProgress) or an error code."""
    r = c_int()
    _check(_fns["ncclCommGetAsyncError"](comm, byref(r)), "ncclCommGetAsyncError", comm)
    return r.value


def comm_destroy(comm: int) -> None:
    _check(_fns["ncclCommDestroy"](comm), "ncclCommDestroy")


def comm_abort(comm: int) -> None:
    _check(_fns["ncclCommAbort"](comm), "ncclCommAbort")


def all_reduce(send: int, recv: int, count: int, dtype: int, op: int, comm: int, stream: int):
    _check(_fns["ncclAllReduce"](send, recv, count, dtype, op, comm, stream), "ncclAllReduce",
           comm)


def all_gather(send: int, recv: int, count: int, dtype: int, comm: int, stream: int):
    _check(_fns["ncclAllGather"](send, recv, count, dtype, comm, stream), "ncclAllGather", comm)


def reduce_scatter(send: int, recv: int, recv_count: int, dtype: int, op: int, comm: int,
                   stream: int):
    _check(_fns["ncclReduceScatter"](send, recv, recv_count, dtype, op, comm, stream),
           "ncclReduceScatter", comm)


def broadcast(send: int, recv: int, count: int, dtype: int, root: int, comm: int, stream: int):
    _check(_fns["ncclBroadcast"](send, recv, count, dtype, root, comm, stream), "ncclBroadcast",
           comm)


def send(buf: int, count: int, dtype: int, peer: int, comm: int, stream: int):
    _check(_fns["ncclSend"](buf, count, dtype, peer, comm, stream), "ncclSend", comm)


def recv(buf: int, count: int, dtype: int, peer: int, comm: int, stream: int):
    _check(_fns["ncclRecv"](buf, count, dtype, peer, comm, stream), "ncclRecv", comm)


def group_start():
    _load()
    _check(_fns["ncclGroupStart"](), "ncclGroupStart")


def group_end():
    _check(_fns["ncclGroupEnd"](), "ncclGroupEnd")
