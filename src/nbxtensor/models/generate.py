"""The generation loop: prefill, then decode one token at a time, streaming text."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .sampling import Sampler

__all__ = ["generate", "GenerationResult"]


@dataclass
class GenerationResult:
    tokens: list = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    stopped_by: str = "length"

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        # the first new token comes out of the prefill; decode steps make the rest
        n = max(len(self.tokens) - 1, 0)
        return n / self.decode_seconds if self.decode_seconds else 0.0


def generate(model, prompt_ids, max_new_tokens: int = 32, sampler: Sampler | None = None,
             stop_ids=None, on_text=None, cache=None) -> GenerationResult:
    """Generate up to `max_new_tokens` after `prompt_ids`.

    on_text(str) receives decoded text as it becomes complete (UTF-8 safe streaming).
    Stops at any of `stop_ids` (default: the tokenizer's eos/eot ids); the stop token is
    kept in `tokens` but not in `text`.
    """
    prompt_ids = list(prompt_ids)
    if not prompt_ids:
        raise ValueError("generate: prompt_ids is empty")
    sampler = sampler or Sampler()
    tok = model.tokenizer
    stop = set(tok.eos_ids if stop_ids is None else stop_ids)
    need = len(prompt_ids) + max_new_tokens
    if cache is None or cache.max_len < need:
        cache = model.new_cache(max(need, 16))
    else:
        cache.reset()
    res = GenerationResult(prompt_tokens=len(prompt_ids))
    t0 = time.perf_counter()
    logits = model.forward(prompt_ids, cache)
    nxt = sampler(logits, prompt_ids)
    res.prefill_seconds = time.perf_counter() - t0
    shown = ""
    history = list(prompt_ids)
    t1 = time.perf_counter()
    for step in range(max_new_tokens):
        res.tokens.append(nxt)
        history.append(nxt)
        if nxt in stop:
            res.stopped_by = "stop"
            break
        if on_text is not None:
            text = tok.decode([t for t in res.tokens if t not in stop])
            if not text.endswith("\ufffd") and len(text) > len(shown):  # wait for whole chars
                on_text(text[len(shown):])
                shown = text
        if step == max_new_tokens - 1:
            break
        logits = model.forward([nxt], cache)
        nxt = sampler(logits, history)
    res.decode_seconds = time.perf_counter() - t1
    res.text = tok.decode([t for t in res.tokens if t not in stop])
    if on_text is not None and len(res.text) > len(shown):
        on_text(res.text[len(shown):])
    return res
