"""Reductions, scans, sort and topk: nbxtensor vs torch on the GPU (H200).

    PYTHONPATH=src python3 benchmarks/bench_reduction.py [--quick] [--tune | --tune-only] [OUTDIR]
    PYTHONPATH=src python3 benchmarks/bench_reduction.py --quick --sort-sweep2 [OUTDIR]
    PYTHONPATH=src python3 benchmarks/bench_reduction.py --quick --sort-sweep2 --gluon-only [OUTDIR]

Prints a table and writes bench_reduction.json to OUTDIR (or $OUT). Each row is checked
against torch's result before it is timed. Two times per op, both from CUDA events:
  ms       GPU time per call: the calls are queued behind a torch.cuda._sleep kernel, so the
           host's Python/launch cost is hidden (kernel efficiency; GB/s and %copy use it);
  wall ms  per call with nothing queued: includes the host cost when it exceeds the kernel.
x torch = torch time / ours (> 1: we are faster); %copy is of the 4.19 TB/s copy bandwidth.
--tune-only sweeps small candidate sets of the reduction / topk / sort / scan knobs (no
table) and prints the winners as dicts to paste into the CONFIGs; --groups=row,col,split
or --groups=topk,topk-threshold,sort,scan runs a subset (--tune: the table, then the sweep).
"""
from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import compile_in_pool, event_best_ms, gpu_time_behind_sleep, out_dir  # noqa: E402

COPY_BW = 4.19e12  # measured device-to-device copy on this H200, bytes/s (read + write)


def main():
    quick = "--quick" in sys.argv
    tune = "--tune" in sys.argv or "--tune-only" in sys.argv
    tune_only = "--tune-only" in sys.argv
    outdir = out_dir()
    os.makedirs(outdir, exist_ok=True)

    import torch
    import nbxtensor as nbx

    dev = torch.device("cuda")

    def sync():
        torch.cuda.synchronize()

    def timeit(fn, iters, warmup=3):
        """Seconds per call, CUDA events around `iters` calls (best of 3); includes the
        Python/launch cost when that is longer than the kernel."""
        for _ in range(warmup):
            fn()
        sync()
        return event_best_ms(fn, iters, torch.cuda.Event) / 1e3

    def gputime(fn, iters, wall):
        """Kernel time only (calls queued behind a sleep kernel); `wall` when the op
        synchronises with the host."""
        return gpu_time_behind_sleep(fn, iters, wall, fallback=wall)

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
        return torch.from_numpy(np.array(a))  # np.array keeps 0-dim

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
            w_ours = timeit(ours, iters)
            w_ref = timeit(ref, iters)
            t_ours = gputime(ours, iters, w_ours)
            t_ref = gputime(ref, iters, w_ref)
            # *_ms: GPU time (launches queued); *_wall_ms: per call incl. host cost
            row.update(ours_ms=t_ours * 1e3, torch_ms=t_ref * 1e3, speed_vs_torch=t_ref / t_ours,
                       ours_wall_ms=w_ours * 1e3, torch_wall_ms=w_ref * 1e3,
                       wall_speed_vs_torch=w_ref / w_ours)
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

    if "--sort-sweep2" in sys.argv:
        _sort_sweep2(nbx, torch, both, randn, timeit, gputime, rows, quick)
        with open(os.path.join(outdir, "bench_reduction_sortsweep.json"), "w") as f:
            json.dump({"rows": rows}, f, indent=1)
        return
    if tune_only:
        _tune(nbx, both, randn, timeit, gputime, rows)
        with open(os.path.join(outdir, "bench_reduction_tune.json"), "w") as f:
            json.dump({"rows": rows}, f, indent=1)
        return
    big_iters = 5 if quick else 20
    print(f"{'op':46s} {'ours ms':>9s} {'torch ms':>9s} {'x torch':>8s} {'wall ms':>9s} "
          f"{'torch wall':>10s} {'x wall':>7s} {'GB/s':>7s} {'%copy':>6s}")
    print("(ms = GPU time with launches queued; wall = per call incl. Python/launch cost)")

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
    for shape in [(1, 32000), (1, 128256), (32, 32000), (4, 128256), (128, 4096)]:
        x, t = both(shape, np.float32, None, randn)
        bench(f"sort desc fp32 {shape}", 0, lambda: nbx.sort(x, -1, descending=True),
              lambda: torch.sort(t, dim=-1, descending=True, stable=True), close(0, 0), si)
    for shape in [(1, 128256), (32, 128256)]:
        x, t = both(shape, np.float32, None, randn)
        bench(f"cumsum fp32 {shape}", 0, lambda: x.cumsum(-1), lambda: t.cumsum(-1),
              close(1e-4, 1e-2), si)
    x, t = both((32, 128256), "bf16", None, randn)
    bench("topk bf16 (32,128256) k=50", 0, lambda: x.topk(50), lambda: t.topk(50), topk_check, si)

    if tune:
        _tune(nbx, both, randn, timeit, gputime, rows)

    path = os.path.join(outdir, "bench_reduction.json")
    with open(path, "w") as f:
        json.dump({"copy_bw": COPY_BW, "rows": rows}, f, indent=1)
    print(f"wrote {path}")


