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
gemv.py, and so do their transposes (N <= GEMV_MAX_M columns, no bias: out^T = b^T @ a^T);
other products with fewer tiles than SMs may split K (fp32 partials + a reduce), as the
cost model behind `matmul_config` decides.

Loads vectorise (16-byte cp.async, pipelined) only where the compiler can prove 16-byte
aligned rows: strides that are multiples of 16 bytes are proven through A_DIV/B_DIV, and
operands that are not aligned at all (K = 4093 rows) are first copied into a padded buffer
when the product is big enough (`_pad_copy`). The K tail is one peeled, masked step.

`_matmul_tma_kernel` is a Hopper variant for one-batch 16-bit and fp32 products (TMA tile
loads via device-built descriptors, persistent over tiles and K slices or one item a
program, descriptor stores; a K split writes fp32 partials that the GEMV family's reduce
kernel finishes). Which kernel, tile and split run is one cost model, `_rule`, over both
kernels' candidates: `config_override(TMA=True)` forces the TMA kernel, `TMA_BIG = None`
keeps every product on the tiled kernel.
"""
from __future__ import annotations

import contextlib
import math

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import autotune as _autotune   # autotune seam (autotune engineer): pick() below
from .. import dtypes as _dt
from .. import plans as _plans
from ..dispatch import register
from ._common import device_facts
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
def _scale_operand(s0, s1, s_x, s_y, X1: tl.constexpr, Y1: tl.constexpr, DIV: tl.constexpr):
    """One operand's strides times DIV: the batch strides s0/s1, and of the pair (s_x, s_y)
    the one that is not the unit stride (s_x when Y1, s_y when X1)."""
    if DIV > 1:
        s0 = s0 * DIV
        s1 = s1 * DIV
        if Y1:
            s_x = s_x * DIV
        if X1:
            s_y = s_y * DIV
    return s0, s1, s_x, s_y


@triton.jit
def _scale_strides(s_a0, s_a1, s_am, s_ak, s_b0, s_b1, s_bk, s_bn,
                   A_K1: tl.constexpr, A_M1: tl.constexpr, B_N1: tl.constexpr,
                   B_K1: tl.constexpr, A_DIV: tl.constexpr, B_DIV: tl.constexpr):
    """The host passes an operand's non-unit strides divided by A_DIV/B_DIV (16 bytes in
    elements when they all divide). Multiplying by the constexpr here tells the compiler
    every row start is 16-byte aligned, so loads vectorise (cp.async 16 B) even when the
    stride is, e.g., 1000 -- the launcher's own hint only covers multiples of 16."""
    s_a0, s_a1, s_am, s_ak = _scale_operand(s_a0, s_a1, s_am, s_ak, A_M1, A_K1, A_DIV)
    s_b0, s_b1, s_bk, s_bn = _scale_operand(s_b0, s_b1, s_bk, s_bn, B_K1, B_N1, B_DIV)
    return s_a0, s_a1, s_am, s_ak, s_b0, s_b1, s_bk, s_bn


