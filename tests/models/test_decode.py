"""The decode path: fused decode GEMVs (kernels/decode_fused.py via ops/decode.decode_linear),
LlamaModel.decode_step / prefill against the model's original forward, device-side sampling
in GraphDecoder, kernels per step, and (cuda) graph replay == eager step bit for bit."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor.models import _ops as O

from helpers import (H200, assert_close, assert_graph_generate_equals_eager, poisoned,
                     prefilled_eager_and_graph, rng, to64)

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_graphs import _cuda_ok, _model_greedy, _tiny_llama  # noqa: E402


# ----------------------------------------------------------------------------- fused GEMV
def _ref(x, w, nw=None, eps=1e-5, bias=None, res=None, glu=False):
    x, w = to64(x), to64(w)
    if nw is not None:
        x = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * to64(nw)
    y = x @ w.T
    if bias is not None:
        y = y + to64(bias)
    if glu:
        n = w.shape[0] // 2
        g, u = y[:, :n], y[:, n:]
        y = g / (1 + np.exp(-g)) * u
    if res is not None:
        y = y + to64(res)
    return y


def _tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype is nbx.bfloat16 else dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("mode", ["plain", "norm", "norm_bias", "glu", "residual"])
def test_fused_linear_matches_float64(device, M, mode):
    g = rng()
    # K = 129 overhangs the interp BLOCK_K (128, 64); N = 33 = BLOCK_N + 1
    K, N = 129, 33
    dtype = nbx.float32
    xa = g.standard_normal((M, K + 7)).astype(np.float32) * 2 + 0.5
    x = nbx.tensor(xa, device=device)[:, 3:3 + K]          # row stride != K (a view)
    rows = 2 * N if mode == "glu" else N
    w = nbx.tensor((g.standard_normal((rows, K)) / np.sqrt(K)).astype(np.float32), device=device)
    kw = {}
    if mode in ("norm", "norm_bias", "glu"):
        kw["norm_weight"] = nbx.tensor(1 + 0.1 * g.standard_normal(K).astype(np.float32),
                                       device=device)
        kw["eps"] = 1e-5
    if mode == "norm_bias":
        kw["bias"] = nbx.tensor(g.standard_normal(N).astype(np.float32), device=device)
    if mode == "glu":
        kw["glu"] = True
    if mode == "residual":
        kw["residual"] = nbx.tensor(g.standard_normal((M, N)).astype(np.float32), device=device)
    y = O.decode_linear(x, w, **kw)
    assert y.shape == (M, N) and y.dtype is dtype and y.device.type == device
    ref = _ref(x, w, kw.get("norm_weight"), kw.get("eps", 1e-5), kw.get("bias"),
               kw.get("residual"), kw.get("glu", False))
    assert_close(y, ref, **_tol(dtype))


@pytest.mark.parametrize("M", [1, 2])
def test_fused_linear_bf16_even_k_fp32_out(device, M):
    g = rng()
    K, N = 256, 65                    # K a multiple of BLOCK_K: the unmasked loop
    x = nbx.tensor(g.standard_normal((M, K)).astype(np.float32), device=device).to(nbx.bfloat16)
    w = nbx.tensor((g.standard_normal((2 * N, K)) / 16).astype(np.float32),
                   device=device).to(nbx.bfloat16)
    nw = nbx.tensor(1 + 0.1 * g.standard_normal(K).astype(np.float32), device=device).to(nbx.bfloat16)
    y = O.decode_linear(x, w, norm_weight=nw, eps=1e-6, glu=True)
    assert y.dtype is nbx.bfloat16
    assert_close(y, _ref(x, w, nw, 1e-6, glu=True), **_tol(nbx.bfloat16))
    y32 = O.decode_linear(x, w[:N], norm_weight=nw, eps=1e-6, out_dtype=nbx.float32)
    assert y32.dtype is nbx.float32
    # M >= 2 feeds tl.dot with the normalised x rounded to bf16 (as the unfused path does)
    assert_close(y32, _ref(x, w[:N], nw, 1e-6), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("mode", ["glu", "residual", "norm_bias"])
def test_row_per_program_kernel_with_several_rows(monkeypatch, mode):
    """The cuda config for 2 <= M <= SMALL_M runs the row-per-program kernel once per x row
    (grid axis 0); interp normally uses tl.dot there, so force the config."""
    pytest.importorskip("triton")
    from nbxtensor.kernels import decode_fused as F
    monkeypatch.setattr(F, "_OVERRIDE", dict(BLOCK_N=8, BLOCK_K=64, num_warps=4))
    g = rng()
    M, K, N = 3, 129, 17
    x = nbx.tensor(g.standard_normal((M, K)).astype(np.float32), device="interp")
    w = nbx.tensor((g.standard_normal((2 * N if mode == "glu" else N, K)) / 11).astype(np.float32),
                   device="interp")
    nw = nbx.tensor(1 + 0.1 * g.standard_normal(K).astype(np.float32), device="interp")
    r = nbx.tensor(g.standard_normal((M, N)).astype(np.float32), device="interp")
    b = nbx.tensor(g.standard_normal(N).astype(np.float32), device="interp")
    kw = {"glu": dict(norm_weight=nw, glu=True), "residual": dict(residual=r),
          "norm_bias": dict(norm_weight=nw, bias=b)}[mode]
    y = O.decode_linear(x, w, eps=1e-5, **kw)
    assert_close(y, _ref(x, w, kw.get("norm_weight"), 1e-5, kw.get("bias"), kw.get("residual"),
                         kw.get("glu", False)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("M", [1, 4])
def test_fused_gemv_writes_every_output(M):
    pytest.importorskip("triton")
    from nbxtensor.kernels.decode_fused import fused_gemv
    g = rng()
    K, N = 70, 45
    x = nbx.tensor(g.standard_normal((M, K)).astype(np.float32), device="interp")
    w = nbx.tensor(g.standard_normal((N, K)).astype(np.float32), device="interp")
    r = nbx.tensor(g.standard_normal((M, N)).astype(np.float32), device="interp")
    out = poisoned((M, N), nbx.float32, "interp")
    fused_gemv(x, w, residual=r, out=out)
    assert_close(out, _ref(x, w, res=r), rtol=1e-4, atol=1e-4)
    # empty M: nothing launched, nothing to check but the shape
    e = fused_gemv(x[:0], w)
    assert e.shape == (0, N)


def test_fused_linear_refusals():
    x = nbx.ones((2, 8))
    with pytest.raises(ValueError, match="w must be a 2-D Tensor"):
        O.decode_linear(x, nbx.ones((4, 7)))
    with pytest.raises(ValueError, match="even row count"):
        O.decode_linear(x, nbx.ones((5, 8)), glu=True)
    with pytest.raises(ValueError, match="residual must be a Tensor of shape"):
        O.decode_linear(x, nbx.ones((4, 8)), residual=nbx.ones((2, 5)))
    with pytest.raises(ValueError, match="norm_weight must be a Tensor of shape"):
        O.decode_linear(x, nbx.ones((4, 8)), norm_weight=nbx.ones(4))
    with pytest.raises(ValueError, match="share one floating dtype"):
        O.decode_linear(x, nbx.ones((4, 8), dtype=nbx.float64))
    with pytest.raises(ValueError, match="bias with glu"):
        O.decode_linear(x, nbx.ones((4, 8)), glu=True, bias=nbx.ones(2))


def test_fused_gemv_compiles_for_sm90():
    """The cuda configs compile for the H200 (catches shared-memory / layout errors here)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from nbxtensor.kernels import decode_fused as F
    tgt = GPUTarget("cuda", 90, 64)
    base = dict(x_ptr="*bf16", w_ptr="*bf16", o_ptr="*fp32", nw_ptr="*bf16", b_ptr="*bf16",
                r_ptr="*bf16", N="i32", K="i32", eps="fp32", s_xm="i32", s_wn="i32",
                s_om="i32", s_rm="i32")
    cfg = F.fused_gemv_config(1, 576, 576, 2, H200)
    c = dict(BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], EVEN_K=False, NORM=True, GLU=True,
             HAS_BIAS=False, HAS_RES=True)
    k = triton.compile(triton.compiler.ASTSource(fn=F._fused_gemv1_kernel,
                                                 signature={**base, **{n: "constexpr" for n in c}},
                                                 constexprs=c), target=tgt)
    assert "ld.global" in k.asm["ptx"]
    cfg = F.fused_gemv_config(16, 2048, 2048, 2, H200)
    c = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], NORM=True,
             GLU=True, HAS_BIAS=False, HAS_RES=True, PRECISION="tf32")
    sig = {**base, "M": "i32", **{n: "constexpr" for n in c}}
    k = triton.compile(triton.compiler.ASTSource(fn=F._fused_gemvm_kernel, signature=sig,
                                                 constexprs=c), target=tgt)
    assert k.metadata.shared <= 228 * 1024


