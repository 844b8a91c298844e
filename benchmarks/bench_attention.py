"""Flash attention (prefill) and flash-decoding on the H200 vs torch SDPA, in one run.

    PYTHONPATH=src python3 benchmarks/bench_attention.py [--quick] [--sweep] [OUTDIR]
    PYTHONPATH=src python3 benchmarks/bench_attention.py --sweep-prefill [OUTDIR]

Prefill: B=4, H=32, S=4096, bf16, D=128 and D=64, causal and not: TFLOP/s (4*B*H*L*S*D,
halved when causal) and the ratio to torch SDPA on the same tensors (goal >= 0.85), plus
the (B, L, H, D)-memory layout models produce. Decode: B=1, 32 query / 8 KV heads, D=128,
a cache of capacity 32768 holding 1k, 4k, 16k, 32k tokens (length in a device tensor):
achieved GB/s on the K/V bytes read against a device copy measured in the same run (goal
>= 0.80) and the ratio to torch SDPA on the same step (q vs the cache sliced to the
length; goal > 1). Times are kernel times (CUDA events behind a spin kernel, see
bench_matmul.py); decode is timed over calls rotating across cache copies that defeat L2
(K/V cold, as in a real step: _common.time_rotated), so small caches show the fixed ~us cost.
--sweep (one GPU call, ~1-2 min; implies the --quick case set) also times the candidate
configurations below per case -- the pointer kernel, the TMA kernel and the warp-specialised
one-loop kernel (WS) for prefill, split/tile/stage/merge variants for decode -- after
compiling them all in parallel processes, prints the best prefill config per case with its
ratio to torch, and ready-to-paste `TUNED` tables for kernels/attention.py and
kernels/decode_attention.py (also in the JSON under "paste" and "best").
--sweep-prefill: the same for the four prefill cases only (no decode, no copy; ~1 min).
ATTN_CANDS='{"128": [{...}, ...]}' (JSON) replaces a head dim's prefill candidate list.
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
from _common import copy_bw, out_dir, precompile, recorder, time_gpu, time_rotated  # noqa: E402
from bench_matmul import rel_err, to_nbx  # noqa: E402

PREFILL_ONLY = "--sweep-prefill" in sys.argv    # the prefill sweep alone (no decode, no copy)
SWEEP = "--sweep" in sys.argv or PREFILL_ONLY
QUICK = "--quick" in sys.argv or SWEEP
OUTDIR = out_dir()
ROWS: list[dict] = []
record = recorder(ROWS)


# ------------------------------------------------------------------ sweep candidates
# prefill, keyed by head dim; the first entry is today's default (TUNED). WS rows use
# `_flash_fwd_ws` (one key loop, Triton's Hopper warp specialisation: num_warps=4 becomes 12
# warps = a TMA producer warpgroup (40 regs) + two consumer warpgroups of BLOCK_M/2 rows
# (232-256 regs)); WS="off" is the same loop unspecialised (8 warps, the control that says
# whether the specialisation itself pays); TMA rows `_flash_fwd_tma`; the rest the pointer
# kernel. Compile facts (bf16, sm_90, ptxas -v, causal and not), none spills, both dots on
# wgmma: D128 WS M128 N128 s2 192 KB, N64 s3 160 KB, N64 s4 192 KB, control 160 KB/188-196
# regs; D64 WS M128 N128 s3 128 KB, s4 160 KB, N64 s4 96 KB, TMA N64 s3 65 KB.
# Rejected: D128 WS N128 s3 (256 KB > 227 KB), D128 WS M256 N64 and D64 causal WS M256 N128
# (spills), WS="off" with 4 warps (184-424 B spills).
PREFILL_CANDS = {
    128: [dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),        # the default
          dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, WS=True),
          dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3, WS=True),
          dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=4, WS=True),
          dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, WS="off")],  # control
    64: [dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),         # the default
         dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3, TMA=True),
         dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=3, WS=True),
         dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=4, WS=True),
         dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=4, WS=True)],
}
if os.environ.get("ATTN_CANDS"):
    # a follow-up sweep without editing this file, e.g.
    # ATTN_CANDS='{"128": [{"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2,
    #                       "WS": true}]}'   (JSON; keys are head dims; replaces those lists)
    PREFILL_CANDS.update({int(d): c for d, c in json.loads(os.environ["ATTN_CANDS"]).items()})
# decode (B=1, 8 kv heads): TARGET programs -> P = cdiv(TARGET, B*Hk) splits. Shared memory
# per program (bf16, D=128): N64 s2 39 KB, N64 s3 72 KB, N32 s4 54 KB, N32 s3 ~40 KB,
# N64 s4 w8 ~104 KB, so each TARGET is one resident wave (4, 3, 4, 5, 2 per SM).
DECODE_CANDS = [
    dict(TARGET=528, BLOCK_N=64, num_warps=4, num_stages=2, COMBINE=1),    # the default
    dict(TARGET=528, BLOCK_N=64, num_warps=4, num_stages=2, COMBINE=0),    # 2-kernel merge
    dict(TARGET=528, BLOCK_N=32, num_warps=4, num_stages=4, COMBINE=1),
    dict(TARGET=396, BLOCK_N=64, num_warps=4, num_stages=3, COMBINE=1),
    dict(TARGET=660, BLOCK_N=32, num_warps=4, num_stages=3, COMBINE=1),
    dict(TARGET=264, BLOCK_N=64, num_warps=8, num_stages=4, COMBINE=1),
]
SWEPT: dict = {}    # case key -> list of (cfg, seconds, err)
REF: dict = {}      # prefill (D, causal, layout) -> (torch s, default nbx s, flops)


def cfg_text(c):
    return " ".join(f"{k}={v}" for k, v in c.items())


def warm_compile(jobs):
    """`_common.precompile` of (call, set_override) jobs, the overrides reset after."""
    def reset():
        from nbxtensor.kernels import attention as ka, decode_attention as kd
        ka._OVERRIDE = kd._OVERRIDE = None
    precompile(jobs, "  warm-compile", reset)



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
    REF[(D, causal, layout)] = (t_t, t_n, flops)
    record(case="prefill", shape=f"B{B} H{H} S{S} D{D} {layout}", causal=causal,
           nbx_tflops=flops / t_n / 1e12, torch_tflops=flops / t_t / 1e12, ratio=t_t / t_n,
           nbx_ms=t_n * 1e3, torch_ms=t_t * 1e3, err=err)
    if SWEEP:
        key = (max(16, 1 << (D - 1).bit_length()), causal)
        res = SWEPT.setdefault(("prefill", key), [])
        for cand in PREFILL_CANDS.get(D, []):
            ka._OVERRIDE = dict(cand)
            try:
                t = time_gpu(fn, inner)
                err = rel_err(fn(), tfn())
                res.append((cand, t, err))
                record(case="prefill-sweep", shape=f"D{D}", causal=causal, cfg=cfg_text(cand),
                       nbx_tflops=flops / t / 1e12, ratio=t_t / t, err=err)
            except Exception as e:  # noqa: BLE001 - a config that does not fit is reported
                record(case="prefill-sweep", shape=f"D{D}", causal=causal, cfg=cfg_text(cand),
                       error=f"{type(e).__name__}: {str(e)[:120]}")
            finally:
                ka._OVERRIDE = None


def prefill_jobs(B, H, S, D, causal):
    """(call, set_override) pairs for warm_compile: small tensors with the same
    specialisation (H, S and the strides stay multiples of 16)."""
    from nbxtensor.kernels import attention as ka
    t = [to_nbx(torch.randn(1, 16, 256, D, device="cuda", dtype=torch.bfloat16))
         for _ in range(3)]
    call = lambda: nbx.scaled_dot_product_attention(*t, is_causal=causal)  # noqa: E731
    return [(call, (lambda c=c: setattr(ka, "_OVERRIDE", dict(c))))
            for c in PREFILL_CANDS.get(D, [])]


def decode(n, bw, capacity=32768, B=1, Hq=32, Hk=8, D=128):
    from nbxtensor.kernels import decode_attention as kd
    F = torch.nn.functional
    nbytes = 2.0 * B * Hk * n * D * 2
    # the step's steady state: calls rotate over cache copies whose total (>= 256 MiB)
    # defeats the 50 MB L2, as the other layers of a real step do (time_rotated says why not
    # one call after a memset flush). Copies are views into one buffer, `n` keys apart.
    copies = max(2, -(-(256 << 20) // int(nbytes)))
    total = (copies - 1) * n + capacity
    tq = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    tkb = torch.randn(B, Hk, total, D, device="cuda", dtype=torch.bfloat16)
    tvb = torch.randn(B, Hk, total, D, device="cuda", dtype=torch.bfloat16)
    q, kb, vb = to_nbx(tq), to_nbx(tkb), to_nbx(tvb)
    kcs = [kb[:, :, i * n:i * n + capacity] for i in range(copies)]
    vcs = [vb[:, :, i * n:i * n + capacity] for i in range(copies)]
    lens = nbx.tensor([n], dtype=nbx.int32, device="cuda")
    outs = [nbx.empty(B, Hq, 1, D, dtype=nbx.bfloat16, device="cuda") for _ in range(2)]
    fn_i = lambda i: nbx.decode_attention(q, kcs[i], vcs[i], lens, out=outs[i & 1])  # noqa: E731
    tfn_i = lambda i: F.scaled_dot_product_attention(  # noqa: E731
        tq, tkb[:, :, i * n:i * n + n], tvb[:, :, i * n:i * n + n], enable_gqa=True)
    fn, tfn = (lambda: fn_i(0)), (lambda: tfn_i(0))
    iters = max(20, min(400, copies * 4))
    t_n = time_rotated(fn_i, copies, iters) / 1e3
    t_t = time_rotated(tfn_i, copies, iters) / 1e3
    err = rel_err(fn(), tfn())
    record(case="decode", shape=f"B{B} {Hq}/{Hk} D{D} len{n} cap{capacity}",
           nbx_gbs=nbytes / t_n / 1e9, frac_copy=nbytes / t_n / 1e9 / bw,
           torch_gbs=nbytes / t_t / 1e9, ratio=t_t / t_n, nbx_us=t_n * 1e6,
           torch_us=t_t * 1e6, err=err)
    if SWEEP:
        res = SWEPT.setdefault(("decode", n), [])
        for cand in DECODE_CANDS:
            kd._OVERRIDE = decode_override(cand, B, Hk, capacity)
            try:
                t = time_rotated(fn_i, copies, iters) / 1e3
                err = rel_err(fn(), tfn())
                res.append((cand, t, err))
                record(case="decode-sweep", shape=f"len{n}", cfg=cfg_text(cand),
                       nbx_us=t * 1e6, nbx_gbs=nbytes / t / 1e9,
                       frac_copy=nbytes / t / 1e9 / bw, ratio=t_t / t, err=err)
            except Exception as e:  # noqa: BLE001
                record(case="decode-sweep", shape=f"len{n}", cfg=cfg_text(cand),
                       error=f"{type(e).__name__}: {str(e)[:120]}")
            finally:
                kd._OVERRIDE = None


def decode_override(cand, B, Hk, capacity):
    p = max(1, min(256, -(-cand["TARGET"] // (B * Hk)), -(-capacity // cand["BLOCK_N"])))
    return dict(P=p, BLOCK_N=cand["BLOCK_N"], num_warps=cand["num_warps"],
                num_stages=cand["num_stages"], COMBINE=cand["COMBINE"])


def decode_jobs(capacity=32768, B=1, Hq=32, Hk=8, D=128):
    from nbxtensor.kernels import decode_attention as kd
    q = to_nbx(torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16))
    kc = nbx.empty(B, Hk, capacity, D, dtype=nbx.bfloat16, device="cuda")
    lens = nbx.tensor([1024], dtype=nbx.int32, device="cuda")
    kd._counters(B * Hk, q.device)   # allocated (and its fill kernel built) outside the recorder
    call = lambda: nbx.decode_attention(q, kc, kc, lens)  # noqa: E731
    return [(call, (lambda c=c: setattr(kd, "_OVERRIDE", decode_override(c, B, Hk, capacity))))
            for c in DECODE_CANDS]


def paste_tables():
    """The best valid candidate per case as the `TUNED` tables of the two kernel files."""
    out = {}
    pre = []
    for (kind, key), res in SWEPT.items():
        ok = [(c, t, e) for c, t, e in res if e < 2e-2]
        if kind == "prefill" and ok:
            c, t, e = min(ok, key=lambda r: r[1])
            pre.append(f"    {key!r}: dict({', '.join(f'{k}={v!r}' for k, v in c.items())}),")
    if pre:
        out["attention"] = "TUNED = {\n" + "\n".join(sorted(pre)) + "\n}"
    # decode: one config for all lengths, the least total time relative to each length's best
    dec = {n: {cfg_text(c): t for c, t, e in res if e < 2e-2}
           for (kind, n), res in SWEPT.items() if kind == "decode"}
    if dec:
        names = set.intersection(*(set(d) for d in dec.values()))
        if names:
            score = {nm: sum(d[nm] / min(d.values()) for d in dec.values()) for nm in names}
            best = min(score, key=score.get)
            c = next(c for c in DECODE_CANDS if cfg_text(c) == best)
            out["decode_attention"] = ("TUNED = dict(" + ", ".join(
                f"{k}={v!r}" for k, v in c.items()) + ")")
    return out


def best_summary():
    """Per prefill case: torch, today's default and the fastest valid candidate."""
    lines = [f"{'case':24} {'torch':>7} {'default':>8} {'ratio':>6} {'best':>7} {'ratio':>6}"
             "  best config"]
    for (D, causal, layout), (t_t, t_n, flops) in REF.items():
        if layout != "bhsd":
            continue
        key = (max(16, 1 << (D - 1).bit_length()), causal)
        ok = [(c, t) for c, t, e in SWEPT.get(("prefill", key), []) if e < 2e-2]
        c, t = min(ok, key=lambda r: r[1]) if ok else ({}, float("nan"))
        lines.append(f"{f'D{D} causal={causal}':24} {flops / t_t / 1e12:7.1f} "
                     f"{flops / t_n / 1e12:8.1f} {t_t / t_n:6.3f} {flops / t / 1e12:7.1f} "
                     f"{t_t / t:6.3f}  {cfg_text(c)}")
    return "\n".join(lines)


