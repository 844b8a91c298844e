"""cpu: attention, decode attention, RoPE and the KV-cache writes with NumPy, the same
contracts as kernels/attention.py, kernels/decode_attention.py and kernels/rope.py.
Work is in fp32 (fp64 for fp64 tensors), rounded once to the output dtype."""
from __future__ import annotations

import numpy as np

from ...dispatch import register
from .indexing import _checked


def _work(t):
    return np.float64 if t.dtype.itemsize == 8 else np.float32


def _softmax_rows(s):
    """Softmax over the last axis; rows with no finite score give 0 (torch's safe softmax)."""
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)   # initial: no keys (length 0)
    m = np.where(np.isneginf(m), 0, m)
    e = np.exp(s - m)
    z = e.sum(axis=-1, keepdims=True)
    return e / np.where(z == 0, 1, z)


@register("sdpa", "numpy")
def sdpa(out, q, k, v, mask, *, scale, is_causal):
    wt = _work(q)
    B, H, L, _ = q.shape
    Hk, S = k.shape[1], k.shape[2]
    a = q._host_view().astype(wt)
    kk = np.repeat(k._host_view().astype(wt), H // Hk, axis=1)
    vv = np.repeat(v._host_view().astype(wt), H // Hk, axis=1)
    with np.errstate(all="ignore"):
        s = np.matmul(a, np.swapaxes(kk, -1, -2)) * wt(scale)
        if is_causal:
            s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
        if mask is not None:
            mh = mask._host_view()
            s = np.where(mh, s, -np.inf) if mask.dtype.kind == "b" else s + mh.astype(wt)
        out._host_view()[...] = np.matmul(_softmax_rows(s), vv).astype(out.dtype.np)
    return out


@register("decode_attention", "numpy")
def decode_attention(out, q, kc, vc, lengths, *, scale):
    from ...index_errors import lengths_err
    wt = _work(q)
    B, H, T, _ = q.shape
    Hk, C = kc.shape[1], kc.shape[2]
    lens = np.broadcast_to(_checked(lengths, 0, C + 1, False, lengths_err(C)), (B,))
    for b in range(B):
        n = int(lens[b])
        a = q._host_view()[b].astype(wt)
        kk = np.repeat(kc._host_view()[b, :, :n].astype(wt), H // Hk, axis=0)
        vv = np.repeat(vc._host_view()[b, :, :n].astype(wt), H // Hk, axis=0)
        with np.errstate(all="ignore"):
            s = np.matmul(a, np.swapaxes(kk, -1, -2)) * wt(scale)
            # query t is the token at position n - T + t: keys j <= n - T + t
            keep = np.arange(n)[None, :] <= (n - T + np.arange(T))[:, None]
            s = np.where(keep, s, -np.inf)
            out._host_view()[b] = np.matmul(_softmax_rows(s), vv).astype(out.dtype.np)
    return out


def _rotate(x, pos, inv, interleaved):
    """x (..., T, D) float array, pos (..., T) ints broadcastable; fp32 angles as the kernel."""
    ang = (pos.astype(np.float32)[..., None] * inv.astype(np.float32)).astype(np.float64)
    c, s = np.cos(ang), np.sin(ang)
    half = x.shape[-1] // 2
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x[..., :half], x[..., half:]
    y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s
    y = np.empty_like(x)
    if interleaved:
        y[..., 0::2], y[..., 1::2] = y1, y2
    else:
        y[..., :half], y[..., half:] = y1, y2
    return y


@register("rope", "numpy")
def rope(out, x, pos, inv, *, interleaved):
    """out, x: (B, H, T, D) views; pos (B, T)."""
    wt = _work(x)
    y = _rotate(x._host_view().astype(wt), pos._host_view()[:, None, :], inv._host_view(),
                interleaved)
    out._host_view()[...] = y.astype(out.dtype.np)
    return out


@register("kv_append", "numpy")
def kv_append(ck, cv, lengths, k, v, pos, q=None, inv=None, *, interleaved=False):
    """Write k/v (B, Hk, T, D) into caches (B, Hk, C, D) at pos (B, T); with `inv` rotate k
    (and q, in place) first. A position outside [0, C) raises IndexError before anything is
    written (the device skips it and raises from its flag). lengths[b] becomes pos[b, -1] + 1."""
    from ...index_errors import positions_err
    B, Hk, T, _ = k.shape
    C = ck.shape[2]
    p = _checked(pos, 0, C, False, positions_err(
        "KVCache.append_rope" if inv is not None else "KVCache.append", C))
    kh = k._host_view()
    if inv is not None:
        wt = _work(k)
        kh = _rotate(kh.astype(wt), p[:, None, :], inv._host_view(), interleaved)
        qv = q._host_view()
        qv[...] = _rotate(qv.astype(wt), p[:, None, :], inv._host_view(),
                          interleaved).astype(q.dtype.np)
    ckh, cvh, vh = ck._host_view(), cv._host_view(), v._host_view()
    for b in range(B):
        for t in range(T):
            if 0 <= p[b, t] < C:
                ckh[b, :, p[b, t]] = kh[b, :, t].astype(ck.dtype.np)
                cvh[b, :, p[b, t]] = vh[b, :, t]
    if lengths is not None and T:
        lh = lengths._host_view()
        if lh.ndim == 0:
            lh[...] = p[0, -1] + 1
        else:
            lh[...] = p[:, -1] + 1
