"""Matrix products on the H200, side by side with torch (cuBLAS) in the same run.

    PYTHONPATH=src python3 benchmarks/bench_matmul.py [--quick] [--sweep | --sweep-only] [OUTDIR]
    PYTHONPATH=src python3 benchmarks/bench_matmul.py --mm-sweep [OUTDIR]   (<= ~90 s)

--quick (~60-90 s on the H200) prints the issue's whole shape table -- bf16 4096^3 and
8192^3 (fp16 4096^3), the 1B-model linears at M in {1, 16, 128, 2048}, the odd sizes --
with fewer iterations and only three GEMV shapes.

Sections
  big      bf16 / fp16 matmul at 4096^3 and 8192^3: TFLOP/s of nbx and torch, ratio
           (goal >= 0.90 of torch).
  model    linear layers of a 1B model (2048->2048, 2048->512, 2048->8192, 8192->2048,
           2048->128256) at M in {1, 16, 128, 2048}, bf16, plus odd sizes.
  gemv     decode GEMV (M = 1, bf16) at in 576..8192 x out 576..128256: achieved GB/s
           (weight + x + out bytes / time) vs a device-to-device copy measured in the same
           run (goal >= 0.80 of copy) and vs torch.
  sweep    (--sweep) a few tile configs at 4096^3 / 8192^3 bf16, to re-tune the rule in
           kernels/matmul.py `matmul_config`, and GEMV configs (kernels/gemv.py); for
           GEMV rows the table's "TF/s" column is TB/s and "ratio" is the fraction of copy.

  mmsweep  (--mm-sweep, alone) the big-product candidates MM_CANDIDATES (tiled kernel
           variants and the TMA kernel forced through config_override) at bf16/fp16 4096^3 and
           8192^3 against torch, compiled first in parallel processes; then GEMV launch
           variants (split-K or not, CUDA graph of rotated GEMVs, empty-kernel floor).
           JSON to OUTDIR/matmul_mmsweep.json.

Timing: CUDA events (torch.cuda.Event on the legacy default stream, which nbxtensor also
launches on). Kernel time, not Python time: a torch.cuda._sleep spin kernel is queued
first so the CPU can queue all iterations while the GPU is busy, then
[start event, N calls, end event]; median over repeats. Memory-bound cases flush L2
(a 256 MB write) before each timed batch and use fresh buffers in rotation where the
weight is smaller than L2. Each nbx result is compared with torch's (max relative error).
JSON to OUTDIR/matmul.json (default: $OUT, else the current directory); the table last.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))



# ------------------------------------------------------------------ --mm-sweep compile worker
# (defined before torch is imported: a child runs `bench_matmul.py --mm-precompile JSON`)
def _mm_apply(kind, cfg):
    """A context manager that makes nbx.matmul run candidate (kind, cfg)."""
    import contextlib
    from nbxtensor.kernels import matmul as km
    if kind == "tiled":
        return km.config_override(**cfg)
    if kind == "tma":
        return km.config_override(TMA=True, **cfg)
    return contextlib.nullcontext()


def _mm_precompile(n, jobs):
    """Worker (a child process, no torch): compile candidates through nbx's launcher
    without running them (autotune's dry_launches); Triton's on-disk cache then serves the
    timing process.
    The exact shape matters: divisibility of the int arguments is part of the key."""
    import nbxtensor as nbx
    from nbxtensor.autotune.screen import dry_launches
    done = []
    for dtype_name, (name, kind, cfg) in jobs:
        dt = getattr(nbx, dtype_name)
        try:
            a, b, out = (nbx.empty((n, n), dtype=dt, device="cuda") for _ in range(3))
            x, w, y = (nbx.empty(s, dtype=dt, device="cuda")
                       for s in ((1, 2048), (2048, 2048), (1, 2048)))
            if kind == "gemv":   # the decode GEMV variants of bench_gemv_launch
                import nbxtensor.kernels.gemv as kg
                kg._OVERRIDE = cfg
                with dry_launches():
                    nbx.linear(x, w, out=y)
                kg._OVERRIDE = None
                done.append(name)
                continue
            with dry_launches(), _mm_apply(kind, cfg):
                nbx.matmul(a, b, out=out)
            done.append(name)
        except Exception as e:  # reported by the timing pass too
            done.append(f"{name}: {type(e).__name__}: {e}"[:200])
    return done



if __name__ == "__main__" and "--mm-precompile" in sys.argv:
    _job = json.loads(sys.argv[sys.argv.index("--mm-precompile") + 1])
    print(json.dumps(_mm_precompile(_job["n"], _job["jobs"])))
    sys.exit(0)

import torch  # noqa: E402  (the reference only)

import nbxtensor as nbx  # noqa: E402
from _common import copy_bw, out_dir, recorder, time_gpu  # noqa: E402

QUICK = "--quick" in sys.argv
SWEEP_ONLY = "--sweep-only" in sys.argv   # only the sweeps (they take a few minutes)
SWEEP = "--sweep" in sys.argv or SWEEP_ONLY
MM_SWEEP = "--mm-sweep" in sys.argv   # big-product candidates only (bench_mm_sweep)
OUTDIR = out_dir()
DEV = "cuda"


def _facts():
    """The benchmarked GPU's facts (kernels/_common.device_facts), for the config rules."""
    from nbxtensor.kernels._common import device_facts
    return device_facts(nbx.device(DEV))
TORCH_DT = {nbx.bfloat16: torch.bfloat16, nbx.float16: torch.float16, nbx.float32: torch.float32}


def to_nbx(t: torch.Tensor):
    """A torch cuda tensor -> an nbx cuda tensor with the same values (through the host)."""
    t = t.contiguous().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        a = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        a = t.numpy()
    return nbx.tensor(a, device=DEV)


def to_np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.float().cpu().numpy().astype(np.float64)
    return x.numpy().astype(np.float64)


def rel_err(got, ref):
    if ref.numel() > (1 << 24) and ref.dim() == 2:   # big outputs: the first rows (host time)
        got, ref = got[:64], ref[:64]
    g, r = to_np(got), to_np(ref)
    return float(np.max(np.abs(g - r)) / max(np.max(np.abs(r)), 1e-30))


ROWS: list[dict] = []
record = recorder(ROWS)


def rotated_weights(rows, K, lo=1, hi=256):
    """(torch weights, the same as nbx tensors, count): enough bf16 [rows, K] copies (lo..hi)
    that cycling through them reads >= 128 MiB, so small weights come from HBM, not the
    50 MB L2 -- the steady state of a model step."""
    copies = max(lo, min(hi, -(-(128 << 20) // (2 * rows * K))))
    tws = [torch.randn(rows, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
           for _ in range(copies)]
    return tws, [to_nbx(t) for t in tws], copies


# ------------------------------------------------------------------ sections
def bench_big():
    for dt in (nbx.bfloat16, nbx.float16):
        for n in ([4096, 8192] if dt is nbx.bfloat16 or not QUICK else [4096]):
            tdt = TORCH_DT[dt]
            ta = torch.randn(n, n, device="cuda", dtype=tdt)
            tb = torch.randn(n, n, device="cuda", dtype=tdt)
            a, b = to_nbx(ta), to_nbx(tb)
            out = nbx.empty((n, n), dtype=dt, device=DEV)
            tout = torch.empty(n, n, device="cuda", dtype=tdt)
            inner = 5 if n == 4096 else 3
            t_nbx = time_gpu(lambda: nbx.matmul(a, b, out=out), inner)
            t_tor = time_gpu(lambda: torch.matmul(ta, tb, out=tout), inner)
            fl = 2.0 * n ** 3
            record(section="big", dtype=dt.name, M=n, N=n, K=n,
                   nbx_tflops=fl / t_nbx / 1e12, torch_tflops=fl / t_tor / 1e12,
                   ratio=t_tor / t_nbx, err=rel_err(out, tout))
            del ta, tb, a, b, out, tout


LINEARS = [(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048), (2048, 128256)]


def bench_model():
    Ms = [1, 16, 128, 2048]
    lins = LINEARS
    dt = nbx.bfloat16
    for K, N in lins:
        tw = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        w = to_nbx(tw)
        for M in Ms:
            tx = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            x = to_nbx(tx)
            out = nbx.empty((M, N), dtype=dt, device=DEV)
            inner = (10 if QUICK else 20) if M * N * K < 2 ** 33 else 3
            flush = M <= 16
            t_nbx = time_gpu(lambda: nbx.linear(x, w, out=out), inner, flush=flush)
            t_tor = time_gpu(lambda: torch.nn.functional.linear(tx, tw), inner, flush=flush)
            fl = 2.0 * M * N * K
            byts = 2.0 * (N * K + M * K + M * N)
            record(section="model", dtype=dt.name, M=M, N=N, K=K,
                   nbx_tflops=fl / t_nbx / 1e12, torch_tflops=fl / t_tor / 1e12,
                   nbx_gbs=byts / t_nbx / 1e9, ratio=t_tor / t_nbx, nbx_us=t_nbx * 1e6,
                   torch_us=t_tor * 1e6, err=rel_err(out, torch.nn.functional.linear(tx, tw)))
    # odd sizes: nothing a multiple of the tiles; 1000 = 8 * 125 (16-byte rows, not 16 elements),
    # 4093/4095 (unaligned rows: padded copies)
    odd = [(1000, 1000, 1000), (4097, 4095, 4093)]
    for M, N, K in odd:
        ta = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        tb = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        a, b = to_nbx(ta), to_nbx(tb)
        t_nbx = time_gpu(lambda: nbx.matmul(a, b), 5)
        t_tor = time_gpu(lambda: torch.matmul(ta, tb), 5)
        fl = 2.0 * M * N * K
        record(section="odd", dtype="bfloat16", M=M, N=N, K=K, nbx_tflops=fl / t_nbx / 1e12,
               torch_tflops=fl / t_tor / 1e12, ratio=t_tor / t_nbx,
               err=rel_err(nbx.matmul(a, b), torch.matmul(ta, tb)))
    # linear layout (weight [N, K], K-major) with odd K and N
    M, N, K = 2048, 2047, 2049
    tx = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    tw = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    x, w = to_nbx(tx), to_nbx(tw)
    t_nbx = time_gpu(lambda: nbx.linear(x, w), 5)
    t_tor = time_gpu(lambda: torch.nn.functional.linear(tx, tw), 5)
    fl = 2.0 * M * N * K
    record(section="odd", dtype="bfloat16", M=M, N=N, K=K, nbx_tflops=fl / t_nbx / 1e12,
           torch_tflops=fl / t_tor / 1e12, ratio=t_tor / t_nbx,
           err=rel_err(nbx.linear(x, w), torch.nn.functional.linear(tx, tw)))


def copy_bandwidth():
    n = 1 << 30   # 1 GiB
    bw = copy_bw(n)
    record(section="copy", bytes=n, gbs=bw)
    return bw


GEMVS = [(576, 576), (576, 1536), (2048, 2048), (2048, 512), (2048, 8192), (8192, 2048),
         (4096, 14336), (14336, 4096), (2048, 128256), (4096, 128256), (8192, 28672)]


def bench_gemv(copy_bw):
    shapes = [(2048, 2048), (4096, 14336), (2048, 128256)] if QUICK else GEMVS
    for K, N in shapes:
        wbytes = 2 * N * K
        tws, ws, n_copies = rotated_weights(N, K)
        tx = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        x = to_nbx(tx)
        out = nbx.empty((1, N), dtype=nbx.bfloat16, device=DEV)
        it = {"i": 0}

        def run_nbx():
            it["i"] = (it["i"] + 1) % n_copies
            nbx.linear(x, ws[it["i"]], out=out)

        def run_torch():
            it["i"] = (it["i"] + 1) % n_copies
            torch.nn.functional.linear(tx, tws[it["i"]])

        inner = max(n_copies, 5)
        t_nbx = time_gpu(run_nbx, inner, flush=True)
        t_tor = time_gpu(run_torch, inner, flush=True)
        byts = wbytes + 2 * K + 2 * N
        nbx.linear(x, ws[0], out=out)
        record(section="gemv", dtype="bfloat16", M=1, N=N, K=K, nbx_gbs=byts / t_nbx / 1e9,
               torch_gbs=byts / t_tor / 1e9, frac_copy=byts / t_nbx / 1e9 / copy_bw,
               ratio=t_tor / t_nbx, nbx_us=t_nbx * 1e6, torch_us=t_tor * 1e6,
               err=rel_err(out, torch.nn.functional.linear(tx, tws[0])))
        del tws, ws


def bench_sweep():
    from nbxtensor.kernels.matmul import config_override
    configs = [dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3),
               dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=4),
               dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3),
               dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
               dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3, GROUP_M=16),
               dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3,
                    PERSISTENT=True),
               dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3,
                    PERSISTENT=True, FLATTEN=True),
               dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=4,
                    PERSISTENT=True, FLATTEN=True),
               dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4,
                    PERSISTENT=True, FLATTEN=True, NUM_PROGS=264)]
    for n in (4096, 8192):
        ta = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        tb = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        a, b = to_nbx(ta), to_nbx(tb)
        out = nbx.empty((n, n), dtype=nbx.bfloat16, device=DEV)
        t_tor = time_gpu(lambda: torch.matmul(ta, tb), 3)
        for cfg in configs:
            try:
                with config_override(**cfg):
                    t = time_gpu(lambda: nbx.matmul(a, b, out=out), 3)
                record(section="sweep", M=n, cfg=" ".join(f"{k}={v}" for k, v in cfg.items()),
                       nbx_tflops=2.0 * n ** 3 / t / 1e12, ratio=t_tor / t)
            except Exception as e:  # a config that does not fit is a finding, not a crash
                record(section="sweep", M=n, cfg=str(cfg), error=f"{type(e).__name__}: {e}"[:200])


