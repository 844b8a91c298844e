"""Indexing ops on the GPU, side by side with torch in the same run.

    PYTHONPATH=src python3 benchmarks/bench_indexing.py [--quick] [OUTDIR]

Cases: embedding (vocab 128256 x 2048 bf16, 1..4096 tokens), index_select, gather and
masked_fill at model shapes. Each case is timed as wall-clock per call over a loop of
calls after a warm-up and a synchronize (so it is the eager cost a model sees,
including Python and launch overhead), median of 5 repeats, for:

    torch        torch's op
    nbx          nbxtensor's op (reads the 16-byte out-of-range flag back: one sync)
    nbx_defer    nbxtensor's op inside deferred_index_checks() (no per-call sync)

ratio = torch / nbx (>= 0.8 is the goal; > 1 means nbx is faster). Each result is
also compared with torch's (exact equality: these ops move values, they do not round).
Writes indexing.json to OUTDIR (default: $OUT, else the current directory).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import torch  # noqa: E402  (the reference only)

import nbxtensor as nbx  # noqa: E402
from nbxtensor.ops.indexing import deferred_index_checks  # noqa: E402

QUICK = "--quick" in sys.argv
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
OUTDIR = ARGS[0] if ARGS else os.environ.get("OUT", ".")


def to_nbx(t: torch.Tensor):
    """A torch cuda tensor -> an nbx cuda tensor (through the host; setup only)."""
    t = t.contiguous().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        a = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        a = t.numpy()
    return nbx.tensor(a, device="cuda")


def to_np(x):
    if isinstance(x, torch.Tensor):
        x = x.cpu()
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).numpy()
        return x.numpy()
    a = x.numpy()
    return a.view(np.int16) if a.dtype.name == "bfloat16" else a


def sync_all():
    torch.cuda.synchronize()
    nbx.cuda.synchronize()


def timeit(fn, n_iter):
    fn()
    sync_all()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n_iter):
            fn()
        sync_all()
        times.append((time.perf_counter() - t0) / n_iter)
    return statistics.median(times)


def iters_for(nbytes):
    if nbytes < (1 << 20):
        return 200 if not QUICK else 50
    if nbytes < (64 << 20):
        return 50 if not QUICK else 10
    return 10 if not QUICK else 3


def bench(name, shape_desc, torch_fn, nbx_fn, moved_bytes):
    ref = torch_fn()
    got = nbx_fn()
    match = bool(np.array_equal(to_np(ref), to_np(got)))
    n = iters_for(moved_bytes)
    t_torch = timeit(torch_fn, n)
    t_nbx = timeit(nbx_fn, n)

    def deferred():
        with deferred_index_checks():
            for _ in range(8):
                nbx_fn()

    t_def = timeit(deferred, max(1, n // 8)) / 8
    row = dict(op=name, shape=shape_desc, torch_us=t_torch * 1e6, nbx_us=t_nbx * 1e6,
               nbx_defer_us=t_def * 1e6, ratio=t_torch / t_nbx, ratio_defer=t_torch / t_def,
               nbx_GBps=moved_bytes / t_nbx / 1e9, torch_GBps=moved_bytes / t_torch / 1e9,
               match=match)
    print(f"{name:13s} {shape_desc:44s} torch {row['torch_us']:9.1f} us  nbx {row['nbx_us']:9.1f} "
          f"us  defer {row['nbx_defer_us']:9.1f} us  ratio {row['ratio']:5.2f} "
          f"({row['ratio_defer']:5.2f} deferred)  {row['nbx_GBps']:7.0f} GB/s  "
          f"{'ok' if match else 'MISMATCH'}", flush=True)
    return row


def main():
    if not torch.cuda.is_available() or not nbx.cuda.is_available():
        print("bench_indexing: needs a GPU with torch and nbxtensor's cuda device")
        return 1
    torch.manual_seed(0)
    rows = []
    dev = "cuda"

    # embedding: a Llama-3 vocabulary
    V, H = 128256, 2048
    w_t = torch.randn(V, H, dtype=torch.bfloat16, device=dev)
    w_n = to_nbx(w_t)
    for T in ([1, 128, 4096] if QUICK else [1, 16, 128, 512, 1024, 4096]):
        ids_t = torch.randint(0, V, (T,), device=dev)
        ids_n = to_nbx(ids_t)
        rows.append(bench("embedding", f"({V}x{H} bf16)[{T} tokens]",
                          lambda: torch.nn.functional.embedding(ids_t, w_t),
                          lambda: nbx.embedding(ids_n, w_n), 2 * T * H * 2 + T * 8))
    del w_t, w_n

    # index_select along dim 0 and dim 1
    x_t = torch.randn(4096, 4096, dtype=torch.bfloat16, device=dev)
    x_n = to_nbx(x_t)
    for dim, m in ((0, 4096), (1, 2048)):
        i_t = torch.randint(0, 4096, (m,), device=dev)
        i_n = to_nbx(i_t)
        moved = 2 * 4096 * m * 2 + m * 8
        rows.append(bench("index_select", f"(4096x4096 bf16, dim={dim}, {m} idx)",
                          lambda: torch.index_select(x_t, dim, i_t),
                          lambda: nbx.index_select(x_n, dim, i_n), moved))

    # gather: picking token log-probs, and a full-size gather along the last dim
    B = 1024 if QUICK else 4096
    lp_t = torch.randn(B, 32000, dtype=torch.float32, device=dev)
    lp_n = to_nbx(lp_t)
    g_t = torch.randint(0, 32000, (B, 1), device=dev)
    g_n = to_nbx(g_t)
    rows.append(bench("gather", f"({B}x32000 f32, dim=-1, index {B}x1)",
                      lambda: torch.gather(lp_t, -1, g_t), lambda: nbx.gather(lp_n, -1, g_n),
                      B * 16))
    del lp_t, lp_n
    S = (8, 1024, 1024) if QUICK else (16, 2048, 2048)
    a_t = torch.randn(*S, dtype=torch.bfloat16, device=dev)
    a_n = to_nbx(a_t)
    gi_t = torch.randint(0, S[2], S, device=dev)
    gi_n = to_nbx(gi_t)
    numel = S[0] * S[1] * S[2]
    rows.append(bench("gather", f"({'x'.join(map(str, S))} bf16, dim=2, full index)",
                      lambda: torch.gather(a_t, 2, gi_t), lambda: nbx.gather(a_n, 2, gi_n),
                      numel * (2 + 2 + 8)))
    del a_t, a_n, gi_t, gi_n

    # masked_fill: causal mask on attention scores, the mask broadcast over batch and heads
    for (B, Hh, T) in ([(4, 32, 512)] if QUICK else [(4, 32, 512), (4, 32, 1024), (1, 32, 2048)]):
        s_t = torch.randn(B, Hh, T, T, dtype=torch.bfloat16, device=dev)
        s_n = to_nbx(s_t)
        m_t = torch.ones(T, T, dtype=torch.bool, device=dev).triu(1)[None, None]
        m_n = to_nbx(m_t)
        n = B * Hh * T * T
        rows.append(bench("masked_fill", f"({B},{Hh},{T},{T}) bf16, mask (1,1,{T},{T})",
                          lambda: s_t.masked_fill(m_t, float("-inf")),
                          lambda: s_n.masked_fill(m_n, float("-inf")), n * 4))
        del s_t, s_n

    worst = min(r["ratio"] for r in rows)
    print(f"worst ratio torch/nbx: {worst:.2f} (goal >= 0.8); all match: "
          f"{all(r['match'] for r in rows)}")
    os.makedirs(OUTDIR, exist_ok=True)
    path = os.path.join(OUTDIR, "indexing.json")
    with open(path, "w") as f:
        json.dump(dict(bench="indexing", quick=QUICK, device=torch.cuda.get_device_name(),
                       torch=torch.__version__, rows=rows), f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