@triton.jit
def _mm_tile(a_ptr, b_ptr, c_ptr, bias_ptr, r_ptr, pid_m, pid_n, M, N, K, M_LD, N_LD,
             s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_rm, s_rn, s_bias, alpha, beta,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             EVEN_K: tl.constexpr, HINT_M: tl.constexpr, HINT_N: tl.constexpr,
             A_K1: tl.constexpr, A_M1: tl.constexpr, B_N1: tl.constexpr, B_K1: tl.constexpr,
             HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
             ACT: tl.constexpr, PRECISION: tl.constexpr, ACC_F64: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] output tile: the K loop, the epilogue, the masked store."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # rows/cols past the edge re-read row/col 0 (always in bounds): loads stay unmasked in
    # M and N, and the store is masked. M_LD/N_LD >= M/N: the rows/cols that may be read
    # (a padded operand copy has in-bounds columns up to the next multiple of 8, which
    # keeps the contiguity hint below true; what they hold only reaches masked outputs).
    offs_am = tl.where(offs_m < M_LD, offs_m, 0)
    offs_bn = tl.where(offs_n < N_LD, offs_n, 0)
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
    # K offsets times a non-unit K stride in int64: a transposed A of >= 2**31 / BLOCK_K rows
    # (or a row-major B that wide) would overflow int32
    offs_k64 = offs_k.to(tl.int64)
    if A_K1:  # a constexpr unit stride lets the compiler vectorise the loads
        a_ptrs = a_ptr + offs_am[:, None] * s_am + offs_k[None, :]
    elif A_M1:
        a_ptrs = a_ptr + offs_am[:, None] + offs_k64[None, :] * s_ak
    else:
        a_ptrs = a_ptr + offs_am[:, None] * s_am + offs_k64[None, :] * s_ak
    if B_N1:
        b_ptrs = b_ptr + offs_k64[:, None] * s_bk + offs_bn[None, :]
    elif B_K1:
        b_ptrs = b_ptr + offs_k[:, None] + offs_bn[None, :] * s_bn
    else:
        b_ptrs = b_ptr + offs_k64[:, None] * s_bk + offs_bn[None, :] * s_bn
    a_step = tl.full([], BLOCK_K, tl.int64) * s_ak
    b_step = tl.full([], BLOCK_K, tl.int64) * s_bk
    if A_K1:
        a_step = BLOCK_K
    if B_K1:
        b_step = BLOCK_K

    if ACC_F64:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Full K blocks unmasked; the tail (K % BLOCK_K) peeled into one masked step. A mask
    # inside the loop would have a runtime bound, so the compiler could not prove it is
    # constant over 8-element groups and would load element by element every step.
    for k in range(0, K // BLOCK_K):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        if ACC_F64:
            acc = tl.dot(a, b, acc, out_dtype=tl.float64)
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += a_step
        b_ptrs += b_step
    if not EVEN_K:
        k_left = K % BLOCK_K
        if k_left > 0:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            if ACC_F64:
                acc = tl.dot(a, b, acc, out_dtype=tl.float64)
            else:
                acc = tl.dot(a, b, acc, input_precision=PRECISION)

    acc = _apply_epilogue(acc, offs_m, offs_n, M, N, bias_ptr, s_bias, r_ptr, s_rm, s_rn,
                          alpha, beta, HAS_ALPHA, HAS_BIAS, HAS_RES, ACT)
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * s_cm + offs_n[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _batch_tile(a_ptr, b_ptr, c_ptr, bias_ptr, r_ptr, pid_b, B1, s_a0, s_a1, s_b0, s_b1,
                s_c0, s_c1, s_r0, s_r1, pid_m, pid_n, M, N, K, M_LD, N_LD,
                s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_rm, s_rn, s_bias, alpha, beta,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                EVEN_K: tl.constexpr, HINT_M: tl.constexpr, HINT_N: tl.constexpr,
                A_K1: tl.constexpr, A_M1: tl.constexpr, B_N1: tl.constexpr, B_K1: tl.constexpr,
                HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                ACT: tl.constexpr, PRECISION: tl.constexpr, ACC_F64: tl.constexpr):
    """Output tile (pid_m, pid_n) of batch pid_b (int64; B0 * B1 batches, B1 the inner)."""
    b0 = pid_b // B1
    b1 = pid_b % B1
    _mm_tile(a_ptr + b0 * s_a0 + b1 * s_a1, b_ptr + b0 * s_b0 + b1 * s_b1,
             c_ptr + b0 * s_c0 + b1 * s_c1, bias_ptr, r_ptr + b0 * s_r0 + b1 * s_r1,
             pid_m, pid_n, M, N, K, M_LD, N_LD, s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_rm, s_rn,
             s_bias, alpha, beta, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT_M, HINT_N, A_K1, A_M1,
             B_N1, B_K1, HAS_ALPHA, HAS_BIAS, HAS_RES, ACT, PRECISION, ACC_F64)


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, r_ptr,
                   M, N, K, B1, M_LD, N_LD,
                   s_a0, s_a1, s_am, s_ak,
                   s_b0, s_b1, s_bk, s_bn,
                   s_c0, s_c1, s_cm, s_cn,
                   s_r0, s_r1, s_rm, s_rn,
                   s_bias, alpha, beta, K_SPLIT, SPLIT_STRIDE, NUM_PROGS, NUM_TILES,
                   TILES_PER_BATCH,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
                   HINT_M: tl.constexpr, HINT_N: tl.constexpr,
                   A_K1: tl.constexpr, A_M1: tl.constexpr, B_N1: tl.constexpr,
                   B_K1: tl.constexpr, A_DIV: tl.constexpr, B_DIV: tl.constexpr,
                   HAS_ALPHA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                   ACT: tl.constexpr, PRECISION: tl.constexpr, ACC_F64: tl.constexpr,
                   SPLIT_K: tl.constexpr, PERSISTENT: tl.constexpr, FLATTEN: tl.constexpr,
                   C_DIV: tl.constexpr):
    """One program per output tile; grid (tiles, B0 * B1) -- or, with SPLIT_K (one batch),
    grid (tiles, 1, SPLIT): program k sums K-slice [k*K_SPLIT, (k+1)*K_SPLIT) into the fp32
    workspace c + k*SPLIT_STRIDE (no epilogue; the reduce kernel applies it) -- or,
    PERSISTENT, grid (NUM_PROGS,): one wave striding over the NUM_TILES tiles of all batches
    (TILES_PER_BATCH each), with FLATTEN pipelined across tile boundaries too."""
    s_a0, s_a1, s_am, s_ak, s_b0, s_b1, s_bk, s_bn = _scale_strides(
        s_a0, s_a1, s_am, s_ak, s_b0, s_b1, s_bk, s_bn, A_K1, A_M1, B_N1, B_K1, A_DIV, B_DIV)
    if C_DIV > 1:
        # N and the output's row and batch strides come divided by C_DIV (16 bytes in
        # elements): multiplied back, they prove every output row 16-byte aligned and the
        # N mask constant over 16-byte groups, so the stores vectorise (N = 1000 rows stored
        # element by element otherwise)
        N = N * C_DIV
        s_c0 = s_c0 * C_DIV
        s_c1 = s_c1 * C_DIV
        s_cm = s_cm * C_DIV
    if PERSISTENT:
        for t in tl.range(tl.program_id(0), NUM_TILES, NUM_PROGS, flatten=FLATTEN):
            pid_m, pid_n = _grouped_tile(t % TILES_PER_BATCH, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            _batch_tile(a_ptr, b_ptr, c_ptr, bias_ptr, r_ptr,
                        (t // TILES_PER_BATCH).to(tl.int64), B1, s_a0, s_a1, s_b0, s_b1,
                        s_c0, s_c1, s_r0, s_r1, pid_m, pid_n, M, N, K, M_LD, N_LD,
                        s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_rm, s_rn, s_bias,
                        alpha, beta, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT_M, HINT_N,
                        A_K1, A_M1, B_N1, B_K1, HAS_ALPHA, HAS_BIAS, HAS_RES, ACT, PRECISION,
                        ACC_F64)
    elif SPLIT_K:
        pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        pid_k = tl.program_id(2)
        k_lo = pid_k * K_SPLIT
        a_k = k_lo if A_K1 else k_lo.to(tl.int64) * s_ak   # constexpr unit strides keep
        b_k = k_lo if B_K1 else k_lo.to(tl.int64) * s_bk   # the alignment
        _mm_tile(a_ptr + a_k, b_ptr + b_k, c_ptr + pid_k.to(tl.int64) * SPLIT_STRIDE,
                 bias_ptr, r_ptr, pid_m, pid_n, M, N, min(K_SPLIT, K - k_lo), M_LD, N_LD,
                 s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_rm, s_rn, s_bias,
                 alpha, beta, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT_M, HINT_N, A_K1, A_M1,
                 B_N1, B_K1, False, False, False, 0, PRECISION, ACC_F64)
    else:
        pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        _batch_tile(a_ptr, b_ptr, c_ptr, bias_ptr, r_ptr, tl.program_id(1).to(tl.int64), B1,
                    s_a0, s_a1, s_b0, s_b1, s_c0, s_c1, s_r0, s_r1, pid_m, pid_n, M, N, K,
                    M_LD, N_LD, s_am, s_ak, s_bk, s_bn, s_cm, s_cn, s_rm, s_rn, s_bias,
                    alpha, beta, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, HINT_M, HINT_N, A_K1, A_M1,
                    B_N1, B_K1, HAS_ALPHA, HAS_BIAS, HAS_RES, ACT, PRECISION, ACC_F64)


# ------------------------------------------------------------------ TMA variant (Hopper)

@triton.jit
def _tma_acc(a_desc, b_desc, om, on, k0, k_tiles, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
             PRECISION: tl.constexpr):
    """The fp32 accumulator of the tile at rows om.., cols on.. over k_tiles K blocks from k0
    (TMA loads, no masks: reads past K are zero-filled)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(k_tiles):
        ok = k0 + ki * BLOCK_K
        if A_T:
            a = a_desc.load([ok, om]).T
        else:
            a = a_desc.load([om, ok])
        if B_T:
            b = b_desc.load([on, ok]).T
        else:
            b = b_desc.load([ok, on])
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _tma_store(acc, c_desc, c_ptr, pid_m, pid_n, M, N, s_c, s_cn, bias_ptr, s_bias, r_ptr,
               s_rm, s_rn, alpha, beta, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               C_DESC: tl.constexpr, SUBTILE: tl.constexpr, HAS_ALPHA: tl.constexpr,
               HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr):
    """Epilogue and store of one tile: a descriptor store (clipped at M, N; SUBTILE: two
    half-width stores, half the staging smem, the second half's conversion overlapping the
    first's store) or a masked pointer store."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _apply_epilogue(acc, offs_m, offs_n, M, N, bias_ptr, s_bias, r_ptr, s_rm, s_rn,
                          alpha, beta, HAS_ALPHA, HAS_BIAS, HAS_RES, ACT)
    if C_DESC:
        if SUBTILE:
            acc = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            c0, c1 = tl.split(acc)
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], c0.to(c_ptr.dtype.element_ty))
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2],
                         c1.to(c_ptr.dtype.element_ty))
        else:
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
    else:
        c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * s_c + offs_n[None, :] * s_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _tma_item(t, M, N, K, K_SPLIT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SPLIT: tl.constexpr):
    """Work item t -> (pid_m, pid_n, first K element, K slice). With SPLIT the items are
    slice-major (every tile of slice 0, then of slice 1, ...: programs running together
    share operand rows in L2); else an item is a tile and covers all of K."""
    if SPLIT:
        tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        ks = t // tiles
        t = t % tiles
    else:
        ks = 0
    pid_m, pid_n = _grouped_tile(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    return pid_m, pid_n, ks * K_SPLIT, ks


@triton.jit
def _ws_store(acc, w_desc, ks, pid_m, pid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A K slice's fp32 partial tile into plane ks of the [slices, M, N] workspace, as two
    half-width descriptor stores (half the staging shared memory; clipped at M, N). No
    epilogue: the reduce kernel applies it once to the sum."""
    acc = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
    c0, c1 = tl.split(acc)
    w_desc.store([ks, pid_m * BLOCK_M, pid_n * BLOCK_N], tl.reshape(c0, (1, BLOCK_M, BLOCK_N // 2)))
    w_desc.store([ks, pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2],
                 tl.reshape(c1, (1, BLOCK_M, BLOCK_N // 2)))


@triton.jit
def _matmul_tma_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, r_ptr, M, N, K, NUM_PROGS, NUM_TILES,
                       s_a, s_b, s_c, s_cn, s_rm, s_rn, s_bias, alpha, beta, K_SPLIT,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr,
                       C_DESC: tl.constexpr, SUBTILE: tl.constexpr, PERSISTENT: tl.constexpr,
                       FLATTEN: tl.constexpr, HAS_ALPHA: tl.constexpr,
                       HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
                       SPLIT: tl.constexpr, PRECISION: tl.constexpr):
    """One-batch product with TMA tile loads (device-built tensor descriptors): 16-bit, or
    fp32 at PRECISION ("tf32" or "ieee").

    A is [M, K] row-major (A_T: stored [K, M], i.e. a transposed view), B is [K, N]
    row-major (B_T: stored [N, K], linear's weight); s_a / s_b are the non-unit strides.
    C is stored through a descriptor (C_DESC: unit column stride, s_c its row stride) or
    by pointers (s_c, s_cn). TMA zero-fills reads past M, N and K, so the K loop has no
    mask and no peeled tail, and descriptor stores clip at M, N.
    PERSISTENT: NUM_PROGS programs stride over NUM_TILES work items (FLATTEN pipelines
    across item boundaries); else one item a program. SPLIT: an item is (tile, K slice of
    K_SPLIT elements, a multiple of BLOCK_K, so every item runs the same number of K
    blocks) and c_ptr is the fp32 workspace [slices, M, N]. No warp specialisation: Triton 3.6 on
    sm_90 was seen to compute wrong results with it when programs run different trip
    counts (a persistent loop does), and for this kernel it was not lowered at 8 warps
    (no setmaxnreg in the PTX) and failed to compile at 4."""
    if A_T:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[K, M], strides=[s_a, 1],
                                           block_shape=[BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[s_a, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
    if B_T:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[s_b, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[s_b, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
    c_desc = c_ptr
    if SPLIT:   # the fp32 workspace [slices, M, N] (N a multiple of 4: 16-byte rows)
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[tl.cdiv(K, K_SPLIT), M, N],
                                           strides=[M * N, N, 1],
                                           block_shape=[1, BLOCK_M, BLOCK_N // 2])
    elif C_DESC:
        if SUBTILE:
            c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[s_c, 1],
                                               block_shape=[BLOCK_M, BLOCK_N // 2])
        else:
            c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[s_c, 1],
                                               block_shape=[BLOCK_M, BLOCK_N])
    if SPLIT:
        k_tiles = K_SPLIT // BLOCK_K
    else:
        k_tiles = tl.cdiv(K, BLOCK_K)
    if PERSISTENT:
        # the epilogue's item index runs on its own counter (as Triton's persistent
        # tutorial): with FLATTEN the next item's loads are issued under this epilogue
        item_c = tl.program_id(0) - NUM_PROGS
        for t in tl.range(tl.program_id(0), NUM_TILES, NUM_PROGS, flatten=FLATTEN):
            pid_m, pid_n, k0, ks = _tma_item(t, M, N, K, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K,
                                             GROUP_M, SPLIT)
            acc = _tma_acc(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k0, k_tiles,
                           BLOCK_M, BLOCK_N, BLOCK_K, A_T, B_T, PRECISION)
            item_c += NUM_PROGS
            pid_m, pid_n, k0, ks = _tma_item(item_c, M, N, K, K_SPLIT, BLOCK_M, BLOCK_N,
                                             BLOCK_K, GROUP_M, SPLIT)
            _tma_finish(acc, c_desc, c_ptr, pid_m, pid_n, ks, M, N, s_c, s_cn, bias_ptr,
                        s_bias, r_ptr, s_rm, s_rn, alpha, beta, BLOCK_M, BLOCK_N, C_DESC,
                        SUBTILE, HAS_ALPHA, HAS_BIAS, HAS_RES, ACT, SPLIT)
    else:
        pid_m, pid_n, k0, ks = _tma_item(tl.program_id(0), M, N, K, K_SPLIT, BLOCK_M,
                                         BLOCK_N, BLOCK_K, GROUP_M, SPLIT)
        acc = _tma_acc(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k0, k_tiles,
                       BLOCK_M, BLOCK_N, BLOCK_K, A_T, B_T, PRECISION)
        _tma_finish(acc, c_desc, c_ptr, pid_m, pid_n, ks, M, N, s_c, s_cn, bias_ptr, s_bias,
                    r_ptr, s_rm, s_rn, alpha, beta, BLOCK_M, BLOCK_N, C_DESC, SUBTILE,
                    HAS_ALPHA, HAS_BIAS, HAS_RES, ACT, SPLIT)


@triton.jit
def _tma_finish(acc, c_desc, c_ptr, pid_m, pid_n, ks, M, N, s_c, s_cn, bias_ptr, s_bias,
                r_ptr, s_rm, s_rn, alpha, beta, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                C_DESC: tl.constexpr, SUBTILE: tl.constexpr, HAS_ALPHA: tl.constexpr,
                HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
                SPLIT: tl.constexpr):
    """An item's end: its partial into workspace plane ks (SPLIT), else epilogue and store."""
    if SPLIT:
        _ws_store(acc, c_desc, ks, pid_m, pid_n, BLOCK_M, BLOCK_N)
    else:
        _tma_store(acc, c_desc, c_ptr, pid_m, pid_n, M, N, s_c, s_cn, bias_ptr, s_bias,
                   r_ptr, s_rm, s_rn, alpha, beta, BLOCK_M, BLOCK_N, C_DESC, SUBTILE,
                   HAS_ALPHA, HAS_BIAS, HAS_RES, ACT)


# ------------------------------------------------------------------ padded operand copies

@triton.jit
def _pad_copy_kernel(src_ptr, dst_ptr, R, C, CP8, B1, s_0, s_1, s_r, s_c,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dst[b, r, c] = src[b0, b1, r, c] for c < C, 0 for C <= c < CP; dst contiguous
    [B0*B1, R, CP] with CP = 8 * CP8 (passed divided so the stores vectorise)."""
    CP = CP8 * 8
    pid_b = tl.program_id(2).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    src = src_ptr + (pid_b // B1) * s_0 + (pid_b % B1) * s_1
    inside = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(src + rows[:, None].to(tl.int64) * s_r + cols[None, :].to(tl.int64) * s_c,
                mask=inside, other=0.0)
    dst = dst_ptr + pid_b * R * CP + rows[:, None].to(tl.int64) * CP + cols[None, :]
    tl.store(dst, x, mask=(rows[:, None] < R) & (cols[None, :] < CP))


# ------------------------------------------------------------------ launch configuration
#
# The rule is `matmul_config` (tiles, warps, stages) + `splitk_factor` (K slices), both
# driven by one cost model, `_estimate` (see its doc and docs/design/matmul-and-gemv.md).
# GROUP_M = 8 everywhere. Shared memory of each candidate stays under 227 KB on sm_90
# (checked in tests/ops/test_linalg.py::test_configs_compile_for_sm90).
# On interp the same rule applies; `config_override` replaces it, which the tests use to
# force tails with tiny tiles.

_OVERRIDE: dict | None = None
GEMV_MAX_M = 16  # up to this many rows (one batch) a product is memory-bound: gemv.py
PAD_MIN_MACS = 1 << 24   # pad a misaligned operand only when the product amortises the copy
_I32_MAX = (1 << 31) - 1   # an int argument above this is passed as int64


@contextlib.contextmanager
def config_override(**cfg):
    """Force the matmul tile config (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps,
    num_stages, and PERSISTENT / NUM_PROGS / FLATTEN for the persistent variant, SPLIT for
    the K split, PAD=True/False to force or forbid padded operand copies; any subset)
    inside a `with` block -- for tests and sweeps. It also disables the GEMV path."""
    global _OVERRIDE
    old = _OVERRIDE
    _OVERRIDE = dict(cfg)
    try:
        yield
    finally:
        _OVERRIDE = old


# The rule's candidates, biggest first: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, efficiency).
# Efficiency = tensor-core rate of one program relative to the tiled kernel's 128x256 tile
# (~5.6 TFLOP/s an SM in bf16 on the H200; the TMA kernel's tiles run above it). Smaller
# tiles re-read more operand bytes per FLOP and use half-filled warpgroups (64-row tiles:
# one warpgroup). `_TILES_16` / `_TILES_32` / `_TILES_TF32`: the tiled kernel (any batch,
# any strides); `_TMA_16` / `_TMA_TF32`: the TMA kernel (one batch, operands TMA can read,
# `_tma_operand`), persistent and flattened when the items outnumber the SMs, with its own
# K split. The efficiencies are fitted to `benchmarks/bench_matmul_grid.py --sweep` on the
# H200 (docs/design/matmul-and-gemv.md).
_TILES_16 = [(128, 256, 64, 8, 3, 1.00), (128, 128, 64, 8, 4, 0.85), (128, 64, 64, 4, 4, 0.70),
             (64, 128, 64, 4, 4, 0.70), (64, 64, 64, 4, 4, 0.50)]
# H200 grid (`bench_matmul_grid.py --quick --probe`, torch time / ours): the TMA 128x256 tile
# runs at 1.08-1.10 of the tiled one's rate (4096^3: 777 against 705 TFLOP/s), its 128x128
# at 0.66 (3000x2000x5000: 0.645 against 0.769 for 128x256 in 1.45 waves), its 128x64 and
# its K split lost to the tiled kernel on every few-tile shape (256^3 .. 1024^3 0.58-0.64
# against 0.85-1.09; 1024^2 x 16384 0.864 against 0.908), so the TMA family has neither.
_TMA_16 = [(128, 256, 64, 8, 3, 1.10), (128, 128, 64, 8, 4, 0.66)]
# IEEE fp32 (FMA): 64x128x32 at 4 warps, 4 stages 0.880 of cuBLAS at 4096^3, 128x64 0.868,
# the former 128x128x32 at 8 warps 0.815 (f32 efficiencies relative to the first)
_TILES_32 = [(64, 128, 32, 4, 4, 1.00), (128, 64, 32, 4, 4, 0.98), (64, 64, 32, 4, 3, 0.60)]
_TILES_TF32 = [(128, 128, 32, 8, 3, 1.00), (64, 64, 32, 4, 3, 0.60)]
_TMA_TF32 = [(128, 256, 32, 8, 3, 1.10), (128, 128, 32, 8, 4, 0.66)]
# FLOP/s of one SM running the reference tile: 16-bit, TF32, IEEE fp32 (FMA)
_SM_FLOPS = {"16": 5.6e12, "tf32": 2.8e12, "ieee": 0.36e12}
_SM_L2_BW = 100e9         # operand bytes/s one SM pulls from L2 (64 B/clk at ~1.7 GHz)
_HBM_BW = 3.6e12          # achievable HBM bytes/s (4.19 TB/s copy)
_T_TILE = 2e-6            # per program: pipeline fill + epilogue
_T_TILE_TMA = 1e-6        # the same under a persistent TMA loop (the next loads overlap)
_T_LAUNCH = 3e-6          # the split-K reduce: one more kernel on the stream


def _estimate(M, N, K, bm, bn, eff, split, batch, itemsize, sms, flops=_SM_FLOPS["16"],
              t_tile=_T_TILE):
    """Modelled seconds of one product with a bm x bn tile and `split` K slices.

    Programs = tiles * batch * split are spread over the `sms` SMs; an SM that runs c of them
    takes c * max(compute, operand loads) plus the fill/epilogue latency `t_tile` once per
    pair (two small programs share an SM and hide each other's latency; a 128x256 one does
    not). Bounded below by the HBM traffic of the operands. A split adds the reduce kernel
    and its fp32 workspace traffic (written and read once per slice)."""
    tiles = _cdiv(M, bm) * _cdiv(N, bn) * batch
    progs = tiles * split
    c = _cdiv(progs, sms)
    ks = _cdiv(K, split)
    occ = 1 if bm * bn >= 128 * 256 else 2
    t_prog = max(2.0 * bm * bn * ks / (flops * eff), (bm + bn) * ks * itemsize / _SM_L2_BW)
    t = c * t_prog + t_tile * _cdiv(c, occ)
    # the operands' HBM traffic, at the share of the bandwidth the programs can draw: fewer
    # programs than SMs keep fewer loads in flight (H200: 64 programs streaming a 4096^2
    # weight drew 2.2 TB/s, 86 of them 2.0)
    t = max(t, batch * itemsize * (M * K + K * N + M * N) / (_HBM_BW * min(1.0, progs / sms)))
    if split > 1:
        t += _T_LAUNCH + (2 * split + 1) * 4.0 * M * N * batch / _HBM_BW
    return t


def _p2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _families(dtype, precision, tma, tiles16):
    """(kernel, candidates, FLOP/s an SM, per-program latency) the rule weighs for `dtype`."""
    if dtype.itemsize == 2:
        return ((("tma", _TMA_16, _SM_FLOPS["16"], _T_TILE_TMA),) if tma else ()) + \
            (("tiled", tiles16, _SM_FLOPS["16"], _T_TILE),)
    if precision == "tf32":
        return ((("tma", _TMA_TF32, _SM_FLOPS["tf32"], _T_TILE_TMA),) if tma else ()) + \
            (("tiled", _TILES_TF32, _SM_FLOPS["tf32"], _T_TILE),)
    return (("tiled", _TILES_32, _SM_FLOPS["ieee"], _T_TILE),)


@_plans.memoize("kernels.matmul.rule", 4096)
def _rule(M, N, K, dtype, sms, batch, precision, tma, tiles16, band=True):
    """(modelled seconds, config): the cheapest candidate by `_estimate` (with its best K
    split) over the families; ties (within 3 %) go to the earlier one: the TMA kernel, then
    the bigger tile. With `band`, a TMA pick may become two launches (`_band`)."""
    if dtype.itemsize == 8:
        return 0.0, dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=16, num_warps=4, num_stages=2,
                         GROUP_M=8)
    best = None
    for kernel, cands, flops, t_tile in _families(dtype, precision, tma and batch == 1,
                                                  tiles16):
        # a tile beyond the rows (columns) only adds masked-off work
        fits = [c for c in cands if c[0] <= max(64, _p2(M)) and c[1] <= max(64, _p2(N))]
        for bm, bn, bk, w, st, eff in fits or cands:
            split = _best_split(M, N, K, bm, bn, bk, eff, batch, dtype.itemsize, sms, flops,
                                t_tile, kernel == "tma")
            t = _estimate(M, N, K, bm, bn, eff, split, batch, dtype.itemsize, sms, flops, t_tile)
            if best is None or t < best[0] * 0.97:
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st,
                           GROUP_M=8)
                if kernel == "tma":
                    cfg.update(TMA=True, FLATTEN=True)
                best = (t, cfg, eff, flops, t_tile)
    if band and best[1].get("TMA"):
        banded = _band(M, N, K, best, dtype, sms, precision, tiles16)
        if banded is not None:
            return banded
    return best[:2]


def _band(M, N, K, best, dtype, sms, precision, tiles16):
    """(seconds, config with BAND=(axis, extent)) when two launches beat one: the TMA tiles
    fill whole waves of the SMs and part of one more, so the rows (or columns) of the whole
    waves run with this tile and the rest is planned on its own (a smaller tile or a K split
    then fills the SMs) -- the cheap half of stream-K; else None."""
    t_full, cfg, eff, flops, t_tile = best
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    mb, nb = _cdiv(M, bm), _cdiv(N, bn)
    waves = mb * nb // sms
    if waves < 1 or mb * nb % sms == 0:
        return None
    out = None
    for axis, blocks, other, size in (("M", mb, nb, bm), ("N", nb, mb, bn)):
        keep = waves * sms // other
        if keep < 1 or keep >= blocks:
            continue
        head = keep * size
        hm, hn, rm, rn = (head, N, M - head, N) if axis == "M" else (M, head, M, N - head)
        t = (_estimate(hm, hn, K, bm, bn, eff, 1, 1, dtype.itemsize, sms, flops, t_tile)
             + _rule(rm, rn, K, dtype, sms, 1, precision, True, tiles16, False)[0] + _T_LAUNCH)
        if t < t_full * 0.97 and (out is None or t < out[0]):
            out = (t, dict(cfg, BAND=(axis, head)))
    return out


def _tma_split(M, N, K, cfg, itemsize, precision, sms) -> int:
    """The TMA kernel's K slices: 1 (the tiled kernel's split won every few-tile shape on the
    H200) unless forced (`config_override(TMA=True, SPLIT=n)`: tests, sweeps)."""
    if _OVERRIDE and "SPLIT" in _OVERRIDE:
        return max(1, int(_OVERRIDE["SPLIT"]))
    return 1


def matmul_config(M, N, K, dtype, dev, batch=1, precision="ieee", tma=True, band=True) -> dict:
    """The default launch config on `dev` (kernels/_common.DeviceFacts; the autotune table
    overrides it per shape where it has an entry; `config_override` for tests and sweeps).

    The cheapest candidate of `_rule`'s cost model: for one-batch 16-bit (and TF32) products
    the TMA kernel's tiles (TMA=True, with their K split) compete with the tiled kernel's
    (tma=False: the tiled ones only -- the fallback when TMA cannot read the operands). So
    the big products take the TMA 128x256 tile, a product with few output tiles a smaller
    tile or a K split to fill the SMs, batches the tiled kernel. IEEE fp32 runs the tiled
    kernel's FMA tiles; fp64 64x64x16, 4 warps, 2 stages, never split. `TMA_BIG = None`
    keeps every product on the tiled kernel. A config with BAND=(axis, extent) runs as two
    products (`_banded`); band=False never gives one."""
    if _OVERRIDE:   # forced: the tiled kernel unless the override says TMA
        cfg = dict(_rule(M, N, K, dtype, dev.sms, batch, precision, False,
                         tuple(_TILES_16))[1])
        cfg.update({k: v for k, v in _OVERRIDE.items() if k not in ("SPLIT", "PAD")})
        return cfg
    return dict(_rule(M, N, K, dtype, dev.sms, batch, precision, tma and TMA_BIG is not None,
                      tuple(_TILES_16), band)[1])


@_plans.memoize("kernels.matmul.split", 4096)
def _best_split(M, N, K, bm, bn, bk, eff, batch, itemsize, sms, flops=_SM_FLOPS["16"],
                t_tile=_T_TILE, never=False):
    if batch != 1 or itemsize == 8 or never:
        return 1
    tiles = _cdiv(M, bm) * _cdiv(N, bn)
    if tiles >= sms:
        return 1
    k_blocks = _cdiv(K, bk)
    best_s, best_t = 1, None
    for s in range(1, min(16, k_blocks // 4, _cdiv(sms, tiles)) + 1):
        t = _estimate(M, N, K, bm, bn, eff, s, 1, itemsize, sms, flops, t_tile)
        if best_t is None or t < best_t:
            best_s, best_t = s, t
    return best_s


def splitk_factor(M, N, K, BK, tiles, itemsize, dev, BM=None, BN=None, precision="ieee") -> int:
    """How many K-slices for a one-batch product of the tiled kernel with `tiles` output
    tiles.

    Split only when the tiles do not fill one wave of SMs, with >= 4 K-blocks a slice and
    at most 16 slices; among those, the split `_estimate` models fastest (the reduce kernel
    and the fp32 workspace traffic weigh against it). fp64 never splits."""
    if _OVERRIDE and "SPLIT" in _OVERRIDE:      # forced (tests, sweeps)
        return max(1, int(_OVERRIDE["SPLIT"]))
    if tiles >= dev.sms or itemsize == 8:
        return 1
    if BM is None:   # tile shape unknown: assume square tiles of the same count
        BM = BN = max(16, int((M * N / tiles) ** 0.5))
    eff = {(128, 256): 1.0, (128, 128): 0.85, (64, 64): 0.5}.get((BM, BN), 0.7)
    flops = _SM_FLOPS["16" if itemsize == 2 else "tf32" if precision == "tf32" else "ieee"]
    return _best_split(M, N, K, BM, BN, BK, eff, 1, itemsize, dev.sms, flops)


# A/B switch of the TMA kernel in the rule: None keeps every product on the tiled kernel;
# otherwise the rule's TMA candidates (`_TMA_16`, `_TMA_TF32`) compete. `config_override(TMA=
# True, ...)` forces the TMA kernel (tests, sweeps). Measured on the H200 (`bench_matmul.py
# --mm-sweep`, torch time / ours): the persistent flattened TMA kernel at 3 stages 0.978 bf16 /
# 0.977 fp16 at 4096^3, 0.999 / 0.997 at 8192^3, against the tiled kernel's 0.900 / 0.898 and
# 0.869 / 0.866 in the same run.
TMA_BIG: dict | None = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, GROUP_M=8,
                            num_stages=3, PERSISTENT=True, FLATTEN=True)


def _tma_operand(t, st, dims):
    """(transposed, row stride) when 2-D operand view t (batch dims of size 1) can be read
    through a TMA descriptor -- base 16-byte aligned, one unit stride, the other a nonzero
    multiple of 16 bytes -- else None. dims = (rows, cols) of the product's view."""
    align = 16 // t.dtype.itemsize
    if t.data_ptr() % 16:
        return None
    if st[3] == 1 or (dims[1] == 1 and st[3] == 0):
        other, transposed = st[2], False
    elif st[2] == 1 or (dims[0] == 1 and st[2] == 0):
        other, transposed = st[3], True
    else:
        return None
    if other <= 0 or other % align or other > (1 << 39) // t.dtype.itemsize:
        return None
    return transposed, other


def _tma_refusal(a, b, la, lb):
    """Why the TMA kernel cannot run this product (None when it can)."""
    B0, B1, M, K = a.shape
    if B0 * B1 != 1 or K == 0:
        return f"one batch and K > 0 (got batch {B0 * B1}, K {K})"
    if a.dtype not in (_dt.float16, _dt.bfloat16, _dt.float32):
        return f"float16, bfloat16 or float32 operands (got {a.dtype.name})"
    if la is None or lb is None:
        return (f"16-byte aligned operands with one unit stride (got a strides "
                f"{_strides4(a)[2:]}, b strides {_strides4(b)[2:]})")
    return None


def _launch_tma(cfg, out, a, b, bias, residual, alpha, beta, act, need, precision="ieee"):
    """Run the product through `_matmul_tma_kernel` when TMA can read the operands (one
    batch, 16-bit, K > 0); returns False (nothing launched) when it cannot, or raises when
    `need` (a forced TMA config) and it cannot. cfg["SPLIT"] > 1 splits K: the slices'
    fp32 partials go to a workspace that `splitk_reduce` sums and finishes."""
    B0, B1, M, K = a.shape
    N = b.shape[3]
    sa, sb, sc = _strides4(a), _strides4(b), _strides4(out)
    la = _tma_operand(a, sa, (M, K)) if a.dtype.itemsize <= 4 else None
    lb = _tma_operand(b, sb, (K, N)) if b.dtype.itemsize <= 4 else None
    why = _tma_refusal(a, b, la, lb)
    if why is not None:
        if need:
            raise ValueError(f"matmul: the TMA kernel was forced but needs {why}")
        return False
    BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    tiles = _cdiv(M, BM) * _cdiv(N, BN)
    split, k_split = max(1, int(cfg.get("SPLIT", 1))), 0
    if split > 1 and N % 4:   # the workspace descriptor needs 16-byte rows
        if need:
            raise ValueError(f"matmul: the TMA kernel's K split needs N a multiple of 4 "
                             f"(got N {N})")
        return False
    if split > 1:   # whole K blocks a slice, so every item runs the same trip count
        k_split = _cdiv(_cdiv(K, BK), split) * BK
        split = _cdiv(K, k_split)
    items = tiles * split
    nprog = (min(items, cfg.get("NUM_PROGS", device_facts(a.device).sms))
             if cfg.get("PERSISTENT", True) else items)
    consts = dict(BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=cfg.get("GROUP_M", 8),
                  A_T=la[0], B_T=lb[0], SUBTILE=cfg.get("SUBTILE", True),
                  PERSISTENT=nprog < items, FLATTEN=cfg.get("FLATTEN", False) and nprog < items,
                  PRECISION=precision if a.dtype is _dt.float32 else "ieee",
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    from ..backends.launch import launch
    if split > 1:
        from ..tensor import Tensor
        from .gemv import splitk_reduce
        ws = Tensor._empty((split, M, N), _dt.float32, out.device)
        launch(_matmul_tma_kernel, (nprog,), a, b, ws, ws, ws, M, N, K, nprog, items,
               la[1], lb[1], N, 1, 0, 0, 0, 1.0, 1.0, k_split, C_DESC=False, HAS_ALPHA=False,
               HAS_BIAS=False, HAS_RES=False, ACT=0, SPLIT=True, **consts)
        splitk_reduce(ws, out._view(out._shape[2:], out._stride[2:]), bias,
                      residual._view(residual._shape[2:], residual._stride[2:])
                      if residual is not None else None, alpha, beta, act)
        return True
    c_desc = (sc[3] == 1 or N == 1) and sc[2] > 0 and sc[2] % (16 // out.dtype.itemsize) == 0 \
        and out.data_ptr() % 16 == 0
    sr = _strides4(residual)
    launch(_matmul_tma_kernel, (nprog,), a, b, out, bias if bias is not None else out,
           residual if residual is not None else out, M, N, K, nprog, items,
           la[1], lb[1], sc[2], sc[3], sr[2], sr[3], bias.stride(0) if bias is not None else 0,
           float(alpha), float(beta), 0, C_DESC=c_desc, HAS_ALPHA=alpha != 1,
           HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=act, SPLIT=False,
           **consts)
    return True


def _t4(t):
    """The 4-D view t with its last two dims swapped (None stays None)."""
    if t is None:
        return None
    sh, st = t._shape, t._stride
    return t._view((sh[0], sh[1], sh[3], sh[2]), (st[0], st[1], st[3], st[2]))


def _strides4(t):
    """Strides of a 4-D view, 0 for size-1 dims (their index is always 0; a 0 keeps them
    out of the alignment checks)."""
    if t is None:
        return (0, 0, 0, 0)
    return tuple(0 if n == 1 else s for n, s in zip(t._shape, t._stride))


def _layout(s_rows, s_cols):
    """'cols' if unit stride along the second dim, 'rows' along the first, else None."""
    if s_cols == 1:
        return "cols"
    if s_rows == 1:
        return "rows"
    return None


def _operand_div(t, st, lay, n_unit, align):
    """A_DIV/B_DIV: `align` (16 bytes in elements) when the operand can be loaded in
    aligned 16-byte vectors -- base 16-byte aligned, every non-unit stride a multiple of
    `align` and, when the unit-stride dim is M or N (cut by the where() redirect), its
    extent a multiple of 8 -- else 1. Never for a stride beyond int32: the kernel multiplies
    the divided stride back in the integer type the launcher gave the quotient, so a
    quotient that fits int32 would wrap (a 2**32-element batch stride came back as 0)."""
    if lay is None or t.data_ptr() % 16:
        return 1
    others = [st[0], st[1], st[2] if lay == "cols" else st[3]]
    if any(x % align or abs(x) > _I32_MAX for x in others):
        return 1
    if n_unit is not None and n_unit % 8:
        return 1
    return align


def _pad_copy(t, unit_dim):
    """A contiguous copy of 4-D view t whose unit-stride dim (2 or 3) is last in memory and
    padded to a 16-byte multiple; stride-0 (broadcast) batch dims stay stride 0. Returns
    (view with t's shape, padded length of unit_dim)."""
    from ..tensor import Tensor
    from ..backends.launch import launch
    B0, B1, d2, d3 = t._shape
    st = _strides4(t)
    R, C = (d2, d3) if unit_dim == 3 else (d3, d2)
    s_r, s_c = (st[2], st[3]) if unit_dim == 3 else (st[3], st[2])
    CP = _cdiv(max(C, 1), 8) * 8   # 16 bytes (fp32: 32) and the 8-row contiguity hint
    b0 = B0 if st[0] else 1
    b1 = B1 if st[1] else 1
    buf = Tensor._empty((b0 * b1 * R * CP,), t.dtype, t.device)
    BR, BC = 16, 128
    launch(_pad_copy_kernel, (_cdiv(R, BR), _cdiv(CP, BC), b0 * b1), t, buf, R, C, CP // 8, b1,
           st[0], st[1], s_r, s_c, BLOCK_R=BR, BLOCK_C=BC, num_warps=4)
    s0 = b1 * R * CP if b0 > 1 else 0
    s1 = R * CP if b1 > 1 else 0
    stride = (s0, s1, CP, 1) if unit_dim == 3 else (s0, s1, 1, CP)
    return buf._view((B0, B1, d2, d3), stride, 0), CP


_GEMV = [None]


def _out_div(out, sc, N):
    """C_DIV: 16 bytes in elements when the output's rows can be stored in aligned 16-byte
    vectors -- unit column stride, base 16-byte aligned, N and every other stride a multiple
    of it (within int32, as `_operand_div`) -- else 1 (fp64: 1)."""
    align = 16 // out.dtype.itemsize
    if align < 2 or sc[3] != 1 or out.data_ptr() % 16 or N % align:
        return 1
    if any(x % align or abs(x) > _I32_MAX for x in sc[:3]):
        return 1
    return align


def _fp32_layouts(a, b, precision):
    """fp32 operands copied (once, `_pad_copy`) into the layout their product runs fast in:
    TF32 tensor cores read both K-major (wgmma takes no transposed fp32 tile: 4096^3 with a
    row-major B ran at 78 TFLOP/s, a K-major one at 371 on the H200), the FMA path a B whose
    unit stride is along N (2048^2 x 8192 with linear's K-major weight: 0.44 of cuBLAS,
    row-major squares 0.82). A copy costs two passes over the operand, a few percent of
    these products."""
    sa, sb = _strides4(a), _strides4(b)
    if precision == "tf32":
        if sa[2] == 1 and sa[3] != 1:
            a = _pad_copy(a, 3)[0]
        if sb[3] == 1 and sb[2] != 1:
            b = _pad_copy(b, 2)[0]
    elif sb[2] == 1 and sb[3] != 1:
        b = _pad_copy(b, 3)[0]
    return a, b


def _aligned_operands(a, b, M, N, K):
    """The operands as the kernel reads them: (a, b, strides, layouts, alignment divisors,
    leading extents M_LD/N_LD). Operands that cannot be read in aligned 16-byte vectors
    (odd leading strides such as K = 4093, N not a multiple of 8 along the unit-stride dim,
    no unit stride, unaligned base) load element by element, ~5x slower; when the product
    is big enough they are first copied into a padded buffer (one extra read + write)."""
    sa, sb = _strides4(a), _strides4(b)
    lay_a, lay_b = _layout(sa[2], sa[3]), _layout(sb[2], sb[3])
    M_LD, N_LD = M, N
    itemsize = a.dtype.itemsize
    align = 16 // itemsize
    div_a = _operand_div(a, sa, lay_a, M if lay_a == "rows" else None, align) if itemsize < 8 else 1
    div_b = _operand_div(b, sb, lay_b, N if lay_b == "cols" else None, align) if itemsize < 8 else 1
    force = _OVERRIDE.get("PAD") if _OVERRIDE else None
    # by default only when the product amortises the copy, and not for a single row or
    # column (a vector is cheap to read element-wise)
    pad_a = force is True or (force is None and M * N * K >= PAD_MIN_MACS and M > 1)
    pad_b = force is True or (force is None and M * N * K >= PAD_MIN_MACS and N > 1)
    if itemsize < 8 and K > 0:
        if pad_a and div_a == 1:
            a, m_pad = _pad_copy(a, 2 if lay_a == "rows" else 3)
            if lay_a == "rows":
                M_LD = m_pad   # loads may run into the zero padding of the unit-stride dim
            sa = _strides4(a)
            lay_a = _layout(sa[2], sa[3])
            div_a = _operand_div(a, sa, lay_a, None, align)
        if pad_b and div_b == 1:
            b, n_pad = _pad_copy(b, 2 if lay_b == "rows" else 3)
            if lay_b != "rows":
                N_LD = n_pad
            sb = _strides4(b)
            lay_b = _layout(sb[2], sb[3])
            div_b = _operand_div(b, sb, lay_b, None, align)
    return a, b, sa, sb, lay_a, lay_b, div_a, div_b, M_LD, N_LD


def _launch_split_k(split, out, a, b, bias, residual, alpha, beta, act, M, N, K, BK, tiles,
                    M_LD, N_LD, qa, qb, consts):
    """Fewer tiles than SMs: split K into fp32 partials, then the epilogue in the reduce
    kernel (B0 == B1 == 1 here, so out[0, 0] and residual[0, 0] are built directly)."""
    from ..backends.launch import launch
    from ..tensor import Tensor
    from .gemv import splitk_reduce
    k_split = _cdiv(_cdiv(K, BK), split) * BK
    split = _cdiv(K, k_split)
    ws = Tensor._empty((split, M, N), _dt.float32, out.device)
    launch(_matmul_kernel, (tiles, 1, split), a, b, ws, ws, ws, M, N, K, 1, M_LD, N_LD,
           *qa, *qb, 0, 0, N, 1, 0, 0, 0, 0, 0, 1.0, 1.0, k_split, M * N, 0, 0, 0,
           SPLIT_K=True, PERSISTENT=False, FLATTEN=False, C_DIV=1,
           **dict(consts, HAS_ALPHA=False, HAS_BIAS=False, HAS_RES=False, ACT=0))
    splitk_reduce(ws, out._view(out._shape[2:], out._stride[2:]), bias,
                  residual._view(residual._shape[2:], residual._stride[2:])
                  if residual is not None else None, alpha, beta, act)
    return out


def _tuned(cfg, M, N, K, a, dev, precision):
    """The autotune seam: a screened config of the user cache / shipped table for this key,
    else the rule's `cfg`. The tables hold tiled-kernel configs, looked up against the tiled
    rule; a miss keeps `cfg` (the TMA kernel where the rule chose it)."""
    tiled = matmul_config(M, N, K, a.dtype, dev, 1, precision, tma=False) if cfg.get("TMA") \
        else cfg
    got = _autotune.pick("matmul", (M, N, K), tiled, dtype=a.dtype.name, device=a.device)
    return cfg if got == tiled else got


@register("matmul", "triton")
def matmul(out, a, b, *, bias=None, residual=None, alpha=1.0, beta=1.0, activation=None,
           precision="ieee"):
    """out[B0,B1,M,N] = act(alpha * a @ b + bias) + beta * residual; 4-D strided views."""
    B0, B1, M, K = a._shape
    N = b._shape[3]
    if not math.prod(out._shape):
        return out
    adt = a._dtype
    if adt is not _dt.float32 and adt is not _dt.bfloat16 and adt is not _dt.float16 and \
            adt is not _dt.float64:
        raise TypeError(f"matmul: dtype {a.dtype.name} is not supported on {a.device} "
                        f"(expected float16, bfloat16, float32 or float64)")
    act = ACTIVATIONS[activation]
    if B0 * B1 == 1 and K > 0 and adt is not _dt.float64 and _OVERRIDE is None and (
            M <= GEMV_MAX_M or (N <= GEMV_MAX_M and bias is None)):
        gemv = _GEMV[0]
        if gemv is None:    # imported once here: gemv.py imports this module
            from .gemv import gemv
            _GEMV[0] = gemv
        if M <= GEMV_MAX_M:
            return gemv(out, a, b, bias=bias, residual=residual, alpha=alpha, beta=beta,
                        act=act, precision=precision)
        # few columns: out^T = b^T @ a^T streams a as the GEMV's weight (a bias over N would
        # be one over the GEMV's rows, which it has not)
        gemv(_t4(out), _t4(b), _t4(a), bias=None, residual=_t4(residual), alpha=alpha,
             beta=beta, act=act, precision=precision)
        return out
    return _product(out, a, b, bias, residual, alpha, beta, act, precision, True)


def _band_view(t, dim, lo, n):
    """Elements lo..lo+n of dim `dim` of view t (None stays None)."""
    if t is None:
        return None
    shape = list(t._shape)
    shape[dim] = n
    return t._view(tuple(shape), t._stride, t._offset + lo * t._stride[dim])


def _banded(band, out, a, b, bias, residual, alpha, beta, act, precision):
    """The product as two: rows (axis "M") or columns ("N") [0, extent) and the rest, each
    planned by the rule without a further band."""
    axis, head = band
    M, N = out._shape[2], out._shape[3]
    for lo, n in ((0, head), (head, (M if axis == "M" else N) - head)):
        if axis == "M":
            parts = (_band_view(out, 2, lo, n), _band_view(a, 2, lo, n), b, bias,
                     _band_view(residual, 2, lo, n))
        else:
            parts = (_band_view(out, 3, lo, n), a, _band_view(b, 3, lo, n),
                     _band_view(bias, 0, lo, n), _band_view(residual, 3, lo, n))
        _product(*parts, alpha, beta, act, precision, False)
    return out


def _product(out, a, b, bias, residual, alpha, beta, act, precision, band):
    """The TMA or tiled kernel on 4-D views, as the rule (and the autotune table) says."""
    B0, B1, M, K = a._shape
    N = b._shape[3]
    adt = a._dtype
    dev = device_facts(a.device)
    if adt is _dt.float32 and M * N * K >= PAD_MIN_MACS:
        a, b = _fp32_layouts(a, b, precision)
    cfg = matmul_config(M, N, K, a.dtype, dev, B0 * B1, precision, band=band)
    if _OVERRIDE is None and B0 * B1 == 1:
        cfg = _tuned(cfg, M, N, K, a, dev, precision)
    if "BAND" in cfg:
        return _banded(cfg["BAND"], out, a, b, bias, residual, alpha, beta, act, precision)
    if cfg.get("TMA"):
        cfg["SPLIT"] = _tma_split(M, N, K, cfg, a.dtype.itemsize, precision, dev.sms)
        if _launch_tma(cfg, out, a, b, bias, residual, alpha, beta, act,
                       need=_OVERRIDE is not None, precision=precision):
            return out
        # operands TMA cannot read (unaligned rows, no unit stride): the tiled kernel's rule
        cfg = matmul_config(M, N, K, a.dtype, dev, B0 * B1, precision, tma=False)
    BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    from ..backends.launch import launch
    a, b, sa, sb, lay_a, lay_b, div_a, div_b, M_LD, N_LD = _aligned_operands(a, b, M, N, K)
    a_k1, a_m1 = lay_a == "cols", lay_a == "rows"
    b_n1, b_k1 = lay_b == "cols", lay_b == "rows"
    # strides handed over divided by the alignment the kernel multiplies back (A_DIV/B_DIV)
    qa = (sa[0] // div_a, sa[1] // div_a, sa[2] // div_a if a_k1 else sa[2],
          sa[3] // div_a if a_m1 else sa[3])
    qb = (sb[0] // div_b, sb[1] // div_b, sb[2] // div_b if b_n1 else sb[2],
          sb[3] // div_b if b_k1 else sb[3])
    sc, sr = _strides4(out), _strides4(residual)
    div_c = _out_div(out, sc, N)
    qc = (sc[0] // div_c, sc[1] // div_c, sc[2] // div_c, sc[3])
    tensors = (a, b, out, bias if bias is not None else out,
               residual if residual is not None else out)
    strides = (*qa, *qb, *qc, *sr, bias.stride(0) if bias is not None else 0,
               float(alpha), float(beta))
    consts = dict(BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=cfg["GROUP_M"], EVEN_K=K % BK == 0,
                  HINT_M=M_LD % 8 == 0, HINT_N=N_LD % 8 == 0,
                  A_K1=a_k1, A_M1=a_m1, B_N1=b_n1, B_K1=b_k1, A_DIV=div_a, B_DIV=div_b,
                  HAS_ALPHA=alpha != 1, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
                  ACT=act, PRECISION=precision if a.dtype is _dt.float32 else "ieee",
                  ACC_F64=a.dtype is _dt.float64,
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    tiles = _cdiv(M, BM) * _cdiv(N, BN)
    if cfg.get("PERSISTENT"):
        nprog = min(tiles * B0 * B1, cfg.get("NUM_PROGS", dev.sms))
        launch(_matmul_kernel, (nprog,), *tensors, M, N // div_c, K, B1, M_LD, N_LD, *strides,
               0, 0, nprog, tiles * B0 * B1, tiles, SPLIT_K=False, PERSISTENT=True,
               FLATTEN=cfg.get("FLATTEN", False), C_DIV=div_c, **consts)
        return out
    split = splitk_factor(M, N, K, BK, tiles, a.dtype.itemsize, dev, BM, BN, precision) \
        if B0 * B1 == 1 else 1
    if split == 1:
        launch(_matmul_kernel, (tiles, B0 * B1), *tensors, M, N // div_c, K, B1, M_LD, N_LD,
               *strides, 0, 0, 0, 0, 0, SPLIT_K=False, PERSISTENT=False, FLATTEN=False,
               C_DIV=div_c, **consts)
        return out
    return _launch_split_k(split, out, a, b, bias, residual, alpha, beta, act, M, N, K, BK,
                           tiles, M_LD, N_LD, qa, qb, consts)
