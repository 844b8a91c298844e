"""Token sampling for the generate loop (host NumPy; the on-device sampler of issue 6
replaces it on cuda): greedy, temperature, top-k, top-p, repetition penalty, seed."""
from __future__ import annotations

import numpy as np

__all__ = ["Sampler"]


class Sampler:
    """Picks the next token from a logits vector. temperature == 0 means greedy (argmax,
    first index on ties as torch.argmax)."""

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
        self.seed = seed             # the device loop seeds its nbx.Generator with it
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits, previous=()) -> int:
        x = np.asarray(logits.numpy() if hasattr(logits, "numpy") else logits,
                       dtype=np.float64).reshape(-1).copy()
        if self.repetition_penalty != 1.0 and len(previous):
            # HF's rule: shrink the logits of tokens already seen toward "less likely"
            idx = np.unique(np.asarray(previous, np.int64))
            v = x[idx]
            x[idx] = np.where(v > 0, v / self.repetition_penalty, v * self.repetition_penalty)
        if self.temperature == 0.0:
            return int(np.argmax(x))
        x = x / self.temperature
        if self.top_k and self.top_k < x.size:
            kth = np.partition(x, -self.top_k)[-self.top_k]
            x = np.where(x < kth, -np.inf, x)
        p = np.exp(x - np.max(x))
        p /= p.sum()
        if self.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            # keep the smallest prefix whose mass reaches top_p (at least one token)
            keep = cum - p[order] < self.top_p
            mask = np.zeros_like(p, dtype=bool)
            mask[order[keep]] = True
            p = np.where(mask, p, 0.0)
            p /= p.sum()
        return int(self.rng.choice(p.size, p=p))
