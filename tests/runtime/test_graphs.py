"""CUDA graphs: capture bookkeeping and refusals against a fake driver (CI), and capture +
replay of real nbx ops on the GPU (marked cuda)."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor.backends.cuda import driver, memory
from nbxtensor.backends.cuda.memory import CachingAllocator, FakeRaw
from nbxtensor.cuda import CaptureError

from helpers import assert_graph_generate_equals_eager, prefilled_eager_and_graph
from fakes import FakeDriver  # noqa: E402

MiB = 1 << 20


# ----------------------------------------------------------------------------- fake driver


@pytest.fixture
def fake(monkeypatch):
    """The driver over FakeDriver, device 0's allocator over FakeRaw, fresh stream tables."""
    from nbxtensor.backends.cuda import graphs, streams
    f = FakeDriver()
    monkeypatch.setattr(driver, "fn", f.fn)
    monkeypatch.setattr(driver._tls, "device", 0, raising=False)
    alloc = CachingAllocator(FakeRaw(), "cuda:0")
    monkeypatch.setitem(memory._allocators, 0, alloc)
    # the stream tables are shared by reference (launcher, storage): emptied, then restored
    tables = (streams.current_streams, streams.current_cstreams, streams.default_streams)
    saved = [dict(t) for t in tables]
    for t in tables:
        t.clear()
    monkeypatch.setattr(graphs, "_side_streams", {})
    monkeypatch.setattr(driver, "_capturing", {})
    f.alloc = alloc
    try:
        yield f
        gc.collect()
    finally:
        for t, old in zip(tables, saved):
            t.clear()
            t.update(old)


def _memset(t, value, stream=None):
    """A 'kernel' the fake can record: an async memset of t's bytes on the current stream."""
    s = nbx.cuda.current_stream(0).handle if stream is None else stream
    driver.memset_d32(t.data_ptr(), value, t.nbytes // 4, stream=s)


def _cuda_empty(n):
    return nbx.empty(n, dtype=nbx.float32, device="cuda")


def test_capture_records_on_a_side_stream_and_replays_on_the_current_stream(fake):
    x = _cuda_empty(1000)
    g = nbx.cuda.CUDAGraph()
    assert repr(g).startswith("<nbxtensor.cuda.CUDAGraph empty")
    before = nbx.cuda.current_stream(0)
    with nbx.cuda.graph(g) as gg:
        assert gg is g
        side = nbx.cuda.current_stream(0)
        assert side.handle != 0 and side != before
        assert nbx.cuda.is_current_stream_capturing()
        assert driver.capture_active()
        _memset(x, 7)
        y = _cuda_empty(300)           # from the graph's private pool
        _memset(y, 9)
    assert nbx.cuda.current_stream(0) == before and not driver.capture_active()
    assert not nbx.cuda.is_current_stream_capturing()
    names = fake.names()
    # synchronised before the capture, captured on the side stream, instantiated
    i = names.index("cuStreamBeginCapture")
    assert "cuCtxSynchronize" in names[:i]
    assert fake.calls[i][1] == [side.handle, driver.CAPTURE_MODE_GLOBAL]
    assert names[i:].count("cuMemsetD32Async") == 2
    assert "cuGraphInstantiateWithFlags" in names
    (exec_h, ops), = fake.execs.items()
    assert [op[1][0] for op in ops] == [x.data_ptr(), y.data_ptr()]
    assert g.node_types == {"kernel": 2} and g.kernel_count == 2   # fake reports type 0
    # y lives in the private pool, on the capture stream
    blk = fake.alloc.find(y.data_ptr())
    assert blk.seg.pool == g.pool().id != 0 and blk.seg.stream == side.handle
    assert fake.alloc.find(x.data_ptr()).seg.pool == 0
    g.replay()
    g.replay()
    assert fake.launched == [(exec_h, 0), (exec_h, 0)]      # current stream: legacy (0)
    s2 = nbx.cuda.Stream()
    with nbx.cuda.stream(s2):
        g.replay()
    assert fake.launched[-1] == (exec_h, s2.handle)


def test_reset_destroys_and_releases_the_pool(fake):
    g = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g):
        t = _cuda_empty(1000)
        _memset(t, 1)
        tmp = _cuda_empty(5000)
        del tmp                        # freed during capture: back to the private pool
    reserved = fake.alloc.reserved
    assert reserved == 2 * MiB
    exec_h = next(iter(fake.execs))
    g.reset()
    assert ("cuGraphExecDestroy", exec_h) in fake.destroyed
    assert any(n == "cuGraphDestroy" for n, _ in fake.destroyed)
    assert g.pool() is None and fake.alloc.reserved == reserved   # t still alive: kept
    with pytest.raises(RuntimeError, match="nothing captured"):
        g.replay()
    del t                                                          # ... released with it
    assert fake.alloc.reserved == 0 and fake.alloc.allocated == 0
    # the graph can capture again after reset
    with nbx.cuda.graph(g):
        u = _cuda_empty(10)
        _memset(u, 2)
    g.replay()
    del u
    g.reset()
    assert fake.alloc.reserved == 0


