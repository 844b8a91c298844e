"""The dtype table: one row per type, and torch's promotion rules over it.

Every other module asks this table; no second list of dtypes exists anywhere.

Casts (the documented rule every device follows; tested in tests/ops/test_dtypes.py and
tests/ops/test_casts.py; on the host `cast`/`copy_into` below implement it over NumPy):
  * float -> narrower float rounds to nearest, ties to even. float32 -> any narrower
    float and float64 -> float16 round once. bfloat16 and float8 are reached from
    float32 only: a float64, int32 or int64 source is first rounded to float32 (as
    torch and the kernels do), so a float64 value within 2**-29 (relative) of a tie
    between two targets can round twice. This is our rule, not ml_dtypes': its own
    astype rounds float64/int64 directly since 0.7 and through float32 before.
  * a value that rounds (as if the exponent were unbounded) beyond the target's largest
    finite value becomes +-inf for float16, bfloat16 and float8_e5m2, and NaN for
    float8_e4m3fn (it has no inf): non-saturating, as torch and ml_dtypes. So in
    float16 65519 -> 65504 but 65520 -> inf; in float8_e5m2 61440 -> inf; in
    float8_e4m3fn 464 -> 448 (the tie goes to the even 448) but 464.5 -> NaN, and
    +-inf -> NaN. NaN stays NaN.
  * integer -> float rounds to nearest even (int64 -> float16 may give inf; -> bfloat16
    and float8 through float32, as above).
  * float -> integer truncates toward zero; NaN, inf and out-of-range inputs give an
    unspecified value (as in torch and C). float -> bool is `x != 0` (NaN -> True).
  * integer -> narrower integer wraps (two's complement); x -> bool is `x != 0`.
"""
from __future__ import annotations

import builtins

import numpy as np

__all__ = [
    "DType", "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
    "float32", "float64", "float8_e4m3fn", "float8_e5m2", "complex64", "complex128", "half",
    "float", "double", "cfloat", "cdouble", "long", "int", "short", "all_dtypes",
    "complex_dtypes", "to_complex", "to_real", "as_dtype", "promote_types", "result_type",
    "get_default_dtype", "set_default_dtype", "finfo", "iinfo", "cast", "copy_into",
]


class DType:
    """A tensor element type. Compare with `==`; instances are unique per type."""

    __slots__ = ("name", "itemsize", "np", "triton", "kind", "safetensors", "via_f32")

    def __init__(self, name, np_dtype, itemsize, triton, kind, safetensors):
        self.name = name
        if np_dtype is not None:      # else ml_dtypes' type of this name, on first use of .np
            self.np = np.dtype(np_dtype)
        self.itemsize = itemsize
        self.triton = triton          # Triton's spelling in kernel signatures (`*fp16`)
        self.kind = kind              # 'b' bool, 'u' unsigned, 'i' signed, 'f' floating,
                                      # 'c' complex (triton None: kernels see its real view)
        self.safetensors = safetensors
        # the ml_dtypes rows (bfloat16, float8) are also those cast to from float32 only
        self.via_f32 = np_dtype is None

    def __getattr__(self, attr):
        # Only reached while a slot is unset: `np` of an ml_dtypes row. Importing ml_dtypes
        # costs more than the rest of `import nbxtensor` (0.5-1 s on 2 cores), so it waits
        # for the first tensor of these dtypes; afterwards the slot answers directly.
        if attr != "np" or not self.via_f32:
            raise AttributeError(f"'DType' object has no attribute {attr!r}")
        import ml_dtypes
        self.np = np.dtype(getattr(ml_dtypes, self.name))
        _BY_NP[self.np] = self
        return self.np

    @property
    def is_floating_point(self) -> builtins.bool:
        return self.kind == "f"

    @property
    def is_complex(self) -> builtins.bool:
        return self.kind == "c"

    @property
    def is_signed(self) -> builtins.bool:
        return self.kind in ("i", "f", "c")

    @property
    def is_float8(self) -> builtins.bool:
        return self.name.startswith("float8")

    def __repr__(self):
        return f"nbxtensor.{self.name}"

    def __reduce__(self):
        return (as_dtype, (self.name,))


