"""Casts between every pair of dtypes on every device, bit-exact against NumPy/ml_dtypes.

The reference is `ndarray.astype` (ml_dtypes for bf16/fp8) under the documented rule in
dtypes.py: round to nearest even, overflow to inf (NaN for e4m3fn), float -> int
truncates, and bf16/fp8 are reached from float32 only (float64, int32 and int64 sources
round to float32 first: ml_dtypes >= 0.7 itself rounds them directly, so the reference
says it). Values whose int conversion is unspecified (NaN, inf, out of range) are kept
out of float -> int pairs.
"""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import nbxtensor as nbx
from helpers import poisoned, rng

# NumPy and the interpreter warn on overflowing casts / division by zero, which the
# tests provoke on purpose
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

ALL = list(nbx.all_dtypes)
N = 1500        # > the strided block (1024), and an odd tail for the flat block


def _specials(d):
    """Edge values of float dtype d: zeros, inf, NaN, max, tiny, subnormals, midpoints."""
    fi = ml_dtypes.finfo(d.np)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, float(fi.max), -float(fi.max), float(fi.tiny),
            float(fi.smallest_subnormal), 1.0, -1.0]
    return np.array(vals, np.float64)


def _midpoints(target):
    """Values exactly halfway between neighbours of `target` (rounding ties) and just past them."""
    if target.itemsize == 1:
        allv = np.arange(256, dtype=np.uint8).view(target.np).astype(np.float64)
    else:
        g = rng()
        bits = g.integers(0, 2**16, 4000).astype(np.uint16)
        allv = bits.view(target.np).astype(np.float64)
    allv = np.unique(allv[np.isfinite(allv)])
    mids = (allv[:-1] + allv[1:]) / 2
    return np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                           allv[-1:] * 1.0625, allv[-1:] * 1.2])


def _source_values(src, dst, n):
    g = rng()
    if src.kind == "b":
        return g.random(n) < 0.5
    if src.kind in "ui":
        info = np.iinfo(src.np)
        if dst.kind == "f" or dst.kind == "b" or dst.itemsize >= src.itemsize:
            lo, hi = info.min, info.max
        else:
            lo, hi = info.min, info.max  # int -> narrower int wraps (two's complement)
        v = g.integers(lo, hi, n, endpoint=True, dtype=np.int64 if src.np != np.uint8 else np.int64)
        if dst is nbx.bfloat16 and src.itemsize >= 4:
            # ints half a float32 ulp above a bf16 tie: float32 rounds them onto the tie,
            # which then goes to the even neighbour; a direct rounding always goes up
            k = g.integers(0, 2 ** 7, 64) * 2 + 1                  # odd: a bf16 tie
            for e in (24, 25, 30):
                ties = 2 ** e + k * 2 ** (e - 8) + 2 ** (e - 24)
                ties = ties[ties <= info.max]
                v = np.concatenate([v, ties, -ties])
        return v.astype(src.np)
    # float source
    mag = 10.0 ** g.uniform(-12, 6, n)
    v = g.standard_normal(n) * mag
    if dst.kind == "f":
        v = np.concatenate([_specials(src), _midpoints(dst) if dst.itemsize <= 2 else [], v])
        if src.itemsize < 8:
            with np.errstate(all="ignore"):
                v = v.astype(np.float32)
    else:
        # float -> int: in-range values only (others are unspecified by the cast rule)
        if dst.kind == "b":
            v = np.concatenate([_specials(src), v])
        else:
            info = np.iinfo(dst.np)
            hi = min(float(info.max), float(ml_dtypes.finfo(src.np).max))
            lo = max(float(info.min), -hi) if dst.kind == "i" else 0.0
            v = np.concatenate([g.uniform(lo, hi, n // 2), np.clip(v, lo, hi),
                                [0.0, -0.0, 0.5, -0.5, 0.99, lo, hi]])
            v = np.clip(v, lo, hi)
    with np.errstate(all="ignore"):
        out = v.astype(src.np)
    if dst.kind in "ui" and src.kind == "f":
        # rounding into the source dtype may step just outside the target's range
        info = np.iinfo(dst.np)
        f = out.astype(np.float64)
        out = out[(f >= info.min) & (f < float(info.max) + 1) & np.isfinite(f)]
        if dst.kind == "u":
            out = out[out.astype(np.float64) > -1]
    return out


def _reference(a, dst):
    with np.errstate(all="ignore"):
        if dst.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2") and \
                a.dtype in (np.float64, np.int64, np.int32):
            a = a.astype(np.float32)
        return a.astype(dst.np)


def _assert_bits_equal(actual, expected, what):
    assert actual.dtype == expected.dtype, what
    if actual.dtype.kind == "f" or actual.dtype in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
                                                   ml_dtypes.float8_e5m2):
        a64 = actual.astype(np.float64)
        e64 = expected.astype(np.float64)
        nan_a, nan_e = np.isnan(a64), np.isnan(e64)
        bad = (nan_a != nan_e) | (~nan_e & (a64 != e64))
        # signed zeros must match too
        bad |= ~nan_e & (np.signbit(a64) != np.signbit(e64))
    else:
        bad = actual != expected
    if bad.any():
        i = np.flatnonzero(bad)[:8]
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} differ; first at {i}: got "
                             f"{actual.reshape(-1)[i]}, expected {expected.reshape(-1)[i]}")


