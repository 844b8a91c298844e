"""The redesign's figure list in one short run, through the public API only (so the same
script times an older tree as well: `scripts/ab-bench` runs it on two trees in one call):

  per call, wall (us): x + y (128 elements), softmax (4, 4096), linear M=1 (bf16 4096 ->
      4096), x.view(64, 64).t().contiguous(), x.sum().item(); torch's same calls beside them
  element-wise bandwidth (GB/s, CUDA events): copy and add, float32, 256 MiB operands
  reduction bandwidth: sum float32 (16384, 4096) over dim -1
  matmul bf16 4096^3 (TFLOP/s); attention bf16 B4 H32 S4096 D128, causal and not (TFLOP/s)

    PYTHONPATH=src python3 benchmarks/bench_figures.py [OUTDIR] [--smoke]

--smoke: tiny sizes on the cpu device (checks the script runs against a tree; no figures).

Writes bench_figures.json (rows) to OUTDIR (or $OUT). The decode figures come from
bench_decode.py --quick. torch is the anchor where it is importable.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import nbxtensor as nbx


def wall_us(fn, n=200, repeats=5, sync=None):
    fn()
    if sync:
        sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if sync:
            sync()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def gpu_ms(fn, event, sync, iters=20, repeats=3):
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        s, e = event(enable_timing=True), event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) / iters)
    return best


def per_call(lib, dev, f32, bf16, sync, k=4096):
    """The per-call rows for nbx or torch: the same five calls, wall time."""
    rng = np.random.default_rng(0)

    def t(a, dt):
        return lib.tensor(a, dtype=f32).to(dev).to(dt) if lib is nbx else \
            lib.tensor(a, dtype=f32, device=dev).to(dt)
    x, y = t(rng.standard_normal(128), f32), t(rng.standard_normal(128), f32)
    s = t(rng.standard_normal((4, k)), f32)
    v = t(rng.standard_normal((1, k)), bf16)
    w = t(rng.standard_normal((k, k)) * 0.01, bf16)
    q = t(rng.standard_normal(4096), f32)
    lin = nbx.linear if lib is nbx else lib.nn.functional.linear
    return {
        "x + y": wall_us(lambda: x + y, sync=sync),
        "softmax": wall_us(lambda: s.softmax(-1), sync=sync),
        "linear M=1": wall_us(lambda: lin(v, w), sync=sync),
        "view.t.contiguous": wall_us(lambda: q.view(64, 64).t().contiguous(), sync=sync),
        "sum().item()": wall_us(lambda: q.sum().item(), n=100),
    }


def main(argv):
    out = next((a for a in argv[1:] if not a.startswith("--")), os.environ.get("OUT", "."))
    os.makedirs(out, exist_ok=True)
    rows = []

    def record(**r):
        rows.append(r)
        print("  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in r.items()), flush=True)
    smoke = "--smoke" in argv
    try:
        import torch
    except ImportError:
        torch = None
    dev = "cpu" if smoke else "cuda"
    sync = None if smoke else nbx.cuda.synchronize
    ours = per_call(nbx, dev, nbx.float32, nbx.bfloat16, sync, k=64 if smoke else 4096)
    theirs = per_call(torch, "cuda", torch.float32, torch.bfloat16, torch.cuda.synchronize) \
        if torch is not None and not smoke else {}
    for k, us in ours.items():
        t_us = theirs.get(k)
        record(figure="per call", op=k, nbx_us=us, torch_us=t_us if t_us else 0.0,
               ratio=(t_us / us) if t_us else 0.0)
    if smoke:
        print("smoke: the per-call calls ran on", dev)
        return
    ev = nbx.cuda.Event
    n = 64 << 20
    a = nbx.empty((n,), dtype=nbx.float32, device="cuda").fill_(1.5)
    b = nbx.empty((n,), dtype=nbx.float32, device="cuda").fill_(0.5)
    ms = gpu_ms(lambda: a.clone(), ev, sync)
    record(figure="bandwidth", op="copy f32 256MiB", nbx_gbs=2 * n * 4 / ms / 1e6)
    ms = gpu_ms(lambda: a + b, ev, sync)
    record(figure="bandwidth", op="add f32 256MiB", nbx_gbs=3 * n * 4 / ms / 1e6)
    r = nbx.empty((16384, 4096), dtype=nbx.float32, device="cuda").fill_(0.25)
    ms = gpu_ms(lambda: r.sum(-1), ev, sync)
    record(figure="bandwidth", op="sum f32 (16384,4096) dim=-1",
           nbx_gbs=16384 * 4096 * 4 / ms / 1e6)
    del a, b, r
    rng = np.random.default_rng(1)
    m1 = nbx.tensor(rng.standard_normal((4096, 4096)).astype(np.float32)).to("cuda").to(
        nbx.bfloat16)
    m2 = nbx.tensor(rng.standard_normal((4096, 4096)).astype(np.float32)).to("cuda").to(
        nbx.bfloat16)
    ms = gpu_ms(lambda: m1 @ m2, ev, sync)
    record(figure="matmul", op="bf16 4096^3", nbx_tflops=2 * 4096 ** 3 / ms / 1e9)
    del m1, m2
    shape = (4, 32, 4096, 128)
    qkv = [nbx.tensor(rng.standard_normal(shape).astype(np.float32)).to("cuda").to(
        nbx.bfloat16) for _ in range(3)]
    for causal in (False, True):
        ms = gpu_ms(lambda: nbx.scaled_dot_product_attention(*qkv, is_causal=causal), ev, sync,
                    iters=5)
        flops = 4 * 4 * 32 * 4096 * 4096 * 128 * (0.5 if causal else 1.0)
        record(figure="attention", op=f"B4 H32 S4096 D128 causal={causal}",
               nbx_tflops=flops / ms / 1e9)
    with open(os.path.join(out, "bench_figures.json"), "w") as f:
        json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv)
