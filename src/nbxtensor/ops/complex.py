"""Complex numbers: the parts of a complex tensor, its views, and the reductions and products
that other families hand over for complex dtypes.

Every op here is built from views (tensor._real_view: torch.view_as_real's layout) and the
real ops of the other families, so it runs on every device with their kernels; the
element-wise arithmetic and functions of complex tensors are in ops/elementwise.py
(COMPLEX_NAMES). Differences from torch: `conj` returns a new tensor (torch: a lazy
conjugate view, `is_conj()`), so `conj` and `conj_physical` are the same; casting complex
to a real dtype is refused (torch drops the imaginary part with a warning).
"""
from __future__ import annotations

from .. import dtypes as _dt
from ..tensor import Tensor, _as_complex_view, _real_view, broadcast_shapes
from . import _methods

__all__ = ["real", "imag", "conj", "conj_physical", "resolve_conj", "angle", "polar", "complex",
           "view_as_real", "view_as_complex", "is_complex"]


def _check(x, op, argname="input"):
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: {argname} must be a Tensor, got {type(x).__name__}")
    return x


def is_complex(input) -> bool:  # noqa: A002
    return _check(input, "is_complex")._dtype.kind == "c"


def view_as_real(input) -> Tensor:  # noqa: A002
    """torch.view_as_real: a view with a trailing dim of 2 (real, imaginary parts)."""
    x = _check(input, "view_as_real")
    if x._dtype.kind != "c":
        raise TypeError(f"view_as_real: expected a complex tensor, got {x._dtype.name}")
    return _real_view(x)


def view_as_complex(input) -> Tensor:  # noqa: A002
    """torch.view_as_complex: a float32/float64 view whose last dim (size 2, stride 1) holds the
    real and imaginary parts; the other strides and the offset must be even."""
    x = _check(input, "view_as_complex")
    if x._dtype not in (_dt.float32, _dt.float64):
        raise TypeError(f"view_as_complex: expected a float32 or float64 tensor, got "
                        f"{x._dtype.name}")
    if x.ndim == 0:
        raise RuntimeError("view_as_complex: input tensor must have one or more dimensions")
    if x._shape[-1] != 2:
        raise RuntimeError(f"view_as_complex: tensor must have a last dimension of size 2, got "
                           f"shape {tuple(x._shape)}")
    if x._stride[-1] != 1:
        raise RuntimeError(f"view_as_complex: tensor must have a last dimension with stride 1, "
                           f"got stride {x._stride}")
    if any(s % 2 for s in x._stride[:-1]):
        raise RuntimeError(f"view_as_complex: tensor must have a stride divisible by 2 for all "
                           f"but the last dimension, got stride {x._stride}")
    if x._offset % 2:
        raise RuntimeError(f"view_as_complex: tensor must have a storage_offset divisible by 2, "
                           f"got {x._offset}")
    return _as_complex_view(x)


def real(input) -> Tensor:  # noqa: A002
    """torch.real: a view of the real parts of a complex tensor; a real tensor itself."""
    x = _check(input, "real")
    return _real_view(x).select(-1, 0) if x._dtype.kind == "c" else x


def imag(input) -> Tensor:  # noqa: A002
    """torch.imag: a view of the imaginary parts (complex tensors only, as torch)."""
    x = _check(input, "imag")
    if x._dtype.kind != "c":
        raise TypeError(f"imag: not implemented for tensors with non-complex dtypes, got "
                        f"{x._dtype.name}")
    return _real_view(x).select(-1, 1)


def conj_physical(input) -> Tensor:  # noqa: A002
    """The complex conjugate, a new tensor; a real tensor itself (torch)."""
    from .elementwise import neg
    x = _check(input, "conj_physical")
    if x._dtype.kind != "c":
        return x
    out = Tensor._empty(x._shape, x._dtype, x._storage.device)
    v = _real_view(out)
    v.select(-1, 0).copy_(real(x))
    neg(imag(x), out=v.select(-1, 1))
    return out


def conj(input) -> Tensor:  # noqa: A002
    """torch.conj, materialised (torch returns a lazy conjugate view)."""
    return conj_physical(_check(input, "conj"))


def resolve_conj(input) -> Tensor:  # noqa: A002
    return _check(input, "resolve_conj")     # nothing is ever a lazy conjugate here


