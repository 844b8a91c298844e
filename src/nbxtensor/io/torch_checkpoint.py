"""PyTorch checkpoints (.pth / .pt / .bin state dicts) read without torch, and without running
any code from the file.

Two container formats hold the same kind of pickle:

* zip (torch.save since 1.6): `<name>/data.pkl` is the pickle, `<name>/data/<key>` holds each
  storage's bytes, `<name>/byteorder` says 'little' or 'big' (absent: little).
* legacy (torch.save(..., _use_new_zipfile_serialization=False)): five things back to back: a
  pickled magic number, a pickled protocol version (1001), a pickled sys-info dict, the main
  pickle, a pickled list of storage keys; then, for each key in that order, an 8-byte element
  count and the storage's raw bytes.

In the pickle a tensor is `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`
(`_rebuild_tensor_v3(..., dtype)` for dtypes torch keeps in untyped storages, such as float8)
and a storage is a persistent id `('storage', torch.FloatStorage, key, location, numel[,
view])`. The unpickler below resolves globals against an allow-list only: the rebuild
functions, the storage classes, torch dtypes, OrderedDict and the few builtins that protocol-2
pickles of plain values use. Each allowed callable is our own function that checks its
arguments and returns a placeholder; every other global (os.system, builtins.eval, numpy's
reconstructors, a pickled nn.Module class) is refused by name before anything is called. The
storages are then located and bounds-checked (element counts against the file, every view's
last element against its storage), and only then are the placeholders replaced by tensors.

Host tensors are zero-copy views of a private (copy-on-write) memory map of the file where the
bytes allow it: a storage stored uncompressed, aligned to its element size. Deflated zip members
and unaligned legacy storages are copied. Views of one storage share memory, as in torch; with a
map_location each storage moves to the device once and its views follow.
"""
from __future__ import annotations

import collections
import io
import math
import os
import pickle
import stat
import struct
import zipfile

import numpy as np

from .. import dtypes as _dt
from ..creation import from_numpy
from ..device import as_device
from ..tensor import Tensor
from ..files import regular_file

__all__ = ["load_torch", "UnsafeCheckpointError"]

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
_INT64_MAX = 2**63 - 1
_MAX_DEPTH = 200            # nesting of containers in the checkpoint object
# deflate cannot expand by more than ~1032x: a member claiming more is a zip bomb or a lie
_MAX_DEFLATE_RATIO = 1100
# a state dict's pickle takes ~100 bytes a tensor: far more is a bomb (the stack it builds)
_MAX_PICKLE = 2**30


class UnsafeCheckpointError(ValueError):
    """The checkpoint's pickle asks for a global outside the allow-list (code, not data)."""


class _Invalid(ValueError):
    """What the pickle built breaks a rule of the format (raised while unpickling)."""


# ----------------------------------------------------------------------------- placeholders
class _Placeholder:
    """Base of the objects the pickle builds; BUILD (setstate) on them is refused."""
    __slots__ = ()

    def __setstate__(self, state):
        raise _Invalid(f"the pickle sets state on a {type(self).__name__[1:]}, which no "
                       f"torch checkpoint does")

    def __reduce__(self):
        raise TypeError(f"{type(self).__name__} is not picklable")


class _StorageType(_Placeholder):
    """torch.FloatStorage and kin: a dtype (None for torch.UntypedStorage: bytes)."""
    __slots__ = ("name", "dtype")

    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype


