"""GEMV for decode: out[M, N] = x[M, K] @ W^T with M <= 16 (W stored [N, K], as linear's).

Memory-bound: the whole weight is streamed once, so the kernel is built to keep every SM
loading. Each program owns BLOCK_N weight rows and one K-slice of length K_SPLIT
(split-K); the grid has about 4 waves of programs over the device's SMs whatever N is.
  * M == 1: the [BLOCK_N, BLOCK_K] weight tile is multiplied by the x chunk and
    accumulated element-wise in fp32 (no reduction inside the loop); one row-sum at the end.
  * 2 <= M <= 16: x is padded to 16 rows and the tile goes through tl.dot.
Loads along K are unit-stride (constexpr) when W and x are K-contiguous, so they
vectorise to 16-byte loads.
With one K-slice the epilogue (bias, activation, residual) is fused into the store;
with several, each slice writes fp32 partials to a workspace [SPLIT, M, N] and a small
second kernel sums them in a fixed order (deterministic) and applies the epilogue.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import autotune as _autotune   # autotune seam (autotune engineer): pick() below
from .. import dtypes as _dt
from .. import plans as _plans
from ..backends import launch as _bl
from ..backends.launch import launch_items as _launch_items, launch_public as _launch_public
from ..backends.cuda import driver as _cdrv, storage as _cst
from ..tensor import Size, Tensor
from .matmul import _apply_epilogue
from ._common import device_facts
from ._host import cdiv as _cdiv, next_pow2 as _np2




@triton.jit
def _gemv_tiles(w_ptrs, x_ptrs, offs_k, k_left, EVEN_K: tl.constexpr, X2D: tl.constexpr):
    """One step's weight and x tiles; past the end of K (k_left keys remain) they read 0."""
    if EVEN_K:
        w = tl.load(w_ptrs)
        xv = tl.load(x_ptrs)
    else:
        kmask = offs_k < k_left
        w = tl.load(w_ptrs, mask=kmask[None, :], other=0.0)
        if X2D:
            xv = tl.load(x_ptrs, mask=kmask[None, :], other=0.0)
        else:
            xv = tl.load(x_ptrs, mask=kmask, other=0.0)
    return w, xv


