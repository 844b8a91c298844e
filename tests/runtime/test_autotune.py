"""Autotuning: the screen, the cache, bucketing, the kernel seam and `nbx tune` (interp, CI).

A toy tunable (out = 2x + 1) carries deliberately wrong candidates -- one skips the tail,
one writes half the output -- that a fake timer makes the fastest, so the only thing
between them and the cache is the correctness screen.
"""
from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor import autotune
from nbxtensor.autotune import cache, space, sweep
from nbxtensor.autotune.screen import ScreenError, deviation, screen
from nbxtensor.autotune.timing import OverBudget, Timing
from helpers import H200

triton = pytest.importorskip("triton")
tl = triton.language

INTERP = nbx.device("interp")


@pytest.fixture(autouse=True)
def tmp_cache(tmp_path, monkeypatch):
    """Every test gets an empty user cache of its own."""
    monkeypatch.setenv("NBX_CACHE_DIR", str(tmp_path / "nbxcache"))
    monkeypatch.delenv("NBX_AUTOTUNE", raising=False)
    autotune.reload()
    yield tmp_path / "nbxcache" / "autotune.json"
    autotune.reload()


# ------------------------------------------------------------------------- a toy tunable

@triton.jit
def _toy_kernel(x_ptr, o_ptr, total, BLOCK: tl.constexpr, MODE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MODE == 1:      # wrong: skips the last, partial block (the tail)
        lim = (total // BLOCK) * BLOCK
    elif MODE == 2:    # wrong: writes half of the output
        lim = total // 2
    else:
        lim = total
    m = offs < lim
    tl.store(o_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)


GOOD32 = dict(BLOCK=32, MODE=0)
GOOD64 = dict(BLOCK=64, MODE=0)
SKIP_TAIL = dict(BLOCK=64, MODE=1)
HALF = dict(BLOCK=128, MODE=2)
BAD_COMPILE = dict(BLOCK=48, MODE=0)     # tl.arange needs a power of two: a compile error
TOY_SPACE = [GOOD32, GOOD64, SKIP_TAIL, HALF, BAD_COMPILE]
# fake speeds (ms): the wrong ones are the fastest, the compile error would be too
SPEED = {(32, 0): 3.0, (64, 0): 2.0, (64, 1): 1.0, (128, 2): 0.5, (48, 0): 0.1}
LAST = {}


class ToyCase:
    kernel = "toy"

    def __init__(self, key, dtype, device, seed=0):
        self.M, self.N = key
        self.device = device
        self.dtype = nbx.dtypes.as_dtype(dtype)
        g = np.random.default_rng(seed)
        self.x64 = g.standard_normal((self.M, self.N)).astype(self.dtype.np).astype(np.float64)
        self.x = nbx.tensor(self.x64.astype(self.dtype.np), device=device)
        self.out = nbx.empty((self.M, self.N), dtype=self.dtype, device=device)
        self.rows = sweep.row_windows(self.M, 16)   # windows when M > 48
        self.tol_text = "1e-6 relative"

    def describe_key(self):
        return f"toy {self.M}x{self.N}"

    def describe(self):
        return f"rows {self.rows}"

    def candidates(self):
        return [dict(c) for c in TOY_SPACE]

    def default_config(self):
        return dict(GOOD32)

    def reset(self):
        self.out.fill_(float("nan"))

    def run(self, cfg):
        LAST["cfg"] = (cfg["BLOCK"], cfg["MODE"])
        n = self.M * self.N
        nbx.launch(_toy_kernel, (triton.cdiv(n, cfg["BLOCK"]),), self.x, self.out, n, **cfg)

    def run_default(self):
        self.run(self.default_config())

    def result(self):
        o = self.out.numpy().astype(np.float64)
        return np.concatenate([o[a:b] for a, b in self.rows])

    def reference(self):
        x = np.concatenate([self.x64[a:b] for a, b in self.rows])
        return 2 * x + 1, 1e-6 * (np.abs(2 * x) + 1)


class NoRefCase(ToyCase):
    def reference(self):
        return None


class FakeTimer:
    """Deterministic 'speed' from the config that ran last (the case records it)."""

    def measure(self, fn, *, warmup=0, reps=1, budget_ms=None):
        fn()
        ms = SPEED[LAST["cfg"]]
        if budget_ms is not None and ms > budget_ms:
            raise OverBudget(ms, budget_ms)
        return Timing(ms, ms, 1, "fake")


@pytest.fixture
def toy():
    t = space.register_tunable(space.Tunable(
        "toy", lambda dtype: [dict(c) for c in TOY_SPACE], lambda k: tuple(int(v) for v in k)))
    sweep.CASES["toy"] = ToyCase
    yield t
    space.unregister_tunable("toy")
    sweep.CASES.pop("toy", None)


# ------------------------------------------------------------------------------ the screen

@pytest.mark.parametrize("M,N", [(7, 9), (67, 5)])      # whole output; row windows (M > 48)
def test_screen_excludes_wrong_candidates_that_would_be_fastest(toy, M, N):
    e = autotune.tune("toy", (M, N), dtype="float32", device=INTERP, timer=FakeTimer(),
                      run_budget_ms=100.0)
    assert e["config"] == GOOD64             # fastest CORRECT one; the wrong ones were faster
    ex = {(x["config"]["BLOCK"], x["config"]["MODE"]): x for x in e["screen"]["excluded"]}
    assert set(ex) == {(64, 1), (128, 2), (48, 0)}
    for k in [(64, 1), (128, 2)]:
        assert "wrong result" in ex[k]["reason"] and ex[k]["deviation"] == "inf"
    assert "48" in ex[(48, 0)]["reason"] or "arange" in ex[(48, 0)]["reason"].lower()
    assert e["screen"]["reference"] == "float64 host"
    assert e["screen"]["passed"] == 2 and e["screen"]["candidates"] == 5
    if M > 48:
        assert e["screen"]["compared"] == f"rows [(0, 16), ({M // 2 - 8}, {M // 2 + 8}), ({M - 16}, {M})]"
    assert e["timing"]["speedup"] == pytest.approx(3.0 / 2.0)


def test_tail_breakage_is_seen_by_the_last_row_window(toy):
    # 67 x 5 = 335 elements: BLOCK 64 leaves a 15-element tail, inside the last window only
    case = ToyCase((67, 5), "float32", INTERP)
    assert case.rows[-1][1] == 67
    rep = screen(case, [GOOD64, SKIP_TAIL])
    assert rep.passed == [GOOD64]
    assert rep.excluded[0]["config"] == SKIP_TAIL


def test_all_wrong_space_raises(toy):
    with pytest.raises(ScreenError, match="disagreed"):
        autotune.tune("toy", (7, 9), dtype="float32", device=INTERP, timer=FakeTimer(),
                      candidates=[SKIP_TAIL, HALF])
    assert not os.path.exists(cache.cache_path())        # nothing stored


def test_no_candidate_runs_raises(toy):
    with pytest.raises(ScreenError, match="no candidate could run"):
        screen(ToyCase((7, 9), "float32", INTERP), [BAD_COMPILE])


def test_no_reference_is_recorded_not_passed_silently(toy):
    rep = screen(NoRefCase((7, 9), "float32", INTERP), [GOOD32, SKIP_TAIL])
    assert rep.record["reference"].startswith("none")
    assert rep.record["compared"] is None


def test_candidate_over_the_run_budget_is_dropped_and_reported(toy):
    e = autotune.tune("toy", (7, 9), dtype="float32", device=INTERP, timer=FakeTimer(),
                      candidates=[GOOD32, GOOD64], run_budget_ms=2.5)
    assert e["config"] == GOOD64
    dropped = e["timing"]["dropped"]
    assert len(dropped) == 1 and dropped[0]["config"] == GOOD32
    assert "over budget" in dropped[0]["reason"]


def test_deviation_counts_nan_as_infinitely_wrong():
    ref = np.array([1.0, 2.0, np.inf])
    bound = np.array([0.1, 0.1, 0.1])
    assert deviation(np.array([1.0, 2.05, np.inf]), ref, bound) == (pytest.approx(0.5), 0)
    d, bad = deviation(np.array([1.0, np.nan, np.inf]), ref, bound)
    assert d == np.inf and bad == 1
    assert deviation(np.array([1.0, 2.0, -np.inf]), ref, bound)[1] == 1


def test_candidates_outside_the_space_are_refused(toy):
    with pytest.raises(ValueError, match="outside the declared"):
        autotune.tune("toy", (7, 9), dtype="float32", device=INTERP, timer=FakeTimer(),
                      candidates=[dict(BLOCK=16, MODE=0)])


# ------------------------------------------------------------------------------- the cache

def _tuned_toy(toy_key=(7, 9)):
    return autotune.tune("toy", toy_key, dtype="float32", device=INTERP, timer=FakeTimer())


def test_cache_round_trips(toy, tmp_cache):
    e = _tuned_toy()
    doc = json.loads(tmp_cache.read_text())
    assert doc["format"] == cache.FORMAT and len(doc["entries"]) == 1
    stored = doc["entries"][0]
    assert stored["device"] == "interp" and stored["triton"] == triton.__version__
    assert stored["kernel"] == "toy" and stored["key"] == [7, 9] and stored["dtype"] == "float32"
    assert stored["screen"]["excluded"] and stored["config"] == e["config"]
    autotune.reload()                                      # a fresh process: load from disk
    assert autotune.pick("toy", (7, 9), dict(GOOD32), dtype="float32", device=INTERP) == GOOD64
    assert autotune.lookup("toy", (7, 9), dtype="float32", device=INTERP)[1] == "user cache"
    # other dtype, other key: the default
    assert autotune.pick("toy", (7, 9), dict(GOOD32), dtype="float16", device=INTERP) == GOOD32
    assert autotune.pick("toy", (8, 9), dict(GOOD32), dtype="float32", device=INTERP) == GOOD32
    # a second tune of another key keeps the first
    _tuned_toy((9, 9))
    assert len(json.loads(tmp_cache.read_text())["entries"]) == 2


def test_cache_is_keyed_by_triton_version_and_device(toy, tmp_cache, monkeypatch):
    _tuned_toy()
    monkeypatch.setattr(cache, "triton_version", lambda: "9.9.9")
    autotune.reload()
    assert autotune.pick("toy", (7, 9), dict(GOOD32), dtype="float32", device=INTERP) == GOOD32
    monkeypatch.undo()
    monkeypatch.setenv("NBX_CACHE_DIR", str(tmp_cache.parent))
    autotune.reload()
    assert autotune.pick("toy", (7, 9), dict(GOOD32), dtype="float32", device=INTERP) == GOOD64
    # the same entry written for another device does not serve interp, and vice versa
    doc = json.loads(tmp_cache.read_text())
    doc["entries"][0].update(device="NVIDIA H200", cc="sm_90")
    tmp_cache.write_text(json.dumps(doc))
    autotune.reload()
    assert autotune.pick("toy", (7, 9), dict(GOOD32), dtype="float32", device=INTERP) == GOOD32
    monkeypatch.setattr(autotune, "device_identity", lambda d: ("NVIDIA H200", "sm_90"))
    autotune.reload()
    assert autotune.pick("toy", (7, 9), dict(GOOD32), dtype="float32", device=INTERP) == GOOD64


def test_entries_outside_todays_space_are_ignored(toy, tmp_cache):
    _tuned_toy()
    doc = json.loads(tmp_cache.read_text())
    doc["entries"][0]["config"] = dict(BLOCK=256, MODE=0)     # not (or no longer) declared
    tmp_cache.write_text(json.dumps(doc))
    autotune.reload()
    assert autotune.pick("toy", (7, 9), dict(GOOD32), dtype="float32", device=INTERP) == GOOD32
    cfg, why = autotune.lookup("toy", (7, 9), dtype="float32", device=INTERP)
    assert cfg is None


def test_broken_cache_file_is_refused_loudly(tmp_cache):
    tmp_cache.parent.mkdir(parents=True)
    tmp_cache.write_text("{not json")
    with pytest.raises(ValueError, match="nbx tune --clear"):
        cache.load_user()


def test_disabled_returns_the_default(toy, monkeypatch):
    _tuned_toy()
    with autotune.disabled():
        assert autotune.pick("toy", (7, 9), dict(GOOD32), dtype="float32", device=INTERP) == GOOD32
    monkeypatch.setenv("NBX_AUTOTUNE", "0")
    autotune.reload()
    assert autotune.pick("toy", (7, 9), dict(GOOD32), dtype="float32", device=INTERP) == GOOD32
    monkeypatch.delenv("NBX_AUTOTUNE")
    autotune.reload()
    assert autotune.pick("toy", (7, 9), dict(GOOD32), dtype="float32", device=INTERP) == GOOD64
    assert autotune.pick("toy", (7, 9), dict(GOOD32), dtype="float32", device=nbx.device("cpu")) == GOOD32


# -------------------------------------------------------------------------------- bucketing

MM_CFG = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=16, num_warps=4, num_stages=2, GROUP_M=8)
GV1_CFG = dict(BLOCK_M=1, BLOCK_N=16, BLOCK_K=128, num_warps=4, num_stages=4, TARGET=264)
GV16_CFG = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, num_warps=4, num_stages=4, TARGET=264)


