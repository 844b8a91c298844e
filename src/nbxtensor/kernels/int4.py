"""int4 group-quantised weights (GPTQ and AWQ checkpoint layouts): a dequantising GEMV for
decode and a dequantisation kernel (prefill dequantises once per call, then the GEMM).

The weight W is (K, N) = (in_features, out_features), as both formats store it:
  GPTQ  qweight int32 (K/8, N): nibble i (bits 4i..4i+3) of word (r, n) is q[8r + i, n]
        qzeros  int32 (K/g, N/8): nibble i of word (gi, c) is z[gi, 8c + i]
        scales  fp16  (K/g, N);  g_idx int32 (K,) optional (desc_act): the group of row k,
        else k // g.   W[k, n] = s[G, n] * (q[k, n] - (z[G, n] + 1))   (the +1 of the
        classic GPTQ checkpoints, sym=True: stored zeros are the true zero minus one)
  AWQ   qweight int32 (K, N/8), qzeros int32 (K/g, N/8), scales fp16 (K/g, N); columns are
        packed in AWQ's order [0, 2, 4, 6, 1, 3, 5, 7] (nibble i holds column 8c + order[i]),
        so column 8c + j sits in nibble rev[j], rev = [0, 4, 1, 5, 2, 6, 3, 7] = j//2 + 4(j%2).
        W[k, n] = s[k // g, n] * (q[k, n] - z[k // g, n])
s * (q - z) is exact in fp32 (an fp16 scale times an integer in [-16, 15]), so the
dequantisation is bit-equal to the NumPy reference in fp32 and one rounding in 16 bits.

GEMV: a program owns BLOCK_N output columns of one x row and walks its share of K in
BLOCK_K steps; BLOCK_K divides the group size, so without g_idx a step has one scale and zero
per column and the sum factorises: sum_k x_k s (q_kn - z_n) = s_n (sum_k x_k q_kn - z_n
sum_k x_k) (fp32). AWQ (`_awq_gemv_packed`): each packed word (8 columns of one row) is
loaded once and unpacked into its nibbles in registers (a (K, words, 8) tile reshaped to
(K, N)), and K is split over SPLIT programs when the columns alone would leave the SMs idle
(decode: one row, N / BLOCK_N programs); the fp32 partials are summed in a fixed order by
gemv's split-K reduce, with the bias. GPTQ and g_idx (`_int4_gemv_kernel`) load per element:
the same unpacking of GPTQ's words (8 rows of one column) measured slower on the H200
(4096 x 14336: 114 us against 71), its nibbles lying along the reduction axis.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

GPTQ, AWQ = 0, 1


@triton.jit
def _quants(qw_ptr, k, n, mask, N, FMT: tl.constexpr):
    """q (BK, BN) int32 of rows k (BK, 1), columns n (1, BN)."""
    if FMT == 0:
        w = tl.load(qw_ptr + (k // 8).to(tl.int64) * N + n, mask=mask, other=0)
        return (w >> ((k % 8) * 4)) & 15
    else:
        w = tl.load(qw_ptr + k.to(tl.int64) * (N // 8) + n // 8, mask=mask, other=0)
        return (w >> (((n % 8) // 2 + 4 * (n % 2)) * 4)) & 15


@triton.jit
def _zeros(qz_ptr, G, n, mask, N, FMT: tl.constexpr):
    """The zero point of group G at columns n (any broadcastable shapes), GPTQ's +1 included."""
    zw = tl.load(qz_ptr + G.to(tl.int64) * (N // 8) + n // 8, mask=mask, other=0)
    if FMT == 0:
        return ((zw >> ((n % 8) * 4)) & 15) + 1
    else:
        return (zw >> (((n % 8) // 2 + 4 * (n % 2)) * 4)) & 15


@triton.jit
def _int4_gemv_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, gi_ptr, b_ptr, y_ptr, N, K, group,
                      s_xm, s_xk, s_ym, FMT: tl.constexpr, HAS_GIDX: tl.constexpr,
                      HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    n2 = n[None, :]
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        xv = tl.load(x_ptr + m * s_xm + k * s_xk, mask=kmask, other=0.0).to(tl.float32)
        if HAS_GIDX:
            G = tl.load(gi_ptr + k, mask=kmask, other=0)[:, None]
            m2 = kmask[:, None] & nmask[None, :]
            q = _quants(qw_ptr, k[:, None], n2, m2, N, FMT)
            z = _zeros(qz_ptr, G, n2, m2, N, FMT)
            s = tl.load(s_ptr + G.to(tl.int64) * N + n2, mask=m2, other=0.0).to(tl.float32)
            w = s * (q - z).to(tl.float32)
            acc += tl.sum(w * xv[:, None], axis=0)
        else:
            G = k0 // group
            q = _quants(qw_ptr, k[:, None], n2, kmask[:, None] & nmask[None, :], N, FMT)
            z = _zeros(qz_ptr, G, n, nmask, N, FMT)
            s = tl.load(s_ptr + G.to(tl.int64) * N + n, mask=nmask, other=0.0).to(tl.float32)
            dot = tl.sum(q.to(tl.float32) * xv[:, None], axis=0)
            acc += s * (dot - z.to(tl.float32) * tl.sum(xv, axis=0))
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * s_ym + n, acc.to(y_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _awq_gemv_packed(x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, y_ptr, N, K, group, k_split,
                     s_xm, s_xk, s_ym, s_ys, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """AWQ y[m, n] (SPLIT: the fp32 partial of K slice pid_k at y + pid_k * s_ys)."""
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    pid_k = tl.program_id(2)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    acc = tl.zeros((BLOCK_N,), tl.float32)
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        # words (BLOCK_K, BLOCK_N / 8); column 8c + j sits in nibble j // 2 + 4 (j % 2)
        c = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
        w = tl.load(qw_ptr + k.to(tl.int64)[:, None] * (N // 8) + c[None, :],
                    mask=kmask[:, None] & (c < N // 8)[None, :], other=0)
        j = tl.arange(0, 8)
        sh = (j // 2 + 4 * (j % 2)) * 4
        q = tl.reshape((w[:, :, None] >> sh[None, None, :]) & 15, (BLOCK_K, BLOCK_N))
        xv = tl.load(x_ptr + m * s_xm + k * s_xk, mask=kmask, other=0.0).to(tl.float32)
        G = k0 // group
        z = _zeros(qz_ptr, G, n, nmask, N, 1)
        s = tl.load(s_ptr + G.to(tl.int64) * N + n, mask=nmask, other=0.0).to(tl.float32)
        dot = tl.sum(q.to(tl.float32) * xv[:, None], axis=0)
        acc += s * (dot - z.to(tl.float32) * tl.sum(xv, axis=0))
    if SPLIT:
        tl.store(y_ptr + pid_k.to(tl.int64) * s_ys + m * s_ym + n, acc, mask=nmask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * s_ym + n, acc.to(y_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _int4_dequant_kernel(qw_ptr, qz_ptr, s_ptr, gi_ptr, y_ptr, N, K, group, s_yk, s_yn,
                         FMT: tl.constexpr, HAS_GIDX: tl.constexpr, BLOCK_K: tl.constexpr,
                         BLOCK_N: tl.constexpr):
    k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    kmask = (k < K)[:, None]
    nmask = (n < N)[None, :]
    if HAS_GIDX:
        G = tl.load(gi_ptr + k, mask=k < K, other=0)[:, None]
    else:
        G = (k // group)[:, None]
    q = _quants(qw_ptr, k[:, None], n[None, :], kmask & nmask, N, FMT)
    z = _zeros(qz_ptr, G, n[None, :], kmask & nmask, N, FMT)
    s = tl.load(s_ptr + G.to(tl.int64) * N + n[None, :], mask=kmask & nmask,
                other=0.0).to(tl.float32)
    w = s * (q - z).to(tl.float32)
    tl.store(y_ptr + k.to(tl.int64)[:, None] * s_yk + n.to(tl.int64)[None, :] * s_yn,
             w.to(y_ptr.dtype.element_ty), mask=kmask & nmask)


def gemv_config(N, K, group, dev, gidx=False, fmt="gptq", M=1):
    """BLOCK_K: the largest power of two <= 128 dividing the group (one scale and zero per
    step). GPTQ and g_idx (`_int4_gemv_kernel`): BLOCK_N halved until the device's SMs
    (device_facts) get >= 2 programs each; BLOCK_K 32 with g_idx, whose per-element
    scale/zero gathers spill at 128 x 64 on sm_90 (ptxas: 255 registers + spills; 127-143
    at 32 x 64). AWQ (`_awq_gemv_packed`):
    BLOCK_N 64, and K split in SPLIT slices (a power of two, whole steps) until the grid
    reaches 4 programs per SM; interp: one slice unless asked."""
    bk = 32 if gidx else 128
    while group % bk:
        bk //= 2
    if gidx or fmt == "gptq":
        if dev.type != "cuda":
            return dict(BLOCK_N=64, BLOCK_K=bk, num_warps=4)
        bn = 64
        while bn > 16 and -(-N // bn) < 2 * dev.sms:
            bn //= 2
        return dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
    bn, split = 64, 1
    if dev.type == "cuda":
        steps, programs = -(-K // bk), -(-N // bn) * M
        while split * 2 <= steps and programs * split * 2 <= 4 * dev.sms:
            split *= 2
    return dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT=split, num_warps=4)


def int4_gemv(x2, qt, bias, y, *, block_n=None, split=None):
    """y (M, N) = x2 (M, K) @ W (+ bias), on cuda/interp (checked by ops/quantized.py);
    block_n / split override the config (tests force tails and, for AWQ, K slices)."""
    from ._common import device_facts
    from ._host import cdiv
    from ..backends.launch import launch
    M, K = x2.shape
    N = qt.out_features
    gi = qt.g_idx
    cfg = gemv_config(N, K, qt.group_size, device_facts(x2.device), gi is not None,
                      qt.format, M)
    if block_n is not None:
        cfg["BLOCK_N"] = block_n
    fmt = GPTQ if qt.format == "gptq" else AWQ
    if gi is not None or fmt == GPTQ:
        launch(_int4_gemv_kernel, (cdiv(N, cfg["BLOCK_N"]), M), x2, qt.qweight, qt.qzeros,
               qt.scales, gi if gi is not None else qt.qweight, bias if bias is not None else y,
               y, N, K, qt.group_size, x2.stride(0), x2.stride(1), y.stride(0), FMT=fmt,
               HAS_GIDX=gi is not None, HAS_BIAS=bias is not None, **cfg)
        return y
    bk, bn = cfg["BLOCK_K"], cfg["BLOCK_N"]
    steps = cdiv(K, bk)
    n_split = min(split if split is not None else cfg["SPLIT"], steps)
    k_split = cdiv(steps, n_split) * bk
    n_split = cdiv(K, k_split)
    grid = (cdiv(N, bn), M, n_split)
    common = dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=cfg["num_warps"])
    if n_split == 1:
        launch(_awq_gemv_packed, grid, x2, qt.qweight, qt.qzeros, qt.scales,
               bias if bias is not None else y, y, N, K, qt.group_size, k_split,
               x2.stride(0), x2.stride(1), y.stride(0), 0, HAS_BIAS=bias is not None,
               SPLIT=False, **common)
        return y
    from .. import dtypes as _dt
    from ..tensor import Tensor
    from .gemv import splitk_reduce
    ws = Tensor._empty((n_split, M, N), _dt.float32, y.device)
    launch(_awq_gemv_packed, grid, x2, qt.qweight, qt.qzeros, qt.scales, ws, ws, N, K,
           qt.group_size, k_split, x2.stride(0), x2.stride(1), N, M * N, HAS_BIAS=False,
           SPLIT=True, **common)
    splitk_reduce(ws, y, bias, None, 1.0, 1.0, 0)
    return y


def int4_dequantize(qt, y, transpose: bool):
    """W (K, N) into y ((K, N), or (N, K) with transpose) on cuda/interp."""
    from ._host import cdiv
    from ..backends.launch import launch
    K, N = qt.in_features, qt.out_features
    s_yk, s_yn = (y.stride(1), y.stride(0)) if transpose else (y.stride(0), y.stride(1))
    BK, BN = 32, 64
    gi = qt.g_idx
    launch(_int4_dequant_kernel, (cdiv(K, BK), cdiv(N, BN)), qt.qweight, qt.qzeros, qt.scales,
           gi if gi is not None else qt.qweight, y, N, K, qt.group_size, s_yk, s_yn,
           FMT=GPTQ if qt.format == "gptq" else AWQ, HAS_GIDX=gi is not None, BLOCK_K=BK,
           BLOCK_N=BN, num_warps=4)
    return y