def test_graph_death_releases_its_pool(fake):
    g = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g):
        _memset(_cuda_empty(1000), 3)       # a temporary: dies inside the capture
    assert fake.alloc.reserved == 2 * MiB
    del g
    gc.collect()
    assert fake.alloc.reserved == 0
    assert any(n == "cuGraphExecDestroy" for n, _ in fake.destroyed)


def test_host_reads_and_synchronising_calls_raise_during_capture(fake):
    x = _cuda_empty(16)
    refusals = [
        (lambda: x.numpy(), r"Tensor.numpy\(\) / .item\(\)"),
        (lambda: x.item() if x.numel() == 1 else x[0].item(), r"\.item\(\)"),
        (lambda: nbx.cuda.synchronize(), "ctx_synchronize"),
        (lambda: nbx.cuda.current_stream().synchronize(), "stream_synchronize"),
        (lambda: nbx.cuda.default_stream().query(), "stream_query"),
        (lambda: nbx.tensor(np.ones(4, np.float32), device="cuda"), "host data"),
        (lambda: driver.memcpy_dtod(x.data_ptr(), x.data_ptr(), 4), "cuMemcpyDtoD"),
        (lambda: driver.memset_d8(x.data_ptr(), 0, 4), "cuMemsetD8"),
        (lambda: driver.memcpy_htod(x.data_ptr(), 0, 4), "cuMemcpyHtoD"),
        (lambda: driver.mem_free(x.data_ptr()), "cuMemFree"),
        (lambda: driver.event_synchronize(1), "cuEventSynchronize"),
    ]
    for bad, match in refusals:
        n_calls = len(fake.calls)
        g = nbx.cuda.CUDAGraph()
        with pytest.raises(CaptureError, match=match):
            with nbx.cuda.graph(g):
                _memset(x, 1)
                bad()
        # refused before reaching the driver: the capture was ended, nothing instantiated
        names = [n for n, _ in fake.calls[n_calls:]]
        during = names[names.index("cuStreamBeginCapture") + 1:names.index("cuStreamEndCapture")]
        assert during == ["cuMemsetD32Async"], during
        assert "cuStreamEndCapture" in names and "cuGraphInstantiateWithFlags" not in names
        assert not driver.capture_active() and nbx.cuda.current_stream(0).handle == 0
        with pytest.raises(RuntimeError, match="nothing captured"):
            g.replay()
    # the async forms are captured, not refused
    g = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g):
        s = nbx.cuda.current_stream().handle
        driver.memcpy_dtod(x.data_ptr(), x.data_ptr(), 4, stream=s)
    assert len(next(iter(fake.execs.values()))) == 1
    # and outside a capture the same calls work again
    nbx.cuda.synchronize()
    x.numpy()
    assert fake.alloc.allocated == memory.round_size(64)


