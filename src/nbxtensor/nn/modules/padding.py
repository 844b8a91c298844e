"""The padding modules (torch.nn's): Constant/Zero/Reflection/Replication/CircularPad 1d-3d,
over nn.functional.pad."""
from __future__ import annotations

import numbers

from .. import functional as F
from .module import Module

__all__ = [f"{kind}Pad{n}d" for kind in ("Constant", "Zero", "Reflection", "Replication",
                                          "Circular") for n in (1, 2, 3)]


def _ntuple(padding, n, name):
    if isinstance(padding, numbers.Integral) and not isinstance(padding, bool):
        return (int(padding),) * (2 * n)
    padding = tuple(padding)
    if len(padding) != 2 * n:
        raise ValueError(f"{name}: padding must be an int or a {2 * n}-tuple, got {padding}")
    return padding


class _PadNd(Module):
    _mode = "constant"
    _n = 1

    def __init__(self, padding, value=0.0):
        super().__init__()
        self.padding = _ntuple(padding, self._n, type(self).__name__)
        self.value = value

    def forward(self, input):  # noqa: A002
        if self._mode == "constant":
            return F.pad(input, self.padding, "constant", self.value)
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self) -> str:
        if self._mode == "constant" and not type(self).__name__.startswith("Zero"):
            return f"padding={self.padding}, value={self.value}"
        return f"{self.padding}"


def _make(kind, mode, n):
    def __init__(self, padding, *args):
        if kind == "Constant":
            if len(args) != 1:
                raise TypeError(f"ConstantPad{n}d() takes padding and value")
            _PadNd.__init__(self, padding, args[0])
        else:
            if args:
                raise TypeError(f"{kind}Pad{n}d() takes only padding")
            _PadNd.__init__(self, padding, 0.0)
    return type(f"{kind}Pad{n}d", (_PadNd,), {"_mode": mode, "_n": n, "__init__": __init__,
                                              "__module__": __name__})


for _kind, _mode in (("Constant", "constant"), ("Zero", "constant"), ("Reflection", "reflect"),
                     ("Replication", "replicate"), ("Circular", "circular")):
    for _n in (1, 2, 3):
        globals()[f"{_kind}Pad{_n}d"] = _make(_kind, _mode, _n)
del _kind, _mode, _n
