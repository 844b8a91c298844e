"""Tensor = storage + shape + strides (in elements) + offset + dtype.

Views (view, permute, expand, indexing, ...) only compute new metadata over the same
storage, so they are device-agnostic. Anything that touches element values goes
through `dispatch.impl`, which is the only place that knows about devices. The op
methods (`add`, `sum`, `__add__`, ...) are attached by `nbxtensor.ops`.
"""
from __future__ import annotations

import builtins
import math
import os

import numpy as np

from . import dtypes as _dt
from .device import Device, as_device
from .dispatch import impl
from .storage import ALLOCATE as _ALLOCATE, HostStorage, new_storage

_CPU = Device("cpu")

__all__ = ["Tensor", "Size"]


class Size(tuple):
    """A tensor's shape: a tuple of ints, with torch's `numel()`."""

    def numel(self) -> int:
        return math.prod(self)

    def __repr__(self):
        return f"nbxtensor.Size([{', '.join(map(str, self))}])"

    def __getitem__(self, i):
        r = tuple.__getitem__(self, i)
        return Size(r) if isinstance(i, slice) else r

    # torch.Size arithmetic stays a Size (x.shape[:-1] + (n,), x.shape * 2)
    def __add__(self, other):
        if not isinstance(other, tuple):
            return NotImplemented
        return Size(tuple.__add__(self, other))

    def __radd__(self, other):
        if not isinstance(other, tuple):
            return NotImplemented
        return Size(tuple.__add__(other, self))

    def __mul__(self, n):
        r = tuple.__mul__(self, n)
        return r if r is NotImplemented else Size(r)

    __rmul__ = __mul__


_prod = math.prod
_CONTIG: dict = {}   # shape -> contiguous strides, for Tensor._empty (small shapes repeat)


def new_contiguous(shape, stride, dtype, device, nbytes) -> "Tensor":
    """Tensor._empty(shape, dtype, device) for a caller that cached the rest: `shape` a Size,
    `stride` its contiguous strides, `nbytes` = numel * itemsize (the ops' fast paths)."""
    if nbytes > _UNCHECKED_NBYTES:
        check_nbytes(shape, dtype, device, nbytes)
    alloc = _ALLOCATE.get(device.type)
    t = _new_object(Tensor)
    t._storage = alloc(device, nbytes) if alloc is not None else new_storage(device, nbytes)
    t._shape = shape
    t._stride = stride
    t._offset = 0
    t._dtype = dtype
    return t


_new_object = object.__new__

MAX_SIZE = (1 << 63) - 1        # the largest size, numel or byte count (int64, as torch's)
_UNCHECKED_NBYTES = 1 << 30     # every device has more: smaller allocations skip the check
_HOST_MEMORY: list = []         # [bytes of physical memory], read once


def device_memory(device) -> int:
    """The bytes a tensor on `device` could ever occupy: the physical memory of the host for
    cpu and interp (where it cannot be read, the int64 limit); for cuda the int64 limit, as
    the caching allocator refuses what the GPU has no room for (OutOfMemoryError, naming the
    request and the device's free and total memory)."""
    if device.type == "cuda":
        return MAX_SIZE
    if not _HOST_MEMORY:
        try:
            _HOST_MEMORY.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (AttributeError, ValueError, OSError):
            _HOST_MEMORY.append(MAX_SIZE)
    return _HOST_MEMORY[0]


def check_nbytes(shape, dtype, device, nbytes=None) -> None:
    """Refuse, before anything is allocated, a tensor whose bytes overflow int64 or exceed what
    `device` has (MemoryError naming the shape, dtype, device and byte counts)."""
    if nbytes is None:
        nbytes = math.prod(shape) * dtype.itemsize
    limit = device_memory(device)
    if nbytes > limit:
        what = ("more than a byte count can hold (2**63 - 1)" if limit == MAX_SIZE else
                f"more than the {limit} bytes ({limit / 2**30:.1f} GiB) of memory {device} has")
        raise MemoryError(f"cannot allocate a tensor of shape {tuple(shape)} and dtype "
                          f"{dtype.name} on {device}: {nbytes} bytes ({nbytes / 2**30:.4g} GiB), "
                          f"{what}")


def check_numel(shape, op: str) -> None:
    """A shape's element count must fit int64 (as in torch): views make no allocation that
    would refuse it later (an expanded or zero-size tensor)."""
    if math.prod(shape) > MAX_SIZE:
        raise ValueError(f"{op}: shape {tuple(shape)} has {math.prod(shape)} elements, more than "
                         f"the largest tensor (2**63 - 1 elements)")


def cached_contiguous_strides(shape) -> tuple[int, ...]:
    """contiguous_strides(shape), remembered for the shapes ops allocate over and over."""
    stride = _CONTIG.get(shape)
    if stride is None:
        stride = contiguous_strides(shape)
        if len(_CONTIG) < 4096:
            _CONTIG[shape] = stride
    return stride


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


# NumPy functions that forward to a same-named method (fromnumeric's _wrapreduction and
# _wrapfunc); see Tensor.__array_function__
_NP_METHOD_FUNCS = frozenset((
    "sum", "mean", "prod", "max", "amax", "min", "amin", "std", "var", "any", "all", "argmax",
    "argmin", "cumsum", "cumprod", "round", "around", "clip"))


_LEGACY_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
                      "bfloat16": "BFloat16Tensor", "int64": "LongTensor", "int32": "IntTensor",
                      "int16": "ShortTensor", "int8": "CharTensor", "uint8": "ByteTensor",
                      "bool": "BoolTensor", "complex64": "ComplexFloatTensor",
                      "complex128": "ComplexDoubleTensor"}