def _store(kernel, bkey, cfg, dtype="float32"):
    cache.store([cache.make_entry(("interp", "interp"), kernel, bkey, dtype, cfg, {}, {})])
    autotune.reload()


def test_bucketing_finds_near_entries():
    assert space.get_tunable("matmul").bucket((100, 24, 40)) == (128, 24, 40)
    assert space.get_tunable("gemv").bucket((3, 24, 40)) == (4, 24, 40)
    _store("matmul", (128, 24, 40), MM_CFG)
    look = lambda k: autotune.lookup("matmul", k, dtype="float32", device=INTERP)  # noqa: E731
    assert look((100, 24, 40)) == (MM_CFG, "user cache")                   # same bucket
    assert look((300, 24, 40))[1] == "user cache (near key (128, 24, 40))"  # bucket 512: 2 octaves
    assert look((600, 24, 40))[0] is None                                   # 1024: too far
    assert look((100, 24, 41))[0] is None                                   # K is exact
    assert look((100, 32, 40))[0] is None                                   # N is exact


def test_gemv_near_never_crosses_one_row():
    _store("gemv", (1, 24, 40), GV1_CFG)
    look = lambda k: autotune.lookup("gemv", k, dtype="float32", device=INTERP)  # noqa: E731
    assert look((1, 24, 40))[0] == GV1_CFG
    assert look((2, 24, 40))[0] is None        # a one-row config would drop row 2
    _store("gemv", (4, 24, 40), GV16_CFG)
    assert look((2, 24, 40))[0] == GV16_CFG
    assert look((1, 24, 40))[0] == GV1_CFG
    # a one-row config stored under a many-row key (hand-edited) is not applied
    _store("gemv", (8, 24, 40), GV1_CFG)
    assert look((8, 24, 40))[0] == GV16_CFG    # the exact one is unusable; the near one serves


# -------------------------------------------------- the real kernels: sweep and the seam

def _spy_launch(monkeypatch):
    from nbxtensor.backends import launch as L
    seen = []
    real = L.launch

    def spy(kernel, grid, *args, **kw):
        seen.append((kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel), kw))
        return real(kernel, grid, *args, **kw)
    monkeypatch.setattr(L, "launch", spy)
    return seen


def _linear_ref(x, w):
    return x.numpy().astype(np.float64) @ w.numpy().astype(np.float64).T


