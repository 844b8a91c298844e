"""torch.linalg: `import nbxtensor.linalg` / `nbx.linalg.*`.

The products and norms are nbxtensor's own ops on every device (from ops/linalg.py and
ops/reduction.py). The LU family (lu_factor[_ex], lu, lu_solve, solve[_ex], inv[_ex], det,
slogdet), cholesky[_ex], qr, eigh/eigvalsh and solve_triangular run on every device: NumPy
(LAPACK where NumPy has the routine) on cpu, and on cuda/interp the Triton kernels of
kernels/linalg.py, one program per matrix of up to kernels.linalg.MAX_N rows and columns,
float32 and float64 (a larger or complex matrix there is refused with NotImplementedError
naming the limit). svd, svdvals, pinv and matrix_rank are NumPy's on **cpu tensors only**; a
tensor on another device is refused (NotImplementedError), never copied to the host behind
the caller's back. Singular inputs raise LinAlgError (a RuntimeError) with torch's messages,
or report `info` in the *_ex variants. Batched inputs (..., M, N) work as torch's.
"""
from __future__ import annotations

import math

import numpy as np

from . import dtypes as _dt
from .ops import linalg as _lin
from .ops.linalg import *  # noqa: F401,F403
from .dispatch import impl
from .ops.structure import cross as _cross
from .tensor import Tensor

__all__ = list(_lin.__all__) + ["vector_norm", "norm", "matrix_norm", "cross", "inv", "solve",
                                "det", "slogdet", "svd", "svdvals", "qr", "eigh", "eigvalsh",
                                "cholesky", "pinv", "matrix_rank", "multi_dot", "vecdot",
                                "diagonal", "inv_ex", "cholesky_ex", "solve_ex", "lu_factor",
                                "lu_factor_ex", "lu", "lu_solve", "solve_triangular",
                                "LinAlgError"]


def __getattr__(name):
    return getattr(_lin, name)    # vector_norm, norm, matrix_norm (lazy in ops/linalg.py)


def cross(input, other, *, dim=-1, out=None):  # noqa: A002
    return _cross(input, other, dim=dim, out=out)


class LinAlgError(RuntimeError):
    """A factorisation or solve met a singular (or not positive-definite) matrix; torch's
    torch.linalg.LinAlgError, also a RuntimeError."""


_FLOATS = (_dt.float32, _dt.float64, _dt.complex64, _dt.complex128)


