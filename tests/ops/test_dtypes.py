"""The dtype table, torch's promotion rules, and the documented cast rules (dtypes.py)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor import dtypes as D

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN/overflow casts on purpose

# ---------------------------------------------------------------- the table
TABLE = {  # name: (numpy dtype, triton spelling, size)
    "bool": (np.bool_, "u1", 1), "uint8": (np.uint8, "u8", 1), "int8": (np.int8, "i8", 1),
    "int16": (np.int16, "i16", 2), "int32": (np.int32, "i32", 4), "int64": (np.int64, "i64", 8),
    "float16": (np.float16, "fp16", 2), "bfloat16": (ml_dtypes.bfloat16, "bf16", 2),
    "float32": (np.float32, "fp32", 4), "float64": (np.float64, "fp64", 8),
    "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, "fp8e4nv", 1),
    "float8_e5m2": (ml_dtypes.float8_e5m2, "fp8e5", 1),
}


def test_table():
    assert [d.name for d in nbx.all_dtypes] == list(TABLE)
    for name, (npd, tri, size) in TABLE.items():
        d = getattr(nbx, name)
        assert d.np == np.dtype(npd) and d.triton == tri and d.itemsize == size
        assert d is D.as_dtype(name) is D.as_dtype(np.dtype(npd)) is D.as_dtype("torch." + name)
        assert repr(d) == f"nbxtensor.{name}"
        assert d.is_floating_point == (name.startswith("float") or name == "bfloat16")
    assert nbx.half is nbx.float16 and nbx.float is nbx.float32 and nbx.double is nbx.float64
    assert nbx.long is nbx.int64 and nbx.int is nbx.int32 and nbx.short is nbx.int16
    import pickle
    assert pickle.loads(pickle.dumps(nbx.bfloat16)) is nbx.bfloat16


@pytest.mark.parametrize("bad", ["float128", "complex32", np.dtype(">c8"), np.float128 if hasattr(
    np, "float128") else "f16x", 3, None, np.dtype(">f4")])
def test_unknown_dtype(bad):
    with pytest.raises(TypeError, match=r"dtype: unknown or unsupported dtype .*expected one of"):
        D.as_dtype(bad)
    with pytest.raises(TypeError, match="dtype"):
        nbx.zeros(2, dtype=bad if bad is not None else "nope")


def test_finfo_iinfo():
    assert nbx.finfo(nbx.float16).max == 65504.0
    assert nbx.finfo(nbx.bfloat16).eps == 2.0 ** -7
    assert nbx.finfo(nbx.float8_e4m3fn).max == 448.0
    assert nbx.finfo(nbx.float8_e5m2).max == 57344.0
    assert nbx.iinfo(nbx.int8).min == -128 and nbx.iinfo(nbx.uint8).max == 255
    with pytest.raises(TypeError, match="floating dtype"):
        nbx.finfo(nbx.int32)
    with pytest.raises(TypeError, match="integer dtype"):
        nbx.iinfo(nbx.float32)


# ---------------------------------------------------------------- torch's promotion table
# Written out from torch's c10 promotion lookup (rows and columns in this order).
_ORDER = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
          "float64"]
_A = {"b": "bool", "u8": "uint8", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
      "f16": "float16", "bf": "bfloat16", "f32": "float32", "f64": "float64"}
_TORCH_PROMOTION = """
      b    u8   i8   i16  i32  i64  f16  bf   f32  f64
