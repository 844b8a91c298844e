"""Seeded random numbers on the cpu, bit-identical to torch's CPU generator.

The engine is torch's MT19937 (aten/src/ATen/core/MT19937RNGEngine.h): seeded from the low
32 bits of the seed, one 32-bit word per `random()`, `random64()` = (first << 32) | second.
The transforms follow torch's CPU kernels draw for draw, so that the same seed and the same
call sequence give the same bits and leave the generator in the same state:

  uniform_/rand    float64: 53 bits of random64; float32/float16/bfloat16: 24 bits of one word,
                   computed in float32 (x * (to - from) + from, one fused multiply-add), cast
  normal_/randn    >= 16 elements, contiguous: all uniforms first, then Box-Muller on blocks of
                   16 (8 pairs); a tail (n % 16) recomputes the last 16 from 16 fresh uniforms.
                   float32/float16/bfloat16 run torch's AVX2 kernel (avx_mathfun's cephes
                   log/sincos in float32, with the fused multiply-adds GCC makes of them);
                   float64 uses libm's log/cos/sin. Fewer than 16 or non-contiguous: the scalar
                   double Box-Muller, whose second value is cached in the generator.
  random_/randint  range < 2**28: one word % range; otherwise random64 % range
  randperm         forward Fisher-Yates, z = random() % (n - i)
  bernoulli_, exponential_, geometric_, cauchy_, log_normal_, poisson: torch's double
                   transforms, one draw (or torch's loop of draws) per element
  multinomial      without replacement or one sample: argmax/topk of p / Exp(1);
                   with replacement: normalised cumulative sums, one double uniform a sample.
                   Where p / q ties (float16/bfloat16 rows, in practice) the order of the
                   tied indices in a topk may differ from torch's (its partial sort's order)

Elements are filled in memory order (TensorIterator's order). libm is the process's own
(math module), as torch's is. Differences from torch that remain: `bernoulli_(p)` with a
float p follows torch's portable kernel; torch on an Intel CPU with MKL draws it from MKL's
stream instead.

cuda and interp draw with Philox4x32-10 in torch's CUDA mapping (kernels/random.py): the
generator there holds torch's CUDA state (seed, philox offset; get_state is its 16 bytes)
and advances as torch's does; inside a captured CUDA graph a draw reads the seed/offset
from a device pair that each replay refills (then the offset advances by the graph's
draws), as torch's graph-safe generator. Bit-identical to torch's CUDA generator (same
seed, offset and SM count): rand/uniform_, randint/random_, bernoulli_(float p); normal_/
randn and exponential_ use libdevice's log/sqrt and the sin/cos approximations curand's
__sincosf uses (matching on the GPU is expected, unverified here; interp differs in ulps).
Not torch-identical (correct and reproducible): bernoulli_(p tensor), randperm (argsort of
random keys), multinomial (exponential races / cumulative-sum search), tensors whose
byte extent exceeds 2**31 (torch splits those launches). poisson, geometric_, cauchy_,
log_normal_ stay cpu-only (NotImplementedError elsewhere).
"""
from __future__ import annotations

import contextlib
import math
import numbers

import numpy as np

from . import dtypes as _dt
from .device import Device, as_device, factory_device
from .ops import _methods, sampling as _sampling
from .tensor import Tensor, broadcast_shapes, normalize_size

__all__ = ["Generator", "default_generator", "manual_seed", "seed", "initial_seed",
           "get_rng_state", "set_rng_state", "fork_rng", "rand", "randn", "randint",
           "randperm", "normal", "bernoulli", "multinomial", "poisson", "rand_like",
           "randn_like", "randint_like"]

DEFAULT_SEED = _sampling.DEFAULT_SEED      # torch's default_rng_seed_val
_N = 624
_U32, _U64 = np.uint32, np.uint64
_F32 = np.float32
_FLOATS = ("float16", "bfloat16", "float32", "float64")
_DIGITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}   # std::numeric_limits<T>::digits


# ------------------------------------------------------------------------------- the engine
def _const(v, n=623):
    # ufuncs take a same-length array operand much faster than a NumPy scalar
    return np.full(n, v, _U32)


_UPPER, _LOWER, _ONE, _MATRIX = (_const(v) for v in (0x80000000, 0x7FFFFFFF, 1, 0x9908B0DF))
_TEMPER_CHUNK = 1 << 16                 # tempering in cache-sized pieces


def _advance(buf: np.ndarray):
    """Fill buf[624:] with the raw MT19937 words that follow the state buf[:624].

    As one sequence the twist is x[j] = x[j-227] ^ f(x[j-624], x[j-623]): f of a run of
    623 words reads only earlier words, and the x[j-227] chain inside the run is three
    slices of at most 227, each reading words already final."""
    f, t = np.empty(623, _U32), np.empty(623, _U32)
    band, bxor = np.bitwise_and, np.bitwise_xor
    n = buf.size
    for j in range(624, n, 623):
        w = min(623, n - j)
        fw, tw, v = f[:w], t[:w], buf[j - 623:j - 623 + w]
        band(buf[j - 624:j - 624 + w], _UPPER[:w], out=fw)
        band(v, _LOWER[:w], out=tw)
        np.bitwise_or(fw, tw, out=fw)
        np.right_shift(fw, _ONE[:w], out=fw)
        band(v, _ONE[:w], out=tw)
        np.multiply(tw, _MATRIX[:w], out=tw)
        bxor(fw, tw, out=fw)
        for k in range(0, w, 227):
            e = min(k + 227, w)
            bxor(buf[j + k - 227:j + e - 227], fw[k:e], out=buf[j + k:j + e])


def _temper(x: np.ndarray):
    """MT19937's tempering, in place."""
    t = np.empty(min(x.size, _TEMPER_CHUNK), _U32)
    for k in range(0, x.size, _TEMPER_CHUNK):
        y = x[k:k + _TEMPER_CHUNK]
        s = t[:y.size]
        np.right_shift(y, _U32(11), out=s)
        y ^= s
        np.left_shift(y, _U32(7), out=s)
        s &= _U32(0x9D2C5680)
        y ^= s
        np.left_shift(y, _U32(15), out=s)
        s &= _U32(0xEFC60000)
        y ^= s
        np.right_shift(y, _U32(18), out=s)
        y ^= s


