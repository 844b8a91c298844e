"""Convolutions: conv1d/2d/3d and conv_transpose1d/2d/3d with torch's names and semantics.

    conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
           padding_mode="zeros")
    conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups=1, dilation=1)

`padding` of a conv is an int, a tuple, 'valid' (no padding) or 'same' (stride 1 only; an
odd total puts the extra element at the end, as torch). `padding_mode` (an extension of
the functional form; torch's Conv modules take it) is 'zeros', 'reflect', 'replicate' or
'circular': the other modes pad through `pad` first, as torch's modules do.

Every problem is handed to the backends as a 3-D one: (N, C, D, H, W) input,
(C_out, C_in/groups, KD, KH, KW) weight (conv_transpose: (C_in, C_out/groups, ...)),
(N, C_out, OD, OH, OW) output, 1-D and 2-D problems with size-1 leading spatial dims, so
one kernel family serves all three. The views keep the caller's strides: NCHW,
channels-last and other strided inputs reach the kernels uncopied. A channels-last input
(channels the innermost dim in memory) gets a channels-last output, as torch.

Dispatch: `conv` (cpu: backends/cpu/conv.py; cuda/interp: kernels/conv.py, which routes
1x1 problems to the matmul, depthwise ones to a direct kernel and 16-bit stride-1 ones to
a TMA kernel) and `conv_transpose`. `conv2d_activation` (an extension) is conv2d with a
ReLU applied in the same pass. 16-bit inputs are computed
with fp32 accumulation and rounded once; float64 in float64. fp32 on cuda follows
`set_float32_matmul_precision` (IEEE by default; TF32 when allowed).
"""
from __future__ import annotations

import numbers

from ..dispatch import impl
from ..tensor import Tensor
from ._common import check_float, check_like_input, check_tensor

__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d"]

SUPPORTED_DTYPES = {n: ("float16", "bfloat16", "float32", "float64")
                    for n in ("conv", "conv_transpose")}

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
_PAD_MODE = {"reflect": "reflect", "replicate": "replicate", "circular": "circular"}


def _ints(v, nd, name, op, minimum):
    """An int or a sequence of 1 or nd ints (torch's expansion), each >= minimum."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        t = (int(v),) * nd
    elif isinstance(v, (tuple, list)) and len(v) in (1, nd) and all(
            isinstance(e, numbers.Integral) and not isinstance(e, bool) for e in v):
        t = tuple(int(e) for e in v) * (nd if len(v) == 1 else 1)
    else:
        raise TypeError(f"{op}: {name} must be an int or a tuple of {nd} ints, got {v!r}")
    if any(e < minimum for e in t):
        what = "positive" if minimum > 0 else "non-negative"
        raise ValueError(f"{op}: {name} must be {what}, got {v!r}")
    return t


def _check_operands(input, weight, bias, nd, op, w_desc):  # noqa: A002
    check_tensor(input, "input", op)
    check_tensor(weight, "weight", op)
    check_float(input, "input", op)
    check_like_input(weight, "weight", input, op)
    if weight.ndim != nd + 2:
        raise ValueError(f"{op}: weight must be {nd + 2}-D {w_desc}, got shape "
                         f"{tuple(weight.shape)}")
    if input.ndim not in (nd + 1, nd + 2):
        raise ValueError(f"{op}: expected a {nd + 1}-D (unbatched) or {nd + 2}-D (batched) "
                         f"input, got shape {tuple(input.shape)}")
    if bias is not None:
        check_tensor(bias, "bias", op)
        check_like_input(bias, "bias", input, op)


def _checked_args(input, weight, bias, groups, stride, dilation, nd, op, w_channels):  # noqa: A002
    """The operands of a convolution checked (weight (w_channels, k...)); (groups, stride,
    dilation) as an int and tuples of nd ints."""
    _check_operands(input, weight, bias, nd, op,
                    "(" + w_channels + ", " + ", ".join("k" * nd) + ")")
    return (_check_groups(groups, op), _ints(stride, nd, "stride", op, 1),
            _ints(dilation, nd, "dilation", op, 1))


def _as_batch(input, weight, groups, nd, op, w_rows):  # noqa: A002
    """(whether input is batched, input as a batch), once `groups` is known to divide
    weight.shape[0] (its `w_rows`)."""
    batched = input.ndim == nd + 2
    n = weight.shape[0]
    if n % groups:
        raise ValueError(f"{op}: groups={groups} must divide {w_rows} = weight.shape[0] = {n}")
    return batched, input if batched else input.unsqueeze(0)


def _check_groups(groups, op):
    if not isinstance(groups, numbers.Integral) or isinstance(groups, bool):
        raise TypeError(f"{op}: groups must be an int, got {groups!r}")
    if groups < 1:
        raise ValueError(f"{op}: groups must be positive, got {groups}")
    return int(groups)


def _check_bias(bias, n, op):
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"{op}: bias must have shape ({n},) (one value per output channel), "
                         f"got {tuple(bias.shape)}")


def _precision():
    """The fp32 product precision ('ieee' or 'tf32'): set_float32_matmul_precision's switch."""
    from .linalg import _PRECISIONS, _fp32_precision
    return _PRECISIONS[_fp32_precision]


