"""Devices: where a tensor's memory lives and which implementation runs its ops.

  cpu      host memory (NumPy arrays); ops run by NumPy
  cuda:N   device memory from the caching allocator; ops run by Triton kernels
  interp   host memory; the *same* Triton kernels, run by Triton's interpreter
"""
from __future__ import annotations

__all__ = ["Device", "as_device", "DEVICE_TYPES", "get_default_device", "set_default_device",
           "factory_device"]

DEVICE_TYPES = ("cpu", "cuda", "interp")


class Device:
    """A device, parsed from 'cpu', 'cuda', 'cuda:N' or 'interp' (or a type and index)."""

    __slots__ = ("type", "index")

    def __init__(self, type, index=None):  # noqa: A002 - torch's name
        if isinstance(type, Device):
            type, index = type.type, type.index if index is None else index
        if not isinstance(type, str):
            raise TypeError(f"device: expected a string such as 'cpu', 'cuda:0' or 'interp', "
                            f"got {type!r}")
        text = type
        if ":" in type:
            if index is not None:
                raise ValueError(f"device: {text!r} names an index, and index={index} was given too")
            type, _, idx = type.partition(":")
            if not idx.isdigit():
                raise ValueError(f"device: bad device index in {text!r}; expected 'cuda:N' with N >= 0")
            index = int(idx)
        if type not in DEVICE_TYPES:
            raise ValueError(f"device: unknown device type {text!r}; expected one of "
                             f"'cpu', 'cuda', 'cuda:N', 'interp'")
        if index is not None:
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise ValueError(f"device: index must be an int >= 0, got {index!r}")
            if type != "cuda" and index != 0:
                raise ValueError(f"device: {type!r} has only index 0, got {index}")
            if type != "cuda":
                index = None
        if type == "cuda" and index is None:
            # Unlike torch (index None = "the current device"), a bare 'cuda' names cuda:0, so
            # that Device('cuda') == a tensor's device; we have no per-thread current device.
            index = 0
        self.type = type
        self.index = index

    @property
    def is_host(self) -> bool:
        """True when the memory is host memory (cpu and interp)."""
        return self.type != "cuda"

    def __eq__(self, other):
        if isinstance(other, str):
            try:
                other = Device(other)
            except (TypeError, ValueError):
                return False
        if not isinstance(other, Device):
            return NotImplemented
        return self.type == other.type and self.index == other.index

    def __hash__(self):
        return hash((self.type, self.index))

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self):
        return f"device(type='{self.type}'" + ("" if self.index is None else f", index={self.index}") + ")"

    # `with nbx.device("cuda"):` makes this the factories' default device inside the block, as
    # torch's device context; the previous default comes back on exit (nesting works).
    def __enter__(self):
        _entered.append(_default_device[0])
        _default_device[0] = self
        return self

    def __exit__(self, *exc):
        _default_device[0] = _entered.pop()
        return False


_CPU = Device("cpu")
# The factories' default device (torch.set_default_device): one slot, process-wide, and the
# defaults that `with device:` blocks replaced, innermost last.
_default_device = [_CPU]
_entered: list = []


def get_default_device() -> Device:
    """The device a factory (tensor, zeros, arange, rand, ...) uses when given none."""
    return _default_device[0]


def set_default_device(device) -> None:
    """Make `device` the factories' default (None: back to cpu), as torch.set_default_device.
    Only factories follow it: loaders, from_numpy and ops on existing tensors do not."""
    _default_device[0] = _CPU if device is None else as_device(device)


def factory_device(x, argname: str = "device") -> Device:
    """A factory's device argument: None means the default device (get_default_device)."""
    return _default_device[0] if x is None else as_device(x, argname)


def as_device(x, argname: str = "device") -> Device:
    """Normalise a device argument; None means cpu; 'cuda' means cuda:0. (A factory resolves
    None to the default device instead: factory_device.)"""
    if x is None:
        return _CPU
    if isinstance(x, Device):
        d = x
    elif isinstance(x, str):
        try:
            d = Device(x)
        except (TypeError, ValueError) as e:
            raise type(e)(str(e).replace("device:", f"{argname}:", 1)) from None
    elif isinstance(x, int) and not isinstance(x, bool):
        d = Device("cuda", x)
    else:
        raise TypeError(f"{argname}: expected a device ('cpu', 'cuda', 'cuda:N', 'interp'), "
                        f"got {type(x).__name__} {x!r}")
    return d
