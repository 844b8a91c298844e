"""Static decode step for the Llama decoder, captured once as a CUDA graph and replayed per token.

    dec = GraphDecoder(model, batch=1, capacity=512)          # use_graph=None: on cuda only
    out = dec.generate([prompt_ids], max_new_tokens=256, on_tokens=print_fn)

Everything a step needs lives on the device at a fixed address:
  tokens   (B, 1) int64   the token each sequence feeds in (the chosen token is copied here
                          on the device at the end of the step: no host round trip)
  positions(B, 1) int32   its position; the step adds 1 on the device
  cache    nbx.KVCache    (layers, B, Hkv, capacity, D) K and V, device lengths (B,)
  history  (B, capacity)  int64, -1 padded: prompt + generated ids (repetition penalty only)
  logits   (B, vocab)     the last step's logits (an output of the graph)
A step = `model.decode_step(tokens, positions, cache)` (llama.py: fused GEMVs, RoPE fused
with the cache append, flash-decoding over the device lengths), then the next token on the
device -- argmax (greedy) or `nbx.sample` with an `nbx.Generator` whose state advances on
the device (temperature / top-k / top-p / repetition penalty) -- copied into `tokens`, and
positions += 1. Grid sizes depend on (batch, capacity) only, so the graph is captured once
per (batch, capacity) and replayed for every token.

Tokens reach the host asynchronously for printing only: after each replay an async copy
puts the (B,) tokens into a row of a pinned host buffer, and an event recorded every
`sync_every` steps tells the host which rows have landed. The host never waits on the
device inside the loop except when it must (stop tokens are noticed when their row lands,
so up to `sync_every` extra steps may run past an end-of-sequence: their tokens are dropped).
"""
from __future__ import annotations

import ctypes
import time

import numpy as np

import nbxtensor as nbx
from ..ops.indexing import deferred_index_checks

__all__ = ["GraphDecoder", "DecodeResult"]


class DecodeResult:
    def __init__(self, tokens, prefill_seconds, decode_seconds, steps, setup_seconds=0.0):
        self.tokens = tokens                      # list (per sequence) of generated ids
        self.setup_seconds = setup_seconds        # graph capture (first time: compiles too)
        self.prefill_seconds = prefill_seconds
        self.decode_seconds = decode_seconds
        self.steps = steps

    @property
    def decode_tps(self) -> float:
        """Decode steps per second (per sequence); multiply by the batch for total tokens/s."""
        return self.steps / self.decode_seconds if self.decode_seconds else 0.0


