"""DLPack and the CUDA array interface: zero-copy exchange with NumPy, torch, CuPy, JAX, Numba.

    Tensor.__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)
    Tensor.__dlpack_device__()            (kDLCPU, 0) for cpu and interp; (kDLCUDA, i) for cuda:i
    Tensor.__cuda_array_interface__       version 3; cuda tensors only
    nbx.from_dlpack(x, *, device=None, copy=None)
                                          x: an object with __dlpack__, a DLPack capsule, or an
                                          object with __cuda_array_interface__

The array API standard (2023.12) rules: a consumer that passes `max_version >= (1, 0)` gets a
versioned capsule ("dltensor_versioned", DLManagedTensorVersioned, with the read-only and
is-copied flags), any other a legacy one ("dltensor", DLManagedTensor). A consumer renames the
capsule it consumed to "used_dltensor[_versioned]" and calls the manager's deleter when it is
done; a capsule never consumed calls the deleter itself when it dies.

Exported memory stays ours: the capsule's manager holds the tensor's storage, so the caching
allocator neither frees nor reuses it while a consumer holds it; the consumer's deleter lets it
go. Imported memory stays the producer's: our storage holds the producer's manager (or, for the
CUDA array interface, the producer object) and calls the deleter when the storage dies.

Stream semantics on cuda (array API): `stream` names the consumer's stream: None or 1 the legacy
default stream, 2 the per-thread default stream, another int a CUstream handle, -1 no
synchronisation (0 is refused as ambiguous). The producer makes that stream wait, on the device,
for the work queued on its current stream (an event recorded on ours, cuStreamWaitEvent on
theirs). The memory is not tied to the consumer's stream beyond that: work the consumer still
has queued when it calls the deleter must be finished by the consumer, as with every DLPack
producer.

Why the capsules are NumPy's: a PyCapsule destructor and a DLPack deleter written as ctypes
callbacks run Python code from C, and when that C code runs while an exception is pending (a
consumer that refuses a capsule drops it with its error set) the callback clobbers the pending
exception ("SystemError: error return without exception set"). NumPy's exporter implements both
in C, so each capsule is made by NumPy's `ndarray.__dlpack__` over an array whose base keeps our
storage alive, and its DLTensor is then patched in place where NumPy cannot describe the tensor
(the device, the data address of cuda memory, the bfloat16 and float8 type codes, the version
and flags). The import side reads capsules with the ctypes structs below and calls the producer's
deleter from a Python finaliser, where a pending exception is saved and restored.
"""
from __future__ import annotations

import ctypes
from ctypes import (POINTER, c_char_p, c_int, c_int32, c_int64, c_uint8, c_uint16, c_uint32,
                    c_uint64, c_void_p)

import numpy as np

from . import dtypes as _dt
from .device import Device, as_device
from .storage import HostStorage
from .tensor import Tensor, contiguous_strides
from . import creation as _creation
from .ops import _methods

__all__ = ["from_dlpack", "to_dlpack", "dlpack_device", "cuda_array_interface",
           "from_cuda_array_interface"]

# ----------------------------------------------------------------------------- the DLPack ABI
# dlpack.h 1.1

kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
_DEVICE_NAMES = {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan",
                 8: "kDLMetal", 9: "kDLVPI", 10: "kDLROCM", 11: "kDLROCMHost", 12: "kDLExtDev",
                 13: "kDLCUDAManaged", 14: "kDLOneAPI", 15: "kDLWebGPU", 16: "kDLHexagon",
                 17: "kDLMAIA", 18: "kDLTrn"}
# memory the host addresses directly: plain, pinned (cudaMallocHost) and managed memory
_HOST_TYPES = (kDLCPU, kDLCUDAHost, kDLCUDAManaged)