MEDIUM = [(128, 2048, 2048), (128, 8192, 2048), (128, 2048, 8192), (2048, 512, 2048),
          (2048, 2048, 2048), (2048, 8192, 2048), (128, 128256, 2048)]


def bench_medium_sweep():
    """Every 16-bit tile candidate of the rule (kernels/matmul.py _TILES_16), with its modelled
    best K split and without a split, at medium-M linear shapes: shows whether the rule's
    pick (marked *) is the measured best; recalibrate `_estimate` if it is not."""
    from nbxtensor import autotune
    from nbxtensor.kernels import matmul as km
    for M, N, K in MEDIUM:
        tx = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        tw = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        x, w = to_nbx(tx), to_nbx(tw)
        out = nbx.empty((M, N), dtype=nbx.bfloat16, device=DEV)
        t_tor = time_gpu(lambda: torch.nn.functional.linear(tx, tw), 10)
        rule = km.matmul_config(M, N, K, nbx.bfloat16, _facts())
        for bm, bn, bk, wp, st, eff in km._TILES_16:
            sp = km._best_split(M, N, K, bm, bn, bk, eff, 1, 2, _facts().sms)
            variants = {(1, wp), (sp, wp)} | ({(sp, 12 - wp)} if bm * bn <= 128 * 128 else set())
            for split, warps in sorted(variants):
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=st,
                           SPLIT=split)
                mark = "*" if ((bm, bn) == (rule["BLOCK_M"], rule["BLOCK_N"]) and split == sp
                               and warps == wp) else ""
                try:
                    with autotune.disabled(), km.config_override(**cfg):
                        t = time_gpu(lambda: nbx.linear(x, w, out=out), 10)
                    record(section="sweep", M=M,
                           cfg=f"{mark}{M}x{N}x{K} {bm}x{bn} w{warps} split={split} "
                           f"model={km._estimate(M, N, K, bm, bn, eff, split, 1, 2, _facts().sms) * 1e6:.1f}us "
                           f"got={t * 1e6:.1f}us torch={t_tor * 1e6:.1f}us",
                           nbx_tflops=2.0 * M * N * K / t / 1e12, ratio=t_tor / t)
                except Exception as e:
                    record(section="sweep", M=M, cfg=f"{M}x{N}x{K} {cfg}",
                           error=f"{type(e).__name__}: {e}"[:200])
        del tx, tw, x, w, out


