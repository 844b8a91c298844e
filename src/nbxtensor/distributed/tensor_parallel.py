"""Tensor parallelism (Megatron-style) on the default process group.

* `ColumnParallelLinear` -- this rank holds rows [r*N/w, (r+1)*N/w) of the (N, K) weight: its
  output is this rank's slice of the features (or, with gather_output, all of them).
* `RowParallelLinear` -- this rank holds columns [r*K/w, ...) and takes the matching slice
  of the input; the partial products are summed by one all_reduce (bias added once, after).
* `head_shards` -- which attention heads and KV heads a rank keeps: KV heads divided by the
  world size, or (fewer KV heads than ranks) each replicated on world/num_kv_heads ranks;
  a rank's query heads always belong to its KV heads.
* `shard_llama(model)` -- a `TensorParallelLlama` holding this rank's shard of a loaded
  LlamaModel: Q/K/V and gate/up by column, o_proj and down_proj by row, the KV cache by KV
  head, the lm_head by vocabulary rows (when the vocabulary divides; else replicated).
  One all_reduce per block half; rank 0 folds the residual into its partial sum, so the
  reduced value is the new residual stream. The eager `forward` and the capturable
  `decode_step`/`prefill` both run sharded; the single-GPU LlamaModel is not changed.
"""
from __future__ import annotations

import dataclasses

import nbxtensor as nbx
from ..models import _ops as O
from ..models.llama import LlamaModel
from ..tensor import Tensor
from . import all_gather_into_tensor, all_reduce, get_rank, get_world_size

__all__ = ["shard_range", "shard_rows", "shard_cols", "ColumnParallelLinear",
           "RowParallelLinear", "HeadShard", "head_shards", "shard_llama", "TensorParallelLlama"]


def _rank_world(rank, world_size):
    return (get_rank() if rank is None else rank), (get_world_size() if world_size is None
                                                      else world_size)


def shard_range(n: int, rank: int, world_size: int, what: str) -> tuple[int, int]:
    """[a, b) of rank's equal share of n; ValueError naming `what` when n does not divide."""
    if n % world_size:
        raise ValueError(f"tensor parallel: {what} {n} is not divisible by the world size "
                         f"{world_size}")
    k = n // world_size
    return rank * k, (rank + 1) * k


def _own(t, device):
    """A contiguous copy of view `t` on `device` (a shard must not keep the full weight alive)."""
    if device is not None and t.device != device:
        return t.contiguous().to(device)
    c = t.contiguous()
    return c.clone() if c.untyped_storage() is t.untyped_storage() else c


def _plain(w, what):
    if not isinstance(w, Tensor):
        raise NotImplementedError(f"tensor parallel: {what} is a {type(w).__name__}; only plain "
                                  f"tensor weights are sharded (quantised layers are not yet)")
    return w


def shard_rows(w, rank, world_size, what="weight", device=None):
    """Rows [r*N/w, (r+1)*N/w) of `w` (N, ...) as this rank's own tensor."""
    _plain(w, what)
    a, b = shard_range(w.shape[0], rank, world_size, f"{what} rows")
    return _own(w[a:b], device)


def shard_cols(w, rank, world_size, what="weight", device=None):
    """Columns [r*K/w, (r+1)*K/w) of `w` (N, K) as this rank's own tensor."""
    _plain(w, what)
    a, b = shard_range(w.shape[1], rank, world_size, f"{what} columns")
    return _own(w[:, a:b], device)


def _gather_last(y, world_size):
    """(…, n) per rank -> (…, world*n), rank blocks in order along the last dim."""
    y = y.contiguous()
    buf = nbx.empty((world_size,) + tuple(y.shape), dtype=y.dtype, device=y.device)
    all_gather_into_tensor(buf, y)
    nd = y.ndim
    return buf.permute(*range(1, nd), 0, nd).reshape(*y.shape[:-1], world_size * y.shape[-1])


