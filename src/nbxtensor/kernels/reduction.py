"""Reductions and scans for cuda and interp (Triton).

Every reduction is brought to the shape (outer O, reduced R, inner I) in Python: the
reduced dims must form one run of mergeable dims (else a permuted contiguous copy is
made), size-1 dims are dropped. One kernel then runs in one of two layouts:

  ROW (I == 1): a program owns BLOCK_K rows and walks R in BLOCK_R steps; R is the
                contiguous axis, so loads are coalesced along it.
  COL (I > 1):  a program owns one outer index and BLOCK_K inner columns and walks R;
                loads are coalesced along the inner (contiguous) axis.

Each lane keeps its own accumulator across the walk (fp32 for 16/32-bit floats, fp64
for float64, int64 for integers) and the tile is reduced once at the end. When the
grid would be small (few outputs) and R is long, R is split over a second grid axis
into partials in the accumulation dtype, and a second launch of the same kernel
reduces the partials (the "two-pass split reduction").

A reduction is PRE (per element) -> COMB (sum/prod/max/min/argmax/argmin) -> POST
(on the result): mean = sum*scale, var = sum((x-c)^2)*scale with c the mean from a
first pass, std = sqrt(var), norms via |x|, x^2, |x|^p, logsumexp = log(sum(exp(x-c)))+c
with c the max from a first pass (0 where the max is not finite).
"""
from __future__ import annotations

import math

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import dtypes as _dt
from ..declarations import subscribe_reductions
from ..dispatch import register
from ..plans import memoize
from ..backends.launch import launch, launch_items
from ..device import Device
from ..tensor import _CONTIG, Size, Tensor
from ._common import device_facts
from ._host import cdiv as _cdiv, f64_bits

# PRE codes
P_ID, P_ABS, P_NZ, P_SQDEV, P_SQ, P_POW, P_EXPDEV = range(7)
# COMB codes
C_SUM, C_PROD, C_MAX, C_MIN, C_ARGMAX, C_ARGMIN = range(6)
# POST codes
Q_NONE, Q_SCALE, Q_SQRTSCALE, Q_SQRT, Q_ROOT, Q_LOGADD = range(6)
# ACC codes
A_F32, A_F64, A_I64, A_I32 = range(4)


# NaN-propagating max/min: one max.NaN / min.NaN instruction on sm_80+ (the compare-and-
# select form cost amax ~15% of its bandwidth); ints ignore the NaN flag
@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _mul(a, b):
    return a * b