def bench_gemv_sweep(copy_bw):
    """A few GEMV configs (kernels/gemv.py `_OVERRIDE`) at decode shapes, M = 1 and M = 16
    (for M = 16 also the tiled kernel with the rule's tile, "tiled"); ratio = fraction of
    the copy bandwidth (weight bytes / time)."""
    import nbxtensor.kernels.gemv as kg
    from nbxtensor.kernels import matmul as km
    configs = {1: [dict(), dict(BLOCK_N=16), dict(BLOCK_N=64), dict(BLOCK_K=128),
                   dict(num_warps=8), dict(BLOCK_N=64, num_warps=8), dict(TARGET=8 * 132),
                   dict(TARGET=2 * 132), dict(TARGET=1), dict(BLOCK_N=16, TARGET=1)],
               16: [dict(), dict(num_warps=4), dict(BLOCK_N=128), dict(BLOCK_N=32),
                    dict(TARGET=2 * 132), dict(TARGET=8 * 132), dict(BLOCK_K=128),
                    dict(TARGET=1), dict(BLOCK_N=32, TARGET=1), "tiled"]}
    # TARGET=1: no K split (one launch, no reduce) -- whether that wins for small weights
    for K, N in [(2048, 2048), (2048, 8192), (4096, 14336), (2048, 128256)]:
        _, ws, n_copies = rotated_weights(N, K)
        for M in (1, 16):
            x = to_nbx(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
            out = nbx.empty((M, N), dtype=nbx.bfloat16, device=DEV)
            it = {"i": 0}

            def run():
                it["i"] = (it["i"] + 1) % n_copies
                nbx.linear(x, ws[it["i"]], out=out)
            for cfg in configs[M]:
                old = kg._OVERRIDE
                try:
                    if cfg == "tiled":
                        with km.config_override(**km.matmul_config(M, N, K, nbx.bfloat16, _facts())):
                            t = time_gpu(run, max(n_copies, 5), flush=True)
                    else:
                        kg._OVERRIDE = cfg or None
                        t = time_gpu(run, max(n_copies, 5), flush=True)
                    gbs = (2 * N * K) / t / 1e9
                    record(section="sweep", M=M, cfg=f"gemv M={M} K={K} N={N} {cfg} {t * 1e6:.1f}us",
                           nbx_tflops=gbs / 1e3, ratio=gbs / copy_bw)
                except Exception as e:
                    record(section="sweep", M=M, cfg=f"gemv M={M} {cfg}",
                           error=f"{type(e).__name__}: {e}"[:200])
                finally:
                    kg._OVERRIDE = old
        del ws


# ------------------------------------------------------------------ --small-gemv (session 5)
# Small M = 1 linears: the rule splits K to fill 4 waves of SMs (two launches: partials +
# reduce); for small weights one launch may be as fast on the GPU and is half the host cost.
SMALL_GEMVS = [(1024, 256), (576, 576), (576, 1536), (1536, 576), (1024, 1024), (2048, 512),
               (2048, 2048), (2048, 8192)]


def bench_small_gemv():
    """Per (K, N), M = 1 bf16 linear: the rule vs always split vs never split -- GPU time per
    call over weights rotated past L2, and wall time per call back to back (host-bound) --
    and torch's, in the same run; each variant checked against torch first."""
    import nbxtensor.kernels.gemv as kg
    from nbxtensor.kernels._common import device_facts
    from _common import time_rotated
    for K, N in SMALL_GEMVS:
        tws, ws, copies = rotated_weights(N, K, lo=2)
        tx = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        x = to_nbx(tx)
        out = nbx.empty((1, N), dtype=nbx.bfloat16, device=DEV)
        ref = torch.nn.functional.linear(tx, tws[0])
        row = dict(section="small_gemv", K=K, N=N, MiB=2 * N * K / 2 ** 20)
        row["torch_gpu_us"] = time_rotated(lambda i: torch.nn.functional.linear(tx, tws[i]),
                                           copies, 4 * copies) * 1e3
        row["torch_wall_us"] = _wall(lambda: torch.nn.functional.linear(tx, tws[0])) * 1e6
        # NOSPLIT_ROW_BYTES: the shipped rule; 0 = split as TARGET says (session 4's rule);
        # huge = one launch always. It is part of gemv's plan key, so plans stay on (the
        # wall column is the real per-call cost)
        for name, nosplit in (("rule", kg.NOSPLIT_ROW_BYTES), ("split", 0), ("nosplit", 1 << 40)):
            old = kg.NOSPLIT_ROW_BYTES
            try:
                kg.NOSPLIT_ROW_BYTES = nosplit
                out.fill_(float("nan"))
                nbx.linear(x, ws[0], out=out)
                row[f"{name}_err"] = rel_err(out, ref)
                cfg = kg.gemv_config(1, N, K, nbx.bfloat16, device_facts(x.device), x.device)
                row[f"{name}_split"] = -(-K // cfg["K_SPLIT"])
                row[f"{name}_gpu_us"] = time_rotated(
                    lambda i: nbx.linear(x, ws[i], out=out), copies, 4 * copies) * 1e3
                row[f"{name}_wall_us"] = _wall(lambda: nbx.linear(x, ws[0], out=out)) * 1e6
            except Exception as e:  # noqa: BLE001
                row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:200]
            finally:
                kg.NOSPLIT_ROW_BYTES = old
        record(**row)
        del tws, ws
    print("small gemv M=1 bf16: K N slices(rule/split) | gpu us torch / rule / split / nosplit"
          " | wall us torch / rule / split / nosplit | max err")
    for r in ROWS:
        if r.get("section") == "small_gemv":
            g = lambda k: r.get(k, float("nan"))  # noqa: E731
            print(f"  {r['K']:5d} {r['N']:5d} {g('rule_split'):2.0f}/{g('split_split'):2.0f} | "
                  f"{r['torch_gpu_us']:6.2f} {g('rule_gpu_us'):6.2f} {g('split_gpu_us'):6.2f} "
                  f"{g('nosplit_gpu_us'):6.2f} | {r['torch_wall_us']:6.1f} {g('rule_wall_us'):6.1f} "
                  f"{g('split_wall_us'):6.1f} {g('nosplit_wall_us'):6.1f} | "
                  f"{max(g('rule_err'), g('split_err'), g('nosplit_err')):.1e}")


def _wall(fn, n=200):
    """Seconds per call of fn called back to back (the host's cost when it is the bottleneck)."""
    import statistics
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        nbx.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / n)
    return statistics.median(ts)


