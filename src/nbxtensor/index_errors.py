"""How an out-of-range index is described and reported, for every layer that checks one.

An index check carries a description `(op, what, lo, hi)`: the op's name, what the index
addresses, and the valid range [lo, hi) (lo None: the range is not known where the error is
raised). The cpu backends raise at once, the kernels record the description's tag in the
device flag (kernels/indexing.py) and raise at the op or at the next synchronising call;
both format the error with `oob_error`, so a bad index reads the same on every device.
"""
from __future__ import annotations

__all__ = ["oob_error", "positions_err", "lengths_err"]


def oob_error(err, bad) -> Exception:
    """The exception for index `bad` outside the range `err` = (op, what, lo, hi) describes
    (a ValueError when `what` is a DeviceValueError: a device-checked value, not an index)."""
    from .dispatch import DeviceValueError
    op, what, lo, hi = err
    if isinstance(what, DeviceValueError):
        return ValueError(f"{op}: {what}")
    if lo is None:
        return IndexError(f"{op}: index {bad} is out of range for {what}")
    rng = f"[{lo}, {hi - 1}]" if hi > lo else "empty (the dimension has size 0)"
    return IndexError(f"{op}: index {bad} is out of range for {what}; the valid range is {rng}")


def positions_err(op, C):
    """The description of KV-cache positions for a cache of capacity C: 0 .. C - 1."""
    return (op, f"positions (the KV cache holds {C} slots)", 0, C)


def lengths_err(C):
    """The same for decode attention's lengths: 0 .. C."""
    return ("decode_attention", f"lengths (the KV cache holds {C} slots)", 0, C + 1)


# When the kernels' recorded out-of-range indices are read. The state lives here, below both
# the op surface (set_index_check, deferred_index_checks) and the kernels that record and
# read the flags, so neither reaches into the other: CHECK_MODE[0] is 'async' or 'sync',
# DEFER[0] > 0 inside deferred_index_checks(), and the kernels install their flag reader
# when they load (before that no flag exists, so there is nothing to read).
CHECK_MODES = ("async", "sync")
CHECK_MODE = [None]     # set from NBX_INDEX_CHECK by ops.indexing at import
DEFER = [0]
_READER = [None]


def install_reader(read_all) -> None:
    """The kernels' `read_all()`: reads every device's flag, raising for a recorded index."""
    _READER[0] = read_all


def read_flags() -> None:
    """Read the recorded errors now (a sync on cuda); nothing to do before any index kernel."""
    read = _READER[0]
    if read is not None:
        read()