class ColumnParallelLinear:
    """y = x @ W.T (+ b) with W's output features split over the ranks.

    Built from the full weight (N, K) (and bias (N,)); keeps this rank's rows. Returns the
    local (…, N/w) slice, or with gather_output=True the full (…, N) on every rank."""

    def __init__(self, weight, bias=None, *, rank=None, world_size=None, gather_output=False,
                 device=None):
        self.rank, self.world_size = _rank_world(rank, world_size)
        self.weight = shard_rows(weight, self.rank, self.world_size, "weight", device)
        self.bias = None if bias is None else shard_rows(bias, self.rank, self.world_size,
                                                         "bias", device)
        self.gather_output = gather_output

    def __call__(self, x):
        y = nbx.linear(x, self.weight, self.bias)
        return _gather_last(y, self.world_size) if self.gather_output else y


class RowParallelLinear:
    """y = x @ W.T (+ b) with W's input features split over the ranks: one all_reduce.

    Built from the full weight (N, K); keeps this rank's columns. With input_is_parallel
    (default) x is already this rank's (…, K/w) slice (a ColumnParallelLinear's output);
    else x is the full (…, K) and is sliced here."""

    def __init__(self, weight, bias=None, *, rank=None, world_size=None, input_is_parallel=True,
                 device=None):
        self.rank, self.world_size = _rank_world(rank, world_size)
        self.in_features = weight.shape[1]
        self.weight = shard_cols(weight, self.rank, self.world_size, "weight", device)
        self.bias = None if bias is None else _own(bias, device)
        self.input_is_parallel = input_is_parallel

    def __call__(self, x):
        if not self.input_is_parallel:
            if x.shape[-1] != self.in_features:
                raise ValueError(f"RowParallelLinear: x has {x.shape[-1]} features, the weight "
                                 f"{self.in_features}")
            a, b = shard_range(self.in_features, self.rank, self.world_size, "in_features")
            x = x[..., a:b].contiguous()
        y = nbx.linear(x, self.weight)
        all_reduce(y)
        return y if self.bias is None else y + self.bias


@dataclasses.dataclass(frozen=True)
class HeadShard:
    q: tuple        # [a, b) of the query heads this rank keeps
    kv: tuple       # [a, b) of the KV heads this rank keeps


def head_shards(num_heads: int, num_kv_heads: int, rank: int, world_size: int) -> HeadShard:
    """The query and KV heads of `rank` (GQA: KV heads split, or replicated when fewer)."""
    q = shard_range(num_heads, rank, world_size, "num_attention_heads")
    if num_kv_heads >= world_size:
        return HeadShard(q, shard_range(num_kv_heads, rank, world_size, "num_key_value_heads"))
    if world_size % num_kv_heads:
        raise ValueError(f"tensor parallel: num_key_value_heads {num_kv_heads} is fewer than the "
                         f"world size {world_size} and does not divide it (each KV head must be "
                         f"replicated on the same number of ranks)")
    kv = rank // (world_size // num_kv_heads)
    return HeadShard(q, (kv, kv + 1))


