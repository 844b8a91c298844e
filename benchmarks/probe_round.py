"""Probe (H200), one process under a wall-time budget: the quantised GEMVs of probe_quant.py
(W 4096 x 14336) at a few configs each, against bf16 (nbx.linear, torch), every kernel
compiled first in parallel.

    PYTHONPATH=src python3 benchmarks/probe_round.py [--budget SECONDS] [OUTDIR]

Rows as probe_quant.py's (GPU time behind a sleep kernel over 4 rotated weight copies,
eager time, GB/s, error against a float64 reference). Rows past the budget are skipped.
"""
from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)
import numpy as np  # noqa: E402
from _common import event_best_ms, out_dir, precompile, recorder, time_rotated  # noqa: E402

import nbxtensor as nbx  # noqa: E402
import probe_quant as PQ  # noqa: E402
from nbxtensor.kernels import int4 as K4  # noqa: E402
from nbxtensor.kernels.quant import quant_linear  # noqa: E402
from nbxtensor.ops.quantized import dequantize_int4_numpy  # noqa: E402

K, N, GS = PQ.K, PQ.N, PQ.GS
COPIES = 4
# (BLOCK_N, BLOCK_K, num_warps, SPLIT[, FLAT])
INT4 = {"gptq": [(256, 64, 1, 16), (512, 64, 2, 16), (256, 32, 1, 16, 1), (256, 32, 2, 16, 1),
                 (512, 32, 4, 16, 1), (512, 32, 2, 16, 1), (256, 32, 2, 32, 1),
                 (512, 32, 4, 8, 1)],
        "awq": [(1024, 8, 1, 32), (512, 16, 1, 64), (1024, 8, 1, 64), (512, 8, 1, 64)]}
MOE_SHAPE = (2048, 64, 1024, 8, 16)          # H, experts, I, top-k, gating rows rotated
PAGED_CASES = ((1, 8192), (8, 8192), (1, 32768))
# (BLOCK_N, BLOCK_S, num_warps[, PACKED]): Q6_K's packed kernel only with PACKED (its
# default since KQ_TILES)
KQ = {"Q4_K": [None, (64, 4, 8), (16, 2, 4)], "Q5_K": [None, (64, 4, 8)],
      "Q6_K": [None, (16, 4, 8, 1), (8, 4, 4, 1)]}


def _gpu_eager(fn, copies):
    gpu = time_rotated(fn, copies, 100) * 1e3
    it = {"i": 0}

    def step():
        fn(it["i"] % copies)
        it["i"] += 1
    return gpu, event_best_ms(step, 100, nbx.cuda.Event) * 1e3


def probe_moe(timed_rows, t0, budget):
    """OLMoE-1B-7B decode (H 2048, 64 experts, I 1024, top-8) through fused_moe."""
    F = nbx.nn.functional
    H, E, I, topk, R = MOE_SHAPE
    w1 = (nbx.randn(E, 2 * I, H, device="cuda") * (1 / H ** 0.5)).to(nbx.bfloat16)
    w2 = (nbx.randn(E, H, I, device="cuda") * (1 / I ** 0.5)).to(nbx.bfloat16)
    xs = [nbx.randn(1, H, device="cuda").to(nbx.bfloat16) for _ in range(R)]
    gs = [nbx.randn(1, E, device="cuda") for _ in range(R)]
    limit_us = topk * 3 * H * I * 2 / 4.0e12 * 1e6
    if time.time() - t0 > budget:
        timed_rows(part="moe", skipped="budget")
        return
    try:
        fn = lambda i: F.fused_moe(xs[i], w1, w2, gs[i], topk)  # noqa: E731
        fn(0)
        gpu, eager = _gpu_eager(fn, R)
        timed_rows(part="moe-olmoe", gpu_us=gpu, eager_us=eager, limit_us=limit_us,
                   frac_gpu=limit_us / gpu)
    except Exception as e:  # noqa: BLE001
        timed_rows(part="moe", error=f"{type(e).__name__}: {str(e)[:200]}")


