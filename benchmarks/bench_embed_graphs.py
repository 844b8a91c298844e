"""MiniLM sentence embeddings on the GPU: graph replay against eager, torch eager beside.

The all-MiniLM-L6-v2 shape (6 layers, hidden 384, 12 heads) with random weights (no model
files needed), N pre-tokenised sentences of 8-64 tokens in batches of 32:

  nbx eager float32       BertModel._eager_batch per batch (every op launched from Python)
  nbx graphed float32     nbx.cuda.graphed(BertModel._embed_batch): one replay per batch,
                          lengths padded to a multiple of bert.GRAPH_LENGTH_STEP; the first
                          pass (which captures one graph per (batch, length)) reported apart
  nbx graphed bfloat16    the same with bf16 weights and activations (pooling in float32)
  torch eager float32     the same encoder written with torch.nn.functional

sentences/s from the best of a few passes (each pass synchronised, embeddings copied to the
host as `embed` does); the minimum cosine of each nbx row against torch's float32 embeddings
is printed beside it.

    PYTHONPATH=src python3 benchmarks/bench_embed_graphs.py [--quick] [--deadline=S] [OUT_DIR]

--deadline=S: the torch and bfloat16 rows start only before S seconds have passed.

Writes bench_embed_graphs.json to OUT_DIR (default $OUT or .).
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

CFG = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
           intermediate_size=1536, max_position_embeddings=512)


def _weights(rng):
    H, F, V, P = (CFG[k] for k in ("hidden_size", "intermediate_size", "vocab_size",
                                   "max_position_embeddings"))

    def m(*s):
        return (rng.standard_normal(s) * 0.05).astype(np.float32)
    w = {"word_embeddings.weight": m(V, H), "position_embeddings.weight": m(P, H),
         "token_type_embeddings.weight": m(2, H), "LayerNorm.weight": 1 + m(H),
         "LayerNorm.bias": m(H), "layers": []}
    for _ in range(CFG["num_hidden_layers"]):
        L = {}
        for n in ("attention.self.query", "attention.self.key", "attention.self.value",
                  "attention.output.dense"):
            L[n + ".weight"], L[n + ".bias"] = m(H, H), m(H)
        L["intermediate.dense.weight"], L["intermediate.dense.bias"] = m(F, H), m(F)
        L["output.dense.weight"], L["output.dense.bias"] = m(H, F), m(H)
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            L[n + ".weight"], L[n + ".bias"] = 1 + m(H), m(H)
        w["layers"].append(L)
    return w


def _batches(rng, n_sent, step):
    """[(ids, mask)] padded to the longest of each batch, and the same padded to `step`."""
    lens = rng.integers(8, 65, n_sent)
    plain, padded = [], []
    for i in range(0, n_sent, 32):
        ls = lens[i:i + 32]
        T = int(ls.max())
        Tp = -(-T // step) * step
        ids = np.zeros((len(ls), Tp), np.int64)
        mask = np.zeros(ids.shape, bool)
        for j, n in enumerate(ls):
            ids[j, :n] = rng.integers(1000, 30000, n)
            mask[j, :n] = True
        plain.append((ids[:, :T].copy(), mask[:, :T].copy()))
        padded.append((ids, mask))
    return plain, padded


def _torch_embed(torch, w, ids, mask):
    F = torch.nn.functional
    H, nh = CFG["hidden_size"], CFG["num_attention_heads"]
    B, T = ids.shape
    pos = torch.arange(T, device="cuda").expand(B, T)
    x = w["word_embeddings.weight"][ids] + w["position_embeddings.weight"][pos] \
        + w["token_type_embeddings.weight"][0]
    x = F.layer_norm(x, (H,), w["LayerNorm.weight"], w["LayerNorm.bias"], 1e-12)
    am = mask[:, None, None, :]
    for L in w["layers"]:
        def proj(n):
            return F.linear(x, L[f"attention.self.{n}.weight"], L[f"attention.self.{n}.bias"]) \
                .view(B, T, nh, H // nh).transpose(1, 2)
        a = F.scaled_dot_product_attention(proj("query"), proj("key"), proj("value"),
                                           attn_mask=am)
        a = F.linear(a.transpose(1, 2).reshape(B, T, H), L["attention.output.dense.weight"],
                     L["attention.output.dense.bias"])
        x = F.layer_norm(a + x, (H,), L["attention.output.LayerNorm.weight"],
                         L["attention.output.LayerNorm.bias"], 1e-12)
        h = F.gelu(F.linear(x, L["intermediate.dense.weight"], L["intermediate.dense.bias"]))
        h = F.linear(h, L["output.dense.weight"], L["output.dense.bias"])
        x = F.layer_norm(h + x, (H,), L["output.LayerNorm.weight"], L["output.LayerNorm.bias"],
                         1e-12)
    mf = mask[..., None].to(x.dtype)
    return F.normalize((x * mf).sum(1) / mf.sum(1).clamp(min=1e-9), dim=-1)


def _best(fn, sync, passes):
    best, out = float("inf"), None
    for _ in range(passes):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _graphed_rows(name, m, padded, n_sent, passes, sync, rows, outs):
    g = m._graphed_batch()

    def run():
        return [g(i, k).numpy() for i, k in padded]
    t0 = time.perf_counter()
    run()
    sync()
    first = n_sent / (time.perf_counter() - t0)
    rows.append((f"{name}, first pass (captures {g.num_graphs} graphs)", first))
    _progress(rows)
    t, outs[name] = _best(run, sync, passes)
    rows.append((name, n_sent / t))
    _progress(rows)


def _progress(rows):
    n, r = rows[-1]
    print(f"  {n}: {r:.0f} sentences/s", flush=True)


def _guarded(fn):
    """fn(), or None after printing its traceback (the other rows still run)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - report it and go on with the other rows
        import traceback
        traceback.print_exc()
        return None


