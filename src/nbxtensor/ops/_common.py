"""Argument checks shared by the op families (one rule for `out=`, not one per family)."""
from __future__ import annotations

from ..tensor import Tensor, _overlaps


def check_tensor(x, argname: str, op: str) -> Tensor:
    """`x` itself when it is a Tensor; otherwise a TypeError naming `op` and the argument.
    A complex `x` is refused too, except by the ops that take complex (COMPLEX_OPS): the other
    families' kernels have no complex types."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: {argname} must be a Tensor, got {type(x).__name__}")
    if x._dtype.kind == "c" and op not in COMPLEX_OPS:
        raise TypeError(f"{op}: {argname} is {x._dtype.name}; complex tensors are not supported "
                        f"by {op}")
    return x


def check_float(x, argname: str, op: str) -> Tensor:
    """`x` itself when it is a Tensor of float16, bfloat16, float32 or float64 (what the
    float-only families compute in); otherwise a TypeError naming `op` and the argument."""
    check_tensor(x, argname, op)
    if not x.dtype.is_floating_point or x.dtype.is_float8:
        raise TypeError(f"{op}: {argname} must have a float16, bfloat16, float32 or float64 "
                        f"dtype, got {x.dtype.name}")
    return x


def check_like_input(x, argname: str, input, op: str) -> None:  # noqa: A002
    """`x` (a weight, a bias, a grid) has the dtype of `input` and sits on its device."""
    if x.dtype is not input.dtype:
        raise TypeError(f"{op}: input ({input.dtype.name}) and {argname} ({x.dtype.name}) "
                        f"must have the same dtype")
    if x.device != input.device:
        raise ValueError(f"{op}: input is on {input.device} but {argname} is on {x.device}")


# the ops outside ops/elementwise.py (which has its own COMPLEX_NAMES) that accept complex
COMPLEX_OPS = frozenset(("sum", "mean", "matmul", "complex", "polar", "real", "imag", "conj",
                         "angle"))


def check_out(out, shape, dtype, device, op: str) -> Tensor:
    """A fresh output, or the caller's `out=` checked against what `op` produces.

    Unlike torch, `out=` is never resized or cast: it must have exactly the result's shape,
    dtype and device, and may not be an expanded tensor (several elements at one address).
    """
    if out is None:
        return Tensor._empty(shape, dtype, device)
    if not isinstance(out, Tensor):
        raise TypeError(f"{op}: out must be a Tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{op}: out has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if out.dtype is not dtype:
        raise TypeError(f"{op}: out has dtype {out.dtype.name}, expected {dtype.name}")
    if out.device != device:
        raise ValueError(f"{op}: out is on {out.device}, expected {device}")
    if any(n > 1 and s == 0 for n, s in zip(out.shape, out.stride())):
        raise RuntimeError(f"{op}: out has more than one element at one memory location "
                           f"(an expanded tensor)")
    return out


def out_overlaps(out, *inputs) -> bool:
    """Whether a caller's `out=` shares memory with any of `inputs` (None entries skipped):
    an op that reads its inputs while it writes (a tiled product, a gather) must then write
    a temporary and copy it into `out`."""
    return out is not None and any(t is not None and _overlaps(out, t) for t in inputs)
