"""Indexing, shape and sort ops on the GPU, side by side with torch in the same run (issue 4).

    PYTHONPATH=src python3 benchmarks/bench_indexing.py [--quick] [--gather-sweep] [OUTDIR]
    PYTHONPATH=src python3 benchmarks/bench_indexing.py --fake-cuda   # our Python only (no GPU)

Cases at model shapes: embedding (vocab 128256 x 2048 bf16, 1..4096 tokens), index_select,
gather, masked_fill, cat, stack, flip, sort and topk. Each case is timed as wall-clock per
call over a loop of calls after a warm-up and a synchronize (the eager cost a model sees,
including Python and launch overhead), median of 5 repeats, for:

    torch        torch's op
    nbx          nbxtensor's op (default 'async' index checks: no per-call sync)
    nbx_sync     index ops with nbx.set_index_check('sync') (a flag read, i.e. a sync, per op)
    gpu          GPU time per call (calls queued behind a sleep kernel), nbx and torch

ratio = torch / nbx wall time (>= 0.8 is the goal; > 1 means nbx is faster); gpu_ratio the
same for GPU time. Each result is compared with torch's (exact equality: these ops move
values). --gather-sweep also times index_select dim=1 and the full-index gather under several
kernels/indexing.py G2D_CONFIG tiles (sort's configs: bench_reduction.py --sort-sweep2).
Writes indexing.json to OUTDIR (default: $OUT, else the cwd).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import gpu_time_behind_sleep, out_dir  # noqa: E402

QUICK = "--quick" in sys.argv
OUTDIR = out_dir()

import nbxtensor as nbx  # noqa: E402
from nbxtensor.ops.indexing import set_index_check  # noqa: E402


def to_nbx(t):
    """A torch cuda tensor -> an nbx cuda tensor (through the host; setup only)."""
    import torch
    t = t.contiguous().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        a = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    elif t.dtype == torch.bool:
        a = t.numpy()
    else:
        a = t.numpy()
    return nbx.tensor(a, device="cuda")


def to_np(x):
    import torch
    if isinstance(x, (tuple, list)):
        return [to_np(y) for y in x]
    if isinstance(x, torch.Tensor):
        x = x.cpu()
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).numpy()
        return x.numpy()
    a = x.numpy()
    return a.view(np.int16) if a.dtype.name == "bfloat16" else a


def sync_all():
    import torch
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


def gputime(fn, n_iter, wall):
    """Kernel time only (calls queued behind a sleep kernel); nan when torch has no _sleep
    or the op synchronised with the host."""
    g = gpu_time_behind_sleep(fn, n_iter, wall, fallback=float("nan"))
    nbx.cuda.synchronize()
    return g


def iters_for(nbytes):
    if nbytes < (1 << 20):
        return 200 if not QUICK else 60
    if nbytes < (64 << 20):
        return 50 if not QUICK else 15
    return 10 if not QUICK else 4


def same(ref, got):
    r, g = to_np(ref), to_np(got)
    if isinstance(r, list):
        return all(np.array_equal(a, b) for a, b in zip(r, g))
    return bool(np.array_equal(r, g))


def bench(name, shape_desc, torch_fn, nbx_fn, moved_bytes, index_op=False):
    ref = torch_fn()
    got = nbx_fn()
    match = same(ref, got)
    n = iters_for(moved_bytes)
    t_torch = timeit(torch_fn, n)
    t_nbx = timeit(nbx_fn, n)
    t_sync = float("nan")
    if index_op:
        prev = set_index_check("sync")
        try:
            t_sync = timeit(nbx_fn, n)
        finally:
            set_index_check(prev)
    g_torch = gputime(torch_fn, n, t_torch)
    g_nbx = gputime(nbx_fn, n, t_nbx)
    row = dict(op=name, shape=shape_desc, torch_us=t_torch * 1e6, nbx_us=t_nbx * 1e6,
               nbx_sync_us=t_sync * 1e6, ratio=t_torch / t_nbx,
               torch_gpu_us=g_torch * 1e6, nbx_gpu_us=g_nbx * 1e6, gpu_ratio=g_torch / g_nbx,
               nbx_GBps=moved_bytes / t_nbx / 1e9 if moved_bytes else None, match=match)
    print(f"{name:12s} {shape_desc:42s} {row['torch_us']:8.1f} {row['nbx_us']:8.1f} "
          f"{row['nbx_sync_us']:8.1f} {row['ratio']:6.2f} | {row['torch_gpu_us']:8.1f} "
          f"{row['nbx_gpu_us']:8.1f} {row['gpu_ratio']:6.2f}  {'ok' if match else 'MISMATCH'}",
          flush=True)
    return row


def _reset_gather_plans():
    from nbxtensor import plans
    plans.clear_all()


def gather_sweep():
    """index_select dim=1 and the full-index gather: _gather2d_kernel under several
    kernels/indexing.py G2D_CONFIG tiles (the first: the shipped one)."""
    import torch
    from nbxtensor.kernels import indexing as kix
    cfg = kix.G2D_CONFIG["cuda"]
    saved_cfg = dict(cfg)
    x_t = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    i_t = torch.randint(0, 4096, (2048,), device="cuda")
    S = (8, 1024, 1024)
    a_t = torch.randn(*S, dtype=torch.bfloat16, device="cuda")
    gi_t = torch.randint(0, S[2], S, device="cuda")
    x_n, i_n, a_n, gi_n = to_nbx(x_t), to_nbx(i_t), to_nbx(a_t), to_nbx(gi_t)
    cases = [
        ("col", "index_select (4096x4096 bf16, dim=1, 2048 idx)",
         lambda: torch.index_select(x_t, 1, i_t), lambda: nbx.index_select(x_n, 1, i_n),
         [(256, 4096, 4, False), (512, 4096, 4, False), (128, 2048, 4, False),
          (256, 8192, 8, False), (1024, 8192, 8, False), (64, 2048, 4, False),
          (256, 2048, 2, False)]),
        ("full", "gather (8x1024x1024 bf16, dim=2, full index)",
         lambda: torch.gather(a_t, 2, gi_t), lambda: nbx.gather(a_n, 2, gi_n),
         [(256, 2048, 4, False), (256, 2048, 4, True), (128, 1024, 4, False),
          (1024, 4096, 8, False), (256, 4096, 8, False), (512, 2048, 4, False),
          (128, 2048, 8, False), (64, 512, 2, False)]),
    ]
    out = []
    print("gather sweep: config (max BC, tile, warps, flag_lanes) -> wall us, gpu us "
          "(torch first, then the shipped config)")
    for kind, desc, tfn, nfn, configs in cases:
        wt = timeit(tfn, 30)
        gt = gputime(tfn, 30, wt)
        print(f"  {desc}\n    torch            {wt * 1e6:8.1f} {gt * 1e6:8.1f}", flush=True)
        out.append(dict(case=kind, config="torch", wall_us=wt * 1e6, gpu_us=gt * 1e6))
        for c in [None] + configs:
            cfg[kind] = saved_cfg[kind] if c is None else c
            _reset_gather_plans()
            try:
                ok = same(tfn(), nfn())
                w = timeit(nfn, 30)
                g = gputime(nfn, 30, w)
                name = "shipped" if c is None else str(c)
                print(f"    {name:24s} {w * 1e6:8.1f} {g * 1e6:8.1f}  gpu ratio {gt / g:5.2f}  "
                      f"{'ok' if ok else 'MISMATCH'}", flush=True)
                out.append(dict(case=kind, config=name, wall_us=w * 1e6, gpu_us=g * 1e6,
                                gpu_ratio=gt / g, match=ok))
            except Exception as e:  # noqa: BLE001 - report a config that fails, go on
                print(f"    {c}: failed: {type(e).__name__}: {str(e)[:100]}")
        cfg.clear()
        cfg.update(saved_cfg)
    _reset_gather_plans()
    return out


def main():
    if "--fake-cuda" in sys.argv:
        return fake_cuda()
    import torch
    if not torch.cuda.is_available() or not nbx.cuda.is_available():
        print("bench_indexing: needs a GPU with torch and nbxtensor's cuda device")
        return 1
    t_start = time.perf_counter()
    torch.manual_seed(0)
    rows = []
    dev = "cuda"
    print(f"{'op':12s} {'shape':42s} {'torch':>8s} {'nbx':>8s} {'nbx_sync':>8s} {'ratio':>6s} | "
          f"{'t_gpu':>8s} {'nbx_gpu':>8s} {'ratio':>6s}   (us per call; ratio = torch/nbx)")

    # embedding: a Llama-3 vocabulary
    V, H = 128256, 2048
    w_t = torch.randn(V, H, dtype=torch.bfloat16, device=dev)
    w_n = to_nbx(w_t)
    for T in ([1, 128, 4096] if QUICK else [1, 16, 128, 512, 1024, 4096]):
        ids_t = torch.randint(0, V, (1, T), device=dev)
        ids_n = to_nbx(ids_t)
        rows.append(bench("embedding", f"({V}x{H} bf16)[1x{T} tokens]",
                          lambda: torch.nn.functional.embedding(ids_t, w_t),
                          lambda: nbx.embedding(ids_n, w_n), 2 * T * H * 2 + T * 8, True))
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
                          lambda: nbx.index_select(x_n, dim, i_n), moved, True))
    del x_t, x_n

    # gather: picking token log-probs, and a full-size gather along the last dim
    B = 1024 if QUICK else 4096
    lp_t = torch.randn(B, 32000, dtype=torch.float32, device=dev)
    lp_n = to_nbx(lp_t)
    g_t = torch.randint(0, 32000, (B, 1), device=dev)
    g_n = to_nbx(g_t)
    rows.append(bench("gather", f"({B}x32000 f32, dim=-1, index {B}x1)",
                      lambda: torch.gather(lp_t, -1, g_t), lambda: nbx.gather(lp_n, -1, g_n),
                      B * 16, True))
    del lp_t, lp_n
    S = (8, 1024, 1024) if QUICK else (16, 2048, 2048)
    a_t = torch.randn(*S, dtype=torch.bfloat16, device=dev)
    a_n = to_nbx(a_t)
    gi_t = torch.randint(0, S[2], S, device=dev)
    gi_n = to_nbx(gi_t)
    numel = S[0] * S[1] * S[2]
    rows.append(bench("gather", f"({'x'.join(map(str, S))} bf16, dim=2, full index)",
                      lambda: torch.gather(a_t, 2, gi_t), lambda: nbx.gather(a_n, 2, gi_n),
                      numel * (2 + 2 + 8), True))
    del a_t, a_n, gi_t, gi_n

    # masked_fill: causal mask on attention scores, the mask broadcast over batch and heads
    for (B, Hh, T) in ([(4, 32, 512)] if QUICK else [(4, 32, 512), (1, 32, 2048)]):
        s_t = torch.randn(B, Hh, T, T, dtype=torch.bfloat16, device=dev)
        s_n = to_nbx(s_t)
        m_t = torch.ones(T, T, dtype=torch.bool, device=dev).triu(1)[None, None]
        m_n = to_nbx(m_t)
        n = B * Hh * T * T
        rows.append(bench("masked_fill", f"({B},{Hh},{T},{T}) bf16, mask (1,1,{T},{T})",
                          lambda: s_t.masked_fill(m_t, float("-inf")),
                          lambda: s_n.masked_fill(m_n, float("-inf")), n * 4))
        del s_t, s_n

    # cat / stack / flip (shapes of BENCHMARKS.md's issue-4 table, plus a decode-sized cat)
    k1_t = torch.randn(4, 8, 1024, 128, dtype=torch.bfloat16, device=dev)
    k2_t = torch.randn(4, 8, 256, 128, dtype=torch.bfloat16, device=dev)
    k1_n, k2_n = to_nbx(k1_t), to_nbx(k2_t)
    rows.append(bench("cat", "[4,8,1024,128]+[4,8,256,128] bf16 dim 2",
                      lambda: torch.cat([k1_t, k2_t], 2), lambda: nbx.cat([k1_n, k2_n], 2),
                      2 * 2 * (k1_t.numel() + k2_t.numel())))
    s1_t = torch.randn(1, 8, 1, 64, dtype=torch.bfloat16, device=dev)
    s1_n = to_nbx(s1_t)
    rows.append(bench("cat", "[1,8,1,64]x2 bf16 dim 2 (decode)",
                      lambda: torch.cat([s1_t, s1_t], 2), lambda: nbx.cat([s1_n, s1_n], 2), 4096))
    f_t = torch.randn(1024, 4096, dtype=torch.float32, device=dev)
    f_n = to_nbx(f_t)
    rows.append(bench("stack", "3x[1024,4096] f32 dim 0",
                      lambda: torch.stack([f_t, f_t, f_t]), lambda: nbx.stack([f_n, f_n, f_n]),
                      2 * 3 * 4 * f_t.numel()))
    for dims in ((0,), (-1,)):
        rows.append(bench("flip", f"[1024,4096] f32 dims {dims}",
                          lambda: torch.flip(f_t, dims), lambda: nbx.flip(f_n, dims),
                          2 * 4 * f_t.numel()))
    del k1_t, k2_t, k1_n, k2_n, f_t, f_n

    # sort / topk on a vocabulary row (sampling)
    r_t = torch.randn(1, 32000, dtype=torch.float32, device=dev)
    r_n = to_nbx(r_t)
    rows.append(bench("sort", "(1,32000) f32 desc",
                      lambda: torch.sort(r_t, dim=-1, descending=True, stable=True),
                      lambda: nbx.sort(r_n, -1, descending=True), 0))
    rows.append(bench("topk", "(1,32000) f32 k=50", lambda: torch.topk(r_t, 50),
                      lambda: nbx.topk(r_n, 50), 0))
    if not QUICK:
        r8_t = torch.randn(8, 32000, dtype=torch.float32, device=dev)
        r8_n = to_nbx(r8_t)
        rows.append(bench("sort", "(8,32000) f32 desc",
                          lambda: torch.sort(r8_t, dim=-1, descending=True, stable=True),
                          lambda: nbx.sort(r8_n, -1, descending=True), 0))
    gsweep = gather_sweep() if "--gather-sweep" in sys.argv else None

    worst = min(rows, key=lambda r: r["ratio"])
    print(f"worst wall ratio torch/nbx: {worst['ratio']:.2f} ({worst['op']} {worst['shape']}; "
          f"goal >= 0.8); all match: {all(r['match'] for r in rows)}; "
          f"{time.perf_counter() - t_start:.0f} s")
    os.makedirs(OUTDIR, exist_ok=True)
    path = os.path.join(OUTDIR, "indexing.json")
    with open(path, "w") as f:
        json.dump(dict(bench="indexing", quick=QUICK, device=torch.cuda.get_device_name(),
                       torch=torch.__version__, rows=rows, gather_sweep=gsweep), f, indent=1)
    print(f"wrote {path}")
    return 0


def fake_cuda():
    """Our Python per call on the cuda code path, no GPU: cuda tensors over the real
    CudaStorage and caching allocator with a pretend address space, every launch and
    host copy stubbed (bench_overhead.py's --fake-cuda machinery)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_overhead as bo
    bo._stub_launches()
    make = bo._fake_cuda()
    from nbxtensor.backends.cuda import driver as drv
    drv.memcpy_htod = drv.memcpy_dtoh = drv.stream_synchronize = lambda *a, **k: None
    w = make((1000, 256), "bfloat16")
    ids1, ids128 = make((1,), "int64"), make((128,), "int64")
    x, i0 = make((512, 512), "bfloat16"), make((256,), "int64")
    lp, gi = make((64, 32000), "float32"), make((64, 1), "int64")
    a, b = make((4, 8, 64, 128), "bfloat16"), make((4, 8, 16, 128), "bfloat16")
    s1 = make((256, 512), "float32")
    row = make((1, 32000), "float32")
    gfull = make((512, 512), "int64")
    cases = [
        ("embedding 1 token", lambda: nbx.embedding(ids1, w)),
        ("embedding 128 tokens", lambda: nbx.embedding(ids128, w)),
        ("index_select dim 0", lambda: nbx.index_select(x, 0, i0)),
        ("index_select dim 1", lambda: nbx.index_select(x, 1, i0)),
        ("gather dim -1 (B,1)", lambda: nbx.gather(lp, -1, gi)),
        ("gather dim 1 full index", lambda: nbx.gather(x, 1, gfull)),
        ("cat 2 dim 2", lambda: nbx.cat([a, b], 2)),
        ("stack 3", lambda: nbx.stack([s1, s1, s1])),
        ("flip dim 0", lambda: nbx.flip(s1, [0])),
        ("flip dim -1", lambda: nbx.flip(s1, [-1])),
        ("sort (1,32000)", lambda: nbx.sort(row, -1, descending=True)),
        ("topk (1,32000) k=50", lambda: nbx.topk(row, 50)),
    ]
    loops, reps = (200, 5) if QUICK else (1000, 9)
    print(f"{'op (fake cuda, launches stubbed)':34s} {'us/call':>8s} {'launches':>8s}")
    out = []
    for name, fn in cases:
        fn()
        bo._LAUNCHES[0] = 0
        fn()
        nl = bo._LAUNCHES[0]
        us = bo._time_min(fn, loops, reps) * 1e6
        out.append(dict(op=name, python_us=round(us, 2), launches=nl))
        print(f"{name:34s} {us:8.2f} {nl:8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