_ROWS = [
    # name,           NumPy dtype (None: ml_dtypes'), size, triton, kind, safetensors
    ("bool",          np.bool_,      1, "u1",      "b", "BOOL"),
    ("uint8",         np.uint8,      1, "u8",      "u", "U8"),
    ("int8",          np.int8,       1, "i8",      "i", "I8"),
    ("int16",         np.int16,      2, "i16",     "i", "I16"),
    ("int32",         np.int32,      4, "i32",     "i", "I32"),
    ("int64",         np.int64,      8, "i64",     "i", "I64"),
    ("float16",       np.float16,    2, "fp16",    "f", "F16"),
    ("bfloat16",      None,          2, "bf16",    "f", "BF16"),
    ("float32",       np.float32,    4, "fp32",    "f", "F32"),
    ("float64",       np.float64,    8, "fp64",    "f", "F64"),
    ("float8_e4m3fn", None,          1, "fp8e4nv", "f", "F8_E4M3"),
    ("float8_e5m2",   None,          1, "fp8e5",   "f", "F8_E5M2"),
]
# Complex rows: apart from `all_dtypes` (which stays the real types, as torch's "all types"),
# so code that iterates over every real dtype keeps its meaning. No Triton spelling: kernels
# read a complex tensor as its interleaved float32/float64 view (view_as_real); safetensors
# has no complex type.
_COMPLEX_ROWS = [
    ("complex64",     np.complex64,  8, None,      "c", None),
    ("complex128",    np.complex128, 16, None,     "c", None),
]

_BY_NAME: dict[str, DType] = {}
for _row in _ROWS:
    _BY_NAME[_row[0]] = DType(*_row)
all_dtypes: tuple[DType, ...] = tuple(_BY_NAME.values())
for _row in _COMPLEX_ROWS:
    _BY_NAME[_row[0]] = DType(*_row)
complex_dtypes: tuple[DType, ...] = tuple(_BY_NAME[r[0]] for r in _COMPLEX_ROWS)
# NumPy dtype -> row; the ml_dtypes rows enter when their `.np` is first resolved
_BY_NP = {d.np: d for d in all_dtypes + complex_dtypes if not d.via_f32}

# the public names, in the tables' order (checked below: a row added out of step is an
# import error, not a misnamed dtype)
(bool, uint8, int8, int16, int32, int64, float16, bfloat16,  # noqa: A001 - torch's names
 float32, float64, float8_e4m3fn, float8_e5m2) = all_dtypes
complex64, complex128 = complex_dtypes
if any(globals()[d.name] is not d for d in all_dtypes + complex_dtypes):
    raise ImportError("nbxtensor.dtypes: the public dtype names are out of step with _ROWS")
# torch's aliases
half, float, double = float16, float32, float64  # noqa: A001
long, int, short = int64, int32, int16  # noqa: A001
cfloat, cdouble = complex64, complex128
_ALIASES = {"half": float16, "float": float32, "double": float64, "long": int64,
            "int": int32, "short": int16, "bf16": bfloat16, "fp16": float16,
            "fp32": float32, "fp64": float64, "cfloat": complex64, "cdouble": complex128}


def cast_method(name: str, dtype: DType, via: str):
    """One of torch's shorthand cast methods (Tensor.float(), Module.half(), ...): a method
    `name` that returns self.<via>(dtype), so Tensor and Module state only the name, the
    dtype and how they cast."""
    def method(self):
        return getattr(self, via)(dtype)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"self.{via}(nbxtensor.{dtype.name}), as torch's .{name}()."
    return method

_default_float = float32


def get_default_dtype() -> DType:
    return _default_float


def set_default_dtype(d) -> None:
    """Set the dtype of Python floats and float factories (float16/bfloat16/float32/float64)."""
    global _default_float
    d = as_dtype(d, "d")
    if d not in (float16, bfloat16, float32, float64):
        raise TypeError(f"set_default_dtype: d must be a floating dtype other than float8, got {d}")
    _default_float = d


