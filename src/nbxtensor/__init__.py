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
from .device import get_default_device, set_default_device  # noqa: E402,F401
from .tensor import Size, Tensor, broadcast_shapes
from .tensor import (channels_last, channels_last_3d, contiguous_format,  # noqa: F401
                     memory_format, preserve_format)
from .creation import (arange, as_tensor, empty, empty_like, eye, from_numpy, frombuffer, full,
                       full_like, linspace, ones, ones_like, scalar_tensor, tensor, zeros,
                       zeros_like)
from .ops import *  # noqa: F401,F403  - the op surface; attaches Tensor methods
from . import ops as _ops
from .ops.factories import logspace  # noqa: E402,F401
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

_LAZY = {"cuda": "nbxtensor.cuda", "testing": "nbxtensor.testing", "jit": "nbxtensor.jit", "special": "nbxtensor.special", "io": "nbxtensor.io", "models": "nbxtensor.models",
         "linalg": "nbxtensor.linalg", "nn": "nbxtensor.nn", "fft": "nbxtensor.fft",
         "audio": "nbxtensor.audio",
         "distributed": "nbxtensor.distributed", "distributions": "nbxtensor.distributions"}


def __getattr__(name):
    # submodules that may pull in heavier imports load on first use
    if name in _LAZY:
        import importlib
        mod = importlib.import_module(_LAZY[name])
        globals()[name] = mod
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


def save(obj, f, pickle_module=None, pickle_protocol=2, _use_new_zipfile_serialization=True):
    """torch.save for tensors and containers of them (a state dict): torch's zip format, read
    by torch.load(weights_only=True) and nbx.load. See nbxtensor.io.torch_save."""
    if pickle_module is not None or pickle_protocol != 2 or _use_new_zipfile_serialization is not True:
        raise ValueError("save: only torch's default format is written (pickle_module=None, "
                         "pickle_protocol=2, the zip format)")
    from .io.torch_save import save_torch
    save_torch(obj, f)


def is_tensor(x) -> "builtins.bool":  # noqa: F821
    return isinstance(x, Tensor)


def is_floating_point(input) -> "builtins.bool":  # noqa: A002,F821
    return input.is_floating_point()


def is_nonzero(input) -> "builtins.bool":  # noqa: A002,F821
    if input.numel() != 1:
        raise RuntimeError(f"Boolean value of Tensor with {'no values' if input.numel() == 0 else 'more than one value'} is ambiguous")
    return builtins.bool(input.item())


def numel(input) -> "builtins.int":  # noqa: A002,F821
    return input.numel()


import builtins  # noqa: E402
import math as _math  # noqa: E402

inf, nan, pi, e = _math.inf, _math.nan, _math.pi, _math.e
newaxis = None
strided = "strided"   # torch.strided, the only layout (a name; layout= accepts it)

_NUM_THREADS = [0]


def get_num_threads() -> "builtins.int":  # noqa: F821
    """NumPy's threads are its BLAS's; this reports the count set with set_num_threads (the
    machine's cores until then) and changes nothing else."""
    import os
    return _NUM_THREADS[0] or (os.cpu_count() or 1)


def set_num_threads(n) -> None:
    """Recorded for get_num_threads; the cpu backend's BLAS keeps its own thread count."""
    if isinstance(n, builtins.bool) or not isinstance(n, builtins.int) or n <= 0:
        raise ValueError(f"set_num_threads: expected a positive int, got {n!r}")
    _NUM_THREADS[0] = n


def get_num_interop_threads() -> "builtins.int":  # noqa: F821
    return 1


def set_num_interop_threads(n) -> None:
    pass


_DETERMINISTIC = [False]


def use_deterministic_algorithms(mode, *, warn_only=False) -> None:
    """Accepted (a flag read back by are_deterministic_algorithms_enabled): every op here is
    already deterministic for a given device and shape, except atomics-based scatter_add and
    index_add on cuda with repeated indices."""
    _DETERMINISTIC[0] = builtins.bool(mode)


def are_deterministic_algorithms_enabled() -> "builtins.bool":  # noqa: F821
    return _DETERMINISTIC[0]


def _axis_aliases():
    """torch accepts NumPy's `axis` for `dim` and `keepdims` for `keepdim` in its reductions
    and dim-taking ops (x.sum(axis=1, keepdims=True)); the same names are accepted here, by a
    wrapper that renames them (a call without keywords goes straight through)."""
    import functools

    def alias(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if kwargs:
                if "axis" in kwargs:
                    if "dim" in kwargs:
                        raise TypeError(f"{fn.__name__}(): got both dim and its alias axis")
                    kwargs["dim"] = kwargs.pop("axis")
                if "keepdims" in kwargs:
                    if "keepdim" in kwargs:
                        raise TypeError(f"{fn.__name__}(): got both keepdim and its alias "
                                        f"keepdims")
                    kwargs["keepdim"] = kwargs.pop("keepdims")
            return fn(*args, **kwargs)
        call._nbx_axis_alias = True
        return call

    names = ("sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "std",
             "var", "std_mean", "var_mean", "any", "all", "logsumexp", "cumsum", "cumprod",
             "softmax", "log_softmax", "sort", "argsort", "topk", "cat", "concat", "concatenate",
             "stack", "squeeze", "unsqueeze", "median", "nanmedian", "kthvalue",
             "count_nonzero", "norm", "unbind", "chunk", "split", "narrow", "select",
             "index_select", "gather", "cummax", "cummin", "aminmax", "nansum", "nanmean",
             "quantile", "nanquantile", "unique", "repeat_interleave", "diff", "take_along_dim",
             "tensor_split", "vector_norm", "msort", "unique_consecutive")
    g = globals()
    for n in names:
        f = g.get(n)
        if f is not None and not getattr(f, "_nbx_axis_alias", False):
            g[n] = alias(f)
        m = Tensor.__dict__.get(n)
        if m is not None and callable(m) and not getattr(m, "_nbx_axis_alias", False):
            setattr(Tensor, n, alias(m))


_axis_aliases()


def det(input):  # noqa: A002
    from .linalg import det as _det
    return _det(input)


def inverse(input, *, out=None):  # noqa: A002
    from .linalg import inv
    return inv(input, out=out)


def logdet(input):  # noqa: A002
    from .linalg import slogdet
    sign, logabs = slogdet(input)
    return _ops.where(sign < 0, float("nan"), logabs)


def slogdet(input):  # noqa: A002
    from .linalg import slogdet as _s
    return _s(input)


def pinverse(input, rcond=1e-15):  # noqa: A002
    from .linalg import pinv
    return pinv(input, rtol=rcond)


def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None,  # noqa: A001
            options=None, disable=False):
    """torch.compile: nbxtensor runs eagerly (its speed comes from its own kernels and CUDA
    graphs), so the model or function is returned unchanged; `@torch.compile` and
    `@torch.compile(mode=...)` work as decorators."""
    if model is None:
        return lambda m: m
    return model