def test_matmul_seam_uses_the_cached_config(monkeypatch):
    g = np.random.default_rng()
    x = nbx.tensor(g.standard_normal((33, 40)).astype(np.float32), device="interp")
    w = nbx.tensor(g.standard_normal((24, 40)).astype(np.float32), device="interp")
    seen = _spy_launch(monkeypatch)
    y0 = nbx.linear(x, w)
    assert seen[-1][1]["BLOCK_K"] == 32            # the rule's fp32 config
    _store("matmul", (64, 24, 40), MM_CFG)
    y1 = nbx.linear(x, w)
    assert seen[-1][1]["BLOCK_K"] == 16 and seen[-1][1]["num_stages"] == 2
    for y in (y0, y1):
        np.testing.assert_allclose(y.numpy(), _linear_ref(x, w), rtol=1e-4, atol=1e-4)
    _store("matmul", (64, 24, 40), dict(MM_CFG, BLOCK_M=16))   # outside the space: ignored
    nbx.linear(x, w)
    assert seen[-1][1]["BLOCK_K"] == 32


def test_gemv_seam_uses_the_cached_config(monkeypatch):
    g = np.random.default_rng()
    x = nbx.tensor(g.standard_normal((1, 40)).astype(np.float32), device="interp")
    w = nbx.tensor(g.standard_normal((24, 40)).astype(np.float32), device="interp")
    seen = _spy_launch(monkeypatch)
    nbx.linear(x, w)
    assert seen[-1][1]["BLOCK_N"] == 32
    _store("gemv", (1, 24, 40), GV1_CFG)
    y = nbx.linear(x, w)
    assert [kw["BLOCK_N"] for name, kw in seen if name == "_gemv_kernel"][-1] == 16
    np.testing.assert_allclose(y.numpy(), _linear_ref(x, w), rtol=1e-4, atol=1e-4)


def test_real_matmul_and_gemv_sweeps_on_interp(tmp_cache):
    mm = [MM_CFG, dict(MM_CFG, BLOCK_K=32, num_stages=3)]
    e = autotune.tune("matmul", (65, 24, 40), dtype="float32", device=INTERP, candidates=mm,
                      warmup=0, reps=1)
    assert e["key"] == [128, 24, 40] and e["screen"]["passed"] == 2
    assert e["config"] in mm and e["timing"]["default_ms"] > 0
    gv = [GV1_CFG, dict(GV1_CFG, BLOCK_N=32)]
    e = autotune.tune("gemv", (1, 24, 300), dtype="bfloat16", device=INTERP,
                      candidates=[dict(c, BLOCK_K=128) for c in gv], warmup=0, reps=1)
    assert e["screen"]["passed"] == 2 and e["screen"]["tolerance"].startswith("0.01")
    assert len(json.loads(tmp_cache.read_text())["entries"]) == 2


def test_row_windows_end_at_the_final_row():
    assert sweep.row_windows(100) == [(0, 100)]
    w = sweep.row_windows(4097)
    assert w[0] == (0, 64) and w[-1] == (4097 - 64, 4097) and len(w) == 3


def test_declared_spaces_hold_the_kernel_defaults():
    """The rule's config of each bucket is a candidate, so 'tuned' can never be worse than
    'untuned' for lack of the default in the sweep."""
    from nbxtensor.kernels import gemv as kg
    from nbxtensor.kernels import matmul as km
    for dt in (nbx.bfloat16, nbx.float16, nbx.float32, nbx.float64):
        for M, N in [(17, 64), (100, 4096), (4096, 4096)]:
            assert space.get_tunable("matmul").contains(km.matmul_config(M, N, 4096, dt, H200), dt.name)
    for dt in (nbx.bfloat16, nbx.float32):
        for M in (1, 5, 16):
            cfg = kg.gemv_config(M, 4096, 4096, dt, H200)
            cfg.pop("K_SPLIT")
            assert space.get_tunable("gemv").contains(cfg, dt.name)
            assert cfg in space.gemv_candidates(dt.name, M)


def test_shipped_table_is_inside_the_space():
    path = os.path.join(cache.TABLE_DIR, "sm90.json")
    if not os.path.exists(path):
        pytest.skip("no shipped sm90 table yet (generated on the H200)")
    entries = cache._read(path)
    assert entries, "the shipped table is empty"
    for e in entries:
        t = space.get_tunable(e["kernel"])
        assert t.contains(e["config"], e["dtype"]), e
        assert cache.usable_in_space(e) is None, e          # in the space, applies to its key
        assert e["cc"] == "sm_90" and e["screen"]["reference"] == "float64 host"
        assert tuple(e["key"]) == t.bucket(tuple(e["key"]))


# ------------------------------------------------------------------------------- nbx tune

def test_cli_tune_list_clear_and_shapes(capsys):
    from nbxtensor.cli import main
    from nbxtensor.cli_tune import model_shapes, parse_shapes
    assert parse_shapes("1x4096x4096, 128x14336x4096") == [(1, 4096, 4096), (128, 14336, 4096)]
    for bad in ("1x2", "0x4x4", "ax4x4", ""):
        with pytest.raises(ValueError, match="--shapes"):
            parse_shapes(bad)
    shapes, _ = model_shapes("smollm2", [1, 16])
    assert (1, 576, 576) in shapes and (16, 1536, 576) in shapes and (1, 49152, 576) in shapes
    assert (1, 576, 1536) in shapes and (1, 192, 576) in shapes      # down proj; k/v proj
    _store("matmul", (128, 24, 40), MM_CFG)
    assert main(["tune", "--list"]) == 0
    out = capsys.readouterr().out
    assert "1 entries" in out and "128x24x40" in out
    assert main(["tune", "--clear"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert not os.path.exists(cache.cache_path())
    assert main(["tune"]) == 2                                    # neither MODEL nor --shapes
    assert main(["tune", "--shapes", "3x4"]) == 2


def test_cli_tune_shapes_on_interp(capsys, monkeypatch):
    from nbxtensor.cli import main
    # keep interp fast: a 2-config slice of the gemv space
    monkeypatch.setattr(sweep.GemvCase, "candidates",
                        lambda self: [GV1_CFG, dict(GV1_CFG, BLOCK_N=32)])
    assert main(["tune", "--shapes", "1x24x40", "--device", "interp", "--dtype", "float32"]) == 0
    err = capsys.readouterr()
    assert "1/1" in err.err and "tuned 1 of 1" in err.out
    assert autotune.lookup("gemv", (1, 24, 40), dtype="float32", device=INTERP)[0] is not None


# ------------------------------------------------------------------ cuda only (GPU machine)

def test_over_resourced_candidate_is_excluded_before_launch(device):
    """On cuda: a tile needing ~480 KB of shared memory is refused from the compiled kernel's
    metadata (dry run), reported, and the sweep goes on with a usable context; the timer
    returns sane event times."""
    if device != "cuda":
        pytest.skip("device resource limits and event timing are cuda properties")
    from nbxtensor.autotune.timing import CudaTimer
    dev = nbx.device(device)
    case = sweep.MatmulCase((300, 264, 200), "bfloat16", dev)
    huge = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, num_warps=8, num_stages=5, GROUP_M=8)
    ok = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=2, GROUP_M=8)
    # Triton may lower num_stages until a tile fits the H200's 227 KB (seen: `huge` compiled
    # and ran), so lower the device's opt-in limit to 64 KB: `ok` needs ~16 KB, `huge` > 64 KB
    from nbxtensor.backends.cuda import launcher
    cc, _, rest = launcher._device_info(dev.index or 0)
    launcher._devinfo[dev.index or 0] = (cc, 64 * 1024, rest)
    try:
        rep = screen(case, [huge, ok])
    finally:
        launcher._devinfo.pop(dev.index or 0, None)
    assert rep.passed == [ok]
    assert rep.excluded[0]["config"] == huge
    assert "resources" in rep.excluded[0]["reason"] and "shared memory" in rep.excluded[0]["reason"]
    tm = CudaTimer(dev).measure(lambda: case.run(ok), warmup=1, reps=5)
    assert 0 < tm.min_ms <= tm.median_ms < 100


# ------------------------------------------------------------- row kernels (norm, softmax)

