"""Probe (H200): where MoE decode's time goes (kernels/moe.py), batch 1, random bf16 weights.

    PYTHONPATH=src python3 benchmarks/probe_moe.py [OUTDIR]

Shapes as bench_moe.py (OLMoE-1B-7B: H 2048, 64 experts, I 1024, top-8; Qwen3-30B-A3B:
H 2048, 128 experts, I 768, top-8). For each shape and GEMV tile (BLOCK_N, BLOCK_K, warps)
and down-projection form (per token looping over its experts, or per slot + ordered
reduce), over 64 rotating gating rows: GPU time per call (us, queued behind a sleep kernel:
_common.time_rotated) and eager time (us, CUDA events, host included) of fused_moe, of
moe_topk alone and of fused_experts alone; the active-weight bandwidth limit (top-k x 3 H I
bf16 at 4.0 TB/s read) and the fraction of it reached on GPU time; max |y - y_default|.
Written to OUTDIR/probe_moe.json.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)
import numpy as np  # noqa: E402
from _common import event_best_ms, out_dir, recorder, time_rotated  # noqa: E402

import nbxtensor as nbx  # noqa: E402
from nbxtensor.kernels import moe as KM  # noqa: E402

SHAPES = {"olmoe": ("OLMoE-1B-7B", 2048, 64, 1024, 8),
          "qwen3": ("Qwen3-30B-A3B", 2048, 128, 768, 8)}
TILES = [(16, 128, 4), (8, 256, 4), (32, 128, 4), (16, 256, 8), (4, 512, 4)]
READ_BW = 4.0e12


def main():
    rows = []
    record = recorder(rows)
    F = nbx.nn.functional
    for key, (name, H, E, I, topk) in SHAPES.items():
        g = np.random.default_rng(0)
        w1 = nbx.tensor((g.standard_normal((E, 2 * I, H), np.float32) / np.sqrt(H)),
                        device="cuda").to(nbx.bfloat16)
        w2 = nbx.tensor((g.standard_normal((E, H, I), np.float32) / np.sqrt(I)),
                        device="cuda").to(nbx.bfloat16)
        R = 64
        xs = [nbx.tensor(g.standard_normal((1, H)).astype(np.float32), device="cuda").to(
            nbx.bfloat16) for _ in range(R)]
        gs = [nbx.tensor(g.standard_normal((1, E)).astype(np.float32), device="cuda")
              for _ in range(R)]
        wids = [F.moe_topk(gg, topk) for gg in gs]
        active = topk * 3 * H * I * 2
        limit_us = active / READ_BW * 1e6
        ref = F.fused_moe(xs[0], w1, w2, gs[0], topk).to(nbx.float32).numpy()
        it = {"i": 0}

        def eager(fn):
            def step():
                fn(it["i"] % R)
                it["i"] += 1
            return event_best_ms(step, 200, nbx.cuda.Event) * 1e3
        topk_fn = lambda i: F.moe_topk(gs[i], topk)  # noqa: E731
        record(shape=name, part="moe_topk", gpu_us=time_rotated(topk_fn, R, 200) * 1e3,
               eager_us=eager(topk_fn))
        for tile in TILES:
            KM.GEMV_TILE = tile
            try:
                full = lambda i: F.fused_moe(xs[i], w1, w2, gs[i], topk)  # noqa: E731
                ex = lambda i: F.fused_experts(xs[i], w1, w2, *wids[i])  # noqa: E731
                err = float(np.abs(full(0).to(nbx.float32).numpy() - ref).max())
                f_gpu = time_rotated(full, R, 200) * 1e3
                e_gpu = time_rotated(ex, R, 200) * 1e3
                record(shape=name, part="fused_moe", tile=str(tile), gpu_us=f_gpu,
                       eager_us=eager(full), experts_gpu_us=e_gpu, limit_us=limit_us,
                       frac_gpu=limit_us / f_gpu, frac_experts_gpu=limit_us / e_gpu, err=err)
            except Exception as e:  # noqa: BLE001
                record(shape=name, tile=str(tile), error=f"{type(e).__name__}: {str(e)[:200]}")
        KM.GEMV_TILE = (16, 128, 4)
        del w1, w2
    path = os.path.join(out_dir(), "probe_moe.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
