"""Fused decode GEMVs over GGML-quantised weights (Q8_0, Q4_1): decode_fused.py's semantics,

    out = epilogue(rmsnorm?(x) @ dequant(W)^T)      (NORM, GLU = silu(gate)*up, bias, RESIDUAL)

reading the GGUF blocks in place (kernels/quant.py's layout, one row of bytes per output row):
  Q8_0: 34-byte blocks  f16 d | i8 q[32]              w = d*q
  Q4_1: 20-byte blocks  f16 d | f16 m | u8 qs[16]     w = d*nibble + m  (qs[j]: weight j low
                                                       nibble, weight j + 16 high nibble)
A program owns BLOCK_N weight rows and one x row and walks the row's blocks BLOCK_B at a time,
as a (BLOCK_N, BLOCK_B, W) tile of machine words: Q4_1 the 4 int32 words of a block's 16
nibble bytes (rows and blocks are 4-byte aligned: 20-byte blocks), Q8_0 the 16 int16 words of
its 32 int8s (34-byte blocks are only 2-byte aligned). Word-wide loads are as wide as the
GGUF layout allows without repacking (16-byte vector loads would need a re-laid-out copy).
Per word the nibbles/bytes are unpacked in registers against the matching x elements, and
scaled per block:  sum_j w_j x_j = d * sum_j q_j x_j (+ m * sum_j x_j for Q4_1), accumulated
element-wise in fp32 in a (BLOCK_N, BLOCK_B, W) tile and reduced once at the end.
RMSNorm: the row's sum of squares accumulates in the same loop (every program walks all of
K) and 1/rms multiplies the result at the end, as in decode_fused.py.
PDL (cuda; kernels/_pdl.py's policy `pdl_enabled`): the first weight tile is loaded, then
gdc_wait (the previous kernel's results: x, residual) and gdc_launch_dependents, then
everything else; stores come after the wait. Each later weight tile is loaded one iteration
ahead. Every program executes gdc_wait (no early return).
M rows: a program per (row, BLOCK_N rows), the row index fastest in the grid, so for M <= 4
the rows sharing a weight block run back to back (HBM once, L2 for the others). Larger M
(prefill) runs the same kernel: correct, weights re-read from L2 per row.
Two kernels share the dot-product loop (`_qdot`):
  _qfused_gemv_kernel      fused_linear's semantics (entry fused_linear_quant)
  _qfused_qkv_rope_kernel  RMSNorm + QKV GEMV + RoPE + KV-cache append, as
                           decode_fused._fused_qkv_rope_kernel (entry fused_qkv_rope_quant;
                           the epilogue is its `_rope_append`):
                           the rotate_half pair rows (r, r + D/2) are dotted as GLU's pair.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from ..backends.cpu.ggml_blocks import check_blocks
from ..dispatch import register
from ._common import device_facts
from ._host import cdiv as _cdiv, next_pow2 as _np2
from ._pdl import _pdl_wait, pdl_enabled
from .decode_fused import PROGRAMS_PER_SM, _rope_append, _rope_program, gemv_out

QTYPES = {"Q8_0": 0, "Q4_1": 1}
_WORDS = {"Q8_0": 16, "Q4_1": 4}          # machine words per block's quants (int16 / int32)
_ALIGN = {"Q8_0": 2, "Q4_1": 4}


@triton.jit
def _load_tile(w_ptr, row_off, blk, bmask, offs_w, QTYPE: tl.constexpr):
    """Blocks `blk` (1, BB, 1) of rows at byte offsets row_off (BN, 1, 1): the quant words
    (BN, BB, W) and the per-block scale d and min m (BN, BB, 1) in fp32 (m unused for Q8_0)."""
    if QTYPE == 0:
        base = w_ptr + row_off + blk * 34
        q = tl.load((base + 2 + offs_w * 2).to(tl.pointer_type(tl.int16)), mask=bmask, other=0)
        d = tl.load(base.to(tl.pointer_type(tl.float16)), mask=bmask, other=0.0).to(tl.float32)
        m = d
    else:
        base = w_ptr + row_off + blk * 20
        q = tl.load((base + 4 + offs_w * 4).to(tl.pointer_type(tl.int32)), mask=bmask, other=0)
        d = tl.load(base.to(tl.pointer_type(tl.float16)), mask=bmask, other=0.0).to(tl.float32)
        m = tl.load((base + 2).to(tl.pointer_type(tl.float16)), mask=bmask,
                    other=0.0).to(tl.float32)
    return q, d, m


@triton.jit
def _x_part(x_row, nw_ptr, kk, bmask2, ss, NORM: tl.constexpr):
    """x at columns kk (1, BB, W, P) in fp32 (times the norm weight with NORM); ss += x*x."""
    xv = tl.load(x_row + kk, mask=bmask2, other=0.0).to(tl.float32)
    if NORM:
        ss += xv * xv
        xv = xv * tl.load(nw_ptr + kk, mask=bmask2, other=0.0).to(tl.float32)
    return xv, ss


@triton.jit
def _q_epilogue(y, u, offs_n, nmask, m, b_ptr, r_ptr, s_rm, GLU: tl.constexpr,
                HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr):
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)
    if GLU:
        y = y / (1.0 + tl.exp(-y)) * u
    if HAS_RES:
        y += tl.load(r_ptr + m * s_rm + offs_n, mask=nmask, other=0.0).to(tl.float32)
    return y


@triton.jit
def _qdot(x_row, w_ptr, nw_ptr, row_off, up_off, K, KB, eps, QTYPE: tl.constexpr,
          W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, NORM: tl.constexpr,
          PAIR: tl.constexpr, PDL: tl.constexpr):
    """(y, u): rmsnorm?(x) . dequant(rows at byte offsets row_off (BN, 1, 1)) in fp32, and
    with PAIR the same for the rows up_off bytes further (GLU's up rows, RoPE's second
    halves). Includes the PDL wait (after the first weight tile is issued)."""
    offs_b = tl.arange(0, BLOCK_B)[None, :, None]
    offs_w = tl.arange(0, W)[None, None, :]
    blk = offs_b
    bmask = blk < KB
    q, d, mn = _load_tile(w_ptr, row_off, blk, bmask, offs_w, QTYPE)
    if PAIR:
        qu, du, mu = _load_tile(w_ptr + up_off, row_off, blk, bmask, offs_w, QTYPE)
    else:
        qu, du, mu = q, d, mn
    _pdl_wait(PDL)    # x and the residual come from the previous kernel; then let the next start

    # x is read as (1, BLOCK_B, W, P) tiles: the P weights a word holds (per nibble half) are
    # P consecutive x elements, so x loads can be P-wide vectors and the sum over P stays in
    # a thread
    P: tl.constexpr = 2 if QTYPE == 0 else 4
    offs_i = tl.arange(0, P)[None, None, None, :]
    offs_w4 = offs_w[:, :, :, None]
    acc = tl.zeros((BLOCK_N, BLOCK_B, W), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_B, W), dtype=tl.float32)
    ss = tl.zeros((1, BLOCK_B, W, P), dtype=tl.float32)
    for b0 in range(0, KB, BLOCK_B):
        blk = b0 + offs_b
        bmask4 = (blk < KB)[:, :, :, None]
        kk = (blk * 32)[:, :, :, None] + offs_w4 * P + offs_i
        if QTYPE == 0:
            # int16 word w = int8 weights 2w (low byte) and 2w + 1 (high byte), sign-extended
            x0, ss = _x_part(x_row, nw_ptr, kk, bmask4, ss, NORM)
            sh = 24 - 8 * offs_i
            v = ((q.to(tl.int32)[:, :, :, None] << sh) >> 24).to(tl.float32)
            acc += d * tl.sum(v * x0, axis=3)
            if PAIR:
                vu = ((qu.to(tl.int32)[:, :, :, None] << sh) >> 24).to(tl.float32)
                acc_u += du * tl.sum(vu * x0, axis=3)
        else:
            # int32 word w = bytes 4w..4w+3; byte i: low nibble weight 4w+i, high 4w+i+16
            xl, ss = _x_part(x_row, nw_ptr, kk, bmask4, ss, NORM)
            xh, ss = _x_part(x_row, nw_ptr, kk + 16, bmask4, ss, NORM)
            sx = tl.sum(xl + xh, axis=3)
            sh = 8 * offs_i
            q4 = q[:, :, :, None]
            lo = ((q4 >> sh) & 15).to(tl.float32)
            hi = ((q4 >> (sh + 4)) & 15).to(tl.float32)
            acc += d * tl.sum(lo * xl + hi * xh, axis=3) + mn * sx
            if PAIR:
                qu4 = qu[:, :, :, None]
                lo = ((qu4 >> sh) & 15).to(tl.float32)
                hi = ((qu4 >> (sh + 4)) & 15).to(tl.float32)
                acc_u += du * tl.sum(lo * xl + hi * xh, axis=3) + mu * sx
        # the next tile, one iteration ahead (masked off past the row)
        nblk = blk + BLOCK_B
        nmask_b = nblk < KB
        q, d, mn = _load_tile(w_ptr, row_off, nblk, nmask_b, offs_w, QTYPE)
        if PAIR:
            qu, du, mu = _load_tile(w_ptr + up_off, row_off, nblk, nmask_b, offs_w, QTYPE)

    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    u = tl.sum(tl.sum(acc_u, axis=2), axis=1)
    if NORM:     # 1/rms factors out of the dot products
        inv = 1.0 / tl.sqrt(tl.sum(tl.sum(tl.sum(ss, axis=3), axis=2), axis=1) / K + eps)
        y = y * inv
        u = u * inv
    return y, u


@triton.jit
def _qfused_gemv_kernel(x_ptr, w_ptr, o_ptr, nw_ptr, b_ptr, r_ptr, N, K, KB, row_bytes, up_off,
                        eps, s_xm, s_om, s_rm,
                        QTYPE: tl.constexpr, W: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_B: tl.constexpr, NORM: tl.constexpr, GLU: tl.constexpr,
                        HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PDL: tl.constexpr):
    # up_off: GLU's up rows start N rows (N * row_bytes bytes) after the gate rows
    m_row = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    rows = tl.where(nmask, offs_n, 0).to(tl.int64)       # tail rows re-read row 0 (in bounds)
    row_off = (rows * row_bytes)[:, None, None]
    y, u = _qdot(x_ptr + m_row * s_xm, w_ptr, nw_ptr, row_off, up_off, K, KB, eps, QTYPE, W,
                 BLOCK_N, BLOCK_B, NORM, GLU, PDL)
    y = _q_epilogue(y, u, offs_n, nmask, m_row, b_ptr, r_ptr, s_rm, GLU, HAS_BIAS, HAS_RES)
    tl.store(o_ptr + m_row * s_om + offs_n, y.to(o_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _qfused_qkv_rope_kernel(x_ptr, w_ptr, q_ptr, nw_ptr, b_ptr, pos_ptr, inv_ptr, ck_ptr, cv_ptr,
                            len_ptr, flag_ptr, tag, K, KB, row_bytes, eps, Hq, Hkv, C, s_xm,
                            s_qm, s_pb, s_cb, s_ch, s_cn, s_cd, s_vb, s_vh, s_vn, s_vd,
                            QTYPE: tl.constexpr, W: tl.constexpr, HALF: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, NORM: tl.constexpr,
                            HAS_BIAS: tl.constexpr, PDL: tl.constexpr):
    # RMSNorm + QKV GEMV + RoPE + KV-cache append (decode_fused._fused_qkv_rope_kernel's
    # semantics) over quantised rows. A program owns BLOCK_N rotation pairs of ONE head
    # (BLOCK_N divides HALF = D/2): rows r1 = head*D + i and r1 + HALF, dotted as a pair.
    # Heads [0, Hq) are q (rotated, stored to q), [Hq, Hq+Hkv) k (rotated, into the cache at
    # the position read on the device), the rest v; values are rounded to the activations'
    # dtype before the rotation, as GEMV -> kv_append would.
    m, head, i, r1 = _rope_program(HALF, BLOCK_N)
    y1, y2 = _qdot(x_ptr + m * s_xm, w_ptr, nw_ptr, (r1 * row_bytes)[:, None, None],
                   HALF * row_bytes, K, KB, eps, QTYPE, W, BLOCK_N, BLOCK_B, NORM, True, PDL)
    _rope_append(y1, y2, m, head, i, r1, q_ptr, b_ptr, pos_ptr, inv_ptr, ck_ptr, cv_ptr, len_ptr,
                 flag_ptr, tag, Hq, Hkv, C, s_qm, s_pb, s_cb, s_ch, s_cn, s_cd, s_vb, s_vh, s_vn,
                 s_vd, HALF, HAS_BIAS)


# ------------------------------------------------------------------ launch configuration
#
# cuda: BLOCK_N = the largest power of two <= 16 leaving >= decode_fused.PROGRAMS_PER_SM
# programs per SM of the device, as decode_fused; BLOCK_B blocks per step so the tile holds 4 KB of quants
# (Q4_1: 1024 int32 words, Q8_0: 2048 int16 words -- 8 / 16 words a thread at 4 warps),
# capped by the row's block count (SmolLM2's K = 576 = 18 blocks: the layers take one step).
# interp: few, large programs (the interpreter pays per program).
_OVERRIDE: dict | None = None     # tests / sweeps: force a config (keys as returned below)


def qfused_config(M, N, KB, qtype, dev) -> dict:
    """The launch config for `dev` (kernels/_common.DeviceFacts)."""
    if _OVERRIDE:
        return dict(_OVERRIDE)
    kbp = max(1, _np2(KB))
    if dev.type != "cuda":
        return dict(BLOCK_N=min(32, _np2(N)), BLOCK_B=min(8, kbp), num_warps=4)
    bn = 16
    while bn > 1 and _cdiv(N, bn) < PROGRAMS_PER_SM * dev.sms:
        bn //= 2
    words = 1024 if qtype == "Q4_1" else 2048
    bb = max(1, min(words // (_WORDS[qtype] * bn), kbp))
    return dict(BLOCK_N=bn, BLOCK_B=bb, num_warps=4)


def fused_quant_gemv(x, w, *, norm_weight=None, eps=1e-6, bias=None, residual=None, glu=False,
                     out=None, pdl: bool | None = None):
    """out (M, N) = epilogue(rmsnorm?(x) @ dequant(w)^T); x (M, K) unit stride along K on
    cuda/interp; w a QuantWeight (N, K), or (2N, K) = [gate; up] with glu. Arguments are
    checked by fused_linear_quant (the entry ops/decode.decode_linear dispatches to).
    pdl: None = _pdl.pdl_enabled(x.device); True/False force it (cuda only)."""
    from ..backends.launch import launch
    M, K, N, out = gemv_out(x, w, glu, out)
    if M == 0 or N == 0:
        return out
    KB = K // 32
    cfg = qfused_config(M, N, KB, w.qtype, device_facts(x.device))
    if pdl is None:
        pdl = pdl_enabled(x.device)
    use_pdl = bool(pdl) and x.device.type == "cuda"    # the interpreter has no gdc_* ops
    flags = dict(NORM=norm_weight is not None, GLU=bool(glu), HAS_BIAS=bias is not None,
                 HAS_RES=residual is not None, PDL=use_pdl)
    blocks = w.blocks
    nw = norm_weight if norm_weight is not None else x
    b = bias if bias is not None else x
    r = residual if residual is not None else out
    s_rm = residual.stride(0) if residual is not None else 0
    opts = {k: v for k, v in cfg.items() if k in ("num_warps", "num_stages")}
    if use_pdl:
        opts["launch_pdl"] = True
    launch(_qfused_gemv_kernel, (M, _cdiv(N, cfg["BLOCK_N"])), x, blocks, out, nw, b, r,
           N, K, KB, blocks.stride(0), N * blocks.stride(0), float(eps), x.stride(0),
           out.stride(0), s_rm,
           QTYPE=QTYPES[w.qtype], W=_WORDS[w.qtype], BLOCK_N=cfg["BLOCK_N"],
           BLOCK_B=cfg["BLOCK_B"], **flags, **opts)
    return out


@register("decode_linear_quant", "triton")
def fused_linear_quant(x, w, *, norm_weight=None, eps=1e-6, bias=None, residual=None,
                       glu=False, out_dtype=None, pdl: bool | None = None):
    """ops/decode.decode_linear for a QuantWeight `w` (Q8_0 / Q4_1) on cuda/interp (x, the
    epilogue operands and the dtypes checked there): the blocks' layout, then the kernel."""
    from ..tensor import Tensor
    op = "decode_linear"
    _check_qtype(w, op)
    M, K = x.shape
    Nw = w.shape[0]
    N = Nw // 2 if glu else Nw
    blocks = check_blocks(w, op)
    if blocks.device != x.device:
        raise ValueError(f"{op}: w is on {blocks.device} but x is on {x.device}")
    if blocks.numel() and blocks.data_ptr() % _ALIGN[w.qtype]:
        raise ValueError(f"{op}: {w.qtype} blocks must start at a {_ALIGN[w.qtype]}-byte "
                         f"aligned address (word loads)")
    if x.stride(1) != 1:
        x = x.contiguous()
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()
    for name, t in (("norm_weight", norm_weight), ("bias", bias)):
        if t is not None and t.numel() > 1 and t.stride(0) != 1:
            raise ValueError(f"{op}: {name} must be contiguous")
    out = Tensor._empty((M, N), out_dtype or x.dtype, x.device)
    return fused_quant_gemv(x, w, norm_weight=norm_weight, eps=eps, bias=bias,
                            residual=residual, glu=glu, out=out, pdl=pdl)


