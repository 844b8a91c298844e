"""Transformer, TransformerEncoder(Layer), TransformerDecoder(Layer) (torch.nn's layout and
state-dict keys: self_attn, multihead_attn, linear1/2, norm1/2/3, ...).

torch's encoder converts a padded batch to a nested tensor in inference (eval, no grad, a
key padding mask, no attention mask) and pads the result with zeros; the outputs at padded
positions are then 0. TransformerEncoder does the same under the same conditions, so the
padded rows match torch's.
"""
from __future__ import annotations

import copy

from ... import grad_mode
from ... import ops as _ops
from .. import functional as F
from .. import init
from .activation import GELU, ReLU
from .attention import MultiheadAttention
from .container import ModuleList
from .dropout import Dropout
from .linear import Linear
from .module import Module
from .normalization import LayerNorm

__all__ = ["Transformer", "TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayer",
           "TransformerDecoderLayer"]


def _activation(activation):
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    if isinstance(activation, str):
        raise RuntimeError(f"activation should be relu/gelu, not {activation}")
    return activation


def _clones(module, n):
    return ModuleList([copy.deepcopy(module) for _ in range(n)])


def _square_subsequent_mask(sz, device=None, dtype=None):
    """The additive causal mask: -inf above the diagonal, 0 elsewhere."""
    from ...creation import full
    return _ops.triu(full((sz, sz), float("-inf"), dtype=dtype, device=device), diagonal=1)


class _TransformerLayer(Module):
    """What the encoder and decoder layers share: torch's submodules, registered in torch's
    order (so state dicts line up), the self-attention and feed-forward blocks."""
    __constants__ = ["norm_first"]
    _cross = False      # the decoder's: a cross-attention block and a third norm and dropout

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 device=None, dtype=None):
        super().__init__()
        cross = self._cross
        fk = {"device": device, "dtype": dtype}

        def attention():
            return MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                      batch_first=batch_first, **fk)
        self.self_attn = attention()
        if cross:
            self.multihead_attn = attention()
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **fk)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **fk)
        self.norm_first = norm_first
        for i in range(1, 4 if cross else 3):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk))
        for i in range(1, 4 if cross else 3):
            setattr(self, f"dropout{i}", Dropout(dropout))
        self.activation = _activation(activation)

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal and attn_mask is not None)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        last = self.dropout3 if "dropout3" in self._modules else self.dropout2
        return last(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoderLayer(_TransformerLayer):
    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 device=None, dtype=None):
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                         batch_first, norm_first, bias, device, dtype)
        self.activation_relu_or_gelu = (1 if activation in ("relu", F.relu) or isinstance(activation, ReLU)
                                        else 2 if activation in ("gelu", F.gelu)
                                        or isinstance(activation, GELU) else 0)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x


class TransformerDecoderLayer(_TransformerLayer):
    _cross = True

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask,
                                    memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                               memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal=False):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask,
                                key_padding_mask=key_padding_mask, need_weights=False,
                                is_causal=is_causal and attn_mask is not None)[0]
        return self.dropout2(x)


class TransformerEncoder(Module):
    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True,
                 mask_check=True):
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor = enable_nested_tensor
        self.mask_check = mask_check
        # torch's conditions for its nested-tensor path, fixed at construction
        layer = encoder_layer
        self.use_nested_tensor = (enable_nested_tensor
                                  and isinstance(layer, TransformerEncoderLayer)
                                  and not layer.norm_first and layer.self_attn.batch_first
                                  and layer.self_attn._qkv_same_embed_dim
                                  and layer.self_attn.in_proj_bias is not None
                                  and layer.activation_relu_or_gelu != 0
                                  and layer.norm1.eps == layer.norm2.eps
                                  and layer.self_attn.num_heads % 2 == 0)

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        nested = (self.use_nested_tensor and not self.training and not grad_mode.is_grad_enabled()
                  and src_key_padding_mask is not None and mask is None and src.ndim == 3)
        out = src
        for mod in self.layers:
            out = mod(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=bool(is_causal))
        if nested:
            keep = _ops.logical_not(src_key_padding_mask.to(out.device).bool())
            out = out * keep.unsqueeze(-1).to(out.dtype)
        if self.norm is not None:
            out = self.norm(out)
        return out


class TransformerDecoder(Module):
    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        out = tgt
        for mod in self.layers:
            out = mod(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        if self.norm is not None:
            out = self.norm(out)
        return out


class Transformer(Module):
    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps=1e-5, batch_first=False, norm_first=False,
                 bias=True, device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype}

        def stack(custom, layer_class, stack_class, num_layers):
            if custom is not None:
                return custom
            layer = layer_class(d_model, nhead, dim_feedforward, dropout, activation,
                                layer_norm_eps, batch_first, norm_first, bias, **fk)
            return stack_class(layer, num_layers,
                               LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk))
        self.encoder = stack(custom_encoder, TransformerEncoderLayer, TransformerEncoder,
                             num_encoder_layers)
        self.decoder = stack(custom_decoder, TransformerDecoderLayer, TransformerDecoder,
                             num_decoder_layers)
        for p in self.parameters():
            if p.dim() > 1:
                init.xavier_uniform_(p)
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = batch_first

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz, device=None, dtype=None):
        return _square_subsequent_mask(sz, device, dtype)
