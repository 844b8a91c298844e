"""L2 bulk prefetch of the decode GEMVs' weight slabs (kernels/_pdl.py, kernels/decode_fused.py).

CPU: the policy switch (env parsing, set_l2_prefetch / set_l2_prefetch_mode, off on
interp/cpu, the launch constexprs), the chunking arithmetic run on interp (every byte of a
program's slab is asked for exactly once, nothing outside it), and sm_90 compiles of every
kernel variant (the prefetch instruction is in the PTX before griddepcontrol.wait, the K loop
is unchanged). cuda: each decode_fused entry with the prefetch on against float64 NumPy and
bit-equal to the prefetch off.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor.models import _ops as O

from helpers import assert_close, poison_allocations, poisoned, rng, to64

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_graphs import _cuda_ok  # noqa: E402


@pytest.fixture
def l2pf():
    """Restores the prefetch policy (mode, cap, chunk) after a test."""
    from nbxtensor.kernels import _pdl as P
    saved = (P._L2PF_MODE, P.L2PF_CAP, P.L2PF_MIN_CHUNK)
    yield P
    P._L2PF_MODE, P.L2PF_CAP, P.L2PF_MIN_CHUNK = saved


# ----------------------------------------------------------------------------- policy
def test_policy_switch(l2pf):
    P = l2pf
    P.set_l2_prefetch_mode(P.L2PF_OFF)
    assert not P.l2_prefetch_enabled("cuda") and P.l2_prefetch_mode("cuda") == 0
    assert P.set_l2_prefetch(True) is False
    assert P.l2_prefetch_enabled("cuda") and P.l2_prefetch_mode("cuda") == P.L2PF_BULK
    # never on the interpreter or the host (no inline PTX there)
    for dev in ("interp", "cpu", nbx.device("interp"), nbx.device("cpu")):
        assert not P.l2_prefetch_enabled(dev) and P.l2_prefetch_mode(dev) == 0
    assert P.set_l2_prefetch_mode(P.L2PF_LINE) == P.L2PF_BULK
    assert P.set_l2_prefetch(False) is True and P.l2_prefetch_mode("cuda") == 0
    with pytest.raises(TypeError, match="on must be a bool, got int"):
        P.set_l2_prefetch(1)
    with pytest.raises(ValueError, match="mode must be 0"):
        P.set_l2_prefetch_mode(3)
    with pytest.raises(ValueError, match="mode must be 0"):
        P.set_l2_prefetch_mode(True)
    # the decode_fused re-exports are the same functions (one policy place)
    from nbxtensor.kernels import decode_fused as F
    assert F.set_l2_prefetch is P.set_l2_prefetch and F.l2pf_opts is P.l2pf_opts


def test_launch_constexprs(l2pf):
    P = l2pf
    w = nbx.zeros((8, 40), dtype=nbx.bfloat16, device="interp")
    big = nbx.zeros((8, 48), dtype=nbx.bfloat16, device="interp")
    P.set_l2_prefetch_mode(P.L2PF_OFF)
    assert P.l2pf_opts("cuda", w, 4) == dict(L2PF=0)
    P.set_l2_prefetch(True)
    assert P.l2pf_opts("interp", w, 4) == dict(L2PF=0)
    o = P.l2pf_opts("cuda", w, 8)
    assert o["L2PF"] == 1 and o["PF_LANES"] == 256 and o["PF_ROWWISE"] is False
    assert P.l2pf_opts("cuda", big[:, :40], 4)["PF_ROWWISE"] is True    # stride(0) != K
    P.L2PF_CAP = 8192
    assert P.l2pf_opts("cuda", w, 4)["PF_ROWWISE"] is True               # capped: row prefixes
    # auto cap: 24 MiB over the resident programs (<= 528), per slab, a power of two >= 16 KiB
    P.L2PF_CAP = -1
    o = P.l2pf_opts("cuda", w, 4, programs=256, slab_bytes=32768)         # 2048x2048: whole
    assert o["PF_CAP"] == 0 and o["PF_ROWWISE"] is False
    o = P.l2pf_opts("cuda", w, 4, programs=512, slab_bytes=8 * 14336 * 2)
    assert o["PF_CAP"] == 32768 and o["PF_ROWWISE"] is True              # 48 KiB share -> 32
    o = P.l2pf_opts("cuda", w, 4, programs=8016, slab_bytes=16 * 2048 * 2, slabs=2)
    assert o["PF_CAP"] == 16384                                          # 23 KiB share -> 16


@pytest.mark.parametrize("env,mode", [("0", 0), ("off", 0), ("1", 1), ("bulk", 1), ("ON", 1),
                                      ("line", 2), (None, 0)])
def test_env_default(env, mode):
    e = {k: v for k, v in os.environ.items() if k != "NBX_L2_PREFETCH"}
    if env is not None:
        e["NBX_L2_PREFETCH"] = env
    out = subprocess.run([sys.executable, "-c", "from nbxtensor.kernels import _pdl as P; "
                          "print(P.l2_prefetch_mode('cuda'), P.l2_prefetch_mode('interp'))"],
                         env=e, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(mode), "0"]


def test_env_bad_value_refused():
    e = dict(os.environ, NBX_L2_PREFETCH="maybe")
    out = subprocess.run([sys.executable, "-c", "from nbxtensor.kernels import _pdl"], env=e,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "NBX_L2_PREFETCH" in out.stderr and "'maybe'" in out.stderr


def test_interp_ignores_the_switch(l2pf):
    """On interp the prefetch is never compiled in (L2PF=0): same values as off."""
    P = l2pf
    g = rng()
    K, N = 65, 33
    x = nbx.tensor(g.standard_normal((1, K)).astype(np.float32), device="interp")
    w = nbx.tensor((g.standard_normal((2 * N, K)) / 8).astype(np.float32), device="interp")
    got = []
    for on in (False, True):
        P.set_l2_prefetch(on)
        got.append(O.fused_linear(x, w, glu=True).numpy())
    assert got[0].tobytes() == got[1].tobytes()


# ----------------------------------------------------------------------------- chunking (interp)
try:
    import triton
    import triton.language as tl
    from nbxtensor.kernels._pdl import _l2_chunks
except ImportError:      # no triton: the interp/sm_90 tests skip
    triton = None

if triton is not None:
    @triton.jit
    def _probe(w_ptr, nb_ptr, nrows, s_row, K, MAXE, ROWS: tl.constexpr,
               PF_LANES: tl.constexpr, PF_ROWWISE: tl.constexpr, PF_CAP: tl.constexpr,
               PF_MIN: tl.constexpr):
        # every element a lane's chunk covers gets +1 (a stand-in for the prefetch)
        p, nb = _l2_chunks(w_ptr, nrows, s_row, K, ROWS, PF_LANES, PF_ROWWISE, PF_CAP,
                           PF_MIN)
        tl.store(nb_ptr + tl.arange(0, PF_LANES), nb)
        ISZ: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
        for e in range(0, MAXE):
            tl.atomic_add(p + e, 1, mask=e * ISZ < nb)


@pytest.mark.parametrize("nrows,rows,K,stride,rowwise,cap,pmin,lanes", [
    (5, 8, 1031, 1031, False, 0, 4096, 128),     # tail program, contiguous slab, >= 4 KiB
    (8, 8, 40, 40, False, 0, 16, 128),           # small chunks over every lane
    (3, 4, 37, 53, True, 0, 16, 64),             # row stride != K: row by row
    (4, 4, 300, 300, True, 256, 16, 64),         # capped: 64-byte prefix of each row
    (16, 16, 9, 9, False, 0, 0, 32),
])
def test_chunks_cover_the_slab_once(nrows, rows, K, stride, rowwise, cap, pmin, lanes):
    pytest.importorskip("triton")
    from nbxtensor.backends.launch import launch
    probe = _probe
    pad = 64
    cov = nbx.zeros((pad + rows * stride + pad,), dtype=nbx.int32, device="interp")
    nb = nbx.full((lanes,), -7, dtype=nbx.int32, device="interp")
    maxe = rows * stride
    launch(probe, (1,), cov[pad:], nb, nrows, stride, K, maxe, ROWS=rows, PF_LANES=lanes,
           PF_ROWWISE=rowwise, PF_CAP=cap, PF_MIN=pmin)
    c = cov.numpy()
    want = np.zeros_like(c)
    per_row = min(K, cap // rows // 4) if cap else K
    for r in range(nrows):
        want[pad + r * stride:pad + r * stride + per_row] = 1
    assert (c == want).all(), np.nonzero(c != want)[0][:10]
    n = nb.numpy()
    act = n[n > 0]
    # chunks: >= PF_MIN bytes and multiples of 16 except the last of each segment
    segs = nrows if rowwise else 1
    assert len(act) >= segs
    odd = (act % 16 != 0) | (act < pmin)
    assert odd.sum() <= segs
    if not rowwise:
        full = act[:-1]
        assert (full >= pmin).all() and (full % 16 == 0).all()


# ----------------------------------------------------------------------------- sm_90 PTX
_G1 = dict(x_ptr="*bf16", w_ptr="*bf16", o_ptr="*bf16", nw_ptr="*bf16", b_ptr="*bf16",
           r_ptr="*bf16")
_ROPE = dict(x_ptr="*bf16", w_ptr="*bf16", q_ptr="*bf16", nw_ptr="*bf16", b_ptr="*bf16",
             pos_ptr="*i32", inv_ptr="*fp32", ck_ptr="*bf16", cv_ptr="*bf16", len_ptr="*i32")
_DIV16 = ("K", "N", "s_wn", "s_xm", "s_om", "s_rm", "s_qm")


def _ptx(fn, ptrs, cx, num_warps=4):
    """sm_90 PTX with the launcher's usual specialisation (16-divisible pointers/strides)."""
    import triton
    from triton.backends.compiler import GPUTarget
    cx = {**dict(PF_LANES=32 * num_warps, PF_ROWWISE=False, PF_CAP=0, PF_MIN=4096), **cx}
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        sig[n] = "constexpr" if n in cx else ptrs.get(n) or ("fp32" if n == "eps" else "i32")
        if n in ptrs or n in _DIV16:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=cx,
                                                    attrs=attrs),
                          target=GPUTarget("cuda", 90, 64),
                          options=dict(num_warps=num_warps, launch_pdl=True)).asm["ptx"]