def _check_qtype(w, op) -> None:
    if w.qtype not in QTYPES:
        raise ValueError(f"{op}: quantised weight type {w.qtype!r} has no fused kernel; "
                         f"supported: {', '.join(QTYPES)}")


@register("decode_qkv_rope_quant", "triton")
def fused_qkv_rope_quant(x, w, q_out, ck, cv, lengths, positions, inv, *, num_heads,
                         num_kv_heads, norm_weight=None, eps=1e-6, bias=None,
                         pdl: bool | None = None):
    """ops/decode.decode_qkv_rope for a Q8_0 / Q4_1 QuantWeight w = [wq; wk; wv] on
    cuda/interp (x, w's shape, positions, the cache layer, norm_weight and bias checked
    there): q rotated into q_out (B, Hq * D); k rotated and v written at slot positions[b]
    of ck / cv (B, Hkv, C, D) views, lengths[b] = positions[b] + 1. One kernel."""
    from ..backends.launch import launch
    from ..index_errors import positions_err
    from .indexing import _after, _flag, _tag
    op = "decode_qkv_rope"
    _check_qtype(w, op)
    B, K = x.shape
    Hkv, D = num_kv_heads, ck.shape[3]
    blocks = check_blocks(w, op)
    if blocks.device != x.device or (blocks.numel() and blocks.data_ptr() % _ALIGN[w.qtype]):
        raise ValueError(f"{op}: {w.qtype} weight {tuple(w.shape)} needs "
                         f"{_ALIGN[w.qtype]}-byte aligned blocks on {x.device}")
    rb = blocks.shape[1]
    q = q_out
    half = D // 2
    KB = K // 32
    npairs = (num_heads + 2 * Hkv) * half
    cfg = qfused_config(B, npairs, KB, w.qtype, device_facts(x.device))
    bn = cfg["BLOCK_N"]
    while half % bn:                       # a program's pairs stay inside one head
        bn //= 2
    if pdl is None:
        pdl = pdl_enabled(x.device)
    use_pdl = bool(pdl) and x.device.type == "cuda"
    opts = dict(num_warps=cfg.get("num_warps", 4))
    if use_pdl:
        opts["launch_pdl"] = True
    err = positions_err(op, ck.shape[2])
    launch(_qfused_qkv_rope_kernel, (B, npairs // bn), x, blocks, q,
           norm_weight if norm_weight is not None else x, bias if bias is not None else x,
           positions, inv, ck, cv, lengths, _flag(x.device), _tag(err), K, KB, rb, float(eps),
           num_heads, Hkv, ck.shape[2], x.stride(0), q.stride(0), positions.stride(0),
           *ck.stride(), *cv.stride(), QTYPE=QTYPES[w.qtype], W=_WORDS[w.qtype], HALF=half,
           BLOCK_N=bn, BLOCK_B=cfg["BLOCK_B"], NORM=norm_weight is not None,
           HAS_BIAS=bias is not None, PDL=use_pdl, **opts)
    _after(x.device, err)
    return q_out
