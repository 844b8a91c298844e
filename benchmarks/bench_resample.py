"""Pooling, interpolate, pixel_shuffle and grid_sample on the H200 vs torch (bf16).

    PYTHONPATH=src python3 benchmarks/bench_resample.py [--quick] [OUTDIR]

Shapes from the CRAFT detector (VGG16-BN at a 736x1280 input: 2x2 max pools, the 3x3 stride-1
pool of its fifth stage, the U-Net decoder's bilinear 2x upsampling), SD-VAE's nearest 2x
upsampling, an antialiased 4x image downscale, a 2x pixel shuffle and a bilinear grid_sample;
NCHW and channels-last. Reports kernel time (CUDA events behind a spin kernel, L2 flushed),
achieved GB/s (input + output bytes, once) against a device-to-device copy measured in the
same run (the goal: >= 0.90), a copy of the same bytes timed the same way (%same), and the
ratio to torch. JSON to OUTDIR/resample.json.
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
TF = torch.nn.functional
NF = nbx.nn.functional


def _pair(shape, layout):
    t = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    if layout == "cl":
        t = t.contiguous(memory_format=torch.channels_last)
        x = to_nbx(t.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)   # the same layout in nbx
    else:
        x = to_nbx(t)
    return t, x


def case(op, shape, layout, nbx_fn, torch_fn, bw, extra_bytes=0):
    ref = torch_fn()
    got = nbx_fn()
    if isinstance(ref, tuple):
        ref, got = ref[0], got[0]
    nbytes = 2 * (torch.Size(shape).numel() + ref.numel()) + extra_bytes
    inner = 10 if nbytes < (256 << 20) else 3
    t_n = time_gpu(nbx_fn, inner, flush=True)
    t_t = time_gpu(torch_fn, inner, flush=True)
    # the same bytes as one device-to-device copy, timed the same way: the fair anchor for
    # a small case, where ramp-up and tail hold a 1 GiB copy's rate out of reach
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t_c = time_gpu(lambda: dst.copy_(src), inner, flush=True)
    record(op=op, shape="x".join(map(str, shape)), layout=layout,
           nbx_gbs=nbytes / t_n / 1e9, torch_gbs=nbytes / t_t / 1e9,
           frac_copy=nbytes / t_n / 1e9 / bw, frac_same=t_c / t_n, ratio=t_t / t_n, nbx_us=t_n * 1e6,
           torch_us=t_t * 1e6,
           err=rel_err(got.contiguous() if hasattr(got, "contiguous") else got, ref.contiguous()))


def main():
    t0 = time.time()
    bw = copy_bw()
    record(op="copy", shape="1GiB", layout="-", nbx_gbs=bw)
    failures = []
    cases = [
        ("max_pool2d 2x2", (1, 128, 368, 640), lambda x: NF.max_pool2d(x, 2),
         lambda t: TF.max_pool2d(t, 2)),
        ("max_pool2d 3x3 s1", (1, 512, 46, 80), lambda x: NF.max_pool2d(x, 3, 1, 1),
         lambda t: TF.max_pool2d(t, 3, 1, 1)),
        ("avg_pool2d 3x3 s2", (8, 256, 112, 112), lambda x: NF.avg_pool2d(x, 3, 2, 1),
         lambda t: TF.avg_pool2d(t, 3, 2, 1)),
        ("adaptive_avg (8,1)", (32, 512, 8, 64), lambda x: NF.adaptive_avg_pool2d(x, (8, 1)),
         lambda t: TF.adaptive_avg_pool2d(t, (8, 1))),
        ("bilinear 2x", (1, 256, 92, 160),
         lambda x: NF.interpolate(x, scale_factor=2, mode="bilinear"),
         lambda t: TF.interpolate(t, scale_factor=2, mode="bilinear")),
        ("nearest 2x", (1, 512, 64, 64), lambda x: NF.interpolate(x, scale_factor=2),
         lambda t: TF.interpolate(t, scale_factor=2)),
        ("bilinear aa /4", (1, 3, 1024, 1024),
         lambda x: NF.interpolate(x, size=(256, 256), mode="bilinear", antialias=True),
         lambda t: TF.interpolate(t, size=(256, 256), mode="bilinear", antialias=True)),
        ("pixel_shuffle 2", (1, 256, 128, 128), lambda x: NF.pixel_shuffle(x, 2),
         lambda t: TF.pixel_shuffle(t, 2)),
    ]
    if QUICK:
        cases = cases[:1] + cases[4:5]
    for name, shape, nf, tf in cases:
        for layout in ("nchw", "cl"):
            try:
                t, x = _pair(shape, layout)
                case(name, shape, layout, lambda: nf(x), lambda: tf(t), bw)
            except Exception:
                failures.append(f"{name} {layout}")
                traceback.print_exc()
    try:
        shape = (4, 64, 128, 128)
        t, x = _pair(shape, "nchw")
        tg = torch.rand(4, 128, 128, 2, device="cuda", dtype=torch.bfloat16) * 2 - 1
        g = to_nbx(tg)
        case("grid_sample bilinear", shape, "nchw",
             lambda: NF.grid_sample(x, g, align_corners=False),
             lambda: TF.grid_sample(t, tg, align_corners=False), bw, 2 * tg.numel())
    except Exception:
        failures.append("grid_sample")
        traceback.print_exc()
    os.makedirs(OUTDIR, exist_ok=True)
    with open(os.path.join(OUTDIR, "resample.json"), "w") as f:
        json.dump({"quick": QUICK, "rows": ROWS, "failures": failures,
                   "seconds": time.time() - t0}, f, indent=1)
    print("\n== pooling / resampling, bf16 (ratio = torch_time / nbx_time; %copy of copy GB/s)")
    print(f"{'op':22} {'shape':>16} {'layout':>6} {'nbx GB/s':>9} {'torch':>7} {'ratio':>6} "
          f"{'%copy':>6} {'%same':>6} {'nbx us':>8} {'err':>8}")
    for r in ROWS:
        if r["op"] == "copy":
            print(f"{'copy':22} {r['shape']:>16} {'-':>6} {r['nbx_gbs']:>9.0f}")
            continue
        print(f"{r['op']:22} {r['shape']:>16} {r['layout']:>6} {r['nbx_gbs']:>9.0f} "
              f"{r['torch_gbs']:>7.0f} {r['ratio']:>6.2f} {100 * r['frac_copy']:>5.0f}% "
              f"{100 * r['frac_same']:>5.0f}% "
              f"{r['nbx_us']:>8.1f} {r['err']:>8.1e}")
    if failures:
        print(f"FAILED: {failures}")
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
