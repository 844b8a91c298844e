"""Sweeps: screen every candidate of a key, time the survivors, store the fastest.

A *case* holds one key's inputs and knows how to run a config on them, how to restore the
output, and the float64 reference. Cases for the matmul family are here; other kernels
(and tests) add theirs with `register_case`.

    entry = tune("matmul", (128, 2048, 2048), dtype="bfloat16", device=nbx.device("cuda"))

Budget: `budget_s` bounds the whole sweep's timing phase (candidates left when it is spent
are reported as skipped); `run_budget_ms` bounds one run of one candidate (default: 20x the
default config's run, at least 2 ms) -- a slower candidate is dropped and reported.
"""
from __future__ import annotations

import math
import time

import numpy as np

from . import cache as _cache
from .screen import DeviceFault, ScreenError, context_poisoned, screen
from .space import gemv_candidates, get_tunable
from .timing import OverBudget, timer_for

CASES: dict = {}
WINDOW = 64                 # rows per reference window for large keys
WHOLE_LIMIT = 1 << 27       # M*N*K up to this: the whole output is compared


def register_case(kernel: str):
    def deco(cls):
        CASES[kernel] = cls
        return cls
    return deco


def row_windows(M: int, window: int = WINDOW) -> list[tuple[int, int]]:
    """Rows compared for a large key: the first window, one in the middle, and the last,
    which ends at the final row (tails live there)."""
    if M <= 3 * window:
        return [(0, M)]
    mid = (M // 2) - window // 2
    return [(0, window), (mid, mid + window), (M - window, M)]


def _product_tol(dtype: str, K: int) -> float:
    """Relative to |A| @ |B|: fp16/bf16 1e-2 (fp32 accumulation, one rounding of the output);
    fp32 1e-5 growing with sqrt(K) (accumulation order differs between tilings)."""
    if dtype in ("bfloat16", "float16"):
        return 1e-2
    if dtype == "float32":
        return 1e-5 * max(1.0, math.sqrt(K) / 16)
    return 1e-12 * max(1.0, math.sqrt(K))


class _ProductCase:
    """out[M, N] = x[M, K] @ W[N, K]^T (linear's layout), the shape of every linear layer."""

    kernel = "?"

    def __init__(self, key, dtype, device, seed=0):
        import nbxtensor as nbx
        from ..tensor import Tensor
        self.M, self.N, self.K = (int(v) for v in key)
        self.dtype = nbx.dtypes.as_dtype(dtype)
        self.device = device
        g = np.random.default_rng(seed)
        # the actual (rounded) inputs, kept in float64 for the reference
        x = g.standard_normal((self.M, self.K)).astype(self.dtype.np)
        w = g.standard_normal((self.N, self.K)).astype(self.dtype.np)
        self.x64, self.w64 = x.astype(np.float64), w.astype(np.float64)
        self.X = nbx.tensor(x, device=device)
        self.W = nbx.tensor(w, device=device)
        self.a = self.X.reshape(1, 1, self.M, self.K)
        self.b = self.W.t().unsqueeze(0).unsqueeze(0)        # (1, 1, K, N) view of W^T
        self.out = Tensor._empty((1, 1, self.M, self.N), self.dtype, device)
        self.rows = row_windows(self.M) if self.M * self.N * self.K > WHOLE_LIMIT else [(0, self.M)]
        self.tol = _product_tol(self.dtype.name, self.K)
        self.tol_text = f"{self.tol:.3g} x (|x| @ |W|^T)"
        self._ref = None

    def describe_key(self) -> str:
        return f"{self.kernel} {self.M}x{self.N}x{self.K} {self.dtype.name} on {self.device}"

    def describe(self) -> str:
        if self.rows == [(0, self.M)]:
            return "whole output"
        return "rows " + ", ".join(f"[{a}, {b})" for a, b in self.rows) + f" of {self.M}, all columns"

    def reset(self):
        self.out.fill_(float("nan"))

    def result(self) -> np.ndarray:
        o = self.out[0, 0]
        return np.concatenate([o[a:b].numpy().astype(np.float64) for a, b in self.rows])

    def reference(self):
        if self._ref is None:
            x = np.concatenate([self.x64[a:b] for a, b in self.rows])
            ref = x @ self.w64.T
            bound = np.abs(x) @ np.abs(self.w64).T
            self._ref = (ref, self.tol * bound + 1e-30)
        return self._ref

    def run_default(self):
        from . import disabled
        with disabled():
            self._run(None)


@register_case("matmul")
class MatmulCase(_ProductCase):
    kernel = "matmul"

    def candidates(self):
        return get_tunable("matmul").candidates(self.dtype.name)

    def default_config(self):
        from ..kernels import matmul as km
        return {k: v for k, v in km.matmul_config(self.M, self.N, self.K, self.dtype).items()}

    def _run(self, cfg):
        from ..kernels import matmul as km
        if cfg is None:
            if self.M <= km.GEMV_MAX_M:     # the default would take the GEMV path
                with km.config_override(**self.default_config()):
                    km.matmul(self.out, self.a, self.b)
            else:
                km.matmul(self.out, self.a, self.b)
            return
        with km.config_override(**cfg):
            km.matmul(self.out, self.a, self.b)

    def run(self, cfg):
        self._run(cfg)


@register_case("gemv")
class GemvCase(_ProductCase):
    kernel = "gemv"

    def __init__(self, key, dtype, device, seed=0):
        if int(key[0]) > 16:
            raise ValueError(f"autotune: gemv keys have M <= 16, got M={key[0]}")
        super().__init__(key, dtype, device, seed)

    def candidates(self):
        return gemv_candidates(self.dtype.name, self.M)

    def default_config(self):
        from ..kernels import gemv as kg
        from . import disabled
        with disabled():
            cfg = kg.gemv_config(self.M, self.N, self.K, self.dtype)
        cfg.pop("K_SPLIT", None)
        return cfg

    def _run(self, cfg):
        from ..kernels import gemv as kg
        old = kg._OVERRIDE
        kg._OVERRIDE = cfg
        try:
            kg.gemv(self.out, self.a, self.b, bias=None, residual=None, alpha=1.0, beta=1.0,
                    act=0, precision="ieee")
        finally:
            kg._OVERRIDE = old

    def run(self, cfg):
        self._run(cfg)


class _RowsCase:
    """A contiguous [R, N] input, one row op along N (the rows rule of norm/softmax)."""

    kernel = "?"
    TOL = {"bfloat16": 1.6e-2, "float16": 4e-3, "float32": 2e-5}

    def __init__(self, key, dtype, device, seed=0):
        import nbxtensor as nbx
        from ..tensor import Tensor
        self.R, self.N = (int(v) for v in key)
        self.dtype = nbx.dtypes.as_dtype(dtype)
        if self.dtype.name not in self.TOL:
            raise ValueError(f"autotune: {self.kernel} is tuned for {sorted(self.TOL)}, got "
                             f"{self.dtype.name}")
        self.device = device
        g = np.random.default_rng(seed)
        x = (g.standard_normal((self.R, self.N)) * 3).astype(self.dtype.np)
        self.x64 = x.astype(np.float64)
        self.x = nbx.tensor(x, device=device)
        self.out = Tensor._empty((self.R, self.N), self.dtype, device)
        self.rows = row_windows(self.R) if self.R * self.N > (1 << 24) else [(0, self.R)]
        self.tol = self.TOL[self.dtype.name]
        self.tol_text = f"{self.tol:.3g} relative"
        self._ref = None
        self._setup(g)

    def _setup(self, g):
        pass

    def describe_key(self) -> str:
        return f"{self.kernel} {self.R}x{self.N} {self.dtype.name} on {self.device}"

    describe = _ProductCase.describe
    reset = _ProductCase.reset

    @property
    def M(self):      # the row count, for the shared describe/row-window helpers
        return self.R

    def result(self) -> np.ndarray:
        return np.concatenate([self.out[a:b].numpy().astype(np.float64) for a, b in self.rows])

    def candidates(self):
        from .space import rows_candidates
        return rows_candidates(self.dtype.name, self.N)

    def default_config(self):
        from ..kernels.softmax import row_config
        return row_config(self.N)

    def run_default(self):
        self.run(None)

    def _with_override(self, module, cfg, fn):
        old = module._OVERRIDE
        module._OVERRIDE = cfg
        try:
            fn()
        finally:
            module._OVERRIDE = old


@register_case("rms_norm")
class RmsNormCase(_RowsCase):
    kernel = "rms_norm"
    EPS = 1e-6

    def _setup(self, g):
        import nbxtensor as nbx
        w = (1 + 0.1 * g.standard_normal(self.N)).astype(self.dtype.np)
        self.w64 = w.astype(np.float64)
        self.w = nbx.tensor(w, device=self.device)

    def run(self, cfg):
        from ..kernels import norm as kn
        self._with_override(kn, cfg, lambda: kn.rms_norm(self.out, self.x, self.w, self.EPS))

    def reference(self):
        if self._ref is None:
            x = np.concatenate([self.x64[a:b] for a, b in self.rows])
            rs = 1.0 / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + self.EPS)
            ref = x * rs * self.w64
            self._ref = (ref, self.tol * np.abs(ref) + 1e-6 * self.tol)
        return self._ref


