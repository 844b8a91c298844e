"""Fused decode GEMVs: out = epilogue(prologue(x) @ W^T), one kernel per projection.

At decode the activations are a few rows of a few thousand elements and the weights are
hundreds of MB, so each projection is one pass over its weight rows and everything around
it rides along for free:
  * NORM   RMSNorm of x fused in: x_k * nw_k feeds the dot product and the row's sum of
           squares accumulates in the same loop (every program walks the whole K, no
           split-K); 1/rms factors out of the dot product and is applied at the end.
  * GLU    W is [gate; up] (2N, K) concatenated at load; a program reads gate rows n and
           up rows N + n and stores silu(gate) * up (the SwiGLU product).
  * bias, RESIDUAL  added in fp32 before the single rounding to the output dtype.
Design for the memory-bound case (M == 1): a program owns BLOCK_N contiguous weight rows
and walks K in BLOCK_K chunks that are unit-stride (16-byte vector loads), accumulating
element-wise in fp32 (no reduction inside the loop, one row-sum at the end). BLOCK_N is
picked so the grid has >= 2 programs per SM of the device where N allows.
Up to SMALL_M rows (cuda) the same kernel runs once per row, row-major in the grid so the
weight block is reused from L2; beyond that the x rows go through tl.dot (BLOCK_M = 16 rows
padded) so weights are read once for the whole batch (interp: tl.dot from M = 2, for tests).
Requirements (checked by the entry): x (M, K) and W (rows, K) with unit stride along K.
QKV + RoPE + KV-cache append (`fused_qkv_rope`): the same GEMV over rotation pairs (rows r and
r + D/2 of one head), RoPE in the epilogue, k and v stored straight into the cache.
PDL (kernels/_pdl.py): the first weight tile is loaded before `gdc_wait`; the K loop keeps
one tile in flight ahead. Loads the epilogue needs (residual; RoPE position, inv_freq, bias)
are issued before the K loop, not after it, so their latency hides behind the loop.
Configs: `fused_gemv_config` (a rule over the device's facts, kernels/_common.py, plus
GEMV_TABLE's entries measured on the H200 for the shapes swept there).
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton
from ._common import device_facts
from ._host import cdiv as _cdiv, next_pow2 as _np2

# PDL policy and helpers: kernels/_pdl.py (re-exported: callers use decode_fused's names)
from ._pdl import _pdl_wait, pdl_enabled, pdl_opts, set_pdl  # noqa: F401
from ..dispatch import register
from .rope import _cache_length, _check_position, _cos_sin


@triton.jit
def _epilogue(y, u, inv, offs_n, nmask, m, b_ptr, r_ptr, s_rm,
              NORM: tl.constexpr, GLU: tl.constexpr, HAS_BIAS: tl.constexpr,
              HAS_RES: tl.constexpr):
    if NORM:
        y = y * inv
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)
    if GLU:
        if NORM:
            u = u * inv
        y = y / (1.0 + tl.exp(-y)) * u
    if HAS_RES:
        y += tl.load(r_ptr + m * s_rm + offs_n, mask=nmask, other=0.0).to(tl.float32)
    return y


@triton.jit
def _accum(acc, acc_u, ss, w, wu, x_row, nw_ptr, kk, K,
           EVEN_K: tl.constexpr, NORM: tl.constexpr, GLU: tl.constexpr):
    """One K chunk: acc += w * (x [* nw]), the sum of squares of x for NORM."""
    if EVEN_K:
        xv = tl.load(x_row + kk).to(tl.float32)
    else:
        xv = tl.load(x_row + kk, mask=kk < K, other=0.0).to(tl.float32)
    if NORM:
        ss += xv * xv
        if EVEN_K:
            xv = xv * tl.load(nw_ptr + kk).to(tl.float32)
        else:
            xv = xv * tl.load(nw_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
    acc += w.to(tl.float32) * xv[None, :]
    if GLU:
        acc_u += wu.to(tl.float32) * xv[None, :]
    return acc, acc_u, ss


@triton.jit
def _wtile(w_rows, kk, K, EVEN_K: tl.constexpr):
    if EVEN_K:
        return tl.load(w_rows + kk[None, :])
    return tl.load(w_rows + kk[None, :], mask=(kk < K)[None, :], other=0.0)


@triton.jit
def _pair_loop(w, wu, w_rows, wu_rows, x_row, nw_ptr, offs_k, K, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, NORM: tl.constexpr,
               GLU: tl.constexpr):
    """The K loop of the row-per-program kernels, after their first tiles (w, and wu of rows
    wu_rows when GLU) were issued at offs_k: each step loads the next tiles before it
    accumulates the current ones (one tile in flight ahead). (acc, acc_u, ss) as _accum."""
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
    # the loop carries the K offset as a scalar: a carried offset TENSOR (kk = kn) made the
    # x load take its addresses and mask through shared memory (three barriers before the
    # load, on the critical path after the PDL wait; H200, `sweep_gemv_chain.py --quick
    # --cfg-sweep`)
    k_cur = 0
    for k0 in range(BLOCK_K, K, BLOCK_K):
        kn = k0 + offs_k
        w_next = _wtile(w_rows, kn, K, EVEN_K)
        wu_next = w_next
        if GLU:
            wu_next = _wtile(wu_rows, kn, K, EVEN_K)
        acc, acc_u, ss = _accum(acc, acc_u, ss, w, wu, x_row, nw_ptr, k_cur + offs_k, K,
                                EVEN_K, NORM, GLU)
        w = w_next
        wu = wu_next
        k_cur = k0
    return _accum(acc, acc_u, ss, w, wu, x_row, nw_ptr, k_cur + offs_k, K, EVEN_K, NORM, GLU)


@triton.jit
def _rope_program(HALF: tl.constexpr, BLOCK_N: tl.constexpr):
    """The QKV + RoPE + append kernels' program: x row m, and BLOCK_N rotation pairs (i) of
    ONE head (BLOCK_N divides HALF = D/2) at weight rows r1 = head*D + i and r1 + HALF."""
    m = tl.program_id(0).to(tl.int64)
    j0 = tl.program_id(1) * BLOCK_N
    head = j0 // HALF
    i = (j0 % HALF) + tl.arange(0, BLOCK_N)
    r1 = (head * 2 * HALF + i).to(tl.int64)
    return m, head, i, r1


@triton.jit
def _fused_gemv1_kernel(x_ptr, w_ptr, o_ptr, nw_ptr, b_ptr, r_ptr, N, K, eps,
                        s_xm, s_wn, s_om, s_rm,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                        NORM: tl.constexpr, GLU: tl.constexpr, HAS_BIAS: tl.constexpr,
                        HAS_RES: tl.constexpr, PDL: tl.constexpr):
    # one x row against BLOCK_N weight rows; element-wise fp32 accumulation. The row index is
    # grid axis 0 (fastest): the M programs sharing a weight block run back to back, so for
    # M > 1 the block comes from HBM once and from L2 for the other rows.
    # The next weight tile is loaded before the current one is used (one tile in flight
    # ahead); the first is loaded before the PDL wait (weights are read-only in the step),
    # so it streams while the previous kernel finishes.
    # The residual (written by an earlier kernel) is loaded right after the wait, so its
    # latency hides behind the K loop instead of following it (same values, same sums).
    m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    rows = tl.where(nmask, offs_n, 0).to(tl.int64)       # tail rows re-read row 0 (in bounds)
    offs_k = tl.arange(0, BLOCK_K)
    x_row = x_ptr + m * s_xm
    w_rows = w_ptr + rows[:, None] * s_wn
    w = _wtile(w_rows, offs_k, K, EVEN_K)
    wu = w
    if GLU:
        wu = _wtile(w_rows + N * s_wn, offs_k, K, EVEN_K)
    _pdl_wait(PDL)
    if HAS_RES:
        res = tl.load(r_ptr + m * s_rm + offs_n, mask=nmask, other=0.0)
    acc, acc_u, ss = _pair_loop(w, wu, w_rows, w_rows + N * s_wn, x_row, nw_ptr, offs_k, K,
                                BLOCK_N, BLOCK_K, EVEN_K, NORM, GLU)
    y = tl.sum(acc, axis=1)
    u = tl.sum(acc_u, axis=1)
    inv = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
    # the epilogue adds the residual last: the same order here
    y = _epilogue(y, u, inv, offs_n, nmask, m, b_ptr, r_ptr, s_rm, NORM, GLU, HAS_BIAS, False)
    if HAS_RES:
        y += res.to(tl.float32)
    tl.store(o_ptr + m * s_om + offs_n, y.to(o_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _rope_append(y1, y2, m, head, i, r1, q_ptr, b_ptr, pos_ptr, inv_ptr, ck_ptr, cv_ptr,
                 len_ptr, flag_ptr, tag, Hq, Hkv, C, s_qm, s_pb, s_cb, s_ch, s_cn, s_cd, s_vb,
                 s_vh, s_vn, s_vd, HALF: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The epilogue of the QKV + RoPE + append kernels (quant_fused's; this file's kernel
    loads its operands early and calls `_rope_store`): the pair sums y1, y2 (fp32,
    normalised) of rows r1 and r1 + HALF of head `head` for x row m: + bias, rounded to the
    activations' dtype, rotated (q and k heads), stored to q or to the cache slot
    positions[m] (skipped outside the cache); program 0 of the row records a position
    outside the cache in the index-error flag and sets lengths[m] = positions[m] + 1, kept
    inside [0, C]. Called after the PDL wait."""
    b1 = y1
    b2 = y2
    if HAS_BIAS:
        b1 = tl.load(b_ptr + r1)
        b2 = tl.load(b_ptr + r1 + HALF)
    pos = tl.load(pos_ptr + m * s_pb).to(tl.int64)
    _rope_store(y1, y2, b1, b2, pos, tl.load(inv_ptr + i), m, head, i, r1, q_ptr, ck_ptr,
                cv_ptr, len_ptr, flag_ptr, tag, Hq, Hkv, C, s_qm, s_cb, s_ch, s_cn, s_cd, s_vb,
                s_vh, s_vn, s_vd, HALF, HAS_BIAS)