def _kernels():
    from nbxtensor.kernels import decode_fused as F
    return {
        "gemv1-glu": (F._fused_gemv1_kernel, _G1,
                      dict(BLOCK_N=4, BLOCK_K=256, EVEN_K=True, NORM=True, GLU=True,
                           HAS_BIAS=False, HAS_RES=False, EARLY=True, PDL=True), 2),
        "gemv1-res": (F._fused_gemv1_kernel, _G1,
                      dict(BLOCK_N=8, BLOCK_K=512, EVEN_K=False, NORM=False, GLU=False,
                           HAS_BIAS=True, HAS_RES=True, EARLY=True, PDL=True), 1),
        "qkv-rope": (F._fused_qkv_rope_kernel, _ROPE,
                     dict(HALF=32, BLOCK_N=4, BLOCK_K=512, EVEN_K=True, NORM=True,
                          HAS_BIAS=False, EARLY=True, PDL=True), 2),
        "gemvm": (F._fused_gemvm_kernel, _G1,
                  dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, NORM=True, GLU=True, HAS_BIAS=False,
                       HAS_RES=True, PRECISION="tf32", PDL=True), 2),
    }


def _ops_after_wait(ptx):
    """Counts of the memory, FMA and barrier instructions after griddepcontrol.wait (the K
    loop and the epilogue); index arithmetic may be scheduled differently."""
    from collections import Counter
    tail = ptx[ptx.index("griddepcontrol.wait"):]
    ops = re.findall(r"^\s*(?:@%p\d+\s+)?((?:ld|st)\.global\S*|fma\S*|bar\.sync|shfl\S*)",
                     tail, re.M)
    return Counter(ops)


