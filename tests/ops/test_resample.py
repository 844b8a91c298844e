"""interpolate, grid_sample, affine_grid, pixel_shuffle/unshuffle, unfold/fold on every
device. References: float64 NumPy written here (the nearest/linear/cubic formulas, im2col
loops, the affine grid), and torch's own float64 CPU results for the modes easiest to get
subtly wrong (antialias, bicubic, area, nearest-exact, every grid_sample mode and padding),
saved by tests/fixtures/make_resample_fixtures.py. Outputs are NaN-poisoned; inputs include
channels-last and strided layouts and odd sizes that overhang the 256-element tiles."""
from __future__ import annotations

import itertools
import json
import math
import os

import numpy as np
import pytest

import nbxtensor as nbx
import nbxtensor.nn.functional as F
from helpers import RTOL, assert_close, rng

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "resample", "torch_resample.npz")


pytestmark = pytest.mark.usefixtures("poison_outputs")


@pytest.fixture(scope="module")
def torch_cases():
    d = np.load(FIXTURES)
    assert str(d["torch_version"]).startswith("2.")
    return d


def _tensor(a, dtype, device, layout="contiguous"):
    a = np.asarray(a).astype(dtype.np)
    if layout == "channels_last":
        nd = a.ndim - 2
        perm = (0,) + tuple(range(2, nd + 2)) + (1,)
        t = nbx.tensor(np.ascontiguousarray(a.transpose(perm)), device=device)
        return t.permute(*np.argsort(perm).tolist())
    if layout == "strided":
        # every other element of a NaN buffer: reading a skipped element, or one before
        # the first of a row (a tap at index -1), shows in the result
        big = np.full(a.shape[:-1] + (2 * a.shape[-1] + 1,), np.nan, a.dtype)
        big[..., 1::2] = a
        return nbx.tensor(big, device=device)[..., 1::2]
    return nbx.tensor(a, device=device)


def _tol(dtype, scale=1.0):
    # a weighted sum of a few rounded inputs, computed in fp32 and rounded once
    r = {nbx.float32: 2e-5, nbx.float64: 1e-12}.get(dtype, RTOL.get(dtype))
    return dict(rtol=r, atol=r * scale)


# ------------------------------------------------------------------ per-axis references
def _src_linear(o, i, n_out, align, scale, cubic=False):
    if align:
        s = (i - 1) / (n_out - 1) if n_out > 1 else 0.0
        return s * o
    s = scale if scale is not None else i / n_out
    src = s * (o + 0.5) - 0.5
    return src if cubic else max(src, 0.0)


def _axis_matrix(mode, i, n_out, align=False, scale=None):
    """(n_out, i) matrix M with out = M @ in along one axis."""
    m = np.zeros((n_out, i))
    for o in range(n_out):
        if mode == "nearest":
            s = np.float32(scale if scale is not None else np.float32(i) / np.float32(n_out))
            m[o, min(int(np.floor(np.float32(o) * s)), i - 1)] = 1   # torch: float32 arithmetic
        elif mode == "linear":
            src = _src_linear(o, i, n_out, align, scale)
            i0 = int(math.floor(src))
            i1 = min(i0 + 1, i - 1)
            lam = src - i0
            m[o, i0] += 1 - lam
            m[o, i1] += lam
        elif mode == "cubic":
            src = _src_linear(o, i, n_out, align, scale, cubic=True)
            f = math.floor(src)
            t = src - f
            A = -0.75

            def w(x):
                x = abs(x)
                if x < 1:
                    return ((A + 2) * x - (A + 3)) * x * x + 1
                return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A if x < 2 else 0.0
            for k in range(4):
                m[o, min(max(f - 1 + k, 0), i - 1)] += w(t + 1 - k)
    return m


