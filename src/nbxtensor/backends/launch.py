"""Public kernel launch: `nbx.launch(kernel, grid, *args, **constexprs_and_options)`.

    import triton, triton.language as tl, nbxtensor as nbx

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)

    nbx.launch(add, (triton.cdiv(n, 1024),), x, y, out, n, BLOCK=1024, num_warps=4)

* Positional arguments fill the kernel's parameters in order: a Tensor becomes a typed
  pointer to its first element (its view offset included; strides are yours to pass),
  ints and floats pass as scalars (Triton's specialisation rules: ints by range as
  i32/i64/u64, floats as fp32, an int equal to 1 and None become constants).
* Keyword arguments are the kernel's constexpr parameters plus compile options
  (num_warps, num_stages, num_ctas, maxnreg, ...). Non-constexpr parameters go by position.
* `grid` is a tuple of 1 to 3 ints, or a callable taking the dict of bound arguments
  (as in Triton) and returning one. A grid with a zero dimension launches nothing; one with
  no dimension or more than 3 raises `GridError` (a ValueError, and a TypeError).
* The tensors' device picks the driver: `cuda` binds, compiles (Triton's on-disk cache),
  loads and launches through nbxtensor's own CUDA driver on `nbx.cuda.current_stream()`;
  `interp` runs Triton's interpreter over host memory. All tensors share one device.
* Refusals: a wrong number of arguments, an unknown keyword or a non-kernel raise
  `KernelArgumentError` (a TypeError); a tensor whose memory nbxtensor's allocator did
  not hand out raises `ForeignPointerError`; a kernel needing more shared memory than
  the device allows raises `OutOfResourcesError`; a failing CUDA call raises `CudaError`.
"""
from __future__ import annotations

from ..tensor import Tensor
from .cuda.launcher import launch as _cuda_launch   # imports neither triton nor libcuda
from .cuda.launcher import launch_items, launch_public  # noqa: F401 - launch_items: plans' path


def _device_of(args):
    dev = None
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            if dev is None:
                dev = a.device
            elif a.device != dev:
                raise ValueError(f"launch: argument {i} is on {a.device}, but an earlier tensor "
                                 f"argument is on {dev}; all tensors must share one device")
    if dev is None:
        raise ValueError("launch: no tensor argument, so the device is unknown")
    return dev


# nbx.launch(kernel, grid, *args, **kwargs): defined next to the cuda launcher so the cuda
# hot path costs one Python call; tensors elsewhere come back to `launch_other`.
launch = launch_public
launch.__doc__ = __doc__   # help(nbx.launch) shows the public description above


def launch_other(kernel, grid, args, kwargs) -> None:
    """Launch on the device of the tensor arguments when the first argument is not a cuda tensor."""
    for a in args:
        if isinstance(a, Tensor):
            if a.device.type == "cuda":
                return _cuda_launch(kernel, grid, args, kwargs, a.device)
            break
    dev = _device_of(args)
    if dev.type == "interp":
        return _interp_launch(kernel, grid, args, kwargs)
    raise ValueError(f"launch: tensors on {dev} cannot run Triton kernels; move them to "
                     f"'cuda' or 'interp' first")


def _interp_launch(kernel, grid, args, kwargs) -> None:
    if getattr(kernel, "archive_only", False) is True:
        from .cuda import aot
        raise RuntimeError(
            f"launch: kernel {aot.kernel_name(kernel)} on interp: the interpreter runs kernels "
            f"through Triton, and this process imported nbxtensor's kernels without it "
            f"({aot.compile_blocker(kernel)}); install the cuda extra (pip install "
            f"'nbxtensor[cuda]') and leave NBX_ARCHIVE_ONLY unset to use the interp device")
    from .cuda.launcher import GridError, _meta, _sig_of, bind, check_keywords
    from .interp.runner import HostPointer, run
    # the same checks as on cuda: argument count, keywords, kinds of values
    bind(kernel, args, kwargs)
    sig = _sig_of(kernel)
    check_keywords(sig, kwargs)
    if callable(grid) and not isinstance(grid, (tuple, list)):
        grid = grid(_meta(sig, args, kwargs))   # as on cuda: every bound argument by name
    if isinstance(grid, (tuple, list)) and not 1 <= len(grid) <= 3:
        raise GridError(f"launch: grid must have 1 to 3 dimensions, got {grid!r}")   # as on cuda
    if not isinstance(grid, (tuple, list)) or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in grid):
        raise TypeError(f"launch: grid must be a tuple of 1 to 3 non-negative ints or a callable "
                        f"returning one, got {grid!r}")
    if 0 in grid:
        return  # an empty grid launches nothing (as on cuda)
    hargs = [HostPointer(a.data_ptr(), a.dtype.triton) if isinstance(a, Tensor) else a
             for a in args]
    constexprs = {k: v for k, v in kwargs.items() if k in sig.index}
    run(kernel, tuple(grid), hargs, constexprs)


# ----------------------------------------------------------------------------- kernel[grid]
# Triton's own `kernel[grid](...)` cannot take nbxtensor tensors: JITFunction.run asks
# `triton.runtime.driver.active` for the device and stream first, and Triton's CUDA driver is
# active only where torch reports a GPU (`torch.cuda.is_available()`); its launcher then reads
# torch's stream. So `kernel[grid]` is routed here when any argument is an nbxtensor Tensor:
# the same launch as nbx.launch (our driver on cuda, our interpreter runner on interp). Calls
# without our tensors run Triton's own path untouched.

def _call_with_grid(kernel, grid, args, kwargs):
    from .cuda.launcher import _sig_of
    sig = _sig_of(kernel)
    by_kw = [k for k in kwargs if k in sig.index and not sig.params[sig.index[k]].is_constexpr]
    if by_kw:   # nbx.launch takes non-constexpr parameters by position: place them
        args = list(args)
        for i in range(len(args), 1 + max(sig.index[k] for k in by_kw)):
            p = sig.params[i]
            if p.name in kwargs:
                args.append(kwargs.pop(p.name))
            elif p.has_default:
                args.append(p.default)
            else:
                from .cuda.launcher import KernelArgumentError
                raise KernelArgumentError(f"kernel {sig.describe()}[grid]: missing argument "
                                          f"{p.name!r}")
    launch(kernel, grid, *args, **kwargs)


def _routing_getitem(original):
    def __getitem__(self, grid):
        run = original(self, grid)

        def call(*args, **kwargs):
            for a in args:
                if isinstance(a, Tensor):
                    return _call_with_grid(self, grid, args, kwargs)
            for a in kwargs.values():
                if isinstance(a, Tensor):
                    return _call_with_grid(self, grid, args, kwargs)
            return run(*args, **kwargs)
        return call
    __getitem__._nbx_routes = True
    return __getitem__


def patch_triton_getitem(jit_module) -> None:
    """Route `kernel[grid](...)` of @triton.jit kernels with nbxtensor tensors to nbx.launch."""
    cls = jit_module.JITFunction
    if not getattr(cls.__getitem__, "_nbx_routes", False):
        cls.__getitem__ = _routing_getitem(cls.__getitem__)
