"""cpu: token sampling with NumPy, the same contract as kernels/sampling.py (thresholds,
penalty, greedy ties). The random stream differs from the GPU's: a call with generator
state (seed, step) draws u = np.random.default_rng([seed, step]).random((B, V)) (float64)
and takes argmax(z + g), g = -log(-log(u)), over the kept tokens; step then advances by 1."""
from __future__ import annotations

import numpy as np

from ...dispatch import register


def _keep_mask(z, top_k, top_p):
    """z: (V,) float64 of one row. Thresholds by value, ties at the boundary kept."""
    keep = np.ones(z.shape, bool)
    if top_k is not None and top_k < z.size:
        kth = np.sort(z)[::-1][top_k - 1]
        keep &= z >= kth
    if top_p is not None and top_p < 1.0:
        m = z[keep].max()
        w = np.where(keep, np.exp(z - m), 0.0)
        target = top_p * w.sum()
        vals, inv = np.unique(z[keep], return_inverse=True)   # ascending
        # mass strictly above each candidate value: a suffix sum of the per-value masses
        per_val = np.bincount(inv.reshape(-1), weights=w[keep], minlength=vals.size)
        above = np.concatenate([np.cumsum(per_val[::-1])[::-1][1:], [0.0]])
        v_star = vals[np.nonzero(above < target)[0][0]]
        keep &= z >= v_star
    return keep


@register("sample", "numpy")
def sample(out, logits, state, *, temperature, top_k, top_p, penalty, previous):
    x = logits._host_view().astype(np.float32).astype(np.float64)
    B, V = x.shape
    if penalty is not None:
        prev = previous._host_view().astype(np.int64)
        for b in range(B):
            tok = prev[b][(prev[b] >= 0) & (prev[b] < V)]
            sc = x[b, tok]
            x[b, tok] = np.where(sc > 0, sc / penalty, sc * penalty)
    o = out._host_view()
    if temperature == 0:
        o[...] = np.argmax(x, axis=1)               # first index on ties, as torch
        return out
    st = state._host_view()
    u = np.random.default_rng([int(st[0]), int(st[1])]).random((B, V))
    st[1] += 1
    with np.errstate(all="ignore"):
        g = -np.log(-np.log(np.where(u == 0, np.finfo(np.float64).tiny, u)))
        for b in range(B):
            z = x[b] / temperature
            keep = _keep_mask(z, top_k, top_p)
            o[b] = np.argmax(np.where(keep, z + g[b], -np.inf))
    return out
