"""Matrix products against float64 NumPy: every matmul broadcasting case, mm/bmm/mv/dot/outer,
addmm/baddbmm (alpha, beta), linear and its fused epilogues, the GEMV path, tails of every
tile, transposed and broadcast (stride-0) inputs, poisoned outputs, NaN/inf, fp32 policy."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import H200, rng

pytestmark = pytest.mark.usefixtures("poison_outputs")


# relative tolerance of a K-term fp32-accumulated product, scaled by |A| @ |B|
MM_TOL = {nbx.float32: 1e-5, nbx.float16: 1e-2, nbx.bfloat16: 1e-2, nbx.float64: 1e-12}
DTYPES = [nbx.float32, nbx.bfloat16, nbx.float16]


def arr(shape, dtype, gen=None):
    """Random values exactly representable in `dtype` (so the reference sees the same inputs)."""
    gen = gen or rng()
    return gen.standard_normal(shape).astype(dtype.np).astype(np.float64)


def T(a, dtype, device):
    return nbx.tensor(np.asarray(a).astype(dtype.np), device=device)


def poison(shape, dtype, device):
    return nbx.tensor(np.full(shape, np.nan, dtype=dtype.np), device=device)


def check(out, ref, scale, dtype, tol=None):
    """|out - ref| <= tol * scale elementwise, scale = |A| @ |B| (+ |epilogue terms|)."""
    got = out.numpy().astype(np.float64) if isinstance(out, nbx.Tensor) else out
    assert got.shape == np.shape(ref), f"shape {got.shape} != {np.shape(ref)}"
    tol = MM_TOL[dtype] if tol is None else tol
    err = np.abs(got - ref)
    bound = tol * (np.abs(scale) + 1e-30) + 1e-30
    bad = ~(err <= bound)
    assert not bad.any(), (f"{bad.sum()} of {bad.size} elements off; worst err "
                           f"{np.nanmax(err)}, at bound {bound[np.unravel_index(np.argmax(np.where(bad, err, -1)), err.shape)] if err.ndim else bound}")


def ref_mm(a, b):
    return np.matmul(a, b), np.matmul(np.abs(a), np.abs(b))


# ------------------------------------------------------------------ matmul shapes
MATMUL_CASES = [
    ((7,), (7,)),                 # dot -> 0-dim
    ((5, 7), (7,)),               # mv
    ((7,), (7, 9)),               # vec @ mat
    ((33, 17), (17, 19)),         # mm
    ((3, 5, 7), (7,)),            # batched @ vec
    ((7,), (2, 7, 4)),            # vec @ batched
    ((3, 5, 7), (7, 6)),          # batched @ mat (folded into one mm)
    ((2, 5, 7), (2, 7, 6)),       # bmm
    ((2, 1, 5, 7), (3, 7, 6)),    # broadcast batch
    ((1, 5, 7), (4, 3, 7, 6)),    # broadcast batch, other side
    ((5, 7), (2, 3, 7, 4)),       # matrix @ batched
]


@pytest.mark.parametrize("sa,sb", MATMUL_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_broadcasting(device, sa, sb, dtype):
    g = rng()
    a, b = arr(sa, dtype, g), arr(sb, dtype, g)
    out = nbx.matmul(T(a, dtype, device), T(b, dtype, device))
    ref, scale = ref_mm(a, b)
    assert out.dtype is dtype and out.device == nbx.device(device)
    check(out, ref, scale, dtype)
    # the operator and the method agree
    check(T(a, dtype, device) @ T(b, dtype, device), ref, scale, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiles_overhang_every_block(device, dtype):
    """Small forced tiles: M, N overhang BLOCK_M/N by one, K is not a multiple of BLOCK_K."""
    from nbxtensor.kernels.matmul import config_override  # noqa: F401 (triton present in CI)
    g = rng()
    M, N, K = 16 * 4 + 1, 16 * 5 + 1, 40
    a, b = arr((M, K), dtype, g), arr((K, N), dtype, g)
    ref, scale = ref_mm(a, b)
    with config_override(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=3, num_warps=4,
                         num_stages=2):
        out = poison((M, N), dtype, device)
        r = nbx.matmul(T(a, dtype, device), T(b, dtype, device), out=out)
    assert r is out
    check(out, ref, scale, dtype)


@pytest.mark.parametrize("ta,tb", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16])
def test_transposed_and_sliced_inputs(device, ta, tb, dtype):
    """Transposed views and column slices go to the kernel as strides, without a copy."""
    g = rng()
    M, N, K = 37, 45, 29
    a = arr((K, M) if ta else (M, K + 3), dtype, g)
    b = arr((N, K) if tb else (K, N + 5), dtype, g)
    A = T(a, dtype, device).t() if ta else T(a, dtype, device)[:, 2:K + 2]
    B = T(b, dtype, device).t() if tb else T(b, dtype, device)[:, 1:N + 1]
    an = a.T if ta else a[:, 2:K + 2]
    bn = b.T if tb else b[:, 1:N + 1]
    ref, scale = ref_mm(an, bn)
    check(nbx.mm(A, B), ref, scale, dtype)


def test_batched_broadcast_strided(device):
    dtype = nbx.float32
    g = rng()
    a = arr((3, 5, 9), dtype, g)                     # take a permuted batch view
    b = arr((9, 2, 6), dtype, g)
    A = T(a, dtype, device).permute(0, 1, 2)[:, None]   # (3, 1, 5, 9)
    B = T(b, dtype, device).permute(1, 0, 2)            # (2, 9, 6) non-contiguous batch
    ref, scale = ref_mm(a[:, None], b.transpose(1, 0, 2))
    check(nbx.matmul(A, B), ref, scale, dtype)
    # an expanded (stride-0) operand
    E = T(a[0], dtype, device).expand(4, 5, 9)
    ref, scale = ref_mm(np.broadcast_to(a[0], (4, 5, 9)), b.transpose(1, 0, 2)[0])
    check(nbx.matmul(E, B[0]), ref, scale, dtype)
    # three batch dims whose strides cannot merge: the Python loop over the outermost
    a5 = arr((2, 3, 4, 3, 5), dtype, g)
    b5 = arr((3, 2, 4, 5, 2), dtype, g)
    A5 = T(a5, dtype, device).permute(0, 2, 1, 3, 4)
    B5 = T(b5, dtype, device).permute(1, 2, 0, 3, 4)
    ref, scale = ref_mm(a5.transpose(0, 2, 1, 3, 4), b5.transpose(1, 2, 0, 3, 4))
    check(nbx.matmul(A5, B5), ref, scale, dtype)


def test_bmm_mm_mv_dot_outer_inner(device):
    dtype = nbx.float32
    g = rng()
    a, b = arr((3, 4, 5), dtype, g), arr((3, 5, 6), dtype, g)
    check(nbx.bmm(T(a, dtype, device), T(b, dtype, device)), *ref_mm(a, b), dtype)
    m, v = arr((4, 5), dtype, g), arr((5,), dtype, g)
    check(nbx.mv(T(m, dtype, device), T(v, dtype, device)), *ref_mm(m, v), dtype)
    check(T(m, dtype, device).mv(T(v, dtype, device)), *ref_mm(m, v), dtype)
    w = arr((5,), dtype, g)
    d = nbx.dot(T(v, dtype, device), T(w, dtype, device))
    assert d.shape == ()
    check(d, *ref_mm(v, w), dtype)
    x, y = arr((4,), dtype, g), arr((6,), dtype, g)
    check(nbx.outer(T(x, dtype, device), T(y, dtype, device)), np.outer(x, y),
          np.abs(np.outer(x, y)), dtype)
    c = arr((3, 5), dtype, g)
    check(nbx.inner(T(m, dtype, device), T(c, dtype, device)), *ref_mm(m, c.T), dtype)


@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, -2.0), (0, 1.5)])
def test_addmm_baddbmm(device, beta, alpha):
    dtype = nbx.float32
    g = rng()
    inp, m1, m2 = arr((1, 7), dtype, g), arr((6, 5), dtype, g), arr((5, 7), dtype, g)
    if beta == 0:
        inp[0, 3] = np.nan          # beta=0 ignores input: NaN must not propagate
    ref = alpha * (m1 @ m2) + (beta * inp if beta else 0)
    scale = abs(alpha) * (np.abs(m1) @ np.abs(m2)) + (abs(beta) * np.abs(np.nan_to_num(inp)) if beta else 0)
    out = nbx.addmm(T(inp, dtype, device), T(m1, dtype, device), T(m2, dtype, device),
                    beta=beta, alpha=alpha)
    check(out, ref, scale, dtype)
    bi, b1, b2 = arr((3, 6, 1), dtype, g), arr((3, 6, 5), dtype, g), arr((3, 5, 4), dtype, g)
    ref = alpha * (b1 @ b2) + beta * bi
    scale = abs(alpha) * (np.abs(b1) @ np.abs(b2)) + abs(beta) * np.abs(bi)
    o = poison((3, 6, 4), dtype, device)
    nbx.baddbmm(T(bi, dtype, device), T(b1, dtype, device), T(b2, dtype, device),
                beta=beta, alpha=alpha, out=o)
    check(o, ref, scale, dtype)


def _act(x, act):
    from math import erf
    if act is None:
        return x
    if act == "gelu":
        return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))
    if act == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    if act == "silu":
        return x / (1 + np.exp(-x))
    if act == "relu":
        return np.maximum(x, 0)


@pytest.mark.parametrize("M", [1, 3, 16, 17, 33])      # 1..16 take the GEMV kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_bias_3d(device, M, dtype):
    g = rng()
    K, N = 300, 70                                     # K: one full 256-block plus a tail
    x, w, b = arr((1, M, K), dtype, g), arr((N, K), dtype, g), arr((N,), dtype, g)
    ref = x @ w.T + b
    scale = np.abs(x) @ np.abs(w.T) + np.abs(b)
    out = nbx.nn.functional.linear(T(x, dtype, device), T(w, dtype, device), T(b, dtype, device))
    assert out.shape == (1, M, N)
    check(out, ref, scale, dtype)
    out = nbx.linear(T(x, dtype, device)[0], T(w, dtype, device))   # no bias, 2-D
    check(out, x[0] @ w.T, np.abs(x[0]) @ np.abs(w.T), dtype)


@pytest.mark.parametrize("M", [1, 17])                 # GEMV and tiled
def test_linear_out(device, M):
    # out= through the planned path (a second call with the same kinds hits the plan): a
    # fresh poisoned buffer, a buffer at an offset into a bigger one, then outs the plan must
    # not take (wrong strides, dtype, shape), which go to the full path and its checks
    dt = nbx.float32
    g = rng()
    K, N = 70, 33
    for _ in range(3):
        x, w, b = arr((2, M, K), dt, g), arr((N, K), dt, g), arr((N,), dt, g)
        xt, wt_, bt = T(x, dt, device), T(w, dt, device), T(b, dt, device)
        ref, scale = x @ w.T + b, np.abs(x) @ np.abs(w.T) + np.abs(b)
        out = poison((2, M, N), dt, device)
        assert nbx.nn.functional.linear(xt, wt_, bt, out=out) is out
        check(out, ref, scale, dt)
        big = poison((2 * M * N + 5,), dt, device)
        view = big[5:].view(2, M, N)
        assert nbx.linear(xt, wt_, bt, out=view) is view
        check(view, ref, scale, dt)
        assert np.isnan(big[:5].numpy()).all()          # nothing written before the view
        strided = poison((2, M, 2 * N), dt, device)[:, :, ::2]
        nbx.linear(xt, wt_, bt, out=strided)             # a strided out: the full path
        check(strided, ref, scale, dt)
    with pytest.raises(TypeError, match="dtype"):
        nbx.linear(xt, wt_, bt, out=poison((2, M, N), nbx.float16, device))
    with pytest.raises(ValueError, match="shape"):
        nbx.linear(xt, wt_, bt, out=poison((2, M, N + 1), dt, device))


@pytest.mark.parametrize("M", [1, 130])                # GEMV and tiled
def test_products_out_aliasing_an_input(device, M):
    # out= sharing memory with an operand: the kernels read the operands while they write, so
    # the result goes through a temporary. K = N = 300 overhangs the tiles, so several
    # programs share rows: writing in place showed errors of ~1e8 on interp. linear twice
    # (the second call takes the plan path), matmul, addmm with out = its input, and dot.
    dt = nbx.float32
    g = rng()
    K = N = 300
    for _ in range(2):
        x, w, b = arr((M, K), dt, g), arr((N, K), dt, g), arr((N,), dt, g)
        xt = T(x, dt, device)
        assert nbx.linear(xt, T(w, dt, device), T(b, dt, device), out=xt) is xt
        check(xt, x @ w.T + b, np.abs(x) @ np.abs(w.T) + np.abs(b), dt)
    x, w = arr((M, K), dt, g), arr((K, N), dt, g)
    xt, wt_ = T(x, dt, device), T(w, dt, device)
    assert nbx.matmul(xt, wt_, out=xt) is xt
    check(xt, x @ w, np.abs(x) @ np.abs(w), dt)
    sq = arr((K, K), dt, g)                                     # out = the right operand
    st = T(sq, dt, device)
    assert nbx.matmul(xt, st, out=xt) is xt
    x2 = x @ w
    check(xt, x2 @ sq, np.abs(x2) @ np.abs(sq), dt)
    c, m1 = arr((M, N), dt, g), arr((M, K), dt, g)
    ct = T(c, dt, device)
    assert nbx.addmm(ct, T(m1, dt, device), wt_, beta=0.5, alpha=2.0, out=ct) is ct
    check(ct, 0.5 * c + 2.0 * (m1 @ w), 0.5 * np.abs(c) + 2.0 * np.abs(m1) @ np.abs(w), dt)
    v = arr((K + 1,), dt, g)
    vt = T(v, dt, device)
    assert nbx.dot(vt[1:], vt[1:], out=vt[0]) is not None      # out is the first element
    check(vt[0], v[1:] @ v[1:], np.abs(v[1:]) @ np.abs(v[1:]), dt)


@pytest.mark.parametrize("M", [1, 4, 20])
@pytest.mark.parametrize("act", [None, "gelu", "gelu_tanh", "silu", "relu"])
def test_fused_linear_epilogue(device, M, act):
    dtype = nbx.float32
    g = rng()
    K, N = 45, 37
    x, w, b, r = arr((M, K), dtype, g), arr((N, K), dtype, g), arr((N,), dtype, g), arr((M, N), dtype, g)
    z = x @ w.T + b
    ref = _act(z, act) + r
    scale = np.abs(x) @ np.abs(w.T) + np.abs(b) + np.abs(r)
    out = nbx.linear(T(x, dtype, device), T(w, dtype, device), T(b, dtype, device),
                     activation=act, residual=T(r, dtype, device))
    check(out, ref, scale, dtype, tol=1e-5 if act != "gelu_tanh" else 2e-5)


@pytest.mark.parametrize("M,K", [(1, 600), (5, 600), (2, 40)])
def test_gemv_split_k_and_poison(device, M, K, monkeypatch):
    """K split over several programs (deterministic two-pass reduce) and a single slice;
    weight as a transposed view (stride along K != 1) too."""
    import nbxtensor.kernels.gemv as kg
    monkeypatch.setattr(kg, "NOSPLIT_ROW_BYTES", 0)    # rows this short split only so
    dtype = nbx.bfloat16
    g = rng()
    N = 70
    x, w, b, r = arr((M, K), dtype, g), arr((N, K), dtype, g), arr((N,), dtype, g), arr((M, N), dtype, g)
    ref = _act(x @ w.T + b, "silu") + r
    scale = np.abs(x) @ np.abs(w.T) + np.abs(b) + np.abs(r)
    out = poison((M, N), dtype, device)
    nbx.ops.linalg.fused_linear(T(x, dtype, device), T(w, dtype, device), T(b, dtype, device),
                                activation="silu", residual=T(r, dtype, device), out=out)
    check(out, ref, scale, dtype)
    wt = T(w.T.copy(), dtype, device).t()             # [N, K] view with stride (1, N)
    check(nbx.linear(T(x, dtype, device), wt), x @ w.T, np.abs(x) @ np.abs(w.T), dtype)


@pytest.mark.parametrize("M", [1, 5])
def test_gemv_split_k_epilogue(device, monkeypatch, M):
    """Split-K GEMV: K = 600 in 64-slices (10 slices, the last a 24-wide tail), bias + silu
    + residual applied by the reduce kernel; twice, with fresh inputs."""
    if device == "cpu":
        pytest.skip("kernel path")
    import nbxtensor.kernels.gemv as kg
    monkeypatch.setattr(kg, "_OVERRIDE", dict(BLOCK_K=64))
    monkeypatch.setattr(kg, "NOSPLIT_ROW_BYTES", 0)
    dtype = nbx.bfloat16
    g = rng()
    K, N = 600, 70
    for _ in range(2):
        x, w, b, r = (arr((M, K), dtype, g), arr((N, K), dtype, g), arr((N,), dtype, g),
                      arr((M, N), dtype, g))
        out = nbx.linear(T(x, dtype, device), T(w, dtype, device), T(b, dtype, device),
                         activation="silu", residual=T(r, dtype, device))
        check(out, _act(x @ w.T + b, "silu") + r,
              np.abs(x) @ np.abs(w.T) + np.abs(b) + np.abs(r), dtype)


def test_gemv_short_rows_are_not_split(device, monkeypatch):
    """Rows of <= NOSPLIT_ROW_BYTES run in one launch (no partials, no reduce); longer rows
    split as TARGET says; the autotune sweep counts launches with the same rule."""
    if device == "cpu":
        pytest.skip("kernel path")
    import nbxtensor.kernels.gemv as kg
    from nbxtensor.autotune.sweep import _launch_signature
    from test_overhead import _items_spy
    seen = _items_spy(monkeypatch, kg, "_launch_items")
    kg._PLANS.clear()
    dtype = nbx.bfloat16
    g = rng()
    for K, want in ((1024, ["_gemv_kernel"]), (1032, ["_gemv_kernel", "_splitk_reduce_kernel"])):
        x, w = arr((1, K), dtype, g), arr((40, K), dtype, g)
        seen.clear()
        out = nbx.linear(T(x, dtype, device), T(w, dtype, device))
        assert [k for k, _ in seen] == want, (K, seen)
        check(out, x @ w.T, np.abs(x) @ np.abs(w.T), dtype)
    cands = [dict(BLOCK_M=1, BLOCK_N=32, BLOCK_K=64, TARGET=t) for t in (264, 528)]
    # N = 4000: 125 row blocks, so TARGET 264 / 528 ask for 3 / 5 slices where rows split
    assert _launch_signature("gemv", (1, 4000, 1024), cands[0], "bfloat16") == \
        _launch_signature("gemv", (1, 4000, 1024), cands[1], "bfloat16")
    assert _launch_signature("gemv", (1, 4000, 1024), cands[0], "float32") != \
        _launch_signature("gemv", (1, 4000, 1024), cands[1], "float32")


def test_nan_inf_propagate(device):
    dtype = nbx.float32
    g = rng()
    for M in (1, 12):                                 # GEMV and tiled kernels
        a, b = arr((M, 20), dtype, g), arr((20, 9), dtype, g)
        a[0, 3] = np.nan
        a[-1, 5] = np.inf
        out = nbx.matmul(T(a, dtype, device), T(b, dtype, device)).numpy()
        assert np.isnan(out[0]).all()
        with np.errstate(invalid="ignore"):
            ref = a[-1] @ b
        if M > 1:
            np.testing.assert_array_equal(out[-1], ref)   # +-inf by the sign of b[5]
        np.testing.assert_allclose(out[1:-1], a[1:-1] @ b, rtol=1e-5, atol=1e-5)


def test_empty_and_k0(device):
    dtype = nbx.float32
    z = nbx.matmul(T(np.ones((0, 4)), dtype, device), T(np.ones((4, 5)), dtype, device))
    assert z.shape == (0, 5)
    k0 = nbx.matmul(T(np.ones((3, 0)), dtype, device), T(np.ones((0, 5)), dtype, device))
    np.testing.assert_array_equal(k0.numpy(), np.zeros((3, 5)))
    b = arr((5,), dtype)
    lin = nbx.linear(T(np.ones((2, 0)), dtype, device), T(np.ones((5, 0)), dtype, device),
                     T(b, dtype, device))
    np.testing.assert_allclose(lin.numpy(), np.broadcast_to(b, (2, 5)), rtol=1e-6)


def test_float64(device):
    g = rng()
    a, b = arr((9, 13), nbx.float64, g), arr((13, 11), nbx.float64, g)
    check(nbx.matmul(T(a, nbx.float64, device), T(b, nbx.float64, device)), *ref_mm(a, b),
          nbx.float64)


def test_fp32_precision_policy(device):
    assert nbx.get_float32_matmul_precision() == "highest"
    g = rng()
    a, b = arr((20, 70), nbx.float32, g), arr((70, 18), nbx.float32, g)
    try:
        nbx.set_float32_matmul_precision("high")      # TF32 allowed: ~1e-3
        check(nbx.matmul(T(a, nbx.float32, device), T(b, nbx.float32, device)), *ref_mm(a, b),
              nbx.float32, tol=2e-3)
    finally:
        nbx.set_float32_matmul_precision("highest")
    with pytest.raises(ValueError, match="precision"):
        nbx.set_float32_matmul_precision("fast")


def test_errors(device):
    f32, f16 = nbx.float32, nbx.float16
    a = T(np.ones((3, 4)), f32, device)
    with pytest.raises(ValueError, match="cannot be multiplied"):
        nbx.matmul(a, T(np.ones((5, 2)), f32, device))
    with pytest.raises(TypeError, match="same dtype"):
        nbx.matmul(a, T(np.ones((4, 2)), f16, device))
    with pytest.raises(ValueError, match="at least 1 dim"):
        nbx.matmul(a, T(np.float32(2), f32, device))
    with pytest.raises(ValueError, match="2-D"):
        nbx.mm(a, T(np.ones(4), f32, device))
    with pytest.raises(ValueError, match="batch sizes"):
        nbx.bmm(T(np.ones((2, 3, 4)), f32, device), T(np.ones((3, 4, 2)), f32, device))
    with pytest.raises(ValueError, match="weight"):
        nbx.linear(a, T(np.ones((5, 3)), f32, device))
    with pytest.raises(ValueError, match="bias"):
        nbx.linear(a, T(np.ones((5, 4)), f32, device), T(np.ones(4), f32, device))
    with pytest.raises(ValueError, match="activation"):
        nbx.linear(a, T(np.ones((5, 4)), f32, device), activation="swish")
    with pytest.raises(ValueError, match="out has shape"):
        nbx.matmul(a, T(np.ones((4, 2)), f32, device), out=T(np.ones((3, 3)), f32, device))
    with pytest.raises(ValueError, match="broadcast"):
        nbx.addmm(T(np.ones((2, 3)), f32, device), a, T(np.ones((4, 2)), f32, device))
    if device != "cpu":
        i = nbx.tensor(np.ones((3, 4), np.int32), device=device)
        with pytest.raises(TypeError, match="int32"):
            nbx.matmul(i, nbx.tensor(np.ones((4, 2), np.int32), device=device))


def test_int_matmul_cpu():
    a = nbx.tensor(np.arange(12, dtype=np.int64).reshape(3, 4))
    b = nbx.tensor(np.arange(8, dtype=np.int64).reshape(4, 2))
    np.testing.assert_array_equal(nbx.matmul(a, b).numpy(), a.numpy() @ b.numpy())


def test_linalg_namespace():
    assert nbx.linalg.matmul is nbx.matmul
    assert callable(nbx.linalg.vector_norm)
    F = nbx.nn.functional
    assert F.linear is nbx.linear     # softmax: nbx's wraps F's for axis= (test_nn)
    assert getattr(nbx.softmax, "__wrapped__", None) is F.softmax


def _compile_sm90(cfg, dt, **flags):
    """Compile the tiled kernel for sm_90 with the launcher's usual specialisation (pointers
    16-byte aligned; ints divisible by 16 where named in flags['div16'])."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from nbxtensor.kernels.matmul import _matmul_kernel
    names = _matmul_kernel.arg_names
    div16 = flags.pop("div16", ("s_a0", "s_a1", "s_am", "s_b0", "s_b1", "s_bk", "K_SPLIT"))
    ce = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
              GROUP_M=8, EVEN_K=True, HINT_M=True, HINT_N=True, A_K1=True, A_M1=False,
              B_N1=True, B_K1=False, A_DIV=1, B_DIV=1, HAS_ALPHA=False, HAS_BIAS=True,
              HAS_RES=False, ACT=0, PRECISION="ieee", ACC_F64=False, SPLIT_K=False,
              PERSISTENT=False, FLATTEN=False, C_DIV=1)
    ce.update(flags)
    sig = {n: ("constexpr" if n in ce else "*" + dt.triton if n.endswith("_ptr")
               else "fp32" if n in ("alpha", "beta") else "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if n.endswith("_ptr") or n in div16}
    src = ASTSource(fn=_matmul_kernel, signature=sig, attrs=attrs,
                    constexprs={(names.index(k),): v for k, v in ce.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 64),
                          options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))


@pytest.mark.slow
def test_configs_compile_for_sm90():
    """Every tile the config rule can pick compiles for sm_90 within 227 KB of shared memory
    (also with the K tail, a K-major B and split-K); 16-bit tiles use wgmma and a cp.async
    pipeline. Needs triton's CUDA backend (no GPU)."""
    pytest.importorskip("triton")
    from nbxtensor.kernels.matmul import _TILES_16, matmul_config
    cfgs = [(nbx.bfloat16, dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st))
            for bm, bn, bk, w, st, _ in _TILES_16]
    cfgs += [(nbx.float32, matmul_config(M, 4096, 4096, nbx.float32, H200)) for M in (4096, 16)]
    for dt, cfg in cfgs:
        for flags in (dict(), dict(EVEN_K=False, B_N1=False, B_K1=True), dict(SPLIT_K=True)):
            k = _compile_sm90(cfg, dt, **flags)
            assert k.metadata.shared <= 227 * 1024, (cfg, flags, k.metadata.shared)
            if dt.itemsize == 2:
                ptx = k.asm["ptx"]
                assert "wgmma.mma_async" in ptx and "cp.async.cg.shared.global" in ptx, (cfg, flags)


