"""Host <-> device copies: the pinned staging ring for pageable memory, pin_memory(),
is_pinned() and non_blocking=True, against a fake driver (CI), and for real on the GPU
(marked cuda).

The fake runs queued async copies LATE (only when their stream or an event after them is
synchronised), reading the pinned source at that moment as the DMA engine would: a staging
buffer or a pinned tensor overwritten or freed before its copy ran is a recorded violation,
and a blocking copy that returned before its data landed leaves work queued.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor.backends.cuda import driver, memory, storage
from nbxtensor.backends.cuda.memory import CachingAllocator, PinnedHostAllocator

from fakes import FakeTransferGPU, MemRaw

HAVE_GPU = driver.availability()[0]
KiB = 1 << 10


@pytest.fixture
def fake(monkeypatch):
    """The copy path over FakeTransferGPU: device memory in host bytearrays (poisoned 0xee),
    the legacy stream current, a fresh pinned allocator and staging ring, small stage sizes."""
    raw = MemRaw()
    f = FakeTransferGPU(raw)
    monkeypatch.setitem(memory._allocators, 0, CachingAllocator(raw, "cuda:0"))
    monkeypatch.setattr(driver, "set_device", lambda i: None)
    monkeypatch.setattr(driver, "_capturing", {})
    monkeypatch.setattr(storage, "_stream_handle", lambda i: 0)
    for name in ("mem_host_alloc", "mem_free_host", "memcpy_htod", "memcpy_dtoh",
                 "stream_synchronize", "event_create", "event_destroy", "event_record",
                 "event_synchronize", "event_query"):
        monkeypatch.setattr(driver, name, getattr(f, name))
    monkeypatch.setattr(memory, "_pinned", [None])
    monkeypatch.setattr(storage, "_rings", {})
    monkeypatch.setattr(storage, "STAGE_MIN_BYTES", 4 * KiB)
    monkeypatch.setattr(storage, "STAGE_CHUNK_BYTES", 8 * KiB)
    monkeypatch.setattr(storage, "STAGE_BUFFERS", 2)
    monkeypatch.setattr(storage, "FILL_PART_MIN", 1 * KiB)
    monkeypatch.setattr(storage, "STAGE_SPLIT", 1)
    monkeypatch.setattr(storage, "STAGE_MIN_CHUNK", 1 * KiB)
    yield f
    for r in storage._rings.values():
        r.release()
    gc.collect()
    assert f.violations == []


def _bytes_of(f, t):
    return f.read(t)


def _rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _copies(f):
    return [e for e in f.log if e[0] in ("copy", "sync_htod")]


# ----------------------------------------------------------------------------- pageable

@pytest.mark.parametrize("nbytes", [4 * KiB, 8 * KiB - 4, 8 * KiB, 8 * KiB + 4, 5 * 8 * KiB + 36])
@pytest.mark.parametrize("nbuf,threads", [(1, 1), (2, 3), (3, 2)])
def test_pageable_copy_goes_through_the_ring_in_chunks(fake, monkeypatch, nbytes, nbuf, threads):
    monkeypatch.setattr(storage, "STAGE_BUFFERS", nbuf)
    monkeypatch.setattr(storage, "FILL_THREADS", threads)
    rng = np.random.default_rng(nbytes + nbuf)
    a = rng.integers(0, 256, nbytes, dtype=np.uint8)
    t = nbx.tensor(a, device="cuda")
    assert fake.pending() == 0, "a blocking copy returned before its data landed"
    assert _bytes_of(fake, t) == a.tobytes()
    copies = [e for e in _copies(fake) if e[0] == "copy"]
    assert len(copies) == -(-nbytes // (8 * KiB)) and all(e[4] <= 8 * KiB for e in copies)
    assert len({e[2] for e in copies}) <= nbuf          # the ring's buffers only
    assert not any(e[0] == "sync_htod" for e in fake.log)


@pytest.mark.parametrize("nbytes", [4 * KiB, 8 * KiB + 4, 5 * 8 * KiB + 36])
@pytest.mark.parametrize("nbuf,threads", [(1, 1), (2, 3), (3, 2)])
def test_large_device_to_host_reads_go_through_the_ring(fake, monkeypatch, nbytes, nbuf, threads):
    monkeypatch.setattr(storage, "STAGE_BUFFERS", nbuf)
    monkeypatch.setattr(storage, "FILL_THREADS", threads)
    a = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    t = nbx.tensor(a, device="cuda")
    fake.log.clear()
    got = t.numpy()
    assert got.tobytes() == a.tobytes() and fake.pending() == 0
    reads = [e for e in fake.log if e[0] in ("dtoh", "sync_dtoh")]
    assert all(e[0] == "dtoh" and e[3] <= 8 * KiB for e in reads)
    assert len(reads) == -(-nbytes // (8 * KiB)) and len({e[1] for e in reads}) <= nbuf
    assert np.array_equal(t[7:].numpy(), a[7:])       # from an offset inside the storage
    out = nbx.from_numpy(np.zeros(nbytes, np.uint8))
    out.copy_(t)                                      # copy_ into a pageable cpu tensor
    assert out.numpy().tobytes() == a.tobytes()


def test_mid_size_copies_are_split_for_overlap(fake, monkeypatch):
    monkeypatch.setattr(storage, "STAGE_SPLIT", 4)
    monkeypatch.setattr(storage, "STAGE_MIN_CHUNK", 3 * KiB)
    for n, chunks in ((12 * KiB, [4096] * 3), (40 * KiB, [8 * KiB] * 5), (5 * KiB, [4096, 1024])):
        a = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
        fake.log.clear()
        t = nbx.tensor(a, device="cuda")
        assert [e[4] for e in fake.log if e[0] == "copy"] == chunks
        fake.log.clear()
        assert t.numpy().tobytes() == a.tobytes()
        assert [e[3] for e in fake.log if e[0] == "dtoh"] == chunks


def test_tensor_of_an_array_reads_the_array_itself(fake, monkeypatch):
    """nbx.tensor(ndarray, device="cuda") stages straight from the array (no host copy)."""
    seen = []
    real = storage.fill
    monkeypatch.setattr(storage, "fill", lambda d, s: seen.append(s.ctypes.data) or real(d, s))
    a = np.random.default_rng(11).standard_normal(6000).astype(np.float32)
    t = nbx.tensor(a, device="cuda")
    assert seen[0] == a.ctypes.data and np.array_equal(t.numpy(), a)
    c = nbx.tensor(a)                                    # on the host: still a copy
    assert c.data_ptr() != a.ctypes.data


def test_small_pageable_copy_is_synchronous(fake):
    a = np.arange(100, dtype=np.int64)
    t = nbx.tensor(a, device="cuda")
    assert [e[0] for e in _copies(fake)] == ["sync_htod"]
    assert np.array_equal(t.numpy(), a)


def test_to_cuda_of_non_contiguous_and_broadcast_sources(fake):
    rng = np.random.default_rng(2)
    base = _rand(rng, (64, 48))
    x = nbx.from_numpy(base)[:, ::3]                    # non-contiguous, 4 KiB
    got = x.to("cuda")
    assert got.is_contiguous() and np.array_equal(got.numpy(), base[:, ::3])
    dst = nbx.empty((32, 64), dtype=nbx.float32, device="cuda")
    row = nbx.from_numpy(_rand(rng, (64,)))
    dst.copy_(row)                                      # broadcast into a contiguous dst
    assert np.array_equal(dst.numpy(), np.broadcast_to(row.numpy(), (32, 64)))


def test_non_blocking_pageable_returns_once_queued_and_the_source_is_free(fake):
    rng = np.random.default_rng(3)
    a = _rand(rng, (5000,))                             # 20000 B: 3 chunks
    want = a.copy()
    t = nbx.empty(5000, dtype=nbx.float32, device="cuda")
    t.copy_(nbx.from_numpy(a), non_blocking=True)
    assert fake.pending() > 0                           # still in flight ...
    a[:] = np.nan                                       # ... but the source was read already
    driver.stream_synchronize(0)
    assert np.array_equal(t.numpy(), want)


def test_copy_into_an_offset_view(fake):
    rng = np.random.default_rng(4)
    dst = nbx.tensor(np.full(6000, np.nan, np.float32), device="cuda")
    src = _rand(rng, (3000,))
    dst[1500:4500].copy_(nbx.from_numpy(src))
    got = dst.numpy()
    assert np.array_equal(got[1500:4500], src)
    assert np.isnan(got[:1500]).all() and np.isnan(got[4500:]).all()


# ----------------------------------------------------------------------------- pinned

def test_pin_memory_and_is_pinned(fake):
    rng = np.random.default_rng(5)
    a = _rand(rng, (37, 21))
    x = nbx.from_numpy(a)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned() and p.device.type == "cpu" and p.dtype is nbx.float32
    assert np.array_equal(p.numpy(), a) and p.data_ptr() != x.data_ptr()
    assert memory.pinned_allocator().holds(p.data_ptr(), p.nbytes)
    assert p[3:].is_pinned() and p.t().is_pinned()      # views share the pinned storage
    assert p.pin_memory() is p
    strided = nbx.from_numpy(a)[:, ::2].pin_memory()
    assert strided.is_contiguous() and np.array_equal(strided.numpy(), a[:, ::2])
    empty = nbx.from_numpy(np.zeros((0, 3), np.float32)).pin_memory()
    assert empty.is_pinned() and empty.shape == (0, 3)


def test_factories_pin_memory_true(fake):
    z = nbx.zeros((30, 7), pin_memory=True)
    assert z.is_pinned() and np.array_equal(z.numpy(), np.zeros((30, 7), np.float32))
    r = nbx.arange(100, pin_memory=True)
    assert r.is_pinned() and np.array_equal(r.numpy(), np.arange(100))
    assert not nbx.zeros(3, pin_memory=False).is_pinned()
    with pytest.raises(RuntimeError, match="only cpu tensors can be pinned"):
        nbx.zeros(3, device="interp", pin_memory=True)


def test_pin_memory_refusals(fake):
    with pytest.raises(RuntimeError, match="only cpu tensors can be pinned, got a tensor on interp"):
        nbx.zeros(3, device="interp").pin_memory()
    with pytest.raises(ValueError, match="pin_memory: device must be a cuda device, got 'cpu'"):
        nbx.zeros(3).pin_memory(device="cpu")
    with pytest.raises(TypeError, match="non_blocking must be a bool, got 1"):
        nbx.zeros(3).to("cuda", non_blocking=1)


def test_pinned_memory_outlives_the_tensor_while_a_numpy_view_holds_it(fake):
    p = nbx.from_numpy(np.arange(4096, dtype=np.float32)).pin_memory()
    view = p.numpy()
    ptr = p.data_ptr()
    del p
    gc.collect()
    assert memory.pinned_allocator().holds(ptr)         # the view keeps the block live
    q = nbx.zeros(4096).pin_memory()
    assert q.data_ptr() != ptr
    assert np.array_equal(view, np.arange(4096, dtype=np.float32))
    del view
    gc.collect()
    assert not memory.pinned_allocator().holds(ptr)


def test_non_blocking_from_pinned_is_one_async_copy(fake):
    rng = np.random.default_rng(6)
    a = _rand(rng, (300, 7))                            # 8400 B: staged if it were pageable
    p = nbx.from_numpy(a).pin_memory()
    fake.log.clear()
    t = p.to("cuda", non_blocking=True)
    (c,) = _copies(fake)
    assert c[0] == "copy" and c[2] == p.data_ptr() and c[3] == 0 and c[4] == a.nbytes
    assert fake.pending() > 0
    driver.stream_synchronize(0)
    assert np.array_equal(t.numpy(), a)
    t3 = p.cuda(non_blocking=True)                      # torch's spelling, same path
    driver.stream_synchronize(0)
    assert np.array_equal(t3.numpy(), a)
    fake.log.clear()
    t2 = p.to("cuda")                                   # blocking: landed on return
    assert fake.pending() == 0 and np.array_equal(t2.numpy(), a)


def test_a_pinned_block_is_not_reused_while_its_async_copy_is_in_flight(fake, monkeypatch):
    monkeypatch.setattr(storage, "STAGE_MIN_BYTES", 1 << 30)    # no ring: it pins blocks too
    rng = np.random.default_rng(7)
    a = _rand(rng, (2048,))
    p = nbx.from_numpy(a).pin_memory()
    ptr = p.data_ptr()
    t = p.to("cuda", non_blocking=True)
    del p                                               # dropped with its copy queued
    gc.collect()
    q = nbx.from_numpy(np.full(2048, np.nan, np.float32)).pin_memory()
    assert q.data_ptr() != ptr                          # the busy block was not handed out
    driver.stream_synchronize(0)                        # the fake checks the bytes it copies
    assert np.array_equal(t.numpy(), a)
    del q
    gc.collect()
    r = nbx.zeros(2048).pin_memory()                    # now idle: reused from the cache
    assert r.data_ptr() == ptr and memory.pinned_allocator().num_host_allocs == 2


def test_device_to_host_non_blocking_lands_in_pinned_memory(fake):
    rng = np.random.default_rng(8)
    a = _rand(rng, (50, 40))
    t = nbx.tensor(a, device="cuda")
    h = t.to("cpu", non_blocking=True)
    assert h.is_pinned() and h.shape == (50, 40) and fake.pending() > 0
    driver.stream_synchronize(0)
    assert np.array_equal(h.numpy(), a)
    out = nbx.from_numpy(np.full((50, 40), np.nan, np.float32)).pin_memory()
    out.copy_(t, non_blocking=True)
    assert np.isnan(out.numpy()).all()                  # not landed yet ...
    driver.stream_synchronize(0)
    assert np.array_equal(out.numpy(), a)               # ... now it has
    plain = nbx.from_numpy(np.full((50, 40), np.nan, np.float32))
    plain.copy_(t, non_blocking=True)                   # pageable: a blocking copy
    assert np.array_equal(plain.numpy(), a)
    assert np.array_equal(t.to("cpu").numpy(), a) and not t.to("cpu").is_pinned()


def test_transfers_are_refused_during_capture(fake, monkeypatch):
    monkeypatch.setattr(driver, "_capturing", {0x10: "graph under test"})
    with pytest.raises(nbx.cuda.CaptureError, match="host-to-device copy"):
        nbx.tensor(np.zeros(8192, np.uint8), device="cuda")


# ----------------------------------------------------------------------------- allocator

class _Events:
    """mem_host_alloc / event calls of a pinned allocator, with events completed by hand."""

    def __init__(self):
        self.next, self.done, self.freed, self.allocs = 0x100, {}, [], []

    def mem_host_alloc(self, n):
        self.next += 0x100000
        self.allocs.append(n)
        return self.next

    def mem_free_host(self, p):
        self.freed.append(p)

    def event_create(self, timing=True):
        self.next += 1
        self.done[self.next] = True
        return self.next

    def event_record(self, e, stream):
        self.done[e] = False

    def event_query(self, e):
        return self.done[e]

    def event_synchronize(self, e):
        self.done[e] = True

    def event_destroy(self, e):
        del self.done[e]


def test_pinned_allocator_caches_by_size_and_waits_for_recorded_uses():
    ev = _Events()
    a = PinnedHostAllocator(ev)
    h1 = a.malloc(100)
    assert h1.size == memory.PINNED_GRAIN and a.holds(h1.ptr + 99) and not a.holds(h1.ptr - 1)
    assert not a.holds(h1.ptr + h1.size - 1, 2)
    p1 = h1.ptr
    a.record_use(p1 + 10, stream=7)
    del h1
    assert a.stats()["cached"] == memory.PINNED_GRAIN and not a.holds(p1)
    h2 = a.malloc(200)                                  # p1's copy still runs: a new block
    assert h2.ptr != p1 and len(ev.allocs) == 2
    ev.done = {e: True for e in ev.done}
    h3 = a.malloc(300)                                  # now p1 is idle: reused
    assert h3.ptr == p1 and len(ev.allocs) == 2
    big = a.malloc(3 * memory.PINNED_GRAIN)
    assert big.size == 4 * memory.PINNED_GRAIN
    with pytest.raises(ValueError, match="not in a live pinned block"):
        a.record_use(0x5, stream=1)
    with pytest.raises(ValueError, match="nbytes must be an int > 0, got 0"):
        a.malloc(0)
    del h2, h3, big
    assert a.stats()["allocated"] == 0
    freed = a.empty_cache()
    assert freed == 6 * memory.PINNED_GRAIN and len(ev.freed) == 3 and a.reserved == 0


# ----------------------------------------------------------------------------- GPU

@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("nbytes", [1, 4 << 20, (16 << 20) + 12345])
@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("non_blocking", [False, True])
def test_cuda_round_trip(nbytes, pinned, non_blocking):
    rng = np.random.default_rng(nbytes)
    a = rng.integers(0, 256, nbytes, dtype=np.uint8)
    x = nbx.from_numpy(a)
    if pinned:
        x = x.pin_memory()
    t = x.to("cuda", non_blocking=non_blocking)
    back = t.to("cpu", non_blocking=non_blocking)
    nbx.cuda.synchronize()
    assert np.array_equal(back.numpy(), a)
    assert back.is_pinned() == non_blocking


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device")
def test_cuda_non_blocking_overlaps_with_a_side_stream():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((1024, 1024)).astype(np.float32)
    p = nbx.from_numpy(a).pin_memory()
    s = nbx.cuda.Stream()
    with nbx.cuda.stream(s):
        t = p.to("cuda", non_blocking=True)
        y = (t * 2).to("cpu", non_blocking=True)
    s.synchronize()
    assert np.array_equal(y.numpy(), a * 2)


def test_pin_memory_without_a_driver_says_so(monkeypatch):
    def no_driver(n, portable=True):
        raise driver.CudaUnavailable("libcuda.so.1 not found")
    monkeypatch.setattr(driver, "mem_host_alloc", no_driver)
    monkeypatch.setattr(memory, "_pinned", [None])
    with pytest.raises(driver.CudaUnavailable, match=r"pinned host memory \(pin_memory\) needs "
                                                     r"the CUDA driver: libcuda.so.1 not found"):
        nbx.zeros(10).pin_memory()


def test_repeated_async_copies_of_one_pinned_block_keep_one_event_per_stream():
    ev = _Events()
    a = PinnedHostAllocator(ev)
    h = a.malloc(1000)
    for _ in range(50):
        a.record_use(h.ptr, stream=3)
    a.record_use(h.ptr + 8, stream=4)
    assert len(a._uses[h.ptr]) == 2 and len(ev.done) == 2
    ptr = h.ptr
    del h
    ev.done = {e: True for e in ev.done}
    assert a.malloc(1000).ptr == ptr and len(a._idle_events[0]) == 2


def test_a_free_from_a_finalizer_inside_malloc_is_queued_not_deadlocked():
    ev = _Events()
    a = PinnedHostAllocator(ev)
    h = a.malloc(10)
    with a._lock:                   # as if the GC ran the handle's finalizer mid-malloc
        ptr = h.ptr
        del h
    assert a.holds(ptr) is False and a.stats()["cached"] == memory.PINNED_GRAIN
