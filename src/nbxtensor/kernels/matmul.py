"""Matrix products on cuda/interp: a tiled tensor-core matmul with a fused epilogue.

One kernel serves matmul, mm, bmm, addmm, baddbmm, linear and fused_linear. The op
layer (ops/linalg.py) hands over 4-D strided views -- (B0, B1, M, K) @ (B0, B1, K, N)
-> (B0, B1, M, N), where broadcast batch dims have stride 0 and transposed inputs are
just other strides -- so no input is ever copied.

Epilogue, applied to the fp32 accumulator before the single store:
    out = act(alpha * (A @ B) + bias) + beta * residual
`bias` is a vector over N (linear's bias); `residual` is any (B0, B1, M, N) strided
view (addmm's `input`, or the residual stream of a transformer block). `act` is
none, gelu (erf), gelu_tanh, silu or relu.

Decode-shaped products (M <= GEMV_MAX_M = 16 rows, one batch) go to the GEMV kernel in
gemv.py; other products with fewer tiles than SMs split K (fp32 partials + a reduce).
"""
from __future__ import annotations

import contextlib

import triton
import triton.language as tl

from .. import autotune as _autotune   # autotune seam (autotune engineer): pick() below
from ..dispatch import register
from ._host import cdiv as _cdiv



ACTIVATIONS = {None: 0, "none": 0, "gelu": 1, "gelu_tanh": 2, "silu": 3, "relu": 4}


@triton.jit
def _apply_epilogue(acc, offs_m, offs_n, M, N, bias_ptr, s_bias, r_ptr, s_rm, s_rn, alpha, beta,
                    HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                    ACT: tl.constexpr):
    """act(alpha*acc + bias) + beta*residual, in fp32, on one [BM, BN] tile."""
    if HAS_ALPHA:
        acc = acc * alpha
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n * s_bias, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    if ACT == 1:    # gelu, erf form (torch's default approximate='none')
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    elif ACT == 2:  # gelu, tanh form: tanh(u) = 2*sigmoid(2u) - 1
        u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = 0.5 * acc * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * u)) - 1.0))
    elif ACT == 3:  # silu
        acc = acc / (1.0 + tl.exp(-acc))
    elif ACT == 4:  # relu (NaN stays NaN, as torch)
        acc = tl.where(acc < 0.0, 0.0, acc)
    if HAS_RES:
        rmask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        r = tl.load(r_ptr + offs_m[:, None].to(tl.int64) * s_rm + offs_n[None, :] * s_rn,
                    mask=rmask, other=0.0)
        acc = acc + beta * r.to(tl.float32)
    return acc