class _TypeMarker(_Placeholder):
    """torch.Tensor / torch.nn.parameter.Parameter: only as `_rebuild_from_type_v2`'s type."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


class _Storage(_Placeholder):
    """A storage the pickle names: its key, element dtype and size; its bytes come later.
    A legacy view storage is a byte range of its root storage."""
    __slots__ = ("key", "dtype", "numel", "root", "begin", "nbytes", "raw")

    def __init__(self, key, dtype, numel, root=None, begin=0):
        self.key, self.dtype, self.numel = key, dtype, numel
        self.root, self.begin = root, begin
        self.nbytes = numel * (dtype.itemsize if dtype is not None else 1)
        self.raw = None     # uint8 array of nbytes, filled once the container is read

    def data(self):
        if self.root is not None:
            return self.root.data()[self.begin:self.begin + self.nbytes]
        return self.raw


class _DtypeRef(_Placeholder):
    """A torch dtype (torch.float16) in the pickle; a DType itself would take BUILD's setattr."""
    __slots__ = ("dtype",)

    def __init__(self, dtype):
        self.dtype = dtype


class _Callable(_Placeholder):
    """An allowed global that the pickle may call (REDUCE); BUILD on it is refused, so a
    file cannot set attributes (such as __defaults__) on our functions."""
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)

    def __repr__(self):
        return f"<allowed global {self.fn.__name__}>"


class _TensorRef(_Placeholder):
    __slots__ = ("storage", "dtype", "offset", "size", "stride")

    def __init__(self, storage, dtype, offset, size, stride):
        self.storage, self.dtype, self.offset = storage, dtype, offset
        self.size, self.stride = size, stride


# ----------------------------------------------------------------------------- allowed globals
def _int_tuple(x, what, *, seq_ok=False):
    if not (isinstance(x, tuple) or (seq_ok and isinstance(x, list))) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _INT64_MAX for v in x):
        raise _Invalid(f"{what} must be a tuple of ints in [0, 2**63), got {x!r}")
    return tuple(x)


def _tensor_ref(fn, storage, storage_offset, size, stride, dtype, hooks=None, metadata=None):
    if not isinstance(storage, _Storage):
        raise _Invalid(f"{fn}: storage must be a storage persistent id, got "
                       f"{type(storage).__name__}")
    if not isinstance(storage_offset, int) or isinstance(storage_offset, bool) or not (
            0 <= storage_offset <= _INT64_MAX):
        raise _Invalid(f"{fn}: storage_offset must be an int >= 0, got {storage_offset!r}")
    size = _int_tuple(size, f"{fn}: size")
    stride = _int_tuple(stride, f"{fn}: stride")
    if len(size) != len(stride):
        raise _Invalid(f"{fn}: size {size} and stride {stride} have different lengths")
    if hooks is not None and not (isinstance(hooks, dict) and not hooks):
        raise _Invalid(f"{fn}: backward_hooks must be an empty OrderedDict, got {hooks!r}")
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(v is False for v in metadata.values())):
        raise _Invalid(f"{fn}: tensor metadata {metadata!r} (conjugate or negative bits) is "
                       f"not supported")
    dtype = storage.dtype if dtype is None else dtype
    if dtype is None:        # an untyped storage rebuilt by v2 holds bytes
        dtype = _dt.uint8
    item = dtype.itemsize
    if math.prod(size):
        last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
        if (last + 1) * item > storage.nbytes:
            raise _Invalid(f"{fn}: a tensor of size {size}, stride {stride}, offset "
                           f"{storage_offset} reaches element {last} of storage "
                           f"{storage.key!r}, which has {storage.nbytes // item} {dtype.name} "
                           f"elements")
    elif storage_offset * item > storage.nbytes:
        raise _Invalid(f"{fn}: storage_offset {storage_offset} lies past the end of storage "
                       f"{storage.key!r} ({storage.nbytes // item} {dtype.name} elements)")
    return _TensorRef(storage, dtype, storage_offset, size, stride)


def _rebuild_tensor(storage, storage_offset, size, stride):
    return _tensor_ref("_rebuild_tensor", storage, storage_offset, size, stride, None)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks,
                       metadata=None):
    return _tensor_ref("_rebuild_tensor_v2", storage, storage_offset, size, stride, None,
                       backward_hooks, metadata)


