"""Per-launch cost of a cached tiny kernel, from Python, side by side in one process.

    PYTHONPATH=src python3 benchmarks/bench_launch.py [--quick] [OUTDIR]     (OUTDIR or $OUT)

Rows (the same 1-block add kernel of 1024 float32 elements, launched N times in a loop,
then one synchronize; the figure is wall time / N, median over repeats, interleaved):

  floor (ctypes, argtypes)  bare ctypes cuLaunchKernel declared with argtypes, prepared
                            parameter buffer: the floor named in issue 3
  floor (ctypes, raw)       the same call through an argtypes-free binding (ctypes
                            objects passed as they are), which is what our launcher uses
  nbx.launch                ours: bind key + dict lookup + pack_into + raw cuLaunchKernel
  triton kernel[grid]       Triton 3.6's own launcher on torch tensors
  torch.add(out=)           torch eager

Goal (issue 3): nbx.launch <= 1.15x the floor, and below torch eager.
torch is imported only after our rows ran, for its own rows.
"""
from __future__ import annotations

import ctypes
import datetime
import json
import os
import platform
import statistics
import sys
import time

import triton
import triton.language as tl


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)


N_ELEM = 1024
BLOCK = 1024


def timed(fn, n: int, sync) -> float:
    """Microseconds per call of fn() over n calls, including one synchronize at the end."""
    sync()
    t0 = time.perf_counter()
    fn(n)
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def main(argv):
    quick = "--quick" in argv
    rest = [a for a in argv if not a.startswith("--")]
    outdir = rest[0] if rest else os.environ.get("OUT", ".")
    n_calls, repeats = (3000, 5) if quick else (20000, 9)

    import nbxtensor as nbx
    from nbxtensor.backends.cuda import driver as drv
    from nbxtensor.backends.cuda import launcher as L

    ok, why = drv.availability()
    if not ok:
        print(f"no CUDA device: {why}")
        return 1
    props = drv.device_properties(0)
    x = nbx.tensor([float(i) for i in range(N_ELEM)], device="cuda")
    y = nbx.ones(N_ELEM, device="cuda")
    out = nbx.empty(N_ELEM, device="cuda")
    launch = nbx.launch

    # warm up: compile (Triton's disk cache), load, prepare the entry
    launch(add_kernel, (1,), x, y, out, N_ELEM, BLOCK=BLOCK)
    nbx.cuda.synchronize()
    got = out.numpy()
    assert (got == [float(i) + 1 for i in range(N_ELEM)]).all(), "nbx.launch computed a wrong sum"

    entries = [e for e in L._state.entries.values() if getattr(e, "name", None) == "add_kernel"]
    assert len(entries) == 1, entries
    e = entries[0]
    decl = drv.fn("cuLaunchKernel")
    raw = drv.fn_raw("cuLaunchKernel")
    f_int, params, blk, shared = e.f.value, e.params, e.block, e.shared
    f_obj, s_obj = e.f, ctypes.c_void_p(0)

    def run_ours(n):
        for _ in range(n):
            launch(add_kernel, (1,), x, y, out, N_ELEM, BLOCK=BLOCK)

    def run_floor_decl(n):
        for _ in range(n):
            decl(f_int, 1, 1, 1, blk, 1, 1, shared, 0, params, None)

    def run_floor_raw(n):
        for _ in range(n):
            raw(f_obj, 1, 1, 1, blk, 1, 1, shared, s_obj, params, None)

    nsync = nbx.cuda.synchronize
    rows = {"floor (ctypes, argtypes)": (run_floor_decl, nsync),
            "floor (ctypes, raw)": (run_floor_raw, nsync),
            "nbx.launch": (run_ours, nsync)}
    before_alloc = nbx.cuda.memory_allocated() if hasattr(nbx.cuda, "memory_allocated") else None
    results = {k: [] for k in rows}
    for _ in range(repeats):
        for name, (fn, sync) in rows.items():
            results[name].append(timed(fn, n_calls, sync))
    after_alloc = nbx.cuda.memory_allocated() if hasattr(nbx.cuda, "memory_allocated") else None
    torch_before = "torch" in sys.modules

    # torch and Triton's own launcher (torch needed by Triton's runtime driver)
    versions = {"python": platform.python_version(), "triton": triton.__version__}
    try:
        import torch
        versions["torch"] = torch.__version__
        tx = torch.arange(N_ELEM, dtype=torch.float32, device="cuda")
        ty = torch.ones(N_ELEM, dtype=torch.float32, device="cuda")
        tout = torch.empty_like(tx)
        add_kernel[(1,)](tx, ty, tout, N_ELEM, BLOCK=BLOCK)
        torch.add(tx, ty, out=tout)
        torch.cuda.synchronize()

        def run_triton(n):
            k = add_kernel[(1,)]
            for _ in range(n):
                k(tx, ty, tout, N_ELEM, BLOCK=BLOCK)

        def run_torch(n):
            for _ in range(n):
                torch.add(tx, ty, out=tout)

        trows = {"triton kernel[grid]": (run_triton, torch.cuda.synchronize),
                 "torch.add(out=)": (run_torch, torch.cuda.synchronize)}
        for k in trows:
            results[k] = []
        for _ in range(repeats):
            for name, (fn, sync) in {**rows, **trows}.items():
                results[name].append(timed(fn, n_calls, sync))
    except ImportError as err:
        print(f"torch not available ({err}); torch and Triton rows skipped")

    med = {k: statistics.median(v) for k, v in results.items()}
    floor = med["floor (ctypes, argtypes)"]
    print(f"\nper-launch cost, {props['name']}, {n_calls} launches x {repeats} repeats (median)")
    print(f"{'':28s} {'us/launch':>10s} {'x floor':>8s}")
    for k, v in med.items():
        print(f"{k:28s} {v:10.2f} {v / floor:8.2f}")
    ratio = med["nbx.launch"] / floor
    verdict = {"ours_over_floor": ratio, "ours_over_raw_floor": med["nbx.launch"] / med["floor (ctypes, raw)"],
               "goal_floor_1.15x": ratio <= 1.15}
    if "torch.add(out=)" in med:
        verdict["ours_over_torch"] = med["nbx.launch"] / med["torch.add(out=)"]
        verdict["goal_below_torch"] = med["nbx.launch"] < med["torch.add(out=)"]
    print("\n" + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in verdict.items()))
    if before_alloc is not None:
        print(f"allocated bytes before/after our launches: {before_alloc} / {after_alloc}")

    report = {
        "benchmark": "launch", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "device": props["name"], "driver_version": drv.driver_version(), "versions": versions,
        "n_calls": n_calls, "repeats": repeats, "quick": quick, "kernel": "add 1024 fp32, grid (1,)",
        "median_us": med, "all_us": results, "verdict": verdict,
        "torch_imported_before_torch_rows": torch_before,
        "allocated_before_after": [before_alloc, after_alloc],
    }
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, "bench_launch.json")
    with open(path, "w") as fh:
        json.dump(report, fh, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
