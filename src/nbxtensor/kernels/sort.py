"""sort / argsort / topk for cuda and interp (Triton).

Method. The sorted dim is moved last and made contiguous (rows of length N). Each
element becomes one int64 *packed key*: the high 32 bits are an order-preserving
signed image of the value (floats: sign-magnitude flip of the fp32 bits, NaN made the
largest, -0.0 made +0.0; ints: the value), inverted for descending; the low 32 bits
are the element's index. Packed keys are unique, so Triton's bitonic `tl.sort` (not
stable by itself) gives exactly torch's stable order: equal values keep index order.

  sort, N <= tile: one program per row sorts the row in registers (`tl.sort`).
  sort, N > tile:  tiles are sorted as above, then log2(N/tile) merge passes: each
                   element finds its place in the merged run by binary search in the
                   partner run (keys are unique, so position = own rank + count of
                   partner keys below it).
  sort, "ml" path (32-bit and narrower values, N < 2**30): tiles sorted as above, then
                   rank-merge levels (`_rank_level_kernel`): runs taken F at a time, each
                   key placed at its offset in its own run + its counts in the group's
                   other runs; the last level writes values and indices. The merge passes
                   above serve the 64-bit values (and longer rows); see
                   docs/design/reductions-and-sort.md.
  topk:            chunks of a row are reduced to their best KP = next_pow2(k)
                   candidates with `tl.topk` (bitonic top-k); candidate lists are
                   reduced again until one chunk is left; a last pass decodes indices
                   and gathers the values (fused into the select pass on the threshold
                   path). For k > 1024 topk is a sort and a slice.

Values are gathered from the input by index, so -0.0 and NaN payloads come back as
they were. int64 and float64 values do not fit a packed key: they sort as (int64 key, int64 index)
pairs with a bitonic network written here that breaks ties by index, and merge passes
that compare pairs; their topk is a sort and a slice.
"""
from __future__ import annotations

from .. import config as _config

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import dtypes as _dt
from ..dispatch import register
from ..tensor import Tensor, cached_contiguous_strides
from ..backends.launch import launch
from .reduction import contiguous_copy, _p2, _row_chunk
from ._host import cdiv as _cdiv
from ._common import device_facts


# triton.cdiv is a constexpr function: ~1.5 us a call from Python


@triton.jit
def _order_key(v, IS_FLOAT: tl.constexpr, DESC: tl.constexpr, WIDE: tl.constexpr):
    """An int32 (WIDE, for 64-bit values: int64) whose signed order is the value order (NaN
    largest), inverted if DESC."""
    FT: tl.constexpr = tl.float64 if WIDE else tl.float32
    IT: tl.constexpr = tl.int64 if WIDE else tl.int32
    if IS_FLOAT:
        f = v.to(FT)
        f = tl.where(f != f, float("nan"), f + 0.0)  # one NaN bit pattern; -0.0 -> +0.0
        b = f.to(IT, bitcast=True)
        k = tl.where(b < 0, b ^ (0x7FFFFFFFFFFFFFFF if WIDE else 0x7FFFFFFF), b)
    else:
        k = v.to(IT)
    if DESC:
        k = ~k
    return k


@triton.jit
def _pack(v, idx, IS_FLOAT: tl.constexpr, DESC: tl.constexpr, TOPK: tl.constexpr):
    k = _order_key(v, IS_FLOAT, DESC, False).to(tl.int64)
    if TOPK:  # bigger packed key = better; among equal values the lower index wins
        low = 2147483647 - idx.to(tl.int64)
    else:     # ascending packed key; equal values keep index order (stable)
        low = idx.to(tl.int64)
    return (k << 32) | low


@triton.jit
def _sort_tile_kernel(x_ptr, k_ptr, N, TILE: tl.constexpr, IS_FLOAT: tl.constexpr,
                      DESC: tl.constexpr):
    # one program per (tile, row): sort TILE packed keys of a contiguous row in registers
    t = tl.program_id(1)
    row = tl.program_id(0).to(tl.int64)
    idx = t * TILE + tl.arange(0, TILE)
    m = idx < N
    v = tl.load(x_ptr + row * N + idx, mask=m, other=0)
    key = _pack(v, idx, IS_FLOAT, DESC, False)
    key = tl.where(m, key, 9223372036854775807)  # padding sorts last
    key = tl.sort(key)
    tl.store(k_ptr + row * N + idx, key, mask=m)


@triton.jit
def _indicator(n_dims: tl.constexpr, j: tl.constexpr):
    # 0/1 along hypercube axis j (counted from the innermost), broadcastable to [2]*n_dims
    return tl.reshape(tl.arange(0, 2), [1] * (n_dims - j - 1) + [2] + [1] * j)


