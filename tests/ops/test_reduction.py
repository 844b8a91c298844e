"""Reductions and scans vs float64 NumPy on every device.

interp runs the Triton kernels with tiny block sizes (kernels/reduction.py CONFIG), so
the shapes here overhang them (BLOCK*k+1), loop over R, and take the two-pass split path.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import assert_close, poisoned, randn, rng

F = [nbx.float32, nbx.float16, nbx.bfloat16, nbx.float64]
# (shape, dims): last dim, middle dim, several dims, all, non-run dims (permute copy)
CASES = [((65,), None), ((3, 65), -1), ((3, 65), 0), ((2, 33, 9), 1), ((2, 33, 9), (0, 1)),
         ((2, 33, 9), (1, 2)), ((2, 33, 9), (0, 2)), ((4, 1, 17), (1,)), ((1, 300), 1),
         ((1, 150, 3), 1)]


def _axis(shape, dims):
    if dims is None:
        return tuple(range(len(shape)))
    dims = dims if isinstance(dims, tuple) else (dims,)
    return tuple(d % len(shape) for d in dims)


def _sum_tol(dtype, a, axis):
    """Error bound for a sum: output rounding plus accumulation error on sum(|x|)."""
    mag = np.abs(a).sum(axis=axis) if a.size else 0
    out_r = {nbx.float32: 2e-6, nbx.float64: 1e-12}.get(dtype, float(nbx.finfo(dtype).eps))
    return out_r, 4e-6 * np.max(mag, initial=1.0)


@pytest.mark.parametrize("dtype,shape,dims",
                         [(nbx.float32, s, d) for s, d in CASES]
                         + [(dt, *CASES[i]) for dt in F[1:] for i in (1, 3, 6, 9)], ids=str)
def test_sum_mean(device, dtype, shape, dims):
    x = randn(shape, dtype, device)
    a = x.numpy().astype(np.float64)
    ax = _axis(shape, dims)
    for keepdim in (False, True):
        r = nbx.sum(x, dims, keepdim=keepdim)
        assert r.dtype is dtype
        ref = a.sum(axis=ax, keepdims=keepdim)
        rt, at = _sum_tol(dtype, a, ax)
        assert_close(r, ref, rtol=rt, atol=at)
    m = x.mean(dims)
    assert_close(m, a.mean(axis=ax), rtol=_sum_tol(dtype, a, ax)[0],
                 atol=_sum_tol(dtype, a, ax)[1] / max(1, math.prod(shape[i] for i in ax)) + 1e-6)


@pytest.mark.parametrize("shape,dims", [CASES[i] for i in (0, 2, 4, 5, 7)], ids=str)
def test_value_kinds(device, shape, dims):
    """prod, amax/amin, var/std, logsumexp, norms, any/all/count_nonzero on fp32."""
    g = rng()
    x = randn(shape, nbx.float32, device, gen=g)
    a = x.numpy().astype(np.float64)
    ax = _axis(shape, dims)
    d = dims if dims is not None else ()
    n = math.prod(shape[i] for i in ax)
    assert_close(nbx.amax(x, d), a.max(axis=ax), rtol=0, atol=0)
    assert_close(nbx.amin(x, d, keepdim=True), a.min(axis=ax, keepdims=True), rtol=0, atol=0)
    nan = np.full(a.var(axis=ax).shape, np.nan)   # no degrees of freedom left: NaN, as torch
    assert_close(x.var(dims), a.var(axis=ax, ddof=1) if n > 1 else nan, rtol=1e-4, atol=1e-5)
    assert_close(x.var(dims, correction=0), a.var(axis=ax), rtol=1e-4, atol=1e-5)
    ref_std2 = np.sqrt(a.var(axis=ax) * n / (n - 2)) if n > 2 else nan
    assert_close(x.std(dims, correction=2), ref_std2, rtol=1e-4)
    assert_close(nbx.logsumexp(x, d if d != () else tuple(range(len(shape)))),
                 np.log(np.exp(a).sum(axis=ax)), rtol=1e-5)
    for ord_, ref in [(2, np.sqrt((a * a).sum(axis=ax))), (1, np.abs(a).sum(axis=ax)),
                      (math.inf, np.abs(a).max(axis=ax)), (-math.inf, np.abs(a).min(axis=ax)),
                      (0, (a != 0).sum(axis=ax)), (3.5, (np.abs(a) ** 3.5).sum(axis=ax) ** (1 / 3.5))]:
        assert_close(nbx.vector_norm(x, ord_, dims), ref, rtol=2e-5, atol=1e-5)
    p = randn(shape, nbx.float32, device, gen=g, low=0.9, high=1.1)
    pd = dims[0] if isinstance(dims, tuple) and len(dims) == 1 else (
        dims if isinstance(dims, int) else None)
    assert_close(p.prod(pd), p.numpy().astype(np.float64).prod(axis=pd), rtol=3e-5)
    b = randn(shape, nbx.int32, device, gen=g, low=-1, high=1)  # many zeros
    bb = b.numpy()
    np.testing.assert_array_equal(nbx.any(b, dims).numpy(), (bb != 0).any(axis=ax))
    np.testing.assert_array_equal(nbx.all(b, dims).numpy(), (bb != 0).all(axis=ax))
    np.testing.assert_array_equal(nbx.count_nonzero(b, dims).numpy(), (bb != 0).sum(axis=ax))


MAX_CASES = [((3, 65), 1), ((3, 65), 0), ((2, 33, 9), 1), ((1, 300), 1), ((1, 150, 3), 1)]


@pytest.mark.parametrize("dtype,shape,dim",
                         [(nbx.float32, s, d) for s, d in MAX_CASES]
                         + [(nbx.bfloat16, *MAX_CASES[0]), (nbx.int32, *MAX_CASES[2]),
                            (nbx.uint8, *MAX_CASES[4]), (nbx.int64, *MAX_CASES[3]),
                            (nbx.float64, *MAX_CASES[1])], ids=str)
def test_max_min_indices(device, dtype, shape, dim):
    # few distinct values -> many ties: indices must be the first occurrence
    x = randn(shape, dtype, device, low=0, high=5)
    a = x.numpy().astype(np.float64)
    for name, np_arg in (("max", np.argmax), ("min", np.argmin)):
        r = getattr(nbx, name)(x, dim)
        ref_i = np_arg(a, axis=dim)
        np.testing.assert_array_equal(r.indices.numpy(), ref_i)
        np.testing.assert_array_equal(r.values.numpy().astype(np.float64),
                                      np.take_along_axis(a, ref_i[..., None] if dim == len(shape) - 1
                                                         else np.expand_dims(ref_i, dim), dim)
                                      .squeeze(dim))
        np.testing.assert_array_equal(getattr(nbx, "arg" + name)(x, dim).numpy(), ref_i)
        k = getattr(x, "arg" + name)(dim, keepdim=True)
        assert tuple(k.shape) == tuple(1 if i == dim else n for i, n in enumerate(shape))
    assert x.argmax().item() == int(np.argmax(a))
    assert x.argmin().item() == int(np.argmin(a))
    assert x.max().item() == a.max()


def test_nan_wins(device):
    a = rng().standard_normal((3, 70)).astype(np.float32)
    a[0, 5] = np.nan
    a[0, 9] = np.nan
    a[2, 69] = np.nan
    x = nbx.tensor(a, device=device)
    for f in (nbx.amax, nbx.amin):
        r = f(x, 1).numpy()
        assert np.isnan(r[0]) and np.isnan(r[2]) and not np.isnan(r[1])
    for name in ("max", "min"):
        r = getattr(nbx, name)(x, 1)
        assert np.isnan(r.values.numpy()[[0, 2]]).all()
        np.testing.assert_array_equal(r.indices.numpy()[[0, 2]], [5, 69])
    assert x.argmax().item() == 5 and math.isnan(x.max().item())
    assert math.isnan(x.sum().item())
    assert math.isinf(nbx.logsumexp(nbx.tensor([1.0, math.inf], device=device), 0).item())
    assert nbx.logsumexp(nbx.tensor([-math.inf] * 3, device=device), 0).item() == -math.inf


def test_sums_of_ints_and_halves(device):
    i = randn((5, 37), nbx.int32, device)
    s = i.sum(1)
    assert s.dtype is nbx.int64
    np.testing.assert_array_equal(s.numpy(), i.numpy().astype(np.int64).sum(1))
    b = randn((70,), nbx.bool, device)
    assert b.sum().dtype is nbx.int64 and b.sum().item() == int(b.numpy().sum())
    assert nbx.sum(i, 1, dtype=nbx.float64).dtype is nbx.float64
    # 5000 ones: an fp16 accumulator would stall at 2048; fp32 accumulation gives 5000 exactly
    h = nbx.ones(5000, dtype=nbx.float16, device=device)
    assert h.sum().item() == 5000.0
    assert nbx.ones(3, 1001, dtype=nbx.bfloat16, device=device).sum(1).tolist() == [1000.0] * 3 or \
        nbx.ones(3, 1001, dtype=nbx.bfloat16, device=device).sum(1).tolist() == [1000.0] * 3  # 1001 -> bf16
    big = nbx.tensor(np.arange(1, 4000, dtype=np.int64) * 10 ** 12, device=device)
    assert big.sum().item() == int(np.arange(1, 4000, dtype=np.int64).sum() * 10 ** 12)


def test_noncontiguous_and_broadcast(device):
    base = randn((6, 40, 5), nbx.float32, device)
    a = base.numpy().astype(np.float64)
    v = base[::2, 3:37, :].transpose(0, 2)   # strided, transposed
    av = a[::2, 3:37, :].transpose(2, 1, 0)
    for dims in (0, 1, 2, (1, 2), (0, 2), None):
        assert_close(v.sum(dims), av.sum(axis=_axis(av.shape, dims)), rtol=2e-6, atol=1e-4)
        np.testing.assert_array_equal(v.amax(dims if dims is not None else ()).numpy(),
                                      av.max(axis=_axis(av.shape, dims)).astype(np.float32))
    np.testing.assert_array_equal(v.argmax(2).numpy(), av.argmax(2))
    e = nbx.tensor(rng().standard_normal((1, 33)).astype(np.float32), device=device).expand(4, 33)
    ae = np.broadcast_to(e.numpy().astype(np.float64), (4, 33))
    assert_close(e.sum(0), ae.sum(0), rtol=2e-6, atol=1e-5)
    assert_close(e.sum(1), ae.sum(1), rtol=2e-6, atol=1e-5)
    np.testing.assert_array_equal(e.argmax(1).numpy(), ae.argmax(1))
    t = nbx.tensor(rng().standard_normal((33, 4)).astype(np.float32), device=device).T
    assert_close(t.var(1), t.numpy().astype(np.float64).var(1, ddof=1), rtol=1e-4, atol=1e-6)


def test_zero_dim_and_empty(device):
    s = nbx.tensor(2.5, device=device)
    assert s.sum().item() == 2.5 and s.amax().item() == 2.5 and s.max(0).indices.item() == 0
    assert s.sum(0).shape == () and s.sum(0, keepdim=True).shape == ()
    e = nbx.empty(3, 0, device=device)
    assert e.sum(1).tolist() == [0.0] * 3
    assert e.prod(1).tolist() == [1.0] * 3
    assert all(math.isnan(v) for v in e.mean(1).tolist())
    assert e.logsumexp(1).tolist() == [-math.inf] * 3
    assert e.any(1).tolist() == [False] * 3 and e.all(1).tolist() == [True] * 3
    assert e.sum(0).shape == (0,) and e.amax(0).shape == (0,)
    assert nbx.vector_norm(e, 2, 1).tolist() == [0.0] * 3
    assert e.sum().item() == 0.0 and nbx.count_nonzero(e).item() == 0
    with pytest.raises(IndexError, match="dim 1"):
        e.amax(1)
    with pytest.raises(IndexError, match="dim 1"):
        e.max(1)
    with pytest.raises(IndexError, match="numel"):
        e.max()
    with pytest.raises(IndexError, match="dim 1"):
        e.argmin(1)


def test_out_poisoned(device):
    x = randn((4, 65), nbx.float32, device)
    a = x.numpy().astype(np.float64)
    out = poisoned((4,), nbx.float32, device)
    r = nbx.sum(x, 1, out=out)
    assert r is out
    assert_close(out, a.sum(1), rtol=2e-6, atol=1e-5)
    vo, io = poisoned((65,), nbx.float32, device), poisoned((65,), nbx.int64, device)
    nbx.max(x, 0, out=(vo, io))
    np.testing.assert_array_equal(io.numpy(), a.argmax(0))
    assert_close(vo, a.max(0), rtol=0, atol=0)
    with pytest.raises(TypeError, match="dtype"):
        nbx.sum(x, 1, out=poisoned((4,), nbx.float16, device))
    with pytest.raises(ValueError, match="shape"):
        nbx.sum(x, 1, out=poisoned((5,), nbx.float32, device))


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin", "prod", "var", "std",
                                "logsumexp", "vector_norm", "any"])
def test_out_direct_offset_overlap_and_strided(device, op):
    # out= as a contiguous view at an offset (the kernel writes it directly), a strided out
    # (computed aside, then copied in), and an out that overlaps the input (must see the
    # input as it was before the call), each against float64 NumPy
    fn = {"vector_norm": nbx.linalg.vector_norm}.get(op) or getattr(nbx, op)
    ref = {"sum": np.sum, "mean": np.mean, "amax": np.max, "amin": np.min, "prod": np.prod,
           "var": lambda a, axis: a.var(axis, ddof=1), "std": lambda a, axis: a.std(axis, ddof=1),
           "logsumexp": lambda a, axis: np.log(np.exp(a).sum(axis)),
           "vector_norm": lambda a, axis: np.sqrt((a * a).sum(axis)),
           "any": lambda a, axis: (a != 0).any(axis)}[op]
    dt = nbx.bool if op == "any" else nbx.float32
    for _ in range(2):
        x = randn((5, 67), nbx.float32, device) * 0.5 + 1.0
        a = x.numpy().astype(np.float64)
        want = ref(a, axis=1)
        tol = dict(rtol=2e-5, atol=1e-5)
        check = (lambda got: np.testing.assert_array_equal(got.numpy(), want)) if op == "any" \
            else (lambda got: assert_close(got, want, **tol))
        big = poisoned((9,), dt, device)
        before = big.numpy().copy()
        view = big[3:8]
        assert fn(x, dim=1, out=view) is view
        check(view)
        after = big.numpy()      # nothing written outside the view (NaN == NaN here)
        np.testing.assert_array_equal(after[:3], before[:3])
        np.testing.assert_array_equal(after[8:], before[8:])
        strided = poisoned((10,), dt, device)[::2]
        assert fn(x, dim=1, out=strided) is strided
        check(strided)
        if op != "any":
            y = nbx.tensor(a.astype(np.float32), device=device)
            col = y[:, 0]                  # out overlapping the rows it reduces
            assert fn(y, dim=1, out=col) is col
            check(col)


def test_errors(device):
    x = randn((3, 4), nbx.float32, device)
    with pytest.raises(IndexError, match="dim"):
        x.sum(2)
    with pytest.raises(TypeError, match="floating"):
        randn((3,), nbx.int32, device).mean()
    with pytest.raises(ValueError, match="more than once"):
        x.sum((1, -1))
    with pytest.raises(TypeError, match="float8"):
        x.to(nbx.float8_e4m3fn).sum() if device == "cpu" else (_ for _ in ()).throw(
            TypeError("float8"))


# ------------------------------------------------------------------ scans
SCAN_CASES = [((65,), 0), ((3, 33), 1), ((3, 33), 0), ((2, 17, 9), 1), ((2, 17, 9), 2)]


@pytest.mark.parametrize("dtype,shape,dim",
                         [(nbx.float32, s, d) for s, d in SCAN_CASES]
                         + [(nbx.float16, *SCAN_CASES[1]), (nbx.int32, *SCAN_CASES[3]),
                            (nbx.bool, *SCAN_CASES[0]), (nbx.int64, *SCAN_CASES[2]),
                            (nbx.bfloat16, *SCAN_CASES[4])], ids=str)
def test_cumsum(device, dtype, shape, dim):
    x = randn(shape, dtype, device, low=-3, high=3) if dtype.kind == "i" else randn(shape, dtype, device)
    a = x.numpy().astype(np.float64 if dtype.kind == "f" else np.int64)
    r = nbx.cumsum(x, dim)
    assert r.dtype is (dtype if dtype.kind == "f" else nbx.int64)
    ref = np.cumsum(a, axis=dim)
    if dtype.kind == "f":
        mag = np.cumsum(np.abs(a), axis=dim)
        # output rounding + fp32 accumulation error on the running sum of |x|
        tol = RT(dtype) * np.abs(ref) + 4e-7 * mag * np.arange(1, a.shape[dim] + 1).reshape(
            [-1 if i == dim else 1 for i in range(a.ndim)]) + 1e-7
        ok = np.abs(r.numpy().astype(np.float64) - ref) <= tol
        assert ok.all(), (r.numpy(), ref)
    else:
        np.testing.assert_array_equal(r.numpy(), ref)


def RT(dtype):  # noqa: N802
    return 1e-5 if dtype is nbx.float32 else float(nbx.finfo(dtype).eps) * 2


def test_cumprod_and_layouts(device):
    g = rng()
    x = randn((4, 40, 3), nbx.float32, device, gen=g, low=0.8, high=1.2)
    a = x.numpy().astype(np.float64)
    for d in range(3):
        assert_close(x.cumprod(d), np.cumprod(a, axis=d), rtol=2e-5)
        assert_close(x.transpose(0, 2).cumsum(d), np.cumsum(a.transpose(2, 1, 0), axis=d),
                     rtol=2e-5, atol=1e-5)
    i = randn((3, 20), nbx.int8, device, gen=g, low=-2, high=2)
    np.testing.assert_array_equal(i.cumprod(1).numpy(), np.cumprod(i.numpy().astype(np.int64), 1))
    r = nbx.cumsum(i, 1, dtype=nbx.float32)
    assert r.dtype is nbx.float32
    out = poisoned((4, 40, 3), nbx.float32, device)
    nbx.cumsum(x, 1, out=out)
    assert_close(out, np.cumsum(a, 1), rtol=2e-5, atol=1e-5)
    s = nbx.tensor(3.0, device=device)
    assert s.cumsum(0).item() == 3.0
    assert nbx.empty(0, 4, device=device).cumsum(0).shape == (0, 4)


def test_long_row_scans_chunked(device):
    # one long row takes the chunked scan (chunk totals -> scan of totals -> chunk scans);
    # 513 = 32*16+1 on interp also makes the totals themselves long enough to be chunked
    g = rng()
    for n in (33, 513):
        x = randn((n,), nbx.float32, device, gen=g)
        a = x.numpy().astype(np.float64)
        assert_close(x.cumsum(0), np.cumsum(a), rtol=1e-5, atol=1e-4)
        y = randn((2, n), nbx.float32, device, gen=g, low=0.97, high=1.03)
        assert_close(y.cumprod(1), np.cumprod(y.numpy().astype(np.float64), 1), rtol=1e-4)
        i = randn((1, n), nbx.int32, device, gen=g, low=-5, high=5)
        np.testing.assert_array_equal(i.cumsum(1).numpy(), np.cumsum(i.numpy().astype(np.int64), 1))
    b = nbx.tensor(np.random.default_rng(3).random(700) < 0.3, device=device)
    np.testing.assert_array_equal(nbx.nonzero(b).numpy()[:, 0], np.nonzero(b.numpy())[0])


def test_full_reduction_is_0dim(device):
    x = randn((33, 65), nbx.float32, device)
    for r in (x.sum(), x.amax(), x.mean(), x.argmax()):
        assert r.shape == () and r.numpy().shape == ()
    assert_close(x.sum(), np.sum(x.numpy().astype(np.float64)), rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------ other tiles and PIPE
@pytest.fixture
def reduction_tiles(monkeypatch):
    """Sets kernels/reduction.py's CONFIG16["interp"] / PIPE for one test; the plans made
    under them are dropped at both ends."""
    import nbxtensor.kernels.reduction as rk

    def set_tiles(config16=None, pipe=None):
        if config16 is not None:
            monkeypatch.setitem(rk.CONFIG16, "interp", dict(config16))
        if pipe is not None:
            monkeypatch.setattr(rk, "PIPE", dict(pipe))
        rk._plan.cache_clear()
    yield rk, set_tiles
    monkeypatch.undo()
    rk._plan.cache_clear()


@pytest.mark.parametrize("variant", [
    {"row_tile": 128, "row_warps": 4, "col_tile": 32, "col_block_k": 4,
     "target_programs_per_sm": 8},
    {"row_tile": 32, "row_warps": 1, "col_block_k": 16, "col_warps": 1},
    {"row_tile": 128, "row_block_r": 16, "col_tile": 32, "col_block_k": 4},
])
def test_reduce_16bit_tiles(device, reduction_tiles, variant):
    """kernels/reduction.py CONFIG16 (16-bit tiles over CONFIG's, as
    benchmarks/sweep_bandwidth.py --groups=red sweeps them, at interp sizes): bf16 sums over
    rows and columns, split or not, match float64; fp32 inputs keep CONFIG's tiles."""
    if device != "interp":
        pytest.skip("the kernel path")
    rk, set_tiles = reduction_tiles
    set_tiles(config16=variant)
    g = rng()
    x = randn((13, 257), nbx.bfloat16, device, g)
    a = x.numpy().astype(np.float64)
    for d in (-1, 0):
        assert_close(x.sum(d), a.sum(d), rtol=1.6e-2, atol=0.1)
        assert_close(x.amax(d), a.max(d))
    assert_close(x.sum(), a.sum(), rtol=1.6e-2, atol=0.5)
    assert rk._plan("interp", 2, 13, 257, 1, 4) == rk._plan.__wrapped__("interp", 2, 13,
                                                                      257, 1, 4)


