"""GGML-quantised weights on the device: fused dequantise-GEMV and row dequantisation.

Weights stay as their GGUF blocks, one row of bytes per output feature (the GEMV also
takes Q4_K / Q5_K / Q6_K, laid out below, and dequantise-then-GEMM for prefill):
  Q8_0: 34-byte blocks of 32 weights   f16 d | i8 q[32]            w = d*q
  Q4_1: 20-byte blocks of 32 weights   f16 d | f16 m | u8 qs[16]   w = d*nibble + m
        (weight j < 16 is the low nibble of qs[j], weight j >= 16 the high nibble of qs[j-16])

`quant_linear(x, w)` computes x @ dequant(w).T without materialising the weight: one
program owns BLOCK_N output features of one input row and walks K in BLOCK_K steps,
decoding the blocks in registers (fp32 accumulation). Decode (M = 1) reads each weight
byte once, which is the point: 4.5 (Q4_1: 5) bits a weight instead of 16.
`dequantize_rows(w, ids)` decodes whole rows (embedding lookup) and `dequantize(w)` the
whole weight (used at load for formats without a fused GEMV). Those two also know
  Q4_0: 18-byte blocks of 32    f16 d | u8 qs[16]                  w = d*(nibble-8), nibbles as Q4_1
  Q4_K: 144-byte blocks of 256  f16 d | f16 dmin | u8 sc[12] | u8 qs[128]
        8 sub-blocks of 32 with 6-bit scale/min (packing: _k_scale_min); w = (d*sc)*q - dmin*mn;
        sub-block j's nibbles: the low (j even) or high (j odd) halves of qs[32*(j//2) : +32]
  Q5_K: 176-byte blocks of 256  f16 d | f16 dmin | u8 sc[12] | u8 qh[32] | u8 qs[128]
        as Q4_K with a 5th bit: bit j of qh[l] -> element l of sub-block j
  Q6_K: 210-byte blocks of 256  u8 ql[128] | u8 qh[64] | i8 sc[16] | f16 d;  w = d*(q*sc)
        element e = 128h + 32c + l: ql[64h + 32(c%2) + l] nibble c//2, qh[32h + l] bits 2c..2c+1,
        q = 6 bits - 32, sc[e // 16]
  F32 / F16 / BF16 rows (a plain cast, so loaders can send float tensors the same way).
These reproduce backends/cpu/ggml_blocks.py (the host reference, itself checked against the `gguf`
package) bit for bit in float32: the fp16 -> fp32 scale conversion is exact and every
product of an fp16 scale with the small integers fits fp32's 24-bit significand (Q4_K/Q5_K
d*sc*q: 11+6+5 bits; Q6_K d*(q*sc): 11+12; Q8_0: 11+7), so only a final add/sub rounds --
the order of the products and FMA contraction (ptxas fuses (d*sc)*q - dmin*mn) cannot
change a bit. Other dtypes are one rounding of that float32 value.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import dtypes as _dt
from ..dispatch import register
from ..tensor import Tensor
from ._common import device_facts
from ._host import cdiv as _cdiv, next_pow2 as _np2
from .indexing import _after, _flag, _flag_bad_lanes, _tag
from .int4 import field_bias, field_minus


# QTYPES: formats with the fused dequantise-GEMV (quant_linear); DEQUANT_QTYPES: formats
# `dequantize_rows` / `dequantize` decode on the device. name -> (kernel code,
# weights per block, bytes per block)
# The K-quants' GEMV decodes each element in registers with _decode_more (its block's
# scale bytes are re-read per element and hit L1); with more than KQ_GEMV_MAX_M rows
# (prefill) quant_linear dequantises the weight once per call (dequantize below) and runs
# the GEMM instead: the tuned matmul keeps its tensor-core tiles, and the K*N-element
# write is small next to 2*M*K*N flops.
QTYPES = {"Q8_0": 0, "Q4_1": 1, "Q4_K": 3, "Q5_K": 4, "Q6_K": 5}
KQUANTS = ("Q4_K", "Q5_K", "Q6_K")
# the K-quants whose GEMV loads packed words (`_kq_gemv_kernel`), and its tile
# the K-quant GEMVs' tiles (BLOCK_N rows x BLOCK_S super-blocks a step), the fastest of
# `probe_quant.py kq` on the H200 for 4096 x 14336 at batch 1 (Q4_K 30.5 us, Q5_K 41.6,
# Q6_K 40.6; Q6_K's byte-decoding kernel took 274 us)
KQ_TILES = {"Q4_K": dict(BLOCK_N=16, BLOCK_S=4, num_warps=2),
            "Q5_K": dict(BLOCK_N=16, BLOCK_S=4, num_warps=2),
            "Q6_K": dict(BLOCK_N=16, BLOCK_S=4, num_warps=4, PACKED=True)}
KQ_GEMV_MAX_M = 8
DEQUANT_QTYPES = {
    "Q8_0": (0, 32, 34), "Q4_1": (1, 32, 20), "Q4_0": (2, 32, 18), "Q4_K": (3, 256, 144),
    "Q5_K": (4, 256, 176), "Q6_K": (5, 256, 210), "F32": (6, 1, 4), "F16": (7, 1, 2),
    "BF16": (8, 1, 2),
}


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
    elif QTYPE == 1:
        base = row_off + blk * 20
        d = tl.load((w_ptr + base).to(tl.pointer_type(tl.float16)), mask=mask, other=0.0)
        m = tl.load((w_ptr + base + 2).to(tl.pointer_type(tl.float16)), mask=mask, other=0.0)
        byte = tl.load(w_ptr + base + 4 + (j % 16), mask=mask, other=0).to(tl.int32)
        q = tl.where(j < 16, byte & 15, byte >> 4)
        return d.to(tl.float32) * q.to(tl.float32) + m.to(tl.float32)
    else:
        return _decode_more(w_ptr, row_off, k, mask, QTYPE)


@triton.jit
def _f16_at(ptr, mask):
    """The fp16 at byte address `ptr` (2-aligned: every block and row size here is even)."""
    return tl.load(ptr.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _k_scale_min(sc_ptr, j, mask):
    """Scale and min of sub-block j (0..7) from the 12 packed bytes at sc_ptr (Q4_K, Q5_K):
    j < 4: scale = b[j] & 63, min = b[j+4] & 63;
    j >= 4: scale = b[j+4] & 15 | (b[j-4] >> 6) << 4, min = b[j+4] >> 4 | (b[j] >> 6) << 4."""
    lo = j < 4
    bj = tl.load(sc_ptr + j, mask=mask, other=0).to(tl.int32)
    bj4 = tl.load(sc_ptr + j + 4, mask=mask, other=0).to(tl.int32)
    bjm = tl.load(sc_ptr + tl.where(lo, j, j - 4), mask=mask, other=0).to(tl.int32)
    sc = tl.where(lo, bj & 63, (bj4 & 15) | ((bjm >> 6) << 4))
    mn = tl.where(lo, bj4 & 63, (bj4 >> 4) | ((bj >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _decode_more(w_ptr, row_off, k, mask, QTYPE: tl.constexpr):
    """As _decode, for the formats decoded only by the dequantisation kernel (codes 2..8).
    Each element finds its own block and scale bytes (repeats hit the cache)."""
    if QTYPE == 2:                                   # Q4_0
        base = w_ptr + row_off + (k // 32) * 18
        j = k % 32
        d = _f16_at(base, mask)
        byte = tl.load(base + 2 + (j % 16), mask=mask, other=0).to(tl.int32)
        q = tl.where(j < 16, byte & 15, byte >> 4) - 8
        return d * q.to(tl.float32)
    elif QTYPE == 3 or QTYPE == 4:                   # Q4_K, Q5_K
        e = k % 256
        j = e // 32                                  # sub-block
        l = e % 32
        if QTYPE == 3:
            base = w_ptr + row_off + (k // 256) * 144
            qs = base + 16
        else:
            base = w_ptr + row_off + (k // 256) * 176
            qs = base + 48
        d = _f16_at(base, mask)
        dmin = _f16_at(base + 2, mask)
        sc, mn = _k_scale_min(base + 4, j, mask)
        byte = tl.load(qs + (j // 2) * 32 + l, mask=mask, other=0).to(tl.int32)
        q = (byte >> ((j % 2) * 4)) & 15
        if QTYPE == 4:
            qh = tl.load(base + 16 + l, mask=mask, other=0).to(tl.int32)
            q += ((qh >> j) & 1) << 4
        return (d * sc) * q.to(tl.float32) - dmin * mn
    elif QTYPE == 5:                                 # Q6_K
        base = w_ptr + row_off + (k // 256) * 210
        e = k % 256
        h = e // 128
        c = (e % 128) // 32
        l = e % 32
        lo = tl.load(base + h * 64 + (c % 2) * 32 + l, mask=mask, other=0).to(tl.int32)
        hi = tl.load(base + 128 + h * 32 + l, mask=mask, other=0).to(tl.int32)
        q = (((lo >> ((c // 2) * 4)) & 15) | (((hi >> (c * 2)) & 3) << 4)) - 32
        sc = tl.load((base + 192 + e // 16).to(tl.pointer_type(tl.int8)), mask=mask, other=0)
        d = _f16_at(base + 208, mask)
        return d * (q.to(tl.float32) * sc.to(tl.float32))
    elif QTYPE == 6:                                 # F32
        return tl.load((w_ptr + row_off + k * 4).to(tl.pointer_type(tl.float32)), mask=mask,
                       other=0.0)
    elif QTYPE == 7:                                 # F16
        return _f16_at(w_ptr + row_off + k * 2, mask)
    else:                                            # BF16
        return tl.load((w_ptr + row_off + k * 2).to(tl.pointer_type(tl.bfloat16)), mask=mask,
                       other=0.0).to(tl.float32)


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
def _kq_field(v, I: tl.constexpr, zero, Q5: tl.constexpr):
    """Element field I of a word `v` as exact float32 (int4.field_minus). Q4_K: nibble I of
    a qs word (byte I // 2, the low nibble for even I); Q5_K: byte I of a 5-bit lane word
    (`_kq_gemv_kernel`). Fields are moved below bit 20 first."""
    if Q5:
        if I == 3:
            v = v >> 8
        P: tl.constexpr = 16 if I == 3 else 8 * I
        return field_minus(v, P, 31, zero, field_bias(0.0, P))
    else:
        if I >= 5:
            v = v >> 12
        P: tl.constexpr = 4 * I - 12 if I >= 5 else 4 * I
        return field_minus(v, P, 15, zero, field_bias(0.0, P))


@triton.jit
def _kq_gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, row_bytes, stride_xm, stride_xk,
                    stride_ym, QTYPE: tl.constexpr, HAS_BIAS: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr):
    """Q4_K / Q5_K y[m, n] for BLOCK_N rows, BLOCK_S super-blocks a step. A super-block's
    128 qs bytes load as 16-byte vectors into a (blocks, 4 pairs, rows, 8 words) tile: word
    u of pair p holds elements 4u..4u+3 of sub-block 2p (low nibbles) and 2p+1 (high). The
    rows come last but one so that Triton's layout spreads threads over words, pairs and
    blocks first and keeps several rows in each thread (each x value it loads serves them
    all). Q5_K first merges the 5th bits into two words of four 5-bit byte lanes (L:
    sub-block 2p, H: 2p + 1; bit 2p + h of qh byte l belongs to element l). Each element
    costs one LOP3, one FADD and one FFMA (no int-to-float conversion: int4.field_minus);
    the sub-block scales d * sc (`_k_scale_min`) multiply the per-word sums, and the mins
    enter as dmin * mn * (the sub-block's sum of x)."""
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    TS: tl.constexpr = 144 if QTYPE == 3 else 176
    QS: tl.constexpr = 16 if QTYPE == 3 else 48
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.where(n < N, n, 0).to(tl.int64) * row_bytes     # tail rows re-read row 0
    nblk = K // 256
    s = tl.arange(0, BLOCK_S)
    p4 = tl.arange(0, 4)[None, :, None, None]
    h4 = tl.arange(0, 2)[None, None, None, :]
    u4 = tl.arange(0, 8)[None, None, None, :]
    r4 = rows[None, None, :, None]
    x_row = x_ptr + m * stride_xm
    zero = N >> 31          # 0 (N > 0), unknown to the compiler: see int4.field_minus
    acc = tl.zeros((BLOCK_S, 4, BLOCK_N, 8), tl.float32)
    accm = tl.zeros((BLOCK_S, 4, BLOCK_N, 2), tl.float32)
    for b0 in range(0, nblk, BLOCK_S):
        blk1 = b0 + s
        bok1 = blk1 < nblk
        blk1 = tl.where(bok1, blk1, 0)                         # tail blocks re-read block 0
        blk = blk1[:, None, None, None]
        bok = bok1[:, None, None, None]
        base = w_ptr + r4 + blk * TS                          # (S, 1, BN, 1) block starts
        # scales and mins of sub-blocks 2p + h: (S, 4, BN, 2); the sub-blocks' sums of x
        d = _f16_at(base, bok)                 # 0 for tail blocks: their products vanish
        dmin = _f16_at(base + 2, bok)
        sc, mn = _k_scale_min(base + 4, 2 * p4 + h4, bok)
        xs = x_row + ((256 * blk + 64 * p4 + 32 * h4)[:, :, :, :, None]
                      + tl.arange(0, 32)[None, None, None, None, :]) * stride_xk
        xsum = tl.sum(tl.load(xs, mask=bok[:, :, :, :, None], other=0.0).to(tl.float32),
                      axis=4)                                  # (S, 4, 1, 2)
        accm += (dmin * mn) * xsum
        ds_lo, ds_hi = tl.split(d * sc)
        ds_lo = ds_lo[:, :, :, None]
        ds_hi = ds_hi[:, :, :, None]
        # the quants: (S, 4, BN, 8) words
        W = tl.load((base + QS).to(tl.pointer_type(tl.int32)) + 8 * p4 + u4)
        # x pointers (S, 4, 8), expanded over the rows after the load: loaded so, they take
        # the slice of the words' layout (a 4-D (S, 4, 1, 8) load would get a layout of
        # its own, and Triton would convert every product to it)
        xe = x_row + (256 * blk1[:, None, None] + 64 * tl.arange(0, 4)[None, :, None]
                      + 4 * tl.arange(0, 8)[None, None, :]) * stride_xk
        lo = tl.zeros((BLOCK_S, 4, BLOCK_N, 8), tl.float32)
        hi = tl.zeros((BLOCK_S, 4, BLOCK_N, 8), tl.float32)
        if QTYPE == 4:
            qh = tl.load((base + 16).to(tl.pointer_type(tl.int32)) + u4) >> (2 * p4)
            lo_w = (W & 0x0F0F0F0F) | ((qh << 4) & 0x10101010)
            hi_w = ((W >> 4) & 0x0F0F0F0F) | ((qh << 3) & 0x10101010)
            for k in tl.static_range(4):
                xl = tl.load(xe + k * stride_xk).to(tl.float32)[:, :, None, :]
                xh = tl.load(xe + (32 + k) * stride_xk).to(tl.float32)[:, :, None, :]
                lo += _kq_field(lo_w, k, zero, True) * xl
                hi += _kq_field(hi_w, k, zero, True) * xh
        else:
            for i in tl.static_range(8):
                xi = tl.load(xe + (32 * (i % 2) + i // 2) * stride_xk).to(
                    tl.float32)[:, :, None, :]
                if i % 2 == 0:
                    lo += _kq_field(W, i, zero, False) * xi
                else:
                    hi += _kq_field(W, i, zero, False) * xi
        acc += ds_lo * lo + ds_hi * hi
    out = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=1), axis=0)
    out -= tl.sum(tl.sum(tl.sum(accm, axis=3), axis=1), axis=0)
    if HAS_BIAS:
        out += tl.load(b_ptr + n, mask=n < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + n, out.to(y_ptr.dtype.element_ty), mask=n < N)


@triton.jit
def _q6k_gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, row_bytes, stride_xm, stride_xk,
                     stride_ym, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_S: tl.constexpr):
    """Q6_K y[m, n] for BLOCK_N rows, BLOCK_S super-blocks a step. Blocks are 210 bytes
    (2-byte aligned), so ql and qh load as uint16 pairs into (blocks, half h, 16-element
    half lh, rows, pair l8) tiles: pair l8 of ql row cc holds elements l = 16 lh + 2 l8 + b
    (byte b) of columns c = cc (low nibbles) and cc + 2 (high) of half h; their two high bits
    sit at bits 8b + 2c of the qh pair, which a shift by 4 - 2cc moves next to each nibble,
    so each 6-bit field is one mask away (int4.field_minus, minus 32). The 16 scales are one
    per (h, c, lh): they multiply the per-pair sums."""
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.where(n < N, n, 0).to(tl.int64) * row_bytes     # tail rows re-read row 0
    nblk = K // 256
    s = tl.arange(0, BLOCK_S)
    h5 = tl.arange(0, 2)[None, :, None, None, None]
    lh5 = tl.arange(0, 2)[None, None, :, None, None]
    l85 = tl.arange(0, 8)[None, None, None, None, :]
    r5 = rows[None, None, None, :, None]
    h4 = tl.arange(0, 2)[None, :, None, None]
    lh4 = tl.arange(0, 2)[None, None, :, None]
    l84 = tl.arange(0, 8)[None, None, None, :]
    x_row = x_ptr + m * stride_xm
    zero = N >> 31          # 0 (N > 0), unknown to the compiler: see int4.field_minus
    acc = tl.zeros((BLOCK_S, 2, 2, BLOCK_N, 8), tl.float32)
    for b0 in range(0, nblk, BLOCK_S):
        blk1 = b0 + s
        bok1 = blk1 < nblk
        blk1 = tl.where(bok1, blk1, 0)                         # tail blocks re-read block 0
        blk5 = blk1[:, None, None, None, None]
        base = w_ptr + r5 + blk5 * 210                        # (S, 1, 1, BN, 1)
        d = _f16_at(base + 208, bok1[:, None, None, None, None])   # 0 for tail blocks
        pair = base + 64 * h5 + 16 * lh5 + 2 * l85
        ql0 = tl.load(pair.to(tl.pointer_type(tl.uint16))).to(tl.int32)
        ql1 = tl.load((pair + 32).to(tl.pointer_type(tl.uint16))).to(tl.int32)
        qh = tl.load((base + 128 + 32 * h5 + 16 * lh5 + 2 * l85).to(
            tl.pointer_type(tl.uint16))).to(tl.int32)
        # x of the step: (S, 2, 2, 8) pointers, expanded over the rows after the load
        xe = x_row + (256 * blk1[:, None, None, None] + 128 * h4 + 16 * lh4 + 2 * l84) \
            * stride_xk
        sc_base = base + 192 + 8 * h5 + lh5                    # + 2c: scale of (h, c, lh)
        for cc in tl.static_range(2):
            ql = ql0 if cc == 0 else ql1
            hb = qh << (4 - 2 * cc)
            lo_w = (ql & 0x0F0F) | (hb & 0x3030)                # c = cc, bytes 0 and 1
            hi_w = (ql & 0xF0F0) | (hb & 0x30300)               # c = cc + 2
            for nib in tl.static_range(2):
                v = lo_w if nib == 0 else hi_w
                p = tl.zeros((BLOCK_S, 2, 2, BLOCK_N, 8), tl.float32)
                for b in tl.static_range(2):
                    xv = tl.load(xe + (32 * (cc + 2 * nib) + b) * stride_xk).to(tl.float32)
                    p += _q6_field(v, 8 * b + 4 * nib, zero) * xv[:, :, :, None, :]
                scv = tl.load((sc_base + 2 * (cc + 2 * nib)).to(
                    tl.pointer_type(tl.int8))).to(tl.float32)
                acc += (d * scv) * p
    out = tl.sum(tl.sum(tl.sum(tl.sum(acc, axis=4), axis=2), axis=1), axis=0)
    if HAS_BIAS:
        out += tl.load(b_ptr + n, mask=n < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + n, out.to(y_ptr.dtype.element_ty), mask=n < N)


