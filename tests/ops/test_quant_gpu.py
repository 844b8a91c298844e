"""Device dequantisation kernels (kernels/quant.py: `dequantize`, `dequantize_rows`) for every
GGUF format we read -- Q8_0, Q4_1, Q4_0, Q4_K, Q5_K, Q6_K, F32, F16, BF16 -- against the host
reference (nbxtensor.backends.cpu.ggml_blocks) and the `gguf` package, bit for bit; and the GGUF loader's
device-side dequantisation at load. interp in CI, cuda on the GPU machine; plus an sm_90
compile check of every kernel variant (shared memory, registers, spills) that needs no GPU.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import ml_dtypes
import numpy as np
import pytest

import nbxtensor as nbx
from helpers import poisoned, rng
from nbxtensor.backends.cpu import ggml_blocks as Q

BLOCK_QTYPES = ["Q8_0", "Q4_1", "Q4_0", "Q4_K", "Q5_K", "Q6_K"]
ALL_QTYPES = BLOCK_QTYPES + ["F32", "F16", "BF16"]
NP_OUT = {nbx.float32: np.float32, nbx.bfloat16: ml_dtypes.bfloat16, nbx.float16: np.float16}


def _skip_cpu(device):
    if device == "cpu":
        pytest.skip("device kernels: cpu dequantises with nbxtensor.backends.cpu.ggml_blocks")


def _f16_bits(g, n):
    """n random finite fp16 values as (n, 2) bytes: every sign, subnormals, up to 65504."""
    u = g.integers(0, 1 << 16, n, dtype=np.uint16)
    u = np.where((u & 0x7C00) == 0x7C00, u & np.uint16(0xBFFF), u)     # exponent 31 -> 15
    return u.view(np.uint8).reshape(n, 2)


def random_raw(g, qtype, n_rows, K):
    """(n_rows, row bytes) uint8: random quant bytes with random finite fp16 scales (or
    random finite floats for F32/F16/BF16); never all zeros."""
    bs, ts = Q.BLOCK_SIZES[qtype]
    nb = n_rows * K // bs
    if qtype == "F32":
        raw = (g.standard_normal(nb) * 10.0 ** g.integers(-30, 30, nb)).astype(np.float32)
        raw = raw.view(np.uint8)
    elif qtype == "F16":
        raw = _f16_bits(g, nb)
    elif qtype == "BF16":
        raw = (g.standard_normal(nb) * 10.0 ** g.integers(-30, 30, nb)).astype(np.float32)
        raw = raw.astype(ml_dtypes.bfloat16).view(np.uint8)
    else:
        raw = g.integers(0, 256, (nb, ts), dtype=np.uint8)
        if qtype in ("Q8_0", "Q4_0"):
            raw[:, 0:2] = _f16_bits(g, nb)
        elif qtype in ("Q4_1", "Q4_K", "Q5_K"):
            raw[:, 0:2], raw[:, 2:4] = _f16_bits(g, nb), _f16_bits(g, nb)
        else:                                              # Q6_K: d at the end
            raw[:, 208:210] = _f16_bits(g, nb)
    raw = np.ascontiguousarray(raw).reshape(n_rows, -1)
    assert raw.any()
    return raw


def _weight(raw, qtype, K, device):
    from nbxtensor.models._ops import QuantWeight
    return QuantWeight(nbx.tensor(raw, device=device), qtype, (raw.shape[0], K))


def _random_weight(g, qtype, N, K, device):
    """(raw blocks, their QuantWeight on `device`) of a random N x K weight."""
    raw = random_raw(g, qtype, N, K)
    return raw, _weight(raw, qtype, K, device)


def _bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _assert_bits_equal(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype,
                                                                 want.shape, want.dtype)
    g, w = _bits(got), _bits(want)
    bad = np.argwhere(g != w)
    assert bad.size == 0, (f"{len(bad)} of {g.size} elements differ; first at {bad[:3].tolist()}: "
                           f"got {got[tuple(bad[0])]!r}, want {want[tuple(bad[0])]!r}")


def _gguf_ref(raw, qtype, shape):
    gguf = pytest.importorskip("gguf")
    if qtype in ("F32", "F16", "BF16"):
        dt = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}[qtype]
        return raw.reshape(-1).view(dt).reshape(shape).astype(np.float32)
    return gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, qtype)) \
        .astype(np.float32).reshape(shape)


def _shape_for(qtype, n_super):
    """K overhanging the kernel's default block: 256-blocks -> 1024 + 256*n_super, others
    -> 256 + 32 (Q8_0/Q4_1 keep BLOCK 256) or 128*k+1 floats."""
    bs = Q.BLOCK_SIZES[qtype][0]
    if bs == 256:
        return 1024 + 256 * n_super
    if bs == 32:
        return 256 + 32
    return 1024 + 1


# ----------------------------------------------------------------------------- whole weights
@pytest.mark.parametrize("qtype", ALL_QTYPES)
def test_dequantize_bit_exact(device, qtype):
    """Whole weight, every output dtype, poisoned outputs: equal to the host reference bit
    for bit (float32 also to the gguf package); bf16/fp16 = one rounding of that."""
    _skip_cpu(device)
    from nbxtensor.kernels.quant import dequantize
    g = rng()
    N, K = 3, _shape_for(qtype, 1)
    raw, w = _random_weight(g, qtype, N, K, device)
    ref32 = Q.dequantize(raw, qtype, (N, K))
    _assert_bits_equal(ref32, _gguf_ref(raw, qtype, (N, K)))
    for dt, npdt in NP_OUT.items():
        out = poisoned((N, K), dt, device)
        with np.errstate(over="ignore"):                    # fp16 overflows to inf, as the host
            y = dequantize(w, out=out)
            want = Q.dequantize(raw, qtype, (N, K), npdt)
            _assert_bits_equal(want, ref32.astype(npdt))
        assert y is out and y.dtype == dt
        _assert_bits_equal(y.numpy(), want)
    y = dequantize(w)                                         # default: float32, new tensor
    assert y.dtype == nbx.float32 and tuple(y.shape) == (N, K)
    _assert_bits_equal(y.numpy(), ref32)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("block", [128, 512])
def test_dequantize_forced_tails(device, qtype, block):
    """Programs narrower than a 256-super-block (128) and tiles overhanging the row (512 on
    K = 256*3 or 32*19): every column is written, the tail is masked."""
    _skip_cpu(device)
    from nbxtensor.kernels.quant import dequantize
    g = rng()
    K = 768 if Q.BLOCK_SIZES[qtype][0] == 256 else 32 * 19
    N = 2
    raw = random_raw(g, qtype, N, K)
    out = poisoned((N, K), nbx.float32, device)
    dequantize(_weight(raw, qtype, K, device), out=out, block=block)
    _assert_bits_equal(out.numpy(), Q.dequantize(raw, qtype, (N, K)))


def test_dequantize_hand_built_k_blocks(device):
    """Known values, independent of both references: Q4_K sub-block 5 with its 6-bit scale
    split over two bytes, Q5_K's 5th bit, Q6_K's 2 high bits and scale index e // 16."""
    _skip_cpu(device)
    from nbxtensor.kernels.quant import dequantize
    one = np.array([1.0], np.float16).view(np.uint8)
    half = np.array([0.5], np.float16).view(np.uint8)
    # Q4_K: d = 1, dmin = 0.5; sub-block 5: scale = b[9] & 15 | (b[1] >> 6) << 4 = 3 | 2<<4 = 35,
    # min = b[9] >> 4 | (b[5] >> 6) << 4 = 1 | 1<<4 = 17; its nibbles: high halves of qs[64:96]
    b = np.zeros(144, np.uint8)
    b[0:2], b[2:4] = one, half
    b[4 + 1] = 0b10_000000
    b[4 + 5] = 0b01_000000
    b[4 + 9] = 0x13
    b[16 + 64: 16 + 96] = np.arange(32, dtype=np.uint8) % 16 << 4
    y = dequantize(_weight(b[None], "Q4_K", 256, device)).numpy()[0]
    np.testing.assert_array_equal(y[160:192], 35.0 * (np.arange(32) % 16) - 0.5 * 17)
    # Q5_K: the same block with qh bit 5 set for even l -> q += 16 there
    b5 = np.zeros(176, np.uint8)
    b5[0:16] = b[0:16]
    b5[16:48] = np.where(np.arange(32) % 2 == 0, 1 << 5, 0)
    b5[48:176] = b[16:144]
    y = dequantize(_weight(b5[None], "Q5_K", 256, device)).numpy()[0]
    q = np.arange(32) % 16 + np.where(np.arange(32) % 2 == 0, 16, 0)
    np.testing.assert_array_equal(y[160:192], 35.0 * q - 0.5 * 17)
    # Q6_K: element e = 128 + 64 + l (half 1, quarter 2): ql[64 + l] high nibble, qh[32 + l]
    # bits 4..5, scale sc[e // 16] = sc[12 + l // 16]
    b6 = np.zeros(210, np.uint8)
    b6[64:96] = (np.arange(32, dtype=np.uint8) % 16) << 4
    b6[128 + 32: 128 + 64] = (np.arange(32, dtype=np.uint8) % 4) << 4
    b6[192:208] = np.arange(-8, 8, dtype=np.int8).view(np.uint8)
    b6[208:210] = half
    y = dequantize(_weight(b6[None], "Q6_K", 256, device)).numpy()[0]
    q = (np.arange(32) % 16 | (np.arange(32) % 4) << 4) - 32
    sc = np.arange(-8, 8)[12 + np.arange(32) // 16]
    np.testing.assert_array_equal(y[192:224], 0.5 * (q * sc))


# ----------------------------------------------------------------------------- row subsets
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K", "Q5_K", "Q6_K", "BF16"])
def test_dequantize_rows_subset(device, qtype):
    """Embedding lookup: ids of any shape (int32 / int64 / non-contiguous, repeats), bf16
    output, out-of-range ids -> IndexError (and NaN rows) as the Q8_0/Q4_1 path, empty and
    0-dim ids."""
    _skip_cpu(device)
    from nbxtensor.kernels.quant import dequantize_rows
    g = rng()
    N, K = 7, _shape_for(qtype, 0)
    raw, w = _random_weight(g, qtype, N, K, device)
    ref = Q.dequantize(raw, qtype, (N, K))
    ids = np.array([[6, 0, 3], [3, 6, 1]])
    for idt in (np.int64, np.int32):
        out = poisoned((2, 3, K), nbx.float32, device)
        y = dequantize_rows(w, nbx.tensor(ids.astype(idt), device=device), out=out)
        assert y is out
        _assert_bits_equal(y.numpy(), ref[ids])
    wide = nbx.tensor(np.array([5, 9, 2, 9, 6, 9]), device=device)[::2]   # non-contiguous
    yb = dequantize_rows(w, wide, dtype=nbx.bfloat16)
    assert yb.dtype == nbx.bfloat16 and tuple(yb.shape) == (3, K)
    _assert_bits_equal(yb.numpy(), ref[[5, 2, 6]].astype(ml_dtypes.bfloat16))
    # out of range: IndexError (cuda: at the next sync), the row NaN, no out-of-bounds read
    out = nbx.zeros((4, K), device=device)
    with pytest.raises(IndexError, match=rf"dequantize_rows: index ({N}|-1|{1 << 40}) is out "
                                         rf"of range for a weight of {N} rows"):
        dequantize_rows(w, nbx.tensor(np.array([N, -1, 2, 1 << 40]), device=device), out=out)
        if device == "cuda":
            nbx.cuda.synchronize()
    bad = out.numpy()
    assert np.isnan(bad[[0, 1, 3]]).all()
    _assert_bits_equal(bad[2], ref[2])
    assert tuple(dequantize_rows(w, nbx.tensor(np.zeros(0, np.int64), device=device)).shape) \
        == (0, K)
    _assert_bits_equal(dequantize_rows(w, nbx.tensor(np.int64(4), device=device)).numpy(), ref[4])


def test_embedding_through_models_ops(device):
    """models._ops.embedding with a Q4_K QuantWeight goes to dequantize_rows."""
    _skip_cpu(device)
    from nbxtensor.models import _ops as O
    g = rng()
    raw = random_raw(g, "Q4_K", 5, 256)
    ids = nbx.tensor(np.array([[4, 1]]), device=device)
    y = O.embedding(ids, _weight(raw, "Q4_K", 256, device))
    _assert_bits_equal(y.numpy(), Q.dequantize(raw, "Q4_K", (5, 256))[[[4, 1]]])


def test_dequantize_errors(device):
    _skip_cpu(device)
    from nbxtensor.kernels.quant import dequantize, dequantize_rows, quant_linear
    from nbxtensor.models._ops import QuantWeight
    raw = nbx.zeros((2, 144), dtype=nbx.uint8, device=device)
    w = QuantWeight(raw, "Q4_K", (2, 256))
    with pytest.raises(ValueError, match="qtype 'IQ2_XXS' has no device kernel"):
        dequantize(QuantWeight(raw, "IQ2_XXS", (2, 256)))
    with pytest.raises(ValueError, match="in_features 128 must be a multiple of 256 for Q4_K"):
        dequantize(QuantWeight(raw, "Q4_K", (2, 128)))
    with pytest.raises(ValueError, match=r"needs uint8 blocks of shape \(2, 210\)"):
        dequantize(QuantWeight(raw, "Q6_K", (2, 256)))
    with pytest.raises(ValueError, match="needs uint8 blocks"):
        dequantize(QuantWeight(raw.to(nbx.int32), "Q4_K", (2, 256)))
    with pytest.raises(ValueError, match="contiguous"):
        dequantize(QuantWeight(nbx.zeros((2, 288), dtype=nbx.uint8, device=device)[:, ::2],
                               "Q4_K", (2, 256)))
    odd = nbx.zeros((2 * 144 + 1,), dtype=nbx.uint8, device=device)[1:].view(2, 144)
    with pytest.raises(ValueError, match="2-byte aligned"):
        dequantize(QuantWeight(odd, "Q4_K", (2, 256)))
    with pytest.raises(ValueError, match="run on cuda or interp"):
        dequantize(QuantWeight(nbx.zeros((2, 144), dtype=nbx.uint8), "Q4_K", (2, 256)))
    with pytest.raises(TypeError, match="dtype must be one of .* got .*int32"):
        dequantize(w, nbx.int32)
    with pytest.raises(ValueError, match=r"out must be a contiguous .*float32.* \(2, 256\)"):
        dequantize(w, out=nbx.zeros((2, 255), device=device))
    with pytest.raises(ValueError, match="out must be"):
        dequantize(w, nbx.float32, out=nbx.zeros((2, 256), dtype=nbx.bfloat16, device=device))
    with pytest.raises(TypeError, match="ids must be an integer tensor"):
        dequantize_rows(w, nbx.zeros(2, device=device))
    with pytest.raises(ValueError, match="block must be a power of two"):
        dequantize(w, block=100)
    # the GEMV takes Q8_0 / Q4_1 and the K-quants, not Q4_0
    with pytest.raises(ValueError, match="no device kernel"):
        quant_linear(nbx.zeros((1, 256), device=device),
                     QuantWeight(nbx.zeros((2, 144), dtype=nbx.uint8, device=device), "Q4_0",
                                 (2, 256)))


def test_quant_linear_strided_bias(device):
    """A bias view with a stride (every other element) is read by its stride, not as if it
    were contiguous (the kernel indexes the bias pointer with n)."""
    _skip_cpu(device)
    from nbxtensor.kernels.quant import quant_linear
    g = rng()
    N, K = 8, 64
    raw, w = _random_weight(g, "Q8_0", N, K, device)
    W = Q.dequantize(raw, "Q8_0", (N, K)).astype(np.float64)
    xs = g.standard_normal((1, K)).astype(np.float32)
    # random fp16 block scales make terms of up to ~1e6 whose fp32 sum may cancel: the
    # tolerance follows the terms (|x| @ |W|), and the bias follows each row's magnitude so a
    # misread one shows -- the skipped (odd) elements are 10x the row's magnitude
    rows = (np.abs(xs.astype(np.float64)) @ np.abs(W.T))[0]
    bs = np.empty(2 * N, np.float32)
    bs[0::2] = g.standard_normal(N) * (rows * 1e-2 + 1)
    bs[1::2] = 10 * rows + 100
    b = nbx.tensor(bs, device=device)[::2]
    y = quant_linear(nbx.tensor(xs, device=device), w, b)
    ref = xs.astype(np.float64) @ W.T + bs[::2]
    err = np.abs(y.numpy().astype(np.float64) - ref)
    assert (err <= 1e-5 * (rows + np.abs(bs[::2])) + 1e-5).all(), \
        float((err / (rows + 1e-30)).max())


# ----------------------------------------------------------------------------- the GGUF loader
TINYK = {"vocab_size": 67, "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 1,
         "num_attention_heads": 4, "num_key_value_heads": 2}
# each block format once (and F32 norms, F16 for the host cast path); attn_q / attn_k are
# permuted by the loader, so they test the block-row un-permutation too
TINYK_TYPES = {"token_embd.weight": "Q4_K", "output.weight": "Q6_K", "blk.0.attn_q.weight": "Q4_K",
               "blk.0.attn_k.weight": "Q5_K", "blk.0.attn_v.weight": "Q4_0",
               "blk.0.attn_output.weight": "Q8_0", "blk.0.ffn_gate.weight": "Q4_1",
               "blk.0.ffn_up.weight": "Q6_K", "blk.0.ffn_down.weight": "F16",
               "output_norm.weight": "F32", "blk.0.attn_norm.weight": "F32",
               "blk.0.ffn_norm.weight": "F32"}


@pytest.fixture(scope="module")
def tinyk_gguf(tmp_path_factory):
    gguf = pytest.importorskip("gguf")
    c = TINYK
    D, F, V, Hq, Hkv = (c["hidden_size"], c["intermediate_size"], c["vocab_size"],
                        c["num_attention_heads"], c["num_key_value_heads"])
    hd = D // Hq
    shapes = {"token_embd.weight": (V, D), "output.weight": (V, D), "output_norm.weight": (D,),
              "blk.0.attn_norm.weight": (D,), "blk.0.ffn_norm.weight": (D,),
              "blk.0.attn_q.weight": (Hq * hd, D), "blk.0.attn_k.weight": (Hkv * hd, D),
              "blk.0.attn_v.weight": (Hkv * hd, D), "blk.0.attn_output.weight": (D, Hq * hd),
              "blk.0.ffn_gate.weight": (F, D), "blk.0.ffn_up.weight": (F, D),
              "blk.0.ffn_down.weight": (D, F)}
    g = rng()
    path = tmp_path_factory.mktemp("tinyk") / "tinyk.gguf"
    gw = gguf.GGUFWriter(str(path), "llama")
    gw.add_block_count(1)
    gw.add_context_length(64)
    gw.add_embedding_length(D)
    gw.add_feed_forward_length(F)
    gw.add_head_count(Hq)
    gw.add_head_count_kv(Hkv)
    gw.add_layer_norm_rms_eps(1e-5)
    gw.add_rope_freq_base(10000.0)
    gw.add_tokenizer_model("gpt2")
    gw.add_tokenizer_pre("default")
    gw.add_token_list([f"t{i}" for i in range(V)])
    gw.add_token_types([1] * V)
    gw.add_eos_token_id(1)
    for name, shape in shapes.items():
        qt = TINYK_TYPES[name]
        if qt == "F32":
            gw.add_tensor(name, (1 + 0.1 * g.standard_normal(shape)).astype(np.float32))
        elif qt == "F16":
            gw.add_tensor(name, (0.05 * g.standard_normal(shape)).astype(np.float16))
        else:
            raw = random_raw(g, qt, shape[0], shape[1])
            gw.add_tensor(name, raw, raw_dtype=getattr(gguf.GGMLQuantizationType, qt))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    return str(path)


def _loaded(m):
    L = m.w["layers"][0]
    return {"token_embd.weight": m.w["embed"], "output.weight": m.w["lm_head"],
            "blk.0.attn_q.weight": L["wq"], "blk.0.attn_k.weight": L["wk"],
            "blk.0.attn_v.weight": L["wv"], "blk.0.attn_output.weight": L["wo"],
            "blk.0.ffn_gate.weight": L["w_gate"], "blk.0.ffn_up.weight": L["w_up"],
            "blk.0.ffn_down.weight": L["w_down"]}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gguf_loader_dequantises_on_device(device, tinyk_gguf, dtype, monkeypatch):
    """from_gguf(quantized=False) on cuda/interp: the block formats are not dequantised on the
    host, and every weight equals the cpu load (host dequant + host un-permutation) bit for bit
    (bf16: that value rounded once)."""
    _skip_cpu(device)
    from nbxtensor.io import gguf as io_gguf
    from nbxtensor.models import LlamaModel
    ref = {k: v.numpy() for k, v in
           _loaded(LlamaModel.from_gguf(tinyk_gguf, quantized=False)).items()}
    host_calls = []
    orig = io_gguf.GGUFTensor.dequantize

    def spy(self, *a, **k):
        host_calls.append(self.qtype)
        return orig(self, *a, **k)
    monkeypatch.setattr(io_gguf.GGUFTensor, "dequantize", spy)
    m = LlamaModel.from_gguf(tinyk_gguf, device=device, dtype=dtype, quantized=False)
    assert set(host_calls) <= {"F32", "F16"}, host_calls
    dt = nbx.dtypes.as_dtype(dtype)
    for name, t in _loaded(m).items():
        assert isinstance(t, nbx.Tensor) and t.dtype == dt and t.device.type == device, name
        want = ref[name].astype(NP_OUT[dt])
        _assert_bits_equal(t.numpy(), want)


# ----------------------------------------------------------------------------- sm_90 compile
def _ptxas_stats(ptx):
    import triton
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        return None
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "k.ptx")
        with open(f, "w") as fh:
            fh.write(ptx)
        r = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", f, "-o", os.path.join(d, "k.o")],
                           capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    regs = int(re.search(r"Used (\d+) registers", r.stderr).group(1))
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", r.stderr)]
    return regs, sum(spills)


