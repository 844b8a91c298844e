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
  layer after layer is idempotent). Positions outside [0, capacity) are skipped on the
  device (it cannot raise); `check_positions` is the host-side check for eager code.
* `append_rope` rotates q in place and k on the way into the cache (k itself is not
  modified), one kernel for both (the fused RoPE + cache write of the decode step).
* Paged layouts later: `view(layer)` would return a block table besides the pool; callers
  that only go through append/view/decode_attention need no change.
"""
from __future__ import annotations

from . import dtypes as _dt
from .device import Device
from .dispatch import impl
from .tensor import Tensor

__all__ = ["KVCache"]


class KVCache:
    def __init__(self, num_layers, batch, num_kv_heads, capacity, head_dim, *, dtype=None,
                 device="cpu", value_dim=None):
        from .creation import zeros
        dims = dict(num_layers=num_layers, batch=batch, num_kv_heads=num_kv_heads,
                    capacity=capacity, head_dim=head_dim)
        if value_dim is not None:
            dims["value_dim"] = value_dim
        for n, x in dims.items():
            if not isinstance(x, int) or isinstance(x, bool) or x <= 0:
                raise ValueError(f"KVCache: {n} must be a positive int, got {x!r}")
        dtype = _dt.as_dtype(dtype) if dtype is not None else _dt.get_default_dtype()
        if not dtype.is_floating_point:
            raise TypeError(f"KVCache: dtype must be floating point, got {dtype.name}")
        self.device = Device(device)
        self.dtype = dtype
        self.num_layers, self.batch, self.num_kv_heads = num_layers, batch, num_kv_heads
        self.capacity, self.head_dim = capacity, head_dim
        self.value_dim = head_dim if value_dim is None else value_dim
        self.k = zeros(num_layers, batch, num_kv_heads, capacity, head_dim, dtype=dtype,
                       device=self.device)
        self.v = zeros(num_layers, batch, num_kv_heads, capacity, self.value_dim, dtype=dtype,
                       device=self.device)
        self.lengths = zeros(batch, dtype=_dt.int32, device=self.device)

    def __repr__(self):
        return (f"KVCache(layers={self.num_layers}, batch={self.batch}, "
                f"kv_heads={self.num_kv_heads}, capacity={self.capacity}, "
                f"head_dim={self.head_dim}, dtype={self.dtype.name}, device={self.device})")

    def view(self, layer):
        """(k, v, lengths) of one layer: (B, Hk, capacity, D) views and the (B,) lengths."""
        self._check_layer(layer)
        return self.k[layer], self.v[layer], self.lengths

    def reset(self):
        """Forget every token (lengths to 0); the stored values are left as they are."""
        self.lengths.zero_()

    def _check_layer(self, layer):
        if not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise IndexError(f"KVCache: layer must be an int in [0, {self.num_layers}), "
                             f"got {layer!r}")

    def _check_kv(self, k, v, positions, op):
        from .ops.attention import _check_positions
        for n, t, d in (("k", k, self.head_dim), ("v", v, self.value_dim)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{op}: {n} must be a Tensor, got {type(t).__name__}")
            if t.ndim != 4 or t.shape[0] != self.batch or t.shape[1] != self.num_kv_heads \
                    or t.shape[3] != d:
                raise ValueError(f"{op}: {n} must have shape ({self.batch}, "
                                 f"{self.num_kv_heads}, T, {d}), got {tuple(t.shape)}")
            if t.dtype != self.dtype or t.device != self.device:
                raise ValueError(f"{op}: {n} must be {self.dtype.name} on {self.device}, got "
                                 f"{t.dtype.name} on {t.device}")
        T = k.shape[2]
        if v.shape[2] != T:
            raise ValueError(f"{op}: k has {T} tokens but v has {v.shape[2]}")
        return _check_positions(positions, self.batch, T, self.device, op)

    def append(self, layer, k, v, positions):
        """Write k, v (B, Hk, T, D) at slots positions ((T,) or (B, T), on the device)."""
        self._check_layer(layer)
        pos = self._check_kv(k, v, positions, "KVCache.append")
        if k.shape[2]:
            ck, cv, lengths = self.view(layer)
            impl("kv_append", self.device)(ck, cv, lengths, k, v, pos)

    def append_rope(self, layer, q, k, v, positions, *, theta=10000.0, interleaved=False,
                    scaling=None):
        """RoPE on q (in place; (B, Hq, T, D)) and on k as it is written; returns q."""
        from .ops.attention import _check_float, _inv_freq_tensor
        op = "KVCache.append_rope"
        self._check_layer(layer)
        pos = self._check_kv(k, v, positions, op)
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
