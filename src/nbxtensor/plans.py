"""The one cache primitive of the per-call fast paths: bounded LRU maps of plans, registered.

An op's full path validates its operands and infers a plan (result shape and dtype, strides,
launch grid, which kernel); the fast path is that plan looked up by the operands' kinds, so
repeated calls skip the inference. Every such cache in the package is a `PlanCache` made
here, with a name, in one registry:

- `PlanCache(name, maxsize)`: `get(key)` (None on a miss; a hit becomes most recent) and
  `put(key, plan)` (evicts the least recently used entry beyond `maxsize`). For plans
  recorded by a full path that needs the tensors themselves (a prepared launch bound to
  the call's output), and for pools keyed by what they hold (gemv's split-K workspaces).
- `memoize(name, maxsize)`: decorates a pure `infer(*kinds) -> plan` (functools.lru_cache:
  the key is the arguments, so no key is written by hand). Exceptions are not cached, so a
  refused call is refused again by the full inference.
- `clear_all()` empties every cache (tests, `nbx.cuda.empty_cache()` of plans that hold
  device memory); `registry()` names them; `stats()` reports hits (memoize only: a
  PlanCache hit costs one C call and is not counted), misses and sizes.
- `kind(t)`: what a plan may read of a tensor operand -- (dtype, shape, strides, device);
  `kinds(*ts)` the same for several, None standing for an absent optional operand.

A plan is valid for as long as what its key names is unchanged; a cache whose plans depend
on something outside the key (a switch, a tuning table) is cleared through `clear_all()` or
its own `clear()` where that something changes.
"""
from __future__ import annotations

import functools
import heapq
import itertools
import threading
import weakref

__all__ = ["PlanCache", "PerThread", "memoize", "clear_all", "registry", "stats", "kind",
           "kinds"]

_REGISTRY: dict[str, object] = {}


def _register(name: str, cache) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"plans: name must be a non-empty str, got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"plans: a cache named {name!r} is already registered")
    _REGISTRY[name] = cache


def _check_size(name, maxsize):
    if not isinstance(maxsize, int) or isinstance(maxsize, bool) or maxsize < 1:
        raise ValueError(f"plans: {name}: maxsize must be an int >= 1, got {maxsize!r}")