@triton.jit
def _q6_field(v, P: tl.constexpr, zero):
    """The 6-bit field at bit P of `v`, minus 32, as exact float32 (int4.field_minus)."""
    return field_minus(v, P, 63, zero, field_bias(32.0, P))


@triton.jit
def _dequant_rows_kernel(w_ptr, ids_ptr, y_ptr, flag_ptr, tag, K, row_bytes, n_rows,
                         QTYPE: tl.constexpr, BLOCK: tl.constexpr, HAS_IDS: tl.constexpr = True):
    i = tl.program_id(0)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    if HAS_IDS:
        r = tl.load(ids_ptr + i).to(tl.int64)
    else:                                  # whole weight: output row i is weight row i
        r = i.to(tl.int64)
    ok = (r >= 0) & (r < n_rows)
    if HAS_IDS:
        # an out-of-range id is recorded in the index-error flag (once per id, by the row's
        # first program) and writes NaN: nothing outside the weight is read
        if (tl.program_id(1) == 0) & (~ok):
            _flag_bad_lanes(flag_ptr, ~ok, r, tag)
    mask = (k < K) & ok
    w = _decode(w_ptr, r * row_bytes, k, mask, QTYPE)
    w = tl.where(ok, w, float("nan"))
    tl.store(y_ptr + i.to(tl.int64) * K + k, w.to(y_ptr.dtype.element_ty), mask=k < K)


