"""Identity, Linear, Bilinear (torch.nn's, with torch's initialisation)."""
from __future__ import annotations

import math

from .. import init
from ... import ops as _ops
from .._compose import bilinear
from ._factory import kaiming_reset, weight_and_bias
from .module import Module

__all__ = ["Identity", "Linear", "Bilinear", "NonDynamicallyQuantizableLinear"]


class Identity(Module):
    """Returns its input; takes (and ignores) any constructor arguments, as torch's."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):  # noqa: A002
        return input


class Linear(Module):
    """y = x @ weight.T + bias; weight (out_features, in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        weight_and_bias(self, (out_features, in_features), (out_features,), device, dtype,
                        bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        kaiming_reset(self.weight, self.bias, self.weight.shape[1])

    def forward(self, input):  # noqa: A002
        return _ops.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class NonDynamicallyQuantizableLinear(Linear):
    """torch's name for MultiheadAttention's out_proj (a Linear; the name shows in repr)."""


class Bilinear(Module):
    """y = x1^T A x2 + b; weight (out_features, in1_features, in2_features)."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in1_features = in1_features
        self.in2_features = in2_features
        self.out_features = out_features
        weight_and_bias(self, (out_features, in1_features, in2_features), (out_features,),
                        device, dtype, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.weight.shape[1])
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1, input2):
        return bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")