_CODE_NAMES = {0: "kDLInt", 1: "kDLUInt", 2: "kDLFloat", 3: "kDLOpaqueHandle", 4: "kDLBfloat",
               5: "kDLComplex", 6: "kDLBool", 7: "kDLFloat8_e3m4", 8: "kDLFloat8_e4m3",
               9: "kDLFloat8_e4m3b11fnuz", 10: "kDLFloat8_e4m3fn", 11: "kDLFloat8_e4m3fnuz",
               12: "kDLFloat8_e5m2", 13: "kDLFloat8_e5m2fnuz", 14: "kDLFloat8_e8m0fnu",
               15: "kDLFloat6_e2m3fn", 16: "kDLFloat6_e3m2fn", 17: "kDLFloat4_e2m1fn"}
_KIND_CODE = {"i": 0, "u": 1, "f": 2, "b": 6}
_NAME_CODE = {"bfloat16": 4, "float8_e4m3fn": 10, "float8_e5m2": 12}

FLAG_READ_ONLY = 1 << 0
FLAG_IS_COPIED = 1 << 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensor(ctypes.Structure):
    # deleter: void (*)(DLManagedTensor *), read as an address and called through _DELETER
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p), ("deleter", c_void_p),
                ("flags", c_uint64), ("dl_tensor", DLTensor)]


# A producer's deleter is called with the GIL held, as a C consumer calls it
_DELETER = ctypes.PYFUNCTYPE(None, c_void_p)


def _dl_dtype(dt: _dt.DType) -> tuple[int, int]:
    """(DLDataTypeCode, bits) of one of our dtypes."""
    return _NAME_CODE.get(dt.name, _KIND_CODE[dt.kind]), dt.itemsize * 8


_FROM_DL = {_dl_dtype(d): d for d in _dt.all_dtypes}


# ----------------------------------------------------------------------------- capsules

def _leak(b: bytes) -> bytes:
    # a capsule keeps a pointer to its name: the name's buffer must outlive every capsule,
    # also those that die at interpreter exit, so it is never freed
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(b))
    return b


_LEGACY, _VERSIONED = _leak(b"dltensor"), _leak(b"dltensor_versioned")
_USED = {_LEGACY: _leak(b"used_dltensor"), _VERSIONED: _leak(b"used_dltensor_versioned")}

_api = ctypes.pythonapi
_IsValid = _api.PyCapsule_IsValid
_IsValid.argtypes, _IsValid.restype = [ctypes.py_object, c_char_p], c_int
_GetPointer = _api.PyCapsule_GetPointer
_GetPointer.argtypes, _GetPointer.restype = [ctypes.py_object, c_char_p], c_void_p
_SetName = _api.PyCapsule_SetName
_SetName.argtypes, _SetName.restype = [ctypes.py_object, c_char_p], c_int
_GetName = _api.PyCapsule_GetName
_GetName.argtypes, _GetName.restype = [ctypes.py_object], c_char_p


def _is_capsule(x) -> bool:
    return type(x).__name__ == "PyCapsule"


# ----------------------------------------------------------------------------- export

def dlpack_device(t: Tensor) -> tuple[int, int]:
    """Tensor.__dlpack_device__: interp tensors are host memory, so they export as kDLCPU."""
    d = t.device
    return (kDLCUDA, d.index or 0) if d.type == "cuda" else (kDLCPU, 0)


def _check_stream(stream, t: Tensor):
    if stream is not None and (stream.__class__ is bool or not isinstance(stream, int)):
        raise TypeError(f"__dlpack__: stream must be None or an int, got {type(stream).__name__} "
                        f"{stream!r}")
    if t.device.type != "cuda":
        if stream not in (None, -1):
            raise ValueError(f"__dlpack__: stream must be None for a tensor on {t.device} (host "
                             f"memory has no stream), got {stream!r}")
        return
    if stream == 0 or (stream is not None and stream < -1):
        raise ValueError(f"__dlpack__: stream={stream!r} is not a CUDA stream of the array API: "
                         f"None or 1 (the legacy default stream), 2 (the per-thread default "
                         f"stream), a CUstream handle (> 2), or -1 (no synchronisation); 0 is "
                         f"disallowed as ambiguous")


