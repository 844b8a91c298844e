"""Flash-decoding on cuda/interp: a few query tokens against a KV cache, split over the keys.

One kernel, grid (P, B * Hk). Program (s, b, g) reads the cache length of batch b from the
device, takes the s-th of the key ranges (each a multiple of BLOCK_N, at most P of them)
and runs the online softmax for ALL query rows of kv head g (GROUP query heads x T tokens)
at once, so each K/V tile is read once per group. The number of ranges that are busy
adapts to the length on the device: n_act = cdiv(length, per) with per =
BLOCK_N * cdiv(cdiv(length, P), BLOCK_N), or one range (per >= length) while length <=
ONE_MAX; programs past n_act exit at once.

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

A length outside [0, capacity] is clamped to it before any key is read (nothing past the
cache is touched, even while its error is pending) and recorded in the index-error flag of
kernels/indexing.py, which raises IndexError as for an out-of-range index: at the op on
interp and in 'sync' mode, at the next synchronising call on cuda. The check is a scalar
compare on the good path; inside a CUDA-graph capture the flag is read after replays.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import autotune as _autotune
from ..dispatch import register
from ._common import device_facts
from ._host import cdiv as _cdiv, next_pow2 as _np2
from ._pdl import _pdl_wait, pdl_opts
from .indexing import _after, _flag, _flag_bad_lanes, _tag



LOG2E = 1.4426950408889634


@triton.jit
def _ranges(len_ptr, b, s_len, C, P, one_max, BLOCK_N: tl.constexpr):
    """The stored length, the cache length (the stored one clamped to [0, C]), the keys per
    range (a multiple of BLOCK_N) and the number of busy ranges (>= 1): one range for
    lengths up to one_max, else up to P."""
    raw = tl.load(len_ptr + b * s_len)
    length = tl.minimum(tl.maximum(raw, 0), C).to(tl.int32)
    per = tl.maximum(tl.cdiv(tl.cdiv(length, tl.where(length <= one_max, 1, P)), BLOCK_N),
                     1) * BLOCK_N
    n_act = tl.maximum(tl.cdiv(length, per), 1)
    return raw, length, per, n_act


@triton.jit
def _softmax_step(qk, v, acc, l_i, m_i, PREC: tl.constexpr):
    """One key tile of the online softmax from its masked scores qk (log2 units, -inf where
    masked): the running max, sum and output rescaled (a row with no key yet stays 0)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_use = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(qk - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return acc, l_i, m_new


@triton.jit
def _merge(po_ptr, pml_ptr, o_ptr, pid_bg, n_act, P, R, T, GROUP_HQ, DV,
           b64, head0, s_ob, s_oh, s_ot, s_od,
           BLOCK_R: tl.constexpr, CHUNK_P: tl.constexpr, BLOCK_P: tl.constexpr,
           BLOCK_DV: tl.constexpr):
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
    for c in range(0, n_act, CHUNK_P):
        pc = c + offs_c
        cidx = base + pc[None, :] * R + rows[:, None]                  # [BLOCK_R, CHUNK_P]
        cm = rmask[:, None] & (pc[None, :] < n_act)
        mc = tl.load(pml_ptr + cidx * 2, mask=cm, other=-float("inf"), cache_modifier=".cg")
        lc = tl.load(pml_ptr + cidx * 2 + 1, mask=cm, other=0.0, cache_modifier=".cg")
        w = tl.where(lc > 0, tl.exp2(mc - mx[:, None]), 0.0)
        denom += tl.sum(lc * w, 1)
        po = tl.load(po_ptr + cidx[:, :, None] * DV + offs_dv[None, None, :],
                     mask=cm[:, :, None] & (offs_dv[None, None, :] < DV), other=0.0,
                     cache_modifier=".cg")
        acc += tl.sum(po * w[:, :, None], 1)
    o = acc / tl.where(denom == 0.0, 1.0, denom)[:, None]
    tl.store(o_ptr + b64 * s_ob + head[:, None] * s_oh + t[:, None] * s_ot
             + offs_dv[None, :] * s_od, o.to(o_ptr.dtype.element_ty),
             mask=rmask[:, None] & (offs_dv[None, :] < DV))


@triton.jit
def _range_out(acc, l_i, m_i, n_act, o_ptr, po_ptr, pml_ptr, cnt_ptr, pid_bg, pid_s, P, R,
               T, GROUP: tl.constexpr, DV, b64, g, head, t, rows, rmask, offs_dv,
               s_ob, s_oh, s_ot, s_od, COMBINE: tl.constexpr, BLOCK_R: tl.constexpr,
               CHUNK_P: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_DV: tl.constexpr):
    """A key range's result: the normalised output when it is the only range, else its
    partial (acc, max, sum) and, with COMBINE, a ticket; the last ticket merges."""
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
                       BLOCK_R, CHUNK_P, BLOCK_P, BLOCK_DV)


