"""Values and sizes that do not fit: every way a number enters an integer tensor refuses one
outside the dtype's range (OverflowError naming the argument, the value and the range; nothing
wraps), and every shape whose elements or bytes cannot exist is refused before anything is
allocated (ValueError for a shape past int64, MemoryError naming shape, dtype and bytes)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nbxtensor as nbx
from helpers import INT_DTYPES, rng

IDX = [1, 3]                         # the positions the indexing entries write
MASK = [False, True, False, True, True]


def _range(dt):
    i = nbx.iinfo(dt)
    return i.min, i.max


def _base(dt, small=False):
    """Five random values of `dt` (its whole range, or [-100, 100] within it); the range's
    ends at positions 2 and 4, so that comparisons with them find something."""
    lo, hi = _range(dt)
    a, b = (max(lo, -100), min(hi, 100)) if small else (lo, hi)
    x = rng().integers(a, b, 5, endpoint=True, dtype=np.int64).astype(dt.np)
    if not small:
        x[2], x[4] = lo, hi
    return x


def _put(x, positions, v, dt):
    y = x.copy()
    y[positions] = np.array(v).astype(dt.np)
    return y


def _refused(f, op, v, dt):
    lo, hi = _range(dt)
    with pytest.raises(OverflowError) as ei:
        f()
    msg = str(ei.value)
    assert msg.startswith(op) and str(v) in msg and dt.name in msg, msg
    assert f"[{lo}, {hi}]" in msg, msg


# name -> (op named in the error, f(device, dt, x numpy, v) -> (result tensor, expected numpy))
def _e_tensor(d, dt, x, v):
    data = x.tolist()
    data[1] = v
    return nbx.tensor([data, x.tolist()], dtype=dt, device=d), np.stack([_put(x, 1, v, dt), x])


def _e_setitem(d, dt, x, v):
    t = nbx.tensor(x, device=d)
    t[1] = v
    return t, _put(x, 1, v, dt)


def _e_setitem_list(d, dt, x, v):
    t = nbx.tensor(x, device=d)
    t[1:3] = [v, v]
    return t, _put(x, [1, 2], v, dt)


def _e_setitem_index(d, dt, x, v):
    t = nbx.tensor(x, device=d)
    t[nbx.tensor(IDX, device=d)] = v
    return t, _put(x, IDX, v, dt)


def _wrap_add(x, v, dt):
    return (x + np.array(v).astype(dt.np)).astype(dt.np)


ENTRIES = {
    "tensor": ("tensor", _e_tensor),
    "tensor_scalar": ("tensor", lambda d, dt, x, v: (nbx.tensor(v, dtype=dt, device=d),
                                                     np.array(v).astype(dt.np))),
    "full": ("full", lambda d, dt, x, v: (nbx.full((5,), v, dtype=dt, device=d),
                                          np.full(5, v, dt.np))),
    "full_like": ("full_like", lambda d, dt, x, v: (nbx.full_like(nbx.tensor(x, device=d), v),
                                                    np.full(5, v, dt.np))),
    "fill_": ("fill_", lambda d, dt, x, v: (nbx.tensor(x, device=d).fill_(v), np.full(5, v, dt.np))),
    "setitem": ("fill_", _e_setitem),
    "setitem_list": ("tensor", _e_setitem_list),
    "setitem_index": ("index_put", _e_setitem_index),
    "masked_fill": ("masked_fill", lambda d, dt, x, v: (
        nbx.tensor(x, device=d).masked_fill(nbx.tensor(MASK, device=d), v),
        np.where(MASK, np.array(v).astype(dt.np), x))),
    "index_fill_": ("index_fill_", lambda d, dt, x, v: (
        nbx.tensor(x, device=d).index_fill_(0, nbx.tensor(IDX, device=d), v), _put(x, IDX, v, dt))),
    "scatter_": ("scatter_", lambda d, dt, x, v: (
        nbx.tensor(x, device=d).scatter_(0, nbx.tensor(IDX, device=d), v), _put(x, IDX, v, dt))),
    "where_other": ("where", lambda d, dt, x, v: (
        nbx.where(nbx.tensor(MASK, device=d), nbx.tensor(x, device=d), v),
        np.where(MASK, x, np.array(v).astype(dt.np)))),
    "where_input": ("where", lambda d, dt, x, v: (
        nbx.where(nbx.tensor(MASK, device=d), v, nbx.tensor(x, device=d)),
        np.where(MASK, np.array(v).astype(dt.np), x))),
    "clamp_min": ("clamp", lambda d, dt, x, v: (nbx.tensor(x, device=d).clamp(min=v),
                                                np.maximum(x, np.array(v).astype(dt.np)))),
    "clamp_max": ("clamp", lambda d, dt, x, v: (nbx.tensor(x, device=d).clamp(max=v),
                                                np.minimum(x, np.array(v).astype(dt.np)))),
    "add": ("add", lambda d, dt, x, v: (nbx.add(nbx.tensor(x, device=d), v), _wrap_add(x, v, dt))),
    "radd": ("add", lambda d, dt, x, v: (v + nbx.tensor(x, device=d), _wrap_add(x, v, dt))),
    "add_": ("add", lambda d, dt, x, v: (nbx.tensor(x, device=d).add_(v), _wrap_add(x, v, dt))),
    "eq": ("eq", lambda d, dt, x, v: (nbx.tensor(x, device=d) == v,
                                      x == np.array(v).astype(dt.np))),
    "sub_alpha": ("sub", lambda d, dt, x, v: (nbx.sub(nbx.tensor(x, device=d), 1, alpha=v), None)),
}


@pytest.mark.parametrize("name", list(ENTRIES))
@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: d.name)
def test_integer_values_at_the_dtype_boundaries(device, dt, name):
    op, f = ENTRIES[name]
    lo, hi = _range(dt)
    x = _base(dt)
    for v in (lo, hi):
        got, want = f(device, dt, x, v)
        if want is not None:
            assert got.dtype is (nbx.bool if want.dtype == bool else dt)
            np.testing.assert_array_equal(got.numpy(), want)
    for v in (lo - 1, hi + 1, lo - 2**70, hi + 2**70):
        _refused(lambda: f(device, dt, x, v), op, v, dt)


def test_a_refused_value_leaves_the_tensor_as_it_was(device):
    x = _base(nbx.int32)
    t = nbx.tensor(x, device=device)
    for f in (lambda: t.fill_(2**31), lambda: t.__setitem__(1, -2**31 - 1),
              lambda: t.masked_fill_(nbx.tensor(MASK, device=device), 2**31),
              lambda: t.index_fill_(0, nbx.tensor(IDX, device=device), 2**40),
              lambda: t.add_(2**31), lambda: t.clamp_(min=2**31)):
        with pytest.raises(OverflowError):
            f()
        np.testing.assert_array_equal(t.numpy(), x)


FLOAT_ENTRIES = ["tensor", "tensor_scalar", "full", "full_like", "fill_", "setitem",
                 "setitem_list", "setitem_index", "masked_fill", "index_fill_", "scatter_"]


def _float_cases(dt):
    """(accepted float, its truncation) and refused floats for the integer `dt`."""
    lo, hi = _range(dt)
    if dt is nbx.int64:      # float64 cannot hold 2**63 - 1: the largest float below 2**63
        ok = [(float(2**63 - 1024), 2**63 - 1024), (float(-2**63), -2**63)]
        bad = [float(2**63), -float(2**63) - 2048.0]
    else:
        ok = [(hi + 0.75, hi), (lo - 0.75, lo) if lo else (-0.75, 0)]
        bad = [hi + 1.0, lo - 1.0]
    return ok, bad + [1e30, -1e30, math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("name", FLOAT_ENTRIES)
@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: d.name)
def test_python_floats_into_integer_tensors(device, dt, name):
    op, f = ENTRIES[name]
    ok, bad = _float_cases(dt)
    x = _base(dt, small=True)       # exact in float64, next to a float in one list
    for v, truncated in ok:         # truncated toward zero, as torch
        got, want = f(device, dt, x, v)
        assert got.dtype is dt
        np.testing.assert_array_equal(got.numpy(), want)
        np.testing.assert_array_equal(want, f(device, dt, x, truncated)[1])
    for v in bad:
        _refused(lambda: f(device, dt, x, v), op, v, dt)


def test_tensor_data_rules(device):
    # Python ints beyond int64 are refused with the value named (NumPy's own message was
    # "Python int too large to convert to C long")
    for data, dt in (([2**63], None), ([[1, 2], [3, -2**63 - 1]], None), ([1.5, 2**64], "int32")):
        with pytest.raises(OverflowError, match=dt or "int64"):
            nbx.tensor(data, dtype=dt, device=device)
    assert nbx.tensor([-2**63, 2**63 - 1], device=device).tolist() == [-2**63, 2**63 - 1]
    # to a float or bool dtype, a big int is a number like any other
    assert nbx.tensor([2**64], dtype=nbx.float64, device=device).tolist() == [2.0**64]
    assert nbx.tensor([2**64, 0, -3], dtype=nbx.bool, device=device).tolist() == [True, False, True]
    assert nbx.full((2,), math.nan, dtype=nbx.bool, device=device).tolist() == [True, True]
    # a NumPy array has a dtype of its own: it is cast by the dtype table's rules (as torch)
    a = rng().integers(2**40, 2**50, 7)
    np.testing.assert_array_equal(nbx.tensor(a, dtype=nbx.int32, device=device).numpy(),
                                  a.astype(np.int32))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dt=st.sampled_from(INT_DTYPES),
       v=st.one_of(st.integers(-2**70, 2**70), st.integers(-2**16, 2**16),
                   st.sampled_from([-2**63 - 1, -2**63, 2**63 - 1, 2**63, -2**31 - 1, 2**31])))
def test_any_int_is_stored_exactly_or_refused(device, dt, v):
    lo, hi = _range(dt)
    for make in (lambda: nbx.full((3,), v, dtype=dt, device=device),
                 lambda: nbx.tensor([7, v], dtype=dt, device=device)[1:]):
        if lo <= v <= hi:
            assert make().tolist()[-1] == v
        else:
            with pytest.raises(OverflowError, match=dt.name):
                make()


@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: d.name)
def test_arange_at_the_dtype_boundaries(device, dt):
    lo, hi = _range(dt)
    assert nbx.arange(hi - 2, hi + 1, dtype=dt, device=device).tolist() == [hi - 2, hi - 1, hi]
    assert nbx.arange(lo + 2, lo - 1, -1, dtype=dt, device=device).tolist() == [lo + 2, lo + 1, lo]
    with pytest.raises(OverflowError, match=dt.name):
        nbx.arange(hi - 2, hi + 2, dtype=dt, device=device)
    with pytest.raises(OverflowError, match=dt.name):
        nbx.arange(lo + 2, lo - 2, -1, dtype=dt, device=device)
    with pytest.raises(OverflowError, match=dt.name):        # float arguments: [0.5, hi + 2.5]
        nbx.arange(0.5, 2.0 * (hi + 2), float(hi + 2), dtype=dt, device=device)


def test_arange_past_int64(device):
    top = 2**63 - 1
    assert nbx.arange(top - 2, top, device=device).tolist() == [top - 2, top - 1]
    assert nbx.arange(top - 1, top + 5, 6, device=device).tolist() == [top - 1]
    with pytest.raises(OverflowError, match=rf"last element {top + 1} .*int64"):
        nbx.arange(top - 2, top + 2, device=device)
    with pytest.raises(OverflowError, match="start"):
        nbx.arange(-2**63 - 1, 0, 2**62, device=device)
    with pytest.raises(OverflowError, match="step"):
        nbx.arange(0, 5, 2**64, device=device)
    with pytest.raises(ValueError, match="overflows"):     # (end - start) / step is inf
        nbx.arange(-1e308, 1e308, 1e-300, device=device)


@pytest.mark.parametrize("dt", [nbx.uint8, nbx.int8, nbx.int32], ids=lambda d: d.name)
def test_linspace_into_integer_dtypes(device, dt):
    lo, hi = _range(dt)
    got = nbx.linspace(lo, hi, 7, dtype=dt, device=device)
    np.testing.assert_array_equal(got.numpy(), np.trunc(np.linspace(lo, hi, 7)).astype(dt.np))
    for args in ((lo, hi + 1, 3), (lo - 1, hi, 3), (0, math.nan, 2), (math.inf, 0, 2)):
        with pytest.raises(OverflowError, match=dt.name):
            nbx.linspace(*args, dtype=dt, device=device)
    # float64 rounds 2**63 - 1 up to 2**63: refused rather than wrapped to -2**63
    with pytest.raises(OverflowError, match="int64"):
        nbx.linspace(0, 2**63 - 1, 2, dtype=nbx.int64, device=device)


# ------------------------------------------------------------------------------------ sizes
@pytest.fixture
def no_huge_allocation(device, monkeypatch):
    """The device's allocate refuses to be asked for more than 1 TiB: a size check must come
    first (without it, NumPy or the allocator is asked)."""
    from nbxtensor import storage
    kind = nbx.device(device).type
    real = storage.ALLOCATE.get(kind) or storage._allocator_of(kind)

    def allocate(dev, nbytes):
        assert nbytes < 2**40, f"the allocator was asked for {nbytes} bytes"
        return real(dev, nbytes)
    if kind != "cuda":       # cuda: the caching allocator itself refuses (its own test below)
        monkeypatch.setitem(storage.ALLOCATE, kind, allocate)


HUGE = [((2**40, 2**40), nbx.float32), ((2**62,), nbx.float64), ((2**31, 2**31, 4), nbx.int8),
        ((3, 2**61), nbx.int64)]


@pytest.mark.parametrize("shape,dt", HUGE, ids=str)
def test_sizes_whose_bytes_overflow_are_refused_before_allocation(device, no_huge_allocation,
                                                                   shape, dt):
    nbytes = math.prod(shape) * dt.itemsize
    for f in (lambda: nbx.empty(shape, dtype=dt, device=device),
              lambda: nbx.zeros(*shape, dtype=dt, device=device),
              lambda: nbx.full(shape, 3, dtype=dt, device=device)):
        with pytest.raises(MemoryError) as ei:
            f()
        msg = str(ei.value)
        assert str(shape) in msg and dt.name in msg and str(nbytes) in msg, msg


def test_sizes_beyond_the_memory_of_the_device(device, no_huge_allocation):
    shape = (2**45,)           # 128 TiB of float32: more than any host or GPU has
    if device == "cuda":       # the caching allocator answers: asked, free and total
        with pytest.raises(MemoryError, match=r"(?s)tried to allocate.*more than the device's total"):
            nbx.empty(shape, device=device)
        return
    with pytest.raises(MemoryError, match=rf"\(35184372088832,\).*float32.*{2**47} bytes.*memory"):
        nbx.empty(shape, device=device)


def test_factories_that_build_on_the_host_check_the_size_first(device):
    cases = [(lambda: nbx.arange(2**62, device=device), "(4611686018427387904,)"),
             (lambda: nbx.arange(0.0, 2.0**62, device=device), "(4611686018427387904,)"),
             (lambda: nbx.linspace(0, 1, 2**62, device=device), "(4611686018427387904,)"),
             (lambda: nbx.eye(10**7, device=device), "(10000000, 10000000)")]
    for f, shape in cases:
        with pytest.raises(MemoryError, match="cannot allocate") as ei:
            f()
        assert shape in str(ei.value)


def test_bad_sizes_are_named(device):
    assert nbx.empty(2**62, 2, 0, device=device).shape == (2**62, 2, 0)    # empty: valid
    for size, err, text in ((10**30, ValueError, "does not fit int64"),
                            (2**63, ValueError, "does not fit int64"),
                            (-1, ValueError, ">= 0"), (2.5, TypeError, "float 2.5"),
                            (True, TypeError, "bool")):
        with pytest.raises(err, match=text):
            nbx.empty(size, device=device)
        with pytest.raises(err, match=text):
            nbx.empty(3, size, device=device)


def test_views_whose_element_count_overflows_are_refused(device):
    one = nbx.tensor([2.5], device=device)
    empty = nbx.empty(0, device=device)
    assert one.expand(2**62).shape == (2**62,)               # fits: a valid (expanded) view
    assert empty.view(2**62, 0).shape == (2**62, 0)
    for f, text in ((lambda: one.expand(2**40, 2**40), "expand"),
                    (lambda: one.broadcast_to((2**62, 4)), "expand"),
                    (lambda: one.expand(2**62, 2) + 1, "expand"),
                    (lambda: one.as_strided((2**40, 2**40), (0, 0)), "as_strided"),
                    (lambda: empty.view(2**64, 0), "int64"),
                    (lambda: empty.reshape(0, 2**70), "int64"),
                    (lambda: empty.unflatten(0, (2**64, 0)), "int64")):
        with pytest.raises(ValueError, match=text):
            f()


def test_repeats_whose_total_overflows(device, no_huge_allocation):
    x = nbx.tensor([1.5, -2.5, 3.5, 4.5], device=device)
    # the int64 sum of the counts wrapped to 0: an empty result, silently
    for r in (2**62, nbx.tensor([2**62] * 4, device=device)):
        with pytest.raises(MemoryError, match="18446744073709551616"):
            nbx.repeat_interleave(x, r)
    with pytest.raises(OverflowError, match="repeats"):
        nbx.repeat_interleave(x, 2**64)
    with pytest.raises(ValueError, match="repeat"):
        nbx.empty(2, 0, device=device).repeat(2**62, 1)      # a dim of 2**63 in an empty result
    np.testing.assert_array_equal(nbx.repeat_interleave(x, 2).numpy(), np.repeat(x.numpy(), 2))


def test_allocator_says_what_is_asked_and_what_the_device_has():
    from nbxtensor.backends.cuda import memory
    a = memory.CachingAllocator(memory.FakeRaw(capacity=1 << 30), "cuda:0")
    with pytest.raises(memory.OutOfMemoryError) as ei:
        a.malloc(1 << 40)
    msg = str(ei.value)
    assert "1099511627776 bytes" in msg and "1.00 GiB free of 1.00 GiB" in msg
    assert "more than the device's total of 1073741824 bytes" in msg


def test_driver_raw_never_passes_a_size_that_wraps_size_t(monkeypatch):
    from nbxtensor.backends.cuda import driver, memory
    calls = []
    monkeypatch.setattr(driver, "mem_alloc", lambda n: calls.append(n) or 0x1000)
    monkeypatch.setattr(driver, "set_device", lambda i: None)
    with pytest.raises(memory.RawOutOfMemory, match="size_t"):
        memory.DriverRaw(0).malloc(2**64 + 512)      # ctypes would hand cuMemAlloc 512
    assert calls == []
