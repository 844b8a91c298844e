"""cpu: mixture-of-experts with NumPy, the contract of kernels/moe.py.

Router scores and selection in float64 (weights returned as float32); the expert MLPs in
float32 for 16-bit and float32 inputs (float64 for float64), with the intermediate
activation rounded to the input dtype between the two GEMMs as the GPU path stores it.
Ties go to the lowest expert index; NaN selection scores count as -inf."""
from __future__ import annotations

import numpy as np

from ...dispatch import register


@register("moe_topk", "numpy")
def moe_topk(weights, ids, gating, topk, renormalize, sigmoid, num_groups, topk_group, bias,
             scale):
    M, E = gating.shape
    if M == 0:
        return weights, ids
    x = gating.numpy().astype(np.float64)
    if sigmoid:
        s = 1.0 / (1.0 + np.exp(-x))
    else:
        z = np.exp(x - x.max(axis=1, keepdims=True))
        s = z / z.sum(axis=1, keepdims=True)
    sel = s + bias.numpy().astype(np.float64)[None, :] if bias is not None else s.copy()
    sel[np.isnan(sel)] = -np.inf
    if num_groups > 1:
        g = sel.reshape(M, num_groups, E // num_groups)
        if bias is not None:       # the sum of each group's two best
            top2 = -np.sort(-g, axis=2, kind="stable")[:, :, :2]
            gs = top2.sum(axis=2)
        else:
            gs = g.max(axis=2)
        gs[np.isnan(gs)] = -np.inf
        keep = np.argsort(-gs, axis=1, kind="stable")[:, :topk_group]
        mask = np.zeros((M, num_groups), bool)
        np.put_along_axis(mask, keep, True, axis=1)
        sel = np.where(np.repeat(mask, E // num_groups, axis=1), sel, -np.inf)
        # a masked expert must lose to every kept one, even a kept -inf: rank by (kept, score)
        order = np.lexsort((np.arange(E)[None, :].repeat(M, 0), -sel,
                            ~np.repeat(mask, E // num_groups, axis=1)), axis=1)
    else:
        order = np.argsort(-sel, axis=1, kind="stable")
    idx = order[:, :topk]
    w = np.take_along_axis(s, idx, axis=1)
    if renormalize:
        w = w / w.sum(axis=1, keepdims=True)
    weights.numpy()[...] = (w * scale).astype(np.float32)
    ids.numpy()[...] = idx.astype(np.int32)
    return weights, ids


def align(ids: np.ndarray, block_size: int, num_experts: int, n_sorted: int, n_blocks: int):
    """vLLM's moe_align_block_size on host arrays (ids outside [0, E) dropped)."""
    flat = ids.reshape(-1).astype(np.int64)
    numel = flat.size
    sorted_ids = np.full(n_sorted, numel, np.int32)
    eids = np.full(n_blocks, -1, np.int32)
    off = 0
    for e in range(num_experts):
        slots = np.nonzero(flat == e)[0]
        padded = -(-slots.size // block_size) * block_size
        sorted_ids[off:off + slots.size] = slots
        eids[off // block_size:(off + padded) // block_size] = e
        off += padded
    return sorted_ids, eids, off


@register("moe_align_block_size", "numpy")
def moe_align_block_size(sorted_ids, expert_ids, ntpp, topk_ids, block_size, num_experts):
    s, e, total = align(topk_ids.numpy(), block_size, num_experts, sorted_ids.numel(),
                        expert_ids.numel())
    sorted_ids.numpy()[...] = s
    expert_ids.numpy()[...] = e
    ntpp.numpy()[...] = total
    return sorted_ids, expert_ids, ntpp


def _erf(x):
    from math import erf
    return np.vectorize(erf, otypes=[x.dtype])(x) if x.size else x


def _act(g, act):
    if act == 0:
        return g / (1.0 + np.exp(-g))
    return 0.5 * g * (1.0 + _erf(g * 0.7071067811865476))


@register("fused_experts", "numpy")
def fused_experts(out, x, w1, w2, topk_weights, topk_ids, act):
    M, H = x.shape
    E, I2, _ = w1.shape
    I = I2 // 2
    cdt = np.float64 if x.dtype.np == np.float64 else np.float32
    xa = x.numpy().astype(cdt)
    ids = topk_ids.numpy().astype(np.int64)
    tw = topk_weights.numpy().astype(cdt)
    topk = ids.shape[1]
    down = np.zeros((M, topk, H), cdt)
    for e in range(E):
        tok, slot = np.nonzero(ids == e)
        if tok.size == 0:
            continue
        w1e = w1[e].numpy().astype(cdt)
        gu = xa[tok] @ w1e.T
        h = (_act(gu[:, :I], act) * gu[:, I:]).astype(x.dtype.np).astype(cdt)
        down[tok, slot] = (h @ w2[e].numpy().astype(cdt).T) * tw[tok, slot][:, None]
    acc = np.zeros((M, H), cdt)
    for j in range(topk):      # slot order, as the GPU reduction
        acc += down[:, j]
    out.numpy()[...] = acc.astype(out.dtype.np)
    return out
