"""torch.nn.init: the common initialisers, in place, returning the tensor.

Random ones draw from nbx.random's cpu generator (torch's CPU generator, bit for bit): with
the same seed a module built here has the weights torch builds on the CPU. A tensor on
another device is filled from a cpu draw copied over (torch would use that device's own
generator, so the values differ there).
"""
from __future__ import annotations

import math
import numbers

from ..creation import empty
from ..tensor import Tensor

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_",
           "eye_", "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
           "kaiming_normal_", "orthogonal_", "sparse_"]


def _check(tensor, op):
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{op}: tensor must be a Tensor, got {type(tensor).__name__}")


def _draw(tensor, fill):
    # fill(t) fills a cpu tensor in place from the generator
    if tensor.device.type == "cpu":
        fill(tensor)
    else:
        tmp = empty(tuple(tensor.shape), dtype=tensor.dtype)
        fill(tmp)
        tensor.copy_(tmp)
    return tensor


def calculate_gain(nonlinearity, param=None):
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d")
    if nonlinearity in linear or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, numbers.Real) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _fans(tensor):
    if tensor.ndim < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 "
                         "dimensions")
    receptive = math.prod(tensor.shape[2:]) if tensor.ndim > 2 else 1
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


_calculate_fan_in_and_fan_out = _fans


def uniform_(tensor, a=0.0, b=1.0, generator=None):
    _check(tensor, "uniform_")
    return _draw(tensor, lambda t: t.uniform_(a, b, generator=generator))


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    _check(tensor, "normal_")
    return _draw(tensor, lambda t: t.normal_(mean, std, generator=generator))


def constant_(tensor, val):
    _check(tensor, "constant_")
    return tensor.fill_(val)


def ones_(tensor):
    return constant_(tensor, 1.0)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def eye_(tensor):
    _check(tensor, "eye_")
    if tensor.ndim != 2:
        raise ValueError(f"eye_: only 2-D tensors are supported, got shape {tuple(tensor.shape)}")
    from ..creation import eye
    return tensor.copy_(eye(*tensor.shape, dtype=tensor.dtype))


def xavier_uniform_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _fans(tensor)
    a = math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _fans(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _fans(tensor)
    return fan_in if mode == "fan_in" else fan_out


def _kaiming_std(tensor, a, mode, nonlinearity):
    fan = _calculate_correct_fan(tensor, mode)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan) if fan else 0.0


def kaiming_uniform_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    if 0 in tensor.shape:
        return tensor
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    if 0 in tensor.shape:
        return tensor
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)


def _host(tensor, op, fill):
    """Run fill(a) on a float64 NumPy copy drawn on the cpu, then write it into `tensor`
    (for initialisers whose torch algorithm needs a host-side step: erfinv, QR)."""
    import numpy as np
    from ..creation import tensor as _tensor
    if not tensor.dtype.is_floating_point:
        raise TypeError(f"{op}: tensor must be floating point, got {tensor.dtype.name}")
    tmp = empty(tuple(tensor.shape), dtype=tensor.dtype)
    a = fill(tmp)
    tensor.copy_(_tensor(np.ascontiguousarray(a)).to(tensor.dtype))
    return tensor


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Values from N(mean, std) truncated to [a, b], by torch's rejection sampling (normal
    draws redrawn where outside [a, b] when that mass is > 0.3, else uniform proposals on
    [a, b] accepted against the density), so a seeded cpu draw matches torch's."""
    _check(tensor, "trunc_normal_")
    if 0 in tensor.shape:
        return tensor
    import numpy as np

    def norm_cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    if (mean < a - 2 * std) or (mean > b + 2 * std):
        import warnings
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. "
                      "The distribution of values may be incorrect.", stacklevel=2)
    p = norm_cdf((b - mean) / std) - norm_cdf((a - mean) / std)

    def draw(t, kind, *args):
        d = empty(tuple(t.shape), dtype=t.dtype)
        getattr(d, kind)(*args, generator=generator)
        return d.numpy()

    def fill(t):
        dt = t.numpy().dtype
        lo, hi = dt.type(a), dt.type(b)     # the bounds as the tensor's dtype holds them
        if p > 0.3:
            res = draw(t, "normal_", mean, std)
            while True:
                bad = (res < lo) | (res > hi)
                if not bad.any():
                    return res
                res = np.where(bad, draw(t, "normal_", mean, std), res)
        mode = max(a, min(mean, b))
        log_peak = -0.5 * ((mode - mean) / std) ** 2

        def log_pdf(c):
            z = (c - dt.type(mean)) / dt.type(std)
            return z * z * dt.type(-0.5) - dt.type(log_peak)

        res = draw(t, "uniform_", a, b)
        pending = np.log(draw(t, "uniform_", 0.0, 1.0)) > log_pdf(res)
        while pending.any():
            cand = draw(t, "uniform_", a, b)
            res = np.where(pending, cand, res)
            pending = np.where(pending, np.log(draw(t, "uniform_", 0.0, 1.0)) > log_pdf(cand),
                               pending)
        return res

    return _host(tensor, "trunc_normal_", fill)


def orthogonal_(tensor, gain=1, generator=None):
    """A (semi-)orthogonal matrix from the QR decomposition of a normal draw, sign-fixed by
    R's diagonal, as torch does; trailing dims are flattened."""
    _check(tensor, "orthogonal_")
    if tensor.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor
    import numpy as np
    rows = tensor.shape[0]
    cols = tensor.numel() // rows

    def fill(t):
        flat = empty((rows, cols), dtype=t.dtype).normal_(0, 1, generator=generator)
        m = flat.numpy().astype(np.float64)
        if rows < cols:
            m = m.T
        q, r = np.linalg.qr(m)
        q = q * np.sign(np.diag(r))
        if rows < cols:
            q = q.T
        return (q * gain).reshape(tuple(t.shape))

    return _host(tensor, "orthogonal_", fill)


def sparse_(tensor, sparsity, std=0.01, generator=None):
    """A 2-D tensor from N(0, std) with ceil(sparsity * rows) zeros in each column, the rows
    to zero drawn with randperm, as torch does."""
    _check(tensor, "sparse_")
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    from ..random import randperm
    rows, cols = tensor.shape
    num_zeros = int(math.ceil(sparsity * rows))

    def fill(t):
        t.normal_(0, std, generator=generator)
        a = t.numpy().copy()
        for c in range(cols):
            zero = randperm(rows, generator=generator).numpy()[:num_zeros]
            a[zero, c] = 0
        return a

    return _host(tensor, "sparse_", fill)


def dirac_(tensor, groups=1):
    """The Dirac delta for a 3-, 4- or 5-D convolution weight: the identity on the channels
    (per group)."""
    _check(tensor, "dirac_")
    if tensor.ndim not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    sizes = tuple(tensor.shape)
    if sizes[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    import numpy as np
    out_per_group = sizes[0] // groups
    n = min(out_per_group, sizes[1])
    a = np.zeros(sizes, np.float64)
    centre = tuple(s // 2 for s in sizes[2:])
    for g in range(groups):
        for d in range(n):
            a[(g * out_per_group + d, d) + centre] = 1
    from ..creation import tensor as _tensor
    return tensor.copy_(_tensor(a).to(tensor.dtype))
