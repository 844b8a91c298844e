"""Indexing ops vs independent NumPy references, on every device.

Shapes overhang the interp tiles (BC = 32 columns, 128 elements a tile): 33, 65, 129.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import assert_close, poisoned, rng

F = [nbx.float32, nbx.bfloat16, nbx.float16, nbx.float64]


def _arr(shape, dtype, gen):
    dtype = nbx.dtypes.as_dtype(dtype)
    if dtype.kind == "f":
        return gen.standard_normal(shape).astype(dtype.np)
    if dtype.kind == "b":
        return gen.random(shape) < 0.5
    return gen.integers(-100 if dtype.kind == "i" else 0, 100, shape).astype(dtype.np)


def _t(a, device, layout="contig"):
    """A tensor holding `a`: contiguous, strided (every other column) or transposed."""
    if layout == "contig" or a.ndim == 0:
        return nbx.tensor(a, device=device)
    if layout == "strided":
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        big[..., ::2] = a
        return nbx.tensor(big, device=device)[..., ::2]
    t = nbx.tensor(np.ascontiguousarray(np.swapaxes(a, 0, -1)), device=device)
    return t.transpose(0, -1)


@contextlib.contextmanager
def _raises(device, match=None):
    """IndexError from the block, seen where it surfaces: on cuda (async index checks) at the
    next synchronising call; interp runs the same async path here (checked at the block's
    end), so CI covers it; cpu raises at the op."""
    from nbxtensor.kernels import indexing as kix
    added = device == "interp" and "interp" not in kix.ASYNC_TYPES
    if added:
        kix.ASYNC_TYPES.add("interp")
    try:
        with pytest.raises(IndexError, match=match):
            yield
            if device == "cuda":
                nbx.cuda.synchronize()
            elif device == "interp":
                kix.check_pending()
    finally:
        if added:
            kix.ASYNC_TYPES.discard("interp")


def _idx(a, device, dtype=nbx.int64, layout="contig"):
    return _t(np.asarray(a).astype(nbx.dtypes.as_dtype(dtype).np), device, layout)


LAYOUTS = ["contig", "strided", "transposed"]


# ---------------------------------------------------------------------------- gather family
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(device, layout, dim):
    g = rng()
    x = _arr((7, 33, 3), nbx.float32, g)
    d = dim % 3
    ishape = list(x.shape)
    ishape[d] = 5
    ishape[(d + 1) % 3] -= 1  # index may be smaller than input on other dims
    ind = g.integers(0, x.shape[d], ishape)
    expect = np.take_along_axis(x[tuple(slice(0, n) if k != d else slice(None)
                                        for k, n in enumerate(ishape))], ind, axis=d)
    out = poisoned(ishape, nbx.float32, device)
    r = nbx.gather(_t(x, device, layout), dim, _idx(ind, device, nbx.int64, layout), out=out)
    assert r is out
    assert_close(r, expect.astype(np.float64))
    r2 = _t(x, device, layout).gather(dim, _idx(ind, device, nbx.int32))
    np.testing.assert_array_equal(r2.numpy(), expect)


@pytest.mark.parametrize("dtype", [nbx.bfloat16, nbx.int32, nbx.bool, nbx.float64, nbx.uint8])
def test_gather_dtypes(device, dtype):
    g = rng()
    x = _arr((4, 129), dtype, g)
    ind = g.integers(0, 129, (4, 130))
    ind = ind[:, :129]
    r = nbx.gather(nbx.tensor(x, device=device), 1, _idx(ind, device))
    np.testing.assert_array_equal(r.numpy(), np.take_along_axis(x, ind, 1))


def test_gather_errors(device):
    x = nbx.tensor(np.ones((3, 4), np.float32), device=device)
    with _raises(device, r"gather: index 4 .*dim 1 of size 4.*\[0, 3\]"):
        nbx.gather(x, 1, _idx([[0, 4]], device))
    with _raises(device, r"gather: index -1 .*\[0, 3\]"):
        nbx.gather(x, 1, _idx([[0, -1]], device))
    with pytest.raises(TypeError, match="int64 or int32"):
        nbx.gather(x, 1, nbx.tensor([[0.0]], device=device))
    with pytest.raises(ValueError, match="as many dims"):
        nbx.gather(x, 1, _idx([0], device))
    # after an error the next call works (the device flag was reset)
    assert nbx.gather(x, 1, _idx([[3]], device)).numpy().tolist() == [[1.0]]


def test_gather_empty_and_0dim(device):
    x = nbx.tensor(np.arange(5.0, dtype=np.float32), device=device)
    r = nbx.gather(x, 0, _idx(np.zeros(0, np.int64), device))
    assert r.shape == (0,)
    r = nbx.gather(x, 0, nbx.tensor(3, device=device))
    assert r.shape == () and r.item() == 3.0
    s = nbx.tensor(np.float32(2.5), device=device)
    assert nbx.gather(s, 0, _idx([0, 0], device)).numpy().tolist() == [2.5, 2.5]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_index_select(device, layout, dim):
    g = rng()
    x = _arr((5, 33, 4), nbx.float32, g)
    ind = g.integers(0, x.shape[dim], 9)
    ind[0] = ind[1]  # duplicates are fine for reads
    expect = np.take(x, ind, axis=dim)
    shape = list(x.shape)
    shape[dim] = 9
    out = poisoned(shape, nbx.float32, device)
    r = nbx.index_select(_t(x, device, layout), dim, _idx(ind, device, nbx.int32), out=out)
    assert_close(r, expect.astype(np.float64))
    big = _idx(np.repeat(ind, 2), device)[::2]  # a strided index
    np.testing.assert_array_equal(_t(x, device, layout).index_select(dim, big).numpy(), expect)
    with _raises(device, r"index_select: index .* valid range is \[0, "):
        nbx.index_select(_t(x, device, layout), dim, _idx([0, x.shape[dim]], device))
    e = nbx.index_select(_t(x, device, layout), dim, _idx(np.zeros(0, np.int64), device))
    assert e.shape[dim] == 0


@pytest.mark.parametrize("dtype", [nbx.bfloat16, nbx.float32, nbx.float16])
def test_embedding(device, dtype):
    g = rng()
    v, h = 50, 65
    w = _arr((v, h), dtype, g)
    ind = g.integers(0, v, (3, 7))
    ind[0, 0] = v - 1
    r = nbx.embedding(_idx(ind, device), nbx.tensor(w, device=device), padding_idx=0)
    assert r.shape == (3, 7, h) and r.dtype is dtype
    np.testing.assert_array_equal(r.numpy(), w[ind])
    r = nbx.embedding(_idx(ind, device, nbx.int32, "transposed"), _t(w, device, "strided"))
    np.testing.assert_array_equal(r.numpy(), w[ind])
    r = nbx.embedding(nbx.tensor(4, device=device), nbx.tensor(w, device=device))
    np.testing.assert_array_equal(r.numpy(), w[4])
    with _raises(device, r"embedding: index 50 .*\[0, 49\]"):
        nbx.embedding(_idx([[1, 50]], device), nbx.tensor(w, device=device))
    with _raises(device, r"embedding: index -1 "):
        nbx.embedding(_idx([-1], device), nbx.tensor(w, device=device))


def test_take(device):
    g = rng()
    x = _arr((6, 35), nbx.float32, g)
    ind = g.integers(-x.size, x.size, (4, 9))
    expect = x.ravel()[ind]
    for lay in LAYOUTS:
        r = nbx.take(_t(x, device, lay), _idx(ind, device))
        np.testing.assert_array_equal(r.numpy(), expect)
    with _raises(device, r"take: index 210 .*\[-210, 209\]"):
        nbx.take(nbx.tensor(x, device=device), _idx([x.size], device))


# ---------------------------------------------------------------------------- scatter family
def _scatter_ref(x, dim, ind, src, fn):
    out = x.astype(np.float64).copy()
    coords = np.indices(ind.shape)
    for c in zip(*[a.ravel() for a in coords]):
        t = list(c)
        t[dim] = ind[c]
        out[tuple(t)] = fn(out[tuple(t)], src[c])
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scatter_store_and_value(device, layout):
    g = rng()
    x = _arr((6, 33), nbx.float32, g)
    src = _arr((4, 34), nbx.float32, g)
    # a permutation per column: no duplicate targets, so the store result is defined
    ind = np.stack([g.permutation(6)[:4] for _ in range(33)], 1)
    expect = _scatter_ref(x, 0, ind, src, lambda a, b: b)
    out = poisoned(x.shape, nbx.float32, device)
    r = nbx.scatter(_t(x, device, layout), 0, _idx(ind, device, layout=layout),
                    _t(src, device, layout), out=out)
    assert r is out
    assert_close(r, expect)
    r = nbx.scatter(_t(x, device, layout), 0, _idx(ind, device), 2.5)
    assert_close(r, _scatter_ref(x, 0, ind, np.full(ind.shape, 2.5), lambda a, b: b))
    t = _t(x, device, layout)
    assert t.scatter_(0, _idx(ind, device), value=-1.0) is t
    assert_close(t, _scatter_ref(x, 0, ind, np.full(ind.shape, -1.0), lambda a, b: b))


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.float64, nbx.int32, nbx.int64, nbx.float16,
                                   nbx.bfloat16])
def test_scatter_add_duplicates(device, dtype):
    g = rng()
    x = _arr((5, 33), dtype, g)
    src = _arr((40, 33), dtype, g)
    ind = g.integers(0, 5, (40, 33))  # many duplicates
    expect = _scatter_ref(x, 0, ind, src.astype(np.float64), lambda a, b: a + b)
    r = nbx.scatter_add(nbx.tensor(x, device=device), 0, _idx(ind, device),
                        nbx.tensor(src, device=device))
    tol = {nbx.float16: 2e-2, nbx.bfloat16: 1.5e-1}.get(dtype)
    assert_close(r, expect.astype(dtype.np) if dtype.kind == "i" else expect, rtol=tol, atol=tol)
    t = nbx.tensor(x, device=device)
    t.scatter_add_(0, _idx(ind, device), nbx.tensor(src, device=device))
    assert_close(t, expect.astype(dtype.np) if dtype.kind == "i" else expect, rtol=tol, atol=tol)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin", "prod"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [nbx.float32, nbx.int64])
def test_scatter_reduce(device, reduce, include_self, dtype):
    g = rng()
    x = _arr((4, 33), dtype, g)
    src = _arr((3, 35), dtype, g)
    if dtype.kind == "i" and reduce == "prod":
        x, src = x % 5, src % 5
    ind = g.integers(0, 33, (3, 34))
    fns = {"sum": np.add, "prod": np.multiply, "amax": np.maximum, "amin": np.minimum}
    hit = np.zeros(x.shape, bool)
    sums = np.zeros(x.shape)
    cnt = np.zeros(x.shape)
    base = x.astype(np.float64).copy()
    for c in zip(*[a.ravel() for a in np.indices(ind.shape)]):
        t = (c[0], ind[c])
        v = float(src[c])
        if reduce == "mean":
            sums[t] += v
            cnt[t] += 1
        elif not include_self and not hit[t]:
            base[t] = v
        else:
            base[t] = fns[reduce](base[t], v)
        hit[t] = True
    if reduce == "mean":
        tot = sums + (x if include_self else 0) * np.where(hit | include_self, 1, 0)
        n = cnt + (1 if include_self else 0)
        if dtype.kind == "f":
            base = np.where(hit, tot / np.maximum(n, 1), x)
        else:
            base = np.where(hit, np.floor_divide(tot, np.maximum(n, 1)), x)
    out = poisoned(x.shape, dtype, device)
    r = nbx.scatter_reduce(nbx.tensor(x, device=device), 1, _idx(ind, device),
                           _t(src, device, "strided"), reduce, include_self=include_self, out=out)
    assert_close(r, base.astype(dtype.np) if dtype.kind == "i" else base, rtol=1e-5)


def test_scatter_errors(device):
    x = nbx.tensor(np.zeros((3, 4), np.float32), device=device)
    src = nbx.tensor(np.ones((1, 2), np.float32), device=device)
    with _raises(device, r"scatter_add: index 3 .*dim 0 of size 3.*\[0, 2\]"):
        nbx.scatter_add(x, 0, _idx([[0, 3]], device), src)
    with _raises(device, r"scatter: index -2 "):
        nbx.scatter(x, 0, _idx([[0, -2]], device), src)
    with pytest.raises(TypeError, match="dtype"):
        nbx.scatter(x, 0, _idx([[0, 1]], device), src.double() if device == "cpu" else
                    nbx.tensor(np.ones((1, 2)), device=device))
    with pytest.raises(ValueError, match="reduce"):
        nbx.scatter_reduce(x, 0, _idx([[0, 1]], device), src, "max")
    np.testing.assert_array_equal(x.numpy(), 0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_index_add_copy_fill(device, layout):
    g = rng()
    x = _arr((9, 33), nbx.float32, g)
    ind = np.array([3, 0, 8, 3, 5])  # a duplicate: adds accumulate
    src = _arr((5, 33), nbx.float32, g)
    e = x.astype(np.float64).copy()
    np.add.at(e, ind, 2.0 * src.astype(np.float64))
    out = poisoned(x.shape, nbx.float32, device)
    r = nbx.index_add(_t(x, device, layout), 0, _idx(ind, device), _t(src, device, layout),
                      alpha=2.0, out=out)
    assert r is out
    assert_close(r, e, rtol=1e-5)
    t = _t(x, device, layout)
    assert t.index_add_(0, _idx(ind, device), _t(src, device), alpha=2) is t
    assert_close(t, e, rtol=1e-5)
    ind_u = np.array([4, 0, 8])
    e = x.copy()
    srcc = _arr((9, 3), nbx.float32, g)
    e[:, ind_u] = srcc
    r = nbx.index_copy(_t(x, device, layout), 1, _idx(ind_u, device), _t(srcc, device, layout))
    np.testing.assert_array_equal(r.numpy(), e)
    e = x.copy()
    e[:, ind_u] = -3.5
    r = _t(x, device, layout).index_fill(1, _idx(ind_u, device), -3.5)
    np.testing.assert_array_equal(r.numpy(), e)
    t = _t(x, device, layout)
    t.index_fill_(1, _idx(ind_u, device), nbx.tensor(-3.5))
    np.testing.assert_array_equal(t.numpy(), e)
    with _raises(device, r"index_add: index 9 .*\[0, 8\]"):
        nbx.index_add(_t(x, device), 0, _idx([9], device), _t(src[:1], device))
    with pytest.raises(ValueError, match="source must have shape"):
        nbx.index_add(_t(x, device), 0, _idx([1], device), _t(src, device))


def test_index_add_int(device):
    g = rng()
    x = _arr((6, 7), nbx.int32, g)
    src = _arr((6, 4), nbx.int32, g)
    ind = np.array([1, 1, 6, 0])
    e = x.astype(np.int64).copy()
    np.add.at(e.T, ind, 3 * src.T.astype(np.int64))
    r = nbx.index_add(nbx.tensor(x, device=device), 1, _idx(ind, device),
                      nbx.tensor(src, device=device), alpha=3)
    np.testing.assert_array_equal(r.numpy(), e.astype(np.int32))


# ---------------------------------------------------------------------------- masks
@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16, nbx.float64, nbx.int64, nbx.bool])
def test_masked_fill(device, dtype):
    g = rng()
    x = _arr((3, 5, 33), dtype, g)
    m = g.random((5, 1)) < 0.5  # broadcast mask
    value = {"f": -1e9 if dtype is not nbx.bfloat16 else -3.0, "i": -(2 ** 40), "b": True}[dtype.kind]
    if dtype is nbx.float64:
        value = 0.1  # not exact in float32: the value travels as float64 bits
    e = np.where(m, np.asarray(value).astype(dtype.np), x)
    for lay in LAYOUTS:
        r = nbx.masked_fill(_t(x, device, lay), nbx.tensor(m, device=device), value)
        np.testing.assert_array_equal(r.numpy(), e)
    t = _t(x, device, "strided")
    assert t.masked_fill_(nbx.tensor(m, device=device), nbx.tensor(value, dtype=dtype)) is t
    np.testing.assert_array_equal(t.numpy(), e)
    # a mask with more dims broadcasts the result (out of place)
    m2 = g.random((2, 1, 1, 33)) < 0.5
    r = nbx.tensor(x, device=device).masked_fill(nbx.tensor(m2, device=device), value)
    np.testing.assert_array_equal(r.numpy(), np.where(m2, np.asarray(value).astype(dtype.np), x))


def test_masked_fill_nan_inf_and_errors(device):
    x = nbx.tensor(np.array([1.0, np.nan, np.inf], np.float32), device=device)
    m = nbx.tensor(np.array([True, False, True]), device=device)
    r = x.masked_fill(m, float("-inf"))
    np.testing.assert_array_equal(r.numpy(), [-np.inf, np.nan, -np.inf])
    r = x.masked_fill(m, float("nan"))
    assert np.isnan(r.numpy()[[0, 2]]).all()
    with pytest.raises(TypeError, match="mask must be a bool"):
        x.masked_fill(nbx.tensor([1, 0, 1], device=device), 0.0)
    with pytest.raises(OverflowError, match="overflow"):
        nbx.tensor(np.zeros(3, np.uint8), device=device).masked_fill(m, 300)
    with pytest.raises(ValueError, match="0-dim"):
        x.masked_fill(m, nbx.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="cannot be broadcast"):
        x.masked_fill_(nbx.tensor(np.ones((2, 3), bool), device=device), 0.0)


def test_masked_select_and_scatter(device):
    g = rng()
    x = _arr((4, 37), nbx.float32, g)
    m = g.random((37,)) < 0.4
    for lay in LAYOUTS:
        r = nbx.masked_select(_t(x, device, lay), nbx.tensor(m, device=device))
        np.testing.assert_array_equal(r.numpy(), np.broadcast_to(x, x.shape)[np.broadcast_to(m, x.shape)])
    out = poisoned((int(np.broadcast_to(m, x.shape).sum()),), nbx.float32, device)
    assert nbx.masked_select(nbx.tensor(x, device=device), nbx.tensor(m, device=device), out=out) is out
    none = nbx.masked_select(nbx.tensor(x, device=device), nbx.tensor(np.zeros(37, bool), device=device))
    assert none.shape == (0,)
    src = _arr((200,), nbx.float32, g)
    mm = np.broadcast_to(m, x.shape)
    e = x.copy()
    e[mm] = src[:mm.sum()]
    for lay in LAYOUTS:
        r = nbx.masked_scatter(_t(x, device, lay), nbx.tensor(m, device=device),
                               nbx.tensor(src, device=device))
        np.testing.assert_array_equal(r.numpy(), e)
    t = _t(x, device, "transposed")
    t.masked_scatter_(nbx.tensor(m, device=device), _t(src.reshape(8, 25), device, "strided"))
    np.testing.assert_array_equal(t.numpy(), e)
    with pytest.raises(ValueError, match="only 3 elements"):
        nbx.masked_scatter(nbx.tensor(x, device=device), nbx.tensor(m | True, device=device),
                           nbx.tensor(src[:3], device=device))


# ---------------------------------------------------------------------------- advanced indexing
GETITEM_CASES = [
    lambda i: (i["a"],),                          # one int tensor
    lambda i: (slice(None), i["b"]),               # on a middle dim
    lambda i: (i["a"], i["b"]),                    # adjacent: broadcast together
    lambda i: (i["a"], slice(1, None, 2), i["c"]),  # separated: move to the front
    lambda i: (Ellipsis, i["c"]),                  # after an ellipsis
    lambda i: (None, i["a"], 2, None, slice(None)),  # None and an adjacent int mixed
    lambda i: (i["neg"],),                         # negative indices wrap
    lambda i: (i["mask0"],),                       # a bool mask over the first dim
    lambda i: (i["mask01"], 1),                    # a 2-D bool mask, then an int
    lambda i: (slice(None), i["mask12"]),          # a bool mask over the last two dims
    lambda i: (i["a2"], slice(None), i["c2"]),     # 2-D index tensors, separated
    lambda i: (i["list"], i["b0"]),                # a list and a 0-dim tensor
    lambda i: (True,),                             # a Python bool
    lambda i: (i["empty"], slice(None)),           # an empty index
]


def _idx_sets(shape, g):
    a0, a1, a2 = shape
    return {
        "a": g.integers(0, a0, 6), "b": g.integers(0, a1, 6), "c": g.integers(0, a2, 6),
        "neg": g.integers(-a0, a0, (2, 3)),
        "mask0": g.random(a0) < 0.5, "mask01": g.random((a0, a1)) < 0.5,
        "mask12": g.random((a1, a2)) < 0.5,
        "a2": g.integers(0, a0, (3, 1)), "c2": g.integers(0, a2, (1, 4)),
        "list": [0, a0 - 1, 1], "b0": np.int64(a1 - 2), "empty": np.zeros(0, np.int64),
    }


def _conv(ix, device, kind):
    out = []
    for it in ix:
        if isinstance(it, np.ndarray):
            it = nbx.tensor(it, device=device) if kind == "tensor" or it.ndim == 0 else \
                (it if kind == "ndarray" else it.tolist())
            if kind == "int32" and isinstance(it, nbx.Tensor) and it.dtype is nbx.int64:
                it = it.int()
        elif isinstance(it, np.int64):
            it = nbx.tensor(it, device=device)
        out.append(it)
    return tuple(out)


def _np_index(ix):
    return tuple(np.array(v) if isinstance(v, (list, np.int64)) else v for v in ix)


@pytest.mark.parametrize("case", range(len(GETITEM_CASES)))
@pytest.mark.parametrize("kind", ["tensor", "ndarray", "list"])
def test_getitem(device, case, kind):
    g = rng()
    x = _arr((5, 7, 33), nbx.float32, g)
    ix = GETITEM_CASES[case](_idx_sets(x.shape, g))
    expect = x[_np_index(ix)]
    for lay in ("contig", "transposed"):
        r = _t(x, device, lay)[_conv(ix, device, kind)]
        np.testing.assert_array_equal(r.numpy(), expect)


def test_getitem_torch_int_rule(device):
    """An int separated from an index tensor is applied first (torch), unlike NumPy."""
    g = rng()
    x = _arr((3, 4, 5), nbx.float32, g)
    r = nbx.tensor(x, device=device)[0, :, [1, 2]]
    assert r.shape == (4, 2)
    np.testing.assert_array_equal(r.numpy(), x[0][:, [1, 2]])


def test_getitem_errors(device):
    x = nbx.tensor(np.ones((3, 4), np.float32), device=device)
    with _raises(device, r"index 3 is out of range for dimension 0 with size 3"):
        x[[0, 3]]
    with _raises(device, r"index -5 .*dimension 1 with size 4.*\[-4, 3\]"):
        x[[0, 1], [-5, 0]]
    with pytest.raises(IndexError, match="shape of the mask"):
        x[nbx.tensor(np.ones(4, bool), device=device)]
    with pytest.raises(IndexError, match="broadcast"):
        x[[0, 1], [0, 1, 2]]
    with pytest.raises(IndexError, match="int64, int32 or bool"):
        x[nbx.tensor([0.0], device=device)]


@pytest.mark.parametrize("case", range(len(GETITEM_CASES)))
def test_setitem(device, case):
    g = rng()
    x = _arr((5, 7, 33), nbx.float32, g)
    sets = _idx_sets(x.shape, g)
    for k in ("a", "b", "c"):  # unique targets, so stores are defined
        sets[k] = g.permutation(x.shape["abc".index(k)])[:4]
    sets["neg"] = np.array([-1, 0, 2])
    sets["a2"], sets["c2"] = np.array([[0], [3]]), np.array([[5, 7, 9]])
    ix = GETITEM_CASES[case](sets)
    shape = x[_np_index(ix)].shape
    v = _arr(shape, nbx.float32, g)
    e = x.copy()
    e[_np_index(ix)] = v
    t = _t(x, device, "transposed")
    t[_conv(ix, device, "tensor")] = nbx.tensor(v, device=device)
    np.testing.assert_array_equal(t.numpy(), e)
    e = x.copy()
    e[_np_index(ix)] = 7.0
    t = nbx.tensor(x, device=device)
    t[_conv(ix, device, "list")] = 7.0
    np.testing.assert_array_equal(t.numpy(), e)


def test_setitem_broadcast_cast_and_alias(device):
    g = rng()
    x = _arr((6, 33), nbx.float32, g)
    t = nbx.tensor(x, device=device)
    row = _arr((33,), nbx.float64, g)
    t[[1, 4]] = nbx.tensor(row, device=device)  # broadcast and cast float64 -> float32
    e = x.copy()
    e[[1, 4]] = row.astype(np.float32)
    np.testing.assert_array_equal(t.numpy(), e)
    t[[0, 2]] = t[[2, 0]]  # values alias the destination
    e[[0, 2]] = e[[2, 0]]
    np.testing.assert_array_equal(t.numpy(), e)
    m = g.random((6, 33)) < 0.5
    t[nbx.tensor(m, device=device)] = 0.0
    e[m] = 0.0
    np.testing.assert_array_equal(t.numpy(), e)


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.int64, nbx.bfloat16])
def test_index_put_accumulate(device, dtype):
    g = rng()
    x = _arr((8, 33), dtype, g)
    i0 = g.integers(-8, 8, 50)  # duplicates and negatives
    i1 = g.integers(0, 33, 50)
    v = _arr((50,), dtype, g)
    e = x.astype(np.float64).copy()
    np.add.at(e, (i0, i1), v.astype(np.float64))
    r = nbx.index_put(nbx.tensor(x, device=device), (_idx(i0, device), _idx(i1, device)),
                      nbx.tensor(v, device=device), accumulate=True)
    tol = 5e-2 if dtype is nbx.bfloat16 else None
    assert_close(r, e.astype(dtype.np) if dtype.kind == "i" else e, rtol=tol, atol=tol)
    t = nbx.tensor(x, device=device)
    assert t.index_put_((_idx(i0, device), _idx(i1, device)), nbx.tensor(v, device=device),
                        accumulate=True) is t
    assert_close(t, e.astype(dtype.np) if dtype.kind == "i" else e, rtol=tol, atol=tol)
    t = nbx.tensor(x, device=device)
    t.index_put_((None, _idx([1, 2], device)), nbx.tensor(x[:, :2].copy(), device=device))
    e = x.copy()
    e[:, [1, 2]] = x[:, :2]
    np.testing.assert_array_equal(t.numpy(), e)
    with pytest.raises(TypeError, match="dtype"):
        nbx.index_put(nbx.tensor(x, device=device), (_idx([0], device),),
                      nbx.tensor(np.ones(33, np.float16 if dtype is not nbx.float16 else np.float32),
                                 device=device))
    with _raises(device, r"index_put: index 8 .*dimension 0 with size 8"):
        nbx.index_put(nbx.tensor(x, device=device), (_idx([8], device),),
                      nbx.tensor(v[:1], device=device))


def test_out_of_range_leaves_no_trace_in_later_calls(device):
    x = nbx.tensor(np.arange(10.0, dtype=np.float32), device=device)
    for _ in range(2):
        with _raises(device):
            x[[1, 10]]
        np.testing.assert_array_equal(x[[1, 9]].numpy(), [1.0, 9.0])


@pytest.fixture
def async_checks(device):
    """Async index checks on this device (the cuda default; interp opts in for the test)."""
    from nbxtensor.kernels import indexing as kix
    if device == "cpu":
        pytest.skip("cpu checks indices on the host, before any write")
    added = "interp" not in kix.ASYNC_TYPES
    kix.ASYNC_TYPES.add(device)
    # an index op captured into a graph by an earlier test of this process keeps PENDING set
    # after every read (replays run no Python): these tests start without such a graph
    graph_ops = kix._GRAPH_OPS[0]
    kix._GRAPH_OPS[0] = False
    yield kix
    kix._GRAPH_OPS[0] = graph_ops
    if added:
        kix.ASYNC_TYPES.discard("interp")


def _sync_point(device, kix):
    if device == "cuda":
        nbx.cuda.synchronize()
    else:
        kix.check_pending()


def test_async_index_error_surfaces_at_the_next_sync(device, async_checks):
    kix = async_checks
    g = rng()
    x = g.standard_normal((6, 33)).astype(np.float32)
    xt = nbx.tensor(x, device=device)
    buf = nbx.tensor(np.full((8, 33), np.nan, np.float32), device=device)
    out = buf[1:7]  # the op's output inside a NaN guard band
    ind = g.integers(0, 6, (6, 33))
    ind[2, 5] = 9
    r = nbx.gather(xt, 0, _idx(ind, device), out=out)  # no error at the op
    assert r is out and kix.PENDING[0]
    r2 = nbx.index_select(xt, 1, _idx([32, 0], device))  # a later good op runs
    # a second bad op: the error names the first one (op and value)
    nbx.embedding(_idx([50], device), xt)
    with pytest.raises(IndexError, match=r"gather: index 9 is out of range for dim 0 of size 6"
                                         r".*later synchronising call"):
        _sync_point(device, kix)
    assert not kix.PENDING[0]
    # the bad op wrote every good position and nothing outside its output
    got = buf.numpy()
    assert np.isnan(got[0]).all() and np.isnan(got[7]).all()
    good = np.ones(ind.shape, bool)
    good[2, 5] = False
    np.testing.assert_array_equal(got[1:7][good], np.take_along_axis(x, np.minimum(ind, 5), 0)[good])
    np.testing.assert_array_equal(r2.numpy(), x[:, [32, 0]])
    # the flag was reset: later ops and syncs are clean
    np.testing.assert_array_equal(nbx.index_select(xt, 0, _idx([5], device)).numpy(), x[[5]])
    _sync_point(device, kix)


def test_async_scatter_does_not_write_outside(device, async_checks):
    kix = async_checks
    base = nbx.tensor(np.full(12, 7.0, np.float32), device=device)
    dst = base[1:11]
    src = nbx.tensor(np.arange(1.0, 4.0, dtype=np.float32), device=device)
    dst.scatter_(0, _idx([2, 10, 4], device), src)   # 10 would land on base[11]
    nbx.index_add(dst, 0, _idx([-1], device), src[:1])  # -1 would land on base[0]
    with pytest.raises(IndexError, match=r"scatter_: index 10 .*dim 0 of size 10"):
        _sync_point(device, kix)
    b = base.numpy()
    assert b[0] == 7.0 and b[11] == 7.0
    assert b[3] == 1.0 and b[5] == 3.0  # the in-range updates of the bad call were applied


def test_async_index_error_at_host_reads_and_stream_syncs(device):
    """cuda: every seam that synchronises raises a recorded index error."""
    if device != "cuda":
        pytest.skip("the seams are cuda's")
    x = nbx.tensor(np.arange(10.0, dtype=np.float32), device="cuda")
    other = nbx.tensor(np.ones(3, np.float32), device="cuda")
    seams = [lambda: other[:1].item(),
             lambda: other.numpy(), lambda: other.tolist(), lambda: other.to("cpu"),
             lambda: nbx.cuda.synchronize(), lambda: nbx.cuda.current_stream().synchronize()]
    for k, seam in enumerate(seams):
        nbx.index_select(x, 0, _idx([3, 10 + k], "cuda"))
        with pytest.raises(IndexError, match=rf"index_select: index {10 + k} is out of range"):
            seam()
        seam()  # reported once
    ev = nbx.cuda.Event()
    nbx.take(x, _idx([40], "cuda"))
    ev.record()
    with pytest.raises(IndexError, match=r"take: index 40 "):
        ev.synchronize()


def test_async_index_error_on_a_side_stream_is_seen_by_a_read_on_the_current_stream(device):
    """cuda: a bad index op queued behind work on another stream must not be missed by a
    host read on the current stream (which waits for its own stream only). On the H200
    (driver 580) the read passed this test without the context-wide wait too -- its
    synchronous device-to-host copy already waited for the side stream -- so the test pins
    the behaviour; the wait in `_read_flag` makes it a guarantee instead of a driver habit."""
    if device != "cuda":
        pytest.skip("streams are cuda's")
    g = rng()
    x = nbx.tensor(g.standard_normal(10).astype(np.float32), device="cuda")
    other = nbx.tensor(g.standard_normal(3).astype(np.float32), device="cuda")
    a = nbx.tensor(g.standard_normal((4096, 4096)).astype(np.float32), device="cuda")
    # a good index op first: the device's error flag is made (a host-to-device copy, which
    # would wait for the stream it runs on) before the side stream gets busy
    np.testing.assert_array_equal(nbx.index_select(x, 0, _idx([1], "cuda")).numpy(),
                                  x.numpy()[[1]])
    s = nbx.cuda.Stream()
    with nbx.cuda.stream(s):
        bad = _idx([3, 12], "cuda")
        for _ in range(4):       # fp32 4096^3 products (~3 ms each on an H200) keep the side
            c = a @ a            # stream busy long past the host's enqueueing, so the bad op
        del c                    # has not run when the current stream's read happens
        nbx.index_select(x, 0, bad)
    with pytest.raises(IndexError, match=r"index_select: index 12 is out of range"):
        other[:1].item()
    s.synchronize()
    other[:1].item()   # reported once


def test_sync_mode_raises_at_the_op(device):
    set_index_check = nbx.set_index_check
    x = nbx.tensor(np.arange(10.0, dtype=np.float32), device=device)
    prev = set_index_check("sync")
    try:
        with pytest.raises(IndexError, match=r"index_select: index 11 "):
            nbx.index_select(x, 0, _idx([11], device))
        with pytest.raises(ValueError, match="mode"):
            set_index_check("later")
    finally:
        set_index_check(prev)
    assert prev == "async"


def test_deferred_index_checks(device):
    from nbxtensor.ops.indexing import deferred_index_checks
    x = nbx.tensor(np.arange(10.0, dtype=np.float32), device=device)
    with deferred_index_checks():
        np.testing.assert_array_equal(x[[1, 9]].numpy(), [1.0, 9.0])
    if device == "cpu":
        with pytest.raises(IndexError), deferred_index_checks():
            x[[1, 10]]
        return
    with pytest.raises(IndexError, match="index 12 is out of range"):
        with deferred_index_checks():
            r = x[[1, 12]]  # no error yet: the bad element was masked, not read
            r2 = nbx.index_select(x, 0, _idx([2], device))
    np.testing.assert_array_equal(r2.numpy(), [2.0])
    np.testing.assert_array_equal(r.numpy()[:1], [1.0])
    np.testing.assert_array_equal(x[[3]].numpy(), [3.0])  # the flag was reset


@pytest.mark.parametrize("dtype", [nbx.int8, nbx.uint8, nbx.int16, nbx.float8_e4m3fn, nbx.bool])
def test_accumulate_narrow_dtypes(device, dtype):
    """8/16-bit and bool accumulation (no native GPU atomics: widened, then cast back)."""
    g = rng()
    x = _arr((6, 33), dtype, g)
    v = _arr((40,), dtype, g)
    if dtype is nbx.float8_e4m3fn:
        x = (g.integers(-4, 4, (6, 33)) * 0.5).astype(dtype.np)  # sums stay exact
        v = (g.integers(-4, 4, 40) * 0.5).astype(dtype.np)
    i0, i1 = g.integers(0, 6, 40), g.integers(0, 33, 40)
    t = _t(x, device, "strided")
    t.index_put_((_idx(i0, device), _idx(i1, device)), nbx.tensor(v, device=device),
                 accumulate=True)
    if dtype.kind == "b":
        e = x.copy()
        np.logical_or.at(e, (i0, i1), v)
    elif dtype.kind == "f":
        e = x.astype(np.float64)
        np.add.at(e, (i0, i1), v.astype(np.float64))
        e = e.astype(dtype.np)
    else:
        e = x.astype(np.int64)
        np.add.at(e, (i0, i1), v.astype(np.int64))
        e = e.astype(dtype.np)  # wraps modulo 2^bits, as torch
    np.testing.assert_array_equal(t.numpy(), e)
    if dtype.kind in "iu":
        src = _arr((3, 33), dtype, g)
        ind = g.integers(0, 6, (3, 33))
        r = nbx.scatter_reduce(nbx.tensor(x, device=device), 0, _idx(ind, device),
                               nbx.tensor(src, device=device), "amax", include_self=False)
        e = x.copy()
        seen = np.zeros(x.shape, bool)
        for a in range(3):
            for b in range(33):
                k = ind[a, b]
                e[k, b] = src[a, b] if not seen[k, b] else max(e[k, b], src[a, b])
                seen[k, b] = True
        np.testing.assert_array_equal(r.numpy(), e)


def test_scatter_reduce_half_amax(device):
    g = rng()
    x = _arr((4, 33), nbx.float16, g)
    src = _arr((4, 33), nbx.float16, g)
    ind = g.integers(0, 4, (4, 33))
    r = nbx.scatter_reduce(nbx.tensor(x, device=device), 0, _idx(ind, device),
                           nbx.tensor(src, device=device), "amin")
    e = x.copy()
    np.minimum.at(e, (ind, np.broadcast_to(np.arange(33), ind.shape)), src)
    np.testing.assert_array_equal(r.numpy(), e)


def test_gather_high_rank_permuted(device):
    """More than 4 dims that cannot merge: the Triton entry loops over the first dim."""
    g = rng()
    x = _arr((2, 3, 4, 3, 5, 6), nbx.float32, g)
    ind = g.integers(0, 6, (2, 3, 4, 3, 5, 4))
    perm = (1, 0, 3, 2, 4, 5)
    xt = nbx.tensor(np.ascontiguousarray(x.transpose(perm)), device=device).permute(perm)
    it = nbx.tensor(np.ascontiguousarray(ind.transpose(perm)), device=device).permute(perm)
    r = nbx.gather(xt, 5, it)
    np.testing.assert_array_equal(r.numpy(), np.take_along_axis(x, ind, 5))
    r = xt[:, [2, 0], :, [1, 1]]  # separated index tensors on a 6-D tensor
    np.testing.assert_array_equal(r.numpy(), x[:, [2, 0], :, [1, 1]])


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.int16, nbx.float16])
def test_scatter_multiply(device, dtype):
    """reduce='multiply'/'prod' (a compare-and-swap loop on GPUs), tensor and scalar sources."""
    g = rng()
    x = (g.integers(-3, 4, (5, 33))).astype(dtype.np)
    src = (g.integers(-2, 3, (8, 33))).astype(dtype.np)
    ind = g.integers(0, 5, (8, 33))  # duplicates: several factors per element
    cols = np.broadcast_to(np.arange(33), ind.shape)
    e = x.astype(np.float64)
    np.multiply.at(e, (ind, cols), src.astype(np.float64))
    r = nbx.scatter(nbx.tensor(x, device=device), 0, _idx(ind, device),
                    nbx.tensor(src, device=device), reduce="multiply")
    np.testing.assert_array_equal(r.numpy(), e.astype(dtype.np))
    e = x.astype(np.float64)
    np.multiply.at(e, (ind, cols), -2.0)
    r = nbx.scatter(nbx.tensor(x, device=device), 0, _idx(ind, device), -2, reduce="multiply")
    np.testing.assert_array_equal(r.numpy(), e.astype(dtype.np))


def test_zero_dim_masks_and_overflow(device):
    x = nbx.tensor(np.float32(1.5), device=device)
    m = nbx.tensor(True, device=device)
    np.testing.assert_array_equal(nbx.masked_select(x, m).numpy(), [1.5])
    assert nbx.masked_select(x, nbx.tensor(False, device=device)).shape == (0,)
    np.testing.assert_array_equal(x.masked_fill(m, 2.0).numpy(), 2.0)
    h = nbx.tensor(np.ones(3, np.float16), device=device)
    with pytest.raises(OverflowError, match="overflow"):
        h.masked_fill(nbx.tensor(np.ones(3, bool), device=device), 1e6)
    np.testing.assert_array_equal(
        h.masked_fill(nbx.tensor(np.ones(3, bool), device=device), float("inf")).numpy(), np.inf)


def test_async_multi_index_error_reads_and_writes_nothing_outside(device, async_checks):
    """Several advanced indices are linearised into one element offset, then gathered/scattered
    with no bound of their own: a bad index must not become an offset outside the tensor
    (x[[0, 1], [-5, 0]] would read the element before x; a setitem would write it)."""
    kix = async_checks
    base = nbx.tensor(np.full(14, 99.0, np.float32), device=device)
    x = base[1:13].view(3, 4)
    x[...] = nbx.tensor(np.arange(12.0, dtype=np.float32).reshape(3, 4), device=device)
    r = x[_idx([0, 1], device), _idx([-5, 0], device)]       # -5 -> offset -1 -> base[0]
    with pytest.raises(IndexError, match=r"index -5 is out of range for dimension 1 with size 4"):
        _sync_point(device, kix)
    got = r.numpy()
    assert got[1] == 4.0 and got[0] != 99.0   # never data from outside the source
    x[_idx([0, 3], device), _idx([0, 0], device)] = 7.0     # 3 -> offset 12 -> base[13]
    with pytest.raises(IndexError, match=r"index 3 is out of range for dimension 0 with size 3"):
        _sync_point(device, kix)
    b = base.numpy()
    assert b[0] == 99.0 and b[13] == 99.0 and b[1] == 7.0
    # a bad first index must not be revived by the second one's offset (accumulated sentinel)
    x[_idx([-4, 0], device), _idx([1, 1], device)] = 5.0     # -4 + 3 -> -1: offset -4 + 1
    with pytest.raises(IndexError, match=r"index -4 is out of range"):
        _sync_point(device, kix)
    b = base.numpy()
    assert b[0] == 99.0 and b[13] == 99.0 and b[2] == 5.0


def test_async_errors_of_every_device_are_reported(device, async_checks, monkeypatch):
    """Two devices with recorded errors: the first sync raises one, and the other stays
    pending for the next sync (it was lost: PENDING was cleared before the first raise)."""
    kix = async_checks
    x = nbx.tensor(np.arange(10.0, dtype=np.float32), device=device)
    nbx.index_select(x, 0, _idx([12], device))
    other = nbx.tensor(np.array([1, 7, kix._tag(("take", "a second device", 0, 3)), 0],
                                np.int64), device=device)
    monkeypatch.setitem(kix._FLAGS, "second-device", other)   # read after the real device's
    with pytest.raises(IndexError, match="index_select: index 12 "):
        _sync_point(device, kix)
    assert kix.PENDING[0]
    with pytest.raises(IndexError, match="take: index 7 is out of range for a second device"):
        _sync_point(device, kix)
    assert not kix.PENDING[0]
    _sync_point(device, kix)


def test_flag_read_from_another_thread_waits_for_the_reader(device, async_checks, monkeypatch):
    """A sync on a second thread while the first is reading the flags must wait for that read
    (it returned at once, unchecked, behind a process-wide busy bit), and the error is
    reported once."""
    import threading
    kix = async_checks
    x = nbx.tensor(np.arange(10.0, dtype=np.float32), device=device)
    entered, gate = threading.Event(), threading.Event()
    orig = kix._read_flag

    def slow_read(dev, deferred):
        if threading.current_thread().name == "reader":
            entered.set()
            gate.wait(10)
        return orig(dev, deferred)

    monkeypatch.setattr(kix, "_read_flag", slow_read)
    errors = []

    def sync():
        try:
            kix.check_pending()
        except IndexError as e:
            errors.append(e)

    nbx.index_select(x, 0, _idx([11], device))
    a = threading.Thread(target=sync, name="reader")
    a.start()
    assert entered.wait(10)
    b = threading.Thread(target=sync, name="second")
    b.start()
    b.join(0.5)
    still_waiting = b.is_alive()
    gate.set()
    a.join(10)
    b.join(10)
    assert still_waiting
    assert len(errors) == 1 and "index_select: index 11 " in str(errors[0])


def test_gather_fast_path_hits_follow_offsets_and_dtypes(device):
    """gather / index_select / embedding cache their plan by layout: a second call with the
    same shapes and strides but other storage offsets (and the other index dtype, another
    key) must read its own tensors."""
    from nbxtensor.ops import indexing as oix
    g = rng()
    base = g.standard_normal((9, 33)).astype(np.float32)
    xt = nbx.tensor(base, device=device)
    ind = g.integers(0, 4, (4, 33))
    for k, (r0, dt) in enumerate([(0, nbx.int64), (3, nbx.int64), (5, nbx.int32)]):
        x = xt[r0:r0 + 4]                         # same layout, offset r0 * 33
        ia = _idx(np.concatenate([ind, (ind + 1) % 4]), device, dt)[4 * (k % 2):][:4]
        want = (ind + k % 2) % 4
        np.testing.assert_array_equal(nbx.gather(x, 0, ia).numpy(),
                                      np.take_along_axis(base[r0:r0 + 4], want, 0))
        sel = _idx([3, 0, 2, 1, 3, 0], device, dt)[k % 2:][:4]
        np.testing.assert_array_equal(nbx.index_select(x, 1, sel).numpy(),
                                      base[r0:r0 + 4][:, [3, 0, 2, 1, 3, 0][k % 2:][:4]])
        np.testing.assert_array_equal(nbx.embedding(sel, x).numpy(),
                                      base[r0:r0 + 4][[3, 0, 2, 1, 3, 0][k % 2:][:4]])
    keys = [key for key in oix._FAST.keys() if key[0] in ("gather", "index_select", "embedding")]
    assert any(key[5] is nbx.int32 for key in keys) and any(key[5] is nbx.int64 for key in keys)


# ---------------------------------------------------------------------------- _gather2d_kernel
# index_select along a non-leading dim and gather with a full index run _gather2d_kernel on
# cuda/interp (interp tiles: BC <= 16, 64 elements; the shapes below overhang them).
@pytest.fixture
def g2d(device, monkeypatch):
    """(kernel names launched by index_gather, knobs) with fresh plan caches (the knobs change
    what a plan holds, so the plans made under them are dropped afterwards too)."""
    from nbxtensor import plans
    plans.clear_all()
    names = []
    if device == "cpu":
        yield names, None
        return
    from nbxtensor.kernels import indexing as kix
    monkeypatch.setattr(kix, "G2D_CONFIG", {k: dict(v) for k, v in kix.G2D_CONFIG.items()})
    real = kix.launch

    def spy(kernel, grid, *a, **k):
        names.append(kernel.fn.__name__)
        return real(kernel, grid, *a, **k)
    monkeypatch.setattr(kix, "launch", spy)
    yield names, kix
    plans.clear_all()


def _knobs(kix, monkeypatch, variant):
    if kix is None:
        return
    if variant == "i64":     # no int32 offsets: the 64-bit arithmetic path
        monkeypatch.setattr(kix, "_I32_MAX", 0)
    elif variant == "lanes_flag":   # the per-lane atomics that record a bad index
        cfg = kix.G2D_CONFIG["interp"]
        cfg["full"] = cfg["full"][:3] + (True,)


VARIANTS = ["i32", "i64", "lanes_flag"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_index_select_cols_2d(device, g2d, monkeypatch, variant, layout):
    names, kix = g2d
    _knobs(kix, monkeypatch, variant)
    g = rng()
    for shape, dim, dt, idt in [((37, 41), 1, nbx.float32, nbx.int64),
                                ((5, 7, 33), 2, nbx.bfloat16, nbx.int32),
                                ((3, 19), -1, nbx.int16, nbx.int64)]:
        x = _arr(shape, dt, g)
        m = shape[dim] + 4                      # duplicates and more indices than the dim
        ind = g.integers(0, shape[dim], m)
        want = np.take(x, ind, axis=dim)
        iv = _idx(np.repeat(ind, 2), device, idt)[::2] if layout == "strided" \
            else _idx(ind, device, idt)
        out = poisoned(want.shape, dt, device)
        r = nbx.index_select(_t(x, device, layout), dim, iv, out=out)
        np.testing.assert_array_equal(r.numpy(), want)
        np.testing.assert_array_equal(nbx.index_select(_t(x, device, layout), dim, iv).numpy(),
                                      want)
    if kix is not None:
        assert "_gather2d_kernel" in names, names


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gather_full_index_2d(device, g2d, monkeypatch, variant, layout):
    names, kix = g2d
    _knobs(kix, monkeypatch, variant)
    g = rng()
    for shape, ishape, dim, dt, idt in [((37, 41), (35, 39), 1, nbx.float32, nbx.int64),
                                        ((37, 41), (17, 40), 0, nbx.bfloat16, nbx.int32),
                                        ((2, 9, 33), (2, 9, 65), 2, nbx.float16, nbx.int64)]:
        x = _arr(shape, dt, g)
        ind = g.integers(0, shape[dim], ishape)
        sub = x[tuple(slice(0, n) if k != dim % x.ndim else slice(None)
                      for k, n in enumerate(ishape))]
        want = np.take_along_axis(sub, ind, axis=dim)
        out = poisoned(ishape, dt, device)
        r = nbx.gather(_t(x, device, layout), dim, _idx(ind, device, idt, layout), out=out)
        np.testing.assert_array_equal(r.numpy(), want)
    if kix is not None:
        assert "_gather2d_kernel" in names, names


@pytest.mark.parametrize("variant", ["i32", "i64", "lanes_flag"])
def test_gather2d_out_of_range(device, g2d, monkeypatch, variant):
    names, kix = g2d
    _knobs(kix, monkeypatch, variant)
    g = rng()
    x = nbx.tensor(_arr((37, 41), nbx.float32, g), device=device)
    for bad in (41, -1, 1 << 40):
        sel = g.integers(0, 41, 23)
        sel[17] = bad
        with _raises(device, rf"index_select: index {bad} is out of range for dim 1 of size "
                             r"41; the valid range is \[0, 40\]"):
            nbx.index_select(x, 1, _idx(sel, device))
        ind = g.integers(0, 41, (37, 20))
        ind[30, 19] = bad
        with _raises(device, rf"gather: index {bad} is out of range for dim 1 of size 41"):
            nbx.gather(x, 1, _idx(ind, device))
    # the flag was reset: good calls work again
    ind = g.integers(0, 41, (37, 20))
    np.testing.assert_array_equal(nbx.gather(x, 1, _idx(ind, device)).numpy(),
                                  np.take_along_axis(x.numpy(), ind, 1))
    if kix is not None:
        assert set(names) == {"_gather2d_kernel"}, names


# ---------------------------------------------------------------------------- sort, many tiles
@pytest.mark.parametrize("n_tiles", [2, 9, 32])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_many_tiles(device, n_tiles, descending):
    """sort of rows of 2..32 rank tiles (the "ml" path's tile sort and rank-merge levels);
    duplicates check stability."""
    if device != "cpu":
        from nbxtensor.kernels import sort as ks
        n = ks.CONFIG[nbx.device(device).type]["rank_tile"] * (n_tiles - 1) + 5  # overhangs
    else:
        n = 16 * (n_tiles - 1) + 5
    g = rng()
    x = g.integers(-20, 20, (3, n)).astype(np.float32)  # many equal values
    x[1] = g.standard_normal(n)
    key = -x if descending else x
    want_i = np.argsort(key, axis=-1, kind="stable")
    r = nbx.sort(nbx.tensor(x, device=device), -1, descending=descending)
    np.testing.assert_array_equal(r.indices.numpy(), want_i)
    np.testing.assert_array_equal(r.values.numpy(), np.take_along_axis(x, want_i, -1))


def test_out_aliasing_an_operand(device):
    # out= sharing memory with what the op reads: the result goes through a temporary. 64 x
    # 300 with reversed indices spans several programs, so writing in place let later
    # programs read values already overwritten (index_select was off by ~5 on interp).
    g = rng()
    a = g.standard_normal((64, 300)).astype(np.float32)
    rev = np.arange(299, -1, -1)
    x = nbx.tensor(a.copy(), device=device)
    assert nbx.index_select(x, 1, nbx.tensor(rev, device=device), out=x) is x
    np.testing.assert_array_equal(x.numpy(), a[:, ::-1])
    x = nbx.tensor(a.copy(), device=device)
    assert nbx.gather(x, 1, nbx.tensor(np.tile(rev, (64, 1)), device=device), out=x) is x
    np.testing.assert_array_equal(x.numpy(), a[:, ::-1])
    x = nbx.tensor(a.copy(), device=device)
    flat = np.arange(a.size - 1, -1, -1).reshape(a.shape)
    assert nbx.take(x, nbx.tensor(flat, device=device), out=x) is x
    np.testing.assert_array_equal(x.numpy(), a.reshape(-1)[::-1].reshape(a.shape))
    x = nbx.tensor(a.copy(), device=device)
    m = g.random(300) < 0.5
    out = x[0, :int(m.sum())]                            # the selection lands on its input
    assert nbx.masked_select(x[0], nbx.tensor(m, device=device), out=out) is out
    np.testing.assert_array_equal(out.numpy(), a[0][m])
    want = np.zeros_like(a)
    want[:, ::-1] = a
    x = nbx.tensor(a.copy(), device=device)                    # out = src
    zeros = nbx.tensor(np.zeros_like(a), device=device)
    assert nbx.scatter(zeros, 1, nbx.tensor(np.tile(rev, (64, 1)), device=device), x,
                       out=x) is x
    np.testing.assert_array_equal(x.numpy(), want)
    x = nbx.tensor(a.copy(), device=device)                    # out = source
    assert nbx.index_copy(zeros, 1, nbx.tensor(rev, device=device), x, out=x) is x
    np.testing.assert_array_equal(x.numpy(), want)
    x = nbx.tensor(a.copy(), device=device)                    # out = input, another layout
    y = nbx.tensor(np.ascontiguousarray(a[:, :64]), device=device)
    sq = x[:, :64]
    nbx.index_add(sq.T, 0, nbx.tensor(np.arange(64), device=device), y, out=sq)
    np.testing.assert_allclose(sq.numpy(), a[:, :64].T + a[:, :64], rtol=1e-6, atol=1e-6)
