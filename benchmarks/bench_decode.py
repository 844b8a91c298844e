"""Decode speed on the H200: nbxtensor's CUDA-graph replayed decode step against eager
nbxtensor and hand-written torch decode loops (eager, and captured with torch.cuda.CUDAGraph),
all with random bf16 weights of the same shapes (nothing is downloaded).

    PYTHONPATH=src python3 benchmarks/bench_decode.py [--quick] [--steps N] [--sweep]
        [--sweep-model NAME] [--no-pdl-ab] [--unfused]
        [--attn-ab 0,512] [--gemv-ab JSON] [--breakdown] [--batches 1,4,16] [--lens 128,4096]
        [--models 1B] [OUTDIR]

Models: SmolLM2-135M architecture and a Llama-3.2-1B-shaped model (hidden 2048, 16 layers,
32/8 heads, FFN 8192, vocab 128256). For each model x batch (1, 4, 16) x cache length
(128, 4096): tok/s of
  nbx-graph   GraphDecoder replay (models/graph_decode.py), N steps
  nbx-eager   the same step launched op by op
  torch-eager a hand-written torch decode loop with a static KV cache
  torch-graph that loop's step captured with torch.cuda.CUDAGraph
plus kernels per step (graph kernel nodes), the weight-bandwidth limit (weight bytes read
per token against the measured device copy bandwidth) and our fraction of it, and a
sanity check that nbx and torch agree on the first step's logits (same weights).
The nbx step is `LlamaModel.decode_step` with the fused decode GEMVs (kernels/decode_fused.py);
at batch 1 the unfused step (`fused=False`, the op-by-op kernels) is also captured and
replayed: kernels per step and tok/s before/after the fusion.
Then a GEMV table: each fused GEMV of the decode step alone at M = 1 (20 launches captured in
one graph, rotating over enough weight copies that >= 256 MB are read: the weights come from
HBM as in the real step, not from L2), its achieved bandwidth against the copy bandwidth;
`--sweep` also tries the configs around the rule (kernels/decode_fused.fused_gemv_config;
~90 for the 1B shape, compiled first in a spawn process pool so the sweep itself only reads
Triton's disk cache) and prints the best per shape; `--sweep-model 1B` sweeps only the
models whose name contains "1B". The winners (> 2 % faster than the rule) are printed as a
`GEMV_TABLE.update({...})` line to paste into decode_fused.py.
--attn-ab 0,512,... (ONE_MAX values: kernels/decode_attention.py, the longest cache one
program takes whole) or '{"name": {override}}' (JSON, decode_attention._OVERRIDE dicts): decode
attention configs A/B in the captured step at batch 1, against the shipped rule.
--gemv-ab '{"name": {"SMALL_W_BYTES": 0}}': kernels/decode_fused.py module settings A/B in the
captured step, at every batch size (JSON: name -> {attribute: value}).
--breakdown: GPU time per step by kernel name (torch.profiler over graph replays, PDL off
and on; needs torch).
PDL A/B: at batch 1 the graph-replayed step is captured twice more, with Programmatic
Dependent Launch on and off (kernels/decode_fused.set_pdl; NBX_PDL=0 sets the default for
everything else), timed interleaved (best of 3 rounds each): tok/s on/off and whether the
first step's logits are bit-identical (`--no-pdl-ab` skips it).
--quick: batch 1, cache 128 only (both models), 128 steps, no unfused comparison (add
`--unfused` for it); aims at < 150 s with a warm Triton cache. Prints elapsed seconds per
stage, a table last; JSON to $OUT/bench_decode.json (or OUTDIR). Each configuration runs on
its own: a failure is recorded and the rest goes on.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

MODELS = {
    "SmolLM2-135M": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True, max_position_embeddings=8192),
    "Llama-3.2-1B-shape": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                               num_hidden_layers=16, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
                               rope_theta=500000.0, tie_word_embeddings=True,
                               max_position_embeddings=8192),
}


# ------------------------------------------------------------------------------ weights

class RandomWeights:
    """bf16 weights as NumPy (uint16 bit patterns): windows of one random pool, so making a
    1B-parameter model takes seconds (values do not change the timing)."""

    def __init__(self, seed=0, pool=1 << 24):
        import ml_dtypes
        rng = np.random.default_rng(seed)
        a = (rng.standard_normal(pool, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
        self.pool = np.concatenate([a, a]).view(np.uint16)
        self.n = pool
        self.rng = rng

    def matrix(self, *shape):
        size = int(np.prod(shape))
        out = np.empty(size, np.uint16)
        done = 0
        while done < size:
            k = min(self.n, size - done)
            o = int(self.rng.integers(0, self.n))
            out[done:done + k] = self.pool[o:o + k]
            done += k
        return out.reshape(shape)

    @staticmethod
    def ones(n):
        import ml_dtypes
        return np.ones(n, ml_dtypes.bfloat16).view(np.uint16)


def make_weights(cfg, seed=0):
    rw = RandomWeights(seed)
    H, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    Hq, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    w = {"embed": rw.matrix(V, H), "norm": rw.ones(H), "layers": []}
    for _ in range(cfg["num_hidden_layers"]):
        w["layers"].append({"attn_norm": rw.ones(H), "ffn_norm": rw.ones(H),
                            "wq": rw.matrix(Hq * D, H), "wk": rw.matrix(Hkv * D, H),
                            "wv": rw.matrix(Hkv * D, H), "wo": rw.matrix(H, Hq * D),
                            "w_gate": rw.matrix(F, H), "w_up": rw.matrix(F, H),
                            "w_down": rw.matrix(H, F)})
    return w


def weight_bytes(w):
    n = w["embed"].nbytes + w["norm"].nbytes        # tied head: the embedding read once
    for L in w["layers"]:
        n += sum(a.nbytes for a in L.values())
    return n


def nbx_model(cfg, w):
    import nbxtensor as nbx
    from nbxtensor.models.config import LlamaConfig
    from nbxtensor.models.llama import LlamaModel

    import ml_dtypes

    def dev(a):
        return nbx.from_numpy(np.ascontiguousarray(a).view(ml_dtypes.bfloat16)).to("cuda")
    W = {"embed": dev(w["embed"]), "norm": dev(w["norm"]), "layers": []}
    W["lm_head"] = W["embed"]
    for L in w["layers"]:
        W["layers"].append({k: dev(v) for k, v in L.items()})
    return LlamaModel(LlamaConfig(**cfg), W, None, "cuda", nbx.bfloat16)


# ------------------------------------------------------------------------------ torch reference

class TorchDecoder:
    """A hand-written Llama decode step in torch with a static KV cache; positions live on
    the device so the step can be captured with torch.cuda.CUDAGraph."""

    def __init__(self, torch, cfg, w, batch, capacity):
        self.t = torch
        dev = "cuda"

        def tt(a):
            return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).to(dev).view(torch.bfloat16)
        self.cfg = cfg
        self.embed = tt(w["embed"])
        self.norm = tt(w["norm"])
        self.layers = [{k: tt(v) for k, v in L.items()} for L in w["layers"]]
        Ln, Hkv, D = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.k = torch.zeros(Ln, batch, Hkv, capacity, D, dtype=torch.bfloat16, device=dev)
        self.v = torch.zeros_like(self.k)
        self.B, self.C = batch, capacity
        inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, D, 2, dtype=np.float64) / D)
        ang = np.arange(capacity, dtype=np.float64)[:, None] * inv[None]
        ang = np.concatenate([ang, ang], 1)
        self.cos = torch.tensor(np.cos(ang), dtype=torch.float32, device=dev)
        self.sin = torch.tensor(np.sin(ang), dtype=torch.float32, device=dev)
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.arange = torch.arange(capacity, device=dev)
        self.logits = None

    def rms(self, x, w):
        xf = x.float()
        return (xf * torch_rsqrt(self.t, xf.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"])
                ).to(x.dtype) * w

    def rope(self, x, cos, sin):
        h = x.shape[-1] // 2
        xf = x.float()
        rot = self.t.cat([-xf[..., h:], xf[..., :h]], -1)
        return (xf * cos + rot * sin).to(x.dtype)

    def step(self):
        t, cfg, B = self.t, self.cfg, self.B
        F = t.nn.functional
        Hq, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        x = F.embedding(self.tokens, self.embed)                      # (B, 1, H)
        cos, sin = self.cos[self.pos].view(1, 1, 1, D), self.sin[self.pos].view(1, 1, 1, D)
        mask = (self.arange <= self.pos).view(1, 1, 1, self.C)
        for i, L in enumerate(self.layers):
            h = self.rms(x, L["attn_norm"])
            q = F.linear(h, L["wq"]).view(B, 1, Hq, D).transpose(1, 2)
            k = F.linear(h, L["wk"]).view(B, 1, Hkv, D).transpose(1, 2)
            v = F.linear(h, L["wv"]).view(B, 1, Hkv, D).transpose(1, 2)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            self.k[i].index_copy_(2, self.pos, k)
            self.v[i].index_copy_(2, self.pos, v)
            a = F.scaled_dot_product_attention(q, self.k[i], self.v[i], attn_mask=mask,
                                               enable_gqa=True)
            x = x + F.linear(a.transpose(1, 2).reshape(B, 1, Hq * D), L["wo"])
            h = self.rms(x, L["ffn_norm"])
            x = x + F.linear(F.silu(F.linear(h, L["w_gate"])) * F.linear(h, L["w_up"]), L["w_down"])
        logits = F.linear(self.rms(x, self.norm), self.embed)[:, 0]      # (B, V)
        self.tokens.copy_(logits.argmax(-1, keepdim=True))
        self.pos.add_(1)
        self.logits = logits
        return logits

    def start_at(self, p, tokens=None):
        self.pos.fill_(p)
        if tokens is not None:
            self.tokens.copy_(self.t.tensor(np.asarray(tokens).reshape(self.B, 1), device="cuda"))
        else:
            self.tokens.zero_()


def torch_rsqrt(torch, x):
    return torch.rsqrt(x)


def count_torch_graph_kernels(g):
    """Kernel nodes of a torch CUDA graph through our driver (same context), or None."""
    try:
        from nbxtensor.backends.cuda import driver
        h = g.raw_cuda_graph()
        return driver.graph_node_types(int(h)).get("kernel", 0)
    except Exception:  # noqa: BLE001 - older torch, or the graph was not kept
        return None


# ------------------------------------------------------------------------------ measurement

# the decode step's fused GEMVs at M = 1: name -> (weight rows, K, flags); the step uses
# qkv+norm+rope+kv (qkv+norm is the same weight without the RoPE epilogue, for comparison)
def gemv_shapes(cfg):
    H, FF, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nq = cfg["num_attention_heads"] * cfg["head_dim"]
    nkv = cfg["num_key_value_heads"] * cfg["head_dim"]
    return {"qkv+norm": (nq + 2 * nkv, H, dict(norm=True)),
            "qkv+norm+rope+kv": (nq + 2 * nkv, H, dict(norm=True, rope=True)),
            "o+res": (H, nq, dict(res=True)),
            "gateup+norm+glu": (2 * FF, H, dict(norm=True, glu=True)),
            "down+res": (H, FF, dict(res=True)), "lm_head+norm": (V, H, dict(norm=True)),
            # what the fused RMSNorm costs: the same weights without it (not in the step)
            "qkv (no norm)": (nq + 2 * nkv, H, {}),
            "gateup+glu (no norm)": (2 * FF, H, dict(glu=True))}


def gemv_kind(f):
    return "rope" if f.get("rope") else "glu" if f.get("glu") else "plain"


def gemv_case(cfg, name, copies=1, fill=True, seed=0):
    """One fused GEMV of the step as a launchable call: (call(i) -> launches it on weight
    copy i % copies, the table key (kind, N, K) fused_gemv_config sees, weight bytes).
    Several copies let a timing graph read its weights from HBM as the real step does
    (one copy of a < 50 MB weight replayed back to back is served from L2)."""
    import ml_dtypes
    import nbxtensor as nbx
    from nbxtensor.models import _ops as O
    N, K, f = gemv_shapes(cfg)[name]
    rng = np.random.default_rng(seed)

    def bf(*s):
        if not fill:
            return nbx.empty(s, dtype=nbx.bfloat16, device="cuda")
        a = (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
        return nbx.from_numpy(a).to("cuda")
    w0 = bf(N, K)
    ws = [w0] + [w0.clone() for _ in range(copies - 1)]
    x = bf(1, K)
    nw = bf(K) if f.get("norm") else None
    n_out = N // 2 if f.get("glu") or f.get("rope") else N
    r = bf(1, n_out) if f.get("res") else None
    if f.get("rope"):           # the decode step's QKV: RoPE + cache append fused in
        kvc = nbx.KVCache(1, 1, cfg["num_key_value_heads"], 64, cfg["head_dim"],
                          dtype=nbx.bfloat16, device="cuda")
        pos = nbx.full((1, 1), 7, dtype=nbx.int32, device="cuda")

        def call(i=0):
            return O.decode_qkv_rope(x, ws[i % copies], kvc, 0, pos,
                                    num_heads=cfg["num_attention_heads"], norm_weight=nw,
                                    eps=1e-5, theta=10000.0)
    else:
        def call(i=0):
            return O.decode_linear(x, ws[i % copies], norm_weight=nw, eps=1e-5, residual=r,
                                  glu=bool(f.get("glu")))
    return call, (gemv_kind(f), n_out, K), N * K * 2


def one_wave_maxnreg(programs, num_warps, sms=132):
    """The register cap (a multiple of 8, <= 255) at which `programs` CTAs of `num_warps`
    warps are all resident at once on `sms` SMs of 64 K registers, or None when that needs
    fewer than 96 a thread (spills would cost more than the second wave)."""
    per_sm = -(-programs // sms)
    cap = min(255, 65536 // (per_sm * 32 * num_warps)) // 8 * 8
    return cap if cap >= 96 else None


def sweep_candidates(kind, N, K, rule):
    """Configs around the rule for one GEMV (pruned for one H200 call): BLOCK_N x BLOCK_K
    from 1024 to 8192 weight elements a step (both tiles of a pair; BLOCK_K up to the whole
    row), >= 132 programs, 4 or 8 warps; RoPE pairs stay inside a head (BLOCK_N divides 32).
    Each also with the register cap that makes its grid one wave (`one_wave_maxnreg`): a
    fused RMSNorm can push a tile past the registers that fit its programs at once."""
    rows = 1 if kind == "plain" else 2
    out = []
    kp = 1 << max(0, K - 1).bit_length()
    for bn in (1, 2, 4, 8, 16, 32):
        for bk in (256, 512, 1024, 2048):
            for nw in (4, 8):
                el = rows * bn * bk
                if not 1024 <= el <= 8192 or bk > max(256, kp) or -(-N // bn) < 132:
                    continue
                if kind == "rope" and 32 % bn:
                    continue
                if nw == 8 and el < 4096:          # 8 warps only for the bigger tiles
                    continue
                c = dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw)
                if c != rule:
                    out.append(c)
                cap = one_wave_maxnreg(-(-N // bn), nw)
                if cap is not None and cap <= 200:     # a higher cap rarely binds
                    out.append(dict(c, maxnreg=cap))
    return out


def _precompile_worker(model, jobs):
    """Process-pool task: compile (no launch) the listed (gemv name, config) pairs for the
    device so the sweep's own compiles are reads of Triton's on-disk cache."""
    import nbxtensor as nbx  # noqa: F401
    from nbxtensor.autotune.screen import dry_launches
    from nbxtensor.kernels import decode_fused as F
    cfg = MODELS[model]
    calls, ok = {}, 0
    for name, c in jobs:
        if name not in calls:
            calls[name] = gemv_case(cfg, name, 1, fill=False)[0]
        F._OVERRIDE = c
        try:
            with dry_launches():
                calls[name]()
            ok += 1
        except Exception:  # noqa: BLE001 - the sweep reports what fails
            pass
        finally:
            F._OVERRIDE = None
    return ok


def precompile(model, jobs, workers=None, timeout_s=150):
    """Compile the sweep's candidates in a spawn process pool (warms Triton's disk cache)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    workers = workers or max(1, min(14, (os.cpu_count() or 2) - 2))
    t0 = time.perf_counter()
    chunks = [jobs[i::workers] for i in range(workers)]
    ok, late = 0, 0
    pool = None
    try:
        pool = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
        futs = [pool.submit(_precompile_worker, model, c) for c in chunks if c]
        done, pending = cf.wait(futs, timeout=timeout_s)
        ok = sum(f.result() for f in done if f.exception() is None)
        late = len(pending)
    except Exception as e:  # noqa: BLE001 - precompiling is an optimisation only
        return dict(compiled=ok, of=len(jobs), error=f"{type(e).__name__}: {e}"[:300],
                    seconds=round(time.perf_counter() - t0, 1))
    finally:
        if pool is not None:       # late workers are not waited for (the sweep compiles)
            pool.shutdown(wait=False, cancel_futures=True)
    return dict(compiled=ok, of=len(jobs), late_chunks=late, workers=workers,
                seconds=round(time.perf_counter() - t0, 1))


