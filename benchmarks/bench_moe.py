"""Fused MoE on the GPU: decode at batch 1 and a 2,048-token prefill, random bf16 weights.

    PYTHONPATH=src python3 benchmarks/bench_moe.py [--quick] [--models olmoe,qwen3] [OUTDIR]

Shapes (one MoE layer; nothing is downloaded):
  OLMoE-1B-7B     hidden 2048, 64 experts,  expert FFN 1024, top-8
  Qwen3-30B-A3B   hidden 2048, 128 experts, expert FFN 768,  top-8

decode (M = 1): `nbx.nn.functional.fused_moe` (router top-k + the GEMV decode kernels),
  timed over a rotation of gating rows so the chosen experts change between calls (their
  weights come from HBM, as in a model step). Reported against the bandwidth limit of the
  *active* weights (top-k experts x 3*H*I bf16 + the router's input, at the measured
  device copy bandwidth; goal >= 70 %), and against a torch eager loop over the chosen
  experts (ids read to the host, one expert MLP after another; goal >= 3x).
prefill (M = 2048): fused_moe (align + the two grouped GEMMs + the reduction) against a
  dense bf16 matmul of the same FLOPs (numel = M*top-k rows, K = H, N = 3*I) by nbx.matmul
  and torch.matmul (goal: the MoE >= 0.8x the dense matmul).
Also a correctness check of each path against torch (the same weights), when torch exists.
torch is optional: without it the torch columns are skipped. Results: OUTDIR/bench_moe.json.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import event_best_ms, out_dir, recorder  # noqa: E402

import nbxtensor as nbx  # noqa: E402

SHAPES = {"olmoe": ("OLMoE-1B-7B", 2048, 64, 1024, 8),
          "qwen3": ("Qwen3-30B-A3B", 2048, 128, 768, 8)}


def _torch():
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def _event():
    from nbxtensor import cuda as ncuda
    return ncuda.Event


def _ms(fn, iters):
    fn()
    nbx.cuda.synchronize()
    return event_best_ms(fn, iters, _event())


def copy_bandwidth(nbytes=1 << 30):
    """Device copy bandwidth (read + write, GB/s) of an nbx tensor copy."""
    src = nbx.empty((nbytes,), dtype=nbx.uint8, device="cuda")
    dst = nbx.empty((nbytes,), dtype=nbx.uint8, device="cuda")
    ms = _ms(lambda: dst.copy_(src), 5)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def run_shape(key, record, quick, bw):
    name, H, E, I, topk = SHAPES[key]
    g = np.random.default_rng(0)
    F = nbx.nn.functional
    w1h = (g.standard_normal((E, 2 * I, H), np.float32) / np.sqrt(H)).astype(nbx.bfloat16.np)
    w2h = (g.standard_normal((E, H, I), np.float32) / np.sqrt(I)).astype(nbx.bfloat16.np)
    w1 = nbx.tensor(w1h, device="cuda")
    w2 = nbx.tensor(w2h, device="cuda")
    torch = _torch()
    tw1 = tw2 = None
    if torch is not None:
        tw1 = torch.from_numpy(w1h.view(np.int16)).view(torch.bfloat16).cuda()
        tw2 = torch.from_numpy(w2h.view(np.int16)).view(torch.bfloat16).cuda()

    # ---- decode, batch 1
    R = 64        # gating rotation: the chosen experts change from call to call
    xs = [nbx.tensor(g.standard_normal((1, H)).astype(nbx.bfloat16.np), device="cuda")
          for _ in range(R)]
    gs = [nbx.tensor(g.standard_normal((1, E)).astype(np.float32), device="cuda")
          for _ in range(R)]
    it = {"i": 0}

    def nbx_decode():
        i = it["i"] = (it["i"] + 1) % R
        return F.fused_moe(xs[i], w1, w2, gs[i], topk)
    ms = _ms(nbx_decode, 20 if quick else 200)
    active = topk * 3 * H * I * 2 + H * 2 + E * 4
    limit_ms = active / (bw * 1e9 / 2) * 1e3       # read-only: half the copy's two-way bytes
    row = dict(shape=name, path="decode", M=1, nbx_us=ms * 1e3, limit_us=limit_ms * 1e3,
               frac_of_limit=limit_ms / ms)
    if torch is not None:
        txs = [torch.from_numpy(x.numpy().view(np.int16)).view(torch.bfloat16).cuda()
               for x in xs]
        tgs = [torch.from_numpy(gg.numpy()).cuda() for gg in gs]

        def torch_decode(i=None):
            i = it["i"] = (it["i"] + 1) % R if i is None else i
            x = txs[i]
            p = torch.softmax(tgs[i], -1)
            w, ids = torch.topk(p, topk, -1)
            w = w / w.sum(-1, keepdim=True)
            out = torch.zeros_like(x, dtype=torch.float32)
            for j, e in enumerate(ids[0].tolist()):     # an eager loop: ids to the host
                h = x @ tw1[e].T
                h = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
                out += w[0, j] * (h @ tw2[e].T).float()
            return out.to(torch.bfloat16)
        tms = _ms(torch_decode, 20 if quick else 200)
        row.update(torch_eager_us=tms * 1e3, x_vs_torch=tms / ms)
        ref = torch_decode(0).float().cpu().numpy()
        got = F.fused_moe(xs[0], w1, w2, gs[0], topk).numpy().astype(np.float32)
        row["max_abs_err"] = float(np.abs(got - ref).max())
    record(**row)

    # ---- prefill, 2048 tokens
    M = 256 if quick else 2048
    x = nbx.tensor(g.standard_normal((M, H)).astype(nbx.bfloat16.np), device="cuda")
    gate = nbx.tensor(g.standard_normal((M, E)).astype(np.float32), device="cuda")
    ms = _ms(lambda: F.fused_moe(x, w1, w2, gate, topk), 5 if quick else 20)
    flops = 2 * M * topk * 3 * H * I
    a = nbx.tensor(g.standard_normal((M * topk, H)).astype(nbx.bfloat16.np), device="cuda")
    b = nbx.tensor(g.standard_normal((H, 3 * I)).astype(nbx.bfloat16.np), device="cuda")
    dms = _ms(lambda: nbx.matmul(a, b), 5 if quick else 20)
    row = dict(shape=name, path="prefill", M=M, nbx_us=ms * 1e3, tflops=flops / ms / 1e9,
               dense_nbx_us=dms * 1e3, x_vs_dense_nbx=dms / ms)
    if torch is not None:
        ta = torch.randn(M * topk, H, dtype=torch.bfloat16, device="cuda")
        tb = torch.randn(H, 3 * I, dtype=torch.bfloat16, device="cuda")
        tms = _ms(lambda: ta @ tb, 5 if quick else 20)
        row.update(dense_torch_us=tms * 1e3, x_vs_dense_torch=tms / ms)
        # correctness on a few rows against a torch loop over tokens and their experts
        xt = torch.from_numpy(x.numpy()[:8].view(np.int16)).view(torch.bfloat16).cuda().float()
        p = torch.softmax(torch.from_numpy(gate.numpy()[:8]).cuda(), -1)
        w, ids = torch.topk(p, topk, -1)
        w = w / w.sum(-1, keepdim=True)
        ref = torch.zeros(8, H, device="cuda")
        for t in range(8):
            for j in range(topk):
                e = int(ids[t, j])
                h = xt[t] @ tw1[e].float().T
                h = (torch.nn.functional.silu(h[:I]) * h[I:]).to(torch.bfloat16).float()
                ref[t] += w[t, j] * (h @ tw2[e].float().T)
        got = F.fused_moe(x, w1, w2, gate, topk).numpy()[:8].astype(np.float32)
        row["max_abs_err"] = float(np.abs(got - ref.cpu().numpy()).max())
    record(**row)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    quick = "--quick" in argv
    keys = list(SHAPES)
    for a in argv:
        if a.startswith("--models="):
            keys = a.split("=", 1)[1].split(",")
    if "--models" in argv:
        keys = argv[argv.index("--models") + 1].split(",")
    rows = []
    record = recorder(rows)
    bw = copy_bandwidth()
    print(f"device copy bandwidth: {bw:.0f} GB/s (read + write)")
    for k in keys:
        run_shape(k, record, quick, bw)
    skip = {argv[argv.index("--models") + 1]} if "--models" in argv else set()
    d = out_dir([a for a in argv if a not in skip])
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "bench_moe.json"), "w") as f:
        json.dump({"copy_bw_GBps": bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
