"""The caching allocator's block management, over FakeRaw (no GPU), and on cuda when present."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from nbxtensor.backends.cuda import memory
from nbxtensor.backends.cuda.memory import (MIN_BLOCK, CachingAllocator, FakeRaw, OutOfMemoryError,
                                            round_size, segment_size)

KiB, MiB = 1 << 10, 1 << 20


def make(**kw):
    raw = FakeRaw(**kw)
    return CachingAllocator(raw, "cuda:0"), raw


def blocks_of(a, seg_index=0):
    seg = a.snapshot()[seg_index]
    return [(b["size"], b["allocated"]) for b in seg["blocks"]]


# ------------------------------------------------------------------------------ sizes

@pytest.mark.parametrize("n,want", [(1, 512), (511, 512), (512, 512), (513, 1024), (1000, 1024),
                                    (MiB, MiB), (MiB + 1, MiB + 512), (10 * MiB + 3, 10 * MiB + 512)])
def test_round_size(n, want):
    assert round_size(n) == want
    a, _ = make()
    b = a.malloc(n)
    assert (b.size, b.requested) == (want, n)
    assert b.ptr % MIN_BLOCK == 0
    a.check()


@pytest.mark.parametrize("size,seg", [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB),
                                      (10 * MiB - 512, 20 * MiB), (10 * MiB, 10 * MiB),
                                      (11 * MiB, 12 * MiB), (12 * MiB, 12 * MiB)])
def test_segment_size(size, seg):
    assert segment_size(size) == seg
    a, raw = make()
    a.malloc(size)
    assert list(raw.live.values()) == [seg]


def test_small_pool_packs_one_segment():
    a, raw = make()
    bs = [a.malloc(1000) for _ in range(5)]
    assert raw.malloc_calls == 1
    assert [b.ptr - bs[0].ptr for b in bs] == [0, 1024, 2048, 3072, 4096]
    assert blocks_of(a) == [(1024, True)] * 5 + [(2 * MiB - 5 * 1024, False)]
    a.check()


def test_small_and_large_pools_do_not_share():
    a, raw = make()
    small = a.malloc(4 * KiB)
    a.free(small)
    big = a.malloc(MiB + 1)             # large pool: must not take the cached 2 MiB small segment
    assert raw.malloc_calls == 2 and big.seg is not small.seg and not big.seg.small
    a.free(big)
    s2 = a.malloc(MiB)                  # small pool: must not take the cached large segment
    assert s2.seg.small and s2.seg is small.seg
    a.check()


def test_large_requests_share_20mib_segments_and_big_ones_get_their_own():
    a, raw = make()
    x = a.malloc(3 * MiB)
    y = a.malloc(4 * MiB)
    assert raw.malloc_calls == 1 and y.ptr == x.ptr + 3 * MiB
    w = a.malloc(11 * MiB)              # best fit: the 13 MiB left in the shared segment
    assert raw.malloc_calls == 1 and w.ptr == y.ptr + 4 * MiB and w.size == 11 * MiB
    z = a.malloc(13 * MiB + 1)          # no room left: its own segment, rounded to 2 MiB
    assert raw.malloc_calls == 2 and z.seg.size == 14 * MiB and z.size == 14 * MiB
    assert z.requested == 13 * MiB + 1
    a.check()


def test_large_pool_keeps_small_tails_attached():
    a, raw = make()
    x = a.malloc(5 * MiB)               # 20 MiB segment, split: 15 MiB tail is worth keeping
    assert x.size == 5 * MiB
    a.free(x)
    y = a.malloc(19 * MiB + 512 * KiB)  # from the cached 20 MiB block; a 0.5 MiB tail is not split
    assert raw.malloc_calls == 1 and y.size == 20 * MiB
    assert a.allocated == 20 * MiB and a.requested == 19 * MiB + 512 * KiB
    a.check()


# ------------------------------------------------------------------------------ split / merge / fit

def test_split_and_merge_both_sides():
    a, _ = make()
    x, y, z = a.malloc(1000), a.malloc(3000), a.malloc(5000)
    rest = 2 * MiB - 1024 - 3072 - 5120
    a.free(y)
    assert blocks_of(a) == [(1024, True), (3072, False), (5120, True), (rest, False)]
    a.check()
    a.free(x)                           # merges with the free block after it
    assert blocks_of(a) == [(4096, False), (5120, True), (rest, False)]
    a.check()
    a.free(z)                           # merges with both neighbours: the segment is whole again
    assert blocks_of(a) == [(2 * MiB, False)]
    assert a.stats()["free_blocks"] == 1
    a.check()


def test_best_fit_takes_the_smallest_sufficient_block():
    a, _ = make()
    bs = [a.malloc(n) for n in (8 * KiB, 512, 2 * KiB, 512, 4 * KiB, 512)]
    a.free(bs[0])                       # holes of 8, 2 and 4 KiB, separated by live blocks
    a.free(bs[2])
    a.free(bs[4])
    got = a.malloc(3 * KiB)
    assert got.ptr == bs[4].ptr         # the 4 KiB hole, not the 8 KiB one nor the tail
    assert blocks_of(a)[:8] == [(8 * KiB, False), (512, True), (2 * KiB, False), (512, True),
                                (3 * KiB, True), (KiB, False), (512, True), (blocks_of(a)[7][0], False)]
    exact = a.malloc(2 * KiB)
    assert exact.ptr == bs[2].ptr
    a.check()


def test_blocks_never_merge_across_adjacent_segments():
    a, raw = make(gap=0)                # segments back to back in the address space
    x = a.malloc(MiB)
    y = a.malloc(MiB)                   # the first segment has exactly 1 MiB left: same segment
    z = a.malloc(MiB)                   # a second segment, adjacent to the first
    assert raw.malloc_calls == 2 and z.ptr == x.ptr + 2 * MiB
    for b in (x, y, z):
        a.free(b)
    assert a.stats()["free_blocks"] == 2 and a.stats()["segments"] == 2
    a.check()
    assert a.empty_cache() == 4 * MiB and raw.live == {}


def test_random_sequences_keep_invariants():
    gen = np.random.default_rng()
    a, raw = make(gap=0)
    live = []
    sizes = np.concatenate([gen.integers(1, 4 * KiB, 60), gen.integers(4 * KiB, 2 * MiB, 30),
                            gen.integers(2 * MiB, 30 * MiB, 10)])
    for step in range(2000):
        if live and (gen.random() < 0.45 or len(live) > 40):
            b = live.pop(int(gen.integers(len(live))))
            a.free(b)
        else:
            n = int(gen.choice(sizes))
            stream = int(gen.integers(0, 3))
            b = a.malloc(n, stream)
            assert b.size >= n and b.stream == stream and b.seg.stream == stream
            live.append(b)
        if step % 50 == 49:
            a.empty_cache()
        if step % 70 == 69:
            raw.fail_next = 1           # the next new segment goes through the retry path
        a.check()
        # live blocks never overlap and holds() agrees with a brute-force scan
        spans = sorted((b.ptr, b.ptr + b.size) for b in live)
        assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))
        for b in live[-3:]:
            for addr in (b.ptr, b.ptr + b.size - 1, b.ptr + b.size // 2):
                assert a.holds(addr)
        for addr in gen.integers(0x7F00_0000_0000, 0x7F00_0000_0000 + 200 * MiB, 20):
            addr = int(addr)
            assert a.holds(addr) == any(s <= addr < e for s, e in spans)
    assert a.allocated == sum(b.size for b in live)
    assert a.requested == sum(b.requested for b in live)
    for b in live:
        a.free(b)
    a.empty_cache()
    assert a.reserved == 0 and raw.live == {} and a.allocated == 0 and a.requested == 0
    a.check()


# ------------------------------------------------------------------------------ streams

def test_blocks_are_reused_only_on_their_stream():
    a, raw = make()
    x = a.malloc(4 * KiB, stream=0x11)
    a.free(x)
    y = a.malloc(4 * KiB, stream=0x22)  # another stream: a fresh segment, not x's memory
    assert raw.malloc_calls == 2 and y.seg is not x.seg and y.stream == 0x22
    z = a.malloc(4 * KiB, stream=0x11)  # the freeing stream gets it back
    assert raw.malloc_calls == 2 and z.ptr == x.ptr and z.stream == 0x11
    a.check()


# ------------------------------------------------------------------------------ stats

def test_stats_track_current_peak_counts_and_reset():
    a, _ = make()
    x = a.malloc(1000)
    y = a.malloc(12 * MiB)
    s = a.stats()
    assert s["allocated_bytes"] == 1024 + 12 * MiB and s["requested_bytes"] == 1000 + 12 * MiB
    assert s["reserved_bytes"] == 2 * MiB + 12 * MiB
    assert s["num_allocs"] == 2 and s["num_segment_allocs"] == 2 and s["active_blocks"] == 2
    a.free(y)
    s = a.stats()
    assert s["allocated_bytes"] == 1024 and s["allocated_bytes.peak"] == 1024 + 12 * MiB
    assert s["reserved_bytes"] == 14 * MiB and s["cached_free_bytes"] == 14 * MiB - 1024
    assert s["largest_free_block"] == 12 * MiB and s["num_frees"] == 1
    a.reset_peak_stats()
    s = a.stats()
    assert s["allocated_bytes.peak"] == 1024 and s["reserved_bytes.peak"] == 14 * MiB
    assert s["requested_bytes.peak"] == 1000
    a.empty_cache()
    s = a.stats()
    assert s["reserved_bytes"] == 2 * MiB and s["reserved_bytes.peak"] == 14 * MiB
    assert s["num_segment_frees"] == 1
    a.reset_accumulated_stats()
    s = a.stats()
    assert (s["num_allocs"], s["num_frees"], s["num_segment_allocs"], s["num_segment_frees"]) == (0,) * 4
    assert s["allocated_bytes"] == 1024     # current values are not counts
    a.free(x)


def test_empty_cache_releases_only_wholly_free_segments():
    a, raw = make()
    keep = a.malloc(1000)               # pins the first small segment
    other = [a.malloc(MiB) for _ in range(3)]   # one beside `keep`, two in a second segment
    for b in other:
        a.free(b)
    big = a.malloc(12 * MiB)
    a.free(big)
    n_before = len(raw.live)
    released = a.empty_cache()
    assert keep.seg.ptr in raw.live and big.seg.ptr not in raw.live
    assert len(raw.live) == 1 and n_before > 1
    assert released == 14 * MiB and a.stats()["num_segment_frees"] == 2
    assert a.reserved == 2 * MiB and raw.sync_calls == 1
    assert a.malloc(1000).seg is keep.seg
    a.check()


# ------------------------------------------------------------------------------ out of memory

def test_oom_frees_the_cache_and_retries_once():
    a, raw = make(capacity=22 * MiB)
    a.free(a.malloc(1000))              # 2 MiB cached
    a.free(a.malloc(12 * MiB))          # 12 MiB cached: 14 MiB of 22 used
    b = a.malloc(20 * MiB)              # fails raw, releases both cached segments, succeeds
    assert b.size == 20 * MiB and a.num_alloc_retries == 1 and a.num_ooms == 0
    assert raw.free_calls == 2 and raw.sync_calls == 1 and a.reserved == 20 * MiB
    a.check()


def test_oom_error_says_what_was_asked_held_and_free():
    a, raw = make(capacity=40 * MiB)
    live = a.malloc(5 * MiB)            # 20 MiB segment: 15 MiB free inside it (not releasable)
    a.free(a.malloc(1000))              # a cached small segment: released by the retry
    with pytest.raises(OutOfMemoryError) as ei:
        a.malloc(30 * MiB + 5)
    e = ei.value
    assert isinstance(e, MemoryError)
    msg = str(e)
    assert "cuda:0" in msg and "out of memory" in msg
    assert "30.00 MiB" in msg and str(30 * MiB + 5) in msg          # asked
    assert "Allocated by nbxtensor: 5.00 MiB" in msg                  # held
    assert "reserved: 20.00 MiB" in msg                               # after the retry's release
    assert "largest free cached block: 15.00 MiB" in msg
    assert "20.00 MiB free of 40.00 MiB on the device" in msg
    assert a.num_ooms == 1 and a.num_alloc_retries == 1
    assert a.stats()["segments"] == 1
    a.check()
    # the allocator keeps working afterwards
    c = a.malloc(10 * MiB)
    assert c.seg is live.seg
    a.check()


@pytest.mark.parametrize("fails,ok", [(1, True), (2, False)])
def test_injected_raw_failures(fails, ok):
    a, raw = make()
    raw.fail_next = fails
    if ok:
        assert a.malloc(100).size == 512
        assert a.num_alloc_retries == 1
    else:
        with pytest.raises(OutOfMemoryError, match="tried to allocate 100 B"):
            a.malloc(100)
        assert a.reserved == 0 and a.allocated == 0
    a.check()


def test_oom_with_failing_predicate():
    a, raw = make(fail=lambda n: n > 100 * MiB)
    a.malloc(50 * MiB)
    with pytest.raises(OutOfMemoryError, match=r"tried to allocate 200\.00 MiB"):
        a.malloc(200 * MiB)
    assert raw.malloc_calls == 3


# ------------------------------------------------------------------------------ holds

def test_holds_inside_live_blocks_only():
    a, _ = make()
    x = a.malloc(1000)
    y = a.malloc(5000)
    z = a.malloc(12 * MiB)
    for b in (x, y, z):
        assert a.holds(b.ptr) and a.holds(b.ptr + 1) and a.holds(b.ptr + b.size - 1)
        assert a.find(b.ptr + 7) is b
    assert not a.holds(y.ptr + y.size)                  # the free tail of the segment
    assert not a.holds(x.ptr - 1) and not a.holds(0) and not a.holds(z.ptr + z.size)
    assert not a.holds(x.seg.ptr + x.seg.size + 4096)   # the gap after a segment
    a.free(x)
    assert not a.holds(x.ptr) and not a.holds(x.ptr + 100) and a.find(x.ptr + 100) is None
    assert a.holds(y.ptr + 17)
    a.free(y)
    assert not a.holds(y.ptr + 17)                      # also after the recent-block cache saw it
    a.check()


# ------------------------------------------------------------------------------ private pools

def test_private_pool_keeps_its_memory_apart():
    a, raw = make()
    shared = a.malloc(4 * KiB)
    a.free(shared)
    with a.private_pool() as pool:
        g = a.malloc(4 * KiB)           # not from the cached default-pool segment
        assert g.seg.pool == pool.id and g.seg is not shared.seg
    a.free(g)
    assert a.malloc(4 * KiB).seg is shared.seg          # default pool never takes pool memory
    a.empty_cache()                                     # pool segments survive empty_cache
    assert g.seg.ptr in raw.live
    with a.private_pool(pool):                          # capture again: reuses the pool's block
        g2 = a.malloc(4 * KiB)
        assert g2.ptr == g.ptr
    a.release_pool(pool)
    assert g2.seg.ptr in raw.live                       # still live: kept until freed
    a.free(g2)
    assert g2.seg.ptr not in raw.live                   # released as soon as it empties
    with pytest.raises(ValueError, match="released"):
        with a.private_pool(pool):
            pass
    a.check()


# ------------------------------------------------------------------------------ misuse, re-entrancy

def test_bad_requests_and_double_free():
    a, _ = make()
    with pytest.raises(ValueError, match="nbytes must be > 0, got 0"):
        a.malloc(0)
    with pytest.raises(ValueError, match="got -5"):
        a.malloc(-5)
    with pytest.raises(TypeError, match="nbytes must be an int, got float"):
        a.malloc(1.5)
    with pytest.raises(TypeError, match="bool"):
        a.malloc(True)
    assert a.malloc(np.int64(100)).size == 512
    b = a.malloc(100)
    a.free(b)
    with pytest.raises(ValueError, match="not a live block"):
        a.free(b)
    other, _ = make()
    with pytest.raises(ValueError, match="not a live block"):
        other.free(a.malloc(100))
    a.check()


def test_free_from_a_finalizer_during_malloc_is_deferred():
    a, raw = make()
    victim = a.malloc(1000)
    done = []

    def fail(nbytes):                   # runs inside malloc, as a GC finalizer would
        if not done:
            done.append(1)
            a.free(victim)
            assert victim.allocated     # queued: the outer malloc is still running
        return False

    a.malloc(4 * KiB)                   # fits the first segment: no raw call
    raw.fail = fail
    big = a.malloc(12 * MiB)            # raw call -> re-entrant free, queued then done
    assert done and not victim.allocated and a.allocated == 4 * KiB + big.size
    a.check()


def test_allocator_for_is_one_per_device():
    from nbxtensor import Device
    a0 = memory.allocator_for(0)
    assert memory.allocator_for("cuda:0") is a0 and memory.allocator_for(Device("cuda", 0)) is a0
    assert memory.allocator_for("cuda") is a0
    assert memory.allocator_for(1) is not a0
    with pytest.raises(ValueError, match="expected a cuda device"):
        memory.allocator_for("cpu")
    with pytest.raises(ValueError, match="index must be >= 0"):
        memory.allocator_for(-1)


def test_threads_share_one_allocator_safely():
    import threading
    a, raw = make()
    errors = []

    start = threading.Barrier(4)

    def work(seed):
        gen = np.random.default_rng(seed)
        start.wait()
        try:
            live = []
            for _ in range(3000):
                if live and gen.random() < 0.5:
                    a.free(live.pop(int(gen.integers(len(live)))))
                else:
                    live.append(a.malloc(int(gen.integers(1, 3 * MiB)), int(gen.integers(0, 2))))
            for b in live:
                a.free(b)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    import sys
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)         # switch threads often: inside malloc and free too
    try:
        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    a.check()
    assert a.allocated == 0 and a.stats()["active_blocks"] == 0
    a.empty_cache()
    assert raw.live == {}


# ------------------------------------------------------------------------------ CudaStorage (faked)

@pytest.fixture
def fake_cuda(monkeypatch):
    """CudaStorage over a FakeRaw allocator, with the driver calls it makes stubbed."""
    from nbxtensor.backends.cuda import storage as st
    a = CachingAllocator(FakeRaw(), "cuda:0")
    monkeypatch.setitem(memory._allocators, 0, a)
    monkeypatch.setattr(st.driver, "set_device", lambda i: None)
    monkeypatch.setattr(st, "_stream_handle", lambda i: 0)
    return a


def test_storage_lifetime_returns_its_block(fake_cuda):
    import nbxtensor as nbx
    from nbxtensor.backends.cuda.storage import CudaStorage
    dev = nbx.Device("cuda", 0)
    s = CudaStorage.allocate(dev, 3000)
    assert s.nbytes == 3000 and fake_cuda.holds(s.ptr) and fake_cuda.allocated == 3072
    assert nbx.cuda.memory_allocated(0) == 3072 and nbx.cuda.memory_reserved(0) == 2 * MiB
    assert nbx.cuda.memory_stats(0)["num_allocs"] == 1
    ptr = s.ptr
    del s
    gc.collect()
    assert fake_cuda.allocated == 0 and not fake_cuda.holds(ptr)
    assert nbx.cuda.max_memory_allocated(0) == 3072
    nbx.cuda.reset_peak_memory_stats(0)
    assert nbx.cuda.max_memory_allocated(0) == 0
    nbx.cuda.empty_cache(0)
    assert nbx.cuda.memory_reserved(0) == 0 and nbx.cuda.max_memory_reserved(0) == 2 * MiB
    z = CudaStorage.allocate(dev, 0)    # empty: no block, no memory
    assert z.ptr == 0 and fake_cuda.num_allocs == 1
    assert z.to_host(0, 0).shape == (0,)
    z.from_host(0, np.zeros(0, np.float32))
    with pytest.raises(ValueError, match="outside the storage of 0 bytes"):
        z.to_host(0, 4)
    with pytest.raises(ValueError, match="nbytes must be an int >= 0"):
        CudaStorage.allocate(dev, -1)


def test_tensor_on_cuda_uses_the_allocator(fake_cuda):
    import nbxtensor as nbx
    from nbxtensor.tensor import Tensor
    t = Tensor._empty((100, 7), nbx.float32, nbx.Device("cuda", 0))
    assert fake_cuda.allocated == round_size(2800) and fake_cuda.holds(t.data_ptr())
    del t
    gc.collect()
    assert fake_cuda.allocated == 0


# ------------------------------------------------------------------------------ on a real GPU

def _cuda_ok():
    try:
        from nbxtensor.backends.cuda import driver
        return driver.availability()[0]
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.parametrize("n", [1, 513, 3 * MiB + 7, 12 * MiB + 1])
@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
def test_cuda_storage_round_trip(n):
    import nbxtensor as nbx
    from nbxtensor.backends.cuda.storage import CudaStorage
    gen = np.random.default_rng()
    data = gen.integers(1, 256, n, dtype=np.uint8)
    s = CudaStorage.allocate(nbx.Device("cuda", 0), n)
    assert memory.allocator_for(0).holds(s.ptr)
    s.from_host(0, data)
    np.testing.assert_array_equal(s.to_host(0, n), data)
    if n > 10:
        np.testing.assert_array_equal(s.to_host(3, n - 5), data[3:n - 2])
        s.from_host(5, data[:3])
        np.testing.assert_array_equal(s.to_host(5, 3), data[:3])


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
def test_cuda_stats_track_tensor_lifetimes():
    import nbxtensor as nbx
    gc.collect()
    base = nbx.cuda.memory_allocated(0)
    x = nbx.tensor(np.arange(1000, dtype=np.float32), device="cuda")
    assert nbx.cuda.memory_allocated(0) == base + 4096
    np.testing.assert_array_equal(x.numpy(), np.arange(1000, dtype=np.float32))
    y = nbx.empty(3 * MiB, dtype=nbx.uint8, device="cuda")
    assert nbx.cuda.memory_allocated(0) == base + 4096 + 3 * MiB
    assert nbx.cuda.memory_reserved(0) >= nbx.cuda.memory_allocated(0)
    assert memory.allocator_for(0).holds(y.data_ptr() + 5)
    del x, y
    gc.collect()
    assert nbx.cuda.memory_allocated(0) == base
    nbx.cuda.empty_cache()
    z = nbx.empty(0, device="cuda")
    assert z.numel() == 0 and nbx.cuda.memory_allocated(0) == base


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA device")
def test_cuda_out_of_memory_is_reported():
    import nbxtensor as nbx
    total = nbx.cuda.get_device_properties(0)["total_memory"]
    with pytest.raises(nbx.cuda.OutOfMemoryError, match="free of .* on the device") as ei:
        nbx.empty(2 * total, dtype=nbx.uint8, device="cuda")
    assert "largest free cached block" in str(ei.value)
    x = nbx.empty(1000, device="cuda")      # still usable afterwards
    assert x.numel() == 1000


def test_oom_retry_that_empties_the_requests_free_list_keeps_the_split_tail():
    a, raw = make(capacity=23 * MiB)
    a.free(a.malloc(10 * MiB))          # a cached 10 MiB segment: too small for what follows
    b = a.malloc(12 * MiB + 512 * KiB)  # 14 MiB segment only after the 10 MiB one is released
    assert a.num_alloc_retries == 1 and b.size == 12 * MiB + 512 * KiB
    a.check()                           # the 1.5 MiB tail is in the free list
    assert a.malloc(MiB + 512 * KiB).ptr == b.ptr + b.size


# ------------------------------------------------------------------------------ parked blocks
# A freed block of the default pool under 10 MiB, of exactly its rounded size, is parked whole
# per (stream, size) and handed again to the next request of that size (no split, no merge).

def test_parked_block_comes_back_whole_and_counts_as_free():
    a, raw = make()
    keep = a.malloc(512)                    # a live neighbour, so the block cannot merge left
    b = a.malloc(3000)
    ptr = b.ptr
    a.free(b)
    a.check()
    assert (a.allocated, a.requested, a.num_frees) == (512, 512, 1)
    assert not a.holds(ptr) and a.find(ptr + 100) is None
    again = a.malloc(2600)                  # same rounded size (3072): the very block
    assert again is b and again.ptr == ptr and again.requested == 2600
    assert (a.allocated, a.requested, a.num_allocs) == (512 + 3072, 512 + 2600, 3)
    assert a.peak_requested == 512 + 3000 and a.num_segment_allocs == 1
    a.check()
    a.free(again)
    s = a.stats()                           # the merged picture: one free tail block
    assert s["free_blocks"] == 1 and s["largest_free_block"] == 2 * MiB - 512
    assert blocks_of(a) == [(512, True), (2 * MiB - 512, False)]
    a.free(keep)
    a.check()
    assert a.empty_cache() == 2 * MiB and raw.live == {} and a.reserved == 0


def test_parked_block_interior_pointer_is_not_held():
    a, _ = make()
    b = a.malloc(4096)
    assert a.holds(b.ptr + 100)             # remembered as the last interior hit
    a.free(b)
    assert not a.holds(b.ptr + 100) and not a.holds(b.ptr)
    with pytest.raises(ValueError, match="freed twice"):
        a.free(b)                           # a parked block is not live: a second free fails
    a.check()


def test_parked_blocks_never_cost_a_segment(monkeypatch):
    monkeypatch.setattr(memory, "PARK_MAX", 1000)   # every freed block stays parked
    a, raw = make()
    bs = [a.malloc(4 * KiB) for _ in range(512)]     # exactly one 2 MiB segment
    assert a.num_segment_allocs == 1
    for b in bs:
        a.free(b)
        a.check()
    assert a._nparked == 512
    big = a.malloc(MiB)                     # fits only once the parked blocks are merged back
    assert a.num_segment_allocs == 1 and big.ptr == bs[0].ptr and a._nparked == 0
    a.check()
    big2 = a.malloc(MiB - 4 * KiB)
    assert a.num_segment_allocs == 1
    a.free(big)
    a.free(big2)
    assert a.empty_cache() == 2 * MiB and raw.live == {}


def test_best_fit_sees_larger_parked_blocks():
    a, _ = make()
    bs = [a.malloc(n) for n in (8 * KiB, 512, 4 * KiB, 512)]
    a.free(bs[0])
    a.free(bs[2])                           # both parked
    got = a.malloc(3 * KiB)                 # best fit: the 4 KiB hole, split
    assert got.ptr == bs[2].ptr and got.size == 3 * KiB
    a.check()


def test_parked_blocks_are_per_stream_and_default_pool_only():
    a, raw = make()
    b = a.malloc(1024, stream=7)
    a.free(b)
    other = a.malloc(1024, stream=9)        # another stream never gets stream 7's block
    assert other.ptr != b.ptr and other.seg is not b.seg
    with a.private_pool() as pool:
        p = a.malloc(1024)
    a.free(p)                               # a private pool's block is merged, not parked
    a.check()
    a.release_pool(pool)
    assert all(s["pool"] == 0 for s in a.snapshot())
    a.free(other)
    a.check()


def test_parked_list_is_bounded():
    a, _ = make()
    bs = [a.malloc(2048) for _ in range(memory.PARK_MAX + 5)]
    for b in bs:
        a.free(b)
    a.check()                               # check() asserts every list <= PARK_MAX
    assert a._nparked == memory.PARK_MAX


@pytest.mark.parametrize("sizes", [[1, 512, 700, 4096, 5000, 300 * KiB, MiB],
                                   [1, 700, 5000, MiB, MiB + 1, 3 * MiB, 9 * MiB, 11 * MiB]])
def test_parking_keeps_every_count_and_peak(monkeypatch, sizes):
    # the same random alloc/free sequence with and without parking: the requested bytes, the
    # event counts and (small blocks: always split to their rounded size) the allocated bytes
    # and their peak match at every step. A large block may keep a tail of up to 1 MiB, so
    # with large sizes the allocated bytes depend on placement, which parking changes.
    small = max(sizes) <= MiB
    rng = np.random.default_rng(1)
    ops = []
    nlive = 0
    for _ in range(600):
        if nlive and rng.random() < 0.45:
            ops.append(("free", int(rng.integers(nlive))))
            nlive -= 1
        else:
            ops.append(("alloc", int(rng.choice(sizes)), int(rng.choice([0, 5]))))
            nlive += 1

    def run():
        a, raw = make()
        live, seen = [], []
        for op in ops:
            if op[0] == "alloc":
                live.append(a.malloc(op[1], op[2]))
            else:
                a.free(live.pop(op[1]))
            a.check()
            seen.append((a.requested, a.peak_requested, a.num_allocs, a.num_frees)
                        + ((a.allocated, a.peak_allocated) if small else ()))
        for b in live:
            a.free(b)
        a.empty_cache()
        assert raw.live == {} and a.reserved == 0
        return seen
    parked = run()
    monkeypatch.setattr(memory, "PARK_MAX", 0)
    assert run() == parked


def test_parked_block_trace_records_each_alloc_and_free():
    a, _ = make()
    events = []

    class Rec:
        def record(self, *ev):
            events.append(ev[:2] + ev[3:])
    a._trace = Rec()
    b = a.malloc(1000)
    a.free(b)
    b2 = a.malloc(1000)                     # from the parked list
    a.free(b2)
    assert [e[0] for e in events] == ["segment_alloc", "alloc", "free", "alloc", "free"]
    assert events[1][2] == events[3][2] == b.ptr
