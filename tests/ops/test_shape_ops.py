"""Shape ops on every device against NumPy: cat, stack, split, flip, roll, repeat/tile,
repeat_interleave, tril/triu, pad, movedim and the view functions.

Values move as bits, so results must be exactly NumPy's. Inputs are random (never
zeros), non-contiguous, broadcast (stride 0), empty and 0-dim; sizes overhang the
kernel's 1024-element block; `out=` buffers are poisoned first.
"""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import poisoned, randn, rng

DTYPES = [nbx.float32, nbx.bfloat16, nbx.float8_e4m3fn, nbx.int64, nbx.bool, nbx.int16,
          nbx.float64, nbx.uint8]
LAYOUTS = ["contig", "transposed", "strided", "broadcast"]


def make(shape, dtype=nbx.float32, device="cpu", layout="contig"):
    """A random tensor of `shape` laid out as asked, and its NumPy value."""
    if layout == "contig" or len(shape) < 1:
        t = randn(shape, dtype, device)
    elif layout == "transposed":
        t = randn(shape[::-1], dtype, device).permute(*range(len(shape) - 1, -1, -1))
    elif layout == "strided":
        big = randn(tuple(n * 2 for n in shape[:-1]) + (shape[-1] + 3,), dtype, device)
        t = big[tuple(slice(None, None, 2) for _ in shape[:-1]) + (slice(1, 1 + shape[-1]),)]
    else:  # broadcast along the first dim
        t = randn((1,) + tuple(shape[1:]), dtype, device).expand(*shape)
    assert tuple(t.shape) == tuple(shape)
    return t, t.numpy().copy()


def same(t, ref):
    got = t.numpy()
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.dtype == ref.dtype
    # compare bits: exact, and NaN-safe
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8),
                                  np.ascontiguousarray(ref).view(np.uint8))


# ---------------------------------------------------------------- cat / stack
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_cat_dtypes(dtype, device):
    a, ra = make((3, 517), dtype, device, "contig")
    b, rb = make((5, 517), dtype, device, "strided")
    same(nbx.cat([a, b]), np.concatenate([ra, rb]))
    c, rc = make((3, 2), dtype, device, "transposed")
    same(nbx.cat([a, c, a], dim=-1), np.concatenate([ra, rc, ra], -1))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cat_layouts_out(layout, device):
    a, ra = make((4, 7, 37), nbx.float32, device, layout)
    b, rb = make((4, 2, 37), nbx.float32, device, "transposed")
    ref = np.concatenate([ra, rb, ra], 1)
    out = poisoned(ref.shape, nbx.float32, device)
    r = nbx.cat([a, b, a], 1, out=out)
    assert r is out
    same(out, ref)
    # out= a non-contiguous view
    big = poisoned((ref.shape[2], ref.shape[1], ref.shape[0]), nbx.float32, device)
    nbx.cat([a, b, a], 1, out=big.permute(2, 1, 0))
    same(big.permute(2, 1, 0), ref)


def test_cat_special(device):
    a, ra = make((2, 3), nbx.float32, device)
    e = nbx.empty(0, device=device)
    same(nbx.cat([e, a, e]), ra)  # torch's legacy: 1-D empty tensors are skipped
    same(nbx.cat([a, nbx.empty(0, 3, device=device)]), ra)
    assert nbx.cat([e, e]).shape == (0,)
    i, ri = make((1, 3), nbx.int32, device)
    r = nbx.cat([a, i])  # dtypes promote
    assert r.dtype is nbx.float32
    same(r, np.concatenate([ra, ri.astype(np.float32)]))
    same(nbx.concat([a, a], 1), np.concatenate([ra, ra], 1))
    same(nbx.concatenate((a,)), ra)
    with pytest.raises(ValueError, match=r"cat: sizes of tensors must match except in dim 0; "
                                         r"tensors\[1\] has shape \(2, 4\)"):
        nbx.cat([a, nbx.empty(2, 4, device=device)])
    with pytest.raises(ValueError, match=r"tensors\[1\] has 3 dims, expected 2"):
        nbx.cat([a, nbx.empty(1, 2, 3, device=device)])
    with pytest.raises(ValueError, match="zero-dimensional"):
        nbx.cat([nbx.tensor(1.0, device=device)])
    with pytest.raises(ValueError, match="non-empty list"):
        nbx.cat([])
    with pytest.raises(TypeError, match=r"tensors\[1\] is a list"):
        nbx.cat([a, [1]])
    with pytest.raises(TypeError, match="list or tuple of Tensors, got Tensor"):
        nbx.cat(a)
    with pytest.raises(IndexError, match="dim: dimension out of range"):
        nbx.cat([a, a], 2)
    with pytest.raises(ValueError, match=r"cat: out has shape \(3, 3\), expected \(4, 3\)"):
        nbx.cat([a, a], out=nbx.empty(3, 3, device=device))
    with pytest.raises(TypeError, match="cat: out has dtype int32, expected float32"):
        nbx.cat([a, a], out=nbx.empty(4, 3, dtype=nbx.int32, device=device))
    other = "cpu" if device != "cpu" else ("interp" if "interp" in _devices() else None)
    if other:
        with pytest.raises(ValueError, match=r"tensors\[1\] is on .*all must be on one device"):
            nbx.cat([a, nbx.ones(2, 3, device=other)])


