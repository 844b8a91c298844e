"""Pinned staging uploads (nbxtensor.io.staging) against a fake driver (CI), and for real
on the GPU (marked cuda).

The fake stands host memory in for device memory and runs queued async copies LATE (only
when an event or the stream is synchronised), reading the pinned buffer at that moment, as
the DMA engine would. A copy whose pinned source was overwritten (or freed) before it ran
is recorded as a violation, so reusing a buffer before its event completed cannot pass.
"""
from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor.backends.cuda import driver, memory
from nbxtensor.backends.cuda.memory import CachingAllocator
from nbxtensor.io import staging
from nbxtensor.io.staging import Uploader, UploadError, upload_many

from fakes import FakeGPU, MemRaw

HAVE_GPU = driver.availability()[0]
gpu = [pytest.mark.cuda, pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")]


@pytest.fixture
def gpu_fake(monkeypatch):
    from nbxtensor.backends.cuda import storage
    raw = MemRaw()
    f = FakeGPU(raw)
    monkeypatch.setitem(memory._allocators, 0, CachingAllocator(raw, "cuda:0"))
    monkeypatch.setattr(driver, "set_device", lambda i: None)
    monkeypatch.setattr(driver, "_capturing", {})
    monkeypatch.setattr(storage, "_stream_handle", lambda i: 0)
    for name in ("mem_host_alloc", "mem_free_host", "memcpy_htod", "stream_create",
                 "stream_destroy", "stream_synchronize", "event_create", "event_destroy",
                 "event_record", "event_synchronize", "event_query"):
        monkeypatch.setattr(driver, name, getattr(f, name))
    monkeypatch.setattr(staging, "_POOL", staging._PinnedPool())     # this fake's own pool
    yield f
    gc.collect()
    staging.release_pinned_memory()
    assert not f.pinned, "pinned memory neither pooled nor freed"


def _rand_bytes(rng, n):
    return rng.integers(0, 256, n, dtype=np.uint8)


CHUNK = 1024


@pytest.mark.parametrize("nbytes", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 37])
@pytest.mark.parametrize("nbuf", [1, 2, 3])
def test_every_byte_arrives_across_chunk_boundaries(gpu_fake, nbytes, nbuf):
    rng = np.random.default_rng(nbytes * 7 + nbuf)
    # two tensors: the second starts mid-buffer after the first
    a, b = _rand_bytes(rng, nbytes), _rand_bytes(rng, nbytes + 3)
    with Uploader("cuda", chunk_bytes=CHUNK, num_buffers=nbuf) as up:
        ta, tb = up.upload(a, "a"), up.upload(b, "b")
    assert gpu_fake.violations == []
    assert gpu_fake.read(ta) == a.tobytes() and gpu_fake.read(tb) == b.tobytes()
    assert ta.shape == (nbytes,) and ta.device.type == "cuda" and ta.dtype is nbx.uint8
    assert gpu_fake.leaks() == {"pinned": 0, "streams": 0, "events": 0}
    copies = [e for e in gpu_fake.log if e[0] == "copy"]
    assert all(n <= CHUNK for *_, n in copies)
    assert sum(n for *_, n in copies) == 2 * nbytes + 3
    assert len({e[2] for e in copies}) <= nbuf


def test_dtypes_shapes_and_layouts(gpu_fake):
    rng = np.random.default_rng(1)
    items = {
        "f32": rng.standard_normal((33, 17)).astype(np.float32),
        "bf16": rng.standard_normal((5, 300)).astype(ml_dtypes.bfloat16),
        "f16_T": rng.standard_normal((40, 30)).astype(np.float16).T,      # non-contiguous
        "i64_0d": np.array(-123456789012, np.int64),
        "bool": rng.random(77) > 0.5,
        "u8_empty": np.zeros((3, 0), np.uint8),
        "f8": rng.standard_normal(100).astype(ml_dtypes.float8_e4m3fn),
    }
    out = upload_many(items, "cuda", chunk_bytes=CHUNK, num_buffers=2)
    assert gpu_fake.violations == [] and gpu_fake.leaks()["pinned"] == 0
    for k, a in items.items():
        t = out[k]
        assert tuple(t.shape) == a.shape, k
        assert t.dtype is nbx.dtypes.as_dtype(a.dtype), k
        assert gpu_fake.read(t) == np.ascontiguousarray(a).tobytes(), k


