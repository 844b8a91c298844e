"""Attention ops: scaled_dot_product_attention (torch's), decode_attention over a KV cache,
rotary embeddings, and (re-exported from ops/sampling.py) device-side sampling.

scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                             is_causal=False, scale=None, enable_gqa=False)
  * query (B, Hq, L, E), key (B, Hk, S, E), value (B, Hk, S, Ev) -- or 3-D (H, L, E), taken
    as B = 1. One float dtype for all three. Arbitrary strides (a (B, L, H, D) buffer viewed
    as (B, H, L, D) needs no copy). Batch sizes must be equal (no broadcasting of B).
  * Hq != Hk needs enable_gqa=True and Hq % Hk == 0 (query head h uses kv head h // (Hq/Hk)).
  * attn_mask: bool (True = attend) or a float tensor of the query's dtype added to the
    scores; broadcastable to (B, Hq, L, S). Not together with is_causal (torch refuses too).
  * is_causal: query i attends keys j <= i (torch's top-left aligned tril when L != S).
  * scale: default 1/sqrt(E).  dropout_p must be 0 (inference library).
  * A row whose keys are all masked out (bool mask all False, or additive mask all -inf)
    gives 0, as torch >= 2.5 (its math path uses `_safe_softmax`). S == 0 gives 0 too.

decode_attention(query, k_cache, v_cache, lengths, *, scale=None) -- flash-decoding for the
  decode step: query (B, Hq, T, D) are the T newest tokens, already written to the cache at
  positions lengths[b]-T .. lengths[b]-1; caches (B, Hk, capacity, D); `lengths` a device
  int32/int64 tensor of shape () or (B,). Query token t attends keys j <= lengths[b]-T+t
  (bottom-right causal). The launch depends only on shapes and capacity, never on the value
  of `lengths`, so one launch can be captured in a CUDA graph and replayed every step.
  A length outside [0, capacity] raises IndexError (cpu: at the call; cuda/interp: through
  the index-error flag, as out-of-range indices, with at most `capacity` keys read).

apply_rotary_emb(x, positions, *, theta=10000.0, interleaved=False, scaling=None, out=None,
                 seq_dim=-2) -- rotary embedding of x (B, H, T, D) (seq_dim=-2, HF layout) or
  (B, T, H, D) (seq_dim=-3 / 1). positions: int tensor (T,) or (B, T) on x's device. HF
  `rotate_half` pairs (i, i + D/2); interleaved=True pairs (2i, 2i+1) (GPT-J / GGUF).
  scaling: None or a Llama-3 dict {"rope_type": "llama3", "factor", "low_freq_factor",
  "high_freq_factor", "original_max_position_embeddings"}. out=x rotates in place.
  Angles are fp32 (inverse frequencies computed in float64, rounded once), as HF.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import dtypes as _dt
from .. import plans as _plans
from ..dispatch import impl
from ..index_errors import lengths_err as _lengths_err, positions_err as _positions_err  # noqa: F401
from ..tensor import Tensor
from .sampling import Generator, sample  # noqa: F401 - exported from this family

__all__ = ["scaled_dot_product_attention", "decode_attention", "apply_rotary_emb",
           "rope_inv_freq", "KVCache", "Generator", "sample"]

_FLOATS = (_dt.float16, _dt.bfloat16, _dt.float32, _dt.float64)


def _check_t(x, name, op):
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: {name} must be a Tensor, got {type(x).__name__}")
    return x


def _check_float(x, name, op):
    _check_t(x, name, op)
    if x.dtype not in _FLOATS:
        raise TypeError(f"{op}: {name} must be float16, bfloat16, float32 or float64, "
                        f"got {x.dtype.name}")
    return x


def _as4d(x):
    return x.unsqueeze(0) if x.ndim == 3 else x


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    op = "scaled_dot_product_attention"
    for n, t in (("query", query), ("key", key), ("value", value)):
        _check_float(t, n, op)
        if t.ndim not in (3, 4):
            raise ValueError(f"{op}: {n} must be 3-D (H, L, E) or 4-D (B, H, L, E), got shape "
                             f"{tuple(t.shape)}")
    if not (query.ndim == key.ndim == value.ndim):
        raise ValueError(f"{op}: query, key and value must have the same number of dims, got "
                         f"{query.ndim}, {key.ndim}, {value.ndim}")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"{op}: query, key and value must share one dtype, got "
                        f"{query.dtype.name}, {key.dtype.name}, {value.dtype.name}")
    dev = query.device
    for n, t in (("key", key), ("value", value)):
        if t.device != dev:
            raise ValueError(f"{op}: {n} is on {t.device} but query is on {dev}")
    if dropout_p != 0.0:
        raise NotImplementedError(f"{op}: dropout_p must be 0.0 (nbxtensor is inference-only), "
                                  f"got {dropout_p!r}")
    three = query.ndim == 3
    q, k, v = _as4d(query), _as4d(key), _as4d(value)
    B, Hq, L, E = q.shape
    Bk, Hk, S, Ek = k.shape
    Bv, Hv, Sv, Ev = v.shape
    if Bk != B or Bv != B:
        raise ValueError(f"{op}: batch sizes must match, got query {B}, key {Bk}, value {Bv}")
    if Ek != E:
        raise ValueError(f"{op}: key's last dim must equal query's ({E}), got {Ek}")
    if (Hv, Sv) != (Hk, S):
        raise ValueError(f"{op}: value must have key's heads and length {(Hk, S)}, got {(Hv, Sv)}")
    if Hq != Hk:
        if not enable_gqa:
            raise ValueError(f"{op}: query has {Hq} heads but key/value have {Hk}; pass "
                             f"enable_gqa=True for grouped-query attention")
        if Hk == 0 or Hq % Hk:
            raise ValueError(f"{op}: with enable_gqa the query heads ({Hq}) must be a multiple "
                             f"of the key/value heads ({Hk})")
    if scale is None:
        scale = 1.0 / math.sqrt(E) if E > 0 else 1.0
    elif not isinstance(scale, numbers.Real) or isinstance(scale, bool):
        raise TypeError(f"{op}: scale must be a float or None, got {type(scale).__name__}")
    scale = float(scale)
    mask = None
    if attn_mask is not None:
        _check_t(attn_mask, "attn_mask", op)
        if is_causal:
            raise ValueError(f"{op}: pass either attn_mask or is_causal=True, not both")
        if attn_mask.device != dev:
            raise ValueError(f"{op}: attn_mask is on {attn_mask.device} but query is on {dev}")
        if attn_mask.dtype is not _dt.bool and attn_mask.dtype != query.dtype:
            raise TypeError(f"{op}: attn_mask must be bool or the query's dtype "
                            f"({query.dtype.name}), got {attn_mask.dtype.name}")
        try:
            mask = (attn_mask.expand(Hq, L, S).unsqueeze(0) if three
                    else attn_mask.expand(B, Hq, L, S))
        except (ValueError, RuntimeError, TypeError):
            mask = None
        if mask is None:
            want = (Hq, L, S) if three else (B, Hq, L, S)
            raise ValueError(f"{op}: attn_mask of shape {tuple(attn_mask.shape)} does not "
                             f"broadcast to {want}")
    out = Tensor._empty((B, Hq, L, Ev), query.dtype, dev)
    if out.numel():
        if S == 0:
            out.fill_(0)
        else:
            impl("sdpa", dev)(out, q, k, v, mask, scale=scale, is_causal=bool(is_causal))
    return out[0] if three else out


def _check_lengths(lengths, B, op):
    """A decode attention's lengths: int32/int64, one for all B sequences or one each."""
    if lengths.dtype not in (_dt.int32, _dt.int64) or tuple(lengths.shape) not in ((), (B,)):
        raise TypeError(f"{op}: lengths must be an int32/int64 tensor of shape () or ({B},), "
                        f"got {lengths.dtype.name} {tuple(lengths.shape)}")


