"""softmax, layer_norm, rms_norm (and the fused add_rms_norm) on the H200 vs torch.

    PYTHONPATH=src python3 benchmarks/bench_norm.py [--quick] [--sweep-softmax] [--sweep-norm] [OUTDIR]

Model shapes in bf16: rows x hidden for the norms (hidden 2048, 4096, 8192), attention-score
and vocabulary rows for softmax (N = 2048, 4096, 128256). Reports kernel time (CUDA events
after a spin kernel so the queue stays full; see bench_matmul.py), achieved GB/s (bytes
read + written once) against a device-to-device copy measured in the same run (goal >= 0.80
on large inputs), and the ratio to torch (goal >= 1). L2 is flushed before each batch.
torch's add_rms_norm is the unfused `h = x + r; rms_norm(h)`. JSON to OUTDIR/norm.json
(default: $OUT, else the current directory); the table last. `--sweep-softmax` also times
the single-pass softmax kernel at other (BLOCK_R, num_warps) on its large shapes
(kernels/softmax.py `_OVERRIDE`) and prints the best per shape; `--sweep-norm` the same for
rms_norm / layer_norm 16384 x 4096 in bf16, fp16 and fp32 (kernels/norm.py `_OVERRIDE`).
The norms run in bf16, fp16 and fp32, with weight (and bias), rms_norm also without.
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
SWEEP_NORM = "--sweep-norm" in sys.argv
NORM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
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


def sweep_norm(bw):
    """rms_norm (weight) and layer_norm (weight + bias) at 16384 x 4096 in every 16/32-bit
    dtype under (BLOCK_R, num_warps) tiles through kernels/norm.py `_OVERRIDE`; the rule
    first. Prints each tile's % of copy and ratio to torch, and the best per case."""
    from nbxtensor.kernels import norm as kn
    F = torch.nn.functional
    R, N = 16384, 4096
    tiles = [None] + [dict(BLOCK_R=r, num_warps=w) for r, w in
                      ((1, 4), (1, 8), (1, 16), (2, 4), (2, 8), (2, 16), (4, 8), (4, 16))]
    for dt, tdt in NORM_DTYPES.items():
        tx = torch.randn(R, N, device="cuda", dtype=tdt)
        tw = torch.randn(N, device="cuda", dtype=tdt)
        tb = torch.randn(N, device="cuda", dtype=tdt)
        x, w, b = to_nbx(tx), to_nbx(tw), to_nbx(tb)
        io = 2 * tx.element_size() * R * N
        for op, fn, ref in (
                ("rms_norm", lambda: nbx.rms_norm(x, (N,), w, 1e-6),
                 lambda: F.rms_norm(tx, (N,), tw, 1e-6)),
                ("layer_norm", lambda: nbx.layer_norm(x, (N,), w, b),
                 lambda: F.layer_norm(tx, (N,), tw, tb))):
            t_t = time_gpu(ref, 5, flush=True)
            best = None
            for cfg in tiles:
                kn._OVERRIDE = cfg
                try:
                    err = rel_err(fn(), ref())
                    if not err < 2e-2:
                        print(f"  {op} {dt} {cfg}: wrong (err {err:.1e})")
                        continue
                    t = time_gpu(fn, 5, flush=True)
                except Exception as e:  # noqa: BLE001 - a tile that does not compile or fit
                    print(f"  {op} {dt} {cfg}: {type(e).__name__}: {str(e)[:80]}")
                    continue
                finally:
                    kn._OVERRIDE = None
                print(f"  {op} {dt} {R}x{N} {cfg or 'rule'}: {t * 1e6:.1f} us "
                      f"{100 * io / t / 1e9 / bw:.0f}% of copy, {t_t / t:.2f}x torch", flush=True)
                if best is None or t < best[0]:
                    best = (t, cfg)
            print(f"norm sweep {op} {dt}: best {best[1] or 'rule'} {best[0] * 1e6:.1f} us "
                  f"({t_t / best[0]:.2f}x torch)", flush=True)


def main():
    t0 = time.time()
    bw = copy_bw()
    record(op="copy", shape="1GiB", nbx_gbs=bw)
    F = torch.nn.functional
    failures = []
    norm_shapes = [(2048, 2048, "bf16"), (16384, 4096, "bf16"), (16384, 4096, "fp16"),
                   (16384, 4096, "fp32")] if QUICK else \
        [(R, N, dt) for R, N in [(1, 2048), (2048, 2048), (8192, 4096), (16384, 8192),
                                 (4096, 2048), (16384, 4096)] for dt in ("bf16", "fp16", "fp32")]
    soft_shapes = [(16384, 2048), (16, 128256), (1, 128256)] if QUICK else \
        [(32 * 2048, 2048), (16 * 4096, 4096), (1, 128256), (16, 128256), (128, 128256),
         (512, 128256)]
    for R, N, dt in norm_shapes:
        try:
            tdt = NORM_DTYPES[dt]
            tx = torch.randn(R, N, device="cuda", dtype=tdt)
            tr = torch.randn(R, N, device="cuda", dtype=tdt)
            tw = torch.randn(N, device="cuda", dtype=tdt)
            tb = torch.randn(N, device="cuda", dtype=tdt)
            x, r, w, b = (to_nbx(t) for t in (tx, tr, tw, tb))
            io = 2 * tx.element_size() * R * N
            tag = "" if dt == "bf16" else f" {dt}"
            case("layer_norm" + tag, (R, N), lambda: nbx.layer_norm(x, (N,), w, b),
                 lambda: F.layer_norm(tx, (N,), tw, tb), io, bw,
                 lambda: nbx.layer_norm(x, (N,), w, b), lambda: F.layer_norm(tx, (N,), tw, tb))
            case("rms_norm" + tag, (R, N), lambda: nbx.rms_norm(x, (N,), w, 1e-6),
                 lambda: F.rms_norm(tx, (N,), tw, 1e-6), io, bw,
                 lambda: nbx.rms_norm(x, (N,), w, 1e-6), lambda: F.rms_norm(tx, (N,), tw, 1e-6))
            case("rms_norm no-w" + tag, (R, N), lambda: nbx.rms_norm(x, (N,), None, 1e-6),
                 lambda: F.rms_norm(tx, (N,), None, 1e-6), io, bw,
                 lambda: nbx.rms_norm(x, (N,), None, 1e-6),
                 lambda: F.rms_norm(tx, (N,), None, 1e-6))

            def t_add():
                h = tx + tr
                return F.rms_norm(h, (N,), tw, 1e-6)
            case("add_rms_norm" + tag, (R, N), lambda: nbx.add_rms_norm(x, r, w, 1e-6), t_add,
                 4 * tx.element_size() * R * N, bw, lambda: nbx.add_rms_norm(x, r, w, 1e-6)[0],
                 t_add)
        except Exception:
            failures.append(f"norm {R}x{N} {dt}")
            traceback.print_exc()
    if SWEEP_NORM:
        sweep_norm(bw)
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



