"""Run a @triton.jit kernel with Triton's interpreter over host memory, without torch.

Triton 3.6's interpreter reads each pointer argument's address with `data_ptr()`,
and its grid executor also calls torch's storage API on it (untyped_storage, cpu,
new_empty, set_, storage_offset, size, stride, copy_) to stage device memory on the
host and back. Our interp memory already is host memory, so `HostPointer` answers
those calls with no-ops and the kernel reads and writes the tensor in place.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import triton.experimental.gluon  # noqa: F401 - imported lazily by the first launch; its
# module code asserts tl.cdiv & co. are JITFunctions, so it must load before we swap them
import triton.runtime.interpreter as _interp_mod
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from ... import plans as _plans


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


def _fixed_patch_lang_tensor(tensor, scope):
    # Triton 3.6 turns a scalar into int() of a 1-element 1-D array, which NumPy >= 2.3
    # refuses; `range(0, K, BLOCK)` over a runtime scalar would fail. Same patch, fixed.
    _orig_patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


_orig_patch_lang_tensor = _interp_mod._patch_lang_tensor
_interp_mod._patch_lang_tensor = _fixed_patch_lang_tensor


def _fixed_create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    # Triton 3.6's interpreter keeps bf16 as raw uint16 and would multiply the bit patterns;
    # widen bf16 operands to fp32 first (exact), then the original dot runs
    import triton.language as tl
    if a.dtype.scalar == tl.bfloat16:
        a = self.cast_impl(a, tl.float32)
    if b.dtype.scalar == tl.bfloat16:
        b = self.cast_impl(b, tl.float32)
    return _orig_create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)


_orig_create_dot = _interp_mod.InterpreterBuilder.create_dot
_interp_mod.InterpreterBuilder.create_dot = _fixed_create_dot


def _fixed_cast_impl(self, src, dst_type):
    # Triton 3.6's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even) and
    # casts other floats to bf16 through integer bits; do bf16 casts by the dtype table's rule
    import numpy as np
    import triton.language as tl

    from ... import dtypes as _dt
    s, d = src.dtype.scalar, dst_type.scalar
    if d == tl.bfloat16 and s.is_floating() and s != tl.bfloat16:
        data = _dt.cast(src.data, _dt.bfloat16).view(np.uint16)
        return _interp_mod.TensorHandle(data, d)
    if s == tl.bfloat16 and d != tl.bfloat16:
        data = src.data.view(_dt.bfloat16.np).astype(_interp_mod._get_np_dtype(dst_type))
        return _interp_mod.TensorHandle(data, d)
    return _orig_cast_impl(self, src, dst_type)


_orig_cast_impl = _interp_mod.InterpreterBuilder.cast_impl
_interp_mod.InterpreterBuilder.cast_impl = _fixed_cast_impl

@_plans.memoize("interp.functions", 4096)
def _interpreted_fn(fn) -> InterpretedFunction:
    """The interpreted twin of a @triton.jit function's Python function (made once)."""
    return InterpretedFunction(fn)


def _swap_jit_globals(fn, swapped: list, seen: set) -> None:
    """Replace every @triton.jit helper that `fn` can reach by its interpreted twin.

    The interpreter runs a kernel's rewritten source in the kernel's own module
    globals, where helpers are still JITFunctions (which refuse to be called from
    Python); we swap them for the duration of the launch, recursively.
    """
    _swap_namespace(fn.__globals__, swapped, seen, follow_lang=True)


def _swap_namespace(g: dict, swapped: list, seen: set, follow_lang: bool) -> None:
    """Swap the JITFunctions of one namespace (a kernel's globals or a triton.language module).

    follow_lang: also descend into the triton.language modules `g` names; only a kernel's
    own globals do that, a triton.language module's submodules are not followed.
    """
    if id(g) in seen:
        return
    seen.add(id(g))
    for name, value in list(g.items()):
        if isinstance(value, JITFunction):
            swapped.append((g, name, value))
            g[name] = _interpreted_fn(value.fn)
            _swap_jit_globals(value.fn, swapped, seen)
        elif (follow_lang and isinstance(value, types.ModuleType)
              and value.__name__.startswith("triton.language")):
            # tl.zeros, tl.sum, tl.cdiv, ... are @jit functions of triton.language itself
            _swap_namespace(vars(value), swapped, seen, follow_lang=False)


def _lang_objects() -> tuple:
    import triton.language as tl
    return (tl, tl.core, tl.core.tensor, tl.math, tl.core.tensor_descriptor_base)


def _snapshot_lang() -> list:
    return [(o, dict(vars(o))) for o in _lang_objects()]


def _restore_lang(snapshot: list) -> None:
    """Undo every change the interpreter left in triton.language.

    Triton 3.6's interpreter patches triton.language for a kernel and restores it, but a
    call to a nested @jit function (including Triton's own, e.g. tl.max from
    triton/language/standard.py) patches `triton.language.core` again and never
    restores it. Left patched, every later `triton.compile` in the process fails
    ("'block_argument' object has no attribute 'dtype'"), i.e. cuda after interp.
    """
    for obj, saved in snapshot:
        current = vars(obj)
        for name in [n for n in current if n not in saved]:
            delattr(obj, name)
        for name, value in saved.items():
            if current.get(name, _MISSING) is not value:
                setattr(obj, name, value)


_MISSING = object()


def run(kernel, grid, args, constexprs) -> None:
    """Launch `kernel` over `grid` with the interpreter; args are HostPointers and scalars."""
    fn = getattr(kernel, "fn", kernel)
    swapped: list = []
    snapshot = _snapshot_lang()
    # Triton's argument specialiser (native_specialize_impl) tries `import torch` when it
    # meets an object it does not know (our HostPointer); where torch is installed that
    # would load it into the process. A None entry makes that import fail, as it does
    # where torch is absent; a torch the user imported already is left alone.
    block_torch = "torch" not in sys.modules
    if block_torch:
        sys.modules["torch"] = None
    try:
        _swap_jit_globals(fn, swapped, set())
        # the interpreter computes every lane, masked ones too (on their `other=` values or
        # garbage), in NumPy: 0/0, log2(0) or a NaN cast there would warn, where a GPU
        # computes the same lanes silently; results are defined by the kernel, not by
        # NumPy's floating-point error flags
        with np.errstate(all="ignore"):
            _interpreted_fn(fn)[grid](*args, **constexprs)
    finally:
        for g, name, value in reversed(swapped):
            g[name] = value
        _restore_lang(snapshot)
        if block_torch and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
