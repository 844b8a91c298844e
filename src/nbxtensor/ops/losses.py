"""torch.nn.functional's losses, distances and encodings, written over the op surface
(log_softmax, gather, vector_norm, matmul, element-wise ops), so they run on every device
those run on: one_hot, normalize, cosine_similarity, pairwise_distance, cdist, cross_entropy,
nll_loss, mse_loss, l1_loss, smooth_l1_loss, huber_loss, kl_div, binary_cross_entropy,
binary_cross_entropy_with_logits.
"""
from __future__ import annotations

import builtins
import math

from .. import dtypes as _dt
from ..tensor import Tensor
from . import elementwise as _ew
from . import indexing as _ix
from . import linalg as _la
from . import nn as _nn
from . import reduction as _red
from . import shape as _sh
from ._common import check_float, check_tensor

__all__ = ["one_hot", "normalize", "cosine_similarity", "pairwise_distance", "cdist",
           "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
           "kl_div", "binary_cross_entropy", "binary_cross_entropy_with_logits"]

_REDUCTIONS = ("none", "mean", "sum")


def _reduction(reduction, size_average, reduce, op, extra=()):
    if size_average is not None or reduce is not None:   # torch's legacy arguments
        sa = True if size_average is None else size_average
        rd = True if reduce is None else reduce
        reduction = "none" if not rd else ("mean" if sa else "sum")
    if reduction not in _REDUCTIONS + tuple(extra):
        raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS + tuple(extra)}, got "
                         f"{reduction!r}")
    return reduction


def _reduce(loss, reduction):
    if reduction == "mean":
        return _red.mean(loss)
    if reduction == "sum":
        return _red.sum(loss)
    return loss


def _same_device(a, b, an, bn, op):
    if b is not None and a.device != b.device:
        raise ValueError(f"{op}: {bn} is on {b.device} but {an} is on {a.device}")


# ------------------------------------------------------------------ encodings, distances
class ClassIndexError(IndexError, ValueError):
    """A class index outside [0, num_classes): an index out of range (IndexError, as the
    indexing ops raise) and a bad value (ValueError), as NumPy's AxisError is both."""


def one_hot(tensor, num_classes=-1):
    """int64 (*, num_classes): 1 at each index of the int64 `tensor`, 0 elsewhere."""
    x = check_tensor(tensor, "tensor", "one_hot")
    if x.dtype is not _dt.int64:
        raise TypeError(f"one_hot: tensor must be int64 (class indices), got {x.dtype.name}")
    if x.numel():
        lo, hi = _red.min(x).item(), _red.max(x).item()
        if lo < 0:
            raise ClassIndexError(f"one_hot: class values must be non-negative, got {lo}")
    elif num_classes < 0:
        raise ValueError("one_hot: cannot infer num_classes from an empty tensor")
    if num_classes == -1:
        num_classes = hi + 1
    elif x.numel() and hi >= num_classes:
        raise ClassIndexError(f"one_hot: class values must be smaller than num_classes "
                              f"({num_classes}), got {hi}")
    from ..creation import arange
    return _ew.eq(x.unsqueeze(-1), arange(num_classes, device=x.device)).to(_dt.int64)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):  # noqa: A002
    """input / max(||input||_p along dim, eps)."""
    x = check_tensor(input, "input", "normalize")
    n = _ew.clamp_min(_red.vector_norm(x, p, dim, keepdim=True), eps)
    return _ew.div(x, n, out=out) if out is not None else _ew.div(x, n)


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """Cosine of the angle between x1 and x2 along `dim` (broadcast), each norm clamped at eps."""
    check_tensor(x1, "x1", "cosine_similarity"), check_tensor(x2, "x2", "cosine_similarity")
    _same_device(x1, x2, "x1", "x2", "cosine_similarity")
    from ..tensor import broadcast_shapes
    shape = broadcast_shapes(x1.shape, x2.shape)
    a, b = x1.expand(shape), x2.expand(shape)
    dt = _dt.promote_types(a.dtype, b.dtype)
    if not dt.is_floating_point:
        dt = _dt.get_default_dtype()
    a, b = a.to(dt), b.to(dt)
    na = _ew.clamp_min(_red.vector_norm(a, 2, dim, keepdim=True), eps)
    nb = _ew.clamp_min(_red.vector_norm(b, 2, dim, keepdim=True), eps)
    return _red.sum(_ew.mul(_ew.div(a, na), _ew.div(b, nb)), dim)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """||x1 - x2 + eps||_p over the last dim (broadcast)."""
    check_tensor(x1, "x1", "pairwise_distance"), check_tensor(x2, "x2", "pairwise_distance")
    _same_device(x1, x2, "x1", "x2", "pairwise_distance")
    d = _ew.add(_ew.sub(x1, x2), eps)
    if d.ndim == 0:
        d = d.reshape(1)
    return _red.vector_norm(d, p, -1, keepdim=keepdim)