@pytest.mark.slow
def test_tma_configs_compile_for_sm90():
    """The TMA kernel's sweep configs (bench_matmul.py --mm-sweep) compile for sm_90 within
    227 KB of shared memory, with wgmma and TMA (cp.async.bulk.tensor) loads."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from nbxtensor.kernels.matmul import _matmul_tma_kernel as kern
    names = kern.arg_names
    for bn, st, pers, flat, sub, b_t in [(256, 3, True, False, True, False),
                                         (256, 4, True, True, True, True),
                                         (256, 4, False, False, True, False),
                                         (256, 3, False, False, False, True),
                                         (128, 4, True, True, True, False)]:
        ce = dict(BLOCK_M=128, BLOCK_N=bn, BLOCK_K=64, GROUP_M=8, A_T=False, B_T=b_t,
                  C_DESC=True, SUBTILE=sub, PERSISTENT=pers, FLATTEN=flat, HAS_ALPHA=False,
                  HAS_BIAS=False, HAS_RES=False, ACT=0, SPLIT=False, PRECISION="ieee")
        sig = {n: ("constexpr" if n in ce else "*bf16" if n.endswith("_ptr")
                   else "fp32" if n in ("alpha", "beta") else "i32") for n in names}
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
                 if n.endswith("_ptr") or n in ("M", "N", "K", "s_a", "s_b", "s_c")}
        src = ASTSource(fn=kern, signature=sig, attrs=attrs,
                        constexprs={(names.index(k),): v for k, v in ce.items()})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 64),
                           options=dict(num_warps=8, num_stages=st))
        assert k.metadata.shared <= 227 * 1024, (ce, st, k.metadata.shared)
        ptx = k.asm["ptx"]
        assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx, (ce, st)


@pytest.mark.slow
def test_odd_strides_vectorise_for_sm90():
    """Row strides that are multiples of 8 elements but not 16 (K = 1000): without the
    A_DIV/B_DIV scaling the loads are element-wise and unpipelined (what made 1000^3 5x
    slower); with it, 16-byte cp.async. The peeled K tail keeps the main loop unmasked."""
    pytest.importorskip("triton")
    cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4)
    slow = _compile_sm90(cfg, nbx.bfloat16, div16=("K_SPLIT",), EVEN_K=False)
    fast = _compile_sm90(cfg, nbx.bfloat16, div16=("K_SPLIT",), EVEN_K=False, A_DIV=8, B_DIV=8)
    assert "cp.async" not in slow.asm["ptx"]
    assert fast.asm["ptx"].count("cp.async.cg.shared.global") >= 16
    assert fast.metadata.shared >= 3 * (128 * 64 + 64 * 128) * 2   # >= 3 stages in flight


@pytest.mark.parametrize("flatten", [False, True])
def test_persistent_variant(device, flatten):
    """The persistent kernel (a sweep option): few programs striding over all tiles of all
    batches, tails in M, N and K, broadcast batch, bias + residual epilogue."""
    if device == "cpu":
        pytest.skip("kernel variant")
    from nbxtensor.kernels.matmul import config_override
    dtype = nbx.float32
    g = rng()
    a, b = arr((2, 33, 40), dtype, g), arr((40, 35), dtype, g)
    r = arr((2, 33, 35), dtype, g)
    with config_override(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, PERSISTENT=True, NUM_PROGS=5,
                         FLATTEN=flatten):
        out = nbx.baddbmm(T(r, dtype, device), T(a, dtype, device),
                          T(b, dtype, device).expand(2, 40, 35), beta=0.5)
    check(out, a @ b + 0.5 * r, np.abs(a) @ np.abs(b) + np.abs(r), dtype)


# The TMA kernel (kernels/matmul.py `_matmul_tma_kernel`): 32-tiles overhang M = 72,
# N = 88 (TMA needs 16-byte row strides: multiples of 8) and K = 80 (a half-block K tail,
# zero-filled by the descriptor instead of masked).
TMA_TILE = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, num_warps=4, num_stages=2)


@pytest.mark.parametrize("mode", ["persistent", "flatten", "one-tile"])
@pytest.mark.parametrize("a_t,b_t", [(False, False), (False, True), (True, False), (True, True)])
def test_tma_variant(device, mode, a_t, b_t):
    """TMA loads for each operand layout (A or its transpose, B or linear's [N, K] weight),
    persistent (3 programs over 9 tiles, flattened or not) or one tile a program; the
    clipped descriptor store at the M/N tails; bf16 and fp16 in turn."""
    if device == "cpu":
        pytest.skip("kernel variant")
    from nbxtensor.kernels.matmul import config_override
    g = rng()
    M, N, K = 72, 88, 80
    dtype = nbx.bfloat16 if (a_t + b_t + len(mode)) % 2 else nbx.float16
    a, b = arr((M, K), dtype, g), arr((K, N), dtype, g)
    ta = T(a.T.copy(), dtype, device).t() if a_t else T(a, dtype, device)
    tb = T(b.T.copy(), dtype, device).t() if b_t else T(b, dtype, device)
    extra = dict(persistent=dict(NUM_PROGS=3), flatten=dict(NUM_PROGS=3, FLATTEN=True),
                 **{"one-tile": dict(PERSISTENT=False)})[mode]
    with config_override(TMA=True, **TMA_TILE, **extra):
        out = nbx.matmul(ta, tb)
    check(out, a @ b, np.abs(a) @ np.abs(b), dtype)


@pytest.mark.parametrize("subtile", [True, False])
def test_tma_epilogue_and_pointer_store(device, subtile):
    """The fused epilogue (alpha, bias, gelu, residual) in the TMA kernel, stored through
    the descriptor (whole or two half tiles) and, into an out= view whose row stride is
    not 16-byte aligned, by the masked pointer store."""
    if device == "cpu":
        pytest.skip("kernel variant")
    from nbxtensor.kernels.matmul import config_override
    dtype = nbx.bfloat16
    g = rng()
    M, N, K = 40, 48, 64
    x, w, bias, r = (arr((M, K), dtype, g), arr((N, K), dtype, g), arr((N,), dtype, g),
                     arr((M, N), dtype, g))
    ref = _act(x @ w.T + bias, "gelu") + r
    scale = np.abs(x) @ np.abs(w.T) + np.abs(bias) + np.abs(r)
    with config_override(TMA=True, SUBTILE=subtile, NUM_PROGS=2, **TMA_TILE):
        out = nbx.linear(T(x, dtype, device), T(w, dtype, device), T(bias, dtype, device),
                         activation="gelu", residual=T(r, dtype, device))
        check(out, ref, scale, dtype)
        big = poison((M, N + 3), dtype, device)
        view = big[:, 1:N + 1]                     # row stride 51: no descriptor store
        nbx.addmm(T(r, dtype, device), T(x, dtype, device), T(w.T.copy(), dtype, device),
                  beta=0.5, alpha=2.0, out=view)
    check(view, 2.0 * (x @ w.T) + 0.5 * r, 2.0 * np.abs(x) @ np.abs(w.T) + 0.5 * np.abs(r),
          dtype)
    assert np.isnan(big.numpy()[:, [0, N + 1, N + 2]].astype(np.float64)).all()


def test_tma_refuses_unreadable_operands(device):
    """Forced on operands TMA cannot read (row stride 83: not 16-byte aligned; fp64; a
    batch), the TMA kernel is refused with the reason, never silently replaced."""
    if device == "cpu":
        pytest.skip("kernel variant")
    from nbxtensor.kernels.matmul import config_override
    g = rng()
    dt = nbx.bfloat16
    cases = [((40, 83), (83, 48), dt, "16-byte aligned"), ((40, 64), (64, 48), nbx.float64,
             "float16, bfloat16 or float32"), ((2, 40, 64), (2, 64, 48), dt, "one batch")]
    for sa, sb, dtype, why in cases:
        with config_override(TMA=True, **TMA_TILE), pytest.raises(ValueError, match=why):
            nbx.matmul(T(arr(sa, dtype, g), dtype, device), T(arr(sb, dtype, g), dtype, device))


def test_tma_big_switch(device, monkeypatch):
    """kernels/matmul.py TMA_BIG (the A/B switch): None keeps the tiled kernel; a config
    sends products whose rule tile is 128x256 through the TMA kernel, and products TMA
    cannot read (unaligned K) through the tiled kernel."""
    if device == "cpu":
        pytest.skip("kernel variant")
    from nbxtensor import autotune
    from nbxtensor.backends import launch as L
    from nbxtensor.kernels import matmul as km
    names = []
    real = L.launch

    def spy(kernel, *args, **kw):
        names.append(kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel))
        return real(kernel, *args, **kw)
    monkeypatch.setattr(L, "launch", spy)
    monkeypatch.setattr(km, "_TILES_16", [(128, 256, 64, 8, 3, 1.0)])   # the rule picks 128x256
    dtype = nbx.bfloat16
    g = rng()
    for tma_big, K, expect in [(None, 64, "_matmul_kernel"), (TMA_TILE, 64, "_matmul_tma_kernel"),
                               (TMA_TILE, 43, "_matmul_kernel")]:
        monkeypatch.setattr(km, "TMA_BIG", tma_big)
        a, b = arr((40, K), dtype, g), arr((K, 48), dtype, g)
        names.clear()
        with autotune.disabled():
            out = nbx.matmul(T(a, dtype, device), T(b, dtype, device))
        check(out, a @ b, np.abs(a) @ np.abs(b), dtype)
        assert names == [expect], (tma_big, K, names)


@pytest.mark.parametrize("split", [2, 3])
def test_tiled_split_k(device, split):
    """The tiled kernel's split-K (used when the tiles do not fill the SMs): forced with small
    tiles, K = 70 (a 16-block tail in the last slice), bias + gelu + residual and alpha in the
    reduce kernel's epilogue."""
    if device == "cpu":
        pytest.skip("kernel path")
    from nbxtensor.kernels.matmul import config_override
    for dtype in (nbx.float32, nbx.bfloat16):
        g = rng()
        M, N, K = 33, 35, 70
        x, w, b, r = arr((M, K), dtype, g), arr((N, K), dtype, g), arr((N,), dtype, g), \
            arr((M, N), dtype, g)
        with config_override(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT=split):
            out = nbx.linear(T(x, dtype, device), T(w, dtype, device), T(b, dtype, device),
                             activation="gelu", residual=T(r, dtype, device))
            o2 = nbx.addmm(T(r, dtype, device), T(x, dtype, device), T(w.T.copy(), dtype, device),
                           alpha=0.5, beta=2.0)
        check(out, _act(x @ w.T + b, "gelu") + r,
              np.abs(x) @ np.abs(w.T) + np.abs(b) + np.abs(r), dtype)
        check(o2, 0.5 * (x @ w.T) + 2 * r, np.abs(x) @ np.abs(w.T) + 2 * np.abs(r), dtype)


def test_split_k_rule():
    from nbxtensor.kernels.matmul import splitk_factor
    assert splitk_factor(4096, 4096, 4096, 64, 512, 2, H200) == 1        # a full wave: no split
    assert splitk_factor(128, 2048, 8192, 64, 16, 2, H200) > 1           # 16 tiles, long K: split
    assert splitk_factor(128, 2048, 128, 64, 16, 2, H200) == 1           # short K: no split
    assert splitk_factor(128, 2048, 8192, 64, 16, 8, H200) == 1          # fp64: never


def test_matmul_refuses_an_expanded_out(device):
    """`out=` with several elements at one address would be written racily: refused, as the
    shape family already did (one shared check, ops/_common.check_out)."""
    a = nbx.tensor(np.random.default_rng().standard_normal((3, 4)).astype(np.float32), device=device)
    b = nbx.tensor(np.random.default_rng().standard_normal((4, 5)).astype(np.float32), device=device)
    out = nbx.empty(1, 5, device=device).expand(3, 5)
    with pytest.raises(RuntimeError, match="matmul: out has more than one element at one memory"):
        nbx.matmul(a, b, out=out)
    good = nbx.full((3, 5), float("nan"), device=device)
    nbx.matmul(a, b, out=good)
    np.testing.assert_allclose(good.numpy(), a.numpy().astype(np.float64) @ b.numpy(), rtol=1e-5,
                               atol=1e-5)


# ------------------------------------------------------------------ odd sizes (issue 5)
def _count_pads(monkeypatch):
    from nbxtensor.kernels import matmul as km
    calls = []
    orig = km._pad_copy

    def counting(t, unit_dim):
        calls.append(unit_dim)
        return orig(t, unit_dim)
    monkeypatch.setattr(km, "_pad_copy", counting)
    return calls


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("pad", [True, False])
def test_odd_sizes_padded_copies(device, monkeypatch, ta, tb, pad):
    """K and N not multiples of 8 (odd row strides): with PAD the misaligned operands are
    copied into 16-byte-padded buffers first (both orientations, the padded columns must
    never reach the output); without, the element-wise loads. K tail + M/N tails."""
    from nbxtensor.kernels.matmul import config_override
    calls = _count_pads(monkeypatch)
    dtype = nbx.bfloat16
    g = rng()
    M, N, K = 37, 35, 43
    a = arr((K, M) if ta else (M, K), dtype, g)
    b = arr((N, K) if tb else (K, N), dtype, g)
    A = T(a, dtype, device).t() if ta else T(a, dtype, device)
    B = T(b, dtype, device).t() if tb else T(b, dtype, device)
    an, bn = (a.T if ta else a), (b.T if tb else b)
    ref, scale = ref_mm(an, bn)
    with config_override(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, PAD=pad):
        out = nbx.mm(A, B)
    check(out, ref, scale, dtype)
    if device != "cpu":
        assert len(calls) == (2 if pad else 0)


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.float16])
def test_odd_sizes_batched_broadcast_padded(device, monkeypatch, dtype):
    """Padded copies of batched operands: a stride-0 (broadcast) batch dim stays stride 0
    (copied once), a permuted batch of transposed matrices, split-K over the padded
    operands, and the epilogue (bias + residual) on top."""
    from nbxtensor.kernels.matmul import config_override
    calls = _count_pads(monkeypatch)
    g = rng()
    M, N, K = 19, 21, 45
    a = arr((3, M, K), dtype, g)
    b = arr((2, N, K), dtype, g)
    r = arr((2, 3, M, N), dtype, g)
    A = T(a, dtype, device)[None]                       # (1, 3, M, K) -> broadcast over 2
    B = T(b, dtype, device).transpose(1, 2)[:, None]    # (2, 1, K, N), K-major
    ref = np.matmul(a[None], b.transpose(0, 2, 1)[:, None]) + r
    scale = np.matmul(np.abs(a[None]), np.abs(b.transpose(0, 2, 1)[:, None])) + np.abs(r)
    with config_override(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, PAD=True):
        out = nbx.baddbmm(T(r, dtype, device).reshape(6, M, N),
                          A.expand(2, 3, M, K).reshape(6, M, K),
                          B.expand(2, 3, K, N).reshape(6, K, N))
        out2 = nbx.matmul(A, B) + T(r, dtype, device)
    check(out.reshape(2, 3, M, N), ref, scale, dtype)
    check(out2, ref, scale, dtype, tol=2 * MM_TOL[dtype])
    x, w = arr((M, K), dtype, g), arr((N, K), dtype, g)
    with config_override(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, PAD=True, SPLIT=2):
        o3 = nbx.linear(T(x, dtype, device), T(w, dtype, device))
    check(o3, x @ w.T, np.abs(x) @ np.abs(w.T), dtype)
    if device != "cpu":
        assert calls, "the padded path was not taken"