# ------------------------------------------------------------------ --m16-sweep (session 5)
# linear at M = 16 (batched decode): kernels/gemv.py's tl.dot path (x padded to 16 rows),
# 0.46-0.64x torch on the 1B linears in run 43. A grid of its configs (gemv._OVERRIDE: tile,
# warps, stages, TARGET programs -> the K split), the tiled matmul with its rule's tile, and
# the decode step's fused kernel (decode_fused.fused_gemv, the batch path) on the same shapes.
M16_SHAPES = [(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048), (2048, 128256)]
M16_CFGS = [dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st, TARGET=t)
            for bn in (32, 64, 128) for bk in (64, 128, 256) for w in (4, 8) for st in (3, 4)
            for t in (132, 264, 528) if bn * bk <= 16384]


def bench_m16_sweep():
    import nbxtensor.kernels.gemv as kg
    from nbxtensor.kernels import decode_fused as F
    from nbxtensor.kernels import matmul as km
    from _common import precompile, time_rotated
    M = 16
    jobs = []
    for K, N in M16_SHAPES:
        def call(K=K, N=N):
            w = nbx.empty((N, K), dtype=nbx.bfloat16, device=DEV)
            x = nbx.empty((M, K), dtype=nbx.bfloat16, device=DEV)
            nbx.linear(x, w)
        for c in M16_CFGS:
            jobs.append((call, lambda c=c: setattr(kg, "_OVERRIDE", c)))
    precompile(jobs, "m16 precompile", reset=lambda: setattr(kg, "_OVERRIDE", None))
    for K, N in M16_SHAPES:
        tws, ws, copies = rotated_weights(N, K, lo=2, hi=64)
        tx = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        x = to_nbx(tx)
        out = nbx.empty((M, N), dtype=nbx.bfloat16, device=DEV)
        ref = torch.nn.functional.linear(tx, tws[0])
        t_t = time_rotated(lambda i: torch.nn.functional.linear(tx, tws[i]), copies, 4 * copies)
        res = []

        def run(name, fn):
            try:
                out.fill_(float("nan"))
                fn(0)
                err = rel_err(out, ref)
                if not err < 2e-2:
                    record(section="m16", K=K, N=N, cfg=name, error=f"wrong: err {err:.2e}")
                    return
                t = time_rotated(fn, copies, 4 * copies)
                res.append((t, name))
                record(section="m16", K=K, N=N, cfg=name, us=t * 1e3, torch_us=t_t * 1e3,
                       ratio=t_t / t, err=err)
            except Exception as e:  # noqa: BLE001
                record(section="m16", K=K, N=N, cfg=name, error=f"{type(e).__name__}: {e}"[:160])
        run("rule", lambda i: nbx.linear(x, ws[i], out=out))
        for c in M16_CFGS:
            kg._OVERRIDE = c
            try:
                run(json.dumps({k: v for k, v in c.items() if k != "BLOCK_M"}),
                    lambda i: nbx.linear(x, ws[i], out=out))
            finally:
                kg._OVERRIDE = None
        with km.config_override(**km.matmul_config(M, N, K, nbx.bfloat16, _facts())):   # the tiled path
            run("tiled", lambda i: nbx.linear(x, ws[i], out=out))
        run("fused", lambda i: F.fused_gemv(x, ws[i], out=out))
        res.sort()
        print(f"m16 K={K} N={N}: torch {t_t * 1e3:.1f} us; "
              + "; ".join(f"{n} {t * 1e3:.1f} ({t_t / t:.2f}x)" for t, n in res[:4])
              + f"; rule {next((t * 1e3 for t, n in res if n == 'rule'), float('nan')):.1f}",
              flush=True)
        del tws, ws


