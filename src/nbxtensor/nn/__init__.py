"""nbx.nn: the torch-like functional namespace (`nbx.nn.functional`, also `nbx.nn.F`).

Only functions live here; there are no Module classes (models in nbxtensor.models hold
their weights as plain tensors).
"""
from __future__ import annotations

from . import functional  # noqa: F401
from . import functional as F  # noqa: F401,N812 - torch's conventional alias

__all__ = ["functional", "F"]
