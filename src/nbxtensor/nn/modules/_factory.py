"""The device/dtype keywords every layer's constructor takes (torch's factory_kwargs)."""
from __future__ import annotations

from ...creation import empty, ones, zeros
from .module import Parameter


def param(shape, device=None, dtype=None) -> Parameter:
    return Parameter(empty(tuple(shape), dtype=dtype, device=device))


def zeros_buf(shape, device=None, dtype=None):
    return zeros(tuple(shape), dtype=dtype, device=device)


def ones_buf(shape, device=None, dtype=None):
    return ones(tuple(shape), dtype=dtype, device=device)


def weight_and_bias(module, weight_shape, bias_shape, device=None, dtype=None, *, weight=True,
                    bias=True) -> None:
    """module.weight and module.bias as uninitialised Parameters, or registered as None where
    the layer has none (torch's layout: no weight means no bias either)."""
    module.register_parameter("weight", param(weight_shape, device, dtype) if weight else None)
    module.register_parameter("bias", param(bias_shape, device, dtype) if weight and bias
                              else None)


def kaiming_reset(weight, bias, fan_in) -> None:
    """torch's default init of Linear and the convolutions: kaiming_uniform_(a=sqrt(5)) for
    the weight, the bias uniform in +-1/sqrt(fan_in) (zeros when fan_in is 0)."""
    import math

    from .. import init
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        init.uniform_(bias, -bound, bound)
