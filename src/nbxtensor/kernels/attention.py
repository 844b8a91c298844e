"""Flash attention (prefill) on cuda/interp: online softmax over KV blocks, no score matrix.

One program owns BLOCK_M query rows of one (batch, query head) and walks the keys in
BLOCK_N blocks, keeping the running max m, the running sum l and the unnormalised output
acc in registers. Scores are scaled by scale*log2(e) so the softmax uses exp2.

GQA: query head h reads kv head h // GROUP; K/V are never repeated in memory.
Causal (top-left aligned, key j <= query i): keys below the block's first row need no mask
(the off-diagonal loop); only the blocks that cross the diagonal are masked; blocks above
it are skipped. Tails (L, S not multiples of the tile, head dims that are not a power of
two) are masked loads. A row with every key masked gives 0 (torch >= 2.5 safe softmax).

`_flash_fwd_tma` is the same algorithm for the common no-mask case with TMA tile loads
(device-built tensor descriptors); `_flash_fwd_ws` is that case as one key loop for
Triton's Hopper warp specialisation (a TMA producer warpgroup + two softmax/MMA consumer
warpgroups, FA3's layout). The TUNED table at the top chooses the kernel and tile.
"""
from __future__ import annotations

from .. import config as _config

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import autotune as _autotune
from ..dispatch import register
from ._host import cdiv as _cdiv, f64_bits as _f64_bits, next_pow2 as _np2

LOG2E = 1.4426950408889634

# ---- the default rule for 16-bit GPU inputs, keyed by (padded head dim, causal) ----------
# `benchmarks/bench_attention.py --sweep-prefill` prints this table from the H200's winners,
# ready to paste over it. Keys: BLOCK_M, BLOCK_N, num_warps, num_stages (launch), and at
# most one kernel switch: TMA=True (`_flash_fwd_tma`, LAZY=True adds the lazy rescale),
# WS=True (`_flash_fwd_ws`, Hopper warp specialisation; WS="off" the same loop without it),
# none = the pointer kernel. TMA/WS entries apply only where `_tma_ok` holds (no mask, head
# dim a power of two, 16-byte aligned rows); elsewhere the pointer kernel runs its own
# (untuned) default tile, never the TMA/WS tile.
# Measured on the H200 (2026-11-29, bench_attention.py --sweep-prefill, B4 H32 S4096): D128
# non-causal WS M128 N128 s2 579 TFLOP/s = 0.86x torch SDPA (pointer kernel 0.75x); D128
# causal: the pointer kernel (0.77x); D64: the pointer kernel (0.91-0.93x).
# Triton 3.6's warp-specialised loop computed WRONG results on the H200 (NaN, or 0.23 off)
# causal, with BLOCK_N=64, and at D=64; only the settings in WS_VERIFIED (each checked
# against float64 with tails on both lengths by test_sdpa_fast_kernels_cuda) may run it.
WS_VERIFIED = {(128, 128, 128, 4, 2)}   # (head dim, BLOCK_M, BLOCK_N, num_warps, num_stages)
TUNED: dict = {
    (128, False): dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, WS=True),
    (128, True): dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    (64, False): dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
    (64, True): dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
}


