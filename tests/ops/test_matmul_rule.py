"""The matmul rule for any shape (kernels/matmul.py): the TMA kernel's K split and fp32
operands, and what the rule picks, against float64 NumPy with fresh random inputs, tiles
that overhang M, N and K, NaN-poisoned outputs, and the fused epilogue on the split path."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng

pytestmark = pytest.mark.usefixtures("poison_outputs")

TOL = {nbx.float32: 1e-5, nbx.float16: 1e-2, nbx.bfloat16: 1e-2}
# 32-tiles overhang M = 72, N = 88 (16-byte rows in 16-bit and fp32) and K = 80
SMALL = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, num_warps=4, num_stages=2)


def arr(shape, dtype, g):
    """Random values exactly representable in `dtype`, as float64."""
    return g.standard_normal(shape).astype(dtype.np).astype(np.float64)


def T(a, dtype, device):
    return nbx.tensor(np.asarray(a).astype(dtype.np), device=device)


def check(out, ref, scale, dtype, tol=None):
    got = out.numpy().astype(np.float64)
    assert got.shape == ref.shape
    bound = (TOL[dtype] if tol is None else tol) * (np.abs(scale) + 1e-30)
    bad = ~(np.abs(got - ref) <= bound)
    assert not bad.any(), f"{bad.sum()} of {bad.size} off, worst {np.nanmax(np.abs(got - ref))}"


def _gelu(x):
    from math import erf
    return 0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


def _skip_cpu(device):
    if device == "cpu":
        pytest.skip("kernel variant (cuda/interp)")


@pytest.mark.parametrize("mode", ["one-item", "persistent", "flatten"])
@pytest.mark.parametrize("split", [2, 3])
def test_tma_split_k(device, mode, split):
    """K in `split` slices of whole 32-blocks (the last slice part zero-filled past K = 80),
    fp32 partials reduced in fixed order, then the epilogue (alpha, bias, gelu, residual)
    once on the sum; each operand layout in turn."""
    _skip_cpu(device)
    from nbxtensor.kernels.matmul import config_override
    g = rng()
    M, N, K = 72, 88, 80
    dtype = nbx.bfloat16 if split == 2 else nbx.float16
    a_t, b_t = mode == "persistent", mode != "one-item"
    x, w = arr((M, K), dtype, g), arr((N, K), dtype, g)
    bias, r = arr((N,), dtype, g), arr((M, N), dtype, g)
    tx = T(x.T.copy(), dtype, device).t() if a_t else T(x, dtype, device)
    tw = T(w, dtype, device) if b_t else T(w.T.copy(), dtype, device).t()
    extra = {"one-item": dict(PERSISTENT=False), "persistent": dict(NUM_PROGS=3),
             "flatten": dict(NUM_PROGS=3, FLATTEN=True)}[mode]
    with config_override(TMA=True, SPLIT=split, **SMALL, **extra):
        out = nbx.linear(tx, tw, T(bias, dtype, device), activation="gelu",
                         residual=T(r, dtype, device))
    ref = _gelu(x @ w.T + bias) + r
    check(out, ref, np.abs(x) @ np.abs(w.T) + np.abs(bias) + np.abs(r), dtype)


def test_tma_split_more_slices_than_blocks(device):
    """A split asked for more slices than K has blocks: whole blocks a slice, fewer slices,
    no empty slice; alpha and beta through addmm."""
    _skip_cpu(device)
    from nbxtensor.kernels.matmul import config_override
    g = rng()
    dtype = nbx.bfloat16
    a, b, c = arr((40, 48), dtype, g), arr((48, 56), dtype, g), arr((40, 56), dtype, g)
    with config_override(TMA=True, SPLIT=8, **SMALL):
        out = nbx.addmm(T(c, dtype, device), T(a, dtype, device), T(b, dtype, device),
                        beta=0.5, alpha=2.0)
    check(out, 2.0 * (a @ b) + 0.5 * c, 2.0 * np.abs(a) @ np.abs(b) + 0.5 * np.abs(c), dtype)


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_tma_fp32(device, precision):
    """fp32 operands through TMA: IEEE by default, TF32 when allowed (tolerance of TF32's
    10-bit mantissa); an out= view whose rows are not 16-byte aligned stores by pointers."""
    _skip_cpu(device)
    from nbxtensor.kernels.matmul import config_override
    g = rng()
    dtype = nbx.float32
    M, N, K = 72, 88, 80
    a, b = arr((M, K), dtype, g), arr((K, N), dtype, g)
    big = nbx.tensor(np.full((M, N + 3), np.nan, np.float32), device=device)
    view = big[:, 1:N + 1]
    nbx.set_float32_matmul_precision(precision)
    try:
        with config_override(TMA=True, **SMALL):
            out = nbx.matmul(T(a, dtype, device), T(b, dtype, device))
            nbx.matmul(T(a, dtype, device), T(b, dtype, device), out=view)
    finally:
        nbx.set_float32_matmul_precision("highest")
    tol = 1e-5 if precision == "highest" else 2e-3
    check(out, a @ b, np.abs(a) @ np.abs(b), dtype, tol)
    check(view, a @ b, np.abs(a) @ np.abs(b), dtype, tol)
    assert np.isnan(big.numpy()[:, [0, N + 1, N + 2]]).all()


@pytest.mark.slow
def test_tma_split_and_fp32_compile_for_sm90():
    """The split and fp32 (IEEE, TF32) variants of the TMA kernel compile for sm_90 within
    227 KB of shared memory, with TMA loads; the split one with wgmma."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from nbxtensor.kernels.matmul import _matmul_tma_kernel as kern
    names = kern.arg_names
    cases = [("*bf16", 128, 256, 64, 8, 3, True, "ieee"),
             ("*bf16", 128, 128, 64, 8, 4, True, "ieee"),
             ("*fp32", 128, 256, 32, 8, 3, False, "tf32"),
             ("*fp32", 128, 128, 32, 8, 3, False, "ieee")]
    for ptr, bm, bn, bk, w, st, split, prec in cases:
        ce = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, A_T=False, B_T=True,
                  C_DESC=not split, SUBTILE=True, PERSISTENT=True, FLATTEN=True,
                  HAS_ALPHA=False, HAS_BIAS=False, HAS_RES=False, ACT=0, SPLIT=split,
                  PRECISION=prec)
        sig = {n: ("constexpr" if n in ce else ptr if n.endswith("_ptr")
                   else "fp32" if n in ("alpha", "beta") else "i32") for n in names}
        if split:
            sig["c_ptr"] = "*fp32"
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
                 if n.endswith("_ptr") or n in ("M", "N", "K", "s_a", "s_b", "s_c", "K_SPLIT")}
        src = ASTSource(fn=kern, signature=sig, attrs=attrs,
                        constexprs={(names.index(k),): v for k, v in ce.items()})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 64),
                           options=dict(num_warps=w, num_stages=st))
        assert k.metadata.shared <= 227 * 1024, (ce, k.metadata.shared)
        ptx = k.asm["ptx"]
        assert "cp.async.bulk.tensor" in ptx, ce
        if prec != "ieee" or ptr == "*bf16":
            assert "wgmma.mma_async" in ptx, ce


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_fp32_operands_copied_into_the_fast_layout(device, monkeypatch, precision):
    """fp32 products large enough take a K-major copy of a transposed A and of a row-major B
    for TF32, an N-major copy of a K-major B (linear's weight) for IEEE; the results match."""
    _skip_cpu(device)
    from nbxtensor.kernels import matmul as km
    copies = []
    real = km._pad_copy

    def spy(t, unit_dim):
        copies.append(unit_dim)
        return real(t, unit_dim)
    monkeypatch.setattr(km, "_pad_copy", spy)
    g = rng()
    dtype = nbx.float32
    M = N = K = 256                                  # M*N*K = PAD_MIN_MACS: copies apply
    a, w = arr((M, K), dtype, g), arr((N, K), dtype, g)
    nbx.set_float32_matmul_precision(precision)
    try:
        out = nbx.matmul(T(a.T.copy(), dtype, device).t(), T(w, dtype, device).t())
    finally:
        nbx.set_float32_matmul_precision("highest")
    check(out, a @ w.T, np.abs(a) @ np.abs(w.T), dtype, 1e-5 if precision == "highest" else 2e-3)
    assert copies == ([3] if precision == "highest" else [3]), copies
    copies.clear()
    b = arr((K, N), dtype, g)
    nbx.set_float32_matmul_precision(precision)
    try:
        out = nbx.matmul(T(a, dtype, device), T(b, dtype, device))
    finally:
        nbx.set_float32_matmul_precision("highest")
    check(out, a @ b, np.abs(a) @ np.abs(b), dtype, 1e-5 if precision == "highest" else 2e-3)
    assert copies == ([] if precision == "highest" else [2]), copies


