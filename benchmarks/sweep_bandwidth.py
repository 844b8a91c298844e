"""Sweep of the bandwidth variants of the large memory-bound kernels, against torch (H200).

    PYTHONPATH=src python3 benchmarks/sweep_bandwidth.py [--full] [--groups=mem,red,red32,norm]
        [OUTDIR]

  mem  torch's copy on torch-allocated and on nbx-allocated buffers beside nbx's copy and neg
       (64M f32): whether a gap to torch is the kernel's or the memory's.
  red  REDUCE_VARIANTS below: kernels/reduction.py's 16-bit tiles (CONFIG16) and PIPE set
       whole ("default" = the shipped CONFIG16/PIPE): sum bf16 (32768,4096) dim=-1 (pipe*/row*
       variants) and dim=0 (col* variants); --full: every variant on both.
  red32  fp32 last-dim sums / amax: CONFIG's tiles ("base") against PIPE at 2, 4, 8 programs
       an SM ("default" = the shipped PIPE, 4).
  norm kernels/norm.py tiles through _OVERRIDE (BLOCK_R x num_warps; "default" = the rule):
       layer_norm bf16 (16384,4096) weight+bias, rms_norm bf16 same shape.
The flat element-wise kernel's variants (32/64 bytes a thread, 1-2 warps, an unmasked body,
PDL, big blocks, persistent grids, cache and eviction hints), eviction hints and a prefetching
column loop for the reductions, and persistent / one-reduction norms lost on the H200
(docs/design/elementwise.md, docs/design/reductions-and-sort.md) and are out of the package;
the git history has their sweeps.
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
ROWS: list[dict] = []
T0 = time.time()

import torch  # noqa: E402  (the reference only)

import nbxtensor as nbx  # noqa: E402
from nbxtensor.kernels import norm as NK  # noqa: E402
from nbxtensor.kernels import reduction as RK  # noqa: E402

# the red group's variants: each replaces kernels/reduction.py's 16-bit tiles (CONFIG16["cuda"])
# and PIPE whole (PIPE None unless given); "default" is the shipped pair
REDUCE_VARIANTS = {
    "base": {},                                                 # CONFIG's tiles, no PIPE
    "pipe4": {"PIPE": {"per_sm": 4}},
    "pipe2_r4k_w8": {"PIPE": {"per_sm": 2}, "row_tile": 4096, "row_warps": 8},
    "pipe4_r4k_w4": {"PIPE": {"per_sm": 4}, "row_tile": 4096, "row_warps": 4},
    "pipe8_r4k_w4": {"PIPE": {"per_sm": 8}, "row_tile": 4096, "row_warps": 4},
    "pipe2": {"PIPE": {"per_sm": 2}},
    "row16k_w16": {"row_tile": 16384, "row_warps": 16},        # 4 rows a program, 32/thread
    "row4k_w4": {"row_tile": 4096, "row_warps": 4},            # 1 row a program, 32/thread
    "row8k_w16": {"row_tile": 8192, "row_warps": 16},          # 16/thread, more threads
    "row4k_w8": {"row_tile": 4096, "row_warps": 8},            # 1 row, 16/thread
    "col_t16": {"target_programs_per_sm": 16},                 # dim=0: more, shorter programs
    "col_t24": {"target_programs_per_sm": 24},
    "col_t32": {"target_programs_per_sm": 32},
    "col_t4": {"target_programs_per_sm": 4},
    "col_k512_w16": {"col_block_k": 512, "col_tile": 16384, "col_warps": 16},
    "col_k128_w4": {"col_block_k": 128, "col_tile": 4096, "col_warps": 4},
    "col_4k_w4_t16": {"col_tile": 4096, "col_warps": 4, "target_programs_per_sm": 16},
}
_SHIPPED = (RK.PIPE, dict(RK.CONFIG16["cuda"]))


def set_reduce(v):
    """A REDUCE_VARIANTS name (or a dict of the same form) into kernels/reduction.py's PIPE
    and CONFIG16["cuda"]; "default" or None: the shipped pair. Drops the cached plans."""
    if v in (None, "default"):
        RK.PIPE, RK.CONFIG16["cuda"] = _SHIPPED[0], dict(_SHIPPED[1])
    else:
        v = dict(REDUCE_VARIANTS[v]) if isinstance(v, str) else dict(v)
        RK.PIPE = v.pop("PIPE", None)
        RK.CONFIG16["cuda"] = v
    RK._plan.cache_clear()

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
    rows = [k for k in REDUCE_VARIANTS if k.startswith(("pipe", "row"))]
    cols = [k for k in REDUCE_VARIANTS if k.startswith("col")]
    every = [k for k in REDUCE_VARIANTS if k != "base"]
    case("red", "sum bf16 (32768,4096) dim=-1", t.numel() * 2, bw, lambda: t.sum(-1),
         common + (every if FULL else rows), set_reduce, lambda: x.sum(-1))
    case("red", "sum bf16 (32768,4096) dim=0", t.numel() * 2, bw, lambda: t.sum(0),
         common + (every if FULL else cols), set_reduce, lambda: x.sum(0))
    set_reduce(None)


def sweep_red32(bw):
    """fp32 last-dim reductions: CONFIG's tiles (~0.98-0.99x torch on the H200) against the
    persistent pipelined row kernel at 2, 4 or 8 programs an SM (PIPE only16=False; shipped
    at 4)."""
    t = torch.randn(16384, 4096, device="cuda")
    x = to_nbx(t)
    variants = {"default": None, "base": 0, "pipe2f": 2, "pipe4f": 4, "pipe8f": 8}

    def apply(v):
        k = variants[v]
        set_reduce(None if k is None else {} if k == 0 else
                   {"PIPE": {"per_sm": k, "only16": False}})

    case("red32", "sum f32 (16384,4096) dim=-1", t.numel() * 4, bw, lambda: t.sum(-1),
         list(variants), apply, lambda: x.sum(-1), tol=1e-4)
    case("red32", "amax f32 (16384,4096) dim=-1", t.numel() * 4, bw, lambda: t.amax(-1),
         list(variants), apply, lambda: x.amax(-1), exact=True)
    t2 = torch.randn(2048, 32000, device="cuda")
    x2 = to_nbx(t2)
    case("red32", "sum f32 (2048,32000) dim=-1", t2.numel() * 4, bw, lambda: t2.sum(-1),
         list(variants), apply, lambda: x2.sum(-1), tol=1e-4)
    set_reduce(None)


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
                  ("norm", sweep_norm)):
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
    if failures:
        print(f"FAILED groups: {failures}")
    print(f"({time.time() - T0:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