def _as3d(t, nd):
    """(N, C, *spatial) -> (N, C, D, H, W): size-1 dims (stride 0) in front of the spatial ones."""
    if nd == 3:
        return t
    pre = 3 - nd
    return t._view(tuple(t.shape[:2]) + (1,) * pre + tuple(t.shape[2:]),
                   tuple(t.stride()[:2]) + (0,) * pre + tuple(t.stride()[2:]))


def _pad3(v, nd, fill):
    return (fill,) * (3 - nd) + tuple(v)


def _channels_last(x):
    """Whether x (N, C, *spatial) stores channels innermost: x.permute(0, 2.., 1) contiguous
    (torch's channels_last / channels_last_3d, which exist for 2-D and 3-D convs only)."""
    if x.ndim < 4 or x.shape[1] <= 1 or x.stride(1) != 1:
        return False
    return x.permute((0,) + tuple(range(2, x.ndim)) + (1,)).is_contiguous()


def _new_output(x, shape):
    """The output, laid out as the input: channels-last for a channels-last input."""
    if not _channels_last(x):
        return Tensor._empty(shape, x.dtype, x.device)
    nd = len(shape) - 2
    o = Tensor._empty((shape[0],) + tuple(shape[2:]) + (shape[1],), x.dtype, x.device)
    return o.permute((0, nd + 1) + tuple(range(1, nd + 1)))


