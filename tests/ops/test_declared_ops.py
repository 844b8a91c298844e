"""The element-wise ops declared in ops/_declare.py (docs/design/ops-as-data.md).

* Adding a unary op is one line: a test op declared in a fixture gets its function (nbx,
  nbx.ops), Tensor method, in-place method, out=, cpu and interp implementations and its
  docs/ops.md row, and loses them all when it is undeclared.
* Every declared op matches a float64 NumPy reference (integer ops: computed in their own
  dtype) on every device, for every dtype its rule accepts: an independent reference for the
  built-in declarations (REF), the op's own NumPy expression for a new one; fresh random
  inputs, sizes that overhang the kernels' blocks, non-contiguous and broadcast operands,
  NaN/inf/signed zeros, NaN-poisoned outputs.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import RTOL, poisoned, randn, rng
from nbxtensor import dtypes as _dt
from nbxtensor.ops import _declare, _table
from nbxtensor.ops import elementwise as ew

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

FLAT = 4096 + 1          # 8 f32 / 4 bf16 blocks of the contiguous kernel + 1
DECLARED = list(_declare.OPS.values())

# input domains where the op is well conditioned (default: normal * 3)
DOMAIN = {"log": (1e-3, 1e3), "log2": (1e-3, 1e3), "log10": (1e-3, 1e3), "log1p": (-0.9, 10),
          "sqrt": (0, 100), "rsqrt": (0.01, 100), "reciprocal": (0.1, 10), "exp": (-10, 10),
          "exp2": (-14, 14), "expm1": (-3, 3), "tan": (-1.2, 1.2), "sin": (-6, 6),
          "cos": (-6, 6), "erf": (-3, 3), "erfinv": (-0.999, 0.999), "sinh": (-10, 10),
          "cosh": (-10, 10), "acosh": (1, 100), "atanh": (-0.999, 0.999), "asin": (-1, 1),
          "acos": (-1, 1), "logit": (1e-3, 1 - 1e-3)}
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _erfinv_bisect(y):
    """erfinv by bisection of math.erf on [-6, 6] (independent of the cpu's Newton steps)."""
    y = np.asarray(y, np.float64)
    inside = np.abs(y) < 1
    yy = np.where(inside, y, 0.0)
    lo, hi = np.full(y.shape, -6.0), np.full(y.shape, 6.0)
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        below = _erf(mid) < yy
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    r = np.where(yy == 0, y, 0.5 * (lo + hi))
    return np.where(np.abs(y) == 1, y * np.inf, np.where(inside, r, np.nan))


def _lae(x, y, exp, log):
    """log(exp(x) + exp(y)) around the larger operand; an infinite larger one is the result."""
    m = np.maximum(x, y)
    mf = np.where(np.isinf(m), 0.0, m)
    return np.where(np.isinf(m), m, mf + log(exp(x - mf) + exp(y - mf)))


def _nan_aware(f, x, y):
    """fmax / fmin: the other operand where one is NaN."""
    return np.where(x != x, y, np.where(y != y, x, f(x, y)))


def _sig(x):
    return 0.5 * (1 + np.tanh(0.5 * x))


def _lsh(x, y):
    bits = x.dtype.itemsize * 8
    ok = (y >= 0) & (y < bits)
    return np.where(ok, x.astype(np.int64) << np.where(ok, y, 0).astype(np.int64), 0)


def _rsh(x, y):
    bits = x.dtype.itemsize * 8
    ok = (y >= 0) & (y < bits)
    return np.where(ok, x.astype(np.int64) >> np.where(ok, y, 0).astype(np.int64),
                    np.where(x < 0, -1, 0))


# independent references (x, y, p, q) for the built-in declarations, written from torch's
# definitions rather than from the declared NumPy expressions (which the cpu runs); an op
# without one (a newly declared op) is checked against its own expression
REF = {
    "abs": lambda x, y, p, q: np.abs(x), "neg": lambda x, y, p, q: 0 - x if x.dtype.kind != "f"
    else -x, "sign": lambda x, y, p, q: np.sign(x), "exp": lambda x, y, p, q: np.exp(x),
    "exp2": lambda x, y, p, q: 2.0 ** x, "expm1": lambda x, y, p, q: np.expm1(x),
    "log": lambda x, y, p, q: np.log(x), "log2": lambda x, y, p, q: np.log(x) / np.log(2.0),
    "log10": lambda x, y, p, q: np.log(x) / np.log(10.0),
    "log1p": lambda x, y, p, q: np.log1p(x), "sqrt": lambda x, y, p, q: np.sqrt(x),
    "rsqrt": lambda x, y, p, q: 1.0 / np.sqrt(x), "reciprocal": lambda x, y, p, q: 1.0 / x,
    "sin": lambda x, y, p, q: np.sin(x), "cos": lambda x, y, p, q: np.cos(x),
    "tan": lambda x, y, p, q: np.sin(x) / np.cos(x), "tanh": lambda x, y, p, q: np.tanh(x),
    "sigmoid": lambda x, y, p, q: _sig(x), "erf": lambda x, y, p, q: _erf(x),
    "floor": lambda x, y, p, q: np.floor(x), "ceil": lambda x, y, p, q: np.ceil(x),
    "trunc": lambda x, y, p, q: np.trunc(x), "round": lambda x, y, p, q: np.rint(x),
    "isnan": lambda x, y, p, q: x != x, "isinf": lambda x, y, p, q: np.abs(x) == np.inf,
    "isfinite": lambda x, y, p, q: np.abs(x) < np.inf,
    "logical_not": lambda x, y, p, q: np.logical_not(x),
    "bitwise_not": lambda x, y, p, q: np.logical_not(x) if x.dtype == bool else ~x,
    "relu": lambda x, y, p, q: np.where(x > 0, x, np.where(x != x, x, 0)),
    "silu": lambda x, y, p, q: x * _sig(x),
    "mish": lambda x, y, p, q: x * np.tanh(np.where(x > 20, x, np.log1p(np.exp(x)))),
    "softplus": lambda x, y, p, q: np.where(p * x > q, x, np.log1p(np.exp(p * x)) / p),
    "elu": lambda x, y, p, q: np.where(x > 0, x, p * (np.exp(x) - 1)),
    "leaky_relu": lambda x, y, p, q: np.where(x > 0, x, p * x),
    "hardswish": lambda x, y, p, q: x * np.clip(x + 3, 0, 6) / 6,
    "hardsigmoid": lambda x, y, p, q: np.clip(x + 3, 0, 6) / 6,
    "gelu": lambda x, y, p, q: 0.5 * x * (1 + _erf(x / np.sqrt(2.0))),
    "gelu_tanh": lambda x, y, p, q: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi)
                                                           * (x + 0.044715 * x ** 3))),
    "glu": lambda x, y, p, q: x * _sig(y),
    "remainder": lambda x, y, p, q: np.mod(x, y), "fmod": lambda x, y, p, q: np.fmod(x, y),
    "maximum": lambda x, y, p, q: np.maximum(x, y), "minimum": lambda x, y, p, q: np.minimum(x, y),
    "atan2": lambda x, y, p, q: np.arctan2(x, y),
    "eq": lambda x, y, p, q: np.equal(x, y), "ne": lambda x, y, p, q: np.not_equal(x, y),
    "lt": lambda x, y, p, q: np.less(x, y), "le": lambda x, y, p, q: np.less_equal(x, y),
    "gt": lambda x, y, p, q: np.greater(x, y), "ge": lambda x, y, p, q: np.greater_equal(x, y),
    "logical_and": lambda x, y, p, q: np.logical_and(x, y),
    "logical_or": lambda x, y, p, q: np.logical_or(x, y),
    "logical_xor": lambda x, y, p, q: np.logical_xor(x, y),
    "bitwise_and": lambda x, y, p, q: np.bitwise_and(x, y),
    "bitwise_or": lambda x, y, p, q: np.bitwise_or(x, y),
    "bitwise_xor": lambda x, y, p, q: np.bitwise_xor(x, y),
    "bitwise_left_shift": lambda x, y, p, q: _lsh(x, y),
    "bitwise_right_shift": lambda x, y, p, q: _rsh(x, y),
    # issue 21's ops
    "frac": lambda x, y, p, q: np.fmod(x, 1.0) + 0.0,      # x - trunc(x): zeros are +0
    "erfinv": lambda x, y, p, q: _erfinv_bisect(x),
    "sinh": lambda x, y, p, q: 0.5 * (np.expm1(x) - np.expm1(-x)),
    "cosh": lambda x, y, p, q: 0.5 * (np.exp(x) + np.exp(-x)),
    "asinh": lambda x, y, p, q: np.where(x == 0, x, np.sign(x) * np.log(np.abs(x)
                                                                  + np.sqrt(x * x + 1))),
    "acosh": lambda x, y, p, q: np.where(x < 1, np.nan, np.log(x + np.sqrt(x * x - 1))),
    "atanh": lambda x, y, p, q: np.where(x == 0, x, 0.5 * np.log((1 + x) / (1 - x))),
    "asin": lambda x, y, p, q: np.arctan2(x, np.sqrt(1 - x * x)),
    "acos": lambda x, y, p, q: np.arctan2(np.sqrt(1 - x * x), x),
    "atan": lambda x, y, p, q: np.arctan2(x, np.ones_like(x)),
    "sinc": lambda x, y, p, q: np.where(x == 0, 1.0, np.sin(np.pi * x) / (np.pi * x)),
    "deg2rad": lambda x, y, p, q: x * np.pi / 180, "rad2deg": lambda x, y, p, q: x * 180 / np.pi,
    "signbit": lambda x, y, p, q: np.copysign(1.0, x) < 0 if x.dtype.kind == "f" else x < 0,
    "logit": lambda x, y, p, q: np.log(x) - np.log1p(-x),
    "hypot": lambda x, y, p, q: np.where(np.isinf(x) | np.isinf(y), np.inf,
                                         np.sqrt(x * x + y * y)),
    "heaviside": lambda x, y, p, q: np.where(x < 0, 0, np.where(x > 0, 1, np.where(x == 0, y, 0))),
    "copysign": lambda x, y, p, q: np.where(np.signbit(y), -np.abs(x), np.abs(x)),
    "fmax": lambda x, y, p, q: _nan_aware(np.maximum, x, y),
    "fmin": lambda x, y, p, q: _nan_aware(np.minimum, x, y),
    "xlogy": lambda x, y, p, q: np.where(y != y, np.nan, np.where(x == 0, 0.0, x * np.log(y))),
    "logaddexp": lambda x, y, p, q: _lae(x, y, np.exp, np.log),
    "logaddexp2": lambda x, y, p, q: _lae(x, y, np.exp2, np.log2),
    # in the operands' own dtype (_reference): the step is the dtype's
    "nextafter": lambda x, y, p, q: np.nextafter(x, y),
    "ldexp": lambda x, y, p, q: x * 2.0 ** y,
}


