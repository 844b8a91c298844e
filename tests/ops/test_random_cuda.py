"""nbx.random on cuda/interp: Philox4x32-10 in torch's CUDA mapping.

The references here are independent NumPy reimplementations (uint64/float64) of curand's
Philox4x32-10 and of torch's distribution_nullary_kernel mapping (an H200's grid: 132 SMs,
2048 threads an SM -- what interp uses), so the interp run checks the values the cuda
kernels produce. rand/uniform_/randint/random_/bernoulli_ must be bit-exact; randn/normal_
and exponential_ go through log/sin/cos and are compared to float64 within stated bounds.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import nbxtensor as nbx

# ------------------------------------------------------------------ the NumPy reference
_U64 = np.uint64
_M32 = _U64(0xFFFFFFFF)


def philox_ref(c, k):
    """Philox4x32-10 on uint64 arrays holding 32-bit words: c (4, ...), k (2, ...)."""
    c0, c1, c2, c3 = (np.asarray(x, _U64) for x in c)
    k0, k1 = (np.asarray(x, _U64) for x in k)
    for _ in range(10):
        p0 = _U64(0xD2511F53) * c0
        p1 = _U64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> _U64(32)) ^ c1 ^ k0, p1 & _M32,
                          (p0 >> _U64(32)) ^ c3 ^ k1, p0 & _M32)
        k0 = (k0 + _U64(0x9E3779B9)) & _M32
        k1 = (k1 + _U64(0xBB67AE85)) & _M32
    return np.stack([c0, c1, c2, c3])


def words_ref(seed, offset, numel, unroll, sms=132, tps=2048):
    """torch's draws: (R, 4, T) words, word i of call j of thread t, and the offset step."""
    grid = min(sms * (tps // 256), -(-numel // 256))
    T = 256 * grid
    R = (numel - 1) // (T * unroll) + 1
    t = np.arange(T, dtype=np.uint64)
    out = np.empty((R, 4, T), np.uint64)
    for j in range(R):
        cnt = offset // 4 + j
        c = (np.full(T, cnt & 0xFFFFFFFF, _U64), np.full(T, cnt >> 32, _U64), t & _M32, t >> _U64(32))
        out[j] = philox_ref(c, (np.full(T, seed & 0xFFFFFFFF, _U64),
                                np.full(T, seed >> 32, _U64)))
    return out, R * 4


def elems4(w, n):          # unroll 4: element j*4T + i*T + t <- word i of call j, thread t
    return w.reshape(-1)[:n]


def elems2(w, n):          # unroll 2: element j*2T + i*T + t <- words (2i, 2i+1)
    R, _, T = w.shape
    w = w.reshape(R, 2, 2, T)
    return w[:, :, 0].reshape(-1)[:n], w[:, :, 1].reshape(-1)[:n]


def u32_ref(x):            # curand_uniform: float(x) * 2**-32 + 2**-33, rounded once
    return (x.astype(np.float32).astype(np.float64) * 2.0 ** -32 + 2.0 ** -33).astype(np.float32)


def u64_ref(x, y):
    z = (x ^ (y << _U64(21))).astype(np.float64)
    return z * 2.0 ** -53 + 2.0 ** -54


def normal4_ref(w, n):
    """curand_normal4 in float64 from the same words (Box-Muller on pairs)."""
    R, _, T = w.shape
    x, y = w[:, 0::2], w[:, 1::2]                 # (R, 2, T): the two pairs of a call
    u = x.astype(np.float32).astype(np.float64) * 2.0 ** -32 + 2.0 ** -33
    c = float(np.float32(np.float32(2.3283064e-10) * np.float32(6.2831855)))
    v = (y.astype(np.float32).astype(np.float64) * c + c / 2).astype(np.float32).astype(np.float64)
    s = np.sqrt(-2.0 * np.log(u))
    z = np.stack([np.sin(v) * s, np.cos(v) * s], axis=2)   # (R, 2 pairs, 2, T)
    return z.reshape(-1)[:n]


def _dev(device):
    if device == "cpu":
        pytest.skip("the Philox stream is cuda's and interp's (cpu is torch's MT19937)")
    return device


SIZES = [1, 3, 1000, 1 << 12 | 5]     # one thread; a partial block; whole calls; 2 calls


# ----------------------------------------------------------------------------- Philox
KAT = [  # Random123's kat_vectors for philox4x32_10 (counter, key, result)
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def test_philox_reference_known_answers():
    for c, k, want in KAT:
        got = philox_ref([[x] for x in c], [[x] for x in k])[:, 0]
        assert [int(v) for v in got] == list(want)


try:      # the known-answer kernel needs triton (interp/cuda); cpu-only machines skip it
    import triton
    import triton.language as tl

    from nbxtensor.kernels.random import philox4x32_10

    @triton.jit
    def _kat_kernel(ctr_ptr, key_ptr, out_ptr):
        i = tl.arange(0, 4)
        u = tl.uint32
        r0, r1, r2, r3 = philox4x32_10(tl.load(ctr_ptr + i * 4).to(u, bitcast=True),
                                       tl.load(ctr_ptr + i * 4 + 1).to(u, bitcast=True),
                                       tl.load(ctr_ptr + i * 4 + 2).to(u, bitcast=True),
                                       tl.load(ctr_ptr + i * 4 + 3).to(u, bitcast=True),
                                       tl.load(key_ptr + i * 2).to(u, bitcast=True),
                                       tl.load(key_ptr + i * 2 + 1).to(u, bitcast=True))
        tl.store(out_ptr + i * 4, r0.to(tl.int32, bitcast=True))
        tl.store(out_ptr + i * 4 + 1, r1.to(tl.int32, bitcast=True))
        tl.store(out_ptr + i * 4 + 2, r2.to(tl.int32, bitcast=True))
        tl.store(out_ptr + i * 4 + 3, r3.to(tl.int32, bitcast=True))
except ImportError:
    _kat_kernel = None


def test_philox_kernel_known_answers(device):
    _dev(device)
    ctr = np.array([c for c, _, _ in KAT] + [KAT[0][0]], np.uint32).view(np.int32)
    key = np.array([k for _, k, _ in KAT] + [KAT[0][1]], np.uint32).view(np.int32)
    out = nbx.zeros(16, dtype=nbx.int32, device=device)
    nbx.launch(_kat_kernel, (1,), nbx.from_numpy(ctr.ravel()).to(device),
               nbx.from_numpy(key.ravel()).to(device), out)
    got = out.cpu().numpy().view(np.uint32).reshape(4, 4)
    want = np.array([r for _, _, r in KAT] + [KAT[0][2]], np.uint32)
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------- bit-exact draws (interp)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seed", [0, 123456789, (1 << 64) - 5])
def test_rand_float32_bit_exact(device, n, seed):
    _dev(device)
    g = nbx.Generator(device).manual_seed(seed)
    a = nbx.rand(n, generator=g, device=device).cpu().numpy()
    b = nbx.rand(n, generator=g, device=device).cpu().numpy()
    w, inc = words_ref(seed, 0, n, 4)
    want_a = u32_ref(elems4(w, n))
    want_a[want_a == 1.0] = 0.0               # torch flips curand's (0, 1] to [0, 1)
    w2, _ = words_ref(seed, inc, n, 4)        # the second draw starts after the first's step
    want_b = u32_ref(elems4(w2, n))
    want_b[want_b == 1.0] = 0.0
    np.testing.assert_array_equal(a, want_a)
    np.testing.assert_array_equal(b, want_b)
    assert int(np.frombuffer(g.get_state().numpy().tobytes(), "<i8")[1]) == 2 * inc


@pytest.mark.parametrize("n", [3, 1000, 1 << 12 | 5])
def test_rand_float64_bit_exact(device, n):
    _dev(device)
    g = nbx.Generator(device).manual_seed(7)
    a = nbx.rand(n, generator=g, dtype=nbx.float64, device=device).cpu().numpy()
    w, _ = words_ref(7, 0, n, 2)
    (x0, y0), (x1, y1) = [(w[:, 2 * i], w[:, 2 * i + 1]) for i in range(2)]
    R, _, T = w.shape
    want = np.stack([u64_ref(x0, y0), u64_ref(x1, y1)], axis=1).reshape(-1)[:n]
    np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_uniform_half_bit_exact(device, dtype):
    _dev(device)
    d = getattr(nbx, dtype)
    n = 1000
    g = nbx.Generator(device).manual_seed(11)
    t = nbx.empty(n, dtype=d, device=device).uniform_(-2.0, 3.0, generator=g)
    w, _ = words_ref(11, 0, n, 4)
    u = u32_ref(elems4(w, n)).astype(np.float64)
    npd = t.numpy().dtype
    lo, hi = np.asarray(-2.0, npd), np.asarray(3.0, npd)
    rng = (np.float32(hi) - np.float32(lo)).astype(npd).astype(np.float64)
    v = (u * rng + float(lo)).astype(np.float32).astype(npd)   # exact product: one rounding
    v = np.where(v == hi, lo, v)
    np.testing.assert_array_equal(t.cpu().numpy().astype(np.float64), v.astype(np.float64))


def test_uniform_range_float32_fma(device):
    """fma(u, to - from, from) rounded once: interp emulates the fused multiply-add."""
    _dev(device)
    n = 1 << 12 | 5
    g = nbx.Generator(device).manual_seed(5)
    t = nbx.empty(n, device=device).uniform_(-1.75, 10.3, generator=g).cpu().numpy()
    w, _ = words_ref(5, 0, n, 4)
    u = u32_ref(elems4(w, n)).astype(np.float64)
    lo, hi = np.float32(-1.75), np.float32(10.3)
    exact = u * np.float64(hi - lo) + np.float64(lo)   # exact here: see the check below
    assert np.all(np.abs(exact) < 2 ** 5)              # 24 + 5 + 24 bits < 53: no rounding
    want = exact.astype(np.float32)
    want[want == hi] = lo
    np.testing.assert_array_equal(t, want)


@pytest.mark.parametrize("low,high", [(0, 10), (-5, 1 << 20), (-(1 << 40), 1 << 41)])
@pytest.mark.parametrize("n", [3, 1 << 12 | 5])
def test_randint_bit_exact(device, low, high, n):
    _dev(device)
    g = nbx.Generator(device).manual_seed(99)
    got = nbx.randint(low, high, (n,), generator=g, device=device).cpu().numpy()
    rng = high - low
    if rng >= 1 << 28:        # 64-bit words, unroll 2
        w, _ = words_ref(99, 0, n, 2)
        R, _, T = w.shape
        v = np.stack([(w[:, 0] << _U64(32)) | w[:, 1], (w[:, 2] << _U64(32)) | w[:, 3]],
                     axis=1).reshape(-1)[:n]
    else:
        w, _ = words_ref(99, 0, n, 4)
        v = elems4(w, n)
    want = ((v % _U64(rng)) + _U64(low % (1 << 64))).view(np.int64)
    np.testing.assert_array_equal(got, want)


def test_random_default_and_bool(device):
    _dev(device)
    n = 1000
    g = nbx.Generator(device).manual_seed(3)
    a = nbx.empty(n, dtype=nbx.int32, device=device).random_(generator=g).cpu().numpy()
    b = nbx.empty(n, dtype=nbx.bool, device=device).random_(generator=g).cpu().numpy()
    w, inc = words_ref(3, 0, n, 4)
    np.testing.assert_array_equal(a, (elems4(w, n) % _U64(1 << 31)).astype(np.int32))
    w, _ = words_ref(3, inc, n, 4)
    np.testing.assert_array_equal(b, (elems4(w, n) & _U64(1)) == 1)


@pytest.mark.parametrize("p", [0.3, 0.999])
def test_bernoulli_scalar_bit_exact(device, p):
    _dev(device)
    n = 1000
    g = nbx.Generator(device).manual_seed(21)
    got = nbx.empty(n, device=device).bernoulli_(p, generator=g).cpu().numpy()
    w, _ = words_ref(21, 0, n, 4)
    want = (u32_ref(elems4(w, n)) < np.float32(p)).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_noncontiguous_fills_memory_order(device):
    """A transposed tensor is filled in memory order (TensorIterator's)."""
    _dev(device)
    g = nbx.Generator(device).manual_seed(4)
    t = nbx.zeros(37, 29, device=device).t()          # (29, 37), strides (1, 29)
    t.uniform_(generator=g)
    w, _ = words_ref(4, 0, 37 * 29, 4)
    want = u32_ref(elems4(w, 37 * 29))
    want[want == 1.0] = 0.0
    np.testing.assert_array_equal(t.cpu().numpy().T.ravel(), want)


# ----------------------------------------------------------- normal: float bounds
def test_randn_float32_close_to_reference(device):
    """log/sin/cos are libdevice's (cuda) or NumPy's (interp): a few float32 ulps of the
    float64 Box-Muller on the same words (|z| < 7, so 4e-6 absolute is ~60 ulps at 7)."""
    _dev(device)
    n = 1 << 12 | 5
    g = nbx.Generator(device).manual_seed(17)
    z = nbx.randn(n, generator=g, device=device).cpu().numpy().astype(np.float64)
    w, _ = words_ref(17, 0, n, 4)
    np.testing.assert_allclose(z, normal4_ref(w, n), rtol=2e-6, atol=4e-6)
    m = nbx.empty(n, device=device).normal_(3.0, 0.5, generator=g).cpu().numpy()
    w, _ = words_ref(17, 4, n, 4)
    np.testing.assert_allclose(m, 3.0 + 0.5 * normal4_ref(w, n), rtol=2e-6, atol=4e-6)


def test_randn_float64_close_to_reference(device):
    _dev(device)
    n = 1001
    g = nbx.Generator(device).manual_seed(8)
    z = nbx.randn(n, generator=g, dtype=nbx.float64, device=device).cpu().numpy()
    w, _ = words_ref(8, 0, n, 2)
    u = u64_ref(w[:, 0], w[:, 1])
    v = (w[:, 2] ^ (w[:, 3] << _U64(21))).astype(np.float64) * 2.0 ** -52 + 2.0 ** -53
    s = np.sqrt(-2.0 * np.log(u))
    want = np.stack([np.sin(math.pi * v) * s, np.cos(math.pi * v) * s], axis=1).reshape(-1)[:n]
    np.testing.assert_allclose(z, want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------ state and reproducibility
def test_state_round_trip_and_reproducible(device):
    _dev(device)
    g = nbx.Generator(device).manual_seed(2024)
    nbx.rand(100, generator=g, device=device)
    st = g.get_state()
    assert st.dtype is nbx.uint8 and tuple(st.shape) == (16,)
    seed, off = np.frombuffer(st.numpy().tobytes(), "<u8")
    assert int(seed) == 2024 and int(off) == 4
    a = nbx.randn(300, generator=g, device=device).cpu().numpy()
    g.set_state(st)
    np.testing.assert_array_equal(nbx.randn(300, generator=g, device=device).cpu().numpy(), a)
    g2 = nbx.Generator(device).manual_seed(2024)
    nbx.rand(100, generator=g2, device=device)
    np.testing.assert_array_equal(nbx.randn(300, generator=g2, device=device).cpu().numpy(), a)
    bad = nbx.from_numpy(np.array([1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0], np.uint8))
    with pytest.raises(ValueError, match="multiple of 4"):
        g.set_state(bad)
    with pytest.raises(ValueError, match="set_state"):
        g.set_state(nbx.zeros(5, dtype=nbx.uint8))


def test_manual_seed_seeds_device_defaults(device):
    _dev(device)
    nbx.manual_seed(77)
    a = nbx.rand(50, device=device).cpu().numpy()
    nbx.manual_seed(77)
    b = nbx.rand(50, device=device).cpu().numpy()
    np.testing.assert_array_equal(a, b)
    g = nbx.Generator(device).manual_seed(77)
    np.testing.assert_array_equal(nbx.rand(50, generator=g, device=device).cpu().numpy(), a)
    assert nbx.random.default_generator_for(device).initial_seed() == 77


def test_generator_device_mismatch(device):
    _dev(device)
    with pytest.raises(ValueError, match="generator is on"):
        nbx.rand(4, generator=nbx.Generator("cpu"), device=device)


# --------------------------------------------------------------------- statistics
N_STAT = 20000


def _ks(x, cdf):
    x = np.sort(x)
    f = cdf(x)
    n = len(x)
    return max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))


# KS critical value at alpha = 1e-3: 1.95 / sqrt(n)
KS_CRIT = 1.95 / math.sqrt(N_STAT)


def test_stats_uniform_normal_exponential(device):
    _dev(device)
    g = nbx.Generator(device).manual_seed(1)
    u = nbx.empty(N_STAT, device=device).uniform_(2.0, 5.0, generator=g).cpu().numpy()
    assert u.min() >= 2.0 and u.max() < 5.0
    assert _ks(u.astype(np.float64), lambda x: (x - 2.0) / 3.0) < KS_CRIT
    z = nbx.normal(1.0, 2.0, (N_STAT,), generator=g, device=device).cpu().numpy().astype(np.float64)
    assert abs(z.mean() - 1.0) < 5 * 2.0 / math.sqrt(N_STAT)
    assert abs(z.std() - 2.0) < 0.05
    erf = np.vectorize(math.erf)
    assert _ks(z, lambda x: 0.5 * (1 + erf((x - 1.0) / (2.0 * math.sqrt(2))))) < KS_CRIT
    e = nbx.empty(N_STAT, dtype=nbx.float64, device=device).exponential_(3.0, generator=g)
    e = e.cpu().numpy()
    assert e.min() >= 0
    assert _ks(e, lambda x: 1 - np.exp(-3.0 * x)) < KS_CRIT


def test_stats_bernoulli_tensor_randint_randperm(device):
    _dev(device)
    g = nbx.Generator(device).manual_seed(2)
    p = nbx.from_numpy(np.array([0.0, 0.1, 0.5, 0.9, 1.0], np.float32)).to(device)
    b = nbx.empty(4000, 5, device=device).bernoulli_(p, generator=g).cpu().numpy()
    freq = b.mean(axis=0)
    assert freq[0] == 0 and freq[4] == 1
    np.testing.assert_allclose(freq[1:4], [0.1, 0.5, 0.9], atol=5 * 0.5 / math.sqrt(4000))
    r = nbx.randint(0, 7, (N_STAT,), generator=g, device=device).cpu().numpy()
    counts = np.bincount(r, minlength=7)
    chi2 = ((counts - N_STAT / 7) ** 2 / (N_STAT / 7)).sum()
    assert counts.size == 7 and chi2 < 22.46     # chi-square(6) at alpha = 1e-3
    perm = nbx.randperm(1000, generator=g, device=device).cpu().numpy()
    assert sorted(perm.tolist()) == list(range(1000)) and perm.dtype == np.int64
    assert not np.array_equal(perm, np.arange(1000))
    g.manual_seed(2)
    nbx.empty(4000, 5, device=device).bernoulli_(p, generator=g)
    nbx.randint(0, 7, (N_STAT,), generator=g, device=device)
    np.testing.assert_array_equal(nbx.randperm(1000, generator=g, device=device).cpu().numpy(),
                                  perm)


def test_multinomial(device):
    _dev(device)
    g = nbx.Generator(device).manual_seed(3)
    p = np.array([[0.1, 0.0, 0.6, 0.3], [1.0, 2.0, 0.0, 1.0]], np.float32)
    pt = nbx.from_numpy(p).to(device)
    s = nbx.multinomial(pt, 4000, replacement=True, generator=g).cpu().numpy()
    assert s.shape == (2, 4000) and s.dtype == np.int64
    for row in range(2):
        freq = np.bincount(s[row], minlength=4) / 4000
        assert freq[p[row] == 0].sum() == 0
        np.testing.assert_allclose(freq, p[row] / p[row].sum(), atol=5 * 0.5 / math.sqrt(4000))
    w = nbx.multinomial(pt, 3, replacement=False, generator=g).cpu().numpy()
    for row in range(2):
        assert len(set(w[row].tolist())) == 3 and all(p[row][w[row]] > 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_multinomial_race_frequencies(device, dtype):
    """One sample a row (the fused race): chi-square of n rows' draws against p (7 dof:
    p < 1e-4 at 29.9; n = 300 on interp, which runs one program a row), rows read strided;
    without replacement two draws a row are distinct; rows of several blocks pick each
    block's elements."""
    _dev(device)
    g = nbx.Generator(device).manual_seed(11)
    p = np.array([0.05, 0.1, 0.2, 0.05, 0.3, 0.1, 0.15, 0.05])
    n = 300 if device == "interp" else 3000
    wide = np.zeros((n, 16))
    wide[:, ::2] = p * 3.0                                   # unnormalised, every other column
    pt = nbx.tensor(wide, device=device).to(getattr(nbx, dtype))[:, ::2]
    for repl in (True, False):
        idx = nbx.multinomial(pt, 1, repl, generator=g).cpu().numpy()
        assert idx.shape == (n, 1) and idx.dtype == np.int64
        counts = np.bincount(idx[:, 0], minlength=8)
        assert ((counts - n * p) ** 2 / (n * p)).sum() < 29.9
    two = nbx.multinomial(pt[:40], 2, False, generator=g).cpu().numpy()
    assert all(a != b for a, b in two.tolist())
    if device == "interp" and dtype != "float32":
        return                                  # the block walk is dtype-blind; interp is slow
    K = 3 * (8192 if device == "interp" else 1024) + 1      # blocks of the race kernel, overhung
    for hot in (0, K // 2, K - 1):
        q = np.full(K, 1e-30)
        q[hot] = 1.0
        got = nbx.multinomial(nbx.tensor(q, device=device).to(getattr(nbx, dtype)), 1,
                              generator=g).cpu().numpy()
        assert got.tolist() == [hot]


def test_multinomial_refusals_on_the_device(device):
    """A bad row is refused: at the op on interp, at the next synchronising call on cuda (the
    race records it in the device's error flag, as a bad index is recorded)."""
    _dev(device)
    g = nbx.Generator(device).manual_seed(1)

    def draw(p, k, repl=False):
        r = nbx.multinomial(nbx.tensor(p, device=device), k, repl, generator=g)
        nbx.check_index_errors()
        return r
    for bad in ([0.5, -0.1, 0.6], [0.5, float("nan")], [0.5, float("inf")]):
        with pytest.raises(ValueError, match="finite and >= 0"):
            draw(bad, 1)
    with pytest.raises(ValueError, match="sum to 0"):
        draw([[0.5, 0.5], [0.0, 0.0]], 1)
    with pytest.raises(ValueError, match="fewer than num_samples=2"):
        draw([0.5, 0.0, 0.0], 2)
    with pytest.raises(ValueError, match="finite, >= 0"):
        draw([0.5, -1.0], 3, True)
    assert draw([0.0, 2.0, 0.0], 1).cpu().numpy().tolist() == [1]     # the flag was reset


def test_dropout_training(device):
    _dev(device)
    nbx.manual_seed(5)
    x = nbx.ones(200, 100, device=device)
    y = nbx.nn.functional.dropout(x, p=0.25, training=True).cpu().numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 5 * math.sqrt(0.75 * 0.25 / kept.size)
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)


# ------------------------------------------------------------------------ cuda only
def _cuda_only(device):
    if device != "cuda":
        pytest.skip("cuda only")


def test_graph_replay_draws_fresh_numbers(device):
    """Each replay reads the generator's seed/offset and advances it, as torch's."""
    _cuda_only(device)
    g = nbx.Generator("cuda").manual_seed(10)
    buf = nbx.empty(1000, device="cuda")
    buf.uniform_(generator=g)                 # compile outside the capture
    g.manual_seed(10)
    graph = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(graph):
        buf.uniform_(generator=g)
        buf2 = nbx.randn(10000, generator=g, device="cuda")
    seen = []
    for _ in range(3):
        graph.replay()
        nbx.cuda.synchronize()
        seen.append((buf.cpu().numpy().copy(), buf2.cpu().numpy().copy()))
    ref = nbx.Generator("cuda").manual_seed(10)
    for a, b in seen:
        np.testing.assert_array_equal(a, nbx.rand(1000, generator=ref, device="cuda").cpu().numpy())
        np.testing.assert_array_equal(b, nbx.randn(10000, generator=ref, device="cuda").cpu().numpy())
    assert not np.array_equal(seen[0][0], seen[1][0])
    # eager draws after the replays continue after them
    np.testing.assert_array_equal(nbx.rand(7, generator=g, device="cuda").cpu().numpy(),
                                  nbx.rand(7, generator=ref, device="cuda").cpu().numpy())


def test_bandwidth_256mib(device):
    _cuda_only(device)
    n = (256 << 20) // 4
    x = nbx.empty(n, device="cuda")
    for fill in (lambda: x.uniform_(), lambda: x.normal_()):
        fill()
        s, e = nbx.cuda.Event(enable_timing=True), nbx.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            fill()
        e.record()
        e.synchronize()
        gbs = 10 * (256 << 20) / (s.elapsed_time(e) * 1e-3) / 1e9
        print(f"fill 256 MiB: {gbs:.0f} GB/s")
        assert gbs > 0


@pytest.mark.parametrize("seed", [0, 42, 2 ** 40 + 3])
def test_matches_torch_cuda(device, seed):
    _cuda_only(device)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    for n in (5, 1000, 300001):
        for dtype in ("float32", "float16", "bfloat16", "float64"):
            tg = torch.Generator("cuda").manual_seed(seed)
            g = nbx.Generator("cuda").manual_seed(seed)
            td = getattr(torch, dtype)
            want = [torch.rand(n, generator=tg, device="cuda", dtype=td),
                    torch.empty(n, device="cuda", dtype=td).uniform_(-3, 5, generator=tg),
                    torch.randn(n, generator=tg, device="cuda", dtype=td)]
            got = [nbx.rand(n, generator=g, device="cuda", dtype=getattr(nbx, dtype)),
                   nbx.empty(n, device="cuda", dtype=getattr(nbx, dtype)).uniform_(-3, 5, generator=g),
                   nbx.randn(n, generator=g, device="cuda", dtype=getattr(nbx, dtype))]
            for w, o in zip(want, got):
                np.testing.assert_array_equal(o.cpu().numpy().astype(np.float64),
                                              w.float().cpu().double().numpy()
                                              if dtype != "float64" else w.cpu().numpy())
            ti = torch.randint(-9, 1 << 30, (n,), generator=tg, device="cuda")
            gi = nbx.randint(-9, 1 << 30, (n,), generator=g, device="cuda")
            np.testing.assert_array_equal(gi.cpu().numpy(), ti.cpu().numpy())
            assert bytes(tg.get_state().numpy()) == bytes(g.get_state().numpy())


@pytest.mark.parametrize("dev", ["cpu", "interp"])
def test_bernoulli_tensor_p_refusals(dev):
    """bernoulli_'s tensor p is checked the same way on every device (one helper)."""
    t = nbx.empty(3, 4, device=dev)
    with pytest.raises(TypeError, match="p must be a float16/bfloat16/float32/float64"):
        t.bernoulli_(nbx.ones(3, 4, dtype=nbx.int32, device=dev))
    with pytest.raises(ValueError, match=r"p of shape \(5,\) does not broadcast to \(3, 4\)"):
        t.bernoulli_(nbx.full((5,), 0.5, device=dev))