def _current_handle(index: int) -> int:
    from . import cuda
    return cuda.current_stream(index).handle


def _order(index: int, waiter: int, producer: int) -> None:
    """Make stream `waiter` wait on the device for the work queued so far on stream `producer`
    (0 and 1 both name the legacy default stream)."""
    if (waiter or 1) == (producer or 1):
        return          # one stream: already in order
    from .backends.cuda import driver
    driver.set_device(index)
    e = driver.event_create(timing=False)
    try:
        driver.event_record(e, producer)
        driver.stream_wait_event(waiter, e)
    finally:
        driver.event_destroy(e)     # released once the recorded work completes


def _check_version(max_version) -> bool:
    """Whether the consumer reads versioned capsules (max_version >= (1, 0))."""
    if max_version is None:
        return False
    if (not isinstance(max_version, tuple) or len(max_version) != 2
            or not all(isinstance(v, int) and v.__class__ is not bool for v in max_version)):
        raise TypeError(f"__dlpack__: max_version must be None or a (major, minor) tuple of ints, "
                        f"got {max_version!r}")
    return max_version >= (1, 0)


def _check_dl_device(dl_device):
    if dl_device is None:
        return None
    try:
        kind, index = dl_device
        return int(kind), int(index)
    except (TypeError, ValueError):
        raise TypeError(f"__dlpack__: dl_device must be None or a (device_type, device_id) "
                        f"pair, got {dl_device!r}") from None


def to_dlpack(t: Tensor, *, stream=None, max_version=None, dl_device=None, copy=None):
    """Tensor.__dlpack__: a DLPack capsule over `t` (see the module docstring)."""
    _check_stream(stream, t)
    versioned = _check_version(max_version)
    if copy is not None and copy.__class__ is not bool:
        raise TypeError(f"__dlpack__: copy must be None, True or False, got {copy!r}")
    own = dlpack_device(t)
    target = _check_dl_device(dl_device) or own
    src, copied = t, False
    if target != own:
        if target != (kDLCPU, 0) or own[0] != kDLCUDA:
            raise BufferError(f"__dlpack__: cannot export a tensor on {t.device} "
                              f"({_DEVICE_NAMES[own[0]]}, {own[1]}) to dl_device {target}; "
                              f"expected {own} or, for a cuda tensor, ({kDLCPU}, 0)")
        if copy is False:
            raise BufferError(f"__dlpack__: dl_device={target} needs a copy of the tensor on "
                              f"{t.device} to the host, but copy=False")
        src, copied = t.cpu(), True     # synchronous: the host copy is complete when it returns
    else:
        if copy:
            src, copied = t.clone(), True
        if own[0] == kDLCUDA and stream != -1:
            index = own[1]
            _order(index, 1 if stream is None else stream, _current_handle(index))
    return _capsule(src, versioned, copied, max_version)


def _numpy_array(src: Tensor) -> np.ndarray:
    """A NumPy array with `src`'s shape and byte strides, of unsigned ints of its item size,
    whose base keeps `src`'s storage alive. Host tensors: over their memory. Cuda tensors: over
    one dummy element (NumPy never reads it; the capsule's data address is patched after)."""
    item = src.dtype.itemsize
    st = src._storage
    host = src.device.is_host
    if host and src.numel():
        holder = (c_uint8 * item).from_address(src.data_ptr())     # the first element
        writeable = st.host_array().flags.writeable
    else:
        holder = (c_uint8 * item)()
        writeable = not host or st.host_array().flags.writeable
    holder.nbx_storage = st     # not a NumPy array: NumPy's base chain ends here, holding it
    return np.lib.stride_tricks.as_strided(
        np.frombuffer(holder, f"u{item}"), shape=tuple(src.shape),
        strides=tuple(s * item for s in src._stride), writeable=writeable)


