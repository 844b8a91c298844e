"""Dropout modules (torch.nn's): the identity in eval mode. In training mode they draw from
nbx.random (MT19937 on cpu, as torch's CPU generator; Philox4x32-10 on cuda and interp)."""
from __future__ import annotations

from .. import _compose as C
from ._call import Call

__all__ = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
           "FeatureAlphaDropout"]


class _DropoutNd(Call):
    _args = (("p", 0.5), ("inplace", False))
    _call = ("p", "training", "inplace")
    _repr = "p={p}, inplace={inplace}"

    def _check(self):
        C._check_p(self.p, type(self).__name__)


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
