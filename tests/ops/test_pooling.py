"""Pooling (max, average, adaptive) against float64 NumPy references written here as loops
over every output position and window element, on every device: odd sizes that overhang the
kernels' (rows x columns) tiles, every stride/padding/dilation/ceil_mode combination, indices,
channels-last and strided inputs, NaN inputs, NaN-poisoned outputs, and the refusals."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import nbxtensor as nbx
import nbxtensor.nn.functional as F
from helpers import RTOL, assert_close, rng


pytestmark = pytest.mark.usefixtures("poison_outputs")


# ------------------------------------------------------------------ references
def _out_len(i, k, s, p, d, ceil):
    num = i + 2 * p - d * (k - 1) - 1
    o = (-(-num // s) if ceil else num // s) + 1
    if ceil and (o - 1) * s >= i + p:
        o -= 1
    return o


def ref_pool(x, kind, k, s, p, d=None, ceil=False, count_include_pad=True, divisor=None):
    """x (N, C, *spatial) float64; kind 'max' (returns values, flat indices) or 'avg'."""
    nd = x.ndim - 2
    d = d or (1,) * nd
    sp = x.shape[2:]
    outs = [_out_len(sp[a], k[a], s[a], p[a], d[a], ceil) for a in range(nd)]
    y = np.empty(x.shape[:2] + tuple(outs))
    idx = np.empty(y.shape, np.int64)
    for n, c in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for o in itertools.product(*[range(m) for m in outs]):
            start = [o[a] * s[a] - p[a] for a in range(nd)]
            # torch's index before any update: per axis the first window position >= 0 (a
            # window that misses the input entirely keeps it: -inf at a position past it)
            first = [start[a] + (-(-max(-start[a], 0) // d[a])) * d[a] for a in range(nd)]
            bi = 0
            for a in range(nd):
                bi = bi * sp[a] + first[a]
            best, total, count = -math.inf, 0.0, 0
            for kk in itertools.product(*[range(m) for m in k]):
                pos = [start[a] + kk[a] * d[a] for a in range(nd)]
                if not all(0 <= pos[a] < sp[a] for a in range(nd)):
                    continue
                v = x[(n, c) + tuple(pos)]
                flat = int(np.ravel_multi_index(pos, sp))
                if v > best or math.isnan(v):   # torch: a NaN always wins
                    best, bi = v, flat
                total += v
                count += 1
            if kind == "max":
                y[(n, c) + o], idx[(n, c) + o] = best, bi
            else:
                if divisor is not None:
                    den = divisor
                elif count_include_pad:
                    den = math.prod(min(start[a] + k[a], sp[a] + p[a]) - start[a]
                                    for a in range(nd))
                else:
                    den = count
                y[(n, c) + o] = total / den
    return (y, idx) if kind == "max" else y


def ref_adaptive(x, outs, kind):
    nd = x.ndim - 2
    sp = x.shape[2:]
    y = np.empty(x.shape[:2] + tuple(outs))
    idx = np.empty(y.shape, np.int64)
    for n, c in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for o in itertools.product(*[range(m) for m in outs]):
            rngs = [range(o[a] * sp[a] // outs[a], -(-(o[a] + 1) * sp[a] // outs[a]))
                    for a in range(nd)]
            vals = [(x[(n, c) + pos], int(np.ravel_multi_index(pos, sp)))
                    for pos in itertools.product(*rngs)]
            if kind == "avg":
                y[(n, c) + o] = sum(v for v, _ in vals) / len(vals)
            else:
                best, bi = vals[0]
                for v, f in vals[1:]:
                    if v > best or math.isnan(v):
                        best, bi = v, f
                y[(n, c) + o], idx[(n, c) + o] = best, bi
    return (y, idx) if kind == "max" else y


def _input(shape, dtype, device, layout="contiguous", gen=None):
    """A random tensor of `shape` in the given layout, and its float64 values (after rounding
    to dtype). layout: contiguous, channels_last (C innermost) or strided (every other
    element of a larger buffer along the last dim)."""
    gen = gen or rng()
    a = gen.standard_normal(shape).astype(dtype.np)
    if layout == "channels_last":
        nd = len(shape) - 2
        perm = (0,) + tuple(range(2, nd + 2)) + (1,)
        t = nbx.tensor(np.ascontiguousarray(a.transpose(perm)), device=device)
        t = t.permute(*np.argsort(perm).tolist())
        assert t.stride(1) == 1
    elif layout == "strided":
        # every other element of a NaN buffer: reading a skipped element, or one before
        # the first of a row, poisons the result
        big = np.full(a.shape[:-1] + (2 * a.shape[-1] + 1,), np.nan, a.dtype)
        big[..., 1::2] = a
        t = nbx.tensor(big, device=device)[..., 1::2]
        assert not t.is_contiguous()
    else:
        t = nbx.tensor(a, device=device)
    return t, a.astype(np.float64)


_POOLFN = {(1, "max"): F.max_pool1d, (2, "max"): F.max_pool2d, (3, "max"): F.max_pool3d,
           (1, "avg"): F.avg_pool1d, (2, "avg"): F.avg_pool2d, (3, "avg"): F.avg_pool3d}

# (input spatial, kernel, stride, padding, dilation): odd sizes, overhanging windows
_MAX_CASES = {
    # ((5,), (2,), (2,), (1,)): ceil_mode would start the last window in the padding
    1: [((37,), (3,), (2,), (1,), (1,)), ((20,), (4,), (3,), (2,), (2,)), ((9,), (2,), (2,), (0,), (1,)),
        ((5,), (2,), (2,), (1,), (1,))],
    2: [((13, 11), (3, 3), (2, 2), (1, 1), (1, 1)), ((12, 9), (2, 3), (2, 1), (1, 0), (2, 1)),
        ((7, 8), (3, 2), (3, 2), (0, 1), (1, 2)), ((5, 8), (2, 3), (2, 3), (1, 1), (1, 1))],
    3: [((5, 7, 6), (2, 3, 2), (2, 2, 1), (1, 1, 0), (1, 1, 2)), ((4, 5, 5), (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1))],
}


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("ceil", [False, True])
def test_max_pool_with_indices(device, nd, ceil):
    for sp, k, s, p, d in _MAX_CASES[nd]:
        x, a = _input((2, 3) + sp, nbx.float32, device)
        y, i = _POOLFN[(nd, "max")](x, k, s, p, d, ceil_mode=ceil, return_indices=True)
        ry, ri = ref_pool(a, "max", k, s, p, d, ceil)
        assert i.dtype is nbx.int64
        np.testing.assert_array_equal(y.numpy(), ry.astype(np.float32))
        np.testing.assert_array_equal(i.numpy(), ri)
        y2 = _POOLFN[(nd, "max")](x, k, s, p, d, ceil_mode=ceil)   # without indices
        np.testing.assert_array_equal(y2.numpy(), ry.astype(np.float32))


@pytest.mark.parametrize("dtype", [nbx.float16, nbx.bfloat16, nbx.float64])
def test_max_pool2d_dtypes(device, dtype):
    if dtype is nbx.float64 and device != "cpu":
        pytest.skip("float64 is a cpu dtype")
    x, a = _input((2, 5, 15, 18), dtype, device)     # 2*5*8*9 = 720 outputs: 3 tiles
    y, i = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    ry, ri = ref_pool(a, "max", (3, 3), (2, 2), (1, 1))
    assert y.dtype is dtype
    np.testing.assert_array_equal(y.numpy().astype(np.float64), ry)   # a max is exact
    np.testing.assert_array_equal(i.numpy(), ri)


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("ceil", [False, True])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool(device, nd, ceil, count_include_pad):
    for sp, k, s, p, _ in _MAX_CASES[nd]:
        x, a = _input((2, 3) + sp, nbx.float32, device)
        y = _POOLFN[(nd, "avg")](x, k, s, p, ceil_mode=ceil, count_include_pad=count_include_pad)
        assert_close(y, ref_pool(a, "avg", k, s, p, None, ceil, count_include_pad))


@pytest.mark.parametrize("nd", [2, 3])
def test_avg_pool_divisor_override(device, nd):
    sp, k, s, p, _ = _MAX_CASES[nd][0]
    x, a = _input((1, 2) + sp, nbx.float32, device)
    y = _POOLFN[(nd, "avg")](x, k, s, p, ceil_mode=True, divisor_override=5)
    assert_close(y, ref_pool(a, "avg", k, s, p, None, True, divisor=5))


@pytest.mark.parametrize("dtype", [nbx.float16, nbx.bfloat16, nbx.float64])
def test_avg_pool2d_dtypes(device, dtype):
    if dtype is nbx.float64 and device != "cpu":
        pytest.skip("float64 is a cpu dtype")
    x, a = _input((2, 5, 15, 18), dtype, device)
    y = F.avg_pool2d(x, (3, 2), (2, 2), (1, 1), ceil_mode=True, count_include_pad=False)
    assert y.dtype is dtype
    # one rounding of the fp32 (fp64) result
    assert_close(y, ref_pool(a, "avg", (3, 2), (2, 2), (1, 1), None, True, False),
                 rtol=RTOL[dtype], atol=RTOL[dtype])


@pytest.mark.parametrize("layout", ["channels_last", "strided"])
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool2d_layouts(device, layout, kind):
    x, a = _input((2, 6, 11, 10), nbx.float32, device, layout)
    if kind == "max":
        y, i = F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)
        ry, ri = ref_pool(a, "max", (3, 3), (2, 2), (1, 1), None, True)
        np.testing.assert_array_equal(i.numpy(), ri)
        np.testing.assert_array_equal(y.numpy(), ry.astype(np.float32))
    else:
        y = F.avg_pool2d(x, 3, 2, 1, ceil_mode=True)
        assert_close(y, ref_pool(a, "avg", (3, 3), (2, 2), (1, 1), None, True))
    if layout == "channels_last":     # torch keeps the layout
        assert y.stride(1) == 1 and y.permute(0, 2, 3, 1).is_contiguous()


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_pool2d_narrow_column_tiles(device, monkeypatch, layout):
    # 4-wide column tiles: 11 output columns (NCHW) and 7 channels (channels-last) overhang
    # them, 2 x 7 x 6 rows overhang the 256-row tiles; max with indices, then the average
    if device != "cpu":
        import nbxtensor.kernels.pooling as kp
        monkeypatch.setattr(kp, "_OVERRIDE", dict(BLOCK_Q=4))
    x, a = _input((2, 7, 13, 22), nbx.float32, device, layout)
    y, i = F.max_pool2d(x, (3, 2), (2, 2), (1, 1), return_indices=True)
    ry, ri = ref_pool(a, "max", (3, 2), (2, 2), (1, 1))
    np.testing.assert_array_equal(y.numpy(), ry.astype(np.float32))
    np.testing.assert_array_equal(i.numpy(), ri)
    y = F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
    assert_close(y, ref_pool(a, "avg", (3, 3), (1, 1), (1, 1), count_include_pad=False))
    y = F.adaptive_max_pool2d(x, (5, 3))
    np.testing.assert_array_equal(y.numpy(), ref_adaptive(a, (5, 3), "max")[0].astype(np.float32))


def test_pool3d_channels_last(device):
    x, a = _input((1, 3, 5, 6, 7), nbx.float32, device, "channels_last")
    y, i = F.max_pool3d(x, 2, 2, 1, return_indices=True)
    ry, ri = ref_pool(a, "max", (2, 2, 2), (2, 2, 2), (1, 1, 1))
    np.testing.assert_array_equal(y.numpy(), ry.astype(np.float32))
    np.testing.assert_array_equal(i.numpy(), ri)
    assert y.stride(1) == 1


def test_max_pool_nan_propagates(device):
    gen = rng()
    a = gen.standard_normal((2, 3, 9, 10)).astype(np.float32)
    a[0, 1, 4, 5] = np.nan                 # one NaN: every window holding it is NaN
    a[1, 2, 0:2, 0:2] = np.nan             # several NaNs in one window: the last one wins
    a[1, 0] = -np.inf                      # all -inf: the first element of each window
    x = nbx.tensor(a, device=device)
    y, i = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    ry, ri = ref_pool(a.astype(np.float64), "max", (3, 3), (2, 2), (1, 1))
    np.testing.assert_array_equal(y.numpy(), ry.astype(np.float32))
    np.testing.assert_array_equal(i.numpy(), ri)
    assert np.isnan(y.numpy()[0, 1, 2, 2]) and i.numpy()[0, 1, 2, 2] == 4 * 10 + 5
    ya, ia = F.adaptive_max_pool2d(x, (4, 3), return_indices=True)
    rya, ria = ref_adaptive(a.astype(np.float64), (4, 3), "max")
    np.testing.assert_array_equal(ya.numpy(), rya.astype(np.float32))
    np.testing.assert_array_equal(ia.numpy(), ria)


def test_max_pool_window_missing_the_input(device):
    """A dilated window that skips over a size-1 axis: -inf, and torch's index (the first
    window position >= 0 on each axis, here past the input)."""
    x, a = _input((2, 3, 1, 5, 5), nbx.float32, device)
    y, i = F.max_pool3d(x, (3, 1, 2), (3, 1, 1), (1, 0, 0), (2, 2, 1), ceil_mode=True,
                        return_indices=True)
    ry, ri = ref_pool(a, "max", (3, 1, 2), (3, 1, 1), (1, 0, 0), (2, 2, 1), True)
    assert np.isneginf(ry).all() and ri[0, 0, 0, 0, 0] == 25
    np.testing.assert_array_equal(y.numpy(), ry.astype(np.float32))
    np.testing.assert_array_equal(i.numpy(), ri)


def test_unbatched(device):
    x, a = _input((3, 9, 8), nbx.float32, device)
    y, i = F.max_pool2d(x, 2, return_indices=True)
    ry, ri = ref_pool(a[None], "max", (2, 2), (2, 2), (0, 0))
    assert tuple(y.shape) == (3, 4, 4) and tuple(i.shape) == (3, 4, 4)
    np.testing.assert_array_equal(y.numpy(), ry[0].astype(np.float32))
    np.testing.assert_array_equal(i.numpy(), ri[0])
    x1, a1 = _input((4, 13), nbx.float32, device)
    assert_close(F.avg_pool1d(x1, 3, 2), ref_pool(a1[None], "avg", (3,), (2,), (0,))[0])
    assert_close(F.adaptive_avg_pool1d(x1, 5), ref_adaptive(a1[None], (5,), "avg")[0])


@pytest.mark.parametrize("nd,sp,outs", [
    (1, (23,), (7,)), (1, (5,), (8,)),
    (2, (13, 10), (4, 7)), (2, (5, 6), (7, 6)), (2, (9, 9), (1, 1)),
    (3, (5, 7, 6), (2, 3, 4)),
])
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_adaptive_pool(device, nd, sp, outs, kind):
    fn = {("avg", 1): F.adaptive_avg_pool1d, ("avg", 2): F.adaptive_avg_pool2d,
          ("avg", 3): F.adaptive_avg_pool3d, ("max", 1): F.adaptive_max_pool1d,
          ("max", 2): F.adaptive_max_pool2d, ("max", 3): F.adaptive_max_pool3d}[(kind, nd)]
    x, a = _input((2, 3) + sp, nbx.float32, device)
    if kind == "avg":
        assert_close(fn(x, outs), ref_adaptive(a, outs, "avg"))
    else:
        y, i = fn(x, outs, return_indices=True)
        ry, ri = ref_adaptive(a, outs, "max")
        np.testing.assert_array_equal(y.numpy(), ry.astype(np.float32))
        np.testing.assert_array_equal(i.numpy(), ri)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_adaptive_pool_even_bins(device, layout):
    """Bins that divide the input evenly run as plain windows (kernel = stride = I / O): on
    NCHW the wide-row kernel up to 64-wide windows, on channels-last the general kernel's
    small tiles; against the adaptive reference, with NaN and -inf in bins and indices."""
    x, a = _input((2, 3, 8, 64), nbx.float32, device, layout)
    a = a.copy()
    a[0, 1, 2, 17] = np.nan
    a[1, 2, 4:6, 32:64] = -np.inf
    x = nbx.tensor(a.astype(np.float32), device=device)
    if layout == "channels_last":
        x = nbx.tensor(np.ascontiguousarray(a.astype(np.float32).transpose(0, 2, 3, 1)),
                       device=device).permute(0, 3, 1, 2)
    for outs in ((4, 1), (2, 2), (8, 4), (1, 1)):
        np.testing.assert_allclose(F.adaptive_avg_pool2d(x, outs).numpy(),
                                   ref_adaptive(a, outs, "avg"), rtol=1e-6, atol=1e-6)
        y = F.adaptive_max_pool2d(x, outs)
        np.testing.assert_array_equal(y.numpy(), ref_adaptive(a, outs, "max")[0].astype(np.float32))
        y, i = F.adaptive_max_pool2d(x, outs, return_indices=True)
        ry, ri = ref_adaptive(a, outs, "max")
        np.testing.assert_array_equal(y.numpy(), ry.astype(np.float32))
        np.testing.assert_array_equal(i.numpy(), ri)
    if device != "cpu" and layout == "contiguous":
        import nbxtensor.kernels.pooling as kp
        assert kp._rows_path(nbx.empty(1, 1, 1, 4, 1), nbx.empty(1, 1, 1, 8, 64), None,
                             (1, 2, 64), (1, 2, 64), (0, 0, 0), (1, 1, 1), False) == 64


def test_adaptive_pool_none_and_layouts(device):
    x, a = _input((2, 5, 9, 7), nbx.float32, device, "channels_last")
    y = F.adaptive_avg_pool2d(x, (4, None))              # None keeps the input's width
    assert tuple(y.shape) == (2, 5, 4, 7)
    assert_close(y, ref_adaptive(a, (4, 7), "avg"))
    xs, as_ = _input((2, 5, 9, 7), nbx.float32, device, "strided")
    assert_close(F.adaptive_avg_pool2d(xs, 3), ref_adaptive(as_, (3, 3), "avg"))
    x16, a16 = _input((2, 3, 11, 13), nbx.bfloat16, device)
    assert_close(F.adaptive_avg_pool2d(x16, (3, 4)), ref_adaptive(a16, (3, 4), "avg"),
                 rtol=RTOL[nbx.bfloat16], atol=RTOL[nbx.bfloat16])


def test_top_level_names():
    assert nbx.max_pool2d is F.max_pool2d and nbx.avg_pool1d is F.avg_pool1d
    assert nbx.adaptive_max_pool1d is F.adaptive_max_pool1d
    import inspect
    assert list(inspect.signature(F.max_pool2d).parameters) == [
        "input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"]
    assert list(inspect.signature(F.avg_pool2d).parameters) == [
        "input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
        "divisor_override"]


def test_refusals():
    x = nbx.tensor(rng().standard_normal((1, 2, 5, 5)).astype(np.float32))
    with pytest.raises(ValueError, match="at most half of kernel_size"):
        F.max_pool2d(x, 3, padding=2)
    with pytest.raises(ValueError, match="at most half of kernel_size"):
        F.avg_pool2d(x, 2, padding=(0, 2))
    with pytest.raises(ValueError, match="too small"):
        F.max_pool2d(x, 7)          # the kernel is larger than the padded input
    with pytest.raises(ValueError, match="too small"):
        F.max_pool2d(x, 3, dilation=3)   # the dilated window is larger than the input
    with pytest.raises(ValueError, match="divisor_override"):
        F.avg_pool2d(x, 2, divisor_override=0)
    with pytest.raises(ValueError, match="4-D"):
        F.max_pool2d(x.reshape(2, 5, 5, 1, 1), 2)
    with pytest.raises(TypeError, match="float16"):
        F.max_pool2d(nbx.ones((1, 1, 4, 4), dtype=nbx.int32), 2)
    with pytest.raises(TypeError, match="kernel_size"):
        F.max_pool2d(x, (2, 2, 2))
    with pytest.raises(ValueError, match="stride"):
        F.max_pool2d(x, 2, stride=0)
    with pytest.raises(TypeError, match="output_size"):
        F.adaptive_avg_pool2d(x, (2, 2, 2))
    with pytest.raises(ValueError, match="non-zero"):
        F.max_pool2d(nbx.ones((1, 0, 4, 4)), 2)
    with pytest.raises(TypeError, match="Tensor"):
        F.max_pool2d(np.ones((1, 1, 4, 4)), 2)


def test_modules(device):
    nn = nbx.nn
    reprs = {  # torch 2.13's repr of the same constructions
        nn.MaxPool1d(3): "MaxPool1d(kernel_size=3, stride=3, padding=0, dilation=1, ceil_mode=False)",
        nn.MaxPool2d((3, 2), stride=1, padding=1, dilation=2, ceil_mode=True, return_indices=True):
            "MaxPool2d(kernel_size=(3, 2), stride=1, padding=1, dilation=2, ceil_mode=True)",
        nn.AvgPool1d(3): "AvgPool1d(kernel_size=(3,), stride=(3,), padding=(0,))",
        nn.AvgPool2d(3, 2, 1, True, False, 4): "AvgPool2d(kernel_size=3, stride=2, padding=1)",
        nn.AvgPool3d((2, 2, 2)): "AvgPool3d(kernel_size=(2, 2, 2), stride=(2, 2, 2), padding=0)",
        nn.AdaptiveAvgPool2d((3, None)): "AdaptiveAvgPool2d(output_size=(3, None))",
        nn.AdaptiveMaxPool2d(3, True): "AdaptiveMaxPool2d(output_size=3)",
        nn.Upsample(scale_factor=2): "Upsample(scale_factor=2.0, mode='nearest')",
        nn.Upsample(size=(3, 4), mode="bilinear", align_corners=False):
            "Upsample(size=(3, 4), mode='bilinear')",
        nn.Upsample(scale_factor=(2, 3), mode="bicubic"):
            "Upsample(scale_factor=(2.0, 3.0), mode='bicubic')",
        nn.UpsamplingNearest2d(scale_factor=2): "UpsamplingNearest2d(scale_factor=2.0, mode='nearest')",
        nn.UpsamplingBilinear2d(size=5): "UpsamplingBilinear2d(size=5, mode='bilinear')",
        nn.PixelShuffle(2): "PixelShuffle(upscale_factor=2)",
        nn.PixelUnshuffle(3): "PixelUnshuffle(downscale_factor=3)",
        nn.Unfold(3, padding=1): "Unfold(kernel_size=3, dilation=1, padding=1, stride=1)",
        nn.Fold((4, 5), 2, stride=2):
            "Fold(output_size=(4, 5), kernel_size=2, dilation=1, padding=0, stride=2)",
    }
    for m, r in reprs.items():
        assert repr(m) == r
    x, a = _input((2, 3, 9, 8), nbx.float32, device)
    y, i = nn.MaxPool2d(3, 2, 1, ceil_mode=True, return_indices=True)(x)
    ry, ri = ref_pool(a, "max", (3, 3), (2, 2), (1, 1), None, True)
    np.testing.assert_array_equal(y.numpy(), ry.astype(np.float32))
    np.testing.assert_array_equal(i.numpy(), ri)
    assert_close(nn.AvgPool2d(3, 2, 1, count_include_pad=False)(x),
                 ref_pool(a, "avg", (3, 3), (2, 2), (1, 1), None, False, False))
    assert_close(nn.AdaptiveAvgPool2d((None, 1))(x), a.mean(axis=3, keepdims=True))
    up = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.PixelUnshuffle(2))(x)
    np.testing.assert_array_equal(up.numpy()[:, ::4], a.astype(np.float32))


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16])
def test_pool_windows_tiling_the_width(device, dtype, monkeypatch):
    """NCHW pooling whose windows tile the width (kernel = stride along w, no w padding:
    the wide-row kernel on cuda/interp): 2x2 max/avg on 4-wide column tiles overhung by 13
    output columns, windows (3, 2) with h padding (count_include_pad both ways), a 4-wide
    window, divisor_override, 3-D 2x2x2, a strided input, NaN and -inf in windows."""
    if device != "cpu":
        import nbxtensor.kernels.pooling as kp
        monkeypatch.setattr(kp, "_OVERRIDE", dict(BLOCK_Q=4))
        assert kp._rows_path(nbx.empty(1, 1, 1, 1, 4), nbx.empty(1, 1, 1, 2, 9),
                             None, (1, 2, 2), (1, 2, 2), (0, 0, 0), (1, 1, 1), False) == 2
    gen = rng(11)
    a = gen.standard_normal((2, 3, 11, 27)).astype(np.float64)
    a[0, 1, 4, 5] = np.nan
    a[1, 2, 0:2, 0:4] = -np.inf
    x = nbx.tensor(a.astype(dtype.np), device=device)
    aq = a.astype(dtype.np).astype(np.float64)
    tol = dict(rtol=RTOL[dtype], atol=RTOL[dtype])
    for k, s, p in (((2, 2), (2, 2), (0, 0)), ((3, 2), (2, 2), (1, 0)), ((1, 4), (1, 4), (0, 0))):
        y = F.max_pool2d(x, k, s, p)
        np.testing.assert_array_equal(y.float().numpy(),
                                      ref_pool(aq, "max", k, s, p)[0].astype(np.float32))
        for cip in (True, False):
            y = F.avg_pool2d(x, k, s, p, count_include_pad=cip)
            r = ref_pool(aq, "avg", k, s, p, count_include_pad=cip)
            np.testing.assert_allclose(y.float().numpy(), r, equal_nan=True, **tol)
    y = F.avg_pool2d(x, 2, 2, divisor_override=3)
    np.testing.assert_allclose(y.float().numpy(), ref_pool(aq, "avg", (2, 2), (2, 2), (0, 0),
                                                          divisor=3), equal_nan=True, **tol)
    xs = nbx.tensor(a.astype(dtype.np), device=device)[:, :, 1:, 1:]    # strided, offset
    y = F.max_pool2d(xs, 2)
    np.testing.assert_array_equal(y.float().numpy(),
                                  ref_pool(aq[:, :, 1:, 1:], "max", (2, 2), (2, 2),
                                           (0, 0))[0].astype(np.float32))
    b = gen.standard_normal((2, 3, 5, 7, 9))
    y = F.avg_pool3d(nbx.tensor(b.astype(dtype.np), device=device), 2)
    np.testing.assert_allclose(y.float().numpy(),
                               ref_pool(b.astype(dtype.np).astype(np.float64), "avg",
                                        (2, 2, 2), (2, 2, 2), (0, 0, 0)), **tol)