def test_shared_pool_allocation_during_capture_raises(fake):
    other = nbx.cuda.Stream()
    g = nbx.cuda.CUDAGraph()
    with pytest.raises(CaptureError, match="shared pool"):
        with nbx.cuda.graph(g):
            _cuda_empty(10)
            with nbx.cuda.stream(other):
                _cuda_empty(10)        # another stream: not the graph's pool
    assert fake.alloc.capture_guard is None and fake.alloc._pool == 0
    with pytest.raises(CaptureError, match="shared pool"):
        with nbx.cuda.graph(g):
            fake.alloc.malloc(512, 0)  # directly from the allocator, on the legacy stream
    assert fake.alloc.allocated == 0 and fake.alloc.reserved == 0   # failed captures released
    y = _cuda_empty(10)                 # after the capture: the shared pool again
    assert fake.alloc.find(y.data_ptr()).seg.pool == 0


def test_capture_refusals(fake):
    g = nbx.cuda.CUDAGraph()
    with pytest.raises(CaptureError, match="legacy default stream"):
        with nbx.cuda.graph(g, stream=nbx.cuda.default_stream()):
            pass
    with pytest.raises(TypeError, match="expected an nbx.cuda.CUDAGraph"):
        with nbx.cuda.graph(object()):
            pass
    with pytest.raises(TypeError, match="stream must be an nbx.cuda.Stream"):
        with nbx.cuda.graph(g, stream=5):
            pass
    with pytest.raises(ValueError, match="capture_error_mode"):
        with nbx.cuda.graph(g, capture_error_mode="loose"):
            pass
    # one capture at a time; no replay or reset while capturing
    g2 = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g):
        with pytest.raises(CaptureError, match="another capture is in progress"):
            with nbx.cuda.graph(g2, stream=nbx.cuda.Stream()):
                pass
        with pytest.raises(CaptureError, match="still capturing"):
            g.reset()
        with pytest.raises(CaptureError, match="already capturing"):
            g.capture_begin(nbx.cuda.current_stream())
    with pytest.raises(CaptureError, match="already holds a capture"):
        with nbx.cuda.graph(g):
            pass
    with nbx.cuda.graph(g2, stream=nbx.cuda.Stream()):
        with pytest.raises(CaptureError, match="while a capture is in progress"):
            g.replay()
    with pytest.raises(CaptureError, match="not capturing"):
        g.capture_end()


def test_modes_and_an_invalidated_capture(fake):
    g = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g, capture_error_mode="thread_local"):
        pass
    begin = [a for n, a in fake.calls if n == "cuStreamBeginCapture"]
    assert begin[-1][1] == driver.CAPTURE_MODE_THREAD_LOCAL
    # the driver invalidates a capture (e.g. another thread synchronised): a named CudaError
    g = nbx.cuda.CUDAGraph()
    with pytest.raises(driver.CudaError, match="CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"):
        with nbx.cuda.graph(g):
            fake.invalidated.add(nbx.cuda.current_stream().handle)
    assert not driver.capture_active() and fake.alloc.capture_guard is None
    with pytest.raises(RuntimeError, match="nothing captured"):
        g.replay()


def test_raw_device_allocation_during_capture_runs_in_relaxed_mode(fake):
    # a new private-pool segment needs cuMemAlloc, which the driver refuses under a global
    # capture: the thread is switched to relaxed mode around it and switched back
    assert driver.mem_alloc(1 << 21)
    assert "cuThreadExchangeStreamCaptureMode" not in fake.names()
    g = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g):
        n = len(fake.calls)
        ptr = driver.mem_alloc(1 << 21)
        assert ptr
        assert [(c, a) for c, a in fake.calls[n:]][1][0] == "cuMemAlloc"
        modes = [a for c, a in fake.calls[n:] if c == "cuThreadExchangeStreamCaptureMode"]
        assert len(modes) == 2 and fake.thread_mode == driver.CAPTURE_MODE_GLOBAL
    g.replay()


def test_replay_many_times_leaves_allocator_unchanged(fake):
    x = _cuda_empty(256)
    g = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g):
        y = _cuda_empty(256)
        _memset(y, 1)
    stats = fake.alloc.stats()
    for _ in range(1000):
        g.replay()
    assert fake.alloc.stats() == stats and len(fake.launched) == 1000
    del x, y


