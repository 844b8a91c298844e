"""A device-wide LSD radix sort for a few long rows (issue 4, session 5: sort (1, 1048576)).

Keys. Every value becomes a 32-bit unsigned order key u (`_rkey`): floats and int32 through
kernels/sort.py `_key32` (NaN largest, -0.0 as +0.0, inverted for descending) + 2**31;
int16 / int8 / uint8 / bool as v - min on their own width (inverted on that width for
descending). Only key bits [LO, HI) can differ (`key_bits`: bf16 16..32, f16 13..32 -- the
low bits of their f32 image are a function of the high ones; int8 0..8, ...), so a sort
takes ceil((HI - LO) / DB) passes of DB-bit digits. Keys move as packed int64
(u << 32) | source index; the last pass writes the int64 index and the value gathered
from the input by that index (so -0.0 / NaN payloads come back as they were).

Launches: one `_hist_kernel` (all passes' digit histograms of every row in one read, as
per-program partial counts -- no atomics, nothing to zero first -- and it zeroes the
look-back state), then one `_pass_kernel` per digit ("onesweep"): a program takes a ticket
(an atomic counter: tiles run in ticket order, so a program only ever waits on programs
that are already running), loads its tile of T keys, ranks each key among the tile's keys
of its digit, publishes the tile's digit counts, sums its predecessors' counts by a
decoupled look-back (windows of LB tiles, all digits at once), and scatters every key to
global digit offset + predecessors' count + rank. f32 with DB 4: 9 launches.

Stable in-tile rank without warp vote/match (Triton has neither): one-hot counts in 16-bit
fields, 2 digits an int32 word (2**DB / 2 words); the tile is T / E rows of E consecutive
keys held as E column tensors, so a thread owns whole rows: per word, E adds give the running
count along a row and one cross-thread exclusive scan of the row totals the rows' offsets; a
key's rank = its word's running count in its field - 1. Stable by construction, so ties
keep index order (torch's stable sort) and every LSD pass is valid.

Status words of the look-back: int32 (flag << 30) | count, flag 1 = this tile's count
(aggregate), 2 = count including every earlier tile (inclusive prefix); one word a digit,
so a reader never needs ordering between two words. Published with atomic exchange, read
with volatile loads (no L1). Counts < 2**30 (host: N < 2**30).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .. import dtypes as _dt
from ..tensor import Tensor
from ..backends.launch import launch
from ._host import cdiv
from .sort import _key32

# the launch-config tuples the sweep times (bench_reduction.py --sort-sweep2 --radix-big):
# (DB digit bits, T keys a tile, warps, LB look-back window, E keys a row of the in-tile
# count, COAL: 1 = one coalesced [T/E, E] load split into columns through shared memory,
# 0 = E strided column loads (each warp instruction touches 32 L1 lines)). ptxas sm_90, f32
# middle pass (registers; static PTX instructions a key, most of them the 8 count words'
# adds/selects): (4096, 8, E16) 250, 107 (COAL 255, 114 + 32 KiB shared); (2048, 4, E16)
# 230, 106 (COAL 114); (4096, 16, E8) 128 + 12 B spills, 169 (COAL 177); (8192, 16, E16,
# COAL) 128 + 360 B spills, 122; (1024, 4, E8, COAL) 196, 160. A [T] scan a word (E 1): 600.
SWEEP = [(4, 4096, 8, 32, 16, 1), (4, 4096, 8, 32, 16, 0), (4, 2048, 4, 32, 16, 1),
         (4, 2048, 4, 32, 16, 0), (4, 4096, 16, 32, 8, 1), (4, 8192, 16, 32, 16, 1),
         (4, 1024, 4, 32, 8, 1)]
MAX_N = 2 ** 30 - 1     # look-back counts are 30-bit fields
# status flags (bits 30-31 of an int32 word): aggregate 1, inclusive prefix 2 (= INT32_MIN)
_A = tl.constexpr(1 << 30)
_P = tl.constexpr(-2 ** 31)


def key_bits(dtype):
    """(LO, HI, VMIN): the key bits that can differ, and the offset of narrow ints (None:
    the `_key32` + 2**31 key of floats and int32)."""
    name = dtype.name
    if name in ("float32", "int32"):
        return 0, 32, None
    if name == "bfloat16":
        return 16, 32, None
    if name == "float16":
        return 13, 32, None
    if dtype.is_floating_point:     # fp8: exact in f32; all bits (correct, not minimal)
        return 0, 32, None
    if name == "bool":
        return 0, 1, 0
    if name == "uint8":
        return 0, 8, 0
    if name == "int8":
        return 0, 8, -128
    if name == "int16":
        return 0, 16, -32768
    raise ValueError(f"sort_radix: values of <= 32 bits; got dtype {name}")


def passes(dtype, db):
    """[(shift, digit mask)] of the LSD passes for this dtype and digit width."""
    lo, hi, _ = key_bits(dtype)
    return [(s, (1 << min(db, hi - s)) - 1) for s in range(lo, hi, db)]


@triton.jit
def _rkey(v, IS_FLOAT: tl.constexpr, DESC: tl.constexpr, VMIN: tl.constexpr,
          SPAN: tl.constexpr):
    # the unsigned order key as int64 in [0, 2**32)
    if VMIN is None:
        u = _key32(v, IS_FLOAT, DESC).to(tl.int64) + 2147483648
    else:
        u = v.to(tl.int64) - VMIN
        if DESC:
            u = SPAN - u
    return u


@triton.jit(do_not_specialize=["G", "ZN"])
def _hist_kernel(x_ptr, h_ptr, z_ptr, N, G, ZN, LO: tl.constexpr, DB: tl.constexpr,
                 HI: tl.constexpr, NPP: tl.constexpr, RADIX: tl.constexpr,
                 BLOCK: tl.constexpr, IS_FLOAT: tl.constexpr, DESC: tl.constexpr,
                 VMIN: tl.constexpr, SPAN: tl.constexpr, ZB: tl.constexpr):
    # program (row, g): digit counts of every pass over blocks g, g + G, .. of the row ->
    # h[row, pass, g, :]; and zero its share of the look-back state z[0:ZN]
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    q = row * G + g
    nq = tl.num_programs(0) * G
    zc = (ZN + nq - 1) // nq
    for z0 in range(q * zc, tl.minimum(q * zc + zc, ZN), ZB):
        zi = z0 + tl.arange(0, ZB)
        tl.store(z_ptr + zi, tl.zeros([ZB], tl.int32), mask=zi < tl.minimum(q * zc + zc, ZN))
    pp = tl.arange(0, NPP)[:, None]
    acc = tl.zeros([NPP, RADIX], tl.int32)
    for b in range(g * BLOCK, N, G * BLOCK):
        i = b + tl.arange(0, BLOCK)
        m = i < N
        u = _rkey(tl.load(x_ptr + row * N + i, mask=m, other=0), IS_FLOAT, DESC, VMIN, SPAN)
        for p in tl.static_range(NPP):
            if LO + p * DB < HI:
                d = ((u >> (LO + p * DB)) & (RADIX - 1)).to(tl.int32)
                acc += tl.where(pp == p, tl.histogram(d, RADIX, mask=m)[None, :], 0)
    r = tl.arange(0, RADIX)[None, :]
    tl.store(h_ptr + ((row * NPP + pp) * G + g) * RADIX + r, acc)


@triton.constexpr_function
def _half(E, lvl):
    # the column count of a piece after split level lvl (a name assigned in a static loop
    # would turn the constexpr into a tensor)
    return E >> (lvl + 1)


@triton.jit
def _columns(x, RW: tl.constexpr, E: tl.constexpr):
    # a [RW, E] tensor as the tuple of its E columns, in order: halves split off recursively
    # ([RW, 2, n] -> [RW, n, 2] -> split); the last level's [RW, 1] pieces reshaped to [RW]
    cols = (x,)
    for lvl in tl.static_range(E.bit_length() - 1):
        new = ()
        for c in tl.static_range(1 << lvl):
            a, b = tl.split(tl.permute(tl.reshape(cols[c], [RW, 2, _half(E, lvl)]), [0, 2, 1]))
            new = new + (a, b)
        cols = new
    out = ()
    for c in tl.static_range(E):
        out = out + (tl.reshape(cols[c], [RW]),)
    return out


# the per-pass scalars are not specialised (SHIFT 16 or PASS 1 would compile new variants)
@triton.jit(do_not_specialize=["I", "TILES", "G", "SHIFT", "DMASK", "PASS"])
def _pass_kernel(x_ptr, kin_ptr, kout_ptr, v_ptr, i_ptr, h_ptr, z_ptr, b_ptr, N, I, TILES, G,
                 SHIFT, DMASK, PASS, T: tl.constexpr, E: tl.constexpr, RADIX: tl.constexpr,
                 NPP: tl.constexpr, GP: tl.constexpr, LB: tl.constexpr,
                 FIRST: tl.constexpr, LAST: tl.constexpr, IS_FLOAT: tl.constexpr,
                 DESC: tl.constexpr, VMIN: tl.constexpr, SPAN: tl.constexpr,
                 COAL: tl.constexpr = False):
    # z: tickets z[0:NPP], then status words z[NPP + (PASS * rows * TILES + tile) * RADIX + d];
    # b: each program's digit offsets (b[t * RADIX + d]), read back per key
    t = tl.atomic_add(z_ptr + PASS, 1)          # tiles in ticket order: look-back progress
    row = (t // TILES).to(tl.int64)
    tile = t % TILES
    # the tile as T / E rows of E consecutive keys, held as E column tensors (a tuple): a
    # thread then owns whole rows, so the in-row scan is E plain adds and only the row totals
    # (one a thread when T / E = 32 * warps) go through a cross-thread scan. (A [T] scan
    # costs a full shuffle + cross-warp scan per register: ~4x the instructions, sm_90 PTX.)
    RW: tl.constexpr = T // E
    r = tile * T + tl.arange(0, RW) * E
    if COAL:
        # one coalesced [RW, E] load, split into the E columns (layout conversions through
        # shared memory instead of E strided loads: 32 L1 lines a warp instruction each)
        o2 = r[:, None] + tl.arange(0, E)[None, :]
        if FIRST:
            v2 = tl.load(x_ptr + row * N + o2, mask=o2 < N, other=0)
            k2 = (_rkey(v2, IS_FLOAT, DESC, VMIN, SPAN) << 32) | o2.to(tl.int64)
        else:
            k2 = tl.load(kin_ptr + row * N + o2, mask=o2 < N, other=0)
        ks = _columns(k2, RW, E)
    else:
        ks = ()
        for e in tl.static_range(E):
            if FIRST:
                v = tl.load(x_ptr + row * N + r + e, mask=r + e < N, other=0)
                ks = ks + ((_rkey(v, IS_FLOAT, DESC, VMIN, SPAN) << 32) | (r + e).to(tl.int64),)
            else:
                ks = ks + (tl.load(kin_ptr + row * N + r + e, mask=r + e < N, other=0),)
    ds = ()
    ms = ()
    for e in tl.static_range(E):
        ds = ds + (((ks[e] >> (SHIFT + 32)) & DMASK).to(tl.int32),)
        ms = ms + (r + e < N,)
    # stable rank among the tile's keys of the same digit: one-hot 16-bit fields, 2 digits an
    # int32 word; per word the running count along each row (in registers), then an exclusive
    # scan of the row totals; each key keeps its own word's running count (rank = its field
    # - 1, extracted once after the loop)
    ones = ()
    his = ()
    runs = ()
    for e in tl.static_range(E):
        ones = ones + (tl.where(ms[e], 1 << ((ds[e] & 1) * 16), 0),)
        his = his + (ds[e] >> 1,)
        runs = runs + (tl.zeros([RW], tl.int32),)
    dd = tl.arange(0, RADIX)
    cnt = tl.zeros([RADIX], tl.int32)
    for w in tl.static_range(RADIX // 2):
        c = tl.zeros([RW], tl.int32)
        cs = ()
        for e in tl.static_range(E):
            c = c + tl.where(his[e] == w, ones[e], 0)
            cs = cs + (c,)
        pre = tl.cumsum(c, 0) - c
        nr = ()
        for e in tl.static_range(E):
            nr = nr + (tl.where(his[e] == w, cs[e] + pre, runs[e]),)
        runs = nr
        tw = tl.sum(c, 0)
        cnt = tl.where((dd >> 1) == w, (tw >> ((dd & 1) * 16)) & 0xFFFF, cnt)
    ranks = ()
    for e in tl.static_range(E):
        ranks = ranks + (((runs[e] >> ((ds[e] & 1) * 16)) & 0xFFFF) - 1,)
    # publish this tile's counts, then the inclusive prefix once the look-back has it
    sp = z_ptr + NPP + ((PASS * tl.num_programs(0) + t) * RADIX + dd)
    if tile == 0:
        tl.atomic_xchg(sp, _P | cnt, sem="relaxed")
        excl = tl.zeros([RADIX], tl.int32)
    else:
        tl.atomic_xchg(sp, _A | cnt, sem="relaxed")
        excl = tl.zeros([RADIX], tl.int32)
        done = tl.zeros([RADIX], tl.int32)
        j = tile
        jw = tl.arange(0, LB)
        spins = 0
        # bounded (2**20 window reads, ~1 s): a bug here gives a wrong result, not a hung GPU
        while (j > 0) & (spins < 1048576):
            spins += 1
            jj = j - LB + jw                    # a window of predecessors, all digits at once
            ok = (jj >= 0)[:, None]
            wp = z_ptr + NPP + ((PASS * tl.num_programs(0) + t - tile + jj)[:, None] * RADIX
                                + dd[None, :])
            s = tl.load(wp, mask=ok, other=0, volatile=True)
            flag = (s >> 30) & 3
            # per digit: the nearest inclusive prefix in the window; what lies after it (and
            # it) is summed -- if every one of those has been published
            pj = tl.max(tl.where(ok & (flag == 2), jj[:, None], -1), axis=0)
            use = ok & (jj[:, None] >= pj[None, :]) & (done == 0)[None, :]
            if tl.sum(tl.where(use & (flag == 0), 1, 0)) == 0:
                excl += tl.sum(tl.where(use, s & 0x3FFFFFFF, 0), axis=0)
                done = tl.where(pj >= 0, 1, done)
                j = tl.where(tl.min(done) == 1, 0, j - LB)
        tl.atomic_xchg(sp, _P | (excl + cnt), sem="relaxed")
    # global offset of each digit in this row: exclusive scan of the row's digit counts
    gg = tl.arange(0, GP)[:, None]
    hc = tl.load(h_ptr + ((row * NPP + PASS) * G + gg) * RADIX + dd[None, :],
                 mask=gg < G, other=0)
    tot = tl.sum(hc, axis=0)
    # each key's digit offset through this program's slot in b (a register gather across
    # threads); the barrier makes the stores visible to the whole program
    bp = b_ptr + t * RADIX
    tl.store(bp + dd, tl.cumsum(tot, 0) - tot + excl)
    tl.debug_barrier()
    for e in tl.static_range(E):
        dest = (tl.load(bp + ds[e]) + ranks[e]).to(tl.int64)
        if LAST:
            src = ks[e] & 0xFFFFFFFF
            val = tl.load(x_ptr + row * N + src, mask=ms[e], other=0)
            ob = (row // I) * N * I + (row % I) + dest * I
            tl.store(i_ptr + ob, src, mask=ms[e])
            tl.store(v_ptr + ob, val, mask=ms[e])
        else:
            tl.store(kout_ptr + row * N + dest, ks[e], mask=ms[e])


def radix_sort(xr, M, N, descending, values, indices, inner, rc, hist_block, stop=None):
    """Sort the (M, N) contiguous rows of xr (values of <= 32 bits) into values / indices
    (output layout: element stride `inner`, as kernels/sort.py `_decode`). rc = (DB digit
    bits, T keys a tile (power of two), warps, LB look-back window (power of two), E keys a
    row of the in-tile count[, COAL 0/1: coalesced load + split, see SWEEP]);
    hist_block: keys a histogram program reads at a time. stop = p (tests): return the
    packed int64 keys after pass p instead of finishing."""
    db, T, W, LB, E = rc[:5]
    coal = bool(rc[5]) if len(rc) > 5 else False
    if not (len(rc) in (5, 6) and 2 <= db <= 8 and T >= 4 and T & (T - 1) == 0 and T <= 32768
            and LB >= 1 and LB & (LB - 1) == 0 and E >= 1 and E & (E - 1) == 0 and E <= T):
        raise ValueError(f"radix_sort: rc must be (DB in 2..8, T a power of two in 4..32768, "
                         f"warps, LB a power of two, E a power of two <= T[, COAL]); got {rc!r}")
    if not 0 < N <= MAX_N:
        raise ValueError(f"radix_sort: rows of 1..{MAX_N} keys; got N={N}")
    lo, hi, vmin = key_bits(xr.dtype)
    ps = passes(xr.dtype, db)
    npp = 1 << (len(ps) - 1).bit_length()
    radix = 1 << db
    span = (1 << hi) - 1 if vmin is not None else 0
    isf = xr.dtype.is_floating_point
    dev = xr.device
    tiles = cdiv(N, T)
    hb = max(4, min(hist_block, 1 << (N - 1).bit_length()))
    G = min(cdiv(N, hb), 256)      # enough programs to fill the GPU on one row
    gp = 1 << (G - 1).bit_length()
    zn = npp + npp * M * tiles * radix
    zn += -zn % 4                   # the histogram region 16-byte aligned (vector loads)
    hn = M * npp * G * radix
    ws = Tensor._empty((zn + hn + M * tiles * radix,), _dt.int32, dev)
    z = ws[:zn]
    h = ws[zn:zn + hn]
    b = ws[zn + hn:]
    kw = dict(IS_FLOAT=isf, DESC=bool(descending), VMIN=vmin, SPAN=span)
    launch(_hist_kernel, (M, G), xr, h, z, N, G, zn, LO=lo, DB=db, HI=hi, NPP=npp,
           RADIX=radix, BLOCK=hb, ZB=min(hb, 1024), num_warps=min(8, max(1, hb // 256)),
           **kw)
    bufs = [Tensor._empty((M, N), _dt.int64, dev)]
    if len(ps) > 2:
        bufs.append(Tensor._empty((M, N), _dt.int64, dev))
    for p, (shift, dmask) in enumerate(ps):
        last = p == len(ps) - 1 and stop is None
        kin = bufs[(p - 1) % len(bufs)] if p else xr
        kout = bufs[p % len(bufs)]
        launch(_pass_kernel, (M * tiles,), xr, kin, kout, values if last else kout,
               indices if last else kout, h, z, b, N, inner, tiles, G, shift, dmask, p, T=T,
               E=E, COAL=coal, RADIX=radix, NPP=npp, GP=gp, LB=LB, FIRST=p == 0, LAST=last,
               num_warps=W, **kw)
        if stop is not None and p == stop:
            return kout
