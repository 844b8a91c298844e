"""Generate (on an H100/H200) or merge the shipped autotune table for sm_90.

    PYTHONPATH=src python3 scripts/make_sm90_table.py [OUTDIR] [--deadline S] [--resume FILE]
                                                      [--quick] [--workers N]
    python3 scripts/make_sm90_table.py --merge NEW.json [--into TABLE.json]   # no GPU needed

Sweep mode: screens and times (autotune/sweep.py) every tunable kernel the reference models
run -- SmolLM2-135M and all-MiniLM-L6-v2: decode GEMVs (M=1), prefill matmuls (M=128,
2048), attention prefill, decode attention (KV cache 128/512/2048), batched GEMVs (M=16),
rms_norm, softmax -- most valuable first (cli_tune.dims_keys groups, the two models
interleaved per group), then common sizes (Llama-3.2-1B / Llama-3-8B shaped linears and
attention, 4096^3 / 8192^3 matmuls). Each key's candidates are pruned first (space.prune:
tiles beyond the key's extent, identical launches) and compiled in a pool of processes
(sweep.Precompiler); each key runs in the persistent tuning process (a device fault costs
that candidate, not the run). OUTDIR/sm90.json (OUTDIR: argv, else $OUT, else .) is
rewritten after every key; `--deadline S` (default 540) stops starting keys after S seconds
and abandons a key that would run past it, so a stopped run keeps what it did; `--resume
FILE` carries FILE's entries over and skips their keys (only entries of this card's cc
and Triton inside today's space; the other keys are swept again). A log of every key
(seconds, speed-up, exclusions, pruning) goes to OUTDIR/make_sm90_table_log.json.

Merge mode: lays NEW's entries over the table (default src/nbxtensor/autotune/tables/
sm90.json): the same (cc, Triton, kernel, bucketed key, dtype) -> the new entry wins, whole
(config, screen record, timing); entries outside today's declared space are dropped and
listed. Prints what it did.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
TABLE = os.path.join(HERE, "..", "src", "nbxtensor", "autotune", "tables", "sm90.json")

_VALUED = {"--resume", "--deadline", "--merge", "--into", "--workers"}


def _opt(name, default=None):
    if name in sys.argv:
        i = sys.argv.index(name)
        if i + 1 >= len(sys.argv):
            sys.exit(f"make_sm90_table: {name} needs a value")
        return sys.argv[i + 1]
    return default


QUICK = "--quick" in sys.argv
ARGS = [a for i, a in enumerate(sys.argv[1:], 1)
        if not a.startswith("--") and sys.argv[i - 1] not in _VALUED]

# (kind, hidden, intermediate, heads, kv heads, head_dim, vocab): cli_tune's dims
REFERENCE = {"smollm2-135m": ("llama", 576, 1536, 9, 3, 64, 49152),
             "all-minilm-l6-v2": ("bert", 384, 1536, 12, 12, 32, 30522)}
COMMON = {"llama-3.2-1b": ("llama", 2048, 8192, 32, 8, 64, 128256),
          "llama-3-8b": ("llama", 4096, 14336, 32, 8, 128, 128256)}
SQUARE = [(4096, 4096, 4096), (8192, 8192, 8192)]


def keys(quick: bool = QUICK) -> list[tuple[str, tuple, str]]:
    """(kernel, key, dtype) in priority order, unique per bucket."""
    from nbxtensor.autotune.space import get_tunable
    from nbxtensor.cli_tune import dims_keys
    tokens = (1, 128) if quick else (1, 16, 128, 2048)
    contexts = (512,) if quick else (128, 512, 2048)
    ranked = []
    for tier, models in ((0, REFERENCE), (1, {} if quick else COMMON)):
        for mi, dims in enumerate(models.values()):
            for j, (g, kern, key, dt) in enumerate(dims_keys(dims, tokens, contexts)):
                ranked.append(((tier, g, j, mi), kern, key, dt))
    # `nbx generate smollm2` runs the Q4_1 GGUF with float32 activations: its attention,
    # decode attention (cache = prompt + new tokens, rounded up to 128) and norms in float32
    gen = REFERENCE["smollm2-135m"]
    for j, (g, kern, key, dt) in enumerate(dims_keys(gen, (1, 32), (128, 512), "float32")):
        if kern in ("attention", "decode_attention", "rms_norm"):
            ranked.append(((0, g, j, len(REFERENCE)), kern, key, dt))
    out = [(kern, key, dt) for _, kern, key, dt in sorted(ranked, key=lambda r: r[0])]
    if not quick:
        out += [("matmul", s, dt) for s in SQUARE for dt in ("bfloat16", "float16")]
    seen, uniq = set(), []
    for kern, key, dt in out:
        b = (kern, get_tunable(kern).bucket(key), dt)
        if b not in seen:
            seen.add(b)
            uniq.append((kern, tuple(key), dt))
    return uniq


def merge(new_path: str, into: str) -> int:
    from nbxtensor.autotune import cache
    new = cache._read(new_path)
    base = cache._read(into) if os.path.exists(into) else []
    entries, rep = cache.merge_tables(base, new)
    entries.sort(key=lambda e: (e["kernel"], e["dtype"], e["key"]))
    cache._write(into, entries)
    print(f"merged {new_path} into {into}: {rep['new']} new entries ({rep['added']} added, "
          f"{rep['replaced']} replaced), {rep['kept']} of the table's {rep['base']} kept, "
          f"{len(rep['dropped'])} dropped as outside today's space -> {len(entries)} entries")
    for d in rep["dropped"]:
        print(f"  dropped ({d['source']}) {d['kernel']} {d['key']} {d['dtype']}: {d['reason']}")
    return 0


def carry_over(entries: list[dict], cc: str, triton: str) -> tuple[list[dict], list]:
    """The --resume entries worth keeping: this card's cc and this Triton (the loaders use
    no other), inside today's space (cache.usable_in_space) -- kept whole. An entry left
    out is not counted as done, so its key is swept again. Returns (kept, [(kernel, key,
    dtype, why)])."""
    from nbxtensor.autotune import cache
    kept, dropped = [], []
    for e in entries:
        if e.get("cc") != cc or e.get("triton") != triton:
            why = f"tuned for {e.get('cc')} / Triton {e.get('triton')}"
        else:
            why = cache.usable_in_space(e)
        if why is None:
            kept.append(e)
        else:
            dropped.append((e.get("kernel"), e.get("key"), e.get("dtype"), why))
    return kept, dropped


def sweep() -> int:
    outdir = ARGS[0] if ARGS else os.environ.get("OUT", ".")
    resume = _opt("--resume")
    deadline = float(_opt("--deadline", "540"))
    workers = _opt("--workers")
    os.makedirs(outdir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="nbx-sm90-")       # a private cache: it becomes the table
    os.environ["NBX_CACHE_DIR"] = work
    os.environ["NBX_NO_SHIPPED_TABLE"] = "1"          # sweeps time the rule, not the old table
    import nbxtensor as nbx
    from nbxtensor import autotune
    from nbxtensor.autotune import cache
    from nbxtensor.cli_tune import run_keys
    t_start = time.perf_counter()
    dev = nbx.device("cuda")
    ident = autotune.device_identity(dev)
    if ident[1] != "sm_90":
        print(f"warning: this device is {ident}, not sm_90; the table will not be used on "
              f"sm_90 cards", file=sys.stderr)
    if resume:
        kept, dropped = carry_over(cache._read(resume), ident[1], cache.triton_version())
        cache.store(kept)
        for d in dropped:
            print(f"  not carried over: {d[0]} {d[1]} {d[2]}: {d[3]}", flush=True)
    out_path = os.path.join(outdir, f"{ident[1].replace('_', '')}.json")
    log = []

    def write_table():
        entries = [e for e in cache._read(cache.cache_path()) if e["cc"] == ident[1]]
        cache._write(out_path, entries)
        with open(os.path.join(outdir, "make_sm90_table_log.json"), "w") as f:
            json.dump(dict(device=ident, triton=cache.triton_version(), deadline_s=deadline,
                           log=log), f, indent=1, default=str)
        return len(entries)

    done = {(e["kernel"], tuple(e["key"]), e["dtype"]) for e in cache._read(cache.cache_path())}
    todo = [(k, key, dt) for k, key, dt in keys()
            if (k, autotune.get_tunable(k).bucket(key), dt) not in done]
    print(f"{len(todo)} keys to sweep on {ident[0]} ({ident[1]}), triton "
          f"{cache.triton_version()}; {len(done)} carried over; deadline {deadline:.0f} s",
          flush=True)

    def on_entry(kern, key, dt, e):
        if isinstance(e, dict):
            tm, sc = e["timing"], e["screen"]
            log.append(dict(kernel=kern, key=key, dtype=dt, sweep_s=tm["sweep_s"],
                            precompile=tm.get("precompile"), best_us=tm["best"]["median_ms"] * 1e3,
                            default_us=(tm["default_ms"] or 0) * 1e3, speedup=tm["speedup"],
                            candidates=sc["candidates"], passed=sc["passed"],
                            excluded=len(sc["excluded"]), dropped=len(tm["dropped"]),
                            pruned=sc.get("pruned"), config=e["config"]))
        else:
            log.append(dict(kernel=kern, key=key, dtype=dt, error=str(e)[:500]))
        write_table()

    left = max(1.0, deadline - (time.perf_counter() - t_start))
    res = run_keys(todo, dev, budget_s=30.0, deadline_s=left,
                   workers=int(workers) if workers is not None else None,
                   on_entry=on_entry, stream=sys.stdout)
    n = write_table()
    if res["left"]:
        print(f"deadline of {deadline:.0f} s reached: {res['left']} keys left; rerun with "
              f"--resume {out_path}", flush=True)
    print(f"wrote {n} entries to {out_path} ({res['tuned']} swept now, {res['failed']} not "
          f"tuned, {res['fault']} faults) in {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0


def main() -> int:
    if _opt("--merge"):
        return merge(_opt("--merge"), _opt("--into", TABLE))
    return sweep()


if __name__ == "__main__":
    sys.exit(main())
