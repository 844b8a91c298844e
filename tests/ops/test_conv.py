"""Convolutions (ops/conv.py) against independent float64 NumPy references.

The forward reference is an einsum over sliding windows (numpy's sliding_window_view); the
transposed one is a forward convolution of the stride-dilated, re-padded input with the
flipped, channel-swapped kernel -- neither shares code or formulation with the backends.
Tolerances scale with |x| * |w| summed over each output's window (the error bound of a sum
of products), times the dtype's rounding.
"""
from __future__ import annotations


import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import nbxtensor as nbx
from helpers import rng

F = nbx.nn.functional
TOL = {nbx.float64: 1e-12, nbx.float32: 1e-5, nbx.float16: 2e-3, nbx.bfloat16: 8e-3}


pytestmark = pytest.mark.usefixtures("poison_outputs")


def small_tiles(monkeypatch, device):
    """16x16x16 implicit-GEMM tiles (8-channel depthwise ones), so that C_out = 17 and
    C_in/g = 17 overhang them (the shape rule's own tiles cover small problems whole)."""
    if device == "cpu":
        return
    import nbxtensor.kernels.conv as kc
    monkeypatch.setattr(kc, "_OVERRIDE", dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16,
                                              BLOCK_C=8, num_warps=4))


def q(a, dtype):
    return np.asarray(a).astype(dtype.np).astype(np.float64)


def T(a, dtype, device):
    return nbx.tensor(np.asarray(a).astype(dtype.np), device=device)


