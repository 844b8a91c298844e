"""Model configurations from HF `config.json` or GGUF metadata."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

__all__ = ["LlamaConfig", "BertConfig", "rope_inv_freq"]

_LLAMA_TYPES = ("llama", "mistral", "qwen2", "smollm", "smollm2")


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: list = field(default_factory=list)

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"LlamaConfig: {name} must be a positive int, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"LlamaConfig: num_attention_heads {self.num_attention_heads} is not "
                             f"a multiple of num_key_value_heads {self.num_key_value_heads}")

    @classmethod
    def from_hf(cls, cfg: dict) -> "LlamaConfig":
        mt = cfg.get("model_type", "llama")
        if mt not in _LLAMA_TYPES:
            raise ValueError(f"config.json: model_type {mt!r} is not a Llama-family decoder; "
                             f"supported: {', '.join(_LLAMA_TYPES)}")
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        return cls(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=cfg.get("rope_theta", 10000.0),
            rope_scaling=cfg.get("rope_scaling"),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            attention_bias=cfg.get("attention_bias", mt == "qwen2"), model_type=mt,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=list(eos) if isinstance(eos, list) else ([] if eos is None else [eos]))

    @classmethod
    def from_gguf(cls, g) -> "LlamaConfig":
        arch = g.get("general.architecture")
        if arch not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"GGUF {g.path!r}: architecture {arch!r} is not supported; "
                             f"supported: llama, mistral, qwen2")

        def k(name, default=None):
            v = g.get(f"{arch}.{name}", default)
            if v is None:
                raise ValueError(f"GGUF {g.path!r}: missing metadata key {arch}.{name}")
            return v
        heads = int(k("attention.head_count"))
        hidden = int(k("embedding_length"))
        emb = g.tensor("token_embd.weight")
        return cls(
            vocab_size=emb.shape[0], hidden_size=hidden,
            intermediate_size=int(k("feed_forward_length")), num_hidden_layers=int(k("block_count")),
            num_attention_heads=heads,
            num_key_value_heads=int(k("attention.head_count_kv", heads)),
            head_dim=int(g.get(f"{arch}.attention.key_length") or hidden // heads),
            rms_norm_eps=float(k("attention.layer_norm_rms_epsilon")),
            rope_theta=float(k("rope.freq_base", 10000.0)),
            tie_word_embeddings="output.weight" not in g.tensors,
            max_position_embeddings=int(k("context_length", 4096)),
            attention_bias="blk.0.attn_q.bias" in g.tensors, model_type=arch,
            bos_token_id=g.get("tokenizer.ggml.bos_token_id"), eos_token_ids=g.stop_token_ids())

    @classmethod
    def from_folder(cls, folder) -> "LlamaConfig":
        with open(os.path.join(folder, "config.json")) as f:
            return cls.from_hf(json.load(f))


def rope_inv_freq(cfg: LlamaConfig, freq_factors=None):
    """Inverse frequencies (head_dim/2,) float64, with Llama-3 or linear scaling when configured.

    One Llama-3 formula: `nbx.rope_inv_freq`'s; this adds the HF defaults for missing llama3
    keys, linear scaling, and the GGUF `rope_freqs` divisors."""
    import numpy as np
    from ..ops.attention import rope_inv_freq as _base
    sc = cfg.rope_scaling
    kind = sc.get("rope_type", sc.get("type")) if sc else None
    if freq_factors is not None:            # GGUF llama3: rope_freqs.weight holds the divisors
        return _base(cfg.head_dim, cfg.rope_theta) / np.asarray(freq_factors, np.float64)
    if kind == "llama3":
        full = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, **sc, "rope_type": "llama3"}
        return _base(cfg.head_dim, cfg.rope_theta, full)
    inv = _base(cfg.head_dim, cfg.rope_theta)
    if kind == "linear":
        return inv / sc["factor"]
    if kind not in (None, "default"):
        raise ValueError(f"rope_scaling: type {kind!r} is not supported (supported: llama3, "
                         f"linear)")
    return inv


@dataclass
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @classmethod
    def from_folder(cls, folder) -> "BertConfig":
        with open(os.path.join(folder, "config.json")) as f:
            cfg = json.load(f)
        if cfg.get("model_type") != "bert":
            raise ValueError(f"{folder}/config.json: model_type {cfg.get('model_type')!r} is not "
                             f"'bert'")
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"BertConfig: hidden_act {cfg.get('hidden_act')!r} not supported "
                             f"(only 'gelu')")
        return cls(**{k: cfg[k] for k in cls.__dataclass_fields__ if k in cfg})
