"""apply_rotary_emb (both conventions, Llama-3 scaling) and the fused RoPE + cache append."""
from __future__ import annotations

import math

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng

LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=64)


def ref_inv_freq(D, theta, scaling):
    """Independent transcription of HF's _compute_llama3_parameters, per frequency."""
    out = []
    for i in range(0, D, 2):
        f = 1.0 / theta ** (i / D)
        if scaling:
            old, fac = scaling["original_max_position_embeddings"], scaling["factor"]
            lo, hi = scaling["low_freq_factor"], scaling["high_freq_factor"]
            wl = 2 * math.pi / f
            if wl < old / hi:
                pass
            elif wl > old / lo:
                f = f / fac
            else:
                sm = (old / wl - lo) / (hi - lo)
                f = (1 - sm) * f / fac + sm * f
        out.append(f)
    return np.array(out)


def ref_rope(x, pos, D, theta=10000.0, interleaved=False, scaling=None):
    """x (B, H, T, D), pos (B, T); float64."""
    x = x.astype(np.float64)
    a = pos[:, None, :, None].astype(np.float64) * ref_inv_freq(D, theta, scaling)
    c, s = np.cos(a), np.sin(a)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
    y = np.empty_like(x)
    y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s
    if interleaved:
        y[..., 0::2], y[..., 1::2] = y1, y2
    else:
        y[..., :D // 2], y[..., D // 2:] = y1, y2
    return y


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("scaling", [None, LLAMA3])
def test_rope_conventions(device, interleaved, scaling):
    g = rng()
    B, H, T, D = 2, 3, 5, 12
    x = g.standard_normal((B, H, T, D)).astype(np.float32)
    pos = g.integers(0, 500, (B, T))
    o = nbx.apply_rotary_emb(nbx.tensor(x, device=device), nbx.tensor(pos, device=device),
                             theta=500000.0, interleaved=interleaved, scaling=scaling)
    np.testing.assert_allclose(o.numpy(), ref_rope(x, pos, D, 500000.0, interleaved, scaling),
                               rtol=1e-4, atol=1e-4)


def test_rope_in_place_bthd_bf16(device):
    """(B, T, H, D) layout, positions (T,), rotated in place (out=x), bf16."""
    g = rng()
    B, T, H, D = 1, 4, 3, 8
    x = g.standard_normal((B, T, H, D)).astype(nbx.bfloat16.np)
    pos = np.array([7, 8, 9, 1000], np.int32)
    t = nbx.tensor(x, device=device)
    r = nbx.apply_rotary_emb(t, nbx.tensor(pos, device=device), out=t, seq_dim=1)
    assert r is t
    ref = np.swapaxes(ref_rope(np.swapaxes(x.astype(np.float64), 1, 2), pos[None], D), 1, 2)
    np.testing.assert_allclose(t.numpy().astype(np.float64), ref, rtol=2e-2, atol=2e-2)


def test_rope_large_positions_accurate(device):
    """Angles reduced before cos/sin: still right at position 100k (fp32 angle as HF)."""
    x = np.ones((1, 1, 2, 4), np.float32)
    pos = np.array([[100000, 131071]])
    o = nbx.apply_rotary_emb(nbx.tensor(x, device=device), nbx.tensor(pos, device=device))
    ang = (pos[0].astype(np.float32)[:, None] * ref_inv_freq(4, 1e4, None).astype(np.float32))
    ang = ang.astype(np.float64)
    exp = np.concatenate([np.cos(ang) - np.sin(ang), np.cos(ang) + np.sin(ang)], -1)
    np.testing.assert_allclose(o.numpy()[0, 0], exp, rtol=1e-5, atol=1e-5)


def test_rope_refusals(device):
    x = nbx.zeros(1, 2, 3, 4, device=device)
    with pytest.raises(TypeError, match="positions"):
        nbx.apply_rotary_emb(x, nbx.zeros(3, device=device))
    with pytest.raises(ValueError, match="positions"):
        nbx.apply_rotary_emb(x, nbx.zeros(4, dtype=nbx.int64, device=device))
    with pytest.raises(ValueError, match="even"):
        nbx.apply_rotary_emb(nbx.zeros(1, 2, 3, 5, device=device),
                             nbx.zeros(3, dtype=nbx.int64, device=device))
    with pytest.raises(NotImplementedError, match="rope_type"):
        nbx.apply_rotary_emb(x, nbx.zeros(3, dtype=nbx.int64, device=device),
                             scaling={"rope_type": "yarn", "factor": 2.0})


@pytest.mark.parametrize("interleaved", [False, True])
def test_append_rope_fused(device, interleaved):
    g = rng()
    B, Hq, Hk, T, D, C = 2, 4, 2, 3, 8, 16
    q = g.standard_normal((B, Hq, T, D)).astype(np.float32)
    k = g.standard_normal((B, Hk, T, D)).astype(np.float32)
    v = g.standard_normal((B, Hk, T, D)).astype(np.float32)
    pos = np.array([[2, 3, 4], [10, 11, 12]])
    cache = nbx.KVCache(1, B, Hk, C, D, dtype=nbx.float32, device=device)
    qt, kt = nbx.tensor(q, device=device), nbx.tensor(k, device=device)
    cache.append_rope(0, qt, kt, nbx.tensor(v, device=device), nbx.tensor(pos, device=device),
                      interleaved=interleaved, scaling=LLAMA3)
    np.testing.assert_allclose(qt.numpy(), ref_rope(q, pos, D, interleaved=interleaved,
                                                    scaling=LLAMA3), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(kt.numpy(), k)          # k itself untouched
    rk = ref_rope(k, pos, D, interleaved=interleaved, scaling=LLAMA3)
    for b in range(B):
        np.testing.assert_allclose(cache.k.numpy()[0, b][:, pos[b]], rk[b], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(cache.v.numpy()[0, b][:, pos[b]], v[b])
    assert cache.lengths.numpy().tolist() == [5, 13]