@register_case("softmax")
class SoftmaxCase(_RowsCase):
    kernel = "softmax"

    def run(self, cfg):
        from ..kernels import softmax as ks
        rows = (self.R, 1, self.N, (self.N, 0, 1), (self.N, 0, 1))
        self._with_override(ks, cfg, lambda: ks.softmax(self.out, self.x, rows, dim=1))

    def reference(self):
        if self._ref is None:
            x = np.concatenate([self.x64[a:b] for a, b in self.rows])
            e = np.exp(x - x.max(axis=1, keepdims=True))
            ref = e / e.sum(axis=1, keepdims=True)
            self._ref = (ref, self.tol * ref + 1e-30)
        return self._ref


@register_case("attention")
class AttentionCase:
    """Self-attention of one sequence: q [1, H, L, D], k/v [1, Hk, L, D] (GQA); key
    (L, H, Hk, D[, causal]) -- a 4-long key is causal."""

    kernel = "attention"
    TOL = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 1e-4}

    def __init__(self, key, dtype, device, seed=0):
        import nbxtensor as nbx
        from ..tensor import Tensor
        from .space import _attn_key
        self.L, self.H, self.Hk, self.D, self.causal = _attn_key(tuple(key))
        if self.H % self.Hk:
            raise ValueError(f"autotune: attention heads {self.H} not a multiple of kv heads {self.Hk}")
        self.dtype = nbx.dtypes.as_dtype(dtype)
        if self.dtype.name not in self.TOL:
            raise ValueError(f"autotune: attention is tuned for {sorted(self.TOL)}, got {self.dtype.name}")
        self.device = device
        g = np.random.default_rng(seed)
        mk = lambda h: g.standard_normal((1, h, self.L, self.D)).astype(self.dtype.np)  # noqa: E731
        q, k, v = mk(self.H), mk(self.Hk), mk(self.Hk)
        self.q64, self.k64, self.v64 = (a.astype(np.float64)[0] for a in (q, k, v))
        self.q, self.k, self.v = (nbx.tensor(a, device=device) for a in (q, k, v))
        self.out = Tensor._empty((1, self.H, self.L, self.D), self.dtype, device)
        self.scale = 1.0 / math.sqrt(self.D)
        self.rows = row_windows(self.L) if self.L > 1024 else [(0, self.L)]
        self.tol = self.TOL[self.dtype.name]
        self.tol_text = f"{self.tol:.3g} x (P @ |V|)"
        self._ref = None

    @property
    def M(self):
        return self.L

    def describe_key(self) -> str:
        return (f"attention L={self.L} H={self.H} Hk={self.Hk} D={self.D} "
                f"{'causal' if self.causal else 'full'} {self.dtype.name} on {self.device}")

    describe = _ProductCase.describe

    def reset(self):
        self.out.fill_(float("nan"))

    def candidates(self):
        # TMA candidates only where the TMA kernel runs (16-bit, head dim a power of two):
        # elsewhere sdpa would time the pointer kernel under a TMA label
        from .space import attention_candidates
        return attention_candidates(self.dtype.name, self.D)

    def default_config(self):
        from ..kernels import attention as ka
        return ka.flash_config(self.D, self.D, self.dtype.itemsize, self.device.type == "interp",
                               bool(self.causal))

    def run(self, cfg):
        from ..kernels import attention as ka
        old = ka._OVERRIDE
        ka._OVERRIDE = cfg
        try:
            ka.sdpa(self.out, self.q, self.k, self.v, None, scale=self.scale,
                    is_causal=bool(self.causal))
        finally:
            ka._OVERRIDE = old

    def run_default(self):
        self.run(None)

    def result(self) -> np.ndarray:
        o = self.out[0]
        return np.concatenate([o[:, a:b].numpy().astype(np.float64) for a, b in self.rows], axis=1)

    def reference(self):
        if self._ref is None:
            g = self.H // self.Hk
            refs, bounds = [], []
            for a, b in self.rows:
                q = self.q64[:, a:b]                                   # [H, r, D]
                k = np.repeat(self.k64, g, axis=0)                     # [H, L, D]
                v = np.repeat(self.v64, g, axis=0)
                s = np.einsum("hrd,hld->hrl", q, k) * self.scale
                if self.causal:
                    s = np.where(np.arange(self.L)[None, None, :] <= np.arange(a, b)[None, :, None],
                                 s, -np.inf)
                p = np.exp(s - s.max(axis=2, keepdims=True))
                p /= p.sum(axis=2, keepdims=True)
                refs.append(np.einsum("hrl,hld->hrd", p, v))
                bounds.append(self.tol * np.einsum("hrl,hld->hrd", p, np.abs(v)) + 1e-6)
            self._ref = (np.concatenate(refs, axis=1), np.concatenate(bounds, axis=1))
        return self._ref


