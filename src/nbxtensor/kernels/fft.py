"""FFT kernels (cuda and interp), see docs/design/fft.md.

`c2c(x, dim, inverse, scale)` is the unnormalised DFT of a complex tensor along `dim`, times
`scale`, as a new contiguous tensor of x's shape. Paths, by length n and dtype:

  * complex64, n <= 128 (any n) or n a power of two up to 2**12: one launch of `_fft_tile`.
    A program loads ROWS rows into registers and transforms them there, as DFTs by tl.dot
    against DFT matrices (complex as four real dots, input_precision "tf32x3": three tf32
    products per real one, float32-grade accuracy on tensor cores). n <= 128 is one dot
    against the (zero-padded) n x n matrix; n = N1 * N2 (16 <= N2 <= N1 <= 64) is the
    two-stage Cooley-Tukey form: a dot by F_N1, the twiddle w_n^(n2 k1), a permute, a dot by
    F_N2; 4096 is three radix-16 stages. The rows are read and written through strides, so
    a transform along an inner dim of a contiguous tensor needs no transpose.
  * complex64, n a power of two in (2**12, 2**24]: the four-step form n = N1 * N2 in two
    launches of `_fft_tile`: N2 column transforms of length N1 (strided) whose store
    multiplies by w_n^(c k1) (a two-level table, no sin/cos), then N1 row transforms of
    length N2 stored transposed.
  * complex64, any other n: Bluestein's chirp-z through the power-of-two paths (the chirp
    multiplies fused into the loads and stores of `_fft_tile`).
  * complex128, and powers of two beyond 2**24: radix-2 Stockham passes (`_stockham_pass`,
    one launch per pass, twiddles from float64 sin/cos) and Bluestein on top of them.

Every table (DFT matrices, twiddles, chirps) is computed once per (n, dtype, device) on
the host in float64, rounded once, uploaded and cached.
"""
from __future__ import annotations

import numpy as np
from ._triton import triton, tl, libdevice  # Triton, or its stand-in without Triton

from .. import plans as _plans
from ..backends.launch import launch
from ..tensor import Tensor, _as_complex_view, _real_view
from ._host import cdiv as _cdiv

_BLOCK = 512
ONCHIP_MAX = 4096          # the longest power of two one program transforms on-chip
DIRECT_MAX = 128           # any n up to this is one dot against the n x n DFT matrix
FOURSTEP_MAX = ONCHIP_MAX * ONCHIP_MAX
_TILE = 4096               # complex elements per program (ROWS = _TILE // padded length)
# float32-grade dots on tensor cores (plain tf32 keeps ~10 bits); the interpreter's dot is
# float32 NumPy whatever the precision, so both devices bind the same variant
_PREC = "tf32x3"


# ------------------------------------------------------------------ the on-chip kernel
@triton.jit
def _cdot(ar, ai, br, bi, PREC: tl.constexpr):
    rr = tl.dot(ar, br, input_precision=PREC)
    ii = tl.dot(ai, bi, input_precision=PREC)
    ri = tl.dot(ar, bi, input_precision=PREC)
    ir = tl.dot(ai, br, input_precision=PREC)
    return rr - ii, ri + ir


@triton.jit
def _swap(a, R: tl.constexpr, A: tl.constexpr, B: tl.constexpr):
    # rows of R x [A, B] (row-major, in any 2-D shape) -> the [(r, b), a] tile [R * B, A]
    return tl.reshape(tl.permute(tl.reshape(a, (R, A, B)), (0, 2, 1)), (R * B, A))


@triton.jit
def _dft_matrix(tab, N: tl.constexpr, CONJ: tl.constexpr):
    # F_N[n, k] (re, im planes at tab; CONJ -1.0: the inverse's conjugate)
    f = tl.arange(0, N)[:, None] * N + tl.arange(0, N)[None, :]
    return tl.load(tab + f), tl.load(tab + N * N + f) * CONJ


