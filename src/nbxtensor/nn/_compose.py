"""torch.nn.functional entries written over the op surface (no kernel of their own).

Each is a few existing ops (clamp, where, exp/expm1, linear, mean/var, ...), so it runs on
every device those ops run on. `nbx.nn.functional` re-exports them; the modules call them.
"""
from __future__ import annotations

import math
import numbers

from .. import ops as _ops
from ..tensor import Tensor

__all__ = ["relu6", "hardtanh", "hardtanh_", "celu", "selu", "threshold", "logsigmoid",
           "softsign", "tanhshrink", "softshrink", "hardshrink", "prelu", "rrelu", "softmin",
           "instance_norm", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
           "feature_alpha_dropout", "bilinear", "embedding_bag"]

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _tensor(x, op, argname="input"):
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: {argname} must be a Tensor, got {type(x).__name__}")
    return x


def _result(x, r, inplace):
    # the in-place spelling writes the out-of-place result back (one extra copy, same values)
    return x.copy_(r) if inplace else r


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):  # noqa: A002
    _tensor(input, "hardtanh")
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val ({max_val})")
    return _result(input, _ops.clamp(input, min_val, max_val), inplace)


def hardtanh_(input, min_val=-1.0, max_val=1.0):  # noqa: A002
    return hardtanh(input, min_val, max_val, inplace=True)


def relu6(input, inplace=False):  # noqa: A002
    return hardtanh(input, 0.0, 6.0, inplace)


def celu(input, alpha=1.0, inplace=False):  # noqa: A002
    _tensor(input, "celu")
    if alpha == 0:
        raise ValueError("celu: alpha must not be 0 (it divides the input)")
    r = _ops.where(input > 0, input, _ops.expm1(input / alpha) * alpha)
    return _result(input, r, inplace)


def selu(input, inplace=False):  # noqa: A002
    _tensor(input, "selu")
    r = _ops.where(input > 0, input, _ops.expm1(input) * _SELU_ALPHA) * _SELU_SCALE
    return _result(input, r, inplace)


def threshold(input, threshold, value, inplace=False):  # noqa: A002
    _tensor(input, "threshold")
    return _result(input, _ops.where(input > threshold, input, value), inplace)


def logsigmoid(input):  # noqa: A002
    # min(x, 0) - log1p(exp(-|x|)): no overflow for either sign
    _tensor(input, "logsigmoid")
    return _ops.clamp(input, max=0) - _ops.log1p(_ops.exp(-input.abs()))


def softsign(input):  # noqa: A002
    _tensor(input, "softsign")
    return input / (input.abs() + 1)


def tanhshrink(input):  # noqa: A002
    _tensor(input, "tanhshrink")
    return input - _ops.tanh(input)


def softshrink(input, lambd=0.5):  # noqa: A002
    _tensor(input, "softshrink")
    if lambd < 0:
        raise ValueError(f"softshrink: lambd must be >= 0, got {lambd}")
    return _ops.where(input > lambd, input - lambd,
                      _ops.where(input < -lambd, input + lambd, 0.0))


def hardshrink(input, lambd=0.5):  # noqa: A002
    _tensor(input, "hardshrink")
    return _ops.where(input.abs() > lambd, input, 0.0)


def prelu(input, weight):  # noqa: A002
    _tensor(input, "prelu")
    _tensor(weight, "prelu", "weight")
    n = weight.numel()
    if n != 1:
        if input.ndim < 2 and n != 1:
            raise ValueError(f"prelu: weight has {n} elements but an input of {input.ndim} dims "
                             f"has no channel dim (use one weight)")
        if input.ndim >= 2 and input.shape[1] != n:
            raise ValueError(f"prelu: weight has {n} elements but the input has "
                             f"{input.shape[1]} channels (dim 1)")
        w = weight.reshape((n,) + (1,) * (input.ndim - 2))
    else:
        w = weight.reshape(())
    return _ops.where(input >= 0, input, input * w)


def rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False):  # noqa: A002
    if training:
        raise NotImplementedError("rrelu: training=True draws random slopes; only the "
                                  "inference form (slope (lower + upper) / 2) is implemented")
    return _ops.leaky_relu(input, (lower + upper) / 2, inplace=inplace)


