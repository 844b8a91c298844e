"""Pooling, upsampling, pixel shuffle and unfold/fold modules (torch.nn's, with torch's
arguments and repr). The arithmetic is nbxtensor.ops.pooling's and ops.resample's."""
from __future__ import annotations

from ...ops import pooling as _P
from ...ops import resample as _R
from ._call import REQUIRED, Call
from .module import Module

__all__ = ["MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
           "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d",
           "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "Upsample", "UpsamplingNearest2d",
           "UpsamplingBilinear2d", "PixelShuffle", "PixelUnshuffle", "Unfold", "Fold"]


class _MaxPoolNd(Call):
    _args = (("kernel_size", REQUIRED), ("stride", None), ("padding", 0), ("dilation", 1),
             ("return_indices", False), ("ceil_mode", False))
    _call = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
    _repr = ("kernel_size={kernel_size}, stride={stride}, padding={padding}, "
             "dilation={dilation}, ceil_mode={ceil_mode}")

    def _check(self):
        if self.stride is None:
            self.stride = self.kernel_size


class MaxPool1d(_MaxPoolNd):
    _fn = staticmethod(_P.max_pool1d)


class MaxPool2d(_MaxPoolNd):
    _fn = staticmethod(_P.max_pool2d)


class MaxPool3d(_MaxPoolNd):
    _fn = staticmethod(_P.max_pool3d)


class _AvgPoolNd(Call):
    _args = (("kernel_size", REQUIRED), ("stride", None), ("padding", 0), ("ceil_mode", False),
             ("count_include_pad", True), ("divisor_override", None))
    _repr = "kernel_size={kernel_size}, stride={stride}, padding={padding}"

    def _check(self):
        if self.stride is None:
            self.stride = self.kernel_size


class AvgPool1d(_AvgPoolNd):
    _fn = staticmethod(_P.avg_pool1d)
    _args = _AvgPoolNd._args[:-1]

    def _check(self):
        def single(v):      # torch stores AvgPool1d's sizes as 1-tuples
            return tuple(v) if isinstance(v, (tuple, list)) else (v,)
        super()._check()
        self.kernel_size, self.stride = single(self.kernel_size), single(self.stride)
        self.padding = single(self.padding)


class AvgPool2d(_AvgPoolNd):
    _fn = staticmethod(_P.avg_pool2d)


class AvgPool3d(_AvgPoolNd):
    _fn = staticmethod(_P.avg_pool3d)


class _AdaptiveAvgPoolNd(Call):
    _args = (("output_size", REQUIRED),)


class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd):
    _fn = staticmethod(_P.adaptive_avg_pool1d)


class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd):
    _fn = staticmethod(_P.adaptive_avg_pool2d)


class AdaptiveAvgPool3d(_AdaptiveAvgPoolNd):
    _fn = staticmethod(_P.adaptive_avg_pool3d)


class _AdaptiveMaxPoolNd(Call):
    _args = (("output_size", REQUIRED), ("return_indices", False))
    _repr = "output_size={output_size}"


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    _fn = staticmethod(_P.adaptive_max_pool1d)


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    _fn = staticmethod(_P.adaptive_max_pool2d)


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    _fn = staticmethod(_P.adaptive_max_pool3d)


class Upsample(Module):
    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        if isinstance(scale_factor, (tuple, list)):
            self.scale_factor = tuple(float(f) for f in scale_factor)
        else:
            self.scale_factor = float(scale_factor) if scale_factor else None
        self.mode = mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input):  # noqa: A002
        return _R.interpolate(input, self.size, self.scale_factor, self.mode,
                              self.align_corners, self.recompute_scale_factor)

    def extra_repr(self) -> str:
        if self.scale_factor is not None:
            info = f"scale_factor={self.scale_factor!r}"
        else:
            info = f"size={self.size!r}"
        return info + f", mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)


class PixelShuffle(Call):
    _fn = staticmethod(_R.pixel_shuffle)
    _args = (("upscale_factor", REQUIRED),)


class PixelUnshuffle(Call):
    _fn = staticmethod(_R.pixel_unshuffle)
    _args = (("downscale_factor", REQUIRED),)


class Unfold(Call):
    _fn = staticmethod(_R.unfold)
    _args = (("kernel_size", REQUIRED), ("dilation", 1), ("padding", 0), ("stride", 1))


class Fold(Call):
    _fn = staticmethod(_R.fold)
    _args = (("output_size", REQUIRED), ("kernel_size", REQUIRED), ("dilation", 1),
             ("padding", 0), ("stride", 1))
