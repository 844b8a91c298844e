"""Element-wise kernels (cuda and interp): one generic template for every op, copy_, fill_.

Reading order: storage codecs (bf16/fp8/bool are moved as raw integers and decoded by
hand, so interp and cuda round bit-for-bit the same way), the math helpers the declared
expressions call, the kernels, the launch plan (dim collapsing), the registered entries, and
last the generated scalar op `_apply`: one branch per op declared in ops/_declare.py (its
Triton expression).

Casting rules (see dtypes.py) as implemented here:
  * float -> bfloat16 / float8: exact round-to-nearest-even from float32 bits, in
    integer arithmetic; overflow -> inf (bf16, e5m2) or NaN (e4m3fn, which has no inf).
    A float64 source is first rounded to float32 (dtypes.py's rule; torch does the same).
  * float -> float16 / float32: the hardware conversion (round-to-nearest-even; numpy on interp).
  * float -> int8/int16/uint8 goes through int32 (so -1.0 -> 255 as in NumPy); to bool is x != 0.
  * int -> bf16/fp8/fp16 goes through float32 (dtypes.py's rule).
"""
from __future__ import annotations

import math

import numpy as np
from ._triton import triton, tl  # Triton, or its stand-in without Triton
from ._triton import libdevice  # noqa: F401 - the generated TWO_WAY helpers call it

from .. import declarations as _declarations
from .. import dtypes as _dt
from ..backends.launch import launch_items
from ..dispatch import register
from ..plans import memoize
from ..tensor import Tensor
from ._host import cdiv as _cdiv, f64_bits as _f64_bits, next_pow2 as _np2

# ----------------------------------------------------------------------------- codecs

_NAN = tl.constexpr(float("nan"))
_INF = tl.constexpr(float("inf"))


@triton.jit
def _f32_to_small(x, E: tl.constexpr, M: tl.constexpr, FN: tl.constexpr):
    """float32 -> bits (int32) of a float with E exponent and M mantissa bits, RNE.

    FN: the e4m3fn layout (no inf; all-ones exponent holds finite values; 0x7F is NaN).
    """
    BIAS: tl.constexpr = (1 << (E - 1)) - 1
    SH: tl.constexpr = 23 - M
    u = x.to(tl.int32, bitcast=True)
    sign = (u >> 31) & 1
    a = u & 0x7FFFFFFF
    ac = tl.minimum(a, 0x7F800000)              # inf/NaN: keep the rounding add from wrapping
    e = ac >> 23
    # normal target: rebias the exponent and round the mantissa in place
    r = ac - ((127 - BIAS) << 23)
    r = (r + ((1 << (SH - 1)) - 1) + ((r >> SH) & 1)) >> SH
    # subnormal target: shift the full significand right, rounding to nearest even
    m = (ac & 0x7FFFFF) | tl.where(e > 0, 0x800000, 0)
    e_eff = tl.maximum(e, 1)
    s = tl.minimum(tl.maximum(SH + 1 - (e_eff - 127 + BIAS), 1), 25)
    half = (1 << (s - 1)) - 1
    sub = (m + half + ((m >> s) & 1)) >> s
    res = tl.where(e_eff - 127 + BIAS >= 1, r, sub)
    if FN:
        res = tl.where(res > 0x7E, 0x7F, res)
        res = tl.where(a > 0x7F800000, 0x7F, res)
    else:
        INF: tl.constexpr = ((1 << E) - 1) << M
        res = tl.minimum(res, INF)
        res = tl.where(a > 0x7F800000, INF | (1 << (M - 1)), res)
    return res | (sign << (E + M))