@pytest.mark.parametrize("dtype", [nbx.bfloat16, nbx.float32])
def test_strides_multiple_of_8_not_16(device, dtype):
    """Row strides of 8k (not 16k) elements take the A_DIV/B_DIV vector path: row-major,
    transposed A (M a multiple of 8, unit stride along M) and K-major B, with a K tail."""
    from nbxtensor.kernels.matmul import config_override
    g = rng()
    M, N, K = 40, 24, 56          # K % 16 = 8, tiles of 16: every dim overhangs or tails
    a, bt = arr((K, M), dtype, g), arr((N, K), dtype, g)
    ref, scale = ref_mm(a.T, bt.T)
    with config_override(BLOCK_M=32, BLOCK_N=16, BLOCK_K=32, PAD=False):
        out = nbx.mm(T(a, dtype, device).t(), T(bt, dtype, device).t())
        out2 = nbx.mm(T(a.T.copy(), dtype, device), T(bt.T.copy(), dtype, device))
    check(out, ref, scale, dtype)
    check(out2, ref, scale, dtype)


def test_config_rule_fills_the_sms():
    """The default rule (kernels/matmul.py `matmul_config` + `splitk_factor`): big products
    keep the 128x256 tile, medium-M shapes get enough programs for the 132 SMs, every
    choice is in the autotune space, and smaller-than-a-wave grids split K when K is long."""
    from nbxtensor.autotune import space
    from nbxtensor.kernels.matmul import matmul_config, splitk_factor
    NUM_SMS = H200.sms
    from nbxtensor.kernels._host import cdiv
    tun = space.get_tunable("matmul")
    for n in (4096, 8192):
        c = matmul_config(n, n, n, nbx.bfloat16, H200)
        assert (c["BLOCK_M"], c["BLOCK_N"]) == (128, 256)
    for M in (17, 64, 128, 512, 2048):
        for K, N in [(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048), (2048, 128256),
                     (576, 576), (1536, 576), (576, 1536), (1000, 1000), (4093, 4095)]:
            for dt in (nbx.bfloat16, nbx.float16, nbx.float32):
                c = matmul_config(M, N, K, dt, H200)
                assert tun.contains(c, dt.name), (M, N, K, c)
            c = matmul_config(M, N, K, nbx.bfloat16, H200)
            tiles = cdiv(M, c["BLOCK_M"]) * cdiv(N, c["BLOCK_N"])
            split = splitk_factor(M, N, K, c["BLOCK_K"], tiles, 2, H200, c["BLOCK_M"],
                                  c["BLOCK_N"])
            assert split == 1 or tiles * split <= 2 * NUM_SMS
            if M * N >= 2048 * 512:
                assert tiles * split >= NUM_SMS * 0.5, (M, N, K, c, split)
    c = matmul_config(128, 2048, 8192, nbx.bfloat16, H200)
    tiles = cdiv(128, c["BLOCK_M"]) * cdiv(2048, c["BLOCK_N"])
    assert splitk_factor(128, 2048, 8192, c["BLOCK_K"], tiles, 2, H200, c["BLOCK_M"],
                         c["BLOCK_N"]) > 1


