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
import os
import time

import numpy as np

from .. import dtypes as _dtypes
from ..creation import tensor as _tensor
from ..device import Device
from . import cache as _cache
from .screen import DeviceFault, ScreenError, context_poisoned, screen
from ..kernels._common import device_facts
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
        from ..tensor import Tensor
        self.M, self.N, self.K = (int(v) for v in key)
        self.dtype = _dtypes.as_dtype(dtype)
        self.device = device
        g = np.random.default_rng(seed)
        # the actual (rounded) inputs, kept in float64 for the reference
        x = g.standard_normal((self.M, self.K)).astype(self.dtype.np)
        w = g.standard_normal((self.N, self.K)).astype(self.dtype.np)
        self.x64, self.w64 = x.astype(np.float64), w.astype(np.float64)
        self.X = _tensor(x, device=device)
        self.W = _tensor(w, device=device)
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
        return {k: v for k, v in km.matmul_config(self.M, self.N, self.K, self.dtype,
                                                    device_facts(self.device)).items()}

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
        return gemv_candidates(self.dtype.name, self.M, device_facts(self.device).sms)

    def default_config(self):
        from ..kernels import gemv as kg
        from . import disabled
        with disabled():
            cfg = kg.gemv_config(self.M, self.N, self.K, self.dtype, device_facts(self.device))
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


def _tuned_dtype(case, dtype):
    """`dtype` as a DType, refused unless the case has a tolerance for it."""
    d = _dtypes.as_dtype(dtype)
    if d.name not in case.TOL:
        raise ValueError(f"autotune: {case.kernel} is tuned for {sorted(case.TOL)}, got {d.name}")
    return d


class _RowsCase:
    """A contiguous [R, N] input, one row op along N (the rows rule of norm/softmax)."""

    kernel = "?"
    TOL = {"bfloat16": 1.6e-2, "float16": 4e-3, "float32": 2e-5}

    def __init__(self, key, dtype, device, seed=0):
        from ..tensor import Tensor
        self.R, self.N = (int(v) for v in key)
        self.dtype = _tuned_dtype(self, dtype)
        self.device = device
        g = np.random.default_rng(seed)
        x = (g.standard_normal((self.R, self.N)) * 3).astype(self.dtype.np)
        self.x64 = x.astype(np.float64)
        self.x = _tensor(x, device=device)
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
        w = (1 + 0.1 * g.standard_normal(self.N)).astype(self.dtype.np)
        self.w64 = w.astype(np.float64)
        self.w = _tensor(w, device=self.device)

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

    def __init__(self, key, dtype, device, seed=0):
        from ..kernels import softmax as ks
        R, N = (int(v) for v in key)
        if ks.split_config(R, N, device_facts(device)) is not None:
            # every candidate would time the same split-row launches (it runs before the
            # autotune seam, with no config of the space), and no entry would ever be used
            raise ValueError(f"autotune: softmax {R}x{N} runs the split-row path (rows longer "
                             f"than {ks.MAX_SINGLE}, fewer than {ks.SPLIT_ROWS_PER_SM} a SM of them), "
                             f"which has no tunable config")
        super().__init__(key, dtype, device, seed)

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


class _AttentionCase:
    """What the attention cases share: q, k, v drawn in the case's dtype (kept in float64 for
    the reference), a tolerance that is a multiple of P @ |V|, the poisoned output."""

    kernel = "?"
    TOL = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 1e-4}

    def _draw(self, dtype, device, seed, q_shape, kv_shape):
        """q (q_shape), k and v (kv_shape), and an output shaped as q."""
        from ..tensor import Tensor
        self.dtype = _tuned_dtype(self, dtype)
        self.device = device
        g = np.random.default_rng(seed)
        q, k, v = (g.standard_normal(s).astype(self.dtype.np)
                   for s in (q_shape, kv_shape, kv_shape))
        self.q64, self.k64, self.v64 = (a.astype(np.float64)[0] for a in (q, k, v))
        self.q, self.k, self.v = (_tensor(a, device=device) for a in (q, k, v))
        self.out = Tensor._empty(q_shape, self.dtype, device)
        self.scale = 1.0 / math.sqrt(self.D)
        self.tol = self.TOL[self.dtype.name]
        self.tol_text = f"{self.tol:.3g} x (P @ |V|)"
        self._ref = None

    describe = _ProductCase.describe
    reset = _ProductCase.reset

    def run_default(self):
        self.run(None)


