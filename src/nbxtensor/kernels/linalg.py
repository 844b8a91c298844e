"""Dense factorisations of batched small matrices: LU with partial pivoting, Cholesky,
Householder QR, the symmetric eigendecomposition (cyclic Jacobi), and the triangular solve that
the solvers are built from (ops in nbxtensor/linalg.py).

One program factors one matrix, held whole in registers as a [BLOCK_M, BLOCK_N] tile (the
sizes rounded up to powers of two): each of the n elimination steps reads its pivot row and
column out of the tile with a masked reduction and updates the trailing part in place, so the
matrix is read once and written once. This bounds n by the tile a program can hold:
MAX_N = 128 (a 128 x 128 float32 tile is 64 registers a thread at 8 warps). Larger matrices are
refused by the caller (nbxtensor/linalg.py), never sent to the host.

The triangular solve holds the triangular matrix whole and BLOCK_K columns of the right-hand
side; programs (batch, column block) solve independently.

Conventions are LAPACK's (getrf, potrf, geqrf + orgqr, trsm) and so torch's, signs of QR
included (dlarfg's reflector: beta = -sign(alpha) * norm, no reflection where the column
below the diagonal is already zero): pivots are 1-based row
indices, `info` is 0 or the 1-based step whose pivot was zero (LU) or whose leading minor is
not positive definite (Cholesky).
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from ..dispatch import register
from ..backends.launch import launch
from ..tensor import Tensor
from ._host import cdiv as _cdiv, next_pow2 as _p2

__all__ = ["MAX_N", "lu_factor", "cholesky", "solve_triangular", "qr", "eigh"]

MAX_N = 128


def _warps(block_elems: int) -> int:
    return 1 if block_elems <= 256 else 2 if block_elems <= 1024 else 4 if block_elems <= 4096 \
        else 8


@triton.jit
def _load_matrix(a_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # matrix b = program_id(0) of a contiguous (batch, M, N), as one [BLOCK_M, BLOCK_N] tile
    # (0 outside it): (b, row ids, column ids, the two as a column and a row, the inside mask,
    # the offsets, the tile)
    b = tl.program_id(0).to(tl.int64)
    r1 = tl.arange(0, BLOCK_M)
    c1 = tl.arange(0, BLOCK_N)
    rows = r1[:, None]
    cols = c1[None, :]
    inside = (rows < M) & (cols < N)
    offs = b * M * N + rows * N + cols
    a = tl.load(a_ptr + offs, mask=inside, other=0.0)
    return b, r1, c1, rows, cols, inside, offs, a


@triton.jit
def _lu_kernel(a_ptr, lu_ptr, piv_ptr, perm_ptr, info_ptr, M, N, K,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # getf2, right-looking: for each step k < min(M, N) pick the largest |a[i, k]| (i >= k, the
    # first among equals), swap rows k and p, scale the column below the pivot, and subtract
    # the rank-one update from the trailing block
    b, r1, c1, rows, cols, inside, offs, a = _load_matrix(a_ptr, M, N, BLOCK_M, BLOCK_N)
    perm = r1
    info = tl.zeros([1], tl.int32)
    for k in range(0, K):
        colk = tl.sum(tl.where(cols == k, a, 0.0), axis=1)
        cand = tl.where((r1 >= k) & (r1 < M), tl.abs(colk), -1.0)
        cand = tl.where(cand != cand, float("inf"), cand)      # a NaN pivots first, as LAPACK
        best = tl.max(cand, axis=0)
        p = tl.min(tl.where(cand == best, r1, BLOCK_M), axis=0)
        rowk = tl.sum(tl.where(rows == k, a, 0.0), axis=0)
        rowp = tl.sum(tl.where(rows == p, a, 0.0), axis=0)
        a = tl.where(rows == k, rowp[None, :], tl.where(rows == p, rowk[None, :], a))
        pk = tl.sum(tl.where(r1 == k, perm, 0), axis=0)
        pp = tl.sum(tl.where(r1 == p, perm, 0), axis=0)
        perm = tl.where(r1 == k, pp, tl.where(r1 == p, pk, perm))
        tl.store(piv_ptr + b * K + k, (p + 1).to(tl.int32))
        pivot = tl.sum(tl.where(c1 == k, rowp, 0.0), axis=0)
        zero = (pivot == 0.0).to(tl.int32)
        info = info + (info == 0).to(tl.int32) * zero * (k + 1)
        below = (rows > k) & (rows < M)
        colk = tl.sum(tl.where(cols == k, a, 0.0), axis=1)
        # a zero pivot leaves its (all-zero) column as it is, as getf2
        lcol = tl.where(pivot != 0.0, colk / pivot, colk)
        lcol = tl.where(r1 > k, lcol, 0.0)
        a = tl.where(below & (cols == k), lcol[:, None], a)
        a = tl.where(below & (cols > k), a - lcol[:, None] * rowp[None, :], a)
    tl.store(lu_ptr + offs, a.to(lu_ptr.dtype.element_ty), mask=inside)
    tl.store(perm_ptr + b * M + r1, perm.to(tl.int64), mask=r1 < M)
    tl.store(info_ptr + b + tl.arange(0, 1), info)


@triton.jit
def _cholesky_kernel(a_ptr, l_ptr, info_ptr, N, BLOCK: tl.constexpr):
    # potf2 on the lower triangle (the upper one is never read): l[k, k] = sqrt(a[k, k]), the
    # column below divided by it, the trailing block less its outer product
    b = tl.program_id(0).to(tl.int64)
    r1 = tl.arange(0, BLOCK)
    rows = r1[:, None]
    cols = r1[None, :]
    lower = (rows < N) & (cols <= rows)
    offs = b * N * N + rows * N + cols
    a = tl.load(a_ptr + offs, mask=lower, other=0.0)
    info = tl.zeros([1], tl.int32)
    for k in range(0, N):
        colk = tl.sum(tl.where(cols == k, a, 0.0), axis=1)
        d = tl.sum(tl.where(r1 == k, colk, 0.0), axis=0)
        bad = 1 - (d > 0.0).to(tl.int32)       # also NaN
        info = info + (info == 0).to(tl.int32) * bad * (k + 1)
        lkk = tl.sqrt(tl.where(bad != 0, 1.0, d))
        lcol = tl.where(r1 > k, colk / lkk, 0.0)
        lcol = tl.where(r1 == k, lkk, lcol)
        a = tl.where(cols == k, lcol[:, None], a)
        below = tl.where(r1 > k, lcol, 0.0)
        a = tl.where((cols > k) & (cols <= rows), a - below[:, None] * below[None, :], a)
    tl.store(l_ptr + offs, tl.where(cols <= rows, a, 0.0).to(l_ptr.dtype.element_ty),
             mask=(rows < N) & (cols < N))
    tl.store(info_ptr + b + tl.arange(0, 1), info)


@triton.jit
def _trsm_kernel(a_ptr, b_ptr, x_ptr, N, K, UPPER: tl.constexpr, UNIT: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # X with A X = B for the triangle of A that UPPER names (the other is never read);
    # UNIT: the diagonal is taken as ones. Substitution row by row over BLOCK_K columns.
    b = tl.program_id(0).to(tl.int64)
    kb = tl.program_id(1)
    r1 = tl.arange(0, BLOCK_N)
    rows = r1[:, None]
    acols = r1[None, :]
    ks = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    if UPPER:
        tri = acols >= rows
    else:
        tri = acols <= rows
    a = tl.load(a_ptr + b * N * N + rows * N + acols, mask=(rows < N) & (acols < N) & tri,
                other=0.0)
    xmask = (rows < N) & (ks[None, :] < K)
    xoffs = b * N * K + rows * K + ks[None, :]
    y = tl.load(b_ptr + xoffs, mask=xmask, other=0.0)
    for step in range(0, N):
        if UPPER:
            k = N - 1 - step
        else:
            k = step
        acol = tl.sum(tl.where(acols == k, a, 0.0), axis=1)
        yk = tl.sum(tl.where(rows == k, y, 0.0), axis=0)
        if not UNIT:
            yk = yk / tl.sum(tl.where(r1 == k, acol, 0.0), axis=0)
        y = tl.where(rows == k, yk[None, :], y)
        if UPPER:
            rest = r1 < k
        else:
            rest = (r1 > k) & (r1 < N)
        y = tl.where(rest[:, None], y - acol[:, None] * yk[None, :], y)
    tl.store(x_ptr + xoffs, y.to(x_ptr.dtype.element_ty), mask=xmask)


@triton.jit
def _qr_kernel(a_ptr, q_ptr, r_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # geqr2 with the reflectors applied to Q = I as they are made (Q = H_0 H_1 ... H_K-1)
    b, r1, _, rows, cols, inside, _, a = _load_matrix(a_ptr, M, N, BLOCK_M, BLOCK_N)
    qc = r1[None, :]
    q = tl.where((rows == qc) & (rows < M), 1.0, 0.0).to(a.dtype)
    for k in range(0, K):
        colk = tl.sum(tl.where(cols == k, a, 0.0), axis=1)
        alpha = tl.sum(tl.where(r1 == k, colk, 0.0), axis=0)
        tail = tl.where((r1 > k) & (r1 < M), colk, 0.0)
        xnorm = tl.sqrt(tl.sum(tail * tail, axis=0))
        norm = tl.sqrt(alpha * alpha + xnorm * xnorm)
        beta = tl.where(alpha >= 0.0, -norm, norm)
        reflect = xnorm != 0.0
        safe_beta = tl.where(reflect, beta, 1.0)
        tau = tl.where(reflect, (beta - alpha) / safe_beta, 0.0)
        scale = tl.where(reflect, 1.0 / (alpha - safe_beta), 0.0)
        v = tl.where(r1 == k, 1.0, tail * scale)
        v = tl.where(r1 >= k, v, 0.0)
        w = tl.sum(v[:, None] * a, axis=0)                       # v^T A
        a = a - tau * v[:, None] * w[None, :]
        a = tl.where((cols == k) & (rows == k), tl.where(reflect, beta, a), a)
        a = tl.where((cols == k) & (rows > k), 0.0, a)
        qv = tl.sum(q * v[None, :], axis=1)                      # Q v
        q = q - tau * qv[:, None] * v[None, :]
    tl.store(q_ptr + b * M * M + rows * M + qc, q.to(q_ptr.dtype.element_ty),
             mask=(rows < M) & (qc < M))
    tl.store(r_ptr + b * M * N + rows * N + cols, tl.where(cols >= rows, a, 0.0)
             .to(r_ptr.dtype.element_ty), mask=inside)


@register("qr", "triton")
def qr(a: Tensor, q: Tensor, r: Tensor) -> None:
    """a, r: contiguous (batch, M, N); q: (batch, M, M), the complete Q."""
    batch, m, n = a.shape
    bm, bn = _p2(m), _p2(n)
    launch(_qr_kernel, (batch,), a, q, r, m, n, min(m, n), BLOCK_M=bm, BLOCK_N=bn,
           num_warps=_warps(bm * max(bm, bn)))


@triton.jit
def _eigh_kernel(a_ptr, w_ptr, v_ptr, N, tol, MAX_SWEEPS: tl.constexpr, LOWER: tl.constexpr,
                 BLOCK: tl.constexpr):
    # cyclic Jacobi: sweep over every (p, q) pair rotating a[p, q] to zero (A <- J^T A J,
    # V <- V J) until the off-diagonal mass is below tol * ||A||^2 or MAX_SWEEPS have run;
    # the triangle LOWER names is the one read, as LAPACK's UPLO
    b = tl.program_id(0).to(tl.int64)
    r1 = tl.arange(0, BLOCK)
    rows = r1[:, None]
    cols = r1[None, :]
    inside = (rows < N) & (cols < N)
    if LOWER:
        tri = cols <= rows
    else:
        tri = cols >= rows
    half = tl.load(a_ptr + b * N * N + rows * N + cols, mask=inside & tri, other=0.0)
    a = half + tl.trans(half)
    a = tl.where(rows == cols, half, a)
    v = tl.where((rows == cols) & (rows < N), 1.0, 0.0).to(a.dtype)
    total = tl.sum(tl.sum(a * a, axis=1), axis=0)
    off = total - tl.sum(tl.sum(tl.where(rows == cols, a * a, 0.0), axis=1), axis=0)
    sweep = 0
    while (sweep < MAX_SWEEPS) & (off > tol * total):
        for p in range(0, N - 1):
            for q in range(p + 1, N):
                rowp = tl.sum(tl.where(rows == p, a, 0.0), axis=0)
                rowq = tl.sum(tl.where(rows == q, a, 0.0), axis=0)
                app = tl.sum(tl.where(r1 == p, rowp, 0.0), axis=0)
                apq = tl.sum(tl.where(r1 == q, rowp, 0.0), axis=0)
                aqq = tl.sum(tl.where(r1 == q, rowq, 0.0), axis=0)
                nz = apq != 0.0
                theta = (aqq - app) / (2.0 * tl.where(nz, apq, 1.0))
                t = 1.0 / (tl.abs(theta) + tl.sqrt(theta * theta + 1.0))
                t = tl.where(theta < 0.0, -t, t)
                c = tl.where(nz, 1.0 / tl.sqrt(t * t + 1.0), 1.0)
                s = tl.where(nz, t * c, 0.0)
                a = tl.where(rows == p, (c * rowp - s * rowq)[None, :],
                             tl.where(rows == q, (s * rowp + c * rowq)[None, :], a))
                colp = tl.sum(tl.where(cols == p, a, 0.0), axis=1)
                colq = tl.sum(tl.where(cols == q, a, 0.0), axis=1)
                a = tl.where(cols == p, (c * colp - s * colq)[:, None],
                             tl.where(cols == q, (s * colp + c * colq)[:, None], a))
                vp = tl.sum(tl.where(cols == p, v, 0.0), axis=1)
                vq = tl.sum(tl.where(cols == q, v, 0.0), axis=1)
                v = tl.where(cols == p, (c * vp - s * vq)[:, None],
                             tl.where(cols == q, (s * vp + c * vq)[:, None], v))
        off = tl.sum(tl.sum(tl.where(rows == cols, 0.0, a * a), axis=1), axis=0)
        sweep += 1
    w = tl.sum(tl.where(rows == cols, a, 0.0), axis=1)
    tl.store(w_ptr + b * N + r1, w.to(w_ptr.dtype.element_ty), mask=r1 < N)
    tl.store(v_ptr + b * N * N + rows * N + cols, v.to(v_ptr.dtype.element_ty), mask=inside)


# sweeps before giving up; Jacobi converges quadratically, in 6-10 sweeps for n <= 128
EIGH_MAX_SWEEPS = 30


@register("eigh", "triton")
def eigh(a: Tensor, w: Tensor, v: Tensor, lower: bool) -> None:
    """a, v: contiguous (batch, N, N); w (batch, N): unsorted eigenvalues, v's columns their
    eigenvectors."""
    batch, n, _ = a.shape
    blk = _p2(n)
    eps = 2.0 ** -52 if a.dtype.itemsize == 8 else 2.0 ** -23
    launch(_eigh_kernel, (batch,), a, w, v, n, (eps * n) ** 2, MAX_SWEEPS=EIGH_MAX_SWEEPS,
           LOWER=bool(lower), BLOCK=blk, num_warps=_warps(blk * blk))


@register("lu_factor", "triton")
def lu_factor(a: Tensor, lu: Tensor, pivots: Tensor, perm: Tensor, info: Tensor) -> None:
    """a, lu: contiguous (batch, M, N); pivots (batch, min(M, N)) int32; perm (batch, M) int64
    (row i of P^T A is row perm[i] of A); info (batch,) int32."""
    batch, m, n = a.shape
    bm, bn = _p2(m), _p2(n)
    launch(_lu_kernel, (batch,), a, lu, pivots, perm, info, m, n, min(m, n),
           BLOCK_M=bm, BLOCK_N=bn, num_warps=_warps(bm * bn))


@register("cholesky", "triton")
def cholesky(a: Tensor, lo: Tensor, info: Tensor) -> None:
    """a, lo: contiguous (batch, N, N); info (batch,) int32."""
    batch, n, _ = a.shape
    blk = _p2(n)
    launch(_cholesky_kernel, (batch,), a, lo, info, n, BLOCK=blk, num_warps=_warps(blk * blk))


@register("solve_triangular", "triton")
def solve_triangular(a: Tensor, b: Tensor, x: Tensor, upper: bool, unit: bool) -> None:
    """a: contiguous (batch, N, N); b, x: contiguous (batch, N, K)."""
    batch, n, k = b.shape
    bn = _p2(n)
    bk = min(_p2(k), max(1, 4096 // bn), 64 if x.device.type == "cuda" else 8)
    launch(_trsm_kernel, (batch, _cdiv(k, bk)), a, b, x, n, k, UPPER=bool(upper),
           UNIT=bool(unit), BLOCK_N=bn, BLOCK_K=bk, num_warps=_warps(bn * max(bn, bk)))