def test_import_does_not_load_libcuda():
    import subprocess
    import sys
    code = ("import nbxtensor as nbx, sys; g = nbx.cuda.CUDAGraph(); "
            "from nbxtensor.backends.cuda import driver; "
            "assert driver._lib is None and 'triton' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- GPU

def _cuda_ok():
    try:
        return driver.availability()[0]
    except Exception:
        return False


def _rand(shape, dtype, seed):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return nbx.tensor(a, device="cuda").to(dtype)


def _step(x, w, b, r):
    """A chain of elementwise kernels and a linear: y = silu(x @ w.T + b) * r + x[:, :N]."""
    h = nbx.linear(x, w, b)
    h = nbx.mul(nbx.silu(h), r)
    return nbx.add(h, nbx.exp(nbx.neg(nbx.abs(h))))


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("m", [1, 37])
def test_cuda_capture_replay_equals_eager_bit_for_bit(dtype, m):
    dt = getattr(nbx, dtype)
    K, N = 257, 385
    x, w, b, r = (_rand((m, K), dt, 1), _rand((N, K), dt, 2), _rand((N,), dt, 3),
                  _rand((m, N), dt, 4))
    eager = _step(x, w, b, r).numpy()          # also compiles and loads every kernel
    g = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g):
        y = _step(x, w, b, r)
    assert g.kernel_count >= 5, g.node_types
    y.fill_(float("nan"))                      # poisoned: only the replay writes it
    g.replay()
    got = y.numpy()
    assert got.tobytes() == eager.tobytes()
    # new values in place: the replay picks them up
    x2 = np.random.default_rng(9).standard_normal((m, K)).astype(np.float32)
    x.copy_(nbx.tensor(x2, device="cuda").to(dt))
    eager2 = _step(x, w, b, r).numpy()
    assert eager2.tobytes() != eager.tobytes()
    g.replay()
    assert y.numpy().tobytes() == eager2.tobytes()
    # against an independent float64 reference (loose: the point above is equality)
    xf, wf, bf, rf = (t.to(nbx.float32).numpy().astype(np.float64) for t in (x, w, b, r))
    h = xf @ wf.T + bf
    h = h / (1 + np.exp(-h)) * rf
    ref = h + np.exp(-np.abs(h))
    tol = 2e-2 if dtype == "bfloat16" else 1e-4
    np.testing.assert_allclose(y.to(nbx.float32).numpy(), ref, rtol=tol, atol=tol)
    g.reset()


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
def test_cuda_refusals_during_capture_and_context_survives():
    x = _rand((64,), nbx.float32, 5)
    nbx.add(x, 1.0)                           # warm up
    for bad, match in [(lambda: x[0].item(), r"\.item\(\)"),
                       (lambda: x.numpy(), r"numpy"),
                       (lambda: nbx.cuda.synchronize(), "ctx_synchronize"),
                       (lambda: nbx.cuda.current_stream().synchronize(), "stream_synchronize"),
                       (lambda: nbx.tensor(np.ones(3, np.float32), device="cuda"), "host data")]:
        g = nbx.cuda.CUDAGraph()
        with pytest.raises(CaptureError, match=match):
            with nbx.cuda.graph(g):
                nbx.add(x, 1.0)
                bad()
    other = nbx.cuda.Stream()
    g = nbx.cuda.CUDAGraph()
    with pytest.raises(CaptureError, match="shared pool"):
        with nbx.cuda.graph(g):
            with nbx.cuda.stream(other):
                nbx.empty(10, device="cuda")
    # the device and the eager path are fine afterwards
    y = nbx.add(x, 1.0)
    np.testing.assert_array_equal(y.numpy(), x.numpy() + np.float32(1.0))
    assert not driver.capture_active()


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
def test_cuda_1000_replays_leave_memory_unchanged_and_reset_releases():
    x = _rand((4, 1024), nbx.bfloat16, 6)
    w = _rand((512, 1024), nbx.bfloat16, 7)
    nbx.silu(nbx.linear(x, w)).numpy()
    nbx.cuda.synchronize()
    base_alloc, base_res = nbx.cuda.memory_allocated(), nbx.cuda.memory_reserved()
    g = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g):
        y = nbx.silu(nbx.linear(x, w))
    after = nbx.cuda.memory_allocated()
    for _ in range(1000):
        g.replay()
    nbx.cuda.synchronize()
    assert nbx.cuda.memory_allocated() == after
    ref = nbx.silu(nbx.linear(x, w)).numpy()
    assert y.numpy().tobytes() == ref.tobytes()
    del y, ref
    g.reset()
    assert nbx.cuda.memory_allocated() == base_alloc
    assert nbx.cuda.memory_reserved() == base_res


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
def test_cuda_captured_copies_and_a_counter_advance_on_device():
    # a device-side counter: each replay adds 1 (the decode step's position update)
    pos = nbx.zeros((1,), dtype=nbx.int32, device="cuda")
    nbx.add(pos, 1, out=pos)
    pos.zero_()
    src = _rand((100,), nbx.float32, 8)
    dst = nbx.zeros((100,), dtype=nbx.float32, device="cuda")
    g = nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g):
        nbx.add(pos, 1, out=pos)
        dst.copy_(src)
    for _ in range(5):
        g.replay()
    assert pos.item() == 5
    np.testing.assert_array_equal(dst.numpy(), src.numpy())


