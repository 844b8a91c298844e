"""`nbx tune`: pre-tune the kernels a model uses (matmul/GEMV, attention prefill, decode
attention, rms_norm, softmax), or a list of matmul shapes; list or clear the autotune cache.

    nbx tune smollm2 [--deadline 300]        # every tunable kernel of a model, by priority
    nbx tune minilm --kernels matmul,attention
    nbx tune --shapes 1x4096x4096,128x14336x4096 --dtype bfloat16
    nbx tune --list
    nbx tune --clear
"""
from __future__ import annotations

import json
import os
import sys
import time

from .cli_commands import _int_at_least, _real

# Reference models' dimensions (of the pinned packages registry.py installs): a known name
# needs no file read. (kind, hidden, intermediate, heads, kv heads, head_dim, vocab)
_KNOWN_DIMS = {
    "smollm2": ("llama", 576, 1536, 9, 3, 64, 49152),
    "minilm": ("bert", 384, 1536, 12, 12, 32, 30522),
}
DEFAULT_TOKENS = (1, 16, 128, 2048)


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="autotune kernel configs for a model or shapes",
                       description="Screen (against a float64 reference) and time the declared "
                                   "configs of every tunable kernel a model runs (matmul, GEMV, "
                                   "attention prefill, decode attention, rms_norm, softmax; "
                                   "--shapes: matmul/GEMV) for each key, and "
                                   "store the fastest correct one in the autotune cache "
                                   "($NBX_CACHE_DIR/autotune.json or "
                                   "~/.cache/nbxtensor/autotune.json).")
    p.add_argument("model", nargs="?", default=None,
                   help="a model folder, .gguf file or known name (smollm2, minilm): tunes its "
                        "kernels at M in --tokens and cache sizes in --contexts, most "
                        "valuable first (decode GEMVs, prefill matmuls, attention, decode "
                        "attention, batched GEMVs, norms, softmax)")
    p.add_argument("--shapes", default=None,
                   help="comma-separated MxNxK (out[M,N] = x[M,K] @ W[N,K]^T), e.g. 1x4096x4096")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)),
                   help=f"M values (tokens a step) for a model (default {DEFAULT_TOKENS})")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default=None, help="cuda (default), cuda:N, or interp")
    p.add_argument("--budget", type=_real(lambda v: v > 0, "> 0"), default=60.0,
                   help="seconds of timing per shape before the remaining candidates are skipped")
    p.add_argument("--contexts", default=",".join(map(str, DEFAULT_CONTEXTS)),
                   help="KV-cache capacities for a model's decode attention keys "
                        f"(default {DEFAULT_CONTEXTS})")
    p.add_argument("--kernels", default=None,
                   help="only these kernels (comma-separated: matmul, gemv, attention, "
                        "decode_attention, rms_norm, softmax)")
    p.add_argument("--deadline", type=_real(lambda v: v > 0, "> 0"), default=None,
                   help="seconds: start no key after this, abandon one that would run past it "
                        "(what is done stays in the cache)")
    p.add_argument("--workers", type=_int_at_least(0), default=None,
                   help="processes compiling candidates ahead of each screen on cuda "
                        "(default: CPUs - 2, at most 12; 0: none)")
    p.add_argument("--list", action="store_true", help="list the cache's entries")
    p.add_argument("--clear", action="store_true", help="delete the user cache")
    p.add_argument("--json", action="store_true", help="with --list: print JSON")
    p.set_defaults(fn=cmd_tune)


def _fail(msg: str) -> int:
    print(f"nbx: error: {msg}", file=sys.stderr)
    return 2


MAX_OPERAND_ELEMENTS = 1 << 33     # 16 GiB of bf16: far above any shape a model has


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        bits = part.lower().split("x")
        try:
            dims = tuple(int(b) for b in bits)
        except ValueError:
            dims = ()
        if len(dims) != 3 or min(dims) < 1:
            raise ValueError(f"--shapes: {part!r} is not MxNxK with positive ints (e.g. 1x4096x4096)")
        M, N, K = dims
        big = max(M * K, K * N, M * N)
        if big > MAX_OPERAND_ELEMENTS:      # refused before any allocation
            raise ValueError(f"--shapes: {part!r} has an operand of {big:,} elements "
                             f"({big * 2 / 2**30:,.0f} GiB in bf16); at most "
                             f"{MAX_OPERAND_ELEMENTS:,} elements an operand can be tuned")
        out.append(dims)
    if not out:
        raise ValueError("--shapes: no shape given")
    return out


