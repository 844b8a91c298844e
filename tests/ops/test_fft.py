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


# ------------------------------------------------------------------ the fast kernels' paths
def _c64(g, shape):
    return (g.standard_normal(shape) + 1j * g.standard_normal(shape)).astype(np.complex64)


@pytest.mark.parametrize("n,batch", [(16, 257), (100, 33), (1024, 5), (4096, 3), (4097, 2),
                                     (8192, 3), (2 ** 14, 2)])
def test_fast_lengths_batches_round_trip(device, n, batch):
    # around the on-chip limit (2**12), the direct-DFT limit (128), the four-step and
    # Bluestein on the fast kernels; batches overhanging the rows per program
    g = np.random.default_rng(n)
    a = _c64(g, (batch, n))
    t = nbx.tensor(a, device=device)
    A = a.astype(np.complex128)
    out = nbx.tensor(np.full((batch, n), np.nan, np.complex64), device=device)
    nbx.fft.fft(t, out=out)
    _close(out, np.fft.fft(A), n)
    _close(nbx.fft.ifft(out, norm="ortho"), np.fft.ifft(np.fft.fft(A), norm="ortho"), n)
    _close(nbx.fft.ifft(nbx.fft.fft(t)), A, n)


@pytest.mark.parametrize("n", [2, 8, 16, 1000, 4096, 8192, 2 ** 14, 2 * 4097])
def test_rfft_irfft_half_length(device, n):
    g = np.random.default_rng(n + 1)
    x = g.standard_normal((3, n)).astype(np.float32)
    t = nbx.tensor(x, device=device)
    X = np.fft.rfft(x.astype(np.float64))
    r = nbx.fft.rfft(t)
    assert r.dtype is nbx.complex64 and r.shape == (3, n // 2 + 1)
    _close(r, X, n)
    # the imaginary parts of X[0] and X[n/2] are ignored by c2r (numpy and torch alike)
    Xc = X.copy()
    Xc[:, 0] += 0.5j
    Xc[:, -1] -= 0.25j
    ir = nbx.fft.irfft(nbx.tensor(Xc.astype(np.complex64), device=device), n=n, norm="forward")
    _close(ir, np.fft.irfft(Xc, n=n, norm="forward"), n)
    _close(nbx.fft.irfft(r, n=n), x.astype(np.float64), n)
    _close(nbx.fft.hfft(r, n=n), np.fft.hfft(np.fft.rfft(x.astype(np.float64)), n=n), n)
    _close(nbx.fft.ihfft(t), np.fft.ihfft(x.astype(np.float64)), n)


def test_strided_dims_on_the_fast_kernels(device):
    g = np.random.default_rng(7)
    a = _c64(g, (3, 256, 6))
    t = nbx.tensor(a, device=device)
    A = a.astype(np.complex128)
    _close(nbx.fft.fft(t, dim=1), np.fft.fft(A, axis=1), 256)          # inner dim, strided
    _close(nbx.fft.fft(t, dim=0), np.fft.fft(A, axis=0), 3)
    s = t[:, ::2, 1:5]                                                # non-collapsible strides
    _close(nbx.fft.fft(s, dim=1), np.fft.fft(A[:, ::2, 1:5], axis=1), 128)
    _close(nbx.fft.fft2(t, dim=(0, 1)), np.fft.fft2(A, axes=(0, 1)), 768)
    m = _c64(g, (64, 64))
    _close(nbx.fft.ifft2(nbx.tensor(m, device=device)), np.fft.ifft2(m.astype(np.complex128)),
           4096)
    x = g.standard_normal((256, 5)).astype(np.float32)
    _close(nbx.fft.rfft(nbx.tensor(x, device=device)[1:, :], dim=0),
           np.fft.rfft(x[1:].astype(np.float64), axis=0), 255)
    _close(nbx.fft.rfft(nbx.tensor(x, device=device)[:, 1:], dim=0),
           np.fft.rfft(x[:, 1:].astype(np.float64), axis=0), 256)


@pytest.mark.parametrize("n", [64, 1024, 8192, 1000])
def test_nan_stays_in_its_row(device, n):
    g = np.random.default_rng(3)
    a = _c64(g, (5, n))
    a[2, n // 3] = np.nan
    r = nbx.fft.fft(nbx.tensor(a, device=device)).numpy()
    assert np.isnan(r[2]).all()
    keep = [0, 1, 3, 4]
    assert np.isfinite(r[keep]).all()
    _close(nbx.tensor(r[keep]), np.fft.fft(a[keep].astype(np.complex128)), n)


def test_complex128_keeps_the_simple_path(device):
    g = np.random.default_rng(5)
    for n in (4096, 300):
        a = g.standard_normal((2, n)) + 1j * g.standard_normal((2, n))
        t = nbx.tensor(a, device=device)
        _close(nbx.fft.fft(t), np.fft.fft(a), n, nbx.complex128)
        x = g.standard_normal((2, n))
        _close(nbx.fft.rfft(nbx.tensor(x, device=device)), np.fft.rfft(x), n, nbx.complex128)


def _tile_sig(n, pre, post, ones):
    from nbxtensor.kernels import fft as F
    n1, n2, n3 = F._split(n)
    rows = max(1, F._TILE // (n1 * n2 * n3))
    names = ["x", "y", "tab", "pre", "post", "n_rows", "C", "in_bs", "in_cs", "in_js",
             "out_bs", "out_cs", "out_ks", "NV", "KV", "PCS", "PJS", "QCS", "QKS", "scale"]
    sig = {k: "*fp32" for k in names[:5]}
    sig.update({k: "i32" for k in names[5:-1]})
    sig["scale"] = "fp32"
    cx = dict(CONJ=-1.0, N1=n1, N2=n2, N3=n3, ROWS=rows, PRE=pre, POST=post,
              OLB=7 if post == 1 else 0, PREC="tf32x3")
    for o in ones:
        cx[o] = 1
    sig.update({k: "constexpr" for k in cx})
    return sig, cx, 8 if n1 * n2 * n3 * rows >= 4096 else 4


@pytest.mark.parametrize("n,pre,post,ones", [
    (3, False, 0, ("in_js", "out_ks", "NV", "KV", "n_rows", "PJS", "QKS")),
    (128, True, 2, ()),
    (256, True, 1, ("C", "in_cs", "out_cs", "PCS", "QCS")),
    (512, True, 3, ("n_rows", "C", "PJS", "QKS")),
    (4096, True, 3, ("PJS", "QKS")),
    (4096, False, 2, ("in_js", "PCS", "QCS")),
])
def test_fft_tile_compiles_for_sm90(n, pre, post, ones):
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from nbxtensor.kernels.fft import _fft_tile
    sig, cx, warps = _tile_sig(n, pre, post, ones)
    k = triton.compile(triton.compiler.ASTSource(fn=_fft_tile, signature=sig, constexprs=cx),
                       target=GPUTarget("cuda", 90, 64), options=dict(num_warps=warps))
    assert k.metadata.shared <= 227 * 1024
    assert "mma" in k.asm["ptx"]          # the DFT dots run on tensor cores (tf32x3)


def test_real_half_kernels_compile_for_sm90():
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from nbxtensor.kernels.fft import _irfft_pre, _rfft_post
    for fn, extra in ((_rfft_post, {"scale": "fp32"}), (_irfft_pre, {})):
        for ty in ("*fp32", "*fp64"):
            names = ["z", "out", "tw"] if fn is _rfft_post else ["xs", "z", "tw"]
            sig = {k: ty for k in names}
            sig.update({"total": "i32", "h": "constexpr"})
            sig.update(extra)
            sig["BLOCK"] = "constexpr"
            k = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig,
                                                         constexprs={"h": 1, "BLOCK": 512}),
                               target=GPUTarget("cuda", 90, 64))
            assert "ld.global" in k.asm["ptx"]
