"""torch.save without torch: a state dict (or nested dicts, lists and tuples of tensors and plain
values) written in torch's zip format, which torch.load(weights_only=True) and nbx.load read.

The archive is what torch >= 1.6 writes: `archive/data.pkl` (a protocol-2 pickle),
`archive/byteorder` ('little'), `archive/data/<key>` (each storage's bytes, stored, aligned to
64 bytes as torch aligns them), `archive/version` ('3') and torch's format markers. In the
pickle a tensor is `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False,
OrderedDict())` and a storage the persistent id `('storage', torch.FloatStorage, key, location,
numel)`; float8 tensors, which have no legacy storage class, use `_rebuild_tensor_v3` over a
`torch.storage.UntypedStorage` as torch does. Tensors that share memory share one storage entry,
so views stay views after loading, as with torch.

The pickler writes those torch names as GLOBAL opcodes without importing torch, and refuses any
value that torch.load(weights_only=True) would refuse (objects, functions, Modules).
"""
from __future__ import annotations

import codecs
import collections
import io
import os
import pickle
import struct
import zipfile

from .. import dtypes as _dt
from ..tensor import Tensor

__all__ = ["save_torch"]

_ALIGN = 64     # torch's storage alignment inside the archive
_STORAGE_CLASS = {"float32": "FloatStorage", "float16": "HalfStorage",
                  "bfloat16": "BFloat16Storage", "float64": "DoubleStorage",
                  "int64": "LongStorage", "int32": "IntStorage", "int16": "ShortStorage",
                  "int8": "CharStorage", "uint8": "ByteStorage", "bool": "BoolStorage"}
_UNTYPED = {"float8_e4m3fn", "float8_e5m2"}     # saved through an untyped (byte) storage
_PLAIN = (type(None), bool, int, float, complex, str, bytes)
# what protocol 2 names when it pickles those values (all on torch's weights_only allow-list)
_REDUCERS = (collections.OrderedDict, set, frozenset, complex, codecs.encode)


class _Global:
    """A name the pickle refers to (torch.FloatStorage, torch.float16, ...), written as a
    GLOBAL opcode; torch itself is never imported."""
    __slots__ = ("module", "name")

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args):     # pickle's save_reduce asks for a callable; never called
        raise TypeError(f"{self.module}.{self.name} is a name in a torch pickle")


class _StorageRef:
    """One storage of the archive; pickled as its persistent id."""
    __slots__ = ("key", "cls", "numel", "location")

    def __init__(self, key, cls, numel, location):
        self.key, self.cls, self.numel, self.location = key, cls, numel, location


class _Pickler(pickle._Pickler):
    # the pure-Python pickler: its dispatch table takes our _Global writer
    dispatch = dict(pickle._Pickler.dispatch)

    def __init__(self, file, storages):
        super().__init__(file, protocol=2)
        self._storages = storages

    def save_global_name(self, obj):
        self.write(pickle.GLOBAL + obj.module.encode() + b"\n" + obj.name.encode() + b"\n")
        self.memoize(obj)

    dispatch[_Global] = save_global_name

    def save_dtype(self, obj):
        self.save_global_name(_dtype_global(obj))

    dispatch[_dt.DType] = save_dtype

    def persistent_id(self, obj):
        if isinstance(obj, _StorageRef):
            return ("storage", obj.cls, obj.key, obj.location, obj.numel)
        return None

    def reducer_override(self, obj):
        if isinstance(obj, Tensor):
            return self._storages.reduce(obj)
        if isinstance(obj, _PLAIN + (_Global, _StorageRef, _dt.DType)) or any(
                obj is c for c in _REDUCERS):
            return NotImplemented
        if type(obj) in (dict, list, tuple, collections.OrderedDict):
            return NotImplemented
        if isinstance(obj, (set, frozenset)) and type(obj) in (set, frozenset):
            return NotImplemented
        raise TypeError(f"save: cannot save a {type(obj).__module__}.{type(obj).__qualname__} "
                        f"(torch.load(weights_only=True) reads tensors, dicts, OrderedDicts, "
                        f"lists, tuples, sets, dtypes and plain numbers and strings only; save a "
                        f"Module's state_dict())")