def _capsule(src: Tensor, versioned: bool, copied: bool, max_version):
    arr = _numpy_array(src)
    if not arr.flags.writeable and not versioned:
        raise BufferError("__dlpack__: the tensor is read-only and a legacy (unversioned) DLPack "
                          "capsule cannot say so; call __dlpack__(max_version=(1, 0)) or pass "
                          "copy=True")
    cap = None
    if versioned:
        try:
            cap = arr.__dlpack__(max_version=(1, 0))
        except TypeError:       # NumPy < 2.1 makes legacy capsules only: the consumer reads both
            if not arr.flags.writeable:
                raise BufferError("__dlpack__: the tensor is read-only, and this NumPy (< 2.1) "
                                  "cannot make the versioned capsule that would say so; pass "
                                  "copy=True") from None
    if cap is None:
        cap = arr.__dlpack__()
    versioned = bool(_IsValid(cap, _VERSIONED))
    ptr = _GetPointer(cap, _VERSIONED if versioned else _LEGACY)
    m = (DLManagedTensorVersioned if versioned else DLManagedTensor).from_address(ptr)
    dl = m.dl_tensor
    dl.dtype.code, dl.dtype.bits = _dl_dtype(src.dtype)
    dl.dtype.lanes = 1
    if src.device.type == "cuda":
        dl.device.device_type, dl.device.device_id = dlpack_device(src)
        dl.data = src.data_ptr() if src.numel() else None
        dl.byte_offset = 0
    if versioned:
        # 1.1 names the float8 codes; a 1.0 consumer refuses what it does not know
        m.version.major, m.version.minor = (1, 1) if max_version >= (1, 1) else (1, 0)
        m.flags = (0 if arr.flags.writeable else FLAG_READ_ONLY) | (FLAG_IS_COPIED if copied else 0)
    return cap


# ----------------------------------------------------------------------------- import

class _Manager:
    """A consumed DLPack manager: calls the producer's deleter once, when released or dead."""

    __slots__ = ("ptr", "versioned")

    def __init__(self, ptr: int, versioned: bool):
        self.ptr, self.versioned = ptr, versioned

    def struct(self):
        kind = DLManagedTensorVersioned if self.versioned else DLManagedTensor
        return kind.from_address(self.ptr)

    def release(self) -> None:
        if self.ptr:
            d = self.struct().deleter
            p, self.ptr = self.ptr, 0
            if d:
                _DELETER(d)(p)

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to tell
            pass


def _consume(cap) -> _Manager:
    """Take a capsule over: rename it "used_..." (its producer's destructor then leaves the
    manager alone) and hand back the manager, whose deleter now is ours to call."""
    for name in (_VERSIONED, _LEGACY):
        if _IsValid(cap, name):
            ptr = _GetPointer(cap, name)
            if _SetName(cap, _USED[name]):
                raise RuntimeError("from_dlpack: PyCapsule_SetName failed")
            return _Manager(ptr, name is _VERSIONED)
    name = _GetName(cap)
    if name in _USED.values():
        raise ValueError(f"from_dlpack: this DLPack capsule was already consumed (it is named "
                         f"{name.decode()!r}); a capsule can be imported once: call the "
                         f"producer's __dlpack__() again for a new one")
    raise ValueError(f"from_dlpack: expected a DLPack capsule named 'dltensor' or "
                     f"'dltensor_versioned', got one named {name!r}")


def _dtype_of(code: int, bits: int, lanes: int) -> _dt.DType:
    dt = _FROM_DL.get((code, bits)) if lanes == 1 else None
    if dt is None:
        what = f"{_CODE_NAMES.get(code, f'code {code}')} with {bits} bits" + \
            (f" and {lanes} lanes" if lanes != 1 else "")
        raise TypeError(f"from_dlpack: unsupported DLPack dtype {what}; nbxtensor has "
                        f"{', '.join(d.name for d in _dt.all_dtypes)} (no complex, no "
                        f"uint16/32/64, no vector lanes)")
    return dt