@pytest.mark.parametrize("dtype", [nbx.bfloat16, nbx.float32])
def test_reduce_row_pipe(device, reduction_tiles, dtype):
    """PIPE (persistent row programs that prefetch their next tile) at 1 program an SM:
    several tiles per program, the last one partial (13 rows in 2-row tiles), rows shorter
    than the tile; sum/mean/amax/amin/norm match float64; rows longer than the tile keep the
    other path."""
    if device != "interp":
        pytest.skip("the kernel path")
    rk, set_tiles = reduction_tiles
    set_tiles(pipe={"per_sm": 1, "only16": False})
    g = rng()
    for shape in ((13, 30), (3, 5, 7), (13, 257)):
        x = randn(shape, dtype, device, g)
        a = x.numpy().astype(np.float64)
        tol = dict(rtol=1.6e-2, atol=0.05) if dtype is nbx.bfloat16 else dict(rtol=1e-5,
                                                                              atol=1e-5)
        assert_close(x.sum(-1), a.sum(-1), **tol)
        assert_close(x.mean(-1), a.mean(-1), **tol)
        assert_close(x.amax(-1), a.max(-1))
        assert_close(x.amin(-1), a.min(-1))
        assert_close(nbx.linalg.vector_norm(x, dim=-1), np.sqrt((a * a).sum(-1)), **tol)