def test_buffers_are_reused_only_after_their_event(gpu_fake):
    rng = np.random.default_rng(2)
    a = _rand_bytes(rng, 10 * CHUNK + 5)
    with Uploader("cuda", chunk_bytes=CHUNK, num_buffers=2) as up:
        t = up.upload(a, "big")
    assert gpu_fake.violations == []
    assert gpu_fake.read(t) == a.tobytes()
    allocs = [e for e in gpu_fake.log if e[0] == "host_alloc"]
    # allocated once each (pool grain: 64 KiB >= CHUNK)
    assert len(allocs) == 2 and all(n == 64 << 10 for *_, n in allocs)
    # order: before the 3rd..11th copy from a buffer, that buffer's previous event was waited for
    seen = {}          # buffer -> state: "copied" (since last record) / "recorded" / "waited"
    ev_buf, waits = {}, 0
    for e in gpu_fake.log:
        if e[0] == "copy":
            buf = e[2]
            assert seen.get(buf, "waited") != "recorded", "buffer refilled before its event"
            seen[buf] = "copied"
            last = buf
        elif e[0] == "event_record":
            ev_buf[e[1]] = last
            seen[last] = "recorded"
        elif e[0] == "event_sync":
            seen[ev_buf[e[1]]] = "waited"
            waits += 1
    assert waits == 9      # 11 pieces through 2 buffers: every reuse waited


def test_pinned_buffers_are_pooled_across_uploaders(gpu_fake):
    """The H200 finding: pinning per uploader cost ~0.8 ms/MiB. A second load reuses the
    first one's pinned buffers; release_pinned_memory() hands them back."""
    rng = np.random.default_rng(21)
    for rep in range(3):
        a = _rand_bytes(rng, 7 * CHUNK + 11)
        with Uploader("cuda", chunk_bytes=CHUNK, num_buffers=2) as up:
            t = up.upload(a, f"w{rep}")
        assert gpu_fake.read(t) == a.tobytes()
    assert sum(e[0] == "host_alloc" for e in gpu_fake.log) == 2       # pinned once
    assert sum(e[0] == "host_free" for e in gpu_fake.log) == 0
    assert staging.pinned_pool_bytes() == 2 * (64 << 10)
    assert gpu_fake.leaks() == {"pinned": 0, "streams": 0, "events": 0}
    assert gpu_fake.violations == []
    assert staging.release_pinned_memory() == 2 * (64 << 10)
    assert sum(e[0] == "host_free" for e in gpu_fake.log) == 2 and not gpu_fake.pinned
    # a bigger ring than the pool holds: the missing buffers are pinned, the rest reused
    with Uploader("cuda", chunk_bytes=CHUNK, num_buffers=1) as up:
        up.upload(_rand_bytes(rng, 10), "one")
    with Uploader("cuda", chunk_bytes=CHUNK, num_buffers=3) as up:
        t = up.upload(a, "three")
    assert gpu_fake.read(t) == a.tobytes()
    assert sum(e[0] == "host_alloc" for e in gpu_fake.log) == 2 + 3


