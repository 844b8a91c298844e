"""Installs the `kernel[grid](nbx tensors)` routing (backends/launch.py) into Triton without
importing Triton: at once where triton.runtime.jit is loaded, else when it first loads."""
from __future__ import annotations

import sys

_JIT = "triton.runtime.jit"


def _patch(module) -> None:
    from .launch import patch_triton_getitem
    patch_triton_getitem(module)


class _AfterJitLoads:
    """Finds nothing itself: wraps the real loader of triton.runtime.jit to patch after it runs.
    (A meta-path finder needs only `find_spec`; importlib.abc's base would cost milliseconds
    of `import nbxtensor`.)"""

    def find_spec(self, name, path=None, target=None):
        if name != _JIT:
            return None
        sys.meta_path.remove(self)      # one use; the real finders answer
        from importlib.util import find_spec
        spec = find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _patch(module)
        loader.exec_module = exec_then_patch
        return spec


def install() -> None:
    mod = sys.modules.get(_JIT)
    if mod is not None:
        _patch(mod)
    elif not any(isinstance(f, _AfterJitLoads) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterJitLoads())