def gemv_table(cfg, bw, sweep=False, reps=20, model=None, stage=print):
    """Each fused GEMV of the decode step alone at M = 1: time per launch (a graph of `reps`
    launches rotating over enough weight copies that >= 256 MB are read, so the weights come
    from HBM as in the real step) and weight bytes per second against the copy bandwidth.
    sweep: also the candidates around the rule (compiled first in a process pool); returns
    (rows, winners) with winners {(kind, N, K): config} where a candidate beat the rule by
    more than 2 %."""
    import nbxtensor as nbx
    from nbxtensor.kernels import decode_fused as F
    shapes = gemv_shapes(cfg)
    rows, winners = [], {}
    plan = {}
    for name, (N, K, f) in shapes.items():
        kind = gemv_kind(f)
        n_cfg = N // 2 if kind != "plain" else N
        from nbxtensor.kernels._common import device_facts
        rule = F.fused_gemv_config(1, n_cfg, K, 2, device_facts(nbx.device("cuda")), kind)
        cands = [None]
        # the step runs qkv+norm+rope+kv; the "(no norm)" rows are comparisons only
        if sweep and name != "qkv+norm" and "no norm" not in name:
            cands += sweep_candidates(kind, n_cfg, K, rule)
        plan[name] = (rule, cands)
    if sweep and model is not None:
        jobs = [(n, c) for n, (_, cs) in plan.items() for c in cs if c is not None]
        info = precompile(model, jobs)
        stage(f"precompiled {info}")
        rows.append({"gemv": "precompile", **info})
    for name, (N, K, f) in shapes.items():
        rule, cands = plan[name]
        copies = min(reps, max(1, -(-(256 << 20) // (N * K * 2))))
        call, key, nbytes = gemv_case(cfg, name, copies)
        best = base = None
        for c in cands:
            F._OVERRIDE = c
            try:
                call(0)
                nbx.cuda.synchronize()
                g = nbx.cuda.CUDAGraph()
                with nbx.cuda.graph(g):
                    for i in range(reps):
                        call(i)
                g.replay()
                nbx.cuda.synchronize()
                us = None
                for _ in range(2):            # best of 2 x 5 replays
                    e0, e1 = nbx.cuda.Event(enable_timing=True), nbx.cuda.Event(enable_timing=True)
                    e0.record()
                    for _ in range(5):
                        g.replay()
                    e1.record()
                    e1.synchronize()
                    t = e0.elapsed_time(e1) * 1e3 / (5 * reps)
                    us = t if us is None else min(us, t)
                del g
            except Exception as ex:  # noqa: BLE001 - a bad sweep point
                us = None
                err = f"{type(ex).__name__}: {ex}"
            finally:
                F._OVERRIDE = None
            if us is None:
                if c is None:
                    rows.append({"gemv": name, "error": err})
                continue
            gbps = nbytes / (us * 1e-6) / 1e9
            rec = {"gemv": name, "N": N, "K": K, "us": us, "GBps": gbps,
                   "frac_of_copy_bw": gbps * 1e9 / (bw / 2), "config": c or rule,
                   "default": c is None, "weight_copies": copies, "key": list(key)}
            if c is None:
                rows.append(rec)
                base = rec
            else:
                rows.append(dict(rec, candidate=True))     # every swept point, for the JSON
            if best is None or us < best["us"]:
                best = rec
        if len(cands) > 1 and best is not None:
            rows.append(dict(best, best_of_sweep=True,
                             speedup_vs_rule=(base["us"] / best["us"]) if base else None))
            if base is not None and best["us"] < 0.98 * base["us"]:
                winners[key] = dict(best["config"])
        del call
        nbx.cuda.empty_cache()
    return rows, winners


def copy_bandwidth():
    """Device copy bandwidth in bytes/s (read + write), from a 1 GiB cuMemcpyDtoDAsync."""
    import nbxtensor as nbx
    from nbxtensor.backends.cuda import driver
    n = 1 << 30
    a = nbx.empty(n, dtype=nbx.uint8, device="cuda")
    b = nbx.empty(n, dtype=nbx.uint8, device="cuda")
    s = nbx.cuda.current_stream()
    for _ in range(2):
        driver.memcpy_dtod(b.data_ptr(), a.data_ptr(), n, stream=s.handle)
    e0, e1 = nbx.cuda.Event(enable_timing=True), nbx.cuda.Event(enable_timing=True)
    reps = 10
    e0.record()
    for _ in range(reps):
        driver.memcpy_dtod(b.data_ptr(), a.data_ptr(), n, stream=s.handle)
    e1.record()
    e1.synchronize()
    ms = e0.elapsed_time(e1) / reps
    return 2 * n / (ms / 1e3)


def timed(fn, n, sync):
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return time.perf_counter() - t0


def best_timed(fn, n, sync, restart, rounds=3):
    """The best of `rounds` timings of n steps, each after `restart()` and two warm-up steps:
    eager steps are host-bound, and one shot on a shared host is noise (a 2x swing)."""
    best = float("inf")
    for _ in range(rounds):
        restart()
        fn()
        fn()
        best = min(best, timed(fn, n, sync))
    return best


def graph_ab(m, B, L, cap, toks, steps, variants, rounds=3):
    """Graph replay of the step captured once per variant (variants: name -> setup() that
    returns a restore()), timed interleaved, best of `rounds`. Returns name -> dict(tok_s,
    kernels, logits (first step, bytes))."""
    import nbxtensor as nbx
    from nbxtensor.models.graph_decode import GraphDecoder
    nsync = nbx.cuda.synchronize
    decs, out = {}, {}
    for name, setup in variants.items():
        restore = setup()
        try:
            d = GraphDecoder(m, batch=B, capacity=cap, use_graph=True)
            d.start_at(L, toks)
            d.capture()
        finally:
            restore()
        d.start_at(L, toks)
        d.step()
        nsync()
        out[name] = dict(kernels=d.kernels_per_step, logits=d.logits.numpy(), tok_s=0.0)
        decs[name] = d
    for _ in range(rounds):
        for name, d in decs.items():
            d.start_at(L, toks)
            out[name]["tok_s"] = max(out[name]["tok_s"], B * steps / timed(d.step, steps, nsync))
    del decs
    nbx.cuda.empty_cache()
    return out


def pdl_ab(m, B, L, cap, toks, steps, row, rounds=3):
    """Graph replay with PDL on and off (captured separately), timed interleaved."""
    from nbxtensor.models import _ops as O
    from nbxtensor.kernels import decode_fused as F

    def pdl(on):
        def setup():
            prev = F.set_pdl(on)
            return lambda: F.set_pdl(prev)
        return setup
    r = graph_ab(m, B, L, cap, toks, steps, {True: pdl(True), False: pdl(False)}, rounds)
    row["pdl_kernels_per_step"] = {"on": r[True]["kernels"], "off": r[False]["kernels"]}
    row["nbx_graph_tok_s_pdl_on"] = r[True]["tok_s"]
    row["nbx_graph_tok_s_pdl_off"] = r[False]["tok_s"]
    row["pdl_speedup"] = r[True]["tok_s"] / r[False]["tok_s"] if r[False]["tok_s"] else None
    row["pdl_on_off_same_first_step"] = r[True]["logits"].tobytes() == r[False]["logits"].tobytes()


def attn_ab(m, B, L, cap, toks, steps, row, overrides, rounds=3):
    """Decode attention configs A/B in the captured step: "rule" (the shipped choice)
    against `overrides` {name: decode_attention override, e.g. {"ONE_MAX": 0} (the
    longest cache one program takes whole) or {"num_warps": 2}}. Graph replay, timed
    interleaved, best of `rounds`; tok/s, speed-up over the rule, |dlogits| against it."""
    from nbxtensor.kernels import decode_attention as DA

    def with_override(o):
        def setup():
            prev = DA._OVERRIDE
            DA._OVERRIDE = dict(o) if o else None

            def restore():
                DA._OVERRIDE = prev
            return restore
        return setup
    variants = {"rule": with_override(None)}
    variants.update({k: with_override(o) for k, o in overrides.items()})
    r = graph_ab(m, B, L, cap, toks, steps, variants, rounds)
    ref = r["rule"]["logits"].astype(np.float64)
    row["attn_ab"] = {k: dict(tok_s=v["tok_s"], speedup_vs_rule=v["tok_s"] / r["rule"]["tok_s"],
                              logits_max_abs_diff_vs_rule=float(np.max(np.abs(
                                  v["logits"].astype(np.float64) - ref))))
                      for k, v in r.items()}


def module_ab(m, B, L, cap, toks, steps, row, variants, rounds=3):
    """kernels/decode_fused.py's module settings A/B in the captured step: "default" against
    `variants` {name: {attribute: value}} (e.g. {"SMALL_W_BYTES": 0}: no small-weight rule).
    Graph replay, timed interleaved, best of `rounds`; tok/s, speed-up, |dlogits|."""
    from nbxtensor.kernels import decode_fused as F

    def with_attrs(a):
        def setup():
            unknown = [k for k in a if not hasattr(F, k)]
            if unknown:
                raise AttributeError(f"--gemv-ab: kernels/decode_fused.py has no {unknown}")
            saved = {k: getattr(F, k) for k in a}
            for k, v in a.items():
                setattr(F, k, v)
            return lambda: [setattr(F, k, v) for k, v in saved.items()]
        return setup
    r = graph_ab(m, B, L, cap, toks, steps,
                 {"default": with_attrs({}), **{k: with_attrs(a) for k, a in variants.items()}},
                 rounds)
    ref = r["default"]["logits"].astype(np.float64)
    row["gemv_ab"] = {k: dict(tok_s=v["tok_s"], kernels=v["kernels"],
                              speedup_vs_default=v["tok_s"] / r["default"]["tok_s"],
                              logits_max_abs_diff_vs_default=float(np.max(np.abs(
                                  v["logits"].astype(np.float64) - ref))))
                      for k, v in r.items()}


def breakdown(m, B, L, cap, toks, steps, row, torch):
    """Where the step's GPU time goes: torch.profiler (CUPTI sees every kernel of the
    process, ours included) over `steps` graph replays, captured with PDL off (kernels run
    one after another, so each duration is its own) and on (a duration then also counts the
    wait for the previous kernel). Per kernel name: launches and us per step."""
    import nbxtensor as nbx
    from nbxtensor.models import _ops as O
    from nbxtensor.kernels import decode_fused as F
    from nbxtensor.models.graph_decode import GraphDecoder
    from torch.profiler import ProfilerActivity, profile
    out = {}
    for pdl in (False, True):
        prev = F.set_pdl(pdl)
        try:
            d = GraphDecoder(m, batch=B, capacity=cap, use_graph=True)
            d.start_at(L, toks)
            d.capture()
        finally:
            F.set_pdl(prev)
        d.start_at(L, toks)
        d.step()
        nbx.cuda.synchronize()
        d.start_at(L, toks)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                d.step()
            nbx.cuda.synchronize()
        agg = {}
        for ev in prof.events():
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                continue
            a = agg.setdefault(ev.name, [0, 0.0])
            a[0] += 1
            a[1] += ev.time_range.elapsed_us()
        out["pdl_on" if pdl else "pdl_off"] = {
            k: dict(per_step=n / steps, us_per_step=t / steps)
            for k, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])}
        del d
        nbx.cuda.empty_cache()
    row["breakdown"] = out


def run_config(name, cfg, w, m, torch, B, L, steps, eager_steps, res, unfused=True,
               ab=True, attn=None, prof=False,
               gemv_ab=None):
    import nbxtensor as nbx
    from nbxtensor.models.graph_decode import GraphDecoder
    cap = L + steps + 8
    row = {"model": name, "batch": B, "cache_len": L, "steps": steps}
    rng = np.random.default_rng(B * 1000 + L)
    toks = rng.integers(0, cfg["vocab_size"], B)
    nsync = nbx.cuda.synchronize

    # nbx graph
    g = GraphDecoder(m, batch=B, capacity=cap, use_graph=True)
    g.start_at(L, toks)
    t0 = time.perf_counter()
    g.capture()
    row["nbx_capture_s"] = round(time.perf_counter() - t0, 3)
    row["nbx_kernels_per_step"] = g.kernels_per_step
    row["nbx_graph_nodes"] = dict(g.graph.node_types)
    g.start_at(L, toks)
    first = None
    g.step()
    nsync()
    first = g.logits.to(nbx.float32).numpy()
    first_tokens = g.tokens.numpy().reshape(-1).tolist()
    g.start_at(L, toks)
    dt = timed(g.step, steps, nsync)
    row["nbx_graph_tok_s"] = B * steps / dt
    row["nbx_graph_step_us"] = dt / steps * 1e6

    # nbx eager (same step, op by op)
    e = GraphDecoder(m, batch=B, capacity=cap, use_graph=False)
    e.start_at(L, toks)
    e.step()
    nsync()
    eager_first = e.logits.to(nbx.float32).numpy()
    row["nbx_graph_equals_eager_first_step"] = bool(eager_first.tobytes() == first.tobytes())
    dt = best_timed(e.step, eager_steps, nsync, lambda: e.start_at(L, toks))
    row["nbx_eager_tok_s"] = B * eager_steps / dt
    row["nbx_eager_step_us"] = dt / eager_steps * 1e6
    del e, g
    nbx.cuda.empty_cache()

    if B == 1 and ab:
        t0 = time.perf_counter()
        pdl_ab(m, B, L, cap, toks, steps, row)
        row["pdl_ab_s"] = round(time.perf_counter() - t0, 2)

    if B == 1 and attn:
        t0 = time.perf_counter()
        attn_ab(m, B, L, cap, toks, steps, row, attn)
        row["attn_ab_s"] = round(time.perf_counter() - t0, 2)

    if gemv_ab:
        t0 = time.perf_counter()
        module_ab(m, B, L, cap, toks, steps, row, gemv_ab)
        row["gemv_ab_s"] = round(time.perf_counter() - t0, 2)

    if prof and torch is not None:
        t0 = time.perf_counter()
        try:
            breakdown(m, B, L, cap, toks, min(steps, 32), row, torch)
        except Exception as e:  # noqa: BLE001 - the profiler is optional
            row["breakdown_error"] = f"{type(e).__name__}: {e}"
        row["breakdown_s"] = round(time.perf_counter() - t0, 2)

    if B == 1 and unfused:   # before the fusion: the same step with the unfused ops, replayed
        u = GraphDecoder(m, batch=B, capacity=cap, use_graph=True, fused=False)
        u.start_at(L, toks)
        u.capture()
        row["nbx_unfused_kernels_per_step"] = u.kernels_per_step
        u.start_at(L, toks)
        u.step()
        nsync()
        row["nbx_unfused_first_token_agreement"] = float(np.mean(
            np.asarray(first_tokens) == u.tokens.numpy().reshape(-1)))
        u.start_at(L, toks)
        dt = timed(u.step, steps, nsync)
        row["nbx_unfused_graph_tok_s"] = B * steps / dt
        del u
        nbx.cuda.empty_cache()

    if torch is not None:
        tsync = torch.cuda.synchronize
        td = TorchDecoder(torch, cfg, w, B, cap)
        with torch.inference_mode():
            td.start_at(L, toks)
            ref = td.step().float().cpu().numpy()
            row["logits_max_abs_diff_vs_torch"] = float(np.max(np.abs(ref - first)))
            row["first_token_agreement_vs_torch"] = float(np.mean(
                np.asarray(first_tokens) == ref.argmax(-1)))
            dt = best_timed(td.step, eager_steps, tsync, lambda: td.start_at(L, toks))
            row["torch_eager_tok_s"] = B * eager_steps / dt
            # capture (warm up on a side stream first, as torch requires)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    td.start_at(L, toks)
                    td.step()
            torch.cuda.current_stream().wait_stream(s)
            try:
                tg = torch.cuda.CUDAGraph(keep_graph=True)
            except TypeError:
                tg = torch.cuda.CUDAGraph()
            td.start_at(L, toks)
            with torch.cuda.graph(tg):
                td.step()
            try:
                tg.instantiate()
            except Exception:  # noqa: BLE001 - older torch instantiates in capture_end
                pass
            row["torch_graph_kernels_per_step"] = count_torch_graph_kernels(tg)
            td.start_at(L, toks)
            dt = timed(tg.replay, steps, tsync)
            row["torch_graph_tok_s"] = B * steps / dt
        del td, tg
        torch.cuda.empty_cache()
    res.append(row)
    return row


def main(argv):
    quick = "--quick" in argv
    # --sweep: every model's GEMVs; --sweep-model NAME: only models whose name contains NAME
    sweep_model = argv[argv.index("--sweep-model") + 1] if "--sweep-model" in argv else None
    sweep = "--sweep" in argv or sweep_model is not None
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else (128 if quick else 256)
    unfused = "--unfused" in argv or not quick
    ab = "--no-pdl-ab" not in argv
    # --attn-ab 0,512 (ONE_MAX values) or '{"name": {override}, ...}' (JSON):
    # decode attention configs against the shipped rule
    attn = argv[argv.index("--attn-ab") + 1] if "--attn-ab" in argv else None
    if attn and attn.lstrip().startswith("{"):
        attn = json.loads(attn)
    elif attn:
        attn = {f"one_max {v}": {"ONE_MAX": int(v)} for v in attn.split(",")}
    prof = "--breakdown" in argv
    # --gemv-ab '{"no small rule": {"SMALL_W_BYTES": 0}}': decode_fused settings, every batch
    gemv_ab = json.loads(argv[argv.index("--gemv-ab") + 1]) if "--gemv-ab" in argv else None
    t_start = time.perf_counter()

    def stage(what):
        print(f"[{time.perf_counter() - t_start:6.1f} s] {what}", flush=True)
    args = [a for i, a in enumerate(argv) if not a.startswith("--")
            and (i == 0 or argv[i - 1] not in ("--steps", "--sweep-model", "--batches",
                                                "--lens", "--models", "--attn-ab",
                                                "--gemv-ab"))]
    out_dir = args[0] if args else os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    import nbxtensor as nbx
    try:
        import torch
    except ImportError:
        torch = None
    from nbxtensor.models import _ops as O
    from nbxtensor.kernels import decode_fused as F
    report = {"argv": argv, "quick": quick, "steps": steps, "rows": [], "errors": [],
              "pdl_default": F.pdl_enabled("cuda"),
              "device": nbx.cuda.get_device_name(0), "torch": getattr(torch, "__version__", None),
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    try:
        import subprocess
        report["commit"] = subprocess.run(["git", "-C", HERE, "rev-parse", "HEAD"],
                                          capture_output=True, text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        report["commit"] = None
    bw = copy_bandwidth()
    report["copy_bandwidth_GBps"] = bw / 1e9
    print(f"device {report['device']}, copy bandwidth {bw / 1e9:.0f} GB/s (read+write)", flush=True)
    batches = [1] if quick else [1, 4, 16]
    lens = [128] if quick else [128, 4096]
    # --batches 16 / --lens 128 / --models 1B (comma lists; a model by a part of its name):
    # one configuration for an A/B between two snapshots
    if "--batches" in argv:
        batches = [int(v) for v in argv[argv.index("--batches") + 1].split(",")]
    if "--lens" in argv:
        lens = [int(v) for v in argv[argv.index("--lens") + 1].split(",")]
    only = argv[argv.index("--models") + 1].lower().split(",") if "--models" in argv else None
    eager_steps = 16 if quick else 32
    for name, cfg in MODELS.items():
        if only and not any(o in name.lower() for o in only):
            continue
        t0 = time.perf_counter()
        w = make_weights(cfg)
        wb = weight_bytes(w)
        m = nbx_model(cfg, w)
        print(f"{name}: {wb / 1e9:.3f} GB of weights, built in {time.perf_counter() - t0:.1f} s",
              flush=True)
        limit = bw / wb
        stage(f"{name}: GEMV table")
        winners = {}
        try:
            sw = sweep and (sweep_model is None or sweep_model.lower() in name.lower())
            gt, winners = gemv_table(cfg, bw, sweep=sw, model=name, stage=stage)
            report.setdefault("gemv", {})[name] = gt
            for r in gt:
                print(json.dumps(r), flush=True)
            if sw:
                # ready to paste into kernels/decode_fused.py (GEMV_TABLE)
                line = "GEMV_TABLE.update({%s})" % ", ".join(
                    f"{k!r}: {v!r}" for k, v in sorted(winners.items()))
                report.setdefault("gemv_table_winners", {})[name] = line
                print(f"sweep winners ({name}): {line}", flush=True)
        except Exception as e:  # noqa: BLE001
            report["errors"].append({"model": name, "batch": 1, "cache_len": 0,
                                     "error": f"gemv table: {type(e).__name__}: {e}",
                                     "trace": traceback.format_exc()[-3000:]})
        for L in lens:
            for B in batches:
                stage(f"{name}: B={B} L={L}")
                try:
                    row = run_config(name, cfg, w, m, torch, B, L, steps, eager_steps,
                                     report["rows"], unfused=unfused, ab=ab,
                                     attn=attn, prof=prof,
                                     gemv_ab=gemv_ab)
                    row["weight_bytes"] = wb
                    row["weight_bw_limit_steps_s"] = limit
                    row["nbx_graph_frac_of_limit"] = row["nbx_graph_tok_s"] / B / limit
                    print(json.dumps(row), flush=True)
                except Exception as e:  # noqa: BLE001 - record and go on
                    report["errors"].append({"model": name, "batch": B, "cache_len": L,
                                             "error": f"{type(e).__name__}: {e}",
                                             "trace": traceback.format_exc()[-3000:]})
                    print(f"FAILED {name} B={B} L={L}: {type(e).__name__}: {e}", flush=True)
                with open(os.path.join(out_dir, "bench_decode.json"), "w") as f:
                    json.dump(report, f, indent=1)
        del m, w
        nbx.cuda.empty_cache()

    stage("done")
    report["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    hdr = (f"{'model':20} {'B':>3} {'L':>5} {'nbx-graph':>10} {'nbx-eager':>10} {'torch-eag':>10} "
           f"{'torch-grph':>10} {'kern/step':>9} {'trch-kern':>9} {'limit/seq':>9} {'%limit':>6} "
           f"{'|dlogit|':>8}")
    print("\ntok/s (all sequences; limit = weight-bandwidth steps/s per sequence)")
    print(hdr)
    for r in report["rows"]:
        def f(k, fmt="{:10.0f}"):
            v = r.get(k)
            return fmt.format(v) if isinstance(v, (int, float)) else f"{'-':>10}"
        print(f"{r['model']:20} {r['batch']:>3} {r['cache_len']:>5} {f('nbx_graph_tok_s')} "
              f"{f('nbx_eager_tok_s')} {f('torch_eager_tok_s')} {f('torch_graph_tok_s')} "
              f"{f('nbx_kernels_per_step', '{:9d}')} "
              f"{f('torch_graph_kernels_per_step', '{:9d}')} "
              f"{f('weight_bw_limit_steps_s', '{:9.0f}')} "
              f"{f('nbx_graph_frac_of_limit', '{:6.1%}')} "
              f"{f('logits_max_abs_diff_vs_torch', '{:8.3g}')}")
    unf = [r for r in report["rows"] if "nbx_unfused_kernels_per_step" in r]
    if unf:
        print("\nfusion (batch 1, graph replay): kernels/step and tok/s, unfused -> fused")
        for r in unf:
            print(f"{r['model']:20} L={r['cache_len']:>5}: {r['nbx_unfused_kernels_per_step']} -> "
                  f"{r.get('nbx_kernels_per_step')} kernels, "
                  f"{r.get('nbx_unfused_graph_tok_s', 0):.0f} -> {r.get('nbx_graph_tok_s', 0):.0f} tok/s")
    for name, gt in report.get("gemv", {}).items():
        print(f"\nGEMV alone at M=1 ({name}; fraction of the copy bandwidth's read half)")
        for r in gt:
            if "error" in r:
                print(f"  {r['gemv']:18} ERROR {r['error']}")
                continue
            if r["gemv"] == "precompile":
                print(f"  precompile: {r}")
                continue
            if r.get("candidate"):     # every swept point is in the JSON; the best is below
                continue
            tag = (f" (best of sweep, x{r.get('speedup_vs_rule') or 0:.3f} vs rule)"
                   if r.get("best_of_sweep") else "")
            print(f"  {r['gemv']:18} N={r['N']:>6} K={r['K']:>5} {r['us']:8.2f} us "
                  f"{r['GBps']:7.0f} GB/s {r['frac_of_copy_bw']:6.1%} {r['config']}{tag}")
    ab_rows = [r for r in report["rows"] if "nbx_graph_tok_s_pdl_on" in r]
    if ab_rows:
        print(f"\nPDL A/B (batch 1, graph replay, best of 3; default policy "
              f"{'on' if report['pdl_default'] else 'off'})")
        for r in ab_rows:
            print(f"{r['model']:20} L={r['cache_len']:>5}: on {r['nbx_graph_tok_s_pdl_on']:.0f} "
                  f"tok/s, off {r['nbx_graph_tok_s_pdl_off']:.0f} tok/s "
                  f"(x{r['pdl_speedup'] or 0:.3f}), kernels {r['pdl_kernels_per_step']}, "
                  f"same logits {r['pdl_on_off_same_first_step']}")
    g_rows = [r for r in report["rows"] if "gemv_ab" in r]
    if g_rows:
        print("\ndecode_fused settings A/B (graph replay, best of 3; default = as shipped)")
        for r in g_rows:
            parts = [f"{k} {v['tok_s']:.0f} (x{v['speedup_vs_default']:.3f}, |dlogit| "
                     f"{v['logits_max_abs_diff_vs_default']:.2g})" for k, v in r["gemv_ab"].items()]
            print(f"{r['model']:20} B={r['batch']:>2} L={r['cache_len']:>5}: " + "; ".join(parts))
    a_rows = [r for r in report["rows"] if "attn_ab" in r]
    if a_rows:
        print("\ndecode attention A/B (batch 1, graph replay, best of 3; rule = the "
              "shipped configuration)")
        for r in a_rows:
            parts = [f"{k} {v['tok_s']:.0f} (x{v['speedup_vs_rule']:.3f}, |dlogit| "
                     f"{v['logits_max_abs_diff_vs_rule']:.2g})" for k, v in r["attn_ab"].items()]
            print(f"{r['model']:20} L={r['cache_len']:>5}: " + "; ".join(parts))
    for r in report["rows"]:
        if "breakdown_error" in r:
            print(f"\nbreakdown {r['model']} L={r['cache_len']}: {r['breakdown_error']}")
        for mode, ks in r.get("breakdown", {}).items():
            tot = sum(v["us_per_step"] for v in ks.values())
            print(f"\nGPU time per step by kernel ({r['model']}, B={r['batch']}, "
                  f"L={r['cache_len']}, {mode}; sum {tot:.1f} us, step "
                  f"{r.get('nbx_graph_step_us', 0):.1f} us)")
            for k, v in list(ks.items())[:12]:
                print(f"  {k[:60]:60} {v['per_step']:6.1f}/step {v['us_per_step']:8.1f} us "
                      f"{v['us_per_step'] / v['per_step']:6.2f} us each")
    for name, line in report.get("gemv_table_winners", {}).items():
        print(f"\nsweep winners ({name}), paste into kernels/decode_fused.py:\n  {line}")
    for e in report["errors"]:
        print(f"ERROR {e['model']} B={e['batch']} L={e['cache_len']}: {e['error']}")
    with open(os.path.join(out_dir, "bench_decode.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"JSON: {os.path.join(out_dir, 'bench_decode.json')}")


if __name__ == "__main__":
    main(sys.argv[1:])
