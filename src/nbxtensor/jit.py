"""torch.jit for code that mentions it: nbxtensor has no TorchScript, so `script` and `trace`
return the module or function unchanged (it runs eagerly, as it would in torch without
scripting), the decorators are identities, and is_scripting()/is_tracing() are False."""
from __future__ import annotations

__all__ = ["script", "trace", "ignore", "unused", "export", "is_scripting", "is_tracing",
           "Final", "annotate"]


def script(obj=None, optimize=None, _frames_up=0, _rcb=None, example_inputs=None):
    return obj


def trace(func, example_inputs=None, *args, **kwargs):
    return func


def _identity_decorator(fn=None, **kwargs):
    if fn is None:
        return lambda f: f
    return fn


ignore = unused = export = _identity_decorator


def is_scripting() -> bool:
    return False


def is_tracing() -> bool:
    return False


def annotate(the_type, the_value):
    return the_value


try:   # torch.jit.Final[int] in class annotations
    from typing import Final
except ImportError:  # pragma: no cover
    Final = None
