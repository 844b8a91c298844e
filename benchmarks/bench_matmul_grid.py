"""The matmul grid: nbx.matmul against torch (cuBLAS) on >= 40 shapes in one run (H200).

    PYTHONPATH=src python3 benchmarks/bench_matmul_grid.py [--quick] [--no-table] [--only=RE]
        [--probe] [--norms] [--colsum] [--deadline=S] [--total=S] [OUTDIR]
    PYTHONPATH=src python3 benchmarks/bench_matmul_grid.py --sweep[=PART/PARTS] [--only=RE] [OUTDIR]

One shared GPU call (~30 s, the H200): `--quick --norms --colsum --probe --deadline=30
--total=40`.

The grid (GRID below): M, N, K from 1 to 16k, odd sizes, every transpose pair, strided
operands (a row stride wider than the row, aligned or not), batched and broadcast-batched
products, in bf16, a few in fp16, fp32 (IEEE, torch's default) and tf32
(`set_float32_matmul_precision('high')` on both sides). Both libraries read the same
memory: operands are nbx allocations that torch views through DLPack, filled by torch.

Each row: kernel time of nbx and torch (CUDA events, the calls queued behind a sleep kernel
so host time is hidden; `_common.time_gpu`), TFLOP/s, ratio = torch time / nbx time (> 1:
we are faster), max |nbx - torch| / max |torch| (BAD when beyond the dtype's tolerance),
and the path nbx took (kernel, tile, warps, stages, split). The summary prints the
geometric mean and the worst ratio over the 16-bit rows, the fp32 rows, the tf32 rows and
all rows (the goals: >= 0.95 geomean, none below 0.8, fp32 >= 0.9).

--no-table  times the rule alone (autotune.disabled(): no shipped table, no user cache).
--only=RE   only the rows whose name matches RE.
--deadline=S  no row starts after S seconds (default 85); the rows left are listed.
--quick     1 ms timed batches, 2 repeats (the whole grid in ~30 s with its compiles).
--probe     after the grid, PROBE_CANDIDATES (a few rows under a few candidates each);
--norms, --colsum  then bench_norm.probe and bench_reduction.colsum_probe (one process for
            a short shared GPU call); --total=S: none of these starts after S seconds.
Rows the rule runs on the TMA kernel are also timed on the tiled kernel's rule ("tiled").
--sweep     instead of the grid, times candidate configs (SWEEP_CANDIDATES: the tiled kernel
            through `config_override`, the TMA kernel forced) on the rows they apply to,
            printing each candidate's ratio and the best per row; `--sweep=1/2` runs every
            second row starting at the first (split a sweep over two calls).
Kernels are compiled first in parallel processes (`_common.precompile`). JSON to
OUTDIR/matmul_grid.json (or matmul_grid_sweep.json).
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402  (the reference only)

import nbxtensor as nbx  # noqa: E402
from _common import out_dir, precompile, time_gpu  # noqa: E402

OUTDIR = out_dir()
NO_TABLE = "--no-table" in sys.argv
ONLY = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")), None)
SWEEP = next((a for a in sys.argv if a == "--sweep" or a.startswith("--sweep=")), None)
# no row starts after this many seconds (the device calls are ~90 s)
DEADLINE = float(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--deadline=")), 85))
QUICK = "--quick" in sys.argv
PROBE = "--probe" in sys.argv
# the grid, then (--probe, --norms, --colsum) nothing starts after this many seconds
TOTAL = float(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--total=")),
                   DEADLINE + 15))
BATCH_S = 1e-3 if QUICK else 3e-3   # GPU time of one timed batch
REPEATS = 2 if QUICK else 3
T0 = time.time()

# (name, dtype, batch, M, N, K, layout, pad): batch () for a 2-D product, (B,) or (B0, B1)
# batched, ("bcast", B) for a batched A times one 2-D B; layout "nn" / "nt" (B stored
# [N, K], linear's weight) / "tn" (A stored [K, M]) / "tt"; pad = (extra elements of A's
# row, of B's row): a strided operand whose row stride exceeds its row.
GRID = [
    # squares and the big ones
    ("sq256", "bf16", (), 256, 256, 256, "nn", (0, 0)),
    ("sq512", "bf16", (), 512, 512, 512, "nn", (0, 0)),
    ("sq1024", "bf16", (), 1024, 1024, 1024, "nn", (0, 0)),
    ("sq2048", "bf16", (), 2048, 2048, 2048, "nn", (0, 0)),
    ("sq4096", "bf16", (), 4096, 4096, 4096, "nn", (0, 0)),
    ("sq8192", "bf16", (), 8192, 8192, 8192, "nn", (0, 0)),
    ("issue3000", "bf16", (), 3000, 2000, 5000, "nn", (0, 0)),
    # odd sizes
    ("odd1000", "bf16", (), 1000, 1000, 1000, "nn", (0, 0)),
    ("odd4097", "bf16", (), 4097, 4095, 4093, "nn", (0, 0)),
    ("odd2047", "bf16", (), 2047, 2049, 2051, "nn", (0, 0)),
    ("odd777", "bf16", (), 777, 1234, 3333, "nn", (0, 0)),
    ("odd5555", "bf16", (), 5555, 3333, 1111, "nn", (0, 0)),
    # tall, wide, long K
    ("tall16k", "bf16", (), 16384, 1024, 1024, "nn", (0, 0)),
    ("wide16k", "bf16", (), 1024, 16384, 1024, "nn", (0, 0)),
    ("longk16k", "bf16", (), 1024, 1024, 16384, "nn", (0, 0)),
    ("tinyout16k", "bf16", (), 256, 256, 16384, "nn", (0, 0)),
    ("shortk64", "bf16", (), 4096, 4096, 64, "nn", (0, 0)),
    ("k1", "bf16", (), 4096, 4096, 1, "nn", (0, 0)),
    ("n1", "bf16", (), 4096, 1, 4096, "nn", (0, 0)),
    ("big16k", "bf16", (), 16384, 8192, 2048, "nn", (0, 0)),
    # few rows (M 1..128)
    ("m1", "bf16", (), 1, 4096, 4096, "nt", (0, 0)),
    ("m16", "bf16", (), 16, 4096, 4096, "nt", (0, 0)),
    ("m17", "bf16", (), 17, 4096, 4096, "nt", (0, 0)),
    ("m64", "bf16", (), 64, 4096, 4096, "nt", (0, 0)),
    ("m128", "bf16", (), 128, 4096, 4096, "nt", (0, 0)),
    ("m32x11008", "bf16", (), 32, 11008, 4096, "nt", (0, 0)),
    # linear layout (x @ W^T): transformer shapes
    ("lin2048", "bf16", (), 2048, 2048, 2048, "nt", (0, 0)),
    ("lin_up", "bf16", (), 2048, 8192, 2048, "nt", (0, 0)),
    ("lin_down", "bf16", (), 2048, 2048, 8192, "nt", (0, 0)),
    ("lin_mlp8b", "bf16", (), 4096, 14336, 4096, "nt", (0, 0)),
    ("lin_vocab", "bf16", (), 512, 128256, 2048, "nt", (0, 0)),
    ("issue3000nt", "bf16", (), 3000, 2000, 5000, "nt", (0, 0)),
    # transposed A
    ("tn4096", "bf16", (), 4096, 4096, 4096, "tn", (0, 0)),
    ("tn1000", "bf16", (), 1000, 1000, 1000, "tn", (0, 0)),
    ("tt2048", "bf16", (), 2048, 2048, 2048, "tt", (0, 0)),
    ("tt_odd", "bf16", (), 4095, 4097, 1025, "tt", (0, 0)),
    # strided operands
    ("strideA+64", "bf16", (), 4096, 4096, 4096, "nn", (64, 0)),
    ("strideA+3", "bf16", (), 2048, 2048, 2048, "nn", (3, 0)),
    ("strideB+8", "bf16", (), 2048, 2048, 2048, "nt", (0, 8)),
    # batched
    ("bmm_qk", "bf16", (32,), 512, 512, 64, "nt", (0, 0)),
    ("bmm_pv", "bf16", (32,), 512, 64, 512, "nn", (0, 0)),
    ("bmm8x2048", "bf16", (8,), 2048, 2048, 2048, "nn", (0, 0)),
    ("bmm64x128", "bf16", (64,), 128, 128, 128, "nn", (0, 0)),
    ("bmm16odd", "bf16", (16,), 1000, 1000, 64, "nn", (0, 0)),
    ("bmm4d", "bf16", (2, 16), 512, 512, 128, "nn", (0, 0)),
    ("bcast4", "bf16", ("bcast", 4), 1024, 4096, 4096, "nt", (0, 0)),
    # fp16
    ("f16sq4096", "fp16", (), 4096, 4096, 4096, "nn", (0, 0)),
    ("f16issue", "fp16", (), 3000, 2000, 5000, "nn", (0, 0)),
    ("f16lin", "fp16", (), 2048, 8192, 2048, "nt", (0, 0)),
    # fp32, IEEE
    ("f32sq4096", "fp32", (), 4096, 4096, 4096, "nn", (0, 0)),
    ("f32sq2048", "fp32", (), 2048, 2048, 2048, "nn", (0, 0)),
    ("f32issue", "fp32", (), 3000, 2000, 5000, "nn", (0, 0)),
    ("f32lin", "fp32", (), 2048, 2048, 8192, "nt", (0, 0)),
    ("f32bmm", "fp32", (8,), 1024, 1024, 1024, "nn", (0, 0)),
    # tf32
    ("tf32sq4096", "tf32", (), 4096, 4096, 4096, "nn", (0, 0)),
    ("tf32issue", "tf32", (), 3000, 2000, 5000, "nn", (0, 0)),
    ("tf32lin", "tf32", (), 2048, 8192, 2048, "nt", (0, 0)),
]

DTYPES = {"bf16": (nbx.bfloat16, torch.bfloat16), "fp16": (nbx.float16, torch.float16),
          "fp32": (nbx.float32, torch.float32), "tf32": (nbx.float32, torch.float32)}
# max |nbx - torch| / max |torch| beyond which a row is BAD (two roundings of the output,
# different summation orders; tf32 rounds the inputs to 10 mantissa bits)
TOL = {"bf16": 2e-2, "fp16": 4e-3, "fp32": 1e-4, "tf32": 5e-3}

# --sweep: (label, kind, cfg). kind "tiled": config_override(**cfg) (the tiled kernel, no
# GEMV, no TMA switch); "tma": config_override(TMA=True, **cfg) (one batch, 16-bit only).
_T16 = [("t128x256", dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3)),
        ("t128x128", dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4)),
        ("t128x64", dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4)),
        ("t64x128", dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4)),
        ("t64x64", dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4))]
SWEEP16 = (
    [("rule", None, None)]
    + [(n + "/s1", "tiled", dict(c, SPLIT=1)) for n, c in _T16]
    + [("t128x128/s4", "tiled", dict(_T16[1][1], SPLIT=4)),
       ("t128x128/pers", "tiled", dict(_T16[1][1], PERSISTENT=True, FLATTEN=True))]
    + [("tma128x256/p3", "tma", dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8,
                                     num_stages=3, PERSISTENT=True, FLATTEN=True)),
       ("tma128x256/np", "tma", dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8,
                                     num_stages=3, PERSISTENT=False)),
       ("tma256x128/p3", "tma", dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, num_warps=8,
                                     num_stages=3, PERSISTENT=True, FLATTEN=True)),
       ("tma128x128/p4", "tma", dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8,
                                     num_stages=4, PERSISTENT=True, FLATTEN=True)),
       ("tma128x128/np", "tma", dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8,
                                     num_stages=4, PERSISTENT=False)),
       ("tma64x256/p4", "tma", dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64, num_warps=4,
                                    num_stages=4, PERSISTENT=True, FLATTEN=True)),
       ("tma128x64/np", "tma", dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4,
                                    num_stages=4, PERSISTENT=False))])
# K split through the TMA kernel (few tiles, long K): only where 128x128 tiles leave SMs idle
SWEEP16_SPLIT = [
    (f"tma{bm}x{bn}/sp{sp}", "tma", dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, num_warps=8,
                                        num_stages=st, PERSISTENT=True, FLATTEN=True, SPLIT=sp))
    for bm, bn, st in ((128, 256, 3), (128, 128, 4)) for sp in (2, 4, 8)]
SWEEP32 = [("rule", None, None)] + [
    (f"f{bm}x{bn}x{bk}w{w}s{s}", "tiled", dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w,
                                               num_stages=s, SPLIT=1))
    for bm, bn, bk, w, s in [(128, 128, 32, 8, 3), (128, 128, 32, 4, 3), (128, 128, 16, 8, 4),
                             (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (128, 256, 16, 8, 3),
                             (256, 128, 16, 8, 3), (64, 64, 32, 4, 4), (128, 128, 64, 8, 2)]] + [
    ("tmaf128x128x32/p3", "tma", dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, num_warps=8,
                                      num_stages=3, PERSISTENT=True, FLATTEN=True)),
    ("tmaf128x64x32/np", "tma", dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=32, num_warps=4,
                                     num_stages=4, PERSISTENT=False))]
SWEEP_TF32 = [("rule", None, None)] + [
    (f"t{bm}x{bn}x{bk}w{w}s{s}", "tiled", dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w,
                                               num_stages=s, SPLIT=1))
    for bm, bn, bk, w, s in [(128, 128, 32, 8, 3), (128, 256, 32, 8, 3), (128, 128, 32, 4, 4),
                             (128, 128, 64, 8, 3), (256, 128, 32, 8, 3), (128, 64, 32, 4, 4)]] + [
    (f"tmat{bm}x{bn}x{bk}w{w}s{s}{'p' if p else 'np'}", "tma",
     dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s, PERSISTENT=p,
          FLATTEN=p))
    for bm, bn, bk, w, s, p in [(128, 256, 32, 8, 3, True), (128, 128, 32, 8, 4, True),
                                (128, 128, 32, 8, 4, False), (128, 256, 64, 8, 2, True),
                                (128, 128, 64, 8, 3, True)]]


# --probe: after the grid, these rows under a few candidates each (calibration of the rule)
PROBE_CANDIDATES = {
    "f32sq4096": ["f128x128x32w8s3", "f128x64x32w4s4"],
    "tf32sq4096": ["t128x128x32w8s3", "tmat128x128x32w8s4p"],
    "bmm16odd": ["t64x128/s1", "t128x128/s1", "t128x64/s1"],
    "bmm_pv": ["t64x64/s1", "t128x64/s1"],
    "m17": ["t64x64/s1", "t64x128/s1"],
    "issue3000": ["tma128x256/p3", "tma256x128/p3", "t128x256/s1"],
    "issue3000nt": ["tma128x256/p3"],
    "lin2048": ["tma256x128/p3", "tma128x128/np", "t128x256/s1"],
}


def probe_candidates(row):
    want = PROBE_CANDIDATES[row[0]]
    return [c for c in candidates(row) if c[0] in want]


def candidates(row):
    _, dt, batch, M, N, K, _, _ = row
    batched = bool(batch)
    if dt in ("bf16", "fp16"):
        few = -(-M // 128) * -(-N // 128) < 264 and K >= 1024 and not batched
        return [c for c in SWEEP16 if not (batched and c[1] == "tma")] + \
            (SWEEP16_SPLIT if few else [])
    cands = SWEEP32 if dt == "fp32" else SWEEP_TF32
    return [c for c in cands if not (batched and c[1] == "tma")]


# ------------------------------------------------------------------ operands
def _operand(rows, cols, batch, transposed, pad, ndt, tdt):
    """(nbx view, torch view) of one logical [*batch, rows, cols] operand over the same
    memory: stored [*batch, cols, rows] when transposed, each stored row `pad` elements
    longer than it is used."""
    srows, scols = (cols, rows) if transposed else (rows, cols)
    store = nbx.empty(tuple(batch) + (srows, scols + pad), dtype=ndt, device="cuda")
    ts = torch.from_dlpack(store)
    ts.normal_()
    tv = ts[..., :scols]
    if transposed:
        tv = tv.transpose(-1, -2)
    nv = store.as_strided(tuple(tv.shape), tuple(tv.stride()), tv.storage_offset())
    return nv, tv, store


def make_case(row):
    name, dt, batch, M, N, K, layout, pad = row
    ndt, tdt = DTYPES[dt]
    if batch and batch[0] == "bcast":
        ba, bb = (batch[1],), ()
    else:
        ba = bb = tuple(batch)
    a, ta, sa = _operand(M, K, ba, layout[0] == "t", pad[0], ndt, tdt)
    b, tb, sb = _operand(K, N, bb, layout[1] == "t", pad[1], ndt, tdt)
    return dict(a=a, b=b, ta=ta, tb=tb, keep=(sa, sb))


class precision:
    """tf32 rows: both libraries allow TF32 inside; everything else IEEE fp32."""

    def __init__(self, dt):
        self.on = dt == "tf32"

    def __enter__(self):
        if self.on:
            torch.backends.cuda.matmul.allow_tf32 = True
            nbx.set_float32_matmul_precision("high")

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = False
        nbx.set_float32_matmul_precision("highest")


# ------------------------------------------------------------------ what nbx ran
def describe(call):
    """Run `call` once, recording the kernels matmul/gemv launched: 'kernel tile w/s split'."""
    from nbxtensor.backends import launch as bl
    from nbxtensor.kernels import gemv as kg
    seen = []

    def rec_launch(kernel, grid, *args, **kw):
        seen.append(_label(kernel, grid, kw))
        return orig_launch(kernel, grid, *args, **kw)

    def rec_items(kernel, grid, args, items):
        seen.append(_label(kernel, grid, dict(items)))
        return orig_items(kernel, grid, args, items)

    orig_launch, orig_items = bl.launch, kg._launch_items
    bl.launch, kg._launch_items = rec_launch, rec_items
    try:
        call()
    finally:
        bl.launch, kg._launch_items = orig_launch, orig_items
    return " + ".join(seen) or "?"


def _label(kernel, grid, kw):
    name = getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel)).strip("_")
    name = name.replace("_kernel", "").replace("matmul_", "")
    tile = "x".join(str(kw[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K") if k in kw)
    extra = [f"w{kw['num_warps']}" if "num_warps" in kw else "",
             f"s{kw['num_stages']}" if "num_stages" in kw else "",
             "P" if kw.get("PERSISTENT") else "", "F" if kw.get("FLATTEN") else ""]
    g = grid if isinstance(grid, tuple) else "fn"
    return f"{name}[{tile} {''.join(extra)} g{g}]".replace(" ]", "]")


# ------------------------------------------------------------------ timing
def inner_for(fn):
    """Calls a timed batch, so one batch is ~BATCH_S of GPU time (2..100)."""
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    t = max(s.elapsed_time(e) / 1e3, 1e-6)
    return max(2, min(100, int(BATCH_S / t)))


def rel_err(got, ref):
    g = torch.from_dlpack(got).double()
    r = ref.double()
    d = (g - r).abs().max().item()
    m = r.abs().max().item()
    return d / max(m, 1e-30) if g.shape == r.shape else float("inf")


def flops(row):
    _, _, batch, M, N, K, _, _ = row
    nb = math.prod(batch[1:]) if batch and batch[0] == "bcast" else math.prod(batch)
    return 2.0 * nb * M * N * K


def table_ctx():
    from nbxtensor import autotune
    import contextlib
    return autotune.disabled() if NO_TABLE else contextlib.nullcontext()


def override_ctx(kind, cfg):
    import contextlib
    from nbxtensor.kernels import matmul as km
    if kind is None:
        return contextlib.nullcontext()
    return km.config_override(**(dict(cfg, TMA=True) if kind == "tma" else cfg))


def tiled_rule(row):
    """The tiled kernel's rule config of `row` (kernels/matmul.py matmul_config, tma=False):
    what the rule falls back to when TMA cannot read the operands."""
    from nbxtensor.kernels import matmul as km
    from nbxtensor.kernels._common import device_facts
    _, dt, batch, M, N, K, _, _ = row
    nb = math.prod(batch)
    if batch and batch[0] == "bcast":   # the op layer folds the batch into M
        nb, M = 1, M * batch[1]
    return km.matmul_config(M, N, K, DTYPES[dt][0], device_facts(nbx.device("cuda")), nb,
                            "tf32" if dt == "tf32" else "ieee", tma=False)


def set_override(kind, cfg):
    """precompile's setter: the same override as override_ctx, left in place."""
    from nbxtensor.kernels import matmul as km
    km._OVERRIDE = None if kind is None else (dict(cfg, TMA=True) if kind == "tma" else dict(cfg))


