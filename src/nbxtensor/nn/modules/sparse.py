"""Embedding and EmbeddingBag (torch.nn's)."""
from __future__ import annotations

from .. import init
from ... import ops as _ops
from .._compose import embedding_bag
from ._call import non_defaults
from ._factory import param
from .module import Module, Parameter

__all__ = ["Embedding", "EmbeddingBag"]


def _padding_idx(padding_idx, num_embeddings):
    if padding_idx is None:
        return None
    if padding_idx > 0:
        if padding_idx >= num_embeddings:
            raise ValueError(f"padding_idx must be within num_embeddings ({num_embeddings}), "
                             f"got {padding_idx}")
    elif padding_idx < 0:
        if padding_idx < -num_embeddings:
            raise ValueError(f"padding_idx must be within num_embeddings ({num_embeddings}), "
                             f"got {padding_idx}")
        padding_idx += num_embeddings
    return padding_idx


def _check_weight(_weight, num_embeddings, embedding_dim):
    if tuple(_weight.shape) != (num_embeddings, embedding_dim):
        raise ValueError(f"_weight: shape must be {(num_embeddings, embedding_dim)} "
                         f"(num_embeddings, embedding_dim), got {tuple(_weight.shape)}")
    return Parameter(_weight)


class _EmbeddingTable(Module):
    """What Embedding and EmbeddingBag share: the (num_embeddings, embedding_dim) weight
    (fresh and reset, or the given `_weight`) and the lookup options, as torch's attributes."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx, max_norm, norm_type,
                 scale_grad_by_freq, sparse, _weight, device, dtype):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = _padding_idx(padding_idx, num_embeddings)
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        if _weight is None:
            self.weight = param((num_embeddings, embedding_dim), device, dtype)
            self.reset_parameters()
        else:
            self.weight = _check_weight(_weight, num_embeddings, embedding_dim)

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight[self.padding_idx].fill_(0)

    @staticmethod
    def _pretrained_shape(embeddings) -> tuple:
        """from_pretrained's (num_embeddings, embedding_dim): `embeddings` must be 2-D."""
        if embeddings.ndim != 2:
            raise ValueError(f"from_pretrained: embeddings must be 2-D, got shape "
                             f"{tuple(embeddings.shape)}")
        return tuple(embeddings.shape)


class Embedding(_EmbeddingTable):
    """A lookup table: weight (num_embeddings, embedding_dim), rows picked by index."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx=None, max_norm=None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False,
                 _weight=None, _freeze: bool = False, device=None, dtype=None):
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type,
                         scale_grad_by_freq, sparse, _weight, device, dtype)

    def forward(self, input):  # noqa: A002
        return _ops.embedding(input, self.weight, self.padding_idx, self.max_norm,
                              self.norm_type, self.scale_grad_by_freq, self.sparse)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}" + non_defaults(
            self, (("padding_idx", None), ("max_norm", None), ("norm_type", 2),
                   ("scale_grad_by_freq", False)))
        if self.sparse is not False:
            s += ", sparse=True"
        return s

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None,
                        norm_type=2.0, scale_grad_by_freq=False, sparse=False):
        rows, cols = cls._pretrained_shape(embeddings)
        return cls(rows, cols, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   _weight=embeddings, _freeze=freeze)


class EmbeddingBag(_EmbeddingTable):
    """Sums / means / maxima of bags of embeddings (see nbx.nn.functional.embedding_bag)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, max_norm=None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "mean",
                 sparse: bool = False, _weight=None, include_last_offset: bool = False,
                 padding_idx=None, device=None, dtype=None):
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type,
                         scale_grad_by_freq, sparse, _weight, device, dtype)
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(self, input, offsets=None, per_sample_weights=None):  # noqa: A002
        return embedding_bag(input, self.weight, offsets, self.max_norm, self.norm_type,
                             self.scale_grad_by_freq, self.mode, self.sparse, per_sample_weights,
                             self.include_last_offset, self.padding_idx)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}"
                + non_defaults(self, (("max_norm", None), ("norm_type", 2),
                                      ("scale_grad_by_freq", False)))
                + f", mode={self.mode!r}" + non_defaults(self, (("padding_idx", None),)))

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, mode="mean", sparse=False,
                        include_last_offset=False, padding_idx=None):
        rows, cols = cls._pretrained_shape(embeddings)
        return cls(rows, cols, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
                   embeddings, include_last_offset, padding_idx)
