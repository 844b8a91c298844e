"""GGML-quantised weights on the device: fused dequantise-GEMV and row dequantisation.

Weights stay as their GGUF blocks, one row of bytes per output feature:
  Q8_0: 34-byte blocks of 32 weights   f16 d | i8 q[32]            w = d*q
  Q4_1: 20-byte blocks of 32 weights   f16 d | f16 m | u8 qs[16]   w = d*nibble + m
        (weight j < 16 is the low nibble of qs[j], weight j >= 16 the high nibble of qs[j-16])

`quant_linear(x, w)` computes x @ dequant(w).T without materialising the weight: one
program owns BLOCK_N output features of one input row and walks K in BLOCK_K steps,
decoding the blocks in registers (fp32 accumulation). Decode (M = 1) reads each weight
byte once, which is the point: 4.5 (Q4_1: 5) bits a weight instead of 16.
`dequantize_rows(w, ids)` decodes whole rows (embedding lookup, or full dequantisation).
"""
from __future__ import annotations

import triton
import triton.language as tl

import nbxtensor as nbx
from ..tensor import Tensor

QTYPES = {"Q8_0": 0, "Q4_1": 1}
_BLOCK_BYTES = {"Q8_0": 34, "Q4_1": 20}


@triton.jit
def _decode(w_ptr, row_off, k, mask, QTYPE: tl.constexpr):
    """fp32 weights at columns `k` (a block of column indices) of rows starting at `row_off`."""
    blk = k // 32
    j = k % 32
    if QTYPE == 0:
        base = row_off + blk * 34
        d = tl.load((w_ptr + base).to(tl.pointer_type(tl.float16)), mask=mask, other=0.0)
        q = tl.load((w_ptr + base + 2 + j).to(tl.pointer_type(tl.int8)), mask=mask, other=0)
        return d.to(tl.float32) * q.to(tl.float32)
    else:
        base = row_off + blk * 20
        d = tl.load((w_ptr + base).to(tl.pointer_type(tl.float16)), mask=mask, other=0.0)
        m = tl.load((w_ptr + base + 2).to(tl.pointer_type(tl.float16)), mask=mask, other=0.0)
        byte = tl.load(w_ptr + base + 4 + (j % 16), mask=mask, other=0).to(tl.int32)
        q = tl.where(j < 16, byte & 15, byte >> 4)
        return d.to(tl.float32) * q.to(tl.float32) + m.to(tl.float32)


