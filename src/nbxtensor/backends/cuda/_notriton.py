"""The stand-in for Triton that nbxtensor's kernel modules import where Triton is absent
(or `NBX_ARCHIVE_ONLY=1`): enough of `triton`, `triton.language`, `libdevice` and Gluon for
a kernel module to import, and nothing that compiles.

`jit` (and `gluon.jit`) return an `ArchiveKernel`: the kernel's Python function with its
parameters read by `inspect` (names, constexpr annotations, defaults, do_not_specialize),
its body never run. The launcher binds it like a @triton.jit kernel, computes the same
launch key and loads the cubin from the kernel archive (aot.py); a variant the archive
lacks raises `MissingKernelError`, never a compile. Module-level values the kernel modules
build from `tl` (`tl.constexpr(...)`, the dtypes) are small objects with Triton's names,
so a dtype passed as a constexpr keys as Triton's does (`str(tl.float32) == "fp32"`).

Names used only inside kernel bodies (`tl.load`, `libdevice.exp`, `mbarrier`, ...) are
`_Absent` placeholders: the body is never traced here, and touching one from host code
says so.
"""
from __future__ import annotations

from .aot import Kernel

__all__ = ["ArchiveKernel", "triton", "tl", "libdevice", "gluon", "gl", "hopper", "is_stand_in"]

IN_USE = False     # set by kernels/_triton.py when the kernel modules import this stand-in


class ArchiveKernel(Kernel):
    """A kernel imported without Triton: launchable from the kernel archive only."""

    archive_only = True

    def __init__(self, fn, gluon=False, **kwargs):
        super().__init__(fn, **kwargs)
        self._gluon = gluon

    def jit_function(self):
        raise RuntimeError(f"kernel {self.fn.__module__}:{self.fn.__qualname__} was imported "
                           f"without Triton (the stand-in of backends/cuda/_notriton.py): it "
                           f"launches from the kernel archive only and cannot be compiled")

    def is_gluon(self) -> bool:
        return self._gluon

    def __getitem__(self, grid):
        # `kernel[grid](...)` as Triton's, routed to nbx.launch (nbxtensor tensors only here)
        def call(*args, **kwargs):
            from ..launch import _call_with_grid
            return _call_with_grid(self, grid, args, kwargs)
        return call

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self!r}: a Triton kernel cannot be called directly; launch it "
                           f"with nbx.launch(kernel, grid, ...) or kernel[grid](...)")


def is_stand_in(kernel) -> bool:
    return getattr(kernel, "archive_only", False) is True


def _jit_decorator(gluon: bool):
    def jit(fn=None, **kwargs):
        if fn is None:
            return lambda f: ArchiveKernel(f, gluon=gluon, **kwargs)
        return ArchiveKernel(fn, gluon=gluon, **kwargs)
    return jit


class _Absent:
    """A name of Triton's language used inside kernel bodies; never called on the host."""

    def __init__(self, path: str):
        self._path = path

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent(f"{self._path}.{name}")

    def __call__(self, *a, **k):
        raise RuntimeError(f"{self._path} needs Triton, which is not imported (nbxtensor's "
                           f"Triton stand-in: kernels launch from the kernel archive only)")

    def __repr__(self):
        return f"<{self._path}: Triton not imported>"


class _Namespace:
    """A module stand-in: the names set on it, else an `_Absent` placeholder."""

    def __init__(self, path: str, **names):
        self.__name__ = path
        self.__dict__.update(names)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent(f"{self.__name__}.{name}")

    def __repr__(self):
        return f"<nbxtensor stand-in for {self.__name__}>"


class constexpr:
    """`tl.constexpr(value)` at module level (a kernel body's global), and the annotation."""

    def __init__(self, value):
        self.value = value.value if isinstance(value, constexpr) else value

    def __repr__(self):
        return f"constexpr[{self.value!r}]"


