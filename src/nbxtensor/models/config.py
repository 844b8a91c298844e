"""Model configurations from HF `config.json` or GGUF metadata."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from ..files import regular_file

__all__ = ["LlamaConfig", "BertConfig", "rope_inv_freq"]

_LLAMA_TYPES = ("llama", "mistral", "qwen2", "smollm", "smollm2")
_REQUIRED = object()


def read_json(path, what: str) -> dict:
    """A JSON object from a regular file (a FIFO would block the read forever)."""
    regular_file(path, what)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:      # JSONDecodeError, UnicodeDecodeError, depth
        raise ValueError(f"{what} {os.fspath(path)!r} is not valid UTF-8 JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what} {os.fspath(path)!r}: expected a JSON object, got "
                         f"{type(doc).__name__}")
    return doc


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


_KINDS = {"int": (_is_int, "an integer"), "number": (_is_number, "a finite number"),
          "bool": (lambda v: isinstance(v, bool), "true or false"),
          "str": (lambda v: isinstance(v, str), "a string"),
          "dict": (lambda v: isinstance(v, dict), "an object")}


class _Keys:
    """Typed reads of a config.json: a missing key or one of the wrong type is named, with
    the file and the model kind that needs it. JSON null counts as absent."""

    def __init__(self, cfg: dict, where: str, model: str):
        self.cfg, self.where, self.model = cfg, where, model

    def __call__(self, key, kind, default=_REQUIRED, *, positive=False):
        v = self.cfg.get(key)
        if v is None:
            if default is _REQUIRED:
                raise ValueError(f"{self.where}: missing key {key!r} (needed for {self.model})")
            return default
        test, want = _KINDS[kind]
        if not test(v):
            raise ValueError(f"{self.where}: key {key!r} is {v!r:.80}, expected {want}")
        if positive and v <= 0:
            raise ValueError(f"{self.where}: key {key!r} is {v!r}, expected > 0")
        return v

    def token_ids(self, key, vocab, many: bool = True) -> list:
        """A token id, or with `many` a list of them too (eos_token_id may be either), each
        in [0, vocab)."""
        v = self.cfg.get(key)
        ids = [] if v is None else (v if isinstance(v, list) and many else [v])
        for i in ids:
            if not _is_int(i) or not 0 <= i < vocab:
                raise ValueError(f"{self.where}: key {key!r} is {v!r:.80}, expected "
                                 f"{'token ids' if many else 'a token id'} in [0, {vocab}) "
                                 f"(vocab_size {vocab})")
        return list(ids)


def _named(where: str, cls, **fields):
    """cls(**fields), its checks' ValueError naming the file the fields came from."""
    try:
        return cls(**fields)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


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
            if not _is_int(v) or v <= 0:
                raise ValueError(f"LlamaConfig: {name} must be a positive int, got {v!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, name)
            if not _is_number(v) or v <= 0:
                raise ValueError(f"LlamaConfig: {name} must be a finite number > 0, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"LlamaConfig: num_attention_heads {self.num_attention_heads} is not "
                             f"a multiple of num_key_value_heads {self.num_key_value_heads}")

    @classmethod
    def from_hf(cls, cfg: dict, where: str = "config.json") -> "LlamaConfig":
        if not isinstance(cfg, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
        k = _Keys(cfg, where, "llama")
        mt = k("model_type", "str", "llama")
        if mt not in _LLAMA_TYPES:
            raise ValueError(f"{where}: model_type {mt!r} is not a Llama-family decoder; "
                             f"supported: {', '.join(_LLAMA_TYPES)}")
        heads = k("num_attention_heads", "int", positive=True)
        hidden = k("hidden_size", "int", positive=True)
        head_dim = k("head_dim", "int", None, positive=True)
        if head_dim is None:
            if hidden % heads:
                raise ValueError(f"{where}: hidden_size {hidden} is not a multiple of "
                                 f"num_attention_heads {heads} (and no head_dim is given)")
            head_dim = hidden // heads
        vocab = k("vocab_size", "int", positive=True)
        bos = k.token_ids("bos_token_id", vocab, many=False)
        return _named(where, cls,
            vocab_size=vocab, hidden_size=hidden,
            intermediate_size=k("intermediate_size", "int", positive=True),
            num_hidden_layers=k("num_hidden_layers", "int", positive=True),
            num_attention_heads=heads,
            num_key_value_heads=k("num_key_value_heads", "int", heads, positive=True),
            head_dim=head_dim,
            rms_norm_eps=k("rms_norm_eps", "number", 1e-6, positive=True),
            rope_theta=k("rope_theta", "number", 10000.0, positive=True),
            rope_scaling=k("rope_scaling", "dict", None),
            tie_word_embeddings=k("tie_word_embeddings", "bool", False),
            max_position_embeddings=k("max_position_embeddings", "int", 4096, positive=True),
            attention_bias=k("attention_bias", "bool", mt == "qwen2"), model_type=mt,
            bos_token_id=bos[0] if bos else None,
            eos_token_ids=k.token_ids("eos_token_id", vocab))

    @classmethod
    def from_gguf(cls, g) -> "LlamaConfig":
        where = f"GGUF {g.path!r}"
        arch = g.typed("general.architecture", "str")
        if arch not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"{where}: architecture {arch!r} is not supported; "
                             f"supported: llama, mistral, qwen2")

        def count(name, *default):     # an integer of any width, > 0
            return g.typed(f"{arch}.{name}", "int", *default, positive=True)
        heads = count("attention.head_count")
        hidden = count("embedding_length")
        emb = g.tensor("token_embd.weight")
        if len(emb.shape) != 2 or emb.shape[1] != hidden:
            raise ValueError(f"{where}: tensor 'token_embd.weight' has shape {emb.shape}, "
                             f"expected (vocab, {hidden}) ({arch}.embedding_length {hidden})")
        vocab = emb.shape[0]
        n_tok = g.n_vocab()
        if n_tok != vocab:
            raise ValueError(f"{where}: tokenizer.ggml.tokens has {n_tok} tokens but "
                             f"token_embd.weight has {vocab} rows")
        head_dim = count("attention.key_length", None)
        if head_dim is None:
            if hidden % heads:
                raise ValueError(f"{where}: {arch}.embedding_length {hidden} is not a multiple "
                                 f"of {arch}.attention.head_count {heads}")
            head_dim = hidden // heads
        return _named(where, cls,
            vocab_size=vocab, hidden_size=hidden,
            intermediate_size=count("feed_forward_length"), num_hidden_layers=count("block_count"),
            num_attention_heads=heads,
            num_key_value_heads=count("attention.head_count_kv", heads),
            head_dim=head_dim,
            rms_norm_eps=g.typed(f"{arch}.attention.layer_norm_rms_epsilon", "float",
                                 positive=True),
            rope_theta=g.typed(f"{arch}.rope.freq_base", "float", 10000.0, positive=True),
            tie_word_embeddings="output.weight" not in g.tensors,
            max_position_embeddings=count("context_length", 4096),
            attention_bias="blk.0.attn_q.bias" in g.tensors, model_type=arch,
            bos_token_id=g.token_id("tokenizer.ggml.bos_token_id", vocab),
            eos_token_ids=g.stop_token_ids(vocab))

    @classmethod
    def from_folder(cls, folder) -> "LlamaConfig":
        path = os.path.join(folder, "config.json")
        return cls.from_hf(read_json(path, "config.json"), path)


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
        f = sc.get("factor")
        if not _is_number(f) or f <= 0:
            raise ValueError(f"rope_scaling: linear needs a 'factor' > 0, got {f!r}")
        return inv / f
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
        path = os.path.join(folder, "config.json")
        cfg = read_json(path, "config.json")
        if cfg.get("model_type") != "bert":
            raise ValueError(f"{path}: model_type {cfg.get('model_type')!r} is not 'bert'")
        k = _Keys(cfg, path, "bert")
        if k("hidden_act", "str", "gelu") != "gelu":
            raise ValueError(f"{path}: hidden_act {cfg.get('hidden_act')!r} not supported "
                             f"(only 'gelu')")
        heads = k("num_attention_heads", "int", positive=True)
        hidden = k("hidden_size", "int", positive=True)
        if hidden % heads:
            raise ValueError(f"{path}: hidden_size {hidden} is not a multiple of "
                             f"num_attention_heads {heads}")
        return cls(vocab_size=k("vocab_size", "int", positive=True), hidden_size=hidden,
                   num_hidden_layers=k("num_hidden_layers", "int", positive=True),
                   num_attention_heads=heads,
                   intermediate_size=k("intermediate_size", "int", positive=True),
                   max_position_embeddings=k("max_position_embeddings", "int", 512, positive=True),
                   type_vocab_size=k("type_vocab_size", "int", 2, positive=True),
                   layer_norm_eps=k("layer_norm_eps", "number", 1e-12, positive=True))
