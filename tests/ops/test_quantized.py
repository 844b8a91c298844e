"""Quantised weights: GGUF K-quants (Q4_K / Q5_K / Q6_K) and int4 GPTQ / AWQ.

* K-quants: backends/cpu/ggml_blocks.py's NumPy dequantisation bit-exact against the `gguf` package's
  reference dequantisers on random blocks (extreme and subnormal fp16 scales, all-zero
  blocks); the device GEMV (kernels/quant.py) against the float64 product of the dequantised
  weight at M = 1 and small M with odd N and forced K/N tails, and the dequantise-then-GEMM
  prefill path.
* int4: pack/unpack round trips of layouts written here from the formats' definitions;
  QuantizedTensor.dequantize bit-exact against those references (cpu, interp); linear with
  a QuantizedTensor vs float64 (GEMV and prefill, bias, g_idx / desc_act, tails); a tiny
  GPTQ and AWQ HF folder through LlamaModel.from_folder; sm_90 compiles of the kernels.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import nbxtensor as nbx
import nbxtensor.nn.functional as F

from helpers import H200, rng


# ============================================================================ K-quants
KQ = ["Q4_K", "Q5_K", "Q6_K"]


def _f16_extremes(g, n):
    """fp16 scale bit patterns: ordinary, the largest finite, subnormal, zero, negative."""
    pool = np.array([0x3C00, 0x7BFF, 0x0001, 0x03FF, 0x0000, 0x8000, 0xFBFF, 0x1400],
                    np.uint16)
    bits = np.where(g.random(n) < 0.4, g.choice(pool, n),
                    np.float16(g.standard_normal(n) * 0.05).view(np.uint16))
    finite = np.isfinite(bits.view(np.float16))
    bits[~finite] = 0x3C00
    return bits.view(np.uint8).reshape(n, 2)


def _kblocks(g, qtype, nb):
    from nbxtensor.backends.cpu.ggml_blocks import BLOCK_SIZES
    _, ts = BLOCK_SIZES[qtype]
    raw = g.integers(0, 256, (nb, ts), dtype=np.uint8)
    if qtype == "Q6_K":
        raw[:, 208:210] = _f16_extremes(g, nb)
    else:
        raw[:, 0:2], raw[:, 2:4] = _f16_extremes(g, nb), _f16_extremes(g, nb)
    raw[0] = 0                                        # an all-zero block
    raw[1, :] = 255                                   # all bits set (scales then refixed)
    if qtype == "Q6_K":
        raw[1, 208:210] = [0xFF, 0x7B]
    else:
        raw[1, 0:4] = [0xFF, 0x7B, 0xFF, 0x7B]
    return raw


@pytest.mark.parametrize("qtype", KQ)
def test_kquant_numpy_bit_exact_against_gguf(qtype):
    gguf_quants = pytest.importorskip("gguf.quants")
    import gguf
    from nbxtensor.backends.cpu.ggml_blocks import dequantize
    g = rng(11)
    nb = 64
    raw = _kblocks(g, qtype, nb)
    ref = gguf_quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, qtype)).reshape(nb, 256)
    ours = dequantize(raw, qtype, (nb, 256))
    assert np.isfinite(ref).all()
    np.testing.assert_array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32))
    # through a (rows, K) tensor of 4 blocks a row, too
    ours2 = dequantize(raw, qtype, (16, 1024))
    np.testing.assert_array_equal(ours2.reshape(nb, 256), ours)


def _kweight(g, qtype, N, K, device):
    from nbxtensor.backends.cpu.ggml_blocks import dequantize
    from nbxtensor.models._ops import QuantWeight
    nb = N * K // 256
    raw = _kblocks(g, qtype, nb)
    # moderate scales for the GEMV (the extremes are for the bit test above)
    if qtype == "Q6_K":
        raw[:, 208:210] = np.float16(g.uniform(0.001, 0.02, nb)).view(np.uint8).reshape(nb, 2)
    else:
        raw[:, 0:2] = np.float16(g.uniform(0.001, 0.02, nb)).view(np.uint8).reshape(nb, 2)
        raw[:, 2:4] = np.float16(g.uniform(0.001, 0.02, nb)).view(np.uint8).reshape(nb, 2)
    raw = raw.reshape(N, -1)
    w = QuantWeight(nbx.tensor(raw, device=device), qtype, (N, K))
    return w, dequantize(raw, qtype, (N, K)).astype(np.float64)


@pytest.mark.parametrize("qtype", KQ)
@pytest.mark.parametrize("M", [1, 3, 12])
def test_kquant_gemv_vs_float64(device, qtype, M):
    if device == "cpu":
        pytest.skip("the device GEMV (cpu dequantises at load)")
    from nbxtensor.kernels.quant import quant_linear
    g = rng(12)
    N, K = 37, 512                                    # odd N; K two blocks a row
    w, wd = _kweight(g, qtype, N, K, device)
    x = g.standard_normal((M, K)).astype(np.float32)
    b = g.standard_normal(N).astype(np.float32)
    kw = dict(block_n=16, block_k=128) if M <= 8 else {}   # N, K tails of the GEMV
    y = quant_linear(nbx.tensor(x, device=device), w, nbx.tensor(b, device=device), **kw)
    ref = x.astype(np.float64) @ wd.T + b
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("qtype", KQ)
@pytest.mark.parametrize("cfg", [dict(BLOCK_N=32, BLOCK_S=4, num_warps=8),
                                 dict(BLOCK_N=16, BLOCK_S=2, num_warps=4),
                                 dict(BLOCK_N=16, BLOCK_S=4, num_warps=2),
                                 dict(BLOCK_N=64, BLOCK_S=4, num_warps=8)])
def test_kquant_packed_tiles_vs_float64(qtype, cfg):
    """The packed K-quant GEMVs with the GPU's tiles on interp (Q6_K: its uint16-pair
    kernel, PACKED): 3 super-blocks a row (a tail step for BLOCK_S 2 and 4), N overhanging
    BLOCK_N, bias, M = 2, bf16 x, fp32 logits."""
    if qtype == "Q6_K":
        cfg = dict(cfg, PACKED=True)
    from nbxtensor.kernels.quant import quant_linear
    g = rng(13)
    N, K = 45, 768
    w, wd = _kweight(g, qtype, N, K, "interp")
    x = g.standard_normal((2, K)).astype(np.float32)
    b = g.standard_normal(N).astype(np.float32)
    y = quant_linear(nbx.tensor(x, device="interp"), w, nbx.tensor(b, device="interp"),
                     config=cfg)
    ref = x.astype(np.float64) @ wd.T + b
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    xb = nbx.tensor(x, device="interp").to(nbx.bfloat16)
    yb = quant_linear(xb, w, config=cfg).numpy().astype(np.float64)
    refb = xb.to(nbx.float32).numpy().astype(np.float64) @ wd.T
    np.testing.assert_allclose(yb, refb, rtol=1e-2, atol=1e-2 * np.abs(refb).max())


# ============================================================================ int4 references
# The layouts, from the formats' definitions (independent of ops/quantized.py)
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]        # nibble i of a word holds column 8c + AWQ_ORDER[i]


def pack_gptq_qweight(q):                   # q (K, N) in 0..15 -> int32 (K/8, N), along K
    K, N = q.shape
    out = np.zeros((K // 8, N), np.uint32)
    for i in range(8):
        out |= q[i::8].astype(np.uint32) << (4 * i)
    return out.view(np.int32)


def pack_cols(z, order=None):               # (R, N) -> int32 (R, N/8), along N
    R, N = z.shape
    out = np.zeros((R, N // 8), np.uint32)
    for i in range(8):
        col = i if order is None else order[i]
        out |= z[:, col::8].astype(np.uint32) << (4 * i)
    return out.view(np.int32)


def unpack_gptq_qweight(w):
    u = w.view(np.uint32)
    K8, N = u.shape
    q = np.zeros((K8 * 8, N), np.int64)
    for k in range(K8 * 8):
        q[k] = (u[k // 8] >> (4 * (k % 8))) & 15
    return q


def unpack_cols(w, order=None):
    u = w.view(np.uint32)
    R, N8 = u.shape
    z = np.zeros((R, N8 * 8), np.int64)
    for i in range(8):
        col = i if order is None else order[i]
        z[:, col::8] = (u >> (4 * i)) & 15
    return z


def ref_dequant(fmt, q, z, s, g_idx, group):
    """W (K, N) float32 = s[G] * (q - z'[G]), z' = z + 1 for GPTQ (its checkpoints store the
    zero minus one), G = g_idx or k // group."""
    K = q.shape[0]
    G = np.asarray(g_idx) if g_idx is not None else np.arange(K) // group
    zz = z + 1 if fmt == "gptq" else z
    return (s.astype(np.float32)[G] * (q - zz[G]).astype(np.float32)).astype(np.float32)


def _int4(g, fmt, K, N, group, desc_act=False, device="cpu"):
    q = g.integers(0, 16, (K, N))
    q[:, 0] = 15
    q[0, :] = 0
    z = g.integers(0, 16, (K // group, N))
    if fmt == "gptq":
        z = np.minimum(z, 14)                 # stored zero + 1 stays a 4-bit value's range
    s = np.float16(g.uniform(0.002, 0.05, (K // group, N)) * g.choice([-1, 1], (K // group, N)))
    g_idx = g.permutation(np.arange(K) // group).astype(np.int32) if desc_act else None
    qw = pack_gptq_qweight(q) if fmt == "gptq" else pack_cols(q, AWQ_ORDER)
    qz = pack_cols(z) if fmt == "gptq" else pack_cols(z, AWQ_ORDER)
    T = lambda a: nbx.tensor(a, device=device)   # noqa: E731
    qt = nbx.QuantizedTensor(T(qw), T(s), T(qz), group_size=group, format=fmt,
                             g_idx=None if g_idx is None else T(g_idx))
    return qt, (q, z, s, g_idx, qw, qz)


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_int4_pack_unpack_round_trip(fmt):
    g = rng(20)
    q = g.integers(0, 16, (256, 64))
    if fmt == "gptq":
        assert np.array_equal(unpack_gptq_qweight(pack_gptq_qweight(q)), q)
        assert np.array_equal(unpack_cols(pack_cols(q)), q)
    else:
        w = pack_cols(q, AWQ_ORDER)
        assert np.array_equal(unpack_cols(w, AWQ_ORDER), q)
        # the interleave: column 1 of each 8 sits in nibble 4, column 4 in nibble 2
        assert ((w.view(np.uint32)[:, 0] >> 16) & 15 == q[:, 1]).all()
        assert ((w.view(np.uint32)[:, 0] >> 8) & 15 == q[:, 4]).all()


@pytest.mark.parametrize("fmt,desc_act", [("gptq", False), ("gptq", True), ("awq", False)])
def test_int4_dequantize_bit_exact(device, fmt, desc_act):
    g = rng(21)
    K, N, group = 256, 72, 128
    qt, (q, z, s, gi, *_) = _int4(g, fmt, K, N, group, desc_act, device)
    assert (qt.g_idx is not None) == desc_act
    ref = ref_dequant(fmt, q, z, s, gi, group)
    d32 = qt.dequantize(nbx.float32).numpy()
    np.testing.assert_array_equal(d32.view(np.uint32), ref.T.copy().view(np.uint32))
    d16 = qt.dequantize().numpy()                       # the scales' dtype: fp16
    assert d16.dtype == np.float16
    np.testing.assert_array_equal(d16.view(np.uint16), ref.T.astype(np.float16).view(np.uint16))
    assert qt.shape == (N, K) and qt.to("cpu").device.type == "cpu"


@pytest.mark.parametrize("fmt,desc_act", [("gptq", False), ("gptq", True), ("awq", False)])
@pytest.mark.parametrize("M,split", [(1, None), (1, 3), (3, 2), (12, None)])
def test_int4_linear_vs_float64(device, fmt, desc_act, M, split):
    g = rng(22 + M)
    K, N, group = 256, 40, 64                  # N overhangs block_n = 32; 4 groups
    qt, (q, z, s, gi, *_) = _int4(g, fmt, K, N, group, desc_act, device)
    W = ref_dequant(fmt, q, z, s, gi, group).astype(np.float64)
    xb = g.standard_normal((M, 2 * K)).astype(np.float32)
    x = nbx.tensor(xb, device=device)[:, ::2]         # non-contiguous along K
    b = g.standard_normal(N).astype(np.float32)
    kw = {"block_n": 32, "split_k": split} if device != "cpu" and M <= 8 else {}
    from nbxtensor.ops.quantized import linear as qlinear
    y = qlinear(x, qt, nbx.tensor(b, device=device), **kw) if kw else \
        F.linear(x, qt, nbx.tensor(b, device=device))
    ref = xb[:, ::2].astype(np.float64) @ W + b
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert nbx.linear(x, qt).shape == (M, N)


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
@pytest.mark.parametrize("cfg,split", [
    (dict(BLOCK_N=512, BLOCK_K=32, num_warps=2), 3),      # slices of whole groups
    (dict(BLOCK_N=1024, BLOCK_K=16, num_warps=1), 16),    # slices inside one group
    (dict(BLOCK_N=256, BLOCK_K=64, num_warps=1), 1),
    (dict(BLOCK_N=64, BLOCK_K=8, num_warps=4), 64),
    (dict(BLOCK_N=256, BLOCK_K=64, num_warps=4, FLAT=True), 3),   # the flat loop
    (dict(BLOCK_N=128, BLOCK_K=16, num_warps=4, FLAT=True), 64)])
def test_int4_packed_configs_vs_float64(fmt, cfg, split):
    """The packed GEMVs with the GPU's tiles on interp (a column's rows in one thread),
    split-K merged by the last program of each column block: N overhanging BLOCK_N, bias,
    M = 3, into a NaN-poisoned output; a second call gives the same bits (the ticket
    counters reset)."""
    from helpers import poisoned
    from nbxtensor.kernels.int4 import int4_gemv
    g = rng(24)
    K, N, group = 512, 72, 128
    qt, (q, z, s, gi, *_) = _int4(g, fmt, K, N, group, False, "interp")
    W = ref_dequant(fmt, q, z, s, gi, group).astype(np.float64)
    x = g.standard_normal((3, K)).astype(np.float32)
    b = g.standard_normal(N).astype(np.float32)
    X, B = nbx.tensor(x, device="interp"), nbx.tensor(b, device="interp")
    y = poisoned((3, N), nbx.float32, "interp")
    int4_gemv(X, qt, B, y, split=split, config=cfg)
    ref = x.astype(np.float64) @ W + b
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    y2 = poisoned((3, N), nbx.float32, "interp")
    int4_gemv(X, qt, B, y2, split=split, config=cfg)
    np.testing.assert_array_equal(y2.numpy().view(np.uint32), y.numpy().view(np.uint32))


def test_int4_refusals(device):
    g = rng(23)
    qt, (q, z, s, gi, qw, qz) = _int4(g, "gptq", 256, 16, 128, device=device)
    T = lambda a: nbx.tensor(a, device=device)   # noqa: E731
    with pytest.raises(ValueError, match="bits=4"):
        nbx.QuantizedTensor(T(qw), T(s), T(qz), bits=8)
    with pytest.raises(ValueError, match="qzeros must have shape"):
        nbx.QuantizedTensor(T(qw), T(s), T(qz[:1]))
    with pytest.raises(TypeError, match="scales must be"):
        nbx.QuantizedTensor(T(qw), T(s.astype(np.int32)), T(qz))
    with pytest.raises(IndexError, match="g_idx"):
        nbx.QuantizedTensor(T(qw), T(s), T(qz), g_idx=T(np.full(256, 2, np.int32)))
    with pytest.raises(ValueError, match="features"):
        F.linear(nbx.zeros(1, 128, device=device), qt)
    with pytest.raises(ValueError, match="not supported with a QuantizedTensor"):
        F.linear(nbx.zeros(1, 256, device=device), qt, activation="silu")


# ============================================================================ HF folders
def _quant_folder(d, fmt, g, desc_act=False):
    """A one-layer Llama folder whose seven projections are int4 (fmt), with the float
    reference weights returned (the dequantised W^T of each)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from nbxtensor.io.safetensors import save_file
    V, D, F_, HQ, HKV, HD, group = 32, 128, 256, 4, 2, 32, 64
    cfg = {"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F_,
           "num_hidden_layers": 1, "num_attention_heads": HQ, "num_key_value_heads": HKV,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
           "max_position_embeddings": 64, "eos_token_id": 0,
           "quantization_config": {"quant_method": fmt, "bits": 4, "group_size": group,
                                   "desc_act": desc_act, "sym": True}}
    if fmt == "awq":
        cfg["quantization_config"]["version"] = "gemm"
    (d / "config.json").write_text(json.dumps(cfg))
    p = "model.layers.0."
    w = {"model.embed_tokens.weight": g.standard_normal((V, D)).astype(np.float32),
         "model.norm.weight": 1 + 0.1 * g.standard_normal(D).astype(np.float32),
         p + "input_layernorm.weight": 1 + 0.1 * g.standard_normal(D).astype(np.float32),
         p + "post_attention_layernorm.weight": 1 + 0.1 * g.standard_normal(D).astype(np.float32)}
    ref = dict(w)
    for name, (out_f, in_f) in {"self_attn.q_proj": (HQ * HD, D), "self_attn.k_proj": (HKV * HD, D),
                                "self_attn.v_proj": (HKV * HD, D), "self_attn.o_proj": (D, HQ * HD),
                                "mlp.gate_proj": (F_, D), "mlp.up_proj": (F_, D),
                                "mlp.down_proj": (D, F_)}.items():
        _, (q, z, s, gi, qw, qz) = _int4(g, fmt, in_f, out_f, group, desc_act)
        w[p + name + ".qweight"], w[p + name + ".qzeros"], w[p + name + ".scales"] = qw, qz, s
        if fmt == "gptq":
            w[p + name + ".g_idx"] = gi if gi is not None else (np.arange(in_f) // group).astype(np.int32)
        ref[p + name + ".weight"] = ref_dequant(fmt, q, z, s, gi, group).T.copy()
    save_file(w, d / "model.safetensors")
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t1"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(d / "tokenizer.json"))
    (d / "ref").mkdir()
    save_file(ref, d / "ref" / "model.safetensors")
    (d / "ref" / "config.json").write_text(json.dumps({k: v for k, v in cfg.items()
                                                       if k != "quantization_config"}))
    tk.save(str(d / "ref" / "tokenizer.json"))
    return d


@pytest.mark.parametrize("fmt,desc_act", [("gptq", False), ("gptq", True), ("awq", False)])
def test_int4_folder_loads_in_llama(tmp_path, device, fmt, desc_act):
    from nbxtensor.models import LlamaModel
    d = _quant_folder(tmp_path, fmt, rng(30), desc_act)
    m = LlamaModel.from_folder(str(d), device=device, dtype=nbx.float32)
    L = m.w["layers"][0]
    assert isinstance(L["wq"], nbx.QuantizedTensor) and L["wq"].format == fmt
    assert (L["wq"].g_idx is not None) == desc_act
    ref = LlamaModel.from_folder(str(d / "ref"), device="cpu", dtype=nbx.float32)
    ids = [3, 7, 1, 30, 2]
    got = m.forward(ids, m.new_cache(16), all_logits=True).numpy()
    want = ref.forward(ids, ref.new_cache(16), all_logits=True).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_int4_folder_refusals(tmp_path):
    from nbxtensor.models import LlamaModel
    d = _quant_folder(tmp_path, "gptq", rng(31))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["bits"] = 8
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="only 4"):
        LlamaModel.from_folder(str(d))
    cfg["quantization_config"].update(bits=4, checkpoint_format="gptq_v2")
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="checkpoint_format"):
        LlamaModel.from_folder(str(d))


# ============================================================================ sm_90 compile
@pytest.mark.slow
def test_int4_kernels_compile_for_sm90():
    pytest.importorskip("triton")
    import sys
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_moe import _compile
    from test_quant_gpu import _ptxas_stats
    from nbxtensor.kernels import int4 as K4
    for fmt, gidx in ((0, False), (0, True), (1, False)):
            cfg = K4.gemv_config(14336, 4096, 128, H200, gidx, ("gptq", "awq")[fmt])
            if gidx:
                k = _compile(K4._int4_gemv_kernel,
                             {"x_ptr": "*bf16", "qw_ptr": "*i32", "qz_ptr": "*i32",
                              "s_ptr": "*fp16", "gi_ptr": "*i32", "b_ptr": "*bf16",
                              "y_ptr": "*bf16"},
                             dict(FMT=fmt, HAS_GIDX=gidx, HAS_BIAS=False, BLOCK_N=64,
                                  BLOCK_K=cfg["BLOCK_K"], s_xk=1), num_warps=4)
                st = _ptxas_stats(k.asm["ptx"])
                assert st is None or st[1] == 0, (fmt, gidx, st)          # no spills
            else:
                for split in (True, False):
                    k = _compile(K4._gptq_gemv_packed if fmt == 0 else K4._awq_gemv_packed,
                                 {"x_ptr": "*bf16", "qw_ptr": "*i32", "qz_ptr": "*i32",
                                  "s_ptr": "*fp16", "b_ptr": "*bf16", "y_ptr": "*bf16",
                                  "ws_ptr": "*fp32", "cnt_ptr": "*i32"},
                                 dict(HAS_BIAS=not split, SPLIT=split, BLOCK_N=cfg["BLOCK_N"],
                                      BLOCK_K=cfg["BLOCK_K"], s_xk=1),
                                 div16=("N", "N8", "K", "group", "gstep", "k_split", "s_xm",
                                        "s_ym"), num_warps=cfg["num_warps"])
                    st = _ptxas_stats(k.asm["ptx"])
                    assert st is None or st[1] == 0, (fmt, split, st)     # no spills
            _compile(K4._int4_dequant_kernel,
                     {"qw_ptr": "*i32", "qz_ptr": "*i32", "s_ptr": "*fp16", "gi_ptr": "*i32",
                      "y_ptr": "*bf16"},
                     dict(FMT=fmt, HAS_GIDX=gidx, BLOCK_K=32, BLOCK_N=64, s_yn=1), num_warps=4)