def test_fused_gemv_config_fills_the_gpu():
    """Large weights fill the GPU, with the rule (its tiles <= 4096 elements) and with the
    measured GEMV_TABLE entries (SmolLM2's lm_head: 32 x 256)."""
    from nbxtensor.kernels import decode_fused as F
    for N, K in [(3072, 2048), (2048, 8192), (49152, 576), (4096, 3000)]:
        c = F.fused_gemv_config(1, N, K, 2, H200)
        assert -(-N // c["BLOCK_N"]) >= 2 * 132 or c["BLOCK_N"] == 1
        assert c["BLOCK_N"] * c["BLOCK_K"] <= (8192 if (("plain", N, K) in F.GEMV_TABLE)
                                               else 4096)
        # 16-byte loads: each thread's contiguous run along K is >= 8 bf16 elements
        assert c["BLOCK_K"] >= 8 * 32 or c["BLOCK_K"] >= K


def test_fused_gemv_config_small_weights_take_the_measured_winners():
    """SmolLM2's latency-bound GEMVs: the H200 sweeps' winners (see decode_fused.py): the
    small-weight rule, and GEMV_TABLE's whole-row tiles for o, down and gate/up (gate/up
    with a register cap); shapes off the table take the rule."""
    from nbxtensor.kernels import decode_fused as F
    cfg = F.fused_gemv_config
    pick = lambda c: (c["BLOCK_N"], c["BLOCK_K"])   # noqa: E731
    assert pick(cfg(1, 960, 576, 2, H200)) == (8, 1024)            # qkv
    assert pick(cfg(1, 576, 576, 2, H200)) == (4, 1024)            # o (table)
    assert pick(cfg(1, 576, 1536, 2, H200)) == (4, 2048)           # down (table)
    glu = cfg(1, 1536, 576, 2, H200, "glu")                        # gate/up (table)
    assert pick(glu) == (4, 1024) and glu["maxnreg"] == 168          # one wave with the norm
    assert pick(cfg(1, 480, 576, 2, H200, "rope")) == (2, 1024)    # qkv + RoPE pairs
    assert pick(cfg(1, 3072, 2048, 2, H200)) == pick(cfg(1, 3072, 2048, 2, H200, "plain"))
    assert pick(cfg(1, 576, 640, 2, H200)) == (8, 1024)              # the rule alone
    assert pick(cfg(1, 640, 1536, 2, H200)) == (4, 1024)
    assert "maxnreg" not in cfg(1, 1600, 576, 2, H200, "glu")
    assert pick(cfg(1, 1600, 576, 2, H200, "glu")) == (4, 256)


# ----------------------------------------------------------------------------- decode_step
def _decode_vs_forward(m, prompts, steps, fused):
    """Logits of prefill + `steps` greedy decode_steps (device tensors, nbx.KVCache) vs the
    model's forward() with its own cache, per sequence."""
    B, T = len(prompts), len(prompts[0])
    dev = m.device
    cache = m.new_kv_cache(B, T + steps + 3)
    ids = nbx.tensor(np.asarray(prompts, np.int64), device=dev)
    pos = nbx.tensor(np.tile(np.arange(T, dtype=np.int32), (B, 1)), device=dev)
    got = [m.prefill(ids, pos, cache, fused=fused).numpy().astype(np.float64)]
    toks = got[0].argmax(-1)
    for s in range(steps):
        t = nbx.tensor(toks.reshape(B, 1).astype(np.int64), device=dev)
        p = nbx.tensor(np.full((B, 1), T + s, np.int32), device=dev)
        got.append(m.decode_step(t, p, cache, fused=fused).numpy().astype(np.float64))
        toks = got[-1].argmax(-1)
    for b, pr in enumerate(prompts):
        c = m.new_cache(32)
        ref = [m.forward(pr, c).numpy().astype(np.float64)]
        for s in range(steps):
            ref.append(m.forward([int(got[s][b].argmax())], c).numpy().astype(np.float64))
        for s in range(steps + 1):
            np.testing.assert_allclose(got[s][b], ref[s], rtol=2e-4, atol=2e-4,
                                       err_msg=f"sequence {b} step {s} fused={fused}")
    assert cache.lengths.numpy().tolist() == [T + steps] * B


@pytest.mark.parametrize("fused", [True, False])
def test_decode_step_equals_forward(device, fused):
    L, steps = (2, 4) if device == "cpu" else (1, 2)
    m = _tiny_llama(device, L=L)
    assert all(m.fused)
    _decode_vs_forward(m, [[3, 14, 15, 92, 65], [7, 7, 1, 50, 2]], steps, fused)


def test_decode_step_with_qkv_bias_cpu():
    """Qwen2-style Q/K/V biases go through the concatenated bias of the fused QKV GEMV."""
    m = _tiny_llama("cpu", L=2)
    g = rng()
    for L in m.w["layers"]:
        b = nbx.tensor(g.standard_normal(L["wqkv"].shape[0]).astype(np.float32))
        n1, n2 = L["wq"].shape[0], L["wq"].shape[0] + L["wk"].shape[0]
        L["bqkv"] = b
        L["bq"], L["bk"], L["bv"] = b[:n1], b[n1:n2], b[n2:]
    _decode_vs_forward(m, [[5, 6, 7, 8]], 3, True)


def _quantised_tiny(device, L=1):
    """The tiny model with every projection as a GGML Q8_0 / Q4_1 QuantWeight (the GGUF
    package's formats): the decode step takes the unfused path for those layers."""
    gguf = pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as Q
    from nbxtensor.models.llama import LlamaModel
    m = _tiny_llama(device, L=L)
    w = m.w
    for i, Lw in enumerate(w["layers"]):
        for j, n in enumerate(("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")):
            qt = ("Q8_0", "Q4_1")[(i + j) % 2]
            a = Lw[n].numpy().astype(np.float32)
            blocks = gguf.quants.quantize(a, getattr(Q, qt))
            Lw[n] = O.QuantWeight(nbx.tensor(np.ascontiguousarray(blocks), device=device), qt,
                                  a.shape)
        for n in ("wqkv", "w_gateup"):
            Lw.pop(n)
    return LlamaModel(m.cfg, w, None, device, m.dtype)


def test_decode_step_quantised_weights_interp():
    pytest.importorskip("triton")
    m = _quantised_tiny("interp")
    assert m.fused == [False] and m.fused_head      # quantised layers: unfused; head fused
    _decode_vs_forward(m, [[3, 14, 15, 92, 65]], 2, True)


def test_weights_concatenated_once_as_views():
    m = _tiny_llama("cpu", L=1)
    L = m.w["layers"][0]
    nq = L["wq"].shape[0]
    assert L["wqkv"].shape[0] == nq + L["wk"].shape[0] + L["wv"].shape[0]
    # the separate weights are views of the concatenation (no second copy)
    assert L["wq"].data_ptr() == L["wqkv"].data_ptr()
    assert L["wk"].data_ptr() == L["wqkv"].data_ptr() + nq * L["wqkv"].stride(0) * 4
    assert L["w_up"].data_ptr() == L["w_gateup"][L["w_gate"].shape[0]:].data_ptr()


def test_decode_step_refusals():
    m = _tiny_llama("cpu", L=1)
    c = m.new_kv_cache(2, 8)
    t = nbx.zeros((2, 1), dtype=nbx.int64)
    p = nbx.zeros((2, 1), dtype=nbx.int32)
    with pytest.raises(ValueError, match="one token per sequence"):
        m.decode_step(nbx.zeros((2, 2), dtype=nbx.int64), nbx.zeros((2, 2), dtype=nbx.int32), c)
    with pytest.raises(ValueError, match="tokens_t must be a 2-D"):
        m.decode_step(nbx.zeros((2,), dtype=nbx.int64), p, c)
    with pytest.raises(ValueError, match="must match"):
        m.decode_step(t, nbx.zeros((2, 2), dtype=nbx.int32), c)
    with pytest.raises(TypeError, match="nbx.KVCache"):
        m.decode_step(t, p, m.new_paged_cache(4, 4))
    with pytest.raises(ValueError, match="does not fit"):
        m.decode_step(t, p, m.new_cache(8))         # one sequence's cache, batch 2
    with pytest.raises(ValueError, match="does not fit"):
        m.decode_step(nbx.zeros((3, 1), dtype=nbx.int64), nbx.zeros((3, 1), dtype=nbx.int32), c)


# ----------------------------------------------------------------------------- kernels per step
def _count_launches(monkeypatch, fn):
    from nbxtensor.backends import launch as L
    n = [0]
    orig = L._interp_launch

    def counting(*a, **k):
        n[0] += 1
        return orig(*a, **k)
    monkeypatch.setattr(L, "_interp_launch", counting)
    fn()
    monkeypatch.setattr(L, "_interp_launch", orig)
    return n[0]


def test_kernels_per_step_fused_fewer(monkeypatch, record_property):
    """Kernel launches of one decode step (interp counts every launch, as a graph would
    hold them), fused vs unfused: per layer the fusions remove norm, add, silu, mul and
    two of the three Q/K/V GEMVs."""
    pytest.importorskip("triton")
    from nbxtensor.models.graph_decode import GraphDecoder
    counts = {}
    for fused in (False, True):
        m = _tiny_llama("interp", L=2)
        dec = GraphDecoder(m, batch=1, capacity=16, fused=fused)
        dec.prefill([[1, 2, 3]])
        counts[fused] = _count_launches(monkeypatch, dec.step)
    record_property("kernels_per_step", counts)
    print("kernels per step (2 layers): unfused", counts[False], "fused", counts[True])
    # 2 layers x (3 qkv + 2 norm + 2 add + silu + mul + gate + up ... -> 4 GEMVs)
    assert counts[True] <= counts[False] - 2 * 7 + 1


def test_kernels_per_step_greedy_fused_exact(monkeypatch, record_property):
    """The fused greedy step: 5 kernels per layer (qkv+norm+RoPE+append, attention, o+res,
    gateup+norm+glu, down+res) and 3 fixed (embedding, norm+lm_head, argmax+token+pos)."""
    pytest.importorskip("triton")
    from nbxtensor.models.graph_decode import GraphDecoder
    n = {}
    for L in (1, 2):
        dec = GraphDecoder(_tiny_llama("interp", L=L), batch=1, capacity=16)
        dec.prefill([[1, 2, 3]])
        dec.step()          # first-use buffers (ticket counters) are made here, not captured
        n[L] = _count_launches(monkeypatch, dec.step)
    per_layer, fixed = n[2] - n[1], 2 * n[1] - n[2]
    record_property("kernels_per_layer_fixed", (per_layer, fixed))
    assert (per_layer, fixed) == (5, 3), (per_layer, fixed)


# ----------------------------------------------------------------------------- QKV + RoPE + append
def _qkv_rope_both(x, w, nw, b, pos, old, Hq, theta, device):
    """[fused, composed] (q, cache k, cache v, lengths) as NumPy: O.decode_qkv_rope and
    fused_linear + KVCache.append_rope into layer 1 of a 2-layer float32 cache whose rows
    start as k = old, v = -old (old (2, B, Hkv, C, D)); eps 1e-5."""
    _, B, Hkv, C, D = old.shape
    res = []
    for fused in (True, False):
        c = nbx.KVCache(2, B, Hkv, C, D, dtype=nbx.float32, device=device)
        c.k.copy_(nbx.tensor(old, device=device))
        c.v.copy_(nbx.tensor(-old, device=device))
        if fused:
            q = O.decode_qkv_rope(x, w, c, 1, pos, num_heads=Hq, norm_weight=nw, eps=1e-5,
                                 bias=b, theta=theta)
        else:
            qkv = O.decode_linear(x, w, norm_weight=nw, eps=1e-5, bias=b)
            q = qkv[:, :Hq * D].view(B, 1, Hq, D).transpose(1, 2)
            k = qkv[:, Hq * D:(Hq + Hkv) * D].view(B, 1, Hkv, D).transpose(1, 2)
            v = qkv[:, (Hq + Hkv) * D:].view(B, 1, Hkv, D).transpose(1, 2)
            c.append_rope(1, q, k, v, pos, theta=theta)
        res.append((q.numpy(), c.k.numpy(), c.v.numpy(), c.lengths.numpy()))
    return res


@pytest.mark.parametrize("B,norm,bias", [(1, True, False), (3, True, True), (2, False, False)])
def test_fused_qkv_rope_equals_composition(device, B, norm, bias):
    """One kernel (interp/cuda) == fused_linear + KVCache.append_rope, and both against a
    float64 reference: q rotated, k rotated and v at the device positions, lengths; cache
    rows elsewhere untouched; K overhangs the block (K = 16 * 4 + 1)."""
    g = rng()
    Hq, Hkv, D, K, C = 4, 2, 8, 16 * 4 + 1, 12
    N = (Hq + 2 * Hkv) * D
    x = nbx.tensor(g.standard_normal((B, K)).astype(np.float32), device=device)
    w = nbx.tensor((g.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32), device=device)
    nw = nbx.tensor(g.standard_normal(K).astype(np.float32), device=device) if norm else None
    b = nbx.tensor(g.standard_normal(N).astype(np.float32), device=device) if bias else None
    pos_np = g.integers(0, C, (B, 1)).astype(np.int32)
    pos = nbx.tensor(pos_np, device=device)
    theta = 500.0
    old = g.standard_normal((2, B, Hkv, C, D)).astype(np.float32)    # the cache's old rows
    (qf, kf, vf, lf), (qc, kc, vc, lc) = _qkv_rope_both(x, w, nw, b, pos, old, Hq, theta,
                                                        device)
    assert_close(qf, qc, rtol=1e-5, atol=1e-5)
    assert_close(kf, kc, rtol=1e-5, atol=1e-5)
    assert_close(vf, vc, rtol=1e-5, atol=1e-5)
    assert (lf == lc).all() and (lf == pos_np[:, 0] + 1).all()
    # float64 reference of the rotated q and the written k / v rows
    xa = to64(x)
    if norm:
        xa = xa / np.sqrt(np.mean(xa * xa, -1, keepdims=True) + 1e-5) * to64(nw)
    y = xa @ to64(w).T + (to64(b) if bias else 0.0)
    inv = 1.0 / theta ** (np.arange(0, D, 2) / D)

    def rot(t, p):                      # t (H, D) at position p
        a = p * inv
        c_, s_ = np.cos(a), np.sin(a)
        t1, t2 = t[:, :D // 2], t[:, D // 2:]
        return np.concatenate([t1 * c_ - t2 * s_, t2 * c_ + t1 * s_], -1)
    for bb in range(B):
        p = int(pos_np[bb, 0])
        yq = y[bb, :Hq * D].reshape(Hq, D)
        yk = y[bb, Hq * D:(Hq + Hkv) * D].reshape(Hkv, D)
        yv = y[bb, (Hq + Hkv) * D:].reshape(Hkv, D)
        assert_close(qf[bb, :, 0], rot(yq, p), rtol=1e-4, atol=1e-4)
        assert_close(kf[1, bb, :, p], rot(yk, p), rtol=1e-4, atol=1e-4)
        assert_close(vf[1, bb, :, p], yv, rtol=1e-4, atol=1e-4)
    assert (kf[0] == old[0]).all() and (vf[0] == -old[0]).all()     # layer 0 untouched
    for bb in range(B):                                               # other slots untouched
        keep = np.ones(C, bool)
        keep[pos_np[bb, 0]] = False
        assert (kf[1, bb][:, keep] == old[1, bb][:, keep]).all()
        assert (vf[1, bb][:, keep] == -old[1, bb][:, keep]).all()


@pytest.mark.parametrize("bias", [False, True])
def test_fused_qkv_rope_out_of_cache_position(bias):
    """The QKV+RoPE+append kernel (interp, bf16) with a position outside the cache (row 1):
    IndexError, that row's cache slots untouched and its length kept at the capacity, the
    other rows written; outputs NaN-poisoned first."""
    from nbxtensor.kernels import decode_fused as F
    from nbxtensor.ops.attention import _inv_freq_tensor
    from nbxtensor.tensor import Tensor
    g = rng()
    Hq, Hkv, D, K, C, B = 4, 2, 8, 16 * 4 + 1, 6, 3
    N = (Hq + 2 * Hkv) * D
    bf = nbx.bfloat16
    x = nbx.tensor(g.standard_normal((B, K)).astype(np.float32), device="interp").to(bf)
    w = nbx.tensor((g.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32),
                   device="interp").to(bf)
    nw = nbx.tensor(g.standard_normal(K).astype(np.float32), device="interp").to(bf)
    b = nbx.tensor(g.standard_normal(N).astype(np.float32), device="interp").to(bf) \
        if bias else None
    pos = nbx.tensor(np.array([[2], [C + 3], [C - 1]], np.int32), device="interp")
    c = nbx.KVCache(1, B, Hkv, C, D, dtype=bf, device="interp")
    c.k.copy_(poisoned(tuple(c.k.shape), bf, "interp"))
    c.v.copy_(poisoned(tuple(c.v.shape), bf, "interp"))
    q = Tensor._empty((B, Hq * D), bf, nbx.device("interp"))
    with pytest.raises(IndexError, match=r"decode_qkv_rope: index 9 .* positions"):
        F.fused_qkv_rope(x, w, q, *c.view(0), pos, _inv_freq_tensor(D, 500.0, None, "interp"),
                         num_heads=Hq, num_kv_heads=Hkv, norm_weight=nw, eps=1e-5, bias=b)
    q = q.view(B, 1, Hq, D).transpose(1, 2)
    q, k, v, lengths = [t.to(nbx.float32).numpy() for t in (q, c.k, c.v)] + [c.lengths.numpy()]
    assert np.isfinite(q).all() and (lengths == np.array([3, C, C])).all()
    assert np.isfinite(k[0, 0, :, 2]).all() and np.isfinite(v[0, 2, :, C - 1]).all()
    assert np.isnan(k[0, 1]).all() and np.isnan(v[0, 1]).all()      # outside: not written


@pytest.mark.parametrize("M,glu", [(1, False), (3, False), (2, True)])
def test_fused_gemv_early_residual(M, glu, monkeypatch):
    """The residual loaded right after the PDL wait matches the float64 reference (interp,
    bf16, the row-per-program kernel forced for every M, N overhanging BLOCK_N, K two chunks
    + 1; outputs NaN-poisoned first)."""
    from nbxtensor.kernels import decode_fused as F
    monkeypatch.setattr(F, "_OVERRIDE", dict(BLOCK_N=8, BLOCK_K=64, num_warps=4))
    g = rng()
    N, K = 33, 64 * 2 + 1
    bf = nbx.bfloat16
    x = nbx.tensor(g.standard_normal((M, K)).astype(np.float32), device="interp").to(bf)
    w = nbx.tensor((g.standard_normal((2 * N if glu else N, K)) / np.sqrt(K))
                   .astype(np.float32), device="interp").to(bf)
    nw = nbx.tensor(g.standard_normal(K).astype(np.float32), device="interp").to(bf)
    res = nbx.tensor(g.standard_normal((M, N)).astype(np.float32), device="interp").to(bf)
    out = poisoned((M, N), nbx.float32, "interp")
    F.fused_gemv(x, w, norm_weight=nw, eps=1e-5, residual=res, glu=glu, out=out)
    assert_close(out.numpy(), _ref(x, w, nw, 1e-5, res=res, glu=glu), rtol=1e-4, atol=1e-4)


def test_gemv_table(monkeypatch):
    """GEMV_TABLE entries override the rule for (kind, N, K) on cuda at M <= SMALL_M with
    16-bit weights only; RoPE pairs at the 1B shape take 4 x 512 (one wave of 110-register
    programs)."""
    from nbxtensor.kernels import decode_fused as F
    from nbxtensor.kernels._common import INTERP
    cfg = F.fused_gemv_config
    assert cfg(1, 1536, 2048, 2, H200, "rope") == dict(BLOCK_N=4, BLOCK_K=512, num_warps=4)
    assert cfg(1, 480, 576, 2, H200, "rope")["BLOCK_K"] == 1024      # small rule unchanged
    entry = dict(BLOCK_N=2, BLOCK_K=1024, num_warps=8)
    monkeypatch.setitem(F.GEMV_TABLE, ("glu", 8192, 2048), entry)
    assert cfg(1, 8192, 2048, 2, H200, "glu") == entry
    assert cfg(4, 8192, 2048, 2, H200, "glu") == entry
    assert cfg(1, 8192, 2048, 2, H200, "plain") != entry            # another kind
    assert cfg(5, 8192, 2048, 2, H200, "glu") != entry              # tl.dot kernel
    assert cfg(1, 8192, 2048, 4, H200, "glu") != entry              # fp32 weights
    assert cfg(1, 8192, 2048, 2, INTERP, "glu") != entry
    cfg(1, 8192, 2048, 2, H200, "glu")["BLOCK_N"] = 99              # a copy is returned
    assert F.GEMV_TABLE[("glu", 8192, 2048)]["BLOCK_N"] == 2


@pytest.mark.cuda   # a cuda-only test without a device parameter: gpu-check selects -m cuda
def test_gemv_table_entries_compute_right_on_cuda():
    """Every shipped GEMV_TABLE entry (plain / glu; rope is covered by the decode step tests)
    on its own (N, K), bf16, M = 1 and 3, against float64: the measured configs are only
    reached at those exact shapes. Outputs poisoned with NaN first."""
    from conftest import DEVICES
    if "cuda" not in DEVICES:
        pytest.skip("needs a CUDA device")
    from nbxtensor.kernels import decode_fused as F
    g = rng()
    for (kind, N, K), c in F.GEMV_TABLE.items():
        if kind == "rope":
            continue
        rows = 2 * N if kind == "glu" else N
        for M in (1, 3):
            x = nbx.tensor(g.standard_normal((M, K)).astype(np.float32), device="cuda")
            x = x.to(nbx.bfloat16)
            w = nbx.tensor((g.standard_normal((rows, K)) / np.sqrt(K)).astype(np.float32),
                           device="cuda").to(nbx.bfloat16)
            r = nbx.tensor(g.standard_normal((M, N)).astype(np.float32), device="cuda")
            r = r.to(nbx.bfloat16)
            out = poisoned((M, N), nbx.bfloat16, "cuda")
            assert F.fused_gemv_config(M, N, K, 2, H200, kind) == c
            F.fused_gemv(x, w, glu=kind == "glu", residual=r if kind == "plain" else None,
                         out=out)
            ref = _ref(x, w, glu=kind == "glu", res=r if kind == "plain" else None)
            assert_close(out, ref, **_tol(nbx.bfloat16))


def test_gemv_table_entries_are_valid_and_compile_for_sm90():
    """Every shipped GEMV_TABLE entry is a legal config of its kernel (powers of two, RoPE
    pairs inside a 64-wide head, 16-byte loads) and compiles for sm_90 without spills."""
    pytest.importorskip("triton")
    from nbxtensor.kernels import decode_fused as F
    for (kind, N, K), c in F.GEMV_TABLE.items():
        assert kind in ("plain", "glu", "rope")
        assert {"BLOCK_N", "BLOCK_K", "num_warps"} <= set(c) <= {"BLOCK_N", "BLOCK_K",
                                                               "num_warps", "maxnreg"}
        bn, bk = c["BLOCK_N"], c["BLOCK_K"]
        assert bn & (bn - 1) == 0 and bk & (bk - 1) == 0 and bk >= 256
        assert c["num_warps"] in (2, 4, 8) and (kind != "rope" or 32 % bn == 0)
        opts = {k: c[k] for k in ("maxnreg",) if k in c}
        assert opts.get("maxnreg", 8) % 8 == 0 and 96 <= opts.get("maxnreg", 255) <= 255
        div = ("N", "K", "s_xm", "s_wn", "s_om") if N % 16 == 0 and K % 16 == 0 else ()
        if kind == "rope":
            ptx = _sm90(F._fused_qkv_rope_kernel, _ROPE_PTRS,
                        dict(HALF=32, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=K % bk == 0, NORM=True,
                             HAS_BIAS=False, PDL=True), ("eps",),
                        num_warps=c["num_warps"], div16=div, **opts)
        else:
            ptx = _sm90(F._fused_gemv1_kernel, _G1_PTRS,
                        dict(BLOCK_N=bn, BLOCK_K=bk, EVEN_K=K % bk == 0, NORM=True,
                             GLU=kind == "glu", HAS_BIAS=False, HAS_RES=kind == "plain",
                             PDL=True), ("eps",), num_warps=c["num_warps"],
                        div16=div, **opts)
        assert "ld.global" in ptx
        regs, spill = _ptxas_usage(ptx)
        # a register cap may cost a few spilled bytes (16 for SmolLM2's gate/up), no more
        assert regs <= opts.get("maxnreg", 255) and spill <= 64, ((kind, N, K), regs, spill)


def test_fused_qkv_rope_refusals():
    c = nbx.KVCache(1, 1, 2, 8, 4)
    x, w = nbx.zeros((1, 5)), nbx.zeros((32, 5))
    pos = nbx.zeros((1, 1), dtype=nbx.int32)
    with pytest.raises(TypeError, match="cache must be an nbx.KVCache"):
        O.decode_qkv_rope(x, w, None, 0, pos, num_heads=4)
    with pytest.raises(ValueError, match="num_heads must be a positive multiple"):
        O.decode_qkv_rope(x, w, c, 0, pos, num_heads=3)
    with pytest.raises(ValueError, match=r"w must have shape \(32, 5\)"):
        O.decode_qkv_rope(x, nbx.zeros((20, 5)), c, 0, pos, num_heads=4)
    with pytest.raises(ValueError, match="positions must be an int Tensor"):
        O.decode_qkv_rope(x, w, c, 0, nbx.zeros((1, 1)), num_heads=4)
    with pytest.raises(ValueError, match="x must be a 2-D Tensor"):
        O.decode_qkv_rope(nbx.zeros((2, 5)), w, c, 0, pos, num_heads=4)


# ----------------------------------------------------------------------------- end of the step
@pytest.mark.parametrize("B,V,chunk", [(1, 16 * 5 + 1, None), (3, 16 * 3 + 1, 16), (2, 7, 32)])
def test_greedy_commit_first_max_and_positions(device, B, V, chunk, monkeypatch):
    """argmax (first index of the max, NaN = max as torch) into tokens, positions += 1;
    several splits (the ticket merge) and a strided logits view."""
    from nbxtensor.kernels import sampling as S
    if chunk is not None:
        monkeypatch.setattr(S, "_OVERRIDE", {"CHUNK": chunk, "BLOCK": 16})
    g = rng()
    a = g.standard_normal((B, 2 * V)).astype(np.float32)[:, ::2]     # strided view source
    # a tie: the first index wins (1 and 17 share a lane of a 16-wide block: the in-lane
    # rule; V - 1 lies in another split: the merge rule)
    a[0, [i for i in (1, 17, V - 1) if i < V]] = a[0].max() + 1.0
    if B > 1:
        a[1, V - 1] = np.nan                                         # NaN is the max
    if B > 2:
        a[2, :] = -np.inf                                            # all -inf: index 0
    full = nbx.tensor(np.ascontiguousarray(np.repeat(a, 2, axis=1)), device=device)
    logits = full[:, ::2]
    tokens = nbx.tensor(np.full((B, 1), -5, np.int64), device=device)
    p0 = g.integers(0, 100, (B, 1)).astype(np.int32)
    positions = nbx.tensor(p0, device=device)
    O.greedy_commit(logits, tokens, positions)
    want = np.argmax(a, axis=-1)
    assert tokens.numpy().reshape(-1).tolist() == want.tolist()
    assert (positions.numpy() == p0 + 1).all()
    O.greedy_commit(logits, tokens, positions)          # the counters were left at 0
    assert tokens.numpy().reshape(-1).tolist() == want.tolist()
    assert (positions.numpy() == p0 + 2).all()


@pytest.mark.parametrize("chunk", [None, 16])
def test_greedy_commit_nan_beats_inf(device, chunk, monkeypatch):
    """NaN is the max even against +inf at an earlier index (torch/NumPy argmax), inside
    one split and across the ticket merge."""
    from nbxtensor.kernels import sampling as S
    if chunk is not None:
        monkeypatch.setattr(S, "_OVERRIDE", {"CHUNK": chunk, "BLOCK": 16})
    a = np.zeros((3, 40), np.float32)
    a[0, [2, 5]] = [np.inf, np.nan]           # same split, same 16-lane block
    a[1, [3, 35]] = [np.inf, np.nan]          # +inf and NaN in different splits
    a[2, [1, 20, 33]] = [np.nan, np.inf, np.nan]
    logits = nbx.tensor(a, device=device)
    tokens = nbx.zeros((3, 1), dtype=nbx.int64, device=device)
    positions = nbx.zeros((3, 1), dtype=nbx.int32, device=device)
    O.greedy_commit(logits, tokens, positions)
    assert tokens.numpy().reshape(-1).tolist() == np.argmax(a, -1).tolist() == [5, 35, 1]


def test_greedy_commit_float64_no_fp32_rounding(device):
    """float64 logits that differ below fp32's resolution: the larger wins (no silent
    rounding to fp32, which would make it a tie won by the first index)."""
    a = np.array([[1.0, 1.0 + 1e-12, 1.0], [3e39, 2e39, 4e39]], np.float64)
    logits = nbx.tensor(a, device=device)
    tokens = nbx.zeros((2, 1), dtype=nbx.int64, device=device)
    positions = nbx.zeros((2, 1), dtype=nbx.int32, device=device)
    O.greedy_commit(logits, tokens, positions)
    assert tokens.numpy().reshape(-1).tolist() == [1, 2]
    assert (positions.numpy() == 1).all()


def test_ticket_counters_outlive_a_larger_request():
    """A counter buffer replaced by a larger one (a bigger batch) is not freed: a CUDA graph
    captured with it keeps using it; freed, the allocator would hand it to other tensors."""
    import gc
    import weakref
    from nbxtensor.kernels import decode_attention as DA
    a = DA._counters(4, "cpu")
    r = weakref.ref(a)
    del a
    b = DA._counters(DA._counters(4, "cpu").shape[0] + 1, "cpu")
    gc.collect()
    assert r() is not None and r() is not b and b.shape[0] > r().shape[0]
    assert (b.numpy() == 0).all()


def test_commit_tokens(device):
    g = rng()
    B = 3
    nxt = nbx.tensor(g.integers(0, 1000, (2 * B,)), device=device)[::2]
    tokens = nbx.tensor(np.full((B, 1), -5, np.int64), device=device)
    p0 = g.integers(0, 100, (B, 1)).astype(np.int32)
    positions = nbx.tensor(p0, device=device)
    O.commit_tokens(nxt, tokens, positions)
    assert (tokens.numpy().reshape(-1) == nxt.numpy()).all()
    assert (positions.numpy() == p0 + 1).all()


def test_commit_refusals():
    lg = nbx.zeros((2, 5))
    tok = nbx.zeros((2, 1), dtype=nbx.int64)
    pos = nbx.zeros((2, 1), dtype=nbx.int32)
    with pytest.raises(ValueError, match="logits must be a 2-D float"):
        O.greedy_commit(nbx.zeros(5), tok, pos)
    with pytest.raises(ValueError, match="tokens must be an int32 or int64 Tensor of shape"):
        O.greedy_commit(lg, nbx.zeros((2, 2), dtype=nbx.int64), pos)
    with pytest.raises(ValueError, match="positions must be an int32 or int64 Tensor"):
        O.greedy_commit(lg, tok, nbx.zeros((2, 1)))
    with pytest.raises(ValueError, match="tokens must be an int32 or int64 Tensor"):   # would wrap
        O.greedy_commit(lg, nbx.zeros((2, 1), dtype=nbx.int8), pos)
    with pytest.raises(ValueError, match="nxt must be an int Tensor of shape"):
        O.commit_tokens(nbx.zeros(3, dtype=nbx.int64), tok, pos)


# ----------------------------------------------------------------------------- PDL
def test_pdl_policy_switch():
    import os
    import subprocess
    from nbxtensor.kernels import decode_fused as F
    prev = F.set_pdl(True)
    try:
        assert F.pdl_enabled(nbx.device("cuda")) and F.pdl_enabled("cuda")
        assert not F.pdl_enabled(nbx.device("interp")) and not F.pdl_enabled("cpu")
        assert F.pdl_opts("cuda") == dict(PDL=True, launch_pdl=True)
        assert F.pdl_opts("interp") == dict(PDL=False)
        assert F.set_pdl(False) is True
        assert not F.pdl_enabled("cuda") and F.pdl_opts("cuda") == dict(PDL=False)
        with pytest.raises(TypeError, match="on must be a bool"):
            F.set_pdl(1)
    finally:
        F.set_pdl(prev)
    code = ("from nbxtensor.kernels import decode_fused as F; "
            "print(F.pdl_enabled('cuda'), F.pdl_enabled('interp'))")
    for val, want in (("0", "False False"), ("1", "True False"), ("off", "False False")):
        env = dict(os.environ, NBX_PDL=val)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.stdout.strip() == want, (val, out.stdout, out.stderr[-2000:])


_G1_PTRS = dict(x_ptr="*bf16", w_ptr="*bf16", o_ptr="*fp32", nw_ptr="*bf16", b_ptr="*bf16",
                r_ptr="*bf16")
_ROPE_PTRS = dict(x_ptr="*bf16", w_ptr="*bf16", q_ptr="*bf16", nw_ptr="*bf16", b_ptr="*bf16",
                  pos_ptr="*i32", inv_ptr="*fp32", ck_ptr="*bf16", cv_ptr="*bf16",
                  len_ptr="*i32", flag_ptr="*i64")


def _sm90(fn, ptrs, constexprs, floats=(), num_warps=4, div16=(), **options):
    """Compile `fn` for sm_90 (types from names: ptrs {name: type}, floats fp32, else i32).
    div16: the integer arguments the launcher would mark divisible by 16 (the pointers
    always are, as the allocator's are); options: more compile options (maxnreg)."""
    import triton
    from triton.backends.compiler import GPUTarget
    sig = {}
    defaults = {p.name for p in fn.params if p.has_default}   # e.g. L2PF: left at default
    for n in fn.arg_names:
        if n in defaults and n not in constexprs:
            continue
        sig[n] = "constexpr" if n in constexprs else ptrs.get(n) or \
            ("fp32" if n in floats else "i32")
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if n in ptrs or n in div16} if div16 else None
    pdl = bool(constexprs.get("PDL"))
    return triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs,
                                                    attrs=attrs),
                          target=GPUTarget("cuda", 90, 64),
                          options=dict(num_warps=num_warps, **options,
                                       **(dict(launch_pdl=True) if pdl else {}))).asm["ptx"]