def _dtype_global(dtype) -> _Global:
    if dtype.is_complex:
        raise TypeError(f"save: {dtype.name} is not saved (nbx.load has no complex storages); "
                        f"save .real and .imag")
    return _Global("torch", dtype.name)


class _Storages:
    """The storages the saved tensors use, one archive entry per storage object, in order."""

    def __init__(self):
        self.entries: list = []                 # (key, storage, nbytes)
        self._by_storage: dict[int, tuple] = {}  # id(storage) -> (_StorageRef, dtype)

    def reduce(self, t: Tensor):
        dt = t.dtype
        if dt.is_complex:
            _dtype_global(dt)
        st = t.untyped_storage()
        known = self._by_storage.get(id(st))
        if known is None:
            key = str(len(self.entries))
            untyped = dt.name in _UNTYPED
            numel = st.nbytes if untyped else st.nbytes // dt.itemsize
            cls = _Global("torch.storage", "UntypedStorage") if untyped else \
                _Global("torch", _STORAGE_CLASS[dt.name])
            loc = str(t.device) if t.device.type == "cuda" else "cpu"
            ref = _StorageRef(key, cls, numel, loc)
            self.entries.append((key, st, numel if untyped else numel * dt.itemsize))
            self._by_storage[id(st)] = known = (ref, dt)
        ref, first = known
        if first != dt:
            raise TypeError(f"save: tensors that share memory are saved with one dtype, got "
                            f"{first.name} and {dt.name} views of one storage (torch refuses "
                            f"them too); save a .clone() of one")
        args = (ref, t.storage_offset(), tuple(t.shape), tuple(t.stride()), False,
                collections.OrderedDict())
        if dt.name in _UNTYPED:
            return (_Global("torch._utils", "_rebuild_tensor_v3"), args + (_dtype_global(dt),))
        return (_Global("torch._utils", "_rebuild_tensor_v2"), args)


def _write_aligned(zf: zipfile.ZipFile, name: str, data) -> None:
    """A stored member whose bytes start at a multiple of _ALIGN in the file: the local header
    carries a padding extra field (id 'FB', as torch's writer)."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = len(data)      # decides whether zipfile adds its 20-byte zip64 field
    zip64 = info.file_size * 1.05 > zipfile.ZIP64_LIMIT
    start = zf.fp.tell() + 30 + len(name.encode()) + (20 if zip64 else 0)
    pad = (-(start + 4)) % _ALIGN
    info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
    with zf.open(info, "w") as m:
        m.write(data)


def save_torch(obj, f) -> None:
    """Write `obj` (a state dict, or nested dicts/lists/tuples of tensors and plain values) to
    `f` (a path or a writable binary file) in torch's zip format.

    Tensors on any device are saved with their storage; a cuda tensor's storage is marked with
    its device (`cuda:N`, as torch does), host tensors' with 'cpu'."""
    storages = _Storages()
    buf = io.BytesIO()
    _Pickler(buf, storages).dump(obj)
    own = isinstance(f, (str, bytes, os.PathLike))
    if not own and not hasattr(f, "write"):
        raise TypeError(f"f: expected a file path or a writable binary file, got "
                        f"{type(f).__name__}")
    fh = open(os.fsdecode(f), "wb") if own else f
    try:
        with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            _write_aligned(zf, "archive/data.pkl", buf.getvalue())
            _write_aligned(zf, "archive/.format_version", b"1")
            _write_aligned(zf, "archive/.storage_alignment", str(_ALIGN).encode())
            _write_aligned(zf, "archive/byteorder", b"little")
            for key, st, nbytes in storages.entries:
                host = getattr(st, "host_array", None)   # host memory is written in place
                data = host()[:nbytes] if host is not None else st.to_host(0, nbytes)
                _write_aligned(zf, f"archive/data/{key}", memoryview(data).cast("B"))
            _write_aligned(zf, "archive/version", b"3\n")
    finally:
        if own:
            fh.close()
