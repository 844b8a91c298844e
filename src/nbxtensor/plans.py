"""The one cache primitive of the per-call fast paths: bounded LRU maps of plans, registered.

An op's full path validates its operands and infers a plan (result shape and dtype, strides,
launch grid, which kernel); the fast path is that plan looked up by the operands' kinds, so
repeated calls skip the inference. Every such cache in the package is a `PlanCache` made
here, with a name, in one registry:

- `PlanCache(name, maxsize)`: `get(key)` (None on a miss; a hit becomes most recent) and
  `put(key, plan)` (evicts the least recently used entry beyond `maxsize`). For plans
  recorded by a full path that needs the tensors themselves.
- `memoize(name, maxsize)`: decorates a pure `infer(*kinds) -> plan` (functools.lru_cache:
  the key is the arguments, so no key is written by hand). Exceptions are not cached, so a
  refused call is refused again by the full inference.
- `clear_all()` empties every cache (tests, `nbx.cuda.empty_cache()` of plans that hold
  device memory); `registry()` names them; `stats()` reports hits, misses and sizes.

A plan is valid for as long as what its key names is unchanged; a cache whose plans depend
on something outside the key (a switch, a tuning table) is cleared through `clear_all()` or
its own `clear()` where that something changes.
"""
from __future__ import annotations

import functools
from collections import OrderedDict

__all__ = ["PlanCache", "memoize", "clear_all", "registry", "stats"]

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
    """A bounded least-recently-used map of plans, registered under `name`."""

    __slots__ = ("name", "maxsize", "_d", "hits", "misses")

    def __init__(self, name: str, maxsize: int = 4096):
        _check_size(name, maxsize)
        self.name, self.maxsize = name, maxsize
        self._d: OrderedDict = OrderedDict()
        self.hits = self.misses = 0
        _register(name, self)

    def get(self, key, default=None):
        d = self._d
        plan = d.get(key, self)
        if plan is self:
            self.misses += 1
            return default
        d.move_to_end(key)
        self.hits += 1
        return plan

    def put(self, key, plan) -> None:
        d = self._d
        d[key] = plan
        d.move_to_end(key)
        if len(d) > self.maxsize:
            d.popitem(last=False)

    def pop(self, key, default=None):
        return self._d.pop(key, default)

    def clear(self) -> None:
        self._d.clear()

    def values(self):
        return list(self._d.values())

    def __contains__(self, key) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def info(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "size": len(self._d),
                "maxsize": self.maxsize}

    def __repr__(self) -> str:
        return f"PlanCache({self.name!r}, {len(self._d)}/{self.maxsize})"


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
