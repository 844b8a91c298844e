"""Probe (H200): the quantised GEMVs at batch 1 for W 4096 x 14336 (in x out) over their
launch configs -- int4 GPTQ/AWQ group 128 (kernels/int4.py) and the GGUF K-quants
(kernels/quant.py) -- against the bf16 GEMV (nbx.linear) and torch.

    PYTHONPATH=src python3 benchmarks/probe_quant.py gptq|awq|kq|base [OUTDIR]

Each row: the config (BLOCK_N, BLOCK_K, num_warps, SPLIT), GPU time per call (us, queued
behind a sleep kernel over weight copies rotated past L2: _common.time_rotated), the eager
time per call (us, CUDA events, host included), GB/s of weight + scales + zeros over the GPU
time, and max |y - ref| / max |ref| against a float64 NumPy product of the dequantised
weight (copy 0). `kq`: Q4_K / Q5_K / Q6_K over (BLOCK_N, BLOCK_S, num_warps), Q6_K also at its default.
`base` times bf16 nbx.linear and torch.nn.functional.linear the same way, and the default
int4 configs through nbx.linear. Written to OUTDIR/probe_quant_<part>.json.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)
import numpy as np  # noqa: E402
from _common import event_best_ms, out_dir, precompile, recorder, time_rotated  # noqa: E402

import nbxtensor as nbx  # noqa: E402
from nbxtensor.kernels import int4 as K4  # noqa: E402
from nbxtensor.ops.quantized import dequantize_int4_numpy  # noqa: E402

K, N, GS = 4096, 14336, 128
NBYTES = K * N // 2 + K // GS * N * 2 + K // GS * N // 2
CONFIGS = {
    "gptq": [(bn, bk, nw, sp) for bn, bk, nw in ((512, 32, 2), (512, 64, 2), (256, 32, 1),
                                                 (256, 64, 1), (1024, 16, 2))
             for sp in (8, 16, 32, 64)],
    "awq": [(bn, bk, nw, sp) for bn, bk, nw in ((1024, 16, 1), (1024, 8, 1), (2048, 16, 2),
                                                (2048, 8, 2), (512, 16, 1))
            for sp in (8, 16, 32, 64)],
}


def weights(fmt, copies, g):
    out = []
    for _ in range(copies):
        shape = (K // 8, N) if fmt == "gptq" else (K, N // 8)
        qw = g.integers(-2**31, 2**31, shape, dtype=np.int64).astype(np.int32)
        qz = g.integers(-2**31, 2**31, (K // GS, N // 8), dtype=np.int64).astype(np.int32)
        sc = g.uniform(0.001, 0.01, (K // GS, N)).astype(np.float16)
        T = lambda a: nbx.tensor(a, device="cuda")  # noqa: E731
        out.append((nbx.QuantizedTensor(T(qw), T(sc), T(qz), group_size=GS, format=fmt),
                    (qw, qz, sc)))
    return out


def probe_fmt(fmt, record):
    g = np.random.default_rng(0)
    copies = -(-(256 << 20) // NBYTES)
    ws = weights(fmt, copies, g)
    xh = g.standard_normal((1, K)).astype(np.float32)
    x = nbx.tensor(xh, device="cuda").to(nbx.bfloat16)
    xr = x.to(nbx.float32).numpy().astype(np.float64)
    qw, qz, sc = ws[0][1]
    ref = xr @ dequantize_int4_numpy(qw, qz, sc.astype(np.float32), None, GS, fmt).astype(np.float64)
    y = nbx.empty((1, N), dtype=nbx.bfloat16, device="cuda")

    def run(cfg, i):
        bn, bk, nw, sp = cfg
        K4.int4_gemv(x, ws[i][0], None, y, config=dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw,
                                                       SPLIT=sp))
    precompile([(lambda c=c: run(c, 0), lambda: None) for c in CONFIGS[fmt]], f"compile {fmt}")
    for cfg in CONFIGS[fmt]:
        try:
            run(cfg, 0)
            nbx.cuda.synchronize()
            err = float(np.abs(y.to(nbx.float32).numpy() - ref).max() / np.abs(ref).max())
            gpu = time_rotated(lambda i, c=cfg: run(c, i), copies, 200) * 1e3
            it = {"i": 0}

            def step(c=cfg):
                run(c, it["i"] % copies)
                it["i"] += 1
            eager = event_best_ms(step, 200, nbx.cuda.Event) * 1e3
            bn, bk, nw, sp = cfg
            record(fmt=fmt, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, SPLIT=sp, gpu_us=gpu,
                   eager_us=eager, GBps=NBYTES / gpu / 1e3, err=err)
        except Exception as e:  # noqa: BLE001
            record(fmt=fmt, cfg=str(cfg), error=f"{type(e).__name__}: {str(e)[:200]}")


def probe_base(record):
    import torch
    g = np.random.default_rng(1)
    copies = -(-(256 << 20) // (K * N * 2))
    xt = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    wt = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = nbx.from_dlpack(xt)
    wn = [nbx.from_dlpack(w) for w in wt]
    for name, fn in (("torch-bf16", lambda i: torch.nn.functional.linear(xt, wt[i])),
                     ("nbx-bf16", lambda i: nbx.linear(x, wn[i]))):
        fn(0)
        gpu = time_rotated(fn, copies, 200) * 1e3
        it = {"i": 0}

        def step(fn=fn):
            fn(it["i"] % copies)
            it["i"] += 1
        eager = event_best_ms(step, 200, torch.cuda.Event) * 1e3
        record(fmt=name, gpu_us=gpu, eager_us=eager, GBps=K * N * 2 / gpu / 1e3)
    del wt, wn
    for fmt in ("gptq", "awq"):
        qcopies = -(-(256 << 20) // NBYTES)
        ws = weights(fmt, qcopies, g)
        xb = nbx.tensor(g.standard_normal((1, K)).astype(np.float32), device="cuda").to(
            nbx.bfloat16)
        fn = lambda i, ws=ws: nbx.linear(xb, ws[i][0])  # noqa: E731
        fn(0)
        gpu = time_rotated(fn, qcopies, 200) * 1e3
        it = {"i": 0}

        def step(fn=fn, n=qcopies):
            fn(it["i"] % n)
            it["i"] += 1
        eager = event_best_ms(step, 200, torch.cuda.Event) * 1e3
        cfg = K4.gemv_config(N, K, GS, K4_device_facts(), False, fmt)
        record(fmt=f"linear-{fmt}", cfg=str(cfg), gpu_us=gpu, eager_us=eager,
               GBps=NBYTES / gpu / 1e3)


KQ_CONFIGS = [(32, 4, 8), (64, 4, 8), (32, 2, 4), (16, 4, 4), (64, 2, 8), (16, 2, 4),
              (8, 4, 4), (16, 8, 4), (8, 8, 4), (16, 4, 2)]


def kq_weights(qt, copies, g):
    from nbxtensor.backends.cpu.ggml_blocks import BLOCK_SIZES
    from nbxtensor.models._ops import QuantWeight
    bs, ts = BLOCK_SIZES[qt]
    out = []
    for _ in range(copies):
        raw = g.integers(0, 256, (N, K // bs, ts), dtype=np.uint8)
        scale = np.float16(g.uniform(0.001, 0.01, (N, K // bs))).view(np.uint8).reshape(
            N, K // bs, 2)
        if qt == "Q6_K":
            raw[:, :, 208:210] = scale
        else:
            raw[:, :, 0:2] = scale
            raw[:, :, 2:4] = scale
        raw = raw.reshape(N, -1)
        out.append((QuantWeight(nbx.tensor(raw, device="cuda"), qt, (N, K)), raw))
    return out


def probe_kq(record):
    from nbxtensor.backends.cpu.ggml_blocks import dequantize
    from nbxtensor.kernels.quant import quant_linear
    g = np.random.default_rng(2)
    xh = g.standard_normal((1, K)).astype(np.float32)
    x = nbx.tensor(xh, device="cuda").to(nbx.bfloat16)
    xr = x.to(nbx.float32).numpy().astype(np.float64)
    for qt in ("Q4_K", "Q5_K", "Q6_K"):
        nbytes = None
        ws = None
        # Q6_K: its packed kernel over the same configs, and the byte-decoding default
        cfgs = KQ_CONFIGS if qt != "Q6_K" else [None] + KQ_CONFIGS
        try:
            probe = kq_weights(qt, 1, g)
            nbytes = probe[0][1].nbytes
            copies = -(-(256 << 20) // nbytes)
            ws = probe + kq_weights(qt, copies - 1, g)
            ref = xr @ dequantize(ws[0][1], qt, (N, K)).astype(np.float64).T
        except Exception as e:  # noqa: BLE001
            record(fmt=qt, error=f"setup {type(e).__name__}: {str(e)[:200]}")
            continue

        def run(cfg, i, qt=qt):
            c = None if cfg is None else dict(BLOCK_N=cfg[0], BLOCK_S=cfg[1], num_warps=cfg[2],
                                              PACKED=True)
            return quant_linear(x, ws[i][0], config=c)
        precompile([(lambda c=c: run(c, 0), lambda: None) for c in cfgs], f"compile {qt}")
        for cfg in cfgs:
            try:
                y = run(cfg, 0)
                nbx.cuda.synchronize()
                err = float(np.abs(y.to(nbx.float32).numpy() - ref).max() / np.abs(ref).max())
                gpu = time_rotated(lambda i, c=cfg: run(c, i), copies, 200) * 1e3
                it = {"i": 0}

                def step(c=cfg):
                    run(c, it["i"] % copies)
                    it["i"] += 1
                eager = event_best_ms(step, 200, nbx.cuda.Event) * 1e3
                record(fmt=qt, cfg=str(cfg), gpu_us=gpu, eager_us=eager,
                       GBps=nbytes / gpu / 1e3, err=err)
            except Exception as e:  # noqa: BLE001
                record(fmt=qt, cfg=str(cfg), error=f"{type(e).__name__}: {str(e)[:200]}")


def K4_device_facts():
    from nbxtensor.kernels._common import device_facts
    return device_facts(nbx.device("cuda"))


def main():
    part = next((a for a in sys.argv[1:] if a in ("gptq", "awq", "kq", "base")), "gptq")
    rows = []
    record = recorder(rows)
    if part == "base":
        probe_base(record)
    elif part == "kq":
        probe_kq(record)
    else:
        probe_fmt(part, record)
    path = os.path.join(out_dir([a for a in sys.argv[1:] if a != part]), f"probe_quant_{part}.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