def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks,
                       dtype, metadata=None):
    if not isinstance(dtype, _DtypeRef):
        raise _Invalid(f"_rebuild_tensor_v3: dtype must be a torch dtype, got {dtype!r}")
    return _tensor_ref("_rebuild_tensor_v3", storage, storage_offset, size, stride, dtype.dtype,
                       backward_hooks, metadata)


def _rebuild_parameter(data, requires_grad, backward_hooks):
    # a Parameter is loaded as its tensor
    if not isinstance(data, _TensorRef):
        raise _Invalid(f"_rebuild_parameter: data must be a tensor, got {type(data).__name__}")
    if not (isinstance(backward_hooks, dict) and not backward_hooks):
        raise _Invalid(f"_rebuild_parameter: backward_hooks must be empty, got "
                       f"{backward_hooks!r}")
    return data


def _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state):
    if state:
        raise _Invalid(f"_rebuild_parameter_with_state: Python attributes on a Parameter "
                       f"({sorted(map(str, state)) if isinstance(state, dict) else state!r}) "
                       f"are not supported")
    return _rebuild_parameter(data, requires_grad, backward_hooks)


_REBUILDERS = (_rebuild_tensor, _rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter,
               _rebuild_parameter_with_state)


def _rebuild_from_type_v2(func, new_type, args, state):
    # torch wraps tensors of subclasses, or with Python attributes, in this call
    if (not isinstance(func, _Callable) or func.fn not in _REBUILDERS
            or not isinstance(new_type, _TypeMarker) or not isinstance(args, tuple)):
        raise _Invalid(f"_rebuild_from_type_v2: only torch.Tensor / Parameter rebuilt by "
                       f"torch's rebuild functions are supported, got type {new_type!r}")
    if state:
        raise _Invalid("_rebuild_from_type_v2: Python attributes on a tensor are not supported")
    return func(*args)


def _encode(obj, encoding="latin1"):
    # protocol-2 pickles spell bytes as _codecs.encode(str, 'latin1')
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1"):
        raise _Invalid(f"_codecs.encode: only (str, 'latin1') is allowed, got "
                       f"({type(obj).__name__}, {encoding!r})")
    return obj.encode("latin1")


def _container(kind):
    def build(items=()):  # noqa: B006 - an immutable default
        if not isinstance(items, (list, tuple, set, frozenset)):
            raise _Invalid(f"builtins.{kind.__name__}: expected a list of items, got "
                           f"{type(items).__name__}")
        return kind(items)
    return build


def _bytearray(obj=b"", encoding=None):
    if isinstance(obj, str) and encoding in ("latin1", "latin-1"):
        return bytearray(obj.encode("latin1"))
    if isinstance(obj, bytes) and encoding is None:
        return bytearray(obj)
    raise _Invalid(f"builtins.bytearray: expected bytes or (str, 'latin-1'), got "
                   f"{type(obj).__name__}")


def _complex(real=0.0, imag=0.0):
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (real, imag)):
        raise _Invalid("builtins.complex: expected two numbers")
    return complex(real, imag)


def _size(dims=()):
    return _int_tuple(dims, "torch.Size", seq_ok=True)


def _device(kind, index=None):
    # checkpoints may hold a torch.device among their plain values: it loads as its string
    if not isinstance(kind, str) or not (index is None or (isinstance(index, int)
                                                           and not isinstance(index, bool))):
        raise _Invalid(f"torch.device: expected (str[, int]), got ({kind!r}, {index!r})")
    return kind if index is None else f"{kind}:{index}"


_STORAGES = {"FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
             "DoubleStorage": "float64", "LongStorage": "int64", "IntStorage": "int32",
             "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
             "BoolStorage": "bool"}
_DTYPE_NAMES = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
                "uint8", "bool", "float8_e4m3fn", "float8_e5m2"}