@triton.jit
def _natural(br, bi, ROWS: tl.constexpr, N1: tl.constexpr, M: tl.constexpr):
    # [(r, k1), k'] -> natural order [ROWS, N1 * M]: [ROWS, k', k1], k = k' N1 + k1
    return (tl.reshape(_swap(br, ROWS, N1, M), (ROWS, N1 * M)),
            tl.reshape(_swap(bi, ROWS, N1, M), (ROWS, N1 * M)))


@triton.jit
def _first_stage(xr, xi, tab, tt, CONJ: tl.constexpr, N1: tl.constexpr, M: tl.constexpr,
                 ROWS: tl.constexpr, PREC: tl.constexpr):
    # n = n1 M + m: a dot by F_N1 (at tab) over n1, then the twiddle w_(N1 M)^(m k1) (at tt;
    # m k1 < N1 M), of the forward transform (CONJ: the inverse's conjugates) -> [(r, m), k1]
    f1r, f1i = _dft_matrix(tab, N1, CONJ)
    ar, ai = _cdot(_swap(xr, ROWS, N1, M), _swap(xi, ROWS, N1, M), f1r, f1i, PREC)
    e = (tl.arange(0, ROWS * M) % M)[:, None] * tl.arange(0, N1)[None, :]
    wr = tl.load(tt + e)
    wi = tl.load(tt + N1 * M + e) * CONJ
    return ar * wr - ai * wi, ar * wi + ai * wr


@triton.jit
def _core(xr, xi, tab, CONJ: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr,
          ROWS: tl.constexpr, PREC: tl.constexpr):
    # The DFT of ROWS rows [ROWS, N1 * N2] in natural order, on-chip. tab: F_N1 (re, im
    # planes), F_N2, w_(N1 N2)^e, all of the forward transform; CONJ (1.0 forward, -1.0
    # inverse) multiplies their imaginary parts (the inverse's tables are the conjugates).
    t2 = tab + 2 * N1 * N1
    tt = t2 + 2 * N2 * N2
    if N2 == 1:
        f1r, f1i = _dft_matrix(tab, N1, CONJ)
        yr, yi = _cdot(xr, xi, f1r, f1i, PREC)
    else:
        ar, ai = _first_stage(xr, xi, tab, tt, CONJ, N1, N2, ROWS, PREC)   # [(r, n2), k1]
        ar, ai = _swap(ar, ROWS, N2, N1), _swap(ai, ROWS, N2, N1)           # [(r, k1), n2]
        f2r, f2i = _dft_matrix(t2, N2, CONJ)
        br, bi = _cdot(ar, ai, f2r, f2i, PREC)                    # [(r, k1), k2]
        yr, yi = _natural(br, bi, ROWS, N1, N2)
    return yr, yi


@triton.jit
def _core3(xr, xi, tab, CONJ: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr,
           N3: tl.constexpr, ROWS: tl.constexpr, PREC: tl.constexpr):
    # Three stages, n = N1 * M (M = N2 * N3): a dot by F_N1, the twiddle w_N^(m k1), then
    # the two-stage `_core` of length M on the N1 rows of every row. tab: F_N1, w_N^e, then
    # the table of the M-point `_core`.
    M: tl.constexpr = N2 * N3
    N: tl.constexpr = N1 * M
    tt = tab + 2 * N1 * N1
    ar, ai = _first_stage(xr, xi, tab, tt, CONJ, N1, M, ROWS, PREC)        # [(r, m), k1]
    ar, ai = _swap(ar, ROWS, M, N1), _swap(ai, ROWS, M, N1)                 # [(r, k1), m]
    br, bi = _core(ar, ai, tt + 2 * N, CONJ, N2, N3, ROWS * N1, PREC)   # [(r, k1), k']
    return _natural(br, bi, ROWS, N1, M)