def _int_div0(f, x, y):
    """f(x, y) for integers with division by zero giving 0 (nbx's documented value)."""
    if x.dtype.kind in "fc":
        return f(x, y)
    ys = np.where(y == 0, 1, y).astype(x.dtype)
    return np.where(y == 0, 0, f(x, ys)).astype(x.dtype)


def _trunc_div(x, y):
    q = np.abs(x) // np.abs(y)
    return np.where((x < 0) != (y < 0), -q, q).astype(x.dtype)


def _int_pow(x, y):
    """integer powers by repeated multiplication (wrapping in the dtype); negative exponents
    give 0 except for the bases 1 and -1; bool: x or not y."""
    if x.dtype.kind in "fc":
        return np.power(x, y)
    if x.dtype == np.bool_:
        return x | ~y
    r = np.ones_like(x)
    e = np.where(y < 0, 0, y).astype(np.int64)
    with np.errstate(all="ignore"):
        for k in range(int(e.max(initial=0))):
            r = np.where(k < e, r * x, r).astype(x.dtype)
    neg = np.where(x == 1, 1, np.where(x == -1, np.where(y % 2 != 0, -1, 1), 0))
    return np.where(y < 0, neg, r).astype(x.dtype)


# arithmetic, clamp and the ternaries: (x, y, z, p, q) with the parameters of PARAMS
REF.update({
    "copy": lambda x, y, z, p, q: x,
    "add": lambda x, y, z, p, q: x + y,
    "add_alpha": lambda x, y, z, p, q: x + y * p,
    "sub": lambda x, y, z, p, q: x - y,
    "sub_alpha": lambda x, y, z, p, q: x - y * p,
    "mul": lambda x, y, z, p, q: x * y,
    "div": lambda x, y, z, p, q: x / y,
    "floor_divide": lambda x, y, z, p, q: np.floor_divide(x, y) if x.dtype.kind == "f" else
    _int_div0(lambda a, b: a // b, x, y),
    "div_trunc": lambda x, y, z, p, q: np.trunc(x / y) if x.dtype.kind == "f" else
    _int_div0(_trunc_div, x, y),
    "pow": lambda x, y, z, p, q: _int_pow(x, y),
    "clamp": lambda x, y, z, p, q: np.where(np.isnan(z), z, np.where(
        np.isnan(x) | np.isnan(y), np.nan, np.minimum(np.fmax(x, y), z))) if x.dtype.kind == "f"
    else np.minimum(np.maximum(x, y), z),
    "clamp_min": lambda x, y, z, p, q: np.where(x < y, y, x) if x.dtype.kind != "f" else
    np.where(np.isnan(x) | np.isnan(y), np.nan, np.fmax(x, y)),
    "clamp_max": lambda x, y, z, p, q: np.where(x > y, y, x) if x.dtype.kind != "f" else
    np.where(np.isnan(x) | np.isnan(y), np.nan, np.fmin(x, y)),
    "nan_to_num": lambda x, y, z, p, q: np.where(x != x, 1.5, np.where(
        x == np.inf, 100.0, np.where(x == -np.inf, -100.0, x))),
    "where": lambda x, y, z, p, q: np.where(x != 0, y, z),
    "lerp": lambda x, y, z, p, q: x + z * (y - x),
    "addcmul": lambda x, y, z, p, q: x + y * z * p,
    "addcdiv": lambda x, y, z, p, q: x + p * y / z,
})
# the parameters (p, q) a call of these passes, and the call
PARAMS = {"add_alpha": (2, 0), "sub_alpha": (2, 0), "addcmul": (2, 0), "addcdiv": (0.5, 0),
          "nan_to_num": (1.5, 0)}
_THREE = {"copy", "add", "add_alpha", "sub", "sub_alpha", "mul", "div", "floor_divide",
          "div_trunc", "pow", "clamp", "clamp_min", "clamp_max", "nan_to_num", "where", "lerp",
          "addcmul", "addcdiv"}
# ulps of the dtype's RTOL
LOOSE = {"tan": 4, "exp": 4, "exp2": 4, "remainder": 4, "fmod": 4, "sinh": 4, "cosh": 4,
         "erfinv": 4, "sinc": 4, "acosh": 4, "atanh": 4, "logit": 4, "logaddexp2": 2}


def _float_inputs(shape, dtype, device, dom, g, special=True):
    a = g.standard_normal(shape) * 3 if dom is None else g.uniform(dom[0], dom[1], shape)
    a = np.where(a == 0, 0.5, a)
    if special and dom is None:
        flat = a.reshape(-1)
        n = flat.size
        flat[[1 % n, 7 % n, n // 3, n // 2, n - 2, n - 1]] = [np.nan, np.inf, -np.inf, 0.0,
                                                              -0.0, np.nan]
    return nbx.tensor(_dt.cast(a, dtype), device=device)


def _inputs(op, shape, dtype, device, g):
    if dtype.kind == "f":
        return _float_inputs(shape, dtype, device, DOMAIN.get(op.name), g)
    return randn(shape, dtype, device, gen=g)


def _result_dtype(op, d):
    if op.rule in ("pred", "cmp", "logical"):
        return _dt.bool
    if op.rule in ("float", "tofloat") and d.kind != "f":
        return _dt.get_default_dtype()
    return d


def _reference(op, xs, res, params=None):
    """op's NumPy expression on the inputs' values: in float64 for a float computation, in
    the dtype itself for integers and bools; then cast to the result dtype by nbx's rule.
    params: the op's parameters (default: the declared defaults)."""
    if params is None:
        params = PARAMS.get(op.name) or (
            [float(v) for _, v in op.params] + [0.0] * (2 - len(op.params)))
    ct = ew._compute_dtype(ew._default_float_if_int(xs[0].dtype) if op.rule in (
        "float", "tofloat") else xs[0].dtype)
    vals = [x.numpy() for x in xs]
    if ct.kind == "f" and op.rule != "f3264":
        vals = [v.astype(np.float64) for v in vals]
        p = [np.float64(v) for v in params]
    else:
        vals = [v.astype(ct.np) for v in vals]
        p = [ct.np.type(v) for v in params] if ct is not _dt.bool else [bool(v) for v in params]
    vals += [None] * (3 - len(vals))
    fn = REF.get(op.name)
    if fn is None:
        from nbxtensor.backends.cpu import elementwise as cpu
        fn = eval(f"lambda x, y, z, p, q: ({op.np})", dict(cpu.EXPR_NAMESPACE))
    elif op.name not in _THREE:
        vals = vals[:2]
    with np.errstate(all="ignore"):
        r = np.asarray(fn(*vals, *p))
        return _dt.cast(r, res)


def _check(got, want, op, dtype):
    assert got.dtype is _dt.as_dtype(want.dtype) or got.dtype.np == want.dtype, \
        (op.name, got.dtype, want.dtype)
    g = got.numpy()
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(g, want, err_msg=f"{op.name} {dtype.name}")
        return
    r = RTOL[got.dtype] * LOOSE.get(op.name, 1)
    if op.form == "activation" or op.name in ("glu", "gelu", "gelu_tanh"):
        r *= 2
    np.testing.assert_allclose(g.astype(np.float64), want.astype(np.float64), rtol=r, atol=r,
                               equal_nan=True, err_msg=f"{op.name} {dtype.name}")


# the hand-written functions over the declared entries of form "entry"
_ENTRY_CALL = {"round": nbx.round, "gelu": nbx.gelu, "logit": nbx.logit,
               "gelu_tanh": lambda x: nbx.gelu(x, approximate="tanh"),
               "add_alpha": lambda x, y: nbx.add(x, y, alpha=2),
               "sub_alpha": lambda x, y: nbx.sub(x, y, alpha=2),
               "div_trunc": lambda x, y: nbx.div(x, y, rounding_mode="trunc"),
               # the functions whose operands are not all the test's tensors
               "where": lambda x, y, z: nbx.where(x != 0, y, z),
               "nan_to_num": lambda x, y, z: nbx.nan_to_num(x, 1.5, 100.0, -100.0),
               "addcmul": lambda x, y, z: nbx.addcmul(x, y, z, value=2),
               "addcdiv": lambda x, y, z: nbx.addcdiv(x, y, z, value=0.5)}


def _call(op, *xs, out=None):
    """The op through its public function (form 'entry': the hand-written one over it)."""
    if op.form == "entry" and op.name not in _ENTRY_CALL:     # glu: its two halves
        res = _result_dtype(op, xs[0].dtype)
        return ew._run(op.entry, op.name, list(xs), ["input"] * len(xs), res, out=out)
    f = _ENTRY_CALL.get(op.name) or getattr(nbx, op.name)
    return f(*xs) if out is None else f(*xs, out=out)


@pytest.mark.parametrize("op", DECLARED, ids=lambda o: o.name)
def test_declared_op_matches_its_numpy_reference(device, op):
    assert op.name in REF, f"{op.name}: add an independent float64 reference to REF"
    g = rng()
    for name in op.dtypes:
        dtype = _dt.as_dtype(name)
        xs = [_inputs(op, (FLAT,), dtype, device, g) for _ in range(op.arity)]
        res = _result_dtype(op, dtype)
        want = _reference(op, xs, res)
        _check(_call(op, *xs), want, op, dtype)
        if op.form in ("math", "binary") or op.name in ("round", "logit"):   # NaN-poisoned out=
            out = poisoned((FLAT,), res, device)
            assert _call(op, *xs, out=out) is out
            _check(out, want, op, dtype)
        # non-contiguous: a transposed 2-D view (2-D tile kernel), a step-2 slice (strided)
        base = [_inputs(op, (343, 6), dtype, device, g) for _ in range(op.arity)]
        for view in (lambda t: t.t(), lambda t: t[::2, 1:5]):
            vs = [view(b) for b in base]
            assert not vs[0].is_contiguous()
            _check(_call(op, *vs), _reference(op, [v.contiguous() for v in vs], res), op, dtype)
        if op.arity == 2:                          # broadcast (stride 0) second operand
            a = _inputs(op, (5, 343), dtype, device, g)
            b = _inputs(op, (1, 343), dtype, device, g)
            _check(_call(op, a, b), _reference(op, [a, b.expand(5, 343).contiguous()], res),
                   op, dtype)


def test_declared_activation_parameters(device):
    g = rng()
    x = _float_inputs((FLAT,), nbx.float32, device, None, g)
    for name, kwargs in (("softplus", dict(beta=2.0, threshold=5.0)), ("elu", dict(alpha=0.5)),
                         ("leaky_relu", dict(negative_slope=0.2))):
        op = _declare.OPS[name]
        got = getattr(nbx, name)(x, **kwargs)
        params = list(kwargs.values())
        want = _reference(op, [x], nbx.float32, params=params + [0.0] * (2 - len(params)))
        _check(got, want, op, nbx.float32)
        if op.inplace:
            z = x.clone()
            assert getattr(nbx, name)(z, **kwargs, inplace=True) is z
            _check(z, want, op, nbx.float32)


def test_declared_in_place_methods(device):
    g = rng()
    for op in DECLARED:
        if op.form != "math" or op.inplace is not True or not op.method:
            continue
        dtype = nbx.float32 if "float32" in op.dtypes else nbx.int32
        x = _inputs(op, (FLAT,), dtype, device, g)
        want = _reference(op, [x], _result_dtype(op, dtype))
        z = x.clone()
        assert getattr(z, op.name + "_")() is z
        _check(z, want, op, dtype)


# ----------------------------------------------------------------------------- one line
@pytest.fixture
def cube_op():
    """A unary op declared in one line, undeclared afterwards."""
    op = _declare.unary("cube_test_op", "float", "x * x * x", "x * x * x")
    try:
        yield op
    finally:
        _declare.undeclare(op.entry)


def test_adding_a_unary_op_is_one_line(cube_op, device):
    import nbxtensor.ops as nops
    from nbxtensor.dispatch import impl
    name = cube_op.name
    assert getattr(nbx, name) is getattr(nops, name) is getattr(ew, name)
    assert name in ew.__all__
    g = rng()
    x = _float_inputs((FLAT,), nbx.float32, device, None, g)
    x64 = x.numpy().astype(np.float64)
    want = (x64 ** 3).astype(np.float32)
    for got in (getattr(nbx, name)(x), getattr(x, name)()):
        assert got.dtype is nbx.float32 and got.device == x.device
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-6, atol=2e-6, equal_nan=True)
    out = poisoned((FLAT,), nbx.float32, device)
    assert getattr(nbx, name)(x, out=out) is out
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-6, atol=2e-6, equal_nan=True)
    z = x.clone()
    assert getattr(z, name + "_")() is z
    np.testing.assert_allclose(z.numpy(), want, rtol=2e-6, atol=2e-6, equal_nan=True)
    # the rule: ints promote to the default float; a float result can't go into an int self
    i = randn((7,), nbx.int32, device)
    assert getattr(nbx, name)(i).dtype is nbx.float32
    with pytest.raises(TypeError, match="can't be cast"):
        getattr(i, name + "_")()
    assert impl(name, nbx.device("cpu")) is not None
    assert "| `cube_test_op` |" in "\n".join(_table.declared_rows())
    assert name in ew.SUPPORTED_DTYPES


