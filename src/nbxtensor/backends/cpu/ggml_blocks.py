"""GGML block formats decoded with NumPy: the host reference every other decoder matches.

Each format stores a row of `n` weights as n / block_size blocks of `type_size` bytes.
`dequantize(raw, qtype, shape)` turns the raw bytes of a tensor into float32 of `shape`
(torch order: the last dim is the contiguous one, ggml's ne0).

Layouts (little-endian, one block):
  Q8_0  (32, 34 B):   f16 d | i8 q[32]                         x = d*q
  Q4_0  (32, 18 B):   f16 d | u8 qs[16]                        x = d*(nibble-8); low nibbles are
                                                               x[0:16], high nibbles x[16:32]
  Q4_1  (32, 20 B):   f16 d | f16 m | u8 qs[16]                x = d*nibble + m
  Q4_K  (256, 144 B): f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
                      8 sub-blocks of 32, 6-bit scale and min each; x = d*sc*q - dmin*mn
  Q5_K  (256, 176 B): f16 d | f16 dmin | scales[12] | qh[32] | qs[128]; q gets a 5th bit from qh
  Q6_K  (256, 210 B): ql[128] | qh[64] | i8 scales[16] | f16 d; q = 6 bits - 32, x = d*sc*q
"""
from __future__ import annotations

import math

import numpy as np

from ... import dtypes as _dt

__all__ = ["BLOCK_SIZES", "dequantize", "SUPPORTED"]

# name -> (weights per block, bytes per block); float types have block 1
BLOCK_SIZES = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "F64": (1, 8),
    "Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
}
SUPPORTED = tuple(BLOCK_SIZES)