@triton.jit
def _ctile(xr, xi, tab, CONJ: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr,
           N3: tl.constexpr, ROWS: tl.constexpr, PREC: tl.constexpr):
    if N3 == 1:
        yr, yi = _core(xr, xi, tab, CONJ, N1, N2, ROWS, PREC)
    else:
        yr, yi = _core3(xr, xi, tab, CONJ, N1, N2, N3, ROWS, PREC)
    return yr, yi


@triton.jit
def _fft_tile(x, y, tab, pre, post, n_rows, C, in_bs, in_cs, in_js, out_bs, out_cs, out_ks,
              NV, KV, PCS, PJS, QCS, QKS, scale, CONJ: tl.constexpr, N1: tl.constexpr,
              N2: tl.constexpr, N3: tl.constexpr, ROWS: tl.constexpr, PRE: tl.constexpr,
              POST: tl.constexpr, OLB: tl.constexpr, PREC: tl.constexpr):
    # Rows r = b * C + c of x (element j at b*in_bs + c*in_cs + j*in_js, complex units,
    # x and y are the float views) -> y (element k at b*out_bs + c*out_cs + k*out_ks).
    # Element j has the global index g = c*PCS + j*PJS, output k the global index
    # kg = c*QCS + k*QKS (a four-step pass sees a piece of a longer row: (1, N2) and
    # (1, N1); plain rows (0, 1)). Elements g >= NV read as zero (padding), outputs
    # kg >= KV are not stored. PRE: multiply element j by pre[g] (complex).
    # POST 1: multiply output k by w^(c k) of the outer four-step length (two-level
    # table: post[lo], post[2**OLB + hi]). POST 2: multiply output k by post[kg].
    # POST 3 (plain rows only): Bluestein in one program: the DFT times post[k],
    # inverted on-chip, times pre[k] (with PRE, pre is the chirp).
    pid = tl.program_id(0).to(tl.int64)
    rr = pid * ROWS + tl.arange(0, ROWS)
    rmask = rr < n_rows
    b = rr // C
    c = rr % C
    ibase = b * in_bs + c * in_cs
    obase = b * out_bs + c * out_cs
    N: tl.constexpr = N1 * N2 * N3
    q = tl.arange(0, 2)
    j = tl.arange(0, N)[None, :]
    g = c[:, None] * PCS + j * PJS
    jm = (g < NV) & rmask[:, None]
    off = ibase[:, None] + j * in_js
    xr, xi = tl.split(tl.load(x + 2 * off[:, :, None] + q[None, None, :],
                              mask=jm[:, :, None] & (q[None, None, :] < 2), other=0.0))
    if PRE:
        pr = tl.load(pre + 2 * g, mask=jm, other=0.0)
        pi = tl.load(pre + 2 * g + 1, mask=jm, other=0.0)
        xr, xi = xr * pr - xi * pi, xr * pi + xi * pr
    yr, yi = _ctile(xr, xi, tab, CONJ, N1, N2, N3, ROWS, PREC)
    k = tl.arange(0, N)[None, :]
    kg = c[:, None] * QCS + k * QKS
    km = (kg < KV) & rmask[:, None]
    if POST == 1:
        # w^(c k) of the four-step length (c k < that length), as w^lo * w^(hi << OLB)
        ex = c[:, None] * k
        lo = ex & ((1 << OLB) - 1)
        hi = ex >> OLB
        lr = tl.load(post + 2 * lo)
        li = tl.load(post + 2 * lo + 1) * CONJ
        hr = tl.load(post + 2 * ((1 << OLB) + hi), mask=rmask[:, None], other=1.0)
        hi_ = tl.load(post + 2 * ((1 << OLB) + hi) + 1, mask=rmask[:, None], other=0.0) * CONJ
        wr = lr * hr - li * hi_
        wi = lr * hi_ + li * hr
        yr, yi = yr * wr - yi * wi, yr * wi + yi * wr
    elif POST == 2:
        pr = tl.load(post + 2 * kg, mask=km, other=0.0)
        pi = tl.load(post + 2 * kg + 1, mask=km, other=0.0)
        yr, yi = yr * pr - yi * pi, yr * pi + yi * pr
    elif POST == 3:
        fr = tl.load(post + 2 * k)
        fi = tl.load(post + 2 * k + 1)
        yr, yi = yr * fr - yi * fi, yr * fi + yi * fr
        yr, yi = _ctile(yr, yi, tab, -CONJ, N1, N2, N3, ROWS, PREC)
        pr = tl.load(pre + 2 * kg, mask=km, other=0.0)
        pi = tl.load(pre + 2 * kg + 1, mask=km, other=0.0)
        yr, yi = yr * pr - yi * pi, yr * pi + yi * pr
    yr = yr * scale
    yi = yi * scale
    ooff = obase[:, None] + k * out_ks
    tl.store(y + 2 * ooff[:, :, None] + q[None, None, :], tl.join(yr, yi),
             mask=km[:, :, None] & (q[None, None, :] < 2))


