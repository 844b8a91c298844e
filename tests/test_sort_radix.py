"""The device-wide LSD radix sort (kernels/sort_radix.py) and its routing in kernels/sort.py.

interp (CI): the Triton kernels with tiny tiles (16-64 keys) on rows overhanging the tile,
several histogram programs and look-back windows shorter than the tile count; results vs
NumPy's stable argsort (ref_order), NaN-poisoned outputs; each pass's packed keys vs a NumPy
LSD emulation. cuda: model shapes (the look-back under real concurrency).
"""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import poisoned, rng
from test_sort import _input, _same, ref_order

from nbxtensor.dispatch import impl
from nbxtensor.kernels import sort as S
from nbxtensor.kernels import sort_radix as SR

# (digit bits, keys a tile, warps, look-back window, keys a row, coalesced load): 4-bit
# digits over 16-key tiles of 4 rows with a 4-tile window (several windows a look-back);
# 5-bit digits (a last pass of 2 bits) over 32 keys in rows of 2, window 2, strided loads;
# 3-bit digits over 64 keys / 2 warps, rows of 1, a window longer than the row's tiles; 4-bit,
# 64 keys in rows of 8 (3 split levels), window 2
CONFIGS = [(4, 16, 1, 4, 4, 1), (5, 32, 1, 2, 2, 0), (3, 64, 2, 16, 1, 1), (4, 64, 1, 2, 8, 1)]


@pytest.fixture
def radix_on(monkeypatch, device):
    """Route every row of up to 8 rows to the radix sort on this device; count the calls."""
    if device == "cpu":
        pytest.skip("the radix sort is a Triton kernel (cuda / interp)")
    dev = "cuda" if device == "cuda" else "interp"
    calls = []
    orig = SR.radix_sort
    monkeypatch.setattr(SR, "radix_sort", lambda *a, **kw: calls.append(a) or orig(*a, **kw))
    monkeypatch.setitem(S.CONFIG, dev, dict(S.CONFIG[dev], radix_min_n=1, radix_max_rows=8,
                                            radix_hist_block=32 if dev == "interp" else 4096))

    def set_rc(rc):
        S.CONFIG[dev]["radix_rc"] = rc
    return calls, set_rc


def _check(x, a, dim, desc):
    # the impl writes into NaN / sentinel-poisoned outputs: a gap shows
    v, i = poisoned(a.shape, x.dtype, x.device), poisoned(a.shape, nbx.int64, x.device)
    impl("sort", x.device)(x, dim % x.ndim, desc, v, i)
    o = ref_order(a, dim, desc)
    np.testing.assert_array_equal(i.numpy(), o)
    _same(v, np.take_along_axis(a, o, dim))


@pytest.mark.parametrize("rc", CONFIGS, ids=str)
def test_radix_f32(device, radix_on, rc):
    if device == "cuda":
        pytest.skip("interp configs (tiny tiles); cuda: test_radix_model_shapes")
    calls, set_rc = radix_on
    set_rc(rc)
    T = rc[1]
    # rows overhanging the tile (T*k + 1), ties / NaN / +-inf / -0.0 (_input), both directions
    for shape, desc in (((2, 4 * T + 1), False), ((1, 2 * T + 1), True), ((3, T - 3), True)):
        x, a = _input(shape, nbx.float32, device)
        _check(x, a, -1, desc)
    # distinct values, a reversed row (every key moves), a row of 1
    a = rng().permutation(2 * T + 3).astype(np.float32)[None, :] - 7.5
    _check(nbx.tensor(a, device=device), a, -1, True)
    a = np.arange(2 * T + 1, dtype=np.float32)[None, :]
    _check(nbx.tensor(a, device=device), a, -1, False)
    _check(nbx.tensor(a[:, :1], device=device), a[:, :1], -1, False)
    assert len(calls) == 6


def test_radix_views(device, radix_on):
    if device == "cuda":
        pytest.skip("interp config")
    calls, set_rc = radix_on
    set_rc(CONFIGS[0])
    x, a = _input((37, 3), nbx.float32, device)
    _check(x, a, 0, True)                      # sorted along dim 0: output stride 3
    x, a = _input((2, 40), nbx.float32, device)
    _check(x[:, ::2], a[:, ::2], -1, False)    # a strided view (copied to rows)
    assert len(calls) == 2


