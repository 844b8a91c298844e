"""Element-wise ops as data: one declaration per op (docs/design/ops-as-data.md).

A declaration names the op, its torch aliases, its arity, its dtype rule, the NumPy
expression (the cpu implementation), the Triton expression (one branch of the kernel
body), the function form (out= / in-place / activation parameters) and the Tensor methods
and operators. From the table below:

  * ops/elementwise.py makes the public functions (nbx.<name>, nbx.ops.<name>), the
    in-place functions, the Tensor methods and operators, and registers the cpu entry;
  * backends/cpu/elementwise.py turns the NumPy expression into the cpu entry;
  * kernels/elementwise.py compiles every Triton expression into a branch of `_apply`;
  * ops/_table.py writes the declared-ops table of docs/ops.md.

Expressions are strings over the operands x, y, z (compute dtype) and the two op parameters
(NumPy: p, q; Triton: p0, p1). Triton expressions may use INTERP (the interpreter flag),
IS_FLOAT (whether the compute type is a float), `tl`, `libdevice` and the @triton.jit
helpers of kernels/elementwise.py; NumPy expressions may use `np` and the helpers of
backends/cpu/elementwise.py (EXPR_NAMESPACE).

Adding an op is one `unary(...)`, `activation(...)`, `binary(...)`, `call(...)` or `entry(...)`
line here.
`declare()` also adds an op at run time (the tests declare one); every consumer
subscribed with `subscribe()` builds its artefacts for it, and `undeclare()` removes them.
"""
from __future__ import annotations

# the record, the rules and the registry live in the bottom layer, so that the kernel module
# reads this table without importing the ops layer (nbxtensor/declarations.py)
from ..declarations import OPS, RULES, Op, declare, subscribe, undeclare  # noqa: F401
from ..declarations import REDUCTIONS, Reduction, declare_reduction  # noqa: F401


def unary(name, rule, np, tl, **kw):  # noqa: A002 - np/tl name the expressions' dialects
    return declare(Op(name, 1, rule, np, tl, **kw))


def activation(name, rule, np, tl, **kw):  # noqa: A002
    kw.setdefault("form", "activation")
    kw.setdefault("method", False)
    return declare(Op(name, 1, rule, np, tl, **kw))


def binary(name, rule, np, tl, **kw):  # noqa: A002
    kw.setdefault("form", "binary")
    return declare(Op(name, 2, rule, np, tl, **kw))


def call(name, arity, rule, np, tl, signature, runner, **kw):  # noqa: A002
    """An op whose arguments are not a formula: f(<signature>) calls `runner` of
    ops/elementwise.py, which validates them and dispatches to the declared entry."""
    return declare(Op(name, arity, rule, np, tl, form="call", signature=signature,
                      runner=runner, **kw))


def entry(name, arity, rule, np, tl, **kw):  # noqa: A002
    """A kernel branch and cpu entry with no public function of its own (another
    declaration's alpha= / rounding_mode=, or a hand-written function, dispatches to it)."""
    return declare(Op(name, arity, rule, np, tl, form="entry", **kw))