@triton.jit
def _e4m3_to_f32(raw):
    r = raw.to(tl.int32) & 0xFF
    e = (r >> 3) & 0xF
    m = r & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125        # m * 2**-9
    v = tl.where(e == 0, sub, normal)
    v = tl.where((r & 0x7F) == 0x7F, _NAN, v)
    # the sign goes into the bits: Triton's -x is 0 - x, which loses -0.0
    return (v.to(tl.int32, bitcast=True) | ((r & 0x80) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def _negf(x):
    """IEEE negation (flips the sign bit, so -0.0 and NaN signs come out right)."""
    if x.dtype == tl.float64:
        r = (x.to(tl.int64, bitcast=True) ^ (-9223372036854775807 - 1)).to(tl.float64, bitcast=True)
    elif x.dtype == tl.float32:
        r = (x.to(tl.int32, bitcast=True) ^ (-2147483647 - 1)).to(tl.float32, bitcast=True)
    else:
        r = -x
    return r


@triton.jit
def _decode(raw, ENC: tl.constexpr):
    """Raw storage -> the natural compute value (bool -> 0/1 uint8, bf16/fp8 -> float32)."""
    if ENC == "bf":
        v = ((raw.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    elif ENC == "e5":
        v = ((raw.to(tl.int16) & 0xFF) << 8).to(tl.float16, bitcast=True).to(tl.float32)
    elif ENC == "e4":
        v = _e4m3_to_f32(raw)
    else:
        v = raw
    return v


@triton.jit
def _encode(x, ENC: tl.constexpr, RAW: tl.constexpr):
    """A compute value -> raw storage of the output dtype (RAW is the raw element type)."""
    if ENC == "b":
        r = (x != 0).to(tl.uint8)
    elif ENC == "bf":
        r = _f32_to_small(x.to(tl.float32), 8, 7, False).to(tl.int16)
    elif ENC == "e4":
        r = _f32_to_small(x.to(tl.float32), 4, 3, True).to(tl.uint8)
    elif ENC == "e5":
        r = _f32_to_small(x.to(tl.float32), 5, 2, False).to(tl.uint8)
    elif RAW.is_floating():
        if RAW == tl.float16 and not x.dtype.is_floating():
            r = x.to(tl.float32).to(tl.float16)
        else:
            r = x.to(RAW)
    else:  # integer output
        if x.dtype.is_floating() and RAW.primitive_bitwidth < 32:
            r = x.to(tl.int32).to(RAW)
        else:
            r = x.to(RAW)
    return r


# ----------------------------------------------------------------------------- math helpers
# libdevice on cuda (accurate, C99 special cases); on interp (which has no libdevice)
# compositions of the numpy-backed primitives, computed in float64 where that helps.


# The helpers that are one libdevice (or other compiled-only) call on cuda and, under the
# interpreter, one expression or a call of their `<name>_interp` function below (the longer
# compositions). Triton cannot take a function as a constexpr, so each is its own
# @triton.jit function; `_two_way` generates them from this table:
# name -> (parameters before INTERP, the interpreter's expression, the compiled expression).
TWO_WAY = {
    "_fmod": ("x, y", "x % y", "libdevice.fmod(x, y)"),
    "_exp": ("x", "tl.exp(x)", "libdevice.exp(x)"),
    "_log": ("x", "tl.log(x)", "libdevice.log(x)"),
    "_exp2": ("x", "tl.exp2(x)", "libdevice.exp2(x)"),
    "_log2": ("x", "tl.log2(x)", "libdevice.log2(x)"),
    "_log10": ("x", "(tl.log(x.to(tl.float64)) * 0.4342944819032518).to(x.dtype)", "libdevice.log10(x)"),
    "_rsqrt": ("x", "1.0 / tl.sqrt(x)", "libdevice.rsqrt(x)"),
    "_sin": ("x", "tl.sin(x)", "libdevice.sin(x)"),
    "_cos": ("x", "tl.cos(x)", "libdevice.cos(x)"),
    "_erf_any": ("x", "tl.erf(x)", "libdevice.erf(x)"),
    "_atan": ("x", "_atan64(x.to(tl.float64)).to(x.dtype)", "libdevice.atan(x)"),
    "_expm1": ("x", "_expm1_interp(x)", "libdevice.expm1(x)"),
    "_log1p": ("x", "_log1p_interp(x)", "libdevice.log1p(x)"),
    "_tanh": ("x", "_tanh_interp(x)", "libdevice.tanh(x)"),
    "_atan2": ("y, x", "_atan2_interp(y, x)", "libdevice.atan2(y, x)"),
    "_pow_f": ("x, y", "_pow_f_interp(x, y)", "libdevice.pow(x, y)"),
    "_rint": ("x", "_rint_interp(x)", "libdevice.rint(x)"),
    "_tan": ("x", "_tan_interp(x)", "libdevice.tan(x)"),
    "_sinh": ("x", "_sinh_interp(x)", "libdevice.sinh(x)"),
    "_cosh": ("x", "_cosh_interp(x)", "libdevice.cosh(x)"),
    "_asinh": ("x", "_asinh_interp(x)", "libdevice.asinh(x)"),
    "_acosh": ("x", "_acosh_interp(x)", "libdevice.acosh(x)"),
    "_atanh": ("x", "_atanh_interp(x)", "libdevice.atanh(x)"),
    "_asin": ("x", "_asin_interp(x)", "libdevice.asin(x)"),
    "_acos": ("x", "_acos_interp(x)", "libdevice.acos(x)"),
    "_erfinv": ("x", "_erfinv_interp(x)", "libdevice.erfinv(x)"),
    "_hypot": ("x, y", "_hypot_interp(x, y)", "libdevice.hypot(x, y)"),
}


def _two_way_source(table) -> str:
    """The Python source of every TWO_WAY helper."""
    parts = []
    for name, (params, interp, compiled) in table.items():
        parts.append(f"def {name}({params}, INTERP: tl.constexpr):\n"
                     f"    if INTERP:\n        r = {interp}\n"
                     f"    else:\n        r = {compiled}\n    return r\n\n")
    return "".join(parts)


def _two_way() -> None:
    """Compile the TWO_WAY helpers in this module's namespace, their source kept in linecache
    (Triton's JIT and interpreter read a function's source through inspect)."""
    import linecache
    file = "<nbxtensor.kernels.elementwise: TWO_WAY helpers>"
    src = _two_way_source(TWO_WAY)
    linecache.cache[file] = (len(src), None, src.splitlines(True), file)
    local: dict = {}
    exec(compile(src, file, "exec"), globals(), local)
    for name in TWO_WAY:
        globals()[name] = triton.jit(local[name])


_two_way()


@triton.jit
def _expm1_interp(x):
    u = tl.exp(x)
    r = tl.where(u == 1.0, x, (u - 1.0) * x / tl.log(u))   # Kahan's trick
    r = tl.where(u - 1.0 == -1.0, -1.0, r)
    # above 1, u - 1 loses nothing and cannot overflow where u does not (the trick's
    # (u - 1) * x can, and inf / inf is NaN)
    r = tl.where(x > 1.0, u - 1.0, r)
    return r


@triton.jit
def _log1p_interp(x):
    u = 1.0 + x
    r = tl.where(u == 1.0, x, tl.log(u) * x / (u - 1.0))
    r = tl.where((u == _INF) | (x <= -1.0), tl.log(u), r)
    return r


@triton.jit
def _tanh_interp(x):
    t = _expm1_interp(-2.0 * tl.abs(x))
    r = -t / (2.0 + t)
    r = tl.where(x < 0, -r, r)
    return r


@triton.jit
def _atan_small(t):
    # |t| <= tan(pi/12): odd Taylor series to t**41 (error < 1e-17 in float64)
    t2 = t * t
    p = t2 * 0.0 + 1.0 / 41.0
    for k in tl.static_range(20):
        p = (1.0 / (2 * (19 - k) + 1)) - t2 * p
    return t * p


@triton.jit
def _atan_ratio(t, big):
    # float64 arctan(t) for t in [0, 1], or pi/2 - arctan(t) where big (t = 1/u: arctan(u));
    # above tan(pi/12), t is first reduced by pi/6
    SQ3: tl.constexpr = 1.7320508075688772
    red = t > 0.2679491924311227
    tr = tl.where(red, (t * SQ3 - 1.0) / (SQ3 + t), t)
    a = _atan_small(tr)
    a = tl.where(red, a + 0.5235987755982989, a)
    return tl.where(big, 1.5707963267948966 - a, a)


@triton.jit
def _atan2_interp(y, x):
    yd = y.to(tl.float64)
    xd = x.to(tl.float64)
    ay = tl.abs(yd)
    ax = tl.abs(xd)
    big = ay > ax
    t = tl.where(big, ax / ay, ay / ax)        # in [0, 1]
    t = tl.where(ax == ay, 1.0, t)            # inf/inf
    a = _atan_ratio(t, big)
    a = tl.where(xd < 0, 3.141592653589793 - a, a)
    # atan2(+-0, -0) = +-pi: -0 has the sign bit set
    # (tl.where would materialise a float literal as float32: build pi in float64)
    a = tl.where((xd == 0) & (yd == 0), tl.where(_signbit(x), xd * 0.0 + 3.141592653589793,
                                                 xd * 0.0), a)
    a = tl.where(_signbit(y), _negf(a), a)
    a = tl.where((yd != yd) | (xd != xd), _NAN, a)
    r = a.to(x.dtype)
    return r


@triton.jit
def _pow_f_interp(x, y):
    xd = x.to(tl.float64)
    yd = y.to(tl.float64)
    ax = tl.abs(xd)
    r = tl.exp(yd * tl.log(ax))
    y_int = tl.floor(yd) == yd
    y_odd = y_int & (tl.floor(yd * 0.5) * 2.0 != yd)
    # a negative base needs an integer exponent, except -inf (C's pow: inf or 0)
    r = tl.where(xd < 0, tl.where(y_int, tl.where(y_odd, -r, r),
                                  tl.where(xd == -_INF, r, _NAN)), r)
    r = tl.where((xd == 0) & (yd > 0), tl.where(y_odd, xd, 0.0), r)
    r = tl.where((xd == 0) & (yd < 0), tl.where(y_odd, 1.0 / xd, _INF), r)
    r = tl.where((ax == 1.0) & ((yd == _INF) | (yd == -_INF)), 1.0, r)
    r = tl.where((yd == 0) | (xd == 1.0), 1.0, r)
    r = r.to(x.dtype)
    return r


@triton.jit
def _pow_i(x, y):
    # integer power by squaring; negative exponents give 0 except for bases 1 and -1
    r = tl.full(x.shape, 1, x.dtype)
    base = x
    e = y
    BITS: tl.constexpr = x.dtype.primitive_bitwidth
    for _ in tl.static_range(BITS - 1):
        r = tl.where((e & 1) != 0, r * base, r)
        base = base * base
        e = e >> 1
    e_odd = (y & 1) != 0
    neg = tl.where(x == 1, 1, tl.where(x == -1, tl.where(e_odd, -1, 1), 0)).to(x.dtype)
    return tl.where(y < 0, neg, r)


@triton.jit
def _rint_interp(x):
    """Round half to even."""
    f = tl.floor(x)
    d = x - f
    f_even = tl.floor(f * 0.5) * 2.0 == f
    r = tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, tl.where(f_even, f, f + 1.0)))
    return r


@triton.jit
def _fdiv(x, y):
    """IEEE division: fp32 `/` compiles to the approximate div.full.f32 on cuda."""
    if x.dtype == tl.float32:
        r = tl.math.div_rn(x, y)
    else:
        r = x / y
    return r


@triton.jit
def _one(x):
    return tl.full(x.shape, 1.0, x.dtype)


@triton.jit
def _trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def _softplus(x, beta, threshold, INTERP: tl.constexpr):
    bx = x * beta
    return tl.where(bx > threshold, x, _fdiv(_log1p(_exp(bx, INTERP), INTERP), _one(x) * beta))


@triton.jit
def _floor_div(x, y, IS_FLOAT: tl.constexpr, INTERP: tl.constexpr):
    if IS_FLOAT:
        # NumPy's / torch's algorithm: exact floor of the true quotient
        mod = _fmod(x, y, INTERP)
        div = _fdiv(x - mod, y)
        div = tl.where((mod != 0) & ((y < 0) != (mod < 0)), div - 1.0, div)
        fl = tl.floor(div)
        fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
        q = _fdiv(x, y)
        fl = tl.where(div == 0, tl.where(q < 0, -0.0, 0.0), fl)
        r = tl.where(y == 0, q, fl)
    else:
        ys = tl.where(y == 0, 1, y)
        q = x // ys                                  # truncates (C)
        q = tl.where(((x % ys) != 0) & ((x < 0) != (ys < 0)), q - 1, q)
        r = tl.where(y == 0, 0, q)
    return r


@triton.jit
def _remainder(x, y, IS_FLOAT: tl.constexpr, INTERP: tl.constexpr):
    if IS_FLOAT:
        m = _fmod(x, y, INTERP)
        r = tl.where((m != 0) & ((m < 0) != (y < 0)), m + y, m)
    else:
        ys = tl.where(y == 0, 1, y)
        m = x % ys
        r = tl.where((m != 0) & ((m < 0) != (ys < 0)), m + ys, m)
        r = tl.where(y == 0, 0, r)
    return r


@triton.jit
def _abs(x):
    if x.dtype.is_floating():
        r = tl.abs(x)
    else:
        r = tl.where(x < 0, -x, x)
    return r


@triton.jit
def _sign(x):
    r = tl.where(x > 0, 1, tl.where(x < 0, -1, 0)).to(x.dtype)
    if x.dtype.is_floating():
        r = tl.where(x != x, x, r)
    return r


@triton.jit
def _sqrt(x, INTERP: tl.constexpr):
    if x.dtype == tl.float32 and not INTERP:
        r = tl.sqrt_rn(x)           # IEEE (tl.sqrt may be approximate for fp32)
    else:
        r = tl.sqrt(x)
    return r


@triton.jit
def _tan_interp(x):
    xd = x.to(tl.float64)
    r = (tl.sin(xd) / tl.cos(xd)).to(x.dtype)
    return r


@triton.jit
def _invert(x):
    # unsigned: xor with all ones (the interpreter's `~` on uint8 overflows NumPy's -1)
    if x.dtype.is_int_unsigned():
        r = x ^ tl.full(x.shape, (1 << x.dtype.primitive_bitwidth) - 1, x.dtype)
    else:
        r = ~x
    return r


@triton.jit
def _hardsigmoid(x):
    r = _fdiv(tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0), _one(x) * 6.0)
    return tl.where(x != x, x, r)


@triton.jit
def _fmod_any(x, y, IS_FLOAT: tl.constexpr, INTERP: tl.constexpr):
    if IS_FLOAT:
        r = _fmod(x, y, INTERP)
    else:
        ys = tl.where(y == 0, 1, y)
        r = tl.where(y == 0, 0, x % ys)
    return r


@triton.jit
def _larger(x, y, MAX: tl.constexpr):
    # the larger (MAX) or the smaller of x and y by comparison: y where they do not compare
    if MAX:
        r = tl.where(x > y, x, y)
    else:
        r = tl.where(x < y, x, y)
    return r


@triton.jit
def _extremum(x, y, MAX: tl.constexpr, IGNORE_NAN: tl.constexpr = False):
    """torch.maximum (MAX) or torch.minimum: a float NaN propagates from either side;
    IGNORE_NAN (torch.fmax / fmin): a NaN is ignored unless both are NaN."""
    if x.dtype.is_floating():
        if IGNORE_NAN:
            r = tl.where(x != x, y, tl.where(y != y, x, _larger(x, y, MAX)))
        else:
            r = _larger(x, y, MAX)
            r = tl.where(x != x, x, r)
            r = tl.where(y != y, y, r)
    elif MAX:
        r = tl.maximum(x, y)
    else:
        r = tl.minimum(x, y)
    return r


@triton.jit
def _lshift(x, y):
    """Shifts by a negative amount or by the width or more give 0 (torch)."""
    ok = (y >= 0) & (y < x.dtype.primitive_bitwidth)
    return tl.where(ok, x << tl.where(ok, y, 0), 0)


@triton.jit
def _rshift(x, y):
    """Arithmetic: by the width or more, negative values give -1 and the rest 0."""
    ok = (y >= 0) & (y < x.dtype.primitive_bitwidth)
    sh = tl.where(ok, y, x.dtype.primitive_bitwidth - 1)
    return tl.where(ok | (x < 0), x >> sh, 0)


# the bodies of the arithmetic, clamp and ternary declarations that need statements
@triton.jit
def _div_trunc(x, y, IS_FLOAT: tl.constexpr):
    if IS_FLOAT:
        r = _trunc(_fdiv(x, y))
    else:
        ys = tl.where(y == 0, 1, y)
        r = tl.where(y == 0, 0, x // ys)
    return r


@triton.jit
def _pow_any(x, y, IS_FLOAT: tl.constexpr, INTERP: tl.constexpr):
    if IS_FLOAT:
        r = _pow_f(x, y, INTERP)
    else:
        r = _pow_i(x, y)
    return r


@triton.jit
def _lerp(x, end, w):
    """x + w * (end - x), torch's two-sided form (exact at w == 1)."""
    d = end - x
    return tl.where(tl.abs(w) < 0.5, x + w * d, end - d * (1.0 - w))


@triton.jit
def _nan_to_num(x, posinf, neginf, nan):
    r = tl.where(x != x, nan, x)
    r = tl.where(x == _INF, posinf, r)
    return tl.where(x == -_INF, neginf, r)


# torch's element-wise ops beyond the basic math (ops/_declare.py). On interp they compute
# in float64 from the NumPy-backed primitives and round once into the compute type.
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _signbit(x):
    """The sign bit (set for -0.0 and negative NaNs); x < 0 for integers."""
    if x.dtype == tl.float64:
        r = x.to(tl.int64, bitcast=True) < 0
    elif x.dtype.is_floating():
        r = x.to(tl.float32).to(tl.int32, bitcast=True) < 0
    else:
        r = x < 0
    return r


@triton.jit
def _copysign(x, y):
    a = tl.abs(x)
    return tl.where(_signbit(y), _negf(a), a)


@triton.jit
def _odd(r, xd):
    # an odd function's value at xd from r, its value at |xd|: xd's sign, and xd itself at
    # +-0 (keeps -0)
    r = tl.where(xd < 0, -r, r)
    return tl.where(xd == 0, xd, r)


@triton.jit
def _sinh_interp(x):
    xd = x.to(tl.float64)
    ax = tl.abs(xd)
    t = _expm1_interp(ax)
    r = tl.where(ax > 20.0, tl.exp(ax - _LN2), 0.5 * (t + t / (t + 1.0)))
    r = _odd(r, xd).to(x.dtype)
    return r


@triton.jit
def _cosh_interp(x):
    ax = tl.abs(x.to(tl.float64))
    e = tl.exp(ax)
    r = tl.where(ax > 20.0, tl.exp(ax - _LN2), 0.5 * (e + 1.0 / e)).to(x.dtype)
    return r


@triton.jit
def _asinh_interp(x):
    xd = x.to(tl.float64)
    ax = tl.abs(xd)
    small = _log1p_interp(ax + ax * ax / (1.0 + tl.sqrt(1.0 + ax * ax)))
    r = tl.where(ax > 1e8, tl.log(ax) + _LN2, small)
    r = _odd(r, xd).to(x.dtype)
    return r


@triton.jit
def _acosh_interp(x):
    xd = x.to(tl.float64)
    t = xd - 1.0
    small = _log1p_interp(t + tl.sqrt(2.0 * t + t * t))
    r = tl.where(xd > 1e8, tl.log(xd) + _LN2, small)
    r = tl.where(xd < 1.0, (_INF - _INF), r).to(x.dtype)
    return r


@triton.jit
def _atanh_interp(x):
    xd = x.to(tl.float64)
    ax = tl.abs(xd)
    r = 0.5 * _log1p_interp(2.0 * ax / (1.0 - ax))
    r = tl.where(ax > 1.0, (_INF - _INF), r)
    r = _odd(r, xd).to(x.dtype)
    return r


@triton.jit
def _atan64(xd):
    """arctan in float64 for interp: _atan2's argument reduction, NaN through unchanged."""
    ax = tl.abs(xd)
    big = ax > 1.0
    t = tl.where(big, 1.0 / ax, ax)               # in [0, 1]; 1/inf = 0
    a = _atan_ratio(t, big)
    return _odd(a, xd)


@triton.jit
def _asin_interp(x):
    xd = x.to(tl.float64)
    r = _atan64(xd / tl.sqrt((1.0 - xd) * (1.0 + xd))).to(x.dtype)   # +-1: +-pi/2
    return r


@triton.jit
def _acos_interp(x):
    xd = x.to(tl.float64)
    # 2 atan(sqrt((1 - x) / (1 + x))): accurate near 1, pi at -1, NaN beyond +-1
    r = (2.0 * _atan64(tl.sqrt((1.0 - xd) / (1.0 + xd)))).to(x.dtype)
    return r


@triton.jit
def _erfinv_interp(x):
    # Giles' single-precision approximation, then Newton steps on erf in float64
    xd = x.to(tl.float64)
    w = -tl.log((1.0 - xd) * (1.0 + xd))
    wa = w - 2.5
    pa = 2.81022636e-08
    pa = 3.43273939e-07 + pa * wa
    pa = -3.5233877e-06 + pa * wa
    pa = -4.39150654e-06 + pa * wa
    pa = 0.00021858087 + pa * wa
    pa = -0.00125372503 + pa * wa
    pa = -0.00417768164 + pa * wa
    pa = 0.246640727 + pa * wa
    pa = 1.50140941 + pa * wa
    wb = tl.sqrt(tl.where(w < 5.0, 5.0, w)) - 3.0
    pb = -0.000200214257
    pb = 0.000100950558 + pb * wb
    pb = 0.00134934322 + pb * wb
    pb = -0.00367342844 + pb * wb
    pb = 0.00573950773 + pb * wb
    pb = -0.0076224613 + pb * wb
    pb = 0.00943887047 + pb * wb
    pb = 1.00167406 + pb * wb
    pb = 2.83297682 + pb * wb
    r = tl.where(w < 5.0, pa, pb) * xd
    for _ in tl.static_range(3):
        r = r - (tl.erf(r) - xd) / (1.1283791670955126 * tl.exp(-r * r))
    ax = tl.abs(xd)
    r = tl.where(ax == 1.0, xd * _INF, r)
    r = tl.where(ax > 1.0, (_INF - _INF), r)
    r = tl.where(xd == 0, xd, r).to(x.dtype)
    return r


@triton.jit
def _logit(x, eps, USE_EPS, INTERP: tl.constexpr):
    """log(x / (1 - x)), x clamped to [eps, 1 - eps] when USE_EPS != 0 (NaN stays NaN)."""
    lo = tl.where(x < eps, eps, x)
    c = tl.where(lo > 1.0 - eps, 1.0 - eps, lo).to(x.dtype)
    x = tl.where((USE_EPS != 0) & (x == x), c, x)
    return _log(_fdiv(x, 1.0 - x), INTERP)


@triton.jit
def _sinc(x, INTERP: tl.constexpr):
    px = x * 3.141592653589793
    return tl.where(x == 0, _one(x), _fdiv(_sin(px, INTERP), px))


@triton.jit
def _hypot_interp(x, y):
    ax = tl.abs(x.to(tl.float64))
    ay = tl.abs(y.to(tl.float64))
    m = tl.where(ax > ay, ax, ay)
    n = tl.where(ax > ay, ay, ax)
    q = n / tl.where(m == 0, 1.0, m)
    r = m * tl.sqrt(1.0 + q * q)
    r = tl.where((ax != ax) | (ay != ay), (_INF - _INF), r)
    r = tl.where((ax == _INF) | (ay == _INF), _INF, r).to(x.dtype)
    return r


@triton.jit
def _xlogy(x, y, INTERP: tl.constexpr):
    r = tl.where(x == 0, x - x, x * _log(y, INTERP))
    return tl.where(y != y, y, r)


@triton.jit
def _logaddexp(x, y, BASE2: tl.constexpr, INTERP: tl.constexpr):
    """log(e**x + e**y), or with BASE2 log2(2**x + 2**y)."""
    m = tl.where(x > y, x, y)
    d = tl.abs(x - y)
    if BASE2:
        r = m + _fdiv(_log1p(_exp2(-d, INTERP), INTERP), _one(x) * _LN2)
    else:
        r = m + _log1p(_exp(-d, INTERP), INTERP)
    # torch's: one infinity on both sides is itself (no inf - inf); NaN propagates through d
    return tl.where((x == y) & ((x == _INF) | (x == -_INF)), x, r)


@triton.jit
def _heaviside(x, y):
    return tl.where(x == 0, y, (x > 0).to(y.dtype))


@triton.jit
def _nextafter(x, y):
    """The next representable value after x towards y, by the bits (float32 / float64)."""
    up = (y > x) == (x >= 0)                  # magnitude grows
    if x.dtype == tl.float64:
        b = x.to(tl.int64, bitcast=True)
        r = tl.where(up, b + 1, b - 1).to(tl.float64, bitcast=True)
        tiny = tl.full(x.shape, 1, tl.int64).to(tl.float64, bitcast=True)
    else:
        b = x.to(tl.int32, bitcast=True)
        r = tl.where(up, b + 1, b - 1).to(tl.float32, bitcast=True)
        tiny = tl.full(x.shape, 1, tl.int32).to(tl.float32, bitcast=True)
    r = tl.where(x == 0, tl.where(y > 0, tiny, -tiny), r)
    r = tl.where(x == y, y, r)
    return tl.where((x != x) | (y != y), x + y, r)


# ----------------------------------------------------------------------------- the kernel


@triton.jit
def _bits_f64(v):
    return (tl.zeros([1], tl.int64) + v).to(tl.float64, bitcast=True)


@triton.jit
def _scalars(sa, sb, sc, p0, p1, F64S: tl.constexpr):
    """The kernels' scalar operands and parameters: float64 ones arrive as their int64 bit
    patterns (F64S), the rest as they are."""
    if F64S:
        sa = _bits_f64(sa)
        sb = _bits_f64(sb)
        sc = _bits_f64(sc)
        p0 = _bits_f64(p0)
        p1 = _bits_f64(p1)
    return sa, sb, sc, p0, p1


@triton.jit
def _block_offsets(IDX64: tl.constexpr, BLOCK: tl.constexpr):
    # the BLOCK flat element offsets of this program, int64 where a tensor needs them (IDX64)
    pid = tl.program_id(0)
    if IDX64:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
    return offs


@triton.jit
def _dim(rem, d, so, sa, sb, sc, oo, ao, bo, co, LAST: tl.constexpr):
    if LAST:
        i = rem
    else:
        i = rem % d
        rem = rem // d
    return rem, oo + i * so, ao + i * sa, bo + i * sb, co + i * sc


@triton.jit
def _operand(ptr, off, mask, sval, MODE: tl.constexpr, ENC: tl.constexpr, CT: tl.constexpr):
    """One input in the compute type, shaped like `off`: MODE 't' tensor, '1' one element
    (a broadcast 0-dim tensor: loaded once), 's' scalar argument, 'z' absent."""
    if MODE == "t":
        v = _decode(tl.load(ptr + off, mask=mask), ENC).to(CT)
    elif MODE == "1":
        v = tl.zeros(off.shape, CT) + _decode(tl.load(ptr), ENC).to(CT)
    elif MODE == "s":
        v = (tl.zeros(off.shape, CT) + sval).to(CT)
    else:
        v = tl.zeros(off.shape, CT)
    return v


@triton.jit
def _ew_flat_block(out, a, b, c, sa, sb, sc, p0, p1, offs, mask,
                   OP: tl.constexpr, CT: tl.constexpr,
                   MA: tl.constexpr, MB: tl.constexpr, MC: tl.constexpr,
                   EA: tl.constexpr, EB: tl.constexpr, EC: tl.constexpr, EO: tl.constexpr,
                   INTERP: tl.constexpr):
    x = _operand(a, offs, mask, sa, MA, EA, CT)
    y = _operand(b, offs, mask, sb, MB, EB, CT)
    z = _operand(c, offs, mask, sc, MC, EC, CT)
    r = _apply(OP, x, y, z, p0, p1, INTERP)
    tl.store(out + offs, _encode(r, EO, out.dtype.element_ty), mask=mask)


@triton.jit
def _ew_flat_kernel(out, a, b, c, sa, sb, sc, p0, p1, N,
                    OP: tl.constexpr, CT: tl.constexpr,
                    MA: tl.constexpr, MB: tl.constexpr, MC: tl.constexpr,
                    EA: tl.constexpr, EB: tl.constexpr, EC: tl.constexpr, EO: tl.constexpr,
                    F64S: tl.constexpr, IDX64: tl.constexpr, INTERP: tl.constexpr,
                    BLOCK: tl.constexpr):
    """out[i] = OP(a[i], b[i], c[i]) for contiguous operands: no index math, wide accesses."""
    sa, sb, sc, p0, p1 = _scalars(sa, sb, sc, p0, p1, F64S)
    offs = _block_offsets(IDX64, BLOCK)
    _ew_flat_block(out, a, b, c, sa, sb, sc, p0, p1, offs, offs < N, OP, CT, MA, MB, MC,
                   EA, EB, EC, EO, INTERP)


@triton.jit
def _ew_2d_kernel(out, a, b, c, sa, sb, sc, p0, p1, M, N,
                  o0, o1, a0, a1, b0, b1, c0, c1,
                  OP: tl.constexpr, CT: tl.constexpr,
                  MA: tl.constexpr, MB: tl.constexpr, MC: tl.constexpr,
                  EA: tl.constexpr, EB: tl.constexpr, EC: tl.constexpr, EO: tl.constexpr,
                  F64S: tl.constexpr, IDX64: tl.constexpr, INTERP: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr):
    """Two dims left after collapsing (broadcast rows/columns, transposes): [BM, BN] tiles.

    No div/mod per element, and the compiler stages a tile through shared memory when
    an operand is contiguous along the other axis than the output, so a transposed
    operand is read coalesced as well.
    """
    sa, sb, sc, p0, p1 = _scalars(sa, sb, sc, p0, p1, F64S)
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    if IDX64:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
    x = _operand(a, rm[:, None] * a0 + rn[None, :] * a1, mask, sa, MA, EA, CT)
    y = _operand(b, rm[:, None] * b0 + rn[None, :] * b1, mask, sb, MB, EB, CT)
    z = _operand(c, rm[:, None] * c0 + rn[None, :] * c1, mask, sc, MC, EC, CT)
    r = _apply(OP, x, y, z, p0, p1, INTERP)
    tl.store(out + (rm[:, None] * o0 + rn[None, :] * o1), _encode(r, EO, out.dtype.element_ty),
             mask=mask)


@triton.jit
def _ew_kernel(out, a, b, c, sa, sb, sc, p0, p1, N,
               d0, d1, d2, d3, d4, d5,
               o0, o1, o2, o3, o4, o5,
               a0, a1, a2, a3, a4, a5,
               b0, b1, b2, b3, b4, b5,
               c0, c1, c2, c3, c4, c5,
               OP: tl.constexpr, NDIM: tl.constexpr, CT: tl.constexpr,
               MA: tl.constexpr, MB: tl.constexpr, MC: tl.constexpr,
               EA: tl.constexpr, EB: tl.constexpr, EC: tl.constexpr, EO: tl.constexpr,
               F64S: tl.constexpr, IDX64: tl.constexpr, INTERP: tl.constexpr,
               BLOCK: tl.constexpr):
    """out[i] = OP(a[i], b[i], c[i]) over N elements of any strides (0 where broadcast).

    NDIM >= 1 dims remain after collapsing: sizes d(6-NDIM)..d5 (d5 innermost) and
    per-operand strides, in elements.
    """
    sa, sb, sc, p0, p1 = _scalars(sa, sb, sc, p0, p1, F64S)
    offs = _block_offsets(IDX64, BLOCK)
    mask = offs < N
    rem = offs
    oo = offs * 0
    ao = oo
    bo = oo
    co = oo
    rem, oo, ao, bo, co = _dim(rem, d5, o5, a5, b5, c5, oo, ao, bo, co, NDIM == 1)
    if NDIM >= 2:
        rem, oo, ao, bo, co = _dim(rem, d4, o4, a4, b4, c4, oo, ao, bo, co, NDIM == 2)
    if NDIM >= 3:
        rem, oo, ao, bo, co = _dim(rem, d3, o3, a3, b3, c3, oo, ao, bo, co, NDIM == 3)
    if NDIM >= 4:
        rem, oo, ao, bo, co = _dim(rem, d2, o2, a2, b2, c2, oo, ao, bo, co, NDIM == 4)
    if NDIM >= 5:
        rem, oo, ao, bo, co = _dim(rem, d1, o1, a1, b1, c1, oo, ao, bo, co, NDIM == 5)
    if NDIM >= 6:
        rem, oo, ao, bo, co = _dim(rem, d0, o0, a0, b0, c0, oo, ao, bo, co, True)
    x = _operand(a, ao, mask, sa, MA, EA, CT)
    y = _operand(b, bo, mask, sb, MB, EB, CT)
    z = _operand(c, co, mask, sc, MC, EC, CT)
    r = _apply(OP, x, y, z, p0, p1, INTERP)
    tl.store(out + oo, _encode(r, EO, out.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- launch plan

# contiguous: 128-thread programs, one 16-byte vector a thread of the narrowest operand (f32 512
# elements a program, bf16 1024): the H200 sweep's winner (torch time / ours): copy / neg /
# exp f32 256 MiB 0.999-1.005 at 98-100% of copy, add f32 / bf16 1.000-1.004, against 4096
# elements on 8 warps' 0.950-0.959 on unary. Lost in the same sweep: 32 or 64 bytes a thread,
# 1-2 warps, an unmasked body with only the last block masked, programmatic dependent launch,
# 2048-8192 elements on 4-16 warps, persistent grid-stride walks (87-92% of copy), .cg /
# evict_first / .cs hints (docs/design/elementwise.md; that sweep's variant kernel is in the
# git history). `bench_elementwise.py --sweep-flat` times other BLOCK x warps of this kernel.
FLAT_BYTES, FLAT_WARPS = 16, 4
STRIDED_BLOCK, STRIDED_WARPS = 1024, 4  # 1 or 3+ dims after collapsing: index math per element
TILE_M, TILE_N, TILE_WARPS = 64, 64, 4  # 2 dims after collapsing: 2-D tiles
MAX_DIMS = 6
IDX64_LIMIT = 2**31                     # int64 offsets from here (tests lower it to run that path)


def flat_block(isz):
    """The contiguous kernel's elements a program, isz the narrowest operand's itemsize."""
    return max(1, FLAT_BYTES // isz) * 32 * FLAT_WARPS


# bf16, fp8 and bool move as raw integers of the same width (decoded in _decode/_encode)
_RAW = {"bfloat16": (_dt.int16, "bf"), "float8_e4m3fn": (_dt.uint8, "e4"),
        "float8_e5m2": (_dt.uint8, "e5"), "bool": (_dt.uint8, "b")}
_CT = {"float64": tl.float64, "float32": tl.float32, "int64": tl.int64, "int32": tl.int32,
       "int16": tl.int16, "int8": tl.int8, "uint8": tl.uint8, "bool": tl.uint8}


def compute_type(dtype):
    """The type an op computes in for a common dtype: float32 for every float below float64."""
    if dtype.kind == "f":
        return tl.float64 if dtype.itemsize == 8 else tl.float32
    return _CT[dtype.name]


def collapse(shape, strides_list):
    """Drop size-1 dims and merge neighbours contiguous in every operand.

    Returns (sizes, [strides per operand]) with the innermost dim last.
    """
    dims = [i for i, n in enumerate(shape) if n != 1]
    sizes = [shape[i] for i in dims]
    strides = [[s[i] for i in dims] for s in strides_list]
    if not sizes:
        return [1], [[0] for _ in strides_list]
    out_sizes, out_strides = [sizes[-1]], [[s[-1]] for s in strides]
    for j in range(len(sizes) - 2, -1, -1):
        inner_n = out_sizes[0]
        if all(s[j] == st[0] * inner_n for s, st in zip(strides, out_strides)):
            out_sizes[0] *= sizes[j]
        else:
            out_sizes.insert(0, sizes[j])
            for s, st in zip(strides, out_strides):
                st.insert(0, s[j])
    return out_sizes, out_strides


def _extent(sizes, strides):
    return sum((n - 1) * abs(s) for n, s in zip(sizes, strides))


def _is_interp(t):
    return t.device.type == "interp"


def _conv_kind(ct):
    """How scalars and params travel for compute type ct: 'b' float64 bits, 'f' float, 'i' int."""
    if ct == tl.float64:
        return "b"
    return "f" if ct.is_floating() else "i"


_ZERO = {"b": 0, "f": 0.0, "i": 0}

# Launch plans. Everything `run` derives from the operands' metadata (raw codecs, operand
# modes, dim collapsing, kernel choice, tiles, grid, constexprs) depends only on
#   (op, ct, out dtype/shape/strides, device type, per input: dtype/shape/strides of a
#    tensor or the class of a number, IDX64_LIMIT)
# so it is computed once per such key; a call then only converts its numbers and launches.


class _TooManyDims(NotImplementedError):
    """More dims than the strided kernel takes remain after merging; `run` splits the work."""


def _plan(op, out, inputs, ct, interp):
    """(kernel, grid, raw dtype of out or None, raw dtypes of the inputs, conversion kind,
    int arguments after the params, constexprs) for `run`; raises when unsupported. Reads
    only the operands' metadata (dtype, shape, strides; a number's class)."""
    n = out.numel()
    modes, encs, raws = [], [], []
    tensor_ops = [out]
    for x in inputs:
        if isinstance(x, Tensor):
            r = _RAW.get(x.dtype.name)
            raws.append(r[0] if r else None)
            encs.append(r[1] if r else "n")
            m = "1" if x.numel() == 1 and n > 1 else "t"
            modes.append(m)
            if m == "t":
                tensor_ops.append(x)
        else:
            raws.append(None)
            encs.append("n")
            modes.append("s")
    while len(modes) < 3:
        modes.append("z")
        encs.append("n")
    ro = _RAW.get(out.dtype.name)
    conv = _conv_kind(ct)
    # fast check first: a contiguous output and inputs in the output's layout are flat
    ost = out._stride
    flat = all(t._stride == ost for t in tensor_ops) and out.is_contiguous()
    if not flat:
        shape = tuple(out.shape)
        sizes, strides = collapse(shape, [t.stride() for t in tensor_ops])
        if len(sizes) > MAX_DIMS:
            raise _TooManyDims(
                f"element-wise {op}: {len(sizes)} dims remain after merging contiguous dims of "
                f"shape {shape}; at most {MAX_DIMS} are supported (call .contiguous() first)")
        flat = len(sizes) == 1 and all(s[0] == 1 for s in strides)
    idx64 = n >= IDX64_LIMIT or (not flat and any(_extent(sizes, s) >= IDX64_LIMIT
                                                  for s in strides))
    consts = dict(OP=op, CT=ct, MA=modes[0], MB=modes[1], MC=modes[2], EA=encs[0], EB=encs[1],
                  EC=encs[2], EO=ro[1] if ro else "n", F64S=conv == "b", IDX64=idx64,
                  INTERP=interp)
    plan = (ro[0] if ro else None), tuple(raws), conv
    if flat:
        isz = min(t.dtype.itemsize for t in tensor_ops)
        block = flat_block(isz)
        consts.update(BLOCK=block, num_warps=FLAT_WARPS)
        return (_ew_flat_kernel, (_cdiv(n, block),)) + plan + ((n,), consts)
    if len(sizes) == 2:
        # square tiles for big dims (transposes); a short outer dim gets wide, flat tiles
        bm = min(TILE_M, _np2(sizes[0]))
        bn = max(TILE_M * TILE_N // bm if bm < TILE_M else TILE_N, 16)
        bn = min(bn, max(16, _np2(sizes[1])))
        if _cdiv(sizes[1], bn) < 65536:
            st = iter(strides)
            per = [list(next(st))]
            for m in modes:
                per.append(list(next(st)) if m == "t" else [0, 0])
            grid = (_cdiv(sizes[0], bm), _cdiv(sizes[1], bn))
            consts.update(BM=bm, BN=bn, num_warps=TILE_WARPS)
            tail = (sizes[0], sizes[1], *per[0], *per[1], *per[2], *per[3])
            return (_ew_2d_kernel, grid) + plan + (tail, consts)
    lead = [0] * (MAX_DIMS - len(sizes))
    pad = [1] * len(lead) + list(sizes)
    st = iter(strides)
    per = [lead + list(next(st))]
    for m in modes:
        per.append(lead + list(next(st)) if m == "t" else [0] * MAX_DIMS)
    consts.update(NDIM=len(sizes), BLOCK=STRIDED_BLOCK, num_warps=STRIDED_WARPS)
    tail = (n, *pad, *per[0], *per[1], *per[2], *per[3])
    return (_ew_kernel, (_cdiv(n, STRIDED_BLOCK),)) + plan + (tail, consts)


_TL_OF_NAME = {t.name: t for t in (*_CT.values(), tl.float32, tl.float64)}


@memoize("kernels.elementwise.launch", 4096)
def _launch_plan(key):
    """`_plan` of a `run` key, memoised: (kernel, grid, rdo, rdi, conv, tail, items, pad,
    zeros). items: the constexprs as the tuple `launch_items` finds by identity; rdi None when
    every input is a tensor moving as itself; pad: the unused operands' scalar zeros; zeros:
    all three scalar slots' zeros. None for an empty output; raises _TooManyDims like `_plan`.
    The key names everything `_plan` reads, so its operands are rebuilt from it as metadata."""
    op, ct_name, out_dtype, shape, out_stride, devtype, _idx64_limit, *kinds = key
    if not math.prod(shape):
        return None
    out = Tensor._make(None, shape, out_stride, 0, out_dtype)
    inputs = [Tensor._make(None, k[1], k[2], 0, k[0]) if k.__class__ is tuple else k()
              for k in kinds]
    kernel, grid, rdo, rdi, conv, tail, consts = _plan(op, out, inputs, _TL_OF_NAME[ct_name],
                                                       devtype == "interp")
    zero = _ZERO[conv]
    if all(rd is None for rd in rdi) and all(isinstance(x, Tensor) for x in inputs):
        rdi = None
    return (kernel, grid, rdo, rdi, conv, tail, tuple(consts.items()),
            (zero,) * (3 - len(inputs)), (zero,) * 3)


def run(op, out, inputs, params=(0, 0), ct=None):
    """Launch `op` writing `out`.

    inputs: up to 3 operands, each a Tensor already broadcast to out's shape (any
    strides, stride 0 allowed, same device) or a Python number; params: two op
    parameters (alpha, slope, ...). ct: the compute type (default from out's dtype).
    """
    if ct is None:
        ct = compute_type(out.dtype)
    shape = out._shape
    # the key: everything `_plan` reads. ct by name (a tl.dtype hashes in Python); a tensor
    # operand by (dtype, shape, strides), a number by its class (int/float/bool decide the
    # conversion and the launch kinds); the offsets only move pointers, checked per launch
    key = [op, ct.name, out._dtype, shape, out._stride, out._storage.device.type, IDX64_LIMIT]
    for x in inputs:
        if x.__class__ is Tensor or isinstance(x, Tensor):
            key.append((x._dtype, x._shape, x._stride))
        else:
            key.append(x.__class__)
    try:
        plan = _launch_plan(tuple(key))
    except _TooManyDims:
        # one launch per index of the outermost dim: each slice has a dim fewer
        for i in range(shape[0]):
            run(op, out.select(0, i),
                [x.select(0, i) if isinstance(x, Tensor) else x for x in inputs],
                params, ct=ct)
        return out
    if plan is None:            # an empty output: nothing to launch
        return out
    kernel, grid, rdo, rdi, conv, tail, items, pad, zeros = plan
    ro = out if rdo is None else Tensor._make(out._storage, shape, out._stride, out._offset, rdo)
    p0, p1 = params
    if conv == "f":
        p0, p1 = float(p0), float(p1)
    elif conv == "b":   # Python floats travel as float32 kernel arguments: send float64 bits
        p0, p1 = _f64_bits(float(p0)), _f64_bits(float(p1))
    else:
        p0 = p0 if isinstance(p0, float) else int(p0)
        p1 = p1 if isinstance(p1, float) else int(p1)
    if rdi is None:     # tensors moving as themselves: no raw views, no scalars
        args = (ro, *inputs, *(ro,) * len(pad), *zeros, p0, p1, *tail)
    else:
        zero = _ZERO[conv]
        targs = [ro]
        svals = []
        for x, rd in zip(inputs, rdi):
            if isinstance(x, Tensor):
                targs.append(x if rd is None else Tensor._make(x._storage, x._shape, x._stride,
                                                               x._offset, rd))
                svals.append(zero)
            else:
                targs.append(ro)
                svals.append(_f64_bits(float(x)) if conv == "b" else
                             (float(x) if conv == "f" else int(x)))
        args = (*targs, *(ro,) * (3 - len(inputs)), *svals, *pad, p0, p1, *tail)
    launch_items(kernel, grid, args, items)
    return out


# ----------------------------------------------------------------------------- entries

_SAME_WIDTH = {1: _dt.uint8, 2: _dt.int16, 4: _dt.int32, 8: _dt.int64}


# DType -> compute_type(DType), memoised for the entries
_ct_of = memoize("kernels.elementwise.compute_type", 64)(compute_type)


@register("copy_", "triton")
def copy_(dst, src):
    """dst[...] = src (src already expanded to dst's shape), casting by dtypes.py's rules."""
    if dst._dtype.kind == "c" or src._dtype.kind == "c":
        from .complex import copy_complex   # copies of the real views (kernels/complex.py)
        return copy_complex(dst, src)
    if dst._dtype is src._dtype:
        # a bit copy: NaN payloads and every value survive unchanged
        w = _SAME_WIDTH[dst._dtype.itemsize]
        d = Tensor._make(dst._storage, dst._shape, dst._stride, dst._offset, w)
        s = Tensor._make(src._storage, src._shape, src._stride, src._offset, w)
        return run("copy", d, [s], ct=_ct_of(w))
    return run("copy", dst, [src], ct=_ct_of(src._dtype))


@register("fill_", "triton")
def fill_(dst, value):
    """Every element of dst = value, converted on the host by the cpu rules (bit-exact)."""
    if dst._dtype.kind == "c":
        from .complex import fill_complex
        return fill_complex(dst, value)
    with np.errstate(all="ignore"):
        bits = _dt.cast(value, dst.dtype).reshape(1)
    w = _SAME_WIDTH[dst.dtype.itemsize]
    ival = int(bits.view(w.np)[0])
    d = Tensor._make(dst._storage, dst.shape, dst.stride(), dst._offset, w)
    return run("copy", d, [ival], ct=compute_type(w))


def mul(a, b, out=None):
    """a * b for kernels that compose element-wise steps (kernels/fft.py): b a tensor of a's
    dtype and device that broadcasts to a's shape, or a Python number; into `out` (a's shape
    and dtype) or a fresh tensor. The op layer's `mul` with its checks is above this layer."""
    from ..dispatch import impl
    shape, dev = a._shape, a._storage.device
    if isinstance(b, Tensor) and b._shape != shape:
        b = b.expand(shape)
    if out is None:
        out = Tensor._empty(shape, a._dtype, dev)
    if out.numel():
        d = a._dtype
        ct = (_dt.float64 if d is _dt.float64 else _dt.float32) if d.kind == "f" else d
        impl("mul", dev)(out, [a, b], (0, 0), ct)
    return out


def _make(op):
    def entry(out, inputs, params, compute_dtype):
        if compute_dtype.kind == "c":       # complex: its own kernels (kernels/complex.py)
            from .complex import run_complex
            return run_complex(op, out, inputs, params, compute_dtype)
        return run(op, out, inputs, params, _ct_of(compute_dtype))
    entry.__name__ = f"triton_{op}"
    return entry


# ----------------------------------------------------------------------------- declared ops
# `_apply`, the scalar op every kernel above calls, is generated: one branch per declared op
# (its Triton expression, ops/_declare.py), read from the registry (nbxtensor/declarations.py)
# this module subscribes to. It is Python source compiled in this module's namespace (so the expressions reach the helpers above) and
# kept in linecache, where Triton's JIT and interpreter read a function's source.

_APPLY_FILE = "<nbxtensor.kernels.elementwise: _apply generated from ops/_declare.py>"
_EXPR_ARGS = frozenset(("x", "y", "z", "p0", "p1", "INTERP", "IS_FLOAT"))
_DECLARED: dict = {}            # entry -> Triton expression, in declaration order
_CALLERS = (_ew_flat_block, _ew_flat_kernel, _ew_2d_kernel, _ew_kernel)
_batch = True                   # while the table is read at import: one rebuild at the end


def _checked_expr(op) -> str:
    """op's Triton expression, refused (at declaration, not at the first compile) when it does
    not parse or names something that is neither an operand nor in this module."""
    import ast
    import builtins
    try:
        tree = ast.parse(op.tl, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"declare {op.name}: the Triton expression {op.tl!r} does not parse: "
                         f"{e.msg}") from None
    g = globals()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in _EXPR_ARGS and node.id not in g \
                and not hasattr(builtins, node.id):
            raise ValueError(f"declare {op.name}: the Triton expression {op.tl!r} names "
                             f"{node.id!r}, which is neither an operand "
                             f"({', '.join(sorted(_EXPR_ARGS))}) nor a helper of "
                             f"kernels/elementwise.py")
    return op.tl


def apply_source(declared: dict) -> str:
    """The Python source of `_apply` for {entry: Triton expression}."""
    lines = ["def _apply(OP: tl.constexpr, x, y, z, p0, p1, INTERP: tl.constexpr):",
             '    """The scalar op: x, y, z in the compute type, p0, p1 op parameters."""',
             "    IS_FLOAT: tl.constexpr = x.dtype.is_floating()"]
    kw = "if"
    for entry, expr in declared.items():
        lines += [f"    {kw} OP == {entry!r}:", f"        r = {expr}"]
        kw = "elif"
    fall = '        tl.static_assert(False, "unknown element-wise op")'
    lines += (["    else:", fall] if declared else [fall[4:]]) + ["    return r", ""]
    return "\n".join(lines)


def _rebuild_apply() -> None:
    import linecache
    src = apply_source(_DECLARED)
    linecache.cache[_APPLY_FILE] = (len(src), None, src.splitlines(True), _APPLY_FILE)
    local: dict = {}
    exec(compile(src, _APPLY_FILE, "exec"), globals(), local)
    globals()["_apply"] = triton.jit(local["_apply"])
    for k in _CALLERS:          # their cache keys hash `_apply`'s source: recompute them
        k.hash = None


def _on_declare(op) -> None:
    _DECLARED[op.entry] = _checked_expr(op)
    if not _batch:
        _rebuild_apply()
    register(op.entry, "triton")(_make(op.entry))


def _on_undeclare(op) -> None:
    # (ops/elementwise.py unregisters the entry)
    _DECLARED.pop(op.entry, None)
    _rebuild_apply()


_declarations.subscribe(_on_declare, _on_undeclare)
_batch = False
_rebuild_apply()
