"""Subcommands of `nbx` beyond `info` (generate, embed, tune), added by their families."""
from __future__ import annotations

import sys
import time


# compute dtypes the models run in (argparse refuses anything else by name); short aliases
_DTYPES = ("float32", "bfloat16", "float16")
_DTYPE_ALIASES = {"f32": "float32", "fp32": "float32", "bf16": "bfloat16", "f16": "float16",
                  "fp16": "float16"}


def _dtype_arg(s: str) -> str:
    return _DTYPE_ALIASES.get(s.lower(), s.lower())


def add_commands(sub) -> None:
    p = sub.add_parser("generate", help="generate text with a Llama-family model",
                       description="MODEL: a folder (config.json + safetensors + tokenizer.json), "
                                   "a .gguf file, or 'smollm2' / 'SmolLM2-135M-Instruct'")
    p.add_argument("model")
    p.add_argument("--prompt", required=True, help="the user message (or raw text with --no-chat)")
    p.add_argument("--system", default=None, help="an optional system message (chat mode)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N, interp (default: cuda if "
                                                  "present, else cpu)")
    p.add_argument("--dtype", default=None, type=_dtype_arg, choices=_DTYPES,
                   help="compute dtype; bf16/f32/f16 accepted (default: float32 on cpu, "
                        "bfloat16 on cuda, for GGUF files and HF folders alike)")
    p.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text")
    p.add_argument("--no-graph", action="store_true",
                   help="cuda: launch the decode step op by op instead of replaying it as a "
                        "CUDA graph (for comparison)")
    p.set_defaults(fn=cmd_generate)

    p = sub.add_parser("embed", help="sentence embeddings with a BERT model",
                       description="MODEL: a folder or 'all-MiniLM-L6-v2' / 'minilm'")
    p.add_argument("model")
    p.add_argument("texts", nargs="+")
    p.add_argument("--output", "-o", default=None, help="write to file.json or file.npy")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, type=_dtype_arg, choices=_DTYPES,
                   help="compute dtype (default: float32)")
    p.add_argument("--batch-size", type=int, default=32)
    p.set_defaults(fn=cmd_embed)
    from . import cli_tune
    cli_tune.add_parser(sub)  # nbx tune (autotune)


def _fail(msg: str) -> int:
    print(f"nbx: error: {msg}", file=sys.stderr)
    return 2


def cmd_generate(args) -> int:
    from .models import LlamaModel, Sampler, generate, load_model
    if args.max_new_tokens < 1:
        return _fail(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    try:
        sampler = Sampler(args.temperature, args.top_k, args.top_p, args.repetition_penalty,
                          args.seed)
        t0 = time.perf_counter()
        model = load_model(args.model, device=args.device, dtype=args.dtype)
    except (ValueError, FileNotFoundError, KeyError, ImportError) as e:
        return _fail(str(e))
    if not isinstance(model, LlamaModel):
        return _fail(f"{args.model!r} is an encoder; use `nbx embed`")
    load_s = time.perf_counter() - t0
    tok = model.tokenizer
    if args.no_chat or tok.chat_template is None:
        if not args.no_chat:
            print("nbx: note: the model has no chat template; using the prompt as raw text",
                  file=sys.stderr)
        ids = tok.encode(args.prompt, add_special_tokens=True)
    else:
        msgs = ([{"role": "system", "content": args.system}] if args.system else []) + \
               [{"role": "user", "content": args.prompt}]
        ids = tok.apply_chat_template(msgs)
    if not ids:
        return _fail("the prompt encodes to no tokens with this model's tokenizer")
    print(f"[{model.cfg.model_type}, {model.cfg.num_hidden_layers} layers, on {model.device}, "
          f"{model.dtype.name}; loaded in {load_s:.1f} s; prompt {len(ids)} tokens]",
          file=sys.stderr)

    def out(s):
        sys.stdout.write(s)
        sys.stdout.flush()
    if args.no_graph and model.device.type != "cuda":
        print("nbx: note: --no-graph only matters on cuda", file=sys.stderr)
    try:
        res = generate(model, ids, max_new_tokens=args.max_new_tokens, sampler=sampler,
                       on_text=out, graph=False if args.no_graph else None)
    except ValueError as e:
        return _fail(str(e))
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

    from .models import BertModel, load_model
    if args.output and not args.output.endswith((".json", ".npy")):
        return _fail(f"--output must end in .json or .npy, got {args.output!r}")
    try:
        model = load_model(args.model, device=args.device, dtype=args.dtype)
    except (ValueError, FileNotFoundError, KeyError, ImportError) as e:
        return _fail(str(e))
    if not isinstance(model, BertModel):
        return _fail(f"{args.model!r} is a decoder; use `nbx generate`")
    t0 = time.perf_counter()
    emb = model.embed(args.texts, batch_size=args.batch_size)
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
    print(f"[{len(args.texts)} sentences in {dt:.3f} s: {len(args.texts) / dt:.1f} sentences/s]",
          file=sys.stderr)
    return 0