_CDIST_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
                "donot_use_mm_for_euclid_dist")
_CDIST_CHUNK = 1 << 22   # elements of one broadcast difference block (bounds the temporary)


def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """p-norm distances between the rows of x1 (B, P, M) and x2 (B, R, M): (B, P, R).

    p=2 through one matmul (torch's expansion |a|^2 - 2ab + |b|^2, clamped at 0) when
    compute_mode asks for it (by default when P or R exceeds 25), else directly, in row blocks.
    """
    check_float(x1, "x1", "cdist"), check_float(x2, "x2", "cdist")
    _same_device(x1, x2, "x1", "x2", "cdist")
    if x1.dtype is not x2.dtype:
        raise TypeError(f"cdist: x1 and x2 must have one dtype, got {x1.dtype.name} and "
                        f"{x2.dtype.name}")
    if x1.ndim < 2 or x2.ndim < 2:
        raise ValueError(f"cdist: x1 and x2 must have at least 2 dims, got shapes "
                         f"{tuple(x1.shape)} and {tuple(x2.shape)}")
    if x1.shape[-1] != x2.shape[-1]:
        raise ValueError(f"cdist: x1 and x2 must have the same number of columns, got "
                         f"{x1.shape[-1]} and {x2.shape[-1]}")
    if p < 0:
        raise ValueError(f"cdist: p must be non-negative, got {p}")
    if compute_mode not in _CDIST_MODES:
        raise ValueError(f"cdist: compute_mode must be one of {_CDIST_MODES}, got "
                         f"{compute_mode!r}")
    from ..tensor import broadcast_shapes
    batch = tuple(broadcast_shapes(x1.shape[:-2], x2.shape[:-2]))
    a = x1.expand(batch + tuple(x1.shape[-2:]))
    b = x2.expand(batch + tuple(x2.shape[-2:]))
    P, R, M = a.shape[-2], b.shape[-2], a.shape[-1]
    use_mm = p == 2 and (compute_mode == "use_mm_for_euclid_dist"
                         or (compute_mode == _CDIST_MODES[0] and (P > 25 or R > 25)))
    if use_mm:
        an = _red.sum(_ew.mul(a, a), -1, keepdim=True)
        bn = _red.sum(_ew.mul(b, b), -1, keepdim=True)
        a_ = _sh.cat([_ew.mul(a, -2), an, _ew.add(_ew.mul(an, 0), 1)], -1)
        b_ = _sh.cat([b, _ew.add(_ew.mul(bn, 0), 1), bn], -1)
        return _ew.sqrt(_ew.clamp_min(_la.matmul(a_, b_.transpose(-1, -2)), 0))
    step = builtins.max(1, _CDIST_CHUNK // builtins.max(1, R * M * builtins.max(1, math.prod(batch))))
    parts = []
    for s in range(0, P, step):
        n = builtins.min(step, P - s)
        d = _ew.sub(a.narrow(-2, s, n).unsqueeze(-2), b.unsqueeze(-3))   # (..., n, R, M)
        parts.append(_red.vector_norm(d, p, -1))
    if not parts:
        return Tensor._empty(batch + (P, R), a.dtype, a.device)
    return parts[0] if len(parts) == 1 else _sh.cat(parts, -2)


# ------------------------------------------------------------------ classification losses
def _class_dim(input):
    return 0 if input.ndim == 1 else 1


def _check_weight(weight, c, input, op):
    if weight is None:
        return None
    check_float(weight, "weight", op)
    _same_device(input, weight, "input", "weight", op)
    if tuple(weight.shape) != (c,):
        raise ValueError(f"{op}: weight must have shape ({c},) (one per class), got "
                         f"{tuple(weight.shape)}")
    return weight


def _class_view(t, input):
    """A per-class tensor (C,) shaped to broadcast along input's class dim."""
    shape = [1] * input.ndim
    shape[_class_dim(input)] = -1
    return t.reshape(shape)


def _check_targets(input, target, op):
    check_tensor(target, "target", op)
    _same_device(input, target, "input", "target", op)
    if target.dtype is not _dt.int64:
        raise TypeError(f"{op}: class-index target must be int64, got {target.dtype.name}")
    cd = _class_dim(input)
    want = tuple(input.shape[:cd]) + tuple(input.shape[cd + 1:])
    if tuple(target.shape) != want:
        raise ValueError(f"{op}: target must have shape {want} for input of shape "
                         f"{tuple(input.shape)}, got {tuple(target.shape)}")


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100,  # noqa: A002
             reduce=None, reduction="mean"):
    """-weight[t] * input[..., t, ...] for each target class t (input holds log-probabilities
    along dim 1, or dim 0 of a 1-D input); `ignore_index` targets count zero and are left out
    of the mean's weight total."""
    op = "nll_loss"
    reduction = _reduction(reduction, size_average, reduce, op)
    check_float(input, "input", op)
    if input.ndim == 0:
        raise ValueError("nll_loss: input must have at least 1 dim (the classes)")
    _check_targets(input, target, op)
    cd = _class_dim(input)
    c = input.shape[cd]
    weight = _check_weight(weight, c, input, op)
    keep = _ew.ne(target, ignore_index)
    if target.numel():
        bad = _ew.logical_and(keep, _ew.logical_or(_ew.lt(target, 0), _ew.ge(target, c)))
        if _red.any(bad).item():
            t = _ix.masked_select(target, bad).reshape(-1)[0].item()
            raise IndexError(f"{op}: target {t} is out of bounds for {c} classes")
    safe = _ew.where(keep, target, 0)
    picked = _ix.gather(input, cd, safe.unsqueeze(cd)).squeeze(cd)
    w = _ew.where(keep, 1.0, 0.0).to(input.dtype)
    if weight is not None:
        w = _ew.mul(w, _ix.gather(weight, 0, safe.reshape(-1)).reshape(safe.shape))
    loss = _ew.neg(_ew.mul(picked, w))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return _red.sum(loss)
    return _ew.div(_red.sum(loss), _red.sum(w))


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,  # noqa: A002
                  reduce=None, reduction="mean", label_smoothing=0.0):
    """log_softmax along the class dim, then nll_loss (class-index target) or
    -sum(target * log_softmax) (a probability target of input's shape); label_smoothing mixes
    the target with the uniform distribution, as torch."""
    op = "cross_entropy"
    reduction = _reduction(reduction, size_average, reduce, op)
    check_float(input, "input", op)
    check_tensor(target, "target", op)
    if input.ndim == 0:
        raise ValueError("cross_entropy: input must have at least 1 dim (the classes)")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be between 0.0 and 1.0, got "
                         f"{label_smoothing}")
    cd = _class_dim(input)
    c = input.shape[cd]
    weight = _check_weight(weight, c, input, op)
    logp = _nn.log_softmax(input, cd)
    if target.dtype.is_floating_point:       # class probabilities
        _same_device(input, target, "input", "target", op)
        if tuple(target.shape) != tuple(input.shape):
            raise ValueError(f"{op}: a probability target must have input's shape "
                             f"{tuple(input.shape)}, got {tuple(target.shape)}")
        if target.dtype is not input.dtype:
            raise TypeError(f"{op}: a probability target must have input's dtype "
                            f"{input.dtype.name}, got {target.dtype.name}")
        if label_smoothing > 0:
            target = _ew.add(_ew.mul(target, 1 - label_smoothing), label_smoothing / c)
        prod = _ew.mul(logp, target)
        if weight is not None:
            prod = _ew.mul(prod, _class_view(weight, input))
        loss = _ew.neg(_red.sum(prod, cd))
        if reduction == "mean":
            return _ew.div(_red.sum(loss), builtins.max(1, input.numel() // c) if input.numel()
                           else 0.0)
        return _reduce(loss, reduction)
    nll = nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if label_smoothing == 0:
        return nll
    keep = _ew.ne(target, ignore_index)
    lp = logp if weight is None else _ew.mul(logp, _class_view(weight, input))
    smooth = _ew.where(keep, _ew.neg(_red.sum(lp, cd)), 0.0)
    if reduction == "mean":
        if weight is not None:
            safe = _ew.where(keep, target, 0)
            wsum = _red.sum(_ew.where(keep, _ix.gather(weight, 0, safe.reshape(-1)).reshape(
                safe.shape), 0.0))
        else:
            wsum = _red.sum(keep)
        smooth = _ew.div(_red.sum(smooth), wsum)
    elif reduction == "sum":
        smooth = _red.sum(smooth)
    return _ew.add(_ew.mul(nll, 1 - label_smoothing), _ew.mul(smooth, label_smoothing / c))


# ------------------------------------------------------------------ regression losses
def _pointwise_pair(input, target, op):
    check_float(input, "input", op), check_tensor(target, "target", op)
    _same_device(input, target, "input", "target", op)


def _same_shape_pair(input, target, reduction, size_average, reduce, op):  # noqa: A002
    """The reduction of a loss whose target has exactly input's shape (no broadcasting)."""
    _pointwise_pair(input, target, op)
    r = _reduction(reduction, size_average, reduce, op)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"{op}: target must have input's shape {tuple(input.shape)}, got "
                         f"{tuple(target.shape)}")
    return r


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):  # noqa: A002
    _pointwise_pair(input, target, "mse_loss")
    r = _reduction(reduction, size_average, reduce, "mse_loss")
    d = _ew.sub(input, target)
    loss = _ew.mul(d, d)
    if weight is not None:
        loss = _ew.mul(loss, weight)
    return _reduce(loss, r)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):  # noqa: A002
    _pointwise_pair(input, target, "l1_loss")
    r = _reduction(reduction, size_average, reduce, "l1_loss")
    loss = _ew.abs(_ew.sub(input, target))
    if weight is not None:
        loss = _ew.mul(loss, weight)
    return _reduce(loss, r)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean",  # noqa: A002
                   beta=1.0):
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta 0: the L1 loss)."""
    _pointwise_pair(input, target, "smooth_l1_loss")
    r = _reduction(reduction, size_average, reduce, "smooth_l1_loss")
    if beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    ad = _ew.abs(_ew.sub(input, target))
    if beta == 0:
        return _reduce(ad, r)
    loss = _ew.where(_ew.lt(ad, beta), _ew.div(_ew.mul(_ew.mul(ad, ad), 0.5), beta),
                     _ew.sub(ad, 0.5 * beta))
    return _reduce(loss, r)


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):  # noqa: A002
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta)."""
    _pointwise_pair(input, target, "huber_loss")
    r = _reduction(reduction, None, None, "huber_loss")
    if delta <= 0:
        raise ValueError(f"huber_loss: delta must be positive, got {delta}")
    ad = _ew.abs(_ew.sub(input, target))
    loss = _ew.where(_ew.lt(ad, delta), _ew.mul(_ew.mul(ad, ad), 0.5),
                     _ew.mul(_ew.sub(ad, 0.5 * delta), delta))
    if weight is not None:
        loss = _ew.mul(loss, weight)
    return _reduce(loss, r)


