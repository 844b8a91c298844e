"""Paged decode attention and the paged KV-cache write on cuda/interp.

The cache of one layer is a pool of pages: k (num_blocks, block_size, Hk, D), v the same
with DV. Sequence b's logical key j lives in page block_tables[b, j // block_size], slot
j % block_size. Everything else is kernels/decode_attention.py's flash-decoding: grid (P,
B * Hk), program (s, b, g) takes the s-th key range of batch b's length (`_ranges`), runs
the online softmax for all GROUP * T query rows of kv head g, and the split partials are
merged by the program that draws the last ticket (`_merge`, COMBINE=1) -- the only
difference is that each BLOCK_N tile of keys finds its rows through the block table (one
int32 load per key, hit in L1 for the BLOCK_N // block_size pages of the tile).

Capacity C = max_blocks * block_size. A length outside [0, C] is clamped before any key is
read and recorded in the index-error flag (kernels/indexing.py) as the contiguous kernel
does; a page id outside [0, num_blocks) inside the length is never dereferenced (its keys
are masked) and is flagged too. Pages past a sequence's length are never read.

`_paged_append_kernel` writes token t of batch b at logical slot positions[b, t] into its
page and sets lengths[b] = positions[b, -1] + 1 (the same value from every layer).
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from ..dispatch import register
from ._common import device_facts
from ._host import next_pow2 as _np2
from .decode_attention import (LOG2E, _counters, _range_out, _ranges, _softmax_step,
                               decode_config)
from .indexing import _after, _flag, _flag_bad_lanes, _tag


@triton.jit(do_not_specialize=["C", "NB"])
def _paged_decode_split(q_ptr, k_ptr, v_ptr, bt_ptr, len_ptr, o_ptr, po_ptr, pml_ptr, cnt_ptr,
                        flag_ptr, tag, ptag, s_qb, s_qh, s_qt, s_qd, s_kp, s_kn, s_kh, s_kd,
                        s_vp, s_vn, s_vh, s_vd, s_bt, s_ob, s_oh, s_ot, s_od, s_len,
                        Hk, T, D, DV, C, NB, P, one_max, qk_scale,
                        PAGE: tl.constexpr, GROUP: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_DV: tl.constexpr, PREC: tl.constexpr, CHUNK_P: tl.constexpr,
                        BLOCK_P: tl.constexpr, PF: tl.constexpr):
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
    b64 = b.to(tl.int64)
    q = tl.load(q_ptr + b64 * s_qb + head[:, None] * s_qh + t[:, None] * s_qt
                + offs_d[None, :] * s_qd, mask=rmask[:, None] & (offs_d[None, :] < D), other=0.0)
    raw, length, per, n_act = _ranges(len_ptr, b, s_len, C, P, one_max, BLOCK_N)
    if (pid_s == 0) & (g == 0):
        bad = (raw < 0) | (raw > C)
        if bad:
            _flag_bad_lanes(flag_ptr, bad, raw, tag)
    if pid_s < n_act:
        start = pid_s * per
        end = tl.minimum(start + per, length)
        offs_dv = tl.arange(0, BLOCK_DV)
        offs_n0 = tl.arange(0, BLOCK_N)
        limit = length - T + t
        k_head = k_ptr + g.to(tl.int64) * s_kh
        v_head = v_ptr + g.to(tl.int64) * s_vh
        bt_row = bt_ptr + b64 * s_bt
        acc = tl.zeros((BLOCK_H, BLOCK_DV), tl.float32)
        l_i = tl.zeros((BLOCK_H,), tl.float32)
        m_i = tl.full((BLOCK_H,), -float("inf"), tl.float32)
        # a bad page is remembered per lane and flagged once after the loop: atomics in the
        # loop body keep the compiler from pipelining the K/V loads
        bad_any = offs_n0 < 0
        bad_page = tl.zeros((BLOCK_N,), tl.int32)
        if PF:
            # the next tile's page ids load one step ahead, so a step's K/V addresses do not
            # wait on a load issued in the same step
            page_next = tl.load(bt_row + (start + offs_n0) // PAGE,
                                mask=start + offs_n0 < end, other=0)
        for n in range(start, end, BLOCK_N):
            offs_n = n + offs_n0
            nmask = offs_n < end
            if PF:
                page = page_next
                page_next = tl.load(bt_row + (offs_n + BLOCK_N) // PAGE,
                                    mask=offs_n + BLOCK_N < end, other=0)
            else:
                page = tl.load(bt_row + offs_n // PAGE, mask=nmask, other=0)
            pbad = nmask & ((page < 0) | (page >= NB))
            bad_any = bad_any | pbad
            bad_page = tl.where(pbad, page, bad_page)
            kmask = nmask & ~pbad
            slot = offs_n % PAGE
            kt = tl.load(k_head + page.to(tl.int64)[None, :] * s_kp + slot[None, :] * s_kn
                         + offs_d[:, None] * s_kd,
                         mask=kmask[None, :] & (offs_d[:, None] < D), other=0.0)
            v = tl.load(v_head + page.to(tl.int64)[:, None] * s_vp + slot[:, None] * s_vn
                        + offs_dv[None, :] * s_vd,
                        mask=kmask[:, None] & (offs_dv[None, :] < DV), other=0.0)
            qk = tl.dot(q, kt, input_precision=PREC) * qk_scale
            qk = tl.where(kmask[None, :] & (offs_n[None, :] <= limit[:, None]), qk,
                          -float("inf"))
            acc, l_i, m_i = _softmax_step(qk, v, acc, l_i, m_i, PREC)
        _flag_bad_lanes(flag_ptr, bad_any, bad_page, ptag)   # masked atomics: free when good
        _range_out(acc, l_i, m_i, n_act, o_ptr, po_ptr, pml_ptr, cnt_ptr, pid_bg, pid_s, P, R,
                   T, GROUP, DV, b64, g, head, t, rows, rmask, offs_dv, s_ob, s_oh, s_ot, s_od,
                   1, BLOCK_R, CHUNK_P, BLOCK_P, BLOCK_DV)


@triton.jit(do_not_specialize=["C", "NB"])
def _paged_append_kernel(k_ptr, v_ptr, ck_ptr, cv_ptr, bt_ptr, pos_ptr, len_ptr, flag_ptr, tag,
                         ptag, T, C, NB, s_kb, s_kh, s_kt, s_kd, s_vb, s_vh, s_vt, s_vd,
                         s_cp, s_cn, s_ch, s_cd, s_dp, s_dn, s_dh, s_dd, s_bt, s_pb, s_pt,
                         D, DV, PAGE: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_DV: tl.constexpr):
    # program (b * T + t, head): one token's K and V rows of one kv head
    bt_i = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = (bt_i // T).to(tl.int64)
    t = bt_i % T
    pos = tl.load(pos_ptr + b * s_pb + t * s_pt).to(tl.int64)
    ok = (pos >= 0) & (pos < C)
    page = tl.load(bt_ptr + b * s_bt + tl.where(ok, pos, 0) // PAGE, mask=ok, other=0)
    pok = ok & (page >= 0) & (page < NB)
    if h == 0:
        if ~ok:
            _flag_bad_lanes(flag_ptr, ~ok, pos, tag)
        elif ~pok:
            _flag_bad_lanes(flag_ptr, ~pok, page, ptag)
    slot = tl.where(ok, pos, 0) % PAGE
    page64 = page.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    kv = tl.load(k_ptr + b * s_kb + h * s_kh + t * s_kt + offs_d * s_kd, mask=offs_d < D)
    tl.store(ck_ptr + page64 * s_cp + slot * s_cn + h * s_ch + offs_d * s_cd, kv,
             mask=(offs_d < D) & pok)
    vv = tl.load(v_ptr + b * s_vb + h * s_vh + t * s_vt + offs_dv * s_vd, mask=offs_dv < DV)
    tl.store(cv_ptr + page64 * s_dp + slot * s_dn + h * s_dh + offs_dv * s_dd, vv,
             mask=(offs_dv < DV) & pok)
    if (h == 0) & (t == T - 1):
        # lengths stay inside [0, C] whatever the positions held
        tl.store(len_ptr + b, tl.minimum(tl.maximum(pos + 1, 0), C).to(tl.int32))


def _page_err(op, NB):
    return (op, f"block_tables (the pool holds {NB} pages)", 0, NB)


@register("paged_decode_attention", "triton")
def paged_decode_attention(out, q, kc, vc, block_tables, lengths, *, scale):
    from .. import dtypes as _dt
    from ..backends.launch import launch
    from ..index_errors import lengths_err
    from ..tensor import Tensor
    if q.dtype is _dt.float64:
        raise NotImplementedError("paged_decode_attention: float64 is supported on cpu only")
    B, Hq, T, D = q.shape
    NB, PAGE, Hk, _ = kc.shape
    DV = vc.shape[3]
    C = block_tables.shape[1] * PAGE
    group = Hq // Hk
    R = group * T
    br = _np2(R)
    bh = max(16, br)
    bd = max(16, _np2(D))
    bdv = max(16, _np2(DV))
    facts = device_facts(q.device)
    cfg = decode_config(B, Hk, C, bd, bdv, q.dtype.itemsize, facts)
    if facts.type == "cuda" and q.dtype.itemsize == 2 and B * Hk >= facts.sms // 4:
        # many (batch, kv head) rows: 64-key tiles keep more of them in flight (probe_paged:
        # B8 Hk8 L8k 1.43 -> 1.13 of the contiguous kernel's time; B1 gets slower with them)
        cfg["BLOCK_N"] = min(cfg["BLOCK_N"], 64)
    if _OVERRIDE:
        cfg.update(_OVERRIDE)
    P = cfg["P"]
    one_max = int(cfg.get("ONE_MAX", 0))
    bp = max(2, _np2(P))
    chunk = cfg.get("CHUNK_P") or max(1, min(bp, 32 // br))
    po = Tensor._empty((B * Hq * T * P * DV,), _dt.float32, q.device)
    pml = Tensor._empty((B * Hq * T * P * 2,), _dt.float32, q.device)
    cnt = _counters(B * Hk, q.device)
    s_len = 0 if lengths.ndim == 0 else lengths.stride(0)
    err, perr = lengths_err(C), _page_err("paged_decode_attention", NB)
    launch(_paged_decode_split, (P, B * Hk), q, kc, vc, block_tables, lengths, out, po, pml,
           cnt, _flag(q.device), _tag(err), _tag(perr), *q.stride(), *kc.stride(),
           *vc.stride(), block_tables.stride(0), *out.stride(), s_len, Hk, T, D, DV, C, NB, P,
           one_max, scale * LOG2E, PAGE=PAGE, GROUP=group, BLOCK_H=bh, BLOCK_R=br,
           BLOCK_N=cfg["BLOCK_N"], BLOCK_D=bd, BLOCK_DV=bdv,
           PREC="ieee" if q.dtype.itemsize >= 4 else "tf32", CHUNK_P=chunk, BLOCK_P=bp,
           PF=bool(cfg.get("PF", PREFETCH_PAGES)), num_warps=cfg["num_warps"],
           num_stages=cfg["num_stages"])
    _after(q.device, err)
    return out


_OVERRIDE: dict | None = None   # tests: {"P": 3, "BLOCK_N": 16, "ONE_MAX": 0}; also PF
PREFETCH_PAGES = True           # page ids one tile ahead (probe_paged.py)


@register("paged_kv_append", "triton")
def paged_kv_append(ck, cv, block_tables, lengths, k, v, pos):
    from ..backends.launch import launch
    from ..index_errors import positions_err
    B, Hk, T, D = k.shape
    DV = v.shape[3]
    NB, PAGE = ck.shape[0], ck.shape[1]
    C = block_tables.shape[1] * PAGE
    err, perr = positions_err("PagedKVCache.append", C), _page_err("PagedKVCache.append", NB)
    launch(_paged_append_kernel, (B * T, Hk), k, v, ck, cv, block_tables, pos, lengths,
           _flag(k.device), _tag(err), _tag(perr), T, C, NB, *k.stride(), *v.stride(),
           *ck.stride(), *cv.stride(), block_tables.stride(0), *pos.stride(), D, DV,
           PAGE=PAGE, BLOCK_D=_np2(D), BLOCK_DV=_np2(DV), num_warps=1)
    _after(k.device, err)
