"""cpu: the "pool" dispatch with NumPy, the contract of kernels/pooling.py.

Vectorised over the output, one step per window position: each axis's window positions are
a small (O, K) table, and every step gathers one position of every window at once. Work is
in fp32 (fp64 for fp64) and rounded once. Windows that tile the input (2x2 stride 2) take
one pass per window position over strided views instead.
"""
from __future__ import annotations

import itertools

import numpy as np

from ...dispatch import register


def _axis(i, o, k, s, p, d, adaptive):
    """(start, length) of each of the o windows along an input axis of size i."""
    r = np.arange(o, dtype=np.int64)
    if adaptive:
        start = (r * i) // o
        return start, -(-((r + 1) * i) // o) - start
    return r * s - p, np.full(o, k, np.int64)


def _tiling(x, out, indices, kernel, stride, padding, dilation, adaptive):
    """Whether the windows tile the input without padding or overlap (kernel = stride, no
    dilation, every window whole): the common 2x2 pool, taken as K strided views."""
    return (indices is None and not adaptive and tuple(kernel) == tuple(stride)
            and not any(padding) and all(d == 1 for d in dilation)
            and all(o * k <= i for o, k, i in zip(out.shape[2:], kernel, x.shape[2:])))


def _pool_tiling(out, a, kernel, is_max, divisor, wt):
    """The tiling windows as one pass per window position over strided views of a."""
    ends = [o * k for o, k in zip(out.shape[2:], kernel)]
    acc = None
    for ks in itertools.product(*[range(k) for k in kernel]):
        v = a[(Ellipsis,) + tuple(slice(k, e, kk) for k, e, kk in zip(ks, ends, kernel))]
        if acc is None:
            acc = v.astype(wt)                   # a copy, whatever a's dtype
        elif is_max:
            np.maximum(acc, v, out=acc)          # NaN wins, as torch
        else:
            acc += v
    if not is_max:
        acc /= wt(divisor if divisor else np.prod(kernel))
    np.copyto(out._host_view(), acc, casting="unsafe")
    return out


@register("pool", "numpy")
def pool(out, indices, x, kernel, stride, padding, dilation, *, adaptive, is_max,
         count_include_pad, divisor):
    wt = np.float64 if x.dtype.itemsize == 8 else np.float32
    if _tiling(x, out, indices, kernel, stride, padding, dilation, adaptive):
        return _pool_tiling(out, x._host_view(), kernel, is_max, divisor, wt)
    a = x._host_view().astype(wt)
    sizes = a.shape[2:]
    axes = [_axis(i, o, k, s, p, d, adaptive) + (d if not adaptive else 1,)
            for i, o, k, s, p, d in zip(sizes, out.shape[2:], kernel, stride, padding,
                                        dilation)]
    shape = out.shape
    if is_max:
        acc = np.full(shape, -np.inf, wt)
        # torch's index before any update: each axis's first window position >= 0
        first = [np.where(st < 0, st + ((dil - 1 - st) // dil) * dil, st) for st, _, dil in axes]
        best = np.broadcast_to((first[0][:, None, None] * sizes[1] + first[1][None, :, None])
                               * sizes[2] + first[2][None, None, :], shape).copy()
    else:
        acc = np.zeros(shape, wt)
    for ks in itertools.product(*[range(k) for k in kernel]):
        pos, ok = [], []
        for (start, length, dil), k, n in zip(axes, ks, sizes):
            q = start + k * dil
            ok.append((k < length) & (q >= 0) & (q < n))
            pos.append(np.clip(q, 0, n - 1))
        valid = ok[0][:, None, None] & ok[1][None, :, None] & ok[2][None, None, :]
        v = a[:, :, pos[0][:, None, None], pos[1][None, :, None], pos[2][None, None, :]]
        if is_max:
            flat = (pos[0][:, None, None] * sizes[1] + pos[1][None, :, None]) * sizes[2] \
                + pos[2][None, None, :]
            upd = valid & ((v > acc) | np.isnan(v))
            acc = np.where(upd, v, acc)
            best = np.where(upd, flat, best)
        else:
            acc += np.where(valid, v, wt(0))
    if not is_max:
        if divisor:
            cnt = np.asarray(divisor, wt)
        else:
            cnt = np.ones((), wt)
            for j, ((start, length, _), n, p) in enumerate(zip(axes, sizes, padding)):
                if count_include_pad:
                    c = np.minimum(start + length, n + p) - start
                else:
                    c = np.minimum(start + length, n) - np.maximum(start, 0)
                cnt = cnt * c.astype(wt).reshape([-1 if j == m else 1 for m in range(3)])
        acc = acc / cnt
    out._host_view()[...] = acc.astype(out.dtype.np)
    if indices is not None:
        indices._host_view()[...] = best
    return out
