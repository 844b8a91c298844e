"""Import time: `import nbxtensor` against `import numpy`, each in fresh interpreters, in one run.

    python3 benchmarks/bench_import.py [--n=N] [--json] [OUTDIR]

Each sample is a new interpreter that times its own import statement (perf_counter for wall
time, process_time for CPU time), so the interpreter's start-up is not counted. A row is the
minimum of N samples (default 10), the rows' samples taken in turn: on a shared machine the
minimum is the import without preemption. The children read bytecode from a private cache (`-X pycache_prefix`, filled by a
warm-up run), as an installed package does; the last row is nbxtensor's own modules compiled
from source with NumPy already loaded, which is what every import costs where
PYTHONDONTWRITEBYTECODE is set and src/ has no __pycache__.

Prints a table and the machine; --json also writes bench_import.json to OUTDIR (or $OUT, or
the current folder). The goal (issue 18): `import nbxtensor` < 0.3 s on the 2-core machine.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")
sys.path.insert(0, HERE)
from _common import out_dir  # noqa: E402

GOAL_S = 0.3
HEAVY = ("ml_dtypes", "triton", "torch", "jinja2", "tokenizers", "gguf")

# {pre}: untimed set-up; then the timed import; prints wall, cpu and the heavy modules loaded
_CHILD = """
import sys, time
{pre}
t0, c0 = time.perf_counter(), time.process_time()
import {mod}
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r}))
print(wall, cpu, ','.join(heavy) or '-')
"""


def _sample(mod, cache, pre=""):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.abspath(SRC)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    code = _CHILD.format(pre=pre, mod=mod, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-X", f"pycache_prefix={cache}", "-c", code],
                         env=env, capture_output=True, text=True, check=True)
    wall, cpu, heavy = out.stdout.split()
    return float(wall), float(cpu), heavy


def _rows(specs, cache, n):
    """Min and median of n samples per (label, module, set-up) spec, the specs interleaved
    so that a change in the machine's load reaches every row alike."""
    runs = {label: [] for label, _, _ in specs}
    for _ in range(n):
        for label, mod, pre in specs:
            runs[label].append(_sample(mod, cache, pre))
    return [{"row": label, "wall_s": min(r[0] for r in rs), "cpu_s": min(r[1] for r in rs),
             "median_wall_s": sorted(r[0] for r in rs)[n // 2], "heavy": rs[0][2]}
            for label, rs in runs.items()]


def _version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def main():
    n = next((int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--n=")), 10)
    machine = {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "load_before": os.getloadavg()[0],
               "python": platform.python_version(), "numpy": _version("numpy"),
               "ml_dtypes": _version("ml_dtypes"), "samples": n}
    with tempfile.TemporaryDirectory(prefix="bench_import_") as tmp:
        cache, empty = os.path.join(tmp, "cache"), os.path.join(tmp, "empty")
        _sample("nbxtensor", cache)                  # warm-up: fills the bytecode cache
        # the last: our modules from source, NumPy loaded first, no bytecode read or written
        rows = _rows([("import numpy", "numpy", ""),
                      ("import nbxtensor (NumPy included)", "nbxtensor", ""),
                      ("nbxtensor's own from source (NumPy in)", "nbxtensor",
                       f"import numpy; sys.pycache_prefix = {empty!r}; "
                       "sys.dont_write_bytecode = True")], cache, n)
    machine["load_after"] = os.getloadavg()[0]
    np_s, nbx_s = rows[0]["wall_s"], rows[1]["wall_s"]
    summary = {"ratio_nbx_numpy": nbx_s / np_s, "ratio_cpu": rows[1]["cpu_s"] / rows[0]["cpu_s"],
               "own_s": nbx_s - np_s,
               "goal_s": GOAL_S, "meets_goal": nbx_s < GOAL_S}

    print(f"{'':40s} {'wall min':>9s} {'median':>8s} {'cpu min':>8s}  heavy modules loaded")
    for r in rows:
        print(f"{r['row']:40s} {r['wall_s'] * 1e3:7.1f}ms {r['median_wall_s'] * 1e3:6.1f}ms "
              f"{r['cpu_s'] * 1e3:6.1f}ms  {r['heavy']}")
    print(f"nbxtensor / numpy = {summary['ratio_nbx_numpy']:.2f} wall, "
          f"{summary['ratio_cpu']:.2f} cpu  (nbxtensor's own "
          f"{summary['own_s'] * 1e3:.1f} ms; goal: import nbxtensor < {GOAL_S} s: "
          f"{'met' if summary['meets_goal'] else 'NOT met'})")
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()))
    if "--json" in sys.argv:
        d = out_dir()
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "bench_import.json")
        with open(path, "w") as f:
            json.dump({"rows": rows, "summary": summary, "machine": machine}, f, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