class PlanCache:
    """A bounded least-recently-used map of plans, registered under `name`.

    An entry is [last use, plan] in a plain dict, so a hit hashes its key once (a plan key
    holds devices and dtypes, whose hashes are not free) and stamps the entry from a counter.
    When a put overflows `maxsize`, the least recently used entries go: the oldest eighth at
    once (at least the overflow), so eviction sorts once per many inserts, not per insert."""

    __slots__ = ("name", "maxsize", "_d", "_tick", "_batch", "misses", "__weakref__")

    def __init__(self, name: str, maxsize: int = 4096, *, _registered: bool = True):
        _check_size(name, maxsize)
        self.name, self.maxsize = name, maxsize
        self._d: dict = {}
        self._tick = itertools.count().__next__
        self._batch = max(1, maxsize // 8)
        self.misses = 0
        if _registered:
            _register(name, self)

    def get(self, key, default=None):
        # a hit is not counted: it costs one dict lookup and the stamp
        e = self._d.get(key)
        if e is None:
            self.misses += 1
            return default
        e[0] = self._tick()
        return e[1]

    def put(self, key, plan) -> None:
        d = self._d
        d[key] = [self._tick(), plan]
        if len(d) > self.maxsize:
            self._evict()

    def _evict(self) -> None:
        d = self._d
        over = len(d) - self.maxsize
        if over <= 0:
            return
        # (a snapshot: another thread may insert meanwhile; a key it re-put survives)
        for k, e in heapq.nsmallest(max(over, self._batch), list(d.items()), key=_stamp):
            if d.get(k) is e:
                del d[k]

    def pop(self, key, default=None):
        e = self._d.pop(key, None)
        return default if e is None else e[1]

    def clear(self) -> None:
        self._d.clear()

    def _by_age(self) -> list:
        return sorted(list(self._d.items()), key=_stamp)

    def keys(self) -> list:
        """The keys, least recently used first."""
        return [k for k, _ in self._by_age()]

    def values(self) -> list:
        """The plans, least recently used first."""
        return [e[1] for _, e in self._by_age()]

    def __contains__(self, key) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def info(self) -> dict:
        return {"hits": None, "misses": self.misses, "size": len(self._d),
                "maxsize": self.maxsize}

    def __repr__(self) -> str:
        return f"PlanCache({self.name!r}, {len(self._d)}/{self.maxsize})"


def _stamp(item):
    return item[1][0]


class PerThread:
    """One registered name over a plan cache per thread, for plans that hold per-thread state
    (the cuda launcher's prepared entries own a parameter buffer that each launch rewrites).
    `local()` is the calling thread's cache, made on first use: a PlanCache(name, maxsize),
    or with `plain=True` a dict for a structure its user bounds by construction (the
    launcher's fast-launcher records: one per kernel, bounded variants each); `clear()`
    empties every live thread's (in place, so a reference a thread keeps stays valid)."""

    __slots__ = ("name", "maxsize", "_plain", "_tls", "_all", "_lock")

    def __init__(self, name: str, maxsize: int = 4096, *, plain: bool = False):
        _check_size(name, maxsize)
        self.name, self.maxsize, self._plain = name, maxsize, plain
        self._tls = threading.local()
        self._all: list = []        # weak references to every thread's cache
        self._lock = threading.Lock()
        _register(name, self)

    def local(self):
        try:
            return self._tls.cache
        except AttributeError:
            pass
        c = _Map() if self._plain else PlanCache(self.name, self.maxsize, _registered=False)
        self._tls.cache = c
        with self._lock:    # a dead thread's cache dies with its thread-local storage
            self._all = [r for r in self._all if r() is not None]
            self._all.append(weakref.ref(c))
        return c

    def _live(self):
        return [c for c in (r() for r in list(self._all)) if c is not None]

    def clear(self) -> None:
        for c in self._live():
            c.clear()

    def __len__(self) -> int:
        return sum(len(c) for c in self._live())

    def info(self) -> dict:
        return {"hits": None, "misses": sum(getattr(c, "misses", 0) for c in self._live()),
                "size": len(self), "maxsize": self.maxsize}

    def __repr__(self) -> str:
        return f"PerThread({self.name!r}, {len(self)} in {len(self._live())} threads)"


class _Map(dict):
    """A dict that takes weak references (PerThread keeps every thread's weakly)."""

    __slots__ = ("__weakref__",)


class _Memoized:
    """functools.lru_cache over a pure inference, with the registry's interface."""

    __slots__ = ("name", "fn")

    def __init__(self, name, fn):
        self.name, self.fn = name, fn

    def __call__(self, *args):
        return self.fn(*args)

    def clear(self) -> None:
        self.fn.cache_clear()

    def __len__(self) -> int:
        return self.fn.cache_info().currsize

    def info(self) -> dict:
        i = self.fn.cache_info()
        return {"hits": i.hits, "misses": i.misses, "size": i.currsize, "maxsize": i.maxsize}

    def __repr__(self) -> str:
        return f"memoize({self.name!r}, {len(self)}/{self.fn.cache_info().maxsize})"


def memoize(name: str, maxsize: int = 4096):
    """Decorator: memoise a pure `infer(*hashable kinds) -> plan` in a registered LRU.

    The decorated name is the lru_cache wrapper itself (a C call on a hit); the registry
    holds a handle for clear_all() and stats()."""
    _check_size(name, maxsize)

    def deco(fn):
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        _register(name, _Memoized(name, cached))
        return cached
    return deco


def kind(t) -> tuple:
    """(dtype, shape, strides, device) of a Tensor: everything of an operand a plan reads
    besides its storage and offset, which stay per call."""
    return (t._dtype, t._shape, t._stride, t._storage.device)


def kinds(*ts) -> tuple:
    """kind() of each operand, flattened; None for None (an absent optional operand)."""
    out = ()
    for t in ts:
        out += (None,) if t is None else (t._dtype, t._shape, t._stride, t._storage.device)
    return out


def clear_all() -> None:
    """Empty every registered plan cache."""
    for cache in _REGISTRY.values():
        cache.clear()


def registry() -> dict:
    """name -> cache (PlanCache, or the handle of a memoize'd inference)."""
    return dict(_REGISTRY)


def stats() -> dict:
    """name -> {"hits", "misses", "size", "maxsize"}."""
    return {name: cache.info() for name, cache in _REGISTRY.items()}
