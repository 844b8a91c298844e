"""The ops as the models call them: the public ops, with the models' conventions.

Every function here is a public op (nbx.linear, nbx.rms_norm, ...) or the decode family
(ops/decode.py), so the models run whatever the library runs on their device; the only
decisions made here are the models' own: a weight may be a GGML-quantised `QuantWeight`
(its ops then take the quantised kernels), norms normalise over the last dim, attention
takes a query offset and a key padding mask.
"""
from __future__ import annotations

import numpy as np

import nbxtensor as nbx
from ..ops.decode import (QuantWeight, commit_tokens, decode_linear,  # noqa: F401 - the models'
                          decode_qkv_rope, greedy_commit, quant_embedding, quant_linear)


# ------------------------------------------------------------------------ linear algebra
def linear(x, w, b=None):
    """x @ w.T (+ b); w is (out, in) or a QuantWeight."""
    if isinstance(w, QuantWeight):
        return quant_linear(x, w, b)
    return nbx.linear(x, w, b)


def add(a, b):
    return nbx.add(a, b)


def mul(a, b):
    return nbx.mul(a, b)


# ------------------------------------------------------------------------ normalisation
def rms_norm(x, w, eps):
    return nbx.rms_norm(x, (x.shape[-1],), w, eps)


def layer_norm(x, w, b, eps):
    return nbx.layer_norm(x, (x.shape[-1],), w, b, eps)


# ------------------------------------------------------------------------ activations
def silu_mul(gate, up):
    """silu(gate) * up (SwiGLU)."""
    return nbx.mul(nbx.silu(gate), up)


def gelu(x):
    """Exact (erf) GELU, as BERT's 'gelu'."""
    return nbx.gelu(x)


# ------------------------------------------------------------------------ lookups
def embedding(ids, w):
    """Rows of `w` (a Tensor or QuantWeight) at integer `ids` (a Tensor)."""
    if isinstance(w, QuantWeight):
        return quant_embedding(ids, w)
    return nbx.embedding(ids, w)


# ------------------------------------------------------------------------ RoPE + attention
def rope(x, cos, sin):
    """HF rotate_half RoPE. x: (B, H, T, D); cos, sin: (T, D) -- computed in float32."""
    h = x.shape[-1] // 2
    xf = x.to(nbx.float32)
    rot = nbx.cat([nbx.neg(xf[..., h:]), xf[..., :h]], dim=-1)
    return nbx.add(nbx.mul(xf, cos), nbx.mul(rot, sin)).to(x.dtype)


def attention(q, k, v, *, causal: bool, q_offset: int = 0, key_mask=None):
    """Softmax attention with GQA. q: (B, Hq, T, D); k, v: (B, Hkv, S, D).

    causal: query i (absolute position q_offset + i) sees keys 0..q_offset+i.
    key_mask: optional (B, S) bool, False = padding (never attended).
    """
    B, Hq, T, _ = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    mask = None
    if causal and q_offset:     # built on the host: one upload instead of three kernels
        allowed = np.arange(S)[None, :] <= (np.arange(T) + q_offset)[:, None]
        mask = nbx.tensor(allowed, device=q.device)
    if key_mask is not None:
        km = key_mask.reshape(B, 1, 1, S)
        mask = km if mask is None else nbx.logical_and(mask, km)
    return nbx.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                            is_causal=causal and not q_offset,
                                            enable_gqa=Hq != Hkv)


def mean_pool_normalize(x, mask):
    """sentence-transformers pooling: mean over unmasked tokens, then L2 normalisation, in
    float32. x: (B, T, D); mask: (B, T) bool. Returns (B, D) float32."""
    xf = x.to(nbx.float32)
    mf = mask.to(nbx.float32).unsqueeze(-1)                       # (B, T, 1)
    pooled = nbx.div(nbx.mul(xf, mf).sum(1), nbx.clamp(mf.sum(1), min=1e-9))
    norm = nbx.clamp(nbx.sqrt(nbx.mul(pooled, pooled).sum(-1, keepdim=True)), min=1e-12)
    return nbx.div(pooled, norm)
