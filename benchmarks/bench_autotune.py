"""Autotuning on the H200: cold sweep times, and tuned vs untuned vs torch speed.

    PYTHONPATH=src python3 benchmarks/bench_autotune.py [--quick] [OUTDIR]

Sections
  sweep    cold sweep (screen + time, empty cache) of the reference models' matmul/GEMV
           keys (SmolLM2-135M, all-MiniLM-L6-v2 linears at M in {1, 16, 128, 2048}, bf16):
           seconds per key, candidates passed / excluded / dropped.
  speed    the Ops-II benchmark shapes (bf16 4096^3 and 8192^3; Llama-1B linears at M in
           {1, 16, 128, 2048}; decode GEMVs): untuned (the kernels' rule), shipped table
           (if it has the key), tuned (after a sweep), torch -- all through `nbx.linear` /
           `torch.nn.functional.linear`, timed by the same method.
  generate (full run only, if the smollm2 model package is installed) cold-start of
           `nbx generate` with NBX_AUTOTUNE=0 vs with the shipped table.

Timing: CUDA events, a 256 MB L2 flush before each timed run, warm-up, median
(autotune/timing.py for nbx; the same recipe with torch's events for torch).
New keys stop being started after 500 s (50 s with --quick); the JSON lists those skipped.
The user cache is a temporary directory: nothing of yours is read or written.
JSON to OUTDIR/autotune.json (OUTDIR: argv, else $OUT, else .); the table last.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
os.environ["NBX_CACHE_DIR"] = tempfile.mkdtemp(prefix="nbx-bench-autotune-")

import torch  # noqa: E402  (the reference only)

import nbxtensor as nbx  # noqa: E402
from nbxtensor import autotune  # noqa: E402
from nbxtensor.autotune import cache  # noqa: E402
from nbxtensor.autotune.sweep import kernel_for, tune  # noqa: E402
from nbxtensor.autotune.timing import CudaTimer  # noqa: E402

QUICK = "--quick" in sys.argv
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
OUTDIR = ARGS[0] if ARGS else os.environ.get("OUT", ".")
DEV = nbx.device("cuda")
RESULTS = {"sweep": [], "speed": [], "generate": None, "errors": [], "skipped_by_deadline": []}
T_START = time.perf_counter()
DEADLINE_S = 50.0 if QUICK else 500.0    # stop starting new keys (a 10-minute command limit)


def _late(section, key) -> bool:
    if time.perf_counter() - T_START > DEADLINE_S:
        RESULTS["skipped_by_deadline"].append(dict(section=section, key=key))
        return True
    return False


def ref_model_keys():
    out = []
    tokens = (1, 128) if QUICK else (1, 16, 128, 2048)
    layers = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576),   # smollm2
              (384, 384), (1536, 384), (384, 1536)]                               # minilm
    if QUICK:
        layers = [(576, 576), (1536, 576)]
    for m in tokens:
        for n, k in layers:
            out.append((m, n, k))
    return out


def speed_keys():
    if QUICK:
        return [(4096, 4096, 4096), (1, 4096, 4096), (128, 8192, 2048)]
    ks = [(4096, 4096, 4096), (8192, 8192, 8192)]
    for m in (1, 16, 128, 2048):
        for n, k in [(2048, 2048), (512, 2048), (8192, 2048), (2048, 8192), (128256, 2048)]:
            ks.append((m, n, k))
    ks += [(1, 4096, 4096), (1, 14336, 4096), (1, 4096, 14336), (1, 576, 576)]
    return ks


def _cands(kern, key):
    """--quick: a slice of the space (the rule's config included) so compiles fit in 60 s."""
    if not QUICK:
        return None
    from nbxtensor.autotune.sweep import CASES
    case = CASES[kern](key, "bfloat16", DEV)
    full = case.candidates()
    sub = full[::max(1, len(full) // 5)]
    d = case.default_config()
    inside = autotune.get_tunable(kern).contains(d, "bfloat16")
    return sub + ([d] if inside and d not in sub else [])


def section_sweep():
    print("== cold sweeps (empty cache) ==", flush=True)
    for key in ref_model_keys():
        kern = kernel_for(key)
        if _late("sweep", key):
            continue
        t0 = time.perf_counter()
        try:
            e = tune(kern, key, dtype="bfloat16", device=DEV, budget_s=30.0,
                     candidates=_cands(kern, key))
        except Exception as err:  # noqa: BLE001 - report, go on
            RESULTS["errors"].append(dict(section="sweep", key=key, error=repr(err)))
            print(f"  {key}: FAILED {err!r}", flush=True)
            continue
        tm, sc = e["timing"], e["screen"]
        row = dict(kernel=kern, key=key, wall_s=round(time.perf_counter() - t0, 2),
                   screen_s=tm["screen_s"], candidates=sc["candidates"], passed=sc["passed"],
                   excluded=len(sc["excluded"]), dropped=len(tm["dropped"]),
                   best_us=tm["best"]["median_ms"] * 1e3,
                   default_us=(tm["default_ms"] or float("nan")) * 1e3, config=e["config"])
        RESULTS["sweep"].append(row)
        print(f"  {kern:6} {'x'.join(map(str, key)):<16} {row['wall_s']:7.1f} s  "
              f"{row['passed']}/{row['candidates']} passed, {row['excluded']} excluded, "
              f"{row['dropped']} dropped; best {row['best_us']:.1f} us vs default "
              f"{row['default_us']:.1f} us", flush=True)


def _torch_time(fn, reps=10, warmup=3):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    fn()
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        flush.fill_(len(ts) & 0xFF)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def _to_nbx(t):
    import ml_dtypes
    a = t.contiguous().cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return nbx.tensor(a, device="cuda")


def section_speed():
    print("== tuned vs untuned vs torch (bf16, nbx.linear) ==", flush=True)
    timer = CudaTimer(DEV)
    for (m, n, k) in speed_keys():
        if _late("speed", (m, n, k)):
            continue
        try:
            xt = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            wt = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            x, w = _to_nbx(xt), _to_nbx(wt)
            kern = kernel_for((m, n, k))
            fn = lambda: nbx.linear(x, w)  # noqa: E731
            with autotune.disabled():
                untuned = timer.measure(fn).median_ms
            shipped_cfg, src = autotune.lookup(kern, (m, n, k), dtype="bfloat16", device=DEV)
            shipped = timer.measure(fn).median_ms if shipped_cfg is not None else None
            t0 = time.perf_counter()
            e = tune(kern, (m, n, k), dtype="bfloat16", device=DEV, budget_s=30.0,
                     candidates=_cands(kern, (m, n, k)))
            sweep_s = time.perf_counter() - t0
            tuned = timer.measure(fn).median_ms
            y = nbx.linear(x, w).numpy().astype(np.float32)
            yt = torch.nn.functional.linear(xt, wt)
            err = float(np.max(np.abs(y - yt.float().cpu().numpy())) /
                        max(1e-6, float(yt.float().abs().max())))
            tt = _torch_time(lambda: torch.nn.functional.linear(xt, wt))
            flops, nbytes = 2 * m * n * k, 2 * (m * k + n * k + m * n)
            row = dict(kernel=kern, key=(m, n, k), untuned_us=untuned * 1e3,
                       shipped_us=shipped * 1e3 if shipped else None, shipped_src=src,
                       tuned_us=tuned * 1e3, torch_us=tt * 1e3, sweep_s=round(sweep_s, 1),
                       speedup=untuned / tuned, vs_torch=tt / tuned, max_rel_err_vs_torch=err,
                       tflops=flops / tuned / 1e9, tbps=nbytes / tuned / 1e9, config=e["config"])
            RESULTS["speed"].append(row)
            print(f"  {kern:6} {'x'.join(map(str, (m, n, k))):<18} untuned {untuned * 1e3:9.1f} "
                  f"tuned {tuned * 1e3:9.1f} torch {tt * 1e3:9.1f} us  x{row['speedup']:.2f} "
                  f"vs untuned, {row['vs_torch']:.2f} of torch speed; sweep {sweep_s:.0f} s",
                  flush=True)
            del x, w, xt, wt
        except Exception as err:  # noqa: BLE001
            RESULTS["errors"].append(dict(section="speed", key=(m, n, k), error=repr(err),
                                          tb=traceback.format_exc()[-2000:]))
            print(f"  {(m, n, k)}: FAILED {err!r}", flush=True)


def section_generate():
    """Cold start of `nbx generate` (fresh process): NBX_AUTOTUNE=0 vs the shipped table."""
    try:
        from nbxtensor.models import registry
        registry.resolve("smollm2")
    except Exception as err:  # noqa: BLE001
        RESULTS["generate"] = f"skipped: {err}"
        print(f"== generate: skipped ({err}) ==")
        return
    print("== nbx generate cold start ==", flush=True)
    res = {}
    for label, env in [("autotune off", {"NBX_AUTOTUNE": "0"}), ("shipped table", {})]:
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
        e = dict(os.environ, **env, NBX_CACHE_DIR=tempfile.mkdtemp(),
                 PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", "import sys; from nbxtensor.cli import main; "
                            "sys.exit(main(sys.argv[1:]))", "generate", "smollm2",
                            "--prompt", "Say hi.", "--max-new-tokens", "16", "--device", "cuda"],
                           env=e, capture_output=True, text=True, timeout=240)
        res[label] = dict(wall_s=round(time.perf_counter() - t0, 2), rc=p.returncode,
                          stderr_tail=p.stderr[-400:])
        print(f"  {label:14} {res[label]['wall_s']:6.1f} s (rc {p.returncode})", flush=True)
    RESULTS["generate"] = res


def main():
    t0 = time.perf_counter()
    print(f"device {autotune.device_identity(DEV)}, triton {cache.triton_version()}, "
          f"torch {torch.__version__}, quick={QUICK}", flush=True)
    section_sweep()
    section_speed()
    if not QUICK and time.perf_counter() - T_START < DEADLINE_S:
        section_generate()
    RESULTS["total_s"] = round(time.perf_counter() - t0, 1)
    os.makedirs(OUTDIR, exist_ok=True)
    with open(os.path.join(OUTDIR, "autotune.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    print("\nkernel  key                untuned_us  tuned_us  torch_us  tuned/untuned  of_torch")
    for r in RESULTS["speed"]:
        print(f"{r['kernel']:6}  {'x'.join(map(str, r['key'])):<18} {r['untuned_us']:10.1f} "
              f"{r['tuned_us']:9.1f} {r['torch_us']:9.1f} {r['speedup']:13.2f} {r['vs_torch']:9.2f}")
    print(f"skipped by the {DEADLINE_S:.0f} s deadline: {len(RESULTS['skipped_by_deadline'])} keys")
    print(f"errors: {len(RESULTS['errors'])}; total {RESULTS['total_s']} s; "
          f"JSON in {os.path.join(OUTDIR, 'autotune.json')}")


if __name__ == "__main__":
    main()
