"""Per-call cost of small ops: our Python above the launch, and the real per-call time.

    PYTHONPATH=src python3 benchmarks/bench_overhead.py [--quick] [--profile OP] [OUTDIR]
    PYTHONPATH=src python3 benchmarks/bench_overhead.py --device cuda [--quick] [OUTDIR]

cpu-stub mode (default, no GPU needed): the ops run on `interp` tensors with every
kernel launch replaced by a no-op, so the time is only the op layer's Python
(validation, promotion, broadcasting, allocation, dispatch, launch planning). Each row is
the minimum over repeats of the mean per call over a loop (min-of-many: the machine may be
shared). `--fake-cuda` uses cuda tensors instead (the real CudaStorage and caching
allocator over a pretend address space, driver calls stubbed), which is the allocation
path the GPU pays. `--profile OP` prints a cProfile of that row instead.

cuda mode: the same ops on real cuda tensors, per call = wall time of N calls then one
synchronize, divided by N (median of repeats); torch's equivalent beside it when torch
imports. Writes bench_overhead_<mode>.json to OUTDIR (or $OUT, or the cwd).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import nbxtensor as nbx  # noqa: E402


def _cases(nbx_mod, dev, make):
    """(name, nbx callable, torch callable builder) for each row; `make(shape, dtype)` builds
    an nbx tensor on `dev`."""
    a = make((4096,), "float32")
    b = make((4096,), "float32")
    h = make((4096,), "float16")
    r1 = make((1, 32000), "float32")
    r4 = make((4, 4096), "float32")
    r8 = make((8, 4096), "float32")
    xs = make((4, 1024), "float32")
    w = make((256, 1024), "float32")
    bias = make((256,), "float32")
    col = make((4, 4096), "float32")
    sq = make((64, 64), "float32")
    x1 = make((1, 1024), "float32")
    F = nbx_mod.nn.functional if hasattr(nbx_mod, "nn") else None
    rows = [
        ("add f32 n=4096", lambda: nbx_mod.add(a, b), ("add", "a", "b")),
        ("a + b", lambda: a + b, ("radd", "a", "b")),
        ("a * 2.0 (scalar)", lambda: a * 2.0, ("smul", "a")),
        ("add f16+f32 promote", lambda: h + a, ("promote", "h", "a")),
        ("add broadcast (4,4096)+(4096,)", lambda: col + a, ("bcast", "col", "a")),
        ("exp f32 n=4096", lambda: nbx_mod.exp(a), ("exp", "a")),
        ("silu f32 n=4096", lambda: nbx_mod.silu(a), ("silu", "a")),
        ("a.to(float16)", lambda: a.to(nbx_mod.float16), ("cast", "a")),
        ("a.to(dtype=float16)", lambda: a.to(dtype=nbx_mod.float16), ("cast", "a")),
        ("a.clone()", lambda: a.clone(), ("clone", "a")),
        ("(64,64).t().contiguous()", lambda: sq.t().contiguous(), ("tcontig", "sq")),
        ("sum (1,32000) dim=-1", lambda: nbx_mod.sum(r1, -1), ("sum", "r1")),
        ("sum (4,4096) dim=-1", lambda: nbx_mod.sum(r4, -1), ("sum", "r4")),
        ("amax (8,4096) dim=-1", lambda: r8.amax(-1), ("amax", "r8")),
        ("argmax (8,4096) dim=-1", lambda: r8.argmax(-1), ("argmax", "r8")),
        ("mean (8,4096) dim=-1", lambda: r8.mean(-1), ("mean", "r8")),
        ("sum all (8,4096)", lambda: r8.sum(), ("sumall", "r8")),
    ]
    if F is not None and hasattr(F, "softmax"):
        rows.append(("softmax (8,4096) dim=-1", lambda: F.softmax(r8, -1), ("softmax", "r8")))
    if F is not None and hasattr(F, "linear"):
        rows.append(("linear (4,1024)x(256,1024)+b", lambda: F.linear(xs, w, bias),
                     ("linear", "xs", "w", "bias")))
        rows.append(("linear (1,1024)x(256,1024)", lambda: F.linear(x1, w),
                     ("linear1", "x1", "w")))
    # index and shape ops (issue 4's per-call rows): a small table, int64 ids
    emb = make((32000, 256), "float16")
    ids = _ids(make, (1, 1), 32000)
    kv = make((1, 8, 1, 64), "float16")
    isx = make((512, 512), "bfloat16")
    isi = _ids(make, (256,), 512)
    rows += [
        ("embedding 1 token", lambda: nbx_mod.embedding(ids, emb), ("emb", "ids", "emb")),
        ("cat 2x[1,8,1,64] dim 2", lambda: nbx_mod.cat([kv, kv], 2), ("cat", "kv")),
        ("index_select (512,512) dim 0 x256", lambda: nbx_mod.index_select(isx, 0, isi),
         ("isel", "isx", "isi")),
    ]
    tens = dict(a=a, b=b, h=h, r1=r1, r4=r4, r8=r8, xs=xs, w=w, bias=bias, col=col, sq=sq, x1=x1,
                emb=emb, ids=ids, kv=kv, isx=isx, isi=isi)
    return rows, tens


def _ids(make, shape, n):
    """An int64 index tensor of `shape` with values in [0, n), built like the others."""
    t = make(shape, "float32")
    try:
        return (t.abs() * 1000).to(nbx.int64) % n
    except Exception:  # noqa: BLE001 - stubbed launches (cpu-stub mode): contents never read
        return nbx.empty(shape, dtype=nbx.int64, device=t.device)


def _torch_fn(spec, T, torch):
    k = spec[0]
    F = torch.nn.functional
    a = lambda n: T[n]  # noqa: E731
    table = {
        "add": lambda: torch.add(a("a"), a("b")), "radd": lambda: a("a") + a("b"),
        "smul": lambda: a("a") * 2.0, "promote": lambda: a("h") + a("a"),
        "bcast": lambda: a("col") + a("a"), "exp": lambda: torch.exp(a("a")),
        "silu": lambda: F.silu(a("a")), "cast": lambda: a("a").to(torch.float16),
        "sum": lambda: torch.sum(a(spec[1]), -1), "amax": lambda: a("r8").amax(-1),
        "argmax": lambda: a("r8").argmax(-1), "mean": lambda: a("r8").mean(-1),
        "sumall": lambda: a("r8").sum(), "softmax": lambda: F.softmax(a("r8"), -1),
        "linear": lambda: F.linear(a("xs"), a("w"), a("bias")),
        "linear1": lambda: F.linear(a("x1"), a("w")),
        "clone": lambda: a("a").clone(), "tcontig": lambda: a("sq").t().contiguous(),
        "emb": lambda: F.embedding(a("ids"), a("emb")), "cat": lambda: torch.cat([a("kv")] * 2, 2),
        "isel": lambda: torch.index_select(a("isx"), 0, a("isi")),
    }
    return table[k]


_LAUNCHES = [0]


def _stub_launches():
    """Replace every kernel launch reachable from the op layers with a no-op."""
    import nbxtensor.dispatch as d
    d._load("triton")               # import the kernel modules first, then patch their names

    def noop(*args, **kwargs):
        _LAUNCHES[0] += 1
    n = 0
    for name, mod in list(sys.modules.items()):
        if mod is not None and name.startswith("nbxtensor.") and getattr(mod, "launch", None) \
                is not None and name != "nbxtensor.backends.launch":
            if callable(mod.launch) and not isinstance(mod.launch, type(sys)):
                mod.launch = noop
                n += 1
            if callable(getattr(mod, "launch_items", None)):
                mod.launch_items = noop
    import nbxtensor.backends.launch as bl
    bl.launch = bl.launch_items = noop
    return n


def _time_min(fn, loops, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter() - t0) / loops)
    return best


def _fake_cuda():
    """cuda tensors over a pretend address space: the real CudaStorage and caching allocator
    (over memory.FakeRaw), with the driver calls of the allocation path stubbed. Their
    contents are never read (launches are stubbed too)."""
    from nbxtensor.backends.cuda import memory, storage
    from nbxtensor.backends.cuda import driver
    driver.set_device = lambda index: None
    # the index ops' error flag is set up by a host copy: nothing to copy to here
    driver.memcpy_htod = driver.memcpy_dtoh = driver.stream_synchronize = lambda *a, **k: None
    storage._stream_handle = lambda index: 0
    memory._allocators[0] = memory.CachingAllocator(memory.FakeRaw(), "cuda:0")
    try:    # the launch rules read the device's facts from the driver: an H200's
        from dataclasses import replace
        from nbxtensor.kernels import _common
        _common._CUDA[0] = replace(_common.INTERP, type="cuda")
    except ImportError:   # an older tree without the device-facts seam
        pass
    try:    # the autotune tables key on the device's name and capability: pretend an H200
        from nbxtensor import autotune
        autotune._idents[0] = ("NVIDIA H200", "sm_90")
    except Exception:  # noqa: BLE001 - an older tree without autotune
        pass
    dev = nbx.device("cuda") if hasattr(nbx, "device") else None
    from nbxtensor.device import Device
    from nbxtensor.tensor import Tensor
    dev = Device("cuda")

    def make(shape, dtype):
        return Tensor._empty(shape, nbx.dtypes.as_dtype(dtype), dev)
    return make


def _real_launcher():
    """--with-launcher: keep nbx.launch (its fast launchers, packing, checks) and stub only
    below it: cuLaunchKernel(Ex) are no-op C functions, the module load and device queries
    are fakes, and kernels compile for real (sm_90, Triton's on-disk cache). So a row is our
    whole per-call Python, the launcher included (bench_launch.py's --cpu-overhead wiring)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_launch as bl
    from nbxtensor.backends.cuda import launcher as L
    raw, _decl, raw_ex, what = bl._stub_launch()
    saved = bl._wire_fakes(L, raw, raw_ex)
    L._allocator_for = saved["_allocator_for"]     # the real (fake-address) caching allocator
    return what


def cpu_stub(args):
    if args.with_launcher:
        n = 0
    else:
        n = _stub_launches()
    rng = np.random.default_rng(0)

    def make(shape, dtype):
        # through float32: NumPy knows bfloat16 only once ml_dtypes is imported
        return nbx.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(
            "interp", getattr(nbx, dtype))
    if args.fake_cuda or args.with_launcher:
        make = _fake_cuda()
    if args.with_launcher:
        print("launcher kept; below it:", _real_launcher())
    rows, _ = _cases(nbx, "interp", make)
    loops, repeats = (200, 5) if args.quick else (1000, 15)
    if args.profile:
        import cProfile
        import pstats
        fn = next(f for name, f, _ in rows if args.profile in name)
        for _ in range(100):
            fn()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            fn()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
        return None
    out = []
    print(f"cpu-stub: launches stubbed in {n} modules; "
          f"{'fake-cuda' if args.fake_cuda else 'interp'} tensors; min of {repeats} x "
          f"{loops} calls")
    print(f"{'op':34s} {'us/call':>9s} {'launches':>9s}")
    for name, fn, _ in rows:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - e.g. a row that asks the (absent) driver
            print(f"{name:34s} skipped: {type(e).__name__}: {str(e)[:60]}")
            continue
        _LAUNCHES[0] = 0
        fn()
        nl = _LAUNCHES[0]
        us = _time_min(fn, loops, repeats) * 1e6
        out.append({"op": name, "python_us": round(us, 2), "launches": nl})
        print(f"{name:34s} {us:9.2f} {nl:9d}")
    mode = ("cpu-stub-launcher" if args.with_launcher else
            "cpu-stub-fakecuda" if args.fake_cuda else "cpu-stub")
    return {"mode": mode, "rows": out}


def cuda_mode(args):
    from nbxtensor import cuda as ncuda
    rng = np.random.default_rng(0)
    host = {}

    def make(shape, dtype):
        t = nbx.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(
            "cuda", getattr(nbx, dtype))
        host[id(t)] = t.cpu().numpy()
        return t
    rows, tens = _cases(nbx, "cuda", make)
    try:
        import torch
        # (tensors derived on the device, e.g. index ids, are read back for torch)
        def to_torch(arr):      # torch has no numpy bfloat16: move its bits as int16
            if arr.dtype.name == "bfloat16":
                return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16).cuda()
            return torch.from_numpy(arr).cuda()
        T = {k: to_torch(host[id(v)] if id(v) in host else v.numpy()) for k, v in tens.items()}
    except Exception as e:  # noqa: BLE001 - torch is only the reference
        print(f"(torch not available: {type(e).__name__}: {e})")
        torch, T = None, None
    loops, repeats = (200, 5) if args.quick else (1000, 11)

    def per_call(fn, sync):
        for _ in range(20):
            fn()
        sync()
        vals = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(loops):
                fn()
            sync()
            vals.append((time.perf_counter() - t0) / loops)
        return statistics.median(vals) * 1e6
    nsync = ncuda.synchronize
    out = []
    if args.profile:   # where the real cuda path spends its time (driver calls included)
        _profile([r for r in rows if any(p in r[0] for p in args.profile.split(","))], nsync)
        return None
    print(f"cuda: median of {repeats} x {loops} calls, wall time per call incl. one sync")
    print(f"{'op':34s} {'nbx us':>8s} {'torch us':>9s} {'ratio':>6s}")
    # reference: the bare cost of one cached nbx.launch of a tiny kernel (what an op adds
    # its own Python to)
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def _tiny(x, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)
        xt = make((1024,), "float32")
        us = per_call(lambda: nbx.launch(_tiny, (1,), xt, 1024, BLOCK=1024, num_warps=4), nsync)
        print(f"{'(nbx.launch of a tiny kernel)':34s} {us:8.2f}")
        out.append({"op": "nbx.launch tiny kernel", "nbx_us": round(us, 2)})
    except Exception as e:  # noqa: BLE001
        print(f"(raw launch row failed: {type(e).__name__}: {e})")

    for name, fn, spec in rows:
        try:
            us = per_call(fn, nsync)
        except Exception as e:  # noqa: BLE001 - report the row and go on
            print(f"{name:34s} ERROR {type(e).__name__}: {e}")
            out.append({"op": name, "error": f"{type(e).__name__}: {e}"})
            continue
        tus = None
        if torch is not None:
            try:
                tus = per_call(_torch_fn(spec, T, torch), torch.cuda.synchronize)
            except Exception as e:  # noqa: BLE001
                print(f"  torch row failed: {e}")
        rec = {"op": name, "nbx_us": round(us, 2)}
        if tus is not None:
            rec.update(torch_us=round(tus, 2), ratio=round(us / tus, 2))
        out.append(rec)
        print(f"{name:34s} {us:8.2f} {tus if tus is not None else float('nan'):9.2f} "
              f"{(us / tus) if tus else float('nan'):6.2f}")
    return {"mode": "cuda", "rows": out}


def _profile(rows, sync):
    """cProfile each row over 2000 calls on real cuda tensors, top 18 by own time."""
    import cProfile
    import pstats
    for name, fn, _ in rows:
        for _ in range(100):
            fn()
        sync()
        pr = cProfile.Profile()
        t0 = time.perf_counter()
        pr.enable()
        for _ in range(2000):
            fn()
        sync()
        pr.disable()
        print(f"=== profile: {name} ({(time.perf_counter() - t0) / 2000 * 1e6:.1f} us/call "
              f"under the profiler)")
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", nargs="?", default=os.environ.get("OUT", "."))
    p.add_argument("--device", choices=["cpu-stub", "cuda"], default="cpu-stub")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--fake-cuda", action="store_true", help="cpu-stub mode on cuda tensors over "
                   "a pretend allocator (the cuda allocation path, no GPU)")
    p.add_argument("--with-launcher", action="store_true", help="--fake-cuda with the real "
                   "launcher over no-op cuLaunchKernel(Ex) stubs (kernels compile for sm_90)")
    p.add_argument("--profile", default=None, help="cProfile the first row whose name contains "
                   "this (cpu-stub mode); cuda mode: every row matching any of a comma list")
    args = p.parse_args(argv)
    res = cuda_mode(args) if args.device == "cuda" else cpu_stub(args)
    if res is None:
        return
    res.update(python=platform.python_version(), machine=platform.node(),
               time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    os.makedirs(args.outdir, exist_ok=True)
    path = os.path.join(args.outdir, f"bench_overhead_{res['mode']}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