# ----------------------------------------------------------------------------- Llama
def shard_llama(model: LlamaModel, rank=None, world_size=None, device=None) -> "TensorParallelLlama":
    """This rank's shard of `model` on `device` (default: the process group's device, or the
    model's). Load the model on the cpu first to keep the full weights off the GPUs."""
    from ..device import as_device
    from . import get_device, is_initialized
    rank, world = _rank_world(rank, world_size)
    if type(model) is not LlamaModel:
        raise NotImplementedError(f"shard_llama: takes a LlamaModel, got {type(model).__name__} "
                                  f"(its _mlp may differ)")
    device = as_device(device if device is not None else
                       get_device() if is_initialized() else model.device)
    cfg = model.cfg
    D = cfg.head_dim
    hs = head_shards(cfg.num_attention_heads, cfg.num_key_value_heads, rank, world)
    fa, fb = shard_range(cfg.intermediate_size, rank, world, "intermediate_size")
    (qa, qb), (ka, kb) = hs.q, hs.kv

    def rows(w, a, b, what):
        return _own(_plain(w, what)[a:b], device)

    def cols(w, a, b, what):
        return _own(_plain(w, what)[:, a:b], device)
    layers = []
    for i, L in enumerate(model.w["layers"]):
        p = f"layers[{i}]"
        S = {"attn_norm": _own(L["attn_norm"], device), "ffn_norm": _own(L["ffn_norm"], device),
             "wq": rows(L["wq"], qa * D, qb * D, p + ".wq"),
             "wk": rows(L["wk"], ka * D, kb * D, p + ".wk"),
             "wv": rows(L["wv"], ka * D, kb * D, p + ".wv"),
             "wo": cols(L["wo"], qa * D, qb * D, p + ".wo"),
             "w_gate": rows(L["w_gate"], fa, fb, p + ".w_gate"),
             "w_up": rows(L["w_up"], fa, fb, p + ".w_up"),
             "w_down": cols(L["w_down"], fa, fb, p + ".w_down")}
        if L.get("bq") is not None:
            S["bq"] = rows(L["bq"], qa * D, qb * D, p + ".bq")
            S["bk"] = rows(L["bk"], ka * D, kb * D, p + ".bk")
            S["bv"] = rows(L["bv"], ka * D, kb * D, p + ".bv")
        if L.get("q_norm") is not None:
            if L["q_norm"].shape[0] != D or L["k_norm"].shape[0] != D:
                raise NotImplementedError(f"shard_llama: {p} normalises q/k over the whole "
                                          f"projection; only per-head q/k norms are sharded")
            S["q_norm"], S["k_norm"] = _own(L["q_norm"], device), _own(L["k_norm"], device)
        unknown = set(L) - set(S) - {"wqkv", "bqkv", "w_gateup", "bq", "bk", "bv"}
        if unknown:
            raise NotImplementedError(f"shard_llama: {p} has weights {sorted(unknown)} that "
                                      f"tensor parallelism does not know how to shard")
        layers.append(S)
    head = _plain(model.w["lm_head"], "lm_head")
    vocab_parallel = head.shape[0] % world == 0
    if vocab_parallel:
        va, vb = shard_range(head.shape[0], rank, world, "vocab")
        head = rows(head, va, vb, "lm_head")
    else:
        head = _own(head, device)
    w = {"embed": _own(model.w["embed"], device), "norm": _own(model.w["norm"], device),
         "lm_head": head, "layers": layers}
    local = dataclasses.replace(cfg, num_attention_heads=qb - qa, num_key_value_heads=kb - ka,
                                intermediate_size=fb - fa)
    return TensorParallelLlama(local, w, model, device, rank, world, vocab_parallel)


class TensorParallelLlama(LlamaModel):
    """One rank's shard of a Llama model (made by `shard_llama`). `cfg` has this rank's head
    and feed-forward counts; `full_cfg` the model's. Logits come back whole on every rank."""

    def __init__(self, cfg, weights, source: LlamaModel, device, rank, world_size,
                 vocab_parallel: bool):
        self.rank, self.world_size, self.vocab_parallel = rank, world_size, vocab_parallel
        self.full_cfg = source.cfg
        super().__init__(cfg, weights, source.tokenizer, device, source.dtype)
        # the source's RoPE (GGUF rope_freqs factors included), not one recomputed from cfg
        self._inv_freq, self._device_rope_ok, self._rope_len = (source._inv_freq,
                                                                source._device_rope_ok, 0)
        self._ensure_rope(min(cfg.max_position_embeddings, 4096))

    # LlamaModel's seams: one all_reduce per block half joins the ranks' partial outputs;
    # rank 0 alone adds the residual, so the sum holds it once
    def _combine(self, x, partial):
        s = O.add(x, partial) if self.rank == 0 else partial
        all_reduce(s)
        return s

    def _residual(self, x):
        return x if self.rank == 0 else None

    def _reduced(self, y):
        all_reduce(y)
        return y

    def _logits(self, y):
        return _gather_last(y, self.world_size) if self.vocab_parallel else y
