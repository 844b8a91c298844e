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

from .. import dtypes as _dt
from .. import plans as _plans
from ..tensor import Tensor
from .decode_attention import _counters
from .gemv import _go

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
def field_minus(w, P: tl.constexpr, MASK: tl.constexpr, zero, zo):
    """The bit field (w >> P) & MASK of the int32 words `w`, minus zo - 2^(23 - P), as exact
    float32 values without an int-to-float conversion (quarter rate on sm_90): the field,
    left at bit position P, is OR-ed into the mantissa of 2^(23 - P), whose unit there is
    1, and zo (`field_bias`: the zero point plus 2^(23 - P)) is subtracted (exact: both are
    integers < 2^24). The field must end below bit 23. `zero` is a run-time 0 added to the
    exponent bits: it keeps them in a register, so ptxas emits one LOP3 ((w & mask) | bits)
    a field, not an AND and an OR with two immediates."""
    bits = (w & (MASK << P)) | (((150 - P) << 23) + zero)
    return bits.to(tl.float32, bitcast=True) - zo


@triton.jit
def field_bias(z, P: tl.constexpr):
    """z + 2^(23 - P): what `field_minus` subtracts to leave field - z."""
    return z + (1 << (23 - P)) * 1.0


@triton.jit
def _nibble_minus(w, I: tl.constexpr, zero, z):
    """Nibble I (bits 4I..4I+3) of `w` minus z (field_minus); nibbles 5..7 are shifted
    down 12 bits first, so every field ends by bit 19."""
    if I >= 5:
        w = w >> 12
    P: tl.constexpr = 4 * I - 12 if I >= 5 else 4 * I
    return field_minus(w, P, 15, zero, field_bias(z, P))