def _decode_out(out, query, shape, op):
    """A decode attention's output (B, Hq, T, Dv) of query's dtype and device: a new tensor,
    or the caller's `out` when it is exactly that."""
    dev = query.device
    if out is None:
        return Tensor._empty(shape, query.dtype, dev)
    if tuple(out.shape) != shape or out.dtype != query.dtype or out.device != dev:
        raise ValueError(f"{op}: out must be {query.dtype.name} {shape} on {dev}, got "
                         f"{out.dtype.name} {tuple(out.shape)} on {out.device}")
    return out


def decode_attention(query, k_cache, v_cache, lengths, *, scale=None, out=None):
    op = "decode_attention"
    for n, t in (("query", query), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_float(t, n, op)
        if t.ndim != 4:
            raise ValueError(f"{op}: {n} must be 4-D, got shape {tuple(t.shape)}")
    if not (query.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(f"{op}: query and caches must share one dtype, got {query.dtype.name}, "
                        f"{k_cache.dtype.name}, {v_cache.dtype.name}")
    _check_t(lengths, "lengths", op)
    dev = query.device
    for n, t in (("k_cache", k_cache), ("v_cache", v_cache), ("lengths", lengths)):
        if t.device != dev:
            raise ValueError(f"{op}: {n} is on {t.device} but query is on {dev}")
    B, Hq, T, D = query.shape
    if k_cache.shape[0] != B:
        raise ValueError(f"{op}: k_cache batch must be {B}, got shape {tuple(k_cache.shape)}")
    _, Hk, C, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"{op}: k_cache head dim must be {D}, got {Dk}")
    if tuple(v_cache.shape[:3]) != (B, Hk, C):
        raise ValueError(f"{op}: v_cache must have shape ({B}, {Hk}, {C}, Dv), got "
                         f"{tuple(v_cache.shape)}")
    Dv = v_cache.shape[3]
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"{op}: query heads ({Hq}) must be a multiple of cache heads ({Hk})")
    _check_lengths(lengths, B, op)
    if T > C:
        raise ValueError(f"{op}: {T} query tokens do not fit a cache of capacity {C}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = _decode_out(out, query, (B, Hq, T, Dv), op)
    if out.numel():
        impl("decode_attention", dev)(out, query, k_cache, v_cache, lengths, scale=scale)
    return out


# --------------------------------------------------------------------------- RoPE

def _scaling_key(scaling):
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise TypeError(f"rope: scaling must be None or a dict, got {type(scaling).__name__}")
    kind = scaling.get("rope_type", scaling.get("type", "llama3"))
    if kind != "llama3":
        raise NotImplementedError(f"rope: scaling rope_type {kind!r} is not supported "
                                  f"(only 'llama3')")
    try:
        return (float(scaling["factor"]), float(scaling["low_freq_factor"]),
                float(scaling["high_freq_factor"]),
                float(scaling["original_max_position_embeddings"]))
    except KeyError as e:
        raise ValueError(f"rope: llama3 scaling needs {e.args[0]!r}; got keys "
                         f"{sorted(scaling)}") from None


def rope_inv_freq(head_dim, theta=10000.0, scaling=None):
    """The D/2 inverse frequencies as float64 NumPy (Llama-3 scaling applied when given)."""
    return _inv_freq(head_dim, float(theta), _scaling_key(scaling))


def _inv_freq(head_dim, theta, key):
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rope: head_dim must be a positive even number, got {head_dim}")
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if key is not None:
        factor, lo_f, hi_f, old = key
        lo_wl, hi_wl = old / lo_f, old / hi_f
        wl = 2 * math.pi / inv
        scaled = np.where(wl > lo_wl, inv / factor, inv)
        smooth = (old / wl - lo_f) / (hi_f - lo_f)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wl < hi_wl) & ~(wl > lo_wl)
        inv = np.where(medium, smoothed, scaled)
    return inv


