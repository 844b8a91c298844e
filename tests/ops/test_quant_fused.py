"""Fused decode GEMVs over Q8_0 / Q4_1 blocks (kernels/quant_fused.py, entry
ops/decode.decode_linear with a QuantWeight): against a float64 NumPy reference that decodes
the blocks itself (written here, independent of backends/cpu/ggml_blocks.py and the kernels), on cpu and
interp; NaN-poisoned outputs; refusals; the sm_90 compile of every variant; the quantised
model's decode step on the fused path (== forward) with the bf16 path's kernel count."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor.models import _ops as O

from helpers import H200, assert_close, poisoned, rng, to64

sys.path.insert(0, __file__.rsplit("/", 1)[0])


# ----------------------------------------------------------------------------- reference
def _rand_blocks(g, rows, K, qtype):
    """Random GGUF blocks (rows, K // 32 * block bytes) uint8 with finite, moderate fp16
    scales (and Q4_1 mins) and random quants over their whole range."""
    nb = K // 32
    d = (g.standard_normal((rows, nb)) * 0.02).astype(np.float16)
    if qtype == "Q8_0":
        q = g.integers(-128, 128, (rows, nb, 32), dtype=np.int64).astype(np.int8)
        blk = np.concatenate([d[..., None].view(np.uint8), q.view(np.uint8)], axis=-1)
    else:
        m = (g.standard_normal((rows, nb)) * 0.1).astype(np.float16)
        qs = g.integers(0, 256, (rows, nb, 16), dtype=np.int64).astype(np.uint8)
        blk = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8), qs],
                             axis=-1)
    return np.ascontiguousarray(blk.reshape(rows, -1))


def _deq64(blocks, qtype, K):
    """float64 weights from the blocks, decoded element by element from the layout spec."""
    rows = blocks.shape[0]
    nb = K // 32
    if qtype == "Q8_0":
        b = blocks.reshape(rows, nb, 34)
        d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
        q = b[..., 2:34].copy().view(np.int8).astype(np.float64)
        return (d[..., None] * q).reshape(rows, K)
    b = blocks.reshape(rows, nb, 20)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    w = np.empty((rows, nb, 32))
    for j in range(32):                  # weight j: byte j % 16, low nibble if j < 16
        byte = b[..., 4 + j % 16].astype(np.int64)
        w[..., j] = d * ((byte & 15) if j < 16 else (byte >> 4)) + m
    return w.reshape(rows, K)


def _ref(x, w64, nw=None, eps=1e-5, bias=None, res=None, glu=False):
    x = to64(x)
    if nw is not None:
        x = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * to64(nw)
    y = x @ w64.T
    if bias is not None:
        y = y + to64(bias)
    if glu:
        n = w64.shape[0] // 2
        g, u = y[:, :n], y[:, n:]
        y = g / (1 + np.exp(-g)) * u
    if res is not None:
        y = y + to64(res)
    return y


def _qweight(g, rows, K, qtype, device):
    blk = _rand_blocks(g, rows, K, qtype)
    return O.QuantWeight(nbx.tensor(blk, device=device), qtype, (rows, K)), _deq64(blk, qtype, K)


def _case(device, qtype, M, mode, K=288, N=33, dtype=nbx.float32):
    """x, w, kwargs, reference. K = 288 = 9 blocks overhangs the interp BLOCK_B (8); N = 33
    overhangs BLOCK_N 32; x is a strided view."""
    g = rng()
    xa = (g.standard_normal((M, K + 5)) * 2 + 0.3).astype(np.float32)
    x = nbx.tensor(xa, device=device)[:, 2:2 + K].to(dtype)
    rows = 2 * N if mode == "glu" else N
    w, w64 = _qweight(g, rows, K, qtype, device)
    kw = {}
    if mode in ("norm", "norm_bias", "glu", "all"):
        kw["norm_weight"] = nbx.tensor(1 + 0.1 * g.standard_normal(K).astype(np.float32),
                                       device=device).to(dtype)
        kw["eps"] = 1e-5
    if mode in ("bias", "norm_bias", "all"):
        kw["bias"] = nbx.tensor(g.standard_normal(N).astype(np.float32), device=device)
    if mode == "glu":
        kw["glu"] = True
    if mode in ("residual", "all"):
        kw["residual"] = nbx.tensor(g.standard_normal((M, N)).astype(np.float32),
                                    device=device).to(dtype)
    ref = _ref(x, w64, kw.get("norm_weight"), kw.get("eps", 1e-5), kw.get("bias"),
               kw.get("residual"), kw.get("glu", False))
    return x, w, kw, ref


def _tol(ref, rel):
    # relative to the output's scale: sums of K products in fp32 (and one output rounding)
    s = float(np.abs(ref).max())
    return dict(rtol=rel, atol=rel * s)


MODES = ["plain", "norm", "bias", "norm_bias", "glu", "residual", "all"]


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("mode", MODES)
def test_fused_quant_matches_float64(device, qtype, M, mode):
    x, w, kw, ref = _case(device, qtype, M, mode)
    y = O.decode_linear(x, w, **kw)
    assert y.shape == ref.shape and y.dtype is nbx.float32 and y.device.type == device
    assert_close(y, ref, **_tol(ref, 1e-5))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_fused_quant_bf16_activations_fp32_logits(device, qtype):
    """bf16 x / norm weight / residual (the bf16 model); out_dtype float32 (the lm_head)."""
    x, w, kw, ref = _case(device, qtype, 2, "all", dtype=nbx.bfloat16)
    y = O.decode_linear(x, w, **kw)
    assert y.dtype is nbx.bfloat16
    assert_close(y, ref, **_tol(ref, 1e-2))
    kw.pop("residual")
    kw.pop("bias")
    x2, w2, kw2, ref2 = _case(device, qtype, 1, "norm", dtype=nbx.bfloat16)
    y = O.decode_linear(x2, w2, out_dtype=nbx.float32, **kw2)
    assert y.dtype is nbx.float32
    assert_close(y, ref2, **_tol(ref2, 1e-5))      # x bf16 exactly; fp32 sums, no rounding


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("mode", ["glu", "all"])
def test_cuda_config_on_interp_writes_every_output(monkeypatch, qtype, mode):
    """The cuda-style config (BLOCK_N 2, several K steps: the one-ahead weight prefetch and
    its masked tail) on interp, M = 3, output NaN-poisoned: every element written, right."""
    pytest.importorskip("triton")
    from nbxtensor.kernels import quant_fused as F
    monkeypatch.setattr(F, "_OVERRIDE", dict(BLOCK_N=2, BLOCK_B=4, num_warps=4))
    x, w, kw, ref = _case("interp", qtype, 3, mode, K=32 * 9, N=5)
    x = x.contiguous()
    out = poisoned(ref.shape, nbx.float32, "interp")
    F.fused_quant_gemv(x, w, out=out, **kw)
    assert not np.isnan(out.numpy()).any()
    assert_close(out, ref, **_tol(ref, 1e-5))


def test_refusals():
    g = rng()
    x = nbx.tensor(g.standard_normal((2, 64)).astype(np.float32))
    w, _ = _qweight(g, 6, 64, "Q4_1", "cpu")
    with pytest.raises(ValueError, match="no fused kernel"):
        O.decode_linear(x, O.QuantWeight(w.blocks, "Q4_K", (6, 64)))
    with pytest.raises(ValueError, match="x must be a 2-D"):
        O.decode_linear(x.reshape(128), w)
    with pytest.raises(ValueError, match=r"w must be \(N, 32\)"):
        O.decode_linear(x[:, :32], w)
    with pytest.raises(ValueError, match="even row count"):
        O.decode_linear(x, O.QuantWeight(w.blocks[:5], "Q4_1", (5, 64)), glu=True)
    with pytest.raises(ValueError, match="bias with glu"):
        O.decode_linear(x, w, glu=True, bias=nbx.zeros(3))
    with pytest.raises(ValueError, match="uint8 blocks of shape"):
        O.decode_linear(x, O.QuantWeight(w.blocks[:, :20], "Q4_1", (6, 64)))
    with pytest.raises(ValueError, match="norm_weight must be a Tensor of shape"):
        O.decode_linear(x, w, norm_weight=nbx.ones(63))
    with pytest.raises(ValueError, match="residual must be a Tensor of shape"):
        O.decode_linear(x, w, residual=nbx.ones((2, 5)))
    with pytest.raises(ValueError, match="residual must be float32"):
        O.decode_linear(x, w, residual=nbx.ones((2, 6), dtype=nbx.bfloat16))
    with pytest.raises(ValueError, match="x must be floating point"):
        O.decode_linear(x.to(nbx.int32), w)
    with pytest.raises(ValueError, match="out_dtype must be floating"):
        O.decode_linear(x, w, out_dtype=nbx.int32)


def test_refusals_interp():
    pytest.importorskip("triton")
    g = rng()
    x = nbx.tensor(g.standard_normal((1, 64)).astype(np.float32), device="interp")
    w, _ = _qweight(g, 4, 64, "Q4_1", "interp")
    with pytest.raises(ValueError, match="w is on cpu but x is on interp"):
        O.decode_linear(x, O.QuantWeight(w.blocks.cpu(), "Q4_1", (4, 64)))
    # a Q4_1 row view at an odd 2-byte offset: the int32 word loads need 4-byte alignment
    raw = nbx.zeros((4 * 40 + 2,), dtype=nbx.uint8, device="interp")
    blocks = raw[2:].reshape(4, 40)
    with pytest.raises(ValueError, match="4-byte aligned"):
        O.decode_linear(x, O.QuantWeight(blocks, "Q4_1", (4, 64)))


# ----------------------------------------------------------------------------- QKV + RoPE + append
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("B,norm,bias,override", [(1, True, False, None), (3, True, True, None),
                                                  (2, False, False, "cuda")])
def test_fused_qkv_rope_quant(monkeypatch, qtype, B, norm, bias, override):
    """ops.decode.decode_qkv_rope with a QuantWeight: one kernel (interp) == fused_linear +
    KVCache.append_rope, and against float64: q rotated, k rotated / v written at the device
    positions, the other cache rows untouched, lengths = positions + 1. K = 9 blocks overhangs
    the interp BLOCK_B (8); "cuda": the cuda-style config (2 pairs a program, several K
    steps) forced on interp."""
    pytest.importorskip("triton")
    from nbxtensor.kernels import quant_fused as F
    if override:
        monkeypatch.setattr(F, "_OVERRIDE", dict(BLOCK_N=2, BLOCK_B=4, num_warps=4))
    dev = "interp"
    g = rng()
    Hq, Hkv, D, K, C = 4, 2, 8, 32 * 9, 12
    N = (Hq + 2 * Hkv) * D
    x = nbx.tensor(g.standard_normal((B, K)).astype(np.float32), device=dev)
    w, w64 = _qweight(g, N, K, qtype, dev)
    nw = nbx.tensor(1 + 0.1 * g.standard_normal(K).astype(np.float32), device=dev) if norm else None
    b = nbx.tensor(g.standard_normal(N).astype(np.float32), device=dev) if bias else None
    pos_np = g.integers(0, C, (B, 1)).astype(np.int32)
    pos = nbx.tensor(pos_np, device=dev)
    theta = 500.0
    old = g.standard_normal((2, B, Hkv, C, D)).astype(np.float32)
    launched = []
    from nbxtensor import dispatch
    orig = dispatch.impl("decode_qkv_rope_quant", nbx.device(dev))
    assert orig is F.fused_qkv_rope_quant
    monkeypatch.setitem(dispatch._BY_DEVTYPE, ("decode_qkv_rope_quant", "interp"),
                        lambda *a, **k: launched.append(1) or orig(*a, **k))
    from test_decode import _qkv_rope_both
    res = _qkv_rope_both(x, w, nw, b, pos, old, Hq, theta, dev)
    assert launched == [1]                   # the quantised kernel ran (not the fallback)
    (qf, kf, vf, lf), (qc, kc, vc, lc) = res
    for a, r in ((qf, qc), (kf, kc), (vf, vc)):
        assert_close(a, r, rtol=1e-5, atol=1e-5 * float(np.abs(r).max()))
    assert (lf == lc).all() and (lf == pos_np[:, 0] + 1).all()
    y = _ref(x, w64, nw, 1e-5, b)
    inv = 1.0 / theta ** (np.arange(0, D, 2) / D)

    def rot(t, p):                           # t (H, D) at position p, rotate_half
        a = p * inv
        t1, t2 = t[:, :D // 2], t[:, D // 2:]
        return np.concatenate([t1 * np.cos(a) - t2 * np.sin(a), t2 * np.cos(a) + t1 * np.sin(a)], 1)
    k_ref, v_ref = old[1].astype(np.float64).copy(), -old[1].astype(np.float64)
    for bi in range(B):
        p = int(pos_np[bi, 0])
        yb = y[bi]
        tol = dict(rtol=1e-5, atol=1e-5 * float(np.abs(yb).max()))
        assert_close(qf[bi, :, 0], rot(yb[:Hq * D].reshape(Hq, D), p), **tol)
        k_ref[bi, :, p] = rot(yb[Hq * D:(Hq + Hkv) * D].reshape(Hkv, D), p)
        v_ref[bi, :, p] = yb[(Hq + Hkv) * D:].reshape(Hkv, D)
    t = 1e-5 * float(np.abs(y).max())
    assert_close(kf[1], k_ref, rtol=1e-5, atol=t)
    assert_close(vf[1], v_ref, rtol=1e-5, atol=t)
    assert_close(kf[0], old[0], rtol=0, atol=0)       # the other layer untouched


# ----------------------------------------------------------------------------- sm_90 compile
def _variants():
    for qt in ("Q8_0", "Q4_1"):
        for xdt in ("bf16", "fp32"):
            # SmolLM2 shapes (qkv+norm, gate/up+norm+glu, down+residual, o+residual+bias,
            # head fp32) and a Llama-1B-sized gate/up
            yield qt, xdt, xdt, 960, 576, dict(NORM=True)
            yield qt, xdt, xdt, 1536, 576, dict(NORM=True, GLU=True)
            yield qt, xdt, xdt, 576, 1536, dict(HAS_RES=True)
            yield qt, xdt, xdt, 576, 576, dict(HAS_RES=True, HAS_BIAS=True)
            yield qt, xdt, "fp32", 49152, 576, dict(NORM=True)
            yield qt, xdt, xdt, 8192, 2048, dict(NORM=True, GLU=True)


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("qt,xdt,odt,N,K,flags", list(_variants()))
def test_compiles_for_sm90(qt, xdt, odt, N, K, flags, pdl):
    """Every variant at its cuda config compiles for the H200: little shared memory (layout
    conversions only), no spills, <= 128 registers (ptxas -v), word-wide weight loads, and
    griddepcontrol present exactly with PDL."""
    triton = pytest.importorskip("triton")
    import re
    from triton.backends.compiler import GPUTarget
    from nbxtensor.kernels import quant_fused as F
    from test_quant_gpu import _ptxas_stats
    cfg = F.qfused_config(1, N, K // 32, qt, H200)
    assert -(-N // cfg["BLOCK_N"]) >= 2 * 132 or cfg["BLOCK_N"] == 1
    sig = dict(x_ptr="*" + xdt, w_ptr="*u8", o_ptr="*" + odt, nw_ptr="*" + xdt,
               b_ptr="*" + xdt, r_ptr="*" + xdt, N="i32", K="i32", KB="i32", row_bytes="i32",
               up_off="i32", eps="fp32", s_xm="i32", s_om="i32", s_rm="i32")
    c = dict(QTYPE=F.QTYPES[qt], W=F._WORDS[qt], BLOCK_N=cfg["BLOCK_N"], BLOCK_B=cfg["BLOCK_B"],
             NORM=False, GLU=False, HAS_BIAS=False, HAS_RES=False, PDL=pdl)
    c.update(flags)
    # the launcher specialises 16-byte aligned pointers (as here: tt.divisibility)
    k = triton.compile(triton.compiler.ASTSource(
        fn=F._qfused_gemv_kernel, signature={**sig, **{n: "constexpr" for n in c}},
        constexprs=c, attrs={(i,): [["tt.divisibility", 16]] for i in range(6)}),
        target=GPUTarget("cuda", 90, 64))
    ptx = k.asm["ptx"]
    assert k.metadata.shared <= 16 * 1024
    word = "ld.global.b32" if qt == "Q4_1" else "ld.global.b16"
    assert word in ptx
    assert ("griddepcontrol.wait" in ptx) == pdl
    st = _ptxas_stats(ptx)
    if st is not None:
        regs, spill = st
        assert spill == 0 and regs <= 128, (regs, spill)
    # no loads wider than the layout allows (vector x loads are Triton's layout choice)
    assert not re.search(r"ld\.global\.v4\.b16", ptx)


@pytest.mark.parametrize("qt", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("pdl", [False, True])
def test_qkv_rope_compiles_for_sm90(qt, pdl):
    """The QKV + RoPE + append kernel at SmolLM2's shape (Hq 9, Hkv 3, D 64, K 576), bf16."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget
    from nbxtensor.kernels import quant_fused as F
    from test_quant_gpu import _ptxas_stats
    cfg = F.qfused_config(1, 15 * 32, 18, qt, H200)
    sig = dict(x_ptr="*bf16", w_ptr="*u8", q_ptr="*bf16", nw_ptr="*bf16", b_ptr="*bf16",
               pos_ptr="*i32", inv_ptr="*fp32", ck_ptr="*bf16", cv_ptr="*bf16", len_ptr="*i32",
               flag_ptr="*i64", tag="i32", K="i32", KB="i32", row_bytes="i32", eps="fp32", Hq="i32", Hkv="i32", C="i32",
               s_xm="i32", s_qm="i32", s_pb="i32", s_cb="i32", s_ch="i32", s_cn="i32",
               s_cd="i32", s_vb="i32", s_vh="i32", s_vn="i32", s_vd="i32")
    c = dict(QTYPE=F.QTYPES[qt], W=F._WORDS[qt], HALF=32, BLOCK_N=cfg["BLOCK_N"],
             BLOCK_B=cfg["BLOCK_B"], NORM=True, HAS_BIAS=False, PDL=pdl)
    k = triton.compile(triton.compiler.ASTSource(
        fn=F._qfused_qkv_rope_kernel, signature={**sig, **{n: "constexpr" for n in c}},
        constexprs=c, attrs={(i,): [["tt.divisibility", 16]] for i in range(10)}),
        target=GPUTarget("cuda", 90, 64))
    assert k.metadata.shared <= 16 * 1024
    assert ("griddepcontrol.wait" in k.asm["ptx"]) == pdl
    st = _ptxas_stats(k.asm["ptx"])
    if st is not None:
        assert st[1] == 0 and st[0] <= 128, st


# ----------------------------------------------------------------------------- the model
def _uniform_quantised_tiny(device, L=1, head_q="Q8_0"):
    """The tiny Llama with each layer's projections in one format (layer i: Q4_1 if i is even,
    else Q8_0; gguf's own quantiser) and a tied quantised embedding / lm_head, as SmolLM2's
    GGUF (Q4_1 layers, Q8_0 token_embd)."""
    gguf = pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as Q
    from nbxtensor.models.llama import LlamaModel
    from test_graphs import _tiny_llama

    def qw(t, qt):
        a = t.numpy().astype(np.float32)
        blocks = gguf.quants.quantize(a, getattr(Q, qt))
        return O.QuantWeight(nbx.tensor(np.ascontiguousarray(blocks), device=device), qt, a.shape)
    m = _tiny_llama(device, L=L)
    w = m.w
    for i, Lw in enumerate(w["layers"]):
        qt = ("Q4_1", "Q8_0")[i % 2]
        for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            Lw[n] = qw(Lw[n], qt)
        for n in ("wqkv", "w_gateup"):
            Lw.pop(n)
    w["embed"] = w["lm_head"] = qw(w["lm_head"], head_q)
    return LlamaModel(m.cfg, w, None, device, m.dtype)


def test_quantised_model_takes_the_fused_path(device):
    """Uniform-format quantised layers and the quantised head take the fused path (Q/K/V and
    gate/up concatenated by block rows, the separate weights views of them), and the fused
    decode step equals forward() (unfused quant_linear) over prefill + 2 steps (cuda: with
    PDL as the policy says, 2 layers, 4 steps)."""
    if device == "cpu":
        pytest.skip("the cpu quantised path (numba) has its own tests: tests/models/test_cpu_quant.py")
    from test_decode import _decode_vs_forward
    L, steps = (1, 2) if device == "interp" else (2, 4)
    m = _uniform_quantised_tiny(device, L=L)
    assert all(m.fused) and len(m.fused) == L and m.fused_head
    Lw = m.w["layers"][0]
    assert isinstance(Lw["wqkv"], O.QuantWeight) and Lw["wqkv"].qtype == "Q4_1"
    assert Lw["wqkv"].shape[0] == Lw["wq"].shape[0] + Lw["wk"].shape[0] + Lw["wv"].shape[0]
    assert Lw["wk"].blocks.data_ptr() == Lw["wqkv"].blocks.data_ptr() + \
        Lw["wq"].shape[0] * Lw["wqkv"].blocks.stride(0)
    assert Lw["w_up"].blocks.data_ptr() == \
        Lw["w_gateup"].blocks[Lw["w_gate"].shape[0]:].data_ptr()
    _decode_vs_forward(m, [[3, 14, 15, 92, 65]], steps, True)


@pytest.mark.cuda
def test_cuda_graph_replay_quantised_greedy():
    """cuda: the quantised model's captured decode step (graph replay, PDL per the policy)
    gives forward()'s greedy tokens for two different prompts (batch 2)."""
    from test_graphs import _cuda_ok, _model_greedy
    if not _cuda_ok():
        pytest.skip("no CUDA device")
    from nbxtensor.models.graph_decode import GraphDecoder
    m = _uniform_quantised_tiny("cuda", L=2)
    p1, p2 = [3, 14, 15, 92, 65], [7, 7, 1, 50, 2]
    ref = [_model_greedy(m, p, 8) for p in (p1, p2)]
    dec = GraphDecoder(m, batch=2, capacity=24)
    assert dec.use_graph
    assert dec.generate([p1, p2], max_new_tokens=8).tokens == ref


def test_mixed_formats_in_a_group_stay_unfused():
    """Q/K/V in different formats cannot be one block matrix: that layer is unfused."""
    pytest.importorskip("triton")
    from nbxtensor.models.llama import LlamaModel
    m = _uniform_quantised_tiny("interp", L=2)      # layer 0 Q4_1, layer 1 Q8_0
    w = m.w
    w["layers"][0]["wv"] = w["layers"][1]["wv"]      # a Q8_0 V among Q4_1 Q/K
    for Lw in w["layers"]:
        for n in ("wqkv", "w_gateup"):
            Lw.pop(n)
    m2 = LlamaModel(m.cfg, w, None, "interp", m.dtype)
    assert m2.fused == [False, True] and m2.fused_head


def test_kernels_per_step_quantised_equals_plain(monkeypatch, record_property):
    """The quantised model's decode step launches no more kernels per layer than the plain
    (bf16-path) one (5: QKV+RoPE+append, attention, o+res, gate/up+SiLU*up, down+res) and no
    more fixed ones (the quantised embedding is one dequantize_rows kernel)."""
    pytest.importorskip("triton")
    from nbxtensor.models.graph_decode import GraphDecoder
    from test_decode import _count_launches
    from test_graphs import _tiny_llama
    counts = {}
    for name, mk in (("plain", _tiny_llama), ("quantised", _uniform_quantised_tiny)):
        for L in (1, 2):
            m = mk("interp", L=L)
            assert all(m.fused) and m.fused_head
            dec = GraphDecoder(m, batch=1, capacity=16)
            dec.prefill([[1, 2, 3]])
            dec.step()       # steady state: one-off launches (cached constants) happen here
            counts[name, L] = _count_launches(monkeypatch, dec.step)
    record_property("kernels_per_step", {f"{n} L={L}": c for (n, L), c in counts.items()})
    print("kernels per step:", counts)
    for L in (1, 2):
        # embedding + per layer (QKV+RoPE+append, attention, o, gate/up, down) + head + argmax
        assert counts["quantised", L] == 5 * L + 3
        assert counts["quantised", L] <= counts["plain", L]