def softmin(input, dim=None, _stacklevel=3, dtype=None):  # noqa: A002
    _tensor(input, "softmin")
    return _ops.softmax(-input, dim, dtype)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,  # noqa: A002
                  use_input_stats=True, momentum=0.1, eps=1e-5):
    """Each (sample, channel) normalised over its spatial dims (input (N, C, *spatial))."""
    op = "instance_norm"
    _tensor(input, op)
    if input.ndim < 3:
        raise ValueError(f"{op}: expected an input of at least 3 dims (N, C, ...), got shape "
                         f"{tuple(input.shape)}")
    C = input.shape[1]
    shape = (1, C) + (1,) * (input.ndim - 2)
    if use_input_stats:
        dims = tuple(range(2, input.ndim))
        mean = input.mean(dims, keepdim=True)
        var = input.var(dims, keepdim=True, correction=0)
        if running_mean is not None or running_var is not None:
            raise NotImplementedError(f"{op}: updating running statistics (training with "
                                      f"track_running_stats) is not implemented")
    else:
        if running_mean is None or running_var is None:
            raise ValueError(f"{op}: use_input_stats=False needs running_mean and running_var")
        mean, var = running_mean.reshape(shape), running_var.reshape(shape)
    y = (input - mean) * _ops.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


# ---------------------------------------------------------------------------------- dropout
def _check_p(p, op):
    if not isinstance(p, numbers.Real) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{op}: dropout probability has to be between 0 and 1, but got {p}")


def _keep_mask(input, shape, p):
    # Bernoulli(1 - p) draws from nbx.random (MT19937 on cpu, Philox on cuda/interp)
    from ..creation import empty
    mask = empty(shape, dtype=input.dtype, device=input.device)
    return mask.bernoulli_(1.0 - p)


def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002
    _check_p(p, "dropout")
    _tensor(input, "dropout")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return _result(input, input * 0.0, inplace)
    r = input * _keep_mask(input, input.shape, p) * (1.0 / (1.0 - p))
    return _result(input, r, inplace)


def _feature_dropout(input, p, training, inplace, op, dims):
    _check_p(p, op)
    _tensor(input, op)
    if not training or p == 0.0:
        return input
    if input.ndim not in (dims + 1, dims + 2):
        raise ValueError(f"{op}: expected a {dims + 1}-D (unbatched) or {dims + 2}-D (batched) "
                         f"input, got shape {tuple(input.shape)}")
    lead = input.ndim - dims   # (N, C) or (C,): one draw per channel
    shape = tuple(input.shape[:lead]) + (1,) * dims
    if p == 1.0:
        return _result(input, input * 0.0, inplace)
    r = input * _keep_mask(input, shape, p) * (1.0 / (1.0 - p))
    return _result(input, r, inplace)


def dropout1d(input, p=0.5, training=True, inplace=False):  # noqa: A002
    return _feature_dropout(input, p, training, inplace, "dropout1d", 1)


def dropout2d(input, p=0.5, training=True, inplace=False):  # noqa: A002
    return _feature_dropout(input, p, training, inplace, "dropout2d", 2)


def dropout3d(input, p=0.5, training=True, inplace=False):  # noqa: A002
    return _feature_dropout(input, p, training, inplace, "dropout3d", 3)


def _alpha(input, p, training, inplace, op, shape):
    _check_p(p, op)
    _tensor(input, op)
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return _result(input, input * 0.0, inplace)
    alpha = _SELU_ALPHA * _SELU_SCALE     # torch's 1.7580993408473766
    a = 1.0 / math.sqrt((alpha * alpha * p + 1) * (1 - p))
    keep = _keep_mask(input, shape(input), p)
    r = input * (keep * a) + ((keep - 1.0) * (alpha * a) + alpha * a * p)
    return _result(input, r, inplace)


def alpha_dropout(input, p=0.5, training=False, inplace=False):  # noqa: A002
    return _alpha(input, p, training, inplace, "alpha_dropout", lambda x: x.shape)


def feature_alpha_dropout(input, p=0.5, training=False, inplace=False):  # noqa: A002
    return _alpha(input, p, training, inplace, "feature_alpha_dropout",
                  lambda x: tuple(x.shape[:2]) + (1,) * (x.ndim - 2))