@triton.jit
def _rope_store(y1, y2, b1, b2, pos, invf, m, head, i, r1, q_ptr, ck_ptr, cv_ptr, len_ptr,
                flag_ptr, tag, Hq, Hkv, C, s_qm, s_cb, s_ch, s_cn, s_cd, s_vb, s_vh, s_vn, s_vd,
                HALF: tl.constexpr, HAS_BIAS: tl.constexpr):
    """`_rope_append` with its loads done by the caller: b1/b2 the bias of rows r1 and
    r1 + HALF (HAS_BIAS), pos = positions[m] (int64), invf = inv_freq[i]."""
    if HAS_BIAS:
        y1 += b1.to(tl.float32)
        y2 += b2.to(tl.float32)
    dt = q_ptr.dtype.element_ty
    y1 = y1.to(dt).to(tl.float32)
    y2 = y2.to(dt).to(tl.float32)
    if head < Hq + Hkv:
        c, s = _cos_sin(pos.to(tl.float32) * invf)
        t1 = y1 * c - y2 * s
        y2 = y2 * c + y1 * s
        y1 = t1
    if head < Hq:
        qb = q_ptr + m * s_qm + r1
        tl.store(qb, y1.to(dt))
        tl.store(qb + HALF, y2.to(dt))
    else:
        ok = (pos >= 0) & (pos < C)          # outside the cache: skipped (program 0 flags it)
        slot = tl.where(ok, pos, 0)
        km = (i < HALF) & ok
        if head < Hq + Hkv:
            cb = ck_ptr + m * s_cb + (head - Hq).to(tl.int64) * s_ch + slot * s_cn
            tl.store(cb + i * s_cd, y1.to(ck_ptr.dtype.element_ty), mask=km)
            tl.store(cb + (i + HALF) * s_cd, y2.to(ck_ptr.dtype.element_ty), mask=km)
        else:
            vb = cv_ptr + m * s_vb + (head - Hq - Hkv).to(tl.int64) * s_vh + slot * s_vn
            tl.store(vb + i * s_vd, y1.to(cv_ptr.dtype.element_ty), mask=km)
            tl.store(vb + (i + HALF) * s_vd, y2.to(cv_ptr.dtype.element_ty), mask=km)
    if tl.program_id(1) == 0:
        _check_position(pos, C, flag_ptr, tag)
        tl.store(len_ptr + m, _cache_length(pos, C).to(len_ptr.dtype.element_ty))


