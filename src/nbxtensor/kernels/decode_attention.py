"""Flash-decoding on cuda/interp: a few query tokens against a KV cache, split over the keys.

One kernel, grid (P, B * Hk). Program (s, b, g) reads the cache length of batch b from the
device, takes the s-th of the key ranges (each a multiple of BLOCK_N, at most P of them)
and runs the online softmax for ALL query rows of kv head g (GROUP query heads x T tokens)
at once, so each K/V tile is read once per group. The number of ranges that are busy
adapts to the length on the device: n_act = cdiv(length, per) with per =
BLOCK_N * cdiv(cdiv(length, P), BLOCK_N); programs past n_act exit at once.

* n_act == 1 (short caches): the one busy program normalises and writes the output.
* otherwise each busy program writes its unnormalised partial (acc, max, sum) to a
  workspace and, with COMBINE=1, takes a ticket from a per-(b, g) device counter; the
  program that draws the last ticket merges the n_act partials and resets the counter to
  0 (so the next launch and a replayed CUDA graph start from 0). COMBINE=0 leaves the
  merge to a second kernel (`_decode_combine`, grid (B * Hk,)) with the same code; it is a
  tuning alternative (no counter).

The grid depends only on shapes (P from the batch, kv heads and capacity), never on the
length, so the same launch is valid at every step (CUDA-graph capture). Query token t of T
attends keys j <= length - T + t (bottom-right causal), j < length.

Two inner loops, one kernel: `_dot_loop` (default; tl.dot on tensor cores, K/V staged
through shared memory) and `_reg_loop` (REG=1; two GEMVs on CUDA cores from registers,
selected by VARIANT = "reg" where `reg_applies`, see REG_TUNED). Knobs of both loops
(override / config keys): MIN_N, the fewest keys a busy split takes (short caches merge
fewer partials); MERGE_STAGES > 1, the merge's chunk loop software-pipelined (cp.async).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .. import autotune as _autotune
from ..dispatch import register
from ._host import cdiv as _cdiv, next_pow2 as _np2
from ._pdl import _pdl_wait, pdl_opts



LOG2E = 1.4426950408889634


@triton.jit
def _ranges(len_ptr, b, s_len, P, BLOCK_N: tl.constexpr, MIN_BLOCKS: tl.constexpr = 1):
    """The cache length, the keys per range (>= MIN_BLOCKS tiles: short caches use fewer
    ranges, so fewer partials to merge) and the number of busy ranges (>= 1)."""
    length = tl.load(len_ptr + b * s_len).to(tl.int32)
    per = tl.maximum(tl.cdiv(tl.cdiv(length, P), BLOCK_N), MIN_BLOCKS) * BLOCK_N
    n_act = tl.maximum(tl.cdiv(length, per), 1)
    return length, per, n_act


@triton.jit
def _merge_chunk(po_ptr, pml_ptr, c, base, rows, rmask, offs_c, offs_dv, mx, n_act, R, DV,
                 acc, denom):
    """Partials c .. c + CHUNK_P - 1 of every row, weighted by 2^(m - max), into acc/denom."""
    pc = c + offs_c
    cidx = base + pc[None, :] * R + rows[:, None]                      # [BLOCK_R, CHUNK_P]
    cm = rmask[:, None] & (pc[None, :] < n_act)
    mc = tl.load(pml_ptr + cidx * 2, mask=cm, other=-float("inf"), cache_modifier=".cg")
    lc = tl.load(pml_ptr + cidx * 2 + 1, mask=cm, other=0.0, cache_modifier=".cg")
    w = tl.where(lc > 0, tl.exp2(mc - mx[:, None]), 0.0)
    denom += tl.sum(lc * w, 1)
    po = tl.load(po_ptr + cidx[:, :, None] * DV + offs_dv[None, None, :],
                 mask=cm[:, :, None] & (offs_dv[None, None, :] < DV), other=0.0,
                 cache_modifier=".cg")
    acc += tl.sum(po * w[:, :, None], 1)
    return acc, denom


@triton.jit
def _merge(po_ptr, pml_ptr, o_ptr, pid_bg, n_act, P, R, T, GROUP_HQ, DV,
           b64, head0, s_ob, s_oh, s_ot, s_od,
           BLOCK_R: tl.constexpr, CHUNK_P: tl.constexpr, BLOCK_P: tl.constexpr,
           BLOCK_DV: tl.constexpr, MERGE_STAGES: tl.constexpr = 1):
    """Merge the n_act partials of the R rows of one (b, kv head) into the output.
    Partial (split s, row r) lives at index (pid_bg * P + s) * R + r."""
    rows = tl.arange(0, BLOCK_R)
    rmask = rows < R
    head = head0 + rows // T
    t = rows % T
    offs_p = tl.arange(0, BLOCK_P)
    base = pid_bg.to(tl.int64) * P * R
    # the row maxima over all partials first (a [BLOCK_R, BLOCK_P] tile, cheap), then the
    # (split, row, dv) partials in [BLOCK_R, CHUNK_P, BLOCK_DV] chunks: independent loads
    idx = base + offs_p[None, :] * R + rows[:, None]
    pm = rmask[:, None] & (offs_p[None, :] < n_act)
    m = tl.load(pml_ptr + idx * 2, mask=pm, other=-float("inf"), cache_modifier=".cg")
    mx = tl.max(m, 1)
    mx = tl.where(mx == -float("inf"), 0.0, mx)
    offs_c = tl.arange(0, CHUNK_P)
    offs_dv = tl.arange(0, BLOCK_DV)
    acc = tl.zeros((BLOCK_R, BLOCK_DV), tl.float32)
    denom = tl.zeros((BLOCK_R,), tl.float32)
    if MERGE_STAGES > 1:
        # software-pipelined (cp.async, issued after the ticket's acquire): the chunks'
        # L2 latencies overlap instead of adding up in the merge tail
        for c in tl.range(0, n_act, CHUNK_P, num_stages=MERGE_STAGES):
            acc, denom = _merge_chunk(po_ptr, pml_ptr, c, base, rows, rmask, offs_c, offs_dv,
                                      mx, n_act, R, DV, acc, denom)
    else:
        for c in range(0, n_act, CHUNK_P):
            acc, denom = _merge_chunk(po_ptr, pml_ptr, c, base, rows, rmask, offs_c, offs_dv,
                                      mx, n_act, R, DV, acc, denom)
    o = acc / tl.where(denom == 0.0, 1.0, denom)[:, None]
    tl.store(o_ptr + b64 * s_ob + head[:, None] * s_oh + t[:, None] * s_ot
             + offs_dv[None, :] * s_od, o.to(o_ptr.dtype.element_ty),
             mask=rmask[:, None] & (offs_dv[None, :] < DV))



@triton.jit
def _dot_loop(q, kt_ptr, v_ptr2, start, end, limit, s_kn, s_vn, D, DV, qk_scale,
              offs_d, offs_dv, offs_n0, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_DV: tl.constexpr, PREC: tl.constexpr):
    """The tensor-core loop (default): q [BLOCK_H >= 16 rows] @ K^T and P @ V with tl.dot;
    the pipeliner stages K/V through shared memory (cp.async -> ldmatrix)."""
    acc = tl.zeros((BLOCK_H, BLOCK_DV), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    m_i = tl.full((BLOCK_H,), -float("inf"), tl.float32)
    for n in range(start, end, BLOCK_N):
        offs_n = n + offs_n0
        nmask = offs_n < end
        kt = tl.load(kt_ptr, mask=nmask[None, :] & (offs_d[:, None] < D), other=0.0)
        v = tl.load(v_ptr2, mask=nmask[:, None] & (offs_dv[None, :] < DV), other=0.0)
        qk = tl.dot(q, kt, input_precision=PREC) * qk_scale
        qk = tl.where(nmask[None, :] & (offs_n[None, :] <= limit[:, None]), qk,
                      -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(qk - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
        kt_ptr += BLOCK_N * s_kn
        v_ptr2 += BLOCK_N * s_vn
    return acc, l_i, m_i


@triton.jit
def _reg_loop(q, k_ptr, v_ptr, b64, g, start, end, limit,
              s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd, D, DV, qk_scale,
              BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_DV: tl.constexpr, KPT: tl.constexpr, W: tl.constexpr):
    """The register loop (REG=1): two GEMVs on CUDA cores, no shared memory, no tl.dot.

    A tile of BLOCK_N keys is loaded as [1, NS, KPT, DC, W] (NS = BLOCK_N // KPT key
    slots, element [0, j, i, c, w] = key n + i * NS + j, dim c * W + w; DC = D // W). The
    load's coalesced layout anchors all the math: 16 bytes a thread along W (so W / 8
    lanes per key for 16-bit data), the other lanes and the warps along NS, and KPT and DC
    inside each thread (Triton 3.6 hands lanes to equally non-contiguous dims in index
    order; checked in the TTGIR). So the score sum over D is in-thread plus log2(W / 8)
    shuffles, each slot runs its OWN online softmax over its keys (state [rows, NS], acc
    [rows, NS, D]) rescaled once per KPT keys, and the loop has no reduction across warps;
    the slots are folded once after it. The next tile's loads are issued before this
    tile's math (a register double buffer; run with num_stages=1)."""
    NS: tl.constexpr = BLOCK_N // KPT
    DC: tl.constexpr = BLOCK_D // W
    WV: tl.constexpr = W if W < BLOCK_DV else BLOCK_DV
    DVC: tl.constexpr = BLOCK_DV // WV
    offs_i = tl.arange(0, KPT)
    offs_j = tl.arange(0, NS)
    key = offs_i[None, :] * NS + offs_j[:, None]                   # [NS, KPT]
    key5 = key[None, :, :, None, None]
    dk = tl.arange(0, DC)[:, None] * W + tl.arange(0, W)[None, :]   # [DC, W]
    dk5 = dk[None, None, None, :, :]
    dv = tl.arange(0, DVC)[:, None] * WV + tl.arange(0, WV)[None, :]
    dv5 = dv[None, None, None, :, :]
    g64 = g.to(tl.int64)
    kp = (k_ptr + b64 * s_kb + g64 * s_kh + start.to(tl.int64) * s_kn
          + key5 * s_kn + dk5 * s_kd)
    vp = (v_ptr + b64 * s_vb + g64 * s_vh + start.to(tl.int64) * s_vn
          + key5 * s_vn + dv5 * s_vd)
    dmask = dk5 < D
    dvmask = dv5 < DV
    qf = tl.reshape(q.to(tl.float32) * qk_scale, (BLOCK_H, DC, W))  # scale folded in
    qf = qf[:, None, None, :, :]                                   # [H, 1, 1, DC, W]
    acc = tl.zeros((BLOCK_H, NS, DVC, WV), tl.float32)
    l2 = tl.zeros((BLOCK_H, NS), tl.float32)
    m2 = tl.full((BLOCK_H, NS), -float("inf"), tl.float32)
    nm = (start + key5) < end
    k = tl.load(kp, mask=nm & dmask, other=0.0)
    v = tl.load(vp, mask=nm & dvmask, other=0.0)
    for n in range(start, end, BLOCK_N):
        # prefetch tile n + BLOCK_N (masked off past the range) before using tile n
        kp += BLOCK_N * s_kn
        vp += BLOCK_N * s_vn
        nm = (n + BLOCK_N + key5) < end
        k_next = tl.load(kp, mask=nm & dmask, other=0.0)
        v_next = tl.load(vp, mask=nm & dvmask, other=0.0)
        kn = (n + key)[None, :, :]                                  # [1, NS, KPT]
        sc = tl.sum(tl.sum(qf * k.to(tl.float32), 4), 3)            # [H, NS, KPT]
        sc = tl.where((kn < end) & (kn <= limit[:, None, None]), sc, -float("inf"))
        m_new = tl.maximum(m2, tl.max(sc, 2))
        m_use = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(m2 - m_use)
        p = tl.exp2(sc - m_use[:, :, None])
        l2 = l2 * alpha + tl.sum(p, 2)
        acc = (acc * alpha[:, :, None, None]
               + tl.sum(p[:, :, :, None, None] * v.to(tl.float32), 2))
        m2 = m_new
        k = k_next
        v = v_next
    # fold the key slots: the same merge as across splits
    m_i = tl.max(m2, 1)
    m_use = tl.where(m_i == -float("inf"), 0.0, m_i)
    w = tl.exp2(m2 - m_use[:, None])
    l_i = tl.sum(l2 * w, 1)
    acc_o = tl.reshape(tl.sum(acc * w[:, :, None, None], 1), (BLOCK_H, BLOCK_DV))
    return acc_o, l_i, m_i


