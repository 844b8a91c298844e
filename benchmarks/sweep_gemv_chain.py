"""Decode GEMV chains on the H200 (issue 5: bf16 GEMV at decode shapes vs the copy bandwidth).

    PYTHONPATH=src python3 benchmarks/sweep_gemv_chain.py [--quick] [--cfg-sweep] [OUTDIR]

For decode shapes (K, N) -- (576,576), (576,1536) [SmolLM2], (2048,2048), (2048,3072),
(2048,8192), (8192,2048), (2048,16384) [gate+up as the model runs it: GLU, 8192 outputs],
(4096,4096), (4096,14336), (14336,4096), (2048,128256) -- bf16, M = 1, a CUDA graph (nbx's
graphs API) of C back-to-back `ops.decode.decode_linear` GEMVs (the kernel the decode step
launches for a plain linear; glu=True for the gate/up row) over R rotated weight copies, so
one replay touches >= 128 MiB (> 2x the 50 MiB L2; R >= 2, C a multiple of R). Square shapes
chain (each GEMV's input is the previous one's output); the others use one fixed x (a
chain is impossible). PDL as the policy says (on for cuda unless NBX_PDL=0).
Rows per shape:
  off         the shipped kernels and configs ("off": session 5 also timed an L2 bulk
              prefetch of the weight slab before the PDL wait here -- slower, removed;
              docs/design/decode.md)
  pdl-off     the same with PDL off (full run only)
  torch       torch.nn.functional.linear chain in a torch.cuda.CUDAGraph, same shapes and
              rotation (the GLU row: the 2N-row linear alone, no SiLU*up kernels)
  floor       an empty Triton kernel chain (C launches in a graph): launch floor per kernel
  copy ...    the copy bandwidth AT THE SAME SIZE: a chain of C device-to-device copies that
              move as many bytes as the GEMV reads (wbytes / 2 copied = wbytes read + written),
              rotated past L2 the same way, in a graph: "copy memcpy" (driver memcpy nodes),
              "copy nbx" (Tensor.copy_), "copy pdl1k/4k" (a Triton copy kernel launched with
              PDL as the GEMVs are: the source read before the wait, 1024- or 4096-element
              tiles), "copy pdl4k-early" (the same, the next kernel let go BEFORE the wait, so
              three copies overlap), "copy torch" (torch copy_ in a torch graph). The fastest
              is the reference of the "% size" column (best copy time / GEMV time): below
              ~10 MiB no kernel reaches the 4.19 TB/s, a copy included.
  copy dep    pdl4k plus, after the wait, one read of an element the previous copy wrote
              (the dependent read a GEMV makes of its input): not a reference, a measure of
              what that read costs.
Before timing, each variant's single GEMV is checked against torch (float32 math on the same
bf16 data, max |d| / max |ref| < 2e-2). Timing: CUDA events around n replays, median of 5
rounds -> us per GEMV; fraction of copy = weight bytes / 4.19e12 / t (the measured d2d copy
rate, read + write, of large copies); "% size" = best same-traffic copy time / GEMV time;
"% mcpy" = the driver memcpy node's time / GEMV time (a device-to-device memcpy is how the
4.19 TB/s was measured, on 1 GiB); "% dep" = "copy dep" time / GEMV time.
All kernels are compiled first in a spawn pool (Triton's disk cache).
JSON to OUTDIR/sweep_gemv_chain.json; the table is printed last. --quick: C >= 32; full: 64.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)
from _common import event_times_ms, out_dir, precompile, recorder  # noqa: E402

import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

QUICK = "--quick" in sys.argv
COPY_BPS = 4.19e12
ROT_BYTES = 128 << 20
MIN_CHAIN = 32 if QUICK else 64
SHAPES = [(576, 576), (576, 1536), (2048, 2048), (2048, 3072), (2048, 8192), (8192, 2048),
          (2048, 16384), (4096, 4096), (4096, 14336), (14336, 4096), (2048, 128256)]
# (K, N) rows run as gate/up + SiLU (N weight rows, N / 2 outputs); GEMV_CHAIN_GLU (JSON
# [[K, N], ...]) replaces the set, e.g. for a --cfg-sweep of SmolLM2's [[576, 3072]]
GLU_SHAPES = {tuple(s) for s in json.loads(os.environ.get("GEMV_CHAIN_GLU", "[[2048, 16384]]"))}
# name -> (config override or None, PDL on)
VARIANTS = {"off": (None, True)}
if not QUICK:
    VARIANTS["pdl-off"] = (None, False)

# --cfg-sweep: fused GEMV configs (decode_fused._OVERRIDE) in the same chains, on
# GEMV_CHAIN_SHAPES (JSON [[K, N], ...]; default the mid shapes below 80 %) -- whether another
# tile/warp choice closes the gap the prefetch did not. GEMV_CHAIN_CFGS (JSON list of config
# dicts) replaces the grid.
CFG_SWEEP = "--cfg-sweep" in sys.argv
if CFG_SWEEP:
    SHAPES = [tuple(s) for s in json.loads(os.environ.get(
        "GEMV_CHAIN_SHAPES", "[[2048, 2048], [2048, 3072], [4096, 4096], [2048, 8192]]"))]
    _grid = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w) for bn in (2, 4, 8, 16)
             for bk in (256, 512, 1024) for w in (4, 8) if bn * bk <= 8192]
    _cfgs = json.loads(os.environ["GEMV_CHAIN_CFGS"]) if os.environ.get("GEMV_CHAIN_CFGS") \
        else _grid
    VARIANTS = {"off": VARIANTS["off"]}
    for _c in _cfgs:
        VARIANTS["cfg " + json.dumps(_c, sort_keys=True)] = (_c, True)

ROWS: list = []
record = recorder(ROWS)


def set_variant(name, K=None, N=None):
    """Apply a variant (PDL policy in kernels/_pdl.py, a config through
    decode_fused._OVERRIDE); returns a restore()."""
    from nbxtensor.kernels import _pdl as P
    from nbxtensor.kernels import decode_fused as F
    cfg, pdl = VARIANTS[name]
    saved = (P._PDL_ON, F._OVERRIDE)
    P.set_pdl(pdl)
    F._OVERRIDE = dict(cfg) if cfg else None

    def restore():
        P._PDL_ON, F._OVERRIDE = saved
    return restore


def plan(K, N):
    wbytes = N * K * 2
    R = max(2, -(-ROT_BYTES // wbytes))
    C = R * max(1, -(-MIN_CHAIN // R))
    return R, C, wbytes


def bf16_host(rng, shape, scale):
    import ml_dtypes
    n = int(np.prod(shape))
    pool = (rng.standard_normal(1 << 22, dtype=np.float32) * scale).astype(ml_dtypes.bfloat16)
    pool = np.concatenate([pool, pool])
    out = np.empty(n, ml_dtypes.bfloat16)
    done = 0
    while done < n:                      # random windows of one pool: fast for 500 MiB
        k = min(1 << 22, n - done)
        o = int(rng.integers(0, 1 << 22))
        out[done:done + k] = pool[o:o + k]
        done += k
    return out.reshape(shape)


def to_torch(a, torch):
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()


def time_graph(replay, event_cls, sync, n_rep, rounds=5):
    """ms per replay: median of `rounds` runs of n_rep replays between two events."""
    replay()
    sync()
    return statistics.median(event_times_ms(replay, n_rep, event_cls, repeats=rounds))


def precompile_all():
    import nbxtensor as nbx
    from nbxtensor.models import _ops as O
    jobs = []
    for K, N in SHAPES:
        glu = (K, N) in GLU_SHAPES
        for v in VARIANTS:
            def call(K=K, N=N, glu=glu):
                w = nbx.empty((N, K), dtype=nbx.bfloat16, device="cuda")
                x = nbx.empty((1, K), dtype=nbx.bfloat16, device="cuda")
                O.decode_linear(x, w, glu=glu)
            jobs.append((call, lambda v=v, K=K, N=N: set_variant(v, K, N)))
    saved = set_variant("off")
    precompile(jobs, "precompile", reset=saved)


def run_shape(K, N, torch, n_rep):
    import nbxtensor as nbx
    from nbxtensor.models import _ops as O
    glu = (K, N) in GLU_SHAPES
    n_out = N // 2 if glu else N
    chain = n_out == K
    R, C, wbytes = plan(K, N)
    rng = np.random.default_rng(K * 7 + N)
    wh = bf16_host(rng, (N, K), 1.0 / K ** 0.5)
    xh = bf16_host(rng, (1, K), 1.0)
    w0 = nbx.tensor(wh, device="cuda")
    ws = [w0] + [w0.clone() for _ in range(R - 1)]
    x = nbx.tensor(xh, device="cuda")
    tw = to_torch(wh, torch)
    tws = [tw] + [tw.clone() for _ in range(R - 1)]
    tx = to_torch(xh, torch)
    del wh
    base = dict(K=K, N=N, glu=glu, chain=chain, R=R, C=C, MiB=wbytes / 2 ** 20)

    # float32 reference of one GEMV on the same bf16 data
    ref = (tx.float() @ tw.float().t())
    if glu:
        ref = torch.nn.functional.silu(ref[:, :n_out]) * ref[:, n_out:]
    ref = ref.cpu().numpy().astype(np.float64)

    def one_err(y):
        got = y.to(nbx.float32).numpy().astype(np.float64)
        return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))

    results, final = {}, {}
    for v in VARIANTS:
        restore = set_variant(v, K, N)
        try:
            y = O.decode_linear(x, ws[0], glu=glu)
            nbx.cuda.synchronize()
            err = one_err(y)
            g = nbx.cuda.CUDAGraph()
            with nbx.cuda.graph(g):
                h = x
                for i in range(C):
                    out = O.decode_linear(h if chain else x, ws[i % R], glu=glu)
                    h = out
            restore()
            restore = None
            ms = time_graph(g.replay, nbx.cuda.Event, nbx.cuda.synchronize, n_rep)
            g.replay()
            nbx.cuda.synchronize()
            final[v] = out.numpy().tobytes()
            us = ms * 1e3 / C
            # pdl-off must give the same bits (a config sweep's tiles round apart: None)
            same = (final[v] == final["off"] if v == "pdl-off" and "off" in final else None)
            results[v] = us
            record(section="chain", variant=v, us=us, frac_copy=wbytes / COPY_BPS / (us * 1e-6),
                   err_vs_torch=err, bit_equal_off=same, **base)
            del g, out, h
        except Exception as e:  # noqa: BLE001 - one failing variant does not stop the sweep
            record(section="chain", variant=v, error=f"{type(e).__name__}: {e}"[:300], **base)
            traceback.print_exc()
        finally:
            if restore is not None:
                restore()
    # torch: the F.linear chain in a torch graph, same rotation
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.nn.functional.linear(tx, tws[0])
        torch.cuda.current_stream().wait_stream(s)
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg):
            h = tx
            for i in range(C):
                h = torch.nn.functional.linear(h if chain else tx, tws[i % R])
        ms = time_graph(tg.replay, torch.cuda.Event, torch.cuda.synchronize, n_rep)
        us = ms * 1e3 / C
        results["torch"] = us
        record(section="chain", variant="torch", us=us, frac_copy=wbytes / COPY_BPS / (us * 1e-6),
               **base)
        del tg, h
    except Exception as e:  # noqa: BLE001
        record(section="chain", variant="torch", error=f"{type(e).__name__}: {e}"[:300], **base)
    del ws, tws, w0, tw
    nbx.cuda.empty_cache()
    torch.cuda.empty_cache()
    return results


@triton.jit
def _copy_pdl_kernel(src, dst, dep, z, n, BLOCK: tl.constexpr, ITERS: tl.constexpr,
                     EARLY: tl.constexpr, DEP: tl.constexpr):
    # the reference copy, launched with PDL as the GEMVs are: the source is read-only, so its
    # first tile is loaded before the wait, the stores follow it. EARLY: the next kernel is
    # let go before the wait instead of after it (it may then overlap the previous two).
    # DEP: after the wait, one element that the previous copy wrote is read and added times
    # z (= 0 at run time) -- the one dependent read a GEMV makes (its input vector).
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src + offs, mask=offs < n)
    if EARLY:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    else:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if DEP:
        v = (v.to(tl.float32) + tl.load(dep).to(tl.float32) * z).to(v.dtype)
    tl.store(dst + offs, v, mask=offs < n)
    for _ in range(1, ITERS):
        offs += step
        v = tl.load(src + offs, mask=offs < n)
        tl.store(dst + offs, v, mask=offs < n)


# copy pdl variants: (elements a tile, warps, trigger before the wait, dependent read);
# programs capped at 8 a SM (132 SMs). "copy dep" is not a candidate for the reference (it
# is not a plain copy): it shows what the GEMV's dependent input read costs a copy.
COPY_PDL = {"copy pdl1k": (1024, 4, False, False), "copy pdl4k": (4096, 4, False, False),
            "copy pdl4k-early": (4096, 4, True, False), "copy dep": (4096, 4, False, True)}


def _torch_view(t, torch):
    """A torch int16 view of an nbx cuda tensor's memory (no copy; keep t alive)."""
    class _CAI:
        __cuda_array_interface__ = {"shape": tuple(t.shape), "typestr": "<i2",
                                    "data": (t.data_ptr(), False), "version": 2,
                                    "strides": tuple(x * 2 for x in t.stride())}
    return torch.as_tensor(_CAI(), device="cuda")