def test_an_undeclared_op_leaves_nothing_behind(device):
    import nbxtensor.ops as nops
    from nbxtensor.dispatch import NotImplementedOnDevice, impl
    op = _declare.unary("gone_test_op", "keep", "x + x", "x + x")
    x = randn((5,), nbx.float32, device)
    np.testing.assert_array_equal(x.gone_test_op().numpy(), x.numpy() * 2)
    _declare.undeclare(op.entry)
    for mod in (nbx, nops, ew):
        assert not hasattr(mod, "gone_test_op")
    assert not hasattr(x, "gone_test_op") and not hasattr(x, "gone_test_op_")
    assert "gone_test_op" not in ew.__all__ and "gone_test_op" not in _table.generate()
    with pytest.raises(NotImplementedOnDevice):
        impl("gone_test_op", x.device)


def test_a_bad_declaration_is_refused_and_leaves_nothing_behind():
    n = len(_declare.OPS)
    with pytest.raises(ValueError, match="rule must be one of"):
        _declare.unary("bad_test_op", "floaty", "x", "x")
    with pytest.raises(ValueError, match="already declared"):
        _declare.unary("exp", "float", "np.exp(x)", "_exp(x, INTERP)")
    with pytest.raises(ValueError, match="NumPy expression .* names 'npp'"):
        _declare.unary("bad_test_op", "float", "npp.exp(x)", "x")
    with pytest.raises(ValueError, match="does not parse"):
        _declare.unary("bad_test_op", "float", "np.exp(x", "x")
    with pytest.raises(ValueError, match="already exists"):
        _declare.unary("add", "float", "x", "x", entry="add_test_entry")
    assert len(_declare.OPS) == n and not hasattr(nbx, "bad_test_op")


