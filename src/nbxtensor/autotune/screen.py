"""The correctness screen: no candidate is timed before it has computed the right answer.

Every candidate runs once on the same inputs (the case's), with its output buffers
restored (NaN-poisoned) before each run, and its output is compared with a float64 host
reference for those inputs: the whole output for small keys, row windows for large ones
(the last window ends at the final row, where tails live). The tolerance follows the dtype
(and K, for products). A candidate that disagrees is excluded and reported with its
deviation (max |err| / tolerance bound; > 1 fails, NaN where a number belongs is inf).
If every candidate that ran disagrees, `screen` raises `ScreenError` instead of choosing.
A case without a reference screens nothing and says so in the record ("reference": "none").

Before a candidate is launched on cuda, each of its kernels is compiled and checked
against the device from the compiled metadata -- shared memory over the opt-in limit, or
more threads per block than its register use allows -- by running the candidate once in
"dry" mode (launches prepared, not issued). A launch that would fault a device for lack of
resources thus never happens; those candidates, compile errors and launch errors are
excluded and reported, and the sweep goes on. A genuine device fault (illegal address)
poisons the CUDA context for the whole process: the screen then raises `DeviceFault`,
naming the candidate, rather than pretend the others failed.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np


class ScreenError(RuntimeError):
    """Every candidate disagreed with the reference (or none could run)."""

    def __init__(self, msg, report=None):
        super().__init__(msg)
        self.report = report


class DeviceFault(RuntimeError):
    """A candidate faulted the device; the CUDA context of this process is unusable.
    `.config` is the candidate (sweep.tune_isolated retries the key without it)."""

    def __init__(self, msg, config=None):
        super().__init__(msg)
        self.config = config


@dataclass
class ScreenReport:
    passed: list = field(default_factory=list)       # configs that agreed
    excluded: list = field(default_factory=list)     # {"config", "reason", "deviation"?}
    record: dict = field(default_factory=dict)       # how it was screened (goes in the cache)


def _err_str(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}"
    return s if len(s) <= 300 else s[:297] + "..."


def deviation(result: np.ndarray, ref: np.ndarray, bound: np.ndarray) -> tuple[float, int]:
    """(max |result - ref| / bound, number of elements over 1); NaN/inf where the reference
    is finite count as infinitely far."""
    result = np.asarray(result, np.float64)
    if result.shape != ref.shape:
        return float("inf"), int(ref.size)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(result - ref)
    same_special = (np.isnan(ref) & np.isnan(result)) | (np.isinf(ref) & (ref == result))
    err = np.where(same_special, 0.0, err)
    err = np.where(np.isnan(err), np.inf, err)
    ratio = err / bound
    n_bad = int(np.count_nonzero(ratio > 1.0))
    return (float(ratio.max()) if ratio.size else 0.0), n_bad


# ------------------------------------------------------------------ dry-run resource check

@contextlib.contextmanager
def dry_launches():
    """Within: nbx launches on cuda are compiled and resource-checked but not issued."""
    from ..backends import launch as L
    real = L.launch

    def dry(kernel, grid, *args, **kwargs):
        from ..tensor import Tensor
        dev = next((a.device for a in args if isinstance(a, Tensor)), None)
        if dev is None or dev.type != "cuda":
            return None
        check_resources(kernel, args, kwargs, dev.index or 0)

    L.launch = dry
    try:
        yield
    finally:
        L.launch = real


def check_resources(kernel, args, kwargs, dev: int) -> None:
    """Compile `kernel` for these arguments and refuse it (OutOfResourcesError) if the device
    cannot run it: shared memory over the opt-in limit (the launcher's own check), or a block
    larger than the function's register use allows (cuFuncGetAttribute MAX_THREADS_PER_BLOCK)."""
    from ..backends.cuda import driver as drv
    from ..backends.cuda import launcher
    e = launcher._prepare(kernel, args, kwargs, dev)   # compiles; raises on shared memory
    if getattr(e, "cpos", None):
        return                                          # constexprs by position: not checkable here
    f = e.f.value
    max_threads = drv.func_get_attribute(f, "MAX_THREADS_PER_BLOCK")
    if e.block > max_threads:
        regs = drv.func_get_attribute(f, "NUM_REGS")
        raise launcher.OutOfResourcesError(
            f"kernel {e.name} uses {regs} registers a thread, so at most {max_threads} threads a "
            f"block, but the config asks for {e.block} (num_warps={e.block // 32})")


def context_poisoned(device) -> bool:
    if device.type != "cuda":
        return False
    from ..backends.cuda import driver as drv
    try:
        drv.ctx_synchronize()
        return False
    except drv.CudaError:
        # launch refusals are returned by cuLaunchKernel and leave the context usable; an
        # error that surfaces at synchronize is a kernel fault, which is sticky
        return True


# ------------------------------------------------------------------------------ the screen

def screen(case, candidates: list[dict], *, progress=None) -> ScreenReport:
    """Run each candidate once on `case` and keep those that agree with its reference.

    `case` provides: device, run(config), reset(), result() -> float64 array of the compared
    part, reference() -> (ref, bound) for the same part or None, describe() -> str of what
    is compared. Raises ScreenError when no candidate agrees."""
    rep = ScreenReport()
    refb = case.reference()
    has_ref = refb is not None
    rep.record = dict(reference="float64 host" if has_ref else "none: candidates not compared",
                      compared=case.describe() if has_ref else None,
                      tolerance=getattr(case, "tol_text", None) if has_ref else None,
                      candidates=len(candidates))
    worst_pass = 0.0
    ran = 0
    for i, cfg in enumerate(candidates):
        if progress:
            progress("screen", i, len(candidates))
        if case.device.type == "cuda":
            try:
                with dry_launches():
                    case.run(cfg)
            except Exception as e:  # noqa: BLE001 - any refusal excludes the candidate
                rep.excluded.append(dict(config=cfg, reason="resources/compile: " + _err_str(e)))
                continue
        try:
            case.reset()
            case.run(cfg)
            res = case.result()
        except Exception as e:  # noqa: BLE001
            if context_poisoned(case.device):
                raise DeviceFault(f"autotune: candidate {cfg} faulted the device ({_err_str(e)}); "
                                  f"the CUDA context of this process is unusable, nothing was "
                                  f"stored. Remove the config from the space and rerun.",
                                  config=cfg) from e
            rep.excluded.append(dict(config=cfg, reason="launch/run: " + _err_str(e)))
            continue
        ran += 1
        if not has_ref:
            rep.passed.append(cfg)
            continue
        ref, bound = refb
        dev, n_bad = deviation(res, ref, bound)
        if n_bad:
            rep.excluded.append(dict(config=cfg, reason=f"wrong result: {n_bad} of {ref.size} "
                                                        f"elements outside tolerance",
                                     deviation=dev))
        else:
            worst_pass = max(worst_pass, dev)
            rep.passed.append(cfg)
    if progress:
        progress("screen", len(candidates), len(candidates))
    rep.record.update(passed=len(rep.passed), worst_passing_deviation=round(worst_pass, 4)
                      if has_ref else None)
    if not rep.passed:
        why = "every candidate that ran disagreed with the float64 reference" if ran else \
            "no candidate could run"
        lines = "; ".join(f"{x['config']}: {x['reason']}" +
                          (f" (deviation {x['deviation']:.3g})" if "deviation" in x else "")
                          for x in rep.excluded[:5])
        raise ScreenError(f"autotune: {case.describe_key()}: {why}; refusing to choose. "
                          f"First exclusions: {lines}", rep)
    return rep
