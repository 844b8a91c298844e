"""Pooling on cuda/interp: the "pool" dispatch (max, average, adaptive; see ops/pooling.py).

One program per 2-D tile of outputs, whose columns are the output's contiguous dim:
(n, c, od, oh) rows by ow columns, or for a channels-last output (n, od, oh, ow) rows by
channel columns (neighbouring lanes read neighbouring memory: coalesced, and vectorised
along channels). Coordinates are divided out per row: per-element integer division cost
more than the memory traffic. Each program walks the window, loading one position of
every output's window per step through the input's strides, with masks for the tile's
edges, padding and the shorter windows of adaptive pooling. Max pooling
keeps the first maximum, and the last NaN (a NaN always wins, as torch); sums and maxima
are fp32 (fp64 for fp64 tensors), rounded once.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from ..dispatch import register
from ._coords import tile_coords, tile_rows, unravel4
from ._common import device_facts
from ._host import cdiv as _cdiv, next_pow2 as _next_pow2

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
        n, od, oh, ow = unravel4(offs // C, OD, OH, OW)
        c = offs % C
    else:
        nc, od, oh, ow = unravel4(offs, OD, OH, OW)
        n = nc // C
        c = nc % C
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
def _pool_kernel(x_ptr, o_ptr, i_ptr, R, Q, C, OD, OH, OW, ID, IH, IW,
                 sxn, sxc, sxd, sxh, sxw, son, soc, sod, soh, sow,
                 KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, divisor,
                 IS_MAX: tl.constexpr, ADAPTIVE: tl.constexpr, COUNT_PAD: tl.constexpr,
                 HAS_DIV: tl.constexpr, CL: tl.constexpr, IDX: tl.constexpr,
                 F64: tl.constexpr, BIG: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_Q: tl.constexpr):
    """One [BLOCK_R, BLOCK_Q] tile of outputs: rows (n, c, od, oh) and columns ow, or
    (CL) rows (n, od, oh, ow) and columns c. Coordinates are divided out once per row,
    not per element, and each window step loads the whole tile."""
    mask, n, c, od, oh, ow = tile_coords(R, Q, C, OD, OH, OW, CL, BIG, BLOCK_R, BLOCK_Q)
    d0, dl = _window(od, OD, ID, KD, SD, PD, ADAPTIVE)
    h0, hl = _window(oh, OH, IH, KH, SH, PH, ADAPTIVE)
    w0, wl = _window(ow, OW, IW, KW, SW, PW, ADAPTIVE)
    base = x_ptr + n * sxn + c * sxc
    if F64:
        acc = tl.zeros([BLOCK_R, BLOCK_Q], tl.float64)
    else:
        acc = tl.zeros([BLOCK_R, BLOCK_Q], tl.float32)
    if IS_MAX:
        # torch's index before any update: each axis's first window position >= 0 (the
        # first valid element; past the input only for a window that misses it entirely)
        acc = acc - float("inf")
        best = ((_first(d0, DD) * IH + _first(h0, DH)) * IW + _first(w0, DW)).to(tl.int64) \
            + tl.zeros([BLOCK_R, BLOCK_Q], tl.int64)
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
            cnt = cnt.to(acc.dtype) + tl.zeros_like(acc)
        if F64:
            acc = acc / cnt
        else:
            acc = tl.math.div_rn(acc, cnt)   # IEEE: fp32 `/` is approximate on cuda
    dst = n * son + c * soc + od * sod + oh * soh + ow * sow
    tl.store(o_ptr + dst, acc.to(o_ptr.dtype.element_ty), mask=mask)
    if IDX:
        tl.store(i_ptr + dst, best, mask=mask)


@triton.jit
def _nan_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _pool_rows_kernel(x_ptr, o_ptr, R, C, OD, OH, OW, ID, IH,
                      sxn, sxc, sxd, sxh, sxw, son, soc, sod, soh, sow,
                      KD, KH, SD, SH, PD, PH, DD, DH, divisor,
                      IS_MAX: tl.constexpr, COUNT_PAD: tl.constexpr, HAS_DIV: tl.constexpr,
                      F64: tl.constexpr, BIG: tl.constexpr, KW: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr):
    """NCHW windows that tile the width (kernel = stride = KW, a power of two up to 256, no
    padding or dilation along w, every window whole; adaptive pools with even bins too): a tap row of BLOCK_Q outputs is BLOCK_Q * KW
    contiguous inputs, loaded as one wide tile (vectorised, where the general kernel
    gathers every KW-th element) and folded KW to one at the end. Rows (n, c, od, oh) take
    the general kernel's windows along d and h."""
    rows, row_ok = tile_rows(R, BIG, BLOCK_R)
    n, c, od, oh = unravel4(rows, C, OD, OH)
    iw = tl.program_id(1) * (BLOCK_Q * KW) + tl.arange(0, BLOCK_Q * KW)
    iw_ok = iw < OW * KW
    d0 = od * SD - PD
    h0 = oh * SH - PH
    base = x_ptr + n * sxn + c * sxc
    if F64:
        acc = tl.zeros([BLOCK_R, BLOCK_Q * KW], tl.float64)
    else:
        acc = tl.zeros([BLOCK_R, BLOCK_Q * KW], tl.float32)
    if IS_MAX:
        acc = acc - float("inf")
    for kd in range(0, KD):
        pd = d0 + kd * DD
        okd = row_ok & (pd >= 0) & (pd < ID)
        for kh in range(0, KH):
            ph = h0 + kh * DH
            ok = (okd & (ph >= 0) & (ph < IH))[:, None] & iw_ok[None, :]
            v = tl.load((base + pd * sxd + ph * sxh)[:, None] + iw[None, :] * sxw, mask=ok,
                        other=0.0).to(acc.dtype)
            if IS_MAX:
                acc = tl.where(ok & ((v > acc) | (v != v)), v, acc)
            else:
                acc += v
    acc3 = tl.reshape(acc, [BLOCK_R, BLOCK_Q, KW])
    if IS_MAX:
        res = tl.reduce(acc3, 2, _nan_max)
    else:
        res = tl.sum(acc3, 2)
        if HAS_DIV:
            cnt = tl.zeros_like(res) + divisor
        else:
            if COUNT_PAD:
                cnt = (tl.minimum(d0 + KD, ID + PD) - d0) * (tl.minimum(h0 + KH, IH + PH) - h0)
            else:
                cnt = ((tl.minimum(d0 + KD, ID) - tl.maximum(d0, 0))
                       * (tl.minimum(h0 + KH, IH) - tl.maximum(h0, 0)))
            cnt = (cnt * KW).to(res.dtype)[:, None] + tl.zeros_like(res)
        if F64:
            res = res / cnt
        else:
            res = tl.math.div_rn(res, cnt)
    q = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    dst = (n * son + c * soc + od * sod + oh * soh)[:, None] + q[None, :] * sow
    tl.store(o_ptr + dst, res.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (q < OW)[None, :])