def reset_override():
    from nbxtensor.kernels import matmul as km
    km._OVERRIDE = None
    nbx.set_float32_matmul_precision("highest")


# ------------------------------------------------------------------ the grid
def rows_selected():
    rows = [r for r in GRID if ONLY is None or re.search(ONLY, r[0])]
    if SWEEP:   # the GEMV rows (M <= 16) are not the tiled rule's
        rows = [r for r in rows if r[3] > 16]
    if SWEEP and "=" in SWEEP:
        part, parts = (int(x) for x in SWEEP.split("=", 1)[1].split("/"))
        rows = rows[part - 1::parts]
    return rows


def warm(rows, cases, cands_of, extra=()):
    """Compile, in parallel processes, every kernel the rows' candidates launch, and the
    `extra` (call, set_override) jobs (the --norms / --colsum probes)."""
    jobs = list(extra)
    for row in rows:
        c = cases.get(row[0])
        if c is None:
            continue
        for _, kind, cfg in cands_of(row):
            def call(c=c, dt=row[1]):
                with precision(dt):
                    nbx.matmul(c["a"], c["b"])
            jobs.append((call, lambda kind=kind, cfg=cfg: set_override(kind, cfg)))
    with table_ctx():
        precompile(jobs, "warm-compile", reset_override)
    reset_extra()