def _ptxas_usage(ptx):
    """(registers, spill store bytes) of a kernel's PTX, from the ptxas that Triton ships."""
    import re
    import subprocess
    import tempfile
    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", src, "-o",
                              os.path.join(d, "k.cubin")], capture_output=True, text=True,
                             timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    regs = int(re.search(r"Used (\d+) registers", out.stderr).group(1))
    spill = int(re.search(r"(\d+) bytes spill stores", out.stderr).group(1))
    return regs, spill


def _decode_kernels():
    """(name, kernel, pointer types, constexprs, float args) of every PDL kernel of the step."""
    from nbxtensor.kernels import decode_attention as DA, decode_fused as F, rope as R
    from nbxtensor.kernels import sampling as S
    bf = "*bf16"
    g1 = dict(x_ptr=bf, w_ptr=bf, o_ptr="*fp32", nw_ptr=bf, b_ptr=bf, r_ptr=bf)
    c1 = F.fused_gemv_config(1, 960, 576, 2, H200)
    cm = F.fused_gemv_config(16, 2048, 2048, 2, H200)
    flags = dict(NORM=True, GLU=True, HAS_BIAS=False, HAS_RES=True)
    ra = {n: bf for n in ("k_ptr", "v_ptr", "ck_ptr", "cv_ptr", "q_ptr")}
    ra.update(pos_ptr="*i32", len_ptr="*i32", inv_ptr="*fp32", flag_ptr="*i64")
    da = {n: bf for n in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}
    da.update(len_ptr="*i32", po_ptr="*fp32", pml_ptr="*fp32", cnt_ptr="*i32", flag_ptr="*i64")
    dcfg = DA.decode_config(1, 3, 256, 128, 128, 2, H200)
    dk = dict(GROUP=3, BLOCK_H=16, BLOCK_R=4, BLOCK_N=dcfg["BLOCK_N"], BLOCK_D=64,
              BLOCK_DV=64, PREC="tf32", COMBINE=1, CHUNK_P=8, BLOCK_P=8)
    return [
        ("fused_gemv1", F._fused_gemv1_kernel, g1,
         dict(BLOCK_N=c1["BLOCK_N"], BLOCK_K=c1["BLOCK_K"], EVEN_K=True, **flags),
         ("eps",)),
        ("fused_qkv_rope", F._fused_qkv_rope_kernel,
         dict(x_ptr=bf, w_ptr=bf, q_ptr=bf, nw_ptr=bf, b_ptr=bf, pos_ptr="*i32", inv_ptr="*fp32",
              ck_ptr=bf, cv_ptr=bf, len_ptr="*i32", flag_ptr="*i64"),
         dict(HALF=32, BLOCK_N=4, BLOCK_K=512, EVEN_K=True, NORM=True, HAS_BIAS=False,
              ),
         ("eps",)),
        ("fused_gemvm", F._fused_gemvm_kernel, g1,
         dict(BLOCK_M=16, BLOCK_N=cm["BLOCK_N"], BLOCK_K=cm["BLOCK_K"], PRECISION="tf32",
              **flags), ("eps",)),
        ("kv_append_rope", R._kv_append_kernel, ra,
         dict(BLOCK_H=4, BLOCK_D=64, BLOCK_DV=64, BLOCK_HQ=16, ROPE=True, INTERLEAVED=False,
              F64=False), ()),
        ("decode_split", DA._decode_split, da, dk, ("qk_scale",)),
        ("decode_combine", DA._decode_combine, da,
         dict(GROUP=3, BLOCK_N=64, BLOCK_R=4, CHUNK_P=8, BLOCK_P=8, BLOCK_DV=64), ()),
        ("argmax_commit", S._argmax_commit_kernel,
         dict(x_ptr="*fp32", pm_ptr="*fp32", pi_ptr="*i32", cnt_ptr="*i32", tok_ptr="*i64",
              pos_ptr="*i32"), dict(BLOCK=1024, BLOCK_S=64), ()),
        ("commit", S._commit_kernel, dict(src_ptr="*i64", tok_ptr="*i64", pos_ptr="*i32"),
         dict(BLOCK_B=2), ()),
        ("sample", S._sample_kernel, dict(x_ptr="*fp32", out_ptr="*i64", state_ptr="*i64"),
         dict(GREEDY=False, TOPK=True, TOPP=True, BLOCK=1024), ("inv_temp", "top_p")),
        ("penalty", S._penalty_kernel, dict(x_ptr="*fp32", w_ptr="*fp32", prev_ptr="*i64"),
         dict(BLOCK=1024, BLOCK_P=64), ("penalty",)),
        ("advance", S._advance_kernel, dict(state_ptr="*i64"), {}, ()),
    ]


