"""Resampling: interpolate (and the older upsample spellings), grid_sample, affine_grid,
pixel_shuffle / pixel_unshuffle, unfold / fold, with torch's names, arguments and semantics.

interpolate's modes are separable: along each spatial axis, output o is a weighted sum of a
few input positions (its taps). This module computes each axis's taps once, in float64 on
the host, as torch's formulas give them (nearest's indices in float32 arithmetic, as torch,
since an index is exact or wrong), and the "resample" dispatch applies them on any device:
  * nearest: floor(o * scale); nearest-exact: floor((o + 0.5) * scale); both <= size - 1.
  * linear / bilinear / trilinear: two taps at the source coordinate
    (o + 0.5) * scale - 0.5 clamped at 0, or o * (in - 1) / (out - 1) with align_corners.
  * bicubic: four taps around the same coordinate (not clamped), Keys' cubic with A = -0.75,
    positions clamped to the input.
  * antialias (bilinear, bicubic): torch's separable filter -- the triangle or the A = -0.5
    cubic stretched by the downscaling factor, normalised per output.
  * area: adaptive_avg_pool.
`scale` is 1 / scale_factor when a scale_factor is given (and recompute_scale_factor is not
True), else in / out. Many taps on several axes (antialiasing) run one axis at a time
through an fp32 buffer. The output keeps the input's layout (channels-last stays so).
(torch 2.13's CPU antialias kernel repeats the first column for an input and output width
of 1; this filters such an image as any other, as torch does its transpose.)

grid_sample samples input (N, C, H, W) [or (N, C, D, H, W)] at grid (N, Ho, Wo, 2) [(N, Do,
Ho, Wo, 3)] holding (x, y[, z]) in [-1, 1]: bilinear/nearest (half to even)/bicubic (4-D
only, A = -0.75), padding_mode zeros/border/reflection; torch's formulas (kernels/resample.py).
Its output keeps a channels-last input's layout (torch returns NCHW there; the values are the
same, and the kernel's loads stay coalesced).
pixel_shuffle, pixel_unshuffle and unfold are views and a copy (the result is contiguous,
also for a channels-last input, where torch keeps channels-last); fold sums the columns into
an fp32 (fp64) buffer, rounded once.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import dtypes as _dt
from .. import plans as _plans
from ..dispatch import impl
from ..tensor import Tensor
from ._common import check_float, check_like_input, check_tensor
from .conv import _as3d, _ints
from .pooling import _new_like, adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d

__all__ = ["interpolate", "upsample", "upsample_nearest", "upsample_bilinear", "grid_sample",
           "affine_grid", "pixel_shuffle", "pixel_unshuffle", "unfold", "fold"]

SUPPORTED_DTYPES = {n: ("float16", "bfloat16", "float32", "float64")
                    for n in ("resample", "grid_sample")}

_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")
_NDIM = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}
FUSED_TAPS = 16     # the most taps per output element one fused pass takes


# ------------------------------------------------------------------------------ tap tables
def _cubic(x, a):
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def _linear_scale(i, o, align, scale):
    if align:
        return (i - 1) / (o - 1) if o > 1 else 0.0
    return scale if scale is not None else i / o


def _taps(mode, i, o, align, scale, antialias):
    """(index (o, T) int32, weight (o, T) float64) of one axis; index -1: an unused tap."""
    r = np.arange(o)
    if mode in ("nearest", "nearest-exact"):
        s = np.float32(scale) if scale is not None else np.float32(i) / np.float32(o)
        if mode == "nearest":
            # (torch's CPU kernel for 4-D inputs alone maps out == in and out == 2 * in by
            # index, whatever scale_factor says; its 3-D/5-D and CUDA kernels, and this, don't)
            src = np.floor(r.astype(np.float32) * s).astype(np.int64)
        else:
            src = np.floor((r + 0.5) * np.float64(s)).astype(np.int64)
        return np.minimum(src, i - 1)[:, None], np.ones((o, 1))
    s = _linear_scale(i, o, align, scale)
    if antialias:
        size = 2 if mode in ("linear", "bilinear") else 4
        support = size / 2 * s if s >= 1 else size / 2
        inv = 1 / s if s >= 1 else 1.0
        center = s * (r + 0.5)
        lo = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
        n = np.minimum(np.trunc(center + support + 0.5), i).astype(np.int64) - lo
        j = np.arange(max(int(n.max()), 1))
        x = (j[None, :] + lo[:, None] - center[:, None] + 0.5) * inv
        w = np.maximum(1 - np.abs(x), 0) if size == 2 else _cubic(x, -0.5)
        used = j[None, :] < n[:, None]
        w = np.where(used, w, 0.0)
        tot = w.sum(axis=1, keepdims=True)
        w = np.where(tot != 0, w / np.where(tot != 0, tot, 1), w)
        return np.where(used, lo[:, None] + j[None, :], -1), w
    src = s * r if align else s * (r + 0.5) - 0.5
    if mode == "bicubic":
        f = np.floor(src)
        t = src - f
        idx = np.clip(f[:, None].astype(np.int64) - 1 + np.arange(4)[None, :], 0, i - 1)
        w = np.stack([_cubic(t + 1, -0.75), _cubic(t, -0.75), _cubic(1 - t, -0.75),
                      _cubic(2 - t, -0.75)], axis=1)
        return idx, w
    src = np.maximum(src, 0)
    i0 = np.floor(src).astype(np.int64)
    i1 = np.where(i0 < i - 1, i0 + 1, i0)
    lam = src - i0
    return np.stack([i0, i1], axis=1), np.stack([1 - lam, lam], axis=1)


def _device_table(idx, w, wdtype, device):
    from ..creation import tensor
    return (tensor(np.ascontiguousarray(idx, np.int32), device=device),
            tensor(np.ascontiguousarray(w, wdtype.np), device=device))


# one axis's (taps, weights) tables on the device, by everything _taps reads
@_plans.memoize("ops.resample.tables", 256)
def _table(mode, i, o, align, scale, antialias, wdtype, device):
    idx, w = _taps(mode, i, o, align, scale, antialias)
    return _device_table(idx, w, wdtype, device)


@_plans.memoize("ops.resample.identity", 64)
def _identity(n, wdtype, device):
    return _device_table(np.arange(n)[:, None], np.ones((n, 1)), wdtype, device)


def _resample(x, out_sizes, mode, align, scales, antialias):
    nd = len(out_sizes)
    wdtype = _dt.float64 if x.dtype is _dt.float64 else _dt.float32
    pre = 3 - nd
    ins = (1,) * pre + tuple(x.shape[2:])
    outs = (1,) * pre + tuple(out_sizes)
    scales = (None,) * pre + tuple(scales)
    tables = [_identity(1, wdtype, x.device) if a < pre else
              _table(mode, ins[a], outs[a], align, scales[a], antialias, wdtype, x.device)
              for a in range(3)]
    out = _new_like(x, tuple(x.shape[:2]) + tuple(out_sizes), x.dtype)
    if not out.numel():
        return out
    taps = [t[0].shape[1] for t in tables]
    moving = [a for a in range(3) if taps[a] > 1 or ins[a] != outs[a]]
    run = impl("resample", x.device)
    if math.prod(taps) <= FUSED_TAPS or len(moving) < 2:
        run(_as3d(out, nd), _as3d(x, nd), tables)
        return out
    cur, sizes = x, list(ins)
    for j, a in enumerate(moving):      # one axis at a time: its taps add, not multiply
        sizes[a] = outs[a]
        last = j == len(moving) - 1
        dst = out if last else _new_like(x, tuple(x.shape[:2]) + tuple(sizes[pre:]), wdtype)
        tabs = [tables[b] if b == a else _identity(sizes[b], wdtype, x.device)
                for b in range(3)]
        run(_as3d(dst, nd), _as3d(cur, nd), tabs)
        cur = dst
    return out


# ------------------------------------------------------------------------------ interpolate
def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,  # noqa: A002
                recompute_scale_factor=None, antialias=False):
    op = "interpolate"
    check_float(input, "input", op)
    if mode not in _MODES:
        raise ValueError(f"{op}: mode must be one of {', '.join(_MODES)}, got {mode!r}")
    if input.ndim not in (3, 4, 5):
        raise ValueError(f"{op}: expected a 3-D, 4-D or 5-D input (N, C, *spatial), got shape "
                         f"{tuple(input.shape)}")
    nd = input.ndim - 2
    if mode in _NDIM and _NDIM[mode] != nd:
        raise ValueError(f"{op}: mode {mode!r} needs a {_NDIM[mode] + 2}-D input, got a "
                         f"{input.ndim}-D one of shape {tuple(input.shape)}")
    if align_corners is not None and mode not in _NDIM:
        raise ValueError(f"{op}: align_corners can only be set with the interpolating modes "
                         f"linear, bilinear, bicubic and trilinear, got mode {mode!r}")
    align = bool(align_corners)
    if antialias and (mode not in ("bilinear", "bicubic") or input.ndim != 4):
        raise ValueError(f"{op}: antialias is restricted to the bilinear and bicubic modes on a "
                         f"4-D input, got mode {mode!r} and a {input.ndim}-D input")
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{op}: exactly one of size and scale_factor must be given, got "
                         f"size={size!r} and scale_factor={scale_factor!r}")
    spatial = tuple(input.shape[2:])
    if size is not None:
        if recompute_scale_factor:
            raise ValueError(f"{op}: recompute_scale_factor is not meaningful with an explicit "
                             f"size")
        outs = _ints(size, nd, "size", op, 1)
        scales = (None,) * nd
    else:
        sf = scale_factor if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * nd
        if len(sf) != nd or not all(isinstance(f, numbers.Real) and not isinstance(f, bool)
                                    for f in sf):
            raise ValueError(f"{op}: scale_factor must be a number or a tuple of {nd} numbers, "
                             f"got {scale_factor!r}")
        if any(not f > 0 or math.isinf(f) for f in sf):
            raise ValueError(f"{op}: scale_factor must be positive and finite, got "
                             f"{scale_factor!r}")
        outs = tuple(int(math.floor(i * float(f))) for i, f in zip(spatial, sf))
        if any(o < (0 if mode == "area" else 1) for o in outs):   # (area: an empty pool)
            raise ValueError(f"{op}: scale_factor {scale_factor!r} gives the output size "
                             f"{outs} for the input size {spatial}; sizes must be positive")
        recompute = recompute_scale_factor or mode == "area"
        scales = (None,) * nd if recompute else tuple(1.0 / float(f) for f in sf)
    if any(i < 1 for i in spatial):
        raise ValueError(f"{op}: input and output sizes should be greater than 0, got input "
                         f"size {spatial}")
    if mode == "area":
        return (adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d)[nd - 1](
            input, outs)
    if mode in ("bilinear", "trilinear"):
        mode = "linear"
    return _resample(input, outs, mode, align, scales, bool(antialias))


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):  # noqa: A002
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input, size=None, scale_factor=None):  # noqa: A002
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None):  # noqa: A002
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


# ------------------------------------------------------------------------------ grid_sample
def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):  # noqa: A002
    op = "grid_sample"
    check_float(input, "input", op)
    check_float(grid, "grid", op)
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise ValueError(f"{op}: mode must be 'bilinear', 'nearest' or 'bicubic', got {mode!r}")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"{op}: padding_mode must be 'zeros', 'border' or 'reflection', got "
                         f"{padding_mode!r}")
    if input.ndim not in (4, 5):
        raise ValueError(f"{op}: expected a 4-D or 5-D input, got shape {tuple(input.shape)}")
    nd = input.ndim - 2
    if grid.ndim != input.ndim or grid.shape[0] != input.shape[0] or grid.shape[-1] != nd:
        raise ValueError(f"{op}: for an input of shape {tuple(input.shape)} the grid must have "
                         f"shape (N={input.shape[0]}, *output spatial, {nd}), got "
                         f"{tuple(grid.shape)}")
    check_like_input(grid, "grid", input, op)
    if mode == "bicubic" and nd == 3:
        raise ValueError(f"{op}: bicubic mode needs a 4-D input, got a 5-D one")
    if any(n == 0 for n in input.shape[1:]):
        raise ValueError(f"{op}: expected non-empty channel and spatial dims, got shape "
                         f"{tuple(input.shape)}")
    shape = tuple(input.shape[:2]) + tuple(grid.shape[1:-1])
    out = _new_like(input, shape, input.dtype)
    if out.numel():
        g = grid if nd == 3 else grid._view(
            (grid.shape[0], 1) + tuple(grid.shape[1:]), (grid.stride(0), 0) + tuple(grid.stride()[1:]))
        impl("grid_sample", input.device)(_as3d(out, nd), _as3d(input, nd), g, mode=mode,
                                          padding_mode=padding_mode,
                                          align_corners=bool(align_corners), three_d=nd == 3)
    return out


def affine_grid(theta, size, align_corners=None):
    op = "affine_grid"
    check_float(theta, "theta", op)
    size = tuple(int(s) for s in size)
    if len(size) not in (4, 5):
        raise ValueError(f"{op}: size must have 4 (N, C, H, W) or 5 (N, C, D, H, W) elements, "
                         f"got {size!r}")
    nd = len(size) - 2
    if tuple(theta.shape) != (size[0], nd, nd + 1):
        raise ValueError(f"{op}: for size {size} theta must have shape "
                         f"({size[0]}, {nd}, {nd + 1}), got {tuple(theta.shape)}")
    if any(s < 1 for s in size):
        raise ValueError(f"{op}: size must be positive, got {size!r}")

    def line(n):
        if n == 1:
            return np.zeros(1)
        v = np.linspace(-1.0, 1.0, n)
        return v if align_corners else v * (n - 1) / n
    axes = [line(n) for n in reversed(size[2:])]           # x (W), y (H)[, z (D)]
    mesh = np.meshgrid(*reversed(axes), indexing="ij")      # spatial order (D,) H, W
    base = np.stack(list(reversed(mesh)) + [np.ones(mesh[0].shape)], axis=-1).reshape(-1, nd + 1)
    from ..creation import tensor
    from .linalg import matmul
    b = tensor(base.astype(theta.dtype.np), device=theta.device)
    g = matmul(b, theta.transpose(1, 2))                     # (N, prod(spatial), nd)
    return g.reshape((size[0],) + size[2:] + (nd,))


# ------------------------------------------------------------------------------ pixel shuffle
def _shuffle_factor(input, v, name, op):  # noqa: A002
    """The factor `v` of a pixel (un)shuffle of input (*, C, H, W), both checked."""
    check_tensor(input, "input", op)
    if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{op}: {name} must be a positive int, got {v!r}")
    if input.ndim < 3:
        raise ValueError(f"{op}: expected an input of at least 3 dims (*, C, H, W), got shape "
                         f"{tuple(input.shape)}")
    return int(v)


def pixel_shuffle(input, upscale_factor):  # noqa: A002
    op = "pixel_shuffle"
    r = _shuffle_factor(input, upscale_factor, "upscale_factor", op)
    *lead, c, h, w = input.shape
    if c % (r * r):
        raise ValueError(f"{op}: the channel dim (size {c}) must be divisible by "
                         f"upscale_factor**2 = {r * r}")
    k = len(lead)
    if r in SHUFFLE_KERNEL_FACTORS and input.device.type != "cpu" and input.numel() \
            and input.stride(-1) == 1:
        # rows of the output interleave r input rows: one kernel pass (kernels/resample.py)
        # instead of the copy of a 6-d permuted view
        x4 = input.reshape(-1, c, h, w)
        out = Tensor._empty((x4.shape[0], c // (r * r), h * r, w * r), input.dtype,
                            input.device)
        impl("pixel_shuffle", input.device)(out, x4, r)
        return out.view(*lead, c // (r * r), h * r, w * r)
    y = input.reshape(*lead, c // (r * r), r, r, h, w)
    y = y.permute(*range(k), k, k + 3, k + 1, k + 4, k + 2)
    return y.reshape(*lead, c // (r * r), h * r, w * r)


SHUFFLE_KERNEL_FACTORS = (2, 4)     # the factors the pixel_shuffle kernel interleaves


def pixel_unshuffle(input, downscale_factor):  # noqa: A002
    op = "pixel_unshuffle"
    r = _shuffle_factor(input, downscale_factor, "downscale_factor", op)
    *lead, c, h, w = input.shape
    if h % r or w % r:
        raise ValueError(f"{op}: height ({h}) and width ({w}) must be divisible by "
                         f"downscale_factor = {r}")
    k = len(lead)
    y = input.reshape(*lead, c, h // r, r, w // r, r)
    y = y.permute(*range(k), k, k + 2, k + 4, k + 1, k + 3)
    return y.reshape(*lead, c * r * r, h // r, w // r)


# ------------------------------------------------------------------------------ unfold / fold
def _fold_args(input, batched_ndim, kernel_size, dilation, padding, stride, op):  # noqa: A002
    """(kernel_size, dilation, padding, stride) of an unfold / fold as pairs of ints, once
    input is known to be a tensor of batched_ndim dims or one fewer (unbatched)."""
    check_tensor(input, "input", op)
    if input.ndim not in (batched_ndim - 1, batched_ndim):
        raise ValueError(f"{op}: expected a {batched_ndim - 1}-D (unbatched) or {batched_ndim}-D "
                         f"input, got shape {tuple(input.shape)}")
    return (_ints(kernel_size, 2, "kernel_size", op, 1), _ints(dilation, 2, "dilation", op, 1),
            _ints(padding, 2, "padding", op, 0), _ints(stride, 2, "stride", op, 1))


def _blocks(size, k, d, p, s, op):
    n = tuple((size[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) // s[a] + 1 for a in range(2))
    if any(v < 1 for v in n):
        raise ValueError(f"{op}: for a spatial size {tuple(size)} with kernel_size={k}, "
                         f"dilation={d}, padding={p} and stride={s} there are no sliding "
                         f"blocks (calculated {n})")
    return n


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):  # noqa: A002
    """im2col: (N, C, H, W) -> (N, C * kh * kw, L), L the number of blocks."""
    op = "unfold"
    k, d, p, s = _fold_args(input, 4, kernel_size, dilation, padding, stride, op)
    x = input if input.ndim == 4 else input.unsqueeze(0)
    N, C, H, W = x.shape
    oh, ow = _blocks((H, W), k, d, p, s, op)
    if any(p):
        from .shape import pad
        x = pad(x, (p[1], p[1], p[0], p[0]))
    sn, sc, sh, sw = x.stride()
    v = x.as_strided((N, C, k[0], k[1], oh, ow),
                     (sn, sc, sh * d[0], sw * d[1], sh * s[0], sw * s[1]), x.storage_offset())
    y = v.reshape(N, C * k[0] * k[1], oh * ow)
    return y if input.ndim == 4 else y.squeeze(0)


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):  # noqa: A002
    """col2im: (N, C * kh * kw, L) -> (N, C, H, W), overlapping blocks summed."""
    op = "fold"
    k, d, p, s = _fold_args(input, 3, kernel_size, dilation, padding, stride, op)
    size = _ints(output_size, 2, "output_size", op, 1)
    x = input if input.ndim == 3 else input.unsqueeze(0)
    N, CK, L = x.shape
    kk = k[0] * k[1]
    if CK % kk:
        raise ValueError(f"{op}: expected size of input's dimension 1 ({CK}) to be divisible "
                         f"by the product of kernel_size ({kk})")
    oh, ow = _blocks(size, k, d, p, s, op)
    if L != oh * ow:
        raise ValueError(f"{op}: given output_size={size}, kernel_size={k}, dilation={d}, "
                         f"padding={p}, stride={s}, expected size of input's dimension 2 to be "
                         f"{oh * ow} ({oh} x {ow} blocks), got {L}")
    C = CK // kk
    from ..creation import zeros
    acc_dt = _dt.float64 if x.dtype is _dt.float64 else (
        _dt.float32 if x.dtype.is_floating_point else x.dtype)
    Hp, Wp = size[0] + 2 * p[0], size[1] + 2 * p[1]
    acc = zeros((N, C, Hp, Wp), dtype=acc_dt, device=x.device)
    cols = x.reshape(N, C, k[0], k[1], oh, ow)
    an, ac, ah, aw = acc.stride()
    for i in range(k[0]):
        for j in range(k[1]):
            dst = acc.as_strided((N, C, oh, ow), (an, ac, ah * s[0], aw * s[1]),
                                 acc.storage_offset() + i * d[0] * ah + j * d[1] * aw)
            dst.add_(cols[:, :, i, j])
    y = acc.narrow(2, p[0], size[0]).narrow(3, p[1], size[1]).to(x.dtype).contiguous()
    return y if input.ndim == 3 else y.squeeze(0)
