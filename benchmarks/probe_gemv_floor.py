"""Probe (H200): where a small dependent decode GEMV's time goes -- the shipped 576 x 576 GEMV
chain against a minimal GEMV kernel with the same tiles, and that kernel with one feature of
the shipped one switched on at a time (issue 5; BENCHMARKS.md, Session 6, runs 53, 57, 67).

    PYTHONPATH=src python3 benchmarks/probe_gemv_floor.py [OUTDIR]

Each row is a CUDA graph of C GEMVs over R weight copies rotated past L2 (sweep_gemv_chain's
plan), each GEMV's input the previous one's output, PDL on, us per GEMV (median of 5 runs).
The minimal kernel: one program per 8 (or 4) weight rows, the whole K = 576 row in one
1024-wide tile loaded before the PDL wait, then x, the product, a row sum and the store.
Switches:
  XPRE     x read before the wait from a fixed copy (not a valid GEMV: what the dependent x
           read costs)
  NOLOADW  no weight loads at all (tiles made from the row index): the chain's floor for a
           kernel of this shape
  MAX      a row max instead of the sum (same reduction cost, other arithmetic)
  G2D      the shipped 2-D grid (row axis 1)
  I64      the shipped int64 row offsets (rows clamped with tl.where, unmasked loads)
  ACC      the shipped fp32 accumulator tile (zeros, then +=)
  XROW     the shipped x row pointer (x + m * stride, m the x row's program id)
This is a measurement, not a kernel of the package; the valid rows (no XPRE / NOLOADW /
MAX) compute the same chain and are checked against the shipped one's output (max |d| /
max |ref| <= 2e-2, sweep_gemv_chain's bound).
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
from _common import out_dir  # noqa: E402
import sweep_gemv_chain as S  # noqa: E402

K = N = 576
SWITCHES = ("XPRE", "NOLOADW", "MAX", "G2D", "I64", "ACC", "XROW")
CASES = [(bn, flags) for bn in (8, 4) for flags in
         ("", "XPRE", "NOLOADW XPRE", "MAX", "G2D", "I64", "ACC", "XROW", "G2D I64 ACC XROW")]


@triton.jit
def _gemv_probe(x, w, o, xs, K, N, s_x, BN: tl.constexpr, BK: tl.constexpr,
                XPRE: tl.constexpr, NOLOADW: tl.constexpr, MAX: tl.constexpr,
                G2D: tl.constexpr, I64: tl.constexpr, ACC: tl.constexpr, XROW: tl.constexpr):
    if G2D:
        pid = tl.program_id(1)
    else:
        pid = tl.program_id(0)
    offs_n = pid * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    km = offs_k < K
    if NOLOADW:
        wt = (offs_n[:, None] + offs_k[None, :]).to(tl.bfloat16)
    elif I64:
        rows = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
        wt = tl.load(w + rows[:, None] * K + offs_k[None, :], mask=km[None, :], other=0.0)
    else:
        wt = tl.load(w + offs_n[:, None] * K + offs_k[None, :],
                     mask=km[None, :] & (offs_n < N)[:, None], other=0.0)
    if XPRE:
        xv = tl.load(xs + offs_k, mask=km, other=0.0)
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    if not XPRE:
        if XROW:    # the x row: grid axis 0 with G2D (as shipped), else axis 1 (always 0)
            if G2D:
                m = tl.program_id(0).to(tl.int64)
            else:
                m = tl.program_id(1).to(tl.int64)
            xv = tl.load(x + m * s_x + offs_k, mask=km, other=0.0)
        else:
            xv = tl.load(x + offs_k, mask=km, other=0.0)
    p = wt.to(tl.float32) * xv.to(tl.float32)[None, :]
    if ACC:
        acc = tl.zeros((BN, BK), dtype=tl.float32)
        acc += p
        p = acc
    if MAX:
        y = tl.max(p, axis=1)
    else:
        y = tl.sum(p, axis=1)
    tl.store(o + offs_n, y.to(tl.bfloat16), mask=offs_n < N)


def main():
    import nbxtensor as nbx
    from nbxtensor.backends.launch import launch
    from nbxtensor.models import _ops as O
    R, C, _ = S.plan(K, N)
    rng = np.random.default_rng(0)
    w0 = nbx.tensor(S.bf16_host(rng, (N, K), 1.0 / K ** 0.5), device="cuda")
    ws = [w0] + [w0.clone() for _ in range(R - 1)]
    x = nbx.tensor(S.bf16_host(rng, (1, K), 1.0), device="cuda")
    xs = x.clone()

    def chain(op):
        g = nbx.cuda.CUDAGraph()
        with nbx.cuda.graph(g):
            h = x
            for i in range(C):
                h = op(h, ws[i % R])
        us = S.time_graph(g.replay, nbx.cuda.Event, nbx.cuda.synchronize, 20) * 1e3 / C
        g.replay()
        nbx.cuda.synchronize()
        return us, h.to(nbx.float32).numpy().astype(np.float64)

    rows = []
    us, ref = chain(lambda h, w: O.decode_linear(h, w))
    rows.append(dict(case="shipped fused_linear", us=us))
    for bn, flags in CASES:
        f = {k: k in flags.split() for k in SWITCHES}

        def op(h, w, bn=bn, f=f):
            out = nbx.empty((1, N), dtype=nbx.bfloat16, device="cuda")
            grid = (1, triton.cdiv(N, bn)) if f["G2D"] else (triton.cdiv(N, bn),)
            launch(_gemv_probe, grid, h, w, out, xs, K, N, K, BN=bn, BK=1024, num_warps=4,
                   launch_pdl=True, **f)
            return out
        name = f"minimal BN {bn}" + (f" [{flags}]" if flags else "")
        try:
            us, got = chain(op)
            valid = not (f["XPRE"] or f["NOLOADW"] or f["MAX"])
            rel = float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))
            rows.append(dict(case=name, us=us, rel_diff=rel if valid else None))
        except Exception as e:  # noqa: BLE001 - one failing case does not stop the probe
            rows.append(dict(case=name, error=f"{type(e).__name__}: {e}"[:300]))
        print("  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in rows[-1].items()), flush=True)
    od = out_dir()
    os.makedirs(od, exist_ok=True)
    with open(os.path.join(od, "probe_gemv_floor.json"), "w") as fh:
        json.dump(dict(K=K, N=N, R=R, C=C, rows=rows), fh, indent=1)
    print(f"\n== {C} dependent {K} x {N} bf16 GEMVs in a graph (PDL): us per GEMV")
    for r in rows:
        tail = r.get("error") or (f"{r['us']:.3f}" + ("" if r.get("rel_diff") is None
                                                       else f"  rel diff {r['rel_diff']:.1e}"))
        print(f"  {r['case']:40} {tail}")
    # the valid rows compute the same chain (sums in another order): the sweep's 2e-2 bound
    bad = [r for r in rows if "error" in r or (r.get("rel_diff") or 0.0) > 2e-2]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
