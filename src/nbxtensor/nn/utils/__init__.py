"""torch.nn.utils's inference-side helpers (loading sharded checkpoint folders is a loader:
nbx.io.load_sharded)."""
from __future__ import annotations

from ...tensor import Tensor

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def parameters_to_vector(parameters) -> Tensor:
    from ...ops import cat
    return cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec, parameters) -> None:
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    offset = 0
    for p in parameters:
        n = p.numel()
        p.copy_(vec[offset:offset + n].view_as(p))
        offset += n


from . import rnn  # noqa: E402,F401 - torch.nn.utils.rnn