@register_case("attention")
class AttentionCase(_AttentionCase):
    """Self-attention of one sequence: q [1, H, L, D], k/v [1, Hk, L, D] (GQA); key
    (L, H, Hk, D[, causal]) -- a 4-long key is causal."""

    kernel = "attention"

    def __init__(self, key, dtype, device, seed=0):
        from .space import _attn_key
        self.L, self.H, self.Hk, self.D, self.causal = _attn_key(tuple(key))
        if self.H % self.Hk:
            raise ValueError(f"autotune: attention heads {self.H} not a multiple of kv heads {self.Hk}")
        self._draw(dtype, device, seed, (1, self.H, self.L, self.D), (1, self.Hk, self.L, self.D))
        self.rows = row_windows(self.L) if self.L > 1024 else [(0, self.L)]

    @property
    def M(self):
        return self.L

    def describe_key(self) -> str:
        return (f"attention L={self.L} H={self.H} Hk={self.Hk} D={self.D} "
                f"{'causal' if self.causal else 'full'} {self.dtype.name} on {self.device}")

    def candidates(self):
        # TMA candidates only where the TMA kernel runs (16-bit, head dim a power of two):
        # elsewhere sdpa would time the pointer kernel under a TMA label
        from .space import attention_sweep
        return attention_sweep(self.dtype.name, self.D, self.causal)

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
class DecodeAttentionCase(_AttentionCase):
    """Split-K decode of one query token per head: q [1, Hk*R, 1, D], caches [1, Hk, C, D]
    filled to capacity (lengths = C, so every split works); key (B*Hk, C, R, D) with B = 1.
    Reference: float64 NumPy attention of each query row over its kv head's C keys."""

    kernel = "decode_attention"

    def __init__(self, key, dtype, device, seed=0):
        self.Hk, self.C, self.R, self.D = (int(v) for v in key)
        self._draw(dtype, device, seed, (1, self.Hk * self.R, 1, self.D),
                   (1, self.Hk, self.C, self.D))
        self.lengths = _tensor(np.array(self.C, dtype=np.int32), device=device)
        self.rows = [(0, self.Hk * self.R)]      # small output: all of it is compared

    @property
    def M(self):
        return self.Hk * self.R

    def describe_key(self) -> str:
        return (f"decode_attention Hk={self.Hk} C={self.C} R={self.R} D={self.D} "
                f"{self.dtype.name} on {self.device}")

    def candidates(self):
        from .space import decode_candidates
        return decode_candidates(self.dtype.name, device_facts(self.device).sms)

    def default_config(self):
        from ..kernels import decode_attention as kd
        bd = max(16, 1 << (self.D - 1).bit_length())
        cfg = kd.decode_config(1, self.Hk, self.C, bd, bd, self.dtype.itemsize,
                               device_facts(self.device))
        return dict(TARGET=cfg["TARGET"], BLOCK_N=cfg["BLOCK_N"],
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


# long: the sweep loop: the time budget, fault isolation and progress share its state across candidates
def tune(kernel: str, key: tuple, *, dtype, device, timer=None, candidates=None,
         budget_s: float = 120.0, run_budget_ms: float | None = None, warmup: int = 3,
         reps: int = 10, store: bool = True, cache_file: str | None = None, progress=None,
         seed: int = 0) -> dict:
    """Screen and time every candidate of `kernel` for `key`; return the cache entry (and
    store it in the user cache unless store=False). Raises ScreenError if no candidate is
    correct, KeyError for an undeclared kernel, ValueError for a device that cannot tune."""
    from . import device_identity, disabled, reload
    t = get_tunable(kernel)
    device = Device(device) if not hasattr(device, "type") else device
    dtype = _dtypes.as_dtype(dtype).name
    ident = device_identity(device)
    if ident is None:
        raise ValueError(f"autotune: device {device} runs no Triton kernels; tune on cuda or interp")
    sms = device_facts(device).sms        # the space in waves of this device's SMs
    case_cls = CASES.get(kernel)
    if case_cls is None:
        raise KeyError(f"autotune: kernel {kernel!r} has a space but no sweep case "
                       f"(inputs + reference); cases exist for {', '.join(sorted(CASES))}")
    case = case_cls(tuple(key), dtype, device, seed=seed)
    pruned = None
    if candidates is not None:
        cands = candidates
    else:
        cands, pruned = prune_for_key(kernel, tuple(key), case.candidates(), case.default_config(),
                                      dtype, sms)
    if not cands:
        raise ValueError(f"autotune: the {kernel} space is empty for dtype {dtype}")
    outside = [c for c in cands if not t.contains(c, dtype, sms)]
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
    if pruned:
        screen_rec["pruned"] = pruned
    timing = dict(best=best_tm.as_dict(), default_config=default_cfg,
                  default_ms=round(base_ms, 6) if base_ms is not None else None,
                  speedup=round(base_ms / best_ms, 4) if base_ms else None,
                  timed=len(timed), dropped=[_short(x) for x in dropped],
                  skipped_by_sweep_budget=len(skipped), run_budget_ms=budget_ms,
                  budget_s=budget_s, screen_s=round(screen_s, 3),
                  sweep_s=round(time.perf_counter() - t0, 3), raw_key=[int(v) for v in key])
    # the rule's config outside the space (a kernel-side knob the space lacks) that beats
    # every candidate: an entry would make the op slower, so it is returned, not stored
    if base_ms is not None and best_ms > base_ms and not t.contains(default_cfg, dtype, sms):
        timing["rule_wins"] = True
    entry = _cache.make_entry(ident, kernel, t.bucket(tuple(key)), dtype, best_cfg,
                              screen_rec, timing)
    if store and not timing.get("rule_wins"):
        _cache.store([entry], cache_file)
        reload()
    return entry


def _launch_signature(kernel: str, key: tuple, cfg: dict, dtype: str):
    """What a config launches, for configs that differ only in a derived knob: gemv's TARGET
    and decode attention's TARGET set a split count, and two TARGETs giving the same split
    launch the same kernel on the same grid (timing both would only time noise)."""
    from .space import canon
    if kernel == "gemv":
        from .. import dtypes as _dt
        from ..kernels.gemv import _cdiv, k_slices
        M, N, K = (int(v) for v in key)
        split = k_slices(N, K, cfg, _dt.as_dtype(dtype).itemsize)
        return canon({**cfg, "TARGET": _cdiv(_cdiv(K, cfg["BLOCK_K"]), split)})
    if kernel == "decode_attention":
        from ..kernels.decode_attention import splits
        BH, C = int(key[0]), int(key[1])
        return canon({**cfg, "TARGET": splits(BH, C, cfg["TARGET"], cfg["BLOCK_N"])})
    return canon(cfg)


def prune_for_key(kernel: str, key: tuple, cands: list[dict], default: dict | None = None,
                  dtype: str = "bfloat16", sms: int | None = None):
    """(candidates, record or None): the space's `prune` rules (space.prune), then one
    config per distinct launch (`_launch_signature`; the rule's config wins a tie)."""
    from .space import canon, prune
    t = get_tunable(kernel)
    dtype_ok = None
    if default is not None and t.contains(default, dtype, sms):
        dtype_ok = default
        if not any(canon(c) == canon(default) for c in cands):
            cands = [dict(default)] + list(cands)    # the baseline is always a candidate
    kept, why = prune(kernel, key, cands, keep=dtype_ok, sms=sms)
    by_sig, order = {}, []
    for c in kept:
        sig = _launch_signature(kernel, key, c, dtype)
        if sig not in by_sig:
            by_sig[sig] = c
            order.append(sig)
        elif dtype_ok is not None and canon(c) == canon(dtype_ok):
            by_sig[sig] = c                    # keep the rule's spelling of this launch
    out = [by_sig[s] for s in order]
    dup = len(kept) - len(out)
    if dup:
        why["same launch as another TARGET (same split)"] = dup
    return out, (dict(of=len(cands), kept=len(out), rules=why) if why else None)


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

def _child(q, kernel, key, dtype, device, candidates, kw) -> str:
    try:
        e = tune(kernel, tuple(key), dtype=dtype, device=device, candidates=candidates,
                 store=False, **kw)
        q.put(("ok", e))
        return "ok"
    except DeviceFault as err:
        q.put(("fault", dict(config=err.config, error=str(err))))
        return "fault"
    except ScreenError as err:
        q.put(("screen", str(err)))
        return "screen"
    except Exception as err:  # noqa: BLE001 - carried to the parent as text
        q.put(("error", f"{type(err).__name__}: {err}"))
        return "error"


def _worker_loop(q_in, q_out):
    """A tuning process that serves keys until told to stop or until a device fault (its
    CUDA context is then dead): one interpreter start-up and one CUDA context for many keys."""
    while True:
        req = q_in.get()
        if req is None:
            return
        if _child(q_out, *req) == "fault":
            return


class _Worker:
    def __init__(self):
        import multiprocessing as mp
        ctx = mp.get_context("spawn")          # a fresh interpreter: a fresh CUDA context
        self.q_in, self.q_out = ctx.Queue(), ctx.Queue()
        self.p = ctx.Process(target=_worker_loop, args=(self.q_in, self.q_out), daemon=True)
        self.p.start()

    def ask(self, req, timeout_s):
        import queue
        self.q_in.put(req)
        t0 = time.perf_counter()
        while True:
            try:
                return self.q_out.get(timeout=0.5)
            except queue.Empty:
                if not self.p.is_alive():
                    return ("error", f"the tuning process died (exit code {self.p.exitcode})")
                if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                    self.p.kill()
                    return ("timeout", f"the tuning process took over {timeout_s:.0f} s")

    def close(self):
        if self.p.is_alive():
            try:
                self.q_in.put(None)
                self.p.join(timeout=5)
            except Exception:  # noqa: BLE001
                pass
            if self.p.is_alive():
                self.p.kill()
        self.p.join(timeout=5)


_WORKER: _Worker | None = None


def close_worker() -> None:
    """Stop the persistent tuning process (atexit does it too)."""
    global _WORKER
    if _WORKER is not None:
        _WORKER.close()
        _WORKER = None


def _run_child(kernel, key, dtype, device, candidates, kw, timeout_s=1800.0):
    """One key in the persistent tuning process (started on first use; replaced after a
    fault, a death or a timeout)."""
    global _WORKER
    if _WORKER is None or not _WORKER.p.is_alive():
        import atexit
        _WORKER = _Worker()
        atexit.register(close_worker)
    res = _WORKER.ask((kernel, key, dtype, str(device), candidates, kw), timeout_s)
    if res[0] in ("fault", "error", "timeout"):
        close_worker()
    if res[0] == "timeout":
        return ("error", res[1])
    return res


# ------------------------------------------------------------ parallel compiles (cuda)
#
# A cold sweep is mostly compiles (~0.2-1 s a candidate on the H200's host, one after the
# other in the screen). A Precompiler compiles a key's candidates first in a pool of
# processes -- each builds the same case and runs every candidate in dry mode (compiled,
# resource-checked, never launched), so no device fault can happen there -- filling Triton's
# on-disk cache; the screen then finds each kernel compiled. Errors there are ignored: the
# screen repeats the dry run and reports them.

_PC_CASE: dict = {}


def _precompile_task(kernel, key, dtype, device, configs, seed):
    from .screen import dry_launches
    dev = Device(device)
    ck = (kernel, tuple(key), dtype, seed)
    case = _PC_CASE.get(ck)
    if case is None:
        _PC_CASE.clear()                       # one key's inputs at a time
        case = _PC_CASE[ck] = CASES[kernel](tuple(key), dtype, dev, seed=seed)
    ok = 0
    for cfg in configs:
        try:
            with dry_launches():
                case.run(cfg)
            ok += 1
        except Exception:  # noqa: BLE001 - the screen reports it
            pass
    return ok


class Precompiler:
    """A pool of `workers` processes that compile candidates ahead of the screen."""

    def __init__(self, workers: int | None = None):
        self.workers = workers or max(1, min(12, (os.cpu_count() or 2) - 2))
        self._start()

    def _start(self):
        import concurrent.futures as cf
        import multiprocessing as mp
        self.pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))

    def run(self, kernel, key, dtype, device, candidates, seed=0, timeout_s=None) -> dict:
        """Compile `candidates` for the key; never raises (a broken pool -- a worker that
        died in a compile -- is replaced, and the screen compiles what is missing)."""
        import concurrent.futures as cf
        t0 = time.perf_counter()
        chunks = [candidates[i::self.workers] for i in range(self.workers)]
        try:
            futs = [self.pool.submit(_precompile_task, kernel, tuple(key), dtype, str(device),
                                     c, seed) for c in chunks if c]
            done, late = cf.wait(futs, timeout=timeout_s)
            ok = sum(f.result() for f in done if f.exception() is None)
            broken = any(isinstance(f.exception(), cf.process.BrokenProcessPool) for f in done)
        except Exception as e:  # noqa: BLE001 - precompiling is an optimisation only
            ok, late, broken = 0, [], f"{type(e).__name__}: {e}"
        if broken:
            self.close()
            self._start()
        return dict(compiled=ok, of=len(candidates), late_chunks=len(late),
                    seconds=round(time.perf_counter() - t0, 2),
                    **({"pool_restarted": str(broken)[:200]} if broken else {}))

    def close(self):
        self.pool.shutdown(wait=False, cancel_futures=True)


