"""softmax / log_softmax, layer_norm, rms_norm (+ fused residual), group_norm, batch_norm
against float64 NumPy: every dim, strided inputs, the register and the looping (long-row)
kernel paths, -inf rows, NaN, dtype=, and outputs that start as NaN."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng

TOL = {nbx.float32: 2e-5, nbx.float16: 4e-3, nbx.bfloat16: 2.5e-2, nbx.float64: 1e-12}


pytestmark = pytest.mark.usefixtures("poison_outputs")


@pytest.fixture
def looping(monkeypatch, device):
    """Force the long-row kernels (online softmax, multi-pass norms) with tiny blocks."""
    if device == "cpu":
        pytest.skip("kernel path only")
    import nbxtensor.kernels.norm as kn
    import nbxtensor.kernels.softmax as ks
    cfg = dict(BLOCK_R=2, BLOCK_N=16, SINGLE=False, num_warps=4)
    monkeypatch.setattr(ks, "_OVERRIDE", cfg)
    monkeypatch.setattr(kn, "_OVERRIDE", dict(cfg, BLOCK=16))


def arr(shape, dtype, gen=None, scale=1.0):
    gen = gen or rng()
    return (scale * gen.standard_normal(shape)).astype(dtype.np).astype(np.float64)


def q(a, dtype):
    """Round float64 values to `dtype` (and back), so the reference sees the kernel's inputs."""
    return np.asarray(a).astype(dtype.np).astype(np.float64)


def T(a, dtype, device):
    return nbx.tensor(np.asarray(a).astype(dtype.np), device=device)


def close(out, ref, dtype, atol_scale=1.0):
    got = out.numpy().astype(np.float64)
    assert got.shape == np.shape(ref)
    t = TOL[dtype]
    np.testing.assert_allclose(got, ref, rtol=t, atol=t * atol_scale, equal_nan=True)


def ref_softmax(a, d, log):
    m = a.max(axis=d, keepdims=True)
    e = np.exp(a - m)
    s = e.sum(axis=d, keepdims=True)
    return a - m - np.log(s) if log else e / s


# ------------------------------------------------------------------ softmax
@pytest.mark.parametrize("shape,dim", [((5, 37), -1), ((3, 37, 6), 1), ((4, 3, 5), 0),
                                       ((65,), 0), ((), 0)])
@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16, nbx.float16])
@pytest.mark.parametrize("log", [False, True])
def test_softmax(device, shape, dim, dtype, log):
    a = arr(shape, dtype)
    fn = nbx.log_softmax if log else nbx.softmax
    out = fn(T(a, dtype, device), dim)
    assert out.dtype is dtype
    close(out, ref_softmax(a, dim if shape else None, log), dtype, atol_scale=1 if not log else 4)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_long_rows_and_strided(device, looping, log):
    dtype = nbx.float32
    a = arr((37, 5), dtype)                   # transposed view: softmax along a strided dim
    x = T(a, dtype, device).t()               # (5, 37), stride (1, 5)
    fn = nbx.log_softmax if log else nbx.softmax
    close(fn(x, -1), ref_softmax(a.T, -1, log), dtype)
    b = arr((3, 50, 2), dtype)
    close(fn(T(b, dtype, device), 1), ref_softmax(b, 1, log), dtype)


@pytest.mark.parametrize("path", ["single", "loop"])
def test_softmax_inf_nan_rows(device, request, path):
    if path == "loop":
        request.getfixturevalue("looping")
    dtype = nbx.float32
    a = arr((4, 33), dtype)
    a[0, :] = -np.inf                         # all -inf: NaN (torch)
    a[1, ::2] = -np.inf                       # partly -inf: zeros there
    a[2, 7] = np.nan                          # NaN poisons its row only
    a[3, 5] = np.inf                          # +inf: NaN where inf - inf
    for log in (False, True):
        fn = nbx.log_softmax if log else nbx.softmax
        got = fn(T(a, dtype, device), 1).numpy()
        assert np.isnan(got[0]).all() and np.isnan(got[2]).all()
        with np.errstate(all="ignore"):
            ref = ref_softmax(a[1:2], 1, log)
        np.testing.assert_allclose(got[1:2], ref, rtol=2e-5, atol=2e-5)
        assert np.isnan(got[3, 5])


def test_softmax_dtype_arg(device):
    a = arr((6, 19), nbx.bfloat16)
    out = nbx.softmax(T(a, nbx.bfloat16, device), -1, dtype=nbx.float32)
    assert out.dtype is nbx.float32
    close(out, ref_softmax(a, -1, False), nbx.float32)
    out = T(a, nbx.float32, device).log_softmax(0, dtype="float16")
    assert out.dtype is nbx.float16
    close(out, ref_softmax(a, 0, True), nbx.float16, atol_scale=4)


