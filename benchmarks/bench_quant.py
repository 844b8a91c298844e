"""Quantised GEMVs and paged decode attention on the GPU (H200), random data.

    PYTHONPATH=src python3 benchmarks/bench_quant.py [--quick] [OUTDIR]

Rows (written to OUTDIR/bench_quant.json and printed):
  gemv        batch-1 y = x @ W for W 4096 x 14336 (in x out; the Llama-3-8B up projection):
              bf16 (nbx.linear), int4 GPTQ and AWQ group 128 (nbx.QuantizedTensor GEMV),
              Q4_K / Q5_K / Q6_K (kernels/quant.quant_linear): microseconds per call,
              weight bytes / time as GB/s, tokens per second and the speed-up over bf16
              (the issue's bar: int4 >= 3x bf16). Enough weight copies rotate that >= 256 MB
              are read per round: the weights come from HBM, not L2.
  attention   decode attention, B in (1, 8), 32/8 heads, D 128, bf16, cache lengths 1k/8k/32k:
              the contiguous kernel (nbx.decode_attention) against the paged one
              (nbx.paged_decode_attention, page size 16, shuffled pages): us each and the
              paged/contiguous ratio (the bar: within 5 %).
Times are CUDA-event best-of-3 over N calls (benchmarks/_common.event_best_ms, nbx.cuda.Event):
`us` back to back (host included: eager), `gpu_us` queued behind a sleep kernel
(_common.time_rotated: kernel time, what a CUDA-graph replay of a decode step sees; needs
torch for the sleep kernel, else None); `gpu_vs_bf16` is the ratio on kernel time.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import event_best_ms, out_dir, recorder, time_rotated  # noqa: E402

import nbxtensor as nbx  # noqa: E402


def _copies(make, nbytes, min_total=256 << 20):
    n = max(1, -(-min_total // max(1, nbytes)))
    return [make(i) for i in range(n)]


def _time(fn_list, iters):
    """(eager us, GPU us) per call: CUDA events around back-to-back calls (host included),
    and the calls queued behind a sleep kernel (kernel time only; None without torch)."""
    it = {"i": 0}

    def step():
        fn_list[it["i"] % len(fn_list)]()
        it["i"] += 1
    for _ in range(3):
        step()
    nbx.cuda.synchronize()
    eager = event_best_ms(step, iters, nbx.cuda.Event) * 1e3
    try:
        gpu = time_rotated(lambda i: fn_list[i % len(fn_list)](), len(fn_list), iters) * 1e3
    except ImportError:
        gpu = None
    return eager, gpu


def bench_gemv(record, iters):
    from nbxtensor.kernels.quant import quant_linear
    from nbxtensor.models._ops import QuantWeight
    K, N, gs = 4096, 14336, 128
    g = np.random.default_rng(0)
    x = nbx.tensor(g.standard_normal((1, K)).astype(np.float32), device="cuda").to(nbx.bfloat16)
    base = None
    # bf16
    bf = lambda i: nbx.tensor(  # noqa: E731
        (g.standard_normal((N, K)) * 0.02).astype(np.float32), device="cuda").to(nbx.bfloat16)
    ws = _copies(bf, N * K * 2)
    us, gpu = _time([lambda w=w: nbx.linear(x, w) for w in ws], iters)
    base, gbase = us, gpu
    record(kind="gemv", fmt="bf16", K=K, N=N, us=us, gpu_us=gpu, GBps=N * K * 2 / us / 1e3,
           tok_s=1e6 / us, vs_bf16=1.0, gpu_vs_bf16=1.0)

    def ratio(g):
        return None if g is None or gbase is None else gbase / g
    for fmt in ("gptq", "awq"):
        def mk(i, fmt=fmt):
            if fmt == "gptq":
                qw = g.integers(-2**31, 2**31, (K // 8, N), dtype=np.int64).astype(np.int32)
            else:
                qw = g.integers(-2**31, 2**31, (K, N // 8), dtype=np.int64).astype(np.int32)
            qz = g.integers(-2**31, 2**31, (K // gs, N // 8), dtype=np.int64).astype(np.int32)
            sc = (g.uniform(0.001, 0.01, (K // gs, N))).astype(np.float16)
            T = lambda a: nbx.tensor(a, device="cuda")  # noqa: E731
            return nbx.QuantizedTensor(T(qw), T(sc), T(qz), group_size=gs, format=fmt)
        nbytes = K * N // 2 + K // gs * N * 2.5
        ws = _copies(mk, int(nbytes))
        us, gpu = _time([lambda w=w: nbx.linear(x, w) for w in ws], iters)
        record(kind="gemv", fmt=f"int4-{fmt}", K=K, N=N, us=us, gpu_us=gpu,
               GBps=nbytes / us / 1e3, tok_s=1e6 / us, vs_bf16=base / us,
               gpu_vs_bf16=ratio(gpu))
    from nbxtensor.backends.cpu.ggml_blocks import BLOCK_SIZES
    for qt in ("Q4_K", "Q5_K", "Q6_K"):
        bs, ts = BLOCK_SIZES[qt]
        rb = K // bs * ts

        def mk(i, qt=qt, rb=rb):
            raw = g.integers(0, 256, (N, rb), dtype=np.uint8)
            return QuantWeight(nbx.tensor(raw, device="cuda"), qt, (N, K))
        ws = _copies(mk, N * rb)
        us, gpu = _time([lambda w=w: quant_linear(x, w) for w in ws], iters)
        record(kind="gemv", fmt=qt, K=K, N=N, us=us, gpu_us=gpu, GBps=N * rb / us / 1e3,
               tok_s=1e6 / us, vs_bf16=base / us, gpu_vs_bf16=ratio(gpu))


def bench_attention(record, iters, lens):
    Hq, Hk, D, PS = 32, 8, 128, 16
    g = np.random.default_rng(1)
    for B in (1, 8):
        for L in lens:
            q = nbx.tensor(g.standard_normal((B, Hq, 1, D)).astype(np.float32),
                           device="cuda").to(nbx.bfloat16)
            kc = nbx.randn(B, Hk, L, D, device="cuda").to(nbx.bfloat16)
            vc = nbx.randn(B, Hk, L, D, device="cuda").to(nbx.bfloat16)
            lengths = nbx.tensor(np.full(B, L, np.int32), device="cuda")
            us_c, gpu_c = _time([lambda: nbx.decode_attention(q, kc, vc, lengths)], iters)
            nb = B * L // PS
            cache = nbx.PagedKVCache(nb, PS, 1, Hk, D, dtype=nbx.bfloat16, device="cuda")
            tab = g.permutation(nb).astype(np.int32).reshape(B, L // PS)
            cache.set_block_tables(nbx.tensor(tab, device="cuda"), lengths)
            kp, vp, bt, ln = cache.view(0)
            us_p, gpu_p = _time([lambda: nbx.paged_decode_attention(q, (kp, vp), bt, ln)],
                                iters)
            record(kind="attention", B=B, L=L, contiguous_us=us_c, paged_us=us_p,
                   paged_over_contiguous=us_p / us_c, contiguous_gpu_us=gpu_c,
                   paged_gpu_us=gpu_p,
                   gpu_paged_over_contiguous=None if gpu_c is None else gpu_p / gpu_c)


def main():
    quick = "--quick" in sys.argv
    rows = []
    record = recorder(rows)
    bench_gemv(record, 50 if quick else 200)
    bench_attention(record, 50 if quick else 200, (1024, 8192) if quick else (1024, 8192, 32768))
    path = os.path.join(out_dir(), "bench_quant.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