def _devices():
    from conftest import DEVICES
    return DEVICES


def test_cat_out_overlaps_input(device):
    x, rx = make((6, 5), nbx.float32, device)
    nbx.cat([x[:3], x[3:]], out=x)  # out is the inputs' memory: same values
    same(x, rx)
    y, ry = make((2, 3), nbx.float32, device)
    buf = nbx.cat([y, y])
    nbx.cat([buf[2:], buf[:2]], out=buf)
    same(buf, np.concatenate([ry, ry]))


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16, nbx.uint8, nbx.int64, nbx.bool],
                         ids=lambda d: d.name)
@pytest.mark.parametrize("n", [2, 3, 5, 9])
def test_cat_stack_contiguous_one_launch(n, dtype, device):
    """The fast path (contiguous inputs of one dtype: one launch per 4 inputs), with widths
    that overhang the interp block (64) and inputs at a storage offset."""
    g = rng()
    widths = [int(w) for w in g.integers(1, 70, n)]
    widths[0] = 65
    ts, rs = [], []
    for k, w in enumerate(widths):
        t, r = make((3, w, 2), dtype, device)
        if k == 1:  # a contiguous view that starts inside its storage
            big, rb = make((5, w, 2), dtype, device)
            t, r = big[2:5], rb[2:5]
        ts.append(t)
        rs.append(r)
    for d in (1, -2):
        out = nbx.cat(ts, d)
        same(out, np.concatenate(rs, d))
    same(nbx.cat([t.reshape(-1) for t in ts]), np.concatenate([r.reshape(-1) for r in rs]))
    eq = [make((3, 33), dtype, device)[0] for _ in range(n)]
    for d in (0, 1, 2, -1, -3):
        same(nbx.stack(eq, d), np.stack([t.numpy() for t in eq], d))


def test_cat_fast_path_idx64(device, monkeypatch):
    if device == "cpu":
        pytest.skip("kernel path")
    from nbxtensor.kernels import shape as ks
    monkeypatch.setattr(ks, "_FORCE_IDX64", True)
    a, ra = make((4, 100), nbx.float16, device)
    b, rb = make((4, 3), nbx.float16, device)
    same(nbx.cat([a, b, a], 1), np.concatenate([ra, rb, ra], 1))


def test_flip_replayed_launches(device):
    """flip's kernel entry replays the launches recorded for a layout: later calls with the
    same layout and new data (and views at other offsets) must still be right."""
    for _ in range(3):
        for dims in ((0,), (-1,), (0, 2)):
            x, rx = make((3, 5, 70), nbx.float32, device)
            same(nbx.flip(x, dims), np.flip(rx, dims))
            big, rb = make((6, 5, 70), nbx.bfloat16, device)
            same(nbx.flip(big[3:], dims), np.flip(rb[3:], dims))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_stack(dim, device):
    ts = [make((3, 345), nbx.bfloat16, device, lay) for lay in ("contig", "strided", "broadcast")]
    same(nbx.stack([t for t, _ in ts], dim), np.stack([r for _, r in ts], dim))
    out = poisoned(np.stack([r for _, r in ts], dim).shape, nbx.bfloat16, device)
    nbx.stack([t for t, _ in ts], dim, out=out)
    same(out, np.stack([r for _, r in ts], dim))