class autocast:
    """torch.autocast (also torch.amp.autocast / torch.cuda.amp.autocast): accepted when
    disabled (enabled=False), a no-op then. Enabled autocast is refused: nbxtensor does not
    re-type ops by a region's policy; cast the model and inputs (model.half(), x.bfloat16())."""

    def __init__(self, device_type="cuda", dtype=None, enabled=True, cache_enabled=None):
        if enabled:
            raise NotImplementedError(
                f"autocast(device_type={device_type!r}, dtype={dtype}) is not supported: "
                f"nbxtensor has no autocast; cast the model and inputs with .to(dtype) instead "
                f"(autocast(enabled=False) is accepted)")
        self.device = device_type
        self.fast_dtype = dtype
        self._enabled = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __call__(self, fn):
        return fn


class _Namespace:
    """Attribute bag standing in for a torch backend-flags module (torch.backends.cudnn)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def is_available(self):
        return False


def _legacy_types():
    """torch.FloatTensor(data) & co.: the legacy typed constructors, as functions."""
    def make(dt, name):
        def ctor(*args, device=None):
            if not args:
                return empty(0, dtype=dt, device=device)
            if builtins.all(isinstance(a, builtins.int) and not isinstance(a, builtins.bool)
                            for a in args):
                return empty(args, dtype=dt, device=device)
            if len(args) != 1:
                raise TypeError(f"{name}(): expected sizes (ints) or one sequence of data")
            data = args[0]
            if isinstance(data, Tensor):
                return data.to(dt)
            return tensor(data, dtype=dt, device=device)
        ctor.__name__ = ctor.__qualname__ = name
        ctor.__doc__ = f"torch.{name}: a {dt.name} tensor from data or sizes."
        return ctor
    g = globals()
    for name, dt in (("FloatTensor", float32), ("DoubleTensor", float64), ("HalfTensor", float16),
                     ("BFloat16Tensor", bfloat16), ("LongTensor", int64), ("IntTensor", int32),
                     ("ShortTensor", int16), ("CharTensor", int8), ("ByteTensor", uint8),
                     ("BoolTensor", bool)):
        g[name] = make(dt, name)


_legacy_types()


def _factory_keywords():
    """torch's factories take requires_grad=, pin_memory=, layout= and memory_format=: the
    values that change nothing here are accepted (requires_grad=False, layout=strided,
    memory_format=None/contiguous_format/preserve_format), pin_memory=True returns the cpu
    result in pinned memory (Tensor.pin_memory), and the rest is refused, as
    requires_grad_(True) is."""
    import functools

    def accept(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            pin = False
            if kwargs:
                rg = kwargs.pop("requires_grad", False)
                if rg:
                    raise RuntimeError(f"{fn.__name__}(requires_grad=True): nbxtensor has no "
                                       f"autograd; tensors cannot require grad")
                pin = kwargs.pop("pin_memory", False)
                lay = kwargs.pop("layout", None)
                if lay not in (None, strided):
                    raise NotImplementedError(f"{fn.__name__}: only layout=strided is supported, "
                                              f"got {lay!r}")
                mf = kwargs.pop("memory_format", None)
                if mf not in (None, contiguous_format, preserve_format):
                    raise NotImplementedError(f"{fn.__name__}: memory_format={mf!r} is not "
                                              f"supported by factories (use .contiguous("
                                              f"memory_format=...))")
            out = fn(*args, **kwargs)
            return out.pin_memory() if pin else out
        call._nbx_factory = True
        return call

    g = globals()
    for n in ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace",
              "logspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like", "rand",
              "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
              "scalar_tensor", "normal"):
        f = g.get(n)
        if f is not None and not getattr(f, "_nbx_factory", False):
            g[n] = accept(f)


_factory_keywords()


def _random_methods():
    # x.multinomial(n) as torch's method
    if "multinomial" not in Tensor.__dict__:
        from .random import multinomial as _mn

        def multinomial(self, num_samples, replacement=False, *, generator=None):
            return _mn(self, num_samples, replacement, generator=generator)
        Tensor.multinomial = multinomial


_random_methods()

from . import backends as _backends_pkg  # noqa: E402
# torch.backends.cudnn / mps flags that scripts set: accepted, and read back
for _n, _ns in (("cudnn", _Namespace(benchmark=False, deterministic=False, enabled=True,
                                      allow_tf32=True)),
                ("mps", _Namespace())):
    if not hasattr(_backends_pkg, _n):
        setattr(_backends_pkg, _n, _ns)
del _n, _ns

amp = _Namespace(autocast=autocast)   # torch.amp.autocast
