"""Llama-family decoder (Llama, Mistral, Qwen2, SmolLM): GQA, RoPE (HF rotate_half),
RMSNorm, SwiGLU, tied embeddings, prefill + KV-cache decode.

Weights come from a GGUF file or an HF folder (config.json + *.safetensors). GGUF
files of architecture `llama` store Q and K rows permuted for llama.cpp's interleaved
RoPE; we undo that at load so one rotate_half RoPE serves every source.

On cuda, Q8_0 / Q4_1 weights stay quantised and run through the fused dequantise-GEMV
kernel; every other GGUF type is dequantised at load to the compute dtype (block formats
on the device by kernels/quant.py [quantgpu]; float types on the host). On cpu with numba
installed [cpuquant], the block formats stay quantised and `forward` runs
models/cpu_decode.py's plan (backends/cpu/quant.py's compiled GEMVs); without numba they are
dequantised to float32 at load and `cpu_path` says so.

Two compute paths:
* `forward(ids, cache)` -- the original eager path (host position `cache.pos` of a batch-1
  `nbx.KVCache`, host-built masks); the reference of the golden tests.
* `prefill(tokens_t, positions_t, cache)` / `decode_step(tokens_t, positions_t, cache)` --
  batched, with tokens and positions as device tensors and an `nbx.KVCache` whose lengths
  live on the device, so a decode step can be captured once as a CUDA graph and replayed
  per token (models/graph_decode.py). With plain (non-quantised) weights the step runs the
  fused decode GEMVs (QKV as one GEMV with RMSNorm fused in, o_proj/down_proj with the
  residual add in the epilogue, gate/up as one GEMV with RMSNorm in and SiLU*up out, final
  RMSNorm fused into the lm_head): `__init__` concatenates Q/K/V and gate/up once (the
  separate weights become views of the concatenation, no extra memory). Quantised layers
  (Q8_0/Q4_1 on the GPU) take the same fusions through kernels/quant_fused.py [quantfused]
  (Q/K/V and gate/up concatenated by block rows when each group shares one format).
"""
from __future__ import annotations

import contextlib
import os
import time

import numpy as np

import nbxtensor as nbx
from . import _ops as O
from ..device import as_device
from .config import LlamaConfig, rope_inv_freq

__all__ = ["LlamaModel"]

# GGUF types with a fused dequant-GEMV kernel: kept quantised on the GPU
GPU_QUANT_TYPES = ("Q8_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")   # K-quants: kernels/quant.py's GEMV
# [cpuquant] kept quantised on cpu when numba is installed (backends/cpu/quant.py's GEMVs)
CPU_QUANT_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
# [quantgpu] block formats dequantised on the device at load (cuda/interp) when not kept
DEVICE_DEQUANT_TYPES = ("Q8_0", "Q4_1", "Q4_0", "Q4_K", "Q5_K", "Q6_K")


# [quantfused] which weights the fused decode GEMVs take: plain 2-D tensors, or QuantWeights
# of the formats kernels/quant_fused.py reads (concatenated by block rows, same format)
def _fusable_weight(w) -> bool:
    if isinstance(w, O.QuantWeight):
        from ..kernels.quant_fused import QTYPES
        return w.qtype in QTYPES and len(w.shape) == 2
    return isinstance(w, nbx.Tensor) and w.ndim == 2


def _fusable_layer(L) -> bool:
    """Every projection fusable; Q/K/V and gate/up each all plain or all one quantised type
    (they are concatenated); the norm weights plain tensors."""
    names = ("wq", "wk", "wv", "w_gate", "w_up", "w_down", "wo")
    if not all(_fusable_weight(L[n]) for n in names) or \
            not all(isinstance(L[n], nbx.Tensor) for n in ("attn_norm", "ffn_norm")):
        return False
    kind = lambda w: w.qtype if isinstance(w, O.QuantWeight) else "plain"   # noqa: E731
    return len({kind(L[n]) for n in ("wq", "wk", "wv")}) == 1 and \
        kind(L["w_gate"]) == kind(L["w_up"])


def _cat_rows(ws):
    """Row concatenation of weights of one kind (QuantWeight: its block rows)."""
    if isinstance(ws[0], O.QuantWeight):
        dev = ws[0].blocks.device
        if dev.type == "interp":      # host memory: a NumPy byte copy (the interpreted cat
            blocks = nbx.from_numpy(np.concatenate([w.blocks.numpy() for w in ws])).to(dev)
        else:                         # kernel takes ~1 min per MB of blocks)
            blocks = nbx.cat([w.blocks for w in ws], dim=0)
        return O.QuantWeight(blocks, ws[0].qtype, (blocks.shape[0], ws[0].shape[1]))
    return nbx.cat(ws, dim=0)


def _rows(w, a, b):
    """Rows a:b of a weight as a view (no copy)."""
    if isinstance(w, O.QuantWeight):
        return O.QuantWeight(w.blocks[a:b], w.qtype, (b - a, w.shape[1]))
    return w[a:b]
# [/quantfused]