# torch types nbxtensor has no dtype for: refused with their own message, not as code
_NO_DTYPE = {"ComplexFloatStorage", "ComplexDoubleStorage", "QInt8Storage", "QUInt8Storage",
             "QInt32Storage", "QUInt4x2Storage", "QUInt2x4Storage", "complex32", "complex64",
             "complex128", "cfloat", "cdouble", "chalf", "uint16", "uint32", "uint64",
             "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
             "qint8", "quint8", "qint32", "quint4x2", "quint2x4", "bits8", "bits16", "bits1x8",
             "bits2x4", "bits4x2"}


def _allowed() -> dict:
    # OrderedDict is the one class allowed as itself: a C type, immutable, it calls nothing
    g = {"collections.OrderedDict": collections.OrderedDict,
         "_codecs.encode": _Callable(_encode),
         "torch.Size": _Callable(_size),
         "torch.device": _Callable(_device),
         "torch.Tensor": _TypeMarker("torch.Tensor"),
         "torch.nn.parameter.Parameter": _TypeMarker("torch.nn.parameter.Parameter"),
         "torch._tensor._rebuild_from_type_v2": _Callable(_rebuild_from_type_v2),
         "torch.storage.UntypedStorage": _StorageType("UntypedStorage", None),
         "torch.UntypedStorage": _StorageType("UntypedStorage", None)}
    for f in _REBUILDERS:
        g[f"torch._utils.{f.__name__}"] = _Callable(f)
    for cls, name in _STORAGES.items():
        g[f"torch.{cls}"] = _StorageType(cls, _dt.as_dtype(name))
    for name in _DTYPE_NAMES:
        g[f"torch.{name}"] = _DtypeRef(_dt.as_dtype(name))
    for mod in ("builtins", "__builtin__"):     # protocol 2 writes Python 2's module name
        g[f"{mod}.set"] = _Callable(_container(set))
        g[f"{mod}.frozenset"] = _Callable(_container(frozenset))
        g[f"{mod}.bytearray"] = _Callable(_bytearray)
        g[f"{mod}.complex"] = _Callable(_complex)
    return g


_ALLOWED = _allowed()


def _refusal(module: str, name: str) -> Exception:
    full = f"{module}.{name}"
    if module == "torch" and name in _NO_DTYPE:
        return _Invalid(f"the checkpoint holds torch.{name}, a type nbxtensor has no dtype for "
                        f"(supported: {', '.join(sorted(_DTYPE_NAMES))})")
    if module.startswith("__torch__"):
        hint = "a TorchScript archive (torch.jit.save), not a state dict"
    elif module.startswith("torch.nn.modules") or not module.startswith(("torch", "_codecs")):
        hint = ("a pickled Python object, such as a whole model (torch.save(model)); save "
                "model.state_dict() instead")
    else:
        hint = "not one of torch's tensor-rebuild functions, storage classes or dtypes"
    return UnsafeCheckpointError(
        f"refused global {full!r} ({hint}): loading never runs code from the file, so only "
        f"tensor-rebuild functions, storages, dtypes, OrderedDict and plain containers are "
        f"allowed")


class _Unpickler(pickle._Unpickler):
    """Globals from the allow-list only; persistent ids to `persistent` (a storage factory).

    The pure-Python unpickler, not the C one: the C memo is an array sized by the largest
    index a PUT names, so one LONG_BINPUT 10**9 allocates and zeroes 8 GB (a hang, then the
    OOM killer); this memo is a dict. It costs ~3x on the pickle only (~50 ms for 3000
    tensors), never on the tensor bytes."""

    def __init__(self, file, persistent=None):
        super().__init__(file)
        self._persistent = persistent

    def find_class(self, module, name):
        obj = _ALLOWED.get(f"{module}.{name}")
        if obj is None:
            raise _refusal(module, name)
        return obj

    def persistent_load(self, pid):
        if self._persistent is None:
            raise _Invalid(f"persistent id {pid!r} where the format has none")
        return self._persistent(pid)


