"""The numba kernels of backends/cpu/quant.py: imported on first use only (the leading
underscore keeps dispatch's module scan away, so `import nbxtensor` never imports numba).

GEMVs read the GGUF blocks as stored, one row of bytes per output feature, and accumulate
in float32: per block, the dot of the small integers with x, times the block's scale
(w = d*q + m  =>  w.x = d*(q.x) + m*sum(x)), so a weight is never materialised. gemv_<fmt>
takes x as float32; gemv8_<fmt> takes it as int8 blocks (quantize_activation) and computes
the block dots in integers.
Rows are split over the threads (prange), each row owned by one thread: the result does
not depend on the thread count. fastmath is limited to reassociation and FMA contraction
(the block dots vectorise); no nnan/ninf, so NaN and inf propagate as in the reference.
fp16 scales go through a 65536-entry table (exact, no bit tricks).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, register_jitable

_FM = {"reassoc", "contract"}
H2F = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@njit(cache=True, inline="always")
def _h(row, o, lut):
    return lut[np.int32(row[o]) | (np.int32(row[o + 1]) << 8)]


@njit(cache=True, fastmath=_FM)
def _block_sums(x, n):
    """Sums of x (M, K) over consecutive groups of n: (M, K // n)."""
    M, K = x.shape
    s = np.empty((M, K // n), np.float32)
    for i in range(M):
        for g in range(K // n):
            a = np.float32(0.0)
            for j in range(n):
                a += x[i, g * n + j]
            s[i, g] = a
    return s


@njit(cache=True, inline="always")
def _kscale(row, o, j):
    """Q4_K/Q5_K: the 6-bit scale and min of sub-block j from the 12 bytes at row[o:]."""
    if j < 4:
        return np.float32(row[o + j] & 63), np.float32(row[o + j + 4] & 63)
    sc = (row[o + j + 4] & 15) | ((row[o + j - 4] >> 6) << 4)
    mn = (row[o + j + 4] >> 4) | ((row[o + j] >> 6) << 4)
    return np.float32(sc), np.float32(mn)


# ------------------------------------------------------------------------------- GEMVs
# gemv_<fmt>(blocks, qi8, x, lut, out, res, nchunk, u16): out (M, N) = x (M, K) @ dequant(blocks).T
# (+ res (M, N) when res has rows); blocks (N, row_bytes) uint8, qi8 and u16 the same bytes
# as int8 and uint16 (every format's fp16 scales sit at even offsets).
# Rows go to the threads in nchunk contiguous chunks (one scratch allocation a chunk). Each
# row keeps 32 lane sums, acc[j] += q * (scale * x), across its blocks and adds them at the
# end: the lanes are independent, so the block loop vectorises without reordering a sum
# (a running scalar sum per block measured 3.3x slower on AVX-512).
# Every entry point is one loop nest (_gemv) around its format's block dot:
# dot(acc, row, rq, r16, xv, dx, xs, i, b, lut, y) adds block b of the row, met with row i
# of the activation, into the lanes acc and returns y plus the block's lane-free terms (the
# offset or mins times the activation's block sums xs; none in Q8_0 and Q6_K). The dots and the
# activations are register_jitable functions, inlined into the loop nest: numba's disk cache
# keys a closure by its pickled cells, and a plain function pickles by name, a dispatcher
# with a per-process id (which would recompile in every process).

def _gemv(name, QK, dot, int8):
    """The GEMV entry point `name`, a numba function: blocks of QK weights, x quantised to
    int8 (int8) or kept float32. Named `name` because numba names its cache files after the
    function."""
    activation, LANES = (_int8_x, 16) if int8 else (_float_x, 32)

    def gemv(blocks, qi8, x, lut, out, res, nchunk, u16):
        N = blocks.shape[0]
        M, K = x.shape
        nb = K // QK       # outside the parallel loop: computed inside it, Q6_K ran 20% slower
        xv, dx, xs = activation(x)
        has_res = res.shape[0] > 0
        for c in prange(nchunk):
            acc = np.empty(LANES, np.float32)
            r0, r1 = _chunk(c, nchunk, N)
            for r in range(r0, r1):
                row, rq, r16 = blocks[r], qi8[r], u16[r]
                for i in range(M):
                    acc[:] = 0.0
                    y = np.float32(0.0)
                    for b in range(nb):
                        y = dot(acc, row, rq, r16, xv, dx, xs, i, b, lut, y)
                    y += _lanes(acc, LANES)
                    out[i, r] = y + res[i, r] if has_res else y
    gemv.__name__ = gemv.__qualname__ = name
    return njit(parallel=True, cache=True, fastmath=_FM)(gemv)


@njit(cache=True, inline="always")
def _chunk(c, nchunk, N):
    return c * N // nchunk, (c + 1) * N // nchunk


@njit(cache=True, inline="always")
def _nibbles(q):
    """The low and high nibble of byte q as float32, split in float (exact): the integer
    split promotes to 64-bit lanes, half the vector width."""
    qf = np.float32(q)
    hi = np.floor(qf * np.float32(0.0625))
    return qf - np.float32(16.0) * hi, hi


@njit(cache=True, inline="always")
def _lanes(acc, n):
    y = np.float32(0.0)
    for j in range(n):
        y += acc[j]
    return y


@njit(cache=True, inline="always")
def _q6(row, ql, sh, qh, c, l):
    """Q6_K: weight l's 6-bit value: 4 bits at row[ql + l] >> sh, 2 at row[qh + l] >> 2c."""
    return ((row[ql + l] >> sh) & 15) | (((row[qh + l] >> (2 * c)) & 3) << 4)


@register_jitable
def _float_x(x):
    """The float32 activation: x itself, no scales, and its sums over blocks of 32."""
    return x, np.empty((0, 0), np.float32), _block_sums(x, 32)


@register_jitable(inline="always")
def _nibble_lanes(acc, row, qo, d, x, i, xo):
    """Q4_0 / Q4_1: acc[j] += lo_j * (d x[i, xo + j]), acc[16 + j] += hi_j * (d x[i, xo + 16 + j])
    for the nibbles of the 16 bytes at row[qo]."""
    for j in range(16):
        lo, hi = _nibbles(row[qo + j])
        acc[j] += lo * (d * x[i, xo + j])
        acc[16 + j] += hi * (d * x[i, xo + 16 + j])


@register_jitable(inline="always")
def _dot_q8_0(acc, row, rq, r16, x, dx, xs, i, b, lut, y):
    d = lut[r16[b * 17]]
    for j in range(32):
        acc[j] += np.float32(rq[b * 34 + 2 + j]) * (d * x[i, b * 32 + j])
    return y


@register_jitable(inline="always")
def _dot_q4_0(acc, row, rq, r16, x, dx, xs, i, b, lut, y):
    d = lut[r16[b * 9]]
    _nibble_lanes(acc, row, b * 18 + 2, d, x, i, b * 32)
    return y - np.float32(8.0) * d * xs[i, b]


@register_jitable(inline="always")
def _dot_q4_1(acc, row, rq, r16, x, dx, xs, i, b, lut, y):
    _nibble_lanes(acc, row, b * 20 + 4, lut[r16[b * 10]], x, i, b * 32)
    return y + lut[r16[b * 10 + 1]] * xs[i, b]


@register_jitable(inline="always")
def _dot_k(acc, row, x, xs, i, b, lut, y, five):
    """Q4_K (five False) and Q5_K: the 32 bytes of nibbles for sub-blocks 2c and 2c+1 (low
    and high nibbles), Q5_K's fifth bits from the 32 bytes at o + 16 (bit j for sub-block j)."""
    o = b * (176 if five else 144)
    qs = o + (48 if five else 16)
    d, dm = _h(row, o, lut), _h(row, o + 2, lut)
    for c in range(4):
        sc0, mn0 = _kscale(row, o + 4, 2 * c)
        sc1, mn1 = _kscale(row, o + 4, 2 * c + 1)
        a0, a1 = d * sc0, d * sc1
        base = b * 256 + c * 64
        for l in range(32):
            q = row[qs + c * 32 + l]
            lo, hi = q & 15, q >> 4
            if five:
                h = row[o + 16 + l] >> (2 * c)
                lo |= (h & 1) << 4
                hi |= ((h >> 1) & 1) << 4
            acc[l] += np.float32(lo) * (a0 * x[i, base + l]) + \
                np.float32(hi) * (a1 * x[i, base + 32 + l])
        g = b * 8 + 2 * c
        y -= dm * (mn0 * xs[i, g] + mn1 * xs[i, g + 1])
    return y


@register_jitable(inline="always")
def _dot_q4_k(acc, row, rq, r16, x, dx, xs, i, b, lut, y):
    return _dot_k(acc, row, x, xs, i, b, lut, y, False)


@register_jitable(inline="always")
def _dot_q5_k(acc, row, rq, r16, x, dx, xs, i, b, lut, y):
    return _dot_k(acc, row, x, xs, i, b, lut, y, True)


@register_jitable(inline="always")
def _dot_q6_k(acc, row, rq, r16, x, dx, xs, i, b, lut, y):
    o = b * 210
    d = _h(row, o + 208, lut)
    for hh in range(2):
        for c in range(4):
            base = b * 256 + hh * 128 + c * 32
            ql, sh, qh = o + 64 * hh + 32 * (c % 2), 4 * (c // 2), o + 128 + 32 * hh
            s0 = d * np.float32(rq[o + 192 + hh * 8 + c * 2])
            s1 = d * np.float32(rq[o + 192 + hh * 8 + c * 2 + 1])
            for l in range(16):
                acc[l] += np.float32(np.int32(_q6(row, ql, sh, qh, c, l)) - 32) * \
                    (s0 * x[i, base + l])
            for l in range(16, 32):
                acc[l] += np.float32(np.int32(_q6(row, ql, sh, qh, c, l)) - 32) * \
                    (s1 * x[i, base + l])
    return y

# ---------------------------------------------------------------------- int8-activation GEMVs
# The activation is quantised once per call, per block of 32 values, to int8 with a float32
# scale (quantize_activation: dx = max|x| / 127, qx = rint(x / dx)), and each weight block's
# small integers meet qx in integer dot products: w.x = d * dx * (q.qx) (+ the format's min
# or offset times dx * sum(qx)): the exact dot of the dequantised weight with the
# dequantised activation, up to float32 rounding of the per-block terms. The block dots
# are LLVM vector code written as numba intrinsics: numba types small-int arithmetic as
# int64 and its plain loops over one block did not vectorise (measured 0.1-0.4x the float
# kernel); the intrinsics give 16 int32 lanes per block (int8 x int8 pairs, a `pmaddwd` on
# x86), converted to float32 and added, times the block's scale, into 16 float lanes that
# are summed once per row. The IR is target-independent (LLVM picks the instructions).

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)


def _vt(t, n):
    return ir.VectorType(t, n)


def _is_bytes(a):
    return isinstance(a, types.Array) and a.ndim == 1 and a.dtype in (types.int8, types.uint8)


def _load8(context, builder, aty, arr, off, n, dx=0):
    """<n x i8> from the 1-D byte array `arr` at element offset off (+ dx)."""
    p = builder.gep(context.make_array(aty)(context, builder, arr).data, [off])
    if dx:
        p = builder.gep(p, [ir.Constant(ir.IntType(64), dx)])
    return builder.load(builder.bitcast(p, _vt(_I8, n).as_pointer()), align=1)


def _splat(builder, v, n):
    t = _vt(v.type, n)
    v = builder.insert_element(ir.Constant(t, ir.Undefined), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(_vt(_I32, n), [0] * n))


def _shift_amount(builder, v, n):
    return _splat(builder, builder.trunc(v, _I8), n)


def _accumulate(context, builder, aty, acc, terms):
    """acc[0:16] += sum of float32(ints) * scale over terms [(ints <16 x iN>, scale)]."""
    f16 = _vt(ir.FloatType(), 16)
    p = builder.bitcast(context.make_array(aty)(context, builder, acc).data, f16.as_pointer())
    a = builder.load(p, align=4)
    fl = ("reassoc", "contract")
    for ints, s in terms:
        a = builder.fadd(a, builder.fmul(builder.sitofp(ints, f16), _splat(builder, s, 16),
                                         flags=fl), flags=fl)
    builder.store(a, p, align=4)


def _lanes_sig(acc, scales, *arrays):
    ok = isinstance(acc, types.Array) and acc.dtype == types.float32 and acc.ndim == 1 and \
        all(_is_bytes(a) for a in arrays) and all(s == types.float32 for s in scales)
    return ok


@intrinsic
def _lanes_i8(typingctx, acc, w, wo, x, xo, s):
    """acc[l] += float32(w[wo+2l] x[xo+2l] + w[wo+2l+1] x[xo+2l+1]) * s, l < 16 (int8 w)."""
    if not _lanes_sig(acc, (s,), w, x):
        return None

    def codegen(context, builder, sig, args):
        acc_, w_, wo_, x_, xo_, s_ = args
        v32 = _vt(_I32, 32)
        p = builder.mul(builder.sext(_load8(context, builder, sig.args[1], w_, wo_, 32), v32),
                        builder.sext(_load8(context, builder, sig.args[3], x_, xo_, 32), v32))
        ev = builder.shuffle_vector(p, p, ir.Constant(_vt(_I32, 16), list(range(0, 32, 2))))
        od = builder.shuffle_vector(p, p, ir.Constant(_vt(_I32, 16), list(range(1, 32, 2))))
        _accumulate(context, builder, sig.args[0], acc_, [(builder.add(ev, od), s_)])
        return context.get_dummy_value()
    return types.void(acc, w, wo, x, xo, s), codegen


def _nibble_products(context, builder, sig, w_, wo_, x_, xlo_, xhi_, hbits=None):
    """(lo.x[xlo:+16], hi.x[xhi:+16]) as <16 x i16> for the 16 bytes at w[wo]: lo and hi
    nibbles (unsigned), each with a fifth bit from hbits = (qh bytes, shift) when given."""
    v16 = _vt(_I16, 16)
    q = _load8(context, builder, sig.args[1], w_, wo_, 16)
    lo = builder.and_(q, ir.Constant(_vt(_I8, 16), [15] * 16))
    hi = builder.lshr(q, ir.Constant(_vt(_I8, 16), [4] * 16))
    if hbits is not None:
        h, sh = hbits
        one = ir.Constant(_vt(_I8, 16), [1] * 16)
        four = ir.Constant(_vt(_I8, 16), [4] * 16)
        h0 = builder.lshr(h, _shift_amount(builder, sh, 16))
        lo = builder.or_(lo, builder.shl(builder.and_(h0, one), four))
        hi = builder.or_(hi, builder.shl(builder.and_(builder.lshr(h0, one), one), four))
    xa = sig.args[3]
    xl = builder.sext(_load8(context, builder, xa, x_, xlo_, 16), v16)
    xh = builder.sext(_load8(context, builder, xa, x_, xhi_, 16), v16)
    return builder.mul(builder.zext(lo, v16), xl), builder.mul(builder.zext(hi, v16), xh)


@intrinsic
def _lanes_u4(typingctx, acc, w, wo, x, xlo, xhi, s):
    """acc[l] += float32(lo_l x[xlo+l] + hi_l x[xhi+l]) * s, l < 16, for the nibbles of the
    16 bytes at w[wo] (Q4_0 / Q4_1: one scale for both halves)."""
    if not _lanes_sig(acc, (s,), w, x):
        return None

    def codegen(context, builder, sig, args):
        acc_, w_, wo_, x_, xlo_, xhi_, s_ = args
        a, b = _nibble_products(context, builder, sig, w_, wo_, x_, xlo_, xhi_)
        _accumulate(context, builder, sig.args[0], acc_, [(builder.add(a, b), s_)])
        return context.get_dummy_value()
    return types.void(acc, w, wo, x, xlo, xhi, s), codegen


@intrinsic
def _lanes_u4x2(typingctx, acc, w, wo, x, xlo, xhi, slo, shi):
    """acc[l] += float32(lo_l x[xlo+l]) * slo + float32(hi_l x[xhi+l]) * shi (Q4_K: the
    nibbles of a byte belong to two sub-blocks with their own scales)."""
    if not _lanes_sig(acc, (slo, shi), w, x):
        return None

    def codegen(context, builder, sig, args):
        acc_, w_, wo_, x_, xlo_, xhi_, slo_, shi_ = args
        a, b = _nibble_products(context, builder, sig, w_, wo_, x_, xlo_, xhi_)
        _accumulate(context, builder, sig.args[0], acc_, [(a, slo_), (b, shi_)])
        return context.get_dummy_value()
    return types.void(acc, w, wo, x, xlo, xhi, slo, shi), codegen


@intrinsic
def _lanes_u5x2(typingctx, acc, w, wo, qho, j, x, xlo, xhi, slo, shi):
    """_lanes_u4x2 with a fifth bit: bit j (lo) and j + 1 (hi) of the bytes at w[qho] (Q5_K)."""
    if not _lanes_sig(acc, (slo, shi), w, x):
        return None

    def codegen(context, builder, sig, args):
        acc_, w_, wo_, qho_, j_, x_, xlo_, xhi_, slo_, shi_ = args
        h = _load8(context, builder, sig.args[1], w_, qho_, 16)
        s2 = types.void(acc, w, wo, x)               # _nibble_products reads args 1 and 3
        a, b = _nibble_products(context, builder, s2, w_, wo_, x_, xlo_, xhi_, (h, j_))
        _accumulate(context, builder, sig.args[0], acc_, [(a, slo_), (b, shi_)])
        return context.get_dummy_value()
    return types.void(acc, w, wo, qho, j, x, xlo, xhi, slo, shi), codegen


@intrinsic
def _lanes_q6(typingctx, acc, w, qlo, s4, qho, s2, x, xo, s):
    """acc[l] += float32((q_l - 32) x[xo+l]) * s, l < 16, q_l = ((w[qlo+l] >> s4) & 15) |
    (((w[qho+l] >> s2) & 3) << 4) (Q6_K)."""
    if not _lanes_sig(acc, (s,), w, x):
        return None

    def codegen(context, builder, sig, args):
        acc_, w_, qlo_, s4_, qho_, s2_, x_, xo_, s_ = args
        c8 = lambda v: ir.Constant(_vt(_I8, 16), [v] * 16)       # noqa: E731
        v16 = _vt(_I16, 16)
        lo = builder.and_(builder.lshr(_load8(context, builder, sig.args[1], w_, qlo_, 16),
                                       _shift_amount(builder, s4_, 16)), c8(15))
        hb = builder.and_(builder.lshr(_load8(context, builder, sig.args[1], w_, qho_, 16),
                                       _shift_amount(builder, s2_, 16)), c8(3))
        q = builder.sub(builder.zext(builder.or_(lo, builder.shl(hb, c8(4))), v16),
                        ir.Constant(v16, [32] * 16))
        xv = builder.sext(_load8(context, builder, sig.args[6], x_, xo_, 16), v16)
        _accumulate(context, builder, sig.args[0], acc_, [(builder.mul(q, xv), s_)])
        return context.get_dummy_value()
    return types.void(acc, w, qlo, s4, qho, s2, x, xo, s), codegen


@njit(cache=True)
def quantize_activation(x, qx, dx, xs):
    """Per block of 32 values of x (M, K) float32: dx = max|x| / 127, qx = rint(x / dx)
    (int8, |qx| <= 127; 0 where dx is 0) and xs = dx * sum(qx), the block sum of the
    quantised x: the formats' offsets and mins meet the same x as their quants, so the
    rounding errors see the centred weight (with the float sum of x, Q4_1's logits moved
    about twice as far from the float32 path). A block holding NaN or inf gets dx = NaN
    (every output it meets is NaN) and qx = 0."""
    M, K = x.shape
    for i in range(M):
        for b in range(K // 32):
            a = np.float32(0.0)
            finite = True
            for j in range(32):
                av = abs(x[i, b * 32 + j])
                finite = finite and av < np.float32(np.inf)
                if av > a:
                    a = av
            d = a / np.float32(127.0)
            if not finite:
                d = np.float32(np.nan)
            dx[i, b] = d
            s = 0
            for j in range(32):
                q = np.int8(np.rint(x[i, b * 32 + j] / d)) if finite and d > 0 else np.int8(0)
                qx[i, b * 32 + j] = q
                s += q
            xs[i, b] = d * np.float32(s)


@njit(cache=True)
def _quantized(x):
    M, K = x.shape
    qx = np.empty((M, K), np.int8)
    dx = np.empty((M, K // 32), np.float32)
    xs = np.empty((M, K // 32), np.float32)
    quantize_activation(x, qx, dx, xs)
    return qx, dx, xs


# The entry Python calls. Not cached: once the cached GEMVs have loaded _quantized's cached
# code into a process, numba cannot box arrays returned by that cached copy to Python
# (NRT_adapt_ndarray_to_python: 'descr' is NULL), so Python goes through a fresh compile.
@njit(cache=False)
def quantized_py(x):
    return _quantized(x)


# gemv8_<fmt>(blocks, qi8, x, lut, out, res, nchunk, u16): as gemv_<fmt>; x is quantised
# first, on the calling thread (quantize_activation), inside the call so a GEMV stays one
# dispatch. The dots take the quantised row qx[i] with its block scales dx and sums xs.

@register_jitable
def _int8_x(x):
    return _quantized(x)


@register_jitable(inline="always")
def _dot8_q8_0(acc, row, rq, r16, qx, dx, xs, i, b, lut, y):
    _lanes_i8(acc, rq, b * 34 + 2, qx[i], b * 32, lut[r16[b * 17]] * dx[i, b])
    return y


@register_jitable(inline="always")
def _dot8_q4_0(acc, row, rq, r16, qx, dx, xs, i, b, lut, y):
    d = lut[r16[b * 9]]
    _lanes_u4(acc, row, b * 18 + 2, qx[i], b * 32, b * 32 + 16, d * dx[i, b])
    return y - np.float32(8.0) * d * xs[i, b]


@register_jitable(inline="always")
def _dot8_q4_1(acc, row, rq, r16, qx, dx, xs, i, b, lut, y):
    _lanes_u4(acc, row, b * 20 + 4, qx[i], b * 32, b * 32 + 16, lut[r16[b * 10]] * dx[i, b])
    return y + lut[r16[b * 10 + 1]] * xs[i, b]


@register_jitable(inline="always")
def _dot8_k(acc, row, qx, dx, xs, i, b, lut, y, five):
    """_dot_k with the int8 activation: each 16 bytes of nibbles meet 16 + 16 values of qx."""
    o = b * (176 if five else 144)
    qs = o + (48 if five else 16)
    d, dm = _h(row, o, lut), _h(row, o + 2, lut)
    xi = qx[i]
    for c in range(4):
        sc0, mn0 = _kscale(row, o + 4, 2 * c)
        sc1, mn1 = _kscale(row, o + 4, 2 * c + 1)
        g = b * 8 + 2 * c
        s0, s1 = d * sc0 * dx[i, g], d * sc1 * dx[i, g + 1]
        for hf in range(0, 32, 16):
            if five:
                _lanes_u5x2(acc, row, qs + c * 32 + hf, o + 16 + hf, 2 * c, xi, g * 32 + hf,
                            g * 32 + 32 + hf, s0, s1)
            else:
                _lanes_u4x2(acc, row, qs + c * 32 + hf, xi, g * 32 + hf, g * 32 + 32 + hf,
                            s0, s1)
        y -= dm * (mn0 * xs[i, g] + mn1 * xs[i, g + 1])
    return y


@register_jitable(inline="always")
def _dot8_q4_k(acc, row, rq, r16, qx, dx, xs, i, b, lut, y):
    return _dot8_k(acc, row, qx, dx, xs, i, b, lut, y, False)


@register_jitable(inline="always")
def _dot8_q5_k(acc, row, rq, r16, qx, dx, xs, i, b, lut, y):
    return _dot8_k(acc, row, qx, dx, xs, i, b, lut, y, True)


@register_jitable(inline="always")
def _dot8_q6_k(acc, row, rq, r16, qx, dx, xs, i, b, lut, y):
    o = b * 210
    d = _h(row, o + 208, lut)
    xi = qx[i]
    for hh in range(2):
        for c in range(4):
            g = b * 8 + hh * 4 + c
            sd = d * dx[i, g]
            for hf in range(0, 32, 16):
                sc = np.float32(rq[o + 192 + hh * 8 + c * 2 + hf // 16])
                _lanes_q6(acc, row, o + 64 * hh + 32 * (c % 2) + hf, 4 * (c // 2),
                          o + 128 + 32 * hh + hf, 2 * c, xi, g * 32 + hf, sd * sc)
    return y

# ------------------------------------------------------------------ dequantisation (prefill)
# dequant_<fmt>(blocks, qi8, lut, out): out (N, K) float32. The same float32 values as
# backends/cpu/ggml_blocks.py (d*q products are exact in float32; one rounding at the end). Single-threaded
# on purpose: prefill alternates them with BLAS matmuls, and a numba pool next to BLAS's
# own threads made the two fight for the cores (prefill 3 tok/s on a loaded 2-core machine);
# a weight's dequantisation is ~1/10 of its matmul at a 41-token prompt.
# As the GEMVs, one loop nest (_dequant) around the format's block: block(w, row, rq, b, lut)
# writes block b of the row to w (its QK float32 values).

def _dequant(name, QK, block):
    """The dequantisation entry point `name` (named for numba's cache files, as _gemv's)."""
    def dequant(blocks, qi8, lut, out):
        N, K = out.shape
        for r in range(N):
            row, rq = blocks[r], qi8[r]
            for b in range(K // QK):
                block(out[r, b * QK:(b + 1) * QK], row, rq, b, lut)
    dequant.__name__ = dequant.__qualname__ = name
    return njit(cache=True)(dequant)


@register_jitable(inline="always")
def _dequant_q8_0(w, row, rq, b, lut):
    d = _h(row, b * 34, lut)
    for j in range(32):
        w[j] = np.float32(rq[b * 34 + 2 + j]) * d


@register_jitable(inline="always")
def _dequant_q4_0(w, row, rq, b, lut):
    d = _h(row, b * 18, lut)
    for j in range(16):
        q = row[b * 18 + 2 + j]
        w[j] = (np.float32(q & 15) - np.float32(8.0)) * d
        w[16 + j] = (np.float32(q >> 4) - np.float32(8.0)) * d


@register_jitable(inline="always")
def _dequant_q4_1(w, row, rq, b, lut):
    d, m = _h(row, b * 20, lut), _h(row, b * 20 + 2, lut)
    for j in range(16):
        q = row[b * 20 + 4 + j]
        w[j] = np.float32(q & 15) * d + m
        w[16 + j] = np.float32(q >> 4) * d + m


@register_jitable(inline="always")
def _dequant_k(w, row, b, lut, five):
    """Q4_K (five False) and Q5_K, laid out as in _dot_k."""
    o = b * (176 if five else 144)
    qs = o + (48 if five else 16)
    d, dm = _h(row, o, lut), _h(row, o + 2, lut)
    for j in range(8):
        sc, mn = _kscale(row, o + 4, j)
        a, z = d * sc, dm * mn
        for l in range(32):
            q = (row[qs + (j // 2) * 32 + l] >> (4 * (j % 2))) & 15
            if five:
                q |= ((row[o + 16 + l] >> j) & 1) << 4
            w[j * 32 + l] = a * np.float32(q) - z


@register_jitable(inline="always")
def _dequant_q4_k(w, row, rq, b, lut):
    _dequant_k(w, row, b, lut, False)


@register_jitable(inline="always")
def _dequant_q5_k(w, row, rq, b, lut):
    _dequant_k(w, row, b, lut, True)


@register_jitable(inline="always")
def _dequant_q6_k(w, row, rq, b, lut):
    o = b * 210
    d = _h(row, o + 208, lut)
    for hh in range(2):
        for c in range(4):
            ql, sh, qh = o + 64 * hh + 32 * (c % 2), 4 * (c // 2), o + 128 + 32 * hh
            for l in range(32):
                sc = np.float32(rq[o + 192 + hh * 8 + c * 2 + l // 16])
                w[hh * 128 + c * 32 + l] = \
                    d * (np.float32(np.int32(_q6(row, ql, sh, qh, c, l)) - 32) * sc)

# ------------------------------------------------------------- the decode step's small ops
@njit(cache=True, fastmath=_FM)
def rms_norm(x, w, eps, out):
    """out (M, K) = x / sqrt(mean(x^2) + eps) * w, float32."""
    M, K = x.shape
    for i in range(M):
        s = np.float32(0.0)
        for j in range(K):
            s += x[i, j] * x[i, j]
        inv = np.float32(1.0) / np.sqrt(s / np.float32(K) + np.float32(eps))
        for j in range(K):
            out[i, j] = x[i, j] * inv * w[j]


@njit(cache=True)
def silu_mul(gu, out):
    """out (M, N) = silu(gu[:, :N]) * gu[:, N:] (gate and up side by side)."""
    M, N = out.shape
    for i in range(M):
        for j in range(N):
            g = gu[i, j]
            out[i, j] = g / (np.float32(1.0) + np.exp(-g)) * gu[i, N + j]


@njit(parallel=True, cache=True, fastmath=_FM)
def rope_attend(qkv, cos, sin, kc, vc, pos, n_heads, out):
    """T tokens' attention after `pos` cached ones: RoPE (rotate_half; cos/sin (T, D), the
    rows of positions pos..pos+T-1) on q and k of qkv (T, (Hq + 2 Hkv) * D), k and v
    written to kc/vc (Hkv, L, D) at pos.., then causal softmax(q k^T / sqrt(D)) v with GQA
    (token t sees positions 0..pos+t); out (T, Hq * D). Heads over the threads."""
    Hkv, _, D = kc.shape
    T = qkv.shape[0]
    h2 = D // 2
    nq = n_heads * D
    for t in range(T):
        for h in range(Hkv):
            o = nq + h * D
            for d in range(h2):
                x1, x2 = qkv[t, o + d], qkv[t, o + h2 + d]
                kc[h, pos + t, d] = x1 * cos[t, d] - x2 * sin[t, d]
                kc[h, pos + t, h2 + d] = x2 * cos[t, h2 + d] + x1 * sin[t, h2 + d]
            for d in range(D):
                vc[h, pos + t, d] = qkv[t, nq + Hkv * D + h * D + d]
    grp = n_heads // Hkv
    scale = np.float32(1.0 / math.sqrt(D))
    for hq in prange(n_heads):
        hk = hq // grp
        o = hq * D
        sc = np.empty(pos + T, np.float32)
        q = np.empty(D, np.float32)
        acc = np.empty(D, np.float32)
        for t in range(T):
            S = pos + t + 1
            for d in range(h2):
                x1, x2 = qkv[t, o + d], qkv[t, o + h2 + d]
                q[d] = x1 * cos[t, d] - x2 * sin[t, d]
                q[h2 + d] = x2 * cos[t, h2 + d] + x1 * sin[t, h2 + d]
            mx = np.float32(-np.inf)
            for j in range(S):
                s = np.float32(0.0)
                for d in range(D):
                    s += q[d] * kc[hk, j, d]
                s *= scale
                sc[j] = s
                if s > mx or s != s:      # a NaN score propagates, as in the reference
                    mx = s
            den = np.float32(0.0)
            for j in range(S):
                e = np.exp(sc[j] - mx)
                sc[j] = e
                den += e
            for d in range(D):
                acc[d] = 0.0
            for j in range(S):
                p = sc[j] / den
                for d in range(D):
                    acc[d] += p * vc[hk, j, d]
            for d in range(D):
                out[t, o + d] = acc[d]


# format: (weights a block, float32-activation dot, int8-activation dot, dequantisation)
_FORMATS = {
    "Q8_0": (32, _dot_q8_0, _dot8_q8_0, _dequant_q8_0),
    "Q4_0": (32, _dot_q4_0, _dot8_q4_0, _dequant_q4_0),
    "Q4_1": (32, _dot_q4_1, _dot8_q4_1, _dequant_q4_1),
    "Q4_K": (256, _dot_q4_k, _dot8_q4_k, _dequant_q4_k),
    "Q5_K": (256, _dot_q5_k, _dot8_q5_k, _dequant_q5_k),
    "Q6_K": (256, _dot_q6_k, _dot8_q6_k, _dequant_q6_k),
}
GEMV = {f: _gemv(f"gemv_{f.lower()}", qk, dot, False)
        for f, (qk, dot, _, _) in _FORMATS.items()}
GEMV_INT8 = {f: _gemv(f"gemv8_{f.lower()}", qk, dot8, True)
             for f, (qk, _, dot8, _) in _FORMATS.items()}
DEQUANT = {f: _dequant(f"dequant_{f.lower()}", qk, block)
           for f, (qk, _, _, block) in _FORMATS.items()}
