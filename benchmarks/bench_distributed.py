"""nbx.distributed on several GPUs: all-reduce bus bandwidth, and tensor-parallel decode.

    # all-reduce: nbx (NCCL through our bindings) and torch.distributed in the same processes
    python -m nbxtensor.distributed.run -n 2 benchmarks/bench_distributed.py allreduce OUTDIR
    # decode at batch 1, random bf16 weights; run -n 1 first, then -n 2 (which compares logits)
    python -m nbxtensor.distributed.run -n 1 benchmarks/bench_distributed.py decode OUTDIR 1B
    python -m nbxtensor.distributed.run -n 2 benchmarks/bench_distributed.py decode OUTDIR 1B

allreduce: bf16 sizes 8 B .. 1 GiB; the time of one in-place all-reduce (CUDA events over
20 calls after 5 warm-ups, on nbx's current stream), algorithm bandwidth size/t and bus
bandwidth size/t * 2(n-1)/n (nccl-tests' definition); torch's the same way when torch is
installed. Rank 0 writes OUTDIR/allreduce_n{N}.json.

decode: the Llama-3.2-1B shape (hidden 2048, 16 layers, 32/8 heads, FFN 8192, vocab 128256)
or an 8B shape (4096, 32 layers, 32/8 heads, FFN 14336), random bf16 weights from one seed
(built on the host, sharded by `shard_llama`), the decode step captured by GraphDecoder and
replayed: tok/s at batch 1, cache length 128. Rank 0 writes OUTDIR/decode_{model}_tp{N}.json
and the first step's logits; the tp2 run compares them with the tp1 run's (bf16 tolerance).
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import nbxtensor as nbx  # noqa: E402
import nbxtensor.distributed as dist  # noqa: E402

SHAPES = {"1B": dict(hidden=2048, layers=16, heads=32, kv=8, ffn=8192, vocab=128256),
          "8B": dict(hidden=4096, layers=32, heads=32, kv=8, ffn=14336, vocab=128256)}


def _time(fn, iters=20, warm=5):
    for _ in range(warm):
        fn()
    a, b = nbx.cuda.Event(enable_timing=True), nbx.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters / 1e3


def allreduce(out):
    dist.init_process_group("nccl")
    n, r = dist.get_world_size(), dist.get_rank()
    dev = dist.get_device()
    rows = []
    try:
        import torch
        import torch.distributed as tdist
        os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
        torch.cuda.set_device(dev.index)
        tdist.init_process_group("nccl", rank=r, world_size=n)
    except ImportError:
        torch = None
    for p in range(3, 31, 2):
        size = 1 << p
        t = nbx.ones((size // 2,), dtype=nbx.bfloat16, device=dev)
        row = {"bytes": size, "nbx_s": _time(lambda: dist.all_reduce(t))}
        if torch is not None:
            tt = torch.ones(size // 2, dtype=torch.bfloat16, device=f"cuda:{dev.index}")
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(5):
                tdist.all_reduce(tt)
            a.record()
            for _ in range(20):
                tdist.all_reduce(tt)
            b.record()
            b.synchronize()
            row["torch_s"] = a.elapsed_time(b) / 20 / 1e3
        for k in ("nbx", "torch"):
            if f"{k}_s" in row:
                row[f"{k}_busbw_GBs"] = size / row[f"{k}_s"] * 2 * (n - 1) / n / 1e9
        rows.append(row)
        del t
        if r == 0:
            print(json.dumps(row), flush=True)
    if r == 0:
        with open(os.path.join(out, f"allreduce_n{n}.json"), "w") as f:
            json.dump({"world_size": n, "nccl": dist.nccl.version_string(), "rows": rows}, f,
                      indent=1)
    if torch is not None:
        tdist.destroy_process_group()
    dist.destroy_process_group()


def _random_llama(shape, seed=0):
    from nbxtensor.models.config import LlamaConfig
    from nbxtensor.models.llama import LlamaModel
    s = SHAPES[shape]
    H, D = s["hidden"], s["hidden"] // s["heads"]
    cfg = LlamaConfig(vocab_size=s["vocab"], hidden_size=H, intermediate_size=s["ffn"],
                      num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                      num_key_value_heads=s["kv"], head_dim=D, rope_theta=500000.0,
                      max_position_embeddings=4096)
    rng = np.random.default_rng(seed)

    def t(*shp, scale=None, shift=0.0):
        a = (rng.random(shp, dtype=np.float32) - 0.5) * (scale or 3.4 / np.sqrt(shp[-1])) + shift
        return nbx.from_numpy(a.astype(nbx.bfloat16.np))
    w = {"embed": t(s["vocab"], H, scale=1.0), "norm": t(H, scale=0.1, shift=1.0), "layers": []}
    w["lm_head"] = t(s["vocab"], H)
    for _ in range(s["layers"]):
        w["layers"].append({"attn_norm": t(H, scale=0.1, shift=1.0),
                            "ffn_norm": t(H, scale=0.1, shift=1.0),
                            "wq": t(s["heads"] * D, H), "wk": t(s["kv"] * D, H),
                            "wv": t(s["kv"] * D, H), "wo": t(H, s["heads"] * D),
                            "w_gate": t(s["ffn"], H), "w_up": t(s["ffn"], H),
                            "w_down": t(H, s["ffn"])})
    return LlamaModel(cfg, w, None, "cpu", nbx.bfloat16)


def decode(out, shape="1B", steps="200"):
    from nbxtensor.distributed.tensor_parallel import shard_llama
    from nbxtensor.models.graph_decode import GraphDecoder
    dist.init_process_group("nccl", timeout=600)
    n, r = dist.get_world_size(), dist.get_rank()
    t0 = time.perf_counter()
    m = shard_llama(_random_llama(shape))
    build_s = time.perf_counter() - t0
    steps, L = int(steps), 128
    toks = np.random.default_rng(1).integers(0, SHAPES[shape]["vocab"], 1)
    g = GraphDecoder(m, batch=1, capacity=L + steps + 8, use_graph=True)
    g.start_at(L, toks)
    g.capture()
    g.start_at(L, toks)
    g.step()
    nbx.cuda.synchronize()
    first = g.logits.to(nbx.float32).numpy()
    g.start_at(L, toks)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        g.step()
    nbx.cuda.synchronize()
    dt = time.perf_counter() - t0
    row = {"model": shape, "tp": n, "tok_s": steps / dt, "step_us": dt / steps * 1e6,
           "build_s": round(build_s, 1)}
    if r == 0:
        np.save(os.path.join(out, f"decode_{shape}_tp{n}_logits.npy"), first)
        ref_path = os.path.join(out, f"decode_{shape}_tp1_logits.npy")
        if n > 1 and os.path.exists(ref_path):
            ref = np.load(ref_path)
            err = np.abs(first - ref).max() / max(np.abs(ref).max(), 1e-30)
            row["max_rel_err_vs_tp1"] = float(err)
            row["argmax_equal_tp1"] = bool(first.argmax() == ref.argmax())
            row["logits_close_bf16"] = bool(err < 3e-2)
        print(json.dumps(row), flush=True)
        with open(os.path.join(out, f"decode_{shape}_tp{n}.json"), "w") as f:
            json.dump(row, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, outdir, *rest = sys.argv[1:]
    os.makedirs(outdir, exist_ok=True)
    {"allreduce": allreduce, "decode": decode}[mode](outdir, *rest)
