"""logcumsumexp on every device against a float64 NumPy running log-add-exp: dims inner and
outer, rows longer than a tile (the carry between tiles), non-contiguous inputs, empty and
0-dim tensors, -inf/inf/NaN, the dtype rules and refusals."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import RTOL, rng

pytestmark = pytest.mark.usefixtures("poison_outputs")

_TOL = {nbx.float32: 2e-5, nbx.float64: 1e-12, nbx.float16: 4e-3, nbx.bfloat16: 3e-2}


def _ref(a, dim):
    """float64 log(cumsum(exp(a))) by the two-term recurrence, written out (not logaddexp)."""
    a = np.moveaxis(a.astype(np.float64), dim, -1)
    out = np.empty_like(a)
    run = np.full(a.shape[:-1], -np.inf)
    with np.errstate(all="ignore"):
        for k in range(a.shape[-1]):
            v = a[..., k]
            mx, mn = np.maximum(run, v), np.minimum(run, v)
            r = mx + np.log1p(np.exp(mn - mx))
            r = np.where((mn == mx) & np.isinf(mx), mx, r)
            run = np.where(np.isnan(run) | np.isnan(v), np.nan, r)
            out[..., k] = run
    return np.moveaxis(out, -1, dim)


def _check(got, a, dim, dtype):
    want = _ref(a, dim)
    g = got.cpu().float().numpy().astype(np.float64) if dtype in (nbx.float16, nbx.bfloat16) \
        else got.cpu().numpy().astype(np.float64)
    tol = _TOL[dtype]
    scale = np.maximum(1.0, np.abs(np.where(np.isfinite(want), want, 0)))
    np.testing.assert_array_equal(np.isnan(g), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(g) & (g > 0), np.isinf(want) & (want > 0))
    np.testing.assert_array_equal(np.isinf(g) & (g < 0), np.isinf(want) & (want < 0))
    fin = np.isfinite(want)
    assert np.all(np.abs(g[fin] - want[fin]) <= tol * scale[fin]), \
        float(np.max(np.abs(g[fin] - want[fin]) / scale[fin]))


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.float16, nbx.bfloat16, nbx.float64])
@pytest.mark.parametrize("shape,dim", [((37,), 0), ((3, 45), 1), ((3, 45), -1), ((5, 19, 7), 1),
                                       ((19, 6), 0), ((2, 3, 33), 2)])
def test_matches_float64_reference(device, dtype, shape, dim):
    a = (rng().standard_normal(shape) * 4).astype(np.float32)
    x = nbx.tensor(a, device=device).to(dtype)
    a = x.cpu().float().numpy() if dtype in (nbx.float16, nbx.bfloat16) else x.cpu().numpy()
    got = nbx.logcumsumexp(x, dim)
    assert got.dtype == dtype and got.shape == x.shape and got.device == x.device
    _check(got, a, dim, dtype)


def test_large_values_do_not_overflow(device):
    # exp(1000) overflows float32 and float64: the scan must work in log space
    a = np.array([[1000.0, 1000.0, -1000.0, 999.0], [-1e4, -1e4, -1e4, -1e4]], np.float32)
    got = nbx.tensor(a, device=device).logcumsumexp(1)
    _check(got, a, 1, nbx.float32)


def test_infinities_and_nan(device):
    inf, nan = np.inf, np.nan
    a = np.array([[-inf, -inf, 0.5, -inf, 2.0, -inf, -inf, -inf, -inf, 1.0, 3.0],
                  [-inf, inf, -inf, 1.0, inf, -inf, 5.0, 2.0, -3.0, 0.0, 1.0],
                  [1.0, 2.0, nan, 3.0, -inf, inf, 0.0, 1.0, 2.0, 3.0, 4.0],
                  [-inf] * 11,
                  [inf, -inf, inf, inf, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], np.float32)
    got = nbx.tensor(a, device=device).logcumsumexp(-1)
    _check(got, a, 1, nbx.float32)
    # the same data scanned along dim 0 (the strided kernel layout)
    got0 = nbx.tensor(np.ascontiguousarray(a.T), device=device).logcumsumexp(1)
    _check(got0, np.ascontiguousarray(a.T), 1, nbx.float32)
    got1 = nbx.tensor(a, device=device).logcumsumexp(0)
    _check(got1, a, 0, nbx.float32)


def test_noncontiguous_and_method(device):
    a = rng().standard_normal((6, 23)).astype(np.float32)
    x = nbx.tensor(a, device=device).t()            # (23, 6), strided
    _check(x.logcumsumexp(0), a.T, 0, nbx.float32)
    e = nbx.tensor(np.ones((4, 9), np.float32), device=device).expand(3, 4, 9)
    _check(nbx.logcumsumexp(e, 2), np.ones((3, 4, 9), np.float32), 2, nbx.float32)


def test_empty_and_zero_dim(device):
    e = nbx.zeros(3, 0, device=device)
    assert nbx.logcumsumexp(e, 1).shape == (3, 0)
    assert nbx.logcumsumexp(nbx.zeros(0, 4, device=device), 1).shape == (0, 4)
    z = nbx.tensor(2.5, device=device)
    r = nbx.logcumsumexp(z, 0)
    assert r.shape == () and float(r.item()) == 2.5
    assert float(nbx.logcumsumexp(z, -1).item()) == 2.5


def test_out(device):
    a = rng().standard_normal((4, 10)).astype(np.float32)
    out = nbx.full((4, 10), float("nan"), device=device)
    r = nbx.logcumsumexp(nbx.tensor(a, device=device), 1, out=out)
    assert r is out
    _check(out, a, 1, nbx.float32)


def test_refusals(device):
    with pytest.raises(TypeError, match="logcumsumexp: input must be float16.*got int64"):
        nbx.logcumsumexp(nbx.arange(4, device=device), 0)
    with pytest.raises(TypeError, match="got bool"):
        nbx.logcumsumexp(nbx.ones(2, dtype=nbx.bool, device=device), 0)
    with pytest.raises(IndexError):
        nbx.logcumsumexp(nbx.ones(2, 3, device=device), 2)
    with pytest.raises(TypeError, match="dim must be an int"):
        nbx.logcumsumexp(nbx.ones(2, device=device), None)
    with pytest.raises(TypeError, match="dtype"):
        nbx.logcumsumexp(nbx.ones(2, device=device), 0, dtype=nbx.float64)
