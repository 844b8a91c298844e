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
from helpers import assert_close, poisoned, randn, rng, to64
from nbxtensor import plans


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


# ------------------ launch plans of kernels/elementwise.run, kernels/reduction.reduce, gemv
# Each test interleaves calls that share all but one part of a plan's key, into NaN-poisoned
# outputs, against float64 NumPy, for several rounds (the first fills the plans, later ones
# hit them). A spy on the kernels' launch_items shows the switches that do not change values.

def _items_spy(monkeypatch, mod, attr="launch_items"):
    """Record (kernel name, dict of constexprs) of every launch_items call that module mod
    makes through its attribute `attr`."""
    seen = []
    real = getattr(mod, attr)

    def spy(kernel, grid, args, items):
        seen.append((kernel.fn.__name__, dict(items)))
        return real(kernel, grid, args, items)
    monkeypatch.setattr(mod, attr, spy)
    return seen


def test_elementwise_plans_follow_every_key(device, poison_outputs, monkeypatch):
    """kernels/elementwise.run's plans: op, out dtype, out strides, out offset, input dtype,
    input strides, input shape (broadcast), tensor vs number operand and its class, params
    and IDX64_LIMIT."""
    if device == "cpu":
        pytest.skip("the triton path's plans")
    from nbxtensor.kernels import elementwise as ew
    seen = _items_spy(monkeypatch, ew)
    plans.clear_all()    # the first call of each key below is the one this test made
    g = rng()
    f32 = nbx.float32
    for rnd in range(3):
        x = randn((5, 67), f32, device, g)           # 67: overhangs the 2-D 64-wide tile
        y = randn((5, 67), f32, device, g)
        xt = randn((67, 5), f32, device, g).T         # x's shape, other strides
        row = randn((67,), f32, device, g)            # broadcast: stride 0 along dim 0
        xb = randn((5, 67), nbx.bfloat16, device, g)
        xi = randn((5, 67), nbx.int32, device, g, low=-50, high=50)
        big = randn((6, 67), f32, device, g)
        X, Y, XT, R, XB, XI, BIG = map(to64, (x, y, xt, row, xb, xi, big))
        rb = lambda a: a.astype(nbx.bfloat16.np).astype(np.float64)  # noqa: E731
        for _ in range(2):      # each pair differs from its neighbour in one key
            # first (the plans start empty): a raw-moved (bf16) input or output, whose
            # plan must not serve the same call with float32 there
            assert_close(x + xb, X + XB, f32)
            assert_close(x + y, X + Y, f32)
            o = poisoned((5, 67), nbx.bfloat16, device)
            assert_close(nbx.add(x, y, out=o), rb(X + Y), nbx.bfloat16)
            assert_close(x + y, X + Y, f32)
            assert_close(x * y, X * Y, f32)                           # op
            o = poisoned((5, 67), nbx.float64, device)
            assert_close(nbx.add(x, y, out=o), X + Y, f32)            # out dtype
            o = poisoned((67, 5), f32, device).T
            assert_close(nbx.add(x, y, out=o), X + Y, f32)            # out strides
            o = poisoned((6, 67), f32, device)
            nbx.add(x, y, out=o[1:])                                  # out offset
            assert_close(o[1:], X + Y, f32)
            assert np.isnan(o[:1].numpy()).all()
            assert_close(x + xt, X + XT, f32)                         # input strides
            assert_close(x + row, X + R, f32)                         # input shape
            assert_close(x + big[1:], X + BIG[1:], f32)               # input offset
            assert_close(x + xb, X + XB, f32)                         # input dtype
            assert_close(x + 2.5, X + 2.5, f32)                       # number operand
            assert_close(xi + 3, XI + 3, nbx.int32)                   # int tensor + int
            assert_close(xi + 0.5, XI + 0.5, f32)                     # ... + float: promoted
            assert_close(xb * xb, rb(XB * XB), nbx.bfloat16)          # raw-moved operands
            assert_close(x.add(y, alpha=2.0), X + 2 * Y, f32)         # params per call
            assert_close(x.add(y, alpha=-3.0), X - 3 * Y, f32)
            assert_close(nbx.where(x > 0, x, 1.5), np.where(X > 0, X, 1.5), f32)
            c = poisoned((5, 67), nbx.bfloat16, device)
            c.copy_(x)                                                # cast path
            assert_close(c, X, nbx.bfloat16)
            c = poisoned((5, 67), nbx.float16, device)
            c.copy_(x)                                                # out dtype
            assert_close(c, X, nbx.float16)
            c = poisoned((67, 5), f32, device).T
            c.copy_(x)                                                # bit copy, strided
            np.testing.assert_array_equal(to64(c), X)
        # IDX64_LIMIT: the same call takes int64 offsets once the limit is below n
        seen.clear()
        assert_close(x + y, X + Y, f32)
        assert seen[-1][1]["IDX64"] is False
        monkeypatch.setattr(ew, "IDX64_LIMIT", 64)
        assert_close(x + y, X + Y, f32)
        assert seen[-1][1]["IDX64"] is True
        monkeypatch.setattr(ew, "IDX64_LIMIT", 2**31)