@pytest.mark.parametrize("name", ["fused_gemv1", "fused_qkv_rope", "fused_gemvm",
                                  "kv_append_rope", "decode_split", "decode_combine",
                                  "argmax_commit", "commit", "sample", "penalty", "advance"])
def test_decode_kernels_pdl_ptx_sm90(name):
    """With PDL=True each kernel of the decode step waits (griddepcontrol.wait) and releases
    its dependents; without, neither appears. The GEMV issues its first weight tile before
    the wait (read-only data overlaps the previous kernel's tail)."""
    pytest.importorskip("triton")
    (_, fn, ptrs, cx, floats), = [k for k in _decode_kernels() if k[0] == name]
    on = _sm90(fn, ptrs, dict(cx, PDL=True), floats)
    assert "griddepcontrol.wait" in on and "griddepcontrol.launch_dependents" in on
    assert on.index("griddepcontrol.wait") < on.index("griddepcontrol.launch_dependents")
    if name in ("fused_gemv1", "fused_qkv_rope"):
        assert on.index("ld.global") < on.index("griddepcontrol.wait")
    else:      # nothing is read before the wait
        assert on.index("griddepcontrol.wait") < on.index("ld.global")
    off = _sm90(fn, ptrs, dict(cx, PDL=False), floats)
    assert "griddepcontrol" not in off


