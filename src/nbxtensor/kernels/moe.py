"""Mixture-of-experts on cuda/interp: router top-k, moe_align_block_size, the expert GEMMs.

The op layer (ops/moe.py) validates and allocates; these entries only launch.

* `_topk_kernel`: one program per token. Scores (softmax over the experts, or sigmoid) in
  fp32; the selection score adds the correction bias; with groups, each group is scored
  (the sum of its top-2 selection scores with a bias, its maximum without, as vLLM's
  grouped_topk) and the `topk_group` best groups are kept; then `topk` rounds of argmax.
  Every argmax takes the lowest index among equal values; NaN selection scores count as
  -inf, so the ids are always valid experts. Weights are the uncorrected scores of the
  chosen experts, renormalised if asked, times the scaling factor.
* `_align_count_kernel` / `_align_scatter_kernel`: vLLM's moe_align_block_size. Program e
  counts the slots routed to expert e, then writes their flat indices (in increasing
  order) to expert e's segment, pads the segment to a multiple of the block with the
  sentinel numel and writes e to its blocks' expert_ids; program E writes the total and
  the unused tail (sentinel ids, expert -1). Ids outside [0, E) are dropped (no slot).
* `_moe_gemm_kernel`: the grouped GEMM. A program takes BLOCK_M sorted slots of one
  expert (its block of the aligned list) and BLOCK_N outputs: the token rows are gathered
  through sorted_token_ids (sentinel rows masked), the expert's weight tile is found by
  expert_ids, tl.dot accumulates in fp32. GLU=True is the first GEMM (gate rows n and
  up rows n + I of w1, act(gate) * up stored per slot); MUL_W=True the second (the
  router weight multiplied in, fp32 per slot). Blocks past num_tokens_post_padded (read
  on the device) return at once, so the grid depends on the shapes only (capturable).
* `_moe_reduce_kernel`: out[t] = sum over the top-k slots of t, in slot order (no atomics:
  the result is the same on every run). Dropped slots contribute nothing.
* Decode (few slots): `_moe_gemv_up_kernel` per (slot, BLOCK_N outputs) and
  `_moe_gemv_down_kernel` per (token, BLOCK_N outputs), which reads the chosen experts'
  down-projection rows and sums the slots in order -- only the chosen experts' weights are
  read, with no align step.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from ..dispatch import register
from ._host import cdiv as _cdiv, next_pow2 as _np2
from .elementwise import _erf_any as _erf

# slots (tokens x top-k) up to which fused_experts takes the GEMV decode path; above it the
# aligned grouped GEMM (whose padding costs a whole BLOCK_M tile per chosen expert)
DECODE_MAX_SLOTS = 16

# grouped-GEMM tiles by activation itemsize: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)
GEMM_TILES = {2: (64, 64, 64, 8, 4, 3), 4: (32, 32, 32, 8, 4, 2)}
# decode GEMV tiles: (BLOCK_N, BLOCK_K, warps)
GEMV_TILE = (16, 128, 4)


@triton.jit
def _act(g, ACT: tl.constexpr, INTERP: tl.constexpr):
    if ACT == 0:      # silu
        r = g / (1.0 + tl.exp(-g))
    else:             # gelu (erf form)
        r = 0.5 * g * (1.0 + _erf(g * 0.7071067811865476, INTERP))
    return r


# ----------------------------------------------------------------------------- router top-k
@triton.jit
def _topk_kernel(g_ptr, bias_ptr, w_ptr, id_ptr, s_gm, s_ge, E, EG, NG, TOPK, TOPK_GROUP,
                 scale, BLOCK_G: tl.constexpr, BLOCK_EG: tl.constexpr, BLOCK_K: tl.constexpr,
                 SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, GROUPED: tl.constexpr,
                 RENORM: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    gi = tl.arange(0, BLOCK_G)
    ci = tl.arange(0, BLOCK_EG)
    e = gi[:, None] * EG + ci[None, :]
    valid = (gi[:, None] < NG) & (ci[None, :] < EG)
    x = tl.load(g_ptr + row * s_gm + e * s_ge, mask=valid, other=0.0).to(tl.float32)
    NEG = float("-inf")
    if SIGMOID:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        m = tl.max(tl.max(tl.where(valid, x, NEG), 1), 0)
        p = tl.where(valid, tl.exp(x - m), 0.0)
        s = p / tl.sum(tl.sum(p, 1), 0)
    sel = s
    if HAS_BIAS:
        sel = s + tl.load(bias_ptr + e, mask=valid, other=0.0).to(tl.float32)
    sel = tl.where(sel != sel, NEG, sel)
    if GROUPED:
        sv = tl.where(valid, sel, NEG)
        m1 = tl.max(sv, 1)
        if HAS_BIAS:     # a group's score: the sum of its two best
            i1 = tl.min(tl.where(sv == m1[:, None], ci[None, :], BLOCK_EG), 1)
            gs = m1 + tl.max(tl.where(ci[None, :] == i1[:, None], NEG, sv), 1)
        else:
            gs = m1
        keep = gi < 0
        for _ in range(TOPK_GROUP):
            cand = (gi < NG) & (~keep)
            mg = tl.max(tl.where(cand, gs, NEG), 0)
            best = tl.min(tl.where(cand & (gs == mg), gi, BLOCK_G), 0)
            keep = keep | (gi == best)
        valid = valid & keep[:, None]
    taken = valid & (e < 0)
    ki = tl.arange(0, BLOCK_K)
    wv = tl.zeros([BLOCK_K], tl.float32)
    iv = tl.zeros([BLOCK_K], tl.int32)
    for j in range(TOPK):
        cand = valid & (~taken)
        mx = tl.max(tl.max(tl.where(cand, sel, NEG), 1), 0)
        idx = tl.min(tl.min(tl.where(cand & (sel == mx), e, E), 1), 0)
        hit = e == idx
        taken = taken | hit
        wj = tl.sum(tl.sum(tl.where(hit, s, 0.0), 1), 0)
        wv = tl.where(ki == j, wj, wv)
        iv = tl.where(ki == j, idx, iv)
    if RENORM:
        wv = wv / tl.sum(wv, 0)
    wv = wv * scale
    km = ki < TOPK
    tl.store(w_ptr + row * TOPK + ki, wv, mask=km)
    tl.store(id_ptr + row * TOPK + ki, iv, mask=km)


@register("moe_topk", "triton")
def moe_topk(weights, ids, gating, topk, renormalize, sigmoid, num_groups, topk_group, bias,
             scale):
    from ..backends.launch import launch
    M, E = gating.shape
    if M == 0:
        return weights, ids
    EG = E // num_groups
    launch(_topk_kernel, (M,), gating, bias if bias is not None else gating, weights, ids,
           gating.stride(0), gating.stride(1), E, EG, num_groups, topk, topk_group,
           float(scale), BLOCK_G=_np2(num_groups), BLOCK_EG=_np2(EG), BLOCK_K=_np2(topk),
           SIGMOID=sigmoid, HAS_BIAS=bias is not None, GROUPED=num_groups > 1,
           RENORM=renormalize, num_warps=4 if E >= 512 else 1)
    return weights, ids


# ----------------------------------------------------------------------------- align
@triton.jit
def _align_count_kernel(ids_ptr, cnt_ptr, numel, BLOCK: tl.constexpr):
    e = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for start in range(0, numel, BLOCK):
        i = start + tl.arange(0, BLOCK)
        v = tl.load(ids_ptr + i, mask=i < numel, other=-1)
        acc += (v == e).to(tl.int32)
    tl.store(cnt_ptr + e, tl.sum(acc, 0))


@triton.jit
def _align_scatter_kernel(ids_ptr, cnt_ptr, sorted_ptr, eids_ptr, ntpp_ptr, numel, E,
                          n_sorted, n_blocks, bs, BLOCK: tl.constexpr, BLOCK_E: tl.constexpr):
    e = tl.program_id(0)
    j = tl.arange(0, BLOCK_E)
    c = tl.load(cnt_ptr + j, mask=j < E, other=0)
    padded = (c + bs - 1) // bs * bs
    offs = tl.cumsum(padded, 0) - padded
    ar = tl.arange(0, BLOCK)
    if e == E:       # the total and the unused tail
        total = tl.sum(padded, 0)
        tl.store(ntpp_ptr + ar, total + ar * 0, mask=ar < 1)
        for start in range(total, n_sorted, BLOCK):
            i = start + ar
            tl.store(sorted_ptr + i, numel + ar * 0, mask=i < n_sorted)
        for start in range(total // bs, n_blocks, BLOCK):
            i = start + ar
            tl.store(eids_ptr + i, ar * 0 - 1, mask=i < n_blocks)
    else:
        off_e = tl.sum(tl.where(j == e, offs, 0), 0)
        cnt_e = tl.sum(tl.where(j == e, c, 0), 0)
        pad_e = tl.sum(tl.where(j == e, padded, 0), 0)
        run = cnt_e * 0
        for start in range(0, numel, BLOCK):
            i = start + ar
            v = tl.load(ids_ptr + i, mask=i < numel, other=-1)
            hit = v == e
            pos = run + tl.cumsum(hit.to(tl.int32), 0) - 1
            tl.store(sorted_ptr + off_e + pos, i, mask=hit)
            run += tl.sum(hit.to(tl.int32), 0)
        for start in range(cnt_e, pad_e, BLOCK):
            i = start + ar
            tl.store(sorted_ptr + off_e + i, numel + ar * 0, mask=i < pad_e)
        for start in range(0, pad_e // bs, BLOCK):
            i = start + ar
            tl.store(eids_ptr + off_e // bs + i, e + ar * 0, mask=i < pad_e // bs)


@register("moe_align_block_size", "triton")
def moe_align_block_size(sorted_ids, expert_ids, ntpp, topk_ids, block_size, num_experts):
    from ..backends.launch import launch
    from ..tensor import Tensor
    from .. import dtypes as _dt
    numel = topk_ids.numel()
    counts = Tensor._empty((num_experts,), _dt.int32, topk_ids.device)
    if numel:
        launch(_align_count_kernel, (num_experts,), topk_ids, counts, numel, BLOCK=1024,
               num_warps=4)
    else:
        counts.fill_(0)
    launch(_align_scatter_kernel, (num_experts + 1,), topk_ids, counts, sorted_ids,
           expert_ids, ntpp, numel, num_experts, sorted_ids.numel(), expert_ids.numel(),
           block_size, BLOCK=1024, BLOCK_E=_np2(num_experts), num_warps=4)
    return sorted_ids, expert_ids, ntpp


# ----------------------------------------------------------------------------- grouped GEMM
@triton.jit
def _moe_gemm_kernel(a_ptr, b_ptr, c_ptr, w_ptr, sorted_ptr, eids_ptr, ntpp_ptr,
                     N, K, numel, n_sorted, s_am, s_ak, s_be, s_bn, s_bk, s_cm, A_DIV,
                     GLU: tl.constexpr, ACT: tl.constexpr, MUL_W: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, PRECISION: tl.constexpr, INTERP: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(n_sorted, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % size_m
    pid_n = (pid % (GROUP_M * num_n)) // size_m
    if pid_m * BLOCK_M >= tl.load(ntpp_ptr):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + offs_m).to(tl.int64)
    tmask = slot < numel
    expert = tl.load(eids_ptr + pid_m).to(tl.int64)
    arow = slot // A_DIV
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + arow[:, None] * s_am + offs_k[None, :] * s_ak
    b_ptrs = b_ptr + expert * s_be + offs_n[None, :].to(tl.int64) * s_bn + offs_k[:, None] * s_bk
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = offs_k < K - k0
        a = tl.load(a_ptrs, mask=tmask[:, None] & km[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=km[:, None] & nmask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if GLU:
            bu = tl.load(b_ptrs + N * s_bn, mask=km[:, None] & nmask[None, :], other=0.0)
            acc_up = tl.dot(a, bu, acc_up, input_precision=PRECISION)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    if GLU:
        acc = _act(acc, ACT, INTERP) * acc_up
    if MUL_W:
        acc = acc * tl.load(w_ptr + slot, mask=tmask, other=0.0)[:, None]
    c_ptrs = c_ptr + slot[:, None] * s_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=tmask[:, None] & nmask[None, :])


@triton.jit
def _moe_reduce_kernel(c_ptr, ids_ptr, o_ptr, H, E, s_om, TOPK: tl.constexpr,
                       BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    nm = n < H
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOPK):
        e = tl.load(ids_ptr + t * TOPK + j)
        ok = (e >= 0) & (e < E)
        acc += tl.load(c_ptr + (t * TOPK + j) * H + n, mask=nm & ok, other=0.0)
    tl.store(o_ptr + t * s_om + n, acc.to(o_ptr.dtype.element_ty), mask=nm)


# ----------------------------------------------------------------------------- decode GEMVs
@triton.jit
def _moe_gemv_up_kernel(x_ptr, w_ptr, ids_ptr, h_ptr, I, K, E, s_xm, s_xk, s_we, s_wn, s_wk,
                        TOPK: tl.constexpr, ACT: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, INTERP: tl.constexpr):
    slot = tl.program_id(0).to(tl.int64)
    tok = slot // TOPK
    e = tl.load(ids_ptr + slot).to(tl.int64)
    ok = (e >= 0) & (e < E)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = (n < I) & ok
    k = tl.arange(0, BLOCK_K)
    wg = w_ptr + e * s_we + n[:, None].to(tl.int64) * s_wn + k[None, :] * s_wk
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        km = k < K - k0
        x = tl.load(x_ptr + tok * s_xm + (k0 + k) * s_xk, mask=km, other=0.0).to(tl.float32)
        m2 = nm[:, None] & km[None, :]
        acc_g += tl.load(wg, mask=m2, other=0.0).to(tl.float32) * x[None, :]
        acc_u += tl.load(wg + I * s_wn, mask=m2, other=0.0).to(tl.float32) * x[None, :]
        wg += BLOCK_K * s_wk
    h = _act(tl.sum(acc_g, 1), ACT, INTERP) * tl.sum(acc_u, 1)
    tl.store(h_ptr + slot * I + n, h.to(h_ptr.dtype.element_ty), mask=n < I)


@triton.jit
def _moe_gemv_down_kernel(h_ptr, w_ptr, ids_ptr, tw_ptr, o_ptr, H, I, E, s_we, s_wn, s_wk,
                          s_om, TOPK: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    out = tl.zeros([BLOCK_N], tl.float32)
    for j in tl.static_range(TOPK):
        slot = t * TOPK + j
        e = tl.load(ids_ptr + slot).to(tl.int64)
        ok = (e >= 0) & (e < E)
        nm = (n < H) & ok
        wd = w_ptr + e * s_we + n[:, None].to(tl.int64) * s_wn + k[None, :] * s_wk
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, I, BLOCK_K):
            km = k < I - k0
            h = tl.load(h_ptr + slot * I + k0 + k, mask=km & ok, other=0.0).to(tl.float32)
            acc += tl.load(wd, mask=nm[:, None] & km[None, :], other=0.0).to(tl.float32) \
                * h[None, :]
            wd += BLOCK_K * s_wk
        wt = tl.load(tw_ptr + slot)
        out += tl.where(ok, wt, 0.0) * tl.sum(acc, 1)
    tl.store(o_ptr + t * s_om + n, out.to(o_ptr.dtype.element_ty), mask=n < H)


def gemm_tile(dtype):
    return GEMM_TILES[2 if dtype.itemsize == 2 else 4]


@register("fused_experts", "triton")
def fused_experts(out, x, w1, w2, topk_weights, topk_ids, act):
    """out (M, H) = sum_j topk_weights[:, j] * expert_{topk_ids[:, j]}(x); act 0 silu, 1 gelu."""
    from ..backends.launch import launch
    from ..tensor import Tensor
    from .. import dtypes as _dt
    M, H = x.shape
    E, I2, _ = w1.shape
    I = I2 // 2
    topk = topk_ids.shape[1]
    numel = M * topk
    if M == 0:
        return out
    interp = x.device.type == "interp"
    prec = "ieee"
    inter = Tensor._empty((numel, I), x.dtype, x.device)
    if numel <= DECODE_MAX_SLOTS:
        BN, BK, nw = GEMV_TILE
        launch(_moe_gemv_up_kernel, (numel, _cdiv(I, BN)), x, w1, topk_ids, inter, I, H, E,
               x.stride(0), x.stride(1), *w1.stride(), TOPK=topk, ACT=act, BLOCK_N=BN,
               BLOCK_K=BK, INTERP=interp, num_warps=nw)
        launch(_moe_gemv_down_kernel, (M, _cdiv(H, BN)), inter, w2, topk_ids, topk_weights,
               out, H, I, E, *w2.stride(), out.stride(0), TOPK=topk, BLOCK_N=BN, BLOCK_K=BK,
               num_warps=nw)
        return out
    BM, BN, BK, GM, nw, ns = gemm_tile(x.dtype)
    n_sorted = numel + E * (BM - 1)
    n_blocks = _cdiv(n_sorted, BM)
    sorted_ids = Tensor._empty((n_sorted,), _dt.int32, x.device)
    eids = Tensor._empty((n_blocks,), _dt.int32, x.device)
    ntpp = Tensor._empty((1,), _dt.int32, x.device)
    moe_align_block_size(sorted_ids, eids, ntpp, topk_ids, BM, E)
    launch(_moe_gemm_kernel, (n_blocks * _cdiv(I, BN),), x, w1, inter, topk_weights,
           sorted_ids, eids, ntpp, I, H, numel, n_sorted, x.stride(0), x.stride(1),
           *w1.stride(), inter.stride(0), topk, GLU=True, ACT=act, MUL_W=False, BLOCK_M=BM,
           BLOCK_N=BN, BLOCK_K=BK, GROUP_M=GM, PRECISION=prec, INTERP=interp,
           num_warps=nw, num_stages=ns)
    down = Tensor._empty((numel, H), _dt.float32, x.device)
    launch(_moe_gemm_kernel, (n_blocks * _cdiv(H, BN),), inter, w2, down, topk_weights,
           sorted_ids, eids, ntpp, H, I, numel, n_sorted, inter.stride(0), inter.stride(1),
           *w2.stride(), down.stride(0), 1, GLU=False, ACT=act, MUL_W=True, BLOCK_M=BM,
           BLOCK_N=BN, BLOCK_K=BK, GROUP_M=GM, PRECISION=prec, INTERP=interp,
           num_warps=nw, num_stages=ns)
    RB = min(1024, _np2(H))
    launch(_moe_reduce_kernel, (M, _cdiv(H, RB)), down, topk_ids, out, H, E, out.stride(0),
           TOPK=topk, BLOCK=RB, num_warps=4)
    return out
