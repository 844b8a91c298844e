"""nbxtensor: a tensor library for running neural networks in Python without PyTorch.

Tensors live on `cpu` (NumPy), `cuda` (our own driver, allocator and Triton launcher)
or `interp` (the same Triton kernels run by Triton's interpreter, for testing).
`import nbxtensor` imports neither triton nor torch.
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import dtypes
from .dtypes import (DType, all_dtypes, bfloat16, bool, double, finfo, float, float8_e4m3fn,  # noqa: A004
                     float8_e5m2, float16, float32, float64, get_default_dtype, half, iinfo, int,
                     int8, int16, int32, int64, long, promote_types, result_type,
                     set_default_dtype, short, uint8)
from .dtypes import cdouble, cfloat, complex64, complex128  # noqa: E402,F401
from .dtypes import DType as dtype  # torch spelling: isinstance(x, nbx.dtype)
from .device import Device
from .device import Device as device  # torch spelling: nbx.device("cuda:0")
from .tensor import Size, Tensor, broadcast_shapes
from .creation import (arange, as_tensor, empty, empty_like, eye, from_numpy, full, full_like,
                       linspace, ones, ones_like, scalar_tensor, tensor, zeros, zeros_like)
from .ops import *  # noqa: F401,F403  - the op surface; attaches Tensor methods
from . import ops as _ops
from . import random  # noqa: E402 - torch-identical cpu generators; replaces the sampler's Generator
from .random import (Generator, bernoulli, fork_rng, get_rng_state, initial_seed,  # noqa: E402
                     manual_seed, multinomial, normal, poisson, rand, rand_like, randint,
                     randint_like, randn, randn_like, randperm, seed, set_rng_state)
from .grad_mode import (enable_grad, inference_mode, is_grad_enabled,  # noqa: E402 - no-ops: no autograd
                        is_inference_mode_enabled, no_grad, set_grad_enabled)
from .ops.indexing import check_index_errors, set_index_check  # noqa: F401,E402 - cuda index-check mode
from .dlpack import from_dlpack  # noqa: E402 - DLPack / CUDA array interface import
from .signal import (bartlett_window, blackman_window, hamming_window,  # noqa: E402
                     hann_window, istft, kaiser_window, stft)
from .kv_cache import PagedKVCache  # noqa: E402,F401 - paged KV cache
from .ops.paged_attention import paged_decode_attention  # noqa: E402,F401
from .ops.quantized import QuantizedTensor  # noqa: E402,F401 - int4 GPTQ/AWQ weights
from .backends import triton_hook as _triton_hook  # noqa: E402
_triton_hook.install()   # `kernel[grid](nbx tensors)` launches as nbx.launch does (no torch)

_LAZY = {"cuda": "nbxtensor.cuda", "io": "nbxtensor.io", "models": "nbxtensor.models",
         "linalg": "nbxtensor.ops.linalg", "nn": "nbxtensor.nn", "fft": "nbxtensor.fft",
         "audio": "nbxtensor.audio",
         "distributed": "nbxtensor.distributed"}


def __getattr__(name):
    # submodules that may pull in heavier imports load on first use
    if name in _LAZY:
        import importlib
        mod = importlib.import_module(_LAZY[name])
        globals()[name] = mod   # nbx.linalg lives in ops/, so its import does not set this
        return mod
    if name == "launch":
        from .backends.launch import launch
        globals()["launch"] = launch   # later lookups skip this hook (it sits on the hot path)
        return launch
    raise AttributeError(f"module 'nbxtensor' has no attribute {name!r}")


def load(path, map_location=None, weights_only=True):
    """torch.load for checkpoints of tensors (.pth/.pt/.bin, zip or legacy format): the saved
    object with nbxtensor tensors; no code from the file runs. See nbxtensor.io.load_torch."""
    from .io.torch_checkpoint import load_torch
    return load_torch(path, map_location=map_location, weights_only=weights_only)


def is_tensor(x) -> "builtins.bool":  # noqa: F821
    return isinstance(x, Tensor)
