"""Probe (H200): C dependent decode GEMVs in ONE persistent kernel against the shipped chain of
one PDL kernel a GEMV -- whether removing the kernel boundaries would close the small GEMVs'
gap to the copy rate (issue 5; BENCHMARKS.md, Session 6, run 65).

    PYTHONPATH=src python3 benchmarks/probe_persistent_gemv.py [OUTDIR]

Square bf16 shapes (576, 1024, 2048), M = 1, y_{j+1} = W_j y_j over R weight copies rotated
past L2 (sweep_gemv_chain.plan). The persistent kernel runs every step in one cooperative
launch: each program keeps BN rows, loads its next weight tile before it waits, waits for the
step's counter to reach the program count (an acquire load), reads the previous output
vector from L2, stores its rows and bumps the next counter (release, after a CTA barrier).
The shipped chain is `ops.decode.decode_linear` captured C times in a graph (PDL on). Both
results are compared bit for bit (same tiles, same fp32 sums for K <= BK; the 2048 row
differs in the order of its sums, so its relative difference is printed). Timing: CUDA
events, best of 3 runs of 4 launches (persistent) / median of 5 (graph), us per GEMV.
This is a measurement, not a kernel of the package: run 65 found it slower at every shape
(576: 1.92 vs 1.26 us), so the kernel boundary with PDL is the cheaper hand-off here.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)
import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from _common import event_times_ms, out_dir  # noqa: E402
import sweep_gemv_chain as S  # noqa: E402

CASES = [(576, 4, 1024, 4), (576, 8, 1024, 4), (1024, 8, 1024, 4), (2048, 16, 2048, 8)]


@triton.jit
def _chain_kernel(ws, ys, cnt, N, K, R, C, NPROG, BN: tl.constexpr, BK: tl.constexpr):
    # ws (R, N, K) weights, ys (C + 1, N) outputs (ys[0] = x), cnt (C,) zeroed counters;
    # K <= BK (one tile a row)
    pid = tl.program_id(0)
    rows = pid * BN + tl.arange(0, BN)
    rmask = rows < N
    offs_k = tl.arange(0, BK)
    kmask = offs_k < K
    wofs = rows[:, None] * K + offs_k[None, :]
    wm = rmask[:, None] & kmask[None, :]
    w = tl.load(ws + wofs, mask=wm, other=0.0)
    for j in range(C):
        if j > 0:   # every program has stored its rows of step j - 1
            seen = tl.atomic_add(cnt + j - 1, 0, sem="acquire", scope="gpu")
            while seen < NPROG:
                seen = tl.atomic_add(cnt + j - 1, 0, sem="acquire", scope="gpu")
        xv = tl.load(ys + j * N + offs_k, mask=kmask, other=0.0, cache_modifier=".cg")
        w_next = tl.load(ws + ((j + 1) % R).to(tl.int64) * N * K + wofs, mask=wm, other=0.0)
        y = tl.sum(w.to(tl.float32) * xv.to(tl.float32)[None, :], axis=1)
        tl.store(ys + (j + 1) * N + rows, y.to(tl.bfloat16), mask=rmask)
        tl.debug_barrier()      # every thread's stores are issued before the release
        tl.atomic_add(cnt + j, 1, sem="release", scope="gpu")
        w = w_next


def run_case(K, BN, BK, nw):
    import nbxtensor as nbx
    from nbxtensor.backends.launch import launch
    from nbxtensor.models import _ops as O
    N = K
    R, C, wbytes = S.plan(K, N)
    rng = np.random.default_rng(K)
    w0 = nbx.tensor(S.bf16_host(rng, (N, K), 1.0 / K ** 0.5), device="cuda")
    ws = nbx.empty((R, N, K), dtype=nbx.bfloat16, device="cuda")
    for r in range(R):
        ws[r].copy_(w0)
    x = nbx.tensor(S.bf16_host(rng, (1, K), 1.0), device="cuda")
    g = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g):
        h = x
        for i in range(C):
            h = O.decode_linear(h, ws[i % R])
    shipped = S.time_graph(g.replay, nbx.cuda.Event, nbx.cuda.synchronize, 20) * 1e3 / C
    g.replay()
    nbx.cuda.synchronize()
    ref = h.to(nbx.float32).numpy()[0].astype(np.float64)
    nprog = triton.cdiv(N, BN)
    reps = 12
    ys = nbx.empty((C + 1, N), dtype=nbx.bfloat16, device="cuda")
    ys[0].copy_(x[0])
    cnt = nbx.zeros((reps + 1, C), dtype=nbx.int32, device="cuda")

    def one(r):
        launch(_chain_kernel, (nprog,), ws, ys, cnt[r], N, K, R, C, nprog, BN=BN, BK=BK,
               num_warps=nw, launch_cooperative_grid=True)
    one(reps)
    nbx.cuda.synchronize()
    got = ys[C].to(nbx.float32).numpy().astype(np.float64)
    rel = float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))
    runs = iter(range(reps))
    pers = min(event_times_ms(lambda: one(next(runs)), 4, nbx.cuda.Event, repeats=3)) * 1e3 / C
    row = dict(K=K, N=N, C=C, R=R, BN=BN, BK=BK, num_warps=nw, programs=nprog,
               shipped_us=shipped, persistent_us=pers, rel_diff=rel,
               persistent_frac_copy=wbytes / S.COPY_BPS / (pers * 1e-6))
    print("  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)
    return row


def main():
    rows = []
    for case in CASES:
        try:
            rows.append(run_case(*case))
        except Exception as e:  # noqa: BLE001 - one failing case does not stop the probe
            rows.append(dict(case=case, error=f"{type(e).__name__}: {e}"[:300]))
            print(f"{case}: {rows[-1]['error']}", flush=True)
    od = out_dir()
    os.makedirs(od, exist_ok=True)
    with open(os.path.join(od, "probe_persistent_gemv.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\n== C dependent GEMVs (bf16, M = 1): us per GEMV")
    print(f"{'K = N':>6} {'BN':>3} {'BK':>5} {'warps':>5} {'shipped':>8} {'persistent':>10} "
          f"{'rel diff':>8}")
    for r in rows:
        if "error" not in r:
            print(f"{r['K']:>6} {r['BN']:>3} {r['BK']:>5} {r['num_warps']:>5} "
                  f"{r['shipped_us']:8.3f} {r['persistent_us']:10.3f} {r['rel_diff']:8.1e}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