def _unpickle(file, where: str, part: str, persistent=None):
    try:
        return _Unpickler(file, persistent).load()
    except UnsafeCheckpointError as e:
        raise UnsafeCheckpointError(f"{where}: {part}: {e}") from None
    except _Invalid as e:
        raise ValueError(f"{where}: {part}: {e}") from None
    except Exception as e:   # noqa: BLE001 - any failure of hostile bytes is a corrupt file
        kind = "truncated" if isinstance(e, EOFError) or "truncated" in str(e) else "corrupt"
        raise ValueError(f"{where}: {part}: {kind} pickle ({type(e).__name__}: {e})") from None


# ----------------------------------------------------------------------------- storages
def _stype_name(dtype) -> str:
    return "byte" if dtype is None else dtype.name


class _Storages:
    """The storages a pickle names, by key; each key declared once, consistently."""

    def __init__(self, legacy: bool):
        self.legacy = legacy
        self.roots: dict[str, _Storage] = {}
        self.views: dict[str, _Storage] = {}

    def __call__(self, pid):
        n = 6 if self.legacy else 5
        if not isinstance(pid, tuple) or len(pid) != n or pid[0] != "storage":
            raise _Invalid(f"persistent id {pid!r}: expected ('storage', type, key, location, "
                           f"numel{', view' if self.legacy else ''})")
        stype, key, location, numel = pid[1:5]
        if not isinstance(stype, _StorageType):
            raise _Invalid(f"persistent id {pid!r}: {stype!r} is not a storage class")
        if not isinstance(key, str) or not isinstance(location, str):
            raise _Invalid(f"persistent id {pid!r}: key and location must be strings")
        if not isinstance(numel, int) or isinstance(numel, bool) or not 0 <= numel <= _INT64_MAX:
            raise _Invalid(f"persistent id {pid!r}: numel must be an int >= 0")
        root = self.roots.get(key)
        if root is None:
            root = self.roots[key] = _Storage(key, stype.dtype, numel)
        elif (root.dtype, root.numel) != (stype.dtype, numel):
            raise _Invalid(f"storage {key!r} is declared twice, as {root.numel} x "
                           f"{_stype_name(root.dtype)} and as {numel} x {_stype_name(stype.dtype)}")
        view = pid[5] if self.legacy else None
        if view is None:
            return root
        if (not isinstance(view, tuple) or len(view) != 3 or not isinstance(view[0], str)
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                           for v in view[1:])):
            raise _Invalid(f"persistent id {pid!r}: view must be (key, offset, size)")
        vkey, offset, vsize = view
        if offset + vsize > numel:
            raise _Invalid(f"storage view {vkey!r}: elements [{offset}, {offset + vsize}) run "
                           f"past the end of storage {key!r} ({numel} elements)")
        item = root.dtype.itemsize if root.dtype is not None else 1
        got = self.views.get(vkey)
        if got is None:
            got = self.views[vkey] = _Storage(vkey, root.dtype, vsize, root, offset * item)
        elif (got.root, got.begin, got.numel) != (root, offset * item, vsize):
            raise _Invalid(f"storage view {vkey!r} is declared twice, differently")
        return got


