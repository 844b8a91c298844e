"""Scans whose combine is not a sum or a product: logcumsumexp (a log-add-exp prefix scan).

One kernel walks the scanned dim of a contiguous (O, N, I) view in tiles as cumsum does
(kernels/reduction.py `_scan_lanes`, `_scan_tile`: rows (I == 1) take tiles [BLOCK_K rows,
BLOCK_N], inner columns (I > 1) tiles [BLOCK_N, BLOCK_K columns], so every load is coalesced
either way), scanning each tile with tl.associative_scan and carrying the running value per
lane from tile to tile. fp16/bf16 compute in fp32, float32 and float64 in their own precision.
"""
from __future__ import annotations

import math

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from ..dispatch import register
from ..backends.launch import launch
from ..tensor import Tensor
from ._host import cdiv as _cdiv, next_pow2 as _p2
from .reduction import _scan_lanes, _scan_tile

__all__ = ["logcumsumexp", "SCAN_CONFIG"]


@triton.jit
def _log1p(x):
    # log(1 + x) for x in [0, 1] accurate where 1 + x rounds (Goldberg's trick; no libdevice,
    # so the interpreter runs the same code)
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.log(u) * (x / (u - 1.0)))


@triton.jit
def _log_add_exp(a, b):
    # log(exp(a) + exp(b)): exact at +-inf (equal infinities give themselves, never inf - inf),
    # NaN in either gives NaN; -inf is the identity
    mx = tl.maximum(a, b)
    mn = tl.minimum(a, b)
    r = mx + _log1p(tl.exp(mn - mx))
    r = tl.where((mn == mx) & (tl.abs(mx) == float("inf")), mx, r)
    return tl.where((a != a) | (b != b), a + b, r)


@triton.jit
def _logcumsumexp_kernel(x_ptr, y_ptr, O, N, I, ROW: tl.constexpr, WIDE: tl.constexpr,
                         BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    kmask, base, nn = _scan_lanes(O, N, I, ROW, BLOCK_K, BLOCK_N)
    AX: tl.constexpr = 1 if ROW else 0
    if WIDE:
        carry = tl.full([BLOCK_K], float("-inf"), tl.float64)
    else:
        carry = tl.full([BLOCK_K], float("-inf"), tl.float32)
    for n0 in range(0, N, BLOCK_N):
        m, offs = _scan_tile(kmask, base, n0 + nn, N, I, ROW)
        v = tl.load(x_ptr + offs, mask=m, other=float("-inf"))
        v = v.to(tl.float64) if WIDE else v.to(tl.float32)
        v = tl.where(m, v, float("-inf"))
        s = tl.associative_scan(v, AX, _log_add_exp)
        s = _log_add_exp(s, tl.expand_dims(carry, AX))
        carry = _log_add_exp(carry, tl.reduce(v, AX, _log_add_exp))
        tl.store(y_ptr + offs, s.to(y_ptr.dtype.element_ty), mask=m)


# tile sizes in elements; interp's are tiny so that small test shapes loop over N and
# overhang the blocks
SCAN_CONFIG = {"cuda": {"tile": 4096, "block_n": 1024, "block_k": 64},
               "interp": {"tile": 32, "block_n": 8, "block_k": 4}}


@register("logcumsumexp", "triton")
def logcumsumexp(x: Tensor, dim: int, out: Tensor) -> None:
    x = x if x.is_contiguous() else x.contiguous()
    shape = x.shape if x.ndim else (1,)
    O, N, I = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    cfg = SCAN_CONFIG[x.device.type]
    if I == 1:
        block_n = min(_p2(N), cfg["block_n"])
        block_k = max(1, min(_p2(O), cfg["tile"] // block_n))
        grid = _cdiv(O, block_k)
    else:
        block_k = min(_p2(I), cfg["block_k"])
        block_n = max(1, min(_p2(N), cfg["tile"] // block_k))
        grid = O * _cdiv(I, block_k)
    launch(_logcumsumexp_kernel, (grid,), x, out, O, N, I, ROW=I == 1,
           WIDE=x.dtype.itemsize == 8, BLOCK_K=block_k, BLOCK_N=block_n, num_warps=4)