# ----------------------------------------------------------------------------- sampling in the step
def test_sampled_decoding_reproducible_and_top_k1_is_greedy(device):
    from nbxtensor.models.graph_decode import GraphDecoder
    m = _tiny_llama(device, L=1)
    prompts = [[3, 14, 15, 92, 65], [7, 7, 1, 50, 2]]
    n = 5 if device == "cpu" else 2
    kw = dict(temperature=0.9, top_p=0.95, repetition_penalty=1.3)
    a = GraphDecoder(m, batch=2, capacity=16, seed=7, **kw).generate(prompts, n).tokens
    b = GraphDecoder(m, batch=2, capacity=16, seed=7, **kw).generate(prompts, n).tokens
    assert a == b
    assert all(0 <= t < m.cfg.vocab_size for s in a for t in s)
    greedy = [_model_greedy(m, p, n) for p in prompts]
    k1 = GraphDecoder(m, batch=2, capacity=16, temperature=1.3, top_k=1, seed=3).generate(prompts, n)
    assert k1.tokens == greedy


def test_repetition_history_tracks_prompt_and_tokens():
    from nbxtensor.models.graph_decode import GraphDecoder
    m = _tiny_llama("cpu", L=1)
    dec = GraphDecoder(m, batch=2, capacity=12, temperature=1.0, repetition_penalty=1.2, seed=1)
    res = dec.generate([[1, 2, 3], [4, 5, 6]], 4)
    h = dec.history.numpy()
    for b, p in enumerate([[1, 2, 3], [4, 5, 6]]):
        assert h[b, :7].tolist() == p + res.tokens[b]
        assert (h[b, 7:] == -1).all()


