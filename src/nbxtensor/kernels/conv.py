"""Convolutions on cuda/interp: an implicit-GEMM kernel and a direct depthwise kernel.

The op layer (ops/conv.py) hands over 3-D problems -- x (N, C, D, H, W), weight
(C_out, C_in/g, KD, KH, KW) (conv_transpose: (C_in, C_out/g, ...)), out (N, C_out, OD,
OH, OW) -- with every stride as it is, so NCHW, channels-last and other strided layouts
run uncopied. 1-D and 2-D convolutions are the same problem with size-1 dims: one
kernel (and one set of compiled variants) for all three; the size-1 dims cost a few
integer ops per tap, not a load.

Implicit GEMM, per group g (conv):
    out[m, co] = sum_k A[m, k] * B[k, co] (+ bias[co]),   m = (n, od, oh, ow),
    k = (tap, ci),  A[m, k] = x[n, g*Cg + ci, od*s - p + kd*d, ...] (0 outside the input),
    B[k, co] = weight[g*Og + co, ci, kd, kh, kw]
The K loop walks taps x BLOCK_K channel chunks in one flat loop (so the software
pipeline spans taps); addresses and padding masks are computed per tap from the output
coordinates; `tl.dot` accumulates in fp32 (fp64 for fp64) and the bias is added before
the single store. A program owns one (BLOCK_M pixels x BLOCK_N channels) tile of one group.

conv_transpose is the gather form of the same GEMM: output pixel o takes input pixel
i = (o + p - k*d) / s for each tap k where that division is exact and i is in range
(masked otherwise); B[k, co] = weight[g*Cg + ci, co, kd, kh, kw].

Depthwise problems (one input channel per group: groups == C_in, any channel
multiplier) would waste the tensor cores' K dimension on a single channel, so they take
`_depthwise_kernel`: a direct multiply-add over taps on a (pixels x channels) tile.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import dtypes as _dt
from ..dispatch import register
from ._common import device_facts
from ._coords import unravel4
from ._host import cdiv as _cdiv, next_pow2 as _next_pow2
from .matmul import ACTIVATIONS, _apply_epilogue


@triton.jit
def _in_coord(o, k, s, p, d, I, TRANSPOSED: tl.constexpr):
    """The input coordinate read by output coordinate o at tap k, and whether it exists."""
    if TRANSPOSED:
        t = o + p - k * d
        i = t // s
        ok = (t >= 0) & (t - i * s == 0) & (i < I)
    else:
        i = o * s - p + k * d
        ok = (i >= 0) & (i < I)
    return i, ok


@triton.jit
def _tap_rows(tap, od, oh, ow, m_ok, x_base, KH, KW, ID, IH, IW, sd, sh, sw, pd, ph, pw,
              dd, dh, dw, s_xd, s_xh, s_xw, TRANSPOSED: tl.constexpr):
    """(kd, kh, kw) of tap number `tap`, and for output pixels (od, oh, ow) the offsets of
    the input pixels it reads (x_base + their strides) and whether they exist."""
    kw = tap % KW
    kh = (tap // KW) % KH
    kd = tap // (KW * KH)
    i_d, ok_d = _in_coord(od, kd, sd, pd, dd, ID, TRANSPOSED)
    i_h, ok_h = _in_coord(oh, kh, sh, ph, dh, IH, TRANSPOSED)
    i_w, ok_w = _in_coord(ow, kw, sw, pw, dw, IW, TRANSPOSED)
    return kd, kh, kw, x_base + i_d * s_xd + i_h * s_xh + i_w * s_xw, m_ok & ok_d & ok_h & ok_w


@triton.jit
def _conv_kernel(x_ptr, w_ptr, b_ptr, o_ptr, M, CG, OG, G,
                 ID, IH, IW, OD, OH, OW, KD, KH, KW,
                 sd, sh, sw, pd, ph, pw, dd, dh, dw,
                 s_xn, s_xc, s_xd, s_xh, s_xw,
                 s_wg, s_wo, s_wi, s_wd, s_wh, s_ww,
                 s_on, s_oc, s_od, s_oh, s_ow, s_b,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 TRANSPOSED: tl.constexpr, HAS_BIAS: tl.constexpr, F64: tl.constexpr,
                 PRECISION: tl.constexpr, ACT: tl.constexpr):
    pid = tl.program_id(0)
    num_n = tl.cdiv(OG, BLOCK_N)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_n = pid % num_n
    pid_m = (pid // num_n) % num_m
    g = pid // (num_n * num_m)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < OG
    nb, od, oh, ow = unravel4(offs_m, OD, OH, OW)
    x_base = nb.to(tl.int64) * s_xn + (g * CG).to(tl.int64) * s_xc          # [BM]
    w_base = g.to(tl.int64) * s_wg + offs_n * s_wo                           # [BN]
    if F64:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    n_chunks = tl.cdiv(CG, BLOCK_K)
    for it in range(0, KD * KH * KW * n_chunks):
        tap = it // n_chunks
        c0 = (it - tap * n_chunks) * BLOCK_K
        kd, kh, kw, a_row, row_ok = _tap_rows(tap, od, oh, ow, m_ok, x_base, KH, KW, ID, IH, IW,
                                              sd, sh, sw, pd, ph, pw, dd, dh, dw,
                                              s_xd, s_xh, s_xw, TRANSPOSED)
        ck = c0 + offs_k
        k_ok = ck < CG
        a = tl.load(x_ptr + (a_row[:, None] + ck.to(tl.int64)[None, :] * s_xc),
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_tap = w_base + kd * s_wd + kh * s_wh + kw * s_ww                   # [BN]
        b = tl.load(w_ptr + (w_tap[None, :] + ck[:, None] * s_wi),
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if F64:
            acc = tl.dot(a, b, acc, out_dtype=tl.float64)
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
    _store_pixels(acc, o_ptr, b_ptr, s_b, g * OG + offs_n, n_ok, m_ok, nb, od, oh, ow,
                  s_on, s_oc, s_od, s_oh, s_ow, HAS_BIAS, ACT)


@triton.jit
def _store_pixels(acc, o_ptr, b_ptr, s_b, co, c_ok, m_ok, nb, od, oh, ow,
                  s_on, s_oc, s_od, s_oh, s_ow, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """act(acc + bias[co]) -- acc [pixels, channels] -- stored at out[nb, co, od, oh, ow]
    through the output's strides, rounded once."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + co * s_b, mask=c_ok, other=0.0).to(acc.dtype)[None, :]
    acc = _apply_epilogue(acc, co, co, 0, 0, b_ptr, 0, b_ptr, 0, 0, 1.0, 1.0,
                          False, False, False, ACT)
    o_row = nb.to(tl.int64) * s_on + od * s_od + oh * s_oh + ow * s_ow
    tl.store(o_ptr + (o_row[:, None] + co.to(tl.int64)[None, :] * s_oc),
             acc.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & c_ok[None, :])


