"""Flash-decoding on cuda/interp: a few query tokens against a KV cache, split over the keys.

Split kernel: grid (P, B * Hk). Program (s, b, g) reads the cache length of batch b from
the device, takes the s-th of P equal key ranges (rounded up to BLOCK_N), and runs the
online softmax for ALL query rows of kv head g (GROUP query heads x T tokens) at once, so
each K/V tile is read once per group. It writes its unnormalised partial output, max and
sum. Programs whose range is empty (short caches) write an empty partial (l = 0).
Combine kernel: grid (B * Hq * T,), merges the P partials of one row.

The grid depends only on shapes (P from the batch, kv heads and capacity), never on the
length, so the same launch is valid at every step (CUDA-graph capture). Query token t of T
attends keys j <= length - T + t (bottom-right causal), j < length.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..dispatch import register

LOG2E = 1.4426950408889634


@triton.jit
def _decode_split(q_ptr, k_ptr, v_ptr, len_ptr, po_ptr, pml_ptr,
                  s_qb, s_qh, s_qt, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd, s_len,
                  Hk, T, D, DV, P, qk_scale,
                  GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PREC: tl.constexpr):
    pid_s = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = pid_bg // Hk
    g = pid_bg % Hk
    length = tl.load(len_ptr + b * s_len).to(tl.int32)
    per = tl.cdiv(tl.cdiv(length, P), BLOCK_N) * BLOCK_N
    start = pid_s * per
    end = tl.minimum(start + per, length)
    rows = tl.arange(0, BLOCK_H)
    rmask = rows < GROUP * T
    head = g * GROUP + rows // T
    t = rows % T
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    b64 = b.to(tl.int64)
    q = tl.load(q_ptr + b64 * s_qb + head[:, None] * s_qh + t[:, None] * s_qt
                + offs_d[None, :] * s_qd, mask=rmask[:, None] & (offs_d[None, :] < D), other=0.0)
    limit = length - T + t                     # last key each row may see
    k_base = k_ptr + b64 * s_kb + g.to(tl.int64) * s_kh
    v_base = v_ptr + b64 * s_vb + g.to(tl.int64) * s_vh
    acc = tl.zeros((BLOCK_H, BLOCK_DV), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    m_i = tl.full((BLOCK_H,), -float("inf"), tl.float32)
    for n in range(start, end, BLOCK_N):
        offs_n = n + tl.arange(0, BLOCK_N)
        nmask = offs_n < end
        kt = tl.load(k_base + offs_d[:, None] * s_kd + offs_n[None, :] * s_kn,
                     mask=nmask[None, :] & (offs_d[:, None] < D), other=0.0)
        v = tl.load(v_base + offs_n[:, None] * s_vn + offs_dv[None, :] * s_vd,
                    mask=nmask[:, None] & (offs_dv[None, :] < DV), other=0.0)
        qk = tl.dot(q, kt, input_precision=PREC) * qk_scale
        qk = tl.where(nmask[None, :] & (offs_n[None, :] <= limit[:, None]), qk, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(qk - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    # partial row r of the (B, Hq, T) rows: index ((b * Hq + head) * T + t) * P + s
    prow = ((b64 * (Hk * GROUP) + head) * T + t) * P + pid_s
    tl.store(po_ptr + prow[:, None] * DV + offs_dv[None, :], acc,
             mask=rmask[:, None] & (offs_dv[None, :] < DV))
    tl.store(pml_ptr + prow * 2, m_i, mask=rmask)
    tl.store(pml_ptr + prow * 2 + 1, l_i, mask=rmask)


@triton.jit
def _decode_combine(po_ptr, pml_ptr, o_ptr, s_ob, s_oh, s_ot, s_od, Hq, T, DV, P,
                    BLOCK_P: tl.constexpr, CHUNK_P: tl.constexpr, BLOCK_DV: tl.constexpr):
    row = tl.program_id(0)
    b = row // (Hq * T)
    h = (row // T) % Hq
    t = row % T
    offs_p = tl.arange(0, BLOCK_P)
    offs_dv = tl.arange(0, BLOCK_DV)
    base = row.to(tl.int64) * P
    m = tl.load(pml_ptr + (base + offs_p) * 2, mask=offs_p < P, other=-float("inf"))
    mx = tl.max(m, 0)
    mx = tl.where(mx == -float("inf"), 0.0, mx)
    # the (P, DV) partials in chunks, so a large P does not blow the registers
    acc = tl.zeros((BLOCK_DV,), tl.float32)
    denom = tl.zeros((), tl.float32)
    for c in range(0, P, CHUNK_P):
        pc = c + tl.arange(0, CHUNK_P)
        pm = pc < P
        mc = tl.load(pml_ptr + (base + pc) * 2, mask=pm, other=-float("inf"))
        lc = tl.load(pml_ptr + (base + pc) * 2 + 1, mask=pm, other=0.0)
        w = tl.where(lc > 0, tl.exp2(mc - mx), 0.0)
        denom += tl.sum(lc * w, 0)
        po = tl.load(po_ptr + (base + pc)[:, None] * DV + offs_dv[None, :],
                     mask=pm[:, None] & (offs_dv[None, :] < DV), other=0.0)
        acc += tl.sum(po * w[:, None], 0)
    o = acc / tl.where(denom == 0.0, 1.0, denom)
    tl.store(o_ptr + b.to(tl.int64) * s_ob + h * s_oh + t * s_ot + offs_dv * s_od,
             o.to(o_ptr.dtype.element_ty), mask=offs_dv < DV)


# ------------------------------------------------------------------ launch configuration
# P (splits per (batch, kv head)) makes ~4 programs per SM of an H200 (132 SMs) and never
# more splits than BLOCK_N-key blocks of the capacity. BLOCK_N=64, 4 warps, 2 stages: about
# 39 KB of shared memory (bf16, D=128), so all 528 programs are resident in one wave (3
# stages need 72 KB and would leave a quarter of them for a second wave).
TARGET_PROGRAMS = 4 * 132
MAX_SPLITS = 256


def decode_config(B, Hk, C, bd=128, bdv=128, itemsize=2, interp=False):
    if interp:
        bn, stages = 16, 1
    else:
        bn, stages = 64, 2
        # K and V tiles of every stage must fit shared memory (fp32, D=256: BLOCK_N 16)
        while bn > 16 and bn * (bd + bdv) * itemsize * stages > 150_000:
            bn //= 2
    p = max(1, min(MAX_SPLITS, triton.cdiv(TARGET_PROGRAMS, B * Hk), triton.cdiv(C, bn)))
    return dict(P=p, BLOCK_N=bn, num_warps=4, num_stages=stages)


_OVERRIDE: dict | None = None   # tests: {"P": 3, "BLOCK_N": 16}


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
    bh = max(16, triton.next_power_of_2(group * T))
    bd = max(16, triton.next_power_of_2(D))
    bdv = max(16, triton.next_power_of_2(DV))
    cfg = decode_config(B, Hk, C, bd, bdv, q.dtype.itemsize, q.device.type == "interp")
    if _OVERRIDE:
        cfg.update(_OVERRIDE)
    P = cfg["P"]
    # workspace: size known on the host (P from shapes), so capture-safe
    po = Tensor._empty((B * Hq * T * P * DV,), _dt.float32, q.device)
    pml = Tensor._empty((B * Hq * T * P * 2,), _dt.float32, q.device)
    s_len = 0 if lengths.ndim == 0 else lengths.stride(0)
    launch(_decode_split, (P, B * Hk), q, kc, vc, lengths, po, pml, *q.stride(), *kc.stride(),
           *vc.stride(), s_len, Hk, T, D, DV, P, scale * LOG2E,
           GROUP=group, BLOCK_H=bh, BLOCK_N=cfg["BLOCK_N"], BLOCK_D=bd, BLOCK_DV=bdv,
           PREC="ieee" if q.dtype.itemsize >= 4 else "tf32",
           num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    bp = max(2, triton.next_power_of_2(P))
    launch(_decode_combine, (B * Hq * T,), po, pml, out, *out.stride(), Hq, T, DV, P,
           BLOCK_P=bp, CHUNK_P=min(16, bp), BLOCK_DV=bdv, num_warps=4)
    return out
