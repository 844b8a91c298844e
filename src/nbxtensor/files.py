"""The one check every loader makes before it opens a file: the path is a regular file.

Opening a FIFO for reading blocks until a writer appears (forever, for a stray named
pipe), and a character device can stream without end; neither is a weight file. So the
path is stat'ed first and anything but a regular file is refused by name, before `open`.
"""
from __future__ import annotations

import os
import stat

__all__ = ["regular_file", "NotARegularFileError"]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class NotARegularFileError(ValueError):
    """A loader was given a directory, FIFO, device or socket where it reads a file."""


def regular_file(path, what: str, *, missing_ok: bool = False) -> os.stat_result | None:
    """stat(path) when it is a regular file (symlinks followed); FileNotFoundError when it
    does not exist (None with missing_ok), NotARegularFileError for anything else.
    `what` names the file in the message ("safetensors", "config.json", ...)."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise FileNotFoundError(f"{what} {p!r} does not exist") from None
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
        raise NotARegularFileError(f"{what} {p!r} is {kind}, not a regular file")
    return st