# ------------------------------------------------------------------ references
def ref_conv(x, w, b, stride, lo, hi, dil, groups):
    nd = x.ndim - 2
    x = np.pad(x, [(0, 0), (0, 0)] + list(zip(lo, hi)))
    ks = w.shape[2:]
    win = sliding_window_view(x, [d * (k - 1) + 1 for d, k in zip(dil, ks)],
                              axis=tuple(range(2, 2 + nd)))
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)
              + tuple(slice(None, None, d) for d in dil)]
    n, c = x.shape[:2]
    co = w.shape[0]
    osz, G = win.shape[2:2 + nd], groups
    win = win.reshape((n, G, c // G) + win.shape[2:])
    wg = w.reshape((G, co // G, c // G) + ks)
    o_, k_ = "pqr"[:nd], "xyz"[:nd]
    out = np.einsum(f"ngc{o_}{k_},goc{k_}->ngo{o_}", win, wg).reshape((n, co) + osz)
    if b is not None:
        out = out + b.reshape((1, co) + (1,) * nd)
    return out


def _pad_or_crop(x, lo, hi):
    for ax, (a, b) in enumerate(zip(lo, hi), start=2):
        width = [(0, 0)] * x.ndim
        width[ax] = (max(a, 0), max(b, 0))
        x = np.pad(x, width)
        sl = [slice(None)] * x.ndim
        sl[ax] = slice(max(-a, 0), x.shape[ax] - max(-b, 0))
        x = x[tuple(sl)]
    return x


def ref_conv_transpose(x, w, b, stride, pad, out_pad, groups, dil):
    nd = x.ndim - 2
    n, c = x.shape[:2]
    ks, G = w.shape[2:], groups
    og = w.shape[1]
    xd = np.zeros((n, c) + tuple((i - 1) * s + 1 for i, s in zip(x.shape[2:], stride)))
    xd[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)] = x
    lo = [d * (k - 1) - p for d, k, p in zip(dil, ks, pad)]
    xd = _pad_or_crop(xd, lo, [a + q for a, q in zip(lo, out_pad)])
    wf = w[(slice(None), slice(None)) + (slice(None, None, -1),) * nd]
    wc = wf.reshape((G, c // G, og) + ks).swapaxes(1, 2).reshape((G * og, c // G) + ks)
    return ref_conv(xd, wc, b, (1,) * nd, (0,) * nd, (0,) * nd, dil, G)


def ref_abs(fn, x, w, b, *args):
    """The conv of |x| and |w| plus |b|: the scale of each output's rounding error."""
    return fn(np.abs(x), np.abs(w), None if b is None else np.abs(b), *args)


def check(out, ref, scale, dtype):
    got = out.numpy().astype(np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = np.abs(got - ref)
    bound = TOL[dtype] * (scale + 1e-3)
    bad = ~(err <= bound)            # NaN (an unwritten output) counts as bad
    assert not bad.any(), (f"{bad.sum()} of {bad.size} wrong; worst at "
                           f"{np.unravel_index(np.nanargmax(err - bound), err.shape)}: "
                           f"max err {np.nanmax(err)}")


def run_conv(device, dtype, shape, wshape, bias=True, stride=1, padding=0, dilation=1, groups=1,
             padding_mode="zeros", layout="contiguous", gen=None):
    gen = gen or rng()
    nd = len(wshape) - 2
    x = q(gen.standard_normal(shape), dtype)
    w = q(gen.standard_normal(wshape), dtype)
    b = q(gen.standard_normal(wshape[0]), dtype) if bias else None
    xt = _layout(x, dtype, device, layout)
    out = getattr(F, f"conv{nd}d")(xt, T(w, dtype, device), T(b, dtype, device) if bias else None,
                                   stride, padding, dilation, groups, padding_mode=padding_mode)
    st, di = _tup(stride, nd), _tup(dilation, nd)
    if padding == "same":
        tot = [d * (k - 1) for d, k in zip(di, wshape[2:])]
        lo, hi = [t // 2 for t in tot], [t - t // 2 for t in tot]
    elif padding == "valid":
        lo = hi = [0] * nd
    else:
        lo = hi = list(_tup(padding, nd))
    batched = len(shape) == nd + 2
    xr = x if batched else x[None]
    if padding_mode != "zeros":
        mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[padding_mode]
        xr = np.pad(xr, [(0, 0), (0, 0)] + list(zip(lo, hi)), mode=mode)
        lo = hi = [0] * nd
    args = (st, lo, hi, di, groups)
    ref, scale = ref_conv(xr, w, b, *args), ref_abs(ref_conv, xr, w, b, *args)
    if not batched:
        ref, scale = ref[0], scale[0]
    check(out, ref, scale, dtype)
    return out


def _tup(v, nd):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd


def _layout(x, dtype, device, layout):
    """x as a tensor stored contiguous, channels-last, or as a strided (stepped) view."""
    if layout == "contiguous":
        return T(x, dtype, device)
    if layout == "channels_last":
        perm = (0,) + tuple(range(2, x.ndim)) + (1,)
        t = T(np.ascontiguousarray(x.transpose(perm)), dtype, device)
        return t.permute(tuple(int(i) for i in np.argsort(perm)))
    if layout == "strided":      # every other channel and every other element of the last dim
        big = np.zeros((x.shape[0], 2 * x.shape[1]) + x.shape[2:-1] + (2 * x.shape[-1],))
        big[:, ::2, ..., ::2] = x
        return T(big, dtype, device)[:, ::2, ..., ::2]
    raise AssertionError(layout)


# ------------------------------------------------------------------ forward convolutions
# (input shape, weight shape, keyword arguments): odd sizes; with the small_tiles fixture
# C_out = 17 and C_in/g = 17 overhang the 16-wide tiles, 5x7 = 35 pixels the 16-row one
CASES_2D = {
    "basic": ((2, 5, 9, 7), (6, 5, 3, 3), dict(padding=1)),
    "overhang": ((1, 17, 5, 7), (17, 17, 3, 3), dict(padding=1)),
    "stride2": ((2, 4, 11, 10), (5, 4, 3, 3), dict(stride=2, padding=1)),
    "rect_stride_pad_dil": ((1, 3, 13, 12), (4, 3, 3, 2), dict(stride=(2, 1), padding=(2, 0),
                                                                 dilation=(1, 3))),
    "groups2": ((2, 6, 9, 8), (8, 3, 3, 3), dict(padding=1, groups=2)),
    "depthwise": ((2, 10, 9, 11), (10, 1, 3, 3), dict(padding=1, groups=10)),
    "depthwise_mult2_stride2": ((1, 5, 12, 9), (10, 1, 5, 3), dict(stride=2, padding=2,
                                                                      groups=5)),
    "1x1": ((2, 19, 7, 5), (17, 19, 1, 1), dict()),
    "same_even_dilated": ((1, 4, 10, 9), (3, 4, 4, 2), dict(padding="same", dilation=(2, 3))),
    "valid_nobias": ((1, 3, 8, 9), (5, 3, 3, 4), dict(padding="valid", bias=False)),
}
FAST = ("basic", "overhang", "stride2", "groups2", "depthwise", "same_even_dilated")


@pytest.mark.parametrize("name", list(CASES_2D))
def test_conv2d_float32(device, monkeypatch, name):
    if name in ("overhang", "depthwise"):
        small_tiles(monkeypatch, device)
    shape, wshape, kw = CASES_2D[name]
    run_conv(device, nbx.float32, shape, wshape, **kw)


@pytest.mark.parametrize("dtype", [nbx.float16, nbx.bfloat16, nbx.float64])
@pytest.mark.parametrize("name", FAST)
def test_conv2d_dtypes(device, monkeypatch, name, dtype):
    if name in ("overhang", "depthwise"):
        small_tiles(monkeypatch, device)
    if device != "cpu" and name not in ("overhang", "depthwise") and dtype is not nbx.bfloat16:
        pytest.skip("interp/cuda: every dtype on two cases, bf16 on all (interp is slow)")
    shape, wshape, kw = CASES_2D[name]
    run_conv(device, dtype, shape, wshape, **kw)


def test_conv2d_default_tiles(device):
    # the shape rule's own tiles (BLOCK_N = 32 for 20 channels, BLOCK_K = 32 for 24)
    run_conv(device, nbx.bfloat16, (1, 24, 13, 11), (20, 24, 3, 3), padding=1)
    run_conv(device, nbx.float32, (1, 24, 13, 11), (24, 1, 3, 3), padding=1, groups=24)


@pytest.mark.parametrize("layout", ["channels_last", "strided"])
@pytest.mark.parametrize("name", ["basic", "depthwise", "groups2"])
def test_conv2d_layouts(device, name, layout):
    shape, wshape, kw = CASES_2D[name]
    out = run_conv(device, nbx.float32, shape, wshape, layout=layout, **kw)
    if layout == "channels_last":      # as torch: a channels-last input gives a channels-last output
        assert out.stride(1) == 1 and out.permute(0, 2, 3, 1).is_contiguous()
    else:
        assert out.is_contiguous()


@pytest.mark.parametrize("chunk", [1, 3 * 108, 40 * 108])
def test_cpu_conv_in_small_chunks(monkeypatch, chunk):
    # the cpu im2col in blocks of single pixels, of part rows and of several rows (a
    # pixel's columns are 108 bytes in the first problem)
    import nbxtensor.backends.cpu.conv as cc
    monkeypatch.setattr(cc, "_CHUNK_BYTES", chunk)
    run_conv("cpu", nbx.float32, (2, 3, 9, 11), (4, 3, 3, 3), padding=1)
    run_conv("cpu", nbx.float32, (1, 4, 2, 5, 7), (6, 2, 2, 3, 3), padding=(0, 1, 2), groups=2)


def test_conv2d_strided_weight_and_bias(device):
    gen = rng()
    x, w, b = gen.standard_normal((2, 6, 9, 8)), gen.standard_normal((7, 6, 3, 3)), \
        gen.standard_normal(14)
    # weight stored as (kh, kw, C_in, C_out) and permuted back; bias every other element
    wt = T(np.ascontiguousarray(w.transpose(2, 3, 1, 0)), nbx.float32, device).permute(3, 2, 0, 1)
    bt = T(b, nbx.float32, device)[::2]
    out = F.conv2d(T(x, nbx.float32, device), wt, bt, padding=(1, 0))
    args = ((1, 1), (1, 0), (1, 0), (1, 1), 1)
    check(out, ref_conv(q(x, nbx.float32), q(w, nbx.float32), q(b[::2], nbx.float32), *args),
          ref_abs(ref_conv, x, w, b[::2], *args), nbx.float32)


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("nd", [1, 2])
def test_padding_modes(device, mode, nd):
    if nd == 1:
        run_conv(device, nbx.float32, (2, 3, 17), (4, 3, 5), padding=2, padding_mode=mode)
        run_conv(device, nbx.float32, (1, 3, 10), (4, 3, 4), padding="same", dilation=2,
                 padding_mode=mode)
    else:
        run_conv(device, nbx.float32, (1, 3, 9, 8), (5, 3, 3, 3), padding=(1, 2), stride=2,
                 padding_mode=mode)
        run_conv(device, nbx.float32, (1, 4, 7, 8), (4, 1, 2, 3), padding="same", groups=4,
                 padding_mode=mode, layout="channels_last")


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16])
def test_conv1d(device, monkeypatch, dtype):
    small_tiles(monkeypatch, device)
    run_conv(device, dtype, (2, 17, 33), (17, 17, 3), padding=1)
    run_conv(device, dtype, (3, 8, 20), (6, 4, 4), stride=2, dilation=3, groups=2, bias=False)
    run_conv(device, dtype, (6, 21), (6, 1, 5), padding="same", groups=6)     # unbatched


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.float16])
def test_conv3d(device, dtype):
    run_conv(device, dtype, (1, 3, 4, 6, 5), (17, 3, 3, 2, 3), padding=(1, 0, 1),
             stride=(1, 2, 1))
    run_conv(device, dtype, (2, 4, 3, 5, 4), (4, 1, 3, 3, 3), padding="same", groups=4,
             layout="channels_last")
    run_conv(device, dtype, (4, 6, 5, 5), (2, 2, 2, 1, 2), dilation=(2, 1, 1), groups=2)  # unbatched


def test_conv2d_unbatched(device):
    out = run_conv(device, nbx.float32, (3, 9, 10), (5, 3, 3, 3), padding=1)
    assert out.shape == (5, 9, 10)


def test_conv_nan_propagates_locally(device):
    # a NaN in the input reaches exactly the outputs whose window covers it
    x = rng().standard_normal((1, 2, 9, 9))
    x[0, 1, 4, 6] = np.nan
    w = rng().standard_normal((3, 2, 3, 3))
    out = F.conv2d(T(x, nbx.float32, device), T(w, nbx.float32, device), padding=1).numpy()
    expect = np.zeros((9, 9), bool)
    expect[3:6, 5:8] = True
    for c in range(3):
        np.testing.assert_array_equal(np.isnan(out[0, c]), expect)


# ------------------------------------------------------------------ transposed convolutions
def run_conv_transpose(device, dtype, shape, wshape, bias=True, stride=1, padding=0,
                       output_padding=0, groups=1, dilation=1, layout="contiguous"):
    gen = rng()
    nd = len(wshape) - 2
    x = q(gen.standard_normal(shape), dtype)
    w = q(gen.standard_normal(wshape), dtype)
    c_out = wshape[1] * groups
    b = q(gen.standard_normal(c_out), dtype) if bias else None
    out = getattr(F, f"conv_transpose{nd}d")(
        _layout(x, dtype, device, layout), T(w, dtype, device),
        T(b, dtype, device) if bias else None, stride, padding, output_padding, groups, dilation)
    batched = len(shape) == nd + 2
    xr = x if batched else x[None]
    args = (_tup(stride, nd), _tup(padding, nd), _tup(output_padding, nd), groups,
            _tup(dilation, nd))
    ref = ref_conv_transpose(xr, w, b, *args)
    scale = ref_abs(ref_conv_transpose, xr, w, b, *args)
    if not batched:
        ref, scale = ref[0], scale[0]
    check(out, ref, scale, dtype)
    return out


TCASES = {
    "basic": ((2, 5, 7, 6), (5, 6, 3, 3), dict(padding=1)),
    "stride2_outpad": ((1, 17, 6, 5), (17, 17, 3, 3), dict(stride=2, padding=1,
                                                            output_padding=1)),
    "groups_dilation": ((2, 6, 5, 7), (6, 2, 3, 2), dict(stride=(1, 2), padding=(2, 0),
                                                          dilation=(2, 1), groups=3,
                                                          output_padding=(1, 1))),
    "upsample_k4_s2": ((1, 4, 5, 5), (4, 3, 4, 4), dict(stride=2, padding=1, bias=False)),
    "depthwise": ((1, 4, 6, 5), (4, 1, 3, 3), dict(stride=2, groups=4)),
}


@pytest.mark.parametrize("name", list(TCASES))
def test_conv_transpose2d(device, monkeypatch, name):
    if name == "stride2_outpad":
        small_tiles(monkeypatch, device)
    shape, wshape, kw = TCASES[name]
    run_conv_transpose(device, nbx.float32, shape, wshape, **kw)


@pytest.mark.parametrize("dtype", [nbx.bfloat16, nbx.float16, nbx.float64])
def test_conv_transpose_dtypes(device, dtype):
    shape, wshape, kw = TCASES["stride2_outpad"]
    run_conv_transpose(device, dtype, shape, wshape, **kw)


def test_conv_transpose_1d_3d_layouts(device):
    run_conv_transpose(device, nbx.float32, (2, 3, 11), (3, 5, 4), stride=3, padding=2,
                       output_padding=2, dilation=1)
    run_conv_transpose(device, nbx.float32, (3, 9), (3, 2, 3), stride=2, groups=3)  # unbatched
    run_conv_transpose(device, nbx.float32, (1, 4, 3, 4, 3), (4, 2, 2, 3, 2), stride=(2, 1, 2),
                       padding=(0, 1, 1), groups=2, layout="channels_last")
    run_conv_transpose(device, nbx.float32, (2, 5, 6, 7), (5, 4, 3, 3), stride=2,
                       layout="strided")


# ------------------------------------------------------------------ refusals
def test_refusals():
    x = nbx.tensor(rng().standard_normal((1, 4, 8, 8)).astype(np.float32))
    w = nbx.tensor(rng().standard_normal((6, 4, 3, 3)).astype(np.float32))
    cases = [
        (lambda: F.conv2d(x, w[:, :3]), ValueError, "expected input with 3 channels"),
        (lambda: F.conv2d(x, w[:5, :2], groups=2), ValueError, "groups=2 must divide"),
        (lambda: F.conv2d(x, w, groups=3), ValueError, "expected input with 12 channels"),
        (lambda: F.conv2d(x, w[0]), ValueError, "weight must be 4-D"),
        (lambda: F.conv2d(x[0, 0], w), ValueError, "3-D (unbatched) or 4-D (batched) input"),
        (lambda: F.conv2d(x, w, padding="same", stride=2), ValueError,
         "padding='same' is not supported for strided"),
        (lambda: F.conv2d(x, w, padding="full"), ValueError, "'same', 'valid'"),
        (lambda: F.conv2d(x, w, padding=-1), ValueError, "padding must be non-negative"),
        (lambda: F.conv2d(x, w, stride=0), ValueError, "stride must be positive"),
        (lambda: F.conv2d(x, w, dilation=(1, 2, 3)), TypeError, "tuple of 2 ints"),
        (lambda: F.conv2d(x, w, groups=0), ValueError, "groups must be positive"),
        (lambda: F.conv2d(x, w.to(nbx.float16)), TypeError, "must have the same dtype"),
        (lambda: F.conv2d(x, w, nbx.zeros(6, dtype=nbx.float64)), TypeError,
         "bias (float64) must have the same dtype"),
        (lambda: F.conv2d(x, w, nbx.zeros(5)), ValueError, "bias must have shape (6,)"),
        (lambda: F.conv2d(x.to(nbx.int32), w.to(nbx.int32)), TypeError, "float16, bfloat16"),
        (lambda: F.conv2d(x[..., :2, :2], w), ValueError, "smaller than the dilated kernel"),
        (lambda: F.conv2d(x, w, padding_mode="mirror"), ValueError, "padding_mode must be"),
        (lambda: F.conv2d(x, w, padding=8, padding_mode="reflect"), ValueError, "reflect"),
        (lambda: F.conv2d(x.numpy(), w), TypeError, "input must be a Tensor"),
        (lambda: F.conv_transpose2d(x, w[:, :2], output_padding=1), ValueError,
         "output_padding"),
        (lambda: F.conv_transpose2d(x, w[:3]), ValueError, "expected input with 3 channels"),
        (lambda: F.conv_transpose2d(x, w[:4], groups=3), ValueError, "groups=3 must divide"),
        (lambda: F.conv_transpose2d(x, w[:4], padding="same"), ValueError, "string padding"),
        (lambda: F.conv_transpose2d(x, w[:4], nbx.zeros(6)), ValueError,
         "bias must have shape (4,)"),
        (lambda: F.conv_transpose2d(x[..., :1, :1], w[:4], padding=2), ValueError,
         "too small"),
    ]
    for fn, exc, msg in cases:
        with pytest.raises(exc) as ei:
            fn()
            pytest.fail(f"no {exc.__name__} for the case {msg!r}")
        assert msg in str(ei.value), (msg, str(ei.value))


def test_device_mismatch_refused():
    if "interp" not in __import__("conftest").DEVICES:
        pytest.skip("needs a second device")
    x = nbx.zeros((1, 2, 4, 4))
    w = nbx.zeros((2, 2, 3, 3), device="interp")
    with pytest.raises(ValueError, match="weight is on interp"):
        F.conv2d(x, w)


def test_names_and_argument_order():
    import inspect
    assert nbx.conv2d is F.conv2d and nbx.conv_transpose3d is F.conv_transpose3d
    assert list(inspect.signature(F.conv2d).parameters) == [
        "input", "weight", "bias", "stride", "padding", "dilation", "groups", "padding_mode"]
    assert list(inspect.signature(F.conv_transpose1d).parameters) == [
        "input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation"]


# ------------------------------------------------------------------ sm_90 compile check
def _compile_sm90(kernel, constexprs, options):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = kernel.arg_names
    sig = {n: ("constexpr" if n in constexprs else "*bf16" if n.endswith("_ptr") else "i32")
           for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n.endswith("_ptr")}
    src = ASTSource(fn=kernel, signature=sig, attrs=attrs,
                    constexprs={(names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 64), options=options)


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    """The largest tiles the config rule picks compile for sm_90 inside 227 KB of shared
    memory, and the 16-bit implicit GEMM uses tensor cores. Needs triton's CUDA backend."""
    pytest.importorskip("triton")
    from nbxtensor.kernels.conv import _conv_kernel, _depthwise_kernel, conv_config, \
        depthwise_config
    for M, CG, OG, transposed in ((1 << 20, 512, 512, False), (100, 3, 64, False),
                                  (1 << 20, 256, 128, True)):
        cfg = conv_config(M, CG, OG, 2)
        ce = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                  TRANSPOSED=transposed, HAS_BIAS=True, F64=False, PRECISION="ieee", ACT=0)
        k = _compile_sm90(_conv_kernel, ce, dict(num_warps=cfg["num_warps"],
                                                 num_stages=cfg["num_stages"]))
        assert k.metadata.shared <= 227 * 1024, (cfg, k.metadata.shared)
        assert "mma" in k.asm["ptx"], cfg
    cfg = depthwise_config(512)
    k = _compile_sm90(_depthwise_kernel, dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_C=cfg["BLOCK_C"],
                                              HAS_BIAS=True, F64=False, ACT=4),
                      dict(num_warps=cfg["num_warps"]))
    assert k.metadata.shared <= 227 * 1024
    # the TMA kernel at the rule's tiles for a large image (one-row and taller boxes, both
    # stores) and for a small one (split-K): inside shared memory, on wgmma
    from nbxtensor.kernels._common import INTERP
    from nbxtensor.kernels.conv import _conv_tma_kernel, tma_config
    for n, oh, ow, c, co, nchw in ((1, 736, 1280, 64, 64, True), (1, 64, 64, 512, 512, False),
                                   (2, 16, 16, 1280, 1280, False)):
        cfg = tma_config(n, oh, ow, c, co, 9, INTERP)
        ce = dict(BLOCK_M=cfg["BH"] * cfg["BW"], BH=cfg["BH"], BW=cfg["BW"],
                  BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], SPLIT=cfg["SPLIT"],
                  OUT_NCHW=nchw, HAS_BIAS=True, ACT=4)
        k = _compile_sm90(_conv_tma_kernel, ce, dict(num_warps=cfg["num_warps"],
                                                     num_stages=cfg["num_stages"]))
        assert k.metadata.shared <= 227 * 1024, (cfg, k.metadata.shared)
        assert "wgmma" in k.asm["ptx"], cfg


# ------------------------------------------------------------------ modules
def test_conv_modules_parameters_and_forward(device):
    nn = nbx.nn
    m = nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=1, groups=2, padding_mode="circular",
                  device=device)
    assert isinstance(m, nn.Module) and isinstance(m.weight, nn.Parameter)
    assert [(n, tuple(p.shape)) for n, p in m.named_parameters()] == [
        ("weight", (6, 2, 3, 2)), ("bias", (6,))]
    assert list(m.state_dict()) == ["weight", "bias"]
    assert repr(m) == ("Conv2d(4, 6, kernel_size=(3, 2), stride=(2, 1), padding=(1, 1), "
                       "groups=2, padding_mode=circular)")
    w, b = m.weight.numpy().astype(np.float64), m.bias.numpy().astype(np.float64)
    bound = 1 / np.sqrt(2 * 3 * 2)              # torch's init: fan_in = C_in/g * kH * kW
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound and np.abs(w).max() > 0
    x = rng().standard_normal((2, 4, 7, 5))
    out = m(T(x, nbx.float32, device))
    xp = np.pad(q(x, nbx.float32), [(0, 0), (0, 0), (1, 1), (1, 1)], mode="wrap")
    args = ((2, 1), (0, 0), (0, 0), (1, 1), 2)
    check(out, ref_conv(xp, w, b, *args), ref_abs(ref_conv, xp, w, b, *args), nbx.float32)

    m1 = nn.Conv1d(3, 5, 4, padding="same", dilation=2, bias=False, padding_mode="reflect")
    assert m1.bias is None and list(m1.state_dict()) == ["weight"]
    assert m1(nbx.zeros((2, 3, 11))).shape == (2, 5, 11)
    m3 = nn.Conv3d(2, 4, 3, padding="valid", dtype=nbx.float64)
    assert m3.weight.dtype is nbx.float64 and m3(nbx.zeros((2, 5, 6, 7), dtype=nbx.float64)).shape == (4, 3, 4, 5)