def test_stack_hstack_vstack(device):
    z = [nbx.tensor(float(i) + 0.5, device=device) for i in range(3)]
    same(nbx.stack(z), np.array([0.5, 1.5, 2.5], np.float32))
    a, ra = make((4,), nbx.int64, device)
    b, rb = make((2, 4), nbx.int64, device)
    same(nbx.hstack([a, a]), np.hstack([ra, ra]))
    same(nbx.hstack([b, b[:, :1]]), np.hstack([rb, rb[:, :1]]))
    same(nbx.vstack([a, b]), np.vstack([ra, rb]))
    same(nbx.hstack([z[0], z[1]]), np.array([0.5, 1.5], np.float32))
    with pytest.raises(ValueError, match=r"stack: expects each tensor to be equal size"):
        nbx.stack([a, b])
    with pytest.raises(IndexError, match="dimension out of range"):
        nbx.stack([a, a], 3)


# ---------------------------------------------------------------- split and views as functions
def test_split_functions(device):
    x, rx = make((7, 5), nbx.float32, device)
    parts = nbx.split(x, [2, 0, 5])
    for p, r in zip(parts, np.split(rx, [2, 2])):
        same(p, r)
        assert p.untyped_storage() is x.untyped_storage()
    assert [p.shape[1] for p in nbx.split(x, 2, dim=1)] == [2, 2, 1]
    assert [p.shape[0] for p in nbx.chunk(x, 3)] == [3, 3, 1]
    same(nbx.unbind(x, 1)[3], rx[:, 3])
    same(nbx.narrow(x, 1, 1, 3), rx[:, 1:4])
    same(nbx.select(x, 0, -1), rx[-1])
    same(nbx.permute(x, (1, 0)), rx.T)
    same(nbx.transpose(x, 0, 1), rx.T)
    same(nbx.swapaxes(x, 0, 1), rx.T)
    same(nbx.t(x), rx.T)
    same(nbx.squeeze(x[:, :1]), rx[:, 0])
    same(nbx.unsqueeze(x, 1), rx[:, None])
    same(nbx.flatten(x), rx.reshape(-1))
    same(nbx.unflatten(x, 0, (7, 1)), rx.reshape(7, 1, 5))
    same(nbx.reshape(x.T, (5, 7)), rx.T.reshape(5, 7))
    with pytest.raises(TypeError, match="narrow: input must be a Tensor, got ndarray"):
        nbx.narrow(rx, 0, 0, 1)


def test_movedim(device):
    x, rx = make((2, 3, 4, 5), nbx.float32, device)
    for s, d in [(0, -1), (1, 0), ((0, 1), (3, 2)), ([-1, 0], [0, -1]), ((), ())]:
        v = nbx.movedim(x, s, d)
        same(v, np.moveaxis(rx, s, d))
        assert v.untyped_storage() is x.untyped_storage()
    same(x.moveaxis(2, 0), np.moveaxis(rx, 2, 0))
    with pytest.raises(ValueError, match="same length"):
        nbx.movedim(x, (0, 1), (1,))
    with pytest.raises(ValueError, match="repeated dim"):
        nbx.movedim(x, (0, 0), (1, 2))
    with pytest.raises(IndexError, match="source: dimension out of range"):
        nbx.movedim(x, 4, 0)


# ---------------------------------------------------------------- flip / roll
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dims", [(0,), (1,), (-1,), (0, 2), (0, 1, 2), ()])
def test_flip(layout, dims, device):
    x, rx = make((3, 5, 73), nbx.float32, device, layout)
    same(nbx.flip(x, dims), np.flip(rx, dims) if dims else rx)
    same(x.flip(dims), np.flip(rx, dims) if dims else rx)