@triton.jit
def _decode_split(q_ptr, k_ptr, v_ptr, len_ptr, o_ptr, po_ptr, pml_ptr, cnt_ptr,
                  s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                  s_ob, s_oh, s_ot, s_od, s_len,
                  Hk, T, D, DV, P, qk_scale,
                  GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                  PREC: tl.constexpr, COMBINE: tl.constexpr, CHUNK_P: tl.constexpr,
                  BLOCK_P: tl.constexpr, PDL: tl.constexpr, REG: tl.constexpr = 0,
                  KPT: tl.constexpr = 1, W: tl.constexpr = 128,
                  MIN_BLOCKS: tl.constexpr = 1, MERGE_STAGES: tl.constexpr = 1):
    # PDL: q, the cache rows and the length are all written by the kernels before this one
    _pdl_wait(PDL)
    pid_s = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = pid_bg // Hk
    g = pid_bg % Hk
    R = GROUP * T
    rows = tl.arange(0, BLOCK_H)
    rmask = rows < R
    head = g * GROUP + rows // T
    t = rows % T
    offs_d = tl.arange(0, BLOCK_D)
    # q does not depend on the length: its load overlaps the length's
    q = tl.load(q_ptr + b.to(tl.int64) * s_qb + head[:, None] * s_qh + t[:, None] * s_qt
                + offs_d[None, :] * s_qd, mask=rmask[:, None] & (offs_d[None, :] < D), other=0.0)
    length, per, n_act = _ranges(len_ptr, b, s_len, P, BLOCK_N, MIN_BLOCKS)
    if pid_s < n_act:
        start = pid_s * per
        end = tl.minimum(start + per, length)
        offs_dv = tl.arange(0, BLOCK_DV)
        offs_n0 = tl.arange(0, BLOCK_N)
        b64 = b.to(tl.int64)
        limit = length - T + t                     # last key each row may see
        # pointers advance by BLOCK_N rows per step (no per-step 64-bit index math)
        kt_ptr = (k_ptr + b64 * s_kb + g.to(tl.int64) * s_kh + start.to(tl.int64) * s_kn
                  + offs_d[:, None] * s_kd + offs_n0[None, :] * s_kn)
        v_ptr2 = (v_ptr + b64 * s_vb + g.to(tl.int64) * s_vh + start.to(tl.int64) * s_vn
                  + offs_n0[:, None] * s_vn + offs_dv[None, :] * s_vd)
        if REG:
            acc, l_i, m_i = _reg_loop(q, k_ptr, v_ptr, b64, g, start, end, limit,
                                      s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                                      D, DV, qk_scale, BLOCK_H, BLOCK_N, BLOCK_D, BLOCK_DV,
                                      KPT, W)
        else:
            acc, l_i, m_i = _dot_loop(q, kt_ptr, v_ptr2, start, end, limit, s_kn, s_vn,
                                      D, DV, qk_scale, offs_d, offs_dv, offs_n0,
                                      BLOCK_H, BLOCK_N, BLOCK_DV, PREC)
        if n_act == 1:
            o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            tl.store(o_ptr + b64 * s_ob + head[:, None] * s_oh + t[:, None] * s_ot
                     + offs_dv[None, :] * s_od, o.to(o_ptr.dtype.element_ty),
                     mask=rmask[:, None] & (offs_dv[None, :] < DV))
        else:
            prow = (pid_bg.to(tl.int64) * P + pid_s) * R + rows
            tl.store(po_ptr + prow[:, None] * DV + offs_dv[None, :], acc,
                     mask=rmask[:, None] & (offs_dv[None, :] < DV))
            tl.store(pml_ptr + prow * 2, m_i, mask=rmask)
            tl.store(pml_ptr + prow * 2 + 1, l_i, mask=rmask)
            if COMBINE:
                # every thread's stores are issued before the (acq_rel, gpu scope) ticket
                tl.debug_barrier()
                ticket = tl.atomic_add(cnt_ptr + pid_bg, 1, sem="acq_rel")
                if ticket == n_act - 1:
                    tl.store(cnt_ptr + pid_bg, 0)        # ready for the next launch
                    _merge(po_ptr, pml_ptr, o_ptr, pid_bg, n_act, P, R, T, GROUP, DV,
                           b64, g * GROUP, s_ob, s_oh, s_ot, s_od,
                           BLOCK_R, CHUNK_P, BLOCK_P, BLOCK_DV, MERGE_STAGES)