def test_conv_transpose_modules(device):
    nn = nbx.nn
    m = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, groups=2, device=device)
    assert [(n, tuple(p.shape)) for n, p in m.named_parameters()] == [
        ("weight", (4, 3, 3, 3)), ("bias", (6,))]
    assert repr(m) == "ConvTranspose2d(4, 6, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), groups=2)"
    x = rng().standard_normal((1, 4, 5, 4))
    xt = T(x, nbx.float32, device)
    assert m(xt).shape == (1, 6, 9, 7)
    out = m(xt, output_size=(10, 8))             # output_padding (1, 1), as torch derives it
    w, b = m.weight.numpy().astype(np.float64), m.bias.numpy().astype(np.float64)
    args = ((2, 2), (1, 1), (1, 1), 2, (1, 1))
    xr = q(x, nbx.float32)
    check(out, ref_conv_transpose(xr, w, b, *args), ref_abs(ref_conv_transpose, xr, w, b, *args),
          nbx.float32)
    assert m(xt, output_size=[1, 6, 9, 8]).shape == (1, 6, 9, 8)
    with pytest.raises(ValueError, match="valid sizes range from 9 to 10"):
        m(xt, output_size=(11, 8))
    assert nn.ConvTranspose1d(2, 3, 2, bias=False)(nbx.zeros((2, 5))).shape == (3, 6)
    assert nn.ConvTranspose3d(2, 2, 2, stride=2)(nbx.zeros((1, 2, 2, 2, 2))).shape == (1, 2, 4, 4, 4)


