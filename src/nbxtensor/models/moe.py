"""Mixture-of-experts decoders from HF folders: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE.

Each is the Llama decoder (models/llama.py: attention, RoPE, KV caches, the eager and the
device-side step, generation) with a MoE block in place of the MLP, run by
`nbx.nn.functional.fused_moe`:

| model_type  | router                                   | experts (HF names)                 | extras |
|---|---|---|---|
| mixtral     | softmax top-k, renormalised              | block_sparse_moe.experts.j.w1/w3/w2 (gate/up/down) | - |
| qwen2_moe   | softmax top-k, norm_topk_prob            | mlp.experts.j.gate/up/down_proj    | shared expert with a sigmoid gate; q/k/v bias; dense layers (decoder_sparse_step, mlp_only_layers) |
| qwen3_moe   | softmax top-k, norm_topk_prob            | mlp.experts.j.gate/up/down_proj    | q_norm/k_norm per head; dense layers |
| olmoe       | softmax top-k, norm_topk_prob (false)    | mlp.experts.j.gate/up/down_proj    | q_norm/k_norm over the whole projection |

The experts' weights are stacked at load into fused_moe's layout: w1 (E, 2*I, H), the
gate rows then the up rows, and w2 (E, H, I). Refused: sliding-window attention
(Qwen's use_sliding_window; a Mixtral sliding_window caps the context instead, since
within the window the attention is the full one) and OLMoE's clip_qkv.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

import nbxtensor as nbx
from . import _ops as O
from .config import LlamaConfig, _is_int, _Keys, read_json
from .llama import (LlamaModel, _hf_head_weights, _host_weight, _load_start, _open_hf_folder,
                    _staging, _to_device)

__all__ = ["MoeConfig", "MoeModel", "MOE_TYPES", "is_moe_config"]

MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
_ARCHS = {"MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe",
          "Qwen3MoeForCausalLM": "qwen3_moe", "OlmoeForCausalLM": "olmoe"}


def moe_type_of(cfg: dict):
    """The MoE model type a config.json describes (model_type, else architectures), or None."""
    mt = cfg.get("model_type")
    if mt in MOE_TYPES:
        return mt
    archs = cfg.get("architectures")
    if isinstance(archs, list):
        for a in archs:
            if a in _ARCHS:
                return _ARCHS[a]
    return None


def is_moe_config(cfg: dict) -> bool:
    return moe_type_of(cfg) is not None


@dataclass
class MoeConfig(LlamaConfig):
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    shared_expert_intermediate_size: int = 0
    sparse_layers: list = field(default_factory=list)
    qk_norm: str | None = None          # "head" (Qwen3) or "full" (OLMoE)

    @classmethod
    def from_hf(cls, cfg: dict, where: str = "config.json") -> "MoeConfig":
        mt = moe_type_of(cfg)
        if mt is None:
            raise ValueError(f"{where}: model_type {cfg.get('model_type')!r} / architectures "
                             f"{cfg.get('architectures')!r} is not a MoE decoder; supported: "
                             f"{', '.join(MOE_TYPES)}")
        k = _Keys(cfg, where, mt)
        if k("use_sliding_window", "bool", False):
            raise ValueError(f"{where}: use_sliding_window is true; sliding-window attention "
                             f"is not supported")
        if k("clip_qkv", "number", None) is not None:
            raise ValueError(f"{where}: clip_qkv is set; OLMoE's q/k/v clipping is not "
                             f"supported")
        act = k("hidden_act", "str", "silu")
        if act != "silu":
            raise ValueError(f"{where}: hidden_act {act!r} is not supported (only 'silu')")
        base = LlamaConfig.from_hf({**cfg, "model_type": "llama",
                                    "attention_bias": k("attention_bias", "bool",
                                                        mt == "qwen2_moe")}, where)
        n_exp_key = "num_local_experts" if mt == "mixtral" else "num_experts"
        E = k(n_exp_key, "int", positive=True)
        topk = k("num_experts_per_tok", "int", positive=True)
        if topk > E:
            raise ValueError(f"{where}: num_experts_per_tok {topk} exceeds {n_exp_key} {E}")
        moe_I = (base.intermediate_size if mt in ("mixtral", "olmoe")
                 else k("moe_intermediate_size", "int", positive=True))
        L = base.num_hidden_layers
        if mt in ("qwen2_moe", "qwen3_moe"):
            step = k("decoder_sparse_step", "int", 1, positive=True)
            only = cfg.get("mlp_only_layers") or []
            if not isinstance(only, list) or not all(_is_int(i) for i in only):
                raise ValueError(f"{where}: mlp_only_layers must be a list of layer indices, "
                                 f"got {only!r:.80}")
            sparse = [i for i in range(L) if i not in only and (i + 1) % step == 0]
        else:
            sparse = list(range(L))
        fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
        fields["model_type"] = mt
        window = k("sliding_window", "int", None, positive=True) if mt == "mixtral" else None
        if window is not None:
            fields["max_position_embeddings"] = min(base.max_position_embeddings, window)
        return cls(**fields, num_experts=E, num_experts_per_tok=topk,
                   moe_intermediate_size=moe_I,
                   norm_topk_prob=True if mt == "mixtral" else
                   k("norm_topk_prob", "bool", False),
                   shared_expert_intermediate_size=k("shared_expert_intermediate_size", "int",
                                                     0) if mt == "qwen2_moe" else 0,
                   sparse_layers=sparse,
                   qk_norm={"qwen3_moe": "head", "olmoe": "full"}.get(mt))

    @classmethod
    def from_folder(cls, folder) -> "MoeConfig":
        path = os.path.join(folder, "config.json")
        return cls.from_hf(read_json(path, "config.json"), path)


class MoeModel(LlamaModel):
    """A Llama-family decoder whose MLPs are (some or all) mixtures of experts."""

    def _prepare_fused(self) -> None:
        # the fused decode GEMVs take dense layers only; the MoE step runs the unfused path
        self.fused = [False] * len(self.w["layers"])
        self.fused_head = isinstance(self.w["lm_head"], nbx.Tensor) and self.w["lm_head"].ndim == 2

    def _mlp(self, L, h):
        m = L.get("moe")
        if m is None:
            return super()._mlp(L, h)
        c = self.cfg
        return nbx.nn.functional.fused_moe(
            h, m["w1"], m["w2"], O.linear(h, m["gate"]), c.num_experts_per_tok,
            renormalize=c.norm_topk_prob, shared_w1=m.get("shared_w1"),
            shared_w2=m.get("shared_w2"), shared_expert_gate=m.get("shared_gate"))

    @classmethod
    def from_folder(cls, folder, device="cpu", dtype=None):
        """Load an HF folder: config.json, *.safetensors (sharded or not), tokenizer.json."""
        from .tokenizer import Tokenizer
        t0, dev, dtype = _load_start(device, dtype)
        cfg, files, index, prog = _open_hf_folder(folder, MoeConfig)

        def host(name, shape=None, required=True):
            return _host_weight(folder, files, index, prog, name, required, shape)

        with _staging(dev, prog.total) as up:
            def get(name, shape=None, required=True):
                a = host(name, shape, required)
                return None if a is None else _to_device(a, dtype, dev, up, name)

            def stacked(names, name):
                a = np.stack([np.concatenate([host(n, s) for n, s in row]) if len(row) > 1
                              else host(*row[0]) for row in names]).astype(dtype.np, copy=False)
                return _to_device(a, dtype, dev, up, name)

            H = cfg.hidden_size
            Iq, Ik = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
            w = _hf_head_weights(cfg, get)
            for i in range(cfg.num_hidden_layers):
                p = f"model.layers.{i}."
                L = {"attn_norm": get(p + "input_layernorm.weight"),
                     "ffn_norm": get(p + "post_attention_layernorm.weight"),
                     "wq": get(p + "self_attn.q_proj.weight", (Iq, H)),
                     "wk": get(p + "self_attn.k_proj.weight", (Ik, H)),
                     "wv": get(p + "self_attn.v_proj.weight", (Ik, H)),
                     "wo": get(p + "self_attn.o_proj.weight", (H, Iq))}
                if cfg.attention_bias:
                    for n in "qkv":
                        L[f"b{n}"] = get(p + f"self_attn.{n}_proj.bias")
                if cfg.qk_norm is not None:
                    hd = cfg.head_dim
                    L["q_norm"] = get(p + "self_attn.q_norm.weight",
                                      (hd,) if cfg.qk_norm == "head" else (Iq,))
                    L["k_norm"] = get(p + "self_attn.k_norm.weight",
                                      (hd,) if cfg.qk_norm == "head" else (Ik,))
                if i in cfg.sparse_layers:
                    L["moe"] = cls._load_moe(cfg, p, get, stacked)
                else:
                    F = cfg.intermediate_size
                    L["w_gate"] = get(p + "mlp.gate_proj.weight", (F, H))
                    L["w_up"] = get(p + "mlp.up_proj.weight", (F, H))
                    L["w_down"] = get(p + "mlp.down_proj.weight", (H, F))
                w["layers"].append(L)
        prog.close()
        tok = Tokenizer.from_folder(folder, cfg.eos_token_ids)
        m = cls(cfg, w, tok, dev, dtype)
        m.load_seconds = time.perf_counter() - t0
        return m

    @staticmethod
    def _load_moe(cfg, p, get, stacked):
        H, E, I = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
        if cfg.model_type == "mixtral":
            q = p + "block_sparse_moe."
            names = ("w1", "w3", "w2")
        else:
            q = p + "mlp."
            names = ("gate_proj", "up_proj", "down_proj")
        g, u, d = (tuple(f"{q}experts.{j}.{n}.weight" for j in range(E)) for n in names)
        m = {"gate": get(q + "gate.weight", (E, H)),
             "w1": stacked([((g[j], (I, H)), (u[j], (I, H))) for j in range(E)], q + "w1"),
             "w2": stacked([((d[j], (H, I)),) for j in range(E)], q + "w2")}
        Is = cfg.shared_expert_intermediate_size
        if Is:
            s = q + "shared_expert."
            m["shared_w1"] = stacked([((s + "gate_proj.weight", (Is, H)),
                                       (s + "up_proj.weight", (Is, H)))], s + "w1")[0]
            m["shared_w2"] = get(s + "down_proj.weight", (H, Is))
            m["shared_gate"] = get(q + "shared_expert_gate.weight", (1, H))
        return m