def _unpermute_rows(a: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (rows grouped (head, pair, half) -> (head, half, pair))."""
    rows = a.shape[0]
    return a.reshape(n_head, rows // n_head // 2, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)


class LlamaModel:
    def __init__(self, cfg: LlamaConfig, weights: dict, tokenizer, device, dtype, freq_factors=None):
        self.cfg = cfg
        self.w = weights
        self.tokenizer = tokenizer
        self.device = as_device(device)
        self.dtype = dtype
        inv = rope_inv_freq(cfg, freq_factors)
        self._inv_freq = inv
        self._rope_len = 0
        self._ensure_rope(min(cfg.max_position_embeddings, 4096))
        self.load_seconds = 0.0
        # the device-side RoPE of the decode step recomputes inv_freq from (theta, scaling);
        # GGUF files with rope_freqs factors are only supported if they agree
        try:
            ref = nbx.rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling or None)
            self._device_rope_ok = bool(np.allclose(ref, inv, rtol=1e-9, atol=0))
        except (ValueError, KeyError, TypeError):      # a scaling type the device RoPE lacks
            self._device_rope_ok = False
        self._cpu_plan = None
        if self.device.type == "cpu" and _has_quant(weights):    # [cpuquant]
            from .cpu_decode import CpuPlan
            self.fused, self.fused_head = [False] * len(weights["layers"]), False
            if CpuPlan.supports(self):
                self._cpu_plan = CpuPlan(self)
        else:
            self._prepare_fused()

    @property
    def cpu_path(self) -> str:
        """How this model computes, in words (for progress lines): the cpu kernels in use."""
        if self.device.type != "cpu":
            return f"{self.device.type} kernels"
        from ..backends.cpu import quant as Q
        if self._cpu_plan is not None:
            return Q.describe()
        if _has_quant(self.w):
            return "quantised weights through the Tensor ops (a layer the cpu plan lacks)"
        return "float32 NumPy" + ("" if Q.available() else
                                  " (numba not installed: " + Q.describe() + ")")

    def _prepare_fused(self) -> None:
        """Concatenate Q/K/V (and their biases) and gate/up per layer for the fused decode
        GEMVs; the separate weights become row views of the concatenations."""
        self.fused = []
        for L in self.w["layers"]:
            ok = _fusable_layer(L)        # [quantfused] plain or Q8_0/Q4_1 weights
            self.fused.append(ok)
            if not ok:
                continue
            if "wqkv" not in L:
                nq, nk = L["wq"].shape[0], L["wk"].shape[0]
                wqkv = _cat_rows([L["wq"], L["wk"], L["wv"]])
                L["wq"], L["wk"], L["wv"] = (_rows(wqkv, 0, nq), _rows(wqkv, nq, nq + nk),
                                             _rows(wqkv, nq + nk, wqkv.shape[0]))
                L["wqkv"] = wqkv
                if L.get("bq") is not None:
                    bqkv = nbx.cat([L["bq"], L["bk"], L["bv"]], dim=0)
                    L["bq"], L["bk"], L["bv"] = bqkv[:nq], bqkv[nq:nq + nk], bqkv[nq + nk:]
                    L["bqkv"] = bqkv
            if "w_gateup" not in L:
                f = L["w_gate"].shape[0]
                gu = _cat_rows([L["w_gate"], L["w_up"]])
                L["w_gate"], L["w_up"] = _rows(gu, 0, f), _rows(gu, f, gu.shape[0])
                L["w_gateup"] = gu
        head = self.w["lm_head"]
        self.fused_head = _fusable_weight(head) and isinstance(self.w["norm"], nbx.Tensor)

    # ----------------------------------------------------------------- loading
    @classmethod
    def from_gguf(cls, path, device="cpu", dtype=None, quantized: bool | None = None):
        """Load a GGUF file. quantized=None keeps Q8_0/Q4_1 (and the K-quants) quantised on
        cuda, and the block formats on cpu when numba is installed ([cpuquant]).

        dtype=None computes in float32 on cpu/interp and bfloat16 on cuda. On the cpu, bf16
        activations derail SmolLM2 Q4_1 (its unfused path rounds after every op); on cuda
        the fused decode kernels normalise and accumulate in fp32 and round only between
        kernels: on the H200 bf16 answered as float32 did ("The capital of France is
        Paris.") and decoded at 2175 tok/s against 1401 for float32. Pass dtype= to choose."""
        from ..io.gguf import GGUFFile
        from .tokenizer import Tokenizer
        t0, dev, dtype = _load_start(device, dtype)
        from ..backends.cpu import quant as cpu_quant       # [cpuquant] (imports no numba)
        # cpu keeps weights quantised by default where its kernels can (numba, float32);
        # another dtype asked for on cpu means dequantised weights of that dtype
        keep_q = (dev.type != "cpu" or (cpu_quant.available() and dtype is nbx.float32)) \
            if quantized is None else quantized
        if keep_q and dev.type == "cpu" and not cpu_quant.available():
            raise ValueError("from_gguf: quantized=True on cpu needs numba (pip install "
                             "'nbxtensor[cpu]'); without it weights are dequantised to float32")
        if keep_q and dev.type == "cpu" and dtype is not nbx.float32:
            raise ValueError(f"from_gguf: quantised weights on cpu compute in float32, got "
                             f"dtype={dtype.name} (pass quantized=False)")
        kept = CPU_QUANT_TYPES if dev.type == "cpu" else GPU_QUANT_TYPES
        g = GGUFFile(path)
        cfg = LlamaConfig.from_gguf(g)
        permuted = g.architecture in ("llama", "mistral")

        with _staging(dev) as up:      # [staging] pinned-ring uploads on cuda
            def get(name, heads=None):
                t = g.tensor(name)
                if keep_q and t.qtype in kept and len(t.shape) == 2:
                    blocks = t.blocks()
                    if heads and permuted:
                        blocks = _unpermute_rows(blocks, heads)
                    dev_blocks = (up.upload(blocks, name) if up is not None     # [staging]
                                  else nbx.from_numpy(np.ascontiguousarray(blocks)).to(dev))
                    return O.QuantWeight(dev_blocks, t.qtype, t.shape)
                # [quantgpu] cuda/interp: other block formats go up raw and are dequantised to
                # the compute dtype on the device (kernels/quant.py; bit-equal to the host path)
                if dev.type != "cpu" and t.qtype in DEVICE_DEQUANT_TYPES and len(t.shape) == 2 \
                        and dtype in (nbx.float32, nbx.bfloat16, nbx.float16):
                    from ..kernels.quant import dequantize as device_dequantize
                    blocks = t.blocks()
                    if heads and permuted:
                        blocks = _unpermute_rows(blocks, heads)
                    if up is not None:             # staged upload: wait for it before the kernel
                        raw = up.upload(blocks, name)
                        up.synchronize()
                    else:
                        raw = nbx.from_numpy(np.ascontiguousarray(blocks)).to(dev)
                    return device_dequantize(O.QuantWeight(raw, t.qtype, t.shape), dtype)
                a = t.dequantize(np.float32)
                if heads and permuted:
                    a = _unpermute_rows(a, heads)
                return _to_device(a, dtype, dev, up, name)
            w = {"embed": get("token_embd.weight"), "norm": get("output_norm.weight"), "layers": []}
            w["lm_head"] = get("output.weight") if "output.weight" in g.tensors else w["embed"]
            for i in range(cfg.num_hidden_layers):
                p = f"blk.{i}."
                L = {"attn_norm": get(p + "attn_norm.weight"), "ffn_norm": get(p + "ffn_norm.weight"),
                     "wq": get(p + "attn_q.weight", cfg.num_attention_heads),
                     "wk": get(p + "attn_k.weight", cfg.num_key_value_heads),
                     "wv": get(p + "attn_v.weight"), "wo": get(p + "attn_output.weight"),
                     "w_gate": get(p + "ffn_gate.weight"), "w_up": get(p + "ffn_up.weight"),
                     "w_down": get(p + "ffn_down.weight")}
                if cfg.attention_bias:
                    L["bq"] = get(p + "attn_q.bias", cfg.num_attention_heads)
                    L["bk"] = get(p + "attn_k.bias", cfg.num_key_value_heads)
                    L["bv"] = get(p + "attn_v.bias")
                w["layers"].append(L)
        ff = g.tensor("rope_freqs.weight").dequantize() if "rope_freqs.weight" in g.tensors else None
        _check_weight_shapes(cfg, w, f"GGUF {g.path!r}", _GGUF_NAMES)
        tok = Tokenizer.from_gguf(g)
        m = cls(cfg, w, tok, dev, dtype, ff)
        m.load_seconds = time.perf_counter() - t0
        return m

    @classmethod
    def from_folder(cls, folder, device="cpu", dtype=None):
        """Load an HF folder: config.json, *.safetensors, tokenizer.json."""
        from .tokenizer import Tokenizer
        t0, dev, dtype = _load_start(device, dtype)
        cfg, files, index, prog = _open_hf_folder(folder, LlamaConfig)

        qcfg = _int4_config(folder)                # [int4] GPTQ / AWQ checkpoints
        with _staging(dev, prog.total) as up:      # [staging] pinned-ring uploads on cuda
            def get(name, required=True):
                if qcfg is not None and name.endswith(".weight") and \
                        name[:-6] + "qweight" in index:
                    return _int4_weight(index, name[:-6], qcfg, dev)     # [int4]
                a = _host_weight(folder, files, index, prog, name, required)
                return None if a is None else _to_device(a, dtype, dev, up, name)
            w = _hf_head_weights(cfg, get)
            for i in range(cfg.num_hidden_layers):
                p = f"model.layers.{i}."
                L = {"attn_norm": get(p + "input_layernorm.weight"),
                     "ffn_norm": get(p + "post_attention_layernorm.weight"),
                     "wq": get(p + "self_attn.q_proj.weight"), "wk": get(p + "self_attn.k_proj.weight"),
                     "wv": get(p + "self_attn.v_proj.weight"), "wo": get(p + "self_attn.o_proj.weight"),
                     "w_gate": get(p + "mlp.gate_proj.weight"), "w_up": get(p + "mlp.up_proj.weight"),
                     "w_down": get(p + "mlp.down_proj.weight")}
                if cfg.attention_bias:
                    L["bq"] = get(p + "self_attn.q_proj.bias")
                    L["bk"] = get(p + "self_attn.k_proj.bias")
                    L["bv"] = get(p + "self_attn.v_proj.bias")
                w["layers"].append(L)
        prog.close()
        _check_weight_shapes(cfg, w, f"{folder}", _HF_NAMES)
        tok = Tokenizer.from_folder(folder, cfg.eos_token_ids)
        m = cls(cfg, w, tok, dev, dtype)
        m.load_seconds = time.perf_counter() - t0
        return m

    # ----------------------------------------------------------------- compute
    def _ensure_rope(self, n: int) -> None:
        if n <= self._rope_len:
            return
        ang = np.arange(n, dtype=np.float64)[:, None] * self._inv_freq[None, :]
        ang = np.concatenate([ang, ang], axis=1)          # rotate_half layout
        self._cos = nbx.tensor(np.cos(ang).astype(np.float32), device=self.device)
        self._sin = nbx.tensor(np.sin(ang).astype(np.float32), device=self.device)
        self._rope_len = n

    def new_cache(self, max_len: int | None = None):
        """An nbx.KVCache of one sequence for `forward` (host positions: cache.pos)."""
        n = max_len or min(self.cfg.max_position_embeddings, 4096)
        self._ensure_rope(n)
        return self.new_kv_cache(1, n)

    def forward(self, ids, cache, all_logits: bool = False):
        """Run `ids` (list of ints or int Tensor of shape (T,)) after the cached tokens.

        Returns logits (vocab,) for the last token, or (T, vocab) with all_logits.
        """
        cfg = self.cfg
        if self._cpu_plan is not None:    # [cpuquant] the compiled cpu step
            a = ids.numpy().astype(np.int64) if isinstance(ids, nbx.Tensor) else \
                self.check_token_ids(ids, "forward")
            return self._cpu_plan.forward(self, a.reshape(-1), cache, all_logits)
        if not isinstance(ids, nbx.Tensor):
            ids = nbx.tensor(self.check_token_ids(ids, "forward"), device=self.device)
        T = ids.shape[0]
        pos = cache.pos
        if pos + T > cache.capacity:
            raise ValueError(f"forward: {pos} cached + {T} new tokens exceed the KV cache's "
                             f"capacity {cache.capacity}")
        Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        cos, sin = self._cos[pos:pos + T], self._sin[pos:pos + T]
        x = O.embedding(ids, self.w["embed"])
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        for i, L in enumerate(self.w["layers"]):
            h = O.rms_norm(x, L["attn_norm"], cfg.rms_norm_eps)
            q, k = _qk_norm(L, O.linear(h, L["wq"], L.get("bq")),
                            O.linear(h, L["wk"], L.get("bk")), cfg.rms_norm_eps)
            q = q.view(1, T, Hq, D).transpose(1, 2)
            k = k.view(1, T, Hkv, D).transpose(1, 2)
            v = O.linear(h, L["wv"], L.get("bv")).view(1, T, Hkv, D).transpose(1, 2)
            q, k = O.rope(q, cos, sin), O.rope(k, cos, sin)
            cache.k[i][:, :, pos:pos + T] = k
            cache.v[i][:, :, pos:pos + T] = v
            a = O.attention(q, cache.k[i][:, :, :pos + T], cache.v[i][:, :, :pos + T],
                            causal=True, q_offset=pos)
            a = a.transpose(1, 2).reshape(T, Hq * D)
            x = self._combine(x, O.linear(a, L["wo"]))
            h = O.rms_norm(x, L["ffn_norm"], cfg.rms_norm_eps)
            x = self._combine(x, self._mlp(L, h))
        cache.advance(T)
        if not all_logits:
            x = x[T - 1:T]
        x = O.rms_norm(x, self.w["norm"], cfg.rms_norm_eps)
        if isinstance(self.w["lm_head"], O.QuantWeight) and x.dtype is not nbx.float32:
            # fp32 logits: bf16 rounding would create false argmax ties over 49k entries
            x = x.to(nbx.float32)
        logits = self._logits(O.linear(x, self.w["lm_head"]))
        return logits if all_logits else logits[0]

    @property
    def vocab_size(self) -> int:
        """The rows of the token embedding: every token id fed in lies in [0, vocab_size)."""
        return int(self.w["embed"].shape[0])

    def check_token_ids(self, ids, op: str) -> np.ndarray:
        """Host token ids (ints, lists of them or an integer ndarray) as int64, each checked
        against the vocabulary before the embedding sees it (IndexError naming the id).
        Device tensors are checked by the embedding kernels instead (their index-error
        flag: no host read, so a captured step stays capturable)."""
        a = ids if isinstance(ids, np.ndarray) else np.array(ids, dtype=object)
        flat = a.reshape(-1)
        if a.dtype == object:
            for t in flat:
                if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
                    raise TypeError(f"{op}: token ids must be ints, got {type(t).__name__} "
                                    f"{t!r}")
        elif flat.size and a.dtype.kind not in "iu":
            raise TypeError(f"{op}: token ids must be integers, got an array of {a.dtype}")
        V = self.vocab_size
        bad = (flat < 0) | (flat >= V)
        if bad.any():
            raise IndexError(f"{op}: token id {flat[bad][0]} is out of range for the "
                             f"vocabulary of {V} tokens (valid ids are 0..{V - 1})")
        return flat.astype(np.int64).reshape(a.shape)

    # ------------------------------------------------------- device-side (capturable) step
    def new_kv_cache(self, batch: int, capacity: int):
        """An nbx.KVCache for prefill / decode_step: (layers, batch, Hkv, capacity, D)."""
        c = self.cfg
        return nbx.KVCache(c.num_hidden_layers, batch, c.num_key_value_heads, capacity,
                           c.head_dim, dtype=self.dtype, device=self.device)

    def _check_step_args(self, tokens_t, positions_t, cache, op):
        if not self._device_rope_ok:
            raise NotImplementedError(f"{op}: this model's RoPE frequencies (GGUF rope_freqs "
                                      "factors) differ from rope_inv_freq(theta, scaling); "
                                      "use forward()")
        for n, t, dts in (("tokens_t", tokens_t, (nbx.int64, nbx.int32)),
                          ("positions_t", positions_t, (nbx.int32, nbx.int64))):
            if not isinstance(t, nbx.Tensor) or t.ndim != 2 or t.dtype not in dts:
                raise ValueError(f"{op}: {n} must be a 2-D (B, T) int tensor, got "
                                 f"{tuple(t.shape) if isinstance(t, nbx.Tensor) else type(t).__name__}"
                                 f"{' ' + t.dtype.name if isinstance(t, nbx.Tensor) else ''}")
            if t.device != self.device:
                raise ValueError(f"{op}: {n} is on {t.device}, the model on {self.device}")
        if tuple(positions_t.shape) != tuple(tokens_t.shape):
            raise ValueError(f"{op}: positions_t {tuple(positions_t.shape)} must match "
                             f"tokens_t {tuple(tokens_t.shape)}")
        if not isinstance(cache, nbx.KVCache):
            raise TypeError(f"{op}: cache must be an nbx.KVCache (model.new_kv_cache), got "
                            f"{type(cache).__name__}")
        c = self.cfg
        if (cache.num_layers, cache.batch, cache.num_kv_heads, cache.head_dim) != \
                (c.num_hidden_layers, tokens_t.shape[0], c.num_key_value_heads, c.head_dim) \
                or cache.dtype != self.dtype or cache.device != self.device:
            raise ValueError(f"{op}: cache {cache!r} does not fit this model and batch "
                             f"{tokens_t.shape[0]} ({self.dtype.name} on {self.device})")

    def decode_step(self, tokens_t, positions_t, cache, fused: bool = True):
        """One decode step: tokens_t (B, 1) at positions_t (B, 1) (device tensors, read on
        the device) appended to `cache`; returns the logits (B, vocab). Capturable: nothing
        is read back to the host and every launch's shape depends on (B, capacity) only.
        fused=False runs the same step with the unfused ops (for comparison)."""
        self._check_step_args(tokens_t, positions_t, cache, "decode_step")
        if tokens_t.shape[1] != 1:
            raise ValueError(f"decode_step: one token per sequence, got tokens_t "
                             f"{tuple(tokens_t.shape)} (use prefill)")
        return self._step(tokens_t, positions_t, cache, fused)

    def prefill(self, tokens_t, positions_t, cache, fused: bool = True, last=None):
        """Prompts tokens_t (B, T) into an empty `cache` (positions_t must be 0..T-1 in every
        row: causal attention over the first T slots); returns the last token's logits (B, V).
        last: optional (B,) int64 device tensor, the row of tokens_t.reshape(B * T) whose
        logits each sequence returns (a prompt padded on the right: its last real token)."""
        self._check_step_args(tokens_t, positions_t, cache, "prefill")
        if last is not None and (not isinstance(last, nbx.Tensor) or last.shape != (tokens_t.shape[0],)
                                 or last.dtype is not nbx.int64 or last.device != self.device):
            raise ValueError(f"prefill: last must be a ({tokens_t.shape[0]},) int64 tensor on "
                             f"{self.device}, got {last!r:.80}")
        return self._step(tokens_t, positions_t, cache, fused, last)

    def _step(self, tokens, positions, cache, fused, last=None):
        cfg, w = self.cfg, self.w
        B, T = tokens.shape
        Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        nq, nk = Hq * D, Hkv * D
        eps = cfg.rms_norm_eps
        x = O.embedding(tokens.reshape(B * T), w["embed"])
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        for i, L in enumerate(w["layers"]):
            fz = fused and self.fused[i]
            if fz and T == 1:   # [decode] RMSNorm + QKV GEMV + RoPE + cache append: one kernel
                q = O.decode_qkv_rope(x, L["wqkv"], cache, i, positions, num_heads=Hq,
                                     norm_weight=L["attn_norm"], eps=eps, bias=L.get("bqkv"),
                                     theta=cfg.rope_theta, scaling=cfg.rope_scaling or None)
            else:
                if fz:        # RMSNorm + QKV (+ bias) in one GEMV
                    qkv = O.decode_linear(x, L["wqkv"], norm_weight=L["attn_norm"], eps=eps,
                                         bias=L.get("bqkv"))
                    q, k, v = qkv[:, :nq], qkv[:, nq:nq + nk], qkv[:, nq + nk:]
                else:
                    h = O.rms_norm(x, L["attn_norm"], eps)
                    q, k, v = (O.linear(h, L["wq"], L.get("bq")),
                               O.linear(h, L["wk"], L.get("bk")), O.linear(h, L["wv"], L.get("bv")))
                    q, k = _qk_norm(L, q, k, eps)
                q = q.view(B, T, Hq, D).transpose(1, 2)
                k = k.view(B, T, Hkv, D).transpose(1, 2)
                v = v.view(B, T, Hkv, D).transpose(1, 2)
                # RoPE on q (in place) and k, fused with the cache write at the device positions
                cache.append_rope(i, q, k, v, positions, theta=cfg.rope_theta,
                                  scaling=cfg.rope_scaling or None)
            kl, vl, lengths = cache.view(i)
            if T == 1:     # decode: attention length read on the device
                a = nbx.decode_attention(q, kl, vl, lengths)              # (B, Hq, 1, D)
            else:          # prefill into an empty cache: causal over the first T slots
                a = O.attention(q.contiguous(), kl[:, :, :T], vl[:, :, :T], causal=True)
            a = a.transpose(1, 2).reshape(B * T, Hq * D)
            if fz:        # o_proj and down_proj add the residual in their epilogue
                x = self._reduced(O.decode_linear(a, L["wo"], residual=self._residual(x)))
                f = O.decode_linear(x, L["w_gateup"], norm_weight=L["ffn_norm"], eps=eps, glu=True)
                x = self._reduced(O.decode_linear(f, L["w_down"], residual=self._residual(x)))
            else:
                x = self._combine(x, O.linear(a, L["wo"]))
                h = O.rms_norm(x, L["ffn_norm"], eps)
                x = self._combine(x, self._mlp(L, h))
        if T > 1:    # each sequence's last token (`last`: its row, when the prompt is padded)
            x = x.reshape(B, T, -1)[:, T - 1] if last is None else \
                nbx.index_select(x.reshape(B * T, -1), 0, last)
        if fused and self.fused_head:
            # final RMSNorm fused into the lm_head; fp32 logits (bf16 rounding would create
            # false argmax ties over tens of thousands of entries)
            return self._logits(O.decode_linear(x, w["lm_head"], norm_weight=w["norm"], eps=eps,
                                               out_dtype=nbx.float32))
        x = O.rms_norm(x, w["norm"], eps)
        if isinstance(w["lm_head"], O.QuantWeight) and x.dtype is not nbx.float32:
            x = x.to(nbx.float32)     # as forward: fp32 logits for the quantised head
        return self._logits(O.linear(x, w["lm_head"]))

    # The seams a sharded model (distributed.tensor_parallel) overrides; here one process
    # holds every weight: a block half's output joins the residual stream by an add, the
    # fused epilogues add the residual themselves, and the logits are whole.
    def _combine(self, x, partial):
        return O.add(x, partial)

    def _residual(self, x):
        return x

    def _reduced(self, y):
        return y

    def _logits(self, y):
        return y

    # ------------------------------------------------------------ paged KV cache [paged]
    def new_paged_cache(self, num_blocks: int, block_size: int = 16):
        c = self.cfg
        return nbx.PagedKVCache(num_blocks, block_size, c.num_hidden_layers,
                                c.num_key_value_heads, c.head_dim, dtype=self.dtype,
                                device=self.device)

    def forward_paged(self, tokens_t, positions_t, cache):
        """tokens_t (B, T) at positions_t (B, T) (device int tensors; each row's positions
        continue its sequence: lengths[b] .. lengths[b] + T - 1) appended to the
        nbx.PagedKVCache `cache` (its block tables give each sequence its pages, so the
        rows may hold sequences of different lengths); returns the last token's logits
        (B, vocab) in float32. The unfused ops, with paged decode attention (T query tokens,
        bottom-right causal, so a prompt's prefill is the same call)."""
        cfg, w = self.cfg, self.w
        if not isinstance(cache, nbx.PagedKVCache):
            raise TypeError(f"forward_paged: cache must be an nbx.PagedKVCache, got "
                            f"{type(cache).__name__}")
        B, T = tokens_t.shape
        if cache.batch != B or cache.dtype != self.dtype or cache.device != self.device:
            raise ValueError(f"forward_paged: cache {cache!r} with batch {cache.batch} does "
                             f"not fit tokens_t {tuple(tokens_t.shape)} ({self.dtype.name} on "
                             f"{self.device})")
        Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        rope = dict(theta=cfg.rope_theta, scaling=cfg.rope_scaling or None)
        x = O.embedding(tokens_t.reshape(B * T), w["embed"])
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        for i, L in enumerate(w["layers"]):
            h = O.rms_norm(x, L["attn_norm"], eps)
            q, k = _qk_norm(L, O.linear(h, L["wq"], L.get("bq")),
                            O.linear(h, L["wk"], L.get("bk")), eps)
            v = O.linear(h, L["wv"], L.get("bv"))
            q = nbx.apply_rotary_emb(q.view(B, T, Hq, D).transpose(1, 2).contiguous(),
                                     positions_t, **rope)
            k = nbx.apply_rotary_emb(k.view(B, T, Hkv, D).transpose(1, 2).contiguous(),
                                     positions_t, **rope)
            cache.append(i, k, v.view(B, T, Hkv, D).transpose(1, 2).contiguous(), positions_t)
            kp, vp, bt, lengths = cache.view(i)
            a = nbx.paged_decode_attention(q, (kp, vp), bt, lengths)
            x = O.add(x, O.linear(a.transpose(1, 2).reshape(B * T, Hq * D), L["wo"]))
            x = O.add(x, self._mlp(L, O.rms_norm(x, L["ffn_norm"], eps)))
        x = x.reshape(B, T, -1)[:, T - 1]
        x = O.rms_norm(x, w["norm"], eps)
        return O.linear(x.to(nbx.float32) if x.dtype is not nbx.float32 and
                        isinstance(w["lm_head"], O.QuantWeight) else x, w["lm_head"])

    def generate_batch(self, prompts, max_new_tokens=32, **kw):
        from .generate import generate_batch
        return generate_batch(self, prompts, max_new_tokens=max_new_tokens, **kw)
    # [/paged]

    def _mlp(self, L, h):
        """The feed-forward block of layer L on the normed states h (tokens, hidden); the
        MoE models (models/moe.py) put their experts here."""
        return O.linear(O.silu_mul(O.linear(h, L["w_gate"]), O.linear(h, L["w_up"])), L["w_down"])

    def generate(self, prompt_ids, max_new_tokens=32, **kw):
        from .generate import generate
        return generate(self, prompt_ids, max_new_tokens=max_new_tokens, **kw)


def _has_quant(weights) -> bool:
    return any(isinstance(w, O.QuantWeight) for L in weights["layers"] for w in L.values()) \
        or isinstance(weights["embed"], O.QuantWeight)


def _qk_norm(L, q, k, eps):
    """RMSNorm of the q and k projections (tokens, heads*D) where the layer has one:
    per head (Qwen3, a (D,) weight) or over the whole projection (OLMoE); the weight's
    length says which."""
    if L.get("q_norm") is None:
        return q, k

    def norm(t, w):
        return O.rms_norm(t.reshape(-1, w.shape[0]), w, eps).reshape(t.shape)
    return norm(q, L["q_norm"]), norm(k, L["k_norm"])


# [int4] GPTQ / AWQ folders: config.json's quantization_config and the packed tensors
def _int4_config(folder):
    """None for a float checkpoint, else {"format", "group_size"}; refuses what the int4
    kernels do not read (bits != 4, GPTQ v2 zeros, AWQ's GEMV-packed layout)."""
    from .config import read_json
    path = os.path.join(folder, "config.json")
    q = read_json(path, "config.json").get("quantization_config")
    if q is None:
        return None
    method = q.get("quant_method")
    if method not in ("gptq", "awq"):
        raise ValueError(f"{path}: quantization_config.quant_method {method!r} is not "
                         f"supported (gptq or awq)")
    bits = q.get("bits", q.get("w_bit"))
    if bits != 4:
        raise ValueError(f"{path}: quantization_config bits {bits!r}: only 4 is supported")
    gs = q.get("group_size", q.get("q_group_size", 128))
    if method == "gptq" and q.get("checkpoint_format", "gptq") != "gptq":
        raise ValueError(f"{path}: GPTQ checkpoint_format {q.get('checkpoint_format')!r}: only "
                         f"'gptq' (zeros stored minus one) is supported")
    if method == "awq" and str(q.get("version", "gemm")).lower() != "gemm":
        raise ValueError(f"{path}: AWQ version {q.get('version')!r}: only 'gemm' is supported")
    return {"format": method, "group_size": gs}


def _int4_weight(index, prefix, qcfg, dev):
    """nbx.QuantizedTensor from `prefix`qweight / qzeros / scales (/ g_idx)."""
    def t(suffix, required=True):
        f = index.get(prefix + suffix)
        if f is None:
            if required:
                raise KeyError(f"tensor {prefix + suffix!r} not found (an int4 layer needs "
                               f"qweight, qzeros and scales)")
            return None
        return nbx.from_numpy(np.ascontiguousarray(f.get_numpy(prefix + suffix))).to(dev)
    return nbx.QuantizedTensor(t("qweight"), t("scales"), t("qzeros"),
                               group_size=qcfg["group_size"], format=qcfg["format"],
                               g_idx=t("g_idx", False) if qcfg["format"] == "gptq" else None)


def _staging(dev, total_bytes=None):
    """[staging] An Uploader on cuda (closed = synchronised at the end of the with), else None."""
    if dev.type != "cuda":
        return contextlib.nullcontext(None)
    from ..io.staging import Uploader
    return Uploader(dev, total_bytes=total_bytes)


def _load_start(device, dtype):
    """(start time, device, dtype) of a load: dtype=None computes in bfloat16 on cuda and in
    float32 elsewhere (from_gguf's docstring says why)."""
    t0 = time.perf_counter()
    dev = as_device(device)
    return t0, dev, nbx.dtypes.as_dtype(dtype) if dtype is not None else (
        nbx.bfloat16 if dev.type == "cuda" else nbx.float32)


def _open_hf_folder(folder, config_class):
    """(config, safetensors files, their tensor index, progress) of an HF folder."""
    from ..io.safetensors import open_folder
    cfg = config_class.from_folder(folder)
    return (cfg, *open_folder(folder))


def _host_weight(folder, files, index, prog, name, required=True, shape=None):
    """The host array of float weight `name` of an HF folder (open_folder's files, index and
    progress), or None where it is absent and not `required`; `shape`, where given, is the
    one it must have."""
    f = index.get(name)
    if f is None:
        if required:
            raise KeyError(f"{folder}: tensor {name!r} not found in {len(files)} "
                           f"safetensors file(s)")
        return None
    a = _float_weight(f, name)
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{folder}: tensor {name!r} has shape {tuple(a.shape)}, "
                         f"expected {tuple(shape)}")
    prog.update(a.nbytes)
    return a


def _hf_head_weights(cfg, get):
    """The weights dict of an HF checkpoint with the embedding, final norm and head (the
    embedding itself where tied or absent) and no layers yet; get(name, required=...)."""
    w = {"embed": get("model.embed_tokens.weight"), "norm": get("model.norm.weight"),
         "layers": []}
    lm = None if cfg.tie_word_embeddings else get("lm_head.weight", required=False)
    w["lm_head"] = lm if lm is not None else w["embed"]
    return w


def _float_weight(f, name) -> np.ndarray:
    """The host array of safetensors tensor `name`, refused unless it is stored as a float:
    an integer or bool tensor where a weight belongs is a broken file, and casting it to
    the compute dtype would run the model on garbage."""
    dt, _ = f.info(name)
    if not dt.is_floating_point:
        raise ValueError(f"safetensors {f.path!r}: tensor {name!r} is stored as "
                         f"{dt.safetensors}, expected a float weight (F32, F16, BF16, ...)")
    return f.get_numpy(name)


# the file's names of the weights, for the messages of _check_weight_shapes
_GGUF_NAMES = {"embed": "token_embd.weight", "norm": "output_norm.weight",
               "lm_head": "output.weight", "attn_norm": "attn_norm.weight",
               "ffn_norm": "ffn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight",
               "wv": "attn_v.weight", "wo": "attn_output.weight", "w_gate": "ffn_gate.weight",
               "w_up": "ffn_up.weight", "w_down": "ffn_down.weight", "bq": "attn_q.bias",
               "bk": "attn_k.bias", "bv": "attn_v.bias", "layer": "blk.{}."}
_HF_NAMES = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight",
             "lm_head": "lm_head.weight", "attn_norm": "input_layernorm.weight",
             "ffn_norm": "post_attention_layernorm.weight", "wq": "self_attn.q_proj.weight",
             "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
             "wo": "self_attn.o_proj.weight", "w_gate": "mlp.gate_proj.weight",
             "w_up": "mlp.up_proj.weight", "w_down": "mlp.down_proj.weight",
             "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias",
             "bv": "self_attn.v_proj.bias", "layer": "model.layers.{}."}