@pytest.mark.parametrize("src,dst", list(itertools.product(ALL, ALL)),
                         ids=lambda d: d.name)
def test_cast_every_pair(device, src, dst):
    a = _source_values(src, dst, N)
    t = nbx.tensor(a, device=device)
    out = poisoned(t.shape, dst, device)
    out.copy_(t)
    _assert_bits_equal(out.numpy(), _reference(a, dst), f"{src.name} -> {dst.name} on {device}")
    # .to() as the public spelling
    _assert_bits_equal(t.to(dst).numpy(), _reference(a, dst), f"to({dst.name}) on {device}")


@pytest.mark.parametrize("src,dst", [(nbx.float32, nbx.bfloat16), (nbx.float64, nbx.float8_e4m3fn),
                                     (nbx.bfloat16, nbx.int32), (nbx.int64, nbx.float16),
                                     (nbx.float8_e5m2, nbx.float32), (nbx.bool, nbx.float32),
                                     (nbx.float32, nbx.float32)], ids=str)
def test_cast_strided_broadcast_0dim_empty(device, src, dst):
    g = rng()
    base = _source_values(src, dst, 4 * 37 * 5)
    base = base[: (base.size // 185) * 185][:185 * 4].reshape(4, 37, 5) if base.size >= 740 else \
        np.resize(base, (4, 37, 5))
    t = nbx.tensor(base, device=device)
    # transposed, sliced view
    v = t.permute(2, 0, 1)[:, 1:, ::3]
    out = poisoned(v.shape, dst, device)
    out.copy_(v)
    _assert_bits_equal(out.numpy(), _reference(base.transpose(2, 0, 1)[:, 1:, ::3], dst), "strided")
    # strided destination
    big = poisoned((5, 8, 13), dst, device)
    dview = big[:, ::2, 1::2]
    src2 = nbx.tensor(np.resize(base, dview.shape), device=device)
    dview.copy_(src2)
    full = big.numpy()
    _assert_bits_equal(full[:, ::2, 1::2], _reference(np.resize(base, dview.shape), dst), "dst view")
    assert np.isnan(full[:, 1::2].astype(np.float64)).all() if dst.kind == "f" else True
    # broadcast source (stride 0)
    row = nbx.tensor(base[0, 0], device=device)            # shape (5,)
    out = poisoned((33, 5), dst, device)
    out.copy_(row)
    _assert_bits_equal(out.numpy(), _reference(np.broadcast_to(base[0, 0], (33, 5)), dst), "bcast")
    # 0-dim source broadcast, 0-dim destination, empty
    s = nbx.tensor(np.asarray(base.reshape(-1)[3]), device=device)
    out = poisoned((7, 3), dst, device)
    out.copy_(s)
    _assert_bits_equal(out.numpy(), _reference(np.full((7, 3), base.reshape(-1)[3]), dst), "0-dim")
    o0 = poisoned((), dst, device)
    o0.copy_(s)
    _assert_bits_equal(o0.numpy(), _reference(base.reshape(-1)[3], dst), "0-dim dst")
    e = nbx.empty((0, 3), dtype=src, device=device)
    assert e.to(dst).shape == (0, 3)
    del g


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_fill_every_dtype(device, dtype):
    values = [True, 0, 1, 7, -3, 2.5, -0.0, 1e30, float("inf"), float("nan"), 0.1]
    for v in values:
        if dtype.kind in "ui" and (isinstance(v, float) and (not np.isfinite(v) or abs(v) > 100)):
            continue
        if dtype.kind == "u" and isinstance(v, (int, float)) and v < 0:
            continue
        out = poisoned((3, 1100), dtype, device)
        view = out[:, 1::2]
        view.fill_(v)
        with np.errstate(all="ignore"):
            want = np.asarray(v).astype(dtype.np)
        got = out.numpy()
        _assert_bits_equal(got[:, 1::2], np.broadcast_to(want, got[:, 1::2].shape).copy(),
                           f"fill {v!r} {dtype.name}")
        _assert_bits_equal(got[:, ::2], poisoned((3, 550), dtype, "cpu").numpy(), "untouched")


def test_contiguous_clone_zeros(device):
    g = rng()
    a = g.standard_normal((65, 33)).astype(np.float32)
    t = nbx.tensor(a, device=device)
    np.testing.assert_array_equal(t.T.contiguous().numpy(), a.T)
    np.testing.assert_array_equal(t[::2].clone().numpy(), a[::2])
    assert (nbx.zeros(5000, device=device).numpy() == 0).all()
    assert (nbx.ones(3, 4, dtype=nbx.bfloat16, device=device).numpy().astype(float) == 1).all()


def test_cross_device_copy(device):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = nbx.tensor(a, device="cpu")
    d = nbx.empty((3, 4), dtype=nbx.bfloat16, device=device)
    d.copy_(t)
    np.testing.assert_array_equal(d.numpy().astype(np.float32), a)
