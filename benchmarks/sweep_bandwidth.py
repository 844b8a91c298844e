"""Sweep of the bandwidth variants of the large memory-bound kernels, against torch (H200).

    PYTHONPATH=src python3 benchmarks/sweep_bandwidth.py [--full] [--groups=mem,red,red32,norm,small]
        [--variants=v16w4,v32w4,...] [OUTDIR]

  mem  torch's copy on torch-allocated and on nbx-allocated buffers beside nbx's copy and neg
       (64M f32): whether a gap to torch is the kernel's or the memory's.
  red  kernels/reduction.py REDUCE_VARIANTS (set_variant; 16-bit inputs; "default" = the
       shipped CONFIG16/PIPE): sum bf16 (32768,4096) dim=-1 (pipe*/row* variants) and dim=0
       (col* variants); --full: every variant on both.
  norm kernels/norm.py tiles through _OVERRIDE (BLOCK_R x num_warps; "default" = the rule):
       layer_norm bf16 (16384,4096) weight+bias, rms_norm bf16 same shape.
  small  (session 4; not in the default groups) kernels/elementwise.py FLAT_VARIANTS
       (set_flat_variant; "default" = the shipped _ew_flat_kernel rule, "old" = session 3's
       4096-element 8-warp block, "v16w4" the default's block through the variant kernel): copy / neg / exp / add f32 and add bf16, 256 MiB
       tensors. The kernels are compiled first in a spawn process pool (Triton's disk cache);
       --variants= limits the list.
Session 3 also swept the flat element-wise kernel (unmasked body, persistent grid, cache and
eviction hints, block sizes), eviction hints and a prefetching column loop for the
reductions, and persistent / one-reduction norms; all lost on the H200 (BENCHMARKS.md, runs
14-16) and were removed from the package.
Each variant's output is checked against torch's before it is timed; a variant that fails
to compile or to match is reported and skipped. GPU time: CUDA events over the calls
queued behind a sleep kernel (benchmarks/_common.py time_gpu), L2 flushed per batch, torch
timed in the same process. Prints one line per result as it goes, then a table
(variant, us, % of the copy bandwidth measured in this run, torch_time / our_time), and
writes sweep_bandwidth.json to OUTDIR (else $OUT, else the current directory).
Inputs are made by torch on the GPU and copied into nbx memory through
__cuda_array_interface__ views (both libraries use the primary context), so setup is fast.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import copy_bw, out_dir, time_gpu  # noqa: E402

FULL = "--full" in sys.argv
GROUPS = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--groups=")),
              ["mem", "red", "norm"])
# --variants=a,b: only these FLAT_VARIANTS (plus "default") in the small group
SMALL_ONLY = next((a.split("=", 1)[1].split(",") for a in sys.argv
                   if a.startswith("--variants=")), None)
ROWS: list[dict] = []
T0 = time.time()

if __name__ != "__mp_main__":     # the small group's spawn compile workers need no torch
    import torch  # noqa: E402  (the reference only)

import nbxtensor as nbx  # noqa: E402
from nbxtensor.kernels import norm as NK  # noqa: E402
from nbxtensor.kernels import reduction as RK  # noqa: E402

_TYPESTR = {"float32": "<f4", "bfloat16": "<i2", "float16": "<f2", "int32": "<i4"}


class _CAI:
    def __init__(self, t):
        isz = t.dtype.itemsize
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape), "typestr": _TYPESTR[t.dtype.name],
            "data": (t.data_ptr(), False), "version": 2,
            "strides": tuple(s * isz for s in t.stride())}


def as_torch(t):
    """A torch view of an nbx cuda tensor's memory (no copy; keep t alive while it is used)."""
    v = torch.as_tensor(_CAI(t), device="cuda")
    return v.view(torch.bfloat16) if t.dtype.name == "bfloat16" else v


def to_nbx(tt):
    n = nbx.empty(tuple(tt.shape), dtype=getattr(nbx, str(tt.dtype).split(".")[-1]),
                  device="cuda")
    as_torch(n).copy_(tt)
    torch.cuda.synchronize()
    return n


def t_us(fn):
    return time_gpu(fn, 10, repeats=5, flush=True) * 1e6


