"""Device-side sampling: `sample(logits, ...)` and the seeded `Generator`.

sample(logits, *, temperature=1.0, top_k=None, top_p=None, repetition_penalty=None,
       previous_tokens=None, generator=None) -> int64 tensor on logits' device
  * logits (V,) or (B, V), any float dtype; the result has shape () or (B,); nothing is
    read back to the host, so a decode loop (or a captured graph) feeds it straight back.
  * temperature 0 is greedy: argmax, first index on ties (torch). Otherwise HF's order:
    repetition penalty, temperature, top-k, top-p, then a draw from the kept tokens.
  * top_k keeps every token >= the k-th largest logit; top_p keeps every token whose
    value is >= the smallest v with mass(tokens > v) < top_p (after top-k). Tokens tied
    with a boundary value are all kept (HF would keep an arbitrary subset of such ties).
  * repetition_penalty p with previous_tokens (P,) or (B, P) int ids on the same device:
    logit / p where positive, logit * p otherwise (HF); ids outside [0, V) are ignored
    (use -1 as padding).
  * generator: an nbx.Generator on the logits' device (a per-device default seeded with
    torch's default seed otherwise). Its state is a device int64 tensor [seed, step]; each
    non-greedy call draws with the current step and advances it on the device.

Generator(seed=67280421310721, device="cpu"): `manual_seed(s)`, `initial_seed()`,
`get_state()` / `set_state(t)` (a copy of / from the [seed, step] tensor). The cpu and
GPU streams differ (documented in backends/cpu/sampling.py and kernels/sampling.py); each
is reproducible from the same seed.
"""
from __future__ import annotations

import numbers

from .. import dtypes as _dt
from ..device import Device
from ..dispatch import impl
from ..tensor import Tensor

__all__ = ["Generator", "sample"]

DEFAULT_SEED = 67280421310721


class Generator:
    def __init__(self, seed=DEFAULT_SEED, device="cpu"):
        from ..creation import zeros
        self.device = Device(device)
        self.state = zeros(2, dtype=_dt.int64, device=self.device)
        self.manual_seed(seed)

    def manual_seed(self, seed):
        from ..creation import tensor
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) \
                or not 0 <= seed < 2 ** 63:
            raise ValueError(f"Generator.manual_seed: seed must be an int in [0, 2**63), got "
                             f"{seed!r}")
        self._seed = int(seed)
        self.state.copy_(tensor([int(seed), 0], dtype=_dt.int64, device=self.device))
        return self

    def initial_seed(self):
        return self._seed

    def get_state(self):
        return self.state.clone()

    def set_state(self, new_state):
        if not isinstance(new_state, Tensor) or tuple(new_state.shape) != (2,) \
                or new_state.dtype is not _dt.int64:
            raise ValueError("Generator.set_state: expected an int64 tensor of shape (2,) "
                             "from get_state()")
        self.state.copy_(new_state.to(self.device))
        return self

    def __repr__(self):
        return f"Generator(seed={self._seed}, device={self.device})"


def check_draw_dtype(t, argname, op):
    """Refuse a tensor whose dtype sampling and the random distributions cannot compute in:
    they take float16/bfloat16/float32/float64 (float8 has too few bits for a draw)."""
    if not t.dtype.is_floating_point or t.dtype.is_float8:
        raise TypeError(f"{op}: {argname} must be float16/bfloat16/float32/float64, got "
                        f"{t.dtype.name}")


_DEFAULT: dict = {}


def _default_generator(device):
    g = _DEFAULT.get(str(device))
    if g is None:
        g = _DEFAULT[str(device)] = Generator(DEFAULT_SEED, device)
    return g


def sample(logits, *, temperature=1.0, top_k=None, top_p=None, repetition_penalty=None,
           previous_tokens=None, generator=None):
    op = "sample"
    if not isinstance(logits, Tensor):
        raise TypeError(f"{op}: logits must be a Tensor, got {type(logits).__name__}")
    check_draw_dtype(logits, "logits", op)
    if logits.ndim not in (1, 2) or logits.shape[-1] == 0:
        raise ValueError(f"{op}: logits must be (V,) or (B, V) with V > 0, got "
                         f"{tuple(logits.shape)}")
    dev = logits.device
    one = logits.ndim == 1
    x = logits.unsqueeze(0) if one else logits
    B, V = x.shape
    if not isinstance(temperature, numbers.Real) or isinstance(temperature, bool) \
            or not temperature >= 0 or temperature == float("inf"):
        raise ValueError(f"{op}: temperature must be a finite float >= 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool)
                              or top_k < 1):
        raise ValueError(f"{op}: top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1):
        raise ValueError(f"{op}: top_p must be None or a float in (0, 1], got {top_p!r}")
    prev = None
    if repetition_penalty is not None:
        if not isinstance(repetition_penalty, numbers.Real) or not repetition_penalty > 0:
            raise ValueError(f"{op}: repetition_penalty must be a float > 0, got "
                             f"{repetition_penalty!r}")
        if not isinstance(previous_tokens, Tensor):
            raise ValueError(f"{op}: repetition_penalty needs previous_tokens (an int tensor), "
                             f"got {type(previous_tokens).__name__}")
        if previous_tokens.device != dev:
            raise ValueError(f"{op}: previous_tokens is on {previous_tokens.device} but logits "
                             f"are on {dev}")
        if previous_tokens.dtype not in (_dt.int32, _dt.int64):
            raise TypeError(f"{op}: previous_tokens must be int32/int64, got "
                            f"{previous_tokens.dtype.name}")
        if previous_tokens.ndim == 1:
            prev = previous_tokens.unsqueeze(0).expand(B, previous_tokens.shape[0])
        elif previous_tokens.ndim == 2 and previous_tokens.shape[0] == B:
            prev = previous_tokens
        else:
            raise ValueError(f"{op}: previous_tokens must be (P,) or ({B}, P), got "
                             f"{tuple(previous_tokens.shape)}")
        if prev.shape[1] == 0:
            repetition_penalty, prev = None, None
    elif previous_tokens is not None:
        raise ValueError(f"{op}: previous_tokens given without repetition_penalty")
    if generator is None:
        generator = _default_generator(dev)
    elif not isinstance(generator, Generator):
        raise TypeError(f"{op}: generator must be an nbx.Generator, got "
                        f"{type(generator).__name__}")
    elif generator.device != dev:
        raise ValueError(f"{op}: generator is on {generator.device} but logits are on {dev}")
    out = Tensor._empty((B,), _dt.int64, dev)
    impl("sample", dev)(out, x, generator.state, temperature=float(temperature),
                        top_k=None if top_k is None else int(top_k),
                        top_p=None if top_p is None else float(top_p),
                        penalty=None if repetition_penalty is None else float(repetition_penalty),
                        previous=prev)
    return out[0] if one else out