@triton.jit
def _cas_pairs(k, i, flip, j: tl.constexpr, n_dims: tl.constexpr):
    # compare-and-swap (key, index) pairs with their partner along innermost axis j;
    # the partner of a is a ^ xor(a, b) taken over that size-2 axis
    kp = k ^ tl.xor_sum(k, n_dims - 1 - j, True)
    ip = i ^ tl.xor_sum(i, n_dims - 1 - j, True)
    gt = (k > kp) | ((k == kp) & (i > ip))
    swap = gt != (flip ^ _indicator(n_dims, j))
    return tl.where(swap, kp, k), tl.where(swap, ip, i)


@triton.jit
def _sort_pairs_tile_kernel(x_ptr, k_ptr, i_ptr, N, TILE: tl.constexpr, LOG: tl.constexpr,
                            IS_FLOAT: tl.constexpr, DESC: tl.constexpr):
    # 64-bit values: a bitonic network over (key, index) pairs, ties broken by index (stable)
    t = tl.program_id(1)
    row = tl.program_id(0).to(tl.int64)
    idx = t * TILE + tl.arange(0, TILE)
    m = idx < N
    v = tl.load(x_ptr + row * N + idx, mask=m, other=0)
    key = tl.where(m, _order_key(v, IS_FLOAT, DESC, True), 9223372036854775807)
    ii = idx.to(tl.int64)
    k = tl.reshape(key, [2] * LOG)
    i = tl.reshape(ii, [2] * LOG)
    for stage in tl.static_range(1, LOG + 1):
        for jj in tl.static_range(stage):
            if stage < LOG:
                k, i = _cas_pairs(k, i, _indicator(LOG, stage), stage - 1 - jj, LOG)
            else:
                k, i = _cas_pairs(k, i, 0, stage - 1 - jj, LOG)
    k = tl.reshape(k, [TILE])
    i = tl.reshape(i, [TILE])
    tl.store(k_ptr + row * N + idx, k, mask=m)
    tl.store(i_ptr + row * N + idx, i, mask=m)


