"""nbx.fft against torch.fft (cuFFT) in the same run, on cuda.

    python benchmarks/bench_fft.py [--quick] [--device cuda] [--reps 20] [--out DIR]

Issue 24's table: batched complex64 1-D FFTs of 2**10 .. 2**20 points (2**24 points per
call: 128 MB in, 128 MB out), non-powers of two (1000, 4095, 3**9, the prime 65537), rfft,
2-D 1024 x 1024, and the STFT of 30 s of 16 kHz audio as Whisper takes it (n_fft 400,
hop 160, periodic Hann), one signal and a batch of 8. Prints ms per call, torch's ms,
the ratio torch / nbx (>= 1 means faster than cuFFT; the issue asks >= 0.7 for powers of
two, >= 0.5 otherwise, >= 1 for the STFT), the relative error against torch's result and
the seconds of the first call (kernel compiles included);
writes bench_fft.json to --out (default $OUT, else the working directory). Without torch
(or without a GPU for it) the reference columns are skipped, with a line saying so.
--quick keeps a subset of the table and 5 repetitions (the first call of every case
compiles its kernels; Triton's disk cache makes later runs faster).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import nbxtensor as nbx


def _time(fn, sync, reps, first=None):
    t0 = time.perf_counter()
    fn()
    sync()
    if first is not None:
        first.append(time.perf_counter() - t0)     # compiles included
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps * 1e3


def _cases(quick):
    pts = 2 ** 24
    # --quick: every kernel path once (on-chip, four-step, fused and four-step Bluestein,
    # half-length rfft, strided 2-D), few enough kernels that compiling them stays short
    pow2 = (10, 12, 16, 20) if quick else range(10, 21)
    cases = [("fft", (pts // 2 ** k, 2 ** k), "pow2") for k in pow2]
    others = (1000, 65537) if quick else (1000, 4095, 3 ** 9, 65537)
    cases += [("fft", (max(1, pts // n // 2), n), "other") for n in others]
    rl = (1024,) if quick else (1024, 4096, 2 ** 16, 2 ** 20)
    cases += [("rfft", (pts // n, n), "pow2") for n in rl]
    if not quick:
        cases += [("rfft", (pts // 2 // 1000, 1000), "other")]
    cases += [("fft2", (16, 1024, 1024), "pow2")]
    if not quick:
        cases += [("ifft", (pts // 4096, 4096), "pow2"), ("irfft", (pts // 2049, 2049), "pow2")]
    return cases


def _precompile(calls):
    """Compile the FFT kernels every case will launch in a process pool first (best effort):
    each call runs once with kernels.fft's launch replaced by a recorder (no kernel runs),
    then benchmarks/_common.compile_in_pool fills Triton's disk cache in parallel."""
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _common import compile_in_pool
        from nbxtensor.backends.cuda import launcher as L
        from nbxtensor.kernels import fft as K
    except Exception as e:  # noqa: BLE001
        print(f"precompile skipped ({type(e).__name__}: {e})")
        return
    jobs = {}
    real = K.launch

    def rec(kernel, grid, *args, **kwargs):
        sig, cx, attrs, opts, _ = L.bind(kernel, args, kwargs)
        cc = L._device_info(0)[0]
        jobs[repr((kernel.fn.__name__, sig, cx, attrs, opts, cc))] = (
            kernel.fn.__module__, kernel.fn.__name__, sig, cx, attrs, opts, cc)
    K.launch = rec
    try:
        for fn in calls:
            try:
                fn()
            except Exception as e:  # noqa: BLE001
                print(f"precompile: {type(e).__name__}: {str(e)[:80]}")
    finally:
        K.launch = real
    compile_in_pool(jobs.values(), "fft kernels precompiled")


def _load_torch(device):
    try:
        import torch
    except ImportError:
        print("torch is not installed: the torch.fft reference columns are skipped")
        return None
    if not torch.cuda.is_available() or not device.startswith("cuda"):
        print("torch has no cuda device here: the torch.fft reference columns are skipped")
        return None
    return torch


