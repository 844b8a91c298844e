"""KVCache: a preallocated key/value cache for all layers of a decoder, on one device.

    cache = nbx.KVCache(num_layers, batch, num_kv_heads, capacity, head_dim,
                        dtype=nbx.bfloat16, device="cuda")
    cache.append(layer, k, v, positions)          # k, v: (B, Hk, T, D); positions (T,)/(B, T)
    q = cache.append_rope(layer, q, k, v, positions, theta=..., interleaved=..., scaling=...)
    k_l, v_l, lengths = cache.view(layer)         # (B, Hk, capacity, D) views + (B,) int32
    out = nbx.decode_attention(q, k_l, v_l, lengths)

* Storage: one buffer per K and V of shape (layers, B, Hk, capacity, D); `view(layer)` is
  a view, no copy. `lengths` is a device int32 tensor (B,): the number of valid tokens.
* `append` writes token t of batch b at slot positions[b, t] -- positions are read on the
  device, never on the host, so a captured decode step stays valid as they advance -- and
  sets lengths[b] = positions[b, -1] + 1 (the same value from every layer, so appending
  layer after layer is idempotent). A position outside [0, capacity) (appending to a full
  cache: position == capacity) raises IndexError, as an out-of-range index does: on cpu
  before anything is written; on cuda/interp the kernel skips that token, keeps lengths
  inside [0, capacity] and records it in the index-error flag (kernels/indexing.py), read
  at the op on interp and at the next synchronising call on cuda -- so a captured decode
  step needs no host read. `check_positions` reads positions back and checks them at once.
* decode_attention checks `lengths` against the capacity the same way and reads at most
  `capacity` keys whatever the lengths hold.
* `append_rope` rotates q in place and k on the way into the cache (k itself is not
  modified), one kernel for both (the fused RoPE + cache write of the decode step).

PagedKVCache: the same for sequences of different lengths sharing one pool of pages.

    cache = nbx.PagedKVCache(num_blocks, block_size, num_layers, num_kv_heads, head_dim,
                             dtype=nbx.bfloat16, device="cuda")
    tables, lengths = cache.allocate([17, 300, 5])   # pages for each sequence's capacity
    cache.append(layer, k, v, positions)          # positions (T,) / (B, T): logical slots
    k_p, v_p, tables, lengths = cache.view(layer)
    out = nbx.paged_decode_attention(q, (k_p, v_p), tables, lengths)

* Storage: k (layers, num_blocks, block_size, Hk, D) (and v); `view(layer)` is a view.
* `allocate(capacities)` takes ceil(capacity / block_size) free pages per sequence from the
  pool (a host free list) and builds the int32 (B, max_blocks) block table, unused entries
  -1; `release()` gives them back. `set_block_tables(tables)` installs tables built by the
  caller (tests: shuffled pages). Lengths live on the device, as KVCache's.
"""
from __future__ import annotations

from . import dtypes as _dt
from .device import Device
from .dispatch import impl
from .tensor import Tensor

__all__ = ["KVCache", "PagedKVCache"]


def _checked_dims(who, dtype, value_dim, **dims):
    """Every size a positive int (value_dim too, when given) and a floating dtype: the dtype."""
    if value_dim is not None:
        dims["value_dim"] = value_dim
    for n, x in dims.items():
        if not isinstance(x, int) or isinstance(x, bool) or x <= 0:
            raise ValueError(f"{who}: {n} must be a positive int, got {x!r}")
    dtype = _dt.as_dtype(dtype) if dtype is not None else _dt.get_default_dtype()
    if not dtype.is_floating_point:
        raise TypeError(f"{who}: dtype must be floating point, got {dtype.name}")
    return dtype


def _allocate_kv(cache, device, dtype, num_layers, num_kv_heads, head_dim, value_dim, slots):
    """Give `cache` the attributes both cache kinds share, and its zeroed k and v of shape
    (num_layers, *slots, head_dim) and (num_layers, *slots, value_dim)."""
    from .creation import zeros
    cache.device = Device(device)
    cache.dtype = dtype
    cache.num_layers, cache.num_kv_heads, cache.head_dim = num_layers, num_kv_heads, head_dim
    cache.value_dim = head_dim if value_dim is None else value_dim
    cache.k = zeros(num_layers, *slots, head_dim, dtype=dtype, device=cache.device)
    cache.v = zeros(num_layers, *slots, cache.value_dim, dtype=dtype, device=cache.device)


