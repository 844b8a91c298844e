"""Weight files: safetensors (read/write) and GGUF (read, with our own dequantisation)."""
from __future__ import annotations

from .safetensors import SafetensorsFile, load_file, safe_open, save_file  # noqa: F401

__all__ = ["safe_open", "load_file", "save_file", "SafetensorsFile", "GGUFFile", "load_gguf"]


def __getattr__(name):
    # gguf.py imports the `gguf` package; load it on first use only
    if name in ("GGUFFile", "load_gguf"):
        from . import gguf as _g
        return getattr(_g, name)
    raise AttributeError(f"module 'nbxtensor.io' has no attribute {name!r}")
