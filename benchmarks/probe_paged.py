"""Probe (H200): paged decode attention (kernels/paged_attention.py) against the contiguous
kernel (kernels/decode_attention.py) at the same lengths, over the paged kernel's configs.

    PYTHONPATH=src python3 benchmarks/probe_paged.py [--layouts] [OUTDIR]

B in (1, 8), 32/8 heads, D 128, bf16, lengths 1k/8k/32k, page size 16, shuffled pages.
--layouts: the rule's config only, lengths 1k/8k, over page sizes 16/64 and two pool
layouts: "nhd" (num_blocks, block_size, Hk, D) contiguous, as PagedKVCache allocates it, and
"hnd", the same shape as a view of head-major memory (num_blocks, Hk, block_size, D), where
one head's keys of a page are one contiguous run.
Each row: GPU time per call (us, queued behind a sleep kernel, caches rotated past L2:
_common.time_rotated) and the eager time (us, CUDA events, host included) of the contiguous
kernel and of the paged one with one override of its config (BLOCK_N, num_warps,
num_stages; none = the rule's), the paged/contiguous ratios, and max |paged - contiguous|.
Written to OUTDIR/probe_paged.json.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)
import numpy as np  # noqa: E402
from _common import event_best_ms, out_dir, recorder, time_rotated  # noqa: E402

import nbxtensor as nbx  # noqa: E402
from nbxtensor.kernels import paged_attention as KP  # noqa: E402

Hq, Hk, D, PS = 32, 8, 128, 16
VARIANTS = [None, dict(PF=False), dict(BLOCK_N=64), dict(num_stages=2), dict(num_stages=4),
            dict(BLOCK_N=64, num_stages=4), dict(num_warps=8), dict(BLOCK_N=256, num_stages=2)]


LAYOUTS = "--layouts" in sys.argv


def _pools(nb, ps, layout):
    if layout == "nhd":
        return (nbx.randn(nb, ps, Hk, D, device="cuda").to(nbx.bfloat16),
                nbx.randn(nb, ps, Hk, D, device="cuda").to(nbx.bfloat16))
    return (nbx.randn(nb, Hk, ps, D, device="cuda").to(nbx.bfloat16).permute(0, 2, 1, 3),
            nbx.randn(nb, Hk, ps, D, device="cuda").to(nbx.bfloat16).permute(0, 2, 1, 3))


def main_layouts():
    rows = []
    record = recorder(rows)
    g = np.random.default_rng(1)
    for B in (1, 8):
        for L in (1024, 8192):
            kv_bytes = B * L * Hk * D * 2 * 2
            copies = max(1, -(-(256 << 20) // kv_bytes))
            q = nbx.tensor(g.standard_normal((B, Hq, 1, D)).astype(np.float32),
                           device="cuda").to(nbx.bfloat16)
            lengths = nbx.tensor(np.full(B, L, np.int32), device="cuda")
            conts = [(nbx.randn(B, Hk, L, D, device="cuda").to(nbx.bfloat16),
                      nbx.randn(B, Hk, L, D, device="cuda").to(nbx.bfloat16))
                     for _ in range(copies)]
            cont = lambda i: nbx.decode_attention(q, conts[i][0], conts[i][1], lengths)  # noqa
            c_gpu = time_rotated(cont, copies, 200) * 1e3
            for ps in (16, 64):
                nb = B * L // ps
                for layout in ("nhd", "hnd"):
                    for order in ("shuffled", "in order"):
                        tab = (g.permutation(nb) if order == "shuffled" else np.arange(nb))
                        bt = nbx.tensor(tab.astype(np.int32).reshape(B, L // ps), device="cuda")
                        pages = [_pools(nb, ps, layout) for _ in range(copies)]
                        paged = lambda i: nbx.paged_decode_attention(  # noqa: E731
                            q, pages[i], bt, lengths)
                        p_gpu = time_rotated(paged, copies, 200) * 1e3
                        record(B=B, L=L, page=ps, layout=layout, order=order, cont_gpu_us=c_gpu,
                               paged_gpu_us=p_gpu, gpu_ratio=p_gpu / c_gpu)
                        del pages
            del conts
    path = os.path.join(out_dir(), "probe_paged_layouts.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print("wrote", path)


def main():
    if LAYOUTS:
        return main_layouts()
    rows = []
    record = recorder(rows)
    g = np.random.default_rng(1)
    for B in (1, 8):
        for L in (1024, 8192, 32768):
            kv_bytes = B * L * Hk * D * 2 * 2
            copies = max(1, -(-(256 << 20) // kv_bytes))
            q = nbx.tensor(g.standard_normal((B, Hq, 1, D)).astype(np.float32),
                           device="cuda").to(nbx.bfloat16)
            lengths = nbx.tensor(np.full(B, L, np.int32), device="cuda")
            conts, pages = [], []
            for _ in range(copies):
                kc = nbx.randn(B, Hk, L, D, device="cuda").to(nbx.bfloat16)
                vc = nbx.randn(B, Hk, L, D, device="cuda").to(nbx.bfloat16)
                conts.append((kc, vc))
                nb = B * L // PS
                cache = nbx.PagedKVCache(nb, PS, 1, Hk, D, dtype=nbx.bfloat16, device="cuda")
                tab = g.permutation(nb).astype(np.int32).reshape(B, L // PS)
                cache.set_block_tables(nbx.tensor(tab, device="cuda"), lengths)
                kp, vp, bt, ln = cache.view(0)
                pages.append((kp, vp, bt, ln))
                if kv_bytes > (64 << 20) or len(pages) > 1:
                    continue     # timing only: random pages (the tests check the values)
                # the same keys: page tab[b, j // PS] slot j % PS holds key j of batch b
                kh = kc.to(nbx.float32).numpy()
                vh = vc.to(nbx.float32).numpy()
                kpg = np.zeros((nb, PS, Hk, D), np.float32)
                vpg = np.zeros((nb, PS, Hk, D), np.float32)
                for b in range(B):
                    kpg[tab[b]] = kh[b].transpose(1, 0, 2).reshape(L // PS, PS, Hk, D)
                    vpg[tab[b]] = vh[b].transpose(1, 0, 2).reshape(L // PS, PS, Hk, D)
                kp.copy_(nbx.tensor(kpg, device="cuda").to(nbx.bfloat16))
                vp.copy_(nbx.tensor(vpg, device="cuda").to(nbx.bfloat16))
            cont = lambda i: nbx.decode_attention(q, conts[i][0], conts[i][1], lengths)  # noqa
            ref = cont(0).to(nbx.float32).numpy()
            c_gpu = time_rotated(cont, copies, 200) * 1e3
            it = {"i": 0}

            def step(fn):
                fn(it["i"] % copies)
                it["i"] += 1
            c_eager = event_best_ms(lambda: step(cont), 200, nbx.cuda.Event) * 1e3
            for var in VARIANTS:
                KP._OVERRIDE = var
                try:
                    paged = lambda i: nbx.paged_decode_attention(  # noqa: E731
                        q, (pages[i][0], pages[i][1]), pages[i][2], pages[i][3])
                    got = paged(0).to(nbx.float32).numpy()
                    err = float(np.abs(got - ref).max()) if kv_bytes <= (64 << 20) else None
                    p_gpu = time_rotated(paged, copies, 200) * 1e3
                    p_eager = event_best_ms(lambda: step(paged), 200, nbx.cuda.Event) * 1e3
                    record(B=B, L=L, variant=str(var), cont_gpu_us=c_gpu, paged_gpu_us=p_gpu,
                           gpu_ratio=p_gpu / c_gpu, cont_eager_us=c_eager,
                           paged_eager_us=p_eager, eager_ratio=p_eager / c_eager, err=err)
                except Exception as e:  # noqa: BLE001
                    record(B=B, L=L, variant=str(var), error=f"{type(e).__name__}: {str(e)[:200]}")
                finally:
                    KP._OVERRIDE = None
            del conts, pages
    path = os.path.join(out_dir(), "probe_paged.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