def test_pool_is_capped_and_a_failed_wait_frees_instead_of_pooling(gpu_fake, monkeypatch):
    monkeypatch.setattr(staging, "POOL_MAX_BYTES", 2 * (64 << 10))
    a = _rand_bytes(np.random.default_rng(22), 5 * CHUNK)
    with Uploader("cuda", chunk_bytes=CHUNK, num_buffers=3) as up:
        up.upload(a, "a")
    assert staging.pinned_pool_bytes() == 2 * (64 << 10)             # one freed at once
    assert sum(e[0] == "host_free" for e in gpu_fake.log) == 1
    # the stream wait fails: the buffers may still be read by the DMA -> freed, not pooled
    staging.release_pinned_memory()
    up = Uploader("cuda", chunk_bytes=CHUNK, num_buffers=2)
    up.upload(a, "b")
    real_sync = gpu_fake.stream_synchronize

    def bad_sync(st):
        if st == up._stream:
            gpu_fake._run(st)        # the work does finish; only the call reports failure
            raise driver.CudaError(999, "cuStreamSynchronize")
        return real_sync(st)
    monkeypatch.setattr(driver, "stream_synchronize", bad_sync)
    with pytest.raises(UploadError, match="waiting for the uploads"):
        up.close()
    assert staging.pinned_pool_bytes() == 0 and not gpu_fake.pinned


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_fill_every_byte(gpu_fake, monkeypatch, threads):
    """Large pieces are split over the fill threads (page-aligned parts)."""
    monkeypatch.setattr(staging, "PARALLEL_MIN_BYTES", 8192)
    monkeypatch.setattr(staging, "PART_MIN_BYTES", 4096)
    parts = []
    real_copyto = np.copyto

    def spy(dst, src):
        parts.append(src.nbytes)
        real_copyto(dst, src)
    monkeypatch.setattr(staging.np, "copyto", spy)
    rng = np.random.default_rng(23 + threads)
    arrs = [(f"t{i}", _rand_bytes(rng, n)) for i, n in
            enumerate([3 * 65536 + 777, 8191, 8192, 12289, 65536, 100])]
    with Uploader("cuda", chunk_bytes=65536, num_buffers=2, threads=threads) as up:
        out = up.upload_many(arrs)
    monkeypatch.setattr(staging.np, "copyto", real_copyto)
    assert gpu_fake.violations == []
    for name, a in arrs:
        assert gpu_fake.read(out[name]) == a.tobytes(), name
    assert sum(parts) == sum(a.nbytes for _, a in arrs)
    if threads == 1:
        assert len(parts) == sum(-(-a.nbytes // 65536) for _, a in arrs) + 1   # 65536 lands
    else:                                                                       # mid-buffer
        assert max(parts) <= -(-65536 // threads // 4096) * 4096
        assert len(parts) > 12
    with pytest.raises(ValueError, match="threads"):
        Uploader("cuda", threads=0)


def test_the_fake_catches_a_buffer_reused_without_waiting(gpu_fake, monkeypatch):
    """Mutation check: an uploader that skips the event wait must be caught."""
    def no_wait(self, k):
        if self._bufs[k] is None:
            return orig(self, k)
        self._pending[k] = False
        return self._views[k]
    orig = Uploader._buffer
    monkeypatch.setattr(Uploader, "_buffer", no_wait)
    a = _rand_bytes(np.random.default_rng(3), 4 * CHUNK)
    with Uploader("cuda", chunk_bytes=CHUNK, num_buffers=2) as up:
        t = up.upload(a, "x")
    assert gpu_fake.violations
    assert gpu_fake.read(t) != a.tobytes()


def test_tensors_dropped_before_synchronize_keep_their_block(gpu_fake):
    """A tensor dropped while its copy is queued must not give its block back yet."""
    rng = np.random.default_rng(12)
    a, b = _rand_bytes(rng, 3000), _rand_bytes(rng, 3000)
    alloc = memory._allocators[0]
    with Uploader("cuda", chunk_bytes=CHUNK, num_buffers=2) as up:
        t = up.upload(a, "dropped")
        ptr = t.data_ptr()
        del t
        gc.collect()
        assert alloc.allocated >= 3000          # still held by the uploader
        u = up.upload(b, "next")
        assert u.data_ptr() != ptr
    gc.collect()
    assert gpu_fake.read(u) == b.tobytes() and gpu_fake.violations == []
    del u
    gc.collect()
    assert alloc.allocated == 0                 # released after the synchronize


def test_small_tensors_are_packed_into_one_buffer(gpu_fake):
    rng = np.random.default_rng(4)
    arrs = [(f"t{i}", _rand_bytes(rng, 1 + i % 13)) for i in range(60)]     # 60 aligned slots
    with Uploader("cuda", chunk_bytes=64 * 256, num_buffers=3) as up:
        out = up.upload_many(arrs)
        assert up.stats()["buffers_used"] == 1
    assert gpu_fake.violations == []
    for name, a in arrs:
        assert gpu_fake.read(out[name]) == a.tobytes(), name
    assert sum(e[0] == "host_alloc" for e in gpu_fake.log) == 1
    assert sum(e[0] == "event_record" for e in gpu_fake.log) == 1      # one seal at the end
    offs = [e[3] for e in gpu_fake.log if e[0] == "copy"]
    assert offs == sorted(offs) and all(o % 256 == 0 for o in offs)     # packed, aligned


def test_many_small_tensors_spill_over_buffers(gpu_fake):
    rng = np.random.default_rng(5)
    arrs = [(f"t{i}", rng.standard_normal(int(rng.integers(1, 200))).astype(np.float32))
            for i in range(80)]
    out = upload_many(arrs, "cuda", chunk_bytes=CHUNK, num_buffers=2)
    assert gpu_fake.violations == [] and gpu_fake.leaks()["pinned"] == 0
    for name, a in arrs:
        assert gpu_fake.read(out[name]) == a.tobytes(), name


def test_total_bytes_hint_shrinks_the_buffers_and_stats(gpu_fake):
    a = np.arange(300, dtype=np.float32)
    with Uploader("cuda", total_bytes=a.nbytes) as up:
        up.upload(a, "a")
    assert up.chunk_bytes == 1280 and up.stats()["bytes"] == 1200 and up.tensors == 1
    assert up.seconds > 0 and up.rate_mb_s > 0
    # pinned sizes are pool grains (64 KiB, powers of two), not the default 4 MiB
    assert [e for e in gpu_fake.log if e[0] == "host_alloc"][0][2] == 64 << 10


def test_progress_is_driven(gpu_fake):
    class P:
        done = 0

        def update(self, n):
            P.done += n
    a = np.ones(1000, np.float64)
    upload_many({"a": a, "b": a[:10]}, "cuda", progress=P())
    assert P.done == 8080


def test_copy_failure_names_the_tensor_and_frees_everything(gpu_fake):
    gpu_fake.fail_copy_at = 3
    rng = np.random.default_rng(6)
    up = Uploader("cuda", chunk_bytes=CHUNK, num_buffers=2)
    up.upload(_rand_bytes(rng, 100), "first")
    with pytest.raises(UploadError, match=r"tensor 'layers\.0\.wq'.*CUDA_ERROR|tensor 'layers\.0\.wq'"):
        up.upload(_rand_bytes(rng, 3 * CHUNK), "layers.0.wq")
    assert gpu_fake.leaks() == {"pinned": 0, "streams": 0, "events": 0}
    assert gpu_fake.violations == []
    with pytest.raises(UploadError, match="closed"):
        up.upload(_rand_bytes(rng, 10), "again")
    up.close()      # idempotent


def test_pinned_alloc_failure_and_context_exit_on_error(gpu_fake):
    gpu_fake.fail_host_alloc = True
    with pytest.raises(UploadError, match=r"tensor 'emb'.*cuMemHostAlloc"):
        upload_many({"emb": np.ones(10, np.float32)}, "cuda")
    assert gpu_fake.leaks() == {"pinned": 0, "streams": 0, "events": 0}
    gpu_fake.fail_host_alloc = False
    with pytest.raises(KeyError):
        with Uploader("cuda", chunk_bytes=CHUNK) as up:
            up.upload(np.ones(3000, np.uint8), "x")
            raise KeyError("user code failed")
    assert gpu_fake.leaks() == {"pinned": 0, "streams": 0, "events": 0}
    assert gpu_fake.violations == []


def test_refusals(gpu_fake):
    with pytest.raises(ValueError, match="cuda device"):
        Uploader("cpu")
    with pytest.raises(ValueError, match="chunk_bytes"):
        Uploader("cuda", chunk_bytes=10)
    with pytest.raises(ValueError, match="num_buffers"):
        Uploader("cuda", num_buffers=0)
    with Uploader("cuda") as up:
        with pytest.raises(TypeError, match="tensor 'w'.*NumPy array"):
            up.upload([1, 2], "w")
        with pytest.raises(TypeError, match="tensor 'w' is float32 but dtype"):
            up.upload(np.ones(2, np.float32), "w", dtype="float16")
        with pytest.raises(TypeError, match="dtype of tensor 'c'"):
            up.upload(np.ones(2, np.clongdouble), "c")
        with pytest.raises(TypeError, match="dtype of tensor 'u'.*uint64"):
            up.upload(np.ones(2, np.uint64), "u")
    assert gpu_fake.leaks()["pinned"] == 0


def test_refused_during_graph_capture(gpu_fake, monkeypatch):
    monkeypatch.setattr(driver, "_capturing", {0x99: "CUDAGraph on cuda:0"})
    with pytest.raises(driver.CaptureError, match="uploading host data to the GPU.*captured"):
        Uploader("cuda")
    monkeypatch.setattr(driver, "_capturing", {})
    up = Uploader("cuda", chunk_bytes=CHUNK)
    t = up.upload(np.arange(10, dtype=np.int32), "before")
    monkeypatch.setattr(driver, "_capturing", {0x99: "CUDAGraph on cuda:0"})
    with pytest.raises(driver.CaptureError, match="uploading tensor 'pos'"):
        up.upload(np.arange(10, dtype=np.int32), "pos")
    monkeypatch.setattr(driver, "_capturing", {})
    up.close()
    assert gpu_fake.read(t) == np.arange(10, dtype=np.int32).tobytes()
    assert gpu_fake.leaks()["pinned"] == 0


def test_safetensors_load_to_cuda_goes_through_staging(gpu_fake, tmp_path, monkeypatch):
    from nbxtensor.io import safetensors as st
    rng = np.random.default_rng(7)
    ref = {"a": rng.standard_normal((64, 33)).astype(np.float32),
           "b": rng.standard_normal(5).astype(ml_dtypes.bfloat16),
           "e": np.zeros((0, 4), np.float16)}
    p = tmp_path / "m.safetensors"
    st.save_file({k: nbx.from_numpy(v) for k, v in ref.items()}, p)
    monkeypatch.setattr(staging, "DEFAULT_CHUNK_BYTES", 1024)
    seen = []
    orig = Uploader.upload

    def spy(self, arr, name=None, dtype=None):
        seen.append(name)
        return orig(self, arr, name, dtype)
    monkeypatch.setattr(Uploader, "upload", spy)
    out = st.load_file(p, device="cuda")
    assert sorted(seen) == ["a", "b", "e"]
    for k, v in ref.items():
        assert gpu_fake.read(out[k]) == v.tobytes() and tuple(out[k].shape) == v.shape
    monkeypatch.setattr(staging, "SINGLE_MIN_BYTES", 0)
    with st.safe_open(p) as f:
        t = f.get_tensor("a", device="cuda")
    assert gpu_fake.read(t) == ref["a"].tobytes()
    assert gpu_fake.violations == [] and gpu_fake.leaks()["pinned"] == 0


# ----------------------------------------------------------------------------- model loaders

from test_models import tiny_bert_folder, tiny_model_files  # noqa: E402,F401 (fixtures)


def _flat_weights(w):
    from nbxtensor.models._ops import QuantWeight
    out = {}
    for k, v in w.items():
        if k == "layers":
            for i, L in enumerate(v):
                out.update({f"{i}.{n}": x for n, x in L.items()})
        else:
            out[k] = v
    return {k: (v.blocks if isinstance(v, QuantWeight) else v) for k, v in out.items()}


@pytest.fixture
def capture_init(monkeypatch):
    """Model constructors keep the weights and do nothing else (no kernels on the fake)."""
    from nbxtensor.models import BertModel, LlamaModel

    def init(self, cfg, w, *a, **k):
        self.w = w
    monkeypatch.setattr(LlamaModel, "__init__", init)
    monkeypatch.setattr(BertModel, "__init__", init)


def _host_bytes(t):
    return np.ascontiguousarray(t.numpy()).tobytes()


@pytest.mark.parametrize("how", ["folder", "gguf_q", "gguf_deq", "gguf_devdeq", "bert"])
def test_model_loaders_upload_through_staging(gpu_fake, capture_init, monkeypatch,
                                              tiny_model_files, tiny_bert_folder, how):
    from nbxtensor.models import BertModel, LlamaModel
    d = tiny_model_files
    names = []
    orig = Uploader.upload
    monkeypatch.setattr(Uploader, "upload", lambda self, a, name=None, dtype=None:
                        names.append(name) or orig(self, a, name, dtype))
    if how == "folder":
        load = lambda dev: LlamaModel.from_folder(str(d), device=dev, dtype="bfloat16")  # noqa: E731
        ref_dev = "cpu"
    elif how == "bert":
        load = lambda dev: BertModel.from_folder(str(tiny_bert_folder), device=dev)  # noqa: E731
        ref_dev = "cpu"
    else:
        q = how in ("gguf_q", "gguf_devdeq")
        from nbxtensor.models import llama
        if how == "gguf_deq":           # host dequantisation, then the staged upload
            monkeypatch.setattr(llama, "DEVICE_DEQUANT_TYPES", ())
        if how == "gguf_devdeq":        # raw blocks staged, then a device kernel: stand it in
            import nbxtensor.kernels.quant as kq

            def fake_dequant(qw, dtype):
                assert all(not q for q in gpu_fake.queues.values()), "kernel before upload landed"
                return qw.blocks
            monkeypatch.setattr(kq, "dequantize", fake_dequant)
            load_q = lambda dev, qq: LlamaModel.from_gguf(  # noqa: E731
                str(d / "tiny.gguf"), device=dev, dtype="float32", quantized=qq)
            got = _flat_weights(load_q("cuda", False).w)
            want = _flat_weights(load_q("interp", True).w)
            raw = [k for k in want if got[k].dtype is nbx.uint8]
            assert len(raw) >= 5
            for k in raw:
                assert gpu_fake.read(got[k]) == _host_bytes(want[k]), k
            assert gpu_fake.violations == [] and gpu_fake.leaks()["pinned"] == 0
            return
        load = lambda dev: LlamaModel.from_gguf(str(d / "tiny.gguf"), device=dev,  # noqa: E731
                                                dtype="float32", quantized=q)
        ref_dev = "interp" if q else "cpu"
    got = _flat_weights(load("cuda").w)
    n_up = len(names)
    want = _flat_weights(load(ref_dev).w)
    assert n_up == len(names) and n_up >= 10            # every weight went through staging
    assert got.keys() == want.keys()
    for k in want:
        if got[k] is None:
            continue
        assert got[k].device.type == "cuda" and got[k].dtype is want[k].dtype, k
        assert gpu_fake.read(got[k]) == _host_bytes(want[k]), k
    assert gpu_fake.violations == [] and gpu_fake.leaks() == {"pinned": 0, "streams": 0,
                                                              "events": 0}


def test_default_compute_dtype_bf16_on_cuda(gpu_fake, monkeypatch, tiny_model_files):
    """On cuda a GGUF model (weights still quantised) and an HF folder compute in bf16
    unless asked; float32 on request."""
    from nbxtensor.models import LlamaModel
    from nbxtensor.models._ops import QuantWeight

    def init(self, cfg, w, tok, dev, dtype, *a):
        self.w, self.dtype = w, dtype
    monkeypatch.setattr(LlamaModel, "__init__", init)
    d = tiny_model_files

    def floats(m):
        return {v.dtype for v in _flat_weights(m.w).values()
                if v is not None and v.dtype is not nbx.uint8}
    m = LlamaModel.from_gguf(str(d / "tiny.gguf"), device="cuda")
    assert m.dtype is nbx.bfloat16 and floats(m) == {nbx.bfloat16}
    assert any(isinstance(L["wq"], QuantWeight) for L in m.w["layers"])   # still quantised
    m = LlamaModel.from_gguf(str(d / "tiny.gguf"), device="cuda", dtype="float32")
    assert m.dtype is nbx.float32 and floats(m) == {nbx.float32}
    m = LlamaModel.from_folder(str(d), device="cuda")
    assert m.dtype is nbx.bfloat16 and floats(m) == {nbx.bfloat16}
    assert gpu_fake.violations == []


def test_model_loader_failure_frees_the_staging_buffers(gpu_fake, capture_init,
                                                        tiny_model_files):
    from nbxtensor.models import LlamaModel
    gpu_fake.fail_copy_at = 5
    with pytest.raises(UploadError, match=r"upload of tensor '[^']+'"):
        LlamaModel.from_folder(str(tiny_model_files), device="cuda")
    assert gpu_fake.leaks() == {"pinned": 0, "streams": 0, "events": 0}


# ----------------------------------------------------------------------------- real GPU

@pytest.mark.parametrize("chunk,nbuf,threads", [(32 << 20, 3, 1), (1 << 20, 2, 4),
                                                (None, None, None)])
@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
def test_real_upload_few_hundred_mb(chunk, nbuf, threads, record_property):
    rng = np.random.default_rng(8)
    # int64: nbxtensor has no uint64 (the upload refuses it by name, see test_refusals)
    big = rng.integers(-2**63, 2**63 - 1, (300 << 20) // 8, dtype=np.int64)    # 300 MiB
    smalls = {f"s{i}": rng.standard_normal(int(n)).astype(np.float32)
              for i, n in enumerate(rng.integers(0, 5000, 200))}
    cb = chunk or staging.DEFAULT_CHUNK_BYTES
    items = {"big": big, "odd": big[: (cb // 8) * 3 + 1].view(np.uint8)[3:-2], **smalls}
    with Uploader("cuda", chunk_bytes=chunk, num_buffers=nbuf, threads=threads) as up:
        out = up.upload_many(items)
    record_property("mb_per_s", up.rate_mb_s)
    print(f"staging upload {up.bytes / 2**20:.0f} MiB at {up.rate_mb_s:.0f} MB/s "
          f"(chunk {up.chunk_bytes >> 20} MiB x {up.num_buffers}, {up.threads} threads)")
    for k, a in items.items():
        got = out[k].numpy()
        assert got.dtype == a.dtype and got.shape == a.shape, k
        assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(a).view(np.uint8)), k
    with pytest.raises(UploadError, match="closed"):
        up.upload(big[:1], "late")


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
def test_real_upload_on_a_side_current_stream_and_capture_refusal():
    s = nbx.cuda.Stream()
    a = np.random.default_rng(9).standard_normal((1 << 20) + 3).astype(np.float32)
    with nbx.cuda.stream(s):
        t = upload_many({"a": a}, "cuda")["a"]
        assert np.array_equal(t.numpy(), a)
    g = nbx.cuda.CUDAGraph()
    with pytest.raises(driver.CaptureError, match="uploading"):
        with nbx.cuda.graph(g):
            upload_many({"a": a}, "cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
def test_real_pinned_pool_is_reused_and_released():
    staging.release_pinned_memory()
    a = np.random.default_rng(10).standard_normal(3 << 20).astype(np.float32)    # 12 MiB
    t1 = upload_many({"a": a}, "cuda")["a"]
    made = staging._POOL.allocated
    assert made >= staging.DEFAULT_CHUNK_BYTES and staging.pinned_pool_bytes() == made
    t2 = upload_many({"b": a[::-1]}, "cuda")["b"]
    assert staging._POOL.allocated == made                    # nothing pinned again
    assert np.array_equal(t1.numpy(), a) and np.array_equal(t2.numpy(), a[::-1])
    assert staging.release_pinned_memory() == made and staging._POOL.allocated == 0