@register_case("decode_attention")
class DecodeAttentionCase:
    """Split-K decode of one query token per head: q [1, Hk*R, 1, D], caches [1, Hk, C, D]
    filled to capacity (lengths = C, so every split works); key (B*Hk, C, R, D) with B = 1.
    Reference: float64 NumPy attention of each query row over its kv head's C keys."""

    kernel = "decode_attention"
    TOL = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 1e-4}

    def __init__(self, key, dtype, device, seed=0):
        import nbxtensor as nbx
        from ..tensor import Tensor
        self.Hk, self.C, self.R, self.D = (int(v) for v in key)
        self.dtype = nbx.dtypes.as_dtype(dtype)
        if self.dtype.name not in self.TOL:
            raise ValueError(f"autotune: decode_attention is tuned for {sorted(self.TOL)}, got "
                             f"{self.dtype.name}")
        self.device = device
        g = np.random.default_rng(seed)
        q = g.standard_normal((1, self.Hk * self.R, 1, self.D)).astype(self.dtype.np)
        k = g.standard_normal((1, self.Hk, self.C, self.D)).astype(self.dtype.np)
        v = g.standard_normal((1, self.Hk, self.C, self.D)).astype(self.dtype.np)
        self.q64, self.k64, self.v64 = (a.astype(np.float64)[0] for a in (q, k, v))
        self.q, self.k, self.v = (nbx.tensor(a, device=device) for a in (q, k, v))
        self.lengths = nbx.tensor(np.array(self.C, dtype=np.int32), device=device)
        self.out = Tensor._empty((1, self.Hk * self.R, 1, self.D), self.dtype, device)
        self.scale = 1.0 / math.sqrt(self.D)
        self.rows = [(0, self.Hk * self.R)]      # small output: all of it is compared
        self.tol = self.TOL[self.dtype.name]
        self.tol_text = f"{self.tol:.3g} x (P @ |V|)"
        self._ref = None

    @property
    def M(self):
        return self.Hk * self.R

    def describe_key(self) -> str:
        return (f"decode_attention Hk={self.Hk} C={self.C} R={self.R} D={self.D} "
                f"{self.dtype.name} on {self.device}")

    describe = _ProductCase.describe

    def reset(self):
        self.out.fill_(float("nan"))

    def candidates(self):
        from .space import decode_candidates
        return decode_candidates(self.dtype.name)

    def default_config(self):
        from ..kernels import decode_attention as kd
        bd = max(16, 1 << (self.D - 1).bit_length())
        cfg = kd.decode_config(1, self.Hk, self.C, bd, bd, self.dtype.itemsize,
                               self.device.type == "interp")
        return dict(TARGET=kd.TUNED["TARGET"], BLOCK_N=cfg["BLOCK_N"],
                    num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                    COMBINE=cfg["COMBINE"])

    def run(self, cfg):
        from ..kernels import decode_attention as kd
        if cfg is None:
            cfg = self.default_config()
        over = dict(cfg, P=kd.splits(self.Hk, self.C, cfg["TARGET"], cfg["BLOCK_N"]))
        over.pop("TARGET")
        old = kd._OVERRIDE
        kd._OVERRIDE = over
        try:
            kd.decode_attention(self.out, self.q, self.k, self.v, self.lengths, scale=self.scale)
        finally:
            kd._OVERRIDE = old

    def run_default(self):
        self.run(None)

    def result(self) -> np.ndarray:
        return self.out.numpy().astype(np.float64)[0, :, 0]

    def reference(self):
        if self._ref is None:
            q = self.q64[:, 0].reshape(self.Hk, self.R, self.D)
            s = np.einsum("hrd,hcd->hrc", q, self.k64) * self.scale
            p = np.exp(s - s.max(axis=2, keepdims=True))
            p /= p.sum(axis=2, keepdims=True)
            ref = np.einsum("hrc,hcd->hrd", p, self.v64).reshape(self.Hk * self.R, self.D)
            bound = self.tol * np.einsum("hrc,hcd->hrd", p, np.abs(self.v64)).reshape(
                self.Hk * self.R, self.D) + 1e-6
            self._ref = (ref, bound)
        return self._ref

