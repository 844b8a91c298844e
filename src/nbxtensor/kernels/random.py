"""Random numbers on cuda and interp: Philox4x32-10 in torch's CUDA mapping.

torch's CUDA generator (aten/src/ATen/native/cuda/DistributionTemplates.h) draws every
nullary distribution with one grid-stride kernel: 256 threads a block, grid = min(SMs *
(max threads per SM / 256), ceil(numel / 256)); thread `t` of the T = 256 * grid threads
runs curand_init(seed, subsequence=t, offset) -- Philox counter (offset/4 + call, t) as
(c0, c1) = the low/high words of offset/4 + call, (c2, c3) = the low/high words of t, key
(k0, k1) = the low/high words of the seed -- and its call j yields the elements
j*T*U + i*T + t (i < U): U = 4 float32 (or 32-bit word) values from one call, or U = 2
float64 (or 64-bit word) values. The generator's offset then advances by R * 4, R the
number of calls a thread makes. `policy` computes (T, R, increment); the kernel below
reproduces the draws, so interp (the nominal machine of kernels/_common.INTERP, shaped like
an H200: its SMs and threads an SM) yields exactly what an H200 yields for the same seed and
offset.

One program here serves BLOCK consecutive threads and loops over the R calls; a call's
values for consecutive threads are consecutive in memory, so the stores coalesce.

The transforms are curand's and torch's:
  uniform  u = float(x) * 2**-32 + 2**-33 (0 < u <= 1); float64: z = x ^ (y << 21),
           u = z * 2**-53 + 2**-54. uniform_: v = fma(u, to - from, from) cast to the
           dtype, and v == to becomes from.
  normal   Box-Muller on word pairs (x, y): u as above, v = fma(float(y), 2pi * 2**-32,
           pi * 2**-32), s = sqrt(-2 log u), (sin v * s, cos v * s); float64: u, v from
           53-bit pairs, s = sqrt(-2 log u), (sinpi v * s, cospi v * s). normal_: fma(z,
           std, mean) cast to the dtype.
  random_  word % range + base (32-bit words below a range of 2**28, else (x << 32) | y).
  bernoulli_(p float) u < p; exponential_ (-1 / lambda) * log u.
Bit-exact between interp and cuda: everything built from integer ops, float conversions,
multiplications by powers of two and one fused multiply-add (interp emulates the fma
exactly: float32 in float64 with the double rounding corrected). Not bit-exact between
them: log/sin/cos (cuda uses libdevice's logf, the __sinf/__cosf approximations curand's
__sincosf compiles to, sinpi/cospi; interp uses NumPy's), so normal_ and exponential_ agree
to a few ulps there, and float64 uniform_ with a range other than [0, 1) (interp's float64
fma rounds twice).
"""
from __future__ import annotations

from ._triton import triton, tl, libdevice  # Triton, or its stand-in without Triton

from ._common import device_facts
from ._host import cdiv as _cdiv
from .elementwise import _log
from .indexing import _flag_bad_lanes

BLOCK_THREADS = 256        # torch's block_size_bound
OFFSETS_PER_CALL = 4       # torch's max_generator_offsets_per_curand_call
WIDE_FROM = 1 << 28        # random_(from, to): 64-bit words from this range on (torch's rule)

# kinds of draw (the kernel's KIND)
UNIFORM, NORMAL, RANDINT, FULL64, BERNOULLI, BERNOULLI_T, EXPONENTIAL = range(7)

# programs of BLOCK threads; interp runs programs one after another, so it takes large ones.
# (The mapping of values to elements does not depend on BLOCK.)
CONFIG = {"cuda": dict(BLOCK=512, num_warps=4), "interp": dict(BLOCK=8192, num_warps=4)}


def sm_facts(device) -> tuple[int, int]:
    """(SM count, max resident threads an SM) of the device (kernels/_common.device_facts:
    the driver's on cuda, the nominal H200-shaped machine's on interp)."""
    f = device_facts(device)
    return f.sms, f.threads_per_sm