def _tensors(obj, device, where: str):
    """`obj` with every tensor placeholder replaced by a Tensor; plain values as they are.
    Shared objects stay shared; only the types a checkpoint's pickle can hold get through."""
    memo: dict[int, object] = {}
    storage_tensors: dict[tuple, Tensor] = {}
    busy: set[int] = set()

    def storage_tensor(st: _Storage, dtype) -> Tensor:
        k = (id(st.root or st), st.begin, st.nbytes, dtype)
        t = storage_tensors.get(k)
        if t is None:
            raw = st.data()
            item = dtype.itemsize
            raw = raw[:raw.size - raw.size % item]
            if raw.ctypes.data % item:          # a legacy storage at an odd offset: copy it
                raw = raw.copy()
            if dtype is _dt.bool and raw.size and int(raw.max()) > 1:
                raise ValueError(f"{where}: bool storage {st.key!r} holds bytes other than "
                                 f"0 and 1")
            arr = raw.view(dtype.np) if raw.size else np.empty(0, dtype.np)
            t = from_numpy(arr)
            if device.type != "cpu":
                t = t.to(device)
            storage_tensors[k] = t
        return t

    def conv(x, depth):
        if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
            return x
        if isinstance(x, _DtypeRef):
            return x.dtype
        i = id(x)
        if i in memo:
            return memo[i]
        if i in busy:
            raise ValueError(f"{where}: the checkpoint object contains itself (a recursive "
                             f"structure), which no state dict does")
        if depth > _MAX_DEPTH:
            raise ValueError(f"{where}: containers nested deeper than {_MAX_DEPTH} levels")
        busy.add(i)
        if isinstance(x, _TensorRef):
            out = storage_tensor(x.storage, x.dtype).as_strided(x.size, x.stride, x.offset)
        elif type(x) in (dict, collections.OrderedDict):
            out = type(x)()
            for k, v in x.items():
                out[conv(k, depth + 1)] = conv(v, depth + 1)
        elif type(x) in (list, tuple, set, frozenset):    # tensors hash by identity, as in torch
            out = type(x)(conv(v, depth + 1) for v in x)
        elif type(x) is bytearray:
            out = x
        else:
            what = type(x).__name__.lstrip("_")
            raise ValueError(f"{where}: the checkpoint holds a bare {what} outside any tensor; "
                             f"only tensors and plain Python values load")
        busy.discard(i)
        memo[i] = out
        return out

    return conv(obj, 0)


# ----------------------------------------------------------------------------- containers
def _read_zip(f, fmap, size: int, where: str):
    try:
        zf = zipfile.ZipFile(f)
        infos = {i.filename: i for i in zf.infolist()}
    except Exception as e:   # noqa: BLE001 - hostile bytes can fail zipfile in many ways
        raise ValueError(f"{where}: not a readable zip archive ({e})") from None
    if len(infos) != len(zf.infolist()):    # which copy is meant is unknowable: refuse
        seen: set = set()
        dup = next(i.filename for i in zf.infolist() if i.filename in seen or seen.add(i.filename))
        raise ValueError(f"{where}: zip member {dup!r} appears twice")
    pkls = [n for n in infos if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pkls) != 1:
        extra = " (a TorchScript archive?)" if any(n.endswith("/constants.pkl") for n in infos) \
            else ""
        raise ValueError(f"{where}: a torch zip checkpoint has exactly one '<name>/data.pkl'; "
                         f"found {pkls or 'none'}{extra}")
    prefix = pkls[0][:-len("data.pkl")]

    def member(name):
        info = infos.get(name)
        if info is None:
            raise ValueError(f"{where}: missing zip member {name!r}")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ValueError(f"{where}: zip member {name!r} uses compression method "
                             f"{info.compress_type}; only stored and deflated are read")
        if (info.compress_type == zipfile.ZIP_DEFLATED
                and info.file_size > _MAX_DEFLATE_RATIO * max(info.compress_size, 1)):
            raise ValueError(f"{where}: zip member {name!r} claims {info.file_size} bytes from "
                             f"{info.compress_size} compressed bytes, more than deflate can give")
        return info

    def read(info) -> bytes:
        try:
            with zf.open(info) as m:
                data = m.read()
        except Exception as e:   # noqa: BLE001
            raise ValueError(f"{where}: zip member {info.filename!r} is corrupt ({e})") from None
        if len(data) != info.file_size:
            raise ValueError(f"{where}: zip member {info.filename!r}: read {len(data)} bytes, "
                             f"the directory says {info.file_size}")
        return data

    if prefix + "byteorder" in infos:
        order = read(member(prefix + "byteorder"))
        if order != b"little":
            raise ValueError(f"{where}: byteorder {order[:20]!r}: only little-endian checkpoints "
                             f"are supported")
    storages = _Storages(legacy=False)
    info = member(pkls[0])
    if info.file_size > _MAX_PICKLE:
        raise ValueError(f"{where}: zip member {pkls[0]!r} claims {info.file_size} bytes, more "
                         f"than the {_MAX_PICKLE}-byte limit on a checkpoint's pickle")
    try:
        m = zf.open(info)
    except Exception as e:   # noqa: BLE001 - a bad local header (a name that does not decode...)
        raise ValueError(f"{where}: zip member {pkls[0]!r} is corrupt "
                         f"({type(e).__name__}: {e})") from None
    with m:
        obj = _unpickle(m, where, pkls[0], storages)
    for key, st in storages.roots.items():
        info = member(f"{prefix}data/{key}")
        if info.file_size != st.nbytes:
            raise ValueError(f"{where}: storage {key!r} is {st.numel} x "
                             f"{st.dtype.name if st.dtype else 'byte'} "
                             f"= {st.nbytes} bytes, but its zip member holds {info.file_size}")
        if info.compress_type == zipfile.ZIP_STORED:
            begin = _stored_data_offset(fmap, info, size, where)
            st.raw = fmap[begin:begin + st.nbytes]
        else:
            st.raw = np.frombuffer(bytearray(read(info)), np.uint8)
    return obj


