"""The Gluon block sort (kernels/sort_gluon.py) and its routing in kernels/sort.py.

Gluon has no interpreter path, so what runs everywhere is: a NumPy emulation of the kernel's
exact data movement (the phase / step schedule, the register tile [NP/R, R], the transposed
[R, NP/R] ping-pong buffers seen as [R*NP/(2j), 2, j/R], the direction masks and buffer
parities taken from the module itself) applied to random keys, which must sort; the
no-replication rule of every layout the host can launch; the sm_90 compile of every variant
the sweep can pick (shared memory, barrier count = the schedule's); and the routing rule.
The numerical tests (vs NumPy's stable argsort, bit-identical to the Triton path) are cuda only.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import poisoned, rng
from test_sort import _input, _same, ref_order

from nbxtensor.kernels import sort as S
from nbxtensor.kernels import sort_gluon as SG


# ------------------------------------------------------------------ NumPy emulation
def _cas(a, b, up):
    # the kernel's _cas: one compare; swap when a > b going up, a < b going down
    swap = (a > b) == up
    return np.where(swap, b, a), np.where(swap, a, b)


def _reg_step(x, pos, k, j, NP, R):
    # the kernel's _reg_step: x [NP/R, R] as [NP/R, R/(2j), 2, j], halves along axis 2
    T, G = NP // R, R // (2 * j)
    y, p = x.reshape(T, G, 2, j), pos.reshape(T, G, 2, j)
    a, b = y[:, :, 0, :], y[:, :, 1, :]
    up = (p[:, :, 0, :] & k) == 0
    a, b = _cas(a, b, up)
    return np.stack([a, b], axis=2).reshape(T, R)


def _smem_round(src, dst, k, j, s, NP, R):
    # the kernel's _smem_round: the [R, NP/R] buffers as [R*ROWS, 2, .., 2, jl/R] (s axes of
    # 2); step u flips axis 1 + u (distance j / 2**u); one direction mask for the round
    rows = NP // (2 * j)
    Q, J = R * rows, j // (R << (s - 1))
    shape = (Q,) + (2,) * s + (J,)
    y, out = src.reshape(shape).copy(), dst.reshape(shape)
    assert np.shares_memory(out, dst)
    q = np.arange(Q).reshape((Q,) + (1,) * (s + 1))
    up = np.broadcast_to((q & SG._smem_dir_mask(k, j, rows)) == 0, shape)
    done = []
    for u in range(s):
        yl, ul = np.moveaxis(y, 1 + u, -1), np.moveaxis(up, 1 + u, -1)
        a, b = _cas(yl[..., 0], yl[..., 1], ul[..., 0])
        y = np.moveaxis(np.stack([a, b], -1), -1, 1 + u)
        done.append((k, j >> u, "smem"))
    out[...] = y
    return done


def emulate(keys, NP, R, S, gen):
    """`_block_sort_kernel`'s loop over one tile of NP keys (key i = t*R + c at register c
    of thread-row t); returns the tile in the order the kernel writes it, the (k, j, where)
    steps and the (k, j, s) shared-memory rounds taken."""
    T, LOG, LOGR = NP // R, NP.bit_length() - 1, R.bit_length() - 1
    x = keys.reshape(T, R).copy()
    pos = np.arange(NP).reshape(T, R)
    # stale contents: a wrong buffer parity reads keys that are not the tile's
    bufs = [gen.integers(-2**62, 2**62, (R, T)) for _ in range(2)]
    done, rnds = [], []
    for lk in range(1, LOG + 1):
        k = 1 << lk
        if lk > LOGR:
            F = SG._first_buf(lk, LOGR, S)
            bufs[F][...] = x.T
            n = SG._n_rounds(lk, LOGR, S)
            for rr in range(n):
                src = F ^ (rr & 1)
                j, s = 1 << (lk - 1 - rr * S), SG._round_len(lk, LOGR, S, rr)
                done += _smem_round(bufs[src], bufs[src ^ 1], k, j, s, NP, R)
                rnds.append((k, j, s))
            x = bufs[F ^ (n & 1)].T.copy()
        for jj in range(min(lk, LOGR) - 1, -1, -1):
            x = _reg_step(x, pos, k, 1 << jj, NP, R)
            done.append((k, 1 << jj, "reg"))
    return x.reshape(-1), done, rnds


@pytest.mark.parametrize("NP,R,S", [(128, 4, 1), (256, 8, 1), (256, 8, 2), (512, 16, 3),
                                    (1024, 4, 1), (4096, 8, 1), (4096, 8, 2), (4096, 16, 2),
                                    (4096, 16, 3), (8192, 8, 2)])
def test_schedule_emulated_sorts(NP, R, S):
    g = rng()
    n_smem = sum(w == "smem" for _, _, w in SG.stages(NP, R))
    if (NP, R) == (4096, 8):
        assert n_smem == 45 and len(SG.stages(NP, R)) == 78
        assert len(SG.rounds(NP, R, S)) == (45 if S == 1 else 25)
    for n in (NP, NP - 1, NP // 2 + 1, 1):
        # packed keys as the kernel builds them: (value key << 32) | index, many equal values;
        # positions >= n are padding (INT64_MAX)
        v = g.integers(-3, 3, n).astype(np.int64)
        keys = np.full(NP, np.iinfo(np.int64).max)
        keys[:n] = (v << 32) | np.arange(n)
        out, done, rnds = emulate(keys, NP, R, S, g)
        assert done == SG.stages(NP, R) and rnds == SG.rounds(NP, R, S)
        np.testing.assert_array_equal(out, np.sort(keys))
        # decoded: the stable order of the values (what torch's stable sort returns)
        np.testing.assert_array_equal(out[:n] & 0xFFFFFFFF, np.argsort(v, kind="stable"))


def test_plan_and_layouts_never_replicate():
    """Every (NP, R, warps, S) the host can launch: the tile covers 32 * warps threads exactly
    and every shared-memory round's layout builds (it raises on replicated threads)."""
    for N, R, W in itertools.product((1, 2, 33, 100, 1000, 2048, 4095, 4096, 8192),
                                     SG.RS, (1, 2) + SG.WARPS):
        NP, R2, W2 = SG.plan(N, R, W)
        assert R2 == R and NP >= N and NP & (NP - 1) == 0 and NP >= 32 * W2 * R
        assert 1 <= W2 <= W
        if N >= 32 * R * W:
            assert W2 == W
        for steps in range(1, R.bit_length() - 1):      # S: 2**(S+1) <= R
            for k, j, s in SG.rounds(NP, R, steps):
                SG._round_layout(R * (NP // (2 * j)), s, j // (R << (s - 1)), W2)
    with pytest.raises(ValueError, match="replicate"):
        SG._round_layout(64, 1, 2, 8)


# ------------------------------------------------------------------ sm_90 compile (no GPU)
def _compile(N, R, W, S, dtype=np.float32, keys=False, desc=True):
    from nbxtensor.backends.cuda import launcher as L
    if keys:
        NP, W = N, max(1, min(W, N // (32 * R)))
    else:
        NP, R, W = SG.plan(N, R, W)
    x = nbx.tensor(np.ones((2, NP), dtype))
    i = nbx.tensor(np.ones((2, NP), np.int64))
    args = (x, x, i, i, NP, 1)
    kw = dict(NP=NP, R=R, S=S, IS_FLOAT=x.dtype.is_floating_point, DESC=desc, KEYS=keys,
              num_warps=W)
    sig, ce, attrs, opts, rt = L.bind(SG._block_sort_kernel, args, kw)
    ck = L._compile(SG._block_sort_kernel, sig, ce, attrs, opts, 90)
    return NP, R, W, ck


# every (R, warps, S) the sweep can pick on 4096-key rows, the 8192 limit, the ml tile stage,
# and the narrow dtypes (their key rule) on a short row
COMPILE_CASES = ([(4096, R, W, S, "float32", False) for R, W, S in SG.SWEEP]
                 + [(8192, 8, 16, 2, "float32", False), (1024, 8, 4, 1, "float32", True),
                    (4096, 8, 8, 2, "float32", True), (33, 8, 8, 2, "bfloat16", False),
                    (33, 8, 8, 1, "int8", False), (33, 4, 4, 1, "bool", False)])


@pytest.mark.parametrize("N,R,W,S,dt,keys", COMPILE_CASES, ids=str)
def test_compiles_for_sm90(N, R, W, S, dt, keys):
    pytest.importorskip("triton")
    NP, R, W, ck = _compile(N, R, W, S, nbx.dtypes.as_dtype(dt).np, keys)
    md, ptx = ck.metadata, ck.asm["ptx"]
    assert md.num_warps == W
    assert md.shared == 2 * NP * 8 <= 232448          # two int64 tiles, under 227 KiB
    # one barrier per shared-memory phase (the tile stored) and per shared-memory round:
    # the compiler added none of its own (no hazard it could see between rounds)
    rn = SG.rounds(NP, R, S)
    assert ptx.count("bar.sync") == len({k for k, _, _ in rn}) + len(rn)


# ------------------------------------------------------------------ routing (no GPU)
class _Dev:
    def __init__(self, t):
        self.type = t


class _X:
    """A stand-in row block for the routing helpers: device type and dtype."""

    def __init__(self, dev="cuda", dtype=nbx.float32):
        self.device = _Dev(dev)
        self.dtype = dtype


def test_routing_rule(monkeypatch):
    cfg = dict(S.CONFIG["cuda"], block_sort_max_n=4096, block_sort_few_max_n=2048,
               rank_tile=1024, rank_small_grid=132)
    assert S._gluon_rows(_X(), 128, 4096, cfg)                # the GPU full: whole rows
    assert not S._gluon_rows(_X(), 4, 4096, cfg)              # 16 tiles: the ml path
    assert not S._gluon_rows(_X(), 32, 4096, cfg)             # 128 tiles < 132
    assert S._gluon_rows(_X(), 33, 4096, cfg)
    assert S._gluon_rows(_X(), 1, 2048, cfg)                  # short rows: always
    assert S._gluon_rows(_X(dtype=nbx.bfloat16), 1, 1, cfg)
    assert S._gluon_rows(_X(dtype=nbx.bool), 3, 33, cfg)
    assert not S._gluon_rows(_X(), 500, 4097, cfg)            # (.., 4097): the ml path
    assert not S._gluon_rows(_X(dtype=nbx.int64), 3, 64, cfg)    # 64-bit: the pair path
    assert not S._gluon_rows(_X(dtype=nbx.float64), 3, 64, cfg)
    assert not S._gluon_rows(_X("interp"), 3, 64, cfg)        # no Gluon interpreter
    assert not S._gluon_rows(_X(), 3, 64, dict(cfg, block_sort_max_n=0))   # switched off
    assert not S._gluon_rows(_X(), 3, 2048, dict(cfg, block_sort_min_n=2049))
    assert S._gluon_rows(_X(), 500, 2049, dict(cfg, block_sort_min_n=2049))
    # shipped (session 5's H200 sweep): whole rows <= 4096, Gluon tiles in the ml path
    assert S.CONFIG["cuda"]["block_sort_max_n"] == 4096 and S.CONFIG["cuda"]["ml_gluon"]
    assert "block_sort_max_n" not in S.CONFIG["interp"]
    monkeypatch.setattr(S, "GLUON_SORT", False)               # NBX_GLUON_SORT=0
    assert not S._gluon_rows(_X(), 3, 64, cfg)

    # the ml path's tile stage: only with ml_gluon set, on cuda, tiles of 32*R .. 8192
    calls = []
    monkeypatch.setattr(SG, "sort_rows", lambda *a, **kw: calls.append((a, kw)))
    monkeypatch.setattr(S, "GLUON_SORT", True)
    mcfg = dict(S.CONFIG["cuda"], ml_gluon=(8, 4, 2))
    assert S._gluon_tiles(_X(), 2, 5000, 1024, True, "keys", mcfg)
    assert calls[-1][1] == dict(keys="keys", tile=1024) and calls[-1][0][-1] == (8, 4, 2)
    assert not S._gluon_tiles(_X(), 2, 5000, 128, True, "keys", mcfg)     # tile < 32 * R
    assert not S._gluon_tiles(_X(), 2, 50000, 16384, True, "keys", mcfg)  # > MAX_NP
    assert not S._gluon_tiles(_X("interp"), 2, 5000, 1024, True, "keys", mcfg)
    assert not S._gluon_tiles(_X(), 2, 5000, 1024, True, "keys", dict(S.CONFIG["cuda"], ml_gluon=0))
    assert len(calls) == 1


def test_sort_dispatch_calls_gluon(monkeypatch):
    """sort() hands eligible cuda rows to sort_rows with the output layout (inner) and
    CONFIG's (R, warps); everything else keeps the Triton path."""
    calls = []
    monkeypatch.setattr(SG, "sort_rows", lambda *a, **kw: calls.append(a))
    monkeypatch.setattr(S, "GLUON_SORT", True)
    monkeypatch.setitem(S.CONFIG, "cuda", dict(S.CONFIG["cuda"], block_sort_max_n=4096,
                                               block_sort_rws=(16, 4, 3), rank_small_grid=132))
    x = _X()
    monkeypatch.setattr(S, "_rows", lambda x_, dim: (x, 200, 4096, 3))   # 800 tiles: full
    S.sort(x, 0, True, "v", "i")
    assert calls == [(x, 200, 4096, True, "v", "i", 3, (16, 4, 3))]


def test_interp_never_gluon(monkeypatch):
    """interp (and cpu) never reach the Gluon kernel, whatever the CONFIG says."""
    monkeypatch.setattr(SG, "sort_rows", lambda *a, **kw: pytest.fail("Gluon on interp"))
    monkeypatch.setitem(S.CONFIG, "interp", dict(S.CONFIG["interp"], block_sort_max_n=4096,
                                                 block_sort_rws=(8, 8, 2), ml_gluon=(4, 4, 1)))
    x, a = _input((2, 40), nbx.float32, "interp")
    r = nbx.sort(x, -1, descending=True)
    np.testing.assert_array_equal(r.indices.numpy(), ref_order(a, -1, True))


def test_sort_rows_refuses():
    x = _X()
    with pytest.raises(ValueError, match="rws must be"):
        SG.sort_rows(x, 1, 10, False, None, None, 1, (3, 8, 1))
    with pytest.raises(ValueError, match="rows of 1..8192"):
        SG.sort_rows(x, 1, 8193, False, None, None, 1, (8, 8, 2))
    with pytest.raises(ValueError, match="tile must be"):
        SG.sort_rows(x, 1, 5000, False, None, None, 1, (8, 8, 2), keys=x, tile=128)
    with pytest.raises(ValueError, match="rws must be"):
        SG.sort_rows(x, 1, 10, False, None, None, 1, (8, 8, 3))     # 2**(S+1) > R


# ------------------------------------------------------------------ cuda: numerics
def _cuda_only(device):
    if device != "cuda":
        pytest.skip("cuda only (Gluon kernels do not run on the interpreter)")


@pytest.fixture
def gluon_on(monkeypatch):
    """Route rows of <= 8192 keys to the Gluon kernel and count the calls."""
    calls = []
    orig = SG.sort_rows
    monkeypatch.setattr(SG, "sort_rows", lambda *a, **kw: calls.append(a) or orig(*a, **kw))
    monkeypatch.setattr(S, "GLUON_SORT", True)
    monkeypatch.setitem(S.CONFIG["cuda"], "block_sort_max_n", 8192)

    def set_rws(rws):
        monkeypatch.setitem(S.CONFIG["cuda"], "block_sort_rws", rws)
    return calls, set_rws


def _check(x, a, dim, desc):
    from nbxtensor.dispatch import impl
    v, i = poisoned(a.shape, x.dtype, "cuda"), poisoned(a.shape, nbx.int64, "cuda")
    # the impl takes the dim normalised (as the op layer passes it); the kernel writes v and
    # i: the poison shows gaps
    impl("sort", x.device)(x, dim % x.ndim, desc, v, i)
    o = ref_order(a, dim, desc)
    np.testing.assert_array_equal(i.numpy(), o)
    _same(v, np.take_along_axis(a, o, dim))


# Compile budget (each Gluon variant is a ~2-4 s compile on the GPU host): the main variant
# (8, 8, 2) takes every row length and both directions; the others, the dtypes and the views
# one direction / short rows each. Run after the --sort-sweep2 --gluon-only sweep, whose f32
# descending 4096-key kernels are then in Triton's cache.
MAIN = (8, 8, 2)


# rows of 1, 2, 33, 4095, 4096, 8192 (ties, NaN, +-inf, -0.0 from _input); one case a test so
# xdist spreads the compiles
F32_CASES = [((3, 1), (False, True)), ((2, 2), (False, True)), ((4, 33), (False, True)),
             ((2, 4095), (False, True)), ((3, 4096), (False, True)), ((1, 8192), (True,))]


@pytest.mark.parametrize("shape,dirs", F32_CASES, ids=str)
def test_gluon_sort_f32(device, gluon_on, shape, dirs):
    _cuda_only(device)
    calls, set_rws = gluon_on
    set_rws(MAIN)
    x, a = _input(shape, nbx.float32, "cuda")
    for desc in dirs:
        n0 = len(calls)
        _check(x, a, -1, desc)
        assert len(calls) == n0 + 1, shape
    if shape[1] == 4096:
        # distinct values (no ties): every comparison decided by the value bits
        a = rng().standard_normal((5, 4096)).astype(np.float32)
        _check(nbx.tensor(a, device="cuda"), a, -1, True)


@pytest.mark.parametrize("rws", [(8, 8, 1), (4, 16, 1), (16, 4, 3), (16, 8, 2)], ids=str)
def test_gluon_sort_variants(device, gluon_on, rws):
    """Other (R, warps, S) the sweep may pick, on 4096-key rows (cached after the sweep)."""
    _cuda_only(device)
    calls, set_rws = gluon_on
    set_rws(rws)
    x, a = _input((3, 4096), nbx.float32, "cuda")
    _check(x, a, -1, True)
    assert len(calls) == 1


@pytest.mark.parametrize("dtype,desc", [(nbx.bfloat16, True), (nbx.float16, False),
                                        (nbx.int32, True), (nbx.int8, False),
                                        (nbx.uint8, True), (nbx.bool, False)], ids=str)
def test_gluon_sort_dtypes(device, gluon_on, dtype, desc):
    _cuda_only(device)
    calls, _ = gluon_on
    x, a = _input((3, 200), dtype, "cuda")
    _check(x, a, -1, desc)
    assert len(calls) == 1


def test_gluon_sort_views_and_routing(device, gluon_on, monkeypatch):
    _cuda_only(device)
    calls, _ = gluon_on
    monkeypatch.setitem(S.CONFIG["cuda"], "ml_gluon", 0)   # count whole-row calls only
    # a transposed view sorted along dim 0 (copied into rows; output stride 5)
    x, a = _input((5, 33), nbx.float32, "cuda")
    _check(x.T, a.T, 0, True)
    assert len(calls) == 1
    # (3, 8193): longer than the Gluon limit -> the ml path, still right
    x, a = _input((3, 8193), nbx.float32, "cuda")
    _check(x, a, -1, True)
    assert len(calls) == 1
    # argsort and the public sort go the same way
    x, a = _input((4, 33), nbx.float32, "cuda")
    np.testing.assert_array_equal(x.argsort(-1, descending=True).numpy(), ref_order(a, -1, True))
    r = nbx.sort(x, -1, descending=True)
    np.testing.assert_array_equal(r.indices.numpy(), ref_order(a, -1, True))
    assert len(calls) == 3


def test_gluon_bit_identical_to_triton_path(device, monkeypatch):
    _cuda_only(device)
    a = rng().integers(-50, 50, (128, 4096)).astype(np.float32) * 0.25   # many ties
    a[0, :7] = [np.nan, -0.0, 0.0, np.inf, -np.inf, np.nan, -0.0]
    x = nbx.tensor(a, device="cuda")
    monkeypatch.setattr(S, "GLUON_SORT", True)
    monkeypatch.setitem(S.CONFIG["cuda"], "block_sort_rws", MAIN)
    monkeypatch.setitem(S.CONFIG["cuda"], "block_sort_max_n", 0)
    old = nbx.sort(x, -1, descending=True)
    monkeypatch.setitem(S.CONFIG["cuda"], "block_sort_max_n", 4096)
    new = nbx.sort(x, -1, descending=True)
    np.testing.assert_array_equal(new.indices.numpy(), old.indices.numpy())
    assert np.array_equal(new.values.numpy().view(np.uint32), old.values.numpy().view(np.uint32))


@pytest.mark.parametrize("tile,rws", [(1024, (8, 4, 2)), (4096, (8, 8, 2))], ids=str)
def test_gluon_ml_tiles(device, monkeypatch, tile, rws):
    """The Gluon kernel as the "ml" path's tile sort (packed keys out), rank levels after
    (the sweep's gluon-ml candidates: f32 descending is in the cache after the sweep)."""
    _cuda_only(device)
    calls = []
    orig = SG.sort_rows
    monkeypatch.setattr(SG, "sort_rows", lambda *a, **kw: calls.append(kw) or orig(*a, **kw))
    monkeypatch.setattr(S, "GLUON_SORT", True)
    c = S.CONFIG["cuda"]
    monkeypatch.setitem(c, "ml_gluon", rws)
    monkeypatch.setitem(c, "ml_small", (tile,) + tuple(c["ml_small"][1:]))
    monkeypatch.setitem(c, "ml_big", (tile,) + tuple(c["ml_big"][1:]))
    x, a = _input((3, 9001), nbx.float32, "cuda")
    for desc in (False, True):
        _check(x, a, -1, desc)
    if tile == 4096:
        x, a = _input((1, 40000), nbx.bfloat16, "cuda")
        _check(x, a, -1, True)
    assert calls and all(kw["tile"] == tile for kw in calls)