@triton.jit(do_not_specialize=["C"])
def _decode_split(q_ptr, k_ptr, v_ptr, len_ptr, o_ptr, po_ptr, pml_ptr, cnt_ptr, flag_ptr, tag,
                  s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                  s_ob, s_oh, s_ot, s_od, s_len,
                  Hk, T, D, DV, C, P, one_max, qk_scale,
                  GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                  PREC: tl.constexpr, COMBINE: tl.constexpr, CHUNK_P: tl.constexpr,
                  BLOCK_P: tl.constexpr, PDL: tl.constexpr):
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
    raw, length, per, n_act = _ranges(len_ptr, b, s_len, C, P, one_max, BLOCK_N)
    if (pid_s == 0) & (g == 0):           # one program of each batch row reports a bad length
        bad = (raw < 0) | (raw > C)
        if bad:
            _flag_bad_lanes(flag_ptr, bad, raw, tag)
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
            acc, l_i, m_i = _softmax_step(qk, v, acc, l_i, m_i, PREC)
            kt_ptr += BLOCK_N * s_kn
            v_ptr2 += BLOCK_N * s_vn
        _range_out(acc, l_i, m_i, n_act, o_ptr, po_ptr, pml_ptr, cnt_ptr, pid_bg, pid_s, P, R,
                   T, GROUP, DV, b64, g, head, t, rows, rmask, offs_dv, s_ob, s_oh, s_ot, s_od,
                   COMBINE, BLOCK_R, CHUNK_P, BLOCK_P, BLOCK_DV)


@triton.jit(do_not_specialize=["C"])
def _decode_combine(po_ptr, pml_ptr, o_ptr, len_ptr, s_ob, s_oh, s_ot, s_od, s_len,
                    Hk, T, DV, C, P, one_max, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_R: tl.constexpr, CHUNK_P: tl.constexpr, BLOCK_P: tl.constexpr,
                    BLOCK_DV: tl.constexpr, PDL: tl.constexpr):
    _pdl_wait(PDL)
    pid_bg = tl.program_id(0)
    b = pid_bg // Hk
    g = pid_bg % Hk
    raw, length, per, n_act = _ranges(len_ptr, b, s_len, C, P, one_max, BLOCK_N)
    if n_act > 1:      # otherwise the split kernel wrote the output
        _merge(po_ptr, pml_ptr, o_ptr, pid_bg, n_act, P, GROUP * T, T, GROUP, DV,
               b.to(tl.int64), g * GROUP, s_ob, s_oh, s_ot, s_od,
               BLOCK_R, CHUNK_P, BLOCK_P, BLOCK_DV)


# ------------------------------------------------------------------ launch configuration
# P (the most splits per (batch, kv head)) makes TARGET programs in all (one per SM of the
# device: its SM count, from device_facts) and never more splits than BLOCK_N-key blocks
# of the capacity; at run time only cdiv(length, per) of them work.
# The merge reads [BLOCK_R, CHUNK_P, BLOCK_DV] fp32 tiles: CHUNK_P * BLOCK_R <= 32 keeps
# that at <= 32 registers a thread with 4 warps (64 spilled a little next to the main loop).
MAX_SPLITS = 256
# 16-bit caches on the GPU. Measured on the H200 (benchmarks/sweep_decode_attention.py: B1,
# 32/8 heads, D128, K/V rotated past L2, 29 candidates): one program per SM of each (batch,
# kv head) row's share, 128-key tiles, 3 stages: 32k 38.0 us = 84% of copy, 1.04x torch (3
# programs per SM with 64-key tiles: 40.3 us, 0.98x); 8k 1.15x, 1k 1.36x. (A sweep that
# times one call after a memset L2 flush misleads: the dirty lines' write-back adds ~8 us
# to every candidate and hides the difference.)
PROGRAMS_PER_SM = 1
TUNED = dict(BLOCK_N=128, num_warps=4, num_stages=3, COMBINE=1)
# ONE_MAX: caches up to this length take one range (one program per (batch, kv head), no
# merge). Splitting adds a partial store, a ticket and a merge to the critical path of every
# decode step, which costs more than a second 128-key tile in the same program. H200
# (`bench_decode.py --attn-ab`, the captured step): SmolLM2 at lengths 128-256
# x1.014-1.05, the 1B shape x1.014-1.02; at 1024 keys fewer, longer ranges lose (one range
# x0.79, >= 256 keys a range x0.97), so the split rule stays above ONE_MAX.
ONE_MAX = 256