def test_a_bad_triton_expression_is_refused():
    pytest.importorskip("triton")
    import nbxtensor.kernels.elementwise  # noqa: F401 - the kernels check the Triton expression
    with pytest.raises(ValueError, match="Triton expression .* names 'tl_exp'"):
        _declare.unary("bad_test_op", "float", "np.exp(x)", "tl_exp(x)")
    assert "bad_test_op" not in _declare.OPS and not hasattr(nbx, "bad_test_op")


def test_declared_kernel_body_compiles_for_sm90():
    """The generated `_apply` branches compile to PTX for sm_90 (float32, bfloat16, float64)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from nbxtensor.kernels import _triton as _tr
    if not _tr.REAL:
        pytest.skip("the Triton stand-in cannot compile")
    from nbxtensor.kernels import elementwise as K
    tl = _tr.tl
    for name, dt in (("exp", "f32"), ("gelu_tanh", "bf16"), ("atan2", "f64"), ("lt", "bf16")):
        op = _declare.OPS[name]
        ptr = {"f32": "*fp32", "bf16": "*i16", "f64": "*fp64"}[dt]
        enc = "bf" if dt == "bf16" else "n"
        two = op.arity == 2
        outp = "*u8" if op.rule == "cmp" else ptr
        sc = "i64" if dt == "f64" else "fp32"
        sig = {"out": outp, "a": ptr, "b": ptr if two else outp, "c": outp, "sa": sc, "sb": sc,
               "sc": sc, "p0": sc, "p1": sc, "N": "i32"}
        cx = dict(OP=op.entry, CT=tl.float64 if dt == "f64" else tl.float32, MA="t",
                  MB="t" if two else "z", MC="z", EA=enc, EB=enc if two else "n", EC="n",
                  EO="b" if outp == "*u8" else enc, F64S=dt == "f64", IDX64=False,
                  INTERP=False, BLOCK=512)
        sig.update({k: "constexpr" for k in cx})
        k = triton.compile(triton.compiler.ASTSource(fn=K._ew_flat_kernel, signature=sig,
                                                     constexprs=cx),
                           target=GPUTarget("cuda", 90, 64), options={"num_warps": 4})
        assert "ld.global" in k.asm["ptx"], (name, dt)


# ----------------------------------------------------------------------------- issue 21's ops
NEW_UNARY = ("frac", "erfinv", "sinh", "cosh", "asinh", "acosh", "atanh", "asin", "acos", "atan",
             "sinc", "deg2rad", "rad2deg", "signbit", "logit")
NEW_BINARY = ("hypot", "heaviside", "copysign", "fmax", "fmin", "xlogy", "logaddexp",
              "logaddexp2", "nextafter", "ldexp")
# the domain edges, the special values, and values either side of them
EDGES = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1 + 2 ** -20,
                  -1 - 2 ** -20, 1 - 2 ** -20, 2.5, -2.5, 1e-30, -1e-30, 3.0, 80.0, -80.0,
                  1e20, -1e20])


def _same_signed(got, want, name):
    """Equal (NaN to NaN) with the sign of every zero."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    zero = (w == 0) & (g == 0)
    bad = zero & (np.signbit(g) != np.signbit(w))
    assert not bad.any(), (name, EDGES[bad] if g.size == EDGES.size else None)


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.float64], ids=lambda d: d.name)
def test_new_ops_at_domain_edges(device, dtype):
    """Every pair of edge values: NaN/inf, signed zeros, the domain bounds (+-1, 0) and either
    side of them; signed zeros must match the reference."""
    x = nbx.tensor(EDGES.astype(dtype.np), device=device)
    a = np.repeat(EDGES, EDGES.size).astype(dtype.np)
    b = np.tile(EDGES, EDGES.size).astype(dtype.np)
    xa, xb = nbx.tensor(a, device=device), nbx.tensor(b, device=device)
    for name in NEW_UNARY + NEW_BINARY:
        op = _declare.OPS[name]
        xs = [x] if op.arity == 1 else [xa, xb]
        res = _result_dtype(op, dtype)
        want = _reference(op, xs, res)
        got = _call(op, *xs)
        _check(got, want, op, dtype)
        if got.dtype.kind == "f":
            _same_signed(got.numpy(), want, name)


