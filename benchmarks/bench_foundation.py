"""Shape ops (cat, stack, flip, roll, repeat, repeat_interleave, tril, pad) and view
copies (contiguous of a transpose): nbxtensor vs torch on the GPU, in one run.

    PYTHONPATH=src python3 benchmarks/bench_foundation.py [--quick] [OUTDIR]

Each row is checked (bit-exact, sampled) against torch's result before it is timed.
Prints a table (ms, GB/s moved = bytes read + written, torch/ours ratio; issue 4's goal
for cat and friends: ratio >= 0.8) and writes bench_foundation.json to OUTDIR (else
$OUT, else the current directory). Timing: CUDA events (nbx.cuda.Event when present,
else torch.cuda.Event) around a loop of calls, best of three.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cuda_event_class, event_best_ms, out_dir  # noqa: E402

GOAL_RATIO = 0.8


def main():
    quick = "--quick" in sys.argv
    outdir = out_dir()
    os.makedirs(outdir, exist_ok=True)

    import torch

    import nbxtensor as nbx

    dev = torch.device("cuda")
    Event, event_kind = cuda_event_class()

    def timeit(fn, iters):
        fn()
        torch.cuda.synchronize()
        return event_best_ms(fn, iters, Event)

    rng = np.random.default_rng(0)

    def pair(shape, dt="bfloat16"):
        a = rng.standard_normal(shape, dtype=np.float32)
        t = torch.from_numpy(a).to(dev).to(getattr(torch, dt))
        x = nbx.tensor(a, device="cuda").to(getattr(nbx, dt))
        return x, t

    def bits(y):
        if isinstance(y, torch.Tensor):
            y = y.contiguous().view(-1)
            return y.view(torch.int16 if y.element_size() == 2 else torch.int32
                          if y.element_size() == 4 else torch.uint8).cpu().numpy()
        a = np.ascontiguousarray(y.numpy()).reshape(-1)
        return a.view({1: np.uint8, 2: np.int16, 4: np.int32}[a.itemsize])

    rows = []

    def bench(name, nbytes, ours, ref, iters, kind="shape"):
        row = {"name": name, "kind": kind, "bytes": nbytes}
        try:
            a, b = bits(ours()), bits(ref())
            step = max(1, a.size // 4_000_000)
            row["correct"] = bool(a.shape == b.shape and np.array_equal(a[::step], b[::step]))
            row["ours_ms"] = timeit(ours, iters)
            row["torch_ms"] = timeit(ref, iters)
            row["ours_GBps"] = nbytes / row["ours_ms"] / 1e6
            row["torch_GBps"] = nbytes / row["torch_ms"] / 1e6
            row["torch_over_ours"] = row["torch_ms"] / row["ours_ms"]
            if kind == "shape":
                row["goal"] = GOAL_RATIO
                row["meets_goal"] = row["correct"] and row["torch_over_ours"] >= GOAL_RATIO
        except Exception as e:  # one broken row must not hide the rest
            row["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        rows.append(row)
        print(f"{name:44s} {row.get('ours_ms', float('nan')):9.4f} "
              f"{row.get('torch_ms', float('nan')):9.4f} {row.get('ours_GBps', 0):9.0f} "
              f"{row.get('torch_GBps', 0):9.0f} {row.get('torch_over_ours', 0):7.2f}  "
              f"{'ok' if row.get('correct') else row.get('error', 'WRONG')[:50]}", flush=True)

    print(f"timing with {event_kind}; {torch.cuda.get_device_name()}")
    print(f"{'op':44s} {'ours ms':>9s} {'torch ms':>9s} {'ours GB/s':>9s} {'torch GB/s':>9s} "
          f"{'t/ours':>7s}")
    iters = 5 if quick else 20
    S = 1024 if quick else 4096

    # KV-cache style: cat two [B, H, S, D] bf16 along the sequence
    k1, tk1 = pair((4, 8, S, 128))
    k2, tk2 = pair((4, 8, S // 4, 128))
    nb = 2 * 2 * (k1.numel() + k2.numel())
    bench(f"cat [4,8,{S},128]+[4,8,{S // 4},128] bf16 dim 2", nb,
          lambda: nbx.cat([k1, k2], 2), lambda: torch.cat([tk1, tk2], 2), iters)
    bench("cat same, dim 0", nb, lambda: nbx.cat([k1, k1], 0), lambda: torch.cat([tk1, tk1], 0),
          iters)
    # fused qkv split back together: cat along the last dim
    q, tq = pair((S, 4096))
    kv, tkv = pair((S, 1024))
    nb = 2 * 2 * (q.numel() + 2 * kv.numel())
    bench(f"cat [{S},4096],[{S},1024]x2 bf16 dim -1", nb,
          lambda: nbx.cat([q, kv, kv], -1), lambda: torch.cat([tq, tkv, tkv], -1), iters)
    f32, tf32 = pair((S, 4096), "float32")
    bench(f"stack 3x[{S},4096] f32 dim 0", 2 * 3 * 4 * f32.numel(),
          lambda: nbx.stack([f32, f32, f32]), lambda: torch.stack([tf32, tf32, tf32]), iters)
    # GQA: repeat_interleave KV heads 8 -> 32
    bench(f"repeat_interleave [4,8,{S},128] x4 dim 1", 2 * (k1.numel() + 4 * k1.numel()),
          lambda: nbx.repeat_interleave(k1, 4, 1), lambda: torch.repeat_interleave(tk1, 4, 1),
          iters)
    bench(f"repeat [{S},4096] f32 (2,1)", 4 * 3 * f32.numel(), lambda: f32.repeat(2, 1),
          lambda: tf32.repeat(2, 1), iters)
    bench(f"flip [{S},4096] f32 dim -1", 4 * 2 * f32.numel(), lambda: nbx.flip(f32, (-1,)),
          lambda: torch.flip(tf32, (-1,)), iters)
    bench(f"roll [{S},4096] f32 (7,-3)", 4 * 2 * f32.numel(),
          lambda: nbx.roll(f32, (7, -3), (0, 1)), lambda: torch.roll(tf32, (7, -3), (0, 1)), iters)
    sq, tsq = pair((S, S), "float32")
    bench(f"tril [{S},{S}] f32", 4 * 2 * sq.numel(), lambda: nbx.tril(sq),
          lambda: torch.tril(tsq), iters)
    bench(f"triu [{S},{S}] f32 diag 1", 4 * 2 * sq.numel(), lambda: nbx.triu(sq, 1),
          lambda: torch.triu(tsq, 1), iters)
    img, timg = pair((8, 64, 256 if quick else 512, 256 if quick else 512))
    nb = 2 * img.numel() + 2 * img.numel() * 1.02
    F = torch.nn.functional
    for mode in ("constant", "reflect", "replicate"):
        bench(f"pad {tuple(img.shape)} bf16 (2,2,2,2) {mode}", int(nb),
              lambda mode=mode: nbx.pad(img, (2, 2, 2, 2), mode=mode),
              lambda mode=mode: F.pad(timg, (2, 2, 2, 2), mode=mode), iters)
    bench(f"contiguous() of [{S},4096].T f32 (copy_)", 4 * 2 * f32.numel(),
          lambda: f32.T.contiguous(), lambda: tf32.T.contiguous(), iters, kind="copy")

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "python": platform.python_version(), "quick": quick, "event": event_kind}
    path = os.path.join(outdir, "bench_foundation.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    bad = [r["name"] for r in rows if r.get("kind") == "shape" and not r.get("meets_goal")]
    print(f"wrote {path}; below goal (ratio >= {GOAL_RATIO}) or wrong: {bad or 'none'}")


if __name__ == "__main__":
    main()
