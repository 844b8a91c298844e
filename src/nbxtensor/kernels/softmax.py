"""softmax / log_softmax over one dim, on cuda/interp.

The op layer describes the problem as rows: row r = (i0, i1) with i0 = r // R1,
i1 = r % R1 (the dims before and after `dim`, each merged to one where strides allow),
and the reduced dim of length N with stride s_n. Softmax over the last dim of a
contiguous tensor is R1 = 1, s_n = 1 (unit stride, so the loads vectorise).

Rows of up to MAX_SINGLE elements live in registers: one read, one write, BLOCK_R rows
per program. Longer rows (a 128k vocabulary) take the online path: one pass for the
running max and sum, one pass to write -- two reads, one write. When there are few of them
(R < SPLIT_MAX_ROWS) each row is also cut into chunks (`_softmax_split_kernel`, two
launches: partial max/sum per chunk, then every chunk combines its row's partials in the
same fixed order and writes), so that the rows fill the SMs.

A row that is all -inf gives NaN, as torch (exp(-inf - -inf) is NaN).
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import autotune as _autotune
from .. import dtypes as _dtypes
from .. import plans as _plans
from ..backends import launch as _bl     # the module: its `launch` is looked up per call
from ..dispatch import register
from ._common import device_facts
from ._host import cdiv as _cdiv, next_pow2 as _np2


@triton.jit
def _max_sum_init(BLOCK: tl.constexpr, F64: tl.constexpr):
    """An online softmax's running max (-inf) and sum (0) over BLOCK lanes, in the
    accumulation dtype (float64 for float64 data, else float32)."""
    if F64:
        m = tl.full((BLOCK,), -float("inf"), tl.float64)
        s = tl.zeros((BLOCK,), tl.float64)
    else:
        m = tl.full((BLOCK,), -float("inf"), tl.float32)
        s = tl.zeros((BLOCK,), tl.float32)
    return m, s


@triton.jit
def _softmax_kernel(x_ptr, o_ptr, R, R1, N, s_x0, s_x1, s_xn, s_o0, s_o1, s_on,
                    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE: tl.constexpr,
                    LOG: tl.constexpr, F64: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    rows = tl.where(rmask, rows, 0)
    i0 = (rows // R1).to(tl.int64)
    i1 = (rows % R1).to(tl.int64)
    xrow = x_ptr + i0 * s_x0 + i1 * s_x1
    orow = o_ptr + i0 * s_o0 + i1 * s_o1
    cols = tl.arange(0, BLOCK_N)
    if SINGLE:
        mask = rmask[:, None] & (cols[None, :] < N)
        x = tl.load(xrow[:, None] + cols[None, :] * s_xn, mask=mask, other=-float("inf"))
        x = x.to(tl.float64) if F64 else x.to(tl.float32)
        m = tl.max(x, axis=1)
        e = tl.exp(x - m[:, None])
        s = tl.sum(e, axis=1)
        if LOG:
            y = x - m[:, None] - tl.log(s)[:, None]
        else:
            y = e / s[:, None]
        tl.store(orow[:, None] + cols[None, :] * s_on, y.to(o_ptr.dtype.element_ty), mask=mask)
    else:
        m, s = _max_sum_init(BLOCK_R, F64)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = rmask[:, None] & (c[None, :] < N)
            x = tl.load(xrow[:, None] + c[None, :] * s_xn, mask=mask, other=-float("inf"))
            x = x.to(tl.float64) if F64 else x.to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            # while a row has seen only -inf, shift by 0 so exp() gives 0 instead of NaN
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe[:, None]), axis=1)
            m = m_new
        m_safe = tl.where(m == -float("inf"), 0.0, m)
        if LOG:
            shift = m_safe + tl.log(s)
        else:
            inv = 1.0 / s
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = rmask[:, None] & (c[None, :] < N)
            x = tl.load(xrow[:, None] + c[None, :] * s_xn, mask=mask, other=-float("inf"))
            x = x.to(tl.float64) if F64 else x.to(tl.float32)
            if LOG:
                y = x - shift[:, None]
            else:
                y = tl.exp(x - m_safe[:, None]) * inv[:, None]
            tl.store(orow[:, None] + c[None, :] * s_on, y.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_split_kernel(x_ptr, o_ptr, ws_ptr, R1, N, CHUNK, NCHUNK,
                          s_x0, s_x1, s_xn, s_o0, s_o1, s_on,
                          BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, PASS: tl.constexpr,
                          LOG: tl.constexpr, F64: tl.constexpr):
    """Split-row softmax for a few long rows: grid (rows, NCHUNK), program (r, c) owns
    columns [c*CHUNK, (c+1)*CHUNK) of row r (CHUNK a multiple of BLOCK_N).
    PASS 1: the chunk's max m_c and sum s_c = sum exp(x - m_c) -> ws[r, c, 0:2].
    PASS 2: every program combines its row's NCHUNK partials (M = max m_c,
    S = sum s_c * exp(m_c - M), in a fixed order) and writes its chunk.
    -inf: a chunk (or row) of only -inf shifts by 0, so exp() gives 0 rather than NaN;
    an all -inf row ends as 0/0 = NaN, as torch."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    i0 = (r // R1).to(tl.int64)
    i1 = (r % R1).to(tl.int64)
    xrow = x_ptr + i0 * s_x0 + i1 * s_x1
    orow = o_ptr + i0 * s_o0 + i1 * s_o1
    cols = tl.arange(0, BLOCK_N)
    lo = c * CHUNK
    hi = tl.minimum(lo + CHUNK, N)
    ws_row = ws_ptr + r.to(tl.int64) * NCHUNK * 2
    if PASS == 1:
        m, s = _max_sum_init(BLOCK_N, F64)
        # lane-wise online max/sum (no cross-lane reduction inside the loop)
        for start in range(lo, hi, BLOCK_N):
            cc = start + cols
            x = tl.load(xrow + cc.to(tl.int64) * s_xn, mask=cc < hi, other=-float("inf"))
            x = x.to(tl.float64) if F64 else x.to(tl.float32)
            m_new = tl.maximum(m, x)
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            s = s * tl.exp(m - m_safe) + tl.exp(x - m_safe)
            m = m_new
        mc = tl.max(m, axis=0)
        mc_safe = tl.where(mc == -float("inf"), 0.0, mc)
        sc = tl.sum(s * tl.exp(m - mc_safe), axis=0)
        tl.store(ws_row + c * 2, mc)
        tl.store(ws_row + c * 2 + 1, sc)
    else:
        ch = tl.arange(0, BLOCK_C)
        pm = tl.load(ws_row + ch * 2, mask=ch < NCHUNK, other=-float("inf"))
        ps = tl.load(ws_row + ch * 2 + 1, mask=ch < NCHUNK, other=0.0)
        mx = tl.max(pm, axis=0)
        m_safe = tl.where(mx == -float("inf"), 0.0, mx)
        tot = tl.sum(ps * tl.exp(pm - m_safe), axis=0)
        if LOG:
            shift = m_safe + tl.log(tot)
        else:
            inv = 1.0 / tot
        for start in range(lo, hi, BLOCK_N):
            cc = start + cols
            mask = cc < hi
            x = tl.load(xrow + cc.to(tl.int64) * s_xn, mask=mask, other=-float("inf"))
            x = x.to(tl.float64) if F64 else x.to(tl.float32)
            if LOG:
                y = x - shift
            else:
                y = tl.exp(x - m_safe) * inv
            tl.store(orow + cc.to(tl.int64) * s_on, y.to(o_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------ launch configuration
# Rule: a row of N <= MAX_SINGLE elements is held whole (BLOCK_N = next_pow2(N)); enough
# rows share a program to make a tile of >= 2048 elements; warps grow with the tile
# (tile / 256, between 1 and 16). Longer rows: BLOCK_N = 4096, one row a program, 8 warps.
MAX_SINGLE = 16384
_F64 = _dtypes.float64


def row_config(N, max_single=MAX_SINGLE):
    if N <= max_single:
        bn = max(_np2(N), 1)
        br = max(1, min(64, 2048 // bn))
        tile = bn * br
        # 16 elements a thread; rows of 2048+ take 32 (H200 sweep, softmax bf16
        # 16384 x 2048: 8 -> 4 warps 40.6 -> 35.5 us, 78% -> 89% of copy; 16384 x 4096:
        # 16 -> 8 warps 83.2 -> 68.2 us, 76% -> 93%)
        per_thread = 512 if bn >= 2048 else 256
        return dict(BLOCK_R=br, BLOCK_N=bn, SINGLE=True,
                    num_warps=max(1, min(16, tile // per_thread)))
    return dict(BLOCK_R=1, BLOCK_N=4096, SINGLE=False, num_warps=8)


_OVERRIDE: dict | None = None

# Split rows: a few long rows (16 x 128256 logits; 1 x vocab when sampling) would run one
# program per row -- 16 programs, a small share of the SMs. Rows longer than MAX_SINGLE, when there are
# fewer than SPLIT_ROWS_PER_SM rows per SM of the device, are cut into chunks so that about
# SPLIT_PROGRAMS_PER_SM programs per SM run (two launches: partial max/sum, then combine +
# write; still two reads and one write of x).
SPLIT_ROWS_PER_SM = 2
SPLIT_PROGRAMS_PER_SM = 4
SPLIT_BLOCK = 2048      # columns a program step
SPLIT_MAX_CHUNKS = 256  # the combine holds all of a row's partials in one vector


def split_config(R, N, dev):
    """(CHUNK, NCHUNK) for the split-row path on `dev` (kernels/_common.DeviceFacts), or
    None to keep one program per row."""
    if _OVERRIDE and "SPLIT_CHUNK" in _OVERRIDE:        # forced (tests)
        chunk = int(_OVERRIDE["SPLIT_CHUNK"])
        return chunk, _cdiv(N, chunk)
    if N <= MAX_SINGLE or R >= SPLIT_ROWS_PER_SM * dev.sms:
        return None
    target = SPLIT_PROGRAMS_PER_SM * dev.sms
    want = max(2, min(SPLIT_MAX_CHUNKS, _cdiv(target, R), _cdiv(N, SPLIT_BLOCK)))
    chunk = _cdiv(_cdiv(N, want), SPLIT_BLOCK) * SPLIT_BLOCK
    return chunk, _cdiv(N, chunk)


@register("softmax", "triton")
def softmax(out, x, rows, *, dim, log=False):
    """rows = (R, R1, N, (s_x0, s_x1, s_xn), (s_o0, s_o1, s_on)) from ops/nn.py."""
    R, R1, N, sx, so = rows
    if R == 0 or N == 0:
        return out
    sp = split_config(R, N, device_facts(x.device))
    if sp is not None:
        return _softmax_split(out, x, R, R1, N, sx, so, sp, log)
    # the rule's config per N, computed once (never mutated: pick lays its entry over a copy)
    cfg = _row_cfg(N)
    if _OVERRIDE:
        cfg = {**cfg, **_OVERRIDE}
    else:
        # autotune seam (log_softmax is the same kernel): a screened entry or the rule
        cfg = _autotune.pick("softmax", (R, N), cfg, dtype=x._dtype.name,
                             device=x._storage.device)
    # (the launch is read from its module at call time: tests and benchmarks replace it)
    _bl.launch(_softmax_kernel, (_cdiv(R, cfg["BLOCK_R"]),), x, out, R, R1, N, *sx, *so,
               BLOCK_R=cfg["BLOCK_R"], BLOCK_N=cfg["BLOCK_N"], SINGLE=cfg["SINGLE"], LOG=log,
               F64=out._dtype is _F64 or x._dtype is _F64, num_warps=cfg["num_warps"])
    return out


@_plans.memoize("kernels.softmax.row_config", 4096)
def _row_cfg(N):
    return row_config(N)


def _softmax_split(out, x, R, R1, N, sx, so, sp, log):
    from .. import dtypes as _dt
    from ..backends.launch import launch
    from ..tensor import Tensor
    chunk, nchunk = sp
    f64 = out.dtype is _dt.float64 or x.dtype is _dt.float64
    ws = Tensor._empty((R, nchunk, 2), _dt.float64 if f64 else _dt.float32, out.device)
    bn = min(SPLIT_BLOCK, max(16, _np2(chunk)))
    if _OVERRIDE and "SPLIT_BLOCK" in _OVERRIDE:
        bn = int(_OVERRIDE["SPLIT_BLOCK"])
    common = dict(BLOCK_N=bn, BLOCK_C=max(2, _np2(nchunk)), LOG=log, F64=f64,
                  num_warps=8 if bn >= 2048 else 4)
    for p in (1, 2):
        launch(_softmax_split_kernel, (R, nchunk), x, out, ws, R1, N, chunk, nchunk, *sx, *so,
               PASS=p, **common)
    return out
