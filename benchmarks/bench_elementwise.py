"""Element-wise ops and casts: nbxtensor vs torch on the GPU (H200), with copy bandwidth.

    PYTHONPATH=src python3 benchmarks/bench_elementwise.py [--quick] [OUTDIR]

Measures, in one run: a device-to-device copy (torch's and ours), large contiguous
unary and binary ops (>= 256 MiB per tensor), broadcast and transposed operands, casts,
and the per-call cost of a small add. Each row is checked against torch's result before
it is timed. Prints a table (ms, GB/s moved (reads + writes), % of the copy bandwidth
measured in this run, torch/ours speed ratio) and writes bench_elementwise.json to
OUTDIR (or $OUT). Timing: GPU time (calls queued behind a sleep kernel), CUDA events (nbx.cuda.Event, else torch.cuda.Event) on the
legacy default stream, which both libraries launch on.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cuda_event_class, event_best_ms, out_dir  # noqa: E402

GOALS = {"contig": 0.90, "bcast": 0.75, "transposed": 0.75, "cast": 0.90}


def main():
    quick = "--quick" in sys.argv
    outdir = out_dir()
    os.makedirs(outdir, exist_ok=True)

    import torch
    import nbxtensor as nbx

    dev = torch.device("cuda")
    Event, event_kind = cuda_event_class()

    def timeit(fn, iters, warmup=2, gpu=True):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        # GPU time only: a sleep kernel queued first (both libraries launch on the legacy
        # default stream) lets the host enqueue every call before the GPU reaches them,
        # so neither side's Python/launch cost of the first call counts (~100 us/call)
        cycles = int(min(2e9 * (iters * 100e-6 + 2e-4), 1e9))
        sleep = (lambda: torch.cuda._sleep(cycles)) if gpu and hasattr(torch.cuda, "_sleep") \
            else None
        return event_best_ms(fn, iters, Event, before=sleep)  # ms

    rng = np.random.default_rng(0)

    def pair(shape, dt):
        """The same random data as an nbx cuda tensor and a torch cuda tensor."""
        a = rng.standard_normal(shape, dtype=np.float32)
        t = torch.from_numpy(a).to(dev)
        x = nbx.tensor(a, device="cuda")
        if dt != "float32":
            t = t.to(getattr(torch, dt))
            x = x.to(getattr(nbx, dt))
        return x, t

    def to_np(y):
        if isinstance(y, torch.Tensor):
            y = y.float() if y.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float16) else y
            return y.cpu().numpy().astype(np.float64)
        return np.asarray(y.numpy()).astype(np.float64)

    def close(a, b, rtol):
        a, b = to_np(a).reshape(-1), to_np(b).reshape(-1)
        if a.shape != b.shape:
            return False, f"shape {a.shape} vs {b.shape}"
        step = max(1, a.size // 2_000_000)          # a strided sample of big outputs
        a, b = a[::step], b[::step]
        bad = ~np.isclose(a, b, rtol=rtol, atol=rtol, equal_nan=True)
        if bad.any():
            i = np.flatnonzero(bad)[:4]
            return False, f"{bad.sum()} differ, e.g. ours {a[i]} torch {b[i]}"
        return True, ""

    rows = []
    copy_bw = [None]

    def bench(name, kind, nbytes, ours, ref, rtol, iters):
        row = {"name": name, "kind": kind, "bytes": nbytes}
        try:
            ok, why = close(ours(), ref(), rtol)
            row["correct"] = ok
            if not ok:
                row["why"] = why
            row["ours_ms"] = timeit(ours, iters, gpu=kind != "small")   # small: per call
            row["torch_ms"] = timeit(ref, iters, gpu=kind != "small")
            row["ours_GBps"] = nbytes / row["ours_ms"] / 1e6
            row["torch_GBps"] = nbytes / row["torch_ms"] / 1e6
            row["torch_over_ours"] = row["torch_ms"] / row["ours_ms"]
            if copy_bw[0]:
                row["pct_copy_bw"] = row["ours_GBps"] * 1e9 / copy_bw[0]
                goal = GOALS.get(kind)
                if goal is not None:
                    row["goal"] = goal
                    row["meets_goal"] = row["pct_copy_bw"] >= goal and row["torch_over_ours"] >= (
                        0.95 if kind == "contig" else 0.0)
        except Exception as e:  # keep going: one broken row must not hide the rest
            row["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        rows.append(row)
        pct = f"{100 * row['pct_copy_bw']:.0f}%" if "pct_copy_bw" in row else "-"
        print(f"{name:38s} {row.get('ours_ms', float('nan')):9.4f} "
              f"{row.get('torch_ms', float('nan')):9.4f} {row.get('ours_GBps', 0):8.0f} "
              f"{row.get('torch_GBps', 0):8.0f} {pct:>6s} {row.get('torch_over_ours', 0):6.2f} "
              f"{'ok' if row.get('correct') else row.get('why', row.get('error', '?'))[:60]}",
              flush=True)
        return row

    print(f"timing with {event_kind}; {torch.cuda.get_device_name()}")
    print(f"{'op':38s} {'ours ms':>9s} {'torch ms':>9s} {'ours GB/s':>8s} {'torch GB/s':>8s} "
          f"{'%copy':>6s} {'t/ours':>6s}")
    N = 64 * 2**20                      # 64 Mi fp32 = 256 MiB per tensor
    iters = 5 if quick else 20
    x32, t32 = pair((N,), "float32")
    y32, u32 = pair((N,), "float32")
    o32 = nbx.empty((N,), device="cuda")
    p32 = torch.empty((N,), device=dev)

    # --- copy bandwidth (torch's measures the machine; ours is Tensor.copy_)
    r = bench("copy f32 256MiB (torch = machine)", "copy", 2 * 4 * N,
              lambda: o32.copy_(x32), lambda: p32.copy_(t32), 0, iters)
    if "torch_ms" in r:
        copy_bw[0] = 2 * 4 * N / (r["torch_ms"] * 1e-3)
        r["pct_copy_bw"] = r["ours_GBps"] * 1e9 / copy_bw[0]
        print(f"  copy bandwidth this run: {copy_bw[0] / 1e12:.2f} TB/s (issue's figure 4.19)")

    # --- contiguous unary / binary, fp32
    unary = [("neg", nbx.neg, torch.neg), ("exp", nbx.exp, torch.exp), ("relu", nbx.relu, torch.relu),
             ("sigmoid", nbx.sigmoid, torch.sigmoid), ("gelu", nbx.gelu, torch.nn.functional.gelu),
             ("silu", nbx.silu, torch.nn.functional.silu)]
    if quick:
        unary = unary[:2]
    for name, f, g in unary:
        bench(f"{name} f32 256MiB", "contig", 2 * 4 * N, lambda f=f: f(x32), lambda g=g: g(t32),
              2e-5, iters)
    binary = [("add", lambda a, b: a + b), ("mul", lambda a, b: a * b)]
    for name, f in binary:
        bench(f"{name} f32 256MiB", "contig", 3 * 4 * N, lambda f=f: f(x32, y32),
              lambda f=f: f(t32, u32), 1e-6, iters)
    bench("add out= f32 256MiB", "contig", 3 * 4 * N, lambda: nbx.add(x32, y32, out=o32),
          lambda: torch.add(t32, u32, out=p32), 1e-6, iters)
    bench("mul scalar f32 256MiB", "contig", 2 * 4 * N, lambda: x32 * 0.5, lambda: t32 * 0.5,
          1e-6, iters)
    if not quick:
        bench("addcmul f32 256MiB", "contig", 4 * 4 * N, lambda: nbx.addcmul(x32, y32, x32, value=0.5),
              lambda: torch.addcmul(t32, u32, t32, value=0.5), 1e-5, iters)
        bench("where f32 256MiB", "contig", (3 * 4 + 1) * N,
              lambda: nbx.where(x32 > 0, x32, y32), lambda: torch.where(t32 > 0, t32, u32), 0, iters)

    # --- bf16 (2x the elements for the same bytes)
    xb, tb = pair((2 * N,), "bfloat16")
    yb, ub = pair((2 * N,), "bfloat16")
    bench("add bf16 256MiB", "contig", 3 * 2 * 2 * N, lambda: xb + yb, lambda: tb + ub, 1e-2, iters)
    if not quick:
        bench("silu bf16 256MiB", "contig", 2 * 2 * 2 * N, lambda: nbx.silu(xb),
              lambda: torch.nn.functional.silu(tb), 1e-2, iters)
        bench("gelu(tanh) bf16 256MiB", "contig", 2 * 2 * 2 * N,
              lambda: nbx.gelu(xb, approximate="tanh"),
              lambda: torch.nn.functional.gelu(tb, approximate="tanh"), 1e-2, iters)
    del xb, tb, yb, ub

    # --- broadcast and transposed operands (8192 x 8192 fp32 = 256 MiB)
    M = 8192
    X, TX = x32.view(M, M), t32.view(M, M)
    Y, TY = y32.view(M, M), u32.view(M, M)
    rowv, trow = pair((M,), "float32")
    colv, tcol = pair((M, 1), "float32")
    bench("add row-broadcast [M,M]+[M]", "bcast", 2 * 4 * M * M, lambda: X + rowv,
          lambda: TX + trow, 1e-6, iters)
    bench("add col-broadcast [M,M]+[M,1]", "bcast", 2 * 4 * M * M, lambda: X + colv,
          lambda: TX + tcol, 1e-6, iters)
    bench("add transposed [M,M]+[M,M].T", "transposed", 3 * 4 * M * M, lambda: X + Y.T,
          lambda: TX + TY.T, 1e-6, iters)
    bench("contiguous() of [M,M].T", "transposed", 2 * 4 * M * M, lambda: X.T.contiguous(),
          lambda: TX.T.contiguous(), 0, iters)
    if not quick:
        bench("exp of [M,M][:, ::2] (strided)", "transposed", 2 * 4 * M * M // 2,
              lambda: nbx.exp(X[:, ::2]), lambda: torch.exp(TX[:, ::2]), 2e-5, iters)

    # --- casts
    casts = [("float32", "bfloat16"), ("bfloat16", "float32"), ("float32", "float16"),
             ("float32", "float8_e4m3fn"), ("float16", "float32")]
    if quick:
        casts = casts[:2]
    for s, d in casts:
        xs, ts = (x32, t32) if s == "float32" else (x32.to(getattr(nbx, s)), t32.to(getattr(torch, s)))
        isz = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}
        nb = N * (isz[s] + isz[d])
        bench(f"cast {s}->{d} 64Mi elts", "cast", nb, lambda xs=xs, d=d: xs.to(getattr(nbx, d)),
              lambda ts=ts, d=d: ts.to(getattr(torch, d)), 0.07 if "float8" in d else 1e-2, iters)

    # --- small shapes: per-call cost
    for n in (4096, 1 << 20):
        xs, ts = pair((n,), "float32")
        ys, us = pair((n,), "float32")
        bench(f"add f32 n={n} (per call)", "small", 3 * 4 * n, lambda: xs + ys, lambda: ts + us,
              1e-6, 200 if quick else 1000)

    # --- contiguous-kernel configuration sweep (--sweep-flat): BLOCK x num_warps of the flat
    # kernel on the 256 MiB f32 rows, through its rule's constants (FLAT_BYTES a thread of
    # the narrowest operand, FLAT_WARPS; BLOCK = FLAT_BYTES / 4 * 32 * FLAT_WARPS for f32)
    if "--sweep-flat" in sys.argv:
        from nbxtensor.kernels import elementwise as ke
        print("flat-kernel sweep (ms; torch: neg %.4f copy %.4f add %.4f)" % (
            timeit(lambda: torch.neg(t32), iters), timeit(lambda: t32.clone(), iters),
            timeit(lambda: t32 + u32, iters)))
        saved = ke.FLAT_BYTES, ke.FLAT_WARPS
        for blk, w in [(1024, 4), (2048, 4), (2048, 8), (4096, 4), (4096, 8), (8192, 8),
                       (8192, 16), (16384, 16)]:
            ke.FLAT_BYTES, ke.FLAT_WARPS = blk * 4 // (32 * w), w
            ke._PLANS.clear()
            try:
                r = [timeit(lambda: nbx.neg(x32), iters), timeit(lambda: x32.clone(), iters),
                     timeit(lambda: x32 + y32, iters)]
                print(f"  BLOCK={blk:6d} warps={w:2d}  neg {r[0]:.4f}  copy {r[1]:.4f}  add {r[2]:.4f}")
                rows.append({"name": f"sweep-flat BLOCK={blk} warps={w}", "kind": "sweep",
                             "neg_ms": r[0], "copy_ms": r[1], "add_ms": r[2]})
            except Exception as e:
                print(f"  BLOCK={blk} warps={w}: {type(e).__name__}: {e}")
        ke.FLAT_BYTES, ke.FLAT_WARPS = saved
        ke._PLANS.clear()

    summary = {"copy_bw_Bps": copy_bw[0], "event": event_kind, "quick": quick,
               "device": torch.cuda.get_device_name(), "rows": rows}
    bad = [r["name"] for r in rows if r.get("correct") is False or "error" in r]
    summary["failures"] = bad
    path = os.path.join(outdir, "bench_elementwise.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"wrote {path}; {len(bad)} incorrect/failed rows: {bad}")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"total {time.time() - t0:.1f} s")