@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the wrong candidate computes NaN
@pytest.mark.parametrize("kernel", ["rms_norm", "softmax"])
def test_rows_screen_excludes_a_single_pass_block_shorter_than_the_row(kernel):
    case = sweep.CASES[kernel]((37, 300), "bfloat16", INTERP)
    cands = case.candidates()
    assert case.default_config() in cands
    short = dict(BLOCK_N=256, BLOCK_R=4, SINGLE=True, num_warps=4)    # 256 < 300: drops a tail
    multi = dict(BLOCK_R=1, BLOCK_N=1024, SINGLE=False, num_warps=4)
    rep = screen(case, [cands[0], short, multi])
    assert rep.passed == [cands[0], multi]
    assert rep.excluded[0]["config"] == short and rep.excluded[0]["deviation"] > 1
    # and a cached entry of that shape is never applied to a longer row
    _store(kernel, (64, 300), short, dtype="bfloat16")
    assert autotune.lookup(kernel, (37, 300), dtype="bfloat16", device=INTERP)[0] is None
    _store(kernel, (64, 200), short, dtype="bfloat16")
    assert autotune.lookup(kernel, (37, 200), dtype="bfloat16", device=INTERP)[0] == short


def test_rows_defaults_are_in_the_space():
    from nbxtensor.kernels.softmax import row_config
    t = space.get_tunable("rms_norm")
    for N in (1, 16, 40, 576, 2048, 4096, 16384, 16385, 128256):
        cfg = row_config(N)
        assert t.contains(cfg, "bfloat16") and t.applies(cfg, (1, N)), (N, cfg)


# ------------------------------------------------------------------------ attention prefill

def test_attention_case_screens_against_float64_causal_gqa():
    case = sweep.CASES["attention"]((33, 4, 2, 16), "float32", INTERP)
    d = case.default_config()
    t = space.get_tunable("attention")
    assert t.contains(d, "float32")
    other = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)
    bad = dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=1)   # BM % BN != 0: refused
    rep = screen(case, [d, other, bad])
    assert rep.passed == [d, other]
    assert "multiple of BLOCK_N" in rep.excluded[0]["reason"]
    from nbxtensor.kernels.attention import flash_config
    for D in (64, 128, 256):
        for size in (2, 4):
            assert t.contains(flash_config(D, D, size), "bfloat16" if size == 2 else "float32")


# ------------------------------------------------------- device faults: child processes

def test_tune_isolated_excludes_a_faulting_candidate_and_retries(tmp_cache):
    """The retry loop: a candidate that faults the (child's) device is reported in the
    entry's exclusions and the key is rerun without it; the entry is stored by the parent."""
    bad = dict(MM_CFG, BLOCK_K=32)
    calls = []

    def fake_child(kernel, key, dtype, device, cands, kw):
        calls.append(cands)
        if bad in cands:
            return ("fault", dict(config=bad, error="CUDA_ERROR_ILLEGAL_ADDRESS"))
        e = sweep.tune(kernel, key, dtype=dtype, device=device, candidates=cands, store=False,
                       warmup=0, reps=1)
        return ("ok", e)
    e = sweep.tune_isolated("matmul", (33, 24, 40), dtype="float32", device=INTERP,
                            candidates=[MM_CFG, bad], run_child=fake_child)
    assert calls == [[MM_CFG, bad], [MM_CFG]]
    assert e["config"] == MM_CFG
    assert e["screen"]["excluded"][0]["config"] == bad
    assert "device fault" in e["screen"]["excluded"][0]["reason"]
    assert e["screen"]["candidates"] == 2
    assert autotune.lookup("matmul", (33, 24, 40), dtype="float32", device=INTERP)[0] == MM_CFG

    def always(kernel, key, dtype, device, cands, kw):
        return ("fault", dict(config=cands[0] if cands else None, error="boom"))
    with pytest.raises(RuntimeError, match="device faults"):
        sweep.tune_isolated("matmul", (33, 24, 40), dtype="float32", device=INTERP,
                            candidates=[MM_CFG, bad], run_child=always, max_faults=1)


@pytest.mark.slow
def test_tune_isolated_runs_in_a_child_process(tmp_cache):
    e = sweep.tune_isolated("matmul", (33, 24, 40), dtype="float32", device=INTERP,
                            candidates=[MM_CFG], warmup=0, reps=1)
    assert e["config"] == MM_CFG and e["timing"]["raw_key"] == [33, 24, 40]
    assert json.loads(tmp_cache.read_text())["entries"][0]["config"] == MM_CFG
    # one tuning process serves the next key too (no interpreter start-up a key)
    pid = sweep._WORKER.p.pid
    sweep.tune_isolated("matmul", (17, 24, 40), dtype="float32", device=INTERP,
                        candidates=[MM_CFG], warmup=0, reps=1)
    assert sweep._WORKER.p.pid == pid
    pc = sweep.Precompiler(workers=1)           # the compile pool runs a key's dry runs
    try:
        assert pc.run("matmul", (33, 24, 40), "float32", "interp", [MM_CFG])["compiled"] == 1
    finally:
        pc.close()
    with pytest.raises(RuntimeError, match="outside the declared"):   # child errors come back
        sweep.tune_isolated("matmul", (33, 24, 40), dtype="float32", device=INTERP,
                            candidates=[dict(MM_CFG, BLOCK_M=16)], warmup=0, reps=1)
    assert sweep._WORKER is None                 # an error retires the tuning process


def test_flushes_cover_the_host_time_of_a_call():
    """The timer repeats the L2 flush until the GPU is busy for twice the host's enqueue time,
    so events time the kernel and not the Python (seen on the H200 without it: a 576x576
    GEMV measured 95 us, its launch overhead)."""
    from nbxtensor.autotune.timing import flushes_to_cover
    assert flushes_to_cover(0.01, 0.07) == 1           # a cheap call: one flush covers it
    n = flushes_to_cover(0.25, 0.07)
    assert n == 8 and type(n) is int                   # 0.5 ms of cover from 0.07 ms flushes
    assert flushes_to_cover(0.07, 0.07) == 2
    assert flushes_to_cover(100.0, 0.07) == 64         # bounded
    assert flushes_to_cover(0.3, 0.0) == 1             # no flush buffer: nothing to repeat


# ------------------------------------------- seams in rms_norm, softmax, attention prefill

ROWS_CFG = dict(BLOCK_N=64, BLOCK_R=2, SINGLE=True, num_warps=2)      # in the rows space


def _rows_input(R=37, N=50):
    g = np.random.default_rng()
    return nbx.tensor((g.standard_normal((R, N)) * 3).astype(np.float32), device="interp")


def _rms_ref(x, w, eps=1e-6):
    x64, w64 = x.numpy().astype(np.float64), w.numpy().astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + eps) * w64


def _softmax_ref(x, log=False):
    x64 = x.numpy().astype(np.float64)
    z = x64 - x64.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True)) if log else \
        np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)


def _last(seen, name):
    return [kw for n, kw in seen if n == name][-1]


