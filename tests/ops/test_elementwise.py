"""Element-wise ops on every device against float64 NumPy references.

Fresh random inputs (never zeros) plus NaN/inf/signed zeros, sizes that overhang the
kernels' blocks (BLOCK*k + 1), non-contiguous, broadcast (stride 0), empty and 0-dim
operands, and outputs poisoned with NaN before the run.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import FLOAT_DTYPES, RTOL, assert_close, poisoned, randn, rng, to64

# NumPy and the interpreter warn on overflowing casts / division by zero, which the
# tests provoke on purpose
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

FLAT = 4096 + 1          # 8 f32 / 4 bf16 blocks of the contiguous kernel + 1 (flat_block)
STRIDED = (3, 343)       # 1029 = the strided kernel's block (1024) + 5, in a 2-D view

_erf = np.vectorize(math.erf)


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _softplus(x, beta=1.0, th=20.0):
    return np.where(x * beta > th, x, np.log1p(np.exp(beta * x)) / beta)


# name -> (float64 reference, input domain (low, high) or None for normal, extra tolerance)
UNARY = {
    "abs": (np.abs, None), "neg": (np.negative, None), "sign": (np.sign, None),
    "exp": (np.exp, (-10, 10)), "exp2": (np.exp2, (-14, 14)), "expm1": (np.expm1, (-3, 3)),
    "log": (np.log, (1e-3, 1e3)), "log2": (np.log2, (1e-3, 1e3)),
    "log10": (np.log10, (1e-3, 1e3)), "log1p": (np.log1p, (-0.9, 10)),
    "sqrt": (np.sqrt, (0, 100)), "rsqrt": (lambda x: 1 / np.sqrt(x), (0.01, 100)),
    "reciprocal": (lambda x: 1 / x, (0.1, 10)), "sin": (np.sin, (-6, 6)), "cos": (np.cos, (-6, 6)),
    "tan": (np.tan, (-1.2, 1.2)), "tanh": (np.tanh, (-5, 5)), "sigmoid": (_sig, (-10, 10)),
    "erf": (_erf, (-3, 3)), "floor": (np.floor, (-50, 50)), "ceil": (np.ceil, (-50, 50)),
    "round": (np.round, (-50, 50)), "trunc": (np.trunc, (-50, 50)),
}
ACT = {
    "relu": lambda x: np.where(x < 0, 0.0, x),
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
    "silu": lambda x: x * _sig(x), "mish": lambda x: x * np.tanh(_softplus(x)),
    "softplus": _softplus, "elu": lambda x: np.where(x > 0, x, np.expm1(x)),
    "leaky_relu": lambda x: np.where(x > 0, x, 0.01 * x),
    "hardswish": lambda x: x * np.clip(x + 3, 0, 6) / 6,
    "hardsigmoid": lambda x: np.clip(x + 3, 0, 6) / 6,
}


def _act(name, t):
    if name == "gelu_tanh":
        return nbx.gelu(t, approximate="tanh")
    return getattr(nbx, name)(t)


def _input(shape, dtype, device, dom, g):
    if dom is None:
        a = g.standard_normal(shape) * 3
    else:
        a = g.uniform(dom[0], dom[1], shape)
    a = np.where(a == 0, 0.5, a)
    return nbx.tensor(a.astype(dtype.np), device=device)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_unary_float(device, dtype):
    g = rng()
    for name, (ref, dom) in UNARY.items():
        x = _input((FLAT,), dtype, device, dom, g)
        want = ref(to64(x))
        got = getattr(nbx, name)(x)
        assert got.dtype is dtype, name
        r = RTOL[dtype] * (4 if name in ("tan", "exp", "exp2") else 1)
        assert_close(got, want, dtype, rtol=r, atol=r)
        if name in ("exp", "sqrt", "round"):     # poisoned out=
            out = poisoned(x.shape, dtype, device)
            getattr(nbx, name)(x, out=out)
            assert_close(out, want, dtype, rtol=r, atol=r)


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16], ids=lambda d: d.name)
def test_unary_special_values(device, dtype):
    vals = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-30],
                    np.float64)
    x = nbx.tensor(vals.astype(dtype.np), device=device)
    x64 = to64(x)
    with np.errstate(all="ignore"):
        for name, (ref, _) in UNARY.items():
            if name in ("erf",):
                continue
            assert_close(getattr(nbx, name)(x), ref(x64), dtype, atol=1e-30)
        assert_close(nbx.erf(x), np.where(np.isnan(x64), np.nan, _erf(np.nan_to_num(x64))), dtype)
        for name, ref in ACT.items():
            assert_close(_act(name, x), ref(x64), dtype)
    np.testing.assert_array_equal(nbx.isnan(x).numpy(), np.isnan(x64))
    np.testing.assert_array_equal(nbx.isinf(x).numpy(), np.isinf(x64))
    np.testing.assert_array_equal(nbx.isfinite(x).numpy(), np.isfinite(x64))
    np.testing.assert_array_equal(nbx.logical_not(x).numpy(), x64 == 0)
    # neg keeps the IEEE sign of zero
    assert np.signbit((-x).numpy().astype(np.float64)[3])


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.float16, nbx.bfloat16, nbx.float64],
                         ids=lambda d: d.name)
def test_activations(device, dtype):
    g = rng()
    x = _input((FLAT,), dtype, device, (-8, 8), g)
    x64 = to64(x)
    for name, ref in ACT.items():
        got = _act(name, x)
        assert got.dtype is dtype
        assert_close(got, ref(x64), dtype, atol=RTOL[dtype] * 2)
    assert_close(nbx.softplus(x, beta=2.0, threshold=5.0), _softplus(x64, 2.0, 5.0), dtype)
    assert_close(nbx.elu(x, alpha=0.5), np.where(x64 > 0, x64, 0.5 * np.expm1(x64)), dtype)
    assert_close(nbx.leaky_relu(x, 0.2), np.where(x64 > 0, x64, 0.2 * x64), dtype)
    y = _input((6, 2 * 171), dtype, device, None, g)
    y64 = to64(y)
    assert_close(nbx.glu(y), y64[:, :171] * _sig(y64[:, 171:]), dtype)
    assert_close(nbx.glu(y, dim=0), y64[:3] * _sig(y64[3:]), dtype)
    # in place
    z = x.clone()
    assert nbx.relu(z, inplace=True) is z
    assert_close(z, np.maximum(x64, 0), dtype)


def test_unary_int_promotion(device):
    x = randn((50,), nbx.int32, device)
    assert nbx.exp(x).dtype is nbx.float32
    assert_close(nbx.sqrt(nbx.abs(x)), np.sqrt(np.abs(to64(x))), nbx.float32)
    assert nbx.floor(x).dtype is nbx.int32
    np.testing.assert_array_equal(nbx.floor(x).numpy(), x.numpy())
    np.testing.assert_array_equal(nbx.abs(x).numpy(), np.abs(x.numpy()))
    np.testing.assert_array_equal(nbx.neg(x).numpy(), -x.numpy())
    np.testing.assert_array_equal(nbx.sign(x).numpy(), np.sign(x.numpy()))
    np.testing.assert_array_equal(nbx.isnan(x).numpy(), np.zeros(50, bool))
    np.testing.assert_array_equal(nbx.isfinite(x).numpy(), np.ones(50, bool))
    np.testing.assert_array_equal(nbx.bitwise_not(x).numpy(), ~x.numpy())
    b = randn((50,), nbx.bool, device)
    np.testing.assert_array_equal((~b).numpy(), ~b.numpy())
    with pytest.raises(TypeError, match="bitwise_not"):
        nbx.bitwise_not(nbx.ones(3, device=device))
    with pytest.raises(TypeError, match="negation"):
        -b
    with pytest.raises(TypeError, match="floating"):
        nbx.gelu(x)


def test_unary_layouts(device):
    """Transposed, sliced, broadcast (stride 0), 0-dim and empty inputs; out views."""
    g = rng()
    base = _input((37, 64), nbx.float32, device, (-3, 3), g)
    for v in (base.T, base[::3, 1::2], base[5:6].expand(9, 64), base[3, 4], base[:0]):
        want = np.exp(to64(v))
        got = nbx.exp(v)
        assert got.shape == v.shape
        assert_close(got, want, nbx.float32)
    # output into a strided view of a poisoned buffer; the rest must stay poisoned
    big = poisoned((64, 74), nbx.float32, device)
    dst = big[:, 5:42]
    nbx.sin(base.T[:, :37], out=dst)
    full = big.numpy()
    assert_close(full[:, 5:42], np.sin(to64(base).T[:, :37]), nbx.float32)
    assert np.isnan(full[:, :5]).all() and np.isnan(full[:, 42:]).all()


def test_all_kernel_paths(device, monkeypatch):
    """1-D strided, 2-D tiles, 3..6-D strided and the int64-offset variants of each."""
    g = rng()
    base = _input((2, 3, 4, 5, 6, 7), nbx.float32, device, (-3, 3), g)
    b64 = to64(base)
    views = [(base.reshape(-1)[::5], b64.reshape(-1)[::5]),                     # 1 strided dim
             (base.permute(5, 4, 3, 2, 1, 0), b64.transpose(5, 4, 3, 2, 1, 0)),  # 6 dims
             (base[:, 1:, ::2, :, 1:, ::3], b64[:, 1:, ::2, :, 1:, ::3])]
    lows = [False]
    if device != "cpu":
        lows.append(True)
    for low in lows:
        if low:
            from nbxtensor.kernels import elementwise as kern
            monkeypatch.setattr(kern, "IDX64_LIMIT", 0)
        for v, v64 in views:
            assert_close(nbx.exp(v), np.exp(v64), nbx.float32)
            assert_close(v + v64.shape[-1], v64 + v64.shape[-1], nbx.float32)
        x = _input((FLAT,), nbx.float32, device, None, g)
        assert_close(x * x, to64(x) ** 2, nbx.float32)
        m = _input((70, 33), nbx.float32, device, None, g)
        assert_close(m + m.T[:33, :33].contiguous()[0], to64(m) + to64(m).T[:33, :33][0],
                     nbx.float32)
        assert_close(m.T + 1, to64(m).T + 1, nbx.float32)


# ----------------------------------------------------------------------------- binary

def _pair(shape_a, shape_b, dtype, device, g, low=None, high=None, nonzero=True):
    a = randn(shape_a, dtype, device, g, low, high)
    b = randn(shape_b, dtype, device, g, low, high)
    if nonzero and dtype.kind in "ui":
        bb = b.numpy()
        b = nbx.tensor(np.where(bb == 0, 3, bb).astype(dtype.np), device=device)
    return a, b


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [nbx.int32, nbx.int64, nbx.int8, nbx.uint8],
                         ids=lambda d: d.name)
def test_binary_arith(device, dtype):
    g = rng()
    shapes = [((FLAT,), (FLAT,)), (STRIDED, (1, STRIDED[1])), ((7, 1, 5), (3, 5)), ((), (40,))]
    if dtype in (nbx.int8, nbx.int64, nbx.float16):
        shapes = shapes[1:]
    for sa, sb in shapes:
        a, b = _pair(sa, sb, dtype, device, g, low=1 if dtype.kind == "u" else None)
        a64, b64 = to64(a), to64(b)
        with np.errstate(all="ignore"):
            cases = {
                "add": (nbx.add(a, b), a64 + b64),
                "sub": (nbx.sub(a, b), a64 - b64),
                "mul": (nbx.mul(a, b), a64 * b64),
                "max": (nbx.maximum(a, b), np.maximum(a64, b64)),
                "min": (nbx.minimum(a, b), np.minimum(a64, b64)),
                "alpha": (nbx.add(a, b, alpha=2), a64 + 2 * b64),
                "sub_alpha": (nbx.sub(a, b, alpha=3), a64 - 3 * b64),
            }
        for what, (got, want) in cases.items():
            assert got.dtype is dtype, what
            if dtype.kind in "ui":
                want = want.astype(np.int64).astype(dtype.np)   # integer results wrap
                np.testing.assert_array_equal(got.numpy(), want, err_msg=what)
            else:
                assert_close(got, want, dtype, atol=RTOL[dtype] * 4)
        # division: true, floor, trunc; remainder and fmod
        if dtype.kind == "f":
            qa = nbx.tensor((g.integers(-400, 400, a.shape) / 4).astype(dtype.np), device=device)
            m = g.integers(1, 40, b.shape) * np.where(g.random(b.shape) < 0.5, -1, 1)
            qb = nbx.tensor((m / 4).astype(dtype.np), device=device)
        else:
            qa, qb = a, b
        qa64, qb64 = to64(qa), to64(qb)
        d = nbx.div(qa, qb)
        assert d.dtype is (dtype if dtype.kind == "f" else nbx.float32)
        assert_close(d, qa64 / qb64, d.dtype)
        for mode, ref in (("floor", np.floor_divide), ("trunc", lambda x, y: np.trunc(x / y))):
            r = nbx.div(qa, qb, rounding_mode=mode)
            assert r.dtype is dtype
            assert_close(r, ref(qa64, qb64), dtype)
        assert_close(nbx.remainder(qa, qb), np.remainder(qa64, qb64), dtype, atol=RTOL[dtype]
                     if dtype in RTOL else None)
        assert_close(nbx.fmod(qa, qb), np.fmod(qa64, qb64), dtype, atol=RTOL[dtype]
                     if dtype in RTOL else None)


def test_integer_division_by_zero_and_extremes(device):
    a = nbx.tensor(np.array([7, -7, 0, 5, -128, 100], np.int64), device=device)
    b = nbx.tensor(np.array([0, 0, 0, -2, -1, 7], np.int64), device=device)
    # by zero: 0 on every device (NumPy's value), never a crash
    np.testing.assert_array_equal((a // b).numpy(), [0, 0, 0, -3, 128, 14])
    np.testing.assert_array_equal(nbx.div(a, b, rounding_mode="trunc").numpy(), [0, 0, 0, -2, 128, 14])
    np.testing.assert_array_equal((a % b).numpy(), [0, 0, 0, -1, 0, 2])
    np.testing.assert_array_equal(nbx.fmod(a, b).numpy(), [0, 0, 0, 1, 0, 2])
    t = (a / b).numpy()
    assert np.isinf(t[0]) and np.isinf(t[1]) and np.isnan(t[2])
    # INT_MIN // -1 overflows: it must not trap (x86 raises SIGFPE in C); the value wraps
    m = nbx.tensor(np.array([np.iinfo(np.int32).min], np.int32), device=device)
    m1 = nbx.tensor(np.array([-1], np.int32), device=device)
    for r in (m // m1, m % m1, nbx.fmod(m, m1), nbx.div(m, m1, rounding_mode="trunc")):
        r.numpy()
    np.testing.assert_array_equal((m % m1).numpy(), [0])
    f = nbx.tensor(np.array([1.0, -1.0, 0.0, 5.5]), device=device)
    z = nbx.tensor(np.array([0.0, 0.0, 0.0, -0.0]), device=device)
    with np.errstate(all="ignore"):
        assert_close(f // z, np.floor_divide(f.numpy(), z.numpy()))
        assert_close(f % z, np.remainder(f.numpy(), z.numpy()))


def test_pow(device):
    g = rng()
    a = nbx.tensor(g.uniform(0.1, 3, FLAT).astype(np.float32), device=device)
    b = nbx.tensor(g.uniform(-3, 3, FLAT).astype(np.float32), device=device)
    assert_close(a ** b, to64(a) ** to64(b), nbx.float32, rtol=1e-5)
    assert_close(a ** 2, to64(a) ** 2, nbx.float32)
    assert_close(2 ** b, 2.0 ** to64(b), nbx.float32, rtol=1e-5)
    x = nbx.tensor(np.array([-2.0, -2.0, 0.0, 0.0, np.nan, 1.0, -1.0, -8.0]), device=device)
    y = nbx.tensor(np.array([3.0, 0.5, -1.0, 0.0, 0.0, np.nan, np.inf, 1 / 3]), device=device)
    with np.errstate(all="ignore"):
        assert_close(x ** y, np.power(x.numpy(), y.numpy()), nbx.float64)
    i = nbx.tensor(np.array([2, -3, 1, -1, 5, 0], np.int64), device=device)
    e = nbx.tensor(np.array([10, 3, -4, -3, -1, 0], np.int64), device=device)
    np.testing.assert_array_equal((i ** e).numpy(), [1024, -27, 1, -1, 0, 1])
    with pytest.raises(ValueError, match="negative"):
        i ** -1
    assert (i ** 2).dtype is nbx.int64 and (i ** 2.0).dtype is nbx.float32


def test_atan2(device):
    g = rng()
    y = nbx.tensor(g.standard_normal(FLAT) * 10.0 ** g.uniform(-3, 3, FLAT), device=device)
    x = nbx.tensor(g.standard_normal(FLAT) * 10.0 ** g.uniform(-3, 3, FLAT), device=device)
    assert_close(nbx.atan2(y, x), np.arctan2(y.numpy(), x.numpy()), nbx.float64)
    y32, x32 = y.float(), x.float()
    assert_close(nbx.atan2(y32, x32), np.arctan2(to64(y32), to64(x32)), nbx.float32)
    sp = np.array([0.0, -0.0, 0.0, -0.0, np.inf, -np.inf, np.inf, 1.0, np.nan, 1.0])
    sq = np.array([0.0, 0.0, -0.0, -0.0, np.inf, np.inf, -np.inf, 0.0, 1.0, -np.inf])
    got = nbx.atan2(nbx.tensor(sp, device=device), nbx.tensor(sq, device=device)).numpy()
    want = np.arctan2(sp, sq)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert (np.signbit(got) == np.signbit(want)).all()


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16, nbx.int16, nbx.uint8, nbx.bool],
                         ids=lambda d: d.name)
def test_comparisons_and_logical(device, dtype):
    g = rng()
    a, b = _pair(STRIDED, (STRIDED[1],), dtype, device, g, low=0 if dtype.kind == "u" else -3,
                 high=3, nonzero=False)
    if dtype.kind == "f":   # ties and NaN
        an = a.numpy().copy()
        an[0, :5] = np.nan
        a = nbx.tensor(an, device=device)
        b = nbx.tensor(np.round(b.numpy().astype(np.float32)).astype(dtype.np), device=device)
        a = nbx.round(a)
    a64, b64 = to64(a), to64(b)
    for name, ref in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                      ("gt", np.greater), ("ge", np.greater_equal),
                      ("logical_and", np.logical_and), ("logical_or", np.logical_or),
                      ("logical_xor", np.logical_xor)):
        got = getattr(nbx, name)(a, b)
        assert got.dtype is nbx.bool
        np.testing.assert_array_equal(got.numpy(), ref(a64, b64), err_msg=name)
    np.testing.assert_array_equal((a == 1).numpy(), a64 == 1)
    np.testing.assert_array_equal((1 < a).numpy(), 1 < a64)
    if dtype.kind != "f":
        an, bn = a.numpy(), b.numpy()
        np.testing.assert_array_equal((a & b).numpy(), an & bn)
        np.testing.assert_array_equal((a | b).numpy(), an | bn)
        np.testing.assert_array_equal((a ^ b).numpy(), an ^ bn)


def test_shifts(device):
    a = nbx.tensor(np.array([1, -8, 100, -1, 5, 3], np.int32), device=device)
    s = nbx.tensor(np.array([3, 1, 31, 40, 32, 0], np.int32), device=device)
    np.testing.assert_array_equal((a << s).numpy(), [8, -16, 0, 0, 0, 3])
    np.testing.assert_array_equal((a >> s).numpy(), [0, -4, 0, -1, 0, 3])
    u = nbx.tensor(np.array([200, 3], np.uint8), device=device)
    np.testing.assert_array_equal((u << 1).numpy(), [144, 6])
    np.testing.assert_array_equal((u >> 2).numpy(), [50, 0])
    with pytest.raises(TypeError):
        nbx.ones(2, device=device) << 1


def test_type_promotion(device):
    i8 = randn((4,), nbx.int8, device)
    u8 = randn((4,), nbx.uint8, device, low=0)
    f16 = randn((4,), nbx.float16, device)
    bf = randn((4,), nbx.bfloat16, device)
    i64 = randn((4,), nbx.int64, device)
    assert (i8 + u8).dtype is nbx.int16
    assert (i8 + 1).dtype is nbx.int8
    assert (i8 + 2.5).dtype is nbx.float32
    assert (f16 + bf).dtype is nbx.float32
    assert (f16 + 1e4).dtype is nbx.float16
    assert (f16 + nbx.tensor(2.0, dtype=nbx.float64, device=device)).dtype is nbx.float16
    assert (i64 + nbx.tensor(2.0, dtype=nbx.float64, device=device)).dtype is nbx.float64
    assert (i8 / i8).dtype is nbx.float32
    assert (u8 > 1.5).dtype is nbx.bool
    np.testing.assert_array_equal((u8 > 1.5).numpy(), u8.numpy() > 1.5)
    # float16 ops compute in float32 and round once
    x, y, z = (randn((FLAT,), nbx.float16, device) for _ in range(3))
    want = (to64(x).astype(np.float32) + to64(y).astype(np.float32) * to64(z).astype(np.float32))
    assert_close(nbx.addcmul(x, y, z), want.astype(np.float16).astype(np.float64), nbx.float16,
                 rtol=1e-3, atol=1e-3)
    # int scalars that do not fit the tensor's dtype are refused
    with pytest.raises(OverflowError, match="int8"):
        i8 + 1000
    # a 0-dim cpu tensor mixes with any device
    s = nbx.tensor(3.0)
    assert_close(f16 * s, to64(f16) * 3, nbx.float16)


def test_ternary(device):
    g = rng()
    c = randn(STRIDED, nbx.bool, device, g)
    x = randn(STRIDED, nbx.float32, device, g)
    y = randn((STRIDED[1],), nbx.float32, device, g)
    np.testing.assert_array_equal(nbx.where(c, x, y).numpy(), np.where(c.numpy(), x.numpy(),
                                                                        y.numpy()))
    w = nbx.where(c, x, 0)
    assert w.dtype is nbx.float32
    np.testing.assert_array_equal(w.numpy(), np.where(c.numpy(), x.numpy(), 0))
    assert nbx.where(c, 1, 2.5).dtype is nbx.float32
    np.testing.assert_array_equal(x.where(c, -1.0).numpy(), np.where(c.numpy(), x.numpy(), -1))
    x64, y64 = to64(x), to64(y)
    for wt in (0.25, 0.75, 1.0):
        assert_close(nbx.lerp(x, y.expand(x.shape), wt), x64 + wt * (y64 - x64), nbx.float32)
    wtt = randn(STRIDED, nbx.float32, device, g)
    assert_close(nbx.lerp(x, y.expand(x.shape), wtt), x64 + to64(wtt) * (y64 - x64), nbx.float32,
                 atol=1e-5)
    z = randn((STRIDED[0], 1), nbx.float32, device, g)
    z64 = to64(z)
    assert_close(nbx.addcmul(x, y, z, value=0.5), x64 + 0.5 * y64 * z64, nbx.float32)
    assert_close(nbx.addcdiv(x, y, z, value=-2), x64 - 2 * y64 / z64, nbx.float32, atol=1e-5)
    i = randn((10,), nbx.int32, device, g)
    np.testing.assert_array_equal(nbx.addcmul(i, i, i, value=2).numpy(),
                                  i.numpy() + 2 * i.numpy() ** 2)
    with pytest.raises(TypeError, match="addcdiv"):
        nbx.addcdiv(i, i, i)


def test_clamp_and_nan_to_num(device):
    g = rng()
    x = randn((FLAT,), nbx.float32, device, g)
    xn = x.numpy().copy()
    xn[:4] = [np.nan, np.inf, -np.inf, -0.0]
    x = nbx.tensor(xn, device=device)
    x64 = to64(x)
    assert_close(nbx.clamp(x, -0.5, 0.5), np.clip(x64, -0.5, 0.5), nbx.float32)
    assert_close(nbx.clamp(x, min=0.1), np.maximum(x64, 0.1), nbx.float32)
    assert_close(x.clamp(max=-0.1), np.minimum(x64, -0.1), nbx.float32)
    lo = randn((FLAT,), nbx.float32, device, g) - 1
    hi = lo + 0.5
    assert_close(nbx.clamp(x, lo, hi), np.minimum(np.maximum(x64, to64(lo)), to64(hi)), nbx.float32)
    assert_close(nbx.clamp(x, 1.0, -1.0), np.where(np.isnan(x64), np.nan, -1.0), nbx.float32)
    i = randn((100,), nbx.int64, device, g)
    ci = nbx.clamp(i, -10, 10)
    assert ci.dtype is nbx.int64
    np.testing.assert_array_equal(ci.numpy(), np.clip(i.numpy(), -10, 10))
    assert nbx.clamp(i, 0.5).dtype is nbx.float32
    h = x.half()
    r = nbx.nan_to_num(h)
    np.testing.assert_array_equal(r.numpy()[:3], np.array([0, 65504, -65504], np.float16))
    r = nbx.nan_to_num(x, nan=1.5, posinf=2.0, neginf=-3.0)
    assert_close(r, np.nan_to_num(x64, nan=1.5, posinf=2.0, neginf=-3.0), nbx.float32)
    y = x.clone()
    y.clamp_(-1, 1)
    assert_close(y, np.clip(x64, -1, 1), nbx.float32)


def test_binary_out_repeated_calls(device):
    # the second and later calls with the same operand kinds take the cached path into out:
    # an out at an offset into a bigger buffer, out aliasing an operand in the same layout,
    # in another layout (a temporary), a scalar operand, and the refusals that must stay
    g = rng()
    for _ in range(3):
        a, b = randn((5, 33), nbx.float32, device, g), randn((5, 33), nbx.float32, device, g)
        a64, b64 = to64(a), to64(b)
        big = poisoned((5 * 33 + 7,), nbx.float32, device)
        before = big.numpy().copy()
        view = big[7:].view(5, 33)
        assert nbx.mul(a, b, out=view) is view
        assert_close(view, a64 * b64, nbx.float32)
        np.testing.assert_array_equal(big.numpy()[:7], before[:7])
        assert nbx.sub(a, 2.5, out=view) is view
        assert_close(view, a64 - 2.5, nbx.float32)
        c = a.clone()
        assert nbx.add(c, b, out=c) is c                 # same layout: in place
        assert_close(c, a64 + b64, nbx.float32)
        sq = randn((130, 130), nbx.float32, device, g)  # several programs: a race shows
        s64 = to64(sq)
        nbx.add(sq, sq.T, out=sq)                        # another layout: via a temporary
        assert_close(sq, s64 + s64.T, nbx.float32)
        with pytest.raises(TypeError, match="can't be cast"):
            nbx.mul(a, b, out=nbx.empty((5, 33), dtype=nbx.int32, device=device))
        with pytest.raises(ValueError, match="shape"):
            nbx.mul(a, b, out=nbx.empty((5, 34), device=device))
        with pytest.raises(ValueError, match="overlapping"):
            nbx.mul(a, b, out=nbx.empty((33,), device=device).expand(5, 33))
        i8 = nbx.tensor(np.arange(1, 11, dtype=np.int8), device=device)
        o8 = nbx.empty((10,), dtype=nbx.int8, device=device)
        nbx.add(i8, 3, out=o8)
        np.testing.assert_array_equal(o8.numpy(), np.arange(1, 11) + 3)
        with pytest.raises(OverflowError):
            nbx.add(i8, 300, out=o8)
        w = poisoned((5, 33), nbx.float64, device)       # a wider out: the full path casts
        nbx.mul(a, b, out=w)
        assert_close(w, a64 * b64, nbx.float32)
        # unary out= (the same-shape path of _run): at an offset, in place, another layout
        assert nbx.exp(a, out=view) is view
        assert_close(view, np.exp(a64), nbx.float32)
        c = a.clone()
        assert nbx.neg(c, out=c) is c
        assert_close(c, -a64, nbx.float32)
        t = randn((130, 130), nbx.float32, device, g)
        t64 = to64(t)
        nbx.neg(t.T, out=t)                              # another layout: via a temporary
        assert_close(t, -t64.T, nbx.float32)
        isn = nbx.empty((5, 33), dtype=nbx.bool, device=device)
        assert nbx.isnan(a, out=isn) is isn and not isn.numpy().any()
        with pytest.raises(TypeError, match="can't be cast"):
            nbx.exp(a, out=nbx.empty((5, 33), dtype=nbx.int32, device=device))


def test_inplace_out_and_operators(device):
    g = rng()
    a = randn((5, 7), nbx.float32, device, g)
    b = randn((7,), nbx.float32, device, g)
    a64, b64 = to64(a), to64(b)
    c = a.clone()
    c += b
    c -= 1
    c *= 2
    c /= b
    assert_close(c, ((a64 + b64) - 1) * 2 / b64, nbx.float32)
    c = a.clone()
    assert c.add_(b, alpha=3) is c
    assert_close(c, a64 + 3 * b64, nbx.float32)
    i = randn((5, 7), nbx.int32, device, g)
    with pytest.raises(TypeError, match="can't be cast"):
        i.add_(a)
    with pytest.raises(ValueError, match="in-place"):
        b.clone().add_(a)
    with pytest.raises(TypeError, match="alpha"):
        nbx.add(i, i, alpha=0.5)
    # reflected forms
    assert_close(1 - a, 1 - a64, nbx.float32)
    assert_close(2 / a, 2 / a64, nbx.float32)
    assert_close(3.0 ** (a * 0.1), 3.0 ** (a64 * 0.1), nbx.float32)
    assert_close(7 % (i.abs() + 1), 7 % (np.abs(i.numpy()) + 1), nbx.int32)
    assert_close(-a, -a64, nbx.float32)
    assert_close(abs(a), np.abs(a64), nbx.float32)
    assert (a + b).shape == (5, 7)
    # out= with a wider dtype, and out aliasing an input in another layout
    out = poisoned((5, 7), nbx.float64, device)
    nbx.mul(a, b, out=out)
    assert_close(out, a64 * b64, nbx.float32)
    sq = randn((6, 6), nbx.float32, device, g)
    s64 = to64(sq)
    nbx.add(sq, sq.T, out=sq)
    assert_close(sq, s64 + s64.T, nbx.float32)
    with pytest.raises(TypeError, match="can't be cast"):
        nbx.add(a, b, out=nbx.empty((5, 7), dtype=nbx.int32, device=device))
    with pytest.raises(ValueError, match="shape"):
        nbx.add(a, b, out=nbx.empty((5, 8), device=device))
    with pytest.raises(ValueError, match="broadcast"):
        a + randn((4,), nbx.float32, device, g)
    with pytest.raises(TypeError):
        a + "x"
    assert (a == a).dtype is nbx.bool
    # comparisons in place keep self's dtype
    d = a.clone()
    d.gt_(0)
    np.testing.assert_array_equal(d.numpy(), (a64 > 0).astype(np.float32))


def test_empty_and_zero_dim(device):
    e = nbx.empty((0, 5), device=device)
    assert (e + 1).shape == (0, 5)
    assert nbx.exp(e).shape == (0, 5)
    assert nbx.where(e > 0, e, e).shape == (0, 5)
    s = nbx.tensor(2.0, device=device)
    r = s * 3 + s
    assert r.shape == () and r.item() == 8.0
    v = nbx.tensor([1.0, 2.0, 3.0], device=device)
    assert_close(v * s, [2.0, 4.0, 6.0], nbx.float32)
    assert_close(s - v, [1.0, 0.0, -1.0], nbx.float32)


def test_float64_scalars_exact(device):
    x = nbx.tensor(np.array([1.0, 2.0, 3.0]), device=device)
    np.testing.assert_array_equal((x + 0.1).numpy(), np.array([1.0, 2.0, 3.0]) + 0.1)
    xn = np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(nbx.add(x, x, alpha=0.1).numpy(), xn + 0.1 * xn)
    np.testing.assert_array_equal(nbx.where(x > 1.5, x, 1e300).numpy(), [1e300, 2.0, 3.0])


def test_dispatch_names_agree():
    from nbxtensor.backends.cpu import elementwise as cpu
    from nbxtensor.dispatch import impl
    from nbxtensor.ops import _declare
    from nbxtensor.ops import elementwise as ops
    # every element-wise entry is a declaration: no hand-written table is left in the cpu module
    assert set(ops.DISPATCH_NAMES) == set(_declare.OPS)
    assert not hasattr(cpu, "_OPS")
    for name in ops.DISPATCH_NAMES:
        assert impl(name, nbx.device("cpu")) is not None
    pytest.importorskip("triton")
    for name in ops.DISPATCH_NAMES:     # the triton family registers every name
        assert impl(name, nbx.device("interp")) is not None


def test_ops_table_is_fresh():
    """docs/ops.md is generated from the dispatch registry; regenerate it after adding ops."""
    pytest.importorskip("triton")
    import os

    from nbxtensor.ops import _table
    path = _table.default_path()
    if not os.path.exists(os.path.join(os.path.dirname(path), "..", "pyproject.toml")):
        pytest.skip("not a source checkout")
    with open(path, encoding="utf-8") as f:
        current = f.read()
    assert current == _table.generate(), (
        "docs/ops.md is stale: run `python -m nbxtensor.ops._table` and commit the result")


def test_copy_of_more_dims_than_the_strided_kernel_takes(device):
    """A 7-dim transposed view does not merge below 7 dims; contiguous() must still copy it
    (seen failing on the H200: the strided kernel takes 6 dims, so `run` splits the work)."""
    g = np.random.default_rng()
    a = g.standard_normal((2, 3, 2, 3, 2, 3, 2)).astype(np.float32)
    t = nbx.tensor(a, device=device).permute(6, 5, 4, 3, 2, 1, 0)
    c = t.contiguous()
    assert c.is_contiguous()
    np.testing.assert_array_equal(c.numpy(), a.transpose(6, 5, 4, 3, 2, 1, 0))
    s = (t + 1.5).numpy()
    np.testing.assert_array_equal(s, a.transpose(6, 5, 4, 3, 2, 1, 0) + np.float32(1.5))


# ------------------------------------------------------------------ the contiguous kernel's blocks
def test_flat_kernel_blocks(device, monkeypatch):
    """kernels/elementwise.py's contiguous kernel (flat_block elements a program: f32 512,
    bf16 1024): an exact multiple of the block, a partial last block and a short tensor,
    int32 and int64 offsets; f32 and bf16; unary/binary/ternary, scalar and 0-dim operands,
    casts and copy_, into NaN-poisoned outputs."""
    if device != "interp":
        pytest.skip("the flat kernel is the triton path; interp runs it")
    ew = pytest.importorskip("nbxtensor.kernels.elementwise")
    g = rng()
    for low in (False, True):
        if low:
            monkeypatch.setattr(ew, "IDX64_LIMIT", 0)
            ew._launch_plan.cache_clear()
        for n in (1024 * 2, 1024 + 5, 3):
            for dt in (nbx.float32, nbx.bfloat16):
                x, y = randn((n,), dt, device, g), randn((n,), dt, device, g)
                a, b = to64(x), to64(y)
                rnd = lambda t: t.astype(dt.np).astype(np.float64)  # noqa: E731
                out = poisoned((n,), dt, device)
                nbx.neg(x, out=out)
                assert_close(out, -a)
                out = poisoned((n,), dt, device)
                nbx.add(x, y, out=out)
                assert_close(out, rnd(a + b))
                assert_close(nbx.exp(x), np.exp(a), dt)
                assert_close(x * 2.5, rnd(a * 2.5))
                assert_close(x * nbx.tensor(-1.5, dtype=dt, device=device), rnd(a * -1.5))
                assert_close(nbx.where(x > y, x, y), np.maximum(a, b))
                c = poisoned((n,), dt, device)
                c.copy_(x)
                np.testing.assert_array_equal(to64(c), a)
            c = poisoned((n,), nbx.bfloat16, device)
            xf = randn((n,), nbx.float32, device, g)
            c.copy_(xf)
            assert_close(c, to64(xf), nbx.bfloat16)
    ew._launch_plan.cache_clear()


def test_flat_chain_cuda(device):
    """The contiguous kernel on cuda: a chain of dependent ops queued back to back,
    3,000,001 elements (a partial last block)."""
    if device != "cuda":
        pytest.skip("cuda only; interp runs test_flat_kernel_blocks")
    g = rng()
    n = 3_000_001
    x, w = randn((n,), nbx.float32, device, g), randn((n,), nbx.bfloat16, device, g)
    a, b = to64(x), to64(w)
    for _ in range(3):
        y = nbx.neg(x)
        z = nbx.add(y, w)               # f32 + bf16 -> f32
        r = nbx.exp(z * 0.25)
        c = poisoned((n,), nbx.bfloat16, device)
        c.copy_(r)
    ref = np.exp((-a + b).astype(np.float32).astype(np.float64) * 0.25)
    assert_close(r, ref, nbx.float32)
    assert_close(c, ref, nbx.bfloat16)