def probe_paged(record, t0, budget):
    """Paged (page 16, shuffled) against contiguous decode attention, 32/8 heads, D 128."""
    Hq, Hk, D, PS = 32, 8, 128, 16
    g = np.random.default_rng(3)
    for B, L in PAGED_CASES:
        if time.time() - t0 > budget:
            record(part="paged", B=B, L=L, skipped="budget")
            continue
        try:
            copies = max(2, -(-(128 << 20) // (B * L * Hk * D * 4)))
            q = nbx.randn(B, Hq, 1, D, device="cuda").to(nbx.bfloat16)
            lengths = nbx.tensor(np.full(B, L, np.int32), device="cuda")
            conts, pages = [], []
            for _ in range(copies):
                conts.append((nbx.randn(B, Hk, L, D, device="cuda").to(nbx.bfloat16),
                              nbx.randn(B, Hk, L, D, device="cuda").to(nbx.bfloat16)))
                nb = B * L // PS
                cache = nbx.PagedKVCache(nb, PS, 1, Hk, D, dtype=nbx.bfloat16, device="cuda")
                tab = g.permutation(nb).astype(np.int32).reshape(B, L // PS)
                cache.set_block_tables(nbx.tensor(tab, device="cuda"), lengths)
                pages.append(cache.view(0))
            cg, ce = _gpu_eager(lambda i: nbx.decode_attention(q, conts[i][0], conts[i][1],
                                                               lengths), copies)
            pg, pe = _gpu_eager(lambda i: nbx.paged_decode_attention(
                q, (pages[i][0], pages[i][1]), pages[i][2], pages[i][3]), copies)
            record(part="paged", B=B, L=L, cont_gpu_us=cg, paged_gpu_us=pg, gpu_ratio=pg / cg,
                   cont_eager_us=ce, paged_eager_us=pe)
            del conts, pages
        except Exception as e:  # noqa: BLE001
            record(part="paged", B=B, L=L, error=f"{type(e).__name__}: {str(e)[:200]}")


def main():
    t0 = time.time()
    budget = float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 45
    rows = []
    record = recorder(rows)
    g = np.random.default_rng(0)
    x = nbx.tensor(g.standard_normal((1, K)).astype(np.float32), device="cuda").to(nbx.bfloat16)
    xr = x.to(nbx.float32).numpy().astype(np.float64)
    y = nbx.empty((1, N), dtype=nbx.bfloat16, device="cuda")
    W = {f: PQ.weights(f, 1, g) for f in INT4}
    Q = {q: PQ.kq_weights(q, 1, g) for q in KQ}

    def run_int4(fmt, cfg, i):
        c = None if cfg is None else dict(BLOCK_N=cfg[0], BLOCK_K=cfg[1], num_warps=cfg[2],
                                          SPLIT=cfg[3], FLAT=len(cfg) > 4)
        K4.int4_gemv(x, W[fmt][i][0], None, y, config=c)
        return y

    def run_kq(qt, cfg, i):
        c = None if cfg is None else dict(BLOCK_N=cfg[0], BLOCK_S=cfg[1], num_warps=cfg[2],
                                          PACKED=len(cfg) > 3)
        return quant_linear(x, Q[qt][i][0], config=c)
    jobs = [(lambda f=f, c=c: run_int4(f, c, 0), lambda: None) for f in INT4 for c in INT4[f]]
    jobs += [(lambda q=q, c=c: run_kq(q, c, 0), lambda: None) for q in KQ for c in KQ[q]]
    precompile(jobs, "compile")
    print(f"compiled at {time.time() - t0:.0f} s", flush=True)
    for f in INT4:
        W[f] += PQ.weights(f, COPIES - 1, g)
    for q in KQ:
        Q[q] += PQ.kq_weights(q, COPIES - 1, g)

    def timed(name, fn, nbytes, ref, **row):
        if time.time() - t0 > budget:
            record(fmt=name, skipped="budget", **row)
            return
        try:
            out = fn(0)
            nbx.cuda.synchronize()
            err = None if ref is None else float(
                np.abs(out.to(nbx.float32).numpy() - ref).max() / np.abs(ref).max())
            gpu = time_rotated(fn, COPIES, 100) * 1e3
            it = {"i": 0}

            def step():
                fn(it["i"] % COPIES)
                it["i"] += 1
            eager = event_best_ms(step, 100, nbx.cuda.Event) * 1e3
            record(fmt=name, gpu_us=gpu, eager_us=eager, GBps=nbytes / gpu / 1e3, err=err,
                   **row)
        except Exception as e:  # noqa: BLE001
            record(fmt=name, error=f"{type(e).__name__}: {str(e)[:200]}", **row)

    # bf16 baselines
    import torch
    xt = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    wt = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    wn = [nbx.from_dlpack(w) for w in wt]
    xn = nbx.from_dlpack(xt)
    for name, fn in (("torch-bf16", lambda i: torch.nn.functional.linear(xt, wt[i % 3])),
                     ("nbx-bf16", lambda i: nbx.linear(xn, wn[i % 3]))):
        fn(0)
        gpu = time_rotated(fn, 3, 100) * 1e3
        record(fmt=name, gpu_us=gpu, GBps=K * N * 2 / gpu / 1e3)
    del wt, wn
    for f in INT4:
        qw, qz, sc = W[f][0][1]
        ref = xr @ dequantize_int4_numpy(qw, qz, sc.astype(np.float32), None, GS,
                                         f).astype(np.float64)
        for c in INT4[f]:
            timed(f, lambda i, f=f, c=c: run_int4(f, c, i), PQ.NBYTES, ref, cfg=str(c))
        # through nbx.linear: the host path of a model's call
        timed(f"linear-{f}", lambda i, f=f: nbx.linear(x, W[f][i][0]), PQ.NBYTES, None)
    from nbxtensor.backends.cpu.ggml_blocks import dequantize
    for q in KQ:
        raw = Q[q][0][1]
        ref = xr @ dequantize(raw, q, (N, K)).astype(np.float64).T
        for c in KQ[q]:
            timed(q, lambda i, q=q, c=c: run_kq(q, c, i), raw.nbytes, ref, cfg=str(c))
    del W, Q
    probe_moe(timed_rows=record, t0=t0, budget=budget)
    probe_paged(record, t0, budget)
    print(f"done at {time.time() - t0:.0f} s")
    path = os.path.join(out_dir([a for a in sys.argv[1:] if a != "--budget" and
                                 not a.replace(".", "").isdigit()]), "probe_round.json")
    with open(path, "w") as fh:
        json.dump(rows, fh, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