def test_conv_module_refusals():
    nn = nbx.nn
    for kw, msg in [(dict(groups=0), "groups must be a positive integer"),
                    (dict(groups=4), "in_channels must be divisible by groups"),
                    (dict(padding="full"), "Invalid padding"),
                    (dict(padding="same", stride=2), "not supported for strided"),
                    (dict(padding_mode="mirror"), "padding_mode must be one of")]:
        with pytest.raises(ValueError, match=msg):
            nn.Conv2d(6, 4, 3, **kw)
    with pytest.raises(ValueError, match="out_channels must be divisible by groups"):
        nn.Conv2d(4, 6, 3, groups=4)
    with pytest.raises(ValueError, match='Only "zeros" padding mode is supported for ConvTranspose2d'):
        nn.ConvTranspose2d(4, 4, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="expected input with 6 channels"):
        nn.Conv2d(6, 4, 3)(nbx.zeros((1, 5, 8, 8)))


# ------------------------------------------------------------------ routes: TMA conv, 1x1 GEMM
def _route_spy(monkeypatch):
    """Counts the calls of the cuda/interp routes, so a case proves which kernel it ran."""
    import nbxtensor.kernels.conv as kc
    calls = {"tma": 0, "pointwise": 0}

    def spy(name, fn):
        def wrapped(*a, **k):
            r = fn(*a, **k)
            calls[name] += r is not None
            return r
        return wrapped
    monkeypatch.setattr(kc, "_conv_tma", spy("tma", kc._conv_tma))
    monkeypatch.setattr(kc, "_pointwise", spy("pointwise", kc._pointwise))
    return calls


