"""Factories: tensor, from_numpy, empty/zeros/ones/full, arange, linspace, eye, *_like."""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import dtypes as _dt
from .device import as_device, factory_device
from .tensor import Tensor, check_nbytes, normalize_size

__all__ = ["tensor", "as_tensor", "from_numpy", "frombuffer", "empty", "zeros", "ones", "full", "arange",
           "linspace", "eye", "empty_like", "zeros_like", "ones_like", "full_like", "scalar_tensor"]


def _host_to(arr: np.ndarray, device) -> Tensor:
    """Place a fresh host array on `device` (zero-copy on cpu)."""
    if device.type == "cpu":
        return Tensor._from_numpy_unchecked(arr if arr.flags.c_contiguous else arr.copy())
    out = Tensor._empty(arr.shape, _dt.as_dtype(arr.dtype), device)
    out.untyped_storage().from_host(0, arr)
    return out


def _check_host_built(shape, dtype, device) -> None:
    """arange, linspace and eye build their values in host memory, then place them on
    `device`: the size must fit both (checked before NumPy is asked)."""
    check_nbytes(shape, dtype, device)
    if not device.is_host:
        check_nbytes(shape, dtype, as_device("cpu"))


def _infer_dtype_of_data(data) -> _dt.DType:
    """torch.tensor's inference for Python data: bool < int64 < default float < the complex
    type of the default float."""
    kinds = set()

    def walk(x):
        if isinstance(x, Tensor):
            kinds.add(x.dtype.kind if x.dtype.kind != "u" else "i")
        elif isinstance(x, (bool, np.bool_)):
            kinds.add("b")
        elif isinstance(x, (int, np.integer)):
            kinds.add("i")
        elif isinstance(x, (float, np.floating)):
            kinds.add("f")
        elif isinstance(x, (complex, np.complexfloating)):
            kinds.add("c")
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, np.ndarray):
            kinds.add({"b": "b", "u": "i", "i": "i", "f": "f", "c": "c"}.get(x.dtype.kind, "?"))
        else:
            raise TypeError(f"tensor: data must be numbers, nested lists of numbers, NumPy "
                            f"arrays or tensors, got {type(x).__name__}")
    walk(data)
    if "c" in kinds:
        return _dt.to_complex(_dt.get_default_dtype())
    if "f" in kinds or not kinds:
        return _dt.get_default_dtype()
    if "i" in kinds:
        return _dt.int64
    return _dt.bool


def _check_fits(arr: np.ndarray, dtype, op: str, argname: str) -> None:
    """Every value of `arr` (Python numbers gathered by NumPy) fits the integer `dtype`: the
    scalar check (dtypes.check_scalar) on the first NaN/inf and on the extremes."""
    flat = arr.reshape(-1)
    if not flat.size:
        return
    if flat.dtype.kind == "f":
        bad = ~np.isfinite(flat)
        if bad.any():
            _dt.check_scalar(flat[bad][0], dtype, op, argname)
    _dt.check_scalar(flat.min(), dtype, op, argname)
    _dt.check_scalar(flat.max(), dtype, op, argname)


def tensor(data, dtype=None, device=None) -> Tensor:
    """A new tensor holding a copy of `data` (number, nested lists, NumPy array or tensor).

    A tensor `data` keeps its device unless `device` is given (torch). Python numbers in `data`
    must fit an integer `dtype` (OverflowError otherwise: nothing wraps, NaN and inf are
    refused); a NumPy array or tensor given as `data` is cast by the dtype table's rules, as
    torch does (a wider integer array wraps)."""
    dtype = None if dtype is None else _dt.as_dtype(dtype)
    if isinstance(data, Tensor):
        return data.to(device=data.device if device is None else as_device(device),
                       dtype=dtype or data.dtype, copy=True)
    device = factory_device(device)
    if isinstance(data, np.generic):  # a NumPy scalar keeps its dtype (as torch)
        data = np.asarray(data)
    if isinstance(data, np.ndarray):
        src_dtype = _dt.as_dtype(data.dtype, "data.dtype")
        arr = data
    else:
        src_dtype = _infer_dtype_of_data(data)
        target = dtype or src_dtype
        try:
            arr = np.array(data, dtype=np.float64 if src_dtype.is_floating_point else
                           np.complex128 if src_dtype.is_complex else src_dtype.np)
        except ValueError as e:
            raise ValueError(f"tensor: data is not a rectangular nested sequence of numbers ({e})") \
                from None
        except OverflowError:       # a Python int beyond int64
            arr = np.array(data, dtype=object if target.kind in "ui" else np.float64)
        if target.kind in "ui":
            _check_fits(arr, target, "tensor", "data element")
    dtype = dtype or src_dtype
    if src_dtype.is_complex and not dtype.is_complex:
        raise TypeError(f"tensor: complex data cannot be converted to {dtype.name} (the imaginary "
                        f"parts would be lost); take .real or .abs() of a complex tensor")
    with np.errstate(all="ignore"):
        # a device copy is the copy torch.tensor makes: no host copy first (for a large array
        # the fresh pages alone cost more than the staged upload)
        arr = _dt.cast(arr, dtype, copy=device.is_host)
    return _host_to(arr, device)