def close(got, ref, exact, tol):
    g = as_torch(got) if not isinstance(got, torch.Tensor) else got
    if g.shape != ref.shape:
        return f"shape {tuple(g.shape)} vs {tuple(ref.shape)}"
    if exact:
        ok = torch.equal(g, ref)
        return None if ok else "not bit-equal"
    e = ((g.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()
    return None if e <= tol else f"rel err {e:.2e} > {tol}"


def case(group, name, nbytes, bw, torch_fn, variants, apply, nbx_fn, exact=False, tol=2e-2):
    """Time torch, then each (variant name) after apply(name); returns {variant: row}."""
    ref = torch_fn()
    tt = t_us(torch_fn)
    print(f"[{time.time() - T0:5.0f}s] {group:4} {name:28} torch {tt:8.1f} us "
          f"{100 * nbytes / (tt * 1e-6) / bw:5.1f}% copy", flush=True)
    out = {}
    for v in variants:
        row = dict(group=group, case=name, variant=v, torch_us=tt)
        try:
            apply(v)
            got = nbx_fn()
            err = close(got, ref, exact, tol)
            del got
            if err:
                row.update(ok=False, error=err)
            else:
                us = t_us(nbx_fn)
                row.update(ok=True, us=us, pct_copy=100 * nbytes / (us * 1e-6) / bw,
                           ratio=tt / us)
        except Exception as e:  # a variant that fails to compile/run is skipped
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:200]}")
            traceback.print_exc(limit=2)
        ROWS.append(row)
        out[v] = row
        if row["ok"]:
            print(f"[{time.time() - T0:5.0f}s]      {'':28} {v:18} {row['us']:8.1f} us "
                  f"{row['pct_copy']:5.1f}% copy  x{row['ratio']:.3f}", flush=True)
        else:
            print(f"[{time.time() - T0:5.0f}s]      {'':28} {v:18} SKIPPED: {row['error']}",
                  flush=True)
    return out


def sweep_red(bw):
    t = torch.randn(32768, 4096, device="cuda").bfloat16()
    x = to_nbx(t)
    common = ["default", "base"]
    rows = [k for k in RK.REDUCE_VARIANTS if k.startswith(("pipe", "row"))]
    cols = [k for k in RK.REDUCE_VARIANTS if k.startswith("col")]

    def apply(v):
        RK.set_variant(None if v == "default" else v)

    every = [k for k in RK.REDUCE_VARIANTS if k != "base"]
    case("red", "sum bf16 (32768,4096) dim=-1", t.numel() * 2, bw, lambda: t.sum(-1),
         common + (every if FULL else rows), apply, lambda: x.sum(-1))
    case("red", "sum bf16 (32768,4096) dim=0", t.numel() * 2, bw, lambda: t.sum(0),
         common + (every if FULL else cols), apply, lambda: x.sum(0))
    RK.set_variant(None)


def sweep_red32(bw):
    """fp32 last-dim reductions (where session 3 kept CONFIG's tiles at ~0.98-0.99x torch)
    against the persistent pipelined row kernel opened to 4-byte inputs (PIPE only16=False)."""
    t = torch.randn(16384, 4096, device="cuda")
    x = to_nbx(t)
    variants = {"default": None, "pipe2f": 2, "pipe4f": 4, "pipe8f": 8}

    def apply(v):
        k = variants[v]
        RK.set_variant(None if k is None else {"PIPE": {"per_sm": k, "only16": False}})

    case("red32", "sum f32 (16384,4096) dim=-1", t.numel() * 4, bw, lambda: t.sum(-1),
         list(variants), apply, lambda: x.sum(-1), tol=1e-4)
    case("red32", "amax f32 (16384,4096) dim=-1", t.numel() * 4, bw, lambda: t.amax(-1),
         list(variants), apply, lambda: x.amax(-1), exact=True)
    t2 = torch.randn(2048, 32000, device="cuda")
    x2 = to_nbx(t2)
    case("red32", "sum f32 (2048,32000) dim=-1", t2.numel() * 4, bw, lambda: t2.sum(-1),
         list(variants), apply, lambda: x2.sum(-1), tol=1e-4)
    RK.set_variant(None)


def sweep_norm(bw):
    F = torch.nn.functional
    R, N = 16384, 4096
    tx = torch.randn(R, N, device="cuda").bfloat16()
    tw = torch.randn(N, device="cuda").bfloat16()
    tb = torch.randn(N, device="cuda").bfloat16()
    x, w, b = to_nbx(tx), to_nbx(tw), to_nbx(tb)
    tiles = {"default": None, "r1w16": (1, 16), "r1w8": (1, 8), "r1w4": (1, 4),
             "r2w16": (2, 16), "r2w8": (2, 8), "r4w16": (4, 16), "r4w8": (4, 8)}

    def apply(v):
        t = tiles[v]
        NK._OVERRIDE = None if t is None else {"BLOCK_R": t[0], "num_warps": t[1]}

    io = 2 * 2 * R * N
    case("norm", "layer_norm bf16 16384x4096", io, bw, lambda: F.layer_norm(tx, (N,), tw, tb),
         list(tiles), apply, lambda: nbx.layer_norm(x, (N,), w, b))
    case("norm", "rms_norm bf16 16384x4096", io, bw, lambda: F.rms_norm(tx, (N,), tw, 1e-6),
         list(tiles), apply, lambda: nbx.rms_norm(x, (N,), w, 1e-6))
    NK._OVERRIDE = None


