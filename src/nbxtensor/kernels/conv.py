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

from ..dispatch import register
from ._host import cdiv as _cdiv, next_pow2 as _next_pow2


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
def _conv_kernel(x_ptr, w_ptr, b_ptr, o_ptr, M, CG, OG, G,
                 ID, IH, IW, OD, OH, OW, KD, KH, KW,
                 sd, sh, sw, pd, ph, pw, dd, dh, dw,
                 s_xn, s_xc, s_xd, s_xh, s_xw,
                 s_wg, s_wo, s_wi, s_wd, s_wh, s_ww,
                 s_on, s_oc, s_od, s_oh, s_ow, s_b,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 TRANSPOSED: tl.constexpr, HAS_BIAS: tl.constexpr, F64: tl.constexpr,
                 PRECISION: tl.constexpr):
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
    ow = offs_m % OW
    r = offs_m // OW
    oh = r % OH
    r = r // OH
    od = r % OD
    nb = r // OD
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
        kw = tap % KW
        kh = (tap // KW) % KH
        kd = tap // (KW * KH)
        i_d, ok_d = _in_coord(od, kd, sd, pd, dd, ID, TRANSPOSED)
        i_h, ok_h = _in_coord(oh, kh, sh, ph, dh, IH, TRANSPOSED)
        i_w, ok_w = _in_coord(ow, kw, sw, pw, dw, IW, TRANSPOSED)
        row_ok = m_ok & ok_d & ok_h & ok_w
        a_row = x_base + i_d * s_xd + i_h * s_xh + i_w * s_xw                # [BM]
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
    co = g * OG + offs_n
    if HAS_BIAS:
        acc += tl.load(b_ptr + co * s_b, mask=n_ok, other=0.0).to(acc.dtype)[None, :]
    o_row = nb.to(tl.int64) * s_on + od * s_od + oh * s_oh + ow * s_ow
    tl.store(o_ptr + (o_row[:, None] + co.to(tl.int64)[None, :] * s_oc),
             acc.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _depthwise_kernel(x_ptr, w_ptr, b_ptr, o_ptr, M, C, OG,
                      ID, IH, IW, OD, OH, OW, KD, KH, KW,
                      sd, sh, sw, pd, ph, pw, dd, dh, dw,
                      s_xn, s_xc, s_xd, s_xh, s_xw,
                      s_wo, s_wd, s_wh, s_ww,
                      s_on, s_oc, s_od, s_oh, s_ow, s_b,
                      BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
                      HAS_BIAS: tl.constexpr, F64: tl.constexpr):
    """out[n, co, o] = sum_taps x[n, co // OG, o*s - p + k*d] * weight[co, 0, k] (+ bias)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    co = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    m_ok = offs_m < M
    c_ok = co < C
    ow = offs_m % OW
    r = offs_m // OW
    oh = r % OH
    r = r // OH
    od = r % OD
    nb = r // OD
    x_base = nb.to(tl.int64) * s_xn
    x_ch = (co // OG).to(tl.int64) * s_xc
    if F64:
        acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    for tap in range(0, KD * KH * KW):
        kw = tap % KW
        kh = (tap // KW) % KH
        kd = tap // (KW * KH)
        i_d, ok_d = _in_coord(od, kd, sd, pd, dd, ID, False)
        i_h, ok_h = _in_coord(oh, kh, sh, ph, dh, IH, False)
        i_w, ok_w = _in_coord(ow, kw, sw, pw, dw, IW, False)
        row_ok = m_ok & ok_d & ok_h & ok_w
        a_row = x_base + i_d * s_xd + i_h * s_xh + i_w * s_xw
        xv = tl.load(x_ptr + (a_row[:, None] + x_ch[None, :]),
                     mask=row_ok[:, None] & c_ok[None, :], other=0.0)
        wv = tl.load(w_ptr + (co * s_wo + kd * s_wd + kh * s_wh + kw * s_ww), mask=c_ok,
                     other=0.0)
        acc += xv.to(acc.dtype) * wv.to(acc.dtype)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + co * s_b, mask=c_ok, other=0.0).to(acc.dtype)[None, :]
    o_row = nb.to(tl.int64) * s_on + od * s_od + oh * s_oh + ow * s_ow
    tl.store(o_ptr + (o_row[:, None] + co.to(tl.int64)[None, :] * s_oc),
             acc.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & c_ok[None, :])


# ------------------------------------------------------------------ launch configuration
_OVERRIDE: dict | None = None     # tests and sweeps: BLOCK_M / BLOCK_N / BLOCK_K / num_warps


def conv_config(M, CG, OG, itemsize) -> dict:
    """The implicit GEMM's tile from the problem's shape: BLOCK_N covers the group's output
    channels up to 128, BLOCK_K its input channels up to 64 (32 for fp32, 16 for fp64, so
    the pipelined tiles stay well inside shared memory), BLOCK_M 128 pixels once there are
    enough of them (64 otherwise); 8 warps for the 128x128 tiles. tl.dot needs >= 16."""
    bn = min(max(_next_pow2(OG), 16), 128)
    kmax = {2: 64, 4: 32, 8: 16}[itemsize]
    bk = min(max(_next_pow2(CG), 16), kmax)
    bm = 128 if M >= 128 * 8 else 64
    if itemsize == 8:
        bm, bn = 64, min(bn, 64)
    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=8 if bm * bn >= 128 * 128 else 4,
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
                   precision):
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
    cfg = conv_config(M, CG, OG, x.dtype.itemsize)
    grid = (_cdiv(M, cfg["BLOCK_M"]) * _cdiv(OG, cfg["BLOCK_N"]) * groups,)
    launch(_conv_kernel, grid, x, wp, bias if bias is not None else x, out, M, CG, OG,
           groups, *geo[1:], *x.stride(), s_wg, s_wo, s_wi, *ws[:3], *out.stride(),
           bias.stride(0) if bias is not None else 0,
           BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
           TRANSPOSED=transposed, HAS_BIAS=bias is not None, F64=x.dtype.itemsize == 8,
           PRECISION=precision if x.dtype.itemsize == 4 else "ieee", num_warps=cfg["num_warps"],
           num_stages=cfg["num_stages"])
    return out


def _depthwise(out, x, weight, bias, stride, padding, dilation):
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
           F64=x.dtype.itemsize == 8, num_warps=cfg["num_warps"])
    return out


@register("conv", "triton")
def conv(out, x, weight, bias, stride, padding, dilation, groups, precision="ieee"):
    if weight.shape[1] == 1 and groups == x.shape[1]:
        return _depthwise(out, x, weight, bias, stride, padding, dilation)
    return _implicit_gemm(out, x, weight, bias, stride, padding, dilation, groups, False,
                          precision)


@register("conv_transpose", "triton")
def conv_transpose(out, x, weight, bias, stride, padding, dilation, groups, precision="ieee"):
    return _implicit_gemm(out, x, weight, bias, stride, padding, dilation, groups, True,
                          precision)
