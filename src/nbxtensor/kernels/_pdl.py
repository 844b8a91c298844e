"""Programmatic Dependent Launch (PDL) for the kernels of the decode step: one policy."""
from __future__ import annotations

from .. import config as _config
from ..backends.cuda.driver import CudaUnavailable
from ..device import Device
from ._common import device_facts

from ._triton import triton, tl  # Triton, or its stand-in without Triton

# ------------------------------------------------------------------ PDL policy
# Programmatic Dependent Launch (sm_90+): a kernel launched with launch_pdl=True may start
# while its predecessor in the stream finishes. Every such kernel takes `PDL: tl.constexpr`
# and, when it is set, in EVERY program: reads only read-only data (weights) before
# `gdc_wait()`, reads anything an earlier kernel wrote and writes anything an earlier kernel
# may still read only after it (the caching allocator reuses freed temporaries), then calls
# `gdc_launch_dependents()` so the next kernel's programs become resident and run their own
# prologue (weight prefetch) while this one works. A kernel that is not launched with PDL
# serialises fully, so mixing PDL and plain kernels in one step is correct. The interpreter
# has no griddepcontrol: PDL is off on interp/cpu. NBX_PDL=0 turns it off (A/B comparisons);
# `set_pdl(False)` does the same at run time. One place for the rule: `pdl_enabled(device)`.

_PDL_ON = _config.get("NBX_PDL")


def pdl_enabled(device) -> bool:
    """Whether the decode kernels launched on `device` use PDL: cuda of compute capability
    9.0 or newer (griddepcontrol is an sm_90 instruction), NBX_PDL != 0."""
    if not (_PDL_ON and getattr(device, "type", device) == "cuda"):
        return False
    if not isinstance(device, Device) or device.index is None:
        return True         # the policy for "cuda" by name; a launch asks with its device
    try:
        return device_facts(device).cc >= 90
    except CudaUnavailable:     # nothing launches without a driver: the policy alone answers
        return True


def set_pdl(on: bool) -> bool:
    """Turn PDL on or off for later launches (benchmarks, tests); returns the previous value.
    A CUDA graph keeps the setting it was captured with."""
    global _PDL_ON
    if not isinstance(on, bool):
        raise TypeError(f"set_pdl: on must be a bool, got {type(on).__name__}")
    prev, _PDL_ON = _PDL_ON, on
    return prev


def pdl_opts(device) -> dict:
    """The launch keywords for a PDL-capable kernel: PDL constexpr + the launch option."""
    on = pdl_enabled(device)
    return dict(PDL=True, launch_pdl=True) if on else dict(PDL=False)


@triton.jit
def _pdl_wait(PDL: tl.constexpr):
    """Wait for the previous kernel (its writes are visible after this), then let the next
    kernel's programs launch. No-op without PDL."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