def _small_cases():
    """(name, dtype, op, n, bytes moved) of the small-block sweep: 256 MiB tensors."""
    return [("copy f32 256MiB", "float32", "copy", 64 << 20, 2 * 256 << 20),
            ("neg f32 256MiB", "float32", "neg", 64 << 20, 2 * 256 << 20),
            ("exp f32 256MiB", "float32", "exp", 64 << 20, 2 * 256 << 20),
            ("add f32 256MiB", "float32", "add", 64 << 20, 3 * 256 << 20),
            ("add bf16 256MiB", "bfloat16", "add", 128 << 20, 3 * 256 << 20)]


def _small_call(op, x, y, out):
    if op == "copy":
        return out.copy_(x)
    if op == "add":
        return nbx.add(x, y)
    return getattr(nbx, op)(x)


def _small_precompile_worker(jobs):
    """Spawn-pool task: compile (not launch) the flat kernels of (variant, case index) jobs,
    so the sweep's own compiles are reads of Triton's disk cache."""
    from nbxtensor.autotune.screen import check_resources
    from nbxtensor.kernels import elementwise as EW

    def dry(kernel, grid, *args, **kwargs):
        check_resources(kernel, args, kwargs, 0)

    EW.launch = dry
    cases, ok, errs = _small_cases(), 0, []
    bufs = {}
    for v, i in jobs:
        _, dt, op, n, _ = cases[i]
        if dt not in bufs:
            d = getattr(nbx, dt)
            bufs[dt] = tuple(nbx.empty((n,), dtype=d, device="cuda") for _ in range(3))
        x, y, out = bufs[dt]
        try:
            _set_flat(EW, v)
            _small_call(op, x, y, out)
            ok += 1
        except Exception as e:  # noqa: BLE001 - the sweep reports what fails
            errs.append(f"{v}/{op}: {type(e).__name__}: {str(e)[:100]}")
    return ok, errs


def _set_flat(EW, v):
    """A small-group variant name -> elementwise.set_flat_variant ("default": None, the
    shipped _ew_flat_kernel rule)."""
    EW.set_flat_variant(None if v == "default" else v)


def _small_precompile(jobs, timeout_s=60):
    import concurrent.futures as cf
    import multiprocessing as mp
    workers = max(1, min(14, (os.cpu_count() or 2) - 2, len(jobs)))
    t0 = time.time()
    chunks = [jobs[i::workers] for i in range(workers)]
    ok, errs = 0, []
    try:
        with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            futs = [pool.submit(_small_precompile_worker, c) for c in chunks if c]
            done, pending = cf.wait(futs, timeout=timeout_s)
            for f in done:
                if f.exception() is None:
                    ok += f.result()[0]
                    errs += f.result()[1]
                else:
                    errs.append(repr(f.exception())[:200])
            for f in pending:
                f.cancel()
    except Exception as e:  # noqa: BLE001 - precompiling is an optimisation only
        errs.append(f"pool: {type(e).__name__}: {e}"[:200])
    print(f"[{time.time() - T0:5.0f}s] small: precompiled {ok}/{len(jobs)} in "
          f"{time.time() - t0:.0f} s" + (f"; errors {errs[:4]}" if errs else ""), flush=True)


def sweep_small(bw):
    """kernels/elementwise.py FLAT_VARIANTS (session 4: torch's shape, many small 128-thread
    programs; 16-byte vectors; PEEL, PDL, PERSIST) on copy / neg / exp / add f32 and add bf16,
    256 MiB tensors; "default" = the shipped _ew_flat_kernel rule, "old" = session 3's 4096 x
    8 warps block, "v16w4" = the default's block through the variant kernel (a control)."""
    from nbxtensor.kernels import elementwise as EW
    names = ["default"] + list(EW.FLAT_VARIANTS)
    if SMALL_ONLY:
        names = ["default"] + [k for k in SMALL_ONLY if k != "default"]
    cases = _small_cases()
    _small_precompile([(v, i) for i in range(len(cases)) for v in names])
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}

    def apply(v):
        _set_flat(EW, v)

    def one(name, dt, op, n, nbytes):
        ta = torch.randn(n, device="cuda").to(tdt[dt])
        tb = torch.randn(n, device="cuda").to(tdt[dt])
        tout = torch.empty_like(ta)
        x, y = to_nbx(ta), to_nbx(tb)
        out = nbx.empty((n,), dtype=getattr(nbx, dt), device="cuda")
        tfn = {"copy": lambda: tout.copy_(ta), "neg": lambda: torch.neg(ta),
               "exp": lambda: torch.exp(ta), "add": lambda: torch.add(ta, tb)}[op]
        case("small", name, nbytes, bw, tfn, names, apply,
             lambda: _small_call(op, x, y, out), exact=op != "exp", tol=1e-5)

    for c in cases:
        one(*c)
        torch.cuda.empty_cache()
    _set_flat(EW, "default")


