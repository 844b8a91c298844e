"""cpu: paged decode attention and the paged KV-cache write with NumPy (kernels/
paged_attention.py's contract): the pages of each sequence are gathered through its block
table into a contiguous (Hk, length, D) cache, then decode attention as attention.py."""
from __future__ import annotations

import numpy as np

from ...dispatch import register
from .attention import _softmax_rows, _work
from .indexing import _checked


def _page_err(op, NB):
    return (op, f"block_tables (the pool holds {NB} pages)", 0, NB)


def _check_pages(pages, NB, op):
    bad = (pages < 0) | (pages >= NB)
    if bad.any():
        from ...index_errors import oob_error
        raise oob_error(_page_err(op, NB), int(pages[bad].max()))


@register("paged_decode_attention", "numpy")
def paged_decode_attention(out, q, kc, vc, block_tables, lengths, *, scale):
    from ...index_errors import lengths_err
    wt = _work(q)
    B, H, T, _ = q.shape
    NB, PAGE, Hk, _ = kc.shape
    C = block_tables.shape[1] * PAGE
    lens = np.broadcast_to(_checked(lengths, 0, C + 1, False, lengths_err(C)), (B,))
    bt = block_tables._host_view().astype(np.int64)
    kh, vh = kc._host_view(), vc._host_view()
    for b in range(B):
        n = int(lens[b])
        j = np.arange(n)
        pages = bt[b, j // PAGE]
        _check_pages(pages, NB, "paged_decode_attention")
        kk = np.repeat(kh[pages, j % PAGE].astype(wt).transpose(1, 0, 2), H // Hk, axis=0)
        vv = np.repeat(vh[pages, j % PAGE].astype(wt).transpose(1, 0, 2), H // Hk, axis=0)
        a = q._host_view()[b].astype(wt)
        with np.errstate(all="ignore"):
            s = np.matmul(a, np.swapaxes(kk, -1, -2)) * wt(scale)
            keep = j[None, :] <= (n - T + np.arange(T))[:, None]
            s = np.where(keep, s, -np.inf)
            out._host_view()[b] = np.matmul(_softmax_rows(s), vv).astype(out.dtype.np)
    return out


@register("paged_kv_append", "numpy")
def paged_kv_append(ck, cv, block_tables, lengths, k, v, pos):
    """Positions and their pages are checked before anything is written (the device skips
    a bad token and raises from its flag); lengths[b] becomes pos[b, -1] + 1."""
    from ...index_errors import positions_err
    B, Hk, T, _ = k.shape
    NB, PAGE = ck.shape[0], ck.shape[1]
    C = block_tables.shape[1] * PAGE
    p = _checked(pos, 0, C, False, positions_err("PagedKVCache.append", C))
    bt = block_tables._host_view().astype(np.int64)
    pages = np.take_along_axis(bt, p // PAGE, axis=1)                    # (B, T)
    _check_pages(pages, NB, "PagedKVCache.append")
    ckh, cvh, kh, vh = ck._host_view(), cv._host_view(), k._host_view(), v._host_view()
    for b in range(B):
        for t in range(T):
            ckh[pages[b, t], p[b, t] % PAGE] = kh[b, :, t]
            cvh[pages[b, t], p[b, t] % PAGE] = vh[b, :, t]
    if T:
        lengths._host_view()[...] = p[:, -1] + 1