def _rel_err(mine, ref):
    ref = np.asarray(ref)
    return float(np.abs(np.asarray(mine) - ref).max() / max(np.abs(ref).max(), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT") or ".")
    ap.add_argument("--no-precompile", action="store_true")
    args = ap.parse_args()
    reps = args.reps or (5 if args.quick else 20)
    torch = _load_torch(args.device)
    sync = nbx.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    tsync = torch.cuda.synchronize if torch is not None else (lambda: None)
    g = np.random.default_rng(0)
    rows = []
    t_start = time.perf_counter()
    if args.device.startswith("cuda") and not args.no_precompile:
        calls = []
        for op, shape, _ in _cases(args.quick):
            dt = np.float32 if op == "rfft" else np.complex64
            calls.append(lambda op=op, shape=shape, dt=dt: getattr(nbx.fft, op)(
                nbx.empty(shape, dtype=nbx.float32 if dt is np.float32 else nbx.complex64,
                          device=args.device)))
        for batch in (1, 8):
            calls.append(lambda batch=batch: nbx.stft(
                nbx.zeros((batch, 480000), device=args.device), 400, 160,
                window=nbx.hann_window(400, device=args.device), return_complex=True))
        _precompile(calls)
    print(f"{'op':6s} {'shape':22s} {'class':5s} {'nbx ms':>9s} {'torch ms':>9s} {'ratio':>6s}"
          f" {'rel err':>9s} {'1st s':>6s}", flush=True)
    for op, shape, cls in _cases(args.quick):
        if op == "irfft":
            a = (g.standard_normal(shape) + 1j * g.standard_normal(shape)).astype(np.complex64)
            a[..., 0] = a[..., 0].real
            a[..., -1] = a[..., -1].real
        elif op == "rfft":
            a = g.standard_normal(shape).astype(np.float32)
        else:
            a = (g.standard_normal(shape) + 1j * g.standard_normal(shape)).astype(np.complex64)
        x = nbx.tensor(a, device=args.device)
        f = getattr(nbx.fft, op)
        first = []
        ms = _time(lambda: f(x), sync, reps, first)
        row = {"op": op, "shape": list(shape), "class": cls, "nbx_ms": ms, "first_s": first[0]}
        if torch is not None:
            tx = torch.from_numpy(a).cuda()
            tf = getattr(torch.fft, op)
            tms = _time(lambda: tf(tx), tsync, reps)
            row.update(torch_ms=tms, ratio=tms / ms,
                       rel_err=_rel_err(f(x).numpy(), tf(tx).cpu().numpy()))
            del tx
        rows.append(row)
        _print(row)
        del x
    rows += _stft_rows(args, torch, sync, tsync, g, reps)
    total = time.perf_counter() - t_start
    print(f"total {total:.1f} s", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_fft.json")
    with open(path, "w") as fh:
        json.dump({"device": args.device, "reps": reps, "quick": args.quick,
                   "torch": None if torch is None else torch.__version__, "rows": rows,
                   "seconds": total}, fh, indent=1)
    print(f"wrote {path}")


def _print(row):
    line = (f"{row['op']:6s} {str(tuple(row['shape'])):22s} {row['class']:5s} "
            f"{row['nbx_ms']:9.3f}")
    if "torch_ms" in row:
        line += f" {row['torch_ms']:9.3f} {row['ratio']:6.2f} {row['rel_err']:9.2e}"
    else:
        line += f" {'-':>9s} {'-':>6s} {'-':>9s}"
    print(line + f" {row['first_s']:6.1f}", flush=True)


def _stft_rows(args, torch, sync, tsync, g, reps):
    """STFT of 30 s of 16 kHz audio (Whisper's framing), one signal and a batch of 8."""
    rows = []
    for batch in (1, 8):
        a = (0.1 * g.standard_normal((batch, 480000))).astype(np.float32)
        x = nbx.tensor(a, device=args.device)
        w = nbx.hann_window(400, device=args.device)

        def mine():
            return nbx.stft(x, 400, 160, window=w, return_complex=True)
        first = []
        ms = _time(mine, sync, reps, first)
        row = {"op": "stft", "shape": list(a.shape), "class": "stft", "nbx_ms": ms,
               "first_s": first[0]}
        if torch is not None:
            tx, tw = torch.from_numpy(a).cuda(), torch.hann_window(400, device="cuda")

            def ref():
                return torch.stft(tx, 400, 160, window=tw, return_complex=True)
            tms = _time(ref, tsync, reps)
            row.update(torch_ms=tms, ratio=tms / ms,
                       rel_err=_rel_err(mine().numpy(), ref().cpu().numpy()))
        rows.append(row)
        _print(row)
    return rows


if __name__ == "__main__":
    main()
