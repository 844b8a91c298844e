"""nbxtensor.plans: the one bounded, registered LRU of the per-call fast paths, and the rule
that every per-call cache of the package is one of them (an AST walk over src/)."""
from __future__ import annotations

import ast
import pathlib
import threading
import uuid

import pytest

from nbxtensor import plans


def _name(what):
    return f"test.{what}.{uuid.uuid4().hex[:8]}"   # the registry is process-wide


@pytest.fixture
def fresh():
    """Names registered by a test are dropped after it (the registry refuses duplicates)."""
    made = []
    yield lambda what: made.append(_name(what)) or made[-1]
    for n in made:
        plans._REGISTRY.pop(n, None)


# ---------------------------------------------------------------------------- PlanCache
def test_lru_order_and_bound(fresh):
    c = plans.PlanCache(fresh("lru"), 3)
    for k in "abc":
        c.put(k, k.upper())
    assert c.get("a") == "A"            # a becomes the most recent: b is now the oldest
    c.put("d", "D")
    assert "b" not in c and c.keys() == ["c", "a", "d"]
    assert c.get("b") is None and c.get("b", 7) == 7
    c.put("c", "C2")                    # re-putting refreshes the entry and its recency
    c.put("e", "E")
    assert c.keys() == ["d", "c", "e"] and c.get("c") == "C2"
    assert len(c) == 3 and c.maxsize == 3
    for i in range(100):
        c.put(i, i)
    assert len(c) == 3 and c.keys() == [97, 98, 99]


def test_get_counts_misses_pop_clear(fresh):
    c = plans.PlanCache(fresh("misc"), 8)
    c.get("x")
    c.get("y")
    c.put("x", 1)
    assert c.get("x") == 1
    assert c.info() == {"hits": None, "misses": 2, "size": 1, "maxsize": 8}
    assert c.pop("x") == 1 and c.pop("x", "gone") == "gone"
    c.put("z", None)                    # a None plan is stored, but reads as a miss
    assert "z" in c and c.get("z", 5) is None
    c.clear()
    assert len(c) == 0 and c.values() == []


def test_plan_cache_refuses_bad_sizes_and_names(fresh):
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="maxsize"):
            plans.PlanCache(fresh("size"), bad)
    with pytest.raises(ValueError, match="name"):
        plans.PlanCache("", 4)
    name = fresh("dup")
    plans.PlanCache(name, 4)
    with pytest.raises(ValueError, match="already registered"):
        plans.PlanCache(name, 4)
    with pytest.raises(ValueError, match="already registered"):
        plans.memoize(name)(lambda x: x)


# ---------------------------------------------------------------------------- memoize
def test_memoize_caches_results_not_exceptions(fresh):
    calls = []

    @plans.memoize(fresh("memo"), 2)
    def infer(n):
        calls.append(n)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return n * 10

    assert infer(1) == 10 and infer(1) == 10 and calls == [1]
    for _ in range(2):                  # a refused call is refused again by the full inference
        with pytest.raises(ValueError, match="got -1"):
            infer(-1)
    assert calls == [1, -1, -1]
    infer(2)
    infer(3)                            # maxsize 2: 1 (least recent) is dropped
    infer(1)
    assert calls == [1, -1, -1, 2, 3, 1]
    name = [n for n, c in plans.registry().items() if getattr(c, "fn", None) is infer][0]
    info = plans.stats()[name]
    assert info["size"] == 2 and info["maxsize"] == 2 and info["hits"] == 1


# ---------------------------------------------------------------------------- registry
def test_clear_all_empties_every_kind(fresh):
    c = plans.PlanCache(fresh("c"), 4)
    c.put(1, 1)

    @plans.memoize(fresh("m"))
    def f(x):
        return x
    f(1)
    t = plans.PerThread(fresh("t"), 4)
    t.local().put(1, 1)
    p = plans.PerThread(fresh("p"), plain=True)
    p.local()["k"] = 1
    names = {c.name, t.name, p.name}
    assert names <= set(plans.registry())
    plans.clear_all()
    assert len(c) == 0 and len(t) == 0 and len(p) == 0
    assert plans.stats()[c.name]["size"] == 0
    assert all(plans.stats()[n]["size"] == 0 for n in plans.registry())


def test_per_thread_caches_are_separate_and_cleared_together(fresh):
    t = plans.PerThread(fresh("threads"), 4)
    mine = t.local()
    assert t.local() is mine
    mine.put("k", "main")
    seen = []

    def worker():
        other = t.local()
        seen.append((other is not mine, other.get("k")))
        other.put("k", "worker")
        barrier.wait()          # both threads' caches are live here
        barrier.wait()          # main cleared them all
        seen.append(len(other))
    barrier = threading.Barrier(2)
    th = threading.Thread(target=worker)
    th.start()
    barrier.wait()
    assert len(t) == 2
    t.clear()
    barrier.wait()
    th.join()
    assert seen == [(True, None), 0] and len(mine) == 0 and t.local() is mine


