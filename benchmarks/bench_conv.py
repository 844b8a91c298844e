"""GPU benchmark: conv2d in bfloat16 (implicit GEMM) against torch (cuDNN) in the same run.

    python3 benchmarks/bench_conv.py [--quick] [OUTDIR]

Shapes from real models, NCHW, batch 1 unless said: the SD-VAE decoder's 3x3 convs (512
channels at 64x64 up to 128 channels at 512x512), SD UNet 3x3 convs at 320/640/1280 channels,
ResNet-50 stages (1x1, 3x3, the stride-2 3x3, the 7x7 stem; batch 8), the CRAFT detector's
VGG16-BN layers at a 736x1280 input, a depthwise 3x3 and a strided 1x1 downsample. Kernel
time from CUDA events (benchmarks/_common.time_gpu), median of repeats; prints torch time /
ours (> 1: we are faster), the geometric mean and the worst case, and writes conv.json.
"""
from __future__ import annotations

import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import _common as C  # noqa: E402

import nbxtensor as nbx  # noqa: E402
import nbxtensor.nn.functional as F  # noqa: E402

# (name, N, C_in, H, W, C_out, k, stride, padding, groups)
SHAPES = [
    ("sd-vae 3x3 512c 64x64", 1, 512, 64, 64, 512, 3, 1, 1, 1),
    ("sd-vae 3x3 512c 128x128", 1, 512, 128, 128, 512, 3, 1, 1, 1),
    ("sd-vae 3x3 256c 256x256", 1, 256, 256, 256, 256, 3, 1, 1, 1),
    ("sd-vae 3x3 128c 512x512", 1, 128, 512, 512, 128, 3, 1, 1, 1),
    ("unet 3x3 320c 64x64 b2", 2, 320, 64, 64, 320, 3, 1, 1, 1),
    ("unet 3x3 640c 32x32 b2", 2, 640, 32, 32, 640, 3, 1, 1, 1),
    ("unet 3x3 1280c 16x16 b2", 2, 1280, 16, 16, 1280, 3, 1, 1, 1),
    ("resnet50 stem 7x7 s2 b8", 8, 3, 224, 224, 64, 7, 2, 3, 1),
    ("resnet50 1x1 256->64 56x56 b8", 8, 256, 56, 56, 64, 1, 1, 0, 1),
    ("resnet50 3x3 64c 56x56 b8", 8, 64, 56, 56, 64, 3, 1, 1, 1),
    ("resnet50 3x3 s2 128c 56->28 b8", 8, 128, 56, 56, 128, 3, 2, 1, 1),
    ("resnet50 1x1 1024->256 14x14 b8", 8, 1024, 14, 14, 256, 1, 1, 0, 1),
    ("resnet50 3x3 512c 7x7 b8", 8, 512, 7, 7, 512, 3, 1, 1, 1),
    ("craft conv1 3->64 736x1280", 1, 3, 736, 1280, 64, 3, 1, 1, 1),
    ("craft 64c 736x1280", 1, 64, 736, 1280, 64, 3, 1, 1, 1),
    ("craft 128c 368x640", 1, 128, 368, 640, 128, 3, 1, 1, 1),
    ("craft 256c 184x320", 1, 256, 184, 320, 256, 3, 1, 1, 1),
    ("craft 512c 92x160", 1, 512, 92, 160, 512, 3, 1, 1, 1),
    ("depthwise 3x3 384c 56x56 b8", 8, 384, 56, 56, 384, 3, 1, 1, 384),
    ("1x1 s2 downsample 512->1024 28x28 b8", 8, 512, 28, 28, 1024, 1, 2, 0, 1),
]


def main():
    try:
        import torch
        import torch.nn.functional as TF
    except ImportError:
        print("bench_conv: skipped (torch is not importable: it is the reference)")
        return 0
    if not (torch.cuda.is_available() and nbx.cuda.is_available()):
        print("bench_conv: skipped (needs a GPU)")
        return 0
    quick = "--quick" in sys.argv
    torch.backends.cudnn.benchmark = True
    rows = []
    record = C.recorder(rows)
    g = torch.Generator("cuda").manual_seed(0)
    for name, N, Ci, H, W, Co, k, s, p, groups in (SHAPES[::2] if quick else SHAPES):
        tx = torch.randn(N, Ci, H, W, device="cuda", generator=g, dtype=torch.bfloat16)
        tw = torch.randn(Co, Ci // groups, k, k, device="cuda", generator=g,
                         dtype=torch.bfloat16) / math.sqrt(Ci // groups * k * k)
        tb = torch.randn(Co, device="cuda", generator=g, dtype=torch.bfloat16)
        x, w, b = (nbx.tensor(t.float().cpu().numpy(), device="cuda").to(nbx.bfloat16)
                   for t in (tx, tw, tb))
        try:
            ours = F.conv2d(x, w, b, stride=s, padding=p, groups=groups)
        except Exception as e:  # noqa: BLE001 - a refused shape is a row, not the end
            record(case=name, error=f"{type(e).__name__}: {str(e)[:100]}")
            continue
        want = TF.conv2d(tx, tw, tb, stride=s, padding=p, groups=groups).float().cpu().numpy()
        got = ours.to(nbx.float32).numpy()
        err = float(abs(got - want).max() / (abs(want).max() + 1e-6))
        flops = 2.0 * N * Co * ours.shape[2] * ours.shape[3] * (Ci // groups) * k * k
        iters = 3 if flops > 2e11 else 10
        t_ours = C.time_gpu(lambda: F.conv2d(x, w, b, stride=s, padding=p, groups=groups), iters)
        t_torch = C.time_gpu(lambda: TF.conv2d(tx, tw, tb, stride=s, padding=p, groups=groups),
                             iters)
        record(case=name, ours_us=t_ours * 1e6, torch_us=t_torch * 1e6, ratio=t_torch / t_ours,
               ours_TFs=flops / t_ours / 1e12, torch_TFs=flops / t_torch / 1e12, rel_err=err)
    ok = [r for r in rows if "ratio" in r]
    geo = math.exp(sum(math.log(r["ratio"]) for r in ok) / len(ok)) if ok else float("nan")
    worst = min(ok, key=lambda r: r["ratio"]) if ok else None
    print(f"\n{'case':40s} {'ours us':>9s} {'torch us':>9s} {'torch/ours':>10s} {'TF/s':>6s} {'err':>8s}")
    for r in rows:
        if "ratio" in r:
            print(f"{r['case']:40s} {r['ours_us']:9.1f} {r['torch_us']:9.1f} {r['ratio']:10.2f} "
                  f"{r['ours_TFs']:6.0f} {r['rel_err']:8.1e}")
        else:
            print(f"{r['case']:40s} {r['error']}")
    print(f"geometric mean torch/ours {geo:.2f}; worst {worst['ratio']:.2f} ({worst['case']})"
          if worst else "no case ran")
    out = C.out_dir()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "conv.json"), "w") as f:
        json.dump({"rows": rows, "geomean": geo, "torch": torch.__version__,
                   "device": torch.cuda.get_device_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