def main():
    t0 = time.time()
    bw = float("nan") if PREFILL_ONLY else copy_bw()
    if not PREFILL_ONLY:
        record(case="copy", shape="1GiB", gbs=bw)
    failures = []
    pre = [(4, 32, 4096, 128, False, "bhsd"), (4, 32, 4096, 128, True, "bhsd"),
           (4, 32, 4096, 64, False, "bhsd"), (4, 32, 4096, 64, True, "bhsd")]
    if not QUICK:
        pre += [(4, 32, 4096, 128, True, "bshd"), (1, 32, 8192, 128, True, "bhsd"),
                (4, 32, 4096, 80, False, "bhsd"), (4, 16, 2048, 256, True, "bhsd")]
    if SWEEP:
        try:
            jobs = []
            for args in pre:
                jobs += prefill_jobs(*args[:5])
            if not PREFILL_ONLY:
                jobs += decode_jobs()
            warm_compile(jobs)
        except Exception:  # noqa: BLE001 - only a speed-up; the timed loop compiles anyway
            traceback.print_exc()
    for args in pre:
        try:
            prefill(*args)
        except Exception as e:  # noqa: BLE001 - keep going, report at the end
            traceback.print_exc()
            failures.append(f"prefill {args}: {type(e).__name__}: {e}")
    for n in ([] if PREFILL_ONLY else [1024, 32768] if QUICK else [1024, 4096, 16384, 32768]):
        try:
            decode(n, bw)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            failures.append(f"decode {n}: {type(e).__name__}: {e}")
    paste = paste_tables() if SWEEP else {}
    os.makedirs(OUTDIR, exist_ok=True)
    path = os.path.join(OUTDIR, "attention.json")
    with open(path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       quick=QUICK, rows=ROWS, failures=failures, paste=paste,
                       best=best_summary() if SWEEP else "",
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
    if SWEEP:
        summary = best_summary()
        print("\nprefill, TFLOP/s (ratio = torch time / nbx time; goal >= 0.85):\n" + summary)
    for mod, text in paste.items():
        print(f"\n# paste into src/nbxtensor/kernels/{mod}.py (replacing its TUNED):\n{text}")
    for f_ in failures:
        print("FAILED:", f_)
    print(f"wrote {path} in {time.time() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