def test_reduction_plans_follow_every_key(device, poison_outputs, monkeypatch):
    """kernels/reduction.reduce's plans: kind, input dtype, shape, strides, offset, dims,
    values/indices outputs, the per-call mean scale, and PIPE; and the ops
    layer's plans (ops/reduction.py: op, dtype, shape, dim, keepdim), on every device."""
    from nbxtensor.kernels import reduction as rk
    from nbxtensor.ops import reduction as ored
    seen = _items_spy(monkeypatch, rk)
    shipped_pipe = rk.PIPE
    plans.clear_all()
    g = rng()
    f32 = nbx.float32
    tol = dict(rtol=1e-5, atol=1e-5)
    try:
        for rnd in range(3):
            x = randn((5, 67), f32, device, g)       # 67 > the interp row block (32): overhangs
            xt = randn((67, 5), f32, device, g).T
            big = randn((6, 67), f32, device, g)
            x64 = randn((5, 67), nbx.float64, device, g)
            xb = randn((5, 67), nbx.bfloat16, device, g)
            xi = randn((5, 67), nbx.int32, device, g, low=-50, high=50)
            narrow = randn((5, 66), f32, device, g)
            X, XT, BIG, X64, XB, XI, NW = map(to64, (x, xt, big, x64, xb, xi, narrow))
            sq = randn((33, 33), f32, device, g)
            SQ = to64(sq)
            for _ in range(2):
                # first (the plans start empty): a plan that must not serve the next call
                s = xi.sum(-1)                                              # int64 accumulator
                assert s.dtype is nbx.int64
                np.testing.assert_array_equal(s.numpy(), XI.sum(-1))
                assert_close(x.sum(-1), X.sum(-1), f32, **tol)              # input dtype
                assert_close(x64.sum(-1), X64.sum(-1), nbx.float64, rtol=1e-12, atol=1e-12)
                assert_close(x[:, :33].sum(-1), X[:, :33].sum(-1), f32, **tol)  # shape only
                assert_close(x.sum(-1), X.sum(-1), f32, **tol)
                assert_close(sq.sum(1), SQ.sum(1), f32, **tol)              # dims only
                assert_close(sq.sum(0), SQ.sum(0), f32, **tol)
                assert_close(x.amax(-1), X.max(-1), f32)                  # kind
                assert_close(x.mean(-1), X.mean(-1), f32, **tol)          # kind, scale
                assert_close(narrow.mean(-1), NW.mean(-1), f32, **tol)    # shape, scale
                assert_close(x.sum(0), X.sum(0), f32, **tol)              # dims
                assert_close(x.sum(), X.sum(), f32, **tol)
                assert_close(xt.sum(-1), XT.sum(-1), f32, **tol)          # strides
                assert_close(big[1:].sum(-1), BIG[1:].sum(-1), f32, **tol)  # offset
                assert_close(big[:, 1:].sum(-1), BIG[:, 1:].sum(-1), f32, **tol)
                assert_close(x64.sum(-1), X64.sum(-1), nbx.float64, **tol)  # dtype
                assert_close(xb.sum(-1), XB.sum(-1), nbx.bfloat16, rtol=2e-2, atol=5e-2)
                s = xi.sum(-1)
                assert s.dtype is nbx.int64
                np.testing.assert_array_equal(s.numpy(), XI.sum(-1))
                assert np.array_equal(x.argmax(-1).numpy(), X.argmax(-1))   # indices only
                assert np.array_equal(x.argmin(-1).numpy(), X.argmin(-1))   # op
                assert np.array_equal(x.argmax(0).numpy(), X.argmax(0))     # dim
                assert x.argmax(0, keepdim=True).shape == (1, 67)           # keepdim
                assert np.array_equal(xt.argmax(-1).numpy(), XT.argmax(-1))  # strides
                v, i = x.max(-1)                                            # values + indices
                assert_close(v, X.max(-1), f32)
                assert np.array_equal(i.numpy(), X.argmax(-1))
                assert_close(x.amax(-1, keepdim=True), X.max(-1, keepdims=True), f32)
                assert x.amax(-1, keepdim=True).shape == (5, 1)               # keepdim
                assert x.amax(-1).shape == (5,)
                assert_close(x.amin(-1), X.min(-1), f32)                      # op
                assert_close(x.sum(-1, dtype=nbx.float64), X.sum(-1), nbx.float64, rtol=1e-12,
                             atol=1e-12)                                      # dtype=
                assert_close(x.sum(1), X.sum(1), f32, **tol)      # warms dim=1 (True == 1)
                o = poisoned((5,), f32, device)
                assert x.sum(-1, out=o) is o                                  # out=
                assert_close(o, X.sum(-1), f32, **tol)
            # refusals after the plans are warm (same shapes as cached calls)
            with pytest.raises(TypeError):
                nbx.mean(xi, -1)                        # mean of ints; mean f32 is cached
            with pytest.raises(TypeError):
                x.sum(True)                             # a bool dim; dim=1 is cached
            with pytest.raises(IndexError):
                x.amax(2)
            with pytest.raises(IndexError):
                randn((5, 0), f32, device, g).amax(-1)  # an empty reduced dim
            with pytest.raises(TypeError, match="float8"):
                x.to(nbx.float8_e4m3fn).sum(-1)
            with pytest.raises(IndexError):
                randn((5, 0), f32, device, g).argmax(-1)
            with pytest.raises(TypeError):
                x.argmax(True)
            assert np.array_equal(x.argmax().numpy(), X.argmax())        # dim None: flattened
            e = nbx.empty((0, 67), device=device)
            assert e.sum(-1).shape == (0,) and e.sum(0).shape == (67,)
            for _ in range(2):      # the identity / NaN of an empty reduction, every time
                assert (e.sum(0).numpy() == 0).all()
                assert np.isnan(e.mean(0).numpy()).all()
            if device == "cpu":
                continue
            # PIPE: short f32 rows move to the pipelined kernel and back (None: no PIPE --
            # the shipped PIPE pipelines f32 rows too)
            short = randn((5, 20), f32, device, g)
            for pipe in ({"per_sm": 1, "only16": False}, None):
                rk.PIPE = pipe
                seen.clear()
                assert_close(short.sum(-1), to64(short).sum(-1), f32, **tol)
                assert seen[-1][0] == ("_row_pipe_kernel" if pipe else "_reduce_kernel")
    finally:
        rk.PIPE = shipped_pipe


