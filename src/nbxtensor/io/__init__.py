"""Weight files: safetensors (read/write), GGUF (read, with our own dequantisation), PyTorch
checkpoints (read, without torch or running the file's pickle code) and sharded folders."""
from __future__ import annotations

from ..files import NotARegularFileError  # noqa: F401
from .safetensors import SafetensorsFile, load_file, safe_open, save_file  # noqa: F401
from .torch_checkpoint import UnsafeCheckpointError, load_torch  # noqa: F401
from .sharded import load_sharded  # noqa: F401

__all__ = ["safe_open", "load_file", "save_file", "SafetensorsFile", "GGUFFile", "load_gguf",
           "load_torch", "UnsafeCheckpointError", "NotARegularFileError", "load_sharded"]


def __getattr__(name):
    # gguf.py imports the `gguf` package; load it on first use only
    if name in ("GGUFFile", "load_gguf"):
        from . import gguf as _g
        return getattr(_g, name)
    raise AttributeError(f"module 'nbxtensor.io' has no attribute {name!r}")