def candidates_for(kernel: str, key: tuple, dtype: str, device) -> list[dict]:
    """The candidates a sweep of this key on `device` screens (pruned), without device
    inputs."""
    sms = device_facts(Device(device)).sms
    return prune_for_key(kernel, tuple(key), _candidates_of(kernel, tuple(key), dtype, sms),
                         _default_of(kernel, tuple(key), dtype, device), dtype, sms)[0]


def _default_of(kernel, key, dtype, device):
    """The rule's config for a key on `device` (no device inputs), as the cases report it."""
    dt = _dtypes.as_dtype(dtype)
    try:
        if kernel == "matmul":
            from ..kernels import matmul as km
            return dict(km.matmul_config(*key, dt, device_facts(Device(device))))
        if kernel == "gemv":
            from ..kernels import gemv as kg
            from . import disabled
            with disabled():
                cfg = kg.gemv_config(*key, dt, device_facts(Device(device)))
            cfg.pop("K_SPLIT", None)
            return cfg
        if kernel in ("rms_norm", "softmax"):
            from ..kernels.softmax import row_config
            return row_config(int(key[1]))
        if kernel == "attention":
            from ..kernels import attention as ka
            from .space import _attn_key
            L, H, Hk, D, causal = _attn_key(key)
            return ka.flash_config(D, D, dt.itemsize, False, bool(causal))
        if kernel == "decode_attention":
            from ..kernels import decode_attention as kd
            BH, C, R, D = (int(v) for v in key)
            bd = max(16, 1 << (D - 1).bit_length())
            cfg = kd.decode_config(1, BH, C, bd, bd, dt.itemsize, device_facts(Device(device)))
            return dict(TARGET=cfg["TARGET"], BLOCK_N=cfg["BLOCK_N"],
                        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                        COMBINE=cfg["COMBINE"])
    except Exception:  # noqa: BLE001 - no default known: nothing is protected from pruning
        return None
    return None


