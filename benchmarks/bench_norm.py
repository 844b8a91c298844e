"""softmax, layer_norm, rms_norm (and the fused add_rms_norm) on the H200 vs torch.

    PYTHONPATH=src python3 benchmarks/bench_norm.py [--quick] [--sweep-softmax] [OUTDIR]

Model shapes in bf16: rows x hidden for the norms (hidden 2048, 4096, 8192), attention-score
and vocabulary rows for softmax (N = 2048, 4096, 128256). Reports kernel time (CUDA events
after a spin kernel so the queue stays full; see bench_matmul.py), achieved GB/s (bytes
read + written once) against a device-to-device copy measured in the same run (goal >= 0.80
on large inputs), and the ratio to torch (goal >= 1). L2 is flushed before each batch.
torch's add_rms_norm is the unfused `h = x + r; rms_norm(h)`. JSON to OUTDIR/norm.json
(default: $OUT, else the current directory); the table last. `--sweep-softmax` also times
the single-pass softmax kernel at other (BLOCK_R, num_warps) on its large shapes
(kernels/softmax.py `_OVERRIDE`) and prints the best per shape.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402  (the reference only)

import nbxtensor as nbx  # noqa: E402
from _common import copy_bw, out_dir, recorder, time_gpu  # noqa: E402
from bench_matmul import rel_err, to_nbx  # noqa: E402

QUICK = "--quick" in sys.argv
OUTDIR = out_dir()
ROWS: list[dict] = []
record = recorder(ROWS)


def case(op, shape, nbx_fn, torch_fn, nbytes, bw, nbx_out, torch_out):
    inner = 10 if nbytes < (256 << 20) else 3
    t_n = time_gpu(nbx_fn, inner, flush=True)
    t_t = time_gpu(torch_fn, inner, flush=True)
    record(op=op, shape="x".join(map(str, shape)), nbx_gbs=nbytes / t_n / 1e9,
           torch_gbs=nbytes / t_t / 1e9, frac_copy=nbytes / t_n / 1e9 / bw, ratio=t_t / t_n,
           nbx_us=t_n * 1e6, torch_us=t_t * 1e6, err=rel_err(nbx_out(), torch_out()))


def sweep_softmax(bw):
    """softmax bf16 at large (R, N) under several row tiles; the rule first."""
    from nbxtensor.kernels import softmax as ks
    for R, N in [(16384, 2048), (16384, 4096)]:
        tx = torch.randn(R, N, device="cuda", dtype=torch.bfloat16)
        x = to_nbx(tx)
        ref = torch.softmax(tx, -1)
        best = None
        for cfg in [None] + [dict(BLOCK_R=r, num_warps=w) for r in (1, 2, 4) for w in (4, 8, 16)]:
            ks._OVERRIDE = cfg
            try:
                err = rel_err(nbx.softmax(x, -1), ref)
                if not err < 1e-2:
                    print(f"  softmax {R}x{N} {cfg}: wrong (err {err:.1e})")
                    continue
                t = time_gpu(lambda: nbx.softmax(x, -1), 3, flush=True)
            except Exception as e:  # noqa: BLE001 - a config that does not compile or fit
                print(f"  softmax {R}x{N} {cfg}: {type(e).__name__}: {e}")
                continue
            finally:
                ks._OVERRIDE = None
            frac = 4 * R * N / t / 1e9 / bw
            print(f"  softmax {R}x{N} {cfg or 'rule'}: {t * 1e6:.1f} us {100 * frac:.0f}% of copy",
                  flush=True)
            if best is None or t < best[0]:
                best = (t, cfg)
        print(f"softmax sweep {R}x{N}: best {best[1] or 'rule'} {best[0] * 1e6:.1f} us")


def main():
    t0 = time.time()
    bw = copy_bw()
    record(op="copy", shape="1GiB", nbx_gbs=bw)
    F = torch.nn.functional
    failures = []
    norm_shapes = [(2048, 2048), (16384, 4096)] if QUICK else \
        [(1, 2048), (2048, 2048), (8192, 4096), (16384, 8192), (4096, 2048)]
    soft_shapes = [(16384, 2048), (16, 128256), (1, 128256)] if QUICK else \
        [(32 * 2048, 2048), (16 * 4096, 4096), (1, 128256), (16, 128256), (128, 128256),
         (512, 128256)]
    for R, N in norm_shapes:
        try:
            tx = torch.randn(R, N, device="cuda", dtype=torch.bfloat16)
            tr = torch.randn(R, N, device="cuda", dtype=torch.bfloat16)
            tw = torch.randn(N, device="cuda", dtype=torch.bfloat16)
            tb = torch.randn(N, device="cuda", dtype=torch.bfloat16)
            x, r, w, b = (to_nbx(t) for t in (tx, tr, tw, tb))
            io = 2 * 2 * R * N
            case("layer_norm", (R, N), lambda: nbx.layer_norm(x, (N,), w, b),
                 lambda: F.layer_norm(tx, (N,), tw, tb), io, bw,
                 lambda: nbx.layer_norm(x, (N,), w, b), lambda: F.layer_norm(tx, (N,), tw, tb))
            case("rms_norm", (R, N), lambda: nbx.rms_norm(x, (N,), w, 1e-6),
                 lambda: F.rms_norm(tx, (N,), tw, 1e-6), io, bw,
                 lambda: nbx.rms_norm(x, (N,), w, 1e-6), lambda: F.rms_norm(tx, (N,), tw, 1e-6))

            def t_add():
                h = tx + tr
                return F.rms_norm(h, (N,), tw, 1e-6)
            case("add_rms_norm", (R, N), lambda: nbx.add_rms_norm(x, r, w, 1e-6), t_add,
                 2 * 4 * R * N, bw, lambda: nbx.add_rms_norm(x, r, w, 1e-6)[0], t_add)
        except Exception:
            failures.append(f"norm {R}x{N}")
            traceback.print_exc()
    for R, N in soft_shapes:
        try:
            tx = torch.randn(R, N, device="cuda", dtype=torch.bfloat16)
            x = to_nbx(tx)
            case("softmax", (R, N), lambda: nbx.softmax(x, -1), lambda: torch.softmax(tx, -1),
                 2 * 2 * R * N, bw, lambda: nbx.softmax(x, -1), lambda: torch.softmax(tx, -1))
            case("log_softmax", (R, N), lambda: nbx.log_softmax(x, -1, dtype=nbx.float32),
                 lambda: torch.log_softmax(tx, -1, dtype=torch.float32), 6 * R * N, bw,
                 lambda: nbx.log_softmax(x, -1, dtype=nbx.float32),
                 lambda: torch.log_softmax(tx, -1, dtype=torch.float32))
        except Exception:
            failures.append(f"softmax {R}x{N}")
            traceback.print_exc()
    if "--sweep-softmax" in sys.argv:
        sweep_softmax(bw)
    os.makedirs(OUTDIR, exist_ok=True)
    with open(os.path.join(OUTDIR, "norm.json"), "w") as f:
        json.dump({"quick": QUICK, "rows": ROWS, "failures": failures,
                   "seconds": time.time() - t0}, f, indent=1)
    print("\n== norm / softmax, bf16 (ratio = torch_time / nbx_time; %copy of the copy GB/s)")
    print(f"{'op':13} {'shape':>12} {'nbx GB/s':>9} {'torch':>7} {'ratio':>6} {'%copy':>6} "
          f"{'nbx us':>8} {'err':>8}")
    for r in ROWS:
        if r["op"] == "copy":
            print(f"{'copy':13} {r['shape']:>12} {r['nbx_gbs']:>9.0f}")
            continue
        print(f"{r['op']:13} {r['shape']:>12} {r['nbx_gbs']:>9.0f} {r['torch_gbs']:>7.0f} "
              f"{r['ratio']:>6.2f} {100 * r['frac_copy']:>5.0f}% {r['nbx_us']:>8.1f} {r['err']:>8.1e}")
    if failures:
        print(f"FAILED: {failures}")
    print(f"({time.time() - t0:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