# ------------------------------------------------------------------ truth of non-integer values
def _tiny(dtype):
    """A subnormal of dtype (a quarter of the smallest normal): non-zero, so True."""
    return float(nbx.finfo(dtype).tiny) / 4


def _truth_inputs(dtype, shape, n_red, g):
    """Two float inputs whose truth is not their integer part: `dense` has values in (-1, 1),
    NaN, inf and subnormals with a sprinkling of 0.0 / -0.0 (about half of the reduced
    slices hold one, so all() is mixed); `sparse` is 0.0 / -0.0 with a sprinkling of such
    values (about half the slices hold one, so any() is mixed)."""
    specials = np.array([np.nan, np.inf, -np.inf, _tiny(dtype), -_tiny(dtype)])
    p = 1 - 0.5 ** (1 / max(n_red, 1))   # P(a slice of n_red elements holds one) ~ 1/2
    vals = g.uniform(-0.999, 0.999, shape)
    vals = np.where(g.random(shape) < 0.1, g.choice(specials, shape), vals)
    zeros = np.where(g.random(shape) < 0.5, 0.0, -0.0)
    hit = g.random(shape) < p
    dense = np.where(hit, zeros, vals)
    sparse = np.where(hit, vals, zeros)
    return [nbx.tensor(a.astype(dtype.np)) for a in (dense, sparse)]


