"""torch.linalg: `import nbxtensor.linalg` / `nbx.linalg.*`.

The products and norms are nbxtensor's own ops on every device (from ops/linalg.py and
ops/reduction.py). The decompositions and solvers (inv, solve, det, slogdet, svd, svdvals,
qr, eigh, eigvalsh, cholesky, pinv, matrix_rank, lstsq-free) compute with NumPy's LAPACK on
**cpu tensors only**; a tensor on another device is refused (NotImplementedError), never
copied to the host behind the caller's back. Batched inputs (..., M, N) work as torch's.
"""
from __future__ import annotations

import numpy as np

from . import dtypes as _dt
from .ops import linalg as _lin
from .ops.linalg import *  # noqa: F401,F403
from .ops.structure import cross as _cross
from .tensor import Tensor

__all__ = list(_lin.__all__) + ["vector_norm", "norm", "matrix_norm", "cross", "inv", "solve",
                                "det", "slogdet", "svd", "svdvals", "qr", "eigh", "eigvalsh",
                                "cholesky", "pinv", "matrix_rank", "multi_dot", "vecdot",
                                "diagonal", "inv_ex", "cholesky_ex"]


def __getattr__(name):
    return getattr(_lin, name)    # vector_norm, norm, matrix_norm (lazy in ops/linalg.py)


def cross(input, other, *, dim=-1, out=None):  # noqa: A002
    return _cross(input, other, dim=dim, out=out)


def _host(x, op, argname="A"):
    if not isinstance(x, Tensor):
        raise TypeError(f"linalg.{op}: {argname} must be a Tensor, got {type(x).__name__}")
    if x.device.type != "cpu":
        raise NotImplementedError(f"linalg.{op}: only cpu tensors are supported, got a tensor on "
                                  f"{x.device} (move it with .cpu() first)")
    if x.dtype not in (_dt.float32, _dt.float64, _dt.complex64, _dt.complex128):
        raise TypeError(f"linalg.{op}: {argname} must be float32, float64, complex64 or "
                        f"complex128, got {x.dtype.name}")
    if x.ndim < 2:
        raise ValueError(f"linalg.{op}: {argname} must have at least 2 dimensions, got shape "
                         f"{tuple(x.shape)}")
    return x.numpy()


def _square(a, op):
    if a.shape[-1] != a.shape[-2]:
        raise ValueError(f"linalg.{op}: A must be batches of square matrices, but they are "
                         f"{a.shape[-2]} by {a.shape[-1]} matrices")
    return a


def _wrap(a, dtype):
    from .creation import tensor as _tensor
    return _tensor(np.array(a, dtype=dtype.np, order="C"), dtype=dtype)   # keeps 0-D results 0-D


def _real(dtype):
    return {_dt.complex64: _dt.float32, _dt.complex128: _dt.float64}.get(dtype, dtype)


def _singular(op):
    return RuntimeError(f"linalg.{op}: The diagonal element is zero, the inversion could not be "
                        f"completed because the input matrix is singular.")


def inv(A, *, out=None):
    a = _square(_host(A, "inv"), "inv")
    try:
        r = _wrap(np.linalg.inv(a), A.dtype)
    except np.linalg.LinAlgError as e:
        raise _singular("inv") from e
    return r if out is None else out.copy_(r)


def inv_ex(A, *, check_errors=False, out=None):
    from collections import namedtuple
    res = namedtuple("inv_ex", ["inverse", "info"])
    return res(inv(A), _wrap(np.zeros(tuple(A.shape[:-2]), np.int32), _dt.int32))


def solve(A, B, *, left=True, out=None):
    """X with A @ X = B (left=False: X @ A = B); B may be a vector (..., N)."""
    a = _square(_host(A, "solve"), "solve")
    b = _host(B, "solve", "B") if B.ndim >= 2 else B.numpy()
    try:
        if not left:
            x = np.swapaxes(np.linalg.solve(np.swapaxes(a, -1, -2), np.swapaxes(b, -1, -2)), -1, -2)
        elif b.ndim == a.ndim - 1:
            x = np.linalg.solve(a, b[..., None])[..., 0]
        else:
            x = np.linalg.solve(a, b)
    except np.linalg.LinAlgError as e:
        raise _singular("solve") from e
    r = _wrap(x, _dt.promote_types(A.dtype, B.dtype))
    return r if out is None else out.copy_(r)