b     b    u8   i8   i16  i32  i64  f16  bf   f32  f64
u8    u8   u8   i16  i16  i32  i64  f16  bf   f32  f64
i8    i8   i16  i8   i16  i32  i64  f16  bf   f32  f64
i16   i16  i16  i16  i16  i32  i64  f16  bf   f32  f64
i32   i32  i32  i32  i32  i32  i64  f16  bf   f32  f64
i64   i64  i64  i64  i64  i64  i64  f16  bf   f32  f64
f16   f16  f16  f16  f16  f16  f16  f16  f32  f32  f64
bf    bf   bf   bf   bf   bf   bf   f32  bf   f32  f64
f32   f32  f32  f32  f32  f32  f32  f32  f32  f32  f64
f64   f64  f64  f64  f64  f64  f64  f64  f64  f64  f64
"""


def _torch_table():
    rows = [r.split() for r in _TORCH_PROMOTION.strip().splitlines()]
    cols = [_A[c] for c in rows[0]]
    assert cols == _ORDER
    return {(_A[r[0]], c): _A[v] for r in rows[1:] for c, v in zip(cols, r[1:])}


def test_promote_types_all_pairs():
    table = _torch_table()
    assert len(table) == 100
    for (a, b), want in table.items():
        assert nbx.promote_types(a, b) is getattr(nbx, want), (a, b)
        assert nbx.promote_types(getattr(nbx, b), getattr(nbx, a)) is getattr(nbx, want)


def test_promote_float8():
    for f8 in (nbx.float8_e4m3fn, nbx.float8_e5m2):
        assert nbx.promote_types(f8, f8) is f8
        for other in nbx.all_dtypes:
            if other is not f8:
                with pytest.raises(TypeError, match="float8"):
                    nbx.promote_types(f8, other)
    with pytest.raises(TypeError, match="type1"):
        nbx.promote_types("nope", nbx.float32)


def _t(dtype, ndim=1):
    return nbx.zeros(*([2] * ndim), dtype=dtype)


@pytest.mark.parametrize("operands,want", [
    ((("int32", 1), 1.5), "float32"),
    ((("int32", 1), 5), "int32"),
    ((("uint8", 1), -1), "uint8"),
    ((("int8", 1), 1000), "int8"),
    ((("bool", 1), True), "bool"),
    ((("bool", 1), 1), "int64"),
    ((("bool", 1), 1.0), "float32"),
    ((("float16", 1), 1.0), "float16"),
    ((("bfloat16", 1), 1e30), "bfloat16"),
    ((("float16", 1), ("float64", 0)), "float16"),
    ((("int32", 1), ("float64", 0)), "float64"),
    ((("int32", 1), ("int64", 0)), "int32"),
    ((("int8", 1), ("uint8", 0)), "int8"),
    ((("uint8", 1), ("int8", 0)), "uint8"),
    ((("bool", 1), ("uint8", 0)), "uint8"),
    ((("int64", 0), 1.5), "float32"),
    ((("float16", 0), 1.5), "float16"),
    ((("int32", 0), ("float16", 0)), "float16"),
    ((("int8", 0), ("uint8", 0)), "int16"),
    ((("bool", 0), 2), "int64"),
    ((("bfloat16", 1), ("float16", 0)), "bfloat16"),
    ((("bfloat16", 1), ("float16", 1)), "float32"),
    ((("float32", 1), ("float64", 0), 1), "float32"),
    ((("int32", 1), ("bool", 0), 2.5), "float32"),
    ((1, 2.0), "float32"),
    ((1, True), "int64"),
    ((True, False), "bool"),
])
def test_result_type(operands, want):
    ops = [_t(getattr(nbx, o[0]), o[1]) if isinstance(o, tuple) else o for o in operands]
    assert nbx.result_type(*ops) is getattr(nbx, want)


def test_result_type_default_dtype():
    old = nbx.get_default_dtype()
    try:
        nbx.set_default_dtype(nbx.float64)
        assert nbx.result_type(_t(nbx.int32), 1.5) is nbx.float64
        assert nbx.result_type(_t(nbx.float16), 1.5) is nbx.float16
        assert nbx.tensor([1.5]).dtype is nbx.float64
        with pytest.raises(TypeError, match="floating"):
            nbx.set_default_dtype(nbx.int32)
    finally:
        nbx.set_default_dtype(old)


def test_result_type_errors():
    with pytest.raises(TypeError, match="at least one"):
        nbx.result_type()
    with pytest.raises(TypeError, match="expected tensors or Python numbers, got str"):
        nbx.result_type(_t(nbx.float32), "x")


# ---------------------------------------------------------------- the cast rules
_LOWP = [nbx.float16, nbx.bfloat16, nbx.float8_e4m3fn, nbx.float8_e5m2]
_UINT = {1: np.uint8, 2: np.uint16}


def _rne_reference(x: np.ndarray, dtype) -> np.ndarray:
    """Independent round-to-nearest-even of float64 values to `dtype`, as bit patterns.

    Enumerates every bit pattern of the target (8 or 16 bits): the nearest finite value
    wins, ties go to the even pattern, as if the exponent were unbounded; a result
    beyond max overflows (inf, or NaN for float8_e4m3fn), as documented in dtypes.py.
    """
    ut = _UINT[dtype.itemsize]
    bits = np.arange(2 ** (8 * dtype.itemsize - 1), dtype=ut)  # sign bit clear
    vals = bits.view(dtype.np).astype(np.float64)
    fin = np.isfinite(vals)
    bits, vals = bits[fin], vals[fin]
    order = np.argsort(vals, kind="stable")
    bits, vals = bits[order], vals[order]
    top, below = vals[-1], vals[-2]
    threshold = top + (top - below) / 2
    ax = np.abs(x)
    i = np.clip(np.searchsorted(vals, ax), 1, len(vals) - 1)
    lo, hi = vals[i - 1], vals[i]
    pick_hi = (hi - ax < ax - lo) | ((hi - ax == ax - lo) & (bits[i] % 2 == 0))
    out = np.where(pick_hi, bits[i], bits[i - 1]).astype(ut)
    out = np.where(ax <= vals[0], bits[0], out)
    sign = ut(1 << (8 * dtype.itemsize - 1))
    if dtype is nbx.float8_e4m3fn:
        special = ut(0x7F)
    else:
        special = np.array([np.inf], np.float64).astype(dtype.np).view(ut)[0]
    # at the tie max + ulp/2 the even neighbour is the next pattern when max's is odd
    over = (ax > threshold) | ((ax == threshold) & (bits[-1] % 2 == 1))
    out = np.where(over, special, out)
    nan = np.array([np.nan]).astype(dtype.np).view(ut)[0]
    out = np.where(np.isnan(x), nan, out)
    return np.where(np.signbit(x) & ~np.isnan(x), out | sign, out).astype(ut)


def _cast_inputs(dtype, gen):
    fi = nbx.finfo(dtype)
    a = np.concatenate([
        gen.standard_normal(300) * fi.max / 4,
        gen.standard_normal(300),
        gen.standard_normal(100) * fi.tiny,                 # subnormals
        [0.0, -0.0, np.inf, -np.inf, np.nan, fi.max, -fi.max, fi.tiny],
    ])
    # exact ties between neighbours and the overflow threshold, from the pattern table
    ut = _UINT[dtype.itemsize]
    b = np.arange(2 ** (8 * dtype.itemsize - 1), dtype=ut)
    v = b.view(dtype.np).astype(np.float64)
    v = np.sort(v[np.isfinite(v)])
    mids = (v[1:] + v[:-1]) / 2
    top = v[-1] + (v[-1] - v[-2]) / 2
    ties = gen.choice(mids, 300)
    return np.concatenate([a, ties, -ties, [top, -top, np.nextafter(top, 0)]])


@pytest.mark.parametrize("dtype", _LOWP, ids=lambda d: d.name)
def test_cast_float32_round_to_nearest_even(dtype, device):
    from helpers import rng
    a = _cast_inputs(dtype, rng()).astype(np.float32)
    got = nbx.tensor(a, device=device).to(dtype).numpy().view(_UINT[dtype.itemsize])
    want = _rne_reference(a.astype(np.float64), dtype)
    # NaN payloads may differ; compare NaN-ness, then the patterns
    got_nan = np.isnan(got.view(dtype.np).astype(np.float64))
    want_nan = np.isnan(want.view(dtype.np).astype(np.float64))
    np.testing.assert_array_equal(got_nan, want_nan)
    np.testing.assert_array_equal(got[~got_nan], want[~want_nan])
    # and ml_dtypes/NumPy agree with the same rule
    np.testing.assert_array_equal(a.astype(dtype.np).view(_UINT[dtype.itemsize])[~want_nan],
                                  want[~want_nan])


def test_cast_overflow_documented(device):
    f = lambda v, d: float(nbx.tensor([v], dtype=nbx.float64, device=device).to(d)  # noqa: E731
                           .numpy().astype(np.float64)[0])
    assert f(460.0, nbx.float8_e4m3fn) == 448.0
    assert f(464.0, nbx.float8_e4m3fn) == 448.0   # the tie rounds to even (448), not to NaN
    assert np.isnan(f(464.5, nbx.float8_e4m3fn))
    assert np.isnan(f(np.inf, nbx.float8_e4m3fn))
    assert f(61439.0, nbx.float8_e5m2) == 57344.0 and f(61440.0, nbx.float8_e5m2) == np.inf
    assert f(65519.0, nbx.float16) == 65504.0 and f(65520.0, nbx.float16) == np.inf
    assert f(-1e39, nbx.bfloat16) == -np.inf
    # float64 -> float16 rounds once; -> bfloat16 / float8 through float32 (documented)
    assert f(1 + 2 ** -11 + 2 ** -40, nbx.float16) == 1 + 2 ** -10
    assert f(1 + 2 ** -8 + 2 ** -40, nbx.bfloat16) == 1.0
    assert f(1 + 2 ** -4 + 2 ** -40, nbx.float8_e4m3fn) == 1.0
    assert f(1 + 2 ** -3 + 2 ** -40, nbx.float8_e5m2) == 1.0
    assert f(464 + 2 ** -30, nbx.float8_e4m3fn) == 448.0   # float32 makes it the tie: not NaN


@pytest.mark.parametrize("dtype", _LOWP, ids=lambda d: d.name)
def test_cast_float64_matches_rule(dtype, device):
    from helpers import rng
    a = _cast_inputs(dtype, rng())
    # ties and values a float64 ulp from them (where one rounding and two differ)
    a = np.concatenate([a, np.nextafter(a, np.inf), np.nextafter(a, -np.inf)])
    got = nbx.tensor(a, device=device).to(dtype).numpy().view(_UINT[dtype.itemsize])
    # the rule, independent of ml_dtypes: once for float16, through float32 for the others
    src = a if dtype is nbx.float16 else a.astype(np.float32).astype(np.float64)
    want = _rne_reference(src, dtype)
    nan = np.isnan(want.view(dtype.np).astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got.view(dtype.np).astype(np.float64)), nan)
    np.testing.assert_array_equal(got[~nan], want[~nan])


def test_cast_int_rules(device):
    a = np.array([-2.7, -0.5, 0.0, 0.5, 2.7, 127.9], np.float32)
    assert nbx.tensor(a, device=device).to(nbx.int32).tolist() == [-2, 0, 0, 0, 2, 127]
    assert nbx.tensor([0.0, -0.0, 0.1, np.nan], device=device).to(nbx.bool).tolist() == \
        [False, False, True, True]
    assert nbx.tensor([300, -1, 128], dtype=nbx.int32, device=device).to(nbx.uint8).tolist() == \
        [44, 255, 128]
    assert nbx.tensor([300, -129], dtype=nbx.int32, device=device).to(nbx.int8).tolist() == \
        [44, 127]
    assert nbx.tensor([2 ** 24 + 1, 3], dtype=nbx.int64, device=device).to(nbx.float32).tolist() \
        == [2.0 ** 24, 3.0]


# float64 values a hair above a tie of the target: float32 rounds them onto the tie, which
# goes to the even neighbour (1.0); rounding once would go up
_NEAR_TIE = [(nbx.bfloat16, 1 + 2 ** -8 + 2 ** -40), (nbx.float8_e4m3fn, 1 + 2 ** -4 + 2 ** -40),
             (nbx.float8_e5m2, 1 + 2 ** -3 + 2 ** -40)]


@pytest.mark.parametrize("dtype,v", _NEAR_TIE, ids=[d.name for d, _ in _NEAR_TIE])
def test_cast_rule_at_every_entry(dtype, v, device):
    """Every way a float64 or int64 value reaches a bf16/fp8 tensor follows the one rule."""
    f64 = nbx.tensor([v, -v], dtype=nbx.float64, device=device)
    got = {
        "tensor(list)": nbx.tensor([v, -v], dtype=dtype, device=device),
        "tensor(ndarray)": nbx.tensor(np.array([v, -v]), dtype=dtype, device=device),
        "to": f64.to(dtype),
        "copy_": nbx.empty(2, dtype=dtype, device=device).copy_(f64),
        "full": nbx.full((2,), v, dtype=dtype, device=device),
        "fill_": nbx.empty(2, dtype=dtype, device=device).fill_(-v),
        "arange": nbx.arange(v, v + 1, 2.0, dtype=dtype, device=device),
        "linspace": nbx.linspace(v, v, 2, dtype=dtype, device=device),
        "pad": nbx.pad(nbx.ones(1, dtype=dtype, device=device), (1, 0), value=v)[:1],
        "masked_fill": nbx.zeros(2, dtype=dtype, device=device).masked_fill(
            nbx.tensor([True, True], device=device), v),
        "add(out=)": nbx.add(f64, 0.0, out=nbx.empty(2, dtype=dtype, device=device)),
    }
    for what, t in got.items():
        vals = np.abs(t.numpy().astype(np.float64))
        assert (vals == 1.0).all(), f"{what} on {device}: {v!r} -> {vals}, expected 1.0"


@pytest.mark.parametrize("src", [nbx.int32, nbx.int64], ids=lambda d: d.name)
def test_cast_int_to_bfloat16_through_float32(src, device):
    from helpers import rng
    g = rng()
    k = g.integers(0, 2 ** 7, 200) * 2 + 1          # odd: 2**24 + k * 2**16 is a bf16 tie
    a = np.concatenate([2 ** 24 + k * 2 ** 16 + 1, -(2 ** 24 + k * 2 ** 16 + 1),
                        g.integers(-2 ** 31, 2 ** 31, 500)])
    got = nbx.tensor(a, dtype=src, device=device).to(nbx.bfloat16).numpy().view(np.uint16)
    want = _rne_reference(a.astype(np.float32).astype(np.float64), nbx.bfloat16)
    np.testing.assert_array_equal(got, want)