def _f16(b: np.ndarray) -> np.ndarray:
    """Two uint8 columns (little-endian) -> float32 column."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


# Q8_0 / Q4_0 / Q4_1 write straight into the output chunk (no float temporaries: these
# are the common GGUF types and the host dequantisation is most of a cpu load)
def _q8_0(b, out):
    out[...] = b[:, 2:34].view(np.int8)
    out *= _f16(b[:, 0:2])


def _q4_0(b, out):
    qs = b[:, 2:18]
    out[:, :16] = qs & 0x0F
    out[:, 16:] = qs >> 4
    out -= 8.0
    out *= _f16(b[:, 0:2])


def _q4_1(b, out):
    qs = b[:, 4:20]
    out[:, :16] = qs & 0x0F
    out[:, 16:] = qs >> 4
    out *= _f16(b[:, 0:2])
    out += _f16(b[:, 2:4])


def _k_scales(s: np.ndarray):
    """The 8 six-bit scales and mins packed in 12 bytes (Q4_K, Q5_K) -> (nb, 8) each."""
    sc = np.empty((s.shape[0], 8), np.uint8)
    mn = np.empty((s.shape[0], 8), np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(b):
    nb = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    qs = b[:, 16:144].reshape(nb, 4, 32)
    # each 32-byte chunk j holds sub-block 2j in its low nibbles, 2j+1 in its high nibbles
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(nb, 8, 32).astype(np.float32)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(nb, 256)


def _q5_k(b):
    nb = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    qh = b[:, 16:48]                                   # (nb, 32): bit i -> sub-block i
    qs = b[:, 48:176].reshape(nb, 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(nb, 8, 32)
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = (low + (high << 4)).astype(np.float32)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(nb, 256)


def _q6_k(b):
    nb = b.shape[0]
    ql = b[:, 0:128].reshape(nb, 2, 64)               # per 128-half: 64 bytes
    qh = b[:, 128:192].reshape(nb, 2, 32)             # per half: 32 bytes
    sc = b[:, 192:208].view(np.int8).astype(np.float32).reshape(nb, 16)
    d = _f16(b[:, 208:210])
    lo_a, lo_b = ql[:, :, :32], ql[:, :, 32:]
    q1 = (lo_a & 0x0F) | (((qh >> 0) & 3) << 4)
    q2 = (lo_b & 0x0F) | (((qh >> 2) & 3) << 4)
    q3 = (lo_a >> 4) | (((qh >> 4) & 3) << 4)
    q4 = (lo_b >> 4) | (((qh >> 6) & 3) << 4)
    q = np.stack([q1, q2, q3, q4], axis=2).astype(np.float32) - 32   # (nb, 2, 4, 32)
    # scale index: 16-element groups in order, 8 per half
    s = sc.reshape(nb, 2, 4, 2)                                      # (half, quarter, l//16)
    y = q.reshape(nb, 2, 4, 2, 16) * s[..., None]
    return d * y.reshape(nb, 256)


_BLOCK_FNS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k, "Q5_K": _q5_k,
              "Q6_K": _q6_k}
_INTO = ("Q8_0", "Q4_0", "Q4_1")      # fn(blocks, out) instead of returning the floats
_FLOAT = {"F32": _dt.float32, "F16": _dt.float16, "BF16": _dt.bfloat16, "F64": _dt.float64}


def dequantize(raw: np.ndarray, qtype: str, shape, out_dtype=np.float32,
               chunk_blocks: int = 1 << 13) -> np.ndarray:
    """Raw bytes of a GGML tensor -> array of `shape` (torch order) in `out_dtype`.

    Float types are converted by the dtype table's cast rule; block types are decoded in
    chunks so the float32 temporaries stay small.
    """
    if qtype not in BLOCK_SIZES:
        raise ValueError(f"dequantize: unsupported GGML type {qtype!r}; supported: "
                         f"{', '.join(SUPPORTED)}")
    shape = tuple(int(n) for n in shape)
    numel = math.prod(shape)
    raw = np.ascontiguousarray(raw).reshape(-1)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    bs, ts = BLOCK_SIZES[qtype]
    if shape and shape[-1] % bs:
        raise ValueError(f"dequantize: {qtype} rows of {shape[-1]} weights are not a multiple "
                         f"of its block size {bs}")
    want = numel // bs * ts
    if raw.nbytes != want:
        raise ValueError(f"dequantize: {qtype} tensor of shape {shape} needs {want} bytes, "
                         f"got {raw.nbytes}")
    if qtype in _FLOAT:
        return _dt.cast(raw.view(_FLOAT[qtype].np).reshape(shape), _dt.as_dtype(out_dtype))
    blocks = raw.reshape(-1, ts)
    out = np.empty((blocks.shape[0], bs), out_dtype)
    fn = _BLOCK_FNS[qtype]
    into = qtype in _INTO and out.dtype == np.float32
    tmp = None
    for i in range(0, blocks.shape[0], chunk_blocks):
        b = blocks[i:i + chunk_blocks]
        if into:
            fn(b, out[i:i + chunk_blocks])
        elif qtype in _INTO:                # float32 chunk, then cast to out_dtype
            if tmp is None or tmp.shape[0] != b.shape[0]:
                tmp = np.empty((b.shape[0], bs), np.float32)
            fn(b, tmp)
            out[i:i + chunk_blocks] = tmp
        else:
            out[i:i + chunk_blocks] = fn(b)
    return out.reshape(shape)


def check_blocks(w, op: str):
    """The blocks of a quantised weight `w` (.blocks, .qtype, .shape = (N, K)): a contiguous
    uint8 Tensor (N, K / block size * block bytes); ValueError naming `op` otherwise."""
    from ...tensor import Tensor
    bs, ts = BLOCK_SIZES[w.qtype]
    N, K = w.shape
    if K % bs:
        raise ValueError(f"{op}: {w.qtype} needs in_features a multiple of {bs}, got {K}")
    rb = K // bs * ts
    blocks = w.blocks
    if not isinstance(blocks, Tensor) or blocks.dtype is not _dt.uint8 or \
            tuple(blocks.shape) != (N, rb) or not blocks.is_contiguous():
        raise ValueError(f"{op}: {w.qtype} weight {tuple(w.shape)} needs contiguous uint8 blocks "
                         f"of shape ({N}, {rb}), got "
                         f"{getattr(blocks, 'dtype', type(blocks).__name__)} "
                         f"{tuple(getattr(blocks, 'shape', ()))}")
    return blocks