def test_rms_norm_seam_uses_the_cached_config(monkeypatch):
    x = _rows_input()
    w = nbx.tensor(np.random.default_rng().standard_normal(50).astype(np.float32),
                   device="interp")
    seen = _spy_launch(monkeypatch)
    y0 = nbx.rms_norm(x, (50,), w, eps=1e-6)
    assert _last(seen, "_norm_kernel")["BLOCK_R"] == 32           # the rule: 2048 // 64
    _store("rms_norm", (64, 50), ROWS_CFG)
    y1 = nbx.rms_norm(x, (50,), w, eps=1e-6)
    kw = _last(seen, "_norm_kernel")
    assert (kw["BLOCK_R"], kw["num_warps"]) == (2, 2)
    for y in (y0, y1):
        np.testing.assert_allclose(y.numpy(), _rms_ref(x, w), rtol=1e-5, atol=1e-5)
    # out of the space (BLOCK_R=3) or not fitting the row (BLOCK_N 32 < 50): the rule
    for bad in (dict(ROWS_CFG, BLOCK_R=3), dict(ROWS_CFG, BLOCK_N=32)):
        _store("rms_norm", (64, 50), bad)
        y2 = nbx.rms_norm(x, (50,), w, eps=1e-6)
        assert _last(seen, "_norm_kernel")["BLOCK_R"] == 32
        np.testing.assert_allclose(y2.numpy(), _rms_ref(x, w), rtol=1e-5, atol=1e-5)
    # NBX_AUTOTUNE=0 disables (read at reload)
    _store("rms_norm", (64, 50), ROWS_CFG)
    monkeypatch.setenv("NBX_AUTOTUNE", "0")
    autotune.reload()
    nbx.rms_norm(x, (50,), w, eps=1e-6)
    assert _last(seen, "_norm_kernel")["BLOCK_R"] == 32
    # layer_norm keeps the rule (no sweep times it)
    monkeypatch.delenv("NBX_AUTOTUNE")
    autotune.reload()
    nbx.layer_norm(x, (50,))
    assert _last(seen, "_norm_kernel")["BLOCK_R"] == 32


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the interpreter's padded rows: inf - inf
@pytest.mark.parametrize("log", [False, True])
def test_softmax_seam_uses_the_cached_config(monkeypatch, log):
    x = _rows_input()
    fn = nbx.log_softmax if log else nbx.softmax
    seen = _spy_launch(monkeypatch)
    _store("softmax", (64, 50), ROWS_CFG)
    y = fn(x, dim=1)
    kw = _last(seen, "_softmax_kernel")
    assert (kw["BLOCK_R"], kw["num_warps"]) == (2, 2)
    np.testing.assert_allclose(y.numpy(), _softmax_ref(x, log), rtol=1e-5, atol=1e-5)
    _store("softmax", (64, 50), dict(ROWS_CFG, num_warps=3))     # outside the space
    fn(x, dim=1)
    assert _last(seen, "_softmax_kernel")["BLOCK_R"] == 32
    _store("softmax", (64, 50), ROWS_CFG)
    with autotune.disabled():
        fn(x, dim=1)
    assert _last(seen, "_softmax_kernel")["BLOCK_R"] == 32


def _attn_ref(q, k, v, causal):
    q64, k64, v64 = (t.numpy().astype(np.float64)[0] for t in (q, k, v))
    g = q64.shape[0] // k64.shape[0]
    k64, v64 = np.repeat(k64, g, axis=0), np.repeat(v64, g, axis=0)
    s = np.einsum("hld,hsd->hls", q64, k64) / np.sqrt(q64.shape[-1])
    if causal:
        L = s.shape[1]
        s = np.where(np.arange(L)[None, None, :] <= np.arange(L)[None, :, None], s, -np.inf)
    p = np.exp(s - s.max(axis=2, keepdims=True))
    return np.einsum("hls,hsd->hld", p / p.sum(axis=2, keepdims=True), v64)[None]


ATT_CFG = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=2)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_seam_uses_the_cached_config(monkeypatch, causal):
    g = np.random.default_rng()
    mk = lambda h: nbx.tensor(g.standard_normal((1, h, 33, 16)).astype(np.float32),  # noqa: E731
                              device="interp")
    q, k, v = mk(4), mk(2), mk(2)
    sdpa = lambda: nbx.scaled_dot_product_attention(q, k, v, is_causal=causal,  # noqa: E731
                                                    enable_gqa=True)
    seen = _spy_launch(monkeypatch)
    sdpa()
    assert _last(seen, "_flash_fwd")["BLOCK_M"] == 16              # interp default
    # keyed by causal flag: the other flag's entry is not used
    _store("attention", (64, 4, 2, 16, int(not causal)), ATT_CFG)
    sdpa()
    assert _last(seen, "_flash_fwd")["BLOCK_M"] == 16
    _store("attention", (64, 4, 2, 16, int(causal)), ATT_CFG)
    y = sdpa()
    kw = _last(seen, "_flash_fwd")
    assert (kw["BLOCK_M"], kw["num_stages"]) == (32, 2)
    np.testing.assert_allclose(y.numpy(), _attn_ref(q, k, v, causal), rtol=1e-4, atol=1e-4)
    # keyed by dtype and head dim: a bf16 entry / another D is not used
    autotune.reload()
    assert autotune.lookup("attention", (33, 4, 2, 32, int(causal)), dtype="float32",
                           device=INTERP)[0] is None
    assert autotune.lookup("attention", (33, 4, 2, 16, int(causal)), dtype="bfloat16",
                           device=INTERP)[0] is None
    _store("attention", (64, 4, 2, 16, int(causal)), dict(ATT_CFG, BLOCK_N=64))  # BM%BN != 0
    sdpa()
    assert _last(seen, "_flash_fwd")["BLOCK_M"] == 16
    _store("attention", (64, 4, 2, 16, int(causal)), dict(ATT_CFG, TMA=True))   # fp32: no TMA
    sdpa()
    assert _last(seen, "_flash_fwd")["BLOCK_M"] == 16
    _store("attention", (64, 4, 2, 16, int(causal)), ATT_CFG)
    monkeypatch.setenv("NBX_AUTOTUNE", "0")
    autotune.reload()
    sdpa()
    assert _last(seen, "_flash_fwd")["BLOCK_M"] == 16


def test_attention_tma_knob_only_where_the_tma_kernel_runs():
    t = space.get_tunable("attention")
    assert not any(c.get("TMA") for c in t.candidates("float32"))
    assert any(c.get("TMA") for c in t.candidates("bfloat16"))
    assert not any(c.get("TMA") for c in space.attention_candidates("bfloat16", 80))
    assert any(c.get("TMA") for c in space.attention_candidates("float16", 128))
    tma = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, TMA=True)
    assert t.contains(tma, "bfloat16") and not t.contains(tma, "float32")
    assert t.applies(tma, (100, 8, 2, 128, 1)) and not t.applies(tma, (100, 8, 2, 80, 1))
    # a 4-long key is the causal one (old callers, the sweep's CLI keys)
    assert t.bucket((100, 8, 2, 64)) == t.bucket((100, 8, 2, 64, 1)) == (128, 8, 2, 64, 1)
    case = sweep.CASES["attention"]((33, 4, 2, 80), "bfloat16", INTERP)
    assert not any(c.get("TMA") for c in case.candidates())
    # a bf16 TMA entry whose head dim is not a power of two is never served
    _store("attention", (64, 4, 2, 80, 1), tma, dtype="bfloat16")
    assert autotune.lookup("attention", (33, 4, 2, 80, 1), dtype="bfloat16",
                           device=INTERP)[0] is None


def test_non_causal_attention_case_screens():
    case = sweep.CASES["attention"]((21, 2, 1, 16, 0), "float32", INTERP)
    d = case.default_config()
    rep = screen(case, [d, dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)])
    assert len(rep.passed) == 2


def test_seam_pick_costs_under_a_microsecond_on_a_repeat_key():
    import timeit
    autotune.pick("softmax", (64, 50), ROWS_CFG, dtype="float32", device=INTERP)
    n = 20000
    t = min(timeit.repeat(lambda: autotune.pick("softmax", (64, 50), ROWS_CFG,
                                                dtype="float32", device=INTERP),
                          number=n, repeat=5)) / n
    # < 1 us on a quiet machine; loose here so a loaded CI core does not flake
    assert t < 5e-6, t


# ------------------------------------------------------------------------ decode attention

def test_decode_attention_case_screens_against_float64():
    case = sweep.CASES["decode_attention"]((2, 37, 3, 16), "float32", INTERP)
    d = case.default_config()
    t = space.get_tunable("decode_attention")
    assert t.contains(d, "float32") and d in case.candidates()
    other = dict(TARGET=132, BLOCK_N=32, num_warps=4, num_stages=2, COMBINE=0)
    split = dict(TARGET=528, BLOCK_N=16, num_warps=4, num_stages=1, COMBINE=1)   # P = 3
    rep = screen(case, [d, other, split])
    assert rep.passed == [d, other, split], rep.excluded
    # the rule's configs are in the space (cuda, all dtypes and head dims)
    from nbxtensor.kernels.decode_attention import decode_config
    for size in (2, 4):
        for bd in (64, 128, 256):
            c = decode_config(1, 8, 4096, bd, bd, size, H200)
            c = {k: c[k] for k in ("TARGET", "BLOCK_N", "num_warps", "num_stages", "COMBINE")}
            assert t.contains(c, "bfloat16" if size == 2 else "float32"), c