def copy_rows(K, N, torch, n_rep):
    """The same-traffic copy chains of one shape (see the module docstring); {variant: us}."""
    import nbxtensor as nbx
    from nbxtensor import cuda as ncuda
    from nbxtensor.backends.cuda import driver as drv
    from nbxtensor.backends.launch import launch
    R, C, wbytes = plan(K, N)             # each copy touches wbytes too (read + write)
    n = wbytes // 4                       # bf16 elements copied: wbytes / 2 bytes
    src = nbx.empty((R, n), dtype=nbx.bfloat16, device="cuda")
    dst = nbx.empty((R, n), dtype=nbx.bfloat16, device="cuda")
    _torch_view(src, torch).view(torch.bfloat16).normal_()   # finite: "copy dep" adds 0 * x
    tsrc = _torch_view(src, torch).clone()
    tdst = torch.empty_like(tsrc)
    torch.cuda.synchronize()
    base = dict(K=K, N=N, R=R, C=C, MiB=wbytes / 2 ** 20, copied_MiB=n * 2 / 2 ** 20)
    ops = {
        "copy memcpy": lambda i: drv.memcpy_dtod(dst[i].data_ptr(), src[i].data_ptr(), n * 2,
                                                 stream=ncuda.current_stream().handle),
        "copy nbx": lambda i: dst[i].copy_(src[i]),
    }
    for name, (block, warps, early, dep) in COPY_PDL.items():
        progs = min(-(-n // block), 132 * 8)
        iters = -(-n // (block * progs))
        ops[name] = (lambda i, block=block, warps=warps, progs=progs, iters=iters, early=early,
                     dep=dep: launch(_copy_pdl_kernel, (progs,), src[i], dst[i],
                                     dst[(i - 1) % R], 0.0, n, BLOCK=block, ITERS=iters,
                                     EARLY=early, DEP=dep, num_warps=warps, launch_pdl=True))
    results = {}
    for v, op in ops.items():
        try:
            _torch_view(dst, torch).fill_(7)
            op(0)
            op(1)
            nbx.cuda.synchronize()
            ok = bool(torch.equal(_torch_view(dst, torch)[:2], tsrc[:2]))
            g = nbx.cuda.CUDAGraph()
            with nbx.cuda.graph(g):
                for i in range(C):
                    op(i % R)
            ms = time_graph(g.replay, nbx.cuda.Event, nbx.cuda.synchronize, n_rep)
            us = ms * 1e3 / C
            if ok and v != "copy dep":
                results[v] = us
            record(section="copy", variant=v, us=us, frac_copy=wbytes / COPY_BPS / (us * 1e-6),
                   correct=ok, **base)
            del g
        except Exception as e:  # noqa: BLE001 - one failing variant does not stop the sweep
            record(section="copy", variant=v, error=f"{type(e).__name__}: {e}"[:300], **base)
            traceback.print_exc()
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            tdst[0].copy_(tsrc[0])
        torch.cuda.current_stream().wait_stream(s)
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg):
            for i in range(C):
                tdst[i % R].copy_(tsrc[i % R])
        ms = time_graph(tg.replay, torch.cuda.Event, torch.cuda.synchronize, n_rep)
        us = ms * 1e3 / C
        ok = bool(torch.equal(tdst, tsrc))
        if ok:
            results["copy torch"] = us
        record(section="copy", variant="copy torch", us=us,
               frac_copy=wbytes / COPY_BPS / (us * 1e-6), correct=ok, **base)
        del tg
    except Exception as e:  # noqa: BLE001
        record(section="copy", variant="copy torch", error=f"{type(e).__name__}: {e}"[:300],
               **base)
    return results       # the buffers go with this frame; main() empties both caches


def floor_row(ek):
    import nbxtensor as nbx
    from nbxtensor.backends.launch import launch
    buf = nbx.empty((16,), dtype=nbx.float32, device="cuda")
    launch(ek, (1,), buf)
    g = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g):
        for _ in range(64):
            launch(ek, (1,), buf)
    ms = time_graph(g.replay, nbx.cuda.Event, nbx.cuda.synchronize, 20)
    record(section="floor", variant="empty kernel", us=ms * 1e3 / 64)


def main():
    t0 = time.time()
    import torch
    import nbxtensor as nbx
    from nbxtensor.kernels import _pdl as P
    import triton

    @triton.jit
    def _empty_kernel(p):
        pass

    print(f"device {nbx.cuda.get_device_name(0)}  torch {torch.__version__}  quick={QUICK}  "
          f"PDL default {P.pdl_enabled('cuda')}",
          flush=True)
    failures = []
    try:
        precompile_all()
    except Exception:  # noqa: BLE001 - the run compiles as it goes
        traceback.print_exc()
    print(f"[{time.time() - t0:.0f} s] precompiled", flush=True)
    try:
        floor_row(_empty_kernel)
    except Exception as e:  # noqa: BLE001
        record(section="floor", variant="empty kernel", error=f"{type(e).__name__}: {e}"[:300])
    for K, N in SHAPES:
        R, C, wbytes = plan(K, N)
        # ~3 ms of GPU work per timed run at the copy rate
        n_rep = max(2, min(50, int(3e-3 / (C * max(wbytes / COPY_BPS, 1.5e-6)))))
        try:
            run_shape(K, N, torch, n_rep)
            if not CFG_SWEEP:
                copy_rows(K, N, torch, n_rep)
                nbx.cuda.empty_cache()
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            failures.append(f"{K}x{N}")
            traceback.print_exc()
        print(f"[{time.time() - t0:.0f} s] {K}x{N} done", flush=True)
    return finish(t0, failures)


def finish(t0, failures):
    od = out_dir()
    os.makedirs(od, exist_ok=True)
    path = os.path.join(od, "sweep_gemv_chain.json")
    with open(path, "w") as f:
        json.dump({"quick": QUICK, "copy_Bps": COPY_BPS, "variants": VARIANTS, "rows": ROWS,
                   "failures": failures, "seconds": time.time() - t0}, f, indent=1)
    errs = [r for r in ROWS if "error" in r]
    bad = [r for r in ROWS if r.get("bit_equal_off") is False or r.get("err_vs_torch", 0) > 2e-2
           or r.get("correct") is False]
    for r in errs:
        print(f"ERROR {r.get('K')}x{r.get('N')} {r['variant']}: {r['error'][:160]}")
    for r in bad:
        print(f"MISMATCH {r['K']}x{r['N']} {r['variant']}: err {r.get('err_vs_torch')} "
              f"bit_equal_off {r.get('bit_equal_off')} copy correct {r.get('correct')}")
    fl = next((r["us"] for r in ROWS if r["section"] == "floor" and "us" in r), None)
    print(f"\n== GEMV chain (M=1 bf16, CUDA graph, rotated weights; % = bytes/4.19TB/s/t)"
          f"  floor (empty kernel in a graph): {fl if fl is None else round(fl, 2)} us")
    others = [] if CFG_SWEEP else [v for v in VARIANTS if v != "off"]
    print(f"{'K x N':>13} {'MiB':>6} {'nbx us':>7} {'%':>4} "
          + " ".join(f"{v[:11]:>11}" for v in others)
          + f" {'torch us':>8} {'%':>4} {'t/nbx':>5} {'copy us':>7} {'best copy':>11}"
          f" {'% size':>6} {'% mcpy':>6} {'dep us':>6} {'% dep':>5}")
    keys = [(K, N) for K, N in SHAPES]
    for K, N in keys:
        rs = {r["variant"]: r for r in ROWS if r.get("K") == K and r.get("N") == N
              and "us" in r and r["section"] == "chain"}
        if not rs:
            continue
        cp = min(((r["us"], r["variant"]) for r in ROWS if r.get("K") == K and r.get("N") == N
                  and r["section"] == "copy" and r.get("correct")
                  and r["variant"] != "copy dep"), default=(float("nan"), "-"))
        dep, mcpy = (next((r["us"] for r in ROWS if r.get("K") == K and r.get("N") == N
                           and r.get("variant") == v and r.get("correct")), float("nan"))
                     for v in ("copy dep", "copy memcpy"))

        def us(v):
            return rs[v]["us"] if v in rs else float("nan")

        def pc(v):
            return 100 * rs[v]["frac_copy"] if v in rs else float("nan")
        mib = next(iter(rs.values()))["MiB"]
        tag = " glu" if (K, N) in GLU_SHAPES else ""
        print(f"{K:>6}x{N:<6} {mib:6.1f} {us('off'):7.2f} {pc('off'):4.0f} "
              + " ".join(f"{us(v):6.2f}/{pc(v):3.0f}%" for v in others)
              + f" {us('torch'):8.2f} {pc('torch'):4.0f} {us('torch') / us('off'):5.2f}"
              f" {cp[0]:7.2f} {cp[1][5:]:>11} {100 * cp[0] / us('off'):6.0f}"
              f" {100 * mcpy / us('off'):6.0f} {dep:6.2f} {100 * dep / us('off'):5.0f}{tag}")
    if CFG_SWEEP:      # per shape: the rule ("off") and the three best configs
        print("\n== config sweep (us per GEMV / % of copy; rule = the shipped config)")
        for K, N in keys:
            rs = sorted(((r["us"], r["variant"], r["frac_copy"]) for r in ROWS
                         if r.get("K") == K and r.get("N") == N and "us" in r
                         and r["variant"] != "torch" and r.get("err_vs_torch", 1) < 2e-2))
            rule = next((x for x in rs if x[1] == "off"), None)
            print(f"{K}x{N}: rule {rule[0]:.2f} us {100 * rule[2]:.0f}%" if rule else f"{K}x{N}:")
            for us_, v, f in rs[:3]:
                print(f"   {us_:6.2f} us {100 * f:4.0f}%  {v}")
    if failures:
        print(f"FAILED shapes: {failures}")
    print(f"JSON: {path}  ({time.time() - t0:.0f} s)")
    return 1 if failures or errs or bad else 0


if __name__ == "__main__":
    sys.exit(main())