# (input shape, weight shape, layout, keyword arguments): NCHW outputs with OW % 8 == 0 take
# the descriptor store, other widths and channels-last outputs with C_out % 8 != 0 go
# through a channels-last buffer; C_in = 5 needs the channel-padded input copy, a one-tile
# problem with 64 channels the split-K partials and their finishing kernel
TMA_CASES = {
    "nchw_store": ((1, 16, 6, 16), (24, 16, 3, 3), "contiguous", dict(padding=1)),
    "buffered_odd": ((2, 5, 9, 7), (6, 5, 3, 3), "contiguous", dict(padding=1)),
    "nhwc_store": ((2, 16, 7, 9), (16, 16, 3, 3), "channels_last", dict(padding=1)),
    "nhwc_odd_cout": ((1, 16, 5, 9), (12, 16, 3, 3), "channels_last", dict(padding=(0, 2))),
    "strided_input": ((1, 8, 6, 11), (9, 8, 3, 3), "strided", dict(padding=1, bias=False)),
    "same_dilated": ((1, 8, 10, 9), (8, 8, 4, 2), "contiguous",
                     dict(padding="same", dilation=(2, 3))),
    "split_k": ((1, 64, 5, 6), (16, 64, 3, 3), "contiguous", dict(padding=1)),
}
SPLIT_CASES = ("split_k",)     # split 3 ways on interp too