def extra_jobs():
    """The --norms / --colsum probes' compile jobs (compiled with the grid's in one pool)."""
    jobs = []
    if "--norms" in sys.argv:
        import bench_norm
        jobs += bench_norm.probe_jobs()
    if "--colsum" in sys.argv:
        import bench_reduction
        jobs += bench_reduction.colsum_jobs()
    return jobs


def reset_extra():
    """Undo what the extra jobs' setters left: the norm tiles, the column tiles."""
    if "--norms" in sys.argv:
        from nbxtensor.kernels import norm as kn
        kn._OVERRIDE = None
    if "--colsum" in sys.argv:
        import bench_reduction
        from nbxtensor.kernels import reduction as R
        R.CONFIG["cuda"].update(zip(bench_reduction.COLSUM_KEYS, SHIPPED_COLS))
        R._plan.cache_clear()


def run_grid(rows):
    results, cases = [], {}
    for row in rows:
        try:
            cases[row[0]] = make_case(row)
        except Exception as e:  # noqa: BLE001 - one shape must not hide the others
            results.append(dict(name=row[0], error=f"{type(e).__name__}: {e}"[:200]))
    warm(rows, cases, lambda row: [("rule", None, None), ("tiled", "tiled", tiled_rule(row))]
         + (probe_candidates(row) if PROBE and row[0] in PROBE_CANDIDATES else []),
         extra_jobs())
    for row in rows:
        c = cases.get(row[0])
        if c is None:
            continue
        if time.time() - T0 > DEADLINE:
            results.append(dict(name=row[0], error="skipped (deadline)"))
            continue
        name, dt = row[0], row[1]
        try:
            with precision(dt), table_ctx():
                path = describe(lambda: nbx.matmul(c["a"], c["b"]))
                got = nbx.matmul(c["a"], c["b"])
                ref = torch.matmul(c["ta"], c["tb"])
                err = rel_err(got, ref)
                del got
                fn_n = lambda: nbx.matmul(c["a"], c["b"])      # noqa: E731
                fn_t = lambda: torch.matmul(c["ta"], c["tb"])  # noqa: E731
                n = inner_for(fn_t)
                t_t = time_gpu(fn_t, n, repeats=REPEATS, warmup=1)
                t_n = time_gpu(fn_n, n, repeats=REPEATS, warmup=1)
                tiled = None
                if "tma" in path:   # the tiled kernel's rule on the same row, for comparison
                    with override_ctx("tiled", tiled_rule(row)):
                        tiled = t_t / time_gpu(fn_n, n, repeats=REPEATS, warmup=1)
            fl = flops(row)
            r = dict(name=name, dtype=dt, shape=_shape_text(row), nbx_us=t_n * 1e6,
                     torch_us=t_t * 1e6, nbx_tflops=fl / t_n / 1e12,
                     torch_tflops=fl / t_t / 1e12, ratio=t_t / t_n, err=err,
                     bad=not err <= TOL[dt], path=path, tiled_ratio=tiled)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            r = dict(name=name, dtype=dt, shape=_shape_text(row),
                     error=f"{type(e).__name__}: {e}"[:200])
        results.append(r)
        print(_row_text(r), flush=True)
        del cases[name]
    return results