def as_dtype(x, argname: str = "dtype") -> DType:
    """Accept a DType, its name ('float32', 'bf16', 'torch.float16'), or a NumPy dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        name = x.removeprefix("torch.").removeprefix("nbxtensor.")
        d = _BY_NAME.get(name) or _ALIASES.get(name)
        if d is not None:
            return d
    elif x is not None:  # np.dtype(None) would be float64
        try:
            npd = np.dtype(x)
        except TypeError:
            d = None
        else:
            d = _BY_NP.get(npd)
            if d is None:   # an ml_dtypes type whose row has not resolved `.np` yet
                d = _BY_NAME.get(npd.name)
                d = d if d is not None and d.via_f32 and d.np == npd else None
        if d is not None:
            return d
    raise TypeError(f"{argname}: unknown or unsupported dtype {x!r}; expected one of "
                    f"{', '.join(d.name for d in all_dtypes + complex_dtypes)}")


def to_complex(d: DType) -> DType:
    """The complex dtype whose parts are `d` (float64 -> complex128; any other real type,
    which torch would give complex32 for float16 or refuse for bfloat16, -> complex64)."""
    return d if d.kind == "c" else (complex128 if d is float64 else complex64)


def to_real(d: DType) -> DType:
    """The dtype of a complex dtype's parts (complex64 -> float32); a real `d` unchanged."""
    return {complex64: float32, complex128: float64}.get(d, d)


def promote_types(a, b) -> DType:
    """torch.promote_types: the smallest dtype both `a` and `b` convert to safely."""
    a, b = as_dtype(a, "type1"), as_dtype(b, "type2")
    if a is b:
        return a
    if a.is_float8 or b.is_float8:
        raise TypeError(f"promote_types: promotion of float8 types is not supported "
                        f"({a.name} with {b.name}); cast explicitly")
    if a.kind == "c" or b.kind == "c":
        # the complex type whose parts hold both: complex64 + float64 -> complex128
        return complex128 if complex128 in (a, b) or float64 in (a, b) else complex64
    if a.kind == "b":
        return b
    if b.kind == "b":
        return a
    if a.kind == "f" and b.kind == "f":
        if {a, b} == {float16, bfloat16}:
            return float32
        return a if a.itemsize > b.itemsize else b
    if a.kind == "f":
        return a
    if b.kind == "f":
        return b
    # two integers: uint8 with a signed type needs a wider signed type
    if a.kind != b.kind:
        u, s = (a, b) if a.kind == "u" else (b, a)
        return int16 if s is int8 else s
    return a if a.itemsize > b.itemsize else b


def _category(d: DType) -> builtins.int:
    return {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}[d.kind]


def _scalar_dtype(x) -> DType:
    if isinstance(x, (builtins.bool, np.bool_)):
        return bool
    if isinstance(x, (builtins.int, np.integer)):
        return int64
    if isinstance(x, (builtins.float, np.floating)):
        return _default_float
    if isinstance(x, (builtins.complex, np.complexfloating)):
        return complex128 if _default_float is float64 else complex64
    raise TypeError(f"result_type: expected tensors or Python numbers, got {type(x).__name__}")


def result_type(*operands) -> DType:
    """torch.result_type over tensors, 0-dim tensors and Python scalars.

    Dimensioned tensors take priority over 0-dim tensors, which take priority over
    Python scalars -- except that a lower group of a higher category (bool < integer
    < floating) lifts the result to that category.
    """
    if not operands:
        raise TypeError("result_type: expected at least one operand")
    groups: list[DType | None] = [None, None, None]  # dim tensors, 0-dim tensors, scalars
    for x in operands:
        dt = getattr(x, "dtype", None)
        if isinstance(dt, DType) and hasattr(x, "ndim"):
            g = 0 if x.ndim > 0 else 1
        else:
            dt, g = _scalar_dtype(x), 2
        groups[g] = dt if groups[g] is None else promote_types(groups[g], dt)

    def combine(higher, lower):
        if higher is None:
            return lower
        if lower is None:
            return higher
        if lower.kind == "c" and higher.kind == "f":
            # torch keeps the floating width of the higher group: float32 + complex128 0-dim
            # -> complex64
            return to_complex(higher)
        if _category(lower) > _category(higher):
            return promote_types(higher, lower)
        return higher

    return combine(groups[0], combine(groups[1], groups[2]))


