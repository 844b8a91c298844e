"""Resampling on cuda/interp: the "resample" dispatch (interpolate's separable modes) and
"grid_sample" (see ops/resample.py).

resample tiles the output as the pooling kernel does (rows x the contiguous dim, so the
taps of a row are read once per row); grid_sample numbers it in its memory order, one
program per BLOCK outputs (channels innermost for channels-last: coalesced). Both address
the input through its strides; every load is masked (tile edges, taps outside the input).

resample: out[n, c, od, oh, ow] = sum_abc wd[od, a] wh[oh, b] ww[ow, c] x[n, c, id, ih, iw]
with per-axis tap tables (index, weight; index -1 marks an unused tap) computed by the op
layer: nearest has one tap, linear two, cubic four, antialiasing a variable number (the op
layer then runs one axis at a time).
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from ..dispatch import register
from ._host import cdiv as _cdiv, next_pow2 as _next_pow2
from ._coords import tile_coords, tile_rows
from . import pooling as _pooling
from .pooling import flat_offsets, is_channels_last, needs_int64, out_coords, tile_grid

BLOCK = 256


@triton.jit
def _resample_kernel(x_ptr, o_ptr, td_ptr, wd_ptr, th_ptr, wh_ptr, tw_ptr, ww_ptr,
                     R, Q, C, OD, OH, OW, sxn, sxc, sxd, sxh, sxw, son, soc, sod, soh, sow,
                     TD, TH, TW, CL: tl.constexpr, F64: tl.constexpr, BIG: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr):
    """One [BLOCK_R, BLOCK_Q] output tile (pooling's tiling, _coords.tile_coords): the
    taps of a row's (od, oh) are read once per row, those of ow once per column."""
    mask, n, c, od, oh, ow = tile_coords(R, Q, C, OD, OH, OW, CL, BIG, BLOCK_R, BLOCK_Q)
    base = x_ptr + n * sxn + c * sxc
    owt = tl.minimum(ow, OW - 1)        # the tables' row for masked columns too
    if F64:
        acc = tl.zeros([BLOCK_R, BLOCK_Q], tl.float64)
    else:
        acc = tl.zeros([BLOCK_R, BLOCK_Q], tl.float32)
    for a in range(0, TD):
        pd = tl.load(td_ptr + od * TD + a)
        fd = tl.load(wd_ptr + od * TD + a)
        for b in range(0, TH):
            ph = tl.load(th_ptr + oh * TH + b)
            fh = fd * tl.load(wh_ptr + oh * TH + b)
            for e in range(0, TW):
                pw = tl.load(tw_ptr + owt * TW + e)
                f = fh * tl.load(ww_ptr + owt * TW + e)
                ok = mask & (pd >= 0) & (ph >= 0) & (pw >= 0)
                v = tl.load(base + pd * sxd + ph * sxh + pw * sxw, mask=ok, other=0.0)
                acc += tl.where(ok, f.to(acc.dtype) * v.to(acc.dtype), 0.0)
    dst = n * son + c * soc + od * sod + oh * soh + ow * sow
    tl.store(o_ptr + dst, acc.to(o_ptr.dtype.element_ty), mask=mask)


@register("resample", "triton")
def resample(out, x, tables):
    """tables: per axis (D, H, W) an (index int32 (O, T), weight (O, T)) pair on the device."""
    from ..backends.launch import launch
    if out.numel() == 0:
        return out
    (td, wd), (th, wh), (tw, ww) = tables
    N, C, OD, OH, OW = out.shape
    R, Q, grid, br, bq, cl = tile_grid(out)
    launch(_resample_kernel, grid, x, out, td, wd, th, wh, tw, ww, R, Q, C,
           OD, OH, OW, *x.stride(), *out.stride(), td.shape[1], th.shape[1], tw.shape[1],
           CL=cl, F64=x.dtype.itemsize == 8, BIG=needs_int64(x, out),
           BLOCK_R=br, BLOCK_Q=bq, num_warps=_pooling.POOL_WARPS)
    return out


# ---------------------------------------------------------------------------- pixel_shuffle
@triton.jit
def _pixel_shuffle_kernel(x_ptr, o_ptr, R, C, OH, OW, W, sxn, sxc, sxh, sxw, son, soc, soh,
                          F: tl.constexpr, BIG: tl.constexpr, BLOCK_R: tl.constexpr,
                          BLOCK_Q: tl.constexpr):
    """out (N, C, OH, OW) of x (N, C * F * F, OH / F, OW / F), F 2 or 4: output row
    (n, c, oh) interleaves the rows h = oh // F of channels c F^2 + (oh % F) F + j, j < F,
    so a [BLOCK_R, BLOCK_Q] output tile is F contiguous [BLOCK_R, BLOCK_Q / F] loads
    interleaved in registers and one contiguous store."""
    rows, row_ok = tile_rows(R, BIG, BLOCK_R)
    oh = rows % OH
    nc = rows // OH
    c = nc % C
    n = nc // C
    ch = c * (F * F) + (oh % F) * F
    src = (x_ptr + n * sxn + ch * sxc + (oh // F) * sxh)[:, None]
    wv = tl.program_id(1) * (BLOCK_Q // F) + tl.arange(0, BLOCK_Q // F)
    ok = row_ok[:, None] & (wv < W)[None, :]
    s0 = tl.load(src + wv[None, :] * sxw, mask=ok)
    s1 = tl.load(src + sxc + wv[None, :] * sxw, mask=ok)
    if F == 2:
        v = tl.interleave(s0, s1)
    else:
        s2 = tl.load(src + 2 * sxc + wv[None, :] * sxw, mask=ok)
        s3 = tl.load(src + 3 * sxc + wv[None, :] * sxw, mask=ok)
        v = tl.interleave(tl.interleave(s0, s2), tl.interleave(s1, s3))
    q = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    dst = (n * son + c * soc + oh * soh)[:, None] + q[None, :]
    tl.store(o_ptr + dst, v, mask=row_ok[:, None] & (q < OW)[None, :])


SHUFFLE_TILE = 4096     # outputs a pixel_shuffle program stores


@register("pixel_shuffle", "triton")
def pixel_shuffle(out, x, factor):
    """out (N, C, H F, W F) contiguous <- x (N, C F^2, H, W) shuffled, F in (2, 4)."""
    from ..backends.launch import launch
    N, C, OH, OW = out.shape
    R = N * C * OH
    bq = max(factor, min(_next_pow2(OW), 256))
    br = max(1, SHUFFLE_TILE // bq)
    launch(_pixel_shuffle_kernel, (_cdiv(R, br), _cdiv(OW, bq)), x, out, R, C, OH, OW,
           x.shape[3], x.stride(0), x.stride(1), x.stride(2), x.stride(3), out.stride(0),
           out.stride(1), out.stride(2), F=factor, BIG=needs_int64(x, out), BLOCK_R=br,
           BLOCK_Q=bq, num_warps=4)
    return out


# ------------------------------------------------------------------------------ grid_sample
@triton.jit
def _unnormalize(g, size, ALIGN: tl.constexpr):
    if ALIGN:
        r = (g + 1.0) * 0.5 * (size - 1)
    else:
        r = ((g + 1.0) * size - 1.0) * 0.5
    return r


@triton.jit
def _reflect(c, twice_lo, twice_hi):
    lo = twice_lo * 0.5
    span = (twice_hi - twice_lo) * 0.5
    c = tl.abs(c - lo)
    safe = tl.where(span > 0, span, 1.0)
    flips = tl.floor(c / safe)
    extra = c - flips * safe
    even = flips - 2.0 * tl.floor(flips * 0.5) == 0
    r = tl.where(even, extra + lo, span - extra + lo)
    return tl.where(span > 0, r, 0.0)


@triton.jit
def _pad_coord(c, size, PAD: tl.constexpr, ALIGN: tl.constexpr):
    """Padding 0 zeros (unchanged), 1 border (clipped), 2 reflection (reflected, clipped)."""
    if PAD == 2:
        if ALIGN:
            c = _reflect(c, 0.0 * size, 2.0 * (size - 1))
        else:
            c = _reflect(c, 0.0 * size - 1.0, 2.0 * size - 1.0)
    if PAD != 0:
        c = tl.minimum(tl.maximum(c, 0.0), size - 1.0)
    return c


@triton.jit
def _cubic(t, k: tl.constexpr):
    """Weight of tap k (0..3, at floor - 1 + k) for fraction t, A = -0.75 (torch)."""
    A: tl.constexpr = -0.75
    if k == 0:
        x = t + 1.0
        w = ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    elif k == 1:
        w = ((A + 2.0) * t - (A + 3.0)) * t * t + 1.0
    elif k == 2:
        x = 1.0 - t
        w = ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    else:
        x = 2.0 - t
        w = ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    return w


@triton.jit
def _tap(u, size, k: tl.constexpr, MODE: tl.constexpr, PAD: tl.constexpr, ALIGN: tl.constexpr):
    """(index, weight, in bounds) of tap k along one axis at unnormalised coordinate u.
    MODE 0 bilinear, 1 nearest (half to even), 2 bicubic (padding applied per tap)."""
    if MODE == 2:
        f = tl.floor(u)
        p = _pad_coord(f - 1.0 + k, size, PAD, ALIGN)
        p = tl.where(p < 0, tl.ceil(p), tl.floor(p))     # the integer part, as a C cast
        w = _cubic(u - f, k)
    else:
        cc = _pad_coord(u, size, PAD, ALIGN)
        if MODE == 0:
            f = tl.floor(cc)
            p = f + k
            if k == 0:
                w = f + 1.0 - cc
            else:
                w = cc - f
        else:
            p = tl.floor(cc + 0.5)
            p = tl.where((p - cc == 0.5) & (p - 2.0 * tl.floor(p * 0.5) != 0), p - 1.0, p)
            w = tl.zeros_like(cc) + 1.0
    ok = (p >= 0) & (p <= size - 1.0)
    return tl.where(ok, p, 0.0).to(tl.int64), w, ok


@triton.jit
def _grid_sample_kernel(x_ptr, g_ptr, o_ptr, total, C, OD, OH, OW, ID, IH, IW,
                        sxn, sxc, sxd, sxh, sxw, sgn, sgd, sgh, sgw, sgk,
                        son, soc, sod, soh, sow,
                        MODE: tl.constexpr, PAD: tl.constexpr, ALIGN: tl.constexpr,
                        THREE_D: tl.constexpr, CL: tl.constexpr, F64: tl.constexpr,
                        BIG: tl.constexpr, BLOCK: tl.constexpr):
    offs = flat_offsets(BIG, BLOCK)
    mask = offs < total
    n, c, od, oh, ow = out_coords(tl.where(mask, offs, 0), C, OD, OH, OW, CL)
    gp = g_ptr + n * sgn + od * sgd + oh * sgh + ow * sgw
    if F64:
        ct = tl.float64
    else:
        ct = tl.float32
    gx = tl.load(gp, mask=mask, other=0.0).to(ct)
    gy = tl.load(gp + sgk, mask=mask, other=0.0).to(ct)
    # sizes as float tensors (an int argument of 1 arrives as a constexpr, without .to())
    fw = tl.zeros([BLOCK], ct) + IW
    fh = tl.zeros([BLOCK], ct) + IH
    ux = _unnormalize(gx, fw, ALIGN)
    uy = _unnormalize(gy, fh, ALIGN)
    base = x_ptr + n * sxn + c * sxc
    acc = tl.zeros([BLOCK], ct)
    if MODE == 0:
        T: tl.constexpr = 2
    elif MODE == 1:
        T: tl.constexpr = 1
    else:
        T: tl.constexpr = 4
    if THREE_D:
        gz = tl.load(gp + 2 * sgk, mask=mask, other=0.0).to(ct)
        fd = tl.zeros([BLOCK], ct) + ID
        uz = _unnormalize(gz, fd, ALIGN)
        for kz in tl.static_range(T):
            iz, wz, okz = _tap(uz, fd, kz, MODE, PAD, ALIGN)
            for ky in tl.static_range(T):
                iy, wy, oky = _tap(uy, fh, ky, MODE, PAD, ALIGN)
                for kx in tl.static_range(T):
                    ix, wx, okx = _tap(ux, fw, kx, MODE, PAD, ALIGN)
                    ok = mask & okz & oky & okx
                    v = tl.load(base + iz * sxd + iy * sxh + ix * sxw, mask=ok, other=0.0)
                    acc += tl.where(ok, wz * wy * wx * v.to(ct), 0.0)
    else:
        for ky in tl.static_range(T):
            iy, wy, oky = _tap(uy, fh, ky, MODE, PAD, ALIGN)
            for kx in tl.static_range(T):
                ix, wx, okx = _tap(ux, fw, kx, MODE, PAD, ALIGN)
                ok = mask & oky & okx
                v = tl.load(base + iy * sxh + ix * sxw, mask=ok, other=0.0)
                acc += tl.where(ok, wy * wx * v.to(ct), 0.0)
    dst = n * son + c * soc + od * sod + oh * soh + ow * sow
    tl.store(o_ptr + dst, acc.to(o_ptr.dtype.element_ty), mask=mask)


_MODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}
_PADS = {"zeros": 0, "border": 1, "reflection": 2}


@register("grid_sample", "triton")
def grid_sample(out, x, grid, *, mode, padding_mode, align_corners, three_d):
    """x (N, C, D, H, W), grid (N, OD, OH, OW, K) (K = 2 or 3), out (N, C, OD, OH, OW)."""
    from ..backends.launch import launch
    total = out.numel()
    if total == 0:
        return out
    N, C, OD, OH, OW = out.shape
    launch(_grid_sample_kernel, (_cdiv(total, BLOCK),), x, grid, out, total, C, OD, OH, OW,
           *x.shape[2:], *x.stride(), *grid.stride(), *out.stride(),
           MODE=_MODES[mode], PAD=_PADS[padding_mode], ALIGN=bool(align_corners),
           THREE_D=bool(three_d), CL=is_channels_last(out), F64=x.dtype.itemsize == 8,
           BIG=needs_int64(x, grid, out), BLOCK=BLOCK, num_warps=4)
    return out