def _checked_kv(cache, k, v, positions, op):
    """The positions of an append of k, v (B, Hk, T, D) to `cache` (a KVCache or a
    PagedKVCache), checked against its batch, heads, head sizes, dtype and device."""
    from .ops.attention import _check_positions
    for n, t, d in (("k", k, cache.head_dim), ("v", v, cache.value_dim)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {n} must be a Tensor, got {type(t).__name__}")
        if t.ndim != 4 or t.shape[0] != cache.batch or t.shape[1] != cache.num_kv_heads \
                or t.shape[3] != d:
            raise ValueError(f"{op}: {n} must have shape ({cache.batch}, "
                             f"{cache.num_kv_heads}, T, {d}), got {tuple(t.shape)}")
        if t.dtype != cache.dtype or t.device != cache.device:
            raise ValueError(f"{op}: {n} must be {cache.dtype.name} on {cache.device}, got "
                             f"{t.dtype.name} on {t.device}")
    T = k.shape[2]
    if v.shape[2] != T:
        raise ValueError(f"{op}: k has {T} tokens but v has {v.shape[2]}")
    return _check_positions(positions, cache.batch, T, cache.device, op)


class KVCache:
    def __init__(self, num_layers, batch, num_kv_heads, capacity, head_dim, *, dtype=None,
                 device="cpu", value_dim=None):
        from .creation import zeros
        dtype = _checked_dims("KVCache", dtype, value_dim, num_layers=num_layers, batch=batch,
                              num_kv_heads=num_kv_heads, capacity=capacity, head_dim=head_dim)
        self.batch, self.capacity = batch, capacity
        _allocate_kv(self, device, dtype, num_layers, num_kv_heads, head_dim, value_dim,
                     (batch, num_kv_heads, capacity))
        self.lengths = zeros(batch, dtype=_dt.int32, device=self.device)
        self.pos = 0    # the host's count of stored tokens, for loops that keep it (advance)

    def __repr__(self):
        return (f"KVCache(layers={self.num_layers}, batch={self.batch}, "
                f"kv_heads={self.num_kv_heads}, capacity={self.capacity}, "
                f"head_dim={self.head_dim}, dtype={self.dtype.name}, device={self.device})")

    def view(self, layer):
        """(k, v, lengths) of one layer: (B, Hk, capacity, D) views and the (B,) lengths."""
        self._check_layer(layer)
        return self.k[layer], self.v[layer], self.lengths

    def reset(self):
        """Forget every token (lengths and pos to 0); the stored values are left as they are."""
        self.lengths.zero_()
        self.pos = 0

    def advance(self, n):
        """For a loop that writes tokens at host positions (the eager forward of one
        sequence): pos += n and every sequence's length set to it, so the position never
        has to be read back from the device."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0 or self.pos + n > self.capacity:
            raise ValueError(f"KVCache.advance: n must be an int in [0, "
                             f"{self.capacity - self.pos}] (capacity {self.capacity}, "
                             f"{self.pos} stored), got {n!r}")
        self.pos += n
        self.lengths.fill_(self.pos)

    def _check_layer(self, layer):
        if not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise IndexError(f"KVCache: layer must be an int in [0, {self.num_layers}), "
                             f"got {layer!r}")

    def append(self, layer, k, v, positions):
        """Write k, v (B, Hk, T, D) at slots positions ((T,) or (B, T), on the device)."""
        self._check_layer(layer)
        pos = _checked_kv(self, k, v, positions, "KVCache.append")
        if k.shape[2]:
            ck, cv, lengths = self.view(layer)
            impl("kv_append", self.device)(ck, cv, lengths, k, v, pos)

    def append_rope(self, layer, q, k, v, positions, *, theta=10000.0, interleaved=False,
                    scaling=None):
        """RoPE on q (in place; (B, Hq, T, D)) and on k as it is written; returns q."""
        from .ops.attention import _check_float, _inv_freq_tensor
        op = "KVCache.append_rope"
        self._check_layer(layer)
        pos = _checked_kv(self, k, v, positions, op)
        _check_float(q, "q", op)
        if q.ndim != 4 or q.shape[0] != self.batch or q.shape[2] != k.shape[2] \
                or q.shape[3] != self.head_dim or q.shape[1] % self.num_kv_heads:
            raise ValueError(f"{op}: q must have shape ({self.batch}, Hq, {k.shape[2]}, "
                             f"{self.head_dim}) with Hq a multiple of {self.num_kv_heads}, got "
                             f"{tuple(q.shape)}")
        if q.dtype != self.dtype or q.device != self.device:
            raise ValueError(f"{op}: q must be {self.dtype.name} on {self.device}, got "
                             f"{q.dtype.name} on {q.device}")
        if self.head_dim % 2:
            raise ValueError(f"{op}: RoPE needs an even head dim, got {self.head_dim}")
        if k.shape[2]:
            inv = _inv_freq_tensor(self.head_dim, theta, scaling, self.device)
            ck, cv, lengths = self.view(layer)
            impl("kv_append", self.device)(ck, cv, lengths, k, v, pos, q, inv,
                                           interleaved=bool(interleaved))
        return q

    def check_positions(self, positions):
        """Host-side check (reads the device): every position in [0, capacity)."""
        import numpy as np
        p = np.asarray(positions.numpy())
        if p.size and (p.min() < 0 or p.max() >= self.capacity):
            raise IndexError(f"KVCache: positions must lie in [0, {self.capacity}), got "
                             f"[{p.min()}, {p.max()}]")


class PagedKVCache:
    def __init__(self, num_blocks, block_size, num_layers, num_kv_heads, head_dim, dtype=None,
                 device="cpu", *, value_dim=None):
        dtype = _checked_dims("PagedKVCache", dtype, value_dim, num_blocks=num_blocks,
                              block_size=block_size, num_layers=num_layers,
                              num_kv_heads=num_kv_heads, head_dim=head_dim)
        self.num_blocks, self.block_size = num_blocks, block_size
        _allocate_kv(self, device, dtype, num_layers, num_kv_heads, head_dim, value_dim,
                     (num_blocks, block_size, num_kv_heads))
        self._free = list(range(num_blocks))
        self._held: list = []
        self.block_tables = None
        self.lengths = None

    def __repr__(self):
        return (f"PagedKVCache(blocks={self.num_blocks}, block_size={self.block_size}, "
                f"layers={self.num_layers}, kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype.name}, device={self.device})")

    @property
    def batch(self) -> int:
        return 0 if self.block_tables is None else self.block_tables.shape[0]

    @property
    def capacity(self) -> int:
        """Slots per sequence of the installed block table."""
        return 0 if self.block_tables is None else self.block_tables.shape[1] * self.block_size

    def allocate(self, capacities, max_blocks=None):
        """Pages for sequences of `capacities` tokens each (releasing the previous batch's);
        returns (block_tables, lengths), lengths zero."""
        import numpy as np
        from .creation import tensor
        caps = list(capacities)
        if not caps or any(not isinstance(c, int) or isinstance(c, bool) or c <= 0 for c in caps):
            raise ValueError(f"PagedKVCache.allocate: capacities must be positive ints, got "
                             f"{caps!r}")
        self.release()
        need = [-(-c // self.block_size) for c in caps]
        mb = max(need) if max_blocks is None else max_blocks
        if not isinstance(mb, int) or mb < max(need):
            raise ValueError(f"PagedKVCache.allocate: max_blocks {mb!r} is below the "
                             f"{max(need)} pages the longest sequence needs")
        if sum(need) > len(self._free):
            raise ValueError(f"PagedKVCache.allocate: {sum(need)} pages needed, "
                             f"{len(self._free)} of {self.num_blocks} free")
        t = np.full((len(caps), mb), -1, np.int32)
        for b, n in enumerate(need):
            pages, self._free = self._free[:n], self._free[n:]
            t[b, :n] = pages
            self._held.extend(pages)
        self.block_tables = tensor(t, device=self.device)
        self.lengths = tensor(np.zeros(len(caps), np.int32), device=self.device)
        return self.block_tables, self.lengths

    def set_block_tables(self, block_tables, lengths=None):
        """Install caller-built tables (int32 (B, max_blocks); entries in [-1, num_blocks),
        checked on the host here) and lengths (default zeros)."""
        import numpy as np
        from .creation import tensor
        from .ops.paged_attention import _check_tables
        op = "PagedKVCache.set_block_tables"
        if not isinstance(block_tables, Tensor):
            raise TypeError(f"{op}: block_tables must be a Tensor, got "
                            f"{type(block_tables).__name__}")
        bt = _check_tables(block_tables, block_tables.shape[0] if block_tables.ndim else -1,
                           self.device, op)
        h = np.asarray(bt.numpy())
        if h.size and (h.min() < -1 or h.max() >= self.num_blocks):
            raise IndexError(f"{op}: page ids must lie in [-1, {self.num_blocks}), got "
                             f"[{h.min()}, {h.max()}]")
        self.release()
        self.block_tables = bt
        if lengths is None:
            lengths = tensor(np.zeros(bt.shape[0], np.int32), device=self.device)
        elif not isinstance(lengths, Tensor) or lengths.dtype is not _dt.int32 or \
                tuple(lengths.shape) != (bt.shape[0],) or lengths.device != self.device:
            raise ValueError(f"{op}: lengths must be int32 ({bt.shape[0]},) on {self.device}")
        self.lengths = lengths

    def select(self, b):
        """A PagedKVCache over sequence b alone, sharing the pages, the table row and the
        length with this one (a batch-1 view: prefill one prompt into the batch's cache)."""
        self._need_tables("PagedKVCache.select")
        if not isinstance(b, int) or not 0 <= b < self.batch:
            raise IndexError(f"PagedKVCache.select: b must be an int in [0, {self.batch}), "
                             f"got {b!r}")
        sub = object.__new__(PagedKVCache)
        sub.__dict__.update(self.__dict__)
        sub._free, sub._held = [], []           # pages stay owned by this cache
        sub.block_tables = self.block_tables[b:b + 1]
        sub.lengths = self.lengths[b:b + 1]
        return sub

    def release(self):
        """Give the current batch's pages back to the pool."""
        self._free = sorted(self._free + self._held)
        self._held = []
        self.block_tables = self.lengths = None

    def reset(self):
        """Forget every token of the current batch (lengths to 0); pages stay allocated."""
        if self.lengths is not None:
            self.lengths.zero_()

    def _check_layer(self, layer):
        if not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise IndexError(f"PagedKVCache: layer must be an int in [0, {self.num_layers}), "
                             f"got {layer!r}")

    def _need_tables(self, op):
        if self.block_tables is None:
            raise RuntimeError(f"{op}: no sequences: call allocate() or set_block_tables() "
                               f"first")

    def view(self, layer):
        """(k_pages, v_pages, block_tables, lengths) of one layer."""
        self._check_layer(layer)
        self._need_tables("PagedKVCache.view")
        return self.k[layer], self.v[layer], self.block_tables, self.lengths

    def append(self, layer, k, v, positions):
        """Write k, v (B, Hk, T, D) at logical slots positions ((T,) or (B, T), on the
        device) into their pages. A slot outside [0, capacity) or whose page is unassigned
        raises IndexError (cpu: before writing; cuda/interp: the token is skipped and the
        index-error flag records it)."""
        op = "PagedKVCache.append"
        self._check_layer(layer)
        self._need_tables(op)
        pos = _checked_kv(self, k, v, positions, op)
        if k.shape[2]:
            impl("paged_kv_append", self.device)(self.k[layer], self.v[layer],
                                                 self.block_tables, self.lengths, k, v, pos)
