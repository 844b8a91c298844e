"""Shape ops on cuda and interp: one strided gather kernel with per-dim index math.

Every shape op here moves bits without looking at them: out[i] = in[src(i)] or a
constant. So tensors are reinterpreted as unsigned-free integers of their item size
(int8/16/32/64) and one kernel serves every dtype, bf16 and fp8 included.

For each output element the kernel splits the linear index into coordinates (slot 0 =
innermost dim) and maps each coordinate i to a source coordinate j by the op's MODE:

  NONE       j = i + a              (cat, copy; flip = negative stride + base offset)
  MOD        j = (i + a) % n        (roll with a = n - shift, repeat/tile with a = 0)
  REFLECT    j = |i + a|, mirrored at n - 1          (pad 'reflect', a = -before)
  REPLICATE  j = clamp(i + a, 0, n - 1)              (pad 'replicate')
  CONSTANT   j = i + a, out of [0, n) -> fill value  (pad 'constant', negative pads crop)
  IDX_SLOT   j = idx[i] for one slot (repeat_interleave)
  TRI        zero outside the triangle of slots 1 (row) and 0 (col)   (tril / triu)

A plain copy of rows of >= 256 contiguous elements (most cats) takes `_rows_kernel`
instead, whose addresses are a row base plus arange, so its loads vectorise.
"""
from __future__ import annotations

import threading

import numpy as np
from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import dtypes as _dt
from .. import plans as _plans
from ..backends.launch import launch, launch_items
from ..dispatch import register
from ..tensor import Tensor
from ._host import cdiv as _cdiv


# triton.cdiv is a constexpr function: ~1.5 us a call from Python

MODE_NONE, MODE_MOD, MODE_REFLECT, MODE_REPLICATE, MODE_CONSTANT = range(5)
MAX_DIMS = 6


@triton.jit
def _src_coord(i, n, a, idx_ptr, mask, MODE: tl.constexpr, USE_IDX: tl.constexpr):
    """Source coordinate j of output coordinate i along one dim, and whether it is inside."""
    if USE_IDX:
        j = tl.load(idx_ptr + i, mask=mask, other=0).to(i.dtype)
        valid = mask
    else:
        j = i + a
        if MODE == 1:    # MOD; the host makes a >= 0, so j >= 0
            j = j % n
        elif MODE == 2:  # REFLECT about 0 and n - 1 (the host guarantees one reflection suffices)
            j = tl.where(j < 0, -j, j)
            j = tl.where(j >= n, 2 * (n - 1) - j, j)
        elif MODE == 3:  # REPLICATE
            j = tl.minimum(tl.maximum(j, 0), n - 1)
        valid = mask
        if MODE == 4:    # CONSTANT
            valid = mask & (j >= 0) & (j < n)
    return j, valid


@triton.jit
def _next_coord(rem, s, LAST: tl.constexpr):
    if LAST:
        return rem, rem
    return rem % s, rem // s


@triton.jit
def _dim_step(rem, src, dst, ok, s, is_, os_, n, a, idx_ptr, mask, MODE: tl.constexpr,
              LAST: tl.constexpr, USE_IDX: tl.constexpr):
    """_gather_kernel's next dim out: its output coordinate i (peeled off rem), the source and
    destination offsets with it added, and ok AND whether its source coordinate is inside."""
    i, rem = _next_coord(rem, s, LAST)
    j, v = _src_coord(i, n, a, idx_ptr, mask, MODE, USE_IDX)
    return i, rem, src + j * is_, dst + i * os_, ok & v