# ------------------------------------------------------------------ host tables
# device tables (DFT tiles, twiddles, chirps) by (kind, length, dtype, direction, device)
_TABLES = _plans.PlanCache("kernels.fft.tables", 256)


def _cache(key, make):
    hit = _TABLES.get(key)
    if hit is None:
        hit = make()
        _TABLES.put(key, hit)
    return hit


def _dft_planes(n, pad):
    """The forward n-point DFT matrix zero-padded to pad x pad, as (re, im) float64 planes."""
    k = np.arange(n, dtype=np.int64)
    e = (k[:, None] * k[None, :]) % n                 # exact exponent, then one rounding
    w = np.exp(-2j * np.pi * e / n)
    f = np.zeros((pad, pad), np.complex128)
    f[:n, :n] = w
    return [f.real.ravel(), f.imag.ravel()]


def _split(n):
    """(N1, N2, N3) of the on-chip kernel for length n: (padded n, 1, 1) for the direct DFT.
    4096 takes three radix-16 stages (48 MACs an element against 128 for 64 x 64)."""
    if n <= DIRECT_MAX:
        return max(16, 1 << (n - 1).bit_length()), 1, 1
    if n == 4096:
        return 16, 16, 16
    lg = n.bit_length() - 1
    a = (lg + 1) // 2
    return 1 << a, 1 << (lg - a), 1


def _twiddle_planes(n):
    w = np.exp(-2j * np.pi * np.arange(n) / n)
    return [w.real, w.imag]


def _tile_table(n, dev):
    """tab of `_fft_tile` for length n, float32: F_N1, F_N2 and the twiddles of `_core`;
    for three stages F_N1, w_n, then the table of the N2 N3-point `_core`."""
    def make():
        n1, n2, n3 = _split(n)
        if n3 == 1:
            parts = _dft_planes(n if n2 == 1 else n1, n1)
            parts += _dft_planes(n2, n2) + _twiddle_planes(n1 * n2)
        else:
            parts = _dft_planes(n1, n1) + _twiddle_planes(n)
            parts += _dft_planes(n2, n2) + _dft_planes(n3, n3) + _twiddle_planes(n2 * n3)
        a = np.concatenate(parts).astype(np.float32)
        return Tensor._from_numpy_unchecked(a).to(dev)
    return _cache(("tile", n, dev), make)


def _outer_table(n, dev):
    """(table, OLB) of the four-step twiddle w_n^e = w_n^(e & (2**OLB - 1)) * w_n^(e >> OLB << OLB),
    interleaved complex float32: the low part first (2**OLB entries), then the high part."""
    lg = n.bit_length() - 1
    olb = (lg + 1) // 2

    def make():
        lo = np.exp(-2j * np.pi * np.arange(1 << olb) / n)
        hi = np.exp(-2j * np.pi * (np.arange(n >> olb, dtype=np.float64) * (1 << olb)) / n)
        a = np.concatenate([lo, hi]).astype(np.complex64)
        return Tensor._from_numpy_unchecked(a.view(np.float32)).to(dev)
    return _cache(("outer", n, dev), make), olb


