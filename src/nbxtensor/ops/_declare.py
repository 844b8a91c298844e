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

Expressions are strings over the operands x, y (compute dtype) and the two op parameters
(NumPy: p, q; Triton: p0, p1). Triton expressions may use INTERP (the interpreter flag),
IS_FLOAT (whether the compute type is a float), `tl`, `libdevice` and the @triton.jit
helpers of kernels/elementwise.py; NumPy expressions may use `np` and the helpers of
backends/cpu/elementwise.py (EXPR_NAMESPACE).

Adding an op is one `unary(...)`, `activation(...)` or `binary(...)` line here.
`declare()` also adds an op at run time (the tests declare one); every consumer
subscribed with `subscribe()` builds its artefacts for it, and `undeclare()` removes them.
"""
from __future__ import annotations

from dataclasses import dataclass

_FLOATS = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
_INTS = ("uint8", "int8", "int16", "int32", "int64")
_ALL = ("bool",) + _INTS + _FLOATS

# dtype rule -> (the input dtypes it accepts, what it means). Unary rules:
RULES = {
    "float": (_ALL, "ints/bool promote to the default float"),
    "keep": (_ALL, "result has the input dtype"),
    "nobool": (_INTS + _FLOATS, "result has the input dtype; bool refused"),
    "round": (_ALL, "floats rounded; ints/bool copied unchanged"),
    "pred": (_ALL, "bool result"),
    "bits": (("bool",) + _INTS, "integer or bool (bool: logical not)"),
    "floatonly": (_FLOATS, "floating point only; result has the input dtype"),   # either arity
    # binary rules (the `kind` of ops/elementwise.py's _binary)
    "arith": (_ALL, "torch promotion of the operands"),
    "tofloat": (_ALL, "promotion; ints/bool give the default float"),
    "cmp": (_ALL, "bool result (compared in the promoted dtype)"),
    "logical": (_ALL, "bool result of the operands' truth values"),
    "int": (("bool",) + _INTS, "integer or bool operands"),
    "shift": (_INTS, "integer operands"),
    "f3264": (("float32", "float64"), "float32 or float64 operands (the result steps in that dtype)"),
}
_UNARY_RULES = ("float", "keep", "nobool", "round", "pred", "bits", "floatonly")
_BINARY_KIND = {"arith": "arith", "tofloat": "float", "cmp": "cmp", "logical": "logical",
                "int": "int", "shift": "shift", "floatonly": "floatonly",
                "f3264": "f3264"}


@dataclass(frozen=True, eq=False)
class Op:
    """One declared element-wise op.

    name: the public function (and the dispatch entry unless `entry` is given); form:
    "math" f(input, *, out=None) [+ f_(self)], "binary" f(input, other, *, out=None)
    [+ f_(self, other)], "activation" f(input, <params>, [inplace=False]) (torch.nn.functional),
    "entry" no public function (a hand-written one dispatches to it); params: the
    activation's ((name, default), ...) passed to the kernel as p0, p1; inplace: the
    in-place form exists (f_ and x.f_(); for activations the `inplace=` argument), "cast"
    for logical_not_ (the bool result cast back into self's dtype); method: Tensor method
    x.name() (and x.name_() when in place); operators: Tensor dunder names (a binary's
    __rX__ is reflected, __iX__ is the in-place form); complex: complex operands accepted
    ("real": a real result, abs); bool_error: the refusal of a bool input under rule "nobool".
    """

    name: str
    arity: int
    rule: str
    np: str
    tl: str
    aliases: tuple = ()
    form: str = "math"
    entry: str = ""
    params: tuple = ()
    inplace: object = True
    method: bool = True
    operators: tuple = ()
    complex: object = False
    bool_error: str = "not supported for bool tensors"
    doc: str = ""

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"declare {self.name}: rule must be one of {sorted(RULES)}, got "
                             f"{self.rule!r}")
        if self.arity not in (1, 2) or ((self.arity == 1) != (self.rule in _UNARY_RULES)
                                        and self.rule != "floatonly"):
            raise ValueError(f"declare {self.name}: arity {self.arity} does not fit rule "
                             f"{self.rule!r}")
        if len(self.params) > 2:
            raise ValueError(f"declare {self.name}: at most two parameters (p0, p1), got "
                             f"{len(self.params)}")
        if not self.entry:
            object.__setattr__(self, "entry", self.name)

    @property
    def dtypes(self) -> tuple:
        """The input dtype names the rule accepts (docs/ops.md shows them)."""
        return RULES[self.rule][0]

    @property
    def kind(self) -> str:
        """The binary op kind of ops/elementwise.py's _binary."""
        return _BINARY_KIND[self.rule]


OPS: dict = {}        # entry name -> Op, in declaration order
_SUBSCRIBERS: list = []


def subscribe(build, remove=None) -> None:
    """Call build(op) for every declared op now and for each later declaration; remove(op)
    on undeclare."""
    _SUBSCRIBERS.append((build, remove))
    for op in list(OPS.values()):
        build(op)


def declare(op: Op) -> Op:
    if op.entry in OPS:
        raise ValueError(f"declare: element-wise op {op.entry!r} is already declared")
    OPS[op.entry] = op
    built = []
    try:
        for build, remove in _SUBSCRIBERS:
            build(op)
            built.append(remove)
    except Exception:
        # a refused declaration leaves nothing behind
        OPS.pop(op.entry)
        for remove in reversed(built):
            if remove is not None:
                remove(op)
        raise
    return op


def undeclare(entry: str) -> None:
    """Remove a declared op and every artefact built from it (tests use it)."""
    op = OPS.pop(entry)
    for _, remove in reversed(_SUBSCRIBERS):
        if remove is not None:
            remove(op)


def unary(name, rule, np, tl, **kw):  # noqa: A002 - np/tl name the expressions' dialects
    return declare(Op(name, 1, rule, np, tl, **kw))


def activation(name, rule, np, tl, **kw):  # noqa: A002
    kw.setdefault("form", "activation")
    kw.setdefault("method", False)
    return declare(Op(name, 1, rule, np, tl, **kw))


def binary(name, rule, np, tl, **kw):  # noqa: A002
    kw.setdefault("form", "binary")
    return declare(Op(name, 2, rule, np, tl, **kw))


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
binary("maximum", "arith", "np.maximum(x, y)", "_maximum(x, y)", inplace=False, doc="torch.maximum: NaN propagates.")
binary("minimum", "arith", "np.minimum(x, y)", "_minimum(x, y)", inplace=False)
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
binary("fmax", "arith", "np.fmax(x, y)", "_fmax(x, y)", inplace=False, doc="torch.fmax: the maximum, NaN ignored unless both are NaN.")
binary("fmin", "arith", "np.fmin(x, y)", "_fmin(x, y)", inplace=False, doc="torch.fmin: the minimum, NaN ignored unless both are NaN.")
binary("xlogy", "tofloat", "np.where(y != y, y, np.where(x == 0, x - x, x * np.log(y)))", "_xlogy(x, y, INTERP)", doc="torch.xlogy: x * log(y), 0 where x == 0 (unless y is NaN).")
binary("logaddexp", "floatonly", "np.logaddexp(x, y)", "_logaddexp(x, y, INTERP)")
binary("logaddexp2", "floatonly", "np.logaddexp2(x, y)", "_logaddexp2(x, y, INTERP)")
binary("nextafter", "f3264", "np.nextafter(x, y)", "_nextafter(x, y)")
binary("ldexp", "tofloat", "x * np.exp2(y)", "x * _exp2(y, INTERP)", doc="torch.ldexp: input * 2 ** other.")