def kernel_for(key, dtype: str = "bfloat16") -> str:
    """Which kernel a linear layer of shape (M, N, K) runs: gemv up to 16 rows (not fp64,
    as kernels/matmul.py routes it), else matmul."""
    return "gemv" if int(key[0]) <= 16 and dtype != "float64" else "matmul"


def tune(kernel: str, key: tuple, *, dtype, device, timer=None, candidates=None,
         budget_s: float = 120.0, run_budget_ms: float | None = None, warmup: int = 3,
         reps: int = 10, store: bool = True, cache_file: str | None = None, progress=None,
         seed: int = 0) -> dict:
    """Screen and time every candidate of `kernel` for `key`; return the cache entry (and
    store it in the user cache unless store=False). Raises ScreenError if no candidate is
    correct, KeyError for an undeclared kernel, ValueError for a device that cannot tune."""
    from . import device_identity, disabled, reload
    import nbxtensor as nbx
    t = get_tunable(kernel)
    device = nbx.device(device) if not hasattr(device, "type") else device
    dtype = nbx.dtypes.as_dtype(dtype).name
    ident = device_identity(device)
    if ident is None:
        raise ValueError(f"autotune: device {device} runs no Triton kernels; tune on cuda or interp")
    case_cls = CASES.get(kernel)
    if case_cls is None:
        raise KeyError(f"autotune: kernel {kernel!r} has a space but no sweep case "
                       f"(inputs + reference); cases exist for {', '.join(sorted(CASES))}")
    case = case_cls(tuple(key), dtype, device, seed=seed)
    cands = candidates if candidates is not None else case.candidates()
    if not cands:
        raise ValueError(f"autotune: the {kernel} space is empty for dtype {dtype}")
    outside = [c for c in cands if not t.contains(c, dtype)]
    if outside:
        raise ValueError(f"autotune: candidates outside the declared {kernel} space: {outside[:3]}")
    timer = timer or timer_for(device)
    t0 = time.perf_counter()
    with disabled():
        rep = screen(case, cands, progress=progress)
        screen_s = time.perf_counter() - t0
        # the untuned baseline: the kernel's own rule
        default_cfg = case.default_config()
        dropped, skipped, timed = [], [], []
        try:
            base = timer.measure(case.run_default, warmup=warmup, reps=reps)
            base_ms = base.median_ms
        except Exception as e:  # noqa: BLE001 - report, still tune the others
            base, base_ms = None, None
            dropped.append(dict(config=default_cfg, reason=f"default config failed: {e}"))
        budget_ms = run_budget_ms if run_budget_ms is not None else \
            max(2.0, 20 * base_ms) if base_ms else None
        t1 = time.perf_counter()
        for i, cfg in enumerate(rep.passed):
            if progress:
                progress("time", i, len(rep.passed))
            if time.perf_counter() - t1 > budget_s:
                skipped.append(cfg)
                continue
            try:
                tm = timer.measure(lambda c=cfg: case.run(c), warmup=warmup, reps=reps,
                                   budget_ms=budget_ms)
            except OverBudget as e:
                dropped.append(dict(config=cfg, reason=f"over budget: {e}"))
                continue
            except Exception as e:  # noqa: BLE001
                if context_poisoned(device):
                    raise DeviceFault(f"autotune: candidate {cfg} faulted the device while "
                                      f"being timed ({type(e).__name__}: {e}); nothing stored",
                                      config=cfg) from e
                dropped.append(dict(config=cfg, reason=f"timing failed: {type(e).__name__}: {e}"))
                continue
            timed.append((tm.median_ms, i, cfg, tm))
        if progress:
            progress("time", len(rep.passed), len(rep.passed))
    if not timed:
        raise ScreenError(f"autotune: {case.describe_key()}: no candidate passed the screen AND "
                          f"the timing (dropped: {dropped[:3]}, skipped: {len(skipped)})", rep)
    best_ms, _, best_cfg, best_tm = min(timed, key=lambda r: r[:2])
    screen_rec = dict(rep.record, excluded=[_short(x) for x in rep.excluded])
    timing = dict(best=best_tm.as_dict(), default_config=default_cfg,
                  default_ms=round(base_ms, 6) if base_ms is not None else None,
                  speedup=round(base_ms / best_ms, 4) if base_ms else None,
                  timed=len(timed), dropped=[_short(x) for x in dropped],
                  skipped_by_sweep_budget=len(skipped), run_budget_ms=budget_ms,
                  budget_s=budget_s, screen_s=round(screen_s, 3),
                  sweep_s=round(time.perf_counter() - t0, 3), raw_key=[int(v) for v in key])
    entry = _cache.make_entry(ident, kernel, t.bucket(tuple(key)), dtype, best_cfg,
                              screen_rec, timing)
    if store:
        _cache.store([entry], cache_file)
        reload()
    return entry


