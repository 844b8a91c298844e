"""What the kernel modules import as `triton`, `tl` and `libdevice` (and Gluon's `gluon`,
`gl`, `hopper`): Triton itself where it imports, else nbxtensor's stand-in
(backends/cuda/_notriton.py), whose kernels launch from the kernel archive only.

`NBX_ARCHIVE_ONLY=1` takes the stand-in even where Triton is installed (read once, at
the first kernel module's import). `REAL` says which one this process has; `WHY` says why
it is the stand-in (the ImportError, or the switch).
"""
from __future__ import annotations

from .. import config as _config

WHY: str | None = None
if _config.get("NBX_ARCHIVE_ONLY"):
    WHY = "NBX_ARCHIVE_ONLY=1"
else:
    try:
        import triton
        import triton.language as tl
        from triton.language.extra import libdevice
    except ImportError as e:
        WHY = f"Triton cannot be imported ({e})"

REAL = WHY is None
if not REAL:
    from ..backends.cuda import _notriton
    from ..backends.cuda._notriton import libdevice, tl, triton  # noqa: F811
    _notriton.IN_USE = True

__all__ = ["triton", "tl", "libdevice", "REAL", "WHY"]


def __getattr__(name):
    # Gluon on first use: only its two kernel modules need it (a heavier import)
    if name not in ("gluon", "gl", "hopper"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if REAL:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia import hopper
    else:
        from ..backends.cuda._notriton import gl, gluon, hopper
    globals().update(gluon=gluon, gl=gl, hopper=hopper)
    return globals()[name]