def test_decode_attention_seam_uses_the_cached_config(monkeypatch):
    g = np.random.default_rng()
    Hk, C, G, D = 2, 37, 3, 16
    q = nbx.tensor(g.standard_normal((1, Hk * G, 1, D)).astype(np.float32), device="interp")
    k, v = (nbx.tensor(g.standard_normal((1, Hk, C, D)).astype(np.float32), device="interp")
            for _ in range(2))
    lengths = nbx.tensor(np.array(30, dtype=np.int32), device="interp")
    k64, v64 = k.numpy().astype(np.float64)[0, :, :30], v.numpy().astype(np.float64)[0, :, :30]
    q64 = q.numpy().astype(np.float64)[0, :, 0].reshape(Hk, G, D)
    s = np.einsum("hgd,hcd->hgc", q64, k64) / np.sqrt(D)
    p = np.exp(s - s.max(axis=2, keepdims=True))
    ref = np.einsum("hgc,hcd->hgd", p / p.sum(axis=2, keepdims=True), v64).reshape(Hk * G, D)
    run = lambda: nbx.decode_attention(q, k, v, lengths)  # noqa: E731
    seen = _spy_launch(monkeypatch)
    run()
    kw = _last(seen, "_decode_split")
    assert (kw["BLOCK_N"], kw["COMBINE"]) == (16, 1)              # interp rule
    cfg = dict(TARGET=132, BLOCK_N=32, num_warps=2, num_stages=2, COMBINE=0)
    _store("decode_attention", (Hk, 64, G, D), cfg)               # C 37 -> bucket 64
    y = run()
    kw = _last(seen, "_decode_split")
    assert (kw["BLOCK_N"], kw["COMBINE"], kw["num_warps"]) == (32, 0, 2)
    assert seen[-1][0] == "_decode_combine"                       # COMBINE=0: second launch
    np.testing.assert_allclose(y.numpy()[0, :, 0], ref, rtol=1e-4, atol=1e-4)
    _store("decode_attention", (Hk, 64, G, D), dict(cfg, BLOCK_N=24))   # outside the space
    y = run()
    assert _last(seen, "_decode_split")["BLOCK_N"] == 16
    np.testing.assert_allclose(y.numpy()[0, :, 0], ref, rtol=1e-4, atol=1e-4)
    _store("decode_attention", (Hk, 64, G, D), cfg)
    monkeypatch.setenv("NBX_AUTOTUNE", "0")
    autotune.reload()
    run()
    assert _last(seen, "_decode_split")["BLOCK_N"] == 16


def test_real_decode_attention_sweep_on_interp(tmp_cache):
    e = sweep.tune("decode_attention", (2, 37, 3, 16), dtype="float32", device=INTERP,
                   candidates=[dict(TARGET=396, BLOCK_N=16, num_warps=4, num_stages=1,
                                    COMBINE=1),
                                dict(TARGET=132, BLOCK_N=32, num_warps=4, num_stages=2,
                                     COMBINE=0)], warmup=0, reps=2)
    assert e["config"]["TARGET"] in (396, 132)
    assert autotune.lookup("decode_attention", (2, 40, 3, 16), dtype="float32",
                           device=INTERP)[0] == e["config"]


# ------------------------------------- pruning, model keys, deadlines, shipped-table merges

def test_prune_drops_configs_that_cannot_win_but_never_the_rule():
    mm = space.get_tunable("matmul").candidates("bfloat16")
    kept, why = space.prune("matmul", (128, 100, 576), mm)
    assert kept and all(c["BLOCK_N"] <= 128 and not c.get("PERSISTENT") for c in kept)
    assert why["BLOCK_N beyond N"] > 0 and why["persistent with no more 128x128 tiles than SMs"] > 0
    assert any(c["BLOCK_N"] == 256 for c in space.prune("matmul", (128, 192, 576), mm)[0])
    kept, why = space.prune("matmul", (128, 64, 576), mm)
    assert all(c["BLOCK_N"] == 64 for c in kept) and why["BLOCK_N beyond N"] > 0
    big = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3, GROUP_M=8)
    kept, _ = space.prune("matmul", (16, 16, 16), mm, keep=big)
    assert big in kept                                          # the rule's config stays
    # a persistent matmul survives where tiles outnumber the SMs
    kept, _ = space.prune("matmul", (4096, 4096, 4096), mm)
    assert any(c.get("PERSISTENT") for c in kept) and len(kept) == len(mm)
    # attention tiles beyond a short sequence; decode tiles beyond a small cache
    at = space.attention_candidates("bfloat16", 64)
    kept, why = space.prune("attention", (16, 4, 2, 64, 1), at)
    assert kept and all(c["BLOCK_M"] == 16 and c["BLOCK_N"] == 16 for c in kept)
    kept, _ = space.prune("decode_attention", (2, 32, 2, 64), space.decode_candidates("bfloat16"))
    assert kept and all(c["BLOCK_N"] <= 32 for c in kept)


def test_sweep_dedupes_targets_that_launch_the_same_split():
    # gemv 1x24x40, BLOCK_K 64: one K block, so every TARGET gives K_SPLIT = one block
    cands = [dict(GV1_CFG, BLOCK_K=64, TARGET=t) for t in (264, 528, 1056)]
    out, rec = sweep.prune_for_key("gemv", (1, 24, 40), cands, dtype="float32")
    assert len(out) == 1 and rec["rules"]["same launch as another TARGET (same split)"] == 2
    # the rule's TARGET is the one kept among equals, and a missing rule config is added
    rule = dict(GV1_CFG, BLOCK_K=64, TARGET=528)
    out, _ = sweep.prune_for_key("gemv", (1, 24, 40), cands, default=rule, dtype="float32")
    assert out == [rule]
    out, _ = sweep.prune_for_key("gemv", (1, 24, 40), cands[:1] + cands[2:], default=rule,
                                 dtype="float32")
    assert out == [rule]
    # where the splits differ, every TARGET stays
    big = [dict(GV1_CFG, BLOCK_N=16, BLOCK_K=128, TARGET=t) for t in (264, 528, 1056)]
    out, rec = sweep.prune_for_key("gemv", (1, 512, 8192), big, dtype="float32")
    assert len(out) == 3 and rec is None


def test_model_keys_cover_every_tunable_kernel_most_valuable_first():
    from nbxtensor.cli_tune import GROUPS, model_keys
    ks = model_keys("smollm2")
    kernels = [k[1] for k in ks]
    # no softmax: one row of its 49152-long vocabulary takes the split-row path (no config)
    assert set(kernels) == {"gemv", "matmul", "attention", "decode_attention", "rms_norm"}
    groups = [k[0] for k in ks]
    assert groups == sorted(groups) and len(GROUPS) > max(groups)
    assert ks[0][1:3] == ("gemv", (1, 576, 576))                # decode GEMVs first
    assert ("attention", (128, 9, 3, 64, 1)) in [k[1:3] for k in ks]
    assert ("decode_attention", (3, 512, 3, 64)) in [k[1:3] for k in ks]
    assert kernels.index("rms_norm") > kernels.index("decode_attention")
    # one key per bucket
    b = [(k[1], space.get_tunable(k[1]).bucket(k[2])) for k in ks]
    assert len(b) == len(set(b))
    bert = model_keys("minilm")
    assert all(k[2][0] > 1 for k in bert if k[1] in ("gemv", "matmul"))   # no 1-token steps
    assert not any(k[1] == "decode_attention" for k in bert)
    assert ("attention", (512, 12, 12, 32, 0)) in [k[1:3] for k in bert]  # <= 512 positions


