"""The op layers' per-call caches (fast paths) change nothing but speed.

Element-wise and reduction ops remember the decisions of a call (promotion, broadcast
shape, in-place checks, launch plans) keyed on what decides them. Each test here calls an
op with fresh inputs twice or more, so the later calls take the cached path, and checks
the values against float64 NumPy; then it checks that a call that must be refused is
still refused after a similar valid call warmed the cache.
"""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import assert_close, randn, rng, to64


def _fresh_pair(shape_a, shape_b, dtype, device, g):
    return randn(shape_a, dtype, device, g), randn(shape_b, dtype, device, g)


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16, nbx.float64, nbx.int32])
def test_binary_repeated_calls(device, dtype):
    g = rng()
    shapes = [((4097,), (4097,)), ((3, 65), (65,)), ((3, 1), (1, 65)), ((), (33,)), ((5,), ())]
    for _ in range(3):     # first call: full path; later calls: cached path
        for sa, sb in shapes:
            a, b = _fresh_pair(sa, sb, dtype, device, g)
            ref_a, ref_b = to64(a), to64(b)
            assert_close(a + b, ref_a + ref_b, dtype)
            assert_close(a * b, ref_a * ref_b, dtype)
            r = a - b
            assert r.dtype is dtype and tuple(r.shape) == np.broadcast_shapes(sa, sb)
            assert_close(r, ref_a - ref_b, dtype)
            assert_close(a > b, ref_a > ref_b)
            assert (a > b).dtype is nbx.bool


def test_scalar_repeated_calls_and_default_dtype(device):
    g = rng()
    for _ in range(3):
        x = randn((1025,), nbx.float16, device, g)
        assert_close(x * 2.5, to64(x) * 2.5, nbx.float16)
        assert_close(3 - x, 3 - to64(x), nbx.float16)
        i = randn((1025,), nbx.int16, device, g)
        r = i * 2.5                  # int tensor * Python float -> the default float
        assert r.dtype is nbx.float32
        assert_close(r, to64(i) * 2.5, nbx.float32)
        assert (i * 2).dtype is nbx.int16
    old = nbx.get_default_dtype()
    try:
        nbx.set_default_dtype(nbx.float64)
        i = randn((17,), nbx.int16, device, g)
        r = i * 2.5
        assert r.dtype is nbx.float64, "a cached promotion ignored the default dtype"
        assert_close(r, to64(i) * 2.5, nbx.float64)
    finally:
        nbx.set_default_dtype(old)


def test_inplace_repeated_calls(device):
    g = rng()
    for _ in range(3):
        a, b = _fresh_pair((3, 65), (65,), nbx.float32, device, g)
        ref = to64(a) + to64(b)
        assert a.add_(b) is a
        assert_close(a, ref, nbx.float32)
        ref = ref * 0.5
        a.mul_(0.5)
        assert_close(a, ref, nbx.float32)
        a += 1
        assert_close(a, ref + 1, nbx.float32)


def test_inplace_overlap_after_warm_cache(device):
    """a.add_(view of a in another layout) goes through a temporary even when a.add_(b) of
    the same dtypes and shapes was cached."""
    g = rng()
    for _ in range(2):
        a, b = _fresh_pair((9, 9), (9, 9), nbx.float32, device, g)
        a.add_(b)
    a = randn((9, 9), nbx.float32, device, g)
    ref = to64(a) + to64(a).T
    a.add_(a.T)
    assert_close(a, ref, nbx.float32)


def test_refusals_survive_the_cache(device):
    g = rng()
    f, f2 = _fresh_pair((8,), (8,), nbx.float32, device, g)
    i, i2 = _fresh_pair((8,), (8,), nbx.int32, device, g)
    bo, bo2 = _fresh_pair((8,), (8,), nbx.bool, device, g)
    for _ in range(2):
        f + f2
        f.add_(f2)
        i.add_(i2)
        i8 = randn((8,), nbx.int8, device, g)
        i8 + 1
        i8.add_(1)
        f + randn((8,), nbx.float32, device, g)
        bo & bo2
        i.sub_(i2)
        randn((3, 8), nbx.float32, device, g).add_(1.0)   # same shape as the view below
    with pytest.raises(ValueError, match="broadcast"):
        f + randn((9,), nbx.float32, device, g)
    with pytest.raises(TypeError, match="can't be cast"):
        i.add_(f)                                   # float result into an int tensor
    with pytest.raises(OverflowError):
        i8 + 1000
    with pytest.raises(OverflowError):
        i8.add_(1000)
    with pytest.raises(TypeError):
        bo - bo2                                    # bool subtraction
    with pytest.raises(TypeError):
        f & f2                                      # bitwise on floats
    with pytest.raises(ValueError, match="overlapping"):
        f.expand(3, 8).add_(1.0)                     # in place into a broadcast view
    with pytest.raises(ValueError, match="shape"):
        randn((8,), nbx.float32, device, g).add_(randn((2, 8), nbx.float32, device, g))
    if device != "cpu":
        with pytest.raises(ValueError, match="device"):
            f + randn((8,), nbx.float32, "cpu", g)
        # a 0-dim tensor from another device acts as a number (torch)
        s = nbx.tensor(2.0)
        assert_close(f * s, to64(f) * 2.0, nbx.float32)