def test_generate_graph_flag_needs_cuda():
    from nbxtensor.models.generate import generate

    class Tok:
        eos_ids = ()
    m = _tiny_llama("cpu", L=1)
    m.tokenizer = Tok()
    with pytest.raises(ValueError, match="graph=True needs a cuda model"):
        generate(m, [1, 2], 2, graph=True)


def test_device_loop_streams_the_same_tokens_as_the_host_loop():
    """generate()'s cuda loop (GraphDecoder, eager here) vs its host loop over forward():
    same greedy tokens, stop handling, and the streamed text adds up to the final text."""
    from nbxtensor.models.generate import _generate_device, generate
    from nbxtensor.models.sampling import Sampler

    class Tok:
        eos_ids = ()

        @staticmethod
        def decode(ids):
            return "".join(chr(65 + i % 26) for i in ids)
    m = _tiny_llama("cpu", L=2)
    m.tokenizer = Tok()
    prompt = [3, 14, 15, 92, 65]
    host = generate(m, prompt, 8)
    pieces = []
    dev = _generate_device(m, prompt, 8, Sampler(), set(), pieces.append, False)
    assert dev.tokens == host.tokens and dev.text == host.text == "".join(pieces)
    stop = host.tokens[3]
    h2 = generate(m, prompt, 8, stop_ids=[stop])
    d2 = _generate_device(m, prompt, 8, Sampler(), {stop}, None, False)
    assert d2.tokens == h2.tokens and d2.stopped_by == h2.stopped_by == "stop"
    assert d2.text == h2.text
    # greedy with a repetition penalty: the device history matches the host sampler's
    h3 = generate(m, prompt, 8, sampler=Sampler(repetition_penalty=1.5))
    d3 = _generate_device(m, prompt, 8, Sampler(repetition_penalty=1.5), set(), None, False)
    assert d3.tokens == h3.tokens