def kl_div(input, target, size_average=None, reduce=None, reduction="mean",  # noqa: A002
           log_target=False):
    """target * (log target - input) (input: log-probabilities), 0 where target is 0;
    log_target: exp(target) * (target - input). 'batchmean' divides the sum by input.size(0)."""
    _pointwise_pair(input, target, "kl_div")
    r = _reduction(reduction, size_average, reduce, "kl_div", ("batchmean",))
    if log_target:
        loss = _ew.mul(_ew.exp(target), _ew.sub(target, input))
    else:
        # xlogy(t, t) - t * input: 0 * log 0 counts as 0
        tlogt = _ew.where(_ew.eq(target, 0), 0.0, _ew.mul(target, _ew.log(target)))
        loss = _ew.sub(tlogt, _ew.mul(target, input))
    if r == "batchmean":
        s = _red.sum(loss)
        return _ew.div(s, input.shape[0]) if input.ndim else s
    return _reduce(loss, r)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,  # noqa: A002
                         reduction="mean"):
    """-(t log x + (1 - t) log(1 - x)), each log clamped at -100 (torch); x must be in [0, 1]."""
    op = "binary_cross_entropy"
    r = _same_shape_pair(input, target, reduction, size_average, reduce, op)
    if input.numel() and _red.any(_ew.logical_or(_ew.lt(input, 0), _ew.gt(input, 1))).item():
        raise ValueError(f"{op}: all elements of input should be between 0 and 1")
    lx = _ew.clamp_min(_ew.log(input), -100)
    l1x = _ew.clamp_min(_ew.log(_ew.sub(1, input)), -100)
    loss = _ew.neg(_ew.add(_ew.mul(target, lx), _ew.mul(_ew.sub(1, target), l1x)))
    if weight is not None:
        loss = _ew.mul(loss, weight)
    return _reduce(loss, r)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None,  # noqa: A002
                                     reduce=None, reduction="mean", pos_weight=None):
    """binary_cross_entropy(sigmoid(input), target) computed stably from the logits;
    pos_weight scales the positive term (broadcast along the last dim)."""
    op = "binary_cross_entropy_with_logits"
    r = _same_shape_pair(input, target, reduction, size_average, reduce, op)
    # log(1 + exp(-|x|)) + max(-x, 0) = -logsigmoid(x), without overflow
    sp = _ew.add(_ew.log1p(_ew.exp(_ew.neg(_ew.abs(input)))), _ew.clamp_min(_ew.neg(input), 0))
    if pos_weight is not None:
        lw = _ew.add(_ew.mul(_ew.sub(pos_weight, 1), target), 1)
        loss = _ew.add(_ew.mul(_ew.sub(1, target), input), _ew.mul(lw, sp))
    else:
        loss = _ew.add(_ew.mul(_ew.sub(1, target), input), sp)
    if weight is not None:
        loss = _ew.mul(loss, weight)
    return _reduce(loss, r)
