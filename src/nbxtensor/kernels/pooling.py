"""Pooling on cuda/interp: the "pool" dispatch (max, average, adaptive; see ops/pooling.py).

One program per tile of BLOCK output elements, numbered in the output's memory order
(channels innermost for a channels-last output, so neighbouring lanes read neighbouring
channels: coalesced; width innermost otherwise). Each program walks the window, loading
one position of every lane's window per step through the input's strides, with masks for
the tail of the tile, padding and the shorter windows of adaptive pooling. Max pooling
keeps the first maximum, and the last NaN (a NaN always wins, as torch); sums and maxima
are fp32 (fp64 for fp64 tensors), rounded once.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from ..dispatch import register
from ._host import cdiv as _cdiv

BLOCK = 256


@triton.jit
def flat_offsets(BIG: tl.constexpr, BLOCK: tl.constexpr):
    """This program's output numbers: int32 arithmetic unless an offset may pass 2**31
    (64-bit division is a slow subroutine that also spills)."""
    if BIG:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    return offs


@triton.jit
def out_coords(offs, C, OD, OH, OW, CL: tl.constexpr):
    """(n, c, od, oh, ow) of flat output numbers `offs` in the output's memory order."""
    if CL:
        c = offs % C
        r = offs // C
        ow = r % OW
        r = r // OW
        oh = r % OH
        r = r // OH
        od = r % OD
        n = r // OD
    else:
        ow = offs % OW
        r = offs // OW
        oh = r % OH
        r = r // OH
        od = r % OD
        r = r // OD
        c = r % C
        n = r // C
    return n, c, od, oh, ow


@triton.jit
def _window(o, O, I, K, S, P, ADAPTIVE: tl.constexpr):
    """(first input position, window length) of output positions o along one axis."""
    if ADAPTIVE:
        start = (o * I) // O
        length = ((o + 1) * I + O - 1) // O - start
    else:
        start = o * S - P
        length = tl.zeros_like(o) + K
    return start, length


@triton.jit
def _first(start, dil):
    """The first of start, start + dil, ... that is >= 0."""
    return tl.where(start < 0, start + ((dil - 1 - start) // dil) * dil, start)


@triton.jit
def _pool_kernel(x_ptr, o_ptr, i_ptr, total, C, OD, OH, OW, ID, IH, IW,
                 sxn, sxc, sxd, sxh, sxw, son, soc, sod, soh, sow,
                 KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, divisor,
                 IS_MAX: tl.constexpr, ADAPTIVE: tl.constexpr, COUNT_PAD: tl.constexpr,
                 HAS_DIV: tl.constexpr, CL: tl.constexpr, IDX: tl.constexpr,
                 F64: tl.constexpr, BIG: tl.constexpr, BLOCK: tl.constexpr):
    offs = flat_offsets(BIG, BLOCK)
    mask = offs < total
    n, c, od, oh, ow = out_coords(tl.where(mask, offs, 0), C, OD, OH, OW, CL)
    d0, dl = _window(od, OD, ID, KD, SD, PD, ADAPTIVE)
    h0, hl = _window(oh, OH, IH, KH, SH, PH, ADAPTIVE)
    w0, wl = _window(ow, OW, IW, KW, SW, PW, ADAPTIVE)
    base = x_ptr + n * sxn + c * sxc
    if F64:
        acc = tl.zeros([BLOCK], tl.float64)
    else:
        acc = tl.zeros([BLOCK], tl.float32)
    if IS_MAX:
        # torch's index before any update: each axis's first window position >= 0 (the
        # first valid element; past the input only for a window that misses it entirely)
        acc = acc - float("inf")
        best = ((_first(d0, DD) * IH + _first(h0, DH)) * IW + _first(w0, DW)).to(tl.int64)
    for kd in range(0, KD):
        pd = d0 + kd * DD
        okd = mask & (kd < dl) & (pd >= 0) & (pd < ID)
        for kh in range(0, KH):
            ph = h0 + kh * DH
            okh = okd & (kh < hl) & (ph >= 0) & (ph < IH)
            for kw in range(0, KW):
                pw = w0 + kw * DW
                ok = okh & (kw < wl) & (pw >= 0) & (pw < IW)
                v = tl.load(base + pd * sxd + ph * sxh + pw * sxw, mask=ok, other=0.0)
                v = v.to(acc.dtype)
                if IS_MAX:
                    upd = ok & ((v > acc) | (v != v))
                    acc = tl.where(upd, v, acc)
                    best = tl.where(upd, (pd * IH + ph) * IW + pw, best)
                else:
                    acc += v
    if not IS_MAX:
        if HAS_DIV:
            cnt = tl.zeros_like(acc) + divisor
        else:
            if COUNT_PAD:
                cnt = ((tl.minimum(d0 + dl, ID + PD) - d0) * (tl.minimum(h0 + hl, IH + PH) - h0)
                       * (tl.minimum(w0 + wl, IW + PW) - w0))
            else:
                cnt = ((tl.minimum(d0 + dl, ID) - tl.maximum(d0, 0))
                       * (tl.minimum(h0 + hl, IH) - tl.maximum(h0, 0))
                       * (tl.minimum(w0 + wl, IW) - tl.maximum(w0, 0)))
            cnt = cnt.to(acc.dtype)
        if F64:
            acc = acc / cnt
        else:
            acc = tl.math.div_rn(acc, cnt)   # IEEE: fp32 `/` is approximate on cuda
    dst = n * son + c * soc + od * sod + oh * soh + ow * sow
    tl.store(o_ptr + dst, acc.to(o_ptr.dtype.element_ty), mask=mask)
    if IDX:
        tl.store(i_ptr + dst, best, mask=mask)


def needs_int64(*ts):
    """Whether an element offset of any of `ts` (or their element count) may reach 2**31."""
    lim = 2 ** 31 - 1 - 2 * BLOCK
    return any(t.numel() >= lim or sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
               + t.storage_offset() >= lim for t in ts)


def is_channels_last(t):
    """Whether the 5-D view t (N, C, D, H, W) keeps channels innermost in memory."""
    st = t.stride()
    return t.shape[1] > 1 and st[1] == 1 and all(
        s >= t.shape[1] or n == 1 for s, n in zip(st[2:], t.shape[2:]))


@register("pool", "triton")
def pool(out, indices, x, kernel, stride, padding, dilation, *, adaptive, is_max,
         count_include_pad, divisor):
    from ..backends.launch import launch
    total = out.numel()
    if total == 0:
        return out
    N, C, OD, OH, OW = out.shape
    launch(_pool_kernel, (_cdiv(total, BLOCK),), x, out, indices if indices is not None else out,
           total, C, OD, OH, OW, *x.shape[2:], *x.stride(), *out.stride(), *kernel, *stride,
           *padding, *dilation, int(divisor),
           IS_MAX=bool(is_max), ADAPTIVE=bool(adaptive), COUNT_PAD=bool(count_include_pad),
           HAS_DIV=bool(divisor), CL=is_channels_last(out), IDX=indices is not None,
           F64=x.dtype.itemsize == 8, BIG=needs_int64(x, out), BLOCK=BLOCK, num_warps=4)
    return out