def ref_separable(x, mats):
    """Apply one (out, in) matrix per spatial axis of x (N, C, *spatial)."""
    y = x
    for a, m in enumerate(mats):
        y = np.moveaxis(np.tensordot(m, np.moveaxis(y, 2 + a, 0), axes=(1, 0)), 0, 2 + a)
    return y


@pytest.mark.parametrize("shape,size,mode,align", [
    ((2, 3, 37), (16,), "linear", False), ((1, 2, 9), (23,), "linear", True),
    ((2, 3, 7, 9), (13, 5), "bilinear", False), ((1, 2, 7, 9), (13, 5), "bilinear", True),
    ((1, 2, 6, 7), (1, 9), "bilinear", True),
    ((1, 2, 3, 5, 4), (5, 3, 7), "trilinear", False), ((1, 1, 3, 5, 4), (4, 6, 3), "trilinear", True),
    ((2, 3, 5, 7), (11, 4), "bicubic", False), ((1, 2, 5, 7), (9, 13), "bicubic", True),
    ((2, 3, 17), (7,), "nearest", None), ((2, 3, 7, 9), (13, 5), "nearest", None),
    ((1, 2, 3, 5, 4), (7, 2, 8), "nearest", None), ((1, 2, 4, 5), (8, 10), "nearest", None),
    # the width doubled (the interleaving 2x kernel on cuda/interp): 258 columns overhang
    # its 256-wide tile; bicubic's outer taps are loaded one by one
    ((2, 3, 7, 129), (13, 258), "bilinear", False), ((1, 2, 5, 9), (10, 18), "bilinear", True),
    ((2, 3, 20), (40,), "linear", False), ((1, 2, 3, 5, 4), (6, 10, 8), "trilinear", False),
    ((1, 2, 5, 9), (10, 18), "bicubic", False), ((1, 2, 5, 9), (7, 18), "bicubic", True),
    ((2, 3, 6, 130), (12, 260), "nearest", None),
])
def test_interpolate_formulas(device, shape, size, mode, align):
    gen = rng()
    a = gen.standard_normal(shape)
    axis = {"bilinear": "linear", "trilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    mats = [_axis_matrix(axis, i, o, bool(align)) for i, o in zip(shape[2:], size)]
    ref = ref_separable(a.astype(np.float32).astype(np.float64), mats)
    y = F.interpolate(_tensor(a, nbx.float32, device), size=size, mode=mode, align_corners=align)
    assert y.dtype is nbx.float32
    assert_close(y, ref, **_tol(nbx.float32, 4))


@pytest.mark.parametrize("dtype", [nbx.float16, nbx.bfloat16, nbx.float64])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "nearest"])
def test_interpolate_dtypes(device, dtype, mode):
    if dtype is nbx.float64 and device != "cpu":
        pytest.skip("float64 is a cpu dtype")
    a = rng().standard_normal((2, 3, 9, 14))
    axis = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    size = (17, 6)
    ref = ref_separable(a.astype(dtype.np).astype(np.float64),
                        [_axis_matrix(axis, i, o) for i, o in zip((9, 14), size)])
    y = F.interpolate(_tensor(a, dtype, device), size=size, mode=mode,
                      align_corners=None if mode == "nearest" else False)
    assert y.dtype is dtype
    assert_close(y, ref, **_tol(dtype, 4))


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_interpolate_narrow_column_tiles(device, monkeypatch, layout):
    # 4-wide column tiles (the pooling tiling's override): 13 output columns (NCHW) and
    # 7 channels (channels-last) overhang them
    if device != "cpu":
        import nbxtensor.kernels.pooling as kp
        monkeypatch.setattr(kp, "_OVERRIDE", dict(BLOCK_Q=4))
    a = rng().standard_normal((2, 7, 6, 9))
    size = (11, 13)
    ref = ref_separable(a.astype(np.float32).astype(np.float64),
                        [_axis_matrix("linear", i, o) for i, o in zip((6, 9), size)])
    y = F.interpolate(_tensor(a, nbx.float32, device, layout), size=size, mode="bilinear")
    assert_close(y, ref, **_tol(nbx.float32, 4))


