"""Rotary embeddings and the KV-cache write (optionally fused with RoPE) on cuda/interp.

Rotation of pair (x1, x2) at frequency i by angle a = pos * inv_freq[i] (fp32, as HF):
    y1 = x1 cos a - x2 sin a,   y2 = x2 cos a + x1 sin a
HF rotate_half pairs element i with i + D/2; interleaved (GPT-J / GGUF) pairs 2i with 2i+1.
The angle is reduced to [-pi, pi] first (Cody-Waite, two constants) so cos/sin stay accurate
for long contexts whatever the GPU's fast cos does outside that range.

Positions come from a device tensor; nothing here reads a device value on the host. A
cache position outside [0, capacity) is not written; it is recorded in the index-error flag
of kernels/indexing.py (IndexError at the op on interp, at the next synchronising call on
cuda) and the cache length stays within [0, capacity], so no later read leaves the cache.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from ..dispatch import register
from ._host import cdiv as _cdiv, next_pow2 as _np2
from ._pdl import _pdl_wait, pdl_opts
from .indexing import _after, _flag, _flag_bad_lanes, _tag


@triton.jit
def _cos_sin(ang):
    k = tl.floor(ang * 0.15915494309189535 + 0.5)
    r = (ang - k * 6.28125) - k * 0.0019353071795864769   # 2*pi = 6.28125 + 0.00193530...
    return tl.cos(r), tl.sin(r)


@triton.jit
def _rotate_tile(base, heads, hmask, pos, inv_ptr, s_h, s_d, HALF,
                 BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, INTERLEAVED: tl.constexpr,
                 F64: tl.constexpr):
    """Load the (BLOCK_H, D) tile at base + heads*s_h and return its rotated halves."""
    i = tl.arange(0, BLOCK_HALF)
    imask = i < HALF
    if INTERLEAVED:
        i1 = 2 * i
        i2 = 2 * i + 1
    else:
        i1 = i
        i2 = i + HALF
    m = hmask[:, None] & imask[None, :]
    p1 = base + heads[:, None] * s_h + i1[None, :] * s_d
    p2 = base + heads[:, None] * s_h + i2[None, :] * s_d
    x1 = tl.load(p1, mask=m, other=0.0)
    x2 = tl.load(p2, mask=m, other=0.0)
    inv = tl.load(inv_ptr + i, mask=imask, other=0.0)
    c, s = _cos_sin(pos.to(tl.float32) * inv)
    if F64:
        x1 = x1.to(tl.float64)
        x2 = x2.to(tl.float64)
        c = c.to(tl.float64)
        s = s.to(tl.float64)
    else:
        x1 = x1.to(tl.float32)
        x2 = x2.to(tl.float32)
    y1 = x1 * c[None, :] - x2 * s[None, :]
    y2 = x2 * c[None, :] + x1 * s[None, :]
    return y1, y2, i1, i2, m


@triton.jit
def _rope_kernel(x_ptr, o_ptr, pos_ptr, inv_ptr, s_xb, s_xh, s_xt, s_xd, s_ob, s_oh, s_ot, s_od,
                 s_pb, s_pt, H, T, HALF,
                 BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, INTERLEAVED: tl.constexpr,
                 F64: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // T).to(tl.int64)
    t = (pid % T).to(tl.int64)
    pos = tl.load(pos_ptr + b * s_pb + t * s_pt)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    y1, y2, i1, i2, m = _rotate_tile(x_ptr + b * s_xb + t * s_xt, heads, hmask, pos, inv_ptr,
                                     s_xh, s_xd, HALF, BLOCK_H, BLOCK_HALF, INTERLEAVED, F64)
    ob = o_ptr + b * s_ob + t * s_ot + heads[:, None] * s_oh
    tl.store(ob + i1[None, :] * s_od, y1.to(o_ptr.dtype.element_ty), mask=m)
    tl.store(ob + i2[None, :] * s_od, y2.to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def _check_position(pos, C, flag_ptr, tag):
    """Whether cache position `pos` lies in [0, C); one outside is recorded in the flag."""
    bad = (pos < 0) | (pos >= C)
    if bad:
        _flag_bad_lanes(flag_ptr, bad, pos, tag)
    return ~bad


@triton.jit
def _cache_length(pos, C):
    """The cache length after writing position `pos`: pos + 1, kept inside [0, C]."""
    return tl.minimum(tl.maximum(pos + 1, 0), C)


@triton.jit
def _kv_append_kernel(k_ptr, v_ptr, ck_ptr, cv_ptr, pos_ptr, len_ptr, q_ptr, inv_ptr,
                      flag_ptr, tag,
                      s_kb, s_kh, s_kt, s_kd, s_vb, s_vh, s_vt, s_vd,
                      s_cb, s_ch, s_cn, s_cd, s_wb, s_wh, s_wn, s_wd,
                      s_qb, s_qh, s_qt, s_qd, s_pb, s_pt, Hk, Hq, T, C, D, DV,
                      BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                      BLOCK_HQ: tl.constexpr, ROPE: tl.constexpr, INTERLEAVED: tl.constexpr,
                      F64: tl.constexpr, PDL: tl.constexpr):
    # PDL (decode step): q/k/v come from the previous kernel, q is written in place
    _pdl_wait(PDL)
    pid = tl.program_id(0)
    b = (pid // T).to(tl.int64)
    t = (pid % T).to(tl.int64)
    pos = tl.load(pos_ptr + b * s_pb + t * s_pt).to(tl.int64)
    ok = _check_position(pos, C, flag_ptr, tag)
    slot = tl.where(ok, pos, 0)
    heads = tl.arange(0, BLOCK_H)
    hmask = (heads < Hk) & ok
    if ROPE:
        HALF = D // 2
        # q in place (every query head of this token), then k into the cache
        qh = tl.arange(0, BLOCK_HQ)
        qb = q_ptr + b * s_qb + t * s_qt
        y1, y2, i1, i2, m = _rotate_tile(qb, qh, qh < Hq, pos, inv_ptr, s_qh, s_qd, HALF,
                                         BLOCK_HQ, BLOCK_D // 2, INTERLEAVED, F64)
        tl.store(qb + qh[:, None] * s_qh + i1[None, :] * s_qd, y1.to(q_ptr.dtype.element_ty),
                 mask=m)
        tl.store(qb + qh[:, None] * s_qh + i2[None, :] * s_qd, y2.to(q_ptr.dtype.element_ty),
                 mask=m)
        y1, y2, i1, i2, m = _rotate_tile(k_ptr + b * s_kb + t * s_kt, heads, hmask, pos, inv_ptr,
                                         s_kh, s_kd, HALF, BLOCK_H, BLOCK_D // 2, INTERLEAVED,
                                         F64)
        cb = ck_ptr + b * s_cb + slot * s_cn + heads[:, None] * s_ch
        tl.store(cb + i1[None, :] * s_cd, y1.to(ck_ptr.dtype.element_ty), mask=m)
        tl.store(cb + i2[None, :] * s_cd, y2.to(ck_ptr.dtype.element_ty), mask=m)
    else:
        d = tl.arange(0, BLOCK_D)
        m = hmask[:, None] & (d[None, :] < D)
        k = tl.load(k_ptr + b * s_kb + t * s_kt + heads[:, None] * s_kh + d[None, :] * s_kd,
                    mask=m)
        tl.store(ck_ptr + b * s_cb + slot * s_cn + heads[:, None] * s_ch + d[None, :] * s_cd,
                 k, mask=m)
    dv = tl.arange(0, BLOCK_DV)
    mv = hmask[:, None] & (dv[None, :] < DV)
    v = tl.load(v_ptr + b * s_vb + t * s_vt + heads[:, None] * s_vh + dv[None, :] * s_vd, mask=mv)
    tl.store(cv_ptr + b * s_wb + slot * s_wn + heads[:, None] * s_wh + dv[None, :] * s_wd, v,
             mask=mv)
    if t == T - 1:
        tl.store(len_ptr + b, _cache_length(pos, C).to(len_ptr.dtype.element_ty))


# ------------------------------------------------------------------ launch configuration
# One program per (batch, token) row covers every head: a decode step is B programs of
# H x D elements, which is as small as the work gets. 4 warps.
_OVERRIDE: dict | None = None


@register("rope", "triton")
def rope(out, x, pos, inv, *, interleaved):
    from .. import dtypes as _dt
    from ..backends.launch import launch
    B, H, T, D = x.shape
    bh = min(_np2(H), max(1, 4096 // max(D, 1)))
    if _OVERRIDE:
        bh = _OVERRIDE.get("BLOCK_H", bh)
    launch(_rope_kernel, (B * T, _cdiv(H, bh)), x, out, pos, inv, *x.stride(),
           *out.stride(), *pos.stride(), H, T, D // 2, BLOCK_H=bh,
           BLOCK_HALF=_np2(D // 2), INTERLEAVED=interleaved,
           F64=x.dtype is _dt.float64, num_warps=4)
    return out


@register("kv_append", "triton")
def kv_append(ck, cv, lengths, k, v, pos, q=None, inv=None, *, interleaved=False):
    from .. import dtypes as _dt
    from ..backends.launch import launch
    from ..index_errors import positions_err
    B, Hk, T, D = k.shape
    C, DV = ck.shape[2], cv.shape[3]
    rope_on = inv is not None
    qq = q if rope_on else k
    Hq = q.shape[1] if rope_on else Hk
    err = positions_err("KVCache.append_rope" if rope_on else "KVCache.append", C)
    launch(_kv_append_kernel, (B * T,), k, v, ck, cv, pos, lengths, qq,
           inv if rope_on else k, _flag(k.device), _tag(err), *k.stride(), *v.stride(),
           *ck.stride(), *cv.stride(), *qq.stride(), *pos.stride(), Hk, Hq, T, C, D, DV,
           BLOCK_H=_np2(Hk), BLOCK_D=max(2, _np2(D)),
           BLOCK_DV=_np2(DV), BLOCK_HQ=_np2(Hq),
           ROPE=rope_on, INTERLEAVED=interleaved, F64=k.dtype is _dt.float64, num_warps=4,
           **pdl_opts(k.device))
    _after(k.device, err)
