"""Activation modules (torch.nn's), each over its functional form."""
from __future__ import annotations

from .. import _compose as C
from ... import ops as _ops
from ...ops.elementwise import relu_ as _relu_inplace
from ._call import REQUIRED, Call
from ._factory import param
from .module import Module

__all__ = ["ReLU", "ReLU6", "GELU", "SiLU", "Sigmoid", "Tanh", "Softmax", "Softmin",
           "Softmax2d", "LogSoftmax", "LeakyReLU", "ELU", "CELU", "SELU", "Hardswish",
           "Hardsigmoid", "Hardtanh", "Mish", "Softplus", "PReLU", "RReLU", "Threshold",
           "LogSigmoid", "Softsign", "GLU", "Tanhshrink", "Softshrink", "Hardshrink"]


class _Inplace(Call):
    """An activation with only torch's `inplace` flag."""
    _args = (("inplace", False),)


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


class Sigmoid(Call):
    _fn = staticmethod(_ops.sigmoid)


class Tanh(Call):
    _fn = staticmethod(_ops.tanh)


class LogSigmoid(Call):
    _fn = staticmethod(C.logsigmoid)


class Softsign(Call):
    _fn = staticmethod(C.softsign)


class Tanhshrink(Call):
    _fn = staticmethod(C.tanhshrink)


class GELU(Call):
    _fn = staticmethod(lambda x, approximate: _ops.gelu(x, approximate=approximate))
    _args = (("approximate", "none"),)
    _repr = "approximate={approximate!r}"

    def _check(self):
        if self.approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got "
                             f"{self.approximate!r}")


class Softmax(Call):
    _fn = staticmethod(_ops.softmax)
    _args = (("dim", None),)


class LogSoftmax(Softmax):
    _fn = staticmethod(_ops.log_softmax)


class Softmin(Softmax):
    _fn = staticmethod(C.softmin)


class Softmax2d(Module):
    def forward(self, input):  # noqa: A002
        if input.ndim not in (3, 4):
            raise ValueError(f"Softmax2d: expected a 3-D or 4-D input (got {input.ndim}D input)")
        return _ops.softmax(input, -3)


class GLU(Call):
    _fn = staticmethod(_ops.glu)
    _args = (("dim", -1),)


class LeakyReLU(Call):
    _fn = staticmethod(_ops.leaky_relu)
    _args = (("negative_slope", 1e-2), ("inplace", False))


class ELU(Call):
    _fn = staticmethod(_ops.elu)
    _args = (("alpha", 1.0), ("inplace", False))


class CELU(ELU):
    _fn = staticmethod(C.celu)


class Hardtanh(Call):
    _fn = staticmethod(C.hardtanh)
    _args = (("min_val", -1.0), ("max_val", 1.0), ("inplace", False))

    def _check(self):
        if self.min_val > self.max_val:
            raise ValueError(f"Hardtanh: min_val ({self.min_val}) cannot be greater than "
                             f"max_val ({self.max_val})")


class ReLU6(Hardtanh):
    _args = (("inplace", False),)
    _call = ("min_val", "max_val", "inplace")
    min_val, max_val = 0.0, 6.0

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Threshold(Call):
    _fn = staticmethod(C.threshold)
    _args = (("threshold", REQUIRED), ("value", REQUIRED), ("inplace", False))


class Softplus(Call):
    _fn = staticmethod(_ops.softplus)
    _args = (("beta", 1.0), ("threshold", 20.0))


class _Shrink(Call):
    _args = (("lambd", 0.5),)
    _repr = "{lambd}"


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


class RReLU(Call):
    """The inference form (slope (lower + upper) / 2); training mode draws random slopes,
    which is refused (NotImplementedError)."""
    _fn = staticmethod(C.rrelu)
    _args = (("lower", 1.0 / 8), ("upper", 1.0 / 3), ("inplace", False))
    _call = ("lower", "upper", "training", "inplace")