@triton.jit
def _int4_out(acc, y_ptr, b_ptr, ws_ptr, m, n, nmask, M, N, s_ym, pid_k,
              HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
    """Store the fp32 column sums `acc` of columns n: with SPLIT the K slice's partial into
    the workspace ws[pid_k, m, n] (`_int4_finish` sums them), else with the bias into y."""
    if SPLIT:
        tl.store(ws_ptr + (pid_k.to(tl.int64) * M + m) * N + n, acc, mask=nmask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * s_ym + n, acc.to(y_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _int4_finish(y_ptr, b_ptr, ws_ptr, cnt_ptr, pid_n, m, M, N, n_split, s_ym,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    """After a K slice's partial store: the program that draws the last ticket of its
    (row, column block) sums the n_split partials in slice order (the same result on every
    run), adds the bias, stores y and resets the counter to 0 for the next launch (and a
    replayed CUDA graph). One launch, no second reduction kernel."""
    tl.debug_barrier()          # every thread's partial store is issued before the ticket
    cnt = cnt_ptr + m * tl.num_programs(0) + pid_n
    ticket = tl.atomic_add(cnt, 1, sem="acq_rel")
    if ticket == n_split - 1:
        tl.store(cnt, 0)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < N
        acc = tl.zeros((BLOCK_N,), tl.float32)
        for k in range(0, n_split):
            acc += tl.load(ws_ptr + (k * M + m) * N + n, mask=nmask, other=0.0,
                           cache_modifier=".cg")
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * s_ym + n, acc.to(y_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _gptq_gemv_packed(x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, N8, K,
                      group, gstep, k_split, n_split, s_xm, s_xk, s_ym, HAS_BIAS: tl.constexpr,
                      SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """GPTQ y[m, n] over K slice pid_k (SPLIT: the slices' partials meet in _int4_finish).
    A step loads words (BLOCK_K / 8, BLOCK_N), 8 K rows each, and unpacks them nibble by
    nibble (_nibble_minus); a group pass accumulates x_k (q_kn - z_n) in a (BLOCK_K / 8,
    BLOCK_N) tile (one FFMA an element) and adds s_n times its column sums. With BLOCK_N
    a multiple of 128 * num_warps a column's rows lie in one thread (no exchange)."""
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    pid_k = tl.program_id(2)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    r = tl.arange(0, BLOCK_K // 8)
    x_row = x_ptr + m * s_xm
    zero = N >> 31          # 0 (N > 0), unknown to the compiler: see field_minus
    acc = tl.zeros((BLOCK_N,), tl.float32)
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    for g0 in range(k_lo, k_hi, gstep):
        G = g0 // group
        z = _zeros(qz_ptr, G, n, nmask, N, 0).to(tl.float32)[None, :]
        s = tl.load(s_ptr + G.to(tl.int64) * N + n, mask=nmask, other=0.0).to(tl.float32)
        part = tl.zeros((BLOCK_K // 8, BLOCK_N), tl.float32)
        for k0 in range(g0, g0 + gstep, BLOCK_K):
            wr = (k0 // 8 + r).to(tl.int64)
            w = tl.load(qw_ptr + wr[:, None] * N + n[None, :], mask=nmask[None, :], other=0)
            kx = x_row + (k0 + 8 * r) * s_xk
            for i in tl.static_range(8):
                xi = tl.load(kx + i * s_xk).to(tl.float32)[:, None]
                part += _nibble_minus(w, i, zero, z) * xi
        acc += s * tl.sum(part, axis=0)
    _int4_out(acc, y_ptr, b_ptr, ws_ptr, m, n, nmask, M, N, s_ym, pid_k, HAS_BIAS, SPLIT)
    if SPLIT:
        _int4_finish(y_ptr, b_ptr, ws_ptr, cnt_ptr, pid_n, m, M, N, n_split, s_ym, HAS_BIAS,
                     BLOCK_N)


@triton.jit
def _gptq_gemv_flat(x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, N8, K,
                    group, gstep, k_split, n_split, s_xm, s_xk, s_ym, HAS_BIAS: tl.constexpr,
                    SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """GPTQ y[m, n] over K slice pid_k as one flat loop of BLOCK_K steps (each inside one
    group), the next step's words, zeros and scales loading while a step computes: its
    (q - z) x (one LOP3, FADD, FFMA an element) are scaled by s into a (BLOCK_K / 8,
    BLOCK_N) accumulator, summed over its rows once at the end."""
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    pid_k = tl.program_id(2)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    r = tl.arange(0, BLOCK_K // 8)
    x_row = x_ptr + m * s_xm
    zero = N >> 31          # 0 (N > 0), unknown to the compiler: see field_minus
    acc2 = tl.zeros((BLOCK_K // 8, BLOCK_N), tl.float32)
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    w_ptrs = qw_ptr + (k_lo // 8 + r).to(tl.int64)[:, None] * N + n[None, :]
    w_next = tl.load(w_ptrs, mask=nmask[None, :], other=0)
    G = (k_lo // group).to(tl.int64)
    z_next = _zeros(qz_ptr, G, n, nmask, N, 0)
    s_next = tl.load(s_ptr + G * N + n, mask=nmask, other=0.0)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        # the next step's words, zeros and scales load while this step computes (register
        # double buffers)
        w = w_next
        z = z_next.to(tl.float32)[None, :]
        s = s_next.to(tl.float32)[None, :]
        more = k0 + BLOCK_K < k_hi
        w_ptrs += (BLOCK_K // 8) * N
        w_next = tl.load(w_ptrs, mask=nmask[None, :] & more, other=0)
        G = ((k0 + BLOCK_K) // group).to(tl.int64)
        z_next = _zeros(qz_ptr, G, n, nmask & more, N, 0)
        s_next = tl.load(s_ptr + G * N + n, mask=nmask & more, other=0.0)
        kx = x_row + (k0 + 8 * r) * s_xk
        p = tl.zeros((BLOCK_K // 8, BLOCK_N), tl.float32)
        for i in tl.static_range(8):
            xi = tl.load(kx + i * s_xk).to(tl.float32)[:, None]
            p += _nibble_minus(w, i, zero, z) * xi
        acc2 += s * p
    acc = tl.sum(acc2, axis=0)
    _int4_out(acc, y_ptr, b_ptr, ws_ptr, m, n, nmask, M, N, s_ym, pid_k, HAS_BIAS, SPLIT)
    if SPLIT:
        _int4_finish(y_ptr, b_ptr, ws_ptr, cnt_ptr, pid_n, m, M, N, n_split, s_ym, HAS_BIAS,
                     BLOCK_N)


@triton.jit
def _awq_gemv_flat(x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, N8, K,
                   group, gstep, k_split, n_split, s_xm, s_xk, s_ym, HAS_BIAS: tl.constexpr,
                   SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """AWQ y[m, n] over K slice pid_k as one flat loop of BLOCK_K steps (each inside one
    group; Triton pipelines the word loads): nibble i's products (q - z) s x go into its own
    (BLOCK_K, BLOCK_N / 8) accumulator, summed over the rows once at the end."""
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    pid_k = tl.program_id(2)
    C: tl.constexpr = BLOCK_N // 8
    c = pid_n * C + tl.arange(0, C)
    cmask = c < N8
    kr = tl.arange(0, BLOCK_K)
    x_row = x_ptr + m * s_xm
    zero = N >> 31          # 0 (N > 0), unknown to the compiler: see field_minus
    a0 = tl.zeros((BLOCK_K, C), tl.float32)
    a1 = tl.zeros((BLOCK_K, C), tl.float32)
    a2 = tl.zeros((BLOCK_K, C), tl.float32)
    a3 = tl.zeros((BLOCK_K, C), tl.float32)
    a4 = tl.zeros((BLOCK_K, C), tl.float32)
    a5 = tl.zeros((BLOCK_K, C), tl.float32)
    a6 = tl.zeros((BLOCK_K, C), tl.float32)
    a7 = tl.zeros((BLOCK_K, C), tl.float32)
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    w_ptrs = qw_ptr + (k_lo + kr).to(tl.int64)[:, None] * N8 + c[None, :]
    for k0 in range(k_lo, k_hi, BLOCK_K):
        G = (k0 // group).to(tl.int64)
        zw = tl.load(qz_ptr + G * N8 + c, mask=cmask, other=0)
        sb = s_ptr + G * N + 8 * c
        w = tl.load(w_ptrs, mask=cmask[None, :], other=0)
        xb = tl.load(x_row + (k0 + kr) * s_xk).to(tl.float32)[:, None]
        a0 += _awq_scaled(w, 0, zero, zw, sb, cmask) * xb
        a1 += _awq_scaled(w, 1, zero, zw, sb, cmask) * xb
        a2 += _awq_scaled(w, 2, zero, zw, sb, cmask) * xb
        a3 += _awq_scaled(w, 3, zero, zw, sb, cmask) * xb
        a4 += _awq_scaled(w, 4, zero, zw, sb, cmask) * xb
        a5 += _awq_scaled(w, 5, zero, zw, sb, cmask) * xb
        a6 += _awq_scaled(w, 6, zero, zw, sb, cmask) * xb
        a7 += _awq_scaled(w, 7, zero, zw, sb, cmask) * xb
        w_ptrs += BLOCK_K * N8
    n0 = 8 * c
    _int4_out(tl.sum(a0, axis=0), y_ptr, b_ptr, ws_ptr, m, n0 + 0, cmask, M, N, s_ym, pid_k,
              HAS_BIAS, SPLIT)
    _int4_out(tl.sum(a1, axis=0), y_ptr, b_ptr, ws_ptr, m, n0 + 2, cmask, M, N, s_ym, pid_k,
              HAS_BIAS, SPLIT)
    _int4_out(tl.sum(a2, axis=0), y_ptr, b_ptr, ws_ptr, m, n0 + 4, cmask, M, N, s_ym, pid_k,
              HAS_BIAS, SPLIT)
    _int4_out(tl.sum(a3, axis=0), y_ptr, b_ptr, ws_ptr, m, n0 + 6, cmask, M, N, s_ym, pid_k,
              HAS_BIAS, SPLIT)
    _int4_out(tl.sum(a4, axis=0), y_ptr, b_ptr, ws_ptr, m, n0 + 1, cmask, M, N, s_ym, pid_k,
              HAS_BIAS, SPLIT)
    _int4_out(tl.sum(a5, axis=0), y_ptr, b_ptr, ws_ptr, m, n0 + 3, cmask, M, N, s_ym, pid_k,
              HAS_BIAS, SPLIT)
    _int4_out(tl.sum(a6, axis=0), y_ptr, b_ptr, ws_ptr, m, n0 + 5, cmask, M, N, s_ym, pid_k,
              HAS_BIAS, SPLIT)
    _int4_out(tl.sum(a7, axis=0), y_ptr, b_ptr, ws_ptr, m, n0 + 7, cmask, M, N, s_ym, pid_k,
              HAS_BIAS, SPLIT)
    if SPLIT:
        _int4_finish(y_ptr, b_ptr, ws_ptr, cnt_ptr, pid_n, m, M, N, n_split, s_ym, HAS_BIAS,
                     BLOCK_N)


@triton.jit
def _awq_scaled(w, I: tl.constexpr, zero, zw, sb, cmask):
    """s (q - z) of nibble I (columns 8c + J, AWQ's order) for one step's words."""
    z = ((zw >> (4 * I)) & 15).to(tl.float32)
    return _nibble_minus(w, I, zero, z[None, :]) * _awq_scale(sb, I, cmask)[None, :]


@triton.jit
def _awq_nibble(w, I: tl.constexpr, zero, zw, xb):
    """Nibble I's sum over the rows of a step: sum_k x_k (q_kc - z_c), columns 8c + J."""
    z = ((zw >> (4 * I)) & 15).to(tl.float32)
    return tl.sum(_nibble_minus(w, I, zero, z[None, :]) * xb, axis=0)


@triton.jit
def _awq_gemv_packed(x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, N8, K,
                     group, gstep, k_split, n_split, s_xm, s_xk, s_ym, HAS_BIAS: tl.constexpr,
                     SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """AWQ y[m, n] over K slice pid_k (SPLIT: the slices' partials meet in _int4_finish).
    A step loads words (BLOCK_K, BLOCK_N / 8), 8 columns each; nibble i holds the columns
    8c + J, J = 2 (i % 4) + i // 4 (AWQ's order), so each nibble keeps its own column sums
    (g0..g7 over a group pass, a0..a7 over the slice). With BLOCK_N / 8 a multiple of
    128 * num_warps the rows of a step lie in one thread (no exchange between threads)."""
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    pid_k = tl.program_id(2)
    C: tl.constexpr = BLOCK_N // 8
    c = pid_n * C + tl.arange(0, C)
    cmask = c < N8
    kr = tl.arange(0, BLOCK_K)
    x_row = x_ptr + m * s_xm
    zero = N >> 31          # 0 (N > 0), unknown to the compiler: see field_minus
    a0 = tl.zeros((C,), tl.float32)
    a1 = tl.zeros((C,), tl.float32)
    a2 = tl.zeros((C,), tl.float32)
    a3 = tl.zeros((C,), tl.float32)
    a4 = tl.zeros((C,), tl.float32)
    a5 = tl.zeros((C,), tl.float32)
    a6 = tl.zeros((C,), tl.float32)
    a7 = tl.zeros((C,), tl.float32)
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    for q0 in range(k_lo, k_hi, gstep):
        G = (q0 // group).to(tl.int64)
        zw = tl.load(qz_ptr + G * N8 + c, mask=cmask, other=0)
        g0 = tl.zeros((C,), tl.float32)
        g1 = tl.zeros((C,), tl.float32)
        g2 = tl.zeros((C,), tl.float32)
        g3 = tl.zeros((C,), tl.float32)
        g4 = tl.zeros((C,), tl.float32)
        g5 = tl.zeros((C,), tl.float32)
        g6 = tl.zeros((C,), tl.float32)
        g7 = tl.zeros((C,), tl.float32)
        for k0 in range(q0, q0 + gstep, BLOCK_K):
            k = (k0 + kr).to(tl.int64)
            w = tl.load(qw_ptr + k[:, None] * N8 + c[None, :], mask=cmask[None, :], other=0)
            xb = tl.load(x_row + k * s_xk).to(tl.float32)[:, None]
            g0 += _awq_nibble(w, 0, zero, zw, xb)
            g1 += _awq_nibble(w, 1, zero, zw, xb)
            g2 += _awq_nibble(w, 2, zero, zw, xb)
            g3 += _awq_nibble(w, 3, zero, zw, xb)
            g4 += _awq_nibble(w, 4, zero, zw, xb)
            g5 += _awq_nibble(w, 5, zero, zw, xb)
            g6 += _awq_nibble(w, 6, zero, zw, xb)
            g7 += _awq_nibble(w, 7, zero, zw, xb)
        sb = s_ptr + G * N + 8 * c
        a0 += _awq_scale(sb, 0, cmask) * g0
        a1 += _awq_scale(sb, 1, cmask) * g1
        a2 += _awq_scale(sb, 2, cmask) * g2
        a3 += _awq_scale(sb, 3, cmask) * g3
        a4 += _awq_scale(sb, 4, cmask) * g4
        a5 += _awq_scale(sb, 5, cmask) * g5
        a6 += _awq_scale(sb, 6, cmask) * g6
        a7 += _awq_scale(sb, 7, cmask) * g7
    n0 = 8 * c
    _int4_out(a0, y_ptr, b_ptr, ws_ptr, m, n0 + 0, cmask, M, N, s_ym, pid_k, HAS_BIAS, SPLIT)
    _int4_out(a1, y_ptr, b_ptr, ws_ptr, m, n0 + 2, cmask, M, N, s_ym, pid_k, HAS_BIAS, SPLIT)
    _int4_out(a2, y_ptr, b_ptr, ws_ptr, m, n0 + 4, cmask, M, N, s_ym, pid_k, HAS_BIAS, SPLIT)
    _int4_out(a3, y_ptr, b_ptr, ws_ptr, m, n0 + 6, cmask, M, N, s_ym, pid_k, HAS_BIAS, SPLIT)
    _int4_out(a4, y_ptr, b_ptr, ws_ptr, m, n0 + 1, cmask, M, N, s_ym, pid_k, HAS_BIAS, SPLIT)
    _int4_out(a5, y_ptr, b_ptr, ws_ptr, m, n0 + 3, cmask, M, N, s_ym, pid_k, HAS_BIAS, SPLIT)
    _int4_out(a6, y_ptr, b_ptr, ws_ptr, m, n0 + 5, cmask, M, N, s_ym, pid_k, HAS_BIAS, SPLIT)
    _int4_out(a7, y_ptr, b_ptr, ws_ptr, m, n0 + 7, cmask, M, N, s_ym, pid_k, HAS_BIAS, SPLIT)
    if SPLIT:
        _int4_finish(y_ptr, b_ptr, ws_ptr, cnt_ptr, pid_n, m, M, N, n_split, s_ym, HAS_BIAS,
                     BLOCK_N)


@triton.jit
def _awq_scale(sb, I: tl.constexpr, cmask):
    """The scales of nibble I's columns 8c + J (sb: the group's row at column 8c)."""
    J: tl.constexpr = 2 * (I % 4) + I // 4
    return tl.load(sb + J, mask=cmask, other=0.0).to(tl.float32)


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


# Packed GEMVs on cuda: programs of BLOCK_N columns and num_warps warps; K split into
# SPLIT slices of whole groups (of whole BLOCK_K steps inside one group when there are fewer
# groups than slices) until the grid has PROGRAMS_PER_SM programs per SM. H200, 4096 x 14336
# (`benchmarks/probe_quant.py`, GPU time over rotated weights; bf16 GEMV 30.4 us): GPTQ
# 256 x 64, 1 warp, 16 slices 19.7 us (512 x 64 / 2 warps 20.6; 8 slices 27-33, 32 slices
# 21.7-24.8); AWQ 1024 x 8, 1 warp, 32 slices 42.8 us (16 slices 61, 64 slices 45).
PACKED = {"gptq": dict(BLOCK_N=256, BLOCK_K=64, num_warps=1, PROGRAMS_PER_SM=8),
          "awq": dict(BLOCK_N=1024, BLOCK_K=8, num_warps=1, PROGRAMS_PER_SM=4)}


def _pow2_divisor(group, cap):
    bk = cap
    while group % bk:
        bk //= 2
    return bk


def gemv_config(N, K, group, dev, gidx=False, fmt="gptq", M=1):
    """The launch config. g_idx (`_int4_gemv_kernel`): BLOCK_K 32, whose per-element
    scale/zero gathers spill at 128 x 64 on sm_90 (ptxas: 255 registers + spills; 127-143
    at 32 x 64), and BLOCK_N halved until the device's SMs (device_facts) get >= 2 programs
    each. The packed kernels: PACKED's tiles (BLOCK_K the largest power of two <= the
    tile's dividing the group), SPLIT slices as above; interp: 64 columns, one slice."""
    if gidx:
        bk = _pow2_divisor(group, 32)
        if dev.type != "cuda":
            return dict(BLOCK_N=64, BLOCK_K=bk, num_warps=4)
        bn = 64
        while bn > 16 and -(-N // bn) < 2 * dev.sms:
            bn //= 2
        return dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
    if dev.type != "cuda":
        cfg = dict(BLOCK_N=64, BLOCK_K=64 if fmt == "gptq" else 16, num_warps=4, SPLIT=1)
    else:
        cfg = dict(PACKED[fmt], SPLIT=1)
        programs = -(-N // cfg["BLOCK_N"]) * M
        while programs * cfg["SPLIT"] * 2 <= cfg["PROGRAMS_PER_SM"] * dev.sms \
                and cfg["SPLIT"] * 2 <= K // 8:
            cfg["SPLIT"] *= 2
    cfg["BLOCK_K"] = _pow2_divisor(group, cfg["BLOCK_K"])
    return cfg


def k_slices(K, group, bk, split):
    """(k_split, gstep): slices of whole groups when there are at least `split` groups,
    else of whole BLOCK_K steps inside one group; gstep is the K length of one group's pass
    (the kernels reduce once per pass)."""
    ng = K // group
    if ng >= split:
        return -(-ng // split) * group, group
    steps = group // bk                 # steps of one group; a slice takes a divisor of them
    want = -(-steps * ng // split)
    d = max(x for x in range(1, steps + 1) if steps % x == 0 and x <= max(1, want))
    return d * bk, d * bk


# Launch plans of the packed GEMVs by what `_plan` derives a launch from (shapes, format,
# group, x's strides, the dtypes, bias or not, the device, the overrides); a plan holds
# no tensors
_PLANS = _plans.PlanCache("kernels.int4", 1024)


def _plan(M, K, N, group, fmt, xs, has_bias, dev, block_n, split, config):
    """(kernel, grid, scalar arguments, keyword items, K slices, counters) of a packed
    GEMV launch."""
    from ._common import device_facts
    from ._host import cdiv
    cfg = gemv_config(N, K, group, device_facts(dev), False, fmt, M)
    if config:
        cfg.update(config)
    if block_n is not None:
        cfg["BLOCK_N"] = block_n
    bk, bn = cfg["BLOCK_K"], cfg["BLOCK_N"]
    k_split, gstep = k_slices(K, group, bk, split if split is not None else cfg["SPLIT"])
    n_split = cdiv(K, k_split)
    grid = (cdiv(N, bn), M, n_split)
    ints = (M, N, N // 8, K, group, gstep, k_split, n_split, xs[0], xs[1])
    items = (("HAS_BIAS", has_bias), ("SPLIT", n_split > 1), ("BLOCK_N", bn),
             ("BLOCK_K", bk), ("num_warps", cfg["num_warps"]),
             ("num_stages", cfg.get("num_stages", 3)))
    if cfg.get("FLAT"):
        kernel = _gptq_gemv_flat if fmt == "gptq" else _awq_gemv_flat
    else:
        kernel = _gptq_gemv_packed if fmt == "gptq" else _awq_gemv_packed
    return kernel, grid, ints, items, n_split, grid[0] * M


def int4_gemv(x2, qt, bias, y, *, block_n=None, split=None, config=None):
    """y (M, N) = x2 (M, K) @ W (+ bias), on cuda/interp (checked by ops/quantized.py);
    block_n / split override the config (tests force tails and K slices), `config` any of
    its keys (benchmark sweeps)."""
    M, K = x2.shape
    N = qt.out_features
    if qt.g_idx is not None:
        return _gidx_gemv(x2, qt, bias, y, block_n)
    dev = x2.device
    key = (M, K, N, qt.group_size, qt.format, x2._stride, x2._dtype, y._dtype, y._stride,
           None if bias is None else bias._dtype, dev, block_n, split,
           None if not config else tuple(sorted(config.items())))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(M, K, N, qt.group_size, qt.format, x2._stride, bias is not None, dev,
                     block_n, split, config)
        _PLANS.put(key, plan)
    kernel, grid, ints, items, n_split, n_cnt = plan
    b = bias if bias is not None else y
    if n_split == 1:
        args = (x2, qt.qweight, qt.qzeros, qt.scales, b, y, y, y, *ints, y._stride[0])
    else:
        ws = Tensor._empty((n_split, M, N), _dt.float32, dev)
        args = (x2, qt.qweight, qt.qzeros, qt.scales, b, y, ws, _counters(n_cnt, dev, "int4"),
                *ints, y._stride[0])
    _go(kernel, grid, args, items)
    return y


def _gidx_gemv(x2, qt, bias, y, block_n):
    """The desc_act (g_idx) GEMV: per-element scale/zero gathers (`_int4_gemv_kernel`)."""
    from ._common import device_facts
    from ._host import cdiv
    from ..backends.launch import launch
    M, K = x2.shape
    N = qt.out_features
    cfg = gemv_config(N, K, qt.group_size, device_facts(x2.device), True, qt.format, M)
    if block_n is not None:
        cfg["BLOCK_N"] = block_n
    launch(_int4_gemv_kernel, (cdiv(N, cfg["BLOCK_N"]), M), x2, qt.qweight, qt.qzeros,
           qt.scales, qt.g_idx, bias if bias is not None else y, y, N, K, qt.group_size,
           x2.stride(0), x2.stride(1), y.stride(0), FMT=GPTQ if qt.format == "gptq" else AWQ,
           HAS_GIDX=True, HAS_BIAS=bias is not None, **cfg)
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