def _stored_data_offset(fmap, info, size: int, where: str) -> int:
    """Where a stored member's bytes start: after its local header, which we check."""
    h = info.header_offset
    name = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
    if h < 0 or h + 30 > size:
        raise ValueError(f"{where}: zip member {info.filename!r}: local header at {h} lies "
                         f"outside the file ({size} bytes)")
    head = bytes(fmap[h:h + 30])
    sig, method = head[:4], struct.unpack("<H", head[8:10])[0]
    n, m = struct.unpack("<HH", head[26:30])
    if (sig != b"PK\x03\x04" or method != zipfile.ZIP_STORED
            or bytes(fmap[h + 30:h + 30 + n]) != name):
        raise ValueError(f"{where}: zip member {info.filename!r}: its local header does not "
                         f"match the central directory")
    begin = h + 30 + n + m
    if begin + info.file_size > size:
        raise ValueError(f"{where}: zip member {info.filename!r}: {info.file_size} bytes at "
                         f"offset {begin} run past the end of the file ({size} bytes); the "
                         f"file is truncated")
    return begin


def _read_legacy(f, fmap, size: int, where: str):
    f.seek(0)       # np.memmap left the file at its end
    try:
        magic = _unpickle(f, where, "magic number")
    except UnsafeCheckpointError:
        raise
    except ValueError:
        magic = None
    if magic != _LEGACY_MAGIC:
        raise ValueError(f"{where}: not a PyTorch checkpoint: neither a zip archive nor the "
                         f"legacy format (which starts with a pickled magic number)")
    proto = _unpickle(f, where, "protocol version")
    if proto != _LEGACY_PROTOCOL:
        raise ValueError(f"{where}: legacy protocol version {proto!r}, expected "
                         f"{_LEGACY_PROTOCOL}")
    info = _unpickle(f, where, "sys info")
    if not isinstance(info, dict) or info.get("little_endian") is not True:
        raise ValueError(f"{where}: sys info {info!r}: only little-endian checkpoints are "
                         f"supported")
    storages = _Storages(legacy=True)
    obj = _unpickle(f, where, "main pickle", storages)
    keys = _unpickle(f, where, "storage key list")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"{where}: the storage key list must be a list of strings, got "
                         f"{type(keys).__name__}")
    if sorted(keys) != sorted(storages.roots):
        raise ValueError(f"{where}: the storage key list {sorted(keys)[:5]}... does not match the "
                         f"{len(storages.roots)} storages the pickle names")
    pos = f.tell()
    for key in keys:
        st = storages.roots[key]
        if pos + 8 > size:
            raise ValueError(f"{where}: storage {key!r}: the file ends at {size} before its "
                             f"element count at {pos}; the file is truncated")
        (count,) = struct.unpack("<q", bytes(fmap[pos:pos + 8]))
        if count != st.numel:
            raise ValueError(f"{where}: storage {key!r}: the file says {count} elements, the "
                             f"pickle {st.numel}")
        pos += 8
        if pos + st.nbytes > size:
            raise ValueError(f"{where}: storage {key!r}: {st.nbytes} bytes at offset {pos} run "
                             f"past the end of the file ({size} bytes); the file is truncated")
        st.raw = fmap[pos:pos + st.nbytes]
        pos += st.nbytes
    return obj


