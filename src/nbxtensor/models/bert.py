"""BERT encoder for sentence embeddings (all-MiniLM-L6-v2): batched, padded inputs with an
attention mask, mean pooling and L2 normalisation as sentence-transformers does.

On cuda, `embed(..., graphs=True)` runs each batch as a CUDA-graph replay
(nbx.cuda.graphed over `_embed_batch`): one graph per (batch, padded length) with the
length padded up to a multiple of GRAPH_LENGTH_STEP, so a corpus of varied sentence lengths
needs a handful of captures. Padding is masked out of attention and pooling."""
from __future__ import annotations

import os
import time

import numpy as np

import nbxtensor as nbx
from . import _ops as O
from ..device import as_device
from ..files import regular_file
from .config import BertConfig, read_json
from .llama import _float_weight, _staging, _to_device

__all__ = ["BertModel"]


def _weight_shapes(cfg) -> dict:
    """The shape config.json implies for each weight (layer weights without their prefix)."""
    H, F = cfg.hidden_size, cfg.intermediate_size
    w = {"embeddings.word_embeddings.weight": (cfg.vocab_size, H),
         "embeddings.position_embeddings.weight": (cfg.max_position_embeddings, H),
         "embeddings.token_type_embeddings.weight": (cfg.type_vocab_size, H),
         "embeddings.LayerNorm.weight": (H,), "embeddings.LayerNorm.bias": (H,)}
    for n in ("attention.self.query", "attention.self.key", "attention.self.value",
              "attention.output.dense"):
        w[n + ".weight"], w[n + ".bias"] = (H, H), (H,)
    w["intermediate.dense.weight"], w["intermediate.dense.bias"] = (F, H), (F,)
    w["output.dense.weight"], w["output.dense.bias"] = (H, F), (H,)
    for n in ("attention.output.LayerNorm", "output.LayerNorm"):
        w[n + ".weight"], w[n + ".bias"] = (H,), (H,)
    return w


# graphed batches pad their length up to a multiple of this (fewer distinct graphs)
GRAPH_LENGTH_STEP = 16