@pytest.mark.parametrize("name", ["gemv1-glu", "gemv1-res", "qkv-rope", "gemvm"])
def test_prefetch_in_ptx_sm90(name):
    """L2PF=1: one cp.async.bulk.prefetch.L2 per slab (GLU/RoPE: two), before the PDL wait;
    L2PF=2: prefetch.global.L2::evict_last instead; L2PF=0 / left at its default: neither.
    After the wait the code (the K loop) is the same instruction sequence."""
    pytest.importorskip("triton")
    fn, ptrs, cx, slabs = _kernels()[name]
    off = _ptx(fn, ptrs, dict(cx, L2PF=0))
    assert "prefetch" not in off
    on = _ptx(fn, ptrs, dict(cx, L2PF=1))
    assert on.count("cp.async.bulk.prefetch.L2.global") == slabs
    assert on.rindex("cp.async.bulk.prefetch.L2") < on.index("griddepcontrol.wait")
    assert "prefetch.global.L2::evict_last" not in on
    assert _ops_after_wait(on) == _ops_after_wait(off)
    assert on.count("ld.global") == off.count("ld.global")
    line = _ptx(fn, ptrs, dict(cx, L2PF=2))
    assert line.count("prefetch.global.L2::evict_last") == slabs
    assert line.rindex("prefetch.global.L2::evict_last") < line.index("griddepcontrol.wait")
    assert "cp.async.bulk" not in line
    rw = _ptx(fn, ptrs, dict(cx, L2PF=1, PF_ROWWISE=True, PF_CAP=16384))
    assert rw.count("cp.async.bulk.prefetch.L2.global") == slabs


