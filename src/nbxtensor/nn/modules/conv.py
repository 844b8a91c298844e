"""Conv1d/2d/3d and ConvTranspose1d/2d/3d (torch.nn's, with torch's parameters, checks,
initialisation and repr). The arithmetic is nbxtensor.ops.conv's."""
from __future__ import annotations

import math
import numbers

from ...ops import conv as _conv
from ._factory import kaiming_reset, weight_and_bias
from .module import Module

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d"]


def _ntuple(v, n, name):
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return (int(v),) * n
    if isinstance(v, (tuple, list)) and len(v) in (1, n) and all(
            isinstance(e, numbers.Integral) and not isinstance(e, bool) for e in v):
        return tuple(int(e) for e in v) * (n if len(v) == 1 else 1)
    raise TypeError(f"{name} must be an int or a tuple of {n} ints, got {v!r}")


class _ConvNd(Module):
    _nd = 0
    _transposed = False

    def __init_subclass__(cls, nd=None, **kwargs):
        # Conv1d ... ConvTranspose3d state their number of spatial dims in the class header
        super().__init_subclass__(**kwargs)
        if nd is not None:
            cls._nd = nd

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros", device=None,
                 dtype=None, output_padding=0):
        super().__init__()
        nd = self._nd
        if not isinstance(groups, numbers.Integral) or groups <= 0:
            raise ValueError(f"groups must be a positive integer, got {groups!r}")
        if in_channels % groups != 0:
            raise ValueError(f"in_channels must be divisible by groups (in_channels="
                             f"{in_channels}, groups={groups})")
        if out_channels % groups != 0:
            raise ValueError(f"out_channels must be divisible by groups (out_channels="
                             f"{out_channels}, groups={groups})")
        if padding_mode not in _conv.PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {_conv.PADDING_MODES}, but got "
                             f"padding_mode={padding_mode!r}")
        kernel_size = _ntuple(kernel_size, nd, "kernel_size")
        stride = _ntuple(stride, nd, "stride")
        dilation = _ntuple(dilation, nd, "dilation")
        if isinstance(padding, str):
            if self._transposed or padding not in ("same", "valid"):
                allowed = "an int or a tuple" if self._transposed else "'same', 'valid'"
                raise ValueError(f"Invalid padding {padding!r}, should be {allowed}")
            if padding == "same" and any(s != 1 for s in stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            lo_hi = [(0, 0)] * nd if padding == "valid" else [
                (d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2)
                for d, k in zip(dilation, kernel_size)]
        else:
            padding = _ntuple(padding, nd, "padding")
            lo_hi = [(p, p) for p in padding]
        if self._transposed and padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for '
                             f'{self.__class__.__name__}')
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.groups, self.padding_mode = dilation, groups, padding_mode
        self.transposed = self._transposed
        self.output_padding = _ntuple(output_padding, nd, "output_padding")
        # F.pad's order: last dim first (torch's attribute of the same name)
        self._reversed_padding_repeated_twice = [p for pair in reversed(lo_hi) for p in pair]
        shape = ((in_channels, out_channels // groups) if self._transposed
                 else (out_channels, in_channels // groups)) + kernel_size
        weight_and_bias(self, shape, (out_channels,), device, dtype, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        kaiming_reset(self.weight, self.bias,
                      self.weight.shape[1] * math.prod(self.weight.shape[2:]))

    def extra_repr(self) -> str:
        nd = self._nd
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0,) * nd:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * nd:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * nd:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class _Conv(_ConvNd):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros", device=None,
                 dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)

    def forward(self, input):  # noqa: A002
        return _conv._conv(input, self.weight, self.bias, self.stride, self.padding,
                           self.dilation, self.groups, self.padding_mode, self._nd)


class _ConvTranspose(_ConvNd):
    _transposed = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode="zeros",
                 device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype, output_padding)

    def _output_padding(self, input, output_size):  # noqa: A002
        """torch's rule: the output_padding that gives `output_size` (spatial dims, or the
        whole shape), which must lie in [smallest, smallest + stride - 1]."""
        if output_size is None:
            return self.output_padding
        nd = self._nd
        output_size = tuple(int(n) for n in output_size)
        lead = 2 if input.ndim == nd + 2 else 1
        if len(output_size) == lead + nd:
            output_size = output_size[lead:]
        if len(output_size) != nd:
            raise ValueError(f"ConvTranspose{nd}D: for {input.ndim}D input, output_size must "
                             f"have {nd} or {lead + nd} elements (got {len(output_size)})")
        res = []
        for d in range(nd):
            lo = ((input.shape[lead + d] - 1) * self.stride[d] - 2 * self.padding[d]
                  + self.dilation[d] * (self.kernel_size[d] - 1) + 1)
            hi = lo + self.stride[d] - 1
            if not lo <= output_size[d] <= hi:
                raise ValueError(f"requested an output size of {output_size}, but valid sizes "
                                 f"range from {lo} to {hi} (for an input of "
                                 f"{tuple(input.shape[lead:])})")
            res.append(output_size[d] - lo)
        return tuple(res)

    def forward(self, input, output_size=None):  # noqa: A002
        return _conv._conv_transpose(input, self.weight, self.bias, self.stride, self.padding,
                                     self._output_padding(input, output_size), self.groups,
                                     self.dilation, self._nd)


class Conv1d(_Conv, nd=1):
    """torch.nn.Conv1d: weight (out_channels, in_channels/groups, k)."""


class Conv2d(_Conv, nd=2):
    """torch.nn.Conv2d: weight (out_channels, in_channels/groups, kH, kW)."""


class Conv3d(_Conv, nd=3):
    """torch.nn.Conv3d: weight (out_channels, in_channels/groups, kD, kH, kW)."""


class ConvTranspose1d(_ConvTranspose, nd=1):
    """torch.nn.ConvTranspose1d: weight (in_channels, out_channels/groups, k)."""


class ConvTranspose2d(_ConvTranspose, nd=2):
    """torch.nn.ConvTranspose2d: weight (in_channels, out_channels/groups, kH, kW)."""


class ConvTranspose3d(_ConvTranspose, nd=3):
    """torch.nn.ConvTranspose3d: weight (in_channels, out_channels/groups, kD, kH, kW)."""