def test_kind_names_what_a_plan_reads():
    import nbxtensor as nbx
    x = nbx.zeros((2, 3))[:, 1:]
    assert plans.kind(x) == (x._dtype, (2, 2), (3, 1), x._storage.device)
    assert plans.kinds(x, None, x) == (*plans.kind(x), None, *plans.kind(x))


# ---------------------------------------------------------------------------- the rule
ROOT = pathlib.Path(__file__).resolve().parents[2] / "src" / "nbxtensor"

# Module-level dicts (and functools caches) that are not per-call plan caches, by
# (module path, name): each with why it stays a plain table.
NOT_CACHES = {
    ("config.py", "_values"): "the parsed switches: one entry per declared switch",
    ("dtypes.py", "_BY_NAME"): "the dtype table's name index, built at import",
    ("dispatch.py", "_IMPLS"): "the op registry: written by @register, bounded by the op set",
    ("dispatch.py", "_BY_DEVTYPE"): "impl()'s (op, device type) index over _IMPLS: bounded by "
                                    "ops x device types, cleared by register()",
    ("declarations.py", "OPS"): "the element-wise declarations, in order",
    ("declarations.py", "REDUCTIONS"): "the reduction declarations, in order",
    ("ops/elementwise.py", "SUPPORTED_DTYPES"): "the dtypes of each declared entry (docs/ops.md)",
    ("ops/elementwise.py", "_BOOL_ERRORS"): "the bool refusal of each declared entry",
    ("backends/cpu/reduction.py", "_DECLARED"): "the NumPy expression of each declared reduction",
    ("creation.py", "IMPORTERS"): "the registered array importers",
    ("ops/elementwise.py", "_GENERATED"): "the generated functions of each declaration",
    ("ops/elementwise.py", "_METHODS"): "the Tensor attributes installed per declaration",
    ("kernels/elementwise.py", "_DECLARED"): "the Triton expression of each declaration",
    ("ops/sampling.py", "_DEFAULT"): "the default Generator per device: state, not a plan "
                                     "(dropping it would restart the random stream)",
    ("kernels/indexing.py", "_FLAGS"): "each device's out-of-range flag, read at every check",
    ("kernels/indexing.py", "_TAG_OF"): "interned error tags: a tag on a device flag must keep "
                                        "naming its error (bounded at _MAX_TAGS, never evicted)",
    ("kernels/decode_attention.py", "_COUNTERS"): "one ticket-counter buffer per (kind, device) "
                                                  "that captured graphs keep using",
    ("kernels/_common.py", "_CUDA"): "hardware facts per cuda device, from the driver",
    ("backends/cuda/driver.py", "_fns"): "the declared ctypes functions",
    ("backends/cuda/driver.py", "_raw"): "the raw (argtypes-free) entry points",
    ("backends/cuda/driver.py", "_props_cache"): "device properties per device",
    ("backends/cuda/driver.py", "_primary"): "retained primary contexts per device",
    ("backends/cuda/driver.py", "_capturing"): "streams capturing a graph now",
    ("backends/cuda/storage.py", "_launch_tokens"): "the launch mark per device",
    ("backends/cuda/memory.py", "_allocators"): "the caching allocator per device",
    ("backends/cuda/storage.py", "_rings"): "the pinned staging ring per device (pinned "
                                            "buffers kept for the process)",
    ("backends/cuda/graphs.py", "_side_streams"): "the capture side stream per device",
    ("backends/cuda/graphs.py", "_pool_handles"): "live graph pools by id: weak references "
                                                  "that drop with the pool",
    ("backends/cuda/launcher.py", "_devinfo"): "compute capability and shared limits per device",
    ("backends/cuda/launcher.py", "_modules"): "loaded CUmodules: loaded once, never unloaded "
                                              "(evicting one would unload a kernel in use)",
    ("backends/cuda/launcher.py", "_verified"): "storages checked per device: weak references "
                                               "that drop with the storage",
    ("backends/cuda/launcher.py", "_scratch"): "Triton's global scratch block per device",
    ("backends/cuda/aot.py", "_src_hashes"): "source-file hashes (one per kernel file)",
    ("backends/cuda/aot.py", "_fn_hashes"): "function source hashes (one per kernel function)",
    ("backends/cuda/aot.py", "_deps"): "what each kernel is built from (one per kernel)",
    ("backends/cuda/aot.py", "_archives"): "the kernel archive per compute capability",
    ("backends/cuda/streams.py", "default_streams"): "the default stream per device",
    ("backends/cuda/streams.py", "current_streams"): "the current stream per device",
    ("backends/cuda/streams.py", "current_cstreams"): "the current CUstream per device, read "
                                                      "by the launcher",
    ("distributed/nccl.py", "_fns"): "the declared libnccl functions",
    ("autotune/__init__.py", "_tables"): "the loaded tuning tables (user, shipped per arch)",
    ("autotune/__init__.py", "_idents"): "device name and arch per device",
    ("autotune/space.py", "TUNABLES"): "the tunable kernels' declarations",
    ("autotune/sweep.py", "CASES"): "the sweep's case declarations",
}

