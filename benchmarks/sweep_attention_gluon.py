"""The Gluon flash-attention prototype vs torch SDPA and today's Triton kernels (H200).

    PYTHONPATH=src python3 benchmarks/sweep_attention_gluon.py [OUTDIR]

B=4, H=32, S=4096, D=128, bf16, causal and non-causal. Rows per case: torch SDPA, `nbx`
(today's dispatch: the pointer kernel causal, the verified WS kernel non-causal), and the
Gluon kernel's variants (called directly: fused/split consumers x STAGES 2/3 x PAIR,
see attention_gluon.DEFAULT); causal also the public op with
`GLUON_CAUSAL = True` on (B, S, H, D) strided views (the models' layout). Each row: kernel
ms, TFLOP/s (4*B*H*S*S*D, halved causal), ratio = torch time / row time (goal causal
>= 0.85), rel err = max|row - torch| (first batch) / max|torch| and whether NaN appeared.
Every kernel is compiled first (parallel processes); torch and today's kernels are timed
before any Gluon launch and each row is printed (flushed) and the JSON rewritten as it
completes, so a Gluon hang leaves every earlier row on record.
JSON to OUTDIR/sweep_attention_gluon.json (default $OUT, else the current directory).
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402  (the reference only)

import nbxtensor as nbx  # noqa: E402
from _common import out_dir, precompile, recorder, time_gpu  # noqa: E402
from bench_matmul import to_nbx  # noqa: E402

OUTDIR = out_dir()
ROWS: list[dict] = []
record = recorder(ROWS)
LOG2E = 1.4426950408889634


def err_of(got, ref):
    # the first batch only: the host copy of the whole output is slow on the GPU machine
    g = torch.from_numpy(got[:1].numpy().astype("float32")).cuda()
    r = ref[:1].float()
    nan = bool(torch.isnan(g).any())
    return float((g - r).abs().max() / r.abs().max().clamp_min(1e-30)), nan


VARIANTS = {   # the Gluon kernel's settings timed per case (see attention_gluon.DEFAULT)
    True: [dict(SPLIT=False, STAGES=2), dict(SPLIT=False, STAGES=3),
           dict(SPLIT=True, STAGES=2), dict(SPLIT=True, STAGES=3),
           dict(SPLIT=False, PAIR=True), dict(SPLIT=True, PAIR=True),
           # timed last (a hang there leaves every other row on record)
           dict(SPLIT=True, STAGES=2, PINGPONG=True), dict(SPLIT=True, PAIR=True, PINGPONG=True)],
    False: [dict(SPLIT=False, STAGES=2), dict(SPLIT=True, STAGES=2),
            dict(SPLIT=False, PAIR=True), dict(SPLIT=True, PAIR=True),
            dict(SPLIT=True, PAIR=True, PINGPONG=True)],
}


def vname(c):
    return (f"gluon-{'split' if c['SPLIT'] else 'fused'}-"
            + ("pair" if c.get("PAIR") else f"s{c['STAGES']}")
            + ("-pp" if c.get("PINGPONG") else ""))


def make_case(B, H, S, D, causal):
    from nbxtensor.kernels import attention_gluon as ag
    F = torch.nn.functional
    tq, tk, tv = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
                  for _ in range(3))
    q, k, v = (to_nbx(t) for t in (tq, tk, tv))
    out = nbx.empty((B, H, S, D), dtype=nbx.bfloat16, device="cuda")
    shape = f"B{B} H{H} S{S} D{D}"
    rows = [("torch", shape, lambda: F.scaled_dot_product_attention(tq, tk, tv,
                                                                     is_causal=causal), None),
            ("nbx-triton", shape, lambda: nbx.scaled_dot_product_attention(
                q, k, v, is_causal=causal), False)]
    for c in VARIANTS[causal]:
        rows.append((vname(c), shape, lambda c=c: ag.sdpa_gluon(
            out, q, k, v, LOG2E / math.sqrt(D), causal=causal, **c), None))
    if causal:
        # the models' layout: one (B, S, 3, H, D) buffer, strided (B, H, S, D) views; the
        # public op with GLUON_CAUSAL off (the Triton kernels) and on (DEFAULT's settings)
        buf = torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.bfloat16)
        bq, bk, bv = (buf[:, :, i].transpose(1, 2) for i in range(3))
        nb = to_nbx(buf)
        nq, nk, nv = (nb[:, :, i].transpose(1, 2) for i in range(3))
        sh = shape + " bshd"
        rows += [("torch", sh, lambda: F.scaled_dot_product_attention(bq, bk, bv,
                                                                       is_causal=True), None),
                 ("nbx-triton", sh, lambda: nbx.scaled_dot_product_attention(
                     nq, nk, nv, is_causal=True), False),
                 ("nbx-GLUON_CAUSAL", sh, lambda: nbx.scaled_dot_product_attention(
                     nq, nk, nv, is_causal=True), True)]
    flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
    return rows, flops


def dump(failures, t0):
    os.makedirs(OUTDIR, exist_ok=True)
    path = os.path.join(OUTDIR, "sweep_attention_gluon.json")
    with open(path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=ROWS,
                       failures=failures, seconds=time.time() - t0), f, indent=1)
    return path


T0 = time.time()


def time_rows(rows, flops, causal, failures):
    """Time each row; a row's `gluon` (True/False/None) sets attention.GLUON_CAUSAL for it
    alone (None: the row calls a kernel directly), the module's value is restored after."""
    from nbxtensor.kernels import attention as ka
    ref = t_t = None
    default = ka.GLUON_CAUSAL
    for name, shape, fn, gluon in rows:
        try:
            if gluon is not None:
                ka.GLUON_CAUSAL = gluon
            out = fn()
            torch.cuda.synchronize()
            t = time_gpu(fn, 5)
            if name == "torch":
                ref, t_t = out, t
                record(case=name, shape=shape, causal=causal, ms=t * 1e3,
                       tflops=flops / t / 1e12, ratio=1.0)
                continue
            err, nan = err_of(out, ref)
            record(case=name, shape=shape, causal=causal, ms=t * 1e3,
                   tflops=flops / t / 1e12, ratio=t_t / t, rel_err=err, nan=nan)
        except Exception as e:  # noqa: BLE001 - report and go on
            traceback.print_exc()
            failures.append(f"{name} {shape} causal={causal}: {type(e).__name__}: {e}")
            record(case=name, shape=shape, causal=causal, error=f"{type(e).__name__}: {e}"[:200])
        finally:
            ka.GLUON_CAUSAL = default
            dump(failures, T0)