# ------------------------------------------------------------------ split-row softmax
# (kernels/softmax.py `_softmax_split_kernel`; the other softmax tests are in test_nn.py)
def _ref_softmax(a, dim, log):
    m = np.max(a, axis=dim, keepdims=True)
    with np.errstate(all="ignore"):
        m = np.where(np.isneginf(m), 0.0, m)
        e = np.exp(a - m)
        s = e.sum(axis=dim, keepdims=True)
        return (a - m - np.log(s)) if log else e / s


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16])
def test_softmax_split_rows(device, monkeypatch, log, dtype):
    """A few long rows cut into chunks (forced small: 5 chunks of 64, 32-column steps, a
    partial last chunk); over the last dim and over dim 0 of a transposed view; rows that
    are all -inf (NaN, as torch), -inf in whole chunks, NaN, +inf."""
    if device == "cpu":
        pytest.skip("kernel path")
    import nbxtensor.kernels.softmax as ks
    monkeypatch.setattr(ks, "_OVERRIDE", dict(SPLIT_CHUNK=64, SPLIT_BLOCK=32))
    g = rng()
    a = (g.standard_normal((6, 64 * 4 + 33)) * 4).astype(dtype.np).astype(np.float64)
    a[1, :] = -np.inf
    a[2, :200] = -np.inf                 # the first three chunks see only -inf
    a[3, 100] = np.nan
    a[4, 7] = np.inf
    fn = nbx.log_softmax if log else nbx.softmax
    got = fn(T(a, dtype, device), -1).numpy().astype(np.float64)
    # +inf: inf - inf = NaN in the row's sum, so the whole row is NaN (as torch)
    assert np.isnan(got[1]).all() and np.isnan(got[3]).all() and np.isnan(got[4]).all()
    tol = 2e-5 if dtype is nbx.float32 else 1e-2
    for r in (0, 2, 5):
        ref = _ref_softmax(a[r:r + 1], 1, log)
        np.testing.assert_allclose(got[r:r + 1], ref, rtol=tol, atol=tol)
    b = arr((289, 3), dtype, g)
    got = fn(T(b.T.copy(), dtype, device).t(), 0).numpy().astype(np.float64)  # strided dim
    np.testing.assert_allclose(got, _ref_softmax(b, 0, log), rtol=tol, atol=tol)


