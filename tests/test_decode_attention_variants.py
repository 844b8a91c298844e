"""The register variant of decode attention (kernels/decode_attention.py, REG=1 / VARIANT
"reg") against a float64 NumPy reference: GQA groups, T > 1 query tokens (bottom-right
causal), lengths read from the device (0, 1, odd, overhanging the tiles), DV != D, strided
cache views, 16-bit caches, NaN-poisoned outputs, counters reset between calls; the
fall-back rule and the refusals. Triton only (interp here, cuda on the GPU machine)."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor.kernels import decode_attention as kd
from helpers import poisoned, rng


def _ref(q, k, v, lens, scale):
    """float64 decode: query token t of T sees keys j <= len - T + t (and j < len)."""
    B, Hq, T, D = q.shape
    Hk = k.shape[1]
    out = np.zeros((B, Hq, T, v.shape[3]))
    for b in range(B):
        n = int(lens[b])
        for h in range(Hq):
            g = h // (Hq // Hk)
            s = q[b, h] @ k[b, g, :n].T * scale                       # [T, n]
            lim = n - T + np.arange(T)
            s = np.where(np.arange(n)[None, :] <= lim[:, None], s, -np.inf)
            for t in range(T):
                if np.isfinite(s[t]).any():
                    p = np.exp(s[t] - s[t].max())
                    out[b, h, t] = p @ v[b, g, :n] / p.sum()
    return out


def _inputs(g, B, Hq, Hk, T, C, D, DV, dtype, device, pad=0):
    """q, k, v as nbx tensors (the caches as views at offset `pad` into a longer buffer,
    so their strides are not the contiguous ones) and the float64 values they hold."""
    np_dt = nbx.dtypes.as_dtype(dtype).np
    q = g.standard_normal((B, Hq, T, D)).astype(np_dt)
    kb = g.standard_normal((B, Hk, C + 2 * pad, D)).astype(np_dt)
    vb = g.standard_normal((B, Hk, C + 2 * pad, DV)).astype(np_dt)
    # q as a (B, T, H, D) buffer viewed as (B, H, T, D): strided, like the model's q
    tq = nbx.tensor(np.ascontiguousarray(np.swapaxes(q, 1, 2)), device=device).transpose(1, 2)
    tk = nbx.tensor(kb, device=device)[:, :, pad:pad + C, :]
    tv = nbx.tensor(vb, device=device)[:, :, pad:pad + C, :]
    f64 = lambda a: a.astype(np.float64)  # noqa: E731
    return (tq, tk, tv), (f64(q), f64(kb[:, :, pad:pad + C]), f64(vb[:, :, pad:pad + C]))


TOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}

CASES = [
    # (B, Hq, Hk, T, C, D, DV, dtype, lengths, override)
    (4, 6, 2, 2, 90, 24, 40, "float32", [0, 1, 37, 89],
     dict(P=4, BLOCK_N=8, KPT=2, W=16, COMBINE=1, MERGE_STAGES=2, CHUNK_P=1)),  # GQA 3, T=2
    (2, 8, 2, 1, 70, 32, 32, "bfloat16", [33, 70],
     dict(P=3, BLOCK_N=16, KPT=4, W=16, COMBINE=0, MIN_N=40)),      # 2*16+1, merge kernel
    (3, 4, 4, 3, 50, 16, 16, "float16", [3, 17, 50],
     dict(P=2, BLOCK_N=4, KPT=1, W=16, COMBINE=1)),                 # MHA, T = length 3
    (1, 4, 1, 1, 41, 64, 64, "bfloat16", [41],
     dict(P=1, BLOCK_N=16, KPT=2, W=32, COMBINE=1)),                # one range: no merge
]


DOT_CASE = (2, 4, 2, 2, 60, 16, 16, "float32", [9, 59],
            dict(P=4, BLOCK_N=16, COMBINE=1, MIN_N=48, REG=0, num_stages=1, MERGE_STAGES=3,
                 CHUNK_P=1))


@pytest.mark.parametrize("case", CASES + [DOT_CASE],
                         ids=lambda c: f"{c[7]}-T{c[3]}-P{c[9]['P']}-REG{c[9].get('REG', 1)}")
def test_reg_variant_matches_float64(device, case):
    """(the last case: the tensor-core loop with MIN_N and MERGE_STAGES, the knobs both
    loops share; MERGE_STAGES pipelines the merge on cuda, a plain loop on interp)"""
    if device == "cpu":
        pytest.skip("REG=1 is a variant of the Triton kernel")
    B, Hq, Hk, T, C, D, DV, dtype, lens, over = case
    g = rng()
    (q, k, v), (q64, k64, v64) = _inputs(g, B, Hq, Hk, T, C, D, DV, dtype, device, pad=3)
    lt = nbx.tensor(np.array(lens, np.int32), device=device)
    scale = 1.0 / np.sqrt(D)
    want = _ref(q64, k64, v64, lens, scale)
    kd._OVERRIDE = dict(dict(REG=1, num_warps=4, num_stages=1), **over)
    try:
        outs = []
        for _ in range(3):
            o = poisoned((B, Hq, T, DV), dtype, device)
            nbx.decode_attention(q, k, v, lt, out=o)
            outs.append(o.numpy().astype(np.float64))
    finally:
        kd._OVERRIDE = None
    tol = TOL[dtype]
    assert not np.isnan(outs[0]).any(), "unwritten output elements (NaN poison left)"
    np.testing.assert_allclose(outs[0], want, rtol=tol, atol=tol)
    # the ticket counters are back at 0 after each call: identical results
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_variant_switch_and_fallback_rule(device, monkeypatch):
    """VARIANT="reg" selects the register loop where reg_applies (rows x DV <= 1024), and
    the dot loop elsewhere; both correct."""
    if device == "cpu":
        pytest.skip("the variant switch is a Triton kernel knob")
    monkeypatch.setattr(kd, "VARIANT", "reg")
    assert kd.decode_config(1, 2, 64, 16, 16, 4, True, R=4).get("REG") == 1
    assert kd.decode_config(1, 2, 64, 64, 64, 2, False, R=32).get("REG") is None  # 32 x 64
    assert kd.decode_config(1, 2, 64, 128, 128, 2, False, R=8).get("REG") == 1    # 8 x 128
    seen = []
    real = kd.decode_config

    def spy(*a, **kw):
        cfg = real(*a, **kw)
        seen.append(cfg.get("REG", 0))
        return cfg

    monkeypatch.setattr(kd, "decode_config", spy)
    g = rng()
    for (B, Hq, Hk, T, C, D), want_reg in (((2, 4, 2, 1, 40, 16), 1),
                                           ((1, 16, 2, 4, 40, 64), 0)):   # 8 x 4 rows x 64
        (q, k, v), (q64, k64, v64) = _inputs(g, B, Hq, Hk, T, C, D, D, "float32", device)
        lens = [C - 1 - b for b in range(B)]
        o = poisoned((B, Hq, T, D), "float32", device)
        nbx.decode_attention(q, k, v, nbx.tensor(np.array(lens, np.int32), device=device), out=o)
        assert seen[-1] == want_reg
        np.testing.assert_allclose(o.numpy(), _ref(q64, k64, v64, lens, 1 / np.sqrt(D)),
                                   rtol=2e-5, atol=2e-5)


def test_reg_override_refuses_what_it_cannot_hold(device):
    if device == "cpu":
        pytest.skip("REG=1 is a variant of the Triton kernel")
    g = rng()
    (q, k, v), _ = _inputs(g, 1, 16, 2, 4, 8, 64, 64, "float32", device)   # 32 rows x 64
    lt = nbx.tensor(np.array([8], np.int32), device=device)
    for over, text in ((dict(P=1, BLOCK_N=8, REG=1), "rows 32"),
                       (dict(P=1, BLOCK_N=6, REG=1, KPT=4), "KPT 4")):
        kd._OVERRIDE = over
        try:
            with pytest.raises(ValueError, match=text):
                nbx.decode_attention(q[:, :4, :1], k, v, lt) if "KPT" in over else \
                    nbx.decode_attention(q, k, v, lt)
        finally:
            kd._OVERRIDE = None


@pytest.mark.cuda
def test_reg_variant_cuda_graph_replays_new_lengths(device):
    """The grid does not depend on the length: one captured launch serves every length."""
    if device != "cuda":
        pytest.skip("CUDA graphs need cuda")
    g = rng()
    B, Hq, Hk, C, D = 1, 32, 8, 4096, 128
    (q, k, v), (q64, k64, v64) = _inputs(g, B, Hq, Hk, 1, C, D, D, "bfloat16", device)
    lt = nbx.tensor(np.array([C], np.int32), device=device)
    out = nbx.empty(B, Hq, 1, D, dtype=nbx.bfloat16, device=device)
    kd._OVERRIDE = dict(REG=1, P=kd.splits(B * Hk, C, 528, 16), BLOCK_N=16, KPT=2, W=128,
                        num_warps=4, num_stages=1, COMBINE=1)
    try:
        nbx.decode_attention(q, k, v, lt, out=out)       # eager first: compile + counters
        nbx.cuda.synchronize()
        graph = nbx.cuda.CUDAGraph()
        with nbx.cuda.graph(graph):
            nbx.decode_attention(q, k, v, lt, out=out)
        for n in (C, 1, 0, 777, 4095):
            lt.fill_(n)
            out.fill_(float("nan"))
            graph.replay()
            nbx.cuda.synchronize()
            np.testing.assert_allclose(out.numpy().astype(np.float64),
                                       _ref(q64, k64, v64, [n], 1 / np.sqrt(D)),
                                       rtol=3e-2, atol=3e-2)
    finally:
        kd._OVERRIDE = None