def test_softmax_errors(device):
    x = T(np.ones((2, 3)), nbx.float32, device)
    with pytest.raises(IndexError):
        nbx.softmax(x, 2)
    with pytest.raises(TypeError, match="dim"):
        nbx.softmax(x)
    with pytest.raises(TypeError, match="floating"):
        nbx.softmax(nbx.tensor(np.ones((2, 3), np.int64), device=device), 1)


# ------------------------------------------------------------------ layer_norm / rms_norm
def ref_ln(a, k, w, b, eps, rms=False):
    ax = tuple(range(a.ndim - k, a.ndim))
    if rms:
        y = a / np.sqrt((a * a).mean(axis=ax, keepdims=True) + eps)
    else:
        mu = a.mean(axis=ax, keepdims=True)
        y = (a - mu) / np.sqrt(((a - mu) ** 2).mean(axis=ax, keepdims=True) + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16, nbx.float16])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(device, dtype, affine):
    g = rng()
    a = q(arr((3, 5, 37), dtype, g, scale=3.0) + 2.0, dtype)
    w = arr((37,), nbx.float32, g) if affine else None
    b = arr((37,), nbx.float32, g) if affine else None
    out = nbx.layer_norm(T(a, dtype, device), (37,), T(w, nbx.float32, device) if affine else None,
                         T(b, nbx.float32, device) if affine else None, eps=1e-5)
    assert out.dtype is dtype
    close(out, ref_ln(a, 1, w, b, 1e-5), dtype, atol_scale=2)
    # two normalised dims, weight only
    w2 = arr((5, 37), dtype, g)
    out = nbx.nn.functional.layer_norm(T(a, dtype, device), [5, 37], T(w2, dtype, device))
    close(out, ref_ln(a, 2, w2, None, 1e-5), dtype, atol_scale=2)


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16])
def test_rms_norm(device, dtype):
    g = rng()
    a = arr((7, 45), dtype, g)
    w = arr((45,), dtype, g)
    out = nbx.rms_norm(T(a, dtype, device), [45], T(w, dtype, device), eps=1e-6)
    close(out, ref_ln(a, 1, w, None, 1e-6, rms=True), dtype, atol_scale=2)
    out = nbx.rms_norm(T(a, dtype, device), 45)            # eps=None: finfo(dtype).eps
    close(out, ref_ln(a, 1, None, None, nbx.finfo(dtype).eps, rms=True), dtype, atol_scale=2)


def test_norms_strided_input(device):
    dtype = nbx.float32
    g = rng()
    a = arr((20, 6), dtype, g)
    x = T(a, dtype, device).t()                 # rows not unit-stride: copied, still right
    close(nbx.layer_norm(x, (20,)), ref_ln(a.T, 1, None, None, 1e-5), dtype)
    b = arr((4, 30), dtype, g)
    x = T(b, dtype, device)[:, 3:27]            # row stride 30, unit stride: a view, no copy
    close(nbx.rms_norm(x, (24,), eps=1e-6), ref_ln(b[:, 3:27], 1, None, None, 1e-6, True), dtype)


@pytest.mark.parametrize("rms", [True, False])
@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16])
def test_add_norm_fused(device, rms, dtype):
    g = rng()
    x, r = arr((2, 3, 40), dtype, g), arr((2, 3, 40), dtype, g)
    w, b = arr((40,), dtype, g), arr((40,), dtype, g)
    X, R, W, B = (T(v, dtype, device) for v in (x, r, w, b))
    if rms:
        normed, h = nbx.add_rms_norm(X, R, W, 1e-6)
    else:
        normed, h = nbx.add_layer_norm(X, R, W, B, 1e-5)
    hs = (x + r).astype(dtype.np)                # the sum, rounded as `x + residual` would be
    np.testing.assert_array_equal(h.numpy(), hs)
    ref = ref_ln(hs.astype(np.float64), 1, w, None if rms else b, 1e-6 if rms else 1e-5, rms)
    close(normed, ref, dtype, atol_scale=2)


@pytest.mark.parametrize("rms", [True, False])
def test_norm_long_rows(device, looping, rms):
    dtype = nbx.float32
    g = rng()
    x, r = q(arr((5, 53), dtype, g, 2.0) + 1.0, dtype), arr((5, 53), dtype, g)
    w, b = arr((53,), dtype, g), arr((53,), dtype, g)
    X, R, W, B = (T(v, dtype, device) for v in (x, r, w, b))
    out = nbx.rms_norm(X, (53,), W, 1e-6) if rms else nbx.layer_norm(X, (53,), W, B)
    close(out, ref_ln(x, 1, w, None if rms else b, 1e-6 if rms else 1e-5, rms), dtype)
    normed, h = (nbx.add_rms_norm(X, R, W, 1e-6) if rms else nbx.add_layer_norm(X, R, W, B))
    np.testing.assert_array_equal(h.numpy(), (x + r).astype(np.float32))
    hs = (x + r).astype(np.float32).astype(np.float64)
    close(normed, ref_ln(hs, 1, w, None if rms else b, 1e-6 if rms else 1e-5, rms), dtype)


