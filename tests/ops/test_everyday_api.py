"""The everyday torch API: factories, view(dtype), closeness, diagonals, einsum, searches,
order statistics, losses and distances, NumPy protocols, repr, and kernel[grid] launches.

References: float64 NumPy computations, and torch's outputs stored by
tests/fixtures/make_everyday_fixtures.py where torch's semantics are subtle."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import nbxtensor as nbx
import nbxtensor.nn.functional as F

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "everyday")
REF = np.load(os.path.join(FIX, "torch_ref.npz"))
NAN = float("nan")


def T(a, device, dtype=None):
    return nbx.tensor(np.asarray(a), dtype=dtype, device=device)


def close(t, ref, rtol=1e-5, atol=1e-6):
    got = t.numpy() if isinstance(t, nbx.Tensor) else np.asarray(t)
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(ref, np.float64), rtol=rtol,
                               atol=atol, equal_nan=True)


def noncontig(a, device):
    """`a` as a non-contiguous tensor (the transpose of a contiguous one)."""
    t = nbx.tensor(np.ascontiguousarray(np.swapaxes(a, -1, -2)), device=device).transpose(-1, -2)
    assert not t.is_contiguous() or min(a.shape[-2:], default=1) <= 1
    return t


# ------------------------------------------------------------------ factories, view(dtype)
def test_new_factories_and_type_as(device):
    x = nbx.tensor([[1.5, 2.0]], dtype=nbx.float16, device=device)
    z = x.new_zeros(2, 3)
    assert z.shape == (2, 3) and z.dtype is nbx.float16 and z.device == x.device
    assert z.numpy().tolist() == [[0] * 3] * 2
    o = x.new_ones((3,), dtype=nbx.int32)
    assert o.dtype is nbx.int32 and o.numpy().tolist() == [1, 1, 1] and o.device == x.device
    f = x.new_full((2,), 7.25)
    assert f.dtype is nbx.float16 and f.numpy().tolist() == [7.25, 7.25]
    assert x.new_empty(4).shape == (4,) and x.new_empty(4).dtype is nbx.float16
    t = x.new_tensor([1, 2, 3])   # torch: the data takes self's dtype, not int64
    assert t.dtype is nbx.float16 and t.numpy().tolist() == [1, 2, 3] and t.device == x.device
    i = nbx.tensor([3, 4], device="cpu")
    c = i.type_as(x)
    assert c.dtype is nbx.float16 and c.device == x.device and c.numpy().tolist() == [3, 4]
    assert x.type_as(x) is x


def test_view_dtype(device):
    a = np.arange(24, dtype=np.uint8).reshape(2, 12) * 7
    x = T(a, device)
    v = x.view(nbx.int32)
    assert v.shape == (2, 3) and v.stride() == (3, 1)
    np.testing.assert_array_equal(v.numpy(), a.view(np.int32))
    w = nbx.tensor(np.array([1.5, -2.25], np.float32), device=device).view(nbx.uint8)
    np.testing.assert_array_equal(w.numpy(), np.array([1.5, -2.25], np.float32).view(np.uint8))
    # same itemsize: any strides; a view of the same memory
    f = nbx.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), device=device).t()
    s = f.view(nbx.int32)
    assert s.stride() == f.stride()
    np.testing.assert_array_equal(s.numpy(), f.numpy().view(np.int32))
    h = nbx.tensor(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32), device=device)
    h.view(nbx.bfloat16)[0, 1] = 0   # a view: clears the high half of element 0
    want = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    want.view(np.uint16)[0, 1] = 0
    np.testing.assert_array_equal(h.numpy(), want)
    # torch's refusals
    with pytest.raises(RuntimeError, match=r"size\(-1\) must be divisible by 4"):
        x[:, :3].view(nbx.float32)
    with pytest.raises(RuntimeError, match=r"stride\(-1\) must be 1"):
        x.t().view(nbx.int16)
    with pytest.raises(RuntimeError, match=r"storage_offset\(\) must be divisible by 4"):
        x.reshape(-1)[1:5].view(nbx.int32)
    with pytest.raises(RuntimeError, match=r"dim\(\) cannot be 0"):
        nbx.tensor(5, dtype=nbx.int16, device=device).view(nbx.uint8)
    with pytest.raises(RuntimeError, match=r"stride\(0\) must be divisible by 4"):
        T(np.zeros((2, 6), np.uint8), device)[:, :4].view(nbx.int32)


def test_outer_promotes(device):
    r = nbx.outer(nbx.arange(4, device=device), T(np.array([0.5, -1.5, 2.0], np.float32), device))
    assert r.dtype is nbx.float32
    np.testing.assert_array_equal(r.numpy(), np.outer(np.arange(4), [0.5, -1.5, 2.0]))
    assert nbx.ger(nbx.arange(2, device=device), nbx.arange(3, device=device)).dtype is nbx.int64


# ------------------------------------------------------------------ closeness
def test_isclose_allclose_equal(device):
    a = T(np.array([1.0, NAN, np.inf, -np.inf, 1.0, 2.0], np.float32), device)
    b = T(np.array([1.0 + 1e-6, NAN, np.inf, np.inf, 1.1, 2.0 + 3e-5], np.float32), device)
    np.testing.assert_array_equal(nbx.isclose(a, b).numpy(), [1, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(nbx.isclose(a, b, equal_nan=True).numpy(), [1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(nbx.isclose(a, b, rtol=0.2, atol=0).numpy(), [1, 0, 1, 0, 1, 1])
    assert not nbx.allclose(a, b) and nbx.allclose(a[:3], b[:3], equal_nan=True)
    # integers: the tolerance in float, |a - b| in the integer dtype (torch)
    i, j = nbx.tensor([10, 20, 30], device=device), nbx.tensor([11, 20, 33], device=device)
    np.testing.assert_array_equal(nbx.isclose(i, j, rtol=0.05, atol=0).numpy(), [0, 1, 0])
    np.testing.assert_array_equal(nbx.isclose(i, j, rtol=0.1, atol=0).numpy(), [1, 1, 1])
    bb = nbx.tensor([True, False], device=device)
    np.testing.assert_array_equal(nbx.isclose(bb, nbx.tensor([True, True], device=device)).numpy(),
                                  [1, 0])
    with pytest.raises(TypeError, match="same dtype"):
        nbx.isclose(i, a[:3])
    with pytest.raises(ValueError, match="rtol"):
        nbx.isclose(a, b, rtol=-1)
    assert nbx.equal(i, i.clone()) and not nbx.equal(i, j) and not nbx.equal(i, i[:2])
    assert nbx.equal(i, i.to(nbx.float64)) and not nbx.equal(a[1:2], a[1:2])
    assert i.allclose(i) and a.isclose(a).dtype is nbx.bool


# ------------------------------------------------------------------ diagonals, grids, splits
def test_diagonal_views_and_diag(device):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 5, 4)).astype(np.float32)
    x = T(a, device)
    for off, d1, d2 in [(0, 0, 1), (1, 1, 2), (-2, 2, 0), (3, 0, 2), (-4, 1, 2), (7, 0, 1)]:
        d = x.diagonal(off, d1, d2)
        np.testing.assert_array_equal(d.numpy(), np.diagonal(a, off, d1, d2))
    v = x.diagonal(1, 1, 2)
    v.fill_(9.0)   # a view: writes reach x
    assert (x.numpy()[:, np.arange(3), np.arange(1, 4)] == 9).all()
    m = noncontig(rng.standard_normal((4, 6)), device)
    np.testing.assert_array_equal(nbx.diag(m, -1).numpy(), np.diag(m.numpy(), -1))
    vec = T(np.array([1.5, -2.0, 3.0], np.float32), device)
    np.testing.assert_array_equal(nbx.diag(vec, 2).numpy(), np.diag(vec.numpy(), 2))
    e = nbx.diag_embed(T(a[0], device), -1, 0, 2)     # (5, 4) -> (5, 5, 5)
    ref = np.zeros((5, 5, 5), np.float32)
    for j in range(5):
        ref[:, j, :] = np.diag(a[0, j], -1)
    np.testing.assert_array_equal(e.numpy(), ref)
    ref2 = np.zeros((3, 5, 4, 4), np.float32)
    for k in range(3):
        ref2[..., k, k + 1] = a[:, :, k]
    np.testing.assert_array_equal(nbx.diag_embed(T(a[:, :, :3], device), 1).numpy(), ref2)
    with pytest.raises(ValueError, match="1-D or 2-D"):
        nbx.diag(x)


def test_meshgrid_tensor_split_kron(device):
    a, b = nbx.arange(3, device=device), nbx.arange(4, device=device) * 10
    for ix in ("ij", "xy"):
        ga, gb = nbx.meshgrid(a, b, indexing=ix)
        ra, rb = np.meshgrid(np.arange(3), np.arange(4) * 10, indexing=ix)
        np.testing.assert_array_equal(ga.numpy(), ra), np.testing.assert_array_equal(gb.numpy(), rb)
    with pytest.raises(ValueError, match="indexing"):
        nbx.meshgrid(a, b, indexing="ji")
    x = nbx.arange(11, device=device)
    for ios in (3, 4, 11, 13, [2, -2, 1, 9], [-10, 3], [], nbx.tensor([2, 5])):
        ref = np.array_split(np.arange(11), ios) if isinstance(ios, int) else None
        got = [p.numpy().tolist() for p in nbx.tensor_split(x, ios)]
        if ref is not None:
            assert got == [r.tolist() for r in ref]
    assert [p.tolist() for p in nbx.tensor_split(x, [2, -2, 1, 9])] == \
        [[0, 1], [2, 3, 4, 5, 6, 7, 8], [], [1, 2, 3, 4, 5, 6, 7, 8], [9, 10]]
    m = noncontig(np.arange(12.0).reshape(3, 4), device)
    parts = nbx.tensor_split(m, 3, dim=1)
    assert [p.shape[1] for p in parts] == [2, 1, 1]
    np.testing.assert_array_equal(parts[0].numpy(), np.arange(12.0).reshape(3, 4)[:, :2])
    with pytest.raises(ValueError, match="larger than 0"):
        nbx.tensor_split(x, 0)
    rng = np.random.default_rng(2)
    p, q = rng.standard_normal((2, 3)).astype(np.float32), rng.integers(-3, 4, (4, 1, 2))
    r = nbx.kron(T(p, device), T(q, device))
    assert r.dtype is nbx.float32
    close(r, np.kron(p.astype(np.float64), q))


# ------------------------------------------------------------------ einsum, tensordot
EQUATIONS = [
    ("ij,jk->ik", [(5, 7), (7, 3)]), ("ij,jk", [(5, 7), (7, 3)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]), ("ii", [(4, 4)]), ("ij->", [(3, 5)]), ("ij->ji", [(3, 5)]),
    ("i,j->ij", [(3,), (4,)]), ("i,i->", [(6,), (6,)]), ("...ij,...jk->...ik", [(2, 3, 4, 5), (5, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 6, 4)]), ("ijk,jil->kl", [(3, 4, 5), (4, 3, 2)]),
    ("ab,bc,cd->ad", [(2, 9), (9, 8), (8, 3)]), ("abc,cd,b->ad", [(2, 3, 4), (4, 5), (3,)]),
    ("iij->j", [(3, 3, 4)]), ("i...->...", [(3, 2, 2)]), ("...,...->...", [(2, 3), (3,)]),
    ("ij,ij->i", [(4, 5), (4, 5)]), ("ijk,k", [(2, 3, 4), (4,)]), ("a,b,c->abc", [(2,), (3,), (2,)]),
    ("ij,kl->", [(2, 3), (4, 5)]), ("bn,anm,bm->ba", [(3, 4), (2, 4, 5), (3, 5)]), (",i->i", [(), (3,)]),
    ("ij,jk->ki", [(1, 4), (4, 3)]), ("i,i->i", [(1,), (5,)]),
]


@pytest.mark.parametrize("eq,shapes", EQUATIONS)
def test_einsum_against_numpy(device, eq, shapes):
    if device == "interp" and len(shapes) > 2:
        pytest.skip("three-operand products are covered on cpu and cuda; interp is slow")
    _einsum_case(device, eq, shapes)


def _einsum_case(device, eq, shapes):
    rng = np.random.default_rng(abs(hash(eq)) % 2**32)
    arrs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    ts = [T(a, device) if a.ndim < 2 else noncontig(a, device) for a in arrs]
    ref = np.einsum(eq, *[a.astype(np.float64) for a in arrs])
    got = nbx.einsum(eq, *ts)
    assert tuple(got.shape) == ref.shape, (eq, got.shape, ref.shape)
    close(got, ref, rtol=1e-4, atol=1e-5)
    if len(ts) > 1:
        close(nbx.einsum(eq, ts), ref, rtol=1e-4, atol=1e-5)   # operands as one list


def test_einsum_order_and_refusals(device, monkeypatch):
    from nbxtensor.ops import contract
    # the cheapest pair first: (a @ (b @ v)) for a (n x n), b (n x n), v (n): two matvecs
    seen = []
    real = contract._la.matmul
    monkeypatch.setattr(contract._la, "matmul", lambda a, b: seen.append((a.shape, b.shape)) or real(a, b))
    a, b, v = (T(np.ones(s, np.float32), device) for s in ((8, 8), (8, 8), (8,)))
    nbx.einsum("ij,jk,k->i", a, b, v)
    assert all(1 in sa[1:] or 1 in sb[1:] for sa, sb in seen), seen   # never an 8x8x8 product
    with pytest.raises(ValueError, match="operand"):
        nbx.einsum("ij,jk->ik", a)
    with pytest.raises(ValueError, match="size"):
        nbx.einsum("ij,jk->ik", a, T(np.ones((3, 2), np.float32), device))
    with pytest.raises(TypeError, match="dtype"):
        nbx.einsum("i,i->", v, v.to(nbx.float64))
    with pytest.raises(ValueError, match="does not appear"):
        nbx.einsum("ij->iz", a)


def test_tensordot(device):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((3, 4, 5)).astype(np.float32), rng.standard_normal((4, 5, 2)).astype(np.float32)
    close(nbx.tensordot(T(a, device), T(b, device)), np.tensordot(a, b), 1e-4, 1e-5)
    close(nbx.tensordot(T(a, device), T(b, device), dims=([1, 2], [0, 1])),
          np.tensordot(a, b, axes=([1, 2], [0, 1])), 1e-4, 1e-5)
    close(nbx.tensordot(T(a, device), T(b, device), dims=([1], [0])),
          np.tensordot(a, b, axes=([1], [0])), 1e-4, 1e-5)
    close(nbx.tensordot(T(a, device), T(a, device), dims=0), np.tensordot(a, a, 0), 1e-5, 1e-6)
    with pytest.raises(ValueError, match="sizes"):
        nbx.tensordot(T(a, device), T(b, device), dims=([0], [0]))


# ------------------------------------------------------------------ searches
def test_searchsorted_bucketize(device):
    rng = np.random.default_rng(4)
    bnd = np.sort(rng.integers(0, 20, 37)).astype(np.float32)    # duplicates, odd length
    vals = rng.uniform(-2, 22, (3, 11)).astype(np.float32)
    vals[0, :4] = bnd[[0, 5, 36, 17]]
    vals[1, 0] = NAN
    b, v = T(bnd, device), noncontig(vals, device)
    for side in ("left", "right"):
        ref = np.searchsorted(bnd, vals, side=side)
        got = nbx.searchsorted(b, v, side=side)
        assert got.dtype is nbx.int64
        np.testing.assert_array_equal(got.numpy(), ref)
        np.testing.assert_array_equal(nbx.searchsorted(b, v, right=side == "right").numpy(), ref)
        np.testing.assert_array_equal(nbx.bucketize(v, b, right=side == "right").numpy(), ref)
    assert nbx.searchsorted(b, v, out_int32=True).dtype is nbx.int32
    assert nbx.searchsorted(b, 7.0).item() == np.searchsorted(bnd, 7.0)
    # sorter: indices into the sorted order
    perm = rng.permutation(37)
    got = nbx.searchsorted(T(bnd[perm], device), v, sorter=nbx.tensor(np.argsort(bnd[perm], kind="stable"),
                                                                          device=device))
    np.testing.assert_array_equal(got.numpy(), np.searchsorted(bnd, vals))
    # batched boundaries: one row each
    bb = np.sort(rng.uniform(0, 10, (3, 6)), axis=1).astype(np.float32)
    vv = rng.uniform(-1, 11, (3, 5)).astype(np.float32)
    ref = np.stack([np.searchsorted(bb[i], vv[i]) for i in range(3)])
    np.testing.assert_array_equal(nbx.searchsorted(T(bb, device), T(vv, device)).numpy(), ref)
    # integer boundaries, float values (promoted comparison, as torch)
    assert nbx.searchsorted(nbx.tensor([1, 2, 3], device=device),
                            T(np.array([2.5], np.float32), device)).tolist() == [2]
    assert nbx.searchsorted(b, T(np.zeros((0,), np.float32), device)).shape == (0,)
    with pytest.raises(ValueError, match="opposites"):
        nbx.searchsorted(b, v, side="left", right=True)
    with pytest.raises(ValueError, match="side"):
        nbx.searchsorted(b, v, side="middle")
    with pytest.raises(ValueError, match="first N-1 dims"):
        nbx.searchsorted(T(bb, device), T(vv[:2], device))
    with pytest.raises(ValueError, match="1-D"):
        nbx.bucketize(v, T(bb, device))


# ------------------------------------------------------------------ order statistics (NaN as torch)
def test_median_kthvalue_cummax_with_nan_match_torch(device):
    m = REF["in_m"]
    x = T(m, device)
    # which of several NaNs torch returns is unspecified (row 3 is all NaN): we return the
    # first, so indices are compared on the other rows, and row 3's must point at a NaN
    rows = [0, 1, 2, 4]

    def check(r, name):
        close(r.values, REF[f"{name}_v"])
        np.testing.assert_array_equal(r.indices.numpy()[rows], REF[f"{name}_i"][rows])
        assert np.isnan(m[3, r.indices.numpy()[3]])
    for name in ("median", "nanmedian"):
        check(getattr(nbx, name)(x, 1), name)
        close(getattr(nbx, name)(x), REF[f"{name}_all"])
    for k in (1, 4, 8):
        check(nbx.kthvalue(x, k, 1), f"kth{k}")
    for name in ("cummax", "cummin"):
        r = getattr(nbx, name)(x, 1)
        close(r.values, REF[f"{name}_v"])
        np.testing.assert_array_equal(r.indices.numpy(), REF[f"{name}_i"])


def test_order_statistics_against_numpy(device):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 9)).astype(np.float32)     # distinct values
    x = noncontig(a, device)
    srt = np.sort(a, axis=0)
    r = nbx.median(x, 0, keepdim=True)
    assert r.values.shape == (1, 9)
    close(r.values, srt[(6 - 1) // 2][None])   # the lower median of an even count
    np.testing.assert_array_equal(np.take_along_axis(a, r.indices.numpy(), 0), r.values.numpy())
    close(nbx.median(x), np.sort(a.ravel())[(a.size - 1) // 2])
    r = nbx.kthvalue(x, 3, 1)
    close(r.values, np.sort(a, 1)[:, 2])
    ints = rng.integers(-50, 50, (4, 7))
    xi = nbx.tensor(ints, device=device)
    np.testing.assert_array_equal(nbx.median(xi, 1).values.numpy(), np.sort(ints, 1)[:, 3])
    cm = nbx.cummax(xi, 1)
    np.testing.assert_array_equal(cm.values.numpy(), np.maximum.accumulate(ints, 1))
    np.testing.assert_array_equal(np.take_along_axis(ints, cm.indices.numpy(), 1), cm.values.numpy())
    cn = nbx.cummin(x, 0)
    np.testing.assert_array_equal(cn.values.numpy(), np.minimum.accumulate(a, 0))
    # ties: the latest index (torch)
    t = nbx.tensor([2, 1, 2, 2, 0, 3], device=device)
    assert nbx.cummax(t, 0).indices.tolist() == [0, 0, 2, 3, 3, 5]
    assert nbx.cummin(t, 0).indices.tolist() == [0, 1, 1, 1, 4, 4]
    assert np.isnan(nbx.median(T(np.zeros(0, np.float32), device)).item())
    with pytest.raises(IndexError, match="non-zero size"):
        nbx.median(T(np.zeros((2, 0), np.float32), device), 1)
    with pytest.raises(IndexError, match="out of range"):
        nbx.kthvalue(x, 10, 1)
    with pytest.raises(TypeError, match="bool"):
        nbx.median(nbx.tensor([True, False], device=device))
    w = nbx.argwhere(nbx.tensor([[0, 3], [4, 0]], device=device))
    assert w.tolist() == [[0, 1], [1, 0]]


# ------------------------------------------------------------------ losses, distances
def test_classification_losses_match_torch(device):
    lg, tg, w, pr = (T(REF["in_" + k], device) for k in ("logits", "tgt", "w", "probs"))
    for red in ("mean", "sum", "none"):
        for ls in (0.0, 0.15):
            close(F.cross_entropy(lg, tg, reduction=red, label_smoothing=ls), REF[f"ce_{red}_{ls}"])
            close(F.cross_entropy(lg, tg, weight=w, reduction=red, label_smoothing=ls),
                  REF[f"ce_w_{red}_{ls}"])
            close(F.cross_entropy(lg, pr, weight=w, reduction=red, label_smoothing=ls),
                  REF[f"ce_p_{red}_{ls}"])
        close(F.cross_entropy(T(REF["in_logits3"], device), T(REF["in_tgt3"], device), weight=w,
                              reduction=red, ignore_index=2), REF[f"ce3_{red}"])
        close(F.nll_loss(F.log_softmax(lg, 1), tg, weight=w, reduction=red), REF[f"nll_{red}"])
    with pytest.raises(IndexError, match="out of bounds"):
        F.nll_loss(lg, nbx.tensor([0, 1, 2, 3, 4, 5, 0], device=device))
    with pytest.raises(TypeError, match="int64"):
        F.cross_entropy(lg, tg.to(nbx.int32))
    with pytest.raises(ValueError, match="reduction"):
        F.mse_loss(lg, lg, reduction="avg")


def test_regression_losses_and_distances_match_torch(device):
    a, b, p, q, tq, pw = (T(REF["in_" + k], device) for k in ("a", "b", "p", "q", "tq", "pw"))
    for red in ("mean", "sum", "none"):
        close(F.smooth_l1_loss(a, b, reduction=red, beta=0.7), REF[f"sl1_{red}"])
        close(F.huber_loss(a, b, reduction=red, delta=1.3), REF[f"huber_{red}"])
        close(F.binary_cross_entropy(p, q, reduction=red), REF[f"bce_{red}"])
        close(F.binary_cross_entropy_with_logits(a, q, reduction=red, pos_weight=pw), REF[f"bcel_{red}"])
        d = a.numpy().astype(np.float64) - b.numpy()
        ref = {"mean": np.mean, "sum": np.sum, "none": lambda z: z}[red]
        close(F.mse_loss(a, b, reduction=red), ref(d * d))
        close(F.l1_loss(a, b, reduction=red), ref(np.abs(d)))
    la = F.log_softmax(a, 1)
    for red in ("batchmean", "mean", "sum"):
        close(F.kl_div(la, tq, reduction=red), REF[f"kl_{red}"])
        close(F.kl_div(la, F.log_softmax(b, 1), reduction=red, log_target=True), REF[f"kllog_{red}"])
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.binary_cross_entropy(a, q)
    x1, x2 = T(REF["in_x1"], device), T(REF["in_x2"], device)
    for pn in (1.0, 2.0, 3.0, float("inf"), 0.0):
        close(nbx.cdist(x1, x2, p=pn), REF[f"cdist_{pn}"], 1e-4, 1e-4)
    close(F.cdist(x1, x2, compute_mode="use_mm_for_euclid_dist"), REF["cdist_mm"], 1e-4, 1e-4)
    close(F.cdist(x1, x2, compute_mode="donot_use_mm_for_euclid_dist"), REF["cdist_2.0"], 1e-5, 1e-5)
    close(F.cosine_similarity(x1[0, :9], x2[0], dim=1), REF["cos"])
    close(F.pairwise_distance(x1[0, :9], x2[0], p=1.5), REF["pdist"])
    with pytest.raises(ValueError, match="compute_mode"):
        nbx.cdist(x1, x2, compute_mode="fast")


def test_one_hot_normalize_dropout(device):
    idx = nbx.tensor([[0, 3], [2, 1]], device=device)
    oh = F.one_hot(idx, 5)
    assert oh.dtype is nbx.int64 and oh.shape == (2, 2, 5)
    np.testing.assert_array_equal(oh.numpy(), np.eye(5, dtype=np.int64)[idx.numpy()])
    assert F.one_hot(idx).shape == (2, 2, 4)
    with pytest.raises(IndexError, match="smaller than num_classes"):   # and a ValueError
        F.one_hot(idx, 3)
    with pytest.raises(ValueError, match="non-negative"):
        F.one_hot(nbx.tensor([-1, 0], device=device))
    with pytest.raises(TypeError, match="int64"):
        F.one_hot(idx.to(nbx.int32))
    rng = np.random.default_rng(6)
    a = rng.standard_normal((3, 7)).astype(np.float32)
    a[1] = 0
    n = F.normalize(noncontig(a, device), dim=1)
    close(n, a / np.maximum(np.linalg.norm(a.astype(np.float64), axis=1, keepdims=True), 1e-12))
    x = T(a, device)
    assert F.dropout(x, 0.5, training=False) is x or np.array_equal(F.dropout(x, 0.5, training=False).numpy(), a)


# ------------------------------------------------------------------ NumPy protocols
def test_numpy_ufuncs_return_tensors_on_cpu(device):
    t = nbx.tensor([[0.5, 1.0, 2.0]], device=device)
    if device != "cpu":
        with pytest.raises(TypeError, match="cannot be used by a NumPy ufunc"):
            np.exp(t)
        np.testing.assert_array_equal(np.asarray(t), [[0.5, 1.0, 2.0]])   # __array__ still works
        return
    e = np.exp(t)
    assert isinstance(e, nbx.Tensor) and e.dtype is nbx.float32
    close(e, np.exp([[0.5, 1.0, 2.0]]))
    i = nbx.arange(3)
    assert np.exp(i).dtype is nbx.float64          # NumPy's result dtype, as torch
    assert isinstance(np.add(np.ones(3), i), nbx.Tensor)
    r = np.add.reduce(t, axis=1)
    assert isinstance(r, nbx.Tensor) and r.tolist() == [3.5]
    s = np.sqrt(nbx.tensor(4.0))
    assert isinstance(s, nbx.Tensor) and s.shape == () and s.item() == 2.0
    out = nbx.empty(1, 3)
    assert np.multiply(t, 2, out=out) is out and out.tolist() == [[1.0, 2.0, 4.0]]
    assert isinstance(np.concatenate([t, t]), np.ndarray)   # as torch: NumPy functions convert
    assert isinstance(np.clip(t, 0, 1), nbx.Tensor)
    assert np.asarray(t).dtype == np.float32


# ------------------------------------------------------------------ repr
def test_repr_matches_torch():
    with open(os.path.join(FIX, "reprs.json")) as f:
        reprs = json.load(f)
    for key, case in reprs.items():
        if key == "torch_version":
            continue
        expr = case["expr"].replace("torch.", "nbx.")
        want = case["repr"].replace("torch.", "nbxtensor.")
        assert repr(eval(expr)) == want, key


def test_repr_device_suffix(device):
    t = nbx.tensor([1.5, 2.0], dtype=nbx.float16, device=device)
    want = "tensor([1.5000, 2.0000]" + ("" if device == "cpu" else f", device='{t.device}'") \
        + ", dtype=nbxtensor.float16)"
    assert repr(t) == want
    dev = "" if device == "cpu" else f", device='{t.device}'"
    # widths come from the finite non-zero values only (torch): no padding before '2.'
    assert repr(nbx.tensor([NAN, 2.0, 0.0], device=device)) == f"tensor([nan, 2., 0.]{dev})"


# ------------------------------------------------------------------ kernel[grid]
_KERNEL_SCRIPT = r"""
import sys
{first}
import numpy as np