# --m16-fused: the decode step's batch kernel (decode_fused._fused_gemvm_kernel, M > SMALL_M)
# over a grid of its configs (decode_fused._OVERRIDE) on the 1B decode projections as the step
# runs them (o: + residual, gate/up: norm + GLU, down: + residual, lm_head: norm), M = 16.
M16_FUSED = [("o+res", 2048, 2048, dict(residual=True)),
             ("gateup+norm+glu", 2048, 8192, dict(norm=True, glu=True)),
             ("down+res", 8192, 2048, dict(residual=True)),
             ("lm_head+norm", 2048, 128256, dict(norm=True))]
M16_FUSED_CFGS = [dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st)
                  for bn in (16, 32, 64) for bk in (64, 128, 256, 512) for w in (4, 8)
                  for st in (3, 4) if bn * bk <= 16384]


def bench_m16_fused():
    from nbxtensor.kernels import decode_fused as F
    from _common import precompile, time_rotated
    M = 16
    jobs = []
    for name, K, N, kw in M16_FUSED:
        def call(K=K, N=N, kw=kw):
            rows = 2 * N if kw.get("glu") else N
            w = nbx.empty((rows, K), dtype=nbx.bfloat16, device=DEV)
            x = nbx.empty((M, K), dtype=nbx.bfloat16, device=DEV)
            F.fused_gemv(x, w, glu=bool(kw.get("glu")),
                         norm_weight=x[0] if kw.get("norm") else None,
                         residual=nbx.empty((M, N), dtype=nbx.bfloat16, device=DEV)
                         if kw.get("residual") else None)
        for c in M16_FUSED_CFGS:
            jobs.append((call, lambda c=c: setattr(F, "_OVERRIDE", c)))
    precompile(jobs, "m16-fused precompile", reset=lambda: setattr(F, "_OVERRIDE", None))
    for name, K, N, kw in M16_FUSED:
        glu = bool(kw.get("glu"))
        rows = 2 * N if glu else N
        tws, ws, copies = rotated_weights(rows, K, lo=2, hi=64)
        tx = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        x = to_nbx(tx)
        tnw = (1 + 0.1 * torch.randn(K, device="cuda")).to(torch.bfloat16)
        tr = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        nw = to_nbx(tnw) if kw.get("norm") else None
        r = to_nbx(tr) if kw.get("residual") else None
        out = nbx.empty((M, N), dtype=nbx.bfloat16, device=DEV)
        h = tx.float()
        if kw.get("norm"):
            h = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6) * tnw.float()
        y = h @ tws[0].float().t()
        if glu:
            y = torch.nn.functional.silu(y[:, :N]) * y[:, N:]
        if r is not None:
            y = y + tr.float()
        ref = y

        def ours(i):
            F.fused_gemv(x, ws[i], norm_weight=nw, residual=r, glu=glu, out=out)

        def theirs(i):      # torch's own ops for the same projection (no fusion)
            hh = tx
            if kw.get("norm"):
                hh = torch.nn.functional.rms_norm(tx, (K,), tnw, 1e-6)
            yy = torch.nn.functional.linear(hh, tws[i])
            if glu:
                yy = torch.nn.functional.silu(yy[:, :N]) * yy[:, N:]
            if r is not None:
                yy = yy + tr
            return yy
        t_t = time_rotated(theirs, copies, 4 * copies)
        res = []
        for c in [None] + M16_FUSED_CFGS:
            label = "rule" if c is None else json.dumps({k: v for k, v in c.items()
                                                           if k != "BLOCK_M"})
            F._OVERRIDE = c
            try:
                out.fill_(float("nan"))
                ours(0)
                err = rel_err(out, ref.to(torch.bfloat16))
                if not err < 2e-2:
                    record(section="m16fused", name=name, cfg=label, error=f"wrong: {err:.2e}")
                    continue
                t = time_rotated(ours, copies, 4 * copies)
                res.append((t, label))
                record(section="m16fused", name=name, K=K, N=N, cfg=label, us=t * 1e3,
                       torch_us=t_t * 1e3, ratio=t_t / t, err=err)
            except Exception as e:  # noqa: BLE001
                record(section="m16fused", name=name, cfg=label,
                       error=f"{type(e).__name__}: {e}"[:160])
            finally:
                F._OVERRIDE = None
        res.sort()
        rule = next((t for t, n in res if n == "rule"), float("nan"))
        print(f"m16fused {name} K={K} N={N}: torch ops {t_t * 1e3:.1f} us; rule {rule * 1e3:.1f}; "
              + "; ".join(f"{n} {t * 1e3:.1f} ({t_t / t:.2f}x)" for t, n in res[:3]), flush=True)
        del tws, ws