def _cuda_usable(what: str, where: str):
    """The driver, or ValueError where cuda cannot be used."""
    from .backends.cuda import driver
    ok, reason = driver.availability()
    if not ok:
        raise ValueError(f"{what}: the memory is on {where}, but cuda cannot be used here: "
                         f"{reason}")
    return driver


def _cuda_device(index: int, what: str) -> Device:
    n = _cuda_usable(what, f"cuda:{index}").device_count()
    if not 0 <= index < n:
        raise ValueError(f"{what}: the memory is on cuda:{index}, but this machine has {n} cuda "
                         f"device(s) (indices 0..{n - 1})")
    return Device("cuda", index)


def _wrap(addr: int, shape, stride, dtype: _dt.DType, device: Device, owner, readonly: bool,
          copy, what: str) -> tuple[Tensor, bool]:
    """(a tensor over foreign memory, whether it is a copy): element 0 at `addr`, strides in
    elements; `owner` lives as long as the storage does. Only cpu tensors can stay read-only
    (NumPy refuses writes); on cuda and interp, kernels write memory directly, so read-only
    memory there is copied when `copy` is True and refused otherwise."""
    item = dtype.itemsize
    if any(s < 0 for s in stride):
        raise ValueError(f"{what}: negative strides {tuple(stride)} are not supported (nbxtensor "
                         f"views have strides >= 0); pass a copy")
    if not all(shape):      # no element: nothing to hold, no address to trust
        if device.type == "cuda":
            from .backends.cuda.storage import ForeignCudaStorage
            storage = ForeignCudaStorage(device, 0, 0, None)
        else:
            storage = HostStorage(device, np.empty(0, np.uint8))
        return Tensor._make(storage, shape, contiguous_strides(shape), 0, dtype), False
    keep_readonly = readonly and device.type != "cpu"
    if keep_readonly and not copy:
        raise BufferError(f"{what}: the producer marks this memory read-only, and a tensor on "
                          f"{device} cannot stay read-only (its kernels write memory directly); "
                          f"pass copy=True"
                          + ("" if device.type == "cuda" else ", or device='cpu'"))
    nbytes = (1 + sum((n - 1) * s for n, s in zip(shape, stride))) * item
    if device.type == "cuda":
        if addr % item:
            raise ValueError(f"{what}: the data address {addr:#x} is not aligned to the "
                             f"{item}-byte {dtype.name} elements (cuda kernels need that)")
        from .backends.cuda.storage import ForeignCudaStorage
        storage = ForeignCudaStorage(device, nbytes, addr, owner)
    else:
        buf = (c_uint8 * nbytes).from_address(addr)
        buf.nbx_owner = owner       # the NumPy array's base: alive as long as the storage
        arr = np.frombuffer(buf, np.uint8)
        if readonly:
            arr.flags.writeable = False     # NumPy refuses every write through it
        storage = HostStorage(device, arr)
    t = Tensor._make(storage, shape, stride, 0, dtype)
    if keep_readonly:   # read once, into memory of our own; the producer's goes back at once
        return t.clone(), True
    return t, False