@triton.jit
def _argmax_comb(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    better = (b > a) | (b_nan & ~a_nan)
    tie = (b == a) | (a_nan & b_nan)
    take = better | (tie & (bi < ai))
    return tl.where(take, b, a), tl.where(take, bi, ai)


@triton.jit
def _argmin_comb(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    better = (b < a) | (b_nan & ~a_nan)
    tie = (b == a) | (a_nan & b_nan)
    take = better | (tie & (bi < ai))
    return tl.where(take, b, a), tl.where(take, bi, ai)


@triton.jit
def _to_acc(v, ACC: tl.constexpr):
    if ACC == 0:
        v = v.to(tl.float32)
    elif ACC == 1:
        v = v.to(tl.float64)
    elif ACC == 2:
        v = v.to(tl.int64)
    else:
        v = v.to(tl.int32)
    return v


@triton.jit
def _nonzero(v):
    """x != 0 on the loaded value, before any narrowing: 0.5 or 2**32 must not truncate to
    0 first, NaN counts as non-zero, -0.0 as zero. 16-bit floats are widened first (exact;
    the interpreter holds bf16 as raw bits, where -0.0 is not 0)."""
    if v.dtype.is_floating() and (v.dtype.primitive_bitwidth < 32):
        v = v.to(tl.float32)
    return v != 0


@triton.jit
def _pre(v, c, p, PRE: tl.constexpr, ACC: tl.constexpr):
    """The per-element step on a loaded value v: converted to the accumulation dtype, except
    for the non-zero test, which reads v as loaded."""
    if PRE == 2:
        v = _to_acc(_nonzero(v), ACC)
    else:
        v = _to_acc(v, ACC)
    if PRE == 1:
        v = tl.abs(v)
    elif PRE == 3:
        d = v - c
        v = d * d
    elif PRE == 4:
        v = v * v
    elif PRE == 5:
        v = tl.exp2(p * tl.log2(tl.abs(v)))
    elif PRE == 6:
        v = tl.exp(v - c)
    return v


@triton.jit
def _acc_scalar(v, ACC: tl.constexpr):
    """scale / p as the kernel reads them: float64 accumulations get them as their int64 bit
    pattern (a Python float argument is fp32 in a compiled kernel: mean's 1/n would be
    rounded to 24 bits), the others as fp32."""
    if ACC == 1:
        v = v.to(tl.int64).to(tl.float64, bitcast=True)
    return v


@triton.jit
def _post(res, scale, p, c, POST: tl.constexpr):
    """The reduction's finishing step (mean's scale, norms' roots, logsumexp's log + shift)."""
    if POST == 1:
        res = res * scale
    elif POST == 2:
        res = tl.sqrt(res * scale)
    elif POST == 3:
        res = tl.sqrt(res)
    elif POST == 4:
        res = tl.exp2(tl.log2(res) / p)
    elif POST == 5:
        res = tl.log(res) + c
    return res


# long: one fused Triton program; the PRE/COMB/POST steps are constexprs and compile away
@triton.jit
def _reduce_kernel(x_ptr, xi_ptr, c_ptr, v_ptr, i_ptr,
                   O, R, I, sxo, sxr, sxi, svo, svs, svi, r_chunk,
                   scale, p,
                   PRE: tl.constexpr, COMB: tl.constexpr, POST: tl.constexpr, ACC: tl.constexpr,
                   ROW: tl.constexpr, HAS_XI: tl.constexpr, HAS_C: tl.constexpr,
                   WRITE_V: tl.constexpr, WRITE_I: tl.constexpr, IDX64: tl.constexpr,
                   BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    pid = tl.program_id(0)
    pid_s = tl.program_id(1)
    scale = _acc_scalar(scale, ACC)
    p = _acc_scalar(p, ACC)
    r_begin = pid_s * r_chunk
    r_end = tl.minimum(r_begin + r_chunk, R)
    kk = tl.arange(0, BLOCK_K)
    rr = tl.arange(0, BLOCK_R)
    if IDX64:
        pid = pid.to(tl.int64)
        kk = kk.to(tl.int64)
        rr = rr.to(tl.int64)
    if ROW:
        # tile [BLOCK_K rows, BLOCK_R], reduce axis 1
        ks = pid * BLOCK_K + kk
        kmask = ks < O
        base = ks[:, None] * sxo
        out_off = ks * svo
        c_off = ks
        RAX: tl.constexpr = 1
    else:
        # tile [BLOCK_R, BLOCK_K inner columns], reduce axis 0
        nib = tl.cdiv(I, BLOCK_K)
        o = pid // nib
        ks = (pid % nib) * BLOCK_K + kk
        kmask = ks < I
        base = o * sxo + ks[None, :] * sxi
        out_off = o * svo + ks * svi
        c_off = o * I + ks
        RAX: tl.constexpr = 0

    if HAS_C:
        # the center (mean or max) is a contiguous (O, I) buffer, whatever the output's layout
        c = tl.load(c_ptr + c_off, mask=kmask, other=0.0)
        if (PRE == 6) or (POST == 5):  # logsumexp: shift by the max only where it is finite
            c = tl.where(tl.abs(c) == float("inf"), 0.0, c)
        c = _to_acc(c, ACC)
        if ROW:
            c2 = c[:, None]
        else:
            c2 = c[None, :]
    else:
        c = 0.0
        c2 = 0.0

    # identities per combine, in the accumulation dtype
    if COMB == 0:
        ident = 0
    elif COMB == 1:
        ident = 1
    elif (COMB == 2) or (COMB == 4):
        if ACC <= 1:
            ident = float("-inf")
        elif ACC == 2:
            ident = -9223372036854775807 - 1
        else:
            ident = -2147483648
    else:
        if ACC <= 1:
            ident = float("inf")
        elif ACC == 2:
            ident = 9223372036854775807
        else:
            ident = 2147483647

    if ROW:
        acc = _to_acc(tl.zeros([BLOCK_K, BLOCK_R], tl.int32), ACC) + ident
    else:
        acc = _to_acc(tl.zeros([BLOCK_R, BLOCK_K], tl.int32), ACC) + ident
    # arg index per lane: int32 unless offsets need 64 bits or pass 2 reads int64 indices
    # (int64 doubles the registers of the biggest array here and halves occupancy)
    WIDE_I: tl.constexpr = IDX64 or HAS_XI
    if WIDE_I:
        SENT: tl.constexpr = 9223372036854775807
    else:
        SENT: tl.constexpr = 2147483647
    if (COMB == 4) or (COMB == 5):
        acci = tl.full(acc.shape, SENT, tl.int64 if WIDE_I else tl.int32)

    for r0 in range(r_begin, r_end, BLOCK_R):
        r = r0 + rr
        if ROW:
            rm = r[None, :] < r_end
            m = kmask[:, None] & rm
            offs = base + r[None, :] * sxr
            rfull = r[None, :]
        else:
            rm = r[:, None] < r_end
            m = kmask[None, :] & rm
            offs = base + r[:, None] * sxr
            rfull = r[:, None]
        v = tl.load(x_ptr + offs, mask=m, other=0)
        v = _pre(v, c2, p, PRE, ACC)
        v = tl.where(m, v, ident)
        if COMB == 0:
            acc += v
        elif COMB == 1:
            acc *= v
        elif COMB == 2:
            acc = _max_nan(acc, v)
        elif COMB == 3:
            acc = _min_nan(acc, v)
        else:
            if HAS_XI:
                ri = tl.load(xi_ptr + offs, mask=m, other=SENT)
            else:
                ri = rfull.to(acci.dtype) + tl.zeros(acc.shape, acci.dtype)
            if COMB == 4:
                better = (v > acc) | ((v != v) & (acc == acc))
            else:
                better = (v < acc) | ((v != v) & (acc == acc))
            take = m & (better | (acci == SENT))
            acc = tl.where(take, v, acc)
            acci = tl.where(take, ri, acci)

    if COMB == 0:
        res = tl.sum(acc, axis=RAX)
    elif COMB == 1:
        res = tl.reduce(acc, RAX, _mul)
    elif COMB == 2:
        res = tl.reduce(acc, RAX, _max_nan)
    elif COMB == 3:
        res = tl.reduce(acc, RAX, _min_nan)
    elif COMB == 4:
        res, resi = tl.reduce((acc, acci), RAX, _argmax_comb)
    else:
        res, resi = tl.reduce((acc, acci), RAX, _argmin_comb)

    res = _post(res, scale, p, c, POST)

    out_off = out_off + pid_s * svs
    if WRITE_V:
        tl.store(v_ptr + out_off, res.to(v_ptr.dtype.element_ty), mask=kmask)
    if WRITE_I:
        tl.store(i_ptr + out_off, resi, mask=kmask)


@triton.jit
def _row_pipe_kernel(x_ptr, v_ptr, O, R, sxo, svo, scale, p,
                     PRE: tl.constexpr, COMB: tl.constexpr, POST: tl.constexpr,
                     ACC: tl.constexpr, IDX64: tl.constexpr,
                     BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    """Rows that fit one tile (R <= BLOCK_R, unit stride), persistent: a program walks the
    row tiles grid-stride and issues the loads of its next tile before reducing the current
    one (register double buffering), so its loads stay in flight through the reduction and
    the store. PRE without a center, COMB sum/max/min; run where PIPE says."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    scale = _acc_scalar(scale, ACC)
    p = _acc_scalar(p, ACC)
    kk = tl.arange(0, BLOCK_K)
    rr = tl.arange(0, BLOCK_R)
    rmask = rr < R
    ntiles = tl.cdiv(O, BLOCK_K)
    if COMB == 0:
        ident = 0.0
    elif COMB == 2:
        ident = float("-inf")
    else:
        ident = float("inf")
    ks = pid * BLOCK_K + kk
    if IDX64:
        ks = ks.to(tl.int64)
    m = (ks < O)[:, None] & rmask[None, :]
    v = tl.load(x_ptr + ks[:, None] * sxo + rr[None, :], mask=m, other=0)
    for t in range(pid, ntiles, nprog):
        kn = ks + nprog * BLOCK_K
        mn = (kn < O)[:, None] & rmask[None, :]
        vn = tl.load(x_ptr + kn[:, None] * sxo + rr[None, :], mask=mn, other=0)
        a = _pre(v, 0.0, p, PRE, ACC)
        a = tl.where(m, a, ident)
        if COMB == 0:
            res = tl.sum(a, axis=1)
        elif COMB == 2:
            res = tl.reduce(a, 1, _max_nan)
        else:
            res = tl.reduce(a, 1, _min_nan)
        res = _post(res, scale, p, 0.0, POST)
        tl.store(v_ptr + ks * svo, res.to(v_ptr.dtype.element_ty), mask=ks < O)
        v = vn
        m = mn
        ks = kn


def contiguous_copy(x: Tensor) -> Tensor:
    """x itself when contiguous, else a contiguous copy (the element-wise family's copy, any
    number of dims); used to permute the reduced/sorted dim into place."""
    return x if x.is_contiguous() else x.contiguous()


# ------------------------------------------------------------------ launch configuration
# Tunables per device type. interp uses tiny blocks and a tiny "fill the GPU" target so
# that small test shapes overhang blocks, loop over R and take the split path.
# Program counts are per SM: times the device's SM count (kernels/_common.device_facts;
# `_sms`), and on interp times INTERP_SMS, a nominal 2: the interpreter runs programs one
# after another, so its grids stay small while the split and persistent paths still run.
# Tiles are in elements (any dtype). Bandwidth needs bytes in flight: every thread issues
# its tile / (32 * warps) elements of loads per loop step before it adds any of them, so
# per SM that is resident threads x elements per thread x itemsize; registers (one acc
# per element per thread) bound how many programs stay resident. `*_warps` is for a full
# tile; a smaller tile (short rows, few columns) gets proportionally fewer warps.
# `target_programs_per_sm`: a long reduction with few outputs is split over this many
# programs a SM. _plan caches its answers: call _plan.cache_clear() after changing these
# (benchmarks/bench_reduction.py --tune sweeps them and prints a dict to paste here).
# Columns (fp32 and wider): 64 columns x 64 rows at 4 warps (H200, sum f32 (16384, 4096)
# dim=0, `bench_matmul_grid.py --colsum`: 68.0 us, 1.11x torch; 256 x 32 at 8 warps 72.7 us,
# 128 x 32 at 8 warps 76.1, 64 x 32 at 2 warps 79.8).
CONFIG = {
    "cuda": {"row_tile": 8192, "row_block_r": 4096, "row_warps": 8,
             "col_tile": 4096, "col_block_k": 64, "col_warps": 4,
             "target_programs_per_sm": 8, "split_min_steps": 2},
    "interp": {"row_tile": 64, "row_block_r": 32, "row_warps": 4,
               "col_tile": 64, "col_block_k": 8, "col_warps": 4,
               "target_programs_per_sm": 2, "split_min_steps": 2},
}
INTERP_SMS = 2


def _sms(device) -> int:
    """The SM count the rules size grids by (INTERP_SMS on interp)."""
    return INTERP_SMS if device.type == "interp" else device_facts(device).sms


SPLIT_MIN_BYTES = {"cuda": 256 << 10}   # interp: 0, so tests take the split path

# 16-bit inputs (bf16/fp16 read half the bytes per element of fp32, so the tile that
# saturates HBM for fp32 may not for them): CONFIG16[devtype] overrides CONFIG's keys when
# itemsize <= 2. PIPE: None, or {"per_sm": k, "only16": bool}: whole-row reductions over the
# last dim (sum/mean/amax/amin/norms, R <= the row tile) run _row_pipe_kernel on about k
# programs per SM (16-bit inputs only unless only16 is False). The shipped values are the
# H200's (benchmarks/sweep_bandwidth.py --groups=red, sum bf16 (32768,4096)): dim=-1
# persistent pipelined rows, 4 programs an SM, 64.1 us (1.09x torch; CONFIG's tiles 75.8 us,
# 0.93x); dim=0 128-column 4-warp column programs, 70.8 us (1.09x; CONFIG's 84.6 us, 0.91x).
# Eviction hints and a prefetching column loop lost in the same sweep (0.79-0.97x).
CONFIG16 = {"cuda": {"col_block_k": 128, "col_tile": 4096, "col_warps": 4}, "interp": {}}
# fp32 rows pipelined too (`sweep_bandwidth.py --groups=red32`, H200): sum / amax f32
# (16384,4096) dim=-1 62.9 / 63.1 us (1.08x / 1.09x torch, 100% of copy) at 4 programs an SM,
# against CONFIG's tiles' 68.9 / 70.1 us (0.99x / 0.98x); (2048,32000) unchanged (1.06x).
PIPE: dict | None = {"per_sm": 4, "only16": False}
def _p2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@memoize("kernels.reduction.tiles", 4096)
def _plan(devtype, sms, O, R, I, itemsize):
    cfg = CONFIG[devtype]
    if itemsize <= 2 and CONFIG16.get(devtype):
        cfg = {**cfg, **CONFIG16[devtype]}
    target = cfg["target_programs_per_sm"] * sms
    if I == 1:
        full = cfg["row_tile"]
        block_r = min(_p2(R), cfg["row_block_r"])
        block_k = max(1, min(_p2(O), full // block_r))
        if block_k * block_r < full:  # few rows (e.g. a full reduction): longer steps along R
            block_r = min(_p2(R), full // block_k)
        while block_k > 1 and _cdiv(O, block_k) < target:
            block_k //= 2  # few rows: one program each (fewer warps) rather than idle SMs
        nprog = _cdiv(O, block_k)
        warps = cfg["row_warps"]
    else:
        full = cfg["col_tile"]
        block_k = min(_p2(I), cfg["col_block_k"])
        block_r = max(1, min(_p2(R), full // block_k))
        nprog = O * _cdiv(I, block_k)
        warps = cfg["col_warps"]
    split = 1
    chunk = max(R, 1)
    steps = _cdiv(R, block_r)
    # a split costs a second launch and a partials buffer (~10 us of host time per call on
    # the H200 machine): below SPLIT_MIN_BYTES per program one program is as fast end to end
    if nprog < target and steps >= 2 * cfg["split_min_steps"] and \
            O * R * I * itemsize >= nprog * SPLIT_MIN_BYTES.get(devtype, 0):
        split = min(_cdiv(target, nprog), steps // cfg["split_min_steps"])
        chunk = _cdiv(steps, split) * block_r
        split = _cdiv(R, chunk)
    tile = block_k * block_r
    # same elements per thread as a full tile; at least one element per lane
    num_warps = max(1, min(warps, warps * tile // full, _p2(tile) // 32))
    return block_k, block_r, nprog, split, chunk, num_warps


def _acc_code(dtype: _dt.DType) -> int:
    if dtype.kind == "f":
        return A_F64 if dtype is _dt.float64 else A_F32
    return A_I64


def _acc_dtype(code):
    return {A_F32: _dt.float32, A_F64: _dt.float64, A_I64: _dt.int64, A_I32: _dt.int32}[code]


def _merge(group):
    """Merge (size, stride) dims into one, or None if they are not one strided run."""
    if not group:
        return 1, 0
    n, s = group[-1]
    for size, stride in reversed(group[:-1]):
        if stride != s * n:
            return None
        n *= size
    return n, s


@memoize("kernels.reduction.geometry", 4096)
def _geometry(shape, stride, dims):
    """(copy_order or None, O, R, I, sxo, sxr, sxi, svo, svi) for reducing `dims`; cached,
    since small reductions pay for this Python on every call."""
    red = set(dims)
    ent = [(n, s, i in red) for i, (n, s) in enumerate(zip(shape, stride)) if n != 1]
    pos = [j for j, e in enumerate(ent) if e[2]]
    ok = not pos or pos == list(range(pos[0], pos[-1] + 1))
    if ok:
        a0, a1 = (pos[0], pos[-1] + 1) if pos else (len(ent), len(ent))
        groups = [_merge([(n, s) for n, s, _ in ent[:a0]]),
                  _merge([(n, s) for n, s, _ in ent[a0:a1]]),
                  _merge([(n, s) for n, s, _ in ent[a1:]])]
        ok = all(g is not None for g in groups)
    if ok:
        (O, sxo), (R, sxr), (I, sxi) = groups
        svo, svi = I, 1
        if I == 1 and O > 1 and sxo == 1 and sxr != 1 and R > 1:
            # reduced axis strided, kept axis contiguous (a transposed input): read it as
            # columns so the loads stay coalesced
            O, I, sxo, sxi, svo, svi = 1, O, 0, 1, 0, 1
        return None, O, R, I, sxo, sxr, sxi, svo, svi
    kept = [i for i in range(len(shape)) if i not in red]
    O = math.prod(shape[i] for i in kept)
    R = math.prod(shape[i] for i in red)
    return tuple(kept + sorted(red)), O, R, 1, R, 1, 0, 1, 0


def _collapse(x: Tensor, dims):
    """(xt, O, R, I, sxo, sxr, sxi, svo, svi): a view of x as (O, R, I) and the output's
    strides over (O, I) in the contiguous keepdim output. Reduced dims that are not one
    mergeable run are first permuted last and copied contiguous."""
    order, *geo = _geometry(x._shape, x._stride, dims if dims.__class__ is tuple else tuple(dims))
    xt = x if order is None else contiguous_copy(x.permute(order))
    return (xt, *geo)


def _recipe(devtype, sms, itemsize, numel, O, R, I, sxo, sxr, sxi, svo, svi, codes, has_v,
            has_i, has_c):
    """How `_reduce3` launches a single-pass reduction: (form, kernel, grid, ints, items) with
    form "pipe" (_row_pipe_kernel) or "row" (_reduce_kernel), ints the integer arguments
    after the pointers and items the constexprs as a tuple (kept by the plan cache, so
    `launch_items` finds the fast launchers by identity); None when R is split."""
    PRE, COMB, POST, ACC = codes
    block_k, block_r, nprog, split, chunk, nw = _plan(devtype, sms, O, R, I, itemsize)
    if split != 1:
        return None
    idx64 = (numel + R * abs(sxr) + O * abs(sxo) + I * abs(sxi)) >= 2 ** 31 - 1
    if PIPE is not None and I == 1 and sxr == 1 and R <= block_r and not has_c and \
            COMB in (C_SUM, C_MAX, C_MIN) and ACC in (A_F32, A_F64) and has_v and \
            (itemsize <= 2 or not PIPE.get("only16", True)):
        nt = _cdiv(O, block_k)
        grid = (min(nt, PIPE.get("per_sm", 4) * sms),)
        items = (("PRE", PRE), ("COMB", COMB), ("POST", POST), ("ACC", ACC), ("IDX64", idx64),
                 ("BLOCK_K", block_k), ("BLOCK_R", block_r), ("num_warps", nw),
                 ("num_stages", 1))
        return "pipe", _row_pipe_kernel, grid, (O, R, sxo, svo), items
    items = (("PRE", PRE), ("COMB", COMB), ("POST", POST), ("ACC", ACC), ("ROW", I == 1),
             ("HAS_XI", False), ("HAS_C", has_c), ("WRITE_V", has_v), ("WRITE_I", has_i),
             ("IDX64", idx64), ("BLOCK_K", block_k), ("BLOCK_R", block_r), ("num_warps", nw))
    return "row", _reduce_kernel, (nprog, 1), (O, R, I, sxo, sxr, sxi, svo, 0, svi, chunk), items


def _scalars(acc, scale, p):
    """The (scale, p) arguments as _acc_scalar reads them."""
    if acc == A_F64:
        return f64_bits(float(scale)), f64_bits(float(p))
    return float(scale), float(p)


def _launch_recipe(rec, xt, c, v, i, scale, p):
    form, kernel, grid, ints, items = rec
    sp = _scalars(items[3][1], scale, p)     # items[3] is ("ACC", code)
    if form == "pipe":
        launch_items(kernel, grid, (xt, v, *ints, *sp), items)
    else:
        launch_items(kernel, grid, (xt, xt, c if c is not None else xt,
                                    v if v is not None else i, i if i is not None else xt,
                                    *ints, *sp), items)


def _reduce3(geo, codes, v, i, c=None, scale=1.0, p=1.0):
    """Run one reduction over a collapsed input; split into two launches when it pays."""
    xt, O, R, I, sxo, sxr, sxi, svo, svi = geo
    PRE, COMB, POST, ACC = codes
    devtype, sms = xt.device.type, _sms(xt.device)
    rec = _recipe(devtype, sms, xt.dtype.itemsize, xt.numel(), O, R, I, sxo, sxr, sxi, svo,
                  svi, codes, v is not None, i is not None, c is not None)
    if rec is not None:
        _launch_recipe(rec, xt, c, v, i, scale, p)
        return
    block_k, block_r, nprog, split, chunk, nw = _plan(devtype, sms, O, R, I, xt.dtype.itemsize)
    arg = COMB in (C_ARGMAX, C_ARGMIN)
    idx64 = (xt.numel() + R * abs(sxr) + O * abs(sxo) + I * abs(sxi)) >= 2 ** 31 - 1
    ctens = c if c is not None else xt
    # pass 1: partials (O, split, I) in the accumulation dtype
    wv = Tensor._empty((O, split, I), _acc_dtype(ACC), xt.device)
    wi = Tensor._empty((O, split, I), _dt.int64, xt.device) if arg else wv
    launch(_reduce_kernel, (nprog, split), xt, xt, ctens, wv, wi,
           O, R, I, sxo, sxr, sxi, split * I, I, 1, chunk, *_scalars(ACC, scale, p),
           PRE=PRE, COMB=COMB, POST=Q_NONE, ACC=ACC, ROW=(I == 1), HAS_XI=False,
           HAS_C=c is not None, WRITE_V=True, WRITE_I=arg, IDX64=idx64,
           BLOCK_K=block_k, BLOCK_R=block_r, num_warps=nw)
    # pass 2: reduce the partials with the same combine, then POST
    block_k2, block_r2, nprog2, _, _, nw2 = _plan(devtype, sms, O, split, I, wv.dtype.itemsize)
    launch(_reduce_kernel, (nprog2, 1), wv, wi, ctens, v if v is not None else i,
           i if i is not None else wv,
           O, split, I, split * I, I, 1, svo, 0, svi, split, *_scalars(ACC, scale, p),
           PRE=P_ID, COMB=COMB, POST=POST, ACC=ACC, ROW=(I == 1), HAS_XI=arg,
           HAS_C=c is not None, WRITE_V=v is not None, WRITE_I=i is not None,
           IDX64=idx64, BLOCK_K=block_k2, BLOCK_R=block_r2, num_warps=nw2)


# kind -> (PRE, COMB, POST) of the single-pass kinds: the declared reductions' `tl` steps
# (ops/_declare.py, read through nbxtensor/declarations.py), and max/min with their indices
_SIMPLE = {"max": (P_ID, C_ARGMAX, Q_NONE), "min": (P_ID, C_ARGMIN, Q_NONE)}


def _declared(op) -> None:
    _SIMPLE[op.kind] = tuple(globals()[code] for code in op.tl)


subscribe_reductions(_declared)


def _flat(t: Tensor) -> Tensor:
    """t (a fresh contiguous output) as 1-D, without view()'s general checks."""
    if t._offset == 0 and t._stride == _CONTIG.get(t._shape):
        return Tensor._make(t._storage, (math.prod(t._shape),), (1,), 0, t._dtype)
    return t.view(-1)


# Single-pass launches of the _SIMPLE kinds by everything `reduce` reads: (kind, input
# dtype/shape/strides, dims, device type and index (its SM count), values' and indices'
# dtype/shape/strides), memoised. A plan is (recipe, PIPE it was made under, flat shape of
# the outputs); it holds no tensors. The tile CONFIGs are covered by `_plan.cache_clear()`
# (their documented reset), which clears these too; a replaced PIPE by identity.
@memoize("kernels.reduction.launch", 4096)
def _simple_launch(kind, dtype, shape, stride, dims, devtype, devindex, vkey, ikey):
    """The recipe of one launch over the input itself (no permuted copy, no split) into
    contiguous outputs, or None (the full path)."""
    order, O, R, I, sxo, sxr, sxi, svo, svi = _geometry(shape, stride, dims)
    acc = A_I32 if kind in ("any", "all") else _acc_code(dtype)
    pre, comb, post = _SIMPLE[kind]
    outs = [k for k in (vkey, ikey) if k is not None]
    rec = None
    if order is None and all(k[2] == _CONTIG.get(k[1]) for k in outs):
        dev = Device(devtype, devindex)
        rec = _recipe(devtype, _sms(dev), dtype.itemsize, math.prod(shape), O, R, I, sxo, sxr,
                      sxi, svo, svi, (pre, comb, post, acc), vkey is not None,
                      ikey is not None, False)
    return rec, PIPE, Size((math.prod(outs[0][1]),))


_plan_cache_clear = _plan.cache_clear


def _clear_plans():
    _plan_cache_clear()
    _simple_launch.cache_clear()


_plan.cache_clear = _clear_plans


def _out_key(t):
    return None if t is None else (t._dtype, t._shape, t._stride)


@register("reduce", "triton")
def reduce(kind, x, dims, values, indices, **params):
    if dims.__class__ is tuple and kind in _SIMPLE:
        dev = x._storage.device
        hit = _simple_launch(kind, x._dtype, x._shape, x._stride, dims, dev.type, dev.index,
                             _out_key(values), _out_key(indices))
        if hit[1] is not PIPE:      # PIPE was replaced since: plan again
            _simple_launch.cache_clear()
            return reduce(kind, x, dims, values, indices, **params)
        if hit[0] is not None:
            flat = hit[2]
            v = None if values is None else Tensor._make(values._storage, flat, (1,),
                                                         values._offset, values._dtype)
            i = None if indices is None else Tensor._make(indices._storage, flat, (1,),
                                                          indices._offset, indices._dtype)
            _launch_recipe(hit[0], x, None, v, i, params.get("scale", 1.0), 1.0)
            return
    return _reduce_full(kind, x, dims, values, indices, **params)


def _reduce_full(kind, x, dims, values, indices, **params):
    geo = _collapse(x, dims)
    keep = values if values is not None else indices
    v = _flat(values) if values is not None else None
    i = _flat(indices) if indices is not None else None
    acc = _acc_code(x.dtype)
    if kind in ("any", "all"):
        acc = A_I32
    if kind in _SIMPLE:
        pre, comb, post = _SIMPLE[kind]
        _reduce3(geo, (pre, comb, post, acc), v, i, scale=params.get("scale", 1.0))
    elif kind in ("var", "std"):
        n = params["count"]
        center = Tensor._empty(keep.shape, _acc_dtype(acc), x.device).view(-1)
        _reduce3(geo, (P_ID, C_SUM, Q_SCALE, acc), center, None, scale=1.0 / n)
        _reduce3(geo, (P_SQDEV, C_SUM, Q_SCALE if kind == "var" else Q_SQRTSCALE, acc), v, None,
                 c=center, scale=params["scale"])
    elif kind == "lse":
        center = Tensor._empty(keep.shape, _acc_dtype(acc), x.device).view(-1)
        _reduce3(geo, (P_ID, C_MAX, Q_NONE, acc), center, None)
        _reduce3(geo, (P_EXPDEV, C_SUM, Q_LOGADD, acc), v, None, c=center)
    elif kind == "norm":
        ord = params["ord"]
        if ord == math.inf:
            codes = (P_ABS, C_MAX, Q_NONE)
        elif ord == -math.inf:
            codes = (P_ABS, C_MIN, Q_NONE)
        elif ord == 0:
            codes = (P_NZ, C_SUM, Q_NONE)
        elif ord == 1:
            codes = (P_ABS, C_SUM, Q_NONE)
        elif ord == 2:
            codes = (P_SQ, C_SUM, Q_SQRT)
        else:
            codes = (P_POW, C_SUM, Q_ROOT)
        _reduce3(geo, codes + (acc,), v, None, p=ord)
    else:
        raise ValueError(f"reduce: unknown kind {kind!r}")


# ------------------------------------------------------------------ scans (cumsum, cumprod)
# A scan walks the scanned dim of a contiguous (O, N, I) view in tiles of BLOCK_N positions by
# BLOCK_K lanes, with a carry per lane: rows (I == 1) take tiles [BLOCK_K rows, BLOCK_N],
# inner columns [BLOCK_N, BLOCK_K columns], so every load is coalesced. _scan_lanes and
# _scan_tile are that walk (scan.py's logcumsumexp takes it too).
@triton.jit
def _scan_lanes(O, N, I, ROW: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    # this program's lanes (in-range mask, offset of position 0 of each lane) and a tile's
    # positions 0..BLOCK_N-1
    pid = tl.program_id(0).to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    nn = tl.arange(0, BLOCK_N)
    if ROW:
        ks = pid * BLOCK_K + kk
        kmask = ks < O
        base = ks[:, None] * N
    else:
        nib = tl.cdiv(I, BLOCK_K)
        o = pid // nib
        ks = (pid % nib) * BLOCK_K + kk
        kmask = ks < I
        base = o * N * I + ks[None, :]
    return kmask, base, nn


@triton.jit
def _scan_tile(kmask, base, n, N, I, ROW: tl.constexpr):
    # (mask, offsets) of the tile at positions n of the scanned dim
    if ROW:
        m = kmask[:, None] & (n[None, :] < N)
        offs = base + n[None, :]
    else:
        m = kmask[None, :] & (n[:, None] < N)
        offs = base + n[:, None].to(tl.int64) * I
    return m, offs


@triton.jit
def _scan_kernel(x_ptr, y_ptr, O, N, I, PROD: tl.constexpr, ACC: tl.constexpr, ROW: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, NZ: tl.constexpr = False):
    # NZ: scan the flags (x != 0) instead of x (positions for nonzero/unique)
    kmask, base, nn = _scan_lanes(O, N, I, ROW, BLOCK_K, BLOCK_N)
    AX: tl.constexpr = 1 if ROW else 0
    carry = _to_acc(tl.zeros([BLOCK_K], tl.int32), ACC) + (1 if PROD else 0)
    for n0 in range(0, N, BLOCK_N):
        m, offs = _scan_tile(kmask, base, n0 + nn, N, I, ROW)
        v = tl.load(x_ptr + offs, mask=m, other=0)
        if NZ:
            v = _nonzero(v)
        v = tl.where(m, _to_acc(v, ACC), 1 if PROD else 0)
        # the carry meets each lane: lanes are the tile's rows (AX 1) or columns (AX 0)
        if PROD:
            s = tl.cumprod(v, axis=AX) * tl.expand_dims(carry, AX)
            carry = carry * tl.reduce(v, AX, _mul)
        else:
            s = tl.cumsum(v, axis=AX) + tl.expand_dims(carry, AX)
            carry = carry + tl.sum(v, axis=AX)
        tl.store(y_ptr + offs, s.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _row_chunk(x_ptr, N, CHUNK: tl.constexpr):
    # chunk c (grid axis 1) of row r (grid axis 0) of a contiguous (rows, N):
    # (r, c, positions n, mask, x[r, n] with 0 past the row)
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    n = c * CHUNK + tl.arange(0, CHUNK)
    m = n < N
    v = tl.load(x_ptr + r * N + n, mask=m, other=0)
    return r, c, n, m, v


@triton.jit
def _scan_chunk_load(x_ptr, N, PROD: tl.constexpr, ACC: tl.constexpr, CHUNK: tl.constexpr,
                     NZ: tl.constexpr):
    # both chunked-scan passes: the chunk padded with the identity
    r, c, n, m, v = _row_chunk(x_ptr, N, CHUNK)
    if NZ:
        v = _nonzero(v)
    v = tl.where(m, _to_acc(v, ACC), 1 if PROD else 0)
    return r, c, n, m, v


@triton.jit
def _scan_chunk_total_kernel(x_ptr, t_ptr, N, NC, PROD: tl.constexpr, ACC: tl.constexpr,
                             CHUNK: tl.constexpr, NZ: tl.constexpr = False):
    # pass 1 of a chunked row scan: the total (sum or product) of chunk c of row r
    r, c, _, _, v = _scan_chunk_load(x_ptr, N, PROD, ACC, CHUNK, NZ)
    if PROD:
        t = tl.reduce(v, 0, _mul)
    else:
        t = tl.sum(v, axis=0)
    tl.store(t_ptr + r * NC + c, t)


@triton.jit
def _scan_chunk_kernel(x_ptr, ts_ptr, y_ptr, N, NC, PROD: tl.constexpr, ACC: tl.constexpr,
                       CHUNK: tl.constexpr, NZ: tl.constexpr = False):
    # pass 3: scan chunk c of row r, then fold in the inclusive scan of the chunk totals
    # up to chunk c-1 (pass 2 scanned them)
    r, c, n, m, v = _scan_chunk_load(x_ptr, N, PROD, ACC, CHUNK, NZ)
    prev = tl.load(ts_ptr + r * NC + c - 1, mask=c > 0, other=1 if PROD else 0)
    if PROD:
        s = tl.cumprod(v, axis=0) * prev
    else:
        s = tl.cumsum(v, axis=0) + prev
    tl.store(y_ptr + r * N + n, s.to(y_ptr.dtype.element_ty), mask=m)


# "chunk": a long row with few rows is scanned in chunks of this many elements by
# many programs (chunk totals -> scan of the totals -> chunk scans plus carry: 3
# launches, reading x twice) instead of one program walking the row, when the rows give
# fewer than min_programs_per_sm programs a SM.
SCAN_CONFIG = {"cuda": {"tile": 4096, "block_n": 1024, "block_k": 64, "chunk": 2048,
                        "min_programs_per_sm": 1},
               "interp": {"tile": 64, "block_n": 16, "block_k": 4, "chunk": 16,
                          "min_programs_per_sm": 2}}


@register("scan", "triton")
def scan(kind, x, dim, out, nz=False):
    # the kernel widens on load (ints/bool -> int64, fp16/bf16 -> fp32) and stores out's dtype
    x = contiguous_copy(x)
    shape = x.shape if x.ndim else (1,)
    O, N, I = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    cfg = SCAN_CONFIG[x.device.type]
    acc = _acc_code(out.dtype)
    if I == 1:
        block_n = min(_p2(N), cfg["block_n"])
        block_k = max(1, min(_p2(O), cfg["tile"] // block_n))
        grid = _cdiv(O, block_k)
        chunk = max(cfg["chunk"], _p2(_cdiv(N, 65535)))  # chunks go on grid axis 1
        if (grid < cfg["min_programs_per_sm"] * _sms(x.device) and N >= 2 * chunk
                and chunk <= 16384):
            _chunked_row_scan(kind, x, out, O, N, acc, chunk, nz)
            return
    else:
        block_k = min(_p2(I), cfg["block_k"])
        block_n = max(1, min(_p2(N), cfg["tile"] // block_k))
        grid = O * _cdiv(I, block_k)
    launch(_scan_kernel, (grid,), x, out, O, N, I, PROD=kind == "cumprod", ACC=acc, ROW=I == 1,
           BLOCK_K=block_k, BLOCK_N=block_n, NZ=nz, num_warps=4)


def _chunked_row_scan(kind, x, out, O, N, acc, chunk, nz):
    nc = _cdiv(N, chunk)
    prod = kind == "cumprod"
    nw = max(1, min(8, chunk // 256))
    totals = Tensor._empty((O, nc), _acc_dtype(acc), x.device)
    launch(_scan_chunk_total_kernel, (O, nc), x, totals, N, nc, PROD=prod, ACC=acc, CHUNK=chunk,
           NZ=nz, num_warps=nw)
    tscan = Tensor._empty((O, nc), _acc_dtype(acc), x.device)
    scan(kind, totals, 1, tscan)  # nc < 2 * chunk for any realistic row: one program a row
    launch(_scan_chunk_kernel, (O, nc), x, tscan, out, N, nc, PROD=prod, ACC=acc, CHUNK=chunk,
           NZ=nz, num_warps=nw)
