"""Autotuning that cannot pick a wrong kernel.

    from nbxtensor import autotune
    cfg = autotune.pick("matmul", (M, N, K), default_cfg, dtype="bfloat16", device=a.device)

`pick` is the one seam between kernels and tuning: it returns the user cache's entry for
the (bucketed) key, else the shipped table's (tables/sm90.json), else the nearest entry of
either (space.py's rules), else `default_config` -- and only an entry whose config is
inside today's declared space and applies to this key. Lookups are memoised, so the cost
on a launch is one dict lookup (~2 us with the copy). NBX_AUTOTUNE=0 (read when the
tables load, i.e. at the first pick or after `reload()`) or `with autotune.disabled():` make
it return the default always. NBX_NO_SHIPPED_TABLE=1 (read at the same moments) ignores the
shipped tables only: an empty-table start, with the user cache still applied.

Sweeps (`tune`, `nbx tune`) live in sweep.py; the screen in screen.py; timing in timing.py;
the cache files in cache.py. Importing this package does not import triton.
"""
from __future__ import annotations

import contextlib
from .. import config as _config
import threading

from . import cache as _cache
from .space import TUNABLES, Tunable, get_tunable, register_tunable, unregister_tunable

__all__ = ["pick", "lookup", "disabled", "reload", "device_identity", "tune", "Tunable",
           "register_tunable", "unregister_tunable", "get_tunable", "TUNABLES"]

_lock = threading.Lock()
_memo: dict = {}
_tables: dict = {}          # "user" -> Table, cc -> shipped Table
_idents: dict = {}
_off = 0
generation = 0      # bumped by reload(): callers caching a pick's result key on it


def device_identity(device) -> tuple[str, str] | None:
    """(device name, compute capability) for cache keys; ('interp', 'interp') on interp;
    None on cpu (nothing to tune)."""
    t = device.type
    if t == "cpu":
        return None
    if t == "interp":
        return ("interp", "interp")
    idx = device.index or 0
    ident = _idents.get(idx)
    if ident is None:
        from ..backends.cuda import streams
        major, minor = streams.get_device_capability(idx)
        ident = _idents[idx] = (streams.get_device_name(idx), f"sm_{major}{minor}")
    return ident


def _user():
    t = _tables.get("user")
    if t is None:
        t = _tables["user"] = _cache.load_user()
    return t


def _shipped(cc: str):
    t = _tables.get(cc)
    if t is None:
        t = _tables[cc] = _cache.load_shipped(cc)
    return t


def reload() -> None:
    """Forget loaded tables and memoised picks (after the cache file or env changed)."""
    global generation
    with _lock:
        generation += 1
        _memo.clear()
        _tables.clear()
        _config.refresh()


def _usable(t: Tunable, e: dict, dtype: str, key: tuple, sms: int) -> bool:
    cfg = e.get("config")
    return isinstance(cfg, dict) and t.contains(cfg, dtype, sms) and (
        t.applies is None or t.applies(cfg, key))


def lookup(kernel_name: str, key: tuple, *, dtype: str, device):
    """(config, source) where source says where the config came from -- 'user cache',
    'shipped table sm90.json', '... (near M=...)' -- or (None, reason) when nothing usable."""
    t = TUNABLES.get(kernel_name)
    if t is None:
        return None, f"no tunable kernel {kernel_name!r}"
    ident = device_identity(device)
    if ident is None:
        return None, f"nothing is tuned on {device}"
    from ..kernels._common import device_facts    # the space in waves of this device's SMs
    sms = device_facts(device).sms
    tv = _cache.triton_version()
    bkey = t.bucket(key)
    tables = [_user(), _shipped(ident[1])]
    for tab in tables:
        e = tab.get(ident, tv, kernel_name, bkey, dtype)
        if e is not None and _usable(t, e, dtype, key, sms):
            return dict(e["config"]), tab.source
    if t.near is not None:
        best = None
        for rank, tab in enumerate(tables):
            for e in tab.group(ident, tv, kernel_name, dtype):
                d = t.near(bkey, tuple(e["key"]))
                if d is not None and _usable(t, e, dtype, key, sms) and (
                        best is None or (d, rank) < best[:2]):
                    best = (d, rank, e, tab)
        if best is not None:
            return dict(best[2]["config"]), f"{best[3].source} (near key {tuple(best[2]['key'])})"
    return None, "no entry"


def pick(kernel_name: str, key: tuple, default_config: dict, *, dtype: str, device) -> dict:
    """The config to launch `kernel_name` with for shape `key` (raw, unbucketed): the tuned
    one if the cache or the shipped table has a usable entry, else `default_config`.
    Always a fresh dict (callers may add derived keys): the tuned config is laid over a copy
    of the default, so keys the space does not tune keep their default values."""
    if _off:
        return dict(default_config)
    mk = (kernel_name, key, dtype, device)
    hit = _memo.get(mk)
    if hit is None:
        with _lock:
            if not _config.get("NBX_AUTOTUNE"):
                cfg = None
            else:
                cfg, _ = lookup(kernel_name, key, dtype=dtype, device=device)
            hit = _memo[mk] = cfg if cfg is not None else False
    if hit is False:
        return dict(default_config)
    return {**default_config, **hit}


@contextlib.contextmanager
def disabled():
    """Within: `pick` returns the default config (untuned baselines, sweeps)."""
    global _off
    _off += 1
    try:
        yield
    finally:
        _off -= 1


def tune(kernel_name: str, key: tuple, *, dtype, device, **kw):
    """Sweep one key (see sweep.tune)."""
    from .sweep import tune as _tune
    return _tune(kernel_name, key, dtype=dtype, device=device, **kw)
