"""torch.special: the functions of it that nbxtensor has (the rest raise AttributeError
naming the missing function; see docs/torch-differences.md)."""
from __future__ import annotations

from .ops import (erf, erfinv, exp2, expm1, log1p, log_softmax, logit, logsumexp,  # noqa: A004
                  round, sigmoid, sinc, softmax, xlogy)

expit = sigmoid

__all__ = ["erf", "erfinv", "exp2", "expm1", "expit", "log1p", "log_softmax", "logit",
           "logsumexp", "round", "sinc", "softmax", "xlogy"]


def __getattr__(name):
    raise AttributeError(f"module 'nbxtensor.special' has no attribute {name!r} (torch.special."
                         f"{name} is not implemented)")