@triton.jit
def _depthwise_kernel(x_ptr, w_ptr, b_ptr, o_ptr, M, C, OG,
                      ID, IH, IW, OD, OH, OW, KD, KH, KW,
                      sd, sh, sw, pd, ph, pw, dd, dh, dw,
                      s_xn, s_xc, s_xd, s_xh, s_xw,
                      s_wo, s_wd, s_wh, s_ww,
                      s_on, s_oc, s_od, s_oh, s_ow, s_b,
                      BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
                      HAS_BIAS: tl.constexpr, F64: tl.constexpr, ACT: tl.constexpr):
    """out[n, co, o] = act(sum_taps x[n, co // OG, o*s - p + k*d] * weight[co, 0, k] (+ bias))."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    co = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    m_ok = offs_m < M
    c_ok = co < C
    nb, od, oh, ow = unravel4(offs_m, OD, OH, OW)
    x_base = nb.to(tl.int64) * s_xn
    x_ch = (co // OG).to(tl.int64) * s_xc
    if F64:
        acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    for tap in range(0, KD * KH * KW):
        kd, kh, kw, a_row, row_ok = _tap_rows(tap, od, oh, ow, m_ok, x_base, KH, KW, ID, IH, IW,
                                              sd, sh, sw, pd, ph, pw, dd, dh, dw,
                                              s_xd, s_xh, s_xw, False)
        xv = tl.load(x_ptr + (a_row[:, None] + x_ch[None, :]),
                     mask=row_ok[:, None] & c_ok[None, :], other=0.0)
        wv = tl.load(w_ptr + (co * s_wo + kd * s_wd + kh * s_wh + kw * s_ww), mask=c_ok,
                     other=0.0)
        acc += xv.to(acc.dtype) * wv.to(acc.dtype)[None, :]
    _store_pixels(acc, o_ptr, b_ptr, s_b, co, c_ok, m_ok, nb, od, oh, ow,
                  s_on, s_oc, s_od, s_oh, s_ow, HAS_BIAS, ACT)


@triton.jit
def _conv_tma_kernel(x_ptr, w_ptr, b_ptr, o_ptr, N, H, W, CX, OH, OW, CO, COP, CP, KH, KW,
                     ph, pw, dh, dw, s_xn, s_xh, s_xw, s_on, s_oc, s_oh, s_ow, s_b, ITERS,
                     BLOCK_M: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                     OUT_NCHW: tl.constexpr,
                     HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """A stride-1 16-bit 2-D conv as an implicit GEMM whose A tiles are TMA boxes.

    x is channels-last [N, H, W, CX] (unit channel stride); a program owns BH x BW output
    pixels of one image (BLOCK_M = BH*BW, passed) and BLOCK_N output channels. For tap (kh, kw)
    and channel chunk c0 the A tile is the box x[n, oh0 + kh*dh - ph : +BH, ow0 + kw*dw -
    pw : +BW, c0 : +BLOCK_K]: the copy engine zero-fills what lies outside the image (the
    padding) or past CX, so the K loop has no masks and no address arithmetic per element.
    The weight is [KH*KW*CP, COP] (ops' layout permuted once, channels zero-padded to CP, a
    multiple of BLOCK_K), so iteration `it` reads B rows it*BLOCK_K.. .
    SPLIT > 1: the program_id(1)-th of SPLIT slices of the ITERS iterations, stored as an
    fp32 partial [SPLIT, N*OH*OW, COP] into o_ptr for `_splitk_finish_kernel`.
    Else the tile is stored whole by a descriptor: NHWC [N, OH, OW, CO], or (OUT_NCHW)
    NCHW [N, CO, OH, OW] from the transposed tile."""
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(CO, BLOCK_N)
    tiles_w = tl.cdiv(OW, BW)
    tiles_h = tl.cdiv(OH, BH)
    # output channels fastest: the programs that read one input box run together
    nb, th, tw, pid_n = unravel4(pid, tiles_h, tiles_w, tiles_n)
    oh0, ow0, co0 = th * BH, tw * BW, pid_n * BLOCK_N
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[N, H, W, CX], strides=[s_xn, s_xh, s_xw, 1],
                                       block_shape=[1, BH, BW, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[KH * KW * CP, CO], strides=[COP, 1],
                                       block_shape=[BLOCK_K, BLOCK_N])
    n_chunks = CP // BLOCK_K
    lo = 0
    hi = ITERS
    if SPLIT > 1:
        per = tl.cdiv(ITERS, SPLIT)
        lo = tl.program_id(1) * per
        hi = tl.minimum(lo + per, ITERS)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for it in range(lo, hi):
        tap = it // n_chunks
        c0 = (it - tap * n_chunks) * BLOCK_K
        kh = tap // KW
        kw = tap - kh * KW
        a = x_desc.load([nb, oh0 + kh * dh - ph, ow0 + kw * dw - pw, c0])
        b = w_desc.load([it * BLOCK_K, co0])
        acc = tl.dot(tl.reshape(a, (BLOCK_M, BLOCK_K)), b, acc)
    if SPLIT > 1:
        p_desc = tl.make_tensor_descriptor(o_ptr, shape=[SPLIT * N, OH, OW, CO],
                                           strides=[OH * OW * COP, OW * COP, COP, 1],
                                           block_shape=[1, BH, BW, BLOCK_N])
        p_desc.store([tl.program_id(1) * N + nb, oh0, ow0, co0],
                     tl.reshape(acc, (1, BH, BW, BLOCK_N)))
    else:
        offs_n = co0 + tl.arange(0, BLOCK_N)
        acc = _apply_epilogue(acc, offs_n, offs_n, 0, CO, b_ptr, s_b, b_ptr, 0, 0, 1.0, 1.0,
                              False, HAS_BIAS, False, ACT)
        res = acc.to(o_ptr.dtype.element_ty)
        if OUT_NCHW:
            o_desc = tl.make_tensor_descriptor(o_ptr, shape=[N, CO, OH, OW],
                                               strides=[s_on, s_oc, s_oh, 1],
                                               block_shape=[1, BLOCK_N, BH, BW])
            o_desc.store([nb, co0, oh0, ow0],
                         tl.reshape(tl.permute(tl.reshape(res, (BH, BW, BLOCK_N)), (2, 0, 1)),
                                    (1, BLOCK_N, BH, BW)))
        else:
            o_desc = tl.make_tensor_descriptor(o_ptr, shape=[N, OH, OW, CO],
                                               strides=[s_on, s_oh, s_ow, 1],
                                               block_shape=[1, BH, BW, BLOCK_N])
            o_desc.store([nb, oh0, ow0, co0], tl.reshape(res, (1, BH, BW, BLOCK_N)))


@triton.jit
def _splitk_finish_kernel(p_ptr, b_ptr, o_ptr, M, CO, COP, OH, OW, s_on, s_oc, s_oh, s_ow, s_b,
                          SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """out[m, co] = act(sum_s partial[s, m, co] + bias[co]), rounded once."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < CO
    src = p_ptr + offs_m.to(tl.int64)[:, None] * COP + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(src + s * M.to(tl.int64) * COP, mask=m_ok[:, None] & n_ok[None, :],
                       other=0.0)
    nb, _, oh, ow = unravel4(offs_m, 1, OH, OW)
    _store_pixels(acc, o_ptr, b_ptr, s_b, offs_n, n_ok, m_ok, nb, 0, oh, ow,
                  s_on, s_oc, 0, s_oh, s_ow, HAS_BIAS, ACT)


