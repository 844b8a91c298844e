"""Flatten and Unflatten (torch.nn's)."""
from __future__ import annotations

from ._call import REQUIRED, Call

__all__ = ["Flatten", "Unflatten"]


class Flatten(Call):
    _fn = staticmethod(lambda x, start_dim, end_dim: x.flatten(start_dim, end_dim))
    _args = (("start_dim", 1), ("end_dim", -1))


class Unflatten(Call):
    _fn = staticmethod(lambda x, dim, sizes: x.unflatten(dim, sizes))
    _args = (("dim", REQUIRED), ("unflattened_size", REQUIRED))

    def _check(self):
        if not isinstance(self.dim, int) or isinstance(self.dim, bool):
            raise TypeError(f"Unflatten: dim must be an int, got {type(self.dim).__name__}")
        if not isinstance(self.unflattened_size, (tuple, list)):
            raise TypeError(f"Unflatten: unflattened_size must be a tuple or list of ints, got "
                            f"{type(self.unflattened_size).__name__}")
