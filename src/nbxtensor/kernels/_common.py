"""What the kernels' launch rules know about the device: `device_facts(device)`.

Launch configs are rules over these facts (e.g. "at least 2 programs per SM"), so one rule
sizes its grid for whichever chip it runs on. For cuda the facts come from the driver
(backends/cuda/driver.py, cuDeviceGetAttribute), asked once per device index.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeviceFacts", "INTERP", "device_facts"]


@dataclass(frozen=True)
class DeviceFacts:
    type: str               # "cuda" or "interp": the rules also size by device kind
    sms: int                # streaming multiprocessors
    l2_bytes: int           # L2 cache
    smem_per_block: int     # shared memory a block may opt in to (bytes)
    regs_per_sm: int        # 32-bit registers of one SM
    threads_per_sm: int     # resident threads one SM holds
    cc: int = 90            # compute capability, major * 10 + minor (PDL, TMA need 90)


# interp has no hardware: the Triton interpreter runs the programs one after another on the
# host, so no SM count is "true" there. It takes a fixed nominal machine shaped like the
# H200 the rules were measured on (132 SMs, 50 MiB L2, 227 KiB of shared memory a block,
# 64 Ki registers and 2048 threads an SM), so interp launches the grids a GPU of that shape would -- split-K,
# persistent programs, split rows -- and the interp tests exercise those paths. Rules that
# size interp for the interpreter's own cost (few, large programs) say so where they do.
INTERP = DeviceFacts("interp", sms=132, l2_bytes=50 << 20, smem_per_block=227 << 10,
                     regs_per_sm=64 << 10, threads_per_sm=2048)

_CUDA: dict = {}     # cuda device index -> DeviceFacts


def device_facts(device) -> DeviceFacts:
    """The facts of `device` (a Device of type cuda or interp; cuda asked once per index)."""
    t = device.type
    if t == "cuda":
        f = _CUDA.get(device.index)
        if f is None:
            f = _CUDA[device.index] = _ask_driver(device.index)
        return f
    if t == "interp":
        return INTERP
    raise ValueError(f"device_facts: device must be cuda or interp, got {device}")


def _ask_driver(index: int) -> DeviceFacts:
    from ..backends.cuda import driver as drv
    return DeviceFacts("cuda", sms=drv.device_attribute(index, "multiprocessors"),
                       l2_bytes=drv.device_attribute(index, "l2_cache_size"),
                       smem_per_block=drv.device_attribute(index,
                                                           "max_shared_memory_per_block_optin"),
                       regs_per_sm=drv.device_attribute(index,
                                                        "max_registers_per_multiprocessor"),
                       threads_per_sm=drv.device_attribute(index,
                                                           "max_threads_per_multiprocessor"),
                       cc=10 * drv.device_attribute(index, "major")
                       + drv.device_attribute(index, "minor"))