def test_vector_stores_into_a_strided_out(device):
    """The tiled kernel's output stores with N and the row stride multiples of 8 but not 16
    (C_DIV): an out= view into a poisoned buffer, batched, tails in M and N; the columns
    outside the view stay NaN."""
    _skip_cpu(device)
    from nbxtensor.kernels.matmul import config_override
    g = rng()
    dtype = nbx.bfloat16
    B, M, N, K = 3, 37, 40, 24
    a, b = arr((B, M, K), dtype, g), arr((B, K, N), dtype, g)
    big = nbx.tensor(np.full((B, M, N + 8), np.nan, dtype.np), device=device)
    view = big[:, :, 8:]
    with config_override(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=2):
        nbx.matmul(T(a, dtype, device), T(b, dtype, device), out=view)
    check(view, a @ b, np.abs(a) @ np.abs(b), dtype)
    assert np.isnan(big.numpy()[:, :, :8].astype(np.float64)).all()


@pytest.mark.parametrize("N", [1, 5, 16])
def test_few_columns_take_the_transposed_gemv(device, monkeypatch, N):
    """N <= 16 columns, one batch, no bias: out^T = b^T @ a^T through the GEMV kernel
    (a streamed as its weight), with alpha, beta and a residual, A row-major or not; with
    a bias a matmul kernel runs. Both match float64."""
    _skip_cpu(device)
    from nbxtensor.backends import launch as L
    names = []
    real = L.launch

    def spy(kernel, *args, **kw):
        names.append(getattr(getattr(kernel, "fn", kernel), "__name__", ""))
        return real(kernel, *args, **kw)
    monkeypatch.setattr(L, "launch", spy)
    g = rng()
    dtype = nbx.bfloat16
    M, K = 72, 96
    for a_t in (False, True):
        a, b, c = arr((M, K), dtype, g), arr((K, N), dtype, g), arr((M, N), dtype, g)
        ta = T(a.T.copy(), dtype, device).t() if a_t else T(a, dtype, device)
        names.clear()
        out = nbx.addmm(T(c, dtype, device), ta, T(b, dtype, device), beta=0.5, alpha=2.0)
        check(out, 2.0 * (a @ b) + 0.5 * c, 2.0 * np.abs(a) @ np.abs(b) + 0.5 * np.abs(c), dtype)
        assert "_matmul_kernel" not in names and "_matmul_tma_kernel" not in names, names
    w, bias = arr((N, K), dtype, g), arr((N,), dtype, g)
    names.clear()
    out = nbx.linear(T(a, dtype, device), T(w, dtype, device), T(bias, dtype, device))
    check(out, a @ w.T + bias, np.abs(a) @ np.abs(w.T) + np.abs(bias), dtype)
    assert {"_matmul_kernel", "_matmul_tma_kernel"} & set(names), names


