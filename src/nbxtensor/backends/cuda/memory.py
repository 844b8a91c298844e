"""The caching device-memory allocator: one per device, over a raw allocator.

Design (the one PyTorch's and CuPy's pools proved):

- Requests are rounded up to 512 B. Rounded sizes up to 1 MiB come from the *small* pool,
  whose segments are 2 MiB; larger ones from the *large* pool: requests under 10 MiB share
  20 MiB segments, requests of 10 MiB and more get a segment of their own, rounded to 2 MiB.
- A request takes the best-fitting (smallest sufficient) cached free block, splitting off the
  rest when the rest is worth keeping (>= 512 B in the small pool, > 1 MiB in the large pool;
  a smaller tail stays with the block). A freed block merges with its free neighbours in
  the same segment, so a segment whose blocks are all free is one block again.
- Every segment belongs to the stream that asked for it, and its blocks are cached per
  (pool, stream): memory freed on stream S is handed again only to requests on S, so work
  still queued on S that uses the memory runs before the new owner's work.
- Segments are returned to the driver only by `empty_cache()` and by the out-of-memory path:
  when the raw allocator fails, the cache is emptied and the request retried once; then
  `OutOfMemoryError` says what was asked, allocated, reserved, free and the largest cached block.
- Private pools (for CUDA graph capture): inside `with allocator.private_pool() as pool:` new
  memory comes from segments tagged with the pool's id, freed blocks go back to that pool
  only, and its segments outlive the block until `release_pool(pool)`.

- Blocks under 10 MiB of the default pool, of exactly their rounded size, are *parked* when
  freed: kept whole on a short LIFO per (stream, size) instead of being merged back, and
  handed again as they are to the next request of that size on that stream (the hot path of
  eager ops: one output freed and re-made per call). Parked blocks count as free in every
  statistic (allocated, requested, num_frees); they are merged back (`_flush_parked`) before
  a request of their pool searches the cached blocks (the larger ones only, so best fit sees
  what it would have) or takes a new segment, before any segment is released (empty_cache,
  the OOM retry), and before stats(), snapshot() and largest_free_block() report, so those
  see exactly the merged picture.

Freeing never calls the driver, so storages may die anywhere (a finalizer, the GC). A free
that arrives while the allocator is busy in the same thread (the GC running a finalizer in
the middle of a malloc) is queued and done when the outer call finishes.

The block bookkeeping runs against `FakeRaw` in CI (no GPU) and `DriverRaw` on a device.

The pinned host section at the end caches page-locked host memory (pin_memory() tensors and
the staging ring of pageable copies) the same way, with reuse gated on the events of the
async copies that used a block.
"""
from __future__ import annotations

import collections
import ctypes
import threading
from bisect import bisect_left, bisect_right, insort
from contextlib import contextmanager

import numpy as np

from ...device import Device as _Device
from ...storage import HostStorage

__all__ = ["CachingAllocator", "Block", "Segment", "MemPool", "RawOutOfMemory", "OutOfMemoryError",
           "FakeRaw", "DriverRaw", "allocator_for", "allocators", "round_size", "segment_size",
           "set_trace", "format_bytes", "PinnedHostAllocator", "PinnedHostStorage",
           "pinned_allocator", "pinned_array"]

MIN_BLOCK = 512                 # rounding granularity and the smallest block
SMALL_SIZE = 1 << 20            # rounded requests up to this come from the small pool
SMALL_SEGMENT = 2 << 20         # small-pool segment size
LARGE_SEGMENT = 20 << 20        # shared segment for large requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20      # from here on a request gets its own segment
ROUND_LARGE = 2 << 20           # ... rounded up to this
PARK_MAX = 16                   # parked blocks kept per (stream, size); more are merged back
_PARKED = 2                     # Block.allocated of a parked block: truthy (never merged into a
                                # neighbour) but not `True` (not live)


class RawOutOfMemory(Exception):
    """Raised by a raw allocator's malloc when the device has no memory for the request."""


class OutOfMemoryError(MemoryError):
    """The device is out of memory even after the allocator released its cache."""


def format_bytes(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n} B"


def round_size(nbytes: int) -> int:
    """The block size a request of `nbytes` (> 0) gets."""
    return max(MIN_BLOCK, (nbytes + MIN_BLOCK - 1) & -MIN_BLOCK)


