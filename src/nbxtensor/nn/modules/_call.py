"""Layers that are one functional call, declared as data.

Most of torch.nn's parameter-free layers (activations, dropout, pixel shuffle, unfold, the
distances, flatten) store their constructor arguments and pass them to the functional form.
Such a layer is one declaration here:

    class Softshrink(Call):
        _fn = staticmethod(F.softshrink)     # called as _fn(*inputs, *values of _call)
        _args = (("lambd", 0.5),)            # the constructor: torch's names and defaults
        _repr = "{lambd}"                    # extra_repr (default: name=value for each)

- `_args`: ((name, default), ...) in torch's order; REQUIRED marks an argument without a
  default. The constructor binds them with Python's own rules (the TypeError names the layer)
  and stores each as an attribute of that name.
- `_call`: the attribute names passed after the inputs, in the functional's order
  (default: `_args`' names); "training" passes `self.training`.
- `_repr`: a str.format template over the attributes; None shows every argument as
  name=value, and `inplace` only when it is True (as torch's activations print).
- `_check(self)`: torch's constructor refusals, run after the arguments are stored.
"""
from __future__ import annotations

import inspect

from .module import Module

REQUIRED = inspect.Parameter.empty


class Call(Module):
    _fn = None
    _args: tuple = ()
    _call: tuple | None = None
    _repr: str | None = None

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls._signature = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d)
             for n, d in cls._args])
        cls.__signature__ = cls._signature
        cls._passed = tuple(cls._call if cls._call is not None else (n for n, _ in cls._args))

    def __init__(self, *args, **kwargs):
        super().__init__()
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{type(self).__name__}: {e}") from None
        bound.apply_defaults()
        for name, value in bound.arguments.items():
            setattr(self, name, value)
        self._check()

    def _check(self) -> None:
        """torch's refusals of constructor arguments (none by default)."""

    def forward(self, *inputs):
        values = [self.training if n == "training" else getattr(self, n) for n in self._passed]
        return type(self)._fn(*inputs, *values)

    def extra_repr(self) -> str:
        if self._repr is not None:
            return self._repr.format(**{n: getattr(self, n) for n, _ in self._args})
        return ", ".join(f"{n}={getattr(self, n)}" for n, _ in self._args
                         if n != "inplace" or getattr(self, n))


def non_defaults(module, defaults) -> str:
    """", name=value" for each (name, default) whose attribute differs from the default, in
    order: torch's reprs list only what the constructor was given. None and the bools compare
    by identity, as torch's reprs do (0 is not False), numbers by value (2.0 == 2)."""
    out = []
    for name, default in defaults:
        v = getattr(module, name)
        if (v is not default) if default is None or isinstance(default, bool) else v != default:
            out.append(f", {name}={v!r}" if isinstance(v, str) else f", {name}={v}")
    return "".join(out)