@triton.jit
def _quant_gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, row_bytes, stride_xm, stride_xk,
                       stride_ym, QTYPE: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    row_off = n.to(tl.int64)[:, None] * row_bytes
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K
        xv = tl.load(x_ptr + m.to(tl.int64) * stride_xm + k * stride_xk, mask=k_mask,
                     other=0.0).to(tl.float32)
        w = _decode(w_ptr, row_off, k[None, :], n_mask[:, None] & k_mask[None, :], QTYPE)
        acc += tl.sum(w * xv[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m.to(tl.int64) * stride_ym + n, acc.to(y_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _dequant_rows_kernel(w_ptr, ids_ptr, y_ptr, K, row_bytes, n_rows, QTYPE: tl.constexpr,
                         BLOCK: tl.constexpr):
    i = tl.program_id(0)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    r = tl.load(ids_ptr + i).to(tl.int64)
    ok = (r >= 0) & (r < n_rows)          # out-of-range ids write NaN, never read out of bounds
    mask = (k < K) & ok
    w = _decode(w_ptr, r * row_bytes, k, mask, QTYPE)
    w = tl.where(ok, w, float("nan"))
    tl.store(y_ptr + i.to(tl.int64) * K + k, w.to(y_ptr.dtype.element_ty), mask=k < K)


# ----------------------------------------------------------------------------- launch config
def _gemv_config(N: int, K: int, M: int, interp: bool = False):
    if interp:
        # the interpreter pays per program, not per element: few, wide programs
        return dict(BLOCK_N=32, BLOCK_K=128, num_warps=4)
    # decode (M = 1): enough programs to cover an H200's 132 SMs twice even for a
    # 576-wide layer (BLOCK_N down to 2), with a tile of >= 512 weights per step
    if M == 1:
        bn = 1 << max(0, min(5, (N // 264).bit_length() - 1)) if N >= 264 else 1
    else:
        bn = 32
    bk = min(512, max(128, 512 // bn))
    return dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=4)


# ----------------------------------------------------------------------------- Python entry
def _check_weight(w):
    if w.qtype not in QTYPES:
        raise ValueError(f"quant kernels: qtype {w.qtype!r} has no device kernel; supported: "
                         f"{', '.join(QTYPES)} (dequantise others at load)")
    N, K = w.shape
    if K % 32:
        raise ValueError(f"quant kernels: in_features {K} must be a multiple of 32")
    rb = K // 32 * _BLOCK_BYTES[w.qtype]
    if tuple(w.blocks.shape) != (N, rb) or w.blocks.dtype is not nbx.uint8:
        raise ValueError(f"quant kernels: {w.qtype} weight {w.shape} needs uint8 blocks of shape "
                         f"({N}, {rb}), got {w.blocks.dtype} {tuple(w.blocks.shape)}")
    if not w.blocks.is_contiguous():
        raise ValueError("quant kernels: weight blocks must be contiguous")
    return N, K, rb


def quant_linear(x: Tensor, w, b: Tensor | None = None, *, block_n=None, block_k=None) -> Tensor:
    """x (..., K) @ dequant(w).T (+ b) -> (..., N) in x's dtype; x on cuda or interp.
    block_n / block_k override the launch config (tests use them to force tails)."""
    from ..backends.launch import launch
    N, K, rb = _check_weight(w)
    if x.shape[-1] != K:
        raise ValueError(f"quant_linear: x has {x.shape[-1]} features, weight expects {K}")
    if x.device != w.device:
        raise ValueError(f"quant_linear: x is on {x.device}, weight on {w.device}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"quant_linear: x must be floating point, got {x.dtype}")
    lead = tuple(x.shape[:-1])
    M = 1
    for s in lead:
        M *= s
    x2 = x.reshape(M, K)
    y = Tensor._empty((M, N), x.dtype, x.device)
    if b is not None and (tuple(b.shape) != (N,) or b.device != x.device):
        raise ValueError(f"quant_linear: bias must be ({N},) on {x.device}, got "
                         f"{tuple(b.shape)} on {b.device}")
    if M and N:
        cfg = _gemv_config(N, K, M, x.device.type == "interp")
        if block_n is not None:
            cfg["BLOCK_N"] = block_n
        if block_k is not None:
            cfg["BLOCK_K"] = block_k
        grid = (triton.cdiv(N, cfg["BLOCK_N"]), M)
        launch(_quant_gemv_kernel, grid, x2, w.blocks, b if b is not None else y, y, N, K, rb,
               x2.stride(0), x2.stride(1), y.stride(0), QTYPE=QTYPES[w.qtype],
               HAS_BIAS=b is not None, **cfg)
    return y.view(*lead, N)


def dequantize_rows(w, ids: Tensor, dtype=None) -> Tensor:
    """Rows `ids` (int tensor, any shape) of dequant(w) -> ids.shape + (K,), default float32."""
    from ..backends.launch import launch
    N, K, rb = _check_weight(w)
    dtype = nbx.dtypes.as_dtype(dtype) if dtype is not None else nbx.float32
    if ids.dtype.kind not in "iu":
        raise TypeError(f"dequantize_rows: ids must be integers, got {ids.dtype}")
    flat = ids.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    y = Tensor._empty((flat.shape[0], K), dtype, w.device)
    if flat.shape[0]:
        BLOCK = 256
        launch(_dequant_rows_kernel, (flat.shape[0], triton.cdiv(K, BLOCK)), w.blocks, flat, y,
               K, rb, N, QTYPE=QTYPES[w.qtype], BLOCK=BLOCK, num_warps=4)
    return y.view(*ids.shape, K)