def load_torch(path, map_location=None, weights_only: bool = True):
    """Read a PyTorch checkpoint (what torch.save wrote: zip or legacy format) as torch.load
    does with weights_only=True: the saved object, its tensors as nbxtensor Tensors, dicts,
    OrderedDicts, lists and plain values kept as they are (an OrderedDict's `_metadata`
    attribute is dropped). A Parameter loads as its tensor; a torch.device as its string.

    map_location: None or 'cpu' (host tensors, zero-copy views of the file where the layout
    allows), or a device ('cuda', 'cuda:1', 'interp') to move every storage to.
    Only globals on an allow-list are resolved (UnsafeCheckpointError names any other); no code
    from the file runs, whatever it holds.
    """
    if weights_only is not True:
        raise ValueError(f"weights_only: only True is supported (loading never runs code from "
                         f"the file), got {weights_only!r}")
    if isinstance(map_location, dict) or callable(map_location):
        raise TypeError(f"map_location: expected None or a device ('cpu', 'cuda:N', 'interp'), "
                        f"got {type(map_location).__name__}; dicts and functions are not "
                        f"supported")
    device = as_device(map_location, "map_location")
    if hasattr(path, "read") and not isinstance(path, (str, bytes, os.PathLike)):
        return _load_buffer(path, device)
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"path: expected a file path or a readable binary file, got "
                        f"{type(path).__name__}")
    p = os.fsdecode(path)
    where = f"torch checkpoint {p!r}"
    regular_file(p, "torch checkpoint")
    with open(p, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):        # replaced between the stat and the open
            raise ValueError(f"{where} is not a regular file")
        size = st.st_size
        if size == 0:
            raise ValueError(f"{where}: empty file, not a PyTorch checkpoint")
        # private (copy-on-write) map: tensors are writable, the file is never written
        fmap = np.memmap(f, dtype=np.uint8, mode="c")
        obj = _read_any(f, fmap, size, where)
    return _tensors(obj, device, where)


def _read_any(f, fmap, size: int, where: str):
    head = bytes(fmap[:4])
    if head == b"PK\x03\x04":
        return _read_zip(f, fmap, size, where)
    if size >= 262 and bytes(fmap[257:262]) == b"ustar":
        raise ValueError(f"{where}: a tar-format checkpoint (torch < 0.4) is not supported")
    return _read_legacy(f, fmap, size, where)


def _load_buffer(fobj, device):
    """torch.load(buffer): the bytes from the file object's position to its end, copied once
    (the tensors own that copy; nothing maps the object)."""
    where = f"torch checkpoint {type(fobj).__name__}"
    data = fobj.read()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"path: {type(fobj).__name__}.read() returned {type(data).__name__}, "
                        f"expected bytes (open the file in binary mode)")
    if not len(data):
        raise ValueError(f"{where}: empty file, not a PyTorch checkpoint")
    buf = np.frombuffer(bytearray(data), np.uint8)
    with io.BytesIO(data) as f:
        obj = _read_any(f, buf, buf.size, where)
    return _tensors(obj, device, where)