# ------------------------------------------------------------------ --mm-sweep (session 4)
# Candidates for the big 16-bit products (name, kind, config). kind "rule": nbx.matmul as
# it runs by default; "tiled": config_override on the tiled kernel; "tma": the TMA kernel
# forced with the config (config_override(TMA=True, ...)).
_TMA = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, GROUP_M=8)
MM_CANDIDATES = [
    ("rule (the default)", "rule", None),
    ("tiled s3 (session 3's rule)", "tiled", dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64,
                                                   num_warps=8, num_stages=3)),
    ("tiled s4", "tiled", dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=4)),
    ("tiled s3 G16", "tiled", dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8,
                                   num_stages=3, GROUP_M=16)),
    ("tma pers s3", "tma", dict(_TMA, num_stages=3, PERSISTENT=True)),
    ("tma pers s3 flat", "tma", dict(_TMA, num_stages=3, PERSISTENT=True, FLATTEN=True)),
    ("tma pers s4", "tma", dict(_TMA, num_stages=4, PERSISTENT=True)),
    ("tma pers s4 flat", "tma", dict(_TMA, num_stages=4, PERSISTENT=True, FLATTEN=True)),
    ("tma tile s3", "tma", dict(_TMA, num_stages=3, PERSISTENT=False)),
    ("tma tile s4", "tma", dict(_TMA, num_stages=4, PERSISTENT=False)),
    ("tma tile s3 nosub", "tma", dict(_TMA, num_stages=3, PERSISTENT=False, SUBTILE=False)),
    ("tma pers s4 flat G16", "tma", dict(_TMA, num_stages=4, PERSISTENT=True, FLATTEN=True,
                                         GROUP_M=16)),
    ("tma pers 128x128 s4 flat", "tma", dict(_TMA, BLOCK_N=128, num_stages=4,
                                             PERSISTENT=True, FLATTEN=True)),
]


def bench_mm_sweep():
    """Big bf16/fp16 products (4096^3, 8192^3): every MM_CANDIDATES entry against torch in
    the same run. All candidates are compiled first in parallel processes."""
    import subprocess
    t0 = time.time()
    jobs = [(dn, c) for dn in ("bfloat16", "float16") for c in MM_CANDIDATES]
    jobs += [("bfloat16", (name, "gemv", cfg)) for name, cfg in GEMV_VARIANTS]
    workers = max(1, min(len(jobs), (os.cpu_count() or 2) - 1))
    procs = []
    for i in range(workers):   # one process per core, each compiling a share in turn
        arg = json.dumps(dict(n=4096, jobs=jobs[i::workers]))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__),
                                       "--mm-precompile", arg], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        try:
            outs, errs = p.communicate(timeout=240)
            done = json.loads(outs.strip().splitlines()[-1]) if p.returncode == 0 else [errs[-300:]]
            for r in done:
                if ":" in r:
                    print("  precompile:", r, flush=True)
        except Exception as e:   # compiling ahead is an optimisation; timing compiles the rest
            p.kill()
            print(f"  precompile failed: {type(e).__name__}: {e}"[:200], flush=True)
    record(section="mmsweep-compile", seconds=time.time() - t0, workers=workers, jobs=len(jobs))
    for dt in (nbx.bfloat16, nbx.float16):
        tdt = TORCH_DT[dt]
        for n in (4096, 8192):
            ta = torch.randn(n, n, device="cuda", dtype=tdt)
            tb = torch.randn(n, n, device="cuda", dtype=tdt)
            a, b = to_nbx(ta), to_nbx(tb)
            out = nbx.empty((n, n), dtype=dt, device=DEV)
            tout = torch.empty(n, n, device="cuda", dtype=tdt)
            inner = 10 if n == 4096 else 3
            fl = 2.0 * n ** 3
            ref = torch.matmul(ta, tb)
            t_tor = [time_gpu(lambda: torch.matmul(ta, tb, out=tout), inner)]
            for name, kind, cfg in MM_CANDIDATES:
                try:
                    with _mm_apply(kind, cfg):
                        t = time_gpu(lambda: nbx.matmul(a, b, out=out), inner)
                        err = rel_err(out, ref)
                    record(section="mmsweep", dtype=dt.name, M=n, cfg=name,
                           nbx_tflops=fl / t / 1e12, ratio=None, t_us=t * 1e6, err=err)
                except Exception as e:
                    record(section="mmsweep", dtype=dt.name, M=n, cfg=name,
                           error=f"{type(e).__name__}: {e}"[:200])
            t_tor.append(time_gpu(lambda: torch.matmul(ta, tb, out=tout), inner))
            tt = min(t_tor)   # torch timed before and after the candidates; its best
            record(section="mmsweep-torch", dtype=dt.name, M=n, torch_tflops=fl / tt / 1e12,
                   torch_us_runs=[round(x * 1e6, 1) for x in t_tor])
            for r in ROWS:
                if r.get("section") == "mmsweep" and r["dtype"] == dt.name and r["M"] == n \
                        and "error" not in r:
                    r["ratio"] = tt / (r["t_us"] / 1e6)
                    r["torch_tflops"] = fl / tt / 1e12
            del ta, tb, a, b, out, tout, ref


