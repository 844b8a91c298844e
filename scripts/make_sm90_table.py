"""Generate the shipped autotune table for sm_90 (run on an H100/H200).

    PYTHONPATH=src python3 scripts/make_sm90_table.py [--quick] [--resume FILE] [--deadline S] [OUTDIR]

Sweeps (screen + time, autotune/sweep.py) the matmul/GEMV keys of the reference models
(SmolLM2-135M, all-MiniLM-L6-v2) and of common sizes (Llama-3.2-1B and Llama-3-8B shaped
linears), M in {1, 16, 128, 2048}, bf16 (and fp16 for the square sizes), and writes
OUTDIR/sm90.json (OUTDIR: argv, else $OUT, else .) after every key, so a run stopped by a
time limit keeps what it did. `--resume FILE` (a previous sm90.json) skips the keys it
holds and carries them over; `--deadline S` stops starting new keys after S seconds
(default 540, under a 10-minute command limit). Copy the result to
src/nbxtensor/autotune/tables/sm90.json; tests/test_autotune.py checks that every entry is
inside today's space.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

QUICK = "--quick" in sys.argv


def _opt(name, default=None):
    if name in sys.argv:
        i = sys.argv.index(name)
        return sys.argv[i + 1]
    return default


_VALUED = {"--resume", "--deadline"}
ARGS = [a for i, a in enumerate(sys.argv[1:], 1)
        if not a.startswith("--") and sys.argv[i - 1] not in _VALUED]
OUTDIR = ARGS[0] if ARGS else os.environ.get("OUT", ".")
RESUME = _opt("--resume")
DEADLINE = float(_opt("--deadline", "540"))

# (name, kind, hidden, intermediate, heads, kv heads, head_dim, vocab)
MODELS = [
    ("smollm2-135m", "llama", 576, 1536, 9, 3, 64, 49152),
    ("all-minilm-l6-v2", "bert", 384, 1536, 12, 12, 32, 30522),
    ("llama-3.2-1b", "llama", 2048, 8192, 32, 8, 64, 128256),
    ("llama-3-8b", "llama", 4096, 14336, 32, 8, 128, 128256),
]
TOKENS = (1, 16, 128, 2048)
SQUARE = [(4096, 4096, 4096), (8192, 8192, 8192)]


def linear_shapes(kind, hid, inter, hq, hkv, hd, vocab):
    if kind == "llama":
        return [(hq * hd, hid), (hkv * hd, hid), (hid, hq * hd), (inter, hid), (hid, inter),
                (vocab, hid)]
    return [(hid, hid), (inter, hid), (hid, inter)]


def keys():
    """(kernel, key, dtype) in priority order: reference models first."""
    from nbxtensor.autotune.sweep import kernel_for
    out = []
    models = MODELS[:1] if QUICK else MODELS
    tokens = (1, 128) if QUICK else TOKENS
    for name, *dims in models:
        for m in tokens:
            for n, k in linear_shapes(*dims):
                out.append((kernel_for((m, n, k)), (m, n, k), "bfloat16"))
    if not QUICK:
        for s in SQUARE:
            out += [("matmul", s, "bfloat16"), ("matmul", s, "float16")]
    seen, uniq = set(), []
    from nbxtensor.autotune.space import get_tunable
    for kern, key, dt in out:
        b = (kern, get_tunable(kern).bucket(key), dt)
        if b not in seen:
            seen.add(b)
            uniq.append((kern, key, dt))
    return uniq


def main() -> int:
    os.makedirs(OUTDIR, exist_ok=True)
    # tune into a private cache: it becomes the table
    work = tempfile.mkdtemp(prefix="nbx-sm90-")
    os.environ["NBX_CACHE_DIR"] = work
    import nbxtensor as nbx
    from nbxtensor import autotune
    from nbxtensor.autotune import cache
    from nbxtensor.autotune.screen import DeviceFault, ScreenError
    from nbxtensor.autotune.sweep import tune_isolated   # a device fault cannot end the run
    dev = nbx.device("cuda")
    ident = autotune.device_identity(dev)
    if ident[1] != "sm_90":
        print(f"warning: this device is {ident}, not sm_90; the table will not be used on "
              f"sm_90 cards", file=sys.stderr)
    if RESUME:
        cache.store(cache._read(RESUME))
    t_start = time.perf_counter()
    todo = keys()
    out_path = os.path.join(OUTDIR, f"{ident[1].replace('_', '')}.json")
    log = []

    def write_table():
        entries = [e for e in cache._read(cache.cache_path()) if e["cc"] == ident[1]]
        cache._write(out_path, entries)
        with open(os.path.join(OUTDIR, "make_sm90_table_log.json"), "w") as f:
            json.dump(dict(device=ident, triton=cache.triton_version(), log=log), f, indent=1)
        return len(entries)

    done = {(e["kernel"], tuple(e["key"]), e["dtype"]) for e in cache._read(cache.cache_path())}
    print(f"{len(todo)} keys on {ident[0]} ({ident[1]}), triton {cache.triton_version()}; "
          f"{len(done)} carried over", flush=True)
    for i, (kern, key, dt) in enumerate(todo):
        bkey = autotune.get_tunable(kern).bucket(key)
        if (kern, bkey, dt) in done:
            continue
        if time.perf_counter() - t_start > DEADLINE:
            print(f"deadline of {DEADLINE:.0f} s reached: {len(todo) - i} keys left; rerun with "
                  f"--resume {out_path}", flush=True)
            break
        t0 = time.perf_counter()
        try:
            e = tune_isolated(kern, key, dtype=dt, device=dev, budget_s=60.0)
        except (DeviceFault, RuntimeError) as err:
            print(f"{kern:6} {key} {dt}: FAILED: {err}", flush=True)
            log.append(dict(kernel=kern, key=key, dtype=dt, error=str(err)))
            write_table()
            continue
        except (ScreenError, ValueError) as err:
            print(f"{kern:6} {key} {dt}: NOT TUNED: {err}", flush=True)
            log.append(dict(kernel=kern, key=key, dtype=dt, error=str(err)))
            continue
        tm, sc = e["timing"], e["screen"]
        print(f"[{i + 1}/{len(todo)}] {kern:6} {'x'.join(map(str, key)):<18} {dt:<8} "
              f"best {tm['best']['median_ms'] * 1e3:9.1f} us  default "
              f"{(tm['default_ms'] or float('nan')) * 1e3:9.1f} us  x{tm['speedup'] or 0:.2f}  "
              f"screen {sc['passed']}/{sc['candidates']} passed  {time.perf_counter() - t0:6.1f} s",
              flush=True)
        log.append(dict(kernel=kern, key=key, dtype=dt, sweep_s=tm["sweep_s"],
                        speedup=tm["speedup"], excluded=len(sc["excluded"]),
                        dropped=len(tm["dropped"])))
        write_table()
    n = write_table()
    print(f"wrote {n} entries to {out_path} in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