def decode_config(B, Hk, C, bd, bdv, itemsize, dev):
    """The launch config for `dev` (kernels/_common.DeviceFacts); TARGET as the autotune
    space spells it."""
    target, nw, combine = PROGRAMS_PER_SM * dev.sms, TUNED["num_warps"], TUNED["COMBINE"]
    if dev.type != "cuda":
        bn, stages = 16, 1
    elif itemsize == 2:
        bn, stages = TUNED["BLOCK_N"], TUNED["num_stages"]
    else:
        bn, stages = 64, 2
    # K and V tiles of every stage must fit shared memory (an over-count: the pipeline holds
    # num_stages - 1 buffers, sm_90 compile N64 s3 72 KB at bf16 D128); keeps bf16 D128 at
    # N128 s3 (2 x 64 KB), halves D=256 to N64; fp32 D=256: BLOCK_N 32
    while bn > 16 and bn * (bd + bdv) * itemsize * stages > 200_000:
        bn //= 2
    return dict(P=splits(B * Hk, C, target, bn), TARGET=target, BLOCK_N=bn, num_warps=nw,
                num_stages=stages, COMBINE=combine, ONE_MAX=ONE_MAX)


def splits(BHk, C, target, bn):
    """P for `target` programs over BHk (batch x kv head) rows and capacity C: the rule's."""
    return max(1, min(MAX_SPLITS, _cdiv(target, BHk), _cdiv(C, bn)))


def _tuned(cfg, BHk, C, R, D, q):
    # autotune seam: a screened (TARGET, BLOCK_N, warps, stages, COMBINE) for the key
    # (B*Hk, C, R, D) inside today's space, else the rule; P re-derived from TARGET, BLOCK_N
    d = dict(TARGET=cfg["TARGET"], BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"],
             num_stages=cfg["num_stages"], COMBINE=cfg["COMBINE"])
    t = _autotune.pick("decode_attention", (BHk, C, R, D), d, dtype=q.dtype.name,
                       device=q.device)
    if t == d:
        return cfg
    return dict(t, P=splits(BHk, C, t["TARGET"], t["BLOCK_N"]), ONE_MAX=cfg["ONE_MAX"])


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
    from ..index_errors import lengths_err
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
    cfg = decode_config(B, Hk, C, bd, bdv, q.dtype.itemsize, device_facts(q.device))
    if _OVERRIDE:
        cfg.update(_OVERRIDE)
    else:
        cfg = _tuned(cfg, B * Hk, C, R, D, q)
    P, combine = cfg["P"], int(cfg["COMBINE"])
    one_max = int(cfg.get("ONE_MAX", 0))
    bp = max(2, _np2(P))
    chunk = cfg.get("CHUNK_P") or max(1, min(bp, 32 // br))
    # workspace: size known on the host (P from shapes), so capture-safe
    po = Tensor._empty((B * Hq * T * P * DV,), _dt.float32, q.device)
    pml = Tensor._empty((B * Hq * T * P * 2,), _dt.float32, q.device)
    cnt = _counters(B * Hk, q.device) if combine else pml
    s_len = 0 if lengths.ndim == 0 else lengths.stride(0)
    pdl = pdl_opts(q.device)
    err = lengths_err(C)
    launch(_decode_split, (P, B * Hk), q, kc, vc, lengths, out, po, pml, cnt, _flag(q.device),
           _tag(err), *q.stride(), *kc.stride(), *vc.stride(), *out.stride(), s_len, Hk, T, D,
           DV, C, P, one_max, scale * LOG2E,
           GROUP=group, BLOCK_H=bh, BLOCK_R=br, BLOCK_N=cfg["BLOCK_N"], BLOCK_D=bd,
           BLOCK_DV=bdv, PREC="ieee" if q.dtype.itemsize >= 4 else "tf32", COMBINE=combine,
           CHUNK_P=chunk, BLOCK_P=bp, num_warps=cfg["num_warps"],
           num_stages=cfg["num_stages"], **pdl)
    if not combine:
        launch(_decode_combine, (B * Hk,), po, pml, out, lengths, *out.stride(), s_len,
               Hk, T, DV, C, P, one_max, GROUP=group, BLOCK_N=cfg["BLOCK_N"], BLOCK_R=br,
               CHUNK_P=chunk, BLOCK_P=bp, BLOCK_DV=bdv, num_warps=4, **pdl)
    _after(q.device, err)
    return out
