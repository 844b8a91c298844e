"""sort / argsort / topk / nonzero / unique vs NumPy on every device.

The reference for sort is NumPy's stable argsort (descending: the stable ascending
order of the reversed row, reversed back), so ties keep input order, as torch's
stable=True; NaN sorts as the largest value. interp runs the Triton kernels with a
16-element sort tile and 32-element topk chunks (kernels/sort.py CONFIG), so rows of
33 and 65 take the merge passes and several candidate rounds.
"""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import poisoned, randn, rng


def ref_order(a, axis, descending):
    # bf16's NumPy kind is 'V', so ask the dtype table whether it is a float
    isf = nbx.dtypes.as_dtype(a.dtype).is_floating_point
    a = a.astype(np.float64) if isf else a.astype(np.int64)
    if not descending:
        return np.argsort(a, axis=axis, kind="stable")
    n = a.shape[axis]
    return (n - 1) - np.flip(np.argsort(np.flip(a, axis), axis=axis, kind="stable"), axis)


def _input(shape, dtype, device, special=True):
    g = rng()
    if dtype.kind == "f":
        a = g.integers(-4, 4, shape).astype(np.float64) + g.choice([0, 0.5], shape)  # many ties
        if special and a.size > 6:
            f = a.reshape(-1)
            f[[1, 4]] = np.nan
            f[2], f[3], f[5] = -0.0, np.inf, -np.inf
    elif dtype.kind == "b":
        a = g.random(shape) < 0.5
    else:
        lo = 0 if dtype.kind == "u" else -5
        a = g.integers(lo, lo + 9, shape)
    a = np.asarray(a).astype(dtype.np)
    return nbx.tensor(a, device=device), a


def _same(actual, expected):
    a, e = actual.numpy(), np.asarray(expected)
    assert a.shape == e.shape, (a.shape, e.shape)
    if nbx.dtypes.as_dtype(a.dtype).is_floating_point:
        a64, e64 = a.astype(np.float64), e.astype(np.float64)
        assert np.array_equal(np.isnan(a64), np.isnan(e64)), (a64, e64)
        m = ~np.isnan(a64)
        np.testing.assert_array_equal(a64[m], e64[m])
        np.testing.assert_array_equal(np.signbit(a64[m]), np.signbit(e64[m]))  # -0.0 kept
    else:
        np.testing.assert_array_equal(a, e)


SORT_CASES = [((2, 33), -1), ((65,), 0), ((3, 9, 2), 1), ((4, 5), 0)]


@pytest.mark.parametrize("dtype,shape,dim",
                         [(nbx.float32, s, d) for s, d in SORT_CASES]
                         + [(dt, *SORT_CASES[i % 4]) for i, dt in enumerate(
                             [nbx.bfloat16, nbx.float16, nbx.int32, nbx.uint8, nbx.bool, nbx.int64,
                              nbx.float64, nbx.int8])], ids=str)
def test_sort(device, dtype, shape, dim):
    x, a = _input(shape, dtype, device)
    for descending in (False, True):
        r = nbx.sort(x, dim, descending=descending, stable=True)
        o = ref_order(a, dim, descending)
        np.testing.assert_array_equal(r.indices.numpy(), o)
        _same(r.values, np.take_along_axis(a, o, dim))
        np.testing.assert_array_equal(x.argsort(dim, descending=descending).numpy(), o)


def test_sort_noncontiguous_out_and_edges(device):
    x, a = _input((6, 40), nbx.float32, device)
    v = x[::2, 3:].T   # (37, 3), strided + transposed
    av = a[::2, 3:].T
    o = ref_order(av, 0, False)
    vo, io = poisoned(av.shape, nbx.float32, device), poisoned(av.shape, nbx.int64, device)
    r = nbx.sort(v, 0, out=(vo, io))
    assert r.values is vo and r.indices is io
    np.testing.assert_array_equal(io.numpy(), o)
    _same(vo, np.take_along_axis(av, o, 0))
    s = nbx.tensor(1.5, device=device)
    assert s.sort().values.item() == 1.5 and s.sort().indices.item() == 0
    e = nbx.empty(0, 3, device=device)
    assert e.sort(0).values.shape == (0, 3) and e.topk(0, 0).values.shape == (0, 3)
    with pytest.raises(IndexError, match="dim"):
        x.sort(2)


TOPK_CASES = [((2, 65), 1), ((2, 65), 3), ((1, 130), 17), ((3, 20), 20), ((2, 9), 5)]


@pytest.mark.parametrize("dtype,shape,k",
                         [(nbx.float32, s, k) for s, k in TOPK_CASES]
                         + [(nbx.bfloat16, *TOPK_CASES[1]), (nbx.int32, *TOPK_CASES[2]),
                            (nbx.float64, *TOPK_CASES[1]), (nbx.int64, *TOPK_CASES[4])], ids=str)