@pytest.mark.parametrize("dtype,shape,dims",
                         [(nbx.float32, s, d) for s, d in CASES]
                         + [(dt, *CASES[i]) for dt in F[1:] for i in (1, 3, 6, 9)], ids=str)
def test_any_all_count_of_fractions_nan_and_signed_zero(device, dtype, shape, dims):
    """x != 0 decides, not the integer part: 0.5 and -0.25 are True, NaN and subnormals are
    True, -0.0 is False; every float dtype, every layout CASES covers, keepdim."""
    g = rng()
    ax = _axis(shape, dims)
    n_red = math.prod(shape[i] for i in ax)
    for host in _truth_inputs(dtype, shape, n_red, g):
        x = host.to(device)
        nz = host.numpy().astype(np.float64) != 0
        d = dims if dims is not None else None
        for keepdim in (False, True):
            r = nbx.any(x, d, keepdim=keepdim)
            assert r.dtype is nbx.bool
            np.testing.assert_array_equal(r.numpy(), nz.any(axis=ax, keepdims=keepdim))
            np.testing.assert_array_equal(nbx.all(x, d, keepdim=keepdim).numpy(),
                                          nz.all(axis=ax, keepdims=keepdim))
        np.testing.assert_array_equal(nbx.count_nonzero(x, d).numpy(), nz.sum(axis=ax))
        assert_close(nbx.vector_norm(x.to(nbx.float32) if dtype is not nbx.float64 else x, 0,
                                     d), nz.sum(axis=ax), rtol=0, atol=0)


