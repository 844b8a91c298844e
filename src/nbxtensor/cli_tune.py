"""`nbx tune`: pre-tune the matmul/GEMV keys a model uses, or a list of shapes; list or
clear the autotune cache.

    nbx tune smollm2                         # the linear layers of a model, M in --tokens
    nbx tune --shapes 1x4096x4096,128x14336x4096 --dtype bfloat16
    nbx tune --list
    nbx tune --clear
"""
from __future__ import annotations

import json
import os
import sys
import time

# Reference models' dimensions (of the pinned packages registry.py installs): a known name
# needs no file read. (kind, hidden, intermediate, heads, kv heads, head_dim, vocab)
_KNOWN_DIMS = {
    "smollm2": ("llama", 576, 1536, 9, 3, 64, 49152),
    "minilm": ("bert", 384, 1536, 12, 12, 32, 30522),
}
DEFAULT_TOKENS = (1, 16, 128, 2048)


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="autotune matmul/GEMV configs for a model or shapes",
                       description="Screen (against a float64 reference) and time the declared "
                                   "configs of the matmul and GEMV kernels for each shape, and "
                                   "store the fastest correct one in the autotune cache "
                                   "($NBX_CACHE_DIR/autotune.json or "
                                   "~/.cache/nbxtensor/autotune.json).")
    p.add_argument("model", nargs="?", default=None,
                   help="a model folder, .gguf file or known name (smollm2, minilm): tunes its "
                        "linear layers at M in --tokens")
    p.add_argument("--shapes", default=None,
                   help="comma-separated MxNxK (out[M,N] = x[M,K] @ W[N,K]^T), e.g. 1x4096x4096")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)),
                   help=f"M values (tokens a step) for a model (default {DEFAULT_TOKENS})")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default=None, help="cuda (default), cuda:N, or interp")
    p.add_argument("--budget", type=float, default=60.0,
                   help="seconds of timing per shape before the remaining candidates are skipped")
    p.add_argument("--list", action="store_true", help="list the cache's entries")
    p.add_argument("--clear", action="store_true", help="delete the user cache")
    p.add_argument("--json", action="store_true", help="with --list: print JSON")
    p.set_defaults(fn=cmd_tune)


def _fail(msg: str) -> int:
    print(f"nbx tune: error: {msg}", file=sys.stderr)
    return 2


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


def model_shapes(model: str, tokens) -> tuple[list, list]:
    """(linear shapes (M, N, K), attention shapes as text) for MODEL at each M in tokens."""
    kind, hid, inter, hq, hkv, hd, vocab = _dims_of(model)
    if kind == "llama":
        layers = [(hq * hd, hid), (hkv * hd, hid), (hid, hq * hd), (inter, hid), (hid, inter),
                  (vocab, hid)]
    else:
        layers = [(hid, hid), (inter, hid), (hid, inter)]
    shapes = []
    for m in tokens:
        for n, k in layers:
            if (m, n, k) not in shapes:
                shapes.append((m, n, k))
    attn = [f"{kind} attention: {hq} heads x {hkv} kv heads x head_dim {hd}"]
    return shapes, attn


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
    if args.clear:
        n = cache.clear()
        autotune.reload()
        print(f"removed {n} entries ({cache.cache_path()})")
        return 0
    if args.list:
        return _list(args)
    if (args.model is None) == (args.shapes is None):
        return _fail("give a MODEL or --shapes (exactly one), or --list / --clear")
    try:
        if args.shapes:
            shapes, attn = parse_shapes(args.shapes), []
        else:
            tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
            if not tokens or min(tokens) < 1:
                return _fail(f"--tokens must be positive ints, got {args.tokens!r}")
            shapes, attn = model_shapes(args.model, tokens)
    except (ValueError, FileNotFoundError, KeyError) as e:
        return _fail(str(e))
    import nbxtensor as nbx
    try:
        dtype = nbx.dtypes.as_dtype(args.dtype)
        device = nbx.device(args.device or "cuda")
    except (ValueError, TypeError) as e:
        return _fail(str(e))
    if device.type == "cuda":
        from .backends.cuda import driver
        ok, why = driver.availability()
        if not ok:
            return _fail(f"no usable GPU ({why}); tuning needs --device cuda (or interp for a test)")
    elif device.type != "interp":
        return _fail(f"--device must be cuda or interp, got {device}")
    from .autotune.screen import DeviceFault, ScreenError
    from .autotune.sweep import kernel_for, tune, tune_isolated
    # on cuda each key runs in a child process, so a candidate that faults the device is
    # excluded and the sweep goes on (a fault poisons the process's CUDA context for good)
    run = tune_isolated if device.type == "cuda" else tune
    for line in attn:
        print(f"note: {line}: not tuned by `nbx tune` yet (it generates matmul/GEMV keys only); "
              f"`autotune.tune('attention', (L, H, Hk, D, causal), ...)` sweeps it and the kernel "
              f"reads the result", file=sys.stderr)
    bar = Progress(len(shapes))
    failed = 0
    t0 = time.perf_counter()
    for (m, n, k) in shapes:
        kern = kernel_for((m, n, k), dtype.name)
        bar.start(f"{kern} {m}x{n}x{k} {dtype.name}")
        try:
            e = run(kern, (m, n, k), dtype=dtype, device=device, budget_s=args.budget,
                    progress=bar.phase)
        except DeviceFault as err:
            bar.finish(f"FAULT: {err}")
            return 1
        except (ScreenError, ValueError, KeyError, RuntimeError) as err:
            failed += 1
            bar.finish(f"not tuned: {err}")
            continue
        tm = e["timing"]
        sp = f"{tm['speedup']:.2f}x vs default" if tm["speedup"] else "default failed"
        nex = len(e["screen"]["excluded"])
        bar.finish(f"{_cfg_text(e['config'])}: {tm['best']['median_ms'] * 1e3:.1f} us, {sp}; "
                   f"{e['screen']['passed']}/{e['screen']['candidates']} passed the screen"
                   f"{f', {nex} excluded' if nex else ''}; {tm['sweep_s']:.1f} s")
    print(f"tuned {len(shapes) - failed} of {len(shapes)} shapes in "
          f"{time.perf_counter() - t0:.1f} s -> {cache.cache_path()}")
    return 1 if failed else 0


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