def test_gemv_plans_follow_every_key(device, poison_outputs, monkeypatch):
    """kernels/gemv.py's plans (linear / addmm at M <= 16): M, K, N, weight strides, input
    offset, dtype, bias, residual with alpha/beta, activation, precision, TARGET_PROGRAMS
    (split-K or not)."""
    if device == "cpu":
        pytest.skip("the triton path's plans")
    from nbxtensor.kernels import gemv as kg
    plans.clear_all()
    monkeypatch.setattr(kg, "NOSPLIT_ROW_BYTES", 0)     # these short rows may split too
    seen = _items_spy(monkeypatch, kg, "_launch_items")
    g = rng()
    f32 = nbx.float32

    def lin(x, w, b=None, act=None):
        y = to64(x) @ to64(w).T + (0 if b is None else to64(b))
        if act == "relu":
            y = np.maximum(y, 0)
        return y
    tol = dict(rtol=1e-4, atol=1e-4)
    prev = nbx.get_float32_matmul_precision()
    try:
        for rnd in range(2):
            x1 = randn((1, 300), f32, device, g)    # K 300: 3 K blocks of 128 (split-K)
            x3 = randn((3, 300), f32, device, g)
            xk = randn((3, 301), f32, device, g)
            w = randn((33, 300), f32, device, g)     # N 33: overhangs BLOCK_N 32
            wk = randn((33, 301), f32, device, g)
            wt = randn((300, 33), f32, device, g).T  # w's shape, other strides
            b = randn((33,), f32, device, g)
            big = randn((4, 300), f32, device, g)
            x6 = randn((3, 600), f32, device, g)
            xb, wb = randn((3, 300), nbx.bfloat16, device, g), randn((33, 300), nbx.bfloat16,
                                                                      device, g)
            r = randn((3, 33), f32, device, g)
            for _ in range(2):
                cases = [(x1, w, None, None), (x3, w, None, None), (xk, wk, None, None),
                         (x6[:, :300], w, None, None),              # x3's shape, row stride 600
                         (x3, wt, None, None), (big[1:], w, None, None), (x3, w, b, None),
                         (x3, w, b, "relu"), (x1, wt, b, "relu")]
                for x, wi, bi, act in cases:
                    assert_close(nbx.linear(x, wi, bi, activation=act), lin(x, wi, bi, act),
                                 f32, **tol)
                assert_close(nbx.linear(xb, wb), lin(xb, wb), nbx.bfloat16, rtol=2e-2,
                             atol=2e-2)
                assert_close(nbx.linear(xb[:1], wb), lin(xb[:1], wb), nbx.bfloat16,
                             rtol=2e-2, atol=2e-2)
                # an f32 plan would still compute bf16 right: the M = 1 rule's 16-bit K
                # block (256; f32 128) shows which plan ran
                assert [kw for k, kw in seen if k == "_gemv_kernel"][-1]["BLOCK_K"] == 256
                for alpha, beta in ((1, 1), (2.0, 1), (1, -0.5), (0.5, 3.0)):
                    o = poisoned((3, 33), f32, device)
                    nbx.addmm(r, x3, w.T, alpha=alpha, beta=beta, out=o)
                    assert_close(o, alpha * lin(x3, w) + beta * to64(r), f32, **tol)
                for p in ("high", "highest"):       # interp computes both exactly: the spy
                    nbx.set_float32_matmul_precision(p)
                    # TF32 ("high" on cuda) rounds each operand to 10 mantissa bits: the error
                    # is bounded by ~2 * 2^-11 * sum |x||w| (1e-3), not by the output's size;
                    # fp32 ("highest") by its K-term accumulation (300 * 2^-24 < 2e-5)
                    err = np.abs(nbx.linear(x3, w).numpy().astype(np.float64) - lin(x3, w))
                    rel = 1e-3 if p == "high" else 2e-5
                    bound = rel * (np.abs(to64(x3)) @ np.abs(to64(w)).T) + 1e-6
                    assert (err <= bound).all(), (p, float((err / bound).max()))
                    last = [kw for k, kw in seen if k == "_gemv_kernel"][-1]
                    assert last["PRECISION"] == ("tf32" if p == "high" else "ieee")
                nbx.set_float32_matmul_precision(prev)
                # 1 program target: one K slice, one launch; else split-K in two launches;
                # the values agree, so the spy tells them apart
                for tp, want in ((1, [False]), (4 * 132, [True, None])):
                    monkeypatch.setattr(kg, "TARGET_PROGRAMS", tp)
                    for x in (x3, x1):
                        seen.clear()
                        assert_close(nbx.linear(x, w, b), lin(x, w, b), f32, **tol)
                        got = [kw["PARTIAL"] if k == "_gemv_kernel" else None
                               for k, kw in seen]
                        assert got == want, (tp, got)
                monkeypatch.setattr(kg, "TARGET_PROGRAMS", 4 * 132)
    finally:
        nbx.set_float32_matmul_precision(prev)