def _inv_freq_tensor(head_dim, theta, scaling, device):
    return _inv_freq_on(head_dim, float(theta), _scaling_key(scaling), str(device))


# the float32 table on a device, per (head_dim, theta, scaling, device): a few per model
@_plans.memoize("ops.attention.rope_inv_freq", 256)
def _inv_freq_on(head_dim, theta, scaling_key, device):
    from ..creation import tensor
    return tensor(_inv_freq(head_dim, theta, scaling_key).astype(np.float32), device=device)


def _check_positions(positions, B, T, dev, op):
    _check_t(positions, "positions", op)
    if positions.device != dev:
        raise ValueError(f"{op}: positions is on {positions.device} but the input is on {dev}")
    if positions.dtype not in (_dt.int32, _dt.int64):
        raise TypeError(f"{op}: positions must be int32 or int64, got {positions.dtype.name}")
    if tuple(positions.shape) == (T,):
        return positions.unsqueeze(0).expand(B, T)
    if tuple(positions.shape) == (B, T):
        return positions
    raise ValueError(f"{op}: positions must have shape ({T},) or ({B}, {T}), got "
                     f"{tuple(positions.shape)}")


def _rope_layout(x, seq_dim, op):
    if x.ndim != 4:
        raise ValueError(f"{op}: x must be 4-D, got shape {tuple(x.shape)}")
    sd = seq_dim + 4 if seq_dim < 0 else seq_dim
    if sd not in (1, 2):
        raise ValueError(f"{op}: seq_dim must be 1/-3 ((B, T, H, D)) or 2/-2 ((B, H, T, D)), "
                         f"got {seq_dim}")
    return x if sd == 2 else x.transpose(1, 2)     # -> a (B, H, T, D) view


def apply_rotary_emb(x, positions, *, theta=10000.0, interleaved=False, scaling=None, out=None,
                     seq_dim=-2):
    op = "apply_rotary_emb"
    _check_float(x, "x", op)
    xv = _rope_layout(x, seq_dim, op)
    B, H, T, D = xv.shape
    if D % 2:
        raise ValueError(f"{op}: the head dim must be even, got {D}")
    pos = _check_positions(positions, B, T, x.device, op)
    if out is None:
        out = Tensor._empty(tuple(x.shape), x.dtype, x.device)
    elif (not isinstance(out, Tensor) or tuple(out.shape) != tuple(x.shape)
          or out.dtype != x.dtype or out.device != x.device):
        raise ValueError(f"{op}: out must be a {x.dtype.name} tensor of shape {tuple(x.shape)} on "
                         f"{x.device}")
    ov = _rope_layout(out, seq_dim, op)
    if out.numel():
        inv = _inv_freq_tensor(D, theta, scaling, x.device)
        impl("rope", x.device)(ov, xv, pos, inv, interleaved=bool(interleaved))
    return out


from ..kv_cache import KVCache  # noqa: E402 - uses the helpers above
