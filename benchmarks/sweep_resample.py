"""Tile sweep of the pooling / resampling kernels on the GPU (bf16, CRAFT and SD shapes).

    PYTHONPATH=src python3 benchmarks/sweep_resample.py

For each setting of kernels/pooling.py's knobs (TILE, COLS_MAX, POOL_WARPS for the general
and resample kernels; ROWS_TILE, ROWS_WARPS for the wide-row pooling kernel) prints each
case's GB/s (input + output bytes) and its fraction of a device-to-device copy measured in
the same run. A sweep, not a benchmark: the shipped values come from it.
"""
from __future__ import annotations

import itertools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import nbxtensor as nbx  # noqa: E402
import nbxtensor.kernels.pooling as kp  # noqa: E402
from _common import copy_bw, time_gpu  # noqa: E402
from bench_matmul import to_nbx  # noqa: E402

NF = nbx.nn.functional


def _x(shape, layout):
    t = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    if layout == "cl":
        t = t.contiguous(memory_format=torch.channels_last)
        return to_nbx(t.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    return to_nbx(t)


CASES = [("max2x2", (1, 128, 368, 640), lambda x: NF.max_pool2d(x, 2), 0.25),
         ("bilin2x", (1, 256, 92, 160), lambda x: NF.interpolate(x, scale_factor=2,
                                                                 mode="bilinear"), 4.0),
         ("near2x", (1, 512, 64, 64), lambda x: NF.interpolate(x, scale_factor=2), 4.0)]


def main():
    bw = copy_bw()
    print(f"copy {bw:.0f} GB/s")
    xs = {(n, lay): _x(s, lay) for n, s, _, _ in CASES for lay in ("nchw", "cl")}
    general = list(itertools.product((1024, 2048, 4096), (64, 128, 256), (4, 8)))
    for tile, cols, warps in general:
        kp.TILE, kp.COLS_MAX, kp.POOL_WARPS = tile, cols, warps
        row = []
        for n, s, fn, ratio in CASES:
            for lay in ("nchw", "cl"):
                if n == "max2x2" and lay == "nchw":
                    continue            # the wide-row kernel: below
                x = xs[(n, lay)]
                t = time_gpu(lambda: fn(x), 10, flush=True)
                nbytes = 2 * x.numel() * (1 + ratio)
                row.append(f"{n}/{lay} {nbytes / t / 1e9:5.0f} ({nbytes / t / 1e9 / bw:4.0%})")
        print(f"TILE {tile:5d} COLS {cols:3d} warps {warps}: " + "  ".join(row), flush=True)
    x = xs[("max2x2", "nchw")]
    for tile, warps in itertools.product((2048, 4096, 8192, 16384), (4, 8)):
        kp.ROWS_TILE, kp.ROWS_WARPS = tile, warps
        t = time_gpu(lambda: NF.max_pool2d(x, 2), 10, flush=True)
        nbytes = 2 * x.numel() * 1.25
        print(f"rows kernel ROWS_TILE {tile:5d} warps {warps}: max2x2/nchw "
              f"{nbytes / t / 1e9:5.0f} ({nbytes / t / 1e9 / bw:4.0%})", flush=True)


if __name__ == "__main__":
    main()