GEMV_VARIANTS = [("two-launch (rule)", None), ("no split", dict(TARGET=1))]
GRAPH_N = 64   # GEMVs (or empty kernels) a captured graph runs back to back


def _empty_kernel_fn():
    import triton

    @triton.jit
    def _empty_kernel(p):
        pass
    return _empty_kernel


def bench_gemv_launch(bw):
    """Decode GEMV 2048x2048 bf16, M = 1 (8 MB: 2 us at the copy bandwidth): the K-split
    variants of kernels/gemv.py standalone (weights rotated over 64 copies, L2 flushed) and
    in a CUDA graph of GRAPH_N back-to-back GEMVs on the rotated weights (per GEMV), torch
    the same two ways, and the floor: an empty kernel standalone and in a graph."""
    import nbxtensor.kernels.gemv as kg
    from nbxtensor.backends.launch import launch
    K = N = 2048
    byts = 2 * N * K + 2 * K + 2 * N
    tws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
           for _ in range(GRAPH_N)]
    ws = [to_nbx(t) for t in tws]
    tx = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    x = to_nbx(tx)
    out = nbx.empty((1, N), dtype=nbx.bfloat16, device=DEV)
    ref = torch.nn.functional.linear(tx, tws[0])
    it = {"i": 0}

    def run():
        it["i"] = (it["i"] + 1) % GRAPH_N
        nbx.linear(x, ws[it["i"]], out=out)

    def row(name, t, tg, err=None):
        record(section="gemvlaunch", cfg=name, us=t * 1e6, graph_us=tg * 1e6,
               frac_copy=byts / t / 1e9 / bw, graph_frac_copy=byts / tg / 1e9 / bw,
               **({} if err is None else dict(err=err)))
    old = kg._OVERRIDE
    for name, cfg in GEMV_VARIANTS:
        try:
            kg._OVERRIDE = cfg
            nbx.linear(x, ws[0], out=out)            # compiled (and counters made) eagerly
            err = rel_err(out, ref)
            t = time_gpu(run, GRAPH_N, flush=True)
            g = nbx.cuda.CUDAGraph()
            with nbx.cuda.graph(g):
                for w in ws:
                    nbx.linear(x, w, out=out)
            tg = time_gpu(g.replay, 2, flush=True) / GRAPH_N
            g.replay()
            torch.cuda.synchronize()
            err = max(err, rel_err(out, torch.nn.functional.linear(tx, tws[-1])))
            row(name, t, tg, err)
            del g
        except Exception as e:
            record(section="gemvlaunch", cfg=name, error=f"{type(e).__name__}: {e}"[:200])
        finally:
            kg._OVERRIDE = old
    try:
        tout = torch.empty(1, N, device="cuda", dtype=torch.bfloat16)

        def run_t():
            it["i"] = (it["i"] + 1) % GRAPH_N
            torch.matmul(tx, tws[it["i"]].t(), out=tout)
        t = time_gpu(run_t, GRAPH_N, flush=True)
        run_t()
        tg_ = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            run_t()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(tg_):
            for tw in tws:
                torch.matmul(tx, tw.t(), out=tout)
        tg = time_gpu(tg_.replay, 2, flush=True) / GRAPH_N
        row("torch", t, tg)
    except Exception as e:
        record(section="gemvlaunch", cfg="torch", error=f"{type(e).__name__}: {e}"[:200])
    try:
        ek = _empty_kernel_fn()
        launch(ek, (1,), out)
        t = time_gpu(lambda: launch(ek, (1,), out), GRAPH_N)
        g = nbx.cuda.CUDAGraph()
        with nbx.cuda.graph(g):
            for _ in range(GRAPH_N):
                launch(ek, (1,), out)
        tg = time_gpu(g.replay, 2) / GRAPH_N
        record(section="gemvlaunch", cfg="empty kernel (floor)", us=t * 1e6, graph_us=tg * 1e6)
        record(section="gemvlaunch", cfg="copy time of the bytes", us=byts / bw / 1e3,
               graph_us=byts / bw / 1e3)
    except Exception as e:
        record(section="gemvlaunch", cfg="empty kernel", error=f"{type(e).__name__}: {e}"[:200])
    del tws, ws


