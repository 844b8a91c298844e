"""Indexing kernels (cuda and interp): gather, scatter, index linearisation, masked fill.

Every kernel walks one *iteration space* of up to 4 dims, laid out as a 2-D tile:
rows = the leading (up to 3) dims, cols = the last dim. Each tensor taking part is
a view of that iteration shape (a source that is indexed along a dim has stride 0
there, and the index supplies `idx * sdim`), so one kernel serves gather,
index_select, embedding, take, advanced indexing and the contiguous copy. The
Python side (`_geometry`) drops size-1 dims and merges dims that are contiguous in
every tensor, so most calls are 1-D or 2-D; above 4 dims it loops over the first.

Out-of-range indices: the kernel that reads an index checks it (`lo <= i < hi`),
masks the access (nothing is read or written out of bounds), and records in a
per-device int64[4] flag the number of bad indices, the first bad op's tag (which
names it) and one of its bad values (`_flag_bad`). The flag is read (a 32-byte
device->host copy) at the op on interp and in 'sync' mode, else at the next
synchronising call (`check_pending`, async); a read that finds an error resets it and
raises IndexError. The flag stays zero on the good path.

Atomics: scatter 'add' uses tl.atomic_add (fp16, bf16, fp32, fp64, int32, int64):
float sums with duplicate indices are not deterministic in their rounding order.
'amax'/'amin' use tl.atomic_max/min (int32, int64, fp32, fp64). Narrower dtypes
accumulate in a float32/int32 copy and are cast back (`_widened`); 'prod' has no
atomic: a compare-and-swap loop (`_cas_multiply`) does it for 32/64-bit dtypes.
"""
from __future__ import annotations

import threading

import numpy as np
from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import dtypes as _dt
from .. import plans as _plans
from ..index_errors import CHECK_MODE as _MODE, DEFER as _DEFER, install_reader
from ..index_errors import oob_error as _oob_error
from ..dispatch import NotImplementedOnDevice, register
from ..backends.cuda import driver as _driver
from ..backends.cuda import streams as _streams
from ..backends.launch import launch, launch_items
from ..tensor import Tensor
from ._host import f64_bits as _f64_bits

# scatter modes (constexpr)
STORE, ADD, AMAX, AMIN = 0, 1, 2, 3
PROD = 4
_MODES = {"store": STORE, "add": ADD, "amax": AMAX, "amin": AMIN, "prod": PROD}


# a linearised offset whose index was out of range: below every consumer's lo (-2**62)
BAD_OFFSET = tl.constexpr(-(1 << 62) - 1)


# ---------------------------------------------------------------------------- kernels
@triton.jit
def _tile(pid, n_cblocks, n_rows, R1, R2, C, BR: tl.constexpr, BC: tl.constexpr):
    """Row coordinates (r0, r1, r2), cols and masks of this program's tile."""
    pid_r = pid // n_cblocks
    pid_c = pid % n_cblocks
    rows = pid_r.to(tl.int64) * BR + tl.arange(0, BR)
    cols = (pid_c.to(tl.int64) * BC + tl.arange(0, BC))
    r2 = rows % R2
    t = rows // R2
    r1 = t % R1
    r0 = t // R1
    return r0, r1, r2, cols, rows < n_rows, cols < C


@triton.jit
def _col_offsets(cols, a_stride, b_stride, CONTIG: tl.constexpr):
    """The tile's column offsets into two operands (the columns themselves when both have
    unit column stride: CONTIG)."""
    if CONTIG:
        a = cols
        b = cols
    else:
        a = cols * a_stride
        b = cols * b_stride
    return a, b


@triton.jit
def _flag_bad(flag_ptr, bad, idx, tag):
    """Record a bad index in the flag: [0] += count; the first op to see one writes its
    host-side `tag` (names the op) into [2] and one bad value (this program's largest) into [1]."""
    nbad = tl.sum(bad.to(tl.int32))
    if nbad > 0:
        worst = tl.max(tl.where(bad, idx, -9223372036854775807))
        tl.atomic_add(flag_ptr, nbad.to(tl.int64))
        t64 = tag.to(tl.int64)
        old = tl.atomic_cas(flag_ptr + 2, t64 * 0, t64)
        if old == 0:
            tl.atomic_xchg(flag_ptr + 1, worst)


@triton.jit
def _flag_bad_lanes(flag_ptr, bad, idx, tag):
    """_flag_bad without the block reduction (and its barriers) on the good path: each bad lane
    counts itself in [0]; the lane that finds the count at 0 is the first bad index since the
    last read, and writes its tag and value ([2], [1]). Masked atomics cost nothing when no
    lane is bad."""
    z = tl.zeros_like(bad.to(tl.int32))
    old = tl.atomic_add(flag_ptr + z, (z + 1).to(tl.int64), mask=bad, sem="relaxed")
    first = bad & (old == 0)
    tl.atomic_xchg(flag_ptr + 2 + z, (z + tag).to(tl.int64), mask=first, sem="relaxed")
    tl.atomic_xchg(flag_ptr + 1 + z, idx.to(tl.int64), mask=first, sem="relaxed")


@triton.jit
def _scalar(value, F64BITS: tl.constexpr):
    """A scalar argument; float64 values travel as their int64 bit pattern (floats are fp32)."""
    if F64BITS:
        return value.to(tl.int64).to(tl.float64, bitcast=True)
    else:
        return value