def _conv(input, weight, bias, stride, padding, dilation, groups, padding_mode, nd,  # noqa: A002
          activation=None, op=None):
    op = op or f"conv{nd}d"
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    groups, stride, dilation = _checked_args(input, weight, bias, groups, stride, dilation, nd,
                                             op, "out_channels, in_channels/groups")
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"{op}: padding_mode must be one of {PADDING_MODES}, got "
                         f"{padding_mode!r}")
    ks = tuple(weight.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            lo = hi = (0,) * nd
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"{op}: padding='same' is not supported for strided "
                                 f"convolutions (stride={stride})")
            total = tuple(d * (k - 1) for d, k in zip(dilation, ks))
            lo = tuple(t // 2 for t in total)
            hi = tuple(t - t // 2 for t in total)
        else:
            raise ValueError(f"{op}: padding must be 'same', 'valid', an int or a tuple of "
                             f"{nd} ints, got {padding!r}")
    else:
        lo = hi = _ints(padding, nd, "padding", op, 0)
    batched, x = _as_batch(input, weight, groups, nd, op, "out_channels")
    c_out, c_in_g = weight.shape[0], weight.shape[1]
    if x.shape[1] != c_in_g * groups:
        raise ValueError(f"{op}: expected input with {c_in_g * groups} channels "
                         f"(weight.shape[1] = {c_in_g} x groups = {groups}), got "
                         f"{x.shape[1]} channels (input shape {tuple(input.shape)})")
    _check_bias(bias, c_out, op)
    if padding_mode != "zeros" and any(lo + hi):
        pads = []
        for a, b in zip(reversed(lo), reversed(hi)):
            pads += [a, b]
        from .shape import pad
        x = pad(x, pads, mode=_PAD_MODE[padding_mode])
        lo = hi = (0,) * nd
    spatial = tuple(x.shape[2:])
    osz = []
    for i, a, b, d, k, s in zip(spatial, lo, hi, dilation, ks, stride):
        span = d * (k - 1) + 1
        if i + a + b < span:
            padded = tuple(n + p + q for n, p, q in zip(spatial, lo, hi))
            raise ValueError(f"{op}: the padded input {padded} is smaller than the dilated kernel "
                             f"{tuple(dd * (kk - 1) + 1 for dd, kk in zip(dilation, ks))} "
                             f"(input shape {tuple(input.shape)}, weight shape "
                             f"{tuple(weight.shape)})")
        osz.append((i + a + b - span) // s + 1)
    out = _new_output(x, (x.shape[0], c_out) + tuple(osz))
    if out.numel():
        extra = {} if activation is None else {"activation": activation}
        impl("conv", x.device)(_as3d(out, nd), _as3d(x, nd), _as3d(weight, nd), bias,
                               _pad3(stride, nd, 1), _pad3(lo, nd, 0), _pad3(dilation, nd, 1),
                               groups, precision=_precision(), **extra)
    return out if batched else out.squeeze(0)


def _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation,  # noqa: A002
                    nd):
    op = f"conv_transpose{nd}d"
    groups, stride, dilation = _checked_args(input, weight, bias, groups, stride, dilation, nd,
                                             op, "in_channels, out_channels/groups")
    if isinstance(padding, str):
        raise ValueError(f"{op}: padding must be an int or a tuple of {nd} ints, got "
                         f"{padding!r} (string padding is for conv only)")
    padding = _ints(padding, nd, "padding", op, 0)
    output_padding = _ints(output_padding, nd, "output_padding", op, 0)
    for p, s, d in zip(output_padding, stride, dilation):
        if p >= max(s, d):
            raise ValueError(f"{op}: output_padding {output_padding} must be smaller than "
                             f"either stride {stride} or dilation {dilation}")
    batched, x = _as_batch(input, weight, groups, nd, op, "in_channels")
    c_in, c_out_g = weight.shape[0], weight.shape[1]
    if x.shape[1] != c_in:
        raise ValueError(f"{op}: expected input with {c_in} channels (weight.shape[0]), got "
                         f"{x.shape[1]} channels (input shape {tuple(input.shape)})")
    c_out = c_out_g * groups
    _check_bias(bias, c_out, op)
    ks = tuple(weight.shape[2:])
    osz = tuple((i - 1) * s - 2 * p + d * (k - 1) + q + 1 for i, s, p, d, k, q in
                zip(x.shape[2:], stride, padding, dilation, ks, output_padding))
    if any(o < 1 for o in osz):
        raise ValueError(f"{op}: the output size {osz} is too small (input shape "
                         f"{tuple(input.shape)}, weight shape {tuple(weight.shape)}, "
                         f"padding {padding})")
    out = _new_output(x, (x.shape[0], c_out) + osz)
    if out.numel():
        impl("conv_transpose", x.device)(
            _as3d(out, nd), _as3d(x, nd), _as3d(weight, nd), bias, _pad3(stride, nd, 1),
            _pad3(padding, nd, 0), _pad3(dilation, nd, 1), groups, precision=_precision())
    return out if batched else out.squeeze(0)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,  # noqa: A002
           padding_mode="zeros"):
    """torch.nn.functional.conv1d: input (N, C_in, L) or (C_in, L)."""
    return _conv(input, weight, bias, stride, padding, dilation, groups, padding_mode, 1)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,  # noqa: A002
           padding_mode="zeros"):
    """torch.nn.functional.conv2d: input (N, C_in, H, W) or (C_in, H, W)."""
    return _conv(input, weight, bias, stride, padding, dilation, groups, padding_mode, 2)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,  # noqa: A002
           padding_mode="zeros"):
    """torch.nn.functional.conv3d: input (N, C_in, D, H, W) or (C_in, D, H, W)."""
    return _conv(input, weight, bias, stride, padding, dilation, groups, padding_mode, 3)


ACTIVATIONS = (None, "relu")


def conv2d_activation(input, weight, bias=None, stride=1, padding=0,  # noqa: A002
                      dilation=1, groups=1, *, padding_mode="zeros", activation=None):
    """conv2d with `activation` (None or 'relu') applied to its output in the same pass --
    on cuda/interp in the kernel's epilogue, before the one rounding (an nbx extension,
    not in torch: the models' convolution + ReLU pairs, whose separate ReLU would read
    and write the whole activation once more)."""
    return _conv(input, weight, bias, stride, padding, dilation, groups, padding_mode, 2,
                 activation, "conv2d_activation")


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0,  # noqa: A002
                     groups=1, dilation=1):
    """torch.nn.functional.conv_transpose1d: weight (C_in, C_out/groups, k)."""
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups,
                           dilation, 1)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0,  # noqa: A002
                     groups=1, dilation=1):
    """torch.nn.functional.conv_transpose2d: weight (C_in, C_out/groups, kH, kW)."""
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups,
                           dilation, 2)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0,  # noqa: A002
                     groups=1, dilation=1):
    """torch.nn.functional.conv_transpose3d: weight (C_in, C_out/groups, kD, kH, kW)."""
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups,
                           dilation, 3)
