"""Host <-> device copies of NumPy data: nbxtensor's paths against torch's, in one run.

Rows per size (1, 16, 256 MiB of float32; GB/s = 10^9 bytes/s, median of the reps, each
rep synchronised; the first nbx pageable call of the process is reported apart: it pins
the staging ring):

  torch pageable         torch.from_numpy(a).to("cuda")
  torch pinned           pinned.to("cuda", non_blocking=True) + synchronize (pinned made
                         outside the timing, torch.Tensor.pin_memory)
  nbx tensor(a)          nbx.tensor(a, device="cuda")           (the staged pageable path)
  nbx .to(cuda)          nbx.from_numpy(a).to("cuda")
  nbx pinned             p.to("cuda", non_blocking=True) + synchronize (p = pin_memory())
  nbx pinned blocking    p.to("cuda")
  torch / nbx d2h        t.cpu() / t.numpy() (pageable destination)
  nbx d2h pinned         t.to("cpu", non_blocking=True) + synchronize

--sweep: then from_numpy(a).to("cuda") under the staged copy's constants
(backends/cuda/storage.py): chunk size x buffers x fill threads at 256 MiB, the number of
chunks (STAGE_SPLIT) at 16 MiB, and staged against the driver's copy (STAGE_MIN_BYTES) at
1, 2 and 4 MiB; torch pageable beside each.

--mini: only the few rows that set the defaults (fill threads at 256 MiB, chunk count at
16 MiB, staged/driver at 1 and 4 MiB), in a few seconds.

Every nbx result is compared with the source. Usage:
  PYTHONPATH=src python3 benchmarks/bench_transfer.py [--sweep | --mini] [--quick] [OUT_DIR]
Writes bench_transfer.json to OUT_DIR (default $OUT or .).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

MiB = 1 << 20


def _timed(fn, reps, sync):
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
        del out
    return statistics.median(times)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _check(got, want, label):
    g = got.numpy() if hasattr(got, "numpy") else got
    if not np.array_equal(np.asarray(g).view(np.uint8), want.view(np.uint8)):
        raise AssertionError(f"{label}: the copy differs from its source")


def _array(size, seed):
    return np.random.default_rng(seed).random(size // 4, dtype=np.float32)


def _rows_for(a, reps, nbx, torch):
    size = a.nbytes
    rows = []
    sync = nbx.cuda.synchronize

    def row(label, fn, sync_fn=sync, check=None):
        try:
            s = _timed(fn, reps, sync_fn)
            if check is not None:
                _check(check(), a, label)
        except Exception as e:  # noqa: BLE001 - report the row and go on with the rest
            print(f"{label} ({size / MiB:.0f} MiB) failed: {type(e).__name__}: {e}", flush=True)
            return
        rows.append({"size_mib": size / MiB, "path": label, "ms": s * 1e3,
                     "gb_s": size / s / 1e9})

    if torch is not None:
        tsync = torch.cuda.synchronize
        row("torch pageable", lambda: torch.from_numpy(a).to("cuda"), tsync)
        tp = torch.from_numpy(a).pin_memory()
        row("torch pinned", lambda: tp.to("cuda", non_blocking=True), tsync)
        tt = torch.from_numpy(a).to("cuda")
        row("torch d2h", lambda: tt.cpu(), tsync)
        del tp, tt
    row("nbx tensor(a)", lambda: nbx.tensor(a, device="cuda"),
        check=lambda: nbx.tensor(a, device="cuda"))
    row("nbx .to(cuda)", lambda: nbx.from_numpy(a).to("cuda"))
    p = nbx.from_numpy(a).pin_memory()
    row("nbx pinned", lambda: p.to("cuda", non_blocking=True),
        check=lambda: p.to("cuda", non_blocking=True))
    row("nbx pinned blocking", lambda: p.to("cuda"))
    t = nbx.tensor(a, device="cuda")
    row("nbx d2h", lambda: t.numpy(), check=lambda: t.numpy())

    def d2h_pinned():
        h = t.to("cpu", non_blocking=True)
        nbx.cuda.synchronize()
        return h
    row("nbx d2h pinned", lambda: t.to("cpu", non_blocking=True), check=d2h_pinned)
    return rows


def _cold_first_call(nbx, a):
    """The first staged copy of the process pins the ring: timed once, before anything else."""
    nbx.cuda.synchronize()
    t0 = time.perf_counter()
    nbx.tensor(a, device="cuda")
    nbx.cuda.synchronize()
    s = time.perf_counter() - t0
    return {"size_mib": a.nbytes / MiB, "path": "nbx tensor(a), first call (pins the ring)",
            "ms": s * 1e3, "gb_s": a.nbytes / s / 1e9}


def _config_rows(nbx, torch, a, reps, settings, label):
    """GB/s of from_numpy(a).to('cuda') under each {storage constant: value} of `settings`."""
    from nbxtensor.backends.cuda import storage
    size = a.nbytes
    rows = []
    if torch is not None:
        s = _timed(lambda: torch.from_numpy(a).to("cuda"), reps, torch.cuda.synchronize)
        rows.append({"config": f"{label}: torch pageable", "gb_s": size / s / 1e9})
    names = sorted({k for st in settings for k in st})
    saved = {k: getattr(storage, k) for k in names}
    try:
        for st in settings:
            for k, v in saved.items():
                setattr(storage, k, st.get(k, v))
            nbx.from_numpy(a[:1 << 20]).to("cuda")             # the ring for this setting
            s = _timed(lambda: nbx.from_numpy(a).to("cuda"), reps, nbx.cuda.synchronize)
            desc = ", ".join(f"{k}={v >> 20 if k.endswith('BYTES') or k.endswith('CHUNK') else v}"
                             f"{' MiB' if k.endswith('BYTES') or k.endswith('CHUNK') else ''}"
                             for k, v in st.items())
            rows.append({"config": f"{label}: {desc}", **{k: v for k, v in st.items()},
                         "gb_s": size / s / 1e9})
            print(f"{rows[-1]['config']:<72} {rows[-1]['gb_s']:7.2f} GB/s", flush=True)
    finally:
        for k, v in saved.items():
            setattr(storage, k, v)
    _check(nbx.from_numpy(a).to("cuda"), a, label)
    return rows


def _sweep(nbx, torch, reps, quick, big):
    """The staged copy's constants: chunk x buffers x fill threads at 256 MiB, the number of
    chunks at 16 MiB, staged against the driver's copy at 1-4 MiB."""
    chunks = (8, 16, 32) if quick else (4, 8, 16, 32)
    buffers = (2, 3) if quick else (2, 3, 4)
    threads = (4, 8, 12) if quick else (2, 4, 8, 12, 16)
    rows = _config_rows(nbx, torch, big, 3, [
        {"STAGE_CHUNK_BYTES": c * MiB, "STAGE_BUFFERS": b, "FILL_THREADS": th}
        for c in chunks for b in buffers for th in threads], "256 MiB")
    mid = _array(16 * MiB, 3)
    rows += _config_rows(nbx, torch, mid, reps, [
        {"STAGE_SPLIT": sp, "STAGE_MIN_CHUNK": 1 * MiB, "FILL_THREADS": th}
        for sp in (1, 2, 4, 8) for th in (4, 8)], "16 MiB")
    for n in (1, 2, 4):
        small = _array(n * MiB, 4 + n)
        rows += _config_rows(nbx, torch, small, reps, [
            {"STAGE_MIN_BYTES": 0}, {"STAGE_MIN_BYTES": 1 << 40}], f"{n} MiB staged/driver")
    return rows


