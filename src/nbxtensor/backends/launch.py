"""Public kernel launch: `nbx.launch(kernel, grid, *args, **constexprs)`.

Tensors among `args` become typed pointers; ints and floats pass as scalars; keyword
arguments are the kernel's constexprs plus launch options (num_warps, num_stages).
The device of the tensor arguments picks the driver: `cuda` compiles and launches
through our CUDA driver, `interp` runs Triton's interpreter over host memory.
"""
from __future__ import annotations

from ..tensor import Tensor

_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


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


def launch(kernel, grid, *args, **kwargs) -> None:
    """Launch a @triton.jit `kernel` on the device of its tensor arguments."""
    dev = _device_of(args)
    if dev.type == "interp":
        from .interp.runner import HostPointer, run
        hargs = [HostPointer(a.data_ptr(), a.dtype.triton) if isinstance(a, Tensor) else a
                 for a in args]
        constexprs = {k: v for k, v in kwargs.items() if k not in _LAUNCH_OPTIONS}
        if callable(grid):
            raise TypeError("launch: grid must be a tuple of ints (not a callable)")
        run(kernel, tuple(grid), hargs, constexprs)
    elif dev.type == "cuda":
        from .cuda.launcher import launch as cuda_launch
        cuda_launch(kernel, grid, args, kwargs, dev)
    else:
        raise ValueError(f"launch: tensors on {dev} cannot run Triton kernels; move them to "
                         f"'cuda' or 'interp' first")
