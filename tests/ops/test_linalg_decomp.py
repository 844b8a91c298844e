"""The LU family (lu_factor[_ex], lu, lu_solve, solve[_ex], inv[_ex], det, slogdet), cholesky[_ex],
qr, eigh/eigvalsh and solve_triangular on every device (NumPy on cpu, kernels/linalg.py's Triton kernels on
interp and cuda) against float64 NumPy: odd sizes that overhang the power-of-two tiles,
batches, broadcasting, non-contiguous inputs, singular and indefinite matrices (torch's errors
and info codes), NaN, the size limit off the cpu."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng

L = nbx.linalg
pytestmark = pytest.mark.usefixtures("poison_outputs")
DTYPES = [nbx.float32, nbx.float64]
SIZES = [1, 3, 7, 17]


def _tol(dtype, cond=1.0):
    return (2e-4 if dtype == nbx.float32 else 1e-10) * cond


def _mat(shape, dtype, device, g=None, shift=0.0):
    g = g or rng()
    a = g.standard_normal(shape)
    if shift:
        a = a + shift * np.eye(shape[-1])
    return a.astype(dtype.np), nbx.tensor(a.astype(dtype.np), device=device)


def _close(got, want, tol):
    g = got.cpu().numpy().astype(np.float64) if isinstance(got, nbx.Tensor) else got
    want = np.asarray(want, np.float64)
    assert g.shape == want.shape, (g.shape, want.shape)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(g, want, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_lu_factor_reconstructs(device, dtype, n):
    a, A = _mat((2, 2, n, n), dtype, device)
    LU, piv, info = L.lu_factor_ex(A)
    assert LU.dtype == dtype and piv.dtype == nbx.int32 and info.dtype == nbx.int32
    assert piv.shape == (2, 2, n) and info.shape == (2, 2)
    assert not info.cpu().numpy().any()
    P, Lo, U = L.lu(A)
    _close(P @ Lo @ U, a.astype(np.float64), _tol(dtype))
    lo, up = Lo.cpu().numpy(), U.cpu().numpy()
    np.testing.assert_array_equal(np.triu(lo, 1), 0)
    np.testing.assert_array_equal(np.diagonal(lo, 0, -2, -1), 1)
    np.testing.assert_array_equal(np.tril(up, -1), 0)
    assert np.all(np.abs(lo) <= 1 + 1e-6)                     # partial pivoting: |l| <= 1
    # the packed LU is L - I + U, and the pivots are LAPACK's row swaps
    _close(LU, lo - np.eye(n) + up, 0)
    perm = np.arange(n)
    pv = piv.cpu().numpy()[1, 1] - 1
    for j, p in enumerate(pv):
        perm[[j, p]] = perm[[p, j]]
    pm = P.cpu().numpy()[1, 1]
    np.testing.assert_array_equal(pm[perm, np.arange(n)], 1)


@pytest.mark.parametrize("shape", [(5, 3), (3, 6), (2, 9, 4)])
def test_lu_rectangular(device, shape):
    a, A = _mat(shape, nbx.float64, device)
    P, Lo, U = L.lu(A)
    k = min(shape[-2:])
    assert Lo.shape[-2:] == (shape[-2], k) and U.shape[-2:] == (k, shape[-1])
    _close(P @ Lo @ U, a, 1e-12)
    LU, piv = L.lu_factor(A)
    assert LU.shape == A.shape and piv.shape == tuple(shape[:-2]) + (k,)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 11])
def test_solve_inv_det_slogdet(device, dtype, n):
    g = rng()
    a, A = _mat((2, n, n), dtype, device, g, shift=2.0)
    b, B = _mat((2, n, 5), dtype, device, g)
    a64 = a.astype(np.float64)
    cond = float(np.linalg.cond(a64).max())
    _close(L.solve(A, B), np.linalg.solve(a64, b), _tol(dtype, cond))
    _close(L.solve(A, B[:, :, 0]), np.linalg.solve(a64, b[:, :, :1])[..., 0], _tol(dtype, cond))
    bl = g.standard_normal((2, 3, n)).astype(dtype.np)
    _close(L.solve(A, nbx.tensor(bl, device=device), left=False),
           np.swapaxes(np.linalg.solve(np.swapaxes(a64, -1, -2), np.swapaxes(bl, -1, -2)), -1, -2),
           _tol(dtype, cond))
    _close(L.inv(A), np.linalg.inv(a64), _tol(dtype, cond))
    _close(nbx.inverse(A), np.linalg.inv(a64), _tol(dtype, cond))
    _close(L.det(A), np.linalg.det(a64), _tol(dtype, cond))
    s, ld = L.slogdet(A)
    s0, ld0 = np.linalg.slogdet(a64)
    np.testing.assert_array_equal(s.cpu().numpy(), s0)
    _close(ld, ld0, _tol(dtype, cond))
    x, info = L.solve_ex(A, B)
    _close(x, np.linalg.solve(a64, b), _tol(dtype, cond))
    assert not info.cpu().numpy().any()
    LU, piv = L.lu_factor(A)
    _close(L.lu_solve(LU, piv, B), np.linalg.solve(a64, b), _tol(dtype, cond))
    _close(L.lu_solve(LU, piv, B, adjoint=True),
           np.linalg.solve(np.swapaxes(a64, -1, -2), b), _tol(dtype, cond))
    _close(L.lu_solve(LU, piv, nbx.tensor(bl, device=device), left=False),
           np.swapaxes(np.linalg.solve(np.swapaxes(a64, -1, -2), np.swapaxes(bl, -1, -2)), -1, -2),
           _tol(dtype, cond))


def test_broadcast_and_strided_inputs(device):
    g = rng()
    a, A = _mat((3, 1, 6, 6), nbx.float64, device, g, shift=3.0)
    b = g.standard_normal((2, 6, 4))
    B = nbx.tensor(b, device=device)
    want = np.linalg.solve(np.broadcast_to(a, (3, 2, 6, 6)), np.broadcast_to(b, (3, 2, 6, 4)))
    _close(L.solve(A, B), want, 1e-11)          # (3, 2, 6, 4)
    at = nbx.tensor(np.ascontiguousarray(np.swapaxes(a, -1, -2)), device=device).mT  # strided
    _close(L.solve(at, B), want, 1e-11)
    _close(L.det(at[..., ::1, :]), np.linalg.det(a), 1e-11)
    c = g.standard_normal((2, 12, 12)) + 4 * np.eye(12)
    big = nbx.tensor(c, device=device)[:, ::2, ::2]                  # every other entry
    _close(L.inv(big), np.linalg.inv(c[:, ::2, ::2]), 1e-9)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_cholesky(device, dtype, n):
    g = rng()
    m = g.standard_normal((3, n, n))
    spd = m @ np.swapaxes(m, -1, -2) + n * np.eye(n)
    A = nbx.tensor(spd.astype(dtype.np), device=device)
    want = np.linalg.cholesky(spd.astype(dtype.np).astype(np.float64))
    _close(L.cholesky(A), want, _tol(dtype, 10))
    _close(L.cholesky(A, upper=True), np.swapaxes(want, -1, -2), _tol(dtype, 10))
    # only the lower triangle is read: garbage above the diagonal changes nothing
    junk = spd + np.triu(g.standard_normal((3, n, n)) * 100, 1)
    _close(L.cholesky(nbx.tensor(junk.astype(dtype.np), device=device)), want, _tol(dtype, 10))
    lo, info = L.cholesky_ex(A)
    _close(lo, want, _tol(dtype, 10))
    assert info.shape == (3,) and not info.cpu().numpy().any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("n", [1, 5, 17])
def test_solve_triangular(device, dtype, upper, n):
    g = rng()
    a = g.standard_normal((2, n, n)) + 4 * np.eye(n)
    tri = np.triu(a) if upper else np.tril(a)
    b = g.standard_normal((2, n, 11))                   # 11 columns overhang the column block
    A, B = (nbx.tensor(x.astype(dtype.np), device=device) for x in (a, b))
    a, b = a.astype(dtype.np).astype(np.float64), b.astype(dtype.np).astype(np.float64)
    tri = np.triu(a) if upper else np.tril(a)
    _close(L.solve_triangular(A, B, upper=upper), np.linalg.solve(tri, b), _tol(dtype, 10))
    unit = tri - np.diagonal(tri, 0, -2, -1)[..., None] * np.eye(n) + np.eye(n)
    _close(L.solve_triangular(A, B, upper=upper, unitriangular=True), np.linalg.solve(unit, b),
           _tol(dtype, 1e3))
    bt = g.standard_normal((2, 3, n))
    Bt = nbx.tensor(bt.astype(dtype.np), device=device)
    bt = bt.astype(dtype.np).astype(np.float64)
    _close(L.solve_triangular(A, Bt, upper=upper, left=False),
           np.swapaxes(np.linalg.solve(np.swapaxes(tri, -1, -2), np.swapaxes(bt, -1, -2)), -1, -2),
           _tol(dtype, 10))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (5, 5), (9, 4), (3, 7), (2, 6, 6), (2, 1, 5, 1)])
def test_qr_matches_lapack(device, dtype, shape):
    a = rng().standard_normal(shape).astype(dtype.np)
    A = nbx.tensor(a, device=device)
    a = a.astype(np.float64)
    k = min(shape[-2:])
    for mode in ("reduced", "complete"):
        Q, R = L.qr(A, mode=mode)
        q0, r0 = np.linalg.qr(a, mode=mode)       # LAPACK's signs, as torch's
        assert Q.dtype == dtype and Q.shape == q0.shape and R.shape == r0.shape
        _close(Q, q0, _tol(dtype, 10))
        _close(R, r0, _tol(dtype, 10))
        np.testing.assert_array_equal(np.tril(R.cpu().numpy(), -1), 0)
    Q, R = L.qr(A)
    _close(Q @ R, a, _tol(dtype, 10))
    _close(Q.mT @ Q, np.broadcast_to(np.eye(k), Q.shape[:-2] + (k, k)), _tol(dtype, 10))
    q, r = L.qr(A, mode="r")
    assert q.shape == (0,)
    _close(r, np.linalg.qr(a, mode="r"), _tol(dtype, 10))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 5])
def test_eigh(device, dtype, n):
    g = rng()
    m = g.standard_normal((2, n, n))
    sym = (m + np.swapaxes(m, -1, -2)).astype(dtype.np)
    a = sym.astype(np.float64)
    w0, v0 = np.linalg.eigh(a)
    tol = _tol(dtype, 10)
    for uplo, given in (("L", np.tril(sym)), ("U", np.triu(sym))):
        # only the named triangle is read: the other holds junk
        junk = given + (np.triu(g.standard_normal((n, n)), 1) if uplo == "L"
                        else np.tril(g.standard_normal((n, n)), -1)).astype(dtype.np) * 50
        w, v = L.eigh(nbx.tensor(junk, device=device), UPLO=uplo)
        assert w.dtype == dtype and v.dtype == dtype and v.shape == (2, n, n)
        _close(w, w0, tol)
        W, V = w.cpu().numpy().astype(np.float64), v.cpu().numpy().astype(np.float64)
        assert np.all(np.diff(W, axis=-1) >= 0)                       # ascending
        _close(V @ (W[..., :, None] * np.swapaxes(V, -1, -2)), a, tol)
        _close(np.swapaxes(V, -1, -2) @ V, np.broadcast_to(np.eye(n), V.shape), tol)
        # the same vectors as LAPACK's up to sign (random spectra have no repeated values)
        _close(np.abs(np.einsum("bij,bij->bj", V, v0)), np.ones((2, n)), tol * 10)
        if uplo == "U":
            _close(L.eigvalsh(nbx.tensor(junk, device=device), UPLO=uplo), w0, tol)
    with pytest.raises(ValueError, match="UPLO"):
        L.eigh(nbx.tensor(sym, device=device), UPLO="X")


def test_eigh_repeated_and_diagonal(device):
    d = nbx.tensor(np.diag([3.0, -1.0, 3.0, 0.0]), device=device)
    w, v = L.eigh(d)
    np.testing.assert_allclose(w.cpu().numpy(), [-1.0, 0.0, 3.0, 3.0])
    V = v.cpu().numpy()
    np.testing.assert_allclose(V.T @ V, np.eye(4), atol=1e-12)
    np.testing.assert_allclose(V @ np.diag(w.cpu().numpy()) @ V.T, d.cpu().numpy(), atol=1e-12)


def test_qr_degenerate(device):
    z = nbx.zeros(3, 3, device=device)
    Q, R = L.qr(z)
    np.testing.assert_array_equal(Q.cpu().numpy(), np.eye(3))     # no reflection, as geqrf
    np.testing.assert_array_equal(R.cpu().numpy(), 0)
    a = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 0.0]])   # rank 2
    Q, R = L.qr(nbx.tensor(a, device=device))
    _close(Q @ R, a, 1e-12)
    _close(Q, np.linalg.qr(a)[0], 1e-12)
    with pytest.raises(ValueError, match="unrecognized mode"):
        L.qr(z, mode="full")


def test_singular_matrices(device):
    s = nbx.tensor([[1.0, 2.0], [2.0, 4.0]], device=device)
    batch = nbx.stack([nbx.eye(2, device=device), s])
    with pytest.raises(L.LinAlgError, match=r"linalg.inv: The diagonal element 2 is zero"):
        L.inv(s)
    with pytest.raises(RuntimeError, match=r"\(Batch element 1\): linalg.inv"):
        L.inv(batch)
    with pytest.raises(L.LinAlgError, match="The solver failed because the input matrix is "
                                            "singular"):
        L.solve(s, nbx.ones(2, device=device))
    with pytest.raises(L.LinAlgError, match=r"U\[2,2\] is zero"):
        L.lu_factor(s)
    LU, piv, info = L.lu_factor_ex(s)
    assert int(info.item()) == 2
    np.testing.assert_array_equal(piv.cpu().numpy(), [2, 2])
    np.testing.assert_allclose(LU.cpu().numpy(), [[2.0, 4.0], [0.5, 0.0]])
    inv, info = L.inv_ex(batch)
    np.testing.assert_array_equal(info.cpu().numpy(), [0, 2])
    np.testing.assert_array_equal(inv.cpu().numpy()[0], np.eye(2))
    assert not np.isfinite(inv.cpu().numpy()[1]).all()
    _, info = L.solve_ex(batch, nbx.ones(2, 2, 1, device=device))
    np.testing.assert_array_equal(info.cpu().numpy(), [0, 2])
    with pytest.raises(L.LinAlgError):
        L.solve_ex(s, nbx.ones(2, device=device), check_errors=True)
    assert float(L.det(s).item()) == 0.0
    sign, ld = L.slogdet(s)
    assert float(sign.item()) == 0.0 and float(ld.item()) == -np.inf
    z = nbx.zeros(3, 3, device=device)
    assert int(L.lu_factor_ex(z).info.item()) == 1


def test_not_positive_definite(device):
    a = nbx.tensor([[[4.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 2.0]],
                    [[1.0, 0.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]]], device=device)
    with pytest.raises(L.LinAlgError, match=r"\(Batch element 1\): linalg.cholesky: The "
                                            r"factorization could not be completed because the "
                                            r"input is not positive-definite \(the leading minor "
                                            r"of order 2 is not positive-definite\)"):
        L.cholesky(a)
    lo, info = L.cholesky_ex(a)
    np.testing.assert_array_equal(info.cpu().numpy(), [0, 2])
    np.testing.assert_allclose(lo.cpu().numpy()[0], np.diag([2.0, 1.0, np.sqrt(2.0)]), rtol=1e-6)
    nan = nbx.tensor([[float("nan"), 0.0], [0.0, 1.0]], device=device)
    assert int(L.cholesky_ex(nan).info.item()) == 1
    with pytest.raises(L.LinAlgError):
        L.cholesky_ex(a, check_errors=True)


def test_nan_propagates(device):
    a = nbx.tensor([[1.0, float("nan")], [3.0, 4.0]], device=device)
    assert np.isnan(L.det(a).cpu().numpy())
    assert np.isnan(L.solve(a, nbx.ones(2, device=device)).cpu().numpy()).any()


def test_empty(device):
    e = nbx.zeros(0, 3, 3, device=device)
    assert L.inv(e).shape == (0, 3, 3) and L.det(e).shape == (0,)
    assert L.cholesky(e).shape == (0, 3, 3)
    z = nbx.zeros(2, 0, 0, device=device)
    np.testing.assert_array_equal(L.det(z).cpu().numpy(), [1.0, 1.0])
    assert L.solve(z, nbx.zeros(2, 0, 4, device=device)).shape == (2, 0, 4)


def test_refusals(device):
    with pytest.raises(ValueError, match="square"):
        L.inv(nbx.zeros(2, 3, device=device))
    with pytest.raises(TypeError, match="float32, float64"):
        L.det(nbx.zeros(2, 2, dtype=nbx.int64, device=device))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        L.cholesky(nbx.zeros(3, device=device))
    with pytest.raises(NotImplementedError, match="pivot=True"):
        L.lu_factor(nbx.eye(2, device=device), pivot=False)
    with pytest.raises(ValueError, match="one device"):
        L.solve(nbx.eye(2, device=device), nbx.ones(2, device="cpu" if device != "cpu" else
                                                     "interp"))


def test_limit_off_the_cpu(device):
    if device == "cpu":
        pytest.skip("the cpu has no size limit (LAPACK)")
    from nbxtensor.kernels.linalg import MAX_N
    big = nbx.eye(MAX_N + 1, device=device)
    for f in (L.inv, L.det, L.cholesky, lambda a: L.lu_factor(a), L.qr, L.eigh, L.eigvalsh,
              lambda a: L.solve_triangular(a, a, upper=True)):
        with pytest.raises(NotImplementedError, match=rf"up to {MAX_N} x {MAX_N}.*"
                                                      rf"{MAX_N + 1} x {MAX_N + 1}"):
            f(big)
    with pytest.raises(NotImplementedError, match="complex matrices are supported on cpu only"):
        L.inv(nbx.eye(2, dtype=nbx.complex64, device=device))
    with pytest.raises(NotImplementedError, match="only cpu tensors"):
        L.svd(nbx.eye(2, device=device))