class BertModel:
    def __init__(self, cfg: BertConfig, weights: dict, tokenizer, device, dtype, max_seq_length=256):
        self.cfg, self.w, self.tokenizer = cfg, weights, tokenizer
        self.device, self.dtype = as_device(device), dtype
        self.max_seq_length = max_seq_length
        self.load_seconds = 0.0
        self._graphed = None          # nbx.cuda.graphed(self._embed_batch), made on first use

    @classmethod
    def from_folder(cls, folder, device="cpu", dtype=None, max_seq_length=None):
        """config.json + model.safetensors + tokenizer.json (sentence-transformers layout)."""
        from tokenizers import Tokenizer
        from ..io.safetensors import SafetensorsFile
        t0 = time.perf_counter()
        dev = as_device(device)
        dtype = nbx.dtypes.as_dtype(dtype) if dtype is not None else nbx.float32
        cfg = BertConfig.from_folder(folder)
        f = SafetensorsFile(os.path.join(folder, "model.safetensors"))
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in f else ""

        want = _weight_shapes(cfg)
        with _staging(dev, f.nbytes()) as up:      # [staging] pinned-ring uploads on cuda
            def get(name):
                full = prefix + name
                if full not in f:
                    raise KeyError(f"{folder}: tensor {full!r} missing from model.safetensors")
                shape = want[name.split(".", 3)[3] if name.startswith("encoder.") else name]
                if f.info(full)[1] != shape:    # as HF refuses a size mismatch at load
                    raise ValueError(f"{f.path}: tensor {full!r} has shape {f.info(full)[1]}, "
                                     f"but config.json (hidden_size {cfg.hidden_size}, "
                                     f"vocab_size {cfg.vocab_size}, intermediate_size "
                                     f"{cfg.intermediate_size}, max_position_embeddings "
                                     f"{cfg.max_position_embeddings}, type_vocab_size "
                                     f"{cfg.type_vocab_size}) needs {shape}")
                return _to_device(_float_weight(f, full), dtype, dev, up, full)
            w = {k: get(f"embeddings.{k}") for k in
                 ("word_embeddings.weight", "position_embeddings.weight",
                  "token_type_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias")}
            w["layers"] = []
            for i in range(cfg.num_hidden_layers):
                p = f"encoder.layer.{i}."
                w["layers"].append({n: get(p + n) for n in (
                    "attention.self.query.weight", "attention.self.query.bias",
                    "attention.self.key.weight", "attention.self.key.bias",
                    "attention.self.value.weight", "attention.self.value.bias",
                    "attention.output.dense.weight", "attention.output.dense.bias",
                    "attention.output.LayerNorm.weight", "attention.output.LayerNorm.bias",
                    "intermediate.dense.weight", "intermediate.dense.bias",
                    "output.dense.weight", "output.dense.bias",
                    "output.LayerNorm.weight", "output.LayerNorm.bias")})
        if max_seq_length is None:
            max_seq_length = 256
            sb = os.path.join(folder, "sentence_bert_config.json")
            if regular_file(sb, "sentence_bert_config.json", missing_ok=True):
                max_seq_length = read_json(sb, "sentence_bert_config.json").get(
                    "max_seq_length", 256)
                if not isinstance(max_seq_length, int) or isinstance(max_seq_length, bool) \
                        or max_seq_length <= 0:
                    raise ValueError(f"{sb}: key 'max_seq_length' is {max_seq_length!r:.80}, "
                                     f"expected an integer > 0")
        tk_path = os.path.join(folder, "tokenizer.json")
        regular_file(tk_path, "tokenizer.json")
        tk = Tokenizer.from_file(tk_path)
        tk.no_padding()   # the file pads every input to 128; we pad per batch instead
        tk.enable_truncation(max_length=min(max_seq_length, cfg.max_position_embeddings))
        m = cls(cfg, w, tk, dev, dtype, max_seq_length)
        m.load_seconds = time.perf_counter() - t0
        return m

    def tokenize(self, texts, pad_to_multiple: int = 1):
        """-> (ids int64 (B, T), mask bool (B, T)) padded on the right to the longest (rounded
        up to a multiple of `pad_to_multiple`, at most the position table's length)."""
        if isinstance(texts, str):
            texts = [texts]
        if not texts:
            raise ValueError("embed: texts is empty")
        enc = self.tokenizer.encode_batch(list(texts))
        T = max(len(e.ids) for e in enc)
        T = max(T, min(-(-T // pad_to_multiple) * pad_to_multiple,
                       self.cfg.max_position_embeddings))
        ids = np.zeros((len(enc), T), np.int64)
        mask = np.zeros((len(enc), T), bool)
        for i, e in enumerate(enc):
            ids[i, :len(e.ids)] = e.ids
            mask[i, :len(e.ids)] = True
        return ids, mask

    def forward(self, ids: np.ndarray, mask: np.ndarray):
        """Last hidden states (B, T, hidden) and the mask on the device."""
        mask_t = nbx.tensor(mask, device=self.device)
        return self._encode(nbx.tensor(ids, device=self.device), mask_t), mask_t

    def _encode(self, ids_t, mask_t):
        """Last hidden states (B, T, hidden) of device ids (B, T) int64 under mask (B, T) bool.
        Reads no host data (positions are rows 0..T-1 of the table, token type 0), so a CUDA
        graph can record it."""
        cfg, w = self.cfg, self.w
        B, T = ids_t.shape
        H = cfg.num_attention_heads
        D = cfg.hidden_size // H
        words = O.embedding(ids_t.reshape(-1), w["word_embeddings.weight"]).view(B, T, -1)
        x = O.add(O.add(words, w["position_embeddings.weight"][:T]),
                  w["token_type_embeddings.weight"][0])
        x = O.layer_norm(x.view(B * T, -1), w["LayerNorm.weight"], w["LayerNorm.bias"],
                         cfg.layer_norm_eps)
        for L in w["layers"]:
            def proj(n):
                return O.linear(x, L[f"attention.self.{n}.weight"], L[f"attention.self.{n}.bias"]) \
                    .view(B, T, H, D).transpose(1, 2)
            a = O.attention(proj("query"), proj("key"), proj("value"), causal=False,
                            key_mask=mask_t)
            a = a.transpose(1, 2).reshape(B * T, H * D)
            a = O.linear(a, L["attention.output.dense.weight"], L["attention.output.dense.bias"])
            x = O.layer_norm(O.add(a, x), L["attention.output.LayerNorm.weight"],
                             L["attention.output.LayerNorm.bias"], cfg.layer_norm_eps)
            h = O.gelu(O.linear(x, L["intermediate.dense.weight"], L["intermediate.dense.bias"]))
            h = O.linear(h, L["output.dense.weight"], L["output.dense.bias"])
            x = O.layer_norm(O.add(h, x), L["output.LayerNorm.weight"], L["output.LayerNorm.bias"],
                             cfg.layer_norm_eps)
        return x.view(B, T, cfg.hidden_size)

    def _embed_batch(self, ids_t, mask_t):
        """Unit-length embeddings (B, hidden) float32 of one batch on the device (what a graph
        records)."""
        return O.mean_pool_normalize(self._encode(ids_t, mask_t), mask_t)

    def embed(self, texts, batch_size: int = 32, graphs: bool = False) -> np.ndarray:
        """Unit-length sentence embeddings, float32 (N, hidden). graphs=True (cuda only)
        replays each batch from a CUDA graph captured per (batch, padded length)."""
        if isinstance(texts, str):
            texts = [texts]
        if graphs.__class__ is not bool:
            raise TypeError(f"embed: graphs must be a bool, got {graphs!r}")
        if graphs and self.device.type != "cuda":
            raise ValueError(f"embed: graphs=True needs a cuda model, got {self.device}")
        texts = list(texts)
        run = self._graphed_batch() if graphs else self._eager_batch
        step = GRAPH_LENGTH_STEP if graphs else 1
        out = []
        for i in range(0, len(texts), batch_size):
            ids, mask = self.tokenize(texts[i:i + batch_size], pad_to_multiple=step)
            out.append(run(ids, mask).numpy().astype(np.float32))
        return np.concatenate(out) if out else np.zeros((0, self.cfg.hidden_size), np.float32)

    def _eager_batch(self, ids, mask):
        return self._embed_batch(nbx.tensor(ids, device=self.device),
                                 nbx.tensor(mask, device=self.device))

    def _graphed_batch(self):
        if self._graphed is None:
            self._graphed = nbx.cuda.graphed(self._embed_batch, device=self.device)
        return self._graphed
