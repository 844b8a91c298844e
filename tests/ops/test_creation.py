"""Factories: tensor, from_numpy, empty/zeros/ones/full, arange, linspace, eye, *_like."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng


def test_tensor_inference(device):
    assert nbx.tensor([1, 2], device=device).dtype is nbx.int64
    assert nbx.tensor([1, 2.5], device=device).dtype is nbx.float32
    assert nbx.tensor([True, False], device=device).dtype is nbx.bool
    assert nbx.tensor([True, 2], device=device).dtype is nbx.int64
    assert nbx.tensor(3, device=device).shape == () and nbx.tensor(3).item() == 3
    assert nbx.tensor([], device=device).dtype is nbx.float32
    assert nbx.tensor([[1, 2], [3, 4]], device=device).tolist() == [[1, 2], [3, 4]]
    assert nbx.tensor(np.float16(1.5), device=device).dtype is nbx.float16  # NumPy scalar: its dtype
    for dt in nbx.all_dtypes:
        a = rng().standard_normal((2, 3)).astype(dt.np)
        t = nbx.tensor(a, device=device)
        assert t.dtype is dt and t.device == nbx.device(device)
        np.testing.assert_array_equal(t.numpy(), a)
    t = nbx.tensor([1.7, -2.7], dtype=nbx.int32, device=device)
    assert t.tolist() == [1, -2]
    b = nbx.tensor([0.1, 1e6], dtype="bfloat16", device=device)
    np.testing.assert_array_equal(b.numpy(), np.array([0.1, 1e6]).astype(ml_dtypes.bfloat16))


def test_tensor_copies(device):
    a = np.arange(6.0).reshape(2, 3)
    t = nbx.tensor(a, device=device)
    a[0, 0] = 99
    assert t[0, 0].item() == 0
    u = nbx.tensor(t)  # from a tensor: a copy, on the tensor's device (torch)
    assert u.untyped_storage() is not t.untyped_storage() and u.device == t.device
    assert nbx.tensor(a[:, ::2], device=device).tolist() == [[99.0, 2.0], [3.0, 5.0]]


def test_tensor_errors():
    with pytest.raises(ValueError, match="rectangular"):
        nbx.tensor([[1, 2], [3]])
    with pytest.raises(TypeError, match="got str"):
        nbx.tensor(["a"])
    with pytest.raises(TypeError, match="imaginary"):     # complex data into a real dtype
        nbx.tensor([1j], dtype=nbx.float32)
    with pytest.raises(TypeError, match="data.dtype: unknown or unsupported dtype"):
        nbx.tensor(np.array(["x"]))


def test_from_numpy_zero_copy():
    a = rng().standard_normal((4, 6)).astype(np.float32)
    t = nbx.from_numpy(a)
    assert t.data_ptr() == a.ctypes.data and t.device == "cpu"
    a[1, 2] = 5.0
    assert t[1, 2].item() == 5.0
    t[0, 0] = -3.0
    assert a[0, 0] == -3.0
    s = nbx.from_numpy(a[1:, ::2].T)  # strided: still no copy
    assert s.stride() == (2, 6) and s.data_ptr() == a[1:, ::2].T.ctypes.data
    np.testing.assert_array_equal(s.numpy(), a[1:, ::2].T)
    b = nbx.from_numpy(np.broadcast_to(np.arange(3.0), (2, 3)))
    assert b.stride() == (0, 1) and b.tolist() == [[0, 1, 2], [0, 1, 2]]
    e = nbx.from_numpy(np.zeros((0, 3), np.int8))
    assert e.shape == (0, 3) and e.dtype is nbx.int8
    bf = np.arange(4).astype(ml_dtypes.bfloat16)
    assert nbx.from_numpy(bf).dtype is nbx.bfloat16
    with pytest.raises(ValueError, match="negative strides"):
        nbx.from_numpy(a[::-1])
    with pytest.raises(TypeError, match="expected a numpy.ndarray, got list"):
        nbx.from_numpy([1, 2])
    with pytest.raises(TypeError, match="unknown or unsupported dtype"):
        nbx.from_numpy(np.zeros(2, np.dtype(">c8")))     # complex64 is supported; big-endian not
    rec = np.zeros(4, dtype=[("a", np.int32), ("b", np.int8)])
    with pytest.raises((TypeError, ValueError)):
        nbx.from_numpy(rec["a"])  # strides (5 bytes) are not whole int32 elements


def test_as_tensor():
    a = np.arange(3.0)
    assert nbx.as_tensor(a).data_ptr() == a.ctypes.data
    t = nbx.tensor([1, 2])
    assert nbx.as_tensor(t) is t
    assert nbx.as_tensor(a, dtype=nbx.float32).dtype is nbx.float32


def test_fill_factories(device):
    z = nbx.zeros(2, 3, device=device)
    assert z.shape == (2, 3) and z.dtype is nbx.float32 and z.tolist() == [[0.0] * 3] * 2
    assert nbx.zeros((2, 3), device=device).shape == (2, 3)
    assert nbx.zeros([4], dtype=nbx.int8, device=device).tolist() == [0] * 4
    assert nbx.ones(3, dtype=nbx.bfloat16, device=device).tolist() == [1.0] * 3
    assert nbx.ones((), device=device).shape == ()
    assert nbx.full((2,), 7, device=device).dtype is nbx.int64
    assert nbx.full((2,), True, device=device).dtype is nbx.bool
    assert nbx.full((2,), 2.5, device=device).tolist() == [2.5, 2.5]
    assert nbx.full((2,), 2.5, dtype=nbx.float16, device=device).dtype is nbx.float16
    e = nbx.empty(3, 0, device=device)
    assert e.shape == (3, 0) and e.numel() == 0
    x = nbx.tensor([[1, 2]], dtype=nbx.int16, device=device)
    for f, v in ((nbx.zeros_like, 0), (nbx.ones_like, 1)):
        y = f(x)
        assert y.shape == x.shape and y.dtype is nbx.int16 and y.device == x.device
        assert y.tolist() == [[v, v]]
    assert nbx.full_like(x, 5).tolist() == [[5, 5]]
    assert nbx.empty_like(x, dtype=nbx.float64).dtype is nbx.float64
    assert nbx.zeros_like(x, device="cpu").device == "cpu"
    with pytest.raises(ValueError, match=r"size: expected sizes >= 0, got -1"):
        nbx.zeros(2, -1, device=device)
    with pytest.raises(TypeError, match=r"size: expected a sequence of ints, got float"):
        nbx.ones(2.5)
    with pytest.raises(TypeError, match="full: fill_value must be a number, got str"):
        nbx.full((2,), "x")
    with pytest.raises(TypeError, match="input: expected a Tensor"):
        nbx.zeros_like([1, 2])


def test_arange(device):
    assert nbx.arange(5, device=device).tolist() == [0, 1, 2, 3, 4]
    assert nbx.arange(5, device=device).dtype is nbx.int64
    assert nbx.arange(2, 11, 3, device=device).tolist() == [2, 5, 8]
    assert nbx.arange(5, 0, -2, device=device).tolist() == [5, 3, 1]
    f = nbx.arange(0, 1, 0.25, device=device)
    assert f.dtype is nbx.float32 and f.tolist() == [0, 0.25, 0.5, 0.75]
    assert nbx.arange(0.0, 1.0, 0.1).shape == (10,)
    assert nbx.arange(3, dtype=nbx.float16, device=device).tolist() == [0.0, 1.0, 2.0]
    assert nbx.arange(0, device=device).shape == (0,)
    # 0-dim tensor arguments act as their values: int tensors give int64 (torch)
    t = nbx.arange(nbx.tensor(1), nbx.tensor(7), nbx.tensor(2), device=device)
    assert t.dtype is nbx.int64 and t.tolist() == [1, 3, 5]
    assert nbx.arange(nbx.tensor(2.5)).tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="step must be nonzero"):
        nbx.arange(0, 3, 0)
    with pytest.raises(ValueError, match="inconsistent with step sign"):
        nbx.arange(0, 3, -1)
    with pytest.raises(ValueError, match="end must be a finite number"):
        nbx.arange(0, float("inf"))


def test_linspace_eye(device):
    ls = nbx.linspace(0, 1, 5, device=device)
    np.testing.assert_allclose(ls.numpy(), np.linspace(0, 1, 5, dtype=np.float32))
    assert ls.dtype is nbx.float32
    assert nbx.linspace(-1, 1, 1, device=device).tolist() == [-1.0]
    assert nbx.linspace(0, 1, 0, device=device).shape == (0,)
    assert nbx.linspace(0, 10, 4, dtype=nbx.int64, device=device).tolist() == [0, 3, 6, 10]
    with pytest.raises(ValueError, match="steps must be a non-negative int"):
        nbx.linspace(0, 1, -1)
    np.testing.assert_array_equal(nbx.eye(3, device=device).numpy(), np.eye(3))
    np.testing.assert_array_equal(nbx.eye(2, 4, dtype=nbx.int32, device=device).numpy(),
                                  np.eye(2, 4, dtype=np.int32))
    with pytest.raises(ValueError, match="eye: n must be a non-negative int"):
        nbx.eye(-1)


def test_scalar_tensor(device):
    s = nbx.scalar_tensor(3, device=device)
    assert s.shape == () and s.dtype is nbx.float32 and s.item() == 3.0
