"""cpu: "resample" and "grid_sample" with NumPy, the contracts of kernels/resample.py.
Work is in fp32 (fp64 for fp64) and rounded once."""
from __future__ import annotations

import itertools

import numpy as np

from ...dispatch import register


def _work(x):
    return np.float64 if x.dtype.itemsize == 8 else np.float32


@register("resample", "numpy")
def resample(out, x, tables):
    wt = _work(x)
    a = x._host_view().astype(wt)
    for ax, (idx, w) in zip((2, 3, 4), tables):
        idx, w = idx._host_view(), w._host_view().astype(wt)
        if idx.shape == (a.shape[ax], 1) and (idx[:, 0] == np.arange(a.shape[ax])).all() \
                and (w == 1).all():
            continue    # an axis kept as it is
        g = np.take(a, np.maximum(idx, 0).ravel(), axis=ax)
        g = g.reshape(a.shape[:ax] + idx.shape + a.shape[ax + 1:])
        shape = [1] * g.ndim
        shape[ax], shape[ax + 1] = idx.shape
        used = (idx >= 0).reshape(shape)
        with np.errstate(all="ignore"):
            a = np.where(used, g * w.reshape(shape), wt(0)).sum(axis=ax + 1)
    out._host_view()[...] = a.astype(out.dtype.np)
    return out


def _unnormalize(g, size, align):
    return (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2


def _reflect(c, twice_lo, twice_hi):
    if twice_lo == twice_hi:
        return np.zeros_like(c)
    lo, span = twice_lo / 2, (twice_hi - twice_lo) / 2
    c = np.abs(c - lo)
    extra = np.fmod(c, span)
    flips = np.floor(c / span)
    return np.where(flips % 2 == 0, extra + lo, span - extra + lo)


def _pad(c, size, pad, align):
    if pad == "reflection":
        c = _reflect(c, 0, 2 * (size - 1)) if align else _reflect(c, -1, 2 * size - 1)
    if pad != "zeros":
        c = np.clip(c, 0, size - 1)
    return c


def _cubic(t, A=-0.75):
    def near(x):
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def far(x):
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _taps(u, size, mode, pad, align):
    """[(index, weight, in bounds)] along one axis at unnormalised coordinates u."""
    if mode == "bicubic":
        f = np.floor(u)
        res = []
        for k, w in enumerate(_cubic(u - f)):
            p = np.trunc(_pad(f - 1 + k, size, pad, align))
            res.append((p, w))
    else:
        c = _pad(u, size, pad, align)
        if mode == "bilinear":
            f = np.floor(c)
            res = [(f, f + 1 - c), (f + 1, c - f)]
        else:
            res = [(np.rint(c), np.ones_like(c))]
    out = []
    for p, w in res:
        ok = (p >= 0) & (p <= size - 1)
        out.append((np.where(ok, p, 0).astype(np.int64), w, ok))
    return out


@register("grid_sample", "numpy")
def grid_sample(out, x, grid, *, mode, padding_mode, align_corners, three_d):
    wt = _work(x)
    a = x._host_view().astype(wt)                          # (N, C, D, H, W)
    g = grid._host_view().astype(wt)                       # (N, OD, OH, OW, K)
    N, C, D, H, W = a.shape
    nb = np.arange(N)[:, None, None, None, None]
    cb = np.arange(C)[None, :, None, None, None]
    acc = np.zeros(out.shape, wt)
    with np.errstate(all="ignore"):
        axes = [_taps(_unnormalize(g[..., 0], W, align_corners), W, mode, padding_mode,
                      align_corners),
                _taps(_unnormalize(g[..., 1], H, align_corners), H, mode, padding_mode,
                      align_corners)]
        axes.append(_taps(_unnormalize(g[..., 2], D, align_corners), D, mode, padding_mode,
                          align_corners) if three_d
                    else [(np.zeros(g.shape[:4], np.int64), np.ones(g.shape[:4], wt),
                           np.ones(g.shape[:4], bool))])
        for (ix, wx, okx), (iy, wy, oky), (iz, wz, okz) in itertools.product(*axes):
            ok = (okx & oky & okz)[:, None]
            v = a[nb, cb, iz[:, None], iy[:, None], ix[:, None]]
            acc += np.where(ok, (wz * wy * wx)[:, None] * v, wt(0))
    out._host_view()[...] = acc.astype(out.dtype.np)
    return out
