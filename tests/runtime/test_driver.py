"""The CUDA driver (ctypes on libcuda) and `nbx.cuda`.

CI has no GPU: the unavailable path, error formatting and a fake libcuda are tested
here; tests marked `cuda` run on the GPU machine.
"""
from __future__ import annotations

import ctypes
import pickle
import subprocess
import sys

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor.backends.cuda import driver as drv
from fakes import FakeLib  # noqa: E402

HAVE_GPU = drv.availability()[0]
gpu = [pytest.mark.cuda, pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")]


def _cuda(f):
    for m in gpu:
        f = m(f)
    return f


# ----------------------------------------------------------------------------- errors

def test_cuda_error_carries_name_text_and_call():
    e = drv.CudaError(2, "cuMemAlloc_v2(nbytes=1024)", "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
    assert isinstance(e, RuntimeError)
    assert (e.code, e.name, e.text, e.call) == (2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory",
                                                "cuMemAlloc_v2(nbytes=1024)")
    assert str(e) == "cuMemAlloc_v2(nbytes=1024) failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.code, e2.name, e2.text, e2.call) == (e.code, e.name, e.text, e.call)


def test_cuda_error_names_known_codes_without_the_driver():
    e = drv.CudaError(700, "cuCtxSynchronize()")
    assert e.name == "CUDA_ERROR_ILLEGAL_ADDRESS" and "cuCtxSynchronize()" in str(e)
    assert drv.CudaError(12345, "x()").name == "CUDA_ERROR_12345"


# ----------------------------------------------------------------------------- unavailable

def test_import_does_not_load_libcuda():
    code = ("import nbxtensor as nbx, sys; x = nbx.ones(3) + 1; import nbxtensor.cuda; "
            "from nbxtensor.backends.cuda import driver as d; "
            "print(d._lib is None, 'triton' in sys.modules, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["True", "False", "False"], r.stderr[-2000:]


@pytest.fixture
def fresh_driver(monkeypatch):
    """The driver module as if nothing had been loaded yet (restored afterwards)."""
    for name, value in [("_lib", None), ("_load_error", None), ("_fns", {}), ("_raw", {}),
                        ("_props_cache", {})]:
        monkeypatch.setattr(drv, name, value)
    yield drv


def test_availability_false_when_libcuda_is_absent(fresh_driver, monkeypatch):
    def no_lib(name, *a, **k):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")
    monkeypatch.setattr(drv.ctypes, "CDLL", no_lib)
    ok, reason = drv.availability()
    assert ok is False and reason.startswith("libcuda.so.1 not found")
    # every other call refuses with the same reason, and nothing else breaks
    with pytest.raises(drv.CudaUnavailable, match="libcuda.so.1 not found"):
        drv.mem_alloc(16)
    with pytest.raises(drv.CudaUnavailable):
        drv.device_count()
    assert drv.availability() == (False, reason)


@pytest.mark.skipif(HAVE_GPU, reason="checks the machine without a GPU")
def test_public_cuda_module_without_a_gpu():
    assert nbx.cuda.is_available() is False
    ok, reason = nbx.cuda.availability()
    assert not ok and reason
    assert nbx.cuda.device_count() == 0
    with pytest.raises(drv.CudaUnavailable):
        nbx.cuda.synchronize()


@pytest.mark.parametrize("rc,name", [(34, "CUDA_ERROR_STUB_LIBRARY"), (100, "CUDA_ERROR_NO_DEVICE")])
def test_availability_false_when_cuinit_fails(fresh_driver, monkeypatch, rc, name):
    monkeypatch.setattr(drv.ctypes, "CDLL", lambda n, *a, **k: FakeLib(rc))
    ok, reason = drv.availability()
    assert not ok
    assert reason.startswith(f"cuInit(0) failed: {name} ({rc}): ")
    assert drv._lib is None


def test_function_attribute_names():
    assert drv._func_attr("MAX_DYNAMIC_SHARED_SIZE_BYTES") == 8
    assert drv._func_attr("CU_FUNC_ATTRIBUTE_NUM_REGS") == 4
    with pytest.raises(ValueError, match="unknown 'BOGUS'"):
        drv._func_attr("BOGUS")


def test_launch_structures_match_the_cuda_abi():
    assert ctypes.sizeof(drv.LaunchAttribute) == 72      # id, pad to 8, 64-byte value union
    assert ctypes.sizeof(drv.LaunchConfig) == 56
    assert drv.LaunchConfig.hStream.offset == 32 and drv.LaunchConfig.numAttrs.offset == 48
    # cuda.h: seven unsigned ints, 4 bytes of padding, then the three pointer-aligned fields
    assert drv.LaunchConfig.sharedMemBytes.offset == 24 and drv.LaunchConfig.attrs.offset == 40
    assert drv.LaunchAttribute.value.offset == 8
    # the launcher's per-launch pack of the config head ends where `attrs` begins: the
    # attributes written once at prepare are never overwritten
    from nbxtensor.backends.cuda import launcher as L
    import struct
    assert struct.calcsize("<" + L._CFG_HEAD) == drv.LaunchConfig.attrs.offset


# ----------------------------------------------------------------------------- GPU

@_cuda
def test_gpu_device_properties():
    p = nbx.cuda.get_device_properties(0)
    assert p["name"] and p["major"] >= 7 and p["multiprocessors"] > 0 and p["warp_size"] == 32
    assert p["max_shared_memory_per_block_optin"] >= p["max_shared_memory_per_block"] == 49152
    assert p["total_memory"] > 1 << 30
    assert nbx.cuda.device_count() >= 1 and drv.driver_version() >= 12000
    free, total = drv.mem_get_info()
    assert 0 < free <= total


@_cuda
def test_gpu_copies_memset_and_pinned_memory():
    drv.set_device(0)
    n = 1 << 16
    a = np.random.default_rng().integers(0, 255, n, dtype=np.uint8)
    d1, d2 = drv.mem_alloc(n), drv.mem_alloc(n)
    h = drv.mem_host_alloc(n)
    try:
        drv.memcpy_htod(d1, a.ctypes.data, n)
        drv.memcpy_dtod(d2, d1, n)
        b = np.empty(n, np.uint8)
        drv.memcpy_dtoh(b.ctypes.data, d2, n)
        np.testing.assert_array_equal(a, b)
        s = drv.stream_create()
        drv.memset_d8(d1, 7, n, stream=s)
        drv.memcpy_dtoh(h, d1, n, stream=s)
        drv.stream_synchronize(s)
        assert drv.stream_query(s)
        pinned = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(h))
        assert (pinned == 7).all()
        drv.memset_d32(d2, 0x3F800000, n // 4)
        f = np.empty(n // 4, np.float32)
        drv.memcpy_dtoh(f.ctypes.data, d2, n)
        assert (f == 1.0).all()
        drv.stream_destroy(s)
    finally:
        drv.mem_free(d1)
        drv.mem_free(d2)
        drv.mem_free_host(h)


@_cuda
def test_gpu_events_time_a_copy():
    drv.set_device(0)
    s = nbx.cuda.Stream()
    e0, e1 = nbx.cuda.Event(enable_timing=True), nbx.cuda.Event(enable_timing=True)
    d = drv.mem_alloc(1 << 24)
    e0.record(s)
    drv.memset_d8(d, 1, 1 << 24, stream=s.handle)
    e1.record(s)
    e1.synchronize()
    assert e1.query() and e0.elapsed_time(e1) >= 0
    drv.mem_free(d)


@_cuda
def test_gpu_errors_are_named():
    drv.set_device(0)
    with pytest.raises(drv.CudaError) as ei:
        drv.mem_alloc(1 << 60)
    assert ei.value.name == "CUDA_ERROR_OUT_OF_MEMORY" and "cuMemAlloc_v2(nbytes=" in ei.value.call
    with pytest.raises(drv.CudaError) as ei:
        drv.module_load_data(b"not a cubin\0")
    assert ei.value.name.startswith("CUDA_ERROR_")
    with pytest.raises(ValueError, match="device index"):
        drv.device_properties(999)


def test_stream_record_event_makes_the_event_on_the_streams_device(monkeypatch):
    # Stream(1).record_event() must create its event in device 1's context, not in the
    # current device's (an event of another context cannot be recorded on the stream)
    from nbxtensor import cuda

    made = []

    class Drv:
        def current_device(self):
            return 0

        def set_device(self, i):
            made.append(("set_device", i))

        def event_create(self, timing):
            made.append(("event_create", timing))
            return 0x10

        def event_record(self, e, s):
            made.append(("event_record", e, s))

        def event_destroy(self, e):
            pass

    from nbxtensor.backends.cuda import streams
    monkeypatch.setattr(streams, "_drv", Drv())
    s = cuda.Stream(1, handle=0x20)
    ev = s.record_event()
    assert ev.device == 1
    assert made == [("set_device", 1), ("event_create", False), ("event_record", 0x10, 0x20)]