def segment_size(size: int) -> int:
    """The segment size asked from the driver when no cached block fits a `size` block."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class Segment:
    """One raw allocation. `key` names the free list its blocks go to: (pool id, small?, stream)."""

    __slots__ = ("ptr", "size", "stream", "pool", "small", "key", "starts", "head")

    def __init__(self, ptr, size, stream, pool, small):
        self.ptr = ptr
        self.size = size
        self.stream = stream
        self.pool = pool
        self.small = small
        self.key = (pool, small, stream)
        self.starts = [ptr]         # sorted start addresses of this segment's blocks (for holds)
        self.head = None            # the block at ptr (never merged away: it has no left neighbour)

    def __repr__(self):
        return (f"Segment(ptr={self.ptr:#x}, size={self.size}, stream={self.stream:#x}, "
                f"pool={self.pool}, {'small' if self.small else 'large'})")


class Block:
    """A run of device memory inside a segment. `ptr`, `size` (rounded), `requested`, `stream`."""

    __slots__ = ("ptr", "size", "requested", "stream", "allocated", "prev", "next", "seg")

    def __init__(self, ptr, size, stream, seg):
        self.ptr = ptr
        self.size = size
        self.requested = 0
        self.stream = stream
        self.allocated = False      # False: free; True: live; _PARKED: freed, parked whole
        self.prev = None            # address-ordered neighbours inside the segment
        self.next = None
        self.seg = seg

    def __repr__(self):
        state = "allocated" if self.allocated else "free"
        return (f"Block(ptr={self.ptr:#x}, size={self.size}, requested={self.requested}, "
                f"stream={self.stream:#x}, {state})")


def _absorb(seg, left, right):
    """Merge block `right` of segment `seg` into its free left neighbour `left`."""
    left.size += right.size
    left.next = n = right.next
    if n is not None:
        n.prev = left
    starts = seg.starts
    del starts[bisect_left(starts, right.ptr)]


class MemPool:
    """A private pool handle (for graph capture); see CachingAllocator.private_pool."""

    __slots__ = ("id", "released")

    def __init__(self, pool_id):
        self.id = pool_id
        self.released = False

    def __repr__(self):
        return f"MemPool(id={self.id}{', released' if self.released else ''})"


_STAT_COUNTS = ("num_allocs", "num_frees", "num_segment_allocs", "num_segment_frees",
                "num_alloc_retries", "num_ooms")


class CachingAllocator:
    """Caching allocator over `raw` (malloc(n)->ptr raising RawOutOfMemory, free(ptr),
    mem_get_info()->(free, total), synchronize())."""

    def __init__(self, raw, device: str = "cuda:0"):
        self.raw = raw
        self.device = device
        self._lock = threading.RLock()
        self._acquire, self._release = self._lock.acquire, self._lock.release
        self._busy = False
        self._pending = []          # frees that arrived re-entrantly while busy
        self._free = {}             # Segment.key -> sorted list of (size, ptr, Block)
        self._live = {}             # ptr -> allocated Block
        self._segs = {}             # segment ptr -> Segment
        self._seg_starts = []       # sorted segment ptrs
        self._last = None           # the last block found by an interior-pointer holds()
        self._parked = {}           # stream -> {size -> LIFO of parked blocks} (pool 0 only)
        self._nparked = 0
        self._pool = 0              # pool id new segments get (0: the shared default pool)
        self._next_pool = 1
        self._released_pools = set()
        self._trace = _trace
        # [graphs hook] set by backends/cuda/graphs.py while a CUDA graph is captured:
        # capture_guard(allocator, stream) raises CaptureError for a shared-pool allocation
        self.capture_guard = None
        # statistics (bytes of rounded blocks, as torch counts them; `requested` as asked)
        self.allocated = self.reserved = self.requested = 0
        self.peak_allocated = self.peak_reserved = self.peak_requested = 0
        self.num_allocs = self.num_frees = self.num_segment_allocs = self.num_segment_frees = 0
        self.num_alloc_retries = self.num_ooms = 0

    # ----------------------------------------------------------------------- malloc / free

    def malloc(self, nbytes: int, stream: int = 0) -> Block:
        """A block of at least `nbytes` (> 0) bytes for use on `stream` (a raw CUstream)."""
        if nbytes.__class__ is not int or nbytes <= 0:
            nbytes = self._check_nbytes(nbytes)
        if self.capture_guard is not None:      # [graphs hook] refuse what a graph cannot own
            self.capture_guard(self, stream)
        size = (nbytes + 511) & -512
        small = size <= SMALL_SIZE
        self._acquire()     # (acquire/release, not `with`: half the cost on this hot path)
        try:
            if self._busy:
                raise RuntimeError("CachingAllocator.malloc: called re-entrantly (from a finalizer "
                                   "running inside the allocator); allocate outside finalizers")
            if self._nparked and size < MIN_LARGE_ALLOC and not self._pool:
                # the parked fast path (no _busy: it makes no object, so no finalizer can run
                # in the middle of it)
                lst = self._parked.get(stream)     # (int keys: cheaper than a tuple's)
                if lst is not None:
                    lst = lst.get(size)
                if lst:
                    block = lst.pop()
                    self._nparked -= 1
                    block.allocated = True
                    block.requested = nbytes
                    self._live[block.ptr] = block
                    self.num_allocs += 1
                    a = self.allocated = self.allocated + size
                    if a > self.peak_allocated:
                        self.peak_allocated = a
                    r = self.requested = self.requested + nbytes
                    if r > self.peak_requested:
                        self.peak_requested = r
                    if self._trace is not None:
                        self._trace.record("alloc", self.device, stream, block.ptr, size, nbytes)
                    return block
            self._busy = True
            try:
                block = self._take(size, nbytes, small, stream)
                block.allocated = True
                block.requested = nbytes
                self._live[block.ptr] = block
                self.num_allocs += 1
                a = self.allocated = self.allocated + block.size
                if a > self.peak_allocated:
                    self.peak_allocated = a
                r = self.requested = self.requested + nbytes
                if r > self.peak_requested:
                    self.peak_requested = r
            finally:
                self._idle()
        finally:
            self._release()
        if self._trace is not None:
            self._trace.record("alloc", self.device, stream, block.ptr, block.size, nbytes)
        return block

    def _take(self, size, nbytes, small, stream) -> Block:
        """The best-fitting cached free block (or a new segment's), split to `size`."""
        key = (self._pool, small, stream)
        if self._nparked and not self._pool:
            # best fit sees every block a parked one could have been: merge back the larger
            # ones of this pool
            self._flush_parked(stream, size, SMALL_SIZE if small else MIN_LARGE_ALLOC)
        fl = self._free.get(key)
        block = None
        if fl:
            i = bisect_left(fl, (size,))
            if i < len(fl):
                block = fl.pop(i)[2]
        if block is None and self._nparked and not self._pool:
            # parked blocks never cost a segment: merge this stream's back and look again
            self._flush_parked(stream)
            fl = self._free.get(key)
            if fl:
                i = bisect_left(fl, (size,))
                if i < len(fl):
                    block = fl.pop(i)[2]
        if block is None:
            block = self._new_segment(size, nbytes, small, stream)
        rest = block.size - size
        if rest >= 512 if small else rest > 1048576:
            # split: the tail becomes a free block in the same segment
            seg = block.seg
            tail = Block(block.ptr + size, rest, stream, seg)
            tail.prev = block
            tail.next = nxt = block.next
            if nxt is not None:
                nxt.prev = tail
            block.next = tail
            block.size = size
            insort(seg.starts, tail.ptr)
            fl = self._free.get(seg.key)
            if fl is None:
                fl = self._free[seg.key] = []
            insort(fl, (rest, tail.ptr, tail))
        return block

    def _flush_parked(self, stream=None, above=0, upto=MIN_LARGE_ALLOC) -> None:
        """Merge parked blocks (of `stream`, or all; of sizes in (above, upto]) back into
        their free lists."""
        if not self._nparked:
            return
        for st, by_size in list(self._parked.items()):
            if stream is not None and st != stream:
                continue
            # (emptied lists go too, so this scan stays as short as the sizes parked now)
            for size in [n for n, lst in by_size.items() if not lst or above < n <= upto]:
                lst = by_size.pop(size)
                self._nparked -= len(lst)
                for block in lst:
                    block.allocated = False
                    self._merge_free(block)

    def free(self, block: Block) -> None:
        """Return `block` to the cache (no driver call; the memory stays reserved)."""
        self._acquire()
        try:
            if self._busy:          # re-entered from a finalizer: finish the outer call first
                self._pending.append(block)
                return
            seg = block.seg
            size = block.size
            if not seg.pool and size == (block.requested + 511) & -512 and size < MIN_LARGE_ALLOC:
                # park it whole (see the module docstring); no _busy: the dict and the list
                # are the objects made here (where a finalizer may run), before any change
                by_size = self._parked.get(block.stream)
                if by_size is None:
                    by_size = self._parked.setdefault(block.stream, {})
                lst = by_size.get(size)
                if lst is None:
                    lst = by_size.setdefault(size, [])
                ptr = block.ptr
                if len(lst) < PARK_MAX and self._live.get(ptr) is block:
                    del self._live[ptr]
                    block.allocated = _PARKED
                    self.num_frees += 1
                    self.allocated -= size
                    self.requested -= block.requested
                    lst.append(block)
                    self._nparked += 1
                    if self._trace is not None:
                        self._trace.record("free", self.device, seg.stream, ptr, 0, 0)
                    return
            self._busy = True
            try:
                self._free_block(block)
            finally:
                self._idle()
        finally:
            self._release()

    def _idle(self):
        """Leave a busy section: run the frees that finalizers queued inside it."""
        self._busy = False
        if self._pending:
            self._drain()

    def _drain(self):
        # frees queued by finalizers; a bad one must not fail the unrelated call that drains it
        self._busy = True
        try:
            while self._pending:
                try:
                    self._free_block(self._pending.pop())
                except ValueError as e:
                    import warnings
                    warnings.warn(f"deferred free failed: {e}", RuntimeWarning, stacklevel=3)
        finally:
            self._busy = False

    def _check_nbytes(self, nbytes):
        import operator
        if isinstance(nbytes, bool):
            raise TypeError(f"CachingAllocator.malloc: nbytes must be an int, got bool {nbytes!r}")
        try:
            n = operator.index(nbytes)
        except TypeError:
            raise TypeError(f"CachingAllocator.malloc: nbytes must be an int, got "
                            f"{type(nbytes).__name__} {nbytes!r}") from None
        if n <= 0:
            raise ValueError(f"CachingAllocator.malloc: nbytes must be > 0, got {n} "
                             f"(zero-size storages need no block)")
        return n

    def _free_block(self, block):
        ptr = block.ptr
        if self._live.get(ptr) is not block:
            raise ValueError(f"CachingAllocator.free: {block!r} is not a live block of this "
                             f"allocator ({self.device}); freed twice or allocated elsewhere")
        del self._live[ptr]
        block.allocated = False
        self.num_frees += 1
        self.allocated -= block.size
        self.requested -= block.requested
        if self._trace is not None:
            self._trace.record("free", self.device, block.seg.stream, ptr, 0, 0)
        self._merge_free(block)

    def _merge_free(self, block):
        # merge a no-longer-used block with its free neighbours into its free list
        seg = block.seg
        fl = self._free.get(seg.key)
        if fl is None:
            fl = self._free[seg.key] = []
        p = block.prev
        if p is not None and not p.allocated:      # merge into the free block before
            del fl[bisect_left(fl, (p.size, p.ptr))]
            _absorb(seg, p, block)
            block = p
        n = block.next
        if n is not None and not n.allocated:      # merge the free block after
            del fl[bisect_left(fl, (n.size, n.ptr))]
            _absorb(seg, block, n)
        insort(fl, (block.size, block.ptr, block))
        if seg.pool and seg.pool in self._released_pools and block.size == seg.size:
            sync = getattr(self.raw, "synchronize", None)
            if sync is not None:    # queued kernels of the released pool may still use it
                sync()
            self._release_segment(seg)

    # ----------------------------------------------------------------------- segments

    def _new_segment(self, size, nbytes, small, stream) -> Block:
        seg_bytes = SMALL_SEGMENT if small else segment_size(size)
        try:
            ptr = self.raw.malloc(seg_bytes)
        except RawOutOfMemory:
            # free every cached segment and try once more
            self.num_alloc_retries += 1
            self._release_cached()
            try:
                ptr = self.raw.malloc(seg_bytes)
            except RawOutOfMemory as e:
                self.num_ooms += 1
                msg = self._oom_message(nbytes, size, seg_bytes, stream, e)
                if self._trace is not None:
                    self._trace.record("oom", self.device, stream, 0, seg_bytes, nbytes)
                raise OutOfMemoryError(msg) from None
        seg = Segment(ptr, seg_bytes, stream, self._pool, small)
        block = Block(ptr, seg_bytes, stream, seg)
        self._segs[ptr] = seg
        insort(self._seg_starts, ptr)
        seg.head = block
        self.num_segment_allocs += 1
        r = self.reserved = self.reserved + seg_bytes
        if r > self.peak_reserved:
            self.peak_reserved = r
        if self._trace is not None:
            self._trace.record("segment_alloc", self.device, stream, ptr, seg_bytes, 0)
        return block

    def _releasable(self, seg) -> bool:
        head = seg.head
        return (not head.allocated and head.size == seg.size
                and (seg.pool == 0 or seg.pool in self._released_pools))

    def _release_cached(self) -> int:
        """Return every wholly free segment of the default pool (and of released private pools)
        to the raw allocator. Returns the bytes released."""
        self._flush_parked()
        segs = [s for s in self._segs.values() if self._releasable(s)]
        if not segs:
            return 0
        # memory freed by Python may still be read by queued kernels: let them finish first
        sync = getattr(self.raw, "synchronize", None)
        if sync is not None:
            sync()
        released = 0
        for seg in segs:
            released += seg.size
            self._release_segment(seg)
        return released

    def _release_segment(self, seg):
        head = seg.head
        fl = self._free[seg.key]       # (an emptied list stays: malloc may be holding it)
        del fl[bisect_left(fl, (head.size, head.ptr))]
        del self._segs[seg.ptr]
        del self._seg_starts[bisect_left(self._seg_starts, seg.ptr)]
        if self._last is not None and self._last.seg is seg:
            self._last = None
        self.raw.free(seg.ptr)
        self.reserved -= seg.size
        self.num_segment_frees += 1
        if self._trace is not None:
            self._trace.record("segment_free", self.device, seg.stream, seg.ptr, seg.size, 0)
        if seg.pool and seg.pool in self._released_pools and not any(
                s.pool == seg.pool for s in self._segs.values()):
            self._released_pools.discard(seg.pool)

    def empty_cache(self) -> int:
        """Release all cached segments that hold no live block; returns the bytes released."""
        with self._lock:
            if self._busy:
                raise RuntimeError("CachingAllocator.empty_cache: called re-entrantly")
            self._busy = True
            try:
                return self._release_cached()
            finally:
                self._idle()

    # ----------------------------------------------------------------------- private pools

    @contextmanager
    def private_pool(self, pool: MemPool | None = None):
        """Inside the block, new memory comes from a private pool (a new one, or `pool` to
        extend one). Its segments stay reserved for it until `release_pool(pool)`."""
        with self._lock:
            if pool is None:
                pool = MemPool(self._next_pool)
                self._next_pool += 1
            elif pool.released:
                raise ValueError(f"private_pool: {pool!r} was released; it cannot be reused")
            prev, self._pool = self._pool, pool.id
        try:
            yield pool
        finally:
            with self._lock:
                self._pool = prev

    def release_pool(self, pool: MemPool) -> None:
        """Give `pool`'s memory back: its wholly free segments now, the rest as they empty."""
        with self._lock:
            if pool.released:
                return
            if self._pool == pool.id:
                raise RuntimeError(f"release_pool: {pool!r} is in use (inside private_pool)")
            pool.released = True
            self._released_pools.add(pool.id)
            self._busy = True
            try:
                segs = [s for s in self._segs.values() if s.pool == pool.id and self._releasable(s)]
                if segs:
                    sync = getattr(self.raw, "synchronize", None)
                    if sync is not None:
                        sync()
                for s in segs:
                    self._release_segment(s)
                if not any(s.pool == pool.id for s in self._segs.values()):
                    self._released_pools.discard(pool.id)
            finally:
                self._idle()

    # ----------------------------------------------------------------------- queries

    def holds(self, addr: int) -> bool:
        """True when `addr` lies inside a live block this allocator handed out
        (block.ptr <= addr < block.ptr + block.size)."""
        if addr in self._live:
            return True
        b = self._last
        if b is not None and b.allocated is True and b.ptr <= addr < b.ptr + b.size:
            return True
        b = self.find(addr)
        if b is None:
            return False
        self._last = b
        return True

    def find(self, addr: int) -> Block | None:
        """The live block containing `addr`, or None. O(log segments + log blocks in it)."""
        b = self._live.get(addr)
        if b is not None:
            return b
        with self._lock:
            starts = self._seg_starts
            i = bisect_right(starts, addr) - 1
            if i < 0:
                return None
            seg = self._segs[starts[i]]
            if addr >= seg.ptr + seg.size:
                return None
            bs = seg.starts
            b = self._live.get(bs[bisect_right(bs, addr) - 1])
            if b is not None and addr < b.ptr + b.size:
                return b
            return None

    def _settle(self):
        # the merged picture for a report; not from a finalizer inside a malloc/free
        if self._nparked and not self._busy:
            self._busy = True
            try:
                self._flush_parked()
            finally:
                self._idle()

    def largest_free_block(self) -> int:
        with self._lock:
            self._settle()
            return max((fl[-1][0] for fl in self._free.values() if fl), default=0)

    def stats(self) -> dict:
        """Current and peak bytes, counts, and the cache's shape."""
        with self._lock:
            self._settle()
            free_blocks = sum(len(fl) for fl in self._free.values())
            return {
                "allocated_bytes": self.allocated, "allocated_bytes.peak": self.peak_allocated,
                "reserved_bytes": self.reserved, "reserved_bytes.peak": self.peak_reserved,
                "requested_bytes": self.requested, "requested_bytes.peak": self.peak_requested,
                "cached_free_bytes": self.reserved - self.allocated,
                "largest_free_block": max((fl[-1][0] for fl in self._free.values() if fl), default=0),
                "active_blocks": len(self._live), "free_blocks": free_blocks,
                "segments": len(self._segs),
                **{k: getattr(self, k) for k in _STAT_COUNTS},
            }

    def reset_peak_stats(self) -> None:
        """Peaks restart from the current values."""
        with self._lock:
            self.peak_allocated = self.allocated
            self.peak_reserved = self.reserved
            self.peak_requested = self.requested

    def reset_accumulated_stats(self) -> None:
        """Counts (allocs, frees, segment allocs/frees, retries, OOMs) restart from zero."""
        with self._lock:
            for k in _STAT_COUNTS:
                setattr(self, k, 0)

    def snapshot(self) -> list:
        """Segments and their blocks, address-ordered: a picture of the cache for debugging."""
        with self._lock:
            self._settle()
            out = []
            for sp in self._seg_starts:
                seg = self._segs[sp]
                blocks, b = [], seg.head
                while b is not None:
                    blocks.append({"ptr": b.ptr, "size": b.size, "requested": b.requested,
                                   "allocated": b.allocated})
                    b = b.next
                out.append({"ptr": seg.ptr, "size": seg.size, "stream": seg.stream,
                            "pool": seg.pool, "small": seg.small, "blocks": blocks})
            return out

    def check(self) -> None:
        """Verify the internal invariants (tests call this after every step)."""
        with self._lock:
            assert self._seg_starts == sorted(self._segs)
            n_free = n_parked = 0
            allocated = 0
            for sp in self._seg_starts:
                seg = self._segs[sp]
                b, addr, prev, starts = seg.head, sp, None, []
                assert b.prev is None
                while b is not None:
                    assert b.ptr == addr and b.seg is seg and b.prev is prev and b.size > 0
                    assert b.stream == seg.stream
                    starts.append(b.ptr)
                    if b.allocated is _PARKED:
                        assert b.ptr not in self._live and seg.pool == 0
                        assert b.size < MIN_LARGE_ALLOC and b.size == round_size(b.requested)
                        assert any(x is b for x in self._parked[b.stream][b.size])
                        n_parked += 1
                    elif b.allocated:
                        assert b.allocated is True and self._live[b.ptr] is b
                        allocated += b.size
                    else:
                        assert prev is None or prev.allocated, "two free neighbours not merged"
                        fl = self._free[seg.key]
                        i = bisect_left(fl, (b.size, b.ptr))
                        assert fl[i][2] is b, "free block missing from its free list"
                        n_free += 1
                    addr += b.size
                    prev, b = b, b.next
                assert addr == sp + seg.size, "blocks do not tile the segment"
                assert starts == seg.starts
            assert n_free == sum(len(fl) for fl in self._free.values())
            assert all(fl == sorted(fl, key=lambda t: (t[0], t[1])) for fl in self._free.values())
            assert allocated == self.allocated
            lists = [v for d in self._parked.values() for v in d.values()]
            assert n_parked == self._nparked == sum(len(v) for v in lists)
            assert all(len(v) <= PARK_MAX for v in lists)
            assert self.reserved == sum(s.size for s in self._segs.values())

    def _oom_message(self, nbytes, size, seg_bytes, stream, err) -> str:
        try:
            dev_free, dev_total = self.raw.mem_get_info()
            dev = f"{format_bytes(dev_free)} free of {format_bytes(dev_total)} on the device"
            if nbytes > dev_total:
                dev += f" (the request is more than the device's total of {dev_total} bytes)"
        except Exception as e:  # noqa: BLE001 - the message must not hide the OOM itself
            dev = f"device free memory unknown ({e})"
        largest = max((fl[-1][0] for fl in self._free.values() if fl), default=0)
        return (f"{self.device}: out of memory: tried to allocate {format_bytes(nbytes)} "
                f"({nbytes} bytes; a new segment of {format_bytes(seg_bytes)}) on stream {stream:#x}. "
                f"Allocated by nbxtensor: {format_bytes(self.allocated)} ({self.allocated} bytes); "
                f"reserved: {format_bytes(self.reserved)} ({self.reserved} bytes), of which cached "
                f"free: {format_bytes(self.reserved - self.allocated)}; largest free cached block: "
                f"{format_bytes(largest)} ({largest} bytes); {dev}. The cache was emptied and the "
                f"request retried once. [{err}]")

    def __repr__(self):
        return (f"<CachingAllocator {self.device}: allocated {format_bytes(self.allocated)}, "
                f"reserved {format_bytes(self.reserved)}, {len(self._segs)} segments>")


# --------------------------------------------------------------------------- raw allocators

class FakeRaw:
    """A raw allocator over a pretend address space, for tests and trace replay.

    capacity   bytes it may hand out at once (malloc beyond raises RawOutOfMemory)
    gap        bytes left between consecutive segments (0: adjacent, to check that blocks
               never merge across segments)
    fail_next  the next `fail_next` mallocs fail whatever the capacity
    fail       optional callable(nbytes) -> bool: True fails that malloc
    """

    def __init__(self, capacity: int = 1 << 50, *, base: int = 0x7F00_0000_0000,
                 gap: int = 2 << 20, fail=None):
        self.capacity = capacity
        self.gap = gap
        self.fail = fail
        self.fail_next = 0
        self.used = 0
        self.live = {}              # ptr -> nbytes
        self._next = base
        self.malloc_calls = self.free_calls = self.sync_calls = 0

    def malloc(self, nbytes: int) -> int:
        self.malloc_calls += 1
        if self.fail_next > 0:
            self.fail_next -= 1
            raise RawOutOfMemory(f"FakeRaw: injected failure for {nbytes} bytes")
        if self.fail is not None and self.fail(nbytes):
            raise RawOutOfMemory(f"FakeRaw: injected failure for {nbytes} bytes")
        if self.used + nbytes > self.capacity:
            raise RawOutOfMemory(f"FakeRaw: {nbytes} bytes asked, {self.capacity - self.used} free")
        ptr = self._next
        self._next += (nbytes + 511) // 512 * 512 + self.gap
        self.live[ptr] = nbytes
        self.used += nbytes
        return ptr

    def free(self, ptr: int) -> None:
        self.free_calls += 1
        n = self.live.pop(ptr, None)
        if n is None:
            raise ValueError(f"FakeRaw.free: {ptr:#x} was not allocated here")
        self.used -= n

    def mem_get_info(self) -> tuple[int, int]:
        return self.capacity - self.used, self.capacity

    def synchronize(self) -> None:
        self.sync_calls += 1


class DriverRaw:
    """Raw device memory of device `index` through the CUDA driver (cuMemAlloc/cuMemFree)."""

    def __init__(self, index: int):
        self.index = index

    def malloc(self, nbytes: int) -> int:
        from . import driver
        if nbytes >= 1 << 64:       # ctypes would pass it to cuMemAlloc's size_t modulo 2**64
            raise RawOutOfMemory(f"{nbytes} bytes do not fit the driver's size_t")
        driver.set_device(self.index)
        try:
            return driver.mem_alloc(nbytes)
        except driver.CudaError as e:
            if e.name == "CUDA_ERROR_OUT_OF_MEMORY":
                raise RawOutOfMemory(str(e)) from e
            raise

    def free(self, ptr: int) -> None:
        from . import driver
        driver.set_device(self.index)
        driver.mem_free(ptr)

    def mem_get_info(self) -> tuple[int, int]:
        from . import driver
        driver.set_device(self.index)
        return driver.mem_get_info()

    def synchronize(self) -> None:
        from . import driver
        driver.set_device(self.index)
        driver.ctx_synchronize()


# --------------------------------------------------------------------------- one per device

_allocators: dict = {}           # device index -> CachingAllocator
_create_lock = threading.Lock()
_trace = None                    # the active memtrace.Recorder, if any


def _index_of(device) -> int:
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"allocator_for: device index must be >= 0, got {device}")
        return device
    from ...device import as_device
    d = device if isinstance(device, _Device) else as_device(device)
    if d.type != "cuda":
        raise ValueError(f"allocator_for: expected a cuda device, got {d}")
    return d.index or 0