@pytest.mark.parametrize("axis", ["M", "N"])
def test_banded_product(device, monkeypatch, axis):
    """A product the rule bands (BAND=(axis, 32)) runs as two products over rows (columns)
    [0, 32) and the rest, each with the epilogue's bias, activation and residual rows
    (columns); two kernel launches, the result as one product's."""
    _skip_cpu(device)
    from nbxtensor.backends import launch as L
    from nbxtensor.kernels import matmul as km
    real = km._rule

    def fake(M, N, K, dtype, sms, batch, precision, tma, tiles16, band=True):
        t, cfg = real(M, N, K, dtype, sms, batch, precision, tma, tiles16, False)
        if band and (M, N, K) == (72, 88, 80):
            cfg = dict(cfg, BAND=(axis, 32))
        return t, cfg
    monkeypatch.setattr(km, "_rule", fake)
    names = []
    real_launch = L.launch

    def spy(kernel, *args, **kw):
        names.append(getattr(getattr(kernel, "fn", kernel), "__name__", ""))
        return real_launch(kernel, *args, **kw)
    monkeypatch.setattr(L, "launch", spy)
    g = rng()
    dtype = nbx.bfloat16
    M, N, K = 72, 88, 80
    x, w = arr((M, K), dtype, g), arr((N, K), dtype, g)
    bias, r = arr((N,), dtype, g), arr((M, N), dtype, g)
    out = nbx.linear(T(x, dtype, device), T(w, dtype, device), T(bias, dtype, device),
                     activation="gelu", residual=T(r, dtype, device))
    check(out, _gelu(x @ w.T + bias) + r, np.abs(x) @ np.abs(w.T) + np.abs(bias) + np.abs(r),
          dtype)
    assert len([n for n in names if n.startswith("_matmul")]) == 2, names


def test_band_rule_takes_whole_waves():
    """The rule bands a product whose 128x256 tiles fill one wave and part of another
    (3000x2000x5000: the 2048 rows of a whole wave, then the rest), not one that fills
    whole waves (4096^3: 512 tiles, 3.9 waves) or one of many waves (16384x8192x2048)."""
    from helpers import H200
    from nbxtensor.kernels.matmul import matmul_config
    c = matmul_config(3000, 2000, 5000, nbx.bfloat16, H200)
    assert c.get("TMA") and c["BAND"] == ("M", 2048), c
    assert "BAND" not in matmul_config(3000, 2000, 5000, nbx.bfloat16, H200, band=False)
    for shape in [(4096, 4096, 4096), (16384, 8192, 2048), (128, 4096, 4096)]:
        assert "BAND" not in matmul_config(*shape, nbx.bfloat16, H200), shape
