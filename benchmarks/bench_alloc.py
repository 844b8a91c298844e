"""Allocator benchmarks: nbxtensor's caching allocator against torch's, in one run.

(a) allocation + free of a cached block, per pair, for a few sizes:
      ours      CachingAllocator.malloc/free (what a tensor's storage calls)
      storage   CudaStorage.allocate + its death (the whole path a tensor takes)
      torch     torch.cuda.caching_allocator_alloc/delete (default device and stream)
      torch-x   the same with device and stream passed explicitly (torch's fastest Python path)
      torch-C   torch._C's raw_alloc/raw_delete bindings (the C++ allocator, no Python wrapper)
      empty     torch.empty(n, uint8, device='cuda') + del, for context
    goal: ours not slower than torch.
(b) a synthetic trace with the size mix of a transformer (Llama-shaped): weights loaded first,
    a static KV cache, then prefills of several prompt lengths each followed by decode steps,
    activations freed as a forward pass frees them. Replayed through ours (real device memory;
    and over FakeRaw, which must agree) and through torch's allocator; peak reserved / peak
    live for both. goal: ours no worse. `--trace FILE` adds a trace recorded with
    nbx.cuda.record_memory_trace (streams folded into one, first device only).

    PYTHONPATH=src python3 benchmarks/bench_alloc.py [--quick] [--trace RECORDED.tsv] [OUTDIR]

JSON goes to OUTDIR, else $OUT, else the current directory. Without a GPU it runs (b) over
FakeRaw only; without torch it skips the torch columns.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import nbxtensor as nbx  # noqa: E402
from nbxtensor.backends.cuda import memory, memtrace  # noqa: E402
from nbxtensor.backends.cuda.memory import DriverRaw, FakeRaw, format_bytes  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20


# ------------------------------------------------------------------------------ (a) timing

def _per_call_us(fn, n_iter, repeats):
    """Median over `repeats` of the mean time of one fn() call in a loop of n_iter, in us."""
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn_loop(fn, n_iter)
        out.append((time.perf_counter() - t) / n_iter * 1e6)
    return statistics.median(out), min(out)


def fn_loop(fn, n):
    for _ in range(n):
        fn()


def bench_cached_pair(torch, quick):
    from nbxtensor.backends.cuda.storage import CudaStorage
    n_iter = 20000 if quick else 50000
    repeats = 3 if quick else 7
    dev = nbx.Device("cuda", 0)
    alloc = memory.allocator_for(0)
    rows = []
    for size in (512, 4 * KiB, MiB, 64 * MiB):
        row = {"size": size}

        def ours(n=size, a=alloc):
            a.free(a.malloc(n, 0))
        def storage(n=size):
            CudaStorage.allocate(dev, n)     # dies at once: the block goes back
        cands = {"ours": ours, "storage": storage}
        if torch is not None:
            ta, td = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
            sh = torch.cuda.current_stream(0).cuda_stream

            def t_default(n=size):
                td(ta(n))
            def t_explicit(n=size):
                td(ta(n, 0, sh))
            def t_empty(n=size, u8=torch.uint8):
                torch.empty(n, dtype=u8, device="cuda")
            cands.update({"torch": t_default, "torch-x": t_explicit, "empty": t_empty})
            C = torch._C
            if hasattr(C, "_cuda_cudaCachingAllocator_raw_alloc"):
                ra, rd = C._cuda_cudaCachingAllocator_raw_alloc, C._cuda_cudaCachingAllocator_raw_delete

                def t_c(n=size):                # torch's C++ allocator behind one binding: a floor
                    rd(ra(n, sh))
                cands["torch-C"] = t_c
        for name, fn in cands.items():
            med, best = _per_call_us(fn, n_iter, repeats)
            row[name] = med
            row[name + ".min"] = best
        rows.append(row)
    # the launcher asks holds() once per pointer argument
    keep = [alloc.malloc(4 * KiB) for _ in range(64)]
    p0, p1 = keep[10].ptr, keep[10].ptr + 100
    holds = {"holds(start)": _per_call_us(lambda: alloc.holds(p0), n_iter, repeats)[0],
             "holds(interior)": _per_call_us(lambda: alloc.holds(p1), n_iter, repeats)[0]}
    for b in keep:
        alloc.free(b)
    return rows, holds


# ------------------------------------------------------------------------------ (b) the trace

LLAMA = {
    # name: hidden, intermediate, layers, heads, kv heads, head dim, vocab, tied embeddings
    "llama-1b": dict(H=2048, I=8192, L=16, nh=32, nkv=8, hd=64, V=128256, tied=True),
    "llama-8b": dict(H=4096, I=14336, L=32, nh=32, nkv=8, hd=128, V=128256, tied=False),
}


class TraceBuilder:
    def __init__(self):
        self.events = []
        self._next = 1

    def alloc(self, nbytes):
        i = self._next
        self._next += 1
        self.events.append(("alloc", "cuda:0", 0, i, 0, int(nbytes)))
        return i

    def free(self, *ids):
        for i in ids:
            self.events.append(("free", "cuda:0", 0, i, 0, 0))


def synth_trace(cfg, prompts, decode_steps, max_seq=4096):
    """Alloc/free events of loading a Llama-shaped bf16 model and serving `prompts` (prefill
    of each, then `decode_steps` greedy steps), batch 1, static KV cache of max_seq."""
    H, I, L, nh, nkv, hd, V = (cfg[k] for k in ("H", "I", "L", "nh", "nkv", "hd", "V"))
    bf, f32, i64 = 2, 4, 8
    kv = nkv * hd
    t = TraceBuilder()
    # weights, in checkpoint order
    t.alloc(V * H * bf)
    for _ in range(L):
        for shape in ((H,), (H, H), (kv, H), (kv, H), (H, H), (H,), (I, H), (I, H), (H, I)):
            n = 1
            for s in shape:
                n *= s
            t.alloc(n * bf)
    t.alloc(H * bf)
    if not cfg["tied"]:
        t.alloc(V * H * bf)
    t.alloc(max_seq * hd // 2 * f32)    # rope cos
    t.alloc(max_seq * hd // 2 * f32)    # rope sin
    for _ in range(L):                  # static KV cache
        t.alloc(max_seq * kv * bf)
        t.alloc(max_seq * kv * bf)

    def forward(T, token):
        ids = token if token is not None else t.alloc(T * i64)
        x = t.alloc(T * H * bf)         # embedding
        t.free(ids)
        for _ in range(L):
            h = t.alloc(T * H * bf)     # rmsnorm
            q, k, v = t.alloc(T * H * bf), t.alloc(T * kv * bf), t.alloc(T * kv * bf)
            t.free(h)
            qr = t.alloc(T * H * bf)    # rope, out of place
            t.free(q)
            kr = t.alloc(T * kv * bf)
            t.free(k)
            t.free(kr, v)               # written into the cache
            lse = t.alloc(nh * T * f32)
            a = t.alloc(T * H * bf)     # attention
            t.free(qr, lse)
            o = t.alloc(T * H * bf)
            t.free(a)
            x2 = t.alloc(T * H * bf)    # residual
            t.free(x, o)
            x = x2
            h = t.alloc(T * H * bf)
            g, u = t.alloc(T * I * bf), t.alloc(T * I * bf)
            t.free(h)
            m = t.alloc(T * I * bf)     # silu(g) * u
            t.free(g, u)
            d = t.alloc(T * H * bf)
            t.free(m)
            x2 = t.alloc(T * H * bf)
            t.free(x, d)
            x = x2
        h = t.alloc(T * H * bf)         # final norm
        t.free(x)
        logits = t.alloc(V * f32)       # last position only
        t.free(h)
        probs = t.alloc(V * f32)
        nxt = t.alloc(i64)
        t.free(logits, probs)
        return nxt

    for T in prompts:
        tok = forward(T, None)
        for _ in range(decode_steps):
            tok = forward(1, tok)
        t.free(tok)
    return t.events


def trace_peak_live(events):
    live, cur, peak = {}, 0, 0
    for ev in events:
        if ev[0] == "alloc":
            live[ev[3]] = ev[5]
            cur += ev[5]
            peak = max(peak, cur)
        elif ev[3] in live:
            cur -= live.pop(ev[3])
    return peak


def replay_torch(torch, events):
    ta, td = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
    sh = torch.cuda.current_stream(0).cuda_stream
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base_alloc, base_res = torch.cuda.memory_allocated(0), torch.cuda.memory_reserved(0)
    torch.cuda.reset_peak_memory_stats(0)
    ptrs = {}
    t0 = time.perf_counter()
    for ev in events:
        if ev[0] == "alloc":
            ptrs[ev[3]] = ta(ev[5], 0, sh)
        else:
            p = ptrs.pop(ev[3], None)
            if p is not None:
                td(p)
    dt = time.perf_counter() - t0
    pa = torch.cuda.max_memory_allocated(0) - base_alloc
    pr = torch.cuda.max_memory_reserved(0) - base_res
    for p in ptrs.values():
        td(p)
    torch.cuda.empty_cache()
    return {"peak_allocated": pa, "peak_reserved": pr, "seconds": dt,
            "base_allocated": base_alloc, "base_reserved": base_res}


def load_recorded(path):
    """A recorded TSV as replayable events: one device (the first seen), every stream folded
    into the current one (recorded stream handles mean nothing in this process)."""
    evs, dev = [], None
    for ev in memtrace.read_trace(path):
        if ev[0] not in ("alloc", "free"):
            continue
        dev = dev or ev[1]
        if ev[1] == dev:
            evs.append((ev[0], "cuda:0", 0, ev[3], ev[4], ev[5]))
    return evs


def replay_ours(events, raw_factory):
    t0 = time.perf_counter()
    r = memtrace.replay(events, raw_factory)["cuda:0"]
    r["seconds"] = time.perf_counter() - t0
    return r


# ------------------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations, the 1B trace only")
    ap.add_argument("--trace", action="append", default=[], metavar="TSV",
                    help="also replay a trace recorded with nbx.cuda.record_memory_trace")
    ap.add_argument("outdir", nargs="?", default=None)
    args = ap.parse_args()
    outdir = args.outdir or os.environ.get("OUT") or "."
    os.makedirs(outdir, exist_ok=True)

    has_gpu, why = nbx.cuda.availability()
    try:
        import torch
        if not (has_gpu and torch.cuda.is_available()):
            torch = None
    except ImportError:
        torch = None
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "python": platform.python_version(), "quick": args.quick, "gpu": has_gpu,
              "torch": getattr(torch, "__version__", None),
              "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    if has_gpu:
        result["device"] = nbx.cuda.get_device_name(0)
    else:
        print(f"no cuda device ({why}): (a) skipped, (b) over FakeRaw only")

    if has_gpu:
        rows, holds = bench_cached_pair(torch, args.quick)
        result["cached_pair_us"] = rows
        result["holds_us"] = holds
        cols = [c for c in ("ours", "storage", "torch", "torch-x", "torch-C", "empty") if c in rows[0]]
        print("\n(a) allocation + free of a cached block, us per pair (median)")
        print(f"{'size':>10} " + " ".join(f"{c:>9}" for c in cols)
              + ("  ours/torch" if "torch" in cols else ""))
        for r in rows:
            line = f"{format_bytes(r['size']):>10} " + " ".join(f"{r[c]:9.3f}" for c in cols)
            if "torch" in cols:
                line += f"  {r['ours'] / r['torch']:10.2f}"
            print(line)
        print("    " + ", ".join(f"{k}: {v:.3f} us" for k, v in holds.items()))
        memory.allocator_for(0).empty_cache()

    print("\n(b) trace replay: peak reserved / peak live")
    traces = {"llama-1b": (LLAMA["llama-1b"], [512, 37, 1900, 128, 1024], 16 if args.quick else 64)}
    if not args.quick:
        traces["llama-8b"] = (LLAMA["llama-8b"], [512, 37, 1900, 128, 4000, 1024], 32)
    result["traces"] = {}
    print(f"{'trace':>9} {'events':>7} {'peak live':>11} | {'ours alloc':>11} {'reserved':>11} "
          f"{'ratio':>6} {'us/ev':>6} | {'torch alloc':>11} {'reserved':>11} {'ratio':>6} {'us/ev':>6}")
    for path in args.trace:
        traces[os.path.basename(path)] = (None, path, None)
    for name, (cfg, prompts, steps) in traces.items():
        if cfg is None:
            events = load_recorded(prompts)
            rec = {"recorded": prompts}
        else:
            events = synth_trace(cfg, prompts, steps)
            rec = {"prompts": prompts, "decode_steps": steps}
        live = trace_peak_live(events)
        rec.update({"events": len(events), "peak_live": live})
        fake = replay_ours(events, FakeRaw)
        rec["ours_fakeraw"] = fake
        ours = replay_ours(events, lambda: DriverRaw(0)) if has_gpu else fake
        if has_gpu:
            rec["ours"] = ours
            if (ours["peak_reserved"], ours["peak_allocated"]) != (fake["peak_reserved"],
                                                                   fake["peak_allocated"]):
                print(f"  note: {name}: device and FakeRaw replays differ "
                      f"({ours['peak_reserved']} vs {fake['peak_reserved']} reserved)")
        line = (f"{name:>9} {len(events):>7} {format_bytes(live):>11} | "
                f"{format_bytes(ours['peak_allocated']):>11} {format_bytes(ours['peak_reserved']):>11} "
                f"{ours['peak_reserved'] / live:6.3f} {ours['seconds'] / len(events) * 1e6:6.2f} | ")
        if torch is not None:
            tr = replay_torch(torch, events)
            rec["torch"] = tr
            rec["ours_vs_torch_reserved"] = ours["peak_reserved"] / tr["peak_reserved"]
            line += (f"{format_bytes(tr['peak_allocated']):>11} {format_bytes(tr['peak_reserved']):>11} "
                     f"{tr['peak_reserved'] / live:6.3f} {tr['seconds'] / len(events) * 1e6:6.2f}")
        else:
            line += "(torch absent)"
        print(line)
        result["traces"][name] = rec
        gc.collect()

    path = os.path.join(outdir, "bench_alloc.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