def test_gemv_plan_follows_autotune_reload_and_disabled(tmp_path, monkeypatch):
    """A warm gemv plan takes a newly stored tuned config after autotune.reload(), and the
    rule's inside autotune.disabled()."""
    from nbxtensor import autotune
    from nbxtensor.autotune import cache
    from nbxtensor.kernels import gemv as kg
    monkeypatch.setenv("NBX_CACHE_DIR", str(tmp_path / "nbxcache"))
    monkeypatch.delenv("NBX_AUTOTUNE", raising=False)
    autotune.reload()
    seen = []
    real = kg._launch_items

    def spy(kernel, grid, args, items):
        seen.append(dict(items)["BLOCK_N"])
        return real(kernel, grid, args, items)
    monkeypatch.setattr(kg, "_launch_items", spy)
    g = rng()
    x = randn((1, 40), nbx.float32, "interp", g)
    w = randn((24, 40), nbx.float32, "interp", g)
    ref = to64(x) @ to64(w).T
    try:
        for _ in range(2):
            assert_close(nbx.linear(x, w), ref, nbx.float32, rtol=1e-4, atol=1e-4)
        assert seen[-1] == 32                                  # the rule's M = 1 tile
        cfg = dict(BLOCK_M=1, BLOCK_N=16, BLOCK_K=128, num_warps=4, num_stages=4, TARGET=264)
        cache.store([cache.make_entry(("interp", "interp"), "gemv", (1, 24, 40), "float32",
                                      cfg, {}, {})])
        autotune.reload()
        for _ in range(2):
            assert_close(nbx.linear(x, w), ref, nbx.float32, rtol=1e-4, atol=1e-4)
            assert seen[-1] == 16
        with autotune.disabled():
            assert_close(nbx.linear(x, w), ref, nbx.float32, rtol=1e-4, atol=1e-4)
            assert seen[-1] == 32
        assert_close(nbx.linear(x, w), ref, nbx.float32, rtol=1e-4, atol=1e-4)
        assert seen[-1] == 16
    finally:
        autotune.reload()