def run_sweep(rows, cands_of=None, deadline=None, precompiled=False):
    cands_of = cands_of or candidates
    deadline = DEADLINE if deadline is None else deadline
    results, cases = [], {}
    for row in rows:
        try:
            cases[row[0]] = make_case(row)
        except Exception as e:  # noqa: BLE001
            print(f"{row[0]}: {type(e).__name__}: {e}")
    if not precompiled:
        warm(rows, cases, cands_of)
    for row in rows:
        c = cases.get(row[0])
        if c is None:
            continue
        if time.time() - T0 > deadline:
            print(f"{row[0]}: skipped (deadline)")
            continue
        name = row[0]
        try:
            results.append(sweep_row(row, c, cands_of))
        except Exception:  # noqa: BLE001 - one shape must not hide the others
            traceback.print_exc()
        del cases[name]
    return results


def sweep_row(row, c, cands_of):
    """Every candidate of `row` (inputs `c`) against torch: the result row."""
    name, dt = row[0], row[1]
    with precision(dt):
        ref = torch.matmul(c["ta"], c["tb"])
        fn_t = lambda: torch.matmul(c["ta"], c["tb"])  # noqa: E731
        n = inner_for(fn_t)
        t_t = time_gpu(fn_t, n, repeats=REPEATS, warmup=1)
        out = []
        for label, kind, cfg in cands_of(row):
            try:
                with override_ctx(kind, cfg), table_ctx():
                    err = rel_err(nbx.matmul(c["a"], c["b"]), ref)
                    if not err <= TOL[dt]:
                        out.append((label, None, f"wrong ({err:.1e})"))
                        continue
                    t = time_gpu(lambda: nbx.matmul(c["a"], c["b"]), n, repeats=REPEATS,
                                 warmup=1)
                out.append((label, t_t / t, None))
            except Exception as e:  # noqa: BLE001 - a config that does not apply
                out.append((label, None, f"{type(e).__name__}: {str(e)[:60]}"))
    ok = [o for o in out if o[1] is not None]
    best = max(ok, key=lambda o: o[1]) if ok else None
    rule = next((o[1] for o in out if o[0] == "rule"), None)
    print(f"{name:14s} {_shape_text(row):28s} torch {t_t * 1e6:9.1f} us  rule "
          f"{rule if rule is None else round(rule, 3)}  best {best[0] if best else '-'} "
          f"{round(best[1], 3) if best else ''}", flush=True)
    print("    " + "  ".join(f"{lab}={v:.3f}" if v is not None else f"{lab}:{why}"
                             for lab, v, why in out), flush=True)
    return dict(name=name, dtype=dt, shape=_shape_text(row), torch_us=t_t * 1e6,
                candidates=[dict(label=lab, ratio=v, why=why) for lab, v, why in out])