# ----------------------------------------------------------------------------- static decode

def _tiny_llama(device, dtype=None, seed=0, V=97, H=64, L=2, Hq=4, Hkv=2, F=96):
    from nbxtensor.models.config import LlamaConfig
    from nbxtensor.models.llama import LlamaModel
    dtype = dtype or nbx.float32
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L,
                      num_attention_heads=Hq, num_key_value_heads=Hkv, head_dim=H // Hq,
                      max_position_embeddings=64)
    rng = np.random.default_rng(seed)

    def t(*s, scale=None, shift=0.0):
        a = rng.standard_normal(s).astype(np.float32) * (scale or 1 / np.sqrt(s[-1])) + shift
        return nbx.tensor(a, device=device).to(dtype)
    D = H // Hq
    w = {"embed": t(V, H, scale=1.0), "norm": t(H, scale=0.1, shift=1.0),
         "lm_head": t(V, H, scale=3 / np.sqrt(H)), "layers": []}
    for _ in range(L):
        w["layers"].append({"attn_norm": t(H, scale=0.1, shift=1.0),
                            "ffn_norm": t(H, scale=0.1, shift=1.0),
                            "wq": t(Hq * D, H), "wk": t(Hkv * D, H), "wv": t(Hkv * D, H),
                            "wo": t(H, H), "w_gate": t(F, H), "w_up": t(F, H), "w_down": t(H, F)})
    return LlamaModel(cfg, w, None, device, dtype)


def _model_greedy(m, prompt, n):
    """Greedy tokens from LlamaModel.forward (the model's own eager path): the reference."""
    cache = m.new_cache(32)
    toks = [int(np.argmax(m.forward(prompt, cache).numpy()))]
    while len(toks) < n:
        toks.append(int(np.argmax(m.forward([toks[-1]], cache).numpy())))
    return toks


def test_static_decode_step_matches_the_model(device):
    from nbxtensor.models.graph_decode import GraphDecoder
    L, n = (2, 8) if device == "cpu" else (1, 4)       # interp is slow
    m = _tiny_llama(device, L=L)
    p1, p2 = [3, 14, 15, 92, 65], [7, 7, 1, 50, 2]
    ref = [_model_greedy(m, p, n) for p in (p1, p2)]
    assert ref[0] != ref[1]
    dec = GraphDecoder(m, batch=2, capacity=24)
    assert dec.use_graph == (device == "cuda")
    seen = []
    res = dec.generate([p1, p2], max_new_tokens=n, on_tokens=lambda i, row: seen.append(list(row)),
                       sync_every=2)
    assert res.tokens == ref
    assert [list(r) for r in zip(*ref)] == seen and res.steps == n - 1
    assert dec.pos == len(p1) + n - 1
    # stop ids cut each sequence after its stop token
    stop = ref[0][2]
    res = dec.generate([p1, p2], max_new_tokens=n, stop_ids=[stop], sync_every=1)
    assert res.tokens[0] == ref[0][:ref[0].index(stop) + 1]