def _ws_spy(monkeypatch, kg, on_partial=None):
    """Record (ws storage, nbytes needed) of every split-K gemv launch; `on_partial()` runs
    right after such a launch (before its reduce reads the workspace)."""
    seen = []
    real = kg._launch_items

    def spy(kernel, grid, args, items):
        real(kernel, grid, args, items)
        if kernel.fn.__name__ == "_gemv_kernel" and dict(items)["PARTIAL"]:
            M, N, split = args[6], args[7], args[10]
            seen.append((args[2]._storage, split * M * N * 4))
            if on_partial is not None:
                on_partial()
    monkeypatch.setattr(kg, "_launch_items", spy)
    return seen


def _lin64(x, w):
    return to64(x) @ to64(w).T


def test_gemv_workspaces_follow_their_key_and_are_never_shared(device, poison_outputs,
                                                                monkeypatch):
    """kernels/gemv.py keeps split-K workspaces between calls, keyed on (ws shape, device,
    stream). Interleaved calls that differ in M, N or the split each get a big enough
    workspace; a repeated key reuses its own; a call made while another call's partials
    sit in the workspace (re-entrant here, a second thread in life) gets another one."""
    if device == "cpu":
        pytest.skip("the triton path's workspaces")
    from nbxtensor.kernels import gemv as kg
    plans.clear_all()           # the gemv plans and its workspaces with them
    monkeypatch.setattr(kg, "TARGET_PROGRAMS", 4 * 132)     # split-K at these sizes
    monkeypatch.setattr(kg, "NOSPLIT_ROW_BYTES", 0)
    nested, results = [], []

    def inner():
        if nested:
            x, w = nested.pop()
            results.append((nbx.linear(x, w), _lin64(x, w)))
    seen = _ws_spy(monkeypatch, kg, inner)
    g = rng()
    f32 = nbx.float32
    tol = dict(rtol=1e-4, atol=1e-4)
    # (M, K, N): M 1 / 3, N 33 / 65, K 300 (3 K blocks) / 600 (5): each differs in one
    shapes = [(1, 300, 33), (3, 300, 33), (3, 300, 65), (3, 600, 33), (1, 600, 65)]
    by_key = {}
    for rnd in range(3):
        for M, K, N in shapes:
            x, w = randn((M, K), f32, device, g), randn((N, K), f32, device, g)
            assert_close(nbx.linear(x, w), _lin64(x, w), f32, **tol)
            st, need = seen[-1]
            assert st.nbytes >= need, ((M, K, N), st.nbytes, need)
            if rnd:     # warm: the same key's own workspace again
                assert st is by_key[(M, K, N)], (M, K, N)
            by_key[(M, K, N)] = st
    # re-entrant: the same key while the outer call's partials are in its workspace
    for M, K, N in shapes[:3]:
        x, w = randn((M, K), f32, device, g), randn((N, K), f32, device, g)
        nested.append((randn((M, K), f32, device, g), randn((N, K), f32, device, g)))
        n0 = len(seen)
        assert_close(nbx.linear(x, w), _lin64(x, w), f32, **tol)
        (outer_st, _), (inner_st, _) = seen[n0], seen[n0 + 1]
        assert inner_st is not outer_st
        got, want = results.pop()
        assert_close(got, want, f32, **tol)
        # both went back: the next two calls of this key find them
        assert_close(nbx.linear(x, w), _lin64(x, w), f32, **tol)
        assert seen[-1][0] in (outer_st, inner_st)
    assert all(len(v) <= 2 for v in kg._WS.values())
    # above the size bound (read when a plan is made): fresh workspaces, none kept
    monkeypatch.setattr(kg, "_WS_BYTES", 3 * 33 * 4 * 3 - 1)
    plans.clear_all()
    for _ in range(2):
        x, w = randn((3, 300), f32, device, g), randn((33, 300), f32, device, g)
        assert_close(nbx.linear(x, w), _lin64(x, w), f32, **tol)
        assert not kg._WS