def main():
    t0 = time.time()
    failures: list[str] = []
    cases = []
    for causal in (True, False):
        rows, flops = make_case(4, 32, 4096, 128, causal)
        cases.append((rows, flops, causal))
    # every kernel compiled in parallel processes first (bench_attention's recorder), so
    # the timed loop hits Triton's cache; a failure here only means serial compiles
    from nbxtensor.kernels import attention as ka
    default = ka.GLUON_CAUSAL
    try:
        jobs = []
        for rows, _, _ in cases:
            for name, _, fn, gluon in rows:
                if name != "torch":
                    jobs.append((fn, lambda g=gluon: setattr(
                        ka, "GLUON_CAUSAL", default if g is None else g)))
        precompile(jobs, "warm-compile")
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    finally:
        ka.GLUON_CAUSAL = default
    print(f"  compiled ({time.time() - t0:.0f} s)", flush=True)
    # today's kernels and torch are timed first (each row printed when done): a Gluon hang
    # then shows after them
    for rows, flops, causal in cases:
        first = [r for r in rows if not r[0].startswith("gluon") and r[3] is None]
        time_rows(first, flops, causal, failures)
    for pp in (False, True):
        for rows, flops, causal in cases:
            ref_row = [r for r in rows if r[0] == "torch"][:1]
            rest = [r for r in rows if r[0].startswith("gluon") and r[0].endswith("-pp") == pp]
            time_rows(ref_row + rest, flops, causal, failures)
            if causal and not pp:
                i = [n for n, *_ in rows].index("torch", 1)     # the bshd torch row
                time_rows([rows[i], rows[-1]], flops, causal, failures)
    path = dump(failures, t0)
    print(f"\n{'row':22} {'shape':26} {'causal':6} {'ms':>7} {'TFLOP/s':>8} {'ratio':>6} "
          f"{'rel err':>8} nan")
    for r in ROWS:
        if "error" in r:
            print(f"{r['case']:22} {r['shape']:26} {str(r['causal']):6} ERROR {r['error']}")
            continue
        print(f"{r['case']:22} {r['shape']:26} {str(r['causal']):6} {r['ms']:7.3f} "
              f"{r['tflops']:8.1f} {r['ratio']:6.3f} {r.get('rel_err', 0.0):8.1e} "
              f"{r.get('nan', '')}")
    for f_ in failures:
        print("FAILED:", f_)
    print(f"wrote {path} in {time.time() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