def test_topk(device, dtype, shape, k):
    x, a = _input(shape, dtype, device)
    for largest in (True, False):
        r = nbx.topk(x, k, largest=largest)
        o = ref_order(a, -1, largest)[..., :k]   # lower index first among ties
        _same(r.values, np.take_along_axis(a, o, -1))
        np.testing.assert_array_equal(r.indices.numpy(), o)


def test_topk_dims_and_sort_path(device, monkeypatch):
    x, a = _input((5, 33, 2), nbx.float32, device)
    r = x.topk(4, dim=1)
    o = ref_order(a, 1, True)[:, :4]
    np.testing.assert_array_equal(r.indices.numpy(), o)
    _same(r.values, np.take_along_axis(a, o, 1))
    if device != "cpu":  # k above the candidate limit: topk is a full sort and a slice
        from nbxtensor.kernels import sort as S
        monkeypatch.setitem(S.CONFIG[nbx.device(device).type], "max_kp", 2)
    r = nbx.topk(x[0], 7, dim=0, largest=False)
    o = ref_order(a[0], 0, False)[:7]
    np.testing.assert_array_equal(r.indices.numpy(), o)
    with pytest.raises(IndexError, match="k"):
        x.topk(34, dim=1)


def test_nonzero(device):
    x, a = _input((3, 17), nbx.int32, device, special=False)
    r = nbx.nonzero(x)
    np.testing.assert_array_equal(r.numpy(), np.argwhere(a != 0))
    t = nbx.nonzero(x, as_tuple=True)
    for got, ref in zip(t, np.nonzero(a)):
        np.testing.assert_array_equal(got.numpy(), ref)
    assert nbx.nonzero(nbx.zeros(4, device=device)).shape == (0, 1)
    assert nbx.nonzero(nbx.tensor(2.0, device=device)).shape == (1, 0)
    # as_tuple on a 0-dim input: treated as one element (torch): ([0],) if nonzero, else ([],)
    assert [t.numpy().tolist() for t in nbx.nonzero(nbx.tensor(2.0, device=device),
                                                    as_tuple=True)] == [[0]]
    assert [t.numpy().tolist() for t in nbx.where(nbx.tensor(0.0, device=device))] == [[]]


@pytest.mark.parametrize("dtype", [nbx.int32, nbx.float32, nbx.int64], ids=str)
def test_unique(device, dtype):
    x, a = _input((4, 9), dtype, device, special=False)
    v, inv, cnt = nbx.unique(x, return_inverse=True, return_counts=True)
    rv, rinv, rcnt = np.unique(a.reshape(-1), return_inverse=True, return_counts=True)
    _same(v, rv)
    np.testing.assert_array_equal(inv.numpy(), rinv.reshape(a.shape))
    np.testing.assert_array_equal(cnt.numpy(), rcnt)
    _same(nbx.unique(x), rv)
    _same(nbx.unique(x, dim=0), np.unique(a, axis=0))  # dim=: tests/ops/test_opsgaps.py


@pytest.mark.parametrize("kind", ["random", "ties", "ascending", "descending", "nan"])
def test_topk_threshold_path(device, kind):
    # long rows + small k take the threshold path on cuda/interp (chunk maxima -> k-th best
    # -> compact candidates -> select); sorted rows are its worst case (whole chunks pass)
    g = np.random.default_rng(11)
    n = 301
    if kind == "ties":
        a = g.integers(0, 4, (3, n)).astype(np.float32)
    elif kind in ("ascending", "descending"):
        a = np.sort(g.standard_normal((3, n)).astype(np.float32), axis=1)
        a = a if kind == "ascending" else a[:, ::-1].copy()
    else:
        a = g.standard_normal((3, n)).astype(np.float32)
        if kind == "nan":
            a[0, [5, 200]] = np.nan
            a[1, 7] = np.inf
            a[2, 9] = -np.inf
    x = nbx.tensor(a, device=device)
    for k in (1, 3, 8):
        for largest in (True, False):
            r = nbx.topk(x, k, largest=largest)
            o = ref_order(a, -1, largest)[..., :k]
            np.testing.assert_array_equal(r.indices.numpy(), o)
            _same(r.values, np.take_along_axis(a, o, -1))
    r = x.t().topk(3, dim=0)  # rows of the transposed view; output laid out (k, 3)
    o = ref_order(a.T, 0, True)[:3]
    np.testing.assert_array_equal(r.indices.numpy(), o)
    _same(r.values, np.take_along_axis(a.T, o, 0))
    xb = x.to(nbx.bfloat16)
    ab = xb.numpy().astype(np.float32)
    r = xb.topk(5)
    o = ref_order(ab, -1, True)[..., :5]
    np.testing.assert_array_equal(r.indices.numpy(), o)