def test_new_ops_dtype_rules(device):
    i = nbx.tensor(np.array([1, 2, 3], np.int32), device=device)
    h = nbx.tensor(np.array([1, 2, 3], np.float16), device=device)
    for name in ("erfinv", "sinh", "asin", "atan", "sinc", "deg2rad", "logit"):
        assert getattr(nbx, name)(i).dtype is nbx.get_default_dtype(), name
    for name in ("copysign", "xlogy", "ldexp"):
        assert getattr(nbx, name)(i, i).dtype is nbx.get_default_dtype(), name
    assert nbx.fmax(i, i).dtype is nbx.int32 and nbx.heaviside(i, i).dtype is nbx.int32
    assert nbx.signbit(i).dtype is nbx.bool and nbx.signbit(h).dtype is nbx.bool
    with pytest.raises(TypeError, match="frac: expected a floating point tensor, got int32"):
        nbx.frac(i)
    for name in ("hypot", "logaddexp", "logaddexp2"):
        with pytest.raises(TypeError, match=f"{name}: expected floating point operands"):
            getattr(nbx, name)(i, i)
    with pytest.raises(TypeError, match="nextafter: expected float32 or float64 operands, got "
                                        "float16"):
        nbx.nextafter(h, h)
    with pytest.raises(TypeError, match="can't be cast"):
        i.sinh_()
    # the aliases are the same functions, and methods
    for alias, name in (("arcsinh", "asinh"), ("arccosh", "acosh"), ("arctanh", "atanh"),
                        ("arcsin", "asin"), ("arccos", "acos"), ("arctan", "atan"),
                        ("arctan2", "atan2"), ("negative", "neg")):
        assert getattr(nbx, alias) is getattr(nbx, name), alias
        assert hasattr(nbx.Tensor, alias) and hasattr(nbx.Tensor, alias + "_"), alias
    assert nbx.true_divide(i, i).dtype is nbx.get_default_dtype()


