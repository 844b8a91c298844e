"""Mixture of experts: router top-k (softmax/sigmoid, grouped, renormalised or not),
moe_align_block_size, fused_experts / fused_moe (the decode GEMVs and the grouped GEMMs,
shared experts), and the MoE decoders (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) from tiny
random HF folders against float64 NumPy implementations written here.

Every op allocation starts NaN (helpers.poison_allocations), so an unwritten element shows."""
from __future__ import annotations

import json

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng

F = nbx.nn.functional


pytestmark = pytest.mark.usefixtures("poison_outputs")


# ----------------------------------------------------------------------------- references
def ref_topk(g, topk, renormalize=True, scoring="softmax", groups=None, topk_group=None,
             bias=None, scale=1.0):
    """A plain per-token loop: scores, (groups), then k rounds of "best, lowest index"."""
    g = np.asarray(g, np.float64)
    M, E = g.shape
    W, I = np.zeros((M, topk)), np.zeros((M, topk), np.int64)
    for t in range(M):
        s = 1 / (1 + np.exp(-g[t])) if scoring == "sigmoid" else np.exp(g[t] - g[t].max())
        if scoring == "softmax":
            s = s / s.sum()
        sel = s + (0 if bias is None else np.asarray(bias, np.float64))
        allowed = list(range(E))
        if groups:
            n = E // groups
            gscore = []
            for q in range(groups):
                part = sorted(sel[q * n:(q + 1) * n], reverse=True)
                gscore.append(part[0] + part[1] if bias is not None else part[0])
            kept = []
            for _ in range(topk_group):
                best = max((q for q in range(groups) if q not in kept), key=lambda q: (gscore[q], -q))
                kept.append(best)
            allowed = [e for e in range(E) if e // n in kept]
        chosen = []
        for j in range(topk):
            e = max((e for e in allowed if e not in chosen), key=lambda e: (sel[e], -e))
            chosen.append(e)
        w = s[chosen]
        if renormalize:
            w = w / w.sum()
        W[t], I[t] = w * scale, chosen
    return W, I


def _act(g, act):
    if act == "silu":
        return g / (1 + np.exp(-g))
    from math import erf
    return 0.5 * g * (1 + np.vectorize(erf)(g / np.sqrt(2)))


def ref_experts(x, w1, w2, W, I, act="silu"):
    """For each token, for each chosen expert: w * down(act(gate x) * up x)."""
    x, w1, w2 = (np.asarray(a, np.float64) for a in (x, w1, w2))
    inter = w1.shape[1] // 2
    out = np.zeros(x.shape)
    for t in range(x.shape[0]):
        for j in range(I.shape[1]):
            e = int(I[t, j])
            if not 0 <= e < w1.shape[0]:
                continue
            gu = w1[e] @ x[t]
            out[t] += W[t, j] * (w2[e] @ (_act(gu[:inter], act) * gu[inter:]))
    return out


def _t(a, dtype, device):
    return nbx.tensor(np.asarray(a).astype(nbx.dtypes.as_dtype(dtype).np), device=device)


def _weights(g, E, H, inter):
    return (g.standard_normal((E, 2 * inter, H)) / np.sqrt(H),
            g.standard_normal((E, H, inter)) / np.sqrt(inter))


# ----------------------------------------------------------------------------- router top-k
@pytest.mark.parametrize("E,topk", [(3, 1), (7, 2), (9, 8)])
@pytest.mark.parametrize("scoring,renorm", [("softmax", True), ("softmax", False),
                                            ("sigmoid", True)])
def test_topk(device, E, topk, scoring, renorm):
    M = 37 if device == "cpu" else 11          # interp runs one program per row
    g = rng().standard_normal((M, E))
    w, ids = F.moe_topk(_t(g, nbx.float32, device), topk, renorm, scoring)
    assert w.dtype is nbx.float32 and ids.dtype is nbx.int32 and tuple(ids.shape) == (M, topk)
    rw, ri = ref_topk(g.astype(np.float32), topk, renorm, scoring)
    np.testing.assert_array_equal(ids.numpy(), ri)
    np.testing.assert_allclose(w.numpy(), rw, rtol=2e-6, atol=1e-7)


def test_topk_ties_take_the_lowest_index(device):
    g = np.array([[1.0, 3.0, 3.0, 0.5, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    w, ids = F.moe_topk(_t(g, nbx.float32, device), 3, renormalize=False)
    assert ids.numpy().tolist() == [[1, 2, 4], [0, 1, 2]]
    np.testing.assert_allclose(w.numpy()[1], [0.2] * 3, rtol=1e-6)


@pytest.mark.parametrize("bias,scoring", [(True, "sigmoid"), (False, "softmax")])
def test_grouped_topk(device, bias, scoring):
    g = rng()
    E, groups, tg, k = 16, 4, 2, 4
    gate = g.standard_normal((23, E))
    b = g.standard_normal(E) * 0.5 if bias else None
    w, ids = F.moe_topk(_t(gate, nbx.float32, device), k, True, scoring, groups, tg,
                        None if b is None else _t(b, nbx.float32, device), 2.5)
    rw, ri = ref_topk(gate.astype(np.float32), k, True, scoring, groups, tg,
                      None if b is None else b.astype(np.float32), 2.5)
    np.testing.assert_array_equal(ids.numpy(), ri)
    np.testing.assert_allclose(w.numpy(), rw, rtol=3e-6, atol=1e-7)
    # the groups matter: ungrouped selection differs for this input
    _, free = ref_topk(gate.astype(np.float32), k, True, scoring,
                       bias=None if b is None else b.astype(np.float32))
    assert (free != ri).any()


def test_topk_nan_scores_still_pick_valid_experts(device):
    g = np.array([[np.nan, 1.0, 2.0, 0.0], [np.nan] * 4])
    _, ids = F.moe_topk(_t(g, nbx.float32, device), 2, scoring="sigmoid")
    assert ids.numpy()[0].tolist() == [2, 1]
    assert ids.numpy()[1].tolist() == [0, 1]


# ----------------------------------------------------------------------------- align
def ref_align(ids, bs, E):
    flat = ids.reshape(-1)
    numel = flat.size
    n_sorted = numel + E * (bs - 1)
    s, blocks = [], []
    for e in range(E):
        mine = [i for i in range(numel) if flat[i] == e]
        pad = -len(mine) % bs
        s += mine + [numel] * pad
        blocks += [e] * ((len(mine) + pad) // bs)
    total = len(s)
    nb = -(-n_sorted // bs)
    return (np.array(s + [numel] * (n_sorted - total)), np.array(blocks + [-1] * (nb - len(blocks))),
            total)


@pytest.mark.parametrize("M,topk,E,bs", [(67, 2, 7, 16), (1, 8, 9, 4), (5, 1, 3, 64)])
def test_align_block_size(device, M, topk, E, bs):
    g = rng()
    ids = np.stack([g.permutation(E)[:topk] for _ in range(M)])
    ids[ids == 2] = 1          # expert 2 empty, expert 1 busier
    if M > 1:
        ids[0, 0] = -1         # dropped
    s, e, n = F.moe_align_block_size(_t(ids, nbx.int32, device), bs, E)
    rs, re, rn = ref_align(ids, bs, E)
    assert int(n.numpy()[0]) == rn and rn % bs == 0
    np.testing.assert_array_equal(s.numpy(), rs)
    np.testing.assert_array_equal(e.numpy(), re)


# ----------------------------------------------------------------------------- fused experts
CASES = {  # name: (M, E, H, I, topk)  -- M*topk <= 16 is the decode path on cuda/interp
    "decode_M1": (1, 7, 40, 33, 2),
    "decode_top8": (2, 9, 24, 16, 8),
    "grouped_M67": (67, 7, 40, 33, 2),
    "grouped_E3": (20, 3, 32, 24, 1),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16, nbx.float64])
def test_fused_moe(device, case, dtype):
    M, E, H, inter, topk = CASES[case]
    if dtype is nbx.float64 and device != "cpu":
        pytest.skip("float64 is cpu only")
    if dtype is nbx.bfloat16 and case not in ("decode_M1", "grouped_M67"):
        pytest.skip("one bf16 case per path")
    g = rng()
    x = g.standard_normal((M, H))
    w1, w2 = _weights(g, E, H, inter)
    gate = g.standard_normal((M, E))
    xs, w1s, w2s = (_t(a, dtype, device) for a in (x, w1, w2))
    out = F.fused_moe(xs, w1s, w2s, _t(gate, nbx.float32, device), topk, renormalize=True)
    assert out.dtype is dtype and tuple(out.shape) == (M, H)
    W, I = ref_topk(gate.astype(np.float32), topk)
    W = W.astype(np.float32)          # the router's weights are float32 (vLLM)
    cast = lambda a: np.asarray(a).astype(dtype.np).astype(np.float64)   # noqa: E731
    ref = ref_experts(cast(x), cast(w1), cast(w2), W, I)
    tol = {nbx.float32: 2e-5, nbx.bfloat16: 3e-2, nbx.float64: 1e-12}[dtype]
    np.testing.assert_allclose(out.numpy().astype(np.float64), ref, rtol=tol,
                               atol=tol * np.abs(ref).max())


@pytest.mark.parametrize("M,topk", [(1, 2), (30, 2)])
def test_fused_experts_all_to_one_and_empty_experts(device, M, topk):
    g = rng()
    E, H, inter = 9, 24, 33
    x = g.standard_normal((M, H))
    w1, w2 = _weights(g, E, H, inter)
    ids = np.zeros((M, topk), np.int32) + 4             # every slot to expert 4
    ids[:, 1] = 6 if M > 1 else 4
    ids[M // 2, 0] = -1                                 # a dropped slot (expert elsewhere)
    W = g.random((M, topk)) + 0.1
    out = F.fused_experts(_t(x, nbx.float32, device), _t(w1, nbx.float32, device),
                          _t(w2, nbx.float32, device), _t(W, nbx.float32, device),
                          _t(ids, nbx.int32, device))
    ref = ref_experts(x, w1, w2, W, ids)
    np.testing.assert_allclose(out.numpy(), ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


def test_fused_moe_gelu_no_renorm_sigmoid(device):
    g = rng()
    M, E, H, inter, topk = 19, 5, 16, 20, 2
    x = g.standard_normal((M, H))
    w1, w2 = _weights(g, E, H, inter)
    gate = g.standard_normal((M, E))
    out = F.fused_moe(_t(x, nbx.float32, device), _t(w1, nbx.float32, device),
                      _t(w2, nbx.float32, device), _t(gate, nbx.float32, device), topk,
                      renormalize=False, activation="gelu", scoring="sigmoid")
    W, I = ref_topk(gate.astype(np.float32), topk, False, "sigmoid")
    ref = ref_experts(x, w1, w2, W, I, "gelu")
    np.testing.assert_allclose(out.numpy(), ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


def test_fused_moe_shared_expert(device):
    g = rng()
    M, E, H, inter, Is, topk = 6, 4, 16, 12, 20, 2
    x = g.standard_normal((M, H))
    w1, w2 = _weights(g, E, H, inter)
    sw1 = g.standard_normal((2 * Is, H)) / 4
    sw2 = g.standard_normal((H, Is)) / 4
    sg = g.standard_normal((1, H))
    gate = g.standard_normal((M, E))
    T = lambda a: _t(a, nbx.float32, device)   # noqa: E731
    out = F.fused_moe(T(x), T(w1), T(w2), T(gate), topk, False, shared_w1=T(sw1),
                      shared_w2=T(sw2), shared_expert_gate=T(sg))
    W, I = ref_topk(gate, topk, False)
    gu = x @ sw1.T
    shared = (_act(gu[:, :Is], "silu") * gu[:, Is:]) @ sw2.T / (1 + np.exp(-(x @ sg.T)))
    ref = ref_experts(x, w1, w2, W, I) + shared
    np.testing.assert_allclose(out.numpy(), ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


def test_fused_moe_is_reproducible(device):
    g = rng()
    M, E, H, inter, topk = 40, 3, 32, 16, 2
    args = [_t(a, nbx.float32, device) for a in (g.standard_normal((M, H)),
                                                *_weights(g, E, H, inter),
                                                g.standard_normal((M, E)))]
    a = F.fused_moe(*args, topk).numpy()
    b = F.fused_moe(*args, topk).numpy()
    np.testing.assert_array_equal(a, b)


def test_refusals(device):
    g = rng()
    T = lambda a, dt=nbx.float32: _t(a, dt, device)   # noqa: E731
    x, w1, w2, gate = T(g.standard_normal((3, 8))), T(g.random((4, 10, 8))), \
        T(g.random((4, 8, 5))), T(g.random((3, 4)))
    with pytest.raises(ValueError, match="topk 5 exceeds the number of experts 4"):
        F.fused_moe(x, w1, w2, gate, 5)
    with pytest.raises(ValueError, match="w2 must have shape"):
        F.fused_moe(x, w1, T(g.random((4, 5, 8))), gate, 2)
    with pytest.raises(ValueError, match="w1 must have shape"):
        F.fused_moe(x, T(g.random((4, 9, 8))), w2, gate, 2)
    with pytest.raises(ValueError, match="gating_output must have shape"):
        F.fused_moe(x, w1, w2, T(g.random((3, 5))), 2)
    with pytest.raises(TypeError, match="w1 is bfloat16 but hidden_states is float32"):
        F.fused_moe(x, T(g.random((4, 10, 8)), nbx.bfloat16), w2, gate, 2)
    with pytest.raises(ValueError, match="activation must be"):
        F.fused_moe(x, w1, w2, gate, 2, activation="relu")
    with pytest.raises(ValueError, match="scoring must be"):
        F.moe_topk(gate, 2, scoring="tanh")
    with pytest.raises(ValueError, match="topk_group 3 exceeds num_expert_group 2"):
        F.moe_topk(gate, 2, num_expert_group=2, topk_group=3)
    with pytest.raises(ValueError, match="do not split"):
        F.moe_topk(gate, 2, num_expert_group=3, topk_group=1)
    with pytest.raises(TypeError, match="topk_ids must be int32 or int64"):
        F.fused_experts(x, w1, w2, T(g.random((3, 2))), T(g.random((3, 2))))
    with pytest.raises(TypeError, match="hidden_states must be a Tensor"):
        F.fused_moe(np.zeros((3, 8)), w1, w2, gate, 2)
    with pytest.raises(ValueError, match="shared_w1 and shared_w2 go together"):
        F.fused_moe(x, w1, w2, gate, 2, shared_w1=T(g.random((6, 8))))
    if device != "cpu":
        with pytest.raises(TypeError, match="float64"):
            F.fused_moe(T(g.random((3, 8)), nbx.float64), T(g.random((4, 10, 8)), nbx.float64),
                        T(g.random((4, 8, 5)), nbx.float64), gate, 2)


# ----------------------------------------------------------------------------- sm_90 compile
def _compile(kernel, sig, constexprs, div16=(), **opts):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = kernel.arg_names
    full = {n: ("constexpr" if n in constexprs else sig.get(n, "i32")) for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n.endswith("_ptr") or n in div16}
    src = ASTSource(fn=kernel, signature=full, attrs=attrs,
                    constexprs={(names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 64), options=opts)


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    """The grouped GEMM's tiles fit sm_90's 227 KiB of shared memory (16-bit ones on wgmma),
    and the router and decode kernels compile. Needs Triton's CUDA backend, no GPU."""
    pytest.importorskip("triton")
    from nbxtensor.kernels import moe as K
    for dt, item in (("bf16", 2), ("fp16", 2), ("fp32", 4)):
        BM, BN, BK, GM, nw, ns = K.GEMM_TILES[item]
        for glu in (True, False):
            c = "fp32" if not glu else dt
            k = _compile(K._moe_gemm_kernel,
                         {"a_ptr": "*" + dt, "b_ptr": "*" + dt, "c_ptr": "*" + c,
                          "w_ptr": "*fp32", "sorted_ptr": "*i32", "eids_ptr": "*i32",
                          "ntpp_ptr": "*i32"},
                         dict(GLU=glu, ACT=0, MUL_W=not glu, BLOCK_M=BM, BLOCK_N=BN,
                              BLOCK_K=BK, GROUP_M=GM, PRECISION="ieee", INTERP=False,
                              s_ak=1, s_bk=1), num_warps=nw, num_stages=ns,
                         # the launcher's specialisation of the real shapes' sizes and strides
                         div16=("N", "K", "s_am", "s_be", "s_bn", "s_cm"))
            assert k.metadata.shared <= 227 * 1024, (dt, glu, k.metadata.shared)
            ptx = k.asm["ptx"]
            assert "cp.async" in ptx, (dt, glu)          # the K loop is pipelined
            if item == 2:
                assert "wgmma" in ptx, (dt, glu)
    BN, BK, nw = K.GEMV_TILE
    for dt in ("bf16", "fp32"):
        _compile(K._moe_gemv_up_kernel, {"x_ptr": "*" + dt, "w_ptr": "*" + dt,
                                         "ids_ptr": "*i32", "h_ptr": "*" + dt},
                 dict(TOPK=8, ACT=1, BLOCK_N=BN, BLOCK_K=BK, INTERP=False, s_xk=1, s_wk=1),
                 num_warps=nw)
        _compile(K._moe_gemv_down_kernel, {"h_ptr": "*" + dt, "w_ptr": "*" + dt,
                                           "ids_ptr": "*i32", "tw_ptr": "*fp32",
                                           "o_ptr": "*" + dt},
                 dict(TOPK=8, BLOCK_N=BN, BLOCK_K=BK, s_wk=1), num_warps=nw)
    _compile(K._topk_kernel, {"g_ptr": "*fp32", "bias_ptr": "*fp32", "w_ptr": "*fp32",
                              "id_ptr": "*i32", "scale": "fp32"},
             dict(BLOCK_G=8, BLOCK_EG=32, BLOCK_K=8, SIGMOID=True, HAS_BIAS=True,
                  GROUPED=True, RENORM=True, s_ge=1), num_warps=1)
    for kern, ce in ((K._align_count_kernel, dict(BLOCK=1024)),
                     (K._align_scatter_kernel, dict(BLOCK=1024, BLOCK_E=128))):
        _compile(kern, {n: "*i32" for n in kern.arg_names if n.endswith("_ptr")}, ce,
                 num_warps=4)


# ----------------------------------------------------------------------------- MoE models
_BASE = {"vocab_size": 61, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
         "max_position_embeddings": 128, "eos_token_id": 1, "tie_word_embeddings": False}
ARCHS = {
    "mixtral": {**_BASE, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                "intermediate_size": 40, "num_local_experts": 5, "num_experts_per_tok": 2},
    "qwen2_moe": {**_BASE, "model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"],
                  "intermediate_size": 48, "moe_intermediate_size": 24, "num_experts": 6,
                  "num_experts_per_tok": 2, "norm_topk_prob": False,
                  "shared_expert_intermediate_size": 40, "decoder_sparse_step": 1,
                  "mlp_only_layers": [1]},
    "qwen3_moe": {**_BASE, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
                  "intermediate_size": 48, "moe_intermediate_size": 24, "num_experts": 8,
                  "num_experts_per_tok": 3, "norm_topk_prob": True, "head_dim": 24,
                  "tie_word_embeddings": True},
    "olmoe": {**_BASE, "model_type": "olmoe", "architectures": ["OlmoeForCausalLM"],
              "intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
              "norm_topk_prob": False},
}


def _moe_names(mt):
    if mt == "mixtral":
        return "block_sparse_moe.", ("w1", "w3", "w2")
    return "mlp.", ("gate_proj", "up_proj", "down_proj")


def _sparse(cfg, i):
    if cfg["model_type"] in ("qwen2_moe", "qwen3_moe"):
        return i not in cfg.get("mlp_only_layers", []) and (i + 1) % cfg.get(
            "decoder_sparse_step", 1) == 0
    return True


def _random_weights(g, cfg):
    mt = cfg["model_type"]
    D, V = cfg["hidden_size"], cfg["vocab_size"]
    Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", D // Hq)
    E = cfg.get("num_local_experts", cfg.get("num_experts"))
    I = cfg.get("moe_intermediate_size", cfg["intermediate_size"])
    n = lambda *s: g.standard_normal(s) / np.sqrt(s[-1])   # noqa: E731
    w = {"model.embed_tokens.weight": g.standard_normal((V, D)),
         "model.norm.weight": 1 + 0.1 * g.standard_normal(D)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = n(V, D)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * g.standard_normal(D)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * g.standard_normal(D)
        for nm, rows in (("q", Hq * hd), ("k", Hkv * hd), ("v", Hkv * hd)):
            w[p + f"self_attn.{nm}_proj.weight"] = n(rows, D)
            if mt == "qwen2_moe":
                w[p + f"self_attn.{nm}_proj.bias"] = 0.1 * g.standard_normal(rows)
        w[p + "self_attn.o_proj.weight"] = n(D, Hq * hd)
        if mt == "qwen3_moe":
            w[p + "self_attn.q_norm.weight"] = 1 + 0.2 * g.standard_normal(hd)
            w[p + "self_attn.k_norm.weight"] = 1 + 0.2 * g.standard_normal(hd)
        if mt == "olmoe":
            w[p + "self_attn.q_norm.weight"] = 1 + 0.2 * g.standard_normal(Hq * hd)
            w[p + "self_attn.k_norm.weight"] = 1 + 0.2 * g.standard_normal(Hkv * hd)
        if not _sparse(cfg, i):
            Fd = cfg["intermediate_size"]
            w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = n(Fd, D), n(Fd, D)
            w[p + "mlp.down_proj.weight"] = n(D, Fd)
            continue
        q, (gn, un, dn) = _moe_names(mt)
        w[p + q + "gate.weight"] = g.standard_normal((E, D))
        for j in range(E):
            w[p + q + f"experts.{j}.{gn}.weight"] = n(I, D)
            w[p + q + f"experts.{j}.{un}.weight"] = n(I, D)
            w[p + q + f"experts.{j}.{dn}.weight"] = n(D, I)
        if mt == "qwen2_moe":
            Is = cfg["shared_expert_intermediate_size"]
            s = p + "mlp.shared_expert."
            w[s + "gate_proj.weight"], w[s + "up_proj.weight"] = n(Is, D), n(Is, D)
            w[s + "down_proj.weight"] = n(D, Is)
            w[p + "mlp.shared_expert_gate.weight"] = n(1, D)
    return {k: v.astype(np.float32) for k, v in w.items()}


class RefMoe:
    """The four architectures in float64 NumPy, straight from their HF definitions."""

    def __init__(self, cfg, w):
        self.c, self.w = cfg, {k: v.astype(np.float64) for k, v in w.items()}

    def rms(self, x, g):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + self.c["rms_norm_eps"]) * g

    def moe(self, p, h):
        c, w, mt = self.c, self.w, self.c["model_type"]
        q, (gn, un, dn) = _moe_names(mt)
        k = c["num_experts_per_tok"]
        logits = h @ w[p + q + "gate.weight"].T
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            pr = np.exp(logits[t] - logits[t].max())
            pr /= pr.sum()
            top = np.argsort(-pr, kind="stable")[:k]
            wt = pr[top]
            if mt == "mixtral" or c.get("norm_topk_prob"):
                wt = wt / wt.sum()
            for e, we in zip(top, wt):
                pe = p + q + f"experts.{e}."
                a = h[t] @ w[pe + gn + ".weight"].T
                b = h[t] @ w[pe + un + ".weight"].T
                out[t] += we * ((a / (1 + np.exp(-a)) * b) @ w[pe + dn + ".weight"].T)
        if mt == "qwen2_moe":
            s = p + "mlp.shared_expert."
            a, b = h @ w[s + "gate_proj.weight"].T, h @ w[s + "up_proj.weight"].T
            y = (a / (1 + np.exp(-a)) * b) @ w[s + "down_proj.weight"].T
            out += y / (1 + np.exp(-(h @ w[p + "mlp.shared_expert_gate.weight"].T)))
        return out

    def dense(self, p, h):
        w = self.w
        a, b = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        return (a / (1 + np.exp(-a)) * b) @ w[p + "mlp.down_proj.weight"].T

    def logits(self, ids):
        c, w, mt = self.c, self.w, self.c["model_type"]
        Hq, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
        hd = c.get("head_dim", c["hidden_size"] // Hq)
        T = len(ids)
        inv = 1 / c["rope_theta"] ** (np.arange(0, hd, 2) / hd)
        ang = np.arange(T)[:, None] * inv[None]
        cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

        def rope(x):      # (T, H, hd), HF rotate_half
            r = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
            return x * cos[:, None] + r * sin[:, None]
        x = w["model.embed_tokens.weight"][ids]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = self.rms(x, w[p + "input_layernorm.weight"])
            proj = {}
            for n in "qkv":
                proj[n] = h @ w[p + f"self_attn.{n}_proj.weight"].T + w.get(
                    p + f"self_attn.{n}_proj.bias", 0)
            if mt == "olmoe":
                proj["q"] = self.rms(proj["q"], w[p + "self_attn.q_norm.weight"])
                proj["k"] = self.rms(proj["k"], w[p + "self_attn.k_norm.weight"])
            q = proj["q"].reshape(T, Hq, hd)
            k = proj["k"].reshape(T, Hkv, hd)
            v = proj["v"].reshape(T, Hkv, hd)
            if mt == "qwen3_moe":
                q = self.rms(q, w[p + "self_attn.q_norm.weight"])
                k = self.rms(k, w[p + "self_attn.k_norm.weight"])
            q, k = rope(q), rope(k)
            att = np.zeros((T, Hq, hd))
            for hh in range(Hq):
                kv = hh // (Hq // Hkv)
                s = q[:, hh] @ k[:, kv].T / np.sqrt(hd)
                s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
                pr = np.exp(s - s.max(1, keepdims=True))
                att[:, hh] = (pr / pr.sum(1, keepdims=True)) @ v[:, kv]
            x = x + att.reshape(T, Hq * hd) @ w[p + "self_attn.o_proj.weight"].T
            h = self.rms(x, w[p + "post_attention_layernorm.weight"])
            x = x + (self.moe(p, h) if _sparse(c, i) else self.dense(p, h))
        x = self.rms(x, w["model.norm.weight"])
        return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def _write_folder(d, cfg, w):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from nbxtensor.io.safetensors import save_file
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    names = sorted(w)          # two shards: the loader reads sharded folders
    half = len(names) // 2
    save_file({k: w[k] for k in names[:half]}, d / "model-00001-of-00002.safetensors")
    save_file({k: w[k] for k in names[half:]}, d / "model-00002-of-00002.safetensors")
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(cfg["vocab_size"])},
                                    unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(d / "tokenizer.json"))


@pytest.fixture(scope="module")
def moe_folders(tmp_path_factory):
    pytest.importorskip("tokenizers")
    root = tmp_path_factory.mktemp("moe")
    g = rng()
    out = {}
    for mt, cfg in ARCHS.items():
        w = _random_weights(g, cfg)
        _write_folder(root / mt, cfg, w)
        out[mt] = (root / mt, cfg, w)
    return out


PROMPT = [5, 17, 3, 42, 8, 60, 11]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_moe_model_logits(moe_folders, arch, device):
    if device != "cpu" and arch not in ("qwen2_moe", "olmoe"):
        pytest.skip("interp: two architectures (shared expert and dense layer; whole-projection "
                    "q/k norms) keep the run short")
    from nbxtensor.models import load_model, resolve
    from nbxtensor.models.moe import MoeModel
    folder, cfg, w = moe_folders[arch]
    assert resolve(str(folder))[0] == "moe-folder"
    m = load_model(str(folder), device=device, dtype=nbx.float32)
    assert isinstance(m, MoeModel)
    ref = RefMoe(cfg, w).logits(PROMPT)
    cache = m.new_cache(32)
    got = m.forward(PROMPT[:-1], cache, all_logits=True).numpy()
    last = m.forward(PROMPT[-1:], cache).numpy()       # one decode step (M = 1)
    scale = np.abs(ref).max()
    np.testing.assert_allclose(got, ref[:-1], rtol=1e-4, atol=1e-4 * scale)
    np.testing.assert_allclose(last, ref[-1], rtol=1e-4, atol=1e-4 * scale)


def test_moe_model_device_step(moe_folders, device):
    """prefill / decode_step (the step the cuda generate loop captures) on qwen2_moe."""
    if device == "interp":
        pytest.skip("the device step's kernels are the same as forward's; cpu and cuda run it")
    from nbxtensor.models.moe import MoeModel
    folder, cfg, w = moe_folders["qwen2_moe"]
    m = MoeModel.from_folder(str(folder), device=device, dtype=nbx.float32)
    ref = RefMoe(cfg, w).logits(PROMPT)
    cache = m.new_kv_cache(1, 16)
    T = len(PROMPT) - 1
    toks = nbx.tensor(np.array([PROMPT[:-1]]), device=device)
    pos = nbx.tensor(np.arange(T, dtype=np.int32)[None], device=device)
    a = m.prefill(toks, pos, cache).numpy()[0]
    b = m.decode_step(nbx.tensor(np.array([[PROMPT[-1]]]), device=device),
                      nbx.tensor(np.array([[T]], np.int32), device=device), cache).numpy()[0]
    scale = np.abs(ref).max()
    np.testing.assert_allclose(a, ref[T - 1], rtol=1e-4, atol=1e-4 * scale)
    np.testing.assert_allclose(b, ref[T], rtol=1e-4, atol=1e-4 * scale)


def test_moe_config_by_architectures_and_refusals(tmp_path):
    from nbxtensor.models.moe import MoeConfig
    cfg = {**ARCHS["olmoe"]}
    del cfg["model_type"]
    c = MoeConfig.from_hf(cfg)
    assert c.model_type == "olmoe" and c.qk_norm == "full" and c.norm_topk_prob is False
    c = MoeConfig.from_hf(ARCHS["qwen2_moe"])
    assert c.sparse_layers == [0] and c.attention_bias
    with pytest.raises(ValueError, match="use_sliding_window"):
        MoeConfig.from_hf({**ARCHS["qwen3_moe"], "use_sliding_window": True})
    with pytest.raises(ValueError, match="num_experts_per_tok 9 exceeds"):
        MoeConfig.from_hf({**ARCHS["qwen3_moe"], "num_experts_per_tok": 9})
    with pytest.raises(ValueError, match="missing key 'num_local_experts'"):
        MoeConfig.from_hf({k: v for k, v in ARCHS["mixtral"].items() if k != "num_local_experts"})


def test_nbx_generate_moe_folder(moe_folders, capsys):
    from nbxtensor.cli import main
    folder = moe_folders["mixtral"][0]
    assert main(["generate", str(folder), "--prompt", "t5 t17 t3", "--max-new-tokens", "3",
                 "--device", "cpu", "--no-chat", "--temperature", "0"]) == 0
    err = capsys.readouterr().err
    assert "mixtral, 2 layers" in err
