"""The generation loop: prefill, then decode one token at a time, streaming text."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .sampling import Sampler

__all__ = ["generate", "generate_batch", "GenerationResult"]


@dataclass
class GenerationResult:
    tokens: list = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    stopped_by: str = "length"
    setup_seconds: float = 0.0      # graph capture (device loop)
    kernels_per_step: int = 0       # kernel nodes of the captured step (0: no graph)
    graph: bool = False

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        # the first new token comes out of the prefill; decode steps make the rest
        n = max(len(self.tokens) - 1, 0)
        return n / self.decode_seconds if self.decode_seconds else 0.0


def generate(model, prompt_ids, max_new_tokens: int = 32, sampler: Sampler | None = None,
             stop_ids=None, on_text=None, cache=None, graph=None,
             on_prefill=None) -> GenerationResult:
    """Generate up to `max_new_tokens` after `prompt_ids`.

    on_text(str) receives decoded text as it becomes complete (UTF-8 safe streaming).
    Stops at any of `stop_ids` (default: the tokenizer's eos/eot ids); the stop token is
    kept in `tokens` but not in `text`.

    On cuda the loop is the device-side one (models/graph_decode.GraphDecoder: tokens,
    positions and sampling on the device, tokens copied to the host asynchronously) with the
    step replayed as a CUDA graph; graph=False runs the same step eagerly. Elsewhere (cpu,
    interp) the host loop over model.forward runs; graph=True there is an error.

    on_prefill(n_tokens, seconds) is called as the prefill starts (seconds None) and when its
    first token is out, for progress lines on long prompts.
    """
    prompt_ids = list(prompt_ids)
    if not prompt_ids:
        raise ValueError("generate: prompt_ids is empty")
    sampler = sampler or Sampler()
    tok = model.tokenizer
    stop = set(tok.eos_ids if stop_ids is None else stop_ids)
    if model.device.type == "cuda":
        return _generate_device(model, prompt_ids, max_new_tokens, sampler, stop, on_text,
                                graph is not False, on_prefill)
    if graph:
        raise ValueError(f"generate: graph=True needs a cuda model, got {model.device}")
    need = len(prompt_ids) + max_new_tokens
    if cache is None or cache.capacity < need:
        cache = model.new_cache(max(need, 16))
    else:
        cache.reset()
    res = GenerationResult(prompt_tokens=len(prompt_ids))
    if on_prefill is not None:
        on_prefill(len(prompt_ids), None)
    t0 = time.perf_counter()
    logits = model.forward(prompt_ids, cache)
    nxt = sampler(logits, prompt_ids)
    res.prefill_seconds = time.perf_counter() - t0
    if on_prefill is not None:
        on_prefill(len(prompt_ids), res.prefill_seconds)
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


def _generate_device(model, prompt_ids, max_new_tokens, sampler, stop, on_text, use_graph,
                     on_prefill=None):
    """The device-side loop (GraphDecoder), streaming text as the tokens land on the host."""
    from .graph_decode import GraphDecoder
    tok = model.tokenizer
    cap = len(prompt_ids) + max_new_tokens
    cap = (cap + 127) // 128 * 128           # fewer distinct captures across prompts
    dec = GraphDecoder(model, batch=1, capacity=cap, use_graph=use_graph,
                       temperature=sampler.temperature, top_k=sampler.top_k or None,
                       top_p=sampler.top_p if sampler.top_p < 1.0 else None,
                       repetition_penalty=sampler.repetition_penalty
                       if sampler.repetition_penalty != 1.0 else None,
                       seed=sampler.seed)
    res = GenerationResult(prompt_tokens=len(prompt_ids))
    state = {"toks": [], "shown": ""}

    def on_tokens(i, row):
        t = int(row[0])
        if on_prefill is not None and not state["toks"]:
            on_prefill(len(prompt_ids), time.perf_counter() - t0)   # wall time, with setup
        if state["toks"] and state["toks"][-1] in stop:
            return
        state["toks"].append(t)
        if on_text is not None and t not in stop:
            text = tok.decode([x for x in state["toks"] if x not in stop])
            if not text.endswith("\ufffd") and len(text) > len(state["shown"]):
                on_text(text[len(state["shown"]):])
                state["shown"] = text
    if on_prefill is not None:
        on_prefill(len(prompt_ids), None)
    t0 = time.perf_counter()
    out = dec.generate([prompt_ids], max_new_tokens=max_new_tokens, stop_ids=sorted(stop),
                       on_tokens=on_tokens, sync_every=4)
    res.tokens = out.tokens[0]
    res.prefill_seconds = out.prefill_seconds
    res.decode_seconds = out.decode_seconds
    res.setup_seconds = out.setup_seconds
    res.kernels_per_step = dec.kernels_per_step
    res.graph = use_graph
    res.stopped_by = "stop" if res.tokens and res.tokens[-1] in stop else "length"
    res.text = tok.decode([t for t in res.tokens if t not in stop])
    if on_text is not None and len(res.text) > len(state["shown"]):
        on_text(res.text[len(state["shown"]):])
    return res


def generate_batch(model, prompts, max_new_tokens: int = 32, *, block_size: int = 16,
                   stop_ids=None) -> list:
    """Greedy generation for a batch of prompts of different lengths on one paged KV cache
    (model.forward_paged): each prompt is prefilled into its own pages, then every decode
    step runs the whole batch, each row at its own length. Returns the new tokens per
    prompt (a row stops after one of `stop_ids`, which it keeps)."""
    import numpy as np
    import nbxtensor as nbx
    prompts = [list(p) for p in prompts]
    if not prompts or any(not p for p in prompts):
        raise ValueError("generate_batch: every prompt needs at least one token")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"generate_batch: max_new_tokens must be a positive int, got "
                         f"{max_new_tokens!r}")
    stop = set(stop_ids or ())
    caps = [len(p) + max_new_tokens for p in prompts]
    cache = model.new_paged_cache(sum(-(-c // block_size) for c in caps), block_size)
    cache.allocate(caps)
    dev = model.device
    out = []
    for b, p in enumerate(prompts):
        ids = nbx.tensor(model.check_token_ids([p], "generate_batch"), device=dev)
        pos = nbx.tensor(np.arange(len(p), dtype=np.int32)[None], device=dev)
        logits = model.forward_paged(ids, pos, cache.select(b))
        out.append([int(np.argmax(logits.numpy()[0]))])
    done = [t[-1] in stop for t in out]
    lens = np.array([len(p) for p in prompts], np.int32)
    for _ in range(max_new_tokens - 1):
        if all(done):
            break
        tok = nbx.tensor(np.array([[t[-1]] for t in out], np.int64), device=dev)
        logits = model.forward_paged(tok, nbx.tensor(lens[:, None].copy(), device=dev), cache)
        nxt = np.argmax(logits.numpy(), axis=-1)
        lens += 1
        for b in range(len(prompts)):
            if not done[b]:
                out[b].append(int(nxt[b]))
                done[b] = out[b][-1] in stop
    cache.release()
    return out