def test_logit_eps_and_in_place(device):
    g = rng()
    v = g.uniform(-0.2, 1.2, FLAT)
    v[[0, 1, 2, 3, 4]] = [np.nan, 0.0, 1.0, -0.0, 1e-9]
    for dtype in (nbx.float32, nbx.float64):
        x = nbx.tensor(v.astype(dtype.np), device=device)
        x64 = x.numpy().astype(np.float64)
        for eps in (None, 1e-6, 0.25):
            # the bounds in the dtype, as torch (1 - eps rounds there)
            lo, hi = (float(dtype.np.type(eps)), float(dtype.np.type(1) - dtype.np.type(eps))) \
                if eps is not None else (0, 0)
            c = x64 if eps is None else np.where(x64 != x64, x64, np.clip(x64, lo, hi))
            with np.errstate(all="ignore"):
                want = (np.log(c) - np.log1p(-c)).astype(dtype.np)
            out = poisoned((FLAT,), dtype, device)
            assert nbx.logit(x, eps, out=out) is out
            for got in (nbx.logit(x, eps=eps), x.logit(eps), out):
                np.testing.assert_allclose(got.numpy(), want, rtol=4 * RTOL[dtype],
                                           atol=4 * RTOL[dtype], equal_nan=True)
            z = x.clone()
            assert z.logit_(eps) is z
            np.testing.assert_allclose(z.numpy(), want, rtol=4 * RTOL[dtype],
                                       atol=4 * RTOL[dtype], equal_nan=True)
    i = nbx.tensor(np.array([0, 1], np.int64), device=device)
    assert nbx.logit(i).dtype is nbx.get_default_dtype()
    with pytest.raises(TypeError, match="logit: eps must be a float or None"):
        nbx.logit(x, eps="0.1")