def test_norm_nan_and_errors(device):
    dtype = nbx.float32
    a = arr((3, 10), dtype)
    a[1, 4] = np.nan
    out = nbx.layer_norm(T(a, dtype, device), (10,)).numpy()
    assert np.isnan(out[1]).all() and not np.isnan(out[[0, 2]]).any()
    x = T(a, dtype, device)
    with pytest.raises(ValueError, match="normalized_shape"):
        nbx.layer_norm(x, (9,))
    with pytest.raises(ValueError, match="weight"):
        nbx.layer_norm(x, (10,), T(np.ones(9), dtype, device))
    with pytest.raises(TypeError, match="float"):
        nbx.rms_norm(nbx.tensor(np.ones((2, 3), np.int32), device=device), (3,))
    with pytest.raises(ValueError, match="residual"):
        nbx.add_rms_norm(x, T(np.ones((3, 9)), dtype, device), None)


# ------------------------------------------------------------------ group_norm / batch_norm
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16])
def test_group_norm(device, affine, dtype):
    g = rng()
    a = q(arr((2, 6, 5, 3), dtype, g, 2.0) - 1.0, dtype)
    w = arr((6,), dtype, g) if affine else None
    b = arr((6,), dtype, g) if affine else None
    out = nbx.group_norm(T(a, dtype, device), 3, T(w, dtype, device) if affine else None,
                         T(b, dtype, device) if affine else None, eps=1e-5)
    grp = a.reshape(2, 3, -1)
    mu = grp.mean(-1, keepdims=True)
    y = ((grp - mu) / np.sqrt(((grp - mu) ** 2).mean(-1, keepdims=True) + 1e-5)).reshape(a.shape)
    if affine:
        y = y * w[:, None, None] + b[:, None, None]
    close(out, y, dtype, atol_scale=2)
    with pytest.raises(ValueError, match="num_groups"):
        nbx.group_norm(T(a, dtype, device), 4)


def test_group_norm_looping(device, looping):
    dtype = nbx.float32
    g = rng()
    a = arr((2, 4, 9), dtype, g)                 # groups of 2 * 9 = 18 > BLOCK 16
    out = nbx.group_norm(T(a, dtype, device), 2)
    grp = a.reshape(2, 2, -1)
    mu = grp.mean(-1, keepdims=True)
    y = ((grp - mu) / np.sqrt(((grp - mu) ** 2).mean(-1, keepdims=True) + 1e-5)).reshape(a.shape)
    close(out, y, dtype)


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 7), (2, 3, 2, 5)])
def test_batch_norm_inference(device, shape):
    dtype = nbx.float32
    g = rng()
    a = arr(shape, dtype, g)
    mean, var = arr((3,), dtype, g), np.abs(arr((3,), dtype, g)) + 0.5
    w, b = arr((3,), dtype, g), arr((3,), dtype, g)
    cs = (1, 3) + (1,) * (len(shape) - 2)
    out = nbx.nn.functional.batch_norm(T(a, dtype, device), T(mean, dtype, device),
                                       T(var, dtype, device), T(w, dtype, device),
                                       T(b, dtype, device), False, 0.1, 1e-5)
    ref = (a - mean.reshape(cs)) / np.sqrt(var.reshape(cs) + 1e-5) * w.reshape(cs) + b.reshape(cs)
    close(out, ref, dtype)
    out = nbx.batch_norm(T(a, dtype, device), T(mean, dtype, device), T(var, dtype, device))
    close(out, (a - mean.reshape(cs)) / np.sqrt(var.reshape(cs) + 1e-5), dtype)
    with pytest.raises(NotImplementedError, match="inference"):
        nbx.batch_norm(T(a, dtype, device), T(mean, dtype, device), T(var, dtype, device),
                       training=True)


