"""cpu: convolutions with NumPy: chunked im2col GEMMs (conv), per-tap GEMMs (conv_transpose).

The op layer (ops/conv.py) hands over 3-D problems: x (N, C, D, H, W), weight
(C_out, C_in/groups, KD, KH, KW) (conv_transpose: (C_in, C_out/groups, ...)), out
(N, C_out, OD, OH, OW), any strides. The input is copied once, channels-last, into the
working precision (fp32 for 16-bit inputs, as torch on cpu; fp64 for fp64); the products
accumulate in that precision and are rounded once into `out`.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ...dispatch import register


def _work(dt):
    return np.float64 if dt.itemsize == 8 else np.float32


def _taps(ks):
    return itertools.product(*(range(k) for k in ks))


def _window(start, count, step):
    return slice(start, start + (count - 1) * step + 1, step)


def _finish(out, acc, bias, wt, activation=None):
    """acc (N, *spatial, C_out) in the working dtype -> out, bias added, the activation
    ('relu' or None) applied, rounded once."""
    if bias is not None:
        acc += bias._host_view().astype(wt)
    if activation == "relu":
        np.maximum(acc, 0, out=acc)          # NaN stays NaN, as torch
    elif activation not in (None, "none"):
        raise ValueError(f"conv: activation must be None or 'relu' on cpu, got {activation!r}")
    np.copyto(out._host_view(), np.moveaxis(acc, -1, 1), casting="unsafe")
    return out


# im2col chunks are kept near this many bytes: large enough for BLAS to run at speed, small
# enough to stay in cache and never to hold a whole image's columns at once
_CHUNK_BYTES = 8 << 20


def _chunks(n, od, oh, ow, per_pixel):
    """(n, od, oh-slice, ow-slice) blocks of output pixels, each of about _CHUNK_BYTES."""
    pix = max(1, _CHUNK_BYTES // max(per_pixel, 1))
    rows, cols = (max(1, pix // ow), ow) if pix >= ow else (1, pix)
    for b, d in itertools.product(range(n), range(od)):
        for h in range(0, oh, rows):
            for w in range(0, ow, cols):
                yield b, d, slice(h, min(h + rows, oh)), slice(w, min(w + cols, ow))


@register("conv", "numpy")
def conv(out, x, weight, bias, stride, padding, dilation, groups, precision="ieee",
         activation=None):
    """Chunked im2col: the padded channels-last input seen as windows
    (N, OD, OH, OW, KD, KH, KW, C) without a copy; each block of output pixels copies its
    columns out and takes one GEMM with the (taps * C_in/g, C_out/g) weight matrix of each
    group, accumulating in the working precision over the whole K at once."""
    wt = _work(out.dtype)
    n, c_in = x.shape[:2]
    c_out, cg = weight.shape[:2]
    ks, osz = tuple(weight.shape[2:]), tuple(out.shape[2:])
    G, og, taps = groups, c_out // groups, math.prod(ks)
    # the extent each dim needs; the high side may need less than the caller's padding
    need = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(osz, stride, dilation, ks)]
    hi = [max(e - p - i, 0) for e, p, i in zip(need, padding, x.shape[2:])]
    xa = np.moveaxis(x._host_view(), 1, -1).astype(wt)      # (N, D, H, W, C)
    xa = np.pad(xa, [(0, 0)] + list(zip(padding, hi)) + [(0, 0)])
    st = xa.strides
    win = np.lib.stride_tricks.as_strided(
        xa, (n,) + osz + ks + (c_in,),
        (st[0],) + tuple(st[i + 1] * s for i, s in enumerate(stride))
        + tuple(st[i + 1] * d for i, d in enumerate(dilation)) + (st[4],), writeable=False)
    w = weight._host_view().astype(wt)
    with np.errstate(all="ignore"):
        if cg == 1:      # depthwise (and channel multipliers): per-tap multiply-adds, no GEMM
            acc = np.zeros((n,) + osz + (c_out,), wt)
            wd = w.reshape(c_out, taps)
            for t, tap in enumerate(_taps(ks)):
                acc += np.repeat(win[(slice(None),) * 4 + tap], og, axis=-1) * wd[:, t]
            return _finish(out, acc, bias, wt, activation)
        # (G, taps * C_in/g, C_out/g): row (tap, ci) of group g's matrix
        wm = np.moveaxis(w.reshape((G, og, cg, taps)), 1, -1).transpose(0, 2, 1, 3)
        wm = np.ascontiguousarray(wm).reshape(G, taps * cg, og)
        acc = np.empty((n,) + osz + (c_out,), wt)
        for b, d, h, w in _chunks(n, osz[0], osz[1], osz[2], taps * c_in * wt().itemsize):
            cols = win[b, d, h, w]                              # (rows, cols, KD, KH, KW, C)
            p = cols.shape[0] * cols.shape[1]
            if G == 1:
                res = cols.reshape(p, taps * c_in) @ wm[0]
            else:     # (G, P, taps * C_in/g) @ (G, taps * C_in/g, C_out/g)
                a = cols.reshape(p, taps, G, cg).transpose(2, 0, 1, 3).reshape(G, p, taps * cg)
                res = np.matmul(a, wm).transpose(1, 0, 2)
            acc[b, d, h, w] = res.reshape(acc[b, d, h, w].shape)
        _finish(out, acc, bias, wt, activation)
    return out


@register("conv_transpose", "numpy")
def conv_transpose(out, x, weight, bias, stride, padding, dilation, groups,
                   precision="ieee"):
    """Each input pixel scatters weight * value to out[i * stride - padding + k * dilation]:
    per tap, one GEMM of the whole input, added into a strided window of an uncropped buffer."""
    wt = _work(out.dtype)
    n, c_in = x.shape[:2]
    cg, og = c_in // groups, weight.shape[1]
    G, c_out = groups, weight.shape[1] * groups
    ks, isz, osz = tuple(weight.shape[2:]), tuple(x.shape[2:]), tuple(out.shape[2:])
    full = [max((i - 1) * s + d * (k - 1) + 1, o + p) for i, s, d, k, o, p in
            zip(isz, stride, dilation, ks, osz, padding)]
    buf = np.zeros([n] + full + [c_out], wt)
    m = n * math.prod(isz)
    xa = np.moveaxis(x._host_view(), 1, -1).astype(wt)      # (N, D, H, W, C_in)
    a = xa.reshape(m, G, cg).transpose(1, 0, 2)               # (G, M, C_in/g)
    w = weight._host_view().astype(wt)
    with np.errstate(all="ignore"):
        for tap in _taps(ks):
            b = w[(slice(None), slice(None)) + tap].reshape(G, cg, og)
            contrib = np.matmul(a, b).transpose(1, 0, 2).reshape((n,) + isz + (c_out,))
            buf[(slice(None),) + tuple(_window(t * d, i, s) for t, d, i, s in
                                       zip(tap, dilation, isz, stride))] += contrib
        acc = buf[(slice(None),) + tuple(slice(p, p + o) for p, o in zip(padding, osz))]
        _finish(out, np.ascontiguousarray(acc), bias, wt)
    return out