def test_rsub_float_power_positive(device):
    g = rng()
    a, b = (randn((343, 5), nbx.float32, device, gen=g) for _ in range(2))
    a64, b64 = a.numpy().astype(np.float64), b.numpy().astype(np.float64)
    np.testing.assert_allclose(nbx.rsub(a, b).numpy(), b64 - a64, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(nbx.rsub(a, b, alpha=3).numpy(), b64 - 3 * a64, rtol=2e-6,
                               atol=2e-6)
    np.testing.assert_allclose(nbx.rsub(a, 2.5).numpy(), 2.5 - a64, rtol=2e-6, atol=2e-6)
    # float_power: in float64 from float32 / int operands
    pa = nbx.abs(a)
    r = nbx.float_power(pa, b)
    assert r.dtype is nbx.float64
    np.testing.assert_allclose(r.numpy(), np.abs(a64) ** b64, rtol=1e-12, atol=1e-12)
    i = nbx.tensor(np.array([2, 3, 5], np.int32), device=device)
    r = nbx.float_power(i, -1)
    assert r.dtype is nbx.float64
    np.testing.assert_allclose(r.numpy(), 1.0 / np.array([2, 3, 5.0]), rtol=1e-15)
    out = poisoned((343, 5), nbx.float64, device)
    assert nbx.float_power(pa, 2, out=out) is out
    np.testing.assert_allclose(out.numpy(), np.abs(a64) ** 2, rtol=1e-12)
    z = pa.to(nbx.float64)
    assert z.float_power_(0.5) is z
    np.testing.assert_allclose(z.numpy(), np.sqrt(np.abs(a64)), rtol=1e-12)
    with pytest.raises(TypeError, match="float_power_: .*self must be float64"):
        pa.float_power_(2)
    assert nbx.positive(a) is a and a.positive() is a
    # torch's in-place spellings of the arithmetic
    for meth, want in (("true_divide_", a64 / b64), ("divide_", a64 / b64),
                       ("multiply_", a64 * b64), ("subtract_", a64 - b64)):
        z = a.clone()
        assert getattr(z, meth)(b) is z
        np.testing.assert_allclose(z.numpy(), want, rtol=2e-6, atol=2e-6, err_msg=meth)
    z = a.clone()
    z.divide_(b, rounding_mode="floor")
    np.testing.assert_allclose(z.numpy(), np.floor(a64 / b64), rtol=2e-6, atol=2e-6)
    with pytest.raises(TypeError, match="positive: not supported for bool tensors"):
        nbx.positive(a > 0)


def test_special_aliases():
    import nbxtensor.special as sp
    assert sp.expit is nbx.sigmoid and sp.logit is nbx.logit and sp.erfinv is nbx.erfinv
    assert sp.xlogy is nbx.xlogy and sp.sinc is nbx.sinc


def _compile_sm90(op, dt):
    import triton
    from triton.backends.compiler import GPUTarget
    from nbxtensor.kernels import _triton as _tr
    from nbxtensor.kernels import elementwise as K
    tl = _tr.tl
    ptr = {"f32": "*fp32", "bf16": "*i16", "f64": "*fp64", "i32": "*i32"}[dt]
    enc = "bf" if dt == "bf16" else "n"
    two, three = op.arity >= 2, op.arity == 3
    outp = "*u8" if op.rule in ("cmp", "pred") else ptr
    sc = {"f64": "i64", "i32": "i32"}.get(dt, "fp32")
    sig = {"out": outp, "a": ptr, "b": ptr if two else outp, "c": ptr if three else outp,
           "sa": sc, "sb": sc, "sc": sc, "p0": sc, "p1": sc, "N": "i32"}
    ct = {"f64": tl.float64, "i32": tl.int32}.get(dt, tl.float32)
    cx = dict(OP=op.entry, CT=ct, MA="t", MB="t" if two else "z", MC="t" if three else "z",
              EA=enc, EB=enc if two else "n", EC=enc if three else "n",
              EO="b" if outp == "*u8" else enc, F64S=dt == "f64", IDX64=False,
              INTERP=False, BLOCK=512)
    sig.update({k: "constexpr" for k in cx})
    k = triton.compile(triton.compiler.ASTSource(fn=K._ew_flat_kernel, signature=sig,
                                                 constexprs=cx),
                       target=GPUTarget("cuda", 90, 64), options={"num_warps": 4})
    assert "ld.global" in k.asm["ptx"], (op.name, dt)


@pytest.mark.parametrize("name", NEW_UNARY + NEW_BINARY)
def test_new_kernel_branches_compile_for_sm90(name):
    """Issue 21's branches (libdevice on cuda) compile to PTX for sm_90 in float32 and float64
    (bfloat16 computes in float32: the same branch)."""
    pytest.importorskip("triton")
    from nbxtensor.kernels import _triton as _tr
    if not _tr.REAL:
        pytest.skip("the Triton stand-in cannot compile")
    for dt in ("f32", "f64"):
        _compile_sm90(_declare.OPS[name], dt)


def test_new_binary_in_place_methods(device):
    g = rng()
    for name in NEW_BINARY:
        op = _declare.OPS[name]
        if not op.inplace:
            continue
        a, b = (_float_inputs((FLAT,), nbx.float32, device, None, g) for _ in range(2))
        want = _reference(op, [a, b], nbx.float32)
        z = a.clone()
        assert getattr(z, name + "_")(b) is z
        _check(z, want, op, nbx.float32)


# ----------------------------------------------------------------------------- reductions
# independent float64 references of the declared reductions (ops/_declare.py reduction(...))
REDUCE_REF = {
    "sum": lambda a, ax: np.sum(a, axis=ax), "prod": lambda a, ax: np.prod(a, axis=ax),
    "mean": lambda a, ax: np.mean(a, axis=ax), "amax": lambda a, ax: np.max(a, axis=ax),
    "amin": lambda a, ax: np.min(a, axis=ax), "any": lambda a, ax: np.any(a != 0, axis=ax),
    "all": lambda a, ax: np.all(a != 0, axis=ax),
    "count_nonzero": lambda a, ax: np.count_nonzero(a, axis=ax),
    "argmax": lambda a, ax: np.argmax(a, axis=ax), "argmin": lambda a, ax: np.argmin(a, axis=ax),
}
REDUCTIONS = list(_declare.REDUCTIONS.values())


@pytest.mark.parametrize("op", REDUCTIONS, ids=lambda o: o.name)
def test_declared_reduction_matches_its_reference(device, op):
    assert op.name in REDUCE_REF, f"{op.name}: add an independent float64 reference"
    fn = getattr(nbx, op.name)
    assert callable(getattr(nbx.Tensor, op.name, None))     # (the axis= alias wraps both)
    g = rng()
    # 70 columns overhang the interp row block (32); prod on values near 1 stays finite
    a = g.uniform(0.9, 1.1, (37, 70)) if op.name == "prod" else g.standard_normal((37, 70))
    a[3, 5] = 0.0
    x = nbx.tensor(a.astype(np.float32), device=device)
    ref64 = a.astype(np.float32).astype(np.float64)
    dims = (0, 1, -1) if op.dims == "one" else (None, 0, 1, (0, 1))
    for view, r in ((lambda t: t, ref64), (lambda t: t.t(), ref64.T)):
        for dim in dims:
            got = fn(view(x), dim) if dim is not None else fn(view(x))
            want = REDUCE_REF[op.name](r, dim if not isinstance(dim, tuple) else dim)
            if op.rule in ("index", "count", "bool"):
                np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{op.name} {dim}")
            else:
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4,
                                           err_msg=f"{op.name} {dim}")
    # the kernel's steps and the cpu expression come from the declaration
    from nbxtensor.backends.cpu import reduction as cpu_red
    assert op.kind in cpu_red._DECLARED
    assert any(f"| `{op.name}` |" in row for row in _table.reduction_rows())
    if device != "cpu":
        from nbxtensor.kernels import reduction as rk
        assert rk._SIMPLE[op.kind] == tuple(getattr(rk, c) for c in op.tl)


# the arithmetic, clamp, ternary and copy entries, and the users of the generated TWO_WAY helpers
MIGRATED = ("copy", "add", "add_alpha", "sub", "sub_alpha", "mul", "div", "div_floor",
            "div_trunc", "pow", "clamp", "clamp_min", "clamp_max", "nan_to_num", "where", "lerp",
            "addcmul", "addcdiv")
TWO_WAY_USERS = ("exp", "log", "exp2", "log2", "log10", "rsqrt", "sin", "cos", "erf", "atan",
                 "fmod", "gelu")


@pytest.mark.parametrize("name", MIGRATED + TWO_WAY_USERS)
def test_declared_branches_compile_for_sm90(name):
    """The branches of the arithmetic/ternary declarations and of the ops that call the
    generated TWO_WAY helpers compile to PTX for sm_90 (float32, float64; int32 where the rule
    takes integers)."""
    pytest.importorskip("triton")
    from nbxtensor.kernels import _triton as _tr
    if not _tr.REAL:
        pytest.skip("the Triton stand-in cannot compile")
    op = _declare.OPS[name]
    for dt in ("f32", "f64") + (("i32",) if "int32" in op.dtypes and op.rule not in (
            "float", "tofloat") else ()):
        _compile_sm90(op, dt)
