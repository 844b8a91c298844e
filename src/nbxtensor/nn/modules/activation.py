"""Activation modules (torch.nn's), each over its functional form."""
from __future__ import annotations

from .. import _compose as C
from ... import ops as _ops
from ...ops.elementwise import relu_ as _relu_inplace
from ._factory import param
from .module import Module

__all__ = ["ReLU", "ReLU6", "GELU", "SiLU", "Sigmoid", "Tanh", "Softmax", "Softmin",
           "Softmax2d", "LogSoftmax", "LeakyReLU", "ELU", "CELU", "SELU", "Hardswish",
           "Hardsigmoid", "Hardtanh", "Mish", "Softplus", "PReLU", "RReLU", "Threshold",
           "LogSigmoid", "Softsign", "GLU", "Tanhshrink", "Softshrink", "Hardshrink"]


def _inplace_repr(inplace, lead=""):
    return (lead + "inplace=True") if inplace else ""


class _Inplace(Module):
    """An activation with only torch's `inplace` flag."""

    _fn = None

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return type(self)._fn(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


def _relu(input, inplace=False):  # noqa: A002
    return _relu_inplace(input) if inplace else _ops.relu(input)


def _result(input, r, inplace):  # noqa: A002
    return input.copy_(r) if inplace else r


class ReLU(_Inplace):
    _fn = staticmethod(_relu)


class SiLU(_Inplace):
    _fn = staticmethod(lambda x, inplace=False: _result(x, _ops.silu(x), inplace))


class Mish(_Inplace):
    _fn = staticmethod(lambda x, inplace=False: _ops.mish(x, inplace=inplace))


class Hardswish(_Inplace):
    _fn = staticmethod(lambda x, inplace=False: _ops.hardswish(x, inplace=inplace))


class Hardsigmoid(_Inplace):
    _fn = staticmethod(lambda x, inplace=False: _result(x, _ops.hardsigmoid(x), inplace))


class SELU(_Inplace):
    _fn = staticmethod(C.selu)


class _NoArgs(Module):
    _fn = None

    def forward(self, input):  # noqa: A002
        return type(self)._fn(input)


class Sigmoid(_NoArgs):
    _fn = staticmethod(_ops.sigmoid)


class Tanh(_NoArgs):
    _fn = staticmethod(_ops.tanh)


class LogSigmoid(_NoArgs):
    _fn = staticmethod(C.logsigmoid)


class Softsign(_NoArgs):
    _fn = staticmethod(C.softsign)


class Tanhshrink(_NoArgs):
    _fn = staticmethod(C.tanhshrink)


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input):  # noqa: A002
        return _ops.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class _Dim(Module):
    _fn = None

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):  # noqa: A002
        return type(self)._fn(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax(_Dim):
    _fn = staticmethod(_ops.softmax)


class LogSoftmax(_Dim):
    _fn = staticmethod(_ops.log_softmax)


class Softmin(_Dim):
    _fn = staticmethod(C.softmin)


class Softmax2d(Module):
    def forward(self, input):  # noqa: A002
        if input.ndim not in (3, 4):
            raise ValueError(f"Softmax2d: expected a 3-D or 4-D input (got {input.ndim}D input)")
        return _ops.softmax(input, -3)


class GLU(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, input):  # noqa: A002
        return _ops.glu(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False):
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return _ops.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}{_inplace_repr(self.inplace, ', ')}"


class ELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return _ops.elu(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}{_inplace_repr(self.inplace, ', ')}"


class CELU(ELU):
    def forward(self, input):  # noqa: A002
        return C.celu(input, self.alpha, self.inplace)


class Hardtanh(Module):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__()
        if min_val > max_val:
            raise ValueError(f"Hardtanh: min_val ({min_val}) cannot be greater than max_val "
                             f"({max_val})")
        self.min_val = min_val
        self.max_val = max_val
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return C.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return (f"min_val={self.min_val}, max_val={self.max_val}"
                f"{_inplace_repr(self.inplace, ', ')}")


class ReLU6(Hardtanh):
    def __init__(self, inplace: bool = False):
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


class Threshold(Module):
    def __init__(self, threshold: float, value: float, inplace: bool = False):
        super().__init__()
        self.threshold = threshold
        self.value = value
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return C.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        return (f"threshold={self.threshold}, value={self.value}"
                f"{_inplace_repr(self.inplace, ', ')}")


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input):  # noqa: A002
        return _ops.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class _Shrink(Module):
    _fn = None

    def __init__(self, lambd: float = 0.5):
        super().__init__()
        self.lambd = lambd

    def forward(self, input):  # noqa: A002
        return type(self)._fn(input, self.lambd)

    def extra_repr(self) -> str:
        return f"{self.lambd}"


class Softshrink(_Shrink):
    _fn = staticmethod(C.softshrink)


class Hardshrink(_Shrink):
    _fn = staticmethod(C.hardshrink)


class PReLU(Module):
    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None):
        super().__init__()
        self.num_parameters = num_parameters
        self.init = init
        self.weight = param((num_parameters,), device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.weight.fill_(self.init)

    def forward(self, input):  # noqa: A002
        return C.prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class RReLU(Module):
    """The inference form (slope (lower + upper) / 2); training mode draws random slopes,
    which is refused (NotImplementedError)."""

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False):
        super().__init__()
        self.lower = lower
        self.upper = upper
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return C.rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"lower={self.lower}, upper={self.upper}{_inplace_repr(self.inplace, ', ')}"