def test_flip_misc(device):
    for dt in DTYPES:
        x, rx = make((1100,), dt, device)
        same(x.flip(0), rx[::-1])
    x, rx = make((4, 6), nbx.int8, device)
    same(x.fliplr(), np.fliplr(rx))
    same(nbx.flipud(x), np.flipud(rx))
    z = nbx.tensor(2.5, device=device)
    same(nbx.flip(z, ()), np.array(2.5, np.float32))
    same(nbx.flip(nbx.empty(0, 3, device=device), (0, 1)), np.empty((0, 3), np.float32))
    with pytest.raises(ValueError, match="dims: dim appears multiple times"):
        nbx.flip(x, (0, -2))
    with pytest.raises(IndexError, match="dims: dimension out of range"):
        nbx.flip(x, (2,))
    with pytest.raises(ValueError, match="fliplr: input must be >= 2-D"):
        nbx.fliplr(x[0])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shifts,dims", [(1, 0), (-2, 1), (1030, -1), ((2, -7), (0, 2)),
                                         ((1, 1), (1, 1)), (0, 1)])
def test_roll(layout, shifts, dims, device):
    x, rx = make((3, 4, 345), nbx.float32, device, layout)
    same(nbx.roll(x, shifts, dims), np.roll(rx, shifts, dims))
    same(x.roll(shifts, dims), np.roll(rx, shifts, dims))


def test_roll_flat_and_errors(device):
    x, rx = make((3, 7), nbx.bfloat16, device, "transposed")
    same(nbx.roll(x, 5), np.roll(rx, 5))
    same(nbx.roll(x, -23), np.roll(rx, -23))
    same(nbx.roll(nbx.tensor(1.5, device=device), 3), np.array(1.5, np.float32))
    same(nbx.roll(nbx.empty(0, 2, device=device), 1, 0), np.empty((0, 2), np.float32))
    with pytest.raises(ValueError, match="must have the same length"):
        nbx.roll(x, (1, 2), 0)
    with pytest.raises(ValueError, match="needs dims"):
        nbx.roll(x, (1, 2))
    with pytest.raises(TypeError, match="shifts: expected an int, got float"):
        nbx.roll(x, 1.5, 0)


# ---------------------------------------------------------------- repeat / tile / repeat_interleave
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("sizes", [(1, 1), (2, 3), (3, 1, 2), (2, 1, 1, 1), (1, 0)])
def test_repeat(layout, sizes, device):
    x, rx = make((5, 103), nbx.float32, device, layout)
    same(x.repeat(*sizes), np.tile(rx, sizes))
    same(x.repeat(sizes), np.tile(rx, sizes))


def test_repeat_tile_misc(device):
    z = nbx.tensor(3, dtype=nbx.int16, device=device)
    same(z.repeat(2, 3), np.tile(np.int16(3), (2, 3)))
    x, rx = make((2, 3), nbx.float8_e4m3fn, device)
    same(nbx.tile(x, (2,)), np.tile(rx, (2,)))
    same(x.tile((3, 1, 2)), np.tile(rx, (3, 1, 2)))
    same(nbx.empty(0, 2, device=device).repeat(3, 2), np.empty((0, 4), np.float32))
    with pytest.raises(ValueError, match="can not be smaller than the number of tensor dims"):
        x.repeat(2)
    with pytest.raises(ValueError, match="repeats: expected sizes >= 0"):
        x.repeat(2, -1)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dim", [0, 1, -1, None])
def test_repeat_interleave_int(layout, dim, device):
    x, rx = make((4, 263), nbx.float32, device, layout)
    same(nbx.repeat_interleave(x, 3, dim), np.repeat(rx, 3, dim))
    same(x.repeat_interleave(2, dim=dim), np.repeat(rx, 2, dim))