def _check_weight_shapes(cfg, w, where: str, names: dict) -> None:
    """Every weight has the shape the config implies (as llama.cpp and HF check at load): a
    config that lies about a size (vocab_size 10**20 beside a 16-row embedding) is refused
    by name here, not accepted with the weights' sizes or met as a view error mid-forward."""
    H, V, F = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    want = {"embed": (V, H), "norm": (H,), "lm_head": (V, H)}
    per_layer = {"attn_norm": (H,), "ffn_norm": (H,), "wq": (q, H), "wk": (kv, H),
                 "wv": (kv, H), "wo": (H, q), "w_gate": (F, H), "w_up": (F, H),
                 "w_down": (H, F), "bq": (q,), "bk": (kv,), "bv": (kv,)}
    checks = [(names[k], w[k], s) for k, s in want.items() if w.get(k) is not None]
    for i, L in enumerate(w["layers"]):
        checks += [(names["layer"].format(i) + names[k], L[k], s)
                   for k, s in per_layer.items() if L.get(k) is not None]
    for name, t, shape in checks:
        got = tuple(getattr(t, "shape", ()))
        if getattr(t, "dtype", None) is nbx.uint8 and len(got) == 2 == len(shape):
            got, shape = got[:1], shape[:1]     # raw quantised blocks: rows are the weight's
        if got != shape:
            raise ValueError(f"{where}: tensor {name!r} has shape {got}, but the config "
                             f"(hidden {H}, vocab {V}, intermediate {F}, "
                             f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads of "
                             f"{cfg.head_dim}) needs {shape}")


def _to_device(a: np.ndarray, dtype, dev, up=None, name=None):
    """A host array -> a tensor of `dtype` on `dev` (zero-copy when nothing changes on cpu).
    With an Uploader `up` ([staging], cuda) the bytes go through its pinned ring."""
    if up is not None:
        return up.upload(a if a.dtype == dtype.np else np.asarray(a, dtype=dtype.np), name)
    t = nbx.from_numpy(a if a.flags.c_contiguous else np.ascontiguousarray(a))
    if t.dtype is not dtype:
        # host-side cast (the model's dtype conversion happens once at load)
        t = nbx.from_numpy(np.asarray(a, dtype=dtype.np))
    return t if dev.type == "cpu" else t.to(dev)
