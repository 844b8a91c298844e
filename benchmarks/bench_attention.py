"""Flash attention (prefill) and flash-decoding on the H200 vs torch SDPA, in one run.

    PYTHONPATH=src python3 benchmarks/bench_attention.py [--quick] [--sweep] [OUTDIR]

Prefill: B=4, H=32, S=4096, bf16, D=128 and D=64, causal and not: TFLOP/s (4*B*H*L*S*D,
halved when causal) and the ratio to torch SDPA on the same tensors (goal >= 0.85), plus
the (B, L, H, D)-memory layout models produce. Decode: B=1, 32 query / 8 KV heads, D=128,
a cache of capacity 32768 holding 1k, 4k, 16k, 32k tokens (length in a device tensor):
achieved GB/s on the K/V bytes read against a device copy measured in the same run (goal
>= 0.80) and the ratio to torch SDPA on the same step (q vs the cache sliced to the
length; goal > 1). Times are kernel times (CUDA events behind a spin kernel, see
bench_matmul.py); decode is timed one call at a time after an L2 flush (cold K/V, as in a
real step), so its small-cache figures include the two kernels' fixed ~us cost.
--sweep also tries a few tile configurations per case (printed, and in the JSON) for tuning.
JSON to OUTDIR/attention.json (default: $OUT, else the current directory).
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
from bench_matmul import rel_err, time_gpu, to_nbx  # noqa: E402

QUICK = "--quick" in sys.argv
SWEEP = "--sweep" in sys.argv
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
OUTDIR = ARGS[0] if ARGS else os.environ.get("OUT", ".")
ROWS: list[dict] = []


def record(**row):
    ROWS.append(row)
    print("  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)


def copy_bw():
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = time_gpu(lambda: dst.copy_(src), 5)
    return 2.0 * n / t / 1e9


def prefill(B, H, S, D, causal, layout="bhsd"):
    from nbxtensor.kernels import attention as ka
    F = torch.nn.functional
    if layout == "bhsd":
        tq, tk, tv = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
                      for _ in range(3))
        q, k, v = (to_nbx(t) for t in (tq, tk, tv))
    else:   # one (B, S, 3, H, D) buffer, q/k/v are strided (B, H, S, D) views, as models have
        buf = torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.bfloat16)
        tq, tk, tv = (buf[:, :, i].transpose(1, 2) for i in range(3))
        nb = to_nbx(buf)
        q, k, v = (nb[:, :, i].transpose(1, 2) for i in range(3))
    flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
    fn = lambda: nbx.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    tfn = lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)  # noqa: E731
    inner = 2 if QUICK else 5
    t_n = time_gpu(fn, inner)
    t_t = time_gpu(tfn, inner)
    err = rel_err(fn(), tfn())
    record(case="prefill", shape=f"B{B} H{H} S{S} D{D} {layout}", causal=causal,
           nbx_tflops=flops / t_n / 1e12, torch_tflops=flops / t_t / 1e12, ratio=t_t / t_n,
           nbx_ms=t_n * 1e3, torch_ms=t_t * 1e3, err=err)
    if SWEEP:
        for bm, bn, nw, ns in [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4),
                               (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 8, 4)]:
            ka._OVERRIDE = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=nw, num_stages=ns)
            try:
                t = time_gpu(fn, inner)
                record(case="prefill-sweep", shape=f"D{D}", causal=causal,
                       cfg=f"M{bm} N{bn} w{nw} s{ns}", nbx_tflops=flops / t / 1e12,
                       ratio=t_t / t, err=rel_err(fn(), tfn()))
            except Exception as e:  # noqa: BLE001 - a config that does not fit is reported
                record(case="prefill-sweep", shape=f"D{D}", cfg=f"M{bm} N{bn} w{nw} s{ns}",
                       error=f"{type(e).__name__}: {str(e)[:120]}")
            finally:
                ka._OVERRIDE = None


def decode(n, bw, capacity=32768, B=1, Hq=32, Hk=8, D=128):
    from nbxtensor.kernels import decode_attention as kd
    F = torch.nn.functional
    tq = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    tkc = torch.randn(B, Hk, capacity, D, device="cuda", dtype=torch.bfloat16)
    tvc = torch.randn(B, Hk, capacity, D, device="cuda", dtype=torch.bfloat16)
    q, kc, vc = to_nbx(tq), to_nbx(tkc), to_nbx(tvc)
    lens = nbx.tensor([n], dtype=nbx.int32, device="cuda")
    tks, tvs = tkc[:, :, :n], tvc[:, :, :n]
    fn = lambda: nbx.decode_attention(q, kc, vc, lens)  # noqa: E731
    tfn = lambda: F.scaled_dot_product_attention(tq, tks, tvs, enable_gqa=True)  # noqa: E731
    nbytes = 2.0 * B * Hk * n * D * 2
    # one call per timed batch right after an L2 flush: a 1k cache (4 MB) would otherwise
    # stay in the 50 MB L2 across calls, which a real step (other layers in between) never sees
    reps = 7 if QUICK else 15
    t_n = time_gpu(fn, 1, repeats=reps, flush=True)
    t_t = time_gpu(tfn, 1, repeats=reps, flush=True)
    err = rel_err(fn(), tfn())
    record(case="decode", shape=f"B{B} {Hq}/{Hk} D{D} len{n} cap{capacity}",
           nbx_gbs=nbytes / t_n / 1e9, frac_copy=nbytes / t_n / 1e9 / bw,
           torch_gbs=nbytes / t_t / 1e9, ratio=t_t / t_n, nbx_us=t_n * 1e6,
           torch_us=t_t * 1e6, err=err)
    if SWEEP:
        for target, bn, nw, ns in [(528, 64, 4, 2), (264, 64, 4, 3), (1056, 64, 4, 2),
                                   (528, 32, 4, 4), (528, 128, 4, 2), (528, 64, 8, 3)]:
            p = max(1, min(256, -(-target // (B * Hk)), -(-capacity // bn)))
            kd._OVERRIDE = dict(P=p, BLOCK_N=bn, num_warps=nw, num_stages=ns)
            try:
                t = time_gpu(fn, 1, repeats=reps, flush=True)
                record(case="decode-sweep", shape=f"len{n}", cfg=f"P{p} N{bn} w{nw} s{ns}",
                       nbx_gbs=nbytes / t / 1e9, frac_copy=nbytes / t / 1e9 / bw,
                       ratio=t_t / t, err=rel_err(fn(), tfn()))
            except Exception as e:  # noqa: BLE001
                record(case="decode-sweep", shape=f"len{n}", cfg=f"P{p} N{bn} w{nw} s{ns}",
                       error=f"{type(e).__name__}: {str(e)[:120]}")
            finally:
                kd._OVERRIDE = None


def main():
    t0 = time.time()
    bw = copy_bw()
    record(case="copy", shape="1GiB", gbs=bw)
    failures = []
    pre = [(4, 32, 4096, 128, False, "bhsd"), (4, 32, 4096, 128, True, "bhsd"),
           (4, 32, 4096, 64, False, "bhsd"), (4, 32, 4096, 64, True, "bhsd")]
    if not QUICK:
        pre += [(4, 32, 4096, 128, True, "bshd"), (1, 32, 8192, 128, True, "bhsd"),
                (4, 32, 4096, 80, False, "bhsd"), (4, 16, 2048, 256, True, "bhsd")]
    for args in pre:
        try:
            prefill(*args)
        except Exception as e:  # noqa: BLE001 - keep going, report at the end
            traceback.print_exc()
            failures.append(f"prefill {args}: {type(e).__name__}: {e}")
    for n in ([1024, 32768] if QUICK else [1024, 4096, 16384, 32768]):
        try:
            decode(n, bw)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            failures.append(f"decode {n}: {type(e).__name__}: {e}")
    os.makedirs(OUTDIR, exist_ok=True)
    path = os.path.join(OUTDIR, "attention.json")
    with open(path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       quick=QUICK, rows=ROWS, failures=failures,
                       seconds=time.time() - t0), f, indent=1)
    print(f"\n{'case':8} {'shape':34} {'causal':6} {'nbx':>9} {'torch':>9} {'ratio':>6} "
          f"{'frac_copy':>9} {'err':>8}")
    for r in ROWS:
        if r["case"] in ("prefill", "decode"):
            unit = "nbx_tflops" if r["case"] == "prefill" else "nbx_gbs"
            tunit = "torch_tflops" if r["case"] == "prefill" else "torch_gbs"
            print(f"{r['case']:8} {r['shape']:34} {str(r.get('causal', '')):6} "
                  f"{r[unit]:9.1f} {r[tunit]:9.1f} {r['ratio']:6.2f} "
                  f"{r.get('frac_copy', float('nan')):9.2f} {r['err']:8.1e}")
    print(f"copy bandwidth {bw:.0f} GB/s; prefill in TFLOP/s, decode in GB/s of K/V read")
    for f_ in failures:
        print("FAILED:", f_)
    print(f"wrote {path} in {time.time() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
