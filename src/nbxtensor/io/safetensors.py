"""safetensors: read (memory-mapped, lazy, zero-copy on the host) and write.

File layout: u64 little-endian header length N | N bytes of JSON | data. The JSON maps
each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative
to the first data byte) plus an optional "__metadata__" dict of strings.

Every offset is checked against the file before any byte is read, so a lying or
truncated file gives a ValueError naming the tensor, never an out-of-bounds read. As in
the reference (Rust) reader, the tensors must tile the data exactly: offsets contiguous
from 0, no hole, no overlap, no trailing byte; no name twice; `__metadata__` str -> str.
"""
from __future__ import annotations

import json
import math
import os
import struct
import sys
import time

import numpy as np

from .. import config as _config
from .. import dtypes as _dt
from ..creation import from_numpy
from ..device import as_device
from ..tensor import Tensor
from ..files import regular_file

__all__ = ["safe_open", "load_file", "save_file", "SafetensorsFile", "save", "load"]

_MAX_HEADER = 100 * 2**20
_MAX_NDIM = 64            # NumPy's limit on an array's dimensions
_INT64_MAX = 2**63 - 1
_BY_CODE = {d.safetensors: d for d in _dt.all_dtypes}
# shown on loads at least this large, when stderr is a terminal (NBX_PROGRESS=1 forces it)
PROGRESS_MIN_BYTES = 256 * 2**20


def _parse_header(buf: bytes, file_size: int, where: str):
    if file_size < 8:
        raise ValueError(f"{where}: not a safetensors file: {file_size} bytes, need at least 8 "
                         f"for the header length")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > _MAX_HEADER:
        raise ValueError(f"{where}: header length {n} exceeds the {_MAX_HEADER}-byte limit "
                         f"(corrupt file or not safetensors)")
    if 8 + n > file_size:
        raise ValueError(f"{where}: truncated file: header says {n} bytes of JSON but the file "
                         f"has only {file_size - 8} bytes after the length")
    return n


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise _Duplicate(k)
        d[k] = v
    return d


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _decode_header(raw: bytes, where: str) -> dict:
    """The JSON header: strict JSON (no NaN/Infinity), an object (the reference reader
    wants '{' first), no key twice (a second tensor of one name would hide the first)."""
    if not raw.startswith(b"{"):
        raise ValueError(f"{where}: header must be a JSON object starting with '{{', got "
                         f"{raw[:16]!r}")
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates,
                          parse_constant=_no_constant)
    except _Duplicate as e:
        raise ValueError(f"{where}: header names {e.args[0]!r} twice") from None
    except (ValueError, RecursionError) as e:   # JSONDecodeError, UnicodeDecodeError, depth
        raise ValueError(f"{where}: header is not valid UTF-8 JSON ({e})") from None


class _Entry:
    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name, dtype, shape, begin, end):
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _validate(header: dict, data_size: int, where: str) -> tuple[dict, dict]:
    """Entries checked as the reference (Rust) reader checks them: known dtype, shape of
    ints >= 0, byte size = prod(shape) * itemsize, and the offsets, in order, tile the data
    exactly from 0 (no hole, no overlap, no trailing byte)."""
    if not isinstance(header, dict):
        raise ValueError(f"{where}: header must be a JSON object, got {type(header).__name__}")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError(f"{where}: __metadata__ must map strings to strings, got {meta!r:.200}")
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise ValueError(f"{where}: tensor {name!r}: entry must have dtype, shape and "
                             f"data_offsets, got {info!r:.200}")
        code = info["dtype"]
        if not isinstance(code, str) or code not in _BY_CODE:
            raise ValueError(f"{where}: tensor {name!r}: unknown or unsupported dtype {code!r}; "
                             f"supported: {', '.join(sorted(_BY_CODE))}")
        dtype = _BY_CODE[code]
        shape = info["shape"]
        if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
            raise ValueError(f"{where}: tensor {name!r}: shape must be a list of ints >= 0, "
                             f"got {shape!r:.200}")
        if len(shape) > _MAX_NDIM:
            raise ValueError(f"{where}: tensor {name!r}: shape has {len(shape)} dimensions, "
                             f"more than the {_MAX_NDIM} an array can have")
        # an empty tensor's other dims must still make a shape an array can have
        if math.prod(max(s, 1) for s in shape) * dtype.itemsize > _INT64_MAX:
            raise ValueError(f"{where}: tensor {name!r}: shape {shape!r:.200} of {code} is "
                             f"too large (its byte size does not fit int64)")
        offs = info["data_offsets"]
        if not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs):
            raise ValueError(f"{where}: tensor {name!r}: data_offsets must be [begin, end], "
                             f"got {offs!r:.200}")
        begin, end = offs
        if not 0 <= begin <= end:
            raise ValueError(f"{where}: tensor {name!r}: bad data_offsets {offs} (need "
                             f"0 <= begin <= end)")
        if end > data_size:
            raise ValueError(f"{where}: tensor {name!r}: data_offsets {offs} run past the end of "
                             f"the data ({data_size} bytes); the file is truncated or the header "
                             f"lies")
        want = math.prod(shape) * dtype.itemsize
        if end - begin != want:
            raise ValueError(f"{where}: tensor {name!r}: shape {shape} of {code} needs {want} "
                             f"bytes, but data_offsets {offs} span {end - begin}")
        entries[name] = _Entry(name, dtype, tuple(shape), begin, end)
    at, prev = 0, None
    for e in sorted(entries.values(), key=lambda e: (e.begin, e.end)):
        if e.begin != at:
            if prev is None:
                what = "does not start at 0"
            elif e.begin < at:
                what = f"overlaps {prev.name!r} {[prev.begin, prev.end]}"
            else:
                what = (f"leaves a hole of {e.begin - at} bytes after {prev.name!r} "
                        f"{[prev.begin, prev.end]}")
            raise ValueError(f"{where}: tensor {e.name!r} at data_offsets {[e.begin, e.end]} "
                             f"{what}; tensors must tile the data contiguously from offset 0")
        at, prev = e.end, e
    if at != data_size:
        raise ValueError(f"{where}: {data_size - at} trailing bytes after the last tensor "
                         f"(the tensors cover {at} of {data_size} data bytes)")
    return entries, dict(meta)