class finfo:
    """Machine limits of a floating dtype (bits, eps, max, min, tiny)."""

    def __init__(self, d=None):
        d = _default_float if d is None else to_real(as_dtype(d))   # complex: its parts'
        if not d.is_floating_point:
            raise TypeError(f"finfo: expected a floating dtype, got {d}")
        if d.via_f32:
            import ml_dtypes
            fi = ml_dtypes.finfo(d.np)
        else:
            fi = np.finfo(d.np)
        self.dtype = d
        self.bits = d.itemsize * 8
        self.eps = builtins.float(fi.eps)
        self.max = builtins.float(fi.max)
        self.min = builtins.float(fi.min)
        self.tiny = self.smallest_normal = builtins.float(fi.tiny)
        self.resolution = builtins.float(fi.resolution)

    def __repr__(self):
        return f"finfo(dtype={self.dtype.name}, eps={self.eps}, max={self.max}, min={self.min})"


class iinfo:
    """Limits of an integer dtype (bits, max, min)."""

    def __init__(self, d):
        d = as_dtype(d)
        if d.kind not in "ui" and d is not bool:
            raise TypeError(f"iinfo: expected an integer dtype, got {d}")
        ii = np.iinfo(d.np) if d is not bool else None
        self.dtype = d
        self.bits = d.itemsize * 8
        self.max = 1 if ii is None else builtins.int(ii.max)
        self.min = 0 if ii is None else builtins.int(ii.min)

    def __repr__(self):
        return f"iinfo(dtype={self.dtype.name}, max={self.max}, min={self.min})"


def _source(a: np.ndarray, d: DType) -> np.ndarray:
    """What NumPy is handed to cast `a` into `d`: `a`, or its float32 rounding when `d` is
    reached from float32 only and `a` holds values float32 does not (float64, int32, int64)."""
    if d.via_f32 and a.dtype.kind in "iuf" and a.dtype.itemsize >= 4 and a.dtype != np.float32:
        with np.errstate(over="ignore"):   # beyond float32 is inf, as the target would give
            return a.astype(np.float32)
    return a


def cast(a, d: DType, copy: builtins.bool = True) -> np.ndarray:
    """`a` (an array or a number) as a C-contiguous NumPy array of dtype `d`, by the cast
    rule above; a new array unless copy=False and `a` already is one."""
    a = np.asarray(a)
    s = _source(a, d)
    return s.astype(d.np, order="C", copy=copy and s is a)


def copy_into(dst: np.ndarray, src) -> None:
    """dst[...] = src (broadcast), converting by the cast rule above."""
    src = np.asarray(src)
    np.copyto(dst, _source(src, as_dtype(dst.dtype)), casting="unsafe")


_INT_RANGE = {d: (builtins.int(np.iinfo(d.np).min), builtins.int(np.iinfo(d.np).max))
              for d in all_dtypes if d.kind in "ui"}


def check_scalar(value, d: DType, op: str, argname: str = "value"):
    """`value` (a Python or NumPy number) as the Python number a tensor of dtype `d` holds.

    The one check for numbers entering integer tensors (factories, fill_, the scalar operands
    of element-wise ops, indexing values). Unlike a cast between tensors nothing wraps: an int
    outside `d`'s range (so a negative one for uint8), and a float that is NaN, +-inf or whose
    truncation toward zero is outside it, raise OverflowError naming `op`, `argname`, the value
    and the range (torch raises "value cannot be converted to type int32_t without overflow").
    A bool dtype takes any number as `value != 0`; a float dtype takes any number unchanged
    (its cast rule rounds it); a complex dtype takes any number, complex ones too. Anything
    else, and a complex number for a real dtype, is a TypeError.
    """
    if isinstance(value, np.generic):
        value = value.item()
    if d.kind == "c" and isinstance(value, (builtins.int, builtins.float, builtins.complex)):
        return value
    if not isinstance(value, (builtins.int, builtins.float)):
        raise TypeError(f"{op}: {argname} must be a number, got {type(value).__name__}")
    r = _INT_RANGE.get(d)
    if r is None:
        return builtins.bool(value) if d.kind == "b" else value
    if isinstance(value, builtins.float) and (value != value or abs(value) == np.inf):
        raise OverflowError(f"{op}: {argname} {value} cannot be converted to {d.name}: it has no "
                            f"integer value (range [{r[0]}, {r[1]}])")
    v = builtins.int(value)     # a float truncates toward zero, as torch
    if not r[0] <= v <= r[1]:
        raise OverflowError(f"{op}: {argname} {value!r} cannot be converted to {d.name} without "
                            f"overflow (range [{r[0]}, {r[1]}])")
    return v