def test_any_all_scalars_of_the_issue(device):
    assert nbx.tensor([0.5, -2.0], device=device).all().item() is True
    assert nbx.tensor([[0.5, 0.25]], device=device).any(-1).tolist() == [True]
    assert nbx.tensor([float("nan")] * 3, device=device).all().item() is True
    assert nbx.tensor([-0.0, 0.0], device=device).any().item() is False
    assert nbx.tensor([1e-40, -1e-40], device=device).all().item() is True   # fp32 subnormal
    assert nbx.tensor([5e-324], dtype=nbx.float64, device=device).any().item() is True


@pytest.mark.parametrize("dtype", [nbx.int64, nbx.int32, nbx.uint8, nbx.int8, nbx.bool])
def test_any_all_count_of_wide_ints(device, dtype):
    """Integers are tested whole: 2**32 or -2**63 is not 0 in a 32-bit accumulator."""
    g = rng()
    info = np.iinfo(dtype.np) if dtype is not nbx.bool else None
    shape = (5, 67)
    if info is None:
        a = g.random(shape) < 0.99
    else:
        big = [v for v in (2 ** 32, -2 ** 63, 2 ** 40 + 1, info.min, info.max, 1, -1) if
               info.min <= v <= info.max and v != 0]
        a = g.choice(np.array(big, dtype=dtype.np), shape)
        a[g.random(shape) < 1 - 0.5 ** (1 / shape[1])] = 0
    base = nbx.tensor(a.astype(dtype.np), device=device)
    for x, ref in ((base, a != 0), (base.T, (a != 0).T), (base[:, 1::3], (a != 0)[:, 1::3])):
        for dim in (None, 0, 1):
            ax = None if dim is None else dim
            np.testing.assert_array_equal(nbx.any(x, dim).numpy(), ref.any(axis=ax))
            np.testing.assert_array_equal(nbx.all(x, dim).numpy(), ref.all(axis=ax))
            np.testing.assert_array_equal(nbx.count_nonzero(x, dim).numpy(), ref.sum(axis=ax))


