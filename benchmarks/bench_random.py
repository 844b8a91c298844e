"""CPU benchmark: nbx.random's torch-identical MT19937 draws (rand, randn, randint, randperm,
normal_, nn.init.kaiming_uniform_) at 1M and 16M elements, against torch's CPU generator in
the same run when torch is importable (skipped otherwise).

    PYTHONPATH=src python3 benchmarks/bench_random.py [--quick] [OUTDIR]

Seconds a call: the best of a few calls, wall clock and process CPU time (on a shared machine
the CPU time is the steadier of the two). Prints a table and writes random_cpu.json to OUTDIR
(or $OUT, or the current folder). --quick: 1M only.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import nbxtensor as nbx  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


def _cases(lib, n):
    g = lib.Generator().manual_seed(0)
    f32, f64, i64 = lib.float32, lib.float64, lib.int64
    side = int(round(n ** 0.5))
    return {
        "rand f32": lambda: lib.rand(n, generator=g, dtype=f32),
        "rand f64": lambda: lib.rand(n, generator=g, dtype=f64),
        "randn f32": lambda: lib.randn(n, generator=g, dtype=f32),
        "randn f64": lambda: lib.randn(n, generator=g, dtype=f64),
        "randint [0, 1000)": lambda: lib.randint(0, 1000, (n,), generator=g, dtype=i64),
        "randperm": lambda: lib.randperm(n, generator=g),
        "normal_(0.5, 2) f32": lambda: lib.empty(n, dtype=f32).normal_(0.5, 2.0, generator=g),
        "kaiming_uniform_ f32": lambda: lib.nn.init.kaiming_uniform_(
            lib.empty(side, side, dtype=f32), a=5 ** 0.5, generator=g),
    }


def _time(fn, repeats):
    fn()                                      # warm-up (and the first twist's allocations)
    wall = cpu = float("inf")
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    quick = "--quick" in sys.argv
    out_dir = args[0] if args else os.environ.get("OUT", ".")
    res = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "torch": None if torch is None else torch.__version__, "rows": []}
    if torch is not None:
        torch.set_num_threads(1)              # NumPy runs on one core too
    print(f"{'op':22s} {'n':>9s} {'nbx wall s':>11s} {'nbx cpu s':>10s}"
          + ("" if torch is None else f" {'torch s':>9s} {'ratio':>7s}"))
    for n in (1 << 20,) if quick else (1 << 20, 1 << 24):
        repeats = 3 if n <= 1 << 20 else 1
        ours = _cases(nbx, n)
        theirs = _cases(torch, n) if torch is not None else {}
        for name, fn in ours.items():
            wall, cpu = _time(fn, repeats)
            row = {"op": name, "n": n, "nbx_wall_s": wall, "nbx_cpu_s": cpu}
            line = f"{name:22s} {n:9d} {wall:11.4f} {cpu:10.4f}"
            if name in theirs:
                tw, _ = _time(theirs[name], repeats)
                row["torch_wall_s"] = tw
                line += f" {tw:9.4f} {wall / tw:6.1f}x"
            res["rows"].append(row)
            print(line, flush=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "random_cpu.json"), "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
