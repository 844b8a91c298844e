"""Attach op functions to Tensor as methods (one place, so a family cannot clobber another)."""
from __future__ import annotations

from ..tensor import Tensor


def install(**methods) -> None:
    for name, fn in methods.items():
        if name in Tensor.__dict__ and Tensor.__dict__[name] is not fn:
            raise RuntimeError(f"Tensor.{name} is already defined; a family may not replace it")
        setattr(Tensor, name, fn)


def uninstall(methods: dict) -> None:
    """Remove methods `install` attached (a declared op undeclared, ops/_declare.py)."""
    for name, fn in methods.items():
        if Tensor.__dict__.get(name) is fn:
            delattr(Tensor, name)
