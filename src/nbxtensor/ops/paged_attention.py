"""paged_decode_attention: decode attention over a paged KV cache (kv_cache.PagedKVCache).

paged_decode_attention(query, cache_layer, block_tables, lengths, *, scale=None, out=None)
  * query (B, Hq, T, D): the T newest tokens, already appended at logical positions
    lengths[b]-T .. lengths[b]-1 (bottom-right causal, as decode_attention).
  * cache_layer = (k_pages, v_pages): (num_blocks, block_size, Hk, D) and (..., Dv), one
    layer's page pool (PagedKVCache.view(layer)[:2]).
  * block_tables: int32 (B, max_blocks) on the device; logical key j of sequence b is page
    block_tables[b, j // block_size], slot j % block_size. Entries past a sequence's length
    are never read (any value, -1 by convention).
  * lengths: int32/int64 (B,) or () on the device; capacity = max_blocks * block_size.
    A length outside [0, capacity], or a page id inside a length outside [0, num_blocks),
    raises IndexError (cpu: at the call; cuda/interp: through the index-error flag, with
    nothing outside the pool read).
The launch depends only on shapes, so a decode step over it stays CUDA-graph capturable.
"""
from __future__ import annotations

import math

from .. import dtypes as _dt
from ..dispatch import impl
from .attention import _check_float, _check_lengths, _check_t, _decode_out

__all__ = ["paged_decode_attention"]


def _check_tables(block_tables, B, dev, op):
    _check_t(block_tables, "block_tables", op)
    if block_tables.dtype is not _dt.int32 or block_tables.ndim != 2 \
            or block_tables.shape[0] != B or block_tables.shape[1] == 0:
        raise TypeError(f"{op}: block_tables must be an int32 tensor of shape ({B}, max_blocks) "
                        f"with max_blocks >= 1, got {block_tables.dtype.name} "
                        f"{tuple(block_tables.shape)}")
    if block_tables.device != dev:
        raise ValueError(f"{op}: block_tables is on {block_tables.device} but the input is on "
                         f"{dev}")
    if block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()
    return block_tables


def _check_pools(k, v, op):
    for n, t in (("k_pages", k), ("v_pages", v)):
        _check_float(t, n, op)
        if t.ndim != 4:
            raise ValueError(f"{op}: {n} must be 4-D (num_blocks, block_size, Hk, D), got "
                             f"shape {tuple(t.shape)}")
    if tuple(v.shape[:3]) != tuple(k.shape[:3]) or k.dtype != v.dtype or k.device != v.device:
        raise ValueError(f"{op}: v_pages must be {k.dtype.name} of shape {tuple(k.shape[:3])} + "
                         f"(Dv,) on {k.device}, got {v.dtype.name} {tuple(v.shape)} on "
                         f"{v.device}")


def paged_decode_attention(query, cache_layer, block_tables, lengths, *, scale=None, out=None):
    op = "paged_decode_attention"
    if not isinstance(cache_layer, (tuple, list)) or len(cache_layer) < 2:
        raise TypeError(f"{op}: cache_layer must be (k_pages, v_pages), got "
                        f"{type(cache_layer).__name__}")
    kc, vc = cache_layer[0], cache_layer[1]
    _check_float(query, "query", op)
    _check_pools(kc, vc, op)
    if query.ndim != 4:
        raise ValueError(f"{op}: query must be 4-D (B, Hq, T, D), got {tuple(query.shape)}")
    if query.dtype != kc.dtype:
        raise TypeError(f"{op}: query and pages must share one dtype, got {query.dtype.name} "
                        f"and {kc.dtype.name}")
    dev = query.device
    B, Hq, T, D = query.shape
    NB, PAGE, Hk, Dk = kc.shape
    if kc.device != dev:
        raise ValueError(f"{op}: the pages are on {kc.device} but query is on {dev}")
    if Dk != D:
        raise ValueError(f"{op}: the pages' head dim must be {D}, got {Dk}")
    if Hq % Hk:
        raise ValueError(f"{op}: query heads ({Hq}) must be a multiple of cache heads ({Hk})")
    block_tables = _check_tables(block_tables, B, dev, op)
    _check_t(lengths, "lengths", op)
    if lengths.device != dev:
        raise ValueError(f"{op}: lengths is on {lengths.device} but query is on {dev}")
    _check_lengths(lengths, B, op)
    C = block_tables.shape[1] * PAGE
    if T > C:
        raise ValueError(f"{op}: {T} query tokens do not fit a table of {C} slots")
    Dv = vc.shape[3]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = _decode_out(out, query, (B, Hq, T, Dv), op)
    if out.numel():
        impl("paged_decode_attention", dev)(out, query, kc, vc, block_tables, lengths,
                                            scale=scale)
    return out