def main():
    t0 = time.time()
    print(f"torch {torch.__version__}  device {torch.cuda.get_device_name()}  quick={QUICK}",
          flush=True)
    failures = []
    # the session 5 sweeps: each runs alone
    for flag, fn in (("--small-gemv", bench_small_gemv), ("--m16-fused", bench_m16_fused),
                     ("--m16-sweep", bench_m16_sweep)):
        if flag in sys.argv:
            try:
                fn()
            except Exception:
                failures.append(flag[2:])
                traceback.print_exc()
            return _finish(t0, failures)
    if MM_SWEEP:
        for name, fn in [("mm-sweep", bench_mm_sweep),
                         ("gemv-launch", lambda: bench_gemv_launch(copy_bandwidth()))]:
            try:
                fn()
            except Exception:
                failures.append(name)
                traceback.print_exc()
        return _finish(t0, failures)
    sections = [] if SWEEP_ONLY else [("big", bench_big), ("model", bench_model)]
    for name, fn in sections:
        try:
            fn()
        except Exception:
            failures.append(name)
            traceback.print_exc()
    try:
        bw = copy_bandwidth()
        if not SWEEP_ONLY:
            bench_gemv(bw)
    except Exception:
        failures.append("gemv")
        traceback.print_exc()
    if SWEEP:
        try:
            bench_medium_sweep()
            bench_gemv_sweep(bw)
            bench_sweep()
        except Exception:
            failures.append("sweep")
            traceback.print_exc()
    return _finish(t0, failures)


def _finish(t0, failures):
    os.makedirs(OUTDIR, exist_ok=True)
    sweep = next((f[2:].replace("-", "") for f in ("--small-gemv", "--m16-fused", "--m16-sweep")
                  if f in sys.argv), "mmsweep" if MM_SWEEP else None)
    with open(os.path.join(OUTDIR, f"matmul_{sweep}.json" if sweep else "matmul.json"),
              "w") as f:
        json.dump({"quick": QUICK, "rows": ROWS, "failures": failures,
                   "seconds": time.time() - t0}, f, indent=1)
    # the table, last
    print("\n== matmul (nbx vs torch; ratio = torch_time / nbx_time, > 1 means nbx faster)")
    print(f"{'section':7} {'dtype':9} {'M':>6} {'N':>7} {'K':>6} {'nbx':>10} {'torch':>10} "
          f"{'ratio':>6} {'%copy':>6} {'err':>8}")
    for r in ROWS:
        if r["section"] in ("big", "model", "odd"):
            print(f"{r['section']:7} {r['dtype']:9} {r['M']:>6} {r['N']:>7} {r['K']:>6} "
                  f"{r['nbx_tflops']:>7.1f}TF/s {r['torch_tflops']:>6.1f}TF/s {r['ratio']:>6.2f} "
                  f"{'':>6} {r['err']:>8.1e}")
        elif r["section"] == "gemv":
            print(f"{'gemv':7} {r['dtype']:9} {r['M']:>6} {r['N']:>7} {r['K']:>6} "
                  f"{r['nbx_gbs']:>7.0f}GB/s {r['torch_gbs']:>6.0f}GB/s {r['ratio']:>6.2f} "
                  f"{100 * r['frac_copy']:>5.0f}% {r['err']:>8.1e}")
        elif r["section"] == "copy":
            print(f"{'copy':7} {'':9} {'':>6} {'':>7} {'':>6} {r['gbs']:>7.0f}GB/s")
        elif r["section"] == "mmsweep" and "error" not in r:
            print(f"{'mmsweep':7} {r['dtype']:9} {r['M']:>6} {r['cfg']:28} "
                  f"{r['nbx_tflops']:>6.1f} TF/s vs torch {r.get('torch_tflops', 0):>6.1f} "
                  f"ratio {r.get('ratio') or 0:.3f} err {r['err']:.1e}")
        elif r["section"] == "gemvlaunch" and "error" not in r:
            fr = (f"  {100 * r['frac_copy']:.0f}% / {100 * r['graph_frac_copy']:.0f}% of copy"
                  if "frac_copy" in r else "")
            print(f"{'gemv1L':7} {r['cfg']:28} standalone {r['us']:7.2f} us  graph "
                  f"{r['graph_us']:7.2f} us/GEMV{fr}")
        elif r["section"] == "mmsweep" or "error" in r:
            print(f"{r['section']:7} {r.get('cfg', '')}: {r.get('error')}")
        elif r["section"] == "sweep" and "error" not in r:
            print(f"{'sweep':7} {r['M']:>6} {r['cfg']}: {r['nbx_tflops']:.1f} TF/s ratio {r['ratio']:.2f}")
    if MM_SWEEP:   # the verdict, last (the summary keeps only the tail)
        print("== mm-sweep verdict: rule vs best candidate per shape (ratio = torch/nbx time)")
        keys = sorted({(r["dtype"], r["M"]) for r in ROWS if r["section"] == "mmsweep"})
        for dt, n in keys:
            rs = [r for r in ROWS if r["section"] == "mmsweep" and (r["dtype"], r["M"]) == (dt, n)
                  and r.get("ratio") and r.get("err", 1) < 2e-2]
            if not rs:
                print(f"  {dt} {n}: no valid rows")
                continue
            rule = next((r for r in rs if r["cfg"].startswith("rule")), None)
            best = max(rs, key=lambda r: r["ratio"])
            print(f"  {dt:8} {n}^3  torch {best['torch_tflops']:.0f} TF/s  rule "
                  f"{rule['ratio'] if rule else float('nan'):.3f}  best {best['ratio']:.3f} "
                  f"({best['cfg']}, {best['nbx_tflops']:.0f} TF/s) "
                  f"{dict((c[0], c[2]) for c in MM_CANDIDATES).get(best['cfg'])}")
        for r in ROWS:
            if r["section"] == "gemvlaunch" and "error" not in r:
                print(f"  gemv 2048x2048 {r['cfg']:24} {r['us']:6.2f} us, graph "
                      f"{r['graph_us']:6.2f} us/GEMV"
                      + (f", err {r['err']:.1e}" if "err" in r else ""))
            elif r["section"] in ("gemvlaunch", "mmsweep") and "error" in r:
                print(f"  ERROR {r['section']} {r.get('cfg')}: {r['error'][:120]}")
    if failures:
        print(f"FAILED sections: {failures}")
    print(f"({time.time() - t0:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
