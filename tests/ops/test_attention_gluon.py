"""The Gluon flash-attention prototype (kernels/attention_gluon.py) vs float64 NumPy.

Gluon has no interpreter path: the numerical tests are cuda-only. What runs everywhere:
the routing rule (`applies`, on stand-in tensors) and the sm_90 compile (no GPU needed:
Triton compiles and ptxas assembles for a target), which pins the kernel's shape --
12 warps (8 consumer + the loader warpgroup), shared memory under the 227 KB limit,
wgmma + TMA + mbarrier in the PTX.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import poisoned, rng

LOG2E = 1.4426950408889634


def ref_sdpa(q, k, v, causal):
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    H, Hk = q.shape[1], k.shape[1]
    k, v = np.repeat(k, H // Hk, 1), np.repeat(v, H // Hk, 1)
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        L, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) @ v


def _dev(a, dtype):
    return nbx.tensor(np.asarray(a).astype(nbx.dtypes.as_dtype(dtype).np), device="cuda")


def _cuda_only(device):
    if device != "cuda":
        pytest.skip("cuda only (Gluon kernels do not run on the interpreter)")


TOL = {"bfloat16": 2e-2, "float16": 5e-3}


# ------------------------------------------------------------------ cuda: numerics
VARIANTS = {
    "fused-s2": dict(SPLIT=False, STAGES=2), "fused-s3": dict(SPLIT=False, STAGES=3),
    "split-s2": dict(SPLIT=True, STAGES=2), "split-s3": dict(SPLIT=True, STAGES=3),
    # (PAIR keeps two Q tiles in shared memory: STAGES 2 only; every entry names its STAGES so
    # a change of DEFAULT does not change what is tested)
    "fused-pair": dict(SPLIT=False, PAIR=True, STAGES=2),
    "split-pair": dict(SPLIT=True, PAIR=True, STAGES=2),
    "split-s2-pp": dict(SPLIT=True, PINGPONG=True, STAGES=2),
    "split-pair-pp": dict(SPLIT=True, PAIR=True, PINGPONG=True, STAGES=2),
}
# PINGPONG's named barriers would HANG if wrong, which would take the whole cuda test run
# down: its cases run only when asked (NBX_GLUON_PINGPONG=1), after the sweep showed it right
PP_ON = os.environ.get("NBX_GLUON_PINGPONG") == "1"
# B, H, Hk, L, S, causal, dtype
FULL = [(2, 4, 2, 384, 384, True, "bfloat16"),     # GQA 4/2, 3 tiles (PAIR: 2+0 and 1 alone)
        (1, 2, 2, 256, 384, False, "bfloat16")]    # non-causal cross-attention, L != S
EDGE = [(1, 2, 2, 128, 128, True, "bfloat16"),     # one tile: only the diagonal block
        (1, 2, 2, 512, 512, True, "bfloat16"),     # 4 tiles: PAIR 3+0, 2+1
        (1, 2, 1, 640, 640, True, "float16"),      # 5 tiles: the ring wraps, G2, PAIR odd
        (1, 3, 1, 128, 128, False, "float16")]     # non-causal one block: no loop, G3
# (STAGES 3 only on the causal case: every variant is also checked at full size by the sweep)
CASES = ([(c, v) for c in FULL for v in VARIANTS if c[5] or not v.endswith("-s3")]
         + [(c, v) for c in EDGE for v in ("fused-s2", "split-pair", "split-s3")])


@pytest.mark.parametrize("case,variant", CASES, ids=[f"{c[3]}x{c[4]}-{'c' if c[5] else 'nc'}-"
                                                     f"{c[6].replace('bfloat', 'bf').replace('float', 'fp')}-{v}"
                                                     for c, v in CASES])
def test_gluon_kernel_vs_float64(device, case, variant):
    _cuda_only(device)
    if variant.endswith("-pp") and not PP_ON:
        pytest.skip("PINGPONG cases run with NBX_GLUON_PINGPONG=1")
    from nbxtensor.kernels import attention_gluon as ag
    B, H, Hk, L, S, causal, dt = case
    g = rng()
    q, k, v = (g.standard_normal(s) for s in ((B, H, L, 128), (B, Hk, S, 128), (B, Hk, S, 128)))
    out = poisoned((B, H, L, 128), dt, "cuda")
    ag.sdpa_gluon(out, _dev(q, dt), _dev(k, dt), _dev(v, dt), LOG2E / math.sqrt(128),
                  causal=causal, **VARIANTS[variant])
    o = out.numpy().astype(np.float64)
    assert not np.isnan(o).any(), "rows left unwritten (NaN poison) or NaN computed"
    np.testing.assert_allclose(o, ref_sdpa(q, k, v, causal), rtol=TOL[dt], atol=TOL[dt])


def test_gluon_dispatch_and_fallback(device, monkeypatch):
    """With GLUON_CAUSAL on, the public op routes causal D=128 S%128==0 calls to the Gluon
    kernel (also on (B, S, H, D) strided views) and everything else to the Triton kernels;
    both right; three identical calls give identical bits."""
    _cuda_only(device)
    from nbxtensor.kernels import attention as ka, attention_gluon as ag
    calls = []
    orig = ag.sdpa_gluon
    monkeypatch.setattr(ag, "sdpa_gluon", lambda *a, **kw: calls.append(1) or orig(*a, **kw))
    monkeypatch.setattr(ka, "GLUON_CAUSAL", True)
    g = rng()
    for S, causal, want in ((256, True, 1), (257, True, 0), (256, False, 0)):
        q, k, v = (g.standard_normal((2, 4, S, 128)) for _ in range(3))
        k, v = k[:, :2], v[:, :2]
        n0 = len(calls)
        o = nbx.scaled_dot_product_attention(*(_dev(a, "bfloat16") for a in (q, k, v)),
                                             is_causal=causal, enable_gqa=True)
        assert len(calls) - n0 == want, (S, causal)
        np.testing.assert_allclose(o.numpy().astype(np.float64), ref_sdpa(q, k, v, causal),
                                   rtol=2e-2, atol=2e-2)
    # (B, S, 3, H, D) packed qkv as models produce: strided views, TMA-able -> Gluon
    buf = g.standard_normal((2, 256, 3, 4, 128))
    nb = _dev(buf, "bfloat16")
    q, k, v = (nb[:, :, i].transpose(1, 2) for i in range(3))
    n0 = len(calls)
    outs = [nbx.scaled_dot_product_attention(q, k, v, is_causal=True).numpy() for _ in range(3)]
    assert len(calls) - n0 == 3
    ref = ref_sdpa(*(buf[:, :, i].transpose(0, 2, 1, 3) for i in range(3)), True)
    np.testing.assert_allclose(outs[0].astype(np.float64), ref, rtol=2e-2, atol=2e-2)
    assert all(np.array_equal(outs[0].view(np.uint16), o.view(np.uint16)) for o in outs[1:])


def test_gluon_refuses_other_tiles(device):
    _cuda_only(device)
    from nbxtensor.kernels import attention_gluon as ag
    q = _dev(np.ones((1, 1, 128, 64)), "bfloat16")
    with pytest.raises(ValueError, match="D == 128"):
        ag.sdpa_gluon(q, q, q, q, 1.0, causal=True)
    q = _dev(np.ones((1, 1, 200, 128)), "bfloat16")
    with pytest.raises(ValueError, match="multiples of 128"):
        ag.sdpa_gluon(q, q, q, q, 1.0, causal=True)
    q = _dev(np.ones((1, 1, 128, 128)), "bfloat16")
    with pytest.raises(ValueError, match="unknown settings"):
        ag.sdpa_gluon(q, q, q, q, 1.0, causal=True, STAGE=2)


# ------------------------------------------------------------------ host-only checks
class _Fake:
    """A stand-in tensor for `applies`: device type, dtype, strides, base pointer."""

    def __init__(self, shape, dev="cuda", dtype="bfloat16", strides=None, ptr=4096):
        self.shape = shape
        self.device = type("D", (), {"type": dev, "index": 0})()
        self.dtype = getattr(nbx, dtype)
        st, acc = [], 1
        for n in reversed(shape):
            st.insert(0, acc)
            acc *= n
        self._st = tuple(strides or st)
        self._ptr = ptr

    def stride(self):
        return self._st

    def data_ptr(self):
        return self._ptr


def test_gluon_applies_rule(monkeypatch):
    from dataclasses import replace
    from nbxtensor.kernels import _common
    from nbxtensor.kernels.attention_gluon import applies
    hopper = replace(_common.INTERP, type="cuda", cc=90)     # the chip, as the driver says
    monkeypatch.setattr(_common, "_CUDA", {0: hopper})

    def ok(L=256, S=256, D=128, DV=128, causal=True, mask=None, scale=0.1, **kw):
        t = _Fake((1, 2, L, D), **kw)
        kv = _Fake((1, 2, S, D), **kw)
        return applies(t, kv, kv, t, mask, scale, causal, L, S, D, DV)

    assert ok()
    assert not ok(causal=False)              # non-causal keeps the verified WS kernel
    assert not ok(L=256, S=384)              # causal needs L == S
    assert not ok(L=257, S=257)              # tails: the pointer kernel
    assert not ok(D=64, DV=64)
    assert not ok(mask=object())
    assert not ok(scale=0.0)
    assert not ok(dev="interp")
    assert ok(dtype="float16")
    assert not ok(dtype="float32")
    assert not ok(dtype="int16")             # 2-byte but not a float
    assert not ok(strides=(2 * 256 * 128, 256 * 128, 0, 1))     # a broadcast sequence dim
    assert not ok(ptr=4098)                  # TMA needs a 16-byte aligned base
    assert not ok(strides=(2 * 256 * 130, 256 * 130, 130, 1))   # 260-byte rows: not 16-aligned
    assert not ok(strides=(2 * 256 * 128, 256 * 128, 1, 256))   # head dim not unit-stride
    monkeypatch.setattr(_common, "_CUDA", {0: replace(hopper, cc=89)})
    assert not ok()                          # TMA and wgmma need sm_90


@pytest.mark.parametrize("causal,stages,split,pair,pp", [(True, 2, False, False, False),
                                                        (False, 3, True, False, False),
                                                        (True, 2, True, True, True)])
def test_gluon_compiles_for_sm90(causal, stages, split, pair, pp):
    """No GPU needed: the launcher's own bind + compile (GluonASTSource) for sm_90."""
    pytest.importorskip("triton")
    import ml_dtypes
    from nbxtensor.backends.cuda import launcher as L
    from nbxtensor.kernels import attention_gluon as ag
    q = nbx.tensor(np.ones((2, 4, 256, 128), ml_dtypes.bfloat16))
    k = nbx.tensor(np.ones((2, 2, 256, 128), ml_dtypes.bfloat16))
    args = (q, k, k, q, *q.stride()[:3], *k.stride()[:3], *k.stride()[:3], *q.stride()[:3],
            4, 256, 256, 0.1275)
    kw = dict(GROUP=2, BLOCK_M=128, BLOCK_N=128, HEAD_D=128, CAUSAL=causal, STAGES=stages,
              LOADER_REGS=24, PAIR=pair, num_warps=4 if split else 8)
    kern = ag._gfa_fwd_split if split else ag._gfa_fwd
    if split:
        kw.update(CONSUMER_REGS=240, PINGPONG=pp)
    sig, ce, attrs, opts, rt = L.bind(kern, args, kw)
    ck = L._compile(kern, sig, ce, attrs, opts, 90)
    md, ptx = ck.metadata, ck.asm["ptx"]
    assert md.num_warps == 12                   # 8 consumer warps + the loader's warpgroup
    assert md.shared <= 232448                  # the H200's opt-in limit (227 KB)
    assert L.declared_param_count(ptx) == len(rt) + 2
    for needle in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier.try_wait",
                   "setmaxnreg.inc.sync.aligned.u32 \t240"):
        assert needle in ptx, needle
    # the ping-pong's named barriers: 8/9 alternate, balanced (no arrive left pending)
    n = {x: ptx.count(x) for x in ("bar.sync 8, 256", "bar.sync 9, 256", "bar.arrive 8, 256",
                                   "bar.arrive 9, 256")}
    assert (min(n.values()) > 0) == pp, n