def _import_capsule(cap, device, copy) -> tuple[Tensor, bool]:
    mgr = _consume(cap)
    try:
        m = mgr.struct()
        readonly = False
        if mgr.versioned:
            if m.version.major != 1:
                raise BufferError(f"from_dlpack: the capsule is DLPack {m.version.major}."
                                  f"{m.version.minor}; nbxtensor reads DLPack 1.x")
            readonly = bool(m.flags & FLAG_READ_ONLY)
        dl = m.dl_tensor
        dtype = _dtype_of(dl.dtype.code, dl.dtype.bits, dl.dtype.lanes)
        kind, index = dl.device.device_type, dl.device.device_id
        if kind in _HOST_TYPES:
            dev = device if device is not None and device.is_host else Device("cpu")
        elif kind == kDLCUDA:
            dev = _cuda_device(index, "from_dlpack")
        else:
            raise ValueError(f"from_dlpack: the capsule's memory is on "
                             f"{_DEVICE_NAMES.get(kind, f'device type {kind}')} ({kind}, {index}); "
                             f"nbxtensor reads kDLCPU, kDLCUDAHost and kDLCUDAManaged (host) and "
                             f"kDLCUDA memory")
        if dl.ndim < 0:
            raise ValueError(f"from_dlpack: the capsule's ndim is {dl.ndim}")
        shape = tuple(dl.shape[i] for i in range(dl.ndim))
        if any(n < 0 for n in shape):
            raise ValueError(f"from_dlpack: the capsule's shape {shape} has a negative size")
        # strides may be NULL (legacy capsules): compact row-major
        stride = tuple(dl.strides[i] for i in range(dl.ndim)) if dl.strides else \
            contiguous_strides(shape)
        addr = (dl.data or 0) + dl.byte_offset
        return _wrap(addr, shape, stride, dtype, dev, mgr, readonly, copy, "from_dlpack")
    except BaseException:
        mgr.release()       # refused: the producer gets its memory back now
        raise


def _consumer_stream(index: int) -> int:
    """Our current stream of cuda:`index` as the array API spells it (1: the legacy stream)."""
    return _current_handle(index) or 1


def _ask(x):
    """The capsule of `x.__dlpack__()`, asked for a versioned one and for our current stream."""
    kw = {}
    dev = getattr(x, "__dlpack_device__", None)
    if dev is not None:
        kind, index = dev()
        if int(kind) == kDLCUDA:
            kw["stream"] = _consumer_stream(int(index))
    try:
        return x.__dlpack__(max_version=(1, 1), **kw)
    except TypeError:           # a producer older than the 2023.12 standard: legacy call
        return x.__dlpack__(**kw)


def from_dlpack(x, *, device=None, copy=None) -> Tensor:
    """A tensor sharing memory with `x` (zero-copy), as torch.from_dlpack / the array API.

    `x`: an object with `__dlpack__` (NumPy, torch, CuPy, JAX, nbxtensor), a DLPack capsule
    (versioned or legacy, consumed once), or an object with `__cuda_array_interface__` (CuPy,
    Numba), kept alive by the tensor. `device`: None for the memory's own device; cpu or
    interp for host memory (zero-copy either); another device copies unless copy=False
    (BufferError). `copy`: True always copies; False never does (BufferError where it would
    have to, also for read-only cuda memory); None shares where it can.
    """
    if copy is not None and copy.__class__ is not bool:
        raise TypeError(f"from_dlpack: copy must be None, True or False, got {copy!r}")
    want = as_device(device) if device is not None else None
    if _is_capsule(x):
        t, copied = _import_capsule(x, want, copy)
    elif hasattr(x, "__dlpack__"):
        t, copied = _import_capsule(_ask(x), want, copy)
    elif hasattr(x, "__cuda_array_interface__"):
        t, copied = _import_cai(x, copy)
    else:
        raise TypeError(f"from_dlpack: expected an object with __dlpack__ or "
                        f"__cuda_array_interface__, or a DLPack capsule, got {type(x).__name__}")
    if want is None or want == t.device:
        return t.clone() if copy and not copied else t
    if copy is False:
        raise BufferError(f"from_dlpack: the memory is on {t.device}, device={want} needs a copy, "
                          f"but copy=False")
    return t.to(want)


# ----------------------------------------------------------------------------- CUDA array interface