def test_reduction_repeated_calls_and_refusals(device):
    g = rng()
    for _ in range(3):
        x = randn((5, 67), nbx.float32, device, g)
        assert_close(nbx.sum(x, -1), to64(x).sum(-1), nbx.float32, rtol=1e-5, atol=1e-5)
        assert_close(x.amax(-1), to64(x).max(-1), nbx.float32)
        assert np.array_equal(x.argmax(-1).numpy(), to64(x).argmax(-1))
        assert tuple(x.sum(1, keepdim=True).shape) == (5, 1)
        assert tuple(x.sum(1).shape) == (5,)
        assert_close(x.mean(), to64(x).mean(), nbx.float32, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError):
        x.sum(True)                    # bool dim, though dim=1 is cached (True == 1)
    with pytest.raises(IndexError):
        x.sum(2)
    with pytest.raises(ValueError, match="shape"):
        nbx.sum(x, -1, out=nbx.empty((4,), device=device))
    out = nbx.empty((5,), device=device)
    assert nbx.sum(x, -1, out=out) is out
    assert_close(out, to64(x).sum(-1), nbx.float32, rtol=1e-5, atol=1e-5)


def test_launch_plans_follow_the_layout(device):
    """The same op, dtypes and shape in different layouts (contiguous, transposed, broadcast,
    sliced), interleaved and repeated: each call gets the plan of its own layout."""
    g = rng()
    for _ in range(2):
        m = randn((33, 33), nbx.float32, device, g)
        v = randn((33,), nbx.float32, device, g)
        big = randn((33, 66), nbx.float32, device, g)
        m64, v64, big64 = to64(m), to64(v), to64(big)
        cases = [(m, m64), (m.T, m64.T), (v.expand(33, 33), np.broadcast_to(v64, (33, 33))),
                 (big[:, ::2], big64[:, ::2]), (big[:, 1::2].T, big64[:, 1::2].T)]
        for x, x64 in cases:
            for y, y64 in cases:
                assert_close(x * y, x64 * y64, nbx.float32)
            assert_close(nbx.exp(x), np.exp(x64), nbx.float32)
            assert_close(x.sum(0), x64.sum(0), nbx.float32, rtol=1e-5, atol=1e-5)


# ------------------------------------------- softmax / linear plans (ops/nn.py, ops/linalg.py)

@pytest.fixture
def nan_outputs(monkeypatch):
    """The plans allocate through tensor.new_contiguous: start those outputs as NaN too, so an
    element the cached path fails to write shows."""
    from nbxtensor.ops import linalg, nn
    from nbxtensor.tensor import new_contiguous

    def poisoned_new(shape, stride, dtype, device, nbytes):
        t = new_contiguous(shape, stride, dtype, device, nbytes)
        if nbytes and dtype.is_floating_point:
            t.fill_(float("nan"))
        return t
    monkeypatch.setattr(nn, "new_contiguous", poisoned_new)
    monkeypatch.setattr(linalg, "new_contiguous", poisoned_new)


def _softmax64(x64, d, log):
    m = x64.max(axis=d, keepdims=True)
    e = np.exp(x64 - m)
    s = e.sum(axis=d, keepdims=True)
    return (x64 - m - np.log(s)) if log else e / s


def test_softmax_plans_follow_shape_dtype_stride_dim_and_device(device, nan_outputs):
    """Interleaved calls that share all but one of (shape, dtype, strides, dim, dtype=, log,
    device): each must get its own plan, never the one a similar call left behind."""
    g = rng()
    other = "cpu" if device != "cpu" else "interp"
    for _ in range(3):      # the first round fills the plans, later rounds use them
        base = randn((3, 65), nbx.float32, device, g)            # 65 = 64 + 1: overhangs a block
        wide = randn((3, 66), nbx.float32, device, g)
        f64 = randn((3, 65), nbx.float64, device, g)
        bf = randn((3, 65), nbx.bfloat16, device, g)
        big = randn((65, 6), nbx.float32, device, g)
        cube = randn((2, 3, 5), nbx.float32, device, g)
        tall = randn((65, 3), nbx.float32, device, g)     # .T: base's shape, other strides
        ints = randn((3, 65), nbx.int32, device, g)
        cases = [(base, -1), (base, 0), (base, 1), (wide, -1), (f64, -1), (bf, -1),
                 (tall.T, -1), (tall.T, 0), (big.T, -1), (big[::2].T, 0), (big[1:], 1),   # transposed, strided, offset
                 (cube.permute(2, 0, 1), 1),                      # rows not viewable: copies first
                 (nbx.empty((0, 65), device=device), -1)]
        for x, d in cases:
            for log in (False, True):
                fn = nbx.log_softmax if log else nbx.softmax
                y = fn(x, d)
                assert y.dtype is x.dtype and y.device == x.device and tuple(y.shape) == tuple(x.shape)
                tol = 2e-2 if x.dtype is nbx.bfloat16 else 1e-5
                assert_close(y, _softmax64(to64(x), d, log), x.dtype, rtol=tol, atol=tol)
        y = nbx.softmax(base, -1, dtype=nbx.float64)                  # dtype= after dtype=None
        assert y.dtype is nbx.float64
        assert_close(y, _softmax64(to64(base), -1, False), nbx.float64, rtol=1e-6, atol=1e-6)
        y = nbx.softmax(ints, -1, dtype=nbx.float32)
        assert_close(y, _softmax64(to64(ints), -1, False), nbx.float32, rtol=1e-5, atol=1e-5)
        xo = nbx.tensor(base.numpy(), device=other)                   # same key but the device
        y = nbx.softmax(xo, -1)
        assert y.device == xo.device
        assert_close(y, _softmax64(to64(base), -1, False), nbx.float32, rtol=1e-5, atol=1e-5)
        # refusals after the plans are warm
        with pytest.raises(TypeError, match="floating"):
            nbx.softmax(ints, -1)
        with pytest.raises(IndexError):
            nbx.softmax(base, 2)
        with pytest.raises(TypeError):
            nbx.softmax(base, True)
        with pytest.raises(TypeError, match="dim"):
            nbx.softmax(base)