def _shape_text(row):
    _, dt, batch, M, N, K, layout, pad = row
    b = ("b" + "x".join(map(str, batch)) + " ") if batch else ""
    p = f" pad{pad}" if any(pad) else ""
    return f"{b}{M}x{N}x{K} {layout}{p}"


def _row_text(r):
    if "error" in r:
        return f"{r['name']:14s} {r.get('shape', ''):28s} ERROR {r['error']}"
    tl = r.get("tiled_ratio")
    return (f"{r['name']:14s} {r['shape']:28s} {r['dtype']:5s} {r['nbx_us']:9.1f} "
            f"{r['torch_us']:9.1f} {r['nbx_tflops']:7.1f} {r['torch_tflops']:7.1f} "
            f"{r['ratio']:6.3f} {'%6.3f' % tl if tl else '     -'} {r['err']:8.1e}"
            f"{' BAD' if r['bad'] else ''}  {r['path']}")


def summary(results):
    def stats(rs):
        if not rs:
            return "-"
        g = math.exp(sum(math.log(r["ratio"]) for r in rs) / len(rs))
        w = min(rs, key=lambda r: r["ratio"])
        below = sum(r["ratio"] < 0.8 for r in rs)
        return (f"geomean {g:.3f}, worst {w['ratio']:.3f} ({w['name']}), {below} below 0.8, "
                f"n={len(rs)}")
    ok = [r for r in results if "ratio" in r]
    groups = {"16-bit": [r for r in ok if r["dtype"] in ("bf16", "fp16")],
              "fp32": [r for r in ok if r["dtype"] == "fp32"],
              "tf32": [r for r in ok if r["dtype"] == "tf32"], "all": ok}
    lines = [f"{k:7s} {stats(v)}" for k, v in groups.items()]
    bad = [r["name"] for r in ok if r["bad"]]
    err = [r["name"] for r in results if "error" in r]
    if bad:
        lines.append(f"BAD (beyond tolerance): {bad}")
    if err:
        lines.append(f"ERRORS: {err}")
    return lines