@pytest.mark.parametrize("dtype", [nbx.bfloat16, nbx.float16])
@pytest.mark.parametrize("name", list(TMA_CASES))
def test_conv2d_tma_route(device, monkeypatch, name, dtype):
    if device == "cpu":
        pytest.skip("the TMA kernel is a cuda/interp route")
    if dtype is nbx.float16 and name not in ("buffered_odd", "split_k"):
        pytest.skip("float16 on two cases (interp is slow)")
    calls = _route_spy(monkeypatch)
    if name in SPLIT_CASES and device == "interp":
        import nbxtensor.kernels.conv as kc
        monkeypatch.setattr(kc, "_OVERRIDE", dict(SPLIT=3))
    shape, wshape, layout, kw = TMA_CASES[name]
    out = run_conv(device, dtype, shape, wshape, layout=layout, **kw)
    assert calls["tma"] == 1, calls
    if layout == "channels_last":
        assert out.stride(1) == 1 and out.permute(0, 2, 3, 1).is_contiguous()
    else:
        assert out.is_contiguous()


def test_conv2d_tma_small_tiles_and_split(device, monkeypatch):
    # 16-wide tiles under C_out = 17, C_in = 40 (three channel chunks, the last ragged),
    # and a grid small enough to split the K loop
    if device == "cpu":
        pytest.skip("the TMA kernel is a cuda/interp route")
    import nbxtensor.kernels.conv as kc
    from nbxtensor.kernels._common import device_facts
    calls = _route_spy(monkeypatch)
    small_tiles(monkeypatch, device)
    if device == "interp":    # interp's rule never splits (the interpreter's cost)
        monkeypatch.setattr(kc, "_OVERRIDE", dict(kc._OVERRIDE, SPLIT=4))
    cfg = kc.tma_config(1, 5, 7, 40, 17, 9, device_facts(nbx.device(device)))
    assert cfg["BLOCK_K"] == 16 and cfg["BLOCK_N"] == 16 and cfg["SPLIT"] > 1, cfg
    run_conv(device, nbx.bfloat16, (1, 40, 5, 7), (17, 40, 3, 3), padding=1)
    assert calls["tma"] == 1


