"""Host-side integer helpers for the kernel entries.

`triton.cdiv` and `triton.next_power_of_2` are JIT functions: calling them from Python costs
~1.5 us each, which adds up in a small op's launch path. These give the same results.
"""
from __future__ import annotations

import struct

_F64 = struct.Struct("<d")
_I64 = struct.Struct("<q")


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for b > 0 (== triton.cdiv)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n, 0 for n <= 0 (== triton.next_power_of_2)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def f64_bits(v) -> int:
    """A float64 scalar as the int64 with the same bits (float64 kernel arguments travel so:
    a Python float is passed to a kernel as float32)."""
    return _I64.unpack(_F64.pack(v))[0]