def test_prefetch_variants_compile_at_model_configs():
    """The row-per-program kernel at the rule's configs of the sweep's shapes (16-bit, 4 and
    8 warps) compiles with the prefetch, without spilling into local memory."""
    pytest.importorskip("triton")
    from nbxtensor.kernels import decode_fused as F
    for (K, N, glu) in [(576, 1536, False), (2048, 16384, True), (14336, 4096, False)]:
        n_out = N // 2 if glu else N
        c = F.fused_gemv_config(1, n_out, K, 2, "cuda", "glu" if glu else "plain")
        cx = dict(BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], EVEN_K=K % c["BLOCK_K"] == 0,
                  NORM=False, GLU=glu, HAS_BIAS=False, HAS_RES=False, EARLY=True, PDL=True,
                  L2PF=1)
        ptx = _ptx(F._fused_gemv1_kernel, _G1, cx, c["num_warps"])
        assert "cp.async.bulk.prefetch.L2.global" in ptx and ".local" not in ptx


# ----------------------------------------------------------------------------- cuda
cuda = pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")


def _both(fn, P):
    """fn() with the prefetch off, then on (bulk), then line; NumPy results of each."""
    out = {}
    for mode in (P.L2PF_OFF, P.L2PF_BULK, P.L2PF_LINE):
        P.set_l2_prefetch_mode(mode)
        out[mode] = fn()
    return out


def _ref(x, w, nw=None, eps=1e-5, bias=None, res=None, glu=False):
    x, w = to64(x), to64(w)
    if nw is not None:
        x = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * to64(nw)
    y = x @ w.T
    if bias is not None:
        y = y + to64(bias)
    if glu:
        n = w.shape[0] // 2
        y = y[:, :n] / (1 + np.exp(-y[:, :n])) * y[:, n:]
    if res is not None:
        y = y + to64(res)
    return y


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype,M,mode", [
    *[("bfloat16", M, mode) for M in (1, 3, 9)       # 9: the tl.dot kernel (batch > SMALL_M)
      for mode in ("plain", "norm_bias", "glu", "residual", "strided")],
    ("float16", 1, "glu"), ("float16", 9, "norm_bias")])