@triton.jit
def _decode_combine(po_ptr, pml_ptr, o_ptr, len_ptr, s_ob, s_oh, s_ot, s_od, s_len,
                    Hk, T, DV, P, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_R: tl.constexpr, CHUNK_P: tl.constexpr, BLOCK_P: tl.constexpr,
                    BLOCK_DV: tl.constexpr, PDL: tl.constexpr,
                    MIN_BLOCKS: tl.constexpr = 1, MERGE_STAGES: tl.constexpr = 1):
    _pdl_wait(PDL)
    pid_bg = tl.program_id(0)
    b = pid_bg // Hk
    g = pid_bg % Hk
    length, per, n_act = _ranges(len_ptr, b, s_len, P, BLOCK_N, MIN_BLOCKS)
    if n_act > 1:      # otherwise the split kernel wrote the output
        _merge(po_ptr, pml_ptr, o_ptr, pid_bg, n_act, P, GROUP * T, T, GROUP, DV,
               b.to(tl.int64), g * GROUP, s_ob, s_oh, s_ot, s_od,
               BLOCK_R, CHUNK_P, BLOCK_P, BLOCK_DV, MERGE_STAGES)


# ------------------------------------------------------------------ launch configuration
# P (the most splits per (batch, kv head)) makes ~4 programs per SM of an H200 (132 SMs)
# and never more splits than BLOCK_N-key blocks of the capacity; at run time only
# cdiv(length, per) of them work. BLOCK_N=64, 4 warps, 2 stages: about 39 KB of shared
# memory (bf16, D=128), so all 528 programs are resident in one wave.
# The merge reads [BLOCK_R, CHUNK_P, BLOCK_DV] fp32 tiles: CHUNK_P * BLOCK_R <= 32 keeps
# that at <= 32 registers a thread with 4 warps (64 spilled a little next to the main loop).
MAX_SPLITS = 256
# 16-bit caches on the GPU; `benchmarks/bench_attention.py --sweep` prints a replacement
# measured on the H200 (bench_attention.py --sweep, 2026-11-29): best at 1k and within 1% at 32k
TUNED = dict(TARGET=396, BLOCK_N=64, num_warps=4, num_stages=3, COMBINE=1)