def _torch_rows(w, plain, n_sent, passes, rows):
    import torch
    if not torch.cuda.is_available():
        return None
    wt = {k: torch.tensor(v, device="cuda") for k, v in w.items() if k != "layers"}
    wt["layers"] = [{k: torch.tensor(v, device="cuda") for k, v in L.items()}
                    for L in w["layers"]]
    tb = [(torch.tensor(i, device="cuda"), torch.tensor(k, device="cuda")) for i, k in plain]

    def theirs():
        with torch.inference_mode():
            return [_torch_embed(torch, wt, i, k).cpu().numpy() for i, k in tb]
    theirs()
    t, ref = _best(theirs, torch.cuda.synchronize, passes)
    rows.append(("torch eager float32", n_sent / t))
    _progress(rows)
    return ref


def _min_cos(a, b):
    return float(np.min(np.sum(np.concatenate(a) * np.concatenate(b), -1)))


def main(argv):
    t0 = time.perf_counter()
    quick = "--quick" in argv
    deadline = next((float(x.split("=", 1)[1]) for x in argv if x.startswith("--deadline=")),
                    float("inf"))          # seconds after which the optional rows are skipped
    args = [x for x in argv if not x.startswith("--")]
    out_dir = args[0] if args else os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    import nbxtensor as nbx
    from nbxtensor.models import bert
    from nbxtensor.models.config import BertConfig
    if not nbx.cuda.is_available():
        print("no CUDA device:", nbx.cuda.availability()[1])
        return 1
    rng = np.random.default_rng(0)
    n_sent = 256 if quick else 2048
    passes = 2 if quick else 3
    w = _weights(rng)
    plain, padded = _batches(rng, n_sent, bert.GRAPH_LENGTH_STEP)
    sync = nbx.cuda.synchronize

    def model(dtype):
        def dev(a):
            return nbx.tensor(a, device="cuda").to(dtype)
        wn = {k: dev(v) for k, v in w.items() if k != "layers"}
        wn["layers"] = [{k: dev(v) for k, v in L.items()} for L in w["layers"]]
        return bert.BertModel(BertConfig(**CFG), wn, None, "cuda", dtype)

    rows, outs = [], {}
    t_start = time.perf_counter()
    m32 = model(nbx.float32)
    eager = lambda: [m32._eager_batch(i, k).numpy() for i, k in plain]   # noqa: E731
    eager()                                                             # compiles
    print(f"first eager pass (compiles): {time.perf_counter() - t_start:.1f} s", flush=True)
    t, outs["nbx eager float32"] = _best(eager, sync, passes)
    rows.append(("nbx eager float32", n_sent / t))
    _progress(rows)
    _guarded(lambda: _graphed_rows("nbx graphed float32", m32, padded, n_sent, passes, sync,
                                   rows, outs))
    ref = None
    if time.perf_counter() - t0 < deadline:
        ref = _guarded(lambda: _torch_rows(w, plain, n_sent, passes, rows))
    if time.perf_counter() - t0 < deadline:
        _guarded(lambda: _graphed_rows("nbx graphed bfloat16", model(nbx.bfloat16), padded,
                                       n_sent, passes, sync, rows, outs))
    anchor = next((r for n, r in rows if n == "torch eager float32"), None)
    print(f"{'path':<56} {'sent/s':>9} {'x torch':>8} {'min cos':>10}")
    result = []
    for n, r in rows:
        cos = _min_cos(outs[n], ref) if ref is not None and n in outs else float("nan")
        x = r / anchor if anchor else float("nan")
        print(f"{n:<56} {r:9.0f} {x:8.2f} {cos:10.6f}")
        result.append({"path": n, "sentences_per_s": r, "x_torch": x, "min_cos_torch": cos})
    if "nbx graphed float32" in outs:
        print(f"graphed vs eager float32: min cosine "
              f"{_min_cos(outs['nbx graphed float32'], outs['nbx eager float32']):.7f}")
    with open(os.path.join(out_dir, "bench_embed_graphs.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