# ----------------------------------------------------------------------------- the table
# one line per op (so these lines run long)
# unary math: f(input, *, out=None), f_(self), x.f(), x.f_()
unary("abs", "nobool", "np.abs(x)", "_abs(x)", aliases=("absolute",), operators=("__abs__",), complex="real")
unary("neg", "nobool", "np.negative(x)", "_negf(x)", aliases=("negative",), operators=("__neg__",), complex=True, bool_error="negation of a bool tensor is not supported; use logical_not")
unary("sign", "nobool", "np.sign(x)", "_sign(x)")
unary("exp", "float", "np.exp(x)", "_exp(x, INTERP)", complex=True)
unary("exp2", "float", "np.exp2(x)", "_exp2(x, INTERP)")
unary("expm1", "float", "np.expm1(x)", "_expm1(x, INTERP)")
unary("log", "float", "np.log(x)", "_log(x, INTERP)", complex=True)
unary("log2", "float", "np.log2(x)", "_log2(x, INTERP)")
unary("log10", "float", "np.log10(x)", "_log10(x, INTERP)")
unary("log1p", "float", "np.log1p(x)", "_log1p(x, INTERP)")
unary("sqrt", "float", "np.sqrt(x)", "_sqrt(x, INTERP)", complex=True)
unary("rsqrt", "float", "1 / np.sqrt(x)", "_rsqrt(x, INTERP)")
unary("reciprocal", "float", "1 / x", "_fdiv(_one(x), x)", complex=True)
unary("sin", "float", "np.sin(x)", "_sin(x, INTERP)", complex=True)
unary("cos", "float", "np.cos(x)", "_cos(x, INTERP)", complex=True)
unary("tan", "float", "np.tan(x)", "_tan(x, INTERP)")
unary("tanh", "float", "np.tanh(x)", "_tanh(x, INTERP)")
unary("sigmoid", "float", "1 / (1 + np.exp(-x))", "_fdiv(_one(x), 1.0 + _exp(-x, INTERP))")
unary("erf", "float", "_erf(x)", "_erf_any(x, INTERP)")
unary("floor", "round", "np.floor(x)", "tl.floor(x)")
unary("ceil", "round", "np.ceil(x)", "tl.ceil(x)")
unary("trunc", "round", "np.trunc(x)", "_trunc(x)")
unary("round", "round", "np.round(x)", "_rint(x, INTERP)", form="entry")   # round(decimals=) by hand
unary("isnan", "pred", "np.isnan(x)", "x != x", inplace=False, complex=True)
unary("isinf", "pred", "np.isinf(x)", "(x == _INF) | (x == -_INF)", inplace=False, complex=True)
unary("isfinite", "pred", "np.isfinite(x)", "(x == x) & (x != _INF) & (x != -_INF)", inplace=False, complex=True)
unary("logical_not", "pred", "x == 0", "x == 0", inplace="cast")
unary("bitwise_not", "bits", "np.invert(x)", "_invert(x)", operators=("__invert__",))

# activations: torch.nn.functional forms; parameters travel as p0, p1
activation("relu", "nobool", "np.where(x < 0, x.dtype.type(0), x)", "tl.where(x < 0, 0, x).to(x.dtype)", method=True, doc="torch.relu: max(x, 0) (NaN stays NaN); integer tensors allowed.")
activation("silu", "floatonly", "x / (1 + np.exp(-x))", "_fdiv(x, 1.0 + _exp(-x, INTERP))")
activation("mish", "floatonly", "x * np.tanh(_softplus(x, x.dtype.type(1), x.dtype.type(20)))", "x * _tanh(_softplus(x, 1.0, 20.0, INTERP), INTERP)")
activation("softplus", "floatonly", "_softplus(x, p, q)", "_softplus(x, p0, p1, INTERP)", params=(("beta", 1.0), ("threshold", 20.0)), inplace=False, doc="torch.nn.functional.softplus: log(1 + exp(beta x)) / beta, linear above threshold.")
activation("elu", "floatonly", "np.where(x > 0, x, p * np.expm1(x))", "tl.where(x > 0, x, p0 * _expm1(x, INTERP))", params=(("alpha", 1.0),))
activation("leaky_relu", "floatonly", "np.where(x > 0, x, x * p)", "tl.where(x > 0, x, x * p0)", params=(("negative_slope", 0.01),))
activation("hardswish", "floatonly", "x * _hard(x)", "_fdiv(x * tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0), _one(x) * 6.0)")
activation("hardsigmoid", "floatonly", "_hard(x)", "_hardsigmoid(x)")
# gelu(approximate=) and glu(dim=) pick or split their operands by hand, then dispatch here
activation("gelu", "floatonly", "0.5 * x * (1 + _erf(x * x.dtype.type(0.7071067811865476)))", "0.5 * x * (1.0 + _erf_any(x * 0.7071067811865476, INTERP))", form="entry")
activation("gelu_tanh", "floatonly", "0.5 * x * (1 + np.tanh(x.dtype.type(0.7978845608028654) * (x + x.dtype.type(0.044715) * x * x * x)))", "0.5 * x * (1.0 + _tanh(0.7978845608028654 * (x + 0.044715 * x * x * x), INTERP))", form="entry")
binary("glu", "floatonly", "x / (1 + np.exp(-y))", "_fdiv(x, 1.0 + _exp(-y, INTERP))", form="entry")