class dtype:
    """A Triton scalar type by Triton's name (`str()` as Triton's: the key part of a
    constexpr dtype), with the queries host code asks of one."""

    _FP = ("fp8e4b15", "fp8e4b8", "fp8e4nv", "fp8e5", "fp8e5b16", "fp16", "bf16", "fp32", "fp64")
    _BITS = {"int1": 1, "int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8,
             "uint16": 16, "uint32": 32, "uint64": 64, "fp16": 16, "bf16": 16, "fp32": 32,
             "fp64": 64, "fp8e4b15": 8, "fp8e4b8": 8, "fp8e4nv": 8, "fp8e5": 8, "fp8e5b16": 8}

    def __init__(self, name: str):
        if name not in self._BITS:
            raise ValueError(f"tl.dtype: unknown type name {name!r}")
        self.name = name
        self.primitive_bitwidth = self._BITS[name]

    def is_floating(self) -> bool:
        return self.name in self._FP

    def is_int(self) -> bool:
        return self.name.startswith(("int", "uint"))

    def is_int_signed(self) -> bool:
        return self.name.startswith("int")

    def is_int_unsigned(self) -> bool:
        return self.name.startswith("uint")

    def is_bool(self) -> bool:
        return self.name == "int1"

    @property
    def itemsize(self) -> int:
        return max(1, self.primitive_bitwidth // 8)

    def __eq__(self, other):
        return isinstance(other, dtype) and other.name == self.name

    def __hash__(self):
        return hash(("tl.dtype", self.name))

    def __str__(self):
        return self.name

    def __repr__(self):
        return f"triton.language.{self.name}"


def cdiv(a, b):
    return -(-a // b)


def next_power_of_2(n):
    return 1 << (n - 1).bit_length() if n > 0 else 1


class Config:
    """`triton.Config` (its fields only; autotuning needs Triton)."""

    def __init__(self, kwargs, num_warps=4, num_stages=3, num_ctas=1, maxnreg=None,
                 pre_hook=None, **rest):
        self.kwargs, self.num_warps, self.num_stages = dict(kwargs), num_warps, num_stages
        self.num_ctas, self.maxnreg, self.pre_hook = num_ctas, maxnreg, pre_hook
        self.__dict__.update(rest)


class _ConstexprFunction:
    """`constexpr_function(f)`: callable as f, its function at `.fn` (as Triton's)."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__, self.__doc__ = fn.__name__, fn.__doc__

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _needs_triton(what):
    def deco(*a, **k):
        raise RuntimeError(f"triton.{what} needs Triton (not imported: nbxtensor's stand-in)")
    return deco


_DTYPE_NAMES = {"int1": "int1", "int8": "int8", "int16": "int16", "int32": "int32",
                "int64": "int64", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
                "uint64": "uint64", "float16": "fp16", "bfloat16": "bf16", "float32": "fp32",
                "float64": "fp64", "float8e4b15": "fp8e4b15", "float8e4b8": "fp8e4b8",
                "float8e4nv": "fp8e4nv", "float8e5": "fp8e5", "float8e5b16": "fp8e5b16"}
_dtypes = {k: dtype(v) for k, v in _DTYPE_NAMES.items()}

tl = _Namespace("triton.language", constexpr=constexpr, dtype=dtype, cdiv=cdiv,
                next_power_of_2=next_power_of_2, **_dtypes)
libdevice = _Namespace("triton.language.extra.libdevice")
triton = _Namespace("triton", jit=_jit_decorator(False), cdiv=cdiv,
                    next_power_of_2=next_power_of_2, Config=Config,
                    heuristics=_needs_triton("heuristics"), autotune=_needs_triton("autotune"),
                    language=tl, constexpr_function=_ConstexprFunction)
gl = _Namespace("triton.experimental.gluon.language", constexpr=constexpr, dtype=dtype,
                **_dtypes)
gluon = _Namespace("triton.experimental.gluon", jit=_jit_decorator(True),
                   constexpr_function=_ConstexprFunction, language=gl)
hopper = _Namespace("triton.experimental.gluon.language.nvidia.hopper")
