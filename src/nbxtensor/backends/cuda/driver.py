"""The CUDA driver: ctypes on libcuda, and the one place that knows the CUDA ABI.

No CUDA runtime library, no torch, no cupy. `libcuda.so.1` is opened on the first
call that needs it (never at `import nbxtensor`); where it is absent, `availability()`
says why and every other call raises `CudaUnavailable`.

Every failing call raises `CudaError` carrying the CUDA error's name
(CUDA_ERROR_OUT_OF_MEMORY), its text (cuGetErrorString) and the call that failed.
Each entry point's ctypes signature is declared once, when the library is loaded;
`fn(name)` hands the declared function to hot paths (the launcher) so they pay for
nothing but the foreign call.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from ctypes import (POINTER, byref, c_char, c_char_p, c_float, c_int, c_size_t, c_uint,
                    c_uint64, c_void_p)

from ..native import load_once

__all__ = [
    "CudaError", "CudaUnavailable", "availability", "driver_version", "device_count",
    "device_properties", "device_attribute", "set_device", "current_device", "mem_alloc",
    "mem_free", "mem_get_info", "mem_host_alloc", "mem_free_host", "memcpy_htod", "memcpy_dtoh",
    "memcpy_dtod", "memset_d8", "memset_d32", "stream_create", "stream_destroy",
    "stream_synchronize", "stream_query", "event_create", "event_destroy", "event_record",
    "event_synchronize", "event_query", "event_elapsed_ms", "ctx_synchronize", "module_load_data",
    "module_unload", "module_get_function", "func_get_attribute", "func_set_attribute", "fn_raw",
    "func_set_cache_config", "launch_kernel", "launch_kernel_ex", "fn", "error_name",
    "stream_wait_event", "pointer_device",
]

# ----------------------------------------------------------------------------- errors

# The names of the errors a user is most likely to meet, for when the driver itself cannot
# name a code (library absent, or the code came from elsewhere). With libcuda loaded the
# name and text always come from cuGetErrorName / cuGetErrorString.
_KNOWN = {
    1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED", 34: "CUDA_ERROR_STUB_LIBRARY", 100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE", 200: "CUDA_ERROR_INVALID_IMAGE",
    201: "CUDA_ERROR_INVALID_CONTEXT", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
    218: "CUDA_ERROR_INVALID_PTX", 400: "CUDA_ERROR_INVALID_HANDLE", 500: "CUDA_ERROR_NOT_FOUND",
    600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    710: "CUDA_ERROR_ASSERT", 715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS", 719: "CUDA_ERROR_LAUNCH_FAILED",
    999: "CUDA_ERROR_UNKNOWN",
}
_NOT_READY = 600


class CudaError(RuntimeError):
    """A CUDA driver call failed. `.code`, `.name`, `.text` and `.call` say which and why."""

    def __init__(self, code: int, call: str, name: str | None = None, text: str | None = None):
        self.code = int(code)
        self.call = call
        self.name = name or _KNOWN.get(self.code, f"CUDA_ERROR_{self.code}")
        self.text = text or "(no description)"
        super().__init__(f"{self.call} failed: {self.name} ({self.code}): {self.text}")

    def __reduce__(self):
        return (type(self), (self.code, self.call, self.name, self.text))


class CudaUnavailable(RuntimeError):
    """libcuda cannot be used on this machine (absent, stub, no device)."""


def error_name(code: int) -> tuple[str, str]:
    """(name, text) of a CUresult, from the driver when it is loaded."""
    lib = _lib
    if lib is not None:
        s = c_char_p()
        name = _KNOWN.get(code, f"CUDA_ERROR_{code}")
        text = "(no description)"
        if lib.cuGetErrorName(code, byref(s)) == 0 and s.value:
            name = s.value.decode()
        s = c_char_p()
        if lib.cuGetErrorString(code, byref(s)) == 0 and s.value:
            text = s.value.decode()
        return name, text
    return _KNOWN.get(code, f"CUDA_ERROR_{code}"), "(no description)"


def _error(code: int, call: str) -> CudaError:
    name, text = error_name(code)
    return CudaError(code, call, name, text)


# ----------------------------------------------------------------------------- library

_P = c_void_p
_PP = POINTER(c_void_p)
_PI = POINTER(c_int)
_PS = POINTER(c_size_t)
_PU64 = POINTER(c_uint64)

# name -> (candidate symbols, newest first; argtypes). restype is CUresult (int) for all.
_SIGNATURES = {
    "cuInit": (("cuInit",), [c_uint]),
    "cuDriverGetVersion": (("cuDriverGetVersion",), [_PI]),
    "cuGetErrorName": (("cuGetErrorName",), [c_int, POINTER(c_char_p)]),
    "cuGetErrorString": (("cuGetErrorString",), [c_int, POINTER(c_char_p)]),
    "cuDeviceGetCount": (("cuDeviceGetCount",), [_PI]),
    "cuDeviceGet": (("cuDeviceGet",), [_PI, c_int]),
    "cuDeviceGetName": (("cuDeviceGetName",), [c_char_p, c_int, c_int]),
    "cuDeviceGetAttribute": (("cuDeviceGetAttribute",), [_PI, c_int, c_int]),
    "cuDeviceTotalMem": (("cuDeviceTotalMem_v2",), [_PS, c_int]),
    "cuDeviceGetPCIBusId": (("cuDeviceGetPCIBusId",), [c_char_p, c_int, c_int]),
    "cuDevicePrimaryCtxRetain": (("cuDevicePrimaryCtxRetain",), [_PP, c_int]),
    "cuCtxSetCurrent": (("cuCtxSetCurrent",), [_P]),
    "cuCtxGetCurrent": (("cuCtxGetCurrent",), [_PP]),
    "cuCtxGetDevice": (("cuCtxGetDevice",), [_PI]),
    "cuCtxSynchronize": (("cuCtxSynchronize",), []),
    "cuMemAlloc": (("cuMemAlloc_v2",), [_PU64, c_size_t]),
    "cuMemFree": (("cuMemFree_v2",), [c_uint64]),
    "cuMemGetInfo": (("cuMemGetInfo_v2",), [_PS, _PS]),
    "cuMemHostAlloc": (("cuMemHostAlloc",), [_PP, c_size_t, c_uint]),
    "cuMemFreeHost": (("cuMemFreeHost",), [_P]),
    "cuMemcpyHtoD": (("cuMemcpyHtoD_v2",), [c_uint64, _P, c_size_t]),
    "cuMemcpyDtoH": (("cuMemcpyDtoH_v2",), [_P, c_uint64, c_size_t]),
    "cuMemcpyDtoD": (("cuMemcpyDtoD_v2",), [c_uint64, c_uint64, c_size_t]),
    "cuMemcpyHtoDAsync": (("cuMemcpyHtoDAsync_v2",), [c_uint64, _P, c_size_t, _P]),
    "cuMemcpyDtoHAsync": (("cuMemcpyDtoHAsync_v2",), [_P, c_uint64, c_size_t, _P]),
    "cuMemcpyDtoDAsync": (("cuMemcpyDtoDAsync_v2",), [c_uint64, c_uint64, c_size_t, _P]),
    "cuMemsetD8": (("cuMemsetD8_v2",), [c_uint64, ctypes.c_ubyte, c_size_t]),
    "cuMemsetD32": (("cuMemsetD32_v2",), [c_uint64, c_uint, c_size_t]),
    "cuMemsetD8Async": (("cuMemsetD8Async",), [c_uint64, ctypes.c_ubyte, c_size_t, _P]),
    "cuMemsetD32Async": (("cuMemsetD32Async",), [c_uint64, c_uint, c_size_t, _P]),
    "cuStreamCreate": (("cuStreamCreate",), [_PP, c_uint]),
    "cuStreamDestroy": (("cuStreamDestroy_v2",), [_P]),
    "cuStreamSynchronize": (("cuStreamSynchronize",), [_P]),
    "cuStreamQuery": (("cuStreamQuery",), [_P]),
    "cuEventCreate": (("cuEventCreate",), [_PP, c_uint]),
    "cuEventDestroy": (("cuEventDestroy_v2",), [_P]),
    "cuEventRecord": (("cuEventRecord",), [_P, _P]),
    "cuEventSynchronize": (("cuEventSynchronize",), [_P]),
    "cuEventQuery": (("cuEventQuery",), [_P]),
    "cuEventElapsedTime": (("cuEventElapsedTime_v2", "cuEventElapsedTime"), [POINTER(c_float), _P, _P]),
    "cuStreamWaitEvent": (("cuStreamWaitEvent",), [_P, _P, c_uint]),
    "cuPointerGetAttribute": (("cuPointerGetAttribute",), [_P, c_int, c_uint64]),
    "cuModuleLoadData": (("cuModuleLoadData",), [_PP, c_char_p]),
    "cuModuleUnload": (("cuModuleUnload",), [_P]),
    "cuModuleGetFunction": (("cuModuleGetFunction",), [_PP, _P, c_char_p]),
    "cuFuncGetAttribute": (("cuFuncGetAttribute",), [_PI, c_int, _P]),
    "cuFuncSetAttribute": (("cuFuncSetAttribute",), [_P, c_int, c_int]),
    "cuFuncSetCacheConfig": (("cuFuncSetCacheConfig",), [_P, c_int]),
    # f, grid xyz, block xyz, shared bytes, stream, kernelParams (void**), extra (void**)
    "cuLaunchKernel": (("cuLaunchKernel",), [_P, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                                             c_uint, _P, _P, _P]),
    "cuLaunchKernelEx": (("cuLaunchKernelEx",), [_P, _P, _P, _P]),
}

_lib = None            # the CDLL once loaded and initialised
_fns: dict = {}        # our name -> declared ctypes function
_load_error: str | None = None
_lock = threading.Lock()


def _load():
    """Open libcuda, declare every signature once, cuInit(0). Idempotent; raises CudaUnavailable."""
    if _lib is not None:
        return _lib
    return load_once(sys.modules[__name__], _open_libcuda, CudaUnavailable)


def _open_libcuda():
    global _lib
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise CudaUnavailable(f"libcuda.so.1 not found: {e}") from None
    fns = {}
    for name, (symbols, argtypes) in _SIGNATURES.items():
        for sym in symbols:
            f = getattr(lib, sym, None)
            if f is not None:
                f.argtypes = argtypes
                f.restype = c_int
                fns[name] = f
                break
    missing = [n for n in ("cuInit", "cuGetErrorName", "cuGetErrorString") if n not in fns]
    if missing:
        raise CudaUnavailable(f"libcuda.so.1 lacks {', '.join(missing)} (driver too old?)")
    lib.cuGetErrorName = fns["cuGetErrorName"]
    lib.cuGetErrorString = fns["cuGetErrorString"]
    _fns.update(fns)
    _lib = lib  # error_name works from here on
    rc = fns["cuInit"](0)
    if rc != 0:
        name, text = error_name(rc)
        _lib = None
        _fns.clear()
        raise CudaUnavailable(f"cuInit(0) failed: {name} ({rc}): {text}")
    return lib


def fn(name: str):
    """The declared ctypes function for driver entry `name` (e.g. 'cuLaunchKernel')."""
    f = _fns.get(name)
    if f is None:
        _load()
        f = _fns.get(name)
        if f is None:
            raise CudaUnavailable(f"libcuda.so.1 has no {' or '.join(_SIGNATURES[name][0])}")
    return f


_raw: dict = {}


def fn_raw(name: str):
    """A second, argtypes-free binding of entry `name` (restype int) for the launch hot path.

    ctypes converts arguments through `argtypes` at about three times the cost of passing
    ctypes objects as they are. The caller must pass ctypes objects (c_void_p, arrays) or
    Python ints that fit a C int; nothing is converted or checked for it.
    """
    f = _raw.get(name)
    if f is None:
        lib = _load()
        for sym in _SIGNATURES[name][0]:
            try:
                f = lib[sym]        # a new function object, independent of the declared one
            except AttributeError:
                continue
            f.restype = c_int
            _raw[name] = f
            break
        else:
            raise CudaUnavailable(f"libcuda.so.1 has no {' or '.join(_SIGNATURES[name][0])}")
    return f


def _call(name: str, *args, desc=None):
    """Call entry `name`; on failure raise CudaError naming it with `desc` (its arguments)."""
    rc = fn(name)(*args)
    if rc:
        raise _error(rc, f"{_SIGNATURES[name][0][0]}({desc or ''})")


def _out_handle(name: str, *args, desc=None) -> int:
    # the many calls that return one handle through a leading CUxxx* out-argument
    h = c_void_p()
    _call(name, byref(h), *args, desc=desc)
    return h.value


def availability() -> tuple[bool, str]:
    """(True, description) when a CUDA device is usable, else (False, reason). Never raises."""
    try:
        _load()
        n = device_count()
    except CudaUnavailable as e:
        return False, str(e)
    except CudaError as e:
        return False, str(e)
    except Exception as e:  # noqa: BLE001 - availability must never raise
        return False, f"{type(e).__name__}: {e}"
    if n == 0:
        return False, "libcuda loaded, but no CUDA device is visible"
    return True, f"{n} CUDA device(s), driver {driver_version()}"


# ----------------------------------------------------------------------------- devices

_ATTR = {  # CUdevice_attribute values used by device_properties
    "max_threads_per_block": 1, "max_block_dim_x": 2, "max_grid_dim_x": 5, "max_grid_dim_y": 6,
    "max_grid_dim_z": 7, "max_shared_memory_per_block": 8, "warp_size": 10,
    "max_registers_per_block": 12, "clock_rate_khz": 13, "multiprocessors": 16,
    "pci_bus": 33, "pci_device": 34, "memory_clock_rate_khz": 36, "memory_bus_width": 37,
    "l2_cache_size": 38, "max_threads_per_multiprocessor": 39, "pci_domain": 50, "major": 75, "minor": 76,
    "max_shared_memory_per_multiprocessor": 81, "max_registers_per_multiprocessor": 82,
    "max_shared_memory_per_block_optin": 97,
    "cluster_launch": 120,
}


def driver_version() -> int:
    v = c_int()
    _call("cuDriverGetVersion", byref(v))
    return v.value


def device_count() -> int:
    n = c_int()
    _call("cuDeviceGetCount", byref(n))
    return n.value


def _check_index(index: int) -> int:
    n = device_count()
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
        raise ValueError(f"device index: expected an int in [0, {n}), got {index!r}")
    return index


def device_attribute(index: int, attr: str | int) -> int:
    code = _ATTR[attr] if isinstance(attr, str) else attr
    v = c_int()
    _call("cuDeviceGetAttribute", byref(v), code, index, desc=f"attrib={attr}, dev={index}")
    return v.value


_props_cache: dict = {}


def device_properties(index: int) -> dict:
    """Name, compute capability, SM count, memory, shared-memory limits, ... of device `index`."""
    p = _props_cache.get(index)
    if p is not None:
        return dict(p)
    _check_index(index)
    buf = ctypes.create_string_buffer(256)
    _call("cuDeviceGetName", buf, 256, index, desc=f"dev={index}")
    total = c_size_t()
    _call("cuDeviceTotalMem", byref(total), index, desc=f"dev={index}")
    bus = ctypes.create_string_buffer(64)
    _call("cuDeviceGetPCIBusId", bus, 64, index, desc=f"dev={index}")
    p = {"index": index, "name": buf.value.decode(), "total_memory": total.value,
         "pci_bus_id": bus.value.decode()}
    for k in _ATTR:
        p[k] = device_attribute(index, k)
    _props_cache[index] = p
    return dict(p)


# Contexts are current per thread: remember which device this thread made current.
_tls = threading.local()
_primary: dict = {}    # device index -> retained primary context handle


def set_device(index: int) -> None:
    """Retain the primary context of device `index` and make it current in this thread."""
    if getattr(_tls, "device", None) == index:
        return
    ctx = _primary.get(index)
    if ctx is None:
        _check_index(index)
        h = c_void_p()
        _call("cuDevicePrimaryCtxRetain", byref(h), index, desc=f"dev={index}")
        ctx = _primary[index] = h.value
    _call("cuCtxSetCurrent", c_void_p(ctx), desc=f"primary context of device {index}")
    _tls.device = index


def current_device() -> int:
    """The device of this thread's current context (device 0's primary context if none)."""
    d = getattr(_tls, "device", None)
    if d is not None:
        return d
    h = c_void_p()
    _call("cuCtxGetCurrent", byref(h))
    if not h.value:
        set_device(0)
        return 0
    v = c_int()
    _call("cuCtxGetDevice", byref(v))
    _tls.device = v.value
    return v.value


def ensure_context() -> None:
    """Make sure this thread has a current context (device 0's primary one by default)."""
    if getattr(_tls, "device", None) is None:
        current_device()


def ctx_synchronize() -> None:
    ensure_context()
    _call("cuCtxSynchronize")


# ----------------------------------------------------------------------------- memory

def mem_alloc(nbytes: int) -> int:
    ensure_context()
    p = c_uint64()
    _call("cuMemAlloc", byref(p), nbytes, desc=f"nbytes={nbytes}")
    return p.value


def mem_free(ptr: int) -> None:
    _call("cuMemFree", ptr, desc=f"ptr={ptr:#x}")


def mem_get_info() -> tuple[int, int]:
    ensure_context()
    free, total = c_size_t(), c_size_t()
    _call("cuMemGetInfo", byref(free), byref(total))
    return free.value, total.value


def mem_host_alloc(nbytes: int, portable: bool = True) -> int:
    """Pinned (page-locked) host memory."""
    ensure_context()
    return _out_handle("cuMemHostAlloc", nbytes, 1 if portable else 0, desc=f"nbytes={nbytes}")


def mem_free_host(ptr: int) -> None:
    _call("cuMemFreeHost", c_void_p(ptr), desc=f"ptr={ptr:#x}")


def _sync_or_async(name: str, stream, *args, desc: str) -> None:
    # every copy/set call has a stream-ordered twin `<name>Async` that takes the stream last
    if stream is None:
        _call(name, *args, desc=desc)
    else:
        _call(name + "Async", *args, c_void_p(stream), desc=f"{desc}, stream={stream:#x}")


def memcpy_htod(dst: int, src_host_ptr: int, nbytes: int, stream=None) -> None:
    _sync_or_async("cuMemcpyHtoD", stream, dst, c_void_p(src_host_ptr), nbytes,
                   desc=f"dst={dst:#x}, src={src_host_ptr:#x}, nbytes={nbytes}")


def memcpy_dtoh(dst_host_ptr: int, src: int, nbytes: int, stream=None) -> None:
    _sync_or_async("cuMemcpyDtoH", stream, c_void_p(dst_host_ptr), src, nbytes,
                   desc=f"dst={dst_host_ptr:#x}, src={src:#x}, nbytes={nbytes}")


def memcpy_dtod(dst: int, src: int, nbytes: int, stream=None) -> None:
    _sync_or_async("cuMemcpyDtoD", stream, dst, src, nbytes,
                   desc=f"dst={dst:#x}, src={src:#x}, nbytes={nbytes}")


def memset_d8(ptr: int, value: int, nbytes: int, stream=None) -> None:
    _sync_or_async("cuMemsetD8", stream, ptr, value, nbytes,
                   desc=f"ptr={ptr:#x}, value={value}, n={nbytes}")


def memset_d32(ptr: int, value: int, count: int, stream=None) -> None:
    _sync_or_async("cuMemsetD32", stream, ptr, value, count,
                   desc=f"ptr={ptr:#x}, value={value}, n={count}")


# ----------------------------------------------------------------------------- streams, events

def stream_create(nonblocking: bool = True) -> int:
    ensure_context()
    return _out_handle("cuStreamCreate", 1 if nonblocking else 0, desc=f"nonblocking={nonblocking}")


def stream_destroy(s: int) -> None:
    _call("cuStreamDestroy", c_void_p(s), desc=f"stream={s:#x}")


def stream_synchronize(s: int) -> None:
    ensure_context()
    _call("cuStreamSynchronize", c_void_p(s), desc=f"stream={s or 0:#x}")


def stream_query(s: int) -> bool:
    """True when all work on `s` has completed."""
    ensure_context()
    return _query("cuStreamQuery", s, f"stream={s or 0:#x}")


def _query(name: str, handle: int, desc: str) -> bool:
    # cuStreamQuery / cuEventQuery: CUDA_ERROR_NOT_READY is an answer (False), not an error
    rc = fn(name)(c_void_p(handle))
    if rc == _NOT_READY:
        return False
    if rc:
        raise _error(rc, f"{name}({desc})")
    return True


def event_create(timing: bool = True) -> int:
    ensure_context()
    return _out_handle("cuEventCreate", 0 if timing else 2, desc=f"timing={timing}")


def event_destroy(e: int) -> None:
    _call("cuEventDestroy", c_void_p(e), desc=f"event={e:#x}")


def event_record(e: int, stream: int = 0) -> None:
    _call("cuEventRecord", c_void_p(e), c_void_p(stream), desc=f"event={e:#x}, stream={stream or 0:#x}")


def event_synchronize(e: int) -> None:
    _call("cuEventSynchronize", c_void_p(e), desc=f"event={e:#x}")


def event_query(e: int) -> bool:
    return _query("cuEventQuery", e, f"event={e:#x}")


def event_elapsed_ms(start: int, end: int) -> float:
    ms = c_float()
    _call("cuEventElapsedTime", byref(ms), c_void_p(start), c_void_p(end),
          desc=f"start={start:#x}, end={end:#x}")
    return ms.value


def stream_wait_event(s: int, e: int) -> None:
    """Make stream `s` wait (on the device, the host does not block) for event `e`'s work."""
    _call("cuStreamWaitEvent", c_void_p(s), c_void_p(e), 0, desc=f"stream={s or 0:#x}, event={e:#x}")


_POINTER_DEVICE_ORDINAL = 9   # CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL


def pointer_device(ptr: int) -> int:
    """The index of the device whose memory `ptr` (a device or managed address) lies in."""
    ensure_context()
    v = c_int()
    _call("cuPointerGetAttribute", byref(v), _POINTER_DEVICE_ORDINAL, ptr,
          desc=f"CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr={ptr:#x}")
    return v.value


# ----------------------------------------------------------------------------- modules, launch

_FUNC_ATTR = {
    "MAX_THREADS_PER_BLOCK": 0, "SHARED_SIZE_BYTES": 1, "CONST_SIZE_BYTES": 2,
    "LOCAL_SIZE_BYTES": 3, "NUM_REGS": 4, "PTX_VERSION": 5, "BINARY_VERSION": 6,
    "CACHE_MODE_CA": 7, "MAX_DYNAMIC_SHARED_SIZE_BYTES": 8,
    "PREFERRED_SHARED_MEMORY_CARVEOUT": 9, "NON_PORTABLE_CLUSTER_SIZE_ALLOWED": 14,
}
FUNC_CACHE_PREFER_SHARED = 1


def _func_attr(name) -> int:
    if isinstance(name, int):
        return name
    key = name.upper().removeprefix("CU_FUNC_ATTRIBUTE_")
    if key not in _FUNC_ATTR:
        raise ValueError(f"function attribute: unknown {name!r}; expected one of {sorted(_FUNC_ATTR)}")
    return _FUNC_ATTR[key]


def module_load_data(image: bytes) -> int:
    """Load a cubin (or PTX, NUL-terminated) into the current context; returns the CUmodule."""
    ensure_context()
    if not isinstance(image, (bytes, bytearray)):
        raise TypeError(f"module_load_data: expected bytes, got {type(image).__name__}")
    return _out_handle("cuModuleLoadData", bytes(image), desc=f"image of {len(image)} bytes")


def module_unload(m: int) -> None:
    _call("cuModuleUnload", c_void_p(m), desc=f"module={m:#x}")


def module_get_function(m: int, name: str) -> int:
    return _out_handle("cuModuleGetFunction", c_void_p(m), name.encode(), desc=f"name={name!r}")


def func_get_attribute(f: int, attr_name) -> int:
    v = c_int()
    _call("cuFuncGetAttribute", byref(v), _func_attr(attr_name), c_void_p(f), desc=f"attrib={attr_name}")
    return v.value


def func_set_attribute(f: int, attr_name, value: int) -> None:
    _call("cuFuncSetAttribute", c_void_p(f), _func_attr(attr_name), int(value),
          desc=f"attrib={attr_name}, value={value}")


def func_set_cache_config(f: int, config: int) -> None:
    _call("cuFuncSetCacheConfig", c_void_p(f), config, desc=f"config={config}")


def _launch_desc(grid, block, shared_bytes, stream) -> str:
    return (f"grid={tuple(grid)}, block={tuple(block)}, shared_bytes={shared_bytes}, "
            f"stream={stream or 0:#x}")


def launch_kernel(f: int, grid, block, shared_bytes: int, stream: int, params) -> None:
    """cuLaunchKernel; `params` is a ctypes array of void* (one pointer per kernel parameter)."""
    rc = fn("cuLaunchKernel")(f, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                              shared_bytes, stream, params, None)
    if rc:
        raise _error(rc, "cuLaunchKernel(" + _launch_desc(grid, block, shared_bytes, stream) + ")")


class LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: an int id padded to 8 bytes, then a 64-byte value union
    _fields_ = [("id", c_int), ("pad", c_char * 4), ("value", ctypes.c_uint32 * 16)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", c_uint), ("gridDimY", c_uint), ("gridDimZ", c_uint),
                ("blockDimX", c_uint), ("blockDimY", c_uint), ("blockDimZ", c_uint),
                ("sharedMemBytes", c_uint), ("hStream", c_void_p),
                ("attrs", POINTER(LaunchAttribute)), ("numAttrs", c_uint)]


LAUNCH_ATTRIBUTE_COOPERATIVE = 2
LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5
LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
CLUSTER_SCHEDULING_POLICY_SPREAD = 1

# The head of a CUlaunchConfig as a struct format (gridDim xyz, blockDim xyz, sharedMemBytes,
# padding, hStream): the launcher packs it after the kernel parameters in one pack_into.
LAUNCH_CONFIG_HEAD = "IIIIIII4xQ"
LAUNCH_CONFIG_WORDS = ctypes.sizeof(LaunchConfig) // 8
assert ctypes.sizeof(LaunchConfig) == 56 and LaunchConfig.hStream.offset == 32


def launch_config(buf, offset: int, block: int, shared: int, f: int, *, pdl: bool,
                  cooperative: bool, num_ctas: int) -> LaunchConfig:
    """A CUlaunchConfig living in `buf` at byte `offset` (the grid and stream are packed in
    per launch), with block, shared memory and the launch attributes of function `f` set."""
    attrs = []
    if pdl:
        attrs.append((LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, (1,)))
    if cooperative:
        attrs.append((LAUNCH_ATTRIBUTE_COOPERATIVE, (1,)))
    if num_ctas != 1:
        attrs.append((LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, (num_ctas, 1, 1)))
        attrs.append((LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
                      (CLUSTER_SCHEDULING_POLICY_SPREAD,)))
    if num_ctas == 16:
        func_set_attribute(f, "NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1)
    arr = (LaunchAttribute * 4)()
    for k, (aid, vals) in enumerate(attrs):
        arr[k].id = aid
        for j, v in enumerate(vals):
            arr[k].value[j] = v
    cfg = LaunchConfig.from_buffer(buf, offset)   # keeps buf alive
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block, 1, 1
    cfg.sharedMemBytes = shared
    if attrs:
        cfg.attrs = arr         # ctypes keeps `arr` alive through the pointer field
    cfg.numAttrs = len(attrs)
    return cfg


def launch_kernel_ex(f: int, config: LaunchConfig, params) -> None:
    """cuLaunchKernelEx with a prepared LaunchConfig (clusters, cooperative, PDL)."""
    rc = fn("cuLaunchKernelEx")(byref(config), f, params, None)
    if rc:
        c = config
        raise _error(rc, "cuLaunchKernelEx(" + _launch_desc(
            (c.gridDimX, c.gridDimY, c.gridDimZ), (c.blockDimX, c.blockDimY, c.blockDimZ),
            c.sharedMemBytes, c.hStream) + f", attrs={[c.attrs[i].id for i in range(c.numAttrs)]})")


def check_launch_error(rc: int, call: str) -> None:
    """Raise the CudaError for a nonzero CUresult `rc` returned by `call`."""
    if rc:
        raise _error(rc, call)


# =============================================================================================
# CUDA graphs (graphs engineer's section; appended, nothing above is changed)
# =============================================================================================
# Stream capture, graph instantiation and launch, and the capture guard: while any capture
# is in progress in this process (nbxtensor's current stream is process-wide, so a capture
# is too), the synchronising entry points above raise CaptureError before calling the
# driver. Calling them would fail anyway (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and, worse,
# invalidate the capture; a host read would record nothing useful.
# The guards below rebind the module-level functions, so every caller that goes through
# `driver.<name>(...)` (storage.py, memory.DriverRaw, nbx.cuda) is covered.

_SIGNATURES.update({
    "cuStreamBeginCapture": (("cuStreamBeginCapture_v2", "cuStreamBeginCapture"), [_P, c_int]),
    "cuStreamEndCapture": (("cuStreamEndCapture",), [_P, _PP]),
    "cuStreamIsCapturing": (("cuStreamIsCapturing",), [_P, _PI]),
    # _v2: (stream, status*, id*, graph*, const CUgraphNode** deps, size_t* numDeps)
    "cuStreamGetCaptureInfo": (("cuStreamGetCaptureInfo_v2",), [_P, _PI, _PU64, _PP, _PP, _PS]),
    "cuThreadExchangeStreamCaptureMode": (("cuThreadExchangeStreamCaptureMode",), [_PI]),
    "cuGraphInstantiateWithFlags": (("cuGraphInstantiateWithFlags",), [_PP, _P, ctypes.c_ulonglong]),
    "cuGraphUpload": (("cuGraphUpload",), [_P, _P]),
    "cuGraphLaunch": (("cuGraphLaunch",), [_P, _P]),
    "cuGraphExecDestroy": (("cuGraphExecDestroy",), [_P]),
    "cuGraphDestroy": (("cuGraphDestroy",), [_P]),
    "cuGraphGetNodes": (("cuGraphGetNodes",), [_P, _PP, _PS]),
    "cuGraphNodeGetType": (("cuGraphNodeGetType",), [_P, _PI]),
})
_KNOWN.update({
    900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    902: "CUDA_ERROR_STREAM_CAPTURE_MERGE", 903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
    904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
    906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", 907: "CUDA_ERROR_CAPTURED_EVENT",
    908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
})
__all__ += ["CaptureError", "capture_active", "stream_begin_capture", "stream_end_capture",
            "stream_is_capturing", "stream_capture_info", "graph_instantiate", "graph_upload",
            "graph_launch", "graph_exec_destroy", "graph_destroy", "graph_node_types",
            "exchange_capture_mode"]

# CUstreamCaptureMode / CUstreamCaptureStatus / CUgraphNodeType
CAPTURE_MODE_GLOBAL, CAPTURE_MODE_THREAD_LOCAL, CAPTURE_MODE_RELAXED = 0, 1, 2
CAPTURE_STATUS_NONE, CAPTURE_STATUS_ACTIVE, CAPTURE_STATUS_INVALIDATED = 0, 1, 2
GRAPH_NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty",
                    6: "wait_event", 7: "event_record", 8: "ext_semas_signal",
                    9: "ext_semas_wait", 10: "mem_alloc", 11: "mem_free", 12: "batch_mem_op",
                    13: "conditional"}


class CaptureError(RuntimeError):
    """Something that cannot be recorded into a CUDA graph was asked for during a capture."""


# Captures in progress: stream handle -> a short description (which graph, which device).
# Written only by stream_begin_capture / stream_end_capture below.
_capturing: dict = {}


def capture_active() -> bool:
    """True while a stream capture begun through this module is in progress (any thread)."""
    return bool(_capturing)


def capture_refuse(what: str) -> None:
    """Raise CaptureError for `what` when a capture is in progress (cheap when none is)."""
    if _capturing:
        raise CaptureError(
            f"{what} cannot run while a CUDA graph is being captured "
            f"({', '.join(_capturing.values())}): it would synchronise with or read from the "
            f"device, which a graph cannot record (and the driver would invalidate the capture). "
            f"Do it before the capture or after replay().")


def stream_begin_capture(s: int, mode: int = CAPTURE_MODE_GLOBAL, desc: str = "a capture") -> None:
    if not s:
        raise CaptureError("stream_begin_capture: the legacy default stream (handle 0) cannot be "
                           "captured; capture on a stream made with nbx.cuda.Stream()")
    if mode not in (CAPTURE_MODE_GLOBAL, CAPTURE_MODE_THREAD_LOCAL, CAPTURE_MODE_RELAXED):
        raise ValueError(f"stream_begin_capture: mode must be 0 (global), 1 (thread local) or "
                         f"2 (relaxed), got {mode!r}")
    if s in _capturing:
        raise CaptureError(f"stream_begin_capture: stream {s:#x} is already capturing "
                           f"({_capturing[s]})")
    ensure_context()
    _call("cuStreamBeginCapture", c_void_p(s), mode, desc=f"stream={s:#x}, mode={mode}")
    _capturing[s] = desc


def stream_end_capture(s: int) -> int:
    """End the capture on `s`; returns the CUgraph. The bookkeeping is cleared even when the
    driver reports an invalidated capture (then the CudaError is raised)."""
    g = c_void_p()
    try:
        _call("cuStreamEndCapture", c_void_p(s), byref(g), desc=f"stream={s:#x}")
    finally:
        _capturing.pop(s, None)
    return g.value


def stream_is_capturing(s: int) -> int:
    """CAPTURE_STATUS_NONE / _ACTIVE / _INVALIDATED of stream `s`."""
    st = c_int()
    _call("cuStreamIsCapturing", c_void_p(s), byref(st), desc=f"stream={s or 0:#x}")
    return st.value


def stream_capture_info(s: int) -> tuple[int, int]:
    """(status, capture id) of stream `s` (the id is 0 when it is not capturing)."""
    st, cid = c_int(), c_uint64()
    _call("cuStreamGetCaptureInfo", c_void_p(s), byref(st), byref(cid), None, None, None,
          desc=f"stream={s or 0:#x}")
    return st.value, cid.value


def exchange_capture_mode(mode: int) -> int:
    """Set this thread's capture-interaction mode; returns the previous one."""
    m = c_int(mode)
    _call("cuThreadExchangeStreamCaptureMode", byref(m), desc=f"mode={mode}")
    return m.value


def graph_instantiate(graph: int, flags: int = 0) -> int:
    """A CUgraphExec from a CUgraph (cuGraphInstantiateWithFlags)."""
    return _out_handle("cuGraphInstantiateWithFlags", c_void_p(graph), flags,
                       desc=f"graph={graph:#x}, flags={flags}")


def graph_upload(graph_exec: int, stream: int = 0) -> None:
    _call("cuGraphUpload", c_void_p(graph_exec), c_void_p(stream),
          desc=f"exec={graph_exec:#x}, stream={stream or 0:#x}")


def graph_launch(graph_exec: int, stream: int = 0) -> None:
    # the replay hot path: no argument text unless it fails
    rc = fn("cuGraphLaunch")(c_void_p(graph_exec), c_void_p(stream))
    if rc:
        raise _error(rc, f"cuGraphLaunch(exec={graph_exec:#x}, stream={stream or 0:#x})")


def graph_exec_destroy(graph_exec: int) -> None:
    _call("cuGraphExecDestroy", c_void_p(graph_exec), desc=f"exec={graph_exec:#x}")


def graph_destroy(graph: int) -> None:
    _call("cuGraphDestroy", c_void_p(graph), desc=f"graph={graph:#x}")


def graph_node_types(graph: int) -> dict:
    """{node type name: count} of a CUgraph (e.g. {'kernel': 210, 'memcpy': 2})."""
    n = c_size_t(0)
    _call("cuGraphGetNodes", c_void_p(graph), None, byref(n), desc=f"graph={graph:#x}")
    nodes = (c_void_p * max(n.value, 1))()
    _call("cuGraphGetNodes", c_void_p(graph), nodes, byref(n), desc=f"graph={graph:#x}")
    out: dict = {}
    t = c_int()
    for i in range(n.value):
        _call("cuGraphNodeGetType", c_void_p(nodes[i]), byref(t), desc="node")
        name = GRAPH_NODE_TYPES.get(t.value, f"type{t.value}")
        out[name] = out.get(name, 0) + 1
    return out


def _guarded(f, what, refused=None):
    # refused(args, kw): whether this call is refused while capturing (None: every call is)
    def guarded(*args, **kw):
        if _capturing and (refused is None or refused(args, kw)):
            capture_refuse(what)
        return f(*args, **kw)
    guarded.__name__ = f.__name__
    guarded.__qualname__ = f.__qualname__
    guarded.__doc__ = f.__doc__
    guarded.__wrapped__ = f
    return guarded


def _synchronous_copy(args, kw):
    # the stream=None forms are synchronous (legacy stream): refused; async forms are captured
    return kw.get("stream", args[3] if len(args) > 3 else None) is None


def _guarded_copy(f, what):
    return _guarded(f, what, _synchronous_copy)


def _mem_alloc_relaxed(f):
    # cuMemAlloc is a "potentially unsafe" call: under a GLOBAL / THREAD_LOCAL capture it fails
    # with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture. Allocating a new
    # segment for the graph's private pool is safe (nothing frees it before the graph is
    # destroyed; replays do not allocate), so this thread is switched to RELAXED mode around
    # the call, as PyTorch's allocator does (cudaMallocMaybeCapturing).
    def mem_alloc(nbytes: int) -> int:
        if not _capturing:
            return f(nbytes)
        prev = exchange_capture_mode(CAPTURE_MODE_RELAXED)
        try:
            return f(nbytes)
        finally:
            exchange_capture_mode(prev)
    mem_alloc.__doc__ = f.__doc__
    mem_alloc.__wrapped__ = f
    return mem_alloc


mem_alloc = _mem_alloc_relaxed(mem_alloc)
ctx_synchronize = _guarded(ctx_synchronize, "ctx_synchronize (cuCtxSynchronize)")
stream_synchronize = _guarded(stream_synchronize, "stream_synchronize (cuStreamSynchronize)")
stream_query = _guarded(stream_query, "stream_query (cuStreamQuery)")
event_synchronize = _guarded(event_synchronize, "event_synchronize (cuEventSynchronize)")
mem_free = _guarded(mem_free, "mem_free (cuMemFree synchronises the device)")
memcpy_htod = _guarded_copy(memcpy_htod, "a synchronous host-to-device copy (cuMemcpyHtoD)")
memcpy_dtoh = _guarded_copy(memcpy_dtoh, "a synchronous device-to-host copy (cuMemcpyDtoH, "
                                         "e.g. Tensor.item() / .numpy())")
memcpy_dtod = _guarded_copy(memcpy_dtod, "a synchronous device-to-device copy (cuMemcpyDtoD)")
memset_d8 = _guarded_copy(memset_d8, "a synchronous memset (cuMemsetD8)")
memset_d32 = _guarded_copy(memset_d32, "a synchronous memset (cuMemsetD32)")
# =============================================================================================
# end of the CUDA graphs section
# =============================================================================================
