"""LayerNorm, RMSNorm, GroupNorm, BatchNorm1d/2d/3d, InstanceNorm1d/2d/3d (torch.nn's)."""
from __future__ import annotations

import numbers

from .. import init
from ... import dtypes as _dt
from ... import ops as _ops
from .._compose import instance_norm
from ._factory import ones_buf, param, weight_and_bias, zeros_buf
from .module import Module

__all__ = ["LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
           "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]


def _shape(normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(normalized_shape)


def _reset_affine(module) -> None:
    if module.weight is not None:
        init.ones_(module.weight)
    if module.bias is not None:
        init.zeros_(module.bias)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        weight_and_bias(self, self.normalized_shape, self.normalized_shape, device, dtype,
                        weight=elementwise_affine, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_affine(self)

    def forward(self, input):  # noqa: A002
        return _ops.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}")


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps=None, elementwise_affine: bool = True, device=None,
                 dtype=None):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = param(self.normalized_shape, device, dtype)
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.elementwise_affine:
            init.ones_(self.weight)

    def forward(self, x):
        return _ops.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class GroupNorm(Module):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 device=None, dtype=None, *, bias: bool = True):
        super().__init__()
        if num_channels % num_groups != 0:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        weight_and_bias(self, (num_channels,), (num_channels,), device, dtype, weight=affine,
                        bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_affine(self)

    def forward(self, input):  # noqa: A002
        return _ops.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")


class _NormBase(Module):
    """The parameters and running statistics of batch and instance norms (torch's layout)."""

    _version = 2

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None, *, bias=True):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        weight_and_bias(self, (num_features,), (num_features,), device, dtype, weight=affine,
                        bias=bias)
        if track_running_stats:
            self.register_buffer("running_mean", zeros_buf((num_features,), device, dtype))
            self.register_buffer("running_var", ones_buf((num_features,), device, dtype))
            self.register_buffer("num_batches_tracked",
                                 zeros_buf((), device, _dt.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # checkpoints without version metadata (other converters, pre-1.0 torch) may lack the
        # counter; torch fills it in rather than calling it missing
        version = local_metadata.get("version")
        key = prefix + "num_batches_tracked"
        if (version is None or version < 2) and self.track_running_stats \
                and key not in state_dict:
            state_dict[key] = self.num_batches_tracked
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def _check_input_dim(self, input):  # noqa: A002
        raise NotImplementedError

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")


class _BatchNorm(_NormBase):
    _dims: tuple = ()

    def __init_subclass__(cls, dims=None, **kwargs):
        # BatchNorm1d/2d/3d state the input ranks they accept in the class header
        super().__init_subclass__(**kwargs)
        if dims is not None:
            cls._dims = dims

    def _check_input_dim(self, input):  # noqa: A002
        if input.ndim not in self._dims:
            want = " or ".join(f"{d}D" for d in self._dims)
            raise ValueError(f"expected {want} input (got {input.ndim}D input)")

    def forward(self, input):  # noqa: A002
        self._check_input_dim(input)
        if not (self.training or self.running_mean is None):
            return _ops.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                   self.bias, False, 0.0, self.eps)
        # batch statistics: training mode, or no running statistics kept
        dims = (0,) + tuple(range(2, input.ndim))
        shape = (1, input.shape[1]) + (1,) * (input.ndim - 2)
        mean = input.mean(dims, keepdim=True)
        var = input.var(dims, keepdim=True, correction=0)
        if self.training and self.track_running_stats:
            self._update_running_stats(input, mean, var, dims)
        y = (input - mean) * _ops.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight.reshape(shape)
        if self.bias is not None:
            y = y + self.bias.reshape(shape)
        return y

    def _update_running_stats(self, input, mean, var, dims):
        self.num_batches_tracked.add_(1)
        if self.momentum is None:   # a cumulative moving average
            m = 1.0 / float(self.num_batches_tracked.item())
        else:
            m = self.momentum
        n = input.numel() // input.shape[1]
        unbiased = var.reshape(-1) * (n / max(n - 1, 1))
        self.running_mean.copy_(self.running_mean * (1 - m) + mean.reshape(-1) * m)
        self.running_var.copy_(self.running_var * (1 - m) + unbiased * m)


class BatchNorm1d(_BatchNorm, dims=(2, 3)):
    """torch.nn.BatchNorm1d: normalises each channel of (N, C) or (N, C, L) input."""


class BatchNorm2d(_BatchNorm, dims=(4,)):
    """torch.nn.BatchNorm2d: normalises each channel of (N, C, H, W) input."""


class BatchNorm3d(_BatchNorm, dims=(5,)):
    """torch.nn.BatchNorm3d: normalises each channel of (N, C, D, H, W) input."""


class _InstanceNorm(_NormBase):
    _spatial: int = 1

    def __init_subclass__(cls, spatial=None, **kwargs):
        # InstanceNorm1d/2d/3d state their number of spatial dims in the class header
        super().__init_subclass__(**kwargs)
        if spatial is not None:
            cls._spatial = spatial

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None, *, bias=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype,
                         bias=bias)

    def forward(self, input):  # noqa: A002
        d = self._spatial
        if input.ndim not in (d + 1, d + 2):
            raise ValueError(f"expected {d + 1}D or {d + 2}D input (got {input.ndim}D input)")
        unbatched = input.ndim == d + 1
        x = input.unsqueeze(0) if unbatched else input
        if x.shape[1] != self.num_features and self.affine:
            raise ValueError(f"expected input's size at dim={x.ndim - d - 1} to match "
                             f"num_features ({self.num_features}), but got: {x.shape[1]}.")
        use_input_stats = self.training or not self.track_running_stats
        if use_input_stats and self.training and self.track_running_stats:
            raise NotImplementedError(f"{type(self).__name__}: training with "
                                      f"track_running_stats=True (updating running statistics) "
                                      f"is not implemented; call .eval()")
        y = instance_norm(x, None if use_input_stats else self.running_mean,
                          None if use_input_stats else self.running_var, self.weight, self.bias,
                          use_input_stats, self.momentum or 0.0, self.eps)
        return y[0] if unbatched else y


class InstanceNorm1d(_InstanceNorm, spatial=1):
    """torch.nn.InstanceNorm1d: normalises each channel of each sample of (N, C, L) or
    (C, L) input."""


class InstanceNorm2d(_InstanceNorm, spatial=2):
    """torch.nn.InstanceNorm2d: normalises each channel of each sample of (N, C, H, W) or
    (C, H, W) input."""


class InstanceNorm3d(_InstanceNorm, spatial=3):
    """torch.nn.InstanceNorm3d: normalises each channel of each sample of (N, C, D, H, W)
    or (C, D, H, W) input."""