def allocator_for(device) -> CachingAllocator:
    """The caching allocator of a cuda device (a Device, 'cuda:N' or an index)."""
    if device.__class__ is int:         # the launcher's per-argument path: keep it cheap
        idx = device
    elif device.__class__ is _Device and device.type == "cuda":
        idx = device.index or 0
    else:
        idx = _index_of(device)
    a = _allocators.get(idx)
    if a is None:
        idx = _index_of(idx)
        with _create_lock:
            a = _allocators.get(idx)
            if a is None:
                a = _allocators[idx] = CachingAllocator(DriverRaw(idx), f"cuda:{idx}")
    return a


def allocators() -> dict:
    """The allocators created so far, by device index."""
    return dict(_allocators)


def set_trace(recorder) -> None:
    """Attach `recorder` (or None) to every allocator, present and future."""
    global _trace
    _trace = recorder
    for a in list(_allocators.values()):
        a._trace = recorder


# --------------------------------------------------------------------------- pinned host memory
# Page-locked host memory: the pin_memory() tensors and the staging ring of pageable copies
# (backends/cuda/storage.py). cuMemHostAlloc + cuMemFreeHost cost ~0.8 ms per MiB together,
# so freed blocks are cached for the next request of a fitting size, as torch's
# CachingHostAllocator does; and, as there, a block an async copy read or wrote carries the
# event recorded after that copy (`record_use`): a cached block is handed out again only once
# its events completed, so a pinned tensor dropped right after a non_blocking copy cannot be
# overwritten (or freed) while the DMA engine still reads it.