@triton.jit
def _gather_kernel(in_ptr, out_ptr, idx_ptr, numel, in_off, out_off, fill, diag,
                   S0, IS0, OS0, N0, A0, S1, IS1, OS1, N1, A1, S2, IS2, OS2, N2, A2,
                   S3, IS3, OS3, N3, A3, S4, IS4, OS4, N4, A4, S5, IS5, OS5, N5, A5,
                   NDIM: tl.constexpr, MODE: tl.constexpr, TRI: tl.constexpr,
                   IDX_SLOT: tl.constexpr, IDX64: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if IDX64:
        lin = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    else:
        lin = pid * BLOCK + tl.arange(0, BLOCK)
    mask = lin < numel
    rem = lin
    # slot 0 (innermost) is always present; NDIM >= 1
    i0, rem = _next_coord(rem, S0, NDIM == 1)
    j, ok = _src_coord(i0, N0, A0, idx_ptr, mask, MODE, IDX_SLOT == 0)
    src = in_off + j * IS0
    dst = out_off + i0 * OS0
    i1 = i0  # only read when NDIM > 1 (tril/triu)
    if NDIM > 1:
        i1, rem, src, dst, ok = _dim_step(rem, src, dst, ok, S1, IS1, OS1, N1, A1, idx_ptr, mask,
                                          MODE, NDIM == 2, IDX_SLOT == 1)
    if NDIM > 2:
        i, rem, src, dst, ok = _dim_step(rem, src, dst, ok, S2, IS2, OS2, N2, A2, idx_ptr,
                                         mask, MODE, NDIM == 3, IDX_SLOT == 2)
    if NDIM > 3:
        i, rem, src, dst, ok = _dim_step(rem, src, dst, ok, S3, IS3, OS3, N3, A3, idx_ptr,
                                         mask, MODE, NDIM == 4, IDX_SLOT == 3)
    if NDIM > 4:
        i, rem, src, dst, ok = _dim_step(rem, src, dst, ok, S4, IS4, OS4, N4, A4, idx_ptr,
                                         mask, MODE, NDIM == 5, IDX_SLOT == 4)
    if NDIM > 5:
        i, rem, src, dst, ok = _dim_step(rem, src, dst, ok, S5, IS5, OS5, N5, A5, idx_ptr,
                                         mask, MODE, True, IDX_SLOT == 5)
    if TRI == 1:    # tril: keep col - row <= diag
        ok = ok & ((i0 - i1) <= diag)
    elif TRI == 2:  # triu: keep col - row >= diag
        ok = ok & ((i0 - i1) >= diag)
    x = tl.load(in_ptr + src, mask=ok, other=0)
    if MODE == 4:
        x = tl.where(ok, x, fill)
    tl.store(out_ptr + dst, x.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rows_kernel(in_ptr, out_ptr, ncols, in_off, out_off, IS_ROW, OS_ROW,
                 IDX64: tl.constexpr, BLOCK: tl.constexpr):
    """Fast path: rows of `ncols` contiguous elements (cat/copy of contiguous runs).

    Addresses are a scalar row base plus arange, so loads and stores vectorise."""
    row = tl.program_id(0)
    if IDX64:
        row = row.to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < ncols
    x = tl.load(in_ptr + (in_off + row * IS_ROW) + col, mask=mask)
    tl.store(out_ptr + (out_off + row * OS_ROW) + col, x, mask=mask)


@triton.jit
def _cat_kernel(out_ptr, p0, p1, p2, p3, w0, w1, w2, w3, span, ncb, OW, out_col0,
                NIN: tl.constexpr, IDX64: tl.constexpr, BLOCK: tl.constexpr):
    """One launch of cat over up to 4 contiguous inputs seen as (rows, w_k): output row r,
    columns [out_col0, out_col0 + span) = input 0's row r, then input 1's, ... Each column
    is loaded from the one input that holds it (the other loads are masked off)."""
    pid = tl.program_id(0)
    row = pid // ncb
    cb = pid % ncb
    if IDX64:
        row = row.to(tl.int64)
    col = cb * BLOCK + tl.arange(0, BLOCK)
    m = col < span
    x = tl.load(p0 + row * w0 + col, mask=m & (col < w0))
    c = w0
    if NIN > 1:
        x1 = tl.load(p1 + row * w1 + (col - c), mask=m & (col >= c) & (col < c + w1))
        x = tl.where(col >= c, x1, x)
        c = c + w1
    if NIN > 2:
        x2 = tl.load(p2 + row * w2 + (col - c), mask=m & (col >= c) & (col < c + w2))
        x = tl.where(col >= c, x2, x)
        c = c + w2
    if NIN > 3:
        x3 = tl.load(p3 + row * w3 + (col - c), mask=m & (col >= c) & (col < c + w3))
        x = tl.where(col >= c, x3, x)
    tl.store(out_ptr + row * OW + out_col0 + col, x, mask=m)


# ---------------------------------------------------------------- launch config
# .rec: a list while this thread's entry records its launches (see _replayable); per thread,
# so another thread's launches during a recording are not replayed as part of it
_REC = threading.local()


def _launch(kernel, grid, args, kw, src, out, idx):
    """launch(), recording the launch with its tensors as placeholders when asked."""
    rec = getattr(_REC, "rec", None)
    if rec is not None:
        slots = tuple("S" if a is src else "O" if a is out else "I" if a is idx and idx is not None
                      else a for a in args)
        rec.append((kernel, grid, slots, kw))
    launch(kernel, grid, *args, **kw)

_BLOCK = 1024
_NUM_WARPS = 4
_ROWS_MIN_COLS = 256  # rows at least this long take _rows_kernel
_FORCE_IDX64 = False  # tests set it to run the int64-index path on small tensors
_BITS = {1: _dt.int8, 2: _dt.int16, 4: _dt.int32, 8: _dt.int64}


def _as_bits(t: Tensor) -> Tensor:
    """The same memory viewed as signed integers of the item size (metadata only)."""
    return Tensor._make(t.untyped_storage(), t.shape, t.stride(), t.storage_offset(),
                        _BITS[t.itemsize])


def fill_bits(value, dtype) -> int:
    """The bit pattern of `value` cast to `dtype` (documented cast rules), as a signed int."""
    with np.errstate(all="ignore"):
        a = _dt.cast(value, dtype)
    return int(a.reshape(1).view(_BITS[dtype.itemsize].np)[0])


def _simplify(dims, in_off, mode, keep_last2):
    """Drop size-1 dims (folding their source offset in) and merge untransformed runs."""
    out = []
    for k, (s, ist, ost, n, a, use_idx) in enumerate(dims):
        protected = use_idx or (keep_last2 and k >= len(dims) - 2)
        if s == 1 and not protected:
            j = _host_coord(0, n, a, mode)
            if j is not None:
                in_off += j * ist
                continue
        out.append([s, ist, ost, n, a, use_idx, protected])
    merged = []
    for d in out:  # outer to inner: merge d into the previous (outer) one when contiguous
        if merged:
            p = merged[-1]
            plain = lambda x: x[3] == x[0] and x[4] == 0 and not x[5] and not x[6]  # noqa: E731
            if plain(p) and plain(d) and p[1] == d[1] * d[0] and p[2] == d[2] * d[0]:
                p[0] = p[3] = p[0] * d[0]
                p[1], p[2] = d[1], d[2]
                continue
        merged.append(d)
    return merged, in_off


def _rows_fast_path(out, out_off, src, in_off, dims, mode, tri, idx) -> bool:
    """Run a plain copy of rows of contiguous elements with _rows_kernel, if it is one."""
    if mode != MODE_NONE or tri or idx is not None or len(dims) > 2:
        return False
    inner = dims[-1]
    if inner[1] != 1 or inner[2] != 1 or inner[3] != inner[0] or inner[4] != 0:
        return False
    rows, is_row, os_row = (dims[0][0], dims[0][1], dims[0][2]) if len(dims) == 2 else (1, 0, 0)
    if len(dims) == 2 and (dims[0][3] != dims[0][0] or dims[0][4] != 0):
        return False
    ncols = inner[0]
    if ncols < _ROWS_MIN_COLS and rows > 1:  # short rows: the flat kernel fills blocks better
        return False
    col_blocks = _cdiv(ncols, _BLOCK)
    if col_blocks > 65535 or rows > 2**31 - 1:  # grid limits of axis 1 and axis 0
        return False
    reach = max(abs(in_off) + abs(is_row) * rows, abs(out_off) + abs(os_row) * rows) + ncols + 1
    sb, ob = _as_bits(src), _as_bits(out)
    _launch(_rows_kernel, (rows, col_blocks), (sb, ob, ncols, in_off, out_off, is_row, os_row),
            dict(IDX64=reach >= 2**31 - 1 or _FORCE_IDX64, BLOCK=_BLOCK, num_warps=_NUM_WARPS),
            sb, ob, None)
    return True


def _host_coord(i, n, a, mode):
    j = i + a
    if mode == MODE_MOD:
        return j % n if n else None
    if mode == MODE_REFLECT:
        j = -j if j < 0 else j
        return 2 * (n - 1) - j if j >= n else j
    if mode == MODE_REPLICATE:
        return min(max(j, 0), n - 1) if n else None
    return j if 0 <= j < n else None


def gather(out: Tensor, src: Tensor, dims, *, mode=MODE_NONE, in_off=0, fill=0, tri=0, diag=0,
           idx: Tensor | None = None) -> None:
    """out[i] = src[in_off + sum_k j_k * in_stride_k] with j_k from the per-dim `mode`.

    `dims` lists, outer to inner, (out_size, in_stride, out_stride, in_size, add, use_idx).
    out and src share an item size; values move as bits.
    """
    if out.numel() == 0:
        return
    dims, in_off = _simplify(dims, in_off, mode, tri != 0)
    if not dims:
        dims = [[1, 0, 0, 1, 0, False, False]]
    _launch_dims(out, 0, src, in_off, dims, mode, fill, tri, diag, idx)


def _launch_dims(out, out_off, src, in_off, dims, mode, fill, tri, diag, idx):
    if len(dims) > MAX_DIMS:
        # more dims than the kernel has slots: one launch per index of the outermost dim
        s, ist, ost, n, a, _use_idx, protected = dims[0]
        for i in range(s):
            j = None if protected else _host_coord(i, n, a, mode)
            if j is None:
                raise NotImplementedError(
                    f"shape kernel: {len(dims)} dims that cannot be merged, with an index table "
                    f"or constant padding on the outermost; at most {MAX_DIMS} are supported "
                    f"on {out.device}")
            _launch_dims(out, out_off + i * ost, src, in_off + j * ist, dims[1:], mode, fill,
                         tri, diag, idx)
        return
    numel = 1
    for d in dims:
        numel *= d[0]
    if _rows_fast_path(out, out_off, src, in_off, dims, mode, tri, idx):
        return
    dims = dims[::-1]  # slot 0 = innermost
    idx_slot = next((k for k, d in enumerate(dims) if d[5]), -1)
    args = []
    for k in range(MAX_DIMS):
        s, ist, ost, n, a = dims[k][:5] if k < len(dims) else (1, 0, 0, 1, 0)
        args += [s, ist, ost, n, a]
    reach = max(numel, abs(in_off) + sum(abs(d[1]) * d[3] for d in dims),
                abs(out_off) + sum(abs(d[2]) * d[0] for d in dims)) + 1
    idx64 = reach >= 2**31 - 1 or _FORCE_IDX64
    sb, ob = _as_bits(src), _as_bits(out)
    _launch(_gather_kernel, (_cdiv(numel, _BLOCK),),
            (sb, ob, idx if idx is not None else sb, numel, in_off, out_off, fill, diag, *args),
            dict(NDIM=len(dims), MODE=mode, TRI=tri, IDX_SLOT=idx_slot, IDX64=idx64,
                 BLOCK=_BLOCK, num_warps=_NUM_WARPS), sb, ob, idx)


# ---------------------------------------------------------------- Python entries
@_plans.memoize("kernels.shape.cat")
def _cat_plan(devtype, itemsize, rows, widths, force_idx64):
    """[(first input, count, grid, arguments after the 4 pointers, constexprs)] for cat_rows;
    the width list is padded with 0 (the padding pointers are never read). Pure in its
    arguments (`force_idx64`: the module's _FORCE_IDX64 at the call)."""
    ow = sum(widths)
    plans = []
    c0 = 0
    for k in range(0, len(widths), 4):
        ws = widths[k:k + 4]
        span = sum(ws)
        if devtype == "interp":
            block = min(_np2(span), 64)  # small tiles: test shapes overhang them
        else:
            block = min(_np2(span), max(16384 // itemsize, 256))
        ncb = _cdiv(span, block)
        idx64 = rows * ow + ow >= 2**31 - 1 or rows * ncb >= 2**31 - 1 or force_idx64
        warps = 8 if block * itemsize >= 8192 else 4
        plans.append((k, len(ws), (rows * ncb,), (*ws, *(0,) * (4 - len(ws)), span, ncb, ow, c0),
                      dict(NIN=len(ws), IDX64=idx64, BLOCK=block, num_warps=warps)))
        c0 += span
    return tuple(plans)


def _np2(n):
    return 1 << (max(n, 1) - 1).bit_length()


# dtypes the cat kernel moves as themselves (the tensors go to the launch unviewed); others
# (bool, fp8) as the integer of their width
_CAT_DIRECT = frozenset(_dt.as_dtype(n) for n in ("float16", "bfloat16", "float32", "float64",
                                                   "int8", "uint8", "int16", "int32", "int64"))


def cat_rows(out, tensors, rows, widths):
    """cat of contiguous inputs of one dtype viewed as (rows, widths[k]) into a contiguous
    out (rows, sum(widths)): one launch per 4 inputs."""
    dt = out._dtype
    plans = _cat_plan(out._storage.device.type, dt.itemsize, rows, widths, _FORCE_IDX64)
    if dt not in _CAT_DIRECT:
        bits = _BITS[dt.itemsize]
        out = Tensor._make(out._storage, out._shape, out._stride, out._offset, bits)
        tensors = [Tensor._make(t._storage, t._shape, t._stride, t._offset, bits)
                   for t in tensors]
    for k, n, grid, tail, kw in plans:
        if n == 4:
            launch(_cat_kernel, grid, out, *tensors[k:k + 4], *tail, **kw)
        else:
            ps = tensors[k:k + n]
            launch(_cat_kernel, grid, out, *ps, *(ps[0],) * (4 - n), *tail, **kw)


def cat_runner(devtype, dt, rows, widths):
    """run(out, tensors) == cat_rows(out, tensors, rows, widths) with the plan bound once (the
    op layer's per-call path); a changed _FORCE_IDX64 (tests) sends it back to cat_rows."""
    force = _FORCE_IDX64
    plans = _cat_plan(devtype, dt.itemsize, rows, widths, force)
    if dt not in _CAT_DIRECT or len(plans) != 1:
        return lambda out, tensors: cat_rows(out, tensors, rows, widths)
    _, n, grid, tail, kw = plans[0]
    npad = 4 - n
    items = tuple(kw.items())   # kept: launch_items finds the fast launchers by identity

    def run(out, tensors):
        if _FORCE_IDX64 != force:
            return cat_rows(out, tensors, rows, widths)
        if npad:
            launch_items(_cat_kernel, grid, (out, *tensors, *(tensors[0],) * npad, *tail), items)
        else:
            launch_items(_cat_kernel, grid, (out, *tensors, *tail), items)
    return run


def _plain_dims(out: Tensor, src: Tensor):
    return [(s, ist, ost, s, 0, False) for s, ist, ost in zip(out.shape, src.stride(), out.stride())]


@register("cat", "triton")
def cat(out, tensors, dim, rows_widths=None):
    """`rows_widths` (rows, widths): the op layer's fast path says every input is contiguous,
    non-empty and of out's dtype, and out is fresh and contiguous: one launch per 4 inputs."""
    if rows_widths is not None:
        cat_rows(out, tensors, *rows_widths)
        return
    start = 0
    for t in tensors:
        n = t.shape[dim] if t.ndim == out.ndim else 0
        if n == 0:
            continue  # includes torch's legacy skipped 1-D empty tensors
        dst = out.narrow(dim, start, n)
        gather(dst, t, _plain_dims(dst, t))
        start += n


cat.runner = cat_runner   # the op layer's fast path binds a plan through it


# (op, itemsize, shapes, strides, args, _FORCE_IDX64) -> the launches one run made, with the
# operands' slots marked: recorded by running the op once, so a PlanCache (not an inference)
_REPLAY = _plans.PlanCache("kernels.shape.replay", 4096)


def _replayable(key, out, src, run):
    """Run `run()`, or replay the launches it made for the same key (shapes, strides, args):
    the launch geometry depends on nothing else. Entries with an index table are not cached."""
    recs = _REPLAY.get(key)
    if recs is None:
        _REC.rec = recs = []
        try:
            run()
        finally:
            _REC.rec = None
        if all("I" not in r[2] for r in recs):
            # the placeholders' positions, found once (a comparison per slot costs ~1 us)
            _REPLAY.put(key, [(kernel, grid, list(slots),
                               [i for i, a in enumerate(slots) if a.__class__ is str and a == "S"],
                               [i for i, a in enumerate(slots) if a.__class__ is str and a == "O"],
                               kw) for kernel, grid, slots, kw in recs])
        return
    bits = _BITS[out._dtype.itemsize]
    sb = Tensor._make(src._storage, src._shape, src._stride, src._offset, bits)
    ob = Tensor._make(out._storage, out._shape, out._stride, out._offset, bits)
    for kernel, grid, slots, spos, opos, kw in recs:
        args = slots.copy()
        for i in spos:
            args[i] = sb
        for i in opos:
            args[i] = ob
        launch(kernel, grid, *args, **kw)


@register("flip", "triton")
def flip(out, x, dims):
    key = ("flip", out._dtype.itemsize, x._shape, x._stride, out._stride, tuple(dims),
           _FORCE_IDX64)
    _replayable(key, out, x, lambda: _flip(out, x, dims))


def flip_runner(out, x, dims):
    """After flip(out, x, dims) ran: run(out2, x2) == flip(out2, x2, dims) for tensors of the
    same layouts and itemsize, with the replay entry bound (the op layer's per-call path),
    or None (not replayable, or more than one launch)."""
    force = _FORCE_IDX64
    recs = _REPLAY.get(("flip", out._dtype.itemsize, x._shape, x._stride, out._stride,
                        tuple(dims), force))
    if recs is None or len(recs) != 1:
        return None
    kernel, grid, slots, spos, opos, kw = recs[0]
    if len(opos) != 1 or not spos:
        return None
    bits = _BITS[out._dtype.itemsize]
    si, oi, more = spos[0], opos[0], spos[1:]
    make = Tensor._make

    def run(out, src):
        if _FORCE_IDX64 != force:
            return flip(out, src, dims)
        args = slots.copy()
        args[si] = sb = make(src._storage, src._shape, src._stride, src._offset, bits)
        for i in more:
            args[i] = sb
        args[oi] = make(out._storage, out._shape, out._stride, out._offset, bits)
        launch(kernel, grid, *args, **kw)
    return run


flip.runner = flip_runner   # the op layer's fast path binds a replay through it


def _flip(out, x, dims):
    # one gather with negative strides for every layout: a block-reversing kernel for the
    # last dim (tl.flip in registers) was tried and measured 7.5x slower than torch on the
    # H200 (77.8 vs 10.3 us for [1024, 4096] f32); the gather is as fast as torch on dim 0
    off, plan = 0, []
    for d, (s, st, ost) in enumerate(zip(x.shape, x.stride(), out.stride())):
        if d in dims and s > 1:
            off += (s - 1) * st
            st = -st
        plan.append((s, st, ost, s, 0, False))
    gather(out, x, plan, in_off=off)


@register("roll", "triton")
def roll(out, x, shifts, dims):
    amount = {}
    for d, sh in zip(dims, shifts):  # a repeated dim rolls by the sum (torch, NumPy)
        amount[d] = amount.get(d, 0) + sh
    plan = []
    for d, (s, st, ost) in enumerate(zip(x.shape, x.stride(), out.stride())):
        a = (-amount.get(d, 0)) % s if s else 0   # j = (i - shift) mod n, with a >= 0
        plan.append((s, st, ost, s, a, False))
    gather(out, x, plan, mode=MODE_MOD)


@register("repeat", "triton")
def repeat(out, x, sizes):
    plan = [(o, st, ost, n, 0, False)
            for o, st, ost, n in zip(out.shape, x.stride(), out.stride(), x.shape)]
    gather(out, x, plan, mode=MODE_MOD)


@register("repeat_interleave", "triton")
def repeat_interleave(out, x, counts, dim):
    index = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    idx = Tensor._empty(index.shape, _dt.int64, out.device)
    idx.untyped_storage().from_host(0, index)
    plan = [(o, st, ost, n, 0, d == dim)
            for d, (o, st, ost, n) in enumerate(zip(out.shape, x.stride(), out.stride(), x.shape))]
    gather(out, x, plan, idx=idx)


def _tri(out, x, diagonal, kind):
    gather(out, x, _plain_dims(out, x), tri=kind, diag=diagonal)


@register("tril", "triton")
def tril(out, x, diagonal):
    _tri(out, x, diagonal, 1)


@register("triu", "triton")
def triu(out, x, diagonal):
    _tri(out, x, diagonal, 2)


_PAD_MODES = {"constant": MODE_CONSTANT, "reflect": MODE_REFLECT, "replicate": MODE_REPLICATE,
              "circular": MODE_MOD}


@register("pad", "triton")
def pad(out, x, pads, mode, value):
    m = _PAD_MODES[mode]
    plan = []
    for (before, _after), o, st, ost, n in zip(pads, out.shape, x.stride(), out.stride(), x.shape):
        a = -before
        if m == MODE_MOD:
            a = a % n if n else 0
        plan.append((o, st, ost, n, a, False))
    gather(out, x, plan, mode=m, fill=fill_bits(value, out.dtype) if m == MODE_CONSTANT else 0)