# ------------------------------------------------------------------ launch configuration
_OVERRIDE: dict | None = None     # tests and sweeps: BLOCK_M / BLOCK_N / BLOCK_K / num_warps


def conv_config(M, CG, OG, itemsize, interp=False) -> dict:
    """The implicit GEMM's tile from the problem's shape: BLOCK_N covers the group's output
    channels up to 128, BLOCK_K its input channels up to 64 (32 for fp32, 16 for fp64, so
    the pipelined tiles stay well inside shared memory), BLOCK_M 128 pixels once there are
    enough of them (64 otherwise); 8 warps for the 128x128 tiles. tl.dot needs >= 16.
    `interp`: the interpreter has no shared memory to fit and pays per loop step and per
    helper call, not per element: tiles up to 256 channels each way, so a 512-channel 3x3
    conv takes 18 steps a program instead of 144."""
    if interp:
        cfg = dict(BLOCK_M=min(max(_next_pow2(M), 16), 128),
                   BLOCK_N=min(max(_next_pow2(OG), 16), 256),
                   BLOCK_K=min(max(_next_pow2(CG), 16), 256), num_warps=4, num_stages=1)
    else:
        bn = min(max(_next_pow2(OG), 16), 128)
        kmax = {2: 64, 4: 32, 8: 16}[itemsize]
        bk = min(max(_next_pow2(CG), 16), kmax)
        bm = 128 if M >= 128 * 8 else 64
        if itemsize == 8:
            bm, bn = 64, min(bn, 64)
        cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                   num_warps=8 if bm * bn >= 128 * 128 else 4,
                   num_stages=2 if itemsize == 8 else 3)
    if _OVERRIDE:
        cfg.update({k: v for k, v in _OVERRIDE.items() if k in cfg})
    return cfg