# ---------------------------------------------------------------- sort: rank-merge levels
# kernels/sort.py _sort_ml: tile sort, then rank-merge levels of fan-in F until <= FINAL runs
# are left, then one decoding level. (tile, fan-in, final, narrow) below give 1..4 levels,
# groups with missing runs (runs not a multiple of the fan-in), the widest searches
# ([BLOCK, 32]), a pure pairwise merge, windowed (NARROW) searches, and 16-key programs
# over 4- and 8-key runs (NARROW off on those levels).
ML_CFGS = [(16, 2, 2, 0), (16, 2, 2, 1), (16, 4, 4, 0), (16, 4, 4, 1), (8, 8, 32, 1),
           (16, 4, 16, 1), (4, 2, 8, 1)]


def _ml_config(monkeypatch, device, c):
    from nbxtensor.kernels import sort as S
    typ = nbx.device(device).type
    c = c[:3] + (16, c[3])
    monkeypatch.setitem(S.CONFIG, typ, dict(S.CONFIG[typ], ml_small=c, ml_big=c))


def _sort_check(x, a, dim, descending, device):
    o = ref_order(a, dim, descending)
    vo = poisoned(a.shape, x.dtype, device)
    io = poisoned(a.shape, nbx.int64, device)
    nbx.sort(x, dim, descending=descending, out=(vo, io))
    np.testing.assert_array_equal(io.numpy(), o)
    _same(vo, np.take_along_axis(a, o, dim))


@pytest.mark.parametrize("cfg", ML_CFGS, ids=str)
def test_sort_rank_levels(device, monkeypatch, cfg):
    if device == "cpu":
        pytest.skip("the rank levels are the Triton path")
    if device == "cuda" and cfg not in ((16, 4, 4, 1), (4, 2, 8, 1)):
        pytest.skip("cuda: two configs (both search branches, NARROW) keep compiles few")
    _ml_config(monkeypatch, device, cfg)
    g = rng()
    # 3 rows of 16*9+1 (overhang; 10 tiles of 16), many ties, NaN / inf / -0.0 in row 0,
    # distinct values in row 1, a descending run in row 2 (every key moves)
    x, a = _input((3, 145), nbx.float32, device)
    a[1] = g.standard_normal(145).astype(np.float32)
    a[2] = np.sort(a[2])[::-1]
    x = nbx.tensor(a, device=device)
    for descending in (False, True):
        _sort_check(x, a, -1, descending, device)
    # a transposed view (copy path, output laid out along dim 0), bf16 and int32 keys
    _sort_check(x.t(), a.T, 0, True, device)
    xb, ab = _input((2, 77), nbx.bfloat16, device)
    _sort_check(xb, ab, -1, False, device)
    xi, ai = _input((1, 200), nbx.int32, device)
    _sort_check(xi, ai, -1, True, device)


def test_sort_rank_levels_int_extremes(device, monkeypatch):
    # the packed key's high word at its extremes (INT32_MIN / MAX, uint8 255) and a row
    # that is one tile plus one key
    if device == "cpu":
        pytest.skip("the rank levels are the Triton path")
    _ml_config(monkeypatch, device, (16, 2, 4, 1))
    a = rng().integers(-3, 3, (2, 17)).astype(np.int32)
    a[0, [0, 5, 16]] = [np.iinfo(np.int32).max, np.iinfo(np.int32).min, np.iinfo(np.int32).max]
    for descending in (False, True):
        _sort_check(nbx.tensor(a, device=device), a, -1, descending, device)
    u = rng().integers(250, 256, (1, 40)).astype(np.uint8)
    _sort_check(nbx.tensor(u, device=device), u, -1, True, device)


@pytest.mark.parametrize("shape", [(1, 128256), (32, 32000), (2, 4097)], ids=str)
def test_sort_model_shapes_shipped_config(device, shape):
    # the shipped cuda CONFIG on model shapes, both regimes (bench_reduction --sort-sweep2
    # checks (1,32000), (4,128256), (128,4096), (1,1M) against torch)
    if device != "cuda":
        pytest.skip("model-sized rows: cuda only (interp is too slow)")
    g = rng()
    a = g.standard_normal(shape).astype(np.float32)
    a[..., ::7] = np.round(a[..., ::7])          # ties
    a.reshape(-1)[[3, 10]] = np.nan
    x = nbx.tensor(a, device=device)
    for descending in (True, False):
        r = nbx.sort(x, -1, descending=descending)
        o = ref_order(a, -1, descending)
        np.testing.assert_array_equal(r.indices.numpy(), o)
        _same(r.values, np.take_along_axis(a, o, -1))
    if shape == (1, 128256):
        xb = x.to(nbx.bfloat16)
        ab = xb.numpy()
        r = nbx.sort(xb, -1, descending=True)
        np.testing.assert_array_equal(r.indices.numpy(), ref_order(ab, -1, True))