@triton.jit
def _fused_qkv_rope_kernel(x_ptr, w_ptr, q_ptr, nw_ptr, b_ptr, pos_ptr, inv_ptr, ck_ptr, cv_ptr,
                           len_ptr, flag_ptr, tag, K, eps, Hq, Hkv, C, s_xm, s_wn, s_qm, s_pb,
                           s_cb, s_ch, s_cn, s_cd, s_vb, s_vh, s_vn, s_vd,
                           HALF: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           EVEN_K: tl.constexpr, NORM: tl.constexpr, HAS_BIAS: tl.constexpr,
                           PDL: tl.constexpr):
    # The decode step's RMSNorm + QKV GEMV + RoPE + KV-cache append in one kernel. A program
    # owns BLOCK_N rotation pairs of ONE head (BLOCK_N divides HALF = D/2): weight rows
    # r1 = head*D + i and r2 = r1 + HALF (rotate_half pairs), accumulated as the GLU pair.
    # Heads [0, Hq) are q (rotated, stored to q), [Hq, Hq+Hkv) k (rotated, into the cache at
    # the position read on the device), the rest v (into the cache). Values are rounded to
    # the activations' dtype before the rotation, exactly as GEMV -> kv_append would.
    # The epilogue's loads are issued up front (read-only inv_freq and bias before the
    # PDL wait, the position right after it) so their latency hides behind the K loop instead
    # of following it; the values and the arithmetic are the same (bit-identical results).
    m, head, i, r1 = _rope_program(HALF, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_row = x_ptr + m * s_xm
    w_rows = w_ptr + r1[:, None] * s_wn
    w2_rows = w_rows + HALF * s_wn
    w = _wtile(w_rows, offs_k, K, EVEN_K)
    wu = _wtile(w2_rows, offs_k, K, EVEN_K)
    invf = tl.load(inv_ptr + i)
    b1 = invf
    b2 = invf
    if HAS_BIAS:
        b1 = tl.load(b_ptr + r1)
        b2 = tl.load(b_ptr + r1 + HALF)
    _pdl_wait(PDL)
    pos = tl.load(pos_ptr + m * s_pb).to(tl.int64)
    acc, acc_u, ss = _pair_loop(w, wu, w_rows, w2_rows, x_row, nw_ptr, offs_k, K, BLOCK_N,
                                BLOCK_K, EVEN_K, NORM, True)
    y1 = tl.sum(acc, axis=1)
    y2 = tl.sum(acc_u, axis=1)
    if NORM:
        inv = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
        y1 = y1 * inv
        y2 = y2 * inv
    _rope_store(y1, y2, b1, b2, pos, invf, m, head, i, r1, q_ptr, ck_ptr, cv_ptr, len_ptr,
                flag_ptr, tag, Hq, Hkv, C, s_qm, s_cb, s_ch, s_cn, s_cd, s_vb, s_vh, s_vn,
                s_vd, HALF, HAS_BIAS)


@triton.jit
def _fused_gemvm_kernel(x_ptr, w_ptr, o_ptr, nw_ptr, b_ptr, r_ptr, M, N, K, eps,
                        s_xm, s_wn, s_om, s_rm,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        NORM: tl.constexpr, GLU: tl.constexpr, HAS_BIAS: tl.constexpr,
                        HAS_RES: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    # BLOCK_M x rows at once through tl.dot: the weight tile is read once for the batch
    _pdl_wait(PDL)
    pid_n = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = offs_m < M
    xrows = tl.where(mmask, offs_m, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    rows = tl.where(nmask, offs_n, 0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + xrows[:, None] * s_xm
    w_rows = w_ptr + rows[:, None] * s_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        kmask = kk < K
        xv = tl.load(x_rows + kk[None, :], mask=kmask[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_rows + kk[None, :], mask=kmask[None, :], other=0.0)
        if NORM:
            ss += tl.sum(xv * xv, axis=1)
            xv = xv * tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)[None, :]
        xd = xv.to(w.dtype)
        acc = tl.dot(xd, tl.trans(w), acc, input_precision=PRECISION)
        if GLU:
            wu = tl.load(w_rows + N * s_wn + kk[None, :], mask=kmask[None, :], other=0.0)
            acc_u = tl.dot(xd, tl.trans(wu), acc_u, input_precision=PRECISION)
    inv = (1.0 / tl.sqrt(ss / K + eps))[:, None]
    y = _epilogue(acc, acc_u, inv, offs_n[None, :], nmask[None, :], xrows[:, None],
                  b_ptr, r_ptr, s_rm, NORM, GLU, HAS_BIAS, HAS_RES)
    tl.store(o_ptr + offs_m[:, None].to(tl.int64) * s_om + offs_n[None, :],
             y.to(o_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


# ------------------------------------------------------------------ launch configuration
#
# cuda, M <= SMALL_M (a program per x row and weight block): BLOCK_N = the largest power
# of two <= 16 that still leaves >= PROGRAMS_PER_SM programs per SM of the device
# (device_facts); the tile holds 4096 weight elements (16-bit) or 2048 (fp32) so each of
# 128 threads issues 16-byte loads and keeps 32 (64 with GLU) fp32 accumulators.
# cuda, M > SMALL_M: 16 x rows, BLOCK_N 32 (16 when that gives too few programs), BLOCK_K 64;
# weights above SMALL_W_BYTES (16-bit): 16 x 512 (GLU 16 x 256) while the row blocks fit
# that many programs, else 64 x 256 (H200, M = 16, `bench_matmul.py --m16-fused`).
# interp: few, large programs (the interpreter pays per program).
# cuda, small weights (<= SMALL_W_BYTES, SmolLM2's 576-wide layers): latency-bound, so fewer,
# fatter programs win. The H200 sweep (`bench_decode.py --sweep`, before the K loop carried
# a scalar offset) picked, against the rule above: qkv 960x576 BLOCK_N 8 (1.76 vs 2.62 us),
# o 576x576 BLOCK_N 8 (1.52 vs 1.69), down 576x1536 BLOCK_N 4 BLOCK_K 1024 (1.88 vs 2.14),
# gate/up 2x1536x576 BLOCK_N 4 BLOCK_K 256 (2.29 vs 3.77), qkv+RoPE 480 pairs x 576 BLOCK_N
# 2 (2.22 vs 2.42): about 6144 weight elements a program (3072 for RoPE pairs), one
# 1024-wide K step (256 with GLU). With the scalar-offset K loop, down and gate/up do better
# with the whole row in one tile (GEMV_TABLE below; measured only at SmolLM2's shapes, so
# the rule is unchanged). Sweep a table entry with the flags the step uses: a fused RMSNorm
# adds registers, and a tile that no longer fits its grid in one wave loses more than any
# tile choice gains (`bench_decode.py --quick --sweep-model SmolLM2`).
PROGRAMS_PER_SM = 2
SMALL_M = 4        # cuda: up to this many rows use the row-per-program kernel (L2 reuse)
SMALL_W_BYTES = 4 << 20
_SMALL_RULE = {"plain": (6144, 1024), "glu": (6144, 256), "rope": (3072, 1024)}
_OVERRIDE: dict | None = None     # tests: force a config (keys as returned below)

# Configs measured on the H200 for the row-per-program kernels (cuda, M <= SMALL_M, 16-bit
# weights), keyed by fused_gemv_config's (kind, N, K): N = outputs ("glu": of the 2N weight
# rows; "rope": rotation pairs). Filled from `bench_decode.py --sweep --sweep-model 1B` on
# the H200 (it prints the winners as a line to paste here); shapes not listed take the rule.
GEMV_TABLE: dict = {
    # H200, `bench_decode.py --quick --sweep-model 1B`: gate/up+SiLU of the Llama-3.2-1B
    # shape 20.5 -> 17.7 us alone; the batch-1 step 1194 -> 1254 tok/s
    ("glu", 8192, 2048): {"BLOCK_N": 4, "BLOCK_K": 256, "num_warps": 4},
    # H200, `sweep_gemv_chain.py --quick --cfg-sweep` (per GEMV in a graph chain on rotated
    # weights, % of the 4.19 TB/s copy): 4096x4096 78 -> 85 %, N 8192 x K 2048 83 -> 89 %,
    # N 3072 x K 2048 59 -> 67 % (N 2048 x K 2048: no config beat the rule's 64 %)
    ("plain", 4096, 4096): {"BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 8},
    ("plain", 8192, 2048): {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 8},
    ("plain", 3072, 2048): {"BLOCK_N": 2, "BLOCK_K": 512, "num_warps": 4},
    # H200, the same sweep with the K loop carrying a scalar offset: N 2048 x K 8192 83 ->
    # 89 % (the rule's 4 warps lost 6 % with that loop), N 4096 x K 14336 88 -> 98 %,
    # N 14336 x K 4096 90 -> 97 %
    ("plain", 2048, 8192): {"BLOCK_N": 4, "BLOCK_K": 1024, "num_warps": 8},
    ("plain", 4096, 14336): {"BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 8},
    ("plain", 14336, 4096): {"BLOCK_N": 2, "BLOCK_K": 1024, "num_warps": 4},
    # SmolLM2 on the H200, `bench_decode.py --quick --sweep-model SmolLM2` (each GEMV with
    # the step's own flags; the chain sweep above runs without the fused RMSNorm): the
    # whole row in one tile, loaded before the PDL wait. gate/up + norm: 4 x 1024 takes 231
    # registers with the norm (164 without), so its 384 programs ran in two waves of 2 a
    # SM; capped at 168 (16 bytes spilled) they fit 3 a SM, one wave: 3.80 -> 2.67 us.
    # down+res 1.67 -> 1.50, o+res 1.24 -> 1.19, lm_head+norm 18.6 -> 17.9; the step
    # 2261 -> 2458 tok/s
    ("glu", 1536, 576): {"BLOCK_N": 4, "BLOCK_K": 1024, "num_warps": 4, "maxnreg": 168},
    ("plain", 576, 576): {"BLOCK_N": 4, "BLOCK_K": 1024, "num_warps": 4},
    ("plain", 576, 1536): {"BLOCK_N": 4, "BLOCK_K": 2048, "num_warps": 4},
    ("plain", 49152, 576): {"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4},
}


def fused_gemv_config(M, N, K, itemsize, dev, kind="plain") -> dict:
    """The launch config for `dev` (kernels/_common.DeviceFacts). kind: "plain", "glu" (N
    outputs from 2N weight rows) or "rope" (N rotation pairs, 2N weight rows)."""
    kp = max(16, _np2(K))
    if _OVERRIDE:
        return dict(_OVERRIDE)
    if dev.type != "cuda":
        if M == 1:
            return dict(BLOCK_N=min(32, _np2(N)), BLOCK_K=min(128, kp),
                        num_warps=4)
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=min(64, kp), num_warps=4)
    if M <= SMALL_M and itemsize == 2:
        hit = GEMV_TABLE.get((kind, N, K))
        if hit is not None:
            return dict(hit)
    min_programs = PROGRAMS_PER_SM * dev.sms
    rows = 1 if kind == "plain" else 2          # weight rows a BLOCK_N unit reads
    if M <= SMALL_M and N * rows * K * itemsize <= SMALL_W_BYTES:
        elems, bk = _SMALL_RULE[kind]
        bn = 16
        while bn > 1 and bn * rows * K > elems:
            bn //= 2
        return dict(BLOCK_N=bn, BLOCK_K=min(bk, kp), num_warps=4)
    if M <= SMALL_M:
        bn = 16
        while bn > 1 and _cdiv(N, bn) < min_programs:
            bn //= 2
        tile = 4096 if itemsize <= 2 else 2048
        if kind == "rope":
            # the pair's two tiles together hold `tile` elements: at the 1B shape (1536 pairs
            # x 2048) 4 x 1024 took 230 registers (2 programs/SM, 384 programs in 1.45
            # waves of an H200); 4 x 512 takes 110 (4/SM, one wave), as the plain QKV
            # GEMV's 8 x 512
            tile //= 2
        return dict(BLOCK_N=bn, BLOCK_K=min(tile // bn, kp), num_warps=4)
    if kind != "rope" and itemsize == 2 and N * rows * K * itemsize > SMALL_W_BYTES:
        # batches of > SMALL_M rows on big 16-bit weights (H200, `bench_matmul.py
        # --m16-fused`, M = 16, the 1B projections): few outputs -> 16-row tiles with long
        # 512-wide K steps (o+res 2048x2048 12.1 -> 5.6 us, down+res 8192->2048 44.3 ->
        # 13.1); many -> 64 x 256 (gate/up+GLU 31.1 -> 21.7, lm_head+norm 378 -> 220); the
        # GLU pair's two tiles at 16 x 512 x 4 stages would not fit shared memory: 256 wide
        if _cdiv(N, 16) <= min_programs:
            return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=min(512 if rows == 1 else 256, kp),
                        num_warps=4, num_stages=4 if rows == 1 else 3)
        return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=min(256, kp), num_warps=4, num_stages=3)
    bn = 32 if _cdiv(N, 32) >= min_programs // 2 else 16
    return dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=min(64, kp), num_warps=4, num_stages=3)


def gemv_out(x, w, glu, out):
    """(M, K, N, out) of a fused GEMV (this file's and quant_fused's): x (M, K), N = w's
    rows (half of them with glu); out allocated (M, N) in x's dtype when None."""
    from ..tensor import Tensor
    M, K = x.shape
    N = w.shape[0] // 2 if glu else w.shape[0]
    if out is None:
        out = Tensor._empty((M, N), x.dtype, x.device)
    return M, K, N, out


def fused_gemv(x, w, *, norm_weight=None, eps=1e-6, bias=None, residual=None, glu=False,
               out=None):
    """out (M, N) = epilogue(rmsnorm?(x) @ W^T). x (M, K); w (N, K), or (2N, K) = [gate; up]
    with glu. Validation is done by the caller (ops/decode.decode_linear). PDL as
    `pdl_enabled(x.device)` says."""
    from .. import dtypes as _dt
    from ..backends.launch import launch
    M, K, N, out = gemv_out(x, w, glu, out)
    if M == 0 or N == 0:
        return out
    cfg = fused_gemv_config(M, N, K, w.dtype.itemsize, device_facts(x.device),
                            "glu" if glu else "plain")
    flags = dict(NORM=norm_weight is not None, GLU=bool(glu), HAS_BIAS=bias is not None,
                 HAS_RES=residual is not None)
    nw = norm_weight if norm_weight is not None else w
    b = bias if bias is not None else w
    r = residual if residual is not None else out
    s_rm = residual.stride(0) if residual is not None else 0
    opts = {k: v for k, v in cfg.items() if k in ("num_warps", "num_stages", "maxnreg")}
    pdl = pdl_opts(x.device)
    if "BLOCK_M" not in cfg:
        launch(_fused_gemv1_kernel, (M, _cdiv(N, cfg["BLOCK_N"])), x, w, out, nw, b, r,
               N, K, float(eps), x.stride(0), w.stride(0), out.stride(0), s_rm,
               BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], EVEN_K=K % cfg["BLOCK_K"] == 0,
               **flags, **opts, **pdl)
    else:
        prec = "ieee" if w.dtype == _dt.float32 else "tf32"
        launch(_fused_gemvm_kernel, (_cdiv(N, cfg["BLOCK_N"]), _cdiv(M, cfg["BLOCK_M"])),
               x, w, out, nw, b, r, M, N, K, float(eps), x.stride(0), w.stride(0),
               out.stride(0), s_rm, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
               BLOCK_K=cfg["BLOCK_K"], PRECISION=prec, **flags, **opts, **pdl)
    return out


@register("decode_linear", "triton")
def decode_linear(x, w, *, norm_weight, eps, bias, residual, glu, out_dtype):
    """ops/decode.decode_linear on cuda/interp (checked there): fused_gemv on unit-stride
    operands (16-byte loads along K; the decode step's tensors already are)."""
    from ..tensor import Tensor
    op = "decode_linear"
    if x.stride(1) != 1:
        x = x.contiguous()
    if w.stride(1) != 1:
        raise ValueError(f"{op}: w must have unit stride along K (prepare it at load)")
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()
    for name, t in (("norm_weight", norm_weight), ("bias", bias)):
        if t is not None and t.stride(0) != 1:
            raise ValueError(f"{op}: {name} must be contiguous")
    N = w.shape[0] // 2 if glu else w.shape[0]
    out = Tensor._empty((x.shape[0], N), out_dtype, x.device)
    return fused_gemv(x, w, norm_weight=norm_weight, eps=eps, bias=bias, residual=residual,
                      glu=glu, out=out)


@register("decode_qkv_rope", "triton")
def fused_qkv_rope(x, w, q_out, ck, cv, lengths, positions, inv, *, num_heads, num_kv_heads,
                   norm_weight=None, eps=1e-6, bias=None):
    """The decode step's QKV projection with RoPE and the cache append fused in:
    qkv = rmsnorm?(x) @ W^T (+ bias), W = [wq; wk; wv] ((Hq + 2 Hkv) * D, K); q rotated into
    q_out (M, Hq * D); k rotated and v written at slot positions[b] of ck / cv (B, Hkv, C, D)
    views; lengths[b] = positions[b] + 1 (a position outside the cache raises IndexError as
    KVCache.append does). Validation is done by ops/decode.decode_qkv_rope."""
    from ..backends.launch import launch
    from ..index_errors import positions_err
    from .indexing import _after, _flag, _tag
    M, K = x.shape
    D = ck.shape[3]
    half = D // 2
    npairs = (num_heads + 2 * num_kv_heads) * half
    cfg = fused_gemv_config(M, npairs, K, w.dtype.itemsize, device_facts(x.device), "rope")
    bn = cfg.get("BLOCK_N", 16)
    while half % bn:                       # a program's pairs stay inside one head
        bn //= 2
    bk = cfg["BLOCK_K"] if "BLOCK_M" not in cfg else min(4096 // bn, max(16, _np2(K)))
    err = positions_err("decode_qkv_rope", ck.shape[2])
    launch(_fused_qkv_rope_kernel, (M, npairs // bn), x, w, q_out,
           norm_weight if norm_weight is not None else w, bias if bias is not None else w,
           positions, inv, ck, cv, lengths, _flag(x.device), _tag(err), K, float(eps),
           num_heads, num_kv_heads, ck.shape[2], x.stride(0), w.stride(0), q_out.stride(0),
           positions.stride(0), *ck.stride(), *cv.stride(), HALF=half, BLOCK_N=bn, BLOCK_K=bk,
           EVEN_K=K % bk == 0, NORM=norm_weight is not None, HAS_BIAS=bias is not None,
           num_warps=cfg.get("num_warps", 4),
           **{k: cfg[k] for k in ("maxnreg",) if k in cfg}, **pdl_opts(x.device))
    _after(x.device, err)
    return q_out
