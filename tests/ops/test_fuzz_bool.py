"""Fuzz: every op that asks "is x non-zero?" answers x != 0, on every device and dtype.

A value's truth is not its integer part: 0.5 and -0.25 are True, NaN is True, a subnormal
is True, -0.0 is False, and 2**32 is True whatever width a kernel accumulates in. Each case
draws a fresh seeded mixture of such values (in proportions that vary per case, so that
all() and any() both come out mixed), in a random layout (contiguous, sliced with a step,
transposed) and a size that overhangs interp's blocks, then checks the reductions, the
casts, the logical ops and the ops that take a mask against float64 NumPy.
"""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng

FLOATS = [nbx.float32, nbx.float16, nbx.bfloat16, nbx.float64]
FLOAT8 = [nbx.float8_e4m3fn, nbx.float8_e5m2]
INTS = [nbx.int64, nbx.int32, nbx.int16, nbx.int8, nbx.uint8, nbx.bool]
SIZES = [1, 2, 7, 33, 65, 130]          # interp's reduction/element-wise blocks are <= 64
N_CASES = 4                             # per device and dtype group; each case draws anew
MAX_NUMEL = 400


def _values(g, shape, dtype):
    """An array of dtype whose truth is the point: fractions of (-1, 1), +-0.0, NaN, +-inf,
    subnormals of dtype; for integer dtypes 0, +-1 and values past 32 bits where they fit."""
    if dtype.kind == "b":
        return g.random(shape) < g.choice([0.01, 0.5, 0.99])
    zero = g.random(shape) < g.choice([0.0, 0.02, 0.3, 0.9])
    if dtype.kind in "ui":
        info = np.iinfo(dtype.np)
        pool = np.array([v for v in (1, -1, 2 ** 32, -2 ** 63, 2 ** 40 + 1, 2 ** 31, info.min,
                                     info.max, 3) if info.min <= v <= info.max and v != 0],
                        dtype=dtype.np)
        return np.where(zero, np.zeros((), dtype.np), g.choice(pool, shape))
    tiny = float(nbx.finfo(dtype).tiny) / 4
    specials = np.array([np.nan, np.inf, -np.inf, tiny, -tiny, 3.0, -1000.0])
    v = g.uniform(-0.999, 0.999, shape)
    v = np.where(g.random(shape) < 0.15, g.choice(specials, shape), v)
    return np.where(zero, np.where(g.random(shape) < 0.5, 0.0, -0.0), v).astype(dtype.np)


def _layout(g, shape):
    """A base shape and a function taking the view of `shape` from a NumPy array or a
    Tensor of that base shape: contiguous, sliced with a step, or transposed."""
    kind = g.choice(["contig", "step", "transpose"]) if len(shape) >= 1 else "contig"
    if kind == "step":
        base = tuple(2 * n + 1 for n in shape)
        sl = tuple(slice(1, 1 + 2 * n, 2) for n in shape)
        return base, lambda t: t[sl]
    if kind == "transpose" and len(shape) >= 2:
        base = tuple(reversed(shape))
        perm = tuple(reversed(range(len(shape))))
        return base, lambda t: (t.transpose(perm) if isinstance(t, np.ndarray)
                                else t.permute(perm))
    return tuple(shape), lambda t: t


def _case(g, dtype, device):
    """(x on device, its values as float64 NumPy) for a fresh random shape and layout."""
    shape = ()
    for _ in range(g.integers(1, 4)):       # at most MAX_NUMEL elements: interp is slow
        shape += (int(g.choice([s for s in SIZES if s * max(1, np.prod(shape)) <= MAX_NUMEL])),)
    base, view = _layout(g, shape)
    host = _values(g, base, dtype)
    x = view(nbx.tensor(host, device=device))
    a = view(host).astype(np.float64)
    assert tuple(x.shape) == a.shape
    return x, a


def _dims(g, ndim):
    r = g.integers(0, 4)
    if r == 0:
        return None
    if r == 1:
        return int(g.integers(-ndim, ndim))
    k = int(g.integers(1, ndim + 1))
    return tuple(int(d) for d in g.choice(ndim, k, replace=False))


def _ax(dims, ndim):
    if dims is None:
        return tuple(range(ndim))
    return tuple(d % ndim for d in (dims if isinstance(dims, tuple) else (dims,)))


def _eq(t, ref, what):
    got = t.numpy() if isinstance(t, nbx.Tensor) else np.asarray(t)
    np.testing.assert_array_equal(got, ref, err_msg=what)


