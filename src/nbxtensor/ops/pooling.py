"""Pooling: max_pool1d/2d/3d, avg_pool1d/2d/3d, adaptive_avg_pool1d/2d/3d and
adaptive_max_pool1d/2d/3d, with torch's names, arguments and semantics.

Every problem reaches the backends as one "pool" dispatch on 5-D views (N, C, D, H, W):
1-D and 2-D problems get size-1 leading spatial dims, unbatched inputs a size-1 batch.
The views keep the caller's strides (NCHW, channels-last, any strided input reaches the
kernels uncopied); a channels-last input gets a channels-last output, as torch.

Windows, per spatial axis of input size I and output size O:
  * max/avg: output o reads positions o*stride - padding + k*dilation, k < kernel_size;
    positions outside [0, I) are padding (never the maximum; zeros for the average).
    O = floor((I + 2p - d(k-1) - 1 + (s-1 if ceil_mode)) / s) + 1, less one when ceil_mode
    would start the last window in the right padding.
  * adaptive: output o reads [floor(o*I/O), ceil((o+1)*I/O)); where O divides I on every
    axis that is the plain window kernel = stride = I/O, and runs as one.
Max pooling propagates NaN (a NaN in the window is the result) and returns, with
return_indices, each maximum's flat index in its (D, H, W) plane, as torch. The average
divides by divisor_override, else by the window's size clipped to the padded input
(count_include_pad) or to the input. 16-bit inputs are computed in fp32 and rounded once.
"""
from __future__ import annotations

import numbers

from .. import dtypes as _dt
from ..dispatch import impl
from ..tensor import Tensor
from ._common import check_tensor
from .conv import _as3d, _channels_last, _ints, _pad3

__all__ = ["max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
           "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
           "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d"]

SUPPORTED_DTYPES = {"pool": ("float16", "bfloat16", "float32", "float64")}


def _check_input(x, nd, op):
    check_tensor(x, "input", op)
    if not x.dtype.is_floating_point or x.dtype.is_float8:
        raise TypeError(f"{op}: input must have a float16, bfloat16, float32 or float64 dtype, "
                        f"got {x.dtype.name}")
    if x.ndim not in (nd + 1, nd + 2):
        raise ValueError(f"{op}: expected a {nd + 1}-D (unbatched) or {nd + 2}-D (batched) "
                         f"input, got shape {tuple(x.shape)}")
    if any(n == 0 for n in x.shape[x.ndim - nd - 1:]):   # (a batch of 0 is allowed)
        raise ValueError(f"{op}: expected non-zero channel and spatial sizes, got shape "
                         f"{tuple(x.shape)}")


def _batched(x, nd):
    """(x as (N, C, *spatial), whether a batch dim was added)."""
    if x.ndim == nd + 1:
        return x.unsqueeze(0), True
    return x, False


def _new_like(x, shape, dtype):
    """An output of `shape` laid out as x: channels-last for a channels-last input."""
    if not _channels_last(x):
        return Tensor._empty(shape, dtype, x.device)
    nd = len(shape) - 2
    o = Tensor._empty((shape[0],) + tuple(shape[2:]) + (shape[1],), dtype, x.device)
    return o.permute((0, nd + 1) + tuple(range(1, nd + 1)))


def _out_len(i, k, s, p, d, ceil_mode):
    num = i + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    o = num // s + 1
    if ceil_mode and (o - 1) * s >= i + p:
        o -= 1
    return o


def _run(x, nd, op, out_sizes, kernel, stride, padding, dilation, adaptive, is_max,
         return_indices, count_include_pad=True, divisor=0):
    xb, added = _batched(x, nd)
    shape = tuple(xb.shape[:2]) + tuple(out_sizes)
    out = _new_like(xb, shape, x.dtype)
    idx = _new_like(xb, shape, _dt.int64) if return_indices else None
    if out.numel():
        impl("pool", x.device)(_as3d(out, nd), None if idx is None else _as3d(idx, nd),
                               _as3d(xb, nd), _pad3(kernel, nd, 1), _pad3(stride, nd, 1),
                               _pad3(padding, nd, 0), _pad3(dilation, nd, 1),
                               adaptive=adaptive, is_max=is_max,
                               count_include_pad=bool(count_include_pad), divisor=divisor)
    if added:
        out = out.squeeze(0)
        idx = None if idx is None else idx.squeeze(0)
    return (out, idx) if return_indices else out