@triton.jit
def _fa_block(acc, l_i, m_i, q, k_base, v_base, mk_base, offs_m, offs_d, offs_dv, lo, hi,
              S, D, DV, s_kn, s_kd, s_vn, s_vd, s_mm, s_mn, qk_scale,
              BLOCK_N: tl.constexpr, DIAG: tl.constexpr, BOUNDS: tl.constexpr,
              MASK_KIND: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
              PREC: tl.constexpr, F64: tl.constexpr, SCALE_POS: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        kt_ptr = k_base + offs_d[:, None] * s_kd + offs_n[None, :] * s_kn
        v_ptr = v_base + offs_n[:, None] * s_vn + offs_dv[None, :] * s_vd
        if BOUNDS:
            nk = offs_n[None, :] < S
            nv = offs_n[:, None] < S
            if not EVEN_D:
                nk = nk & (offs_d[:, None] < D)
            if not EVEN_DV:
                nv = nv & (offs_dv[None, :] < DV)
            kt = tl.load(kt_ptr, mask=nk, other=0.0)
            v = tl.load(v_ptr, mask=nv, other=0.0)
        else:
            if EVEN_D:
                kt = tl.load(kt_ptr)
            else:
                kt = tl.load(kt_ptr, mask=offs_d[:, None] < D, other=0.0)
            if EVEN_DV:
                v = tl.load(v_ptr)
            else:
                v = tl.load(v_ptr, mask=offs_dv[None, :] < DV, other=0.0)
        if F64:
            qk = tl.dot(q, kt, input_precision=PREC, out_dtype=tl.float64)
        else:
            qk = tl.dot(q, kt, input_precision=PREC)
        if MASK_KIND == 0 and not DIAG and not BOUNDS and SCALE_POS:
            # the hot loop: scale inside the exponent's argument (one FMA an element);
            # max(qk) * scale is the max of the scaled scores only for a positive scale
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk * qk_scale - m_new[:, None])
        else:
            qk = qk * qk_scale
            if MASK_KIND == 1:
                mk = tl.load(mk_base + offs_m[:, None] * s_mm + offs_n[None, :] * s_mn,
                             mask=offs_n[None, :] < S, other=0)
                qk = tl.where(mk != 0, qk, -float("inf"))
            if MASK_KIND == 2:
                mk = tl.load(mk_base + offs_m[:, None] * s_mm + offs_n[None, :] * s_mn,
                             mask=offs_n[None, :] < S, other=0.0)
                if F64:
                    qk = qk + mk.to(tl.float64) * 1.4426950408889634
                else:
                    qk = qk + mk.to(tl.float32) * 1.4426950408889634
            if DIAG:
                qk = tl.where(offs_m[:, None] >= offs_n[None, :], qk, -float("inf"))
            if BOUNDS:
                qk = tl.where(offs_n[None, :] < S, qk, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            if MASK_KIND != 0:
                # a row that has seen only masked keys shifts by 0, so exp2 gives 0, not NaN
                m_use = tl.where(m_new == -float("inf"), 0.0, m_new)
            else:
                m_use = m_new
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(qk - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if F64:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PREC, out_dtype=tl.float64)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fa_program(H, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """Every forward kernel's program: batch b, query head h, its K/V head hk (int64) and
    first query row; grid (query blocks, B * H)."""
    if CAUSAL:
        # the longest rows first: they have the most key blocks
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    hk = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    return b, h, hk, pid_m * BLOCK_M


@triton.jit
def _flash_fwd(q_ptr, k_ptr, v_ptr, o_ptr, mk_ptr,
               s_qb, s_qh, s_qm, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
               s_ob, s_oh, s_om, s_od, s_mb, s_mh, s_mm, s_mn,
               H, L, S, D, DV, qk_scale,
               GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr,
               MASK_KIND: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
               PREC: tl.constexpr, F64: tl.constexpr, SCALE_POS: tl.constexpr):
    b, h, hk, start_m = _fa_program(H, GROUP, BLOCK_M, CAUSAL)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_base = q_ptr + b * s_qb + h * s_qh
    k_base = k_ptr + b * s_kb + hk * s_kh
    v_base = v_ptr + b * s_vb + hk * s_vh
    mk_base = mk_ptr + b * s_mb + h * s_mh
    q = tl.load(q_base + offs_m[:, None] * s_qm + offs_d[None, :] * s_qd,
                mask=(offs_m[:, None] < L) & (offs_d[None, :] < D), other=0.0)
    if F64:
        # float64: the scale arrives as its int64 bit pattern (a Python float would be bound
        # as an fp32 parameter and lose precision; seen on the H200: 1e-6 relative error)
        qk_scale = qk_scale.to(tl.float64, bitcast=True)
        acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float64)
        l_i = tl.zeros((BLOCK_M,), tl.float64)
        m_i = tl.full((BLOCK_M,), -float("inf"), tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    if CAUSAL:
        hi_off = tl.minimum(start_m, S)          # keys every row of the block may see
        hi_diag = tl.minimum(start_m + BLOCK_M, S)
    else:
        hi_off = S
        hi_diag = S
    full = (hi_off // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _fa_block(acc, l_i, m_i, q, k_base, v_base, mk_base, offs_m, offs_d, offs_dv,
                              0, full, S, D, DV, s_kn, s_kd, s_vn, s_vd, s_mm, s_mn, qk_scale,
                              BLOCK_N, False, False, MASK_KIND, EVEN_D, EVEN_DV, PREC, F64,
                              SCALE_POS)
    # the tail of the unmasked range (keys full..hi_off-1, bounded by S) and, when causal,
    # the blocks crossing the diagonal (start_m is a multiple of BLOCK_N, so they follow)
    acc, l_i, m_i = _fa_block(acc, l_i, m_i, q, k_base, v_base, mk_base, offs_m, offs_d, offs_dv,
                              full, hi_diag, S, D, DV, s_kn, s_kd, s_vn, s_vd, s_mm, s_mn,
                              qk_scale, BLOCK_N, CAUSAL, True, MASK_KIND, EVEN_D, EVEN_DV,
                              PREC, F64, SCALE_POS)
    l_i = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_i[:, None]
    o_base = o_ptr + b * s_ob + h * s_oh
    tl.store(o_base + offs_m[:, None] * s_om + offs_dv[None, :] * s_od,
             o.to(o_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < L) & (offs_dv[None, :] < DV))


@triton.jit
def _fa_tma_block(acc, l_i, m_i, q, kd, vd, offs_m, lo, hi, S, qk_scale,
                  BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                  LAZY: tl.constexpr, PREC: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        k = kd.load([start_n, 0])                       # [BLOCK_N, D]; rows >= S read as 0
        qk = tl.dot(q, k.T, input_precision=PREC)       # wgmma reads K^T from shared memory
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            keep = offs_n[None, :] < S
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            qk = tl.where(keep, qk * qk_scale, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_use = tl.where(m_new == -float("inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(qk - m_use[:, None])
        elif LAZY:
            # FA4's lazy rescale: keep the reference max m_i until some row's max grows by
            # more than 2^8 (p <= 256 is exact enough in fp32 sums and a bf16 P); the
            # branch is uniform over the block, so most steps skip the acc multiply
            m_blk = tl.max(qk, 1) * qk_scale
            if tl.max(m_blk - m_i, 0) > 8.0:
                m_new = tl.maximum(m_i, m_blk)
                alpha = tl.exp2(m_i - m_new)
                l_i = l_i * alpha
                acc = acc * alpha[:, None]
                m_i = m_new
            p = tl.exp2(qk * qk_scale - m_i[:, None])
            m_new = m_i
        else:
            # the hot loop: the scale is folded into the exponent's FMA (scale > 0)
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk * qk_scale - m_new[:, None])
        if LAZY and not MASKED:
            l_i = l_i + tl.sum(p, 1)
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
        v = vd.load([start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fa_tma_start(q_ptr, k_ptr, v_ptr, s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn,
                  H, L, S, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr):
    """The TMA kernels' program: (batch, head, first query row) -- causal grids run the
    longest rows first -- its query rows, Q tile (loaded) and K/V tensor descriptors
    (zero-filled past L / S), and the online softmax state (acc, l_i, m_i) to start from."""
    b, h, hk, start_m = _fa_program(H, GROUP, BLOCK_M, CAUSAL)
    qd = tl.make_tensor_descriptor(q_ptr + b * s_qb + h * s_qh, shape=[L, BLOCK_D],
                                   strides=[s_qm, 1], block_shape=[BLOCK_M, BLOCK_D])
    kd = tl.make_tensor_descriptor(k_ptr + b * s_kb + hk * s_kh, shape=[S, BLOCK_D],
                                   strides=[s_kn, 1], block_shape=[BLOCK_N, BLOCK_D])
    vd = tl.make_tensor_descriptor(v_ptr + b * s_vb + hk * s_vh, shape=[S, BLOCK_D],
                                   strides=[s_vn, 1], block_shape=[BLOCK_N, BLOCK_D])
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = qd.load([start_m, 0])
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    return b, h, start_m, offs_m, q, kd, vd, acc, l_i, m_i


@triton.jit
def _fa_tma_store(o_ptr, o, b, h, s_ob, s_oh, s_om, L, start_m, BLOCK_M: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """The output tile through a descriptor (rows past L clipped)."""
    od = tl.make_tensor_descriptor(o_ptr + b * s_ob + h * s_oh, shape=[L, BLOCK_D],
                                   strides=[s_om, 1], block_shape=[BLOCK_M, BLOCK_D])
    od.store([start_m, 0], o.to(o_ptr.dtype.element_ty))


@triton.jit
def _flash_fwd_tma(q_ptr, k_ptr, v_ptr, o_ptr, s_qb, s_qh, s_qm, s_kb, s_kh, s_kn,
                   s_vb, s_vh, s_vn, s_ob, s_oh, s_om, H, L, S, qk_scale,
                   GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, LAZY: tl.constexpr,
                   PREC: tl.constexpr):
    """The no-mask fast path (fp16/bf16, head dim a power of two, unit head-dim stride,
    16-byte aligned rows): Q/K/V/O tiles move by TMA through per-(batch, head) tensor
    descriptors built on the device (Triton's global scratch holds them), which zero-fill
    rows past L / S and clip the store. Same loop split as `_flash_fwd`."""
    b, h, start_m, offs_m, q, kd, vd, acc, l_i, m_i = _fa_tma_start(
        q_ptr, k_ptr, v_ptr, s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, H, L, S,
        GROUP, BLOCK_M, BLOCK_N, BLOCK_D, CAUSAL)
    if CAUSAL:
        hi_off = tl.minimum(start_m, S)
        hi_diag = tl.minimum(start_m + BLOCK_M, S)
    else:
        hi_off = S
        hi_diag = S
    full = (hi_off // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _fa_tma_block(acc, l_i, m_i, q, kd, vd, offs_m, 0, full, S, qk_scale,
                                  BLOCK_N, False, CAUSAL, LAZY, PREC)
    acc, l_i, m_i = _fa_tma_block(acc, l_i, m_i, q, kd, vd, offs_m, full, hi_diag, S,
                                  qk_scale, BLOCK_N, True, CAUSAL, LAZY, PREC)
    l_i = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_i[:, None]
    _fa_tma_store(o_ptr, o, b, h, s_ob, s_oh, s_om, L, start_m, BLOCK_M, BLOCK_D)


@triton.jit
def _flash_fwd_ws(q_ptr, k_ptr, v_ptr, o_ptr, s_qb, s_qh, s_qm, s_kb, s_kh, s_kn,
                  s_vb, s_vh, s_vn, s_ob, s_oh, s_om, H, L, S, qk_scale,
                  GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, EVEN_S: tl.constexpr,
                  WS: tl.constexpr, PREC: tl.constexpr):
    """The no-mask fast path as ONE key loop that Triton 3.6's Hopper warp specialisation
    accepts (`tl.range(warp_specialize=True)` with num_warps=4: a TMA producer warpgroup
    and two consumer warpgroups of BLOCK_M/2 rows each, FA3's layout). The pass rejects a
    second loop after the specialised one and an `if` inside it, so the diagonal/tail
    blocks cannot be peeled: the key mask (causal and/or the S tail) is applied in every
    block, a select an element; with EVEN_S and not CAUSAL there is no mask at all.
    Same preconditions as `_flash_fwd_tma` (`_tma_ok`)."""
    b, h, start_m, offs_m, q, kd, vd, acc, l_i, m_i = _fa_tma_start(
        q_ptr, k_ptr, v_ptr, s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, H, L, S,
        GROUP, BLOCK_M, BLOCK_N, BLOCK_D, CAUSAL)
    if CAUSAL:
        hi = tl.minimum(start_m + BLOCK_M, S)
    else:
        hi = S
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
        k = kd.load([start_n, 0])                       # rows >= S read as 0
        qk = tl.dot(q, k.T, input_precision=PREC)
        if CAUSAL or not EVEN_S:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            if CAUSAL:
                # key j <= query i (and j < S: rows i >= S see all keys < S only)
                lim = tl.minimum(offs_m, S - 1)
                keep = offs_n[None, :] <= lim[:, None]
            else:
                keep = offs_n[None, :] < S
            # every row sees key 0 (S > 0), so m is finite after the first block; the
            # scale stays folded into the exponent's FMA (scale > 0: -inf stays -inf)
            qk = tl.where(keep, qk, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = vd.load([start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PREC)
        m_i = m_new
    o = acc / l_i[:, None]
    _fa_tma_store(o_ptr, o, b, h, s_ob, s_oh, s_om, L, start_m, BLOCK_M, BLOCK_D)


# ------------------------------------------------------------------ launch configuration
# Hopper, fp16/bf16: BLOCK_M=128, BLOCK_N=64 (32 for head dims > 128 to fit shared
# memory), 8 warps, 3 stages. fp32/fp64 tiles are smaller (twice/four times the bytes).
# BLOCK_M must be a multiple of BLOCK_N (the causal split relies on it).
# TMA / WS / LAZY: see TUNED at the top (the autotune space has TMA for 16-bit dtypes).
# 16-bit GPU inputs take TUNED's entry when there is one.


def flash_config(D, DV, dtype_size, interp=False, causal=False, tuned=True):
    bd = max(16, _np2(max(D, DV)))
    if interp:
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    if dtype_size >= 8:
        return dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)
    if dtype_size == 4:
        return dict(BLOCK_M=64, BLOCK_N=32 if bd <= 128 else 16, num_warps=4, num_stages=2)
    if tuned and (bd, bool(causal)) in TUNED:
        return dict(TUNED[(bd, bool(causal))])
    if bd <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
    if bd <= 128:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)


def _tma_ok(q, k, v, out, mask, scale, D, DV, S):
    """Whether the TMA kernel applies: TMA needs 16-byte aligned bases and row strides."""
    # 16-bit only: with float32 inputs the TMA kernel lost precision on the H200 (1e-3
    # relative, a tf32-like error) where the pointer kernel is exact; fp32 is not a fast path
    if mask is not None or not scale > 0 or D != DV or S == 0 or q.dtype.itemsize != 2:
        return False
    if D < 16 or D & (D - 1):
        return False
    isz = q.dtype.itemsize
    for t in (q, k, v, out):
        st = t.stride()
        if st[3] != 1 or t.data_ptr() % 16 or any((x * isz) % 16 for x in st[:3]):
            return False
    return True


_OVERRIDE: dict | None = None   # tests set e.g. {"BLOCK_M": 16, "BLOCK_N": 16}
# the hand-written Gluon kernel (kernels/attention_gluon.py, FA3's producer/consumer layout)
# for cuda, 16-bit, D == 128, causal self-attention (L == S, S % 128 == 0), no mask, TMA-able
# strides: 0.91x torch SDPA on the H200 where the Triton kernels reach 0.77x (Triton 3.6's
# automatic warp specialisation is wrong for causal loops: docs/design/attention.md). Everything
# else (and an _OVERRIDE) keeps the Triton kernels below. NBX_GLUON_ATTN=0 switches it off.
GLUON_CAUSAL = _config.get("NBX_GLUON_ATTN")


def _sdpa_config(q, k, v, out, mask, scale, is_causal):
    """(config, whether a TMA kernel runs it) for a flash-attention call: the rule's tile,
    an override or the autotuned entry over it, then the TMA/WS kernels only where their
    preconditions and verified settings hold."""
    B, H, L, D = q.shape
    Hk, S, DV = k.shape[1], k.shape[2], v.shape[3]
    # an override (tests, autotune, the sweep) applies on top of the untuned default
    cfg = flash_config(D, DV, q.dtype.itemsize, q.device.type == "interp", is_causal,
                       tuned=not _OVERRIDE)
    if _OVERRIDE:
        cfg.update(_OVERRIDE)
    elif B == 1 and mask is None and L == S and D == DV:
        # autotune seam: the sweep's shape (one sequence, self-attention, no mask), keyed by
        # head dim, causal flag and dtype; a screened entry inside today's space, else the
        # default above. An entry is a whole config of the space and replaces the rule's
        # (laid over it, a pointer-kernel entry would inherit TUNED's WS=True and run as
        # -- or, on cuda, be refused back to the untuned default from -- the WS kernel)
        tuned = _autotune.pick("attention", (L, H, Hk, D, int(bool(is_causal))), {},
                               dtype=q.dtype.name, device=q.device)
        if tuned:
            cfg = tuned
    tma = bool(cfg.get("TMA") or cfg.get("WS"))
    if tma and not _tma_ok(q, k, v, out, mask, scale, D, DV, S):
        tma = False
        if not _OVERRIDE:
            # a TMA/WS tile (strides, alignment, a mask do not suit) is not a tuned
            # pointer-kernel tile: TUNED's entry if it is a pointer one, else the untuned one
            for tuned in (True, False):
                cfg = flash_config(D, DV, q.dtype.itemsize, q.device.type == "interp",
                                   is_causal, tuned=tuned)
                if not (cfg.get("TMA") or cfg.get("WS")):
                    break
    # (the interpreter runs the loop's plain semantics, which are right: cuda only)
    if tma and cfg.get("WS") and cfg["WS"] != "off" and q.device.type == "cuda" and (is_causal or (
            D, cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"])
            not in WS_VERIFIED):
        if _OVERRIDE:     # a test or sweep asked for it: refuse rather than compute garbage
            raise ValueError(f"sdpa: the warp-specialised kernel is only run non-causal with "
                             f"(D, BLOCK_M, BLOCK_N, num_warps, num_stages) in {WS_VERIFIED} "
                             f"(other settings computed wrong results with Triton 3.6); got "
                             f"D={D}, causal={bool(is_causal)}, {cfg}")
        tma = False       # the tuned table never asks for it; the pointer kernel then
        cfg = flash_config(D, DV, q.dtype.itemsize, q.device.type == "interp", is_causal,
                           tuned=False)
    return cfg, tma


@register("sdpa", "triton")
def sdpa(out, q, k, v, mask, *, scale, is_causal):
    from .. import dtypes as _dt
    from ..backends.launch import launch
    B, H, L, D = q.shape
    Hk, S, DV = k.shape[1], k.shape[2], v.shape[3]
    if GLUON_CAUSAL and is_causal and not _OVERRIDE and q.device.type == "cuda":
        from . import attention_gluon as _ag
        if _ag.applies(q, k, v, out, mask, scale, is_causal, L, S, D, DV):
            return _ag.sdpa_gluon(out, q, k, v, scale * LOG2E, causal=True)
    cfg, tma = _sdpa_config(q, k, v, out, mask, scale, is_causal)
    if tma and cfg.get("WS"):
        grid = (_cdiv(L, cfg["BLOCK_M"]), B * H)
        launch(_flash_fwd_ws, grid, q, k, v, out, *q.stride()[:3], *k.stride()[:3],
               *v.stride()[:3], *out.stride()[:3], H, L, S, scale * LOG2E,
               GROUP=H // Hk, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=D,
               CAUSAL=is_causal, EVEN_S=S % cfg["BLOCK_N"] == 0, WS=cfg["WS"] != "off",
               PREC="ieee" if q.dtype.itemsize >= 4 else "tf32", num_warps=cfg["num_warps"],
               num_stages=cfg["num_stages"])
        return out
    if tma:
        if cfg["BLOCK_M"] % cfg["BLOCK_N"]:
            raise ValueError(f"sdpa: BLOCK_M ({cfg['BLOCK_M']}) must be a multiple of "
                             f"BLOCK_N ({cfg['BLOCK_N']})")
        grid = (_cdiv(L, cfg["BLOCK_M"]), B * H)
        launch(_flash_fwd_tma, grid, q, k, v, out, *q.stride()[:3], *k.stride()[:3],
               *v.stride()[:3], *out.stride()[:3], H, L, S, scale * LOG2E,
               GROUP=H // Hk, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=D,
               CAUSAL=is_causal, LAZY=bool(cfg.get("LAZY")),
               PREC="ieee" if q.dtype.itemsize >= 4 else "tf32", num_warps=cfg["num_warps"],
               num_stages=cfg["num_stages"])
        return out
    if cfg["BLOCK_M"] % cfg["BLOCK_N"]:
        raise ValueError(f"sdpa: BLOCK_M ({cfg['BLOCK_M']}) must be a multiple of BLOCK_N "
                         f"({cfg['BLOCK_N']})")
    bd = max(16, _np2(D))
    bdv = max(16, _np2(DV))
    f64 = q.dtype is _dt.float64
    if mask is None:
        kind, mk, ms = 0, q, (0, 0, 0, 0)
    else:
        kind, mk, ms = (1 if mask.dtype is _dt.bool else 2), mask, mask.stride()
    grid = (_cdiv(L, cfg["BLOCK_M"]), B * H)
    launch(_flash_fwd, grid, q, k, v, out, mk, *q.stride(), *k.stride(), *v.stride(),
           *out.stride(), *ms, H, L, S, D, DV,
           _f64_bits(scale * LOG2E) if f64 else scale * LOG2E,
           GROUP=H // Hk, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=bd,
           BLOCK_DV=bdv, CAUSAL=is_causal, MASK_KIND=kind, EVEN_D=bd == D, EVEN_DV=bdv == DV,
           PREC="ieee" if q.dtype.itemsize >= 4 else "tf32", F64=f64, SCALE_POS=scale > 0,
           num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out
