"""torch's grad-mode contexts, as no-ops: nbxtensor has no autograd.

Inference code written for torch wraps its work in `torch.no_grad()` or
`torch.inference_mode()` (as a context or a decorator) and calls `detach()`; these names let
that code run unchanged. Nothing is recorded for a backward pass in any mode, so the contexts
change only what `is_grad_enabled()` / `is_inference_mode_enabled()` report (per thread, as
torch's flags are). A tensor never requires a gradient: `requires_grad` is False, `grad` is
None, `is_leaf` is True, and asking for a gradient (`requires_grad_(True)`) is refused.
"""
from __future__ import annotations

import functools
import inspect
import threading

from .ops import _methods
from .tensor import Tensor

__all__ = ["no_grad", "enable_grad", "inference_mode", "set_grad_enabled", "is_grad_enabled",
           "is_inference_mode_enabled"]


class _State(threading.local):
    grad = True
    inference = False


_STATE = _State()


def is_grad_enabled() -> bool:
    """True unless inside no_grad / set_grad_enabled(False) / inference_mode (a no-op flag:
    nbxtensor has no autograd, so no gradient is ever computed whatever it says)."""
    return _STATE.grad


def is_inference_mode_enabled() -> bool:
    """True inside inference_mode(True) (a no-op flag: nbxtensor has no autograd)."""
    return _STATE.inference


class _Mode:
    """A context manager that is also a decorator; entering sets the flags, leaving restores
    them. `clone()` gives a fresh copy per decorated call, so recursion and threads nest."""

    def __enter__(self):
        self._prev = (_STATE.grad, _STATE.inference)
        self._set()
        return None

    def __exit__(self, *exc):
        _STATE.grad, _STATE.inference = self._prev
        return False

    def clone(self):
        return self.__class__()

    def __call__(self, func):
        if not callable(func):
            raise TypeError(f"{type(self).__name__}: expected a function to decorate, got "
                            f"{type(func).__name__}")
        if inspect.isgeneratorfunction(func):
            @functools.wraps(func)
            def gen(*args, **kwargs):
                with self.clone():
                    return (yield from func(*args, **kwargs))
            return gen

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self.clone():
                return func(*args, **kwargs)
        return wrapper


class _NoParamMode(_Mode):
    # `@no_grad` (no parentheses) decorates directly, as torch's no-parameter contexts do
    def __new__(cls, orig_func=None):
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)


class no_grad(_NoParamMode):  # noqa: N801 - torch's name
    """torch.no_grad: a context / decorator that turns the grad flag off. A no-op here:
    nbxtensor has no autograd, so nothing is ever recorded for a backward pass."""

    def _set(self):
        _STATE.grad = False


class enable_grad(_NoParamMode):  # noqa: N801 - torch's name
    """torch.enable_grad: turns the grad flag back on. A no-op here: nbxtensor has no
    autograd, so gradients are never computed even when the flag is on."""

    def _set(self):
        _STATE.grad = True


class inference_mode(_Mode):  # noqa: N801 - torch's name
    """torch.inference_mode(mode=True): a context / decorator (`@inference_mode`,
    `@inference_mode()`, `@inference_mode(False)`). A no-op here: nbxtensor has no autograd,
    so every computation already runs as inference."""

    def __new__(cls, mode=True):
        if not isinstance(mode, bool):   # @inference_mode without parentheses: mode is the function
            return cls()(mode)
        return super().__new__(cls)

    def __init__(self, mode=True):
        self.mode = mode

    def clone(self):
        return self.__class__(self.mode)

    def _set(self):
        if self.mode:
            _STATE.grad, _STATE.inference = False, True
        else:
            _STATE.inference = False


class set_grad_enabled(_Mode):  # noqa: N801 - torch's name
    """torch.set_grad_enabled(mode): sets the grad flag at once (as a call), or for a block
    (as a context) or a function (as a decorator), restoring it afterwards. A no-op here:
    nbxtensor has no autograd."""

    def __init__(self, mode):
        if not isinstance(mode, bool):
            raise TypeError(f"set_grad_enabled: mode must be a bool, got {type(mode).__name__}")
        self.mode = mode
        self._prev = (_STATE.grad, _STATE.inference)
        _STATE.grad = mode         # torch applies the mode on construction, not only on enter

    def __enter__(self):
        return None                # already applied; __exit__ restores what came before

    def clone(self):
        return self.__class__(self.mode)   # captures the flags of the moment it is entered

    def __call__(self, func):
        _STATE.grad = self._prev[0]   # as a decorator, the mode applies only inside the function
        return super().__call__(func)

    def _set(self):
        _STATE.grad = self.mode


# ---------------------------------------------------------------------- Tensor's autograd face
_NO_AUTOGRAD = "nbxtensor has no autograd; tensors cannot require gradients"


def _get_requires_grad(self):
    return False


def _set_requires_grad(self, value):
    if value:
        raise RuntimeError(f"requires_grad: {_NO_AUTOGRAD} (got requires_grad=True)")


def requires_grad_(self, requires_grad=True):
    """Only requires_grad_(False) is accepted (a no-op): nbxtensor has no autograd."""
    _set_requires_grad(self, requires_grad)
    return self


def detach(self):
    """A view of the same memory (there is no graph to detach from: nbxtensor has no autograd)."""
    return Tensor._make(self._storage, self._shape, self._stride, self._offset, self._dtype)


def detach_(self):
    return self


def _get_data(self):
    return detach(self)


def _set_data(self, value):
    # torch's `p.data = t`: the tensor object now refers to t's memory, shape and dtype
    if not isinstance(value, Tensor):
        raise TypeError(f"data: expected a Tensor, got {type(value).__name__}")
    self._storage, self._shape, self._stride = value._storage, value._shape, value._stride
    self._offset, self._dtype = value._offset, value._dtype


def _get_grad(self):
    return None


def _set_grad(self, value):
    if value is not None:
        raise RuntimeError(f"grad: {_NO_AUTOGRAD}; only None can be assigned")


_methods.install(
    requires_grad=property(_get_requires_grad, _set_requires_grad),
    requires_grad_=requires_grad_, detach=detach, detach_=detach_,
    data=property(_get_data, _set_data), grad=property(_get_grad, _set_grad),
    is_leaf=property(lambda self: True), grad_fn=property(lambda self: None),
)