PINNED_GRAIN = 64 << 10         # pinned sizes are rounded up to a power of two >= this
PINNED_CACHE_MAX_BYTES = 1 << 30    # idle cached pinned bytes kept; beyond it the oldest are freed


class _PinnedHandle:
    """Owns one pinned block: it goes back to the allocator when the last NumPy view of the
    memory (through the ctypes buffer that references this handle) dies."""

    __slots__ = ("ptr", "size", "alloc", "__weakref__")

    def __init__(self, ptr, size, alloc):
        self.ptr, self.size, self.alloc = ptr, size, alloc

    def __del__(self):
        try:
            self.alloc.free(self.ptr)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to return it to
            pass


class PinnedHostAllocator:
    """Caching allocator of pinned host memory (one per process: the memory is portable, so
    every device's context may DMA from it). `driver` is backends/cuda/driver or a fake with
    mem_host_alloc, mem_free_host, event_create, event_record, event_query, event_destroy.

    Freeing takes no lock and calls no driver function (a finalizer may free, in any thread,
    even in the middle of a malloc): it queues the block, and the next call that reads the
    table moves it to the cache; events are queried and recycled when a request looks there."""

    def __init__(self, driver=None):
        self._driver = driver
        self._lock = threading.Lock()
        self._live = {}             # ptr -> size of blocks handed out
        self._starts = []           # sorted ptrs of the live blocks (holds() on interior addresses)
        # ptr -> {stream: (device index, event)}: the event recorded after the last async copy
        # on that stream (a later record replaces an earlier one: stream order completes it later)
        self._uses = {}
        self._cached = []           # [(size, ptr)] freed blocks, oldest first
        self._idle_events = {}      # device index -> [event] completed, ready to record again
        self._returned = collections.deque()    # ptrs freed, not yet moved to the cache
        self.allocated = 0          # bytes in live blocks
        self.reserved = 0           # bytes pinned (live + cached)
        self.num_host_allocs = 0    # cuMemHostAlloc calls

    @property
    def driver(self):
        if self._driver is None:
            from . import driver
            self._driver = driver
        return self._driver

    @staticmethod
    def size_for(nbytes: int) -> int:
        n = PINNED_GRAIN
        while n < nbytes:
            n *= 2
        return n

    def malloc(self, nbytes: int) -> _PinnedHandle:
        """A pinned block of at least `nbytes` (> 0) bytes."""
        if nbytes.__class__ is not int or nbytes <= 0:
            raise ValueError(f"PinnedHostAllocator.malloc: nbytes must be an int > 0, got {nbytes!r}")
        size = self.size_for(nbytes)
        self._drain()
        with self._lock:
            ptr = self._reuse(size)
        if ptr is None:
            ptr = self.driver.mem_host_alloc(size)
            with self._lock:
                self.reserved += size
                self.num_host_allocs += 1
        with self._lock:
            self._live[ptr] = size
            insort(self._starts, ptr)
            self.allocated += size
        return _PinnedHandle(ptr, size, self)

    def _reuse(self, size):
        """The ptr of a cached block of exactly `size` whose copies all completed, or None."""
        for i, (n, p) in enumerate(self._cached):
            if n == size and self._idle(p):
                del self._cached[i]
                return p
        return None

    def _idle(self, ptr) -> bool:
        uses = self._uses.get(ptr)
        if not uses:
            return True
        q = self.driver.event_query
        if not all(q(e) for _, e in uses.values()):
            return False
        for dev, e in self._uses.pop(ptr).values():
            self._idle_events.setdefault(dev, []).append(e)
        return True

    def free(self, ptr: int) -> None:
        """Return a live block (its copies may still be in flight); see the class comment."""
        self._returned.append(ptr)

    def _drain(self) -> None:
        """Move the freed blocks to the cache; free the oldest beyond PINNED_CACHE_MAX_BYTES."""
        if not self._returned:
            return
        drop = []
        with self._lock:
            while self._returned:
                ptr = self._returned.popleft()
                size = self._live.pop(ptr)
                del self._starts[bisect_left(self._starts, ptr)]
                self.allocated -= size
                self._cached.append((size, ptr))
            while sum(n for n, _ in self._cached) > PINNED_CACHE_MAX_BYTES:
                drop.append(self._cached.pop(0))
        self._free_now(drop)

    def _free_now(self, items) -> None:
        """cuMemFreeHost the (size, ptr) items, waiting for their copies first."""
        d = self.driver
        for n, p in items:
            with self._lock:
                uses = self._uses.pop(p, {})
                self.reserved -= n
            for dev, e in uses.values():
                d.event_synchronize(e)
                d.event_destroy(e)
            d.mem_free_host(p)

    def holds(self, ptr: int, nbytes: int = 1) -> bool:
        """True when [ptr, ptr + nbytes) lies inside one live pinned block."""
        self._drain()
        with self._lock:
            i = bisect_right(self._starts, ptr) - 1
            if i < 0:
                return False
            base = self._starts[i]
            return ptr + nbytes <= base + self._live[base]

    def _block_of(self, ptr: int):
        i = bisect_right(self._starts, ptr) - 1
        if i >= 0 and ptr < self._starts[i] + self._live[self._starts[i]]:
            return self._starts[i]
        return None

    def record_use(self, ptr: int, stream: int, device: int = 0) -> None:
        """An async copy from/to the live block holding `ptr` was queued on `stream`: the block
        is not reused before the work queued there so far completes."""
        d = self.driver
        with self._lock:
            base = self._block_of(ptr)
            if base is None:
                raise ValueError(f"record_use: {ptr:#x} is not in a live pinned block")
            uses = self._uses.setdefault(base, {})
            known = uses.get(stream)
            if known is not None:
                e = known[1]
            else:
                idle = self._idle_events.get(device)
                e = idle.pop() if idle else None
        if e is None:
            e = d.event_create(timing=False)
        d.event_record(e, stream)
        with self._lock:
            uses[stream] = (device, e)

    def empty_cache(self) -> int:
        """Free the cached blocks (waiting for their copies); returns the bytes freed."""
        self._drain()
        with self._lock:
            items, self._cached = self._cached, []
        self._free_now(items)
        return sum(n for n, _ in items)

    def stats(self) -> dict:
        self._drain()
        with self._lock:
            return {"allocated": self.allocated, "reserved": self.reserved,
                    "cached": sum(n for n, _ in self._cached), "live_blocks": len(self._live),
                    "num_host_allocs": self.num_host_allocs}