def _check(x, op, argname="A"):
    if not isinstance(x, Tensor):
        raise TypeError(f"linalg.{op}: {argname} must be a Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOATS:
        raise TypeError(f"linalg.{op}: {argname} must be float32, float64, complex64 or "
                        f"complex128, got {x.dtype.name}")
    if x.ndim < 2:
        raise ValueError(f"linalg.{op}: {argname} must have at least 2 dimensions, got shape "
                         f"{tuple(x.shape)}")
    return x


def _host(x, op, argname="A"):
    """The NumPy array of a cpu matrix argument (ops computed by LAPACK on cpu only)."""
    _check(x, op, argname)
    if x.device.type != "cpu":
        raise NotImplementedError(f"linalg.{op}: only cpu tensors are supported, got a tensor on "
                                  f"{x.device} (move it with .cpu() first)")
    return x.numpy()


def _kernel_ok(x, op, argname="A"):
    """A matrix argument on cuda/interp for the Triton factorisations: real, within MAX_N."""
    from .kernels.linalg import MAX_N
    if x.dtype.is_complex:
        raise NotImplementedError(f"linalg.{op}: complex matrices are supported on cpu only, "
                                  f"got {x.dtype.name} on {x.device}")
    if max(x.shape[-2:]) > MAX_N:
        raise NotImplementedError(
            f"linalg.{op}: on {x.device.type} the factorisations hold one matrix per program, up "
            f"to {MAX_N} x {MAX_N}; {argname} is {x.shape[-2]} x {x.shape[-1]} (compute it on "
            f"cpu: {argname}.cpu())")
    return x


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
    return LinAlgError(f"linalg.{op}: The diagonal element is zero, the inversion could not be "
                       f"completed because the input matrix is singular.")


def _result(name, fields):
    from collections import namedtuple
    return namedtuple(name, fields)


_lu_factor_ex_result = _result("linalg_lu_factor_ex", ["LU", "pivots", "info"])
_lu_factor_result = _result("linalg_lu_factor", ["LU", "pivots"])
_lu_result = _result("linalg_lu", ["P", "L", "U"])
_solve_ex_result = _result("linalg_solve_ex", ["result", "info"])
_inv_ex_result = _result("inv_ex", ["inverse", "info"])
_cholesky_ex_result = _result("cholesky_ex", ["L", "info"])
_slogdet_result = _result("slogdet", ["sign", "logabsdet"])


def _first_failure(info):
    """(batch index, info value) of the first nonzero info, or None (reads info on the host)."""
    i = info.reshape(-1).cpu().numpy()
    bad = np.flatnonzero(i)
    if not bad.size:
        return None
    return int(bad[0]), int(i[bad[0]]), info.numel() > 1


def _batch_prefix(fail):
    return f"(Batch element {fail[0]}): " if fail[2] else ""


# torch's messages for a failed factorisation, by kind ({k}: the info value, a 1-based order)
_FAILURES = {
    "lu": ("torch.linalg.{op}: U[{k},{k}] is zero and using it on lu_solve would result in a "
           "division by zero. If you still want to perform the factorization, consider calling "
           "linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)"),
    "solve": "torch.linalg.{op}: The solver failed because the input matrix is singular.",
    "inv": ("linalg.{op}: The diagonal element {k} is zero, the inversion could not be "
            "completed because the input matrix is singular."),
    "cholesky": ("linalg.{op}: The factorization could not be completed because the input is "
                 "not positive-definite (the leading minor of order {k} is not "
                 "positive-definite)."),
}


def _raise_failure(kind, info, op):
    """LinAlgError for the first matrix of a batch whose `info` says its `kind` failed."""
    fail = _first_failure(info)
    if fail is not None:
        raise LinAlgError(_batch_prefix(fail) + _FAILURES[kind].format(op=op, k=fail[1]))


# ------------------------------------------------------------------ LU, the shared factorisation
def _np_lu(a):
    """getf2 over a batch (batch, m, n) in NumPy: (LU, pivots 1-based, perm, info)."""
    lu = np.array(a, copy=True)
    batch, m, n = lu.shape
    k = min(m, n)
    piv = np.zeros((batch, k), np.int32)
    perm = np.tile(np.arange(m, dtype=np.int64), (batch, 1))
    info = np.zeros(batch, np.int32)
    bi = np.arange(batch)
    with np.errstate(all="ignore"):
        for j in range(k):
            col = np.abs(lu[:, j:, j])
            col = np.where(np.isnan(col), np.inf, col)          # a NaN pivots first, as LAPACK
            p = j + np.argmax(col, axis=1)
            piv[:, j] = p + 1
            lu[bi, j], lu[bi, p] = lu[bi, p].copy(), lu[bi, j].copy()
            perm[bi, j], perm[bi, p] = perm[bi, p].copy(), perm[bi, j].copy()
            pivot = lu[:, j, j]
            info[(info == 0) & (pivot == 0)] = j + 1
            lcol = lu[:, j + 1:, j] / np.where(pivot == 0, 1, pivot)[:, None]
            lu[:, j + 1:, j] = lcol
            lu[:, j + 1:, j + 1:] -= lcol[:, :, None] * lu[:, j, None, j + 1:]
    return lu, piv, perm, info


def _lu_parts(A, op):
    """(LU, pivots, perm, info) of A (..., m, n): NumPy on cpu, the Triton kernel elsewhere;
    perm (int64): row i of P^T A is row perm[i] of A."""
    _check(A, op)
    batch, (m, n) = tuple(A.shape[:-2]), tuple(A.shape[-2:])
    k = min(m, n)
    if A.device.type == "cpu":
        if A.dtype.is_complex:
            raise NotImplementedError(f"linalg.{op}: complex LU is not implemented")
        lu, piv, perm, info = _np_lu(A.numpy().reshape(-1, m, n))
        return (_wrap(lu.reshape(A.shape), A.dtype), _wrap(piv.reshape(batch + (k,)), _dt.int32),
                _wrap(perm.reshape(batch + (m,)), _dt.int64),
                _wrap(info.reshape(batch), _dt.int32))
    _kernel_ok(A, op)
    nb = math.prod(batch)
    flat = A.reshape(nb, m, n).contiguous()
    lu = Tensor._empty((nb, m, n), A.dtype, A.device)
    piv = Tensor._empty((nb, k), _dt.int32, A.device)
    perm = Tensor._empty((nb, m), _dt.int64, A.device)
    info = Tensor._empty((nb,), _dt.int32, A.device)
    if nb and m and n:
        impl("lu_factor", A.device)(flat, lu, piv, perm, info)
    elif nb:
        info.fill_(0)
        from .creation import arange
        perm.copy_(arange(m, device=A.device).expand(nb, m))
    return (lu.reshape(A.shape), piv.reshape(batch + (k,)), perm.reshape(batch + (m,)),
            info.reshape(batch))


def lu_factor_ex(A, *, pivot=True, check_errors=False, out=None):
    """LU with partial pivoting: A = P L U packed in LU (L below the diagonal, unit diagonal
    implied), pivots (1-based, int32: row i was swapped with row pivots[i] - 1), info (int32:
    0, or the 1-based index of the first zero pivot). Any m x n; cpu, interp and cuda."""
    if not pivot:
        raise NotImplementedError("linalg.lu_factor_ex: LU without pivoting is not implemented "
                                  "(torch's cpu refuses it too); pass pivot=True")
    lu, piv, _, info = _lu_parts(A, "lu_factor_ex")
    if check_errors:
        _raise_failure("lu", info, "lu_factor_ex")
    return _lu_factor_ex_result(lu, piv, info)


def lu_factor(A, *, pivot=True, out=None):
    """torch.linalg.lu_factor: (LU, pivots); a zero pivot raises LinAlgError (lu_factor_ex
    returns it in info instead)."""
    lu, piv, info = lu_factor_ex(A, pivot=pivot)
    _raise_failure("lu", info, "lu_factor")
    return _lu_factor_result(lu, piv)


def lu(A, *, pivot=True, out=None):
    """A = P @ L @ U: P (m, m) a permutation, L (m, k) unit lower, U (k, n) upper."""
    from . import ops as _ops
    if not pivot:
        raise NotImplementedError("linalg.lu: LU without pivoting is not implemented; pass "
                                  "pivot=True")
    packed, _, perm, _ = _lu_parts(A, "lu")
    m, n = A.shape[-2:]
    k = min(m, n)
    from .creation import arange, eye
    ident = eye(m, k, dtype=A.dtype, device=A.device)
    L = _ops.tril(packed[..., :, :k], -1) + ident
    U = _ops.triu(packed[..., :k, :])
    P = _ops.eq(perm.unsqueeze(-1), arange(m, device=A.device)).to(A.dtype).mT.contiguous()
    return _lu_result(P, L, U)


# ------------------------------------------------------------------ triangular solves
def _np_trsm(a, b, upper, unit):
    """X with A X = B, batched (batch, n, n) / (batch, n, k), by substitution (NumPy)."""
    n = a.shape[-1]
    y = np.array(b, copy=True)
    order = range(n - 1, -1, -1) if upper else range(n)
    with np.errstate(all="ignore"):
        for k in order:
            if not unit:
                y[:, k] /= a[:, k, k, None]
            rest = slice(0, k) if upper else slice(k + 1, n)
            y[:, rest] -= a[:, rest, k, None] * y[:, k, None, :]
    return y


def _trsm(A, B, upper, unit, op):
    """A X = B with A (..., n, n) triangular and B (..., n, k), batch dims broadcast."""
    from .tensor import broadcast_shapes
    n, k = A.shape[-1], B.shape[-1]
    batch = tuple(broadcast_shapes(A.shape[:-2], B.shape[:-2]))
    nb = math.prod(batch)
    a = A.expand(batch + (n, n)).reshape(nb, n, n)
    b = B.expand(batch + (n, k)).reshape(nb, n, k)
    dt = _dt.promote_types(A.dtype, B.dtype)
    if A.device.type == "cpu":
        x = _np_trsm(a.numpy().astype(dt.np), b.numpy().astype(dt.np), upper, unit)
        return _wrap(x.reshape(batch + (n, k)), dt)
    _kernel_ok(A, op)
    a, b = a.to(dt).contiguous(), b.to(dt).contiguous()
    x = Tensor._empty(b.shape, dt, b.device)
    if x.numel():
        impl("solve_triangular", A.device)(a, b, x, upper, unit)
    return x.reshape(batch + (n, k))


def _same_device(A, B, op):
    if A.device != B.device:
        raise ValueError(f"linalg.{op}: A is on {A.device} but B is on {B.device}; expected "
                         f"both on one device")


def solve_triangular(A, B, *, upper, left=True, unitriangular=False, out=None):
    """X with A X = B (left=False: X A = B) for triangular A (the other triangle is not read);
    unitriangular: the diagonal is taken as ones. A zero diagonal gives inf/NaN, as torch."""
    _square(_check(A, "solve_triangular"), "solve_triangular")
    _check(B, "solve_triangular", "B")
    _same_device(A, B, "solve_triangular")
    if left:
        r = _trsm(A, B, upper, unitriangular, "solve_triangular")
    else:       # X A = B  <=>  A^T X^T = B^T
        r = _trsm(A.mT, B.mT, not upper, unitriangular, "solve_triangular").mT.contiguous()
    return r if out is None else out.copy_(r)


def _rows(X, order):
    """X (..., n, k) with its rows taken in `order` (..., n), batch dims broadcast."""
    from . import ops as _ops
    from .tensor import broadcast_shapes
    n, k = X.shape[-2:]
    batch = tuple(broadcast_shapes(order.shape[:-1], X.shape[:-2]))
    idx = order.expand(batch + (n,)).unsqueeze(-1).expand(batch + (n, k))
    return _ops.gather(X.expand(batch + (n, k)), -2, idx)


def _lu_solve_left(packed, perm, B, transpose, op):
    """Z with A Z = B (transpose: A^T Z = B) from A's packed LU and its row order perm."""
    from . import ops as _ops
    if not transpose:        # Z = U^-1 L^-1 (P^T B)
        y = _trsm(packed, _rows(B, perm), False, True, op)
        return _trsm(packed, y, True, False, op)
    # A^T = U^T L^T P^T: Z = P (L^-T (U^-T B))
    y = _trsm(packed.mT, B, False, False, op)
    w = _trsm(packed.mT, y, True, True, op)
    return _rows(w, _ops.argsort(perm, -1))


def lu_solve(LU, pivots, B, *, left=True, adjoint=False, out=None):
    """X with A X = B (left=False: X A = B; adjoint: A^H in place of A) from lu_factor's
    (LU, pivots)."""
    _square(_check(LU, "lu_solve", "LU"), "lu_solve")
    _check(B, "lu_solve", "B")
    _same_device(LU, B, "lu_solve")
    if not isinstance(pivots, Tensor) or pivots.dtype != _dt.int32:
        raise TypeError(f"linalg.lu_solve: pivots must be an int32 Tensor (from lu_factor), got "
                        f"{getattr(pivots, 'dtype', type(pivots).__name__)}")
    n = LU.shape[-1]
    if tuple(pivots.shape[-1:]) != (n,):
        raise ValueError(f"linalg.lu_solve: pivots must have {n} entries a matrix, got shape "
                         f"{tuple(pivots.shape)}")
    perm = _perm_of_pivots(pivots, n)
    if left:
        r = _lu_solve_left(LU, perm, B, adjoint, "lu_solve")
    else:       # X A = B <=> A^T X^T = B^T; X A^H = B <=> A X^T = B^T (real)
        r = _lu_solve_left(LU, perm, B.mT, not adjoint, "lu_solve").mT.contiguous()
    return r if out is None else out.copy_(r)


def _perm_of_pivots(pivots, n):
    """The row order perm (row i of P^T A is row perm[i] of A) that LAPACK's pivots encode."""
    piv = pivots.cpu().numpy().reshape(-1, n).astype(np.int64) - 1
    if piv.size and (piv.min() < 0 or piv.max() >= n):
        raise ValueError(f"linalg.lu_solve: pivots must be in [1, {n}]")
    perm = np.tile(np.arange(n), (piv.shape[0], 1))
    rows = np.arange(piv.shape[0])
    for j in range(n):
        p = piv[:, j]
        perm[rows, j], perm[rows, p] = perm[rows, p].copy(), perm[rows, j].copy()
    from .creation import tensor as _tensor
    return _tensor(perm.reshape(tuple(pivots.shape)), device=pivots.device)


# ------------------------------------------------------------------ solvers on LU
def _as_matrix_rhs(A, B):
    """B as (..., n, k) and whether it was a batch of vectors (torch's rule: B.ndim == 1, or
    B.ndim == A.ndim - 1 with B.shape == A.shape[:-1])."""
    vec = B.ndim == 1 or (B.ndim == A.ndim - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
    return (B.unsqueeze(-1) if vec else B), vec


def _solve_device(A, B, left, op):
    """(X, info) for A X = B (left=False: X A = B) on cuda/interp: LU, then two triangular
    solves."""
    Bm, vec = _as_matrix_rhs(A, B)
    if not left:
        if vec:
            raise ValueError(f"linalg.{op}: with left=False, B must be a matrix")
        packed, _, perm, info = _lu_parts(A, op)
        x = _lu_solve_left(packed, perm, Bm.mT, True, op).mT.contiguous()
        return x, info
    packed, _, perm, info = _lu_parts(A, op)
    x = _lu_solve_left(packed, perm, Bm, False, op)
    return (x[..., 0] if vec else x), info


def solve_ex(A, B, *, left=True, check_errors=False, out=None):
    """solve with its info (0, or the first zero pivot's 1-based index) instead of an error."""
    _square(_check(A, "solve_ex"), "solve_ex")
    if not isinstance(B, Tensor):
        raise TypeError(f"linalg.solve_ex: B must be a Tensor, got {type(B).__name__}")
    _same_device(A, B, "solve_ex")
    if A.device.type == "cpu":
        x, info = _solve_device(A, B, left, "solve_ex") if not A.dtype.is_complex else \
            (solve(A, B, left=left), None)
    else:
        _kernel_ok(A, "solve_ex")
        x, info = _solve_device(A, B, left, "solve_ex")
    if check_errors:
        _raise_failure("solve", info, "solve_ex")
    return _solve_ex_result(x, info)


def _eye_like(A):
    from .creation import eye
    n = A.shape[-1]
    return eye(n, dtype=A.dtype, device=A.device).expand(tuple(A.shape))


def inv(A, *, out=None):
    """The inverse; a singular A raises LinAlgError naming the zero diagonal element."""
    _square(_check(A, "inv"), "inv")
    if A.device.type != "cpu":
        _kernel_ok(A, "inv")
        x, info = _solve_device(A, _eye_like(A), True, "inv")
        _raise_failure("inv", info, "inv")
        return x if out is None else out.copy_(x)
    a = A.numpy()
    try:
        r = _wrap(np.linalg.inv(a), A.dtype)
    except np.linalg.LinAlgError:
        if A.dtype.is_complex:
            raise _singular("inv") from None
        _raise_failure("inv", _lu_parts(A, "inv")[3], "inv")
        raise _singular("inv") from None
    return r if out is None else out.copy_(r)


def inv_ex(A, *, check_errors=False, out=None):
    """inv with its info (0, or the first zero pivot's 1-based index; the inverse is then
    inf/NaN) instead of an error."""
    _square(_check(A, "inv_ex"), "inv_ex")
    if A.device.type == "cpu" and A.dtype.is_complex:
        return _inv_ex_result(inv(A), _wrap(np.zeros(tuple(A.shape[:-2]), np.int32), _dt.int32))
    if A.device.type != "cpu":
        _kernel_ok(A, "inv_ex")
    x, info = _solve_device(A, _eye_like(A), True, "inv_ex")
    if check_errors:
        _raise_failure("inv", info, "inv_ex")
    return _inv_ex_result(x, info)


def solve(A, B, *, left=True, out=None):
    """X with A @ X = B (left=False: X @ A = B); B may be a vector (..., N)."""
    _square(_check(A, "solve"), "solve")
    if not isinstance(B, Tensor):
        raise TypeError(f"linalg.solve: B must be a Tensor, got {type(B).__name__}")
    _same_device(A, B, "solve")
    if A.device.type != "cpu":
        _kernel_ok(A, "solve")
        x, info = _solve_device(A, B, left, "solve")
        _raise_failure("solve", info, "solve")
        return x if out is None else out.copy_(x)
    a = A.numpy()
    Bm, vec = _as_matrix_rhs(A, B)
    if vec and not left:
        raise ValueError("linalg.solve: with left=False, B must be a matrix")
    b = _host(Bm, "solve", "B")
    if not left:
        a, b = np.swapaxes(a, -1, -2), np.swapaxes(b, -1, -2)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a, b = np.broadcast_to(a, batch + a.shape[-2:]), np.broadcast_to(b, batch + b.shape[-2:])
    try:
        x = np.linalg.solve(a, b)
        x = x[..., 0] if vec else np.swapaxes(x, -1, -2) if not left else x
    except np.linalg.LinAlgError as e:
        raise LinAlgError("torch.linalg.solve: The solver failed because the input matrix is "
                          "singular.") from e
    r = _wrap(x, _dt.promote_types(A.dtype, B.dtype))
    return r if out is None else out.copy_(r)


def _det_parts(A, op):
    """(diagonal of U, permutation sign) of A's LU on cuda/interp."""
    from . import ops as _ops
    packed, piv, _, _ = _lu_parts(A, op)
    n = A.shape[-1]
    from .creation import arange
    swaps = _ops.ne(piv.long(), arange(1, n + 1, device=A.device)).sum(-1)
    sign = 1 - 2 * (swaps % 2).to(A.dtype)
    return _ops.diagonal(packed, 0, -2, -1), sign


def det(A, *, out=None):
    _square(_check(A, "det"), "det")
    if A.device.type != "cpu":
        from . import ops as _ops
        _kernel_ok(A, "det")
        d, sign = _det_parts(A, "det")
        r = _ops.prod(d, -1) * sign
        return r if out is None else out.copy_(r)
    with np.errstate(all="ignore"):         # NaN in, NaN out: no warning
        r = _wrap(np.linalg.det(A.numpy()), A.dtype)
    return r if out is None else out.copy_(r)


def slogdet(A, *, out=None):
    _square(_check(A, "slogdet"), "slogdet")
    if A.device.type != "cpu":
        from . import ops as _ops
        _kernel_ok(A, "slogdet")
        d, sign = _det_parts(A, "slogdet")
        s = _ops.prod(_ops.sign(d), -1) * sign
        ld = _ops.sum(_ops.log(_ops.abs(d)), -1)
        return _slogdet_result(s, ld)
    with np.errstate(all="ignore"):
        s, ld = np.linalg.slogdet(A.numpy())
    return _slogdet_result(_wrap(s, A.dtype), _wrap(ld, _real(A.dtype)))


def svd(A, full_matrices=True, *, driver=None, out=None):
    from collections import namedtuple
    res = namedtuple("svd", ["U", "S", "Vh"])
    u, s, vh = np.linalg.svd(_host(A, "svd"), full_matrices=full_matrices)
    return res(_wrap(u, A.dtype), _wrap(s, _real(A.dtype)), _wrap(vh, A.dtype))


def svdvals(A, *, driver=None, out=None):
    return _wrap(np.linalg.svd(_host(A, "svdvals"), compute_uv=False), _real(A.dtype))


def qr(A, mode="reduced", *, out=None):
    """Householder QR: A = Q R, Q with orthonormal columns, R upper triangular; LAPACK's
    signs (geqrf), so torch's. mode 'reduced' (k = min(m, n) columns), 'complete' (Q m x m)
    or 'r' (R only, Q empty)."""
    from collections import namedtuple
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' "
                         f"(default), 'r', or 'complete'")
    res = namedtuple("qr", ["Q", "R"])
    _check(A, "qr")
    if A.device.type != "cpu":
        _kernel_ok(A, "qr")
        batch, (m, n) = tuple(A.shape[:-2]), tuple(A.shape[-2:])
        nb, k = math.prod(batch), min(m, n)
        flat = A.reshape(nb, m, n).contiguous()
        q = Tensor._empty((nb, m, m), A.dtype, A.device)
        r = Tensor._empty((nb, m, n), A.dtype, A.device)
        if nb and m and n:
            impl("qr", A.device)(flat, q, r)
        elif nb:
            from .creation import eye
            q.copy_(eye(m, dtype=A.dtype, device=A.device).expand(nb, m, m))
            r.fill_(0)
        q, r = q.reshape(batch + (m, m)), r.reshape(batch + (m, n))
        if mode == "complete":
            return res(q, r)
        r = r[..., :k, :].contiguous()
        if mode == "r":
            return res(Tensor._empty((0,), A.dtype, A.device), r)
        return res(q[..., :, :k].contiguous(), r)
    a = A.numpy()
    if mode == "r":
        r = np.linalg.qr(a, mode="r")
        return res(_wrap(np.zeros((0,), a.dtype), A.dtype), _wrap(r, A.dtype))
    q, r = np.linalg.qr(a, mode=mode)
    return res(_wrap(q, A.dtype), _wrap(r, A.dtype))


def _eigh_device(A, UPLO, op):
    """(eigenvalues ascending, eigenvectors) on cuda/interp: the Jacobi kernel, then a sort."""
    from . import ops as _ops
    _kernel_ok(A, op)
    n = A.shape[-1]
    batch = tuple(A.shape[:-2])
    nb = math.prod(batch)
    flat = A.reshape(nb, n, n).contiguous()
    w = Tensor._empty((nb, n), A.dtype, A.device)
    v = Tensor._empty((nb, n, n), A.dtype, A.device)
    if nb and n:
        impl("eigh", A.device)(flat, w, v, UPLO == "L")
    w, order = _ops.sort(w, -1)
    v = _ops.gather(v, -1, order.unsqueeze(-2).expand(nb, n, n))
    return w.reshape(batch + (n,)), v.reshape(batch + (n, n))


def _uplo(UPLO, op):
    if UPLO not in ("L", "U"):
        raise ValueError(f"linalg.{op}: UPLO must be 'L' or 'U', got {UPLO!r}")
    return UPLO


def eigh(A, UPLO="L", *, out=None):
    """Eigenvalues (ascending) and orthonormal eigenvectors of a symmetric matrix, reading the
    triangle UPLO names. On cuda/interp a cyclic Jacobi kernel: eigenvectors are determined up
    to sign (and within a repeated eigenvalue's space), as with LAPACK."""
    from collections import namedtuple
    res = namedtuple("eigh", ["eigenvalues", "eigenvectors"])
    _square(_check(A, "eigh"), "eigh")
    _uplo(UPLO, "eigh")
    if A.device.type != "cpu":
        return res(*_eigh_device(A, UPLO, "eigh"))
    w, v = np.linalg.eigh(A.numpy(), UPLO=UPLO)
    return res(_wrap(w, _real(A.dtype)), _wrap(v, A.dtype))


def eigvalsh(A, UPLO="L", *, out=None):
    _square(_check(A, "eigvalsh"), "eigvalsh")
    _uplo(UPLO, "eigvalsh")
    if A.device.type != "cpu":
        r = _eigh_device(A, UPLO, "eigvalsh")[0]
        return r if out is None else out.copy_(r)
    return _wrap(np.linalg.eigvalsh(A.numpy(), UPLO=UPLO), _real(A.dtype))


def _cholesky_device(A, op):
    n = A.shape[-1]
    flat = A.reshape(math.prod(A.shape[:-2]), n, n).contiguous()
    lo = Tensor._empty(flat.shape, A.dtype, A.device)
    info = Tensor._empty((flat.shape[0],), _dt.int32, A.device)
    if lo.numel():
        impl("cholesky", A.device)(flat, lo, info)
    else:
        info.fill_(0)
    return lo.reshape(A.shape), info.reshape(tuple(A.shape[:-2]))


def cholesky_ex(A, *, upper=False, check_errors=False, out=None):
    """cholesky with its info (0, or the order of the first leading minor that is not positive
    definite; L is then unspecified) instead of an error. Only the lower triangle is read."""
    _square(_check(A, "cholesky_ex"), "cholesky_ex")
    if A.device.type == "cpu":
        a = A.numpy()
        info = np.zeros(tuple(A.shape[:-2]), np.int32)
        try:
            lo = np.linalg.cholesky(a)
            if np.isnan(np.diagonal(lo, 0, -2, -1)).any():     # NumPy lets NaN through
                raise np.linalg.LinAlgError("NaN pivot")
        except np.linalg.LinAlgError:       # find which matrices fail, one by one
            lo = np.zeros_like(a)
            flat_a, flat_l, flat_i = a.reshape(-1, *a.shape[-2:]), \
                lo.reshape(-1, *a.shape[-2:]), info.reshape(-1)
            for i in range(flat_a.shape[0]):
                flat_i[i] = _first_bad_minor(flat_a[i])
                flat_l[i] = np.nan if flat_i[i] else np.linalg.cholesky(flat_a[i])
        L, info = _wrap(lo, A.dtype), _wrap(info, _dt.int32)
    else:
        _kernel_ok(A, "cholesky_ex")
        L, info = _cholesky_device(A, "cholesky_ex")
    if check_errors:
        _raise_failure("cholesky", info, "cholesky_ex")
    if upper:
        L = L.mT.conj().contiguous() if L.dtype.is_complex else L.mT.contiguous()
    return _cholesky_ex_result(L, info)


def _first_bad_minor(a):
    """The order of the first leading minor of `a` (lower triangle read) that is not
    positive definite (a NaN pivot counts, as LAPACK's potrf); 0 if none."""
    for k in range(1, a.shape[-1] + 1):
        try:
            if np.isnan(np.linalg.cholesky(a[:k, :k])[k - 1, k - 1]):
                return k
        except np.linalg.LinAlgError:
            return k
    return 0


def cholesky(A, *, upper=False, out=None):
    """L with A = L L^H (upper: U = L^H); only the lower triangle of A is read. A matrix that
    is not positive definite raises LinAlgError naming the failing minor."""
    L, info = cholesky_ex(A, upper=upper)
    _raise_failure("cholesky", info, "cholesky")
    return L if out is None else out.copy_(L)


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