@triton.jit
def _gemv_advance(w_ptrs, x_ptrs, s_wk, s_xk, BLOCK_K: tl.constexpr, K1: tl.constexpr):
    """Both pointer tiles one BLOCK_K step along K (int64 steps for strided K)."""
    if K1:
        return w_ptrs + BLOCK_K, x_ptrs + BLOCK_K
    return (w_ptrs + tl.full([], BLOCK_K, tl.int64) * s_wk,
            x_ptrs + tl.full([], BLOCK_K, tl.int64) * s_xk)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, o_ptr, bias_ptr, r_ptr, ws_ptr,
                 M, N, K, K_SPLIT, SPLIT,
                 s_xm, s_xk, s_wn, s_wk, s_om, s_on, s_rm, s_rn, s_bias, alpha, beta,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 K1: tl.constexpr, EVEN_K: tl.constexpr, PARTIAL: tl.constexpr,
                 HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                 ACT: tl.constexpr, PRECISION: tl.constexpr):
    """PARTIAL: fp32 partial sums of K-slice pid_k into ws[pid_k] (contiguous [SPLIT, M,
    N]), reduced by `_splitk_reduce_kernel`; else the epilogue and the store directly (one
    slice)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    k_lo = pid_k * K_SPLIT
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_wn = tl.where(offs_n < N, offs_n, 0).to(tl.int64)   # tail rows re-read row 0
    offs_k = tl.arange(0, BLOCK_K)
    # K offsets times a non-unit K stride in int64 (W^T views of wide weights exceed int32)
    offs_k64 = (k_lo + offs_k).to(tl.int64)
    if K1:
        w_ptrs = w_ptr + offs_wn[:, None] * s_wn + (k_lo + offs_k)[None, :]
    else:
        w_ptrs = w_ptr + offs_wn[:, None] * s_wn + offs_k64[None, :] * s_wk
    offs_m = tl.arange(0, BLOCK_M)
    if BLOCK_M == 1:
        if K1:
            x_ptrs = x_ptr + k_lo + offs_k
        else:
            x_ptrs = x_ptr + offs_k64 * s_xk
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for kk in range(0, K_SPLIT, BLOCK_K):
            k = k_lo + kk
            w, xv = _gemv_tiles(w_ptrs, x_ptrs, offs_k, K - k, EVEN_K, False)
            acc2 += w.to(tl.float32) * xv.to(tl.float32)[None, :]
            w_ptrs, x_ptrs = _gemv_advance(w_ptrs, x_ptrs, s_wk, s_xk, BLOCK_K, K1)
        acc = tl.sum(acc2, axis=1)[None, :]
    else:
        offs_xm = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
        if K1:
            x_ptrs = x_ptr + offs_xm[:, None] * s_xm + (k_lo + offs_k)[None, :]
        else:
            x_ptrs = x_ptr + offs_xm[:, None] * s_xm + offs_k64[None, :] * s_xk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(0, K_SPLIT, BLOCK_K):
            k = k_lo + kk
            w, xv = _gemv_tiles(w_ptrs, x_ptrs, offs_k, K - k, EVEN_K, True)
            acc = tl.dot(xv, tl.trans(w), acc, input_precision=PRECISION)
            w_ptrs, x_ptrs = _gemv_advance(w_ptrs, x_ptrs, s_wk, s_xk, BLOCK_K, K1)
    omask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if PARTIAL:   # fp32 partial sums into workspace[pid_k]; contiguous [SPLIT, M, N]
        p_ptrs = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.store(p_ptrs + pid_k.to(tl.int64) * M * N, acc, mask=omask)
    else:
        acc = _apply_epilogue(acc, offs_m, offs_n, M, N, bias_ptr, s_bias, r_ptr, s_rm, s_rn,
                              alpha, beta, HAS_ALPHA, HAS_BIAS, HAS_RES, ACT)
        o_ptrs = o_ptr + offs_m[:, None].to(tl.int64) * s_om + offs_n[None, :] * s_on
        tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=omask)


@triton.jit
def _splitk_reduce_kernel(ws_ptr, o_ptr, bias_ptr, r_ptr, M, N, SPLIT,
                          s_om, s_on, s_rm, s_rn, s_bias, alpha, beta,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                          ACT: tl.constexpr):
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = ws_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(0, SPLIT):   # fixed order: the result does not depend on scheduling
        acc += tl.load(ptrs, mask=mask, other=0.0)
        ptrs += M * N
    acc = _apply_epilogue(acc, offs_m, offs_n, M, N, bias_ptr, s_bias, r_ptr, s_rm, s_rn,
                          alpha, beta, HAS_ALPHA, HAS_BIAS, HAS_RES, ACT)
    tl.store(o_ptr + offs_m[:, None].to(tl.int64) * s_om + offs_n[None, :] * s_on,
             acc.to(o_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------ launch configuration
#
# Rule: BLOCK_K = 256 for 16-bit weights (512 contiguous bytes per row per step), 128 for
# fp32; BLOCK_N = 32 rows for M == 1 (a 32 x 256 tile = 64 fp32 accumulators a thread at
# 4 warps) and 64 for the tl.dot path. The K split is chosen so that the grid has about
# WAVES programs per SM of the device (4 waves) and never more slices than K blocks; rows of
# at most NOSPLIT_ROW_BYTES are never split (`k_slices`). TARGET_PROGRAMS, when set, forces
# the program count instead (tests and sweeps).
WAVES = 4
TARGET_PROGRAMS: int | None = None
# H200, bf16 M = 1 (`bench_matmul.py --small-gemv`, GPU time over rotated weights): K = 576 and 1024 ran as fast or faster in one launch (576x576 3.9 vs 10.0 us
# split, 1024x1024 5.2 vs 5.5), K = 1536 and 2048 were faster split (1536x576 5.35 vs 5.70,
# 2048x2048 7.0 vs 7.5 us); and one launch halves the host's cost of the call.
NOSPLIT_ROW_BYTES = 2048
_OVERRIDE: dict | None = None


def k_slices(N, K, cfg, itemsize) -> int:
    """How many K slices a GEMV config launches: enough programs for cfg TARGET, at most
    one per K block, and one (no split, no reduce launch) for rows of <= NOSPLIT_ROW_BYTES.
    The autotune sweep uses it to tell configs that launch the same apart."""
    if K * itemsize <= NOSPLIT_ROW_BYTES:
        return 1
    return max(1, min(_cdiv(K, cfg["BLOCK_K"]), _cdiv(cfg["TARGET"], _cdiv(N, cfg["BLOCK_N"]))))


def gemv_config(M, N, K, dtype, dev, device=None) -> dict:
    """The launch config for `dev` (kernels/_common.DeviceFacts); with `device` (the
    Device it runs on) the autotune pick may replace the rule's."""
    bk = 256 if dtype.itemsize == 2 else 128
    target = TARGET_PROGRAMS if TARGET_PROGRAMS is not None else WAVES * dev.sms
    if M == 1:
        cfg = dict(BLOCK_M=1, BLOCK_N=32, BLOCK_K=min(bk, max(16, _np2(K))), num_warps=4,
                   num_stages=4, TARGET=target)
    else:
        # 2..16 rows through tl.dot: 32 x 128 weight tiles, 4 warps and one wave of programs
        # (target // 4: fewer K slices, longer pipelined K loops). H200 (`bench_matmul.py
        # --m16-sweep`, M = 16 bf16, the 1B linears, torch time / ours): 0.71-1.02x against
        # 0.54-0.99x for 64 x 256 tiles / 8 warps / 4 waves (2048x8192 0.56 -> 0.99x,
        # 8192x2048 0.54 -> 0.84x, 2048x2048 0.54 -> 0.71x)
        cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=min(128, max(16, _np2(K))), num_warps=4,
                   num_stages=4, TARGET=max(1, target // 4))
    if _OVERRIDE:   # for sweeps: any of the keys above (K_SPLIT is always derived)
        cfg.update(_OVERRIDE)
    elif device is not None:
        # autotune seam: a screened config from the user cache / shipped table, else the rule
        cfg = _autotune.pick("gemv", (M, N, K), cfg, dtype=dtype.name, device=device)
    bk = cfg["BLOCK_K"]
    cfg["K_SPLIT"] = _cdiv(_cdiv(K, bk), k_slices(N, K, cfg, dtype.itemsize)) * bk
    return cfg


# Launch plans of `gemv` by everything it derives a launch from: the views' dtypes, shapes
# and strides (bias and residual too), alpha != 1, act, precision, the device, and the
# switches TARGET_PROGRAMS and NOSPLIT_ROW_BYTES; the autotune pick by autotune.generation
# (bumped by reload()) and autotune._off (disabled()). Sweeps (_OVERRIDE set) never use or
# record one.
# A plan holds no tensors: each call builds its views on its own storages and offsets.
_PLANS = _plans.PlanCache("kernels.gemv", 4096)


# Split-K workspaces kept between calls: (ws shape, device index, current stream handle)
# -> list of free fp32 [split, M, N] tensors (at most 2 per key; interp: (shape, "interp", 0)).
# The kernels write every element they read, so no contents carry over. Not used while any
# CUDA graph is being captured (the capture allocates from its private pool, and a cached
# buffer baked into a graph would be shared with eager calls on another stream).
# Only workspaces up to _WS_BYTES are kept (the small calls, where the host cost shows), so
# at most _WS_MAX * 2 * _WS_BYTES stay allocated (the least recently used key goes first).
# clear_workspaces() or plans.clear_all() drops them all (e.g. before empty_cache()).
_WS_MAX = 64
_WS = _plans.PlanCache("kernels.gemv.workspaces", _WS_MAX)
_WS_BYTES = 1 << 20


def clear_workspaces() -> None:
    _WS.clear()


def _key(out, a, b, bias, residual, alpha, act, precision):
    dev = a._storage.device
    return (a._dtype, a._shape, a._stride, b._dtype, b._shape, b._stride, out._dtype,
            out._shape, out._stride,
            None if bias is None else (bias._dtype, bias._shape, bias._stride),
            None if residual is None else (residual._dtype, residual._shape, residual._stride),
            alpha != 1, act, precision, dev.type, dev.index, TARGET_PROGRAMS,
            NOSPLIT_ROW_BYTES, _autotune._off, _autotune.generation)


def _plan(out, a, b, bias, residual, alpha, act, precision):
    """(form, M, N, launches...) for `_run`: everything but the tensors and alpha/beta."""
    M, K = a._shape[2:]
    N = b._shape[3]
    # x [M, K], w [N, K] (b[0, 0].t()), o [M, N]: the (1, 1, ...) views' last two dims
    xv = (Size((M, K)), a._stride[2:])
    wv = (Size((N, K)), (b._stride[3], b._stride[2]))
    ov = (out._shape[2:], out._stride[2:])
    rv = (residual._shape[2:], residual._stride[2:]) if residual is not None else None
    cfg = gemv_config(M, N, K, a._dtype, device_facts(a.device), a.device)
    bk, ks = cfg["BLOCK_K"], cfg["K_SPLIT"]
    split = _cdiv(K, ks) if K else 1
    xs, wst, os_ = xv[1], wv[1], ov[1]
    k1 = wst[1] == 1 and xs[1] == 1
    rs = rv[1] if rv is not None else (0, 0)
    flags = dict(HAS_ALPHA=alpha != 1, HAS_BIAS=bias is not None, HAS_RES=rv is not None,
                 ACT=act)
    s_bias = bias._stride[0] if bias is not None else 0
    grid = (_cdiv(N, cfg["BLOCK_N"]), split)
    prec = precision if a._dtype is _dt.float32 else "ieee"
    common = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=bk, K1=k1,
                  EVEN_K=K % ks == 0, PRECISION=prec, num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"])
    views = (xv, wv, ov, rv)
    if split == 1:
        items = tuple(dict(PARTIAL=False, **flags, **common).items())
        ints = (M, N, K, max(ks, bk), 1, *xs, *wst, *os_, *rs, s_bias)
        return ("one", views, grid, ints, items)
    ws_shape = Size((split, M, N))
    items = tuple(dict(PARTIAL=True, HAS_ALPHA=False, HAS_BIAS=False,
                       HAS_RES=False, ACT=0, **common).items())
    ints = (M, N, K, ks, split, *xs, *wst, 0, 0, 0, 0, 0, 1.0, 1.0)
    return ("split", views, grid, ints, items, ws_shape,
            _reduce_plan(split, M, N, os_, rs, bias, rv is not None, alpha, act),
            split * M * N * 4 <= _WS_BYTES)


def _go(kernel, grid, args, items):
    """launch_items, or the module's `launch` when something (a test's spy) replaced it."""
    lp = _bl.launch
    if lp is _launch_public:
        _launch_items(kernel, grid, args, items)
    else:
        lp(kernel, grid, *args, **dict(items))


def _run(plan, out, a, b, bias, residual, alpha, beta):
    form, grid = plan[0], plan[2]
    # The launchers (cuda and interp) read a tensor argument's storage, offset and dtype
    # only; the 2-D views' shapes and strides are in the plan's int args. So the 4-D views
    # go as they are (same storage, offset, dtype as the 2-D views `_plan` describes).
    x, w, o, r = a, b, out, residual
    if form == "one":
        _go(_gemv_kernel, grid, (x, w, o, bias if bias is not None else o,
                                 r if r is not None else o, o, *plan[3],
                                 float(alpha), float(beta)), plan[4])
        return out
    dev = out._storage.device
    if not plan[7]:
        wkey = None
    elif dev.type == "cuda":
        if _cdrv._capturing:    # a graph's workspace comes from its own pool and stays its own
            wkey = None
        else:
            wkey = (plan[5], dev.index or 0, _cst._stream_handle(dev.index or 0))
    else:
        wkey = (plan[5], dev.type, 0)
    free = _WS.get(wkey) if wkey is not None else None
    try:
        ws = free.pop()
    except (AttributeError, IndexError):    # none cached (or not cacheable): a fresh one
        ws = Tensor._empty(plan[5], _dt.float32, dev)
    _go(_gemv_kernel, grid, (x, w, ws, ws, ws, ws, *plan[3]), plan[4])
    _reduce_run(plan[6], ws, o, bias, r, alpha, beta)
    if wkey is not None:
        # both launches are queued on this stream, so the next user of this key (same
        # stream) runs after them; pop/append are atomic, so two threads never share one
        if free is None:
            free = []
            _WS.put(wkey, free)
        if len(free) < 2:
            free.append(ws)
    return out


def gemv(out, a, b, *, bias, residual, alpha, beta, act, precision):
    """a: (1,1,M,K) view of x; b: (1,1,K,N) view (W^T for linear); out: (1,1,M,N)."""
    if _OVERRIDE:       # a sweep's config: planned afresh every call, never kept
        return _run(_plan(out, a, b, bias, residual, alpha, act, precision), out, a, b, bias,
                    residual, alpha, beta)
    key = _key(out, a, b, bias, residual, alpha, act, precision)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(out, a, b, bias, residual, alpha, act, precision)
        _PLANS.put(key, plan)
    return _run(plan, out, a, b, bias, residual, alpha, beta)


def _reduce_plan(split, M, N, os_, rs, bias, has_res, alpha, act):
    bm = min(_np2(M), 16)
    bn = 128
    items = (("BLOCK_M", bm), ("BLOCK_N", bn), ("HAS_ALPHA", alpha != 1),
             ("HAS_BIAS", bias is not None), ("HAS_RES", has_res),
             ("ACT", act), ("num_warps", 4))
    return (_cdiv(N, bn), _cdiv(M, bm)), (M, N, split, *os_, *rs,
                                         bias._stride[0] if bias is not None else 0), items


def _reduce_run(rplan, ws, o, bias, r, alpha, beta):
    grid, ints, items = rplan
    _go(_splitk_reduce_kernel, grid, (ws, o, bias if bias is not None else o,
                                      r if r is not None else o, *ints, float(alpha),
                                      float(beta)), items)


def splitk_reduce(ws, o, bias, r, alpha, beta, act):
    """o[M, N] = epilogue(sum_s ws[s]) with ws a contiguous fp32 [SPLIT, M, N] (fixed order)."""
    split, M, N = ws._shape
    rs = r._stride if r is not None else (0, 0)
    rplan = _reduce_plan(split, M, N, o._stride, rs, bias, r is not None, alpha, act)
    _reduce_run(rplan, ws, o, bias, r, alpha, beta)