# ----------------------------------------------------------------------------- cuda
@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("sampled", [False, True])
def test_cuda_replay_equals_eager_step(batch, sampled):
    m = _tiny_llama("cuda", dtype=nbx.bfloat16, L=2, V=300, H=128, Hq=4, Hkv=2, F=256)
    kw = dict(temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.2, seed=11) \
        if sampled else {}
    prompts = [[5 + b, 17, 3 * b + 1, 200, 9] for b in range(batch)]
    eager, graph = prefilled_eager_and_graph(m, prompts, batch, **kw)
    for i in range(12):
        te = eager.step().numpy()
        graph.logits.fill_(float("nan"))          # the replay must rewrite its output
        tg = graph.step().numpy()
        assert te.tobytes() == tg.tobytes(), i
        assert eager.logits.numpy().tobytes() == graph.logits.numpy().tobytes(), i
    assert_graph_generate_equals_eager(m, prompts, batch, 16, **kw)


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
@pytest.mark.parametrize("sampled", [False, True])
def test_cuda_pdl_on_off_identical(sampled):
    """PDL changes when kernels start, not what they compute: graph replays captured with
    PDL on and off give the same tokens and logits bit for bit (and the same kernel count)."""
    from nbxtensor.kernels import decode_fused
    from nbxtensor.models.graph_decode import GraphDecoder
    m = _tiny_llama("cuda", dtype=nbx.bfloat16, L=2, V=300, H=128, Hq=4, Hkv=2, F=256)
    kw = dict(temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.2, seed=11) \
        if sampled else {}
    prompts = [[5, 17, 1, 200, 9], [6, 17, 4, 200, 9]]
    out = {}
    prev = decode_fused.set_pdl(True)
    try:
        for on in (True, False):
            decode_fused.set_pdl(on)
            d = GraphDecoder(m, batch=2, capacity=40, use_graph=True, **kw)
            d.prefill(prompts)
            d.capture()
            toks, lg = [], []
            for _ in range(10):
                toks.append(d.step().numpy().copy())
                lg.append(d.logits.numpy().tobytes())
            out[on] = (d.kernels_per_step, [t.tobytes() for t in toks], lg)
    finally:
        decode_fused.set_pdl(prev)
    assert out[True] == out[False]


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
def test_cuda_qkv_rope_1b_shape_matches_float64():
    """The 1B-shape QKV+RoPE+append kernel (4 x 512 pairs, operands loaded before the K
    loop) against a float64 reference: q and the written k / v rows."""
    g = rng()
    Hq, Hkv, D, K, C = 32, 8, 64, 2048, 16
    N = (Hq + 2 * Hkv) * D
    bf = nbx.bfloat16
    x = nbx.tensor(g.standard_normal((1, K)).astype(np.float32), device="cuda").to(bf)
    w = nbx.tensor((g.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32),
                   device="cuda").to(bf)
    nw = nbx.tensor(g.standard_normal(K).astype(np.float32), device="cuda").to(bf)
    pos = nbx.tensor(np.array([[5]], np.int32), device="cuda")
    c = nbx.KVCache(1, 1, Hkv, C, D, dtype=bf, device="cuda")
    q = O.decode_qkv_rope(x, w, c, 0, pos, num_heads=Hq, norm_weight=nw, eps=1e-5,
                         theta=500000.0)
    xa = to64(x)
    xa = xa / np.sqrt(np.mean(xa * xa, -1, keepdims=True) + 1e-5) * to64(nw)
    y = (xa @ to64(w).T)[0]
    a = 5 * (1.0 / 500000.0 ** (np.arange(0, D, 2) / D))

    def rot(t):
        t1, t2 = t[:, :D // 2], t[:, D // 2:]
        return np.concatenate([t1 * np.cos(a) - t2 * np.sin(a), t2 * np.cos(a) + t1 * np.sin(a)],
                              -1)
    tol = dict(rtol=2e-2, atol=3e-2)
    assert_close(q.to(nbx.float32).numpy()[0, :, 0], rot(y[:Hq * D].reshape(Hq, D)), **tol)
    assert_close(c.k.to(nbx.float32).numpy()[0, 0, :, 5],
                 rot(y[Hq * D:(Hq + Hkv) * D].reshape(Hkv, D)), **tol)
    assert_close(c.v.to(nbx.float32).numpy()[0, 0, :, 5], y[(Hq + Hkv) * D:].reshape(Hkv, D),
                 **tol)
    assert int(c.lengths.numpy()[0]) == 6


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
def test_cuda_fused_fewer_kernels_and_close_to_unfused(record_property):
    from nbxtensor.models.graph_decode import GraphDecoder
    m = _tiny_llama("cuda", dtype=nbx.bfloat16, L=2, V=300, H=128, Hq=4, Hkv=2, F=256)
    ks, logits = {}, {}
    for fused in (False, True):
        d = GraphDecoder(m, batch=1, capacity=32, use_graph=True, fused=fused)
        d.prefill([[1, 2, 3, 4]])
        d.step()
        ks[fused] = d.kernels_per_step
        logits[fused] = to64(d.logits)
    record_property("kernels_per_step", ks)
    assert ks[True] < ks[False]
    np.testing.assert_allclose(logits[True], logits[False], rtol=0.05, atol=0.1)