def test_run_keys_stops_at_the_deadline_and_keeps_what_it_did(monkeypatch):
    from nbxtensor.cli_tune import run_keys
    cand = dict(GV1_CFG, BLOCK_K=64)
    monkeypatch.setattr(sweep.GemvCase, "candidates", lambda self: [cand])
    keys = [("gemv", (1, 24, 40), "float32"), ("gemv", (1, 24, 56), "float32")]
    seen = []
    res = run_keys(keys, INTERP, deadline_s=0.0, on_entry=lambda *a: seen.append(a))
    assert res["left"] == 2 and res["tuned"] == 0 and not seen
    res = run_keys(keys[:1], INTERP, deadline_s=600.0, on_entry=lambda *a: seen.append(a))
    assert res["tuned"] == 1 and res["left"] == 0 and isinstance(seen[0][3], dict)
    e = seen[0][3]
    assert e["screen"]["candidates"] == 2          # the candidate and the rule's config
    assert autotune.lookup("gemv", (1, 24, 40), dtype="float32", device=INTERP)[0] == e["config"]


def _sm90_entry(kernel, key, cfg, dtype="bfloat16", speed=1.0):
    e = cache.make_entry(("NVIDIA H200", "sm_90"), kernel, key, dtype, cfg,
                         {"reference": "float64 host", "passed": 3, "candidates": 3,
                          "excluded": []}, {"speedup": speed})
    return e