class memory_format:  # noqa: N801 - torch's spelling (torch.memory_format)
    """A tensor layout name: torch.contiguous_format, channels_last, channels_last_3d,
    preserve_format. channels_last stores (N, C, H, W) as (N, H, W, C), a strided view."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"nbxtensor.{self.name}"

    def __reduce__(self):
        return self.name


contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")
preserve_format = memory_format("preserve_format")


def _layout_perm(fmt, ndim, op):
    """None for the row-major layout; else the dim order channels_last stores."""
    if fmt is None or fmt is contiguous_format:
        return None
    if fmt is channels_last or fmt is channels_last_3d:
        need = 4 if fmt is channels_last else 5
        if ndim != need:
            raise RuntimeError(f"{op}: required rank {need} tensor to use {fmt.name} format, "
                               f"got rank {ndim}")
        return (0,) + tuple(range(2, ndim)) + (1,)
    if fmt is preserve_format:
        raise RuntimeError(f"{op}: preserve memory format is unsupported by the contiguous "
                           f"operator")
    raise TypeError(f"{op}: memory_format must be a nbxtensor memory format, got {fmt!r}")


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def normalize_dim(dim, ndim: int, argname: str = "dim") -> int:
    """Wrap a possibly negative dim; 0-dim tensors accept dim 0 and -1 as torch does."""
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, (bool, np.bool_)):
        raise TypeError(f"{argname}: expected an int, got {type(dim).__name__} {dim!r}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{argname}: dimension out of range (expected to be in range of "
                         f"[{-n}, {n - 1}], but got {dim})")
    return int(dim) % n


def normalize_size(args, argname: str = "size", allow_negative: bool = False) -> tuple[int, ...]:
    """Accept f(2, 3), f((2, 3)) and f([2, 3]); every entry an int >= 0 (or any int when
    `allow_negative`, for view's -1 and for dims)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list, Size)):
        args = tuple(args[0])
    out = []
    for n in args:
        if isinstance(n, Tensor):
            if n.numel() != 1 or n.dtype.kind not in "ui":
                raise TypeError(f"{argname}: expected a sequence of ints, got a tensor of shape "
                                f"{tuple(n.shape)} and dtype {n.dtype.name} in it")
            n = n.item()
        if not isinstance(n, (int, np.integer)) or isinstance(n, (bool, np.bool_)):
            raise TypeError(f"{argname}: expected a sequence of ints, got {type(n).__name__} {n!r} "
                            f"in {tuple(args)}")
        if n < 0 and not allow_negative:
            raise ValueError(f"{argname}: expected sizes >= 0, got {n} in {tuple(args)}")
        if not -MAX_SIZE - 1 <= n <= MAX_SIZE:
            raise ValueError(f"{argname}: {n} in {tuple(args)} does not fit int64 (sizes are at "
                             f"most 2**63 - 1)")
        out.append(int(n))
    return tuple(out)


def _as_int(x, argname: str) -> int:
    if isinstance(x, Tensor) and x.numel() == 1 and x.dtype.kind in "ui":
        x = x.item()
    if not isinstance(x, (int, np.integer)) or isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{argname}: expected an int, got {type(x).__name__} {x!r}")
    return int(x)


def broadcast_shapes(*shapes) -> Size:
    """torch.broadcast_shapes: the shape that all `shapes` broadcast to, or ValueError."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for s in shapes:
        for i, n in enumerate(s, ndim - len(s)):
            if n != 1:
                if out[i] not in (1, n):
                    raise ValueError(f"shapes {', '.join(str(tuple(x)) for x in shapes)} cannot be "
                                     f"broadcast together (mismatch at dim {i - ndim}: {out[i]} vs {n})")
                out[i] = n
    return Size(out)


def _view_strides(oldshape, oldstride, newshape):
    """Strides that let `newshape` view memory laid out as (oldshape, oldstride), or None.

    The rule torch uses: merge runs of old dims that are contiguous with each other
    into chunks; every new dim must fall inside one chunk.
    """
    numel = math.prod(oldshape)
    if numel == 0 or not oldshape:
        return contiguous_strides(newshape)
    newstride = [0] * len(newshape)
    view_d = len(newshape) - 1
    chunk_base = oldstride[-1]
    tensor_numel = view_numel = 1
    for d in range(len(oldshape) - 1, -1, -1):
        tensor_numel *= oldshape[d]
        if d == 0 or (oldshape[d - 1] != 1 and oldstride[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or newshape[view_d] == 1):
                newstride[view_d] = view_numel * chunk_base
                view_numel *= newshape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = oldstride[d - 1]
                tensor_numel = view_numel = 1
    return tuple(newstride) if view_d == -1 else None


def _infer_size(shape, numel: int, argname="shape") -> tuple[int, ...]:
    shape = list(shape)
    neg = [i for i, n in enumerate(shape) if n == -1]
    if len(neg) > 1:
        raise ValueError(f"{argname}: only one dimension can be inferred (-1), got {tuple(shape)}")
    for n in shape:
        if n < -1:
            raise ValueError(f"{argname}: invalid size {n} in {tuple(shape)}")
    known = math.prod(n for n in shape if n != -1)
    if neg:
        if known == 0 or numel % known:
            raise ValueError(f"{argname}: {tuple(shape)} is invalid for input of size {numel}")
        shape[neg[0]] = numel // known
    elif known != numel:
        raise ValueError(f"{argname}: {tuple(shape)} is invalid for input of size {numel}")
    check_numel(shape, argname)
    return tuple(shape)


class Tensor:
    """An n-dimensional array of one dtype on one device."""

    __slots__ = ("_storage", "_shape", "_stride", "_offset", "_dtype", "__weakref__")
    __array_priority__ = 1000  # so ndarray OP Tensor defers to our reflected operators

    def __new__(cls, *args, device=None):
        """torch's legacy constructor, default float dtype: `Tensor(2, 3)` (or a Size) is an
        uninitialised tensor of that shape, `Tensor([1, 2])` a tensor of the data,
        `Tensor(t)` `t` itself when it has the default dtype, `Tensor()` an empty one."""
        from .creation import empty, tensor
        dt = _dt.get_default_dtype()
        if not args:
            return empty(0, dtype=dt, device=device)
        if len(args) == 1 and isinstance(args[0], Size):     # a tuple is data, as torch
            args = tuple(args[0])
        if builtins.all(isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))
                        for a in args):
            return empty(tuple(int(a) for a in args), dtype=dt, device=device)
        if len(args) != 1:
            raise TypeError(f"Tensor(): expected sizes (ints) or one sequence of data, got "
                            f"{', '.join(type(a).__name__ for a in args)}")
        data = args[0]
        if isinstance(data, Tensor):
            if data.dtype != dt:
                raise TypeError(f"Tensor(): expected a {dt.name} tensor (the default dtype), got "
                                f"{data.dtype.name}; use data.to({dt.name})")
            return data if device is None or as_device(device) == data.device \
                else data.to(device)
        if not isinstance(data, (list, tuple, np.ndarray)):
            raise TypeError(f"Tensor(): data must be a sequence (list, tuple or ndarray), got "
                            f"{type(data).__name__}")
        return tensor(data, dtype=dt, device=device)

    def __init__(self, *args, **kwargs):
        pass    # __new__ did the work (and Parameter/Buffer build themselves in theirs)

    def get_device(self) -> int:
        """The cuda device index; -1 for host tensors (cpu, interp), as torch for cpu."""
        d = self.device
        return d.index if d.type == "cuda" else -1

    @classmethod
    def _make(cls, storage, shape, stride, offset, dtype) -> "Tensor":
        t = object.__new__(cls)
        t._storage = storage
        t._shape = shape if shape.__class__ is Size else Size(shape)
        t._stride = stride if stride.__class__ is tuple else tuple(stride)
        t._offset = offset
        t._dtype = dtype
        return t

    @classmethod
    def _empty(cls, shape, dtype, device: Device) -> "Tensor":
        # every op allocates its output here: no re-derived strides, no extra conversions
        if shape.__class__ is not Size:
            shape = Size(shape)
        stride = _CONTIG.get(shape)
        if stride is None:
            stride = cached_contiguous_strides(shape)
        return new_contiguous(shape, stride, dtype, device, _prod(shape) * dtype.itemsize)

    # ---------------------------------------------------------------- metadata
    @property
    def shape(self) -> Size:
        return self._shape

    def _entry_of_dim(self, entries, dim):
        """size(dim), stride(dim): the entry of `dim` in `entries` (torch's errors)."""
        d = normalize_dim(dim, self.ndim)
        if not self.ndim:
            raise IndexError(f"dim: dimension specified as {dim} but the tensor has no dimensions")
        return entries[d]

    def size(self, dim=None):
        return self._shape if dim is None else self._entry_of_dim(self._shape, dim)

    def stride(self, dim=None):
        return self._stride if dim is None else self._entry_of_dim(self._stride, dim)

    def storage_offset(self) -> int:
        return self._offset

    @property
    def dtype(self) -> _dt.DType:
        return self._dtype

    @property
    def device(self) -> Device:
        return self._storage.device

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self.device.type == "cpu"

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def dim(self) -> int:
        return len(self._shape)

    def numel(self) -> int:
        return math.prod(self._shape)

    nelement = numel

    def element_size(self) -> int:
        return self._dtype.itemsize

    @property
    def itemsize(self) -> int:
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self._dtype.itemsize

    def data_ptr(self) -> int:
        return self._storage.ptr + self._offset * self._dtype.itemsize

    def untyped_storage(self):
        return self._storage

    def is_contiguous(self, memory_format=None) -> bool:
        if 0 in self._shape:    # no element to place: contiguous whatever the strides (torch)
            return True
        if memory_format is not None:
            perm = _layout_perm(memory_format, self.ndim, "is_contiguous")
            if perm is not None:
                return self.permute(*perm).is_contiguous()
        expected = 1
        for n, s in zip(reversed(self._shape), reversed(self._stride)):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    def is_floating_point(self) -> bool:
        return self._dtype.is_floating_point

    # ---------------------------------------------------------------- views
    def _view(self, shape, stride, offset=None) -> "Tensor":
        return Tensor._make(self._storage, shape, stride, self._offset if offset is None else offset,
                            self._dtype)

    def view(self, *shape) -> "Tensor":
        if len(shape) == 1 and (isinstance(shape[0], _dt.DType)
                                or (isinstance(shape[0], str) and _is_dtype_name(shape[0]))):
            return self._view_dtype(_dt.as_dtype(shape[0]))
        shape = _infer_size(normalize_size(shape, "shape", True) if shape else (), self.numel(), "view")
        stride = _view_strides(self._shape, self._stride, shape)
        if stride is None:
            raise RuntimeError(f"view: size {tuple(shape)} is not compatible with input of size "
                               f"{tuple(self._shape)} and stride {self._stride} (at least one "
                               f"dimension spans across two contiguous subspaces); use .reshape(...)")
        return self._view(shape, stride)

    def _view_dtype(self, dtype) -> "Tensor":
        """view(dtype): the same bytes read as `dtype` (torch's rules). Another itemsize
        rescales the last dim, which must be contiguous (stride 1) and divisible."""
        old, new = self._dtype.itemsize, dtype.itemsize
        if old == new:
            return Tensor._make(self._storage, self._shape, self._stride, self._offset, dtype)
        what = f"to view {self._dtype.name} as {dtype.name} (different element sizes)"
        if self.ndim == 0:
            raise RuntimeError(f"view: self.dim() cannot be 0 {what}")
        if self._stride[-1] != 1:
            raise RuntimeError(f"view: self.stride(-1) must be 1 {what}, but got "
                               f"{self._stride[-1]}")
        shape, stride = list(self._shape), list(self._stride)
        if new > old:
            r = new // old
            if shape[-1] % r:
                raise RuntimeError(f"view: self.size(-1) must be divisible by {r} {what}, but "
                                   f"got {shape[-1]}")
            for i, st in enumerate(stride[:-1]):
                if st % r:
                    raise RuntimeError(f"view: self.stride({i}) must be divisible by {r} {what}, "
                                       f"but got {st}")
            if self._offset % r:
                raise RuntimeError(f"view: self.storage_offset() must be divisible by {r} {what}, "
                                   f"but got {self._offset}")
            shape[-1] //= r
            stride = [st // r for st in stride[:-1]] + [1]
            offset = self._offset // r
        else:
            r = old // new
            shape[-1] *= r
            stride = [st * r for st in stride[:-1]] + [1]
            offset = self._offset * r
        return Tensor._make(self._storage, tuple(shape), tuple(stride), offset, dtype)

    def reshape(self, *shape) -> "Tensor":
        shape = _infer_size(normalize_size(shape, "shape", True) if shape else (), self.numel(), "reshape")
        stride = _view_strides(self._shape, self._stride, shape)
        if stride is None:
            return self.contiguous().view(shape)
        return self._view(shape, stride)

    def view_as(self, other: "Tensor") -> "Tensor":
        return self.view(other.shape)

    def reshape_as(self, other: "Tensor") -> "Tensor":
        return self.reshape(other.shape)

    def as_strided(self, size, stride, storage_offset=None) -> "Tensor":
        size = normalize_size((size,), "size")
        stride = normalize_size((stride,), "stride")
        if len(size) != len(stride):
            raise ValueError(f"as_strided: size {size} and stride {stride} have different lengths")
        offset = self._offset if storage_offset is None else int(storage_offset)
        if offset < 0:
            raise ValueError(f"as_strided: storage_offset must be >= 0, got {offset}")
        check_numel(size, "as_strided")
        if math.prod(size):
            last = offset + sum((n - 1) * s for n, s in zip(size, stride))
            if (last + 1) * self._dtype.itemsize > self._storage.nbytes:
                raise ValueError(f"as_strided: size {size}, stride {stride}, offset {offset} reaches "
                                 f"element {last}, beyond the storage of "
                                 f"{self._storage.nbytes // self._dtype.itemsize} elements")
        return self._view(size, stride, offset)

    def permute(self, *dims) -> "Tensor":
        dims = normalize_size(dims, "dims", True)
        if len(dims) != self.ndim:
            raise ValueError(f"permute: dims {tuple(dims)} must name each of the tensor's "
                             f"{self.ndim} dims once")
        dims = tuple(normalize_dim(d, self.ndim, "dims") for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise ValueError(f"permute: dims {dims} is not a permutation of 0..{self.ndim - 1}")
        return self._view([self._shape[d] for d in dims], [self._stride[d] for d in dims])

    def transpose(self, dim0, dim1) -> "Tensor":
        if self.ndim == 0:
            normalize_dim(dim0, 0, "dim0"), normalize_dim(dim1, 0, "dim1")
            return self
        d0, d1 = normalize_dim(dim0, self.ndim, "dim0"), normalize_dim(dim1, self.ndim, "dim1")
        order = list(range(self.ndim))
        order[d0], order[d1] = d1, d0
        return self.permute(order)

    swapaxes = swapdims = transpose

    def t(self) -> "Tensor":
        sh = self._shape
        if len(sh) == 2:    # the swap itself: transpose -> permute re-checks dims at ~3 us
            st = self._stride
            return Tensor._make(self._storage, Size((sh[1], sh[0])), (st[1], st[0]),
                                self._offset, self._dtype)
        if len(sh) > 2:
            raise ValueError(f"t: expects a tensor with <= 2 dims, got {self.ndim}")
        return self

    @property
    def T(self) -> "Tensor":  # noqa: N802 - torch's name
        return self.permute(tuple(range(self.ndim - 1, -1, -1)))

    @property
    def mT(self) -> "Tensor":  # noqa: N802 - torch's name
        if self.ndim < 2:
            raise ValueError(f"mT: expects a tensor with >= 2 dims, got {self.ndim}")
        return self.transpose(-2, -1)

    def expand(self, *sizes) -> "Tensor":
        sizes = normalize_size(sizes, "size", True) if sizes else ()
        if len(sizes) < self.ndim:
            raise ValueError(f"expand: the number of sizes {len(sizes)} must be >= the tensor's "
                             f"{self.ndim} dims ({tuple(sizes)} vs {tuple(self._shape)})")
        lead = len(sizes) - self.ndim
        shape, stride = [], []
        for i, n in enumerate(sizes):
            if i < lead:
                if n < 0:
                    raise ValueError(f"expand: size -1 is not allowed in a new leading dim "
                                     f"({tuple(sizes)})")
                shape.append(n), stride.append(0)
                continue
            have, st = self._shape[i - lead], self._stride[i - lead]
            if n == -1 or n == have:
                shape.append(have), stride.append(st)
            elif have == 1 and n >= 0:
                shape.append(n), stride.append(0)
            else:
                raise ValueError(f"expand: the expanded size {n} must match the existing size "
                                 f"{have} at non-singleton dim {i} (shape {tuple(self._shape)} "
                                 f"to {tuple(sizes)})")
        check_numel(shape, "expand")
        return self._view(shape, stride)

    def broadcast_to(self, *shape) -> "Tensor":
        return self.expand(*shape)

    def expand_as(self, other: "Tensor") -> "Tensor":
        return self.expand(other.shape)

    def squeeze(self, dim=None) -> "Tensor":
        if dim is None:
            keep = [i for i, n in enumerate(self._shape) if n != 1]
        else:
            dims = dim if isinstance(dim, (tuple, list)) else (dim,)
            drop = {normalize_dim(d, self.ndim) for d in dims}
            keep = [i for i, n in enumerate(self._shape) if not (i in drop and n == 1)]
        return self._view([self._shape[i] for i in keep], [self._stride[i] for i in keep])

    def unsqueeze(self, dim) -> "Tensor":
        d = normalize_dim(dim, self.ndim + 1)
        shape, stride = list(self._shape), list(self._stride)
        new_stride = shape[d] * stride[d] if d < self.ndim else 1
        shape.insert(d, 1)
        stride.insert(d, new_stride)
        return self._view(shape, stride)

    def _become(self, view: "Tensor") -> "Tensor":
        # the in-place view ops (unsqueeze_, t_, ...): self takes the view's layout
        self._shape, self._stride, self._offset = view._shape, view._stride, view._offset
        return self

    def unsqueeze_(self, dim) -> "Tensor":
        return self._become(self.unsqueeze(dim))

    def squeeze_(self, dim=None) -> "Tensor":
        return self._become(self.squeeze(dim))

    def t_(self) -> "Tensor":
        return self._become(self.t())

    def transpose_(self, dim0, dim1) -> "Tensor":
        return self._become(self.transpose(dim0, dim1))

    def as_strided_(self, size, stride, storage_offset=None) -> "Tensor":
        return self._become(self.as_strided(size, stride, storage_offset))

    def ravel(self) -> "Tensor":
        """The flattened tensor (a view where the strides allow, else a copy)."""
        return self.reshape(-1)

    def unfold(self, dimension, size, step) -> "Tensor":
        """A view of every slice of `size` elements along `dimension`, `step` apart: that dim
        becomes the number of slices and a new last dim of `size` is appended."""
        d = normalize_dim(dimension, max(self.ndim, 1), "dimension")
        n = self._shape[d] if self.ndim else 1
        st = self._stride[d] if self.ndim else 1
        if isinstance(size, bool) or not isinstance(size, int) or size < 0 or size > n:
            raise ValueError(f"unfold: maximum size for tensor at dimension {d} is {n} but "
                             f"size is {size}")
        if isinstance(step, bool) or not isinstance(step, int) or step <= 0:
            raise ValueError(f"unfold: step is {step} but must be > 0")
        count = (n - size) // step + 1
        shape, stride = list(self._shape), list(self._stride)
        if self.ndim == 0:
            return self._view((size,), (1,))
        shape[d], stride[d] = count, st * step
        return self._view(tuple(shape) + (size,), tuple(stride) + (st,))

    def flatten(self, start_dim=0, end_dim=-1) -> "Tensor":
        if self.ndim == 0:
            return self.reshape(1)
        s = normalize_dim(start_dim, self.ndim, "start_dim")
        e = normalize_dim(end_dim, self.ndim, "end_dim")
        if s > e:
            raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
        shape = self._shape[:s] + (math.prod(self._shape[s:e + 1]),) + self._shape[e + 1:]
        return self.reshape(shape)

    def unflatten(self, dim, sizes) -> "Tensor":
        d = normalize_dim(dim, self.ndim)
        sizes = _infer_size(normalize_size((sizes,), "sizes", True), self._shape[d], "unflatten")
        return self.view(self._shape[:d] + tuple(sizes) + self._shape[d + 1:])

    def narrow(self, dim, start, length) -> "Tensor":
        if self.ndim == 0:
            raise IndexError("narrow: cannot be applied to a 0-dim tensor")
        d = normalize_dim(dim, self.ndim)
        n = self._shape[d]
        start, length = _as_int(start, "start"), _as_int(length, "length")
        if not -n <= start <= n:
            raise IndexError(f"narrow: start {start} out of range for dim {dim} of size {n} "
                             f"(expected {-n} <= start <= {n})")
        if start < 0:
            start += n
        if length < 0 or start + length > n:
            raise IndexError(f"narrow: start ({start}) + length ({length}) exceeds dim {dim} of size {n}")
        shape = list(self._shape)
        shape[d] = length
        return self._view(shape, self._stride, self._offset + start * self._stride[d])

    def select(self, dim, index) -> "Tensor":
        if self.ndim == 0:
            raise IndexError("select: cannot select on a 0-dim tensor")
        d = normalize_dim(dim, self.ndim)
        n = self._shape[d]
        index = _as_int(index, "index")
        if not -n <= index < n:
            raise IndexError(f"select: index {index} is out of bounds for dim {d} with size {n}")
        index %= n
        return self._view(self._shape[:d] + self._shape[d + 1:],
                          self._stride[:d] + self._stride[d + 1:],
                          self._offset + index * self._stride[d])

    def split(self, split_size_or_sections, dim=0) -> tuple["Tensor", ...]:
        if self.ndim == 0:
            raise ValueError("split: expected a tensor with at least 1 dim, got a 0-dim tensor")
        d = normalize_dim(dim, self.ndim)
        n = self._shape[d]
        if isinstance(split_size_or_sections, (int, np.integer)) and \
                not isinstance(split_size_or_sections, bool):
            size = int(split_size_or_sections)
            if size < 0 or (size == 0 and n != 0):
                raise ValueError(f"split_size: expected > 0 (or 0 for a dim of size 0), got {size}"
                                 f" for dim {dim} of size {n}")
            # torch: at least one piece, the last one may be smaller
            count = max(-(-n // size), 1) if size else 1
            sizes = [min(size, n - i * size) for i in range(count)]
        else:
            sizes = list(normalize_size((split_size_or_sections,), "split_sizes"))
            if sum(sizes) != n:
                raise ValueError(f"split_sizes: {sizes} must sum to dim {dim}'s size {n}, "
                                 f"got sum {sum(sizes)}")
        out, start = [], 0
        for s in sizes:
            out.append(self.narrow(d, start, s))
            start += s
        return tuple(out)

    def chunk(self, chunks, dim=0) -> tuple["Tensor", ...]:
        chunks = _as_int(chunks, "chunks")
        if chunks <= 0:
            raise ValueError(f"chunks: expected > 0, got {chunks}")
        if self.ndim == 0:
            raise ValueError("chunk: expected a tensor with at least 1 dim, got a 0-dim tensor")
        n = self._shape[normalize_dim(dim, self.ndim)]
        # torch: pieces of ceil(n / chunks); fewer than `chunks` pieces when that divides out
        return self.split(-(-n // chunks), dim)

    def unbind(self, dim=0) -> tuple["Tensor", ...]:
        if self.ndim == 0:
            raise ValueError("unbind: expected a tensor with at least 1 dim, got a 0-dim tensor")
        d = normalize_dim(dim, self.ndim)
        return tuple(self.select(d, i) for i in range(self._shape[d]))

    # ---------------------------------------------------------------- indexing
    def _basic_index(self, idx):
        """Apply ints, slices, None and ... ; return the view, or None for advanced indices."""
        if not isinstance(idx, tuple):
            idx = (idx,)
        for x in idx:
            if not (x is None or x is Ellipsis or isinstance(x, slice)
                    or (isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)))):
                return None
        n_ell = sum(x is Ellipsis for x in idx)
        if n_ell > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        n_real = sum(x is not None and x is not Ellipsis for x in idx)
        if n_real > self.ndim:
            raise IndexError(f"too many indices for tensor of dimension {self.ndim} "
                             f"(got {n_real})")
        if n_ell:
            i = idx.index(Ellipsis)
            idx = idx[:i] + (slice(None),) * (self.ndim - n_real) + idx[i + 1:]
        shape, stride, offset, d = [], [], self._offset, 0
        for x in idx:
            if x is None:
                shape.append(1), stride.append(0)
            elif isinstance(x, slice):
                n = self._shape[d]
                start, stop, step = x.start, x.stop, x.step
                if step is not None and step <= 0:
                    raise ValueError(f"slice step must be positive, got {step} (negative steps "
                                     f"are not supported; use flip)")
                start, stop, step = slice(start, stop, step).indices(n)
                length = max(0, -(-(stop - start) // step))
                if length:
                    offset += start * self._stride[d]
                shape.append(length), stride.append(self._stride[d] * step)
                d += 1
            else:
                n = self._shape[d]
                if not -n <= x < n:
                    raise IndexError(f"index {x} is out of bounds for dimension {d} with size {n}")
                offset += (int(x) % n) * self._stride[d]
                d += 1
        shape += self._shape[d:]
        stride += self._stride[d:]
        return self._view(shape, stride, offset)

    def __getitem__(self, idx):
        v = self._basic_index(idx)
        if v is not None:
            return v
        return self._advanced_getitem(idx)    # tensor/list/bool indices: ops/indexing.py

    def __setitem__(self, idx, value):
        v = self._basic_index(idx)
        if v is None:
            self._advanced_setitem(idx, value)
            return
        if isinstance(value, Tensor):
            v.copy_(value)
        elif isinstance(value, (bool, int, float, np.generic)):
            v.fill_(value)
        else:
            from .creation import tensor
            v.copy_(tensor(value, dtype=self._dtype))

    # ---------------------------------------------------------------- copies and casts
    def copy_(self, src: "Tensor", non_blocking: bool = False) -> "Tensor":
        """Copy `src` into self, broadcasting and casting; `src` may be on another device."""
        if not isinstance(src, Tensor):
            raise TypeError(f"copy_: src must be a Tensor, got {type(src).__name__}")
        try:
            src = src.expand(self._shape)
        except ValueError:
            raise ValueError(f"copy_: src of shape {tuple(src.shape)} cannot be broadcast to the "
                             f"destination's shape {tuple(self._shape)}") from None
        if not self.numel():
            return self
        if any(n > 1 and s == 0 for n, s in zip(self._shape, self._stride)):
            raise RuntimeError("copy_: more than one element of the destination refers to a single "
                               "memory location (an expanded tensor); clone() it first")
        _check_cast(src._dtype, self._dtype, "copy_")
        if src.device != self.device:
            if self._copy_across(src, non_blocking):
                return self
            # (a pinned temporary that a host kernel reads at once must have landed)
            src = src._to_device(self.device, non_blocking and self.device.type == "cuda")
        elif _overlaps(self, src):
            if src._same_view(self):
                return self
            src = src.clone()  # read everything before writing anything
        impl("copy_", self.device)(self, src)
        return self

    def _copy_across(self, src, non_blocking) -> bool:
        """copy_ between the host and a cuda tensor of one dtype straight into a contiguous
        destination (no temporary, no kernel); False when the layout needs the general path."""
        if src._dtype is not self._dtype or not self.is_contiguous():
            return False
        item = self._dtype.itemsize
        if self.device.type == "cuda" and src.device.type == "cpu":
            self._storage.from_host(self._offset * item, src._host_view(), non_blocking)
            return True
        if self.device.type == "cpu" and src.device.type == "cuda" and src.is_contiguous():
            out = self._host_view()
            src._storage.to_host_into(src._offset * item, out.reshape(-1).view(np.uint8),
                                      non_blocking and self.is_pinned())
            return True
        return False

    def _same_view(self, other) -> bool:
        return (self.data_ptr() == other.data_ptr() and self._dtype is other._dtype
                and self._shape == other._shape and self._stride == other._stride)

    def fill_(self, value) -> "Tensor":
        if isinstance(value, Tensor):
            if value.ndim != 0:
                raise ValueError(f"fill_: value must be a 0-dim tensor or a number, got shape "
                                 f"{tuple(value.shape)}")
            value = value.item()
        value = _dt.check_scalar(value, self._dtype, "fill_")
        if self.numel():
            impl("fill_", self.device)(self, value)
        return self

    def zero_(self) -> "Tensor":
        return self.fill_(0)

    def contiguous(self, memory_format=None) -> "Tensor":
        if memory_format is None:       # the per-call path: no layout to look up
            return self if self.is_contiguous() else self.clone()
        perm = _layout_perm(memory_format, self.ndim, "contiguous")
        if perm is not None:
            # channels_last: the dims stored in `perm` order, viewed back in torch's order
            if self.is_contiguous(memory_format=memory_format):
                return self
            return self.permute(*perm).clone().permute(*_inverse(perm))
        return self if self.is_contiguous() else self.clone()

    def clone(self, *, memory_format=None) -> "Tensor":
        if memory_format is not None and memory_format is not preserve_format:
            return self.clone().contiguous(memory_format)
        # out is fresh, contiguous and of self's shape: no broadcast or overlap to check
        device = self._storage.device
        out = Tensor._empty(self._shape, self._dtype, device)
        if math.prod(self._shape):
            impl("copy_", device)(out, self)
        return out

    def _to_device(self, device: Device, non_blocking: bool = False) -> "Tensor":
        """A contiguous copy on `device`, same dtype (staged through host memory). cuda -> cpu
        with non_blocking lands in pinned memory, asynchronously on the current stream (torch:
        synchronise before reading it)."""
        if non_blocking and self.device.type == "cuda" and device.type == "cpu":
            src = self.contiguous()
            out = self._empty_pinned()
            item = self._dtype.itemsize
            src._storage.to_host_into(src._offset * item, out._storage.host_array(), True)
            return out
        host = self.numpy()
        host = host if host.flags.c_contiguous else host.copy()
        if device.type == "cpu":
            return Tensor._from_numpy_unchecked(host)
        out = Tensor._empty(self._shape, self._dtype, device)
        if device.type == "cuda":
            out._storage.from_host(0, host, non_blocking)
        else:
            out._storage.from_host(0, host)
        return out

    def _empty_pinned(self) -> "Tensor":
        """An uninitialised contiguous cpu tensor of self's shape and dtype in pinned memory."""
        out = _new_object(Tensor)
        out._storage = _ALLOCATE["pinned"](_CPU, math.prod(self._shape) * self._dtype.itemsize)
        out._shape = Size(self._shape)
        out._stride = contiguous_strides(self._shape)
        out._offset = 0
        out._dtype = self._dtype
        return out

    def pin_memory(self, device=None) -> "Tensor":
        """A copy of this cpu tensor in page-locked host memory (self when already pinned):
        copies between it and cuda tensors are DMAs, asynchronous with non_blocking=True."""
        if self.device.type != "cpu":
            raise RuntimeError(f"pin_memory: only cpu tensors can be pinned, got a tensor on "
                               f"{self.device}")
        if device is not None and as_device(device).type != "cuda":
            raise ValueError(f"pin_memory: device must be a cuda device, got {device!r}")
        if self.is_pinned():
            return self
        out = self._empty_pinned()
        if out.numel():
            np.copyto(out._host_view(), self._host_view())
        return out

    def is_pinned(self, device=None) -> bool:
        """True when the tensor lives in page-locked host memory (made by pin_memory())."""
        return getattr(self._storage, "is_pinned", False)

    def to(self, *args, **kwargs) -> "Tensor":
        """to(device), to(dtype), to(device, dtype), to(other); copy=True forces a copy."""
        if not kwargs and len(args) == 1 and args[0].__class__ is _dt.DType:
            # to(dtype), the common cast: into a fresh tensor, which cannot overlap self
            dtype = args[0]
            if dtype is self._dtype:
                return self
            _check_cast(self._dtype, dtype, "to")
            device = self._storage.device
            out = Tensor._empty(self._shape, dtype, device)
            if math.prod(self._shape):
                impl("copy_", device)(out, self)
            return out
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        copy = kwargs.pop("copy", False)
        non_blocking = kwargs.pop("non_blocking", False)
        memory_format = kwargs.pop("memory_format", None)
        if memory_format is not None and memory_format is not preserve_format:
            _layout_perm(memory_format, self.ndim, "to")   # checked before any copy
            kwargs_left = {k: v for k, v in (("device", device), ("dtype", dtype), ("copy", copy))
                           if v is not None}
            return self.to(*args, **kwargs_left, **kwargs).contiguous(memory_format)
        if kwargs:
            raise TypeError(f"to: unexpected keyword arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, Tensor):
                device, dtype = a.device, a.dtype
            elif isinstance(a, (_dt.DType, np.dtype, type)) or (isinstance(a, str)
                                                                and _is_dtype_name(a)):
                dtype = a
            elif a.__class__ is bool:       # to(device, dtype, non_blocking) positionally
                non_blocking = a
            elif a is not None:
                device = a
        if non_blocking.__class__ is not bool:
            raise TypeError(f"to: non_blocking must be a bool, got {non_blocking!r}")
        device = self.device if device is None else as_device(device)
        dtype = self._dtype if dtype is None else _dt.as_dtype(dtype)
        if device == self.device and dtype is self._dtype and not copy:
            return self
        _check_cast(self._dtype, dtype, "to")
        if device != self.device:
            # (a cast on the host reads the copy at once: it must have landed)
            src = self._to_device(device, non_blocking and (device.type == "cuda"
                                                            or dtype is self._dtype))
            if dtype is src._dtype:
                return src
        else:
            src = self
        # out is fresh and of src's shape: no broadcast or overlap to check (copy_ would)
        out = Tensor._empty(self._shape, dtype, device)
        if math.prod(self._shape):
            impl("copy_", device)(out, src)
        return out

    def type(self, dtype=None, non_blocking=False):
        """type(): torch's legacy type name ('torch.FloatTensor', 'torch.cuda.HalfTensor'; host
        devices use the cpu names); type(dtype or such a name): a cast."""
        if dtype is None:
            prefix = "torch.cuda." if self.device.type == "cuda" else "torch."
            return prefix + _LEGACY_TYPE_NAMES.get(self._dtype.name, self._dtype.name)
        if isinstance(dtype, str) and dtype.startswith("torch.") and dtype.endswith("Tensor"):
            names = {v: k for k, v in _LEGACY_TYPE_NAMES.items()}
            base = dtype.rsplit(".", 1)[-1]
            if base not in names:
                raise ValueError(f"type: invalid type {dtype!r}")
            return self.to(dtype=_dt.as_dtype(names[base]))
        return self.to(dtype=dtype)

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def cuda(self, device=None, non_blocking: bool = False) -> "Tensor":
        return self.to(as_device("cuda" if device is None else device), non_blocking=non_blocking)

    float = _dt.cast_method("float", _dt.float32, "to")
    double = _dt.cast_method("double", _dt.float64, "to")
    half = _dt.cast_method("half", _dt.float16, "to")
    bfloat16 = _dt.cast_method("bfloat16", _dt.bfloat16, "to")
    int = _dt.cast_method("int", _dt.int32, "to")
    long = _dt.cast_method("long", _dt.int64, "to")
    bool = _dt.cast_method("bool", _dt.bool, "to")

    # ---------------------------------------------------------------- to the host
    def _host_view(self) -> np.ndarray:
        """Zero-copy NumPy view of a host tensor (cpu or interp)."""
        item = self._dtype.itemsize
        if not self.numel():  # no bytes to view; the offset may point past an empty storage
            return np.empty(self._shape, self._dtype.np)
        return np.ndarray(self._shape, self._dtype.np, buffer=self._storage.host_array(),
                          offset=self._offset * item, strides=[s * item for s in self._stride])

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """A NumPy array: shares memory on cpu (as torch); a copy from other devices."""
        if self.device.type == "cpu":
            a = self._host_view()
            return a.copy() if force else a
        if self.device.is_host:
            return self._host_view().copy()
        c = self.contiguous()
        raw = c._storage.to_host(c._offset * c._dtype.itemsize, c.nbytes)
        return raw.view(self._dtype.np).reshape(self._shape)

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        if dtype is not None and a.dtype != dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    # DLPack and the CUDA array interface (__dlpack__, __dlpack_device__,
    # __cuda_array_interface__) are attached by dlpack.py
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """NumPy ufuncs on cpu tensors compute with NumPy and return cpu Tensors (as torch's
        do); `out=` tensors are written in place. Tensors on other devices are refused: NumPy
        would compute on a host copy, not with the device's kernels."""
        def host(x):
            if isinstance(x, Tensor):
                if x.device.type != "cpu":
                    raise TypeError(f"numpy.{ufunc.__name__}: a tensor on {x.device} cannot be "
                                    f"used by a NumPy ufunc; use the nbxtensor op, or .cpu() "
                                    f"first")
                return x._host_view()
            return x
        args = [host(x) for x in inputs]
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(host(o) for o in out)
        res = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out

        return tuple(_wrap_host(r) for r in res) if isinstance(res, tuple) else _wrap_host(res)

    def __array_function__(self, func, types, args, kwargs):
        # NumPy's reductions and the functions it forwards to a method (np.sum(t, axis=1) calls
        # t.sum(axis=1, out=None)) run on host arrays with NumPy's keywords and semantics
        # (np.std's ddof=0), their results as cpu Tensors, as a method call would give
        if func.__name__ in _NP_METHOD_FUNCS:
            def host(x):
                if isinstance(x, Tensor):
                    return x.numpy()
                if isinstance(x, (list, tuple)):
                    return type(x)(host(v) for v in x)
                return x
            out = kwargs.get("out")
            if out is not None:
                raise TypeError(f"numpy.{func.__name__}: out= is not supported with an "
                                f"nbxtensor Tensor argument; assign the result instead")
            res = func._implementation(*[host(a) for a in args],
                                       **{k: host(v) for k, v in kwargs.items()})
            if isinstance(res, (np.ndarray, np.generic)):
                return _wrap_host(np.asarray(res))
            return res
        # the rest: NumPy's own implementation, which converts tensors with __array__ (or
        # calls their methods): the results torch's tensors get from NumPy functions, which
        # have no __array_function__ of their own
        return func._implementation(*args, **kwargs)

    def __array_wrap__(self, arr, context=None, return_scalar=False):
        # NumPy functions that fall back to converting a tensor (np.clip, np.reshape, ...)
        # wrap their result back, as torch's tensors do
        return _wrap_host(arr)

    def item(self):
        if self.numel() != 1:
            raise ValueError(f"item: only a tensor with one element can be converted to a Python "
                             f"number, got shape {tuple(self._shape)}")
        a = self.reshape(()).numpy()
        return builtins.float(a) if self._dtype.kind == "f" else a.item()

    def tolist(self):
        a = self.numpy()
        if self._dtype.kind == "f" and a.dtype.kind != "f":  # bf16/fp8: go through float64
            a = a.astype(np.float64)
        return a.tolist()

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-dim tensor")
        return self._shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-dim tensor")
        return iter(self.unbind(0))

    def __contains__(self, element):
        """`v in t`: whether any element of t equals v (a number or a tensor), as torch."""
        if not isinstance(element, (Tensor, builtins.int, builtins.float, builtins.bool,
                                    np.number, np.bool_)):
            raise TypeError(f"Tensor.__contains__ only supports Tensor or scalar, but you "
                            f"passed in a {type(element).__name__}")
        return builtins.bool((self == element).any())

    def __format__(self, spec):
        # f"{t:.3f}" formats a 0-dim tensor's value, as torch; other tensors print as str(t)
        if self.ndim == 0 and type(self) is Tensor:
            return format(self.item(), spec)
        return object.__format__(self, spec)

    def __bool__(self):
        if self.numel() != 1:
            raise ValueError(f"the truth value of a tensor with {self.numel()} elements is "
                             f"ambiguous; use .any() or .all()")
        return builtins.bool(self.item())

    def __int__(self):
        return builtins.int(self.item())

    def __float__(self):
        return builtins.float(self.item())

    def __index__(self):
        if self._dtype.kind not in "ui" or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return builtins.int(self.item())

    def __hash__(self):
        return id(self)

    def __repr__(self):
        from ._format import format_tensor
        return format_tensor(self)

    __str__ = __repr__

    # ---------------------------------------------------------------- internal constructors
    @classmethod
    def _from_numpy_unchecked(cls, arr: np.ndarray) -> "Tensor":
        """Wrap a NumPy array (non-negative strides, whole elements) without a copy."""
        dtype = _dt.as_dtype(arr.dtype, "ndarray.dtype")
        item = arr.itemsize
        if arr.size == 0:
            storage = HostStorage(_CPU, np.empty(0, np.uint8))
            return cls._make(storage, arr.shape, contiguous_strides(arr.shape), 0, dtype)
        extent = 1 + sum((n - 1) * s // item for n, s in zip(arr.shape, arr.strides))
        # as_strided over a same-width unsigned view: NumPy cannot rebuild every ml_dtypes
        # dtype from its array interface (float8_e5m2 reads back as '<f1')
        flat = np.lib.stride_tricks.as_strided(arr.view(f"u{item}") if item <= 8 else arr,
                                               shape=(extent,), strides=(item,),
                                               writeable=arr.flags.writeable)
        storage = HostStorage(_CPU, flat.view(np.uint8))
        return cls._make(storage, arr.shape, [s // item for s in arr.strides], 0, dtype)


def _check_cast(src: _dt.DType, dst: _dt.DType, op: str) -> None:
    """complex -> real casts are refused (torch drops the imaginary part with a warning)."""
    if src.kind == "c" and dst.kind != "c":
        raise TypeError(f"{op}: casting {src.name} to {dst.name} would discard the imaginary "
                        f"part; take .real (or .abs()) explicitly")


def _real_view(t: Tensor) -> Tensor:
    """torch.view_as_real's layout for a complex `t` of any strides: a trailing dim of 2
    (real, imaginary) of the part dtype, every stride doubled. The kernels' view of complex."""
    return Tensor._make(t._storage, t._shape + (2,), tuple(2 * s for s in t._stride) + (1,),
                        2 * t._offset, _dt.to_real(t._dtype))


def _as_complex_view(r: Tensor) -> Tensor:
    """_real_view's inverse: a real `r` whose last dim is (re, im) with stride 1, read as
    complex (no checks: torch.view_as_complex checks first)."""
    return Tensor._make(r._storage, r._shape[:-1], tuple(s // 2 for s in r._stride[:-1]),
                        r._offset // 2, _dt.to_complex(r._dtype))


def _wrap_host(r):
    """A NumPy result as a cpu Tensor (a NumPy scalar as a 0-D one); anything else as is."""
    if not isinstance(r, (np.ndarray, np.generic)):
        return r
    a = np.asarray(r)
    return Tensor._from_numpy_unchecked(a if a.flags.c_contiguous else a.copy())


def _byte_range(t: Tensor) -> tuple[int, int]:
    lo = t.data_ptr()
    return lo, lo + (1 + sum((n - 1) * s for n, s in zip(t.shape, t._stride))) * t.itemsize


def _overlaps(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors on one device may share bytes (by address ranges)."""
    if not a.numel() or not b.numel():
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1


def _is_dtype_name(s: str) -> bool:
    try:
        _dt.as_dtype(s)
        return True
    except TypeError:
        return False