class GraphDecoder:
    """Batched decoding of a LlamaModel with a static, graph-replayed step.

    temperature 0 (default) is greedy; otherwise nbx.sample with top_k / top_p /
    repetition_penalty (None = off) and an nbx.Generator seeded with `seed`."""

    def __init__(self, model, batch: int = 1, capacity: int | None = None,
                 use_graph: bool | None = None, *, temperature: float = 0.0, top_k=None,
                 top_p=None, repetition_penalty=None, seed=None, fused: bool = True):
        cfg = model.cfg
        if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
            raise ValueError(f"GraphDecoder: batch must be a positive int, got {batch!r}")
        capacity = capacity or min(cfg.max_position_embeddings, 4096)
        if not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"GraphDecoder: capacity must be a positive int, got {capacity!r}")
        dev = model.device
        if use_graph is None:
            use_graph = dev.type == "cuda"
        if use_graph and dev.type != "cuda":
            raise ValueError(f"GraphDecoder: use_graph=True needs a cuda model, got {dev}")
        self.model, self.cfg, self.device = model, cfg, dev
        self.batch, self.capacity, self.use_graph = batch, capacity, use_graph
        self.dtype = model.dtype
        self.cache = model.new_kv_cache(batch, capacity)
        self.fused = fused
        self.sample_kw = dict(temperature=float(temperature),
                              top_k=top_k if top_k else None,
                              top_p=top_p if top_p is not None and top_p < 1.0 else None,
                              repetition_penalty=repetition_penalty
                              if repetition_penalty and repetition_penalty != 1.0 else None)
        # nbx.sample validates these on the first (eager) call, the prefill
        self.greedy = temperature == 0 and self.sample_kw["repetition_penalty"] is None
        self.generator = None if self.greedy else nbx.Generator(
            seed if seed is not None else np.random.SeedSequence().entropy % (1 << 62), device=dev)
        self.history = None
        if self.sample_kw["repetition_penalty"] is not None:
            self.history = nbx.full((batch, capacity + 1), -1, dtype=nbx.int64, device=dev)
        self.tokens = nbx.zeros((batch, 1), dtype=nbx.int64, device=dev)
        self.positions = nbx.zeros((batch, 1), dtype=nbx.int32, device=dev)
        self.logits = None
        self.graph = None
        self._prefills: dict = {}      # padded prompt length -> its static inputs and graph
        self.pos = 0                   # host count of the position (no device read needed)

    # ------------------------------------------------------------------ the step
    def _choose(self, logits):
        """The next token (B,) int64 on the device from logits (B, V)."""
        if self.greedy:
            return nbx.argmax(logits, dim=-1)
        kw = dict(self.sample_kw)
        if kw["repetition_penalty"] is not None:
            kw["previous_tokens"] = self.history
        return nbx.sample(logits, generator=self.generator, **kw)

    def _step(self):
        """One decode step on the static tensors (what the graph records)."""
        from . import _ops as O
        logits = self.model.decode_step(self.tokens, self.positions, self.cache, fused=self.fused)
        if self.greedy:            # argmax -> tokens, positions += 1: one kernel
            O.greedy_commit(logits, self.tokens, self.positions)
        else:                      # the sampled token -> tokens, positions += 1: one kernel
            O.commit_tokens(self._choose(logits), self.tokens, self.positions)
        if self.history is not None:                       # history[b, pos[b]] = token
            nbx.scatter(self.history, 1, self.positions.to(nbx.int64), self.tokens,
                        out=self.history)
        return logits

    def capture(self) -> None:
        """Capture the step (after one eager warm-up step that compiles every kernel). The
        warm-up and capture leave tokens, positions and the cache as they found them."""
        if not self.use_graph:
            raise RuntimeError("GraphDecoder.capture: use_graph is False")
        if self.graph is not None:
            return
        saved = [self.tokens.clone(), self.positions.clone(), self.cache.lengths.clone()]
        extra = [t for t in (self.history, self.generator and self.generator.state)
                 if t is not None]
        saved += [t.clone() for t in extra]
        self._step()                                       # warm-up: compile + load modules
        nbx.cuda.synchronize()
        for dst, src in zip([self.tokens, self.positions, self.cache.lengths] + extra, saved):
            dst.copy_(src)
        g = nbx.cuda.CUDAGraph()
        # embedding / scatter record bad ids in a device flag; in set_index_check('sync') mode
        # they would read it back after each op, which a capture refuses. Deferred, the flag
        # is read on exit (after the capture ended); replays record into the same flag.
        with deferred_index_checks():
            with nbx.cuda.graph(g):
                self.logits = self._step()
        self.graph = g
        # capture records, it does not run: the state is still the saved one (the KV rows the
        # warm-up wrote at this position are rewritten by the first replay)

    def step(self):
        """Advance every sequence by one token (replay or eager). Returns the tokens tensor."""
        if self.pos >= self.capacity:
            raise ValueError(f"GraphDecoder.step: the KV cache (capacity {self.capacity}) is full")
        if self.use_graph:
            if self.graph is None:
                self.capture()
            self.graph.replay()
        else:
            self.logits = self._step()
        self.pos += 1
        return self.tokens

    @property
    def kernels_per_step(self) -> int:
        return self.graph.kernel_count if self.graph is not None else 0

    # ------------------------------------------------------------------ prefill + loop
    def prefill(self, prompts) -> None:
        """Run the prompts (B lists of equal length) through the model and put each
        sequence's first generated token in `self.tokens`."""
        if prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        if len(prompts) != self.batch:
            raise ValueError(f"prefill: expected {self.batch} prompts, got {len(prompts)}")
        T = len(prompts[0])
        if T == 0 or any(len(p) != T for p in prompts):
            raise ValueError("prefill: prompts must be non-empty and of equal length "
                             f"(got lengths {[len(p) for p in prompts]})")
        if T >= self.capacity:
            raise ValueError(f"prefill: {T} prompt tokens leave no room in capacity {self.capacity}")
        ids = self.model.check_token_ids(prompts, "prefill")
        self.cache.reset()
        if self.history is not None:
            self.history.fill_(-1)
            self.history[:, :T] = nbx.tensor(ids, device=self.device)
        Tb = self._bucket(T)
        if Tb == T:
            pos = nbx.tensor(np.broadcast_to(np.arange(T, dtype=np.int32), (self.batch, T)).copy(),
                             device=self.device)
            logits = self.model.prefill(nbx.tensor(ids, device=self.device), pos, self.cache,
                                        fused=self.fused)
        else:
            logits = self._bucket_prefill(ids, T, Tb)
            self.cache.lengths.fill_(T)        # (the pad tokens' slots hold nothing)
        self.tokens.copy_(self._choose(logits).reshape(self.batch, 1))
        self.positions.fill_(T)
        if self.history is not None:
            self.history[:, T:T + 1] = self.tokens
        self.pos = T

    # Short prompts run padded on the right to a multiple of PREFILL_BUCKET tokens (on cuda):
    # a few shapes serve every short prompt, and a shape's prefill is captured as a CUDA graph
    # at its second use (the first, eager, compiles and loads its kernels), so a warm prefill
    # is one replay instead of ~10 launches a layer from Python. Eager or replayed, a padded
    # prefill is the same launches, so both give the same tokens. Padding is causal-safe:
    # a real token never attends to the pad tokens after it, and the decode steps overwrite
    # their cache slots. Longer prompts are compute-bound: they run unpadded and eager.
    PREFILL_BUCKET = 16
    PREFILL_GRAPH_MAX = 128
    PREFILL_DEVICES = ("cuda",)

    def _bucket(self, T: int) -> int:
        if self.device.type not in self.PREFILL_DEVICES or T > self.PREFILL_GRAPH_MAX:
            return T
        Tb = -(-T // self.PREFILL_BUCKET) * self.PREFILL_BUCKET
        return Tb if Tb < self.capacity else T

    def _bucket_prefill(self, ids, T: int, Tb: int):
        """The logits (B, V) of the prompts `ids` (B, T) run padded to Tb tokens."""
        B = self.batch
        e = self._prefills.get(Tb)
        if e is None:     # this shape's static inputs: padded ids, positions, last-token rows
            e = self._prefills[Tb] = {
                "ids": nbx.zeros((B, Tb), dtype=nbx.int64, device=self.device),
                "pos": nbx.tensor(np.broadcast_to(np.arange(Tb, dtype=np.int32), (B, Tb)).copy(),
                                  device=self.device),
                "last": nbx.zeros((B,), dtype=nbx.int64, device=self.device),
                "graph": None, "logits": None, "uses": 0}
        padded = np.zeros((B, Tb), np.int64)
        padded[:, :T] = ids
        e["ids"].copy_(nbx.from_numpy(padded))
        e["last"].copy_(nbx.from_numpy(np.arange(B, dtype=np.int64) * Tb + (T - 1)))

        def run():
            return self.model.prefill(e["ids"], e["pos"], self.cache, fused=self.fused,
                                      last=e["last"])
        if e["graph"] is None and self.use_graph and e["uses"]:
            g = nbx.cuda.CUDAGraph()
            with deferred_index_checks():       # (as the decode step's capture)
                with nbx.cuda.graph(g):
                    e["logits"] = run()
            e["graph"] = g
        e["uses"] += 1
        if e["graph"] is None:
            return run()
        e["graph"].replay()
        return e["logits"]

    def start_at(self, position: int, tokens=None) -> None:
        """Benchmarks: put every sequence at `position` (the cache holds `position` tokens,
        whatever their values) feeding `tokens` (B ints; default 0) -- no prefill."""
        if not 0 <= position < self.capacity:
            raise ValueError(f"start_at: position must lie in [0, {self.capacity}), got {position}")
        toks = np.zeros((self.batch, 1), np.int64) if tokens is None else \
            self.model.check_token_ids(tokens, "start_at").reshape(self.batch, 1)
        self.tokens.copy_(nbx.tensor(toks, device=self.device))
        self.positions.fill_(position)
        self.cache.lengths.fill_(position)
        self.pos = position

    def generate(self, prompts, max_new_tokens: int = 32, stop_ids=(), on_tokens=None,
                 sync_every: int = 16) -> DecodeResult:
        """Generation: prefill, then `max_new_tokens - 1` steps (the first token comes
        from the prefill). on_tokens(step, tokens (B,) ndarray) is called as tokens land.
        Index range checks are deferred to the end (one flag read, not one per step)."""
        with deferred_index_checks():
            return self._generate(prompts, max_new_tokens, stop_ids, on_tokens, sync_every)

    def _generate(self, prompts, max_new_tokens, stop_ids, on_tokens, sync_every):
        if prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        t0 = time.perf_counter()
        self.prefill(prompts)
        if self.use_graph:
            nbx.cuda.synchronize()
        tp = time.perf_counter()
        if self.use_graph:
            self.capture()
        n = min(max_new_tokens, self.capacity - self.pos + 1)
        host = _HostTokens(self, n)
        host.push(0)                                  # the prefill's token
        if self.use_graph:
            nbx.cuda.synchronize()
        t1 = time.perf_counter()
        stop = set(stop_ids)
        done = np.zeros(self.batch, bool)
        seen = 0
        for i in range(1, n):
            self.step()
            host.push(i)
            if on_tokens is not None or stop:
                if i % sync_every == 0 or i == n - 1:
                    host.mark()
                ready = host.ready()
                while seen < ready:
                    row = host.row(seen)
                    if on_tokens is not None:
                        on_tokens(seen, row)
                    done |= np.isin(row, list(stop)) if stop else False
                    seen += 1
                if stop and done.all():
                    n = seen
                    break
        host.finish()
        t2 = time.perf_counter()
        rows = host.rows(n)
        for j in range(seen, n):
            if on_tokens is not None:
                on_tokens(j, rows[j])
        toks = []
        for b in range(self.batch):
            seq = []
            for t in rows[:, b].tolist():
                seq.append(t)
                if t in stop:
                    break
            toks.append(seq)
        host.close()
        return DecodeResult(toks, tp - t0, t2 - t1, max(n - 1, 0), t1 - tp)


class _HostTokens:
    """Per-step (B,) token rows copied to the host: pinned buffer + async copy + events on
    cuda; a plain .numpy() copy elsewhere."""

    def __init__(self, dec: GraphDecoder, n: int):
        self.dec, self.n, self.B = dec, max(n, 1), dec.batch
        self.cuda = dec.device.type == "cuda"
        self.landed = 0          # rows known to be on the host
        self.pending = []        # (event, rows covered)
        if self.cuda:
            from ..backends.cuda import driver
            self._drv = driver
            nbytes = self.n * self.B * 8
            self.ptr = driver.mem_host_alloc(nbytes)
            self.buf = np.ctypeslib.as_array(
                (ctypes.c_int64 * (self.n * self.B)).from_address(self.ptr)).reshape(self.n, self.B)
            self.pushed = 0
        else:
            self.buf = np.zeros((self.n, self.B), np.int64)

    def push(self, i):
        t = self.dec.tokens
        if self.cuda:
            s = nbx.cuda.current_stream(self.dec.device)
            self._drv.memcpy_dtoh(self.ptr + i * self.B * 8, t.data_ptr(), self.B * 8,
                                  stream=s.handle)
            self.pushed = i + 1
        else:
            self.buf[i] = t.numpy().reshape(-1)
            self.landed = i + 1

    def mark(self):
        if self.cuda:
            e = nbx.cuda.Event()
            e.record()
            self.pending.append((e, self.pushed))

    def ready(self) -> int:
        while self.pending and self.pending[0][0].query():
            self.landed = max(self.landed, self.pending.pop(0)[1])
        return self.landed

    def finish(self):
        if self.cuda:
            nbx.cuda.current_stream(self.dec.device).synchronize()
            self.landed = self.pushed
            self.pending.clear()

    def row(self, i):
        return self.buf[i].copy()

    def rows(self, n):
        return self.buf[:n].copy()

    def close(self):
        if self.cuda and self.ptr:
            self.buf = None
            self._drv.mem_free_host(self.ptr)
            self.ptr = 0