class _Progress:
    """A one-line progress bar with the read rate, on stderr, for large loads only."""

    def __init__(self, total: int, label: str):
        force = _config.get("NBX_PROGRESS")
        self.on = (force == "1") or (force == "auto" and total >= PROGRESS_MIN_BYTES
                                     and sys.stderr.isatty())
        self.total, self.done, self.label = total, 0, label
        self.t0 = self.last = time.perf_counter()

    def update(self, n: int) -> None:
        self.done += n
        if not self.on:
            return
        now = time.perf_counter()
        if now - self.last < 0.1 and self.done < self.total:
            return
        self.last = now
        frac = self.done / max(self.total, 1)
        rate = self.done / max(now - self.t0, 1e-9) / 2**20
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {self.done / 2**20:8.1f}/"
                         f"{self.total / 2**20:.1f} MiB  {rate:7.1f} MiB/s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.on:
            sys.stderr.write("\n")
            sys.stderr.flush()


class SafetensorsFile:
    """An open safetensors file: names, metadata and lazily loaded tensors.

    Host tensors are zero-copy views of a read-only memory map; they stay valid after
    the file object is closed (the map lives as long as any view of it).
    """

    def __init__(self, path, device=None):
        self.path = os.fspath(path)
        self.device = as_device(device)      # get_tensor's default device
        where = f"safetensors {self.path!r}"
        size = regular_file(self.path, "safetensors file").st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            n = _parse_header(head, size, where)
            raw = f.read(n)
        if len(raw) != n:
            raise ValueError(f"{where}: truncated file: the header ends after {len(raw)} of "
                             f"{n} bytes")
        header = _decode_header(raw, where)
        self._data_start = 8 + n
        self._entries, self._metadata = _validate(header, size - self._data_start, where)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r") if size > 0 else None
        self._where = where

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self._map = None

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name) -> bool:
        return name in self._entries

    def metadata(self) -> dict:
        return dict(self._metadata)

    def info(self, name: str) -> tuple:
        """(dtype, shape) without reading data."""
        e = self._entry(name)
        return e.dtype, e.shape

    def _entry(self, name):
        e = self._entries.get(name)
        if e is None:
            raise KeyError(f"{self._where}: no tensor named {name!r} (it has {len(self._entries)} "
                           f"tensors, e.g. {list(self._entries)[:5]})")
        return e

    def get_numpy(self, name: str) -> np.ndarray:
        """A read-only NumPy view of the tensor's bytes in the file (no copy)."""
        e = self._entry(name)
        if self._map is None:
            raise ValueError(f"{self._where}: file is closed")
        a = self._map[self._data_start + e.begin:self._data_start + e.end]
        return a.view(e.dtype.np).reshape(e.shape)

    def get_tensor(self, name: str, device=None, dtype=None) -> Tensor:
        """The tensor `name`; on cpu a zero-copy view of the file, else copied to `device`."""
        arr = self.get_numpy(name)
        device = self.device if device is None else as_device(device)
        from . import staging
        if device.type == "cuda" and arr.nbytes >= staging.SINGLE_MIN_BYTES:
            # [staging] pinned, chunked upload straight from the map (small ones: a plain copy)
            t = staging.upload_many([(name, arr)], device)[name]
            if dtype is not None and _dt.as_dtype(dtype) is not t.dtype:
                t = t.to(dtype=dtype)
            return t
        t = from_numpy(arr) if arr.size else from_numpy(np.empty(arr.shape, arr.dtype))
        if device.type != "cpu" or (dtype is not None and _dt.as_dtype(dtype) is not t.dtype):
            t = t.to(device=device, dtype=dtype)
        return t

    def nbytes(self, names=None) -> int:
        names = self._entries if names is None else names
        return sum(self._entries[n].end - self._entries[n].begin for n in names)