def angle(input) -> Tensor:  # noqa: A002
    """torch.angle: atan2(imag, real), a real tensor; for real input 0 or pi (NaN stays NaN)."""
    from .elementwise import atan2, mul, lt
    x = _check(input, "angle")
    if x._dtype.kind == "c":
        return atan2(imag(x), real(x))
    if x._dtype.kind == "b":
        raise TypeError("angle: not supported for bool tensors")
    f = x if x._dtype.is_floating_point else x.to(_dt.get_default_dtype())
    from .elementwise import add
    # pi where x < 0, 0 elsewhere, NaN where x is NaN
    return add(mul(lt(f, 0).to(f.dtype), 3.141592653589793), mul(f, 0))


def complex(real, imag, *, out=None) -> Tensor:  # noqa: A001,A002 - torch's names
    """torch.complex: real + imag * 1j from two float32 or two float64 tensors (broadcast)."""
    re, im = _check(real, "complex", "real"), _check(imag, "complex", "imag")
    if re._dtype is not im._dtype or re._dtype not in (_dt.float32, _dt.float64):
        raise TypeError(f"complex: expected real and imag both float32 or both float64, got "
                        f"{re._dtype.name} and {im._dtype.name}")
    if re.device != im.device:
        raise ValueError(f"complex: real is on {re.device} but imag is on {im.device}")
    shape = tuple(broadcast_shapes(re.shape, im.shape))
    d = _dt.to_complex(re._dtype)
    res = Tensor._empty(shape, d, re._storage.device)
    v = _real_view(res)
    v.select(-1, 0).copy_(re)
    v.select(-1, 1).copy_(im)
    return res if out is None else _into(out, res, "complex")


def polar(abs, angle, *, out=None) -> Tensor:  # noqa: A002 - torch's names
    """torch.polar: abs * (cos(angle) + sin(angle) * 1j)."""
    from .elementwise import cos, mul, sin
    a, t = _check(abs, "polar", "abs"), _check(angle, "polar", "angle")
    if a._dtype is not t._dtype or a._dtype not in (_dt.float32, _dt.float64):
        raise TypeError(f"polar: expected abs and angle both float32 or both float64, got "
                        f"{a._dtype.name} and {t._dtype.name}")
    return complex(mul(a, cos(t)), mul(a, sin(t)), out=out)


def _into(out, res, op):
    from ._common import check_out
    check_out(out, res.shape, res.dtype, res.device, op)
    return out.copy_(res)


# ------------------------------------------------------------------ handed over by families
def reduce_complex(kind, x, dim, keepdim, dtype, out):
    """sum / mean of a complex tensor: the same reduction of its real view (the (re, im)
    dim kept), read back as complex."""
    from . import reduction
    if dtype is not None:
        d = _dt.as_dtype(dtype)
        if d.kind != "c":
            raise TypeError(f"{kind}: dtype {d.name} would discard the imaginary part of a "
                            f"{x._dtype.name} input")
        x = x.to(d)
    from ..tensor import normalize_dim
    if x.ndim == 0:
        res = x.clone()
    else:
        if dim is None:
            dims = tuple(range(x.ndim))
        else:   # negative dims count from the end of x, not of the real view's extra dim
            dims = tuple(normalize_dim(d, x.ndim) for d in
                         (dim if isinstance(dim, (tuple, list)) else (dim,)))
        r = getattr(reduction, kind)(_real_view(x), dim=dims, keepdim=keepdim)
        res = _as_complex_view(r.contiguous())
    return res if out is None else _into(out, res, kind)


def matmul_complex(a, b, out=None):
    """matmul of two complex tensors of one dtype: cpu through NumPy's complex product, other
    devices as four real products of the parts, (ar br - ai bi) + (ar bi + ai br) j."""
    from .linalg import matmul
    from .elementwise import add, sub
    if a.device.type == "cpu":
        import numpy as np
        res = Tensor._from_numpy_unchecked(np.ascontiguousarray(np.matmul(a.numpy(), b.numpy())))
    else:
        ar, ai = real(a).contiguous(), imag(a).contiguous()
        br, bi = real(b).contiguous(), imag(b).contiguous()
        res = complex(sub(matmul(ar, br), matmul(ai, bi)), add(matmul(ar, bi), matmul(ai, br)))
    return res if out is None else _into(out, res, "matmul")


def _real_prop(self):
    return real(self)


def _imag_prop(self):
    return imag(self)


_methods.install(real=property(_real_prop), imag=property(_imag_prop), conj=conj,
                 conj_physical=conj_physical, resolve_conj=resolve_conj, angle=angle,
                 is_complex=is_complex, is_conj=lambda self: False)
