"""Out-of-range cache lengths, cache positions and token ids, with canaries.

A KV cache here is a view out of the front of a bigger buffer whose tail holds a canary
(keys 0, values 1e4): a kernel that reads past the cache shows it in its output. Every bad
value must raise IndexError (cpu: at the op; interp and cuda: through the index-error flag,
which the `pending` fixture leaves pending on interp as on cuda, so the output written
meanwhile can be checked: it equals the answer at the length clamped to the capacity).
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng

CANARY_V = 1e4
C = 37                       # capacity: overhangs the interp key blocks (16)
OVERRIDES = [None,                                                       # shipped rule
             {"P": 3, "BLOCK_N": 16, "ONE_MAX": 0, "COMBINE": 1},        # split, fused merge
             {"P": 3, "BLOCK_N": 16, "ONE_MAX": 0, "COMBINE": 0}]        # split, merge kernel


@pytest.fixture
def pending(device):
    """The index-error flag left pending on interp too (cuda's default), read by `surfaces`;
    cpu checks on the host and raises at the op."""
    if device == "cpu":
        yield None
        return
    from nbxtensor.kernels import indexing as kix
    added = "interp" not in kix.ASYNC_TYPES
    kix.ASYNC_TYPES.add(device)
    try:
        yield kix
    finally:
        if added:
            kix.ASYNC_TYPES.discard("interp")


@pytest.fixture
def at_op(device):
    """Index checks as shipped: at the op on cpu and interp, at the next sync on cuda (the
    model tests: nothing runs on after the bad id)."""
    if device == "cpu":
        return None
    from nbxtensor.kernels import indexing as kix
    return kix


@contextlib.contextmanager
def surfaces(device, kix, match):
    """IndexError matching `match` from the block, at the op (cpu) or at the next sync."""
    with pytest.raises(IndexError, match=match):
        yield
        if device == "cuda":
            nbx.cuda.synchronize()
        elif kix is not None:
            kix.check_pending()


def ref_decode(q, kc, vc, n):
    """float64 flash-decoding reference: query t sees keys j <= n - T + t, j < n."""
    q, kc, vc = (np.asarray(a, np.float64) for a in (q, kc, vc))
    B, Hq, T, D = q.shape
    k = np.repeat(kc[:, :, :n], Hq // kc.shape[1], 1)
    v = np.repeat(vc[:, :, :n], Hq // kc.shape[1], 1)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(D)
    keep = np.arange(n)[None, :] <= (n - T + np.arange(T))[:, None]
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True, initial=-np.inf)
    e = np.exp(s - np.where(np.isinf(m), 0, m))
    z = e.sum(-1, keepdims=True)
    return (e / np.where(z == 0, 1, z)) @ v


def canary_cache(g, B, Hk, D, device, dtype=nbx.float32, tail=16):
    """(k, v) caches (B, Hk, C, D): views of (B, Hk, C + tail, D) buffers whose tail rows hold
    the canary, plus their random contents as float64 NumPy."""
    kb = nbx.full((B, Hk, C + tail, D), 0.0, dtype=dtype, device=device)
    vb = nbx.full((B, Hk, C + tail, D), CANARY_V, dtype=dtype, device=device)
    k = g.standard_normal((B, Hk, C, D)).astype(np.float32)
    v = g.standard_normal((B, Hk, C, D)).astype(np.float32)
    kc, vc = kb[:, :, :C], vb[:, :, :C]
    kc.copy_(nbx.tensor(k, device=device).to(dtype))
    vc.copy_(nbx.tensor(v, device=device).to(dtype))
    return kc, vc, kc.to(nbx.float32).numpy(), vc.to(nbx.float32).numpy()


@pytest.mark.parametrize("override", OVERRIDES)
@pytest.mark.parametrize("lens", [[C + 1, 5], [2, C + 7], [-3, C], [C + 16, C + 3]])
def test_decode_attention_lengths_past_the_capacity(device, pending, override, lens):
    from nbxtensor.kernels import decode_attention as kd
    if device == "cpu" and override is not None:
        pytest.skip("kernel tuning knobs: cuda/interp")
    g = rng()
    B, Hq, Hk, T, D = 2, 4, 2, 1, 16
    kc, vc, k, v = canary_cache(g, B, Hk, D, device)
    q = g.standard_normal((B, Hq, T, D)).astype(np.float32)
    qt = nbx.tensor(q, device=device)
    lt = nbx.tensor(np.array(lens, np.int32), device=device)
    kd._OVERRIDE = override
    try:
        outs = []
        for _ in range(2):
            out = nbx.full((B, Hq, T, D), float("nan"), device=device)
            with surfaces(device, pending, r"decode_attention: index -?\d+ is out of range for "
                                           rf"lengths \(the KV cache holds {C} slots\); the "
                                           rf"valid range is \[0, {C}\]"):
                nbx.decode_attention(qt, kc, vc, lt, out=out)
            outs.append(out.numpy())
    finally:
        kd._OVERRIDE = None
    if device == "cpu":
        return                                  # raised before computing anything
    # written while the error was pending: the clamped length's answer, never the canary
    assert np.isfinite(outs[0]).all() and np.abs(outs[0]).max() < 100
    for b, n in enumerate(lens):
        want = ref_decode(q[b:b + 1], k[b:b + 1], v[b:b + 1], min(max(n, 0), C))
        np.testing.assert_allclose(outs[0][b:b + 1], want, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("length", [2**31 - 1, 2**40, -2**40])
def test_decode_attention_huge_lengths(device, pending, length):
    """int32 max and int64 lengths: clamped before any index arithmetic, then refused."""
    g = rng()
    kc, vc, k, v = canary_cache(g, 1, 1, 8, device, dtype=nbx.bfloat16)
    q = g.standard_normal((1, 2, 2, 8)).astype(np.float32)
    qt = nbx.tensor(q, device=device).to(nbx.bfloat16)
    lt = nbx.tensor(np.array([length], np.int64), device=device)
    out = nbx.full((1, 2, 2, 8), float("nan"), dtype=nbx.bfloat16, device=device)
    with surfaces(device, pending, rf"index {length} is out of range for lengths"):
        nbx.decode_attention(qt, kc, vc, lt, out=out)
    if device != "cpu":
        o = out.to(nbx.float32).numpy()
        want = ref_decode(q.astype(nbx.bfloat16.np).astype(np.float32), k, v,
                          C if length > 0 else 0)
        np.testing.assert_allclose(o, want, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("bad", [[C], [C + 4], [-1]])
def test_append_at_capacity_raises_and_stays_in_its_layer(device, pending, rope, bad):
    """Appending at position == capacity (or past it, or before 0) raises, writes nothing
    and leaves the length inside the cache: the next decode_attention of layer 0 never reads
    layer 1, which holds the canary (batch 1, one kv head: slot C of layer 0 is layer 1's 0)."""
    g = rng()
    L, B, Hk, D, Hq = 2, 1, 1, 8, 2
    cache = nbx.KVCache(L, B, Hk, C, D, dtype=nbx.float32, device=device)
    cache.v[1].fill_(CANARY_V)

    def kv(T):
        return (nbx.tensor(g.standard_normal((B, Hk, T, D)).astype(np.float32), device=device),
                nbx.tensor(g.standard_normal((B, Hk, T, D)).astype(np.float32), device=device))
    k, v = kv(C)
    cache.append(0, k, v, nbx.tensor(np.arange(C), device=device))
    before = cache.k.numpy().copy(), cache.v.numpy().copy()
    k1, v1 = kv(1)
    q = nbx.tensor(g.standard_normal((B, Hq, 1, D)).astype(np.float32), device=device)
    op = "KVCache.append_rope" if rope else "KVCache.append"
    with surfaces(device, pending, rf"{op}: index {bad[0]} is out of range for positions "
                                   rf"\(the KV cache holds {C} slots\); the valid range is "
                                   rf"\[0, {C - 1}\]"):
        if rope:
            cache.append_rope(0, q, k1, v1, nbx.tensor(np.array(bad), device=device))
        else:
            cache.append(0, k1, v1, nbx.tensor(np.array(bad), device=device))
    np.testing.assert_array_equal(cache.k.numpy(), before[0])
    np.testing.assert_array_equal(cache.v.numpy(), before[1])
    n = int(cache.lengths.numpy()[0])
    assert 0 <= n <= C
    kl, vl, lengths = cache.view(0)
    o = nbx.decode_attention(nbx.tensor(g.standard_normal((B, Hq, 1, D)).astype(np.float32),
                                        device=device), kl, vl, lengths).numpy()
    assert np.isfinite(o).all() and np.abs(o).max() < 100


def test_append_raises_for_a_bad_position_among_good_ones(device, pending):
    """T = 3 tokens, the last one at the capacity: the first two are written, the third is
    not, the length stays at the capacity and the error names the bad position."""
    g = rng()
    cache = nbx.KVCache(1, 2, 1, C, 8, dtype=nbx.float32, device=device)
    k = g.standard_normal((2, 1, 3, 8)).astype(np.float32)
    pos = np.array([[C - 2, C - 1, C], [0, 1, 2]])
    with surfaces(device, pending, rf"KVCache.append: index {C} is out of range"):
        cache.append(0, nbx.tensor(k, device=device), nbx.tensor(k, device=device),
                     nbx.tensor(pos, device=device))
    if device != "cpu":      # cpu refuses before writing anything
        np.testing.assert_array_equal(cache.k.numpy()[0, 0, 0, C - 2:], k[0, 0, :2])
        np.testing.assert_array_equal(cache.k.numpy()[0, 1, 0, :3], k[1, 0])
        assert cache.lengths.numpy().tolist() == [C, 3]


@pytest.mark.cuda
def test_cuda_graph_replay_with_a_length_past_the_capacity():
    """Captured once with a good length, replayed with lengths past the capacity: the
    replay reads nothing past the cache and the next synchronize raises."""
    from test_graphs import _cuda_ok
    if not _cuda_ok():
        pytest.skip("no CUDA device")
    g = rng()
    kc, vc, k, v = canary_cache(g, 2, 2, 16, "cuda", dtype=nbx.bfloat16)
    q = g.standard_normal((2, 4, 1, 16)).astype(np.float32)
    qt = nbx.tensor(q, device="cuda").to(nbx.bfloat16)
    lt = nbx.tensor(np.array([5, 9], np.int32), device="cuda")
    out = nbx.decode_attention(qt, kc, vc, lt)
    nbx.cuda.synchronize()
    graph = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(graph):
        nbx.decode_attention(qt, kc, vc, lt, out=out)
    lt.copy_(nbx.tensor(np.array([C + 9, 3], np.int32), device="cuda"))
    graph.replay()
    with pytest.raises(IndexError, match=rf"index {C + 9} is out of range for lengths"):
        nbx.cuda.synchronize()
    o = out.to(nbx.float32).numpy()
    qb = q.astype(nbx.bfloat16.np).astype(np.float32)
    for b, n in enumerate([C, 3]):
        np.testing.assert_allclose(o[b:b + 1], ref_decode(qb[b:b + 1], k[b:b + 1], v[b:b + 1], n),
                                   rtol=3e-2, atol=3e-2)


# ---------------------------------------------------------------------------- the models
V = 97


_MODELS: dict = {}


def _model(device, embed):
    """The tiny Llama of test_graphs (vocabulary V, one layer) with its token embedding in
    `embed` (F32, or a GGUF block format quantised by the gguf package; lm_head stays float).
    Built once per (device, embed): the tests give each call its own cache."""
    if embed != "F32" and device == "cpu":
        pytest.skip("the cpu quantised path (numba) has its own tests: tests/models/test_cpu_quant.py")
    m = _MODELS.get((device, embed))
    if m is None:
        m = _MODELS[(device, embed)] = _build(device, embed)
    return m


def _build(device, embed, L=1):
    from test_graphs import _tiny_llama
    if embed == "F32":
        return _tiny_llama(device, L=L, V=V)
    gguf = pytest.importorskip("gguf")
    from nbxtensor.models import _ops as O
    from nbxtensor.models.llama import LlamaModel
    m = _tiny_llama(device, L=L, V=V)
    w = m.w
    a = w["embed"].numpy().astype(np.float32)
    blocks = gguf.quants.quantize(a, getattr(gguf.GGMLQuantizationType, embed))
    w["embed"] = O.QuantWeight(nbx.tensor(np.ascontiguousarray(blocks), device=device), embed,
                               a.shape)
    for Lw in w["layers"]:
        for n in ("wqkv", "w_gateup"):
            Lw.pop(n)
    return LlamaModel(m.cfg, w, None, device, m.dtype)


HOST = rf"token id {{bad}} is out of range for the vocabulary of {V} tokens"
DEVICE = rf"index {{bad}} is out of range for a weight of {V} rows"


def _run_path(m, path, bad):
    """Feed token id `bad` to the model through `path`."""
    from nbxtensor.models.graph_decode import GraphDecoder
    dev = m.device
    ids = nbx.tensor(np.array([[3, bad]]), device=dev)
    pos = nbx.tensor(np.array([[0, 1]], np.int32), device=dev)
    if path == "forward_list":
        m.forward([3, bad, 5], m.new_cache(8))
    elif path == "graph_prefill":
        GraphDecoder(m, batch=2, capacity=8).prefill([[1, 2, 3], [4, bad, 6]])
    elif path == "start_at":
        GraphDecoder(m, batch=1, capacity=8).start_at(2, [bad])
    elif path == "forward_tensor":
        m.forward(ids[0], m.new_cache(8))
    elif path == "prefill":
        m.prefill(ids, pos, m.new_kv_cache(1, 8))
    else:
        m.decode_step(ids[:, 1:], pos[:, 1:], m.new_kv_cache(1, 8))


# host ids are checked against the vocabulary before upload; device ids by the embedding
# kernels (nbx.embedding's gather, dequantize_rows) through the index-error flag
HOST_PATHS = ("forward_list", "graph_prefill", "start_at")
PATHS = ["forward_list", "forward_tensor", "prefill", "decode_step", "graph_prefill",
         "start_at"]


@pytest.mark.parametrize("embed", ["F32", "Q8_0", "Q4_1"])
@pytest.mark.parametrize("path", PATHS)
def test_token_id_out_of_the_vocabulary_raises(device, at_op, embed, path):
    """Token id == vocabulary size and a negative id raise IndexError naming the id and the
    vocabulary size on every path, whatever the embedding's format (quantised rows gave
    NaN rows before)."""
    m = _model(device, embed)
    for bad in (V, -1):
        match = (HOST if path in HOST_PATHS else r"(embedding|dequantize_rows): " + DEVICE)
        with surfaces(device, at_op, match.format(bad=bad)):
            _run_path(m, path, bad)


@pytest.mark.parametrize("embed", ["F32", "Q8_0"])
def test_graph_step_with_a_token_past_the_vocabulary(device, at_op, embed):
    """The decode step (cuda: the replayed graph) fed a token id beyond the vocabulary: the
    embedding kernel records it and the next synchronising call raises."""
    from nbxtensor.models.graph_decode import GraphDecoder
    m = _model(device, embed)
    dec = GraphDecoder(m, batch=1, capacity=8)
    dec.prefill([1, 2, 3])
    if dec.use_graph:
        dec.capture()
        nbx.cuda.synchronize()
    dec.tokens.fill_(V + 5)
    with surfaces(device, at_op, DEVICE.format(bad=V + 5)):
        dec.step()


def test_decode_step_at_the_capacity_raises(device, at_op):
    """The model's fused QKV + RoPE + append (cpu: append_rope) refuses a full cache."""
    m = _model(device, "F32")
    cache = m.new_kv_cache(1, 4)
    ids = nbx.tensor(np.array([[3]]), device=m.device)
    with surfaces(device, at_op, r"(decode_qkv_rope|KVCache.append_rope): index 4 is out of "
                                   r"range for positions \(the KV cache holds 4 slots\)"):
        m.decode_step(ids, nbx.tensor(np.array([[4]], np.int32), device=m.device), cache)
    assert 0 <= int(cache.lengths.numpy()[0]) <= 4


def test_quantised_decode_step_at_the_capacity_raises(device, at_op):
    """The same through the quantised fused QKV kernel (kernels/quant_fused.py)."""
    if device == "cpu":
        pytest.skip("the cpu quantised path (numba) has its own tests: tests/models/test_cpu_quant.py")
    from test_quant_fused import _uniform_quantised_tiny
    m = _uniform_quantised_tiny(device, L=1)
    cache = m.new_kv_cache(1, 4)
    ids = nbx.tensor(np.array([[3]]), device=m.device)
    with surfaces(device, at_op, r"decode_qkv_rope: index 5 is out of range for positions"):
        m.decode_step(ids, nbx.tensor(np.array([[5]], np.int32), device=m.device), cache)
    assert int(cache.lengths.numpy()[0]) == 4


@pytest.mark.parametrize("ids", [[1.7], [True], [2, "3"]])
def test_token_ids_must_be_ints(ids):
    """Host ids are not cast: 1.7 would become 1, True token 1."""
    m = _model("cpu", "F32")
    with pytest.raises(TypeError, match="token ids must be"):
        m.forward(ids, m.new_cache(8))


def test_model_embedding_refuses_negative_ids():
    """The models' embedding (the public op) refuses -1, which NumPy indexing would wrap to
    the last row."""
    from nbxtensor.models import _ops as O
    w = nbx.tensor(rng().standard_normal((5, 3)).astype(np.float32))
    for bad in (-1, 5):
        with pytest.raises(IndexError, match=rf"embedding: index {bad} is out of range for a "
                                             r"weight of 5 rows"):
            O.embedding(nbx.tensor(np.array([0, bad])), w)
