"""torch.distributions for sampling code: Categorical (the distribution generation loops and
policies draw tokens from). Written over nbxtensor's ops, so every device runs it; on cpu a
seeded draw equals torch's (multinomial is bit-identical there).
"""
from __future__ import annotations

import math

from . import dtypes as _dt
from .tensor import Size, Tensor

__all__ = ["Distribution", "Categorical"]


class Distribution:
    """The base: batch_shape and event_shape, as torch.distributions.Distribution."""

    has_rsample = False

    def __init__(self, batch_shape=Size(), event_shape=Size(), validate_args=None):
        self._batch_shape = Size(batch_shape)
        self._event_shape = Size(event_shape)

    @property
    def batch_shape(self) -> Size:
        return self._batch_shape

    @property
    def event_shape(self) -> Size:
        return self._event_shape

    def _extended_shape(self, sample_shape=Size()) -> Size:
        return Size(tuple(sample_shape) + tuple(self._batch_shape) + tuple(self._event_shape))

    def sample_n(self, n):
        return self.sample(Size((n,)))

    def __repr__(self):
        return f"{type(self).__name__}()"


class Categorical(Distribution):
    """torch.distributions.Categorical(probs=None, logits=None): one of K categories per
    batch element (the last dim of probs/logits). probs need not sum to 1 (they are
    normalised); logits are unnormalised log-probabilities. sample() returns int64 indices."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        from . import ops as _ops
        src = probs if probs is not None else logits
        name = "probs" if probs is not None else "logits"
        if not isinstance(src, Tensor):
            raise TypeError(f"Categorical: {name} must be a Tensor, got {type(src).__name__}")
        if src.ndim < 1:
            raise ValueError(f"Categorical: {name} must have at least one dimension")
        if not src.dtype.is_floating_point:
            raise TypeError(f"Categorical: {name} must be a floating tensor, got {src.dtype.name}")
        if probs is not None:
            self._probs = _ops.div(probs, _ops.sum(probs, -1, keepdim=True))
            self._logits = None
        else:
            self._logits = _ops.sub(logits, _ops.logsumexp(logits, -1, keepdim=True))
            self._probs = None
        self._param = src
        self._num_events = src.shape[-1]
        super().__init__(src.shape[:-1], Size(), validate_args)

    @property
    def probs(self) -> Tensor:
        if self._probs is None:
            from . import ops as _ops
            self._probs = _ops.softmax(self._logits, -1)
        return self._probs

    @property
    def logits(self) -> Tensor:
        if self._logits is None:      # torch's probs_to_logits: log of probs clamped to (eps, 1-eps)
            from . import ops as _ops
            eps = _dt.finfo(self._probs.dtype).eps
            self._logits = _ops.log(_ops.clamp(self._probs, eps, 1 - eps))
        return self._logits

    @property
    def param_shape(self) -> Size:
        return self._param.shape

    @property
    def mean(self) -> Tensor:
        from .creation import full
        return full(self._extended_shape(), math.nan, dtype=self.probs.dtype,
                    device=self.probs.device)

    @property
    def mode(self) -> Tensor:
        return self.probs.argmax(-1)

    @property
    def variance(self) -> Tensor:
        return self.mean

    def sample(self, sample_shape=Size()):
        """Indices drawn as torch draws them: multinomial(probs_2d, n, replacement=True).T."""
        from . import random as _random
        shape = Size(sample_shape if isinstance(sample_shape, (tuple, list, Size))
                     else (sample_shape,))
        n = math.prod(shape)
        probs_2d = self.probs.reshape(-1, self._num_events)
        samples_2d = _random.multinomial(probs_2d, n, True).T
        return samples_2d.reshape(self._extended_shape(shape))

    def log_prob(self, value) -> Tensor:
        from . import ops as _ops
        if not isinstance(value, Tensor):
            raise TypeError(f"Categorical.log_prob: value must be a Tensor, got "
                            f"{type(value).__name__}")
        value = value.long().unsqueeze(-1)
        value, log_pmf = _ops.broadcast_tensors(value, self.logits)
        value = value[..., :1]
        return log_pmf.gather(-1, value).squeeze(-1)

    def entropy(self) -> Tensor:
        from . import ops as _ops
        min_real = _dt.finfo(self.logits.dtype).min
        logits = _ops.clamp(self.logits, min=min_real)
        return _ops.neg(_ops.sum(_ops.mul(logits, self.probs), -1))

    def enumerate_support(self, expand=True) -> Tensor:
        from .creation import arange
        values = arange(self._num_events, device=self._param.device)
        values = values.view((-1,) + (1,) * len(self._batch_shape))
        if expand:
            values = values.expand((-1,) + tuple(self._batch_shape))
        return values

    def __repr__(self):
        name = "probs" if self._probs is not None and self._logits is None else "logits"
        return f"Categorical({name}: {self._param.shape})"
