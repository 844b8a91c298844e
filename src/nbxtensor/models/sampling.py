"""The generation loop's sampling settings: greedy, temperature, top-k, top-p, repetition
penalty, seed. Drawing is the library's `nbx.sample` on the logits' device, with an
`nbx.Generator` seeded once per sampler; the device loop (models/graph_decode.py) takes the
same settings and the same generator seed."""
from __future__ import annotations

import numpy as np

import nbxtensor as nbx

__all__ = ["Sampler"]


class Sampler:
    """Picks the next token from a logits vector. temperature == 0 means greedy (argmax,
    first index on ties as torch.argmax); top_k 0 and top_p 1.0 are off, as HF's."""

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, seed: int | None = None):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.repetition_penalty = repetition_penalty
        self.seed = seed             # the device loop seeds its nbx.Generator with it too
        self._generators: dict = {}  # device -> this sampler's nbx.Generator there

    def _generator(self, device):
        g = self._generators.get(str(device))
        if g is None:
            seed = self.seed if self.seed is not None else \
                np.random.SeedSequence().entropy % (1 << 62)
            g = self._generators[str(device)] = nbx.Generator(seed, device=device)
        return g

    def __call__(self, logits, previous=()) -> int:
        """The next token id for `logits` (a (V,) Tensor or array); `previous`: the ids seen
        so far (the repetition penalty's)."""
        x = logits if isinstance(logits, nbx.Tensor) else nbx.tensor(np.asarray(logits))
        x = x.reshape(-1)
        if not x.dtype.is_floating_point:
            x = x.to(nbx.float64)
        penalty = self.repetition_penalty if self.repetition_penalty != 1.0 and len(previous) \
            else None
        prev = None if penalty is None else \
            nbx.tensor(np.asarray(previous, np.int64), device=x.device)
        if self.temperature == 0.0 and penalty is None:
            return int(nbx.argmax(x))
        return int(nbx.sample(x, temperature=float(self.temperature),
                              top_k=self.top_k if self.top_k and self.top_k < x.shape[0] else None,
                              top_p=self.top_p if self.top_p < 1.0 else None,
                              repetition_penalty=penalty, previous_tokens=prev,
                              generator=self._generator(x.device)))