_pinned = [None]


def pinned_allocator() -> PinnedHostAllocator:
    """The process's pinned host allocator (made on first use; no driver call until a malloc)."""
    a = _pinned[0]
    if a is None:
        with _create_lock:
            a = _pinned[0]
            if a is None:
                a = _pinned[0] = PinnedHostAllocator()
    return a


def pinned_array(nbytes: int) -> np.ndarray:
    """A uint8 NumPy array of `nbytes` over pinned memory; the block goes back to the cache
    when the array and every view of it are gone."""
    if nbytes == 0:
        return np.empty(0, np.uint8)
    from .driver import CudaUnavailable
    try:
        h = pinned_allocator().malloc(nbytes)
    except CudaUnavailable as e:
        raise CudaUnavailable(f"pinned host memory (pin_memory) needs the CUDA driver: {e}") from None
    buf = (ctypes.c_uint8 * nbytes).from_address(h.ptr)
    buf._nbx_pinned = h         # views -> buffer -> handle: the memory lives while a view does
    return np.frombuffer(buf, np.uint8)


class PinnedHostStorage(HostStorage):
    """Host storage (device cpu) over page-locked memory: what pin_memory() makes. A copy
    between it and a cuda tensor is a DMA with no staging; with non_blocking=True it is
    asynchronous on the current stream."""

    __slots__ = ()
    is_pinned = True

    @classmethod
    def allocate(cls, device, nbytes: int) -> "PinnedHostStorage":
        return cls(device, pinned_array(nbytes))