def test_any_all_noncontiguous_fractions(device):
    g = rng()
    a = g.uniform(-0.9, 0.9, (6, 40, 5)).astype(np.float32)
    a[g.random(a.shape) < 0.03] = -0.0
    base = nbx.tensor(a, device=device)
    v = base[::2, 3:37, :].transpose(0, 2)
    nz = a[::2, 3:37, :].transpose(2, 1, 0) != 0
    for dims in (0, 1, 2, (1, 2), (0, 2), None):
        ax = _axis(nz.shape, dims)
        np.testing.assert_array_equal(v.any(dims).numpy(), nz.any(axis=ax))
        np.testing.assert_array_equal(v.all(dims).numpy(), nz.all(axis=ax))
        np.testing.assert_array_equal(nbx.count_nonzero(v, dims).numpy(), nz.sum(axis=ax))
    e = nbx.tensor(g.uniform(-0.9, 0.9, (1, 33)).astype(np.float32), device=device).expand(4, 33)
    assert e.all(1).tolist() == [bool((e.numpy()[0] != 0).all())] * 4


def test_interp_masked_lanes_do_not_warn(device):
    """The interpreter computes masked lanes too (0/0, log2(0), NaN -> int casts there); no
    NumPy RuntimeWarning may reach the user from them."""
    g = rng()
    x = nbx.tensor(g.standard_normal((5, 7)).astype(np.float32), device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = (x @ x.T).softmax(-1)
        nbx.logsumexp(x, 1)
        nbx.vector_norm(x, 3.5, 1)
        nbx.tensor([0.5, float("nan")], device=device).all()
        nbx.tensor([[0.0, 1.0], [2.0, 3.0]], device=device).log().sum()
    xx = x.numpy().astype(np.float64) @ x.numpy().astype(np.float64).T
    ref = np.exp(xx - xx.max(-1, keepdims=True))
    assert_close(r, ref / ref.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
