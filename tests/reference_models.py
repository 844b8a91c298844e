"""Independent float64 NumPy implementations of BERT and Llama, for golden tests and the
CPU benchmark. Nothing here imports nbxtensor.

* The Llama reference reads the GGUF with the `gguf` package and dequantises with
  `gguf.quants.dequantize` (not ours), keeps llama.cpp's Q/K row layout and applies
  RoPE in the interleaved (GPT-J) convention that layout implies -- so it checks our
  un-permutation to HF's rotate_half layout as well as the maths.
* The BERT reference parses safetensors itself with json + NumPy.
"""
from __future__ import annotations

import json
import math
import struct

import numpy as np


# ----------------------------------------------------------------------------- Llama (GGUF)
class RefLlama:
    """SmolLM2/Llama decoder in float64 (or `dtype`) NumPy with a KV cache."""

    def __init__(self, gguf_path: str, dtype=np.float64):
        import gguf
        r = gguf.GGUFReader(gguf_path)

        def meta(key):
            return r.fields[key].contents()
        arch = meta("general.architecture")
        self.n_layers = int(meta(f"{arch}.block_count"))
        self.dim = int(meta(f"{arch}.embedding_length"))
        self.n_heads = int(meta(f"{arch}.attention.head_count"))
        self.n_kv = int(meta(f"{arch}.attention.head_count_kv"))
        self.eps = float(meta(f"{arch}.attention.layer_norm_rms_epsilon"))
        self.theta = float(meta(f"{arch}.rope.freq_base"))
        self.hd = self.dim // self.n_heads
        self.dtype = dtype
        w = {}
        for t in r.tensors:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            w[t.name] = np.asarray(a, dtype=dtype).reshape([int(x) for x in reversed(t.shape)])
        self.w = w
        self.out = w.get("output.weight", w["token_embd.weight"])
        inv = 1.0 / self.theta ** (np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
        self.inv_freq = inv
        self.reset()

    def reset(self):
        self.k = [np.zeros((0, self.n_kv, self.hd), self.dtype) for _ in range(self.n_layers)]
        self.v = [np.zeros((0, self.n_kv, self.hd), self.dtype) for _ in range(self.n_layers)]
        self.pos = 0

    def _rms(self, x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * g

    def _rope_interleaved(self, x, pos):
        # x: (T, H, hd); pairs (2i, 2i+1) rotate by angle pos * inv_freq[i]
        ang = pos[:, None] * self.inv_freq[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def forward(self, tokens) -> np.ndarray:
        """Logits (T, vocab) for `tokens` appended after the cached ones."""
        T = len(tokens)
        pos = np.arange(self.pos, self.pos + T, dtype=np.float64)
        x = self.w["token_embd.weight"][np.asarray(tokens)]
        g = self.n_heads // self.n_kv
        for i in range(self.n_layers):
            p = f"blk.{i}."
            h = self._rms(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T).reshape(T, self.n_heads, self.hd)
            k = (h @ self.w[p + "attn_k.weight"].T).reshape(T, self.n_kv, self.hd)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(T, self.n_kv, self.hd)
            q, k = self._rope_interleaved(q, pos), self._rope_interleaved(k, pos)
            self.k[i] = np.concatenate([self.k[i], k])
            self.v[i] = np.concatenate([self.v[i], v])
            K, V = self.k[i], self.v[i]
            S = K.shape[0]
            att = np.empty((T, self.n_heads, self.hd), self.dtype)
            mask = np.arange(S)[None, :] > (self.pos + np.arange(T))[:, None]
            for hh in range(self.n_heads):
                kv = hh // g
                s = q[:, hh] @ K[:, kv].T / math.sqrt(self.hd)
                s = np.where(mask, -np.inf, s)
                s = np.exp(s - s.max(-1, keepdims=True))
                s /= s.sum(-1, keepdims=True)
                att[:, hh] = s @ V[:, kv]
            x = x + att.reshape(T, -1) @ self.w[p + "attn_output.weight"].T
            h = self._rms(x, self.w[p + "ffn_norm.weight"])
            gate = h @ self.w[p + "ffn_gate.weight"].T
            up = h @ self.w[p + "ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ self.w[p + "ffn_down.weight"].T
        self.pos += T
        x = self._rms(x, self.w["output_norm.weight"])
        return x @ self.out.T

    def greedy(self, tokens, n, stop=()):
        """Greedy continuation; returns (new tokens, top-2 logit margins per step)."""
        self.reset()
        logits = self.forward(tokens)[-1]
        out, margins = [], []
        for _ in range(n):
            top2 = np.partition(logits, -2)[-2:]
            margins.append(float(top2[1] - top2[0]))
            t = int(np.argmax(logits))
            out.append(t)
            if t in stop:
                break
            logits = self.forward([t])[-1]
        return out, margins


# ----------------------------------------------------------------------------- BERT
def read_safetensors(path) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    kinds = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e],
                                  kinds[info["dtype"]]).reshape(info["shape"])
    return out


class RefBert:
    """BERT encoder + mean pooling + L2 normalisation (sentence-transformers), float64."""

    def __init__(self, folder: str):
        import os
        with open(os.path.join(folder, "config.json")) as f:
            cfg = json.load(f)
        self.w = {k: v.astype(np.float64) for k, v in
                  read_safetensors(os.path.join(folder, "model.safetensors")).items()}
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.eps = cfg["layer_norm_eps"]

    def _ln(self, x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * self.w[p + ".weight"] + self.w[p + ".bias"]

    def _lin(self, x, p):
        return x @ self.w[p + ".weight"].T + self.w[p + ".bias"]

    def embed(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """ids, mask: (B, T) ints -> (B, hidden) unit vectors."""
        from math import erf
        B, T = ids.shape
        w = self.w
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][np.arange(T)][None]
             + w["embeddings.token_type_embeddings.weight"][0][None, None])
        x = self._ln(x, "embeddings.LayerNorm")
        D = x.shape[-1]
        hd = D // self.heads
        bias = np.where(mask[:, None, None, :] > 0, 0.0, -np.inf)
        verf = np.vectorize(erf)
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q = self._lin(x, p + "attention.self.query").reshape(B, T, self.heads, hd).transpose(0, 2, 1, 3)
            k = self._lin(x, p + "attention.self.key").reshape(B, T, self.heads, hd).transpose(0, 2, 1, 3)
            v = self._lin(x, p + "attention.self.value").reshape(B, T, self.heads, hd).transpose(0, 2, 1, 3)
            s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + bias
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = (s @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
            x = self._ln(self._lin(a, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
            h = self._lin(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + verf(h / math.sqrt(2.0)))
            x = self._ln(self._lin(h, p + "output.dense") + x, p + "output.LayerNorm")
        m = mask[..., None].astype(np.float64)
        pooled = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
