"""A block bitonic sort in Gluon for rows of <= 8192 keys on Hopper.

One program sorts one tile of NP = next pow2 keys (a whole row, or one tile of the "ml" path)
in shared memory + registers, with the packed int64 keys of kernels/sort.py (`_order_key`: the
same order-preserving value key, NaN largest, -0.0 as +0.0, inverted for descending; low 32
bits = the element's index in the row). Packed keys are unique, so the unstable bitonic
network gives torch's stable order; padding (positions >= N) = INT64_MAX sorts last.

Schedule (`stages`, emulated in NumPy by tests/ops/test_sort_gluon.py): the standard bitonic
sort, phases k = 2, 4, .., NP, each with steps j = k/2, .., 1; the pair (i, i ^ j) (i with
bit j clear) is put in ascending order when bit k of i is clear, descending otherwise (the
last phase, k = NP, is all ascending). Each thread holds R consecutive keys in registers
(the [NP/R, R] tile layout), so every step with j < R is a register compare-and-swap
(reshape to [.., 2, j] / split / join). Steps with j >= R go through shared memory, S of them
a round (`rounds`): the tile is stored once per phase, transposed ([R, NP/R]: a warp's store
of one register is 32 consecutive keys, no bank conflicts); a round loads each group of 2**S
keys its steps touch into one thread (a buffer seen as [R*NP/(2j), 2, .., 2, jl/R]), does the
S compare-and-swap steps in registers, stores the group into the other buffer (ping-pong: the
compiler's barrier pass then adds no barrier of its own), one barrier; the phase's j < R tail
then runs in registers again. NP = 4096, R = 8: 78 steps, 45 of them on shared memory: 45
rounds (S = 1) or 25 (S = 2) of 32 KiB loaded + stored, + 9 tile stores/loads; barriers =
rounds + 9. sm_90 SASS (f32, 4096 keys, R 8, 8 warps, S 2): 11.3 warp instructions a key
(tl.sort's 4096-key tile, 8 warps: 19.8), 61 registers, no spills.

Every layout covers its shape without replicated threads (the host picks NP >= 32 * warps *
R): a replicated thread could re-load a pair after another copy stored it, a race.
No interpreter: Gluon kernels run on cuda only (the routing in kernels/sort.py).
"""
from __future__ import annotations

from ._triton import gluon, gl  # Triton, or its stand-in without Triton

from ..backends.launch import launch
from ._host import cdiv
from .sort import _grid, _order_key

# the same key rule as the Triton paths (one source: kernels/sort.py `_order_key`)
_gkey = gluon.jit(_order_key.fn)

# keys a thread R and warps the kernel takes; SWEEP: the (R, warps, S = steps a shared-memory
# round) variants bench_reduction.py --sort-sweep2 times (2**(S+1) <= R)
RS = (4, 8, 16)
WARPS = (4, 8, 16)
SWEEP = [(4, 8, 1), (4, 16, 1), (8, 4, 1), (8, 8, 1), (8, 16, 1), (8, 4, 2), (8, 8, 2),
         (8, 16, 2), (16, 4, 1), (16, 8, 1), (16, 4, 2), (16, 8, 2), (16, 4, 3), (16, 8, 3)]
MAX_NP = 8192          # two 64 KiB int64 tiles in shared memory (within sm_90's opt-in limit)


def stages(NP, R):
    """The kernel's schedule as (k, j, "reg" | "smem") tuples, in order (for the tests)."""
    out = []
    k = 2
    while k <= NP:
        j = k // 2
        while j >= 1:
            out.append((k, j, "reg" if j < R else "smem"))
            j //= 2
        k *= 2
    return out


