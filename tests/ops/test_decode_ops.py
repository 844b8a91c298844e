"""ops/decode.py as an op family: every op has its implementations registered per device
family, and quant_linear's policy (a K-quant prefill is dequantised once and multiplied by
one GEMM; a few rows take the fused dequantise-GEMV), against a float64 reference."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng
from nbxtensor import dispatch
from nbxtensor.backends.cpu import ggml_blocks as Q
from nbxtensor.ops import decode as D

# op -> the device families that implement it (cpu: "numpy"; cuda/interp: "triton")
FAMILIES = {
    "decode_linear": ("numpy", "triton"), "decode_linear_quant": ("numpy", "triton"),
    "decode_qkv_rope": ("triton",), "decode_qkv_rope_quant": ("triton",),
    "argmax_commit": ("triton",), "commit_tokens": ("triton",),
    "quant_linear": ("numpy", "triton"), "quant_embedding": ("numpy", "triton"),
    "quant_dequantize": ("triton",),
}


@pytest.mark.parametrize("op", sorted(FAMILIES))
def test_every_decode_op_is_registered_where_it_runs(op):
    devices = {"numpy": "cpu", "triton": "interp"}
    for family in FAMILIES[op]:
        if family == "triton":
            pytest.importorskip("triton")
        assert callable(dispatch.impl(op, nbx.device(devices[family])))


def _q4k_weight(g, N, K, device):
    raw = g.integers(0, 256, (N * K // 256, 144), dtype=np.uint8)
    # small positive fp16 scales (d, dmin): the products stay well inside float32
    raw[:, 0:2] = np.array([0.01], np.float16).view(np.uint8)
    raw[:, 2:4] = np.array([0.005], np.float16).view(np.uint8)
    raw = np.ascontiguousarray(raw.reshape(N, -1))
    w64 = Q.dequantize(raw, "Q4_K", (N, K)).astype(np.float64)
    return D.QuantWeight(nbx.tensor(raw, device=device), "Q4_K", (N, K)), w64


@pytest.mark.parametrize("M", [3, 12])
def test_quant_linear_prefill_policy_matches_float64(monkeypatch, M):
    """M = 12 > KQ_GEMV_MAX_M: the weight is dequantised once (quant_dequantize asked) and
    multiplied; M = 3: the fused GEMV, nothing dequantised. Both equal x @ W.T + b. x is a
    strided view (every other column of a wider array)."""
    pytest.importorskip("triton")
    from nbxtensor.kernels import quant as kq
    g = rng()
    N, K, dev = 24, 512, "interp"
    w, w64 = _q4k_weight(g, N, K, dev)
    xs = g.standard_normal((M, 2 * K)).astype(np.float32)
    x = nbx.tensor(xs, device=dev)[:, ::2]
    bs = g.standard_normal(N).astype(np.float32)
    asked = []
    real = dispatch.impl("quant_dequantize", nbx.device(dev))
    monkeypatch.setitem(dispatch._BY_DEVTYPE, ("quant_dequantize", "interp"),
                        lambda *a, **k: asked.append(1) or real(*a, **k))
    y = D.quant_linear(x, w, nbx.tensor(bs, device=dev))
    assert tuple(y.shape) == (M, N) and y.dtype is nbx.float32
    assert bool(asked) == (M > kq.KQ_GEMV_MAX_M)
    x64 = xs[:, ::2].astype(np.float64)
    ref = x64 @ w64.T + bs
    scale = np.abs(x64) @ np.abs(w64.T) + np.abs(bs)
    err = np.abs(y.numpy().astype(np.float64) - ref)
    assert (err <= 1e-5 * scale + 1e-6).all(), float((err / scale).max())