def tune_isolated(kernel: str, key: tuple, *, dtype, device, candidates=None, max_faults=4,
                  cache_file: str | None = None, run_child=None, precompiler=None,
                  timeout_s: float | None = None, **kw) -> dict:
    """`tune` in a child process (a persistent one, replaced after a fault), surviving
    device faults: each faulting candidate is excluded and reported, the key is retried
    without it (at most `max_faults` times). Stores the entry in the parent. Raises
    ScreenError / RuntimeError like tune; a key over `timeout_s` is abandoned (RuntimeError).
    `precompiler` (a Precompiler) compiles the key's candidates in parallel first."""
    from . import reload
    t_start = time.perf_counter()
    kw.pop("store", None)
    kw.pop("progress", None)          # callbacks do not cross processes
    dt = _dtypes.as_dtype(dtype).name
    faults = []
    pruned = None         # the prune record, once the parent prunes (after a fault)
    cands = list(candidates) if candidates is not None else None
    if precompiler is not None and str(device).startswith("cuda"):
        pc = precompiler.run(kernel, key, dt, device,
                             cands if cands is not None else candidates_for(kernel, key, dt, device),
                             seed=kw.get("seed", 0), timeout_s=timeout_s)
    else:
        pc = None
    if run_child is None:     # one time limit for the whole key: compiles and retries included
        def run_child(*req):
            left = (1800.0 if timeout_s is None
                    else max(1.0, timeout_s - (time.perf_counter() - t_start)))
            return _run_child(*req, timeout_s=left)
    while True:
        kind, payload = run_child(kernel, tuple(key), dt, device, cands, kw)
        if kind == "ok" and pc is not None:
            payload["timing"]["precompile"] = pc
        if kind == "ok":
            payload["screen"]["excluded"] = faults + payload["screen"]["excluded"]
            payload["screen"]["candidates"] += len(faults)
            if pruned and "pruned" not in payload["screen"]:
                payload["screen"]["pruned"] = pruned    # a retry ran the pruned list as given
            if not payload["timing"].get("rule_wins"):
                _cache.store([payload], cache_file)
                reload()
            return payload
        if kind == "fault":
            faults.append(dict(config=payload["config"], reason="device fault: " + payload["error"][:300]))
            if payload["config"] is None or len(faults) > max_faults:
                raise RuntimeError(f"autotune: {kernel} {key}: {len(faults)} device faults; giving "
                                   f"up: {payload['error']}")
            if cands is None:
                sms = device_facts(Device(device)).sms
                cands, pruned = prune_for_key(kernel, tuple(key),
                                              _candidates_of(kernel, tuple(key), dt, sms),
                                              _default_of(kernel, tuple(key), dt, device), dt,
                                              sms)
            cands = [c for c in cands if c != payload["config"]]
            continue
        if kind == "screen":
            raise ScreenError(payload)
        raise RuntimeError(f"autotune: {kernel} {key}: {payload}")


def _candidates_of(kernel, key, dtype, sms):
    """The candidates a case would sweep on a device of `sms` SMs, without building its
    (large) inputs on the device."""
    from .space import gemv_candidates, rows_candidates
    if kernel == "gemv":
        return gemv_candidates(dtype, int(key[0]), sms)
    if kernel in ("rms_norm", "softmax"):
        return rows_candidates(dtype, int(key[1]))
    if kernel == "decode_attention":
        from .space import decode_candidates
        return decode_candidates(dtype, sms)
    if kernel == "attention":
        from .space import _attn_key, attention_sweep
        return attention_sweep(dtype, int(key[3]), _attn_key(tuple(key))[4])
    return get_tunable(kernel).candidates(dtype, sms)