def test_softmax_split_rule():
    from nbxtensor.kernels.softmax import MAX_SINGLE, split_config
    assert split_config(16, MAX_SINGLE, H200) is None        # short rows: one program a row
    assert split_config(4096, 128256, H200) is None          # many rows fill the SMs already
    assert split_config(264, 128256, H200) is None           # 2 rows a SM
    assert split_config(263, 128256, H200) is not None
    chunk, n = split_config(16, 128256, H200)
    assert 16 * n >= 132 and chunk * n >= 128256 and chunk * (n - 1) < 128256
    chunk, n = split_config(1, 128256, H200)
    assert n >= 60 and chunk * (n - 1) < 128256


def test_batch_stride_beyond_int32_not_divided():
    """A_DIV/B_DIV hand strides over divided by 8 and the kernel multiplies them back in the
    quotient's integer type: a 2**32-element batch stride (8 GiB of fp16 between batches)
    divided to 2**29 came back as 2**32 wrapped in int32 = 0, so batch 1 read batch 0.
    interp over a sparse (never-touched) mapping: only the two batches' pages exist."""
    import mmap
    from nbxtensor.kernels.matmul import config_override
    from nbxtensor.storage import HostStorage
    from nbxtensor.tensor import Tensor
    M = N = K = 16
    S = 1 << 32
    nbytes = (S + M * K) * 2
    try:
        mm = mmap.mmap(-1, nbytes + 64, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                       | getattr(mmap, "MAP_NORESERVE", 0))
    except (OSError, OverflowError, ValueError) as e:
        pytest.skip(f"no 8 GiB sparse mapping here: {e}")
    raw = np.frombuffer(mm, np.uint8)
    start = (-raw.ctypes.data) % 64
    st = HostStorage(nbx.device("interp"), raw[start:start + nbytes])
    g = rng()
    a = arr((2, M, K), nbx.float16, g)
    b = arr((K, N), nbx.float16, g)
    flat = st.host_array().view(np.float16)
    flat[:M * K] = a[0].ravel()
    flat[S:S + M * K] = a[1].ravel()
    A = Tensor._make(st, (2, M, K), (S, K, 1), 0, nbx.float16)
    ref, scale = ref_mm(a, b)
    with config_override(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, PAD=False):
        out = nbx.matmul(A, T(b, nbx.float16, "interp"))
        # B as the operand with the huge batch stride (K-major rows, unit stride along N)
        Bt = Tensor._make(st, (2, K, N), (S, N, 1), 0, nbx.float16)
        out_b = nbx.matmul(T(b.T.copy(), nbx.float16, "interp"), Bt)
    check(out, ref, scale, nbx.float16)
    refb, scaleb = ref_mm(b.T, a)
    check(out_b, refb, scaleb, nbx.float16)
    del flat, raw, st, A, Bt