@triton.jit
def _tile_index(idx_ptr, flag_ptr, tag, r0, r1, r2, cols, i0, i1, i2, ic, rmask, mask,
                dstride, lo, hi, IDX_ROW: tl.constexpr, WRAP: tl.constexpr):
    """A _tile's indices, range-checked against [lo, hi) (bad ones flagged), wrapped if WRAP:
    (wrapped index * dstride, to add to the offsets; `mask` less the bad elements)."""
    if IDX_ROW:  # the index is constant along the cols: load it once per row
        idx = tl.load(idx_ptr + (r0 * i0 + r1 * i1 + r2 * i2), mask=rmask, other=0).to(tl.int64)
        bad = ((idx < lo) | (idx >= hi)) & rmask
        _flag_bad(flag_ptr, bad, idx, tag)
        if WRAP:
            idx = tl.where(idx < 0, idx + hi, idx)
        off = (idx * dstride)[:, None]
        okmask = mask & (~bad)[:, None]
    else:
        ioff = (r0 * i0 + r1 * i1 + r2 * i2)[:, None] + (cols * ic)[None, :]
        idx = tl.load(idx_ptr + ioff, mask=mask, other=0).to(tl.int64)
        bad = ((idx < lo) | (idx >= hi)) & mask
        _flag_bad(flag_ptr, bad, idx, tag)
        if WRAP:
            idx = tl.where(idx < 0, idx + hi, idx)
        off = idx * dstride
        okmask = mask & ~bad
    return off, okmask


