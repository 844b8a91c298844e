"""Index arithmetic shared by the vision kernels (conv, pooling, resample): @triton.jit
helpers that turn flat element numbers into coordinates."""
from __future__ import annotations

from ._triton import triton, tl  # noqa: F401 - the interpreter needs tl in a helper's globals


@triton.jit
def unravel4(i, S1, S2, S3):
    """(i0, i1, i2, i3) of flat numbers i over dims (*, S1, S2, S3), the last fastest."""
    i3 = i % S3
    r = i // S3
    i2 = r % S2
    r = r // S2
    i1 = r % S1
    i0 = r // S1
    return i0, i1, i2, i3


@triton.jit
def tile_rows(R, BIG: tl.constexpr, BLOCK_R: tl.constexpr):
    """(rows, row_ok) of this program's BLOCK_R row tile (grid axis 0), rows past R clamped
    to 0: int32 unless an offset may pass 2**31 (64-bit division is slow and spills)."""
    if BIG:
        rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    else:
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    return tl.where(row_ok, rows, 0), row_ok


@triton.jit
def tile_coords(R, Q, C, OD, OH, OW, CL: tl.constexpr, BIG: tl.constexpr,
                BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr):
    """The outputs (N, C, OD, OH, OW) of this program's [BLOCK_R, BLOCK_Q] tile (grid axis 0
    row tiles, axis 1 column tiles): (mask, n, c, od, oh, ow), each broadcastable to the
    tile; rows clamped into range where masked, columns not (index tables by them
    clamped). Rows are (n, c, od, oh) and columns ow, or
    (CL, a channels-last output) rows (n, od, oh, ow) and columns c: the columns are the
    output's contiguous dim, and coordinates are divided out once per row."""
    if BIG:   # int32 unless an offset may pass 2**31 (64-bit division is slow and spills)
        rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    else:
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    row_ok = rows < R
    col_ok = cols < Q
    mask = row_ok[:, None] & col_ok[None, :]
    rows = tl.where(row_ok, rows, 0)    # columns are not clamped: a clamp hides their
    # contiguity from the compiler, whose loads and stores then go one element at a time
    if CL:
        n, od, oh, ow = unravel4(rows, OD, OH, OW)
        ow = ow[:, None]
        c = cols[None, :]
    else:
        n, c, od, oh = unravel4(rows, C, OD, OH)
        c = c[:, None]
        ow = cols[None, :]
    return mask, n[:, None], c, od[:, None], oh[:, None], ow