def _check_reductions(g, x, nz):
    for _ in range(2):
        dims, keepdim = _dims(g, nz.ndim), bool(g.integers(0, 2))
        ax = _ax(dims, nz.ndim)
        what = f"dims={dims} keepdim={keepdim} shape={nz.shape}"
        r = nbx.any(x, dims, keepdim=keepdim)
        assert r.dtype is (nbx.uint8 if x.dtype is nbx.uint8 else nbx.bool)
        _eq(r, nz.any(axis=ax, keepdims=keepdim), "any " + what)
        _eq(x.all(dims, keepdim=keepdim), nz.all(axis=ax, keepdims=keepdim), "all " + what)
        _eq(nbx.count_nonzero(x, dims), nz.sum(axis=ax), "count_nonzero " + what)
    _eq(nbx.nonzero(x), np.argwhere(nz), "nonzero")
    for t, ref in zip(nbx.nonzero(x, as_tuple=True), np.nonzero(nz)):
        _eq(t, ref, "nonzero(as_tuple=True)")


def _check_casts_and_logic(g, x, nz, device):
    _eq(x.bool(), nz, ".bool()")
    _eq(x.to(nbx.bool), nz, ".to(bool)")
    _eq(nbx.logical_not(x), ~nz, "logical_not")
    # the other operand of any dtype (truth survives promotion, which only widens); float8
    # promotes with nothing, as in torch
    other_dt = x.dtype if x.dtype.is_float8 else g.choice(FLOATS + [nbx.int64, nbx.bool])
    y, b = _case_like(g, nz.shape, other_dt, device)
    nzb = b != 0
    _eq(nbx.logical_and(x, y), nz & nzb, f"logical_and with {other_dt}")
    _eq(nbx.logical_or(x, y), nz | nzb, f"logical_or with {other_dt}")
    _eq(nbx.logical_xor(y, x), nz ^ nzb, f"logical_xor with {other_dt}")
    if nz.size == 1:
        assert bool(x) is bool(nz.reshape(()))


def _case_like(g, shape, dtype, device):
    host = _values(g, shape, dtype)
    return nbx.tensor(host, device=device), host.astype(np.float64)


def _check_masks(x, nz, device):
    m = x.bool()
    ones = nbx.ones(nz.shape, dtype=nbx.float32, device=device)
    zeros = nbx.zeros(nz.shape, dtype=nbx.float32, device=device)
    _eq(nbx.where(m, ones, zeros), nz.astype(np.float32), "where(x.bool(), 1, 0)")
    _eq(zeros.masked_fill(m, 1.0), nz.astype(np.float32), "masked_fill(x.bool())")
    idx = nbx.arange(nz.size, dtype=nbx.int64, device=device).reshape(nz.shape)
    _eq(nbx.masked_select(idx, m), np.arange(nz.size).reshape(nz.shape)[nz], "masked_select")
    _eq(nbx.cumsum(m.reshape(-1), 0), np.cumsum(nz.reshape(-1)), "cumsum of x.bool()")


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
def test_truth_of_reductions(device, dtype):
    g = rng()
    for _ in range(N_CASES):
        x, a = _case(g, dtype, device)
        _check_reductions(g, x, a != 0)


@pytest.mark.parametrize("dtype", FLOATS + FLOAT8, ids=str)
def test_truth_of_casts_logic_and_masks(device, dtype):
    g = rng()
    for _ in range(N_CASES // 2):
        x, a = _case(g, dtype, device)
        nz = a != 0
        _check_casts_and_logic(g, x, nz, device)
        _check_masks(x, nz, device)


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_reductions_are_refused(device, dtype):
    x = nbx.tensor(np.array([0.5, -0.0, np.nan]).astype(dtype.np), device=device)
    for f in (nbx.any, nbx.all, nbx.count_nonzero, nbx.nonzero):
        with pytest.raises(TypeError, match="float8"):
            f(x)


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16, nbx.int64])
def test_non_bool_masks_are_refused(device, dtype):
    """torch refuses a mask or condition that is not bool: a float one would raise the
    question of its truth, so it is refused, naming the argument."""
    x = nbx.tensor(np.array([0.5, 0.0, 2.0]).astype(dtype.np), device=device)
    v = nbx.zeros(3, device=device)
    with pytest.raises(TypeError, match="condition"):
        nbx.where(x, v, v)
    with pytest.raises(TypeError, match="mask"):
        v.masked_fill(x, 1.0)
    with pytest.raises(TypeError, match="mask"):
        nbx.masked_select(v, x)