def test_norms_strided_params(device):
    """weight / bias / running stats that are strided views (every other element) are read
    by their strides: the kernels index those pointers with the channel alone."""
    dtype = nbx.float32
    g = rng()
    a = arr((3, 8), dtype, g)
    p = arr((4, 16), dtype, g)                  # rows of 16: [:, ::2] are strided (8,) views
    P = T(p, dtype, device)
    w, b = P[0, ::2], P[1, ::2]
    close(nbx.layer_norm(T(a, dtype, device), (8,), w, b, eps=1e-5),
          ref_ln(a, 1, p[0, ::2], p[1, ::2], 1e-5), dtype)
    close(nbx.rms_norm(T(a, dtype, device), (8,), w, eps=1e-6),
          ref_ln(a, 1, p[0, ::2], None, 1e-6, rms=True), dtype)
    a4 = arr((2, 4, 3), dtype, g)
    grp = a4.reshape(2, 2, -1)
    mu = grp.mean(-1, keepdims=True)
    y = ((grp - mu) / np.sqrt(((grp - mu) ** 2).mean(-1, keepdims=True) + 1e-5)).reshape(a4.shape)
    close(nbx.group_norm(T(a4, dtype, device), 2, w[:4], b[:4], eps=1e-5),
          y * p[0, :8:2, None] + p[1, :8:2, None], dtype)
    mean, var = p[2, :8:2], np.abs(p[3, :8:2]) + 0.5
    V = T(np.abs(p[3]) + 0.5, dtype, device)
    out = nbx.nn.functional.batch_norm(T(a4, dtype, device), P[2, :8:2], V[:8:2], w[:4], b[:4],
                                       False, 0.1, 1e-5)
    ref = (a4 - mean[:, None]) / np.sqrt(var[:, None] + 1e-5) * p[0, :8:2, None] \
        + p[1, :8:2, None]
    close(out, ref, dtype)


def test_functional_namespace_lists_only_what_exists():
    """nbx.nn.functional's __all__ / dir() name only functions that resolve, so a star import
    works (a listed-but-missing name made `from nbxtensor.nn.functional import *` raise)."""
    F = nbx.nn.functional
    assert [n for n in F.__all__ if not callable(getattr(F, n, None))] == []
    ns = {}
    exec("from nbxtensor.nn.functional import *", ns)
    def base(f):    # nbx's dim-taking functions wrap the op to accept axis=/keepdims=
        return getattr(f, "__wrapped__", f)
    assert base(ns["softmax"]) is base(nbx.softmax) and ns["hardswish"] is nbx.hardswish


# ------------------------------------------------------------------ bandwidth variants (sweep)
@pytest.mark.parametrize("rows", [2, 4])
def test_norm_multi_row_tiles(device, monkeypatch, rows):
    """Several rows a program (the cuda rule takes two at 4096 columns, 16-bit) stay exact:
    tiles overhanging R, rows whose mean is far from zero, the residual form."""
    if device == "cpu":
        pytest.skip("kernel path only")
    import nbxtensor.kernels.norm as kn
    monkeypatch.setattr(kn, "_OVERRIDE", {"BLOCK_R": rows, "num_warps": 4})
    g = rng()
    dtype = nbx.bfloat16
    a = q(arr((9, 33), dtype, g, scale=3.0) + 200.0, dtype)   # R = 4*2 + 1, N = 32 + 1
    r = q(arr((9, 33), dtype, g), dtype)
    w = arr((33,), dtype, g)
    b = arr((33,), dtype, g)
    x, rr, wt, bt = (T(t, dtype, device) for t in (a, r, w, b))
    close(nbx.layer_norm(x, (33,), wt, bt), ref_ln(a, 1, w, b, 1e-5), dtype, atol_scale=2)
    out, h = nbx.add_layer_norm(x, rr, wt, bt)
    hs = q(a + r, dtype)
    close(h, hs, dtype)
    close(out, ref_ln(hs, 1, w, b, 1e-5), dtype, atol_scale=2)
    close(nbx.rms_norm(x, (33,), wt, 1e-6), ref_ln(a, 1, w, None, 1e-6, rms=True), dtype,
          atol_scale=2)


@pytest.mark.parametrize("single", [False, True])
def test_norm_kernel_compiles_for_sm90(single):
    # interp can run what Triton's sm_90 compiler refuses (the looping path once failed on
    # the H200 that way): compile both paths here
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from nbxtensor.kernels.norm import _norm_kernel
    sig = {n: "*bf16" for n in ("x_ptr", "r_ptr", "w_ptr", "b_ptr", "o_ptr", "h_ptr")}
    sig.update({n: "i32" for n in ("R", "N", "s_x", "s_r", "s_o", "s_h")}, eps="fp32")
    cx = dict(BLOCK_R=2, BLOCK_N=128, SINGLE=single, RMS=False, HAS_W=True, HAS_B=True,
              HAS_RES=True, F64=False)
    sig.update({k: "constexpr" for k in cx})
    k = triton.compile(triton.compiler.ASTSource(fn=_norm_kernel, signature=sig, constexprs=cx),
                       target=GPUTarget("cuda", 90, 64))
    assert "ld.global" in k.asm["ptx"]