def cuda_array_interface(t: Tensor) -> dict:
    """Tensor.__cuda_array_interface__ (version 3), for cuda tensors only."""
    if t.device.type != "cuda":
        raise AttributeError(f"__cuda_array_interface__: the tensor is on {t.device}; only cuda "
                             f"tensors have one (use numpy() or DLPack for host tensors)")
    dt = t.dtype
    if dt.via_f32:
        raise TypeError(f"__cuda_array_interface__: dtype {dt.name} has no typestr (NumPy has no "
                        f"{dt.name} type); exchange it through DLPack (__dlpack__) instead")
    item = dt.itemsize
    return {
        "shape": tuple(t.shape),
        "typestr": dt.np.str,
        "data": (t.data_ptr() if t.numel() else 0, False),
        "strides": None if t.is_contiguous() else tuple(s * item for s in t._stride),
        "version": 3,
        # v3: the consumer orders its work after this stream (0 is not allowed: 1 is legacy)
        "stream": _consumer_stream(t.device.index or 0),
    }


def from_cuda_array_interface(obj, *, copy=None) -> Tensor:
    """A cuda tensor over the memory `obj.__cuda_array_interface__` describes (zero-copy);
    `obj` is kept alive by the tensor. copy=True copies; read-only memory needs it."""
    t, copied = _import_cai(obj, copy)
    return t.clone() if copy and not copied else t


def _import_cai(obj, copy) -> tuple[Tensor, bool]:
    what = "__cuda_array_interface__"
    cai = obj.__cuda_array_interface__
    if not isinstance(cai, dict):
        raise TypeError(f"{what}: expected a dict, got {type(cai).__name__}")
    try:
        shape, typestr, (ptr, readonly) = tuple(cai["shape"]), cai["typestr"], cai["data"]
    except (KeyError, TypeError, ValueError):
        raise TypeError(f"{what}: expected 'shape', 'typestr' and 'data': (ptr, readonly), got "
                        f"{cai!r}") from None
    if cai.get("mask") is not None:
        raise ValueError(f"{what}: masked arrays are not supported (mask={cai['mask']!r})")
    npdt = np.dtype(typestr)
    if npdt.byteorder == ">":
        raise ValueError(f"{what}: big-endian typestr {typestr!r} is not supported")
    dtype = _dt.as_dtype(npdt, f"{what} typestr {typestr!r}")
    item = dtype.itemsize
    strides = cai.get("strides")
    if strides is None:
        stride = contiguous_strides(shape)
    else:
        if any(s % item for s in strides):
            raise ValueError(f"{what}: byte strides {tuple(strides)} are not multiples of the "
                             f"item size {item}")
        stride = tuple(s // item for s in strides)
    driver = _cuda_usable(what, "a cuda device")
    index = driver.pointer_device(ptr) if ptr and all(shape) else driver.current_device()
    dev = _cuda_device(index, what)
    stream = cai.get("stream")
    if stream is not None:
        if stream.__class__ is bool or not isinstance(stream, int) or stream == 0:
            raise ValueError(f"{what}: stream must be None, 1, 2 or a CUstream handle, got "
                             f"{stream!r} (0 is disallowed by version 3)")
        _order(index, _current_handle(index), stream)
    return _wrap(ptr, shape, stride, dtype, dev, obj, bool(readonly), copy, what)


# ------------------------------------------------------------------ Tensor's side of the protocols
def _tensor_dlpack(self, *, stream=None, max_version=None, dl_device=None, copy=None):
    """A DLPack capsule over this tensor (array API 2023.12; see nbxtensor.dlpack)."""
    return to_dlpack(self, stream=stream, max_version=max_version, dl_device=dl_device,
                     copy=copy)


def _tensor_cuda_array_interface(self) -> dict:
    """Version 3, cuda tensors only (AttributeError elsewhere, as torch and CuPy)."""
    return cuda_array_interface(self)


_methods.install(__dlpack__=_tensor_dlpack, __dlpack_device__=dlpack_device,
                 __cuda_array_interface__=property(_tensor_cuda_array_interface))
_creation.IMPORTERS["__cuda_array_interface__"] = from_cuda_array_interface
