"""DLPack (__dlpack__, __dlpack_device__, nbx.from_dlpack) and the CUDA array interface.

Host tensors (cpu, interp) round-trip with NumPy for real; the cuda stream logic and the
cuda capsule fields are checked against a fake driver; the round trips with torch, CuPy, JAX
and Numba run on the GPU machine (marked cuda; each skipped where its library is absent).
"""
from __future__ import annotations

import ctypes
import gc
import os
import weakref

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor import dlpack as D
from nbxtensor.backends.cuda import driver
from nbxtensor.backends.cuda import storage as cuda_storage
from nbxtensor.backends.cuda.storage import ForeignCudaStorage, launch_token
from nbxtensor.device import Device

from conftest import DEVICES
from helpers import randn, rng
from fakes import FakeCuda  # noqa: E402

HAVE_GPU = driver.availability()[0]
# the NumPy exchanges are host memory's (cuda has its own tests below, with torch, CuPy, JAX)
host = pytest.mark.parametrize("device", [d for d in DEVICES if d != "cuda"])

# NumPy dtypes NumPy itself exchanges through DLPack; the ml_dtypes ones only we do
NP_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32,
             np.float64]
# dlpack.h 1.1 DLDataTypeCode values, written out here independently of the package's table
SPEC_CODES = {"bool": (6, 8), "uint8": (1, 8), "int8": (0, 8), "int16": (0, 16),
              "int32": (0, 32), "int64": (0, 64), "float16": (2, 16), "bfloat16": (4, 16),
              "float32": (2, 32), "float64": (2, 64), "float8_e4m3fn": (10, 8),
              "float8_e5m2": (12, 8)}


def _random(shape, dtype, seed=None):
    g = rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return g.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return g.integers(max(info.min, -1000), min(info.max, 1000), shape, endpoint=True).astype(dtype)
    return (g.standard_normal(shape) * 10).astype(dtype)


def _host(t):
    """The values of a host tensor as NumPy (a copy on interp, a view on cpu)."""
    return t.numpy()