# binary: f(input, other, *, out=None), f_(self, other), x.f(other), x.f_(other)
binary("remainder", "arith", "np.remainder(x, y)", "_remainder(x, y, IS_FLOAT, INTERP)", operators=("__mod__", "__rmod__", "__imod__"), doc="torch.remainder: the result has the sign of the divisor (Python's %).")
binary("fmod", "arith", "np.fmod(x, y)", "_fmod_any(x, y, IS_FLOAT, INTERP)", doc="torch.fmod: C's fmod; the result has the sign of the dividend.")
binary("maximum", "arith", "np.maximum(x, y)", "_extremum(x, y, MAX=True)", inplace=False, doc="torch.maximum: NaN propagates.")
binary("minimum", "arith", "np.minimum(x, y)", "_extremum(x, y, MAX=False)", inplace=False)
binary("atan2", "tofloat", "np.arctan2(x, y)", "_atan2(x, y, INTERP)", aliases=("arctan2",))
binary("eq", "cmp", "x == y", "x == y", operators=("__eq__",), complex=True)
binary("ne", "cmp", "x != y", "x != y", operators=("__ne__",), complex=True)
binary("lt", "cmp", "x < y", "x < y", operators=("__lt__",))
binary("le", "cmp", "x <= y", "x <= y", operators=("__le__",))
binary("gt", "cmp", "x > y", "x > y", operators=("__gt__",))
binary("ge", "cmp", "x >= y", "x >= y", operators=("__ge__",))
binary("logical_and", "logical", "(x != 0) & (y != 0)", "(x != 0) & (y != 0)")
binary("logical_or", "logical", "(x != 0) | (y != 0)", "(x != 0) | (y != 0)")
binary("logical_xor", "logical", "(x != 0) ^ (y != 0)", "(x != 0) ^ (y != 0)")
binary("bitwise_and", "int", "x & y", "x & y", operators=("__and__", "__rand__", "__iand__"))
binary("bitwise_or", "int", "x | y", "x | y", operators=("__or__", "__ror__", "__ior__"))
binary("bitwise_xor", "int", "x ^ y", "x ^ y", operators=("__xor__", "__rxor__", "__ixor__"))
binary("bitwise_left_shift", "shift", "_shift(x, y, True)", "_lshift(x, y)", entry="lshift", operators=("__lshift__", "__rlshift__", "__ilshift__"))
binary("bitwise_right_shift", "shift", "_shift(x, y, False)", "_rshift(x, y)", entry="rshift", operators=("__rshift__", "__rrshift__", "__irshift__"))

# more of torch's element-wise math (issue 21); libdevice on cuda, float64 stand-ins on interp
unary("frac", "floatonly", "x - np.trunc(x)", "x - _trunc(x)", doc="torch.frac: x - trunc(x), with x's sign (floating point only).")
unary("erfinv", "float", "_erfinv(x)", "_erfinv(x, INTERP)", doc="torch.erfinv: the inverse of erf; +-1 give +-inf, |x| > 1 gives NaN.")
unary("sinh", "float", "np.sinh(x)", "_sinh(x, INTERP)")
unary("cosh", "float", "np.cosh(x)", "_cosh(x, INTERP)")
unary("asinh", "float", "np.arcsinh(x)", "_asinh(x, INTERP)", aliases=("arcsinh",))
unary("acosh", "float", "np.arccosh(x)", "_acosh(x, INTERP)", aliases=("arccosh",))
unary("atanh", "float", "np.arctanh(x)", "_atanh(x, INTERP)", aliases=("arctanh",))
unary("asin", "float", "np.arcsin(x)", "_asin(x, INTERP)", aliases=("arcsin",))
unary("acos", "float", "np.arccos(x)", "_acos(x, INTERP)", aliases=("arccos",))
unary("atan", "float", "np.arctan(x)", "_atan(x, INTERP)", aliases=("arctan",))
unary("sinc", "float", "np.sinc(x)", "_sinc(x, INTERP)", doc="torch.sinc: sin(pi x) / (pi x), 1 at 0.")
unary("deg2rad", "float", "x * (np.pi / 180)", "x * 0.017453292519943295")
unary("rad2deg", "float", "x * (180 / np.pi)", "x * 57.29577951308232")
unary("signbit", "pred", "np.signbit(x) if x.dtype.kind == 'f' else x < 0", "_signbit(x)", inplace=False, doc="torch.signbit: the sign bit (True for -0.0); x < 0 for integers.")
unary("logit", "float", "_logit(x, p, q)", "_logit(x, p0, p1, INTERP)", form="entry")   # logit(eps=) by hand
binary("hypot", "floatonly", "np.hypot(x, y)", "_hypot(x, y, INTERP)")
binary("heaviside", "arith", "_heaviside(x, y)", "_heaviside(x, y)", doc="torch.heaviside: 0 where input < 0, values where input == 0, 1 where input > 0 (NaN input gives 0).")
binary("copysign", "tofloat", "np.copysign(x, y)", "_copysign(x, y)")
binary("fmax", "arith", "np.fmax(x, y)", "_extremum(x, y, MAX=True, IGNORE_NAN=True)", inplace=False, doc="torch.fmax: the maximum, NaN ignored unless both are NaN.")
binary("fmin", "arith", "np.fmin(x, y)", "_extremum(x, y, MAX=False, IGNORE_NAN=True)", inplace=False, doc="torch.fmin: the minimum, NaN ignored unless both are NaN.")
binary("xlogy", "tofloat", "np.where(y != y, y, np.where(x == 0, x - x, x * np.log(y)))", "_xlogy(x, y, INTERP)", doc="torch.xlogy: x * log(y), 0 where x == 0 (unless y is NaN).")
binary("logaddexp", "floatonly", "np.logaddexp(x, y)", "_logaddexp(x, y, False, INTERP)")
binary("logaddexp2", "floatonly", "np.logaddexp2(x, y)", "_logaddexp(x, y, True, INTERP)")
binary("nextafter", "f3264", "np.nextafter(x, y)", "_nextafter(x, y)")
binary("ldexp", "tofloat", "x * np.exp2(y)", "x * _exp2(y, INTERP)", doc="torch.ldexp: input * 2 ** other.")