def depthwise_config(C) -> dict:
    cfg = dict(BLOCK_M=64, BLOCK_C=min(max(_next_pow2(C), 8), 64), num_warps=4)
    if _OVERRIDE:
        cfg.update({k: v for k, v in _OVERRIDE.items() if k in cfg})
    return cfg


def _geometry(out, x, weight, stride, padding, dilation):
    n = out.shape[0]
    return ((n * out.shape[2] * out.shape[3] * out.shape[4],) + tuple(x.shape[2:])
            + tuple(out.shape[2:]) + tuple(weight.shape[2:]) + tuple(stride) + tuple(padding)
            + tuple(dilation))


def _implicit_gemm(out, x, weight, bias, stride, padding, dilation, groups, transposed,
                   precision, act):
    from ..backends.launch import launch
    geo = _geometry(out, x, weight, stride, padding, dilation)
    M = geo[0]
    # B's rows are read along the output channels: a weight whose output channels are not
    # unit-stride (torch's own layouts) is first copied so that they are. The copy is small
    # next to the product; on the H200 (bf16) it took a 256-channel 3x3 conv at 256x256
    # from 0.88 ms to 0.28 ms (NHWC input) and 0.86 to 0.53 ms (NCHW)
    if transposed:    # weight (C_in, C_out/g, k...): B[(ci, k), co] = weight[g*CG + ci, co, k]
        CG, OG = x.shape[1] // groups, weight.shape[1]
        wp = weight.permute(2, 3, 4, 0, 1)            # (KD, KH, KW, C_in, C_out/g)
    else:             # weight (C_out, C_in/g, k...): B[(ci, k), co] = weight[g*OG + co, ci, k]
        CG, OG = weight.shape[1], weight.shape[0] // groups
        wp = weight.permute(2, 3, 4, 1, 0)            # (KD, KH, KW, C_in/g, C_out)
    if wp.stride(4) != 1 and OG > 1:
        wp = wp.contiguous()
    ws = wp.stride()
    s_wo, s_wi = ws[4], ws[3]
    s_wg = CG * s_wi if transposed else OG * s_wo
    cfg = conv_config(M, CG, OG, x.dtype.itemsize, x.device.type == "interp")
    grid = (_cdiv(M, cfg["BLOCK_M"]) * _cdiv(OG, cfg["BLOCK_N"]) * groups,)
    launch(_conv_kernel, grid, x, wp, bias if bias is not None else x, out, M, CG, OG,
           groups, *geo[1:], *x.stride(), s_wg, s_wo, s_wi, *ws[:3], *out.stride(),
           bias.stride(0) if bias is not None else 0,
           BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
           TRANSPOSED=transposed, HAS_BIAS=bias is not None, F64=x.dtype.itemsize == 8,
           PRECISION=precision if x.dtype.itemsize == 4 else "ieee", ACT=act,
           num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out


def _depthwise(out, x, weight, bias, stride, padding, dilation, act):
    from ..backends.launch import launch
    geo = _geometry(out, x, weight, stride, padding, dilation)
    C = out.shape[1]
    cfg = depthwise_config(C)
    ws = weight.stride()
    grid = (_cdiv(geo[0], cfg["BLOCK_M"]), _cdiv(C, cfg["BLOCK_C"]))
    launch(_depthwise_kernel, grid, x, weight, bias if bias is not None else x, out, geo[0], C,
           C // x.shape[1], *geo[1:], *x.stride(), ws[0], *ws[2:], *out.stride(),
           bias.stride(0) if bias is not None else 0,
           BLOCK_M=cfg["BLOCK_M"], BLOCK_C=cfg["BLOCK_C"], HAS_BIAS=bias is not None,
           F64=x.dtype.itemsize == 8, ACT=act, num_warps=cfg["num_warps"])
    return out


# ------------------------------------------------------------------ TMA path (16-bit, stride 1)
# Stride-1, ungrouped 2-D convolutions in float16/bfloat16 on sm_90+ take `_conv_tma_kernel`
# (None keeps every problem on the pointer kernel: A/B runs and sweeps). MAX_BH caps the rows
# of a pixel box: a one-row box ([1, 1, BW, BLOCK_K]) reaches the tensor cores straight
# from shared memory, a taller one is reshaped through registers (Triton 3.6 does not merge
# the box's row and column dims in shared memory).
TMA_CONV: dict | None = dict(BLOCK_M=128, num_stages=4, MAX_BH=16)


def tma_config(N, OH, OW, C, CO, taps, dev) -> dict:
    """The TMA conv's tile: BLOCK_K 64 channels (fewer for thin inputs), BLOCK_N 128
    output channels (the next power of two for fewer), a BH x BW pixel box of BLOCK_M =
    128 (64 when that covers the image with much less overhang) whose shape wastes the
    least of OH x OW; split-K when the tiles alone would not fill the SMs."""
    knobs = dict(TMA_CONV or {})
    if _OVERRIDE:
        knobs.update({k: v for k, v in _OVERRIDE.items() if k in ("BLOCK_M", "MAX_BH")})
    bk = 64 if C > 32 else (32 if C > 16 else 16)
    bn = 128 if CO > 64 else max(16, _next_pow2(CO))
    bm_pref, max_bh = knobs.get("BLOCK_M", 128), knobs.get("MAX_BH", 16)
    best = None
    for bm in sorted({bm_pref, min(bm_pref, 64)}, reverse=True):
        for bw in (128, 64, 32, 16, 8):
            bh = bm // bw
            if bw > bm or bh > max_bh:
                continue
            util = OH * OW / (_cdiv(OH, bh) * bh * _cdiv(OW, bw) * bw)
            score = util - (0.1 if bm < bm_pref else 0.0) - (0.02 if bh > 1 else 0.0)
            if best is None or score > best[0] + 1e-9:
                best = (score, bh, bw)
    _, bh, bw = best
    cp = _cdiv(C, bk) * bk
    iters = taps * (cp // bk)
    tiles = N * _cdiv(OH, bh) * _cdiv(OW, bw) * _cdiv(CO, bn)
    split = 1
    # (not on interp: the interpreter runs programs one after another, few large ones are
    # its fastest; the tests force SPLIT there)
    if dev.type == "cuda" and tiles < dev.sms and iters >= 8:
        split = max(1, min(_cdiv(dev.sms, tiles), iters // 4, 16))
    cfg = dict(BH=bh, BW=bw, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split,
               num_warps=8 if bh * bw * bn >= 128 * 128 else 4,
               num_stages=knobs.get("num_stages", 4))
    if _OVERRIDE:
        cfg.update({k: v for k, v in _OVERRIDE.items() if k in cfg})
    return cfg


def _aligned16(t, dims):
    """Whether a TMA descriptor can read t: 16-byte aligned base and strides of `dims`."""
    isz = t.dtype.itemsize
    return t.data_ptr() % 16 == 0 and all((t.stride(d) * isz) % 16 == 0 for d in dims)


def _tma_applies(x, weight, stride, dilation, groups, transposed) -> bool:
    return (TMA_CONV is not None and not transposed and groups == 1
            and x.dtype in (_dt.float16, _dt.bfloat16) and device_facts(x.device).cc >= 90
            and tuple(stride) == (1, 1, 1) and x.shape[2] == 1 and weight.shape[2] == 1)


def _channels_last_input(x2):
    """x2 (N, C, H, W) as the kernel reads it -- channels-last with TMA-legal strides --
    uncopied when it already is, else copied once (channel count padded to 8 so the
    pixel stride is 16-byte aligned; the padding lies past the descriptor's C, so the
    copy engine reads it as zeros). Returns (tensor [N, H, W, CX] view, strides)."""
    N, C, H, W = x2.shape
    v = x2.permute(0, 2, 3, 1)
    if x2.stride(1) == 1 and _aligned16(v, (0, 1, 2)):
        return v
    cx = _cdiv(C, 8) * 8
    buf = type(x2)._empty((N, H, W, cx), x2.dtype, x2.device)
    if cx == C:
        return buf.copy_(v)
    buf.narrow(3, 0, C).copy_(v)
    return buf


def _prepared_weight(w2, cp):
    """weight (CO, C, KH, KW) as B = [KH*KW*cp, COP]: rows (tap, ci), channels zero-padded
    to cp (a multiple of BLOCK_K, so a K chunk never reaches the next tap) and the output
    channels to a multiple of 8 (a 16-byte aligned row stride)."""
    CO, C, KH, KW = w2.shape
    cop = _cdiv(CO, 8) * 8
    src = w2.permute(2, 3, 1, 0)
    if cp == C and cop == CO and src.is_contiguous():
        return src, cop             # already in B's layout (models/craft.py _taps_major)
    wp = type(w2)._empty((KH, KW, cp, cop), w2.dtype, w2.device)
    if cp == C and cop == CO:
        return wp.copy_(src), cop
    wp.zero_()
    wp.narrow(2, 0, C).narrow(3, 0, CO).copy_(src)
    return wp, cop


def _conv_tma(out, x, weight, bias, padding, dilation, act):
    from ..backends.launch import launch
    N, C, _, H, W = x.shape
    CO, _, _, KH, KW = weight.shape
    OH, OW = out.shape[3], out.shape[4]
    xv = _channels_last_input(x[:, :, 0])
    cfg = tma_config(N, OH, OW, C, CO, KH * KW, device_facts(x.device))
    bk = cfg["BLOCK_K"]
    cp = _cdiv(C, bk) * bk
    wp, cop = _prepared_weight(weight[:, :, 0], cp)
    iters = KH * KW * (cp // bk)
    split = cfg["SPLIT"]
    bh, bw, bn = cfg["BH"], cfg["BW"], cfg["BLOCK_N"]
    grid = (N * _cdiv(OH, bh) * _cdiv(OW, bw) * _cdiv(CO, bn), split)
    o2 = out[:, :, 0]
    has_bias = bias is not None
    common = dict(BLOCK_M=bh * bw, BH=bh, BW=bw, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split,
                  HAS_BIAS=has_bias, ACT=act, num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"])
    xs = xv.stride()
    if split > 1:
        part = type(x)._empty((split, N * OH * OW, cop), _dt.float32, x.device)
        launch(_conv_tma_kernel, grid, xv, wp, bias if has_bias else x, part, N, H, W, C, OH,
               OW, CO, cop, cp, KH, KW, padding[1], padding[2], dilation[1], dilation[2],
               xs[0], xs[1], xs[2], 0, 0, 0, 0, 0, iters, OUT_NCHW=False, **common)
        fm, fn = 64, min(128, max(16, _next_pow2(CO)))
        launch(_splitk_finish_kernel, (_cdiv(N * OH * OW, fm), _cdiv(CO, fn)), part,
               bias if has_bias else x, o2, N * OH * OW, CO, cop, OH, OW, *o2.stride(),
               bias.stride(0) if has_bias else 0, SPLIT=split, BLOCK_M=fm, BLOCK_N=fn,
               HAS_BIAS=has_bias, ACT=act, num_warps=4)
        return out
    if o2.stride(1) == 1 and _aligned16(o2, (0, 2, 3)):
        target, nchw = o2, False                      # channels-last output
    elif o2.stride(3) == 1 and _aligned16(o2, (0, 1, 2)):
        target, nchw = o2, True                       # NCHW output, unit pixel stride
    else:                                             # other layouts: through a NHWC buffer
        target = type(x)._empty((N, OH, OW, cop), x.dtype, x.device).narrow(
            3, 0, CO).permute(0, 3, 1, 2)
        nchw = False
    ts = target.stride()
    launch(_conv_tma_kernel, grid[:1], xv, wp, bias if has_bias else x, target, N, H, W, C,
           OH, OW, CO, cop, cp, KH, KW, padding[1], padding[2], dilation[1], dilation[2],
           xs[0], xs[1], xs[2], ts[0], ts[1], ts[2], ts[3],
           bias.stride(0) if has_bias else 0, iters, OUT_NCHW=nchw, **common)
    if target is not o2:
        o2.copy_(target)
    return out


# ------------------------------------------------------------------ 1x1 convolutions as GEMMs
# 1x1 stride-1 convolutions run as the library's matmul (False: the implicit GEMM; A/B runs)
POINTWISE_GEMM = True


def _pointwise_applies(weight, stride, padding, groups, transposed) -> bool:
    return (POINTWISE_GEMM and not transposed and groups == 1
            and tuple(weight.shape[2:]) == (1, 1, 1)
            and tuple(stride) == (1, 1, 1) and not any(padding))


def _pixel_step(t):
    """The stride that walks the D*H*W pixels of one image of t (N, C, D, H, W) as one
    arithmetic run (size-1 dims ignored; 0 for a single pixel), or None."""
    dims = [(n, s) for n, s in zip(t.shape[2:], t.stride()[2:]) if n > 1]
    if not dims:
        return 0
    step = run = dims[-1][1]
    for n, s in reversed(dims):
        if s != run:
            return None
        run = s * n
    return step


def _rows(t, P):
    """The stride of t's N*P pixels as one run of rows (channels-last, images back to
    back), or None."""
    step = _pixel_step(t)
    if step is None or (t.shape[1] > 1 and t.stride(1) != 1):
        return None
    if P == 1:
        return t.stride(0) if t.shape[0] > 1 else t.shape[1]
    if t.shape[0] > 1 and t.stride(0) != P * step:
        return None
    return step


def _pointwise(out, x, weight, bias, act, precision):
    """A 1x1 conv is one product. Channels-last: [N*pixels, C] @ W^T, one GEMM over every
    image, bias and activation in its epilogue. Unit pixel stride (NCHW): W @ [C, pixels]
    per image, the bias a residual broadcast along the pixels. Returns None when the
    layouts fit neither (the implicit GEMM takes it)."""
    from .matmul import matmul
    N, C, CO = x.shape[0], x.shape[1], out.shape[1]
    P = x.shape[2] * x.shape[3] * x.shape[4]
    ws = (weight.stride(0), weight.stride(1))
    rx, ro = _rows(x, P), _rows(out, P)
    if rx is not None and ro is not None:
        matmul(out._view((1, 1, N * P, CO), (0, 0, ro, 1)),
               x._view((1, 1, N * P, C), (0, 0, rx, 1)),
               weight._view((1, 1, C, CO), (0, 0, ws[1], ws[0])),
               bias=bias, activation=_ACT_NAMES[act], precision=precision)
        return out
    if _pixel_step(x) in (0, 1) and _pixel_step(out) in (0, 1) and (bias is None or act == 0):
        res = None if bias is None else bias._view((N, 1, CO, P), (0, 0, bias.stride(0), 0))
        matmul(out._view((N, 1, CO, P), (out.stride(0), 0, out.stride(1), 1)),
               weight._view((N, 1, CO, C), (0, 0, ws[0], ws[1])),
               x._view((N, 1, C, P), (x.stride(0), 0, x.stride(1), 1)),
               residual=res, activation=_ACT_NAMES[act], precision=precision)
        return out
    return None


_ACT_NAMES = {v: k for k, v in ACTIVATIONS.items() if k is not None}


@register("conv", "triton")
def conv(out, x, weight, bias, stride, padding, dilation, groups, precision="ieee",
         activation=None):
    act = ACTIVATIONS[activation]
    # the one routing decision: 1x1 -> GEMM, depthwise -> direct, 16-bit stride 1 -> TMA
    if _pointwise_applies(weight, stride, padding, groups, False) and \
            _pointwise(out, x, weight, bias, act, precision) is not None:
        return out
    if weight.shape[1] == 1 and groups == x.shape[1]:
        return _depthwise(out, x, weight, bias, stride, padding, dilation, act)
    if _tma_applies(x, weight, stride, dilation, groups, False):
        return _conv_tma(out, x, weight, bias, padding, dilation, act)
    return _implicit_gemm(out, x, weight, bias, stride, padding, dilation, groups, False,
                          precision, act)


@register("conv_transpose", "triton")
def conv_transpose(out, x, weight, bias, stride, padding, dilation, groups, precision="ieee"):
    return _implicit_gemm(out, x, weight, bias, stride, padding, dilation, groups, True,
                          precision, 0)