def test_static_decode_refusals():
    from nbxtensor.models.graph_decode import GraphDecoder
    m = _tiny_llama("cpu", L=1)
    with pytest.raises(ValueError, match="use_graph=True needs a cuda model"):
        GraphDecoder(m, use_graph=True)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        GraphDecoder(m, batch=0)
    dec = GraphDecoder(m, batch=2, capacity=8)
    with pytest.raises(ValueError, match="expected 2 prompts"):
        dec.prefill([[1, 2]])
    with pytest.raises(ValueError, match="equal length"):
        dec.prefill([[1, 2], [3]])
    with pytest.raises(ValueError, match="no room"):
        dec.prefill([[1] * 8, [2] * 8])
    dec.prefill([[1] * 6, [2] * 6])
    dec.step()
    dec.step()
    with pytest.raises(ValueError, match="is full"):
        dec.step()


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
@pytest.mark.parametrize("batch", [1, 3])
def test_cuda_static_decode_replay_equals_eager_step_bit_for_bit(batch):
    m = _tiny_llama("cuda", dtype=nbx.bfloat16, L=2, V=300, H=128, Hq=4, Hkv=2, F=256)
    prompts = [[5 + b, 17, 3 * b + 1, 200, 9] for b in range(batch)]
    eager, graph = prefilled_eager_and_graph(m, prompts, batch)
    for i in range(12):
        te = eager.step().numpy()
        tg = graph.step().numpy()
        assert te.tobytes() == tg.tobytes(), i
        assert eager.logits.numpy().tobytes() == graph.logits.numpy().tobytes(), i
        assert graph.positions.numpy().tolist() == [[len(prompts[0]) + i + 1]] * batch
    # and generate() through the graph equals the eager loop
    assert_graph_generate_equals_eager(m, prompts, batch, 16)


# ----------------------------------------------------------------------------- shared pools

def test_graphs_share_a_pool_released_with_its_last_user(fake):
    h = nbx.cuda.graph_pool_handle()
    g1, g2 = nbx.cuda.CUDAGraph(), nbx.cuda.CUDAGraph()
    with nbx.cuda.graph(g1, pool=h):
        _memset(_cuda_empty(1000), 1)            # a temporary: back to the pool
    with nbx.cuda.graph(g2, pool=g1.pool()):     # torch's other form: another graph's pool()
        _memset(_cuda_empty(1000), 2)            # reuses g1's freed block: no new segment
    assert g1.pool().id == g2.pool().id == h.mempool.id
    assert fake.alloc.reserved == 2 * MiB
    del h
    g1.reset()
    assert fake.alloc.reserved == 2 * MiB        # g2 still uses the pool
    del g2
    gc.collect()
    assert fake.alloc.reserved == 0
    g3 = nbx.cuda.CUDAGraph()
    with pytest.raises(TypeError, match="pool must be a GraphPool"):
        with nbx.cuda.graph(g3, pool=7):
            pass
    with pytest.raises(CaptureError, match="is not the pool of a live graph"):
        with nbx.cuda.graph(g3, pool=memory.MemPool(99)):
            pass
    assert not driver.capture_active()


# ----------------------------------------------------------------------------- graphed callables

