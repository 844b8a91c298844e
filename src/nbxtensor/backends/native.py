"""A native library opened once per process (libcuda, libnccl).

The first caller opens it under its module's lock. A failure is kept: every later call
raises the same reason at once instead of retrying, so a machine without the library
answers fast and the same way each time.
"""
from __future__ import annotations


def load_once(module, open_library, unavailable):
    """module._lib, opened first by open_library() (which sets module._lib and returns it, or
    raises `unavailable`) under module._lock; the reason of a failure stays in
    module._load_error and is raised again by every later call."""
    with module._lock:
        if module._lib is not None:
            return module._lib
        if module._load_error is not None:
            raise unavailable(module._load_error)
        try:
            return open_library()
        except unavailable as e:
            module._load_error = str(e)
            raise