def det(A, *, out=None):
    r = _wrap(np.linalg.det(_square(_host(A, "det"), "det")), A.dtype)
    return r if out is None else out.copy_(r)


def slogdet(A, *, out=None):
    from collections import namedtuple
    res = namedtuple("slogdet", ["sign", "logabsdet"])
    s, ld = np.linalg.slogdet(_square(_host(A, "slogdet"), "slogdet"))
    return res(_wrap(s, A.dtype), _wrap(ld, _real(A.dtype)))


def svd(A, full_matrices=True, *, driver=None, out=None):
    from collections import namedtuple
    res = namedtuple("svd", ["U", "S", "Vh"])
    u, s, vh = np.linalg.svd(_host(A, "svd"), full_matrices=full_matrices)
    return res(_wrap(u, A.dtype), _wrap(s, _real(A.dtype)), _wrap(vh, A.dtype))


def svdvals(A, *, driver=None, out=None):
    return _wrap(np.linalg.svd(_host(A, "svdvals"), compute_uv=False), _real(A.dtype))


def qr(A, mode="reduced", *, out=None):
    from collections import namedtuple
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' "
                         f"(default), 'r', or 'complete'")
    res = namedtuple("qr", ["Q", "R"])
    a = _host(A, "qr")
    if mode == "r":
        r = np.linalg.qr(a, mode="r")
        return res(_wrap(np.zeros((0,), a.dtype), A.dtype), _wrap(r, A.dtype))
    q, r = np.linalg.qr(a, mode=mode)
    return res(_wrap(q, A.dtype), _wrap(r, A.dtype))


def eigh(A, UPLO="L", *, out=None):
    from collections import namedtuple
    res = namedtuple("eigh", ["eigenvalues", "eigenvectors"])
    w, v = np.linalg.eigh(_square(_host(A, "eigh"), "eigh"), UPLO=UPLO)
    return res(_wrap(w, _real(A.dtype)), _wrap(v, A.dtype))


def eigvalsh(A, UPLO="L", *, out=None):
    return _wrap(np.linalg.eigvalsh(_square(_host(A, "eigvalsh"), "eigvalsh"), UPLO=UPLO),
                 _real(A.dtype))


def cholesky(A, *, upper=False, out=None):
    a = _square(_host(A, "cholesky"), "cholesky")
    try:
        lo = np.linalg.cholesky(a)
    except np.linalg.LinAlgError as e:
        raise RuntimeError("linalg.cholesky: The factorization could not be completed because "
                           "the input is not positive-definite.") from e
    r = np.swapaxes(lo, -1, -2).conj() if upper else lo
    return _wrap(r, A.dtype)


def cholesky_ex(A, *, upper=False, check_errors=False, out=None):
    from collections import namedtuple
    res = namedtuple("cholesky_ex", ["L", "info"])
    return res(cholesky(A, upper=upper), _wrap(np.zeros(tuple(A.shape[:-2]), np.int32),
                                                _dt.int32))


def pinv(A, *, atol=None, rtol=None, hermitian=False, out=None):
    a = _host(A, "pinv")
    rc = 1e-15 if rtol is None else rtol
    if rtol is None and atol is None:
        rc = max(a.shape[-2:]) * np.finfo(a.dtype).eps
    return _wrap(np.linalg.pinv(a, rcond=rc, hermitian=hermitian), A.dtype)


def matrix_rank(A, *, atol=None, rtol=None, hermitian=False, out=None):
    a = _host(A, "matrix_rank")
    return _wrap(np.linalg.matrix_rank(a, hermitian=hermitian, rtol=rtol)
                 if atol is None else np.linalg.matrix_rank(a, tol=atol, hermitian=hermitian),
                 _dt.int64)


def multi_dot(tensors, *, out=None):
    """The chained matrix product (left to right; 1-D ends as row / column vectors)."""
    if len(tensors) < 2:
        raise ValueError(f"multi_dot(): expected at least 2 tensors but got {len(tensors)}")
    r = tensors[0]
    for t in tensors[1:]:
        r = _lin.matmul(r, t)
    return r if out is None else out.copy_(r)


def vecdot(x, y, *, dim=-1, out=None):
    from . import ops as _ops
    r = _ops.sum(_ops.mul(x.conj() if x.dtype.kind == "c" else x, y), dim)
    return r if out is None else out.copy_(r)


def diagonal(A, *, offset=0, dim1=-2, dim2=-1):
    from .ops.structure import diagonal as _diag
    return _diag(A, offset, dim1, dim2)
