"""Tensor's shorthand casts (float() ... bool()), size()/stride() per dim, and the public
dtype names: each against an independent NumPy reference or the dtype table."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor import dtypes as _dt

from helpers import rng

CASTS = [("float", nbx.float32), ("double", nbx.float64), ("half", nbx.float16),
         ("bfloat16", nbx.bfloat16), ("int", nbx.int32), ("long", nbx.int64),
         ("bool", nbx.bool)]


@pytest.mark.parametrize("name,dtype", CASTS)
def test_tensor_cast_shorthand(name, dtype, device):
    g = rng()
    a = g.uniform(-300, 300, (5, 37))
    if dtype.is_floating_point or dtype is nbx.bool:
        a[0, :3] = [np.nan, np.inf, -np.inf]     # ints: NaN/inf have no defined cast
    a[1, :2] = 0.0                               # bool: zeros give False
    x = nbx.tensor(a, device=device).t()         # non-contiguous input
    y = getattr(x, name)()
    assert y.dtype == dtype and y.shape == (37, 5) and y.device == x.device
    want = a.T.astype(dtype.np)
    got = y.numpy()
    if dtype.is_floating_point:
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))
    else:
        np.testing.assert_array_equal(got, want)
    empty = getattr(nbx.zeros(0, 3, device=device), name)()
    assert empty.dtype == dtype and empty.shape == (0, 3)


@pytest.mark.parametrize("name,dtype", CASTS)
def test_tensor_cast_shorthand_of_its_own_dtype_is_self(name, dtype):
    x = nbx.zeros(4, dtype=dtype)
    assert getattr(x, name)() is x                # as torch's .to: no copy when nothing changes
    method = getattr(nbx.Tensor, name)
    assert method.__name__ == name and dtype.name in method.__doc__


def test_size_and_stride_per_dim(device):
    x = nbx.zeros(3, 4, 5, device=device).permute(2, 0, 1)
    assert x.size() == (5, 3, 4) and isinstance(x.size(), nbx.Size)
    assert x.stride() == (1, 20, 5)
    for d in range(-3, 3):
        assert x.size(d) == (5, 3, 4)[d] and x.stride(d) == (1, 20, 5)[d]
    for method in (x.size, x.stride):
        with pytest.raises(IndexError, match="out of range"):
            method(3)
        with pytest.raises(IndexError, match="out of range"):
            method(-4)
    s = nbx.tensor(1.0, device=device)
    assert s.size() == () and s.stride() == ()
    for method in (s.size, s.stride):
        with pytest.raises(IndexError, match="no dimensions"):
            method(0)


def test_public_dtype_names_are_the_table_rows():
    for d in _dt.all_dtypes + _dt.complex_dtypes:
        assert getattr(_dt, d.name) is d and getattr(nbx, d.name) is d
    assert [d.name for d in _dt.all_dtypes] == [
        "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
        "float64", "float8_e4m3fn", "float8_e5m2"]
    assert [d.name for d in _dt.complex_dtypes] == ["complex64", "complex128"]
    assert (_dt.half, _dt.float, _dt.double) == (nbx.float16, nbx.float32, nbx.float64)
    assert (_dt.long, _dt.int, _dt.short) == (nbx.int64, nbx.int32, nbx.int16)
    assert nbx.float32.np == np.float32 and nbx.bool.np == np.bool_