def _shipped_cols():
    from nbxtensor.kernels import reduction as R
    return tuple(R.CONFIG["cuda"][k] for k in ("col_block_k", "col_tile", "col_warps"))


SHIPPED_COLS = _shipped_cols()


def main():
    t0 = T0
    rows = rows_selected()
    from nbxtensor.kernels._common import device_facts
    print(f"matmul grid: {len(rows)} rows, {'sweep ' + SWEEP if SWEEP else 'rule'}"
          f"{', no table' if NO_TABLE else ''}; {torch.cuda.get_device_name()}, "
          f"{device_facts(nbx.device('cuda')).sms} SMs; torch {torch.__version__}", flush=True)
    if SWEEP:
        results = run_sweep(rows)
        path = os.path.join(OUTDIR, "matmul_grid_sweep.json")
        lines = []
    else:
        print(f"{'name':14s} {'shape':28s} {'dtype':5s} {'nbx us':>9s} {'torch us':>9s} "
              f"{'nbx TF':>7s} {'torch':>7s} {'ratio':>6s} {'tiled':>6s} {'err':>8s}  path")
        results = run_grid(rows)
        path = os.path.join(OUTDIR, "matmul_grid.json")
        lines = summary(results)
        print("\n== matmul grid (ratio = torch time / nbx time)")
        for r in sorted((r for r in results if "ratio" in r), key=lambda r: r["ratio"]):
            print(_row_text(r))
        for line in lines:
            print(line)
    if "--norms" in sys.argv and time.time() - T0 < TOTAL:
        import bench_norm
        bench_norm.probe(deadline=T0 + TOTAL)
    if "--colsum" in sys.argv and time.time() - T0 < TOTAL:
        import bench_reduction
        bench_reduction.colsum_probe(deadline=T0 + TOTAL)
    if PROBE and not SWEEP:
        probe_rows = [r for r in GRID if r[0] in PROBE_CANDIDATES]
        results += run_sweep(probe_rows, probe_candidates, TOTAL, precompiled=True)
    os.makedirs(OUTDIR, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"no_table": NO_TABLE, "rows": results, "summary": lines,
                   "seconds": time.time() - t0}, f, indent=1)
    print(f"({time.time() - t0:.0f} s) wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