def test_repeat_interleave_tensor(device):
    x, rx = make((5, 211), nbx.bfloat16, device, "strided")
    reps = np.array([0, 3, 1, 5, 2])
    r = nbx.tensor(reps, device=device)
    same(nbx.repeat_interleave(x, r, 0), np.repeat(rx, reps, 0))
    same(x.repeat_interleave(r, dim=0, output_size=11), np.repeat(rx, reps, 0))
    same(nbx.repeat_interleave(x, nbx.tensor([2], device=device), 1), np.repeat(rx, 2, 1))
    same(nbx.repeat_interleave(nbx.tensor([2, 0, 3], device=device)),
         np.repeat(np.arange(3), [2, 0, 3]))
    same(nbx.repeat_interleave(nbx.tensor(1.5, device=device), 3), np.full(3, 1.5, np.float32))
    same(nbx.repeat_interleave(x, 0, 0), np.empty((0, 211), rx.dtype))
    with pytest.raises(ValueError, match=r"repeats: has 3 entries, expected 5"):
        nbx.repeat_interleave(x, nbx.tensor([1, 2, 3], device=device), 0)
    with pytest.raises(ValueError, match="repeats: must be >= 0"):
        nbx.repeat_interleave(x, nbx.tensor([1, -1, 1, 1, 1], device=device), 0)
    with pytest.raises(TypeError, match="repeats: expected an int or a 0-/1-D integer tensor"):
        nbx.repeat_interleave(x, nbx.tensor([1.0], device=device), 0)
    with pytest.raises(ValueError, match="output_size: 3 does not match"):
        nbx.repeat_interleave(x, 2, 0, output_size=3)


# ---------------------------------------------------------------- tril / triu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("diagonal", [0, 1, -2, 40, -40])
def test_tril_triu(layout, diagonal, device):
    x, rx = make((3, 33, 37), nbx.float32, device, layout)
    same(nbx.tril(x, diagonal), np.tril(rx, diagonal))
    same(x.triu(diagonal), np.triu(rx, diagonal))
    out = poisoned(rx.shape, nbx.float32, device)
    nbx.triu(x, diagonal, out=out)
    same(out, np.triu(rx, diagonal))


def test_tril_triu_misc(device):
    for dt in DTYPES:
        x, rx = make((35, 31), dt, device, "transposed")
        same(x.tril(), np.tril(rx))
    x, rx = make((5, 6), nbx.int32, device)
    assert x.tril_(1) is x
    same(x, np.tril(rx, 1))
    y, ry = make((6, 5), nbx.float16, device)
    v = y[1:, ::2]
    v.triu_(-1)
    ry[1:, ::2] = np.triu(ry[1:, ::2], -1)
    same(y, ry)
    same(nbx.tril(nbx.empty(0, 3, device=device)), np.empty((0, 3), np.float32))
    with pytest.raises(ValueError, match=r"tril: input must have at least 2 dims, got shape \(5,\)"):
        nbx.tril(nbx.ones(5, device=device))
    with pytest.raises(TypeError, match="diagonal: expected an int"):
        nbx.triu(x, 0.5)