def _mini(nbx, torch):
    """The few numbers that set the defaults, in a few seconds: 256 MiB by fill threads, 16 MiB
    by chunk count, 1 and 4 MiB staged against the driver's copy."""
    big = _array(256 * MiB, 1)
    nbx.from_numpy(big).to("cuda")                                  # ring, allocator warm
    rows = _config_rows(nbx, torch, big, 3, [
        {"FILL_THREADS": 4}, {"FILL_THREADS": 8}, {"FILL_THREADS": 8, "STAGE_CHUNK_BYTES": 16 * MiB},
        {"FILL_THREADS": 12, "STAGE_CHUNK_BYTES": 32 * MiB}], "256 MiB")
    rows += _config_rows(nbx, torch, _array(16 * MiB, 3), 5, [
        {"STAGE_SPLIT": sp, "FILL_THREADS": th} for sp in (1, 4) for th in (4, 8)], "16 MiB")
    for n in (1, 4):
        rows += _config_rows(nbx, torch, _array(n * MiB, 4 + n), 5, [
            {"STAGE_MIN_BYTES": 0}, {"STAGE_MIN_BYTES": 1 << 40}], f"{n} MiB staged/driver")
    for r in rows:
        if "torch" in r["config"]:
            print(f"{r['config']:<72} {r['gb_s']:7.2f} GB/s")
    return rows


def main(argv):
    sweep, quick = "--sweep" in argv, "--quick" in argv
    args = [x for x in argv if not x.startswith("--")]
    out_dir = args[0] if args else os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    import nbxtensor as nbx
    if not nbx.cuda.is_available():
        print("no CUDA device:", nbx.cuda.availability()[1])
        return 1
    nbx.zeros(1, device="cuda")             # context and allocator up before any timing
    torch = _torch() if "--mini" not in argv else None     # (mini: no torch import time)
    if torch is not None:
        torch.zeros(1, device="cuda")
    if "--mini" in argv:
        with open(os.path.join(out_dir, "bench_transfer_mini.json"), "w") as f:
            json.dump(_mini(nbx, torch), f, indent=1)
        return 0
    reps = 5 if quick else 9
    big = _array(256 * MiB, 1)
    rows = [_cold_first_call(nbx, big)]
    for a in (_array(1 * MiB, 2), _array(16 * MiB, 3), big):
        rows += _rows_for(a, reps if a.nbytes < 256 * MiB else 3, nbx, torch)
    anchor = {r["size_mib"]: r["gb_s"] for r in rows if r["path"] == "torch pageable"}
    print(f"{'MiB':>5} {'path':<44} {'ms':>8} {'GB/s':>7} {'x torch pageable':>17}")
    for r in rows:
        x = r["gb_s"] / anchor[r["size_mib"]] if r["size_mib"] in anchor else float("nan")
        print(f"{r['size_mib']:5.0f} {r['path']:<44} {r['ms']:8.3f} {r['gb_s']:7.2f} {x:17.2f}")
    name = "bench_transfer.json"
    if sweep:
        rows = {"table": rows, "sweep": _sweep(nbx, torch, reps, quick, big)}
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
