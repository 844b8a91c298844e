"""GPU probe: conv2d bf16 variants of kernels/conv.py against torch (cuDNN) in one run.

    python3 benchmarks/probe_conv.py [--shapes quick|all|NAME,...] [--variants V,...] [OUTDIR]

Variants (each a module setting of kernels/conv.py, restored after):
  ptr        the pointer implicit GEMM on the NCHW input (TMA_CONV=None, no 1x1 GEMM)
  ptr-nhwc   the same on a channels-last input and output (no layout conversion timed)
  tma        the routing as shipped (1x1 -> matmul, stride 1 -> TMA kernel), NCHW input:
             the NCHW -> NHWC input copy is inside the time
  tma-nhwc   the same on channels-last input and output
  bh1        tma with one-row pixel boxes (MAX_BH=1: A straight from shared memory)
  bh1-nhwc   bh1 on channels-last
  s3         tma with 3 pipeline stages;  bn256: BLOCK_N=256 (3 stages)
  bm64       tma with BLOCK_M=64 boxes;  w4: tma with 4 warps
  copy       only the NCHW -> NHWC copy of the input (what the NCHW variants pay for it)
  torch      TF.conv2d on NCHW;  torch-nhwc: on channels_last
Prints us per call and torch-NCHW time / ours per variant, geometric means, conv_probe.json.
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
from bench_conv import SHAPES  # noqa: E402

import nbxtensor as nbx  # noqa: E402
import nbxtensor.kernels.conv as kc  # noqa: E402
import nbxtensor.nn.functional as F  # noqa: E402

SETTINGS = {
    "ptr": dict(TMA_CONV=None, POINTWISE_GEMM=False),
    "ptr-nhwc": dict(TMA_CONV=None, POINTWISE_GEMM=False),
    "tma": {}, "tma-nhwc": {},
    "bh1": dict(TMA_CONV=dict(kc.TMA_CONV, MAX_BH=1)),
    "bh1-nhwc": dict(TMA_CONV=dict(kc.TMA_CONV, MAX_BH=1)),
    "s3": dict(TMA_CONV=dict(kc.TMA_CONV, num_stages=3)),
    "bn256": dict(TMA_CONV=dict(kc.TMA_CONV, num_stages=3), _OVERRIDE=dict(BLOCK_N=256)),
    "bm64": dict(TMA_CONV=dict(kc.TMA_CONV, BLOCK_M=64)),
    "w4": dict(_OVERRIDE=dict(num_warps=4)),
}


def _with(settings, fn):
    old = {k: getattr(kc, k) for k in settings}
    for k, v in settings.items():
        setattr(kc, k, v)
    try:
        return fn()
    finally:
        for k, v in old.items():
            setattr(kc, k, v)


def main():
    try:
        import torch
        import torch.nn.functional as TF
    except ImportError:
        print("probe_conv: skipped (torch is not importable: it is the reference)")
        return 0
    if not (torch.cuda.is_available() and nbx.cuda.is_available()):
        print("probe_conv: skipped (needs a GPU)")
        return 0
    opt = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    pick = opt.get("shapes", "quick")
    shapes = (SHAPES[::2] if pick == "quick" else SHAPES if pick == "all" else
              [s for s in SHAPES if any(p in s[0] for p in pick.split(","))])
    variants = opt.get("variants", "torch,ptr,tma,bh1").split(",")
    torch.backends.cudnn.benchmark = True
    g = torch.Generator("cuda").manual_seed(0)
    rows = []
    for name, N, Ci, H, W, Co, k, s, p, groups in shapes:
        tx = torch.randn(N, Ci, H, W, device="cuda", generator=g, dtype=torch.bfloat16)
        tw = torch.randn(Co, Ci // groups, k, k, device="cuda", generator=g,
                         dtype=torch.bfloat16) / math.sqrt(Ci // groups * k * k)
        tb = torch.randn(Co, device="cuda", generator=g, dtype=torch.bfloat16)
        x, w, b = (nbx.from_dlpack(t) for t in (tx, tw, tb))
        x_cl = nbx.from_dlpack(tx.permute(0, 2, 3, 1).contiguous()).permute(0, 3, 1, 2)
        tx_cl = tx.contiguous(memory_format=torch.channels_last)
        want = TF.conv2d(tx, tw, tb, stride=s, padding=p, groups=groups).float()
        flops = 2.0 * N * Co * want.shape[2] * want.shape[3] * (Ci // groups) * k * k
        iters = 3 if flops > 2e11 else 10
        row = dict(case=name, GFLOP=flops / 1e9)
        for v in variants:
            if v == "torch":
                fn = lambda: TF.conv2d(tx, tw, tb, stride=s, padding=p, groups=groups)  # noqa: E731
            elif v == "torch-nhwc":
                fn = lambda: TF.conv2d(tx_cl, tw, tb, stride=s, padding=p,  # noqa: E731
                                       groups=groups)
            elif v == "copy":
                fn = lambda: x.permute(0, 2, 3, 1).contiguous()  # noqa: E731
            else:
                xi = x_cl if v.endswith("nhwc") else x
                settings = SETTINGS[v]

                def fn(xi=xi, settings=settings):
                    return _with(settings, lambda: F.conv2d(xi, w, b, stride=s, padding=p,
                                                            groups=groups))
                try:
                    got = torch.from_dlpack(fn()).float()
                    err = float((got - want).abs().max() / (want.abs().max() + 1e-6))
                    row[v + "_err"] = err
                    if not err < 3e-2:
                        row[v] = f"WRONG {err:.2e}"
                        continue
                except Exception as e:  # noqa: BLE001 - a refused variant is a cell
                    row[v] = f"{type(e).__name__}: {str(e)[:80]}"
                    continue
            row[v] = C.time_gpu(fn, iters) * 1e6
        rows.append(row)
        cells = " ".join(f"{v}={row[v]:.1f}" if isinstance(row[v], float) else f"{v}={row[v]}"
                         for v in variants)
        print(f"{name:38s} {cells}", flush=True)
    print()
    for v in variants:
        if v in ("torch",):
            continue
        r = [row["torch"] / row[v] for row in rows
             if isinstance(row.get(v), float) and isinstance(row.get("torch"), float)]
        if r and v != "copy":
            print(f"{v:10s} torch/ours geomean {math.exp(sum(map(math.log, r)) / len(r)):.3f} "
                  f"min {min(r):.3f} over {len(r)}")
    out = C.out_dir()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "conv_probe.json"), "w") as f:
        json.dump({"rows": rows, "torch": torch.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