# arithmetic, clamp, the ternaries and copy. Their functions take arguments that are not a
# formula (alpha=, rounding_mode=, optional bounds, a condition): `alpha` and `rounding` name the
# entries a binary reaches, and a "call" op's runner (ops/elementwise.py) validates its arguments
unary("copy", "keep", "x", "x", form="entry", complex=True)   # copy_, fill_, round of integers
binary("add", "arith", "x + y", "x + y", alpha="add_alpha", operators=("__add__", "__radd__", "__iadd__"), complex=True, doc="torch.add: input + alpha * other.")
entry("add_alpha", 2, "arith", "x + p * y", "x + p0 * y", complex=True)
binary("sub", "arithnb", "x - y", "x - y", aliases=("subtract",), alpha="sub_alpha", operators=("__sub__", "__rsub__", "__isub__"), complex=True, bool_error="subtraction with two bool tensors is not supported; use logical_xor or bitwise_xor", doc="torch.sub: input - alpha * other.")
entry("sub_alpha", 2, "arithnb", "x - p * y", "x - p0 * y", complex=True)
binary("mul", "arith", "x * y", "x * y", aliases=("multiply",), operators=("__mul__", "__rmul__", "__imul__"), complex=True, doc="torch.mul: input * other.")
binary("div", "tofloat", "x / y", "_fdiv(x, y)", aliases=("divide", "true_divide"), rounding={"floor": "div_floor", "trunc": "div_trunc"}, operators=("__truediv__", "__rtruediv__", "__itruediv__"), complex=True, doc="torch.div: true division (ints give the default float), or rounding_mode 'trunc' / 'floor' (result dtype by promotion). Integer division by zero gives 0 (NumPy's value; torch's cpu raises and its cuda returns garbage).")
binary("floor_divide", "arith", "np.floor_divide(x, y)", "_floor_div(x, y, IS_FLOAT, INTERP)", entry="div_floor", operators=("__floordiv__", "__rfloordiv__", "__ifloordiv__"), doc="torch.floor_divide: division rounded down (div with rounding_mode='floor').")
entry("div_trunc", 2, "arith", "_div_trunc(x, y)", "_div_trunc(x, y, IS_FLOAT)")
call("pow", 2, "arith", "_pow(x, y)", "_pow_any(x, y, IS_FLOAT, INTERP)", "input, exponent, *, out=None", "_pow", operators=("__pow__", "__rpow__", "__ipow__"), complex=True, doc="torch.pow. Integer tensors to negative integer powers: 0, except bases 1 and -1.")
call("clamp", 3, "arithnb", "np.minimum(np.maximum(x, y), z)", "_extremum(_extremum(x, y, MAX=True), z, MAX=False)", "input, min=None, max=None, *, out=None", "_clamp", aliases=("clip",), doc="torch.clamp with scalar or tensor bounds; NaN propagates; min > max gives max.")
call("clamp_min", 2, "arithnb", "np.maximum(x, y)", "_extremum(x, y, MAX=True)", "input, min, *, out=None", "_clamp_min", inplace=False)
call("clamp_max", 2, "arithnb", "np.minimum(x, y)", "_extremum(x, y, MAX=False)", "input, max, *, out=None", "_clamp_max", inplace=False)
call("nan_to_num", 3, "finite", "np.where(np.isnan(x), p, np.where(x == np.inf, y, np.where(x == -np.inf, z, x)))", "_nan_to_num(x, y, z, p0)", "input, nan=0.0, posinf=None, neginf=None, *, out=None", "_nan_to_num", doc="torch.nan_to_num: NaN -> nan, +inf -> posinf (default: dtype max), -inf -> neginf.")
call("where", 3, "select", "np.where(x != 0, y, z)", "tl.where(x != 0, y, z)", "condition, input=None, other=None, *, out=None", "_where", inplace=False, method="condition, self, other", doc="torch.where(condition, input, other): input where condition is true, else other.")
call("lerp", 3, "floatonly", "np.where(np.abs(z) < 0.5, x + z * (y - x), y - (y - x) * (1 - z))", "_lerp(x, y, z)", "input, end, weight, *, out=None", "_lerp", doc="torch.lerp: input + weight * (end - input) (torch's form that is exact at weight 1).")
call("addcmul", 3, "arith", "x + p * (y * z)", "x + p0 * (y * z)", "input, tensor1, tensor2, *, value=1, out=None", "_addc", doc="torch.addcmul: input + value * tensor1 * tensor2.")
call("addcdiv", 3, "floatonly", "x + p * (y / z)", "x + p0 * _fdiv(y, z)", "input, tensor1, tensor2, *, value=1, out=None", "_addc", doc="torch.addcdiv: input + value * tensor1 / tensor2 (floating point only).")