def _short(x: dict) -> dict:
    y = dict(x)
    if "deviation" in y:
        d = y["deviation"]
        y["deviation"] = "inf" if d == float("inf") else round(float(d), 4)
    return y


# --------------------------------------------------------------- fault isolation (cuda)
#
# A device fault (illegal address, ...) poisons the CUDA context of the process for good, so
# a sweep that must survive one runs each key in a child process: a faulting candidate is
# excluded (and reported in the entry) and the key is retried in a fresh child without it.

def _child(q, kernel, key, dtype, device, candidates, kw):
    try:
        e = tune(kernel, tuple(key), dtype=dtype, device=device, candidates=candidates,
                 store=False, **kw)
        q.put(("ok", e))
    except DeviceFault as err:
        q.put(("fault", dict(config=err.config, error=str(err))))
    except ScreenError as err:
        q.put(("screen", str(err)))
    except Exception as err:  # noqa: BLE001 - carried to the parent as text
        q.put(("error", f"{type(err).__name__}: {err}"))


def _run_child(kernel, key, dtype, device, candidates, kw, timeout_s=1800.0):
    import multiprocessing as mp
    import queue
    ctx = mp.get_context("spawn")          # a fresh interpreter: a fresh CUDA context
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q, kernel, key, dtype, str(device), candidates, kw))
    p.start()
    t0 = time.perf_counter()
    try:
        while True:
            try:
                return q.get(timeout=1.0)
            except queue.Empty:
                if not p.is_alive():
                    return ("error", f"the tuning process died (exit code {p.exitcode})")
                if time.perf_counter() - t0 > timeout_s:
                    p.kill()
                    return ("error", f"the tuning process took over {timeout_s:.0f} s")
    finally:
        p.join(timeout=30)


