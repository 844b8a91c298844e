"""nbx.fft against numpy.fft in complex128 on every length class, norm mode and layout."""
import math

import numpy as np
import pytest

import nbxtensor as nbx

NORMS = [None, "backward", "ortho", "forward"]


def _tol(n, d=nbx.complex64):
    eps = 1e-6 if d in (nbx.complex64, nbx.float32) else 1e-14
    return 4 * eps * max(1.0, math.log2(max(n, 2)))


def _close(got, want, n, d=nbx.complex64):
    got = got.numpy()
    scale = max(np.abs(want).max(), 1e-30)
    err = np.abs(got.astype(want.dtype) - want).max() / scale
    assert err <= _tol(n, d), f"relative error {err:.3e} > {_tol(n, d):.3e} (n={n})"


def _lengths(device):
    if device == "cpu":
        return [1, 2, 4, 8, 64, 1024, 2 ** 14, 3, 7, 17, 101, 1009, 12, 60, 360, 1000]
    return [1, 2, 16, 256, 3, 7, 17, 101, 12, 60, 360]


def test_fft_every_length_class(device):
    g = np.random.default_rng(0)
    for n in _lengths(device):
        a = (g.standard_normal((3, n)) + 1j * g.standard_normal((3, n))).astype(np.complex64)
        t = nbx.tensor(a, device=device)
        A = a.astype(np.complex128)
        r = nbx.fft.fft(t)
        assert r.dtype is nbx.complex64
        _close(r, np.fft.fft(A), n)
        _close(nbx.fft.ifft(r), A, n)            # the round trip


@pytest.mark.parametrize("norm", NORMS)
def test_norm_modes_and_dtypes(device, norm):
    g = np.random.default_rng(1)
    for n in (16, 17):
        x = g.standard_normal((2, n))
        for dt, tol_dt in ((np.float32, nbx.complex64), (np.float64, nbx.complex128)):
            t = nbx.tensor(x.astype(dt), device=device)
            X = x.astype(dt).astype(np.float64)
            r = nbx.fft.fft(t, norm=norm)
            assert r.dtype is tol_dt
            _close(r, np.fft.fft(X, norm=norm), n, tol_dt)
            _close(nbx.fft.ifft(t, norm=norm), np.fft.ifft(X, norm=norm), n, tol_dt)
            _close(nbx.fft.rfft(t, norm=norm), np.fft.rfft(X, norm=norm), n, tol_dt)
            R = np.fft.rfft(X)
            _close(nbx.fft.irfft(nbx.tensor(R, device=device), n=n, norm=norm),
                   np.fft.irfft(R, n=n, norm=norm), n, nbx.complex128)
            _close(nbx.fft.hfft(nbx.tensor(R.astype(tol_dt.np), device=device), n=n, norm=norm),
                   np.fft.hfft(R.astype(tol_dt.np).astype(np.complex128), n=n, norm=norm), n,
                   tol_dt)
            _close(nbx.fft.ihfft(t, norm=norm), np.fft.ihfft(X, norm=norm), n, tol_dt)


def test_strided_batched_dims_and_padding(device):
    g = np.random.default_rng(2)
    x = g.standard_normal((6, 10, 9)) + 1j * g.standard_normal((6, 10, 9))
    t = nbx.tensor(x, device=device)[:, ::2, 1:]          # strided: (6, 5, 8)
    X = x[:, ::2, 1:]
    _close(nbx.fft.fft(t, dim=0), np.fft.fft(X, axis=0), 6, nbx.complex128)
    _close(nbx.fft.fft(t, n=12, dim=1), np.fft.fft(X, n=12, axis=1), 12, nbx.complex128)
    _close(nbx.fft.fft(t, n=3, dim=-1), np.fft.fft(X, n=3, axis=-1), 3, nbx.complex128)
    _close(nbx.fft.fftn(t, s=(4, 7), dim=(0, 2)), np.fft.fftn(X, s=(4, 7), axes=(0, 2)), 28,
           nbx.complex128)
    _close(nbx.fft.ifft2(t), np.fft.ifft2(X), 40, nbx.complex128)
    _close(nbx.fft.ifftn(t), np.fft.ifftn(X), 240, nbx.complex128)
    r = g.standard_normal((4, 6, 5))
    tr = nbx.tensor(r, device=device)
    _close(nbx.fft.rfft2(tr), np.fft.rfft2(r), 30, nbx.complex128)
    _close(nbx.fft.rfftn(tr, s=(3, 8), dim=(0, 1)), np.fft.rfftn(r, s=(3, 8), axes=(0, 1)), 24,
           nbx.complex128)
    R = np.fft.rfftn(r)
    _close(nbx.fft.irfftn(nbx.tensor(R, device=device), s=r.shape), r, 120, nbx.complex128)
    _close(nbx.fft.irfft2(nbx.tensor(np.fft.rfft2(r), device=device), s=(6, 5)), r, 30,
           nbx.complex128)
    _close(nbx.fft.irfft(nbx.tensor(np.fft.rfft(r, n=7), device=device), n=7),
           np.fft.irfft(np.fft.rfft(r, n=7), n=7), 7, nbx.complex128)


def test_shift_and_freq(device):
    x = np.arange(30.0).reshape(5, 6)
    t = nbx.tensor(x, device=device)
    assert np.array_equal(nbx.fft.fftshift(t).numpy(), np.fft.fftshift(x))
    assert np.array_equal(nbx.fft.ifftshift(t, dim=0).numpy(), np.fft.ifftshift(x, axes=0))
    c = nbx.tensor(x + 1j * x[::-1], device=device)
    assert np.array_equal(nbx.fft.fftshift(c, dim=(1,)).numpy(),
                          np.fft.fftshift(x + 1j * x[::-1], axes=1))
    assert np.allclose(nbx.fft.fftfreq(7, 0.5).numpy(), np.fft.fftfreq(7, 0.5))
    assert np.allclose(nbx.fft.rfftfreq(8, device=device).numpy(), np.fft.rfftfreq(8))


def test_refusals(device):
    t = nbx.tensor(np.ones(8, np.complex64), device=device)
    with pytest.raises(TypeError, match="real input"):
        nbx.fft.rfft(t)
    with pytest.raises(TypeError, match="float16"):
        nbx.fft.fft(nbx.ones(8, dtype=nbx.float16, device=device))
    with pytest.raises(ValueError, match="norm"):
        nbx.fft.fft(t, norm="none")
    with pytest.raises(ValueError, match="number of data points"):
        nbx.fft.fft(t, n=0)


def test_stockham_pass_compiles_for_sm90():
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from nbxtensor.kernels.fft import _stockham_pass
    for ty in ("*fp32", "*fp64"):
        sig = {"x": ty, "y": ty, "total": "i32", "N": "i32", "half_n": "i32", "s": "i32"}
        cx = dict(SIGN=-1.0, INTERP=False, BLOCK=512)
        sig.update({k: "constexpr" for k in cx})
        k = triton.compile(triton.compiler.ASTSource(fn=_stockham_pass, signature=sig,
                                                     constexprs=cx),
                           target=GPUTarget("cuda", 90, 64))
        assert "ld.global" in k.asm["ptx"]