def _rows_path(out, x, indices, kernel, stride, padding, dilation, adaptive):
    """KW when _pool_rows_kernel computes this pooling (NCHW, the windows tiling the
    width), else 0."""
    KW = kernel[2]
    ok = (indices is None and not adaptive and not is_channels_last(out) and KW in ROWS_KW
          and stride[2] == KW and padding[2] == 0 and dilation[2] == 1
          and out.shape[4] * KW <= x.shape[4])
    return KW if ok else 0


ROWS_TILE = 2048    # inputs of one tap a _pool_rows_kernel program loads (sweep_resample.py)
ROWS_WARPS = 4
ROWS_KW = (2, 4, 8, 16, 32, 64, 128, 256)   # window widths it takes (a row tile holds one)


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


TILE = 1024      # outputs a program owns: BLOCK_R rows x BLOCK_Q columns
POOL_WARPS = 4
COLS_MAX = 128   # the widest column tile (sweep_resample.py)
_OVERRIDE: dict | None = None     # tests: BLOCK_Q


def pool_tile(Q) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_Q): the columns (the output's contiguous dim) up to COLS_MAX wide."""
    bq = min(_next_pow2(Q), COLS_MAX)
    if _OVERRIDE:
        bq = _OVERRIDE.get("BLOCK_Q", bq)
    return max(1, TILE // bq), bq


WAVES = 4        # programs per SM below which a cuda tiling takes fewer rows a program


def tile_grid(out):
    """(R, Q, grid, BLOCK_R, BLOCK_Q, CL) of the row x column tiling of `out` (5-D view):
    see _coords.tile_coords. A small output (a large window's pooling: a global or adaptive
    average) takes fewer rows a program on cuda until WAVES programs an SM run, as its
    programs walk their windows in turn (interp keeps the large tiles: its programs run one
    after another)."""
    N, C, OD, OH, OW = out.shape
    cl = is_channels_last(out)
    R, Q = (N * OD * OH * OW, C) if cl else (N * C * OD * OH, OW)
    br, bq = pool_tile(Q)
    if out.device.type == "cuda":
        want = WAVES * device_facts(out.device).sms
        while br > 1 and _cdiv(R, br) * _cdiv(Q, bq) < want:
            br //= 2
    return R, Q, (_cdiv(R, br), _cdiv(Q, bq)), br, bq, cl


@register("pool", "triton")
def pool(out, indices, x, kernel, stride, padding, dilation, *, adaptive, is_max,
         count_include_pad, divisor):
    from ..backends.launch import launch
    if out.numel() == 0:
        return out
    N, C, OD, OH, OW = out.shape
    KW = _rows_path(out, x, indices, kernel, stride, padding, dilation, adaptive)
    if KW:
        R = N * C * OD * OH
        wide = min(_next_pow2(OW * KW), max(256, KW))
        bq = wide // KW
        br = max(1, ROWS_TILE // wide)
        if _OVERRIDE:
            bq = min(bq, _OVERRIDE.get("BLOCK_Q", bq))
        launch(_pool_rows_kernel, (_cdiv(R, br), _cdiv(OW, bq)), x, out, R, C, OD, OH, OW,
               *x.shape[2:4], *x.stride(), *out.stride(), kernel[0], kernel[1], stride[0],
               stride[1], padding[0], padding[1], dilation[0], dilation[1], int(divisor),
               IS_MAX=bool(is_max), COUNT_PAD=bool(count_include_pad), HAS_DIV=bool(divisor),
               F64=x.dtype.itemsize == 8, BIG=needs_int64(x, out), KW=KW, BLOCK_R=br,
               BLOCK_Q=bq, num_warps=ROWS_WARPS)
        return out
    R, Q, grid, br, bq, cl = tile_grid(out)
    launch(_pool_kernel, grid, x, out,
           indices if indices is not None else out, R, Q, C, OD, OH, OW, *x.shape[2:],
           *x.stride(), *out.stride(), *kernel, *stride, *padding, *dilation, int(divisor),
           IS_MAX=bool(is_max), ADAPTIVE=bool(adaptive), COUNT_PAD=bool(count_include_pad),
           HAS_DIV=bool(divisor), CL=cl, IDX=indices is not None,
           F64=x.dtype.itemsize == 8, BIG=needs_int64(x, out), BLOCK_R=br, BLOCK_Q=bq,
           num_warps=POOL_WARPS)
    return out