def policy(numel: int, unroll: int, device) -> tuple[int, int, int]:
    """torch's calc_execution_policy: (threads T, calls a thread makes R, offset increment)."""
    sms, tps = sm_facts(device)
    grid = min(sms * (tps // BLOCK_THREADS), _cdiv(numel, BLOCK_THREADS))
    calls = (numel - 1) // (BLOCK_THREADS * grid * unroll) + 1
    return BLOCK_THREADS * grid, calls, calls * OFFSETS_PER_CALL


# ----------------------------------------------------------------------------- kernels
@triton.jit
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Ten Philox4x32 rounds (Salmon et al. 2011), the key bumped by the Weyl constants
    between rounds: curand's curand_Philox4x32_10. All operands uint32."""
    M0: tl.constexpr = 0xD2511F53
    M1: tl.constexpr = 0xCD9E8D57
    W0: tl.constexpr = 0x9E3779B9
    W1: tl.constexpr = 0xBB67AE85
    for _ in tl.static_range(10):
        a0, a2 = c0, c2
        c0 = tl.umulhi(M1, a2) ^ c1 ^ k0
        c2 = tl.umulhi(M0, a0) ^ c3 ^ k1
        c1 = M1 * a2
        c3 = M0 * a0
        k0 = k0 + W0
        k1 = k1 + W1
    return c0, c1, c2, c3


@triton.jit
def _fma32(a, b, c, INTERP: tl.constexpr):
    """float32 a * b + c rounded once (interp has no fused multiply-add: the product is
    exact in float64; where the float64 sum sits on a float32 midpoint, it is nudged one
    float64 ulp towards the part the sum lost, so the float32 rounding is the fma's)."""
    if INTERP:
        p = tl.cast(a, tl.float64) * tl.cast(b, tl.float64)
        c64 = tl.cast(c, tl.float64)
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)
        bits = s.to(tl.int64, bitcast=True)
        mid = (bits & 0x1FFFFFFF) == 0x10000000
        away = (err > 0) == (s > 0)
        nudge = tl.where(mid & (err != 0), tl.where(away, 1, -1), 0).to(tl.int64)
        r = (bits + nudge).to(tl.float64, bitcast=True).to(tl.float32)
    else:
        r = tl.fma(a, b, c)
    return r


@triton.jit
def _uniform32(x):
    # curand's _curand_uniform: x * CURAND_2POW32_INV + CURAND_2POW32_INV / 2, in (0, 1]
    return x.to(tl.float32) * 2.3283064365386963e-10 + 1.1641532182693481e-10


@triton.jit
def _uniform64(x, y):
    # curand's _curand_uniform_double_hq: 53 bits z = x ^ (y << 21), z * 2**-53 + 2**-54
    z = x.to(tl.uint64) ^ (y.to(tl.uint64) << 21)
    return z.to(tl.float64) * 1.1102230246251565e-16 + 5.551115123125783e-17


@triton.jit
def _box_muller32(x, y, INTERP: tl.constexpr):
    # curand's _curand_box_muller: CURAND_2POW32_INV_2PI = float(2.3283064e-10f * 6.2831855f)
    u = _uniform32(x)
    v = _fma32(y.to(tl.float32), 1.462918119976564e-09, 7.31459059988282e-10, INTERP)
    if INTERP:
        s = tl.sqrt(-2.0 * tl.log(u))
        sn = tl.sin(v)
        cs = tl.cos(v)
    else:
        s = libdevice.sqrt_rn(-2.0 * libdevice.log(u))
        sn = libdevice.fast_sinf(v)      # __sincosf: sin.approx / cos.approx
        cs = libdevice.fast_cosf(v)
    return sn * s, cs * s


@triton.jit
def _box_muller64(x0, x1, y0, y1, INTERP: tl.constexpr):
    # curand's _curand_box_muller_double: v = zy * 2**-52 + 2**-53 in (0, 2], sincospi(v)
    u = _uniform64(x0, x1)
    zy = y0.to(tl.uint64) ^ (y1.to(tl.uint64) << 21)
    v = zy.to(tl.float64) * 2.220446049250313e-16 + 1.1102230246251565e-16
    if INTERP:
        s = tl.sqrt(-2.0 * tl.log(u))
        sn = tl.sin(v * 3.141592653589793)
        cs = tl.cos(v * 3.141592653589793)
    else:
        s = libdevice.sqrt_rn(-2.0 * libdevice.log(u))
        sn = libdevice.sinpi(v)
        cs = libdevice.cospi(v)
    return sn * s, cs * s


@triton.jit
def _i64(x):
    # `+ 0`: Triton's interpreter hands an int in [2**31, 2**32) over as uint32 data typed
    # int64 (so a bitcast of it fails); an arithmetic op re-materialises it as int64
    return x.to(tl.int64) + 0


@triton.jit
def _f64(bits):
    return _i64(bits).to(tl.float64, bitcast=True)


@triton.jit
def _emit(out_ptr, aux_ptr, li, m, r, a, b, c, KIND: tl.constexpr, WIDE: tl.constexpr,
          INTERP: tl.constexpr):
    """Transform one drawn value r (a float in the accumulation type, or an unsigned word)
    for the elements li and store it."""
    oty = out_ptr.dtype.element_ty
    if KIND == 0:        # uniform_: fma(u, range, from) in float32 (float64), to -> from
        if WIDE:
            v = tl.fma(r, _f64(a), _f64(b))
        else:
            v = _fma32(r, _f64(a).to(tl.float32), _f64(b).to(tl.float32), INTERP)
        v = v.to(oty)
        v = tl.where(v == _f64(c).to(oty), _f64(b).to(oty), v)
    elif KIND == 1:      # normal_: fma(z, std, mean)
        if WIDE:
            v = tl.fma(r, _f64(a), _f64(b)).to(oty)
        else:
            v = _fma32(r, _f64(a).to(tl.float32), _f64(b).to(tl.float32), INTERP).to(oty)
    elif KIND == 2:      # random_: word % range + base (uint64 arithmetic, as torch)
        w = (r.to(tl.uint64) % _i64(a).to(tl.uint64, bitcast=True)
             + _i64(b).to(tl.uint64, bitcast=True)).to(tl.int64, bitcast=True)
        if oty == tl.int1:
            v = w != 0
        else:
            v = w.to(oty)
    elif KIND == 3:      # random_(int64 min, None): the word as int64
        w = r.to(tl.int64, bitcast=True)
        if oty == tl.int1:
            v = w != 0
        else:
            v = w.to(oty)
    elif KIND == 4:      # bernoulli_(float p): u < p in the accumulation type
        if WIDE:
            v = r < _f64(a)
        else:
            v = r < _f64(a).to(tl.float32)
        v = v.to(oty)
    elif KIND == 5:      # bernoulli_(p tensor): u <= p[li] (p laid out as the output)
        p = tl.load(aux_ptr + li, mask=m, other=0.0)
        v = (r <= p).to(oty)
    else:                # exponential_: (-1 / lambda) * log(u)
        if WIDE:
            v = (_f64(a) * _log(r, INTERP)).to(oty)
        else:
            v = (_f64(a).to(tl.float32) * _log(r, INTERP)).to(oty)
    tl.store(out_ptr + li, v, mask=m)


# seed and offset only feed the Philox counter (never an address or a mask): specialising
# them (== 1, divisible by 16) would compile new variants as the offset advances, for the
# same code (the cubins are byte-identical with and without the divisibility attribute)
@triton.jit
def _philox_key(pair_ptr, seed, offset, FROM_PAIR: tl.constexpr):
    """(key words k0, k1, first counter = offset / 4) of one draw. A captured launch reads
    the generator's seed and offset from the device at each replay (pair_ptr), plus this
    launch's offset within the graph."""
    if FROM_PAIR:
        sd = tl.load(pair_ptr)
        off = tl.load(pair_ptr + 1) + offset.to(tl.int64)
    else:
        sd = seed.to(tl.int64)
        off = offset.to(tl.int64)
    k0 = (sd & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((sd >> 32) & 0xFFFFFFFF).to(tl.uint32)
    return k0, k1, off >> 2


@triton.jit(do_not_specialize=["seed", "offset"])
def _draw_kernel(out_ptr, aux_ptr, pair_ptr, seed, offset, n, T, R, a, b, c,
                 KIND: tl.constexpr, WIDE: tl.constexpr, FROM_PAIR: tl.constexpr,
                 INTERP: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tmask = t < T
    k0, k1, base = _philox_key(pair_ptr, seed, offset, FROM_PAIR)
    c2 = t.to(tl.uint32)
    c3 = (t * 0).to(tl.uint32)
    T64 = T.to(tl.int64)
    for j in range(R):
        cnt = base + j
        c0 = (cnt & 0xFFFFFFFF).to(tl.uint32)
        c1 = ((cnt >> 32) & 0xFFFFFFFF).to(tl.uint32)
        r0, r1, r2, r3 = philox4x32_10(c0, c1, c2, c3, k0, k1)
        if WIDE:
            li = j * 2 * T64 + t
            if KIND == 1:
                v0, v1 = _box_muller64(r0, r1, r2, r3, INTERP)
            elif KIND == 2 or KIND == 3:
                v0 = (r0.to(tl.uint64) << 32) | r1.to(tl.uint64)
                v1 = (r2.to(tl.uint64) << 32) | r3.to(tl.uint64)
            else:
                v0 = _uniform64(r0, r1)
                v1 = _uniform64(r2, r3)
            _emit(out_ptr, aux_ptr, li, tmask & (li < n), v0, a, b, c, KIND, WIDE, INTERP)
            _emit(out_ptr, aux_ptr, li + T64, tmask & (li + T64 < n), v1, a, b, c, KIND,
                  WIDE, INTERP)
        else:
            li = j * 4 * T64 + t
            if KIND == 1:
                v0, v1 = _box_muller32(r0, r1, INTERP)
                v2, v3 = _box_muller32(r2, r3, INTERP)
            elif KIND == 2 or KIND == 3:
                v0, v1, v2, v3 = r0, r1, r2, r3
            else:
                v0 = _uniform32(r0)
                v1 = _uniform32(r1)
                v2 = _uniform32(r2)
                v3 = _uniform32(r3)
            _emit(out_ptr, aux_ptr, li, tmask & (li < n), v0, a, b, c, KIND, WIDE, INTERP)
            _emit(out_ptr, aux_ptr, li + T64, tmask & (li + T64 < n), v1, a, b, c, KIND,
                  WIDE, INTERP)
            _emit(out_ptr, aux_ptr, li + 2 * T64, tmask & (li + 2 * T64 < n), v2, a, b, c,
                  KIND, WIDE, INTERP)
            _emit(out_ptr, aux_ptr, li + 3 * T64, tmask & (li + 3 * T64 < n), v3, a, b, c,
                  KIND, WIDE, INTERP)


@triton.jit
def _set_pair_kernel(pair_ptr, seed, offset):
    tl.store(pair_ptr, seed.to(tl.int64))
    tl.store(pair_ptr + 1, offset.to(tl.int64))


# ------------------------------------------------------------------------------- entries
def draw(out, kind: int, wide: bool, T: int, R: int, seed: int, offset: int, pair=None,
         aux=None, a: int = 0, b: int = 0, c: int = 0) -> None:
    """Fill the contiguous tensor `out` with one torch-mapped draw (see the module notes).

    seed: the generator's seed as a signed int64; offset: its Philox offset (a multiple of
    4), or with `pair` (an int64 (2,) device tensor [seed, offset], read by the kernel) the
    offset within a captured graph. a, b, c: the kind's parameters, floats as their
    float64 bits (kernels._host.f64_bits), ints as int64."""
    from ..backends.launch import launch
    interp = out.device.type == "interp"
    cfg = CONFIG["interp" if interp else "cuda"]
    launch(_draw_kernel, (_cdiv(T, cfg["BLOCK"]),), out, out if aux is None else aux,
           out if pair is None else pair, seed, offset, out.numel(), T, R, a, b, c,
           KIND=kind, WIDE=wide, FROM_PAIR=pair is not None, INTERP=interp,
           BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"])


def set_pair(pair, seed: int, offset: int) -> None:
    """pair[0], pair[1] = seed, offset on the device, in stream order (a graph's prologue)."""
    from ..backends.launch import launch
    launch(_set_pair_kernel, (1,), pair, seed, offset, num_warps=1)


# ------------------------------------------------------------------------------- multinomial
# Exponential races (p / Exp(1): the largest keys are a draw without replacement, the
# largest alone a draw of one sample), fused: one pass reads p, draws an Exp(1) for each
# element from its own Philox subsequence (element b*K + k, one call), and reduces each
# block of a row to its largest key, with the block's counts of invalid (< 0, NaN, inf) and
# positive probabilities; a second tiny launch picks the row's winner and records an invalid
# row in the device's error flag (kernels/indexing), so no host round trip is needed.
RACE = {"cuda": dict(BLOCK=1024, num_warps=4), "interp": dict(BLOCK=8192, num_warps=4)}


@triton.jit(do_not_specialize=["seed", "offset"])
def _race_kernel(p_ptr, key_ptr, best_ptr, bidx_ptr, cnt_ptr, pair_ptr, seed, offset, K, NB,
                 s_pb, s_pk, WIDE: tl.constexpr, FROM_PAIR: tl.constexpr,
                 WRITE_KEYS: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    blk = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    k = blk * BLOCK + tl.arange(0, BLOCK)
    m = k < K
    k0, k1, cnt = _philox_key(pair_ptr, seed, offset, FROM_PAIR)
    e = row * K + k
    c0 = (k * 0 + (cnt & 0xFFFFFFFF)).to(tl.uint32)
    c1 = (k * 0 + ((cnt >> 32) & 0xFFFFFFFF)).to(tl.uint32)
    r0, r1, r2, r3 = philox4x32_10(c0, c1, (e & 0xFFFFFFFF).to(tl.uint32),
                                   ((e >> 32) & 0xFFFFFFFF).to(tl.uint32), k0, k1)
    if WIDE:
        p = tl.load(p_ptr + row * s_pb + k * s_pk, mask=m, other=0.0).to(tl.float64)
        u = _uniform64(r0, r1)
        tiny = 2.2250738585072014e-308
    else:
        p = tl.load(p_ptr + row * s_pb + k * s_pk, mask=m, other=0.0).to(tl.float32)
        u = _uniform32(r0)
        tiny = 1.1754943508222875e-38
    # Exp(1) = -log u, u in (0, 1]; an exact 0 (u == 1) wins its row as a tiny draw would
    q = tl.maximum(-_log(u, INTERP), tiny)
    key = tl.where(m, p / q, -1.0)
    if WRITE_KEYS:
        tl.store(key_ptr + row * K + k, key, mask=m)
    bad = m & ((p < 0) | (p != p) | (p == float("inf")))
    pos = m & (p > 0)
    best = tl.max(key, 0)
    idx = tl.min(tl.where(key == best, k, K), 0)
    slot = row * NB + blk
    tl.store(best_ptr + slot, best)
    tl.store(bidx_ptr + slot, idx.to(tl.int64))
    tl.store(cnt_ptr + 2 * slot, tl.sum(bad.to(tl.int32), 0))
    tl.store(cnt_ptr + 2 * slot + 1, tl.sum(pos.to(tl.int32), 0))


@triton.jit
def _race_finish_kernel(best_ptr, bidx_ptr, cnt_ptr, out_ptr, flag_ptr, tag_bad, tag_few, NB,
                        need, BLOCK: tl.constexpr):
    """Row `row`'s winner over its NB block winners (the first block of the largest key);
    a row with an invalid probability, or with fewer than `need` positive ones, is recorded
    in the error flag (tag_bad / tag_few name the error; the value is the row)."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    top = tl.load(best_ptr + row * NB + j, mask=j < NB, other=-1.0)
    topi = tl.load(bidx_ptr + row * NB + j, mask=j < NB, other=0)
    nbad = tl.load(cnt_ptr + 2 * (row * NB + j), mask=j < NB, other=0)
    npos = tl.load(cnt_ptr + 2 * (row * NB + j) + 1, mask=j < NB, other=0)
    for s in range(BLOCK, NB, BLOCK):
        mk = s + j < NB
        v = tl.load(best_ptr + row * NB + s + j, mask=mk, other=-1.0)
        vi = tl.load(bidx_ptr + row * NB + s + j, mask=mk, other=0)
        nbad += tl.load(cnt_ptr + 2 * (row * NB + s + j), mask=mk, other=0)
        npos += tl.load(cnt_ptr + 2 * (row * NB + s + j) + 1, mask=mk, other=0)
        take = v > top
        top = tl.where(take, v, top)
        topi = tl.where(take, vi, topi)
    best = tl.max(top, 0)
    idx = tl.min(tl.where(top == best, topi, 9223372036854775807), 0)
    tl.store(out_ptr + row, idx)
    nb = tl.sum(nbad, 0)
    npo = tl.sum(npos, 0)
    lane0 = j == 0
    _flag_bad_lanes(flag_ptr, lane0 & (nb > 0), row + j * 0, tag_bad)
    _flag_bad_lanes(flag_ptr, lane0 & (nb == 0) & (npo < need), row + j * 0, tag_few)


def race_errors(op: str, need: int, replacement: bool):
    """The two error records the race reports through the flag (see ops.indexing)."""
    from ..dispatch import DeviceValueError
    few = ("the probabilities of a row sum to 0" if need == 1 else
           f"a row has fewer than num_samples={need} positive probabilities")
    return ((op, DeviceValueError("invalid distribution: probabilities must be finite and "
                                  ">= 0"), None, None),
            (op, DeviceValueError(f"invalid distribution: {few}"), None, None))


def race(p, keys, out, seed: int, offset: int, pair=None, need: int = 1,
         op: str = "multinomial") -> None:
    """Exponential races over the rows of the 2-D p (float32/float64 read as such, 16-bit
    floats widened): out (B,) int64 the winners, keys (B, K) the keys when given (else
    None). An invalid row raises ValueError at the op (interp, or 'sync' index checks) or
    at the next synchronising call (cuda), as the index checks do."""
    from .. import dtypes as _dt
    from ..backends.launch import launch
    from ..tensor import Tensor
    from .indexing import _after, _flag, _tag
    B, K = p.shape
    interp = p.device.type == "interp"
    cfg = RACE["interp" if interp else "cuda"]
    block = min(cfg["BLOCK"], max(16, 1 << (K - 1).bit_length()))   # short rows: small blocks
    NB = _cdiv(K, block)
    wide = p.dtype.name == "float64"
    acc = _dt.float64 if wide else _dt.float32
    best = Tensor._empty((B, NB), acc, p.device)
    bidx = Tensor._empty((B, NB), _dt.int64, p.device)
    cnt = Tensor._empty((B, NB, 2), _dt.int32, p.device)
    launch(_race_kernel, (NB, B), p, keys if keys is not None else best, best, bidx, cnt,
           pair if pair is not None else cnt, seed, offset, K, NB, p.stride(0), p.stride(1),
           WIDE=wide, FROM_PAIR=pair is not None, WRITE_KEYS=keys is not None, INTERP=interp,
           BLOCK=block, num_warps=cfg["num_warps"])
    e_bad, e_few = race_errors(op, need, True)
    fb = min(1024, max(16, 1 << (NB - 1).bit_length()))
    launch(_race_finish_kernel, (B,), best, bidx, cnt, out, _flag(p.device), _tag(e_bad),
           _tag(e_few), NB, need, BLOCK=fb, num_warps=4)
    _after(p.device, e_bad)