@triton.jit
def axpy(x, y, out, n, alpha, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out + i, alpha * tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)

n = 203
x = nbx.tensor(np.arange(n, dtype=np.float32), device="{device}")
y = nbx.ones(n, device="{device}")
o = nbx.full((n,), float("nan"), device="{device}")
axpy[(triton.cdiv(n, 64),)](x, y, o, n, 2.0, BLOCK=64)
assert np.array_equal(o.numpy(), 2 * np.arange(n, dtype=np.float32) + 1), o
o2 = nbx.full((n,), float("nan"), device="{device}")
axpy[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](x, y, out=o2, n=n, alpha=3.0, BLOCK=128)
assert np.array_equal(o2.numpy(), 3 * np.arange(n, dtype=np.float32) + 1), o2
assert "torch" not in sys.modules or sys.modules["torch"] is None
print("ok")
"""


@pytest.mark.parametrize("order", ["nbx_first", "triton_first"])
def test_triton_kernel_getitem_launch(device, order, tmp_path):
    """Triton's own spelling, in a fresh process without torch, whichever is imported first."""
    if device == "cpu":
        pytest.skip("Triton kernels run on cuda and interp")
    first = ("import nbxtensor as nbx\nimport triton, triton.language as tl" if order == "nbx_first"
             else "import triton, triton.language as tl\nimport nbxtensor as nbx")
    script = tmp_path / "kernel_getitem.py"     # @triton.jit reads the kernel's source file
    script.write_text(_KERNEL_SCRIPT.format(first=first, device=device))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