COLSUM_KEYS = ("col_block_k", "col_tile", "col_warps")
COLSUM_CANDS = [(256, 8192, 8), (32, 4096, 4)]


def colsum_jobs():
    """precompile jobs (call, set_override) of the kernels `colsum_probe` launches."""
    import nbxtensor as nbx
    from nbxtensor.kernels import reduction as R
    cfg = R.CONFIG["cuda"]
    shipped = tuple(cfg[k] for k in COLSUM_KEYS)
    x = nbx.empty((16384, 4096), dtype=nbx.float32, device="cuda")
    y = nbx.empty((64, 1024, 1024), dtype=nbx.float32, device="cuda")
    xb = nbx.empty((32768, 4096), dtype=nbx.bfloat16, device="cuda")

    def setter(cand):
        def set_():
            cfg.update(zip(COLSUM_KEYS, cand))
            R._plan.cache_clear()
        return set_
    jobs = [(lambda: x.sum(0), setter(c)) for c in [shipped] + COLSUM_CANDS]
    jobs += [(lambda: y.sum(1), setter(c)) for c in [shipped] + COLSUM_CANDS]
    jobs.append((lambda: xb.sum(0), setter(shipped)))
    return jobs


def colsum_probe(deadline=None):
    """A short look for a shared GPU call (~3 s): sum over dim 0 of f32 (16384, 4096), over
    dim 1 of f32 (64, 1024, 1024) and over dim 0 of bf16 (32768, 4096) against torch, the f32
    cases under a few column tiles of
    kernels/reduction.py CONFIG (col_block_k, col_tile, col_warps; the first is the
    shipped one); stops starting cases after `deadline` (time.time())."""
    import time

    import torch
    import nbxtensor as nbx
    from nbxtensor.kernels import reduction as R
    from _common import time_gpu
    cfg = R.CONFIG["cuda"]
    shipped = tuple(cfg[k] for k in COLSUM_KEYS)
    keys = COLSUM_KEYS
    for shape, dim in (((16384, 4096), 0), ((64, 1024, 1024), 1)):
        t = torch.randn(*shape, device="cuda")
        x = nbx.from_dlpack(t)
        t_t = time_gpu(lambda: t.sum(dim), 5, repeats=2)
        ref = t.sum(dim)
        for cand in [shipped] + COLSUM_CANDS:
            if deadline is not None and time.time() > deadline:
                print("colsum probe: deadline")
                break
            cfg.update(zip(keys, cand))
            R._plan.cache_clear()
            try:
                err = (torch.from_dlpack(x.sum(dim)) - ref).abs().max().item()
                tn = time_gpu(lambda: x.sum(dim), 5, repeats=2)
                print(f"  sum f32 {shape} dim={dim} {cand}: {tn * 1e6:7.1f} us "
                      f"{t.numel() * 4 / tn / 1e9:6.0f} GB/s  {t_t / tn:5.2f}x torch "
                      f"(torch {t_t * 1e6:.1f} us)  err {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"  colsum {cand}: {type(e).__name__}: {str(e)[:100]}")
        cfg.update(zip(keys, shipped))
        R._plan.cache_clear()
    cfg.update(zip(keys, shipped))
    R._plan.cache_clear()
    tb = torch.randn(32768, 4096, device="cuda", dtype=torch.bfloat16)
    xb = nbx.from_dlpack(tb)
    t_t = time_gpu(lambda: tb.sum(0), 5, repeats=2)
    tn = time_gpu(lambda: xb.sum(0), 5, repeats=2)
    print(f"  sum bf16 (32768,4096) dim=0 shipped: {tn * 1e6:7.1f} us  {t_t / tn:5.2f}x torch",
          flush=True)


def _tune(nbx, both, randn, timeit, gputime, rows):
    """Small sweeps (one GPU call, ~2-3 min incl. compiles): each knob group is scored by
    the geometric mean of kernel times over the shapes it drives; prints ready-to-paste
    CONFIG dicts at the end."""
    from nbxtensor.kernels import reduction as R
    from nbxtensor.kernels import sort as S
    groups = [a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--groups=")]
    groups = set(groups[0]) if groups else None  # e.g. --groups=row,col,split

    def gmean_ms(cases):
        out = []
        for fn in cases:
            w = timeit(fn, 10, warmup=2)
            out.append(gputime(fn, 10, w))
        return float(np.exp(np.mean(np.log(out)))) * 1e3

    def arrays(r):
        r = r if isinstance(r, tuple) else (r,)
        return [np.asarray(a.float().numpy() if a.dtype is nbx.bfloat16 else a.numpy(),
                           dtype=np.float64) for a in r]

    def same(a, b):
        return all(x.shape == y.shape and np.allclose(x, y, rtol=1e-4, atol=1e-3, equal_nan=True)
                   for x, y in zip(a, b))

    def sweep(group, cfg, clear, knobs, cands, cases):
        if groups and group not in groups:
            return
        print(f"tune: {group} {knobs}")
        refs = [arrays(fn()) for fn in cases]  # under the config before this sweep
        best, best_ms = None, float("inf")
        for cand in cands:
            cfg.update(dict(zip(knobs, cand)))
            clear()
            try:
                if not all(same(arrays(fn()), r) for fn, r in zip(cases, refs)):
                    print(f"  {cand}: WRONG result, skipped")
                    continue
                ms = gmean_ms(cases)
            except Exception as e:  # a candidate that fails to compile/launch is skipped
                print(f"  {cand}: {type(e).__name__}: {str(e)[:100]}")
                continue
            print(f"  {cand}: {ms:.4f} ms (geomean)", flush=True)
            rows.append({"tune": group, **dict(zip(knobs, cand)), "ms": ms})
            if ms < best_ms:
                best, best_ms = cand, ms
        if best is not None:
            cfg.update(dict(zip(knobs, best)))
            clear()
            print(f"  -> {dict(zip(knobs, best))}")

    cfg = R.CONFIG["cuda"]
    clear = R._plan.cache_clear
    x, _ = both((16384, 4096), np.float32, None, randn)      # 256 MiB
    xb, _ = both((32768, 4096), "bf16", None, randn)          # 256 MiB
    y, _ = both((64, 1024, 1024), np.float32, None, randn)   # 256 MiB
    # (row_block_r, row_tile, row_warps)
    sweep("row", cfg, clear, ("row_block_r", "row_tile", "row_warps"),
          [(2048, 4096, 8), (4096, 4096, 4), (4096, 8192, 8), (2048, 8192, 8), (4096, 16384, 16)],
          [lambda: x.sum(-1), lambda: xb.sum(-1)])
    # (col_block_k, col_tile, col_warps)
    sweep("col", cfg, clear, ("col_block_k", "col_tile", "col_warps"),
          [(256, 8192, 8), (128, 4096, 8), (128, 4096, 4), (64, 4096, 4), (64, 2048, 2),
           (128, 8192, 8), (256, 8192, 4), (512, 8192, 8), (256, 16384, 16), (128, 2048, 4)],
          [lambda: x.sum(0), lambda: y.sum(1)])   # fp32 (16-bit columns: CONFIG16)
    sweep("split", cfg, clear, ("target_programs_per_sm", "split_min_steps"),
          [(8, 2), (4, 4), (4, 2), (8, 4), (16, 2), (32, 2)],
          [lambda: x.sum(), lambda: x.sum(0), lambda: y.sum(1)])
    del x, xb, y

    scfg = S.CONFIG["cuda"]
    tk = [both(s, np.float32, None, randn)[0] for s in ((1, 128256), (32, 128256), (128, 32000), (1, 32000))]
    tcases = [lambda: tk[0].topk(50), lambda: tk[1].topk(50), lambda: tk[2].topk(100),
              lambda: tk[3].topk(50), lambda: tkb.topk(50)]
    tkb = tk[1].to(nbx.bfloat16)
    on = scfg["filt_min_n"]
    # candidate rounds (threshold path off); 2 programs a SM is the shipped first-round rule,
    # topk_programs 1 (a fixed count) the one before it
    sms = nbx.cuda.get_device_properties(0)["multiprocessors"]
    scfg["filt_min_n"] = 1 << 40
    sweep("topk", scfg, lambda: None, ("topk_chunk", "topk_programs", "topk_ept"),
          [(4096, 1, 16), (4096, sms * 2, 16), (2048, sms * 2, 16), (8192, sms * 2, 16),
           (4096, sms * 2, 32)],
          tcases)
    # threshold path (first candidate: off, i.e. the winner above)
    sweep("topk-threshold", scfg, lambda: None, ("filt_min_n", "filt_chunk", "filt_ratio"),
          [(1 << 40, 1024, 2), (on, 1024, 2), (on, 1024, 4), (on, 256, 2), (on, 4096, 1)],
          tcases)
    sweep("sort", scfg, lambda: None, ("sort_tile",), [(1024,), (2048,), (4096,)],
          [lambda: nbx.sort(tk[0], -1, descending=True), lambda: nbx.sort(tk[3], -1, descending=True)])
    sc = R.SCAN_CONFIG["cuda"]
    sweep("scan", sc, lambda: None, ("chunk",), [(1024,), (2048,), (4096,)],
          [lambda: tk[0].cumsum(-1), lambda: tk[3].cumsum(-1)])

    print("\n# paste into src/nbxtensor/kernels/reduction.py CONFIG['cuda']:")
    print(repr({k: cfg[k] for k in sorted(cfg)}))
    print("# paste into src/nbxtensor/kernels/reduction.py SCAN_CONFIG['cuda']:")
    print(repr({k: sc[k] for k in sorted(sc)}))
    print("# paste into src/nbxtensor/kernels/sort.py CONFIG['cuda']:")
    print(repr({k: scfg[k] for k in sorted(scfg)}))


# --sort-sweep2: candidates for kernels/sort.py: "default" (the shipped CONFIG) and (tile,
# fan-in, max runs of the last level, keys a program, NARROW) tuples of the "ml" path, each
# timed on every shape with CONFIG ml_small = ml_big = the tuple (so the rows x tiles rule
# does not pick); the winners are printed per regime. SORT_CANDS='[[1024, 2, 2, 256, 1]]'
# (JSON) replaces the list.
SORT_SHAPES = [(1, 32000), (1, 128256), (4, 128256), (32, 32000), (128, 4096), (1, 1048576),
               (64, 2048), (512, 1024), (4, 4096)]
SORT_SMALL = [(1, 32000), (1, 128256)]   # rows x 1024-key tiles < 132 SMs: CONFIG ml_small
SORT_CANDS = ["default",
              # few-rows candidates (latency: few levels)
              (1024, 8, 32, 256, 0), (1024, 8, 32, 256, 1), (1024, 8, 32, 128, 0),
              (1024, 4, 16, 256, 0), (1024, 4, 16, 256, 1), (1024, 16, 16, 256, 1),
              (1024, 4, 8, 256, 0), (512, 8, 32, 256, 1), (2048, 4, 16, 256, 1),
              # many-rows candidates (work: narrow levels, (fan-in - 1) searches a key)
              (1024, 2, 2, 256, 0), (1024, 2, 2, 256, 1), (1024, 2, 2, 512, 0),
              (1024, 4, 4, 256, 0), (1024, 4, 4, 256, 1), (1024, 2, 4, 256, 1),
              (512, 2, 2, 256, 1), (2048, 2, 2, 256, 1), (4096, 2, 2, 256, 0),
              (256, 4, 4, 256, 1), (512, 4, 16, 256, 1)]
# session 5: the Gluon block sort (kernels/sort_gluon.py). ("gluon", R, warps, S): rows of
# <= 8192 keys one program a row (CONFIG block_sort_max_n = 8192, block_sort_rws = (R, warps,
# S); S = bitonic steps a shared-memory round); longer rows are not timed for it (the rule does
# not apply). ("gluon-ml", R, warps, S, tile): the "ml" path with the Gluon tile sort (ml_gluon
# = (R, warps, S)) and both regimes' tile = `tile` (block_sort_max_n = 0), on every shape.
# `--gluon-only`: "default" + these only, on every shape (~55-75 s on the H200); the plain
# --sort-sweep2 keeps session 4's candidates (the new shapes: "default" only).
# The ("gluon", ...) variants are kernels/sort_gluon.py SWEEP (tests/ops/test_sort_gluon.py compiles
# each for sm_90).
from nbxtensor.kernels.sort_gluon import SWEEP as _GLUON_SWEEP  # noqa: E402

GLUON_CANDS = [("gluon",) + v for v in _GLUON_SWEEP] + [
    ("gluon-ml", 8, 4, 2, 1024), ("gluon-ml", 8, 8, 2, 2048), ("gluon-ml", 8, 8, 2, 4096),
    ("gluon-ml", 16, 8, 3, 4096)]
# the rows added in session 5: the plain sweep times only "default" there (time budget)
SORT_NEW_SHAPES = [(64, 2048), (512, 1024), (4, 4096)]
if "--gluon-only" in sys.argv:
    SORT_CANDS = ["default"] + GLUON_CANDS
if os.environ.get("SORT_CANDS"):
    SORT_CANDS = [c if isinstance(c, str) else tuple(c) for c in json.loads(os.environ["SORT_CANDS"])]


def _gluon_kind(cand):
    return cand[0] if isinstance(cand, tuple) and cand and isinstance(cand[0], str) else None


def _sort_set(S, cand):
    cfg = S.CONFIG["cuda"]
    if cand == "default":       # the shipped CONFIG (its rows x tiles rule included)
        return
    if _gluon_kind(cand) == "gluon":
        cfg.update(block_sort_min_n=1, block_sort_max_n=8192, block_sort_rws=tuple(cand[1:4]))
    elif _gluon_kind(cand) == "gluon-ml":
        t = cand[4]
        cfg.update(block_sort_max_n=0, ml_gluon=tuple(cand[1:4]),
                   ml_small=(t,) + tuple(cfg["ml_small"][1:]),
                   ml_big=(t,) + tuple(cfg["ml_big"][1:]))
    else:
        cfg.update(ml_small=tuple(cand), ml_big=tuple(cand))


def _sort_precompile(nbx, S, calls):
    """Run every (candidate, call) once with kernels.sort's launch replaced by a recorder
    (nothing runs on the GPU), then compile the recorded kernels in a spawn process pool so
    the timed loop reads Triton's on-disk cache. Best effort."""
    from nbxtensor.backends.cuda import launcher as L
    from nbxtensor.kernels import sort_gluon as SG
    jobs = {}
    real, real_g = S.launch, SG.launch

    def rec(kernel, grid, *args, **kwargs):
        sig, cx, attrs, opts, _ = L.bind(kernel, args, kwargs)
        cc = L._device_info(0)[0]
        jobs[repr((kernel.fn.__name__, sig, cx, attrs, opts, cc))] = (
            kernel.fn.__module__, kernel.fn.__name__, sig, cx, attrs, opts, cc)
    S.launch = SG.launch = rec
    saved = dict(S.CONFIG["cuda"])
    try:
        for cand in SORT_CANDS:
            _sort_set(S, cand)
            for fn in calls:
                try:
                    fn()
                except Exception as e:  # noqa: BLE001
                    print(f"  precompile {cand}: {type(e).__name__}: {str(e)[:80]}")
    finally:
        S.launch, SG.launch = real, real_g
        S.CONFIG["cuda"].clear()
        S.CONFIG["cuda"].update(saved)
    compile_in_pool(jobs.values(), "precompiled")



def _sort_sweep2(nbx, torch, both, randn, timeit, gputime, rows, quick):
    """torch and every SORT_CANDS entry on SORT_SHAPES (f32, descending, stable): GPU time
    (queued behind a sleep), checked equal to torch (values and indices) first."""
    from nbxtensor.kernels import sort as S
    data = {}
    for shape in SORT_SHAPES:
        data[shape] = both(shape, np.float32, None, randn)
    # a tie-heavy copy of every shape: candidates must also keep torch's stable tie order
    ties = {}
    for shape, (x, t) in data.items():
        tt_ = (t * 4).round() / 4
        ties[shape] = (nbx.tensor(tt_.cpu().numpy(), device="cuda"), tt_)
    calls = [(lambda x=x: nbx.sort(x, -1, descending=True)) for x, _ in data.values()]
    _sort_precompile(nbx, S, calls)
    saved = dict(S.CONFIG["cuda"])
    iters = 10 if quick else 30
    table = {}
    for shape, (x, t) in data.items():
        ref = torch.sort(t, dim=-1, descending=True, stable=True)
        fn = lambda t=t: torch.sort(t, dim=-1, descending=True, stable=True)  # noqa: E731
        w = timeit(fn, iters)
        tt = gputime(fn, iters, w)
        rv, ri = ref.values.cpu().numpy(), ref.indices.cpu().numpy()
        print(f"sort desc f32 {shape}: torch {tt * 1e6:8.1f} us", flush=True)
        rows.append({"sort_sweep2": str(shape), "cand": "torch", "us": tt * 1e6})
        table[(shape, "torch")] = tt
        xt, tt_ref = ties[shape]
        tref = torch.sort(tt_ref, dim=-1, descending=True, stable=True)
        tv, ti = tref.values.cpu().numpy(), tref.indices.cpu().numpy()
        for cand in SORT_CANDS:
            if _gluon_kind(cand) == "gluon" and shape[1] > 8192:
                continue        # the one-program-a-row rule does not take these rows
            if shape in SORT_NEW_SHAPES and not (cand == "default" or _gluon_kind(cand)):
                continue
            _sort_set(S, cand)
            row = {"sort_sweep2": str(shape), "cand": str(cand)}
            try:
                r = nbx.sort(x, -1, descending=True)
                ok = (np.array_equal(r.indices.numpy(), ri)
                      and np.array_equal(r.values.numpy(), rv, equal_nan=True))
                r = nbx.sort(xt, -1, descending=True)
                ok = ok and (np.array_equal(r.indices.numpy(), ti)
                             and np.array_equal(r.values.numpy(), tv, equal_nan=True))
                f2 = lambda x=x: nbx.sort(x, -1, descending=True)  # noqa: E731
                w2 = timeit(f2, iters)
                t2 = gputime(f2, iters, w2)
                row.update(us=t2 * 1e6, wall_us=w2 * 1e6, x_torch=tt / t2, correct=ok)
                if ok:
                    table[(shape, str(cand))] = t2
                print(f"  {str(cand):24s} {t2 * 1e6:8.1f} us  {tt / t2:5.2f}x torch  wall "
                      f"{w2 * 1e6:7.1f} us{'' if ok else '  WRONG'}", flush=True)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                print(f"  {str(cand):24s} ERROR {row['error'][:100]}", flush=True)
            rows.append(row)
            S.CONFIG["cuda"].clear()
            S.CONFIG["cuda"].update(saved)
    for name, shapes in (("ml_small", SORT_SMALL),
                         ("ml_big", [s for s in SORT_SHAPES
                                     if s not in SORT_SMALL and s not in SORT_NEW_SHAPES])):
        best = None
        for cand in SORT_CANDS:
            ts = [table.get((s, str(cand))) for s in shapes]
            if isinstance(cand, str) or _gluon_kind(cand) or None in ts:
                continue
            g = float(np.exp(np.mean(np.log(ts))))
            if best is None or g < best[1]:
                best = (cand, g)
        if best:
            print(f"# {name}: best {best[0]} (geomean {best[1] * 1e6:.1f} us over {shapes}); "
                  f"kernels/sort.py CONFIG['cuda'][{name!r}] = {tuple(best[0])}")
            rows.append({"sort_sweep2_best": name, "cand": str(best[0]), "geomean_us": best[1] * 1e6})
    _gluon_report(table, rows)


def _gluon_report(table, rows):
    """The Gluon candidates against "default" and torch: the best ("gluon", R, warps) by its
    worst x torch over the short rows (the >= 0.8x goal), the rows it should take, and the best
    ("gluon-ml", ...) by geomean time / default over the long rows; lines to paste."""
    short = [s for s in SORT_SHAPES if s[1] <= 8192]
    long_ = [s for s in SORT_SHAPES if s[1] > 8192]
    ok = lambda c, ss: all((s, str(c)) in table for s in ss)  # noqa: E731
    best = None
    for c in SORT_CANDS:
        if _gluon_kind(c) == "gluon" and ok(c, short):
            worst = min(table[(s, "torch")] / table[(s, str(c))] for s in short)
            g = float(np.exp(np.mean([np.log(table[(s, str(c))]) for s in short])))
            print(f"# gluon {c}: worst {worst:.2f}x torch, geomean {g * 1e6:.1f} us over {short}")
            if best is None or worst > best[1]:
                best = (c, worst)
    if best is not None and ok("default", short):
        c = best[0]
        print(f"# gluon: best {c} (worst {best[1]:.2f}x torch); per shape torch / default / "
              f"gluon us (x torch):")
        wins = []
        for s in sorted(short, key=lambda s: s[1]):
            tt, td, tg = (table[(s, k)] for k in ("torch", "default", str(c)))
            wins.append((s[1], tg < td))
            print(f"#   {s}: {tt * 1e6:.1f} / {td * 1e6:.1f} ({tt / td:.2f}x) / {tg * 1e6:.1f} "
                  f"({tt / tg:.2f}x)")
        # the longest run of swept row lengths on which it wins every shape -> [min_n, max_n]
        lens = sorted({n for n, _ in wins})
        won = [all(w for m, w in wins if m == n) for n in lens]
        for n in lens:
            if len({w for m, w in wins if m == n}) > 1:
                print(f"# gluon note: at N={n} it wins on some shapes and loses on others "
                      f"(see the table): the paste line below leaves N={n} out")
        best_run, run = (0, 0), None
        for i, w in enumerate(won + [False]):
            if w and run is None:
                run = i
            elif not w and run is not None:
                if i - run >= best_run[1] - best_run[0]:
                    best_run = (run, i)
                run = None
        if best_run[1] > best_run[0]:
            min_n = 1 if best_run[0] == 0 else lens[best_run[0] - 1] + 1
            max_n = lens[best_run[1] - 1]
        else:
            min_n, max_n = 1, 0
        print(f"# gluon paste: kernels/sort.py CONFIG['cuda'] block_sort_min_n={min_n}, "
              f"block_sort_max_n={max_n}, block_sort_rws={tuple(c[1:4])}   (max_n 0 = it loses; "
              f"lengths above {lens[-1]} are not swept)")
        rows.append({"sort_sweep2_best": "gluon", "cand": str(c), "worst_x_torch": best[1],
                     "block_sort_min_n": min_n, "block_sort_max_n": max_n})
    bestml = None
    for c in SORT_CANDS:
        if _gluon_kind(c) == "gluon-ml" and ok(c, long_) and ok("default", long_):
            rel = [table[(s, str(c))] / table[(s, "default")] for s in long_]
            g = float(np.exp(np.mean(np.log(rel))))
            print(f"# gluon-ml {c}: time / default geomean {g:.3f} over {long_}; per shape "
                  + " ".join(f"{r:.2f}" for r in rel))
            if bestml is None or g < bestml[1]:
                bestml = (c, g)
    if bestml is not None:
        c, g = bestml
        line = (f"ml_gluon={tuple(c[1:4])} with tile {c[4]} in ml_small/ml_big" if g < 1
                else "ml_gluon=0 (keep: no gluon-ml candidate beats default)")
        print(f"# gluon-ml: best {c} ({g:.3f} x default's time); paste: {line}")
        rows.append({"sort_sweep2_best": "gluon-ml", "cand": str(c), "rel_default": g})


def _fmt(r):
    if "error" in r:
        return f"{r['name']:46s} ERROR {r['error'][:80]}"
    s = (f"{r['name']:46s} {r['ours_ms']:9.4f} {r['torch_ms']:9.4f} {r['speed_vs_torch']:8.2f} "
         f"{r['ours_wall_ms']:9.4f} {r['torch_wall_ms']:10.4f} {r['wall_speed_vs_torch']:7.2f}")
    if "gbps" in r:
        s += f" {r['gbps']:7.0f} {r['pct_copy_bw']:5.0f}%"
    if not r.get("correct", True):
        s += f"  WRONG ({r.get('why')})"
    return s


if __name__ == "__main__":
    main()