@pytest.mark.parametrize("qtype", ALL_QTYPES)
def test_kernels_compile_for_sm90(qtype):
    """Every dequantisation variant compiles for sm_90 with no shared memory and no spills
    (ptxas -v from Triton's wheel); the fused GEMV of Q8_0/Q4_1 still compiles too."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from nbxtensor.kernels import quant as KQ
    tgt = GPUTarget("cuda", 90, 64)
    code = KQ.DEQUANT_QTYPES[qtype][0]
    for yty, block, has_ids in (("bf16", 1024, True), ("fp32", 1024, False), ("fp16", 256, True)):
        sig = {"w_ptr": "*u8", "ids_ptr": "*i64" if has_ids else "*u8", "y_ptr": "*" + yty,
               "flag_ptr": "*i64" if has_ids else "*u8", "tag": "i32", "K": "i32",
               "row_bytes": "i32", "n_rows": "i32", "QTYPE": "constexpr",
               "BLOCK": "constexpr", "HAS_IDS": "constexpr"}
        ck = triton.compile(triton.compiler.ASTSource(
            fn=KQ._dequant_rows_kernel, signature=sig,
            constexprs={"QTYPE": code, "BLOCK": block, "HAS_IDS": has_ids}),
            target=tgt, options={"num_warps": 4})
        # with ids: the 8 bytes through which the index-error flag's atomic (one thread, on the
        # bad-id path only) hands its result to the block
        assert ck.metadata.shared == (8 if has_ids else 0)
        st = _ptxas_stats(ck.asm["ptx"])
        if st is not None:
            regs, spill = st
            assert spill == 0 and regs <= 128, (qtype, yty, block, regs, spill)
    if qtype in KQ.QTYPES:
        sig = {"x_ptr": "*bf16", "w_ptr": "*u8", "b_ptr": "*bf16", "y_ptr": "*bf16", "N": "i32",
               "K": "i32", "row_bytes": "i32", "stride_xm": "i32", "stride_xk": "i32",
               "stride_ym": "i32", "QTYPE": "constexpr", "HAS_BIAS": "constexpr",
               "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
        ck = triton.compile(triton.compiler.ASTSource(
            fn=KQ._quant_gemv_kernel, signature=sig,
            constexprs={"QTYPE": code, "HAS_BIAS": False, "BLOCK_N": 2, "BLOCK_K": 256}),
            target=tgt, options={"num_warps": 4})
        assert ck.metadata.shared <= 16384