@pytest.mark.parametrize("layout", ["channels_last", "strided"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_interpolate_layouts(device, layout, mode):
    a = rng().standard_normal((2, 5, 7, 10))
    axis = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    size = (12, 5)
    ref = ref_separable(a.astype(np.float32).astype(np.float64),
                        [_axis_matrix(axis, i, o) for i, o in zip((7, 10), size)])
    y = F.interpolate(_tensor(a, nbx.float32, device, layout), size=size, mode=mode)
    assert_close(y, ref, **_tol(nbx.float32, 4))
    if layout == "channels_last":
        assert y.stride(1) == 1      # torch keeps channels-last


def test_interpolate_scale_factor(device):
    a = rng().standard_normal((1, 2, 7, 9))
    x = _tensor(a, nbx.float32, device)
    # without recompute the kernel uses 1 / scale_factor; with it, in / out
    for recompute, scale in ((None, 1 / 1.7), (True, None)):
        y = F.interpolate(x, scale_factor=1.7, mode="bilinear", recompute_scale_factor=recompute)
        assert tuple(y.shape) == (1, 2, 11, 15)
        mats = [_axis_matrix("linear", i, o, False, scale) for i, o in ((7, 11), (9, 15))]
        assert_close(y, ref_separable(a.astype(np.float32).astype(np.float64), mats),
                     **_tol(nbx.float32, 4))
    y = F.interpolate(x, scale_factor=(2.3, 0.7), mode="nearest")
    mats = [_axis_matrix("nearest", 7, 16, scale=1 / 2.3), _axis_matrix("nearest", 9, 6, scale=1 / 0.7)]
    assert_close(y, ref_separable(a.astype(np.float32).astype(np.float64), mats))
    # sizes of exactly 2x and 1x from other factors still use the factors (torch's 3-D/5-D
    # and CUDA kernels): 1 / 2.004 drops a source row a 2x index map would keep
    a3 = rng().standard_normal((1, 2, 7, 5, 6))
    y = F.interpolate(_tensor(a3, nbx.float32, device), scale_factor=(2.004, 1.14, 1.0))
    mats = [_axis_matrix("nearest", 7, 14, scale=1 / 2.004),
            _axis_matrix("nearest", 5, 5, scale=1 / 1.14), _axis_matrix("nearest", 6, 6)]
    assert_close(y, ref_separable(a3.astype(np.float32).astype(np.float64), mats))
    assert tuple(F.interpolate(x, scale_factor=0.1, mode="area").shape) == (1, 2, 0, 0)
    assert nbx.nn.functional.upsample_nearest(x, scale_factor=2).shape == (1, 2, 14, 18)
    ub = F.upsample_bilinear(x, size=(4, 5))
    mats = [_axis_matrix("linear", i, o, True) for i, o in ((7, 4), (9, 5))]
    assert_close(ub, ref_separable(a.astype(np.float32).astype(np.float64), mats),
                 **_tol(nbx.float32, 4))


def _args(d, name):
    kw = json.loads(str(d[name + "/args"]))
    for k in ("size", "scale_factor"):
        if isinstance(kw.get(k), list):
            kw[k] = tuple(kw[k])
    return kw


_INTERP_CASES = ["aa_bilinear_down", "aa_bilinear_down_align", "aa_bilinear_up",
                 "aa_bilinear_scale", "aa_bicubic_down", "aa_bicubic_mixed", "bicubic_up",
                 "bicubic_up_align", "bicubic_down", "bicubic_scale", "area_down", "area_up",
                 "area_3d", "nearest_exact_down", "nearest_exact_up", "nearest_exact_scale",
                 "nearest_scale", "nearest_1d", "bilinear_scale", "bilinear_recompute",
                 "trilinear", "linear_align"]


@pytest.mark.parametrize("name", _INTERP_CASES)
def test_interpolate_against_torch(device, torch_cases, name):
    d = torch_cases
    kw = _args(d, name)
    x = d[name + "/x"]
    for dtype, layout in ([(nbx.float64, "contiguous")] if device == "cpu" else []) + [
            (nbx.float32, "contiguous"), (nbx.float32, "strided")]:
        y = F.interpolate(_tensor(x, dtype, device, layout), **kw)
        # torch's float64 result from the float64 input: the fp32 run adds the input's rounding
        assert_close(y, d[name + "/y"], **_tol(dtype, 4) if dtype is nbx.float64
                     else dict(rtol=1e-5, atol=1e-5))


@pytest.mark.parametrize("dtype", [nbx.float16, nbx.bfloat16])
def test_interpolate_antialias_16bit(device, torch_cases, dtype):
    d = torch_cases
    for name in ("aa_bilinear_down", "aa_bicubic_mixed", "area_down"):
        x = _tensor(d[name + "/x"], dtype, device, "channels_last")
        y = F.interpolate(x, **_args(d, name))
        assert y.dtype is dtype
        assert_close(y, d[name + "/y"], rtol=4 * RTOL[dtype], atol=4 * RTOL[dtype])


_GRID_CASES = [f"grid{nd}d_{m}_{p}_{a}" for nd in (2, 3)
               for m in (("bilinear", "nearest", "bicubic") if nd == 2 else ("bilinear", "nearest"))
               for p in ("zeros", "border", "reflection") for a in (0, 1)]


@pytest.mark.parametrize("name", _GRID_CASES)
def test_grid_sample_against_torch(device, torch_cases, name):
    d = torch_cases
    kw = _args(d, name)
    for dtype in ([nbx.float64] if device == "cpu" else []) + [nbx.float32]:
        x = _tensor(d[name + "/x"], dtype, device)
        g = _tensor(d[name + "/grid"], dtype, device)
        y = F.grid_sample(x, g, **kw)
        if dtype is nbx.float64:
            assert_close(y, d[name + "/y"], rtol=1e-10, atol=1e-10)
        else:
            # fp32 grid coordinates move nearest's picks only at exact ties: none here
            assert_close(y, d[name + "/y"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["channels_last", "strided"])
def test_grid_sample_layouts_and_16bit(device, torch_cases, layout):
    d = torch_cases
    for name in ("grid2d_bilinear_reflection_0", "grid2d_bicubic_border_1"):
        kw = _args(d, name)
        x = _tensor(d[name + "/x"], nbx.float32, device, layout)
        g = _tensor(d[name + "/grid"], nbx.float32, device, "strided")
        assert_close(F.grid_sample(x, g, **kw), d[name + "/y"], rtol=1e-4, atol=1e-4)
        xb = _tensor(d[name + "/x"], nbx.bfloat16, device, layout)
        gb = _tensor(d[name + "/grid"], nbx.bfloat16, device)
        yb = F.grid_sample(xb, gb, **kw)
        assert yb.dtype is nbx.bfloat16
        # reference from the bf16-rounded grid and input (the coordinates are rounded too)
        gr = d[name + "/grid"].astype(nbx.bfloat16.np).astype(np.float64)
        xr = d[name + "/x"].astype(nbx.bfloat16.np).astype(np.float64)
        ref = F.grid_sample(nbx.tensor(xr), nbx.tensor(gr), **kw).numpy()
        assert_close(yb, ref, rtol=2 * RTOL[nbx.bfloat16], atol=2 * RTOL[nbx.bfloat16])


def ref_grid_bilinear_zeros(x, grid, align):
    """Written out for the plain case: bilinear, zero padding."""
    N, C, H, W = x.shape
    _, Ho, Wo, _ = grid.shape
    y = np.zeros((N, C, Ho, Wo))
    for n, i, j in itertools.product(range(N), range(Ho), range(Wo)):
        gx, gy = grid[n, i, j]
        if align:
            ux, uy = (gx + 1) / 2 * (W - 1), (gy + 1) / 2 * (H - 1)
        else:
            ux, uy = ((gx + 1) * W - 1) / 2, ((gy + 1) * H - 1) / 2
        x0, y0 = math.floor(ux), math.floor(uy)
        for yy, xx in itertools.product((y0, y0 + 1), (x0, x0 + 1)):
            w = (1 - abs(ux - xx)) * (1 - abs(uy - yy))
            if 0 <= yy < H and 0 <= xx < W:
                y[n, :, i, j] += w * x[n, :, yy, xx]
    return y


@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_formula(device, align):
    gen = rng()
    x = gen.standard_normal((2, 3, 6, 7))
    grid = gen.uniform(-1.3, 1.3, (2, 9, 31, 2))     # 2*3*9*31 = 1674 outputs: 7 tiles
    y = F.grid_sample(_tensor(x, nbx.float32, device), _tensor(grid, nbx.float32, device),
                      align_corners=align)
    ref = ref_grid_bilinear_zeros(x.astype(np.float32).astype(np.float64),
                                  grid.astype(np.float32).astype(np.float64), align)
    assert_close(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nd", [2, 3])
def test_grid_sample_nearest_ties(device, nd):
    """Coordinates exactly halfway between pixels round half to even (torch's nearbyint)."""
    x = rng().standard_normal((1, 2) + (5,) * nd)
    # align_corners: u = (g + 1) / 2 * 4, so g = -0.75, -0.25, 0.25, 0.75 are u = 0.5 .. 3.5
    ties = np.array([-0.75, -0.25, 0.25, 0.75, -1.0, 1.0])
    grid = np.stack(np.meshgrid(*[ties] * nd, indexing="ij")[::-1], axis=-1)[None]
    y = F.grid_sample(_tensor(x, nbx.float32, device), _tensor(grid, nbx.float32, device),
                      mode="nearest", align_corners=True)
    pick = np.rint((ties + 1) / 2 * 4).astype(int)        # NumPy's rint: half to even
    ref = x[np.ix_([0], [0, 1], *[pick] * nd)]
    np.testing.assert_array_equal(y.numpy(), ref.astype(np.float32))


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("nd", [2, 3])
def test_affine_grid(device, align, nd):
    gen = rng()
    size = (2, 3, 4, 5) if nd == 2 else (2, 1, 3, 4, 5)
    theta = gen.standard_normal((2, nd, nd + 1))
    g = F.affine_grid(_tensor(theta, nbx.float32, device), size, align_corners=align)

    def line(n):
        v = np.linspace(-1, 1, n) if n > 1 else np.zeros(1)
        return v if align else v * (n - 1) / n
    sp = size[2:]
    ref = np.zeros((2,) + sp + (nd,))
    for n in range(2):
        for pos in itertools.product(*[range(s) for s in sp]):
            coords = [line(sp[nd - 1 - k])[pos[nd - 1 - k]] for k in range(nd)]   # x, y[, z]
            ref[(n,) + pos] = theta[n] @ np.array(coords + [1.0])
    assert tuple(g.shape) == (2,) + sp + (nd,)
    assert_close(g, ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ pixel shuffle
@pytest.mark.parametrize("shape,r", [((2, 18, 3, 5), 3), ((8, 4, 7), 2), ((2, 1, 12, 5, 3), 2),
                                     ((2, 16, 5, 129), 2), ((1, 32, 3, 9), 4)])
def test_pixel_shuffle(device, shape, r):
    """Factors 2 and 4 take the interleaving kernel on cuda/interp (258 output columns
    overhang its 256-wide tile, 80 rows its 16-row one), 3 and strided inputs the views."""
    a = rng().standard_normal(shape).astype(np.float32)
    *lead, c, h, w = shape
    ref = a.reshape(*lead, c // (r * r), r, r, h, w)
    k = len(lead)
    ref = ref.transpose(*range(k), k, k + 3, k + 1, k + 4, k + 2).reshape(
        *lead, c // (r * r), h * r, w * r)
    for layout in ("contiguous", "strided"):
        y = nbx.pixel_shuffle(_tensor(a, nbx.float32, device, layout), r)
        np.testing.assert_array_equal(y.numpy(), ref)
        back = F.pixel_unshuffle(y, r)
        np.testing.assert_array_equal(back.numpy(), a)


def test_pixel_shuffle_bf16_and_empty(device):
    a = rng(5).standard_normal((3, 8, 6, 7)).astype(np.float32)
    x = nbx.tensor(a, device=device).to(nbx.bfloat16)
    ref = a.astype(nbx.bfloat16.np).reshape(3, 2, 2, 2, 6, 7).transpose(0, 1, 4, 2, 5, 3)
    y = nbx.pixel_shuffle(x, 2)
    assert y.dtype == nbx.bfloat16 and tuple(y.shape) == (3, 2, 12, 14)
    np.testing.assert_array_equal(y.float().numpy(), ref.reshape(3, 2, 12, 14).astype(np.float32))
    assert tuple(nbx.pixel_shuffle(nbx.zeros((0, 8, 6, 7), device=device), 2).shape) == \
        (0, 2, 12, 14)


# ------------------------------------------------------------------ unfold / fold
def ref_unfold(x, k, d, p, s):
    N, C, H, W = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    oh = (H + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (W + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    y = np.zeros((N, C * k[0] * k[1], oh * ow))
    for c, i, j, bi, bj in itertools.product(range(C), range(k[0]), range(k[1]), range(oh),
                                             range(ow)):
        y[:, (c * k[0] + i) * k[1] + j, bi * ow + bj] = xp[:, c, bi * s[0] + i * d[0],
                                                          bj * s[1] + j * d[1]]
    return y


def ref_fold(cols, size, k, d, p, s):
    N, CK, L = cols.shape
    C = CK // (k[0] * k[1])
    H, W = size
    oh = (H + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (W + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    y = np.zeros((N, C, H + 2 * p[0], W + 2 * p[1]))
    for c, i, j, bi, bj in itertools.product(range(C), range(k[0]), range(k[1]), range(oh),
                                             range(ow)):
        y[:, c, bi * s[0] + i * d[0], bj * s[1] + j * d[1]] += cols[:, (c * k[0] + i) * k[1] + j,
                                                                  bi * ow + bj]
    return y[:, :, p[0]:p[0] + H, p[1]:p[1] + W]


@pytest.mark.parametrize("k,d,p,s", [((3, 3), (1, 1), (1, 1), (1, 1)), ((2, 3), (2, 1), (1, 0), (2, 3)),
                                     ((3, 2), (1, 2), (0, 2), (1, 2))])
def test_unfold_fold(device, k, d, p, s):
    gen = rng()
    a = gen.standard_normal((2, 3, 9, 11))
    for layout in ("contiguous", "channels_last"):
        u = F.unfold(_tensor(a, nbx.float32, device, layout), k, d, p, s)
        ref = ref_unfold(a.astype(np.float32).astype(np.float64), k, d, p, s)
        np.testing.assert_array_equal(u.numpy(), ref.astype(np.float32))
    cols = gen.standard_normal(ref.shape)
    for dtype in (nbx.float32, nbx.bfloat16):
        y = F.fold(_tensor(cols, dtype, device), (9, 11), k, d, p, s)
        assert y.dtype is dtype and tuple(y.shape) == (2, 3, 9, 11)
        assert_close(y, ref_fold(cols.astype(dtype.np).astype(np.float64), (9, 11), k, d, p, s),
                     **_tol(dtype, 4))
    # unbatched forms
    assert tuple(F.unfold(_tensor(a[0], nbx.float32, device), k, d, p, s).shape) == ref.shape[1:]
    assert tuple(F.fold(_tensor(cols[0], nbx.float32, device), (9, 11), k, d, p, s).shape) == (3, 9, 11)


# ------------------------------------------------------------------ refusals
def test_refusals():
    x = nbx.tensor(rng().standard_normal((1, 2, 5, 5)).astype(np.float32))
    with pytest.raises(ValueError, match="mode must be one of"):
        F.interpolate(x, size=3, mode="cubic")
    with pytest.raises(ValueError, match="exactly one of size and scale_factor"):
        F.interpolate(x, size=3, scale_factor=2.0)
    with pytest.raises(ValueError, match="exactly one of size and scale_factor"):
        F.interpolate(x)
    with pytest.raises(ValueError, match="align_corners can only be set"):
        F.interpolate(x, size=3, mode="nearest", align_corners=True)
    with pytest.raises(ValueError, match="antialias"):
        F.interpolate(x, size=3, mode="nearest", antialias=True)
    with pytest.raises(ValueError, match="needs a 3-D input"):
        F.interpolate(x, size=3, mode="linear")
    with pytest.raises(ValueError, match="recompute_scale_factor"):
        F.interpolate(x, size=3, recompute_scale_factor=True)
    with pytest.raises(ValueError, match="positive"):
        F.interpolate(x, scale_factor=0.1)          # (mode 'area' pools to an empty output)
    with pytest.raises(TypeError, match="float16"):
        F.interpolate(nbx.ones((1, 1, 4, 4), dtype=nbx.int64), size=2)
    g = nbx.zeros((1, 3, 3, 2))
    with pytest.raises(ValueError, match="mode must be"):
        F.grid_sample(x, g, mode="area")
    with pytest.raises(ValueError, match="padding_mode"):
        F.grid_sample(x, g, padding_mode="circular")
    with pytest.raises(TypeError, match="same dtype"):
        F.grid_sample(x, g.to(nbx.float16))
    with pytest.raises(ValueError, match="grid must have shape"):
        F.grid_sample(x, nbx.zeros((1, 3, 3, 3)))
    with pytest.raises(ValueError, match="bicubic"):
        F.grid_sample(nbx.zeros((1, 1, 2, 2, 2)), nbx.zeros((1, 2, 2, 2, 3)), mode="bicubic")
    with pytest.raises(ValueError, match="theta must have shape"):
        F.affine_grid(nbx.zeros((1, 2, 2)), (1, 1, 4, 4))
    with pytest.raises(ValueError, match="divisible"):
        F.pixel_shuffle(nbx.zeros((1, 7, 2, 2)), 2)
    with pytest.raises(ValueError, match="divisible"):
        F.pixel_unshuffle(nbx.zeros((1, 1, 5, 4)), 2)
    with pytest.raises(ValueError, match="no sliding blocks"):
        F.unfold(x, 7)
    with pytest.raises(ValueError, match="dimension 2"):
        F.fold(nbx.zeros((1, 8, 5)), (4, 4), 2)
    with pytest.raises(ValueError, match="divisible"):
        F.fold(nbx.zeros((1, 7, 9)), (4, 4), 2)


def test_names():
    import inspect
    assert nbx.pixel_shuffle is F.pixel_shuffle and nbx.pixel_unshuffle is F.pixel_unshuffle
    assert list(inspect.signature(F.interpolate).parameters) == [
        "input", "size", "scale_factor", "mode", "align_corners", "recompute_scale_factor",
        "antialias"]
    assert list(inspect.signature(F.grid_sample).parameters) == [
        "input", "grid", "mode", "padding_mode", "align_corners"]
    assert list(inspect.signature(F.fold).parameters) == [
        "input", "output_size", "kernel_size", "dilation", "padding", "stride"]


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    """The pooling and resampling kernels compile for sm_90 (no GPU needed: Triton's CUDA
    backend and ptxas run on the host) for each dtype and variant."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from nbxtensor.kernels.pooling import _pool_kernel
    from nbxtensor.kernels.resample import _grid_sample_kernel, _resample_kernel

    def compile_(kernel, ptrs, constexprs, ones=False):
        names = kernel.arg_names
        if ones:    # every int argument 1: the launcher passes a 1 as a constexpr
            constexprs = dict(constexprs, **{n: 1 for n in names
                                             if n not in ptrs and n not in constexprs})
        sig = {n: "constexpr" if n in constexprs else ptrs.get(n, "i32") for n in names}
        src = ASTSource(fn=kernel, signature=sig,
                        constexprs={(names.index(k),): v for k, v in constexprs.items()})
        return triton.compile(src, target=GPUTarget("cuda", 90, 64), options=dict(num_warps=4))

    for ty in ("fp16", "bf16", "fp32"):
        for is_max, adaptive, cl, big in ((True, False, False, False), (False, True, True, False),
                                          (False, False, True, False), (True, False, True, True)):
            k = compile_(_pool_kernel, {"x_ptr": f"*{ty}", "o_ptr": f"*{ty}", "i_ptr": "*i64"},
                         dict(IS_MAX=is_max, ADAPTIVE=adaptive, COUNT_PAD=True, HAS_DIV=False,
                              CL=cl, IDX=is_max, F64=False, BIG=big, BLOCK_R=16, BLOCK_Q=64))
            assert "ld.global" in k.asm["ptx"] and k.metadata.shared == 0
        for cl in (True, False):
            k = compile_(_resample_kernel, {"x_ptr": f"*{ty}", "o_ptr": f"*{ty}",
                                            "td_ptr": "*i32", "wd_ptr": "*fp32",
                                            "th_ptr": "*i32", "wh_ptr": "*fp32",
                                            "tw_ptr": "*i32", "ww_ptr": "*fp32"},
                         dict(CL=cl, F64=False, BIG=False, BLOCK_R=8, BLOCK_Q=128))
            assert "st.global" in k.asm["ptx"]
        for mode, three_d, ones in ((0, True, False), (1, True, False), (2, False, False),
                                    (2, False, True), (0, True, True)):
            k = compile_(_grid_sample_kernel, {"x_ptr": f"*{ty}", "g_ptr": f"*{ty}",
                                               "o_ptr": f"*{ty}"},
                         dict(MODE=mode, PAD=2, ALIGN=False, THREE_D=three_d, CL=False,
                              F64=False, BIG=False, BLOCK=256), ones)
            assert "st.global" in k.asm["ptx"]
    k = compile_(_pool_kernel, {"x_ptr": "*bf16", "o_ptr": "*bf16", "i_ptr": "*i64"},
                 dict(IS_MAX=True, ADAPTIVE=True, COUNT_PAD=True, HAS_DIV=False, CL=False,
                      IDX=True, F64=False, BIG=False, BLOCK_R=16, BLOCK_Q=64), True)
    k = compile_(_pool_kernel, {"x_ptr": "*bf16", "o_ptr": "*bf16", "i_ptr": "*i64"},
                 dict(IS_MAX=False, ADAPTIVE=False, COUNT_PAD=False, HAS_DIV=False, CL=False,
                      IDX=False, F64=False, BIG=False, BLOCK_R=16, BLOCK_Q=64), True)
    k = compile_(_resample_kernel, {"x_ptr": "*bf16", "o_ptr": "*bf16", "td_ptr": "*i32",
                                    "wd_ptr": "*fp32", "th_ptr": "*i32", "wh_ptr": "*fp32",
                                    "tw_ptr": "*i32", "ww_ptr": "*fp32"},
                 dict(CL=False, F64=False, BIG=False, BLOCK_R=16, BLOCK_Q=64), True)