def open_folder(folder):
    """The *.safetensors files of a model folder, opened: (files, {tensor name: its file},
    a progress line over their total size). A name in two files is refused (which copy is
    meant is unknowable), never picked."""
    import glob
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors files")
    opened = [SafetensorsFile(f) for f in files]
    index = {}
    for f in opened:
        for k in f.keys():
            if k in index:
                raise ValueError(f"{folder}: tensor {k!r} is in both {index[k].path!r} and "
                                 f"{f.path!r}")
            index[k] = f
    prog = _Progress(sum(f.nbytes() for f in opened), f"loading {os.path.basename(folder)}")
    return files, index, prog


def safe_open(path, framework: str = "nbx", device=None) -> SafetensorsFile:
    """Open a safetensors file (safetensors' spelling; `framework` is ignored). `device` is
    where get_tensor puts tensors unless it is given one."""
    return SafetensorsFile(path, device)


def load_file(path, device=None, dtype=None) -> dict[str, Tensor]:
    """All tensors of a file as a dict; zero-copy views on cpu."""
    f = SafetensorsFile(path)
    prog = _Progress(f.nbytes(), f"loading {os.path.basename(f.path)}")
    dev = as_device(device)
    if dev.type == "cuda":      # [staging] one uploader for the file: pinned ring, overlap
        from .staging import Uploader
        with Uploader(dev, total_bytes=f.nbytes(), progress=prog) as up:
            out = {name: up.upload(f.get_numpy(name), name=name) for name in f.keys()}
        prog.close()
        if dtype is not None:
            dt = _dt.as_dtype(dtype)
            out = {k: (v if v.dtype is dt else v.to(dtype=dt)) for k, v in out.items()}
        return out
    out = {}
    for name in f.keys():
        out[name] = f.get_tensor(name, device=device, dtype=dtype)
        prog.update(f._entries[name].end - f._entries[name].begin)
    prog.close()
    return out


def _serialize(tensors: dict, metadata) -> tuple[bytes, list]:
    if not isinstance(tensors, dict):
        raise TypeError(f"save_file: tensors must be a dict of name -> Tensor, got "
                        f"{type(tensors).__name__}")
    if metadata is not None and (not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise TypeError("save_file: metadata must be a dict of str -> str")
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        t = tensors[name]
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"save_file: bad tensor name {name!r}")
        if isinstance(t, np.ndarray):
            t = from_numpy(np.ascontiguousarray(t))
        if not isinstance(t, Tensor):
            raise TypeError(f"save_file: tensors[{name!r}] must be a Tensor, got "
                            f"{type(t).__name__}")
        a = np.ascontiguousarray(t.numpy())
        blobs.append(a.reshape(-1).view(np.uint8))
        header[name] = {"dtype": t.dtype.safetensors, "shape": list(t.shape),
                        "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-(8 + len(js)) % 8)   # pad so the data starts 8-byte aligned
    return struct.pack("<Q", len(js)) + js, blobs


def save_file(tensors: dict, path, metadata: dict | None = None) -> None:
    """Write `tensors` (name -> Tensor or ndarray) to `path` in safetensors format."""
    head, blobs = _serialize(tensors, metadata)
    tmp = os.fspath(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b.data)
    os.replace(tmp, path)


def save(tensors: dict, metadata: dict | None = None) -> bytes:
    head, blobs = _serialize(tensors, metadata)
    return head + b"".join(b.tobytes() for b in blobs)


def load(data: bytes, device=None) -> dict[str, Tensor]:
    """Tensors from safetensors bytes (copies)."""
    where = "safetensors bytes"
    n = _parse_header(data[:8], len(data), where)
    header = _decode_header(bytes(data[8:8 + n]), where)
    entries, _ = _validate(header, len(data) - 8 - n, where)
    buf = np.frombuffer(data, np.uint8)
    out = {}
    for name, e in entries.items():
        a = buf[8 + n + e.begin:8 + n + e.end].copy().view(e.dtype.np).reshape(e.shape)
        out[name] = from_numpy(a).to(as_device(device))
    return out
