"""Triton kernels by family, with their launch configuration and Python entry.

Imported only on the first dispatch to a cuda or interp tensor (they import triton).
Each module registers its entries under the "triton" family with `dispatch.register`;
the launcher runs them on cuda through the driver, or on interp through Triton's
interpreter.
"""
