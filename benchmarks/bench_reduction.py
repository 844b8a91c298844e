"""Reductions, scans, sort and topk: nbxtensor vs torch on the GPU (H200).

    PYTHONPATH=src python3 benchmarks/bench_reduction.py [--quick] [--tune] [OUTDIR]

Prints a table (ms per call, torch's ms, speed ratio torch/ours, achieved GB/s and % of
the 4.19 TB/s copy bandwidth for the large ones) and writes bench_reduction.json to
OUTDIR (or $OUT). Each row is checked against torch's result before it is timed.
--tune sweeps the row/column kernel block sizes on the large shapes and prints the best.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

COPY_BW = 4.19e12  # measured device-to-device copy on this H200, bytes/s (read + write)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    quick = "--quick" in sys.argv
    tune = "--tune" in sys.argv
    outdir = args[0] if args else os.environ.get("OUT", ".")
    os.makedirs(outdir, exist_ok=True)

    import torch
    import nbxtensor as nbx

    dev = torch.device("cuda")

    def sync():
        torch.cuda.synchronize()

    def timeit(fn, iters, warmup=3):
        for _ in range(warmup):
            fn()
        sync()
        best = float("inf")
        reps = 3
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            sync()
            best = min(best, (time.perf_counter() - t0) / iters)
        return best

    def both(shape, dtype_np, torch_dtype, gen):
        a = gen(shape).astype(dtype_np) if dtype_np != "bf16" else gen(shape).astype(np.float32)
        t = torch.from_numpy(a).to(dev)
        if dtype_np == "bf16":
            t = t.to(torch.bfloat16)
            x = nbx.tensor(t.float().cpu().numpy(), device="cuda").to(nbx.bfloat16)
        else:
            x = nbx.tensor(a, device="cuda")
        return x, t

    def to_torch(y):
        a = y.numpy()
        if str(a.dtype) == "bfloat16":  # ml_dtypes' bf16 (NumPy kind 'V')
            return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(a))

    rng = np.random.default_rng(0)
    randn = lambda s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    rows = []

    def bench(name, nbytes, ours, ref, check, iters):
        row = {"name": name}
        try:
            r_ours, r_ref = ours(), ref()
            ok, why = check(r_ours, r_ref)
            row["correct"] = ok
            if not ok:
                row["why"] = why
            t_ours = timeit(ours, iters)
            t_ref = timeit(ref, iters)
            row.update(ours_ms=t_ours * 1e3, torch_ms=t_ref * 1e3, speed_vs_torch=t_ref / t_ours)
            if nbytes:
                row.update(gbps=nbytes / t_ours / 1e9, torch_gbps=nbytes / t_ref / 1e9,
                           pct_copy_bw=100 * nbytes / t_ours / COPY_BW)
        except Exception as e:  # keep going: one broken row must not hide the others
            row["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        rows.append(row)
        print(_fmt(row), flush=True)

    def close(rtol=1e-4, atol=1e-4):
        def check(o, r):
            o = o if isinstance(o, tuple) else (o,)
            r = r if isinstance(r, tuple) else (r,)
            for a, b in zip(o, r):
                a = to_torch(a).double()
                b = b.detach().cpu().double()
                if a.shape != b.shape:
                    return False, f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
                if not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
                    return False, f"max abs diff {(a - b).abs().max().item():.3g}"
            return True, ""
        return check

    def topk_check(o, r):  # values must match; indices must point at those values
        ok, why = close(0, 0)(o.values, r.values)
        return ok, why

    big_iters = 5 if quick else 20
    print(f"{'op':46s} {'ours ms':>9s} {'torch ms':>9s} {'x torch':>8s} {'GB/s':>7s} {'%copy':>6s}")

    # ---- large reductions: last dim, middle dim, all
    x, t = both((16384, 4096), np.float32, None, randn)  # 256 MiB
    nb = x.nbytes
    bench("sum fp32 (16384,4096) dim=-1", nb, lambda: x.sum(-1), lambda: t.sum(-1),
          close(1e-4, 1e-3), big_iters)
    bench("amax fp32 (16384,4096) dim=-1", nb, lambda: x.amax(-1), lambda: t.amax(-1),
          close(0, 0), big_iters)
    bench("sum fp32 (16384,4096) dim=0", nb, lambda: x.sum(0), lambda: t.sum(0),
          close(1e-4, 1e-2), big_iters)
    bench("sum fp32 67M all", nb, lambda: x.sum(), lambda: t.sum(), close(1e-4, 1e-1), big_iters)
    if not quick:
        bench("argmax fp32 (16384,4096) dim=-1", nb, lambda: x.argmax(-1), lambda: t.argmax(-1),
              close(0, 0), big_iters)
        bench("var fp32 (16384,4096) dim=-1 (2 reads)", 2 * nb, lambda: x.var(-1),
              lambda: t.var(-1), close(1e-3, 1e-4), big_iters)
        bench("logsumexp fp32 (16384,4096) dim=-1 (2 reads)", 2 * nb, lambda: x.logsumexp(-1),
              lambda: t.logsumexp(-1), close(1e-4, 1e-4), big_iters)
    del x, t
    x, t = both((64, 1024, 1024), np.float32, None, randn)
    bench("sum fp32 (64,1024,1024) dim=1", x.nbytes, lambda: x.sum(1), lambda: t.sum(1),
          close(1e-4, 1e-3), big_iters)
    bench("amax fp32 (64,1024,1024) dim=1", x.nbytes, lambda: x.amax(1), lambda: t.amax(1),
          close(0, 0), big_iters)
    del x, t
    x, t = both((32768, 4096), "bf16", None, randn)
    bench("sum bf16 (32768,4096) dim=-1", x.nbytes, lambda: x.sum(-1), lambda: t.sum(-1),
          close(1e-2, 1e-1), big_iters)
    bench("sum bf16 (32768,4096) dim=0", x.nbytes, lambda: x.sum(0), lambda: t.sum(0),
          close(1e-2, 1), big_iters)
    del x, t

    # ---- small shapes: per-call cost
    small_iters = 200 if quick else 1000
    for shape, dim in [((4, 4096), -1), ((1, 32000), -1), ((32, 128), 0), ((8, 128256), -1)]:
        x, t = both(shape, np.float32, None, randn)
        bench(f"sum fp32 {shape} dim={dim}", 0, lambda: x.sum(dim), lambda: t.sum(dim),
              close(1e-4, 1e-3), small_iters)
    x, t = both((8, 4096), np.float32, None, randn)
    bench("amax fp32 (8,4096) dim=-1", 0, lambda: x.amax(-1), lambda: t.amax(-1), close(0, 0),
          small_iters)
    bench("argmax fp32 (8,4096) dim=-1", 0, lambda: x.argmax(-1), lambda: t.argmax(-1),
          close(0, 0), small_iters)

    # ---- sampling shapes: sort / topk / cumsum
    si = 20 if quick else 100
    for shape, k in [((1, 32000), 50), ((1, 128256), 50), ((32, 128256), 50), ((128, 32000), 100)]:
        x, t = both(shape, np.float32, None, randn)
        bench(f"topk fp32 {shape} k={k}", 0, lambda: x.topk(k), lambda: t.topk(k), topk_check, si)
    for shape in [(1, 32000), (1, 128256), (32, 32000)]:
        x, t = both(shape, np.float32, None, randn)
        bench(f"sort desc fp32 {shape}", 0, lambda: nbx.sort(x, -1, descending=True),
              lambda: torch.sort(t, -1, descending=True, stable=True), close(0, 0), si)
    for shape in [(1, 128256), (32, 128256)]:
        x, t = both(shape, np.float32, None, randn)
        bench(f"cumsum fp32 {shape}", 0, lambda: x.cumsum(-1), lambda: t.cumsum(-1),
              close(1e-4, 1e-2), si)
    x, t = both((32, 128256), "bf16", None, randn)
    bench("topk bf16 (32,128256) k=50", 0, lambda: x.topk(50), lambda: t.topk(50), topk_check, si)

    if tune:
        _tune(nbx, both, randn, timeit, rows, quick)

    path = os.path.join(outdir, "bench_reduction.json")
    with open(path, "w") as f:
        json.dump({"copy_bw": COPY_BW, "rows": rows}, f, indent=1)
    print(f"wrote {path}")


def _tune(nbx, both, randn, timeit, rows, quick):
    from nbxtensor.kernels import reduction as R
    cfg = R.CONFIG["cuda"]
    saved = dict(cfg)
    x, _ = both((16384, 4096), np.float32, None, randn)
    y, _ = both((64, 1024, 1024), np.float32, None, randn)
    print("tune: row kernel (sum dim=-1 of (16384,4096) fp32)")
    for br in (512, 1024, 2048, 4096):
        for tile in (br, 2 * br):
            cfg.update(row_block_r=br, row_tile=tile)
            R._plan.cache_clear()
            try:
                s = timeit(lambda: x.sum(-1), 10)
                print(f"  row_block_r={br} row_tile={tile}: {x.nbytes / s / 1e9:.0f} GB/s")
                rows.append({"tune": "row", "row_block_r": br, "row_tile": tile,
                             "gbps": x.nbytes / s / 1e9})
            except Exception as e:
                print(f"  row_block_r={br}: {e}")
    cfg.clear(), cfg.update(saved)
    R._plan.cache_clear()
    print("tune: col kernel (sum dim=1 of (64,1024,1024) fp32)")
    for bk in (64, 128, 256, 512):
        for tile in (2048, 4096, 8192):
            cfg.update(col_block_k=bk, col_tile=tile)
            R._plan.cache_clear()
            try:
                s = timeit(lambda: y.sum(1), 10)
                print(f"  col_block_k={bk} col_tile={tile}: {y.nbytes / s / 1e9:.0f} GB/s")
                rows.append({"tune": "col", "col_block_k": bk, "col_tile": tile,
                             "gbps": y.nbytes / s / 1e9})
            except Exception as e:
                print(f"  col_block_k={bk}: {e}")
    cfg.clear(), cfg.update(saved)
    R._plan.cache_clear()
    from nbxtensor.kernels import sort as S
    scfg = S.CONFIG["cuda"]
    ssaved = dict(scfg)
    for shape in ((1, 128256), (32, 32000)):
        z, _ = both(shape, np.float32, None, randn)
        print(f"tune: sort desc {shape}")
        for tile in (1024, 2048, 4096, 8192, 16384):
            scfg.update(sort_tile=tile)
            try:
                s = timeit(lambda: nbx.sort(z, -1, descending=True), 20)
                print(f"  sort_tile={tile}: {s * 1e3:.4f} ms")
                rows.append({"tune": "sort", "shape": list(shape), "sort_tile": tile, "ms": s * 1e3})
            except Exception as e:
                print(f"  sort_tile={tile}: {type(e).__name__}: {e}")
        scfg.clear(), scfg.update(ssaved)
        print(f"tune: topk k=50 {shape}")
        for chunk in (1024, 2048, 4096, 8192):
            scfg.update(topk_chunk=chunk)
            try:
                s = timeit(lambda: z.topk(50), 20)
                print(f"  topk_chunk={chunk}: {s * 1e3:.4f} ms")
                rows.append({"tune": "topk", "shape": list(shape), "topk_chunk": chunk,
                             "ms": s * 1e3})
            except Exception as e:
                print(f"  topk_chunk={chunk}: {type(e).__name__}: {e}")
        scfg.clear(), scfg.update(ssaved)


def _fmt(r):
    if "error" in r:
        return f"{r['name']:46s} ERROR {r['error'][:80]}"
    s = f"{r['name']:46s} {r['ours_ms']:9.4f} {r['torch_ms']:9.4f} {r['speed_vs_torch']:8.2f}"
    if "gbps" in r:
        s += f" {r['gbps']:7.0f} {r['pct_copy_bw']:5.0f}%"
    if not r.get("correct", True):
        s += f"  WRONG ({r.get('why')})"
    return s


if __name__ == "__main__":
    main()