@pytest.mark.cuda
@pytest.mark.parametrize("case", ["mm_a_transposed", "mm_b_row_major", "gemv_w_transposed",
                                  "gemv_m4_w_transposed"])
def test_k_stride_beyond_int32_offsets(case):
    # a K stride S with 15 * S >= 2**31 elements: the K offsets (k * S for k < BLOCK_K, any
    # BLOCK_K >= 16) and the K step of the tiled matmul and of the GEMV must be int64 (int32
    # wrapped to a wrong or out-of-range address). The operands are small views into one
    # 32 * S-element bf16 buffer (16 GiB), given back to the driver afterwards.
    from conftest import DEVICES
    if "cuda" not in DEVICES:
        pytest.skip("needs a CUDA device")
    S = (1 << 28) + 8
    K = 32
    dt = nbx.bfloat16
    try:
        _k_stride_case(case, S, K, dt)
    finally:
        nbx.cuda.empty_cache()


def _k_stride_case(case, S, K, dt):
    base = nbx.empty((K * S,), dtype=dt, device="cuda")
    rows = base.view(K, S)                       # rows[k, j] at k * S + j
    g = rng()
    M, N = (4 if case == "gemv_m4_w_transposed" else 1 if case.startswith("gemv") else 48), 40
    if case == "mm_a_transposed":                # A (M, K) with strides (1, S)
        a_np = arr((M, K), dt, g)
        a = rows[:, :M].t()
        a.copy_(T(a_np, dt, "cuda"))
        b_np = arr((K, N), dt, g)
        b = T(b_np, dt, "cuda")
        out = nbx.matmul(a, b)
    elif case == "mm_b_row_major":               # B (K, N) with strides (S, 1)
        a_np = arr((M, K), dt, g)
        a = T(a_np, dt, "cuda")
        b_np = arr((K, N), dt, g)
        b = rows[:, :N]
        b.copy_(T(b_np, dt, "cuda"))
        out = nbx.matmul(a, b)
    else:                                        # linear with W (N, K) strides (1, S)
        a_np = arr((M, K), dt, g)
        a = T(a_np, dt, "cuda")
        w_np = arr((N, K), dt, g)
        w = rows[:, :N].t()
        w.copy_(T(w_np, dt, "cuda"))
        assert w.stride() == (1, S)
        out = nbx.nn.functional.linear(a, w)
        b_np = w_np.T
    check(out, a_np @ b_np, np.abs(a_np) @ np.abs(b_np), dt)