def test_linear_plans_follow_shape_dtype_stride_bias_activation_and_device(device, nan_outputs):
    g = rng()
    other = "cpu" if device != "cpu" else "interp"

    def ref(x, w, b=None, act=None):
        y = to64(x) @ to64(w).T + (0 if b is None else to64(b))
        if act == "relu":
            y = np.maximum(y, 0)
        elif act == "silu":
            y = y / (1 + np.exp(-y))
        return y
    for _ in range(3):
        x = randn((5, 33), nbx.float32, device, g)
        x3 = randn((2, 3, 33), nbx.float32, device, g)
        w = randn((17, 33), nbx.float32, device, g)
        wT = randn((33, 17), nbx.float32, device, g).T                # same shape, other strides
        b = randn((17,), nbx.float32, device, g)
        x64, w64, b64 = (randn(s, nbx.float64, device, g) for s in ((5, 33), (17, 33), (17,)))
        wide = randn((6, 33), nbx.float32, device, g)
        big = randn((7, 40), nbx.float32, device, g)
        tol = dict(rtol=1e-4, atol=1e-4)
        cases = [(x, w, None, None), (x, w, b, None), (x, w, b, "relu"), (x, w, None, "silu"),
                 (x, wT, None, None), (wide, w, b, None), (x3, w, b, None),
                 (x3.transpose(0, 1), w, None, None),    # batch does not fold: full path
                 (big[1:6, 2:35], w, None, None),         # offset + row stride 40
                 (x64, w64, b64, None), (x[:0], w, b, None)]
        for xi, wi, bi, act in cases:
            y = nbx.linear(xi, wi, bi, activation=act)
            assert tuple(y.shape) == tuple(xi.shape[:-1]) + (17,) and y.dtype is xi.dtype
            assert_close(y, ref(xi, wi, bi, act), xi.dtype, **tol)
        y = nbx.linear(x[0], w, b)                                    # 1-D input: full path
        assert_close(y, ref(x[0], w, b), nbx.float32, **tol)
        xo, wo = nbx.tensor(x.numpy(), device=other), nbx.tensor(w.numpy(), device=other)
        y = nbx.linear(xo, wo)
        assert y.device == xo.device
        assert_close(y, ref(x, w), nbx.float32, **tol)
        # refusals after the plans are warm
        with pytest.raises(ValueError, match="bias"):
            nbx.linear(x, w, randn((18,), nbx.float32, device, g))
        with pytest.raises(TypeError, match="dtype"):
            nbx.linear(x, w, b64)
        with pytest.raises(TypeError, match="dtype"):
            nbx.linear(x, w64)
        with pytest.raises(ValueError, match="features"):
            nbx.linear(randn((5, 32), nbx.float32, device, g), w)
        with pytest.raises(ValueError, match="device|on"):
            nbx.linear(x, wo)
        with pytest.raises(ValueError, match="activation"):
            nbx.linear(x, w, activation="tanh")


def test_linear_plan_follows_the_fp32_precision(device, monkeypatch):
    """The precision handed to the matmul impl changes with set_float32_matmul_precision even
    after a plan for the same operands exists."""
    from nbxtensor.ops import linalg
    seen = []
    real = linalg.impl

    def spy(name, dev):
        fn = real(name, dev)
        if name != "matmul":
            return fn

        def wrapped(*a, **kw):
            seen.append(kw["precision"])
            return fn(*a, **kw)
        return wrapped
    monkeypatch.setattr(linalg, "impl", spy)
    g = rng()
    x, w = randn((3, 9), nbx.float32, device, g), randn((5, 9), nbx.float32, device, g)
    prev = nbx.get_float32_matmul_precision()
    try:
        for p in ("highest", "highest", "high", "high", "highest"):
            nbx.set_float32_matmul_precision(p)
            nbx.linear(x, w)
    finally:
        nbx.set_float32_matmul_precision(prev)
    assert seen == ["ieee", "ieee", "tf32", "tf32", "ieee"]