# other libraries' arrays that as_tensor takes without a copy: protocol attribute ->
# importer(obj) -> Tensor (dlpack.py registers the CUDA array interface's)
IMPORTERS: dict = {}


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """Like `tensor`, but returns `data` itself (or a view) when no copy is needed."""
    if isinstance(data, Tensor):
        return data.to(device=device if device is not None else data.device, dtype=dtype)
    if isinstance(data, np.ndarray) and factory_device(device).type == "cpu" and \
            (dtype is None or _dt.as_dtype(dtype).np == data.dtype):
        try:
            return from_numpy(data)
        except ValueError:
            pass
    if not isinstance(data, np.ndarray):
        for protocol, importer in IMPORTERS.items():    # CuPy, Numba: zero-copy, as torch's
            if hasattr(data, protocol):
                t = importer(data)
                return t.to(device=device if device is not None else t.device, dtype=dtype)
    return tensor(data, dtype=dtype, device=device)


def from_numpy(arr: np.ndarray) -> Tensor:
    """A cpu tensor sharing memory with `arr` (no copy)."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(arr).__name__}")
    _dt.as_dtype(arr.dtype, "from_numpy: arr.dtype")
    if any(s < 0 for s in arr.strides):
        raise ValueError(f"from_numpy: arrays with negative strides are not supported (strides "
                         f"{arr.strides}); pass arr.copy()")
    if any(s % arr.itemsize for s in arr.strides):
        raise ValueError(f"from_numpy: strides {arr.strides} are not multiples of the item size "
                         f"{arr.itemsize}; pass arr.copy()")
    return Tensor._from_numpy_unchecked(arr)


def frombuffer(buffer, *, dtype, count=-1, offset=0, requires_grad=False) -> Tensor:
    """A 1-D cpu tensor sharing memory with an object of the buffer protocol (bytearray,
    memoryview, mmap, array.array): `count` elements of `dtype` (-1: all that fit) from byte
    `offset`. A read-only buffer gives a read-only view (writes raise), where torch warns."""
    if requires_grad:
        raise RuntimeError("frombuffer: requires_grad=True is not supported (no autograd)")
    dt = _dt.as_dtype(dtype)
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(f"frombuffer: buffer must support the buffer protocol, got "
                        f"{type(buffer).__name__}") from None
    nbytes = view.nbytes
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < max(nbytes, 1):
        raise ValueError(f"frombuffer: offset must be an int in [0, {nbytes}), got {offset!r}")
    if not isinstance(count, int) or isinstance(count, bool) or count == 0 or count < -1:
        raise ValueError(f"frombuffer: count must be a positive int or -1, got {count!r}")
    avail = nbytes - offset
    if count == -1:
        if avail % dt.itemsize:
            raise ValueError(f"frombuffer: the buffer's {avail} bytes after offset {offset} are "
                             f"not a multiple of {dt.name}'s {dt.itemsize}-byte element")
        count = avail // dt.itemsize
    elif count * dt.itemsize > avail:
        raise ValueError(f"frombuffer: {count} elements of {dt.name} need {count * dt.itemsize} "
                         f"bytes, the buffer has {avail} after offset {offset}")
    arr = np.frombuffer(view.cast("B") if view.format != "B" or view.ndim != 1 else view,
                        dtype=np.uint8, count=count * dt.itemsize, offset=offset)
    if arr.ctypes.data % dt.itemsize:
        raise ValueError(f"frombuffer: byte offset {offset} leaves the data unaligned for "
                         f"{dt.name}")
    return Tensor._from_numpy_unchecked(arr.view(dt.np))


def empty(*size, dtype=None, device=None) -> Tensor:
    shape = normalize_size(size)
    return Tensor._empty(shape, _dt.as_dtype(dtype) if dtype is not None else _dt.get_default_dtype(),
                         factory_device(device))


def full(size, fill_value, dtype=None, device=None) -> Tensor:
    """A tensor filled with `fill_value`; the dtype follows the value when not given (torch)."""
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    if dtype is None:
        if isinstance(fill_value, (bool, np.bool_)):
            dtype = _dt.bool
        elif isinstance(fill_value, (int, np.integer)):
            dtype = _dt.int64
        elif isinstance(fill_value, numbers.Real):
            dtype = _dt.get_default_dtype()
        elif isinstance(fill_value, numbers.Complex):
            dtype = _dt.to_complex(_dt.get_default_dtype())
        else:
            raise TypeError(f"full: fill_value must be a number, got {type(fill_value).__name__}")
    dtype = _dt.as_dtype(dtype)
    fill_value = _dt.check_scalar(fill_value, dtype, "full", "fill_value")
    return empty(normalize_size((size,)), dtype=dtype, device=device).fill_(fill_value)


def zeros(*size, dtype=None, device=None) -> Tensor:
    return empty(*size, dtype=dtype, device=device).fill_(0)


def ones(*size, dtype=None, device=None) -> Tensor:
    return empty(*size, dtype=dtype, device=device).fill_(1)


def scalar_tensor(value, dtype=None, device=None) -> Tensor:
    return full((), value, dtype=dtype or _dt.get_default_dtype(), device=device)


def _like(t, dtype, device):
    if not isinstance(t, Tensor):
        raise TypeError(f"input: expected a Tensor, got {type(t).__name__}")
    return (t.shape, t.dtype if dtype is None else _dt.as_dtype(dtype),
            t.device if device is None else as_device(device))


def empty_like(input, dtype=None, device=None) -> Tensor:  # noqa: A002
    shape, dtype, device = _like(input, dtype, device)
    return Tensor._empty(shape, dtype, device)


def zeros_like(input, dtype=None, device=None) -> Tensor:  # noqa: A002
    return empty_like(input, dtype, device).fill_(0)


def ones_like(input, dtype=None, device=None) -> Tensor:  # noqa: A002
    return empty_like(input, dtype, device).fill_(1)


def full_like(input, fill_value, dtype=None, device=None) -> Tensor:  # noqa: A002
    shape, dtype, device = _like(input, dtype, device)
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    fill_value = _dt.check_scalar(fill_value, dtype, "full_like", "fill_value")
    return Tensor._empty(shape, dtype, device).fill_(fill_value)


def arange(start, end=None, step=1, dtype=None, device=None) -> Tensor:
    """Values from `start` up to (not including) `end` by `step`; int64 for int arguments."""
    if end is None:
        start, end = 0, start
    # a 0-dim tensor argument counts as its value (an int tensor keeps the result int64)
    start, end, step = (v.item() if isinstance(v, Tensor) else v for v in (start, end, step))
    for name, v in (("start", start), ("end", end), ("step", step)):
        if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v):
            raise ValueError(f"arange: {name} must be a finite number, got {v!r}")
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    if (end - start) * step < 0:
        raise ValueError(f"arange: upper bound and larger bound inconsistent with step sign "
                         f"(start={start}, end={end}, step={step})")
    all_int = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    dtype = _dt.as_dtype(dtype) if dtype is not None else (_dt.int64 if all_int else
                                                            _dt.get_default_dtype())
    device = factory_device(device)
    if all_int:     # computed in int64: start, step and the last value must fit it (`end`,
        # exclusive, need not: arange(2**63 - 2, 2**63) is [2**63 - 2, 2**63 - 1])
        n = max(0, -(-(end - start) // step))
        for name, v in (("start", start), ("step", step),
                        ("the last element", start + (n - 1) * step if n else 0)):
            _dt.check_scalar(v, _dt.int64, "arange", name)
    else:
        q = (end - start) / step
        if not math.isfinite(q):
            raise ValueError(f"arange: the number of elements (end - start) / step overflows "
                             f"(start={start}, end={end}, step={step})")
        n = math.ceil(q)
    _check_host_built((n,), dtype, device)
    if all_int:
        vals = start + step * np.arange(n, dtype=np.int64)
    else:
        vals = start + step * np.arange(n, dtype=np.float64)
    if n and dtype.kind in "ui":    # the values are monotonic: the ends decide
        _dt.check_scalar(vals[0], dtype, "arange", "start")
        _dt.check_scalar(vals[-1], dtype, "arange", "the last element")
    with np.errstate(all="ignore"):
        return _host_to(_dt.cast(vals, dtype), device)


def linspace(start, end, steps, dtype=None, device=None) -> Tensor:
    """`steps` evenly spaced values from `start` to `end` inclusive."""
    if not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"linspace: steps must be a non-negative int, got {steps!r}")
    dtype = _dt.as_dtype(dtype) if dtype is not None else _dt.get_default_dtype()
    device = factory_device(device)
    _check_host_built((int(steps),), dtype, device)
    start, end = (v.item() if isinstance(v, Tensor) else v for v in (start, end))
    if dtype.kind in "ui":
        for name, v in (("start", start), ("end", end))[:steps]:
            _dt.check_scalar(v, dtype, "linspace", name)
    vals = np.linspace(float(start), float(end), int(steps), dtype=np.float64)
    if dtype.kind in "ui":
        vals = np.trunc(vals)
        if steps:   # an int end near the dtype's limit can round up in float64
            _dt.check_scalar(vals.max(), dtype, "linspace", "element")
            _dt.check_scalar(vals.min(), dtype, "linspace", "element")
    with np.errstate(all="ignore"):
        return _host_to(_dt.cast(vals, dtype), device)


def eye(n, m=None, dtype=None, device=None) -> Tensor:
    m = n if m is None else m
    for name, v in (("n", n), ("m", m)):
        if not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"eye: {name} must be a non-negative int, got {v!r}")
    dtype = _dt.as_dtype(dtype) if dtype is not None else _dt.get_default_dtype()
    device = factory_device(device)
    _check_host_built((n, m), dtype, device)
    return _host_to(np.eye(n, m, dtype=dtype.np), device)
