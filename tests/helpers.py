"""Shared test utilities: float64 references, dtype tolerances, poisoned outputs."""
from __future__ import annotations

import numpy as np

import nbxtensor as nbx
from nbxtensor.kernels._common import DeviceFacts

# relative tolerance by dtype, for results of a few roundings (element-wise ops)
RTOL = {
    nbx.float64: 1e-12, nbx.float32: 2e-6, nbx.float16: 2e-3, nbx.bfloat16: 1.6e-2,
    nbx.float8_e4m3fn: 1.3e-1, nbx.float8_e5m2: 2.6e-1,
}
FLOAT_DTYPES = [nbx.float32, nbx.float16, nbx.bfloat16, nbx.float64]
INT_DTYPES = [nbx.uint8, nbx.int8, nbx.int16, nbx.int32, nbx.int64]

# The H200's facts as its driver reports them, for tests of the cuda launch rules on a
# machine without that GPU (kernels/_common.device_facts gives them on the card itself)
H200 = DeviceFacts("cuda", sms=132, l2_bytes=52428800, smem_per_block=232448, regs_per_sm=65536,
                  threads_per_sm=2048)


def rng(seed=None):
    """A fresh generator; tests draw new inputs every run unless NBX_TEST_SEED is set."""
    import os
    s = os.environ.get("NBX_TEST_SEED")
    return np.random.default_rng(int(s) if s else seed)


def randn(shape, dtype=nbx.float32, device="cpu", gen=None, low=None, high=None):
    """Random tensor (never zeros): normal for floats, uniform ints, random bools."""
    gen = gen or rng()
    dtype = nbx.dtypes.as_dtype(dtype)
    if dtype.kind == "f":
        a = gen.standard_normal(shape)
        if low is not None:
            a = gen.uniform(low, high, shape)
    elif dtype.kind == "b":
        a = gen.random(shape) < 0.5
    else:
        info = np.iinfo(dtype.np)
        lo = max(info.min, -100 if low is None else low)
        hi = min(info.max, 100 if high is None else high)
        a = gen.integers(lo, hi, shape, endpoint=True)
    return nbx.tensor(np.asarray(a).astype(dtype.np), device=device)


def poisoned(shape, dtype, device):
    """An output buffer filled with NaN (floats) or a sentinel (ints) so unwritten elements show."""
    dtype = nbx.dtypes.as_dtype(dtype)
    if dtype.kind == "f":
        return nbx.full(shape, float("nan"), dtype=dtype, device=device)
    if dtype.kind == "b":
        return nbx.full(shape, True, dtype=dtype, device=device)
    return nbx.full(shape, int(np.iinfo(dtype.np).max) if dtype.kind == "u" else -77,
                    dtype=dtype, device=device)


def to64(x):
    """A tensor or array as float64 NumPy (the reference precision)."""
    a = x.numpy() if isinstance(x, nbx.Tensor) else np.asarray(x)
    return a.astype(np.float64)


def assert_close(actual, expected, dtype=None, rtol=None, atol=None, equal_nan=True):
    """Compare a tensor to a float64 reference with a tolerance derived from the dtype."""
    if isinstance(actual, nbx.Tensor):
        dtype = dtype or actual.dtype
        actual = actual.numpy()
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != expected {expected.shape}"
    if dtype is not None and not nbx.dtypes.as_dtype(dtype).is_floating_point:
        np.testing.assert_array_equal(actual, expected)
        return
    r = rtol if rtol is not None else RTOL.get(dtype, 1e-6)
    a = atol if atol is not None else r
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                               rtol=r, atol=a, equal_nan=equal_nan)


def poison_allocations(monkeypatch):
    """Make every float tensor the ops allocate (Tensor._empty: outputs, workspaces) start
    as NaN, so an element a kernel fails to write shows. Call it from an autouse fixture."""
    from nbxtensor.tensor import Tensor
    orig = Tensor._empty.__func__

    def _empty(cls, shape, dtype, device):
        t = orig(cls, shape, dtype, device)
        if dtype.kind == "f" and t.numel():
            t.untyped_storage().from_host(0, np.full(t.numel(), np.nan, dtype.np))
        return t
    monkeypatch.setattr(Tensor, "_empty", classmethod(_empty))


def prefilled_eager_and_graph(m, prompts, batch, capacity=40, **kw):
    """Two GraphDecoders over model `m` with the same settings, both prefilled with
    `prompts`: one eager, one whose step is captured as a CUDA graph (with kernels in it)."""
    from nbxtensor.models.graph_decode import GraphDecoder
    eager = GraphDecoder(m, batch=batch, capacity=capacity, use_graph=False, **kw)
    graph = GraphDecoder(m, batch=batch, capacity=capacity, use_graph=True, **kw)
    eager.prefill(prompts)
    graph.prefill(prompts)
    graph.capture()
    assert graph.kernels_per_step > 0
    return eager, graph


def assert_graph_generate_equals_eager(m, prompts, batch, n, capacity=40, **kw):
    """generate() through the replayed graph yields the eager loop's tokens."""
    from nbxtensor.models.graph_decode import GraphDecoder
    r1 = GraphDecoder(m, batch=batch, capacity=capacity, use_graph=False, **kw).generate(prompts, n)
    r2 = GraphDecoder(m, batch=batch, capacity=capacity, use_graph=True, **kw).generate(prompts, n)
    assert r1.tokens == r2.tokens


# the fp16 fields of each GGML block format (byte offsets in the block)
_GGML_F16 = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2],
             "Q6_K": [208]}


def ggml_random_blocks(qtype, N, K, gen):
    """Random blocks of a GGML-quantised weight (N, K): random bytes, with the fp16 scales
    finite and nonzero (|s| in [0.01, 0.1], either sign)."""
    from nbxtensor.backends.cpu.quant import QTYPES
    bs, ts = QTYPES[qtype]
    b = gen.integers(0, 256, (N, K // bs, ts), dtype=np.uint8)
    for o in _GGML_F16[qtype]:
        v = gen.uniform(0.01, 0.1, (N, K // bs)) * gen.choice([-1, 1], (N, K // bs))
        b[:, :, o:o + 2] = v.astype(np.float16).view(np.uint8).reshape(N, K // bs, 2)
    return np.ascontiguousarray(b.reshape(N, -1))
