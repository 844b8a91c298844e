"""GPU benchmark: nbx.random on cuda against torch's CUDA generator in the same run.

    python3 benchmarks/bench_random_cuda.py [--quick] [OUTDIR]

* rand / randn / normal_ / uniform_ of 256 MiB (float32, bfloat16): GB/s written, against
  a 256 MiB device copy (read + write) measured here, and torch's time for the same call;
* multinomial over a 128k vocabulary (131,072 float32 probabilities) at batch 1 and 64, one
  sample per row with replacement (the sampler's call) and without.

Kernel time from CUDA events around queued calls (benchmarks/_common.time_gpu, behind a
sleep kernel so the host's queueing is hidden), median of repeats. Prints a table with
the ratio torch time / ours (> 1: we are faster) and writes random_cuda.json.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import _common as C  # noqa: E402

import nbxtensor as nbx  # noqa: E402


def main():
    try:
        import torch
    except ImportError:
        print("bench_random_cuda: skipped (torch is not importable: it is the reference)")
        return 0
    if not (torch.cuda.is_available() and nbx.cuda.is_available()):
        print("bench_random_cuda: skipped (needs a GPU)")
        return 0
    quick = "--quick" in sys.argv
    rows = []
    record = C.recorder(rows)
    n_bytes = 256 << 20
    copy = C.copy_bw(n_bytes)
    print(f"device copy of 256 MiB: {copy:.0f} GB/s (read + write)")
    g = nbx.Generator("cuda").manual_seed(0)
    tg = torch.Generator("cuda").manual_seed(0)
    iters = 5 if quick else 20
    for dname in ("float32", "bfloat16"):
        nd, td = getattr(nbx, dname), getattr(torch, dname)
        n = n_bytes // nd.itemsize
        ours_t = nbx.empty(n, dtype=nd, device="cuda")
        theirs_t = torch.empty(n, dtype=td, device="cuda")
        cases = {
            "rand": (lambda: nbx.rand(n, generator=g, dtype=nd, device="cuda"),
                     lambda: torch.rand(n, generator=tg, dtype=td, device="cuda")),
            "randn": (lambda: nbx.randn(n, generator=g, dtype=nd, device="cuda"),
                      lambda: torch.randn(n, generator=tg, dtype=td, device="cuda")),
            "normal_": (lambda: ours_t.normal_(0.0, 2.0, generator=g),
                        lambda: theirs_t.normal_(0.0, 2.0, generator=tg)),
            "uniform_": (lambda: ours_t.uniform_(-1.0, 1.0, generator=g),
                         lambda: theirs_t.uniform_(-1.0, 1.0, generator=tg)),
        }
        for name, (ours, theirs) in cases.items():
            t_ours = C.time_gpu(ours, iters)
            t_torch = C.time_gpu(theirs, iters)
            gbs = n_bytes / t_ours / 1e9
            record(case=f"{name} {dname} 256MiB", ours_us=t_ours * 1e6, torch_us=t_torch * 1e6,
                   ratio=t_torch / t_ours, ours_GBs=gbs, of_copy=gbs / copy,
                   torch_GBs=n_bytes / t_torch / 1e9)
    V = 131072
    for B in (1, 64):
        tp = torch.rand(B, V, generator=tg, device="cuda") + 1e-3
        tp = tp / tp.sum(-1, keepdim=True)
        op = nbx.tensor(tp.cpu().numpy(), device="cuda")
        for repl in (True, False):
            k = 1
            t_ours = C.time_gpu(lambda: nbx.multinomial(op, k, replacement=repl, generator=g),
                                iters * 4)
            t_torch = C.time_gpu(lambda: torch.multinomial(tp, k, replacement=repl, generator=tg),
                                 iters * 4)
            record(case=f"multinomial B={B} V=128k k=1 repl={repl}", ours_us=t_ours * 1e6,
                   torch_us=t_torch * 1e6, ratio=t_torch / t_ours)
    print(f"\n{'case':44s} {'ours us':>10s} {'torch us':>10s} {'torch/ours':>10s} {'of copy':>8s}")
    for r in rows:
        oc = f"{r['of_copy']:.2f}" if "of_copy" in r else ""
        print(f"{r['case']:44s} {r['ours_us']:10.1f} {r['torch_us']:10.1f} {r['ratio']:10.2f} "
              f"{oc:>8s}")
    out = C.out_dir()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "random_cuda.json"), "w") as f:
        json.dump({"copy_GBs": copy, "rows": rows, "torch": torch.__version__,
                   "device": torch.cuda.get_device_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