@triton.jit
def _merge_pass_kernel(src_ptr, dst_ptr, srci_ptr, dsti_ptr, N, L, STEPS: tl.constexpr,
                       BLOCK: tl.constexpr, PAIRS: tl.constexpr):
    # merge sorted runs of length L pairwise: each key goes to own rank + partner keys below it
    # (PAIRS: keys may repeat; (key, index) pairs are compared, and the indices move along)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = g < N
    base = src_ptr + row * N
    key = tl.load(base + g, mask=m, other=0)
    if PAIRS:
        ibase = srci_ptr + row * N
        idx = tl.load(ibase + g, mask=m, other=0)
    run = g // L
    p = g - run * L
    partner = run ^ 1
    lo = tl.minimum(partner * L, N)
    hi = tl.minimum(lo + L, N)
    start = lo
    for _ in tl.static_range(STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        km = tl.load(base + mid, mask=m & active, other=0)
        if PAIRS:
            im = tl.load(ibase + mid, mask=m & active, other=0)
            right = active & ((km < key) | ((km == key) & (im < idx)))
        else:
            right = active & (km < key)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    out = tl.minimum(run, partner) * L + p + (lo - start)
    tl.store(dst_ptr + row * N + out, key, mask=m)
    if PAIRS:
        tl.store(dsti_ptr + row * N + out, idx, mask=m)


@triton.jit
def _lower_bound(base, lo, hi, key, mask, STEPS: tl.constexpr):
    # per lane: the first place in [lo, hi) of a sorted run whose key is >= key (else hi);
    # ranges of at most 2**STEPS - 1 keys. Finished lanes load nothing (masked).
    for _ in tl.static_range(STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        km = tl.load(base + mid, mask=mask & active, other=0)
        right = active & (km < key)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    return lo


@triton.jit
def _rank_level_kernel(src_ptr, dst_ptr, x_ptr, v_ptr, i_ptr, N, I, L, TP: tl.constexpr,
                       STEPS: tl.constexpr, BLOCK: tl.constexpr, DECODE: tl.constexpr,
                       NARROW: tl.constexpr):
    # one level of a TP-way rank merge: sorted runs of L unique packed keys, taken TP at a
    # time, become sorted runs of TP*L. A key's place in its merged run = its own offset in
    # its run (known: keys are unique) + the count of keys below it in each other run of the
    # group (binary searches, all runs at once as a [BLOCK, TP] tile). DECODE (the last
    # level, one group a row): write the index and the gathered value there instead of the key.
    # NARROW (host: BLOCK divides L, so a block is consecutive keys of one run): each key's
    # count in another run lies between those of the block's first and last keys, found
    # first by two searches; the per-key searches then only span that window (about BLOCK
    # keys on random data instead of L: fewer loads a key, one search longer latency).
    row = tl.program_id(0).to(tl.int64)
    b0 = tl.program_id(1) * BLOCK
    g = b0 + tl.arange(0, BLOCK)
    m = g < N
    base = src_ptr + row * N
    key = tl.load(base + g, mask=m, other=0)
    run = g // L
    first = (run // TP) * TP                        # the group's first run
    if NARROW:
        two = tl.arange(0, 2)
        kb = tl.load(base + tl.where(two == 0, b0, tl.minimum(b0 + BLOCK, N) - 1))
        brun = b0 // L
    if TP == 2:
        # a pairwise merge: one search, in the partner run only
        start = tl.minimum((run ^ 1) * L, N)        # < N + L < 2**31 (host: N < 2**30)
        if NARROW:
            sb = tl.minimum((brun ^ 1) * L, N)
            lb = _lower_bound(base, sb + two * 0, tl.minimum(sb + L, N) + two * 0, kb,
                              two < 2, STEPS)
            lo = _lower_bound(base, g * 0 + tl.sum(tl.where(two == 0, lb, 0), axis=0),
                              g * 0 + tl.sum(tl.where(two == 1, lb, 0), axis=0), key, m, STEPS)
        else:
            lo = _lower_bound(base, start, tl.minimum(start + L, N), key, m, STEPS)
        pos = (g - run * L + first * L + lo - start).to(tl.int64)
    else:
        # runs past the row's end clamped first: r2 * L < 2 * N < 2**31 (host: N < 2**30)
        r2 = tl.minimum(first[:, None] + tl.arange(0, TP)[None, :], (N + L - 1) // L)
        start = tl.minimum(r2 * L, N)
        own = r2 == run[:, None]
        if NARROW:
            rb = tl.minimum((brun // TP) * TP + tl.arange(0, TP), (N + L - 1) // L)
            sb = tl.zeros([2, TP], dtype=tl.int32) + tl.minimum(rb * L, N)[None, :]
            lb = _lower_bound(base, sb, tl.minimum(sb + L, N), kb[:, None],
                              (two < 2)[:, None], STEPS)
            lo0 = tl.sum(tl.where((two == 0)[:, None], lb, 0), axis=0)[None, :]
            hi0 = tl.sum(tl.where((two == 1)[:, None], lb, 0), axis=0)[None, :]
        else:
            lo0 = start
            hi0 = tl.minimum(start + L, N)
        lo = tl.where(own, g[:, None], lo0)         # own run: no search, lo stays at g
        hi = tl.where(own, g[:, None], hi0)
        lo = _lower_bound(base, lo, hi, key[:, None], m[:, None], STEPS)
        pos = (first * L + tl.sum(lo - start, axis=1)).to(tl.int64)
    if DECODE:
        idx = key & 0xFFFFFFFF
        val = tl.load(x_ptr + row * N + idx, mask=m, other=0)
        obase = (row // I) * N * I + (row % I)
        tl.store(i_ptr + obase + pos * I, idx, mask=m)
        tl.store(v_ptr + obase + pos * I, val, mask=m)
    else:
        tl.store(dst_ptr + row * N + pos, key, mask=m)


@triton.jit
def _topk_chunk_kernel(src_ptr, dst_ptr, N, NC, KP: tl.constexpr, CHUNK: tl.constexpr,
                       FROM_KEYS: tl.constexpr, IS_FLOAT: tl.constexpr, DESC: tl.constexpr):
    # the best KP packed keys of one CHUNK of a row -> dst[row, chunk*KP : (chunk+1)*KP]
    c = tl.program_id(1)
    row = tl.program_id(0).to(tl.int64)
    idx = c * CHUNK + tl.arange(0, CHUNK)
    m = idx < N
    if FROM_KEYS:
        key = tl.load(src_ptr + row * N + idx, mask=m, other=-9223372036854775807 - 1)
    else:
        v = tl.load(src_ptr + row * N + idx, mask=m, other=0)
        key = _pack(v, idx, IS_FLOAT, DESC, True)
        key = tl.where(m, key, -9223372036854775807 - 1)
    best = tl.topk(key, KP)
    tl.store(dst_ptr + row * (NC * KP) + c * KP + tl.arange(0, KP), best)


@triton.jit
def _decode_kernel(k_ptr, ki_ptr, x_ptr, v_ptr, i_ptr, NK, N, K, I, TOPK: tl.constexpr,
                   PAIRS: tl.constexpr, BLOCK: tl.constexpr):
    # packed keys (row-major, NK per row) -> indices and gathered values for the first K,
    # written into the output's row (o, i): base o*K*I + i, element stride I
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = j < K
    if PAIRS:
        idx = tl.load(ki_ptr + row * NK + j, mask=m, other=0)
    else:
        key = tl.load(k_ptr + row * NK + j, mask=m, other=0)
        low = key & 0xFFFFFFFF
        if TOPK:
            idx = 2147483647 - low
        else:
            idx = low
    val = tl.load(x_ptr + row * N + idx, mask=m, other=0)
    obase = (row // I) * K * I + (row % I)
    tl.store(i_ptr + obase + j * I, idx, mask=m)
    tl.store(v_ptr + obase + j * I, val, mask=m)


# topk by threshold (long rows, small k): the k-th best of the chunk maxima is a key T that
# at least k elements reach, so the top k are all >= T; only those few candidates are
# compacted and selected. Packed keys are unique, so ties cannot blur the cut.
@triton.jit
def _topk_cmax_kernel(x_ptr, cmax_ptr, N, NC, CHUNK: tl.constexpr, IS_FLOAT: tl.constexpr,
                      DESC: tl.constexpr):
    # pass A: the best packed key of each chunk
    row, c, idx, m, v = _row_chunk(x_ptr, N, CHUNK)
    key = tl.where(m, _pack(v, idx, IS_FLOAT, DESC, True), -9223372036854775807 - 1)
    tl.store(cmax_ptr + row * NC + c, tl.max(key, axis=0))


@triton.jit
def _topk_thresh_kernel(cmax_ptr, t_ptr, cnt_ptr, NC, K, KP: tl.constexpr, NCP: tl.constexpr):
    # pass B: T = the K-th best chunk maximum of the row; zero the row's candidate count
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, NCP)
    key = tl.load(cmax_ptr + row * NC + j, mask=j < NC, other=-9223372036854775807 - 1)
    best = tl.topk(key, KP)  # sorted, best first
    t = tl.sum(tl.where(tl.arange(0, KP) == K - 1, best, 0), axis=0)
    tl.store(t_ptr + row, t)
    tl.store(cnt_ptr + row, 0)


@triton.jit
def _topk_filter_kernel(x_ptr, t_ptr, cnt_ptr, cand_ptr, N, CHUNK: tl.constexpr,
                        IS_FLOAT: tl.constexpr, DESC: tl.constexpr):
    # pass C: append this chunk's keys >= T to the row's candidate list (order irrelevant)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    idx = c * CHUNK + tl.arange(0, CHUNK)
    m = idx < N
    v = tl.load(x_ptr + row * N + idx, mask=m, other=0)
    key = _pack(v, idx, IS_FLOAT, DESC, True)
    t = tl.load(t_ptr + row)
    sel = m & (key >= t)
    n = tl.sum(sel.to(tl.int32), axis=0)
    if n > 0:
        base = tl.atomic_add(cnt_ptr + row, n)
        pos = base + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.store(cand_ptr + row * N + pos, key, mask=sel)


@triton.jit
def _topk_select_kernel(cand_ptr, cnt_ptr, x_ptr, v_ptr, i_ptr, N, K, I, KP: tl.constexpr,
                        BLOCK: tl.constexpr):
    # pass D: the best KP of the row's candidates (usually one block of them), decoded:
    # the first K indices and their values gathered from the input, written into the
    # output's row (o, i): base o*K*I + i, element stride I (the decode pass, fused)
    row = tl.program_id(0).to(tl.int64)
    n = tl.load(cnt_ptr + row)
    best = tl.full([KP], -9223372036854775807 - 1, tl.int64)
    for b0 in range(0, n, BLOCK):
        j = b0 + tl.arange(0, BLOCK)
        key = tl.load(cand_ptr + row * N + j, mask=j < n, other=-9223372036854775807 - 1)
        best = tl.topk(tl.cat(best, tl.topk(key, KP), can_reorder=True), KP)
    j = tl.arange(0, KP)
    m = j < K
    idx = 2147483647 - (best & 0xFFFFFFFF)
    val = tl.load(x_ptr + row * N + idx, mask=m, other=0)
    obase = (row // I) * K * I + (row % I)
    tl.store(i_ptr + obase + j * I, idx, mask=m)
    tl.store(v_ptr + obase + j * I, val, mask=m)


# ------------------------------------------------------------------ launch configuration
# topk_programs: the first topk round cuts rows into chunks smaller than topk_chunk (down to
# 2*KP) until there are about this many programs, so one long row still fills the GPU;
# later rounds (few candidates) use topk_chunk. topk_ept: keys per thread in a candidate
# pass (num_warps = chunk / (32 * topk_ept), 1..8): more keys per thread trade barriers
# and shared-memory exchanges for shuffles.
# Threshold path (_topk_cmax/_thresh/_filter/_select) for N >= filt_min_n and
# k <= filt_max_kp: chunks of filt_chunk elements, smaller if that leaves fewer than
# filt_ratio*KP chunk maxima (more maxima = a tighter threshold = fewer candidates);
# candidates are selected filt_block at a time. A huge filt_min_n switches it off.
# rank_small_grid: below this many tiles (rows x rank_tile tiles) the GPU is not full, and
# the "ml" path takes ml_small, the Gluon routing keeps long rows on the ml path.
# Program counts that fill a GPU are given per SM on cuda (`topk_programs_per_sm`,
# `rank_small_grid_per_sm`: times the device's SM count, kernels/_common.device_facts;
# `_programs`); interp's are written out (the interpreter runs programs one by one), as a
# config may fix any of them (`topk_programs`, `rank_small_grid`).
CONFIG = {"cuda": {"sort_tile": 4096, "topk_chunk": 4096, "topk_programs_per_sm": 2,
                   "topk_ept": 16, "merge_block": 1024, "max_kp": 1024,
                   "filt_min_n": 8192, "filt_max_kp": 128, "filt_chunk": 1024,
                   "filt_ratio": 2, "filt_block": 1024, "rank_tile": 1024,
                   "rank_small_grid_per_sm": 1,
                   # the "ml" path: tile sort + rank-merge levels (_sort_ml; ml_small /
                   # ml_big = (tile, fan-in, max runs of the last level, keys a program
                   # at fan-in <= 8, NARROW searches 0/1)). It replaced a rank pass over
                   # <= 32 tiles, else merge passes: H200 (bench_reduction.py --sort-sweep2,
                   # torch time / ours): (1,32000) 2.0x, (1,128256) 1.06x on ml_small;
                   # (4,128256) 1.00-1.03x, (32,32000) 1.02-1.03x on ml_big; the rank pass
                   # 0.44x / 0.59x on the last two (its kernel is in the git history). Tiles
                   # of 2048 are sorted by the Gluon kernel (ml_gluon below).
                   "ml_small": (2048, 8, 32, 128, 0), "ml_big": (2048, 2, 2, 256, 0),
                   # Gluon block sort (kernels/sort_gluon.py): rows of
                   # block_sort_min_n..block_sort_max_n keys (32-bit or narrower) sorted by one
                   # program a row, (keys a thread, warps, S steps a shared-memory round) =
                   # block_sort_rws -- rows longer than block_sort_few_max_n only when the GPU
                   # is full (rows x rank_tile tiles >= rank_small_grid; few long rows sort
                   # faster as more, shorter tiles); ml_gluon = (R, warps, S) makes it the
                   # "ml" path's tile sort (0 = tl.sort). NBX_GLUON_SORT=0 (read at import)
                   # turns both off. H200 (bench_reduction.py --quick
                   # --sort-sweep2 --gluon-only, torch time / ours): whole rows (16, 8, 2)
                   # (128,4096) 1.26x (was 0.62x), (512,1024) 1.89x, (64,2048) 2.21x; ml with
                   # Gluon 2048-key tiles (8, 8, 2): (4,4096) 1.81x, (1,32000) 2.58x, (1,128256)
                   # 1.36x, (4,128256) 1.31x, (32,32000) 1.48x, (1,1048576) 0.53x (was 0.44x).
                   "block_sort_min_n": 1, "block_sort_max_n": 4096, "block_sort_few_max_n": 2048,
                   "block_sort_rws": (16, 8, 2), "ml_gluon": (8, 8, 2)},
          "interp": {"sort_tile": 16, "topk_chunk": 32, "topk_programs": 8,
                     "topk_ept": 16, "merge_block": 32, "max_kp": 1024,
                     "filt_min_n": 64, "filt_max_kp": 8, "filt_chunk": 8, "filt_ratio": 4,
                     "filt_block": 16, "rank_tile": 16, "rank_small_grid": 8,
                     "ml_small": (16, 2, 4, 16, 1), "ml_big": (16, 4, 2, 16, 0)}}


def _programs(cfg, name, device):
    """The program count `name` of cfg: cfg[name] where the config fixes it, else
    cfg[name + "_per_sm"] programs a SM of `device`."""
    n = cfg.get(name)
    return n if n is not None else cfg[name + "_per_sm"] * device_facts(device).sms


def _grid(rows, per_row):
    # rows on grid axis 0 (2^31-1); the per-row blocks on axis 1, which CUDA caps at 65535
    if per_row > 65535:
        raise NotImplementedError(f"sort/topk: a row of this length needs {per_row} blocks, "
                                  f"more than the 65535 one grid axis allows")
    return (rows, per_row)


def _rows(x: Tensor, dim: int):
    """The input as contiguous rows (M, N) with the sorted dim last, and I (the product of
    the dims after `dim`, which maps a row back to the output's layout)."""
    shape = x._shape
    if dim == len(shape) - 1 and x._stride == cached_contiguous_strides(shape):
        n = shape[dim]   # the common case (a contiguous row-major input sorted on its last dim)
        return x, (x.numel() // n if n else 0), n, 1
    shape = x.shape if x.ndim else (1,)
    n = shape[dim]
    inner = 1
    for s in shape[dim + 1:]:
        inner *= s
    order = [d for d in range(x.ndim) if d != dim] + [dim]
    xr = contiguous_copy(x.permute(order) if x.ndim else x.reshape(1))
    return xr, xr.numel() // n, n, inner


def _sorted_keys(xr, M, N, desc):
    """Sorted keys of each row: (packed int64 keys, None) for values up to 32 bits, or
    (int64 keys, int64 indices) for 64-bit values."""
    cfg = CONFIG[xr.device.type]
    pairs = xr.dtype.itemsize == 8
    tile = min(_p2(N), cfg["sort_tile"] // (2 if pairs else 1))
    tile = max(tile, 2)
    keys = Tensor._empty((M, N), _dt.int64, xr.device)
    idx = Tensor._empty((M, N), _dt.int64, xr.device) if pairs else None
    isf = xr.dtype.is_floating_point
    nw = 16 if tile >= 8192 else (8 if tile >= 2048 else 4)
    if pairs:
        launch(_sort_pairs_tile_kernel, _grid(M, _cdiv(N, tile)), xr, keys, idx, N,
               TILE=tile, LOG=tile.bit_length() - 1, IS_FLOAT=isf, DESC=desc, num_warps=nw)
    else:
        launch(_sort_tile_kernel, _grid(M, _cdiv(N, tile)), xr, keys, N, TILE=tile,
               IS_FLOAT=isf, DESC=desc, num_warps=nw)
    L = tile
    if L < N:
        other = Tensor._empty((M, N), _dt.int64, xr.device)
        other_i = Tensor._empty((M, N), _dt.int64, xr.device) if pairs else None
        blk = cfg["merge_block"]
        while L < N:
            launch(_merge_pass_kernel, _grid(M, _cdiv(N, blk)), keys, other,
                   idx if pairs else keys, other_i if pairs else other, N, L,
                   STEPS=L.bit_length() + 1, BLOCK=blk, PAIRS=pairs, num_warps=4)
            keys, other = other, keys
            if pairs:
                idx, other_i = other_i, idx
            L *= 2
    return keys, idx


def _decode(sk, xr, values, indices, NK, N, K, inner, topk):
    keys, idx = sk
    M = xr.numel() // N
    blk = min(_p2(K), 1024)
    launch(_decode_kernel, _grid(M, _cdiv(K, blk)), keys,
           idx if idx is not None else keys, xr, values, indices, NK, N, K, inner, TOPK=topk,
           PAIRS=idx is not None, BLOCK=blk, num_warps=4)


def _sort_ml(xr, M, N, descending, values, indices, inner, cfg):
    """Rows of 32-bit-or-narrower values: sort tiles in registers, then rank-merge levels of
    fan-in `fanin` until at most `final` runs are left, and one last rank level that writes
    values and indices (launches: 1 + levels). Few rows (rows x tiles below the SM count)
    take CONFIG ml_small, many rows ml_big: a wide last level costs (runs - 1) searches per
    key, fine when latency dominates, too much work when the GPU is full."""
    tile, fanin, final, block, narrow = cfg["ml_small"]
    tile = max(min(_p2(N), tile), 2)
    if M * _cdiv(N, tile) >= _programs(cfg, "rank_small_grid", xr.device):
        tile, fanin, final, block, narrow = cfg["ml_big"]
        tile = max(min(_p2(N), tile), 2)
    runs = _cdiv(N, tile)
    keys = Tensor._empty((M, N), _dt.int64, xr.device)
    if not _gluon_tiles(xr, M, N, tile, descending, keys, cfg):
        launch(_sort_tile_kernel, _grid(M, runs), xr, keys, N, TILE=tile,
               IS_FLOAT=xr.dtype.is_floating_point, DESC=descending,
               num_warps=16 if tile >= 8192 else (8 if tile >= 2048 else 4))
    if runs == 1:
        _decode((keys, None), xr, values, indices, N, N, N, inner, False)
        return
    other = None
    L = tile
    while True:
        last = runs <= final
        tp = _p2(runs) if last else fanin
        # a [BLOCK, TP] tile of searches: fewer keys a program for wide levels (registers)
        blk = block if tp <= 8 else max(16, block * 16 // tp)
        if not last and other is None:
            other = Tensor._empty((M, N), _dt.int64, xr.device)
        launch(_rank_level_kernel, _grid(M, _cdiv(N, blk)), keys, keys if last else other,
               xr, values, indices, N, inner, L, TP=tp, STEPS=L.bit_length(), BLOCK=blk,
               DECODE=last, NARROW=narrow and blk <= L, num_warps=4)
        if last:
            return
        keys, other = other, keys
        L *= tp
        runs = _cdiv(runs, tp)


# the Gluon block sort (kernels/sort_gluon.py): cuda only (Gluon has no interpreter)
GLUON_SORT = _config.get("NBX_GLUON_SORT")


def _gluon_rows(xr, M, N, cfg):
    """Whether sort sends these M rows of N keys to the Gluon block sort (one program a row):
    N in block_sort_min_n..block_sort_max_n, and beyond block_sort_few_max_n only when the
    rows fill the GPU (M x tiles of rank_tile >= rank_small_grid, the "ml" path's regime
    test); fewer long rows sort faster on the ml path (more, shorter tiles)."""
    if not (GLUON_SORT and xr.device.type == "cuda" and xr.dtype.itemsize < 8
            and max(1, cfg.get("block_sort_min_n", 1)) <= N <= cfg.get("block_sort_max_n", 0)):
        return False
    return (N <= cfg.get("block_sort_few_max_n", N)
            or M * _cdiv(N, cfg["rank_tile"]) >= _programs(cfg, "rank_small_grid", xr.device))


def _gluon_tiles(xr, M, N, tile, descending, keys, cfg):
    """The "ml" path's tile sort by the Gluon kernel when CONFIG ml_gluon = (R, warps, S) is set
    (and the tile fits: 32 * R <= tile <= 8192); False: the caller sorts with tl.sort."""
    rw = cfg.get("ml_gluon", 0)
    if not (GLUON_SORT and rw and xr.device.type == "cuda"):
        return False
    from . import sort_gluon as G
    if not 32 * rw[0] <= tile <= G.MAX_NP:
        return False
    G.sort_rows(xr, M, N, descending, None, None, 1, rw, keys=keys, tile=tile)
    return True


@register("sort", "triton")
def sort(x, dim, descending, values, indices):
    xr, M, N, inner = _rows(x, dim)
    cfg = CONFIG[xr.device.type]
    if _gluon_rows(xr, M, N, cfg):
        from . import sort_gluon as G
        G.sort_rows(xr, M, N, descending, values, indices, inner, cfg["block_sort_rws"])
        return
    if xr.dtype.itemsize < 8 and 0 < N < 2**30:
        # N < 2**30: int32 offsets in the rank levels
        _sort_ml(xr, M, N, descending, values, indices, inner, cfg)
        return
    keys = _sorted_keys(xr, M, N, descending)
    _decode(keys, xr, values, indices, N, N, N, inner, False)


@register("topk", "triton")
def topk(x, k, dim, largest, values, indices):
    xr, M, N, inner = _rows(x, dim)
    cfg = CONFIG[xr.device.type]
    kp = max(_p2(k), 2)  # tl.topk needs k >= 2 (k=1 collapses to a scalar)
    if kp > cfg["max_kp"] or xr.dtype.itemsize == 8:  # 64-bit values: no room to pack
        keys = _sorted_keys(xr, M, N, largest)
        _decode(keys, xr, values, indices, N, N, k, inner, False)
        return
    if N >= cfg["filt_min_n"] and kp <= cfg["filt_max_kp"] and M * N < 2 ** 31:
        c = min(cfg["filt_chunk"], 1 << max(0, (N // (cfg["filt_ratio"] * kp)).bit_length() - 1))
        nc = _cdiv(N, c)
        if c >= 2 and k <= nc <= 4096:  # pass B holds all chunk maxima of a row (<= 32 KiB)
            _topk_threshold(xr, M, N, k, kp, c, nc, largest, values, indices, inner, cfg)
            return
    # a chunk holds at least 2*KP keys, so each candidate round at least halves the list
    chunk = max(2 * kp, min(_p2(N), cfg["topk_chunk"],
                            _p2(_cdiv(M * N, _programs(cfg, "topk_programs", xr.device)))))
    isf = xr.dtype.is_floating_point
    src, n, from_keys = xr, N, False
    while True:
        nc = _cdiv(n, chunk)
        cand = Tensor._empty((M, nc * kp), _dt.int64, xr.device)
        launch(_topk_chunk_kernel, _grid(M, nc), src, cand, n, nc, KP=kp, CHUNK=chunk,
               FROM_KEYS=from_keys, IS_FLOAT=isf, DESC=not largest,
               num_warps=max(1, min(8, chunk // (32 * cfg["topk_ept"]))))
        src, n, from_keys = cand, nc * kp, True
        if nc == 1:
            break
        chunk = max(2 * kp, min(_p2(n), cfg["topk_chunk"]))
    _decode((src, None), xr, values, indices, n, N, k, inner, True)


def _topk_threshold(xr, M, N, k, kp, c, nc, largest, values, indices, inner, cfg):
    isf = xr.dtype.is_floating_point
    dev = xr.device
    # one int64 workspace for cand (M, N), cmax (M, nc), t (M,) and cnt (M,) int32: one
    # allocation instead of four (each costs ~3 us of host time); regions start 16-byte aligned
    even = lambda n: n + (n & 1)  # noqa: E731
    o_cmax = even(M * N)
    o_t = o_cmax + even(M * nc)
    o_cnt = o_t + even(M)
    ws = Tensor._empty((o_cnt + even(-(-M // 2)),), _dt.int64, dev)._storage
    cand = Tensor._make(ws, (M, N), (N, 1), 0, _dt.int64)  # worst case (sorted rows): whole chunks
    cmax = Tensor._make(ws, (M, nc), (nc, 1), o_cmax, _dt.int64)
    t = Tensor._make(ws, (M,), (1,), o_t, _dt.int64)
    cnt = Tensor._make(ws, (M,), (1,), 2 * o_cnt, _dt.int32)
    launch(_topk_cmax_kernel, _grid(M, nc), xr, cmax, N, nc, CHUNK=c, IS_FLOAT=isf,
           DESC=not largest, num_warps=max(1, min(4, c // 256)))
    ncp = max(_p2(nc), kp)
    launch(_topk_thresh_kernel, (M,), cmax, t, cnt, nc, k, KP=kp, NCP=ncp,
           num_warps=max(1, min(8, ncp // 256)))
    launch(_topk_filter_kernel, _grid(M, nc), xr, t, cnt, cand, N, CHUNK=c, IS_FLOAT=isf,
           DESC=not largest, num_warps=max(1, min(4, c // 256)))
    blk = max(cfg["filt_block"], kp)
    launch(_topk_select_kernel, (M,), cand, cnt, xr, values, indices, N, k, inner, KP=kp,
           BLOCK=blk, num_warps=max(1, min(8, blk // 256)))


# ------------------------------------------------------------------ nonzero, unique
# Count, then fill: an inclusive scan of the flags gives every selected element its output
# row; the scan's last entry (one device->host read) sizes the output.
@triton.jit
def _nonzero_fill_kernel(x_ptr, cs_ptr, sizes_ptr, out_ptr, n, NDIM: tl.constexpr,
                         BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    sel = m & (tl.load(x_ptr + i, mask=m, other=0) != 0)
    row = tl.load(cs_ptr + i, mask=m, other=1) - 1
    rem = i
    for d in tl.static_range(NDIM - 1, -1, -1):  # unravel, last dim first
        size = tl.load(sizes_ptr + d)
        tl.store(out_ptr + row * NDIM + d, rem % size, mask=sel)
        rem = rem // size


@triton.jit
def _unique_flags_kernel(s_ptr, f_ptr, n, BLOCK: tl.constexpr):
    # f[i] = 1 where a run of equal sorted values starts (NaN != NaN: each NaN is its own run)
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    cur = tl.load(s_ptr + i, mask=m, other=0)
    prev = tl.load(s_ptr + i - 1, mask=m & (i > 0), other=0)
    tl.store(f_ptr + i, ((i == 0) | (cur != prev)).to(tl.int64), mask=m)


@triton.jit
def _unique_fill_kernel(s_ptr, f_ptr, cs_ptr, perm_ptr, vals_ptr, inv_ptr, starts_ptr, n,
                        BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    g = tl.load(cs_ptr + i, mask=m, other=1) - 1
    first = m & (tl.load(f_ptr + i, mask=m, other=0) != 0)
    tl.store(vals_ptr + g, tl.load(s_ptr + i, mask=m, other=0), mask=first)
    tl.store(starts_ptr + g, i, mask=first)
    tl.store(inv_ptr + tl.load(perm_ptr + i, mask=m, other=0), g, mask=m)


@triton.jit
def _unique_counts_kernel(starts_ptr, counts_ptr, u, n, BLOCK: tl.constexpr):
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = j < u
    nxt = tl.load(starts_ptr + j + 1, mask=m & (j + 1 < u), other=n)
    tl.store(counts_ptr + j, nxt - tl.load(starts_ptr + j, mask=m, other=0), mask=m)


def _inclusive_flags_scan(x_flat, nz):
    from .reduction import scan
    cs = Tensor._empty(x_flat.shape, _dt.int64, x_flat.device)
    scan("cumsum", x_flat, 0, cs, nz=nz)
    return cs


@register("nonzero", "triton")
def nonzero(x):
    ndim = x.ndim
    n = x.numel()
    if n == 0:
        return Tensor._empty((0, ndim), _dt.int64, x.device)
    xf = contiguous_copy(x).reshape(-1)
    cs = _inclusive_flags_scan(xf, True)
    count = int(cs[n - 1].item())  # the one host sync: the output's size
    out = Tensor._empty((count, ndim), _dt.int64, x.device)
    if count and ndim:
        from ..creation import tensor
        sizes = tensor(list(x.shape), dtype=_dt.int64, device=x.device)
        blk = 1024
        launch(_nonzero_fill_kernel, (_cdiv(n, blk),), xf, cs, sizes, out, n, NDIM=ndim,
               BLOCK=blk, num_warps=4)
    return out


@register("unique", "triton")
def unique(x, return_inverse, return_counts):
    n = x.numel()
    if n == 0:
        e = Tensor._empty((0,), x.dtype, x.device)
        return e, Tensor._empty((0,), _dt.int64, x.device), Tensor._empty((0,), _dt.int64, x.device)
    xr, _, _, _ = _rows(x.reshape(-1), 0)
    s = Tensor._empty((n,), x.dtype, x.device)
    perm = Tensor._empty((n,), _dt.int64, x.device)
    keys = _sorted_keys(xr, 1, n, False)
    _decode(keys, xr, s, perm, n, n, n, 1, False)
    blk = 1024
    grid = (_cdiv(n, blk),)
    f = Tensor._empty((n,), _dt.int64, x.device)
    launch(_unique_flags_kernel, grid, s, f, n, BLOCK=blk, num_warps=4)
    cs = _inclusive_flags_scan(f, False)
    u = int(cs[n - 1].item())  # the one host sync: the number of unique values
    vals = Tensor._empty((u,), x.dtype, x.device)
    inv = Tensor._empty((n,), _dt.int64, x.device)
    starts = Tensor._empty((u,), _dt.int64, x.device)
    launch(_unique_fill_kernel, grid, s, f, cs, perm, vals, inv, starts, n, BLOCK=blk,
           num_warps=4)
    counts = Tensor._empty((u,), _dt.int64, x.device)
    launch(_unique_counts_kernel, (_cdiv(u, blk),), starts, counts, u, n, BLOCK=blk,
           num_warps=4)
    return vals, inv, counts