def _tile_launch(xf, yf, n, rows, C, ins, outs, inverse, scale, nv=None, kv=None,
                 pre=None, post=None, post_mode=0, olb=0, gidx=(0, 1), kidx=(0, 1)):
    """One `_fft_tile` launch over `rows` rows of length n (ins/outs: (bs, cs, js) strides)."""
    dev = xf._storage.device
    n1, n2, n3 = _split(n)
    tile = n1 * n2 * n3
    rows_per = max(1, _TILE // tile)
    tab = _tile_table(n, dev)
    grid = (_cdiv(rows, rows_per),)
    launch(_fft_tile, grid, xf, yf, tab, pre if pre is not None else tab,
           post if post is not None else tab, rows, C, ins[0], ins[1], ins[2],
           outs[0], outs[1], outs[2], n if nv is None else nv, n if kv is None else kv,
           gidx[0], gidx[1], kidx[0], kidx[1], float(scale),
           CONJ=-1.0 if inverse else 1.0, N1=n1, N2=n2, N3=n3, ROWS=rows_per,
           PRE=pre is not None, POST=post_mode, OLB=olb, PREC=_PREC,
           num_warps=8 if tile * rows_per >= 4096 else 4)


def _collapse(shape, stride):
    """(size, stride) of dims collapsible into one, or None."""
    size, st = 1, 1
    for n, s in zip(reversed(shape), reversed(stride)):
        if n == 1:
            continue
        if size == 1:
            size, st = n, s
        elif s == st * size:
            size *= n
        else:
            return None
    return size, st


def _onchip(x, d, n, inverse, scale):
    """x (complex64) along d by one `_fft_tile` launch: strides in, contiguous out."""
    out = Tensor._empty(x._shape, x._dtype, x._storage.device)
    lead = _collapse(x._shape[:d], x._stride[:d])
    trail = _collapse(x._shape[d + 1:], x._stride[d + 1:])
    if lead is None or trail is None:
        x = x.contiguous()
        lead = _collapse(x._shape[:d], x._stride[:d])
        trail = _collapse(x._shape[d + 1:], x._stride[d + 1:])
    (B, bs), (C, cs) = lead, trail
    js = x._stride[d]
    _tile_launch(_real_view(x), _real_view(out), n, B * C, C, (bs, cs, js), (n * C, 1, C),
                 inverse, scale)
    return out


def _fourstep(x, inverse, scale, m=None, pre=None, post=None, kv=None, out_len=None):
    """Rows (last dim, contiguous x) of a power of two length in (ONCHIP_MAX, FOURSTEP_MAX],
    two launches. For Bluestein the rows may be shorter (n < m, zero-padded on the fly),
    `pre` multiplies input g, `post` multiplies output kg (< kv), out_len is the stored row."""
    n = x._shape[-1]
    m = m or n
    dev = x._storage.device
    n1 = max(16, m // ONCHIP_MAX)       # column transforms (strided) short, rows long
    n2 = m // n1
    rows = x.numel() // n
    ol = out_len or m
    tmp = Tensor._empty(x._shape[:-1] + (m,), x._dtype, dev)
    out = Tensor._empty(x._shape[:-1] + (ol,), x._dtype, dev)
    otw, olb = _outer_table(m, dev)
    # columns: row (b, c = n2) reads x[b, n2 + N2 n1], writes tmp[b, k1 N2 + n2] times w^(n2 k1)
    _tile_launch(_real_view(x), _real_view(tmp), n1, rows * n2, n2, (n, 1, n2), (m, 1, n2),
                 inverse, 1.0, nv=n, pre=pre, post=otw, post_mode=1, olb=olb, gidx=(1, n2))
    # rows: row (b, c = k1) reads tmp[b, k1 N2 + n2], writes out[b, k1 + N1 k2]
    _tile_launch(_real_view(tmp), _real_view(out), n2, rows * n1, n1, (m, n2, 1), (ol, 1, n1),
                 inverse, scale, kv=kv or m, post=post, post_mode=0 if post is None else 2,
                 kidx=(1, n1))
    return out


# ------------------------------------------------------------------ the simple path
@triton.jit
def _sincos64(t, INTERP: tl.constexpr):
    if INTERP:
        c = tl.cos(t)
        s = tl.sin(t)
    else:
        c = libdevice.cos(t)
        s = libdevice.sin(t)
    return c, s


@triton.jit
def _stockham_pass(x, y, total, N, half_n, s, SIGN: tl.constexpr, INTERP: tl.constexpr,
                   BLOCK: tl.constexpr):
    # one radix-2 pass: sub-transform length n = 2 * half_n, stride s (n * s == N)
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < total
    half = N // 2
    row = idx // half
    k = idx % half
    p = k // s
    q = k % s
    base = row * N
    ia = base + q + s * p
    ib = ia + s * half_n
    ar = tl.load(x + 2 * ia, mask=mask, other=0.0)
    ai = tl.load(x + 2 * ia + 1, mask=mask, other=0.0)
    br = tl.load(x + 2 * ib, mask=mask, other=0.0)
    bi = tl.load(x + 2 * ib + 1, mask=mask, other=0.0)
    # half_n arrives as a Python int when Triton specialises it (== 1): no .to on it
    t = p.to(tl.float64) * (SIGN * 3.141592653589793) / half_n
    c, sn = _sincos64(t, INTERP)
    wr = c.to(ar.dtype)
    wi = sn.to(ar.dtype)
    dr = ar - br
    di = ai - bi
    o0 = base + q + s * (2 * p)
    o1 = o0 + s
    tl.store(y + 2 * o0, ar + br, mask=mask)
    tl.store(y + 2 * o0 + 1, ai + bi, mask=mask)
    tl.store(y + 2 * o1, dr * wr - di * wi, mask=mask)
    tl.store(y + 2 * o1 + 1, dr * wi + di * wr, mask=mask)


def _stockham(x: Tensor, inverse: bool) -> Tensor:
    """Rows of the contiguous complex `x` (length a power of two), transformed; x is left as is."""
    N = x._shape[-1]
    if N == 1:
        return x.clone()
    rows = x.numel() // N
    dev = x._storage.device
    a = x.clone()
    b = Tensor._empty(x._shape, x._dtype, dev)
    total = rows * (N // 2)
    grid = (_cdiv(total, _BLOCK),)
    n, s = N, 1
    while n >= 2:
        launch(_stockham_pass, grid, _real_view(a), _real_view(b), total, N, n // 2, s,
               SIGN=1.0 if inverse else -1.0, INTERP=dev.type == "interp", BLOCK=_BLOCK)
        a, b = b, a
        n //= 2
        s *= 2
    return a


def _pow2_rows(x: Tensor, inverse: bool, scale=1.0) -> Tensor:
    """Rows (last dim) of the contiguous complex x, n a power of two, times scale."""
    n = x._shape[-1]
    if x._dtype.np == np.complex64 and n <= FOURSTEP_MAX:
        if n <= ONCHIP_MAX:
            return _onchip(x, x.ndim - 1, n, inverse, scale)
        return _fourstep(x, inverse, scale)
    y = _stockham(x, inverse)
    if scale != 1.0:
        from .elementwise import mul
        y = mul(y, scale)
    return y


def _chirp(n, dtype, inverse, dev):
    """(w, FFT of the filter / m, m) of Bluestein's transform of length n, cached."""
    def make():
        m = 1 << (2 * n - 2).bit_length()
        k = np.arange(n, dtype=np.int64)
        ang = np.pi * ((k * k) % (2 * n)).astype(np.float64) / n
        sign = 1.0 if inverse else -1.0
        w = np.exp(1j * sign * ang)                        # the chirp, float64
        filt = np.zeros(m, np.complex128)
        filt[:n] = np.conj(w)
        filt[m - n + 1:] = np.conj(w[1:])[::-1]
        npd = dtype.np
        wt = Tensor._from_numpy_unchecked(w.astype(npd)).to(dev)
        # the filter's spectrum in float64 on the host, with the 1/m of the inverse folded in
        ft = Tensor._from_numpy_unchecked((np.fft.fft(filt) / m).astype(npd)).to(dev)
        return wt, ft, m
    return _cache(("chirp", n, dtype, inverse, dev), make)


def _bluestein(x, inverse, scale):
    """Rows (last dim) of the contiguous complex x, any length n, times scale."""
    from .elementwise import mul
    n = x._shape[-1]
    dev = x._storage.device
    w, ft, m = _chirp(n, x._dtype, inverse, dev)
    rows = x.numel() // n
    if x._dtype.np == np.complex64 and m <= ONCHIP_MAX:
        # one launch: ifft_m(fft_m(pad(x w)) * ft)[:n] * w * scale, all on-chip
        out = Tensor._empty(x._shape, x._dtype, dev)
        _tile_launch(_real_view(x), _real_view(out), m, rows, 1, (n, 0, 1), (n, 0, 1), False,
                     scale, nv=n, kv=n, pre=_real_view(w), post=_real_view(ft), post_mode=3)
        return out
    if x._dtype.np == np.complex64 and m <= FOURSTEP_MAX:
        # four launches: the chirp and the padding fused into the first and last
        fa = _fourstep(x, False, 1.0, m=m, pre=_real_view(w), post=_real_view(ft))
        return _fourstep(fa, True, scale, post=_real_view(w), kv=n, out_len=n)
    a = Tensor._empty(x._shape[:-1] + (m,), x._dtype, dev)
    a.fill_(0)
    mul(x, w, out=a.narrow(-1, 0, n))
    fa = _pow2_rows(a, False)
    y = _pow2_rows(mul(fa, ft), True)
    y = mul(y.narrow(-1, 0, n), w)
    return mul(y, scale) if scale != 1.0 else y


def c2c(x: Tensor, dim: int, inverse: bool, scale: float = 1.0) -> Tensor:
    """The unnormalised DFT of the complex x along dim, times scale, contiguous in x's shape
    (or a transposed view of a contiguous result)."""
    n = x._shape[dim]
    last = x.ndim - 1
    if x.numel() == 0:
        return Tensor._empty(x._shape, x._dtype, x._storage.device)
    pow2 = n & (n - 1) == 0
    if x._dtype.np == np.complex64 and (n <= DIRECT_MAX or (n <= ONCHIP_MAX and pow2)):
        return _onchip(x, dim, n, inverse, scale)
    xt = x.transpose(dim, last).contiguous() if dim != last else x.contiguous()
    if pow2:
        y = _pow2_rows(xt, inverse, scale)
    else:
        y = _bluestein(xt, inverse, scale)
    return y.transpose(dim, last) if dim != last else y


# ------------------------------------------------------------------ real <-> half-length complex
@triton.jit
def _rfft_post(z, out, tw, total, h, scale, BLOCK: tl.constexpr):
    # X[k] (k <= h) of a real signal of length 2h from Z = FFT_h(x[2m] + i x[2m+1]):
    # X = (Z[k] + conj Z[h-k]) / 2 - i w^k (Z[k] - conj Z[h-k]) / 2, w = exp(-2 pi i / 2h)
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < total
    row = idx // (h + 1)
    k = idx % (h + 1)
    ka = k % h
    kb = (h - k) % h
    ar = tl.load(z + 2 * (row * h + ka), mask=mask, other=0.0)
    ai = tl.load(z + 2 * (row * h + ka) + 1, mask=mask, other=0.0)
    br = tl.load(z + 2 * (row * h + kb), mask=mask, other=0.0)
    bi = tl.load(z + 2 * (row * h + kb) + 1, mask=mask, other=0.0)
    wr = tl.load(tw + 2 * k, mask=mask, other=0.0)
    wi = tl.load(tw + 2 * k + 1, mask=mask, other=0.0)
    er = 0.5 * (ar + br)
    ei = 0.5 * (ai - bi)
    o_r = 0.5 * (ai + bi)
    o_i = -0.5 * (ar - br)
    tl.store(out + 2 * idx, (er + wr * o_r - wi * o_i) * scale, mask=mask)
    tl.store(out + 2 * idx + 1, (ei + wr * o_i + wi * o_r) * scale, mask=mask)


@triton.jit
def _irfft_pre(xs, z, tw, total, h, BLOCK: tl.constexpr):
    # Z[k] (k < h) whose inverse FFT_h is 2h (x[2m] + i x[2m+1]) for the real x of the
    # hermitian spectrum X[0..h]: Z = (X[k] + conj X[h-k]) + i conj(w^k) (X[k] - conj X[h-k]);
    # the imaginary parts of X[0] and X[h] are ignored (c2r's convention)
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < total
    row = idx // h
    k = idx % h
    pa = row * (h + 1) + k
    pb = row * (h + 1) + (h - k)
    edge = k == 0
    ar = tl.load(xs + 2 * pa, mask=mask, other=0.0)
    ai = tl.where(edge, 0.0, tl.load(xs + 2 * pa + 1, mask=mask, other=0.0))
    br = tl.load(xs + 2 * pb, mask=mask, other=0.0)
    bi = tl.where(edge, 0.0, tl.load(xs + 2 * pb + 1, mask=mask, other=0.0))
    wr = tl.load(tw + 2 * k, mask=mask, other=0.0)
    wi = -tl.load(tw + 2 * k + 1, mask=mask, other=0.0)
    sr = ar + br
    si = ai - bi
    dr = ar - br
    di = ai + bi
    tr = dr * wr - di * wi
    ti = dr * wi + di * wr
    tl.store(z + 2 * idx, sr - ti, mask=mask)
    tl.store(z + 2 * idx + 1, si + tr, mask=mask)


def _half_twiddles(n, dtype, dev):
    def make():
        w = np.exp(-2j * np.pi * np.arange(n // 2 + 1) / n).astype(dtype.np)
        return Tensor._from_numpy_unchecked(w)
    return _cache(("half", n, dtype, dev), lambda: _real_view(make().to(dev)))


def rfft_rows(x: Tensor, scale: float) -> Tensor:
    """The first n // 2 + 1 DFT coefficients of every row of the contiguous real x (n even),
    times scale, through one complex FFT of length n // 2."""
    n = x._shape[-1]
    h = n // 2
    dev = x._storage.device
    z = _as_complex_view(x.reshape(x._shape[:-1] + (h, 2)))
    Z = c2c(z, z.ndim - 1, False)
    out = Tensor._empty(x._shape[:-1] + (h + 1,), Z._dtype, dev)
    total = out.numel()
    if total:
        launch(_rfft_post, (_cdiv(total, _BLOCK),), _real_view(Z), _real_view(out),
               _half_twiddles(n, Z._dtype, dev), total, h, float(scale), BLOCK=_BLOCK)
    return out


def irfft_rows(X: Tensor, n: int, scale: float) -> Tensor:
    """The real signals of length n (even) of the hermitian spectra X[..., :n // 2 + 1]
    (contiguous complex), times scale, through one inverse complex FFT of length n // 2."""
    h = n // 2
    dev = X._storage.device
    Z = Tensor._empty(X._shape[:-1] + (h,), X._dtype, dev)
    total = Z.numel()
    if total:
        launch(_irfft_pre, (_cdiv(total, _BLOCK),), _real_view(X), _real_view(Z),
               _half_twiddles(n, X._dtype, dev), total, h, BLOCK=_BLOCK)
    z = c2c(Z, Z.ndim - 1, True, scale)
    return _real_view(z).reshape(X._shape[:-1] + (n,))