def test_cuda_fused_linear_prefetch_bit_equal(l2pf, monkeypatch, dtype, M, mode):
    P = l2pf
    poison_allocations(monkeypatch)
    g = rng()
    dt = getattr(nbx, dtype)
    # N overhangs BLOCK_N (16/8/...) by one; K = 1031: rows not 16-byte aligned, tail chunk
    K, N = 1031, 16 * 17 + 1
    rows = 2 * N if mode == "glu" else N
    x = nbx.tensor(g.standard_normal((M, K)).astype(np.float32), device="cuda").to(dt)
    wa = (g.standard_normal((rows, K + 13)) / np.sqrt(K)).astype(np.float32)
    wfull = nbx.tensor(wa, device="cuda").to(dt)
    w = wfull[:, 5:5 + K] if mode == "strided" else wfull[:, :K].contiguous()
    kw = {}
    if mode in ("norm_bias", "glu"):
        kw.update(norm_weight=nbx.tensor(1 + 0.1 * g.standard_normal(K).astype(np.float32),
                                         device="cuda").to(dt), eps=1e-5)
    if mode == "norm_bias":
        kw["bias"] = nbx.tensor(g.standard_normal(N).astype(np.float32), device="cuda").to(dt)
    if mode == "glu":
        kw["glu"] = True
    if mode == "residual":
        kw["residual"] = nbx.tensor(g.standard_normal((M, N)).astype(np.float32),
                                    device="cuda").to(dt)
    got = _both(lambda: O.fused_linear(x, w, **kw).to(nbx.float32).numpy(), P)
    ref = _ref(x, w, kw.get("norm_weight"), kw.get("eps", 1e-5), kw.get("bias"),
               kw.get("residual"), kw.get("glu", False))
    tol = 3e-2 if dt is nbx.bfloat16 else 5e-3
    assert_close(got[P.L2PF_BULK], ref, rtol=tol, atol=tol)
    assert got[P.L2PF_BULK].tobytes() == got[P.L2PF_OFF].tobytes()
    assert got[P.L2PF_LINE].tobytes() == got[P.L2PF_OFF].tobytes()


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("cap,pmin", [(0, 16), (4096, 4096)])
def test_cuda_fused_linear_prefetch_cap_and_chunks(l2pf, cap, pmin):
    """The capped (row prefixes) and all-lanes chunkings give the same bits as off."""
    P = l2pf
    g = rng()
    K, N = 2048 + 8, 8 * 33 + 1
    x = nbx.tensor(g.standard_normal((1, K)).astype(np.float32), device="cuda").to(nbx.bfloat16)
    w = nbx.tensor((g.standard_normal((N, K)) / 45).astype(np.float32),
                   device="cuda").to(nbx.bfloat16)
    P.set_l2_prefetch_mode(P.L2PF_OFF)
    off = O.fused_linear(x, w).numpy()
    P.L2PF_CAP, P.L2PF_MIN_CHUNK = cap, pmin
    P.set_l2_prefetch_mode(P.L2PF_BULK)
    on = O.fused_linear(x, w).numpy()
    assert on.tobytes() == off.tobytes()
    assert_close(on.astype(np.float32), _ref(x, w), rtol=3e-2, atol=3e-2)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("B,bias", [(1, False), (2, True)])
def test_cuda_qkv_rope_prefetch_bit_equal(l2pf, B, bias):
    """fused_qkv_rope with the prefetch: q, the cache (NaN-poisoned first) and lengths
    bit-equal to off; q against float64."""
    P = l2pf
    g = rng()
    Hq, Hkv, D, K, C = 8, 2, 64, 1031, 16
    N = (Hq + 2 * Hkv) * D
    bf = nbx.bfloat16
    x = nbx.tensor(g.standard_normal((B, K)).astype(np.float32), device="cuda").to(bf)
    w = nbx.tensor((g.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32),
                   device="cuda").to(bf)
    nw = nbx.tensor(1 + 0.1 * g.standard_normal(K).astype(np.float32), device="cuda").to(bf)
    b = nbx.tensor(g.standard_normal(N).astype(np.float32), device="cuda").to(bf) \
        if bias else None
    pos_np = g.integers(0, C, (B, 1)).astype(np.int32)
    pos = nbx.tensor(pos_np, device="cuda")

    def run():
        c = nbx.KVCache(1, B, Hkv, C, D, dtype=bf, device="cuda")
        c.k.copy_(poisoned(tuple(c.k.shape), bf, "cuda"))
        c.v.copy_(poisoned(tuple(c.v.shape), bf, "cuda"))
        q = O.fused_qkv_rope(x, w, c, 0, pos, num_heads=Hq, norm_weight=nw, eps=1e-5,
                             bias=b, theta=500.0)
        return [t.to(nbx.float32).numpy() for t in (q, c.k, c.v)] + [c.lengths.numpy()]
    got = _both(run, P)
    for mode in (P.L2PF_BULK, P.L2PF_LINE):
        for a, e in zip(got[mode], got[P.L2PF_OFF]):
            assert a.tobytes() == e.tobytes()
    q = got[P.L2PF_BULK][0]
    xa = to64(x)
    xa = xa / np.sqrt(np.mean(xa * xa, -1, keepdims=True) + 1e-5) * to64(nw)
    y = xa @ to64(w).T + (to64(b) if bias else 0.0)
    inv = 1.0 / 500.0 ** (np.arange(0, D, 2) / D)
    for bb in range(B):
        a = pos_np[bb, 0] * inv
        t = y[bb, :Hq * D].reshape(Hq, D)
        t1, t2 = t[:, :D // 2], t[:, D // 2:]
        rq = np.concatenate([t1 * np.cos(a) - t2 * np.sin(a), t2 * np.cos(a) + t1 * np.sin(a)],
                            -1)
        assert_close(q[bb].reshape(Hq, D), rq, rtol=3e-2, atol=3e-2)