def test_conv2d_tma_nan_propagates_locally(device):
    if device == "cpu":
        pytest.skip("the TMA kernel is a cuda/interp route")
    x = rng().standard_normal((1, 8, 9, 16))
    x[0, 1, 4, 6] = np.nan
    w = rng().standard_normal((8, 8, 3, 3))
    out = F.conv2d(T(x, nbx.bfloat16, device), T(w, nbx.bfloat16, device),
                   padding=1).to(nbx.float32).numpy()
    expect = np.zeros((9, 16), bool)
    expect[3:6, 5:8] = True
    for c in range(8):
        np.testing.assert_array_equal(np.isnan(out[0, c]), expect)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided"])
@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16])
def test_conv2d_1x1_as_gemm(device, monkeypatch, layout, dtype):
    # NCHW: W @ x per image (bias as a broadcast residual); channels-last: one GEMM over
    # all pixels; a layout whose pixels are no single run falls to the implicit GEMM (a
    # single pixel is always one run)
    calls = _route_spy(monkeypatch)
    out = run_conv(device, dtype, (2, 19, 7, 5), (17, 19, 1, 1), layout=layout)
    run_conv(device, dtype, (1, 24, 1, 1), (8, 24, 1, 1), layout=layout, bias=False)
    if device != "cpu":
        assert calls["pointwise"] == (1 if layout == "strided" else 2), calls
    if layout == "channels_last":
        assert out.stride(1) == 1


