"""scaled_dot_product_attention, decode_attention and the KV cache vs float64 NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng

TOL = {nbx.float32: 2e-5, nbx.float16: 4e-3, nbx.bfloat16: 3e-2, nbx.float64: 1e-10}


def ref_sdpa(q, k, v, mask=None, causal=False, scale=None):
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    H, Hk = q.shape[-3], k.shape[-3]
    k = np.repeat(k, H // Hk, -3)
    v = np.repeat(v, H // Hk, -3)
    s = q @ np.swapaxes(k, -1, -2) * (scale if scale is not None else 1 / np.sqrt(q.shape[-1]))
    L, S = s.shape[-2:]
    if causal:
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask.astype(np.float64)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isinf(m), 0, m)
    e = np.exp(s - m)
    z = e.sum(-1, keepdims=True)
    return e / np.where(z == 0, 1, z) @ v


@pytest.fixture
def small_blocks():
    """Blocks of 16 on interp so shapes of 17..40 exercise tails and several KV blocks (and
    decode attention splits every cache longer than one block: ONE_MAX 0)."""
    from nbxtensor.kernels import attention as ka, decode_attention as kd
    ka._OVERRIDE = {"BLOCK_M": 16, "BLOCK_N": 16}
    kd._OVERRIDE = {"P": 3, "BLOCK_N": 16, "ONE_MAX": 0}
    yield
    ka._OVERRIDE = None
    kd._OVERRIDE = None


def _t(a, dtype, device):
    return nbx.tensor(np.asarray(a).astype(nbx.dtypes.as_dtype(dtype).np), device=device)


def _rand(g, shape, dtype):
    return g.standard_normal(shape).astype(nbx.dtypes.as_dtype(dtype).np)


CASES = [  # B, Hq, Hk, L, S, D, causal
    (1, 2, 2, 17, 33, 16, False),
    (2, 2, 2, 33, 17, 16, True),    # L > S causal
    (1, 4, 2, 17, 40, 24, True),    # GQA, L < S causal (top-left), D not a power of two
    (1, 2, 1, 1, 19, 16, False),
]


@pytest.mark.parametrize("case", CASES)
def test_sdpa_shapes(device, small_blocks, case):
    B, Hq, Hk, L, S, D, causal = case
    g = rng()
    q, k, v = _rand(g, (B, Hq, L, D), "float32"), _rand(g, (B, Hk, S, D), "float32"), \
        _rand(g, (B, Hk, S, D), "float32")
    o = nbx.scaled_dot_product_attention(_t(q, "float32", device), _t(k, "float32", device),
                                         _t(v, "float32", device), is_causal=causal,
                                         enable_gqa=Hq != Hk)
    np.testing.assert_allclose(o.numpy(), ref_sdpa(q, k, v, causal=causal), rtol=2e-5, atol=2e-5)


TMA_CASES = [  # B, Hq, Hk, L, S, D, causal, dtype, layout
    (1, 2, 2, 33, 47, 16, False, "float16", "bhsd"),    # tails on both lengths
    (2, 2, 2, 47, 33, 32, True, "bfloat16", "bhsd"),    # L > S causal
    (1, 4, 2, 17, 65, 16, True, "bfloat16", "bshd"),    # GQA, L < S causal, strided views
    (1, 2, 1, 1, 19, 16, False, "float16", "bhsd"),
    (1, 2, 2, 33, 48, 16, False, "bfloat16", "bhsd"),   # S a multiple of BLOCK_N: no mask
    (1, 2, 2, 48, 48, 32, True, "float16", "bshd"),     # causal, both lengths even
]
# the fast kernels: TMA (two loops, LAZY on/off) and the one-loop kernel for Hopper warp
# specialisation (WS=True; "off" = the same loop unspecialised)
TMA_VARIANTS = {"tma": {"TMA": True}, "tma-lazy": {"TMA": True, "LAZY": True},
                "ws": {"WS": True}, "ws-off": {"WS": "off"}}


@pytest.mark.parametrize("variant", sorted(TMA_VARIANTS))
@pytest.mark.parametrize("case", TMA_CASES)
def test_sdpa_tma_path(device, monkeypatch, case, variant):
    """The TMA kernels (tensor descriptors, zero-filled tails, clipped stores) with tiles that
    overhang; the other kernels are removed so the test fails if the path is not taken."""
    if device == "cpu":
        pytest.skip("kernel path: cuda/interp only")
    from nbxtensor.kernels import attention as ka
    B, Hq, Hk, L, S, D, causal, dtype, layout = case
    lazy = variant == "tma-lazy"
    g = rng()
    q, k, v = _rand(g, (B, Hq, L, D), dtype), _rand(g, (B, Hk, S, D), dtype), \
        _rand(g, (B, Hk, S, D), dtype)
    if layout == "bhsd":
        args = [_t(a, dtype, device) for a in (q, k, v)]
    else:   # (B, S, H, D) memory seen as (B, H, S, D)
        args = [_t(np.ascontiguousarray(np.swapaxes(a, 1, 2)), dtype, device).transpose(1, 2)
                for a in (q, k, v)]
    monkeypatch.setattr(ka, "_flash_fwd", None)
    monkeypatch.setattr(ka, "_flash_fwd_ws" if variant.startswith("tma") else "_flash_fwd_tma",
                        None)
    monkeypatch.setattr(ka, "_OVERRIDE", {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4,
                                          **TMA_VARIANTS[variant]})
    if lazy:    # scores that grow along the keys make the lazy rescale fire
        k = k * np.linspace(0.2, 4.0, S, dtype=np.float32)[:, None].astype(k.dtype)
        args[1] = (_t(k, dtype, device) if layout == "bhsd" else
                   _t(np.ascontiguousarray(np.swapaxes(k, 1, 2)), dtype, device).transpose(1, 2))
    if device == "cuda" and variant == "ws":
        # these small tiles are outside WS_VERIFIED: on the GPU the kernel refuses them (the
        # specialised compile was wrong there); the interpreter checks the loop's semantics
        with pytest.raises(ValueError, match="warp-specialised kernel is only run"):
            nbx.scaled_dot_product_attention(*args, is_causal=causal, enable_gqa=Hq != Hk)
        return
    o = nbx.scaled_dot_product_attention(*args, is_causal=causal, enable_gqa=Hq != Hk)
    tol = TOL[nbx.dtypes.as_dtype(dtype)]
    np.testing.assert_allclose(o.numpy().astype(np.float64), ref_sdpa(q, k, v, causal=causal),
                               rtol=tol, atol=tol)


def test_sdpa_tma_not_applicable_uses_pointer_kernel(device, monkeypatch):
    """TMA requested, but a mask / a head dim that is not a power of two: the pointer kernel
    runs (and is right); a pasted TUNED entry is used for 16-bit GPU inputs only."""
    if device == "cpu":
        pytest.skip("kernel path: cuda/interp only")
    from nbxtensor.kernels import attention as ka
    monkeypatch.setattr(ka, "_flash_fwd_tma", None)
    monkeypatch.setattr(ka, "_flash_fwd_ws", None)
    monkeypatch.setattr(ka, "_OVERRIDE", {"BLOCK_M": 16, "BLOCK_N": 16, "TMA": True, "WS": True})
    g = rng()
    q, k, v = (_rand(g, (1, 2, 17, 24), "float32") for _ in range(3))
    o = nbx.scaled_dot_product_attention(*(_t(a, "float32", device) for a in (q, k, v)))
    np.testing.assert_allclose(o.numpy(), ref_sdpa(q, k, v), rtol=2e-5, atol=2e-5)
    m = g.random((17, 17)) < 0.7
    q, k, v = (_rand(g, (1, 2, 17, 16), "float32") for _ in range(3))
    o = nbx.scaled_dot_product_attention(*(_t(a, "float32", device) for a in (q, k, v)),
                                         attn_mask=nbx.tensor(m, device=device))
    np.testing.assert_allclose(o.numpy(), ref_sdpa(q, k, v, mask=m), rtol=2e-5, atol=2e-5)
    tuned = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, TMA=True)
    monkeypatch.setattr(ka, "TUNED", {(128, True): tuned})
    assert ka.flash_config(128, 128, 2, causal=True) == tuned
    assert "TMA" not in ka.flash_config(128, 128, 2, causal=True, tuned=False)
    assert "TMA" not in ka.flash_config(128, 128, 2, causal=False)
    assert "TMA" not in ka.flash_config(128, 128, 4, causal=True)


@pytest.mark.parametrize("dtype", [nbx.float16, nbx.bfloat16, nbx.float64])
def test_sdpa_dtypes(device, small_blocks, dtype):
    g = rng()
    q, k, v = (_rand(g, (1, 2, n, 16), dtype) for n in (18, 21, 21))
    o = nbx.scaled_dot_product_attention(_t(q, dtype, device), _t(k, dtype, device),
                                         _t(v, dtype, device), is_causal=True)
    assert o.dtype == dtype
    np.testing.assert_allclose(o.numpy().astype(np.float64), ref_sdpa(q, k, v, causal=True),
                               rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("D", [127, 128, 129])
def test_sdpa_head_dims(device, small_blocks, D):
    g = rng()
    L = 5 if device == "interp" else 37
    q, k, v = (_rand(g, (1, 1, L, D), "float32") for _ in range(3))
    o = nbx.scaled_dot_product_attention(*(_t(a, "float32", device) for a in (q, k, v)),
                                         scale=0.3)
    np.testing.assert_allclose(o.numpy(), ref_sdpa(q, k, v, scale=0.3), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("form", ["bool_full", "bool_bcast", "float_full", "float_row"])
def test_sdpa_masks(device, small_blocks, form):
    g = rng()
    B, H, L, S, D = 2, 2, 17, 20, 16
    q, k, v = _rand(g, (B, H, L, D), "float32"), _rand(g, (B, H, S, D), "float32"), \
        _rand(g, (B, H, S, D), "float32")
    if form == "bool_full":
        m = g.random((B, H, L, S)) < 0.6
        m[0, 1, 4] = False            # a fully masked row: 0 (torch's safe softmax)
        m[1, 0, :, 0] = True
    elif form == "bool_bcast":
        m = g.random((L, S)) < 0.6     # broadcast over B and H (stride 0)
        m[3] = False
    elif form == "float_full":
        m = g.standard_normal((B, H, L, S)).astype(np.float32)
        m[1, 1, 2] = -np.inf
    else:
        m = g.standard_normal((B, 1, 1, S)).astype(np.float32)
    o = nbx.scaled_dot_product_attention(*(_t(a, "float32", device) for a in (q, k, v)),
                                         attn_mask=nbx.tensor(m, device=device))
    r = ref_sdpa(q, k, v, mask=m)
    out = o.numpy()
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, r, rtol=2e-5, atol=2e-5)


def test_sdpa_strided_and_determinism(device, small_blocks):
    """(B, L, H, D) memory viewed as (B, H, L, D), as models produce; three calls agree."""
    g = rng()
    B, L, H, D = 2, 19, 4, 16
    buf = _rand(g, (B, L, 3, H, D), "float16")
    t = nbx.tensor(buf, device=device)
    q, k, v = (t[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    outs = [nbx.scaled_dot_product_attention(q, k, v, is_causal=True).numpy() for _ in range(3)]
    r = ref_sdpa(*(np.swapaxes(buf[:, :, i], 1, 2) for i in range(3)), causal=True)
    np.testing.assert_allclose(outs[0].astype(np.float64), r, rtol=4e-3, atol=4e-3)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_sdpa_3d_and_empty(device):
    g = rng()
    q, k, v = (_rand(g, (2, n, 8), "float32") for n in (3, 5, 5))
    o = nbx.scaled_dot_product_attention(*(_t(a, "float32", device) for a in (q, k, v)))
    assert tuple(o.shape) == (2, 3, 8)
    np.testing.assert_allclose(o.numpy(), ref_sdpa(q, k, v), rtol=2e-5, atol=2e-5)
    e = nbx.scaled_dot_product_attention(*(_t(a, "float32", device) for a in
                                           (q, k[:, :0], v[:, :0])))
    assert np.array_equal(e.numpy(), np.zeros((2, 3, 8), np.float32))


def test_sdpa_refusals(device):
    z = nbx.zeros(1, 4, 3, 8, device=device)
    kv = nbx.zeros(1, 2, 3, 8, device=device)
    with pytest.raises(ValueError, match="enable_gqa"):
        nbx.scaled_dot_product_attention(z, kv, kv)
    with pytest.raises(ValueError, match="multiple"):
        nbx.scaled_dot_product_attention(z, nbx.zeros(1, 3, 3, 8, device=device),
                                         nbx.zeros(1, 3, 3, 8, device=device), enable_gqa=True)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        nbx.scaled_dot_product_attention(z, z, z, dropout_p=0.1)
    with pytest.raises(ValueError, match="not both"):
        nbx.scaled_dot_product_attention(z, z, z, is_causal=True,
                                         attn_mask=nbx.ones(3, 3, dtype=nbx.bool, device=device))
    with pytest.raises(TypeError, match="attn_mask"):
        nbx.scaled_dot_product_attention(z, z, z, attn_mask=nbx.ones(3, 3, dtype=nbx.int32,
                                                                      device=device))
    with pytest.raises(ValueError, match="broadcast"):
        nbx.scaled_dot_product_attention(z, z, z, attn_mask=nbx.ones(2, 3, dtype=nbx.bool,
                                                                      device=device))
    with pytest.raises(TypeError, match="dtype"):
        nbx.scaled_dot_product_attention(z, z.half(), z)


# ------------------------------------------------------------------ decode attention
def ref_decode(q, kc, vc, n):
    T = q.shape[2]
    keep = np.arange(n)[None, :] <= (n - T + np.arange(T))[:, None]
    return ref_sdpa(q, kc[:, :, :n], vc[:, :, :n], mask=keep)


@pytest.mark.parametrize("n,T,Hq", [(1, 1, 4), (16, 1, 4), (37, 1, 4), (48, 1, 4), (50, 3, 4),
                                    (64, 2, 4), (29, 3, 12)])
def test_decode_attention(device, small_blocks, n, T, Hq):
    """Lengths 1, a chunk multiple and not, T new tokens; Hq=12/Hk=2 gives 18 rows (> 16)."""
    g = rng()
    B, Hk, C, D = 1, 2, 70, 20
    q = _rand(g, (B, Hq, T, D), "float32")
    kc, vc = _rand(g, (B, Hk, C, D), "float32"), _rand(g, (B, Hk, C, D), "float32")
    o = nbx.decode_attention(_t(q, "float32", device), _t(kc, "float32", device),
                             _t(vc, "float32", device),
                             nbx.tensor(np.array(n, np.int32), device=device))
    np.testing.assert_allclose(o.numpy(), ref_decode(q, kc, vc, n), rtol=2e-5, atol=2e-5)


def test_decode_attention_per_batch_lengths_bf16(device, small_blocks):
    g = rng()
    B, Hq, Hk, C, D = 2, 2, 1, 40, 16
    q = _rand(g, (B, Hq, 1, D), "bfloat16")
    kc, vc = _rand(g, (B, Hk, C, D), "bfloat16"), _rand(g, (B, Hk, C, D), "bfloat16")
    lens = np.array([33, 5], np.int64)
    o = nbx.decode_attention(_t(q, "bfloat16", device), _t(kc, "bfloat16", device),
                             _t(vc, "bfloat16", device), nbx.tensor(lens, device=device))
    for b in range(B):
        np.testing.assert_allclose(o.numpy()[b:b + 1].astype(np.float64),
                                   ref_decode(q[b:b + 1], kc[b:b + 1], vc[b:b + 1], lens[b]),
                                   rtol=3e-2, atol=3e-2)


def test_decode_same_launch_new_length(device, small_blocks):
    """The length lives on the device: change it in place, call again, get the new answer."""
    g = rng()
    q = _rand(g, (1, 2, 1, 16), "float32")
    kc, vc = _rand(g, (1, 1, 40, 16), "float32"), _rand(g, (1, 1, 40, 16), "float32")
    lens = nbx.tensor(np.array([9], np.int32), device=device)
    args = [_t(a, "float32", device) for a in (q, kc, vc)]
    o1 = nbx.decode_attention(*args, lens).numpy()
    lens.fill_(35)
    o2 = nbx.decode_attention(*args, lens).numpy()
    np.testing.assert_allclose(o1, ref_decode(q, kc, vc, 9), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(o2, ref_decode(q, kc, vc, 35), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("override", [
    {"P": 4, "BLOCK_N": 16, "COMBINE": 1, "CHUNK_P": 1, "ONE_MAX": 0},   # fused merge
    {"P": 5, "BLOCK_N": 16, "COMBINE": 0, "CHUNK_P": 2, "ONE_MAX": 0},   # second kernel
    {"P": 2, "BLOCK_N": 32, "COMBINE": 1, "ONE_MAX": 0},                 # default chunk
    # ONE_MAX 37: lengths up to 37 one range, 89 split over the four
    {"P": 4, "BLOCK_N": 16, "COMBINE": 1, "ONE_MAX": 37},
    {"P": 5, "BLOCK_N": 16, "COMBINE": 0, "ONE_MAX": 37},
    {"P": 5, "BLOCK_N": 16, "COMBINE": 0},                               # the shipped ONE_MAX
])
def test_decode_merge_variants(device, override):
    """Every tuning knob of the decode kernel: lengths 0, 1 (one busy range, no merge), a
    few ranges and all P ranges per batch; three calls give identical results, so the
    ticket counters are back at 0 after each launch."""
    from nbxtensor.kernels import decode_attention as kd   # (the knobs do nothing on cpu)
    g = rng()
    B, Hq, Hk, T, C, D = 4, 6, 2, 2, 90, 24
    q = _rand(g, (B, Hq, T, D), "float32")
    kc, vc = _rand(g, (B, Hk, C, D), "float32"), _rand(g, (B, Hk, C, D), "float32")
    lens = np.array([0, 1, 37, 89], np.int32)
    args = [_t(a, "float32", device) for a in (q, kc, vc)] + [nbx.tensor(lens, device=device)]
    kd._OVERRIDE = override
    try:
        outs = [nbx.decode_attention(*args).numpy() for _ in range(3)]
    finally:
        kd._OVERRIDE = None
    for b, n in enumerate(lens):
        want = np.zeros((1, Hq, T, D)) if n == 0 else ref_decode(q[b:b + 1], kc[b:b + 1],
                                                                 vc[b:b + 1], n)
        if n == 1:   # T=2 > length: the first token sees no key -> 0 (safe softmax)
            want[:, :, 0] = 0
        np.testing.assert_allclose(outs[0][b:b + 1], want, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_kv_cache_append_then_decode(device, small_blocks):
    g = rng()
    L, B, Hk, C, D, Hq = 2, 2, 2, 24, 8, 4
    cache = nbx.KVCache(L, B, Hk, C, D, dtype=nbx.float32, device=device)
    k, v = _rand(g, (B, Hk, 5, D), "float32"), _rand(g, (B, Hk, 5, D), "float32")
    # (B, T, Hk, D) memory viewed as (B, Hk, T, D): strided input
    kt = nbx.tensor(np.ascontiguousarray(np.swapaxes(k, 1, 2)), device=device).transpose(1, 2)
    pos = nbx.tensor(np.arange(5), device=device)
    cache.append(1, kt, _t(v, "float32", device), pos)
    assert cache.lengths.numpy().tolist() == [5, 5]
    kl, vl, lens = cache.view(1)
    np.testing.assert_array_equal(kl.numpy()[:, :, :5], k)
    np.testing.assert_array_equal(vl.numpy()[:, :, :5], v)
    assert not np.any(cache.k.numpy()[0]) and not np.any(kl.numpy()[:, :, 5:])
    # one more token per batch at different positions, read from the device
    k1, v1 = _rand(g, (B, Hk, 1, D), "float32"), _rand(g, (B, Hk, 1, D), "float32")
    cache.append(1, _t(k1, "float32", device), _t(v1, "float32", device),
                 nbx.tensor(np.array([[5], [9]]), device=device))
    assert cache.lengths.numpy().tolist() == [6, 10]
    np.testing.assert_array_equal(kl.numpy()[1, :, 9], k1[1, :, 0])
    q = _rand(g, (B, Hq, 1, D), "float32")
    o = nbx.decode_attention(_t(q, "float32", device), kl, vl, lens)
    kn, vn = kl.numpy(), vl.numpy()
    for b, n in enumerate([6, 10]):
        np.testing.assert_allclose(o.numpy()[b:b + 1], ref_decode(q[b:b + 1], kn[b:b + 1],
                                                                   vn[b:b + 1], n),
                                   rtol=2e-5, atol=2e-5)
    # an out-of-range position raises (cuda: at the next sync) and is not written
    bad = nbx.tensor(np.array([C]), device=device)
    with pytest.raises(IndexError, match=r"positions .* valid range is \[0, 23\]"):
        cache.append(0, _t(k1, "float32", device), _t(v1, "float32", device), bad)
        if device == "cuda":
            nbx.cuda.synchronize()
    assert not np.any(cache.k.numpy()[0])
    with pytest.raises(IndexError):
        cache.check_positions(bad)
    with pytest.raises(ValueError, match="shape"):
        cache.append(0, _t(k, "float32", device)[:, :1], _t(v, "float32", device), pos)


def test_kv_cache_refuses_bad_dims():
    """Every size is checked, value_dim too (0 must not silently mean head_dim)."""
    with pytest.raises(ValueError, match="capacity must be a positive int, got 0"):
        nbx.KVCache(1, 1, 1, 0, 8)
    for bad in (0, -4, 2.0, True):
        with pytest.raises(ValueError, match=f"value_dim must be a positive int, got {bad!r}"):
            nbx.KVCache(1, 1, 1, 4, 8, value_dim=bad)
    assert nbx.KVCache(1, 1, 1, 4, 8).value_dim == 8
    assert tuple(nbx.KVCache(1, 1, 1, 4, 8, value_dim=6).v.shape) == (1, 1, 1, 4, 6)


def test_fully_masked_row_matches_torch(device):
    """torch (optional, cpu) decides what a fully masked row gives; we must agree."""
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 1, 3, 8)
    kv = torch.randn(1, 1, 4, 8)
    m = torch.ones(3, 4, dtype=torch.bool)
    m[1] = False
    r = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=m)
    o = nbx.scaled_dot_product_attention(nbx.tensor(q.numpy(), device=device),
                                         nbx.tensor(kv.numpy(), device=device),
                                         nbx.tensor(kv.numpy(), device=device),
                                         attn_mask=nbx.tensor(m.numpy(), device=device))
    np.testing.assert_allclose(o.numpy(), r.numpy(), rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("blocks", [(32, 16), (16, 16)])
@pytest.mark.parametrize("L,S", [(45, 45), (40, 70), (70, 21)])
def test_sdpa_causal_tiles(device, blocks, L, S):
    """BLOCK_M > BLOCK_N: several diagonal blocks per query tile; skipped blocks above it."""
    from nbxtensor.kernels import attention as ka
    ka._OVERRIDE = {"BLOCK_M": blocks[0], "BLOCK_N": blocks[1]}
    try:
        g = rng()
        q = _rand(g, (1, 1, L, 16), "float32")
        k, v = _rand(g, (1, 1, S, 16), "float32"), _rand(g, (1, 1, S, 16), "float32")
        o = nbx.scaled_dot_product_attention(*(_t(a, "float32", device) for a in (q, k, v)),
                                             is_causal=True)
    finally:
        ka._OVERRIDE = None
    np.testing.assert_allclose(o.numpy(), ref_sdpa(q, k, v, causal=True), rtol=2e-5, atol=2e-5)


def test_sdpa_tuned_fast_entry_falls_back(device, monkeypatch):
    """A TUNED WS/TMA entry that the call does not suit (a mask here) runs the pointer
    kernel with its untuned default tile, not the WS tile (TUNED applies off interp only,
    so flash_config is asked as for the GPU)."""
    if device == "cpu":
        pytest.skip("kernel path: cuda/interp only")
    import nbxtensor.backends.launch as bl
    from nbxtensor.kernels import attention as ka
    real_cfg, real_launch, seen = ka.flash_config, bl.launch, []
    monkeypatch.setattr(ka, "flash_config", lambda D, DV, size, interp=False, causal=False,
                        tuned=True: real_cfg(D, DV, 2, False, causal, tuned))
    monkeypatch.setattr(ka, "TUNED", {(16, False): dict(BLOCK_M=64, BLOCK_N=32, num_warps=4,
                                                        num_stages=2, WS=True)})
    monkeypatch.setattr(ka, "_flash_fwd_ws", None)

    def spy(kernel, grid, *a, **kw):
        seen.append((kernel.fn.__name__, kw["BLOCK_M"], kw["BLOCK_N"]))
        return real_launch(kernel, grid, *a, **kw)
    monkeypatch.setattr(bl, "launch", spy)
    g = rng()
    q, k, v = (_rand(g, (1, 2, 17, 16), "float32") for _ in range(3))
    m = g.random((17, 17)) < 0.7
    o = nbx.scaled_dot_product_attention(*(_t(a, "float32", device) for a in (q, k, v)),
                                         attn_mask=nbx.tensor(m, device=device))
    np.testing.assert_allclose(o.numpy(), ref_sdpa(q, k, v, mask=m), rtol=2e-5, atol=2e-5)
    default = real_cfg(16, 16, 2, tuned=False)
    assert seen == [("_flash_fwd", default["BLOCK_M"], default["BLOCK_N"])]


FAST_CFGS = [  # the sweep's TMA / warp-specialised candidates at production tiles
    dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, WS=True),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3, WS=True),
    dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, WS="off"),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3, TMA=True),
]


def _ws_refused(D, causal, cfg):
    """WS settings outside WS_VERIFIED (wrong on the H200 with Triton 3.6) must be refused."""
    from nbxtensor.kernels import attention as ka
    return cfg.get("WS") is True and (causal or (D, cfg["BLOCK_M"], cfg["BLOCK_N"],
                                                 cfg["num_warps"], cfg["num_stages"])
                                      not in ka.WS_VERIFIED)


@pytest.mark.parametrize("cfg", range(len(FAST_CFGS)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_sdpa_fast_kernels_cuda(device, monkeypatch, cfg, causal, D):
    """On the GPU machine: the real (warp-specialised, 12-warp) compile of each fast kernel
    vs float64, with tails on both lengths (L, S not multiples of 64/128), L < S and L > S
    causal, GQA; the pointer kernel is removed so the fast path must run."""
    if device != "cuda":
        pytest.skip("cuda only (production tiles; on interp the tiles are 16-32)")
    from nbxtensor.kernels import attention as ka
    monkeypatch.setattr(ka, "_flash_fwd", None)
    monkeypatch.setattr(ka, "_OVERRIDE", dict(FAST_CFGS[cfg]))
    g = rng()
    for L, S in ((300, 333), (333, 200), (256, 256)):
        q = _rand(g, (2, 4, L, D), "bfloat16")
        k, v = _rand(g, (2, 2, S, D), "bfloat16"), _rand(g, (2, 2, S, D), "bfloat16")
        args = [_t(a, "bfloat16", device) for a in (q, k, v)]
        if _ws_refused(D, causal, FAST_CFGS[cfg]):     # (this test runs on cuda only)
            with pytest.raises(ValueError, match="warp-specialised kernel is only run"):
                nbx.scaled_dot_product_attention(*args, is_causal=causal, enable_gqa=True)
            continue
        o = nbx.scaled_dot_product_attention(*args, is_causal=causal, enable_gqa=True)
        np.testing.assert_allclose(o.numpy().astype(np.float64),
                                   ref_sdpa(q, k, v, causal=causal), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 80, 128, 256])
def test_sdpa_vs_torch_cuda(device, causal, D):
    """On the GPU machine: the production tile configs at model sizes, against torch SDPA."""
    if device != "cuda":
        pytest.skip("cuda only (production tiles, large shapes)")
    torch = pytest.importorskip("torch")
    import ml_dtypes
    g = torch.Generator().manual_seed(0)
    tq, tk, tv = (torch.randn(2, 8, n, D, generator=g, dtype=torch.bfloat16)
                  for n in (1000, 1000, 1000))
    tk, tv = tk[:, :2], tv[:, :2]                      # GQA 8/2
    r = torch.nn.functional.scaled_dot_product_attention(
        tq.float(), tk.float(), tv.float(), is_causal=causal, enable_gqa=True)
    conv = [nbx.tensor(t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16),
                       device="cuda") for t in (tq, tk, tv)]
    o = nbx.scaled_dot_product_attention(*conv, is_causal=causal, enable_gqa=True)
    np.testing.assert_allclose(o.numpy().astype(np.float32), r.numpy(), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("scale", [-0.7, 0.0])
def test_sdpa_nonpositive_scale(device, small_blocks, scale):
    g = rng()
    q, k, v = (_rand(g, (1, 2, n, 16), "float32") for n in (17, 33, 33))
    o = nbx.scaled_dot_product_attention(*(_t(a, "float32", device) for a in (q, k, v)),
                                         scale=scale)
    np.testing.assert_allclose(o.numpy(), ref_sdpa(q, k, v, scale=scale), rtol=2e-5, atol=2e-5)


def test_decode_step_graph_replay(device):
    """cuda: RoPE+append, decode attention and sampling captured once, replayed at the next
    positions (changed in place on the device) == the eager step."""
    if device != "cuda":
        pytest.skip("CUDA graphs need the GPU")
    g = rng()
    B, Hq, Hk, C, D = 1, 8, 2, 256, 64
    cache = nbx.KVCache(1, B, Hk, C, D, dtype=nbx.bfloat16, device="cuda")
    k0 = nbx.tensor(_rand(g, (B, Hk, 100, D), "bfloat16"), device="cuda")
    cache.append(0, k0, k0, nbx.tensor(np.arange(100), device="cuda"))
    q = nbx.tensor(_rand(g, (B, Hq, 1, D), "bfloat16"), device="cuda")
    k = nbx.tensor(_rand(g, (B, Hk, 1, D), "bfloat16"), device="cuda")
    zero = nbx.tensor(np.array([0]), device="cuda")
    pos = nbx.tensor(np.array([100]), device="cuda")
    gen = nbx.Generator(7, device="cuda")

    def step():
        qq = nbx.apply_rotary_emb(q, zero)     # a fresh copy of q (angle 0), our kernels only
        cache.append_rope(0, qq, k, k, pos)
        o = nbx.decode_attention(qq, *cache.view(0))
        return o, nbx.sample(o.reshape(B, Hq * D), temperature=0.7, top_k=20, generator=gen)

    step()                                     # compile + load before capture
    pos.fill_(101)
    graph = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(graph):
        o_g, tok_g = step()
    pos.fill_(102)
    gen.manual_seed(3)
    graph.replay()
    got_o, got_tok = o_g.numpy(), tok_g.numpy()
    pos.fill_(102)
    gen.manual_seed(3)
    e_o, e_tok = step()
    np.testing.assert_array_equal(got_o, e_o.numpy())
    np.testing.assert_array_equal(got_tok, e_tok.numpy())
    assert cache.lengths.numpy().tolist() == [103]


def test_sdpa_nan_propagation(device, small_blocks):
    """NaN in a query row poisons that row only; a NaN key is invisible to rows that mask it."""
    g = rng()
    L = S = 19
    q, k, v = (_rand(g, (1, 1, n, 16), "float32") for n in (L, S, S))
    q[0, 0, 3, 5] = np.nan
    k[0, 0, 10, 2] = np.nan
    o = nbx.scaled_dot_product_attention(*(_t(a, "float32", device) for a in (q, k, v)),
                                         is_causal=True).numpy()[0, 0]
    assert np.isnan(o[3]).all() and np.isnan(o[10:]).all()
    fine = [i for i in range(L) if i != 3 and i < 10]
    r = ref_sdpa(q, k, v, causal=True)[0, 0]
    np.testing.assert_allclose(o[fine], r[fine], rtol=2e-5, atol=2e-5)
