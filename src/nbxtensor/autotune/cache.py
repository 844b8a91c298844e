"""The persisted autotune cache and the shipped tables.

One JSON file per user: $NBX_CACHE_DIR/autotune.json, else ~/.cache/nbxtensor/autotune.json.
An entry is stored per (device name, compute capability, Triton version, kernel, shape
key, dtype) -- the shape key already bucketed (space.py) -- and records the chosen config,
how it was screened (reference, rows compared, tolerance, worst deviation, the candidates
excluded and why) and its timing against the default config.

The shipped table (tables/sm<cc>.json, generated on an H200 by scripts/make_sm90_table.py)
is the fallback below the user cache. It matches on compute capability and Triton version
only (any sm_90 card), since the configs in it are correct on any of them; speed may differ.
A changed Triton version ignores both: a different compiler was not screened.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

from .. import config as _config

FORMAT = 1
TABLE_DIR = os.path.join(os.path.dirname(__file__), "tables")


def cache_path() -> str:
    d = _config.get("NBX_CACHE_DIR")
    if not d:
        d = os.path.join(os.path.expanduser("~"), ".cache", "nbxtensor")
    return os.path.join(d, "autotune.json")


def triton_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from ..backends.cuda import aot
    built = aot.kernels_built_with()     # kernels from the archive only: the Triton that built them
    if built is not None:
        return built
    try:
        return version("triton")      # metadata only: does not import triton
    except PackageNotFoundError:
        return "none"


def entry_key(e: dict, *, with_name: bool = True) -> tuple:
    k = (e["cc"], e["triton"], e["kernel"], tuple(int(v) for v in e["key"]), e["dtype"])
    return ((e["device"],) + k) if with_name else k


def _read(path: str) -> list[dict]:
    """The entries of a cache/table file; a missing file is empty, a broken one is refused
    loudly (a silently empty cache would hide the problem), and so is a FIFO or device in
    its place (opening one would block forever)."""
    from ..files import regular_file
    if regular_file(path, "autotune cache", missing_ok=True) is None:
        return []
    with open(path, encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except (ValueError, RecursionError) as err:    # bad JSON, bad UTF-8, too deep
            raise ValueError(f"autotune cache {path} is not valid JSON ({err}); fix it or run "
                             f"`nbx tune --clear`") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(
            doc.get("entries"), list):
        raise ValueError(f"autotune cache {path}: expected {{'format': {FORMAT}, 'entries': [...]}}, "
                         f"got format {doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r}; "
                         f"run `nbx tune --clear`")
    good = []
    for e in doc["entries"]:
        try:
            entry_key(e)
            if isinstance(e.get("config"), dict):
                good.append(e)
        except (KeyError, TypeError, ValueError):
            continue           # an entry of another shape: skip it, keep the rest
    return good


class Table:
    """Entries indexed for lookup: exact (bucketed) keys, and per (kernel, dtype) for `near`."""

    def __init__(self, entries: list[dict], *, with_name: bool, source: str):
        self.source = source
        self.with_name = with_name
        self.entries = list(entries)
        self.exact = {}
        self.groups = {}
        for e in self.entries:
            k = entry_key(e, with_name=with_name)
            self.exact[k] = e       # a later entry for the same key wins
            self.groups.setdefault(k[:-2] + (k[-1],), []).append(e)

    def get(self, ident, triton, kernel, bkey, dtype):
        name, cc = ident
        k = (cc, triton, kernel, bkey, dtype)
        return self.exact.get(((name,) + k) if self.with_name else k)

    def group(self, ident, triton, kernel, dtype) -> list[dict]:
        name, cc = ident
        k = (cc, triton, kernel, dtype)
        return self.groups.get(((name,) + k) if self.with_name else k, [])


def load_user(path: str | None = None) -> Table:
    return Table(_read(path or cache_path()), with_name=True, source="user cache")


def shipped_disabled() -> bool:
    """NBX_NO_SHIPPED_TABLE=1: ignore the packaged tables (an 'empty table' start, e.g. to
    measure what they save); the user cache still applies."""
    return _config.get("NBX_NO_SHIPPED_TABLE")


def load_shipped(cc: str) -> Table:
    p = os.path.join(TABLE_DIR, f"{cc.replace('_', '')}.json")
    if shipped_disabled():
        return Table([], with_name=False, source="shipped table (disabled: NBX_NO_SHIPPED_TABLE)")
    return Table(_read(p), with_name=False, source=f"shipped table {os.path.basename(p)}")


def usable_in_space(e: dict) -> str | None:
    """None if entry `e` is inside today's declared space for its kernel and applies to its
    key; else why not (the loaders ignore such entries; merges drop them)."""
    from .space import TUNABLES
    t = TUNABLES.get(e.get("kernel"))
    if t is None:
        return f"no tunable kernel {e.get('kernel')!r}"
    cfg = e.get("config")
    if not isinstance(cfg, dict) or not t.contains(cfg, e.get("dtype")):
        return "config outside today's space"
    if t.applies is not None and not t.applies(cfg, tuple(e["key"])):
        return "config does not apply to its key"
    return None


def merge_tables(base: list[dict], new: list[dict]) -> tuple[list[dict], dict]:
    """A shipped table from `base` with `new` laid over it (same cc/Triton/kernel/key/dtype:
    the new entry wins; device names are not part of a shipped key). Entries are kept whole
    (config, screen record, timing); ones outside today's space are dropped and counted.
    Returns (entries, report)."""
    rep = dict(base=len(base), new=len(new), replaced=0, added=0, kept=0, dropped=[])
    out: dict = {}
    origin: dict = {}
    for src, entries in (("base", base), ("new", new)):
        for e in entries:
            why = usable_in_space(e)
            if why is not None:
                rep["dropped"].append(dict(source=src, kernel=e.get("kernel"), key=e.get("key"),
                                           dtype=e.get("dtype"), reason=why))
                continue
            k = entry_key(e, with_name=False)
            if src == "new" and origin.get(k) != "new":   # a later duplicate counts once
                rep["replaced" if k in out else "added"] += 1
            out[k] = dict(e)
            origin[k] = src
    rep["kept"] = sum(1 for v in origin.values() if v == "base")
    return list(out.values()), rep


def _write(path: str, entries: list[dict]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".autotune.", suffix=".json", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)    # atomic: a reader sees the old file or the new one
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def store(entries: list[dict], path: str | None = None) -> str:
    """Merge `entries` into the user cache file (re-read first: another process may have
    written since we loaded); same key -> the new entry replaces the old."""
    path = path or cache_path()
    old = _read(path)
    new_keys = {entry_key(e) for e in entries}
    merged = [e for e in old if entry_key(e) not in new_keys] + [dict(e) for e in entries]
    _write(path, merged)
    return path


def clear(path: str | None = None) -> int:
    """Remove the user cache file; returns how many entries it held."""
    path = path or cache_path()
    n = len(_read(path)) if os.path.exists(path) else 0
    if os.path.exists(path):
        os.unlink(path)
    return n


def make_entry(ident, kernel: str, bkey: tuple, dtype: str, config: dict, screen: dict,
               timing: dict) -> dict:
    name, cc = ident
    return dict(device=name, cc=cc, triton=triton_version(), kernel=kernel,
                key=[int(v) for v in bkey], dtype=dtype, config=dict(config), screen=screen,
                timing=timing, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