def reduction(name, rule, np, tl, **kw):  # noqa: A002
    return declare_reduction(Reduction(name, rule, np, tuple(tl.split()), **kw))


# ----------------------------------------------------------------------------- reductions
# one line per reduction: result rule, NumPy reference (over a, w, axis, scale), the kernel's
# PRE COMB POST steps; the function, method, docs row, cpu entry and kernel launch follow
_ONE = "input, dim=None, keepdim=False, *, out=None"
reduction("sum", "sum", "np.sum(w, axis=axis, keepdims=True)", "P_ID C_SUM Q_NONE", identity=0, complex=True, fast=True, doc="Sum over `dim` (None: all). Integers and bool sum in int64; fp16/bf16 accumulate in fp32.")
reduction("prod", "sum", "np.prod(w, axis=axis, keepdims=True)", "P_ID C_PROD Q_NONE", identity=1, dims="one", doc="Product over `dim` (None: all; torch's prod reduces one dim). Integers and bool multiply in int64.")
reduction("mean", "float", "np.sum(w, axis=axis, keepdims=True) * scale", "P_ID C_SUM Q_SCALE", identity="nan", complex=True, fast=True, doc="Mean over `dim` (None: all); floating point (dtype= casts first).")
reduction("amax", "keep", "np.max(w, axis=axis, keepdims=True)", "P_ID C_MAX Q_NONE", signature="input, dim=(), keepdim=False, *, out=None", fast=True, doc="Maximum over `dim` (() or None: all); NaN propagates. Empty reduced dims are an error.")
reduction("amin", "keep", "np.min(w, axis=axis, keepdims=True)", "P_ID C_MIN Q_NONE", signature="input, dim=(), keepdim=False, *, out=None", fast=True, doc="Minimum over `dim` (() or None: all); NaN propagates. Empty reduced dims are an error.")
reduction("any", "bool", "np.any(a != 0, axis=axis, keepdims=True)", "P_NZ C_MAX Q_NONE", identity=0, signature=_ONE, doc="Whether any element over `dim` is non-zero.")
reduction("all", "bool", "np.all(a != 0, axis=axis, keepdims=True)", "P_NZ C_MIN Q_NONE", identity=1, signature=_ONE, doc="Whether every element over `dim` is non-zero.")
reduction("count_nonzero", "count", "np.sum(a != 0, axis=axis, keepdims=True, dtype=np.int64)", "P_NZ C_SUM Q_NONE", identity=0, kind="nnz", signature="input, dim=None", doc="The number of non-zero elements over `dim` (None: all), int64.")
reduction("argmax", "index", "_first_index(np.argmax, w, axis)", "P_ID C_ARGMAX Q_NONE", signature=_ONE, dims="one", fast=True, doc="Index of the first maximum (NaN counts as the maximum), int64; dim None: of the flattened input.")
reduction("argmin", "index", "_first_index(np.argmin, w, axis)", "P_ID C_ARGMIN Q_NONE", signature=_ONE, dims="one", fast=True, doc="Index of the first minimum (NaN counts as the minimum), int64; dim None: of the flattened input.")