def test_cuda_gemv_workspaces_follow_the_stream_and_skip_graph_capture(device, monkeypatch):
    """A workspace is kept per current stream, and a CUDA graph's capture neither takes a
    kept workspace nor keeps its own: eager calls between replays never touch the graph's."""
    if device != "cuda":
        pytest.skip("streams and graphs: cuda only")
    from nbxtensor.kernels import gemv as kg
    plans.clear_all()
    monkeypatch.setattr(kg, "TARGET_PROGRAMS", 4 * 132)
    seen = _ws_spy(monkeypatch, kg)
    g = rng()
    f32 = nbx.float32
    tol = dict(rtol=1e-4, atol=1e-4)
    x, w = randn((3, 600), f32, "cuda", g), randn((65, 600), f32, "cuda", g)
    s1 = nbx.cuda.Stream()
    sts = {}
    for _ in range(2):
        for name, s in (("default", None), ("s1", s1)):
            xi = randn((3, 600), f32, "cuda", g)
            nbx.cuda.synchronize()
            with nbx.cuda.stream(s):
                y = nbx.linear(xi, w)
                if s is not None:
                    s.synchronize()
            assert_close(y, _lin64(xi, w), f32, **tol)
            st = seen[-1][0]
            assert sts.setdefault(name, st) is st
    assert sts["default"] is not sts["s1"]
    # a graph of the same key on a side stream, replayed between eager calls
    nbx.linear(x, w)
    gr = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(gr):
        yg = nbx.linear(x, w)
    cap_st = seen[-1][0]
    kept = {id(t._storage) for lst in kg._WS.values() for t in lst}
    assert id(cap_st) not in kept and cap_st is not sts["default"]
    for _ in range(3):
        xn = randn((3, 600), f32, "cuda", g)
        x.copy_(xn)
        gr.replay()
        ye = nbx.linear(randn((3, 600), f32, "cuda", g), w)
        assert seen[-1][0] is not cap_st
        nbx.cuda.synchronize()
        assert_close(yg, _lin64(xn, w), f32, **tol)
        assert ye.shape == (3, 65)


def test_t_contiguous_follows_shape_strides_and_offset(device, poison_outputs):
    """Tensor.t()'s 2-D swap (no permute): shapes overhanging a block, strided and offset
    views, transposed twice; 0-/1-D are returned as they are and 3-D is refused."""
    g = rng()
    f32 = nbx.float32
    for _ in range(2):
        base = randn((66, 130), f32, device, g)
        views = [randn((64, 64), f32, device, g), randn((65, 3), f32, device, g),
                 base[1:, 2:67:2],                   # offset, row stride 130, col stride 2
                 randn((129, 5), f32, device, g).t(), randn((0, 7), f32, device, g)]
        for v in views:
            want = to64(v).T
            tv = v.t()
            assert tuple(tv.shape) == want.shape
            assert tv.stride() == (v.stride(1), v.stride(0))
            c = tv.contiguous()
            # (an empty (7, 0) reports is_contiguous() False: tensor.py's rule, not t()'s)
            assert c.is_contiguous() or not c.numel()
            assert_close(c, want, f32, rtol=0, atol=0)
            assert_close(tv.t().contiguous(), to64(v), f32, rtol=0, atol=0)
    s = randn((5,), f32, device, g)
    assert s.t() is s and randn((), f32, device, g).t().shape == ()
    with pytest.raises(ValueError, match="t: expects a tensor with <= 2 dims, got 3"):
        randn((2, 3, 4), f32, device, g).t()