def _dims_of(model: str):
    """(kind, hidden, inter, heads, kv heads, head_dim, vocab) of MODEL without its weights."""
    from .models import registry
    from .models.config import BertConfig, LlamaConfig
    k = registry._ALIASES.get(model.lower())
    if k in _KNOWN_DIMS and not os.path.exists(model):
        return _KNOWN_DIMS[k]      # the pinned packages' dimensions; no need to read the file
    kind, path = registry.resolve(model)
    if kind == "bert-folder":
        c = BertConfig.from_folder(path)
        return ("bert", c.hidden_size, c.intermediate_size, c.num_attention_heads,
                c.num_attention_heads, c.hidden_size // c.num_attention_heads, c.vocab_size)
    if kind == "llama-folder":
        with open(os.path.join(path, "config.json")) as f:
            c = LlamaConfig.from_hf(json.load(f))
    else:
        from .io.gguf import load_gguf
        c = LlamaConfig.from_gguf(load_gguf(path))
    return ("llama", c.hidden_size, c.intermediate_size, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim, c.vocab_size)


DEFAULT_CONTEXTS = (128, 512, 2048)

# priority groups of a model's keys (lower first): what a generate/embed call spends most
# time in, and what a sweep should have done when a deadline stops it
GROUPS = ("decode GEMV (M=1)", "prefill matmul", "attention prefill", "decode attention",
          "batched GEMV (M<=16)", "norm", "softmax")


def dims_keys(dims, tokens=DEFAULT_TOKENS, contexts=DEFAULT_CONTEXTS, dtype="bfloat16"):
    """[(group, kernel, key, dtype)] of every tunable kernel a model of `dims` (kind,
    hidden, intermediate, heads, kv heads, head_dim, vocab) runs, at M (tokens a step) in
    `tokens` and KV-cache capacities in `contexts`; sorted by group, unique per bucket."""
    from .autotune.space import get_tunable
    from .autotune.sweep import kernel_for
    kind, hid, inter, hq, hkv, hd, vocab = dims
    if kind == "llama":
        layers = [(hq * hd, hid), (hkv * hd, hid), (hid, hq * hd), (inter, hid), (hid, inter),
                  (vocab, hid)]
    else:
        layers = [(hid, hid), (inter, hid), (hid, inter)]
    out = []
    # an encoder never runs one token a step; its attention is at most 512 positions long
    toks = tokens if kind == "llama" else [m for m in tokens if m > 1]
    for m in toks:
        for n, k in layers:
            kern = kernel_for((m, n, k), dtype)
            g = 0 if m == 1 else (4 if kern == "gemv" else 1)
            out.append((g, kern, (m, n, k)))
    causal = 1 if kind == "llama" else 0
    for m in toks:
        if m > 1:
            out.append((2, "attention", (m if causal else min(m, 512), hq, hkv, hd, causal)))
    if kind == "llama":
        for c in contexts:
            out.append((3, "decode_attention", (hkv, c, hq // hkv, hd)))
        for m in tokens:
            out.append((5, "rms_norm", (m, hid)))
        # sampling over the vocabulary -- unless one row that long takes softmax's split-row
        # path (on any device: every row longer than MAX_SINGLE, when there is one row),
        # which runs before the autotune seam and has nothing to tune
        from .kernels.softmax import MAX_SINGLE
        if vocab <= MAX_SINGLE:
            out.append((6, "softmax", (1, vocab)))
    seen, uniq = set(), []
    for g, kern, key in sorted(out, key=lambda r: r[0]):
        b = (kern, get_tunable(kern).bucket(key))
        if b not in seen:
            seen.add(b)
            uniq.append((g, kern, key, dtype))
    return uniq


def model_keys(model: str, tokens=DEFAULT_TOKENS, contexts=DEFAULT_CONTEXTS, dtype="bfloat16"):
    """dims_keys of MODEL (a known name, folder or .gguf): [(group, kernel, key, dtype)]."""
    return dims_keys(_dims_of(model), tokens, contexts, dtype)


def model_shapes(model: str, tokens) -> tuple[list, list]:
    """(linear shapes (M, N, K), other kernels' keys as text) for MODEL at each M in tokens."""
    keys = model_keys(model, tokens)
    shapes = [k for _, kern, k, _ in keys if kern in ("matmul", "gemv")]
    other = [f"{kern} {k}" for _, kern, k, _ in keys if kern not in ("matmul", "gemv")]
    return shapes, other


class Progress:
    """A one-line progress bar on stderr: shapes done, then the phase of the current one."""

    def __init__(self, total: int, stream=None, width: int = 28):
        stream = stream if stream is not None else sys.stderr
        self.total, self.stream, self.width = total, stream, width
        self.done, self.label = 0, ""
        self.tty = stream.isatty()

    def start(self, label: str) -> None:
        self.label = label
        self._draw("")

    def phase(self, name: str, i: int, n: int) -> None:
        self._draw(f"{name} {i}/{n}")

    def finish(self, msg: str) -> None:
        self.done += 1
        self._draw("", end="\n")
        print(f"  {msg}", file=self.stream)

    def _draw(self, extra: str, end: str = "") -> None:
        frac = self.done / max(self.total, 1)
        fill = int(frac * self.width)
        line = f"[{'#' * fill}{'.' * (self.width - fill)}] {self.done}/{self.total} {self.label} {extra}"
        if self.tty:
            self.stream.write("\r" + line.ljust(100) + end)
        elif end or not extra:
            self.stream.write(line + "\n")
        self.stream.flush()


def cmd_tune(args) -> int:
    from . import autotune
    from .autotune import cache
    if args.clear and (args.list or args.json or args.model or args.shapes):
        return _fail("--clear goes alone (not with --list, --json, a MODEL or --shapes)")
    if args.clear:
        n = cache.clear()
        autotune.reload()
        print(f"removed {n} entries ({cache.cache_path()})")
        return 0
    if args.list:
        return _list(args)
    if (args.model is None) == (args.shapes is None):
        return _fail("give a MODEL or --shapes (exactly one), or --list / --clear")
    import nbxtensor as nbx
    try:
        dtype = nbx.dtypes.as_dtype(args.dtype)
        device = nbx.device(args.device or "cuda")
    except (ValueError, TypeError) as e:
        return _fail(str(e))
    from .autotune.sweep import kernel_for
    try:
        if args.shapes:
            keys = [(0, kernel_for(s, dtype.name), s, dtype.name) for s in parse_shapes(args.shapes)]
        else:
            tokens = _ints(args.tokens, "--tokens")
            contexts = _ints(args.contexts, "--contexts")
            keys = model_keys(args.model, tokens, contexts, dtype.name)
        if args.kernels:
            want = {k.strip() for k in args.kernels.split(",") if k.strip()}
            unknown = want - set(autotune.TUNABLES)
            if unknown:
                raise ValueError(f"--kernels: unknown {sorted(unknown)}; tunable: "
                                 f"{', '.join(sorted(autotune.TUNABLES))}")
            keys = [k for k in keys if k[1] in want]
    except (ValueError, FileNotFoundError, KeyError) as e:
        return _fail(str(e))
    if device.type == "cuda":
        from .backends.cuda import driver
        ok, why = driver.availability()
        if not ok:
            return _fail(f"no usable GPU ({why}); tuning needs --device cuda (or interp for a test)")
    elif device.type != "interp":
        return _fail(f"--device must be cuda or interp, got {device}")
    res = run_keys([k[1:] for k in keys], device, budget_s=args.budget, deadline_s=args.deadline,
                   workers=args.workers)
    print(f"tuned {res['tuned']} of {len(keys)} keys in {res['seconds']:.1f} s -> "
          f"{cache.cache_path()}" + (f"; {res['left']} left by the deadline" if res["left"] else ""))
    return 1 if res["failed"] or res["fault"] else 0


def _ints(text: str, flag: str) -> list[int]:
    try:
        v = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        v = []
    if not v or min(v) < 1:
        raise ValueError(f"{flag} must be comma-separated positive ints, got {text!r}")
    return v


def run_keys(keys, device, *, budget_s=60.0, deadline_s=None, workers=None, on_entry=None,
             stream=None) -> dict:
    """Sweep [(kernel, key, dtype)] in order, each stored in the user cache as it finishes;
    stops starting keys once `deadline_s` has passed and abandons a key that would run past
    it (what is done is kept). cuda: each key in the persistent tuning process (a device
    fault excludes the candidate and retries; see sweep.tune_isolated), compiles first in a
    pool of `workers` processes. on_entry(kernel, key, dtype, entry-or-error) after each key.
    Returns counts."""
    from .autotune.screen import DeviceFault, ScreenError
    from .autotune.sweep import Precompiler, close_worker, tune, tune_isolated
    bar = Progress(len(keys), stream=stream)
    cuda = device.type == "cuda"
    pc = Precompiler(workers) if cuda and workers != 0 else None
    t0 = time.perf_counter()
    res = dict(tuned=0, failed=0, fault=0, left=0)
    try:
        for i, (kern, key, dt) in enumerate(keys):
            spent = time.perf_counter() - t0
            if deadline_s is not None and spent >= deadline_s:
                res["left"] = len(keys) - i
                break
            bar.start(f"{kern} {'x'.join(map(str, key))} {dt}")
            left = None if deadline_s is None else max(1.0, deadline_s - spent)
            try:
                if cuda:
                    # a key may not outlive the deadline (plus a grace for its last timing)
                    e = tune_isolated(kern, key, dtype=dt, device=device,
                                      budget_s=min(budget_s, left or budget_s),
                                      precompiler=pc, timeout_s=None if left is None else left + 15)
                else:
                    e = tune(kern, key, dtype=dt, device=device, budget_s=budget_s,
                             progress=bar.phase)
            except DeviceFault as err:
                res["fault"] += 1
                bar.finish(f"FAULT: {err}")
                if on_entry:
                    on_entry(kern, key, dt, err)
                break
            except (ScreenError, ValueError, KeyError, RuntimeError) as err:
                res["failed"] += 1
                bar.finish(f"not tuned: {err}")
                if on_entry:
                    on_entry(kern, key, dt, err)
                continue
            res["tuned"] += 1
            tm = e["timing"]
            sp = f"{tm['speedup']:.2f}x vs default" if tm["speedup"] else "default failed"
            nex = len(e["screen"]["excluded"])
            pr = e["screen"].get("pruned")
            npr = f" ({pr['of'] - pr['kept']} pruned)" if pr else ""
            if tm.get("rule_wins"):
                npr += "; the rule's config (outside the space) is faster: not stored"
            bar.finish(f"{_cfg_text(e['config'])}: {tm['best']['median_ms'] * 1e3:.1f} us, {sp}; "
                       f"{e['screen']['passed']}/{e['screen']['candidates']} passed the screen"
                       f"{f', {nex} excluded' if nex else ''}{npr}; {tm['sweep_s']:.1f} s")
            if on_entry:
                on_entry(kern, key, dt, e)
    finally:
        if pc is not None:
            pc.close()
        if cuda:
            close_worker()
    res["seconds"] = time.perf_counter() - t0
    return res


def _cfg_text(cfg: dict) -> str:
    short = {"BLOCK_M": "BM", "BLOCK_N": "BN", "BLOCK_K": "BK", "num_warps": "w",
             "num_stages": "s", "GROUP_M": "G", "PERSISTENT": "pers", "FLATTEN": "flat",
             "TARGET": "progs"}
    return " ".join(f"{short.get(k, k)}={v}" for k, v in cfg.items())


def _list(args) -> int:
    from .autotune import cache
    try:
        entries = cache._read(cache.cache_path())
    except ValueError as e:
        return _fail(str(e))
    if args.json:
        print(json.dumps(entries, indent=1))
        return 0
    print(f"{cache.cache_path()}: {len(entries)} entries")
    for e in entries:
        key = "x".join(map(str, e["key"]))
        tm = e.get("timing") or {}
        sp = f" {tm['speedup']:.2f}x" if tm.get("speedup") else ""
        print(f"  {e['device']} ({e['cc']}) triton {e['triton']} {e['kernel']:<7} {key:<18} "
              f"{e['dtype']:<9} {_cfg_text(e['config'])}{sp}")
    return 0