def _struct(cap):
    """(the DLManagedTensor[Versioned] a capsule holds, whether versioned)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.argtypes, get.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p
    valid = ctypes.pythonapi.PyCapsule_IsValid
    valid.argtypes, valid.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int
    if valid(cap, b"dltensor_versioned"):
        m, versioned = D.DLManagedTensorVersioned.from_address(get(cap, b"dltensor_versioned")), True
    else:
        assert valid(cap, b"dltensor"), cap
        m, versioned = D.DLManagedTensor.from_address(get(cap, b"dltensor")), False
    m.capsule = cap     # the struct lives in the capsule's memory: keep it while reading
    return m, versioned


def _capsule_name(cap) -> str:
    f = ctypes.pythonapi.PyCapsule_GetName
    f.argtypes, f.restype = [ctypes.py_object], ctypes.c_char_p
    return f(cap).decode()


class Producer:
    """An array-API producer over a capsule factory, recording how it was asked."""

    def __init__(self, make, device=(1, 0), legacy_only=False):
        self.make, self.device, self.legacy_only, self.calls = make, device, legacy_only, []

    def __dlpack__(self, stream=None, **kw):
        if self.legacy_only and kw:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.calls.append(dict(stream=stream, **kw))
        return self.make()

    def __dlpack_device__(self):
        return self.device


# ----------------------------------------------------------------------------- host: numpy

@host
@pytest.mark.parametrize("dt", NP_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_to_nbx_zero_copy_every_dtype(device, dt):
    a = _random((7, 5), dt)
    t = nbx.from_dlpack(a, device=device)
    assert t.device == Device(device) and t.dtype == nbx.dtypes.as_dtype(np.dtype(dt))
    assert t.shape == (7, 5) and t.stride() == (5, 1)
    assert t.data_ptr() == a.ctypes.data
    np.testing.assert_array_equal(_host(t), a)
    # the tensor sees the array's memory (integers: the low bit flipped; `+ 1` overflows at max)
    a[2, 3] = a[0, 0] if dt is np.bool_ else (a[2, 3] ^ 1 if np.issubdtype(dt, np.integer)
                                              else a[2, 3] + 1)
    a[1] = ~a[1] if dt is np.bool_ else a[1] * 2
    np.testing.assert_array_equal(_host(t), a)


@host
@pytest.mark.parametrize("dt", NP_DTYPES, ids=lambda d: np.dtype(d).name)
def test_nbx_to_numpy_zero_copy_every_dtype(device, dt):
    ref = _random((4, 9), dt)
    t = nbx.tensor(ref, device=device)
    a = np.from_dlpack(t)
    assert a.dtype == ref.dtype and a.shape == ref.shape
    assert a.ctypes.data == t.data_ptr()
    np.testing.assert_array_equal(a, ref)
    # and writes reach the tensor (a changed value: flip the low bit of integers, which
    # cannot overflow as `- 1` does at an unsigned 0)
    a[3, 8] = ref[0, 0] if dt is np.bool_ else (ref[3, 8] ^ 1 if np.issubdtype(dt, np.integer)
                                                else ref[3, 8] - 1)
    np.testing.assert_array_equal(_host(t), a)
    assert t.__dlpack_device__() == (1, 0)      # interp tensors are host memory


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_ml_dtypes_round_trip_through_capsules(device, name):
    dt = nbx.dtypes.as_dtype(name)
    ref = _random((3, 6), np.float32).astype(dt.np)
    t = nbx.tensor(ref, device=device)
    for kw in ({}, {"max_version": (1, 1)}):
        cap = t.__dlpack__(**kw)
        m, _ = _struct(cap)
        assert (m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes) == \
            (*SPEC_CODES[name], 1)
        u = nbx.from_dlpack(cap, device=device)
        assert u.dtype == dt and u.data_ptr() == t.data_ptr()
        np.testing.assert_array_equal(_host(u).view(np.uint8), ref.view(np.uint8))


def test_every_dtype_carries_the_spec_code():
    for d in nbx.all_dtypes:
        m, _ = _struct(nbx.zeros(2, dtype=d).__dlpack__(max_version=(1, 0)))
        assert (m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits) == SPEC_CODES[d.name], d


@host
def test_non_contiguous_both_ways(device):
    base = _random((6, 8, 5), np.float32)
    a = base[::2, 1:7, ::-1][..., ::-1].transpose(2, 0, 1)     # steps, slice, transpose
    t = nbx.from_dlpack(a, device=device)
    item = a.itemsize
    assert t.stride() == tuple(s // item for s in a.strides)
    assert t.data_ptr() == a.ctypes.data
    np.testing.assert_array_equal(_host(t), a)
    src = nbx.tensor(base, device=device)
    v = src[1:, ::3].permute(2, 0, 1)
    b = np.from_dlpack(v)
    assert b.strides == tuple(s * item for s in v.stride())
    assert b.ctypes.data == v.data_ptr()
    np.testing.assert_array_equal(b, base[1:, ::3].transpose(2, 0, 1))


@host
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2)])
def test_zero_d_and_empty_both_ways(device, shape):
    ref = np.asarray(_random(shape, np.float64)) if shape == () else np.empty(shape)
    t = nbx.from_dlpack(ref, device=device)
    assert t.shape == shape and t.dtype == nbx.float64
    np.testing.assert_array_equal(_host(t), ref)
    back = np.from_dlpack(nbx.tensor(ref, device=device))
    assert back.shape == shape
    np.testing.assert_array_equal(back, ref)


@host
def test_byte_offset_is_honoured(device):
    a = _random((5, 4), np.int32)
    cap = a[1:].__dlpack__(max_version=(1, 0))
    m, _ = _struct(cap)
    m.dl_tensor.data -= 16                     # the same element 0, as data + byte_offset
    m.dl_tensor.byte_offset = 16
    t = nbx.from_dlpack(cap, device=device)
    assert t.data_ptr() == a[1:].ctypes.data
    np.testing.assert_array_equal(_host(t), a[1:])


@host
def test_views_with_an_offset_export_their_first_element(device):
    ref = _random((10,), np.float32)
    t = nbx.tensor(ref, device=device)[3:8]
    assert t.storage_offset() == 3
    a = np.from_dlpack(t)
    np.testing.assert_array_equal(a, ref[3:8])
    m, _ = _struct(t.__dlpack__())
    assert m.dl_tensor.data + m.dl_tensor.byte_offset == t.data_ptr()


# ----------------------------------------------------------------------------- lifetimes

def _churn():
    """Allocate and fill host memory of many sizes, so freed memory would be reused."""
    return [np.full(n, -7.0) for n in (10, 16, 64, 1000) for _ in range(20)]


@host
def test_numpy_memory_outlives_the_numpy_array(device):
    a = np.arange(10.) * 1.5 + 1
    ref = a.copy()
    w = weakref.ref(a)
    t = nbx.from_dlpack(a, device=device)
    del a
    gc.collect()
    junk = _churn()
    assert w() is not None                      # the tensor holds NumPy's manager
    np.testing.assert_array_equal(_host(t), ref)
    del t, junk
    gc.collect()
    assert w() is None                          # and its deleter gave the array back


@host
def test_nbx_memory_outlives_the_tensor(device):
    t = nbx.arange(10, dtype=nbx.float64, device=device) * 2.5 + 1
    ref = _host(t).copy()
    w = weakref.ref(t._storage)
    a = np.from_dlpack(t)
    del t
    gc.collect()
    junk = _churn() + [nbx.full((10,), -3.0, dtype=nbx.float64, device=device) for _ in range(20)]
    assert w() is not None
    np.testing.assert_array_equal(a, ref)
    del a, junk
    gc.collect()
    assert w() is None


def test_a_capsule_never_consumed_frees_its_manager(device):
    t = nbx.arange(6, dtype=nbx.float32, device=device)
    w = weakref.ref(t._storage)
    caps = [t.__dlpack__(), t.__dlpack__(max_version=(1, 0))]
    del t
    gc.collect()
    assert w() is not None                      # the capsules hold the storage
    del caps
    gc.collect()
    assert w() is None                          # their destructors freed the managers


def test_a_refused_capsule_goes_back_to_its_producer():
    a = np.arange(3, dtype=np.complex64)       # no complex dtype here
    w = weakref.ref(a)
    with pytest.raises(TypeError, match="kDLComplex with 64 bits"):
        nbx.from_dlpack(a)
    del a
    gc.collect()
    assert w() is None                          # consumed, refused, and the deleter called


def test_capsule_consumed_twice_is_refused(device):
    cap = nbx.arange(4, device=device).__dlpack__(max_version=(1, 0))
    t = nbx.from_dlpack(cap, device=device)
    assert _capsule_name(cap) == "used_dltensor_versioned"
    with pytest.raises(ValueError, match="already consumed"):
        nbx.from_dlpack(cap)
    assert _host(t).tolist() == [0, 1, 2, 3]
    legacy = np.arange(3.).__dlpack__()
    nbx.from_dlpack(legacy)
    assert _capsule_name(legacy) == "used_dltensor"
    with pytest.raises(ValueError, match="already consumed"):
        nbx.from_dlpack(legacy)


def test_numpy_consumes_our_capsule_once():
    t = nbx.arange(3.0)
    cap = t.__dlpack__()

    class Once:
        def __dlpack__(self, **kw):
            return cap

        def __dlpack_device__(self):
            return (1, 0)

    assert np.from_dlpack(Once()).tolist() == [0.0, 1.0, 2.0]
    assert _capsule_name(cap) == "used_dltensor"
    with pytest.raises(ValueError, match="already consumed"):
        nbx.from_dlpack(cap)


# ----------------------------------------------------------------------------- versions, flags

def test_versioned_and_legacy_capsules(device):
    t = randn((3, 4), device=device)
    assert _capsule_name(t.__dlpack__()) == "dltensor"
    assert _capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"
    for mv, version in (((1, 0), (1, 0)), ((1, 1), (1, 1)), ((1, 7), (1, 1)), ((2, 0), (1, 1))):
        cap = t.__dlpack__(max_version=mv)
        assert _capsule_name(cap) == "dltensor_versioned"
        m, versioned = _struct(cap)
        assert versioned and (m.version.major, m.version.minor) == version
        assert m.flags == 0
        u = nbx.from_dlpack(cap, device=device)
        np.testing.assert_array_equal(_host(u), _host(t))
    for kw in ({}, {"max_version": (1, 0)}):
        m, _ = _struct(t.__dlpack__(**kw))
        assert (m.dl_tensor.device.device_type, m.dl_tensor.device.device_id) == \
            ((2, 0) if device == "cuda" else (1, 0))
        assert m.dl_tensor.ndim == 2
        assert [m.dl_tensor.shape[i] for i in range(2)] == [3, 4]
        assert [m.dl_tensor.strides[i] for i in range(2)] == [4, 1]


def test_consumer_asks_versioned_then_falls_back_to_legacy():
    a = _random((4,), np.float32)
    p = Producer(lambda: a.__dlpack__(max_version=(1, 0)))
    np.testing.assert_array_equal(nbx.from_dlpack(p).numpy(), a)
    assert p.calls == [{"stream": None, "max_version": (1, 1)}]
    old = Producer(lambda: a.__dlpack__(), legacy_only=True)
    np.testing.assert_array_equal(nbx.from_dlpack(old).numpy(), a)
    assert old.calls == [{"stream": None}]


def test_read_only_numpy_memory_stays_read_only():
    a = _random((5,), np.float32)
    a.flags.writeable = False
    t = nbx.from_dlpack(a)
    assert t.data_ptr() == a.ctypes.data
    with pytest.raises(ValueError, match="read-only"):
        t.fill_(1.0)
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 2.0
    back = np.from_dlpack(t)                    # the flag travels on in versioned capsules
    assert not back.flags.writeable
    m, _ = _struct(t.__dlpack__(max_version=(1, 0)))
    assert m.flags & 1
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__()                          # a legacy capsule cannot say it
    c = nbx.from_dlpack(a, copy=True)           # a copy of our own is writable
    c.fill_(3.0)
    assert c.data_ptr() != a.ctypes.data and a[0] != 3.0


def test_read_only_memory_on_interp_needs_a_copy():
    pytest.importorskip("triton")
    a = _random((5,), np.float32)
    a.flags.writeable = False
    with pytest.raises(BufferError, match="read-only.*copy=True"):
        nbx.from_dlpack(a, device="interp")
    t = nbx.from_dlpack(a, device="interp", copy=True)
    assert t.data_ptr() != a.ctypes.data
    np.testing.assert_array_equal(t.numpy(), a)


@host
def test_copy_flag_on_export(device):
    t = randn((4, 3), device=device)
    m, _ = _struct(t.__dlpack__(max_version=(1, 0), copy=True))
    assert m.flags & 2 and m.dl_tensor.data != t.data_ptr()
    a = np.from_dlpack(t, copy=True)
    assert a.ctypes.data != t.data_ptr()
    np.testing.assert_array_equal(a, _host(t))
    assert np.from_dlpack(t, copy=False).ctypes.data == t.data_ptr()


@host
def test_from_dlpack_device_and_copy(device):
    a = _random((3, 3), np.int64)
    t = nbx.from_dlpack(a, device=device)
    assert t.data_ptr() == a.ctypes.data        # cpu and interp share host memory
    c = nbx.from_dlpack(a, device=device, copy=True)
    assert c.data_ptr() != a.ctypes.data and c.device == Device(device)
    np.testing.assert_array_equal(_host(c), a)
    u = nbx.from_dlpack(nbx.tensor(a, device=device))
    assert u.device == Device("cpu")            # host memory comes back as cpu by default


# ----------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("dt,code", [(np.complex64, "kDLComplex with 64 bits"),
                                     (np.uint16, "kDLUInt with 16 bits"),
                                     (np.uint32, "kDLUInt with 32 bits"),
                                     (np.uint64, "kDLUInt with 64 bits")])
def test_unsupported_dtypes_are_refused_by_name(dt, code):
    with pytest.raises(TypeError, match=code):
        nbx.from_dlpack(np.zeros(3, dt))


def test_vector_lanes_are_refused():
    cap = np.zeros(4, np.float32).__dlpack__()
    _struct(cap)[0].dl_tensor.dtype.lanes = 4
    with pytest.raises(TypeError, match="4 lanes"):
        nbx.from_dlpack(cap)


def test_devices_we_do_not_have_are_refused_by_name():
    a = np.arange(4.)
    w = weakref.ref(a)
    cap = a.__dlpack__()
    m, _ = _struct(cap)
    m.dl_tensor.device.device_type = 10         # kDLROCM
    del a
    with pytest.raises(ValueError, match="kDLROCM"):
        nbx.from_dlpack(cap)
    gc.collect()
    assert w() is None                          # refused, and given back


def test_a_cuda_capsule_on_a_device_we_cannot_open_is_refused():
    cap = np.arange(4.).__dlpack__()
    m, _ = _struct(cap)
    m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = 2, 99
    with pytest.raises(ValueError, match="cuda:99"):
        nbx.from_dlpack(cap)


@host
def test_bad_arguments_are_refused(device):
    t = randn((2,), device=device)
    with pytest.raises(ValueError, match="stream must be None"):
        t.__dlpack__(stream=5)
    with pytest.raises(TypeError, match="stream must be None or an int"):
        t.__dlpack__(stream=True)
    with pytest.raises(TypeError, match="max_version"):
        t.__dlpack__(max_version=1)
    with pytest.raises(TypeError, match="copy"):
        t.__dlpack__(copy="yes")
    with pytest.raises(BufferError, match="dl_device"):
        t.__dlpack__(dl_device=(2, 0))
    assert np.from_dlpack(t, device="cpu").ctypes.data == t.data_ptr()   # dl_device=(1, 0)
    with pytest.raises(TypeError, match="got list"):
        nbx.from_dlpack([1, 2])
    with pytest.raises(TypeError, match="copy"):
        nbx.from_dlpack(np.zeros(2), copy=1)
    with pytest.raises(ValueError, match="negative strides"):
        nbx.from_dlpack(np.arange(5.)[::-1])


@host
def test_host_tensors_have_no_cuda_array_interface(device):
    t = randn((2, 2), device=device)
    assert not hasattr(t, "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="only cuda tensors"):
        t.__cuda_array_interface__


# ----------------------------------------------------------------------------- fake cuda


def _fake_cuda_tensor(shape=(3, 4), dtype=nbx.float32, ptr=0x7F0000001000, index=0):
    n = int(np.prod(shape)) * dtype.itemsize
    st = ForeignCudaStorage(Device("cuda", index), n, ptr, None)
    return nbx.Tensor._make(st, shape, nbx.tensor(np.zeros(shape)).stride(), 0, dtype)


def test_fake_cuda_capsule_fields(monkeypatch):
    FakeCuda(monkeypatch)
    t = _fake_cuda_tensor((3, 4))[1:, ::2]
    assert t.__dlpack_device__() == (2, 0)
    for kw in ({}, {"max_version": (1, 0)}):
        m, _ = _struct(t.__dlpack__(**kw))
        dl = m.dl_tensor
        assert (dl.device.device_type, dl.device.device_id) == (2, 0)
        assert dl.data + dl.byte_offset == t.data_ptr() == 0x7F0000001000 + 4 * 4
        assert [dl.shape[i] for i in range(2)] == [2, 2]
        assert [dl.strides[i] for i in range(2)] == [4, 2]
    t1 = _fake_cuda_tensor(index=1)
    m, _ = _struct(t1.__dlpack__(max_version=(1, 0)))
    assert m.dl_tensor.device.device_id == 1
    for d in nbx.all_dtypes:
        t = _fake_cuda_tensor((2, 3), d)
        m, _ = _struct(t.__dlpack__(max_version=(1, 1)))
        dl = m.dl_tensor
        assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (*SPEC_CODES[d.name], 1)
        assert dl.data == t.data_ptr() and dl.byte_offset == 0 and m.flags == 0
        u = nbx.from_dlpack(t)
        assert u.dtype == d and u.data_ptr() == t.data_ptr() and u.stride() == (3, 1)


@pytest.mark.parametrize("ours", [0, 0x5000])
@pytest.mark.parametrize("consumer", [None, 1, 2, 0x7777, -1])
def test_fake_cuda_export_orders_the_consumer_stream(monkeypatch, ours, consumer):
    fake = FakeCuda(monkeypatch)
    t = _fake_cuda_tensor()
    with nbx.cuda.stream(nbx.cuda.Stream(0, handle=ours)):
        t.__dlpack__(stream=consumer, max_version=(1, 0))
    theirs = 1 if consumer is None else consumer
    if consumer == -1 or (theirs == 1 and ours == 0):
        assert fake.waits() == []       # no synchronisation asked, or one stream
    else:
        assert fake.waits() == [(theirs, ours)]


def test_fake_cuda_export_refuses_stream_zero(monkeypatch):
    FakeCuda(monkeypatch)
    with pytest.raises(ValueError, match="0 is disallowed"):
        _fake_cuda_tensor().__dlpack__(stream=0)
    with pytest.raises(ValueError, match="not a CUDA stream"):
        _fake_cuda_tensor().__dlpack__(stream=-5)


def test_fake_cuda_import_is_zero_copy_and_launchable(monkeypatch):
    fake = FakeCuda(monkeypatch)
    t = _fake_cuda_tensor((5, 2), nbx.bfloat16)
    w = weakref.ref(t._storage)
    u = nbx.from_dlpack(t)
    assert u.device == Device("cuda", 0) and u.dtype == nbx.bfloat16
    assert u.data_ptr() == t.data_ptr() and u.shape == (5, 2)
    assert isinstance(u._storage, ForeignCudaStorage)
    # the launcher's mark check accepts it, also after every mark was made stale (a fresh
    # token table, put back after the test so no other storage loses its mark)
    assert u._storage._nbx_launch is launch_token(0)
    old = launch_token(0)
    monkeypatch.setattr(cuda_storage, "_launch_tokens", {})
    assert launch_token(0) is not old and u._storage._nbx_launch is launch_token(0)
    assert fake.waits() == []
    del t
    gc.collect()
    assert w() is not None                      # held through the capsule's manager
    del u
    gc.collect()
    assert w() is None


@pytest.mark.parametrize("ours", [0, 0x5000])
def test_fake_cuda_import_asks_for_our_current_stream(monkeypatch, ours):
    FakeCuda(monkeypatch)
    t = _fake_cuda_tensor()
    p = Producer(lambda: t.__dlpack__(max_version=(1, 0)), device=(2, 0))
    with nbx.cuda.stream(nbx.cuda.Stream(0, handle=ours)):
        nbx.from_dlpack(p)
    assert p.calls == [{"stream": ours or 1, "max_version": (1, 1)}]


def test_fake_cuda_import_refusals(monkeypatch):
    FakeCuda(monkeypatch, ndev=1)
    with pytest.raises(ValueError, match="cuda:1.*1 cuda device"):
        nbx.from_dlpack(_fake_cuda_tensor(index=1).__dlpack__())
    ro = _fake_cuda_tensor().__dlpack__(max_version=(1, 0))
    _struct(ro)[0].flags = 1
    with pytest.raises(BufferError, match="read-only.*copy=True"):
        nbx.from_dlpack(ro)
    odd = _fake_cuda_tensor(ptr=0x7F0000001002).__dlpack__()
    with pytest.raises(ValueError, match="not aligned"):
        nbx.from_dlpack(odd)
    with pytest.raises(BufferError, match="copy=False"):
        _fake_cuda_tensor().__dlpack__(dl_device=(1, 0), copy=False)
    with pytest.raises(BufferError, match="copy=False"):
        nbx.from_dlpack(_fake_cuda_tensor(), device="cpu", copy=False)


def test_fake_cuda_array_interface_export(monkeypatch):
    FakeCuda(monkeypatch)
    t = _fake_cuda_tensor((3, 4), nbx.float32)
    cai = t.__cuda_array_interface__
    assert cai == {"shape": (3, 4), "typestr": "<f4", "data": (t.data_ptr(), False),
                   "strides": None, "version": 3, "stream": 1}
    v = t.t()[1:]
    cai = v.__cuda_array_interface__
    assert cai["strides"] == (4, 16) and cai["data"][0] == t.data_ptr() + 4
    with nbx.cuda.stream(nbx.cuda.Stream(0, handle=0x5000)):
        assert t.__cuda_array_interface__["stream"] == 0x5000
    for d, ts in ((nbx.bool, "|b1"), (nbx.uint8, "|u1"), (nbx.int8, "|i1"), (nbx.int64, "<i8"),
                  (nbx.float16, "<f2"), (nbx.float64, "<f8")):
        assert _fake_cuda_tensor((2,), d).__cuda_array_interface__["typestr"] == ts
    assert _fake_cuda_tensor((0, 3)).__cuda_array_interface__["data"] == (0, False)
    for d in (nbx.bfloat16, nbx.float8_e4m3fn):
        with pytest.raises(TypeError, match=f"{d.name} has no typestr.*DLPack"):
            _fake_cuda_tensor((2,), d).__cuda_array_interface__


class CAIObject:
    def __init__(self, **cai):
        self.__cuda_array_interface__ = dict(
            {"shape": (4, 3), "typestr": "<f4", "data": (0x7F0000002000, False), "version": 3},
            **cai)


def test_fake_cuda_array_interface_import(monkeypatch):
    fake = FakeCuda(monkeypatch)
    obj = CAIObject(strides=(4, 16), stream=0x77)
    w = weakref.ref(obj)
    t = nbx.from_dlpack(obj)
    assert t.device == Device("cuda", 0) and t.shape == (4, 3) and t.stride() == (1, 4)
    assert t.data_ptr() == 0x7F0000002000 and t.dtype == nbx.float32
    assert ("pointer", 0x7F0000002000) in fake.calls
    assert fake.waits() == [(0, 0x77)]          # our stream waits for the producer's
    del obj
    gc.collect()
    assert w() is not None                      # the tensor keeps the producer object
    del t
    gc.collect()
    assert w() is None
    t = nbx.as_tensor(CAIObject(stream=None))
    assert t.stride() == (3, 1) and t.data_ptr() == 0x7F0000002000
    assert len(fake.waits()) == 1               # stream None: nothing to order


def test_fake_cuda_array_interface_import_refusals(monkeypatch):
    FakeCuda(monkeypatch)
    with pytest.raises(TypeError, match="uint16"):
        nbx.from_dlpack(CAIObject(typestr="<u2"))
    with pytest.raises(ValueError, match="mask"):
        nbx.from_dlpack(CAIObject(mask=object()))
    with pytest.raises(ValueError, match="big-endian"):
        nbx.from_dlpack(CAIObject(typestr=">f4"))
    with pytest.raises(ValueError, match="multiples"):
        nbx.from_dlpack(CAIObject(strides=(6, 2)))
    with pytest.raises(ValueError, match="0 is disallowed"):
        nbx.from_dlpack(CAIObject(stream=0))
    with pytest.raises(BufferError, match="read-only"):
        nbx.from_dlpack(CAIObject(data=(0x7F0000002000, True)))


# ----------------------------------------------------------------------------- the GPU

def _import(name):
    if name == "jax":
        # JAX takes most of the GPU's memory at its first use unless told not to
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return pytest.importorskip(name)


def _gpu_ref(shape=(37, 129), dtype=np.float32, seed=None):
    return _random(shape, dtype, seed)


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("transposed", [False, True])
def test_cuda_torch_round_trip(transposed):
    torch = _import("torch")
    ref = _gpu_ref()
    t = nbx.tensor(ref, device="cuda")
    if transposed:
        t, ref = t.t(), ref.T
    for x in (torch.from_dlpack(t), torch.utils.dlpack.from_dlpack(t)):
        assert x.device.type == "cuda" and x.data_ptr() == t.data_ptr()
        assert x.stride() == t.stride()
        np.testing.assert_array_equal(x.cpu().numpy(), ref)
    x = torch.from_dlpack(t)
    x.mul_(2)                                   # torch writes into our memory
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.numpy(), ref * 2)
    # and back: torch's memory in nbx, our kernels on it
    y = torch.randn(5, 7, device="cuda")
    if transposed:
        y = y.t()
    u = nbx.from_dlpack(y)
    assert u.data_ptr() == y.data_ptr() and u.stride() == y.stride()
    np.testing.assert_array_equal(u.numpy(), y.cpu().numpy())
    legacy = nbx.from_dlpack(torch.utils.dlpack.to_dlpack(y))     # a raw legacy capsule
    assert legacy.data_ptr() == y.data_ptr() and legacy.stride() == y.stride()
    np.testing.assert_allclose((u * 3 + 1).numpy(), y.cpu().numpy() * 3 + 1, rtol=1e-6)
    u.fill_(4.5)
    nbx.cuda.synchronize()
    assert (y == 4.5).all().item()


cuda_torch_dtypes = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
                     "float32", "float64", "float8_e4m3fn", "float8_e5m2"]


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("name", cuda_torch_dtypes)
def test_cuda_torch_every_dtype(name):
    torch = _import("torch")
    dt = nbx.dtypes.as_dtype(name)
    ref = _random((6, 33), np.float32).astype(dt.np) if dt.kind == "f" else _random((6, 33), dt.np)
    t = nbx.tensor(ref, device="cuda")
    try:
        x = torch.from_dlpack(t)
    except (RuntimeError, BufferError, TypeError) as e:
        if not dt.is_float8:
            raise
        pytest.skip(f"torch {torch.__version__} reads no DLPack float8: {e}")
    assert x.dtype == getattr(torch, name) and x.data_ptr() == t.data_ptr()
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dt.itemsize]
    got = x.view(bits).cpu().numpy() if dt.kind != "b" else x.cpu().numpy()
    want = ref.view(got.dtype) if dt.kind != "b" else ref
    np.testing.assert_array_equal(got, want)
    x = x.clone()                               # torch's own memory, exported by torch
    try:
        u = nbx.from_dlpack(x)
    except (RuntimeError, BufferError, TypeError) as e:
        if not dt.is_float8 or "nbxtensor" in str(e) or "from_dlpack:" in str(e):
            raise
        pytest.skip(f"torch {torch.__version__} exports no DLPack float8: {e}")
    assert u.dtype == dt and u.data_ptr() == x.data_ptr()
    np.testing.assert_array_equal(u.numpy().view(np.uint8), ref.view(np.uint8))


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
def test_cuda_torch_memory_outlives_the_producer():
    torch = _import("torch")
    n = 1 << 20
    x = torch.randn(n, device="cuda")
    ref = x.cpu().numpy().copy()
    t = nbx.from_dlpack(x)
    del x
    gc.collect()
    junk = [torch.full((n,), 7.0, device="cuda") for _ in range(4)]   # torch's cache reuses freed blocks
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.numpy(), ref)
    del junk


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
def test_cuda_our_allocator_never_frees_under_a_consumer():
    torch = _import("torch")
    n = 1 << 20
    t = randn((n,), device="cuda")
    ref = t.numpy()
    w = weakref.ref(t._storage)
    x = torch.from_dlpack(t)
    del t
    gc.collect()
    junk = [nbx.full((n,), 3.0, device="cuda") for _ in range(4)]     # same size: same class
    nbx.cuda.synchronize()
    np.testing.assert_array_equal(x.cpu().numpy(), ref)
    assert w() is not None
    del x
    gc.collect()
    assert w() is None                          # the consumer's deleter let it go
    del junk


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
def test_cuda_stream_handoff_to_torch(monkeypatch):
    torch = _import("torch")
    waits = []
    real = driver.stream_wait_event
    monkeypatch.setattr(driver, "stream_wait_event", lambda s, e: (waits.append(s), real(s, e)))
    ours = nbx.cuda.Stream()
    theirs = torch.cuda.Stream()
    a = randn((1024, 1024), device="cuda")
    with nbx.cuda.stream(ours):
        b = a
        for _ in range(8):                      # long enough to race a consumer that does not wait
            b = b @ a * (1.0 / 32)
        with torch.cuda.stream(theirs):
            x = torch.from_dlpack(b)            # torch passes its current stream: `theirs`
            s = x.double().sum()
    assert waits == [theirs.cuda_stream]
    theirs.synchronize()
    nbx.cuda.synchronize()
    want = float(b.numpy().astype(np.float64).sum())
    assert s.item() == pytest.approx(want, rel=1e-9)
    # torch -> nbx: torch queues on its current stream, we read on ours
    with torch.cuda.stream(theirs):
        y = torch.ones(1 << 22, device="cuda")
        for _ in range(4):
            y = y * 2
        with nbx.cuda.stream(ours):
            u = nbx.from_dlpack(y)              # we ask torch to order `ours` after `theirs`
            got = u.sum().item()                # (read back on `ours`, the current stream)
    assert got == 16.0 * (1 << 22)


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
def test_cuda_cupy_round_trip_and_array_interface():
    cupy = _import("cupy")
    ref = _gpu_ref()
    t = nbx.tensor(ref, device="cuda")
    c = cupy.from_dlpack(t)
    assert c.data.ptr == t.data_ptr()
    np.testing.assert_array_equal(cupy.asnumpy(c), ref)
    c2 = cupy.asarray(t)                        # through __cuda_array_interface__
    assert c2.data.ptr == t.data_ptr()
    np.testing.assert_array_equal(cupy.asnumpy(c2), ref)
    ct = cupy.asarray(t.t())
    np.testing.assert_array_equal(cupy.asnumpy(ct), ref.T)
    # the other way: by DLPack, by the array interface (as_tensor), both zero-copy
    d = cupy.asarray(_gpu_ref((9, 17), np.float64))
    for u in (nbx.from_dlpack(d), nbx.as_tensor(d), nbx.from_dlpack(CAIOnly(d))):
        assert u.data_ptr() == d.data.ptr and u.device.type == "cuda"
        np.testing.assert_array_equal(u.numpy(), cupy.asnumpy(d))
    # the consumer keeps cupy's memory: the producer deleted, cupy's pool reused
    ref2 = cupy.asnumpy(d)
    u = nbx.as_tensor(d)
    del d
    gc.collect()
    junk = [cupy.full((9, 17), -1.0) for _ in range(8)]
    np.testing.assert_array_equal(u.numpy(), ref2)
    # and cupy keeps ours (an array-interface consumer holds the tensor)
    t = randn((1 << 18,), device="cuda")
    want = t.numpy()
    c = cupy.asarray(t)
    del t
    gc.collect()
    more = [nbx.full((1 << 18,), 5.0, device="cuda") for _ in range(4)]
    nbx.cuda.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(c), want)
    del junk, more


class CAIOnly:
    """Only the CUDA array interface of an array (no __dlpack__), keeping the array."""

    def __init__(self, arr):
        self.arr = arr
        self.__cuda_array_interface__ = arr.__cuda_array_interface__


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
def test_cuda_jax_round_trip():
    jax = _import("jax")
    import jax.dlpack
    import jax.numpy as jnp
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("jax has no GPU backend here")
    ref = _gpu_ref()
    t = nbx.tensor(ref, device="cuda")
    try:
        j = jax.dlpack.from_dlpack(t)
    except TypeError:                           # older JAX: a capsule
        j = jax.dlpack.from_dlpack(t.__dlpack__())
    np.testing.assert_array_equal(np.asarray(j), ref)
    x = jax.device_put(jnp.asarray(_gpu_ref((11, 13))), gpu)
    try:
        u = nbx.from_dlpack(x)
    except BufferError as e:                    # JAX arrays are immutable: it may say so
        assert "read-only" in str(e) and "copy=True" in str(e)
        u = nbx.from_dlpack(x, copy=True)
    assert u.device.type == "cuda"
    np.testing.assert_array_equal(u.numpy(), np.asarray(x))
    want = np.asarray(x)
    del x
    gc.collect()
    np.testing.assert_array_equal(u.numpy(), want)


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
def test_cuda_numba_array_interface():
    numba_cuda = _import("numba.cuda")
    ref = _gpu_ref((8, 9))
    t = nbx.tensor(ref, device="cuda")
    a = numba_cuda.as_cuda_array(t)
    assert a.__cuda_array_interface__["data"][0] == t.data_ptr()
    np.testing.assert_array_equal(a.copy_to_host(), ref)
    d = numba_cuda.to_device(ref * 2)
    u = nbx.as_tensor(d)
    assert u.data_ptr() == d.__cuda_array_interface__["data"][0]
    np.testing.assert_array_equal(u.numpy(), ref * 2)


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
def test_cuda_nbx_round_trip_and_host_copies():
    ref = _gpu_ref((5, 6), np.float64)
    t = nbx.tensor(ref, device="cuda")
    u = nbx.from_dlpack(t)
    assert u.data_ptr() == t.data_ptr() and u.device == t.device
    np.testing.assert_array_equal((u + 1).numpy(), ref + 1)
    a = np.from_dlpack(t, device="cpu")         # dl_device=(kDLCPU, 0): a host copy
    np.testing.assert_array_equal(a, ref)
    m, _ = _struct(t.__dlpack__(max_version=(1, 0), dl_device=(1, 0)))
    assert m.flags & 2 and m.dl_tensor.device.device_type == 1
    h = nbx.from_dlpack(t, device="cpu")
    assert h.device == Device("cpu")
    np.testing.assert_array_equal(h.numpy(), ref)
    c = nbx.from_dlpack(t, copy=True)
    assert c.data_ptr() != t.data_ptr()
    np.testing.assert_array_equal(c.numpy(), ref)
