"""The dtype table: one row per type, and torch's promotion rules over it.

Every other module asks this table; no second list of dtypes exists anywhere.

Casts (the documented rule every device follows; tested in tests/test_dtypes.py
against NumPy/ml_dtypes, which are the cpu implementation):
  * float -> narrower float rounds to nearest, ties to even. float32 -> any narrower
    float and float64 -> float16 round once. float64 -> bfloat16 / float8 goes through
    float32 first (as ml_dtypes and torch do), so a float64 value within 2**-29
    (relative) of a tie between two targets can round twice.
  * a value that rounds (as if the exponent were unbounded) beyond the target's largest
    finite value becomes +-inf for float16, bfloat16 and float8_e5m2, and NaN for
    float8_e4m3fn (it has no inf): non-saturating, as torch and ml_dtypes. So in
    float16 65519 -> 65504 but 65520 -> inf; in float8_e5m2 61440 -> inf; in
    float8_e4m3fn 464 -> 448 (the tie goes to the even 448) but 464.5 -> NaN, and
    +-inf -> NaN. NaN stays NaN.
  * integer -> float rounds to nearest even (int64 -> float16 may give inf).
  * float -> integer truncates toward zero; NaN, inf and out-of-range inputs give an
    unspecified value (as in torch and C). float -> bool is `x != 0` (NaN -> True).
  * integer -> narrower integer wraps (two's complement); x -> bool is `x != 0`.
"""
from __future__ import annotations

import builtins

import ml_dtypes
import numpy as np

__all__ = [
    "DType", "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
    "float32", "float64", "float8_e4m3fn", "float8_e5m2", "half", "float", "double",
    "long", "int", "short", "all_dtypes", "as_dtype", "promote_types", "result_type",
    "get_default_dtype", "set_default_dtype", "finfo", "iinfo",
]


class DType:
    """A tensor element type. Compare with `==`; instances are unique per type."""

    __slots__ = ("name", "itemsize", "np", "triton", "kind", "safetensors")

    def __init__(self, name, np_dtype, triton, kind, safetensors):
        self.name = name
        self.np = np.dtype(np_dtype)
        self.itemsize = self.np.itemsize
        self.triton = triton          # Triton's spelling in kernel signatures (`*fp16`)
        self.kind = kind              # 'b' bool, 'u' unsigned, 'i' signed, 'f' floating
        self.safetensors = safetensors

    @property
    def is_floating_point(self) -> builtins.bool:
        return self.kind == "f"

    @property
    def is_signed(self) -> builtins.bool:
        return self.kind in ("i", "f")

    @property
    def is_float8(self) -> builtins.bool:
        return self.name.startswith("float8")

    def __repr__(self):
        return f"nbxtensor.{self.name}"

    def __reduce__(self):
        return (as_dtype, (self.name,))


_ROWS = [
    # name,            numpy / ml_dtypes dtype,     triton,    kind, safetensors
    ("bool",          np.bool_,                     "u1",      "b", "BOOL"),
    ("uint8",         np.uint8,                     "u8",      "u", "U8"),
    ("int8",          np.int8,                      "i8",      "i", "I8"),
    ("int16",         np.int16,                     "i16",     "i", "I16"),
    ("int32",         np.int32,                     "i32",     "i", "I32"),
    ("int64",         np.int64,                     "i64",     "i", "I64"),
    ("float16",       np.float16,                   "fp16",    "f", "F16"),
    ("bfloat16",      ml_dtypes.bfloat16,           "bf16",    "f", "BF16"),
    ("float32",       np.float32,                   "fp32",    "f", "F32"),
    ("float64",       np.float64,                   "fp64",    "f", "F64"),
    ("float8_e4m3fn", ml_dtypes.float8_e4m3fn,      "fp8e4nv", "f", "F8_E4M3"),
    ("float8_e5m2",   ml_dtypes.float8_e5m2,        "fp8e5",   "f", "F8_E5M2"),
]

_BY_NAME: dict[str, DType] = {}
for _row in _ROWS:
    _BY_NAME[_row[0]] = DType(*_row)
all_dtypes: tuple[DType, ...] = tuple(_BY_NAME.values())
_BY_NP = {d.np: d for d in all_dtypes}

bool = _BY_NAME["bool"]  # noqa: A001 - torch's name
uint8 = _BY_NAME["uint8"]
int8 = _BY_NAME["int8"]
int16 = _BY_NAME["int16"]
int32 = _BY_NAME["int32"]
int64 = _BY_NAME["int64"]
float16 = _BY_NAME["float16"]
bfloat16 = _BY_NAME["bfloat16"]
float32 = _BY_NAME["float32"]
float64 = _BY_NAME["float64"]
float8_e4m3fn = _BY_NAME["float8_e4m3fn"]
float8_e5m2 = _BY_NAME["float8_e5m2"]
# torch's aliases
half, float, double = float16, float32, float64  # noqa: A001
long, int, short = int64, int32, int16  # noqa: A001
_ALIASES = {"half": float16, "float": float32, "double": float64, "long": int64,
            "int": int32, "short": int16, "bf16": bfloat16, "fp16": float16,
            "fp32": float32, "fp64": float64}

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
            d = _BY_NP.get(np.dtype(x))
        except TypeError:
            d = None
        if d is not None:
            return d
    raise TypeError(f"{argname}: unknown or unsupported dtype {x!r}; expected one of "
                    f"{', '.join(d.name for d in all_dtypes)}")


def promote_types(a, b) -> DType:
    """torch.promote_types: the smallest dtype both `a` and `b` convert to safely."""
    a, b = as_dtype(a, "type1"), as_dtype(b, "type2")
    if a is b:
        return a
    if a.is_float8 or b.is_float8:
        raise TypeError(f"promote_types: promotion of float8 types is not supported "
                        f"({a.name} with {b.name}); cast explicitly")
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
    return {"b": 0, "u": 1, "i": 1, "f": 2}[d.kind]


def _scalar_dtype(x) -> DType:
    if isinstance(x, (builtins.bool, np.bool_)):
        return bool
    if isinstance(x, (builtins.int, np.integer)):
        return int64
    if isinstance(x, (builtins.float, np.floating)):
        return _default_float
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
        if _category(lower) > _category(higher):
            return promote_types(higher, lower)
        return higher

    return combine(groups[0], combine(groups[1], groups[2]))


class finfo:
    """Machine limits of a floating dtype (bits, eps, max, min, tiny)."""

    def __init__(self, d=None):
        d = _default_float if d is None else as_dtype(d)
        if not d.is_floating_point:
            raise TypeError(f"finfo: expected a floating dtype, got {d}")
        fi = ml_dtypes.finfo(d.np)
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