DTYPES = [nbx.int32, nbx.int16, nbx.int8, nbx.uint8, nbx.bool, nbx.bfloat16, nbx.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_radix_dtypes(device, radix_on, dtype):
    if device == "cuda":
        pytest.skip("interp config")
    _, set_rc = radix_on
    set_rc(CONFIGS[0])
    for desc in (False, True):
        x, a = _input((2, 3 * 16 + 1), dtype, device)
        _check(x, a, -1, desc)


def test_radix_int_extremes(device, radix_on):
    if device == "cuda":
        pytest.skip("interp config")
    _, set_rc = radix_on
    set_rc(CONFIGS[0])
    for dt, vals in ((np.int32, [-2**31, 2**31 - 1, 0, -1, 1]),
                     (np.int16, [-2**15, 2**15 - 1, 0, -1]),
                     (np.int8, [-128, 127, 0, -1]), (np.uint8, [0, 255, 1, 254])):
        a = rng().choice(np.array(vals, dtype=dt), (1, 35))
        for desc in (False, True):
            _check(nbx.tensor(a, device=device), a, -1, desc)


# ------------------------------------------------------------------ LSD emulation
def _np_key(a, desc):
    """The 32-bit unsigned order key of the module doc, computed in NumPy (uint64 array)."""
    dt = nbx.dtypes.as_dtype(a.dtype)
    if dt.is_floating_point:
        f = a.astype(np.float32)
        f = np.where(np.isnan(f), np.float32(np.nan), f + np.float32(0.0))
        b = f.view(np.int32).astype(np.int64)
        k = np.where(b < 0, b ^ 0x7FFFFFFF, b)
        if desc:
            k = ~k
        return (k + 2**31).astype(np.uint64)
    lo, hi, vmin = SR.key_bits(dt)
    if vmin is None:
        k = a.astype(np.int64)
        return ((~k if desc else k) + 2**31).astype(np.uint64)
    u = a.astype(np.int64) - vmin
    return ((2**hi - 1 - u) if desc else u).astype(np.uint64)


@pytest.mark.parametrize("dtype,rc", [(nbx.float32, CONFIGS[0]), (nbx.bfloat16, CONFIGS[1]),
                                      (nbx.int8, CONFIGS[2])], ids=str)
def test_radix_pass_intermediates(device, dtype, rc):
    """The packed keys after pass p equal a NumPy LSD radix sort stopped after pass p."""
    if device != "interp":
        pytest.skip("interp (the emulation of the kernels' intermediate buffers)")
    M, N = 2, 3 * rc[1] + 1
    x, a = _input((M, N), dtype, device)
    desc = True
    u = _np_key(a, desc)
    packed = (u << np.uint64(32)) | np.arange(N, dtype=np.uint64)[None, :]
    ps = SR.passes(x.dtype, rc[0])
    assert len(ps) == {"float32": 8 if rc[0] == 4 else None, "bfloat16": 4,
                       "int8": 3}[dtype.name]
    todo = sorted({0, 1, len(ps) - 2} & set(range(len(ps) - 1)))
    for p in range(len(ps) - 1):
        shift, dmask = ps[p]
        digit = (packed >> np.uint64(32 + shift)) & np.uint64(dmask)
        packed = np.take_along_axis(packed, np.argsort(digit, axis=-1, kind="stable"), -1)
        if p in todo:
            v, i = poisoned((M, N), dtype, device), poisoned((M, N), nbx.int64, device)
            k = SR.radix_sort(x, M, N, desc, v, i, 1, rc, 32, stop=p)
            np.testing.assert_array_equal(k.numpy().view(np.uint64), packed, err_msg=f"pass {p}")
    # the finished sort is the emulation's last pass, decoded
    shift, dmask = ps[-1]
    digit = (packed >> np.uint64(32 + shift)) & np.uint64(dmask)
    packed = np.take_along_axis(packed, np.argsort(digit, axis=-1, kind="stable"), -1)
    idx = (packed & np.uint64(0xFFFFFFFF)).astype(np.int64)
    np.testing.assert_array_equal(idx, ref_order(a, -1, desc))


# ------------------------------------------------------------------ host side
def test_passes_and_key_bits():
    assert SR.passes(nbx.float32, 4) == [(s, 15) for s in range(0, 32, 4)]
    assert SR.passes(nbx.float32, 5)[-1] == (30, 3)
    assert SR.passes(nbx.bfloat16, 4) == [(16, 15), (20, 15), (24, 15), (28, 15)]
    assert SR.passes(nbx.float16, 4)[0] == (13, 15) and SR.passes(nbx.float16, 4)[-1] == (29, 7)
    assert SR.passes(nbx.int8, 3) == [(0, 7), (3, 7), (6, 3)]
    assert SR.passes(nbx.bool, 4) == [(0, 1)]
    with pytest.raises(ValueError, match="int64"):
        SR.key_bits(nbx.int64)


def test_routing_rule(monkeypatch):
    class _X:
        def __init__(self, dtype):
            self.dtype = dtype
    # shipped OFF on both devices until the H200 sweep decides
    assert S.CONFIG["cuda"]["radix_min_n"] == 0 and S.CONFIG["interp"]["radix_min_n"] == 0
    assert not S._radix_rows(_X(nbx.float32), 1, 1 << 20, S.CONFIG["cuda"])
    cfg = dict(S.CONFIG["cuda"], radix_min_n=100000, radix_max_rows=4)
    assert S._radix_rows(_X(nbx.float32), 1, 1 << 20, cfg)
    assert S._radix_rows(_X(nbx.bfloat16), 4, 100000, cfg)
    assert not S._radix_rows(_X(nbx.float32), 5, 1 << 20, cfg)      # too many rows
    assert not S._radix_rows(_X(nbx.float32), 1, 99999, cfg)        # too short
    assert not S._radix_rows(_X(nbx.float64), 1, 1 << 20, cfg)      # 64-bit: pair path
    assert not S._radix_rows(_X(nbx.int64), 1, 1 << 20, cfg)


def test_radix_sort_refuses():
    x = nbx.tensor(np.zeros((1, 8), np.float32), device="cpu")
    with pytest.raises(ValueError, match="rc must be"):
        SR.radix_sort(x, 1, 8, False, None, None, 1, (4, 24, 1, 4, 4), 32)
    with pytest.raises(ValueError, match="rc must be"):
        SR.radix_sort(x, 1, 8, False, None, None, 1, (9, 16, 1, 4, 4), 32)
    with pytest.raises(ValueError, match="rc must be"):
        SR.radix_sort(x, 1, 8, False, None, None, 1, (4, 16, 1, 4, 3), 32)
    with pytest.raises(ValueError, match="rc must be"):
        SR.radix_sort(x, 1, 8, False, None, None, 1, (4, 16, 1, 4, 4, 1, 0), 32)
    with pytest.raises(ValueError, match="rows of"):
        SR.radix_sort(x, 1, 2**30, False, None, None, 1, (4, 16, 1, 4, 4), 32)


@pytest.mark.parametrize("rc", SR.SWEEP, ids=str)
def test_compiles_for_sm90(rc):
    """Every sweep variant's middle-pass kernel (the first variant's first and last passes and
    the histogram kernel too) compiles for sm_90 (Triton's compiler and ptxas; no GPU)."""
    import triton
    from triton.backends.compiler import GPUTarget
    db, T, W, LB, E, coal = rc
    npp = len(SR.passes(nbx.float32, db))
    npp = 1 << (npp - 1).bit_length()
    if rc == SR.SWEEP[0]:
        sig = {"x_ptr": "*fp32", "h_ptr": "*i32", "z_ptr": "*i32", "N": "i32", "G": "i32",
               "ZN": "i32"}
        cx = dict(LO=0, DB=db, HI=32, NPP=npp, RADIX=1 << db, BLOCK=4096, IS_FLOAT=True,
                  DESC=True, VMIN=None, SPAN=0, ZB=1024)
        sig.update({k: "constexpr" for k in cx})
        triton.compile(triton.compiler.ASTSource(fn=SR._hist_kernel, signature=sig,
                                                 constexprs=cx),
                       target=GPUTarget("cuda", 90, 64), options=dict(num_warps=8))
    for first, last in (((True, False), (False, False), (False, True)) if rc == SR.SWEEP[0]
                        else ((False, False),)):
        sig = {"x_ptr": "*fp32", "kin_ptr": "*fp32" if first else "*i64", "kout_ptr": "*i64",
               "v_ptr": "*fp32", "i_ptr": "*i64", "h_ptr": "*i32", "z_ptr": "*i32",
               "b_ptr": "*i32"}
        sig.update({k: "i32" for k in ("N", "I", "TILES", "G", "SHIFT", "DMASK", "PASS")})
        cx = dict(T=T, E=E, COAL=bool(coal), RADIX=1 << db, NPP=npp, GP=64, LB=LB,
                  FIRST=first, LAST=last, IS_FLOAT=True, DESC=True, VMIN=None, SPAN=0)
        sig.update({k: "constexpr" for k in cx})
        k = triton.compile(triton.compiler.ASTSource(fn=SR._pass_kernel, signature=sig,
                                                     constexprs=cx),
                           target=GPUTarget("cuda", 90, 64), options=dict(num_warps=W))
        assert k.metadata.shared <= 227 * 1024
        assert "atom.global" in k.asm["ptx"] or "atom." in k.asm["ptx"]


# ------------------------------------------------------------------ cuda
def _cuda_only(device):
    if device != "cuda":
        pytest.skip("cuda only (model shapes)")


@pytest.mark.parametrize("shape", [(1, 1048576), (2, 300001), (1, 128256)], ids=str)
def test_radix_model_shapes(device, radix_on, shape):
    """The shipped radix_rc (SWEEP[0] until the sweep picks) on model shapes, f32 with ties / NaN /
    -0.0, both directions; bf16 descending on the last."""
    _cuda_only(device)
    calls, set_rc = radix_on
    rc = S.CONFIG["cuda"]["radix_rc"]
    set_rc(rc)
    for desc in (False, True):
        x, a = _input(shape, nbx.float32, device)
        _check(x, a, -1, desc)
    if shape == (1, 128256):
        x, a = _input(shape, nbx.bfloat16, device)
        _check(x, a, -1, True)
    assert calls


@pytest.mark.parametrize("rc", SR.SWEEP, ids=str)
def test_radix_sweep_variants_cuda(device, radix_on, rc):
    """Every sweep variant on (1, 262144) f32 descending with ties (32-256 tiles: look-back
    windows; N divisible by 16, so the sweep's compiled kernels are reused)."""
    _cuda_only(device)
    _, set_rc = radix_on
    set_rc(rc)
    x, a = _input((1, 262144), nbx.float32, device)
    _check(x, a, -1, True)