def _fill_out(x, value=3):
    """A graphable function for the fake: one 'kernel' (a memset) into a new output."""
    y = _cuda_empty(x.shape[0] // 2)
    _memset(y, value)
    return y, {"input": x, "none": None}


def _launch_count(fake):
    return len(fake.launched)


def test_graphed_captures_once_per_signature_and_replays(fake):
    g = nbx.cuda.graphed(_fill_out)
    x1, x2 = _cuda_empty(100), _cuda_empty(100)
    y1, d1 = g(x1)
    assert fake.names().count("cuStreamBeginCapture") == 1 and g.captures == 1
    # the warm-up ran eagerly (a memset outside any capture), then the capture, then a replay
    assert _launch_count(fake) == 1 and g.replays == 1
    static_in = d1["input"]
    assert static_in is not x1 and static_in.shape == x1.shape and d1["none"] is None
    fake.calls.clear()
    y2, d2 = g(x2)                                   # same signature: replay only
    assert y2 is y1 and d2["input"] is static_in     # torch's rule: the static outputs
    names = fake.names()
    assert "cuStreamBeginCapture" not in names
    copy = names.index("cuMemcpyDtoDAsync")
    assert names.index("cuGraphLaunch") > copy
    assert fake.calls[copy][1][:3] == [static_in.data_ptr(), x2.data_ptr(), x2.nbytes]
    g(x1, 4)                                         # a new constant: a new graph
    g(_cuda_empty(200))                              # a new shape: a new graph
    assert g.num_graphs == 3 and g.captures == 3
    pools = {e.graph.pool().id for e in g._graphs.values()}
    assert len(pools) == 1                           # one pool for the callable's graphs
    g.reset()
    assert g.num_graphs == 0


def test_graphed_host_inputs_are_copied_to_the_device(fake):
    seen = []

    def f(x):
        seen.append(x.device.type)
        return _fill_out(x)[0]
    g = nbx.cuda.graphed(f, device="cuda")
    a = np.arange(64, dtype=np.float32)
    y = g(a)
    assert seen == ["cuda", "cuda"] and y.device.type == "cuda"
    fake.calls.clear()
    g(nbx.from_numpy(a))                             # a cpu tensor: the same signature
    assert fake.names().count("cuMemcpyHtoD") == 1 and "cuStreamBeginCapture" not in fake.names()


def test_graphed_refusals_name_the_function(fake):
    x = _cuda_empty(16)

    def syncs(x):
        nbx.cuda.synchronize()
        return _fill_out(x)

    def reads(x):
        return _fill_out(x)[0], x[0].item()

    def host_data(x):
        return nbx.tensor(np.ones(4, np.float32), device="cuda")

    calls = [0]

    def reshapes(x):
        calls[0] += 1
        return _cuda_empty(calls[0])

    def returns_a_number(x):
        return 3

    before = nbx.cuda.current_stream(0)
    for fn, match in ((syncs, r"syncs cannot be graphed \(inputs 0: \(16,\) float32\): "
                              r"ctx_synchronize"),
                      (reads, r"reads cannot be graphed.*device-to-host read"),
                      (host_data, r"host_data cannot be graphed.*host data"),
                      (reshapes, r"reshapes changes shapes from call to call.*warm-up returned "
                                 r"\[\('output', \(1,\)\)\], the capture \[\('output', \(2,\)\)\]")):
        g = nbx.cuda.graphed(fn)
        with pytest.raises(CaptureError, match=match):
            g(x)
        assert g.num_graphs == 0 and not driver.capture_active()
        assert nbx.cuda.current_stream(0) == before
    with pytest.raises(TypeError, match=r"output is int; a graphed callable returns tensors"):
        nbx.cuda.graphed(returns_a_number)(x)
    g = nbx.cuda.graphed(_fill_out)
    with pytest.raises(TypeError, match=r"argument 1 \(list\) is neither a tensor nor hashable"):
        g(x, [1])
    with pytest.raises(ValueError, match=r"argument 0 is on interp"):
        g(nbx.zeros(4, device="interp"))
    with pytest.raises(ValueError, match="no cuda tensor among the arguments and no device="):
        g(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="warmup must be an int >= 1, got 0"):
        nbx.cuda.graphed(_fill_out, warmup=0)
    with pytest.raises(TypeError, match="fn must be callable"):
        nbx.cuda.graphed(3)


def test_graphed_lru_bound_resets_the_oldest_graph(fake):
    g = nbx.cuda.graphed(_fill_out, max_graphs=2)
    g(_cuda_empty(10))
    first = next(iter(g._graphs.values())).graph
    g(_cuda_empty(20))
    g(_cuda_empty(10))                               # refresh the first: now the newest
    g(_cuda_empty(30))                               # evicts the 20
    assert g.num_graphs == 2 and first._exec is not None
    assert [k[0][2] for k in g._graphs] == [(10,), (30,)]


def test_graphed_replay_on_another_stream_waits_for_the_last_replay(fake):
    g = nbx.cuda.graphed(_fill_out)
    x = _cuda_empty(8)
    g(x)
    fake.calls.clear()
    g(x)
    assert "cuStreamWaitEvent" not in fake.names()   # same stream: stream order suffices
    s = nbx.cuda.Stream()
    with nbx.cuda.stream(s):
        fake.calls.clear()
        g(_cuda_empty(8))
    names = fake.names()
    wait = names.index("cuStreamWaitEvent")
    assert fake.calls[wait][1][0] == s.handle
    assert wait < names.index("cuMemcpyDtoDAsync") < names.index("cuGraphLaunch")


def test_make_graphed_callables_on_a_module_and_functions(fake):
    class Net(nbx.nn.Module):
        def forward(self, x):
            return _fill_out(x, 5)[0]
    net, x = Net(), _cuda_empty(32)
    same = nbx.cuda.make_graphed_callables(net, (x,))
    assert same is net and isinstance(net.forward, nbx.cuda.GraphedCallable)
    assert fake.names().count("cuStreamBeginCapture") == 1 and not fake.launched
    y = net(x)                                       # replays: no new capture
    assert fake.names().count("cuStreamBeginCapture") == 1 and len(fake.launched) == 1
    assert y.shape == (16,)
    f1, f2 = nbx.cuda.make_graphed_callables((_fill_out, lambda t: _fill_out(t, 9)[0]),
                                             ((x,), (x,)))
    assert fake.names().count("cuStreamBeginCapture") == 3
    assert f2(x).shape == (16,)
    with pytest.raises(ValueError, match="one argument tuple per callable"):
        nbx.cuda.make_graphed_callables((_fill_out, _fill_out), ((x,),))


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
def test_cuda_graphed_callable_equals_eager_for_each_shape():
    def f(x, w, b, r):
        return {"y": _step(x, w, b, r), "s": nbx.softmax(x, dim=-1)}
    g = nbx.cuda.graphed(f)
    K, N = 257, 385
    w, b = _rand((N, K), nbx.float32, 2), _rand((N,), nbx.float32, 3)
    for m, seed in ((37, 10), (1, 11), (37, 12), (130, 13)):
        x, r = _rand((m, K), nbx.float32, seed), _rand((m, N), nbx.float32, seed + 100)
        eager = f(x, w, b, r)
        got = g(x, w, b, r)
        for k in ("y", "s"):
            assert got[k].numpy().tobytes() == eager[k].numpy().tobytes(), (m, k)
        got["y"].fill_(float("nan"))                # poisoned: the next replay rewrites it
        again = g(x, w, b, r)
        assert again["y"] is got["y"]
        assert again["y"].numpy().tobytes() == eager["y"].numpy().tobytes()
    assert g.num_graphs == 3 and g.captures == 3 and g.replays == 8
    # host inputs are copied into the static buffers
    xh = np.random.default_rng(5).standard_normal((37, K)).astype(np.float32)
    rh = np.random.default_rng(6).standard_normal((37, N)).astype(np.float32)
    got = g(xh, w, b, rh)["y"].numpy()
    eager = _step(nbx.tensor(xh, device="cuda"), w, b, nbx.tensor(rh, device="cuda")).numpy()
    assert got.tobytes() == eager.tobytes() and g.num_graphs == 3


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
def test_cuda_make_graphed_module():
    net = nbx.nn.Sequential(nbx.nn.Linear(96, 200), nbx.nn.GELU(), nbx.nn.LayerNorm(200),
                            nbx.nn.Linear(200, 33)).to("cuda")
    x = _rand((50, 96), nbx.float32, 7)
    eager = net(x).numpy()
    nbx.cuda.make_graphed_callables(net, (x,))
    x.copy_(_rand((50, 96), nbx.float32, 8))
    got = net(x).numpy()
    ref = x.numpy().astype(np.float64)
    for layer in (net[0], None, net[2], net[3]):
        if layer is None:
            from math import erf
            ref = 0.5 * ref * (1 + np.vectorize(erf)(ref / np.sqrt(2)))
        elif isinstance(layer, nbx.nn.Linear):
            ref = ref @ layer.weight.numpy().astype(np.float64).T + layer.bias.numpy()
        else:
            mu, var = ref.mean(-1, keepdims=True), ref.var(-1, keepdims=True)
            ref = (ref - mu) / np.sqrt(var + layer.eps) * layer.weight.numpy() + layer.bias.numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3)
    assert not np.allclose(got, eager)