@triton.jit
def _grouped_tile(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  GROUP_M: tl.constexpr):
    """Tile index -> (pid_m, pid_n) in grouped order: GROUP_M row-blocks walk the N blocks
    together, so the B tiles they share stay in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile % num_pid_in_group) % group_size_m)
    pid_n = (tile % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _mm_tile(a_ptr, b_ptr, c_ptr, bias_ptr, r_ptr, pid_m, pid_n, M, N, K,
             s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_rm, s_rn, s_bias, alpha, beta,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             EVEN_K: tl.constexpr, HINT_M: tl.constexpr, HINT_N: tl.constexpr,
             A_K1: tl.constexpr, B_N1: tl.constexpr, B_K1: tl.constexpr,
             HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
             ACT: tl.constexpr, PRECISION: tl.constexpr, ACC_F64: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] output tile: the K loop, the epilogue, the masked store."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # rows/cols past the edge re-read row/col 0 (always in bounds): loads stay unmasked in
    # M and N, and the store is masked
    offs_am = tl.where(offs_m < M, offs_m, 0)
    offs_bn = tl.where(offs_n < N, offs_n, 0)
    # The where() hides that the offsets are contiguous runs, which would make a transposed
    # A (or a row-major B) load one element at a time. When M (N) is a multiple of 8 every
    # aligned group of 8 is wholly inside or wholly replaced by row 0's first 8 elements,
    # so the contiguity hint is true wherever it can be used for a vector load.
    if HINT_M:
        offs_am = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_M), BLOCK_M)
    if HINT_N:
        offs_bn = tl.max_contiguous(tl.multiple_of(offs_bn, BLOCK_N), BLOCK_N)
    offs_am = offs_am.to(tl.int64)
    offs_bn = offs_bn.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    if A_K1:  # a constexpr unit stride lets the compiler vectorise the loads
        a_ptrs = a_ptr + offs_am[:, None] * s_am + offs_k[None, :]
    else:
        a_ptrs = a_ptr + offs_am[:, None] * s_am + offs_k[None, :] * s_ak
    if B_N1:
        b_ptrs = b_ptr + offs_k[:, None] * s_bk + offs_bn[None, :]
    elif B_K1:
        b_ptrs = b_ptr + offs_k[:, None] + offs_bn[None, :] * s_bn
    else:
        b_ptrs = b_ptr + offs_k[:, None] * s_bk + offs_bn[None, :] * s_bn
    a_step = BLOCK_K * s_ak
    b_step = BLOCK_K * s_bk
    if A_K1:
        a_step = BLOCK_K
    if B_K1:
        b_step = BLOCK_K

    if ACC_F64:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if ACC_F64:
            acc = tl.dot(a, b, acc, out_dtype=tl.float64)
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += a_step
        b_ptrs += b_step

    acc = _apply_epilogue(acc, offs_m, offs_n, M, N, bias_ptr, s_bias, r_ptr, s_rm, s_rn,
                          alpha, beta, HAS_ALPHA, HAS_BIAS, HAS_RES, ACT)
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * s_cm + offs_n[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, r_ptr,
                   M, N, K, B1,
                   s_a0, s_a1, s_am, s_ak,
                   s_b0, s_b1, s_bk, s_bn,
                   s_c0, s_c1, s_cm, s_cn,
                   s_r0, s_r1, s_rm, s_rn,
                   s_bias, alpha, beta, K_SPLIT, SPLIT_STRIDE,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
                   HINT_M: tl.constexpr, HINT_N: tl.constexpr,
                   A_K1: tl.constexpr, B_N1: tl.constexpr, B_K1: tl.constexpr,
                   HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                   ACT: tl.constexpr, PRECISION: tl.constexpr, ACC_F64: tl.constexpr,
                   SPLIT_K: tl.constexpr):
    """One program per output tile; grid (tiles, B0 * B1) -- or, with SPLIT_K (one batch),
    grid (tiles, 1, SPLIT): program k sums K-slice [k*K_SPLIT, (k+1)*K_SPLIT) into the fp32
    workspace c + k*SPLIT_STRIDE (no epilogue; the reduce kernel applies it)."""
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    if SPLIT_K:
        pid_k = tl.program_id(2)
        k_lo = pid_k * K_SPLIT
        _mm_tile(a_ptr + k_lo * s_ak, b_ptr + k_lo * s_bk, c_ptr + pid_k.to(tl.int64) * SPLIT_STRIDE,
                 bias_ptr, r_ptr, pid_m, pid_n, M, N, min(K_SPLIT, K - k_lo),
                 s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_rm, s_rn, s_bias,
                 alpha, beta, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT_M, HINT_N, A_K1, B_N1,
                 B_K1, False, False, False, 0, PRECISION, ACC_F64)
    else:
        pid_b = tl.program_id(1).to(tl.int64)
        b0 = pid_b // B1
        b1 = pid_b % B1
        _mm_tile(a_ptr + b0 * s_a0 + b1 * s_a1, b_ptr + b0 * s_b0 + b1 * s_b1,
                 c_ptr + b0 * s_c0 + b1 * s_c1, bias_ptr, r_ptr + b0 * s_r0 + b1 * s_r1,
                 pid_m, pid_n, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_rm, s_rn, s_bias,
                 alpha, beta, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT_M, HINT_N, A_K1, B_N1,
                 B_K1, HAS_ALPHA, HAS_BIAS, HAS_RES, ACT, PRECISION, ACC_F64)


@triton.jit
def _matmul_persistent_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, r_ptr,
                              M, N, K, B1, NUM_PROGS,
                              s_a0, s_a1, s_am, s_ak,
                              s_b0, s_b1, s_bk, s_bn,
                              s_c0, s_c1, s_cm, s_cn,
                              s_r0, s_r1, s_rm, s_rn,
                              s_bias, alpha, beta, NUM_TILES, TILES_PER_BATCH,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
                              HINT_M: tl.constexpr, HINT_N: tl.constexpr,
                              A_K1: tl.constexpr, B_N1: tl.constexpr, B_K1: tl.constexpr,
                              HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr,
                              HAS_RES: tl.constexpr, ACT: tl.constexpr, PRECISION: tl.constexpr,
                              ACC_F64: tl.constexpr, FLATTEN: tl.constexpr):
    """Persistent variant: NUM_PROGS programs (one wave) stride over all tiles of all
    batches; with FLATTEN the compiler pipelines across tile boundaries too."""
    for t in tl.range(tl.program_id(0), NUM_TILES, NUM_PROGS, flatten=FLATTEN):
        pid_b = (t // TILES_PER_BATCH).to(tl.int64)
        pid_m, pid_n = _grouped_tile(t % TILES_PER_BATCH, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        b0 = pid_b // B1
        b1 = pid_b % B1
        _mm_tile(a_ptr + b0 * s_a0 + b1 * s_a1, b_ptr + b0 * s_b0 + b1 * s_b1,
                 c_ptr + b0 * s_c0 + b1 * s_c1, bias_ptr, r_ptr + b0 * s_r0 + b1 * s_r1,
                 pid_m, pid_n, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_rm, s_rn, s_bias,
                 alpha, beta, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT_M, HINT_N, A_K1, B_N1,
                 B_K1, HAS_ALPHA, HAS_BIAS, HAS_RES, ACT, PRECISION, ACC_F64)


# ------------------------------------------------------------------ launch configuration
#
# The rule (see docs/notes/opsII.md). Tiles are picked by dtype and by the M, N buckets:
#   16-bit, M >= 256 and N >= 256 : 128 x 256 x 64, 8 warps, 3 stages  (wgmma on sm_90)
#   16-bit, M >= 64               : 128 x 128 x 64, 8 warps, 4 stages
#   16-bit, M < 64                :  64 x 128 x 64, 4 warps, 4 stages
#   fp32                          : 128 x 128 x 32, 8 warps, 3 stages (64 x 64 x 32 for small M)
#   fp64                          :  64 x  64 x 16, 4 warps, 2 stages
# GROUP_M = 8 everywhere. Shared memory of each stays under 227 KB on sm_90
# (checked in tests/test_linalg.py::test_configs_compile_for_sm90).
# On interp the same rule applies (big tiles = few programs = a fast interpreter);
# `config_override` replaces it, which the tests use to force tails with tiny tiles.

_OVERRIDE: dict | None = None
NUM_SMS = 132   # H200; the persistent variant launches one program per SM
GEMV_MAX_M = 16  # up to this many rows (one batch) a product is memory-bound: gemv.py


@contextlib.contextmanager
def config_override(**cfg):
    """Force the matmul tile config (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps,
    num_stages, and PERSISTENT / NUM_PROGS / FLATTEN for the persistent variant; any
    subset) inside a `with` block -- for tests and sweeps. It also disables the GEMV path."""
    global _OVERRIDE
    old = _OVERRIDE
    _OVERRIDE = dict(cfg)
    try:
        yield
    finally:
        _OVERRIDE = old


def matmul_config(M, N, K, dtype) -> dict:
    if dtype.itemsize == 2:
        if M >= 256 and N >= 256:
            cfg = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3)
        elif M >= 64:
            cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4)
        else:
            cfg = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4)
    elif dtype.itemsize == 4:
        if M >= 64:
            cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, num_warps=8, num_stages=3)
        else:
            cfg = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=3)
    else:
        cfg = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=16, num_warps=4, num_stages=2)
    cfg["GROUP_M"] = 8
    if _OVERRIDE:
        cfg.update(_OVERRIDE)
    return cfg


def _strides4(t):
    return tuple(t.stride()) if t is not None else (0, 0, 0, 0)


@register("matmul", "triton")
def matmul(out, a, b, *, bias=None, residual=None, alpha=1.0, beta=1.0, activation=None,
           precision="ieee"):
    """out[B0,B1,M,N] = act(alpha * a @ b + bias) + beta * residual; 4-D strided views."""
    from .. import dtypes as _dt
    B0, B1, M, K = a.shape
    N = b.shape[3]
    if out.numel() == 0:
        return out
    if a.dtype not in (_dt.float16, _dt.bfloat16, _dt.float32, _dt.float64):
        raise TypeError(f"matmul: dtype {a.dtype.name} is not supported on {a.device} "
                        f"(expected float16, bfloat16, float32 or float64)")
    act = ACTIVATIONS[activation]
    if (B0 * B1 == 1 and M <= GEMV_MAX_M and K > 0 and a.dtype is not _dt.float64
            and _OVERRIDE is None):
        from .gemv import gemv
        return gemv(out, a, b, bias=bias, residual=residual, alpha=alpha, beta=beta, act=act,
                    precision=precision)
    cfg = matmul_config(M, N, K, a.dtype)
    if _OVERRIDE is None and B0 * B1 == 1:
        # autotune seam: a screened config from the user cache / shipped table, else the rule
        cfg = _autotune.pick("matmul", (M, N, K), cfg, dtype=a.dtype.name, device=a.device)
    BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    from ..backends.launch import launch
    sa, sb, sc, sr = _strides4(a), _strides4(b), _strides4(out), _strides4(residual)
    tensors = (a, b, out, bias if bias is not None else out,
               residual if residual is not None else out)
    strides = (*sa, *sb, *sc, *sr, bias.stride(0) if bias is not None else 0,
               float(alpha), float(beta))
    consts = dict(BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=cfg["GROUP_M"], EVEN_K=K % BK == 0,
                  HINT_M=M % 8 == 0, HINT_N=N % 8 == 0,
                  A_K1=sa[3] == 1, B_N1=sb[3] == 1, B_K1=sb[3] != 1 and sb[2] == 1,
                  HAS_ALPHA=alpha != 1, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
                  ACT=act, PRECISION=precision if a.dtype is _dt.float32 else "ieee",
                  ACC_F64=a.dtype is _dt.float64,
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    tiles = _cdiv(M, BM) * _cdiv(N, BN)
    if cfg.get("PERSISTENT"):
        nprog = min(tiles * B0 * B1, cfg.get("NUM_PROGS", NUM_SMS))
        launch(_matmul_persistent_kernel, (nprog,), *tensors, M, N, K, B1, nprog,
               *strides, tiles * B0 * B1, tiles,
               FLATTEN=cfg.get("FLATTEN", False), **consts)
        return out
    split = splitk_factor(M, N, K, BK, tiles, a.dtype.itemsize) if B0 * B1 == 1 else 1
    if split == 1:
        launch(_matmul_kernel, (tiles, B0 * B1), *tensors, M, N, K, B1, *strides, 0, 0,
               SPLIT_K=False, **consts)
        return out
    # fewer tiles than SMs: split K, fp32 partials, then the epilogue in the reduce kernel
    from ..tensor import Tensor
    from .gemv import splitk_reduce
    k_split = _cdiv(_cdiv(K, BK), split) * BK
    split = _cdiv(K, k_split)
    ws = Tensor._empty((split, M, N), _dt.float32, out.device)
    launch(_matmul_kernel, (tiles, 1, split), a, b, ws, ws, ws, M, N, K, 1,
           *sa, *sb, 0, 0, N, 1, 0, 0, 0, 0, 0, 1.0, 1.0, k_split, M * N,
           SPLIT_K=True, **dict(consts, HAS_ALPHA=False, HAS_BIAS=False, HAS_RES=False, ACT=0))
    # out[0, 0] / residual[0, 0] built directly (B0 == B1 == 1 here)
    splitk_reduce(ws, out._view(out._shape[2:], out._stride[2:]), bias,
                  residual._view(residual._shape[2:], residual._stride[2:])
                  if residual is not None else None, alpha, beta, act)
    return out


def splitk_factor(M, N, K, BK, tiles, itemsize) -> int:
    """How many K-slices for a one-batch product with `tiles` output tiles.

    Rule: split only when the tiles do not fill one wave of SMs; aim for ~NUM_SMS programs,
    keep >= 4 K-blocks a slice, and keep the fp32 workspace traffic (8*split*M*N bytes)
    no larger than the operands' bytes; at most 16. fp64 never splits."""
    if _OVERRIDE and "SPLIT" in _OVERRIDE:      # forced (tests, sweeps)
        return max(1, int(_OVERRIDE["SPLIT"]))
    if tiles >= NUM_SMS or itemsize == 8:
        return 1
    k_blocks = _cdiv(K, BK)
    by_traffic = (itemsize * (M * K + K * N)) // (8 * M * N)
    return max(1, min(_cdiv(NUM_SMS, tiles), k_blocks // 4, by_traffic, 16))
