"""Run a @triton.jit kernel with Triton's interpreter over host memory, without torch.

Triton 3.6's interpreter reads each pointer argument's address with `data_ptr()`,
and its grid executor also calls torch's storage API on it (untyped_storage, cpu,
new_empty, set_, storage_offset, size, stride, copy_) to stage device memory on the
host and back. Our interp memory already is host memory, so `HostPointer` answers
those calls with no-ops and the kernel reads and writes the tensor in place.
"""
from __future__ import annotations

from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction


class HostPointer:
    """Duck-typed stand-in for a torch tensor: an address and an element type."""

    __slots__ = ("_ptr", "dtype")

    def __init__(self, ptr: int, triton_dtype: str):
        self._ptr = ptr
        self.dtype = triton_dtype   # Triton's spelling ('fp32', 'bf16', 'u1', ...)

    def data_ptr(self) -> int:
        return self._ptr

    # --- the storage API the grid executor calls; all no-ops over host memory
    def untyped_storage(self):
        return self

    def cpu(self):
        return self

    def new_empty(self, *args, **kwargs):
        return HostPointer(self._ptr, self.dtype)

    def set_(self, storage, *args):
        self._ptr = storage._ptr
        return self

    def storage_offset(self) -> int:
        return 0

    def size(self):
        return ()

    def stride(self):
        return ()

    def copy_(self, other):
        return self


_interpreted: dict = {}


def _interpreted_fn(fn) -> InterpretedFunction:
    ifn = _interpreted.get(fn)
    if ifn is None:
        ifn = _interpreted[fn] = InterpretedFunction(fn)
    return ifn


def _swap_jit_globals(fn, swapped: list, seen: set) -> None:
    """Replace every @triton.jit helper that `fn` can reach by its interpreted twin.

    The interpreter runs a kernel's rewritten source in the kernel's own module
    globals, where helpers are still JITFunctions (which refuse to be called from
    Python); we swap them for the duration of the launch, recursively.
    """
    g = fn.__globals__
    if id(g) in seen:
        return
    seen.add(id(g))
    for name, value in list(g.items()):
        if isinstance(value, JITFunction):
            swapped.append((g, name, value))
            g[name] = _interpreted_fn(value.fn)
            _swap_jit_globals(value.fn, swapped, seen)


def run(kernel, grid, args, constexprs) -> None:
    """Launch `kernel` over `grid` with the interpreter; args are HostPointers and scalars."""
    fn = getattr(kernel, "fn", kernel)
    swapped: list = []
    _swap_jit_globals(fn, swapped, set())
    try:
        _interpreted_fn(fn)[grid](*args, **constexprs)
    finally:
        for g, name, value in reversed(swapped):
            g[name] = value