# The register variant (REG=1, `_reg_loop`): selected by VARIANT = "reg" (default "dot"
# until the H200 says otherwise) or by an override with REG=1. It applies when the
# per-slot accumulator fits registers: reg_applies(R, BLOCK_DV) (rows x DV <= 1024, e.g. up
# to 8 query rows per kv head at D=128); otherwise the dot loop runs (the documented rule).
VARIANT = "dot"
# BLOCK_N keys a tile = KPT keys a slot x NS slots; W elements of D a lane group (W / 8
# lanes a key for 16-bit data). sm_90 compile facts (bf16, D128, 4 rows, 4 warps): W128
# KPT2 N16 128 regs, 387 SASS in the loop (97 a key); W128 KPT4 N32 168 regs (91 a key);
# W64 KPT2 N32 255 regs (83 a key); no spills.
REG_TUNED = dict(TARGET=528, BLOCK_N=16, num_warps=4, num_stages=1, KPT=2, W=128, MIN_N=64)
REG_MAX_RDV = 1024


def reg_applies(R, bdv):
    """Whether the register loop handles R query rows per kv head with DV padded to bdv."""
    return _np2(R) * bdv <= REG_MAX_RDV


def decode_config(B, Hk, C, bd=128, bdv=128, itemsize=2, interp=False, R=None):
    target, nw, combine = TUNED["TARGET"], TUNED["num_warps"], TUNED["COMBINE"]
    if VARIANT == "reg" and R is not None and reg_applies(R, bdv):
        kpt, nw, w = REG_TUNED["KPT"], REG_TUNED["num_warps"], min(REG_TUNED["W"], bd)
        # one key slot per lane group of 16 bytes x lanes: BLOCK_N = KPT x the slots the
        # layout has (REG_TUNED's BLOCK_N is that for bf16 D128; other shapes derive it)
        lanes = min(32, max(1, w * itemsize // 16))
        bn = kpt * (32 // lanes) * nw
        return dict(P=splits(B * Hk, C, REG_TUNED["TARGET"], bn), BLOCK_N=bn,
                    num_warps=nw, num_stages=REG_TUNED["num_stages"],
                    COMBINE=combine, REG=1, KPT=kpt, W=w, MIN_N=REG_TUNED["MIN_N"])
    if interp:
        bn, stages = 16, 1
    elif itemsize == 2:
        bn, stages = TUNED["BLOCK_N"], TUNED["num_stages"]
    else:
        bn, stages = 64, 2
    # K and V tiles of every stage must fit shared memory (fp32, D=256: BLOCK_N 16)
    while bn > 16 and bn * (bd + bdv) * itemsize * stages > 150_000:
        bn //= 2
    return dict(P=splits(B * Hk, C, target, bn), BLOCK_N=bn, num_warps=nw, num_stages=stages,
                COMBINE=combine)


def splits(BHk, C, target, bn):
    """P for `target` programs over BHk (batch x kv head) rows and capacity C: the rule's."""
    return max(1, min(MAX_SPLITS, _cdiv(target, BHk), _cdiv(C, bn)))


def _tuned(cfg, BHk, C, R, D, q):
    # autotune seam: a screened (TARGET, BLOCK_N, warps, stages, COMBINE) for the key
    # (B*Hk, C, R, D) inside today's space, else the rule; P re-derived from TARGET, BLOCK_N
    d = dict(TARGET=TUNED["TARGET"], BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"],
             num_stages=cfg["num_stages"], COMBINE=cfg["COMBINE"])
    t = _autotune.pick("decode_attention", (BHk, C, R, D), d, dtype=q.dtype.name,
                       device=q.device)
    if t == d:
        return cfg
    return dict(t, P=splits(BHk, C, t["TARGET"], t["BLOCK_N"]))


_OVERRIDE: dict | None = None   # tests: {"P": 3, "BLOCK_N": 16}; also COMBINE 0/1, CHUNK_P
_COUNTERS: dict = {}    # (kind, device) -> int32 zeros: ticket counters ((b, kv head) / row)
_RETIRED: list = []     # buffers a larger request replaced: kept alive, never freed


def _counters(n, device, kind="attention"):
    """A zeroed int32 device buffer of >= n ticket counters, one per (kind, device); every
    kernel that takes tickets leaves them at 0 when it finishes (kinds: "attention" here,
    "argmax" in sampling.argmax_commit). The first call allocates: make one eager call before
    a CUDA-graph capture. A buffer replaced by a larger one stays allocated: a graph
    captured with it still uses it (freed, the allocator would hand it to other tensors)."""
    from .. import dtypes as _dt
    from ..creation import zeros
    key = (kind, str(device))
    buf = _COUNTERS.get(key)
    if buf is None or buf.shape[0] < n:
        if buf is not None:
            _RETIRED.append(buf)
        buf = _COUNTERS[key] = zeros(max(n, 64), dtype=_dt.int32, device=device)
    return buf


@register("decode_attention", "triton")
def decode_attention(out, q, kc, vc, lengths, *, scale):
    from .. import dtypes as _dt
    from ..backends.launch import launch
    from ..tensor import Tensor
    if q.dtype is _dt.float64:
        raise NotImplementedError("decode_attention: float64 is supported on cpu only")
    B, Hq, T, D = q.shape
    Hk, C, DV = kc.shape[1], kc.shape[2], vc.shape[3]
    group = Hq // Hk
    R = group * T
    br = _np2(R)
    bh = max(16, br)
    bd = max(16, _np2(D))
    bdv = max(16, _np2(DV))
    cfg = decode_config(B, Hk, C, bd, bdv, q.dtype.itemsize, q.device.type == "interp", R)
    if _OVERRIDE:
        cfg.update(_OVERRIDE)
    elif not cfg.get("REG"):
        cfg = _tuned(cfg, B * Hk, C, R, D, q)
    reg = int(cfg.get("REG", 0))
    if reg and not reg_applies(R, bdv):
        raise ValueError(f"decode_attention: REG=1 needs pow2(rows) x pow2(DV) <= "
                         f"{REG_MAX_RDV}, got rows {R} (GROUP {group} x T {T}), DV {DV}")
    kpt, w = int(cfg.get("KPT", 1)), min(int(cfg.get("W", 128)), bd)
    if reg:
        bh = br       # CUDA-core math: no padding of the rows to the MMA's 16
        if cfg["BLOCK_N"] % kpt or w & (w - 1):
            raise ValueError(f"decode_attention: REG=1 needs KPT dividing BLOCK_N and W a "
                             f"power of two, got BLOCK_N {cfg['BLOCK_N']}, KPT {kpt}, W {w}")
    P, combine = cfg["P"], int(cfg["COMBINE"])
    # MIN_N: the fewest keys a busy split takes (short caches: fewer partials to merge)
    minb = max(1, _cdiv(int(cfg.get("MIN_N", 0)), cfg["BLOCK_N"]))
    # MERGE_STAGES > 1: the merge loop is software-pipelined (sweep knob; 1 = plain loop)
    ms = int(cfg.get("MERGE_STAGES", 1))
    bp = max(2, _np2(P))
    chunk = cfg.get("CHUNK_P") or max(1, min(bp, 32 // br))
    # workspace: size known on the host (P from shapes), so capture-safe
    po = Tensor._empty((B * Hq * T * P * DV,), _dt.float32, q.device)
    pml = Tensor._empty((B * Hq * T * P * 2,), _dt.float32, q.device)
    cnt = _counters(B * Hk, q.device) if combine else pml
    s_len = 0 if lengths.ndim == 0 else lengths.stride(0)
    pdl = pdl_opts(q.device)
    launch(_decode_split, (P, B * Hk), q, kc, vc, lengths, out, po, pml, cnt,
           *q.stride(), *kc.stride(), *vc.stride(), *out.stride(), s_len, Hk, T, D, DV, P,
           scale * LOG2E,
           GROUP=group, BLOCK_H=bh, BLOCK_R=br, BLOCK_N=cfg["BLOCK_N"], BLOCK_D=bd,
           BLOCK_DV=bdv, PREC="ieee" if q.dtype.itemsize >= 4 else "tf32", COMBINE=combine,
           CHUNK_P=chunk, BLOCK_P=bp, REG=reg, KPT=kpt, W=w, MIN_BLOCKS=minb, MERGE_STAGES=ms,
           num_warps=cfg["num_warps"],
           num_stages=cfg["num_stages"], **pdl)
    if not combine:
        launch(_decode_combine, (B * Hk,), po, pml, out, lengths, *out.stride(), s_len,
               Hk, T, DV, P, GROUP=group, BLOCK_N=cfg["BLOCK_N"], MIN_BLOCKS=minb,
               MERGE_STAGES=ms,
               BLOCK_R=br, CHUNK_P=chunk,
               BLOCK_P=bp, BLOCK_DV=bdv, num_warps=4, **pdl)
    return out
