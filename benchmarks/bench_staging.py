"""Host -> GPU weight upload: nbxtensor's pinned staging ring vs the plain copy vs torch.

Uploads tensors read from a memory-mapped file (page cache warm: the file was just
written) and reports MB/s (10^6 bytes/s):

  nbx Tensor.to (sync)        from_numpy(map slice).to("cuda") per tensor (the old path)
  nbx staging CxN Tt          io.staging.Uploader, N pinned buffers of C MiB, T fill threads
                              ("default" = the loaders' setting); pinned pool emptied before
                              each configuration, so `first` is a cold process's first load
                              (pinning included) and `best` a later load (pool warm)
  torch .to (pageable)        torch.from_numpy(map slice).to("cuda") per tensor
  torch pin_memory+async      one torch pinned buffer per tensor slice, non_blocking copies
                              (torch's caching host allocator: warm after the first rep)

Each upload is checked against the source (a sample of tensors compared in full).
Usage: PYTHONPATH=src python3 benchmarks/bench_staging.py [--quick] [OUT_DIR]
Writes bench_staging.json to OUT_DIR (default $OUT or .).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np


def _make_file(path, total_mib, rng):
    """A safetensors file of ~total_mib: a few big tensors and many small ones (model-like)."""
    import nbxtensor as nbx
    from nbxtensor.io.safetensors import save_file
    big = max(1, total_mib // 64)
    t = {f"big{i}": rng.integers(0, 2**31, (64 << 20) // 4, dtype=np.int32).view(np.float32)
         for i in range(big)}
    for i in range(200):
        t[f"small{i}"] = rng.standard_normal(int(rng.integers(1, 50_000))).astype(np.float32)
    save_file({k: nbx.from_numpy(v) for k, v in t.items()}, path)


def _check(out: dict, f, names):
    for n in names:
        got = out[n]
        got = got.cpu().numpy() if hasattr(got, "cpu") else got.numpy()
        if not np.array_equal(got.view(np.uint8), f.get_numpy(n).view(np.uint8)):
            raise AssertionError(f"upload mismatch in {n}")


def main(argv):
    quick = "--quick" in argv
    args = [a for a in argv if not a.startswith("--")]
    out_dir = args[0] if args else os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    import nbxtensor as nbx
    from nbxtensor.io.safetensors import SafetensorsFile
    from nbxtensor.io import staging
    from nbxtensor.io.staging import Uploader
    if not nbx.cuda.is_available():
        print("no CUDA device:", nbx.cuda.availability()[1])
        return 1
    rng = np.random.default_rng(0)
    total_mib = 256 if quick else 2048
    reps = 3 if quick else 4
    tmpdir = tempfile.mkdtemp(prefix="nbx_bench_staging_")
    path = os.path.join(tmpdir, "w.safetensors")
    _make_file(path, total_mib, rng)
    f = SafetensorsFile(path)
    names = f.keys()
    nbytes = f.nbytes()
    sample = [n for n in names if n.startswith("big")][:2] + names[-5:]
    rows = []

    def timed(label, fn, check=True, before=None):
        times = []
        if before is not None:
            before()
        for r in range(reps):
            nbx.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn()
            nbx.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            if check and r == 0:
                _check(out, f, sample)
            del out
        best = min(times)
        rows.append({"method": label, "bytes": nbytes, "seconds": best, "first_seconds": times[0],
                     "mb_per_s": nbytes / best / 1e6, "first_mb_per_s": nbytes / times[0] / 1e6})
        print(f"{label:<30} {nbytes / 2**20:8.0f} MiB {best * 1e3:9.1f} ms "
              f"{nbytes / best / 1e6:9.0f} MB/s   first {nbytes / times[0] / 1e6:7.0f} MB/s",
              flush=True)

    print(f"{'method':<30} {'size':>12} {'best':>12} {'rate':>14}")
    timed("nbx Tensor.to (sync)",
          lambda: {n: nbx.from_numpy(f.get_numpy(n)).to("cuda") for n in names})
    dflt = (staging.DEFAULT_CHUNK_BYTES >> 20, staging.DEFAULT_BUFFERS, staging.DEFAULT_THREADS)
    configs = [dflt + ("default",), dflt[:2] + (1, "")]
    if (os.cpu_count() or 1) >= 8 and dflt[2] != 8:
        configs.append(dflt[:2] + (8, ""))
    configs += [(c, b, dflt[2], "") for c, b in ((8, 2), (32, 3), (64, 4))]
    rates = {}
    for chunk, nbuf, thr, tag in configs:
        def staged(chunk=chunk, nbuf=nbuf, thr=thr):
            with Uploader("cuda", chunk_bytes=chunk << 20, num_buffers=nbuf, threads=thr) as up:
                out = {n: up.upload(f.get_numpy(n), n) for n in names}
            rates[(chunk, nbuf, thr)] = up.rate_mb_s     # the rate loaders report
            return out
        timed(f"nbx staging {chunk}MiBx{nbuf} {thr}t {tag}".rstrip(), staged,
              before=staging.release_pinned_memory)
    print(f"(uploader's own read-rate report, last rep of the default: "
          f"{rates[dflt]:.0f} MB/s)")
    staging.release_pinned_memory()
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        import warnings
        warnings.filterwarnings("ignore", message=".*non-writable.*")
        timed("torch .to (pageable)",
              lambda: {n: torch.from_numpy(f.get_numpy(n)).to("cuda") for n in names})

        def torch_pinned():
            out = {}
            for n in names:
                pin = torch.from_numpy(f.get_numpy(n)).pin_memory()
                out[n] = pin.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            return out
        timed("torch pin_memory+async", torch_pinned)
    res = {"quick": quick, "total_bytes": nbytes, "tensors": len(names), "rows": rows,
           "device": nbx.cuda.get_device_name(0), "default": {
               "chunk_mib": dflt[0], "buffers": dflt[1], "threads": dflt[2]},
           "cpu_count": os.cpu_count()}
    with open(os.path.join(out_dir, "bench_staging.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    f.close()
    os.remove(path)
    os.rmdir(tmpdir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