# bench_norm.probe's cases: (dtype, op, tiles tried beside the rule)
PROBE_TILES = {("fp16", "rms_norm"): [dict(BLOCK_R=1, num_warps=8), dict(BLOCK_R=4, num_warps=8)]}
PROBE_OPS = {"bf16": ("rms_norm", "rms_norm no-w", "layer_norm"),
             "fp16": ("rms_norm", "rms_norm own-x", "rms_norm no-w", "layer_norm"),
             "fp32": ("rms_norm", "layer_norm")}


def _probe_call(op, x, w, b, N):
    if op == "rms_norm own-x":    # the input in nbx's own memory rather than torch's
        xo = x.clone()
        return lambda: nbx.rms_norm(xo, (N,), w, 1e-6)
    if op == "rms_norm":
        return lambda: nbx.rms_norm(x, (N,), w, 1e-6)
    if op == "rms_norm no-w":
        return lambda: nbx.rms_norm(x, (N,), None, 1e-6)
    return lambda: nbx.layer_norm(x, (N,), w, b)


def probe_jobs():
    """precompile jobs (call, set_override) of every kernel `probe` launches, on 16-row
    inputs (the same launch variants as 16384 rows)."""
    from nbxtensor.kernels import norm as kn
    jobs = []
    for dt, ops in PROBE_OPS.items():
        ndt = {"bf16": nbx.bfloat16, "fp16": nbx.float16, "fp32": nbx.float32}[dt]
        x = nbx.empty((16, 4096), dtype=ndt, device="cuda")
        w = nbx.empty((4096,), dtype=ndt, device="cuda")
        for op in ops:
            for cfg in [None] + PROBE_TILES.get((dt, op), []):
                jobs.append((_probe_call(op, x, w, w, 4096),
                             lambda cfg=cfg: setattr(kn, "_OVERRIDE", cfg)))
    return jobs


def probe(deadline=None):
    """A short look for a shared GPU call (~5 s): copy bandwidth, then the PROBE_OPS at
    16384 x 4096 against torch (rms_norm with weight and without, layer_norm with weight and
    bias), with PROBE_TILES' (BLOCK_R, num_warps) beside the rule; stops starting cases
    after `deadline` (time.time())."""
    from nbxtensor.kernels import norm as kn
    F = torch.nn.functional
    bw = copy_bw(1 << 28)
    print(f"norm probe: copy {bw / 1e9:.0f} GB/s", flush=True)
    R, N = 16384, 4096
    for dt, ops in PROBE_OPS.items():
        tdt = NORM_DTYPES[dt]
        tx = torch.randn(R, N, device="cuda", dtype=tdt)
        tw = torch.randn(N, device="cuda", dtype=tdt)
        tb = torch.randn(N, device="cuda", dtype=tdt)
        x, w, b = nbx.from_dlpack(tx), nbx.from_dlpack(tw), nbx.from_dlpack(tb)
        io = 2 * tx.element_size() * R * N
        refs = {"rms_norm": lambda: F.rms_norm(tx, (N,), tw, 1e-6),
                "rms_norm own-x": lambda: F.rms_norm(tx, (N,), tw, 1e-6),
                "rms_norm no-w": lambda: F.rms_norm(tx, (N,), None, 1e-6),
                "layer_norm": lambda: F.layer_norm(tx, (N,), tw, tb)}
        for op in ops:
            if deadline is not None and time.time() > deadline:
                print("norm probe: deadline")
                return
            fn, ref = _probe_call(op, x, w, b, N), refs[op]
            try:
                err = rel_err(fn(), ref())
                t_t = time_gpu(ref, 3, repeats=2, flush=True)
                for cfg in [None] + PROBE_TILES.get((dt, op), []):
                    kn._OVERRIDE = cfg
                    try:
                        t = time_gpu(fn, 3, repeats=2, flush=True)
                    finally:
                        kn._OVERRIDE = None
                    print(f"  {op:13s} {dt} {R}x{N} {str(cfg or 'rule'):34s} {t * 1e6:7.1f} us "
                          f"{100 * io / t / 1e9 / bw:4.0f}% of copy  {t_t / t:5.2f}x torch "
                          f"(torch {t_t * 1e6:.1f} us, {100 * io / t_t / 1e9 / bw:.0f}%)"
                          f"{'' if cfg else f'  err {err:.1e}'}", flush=True)
            except Exception as e:  # noqa: BLE001 - one case must not hide the others
                print(f"  {op} {dt}: {type(e).__name__}: {str(e)[:100]}")