# ---------------------------------------------------------------- pad
_NP_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def _np_pad(a, pad, mode, value=0.0):
    width = [(0, 0)] * a.ndim
    for k in range(len(pad) // 2):
        width[a.ndim - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    crop = tuple(slice(max(-b, 0), n - max(-e, 0)) for (b, e), n in zip(width, a.shape))
    a = a[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in width]
    if mode == "constant":
        return np.pad(a, width, constant_values=np.array(value).astype(a.dtype))
    return np.pad(a, width, mode=_NP_MODE[mode])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("pad", [(1, 2), (0, 3, 2, 0), (3, 1, 1, 2, 1, 0), (4, 0)])
def test_pad(layout, mode, pad, device):
    x, rx = make((2, 5, 97), nbx.float32, device, layout)
    same(nbx.pad(x, pad, mode=mode), _np_pad(rx, pad, mode))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_pad_constant_value(dtype, device):
    x, rx = make((3, 1030), dtype, device, "strided")
    v = 2.5 if dtype.is_floating_point else (True if dtype is nbx.bool else 7)
    same(nbx.pad(x, (2, 1, 1, 1), value=v), _np_pad(rx, (2, 1, 1, 1), "constant", v))
    same(nbx.pad(x, (-3, 2, 0, -1), value=v), _np_pad(rx, (-3, 2, 0, -1), "constant", v))


def test_pad_special(device):
    x, rx = make((3, 4), nbx.float32, device)
    same(nbx.pad(x, (1, 1), value=float("nan")), _np_pad(rx, (1, 1), "constant", np.nan))
    same(nbx.pad(x, (1, 1), value=-float("inf")), _np_pad(rx, (1, 1), "constant", -np.inf))
    same(nbx.pad(x, ()), rx)
    same(nbx.pad(x, (-4, 0)), np.empty((3, 0), np.float32))
    same(nbx.pad(nbx.empty(0, 2, device=device), (1, 1)), np.zeros((0, 4), np.float32))
    same(nbx.pad(nbx.empty(2, 0, device=device), (1, 2), value=3.0), np.full((2, 3), 3.0,
                                                                            np.float32))
    with pytest.raises(ValueError, match="pad: expected an even number of entries"):
        nbx.pad(x, (1,))
    with pytest.raises(ValueError, match="at most 2 \\* ndim = 4"):
        nbx.pad(x, (1, 1, 1, 1, 1, 1))
    with pytest.raises(ValueError, match="mode: expected one of"):
        nbx.pad(x, (1, 1), mode="wrap")
    with pytest.raises(ValueError, match="must be < the size 4 of dim 1 for mode='reflect'"):
        nbx.pad(x, (4, 0), mode="reflect")
    with pytest.raises(ValueError, match="negative padding .* only supported with mode='constant'"):
        nbx.pad(x, (-1, 0), mode="replicate")
    with pytest.raises(ValueError, match="negative size"):
        nbx.pad(x, (-3, -2))
    with pytest.raises(ValueError, match="value=1.0 is only allowed with mode='constant'"):
        nbx.pad(x, (1, 1), mode="reflect", value=1.0)


# ---------------------------------------------------------------- many dims, big offsets
def test_many_dims(device):
    x, rx = make((2, 3, 2, 3, 2, 3, 2), nbx.float32, device, "transposed")
    same(nbx.flip(x, (0, 3, 6)), np.flip(rx, (0, 3, 6)))
    same(nbx.cat([x, x], 4), np.concatenate([rx, rx], 4))
    same(x.repeat(1, 1, 1, 1, 1, 1, 2), np.tile(rx, (1,) * 6 + (2,)))


def test_int64_index_path(device, monkeypatch):
    """The kernel's int64 indexing (for > 2**31 elements) on small tensors."""
    if device == "cpu":
        pytest.skip("the Triton kernel's index width; cpu runs NumPy")
    from nbxtensor.kernels import shape as kshape
    monkeypatch.setattr(kshape, "_FORCE_IDX64", True)
    x, rx = make((3, 5, 70), nbx.float32, device, "transposed")
    same(nbx.cat([x, x], 1), np.concatenate([rx, rx], 1))
    same(nbx.flip(x, (0, 2)), np.flip(rx, (0, 2)))
    same(nbx.pad(x, (3, 1, 1, 0), mode="reflect"), _np_pad(rx, (3, 1, 1, 0), "reflect"))
    same(nbx.tril(x, 1), np.tril(rx, 1))
    same(nbx.repeat_interleave(x, nbx.tensor([1, 0, 2], device=device), 0),
         np.repeat(rx, [1, 0, 2], 0))


def test_poisoned_helper_is_nan(device):
    p = poisoned((3,), nbx.float32, device)
    assert np.isnan(p.numpy()).all()
    assert not (rng().standard_normal(3) == 0).any()


def test_flip_recording_ignores_other_threads_launches(device, monkeypatch):
    """flip records its launches once per layout and replays them. The recording switch was
    process-wide: a launch made by another thread while a flip was being recorded (here a
    roll, run between the flip's launch and the end of its recording) joined the flip's
    replay, so later flips of that layout ran the roll's launch on their own tensors."""
    if device == "cpu":
        pytest.skip("kernel path")
    import threading
    from nbxtensor.kernels import shape as ks
    y, ry = make((2, 301), nbx.float32, device)
    orig = ks._flip

    def flip_then_roll_elsewhere(out, x, dims):
        orig(out, x, dims)
        th = threading.Thread(target=lambda: same(nbx.roll(y, 1, 1), np.roll(ry, 1, 1)))
        th.start()
        th.join()
    monkeypatch.setattr(ks, "_flip", flip_then_roll_elsewhere)
    x, rx = make((7, 301), nbx.float32, device)
    same(nbx.flip(x, (0,)), np.flip(rx, 0))          # recorded (with the roll, before)
    monkeypatch.setattr(ks, "_flip", orig)
    x2, rx2 = make((7, 301), nbx.float32, device)
    same(nbx.flip(x2, (0,)), np.flip(rx2, 0))        # replayed