class _MT19937:
    """torch's at::mt19937: `state` is its 624-word block, `left`/`next` its counters (a
    draw twists when --left reaches 0, then reads state[next++]); many twists per call."""

    __slots__ = ("seed", "state", "left", "next")

    def __init__(self, seed: int):
        s = np.empty(_N, _U32)
        x = seed & 0xFFFFFFFF
        s[0] = x
        for j in range(1, _N):
            x = (1812433253 * (x ^ (x >> 30)) + j) & 0xFFFFFFFF
            s[j] = x
        self.seed, self.state, self.left, self.next = seed, s, 1, 0

    def copy(self) -> "_MT19937":
        e = object.__new__(_MT19937)
        e.seed, e.state, e.left, e.next = self.seed, self.state.copy(), self.left, self.next
        return e

    def u32(self, n: int) -> np.ndarray:
        r = min(n, self.left - 1)         # words left in the current block
        nx = self.next
        self.next, self.left = nx + r, self.left - r
        if r == n:
            out = self.state[nx:nx + r].copy()
        else:
            twists = -(-(n - r) // _N)
            buf = np.empty(_N * (twists + 1), _U32)
            buf[:_N] = self.state
            _advance(buf)
            self.state = buf[-_N:].copy()
            used = n - r - _N * (twists - 1)
            self.next, self.left = used, _N + 1 - used
            # the block's unread words run on into the new ones when it was read in order
            out = buf[nx:_N + n - r] if nx + r == _N else \
                np.concatenate([buf[nx:nx + r], buf[_N:_N + n - r]])
        _temper(out)
        return out

    def u64(self, n: int) -> np.ndarray:
        return _chunked(_pairs_u64, self.u32(2 * n).view(_U64), _U64)

    def uniform_f32(self, n: int) -> np.ndarray:     # uniform_real_distribution<float>(0, 1)
        return _chunked(_uniform_f32, self.u32(n), _F32)

    def uniform_f64(self, n: int) -> np.ndarray:     # uniform_real_distribution<double>(0, 1)
        return _chunked(_uniform_f64, self.u32(2 * n).view(_U64), np.float64)


_CHUNK = 1 << 14     # elements a transform takes at a time: its temporaries stay in cache


def _chunked(fn, x, dtype, *args):
    """fn(x[k:k + _CHUNK], *args) for each piece of x, gathered (_CHUNK is a multiple of 16:
    the Box-Muller blocks stay whole)."""
    out = np.empty(x.shape[0], dtype)
    for k in range(0, x.shape[0], _CHUNK):
        out[k:k + _CHUNK] = fn(x[k:k + _CHUNK], *args)
    return out


def _pairs_u64(w):
    # (first << 32) | second: each little-endian pair of words read as one uint64, swapped
    return (w << _U64(32)) | (w >> _U64(32))


def _uniform_f32(w):
    return (w & _U32(0xFFFFFF)).view(np.int32).astype(_F32) * _F32(2.0 ** -24)


def _uniform_f64(w):
    w = _pairs_u64(w)
    w &= _U64((1 << 53) - 1)
    return w.view(np.int64).astype(np.float64) * (2.0 ** -53)


# ------------------------------------------------------------------ exact float arithmetic
def _round_odd_sum(a, b):
    """a + b (float64) rounded to odd: exact when rounded again to fewer than 52 bits."""
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    nudge = (err != 0) & ((s.view(np.int64) & 1) == 0) & np.isfinite(s)
    return np.where(nudge, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)


def _f64(x):
    return x if getattr(x, "dtype", None) == np.float64 else np.asarray(x, np.float64)


_MIDPOINT = np.int64(-1 << 63)      # a float64 whose 29 bits below float32's are 1000...0
_TINY32 = _F32(2.0 ** -125)


def _fma32(a, b, c):
    """float32 fused multiply-add: the product is exact in float64, the sum rounded once.

    Rounding the float64 sum to float32 rounds twice; that differs from one rounding only
    where the float64 sum lands on a float32 midpoint (or in float32's subnormal range), so
    only those elements take the round-to-odd sum. The operands are converted to float64
    first: NumPy's mixed float32/float64 loops are several times slower."""
    p = _f64(a) * _f64(b)
    c = _f64(c)
    s = p + c
    r = s.astype(_F32)
    if np.any((s.view(np.int64) << 35) == _MIDPOINT) or np.any(np.abs(r) < _TINY32):
        slow = ((s.view(np.int64) << 35) == _MIDPOINT) | (np.abs(r) < _TINY32)
        r = np.asarray(r)
        r[slow] = _round_odd_sum(p[slow], np.broadcast_to(c, p.shape)[slow]).astype(_F32)
    return r


def _two_prod(a, b):
    p = a * b
    sa = a * 134217729.0
    ah = sa - (sa - a)
    al = a - ah
    sb = b * 134217729.0
    bh = sb - (sb - b)
    bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _fma64(a, b, c):
    """float64 fused multiply-add (Boldo-Melquiond: a*b + c summed with round-to-odd)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    c = np.broadcast_to(np.float64(c), np.broadcast(a, b).shape)
    if not np.any(b - 1.0) and not np.any(c):
        return a * b + c
    ph, pl = _two_prod(a, b)
    uh = ph + c
    bb = uh - ph
    ul = (ph - (uh - bb)) + (c - bb)
    return uh + _round_odd_sum(ul, pl)


# ---------------------------------------------- torch's AVX2 Box-Muller (avx_mathfun.h)
def _bits(x):
    return x.view(np.int32)


def _log256(x):
    invalid = x <= 0
    x = np.maximum(x, np.int32(0x00800000).view(_F32))
    e = ((_bits(x) >> 23) - 0x7F).astype(_F32) + _F32(1)
    x = ((_bits(x) & np.int32(~0x7F800000)) | _bits(_F32(0.5))).view(_F32)
    mask = x < _F32(0.707106781186547524)
    tmp = np.where(mask, x, _F32(0))
    x = x - _F32(1)
    e = e - mask.astype(_F32)
    x = x + tmp
    z = x * x
    y, x64 = np.full_like(x, _F32(7.0376836292e-2)), x.astype(np.float64)
    for p in (-1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
              -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1):
        y = _fma32(y, x64, _F32(p))
    y = _fma32(y * x, z, e * _F32(-2.12194440e-4))
    y = _fma32(z, _F32(-0.5), y)
    x = _fma32(e, _F32(0.693359375), x + y)
    return np.where(invalid, _F32(np.nan), x)


def _sincos256(x):
    sign_sin = _bits(x) & np.int32(-0x80000000)
    x = np.abs(x)
    j = (((x * _F32(1.27323954473516)).astype(np.int32)) + 1) & ~1
    y = j.astype(_F32)
    swap_sin = (j & 4) << 29
    poly = (j & 2) == 0
    y = y.astype(np.float64)
    x = _fma32(y, _F32(-0.78515625), x)
    x = _fma32(y, _F32(-2.4187564849853515625e-4), x)
    x = _fma32(y, _F32(-3.77489497744594108e-8), x)
    sign_cos = (~(j - 2) & 4) << 29
    sign_sin = sign_sin ^ swap_sin
    z = x * x
    z64 = z.astype(np.float64)
    yc = _fma32(_F32(2.443315711809948e-005), z64, _F32(-1.388731625493765e-003))
    yc = _fma32(yc, z64, _F32(4.166664568298827e-002))
    yc = _fma32(yc * z, z, -(z * _F32(0.5))) + _F32(1)
    ys = _fma32(_F32(-1.9515295891e-4), z64, _F32(8.3321608736e-3))
    ys = _fma32(ys, z64, _F32(-1.6666654611e-1))
    ys = _fma32(ys * z, x, x)
    sin = np.where(poly, ys, yc)
    cos = np.where(poly, yc, ys)
    return (_bits(sin) ^ sign_sin).view(_F32), (_bits(cos) ^ sign_cos).view(_F32)


def _box_muller16_f32(u, mean, std):
    u = u.reshape(-1, 16)
    radius = np.sqrt(_F32(-2) * _log256(_F32(1) - u[:, :8]))
    s, c = _sincos256(_F32(2.0 * math.pi) * u[:, 8:])
    return np.concatenate([_fma32(radius * c, std, mean), _fma32(radius * s, std, mean)],
                          axis=1).ravel()


def _libm(f, x):
    """The math module's (the process's libm's) f of each element: NumPy's own log, sin and
    cos are vectorised approximations that differ from libm's in the last bit."""
    return np.fromiter(map(f, x.ravel().tolist()), np.float64, x.size).reshape(x.shape)


def _box_muller16_f64(u, mean, std):
    u = u.reshape(-1, 16)
    radius = np.sqrt(-2.0 * _libm(math.log, 1.0 - u[:, :8]))
    theta = 2.0 * math.pi * u[:, 8:]
    c, s = _libm(math.cos, theta), _libm(math.sin, theta)
    return np.concatenate([_fma64(radius * c, std, mean), _fma64(radius * s, std, mean)],
                          axis=1).ravel()


# ---------------------------------------------------------------------------- generators
def _check_seed(seed, op):
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise TypeError(f"{op}: seed must be an int, got {type(seed).__name__}")
    seed = int(seed)
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError(f"{op}: seed must be in [-2**63, 2**64), got {seed}")
    return seed & ((1 << 64) - 1)      # torch reads a negative seed as its two's complement


class Generator(_sampling.Generator):
    """A seeded generator: torch's MT19937 on cpu; on other devices only the sampler's state.

    Generator(device='cpu') as torch; Generator(seed, device=...) is the sampler's older
    spelling of Generator(device).manual_seed(seed). The [seed, step] state that nbx.sample
    reads stays on every generator; get_state/set_state on cpu are torch's 5056-byte layout.
    """

    def __init__(self, *args, device=None):
        seed = DEFAULT_SEED
        if len(args) > 1:
            raise TypeError(f"Generator: expected at most one positional argument, got {args}")
        if args and isinstance(args[0], numbers.Integral) and not isinstance(args[0], bool):
            seed = args[0]                                 # the sampler's Generator(seed, device=)
            if not 0 <= seed < 1 << 63:                    # ... which took [0, 2**63) only
                raise ValueError(f"Generator: seed must be an int in [0, 2**63), got {seed}")
        elif args:
            if device is not None:
                raise TypeError("Generator: device given twice")
            device = args[0]
        device = "cpu" if device is None else device
        self._mt = None
        super().__init__(0, as_device(device))
        self.manual_seed(seed)

    def manual_seed(self, seed):
        seed = _check_seed(seed, "Generator.manual_seed")
        _refuse_in_capture(self, "Generator.manual_seed")
        super().manual_seed(seed & ((1 << 63) - 1))
        self._seed = seed
        if self.device.type == "cpu":
            self._mt = _MT19937(seed)
        self._normal = None            # torch's next_double_normal_sample
        self._normal_f32 = None        # torch's next_float_normal_sample (kept for the state)
        self._offset = 0               # cuda/interp: torch's philox_offset_per_thread
        return self

    def seed(self):
        import secrets      # on use: its hmac/hashlib imports cost milliseconds at import
        s = secrets.randbits(64)
        self.manual_seed(s)
        return s

    def initial_seed(self):
        return self._seed

    def _engine(self, op):
        if self._mt is None:
            raise NotImplementedError(f"{op}: random numbers on {str(self.device)!r} are not "
                                      f"implemented yet")
        return self._mt

    # torch's CPUGeneratorImplState: the legacy pod (seed, left, seeded, next, 624 uint64
    # words, normal_x/y/rho, normal_is_valid), then the float normal sample and its flag
    _STATE = np.dtype([("seed", "<u8"), ("left", "<i4"), ("seeded", "<i4"), ("next", "<u8"),
                       ("state", "<u8", (_N,)), ("normal_x", "<f8"), ("normal_y", "<f8"),
                       ("normal_rho", "<f8"), ("normal_valid", "<i4"), ("_pad", "<i4"),
                       ("float_normal", "<f4"), ("float_valid", "u1"), ("_pad2", "u1", (3,))])

    # cuda/interp: torch's CUDA generator state, seed (uint64) then philox offset (int64)
    _PHILOX_STATE = np.dtype([("seed", "<u8"), ("offset", "<i8")])

    def get_state(self):
        if self.device.type != "cpu":
            from .creation import from_numpy
            st = np.zeros((), self._PHILOX_STATE)
            st["seed"], st["offset"] = self._seed, self._offset
            return from_numpy(np.frombuffer(st.tobytes(), np.uint8).copy())
        from .creation import from_numpy
        mt = self._mt
        st = np.zeros((), self._STATE)
        st["seed"], st["left"], st["seeded"], st["next"] = mt.seed, mt.left, 1, mt.next
        st["state"] = mt.state
        if self._normal is not None:
            st["normal_y"], st["normal_valid"] = self._normal, 1
        if self._normal_f32 is not None:
            st["float_normal"], st["float_valid"] = self._normal_f32, 1
        return from_numpy(np.frombuffer(st.tobytes(), np.uint8).copy())

    def set_state(self, new_state):
        if self.device.type != "cpu":
            return self._set_philox_state(new_state)
        if not isinstance(new_state, Tensor) or new_state.dtype is not _dt.uint8 \
                or tuple(new_state.shape) != (self._STATE.itemsize,):
            got = (f"{new_state.dtype.name} tensor of shape {tuple(new_state.shape)}"
                   if isinstance(new_state, Tensor) else type(new_state).__name__)
            raise ValueError(f"Generator.set_state: expected a uint8 tensor of shape "
                             f"({self._STATE.itemsize},) from get_state(), got {got}")
        st = np.frombuffer(new_state.cpu().numpy().tobytes(), self._STATE)[0]
        left, nxt = int(st["left"]), int(st["next"])
        if not (st["seeded"] and 0 < left <= _N and nxt <= _N):
            raise ValueError("Generator.set_state: invalid mt19937 state")
        mt = object.__new__(_MT19937)
        mt.seed, mt.left, mt.next = int(st["seed"]), left, nxt
        mt.state = st["state"].astype(_U32)
        self._mt = mt
        self._seed = mt.seed
        self._normal = float(st["normal_y"]) if st["normal_valid"] else None
        self._normal_f32 = _F32(st["float_normal"]) if st["float_valid"] else None
        return self

    def _set_philox_state(self, new_state):
        n = self._PHILOX_STATE.itemsize
        if not isinstance(new_state, Tensor) or new_state.dtype is not _dt.uint8 \
                or tuple(new_state.shape) not in ((n,), (8,)):
            got = (f"{new_state.dtype.name} tensor of shape {tuple(new_state.shape)}"
                   if isinstance(new_state, Tensor) else type(new_state).__name__)
            raise ValueError(f"Generator.set_state: expected a uint8 tensor of shape ({n},) "
                             f"(seed, offset) or (8,) (seed) from get_state(), got {got}")
        _refuse_in_capture(self, "Generator.set_state")
        raw = new_state.cpu().numpy().tobytes() + bytes(n - new_state.shape[0])
        st = np.frombuffer(raw, self._PHILOX_STATE)[0]
        offset = int(st["offset"])
        if offset < 0 or offset % 4:
            raise ValueError(f"Generator.set_state: the philox offset must be a multiple of 4 "
                             f"and >= 0, got {offset}")
        seed = int(st["seed"])
        super().manual_seed(seed & ((1 << 63) - 1))
        self._seed, self._offset = seed, offset
        return self

    def _philox(self, increment):
        """(pair, seed, offset) for one draw, advancing the generator by `increment` (torch's
        philox_cuda_state). Eager: pair None, the seed as a signed int64 and the offset.
        While a CUDA graph is captured: an int64 [seed, offset] device tensor that a replay
        prologue fills with the generator's state (and then advances it by the graph's
        whole increment), and the draw's offset within the graph."""
        if self.device.type == "cuda":
            from .backends.cuda import graphs
            cg = graphs.capturing_graph()
            if cg is not None:
                return self._captured(cg, increment)
        off = self._offset
        self._offset += increment
        return None, _signed64(self._seed), off

    def _captured(self, cg, increment):
        reg = getattr(self, "_capture_reg", None)
        if reg is None or reg[0] is not cg._replay_hooks:
            from .kernels import random as _kr
            pair = Tensor._empty((2,), _dt.int64, self.device)    # from the graph's pool
            used = [0]

            def prologue():
                _kr.set_pair(pair, _signed64(self._seed), self._offset)
                self._offset += used[0]

            cg._replay_hooks.append(prologue)
            reg = self._capture_reg = (cg._replay_hooks, pair, used)
        _, pair, used = reg
        off = used[0]
        used[0] += increment
        return pair, 0, off

    def __repr__(self):
        return f"Generator(device={str(self.device)!r}, initial_seed={self._seed})"


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _refuse_in_capture(g, what):
    if g.device.type == "cuda":
        from .backends.cuda import graphs
        if graphs.capturing_graph() is not None:
            raise graphs.CaptureError(f"{what}: a cuda generator cannot be reseeded or have "
                                      f"its state set while a CUDA graph is captured")


default_generator = Generator("cpu")
_sampling._DEFAULT["cpu"] = default_generator   # nbx.sample on cpu draws from the same default


_SEED_ALL = [None]    # the last manual_seed: devices whose default generator comes later


def manual_seed(seed):
    """Seed the default generator of every device (torch.manual_seed); returns cpu's.

    As torch's (which queues the cuda seeding for devices not yet initialised), a device
    whose default generator is made later starts from this seed too."""
    seed = _check_seed(seed, "manual_seed")
    _SEED_ALL[0] = seed
    for g in list(_sampling._DEFAULT.values()):
        g.manual_seed(seed if isinstance(g, Generator) else seed & ((1 << 63) - 1))
    return default_generator


def default_generator_for(device) -> "Generator":
    """The default generator of `device` (torch.cuda.default_generators[i]); cpu's is
    `default_generator`. nbx.sample on that device draws from the same object."""
    dev = as_device(device)
    key = str(dev)
    g = _sampling._DEFAULT.get(key)
    if not isinstance(g, Generator):
        new = Generator(device=dev)
        new.manual_seed(DEFAULT_SEED if _SEED_ALL[0] is None else _SEED_ALL[0])
        if g is not None:             # the sampler made one first: keep its stream in step
            new.state.copy_(g.state)
        g = _sampling._DEFAULT[key] = new
    return g


def seed():
    s = default_generator.seed()
    manual_seed(s)
    return s


def initial_seed():
    return default_generator.initial_seed()


def get_rng_state():
    return default_generator.get_state()


def set_rng_state(new_state):
    default_generator.set_state(new_state)


@contextlib.contextmanager
def fork_rng(devices=None, enabled=True):
    """Restore the cpu default generator (and each given device's) on exit (torch's fork_rng)."""
    if not enabled:
        yield
        return
    gens = [default_generator] + [default_generator_for(d)
                                  for d in (devices or ()) if as_device(d).type != "cpu"]
    saved = [g.get_state() for g in gens]
    try:
        yield
    finally:
        for g, s in zip(gens, saved):
            g.set_state(s)


# ------------------------------------------------------------------------------ plumbing
def _gen(generator, op, device=None):
    if generator is None:
        if device is not None and device.type != "cpu":
            return default_generator_for(device)
        return default_generator
    if not isinstance(generator, Generator):
        raise TypeError(f"{op}: generator must be an nbx.Generator, got "
                        f"{type(generator).__name__}")
    return generator


def _cpu_only(device, op):
    d = as_device(device)
    if d.type != "cpu":
        raise NotImplementedError(f"{op}: random numbers on {str(d)!r} are not implemented yet")
    return d


def _device_ok(device, op):
    d = as_device(device)
    if d.type not in ("cpu", "cuda", "interp"):
        raise NotImplementedError(f"{op}: random numbers on {str(d)!r} are not implemented")
    return d


def _engine_for(t: Tensor, generator, op):
    """(generator, its MT19937 engine) for a cpu tensor; (generator, None) on cuda/interp,
    where the Philox kernels draw (see _device_draw)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: self must be a Tensor, got {type(t).__name__}")
    _device_ok(t.device, op)
    g = _gen(generator, op, t.device)
    if g.device != t.device:
        raise ValueError(f"{op}: generator is on {g.device} but the tensor is on {t.device}")
    return g, (g._engine(op) if t.device.type == "cpu" else None)


def _device_draw(t: Tensor, g, kind, wide, a=0, b=0, c=0, aux=None):
    """Fill `t` (cuda/interp) with one Philox draw in torch's CUDA mapping: the elements in
    memory order (TensorIterator's), through a contiguous buffer when `t` is strided.
    aux (bernoulli's p) must already be laid out as that buffer."""
    from .kernels import random as _kr
    n = t.numel()
    if n == 0:
        return t
    T, R, inc = _kr.policy(n, 2 if wide else 4, t.device)
    pair, seed, off = g._philox(inc)
    buf, perm = t, None
    if not t.is_contiguous():
        perm = _order_perm(t) or list(range(t.ndim))
        buf = Tensor._empty(tuple(t.shape[d] for d in perm), t.dtype, t.device)
    _kr.draw(buf, kind, wide, T, R, seed, off, pair=pair, aux=aux, a=a, b=b, c=c)
    if perm is not None:
        t.permute(*perm).copy_(buf)
    return t


def _f64b(v) -> int:
    """A float kernel parameter: its float64 bits (exact for float32/float16 values too)."""
    from .kernels._host import f64_bits
    return f64_bits(float(v))


def _cpu_engine(t, generator, op):
    g, mt = _engine_for(t, generator, op)
    if mt is None:
        raise NotImplementedError(f"{op}: not implemented on {t.device} (cpu only)")
    return g, mt


def _float_dtype(dtype, op, argname="dtype"):
    d = _dt.get_default_dtype() if dtype is None else dtype
    if not isinstance(d, _dt.DType) or d.name not in _FLOATS:
        raise TypeError(f"{op}: {argname} must be float16, bfloat16, float32 or float64, got "
                        f"{getattr(d, 'name', d)!r}")
    return d


def _order_perm(t: Tensor):
    """The dims of `t` in the order TensorIterator walks them (memory order), or None."""
    if t.ndim > 1 and not t.is_contiguous():
        return sorted(range(t.ndim), key=lambda d: -abs(t.stride(d)))
    return None


def _memory_order(t: Tensor):
    """The NumPy view of `t` with its dims in TensorIterator's order."""
    perm = _order_perm(t)
    a = t._host_view()
    return a if perm is None else a.transpose(perm)


def _write(t: Tensor, values: np.ndarray) -> Tensor:
    a = _memory_order(t)
    a[...] = values.reshape(a.shape).astype(a.dtype, copy=False)
    return t


def _scalar(x, op, argname):
    if not isinstance(x, numbers.Real) or isinstance(x, bool):
        raise TypeError(f"{op}: {argname} must be a number, got {type(x).__name__}")
    return float(x)


def _positive(x, op, argname, shown=None):
    """_scalar(x), refused unless > 0 with torch's message (which names it `shown`)."""
    x = _scalar(x, op, argname)
    if not x > 0:
        shown = shown or argname
        raise ValueError(f"{op}: expects {shown} > 0.0, but found {shown}={x}")
    return x


def _normal_f64(g, mt, n, mean, std):
    """n draws of torch's scalar normal_distribution<double> (cached second value)."""
    out = []
    if n and g._normal is not None:
        out.append(g._normal)
        g._normal = None
    pairs = (n - len(out) + 1) // 2
    u = mt.uniform_f64(2 * pairs).reshape(-1, 2)
    r = np.sqrt(-2.0 * np.array(list(map(math.log1p, (-u[:, 1]).tolist()))))
    theta = (2.0 * math.pi * u[:, 0]).tolist()
    vals = np.empty(2 * pairs)
    vals[0::2] = r * np.array(list(map(math.cos, theta)))
    vals[1::2] = r * np.array(list(map(math.sin, theta)))
    if (n - len(out)) % 2:
        g._normal = float(vals[-1])
        vals = vals[:-1]
    raw = np.concatenate([np.array(out, np.float64), vals])
    return _fma64(raw, std, mean)


# ------------------------------------------------------------------------ Tensor methods
def uniform_(self, from_=0.0, to=1.0, *, generator=None):
    op = "uniform_"
    g, mt = _engine_for(self, generator, op)
    d = _float_dtype(self.dtype, op, "self")
    lo, hi = _scalar(from_, op, "from"), _scalar(to, op, "to")
    fi = _dt.finfo(d)
    for name, v in (("from", lo), ("to", hi)):
        if not fi.min <= v <= fi.max:
            raise ValueError(f"{op}: {name}={v} is out of bounds for {d.name}")
    if not lo <= hi:
        raise ValueError(f"{op}: expects a [from, to) range, but got from={lo} > to={hi}")
    if hi - lo > fi.max:
        raise ValueError(f"{op}: to - from must be <= {d.name}'s max, got to={hi}, from={lo}")
    n = self.numel()
    if mt is None:
        return _uniform_device(self, g, d, lo, hi)
    if d.name == "float64":
        v = _chunked(_uniform_to_f64, mt.u32(2 * n).view(_U64), np.float64, lo, hi)
    else:
        v = _chunked(_uniform_to_f32, mt.u32(n), d.np, lo, hi, d.np)
    return _write(self, v)


def _uniform_to_f64(w, lo, hi):
    v = _fma64(_uniform_f64(w), hi - lo, lo)
    return np.where(v == hi, lo, v)


def _uniform_to_f32(w, lo, hi, dt):
    lo32, hi32 = _F32(lo), _F32(hi)
    x = _uniform_f32(w)
    # one rounding either way where the fused multiply-add has nothing to fuse
    v = x * hi32 if lo32 == 0 else x + lo32 if hi32 - lo32 == 1 else _fma32(x, hi32 - lo32, lo32)
    v = v.astype(dt, copy=False)
    return np.where(v == np.asarray(hi, dt), np.asarray(lo, dt), v)


def _uniform_device(t, g, d, lo, hi):
    from .kernels import random as _kr
    if d.name == "float64":
        rng, f, to = hi - lo, lo, hi
    else:
        # torch: from/to cast to the dtype, range = (to - from) computed in the dtype
        f, to = np.asarray(lo, d.np), np.asarray(hi, d.np)
        rng = (np.asarray(to, _F32) - np.asarray(f, _F32)).astype(d.np).astype(_F32)
    return _device_draw(t, g, _kr.UNIFORM, d.name == "float64", _f64b(rng), _f64b(f), _f64b(to))


def normal_(self, mean=0.0, std=1.0, *, generator=None):
    op = "normal_"
    g, mt = _engine_for(self, generator, op)
    d = _float_dtype(self.dtype, op, "self")
    mean, std = _scalar(mean, op, "mean"), _scalar(std, op, "std")
    if not std >= 0:
        raise ValueError(f"{op}: expects std >= 0.0, but found std {std}")
    n = self.numel()
    if mt is None:
        from .kernels import random as _kr
        wide = d.name == "float64"
        if not wide:
            mean, std = _F32(mean), _F32(std)
        return _device_draw(self, g, _kr.NORMAL, wide, _f64b(std), _f64b(mean))
    if n >= 16 and self.is_contiguous():
        if d.name == "float64":
            uni, fill = mt.uniform_f64, _box_muller16_f64
        else:
            uni, fill = mt.uniform_f32, _box_muller16_f32
            mean, std = _F32(mean), _F32(std)
        v = np.empty(n, np.float64 if d.name == "float64" else _F32)
        k = n // 16 * 16
        # float32/float64 draw all n uniforms in place first; float16/bfloat16 draw 16 per
        # whole block into a buffer. Then a tail recomputes the last 16 from 16 fresh uniforms
        u = uni(n if d.name in ("float32", "float64") else k)
        v[:k] = _chunked(fill, u[:k], v.dtype, mean, std)
        if n % 16:
            v[n - 16:] = fill(uni(16), mean, std)
        return _write(self, v.astype(d.np))
    return _write(self, _normal_f64(g, mt, n, mean, std).astype(d.np))


def _random_values(mt, n, rng, base, dtype):
    """torch's uniform_int_from_to_distribution: (word % range) + base, as int64."""
    wide = rng >= (1 << 28)     # torch takes random64 from 2**28 on (a % skew of at most ~5%)
    w = mt.u64(n) if wide else mt.u32(n).astype(_U64)
    return ((w % _U64(rng)) + _U64(base & ((1 << 64) - 1))).view(np.int64)


def _to_dtype(v: np.ndarray, d):
    if d.name == "bool":
        return v != 0
    if d.name in ("float16", "bfloat16"):
        return v.astype(_F32).astype(d.np)
    return v.astype(d.np)


def _checked_range(d, from_, to, op):
    """random_'s (from, to), refused as torch refuses them: to=None (the full 64-bit range)
    only for the dtypes that hold it, else ints with from < to inside d's range."""
    if from_ is None:
        return None, None
    if to is None:
        if d.name not in ("int64", "float64", "float32", "bfloat16"):
            raise TypeError(f"{op}: the full 64-bit range needs int64, float64, float32 or "
                            f"bfloat16, got {d.name}")
        return from_, None
    from_, to = int(from_), int(to)
    if not from_ < to:
        raise ValueError(f"{op}: expects 'from' to be less than 'to', but got from={from_} "
                         f">= to={to}")
    lo, hi = _int_bounds(d)
    if not (lo <= from_ <= hi and lo <= to - 1 <= hi):
        raise ValueError(f"{op}: [from, to) = [{from_}, {to}) is out of bounds for {d.name}")
    return from_, to


def _int_bounds(d):
    if d.name == "bool":
        return 0, 1
    if d.is_floating_point:
        m = 1 << _DIGITS[d.name]
        return -m, m
    info = _dt.iinfo(d)
    return info.min, info.max


def random_(self, from_=None, to=None, *, generator=None):
    op = "random_"
    g, mt = _engine_for(self, generator, op)
    d = self.dtype
    if d.is_float8:
        raise TypeError(f"{op}: self must not be {d.name}")
    for name, v in (("from", from_), ("to", to)):
        if v is not None and (not isinstance(v, numbers.Integral) or isinstance(v, bool)):
            raise TypeError(f"{op}: {name} must be an int, got {type(v).__name__}")
    n = self.numel()
    if from_ is not None and to is None and from_ != -(1 << 63):   # random_(to) is random_(0, to)
        from_, to = 0, from_
    from_, to = _checked_range(d, from_, to, op)
    if mt is None:
        return _random_device(self, g, d, from_, to)
    if from_ is None:                   # torch's uniform_int_distribution
        if d.name == "bool":
            v = mt.u32(n) & _U32(1)
        elif d.name == "int64":
            v = mt.u64(n) % _U64(1 << 63)
        elif d.name == "float64":
            v = mt.u64(n) % _U64((1 << 53) + 1)
        elif d.is_floating_point:
            v = mt.u32(n).astype(_U64) % _U64((1 << _DIGITS[d.name]) + 1)
        else:
            v = mt.u32(n).astype(_U64) % _U64(_dt.iinfo(d).max + 1)
        return _write(self, _to_dtype(v.astype(np.int64), d))
    if to is None:                      # from = int64 min: the full 64-bit range
        return _write(self, _to_dtype(mt.u64(n).view(np.int64), d))
    return _write(self, _to_dtype(_random_values(mt, n, to - from_, from_, d), d))


def _random_device(t, g, d, from_, to):
    """torch's random_kernel / random_from_to_kernel / random_full_64_bits_range_kernel:
    word % range + base, 64-bit words for int64/float64 (random_()) or a range >= 2**28."""
    from .kernels import random as _kr
    if from_ is None:
        if d.name == "bool":
            rng = 2
        elif d.name == "int64":
            rng = 1 << 63
        elif d.is_floating_point:
            rng = (1 << _DIGITS[d.name]) + 1
        else:
            rng = _dt.iinfo(d).max + 1
        return _device_draw(t, g, _kr.RANDINT, d.name in ("int64", "float64"),
                            _signed64(rng), 0)
    if to is None:
        return _device_draw(t, g, _kr.FULL64, True)
    rng = to - from_
    return _device_draw(t, g, _kr.RANDINT, rng >= _kr.WIDE_FROM, _signed64(rng), from_)


def bernoulli_(self, p=0.5, *, generator=None):
    op = "bernoulli_"
    g, mt = _engine_for(self, generator, op)
    if self.dtype.is_float8:
        raise TypeError(f"{op}: self must not be {self.dtype.name}")
    n = self.numel()
    if isinstance(p, Tensor):
        _check_p_tensor(p, self, op)
        if mt is None:
            return _bernoulli_tensor_device(self, g, p, op)
        _cpu_only(p.device, op)
        pa = np.broadcast_to(p.numpy(), tuple(self.shape))
        if not np.all((pa >= 0) & (pa <= 1)):
            raise ValueError(f"{op}: p must be in [0, 1] (and not NaN)")
        perm = _order_perm(self)
        if perm is not None:
            pa = pa.transpose(perm)
        # a float64 p draws double uniforms; any other p float uniforms (24 bits)
        u = mt.uniform_f64(n) if p.dtype.name == "float64" else mt.uniform_f32(n)
        return _write(self, u < pa.astype(u.dtype).ravel())
    p = _scalar(p, op, "p")
    if not 0 <= p <= 1:
        raise ValueError(f"{op}: expects p to be in [0, 1], but got p={p}")
    if mt is None:
        from .kernels import random as _kr
        return _device_draw(self, g, _kr.BERNOULLI, self.dtype.name == "float64", _f64b(p))
    return _write(self, mt.uniform_f64(n) < p)


def _check_p_tensor(p, t, op):
    """bernoulli_'s tensor p: a float dtype, broadcasting to t's shape (every device)."""
    if not p.dtype.is_floating_point or p.dtype.is_float8:
        raise TypeError(f"{op}: p must be a float16/bfloat16/float32/float64 tensor, got "
                        f"{p.dtype.name}")
    try:
        ok = broadcast_shapes(tuple(p.shape), tuple(t.shape)) == t.shape
    except (ValueError, RuntimeError):
        ok = False
    if not ok:
        raise ValueError(f"{op}: p of shape {tuple(p.shape)} does not broadcast to "
                         f"{tuple(t.shape)}")


def _bernoulli_tensor_device(t, g, p, op):
    """u <= p[i] (torch's bernoulli_tensor_cuda_kernel compares so), p as float32 (float64
    for a float64 self) on t's device, one uniform an element in the nullary mapping
    (torch draws this one with another thread layout: not torch-identical)."""
    from .kernels import random as _kr
    wide = t.dtype.name == "float64"
    pa = p.to(t.device).to(_dt.float64 if wide else _dt.float32).expand(*t.shape)
    perm = _order_perm(t)
    if perm is not None:
        pa = pa.permute(*perm)
    pa = pa.contiguous()
    if pa.numel() and not bool(((pa >= 0) & (pa <= 1)).all().item()):
        raise ValueError(f"{op}: p must be in [0, 1] (and not NaN)")
    return _device_draw(t, g, _kr.BERNOULLI_T, wide, aux=pa)


def _map(f, x):
    return np.array(list(map(f, x.tolist())), np.float64)


def _continuous(self, generator, op, cpu_only=False):
    """(the cpu engine or None on a device, the float dtype); cpu_only: refuse devices."""
    g, mt = _engine_for(self, generator, op)
    _sampling.check_draw_dtype(self, "self", op)
    d = self.dtype
    if cpu_only and mt is None:
        raise NotImplementedError(f"{op}: not implemented on {self.device} (cpu only)")
    return mt, d


def exponential_(self, lambd=1.0, *, generator=None):
    op = "exponential_"
    mt, d = _continuous(self, generator, op)
    lambd = _positive(lambd, op, "lambd", "lambda")
    if mt is None:
        from .kernels import random as _kr
        wide = d.name == "float64"
        a = -1.0 / lambd if wide else _F32(-1.0) / _F32(lambd)
        return _device_draw(self, _gen(generator, op, self.device), _kr.EXPONENTIAL, wide, _f64b(a))
    u = mt.uniform_f64(self.numel())
    return _write(self, ((-1.0 / lambd) * _map(math.log1p, -u)).astype(d.np))


def geometric_(self, p, *, generator=None):
    op = "geometric_"
    g, mt = _cpu_engine(self, generator, op)
    if self.dtype.is_float8 or self.dtype.name == "bool":
        raise TypeError(f"{op}: self must not be {self.dtype.name}")
    p = _scalar(p, op, "p")
    if not 0 < p < 1:
        raise ValueError(f"{op}: expects p to be in (0, 1), but got p={p}")
    u = mt.uniform_f64(self.numel())
    v = np.ceil(_map(_log, u) / math.log1p(-p))
    return _write(self, _to_dtype(v, self.dtype) if not self.dtype.is_floating_point
                  else v.astype(self.dtype.np))


def _log(x):
    return math.log(x) if x > 0 else -math.inf


def cauchy_(self, median=0.0, sigma=1.0, *, generator=None):
    op = "cauchy_"
    mt, d = _continuous(self, generator, op, cpu_only=True)
    median, sigma = _scalar(median, op, "median"), _positive(sigma, op, "sigma")
    u = mt.uniform_f64(self.numel())
    # median + sigma * tan(...): one fused multiply-add, as the compiled kernel has it
    return _write(self, _fma64(_map(math.tan, math.pi * (u - 0.5)), sigma, median).astype(d.np))


def log_normal_(self, mean=1.0, std=2.0, *, generator=None):
    op = "log_normal_"
    mt, d = _continuous(self, generator, op, cpu_only=True)
    mean, std = _scalar(mean, op, "mean"), _positive(std, op, "std")
    g = _gen(generator, op)
    z = _normal_f64(g, mt, self.numel(), mean, std)
    return _write(self, _map(_exp, z).astype(d.np))


def _exp(x):
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


# ----------------------------------------------------------------------------- functions
def _new(size, dtype, device, op):
    shape = normalize_size(size)
    dev = _device_ok(factory_device(device), op)
    return Tensor._empty(shape, dtype, dev)


def rand(*size, generator=None, dtype=None, device=None):
    t = _new(size, _float_dtype(dtype, "rand"), device, "rand")
    return uniform_(t, 0.0, 1.0, generator=generator)


def randn(*size, generator=None, dtype=None, device=None):
    t = _new(size, _float_dtype(dtype, "randn"), device, "randn")
    return normal_(t, 0.0, 1.0, generator=generator)


def randint(low, high=None, size=None, *, generator=None, dtype=None, device=None):
    """randint(high, size) or randint(low, high, size): torch's random_(low, high), int64."""
    if size is None and isinstance(high, (tuple, list)):
        low, high, size = 0, low, high
    if size is None:
        raise TypeError("randint: size must be given (a tuple of ints)")
    for name, v in (("low", low), ("high", high)):
        if not isinstance(v, numbers.Integral) or isinstance(v, bool):
            raise TypeError(f"randint: {name} must be an int, got {type(v).__name__}")
    if not low < high:
        raise ValueError(f"randint: expects low < high, but got low={low} >= high={high}")
    d = _dt.int64 if dtype is None else dtype
    t = _new(size, d, device, "randint")
    return random_(t, int(low), int(high), generator=generator)


_RANDPERM_MAX = (1 << 32) // 20     # torch switches to another algorithm above this n


def randperm(n, *, generator=None, dtype=None, device=None):
    op = "randperm"
    if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 0:
        raise ValueError(f"{op}: n must be an int >= 0, got {n!r}")
    n = int(n)
    d = _dt.int64 if dtype is None else dtype
    if d.is_float8 or d.name == "bool":
        raise TypeError(f"{op}: dtype {d.name} is not supported")
    lo, hi = _int_bounds(d)
    if n and n - 1 > hi + (1 if d.is_floating_point else 0):
        raise ValueError(f"{op}: n={n} is too large for {d.name}")
    if n >= _RANDPERM_MAX:
        raise NotImplementedError(f"{op}: n >= {_RANDPERM_MAX} (torch's second algorithm) is "
                                  f"not implemented")
    t = _new((n,), d, device, op)
    g = _gen(generator, op, t.device)
    if t.device.type != "cpu":
        return _randperm_device(t, g, n, op)
    mt = g._engine(op)
    j = np.arange(n, dtype=np.int64)
    if n > 1:
        j[:-1] += mt.u32(n - 1).astype(np.int64) % np.arange(n, 1, -1)
    return _write(t, _fisher_yates(j).astype(d.np))


def _fisher_yates(j):
    """The permutation `for i: swap(p[i], p[j[i]])` (j[i] >= i) makes of p = arange(n),
    without the sequential loop.

    Step i writes p[i] (final) from position j[i] and moves into j[i] what position i held
    when step i came, c[i]. A position's content is its own index until a step targets it,
    then the c of the last step that did. So p[i] = c[q] with q the last step before i
    with target j[i] (else j[i]); c[i] = c[r] with r the last step before i with target i
    (else i): a forest whose roots pointer doubling finds."""
    n = j.size
    if n < 2:
        return j
    key = np.sort(j * n + np.arange(n, dtype=np.int64))    # by target, then step (unique)
    it = np.int32 if n < 1 << 31 else np.int64  # narrower indices: half the memory traffic
    tgt = (key // n).astype(it)
    step = (key % n).astype(it)
    idx = np.arange(n, dtype=it)
    same = tgt[1:] == tgt[:-1]
    q = np.full(n, -1, it)                      # the previous step with the same target
    q[step[1:][same]] = step[:-1][same]
    last = np.flatnonzero(np.append(~same, True))   # each target's last step
    r = idx.copy()
    lt, ls = tgt[last], step[last]
    r[lt] = np.where(ls != lt, ls, np.where(q[ls] >= 0, q[ls], lt))
    while True:                                 # r[i] -> the root of i's chain
        r2 = r[r]
        if np.array_equal(r2, r):
            break
        r = r2
    return np.where(q >= 0, r[q], j).astype(np.int64)


def _randperm_device(t, g, n, op):
    """A uniform permutation: argsort of n random 64-bit keys (stable, so a tie, which has
    probability ~n**2 / 2**65, still yields a permutation). torch's CUDA randperm sorts
    random keys too, with another key layout: reproducible, not torch-identical."""
    from .ops.reduction import argsort
    if g.device != t.device:
        raise ValueError(f"{op}: generator is on {g.device} but device is {t.device}")
    if n == 0:
        return t
    keys = Tensor._empty((n,), _dt.int64, t.device)
    random_(keys, -(1 << 63), None, generator=g)
    return t.copy_(argsort(keys, stable=True).to(t.dtype))


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None):
    op = "normal"
    mt_, st_ = isinstance(mean, Tensor), isinstance(std, Tensor)
    if not mt_ and not st_:
        if size is None:
            raise TypeError(f"{op}: with float mean and std, size must be given")
        t = _new(size, _float_dtype(dtype, op), device, op)
        return normal_(t, mean, std, generator=generator)
    if size is not None:
        raise TypeError(f"{op}: size is only for float mean and std")
    ref = mean if mt_ else std
    _device_ok(ref.device, op)
    d = _float_dtype(ref.dtype, op, "mean" if mt_ else "std")
    if ref.device.type != "cpu":
        return _normal_tensors_device(mean, std, mt_, st_, d, ref.device, generator, op)
    if st_:
        sa = std.numpy()
        if sa.size and not np.all(sa.astype(np.float64) >= 0):
            raise ValueError(f"{op}: expects all elements of std >= 0.0")
    shape = broadcast_shapes(tuple(mean.shape) if mt_ else (), tuple(std.shape) if st_ else ())
    out = Tensor._empty(shape, d, Device("cpu"))
    if not st_:
        s = _scalar(std, op, "std")
        if not s >= 0:
            raise ValueError(f"{op}: expects std >= 0.0, but found std {s}")
        normal_(out, 0.0, s, generator=generator)
        v = out.numpy() + mean.numpy().astype(d.np)
    else:
        normal_(out, 0.0, 1.0, generator=generator)
        m = mean.numpy().astype(d.np) if mt_ else np.asarray(mean, d.np)
        v = (out.numpy() * std.numpy().astype(d.np)).astype(d.np) + m
    out.numpy()[...] = v.astype(d.np)
    return out


def _normal_tensors_device(mean, std, mt_, st_, d, dev, generator, op):
    # torch's normal_out_impl: normal_(0, std) then + mean; with a std tensor normal_(0, 1),
    # then * std + mean
    for name, x in (("mean", mean), ("std", std)):
        if isinstance(x, Tensor) and x.device != dev:
            raise ValueError(f"{op}: {name} is on {x.device} but the other argument is on {dev}")
    if st_ and std.numel() and not bool((std >= 0).all().item()):
        raise ValueError(f"{op}: expects all elements of std >= 0.0")
    shape = broadcast_shapes(tuple(mean.shape) if mt_ else (), tuple(std.shape) if st_ else ())
    out = Tensor._empty(shape, d, dev)
    if not st_:
        s = _scalar(std, op, "std")
        if not s >= 0:
            raise ValueError(f"{op}: expects std >= 0.0, but found std {s}")
        normal_(out, 0.0, s, generator=generator)
        return out.copy_(out + mean.to(d))
    normal_(out, 0.0, 1.0, generator=generator)
    m = mean.to(d) if mt_ else _scalar(mean, op, "mean")
    return out.copy_(out * std.to(d) + m)


def bernoulli(input, p=None, *, generator=None):
    """bernoulli(probs): 1 with probability probs[i]; bernoulli(t, p): a float p for each."""
    if not isinstance(input, Tensor):
        raise TypeError(f"bernoulli: input must be a Tensor, got {type(input).__name__}")
    out = Tensor._empty(tuple(input.shape), input.dtype, input.device)
    if p is None:
        return bernoulli_(out, input, generator=generator)
    return bernoulli_(out, p, generator=generator)


def multinomial(input, num_samples, replacement=False, *, generator=None):
    op = "multinomial"
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    _device_ok(input.device, op)
    _sampling.check_draw_dtype(input, "input", op)
    if input.ndim not in (1, 2) or input.shape[-1] == 0:
        raise ValueError(f"{op}: input must be 1-D or 2-D with at least one category, got shape "
                         f"{tuple(input.shape)}")
    if not isinstance(num_samples, numbers.Integral) or isinstance(num_samples, bool) \
            or num_samples <= 0:
        raise ValueError(f"{op}: num_samples must be an int > 0, got {num_samples!r}")
    k = input.shape[-1]
    if not replacement and num_samples > k:
        raise ValueError(f"{op}: cannot sample num_samples={num_samples} > {k} categories "
                         f"without replacement")
    if k > 1 << 24:
        raise ValueError(f"{op}: number of categories cannot exceed 2**24, got {k}")
    g = _gen(generator, op, input.device)
    if input.device.type != "cpu":
        return _multinomial_device(input, num_samples, replacement, g, op)
    mt = g._engine(op)
    p = input.numpy().reshape(-1, k)
    p64 = p.astype(np.float64)
    if not np.all(p64 >= 0) or not np.all(np.isfinite(p64)):
        raise ValueError(f"{op}: probability tensor contains either inf, nan or element < 0")
    cdt = np.float64 if input.dtype.name == "float64" else _F32
    sums = np.add.accumulate(p.astype(cdt), axis=1)
    if np.any(sums[:, -1] <= 0):
        raise ValueError(f"{op}: invalid multinomial distribution (sum of probabilities <= 0)")
    if not replacement or num_samples == 1:
        q = np.empty(p.shape, input.dtype.np)
        q.ravel()[...] = ((-1.0) * _map(math.log1p, -mt.uniform_f64(q.size))).astype(q.dtype)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = (p / q).astype(input.dtype.np).astype(np.float64)
        if num_samples == 1:
            idx = np.argmax(r, axis=1)[:, None]
        else:
            # topk, largest first; torch's CPU topk leaves ties with the higher index first
            cols = np.broadcast_to(np.arange(k), r.shape)
            idx = np.lexsort((-cols, -r), axis=1)[:, :num_samples]
    else:
        cum = (sums / sums[:, -1:]).astype(cdt).astype(np.float64)
        cum[:, -1] = 1.0
        idx = np.empty((p.shape[0], num_samples), np.int64)
        for i in range(p.shape[0]):
            idx[i] = np.searchsorted(cum[i], mt.uniform_f64(num_samples), side="left")
    shape = (num_samples,) if input.ndim == 1 else (input.shape[0], num_samples)
    from .creation import from_numpy
    return from_numpy(np.ascontiguousarray(idx.reshape(shape), np.int64))


def _multinomial_device(input, num_samples, replacement, g, op):
    """cuda/interp (correct and reproducible, not torch-identical): without replacement
    (or one sample) the top num_samples of p / Exp(1) (exponential races, fused with the
    validity counts in kernels/random.race: an invalid row raises at the next synchronising
    call on cuda, as a bad index does); with replacement a search of u * sum(p) (u
    uniform) in the cumulative sums, checked with one small device read."""
    from .kernels import random as _kr
    from .ops.order import searchsorted
    from .ops.reduction import cumsum, topk
    if g.device != input.device:
        raise ValueError(f"{op}: generator is on {g.device} but input is on {input.device}")
    wide = input.dtype.name == "float64"
    cdt = _dt.float64 if wide else _dt.float32
    p = input if input.ndim == 2 else input.unsqueeze(0)
    B, K = p.shape
    if not replacement or num_samples == 1:
        win = Tensor._empty((B,), _dt.int64, input.device)
        keys = Tensor._empty((B, K), cdt, input.device) if num_samples > 1 else None
        pair, seed, off = g._philox(4)
        _kr.race(p, keys, win, seed, off, pair=pair, need=1 if replacement else num_samples,
                 op=op)
        idx = win.unsqueeze(1) if keys is None else topk(keys, num_samples, -1)[1]
    else:
        p = p.to(cdt)
        total = p.sum(-1, keepdim=True)
        ok = ((p >= 0) & (p < math.inf)).all() & (total > 0).all()
        if not bool(ok.item()):
            raise ValueError(f"{op}: invalid distribution: probabilities must be finite, >= 0 "
                             f"with a positive sum")
        u = Tensor._empty((B, num_samples), cdt, input.device)
        uniform_(u, 0.0, 1.0, generator=g)
        idx = searchsorted(cumsum(p, -1).contiguous(), (u * total).contiguous(), right=True)
        idx = idx.clamp(max=K - 1)     # u * total rounding up to the total
    idx = idx.to(_dt.int64)
    return idx if input.ndim == 2 else idx.reshape(num_samples)


def _poisson_one(lam, mt):
    if lam >= 10:       # transformed rejection (Hoermann 1993), as torch's sample_poisson
        slam, loglam = math.sqrt(lam), math.log(lam)
        b = 0.931 + 2.53 * slam
        a = -0.059 + 0.02483 * b
        invalpha = 1.1239 + 1.1328 / (b - 3.4)
        vr = 0.9277 - 3.6224 / (b - 2)
        while True:
            uv = mt.uniform_f64(2)
            U, V = float(uv[0]) - 0.5, float(uv[1])
            us = 0.5 - abs(U)
            k = math.floor((2 * a / us + b) * U + lam + 0.43)
            if us >= 0.07 and V <= vr:
                return k
            if k < 0 or (us < 0.013 and V > us):
                continue
            if (_log(V) + math.log(invalpha) - math.log(a / (us * us) + b)) <= \
                    (-lam + k * loglam - math.lgamma(k + 1.0)):
                return k
    if lam == 0:
        return 0
    enlam, x, prod = math.exp(-lam), 0, 1.0
    while True:
        prod *= float(mt.uniform_f64(1)[0])
        if prod > enlam:
            x += 1
        else:
            return x


def poisson(input, generator=None):
    op = "poisson"
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    _cpu_only(input.device, op)
    _sampling.check_draw_dtype(input, "input", op)
    lam = np.ascontiguousarray(input.numpy()).astype(np.float64).ravel()
    if not np.all(lam >= 0):
        raise ValueError(f"{op}: invalid Poisson rate, expected rate to be non-negative")
    mt = _gen(generator, op)._engine(op)
    out = Tensor._empty(tuple(input.shape), input.dtype, Device("cpu"))
    return _write(out, np.array([_poisson_one(x, mt) for x in lam.tolist()], np.float64))


def _like(x, dtype, device, op):
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(x).__name__}")
    return (tuple(x.shape), x.dtype if dtype is None else dtype,
            x.device if device is None else device)


def rand_like(input, *, generator=None, dtype=None, device=None):
    shape, d, dev = _like(input, dtype, device, "rand_like")
    return rand(shape, generator=generator, dtype=d, device=dev)


def randn_like(input, *, generator=None, dtype=None, device=None):
    shape, d, dev = _like(input, dtype, device, "randn_like")
    return randn(shape, generator=generator, dtype=d, device=dev)


def randint_like(input, low=0, high=None, *, generator=None, dtype=None, device=None):
    shape, d, dev = _like(input, dtype, device, "randint_like")
    if high is None:
        low, high = 0, low
    return randint(low, high, shape, generator=generator, dtype=d, device=dev)


_methods.install(uniform_=uniform_, normal_=normal_, random_=random_, bernoulli_=bernoulli_,
                 exponential_=exponential_, geometric_=geometric_, cauchy_=cauchy_,
                 log_normal_=log_normal_)