# (input shape, weight shape, dtype, layout, keyword arguments): the TMA kernel, the pointer
# implicit GEMM (fp32, stride 2), depthwise, 1x1 channels-last (the matmul's epilogue) and
# 1x1 NCHW with a bias (which the matmul cannot fuse: another route takes it)
ACT_CASES = {
    "tma": ((1, 16, 5, 16), (8, 16, 3, 3), nbx.bfloat16, "contiguous", dict(padding=1)),
    "pointer": ((2, 5, 9, 7), (6, 5, 3, 3), nbx.float32, "contiguous",
                dict(padding=1, stride=2)),
    "depthwise": ((2, 6, 7, 5), (6, 1, 3, 3), nbx.float32, "contiguous",
                  dict(padding=1, groups=6)),
    "1x1_nhwc": ((2, 9, 5, 4), (7, 9, 1, 1), nbx.float32, "channels_last", {}),
    "1x1_nchw_bias": ((2, 9, 5, 4), (7, 9, 1, 1), nbx.bfloat16, "contiguous", {}),
}


@pytest.mark.parametrize("name", list(ACT_CASES))
def test_conv2d_activation_relu(device, name):
    from nbxtensor.ops.conv import conv2d_activation
    shape, wshape, dtype, layout, kw = ACT_CASES[name]
    gen = rng()
    x = q(gen.standard_normal(shape), dtype)
    x[0, 0, 1, 1] = np.nan
    w, b = q(gen.standard_normal(wshape), dtype), q(gen.standard_normal(wshape[0]), dtype)
    out = conv2d_activation(_layout(x, dtype, device, layout), T(w, dtype, device),
                            T(b, dtype, device), activation="relu", **kw)
    st, pad = _tup(kw.get("stride", 1), 2), _tup(kw.get("padding", 0), 2)
    args = (st, pad, pad, (1, 1), kw.get("groups", 1))
    ref = ref_conv(x, w, b, *args)
    nan = np.isnan(ref)
    assert nan.any()
    np.testing.assert_array_equal(np.isnan(out.to(nbx.float32).numpy()), nan)
    ref = np.where(nan, 0, np.maximum(ref, 0))
    got = out.to(nbx.float32)
    got = nbx.where(got != got, 0.0, got)     # the NaNs are checked above
    check(got.to(dtype), ref, ref_abs(ref_conv, np.nan_to_num(x), w, b, *args), dtype)
    assert (out.to(nbx.float32).numpy()[~nan] >= 0).all()


def test_conv2d_activation_refusals():
    from nbxtensor.ops.conv import conv2d_activation
    x, w = nbx.zeros(1, 2, 4, 4), nbx.zeros(3, 2, 3, 3)
    with pytest.raises(ValueError, match="conv2d_activation: activation must be one of"):
        conv2d_activation(x, w, activation="tanh")
