"""cpu: element-wise ops with NumPy.

Each entry gets (out, inputs, params, compute_dtype) from ops.elementwise: inputs are
host tensors expanded to out's shape or Python numbers. Every input is converted to
the compute dtype (float32 for every float below float64, so a float16 add computes in
float32 and rounds once), the op runs in NumPy, and the result is cast into `out` by the
dtype table's cast rule (dtypes.copy_into). Every op is declared in ops/_declare.py and comes
as a NumPy expression: ops/elementwise.py registers `numpy_entry(name, expr)` for each.
"""
from __future__ import annotations

import math

import numpy as np

from ... import dtypes as _dt

# math.erf is exact; NumPy has no erf (and SciPy is not a dependency)
_erf64 = np.frompyfunc(math.erf, 1, 1)


def _erf(x):
    return _erf64(x.astype(np.float64)).astype(x.dtype) if x.size else x.copy()


def _int_div_trunc(x, y):
    ys = np.where(y == 0, 1, y).astype(x.dtype)
    q = x // ys
    q = np.where((x % ys != 0) & ((x < 0) != (ys < 0)), q + 1, q)
    return np.where(y == 0, 0, q).astype(x.dtype)


def _div_trunc(x, y):
    if x.dtype.kind == "f":
        return np.trunc(x / y)
    return _int_div_trunc(x, y)


def _pow(x, y):
    if x.dtype.kind in "fc":
        return np.power(x, y)
    if x.dtype.kind == "b":
        return np.where(y, x, True)
    r = np.power(x, np.maximum(y, 0).astype(x.dtype))
    odd = (y & 1) != 0
    neg = np.where(x == 1, 1, np.where(x == -1, np.where(odd, -1, 1), 0)).astype(x.dtype)
    return np.where(y < 0, neg, r).astype(x.dtype)


def _shift(x, y, left):
    bits = x.dtype.itemsize * 8
    ok = (y >= 0) & (y < bits)
    sh = np.where(ok, y, 0).astype(x.dtype)
    if left:
        return np.where(ok, np.left_shift(x, sh), 0).astype(x.dtype)
    sh = np.where(ok, y, bits - 1).astype(x.dtype)
    return np.where(ok | (x < 0), np.right_shift(x, sh), 0).astype(x.dtype)


def _softplus(x, beta, threshold):
    bx = x * beta
    return np.where(bx > threshold, x, np.log1p(np.exp(bx)) / beta)


def _hard(x):
    return np.minimum(np.maximum(x + 3, 0), 6) / 6


_GILES_A = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
            -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_GILES_B = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
            -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _erfinv(x):
    """Inverse erf in float64: Giles' single-precision approximation, then Newton steps on
    math.erf (exact); +-1 give +-inf, |x| > 1 and NaN give NaN."""
    x64 = x.astype(np.float64)
    ax = np.abs(x64)
    inside = ax < 1
    y = np.where(inside, x64, 0.0)
    w = -np.log((1 - y) * (1 + y))
    wa, wb = w - 2.5, np.sqrt(np.maximum(w, 5.0)) - 3.0
    pa, pb = np.zeros_like(w), np.zeros_like(w)
    for a, b in zip(_GILES_A, _GILES_B):
        pa, pb = a + pa * wa, b + pb * wb
    r = np.where(w < 5, pa, pb) * y
    for _ in range(3):
        r = r - (_erf64(r).astype(np.float64) - y) / (1.1283791670955126 * np.exp(-r * r))
    r = np.where(y == 0, x64, r)                   # keeps -0
    r = np.where(ax == 1, x64 * np.inf, np.where(inside, r, np.nan))
    return r.astype(x.dtype)


def _logit(x, eps, use_eps):
    if use_eps:
        x = np.where(np.isnan(x), x, np.clip(x, eps, 1 - eps))
    return np.log(x / (1 - x))


def _heaviside(x, y):
    return np.where(x == 0, y, x > 0).astype(y.dtype)


# what a declared op's NumPy expression may name besides its operands x, y and parameters p, q
EXPR_NAMESPACE = {"np": np, "_erf": _erf, "_softplus": _softplus, "_hard": _hard,
                  "_shift": _shift, "_erfinv": _erfinv, "_logit": _logit,
                  "_heaviside": _heaviside, "_div_trunc": _div_trunc, "_pow": _pow}
EXPR_ARGS = ("x", "y", "z", "p", "q")


def _as_ct(x, ct):
    if x is None:
        return None
    if hasattr(x, "_host_view"):
        return x._host_view().astype(ct.np, copy=False)
    return np.asarray(x).astype(ct.np)


def _make(name, fn):
    def run(out, inputs, params, ct):
        args = [_as_ct(x, ct) for x in inputs] + [None] * (3 - len(inputs))
        p = [np.asarray(v).astype(ct.np)[()] for v in params]
        with np.errstate(all="ignore"):
            r = np.asarray(fn(*args, *p))
            _dt.copy_into(out._host_view(), r)
    run.__name__ = f"numpy_{name}"
    return run


def numpy_entry(name: str, expr: str):
    """The cpu entry of a declared op from its NumPy expression over x, y, z, p, q; refused
    (ValueError) when the expression does not parse or names anything else."""
    import ast
    import builtins
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"declare {name}: the NumPy expression {expr!r} does not parse: "
                         f"{e.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in EXPR_ARGS \
                and node.id not in EXPR_NAMESPACE and not hasattr(builtins, node.id):
            raise ValueError(f"declare {name}: the NumPy expression {expr!r} names {node.id!r}, "
                             f"which is neither an operand ({', '.join(EXPR_ARGS)}) nor one of "
                             f"{', '.join(sorted(EXPR_NAMESPACE))}")
    fn = eval(compile(f"lambda x, y, z, p, q: ({expr})", f"<numpy expression of {name}>", "eval"),
              dict(EXPR_NAMESPACE))
    return _make(name, fn)

