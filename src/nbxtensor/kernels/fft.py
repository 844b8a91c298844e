"""FFT kernels (cuda and interp): radix-2 Stockham passes over rows of interleaved complex.

`c2c(x, inverse)` transforms every row of a contiguous complex tensor (rows of the last
dim) without normalisation. A power-of-two length runs log2(n) Stockham passes, each one
launch over all butterflies of all rows, ping-ponging between two buffers (the autosort
form: no bit reversal, natural order out). The twiddles are computed in the kernel from
float64 angles (p / n exact in float64 for n <= 2**52), so complex64 transforms round the
twiddles once. Every other length (primes, 1, products of small primes) runs Bluestein's
chirp-z transform through power-of-two transforms of length M >= 2n - 1: the chirp is built
on the host in float64 (k*k mod 2n, so the angle stays exact) and cached with the
transform of its filter per (n, dtype, direction, device).
"""
from __future__ import annotations

import numpy as np
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..backends.launch import launch
from ..tensor import Tensor, _real_view
from ._host import cdiv as _cdiv

_BLOCK = 512


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


def _pow2_c2c(x: Tensor, inverse: bool) -> Tensor:
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


_CHIRPS: dict = {}


def _chirp(n, dtype, inverse, dev):
    """(w, FFT of the filter) of Bluestein's transform of length n, cached."""
    key = (n, dtype, inverse, dev)
    hit = _CHIRPS.get(key)
    if hit is not None:
        return hit
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
    ft = _pow2_c2c(Tensor._from_numpy_unchecked(filt.astype(npd)).to(dev), False)
    if len(_CHIRPS) > 64:
        _CHIRPS.clear()
    _CHIRPS[key] = (wt, ft, m)
    return wt, ft, m


def c2c(x: Tensor, inverse: bool) -> Tensor:
    """The unnormalised DFT of every row (last dim) of the contiguous complex tensor `x`."""
    from ..ops.elementwise import mul
    n = x._shape[-1]
    if n & (n - 1) == 0:
        return _pow2_c2c(x, inverse)
    w, ft, m = _chirp(n, x._dtype, inverse, x._storage.device)
    a = Tensor._empty(x._shape[:-1] + (m,), x._dtype, x._storage.device)
    a.fill_(0)
    mul(x, w, out=a.narrow(-1, 0, n))
    fa = _pow2_c2c(a, False)
    y = _pow2_c2c(mul(fa, ft), True)             # the convolution, times m
    return mul(mul(y.narrow(-1, 0, n), w), 1.0 / m)