# ----------------------------------------------------------------------------- launch config
def _gemv_config(N: int, K: int, M: int, dev, qtype=None):
    """The launch config for `dev` (kernels/_common.DeviceFacts)."""
    if qtype in KQ_TILES:
        # the packed kernels (a config with PACKED=False sends Q6_K to the byte-decoding
        # kernel of the other formats)
        return dict(KQ_TILES[qtype])
    if dev.type != "cuda":
        # the interpreter pays per program, not per element: few, wide programs
        return dict(BLOCK_N=32, BLOCK_K=128, num_warps=4)
    # decode (M = 1): enough programs to cover the device's SMs twice even for a 576-wide
    # layer on an H200 (BLOCK_N down to 2), with a tile of >= 512 weights per step
    if M == 1:
        target = 2 * dev.sms
        bn = 1 << max(0, min(5, (N // target).bit_length() - 1)) if N >= target else 1
    else:
        bn = 32
    bk = min(512, max(128, 512 // bn))
    return dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=4)


def _block_for(qtype, K, block):
    if block is not None:
        if block <= 0 or block & (block - 1):
            raise ValueError(f"quant kernels: block must be a power of two, got {block}")
        return block
    # Q8_0/Q4_1 keep their original 256; the rest get wider programs (their rows are
    # multiples of 256 or plain floats), capped by the row length
    if qtype in ("Q8_0", "Q4_1"):
        return 256
    return max(128, min(1024, _np2(K)))


# ----------------------------------------------------------------------------- Python entry
def _check_weight(w):
    """The fused-GEMV formats (Q8_0, Q4_1): (N, K, row bytes)."""
    if w.qtype not in QTYPES:
        raise ValueError(f"quant kernels: qtype {w.qtype!r} has no device kernel; supported: "
                         f"{', '.join(QTYPES)} (dequantise others at load)")
    return _check_blocks(w, "quant kernels")


def _check_blocks(w, who):
    """Any DEQUANT_QTYPES weight: (N, K, row bytes); blocks must be (N, row bytes) uint8."""
    if w.qtype not in DEQUANT_QTYPES:
        raise ValueError(f"{who}: qtype {w.qtype!r} has no device kernel; supported: "
                         f"{', '.join(DEQUANT_QTYPES)}")
    if len(w.shape) != 2:
        raise ValueError(f"{who}: weight shape must be (rows, cols), got {w.shape}")
    N, K = w.shape
    _, bs, ts = DEQUANT_QTYPES[w.qtype]
    if K % bs:
        raise ValueError(f"{who}: in_features {K} must be a multiple of {bs} for {w.qtype}")
    rb = K // bs * ts
    if tuple(w.blocks.shape) != (N, rb) or w.blocks.dtype is not _dt.uint8:
        raise ValueError(f"{who}: {w.qtype} weight {w.shape} needs uint8 blocks of shape "
                         f"({N}, {rb}), got {w.blocks.dtype} {tuple(w.blocks.shape)}")
    if not w.blocks.is_contiguous():
        raise ValueError(f"{who}: weight blocks must be contiguous")
    if w.blocks.device.type not in ("cuda", "interp"):
        raise ValueError(f"{who}: weight blocks are on {w.blocks.device}; the kernels run on "
                         f"cuda or interp (cpu dequantises with nbxtensor.backends.cpu.ggml_blocks)")
    # fp16 scales / float elements are read in place: the row start must be aligned for them
    align = 4 if w.qtype == "F32" else 2
    if w.blocks.numel() and w.blocks.data_ptr() % align:
        raise ValueError(f"{who}: {w.qtype} blocks must start at a {align}-byte aligned address")
    return N, K, rb


def quant_linear(x: Tensor, w, b: Tensor | None = None, *, block_n=None, block_k=None,
                 config=None) -> Tensor:
    """x (..., K) @ dequant(w).T (+ b) -> (..., N) in x's dtype; x on cuda or interp: the
    GEMV (a K-quant prefill of more than KQ_GEMV_MAX_M rows is dequantised and multiplied by
    ops/decode.quant_linear instead). block_n / block_k override the launch config (tests use
    them to force tails), `config` any of its keys (benchmark sweeps)."""
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
    if b is not None and N > 1 and b.stride(0) != 1:
        b = b.contiguous()   # the kernel reads the bias at b_ptr + n
    if M and N:
        cfg = _gemv_config(N, K, M, device_facts(x.device), w.qtype)
        if config:
            cfg.update(config)
        if block_n is not None:
            cfg["BLOCK_N"] = block_n
        if block_k is not None:
            cfg["BLOCK_K"] = block_k
        grid = (_cdiv(N, cfg["BLOCK_N"]), M)
        if w.qtype == "Q6_K" and cfg.get("PACKED"):
            launch(_q6k_gemv_kernel, grid, x2, w.blocks, b if b is not None else y, y, N, K,
                   rb, x2.stride(0), x2.stride(1), y.stride(0), HAS_BIAS=b is not None,
                   BLOCK_N=cfg["BLOCK_N"], BLOCK_S=min(cfg.get("BLOCK_S", 4), _np2(K // 256)),
                   num_warps=cfg["num_warps"])
            return y.view(*lead, N)
        if w.qtype in ("Q4_K", "Q5_K"):
            launch(_kq_gemv_kernel, grid, x2, w.blocks, b if b is not None else y, y, N, K, rb,
                   x2.stride(0), x2.stride(1), y.stride(0), QTYPE=QTYPES[w.qtype],
                   HAS_BIAS=b is not None, BLOCK_N=cfg["BLOCK_N"],
                   BLOCK_S=min(cfg.get("BLOCK_S", 4), _np2(K // 256)),
                   num_warps=cfg["num_warps"])
            return y.view(*lead, N)
        launch(_quant_gemv_kernel, grid, x2, w.blocks, b if b is not None else y, y, N, K, rb,
               x2.stride(0), x2.stride(1), y.stride(0), QTYPE=QTYPES[w.qtype],
               HAS_BIAS=b is not None, **cfg)
    return y.view(*lead, N)


_OUT_DTYPES = None


def _out_dtype(dtype, who):
    global _OUT_DTYPES
    if _OUT_DTYPES is None:
        _OUT_DTYPES = (_dt.float32, _dt.bfloat16, _dt.float16, _dt.float64)
    dt = _dt.as_dtype(dtype) if dtype is not None else _dt.float32
    if dt not in _OUT_DTYPES:
        raise TypeError(f"{who}: dtype must be one of float32, bfloat16, float16, float64 "
                        f"(one rounding of the float32 value), got {dt}")
    return dt


def _check_out(out, shape, dtype, device, who):
    if out is None:
        return Tensor._empty(shape, dtype, device)
    if not isinstance(out, Tensor) or tuple(out.shape) != tuple(shape) or out.dtype is not dtype \
            or out.device != device or not out.is_contiguous():
        raise ValueError(f"{who}: out must be a contiguous {dtype} tensor of shape {tuple(shape)} "
                         f"on {device}, got " + (f"{out.dtype} {tuple(out.shape)} on {out.device}"
                                                 if isinstance(out, Tensor) else
                                                 type(out).__name__))
    return out


def dequantize_rows(w, ids: Tensor, dtype=None, *, out=None, block=None) -> Tensor:
    """Rows `ids` (int tensor, any shape) of dequant(w) -> ids.shape + (K,), default float32.

    Every format in DEQUANT_QTYPES; an id outside [0, N) raises IndexError as nbx.embedding
    does (at the call on interp, at the next synchronising call on cuda: kernels/indexing.py)
    and its row is NaN meanwhile (no out-of-bounds read). `dtype` float32/bfloat16/float16/
    float64 is one rounding of the float32 value, equal to nbxtensor.backends.cpu.ggml_blocks.dequantize.
    `out` (contiguous, ids.numel() x K elements of `dtype`; dtype defaults to out's) receives
    the result. `block` overrides the columns per program (tests use it to force tails)."""
    from ..backends.launch import launch
    N, K, rb = _check_blocks(w, "dequantize_rows")
    if dtype is None and out is not None:
        dtype = out.dtype
    dtype = _out_dtype(dtype, "dequantize_rows")
    if not isinstance(ids, Tensor) or ids.dtype.kind not in "iu":
        raise TypeError(f"dequantize_rows: ids must be an integer tensor, got "
                        f"{getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.device != w.device:
        raise ValueError(f"dequantize_rows: ids are on {ids.device}, weight on {w.device}")
    flat = ids.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    y = _check_out(out, tuple(ids.shape) + (K,), dtype, w.device, "dequantize_rows")
    y = y.view(flat.shape[0], K)
    if flat.shape[0] and K:
        BLOCK = _block_for(w.qtype, K, block)
        err = ("dequantize_rows", f"a weight of {N} rows", 0, N)
        launch(_dequant_rows_kernel, (flat.shape[0], _cdiv(K, BLOCK)), w.blocks, flat, y,
               _flag(w.device), _tag(err), K, rb, N, QTYPE=DEQUANT_QTYPES[w.qtype][0],
               BLOCK=BLOCK, num_warps=4)
        _after(w.device, err)
    return out if out is not None else y.view(*ids.shape, K)


def dequantize(w, dtype=None, *, out=None, block=None) -> Tensor:
    """The whole (N, K) weight dequantised on its device (float32 by default), bit-equal to
    nbxtensor.backends.cpu.ggml_blocks.dequantize(raw, qtype, (N, K), dtype). `w` has .blocks (uint8
    (N, row bytes) on cuda/interp), .qtype and .shape, as models._ops.QuantWeight."""
    from ..backends.launch import launch
    N, K, rb = _check_blocks(w, "dequantize")
    if dtype is None and out is not None:
        dtype = out.dtype
    dtype = _out_dtype(dtype, "dequantize")
    y = _check_out(out, (N, K), dtype, w.device, "dequantize")
    if N and K:
        BLOCK = _block_for(w.qtype, K, block)
        # ids_ptr and flag_ptr are unused (HAS_IDS=False); any pointer of the device will do
        launch(_dequant_rows_kernel, (N, _cdiv(K, BLOCK)), w.blocks, w.blocks, y, w.blocks, 3,
               K, rb, N, QTYPE=DEQUANT_QTYPES[w.qtype][0], BLOCK=BLOCK, HAS_IDS=False,
               num_warps=4)
    return y


# the quantised-weight ops on cuda/interp (ops/decode.py validates the shared arguments)
register("quant_linear", "triton")(quant_linear)
register("quant_dequantize", "triton")(dequantize)


@register("quant_embedding", "triton")
def quant_embedding(ids, w):
    return dequantize_rows(w, ids)