def tune_isolated(kernel: str, key: tuple, *, dtype, device, candidates=None, max_faults=4,
                  cache_file: str | None = None, run_child=None, **kw) -> dict:
    """`tune` in a child process, surviving device faults: each faulting candidate is
    excluded and reported, the key is retried without it (at most `max_faults` times).
    Stores the entry in the parent. Raises ScreenError / RuntimeError like tune."""
    import nbxtensor as nbx
    from . import reload
    run_child = run_child or _run_child
    kw.pop("store", None)
    kw.pop("progress", None)          # callbacks do not cross processes
    dt = nbx.dtypes.as_dtype(dtype).name
    faults = []
    cands = list(candidates) if candidates is not None else None
    while True:
        kind, payload = run_child(kernel, tuple(key), dt, device, cands, kw)
        if kind == "ok":
            payload["screen"]["excluded"] = faults + payload["screen"]["excluded"]
            payload["screen"]["candidates"] += len(faults)
            _cache.store([payload], cache_file)
            reload()
            return payload
        if kind == "fault":
            faults.append(dict(config=payload["config"], reason="device fault: " + payload["error"][:300]))
            if payload["config"] is None or len(faults) > max_faults:
                raise RuntimeError(f"autotune: {kernel} {key}: {len(faults)} device faults; giving "
                                   f"up: {payload['error']}")
            if cands is None:
                cands = _candidates_of(kernel, tuple(key), dt, device)
            cands = [c for c in cands if c != payload["config"]]
            continue
        if kind == "screen":
            raise ScreenError(payload)
        raise RuntimeError(f"autotune: {kernel} {key}: {payload}")


def _candidates_of(kernel, key, dtype, device):
    """The candidates a case would sweep, without building its (large) inputs on the device."""
    from .space import gemv_candidates, rows_candidates
    if kernel == "gemv":
        return gemv_candidates(dtype, int(key[0]))
    if kernel in ("rms_norm", "softmax"):
        return rows_candidates(dtype, int(key[1]))
    if kernel == "decode_attention":
        from .space import decode_candidates
        return decode_candidates(dtype)
    if kernel == "attention":
        from .space import attention_candidates
        return attention_candidates(dtype, int(key[3]))
    return get_tunable(kernel).candidates(dtype)