@triton.jit
def _gather_kernel(out_ptr, src_ptr, idx_ptr, flag_ptr, tag,
                   n_rows, R1, R2, C, n_cblocks,
                   o0, o1, o2, oc, s0, s1, s2, sc, i0, i1, i2, ic,
                   sdim, lo, hi,
                   HAS_IDX: tl.constexpr, IDX_ROW: tl.constexpr, WRAP: tl.constexpr,
                   CONTIG: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """out[c] = src[soff(c) + wrap(idx[c]) * sdim]; idx range-checked against [lo, hi)."""
    r0, r1, r2, cols, rmask, cmask = _tile(tl.program_id(0), n_cblocks, n_rows, R1, R2, C, BR, BC)
    mask = rmask[:, None] & cmask[None, :]
    ocol, scol = _col_offsets(cols, oc, sc, CONTIG)
    soff = (r0 * s0 + r1 * s1 + r2 * s2)[:, None] + scol[None, :]
    lmask = mask
    if HAS_IDX:
        ioff, lmask = _tile_index(idx_ptr, flag_ptr, tag, r0, r1, r2, cols, i0, i1, i2, ic,
                                  rmask, mask, sdim, lo, hi, IDX_ROW, WRAP)
        soff += ioff
    vals = tl.load(src_ptr + soff, mask=lmask)  # no `other`: fp8 has no int cast
    ooff = (r0 * o0 + r1 * o1 + r2 * o2)[:, None] + ocol[None, :]
    tl.store(out_ptr + ooff, vals.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gather_rows_kernel(out_ptr, src_ptr, idx_ptr, flag_ptr, tag, n_rows, C, n_cblocks,
                        o_r, s_r, i_r, sdim, lo, hi,
                        WRAP: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """_gather_kernel's common case with fewer arguments (launch cost grows with them):
    one row dim, one index per row, contiguous columns (embedding, index_select dim 0)."""
    pid = tl.program_id(0)
    rows = (pid // n_cblocks).to(tl.int64) * BR + tl.arange(0, BR)
    cols = (pid % n_cblocks).to(tl.int64) * BC + tl.arange(0, BC)
    rmask = rows < n_rows
    mask = rmask[:, None] & (cols < C)[None, :]
    idx = tl.load(idx_ptr + rows * i_r, mask=rmask, other=0).to(tl.int64)
    bad = ((idx < lo) | (idx >= hi)) & rmask
    _flag_bad(flag_ptr, bad, idx, tag)
    if WRAP:
        idx = tl.where(idx < 0, idx + hi, idx)
    soff = (rows * s_r + idx * sdim)[:, None] + cols[None, :]
    vals = tl.load(src_ptr + soff, mask=mask & (~bad)[:, None])
    tl.store(out_ptr + (rows * o_r)[:, None] + cols[None, :], vals.to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _gather_1d_kernel(out_ptr, src_ptr, idx_ptr, flag_ptr, tag, C, oc, sc, ic, sdim, lo, hi,
                      WRAP: tl.constexpr, BC: tl.constexpr):
    """_gather_kernel over one dim with an index per element (gather of (B, 1) indices)."""
    cols = tl.program_id(0).to(tl.int64) * BC + tl.arange(0, BC)
    m = cols < C
    idx = tl.load(idx_ptr + cols * ic, mask=m, other=0).to(tl.int64)
    bad = ((idx < lo) | (idx >= hi)) & m
    _flag_bad(flag_ptr, bad, idx, tag)
    if WRAP:
        idx = tl.where(idx < 0, idx + hi, idx)
    vals = tl.load(src_ptr + cols * sc + idx * sdim, mask=m & ~bad)
    tl.store(out_ptr + cols * oc, vals.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _safe_index(idx, bad, hi, WRAP: tl.constexpr, I32: tl.constexpr):
    """An index to form offsets with: negatives wrapped (WRAP), bad ones 0 (their lanes are
    masked; the flag has them), in the offsets' width."""
    if WRAP:
        idx = tl.where(idx < 0, idx + hi, idx)
    idx = tl.where(bad, 0, idx)
    if I32:
        idx = idx.to(tl.int32)
    else:
        idx = idx.to(tl.int64)
    return idx


@triton.jit
def _gather2d_kernel(out_ptr, src_ptr, idx_ptr, flag_ptr, tag, n_rows, C, n_cblocks,
                     o_r, s_r, s_c, i_r, i_c, sdim, lo, hi,
                     IDX_COL: tl.constexpr, I32: tl.constexpr, WRAP: tl.constexpr,
                     FLAG_LANES: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """out[r, c] = src[r*s_r + c*s_c + wrap(idx[r, c])*sdim] over (n_rows, C), out contiguous
    along c: index_select along a non-leading dim (IDX_COL: the index varies along c only;
    loaded once per program as a [BC] vector) and gather with a full index.

    One division per program, none per element. The column blocks of a row block are
    consecutive programs, so the programs reading the same BR source rows run together (the
    rows stay in L2). Adjacent threads take adjacent output columns (coalesced, 16-byte
    stores). I32: every offset fits in int32 (the host checks), so the index arithmetic is
    32-bit."""
    pid = tl.program_id(0)
    pid_r = pid // n_cblocks
    pid_c = pid % n_cblocks
    if I32:
        rows = pid_r * BR + tl.arange(0, BR)
        cols = pid_c * BC + tl.arange(0, BC)
    else:
        rows = pid_r.to(tl.int64) * BR + tl.arange(0, BR)
        cols = pid_c.to(tl.int64) * BC + tl.arange(0, BC)
    rmask = rows < n_rows
    cmask = cols < C
    mask = rmask[:, None] & cmask[None, :]
    if IDX_COL:
        idx = tl.load(idx_ptr + cols * i_c, mask=cmask, other=0)
        bad = ((idx < lo) | (idx >= hi)) & cmask
        if pid_r == 0:   # the same indices for every row block: record them once
            _flag_bad(flag_ptr, bad, idx.to(tl.int64), tag)
        idx = _safe_index(idx, bad, hi, WRAP, I32)
        soff = (rows * s_r)[:, None] + (cols * s_c + idx * sdim)[None, :]
        lmask = mask & (~bad)[None, :]
    else:
        idx = tl.load(idx_ptr + ((rows * i_r)[:, None] + (cols * i_c)[None, :]), mask=mask,
                      other=0)
        bad = ((idx < lo) | (idx >= hi)) & mask
        if FLAG_LANES:   # no block reduction (barriers) on the good path
            _flag_bad_lanes(flag_ptr, bad, idx, tag)
        else:
            _flag_bad(flag_ptr, bad, idx.to(tl.int64), tag)
        idx = _safe_index(idx, bad, hi, WRAP, I32)
        soff = (rows * s_r)[:, None] + (cols * s_c)[None, :] + idx * sdim
        lmask = mask & ~bad
    vals = tl.load(src_ptr + soff, mask=lmask)
    tl.store(out_ptr + ((rows * o_r)[:, None] + cols[None, :]),
             vals.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scatter_kernel(dst_ptr, src_ptr, idx_ptr, flag_ptr, tag, value, alpha,
                    n_rows, R1, R2, C, n_cblocks,
                    d0, d1, d2, dc, s0, s1, s2, sc, i0, i1, i2, ic,
                    ddim, lo, hi,
                    MODE: tl.constexpr, SRC_SCALAR: tl.constexpr, HAS_ALPHA: tl.constexpr,
                    F64BITS: tl.constexpr, IDX_ROW: tl.constexpr, WRAP: tl.constexpr,
                    BR: tl.constexpr, BC: tl.constexpr):
    """dst[doff(c) + wrap(idx[c]) * ddim] (op)= src[c] (or the scalar `value`)."""
    r0, r1, r2, cols, rmask, cmask = _tile(tl.program_id(0), n_cblocks, n_rows, R1, R2, C, BR, BC)
    mask = rmask[:, None] & cmask[None, :]
    doff = (r0 * d0 + r1 * d1 + r2 * d2)[:, None] + (cols * dc)[None, :]
    ioff, wmask = _tile_index(idx_ptr, flag_ptr, tag, r0, r1, r2, cols, i0, i1, i2, ic,
                              rmask, mask, ddim, lo, hi, IDX_ROW, WRAP)
    doff += ioff
    if SRC_SCALAR:
        # (int8 zeros: the interpreter cannot build bf16 constants)
        vals = tl.zeros([BR, BC], dtype=tl.int8) + _scalar(value, F64BITS)
    else:
        soff = (r0 * s0 + r1 * s1 + r2 * s2)[:, None] + (cols * sc)[None, :]
        vals = tl.load(src_ptr + soff, mask=wmask)
    if HAS_ALPHA:
        vals = vals * _scalar(alpha, F64BITS)
    vals = vals.to(dst_ptr.dtype.element_ty)
    if MODE == 0:
        tl.store(dst_ptr + doff, vals, mask=wmask)
    elif MODE == 1:
        tl.atomic_add(dst_ptr + doff, vals, mask=wmask, sem="relaxed")
    elif MODE == 2:
        tl.atomic_max(dst_ptr + doff, vals, mask=wmask, sem="relaxed")
    else:
        tl.atomic_min(dst_ptr + doff, vals, mask=wmask, sem="relaxed")


@triton.jit
def _cas_multiply(dst_ptr, doff, vals, scratch_ptr, pending, ITY: tl.constexpr):
    """dst[doff] *= vals for the pending lanes by compare-and-swap (no atomic multiply exists).

    Lanes that are done (or masked) aim at a scratch element so they change nothing;
    lanes that lose a race on a shared address retry with the new value.
    """
    while tl.max(pending.to(tl.int32)) > 0:
        ptrs = tl.where(pending, dst_ptr + doff, scratch_ptr)
        old = tl.load(ptrs, volatile=True)
        new = old * vals
        old_bits = old.to(ITY, bitcast=True)
        prev = tl.atomic_cas(ptrs.to(tl.pointer_type(ITY), bitcast=True), old_bits,
                             new.to(ITY, bitcast=True), sem="relaxed")
        pending = pending & (prev != old_bits)


@triton.jit
def _scatter_prod_kernel(dst_ptr, src_ptr, idx_ptr, flag_ptr, tag, scratch_ptr,
                         n_rows, R1, R2, C, n_cblocks,
                         d0, d1, d2, dc, s0, s1, s2, sc, i0, i1, i2, ic,
                         ddim, lo, hi, IBITS: tl.constexpr, WRAP: tl.constexpr,
                         BR: tl.constexpr, BC: tl.constexpr):
    """dst[doff(c) + wrap(idx[c]) * ddim] *= src[c] (32/64-bit dtypes)."""
    r0, r1, r2, cols, rmask, cmask = _tile(tl.program_id(0), n_cblocks, n_rows, R1, R2, C, BR, BC)
    mask = rmask[:, None] & cmask[None, :]
    ioff, wmask = _tile_index(idx_ptr, flag_ptr, tag, r0, r1, r2, cols, i0, i1, i2, ic,
                              rmask, mask, ddim, lo, hi, False, WRAP)
    doff = (r0 * d0 + r1 * d1 + r2 * d2)[:, None] + (cols * dc)[None, :] + ioff
    soff = (r0 * s0 + r1 * s1 + r2 * s2)[:, None] + (cols * sc)[None, :]
    vals = tl.load(src_ptr + soff, mask=wmask).to(dst_ptr.dtype.element_ty)
    if IBITS == 32:
        _cas_multiply(dst_ptr, doff, vals, scratch_ptr, wmask, tl.int32)
    else:
        _cas_multiply(dst_ptr, doff, vals, scratch_ptr, wmask, tl.int64)


@triton.jit
def _linearize_kernel(acc_ptr, idx_ptr, flag_ptr, tag,
                      n_rows, R1, R2, C, n_cblocks,
                      a0, a1, a2, ac, i0, i1, i2, ic,
                      stride, lo, hi,
                      INIT: tl.constexpr, WRAP: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """acc[c] (= or +=) wrap(idx[c]) * stride: combines several advanced indices into one.

    A bad index stores BAD_OFFSET (< -2**62), and an accumulation onto BAD_OFFSET keeps it: the
    gather/scatter that consumes acc (bounds [-2**62, 2**62)) masks that element instead of
    reading or writing outside the tensor when the range check is deferred (async, deferred)."""
    r0, r1, r2, cols, rmask, cmask = _tile(tl.program_id(0), n_cblocks, n_rows, R1, R2, C, BR, BC)
    mask = rmask[:, None] & cmask[None, :]
    v, ok = _tile_index(idx_ptr, flag_ptr, tag, r0, r1, r2, cols, i0, i1, i2, ic, rmask, mask,
                        stride, lo, hi, False, WRAP)
    bad = mask & ~ok
    aoff = (r0 * a0 + r1 * a1 + r2 * a2)[:, None] + (cols * ac)[None, :]
    if not INIT:
        prev = tl.load(acc_ptr + aoff, mask=mask, other=0)
        bad = bad | (prev == BAD_OFFSET)
        v += prev
    v = tl.where(bad, BAD_OFFSET, v)
    tl.store(acc_ptr + aoff, v, mask=mask)


@triton.jit
def _masked_fill_kernel(out_ptr, x_ptr, m_ptr, value,
                        n_rows, R1, R2, C, n_cblocks,
                        o0, o1, o2, oc, x0, x1, x2, xc, m0, m1, m2, mc,
                        F64BITS: tl.constexpr, CONTIG: tl.constexpr, BR: tl.constexpr,
                        BC: tl.constexpr):
    """out[c] = mask[c] ? value : x[c]."""
    r0, r1, r2, cols, rmask, cmask = _tile(tl.program_id(0), n_cblocks, n_rows, R1, R2, C, BR, BC)
    mask = rmask[:, None] & cmask[None, :]
    ocol, xcol = _col_offsets(cols, oc, xc, CONTIG)
    moff = (r0 * m0 + r1 * m1 + r2 * m2)[:, None] + (cols * mc)[None, :]
    m = tl.load(m_ptr + moff, mask=mask, other=0) != 0
    xoff = (r0 * x0 + r1 * x1 + r2 * x2)[:, None] + xcol[None, :]
    x = tl.load(x_ptr + xoff, mask=mask & ~m)
    fill = tl.zeros([BR, BC], dtype=tl.int8) + _scalar(value, F64BITS)
    fill = fill.to(out_ptr.dtype.element_ty)
    y = tl.where(m, fill, x.to(out_ptr.dtype.element_ty))
    ooff = (r0 * o0 + r1 * o1 + r2 * o2)[:, None] + ocol[None, :]
    tl.store(out_ptr + ooff, y, mask=mask)


@triton.jit
def _mean_finish_kernel(out_ptr, cnt_ptr, n_rows, R1, R2, C, n_cblocks,
                        o0, o1, o2, oc, c0, c1, c2, cc,
                        FLOOR: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """out[c] /= max(count[c], 1) (floor division for integer outputs, as torch)."""
    r0, r1, r2, cols, rmask, cmask = _tile(tl.program_id(0), n_cblocks, n_rows, R1, R2, C, BR, BC)
    mask = rmask[:, None] & cmask[None, :]
    ooff = (r0 * o0 + r1 * o1 + r2 * o2)[:, None] + (cols * oc)[None, :]
    coff = (r0 * c0 + r1 * c1 + r2 * c2)[:, None] + (cols * cc)[None, :]
    n = tl.maximum(tl.load(cnt_ptr + coff, mask=mask, other=1), 1)
    x = tl.load(out_ptr + ooff, mask=mask, other=0)
    if FLOOR:
        xi = x.to(tl.int64)
        q = xi // n
        q = tl.where((q * n != xi) & ((xi < 0) != (n < 0)), q - 1, q)  # floor, not trunc
        y = q.to(out_ptr.dtype.element_ty)
    else:
        y = (x.to(tl.float64) / n.to(tl.float64)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + ooff, y, mask=mask)


# ---------------------------------------------------------------------------- launch config
_MAX_RANK = 4


def _geometry(shape, strides_list):
    """Drop size-1 dims and merge dims contiguous in every tensor: (sizes, [strides...])."""
    keep = [i for i, n in enumerate(shape) if n != 1]
    sizes = [shape[i] for i in keep]
    strides = [[s[i] for i in keep] for s in strides_list]
    i = len(sizes) - 1
    while i > 0:
        if all(st[i - 1] == st[i] * sizes[i] for st in strides):
            sizes[i - 1] *= sizes[i]
            del sizes[i]
            for st in strides:
                st[i - 1] = st[i]
                del st[i]
        i -= 1
    return sizes, strides


def _npow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


@_plans.memoize("kernels.indexing.grid", 4096)
def _grid_args(devtype, n_rows, C, itemsize):
    """(grid, n_cblocks, BR, BC, num_warps) for a tile over n_rows x C elements."""
    if devtype == "interp":
        # small tiles, so test shapes overhang them (BLOCK*k + 1) cheaply
        bc = min(_npow2(C), 32)
        br = max(1, min(128 // bc, _npow2(n_rows)))
        warps = 4
    else:
        # ~16 KiB of data per program; 16-byte vectors along a contiguous last dim
        max_bc = max(16384 // itemsize, 64) if n_rows <= 4 else 8192 // itemsize
        bc = min(_npow2(C), max_bc)
        br = max(1, min(8192 // bc, _npow2(n_rows)))
        warps = 8 if br * bc >= 4096 else 4
    ncb = -(-C // bc)
    return (-(-n_rows // br) * ncb,), ncb, br, bc, warps


@_plans.memoize("kernels.indexing.geometry", 4096)
def _geometry4(shape, strides):
    """(n_rows, R1, R2, C, [4 strides per tensor]) for <= 4 merged dims, else None."""
    sizes, st = _geometry(shape, strides)
    if len(sizes) > _MAX_RANK:
        return None
    pad = _MAX_RANK - len(sizes)
    sizes = [1] * pad + sizes
    st = [[0] * pad + x for x in st]
    return sizes[0] * sizes[1] * sizes[2], sizes[1], sizes[2], sizes[3], st


def _plan(views):
    """Launch plans over `views` (same shapes): [(views, (n_rows, R1, R2, C, strides))].

    Above 4 merged dims, loops over the first dim in Python (rare; correct).
    """
    shape = views[0]._shape
    geo = _geometry4(shape, tuple(v._stride for v in views))
    if geo is None:
        d = next(i for i, n in enumerate(shape) if n != 1)
        return [p for j in range(shape[d]) for p in _plan([v.select(d, j) for v in views])]
    return [(views, geo)]


# device -> its out-of-range flag: one small tensor per device for the process's life (not a
# plan: the flags of every device are read at each check)
_FLAGS: dict = {}

# Out-of-range checks on cuda are asynchronous: the op records bad indices in the flag and
# sets PENDING; the flag is read at the next point that synchronises anyway (a device->host
# read: item/numpy/tolist/to('cpu'); nbx.cuda.synchronize; Stream/Event.synchronize), which
# call check_pending(). PENDING[0] is what those seams test (one list read when idle).
PENDING = [0]
ASYNC_TYPES = {"cuda"}   # interp checks at the op (no sync to save); tests add it
_GRAPH_OPS = [False]   # an index op was captured in a CUDA graph: its replays can set the flag

# tags name the op in the flag: 16*k + 3 is never 1 nor a multiple of 16, so the launcher's
# integer specialisation (and so the compiled kernel) is the same for every tag. An interning
# table, not a plan cache: a tag already written to a device flag must keep naming its error,
# so entries are never evicted (the table stops growing at _MAX_TAGS).
_TAG_OF: dict = {}
_ERR_OF: dict = {3: None}
_MAX_TAGS = 1 << 16


def _tag(err) -> int:
    t = _TAG_OF.get(err)
    if t is None:
        if err is None or len(_TAG_OF) >= _MAX_TAGS:
            return 3   # unnamed (the table is full): the message says "an indexing op"
        t = _TAG_OF[err] = 16 * (len(_TAG_OF) + 1) + 3
        _ERR_OF[t] = err
    return t


def _flag(device) -> Tensor:
    f = _FLAGS.get(device)
    if f is None:
        from ..creation import tensor
        f = _FLAGS[device] = tensor(np.zeros(4, np.int64), device=device)
    return f


def _read_flag(device, deferred) -> None:
    """Read one device's flag (a small device->host copy) and raise if it records a bad index."""
    f = _FLAGS.get(device)
    if f is None:
        return
    fdev = f._storage.device
    if fdev.type == "cuda":
        # the flag's own read orders after the CURRENT stream only; an index op still queued
        # on another stream would be missed (and PENDING cleared): wait for the whole context
        # first (only when a check is pending, which is when this runs)
        _driver.set_device(fdev.index or 0)
        _driver.ctx_synchronize()
    n, bad, tag, _ = (int(x) for x in f._storage.to_host(f.storage_offset() * 8, 32).view(np.int64))
    if n:
        f.untyped_storage().from_host(f.storage_offset() * 8, np.zeros(4, np.int64))
        err = _ERR_OF.get(tag) or ("indexing", "its dimension", None, None)
        e = _oob_error(err, bad)
        if deferred:
            e = type(e)(f"{e.args[0]} (recorded by an earlier op on {device} and reported at "
                        f"a later synchronising call; nbx.set_index_check('sync') reports "
                        f"it at the op)")
        raise e


def _after(dev, err) -> None:
    """After an index-reading launch: check now (interp, or 'sync' mode) or leave it pending."""
    if _DEFER[0] and err is not None:
        if dev.type == "cuda" and _capturing():
            _GRAPH_OPS[0] = True
        return
    if dev.type in ASYNC_TYPES:
        cap = _capturing()
        if _MODE[0] != "sync" or cap:   # a read inside a graph capture would be refused
            PENDING[0] = 1
            if cap:
                _GRAPH_OPS[0] = True
            return
    _read_locked([dev], False, False)


def _capturing() -> bool:
    return bool(_driver._capturing)


# One reader at a time: a read-and-reset racing another thread's would report an error twice
# (both read it before either resets it). The flag read's own device->host copy passes the
# seam again: `_LOCAL.busy` lets that nested call through without re-entering (per thread, so
# another thread's sync waits for the reader instead of returning unchecked).
_LOCK = threading.Lock()
_LOCAL = threading.local()


def _read_all(deferred) -> None:
    _read_locked(list(_FLAGS), deferred, True)


def _read_locked(devs, deferred, clear_pending) -> None:
    """Read (and reset) the flags of `devs` under the lock; `clear_pending`: these are all
    the flags, so PENDING is cleared first -- and set again if a raise leaves some unread."""
    if getattr(_LOCAL, "busy", False):
        return
    _LOCAL.busy = True
    try:
        with _LOCK:
            if clear_pending:
                PENDING[0] = 0
            for k, dev in enumerate(devs):
                try:
                    _read_flag(dev, deferred)
                except BaseException:
                    if clear_pending and k + 1 < len(devs):   # later devices' flags unread
                        PENDING[0] = 1
                    raise
    finally:
        _LOCAL.busy = False
        if _GRAPH_OPS[0]:
            PENDING[0] = 1


def check_pending() -> None:
    """The sync seams' hook: read the cuda flags if an index op ran since the last check.

    Skipped inside deferred_index_checks() (its exit reads them) and during graph capture
    (a host read would be refused). After an index op was captured in a graph, every sync
    reads the flags (replays run no Python to set PENDING).
    """
    if _DEFER[0] or _capturing():
        return
    _read_all(True)


# every synchronising call of the cuda backend reads the flags while PENDING is set
_streams.register_sync_check(PENDING, check_pending)


def check_all_flags() -> None:
    """Read every device's flag and raise for a recorded bad index (deferred checks' exit)."""
    _read_all(True)


install_reader(check_all_flags)     # the op layer's checks read the flags through index_errors


# ---------------------------------------------------------------------------- entries
def _s4(st):
    return st[0], st[1], st[2], st[3]



# _gather2d_kernel takes index_select along a non-leading dim and gather with a full index
# (2 dims, an index per column or per element) from the general _gather_kernel.
# tile of _gather2d_kernel per device: (max BC, elements per tile, num_warps, FLAG_LANES), for
# an index per column ("col") and per element ("full"); bench_indexing.py --gather-sweep times
# others. FLAG_LANES only matters for "full" (an index per column is flagged by one row block);
# it saves the block reduction but each lane's atomic returns a value: 115 registers against
# 64 (ptxas, sm_90, (256, 2048, 4)), so it is off by default.
G2D_CONFIG = {
    # H200 sweep (bench_indexing.py --gather-sweep): index_select 4096x4096 bf16 dim 1 (2048
    # idx) 33.8 us with whole 1024-column rows on 8 warps (torch 30.5; the general
    # _gather_kernel 58.4); full gather (8,1024,1024) bf16 34.8 us with 512 columns (torch
    # 34.5; _gather_kernel 38.6)
    "cuda": {"col": (1024, 8192, 8, False), "full": (512, 2048, 4, False)},
    "interp": {"col": (16, 64, 4, False), "full": (16, 64, 4, False)},  # small: tests overhang
}
_I32_MAX = (1 << 31) - 1


def _gather2d_args(devtype, n_rows, C, itemsize, st, ist, sdim, lo, hi):
    """(kernel, args, constexprs, grid) of _gather2d_kernel, or None (too many programs)."""
    o_r, s_r, s_c, i_r, i_c = st[0][2], st[1][2], st[1][3], ist[2], ist[3]
    idx_col = i_r == 0
    bcmax, tile, warps, lanes = G2D_CONFIG[devtype]["col" if idx_col else "full"]
    bc = min(_npow2(C), bcmax)
    br = max(1, min(tile // bc, _npow2(n_rows)))
    ncb = -(-C // bc)
    nprog = -(-n_rows // br) * ncb
    if nprog >= 2**31:
        return None
    # every offset the kernel forms fits in int32 (the index is clamped to [0, hi) first)
    span = max(abs(lo), abs(hi)) * abs(sdim)
    # (rows and cols of the overhanging tile included, so masked lanes do not wrap either)
    R, Cc = n_rows + br, C + bc
    i32 = max(R * abs(s_r) + Cc * abs(s_c) + span, R * abs(o_r) + Cc,
              R * abs(i_r) + Cc * abs(i_c)) < _I32_MAX
    return (_gather2d_kernel, (n_rows, C, ncb, o_r, s_r, s_c, i_r, i_c),
            dict(IDX_COL=idx_col, I32=i32, FLAG_LANES=lanes, BR=br, BC=bc, num_warps=warps),
            (nprog,))


def _gather_launch(devtype, itemsize, has_idx, sdim, lo, hi, n_rows, R1, R2, C, st):
    """(kernel, geometry args, constexprs, grid) of one index_gather launch over <= 4 merged
    dims (st: the 4 strides of out, src and idx)."""
    grid, ncb, br, bc, warps = _grid_args(devtype, n_rows, C, itemsize)
    ist = st[2] if has_idx else [0, 0, 0, 0]
    idx_row = has_idx and ist[3] == 0
    contig = st[0][3] == 1 and st[1][3] == 1
    if idx_row and contig and R2 == n_rows:     # rows of one dim: _gather_rows_kernel
        return (_gather_rows_kernel, (n_rows, C, ncb, st[0][2], st[1][2], ist[2]),
                dict(BR=br, BC=bc, num_warps=warps), grid)
    if (has_idx and not idx_row and R2 == n_rows and n_rows > 1
            and st[0][3] == 1):   # 2 dims, an index per column or per element
        g = _gather2d_args(devtype, n_rows, C, itemsize, st, ist, sdim, lo, hi)
        if g is not None:
            return g
    if has_idx and n_rows == 1 and not idx_row:  # one dim, an index per element
        return (_gather_1d_kernel, (C, st[0][3], st[1][3], ist[3]),
                dict(BC=br * bc, num_warps=warps), grid)
    geo = (n_rows, R1, R2, C, ncb, *_s4(st[0]), *_s4(st[1]), *_s4(ist))
    kw = dict(HAS_IDX=has_idx, IDX_ROW=idx_row, CONTIG=contig, BR=br, BC=bc, num_warps=warps)
    return _gather_kernel, geo, kw, grid


# index_gather's plan by layout, inferred once: ((None, kernel, geometry, constexprs, grid),)
# for layouts of <= 4 merged dims (one launch, no views to keep), None for the rest (the
# caller plans those per call, one launch per slice). It also reads G2D_CONFIG and _I32_MAX,
# which only tests change (clearing it through plans.clear_all()).
@_plans.memoize("kernels.indexing.gather", 4096)
def _gather_layout(devtype, itemsize, shape, strides, has_idx, sdim, lo, hi):
    geo = _geometry4(shape, strides)
    if geo is None:
        return None
    return ((None,) + _gather_launch(devtype, itemsize, has_idx, sdim, lo, hi, *geo),)


def _gather_plans(out, src, idx, sdim, lo, hi):
    """index_gather's launches for these layouts: [(views or None, kernel, geometry args,
    constexprs, grid)] (views None: the call's own tensors)."""
    devtype, itemsize = out._storage.device.type, out._dtype.itemsize
    has_idx = idx is not None
    if has_idx:
        strides = (out._stride, src._stride, idx._stride)
    else:
        strides = (out._stride, src._stride)
        sdim = lo = hi = 0
    plan = _gather_layout(devtype, itemsize, out._shape, strides, has_idx, sdim, lo, hi)
    if plan is not None:
        return plan
    views = [out, src, idx] if has_idx else [out, src]
    return [(vs,) + _gather_launch(devtype, itemsize, has_idx, sdim, lo, hi, *geo)
            for vs, geo in _plan(views)]


@register("index_gather", "triton")
def index_gather(out, src, idx, sdim, lo, hi, wrap, err):
    dev = out.device
    flag = _FLAGS.get(dev)
    if flag is None:
        flag = _flag(dev)
    tag = _tag(err) if idx is not None else 3
    for vs, kernel, geo, kw, grid in _gather_plans(out, src, idx, sdim, lo, hi):
        if vs is None:
            vs = (out, src, idx) if idx is not None else (out, src)
        launch(kernel, grid, vs[0], vs[1], vs[2] if idx is not None else vs[0], flag,
               tag, *geo, sdim, lo, hi, WRAP=wrap, **kw)
    if idx is not None:
        _after(dev, err)


def prepared_gather(out, src, idx, sdim, lo, hi, wrap, err):
    """The op layer's fast path on cuda: index_gather(out, src, idx, ...) as `run(out, src,
    idx)` with its one launch bound (None: not cuda, or several launches). The tensors only
    give the kernel their addresses, so a later call may pass the unviewed tensors of the same
    layout; _after's common cuda case is inlined."""
    dev = out.device
    if dev.type != "cuda":
        return None
    plans = _gather_plans(out, src, idx, sdim, lo, hi)
    if len(plans) != 1:
        return None
    _, kernel, geo, kw, grid = plans[0]
    tail = (_flag(dev), _tag(err), *geo, sdim, lo, hi)
    items = tuple(dict(WRAP=wrap, **kw).items())  # kept: launch_items finds them by identity

    def run(out, src, idx):
        launch_items(kernel, grid, (out, src, idx, *tail), items)
        if _DEFER[0] or _driver._capturing or _MODE[0] == "sync":
            _after(out._storage.device, err)
        else:       # _after on cuda (in ASYNC_TYPES), not deferred, not capturing, async mode
            PENDING[0] = 1
    return run


index_gather.prepared = prepared_gather   # the op layer's fast path binds a launch through it


def _scalar_arg(value, dtype):
    """A Python scalar already representable in `dtype` (the ops layer casts it)."""
    if value is None:
        return 0
    if dtype.name == "float64":
        return _f64_bits(float(value))
    if dtype.kind == "f":
        return float(value)  # exact in fp32 for every float dtype of <= 32 bits
    return int(value)


def _native_atomic(mode, dt, device) -> bool:
    if mode == PROD:  # compare-and-swap on 32/64-bit words
        return dt.name in ("float32", "float64", "int32", "int64")
    if mode == ADD:
        if dt.name == "bfloat16" and device.type == "interp":
            return False  # Triton's interpreter has no bf16 atomics
        return dt.name in ("float16", "bfloat16", "float32", "float64", "int32", "int64")
    return dt.name in ("float32", "float64", "int32", "int64")


def _widened(dst, src, idx, ddim, lo, hi, wrap, mode, err, value, alpha):
    """Accumulate into a narrow dtype (8/16-bit ints, bool, fp8; max/min of fp16/bf16) through
    a float32/int32 copy of the destination's whole storage, then cast back.

    Exact for integers (sums wrap modulo 2^bits either way) and for max/min; a float sum
    is rounded once at the end instead of after every add. Untouched elements round-trip
    unchanged (every narrow value is exact in the wide type).
    """
    wide = _dt.float32 if dst.dtype.kind == "f" else _dt.int32
    # the whole storage: a linearised index (hi = 2**62) does not bound the touched range
    extent = dst._storage.nbytes // dst.dtype.itemsize
    flat = Tensor._make(dst._storage, (extent,), (1,), 0, dst.dtype)
    tmp = Tensor._empty((extent,), wide, dst.device).copy_(flat)
    tview = Tensor._make(tmp._storage, dst.shape, dst.stride(), dst._offset, wide)
    if src is not None and src.dtype is not wide:
        src = Tensor._empty(src.shape, wide, src.device).copy_(src)
    index_scatter(tview, src, idx, ddim, lo, hi, wrap, mode, err, value=value, alpha=alpha)
    flat.copy_(tmp)


@register("index_scatter", "triton")
def index_scatter(dst, src, idx, ddim, lo, hi, wrap, mode, err, value=None, alpha=None):
    m = _MODES[mode]
    et = dst.dtype
    if m != STORE and not _native_atomic(m, et, dst.device):
        if dst.dtype.itemsize == 8:
            raise NotImplementedOnDevice(f"{err[0]}: reduce={mode!r} into {et.name} is not "
                                         f"supported on {dst.device}")
        return _widened(dst, src, idx, ddim, lo, hi, wrap, mode, err, value, alpha)
    dev = dst.device
    flag = _flag(dev)
    if m == PROD:
        return _scatter_prod(dst, src, idx, ddim, lo, hi, wrap, err, flag, value)
    views = [dst, idx] + ([src] if src is not None else [])
    sdt = et if src is None else src.dtype
    f64 = et.name == "float64" or sdt.name == "float64"
    if f64 and alpha is not None and et.name != sdt.name:
        raise NotImplementedOnDevice(f"{err[0]}: alpha with float64 needs src and dst of one dtype")
    if alpha is not None:
        alpha = _scalar_arg(alpha, sdt)
    for vs, (n_rows, R1, R2, C, st) in _plan(views):
        grid, ncb, br, bc, warps = _grid_args(dev.type, n_rows, C, et.itemsize)
        sst = st[2] if src is not None else [0, 0, 0, 0]
        launch(_scatter_kernel, grid, vs[0], vs[2] if src is not None else vs[0], vs[1], flag,
               _tag(err), _scalar_arg(value, et), 1 if alpha is None else alpha,
               n_rows, R1, R2, C, ncb, *_s4(st[0]), *_s4(sst), *_s4(st[1]),
               ddim, lo, hi, MODE=m, SRC_SCALAR=src is None, HAS_ALPHA=alpha is not None,
               F64BITS=f64,
               IDX_ROW=st[1][3] == 0, WRAP=wrap, BR=br, BC=bc, num_warps=warps)
    _after(dev, err)


def _scatter_prod(dst, src, idx, ddim, lo, hi, wrap, err, flag, value):
    dev = dst.device
    if src is None:  # a scalar: one element, broadcast with stride 0
        from ..creation import tensor
        one = tensor(_dt.cast(value, dst.dtype).reshape(1), device=dev)
        src = Tensor._make(one._storage, idx.shape, (0,) * idx.ndim, 0, dst.dtype)
    scratch = Tensor._empty((1,), dst.dtype, dev)
    for vs, (n_rows, R1, R2, C, st) in _plan([dst, idx, src]):
        grid, ncb, br, bc, warps = _grid_args(dev.type, n_rows, C, dst.dtype.itemsize)
        launch(_scatter_prod_kernel, grid, vs[0], vs[2], vs[1], flag, _tag(err), scratch,
               n_rows, R1, R2, C, ncb, *_s4(st[0]), *_s4(st[2]), *_s4(st[1]),
               ddim, lo, hi, IBITS=dst.dtype.itemsize * 8, WRAP=wrap, BR=br, BC=bc,
               num_warps=warps)
    _after(dev, err)


@register("index_linearize", "triton")
def index_linearize(acc, idx, stride, lo, hi, wrap, init, err):
    dev = acc.device
    flag = _flag(dev)
    for vs, (n_rows, R1, R2, C, st) in _plan([acc, idx]):
        grid, ncb, br, bc, warps = _grid_args(dev.type, n_rows, C, 8)
        launch(_linearize_kernel, grid, vs[0], vs[1], flag, _tag(err), n_rows, R1, R2, C, ncb,
               *_s4(st[0]), *_s4(st[1]), stride, lo, hi, INIT=init, WRAP=wrap,
               BR=br, BC=bc, num_warps=warps)
    _after(dev, err)


@register("masked_fill", "triton")
def masked_fill(out, x, mask, value):
    dev = out.device
    for vs, (n_rows, R1, R2, C, st) in _plan([out, x, mask]):
        grid, ncb, br, bc, warps = _grid_args(dev.type, n_rows, C, out.dtype.itemsize)
        launch(_masked_fill_kernel, grid, vs[0], vs[1], vs[2], _scalar_arg(value, out.dtype),
               n_rows, R1, R2, C, ncb, *_s4(st[0]), *_s4(st[1]), *_s4(st[2]),
               F64BITS=out.dtype.name == "float64", CONTIG=st[0][3] == 1 and st[1][3] == 1,
               BR=br, BC=bc, num_warps=warps)


@register("scatter_mean_finish", "triton")
def scatter_mean_finish(out, count):
    dev = out.device
    for vs, (n_rows, R1, R2, C, st) in _plan([out, count]):
        grid, ncb, br, bc, warps = _grid_args(dev.type, n_rows, C, out.dtype.itemsize)
        launch(_mean_finish_kernel, grid, vs[0], vs[1], n_rows, R1, R2, C, ncb,
               *_s4(st[0]), *_s4(st[1]), FLOOR=out.dtype.kind != "f", BR=br, BC=bc,
               num_warps=warps)
