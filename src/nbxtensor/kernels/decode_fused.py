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
picked so the grid has >= 2 programs per SM of the 132 on an H200 where N allows.
Up to SMALL_M rows (cuda) the same kernel runs once per row, row-major in the grid so the
weight block is reused from L2; beyond that the x rows go through tl.dot (BLOCK_M = 16 rows
padded) so weights are read once for the whole batch (interp: tl.dot from M = 2, for tests).
Requirements (checked by the entry): x (M, K) and W (rows, K) with unit stride along K.
"""
from __future__ import annotations

import triton
import triton.language as tl
from ._host import cdiv as _cdiv, next_pow2 as _np2




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
def _fused_gemv1_kernel(x_ptr, w_ptr, o_ptr, nw_ptr, b_ptr, r_ptr, N, K, eps,
                        s_xm, s_wn, s_om, s_rm,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                        NORM: tl.constexpr, GLU: tl.constexpr, HAS_BIAS: tl.constexpr,
                        HAS_RES: tl.constexpr):
    # one x row against BLOCK_N weight rows; element-wise fp32 accumulation. The row index is
    # grid axis 0 (fastest): the M programs sharing a weight block run back to back, so for
    # M > 1 the block comes from HBM once and from L2 for the other rows.
    m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    rows = tl.where(nmask, offs_n, 0).to(tl.int64)       # tail rows re-read row 0 (in bounds)
    offs_k = tl.arange(0, BLOCK_K)
    x_row = x_ptr + m * s_xm
    w_rows = w_ptr + rows[:, None] * s_wn
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        if EVEN_K:
            xv = tl.load(x_row + kk).to(tl.float32)
            w = tl.load(w_rows + kk[None, :])
        else:
            kmask = kk < K
            xv = tl.load(x_row + kk, mask=kmask, other=0.0).to(tl.float32)
            w = tl.load(w_rows + kk[None, :], mask=kmask[None, :], other=0.0)
        if NORM:
            ss += xv * xv
            if EVEN_K:
                xv = xv * tl.load(nw_ptr + kk).to(tl.float32)
            else:
                xv = xv * tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * xv[None, :]
        if GLU:
            if EVEN_K:
                wu = tl.load(w_rows + N * s_wn + kk[None, :])
            else:
                wu = tl.load(w_rows + N * s_wn + kk[None, :], mask=kmask[None, :], other=0.0)
            acc_u += wu.to(tl.float32) * xv[None, :]
    y = tl.sum(acc, axis=1)
    u = tl.sum(acc_u, axis=1)
    inv = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
    y = _epilogue(y, u, inv, offs_n, nmask, m, b_ptr, r_ptr, s_rm, NORM, GLU, HAS_BIAS, HAS_RES)
    tl.store(o_ptr + m * s_om + offs_n, y.to(o_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _fused_gemvm_kernel(x_ptr, w_ptr, o_ptr, nw_ptr, b_ptr, r_ptr, M, N, K, eps,
                        s_xm, s_wn, s_om, s_rm,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        NORM: tl.constexpr, GLU: tl.constexpr, HAS_BIAS: tl.constexpr,
                        HAS_RES: tl.constexpr, PRECISION: tl.constexpr):
    # BLOCK_M x rows at once through tl.dot: the weight tile is read once for the batch
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
# of two <= 16 that still leaves >= 2 programs per
# SM (264 on the H200's 132 SMs); the tile holds 4096 weight elements (16-bit) or 2048 (fp32)
# so each of 128 threads issues 16-byte loads and keeps 32 (64 with GLU) fp32 accumulators.
# cuda, M > SMALL_M: 16 x rows, BLOCK_N 32 (16 when that gives too few programs), BLOCK_K 64.
# interp: few, large programs (the interpreter pays per program).
MIN_PROGRAMS = 2 * 132
SMALL_M = 4        # cuda: up to this many rows use the row-per-program kernel (L2 reuse)
_OVERRIDE: dict | None = None     # tests: force a config (keys as returned below)


def fused_gemv_config(M, N, K, itemsize, device_type) -> dict:
    kp = max(16, _np2(K))
    if _OVERRIDE:
        return dict(_OVERRIDE)
    if device_type != "cuda":
        if M == 1:
            return dict(BLOCK_N=min(32, _np2(N)), BLOCK_K=min(128, kp),
                        num_warps=4)
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=min(64, kp), num_warps=4)
    if M <= SMALL_M:
        bn = 16
        while bn > 1 and _cdiv(N, bn) < MIN_PROGRAMS:
            bn //= 2
        tile = 4096 if itemsize <= 2 else 2048
        return dict(BLOCK_N=bn, BLOCK_K=min(tile // bn, kp), num_warps=4)
    bn = 32 if _cdiv(N, 32) >= MIN_PROGRAMS // 2 else 16
    return dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=min(64, kp), num_warps=4, num_stages=3)


def fused_gemv(x, w, *, norm_weight=None, eps=1e-6, bias=None, residual=None, glu=False,
               out=None):
    """out (M, N) = epilogue(rmsnorm?(x) @ W^T). x (M, K); w (N, K), or (2N, K) = [gate; up]
    with glu. Validation is done by the caller (models/_ops.fused_linear)."""
    from .. import dtypes as _dt
    from ..backends.launch import launch
    from ..tensor import Tensor
    M, K = x.shape
    N = w.shape[0] // 2 if glu else w.shape[0]
    if out is None:
        out = Tensor._empty((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return out
    cfg = fused_gemv_config(M, N, K, w.dtype.itemsize, x.device.type)
    flags = dict(NORM=norm_weight is not None, GLU=bool(glu), HAS_BIAS=bias is not None,
                 HAS_RES=residual is not None)
    nw = norm_weight if norm_weight is not None else w
    b = bias if bias is not None else w
    r = residual if residual is not None else out
    s_rm = residual.stride(0) if residual is not None else 0
    opts = {k: v for k, v in cfg.items() if k in ("num_warps", "num_stages")}
    if "BLOCK_M" not in cfg:
        launch(_fused_gemv1_kernel, (M, _cdiv(N, cfg["BLOCK_N"])), x, w, out, nw, b, r,
               N, K, float(eps), x.stride(0), w.stride(0), out.stride(0), s_rm,
               BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], EVEN_K=K % cfg["BLOCK_K"] == 0,
               **flags, **opts)
    else:
        prec = "ieee" if w.dtype == _dt.float32 else "tf32"
        launch(_fused_gemvm_kernel, (_cdiv(N, cfg["BLOCK_N"]), _cdiv(M, cfg["BLOCK_M"])),
               x, w, out, nw, b, r, M, N, K, float(eps), x.stride(0), w.stride(0),
               out.stride(0), s_rm, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
               BLOCK_K=cfg["BLOCK_K"], PRECISION=prec, **flags, **opts)
    return out