def rounds(NP, R, S):
    """The shared-memory rounds as (k, j, s) tuples, in order: phase k's steps j = k/2 .. R
    taken S at a time from the top (a round does steps j, j/2, .., j/2**(s-1))."""
    out = []
    k = 2 * R
    while k <= NP:
        j = k // 2
        while j >= R:
            s = min(S, (j // R).bit_length())
            out.append((k, j, s))
            j >>= s
        k *= 2
    return out


def plan(N, R, warps):
    """(NP, R, warps) the host launches for rows of N keys: R <= NP, NP >= 32 * warps * R (every
    layout covers its tile without replicated threads), warps reduced for short rows."""
    np_ = 1
    while np_ < N:
        np_ *= 2
    np_ = max(np_, 32 * R)
    w = max(1, min(warps, np_ // (32 * R)))
    return np_, R, w


@gluon.constexpr_function
def _tile_layout(R, W, T):
    # thread t of warp w holds keys (32 w + t) * R .. + R - 1 of a [NP/R, R] tile
    # (T: the same layout of its transpose, [R, NP/R])
    if T:
        return gl.BlockedLayout([R, 1], [1, 32], [1, W], [0, 1])
    return gl.BlockedLayout([1, R], [32, 1], [W, 1], [1, 0])


@gluon.constexpr_function
def _round_layout(rows, s, cols, W):
    # the [rows, 2, .., 2, cols] keys of one shared-memory round (s axes of 2: the bits the
    # round's steps flip), all 2**s keys of a group in one thread, covered exactly (host:
    # NP >= 32 * warps * R and 2**(s+1) <= R): 16-byte vectors along the row, lanes then
    # warps along the row when rows are few
    v = min(2, cols)
    t1 = min(32, cols // v)
    t0 = 32 // t1
    w0 = min(W, max(1, rows // t0))
    if t0 * w0 > rows or v * t1 * (W // w0) > cols:
        raise ValueError(f"sort_gluon: a [{rows}, {2 ** s}, {cols}] round would replicate "
                         f"threads ({W} warps); the host must pick NP >= 32 * warps * R")
    return gl.BlockedLayout([1] + [2] * s + [v], [t0] + [1] * s + [t1],
                            [w0] + [1] * s + [W // w0], list(range(s + 1, -1, -1)))


@gluon.constexpr_function
def _row_layout(L, rank):
    # the layout of a [rows] arange that expand_dims(.., 1), (.., 2), .. takes to L
    for d in range(rank - 1, 0, -1):
        L = gl.SliceLayout(d, L)
    return L


@gluon.constexpr_function
def _round_shape(Q, s, J):
    return [Q] + [2] * s + [J]


@gluon.constexpr_function
def _to_last(rank, axis):
    # a permutation that moves `axis` last (the others keep their order); it is its own
    # inverse's mirror: _from_last undoes it
    return [d for d in range(rank) if d != axis] + [axis]


@gluon.constexpr_function
def _from_last(rank, axis):
    p = [d for d in range(rank) if d != axis] + [axis]
    return [p.index(d) for d in range(rank)]


@gluon.constexpr_function
def _pow2(e):
    return 1 << e


@gluon.constexpr_function
def _div(a, b):
    return a // b


@gluon.jit
def _cas(a, b, up):
    # `up` puts the pair in ascending order. Keys are unique (padding keys are equal, and
    # swapping equal keys changes nothing), so one compare decides: swap when a > b going up,
    # a < b going down (sm_90: 2 ISETP + 4 SEL a pair; min/max then two selects took 11)
    swap = (a > b) == up
    return gl.where(swap, b, a), gl.where(swap, a, b)


@gluon.jit
def _reg_step(x, pos, k: gl.constexpr, j: gl.constexpr, NP: gl.constexpr, R: gl.constexpr,
              XL: gl.constexpr):
    # pairs (i, i ^ j), j < R: both keys in one thread's R consecutive registers
    G: gl.constexpr = _div(R, 2 * j)
    ROWS: gl.constexpr = _div(NP, R)
    a, b = gl.split(gl.permute(gl.reshape(x, [ROWS, G, 2, j]), [0, 1, 3, 2]))
    pa, pb = gl.split(gl.permute(gl.reshape(pos, [ROWS, G, 2, j]), [0, 1, 3, 2]))
    a, b = _cas(a, b, (pa & k) == 0)
    y = gl.reshape(gl.permute(gl.join(a, b), [0, 1, 3, 2]), [ROWS, R])
    return gl.convert_layout(y, XL, assert_trivial=True)


@gluon.jit
def _smem_round(src, dst, k: gl.constexpr, j: gl.constexpr, s: gl.constexpr, NP: gl.constexpr,
                R: gl.constexpr, W: gl.constexpr):
    # steps j, j/2, .., j/2**(s-1) (all >= R) of phase k in one round trip. Key i = t*R + c
    # (thread-row t, register c) lives at c*(NP/R) + t of the [R, NP/R] buffers; with
    # jl = j/2**(s-1), t = r*(2j/R) + h*(jl/R) + m (h < 2**s: the bits the steps flip), so a
    # buffer seen as [R*ROWS, 2, .., 2, jl/R] (row q = c*ROWS + r) holds each group of 2**s
    # keys in one thread; axis 1 + u is step u's pair bit (distance j/2**u).
    # Read from src, written to dst (ping-pong: no write-after-read on one buffer, so the
    # compiler's barrier pass adds none; one load and one store: two stores into one buffer
    # would get a barrier between them); the barrier orders the rounds.
    ROWS: gl.constexpr = _div(NP, 2 * j)
    Q: gl.constexpr = R * ROWS
    J: gl.constexpr = _div(j, R * _pow2(s - 1))
    RANK: gl.constexpr = s + 2
    PL: gl.constexpr = _round_layout(Q, s, J, W)
    SHAPE: gl.constexpr = _round_shape(Q, s, J)
    y = src.reshape(SHAPE).load(PL)
    # the direction is one bit of r for every step of the round (k >= 2j): the same mask
    q = gl.arange(0, Q, layout=_row_layout(PL, RANK))
    for d in gl.static_range(1, RANK):
        q = gl.expand_dims(q, d)
    q = q + gl.full(SHAPE, 0, gl.int32, PL)     # every key's row: split along with y
    up = (q & _smem_dir_mask(k, j, ROWS)) == 0
    for u in gl.static_range(s):
        a, b = gl.split(gl.permute(y, _to_last(RANK, 1 + u).value))
        ua, ub = gl.split(gl.permute(up, _to_last(RANK, 1 + u).value))
        a, b = _cas(a, b, ua)
        y = gl.permute(gl.join(a, b), _from_last(RANK, 1 + u).value)
    dst.reshape(SHAPE).store(y)
    gl.thread_barrier()


@gluon.constexpr_function
def _smem_dir_mask(k, j, rows):
    # a shared-memory step's pair of row q = c*rows + r holds key i = r*2j + (< 2j), so bit k
    # of i (k >= 2j) is bit k/(2j) of r; k = NP (the last phase): 0, all ascending
    return (k // (2 * j)) % rows


@gluon.constexpr_function
def _n_rounds(lk, LOGR, S):
    # phase 2**lk's shared-memory rounds: its lk - LOGR steps j = k/2 .. R, S at a time
    return (max(0, lk - LOGR) + S - 1) // S


@gluon.constexpr_function
def _round_len(lk, LOGR, S, rr):
    return min(S, lk - LOGR - rr * S)


@gluon.constexpr_function
def _first_buf(lk, LOGR, S):
    # the buffer phase lk stores its tile into: the other one than the previous phase's
    # tile came from (no write-after-read on one buffer between phases either)
    f = 0
    for p in range(LOGR + 1, lk):
        f = f ^ (_n_rounds(p, LOGR, S) & 1) ^ 1
    return f


@gluon.jit
def _block_sort_kernel(x_ptr, v_ptr, i_ptr, k_ptr, N, I, NP: gl.constexpr, R: gl.constexpr,
                       S: gl.constexpr, IS_FLOAT: gl.constexpr, DESC: gl.constexpr,
                       KEYS: gl.constexpr):
    """Program (row, t) sorts keys t*NP .. t*NP + NP - 1 of a contiguous row of N.
    KEYS=False (one tile a row): writes the sorted row's values (gathered from the input by
    index: -0.0 / NaN payloads as they were) and int64 indices at (row // I) * N * I +
    row % I + pos * I (the output's layout, as kernels/sort.py `_decode`). KEYS=True (the
    "ml" path's tile stage): writes the sorted packed keys to k_ptr[row, t*NP + pos]."""
    W: gl.constexpr = gl.num_warps()
    XL: gl.constexpr = _tile_layout(R, W, False)
    XT: gl.constexpr = _tile_layout(R, W, True)
    ROWS: gl.constexpr = _div(NP, R)
    LOG: gl.constexpr = NP.bit_length() - 1
    LOGR: gl.constexpr = R.bit_length() - 1
    gl.static_assert(NP >= 32 * W * R)      # no replicated threads (see the module doc)
    gl.static_assert(2 * _pow2(S) <= R)     # a round's groups of 2**S keys: no replication
    row = gl.program_id(0).to(gl.int64)
    t = gl.program_id(1)
    pos = (gl.expand_dims(gl.arange(0, ROWS, layout=gl.SliceLayout(1, XL)), 1) * R
           + gl.expand_dims(gl.arange(0, R, layout=gl.SliceLayout(0, XL)), 0))
    idx = t * NP + pos
    m = idx < N
    v = gl.load(x_ptr + row * N + idx, mask=m, other=0)
    key = (_gkey(v, IS_FLOAT, DESC, False).to(gl.int64) << 32) | idx.to(gl.int64)
    x = gl.where(m, key, 9223372036854775807)          # padding sorts last
    sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    # the tile transposed in shared memory ([R, NP/R]): a warp's store of one register is 32
    # consecutive keys (no bank conflicts; [NP/R, R] row-major would conflict 4-way)
    b0 = gl.allocate_shared_memory(gl.int64, [R, ROWS], sl)
    b1 = gl.allocate_shared_memory(gl.int64, [R, ROWS], sl)
    for lk in gl.static_range(1, LOG + 1):
        if lk > LOGR:
            # steps j = k/2 .. R through shared memory, S a round, ping-pong between b0 and
            # b1: round n (from 0) reads buffer F ^ (n & 1), F = _first_buf(lk, LOGR, S)
            if _first_buf(lk, LOGR, S) == 0:
                b0.store(gl.permute(x, [1, 0]))
            else:
                b1.store(gl.permute(x, [1, 0]))
            gl.thread_barrier()
            for rr in gl.static_range(_n_rounds(lk, LOGR, S)):
                if (rr & 1) == _first_buf(lk, LOGR, S):
                    _smem_round(b0, b1, _pow2(lk), _pow2(lk - 1 - rr * S),
                                _round_len(lk, LOGR, S, rr), NP, R, W)
                else:
                    _smem_round(b1, b0, _pow2(lk), _pow2(lk - 1 - rr * S),
                                _round_len(lk, LOGR, S, rr), NP, R, W)
            if (_n_rounds(lk, LOGR, S) & 1) == _first_buf(lk, LOGR, S):
                x = gl.convert_layout(gl.permute(b0.load(XT), [1, 0]), XL, assert_trivial=True)
            else:
                x = gl.convert_layout(gl.permute(b1.load(XT), [1, 0]), XL, assert_trivial=True)
        # steps j = min(k/2, R/2) .. 1 in registers
        for jj in gl.static_range(min(lk, LOGR) - 1, -1, -1):
            x = _reg_step(x, pos, _pow2(lk), _pow2(jj), NP, R, XL)
    if KEYS:
        gl.store(k_ptr + row * N + idx, x, mask=m)
    else:
        src = x & 0xFFFFFFFF
        val = gl.load(x_ptr + row * N + src, mask=m, other=0)
        out = (row // I) * N * I + (row % I) + idx.to(gl.int64) * I
        gl.store(i_ptr + out, src, mask=m)
        gl.store(v_ptr + out, val, mask=m)


def sort_rows(xr, M, N, descending, values, indices, inner, rws, keys=None, tile=None):
    """Sort the (M, N) contiguous rows of xr (values of <= 32 bits) with `_block_sort_kernel`,
    rws = (keys a thread R, warps, steps a shared-memory round S). Without `keys`: one
    program a row (N <= MAX_NP) writes values / indices in the output's layout (`inner` = I,
    as kernels/sort.py). With `keys` (M, N) int64 and `tile` (a power of two, 32 * R <= tile
    <= MAX_NP): the "ml" path's tile stage, each tile of `tile` keys sorted into packed keys."""
    R, W, S = rws
    if R not in RS or W not in (1, 2) + WARPS or not (1 <= S and 2 << S <= R):
        raise ValueError(f"sort_rows: rws must be (R, warps, S) with R in {RS}, warps in "
                         f"{(1, 2) + WARPS}, 1 <= S and 2**(S+1) <= R; got {rws!r}")
    isf = xr.dtype.is_floating_point
    if keys is None:
        if not 0 < N <= MAX_NP:
            raise ValueError(f"sort_rows: rows of 1..{MAX_NP} keys; got N={N}")
        NP, R, W = plan(N, R, W)
        launch(_block_sort_kernel, _grid(M, 1), xr, values, indices, indices, N, inner, NP=NP,
               R=R, S=S, IS_FLOAT=isf, DESC=bool(descending), KEYS=False, num_warps=W)
    else:
        if tile & (tile - 1) or not 32 * R <= tile <= MAX_NP:
            raise ValueError(f"sort_rows: tile must be a power of two in [{32 * R}, {MAX_NP}]; "
                             f"got {tile}")
        W = max(1, min(W, tile // (32 * R)))
        launch(_block_sort_kernel, _grid(M, cdiv(N, tile)), xr, keys, keys, keys, N, 1,
               NP=tile, R=R, S=S, IS_FLOAT=isf, DESC=bool(descending), KEYS=True, num_warps=W)