def _windowed(input, nd, op, kernel_size, stride, padding, dilation, ceil_mode, is_max,  # noqa: A002
              return_indices=False, count_include_pad=True, divisor_override=None):
    _check_input(input, nd, op)
    k = _ints(kernel_size, nd, "kernel_size", op, 1)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) \
        else _ints(stride, nd, "stride", op, 1)
    p = _ints(padding, nd, "padding", op, 0)
    d = _ints(dilation, nd, "dilation", op, 1)
    if any(pi > ki // 2 for pi, ki in zip(p, k)):
        raise ValueError(f"{op}: padding should be at most half of kernel_size, but got "
                         f"padding={p} and kernel_size={k}")
    divisor = 0
    if divisor_override is not None:
        if not isinstance(divisor_override, numbers.Integral) or isinstance(divisor_override, bool):
            raise TypeError(f"{op}: divisor_override must be an int, got {divisor_override!r}")
        if divisor_override == 0:
            raise ValueError(f"{op}: divisor_override must be non-zero, got 0")
        divisor = int(divisor_override)
    spatial = tuple(input.shape[-nd:])
    outs = tuple(_out_len(i, ki, si, pi, di, ceil_mode)
                 for i, ki, si, pi, di in zip(spatial, k, s, p, d))
    if any(o < 1 for o in outs):
        lead = tuple(input.shape[-nd - 1:-nd])
        raise ValueError(f"{op}: given input size {lead + spatial}, the calculated output size "
                         f"{lead + outs} is too small (kernel_size={k}, stride={s}, "
                         f"padding={p}, dilation={d})")
    return _run(input, nd, op, outs, k, s, p, d, False, is_max, return_indices,
                count_include_pad, divisor)


def _adaptive(input, output_size, nd, op, is_max, return_indices=False):  # noqa: A002
    _check_input(input, nd, op)
    spatial = tuple(input.shape[-nd:])
    if isinstance(output_size, numbers.Integral) and not isinstance(output_size, bool):
        output_size = (int(output_size),) * nd
    if not isinstance(output_size, (tuple, list)) or len(output_size) not in (1, nd) or not all(
            o is None or (isinstance(o, numbers.Integral) and not isinstance(o, bool))
            for o in output_size):
        raise TypeError(f"{op}: output_size must be an int or a tuple of {nd} ints (None keeps "
                        f"the input's size), got {output_size!r}")
    output_size = tuple(output_size) * (nd if len(output_size) == 1 else 1)
    outs = tuple(i if o is None else int(o) for i, o in zip(spatial, output_size))
    if any(o < 0 for o in outs):
        raise ValueError(f"{op}: output_size must be non-negative, got {output_size!r}")
    if all(n and i % n == 0 for i, n in zip(spatial, outs)):
        # bins that divide the input evenly are plain windows, kernel = stride = I / O (the
        # same positions, counts and indices), which the backends' window-tiling paths take
        k = tuple(i // n for i, n in zip(spatial, outs))
        return _run(input, nd, op, outs, k, k, (0,) * nd, (1,) * nd, False, is_max,
                    return_indices, True, 0)
    # the widest window of each axis: the kernels loop over it and mask the shorter ones
    kmax = tuple(max(-(-((o + 1) * i) // n) - (o * i) // n for o in range(n)) if n else 1
                 for i, n in zip(spatial, outs))
    return _run(input, nd, op, outs, kmax, (1,) * nd, (0,) * nd, (1,) * nd, True, is_max,
                return_indices)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,  # noqa: A002
               return_indices=False):
    return _windowed(input, 1, "max_pool1d", kernel_size, stride, padding, dilation,
                     ceil_mode, True, return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,  # noqa: A002
               return_indices=False):
    return _windowed(input, 2, "max_pool2d", kernel_size, stride, padding, dilation,
                     ceil_mode, True, return_indices)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,  # noqa: A002
               return_indices=False):
    return _windowed(input, 3, "max_pool3d", kernel_size, stride, padding, dilation,
                     ceil_mode, True, return_indices)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
               count_include_pad=True):
    return _windowed(input, 1, "avg_pool1d", kernel_size, stride, padding, 1, ceil_mode, False,
                     count_include_pad=count_include_pad)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
               count_include_pad=True, divisor_override=None):
    return _windowed(input, 2, "avg_pool2d", kernel_size, stride, padding, 1, ceil_mode, False,
                     count_include_pad=count_include_pad, divisor_override=divisor_override)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
               count_include_pad=True, divisor_override=None):
    return _windowed(input, 3, "avg_pool3d", kernel_size, stride, padding, 1, ceil_mode, False,
                     count_include_pad=count_include_pad, divisor_override=divisor_override)


def adaptive_avg_pool1d(input, output_size):  # noqa: A002
    return _adaptive(input, output_size, 1, "adaptive_avg_pool1d", False)


def adaptive_avg_pool2d(input, output_size):  # noqa: A002
    return _adaptive(input, output_size, 2, "adaptive_avg_pool2d", False)


def adaptive_avg_pool3d(input, output_size):  # noqa: A002
    return _adaptive(input, output_size, 3, "adaptive_avg_pool3d", False)


def adaptive_max_pool1d(input, output_size, return_indices=False):  # noqa: A002
    return _adaptive(input, output_size, 1, "adaptive_max_pool1d", True, return_indices)


def adaptive_max_pool2d(input, output_size, return_indices=False):  # noqa: A002
    return _adaptive(input, output_size, 2, "adaptive_max_pool2d", True, return_indices)


def adaptive_max_pool3d(input, output_size, return_indices=False):  # noqa: A002
    return _adaptive(input, output_size, 3, "adaptive_max_pool3d", True, return_indices)

