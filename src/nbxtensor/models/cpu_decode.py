"""The Llama-family step on cpu with GGUF weights kept quantised (backends/cpu/quant.py).

`CpuPlan(model)` gathers, once, each layer's weights as NumPy arrays: quantised weights
as (blocks, qtype, K), Q/K/V and gate/up concatenated by block rows where they share one
format (one GEMV each), float weights as float32 arrays. `CpuPlan.forward` runs
`LlamaModel.forward`'s contract on them with a few compiled calls per layer and no Tensor
ops in between (on this CPU the per-op cost of the Tensor path, not the arithmetic, was
most of a decode step):

  rms_norm -> QKV GEMV (+ bias) -> RoPE + cache write + attention -> o_proj GEMV + residual
  -> rms_norm -> gate/up GEMV -> silu * up -> down GEMV + residual

Decode (up to GEMV_ROWS tokens) reads the blocks in the GEMV kernels; longer prompts
dequantise each weight once per call into a reused float32 buffer and multiply through
NumPy's BLAS. Layers this plan does not cover (q/k norms, MoE blocks) make `supports`
False and the model keeps the Tensor path.
"""
from __future__ import annotations

import numpy as np

import nbxtensor as nbx
from . import _ops as O

__all__ = ["CpuPlan", "GEMV_ROWS"]

# rows (tokens) up to which a projection runs as the quantised GEMV; above, dequantise +
# BLAS (the GEMV re-reads the blocks per row; BLAS amortises one dequantisation over many)
GEMV_ROWS = 4


def _weight(w):
    """(blocks, qtype, K) for a cpu QuantWeight, a float32 array for a plain tensor."""
    if isinstance(w, O.QuantWeight):
        return (np.ascontiguousarray(w.blocks.numpy()), w.qtype, w.shape[1])
    return np.ascontiguousarray(w.numpy(), dtype=np.float32)


def _cat(ws):
    """Row concatenation of weights of one kind, else None."""
    if all(isinstance(w, tuple) for w in ws) and len({(w[1], w[2]) for w in ws}) == 1:
        return (np.concatenate([w[0] for w in ws]), ws[0][1], ws[0][2])
    if all(isinstance(w, np.ndarray) for w in ws):
        return np.concatenate(ws)
    return None


def _rows(w):
    return w[0].shape[0] if isinstance(w, tuple) else w.shape[0]


class CpuPlan:
    @staticmethod
    def supports(model) -> bool:
        keys = {"attn_norm", "ffn_norm", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down",
                "bq", "bk", "bv", "wqkv", "w_gateup"}
        return model.device.type == "cpu" and model.dtype is nbx.float32 and \
            type(model)._mlp is _base_mlp() and \
            all(set(L) <= keys and L.get("q_norm") is None for L in model.w["layers"])

    def __init__(self, model):
        from ..backends.cpu import quant as Q
        self.Q = Q
        w = model.w
        self.cfg = model.cfg
        self.embed, self.head = _weight(w["embed"]), _weight(w["lm_head"])
        self.norm = _weight(w["norm"])
        self.layers = []
        big = 0
        for L in w["layers"]:
            q, k, v = _weight(L["wq"]), _weight(L["wk"]), _weight(L["wv"])
            g, u = _weight(L["w_gate"]), _weight(L["w_up"])
            P = {"attn_norm": _weight(L["attn_norm"]), "ffn_norm": _weight(L["ffn_norm"]),
                 "qkv": _cat([q, k, v]), "gateup": _cat([g, u]), "wo": _weight(L["wo"]),
                 "down": _weight(L["w_down"]), "qkv_parts": (q, k, v), "gu_parts": (g, u)}
            if L.get("bq") is not None:
                P["bqkv"] = np.concatenate([_weight(L[n]) for n in ("bq", "bk", "bv")])
            for x in (P["qkv"], P["gateup"], P["wo"], P["down"], q, k, v, g, u):
                if isinstance(x, tuple):
                    big = max(big, x[0].shape[0] * x[2])
            self.layers.append(P)
        self._scratch = np.empty(big, np.float32)   # the dequantised weight of a prefill

    # --------------------------------------------------------------------------- pieces
    def _lin(self, x, w, residual=None):
        """x (M, K) @ w.T (+ residual, written in place into residual)."""
        if isinstance(w, tuple):
            blocks, qtype, K = w
            if x.shape[0] <= GEMV_ROWS:
                return self.Q.quant_linear(x, blocks, qtype, out=residual, residual=residual)
            n = blocks.shape[0] * K
            W = self.Q.dequantize(blocks, qtype, K,
                                  out=self._scratch[:n].reshape(blocks.shape[0], K)
                                  if n <= self._scratch.size else None)
        else:
            W = w
        y = x @ W.T
        if residual is not None:
            residual += y
            return residual
        return y

    def _lin_parts(self, x, joined, parts):
        if joined is not None:
            return self._lin(x, joined)
        return np.concatenate([self._lin(x, p) for p in parts], axis=1)

    def _embed(self, ids):
        if isinstance(self.embed, tuple):
            blocks, qtype, K = self.embed
            return self.Q.dequantize_rows(blocks, qtype, K, ids)
        bad = (ids < 0) | (ids >= self.embed.shape[0])
        if bad.any():
            raise IndexError(f"embedding: id {int(ids[bad][0])} is out of range for a table "
                             f"of {self.embed.shape[0]} rows")
        return self.embed[ids].copy()

    # --------------------------------------------------------------------------- forward
    def forward(self, model, ids: np.ndarray, cache, all_logits: bool):
        """LlamaModel.forward on host int64 ids (T,): float32 logits, an nbx Tensor."""
        Q, cfg = self.Q, self.cfg
        T, pos = ids.shape[0], cache.pos
        if pos + T > cache.capacity:
            raise ValueError(f"forward: {pos} cached + {T} new tokens exceed the KV cache's "
                             f"capacity {cache.capacity}")
        eps, Hq = cfg.rms_norm_eps, cfg.num_attention_heads
        cos = model._cos.numpy()[pos:pos + T]
        sin = model._sin.numpy()[pos:pos + T]
        x = self._embed(ids)
        for i, P in enumerate(self.layers):
            h = Q.rms_norm(x, P["attn_norm"], eps)
            qkv = self._lin_parts(h, P["qkv"], P["qkv_parts"])
            if "bqkv" in P:
                qkv += P["bqkv"]
            a = Q.rope_attend(qkv, cos, sin, cache.k[i].numpy()[0], cache.v[i].numpy()[0],
                              pos, Hq)
            x = self._lin(a, P["wo"], residual=x)
            h = Q.rms_norm(x, P["ffn_norm"], eps)
            f = Q.silu_mul(self._lin_parts(h, P["gateup"], P["gu_parts"]))
            x = self._lin(f, P["down"], residual=x)
        cache.advance(T)
        if not all_logits:
            x = x[T - 1:T]
        x = Q.rms_norm(np.ascontiguousarray(x), self.norm, eps)
        logits = nbx.from_numpy(self._lin(x, self.head))
        return logits if all_logits else logits[0]


def _base_mlp():
    from .llama import LlamaModel
    return LlamaModel._mlp
