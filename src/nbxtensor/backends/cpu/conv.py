"""cpu: convolutions with NumPy: chunked im2col GEMMs (conv), per-tap GEMMs (conv_transpose).

The op layer (ops/conv.py) hands over 3-D problems: x (N, C, D, H, W), weight
(C_out, C_in/groups, KD, KH, KW) (conv_transpose: (C_in, C_out/groups, ...)), out
(N, C_out, OD, OH, OW), any strides. The input is copied once, channels-last and zero-padded, into the
working precision (fp32 for 16-bit inputs, as torch on cpu; fp64 for fp64); the products
accumulate in that precision and are rounded once into `out` (written in place by the
GEMMs when `out` is channels-last in that precision).
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


def _epilogue(acc, bias_w, activation):
    """In place on acc (..., C_out): the bias (already in the working dtype) added, the
    activation ('relu' or None) applied."""
    if bias_w is not None:
        acc += bias_w
    if activation == "relu":
        np.maximum(acc, 0, out=acc)          # NaN stays NaN, as torch
    elif activation not in (None, "none"):
        raise ValueError(f"conv: activation must be None or 'relu' on cpu, got {activation!r}")


def _finish(out, acc, bias, wt, activation=None):
    """acc (N, *spatial, C_out) in the working dtype -> out, bias added, the activation
    applied, rounded once."""
    _epilogue(acc, bias._host_view().astype(wt) if bias is not None else None, activation)
    np.copyto(out._host_view(), np.moveaxis(acc, -1, 1), casting="unsafe")
    return out


def _padded_channels_last(x, padding, hi, wt):
    """x (N, C, *spatial) -> a zero-padded (N, *padded, C) array in the working dtype, in
    one copy (`hi`: the high side's padding, which may be less than the low side's)."""
    n, c = x.shape[:2]
    sp = x.shape[2:]
    xa = np.zeros((n,) + tuple(i + p + h for i, p, h in zip(sp, padding, hi)) + (c,), wt)
    inner = (slice(None),) + tuple(slice(p, p + i) for p, i in zip(padding, sp))
    np.copyto(xa[inner], np.moveaxis(x._host_view(), 1, -1), casting="unsafe")
    return xa


def _acc_buffer(out, wt):
    """(N, *spatial, C_out) in the working dtype: out's own memory when it is channels-last
    and of that dtype (the GEMMs then write the result in place), else a new array."""
    v = np.moveaxis(out._host_view(), 1, -1)
    if v.dtype == wt and v.flags.c_contiguous:
        return v, True
    return np.empty(v.shape, wt), False


# im2col chunks are kept near this many bytes: large enough for BLAS to run at speed, small
# enough to stay in cache and never to hold a whole image's columns at once
_CHUNK_BYTES = 16 << 20


def _chunks(n, od, oh, ow, per_pixel):
    """(n, od, oh-slice, ow-slice) blocks of output pixels, each of about _CHUNK_BYTES."""
    pix = max(1, _CHUNK_BYTES // max(per_pixel, 1))
    rows, cols = (max(1, pix // ow), ow) if pix >= ow else (1, pix)
    for b, d in itertools.product(range(n), range(od)):
        for h in range(0, oh, rows):
            for w in range(0, ow, cols):
                yield b, d, slice(h, min(h + rows, oh)), slice(w, min(w + cols, ow))


def _pointwise(out, x, weight, bias, activation, wt):
    """A 1x1 stride-1 unpadded convolution: one GEMM of the channels-last pixels (read in
    place when x is channels-last in the working dtype) with the (C_in, C_out) weight,
    chunked by rows so each chunk's epilogue runs while it is in cache."""
    c_in, c_out = x.shape[1], weight.shape[0]
    xv = np.moveaxis(x._host_view(), 1, -1)
    a = xv.reshape(-1, c_in) if xv.flags.c_contiguous and xv.dtype == wt else \
        np.ascontiguousarray(xv, wt).reshape(-1, c_in)
    wm = np.ascontiguousarray(weight._host_view().reshape(c_out, c_in).astype(wt).T)
    bias_w = bias._host_view().astype(wt) if bias is not None else None
    acc, in_place = _acc_buffer(out, wt)
    flat = acc.reshape(-1, c_out)
    step = max(1, _CHUNK_BYTES // max(c_in * wt().itemsize, 1))
    with np.errstate(all="ignore"):
        for i in range(0, a.shape[0], step):
            np.matmul(a[i:i + step], wm, out=flat[i:i + step])
            _epilogue(flat[i:i + step], bias_w, activation)
    if not in_place:
        np.copyto(out._host_view(), np.moveaxis(acc, -1, 1), casting="unsafe")
    return out


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
    if groups == 1 and taps == 1 and set(stride) == {1} and not any(padding):
        return _pointwise(out, x, weight, bias, activation, wt)
    # the extent each dim needs; the high side may need less than the caller's padding
    need = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(osz, stride, dilation, ks)]
    hi = [max(e - p - i, 0) for e, p, i in zip(need, padding, x.shape[2:])]
    xa = _padded_channels_last(x, padding, hi, wt)           # (N, D, H, W, C)
    st = xa.strides
    win = np.lib.stride_tricks.as_strided(
        xa, (n,) + osz + ks + (c_in,),
        (st[0],) + tuple(st[i + 1] * s for i, s in enumerate(stride))
        + tuple(st[i + 1] * d for i, d in enumerate(dilation)) + (st[4],), writeable=False)
    w = weight._host_view().astype(wt)
    bias_w = bias._host_view().astype(wt) if bias is not None else None
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
        acc, in_place = _acc_buffer(out, wt)
        for b, d, h, w in _chunks(n, osz[0], osz[1], osz[2], taps * c_in * wt().itemsize):
            cols = win[b, d, h, w]                              # (rows, cols, KD, KH, KW, C)
            p = cols.shape[0] * cols.shape[1]
            dst = acc[b, d, h, w]
            flat = dst.reshape(p, c_out) if dst.flags.c_contiguous else None
            if G == 1 and flat is not None:     # the GEMM writes the output rows directly
                np.matmul(cols.reshape(p, taps * c_in), wm[0], out=flat)
            elif G == 1:
                dst[...] = (cols.reshape(p, taps * c_in) @ wm[0]).reshape(dst.shape)
            else:     # (G, P, taps * C_in/g) @ (G, taps * C_in/g, C_out/g)
                a = cols.reshape(p, taps, G, cg).transpose(2, 0, 1, 3).reshape(G, p, taps * cg)
                dst[...] = np.matmul(a, wm).transpose(1, 0, 2).reshape(dst.shape)
            _epilogue(dst, bias_w, activation)          # while the chunk is in cache
        if not in_place:
            np.copyto(out._host_view(), np.moveaxis(acc, -1, 1), casting="unsafe")
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
