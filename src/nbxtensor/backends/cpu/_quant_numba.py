"""The numba kernels of backends/cpu/quant.py: imported on first use only (the leading
underscore keeps dispatch's module scan away, so `import nbxtensor` never imports numba).

GEMVs read the GGUF blocks as stored, one row of bytes per output feature, and accumulate
in float32: per block, the dot of the small integers with x, times the block's scale
(w = d*q + m  =>  w.x = d*(q.x) + m*sum(x)), so a weight is never materialised.
Rows are split over the threads (prange), each row owned by one thread: the result does
not depend on the thread count. fastmath is limited to reassociation and FMA contraction
(the block dots vectorise); no nnan/ninf, so NaN and inf propagate as in the reference.
fp16 scales go through a 65536-entry table (exact, no bit tricks).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

_FM = {"reassoc", "contract"}
H2F = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@njit(cache=True, inline="always")
def _h(row, o, lut):
    return lut[np.int32(row[o]) | (np.int32(row[o + 1]) << 8)]


@njit(cache=True, fastmath=_FM)
def _block_sums(x, n):
    """Sums of x (M, K) over consecutive groups of n: (M, K // n)."""
    M, K = x.shape
    s = np.empty((M, K // n), np.float32)
    for i in range(M):
        for g in range(K // n):
            a = np.float32(0.0)
            for j in range(n):
                a += x[i, g * n + j]
            s[i, g] = a
    return s


@njit(cache=True, inline="always")
def _kscale(row, o, j):
    """Q4_K/Q5_K: the 6-bit scale and min of sub-block j from the 12 bytes at row[o:]."""
    if j < 4:
        return np.float32(row[o + j] & 63), np.float32(row[o + j + 4] & 63)
    sc = (row[o + j + 4] & 15) | ((row[o + j - 4] >> 6) << 4)
    mn = (row[o + j + 4] >> 4) | ((row[o + j] >> 6) << 4)
    return np.float32(sc), np.float32(mn)


# ------------------------------------------------------------------------------- GEMVs
# gemv_<fmt>(blocks, qi8, x, lut, out, res, nchunk, u16): out (M, N) = x (M, K) @ dequant(blocks).T
# (+ res (M, N) when res has rows); blocks (N, row_bytes) uint8, qi8 and u16 the same bytes
# as int8 and uint16 (every format's fp16 scales sit at even offsets).
# Rows go to the threads in nchunk contiguous chunks (one scratch allocation a chunk). Each
# row keeps 32 lane sums, acc[j] += q * (scale * x), across its blocks and adds them at the
# end: the lanes are independent, so the block loop vectorises without reordering a sum
# (a running scalar sum per block measured 3.3x slower on AVX-512).

@njit(cache=True, inline="always")
def _chunk(c, nchunk, N):
    return c * N // nchunk, (c + 1) * N // nchunk


@njit(cache=True, inline="always")
def _nibbles(q):
    """The low and high nibble of byte q as float32, split in float (exact): the integer
    split promotes to 64-bit lanes, half the vector width."""
    qf = np.float32(q)
    hi = np.floor(qf * np.float32(0.0625))
    return qf - np.float32(16.0) * hi, hi


@njit(cache=True, inline="always")
def _lanes(acc):
    y = np.float32(0.0)
    for j in range(32):
        y += acc[j]
    return y


@njit(parallel=True, cache=True, fastmath=_FM)
def gemv_q8_0(blocks, qi8, x, lut, out, res, nchunk, u16):
    N = blocks.shape[0]
    M, K = x.shape
    nb = K // 32
    has_res = res.shape[0] > 0
    for c in prange(nchunk):
        acc = np.empty(32, np.float32)
        r0, r1 = _chunk(c, nchunk, N)
        for r in range(r0, r1):
            row, rq, r16 = blocks[r], qi8[r], u16[r]
            for i in range(M):
                acc[:] = 0.0
                for b in range(nb):
                    o = b * 34
                    d = lut[r16[o // 2]]
                    for j in range(32):
                        acc[j] += np.float32(rq[o + 2 + j]) * (d * x[i, b * 32 + j])
                y = _lanes(acc)
                out[i, r] = y + res[i, r] if has_res else y


@njit(parallel=True, cache=True, fastmath=_FM)
def gemv_q4_0(blocks, qi8, x, lut, out, res, nchunk, u16):
    N = blocks.shape[0]
    M, K = x.shape
    nb = K // 32
    xs = _block_sums(x, 32)
    has_res = res.shape[0] > 0
    for c in prange(nchunk):
        acc = np.empty(32, np.float32)
        r0, r1 = _chunk(c, nchunk, N)
        for r in range(r0, r1):
            row, r16 = blocks[r], u16[r]
            for i in range(M):
                acc[:] = 0.0
                y = np.float32(0.0)
                for b in range(nb):
                    o = b * 18
                    d = lut[r16[o // 2]]
                    for j in range(16):
                        lo, hi = _nibbles(row[o + 2 + j])
                        acc[j] += lo * (d * x[i, b * 32 + j])
                        acc[16 + j] += hi * (d * x[i, b * 32 + 16 + j])
                    y -= np.float32(8.0) * d * xs[i, b]
                y += _lanes(acc)
                out[i, r] = y + res[i, r] if has_res else y


@njit(parallel=True, cache=True, fastmath=_FM)
def gemv_q4_1(blocks, qi8, x, lut, out, res, nchunk, u16):
    N = blocks.shape[0]
    M, K = x.shape
    nb = K // 32
    xs = _block_sums(x, 32)
    has_res = res.shape[0] > 0
    for c in prange(nchunk):
        acc = np.empty(32, np.float32)
        r0, r1 = _chunk(c, nchunk, N)
        for r in range(r0, r1):
            row, r16 = blocks[r], u16[r]
            for i in range(M):
                acc[:] = 0.0
                y = np.float32(0.0)
                for b in range(nb):
                    o = b * 20
                    d = lut[r16[o // 2]]
                    for j in range(16):
                        lo, hi = _nibbles(row[o + 4 + j])
                        acc[j] += lo * (d * x[i, b * 32 + j])
                        acc[16 + j] += hi * (d * x[i, b * 32 + 16 + j])
                    y += lut[r16[o // 2 + 1]] * xs[i, b]
                y += _lanes(acc)
                out[i, r] = y + res[i, r] if has_res else y


@njit(parallel=True, cache=True, fastmath=_FM)
def gemv_q4_k(blocks, qi8, x, lut, out, res, nchunk, u16):
    N = blocks.shape[0]
    M, K = x.shape
    nb = K // 256
    xs = _block_sums(x, 32)
    has_res = res.shape[0] > 0
    for ch in prange(nchunk):
        acc = np.empty(32, np.float32)
        r0, r1 = _chunk(ch, nchunk, N)
        for r in range(r0, r1):
            row = blocks[r]
            for i in range(M):
                acc[:] = 0.0
                y = np.float32(0.0)
                for b in range(nb):
                    o = b * 144
                    d, dm = _h(row, o, lut), _h(row, o + 2, lut)
                    for c in range(4):
                        sc0, mn0 = _kscale(row, o + 4, 2 * c)
                        sc1, mn1 = _kscale(row, o + 4, 2 * c + 1)
                        a0, a1 = d * sc0, d * sc1
                        base = b * 256 + c * 64
                        for l in range(32):
                            q = row[o + 16 + c * 32 + l]
                            acc[l] += np.float32(q & 15) * (a0 * x[i, base + l]) + \
                                np.float32(q >> 4) * (a1 * x[i, base + 32 + l])
                        g = b * 8 + 2 * c
                        y -= dm * (mn0 * xs[i, g] + mn1 * xs[i, g + 1])
                y += _lanes(acc)
                out[i, r] = y + res[i, r] if has_res else y


@njit(parallel=True, cache=True, fastmath=_FM)
def gemv_q5_k(blocks, qi8, x, lut, out, res, nchunk, u16):
    N = blocks.shape[0]
    M, K = x.shape
    nb = K // 256
    xs = _block_sums(x, 32)
    has_res = res.shape[0] > 0
    for ch in prange(nchunk):
        acc = np.empty(32, np.float32)
        r0, r1 = _chunk(ch, nchunk, N)
        for r in range(r0, r1):
            row = blocks[r]
            for i in range(M):
                acc[:] = 0.0
                y = np.float32(0.0)
                for b in range(nb):
                    o = b * 176
                    d, dm = _h(row, o, lut), _h(row, o + 2, lut)
                    for c in range(4):
                        j0 = 2 * c
                        sc0, mn0 = _kscale(row, o + 4, j0)
                        sc1, mn1 = _kscale(row, o + 4, j0 + 1)
                        a0, a1 = d * sc0, d * sc1
                        base = b * 256 + c * 64
                        for l in range(32):
                            q = row[o + 48 + c * 32 + l]
                            h = row[o + 16 + l]
                            acc[l] += np.float32((q & 15) | (((h >> j0) & 1) << 4)) * \
                                (a0 * x[i, base + l]) + \
                                np.float32((q >> 4) | (((h >> (j0 + 1)) & 1) << 4)) * \
                                (a1 * x[i, base + 32 + l])
                        g = b * 8 + j0
                        y -= dm * (mn0 * xs[i, g] + mn1 * xs[i, g + 1])
                y += _lanes(acc)
                out[i, r] = y + res[i, r] if has_res else y


@njit(parallel=True, cache=True, fastmath=_FM)
def gemv_q6_k(blocks, qi8, x, lut, out, res, nchunk, u16):
    N = blocks.shape[0]
    M, K = x.shape
    nb = K // 256
    has_res = res.shape[0] > 0
    for ch in prange(nchunk):
        acc = np.empty(32, np.float32)
        r0, r1 = _chunk(ch, nchunk, N)
        for r in range(r0, r1):
            row, rq = blocks[r], qi8[r]
            for i in range(M):
                acc[:] = 0.0
                for b in range(nb):
                    o = b * 210
                    d = _h(row, o + 208, lut)
                    for hh in range(2):
                        for c in range(4):
                            base = b * 256 + hh * 128 + c * 32
                            lo = o + 64 * hh + 32 * (c % 2)
                            sh = 4 * (c // 2)
                            s0 = d * np.float32(rq[o + 192 + hh * 8 + c * 2])
                            s1 = d * np.float32(rq[o + 192 + hh * 8 + c * 2 + 1])
                            for l in range(16):
                                q = ((row[lo + l] >> sh) & 15) | \
                                    (((row[o + 128 + 32 * hh + l] >> (2 * c)) & 3) << 4)
                                acc[l] += np.float32(np.int32(q) - 32) * (s0 * x[i, base + l])
                            for l in range(16, 32):
                                q = ((row[lo + l] >> sh) & 15) | \
                                    (((row[o + 128 + 32 * hh + l] >> (2 * c)) & 3) << 4)
                                acc[l] += np.float32(np.int32(q) - 32) * (s1 * x[i, base + l])
                y = _lanes(acc)
                out[i, r] = y + res[i, r] if has_res else y


# ------------------------------------------------------------------ dequantisation (prefill)
# dequant_<fmt>(blocks, qi8, lut, out): out (N, K) float32. The same float32 values as
# io/quant.py (d*q products are exact in float32; one rounding at the end). Single-threaded
# on purpose: prefill alternates them with BLAS matmuls, and a numba pool next to BLAS's
# own threads made the two fight for the cores (prefill 3 tok/s on a loaded 2-core machine);
# a weight's dequantisation is ~1/10 of its matmul at a 41-token prompt.

@njit(cache=True)
def dequant_q8_0(blocks, qi8, lut, out):
    N, K = out.shape
    for r in range(N):
        row, rq = blocks[r], qi8[r]
        for b in range(K // 32):
            d = _h(row, b * 34, lut)
            for j in range(32):
                out[r, b * 32 + j] = np.float32(rq[b * 34 + 2 + j]) * d


@njit(cache=True)
def dequant_q4_0(blocks, qi8, lut, out):
    N, K = out.shape
    for r in range(N):
        row = blocks[r]
        for b in range(K // 32):
            o = b * 18
            d = _h(row, o, lut)
            for j in range(16):
                q = row[o + 2 + j]
                out[r, b * 32 + j] = (np.float32(q & 15) - np.float32(8.0)) * d
                out[r, b * 32 + 16 + j] = (np.float32(q >> 4) - np.float32(8.0)) * d


@njit(cache=True)
def dequant_q4_1(blocks, qi8, lut, out):
    N, K = out.shape
    for r in range(N):
        row = blocks[r]
        for b in range(K // 32):
            o = b * 20
            d, m = _h(row, o, lut), _h(row, o + 2, lut)
            for j in range(16):
                q = row[o + 4 + j]
                out[r, b * 32 + j] = np.float32(q & 15) * d + m
                out[r, b * 32 + 16 + j] = np.float32(q >> 4) * d + m


@njit(cache=True)
def dequant_q4_k(blocks, qi8, lut, out):
    N, K = out.shape
    for r in range(N):
        row = blocks[r]
        for b in range(K // 256):
            o = b * 144
            d, dm = _h(row, o, lut), _h(row, o + 2, lut)
            for j in range(8):
                sc, mn = _kscale(row, o + 4, j)
                a, z = d * sc, dm * mn
                sh = 4 * (j % 2)
                for l in range(32):
                    q = (row[o + 16 + (j // 2) * 32 + l] >> sh) & 15
                    out[r, b * 256 + j * 32 + l] = a * np.float32(q) - z


@njit(cache=True)
def dequant_q5_k(blocks, qi8, lut, out):
    N, K = out.shape
    for r in range(N):
        row = blocks[r]
        for b in range(K // 256):
            o = b * 176
            d, dm = _h(row, o, lut), _h(row, o + 2, lut)
            for j in range(8):
                sc, mn = _kscale(row, o + 4, j)
                a, z = d * sc, dm * mn
                sh = 4 * (j % 2)
                for l in range(32):
                    q = ((row[o + 48 + (j // 2) * 32 + l] >> sh) & 15) | \
                        (((row[o + 16 + l] >> j) & 1) << 4)
                    out[r, b * 256 + j * 32 + l] = a * np.float32(q) - z


@njit(cache=True)
def dequant_q6_k(blocks, qi8, lut, out):
    N, K = out.shape
    for r in range(N):
        row, rq = blocks[r], qi8[r]
        for b in range(K // 256):
            o = b * 210
            d = _h(row, o + 208, lut)
            for hh in range(2):
                for c in range(4):
                    lo = o + 64 * hh + 32 * (c % 2)
                    sh = 4 * (c // 2)
                    for l in range(32):
                        q = ((row[lo + l] >> sh) & 15) | \
                            (((row[o + 128 + 32 * hh + l] >> (2 * c)) & 3) << 4)
                        sc = np.float32(rq[o + 192 + hh * 8 + c * 2 + l // 16])
                        out[r, b * 256 + hh * 128 + c * 32 + l] = \
                            d * (np.float32(np.int32(q) - 32) * sc)


# ------------------------------------------------------------- the decode step's small ops
@njit(cache=True, fastmath=_FM)
def rms_norm(x, w, eps, out):
    """out (M, K) = x / sqrt(mean(x^2) + eps) * w, float32."""
    M, K = x.shape
    for i in range(M):
        s = np.float32(0.0)
        for j in range(K):
            s += x[i, j] * x[i, j]
        inv = np.float32(1.0) / np.sqrt(s / np.float32(K) + np.float32(eps))
        for j in range(K):
            out[i, j] = x[i, j] * inv * w[j]


@njit(cache=True)
def silu_mul(gu, out):
    """out (M, N) = silu(gu[:, :N]) * gu[:, N:] (gate and up side by side)."""
    M, N = out.shape
    for i in range(M):
        for j in range(N):
            g = gu[i, j]
            out[i, j] = g / (np.float32(1.0) + np.exp(-g)) * gu[i, N + j]


@njit(parallel=True, cache=True, fastmath=_FM)
def rope_attend(qkv, cos, sin, kc, vc, pos, n_heads, out):
    """T tokens' attention after `pos` cached ones: RoPE (rotate_half; cos/sin (T, D), the
    rows of positions pos..pos+T-1) on q and k of qkv (T, (Hq + 2 Hkv) * D), k and v
    written to kc/vc (Hkv, L, D) at pos.., then causal softmax(q k^T / sqrt(D)) v with GQA
    (token t sees positions 0..pos+t); out (T, Hq * D). Heads over the threads."""
    Hkv, _, D = kc.shape
    T = qkv.shape[0]
    h2 = D // 2
    nq = n_heads * D
    for t in range(T):
        for h in range(Hkv):
            o = nq + h * D
            for d in range(h2):
                x1, x2 = qkv[t, o + d], qkv[t, o + h2 + d]
                kc[h, pos + t, d] = x1 * cos[t, d] - x2 * sin[t, d]
                kc[h, pos + t, h2 + d] = x2 * cos[t, h2 + d] + x1 * sin[t, h2 + d]
            for d in range(D):
                vc[h, pos + t, d] = qkv[t, nq + Hkv * D + h * D + d]
    grp = n_heads // Hkv
    scale = np.float32(1.0 / math.sqrt(D))
    for hq in prange(n_heads):
        hk = hq // grp
        o = hq * D
        sc = np.empty(pos + T, np.float32)
        q = np.empty(D, np.float32)
        acc = np.empty(D, np.float32)
        for t in range(T):
            S = pos + t + 1
            for d in range(h2):
                x1, x2 = qkv[t, o + d], qkv[t, o + h2 + d]
                q[d] = x1 * cos[t, d] - x2 * sin[t, d]
                q[h2 + d] = x2 * cos[t, h2 + d] + x1 * sin[t, h2 + d]
            mx = np.float32(-np.inf)
            for j in range(S):
                s = np.float32(0.0)
                for d in range(D):
                    s += q[d] * kc[hk, j, d]
                s *= scale
                sc[j] = s
                if s > mx or s != s:      # a NaN score propagates, as in the reference
                    mx = s
            den = np.float32(0.0)
            for j in range(S):
                e = np.exp(sc[j] - mx)
                sc[j] = e
                den += e
            for d in range(D):
                acc[d] = 0.0
            for j in range(S):
                p = sc[j] / den
                for d in range(D):
                    acc[d] += p * vc[hk, j, d]
            for d in range(D):
                out[t, o + d] = acc[d]


GEMV = {"Q8_0": gemv_q8_0, "Q4_0": gemv_q4_0, "Q4_1": gemv_q4_1, "Q4_K": gemv_q4_k,
        "Q5_K": gemv_q5_k, "Q6_K": gemv_q6_k}
DEQUANT = {"Q8_0": dequant_q8_0, "Q4_0": dequant_q4_0, "Q4_1": dequant_q4_1,
           "Q4_K": dequant_q4_k, "Q5_K": dequant_q5_k, "Q6_K": dequant_q6_k}