# Per-call caches not moved onto plans yet, with their owner: the list only shrinks (the
# test fails on an entry that is gone).
KNOWN_CACHES = {
    ("tensor.py", "_CONTIG"): "shape -> contiguous strides on every allocation (tensor.py)",
    ("audio.py", "lru_cache"): "mel filter banks (audio.py)",
    ("models/ocr.py", "lru_cache"): "OCR tables (models/ocr.py)",
    ("autotune/__init__.py", "_memo"): "autotune picks, cleared by reload() (autotune)",
    ("autotune/sweep.py", "_PC_CASE"): "sweep cases (autotune/sweep.py)",
}


def _module_caches():
    """(module path, name) of every module-level dict / OrderedDict assignment and every
    functools.lru_cache / functools.cache decorator (as 'lru_cache') outside plans.py."""
    found = set()
    for p in sorted(ROOT.rglob("*.py")):
        rel = str(p.relative_to(ROOT))
        if rel == "plans.py":
            continue
        tree = ast.parse(p.read_text(), str(p))
        for node in tree.body:
            targets, value = [], None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            if _is_dict(value):
                found |= {(rel, t.id) for t in targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for d in node.decorator_list:
                    f = d.func if isinstance(d, ast.Call) else d
                    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                    if name in ("lru_cache", "cache"):
                        found.add((rel, "lru_cache"))
    return found


def _is_dict(v) -> bool:
    if isinstance(v, ast.Dict):
        return not v.keys      # an empty literal: filled at run time (a table is written out)
    if isinstance(v, ast.Call):
        f = v.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        return name in ("dict", "OrderedDict", "WeakKeyDictionary", "WeakValueDictionary") \
            and not v.args and not v.keywords
    return False


def test_every_per_call_cache_is_a_registered_plan_cache():
    found = _module_caches()
    new = sorted(found - set(NOT_CACHES) - set(KNOWN_CACHES))
    assert new == [], ("module-level caches outside nbxtensor.plans (make each a "
                       "plans.PlanCache / plans.memoize, or list a table that is no cache in "
                       f"NOT_CACHES with its reason): {new}")


def test_listed_caches_still_exist():
    found = _module_caches()
    gone = sorted((set(NOT_CACHES) | set(KNOWN_CACHES)) - found)
    assert gone == [], f"these are gone: remove them from NOT_CACHES / KNOWN_CACHES: {gone}"


def test_registered_names_follow_their_modules():
    import nbxtensor.backends.interp.runner  # noqa: F401 - imported by the first interp launch
    import nbxtensor.dispatch as d
    d._load("triton")
    d._load("numpy")
    names = set(plans.registry())
    for want in ("ops.indexing.gather", "ops.shape.cat", "ops.shape.flip", "ops.linalg.linear",
                 "ops.nn.softmax", "ops.attention.rope_inv_freq", "ops.resample.tables",
                 "kernels.indexing.gather", "kernels.gemv", "kernels.gemv.workspaces",
                 "kernels.shape.cat", "kernels.shape.replay", "kernels.softmax.row_config",
                 "kernels.fft.tables", "launcher.entries", "launcher.fast",
                 "launcher.signatures", "interp.functions"):
        assert want in names


def test_eviction_drops_the_least_recently_used_in_a_batch(fresh):
    c = plans.PlanCache(fresh("batch"), 16)       # overflow evicts max(1, 16 // 8) = 2
    for i in range(16):
        c.put(i, i)
    for i in (0, 1, 2, 3):
        assert c.get(i) == i                      # 4 and 5 are now the least recently used
    c.put("new", 0)
    assert len(c) == 15 and 4 not in c and 5 not in c
    assert all(i in c for i in (0, 1, 2, 3, 6, "new"))
    assert c.keys()[:2] == [6, 7] and c.keys()[-5:] == [0, 1, 2, 3, "new"]
    for i in range(100):
        c.put(("more", i), i)
        assert len(c) <= 16
    assert c.keys()[-1] == ("more", 99)
