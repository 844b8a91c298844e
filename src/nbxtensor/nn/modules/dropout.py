"""Dropout modules (torch.nn's): the identity in eval mode. In training mode they draw from
nbx.random (MT19937 on cpu, as torch's CPU generator; Philox4x32-10 on cuda and interp)."""
from __future__ import annotations

from .. import _compose as C
from .module import Module

__all__ = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
           "FeatureAlphaDropout"]


class _DropoutNd(Module):
    _fn = None

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        C._check_p(p, type(self).__name__)
        self.p = p
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return type(self)._fn(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout(_DropoutNd):
    _fn = staticmethod(C.dropout)


class Dropout1d(_DropoutNd):
    _fn = staticmethod(C.dropout1d)


class Dropout2d(_DropoutNd):
    _fn = staticmethod(C.dropout2d)


class Dropout3d(_DropoutNd):
    _fn = staticmethod(C.dropout3d)


class AlphaDropout(_DropoutNd):
    _fn = staticmethod(C.alpha_dropout)


class FeatureAlphaDropout(_DropoutNd):
    _fn = staticmethod(C.feature_alpha_dropout)
