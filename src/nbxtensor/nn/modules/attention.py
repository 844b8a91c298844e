"""MultiheadAttention (torch.nn's layout: in_proj_weight / in_proj_bias / out_proj, or
q/k/v_proj_weight when kdim or vdim differ from embed_dim)."""
from __future__ import annotations

import math

from .. import init
from ... import dtypes as _dt
from ... import ops as _ops
from ...tensor import Tensor
from .._compose import dropout as _dropout
from ._factory import param
from .linear import NonDynamicallyQuantizableLinear
from .module import Module

__all__ = ["MultiheadAttention"]


def _additive(mask, dtype, argname):
    """A bool mask (True = do not attend) as 0 / -inf in `dtype`; a float mask as is."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"MultiheadAttention: {argname} must be a Tensor, got "
                        f"{type(mask).__name__}")
    if mask.dtype is _dt.bool:
        return _ops.where(mask, float("-inf"), 0.0).to(dtype)
    if not mask.dtype.is_floating_point:
        raise TypeError(f"MultiheadAttention: only bool and floating types of {argname} are "
                        f"supported, got {mask.dtype.name}")
    return mask.to(dtype)


class MultiheadAttention(Module):
    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None):
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads} instead")
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise ValueError("embed_dim must be divisible by num_heads")
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = param((embed_dim, embed_dim), device, dtype)
            self.k_proj_weight = param((embed_dim, self.kdim), device, dtype)
            self.v_proj_weight = param((embed_dim, self.vdim), device, dtype)
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = param((3 * embed_dim, embed_dim), device, dtype)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = param((3 * embed_dim,), device, dtype)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias,
                                                        device=device, dtype=dtype)
        if add_bias_kv:
            self.bias_k = param((1, 1, embed_dim), device, dtype)
            self.bias_v = param((1, 1, embed_dim), device, dtype)
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use "
                               "the Transformer module method `generate_square_subsequent_mask`"
                               " to create this mask.")
        batched = query.ndim == 3
        query, key, value, key_padding_mask = self._seq_first(query, key, value,
                                                              key_padding_mask, batched)
        L, N, E = query.shape
        H, hd, dt = self.num_heads, self.head_dim, query.dtype
        q, k, v = self._project(query, key, value)
        mask = self._attn_mask(attn_mask, dt, L, N, key.shape[0])
        kpm = None
        if key_padding_mask is not None:
            kpm = _additive(key_padding_mask, dt, "key_padding_mask")
            if tuple(kpm.shape) != (N, key.shape[0]):
                raise ValueError(f"expecting key_padding_mask shape of {(N, key.shape[0])}, but "
                                 f"got {tuple(kpm.shape)}")

        def pad_masks():
            nonlocal mask, kpm
            if mask is not None:
                mask = _ops.pad(mask, (0, 1))
            if kpm is not None:
                kpm = _ops.pad(kpm, (0, 1))

        if self.bias_k is not None:
            k = _ops.cat([k, self.bias_k.expand(1, N, E)])
            v = _ops.cat([v, self.bias_v.expand(1, N, E)])
            pad_masks()
        S = k.shape[0]
        # (len, N, E) -> (N, H, len, hd)
        q = q.reshape(L, N, H, hd).permute(1, 2, 0, 3)
        k = k.reshape(S, N, H, hd).permute(1, 2, 0, 3)
        v = v.reshape(S, N, H, hd).permute(1, 2, 0, 3)
        if self.add_zero_attn:
            k = _ops.pad(k, (0, 0, 0, 1))
            v = _ops.pad(v, (0, 0, 0, 1))
            S += 1
            pad_masks()
        full = None    # every mask as one additive (N, H, L, S) (or broadcastable) tensor
        if mask is not None:
            full = mask.reshape(N, H, L, S) if mask.shape[0] != 1 else mask.reshape(1, 1, L, S)
        if kpm is not None:
            k4 = kpm.reshape(N, 1, 1, S)
            full = k4 if full is None else full + k4
        out, weights = self._attend(q, k, v, full, need_weights)
        out = out.permute(2, 0, 1, 3).reshape(L, N, E)
        out = self.out_proj(out)
        if self.batch_first and batched:
            out = out.transpose(0, 1)
        if not batched:
            out = out.squeeze(1)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(1)
        if not batched:
            weights = weights.squeeze(0)
        return out, weights

    def _seq_first(self, query, key, value, key_padding_mask, batched):
        """The inputs as (len, N, E), checked; an unbatched call gains N = 1."""
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(f"MultiheadAttention: query, key and value must all be 2-D "
                             f"(unbatched) or 3-D (batched), got shapes {tuple(query.shape)}, "
                             f"{tuple(key.shape)}, {tuple(value.shape)}")
        if batched and self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        if not batched:
            query, key, value = (x.unsqueeze(1) for x in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        if query.shape[2] != self.embed_dim:
            raise ValueError(f"MultiheadAttention: was expecting embedding dimension of "
                             f"{self.embed_dim}, but got {query.shape[2]}")
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"MultiheadAttention: key shape {tuple(key.shape)} does not match "
                             f"value shape {tuple(value.shape)}")
        return query, key, value, key_padding_mask

    def _project(self, query, key, value):
        """q, k, v: the input projections (one packed linear for self-attention)."""
        if self._qkv_same_embed_dim and query is key and key is value:
            return _ops.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, -1)
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q = b_k = b_v = None
        if self.in_proj_bias is not None:
            b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        return (_ops.linear(query, w_q, b_q), _ops.linear(key, w_k, b_k),
                _ops.linear(value, w_v, b_v))

    def _attn_mask(self, attn_mask, dt, L, N, S0):
        """attn_mask as an additive (1 or N*H, L, S0) tensor, or None; shapes as torch checks."""
        if attn_mask is None:
            return None
        mask = _additive(attn_mask, dt, "attn_mask")
        if mask.ndim == 2:
            if tuple(mask.shape) != (L, S0):
                raise ValueError(f"The shape of the 2D attn_mask is {tuple(mask.shape)}, "
                                 f"but should be {(L, S0)}.")
            return mask.unsqueeze(0)
        if mask.ndim == 3:
            if tuple(mask.shape) != (N * self.num_heads, L, S0):
                raise ValueError(f"The shape of the 3D attn_mask is {tuple(mask.shape)}, "
                                 f"but should be {(N * self.num_heads, L, S0)}.")
            return mask
        raise ValueError(f"attn_mask's dimension {mask.ndim} is not supported")

    def _attend(self, q, k, v, full, need_weights):
        """(N, H, L, hd) output and the (N, H, L, S) weights when asked for (or dropout
        needs them); else the fused scaled_dot_product_attention."""
        dropout_p = self.dropout if self.training else 0.0
        if need_weights or dropout_p > 0.0:
            scores = _ops.matmul(q * (1.0 / math.sqrt(self.head_dim)), k.transpose(-2, -1))
            if full is not None:
                scores = scores + full
            weights = _ops.softmax(scores, -1)
            used = _dropout(weights, dropout_p) if dropout_p > 0.0 else weights
            return _ops.matmul(used, v), weights
        if full is not None:
            full = full.expand(*q.shape[:3], k.shape[2])
        out = _ops.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                                attn_mask=full)
        return out, None
