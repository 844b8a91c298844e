"""Autotuning on the H200: tuned vs untuned on the Ops-II / attention benchmark shapes, and
the cold start of `nbx generate` with the shipped table vs an empty one.

    PYTHONPATH=src python3 benchmarks/bench_autotune.py [--quick] [--cold-start | --cold-only]
                                                        [--deadline S] [OUTDIR]

Sections
  speed       for each benchmark shape: sweep the key (screen + time, empty private cache,
              candidates pruned and compiled in a process pool, the sweep in the persistent
              tuning process so a device fault costs a candidate, not the run), then time in
              THIS process, on the same inputs, the kernel's rule ("untuned", autotune
              disabled) against the swept config ("tuned"), and torch where it has the op.
              Shapes -- issue 5 (Ops II): matmul 4096^3 and 8192^3 bf16, Llama-3.2-1B linears
              at M in {1, 16, 128, 2048}, odd sizes (1000^3, 4097x4095x4093), decode GEMVs;
              issue 6: attention B=4 H=32 S=4096 D=128 causal and not, D=64; decode attention
              B=1, 32 query / 8 kv heads, D=128, KV cache 1k..32k. --quick samples them.
              Attention at B=4: the sweep runs one sequence (B=1, the seam's key); "tuned" is
              that config forced at B=4 and `seam_applies` says whether sdpa's seam would pick
              it by itself at that shape (it does for B == 1 only).
  cold start  (--cold-start / --cold-only, when the smollm2 model package is installed): a
              fresh process `nbx generate smollm2 --device cuda`, with an EMPTY Triton cache
              dir and an EMPTY nbx tune cache, once with the shipped table and once with
              NBX_NO_SHIPPED_TABLE=1: time to the first generated text (from process start;
              the device loop hands tokens over every 4 steps), load time, prefill and decode
              tok/s, as `nbx generate` prints them.

Timing: CUDA events, 256 MB L2 flushes before each timed run (repeated to cover the host's
enqueue time), warm-up, median (autotune/timing.py; the same recipe for torch).
New keys stop being started after --deadline seconds (default 100 with --quick, 480);
the JSON lists those skipped. Nothing of the user's cache is read or written.
JSON to OUTDIR/autotune.json (OUTDIR: argv, else $OUT, else .); the tables last.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
os.environ["NBX_CACHE_DIR"] = tempfile.mkdtemp(prefix="nbx-bench-autotune-")
os.environ["NBX_NO_SHIPPED_TABLE"] = "1"      # tuned = this run's sweep; untuned = the rule

QUICK = "--quick" in sys.argv
COLD = "--cold-start" in sys.argv or "--cold-only" in sys.argv
COLD_ONLY = "--cold-only" in sys.argv
_VALUED = {"--deadline"}
ARGS = [a for i, a in enumerate(sys.argv[1:], 1)
        if not a.startswith("--") and sys.argv[i - 1] not in _VALUED]
OUTDIR = ARGS[0] if ARGS else os.environ.get("OUT", ".")
DEADLINE_S = float(sys.argv[sys.argv.index("--deadline") + 1]) if "--deadline" in sys.argv \
    else (100.0 if QUICK else 480.0)
RESULTS = {"speed": [], "cold_start": None, "errors": [], "skipped_by_deadline": []}
T_START = time.perf_counter()
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def speed_keys():
    """(kernel, key, dtype, extra) -- extra: attention batch."""
    mm = [("matmul", (4096, 4096, 4096)), ("gemv", (1, 8192, 2048)), ("gemv", (16, 2048, 2048)),
          ("matmul", (128, 8192, 2048)), ("matmul", (2048, 2048, 8192)),
          ("matmul", (1000, 1000, 1000)), ("gemv", (1, 14336, 4096))]
    at = [("attention", (4096, 32, 32, 128, 1), 4), ("attention", (4096, 32, 32, 64, 1), 4),
          ("attention", (4096, 32, 32, 128, 0), 4)]
    dec = [("decode_attention", (8, 32768, 4, 128)), ("decode_attention", (8, 1024, 4, 128))]
    if not QUICK:
        mm = [("matmul", (4096, 4096, 4096)), ("matmul", (8192, 8192, 8192))]
        for m in (1, 16, 128, 2048):
            for n, k in [(2048, 2048), (512, 2048), (8192, 2048), (2048, 8192), (128256, 2048)]:
                mm.append(("gemv" if m <= 16 else "matmul", (m, n, k)))
        mm += [("matmul", (1000, 1000, 1000)), ("matmul", (4097, 4095, 4093)),
               ("gemv", (1, 4096, 4096)), ("gemv", (1, 14336, 4096)), ("gemv", (1, 4096, 14336))]
        at = [("attention", (4096, 32, 32, 128, c), 4) for c in (1, 0)] + \
             [("attention", (4096, 32, 32, 64, c), 4) for c in (1, 0)]
        dec = [("decode_attention", (8, c, 4, 128)) for c in (1024, 4096, 16384, 32768)]
    out = [(k, key, "bfloat16", None) for k, key in mm]
    # interleave so a deadline leaves a sample of each family
    att = [(k, key, "bfloat16", b) for k, key, b in at]
    dcd = [(k, key, "bfloat16", None) for k, key in dec]
    order = []
    for i in range(max(len(out), len(att), len(dcd))):
        for lst in (out, att, dcd):
            if i < len(lst):
                order.append(lst[i])
    return order


def _torch():
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - torch is an optional reference
        return None


def _torch_time(torch, fn, reps=10, warmup=3):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(warmup + 1):
        fn()
    ts = []
    for i in range(reps):
        for _ in range(3):            # as CudaTimer: the GPU stays busy while Python enqueues
            flush.fill_(i & 0xFF)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


class _BatchedAttention:
    """sdpa at batch B on fresh inputs: run(cfg) forces a config, run_default() is the rule,
    run_seam() is what the library does by itself (pick included)."""

    def __init__(self, key, B, dev):
        import nbxtensor as nbx
        from nbxtensor.autotune.space import _attn_key
        from nbxtensor.tensor import Tensor
        self.L, self.H, self.Hk, self.D, self.causal = _attn_key(key)
        import numpy as np
        g = np.random.default_rng(0)

        def mk(h):    # one sequence's values repeated over the batch (speed only)
            a = g.standard_normal((1, h, self.L, self.D), dtype=np.float32).astype(nbx.bfloat16.np)
            return nbx.tensor(a, device=dev).expand(B, h, self.L, self.D).contiguous()
        self.q, self.k, self.v = mk(self.H), mk(self.Hk), mk(self.Hk)
        self.out = Tensor._empty((B, self.H, self.L, self.D), nbx.bfloat16, dev)
        self.scale = self.D ** -0.5
        self.B = B

    def _call(self, over):
        from nbxtensor.kernels import attention as ka
        old = ka._OVERRIDE
        ka._OVERRIDE = over
        try:
            ka.sdpa(self.out, self.q, self.k, self.v, None, scale=self.scale,
                    is_causal=bool(self.causal))
        finally:
            ka._OVERRIDE = old

    def run(self, cfg):
        self._call(cfg)

    def run_default(self):
        from nbxtensor import autotune
        with autotune.disabled():
            self._call(None)

    def run_seam(self):
        self._call(None)


def _runner(kern, key, dtype, batch, dev):
    from nbxtensor.autotune.sweep import CASES
    if kern == "attention" and batch and batch > 1:
        return _BatchedAttention(key, batch, dev)
    return CASES[kern](key, dtype, dev)


def _torch_fn(torch, kern, key, batch):
    if torch is None:
        return None
    tb = torch.bfloat16
    if kern in ("matmul", "gemv"):
        m, n, k = key
        x, w = torch.randn(m, k, device="cuda", dtype=tb), torch.randn(n, k, device="cuda", dtype=tb)
        return lambda: torch.nn.functional.linear(x, w)
    if kern == "attention":
        L, H, Hk, D, causal = key
        q = torch.randn(batch or 1, H, L, D, device="cuda", dtype=tb)
        k, v = torch.randn_like(q), torch.randn_like(q)
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
    if kern == "decode_attention":
        BH, C, R, D = key
        q = torch.randn(1, BH * R, 1, D, device="cuda", dtype=tb)
        k = torch.randn(1, BH, C, D, device="cuda", dtype=tb)
        v = torch.randn_like(k)
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return None


def section_speed():
    import numpy as np
    import nbxtensor as nbx
    from nbxtensor import autotune
    from nbxtensor.autotune.sweep import Precompiler, close_worker, tune_isolated
    from nbxtensor.autotune.timing import CudaTimer
    print("== tuned vs untuned (bf16; the rule = untuned, this run's sweep = tuned) ==", flush=True)
    dev = nbx.device("cuda")
    timer = CudaTimer(dev)
    torch = _torch()
    pc = Precompiler()
    try:
        for kern, key, dtype, batch in speed_keys():
            label = f"{kern} {'x'.join(map(str, key))}" + (f" B={batch}" if batch else "")
            if time.perf_counter() - T_START > DEADLINE_S:
                RESULTS["skipped_by_deadline"].append(label)
                continue
            try:
                left = max(10.0, DEADLINE_S - (time.perf_counter() - T_START))
                t0 = time.perf_counter()
                e = tune_isolated(kern, key, dtype=dtype, device=dev, budget_s=min(20.0, left),
                                  precompiler=pc, timeout_s=left + 30)
                sweep_s = time.perf_counter() - t0
                r = _runner(kern, key, dtype, batch, dev)
                cfg = e["config"]
                def rule(r=r):
                    with autotune.disabled():       # the private cache now holds the entry
                        r.run_default()
                untuned = timer.measure(rule).median_ms
                tuned = timer.measure(lambda: r.run(cfg)).median_ms
                seam = None
                if isinstance(r, _BatchedAttention):
                    # the tuned config agrees with the rule at this batch (screened at B=1)
                    r.run_default()
                    ref = r.out.numpy().astype(np.float32)
                    r.run(cfg)
                    got = r.out.numpy().astype(np.float32)
                    agree = float(np.max(np.abs(got - ref)))
                    seam = timer.measure(r.run_seam).median_ms
                else:
                    agree = None
                tf = _torch_fn(torch, kern, key, batch)
                tt = _torch_time(torch, tf) if tf is not None else None
                sc = e["screen"]
                row = dict(kernel=kern, key=key, batch=batch, untuned_us=untuned * 1e3,
                           tuned_us=tuned * 1e3, speedup=untuned / tuned,
                           torch_us=tt * 1e3 if tt else None,
                           of_torch=(tt / tuned) if tt else None,
                           seam_us=seam * 1e3 if seam else None,
                           seam_applies=(batch in (None, 1)) if kern == "attention" else True,
                           max_abs_diff_tuned_vs_rule=agree, sweep_s=round(sweep_s, 1),
                           sweep_reported_s=e["timing"]["sweep_s"],
                           precompile=e["timing"].get("precompile"),
                           candidates=sc["candidates"], passed=sc["passed"],
                           excluded=len(sc["excluded"]), pruned=sc.get("pruned"),
                           config=cfg, default_config=e["timing"]["default_config"])
                RESULTS["speed"].append(row)
                print(f"  {label:<34} untuned {untuned * 1e3:9.1f} us  tuned {tuned * 1e3:9.1f} us"
                      f"  x{row['speedup']:.2f}" + (f"  torch {tt * 1e3:9.1f} us" if tt else "") +
                      f"  sweep {sweep_s:5.1f} s ({sc['passed']}/{sc['candidates']})", flush=True)
                del r
            except Exception as err:  # noqa: BLE001 - report, go on
                RESULTS["errors"].append(dict(section="speed", key=label, error=repr(err)[:500],
                                              tb=traceback.format_exc()[-1500:]))
                print(f"  {label}: FAILED {err!r}"[:400], flush=True)
    finally:
        pc.close()
        close_worker()
        autotune.reload()


_GEN_RE = re.compile(r"prefill (\d+) tokens: ([\d.]+) tok/s \| decode (\d+) tokens: ([\d.]+) tok/s")
_LOAD_RE = re.compile(r"loaded in ([\d.]+) s")


def _cold_run(label, extra_env, prompt, new_tokens, timeout_s):
    env = dict(os.environ)
    env.pop("NBX_NO_SHIPPED_TABLE", None)          # this process set it for its sweeps
    env.update(extra_env)
    env["NBX_CACHE_DIR"] = tempfile.mkdtemp(prefix="nbx-cold-tune-")      # empty tune cache
    env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="nbx-cold-triton-")  # empty compile cache
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-c", "import sys; from nbxtensor.cli import main; "
           "sys.exit(main(sys.argv[1:]))", "generate", "smollm2", "--device", "cuda",
           "--prompt", prompt, "--max-new-tokens", str(new_tokens), "--seed", "0"]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = {}
    chunks = []

    def read_out():
        while True:
            b = p.stdout.read1(4096) if hasattr(p.stdout, "read1") else p.stdout.read(1)
            if not b:
                return
            if b.strip() and "t" not in first:
                first["t"] = time.perf_counter() - t0
            chunks.append(b)
    th = threading.Thread(target=read_out, daemon=True)
    th.start()
    try:
        _, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    th.join(timeout=5)
    wall = time.perf_counter() - t0
    err = err.decode(errors="replace")
    m, ml = _GEN_RE.search(err), _LOAD_RE.search(err)
    res = dict(label=label, rc=p.returncode, wall_s=round(wall, 2),
               first_text_s=round(first["t"], 2) if "t" in first else None,
               load_s=float(ml.group(1)) if ml else None,
               prefill_tokens=int(m.group(1)) if m else None,
               prefill_tps=float(m.group(2)) if m else None,
               decode_tokens=int(m.group(3)) if m else None,
               decode_tps=float(m.group(4)) if m else None,
               text=b"".join(chunks).decode(errors="replace")[:200],
               stderr_tail=err[-600:])
    print(f"  {label:<26} first text {res['first_text_s']} s, wall {res['wall_s']} s, load "
          f"{res['load_s']} s, prefill {res['prefill_tps']} tok/s, decode {res['decode_tps']} "
          f"tok/s (rc {p.returncode})", flush=True)
    return res


def section_cold_start():
    try:
        from nbxtensor.models import registry
        registry.resolve("smollm2")
    except Exception as err:  # noqa: BLE001
        RESULTS["cold_start"] = f"skipped: the smollm2 model is not installed ({err})"
        print(f"== cold start: skipped ({err}) ==", flush=True)
        return
    from nbxtensor.autotune import cache
    shipped = len(cache._read(os.path.join(cache.TABLE_DIR, "sm90.json")))
    print(f"== nbx generate smollm2 cold start (empty Triton cache, empty tune cache; shipped "
          f"table: {shipped} entries) ==", flush=True)
    prompt, n = "Name three colours of the rainbow.", 64
    runs = [_cold_run("shipped table", {}, prompt, n, 150),
            _cold_run("NBX_NO_SHIPPED_TABLE=1", {"NBX_NO_SHIPPED_TABLE": "1"}, prompt, n, 150)]
    RESULTS["cold_start"] = dict(shipped_entries=shipped, prompt=prompt, max_new_tokens=n,
                                 runs=runs)


def main():
    import nbxtensor as nbx
    from nbxtensor import autotune
    from nbxtensor.autotune import cache
    print(f"device {autotune.device_identity(nbx.device('cuda'))}, triton "
          f"{cache.triton_version()}, quick={QUICK}, deadline {DEADLINE_S:.0f} s", flush=True)
    if not COLD_ONLY:
        section_speed()
    if COLD:
        section_cold_start()
    RESULTS["total_s"] = round(time.perf_counter() - T_START, 1)
    os.makedirs(OUTDIR, exist_ok=True)
    with open(os.path.join(OUTDIR, "autotune.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    if RESULTS["speed"]:
        print("\nkernel            key                  B  untuned_us  tuned_us  tuned/untuned  "
              "torch_us  of_torch  sweep_s")
        for r in RESULTS["speed"]:
            tt = f"{r['torch_us']:9.1f} {r['of_torch']:9.2f}" if r["torch_us"] else f"{'-':>9} {'-':>9}"
            print(f"{r['kernel']:<17} {'x'.join(map(str, r['key'])):<20} {r['batch'] or 1:<2} "
                  f"{r['untuned_us']:10.1f} {r['tuned_us']:9.1f} {r['speedup']:14.2f} {tt} "
                  f"{r['sweep_s']:8.1f}")
    cs = RESULTS["cold_start"]
    if isinstance(cs, dict):
        print("\ncold start (nbx generate smollm2)   first_text_s  load_s  prefill_tps  decode_tps")
        for r in cs["runs"]:
            print(f"{r['label']:<35} {r['first_text_s']!s:>12} {r['load_s']!s:>7} "
                  f"{r['prefill_tps']!s:>12} {r['decode_tps']!s:>11}")
    print(f"skipped by the {DEADLINE_S:.0f} s deadline: {RESULTS['skipped_by_deadline']}")
    print(f"errors: {len(RESULTS['errors'])}; total {RESULTS['total_s']} s; "
          f"JSON in {os.path.join(OUTDIR, 'autotune.json')}")


if __name__ == "__main__":
    main()