# ---------------------------------------------------------------------------------- products
def bilinear(input1, input2, weight, bias=None):
    """y[..., o] = sum_ij x1[..., i] W[o, i, j] x2[..., j] + b[o]."""
    op = "bilinear"
    _tensor(input1, op, "input1")
    _tensor(input2, op, "input2")
    _tensor(weight, op, "weight")
    if weight.ndim != 3:
        raise ValueError(f"{op}: weight must be 3-D (out, in1, in2), got shape {tuple(weight.shape)}")
    O, I1, I2 = weight.shape
    if input1.shape[-1] != I1 or input2.shape[-1] != I2:
        raise ValueError(f"{op}: input1's last dim must be {I1} and input2's {I2}, got shapes "
                         f"{tuple(input1.shape)} and {tuple(input2.shape)}")
    if tuple(input1.shape[:-1]) != tuple(input2.shape[:-1]):
        raise ValueError(f"{op}: input1 and input2 must share their leading dims, got shapes "
                         f"{tuple(input1.shape)} and {tuple(input2.shape)}")
    lead = tuple(input1.shape[:-1])
    x1 = input1.reshape(-1, I1)
    x2 = input2.reshape(-1, I2)
    # (n, I1) @ (I1, O*I2) -> (n, O, I2), then contract I2 with x2
    t = _ops.matmul(x1, weight.permute(1, 0, 2).reshape(I1, O * I2)).reshape(-1, O, I2)
    y = _ops.matmul(t, x2.unsqueeze(-1)).squeeze(-1)
    if bias is not None:
        y = y + bias
    return y.reshape(lead + (O,))


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2,  # noqa: A002
                  scale_grad_by_freq=False, mode="mean", sparse=False, per_sample_weights=None,
                  include_last_offset=False, padding_idx=None):
    """Sums, means or maxima of bags of embeddings: input (B, N) (a bag per row) or 1-D with
    `offsets` (bag b is input[offsets[b]:offsets[b+1]])."""
    op = "embedding_bag"
    _tensor(input, op)
    _tensor(weight, op, "weight")
    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"{op}: mode must be 'sum', 'mean' or 'max', got {mode!r}")
    if per_sample_weights is not None:
        if mode != "sum":
            raise NotImplementedError(f"{op}: per_sample_weights is only supported for "
                                      f"mode='sum' (got mode={mode!r}), as in torch")
        if tuple(per_sample_weights.shape) != tuple(input.shape):
            raise ValueError(f"{op}: per_sample_weights must have the input's shape "
                             f"{tuple(input.shape)}, got {tuple(per_sample_weights.shape)}")
    if input.ndim == 2:
        if offsets is not None:
            raise ValueError(f"{op}: offsets must be None for a 2-D input, got a tensor")
        B, N = input.shape
        flat = input.reshape(-1)
        bounds = [(b * N, (b + 1) * N) for b in range(B)]
        psw = None if per_sample_weights is None else per_sample_weights.reshape(-1)
    elif input.ndim == 1:
        if offsets is None:
            raise ValueError(f"{op}: offsets must be given for a 1-D input")
        if offsets.ndim != 1:
            raise ValueError(f"{op}: offsets must be 1-D, got shape {tuple(offsets.shape)}")
        offs = [int(o) for o in offsets.tolist()]
        if offs and offs[0] != 0:
            raise ValueError(f"{op}: offsets[0] must be 0, got {offs[0]}")
        if any(a > b for a, b in zip(offs, offs[1:])) or (offs and offs[-1] > input.numel()):
            raise ValueError(f"{op}: offsets must be non-decreasing and at most the input's "
                             f"length {input.numel()}, got {offs}")
        ends = offs[1:] if include_last_offset else offs[1:] + [input.numel()]
        flat, bounds = input, list(zip(offs, ends))
        psw = per_sample_weights
    else:
        raise ValueError(f"{op}: input must be 1-D or 2-D, got shape {tuple(input.shape)}")
    emb = _ops.embedding(flat, weight, max_norm=max_norm, norm_type=norm_type)
    if psw is not None:
        emb = emb * psw.unsqueeze(-1)
    if padding_idx is not None:
        keep = (flat != padding_idx)
        emb = _ops.where(keep.unsqueeze(-1), emb, 0.0)
        counts = keep.to(weight.dtype)
    D = weight.shape[1]
    rows = []
    for a, b in bounds:
        if b == a:
            rows.append(_zeros((D,), weight))   # an empty bag is zeros in every mode (torch)
            continue
        seg = emb[a:b]
        if mode == "sum":
            rows.append(seg.sum(0))
        elif mode == "mean":
            n = counts[a:b].sum() if padding_idx is not None else b - a
            rows.append(seg.sum(0) / (_ops.clamp(n, min=1) if isinstance(n, Tensor) else n))
        else:
            if padding_idx is not None:
                seg = _ops.where(keep[a:b].unsqueeze(-1), seg, float("-inf"))
                m = seg.amax(0)
                rows.append(_ops.where(_ops.isinf(m) & (m < 0), 0.0, m))
            else:
                rows.append(seg.amax(0))
    if not rows:
        return _zeros((0, D), weight)
    return _ops.stack(rows)


def _zeros(shape, like):
    from ..creation import zeros
    return zeros(shape, dtype=like.dtype, device=like.device)