def small_matrix():
    """The small group as variant x case: torch_us / us (>1: faster than torch), the worst
    case last (a default must not lose anywhere: copy/neg/exp and both adds)."""
    rows = [r for r in ROWS if r["group"] == "small"]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    names = list(dict.fromkeys(r["variant"] for r in rows))
    got = {(r["variant"], r["case"]): r for r in rows}
    short = [c.split(" 256")[0] for c in cases]
    print("\n== small: torch_us / us per case (%copy in brackets), min over the cases")
    print(f"{'variant':12}" + "".join(f"{c:>16}" for c in short) + f"{'min':>7}")
    for v in names:
        cells, ratios = [], []
        for c in cases:
            r = got.get((v, c))
            if r and r.get("ok"):
                cells.append(f"{r['ratio']:7.3f} ({r['pct_copy']:4.1f}%)")
                ratios.append(r["ratio"])
            else:
                cells.append(f"{'--':>16}")
        mn = f"{min(ratios):7.3f}" if len(ratios) == len(cases) else f"{'--':>7}"
        print(f"{v:12}" + "".join(f"{x:>16}" for x in cells) + mn)


def probe_memory(bw):
    """Is the flat kernels' gap to torch in the kernel or in the memory? torch's own copy on
    torch-allocated and on nbx-allocated buffers, beside nbx's copy (64M f32)."""
    n = 64 << 20
    ta, tb = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    na = to_nbx(ta)
    nb = nbx.empty((n,), dtype=nbx.float32, device="cuda")
    va, vb = as_torch(na), as_torch(nb)
    rows = [("torch copy, torch memory", lambda: tb.copy_(ta)),
            ("torch copy, nbx memory", lambda: vb.copy_(va)),
            ("torch neg, nbx memory", lambda: torch.neg(va, out=vb)),
            ("nbx copy_, nbx memory", lambda: nb.copy_(na)),
            ("nbx neg, nbx memory", lambda: nbx.neg(na, out=nb))]
    for name, fn in rows:
        us = t_us(fn)
        print(f"  mem  {name:28} {us:8.1f} us {100 * 8 * n / (us * 1e-6) / bw:5.1f}% copy "
              f"(ptrs {va.data_ptr() % (2 << 20):#x} / {ta.data_ptr() % (2 << 20):#x} mod 2 MiB)",
              flush=True)
        ROWS.append(dict(group="mem", case="probe", variant=name, us=us, ok=False,
                         error="probe row (not a variant)"))


def main():
    outdir = out_dir()
    bw = copy_bw() * 1e9      # _common.copy_bw is in GB/s; this file works in bytes/s
    print(f"copy bandwidth (torch, 1 GiB): {bw / 1e9:.0f} GB/s; groups {GROUPS}", flush=True)
    failures = []
    for g, fn in (("mem", probe_memory), ("red", sweep_red), ("red32", sweep_red32),
                  ("norm", sweep_norm),
                  ("small", sweep_small)):
        if g not in GROUPS:
            continue
        try:
            fn(bw * 1e0)
        except Exception:
            failures.append(g)
            traceback.print_exc()
        torch.cuda.empty_cache()
    best = {}
    for r in ROWS:
        if r.get("ok") and (r["case"] not in best or r["us"] < best[r["case"]]["us"]):
            best[r["case"]] = r
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "sweep_bandwidth.json"), "w") as f:
        json.dump({"copy_gbs": bw / 1e9, "full": FULL, "rows": ROWS, "failures": failures,
                   "best": best, "seconds": time.time() - T0}, f, indent=1)
    print(f"\n== bandwidth sweep (copy {bw / 1e9:.0f} GB/s; ratio = torch_us / us, >1 faster)")
    print(f"{'case':30} {'variant':18} {'us':>8} {'%copy':>6} {'ratio':>6}")
    for r in ROWS:
        if r.get("ok"):
            mark = " *" if best.get(r["case"]) is r else ""
            print(f"{r['case']:30} {r['variant']:18} {r['us']:8.1f} {r['pct_copy']:5.1f}% "
                  f"{r['ratio']:6.3f}{mark}")
        else:
            print(f"{r['case']:30} {r['variant']:18} SKIPPED {r.get('error', '')[:60]}")
    print("best per case:", {k: (v["variant"], round(v["ratio"], 3)) for k, v in best.items()})
    if "small" in GROUPS:
        small_matrix()
    if failures:
        print(f"FAILED groups: {failures}")
    print(f"({time.time() - T0:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
