"""unique(dim=...) and the matrix norms (linalg.matrix_norm, linalg.norm's dispatch), every
device, against float64 NumPy (np.unique(axis=...), np.linalg.norm)."""
import math

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import assert_close, poisoned, randn, rng, to64


# ------------------------------------------------------------------ unique(dim=...)
def _dups(a, axis, gen):
    """Copy some slices onto others along `axis` so there are whole-slice duplicates."""
    a = np.moveaxis(a.copy(), axis, 0)
    n = a.shape[0]
    for _ in range(max(1, n // 2)):
        a[gen.integers(n)] = a[gen.integers(n)]
    return np.moveaxis(a, 0, axis)


def _check_unique_dim(x, a, dim):
    v, inv, cnt = nbx.unique(x, return_inverse=True, return_counts=True, dim=dim)
    rv, ri, rc = np.unique(a, axis=dim, return_inverse=True, return_counts=True)
    assert v.dtype == x.dtype and v.device == x.device
    assert inv.dtype == nbx.int64 and cnt.dtype == nbx.int64
    np.testing.assert_array_equal(to64(v), rv.astype(np.float64))
    np.testing.assert_array_equal(inv.numpy(), ri.reshape(-1))
    np.testing.assert_array_equal(cnt.numpy(), rc)
    # the inverse rebuilds the input
    np.testing.assert_array_equal(to64(v.index_select(dim, inv)), a.astype(np.float64))


@pytest.mark.parametrize("dtype", [nbx.int64, nbx.int32, nbx.uint8, nbx.float32, nbx.float64,
                                   nbx.float16])
@pytest.mark.parametrize("shape,dim", [((9, 4), 0), ((9, 4), 1), ((5, 7), -1), ((6, 3, 4), 0),
                                       ((3, 6, 2), 1), ((3, 2, 7), -1), ((4, 3, 5), 2)])
def test_unique_dim(device, dtype, shape, dim):
    gen = rng()
    # few distinct values: many ties within a column, so the lexicographic order is exercised
    a = gen.integers(0, 3, shape).astype(np.float64)
    if dtype.is_floating_point:
        a = a + gen.choice([-0.5, 0.25], shape)
    a = _dups(a, dim, gen).astype(dtype.np)
    _check_unique_dim(nbx.tensor(a, device=device), a, dim)


def test_unique_dim_bool_and_noncontiguous(device):
    gen = rng()
    a = gen.random((11, 3)) < 0.5
    _check_unique_dim(nbx.tensor(a, device=device), a, 0)
    b = _dups(gen.integers(-2, 2, (5, 8)), 1, gen).astype(np.float32)
    xt = nbx.tensor(np.ascontiguousarray(b.T), device=device).t()     # a transposed view
    assert not xt.is_contiguous()
    _check_unique_dim(xt, b, 1)
    _check_unique_dim(xt, b, 0)
    # a stepped slice
    c = _dups(gen.integers(0, 2, (6, 10, 3)), 0, gen).astype(np.int64)
    xs = nbx.tensor(c, device=device)[:, ::3]
    _check_unique_dim(xs, c[:, ::3], 0)
    _check_unique_dim(xs, c[:, ::3], 2)


def test_unique_dim_wide_random_rows(device):
    # random floats: (almost) all rows distinct, so the order is fully lexicographic
    gen = rng()
    a = gen.standard_normal((37, 3))
    a[5] = a[30]
    a[7, 0] = a[8, 0]  # a tie in the first column broken by the second
    _check_unique_dim(nbx.tensor(a, device=device), a, 0)


def test_unique_dim_return_forms(device):
    a = np.array([[1, 2], [0, 5], [1, 2]], dtype=np.int64)
    x = nbx.tensor(a, device=device)
    v = nbx.unique(x, dim=0)
    assert isinstance(v, nbx.Tensor)
    np.testing.assert_array_equal(v.numpy(), [[0, 5], [1, 2]])
    v, inv = nbx.unique(x, dim=0, return_inverse=True)
    np.testing.assert_array_equal(inv.numpy(), [1, 0, 1])
    v, cnt = nbx.unique(x, dim=0, return_counts=True)
    np.testing.assert_array_equal(cnt.numpy(), [1, 2])
    v = x.unique(dim=1)   # the Tensor method; columns [1,0,1] and [2,5,2]
    np.testing.assert_array_equal(v.numpy(), a)
    v = nbx.unique(x, sorted=False, dim=0)     # always sorted, as torch on cuda
    np.testing.assert_array_equal(v.numpy(), [[0, 5], [1, 2]])


def test_unique_dim_empty(device):
    # no slices along dim: an empty result of the input's shape, empty inverse and counts
    x = nbx.tensor(np.zeros((0, 3), np.float32), device=device)
    v, inv, cnt = nbx.unique(x, dim=0, return_inverse=True, return_counts=True)
    assert tuple(v.shape) == (0, 3) and tuple(inv.shape) == (0,) and tuple(cnt.shape) == (0,)
    assert inv.dtype == nbx.int64 and cnt.dtype == nbx.int64
    # empty slices: all equal, one unique slice
    x = nbx.tensor(np.zeros((4, 0), np.int64), device=device)
    v, inv, cnt = nbx.unique(x, dim=0, return_inverse=True, return_counts=True)
    assert tuple(v.shape) == (1, 0)
    np.testing.assert_array_equal(inv.numpy(), [0, 0, 0, 0])
    np.testing.assert_array_equal(cnt.numpy(), [4])
    v = nbx.unique(x, dim=1)
    assert tuple(v.shape) == (4, 0)


def test_unique_dim_nan(device):
    # documented: a row holding a NaN never equals another row; NaN sorts after numbers
    nan = float("nan")
    a = np.array([[nan, 1.0], [0.0, 2.0], [nan, 1.0], [0.0, 2.0], [0.0, nan]], np.float32)
    v, inv, cnt = nbx.unique(nbx.tensor(a, device=device), dim=0, return_inverse=True,
                             return_counts=True)
    exp = np.array([[0.0, 2.0], [0.0, nan], [nan, 1.0], [nan, 1.0]], np.float32)
    np.testing.assert_array_equal(v.numpy(), exp)
    np.testing.assert_array_equal(inv.numpy(), [2, 0, 3, 0, 1])
    np.testing.assert_array_equal(cnt.numpy(), [2, 1, 1, 1])


def test_unique_dim_errors(device):
    x = nbx.tensor(np.arange(6).reshape(2, 3), device=device)
    with pytest.raises(IndexError, match="dim"):
        nbx.unique(x, dim=2)
    with pytest.raises(TypeError, match="dim must be an int"):
        nbx.unique(x, dim=(0, 1))
    with pytest.raises(IndexError, match="0-dim"):
        nbx.unique(nbx.tensor(3, device=device), dim=0)


def test_unique_flat_unchanged(device):
    a = np.array([3, 1, 3, 2, 1], np.int64)
    v, inv, cnt = nbx.unique(nbx.tensor(a, device=device), return_inverse=True,
                             return_counts=True)
    np.testing.assert_array_equal(v.numpy(), [1, 2, 3])
    np.testing.assert_array_equal(inv.numpy(), [2, 0, 2, 1, 0])
    np.testing.assert_array_equal(cnt.numpy(), [2, 1, 2])


# ------------------------------------------------------------------ matrix norms
_CHEAP = ["fro", 1, -1, math.inf, -math.inf]
_SVD = ["nuc", 2, -2]


def _ref(a, ord, dim, keepdim):
    return np.linalg.norm(a.astype(np.float64), ord, axis=dim, keepdims=keepdim)


@pytest.mark.parametrize("ord", _CHEAP)
@pytest.mark.parametrize("dim", [(-2, -1), (0, 2), (2, 0), (1, -1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_matrix_norm(device, ord, dim, keepdim):
    x = randn((3, 5, 33), nbx.float32, device)     # 33 = 32 + 1 overhangs the reduce blocks
    r = nbx.linalg.matrix_norm(x, ord, dim, keepdim)
    assert r.dtype == nbx.float32 and r.device == x.device
    assert_close(r, _ref(to64(x), ord, dim, keepdim), nbx.float32)


@pytest.mark.parametrize("ord", _CHEAP + _SVD)
def test_matrix_norm_cpu_svd_and_batched(ord):
    x = randn((2, 3, 6, 4), nbx.float64)
    for dim in [(-2, -1), (1, 3), (3, 1)]:
        for keepdim in (False, True):
            r = nbx.linalg.matrix_norm(x, ord, dim, keepdim)
            assert_close(r, _ref(to64(x), ord, dim, keepdim), nbx.float64)
    r = nbx.linalg.matrix_norm(randn((7, 3), nbx.float32), ord)
    assert r.dtype == nbx.float32


@pytest.mark.parametrize("ord", _SVD)
def test_matrix_norm_svd_refused_off_cpu(device, ord):
    x = randn((4, 3), nbx.float32, device)
    if device == "cpu":
        assert_close(nbx.linalg.matrix_norm(x, ord), _ref(to64(x), ord, (-2, -1), False),
                     nbx.float32)
        return
    with pytest.raises(NotImplementedError, match=r"needs singular values.*cpu device only.*\.cpu\(\)"):
        nbx.linalg.matrix_norm(x, ord)
    with pytest.raises(NotImplementedError, match="singular values"):
        nbx.linalg.norm(x, ord)


def test_matrix_norm_dtype_noncontig_out(device):
    x = randn((4, 9, 6), nbx.float32, device)
    r = nbx.linalg.matrix_norm(x, 1, dtype=nbx.float64)
    assert r.dtype == nbx.float64
    assert_close(r, _ref(to64(x), 1, (-2, -1), False), nbx.float64, rtol=1e-6)
    xt = x.transpose(0, 2)                         # non-contiguous (6, 9, 4)
    for ord in _CHEAP:
        assert_close(nbx.linalg.matrix_norm(xt, ord, (0, 1)), _ref(to64(xt), ord, (0, 1), False),
                     nbx.float32)
    h = randn((5, 7), nbx.float16, device)
    assert_close(nbx.linalg.matrix_norm(h, "fro"), _ref(to64(h), "fro", (-2, -1), False),
                 nbx.float16)
    i = nbx.tensor(np.arange(1, 13).reshape(3, 4), device=device)
    with pytest.raises(TypeError, match="floating point"):
        nbx.linalg.matrix_norm(i)
    assert_close(nbx.linalg.matrix_norm(i, math.inf, dtype=nbx.float32),
                 _ref(np.arange(1, 13).reshape(3, 4), math.inf, (-2, -1), False), nbx.float32)
    for ord in ("fro", -1):
        out = poisoned((4,), nbx.float32, device)
        res = nbx.linalg.matrix_norm(x, ord, (1, 2), out=out)
        assert res is out
        assert_close(out, _ref(to64(x), ord, (1, 2), False), nbx.float32)


def test_matrix_norm_empty(device):
    x = nbx.tensor(np.zeros((0, 3), np.float32), device=device)
    assert_close(nbx.linalg.matrix_norm(x), np.float64(0.0), nbx.float32)
    assert_close(nbx.linalg.matrix_norm(x, 1), np.float64(0.0), nbx.float32)  # max of 3 zeros
    with pytest.raises(IndexError):
        nbx.linalg.matrix_norm(x, math.inf)       # max over no rows: no identity
    b = nbx.tensor(np.zeros((0, 2, 3), np.float32), device=device)
    assert tuple(nbx.linalg.matrix_norm(b, 1).shape) == (0,)


def test_matrix_norm_errors(device):
    x = randn((3, 4), nbx.float32, device)
    mn = nbx.linalg.matrix_norm
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        mn(randn((4,), nbx.float32, device))
    with pytest.raises(ValueError, match="ord must be one of"):
        mn(x, 3)
    with pytest.raises(ValueError, match="ord must be one of"):
        mn(x, "foo")
    with pytest.raises(ValueError, match="ord must be one of"):
        mn(x, True)
    with pytest.raises(ValueError, match="2-tuple"):
        mn(x, "fro", (0,))
    with pytest.raises(ValueError, match="two different"):
        mn(x, "fro", (1, -1))
    with pytest.raises(IndexError):
        mn(x, "fro", (0, 2))
    if device == "cpu":
        with pytest.raises(TypeError, match="float32 and float64"):
            mn(randn((3, 3), nbx.float16), "nuc")


def test_linalg_norm_dispatch(device):
    x3 = randn((3, 4, 5), nbx.float32, device)
    a3 = to64(x3)
    x2 = randn((6, 5), nbx.float32, device)
    a2 = to64(x2)
    norm = nbx.linalg.norm
    # ord None, dim None: 2-norm of the flattened input, whatever the ndim
    assert_close(norm(x3), np.linalg.norm(a3.ravel()), nbx.float32)
    # ord given on 2-D input: a matrix norm (the 1-norm differs from the vector 1-norm)
    assert_close(norm(x2, 1), np.linalg.norm(a2, 1), nbx.float32)
    assert_close(norm(x2, math.inf), np.linalg.norm(a2, math.inf), nbx.float32)
    assert_close(norm(x2, "fro"), np.linalg.norm(a2, "fro"), nbx.float32)
    # 2-tuple dim: matrix norm; ord None over 2 dims is the Frobenius norm
    assert_close(norm(x3, -1, (2, 0), keepdim=True), np.linalg.norm(a3, -1, (2, 0), True),
                 nbx.float32)
    assert_close(norm(x3, None, (0, 1)), np.linalg.norm(a3, None, (0, 1)), nbx.float32)
    # 1-D dim (int or 1-tuple): vector norm
    assert_close(norm(x3, 3, 1), np.linalg.norm(a3, 3, 1), nbx.float32)
    assert_close(norm(x3, 1, (-1,), True), np.linalg.norm(a3, 1, -1, True), nbx.float32)
    # ord on 1-D input: vector norm
    v = randn((17,), nbx.float32, device)
    assert_close(norm(v, 1), np.abs(to64(v)).sum(), nbx.float32)
    assert_close(norm(x2, dtype=nbx.float64), np.linalg.norm(a2), nbx.float64, rtol=1e-6)
    with pytest.raises(ValueError, match="1-D or 2-D"):
        norm(x3, 2)
    with pytest.raises(ValueError, match="2-tuple"):
        norm(x3, "fro", 1)
    with pytest.raises(ValueError, match="1 or 2"):
        norm(x3, None, (0, 1, 2))
    # torch.norm (the top-level nbx.norm) stays the vector norm
    assert_close(nbx.norm(x2, 1), np.abs(a2).sum(), nbx.float32)


def test_unique_dim_signed_zero(device):
    # -0.0 == 0.0: equal keys, so the order falls to the next column, as NumPy
    a = np.array([[0.0, 0.0], [-0.0, 1.0], [0.0, -1.0], [-0.0, 0.0]], np.float32)
    v, inv = nbx.unique(nbx.tensor(a, device=device), dim=0, return_inverse=True)
    np.testing.assert_array_equal(v.numpy(), np.unique(a, axis=0))
    np.testing.assert_array_equal(inv.numpy(), [1, 2, 0, 1])