def test_merge_lays_new_entries_over_the_table_and_drops_out_of_space(tmp_path, capsys):
    import importlib.util
    old_mm = _sm90_entry("matmul", (128, 576, 576), MM_CFG, "float32", 1.1)
    keep = _sm90_entry("matmul", (256, 576, 576), MM_CFG, "float32")
    stale = _sm90_entry("matmul", (512, 576, 576), dict(MM_CFG, BLOCK_M=48), "float32")
    new_cfg = dict(MM_CFG, BLOCK_N=128)
    new_mm = _sm90_entry("matmul", (128, 576, 576), new_cfg, "float32", 2.0)
    new_mm["device"] = "NVIDIA H100"                 # shipped keys ignore the card's name
    gemv_bad = _sm90_entry("gemv", (8, 24, 40), GV1_CFG, "float32")   # BLOCK_M=1 at M=8
    added = _sm90_entry("rms_norm", (128, 576), dict(BLOCK_N=1024, BLOCK_R=1, SINGLE=True,
                                                     num_warps=4), "float32")
    entries, rep = cache.merge_tables([old_mm, keep, stale], [new_mm, gemv_bad, added])
    by = {(e["kernel"], tuple(e["key"])): e for e in entries}
    assert by[("matmul", (128, 576, 576))]["config"] == new_cfg
    assert by[("matmul", (128, 576, 576))]["screen"]["reference"] == "float64 host"
    assert by[("matmul", (128, 576, 576))]["timing"]["speedup"] == 2.0
    assert ("matmul", (256, 576, 576)) in by and ("rms_norm", (128, 576)) in by
    assert ("matmul", (512, 576, 576)) not in by and ("gemv", (8, 24, 40)) not in by
    assert rep["replaced"] == 1 and rep["added"] == 1 and rep["kept"] == 1
    assert {d["reason"] for d in rep["dropped"]} == {"config outside today's space",
                                                      "config does not apply to its key"}
    # the script's --merge writes the table file the loader reads
    spec = importlib.util.spec_from_file_location(
        "make_sm90_table", os.path.join(os.path.dirname(__file__), "..", "..", "scripts",
                                        "make_sm90_table.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    base, new = tmp_path / "sm90.json", tmp_path / "new.json"
    cache._write(str(base), [old_mm, keep, stale])
    cache._write(str(new), [new_mm, gemv_bad, added])
    assert mod.merge(str(new), str(base)) == 0
    out = capsys.readouterr().out
    assert "1 added, 1 replaced" in out and "2 dropped" in out
    assert len(cache._read(str(base))) == 3


def test_shipped_table_ignores_out_of_space_entries_and_can_be_disabled(tmp_path, monkeypatch):
    good = _sm90_entry("matmul", (128, 24, 40), MM_CFG, "float32")
    bad = _sm90_entry("matmul", (256, 24, 40), dict(MM_CFG, num_warps=3), "float32")
    cache._write(str(tmp_path / "sm90.json"), [good, bad])
    monkeypatch.setattr(cache, "TABLE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "device_identity", lambda d: ("NVIDIA H100 PCIe", "sm_90"))
    autotune.reload()
    cfg, src = autotune.lookup("matmul", (100, 24, 40), dtype="float32", device=INTERP)
    assert cfg == MM_CFG and src == "shipped table sm90.json"
    # the out-of-space entry is not served; its key falls back to the near in-space one
    cfg, src = autotune.lookup("matmul", (256, 24, 40), dtype="float32", device=INTERP)
    assert cfg == MM_CFG and "near key (128, 24, 40)" in src
    assert autotune.lookup("matmul", (1024, 24, 40), dtype="float32", device=INTERP)[0] is None
    monkeypatch.setenv("NBX_NO_SHIPPED_TABLE", "1")
    autotune.reload()
    assert autotune.lookup("matmul", (100, 24, 40), dtype="float32", device=INTERP)[0] is None
    assert autotune.pick("matmul", (100, 24, 40), {"x": 1}, dtype="float32",
                         device=INTERP) == {"x": 1}


def test_a_faster_rule_config_outside_the_space_is_not_stored(toy, tmp_cache, monkeypatch):
    """If the kernel's rule uses a knob the space lacks and beats every candidate, an entry
    would make the op slower: tune returns it marked `rule_wins` and stores nothing."""
    fast_rule = dict(BLOCK=16, MODE=0)                 # not declared in the toy space
    monkeypatch.setattr(ToyCase, "default_config", lambda self: dict(fast_rule))
    monkeypatch.setitem(SPEED, (16, 0), 0.01)
    e = autotune.tune("toy", (7, 9), dtype="float32", device=INTERP, timer=FakeTimer())
    assert e["timing"]["rule_wins"] is True and e["config"] == GOOD64
    assert not tmp_cache.exists()
    # a rule config inside the space is a candidate: it can win and be stored as usual
    monkeypatch.setattr(ToyCase, "default_config", lambda self: dict(GOOD32))
    e = autotune.tune("toy", (7, 9), dtype="float32", device=INTERP, timer=FakeTimer())
    assert "rule_wins" not in e["timing"] and tmp_cache.exists()


def test_attention_entry_replaces_the_rules_kernel_switch(monkeypatch):
    """An attention entry is a whole config: laid over a rule default that has WS=True (the
    H200's TUNED D=128 non-causal entry), a pointer or TMA entry kept WS=True and ran the
    warp-specialised kernel (on cuda: refused back to the untuned default) instead of the
    tuned one. The rule is made to answer WS=True on interp here."""
    from nbxtensor.kernels import attention as ka
    real = ka.flash_config

    def rule(D, DV, dtype_size, interp=False, causal=False, tuned=True):
        c = real(D, DV, dtype_size, interp, causal, tuned)
        return dict(c, WS=True) if tuned else c
    monkeypatch.setattr(ka, "flash_config", rule)
    g = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16
    q, k, v = (nbx.tensor(g.standard_normal((1, 2, 33, 16)).astype(bf16), device="interp")
               for _ in range(3))
    seen = _spy_launch(monkeypatch)
    from nbxtensor.backends import launch as L
    spy = L.launch

    def no_ws(kernel, grid, *args, **kw):     # recorded, not run (TMA descriptors on interp)
        if kernel is ka._flash_fwd_ws:
            return seen.append(("_flash_fwd_ws", kw))
        return spy(kernel, grid, *args, **kw)
    monkeypatch.setattr(L, "launch", no_ws)
    nbx.scaled_dot_product_attention(q, k, v)
    assert seen[-1][0] == "_flash_fwd_ws"                  # no entry: the rule's WS kernel
    _store("attention", (64, 2, 2, 16, 0), dict(ATT_CFG, BLOCK_M=64), dtype="bfloat16")
    y = nbx.scaled_dot_product_attention(q, k, v)
    assert seen[-1][0] == "_flash_fwd" and seen[-1][1]["BLOCK_M"] == 64
    np.testing.assert_allclose(y.numpy().astype(np.float64), _attn_ref(q, k, v, False),
                               rtol=3e-2, atol=3e-2)


def test_attention_ws_config_only_where_sdpa_runs_it():
    """The warp-specialised config applies only to the non-causal keys at WS_VERIFIED's head
    dims: a causal or D=64 sweep screened it (refused on cuda), a D=80 sweep timed its tile
    on the pointer kernel under the WS label (sdpa then ignores such an entry), and a
    cached WS entry for a causal key was served (then replaced by the untuned default)."""
    from nbxtensor.kernels import attention as ka
    t = space.get_tunable("attention")
    ws = [c for c in t.candidates("bfloat16") if c.get("WS")]
    assert ws
    for c in ws:     # the space's WS configs are the verified ones, at the verified dims
        for D in space.WS_HEAD_DIMS:
            tile = (D, c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"])
            assert tile in ka.WS_VERIFIED
    assert {v[0] for v in ka.WS_VERIFIED} == set(space.WS_HEAD_DIMS)
    w = ws[0]
    assert t.applies(w, (100, 8, 8, 128, 0))
    assert not t.applies(w, (100, 8, 8, 128, 1)) and not t.applies(w, (100, 8, 8, 128))
    assert not t.applies(w, (100, 8, 8, 64, 0)) and not t.applies(w, (100, 8, 8, 80, 0))
    assert not any(c.get("WS") for c in space.attention_candidates("bfloat16", 80))
    assert not any(c.get("WS") for c in space.attention_candidates("bfloat16", 64))
    assert any(c.get("WS") for c in space.attention_sweep("bfloat16", 128, 0))
    assert not any(c.get("WS") for c in space.attention_sweep("bfloat16", 128, 1))
    for key in ((33, 2, 2, 16, 1), (33, 2, 2, 16, 0)):
        case = sweep.CASES["attention"](key, "bfloat16", INTERP)
        assert not any(c.get("WS") for c in case.candidates())
    _store("attention", (128, 8, 8, 128, 1), w, dtype="bfloat16")
    assert autotune.lookup("attention", (100, 8, 8, 128, 1), dtype="bfloat16",
                           device=INTERP)[0] is None
    _store("attention", (128, 8, 8, 128, 0), w, dtype="bfloat16")
    assert autotune.lookup("attention", (100, 8, 8, 128, 0), dtype="bfloat16",
                           device=INTERP)[0] == w


def test_softmax_split_row_keys_are_not_tuned():
    """A softmax key whose rows take the split-row path (few rows longer than MAX_SINGLE)
    runs before the autotune seam: a sweep timed the same split launches under every
    candidate's label and stored an entry that is never used (the shipped [1, 49152]).
    Such keys are refused by the sweep and not listed for a model; the row kernel's keys
    still are."""
    from nbxtensor.cli_tune import dims_keys
    from nbxtensor.kernels import softmax as ks
    N = ks.MAX_SINGLE + 1
    with pytest.raises(ValueError, match="split-row path"):
        sweep.tune("softmax", (1, N), dtype="float32", device=INTERP)
    assert not os.path.exists(cache.cache_path())
    sweep.CASES["softmax"]((ks.SPLIT_ROWS_PER_SM * 132, N), "float32", INTERP)   # row kernel
    llama = ("llama", 64, 128, 4, 2, 16, N)
    assert not any(k[1] == "softmax" for k in dims_keys(llama, (1, 8), (128,)))
    small = ("llama", 64, 128, 4, 2, 16, 1000)
    assert ("softmax", (1, 1000)) in [k[1:3] for k in dims_keys(small, (1, 8), (128,))]


def test_table_script_resume_carries_only_usable_entries():
    """`make_sm90_table.py --resume FILE` stored every entry of FILE and counted its keys as
    done: an entry outside today's space (or of another Triton / cc, which the loaders
    never serve) stayed in the new table and its key was never swept again. Kept entries
    stay whole (screen record, timing)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "make_sm90_table", os.path.join(os.path.dirname(__file__), "..", "..", "scripts",
                                        "make_sm90_table.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    good = _sm90_entry("matmul", (128, 24, 40), MM_CFG, "float32", 1.5)
    out_of_space = _sm90_entry("matmul", (256, 24, 40), dict(MM_CFG, num_warps=3), "float32")
    old_triton = dict(_sm90_entry("matmul", (512, 24, 40), MM_CFG, "float32"), triton="0.0")
    other_cc = dict(_sm90_entry("matmul", (1024, 24, 40), MM_CFG, "float32"), cc="sm_80")
    kept, dropped = mod.carry_over([good, out_of_space, old_triton, other_cc], "sm_90",
                                   cache.triton_version())
    assert kept == [good] and kept[0]["screen"]["passed"] == 3
    assert kept[0]["timing"]["speedup"] == 1.5
    assert sorted(tuple(d[1]) for d in dropped) == [(256, 24, 40), (512, 24, 40), (1024, 24, 40)]


def test_tune_isolated_retries_share_the_keys_time_limit(tmp_cache, monkeypatch):
    """`timeout_s` is one limit for the whole key: after a device fault the retry gets what
    is left of it, not the full limit again (with 4 faults a key ran 5x past the deadline
    that `nbx tune --deadline` / the table script derive the limit from)."""
    clock = [1000.0]
    monkeypatch.setattr(sweep.time, "perf_counter", lambda: clock[0])
    bad = dict(MM_CFG, BLOCK_K=32)
    limits = []

    def fake_run_child(kernel, key, dtype, device, cands, kw, timeout_s=1800.0):
        limits.append(timeout_s)
        clock[0] += 50.0                                # each attempt takes 50 s
        if bad in cands:
            return ("fault", dict(config=bad, error="CUDA_ERROR_ILLEGAL_ADDRESS"))
        return ("ok", cache.make_entry(("interp", "interp"), kernel, key, dtype, cands[0],
                                       dict(excluded=[], candidates=1, passed=1), {}))
    monkeypatch.setattr(sweep, "_run_child", fake_run_child)
    sweep.tune_isolated("matmul", (33, 24, 40), dtype="float32", device=INTERP,
                        candidates=[MM_CFG, bad], timeout_s=120.0)
    assert limits == [120.0, 70.0]


def test_tune_isolated_keeps_the_prune_record_after_a_fault(tmp_cache):
    """After a device fault the parent prunes the key's candidates itself and reruns them as
    an explicit list (which `tune` does not prune again): the entry's screen record kept no
    `pruned` record then, unlike a run without faults."""
    calls = []

    def fake_child(kernel, key, dtype, device, cands, kw):
        calls.append(cands)
        if cands is None:          # the child's own (pruned) sweep hits a faulting config
            return ("fault", dict(config=dict(MM_CFG, BLOCK_K=32), error="boom"))
        return ("ok", cache.make_entry(("interp", "interp"), kernel, key, dtype, cands[0],
                                       dict(excluded=[], candidates=len(cands), passed=1), {}))
    e = sweep.tune_isolated("matmul", (33, 24, 40), dtype="float32", device=INTERP,
                            run_child=fake_child)
    pr = e["screen"]["pruned"]
    assert pr["of"] > pr["kept"] == len(calls[1]) + 1 and "BLOCK_M beyond M" in pr["rules"]
    assert dict(MM_CFG, BLOCK_K=32) not in calls[1]


def test_merge_counts_a_key_the_new_file_holds_twice_once():
    """Two new entries for one key (the later wins): counted as one added (or replaced)
    entry; `kept` counted the table's entries as len(out) - added - replaced, which went
    negative (and `replaced` counted a new entry replacing a new one)."""
    a = _sm90_entry("matmul", (128, 24, 40), MM_CFG, "float32", 1.1)
    b = _sm90_entry("matmul", (128, 24, 40), dict(MM_CFG, num_stages=3), "float32", 1.2)
    entries, rep = cache.merge_tables([], [a, b])
    assert [e["config"] for e in entries] == [b["config"]]
    assert (rep["added"], rep["replaced"], rep["kept"]) == (1, 0, 0)
    old = _sm90_entry("matmul", (128, 24, 40), dict(MM_CFG, num_warps=8), "float32")
    entries, rep = cache.merge_tables([old], [a, b])
    assert (rep["added"], rep["replaced"], rep["kept"]) == (0, 1, 0)
