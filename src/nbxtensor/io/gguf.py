"""GGUF: metadata and tensors, parsed here (no `gguf` package needed to read).

Our own parser: the `gguf` package's reader builds a NumPy memmap view per field part
(~250k views for a 49k-token vocabulary: ~2 s of a SmolLM2 load); this one walks the
header with struct and decodes string arrays in one loop (~0.05 s). Dequantisation to
float is ours too (backends/cpu/ggml_blocks.py on the host, kernels/quant.py on the GPU).

Layout (GGUF v2/v3, little-endian): "GGUF" | u32 version | u64 n_tensors | u64 n_kv |
n_kv x (string key, u32 type, value) | n_tensors x (string name, u32 n_dims,
n_dims x u64 ne, u32 ggml type, u64 offset) | padding to `general.alignment` (32) |
tensor data (each at data_start + offset). A string is u64 length + UTF-8 bytes; an
array is u32 element type + u64 count + elements.

Shapes are given in torch order (rows first): ggml's [ne0, ne1] becomes (ne1, ne0), so
a linear layer's weight is (out_features, in_features) as in HF checkpoints.
"""
from __future__ import annotations

import math
import mmap
import os
import struct

import numpy as np

from ..backends.cpu import ggml_blocks as _quant
from ..files import regular_file

__all__ = ["GGUFFile", "GGUFTensor", "load_gguf", "GGML_TYPES"]

# ggml type id -> (name, weights per block, bytes per block) (ggml.h / gguf constants)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
}

# metadata value types: id -> struct format (8 = string, 9 = array)
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
       6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9
_TYPE_NAMES = {0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32",
               6: "FLOAT32", 7: "BOOL", 8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64",
               12: "FLOAT64"}
# what a reader of a key may ask for -> the declared types that satisfy it (llama.cpp reads
# by declared type; we let an integer key be of any integer width)
_INT = frozenset((0, 1, 2, 3, 4, 5, 10, 11))
_KINDS = {"int": _INT, "float": frozenset((6, 12)), "bool": frozenset((7,)),
          "str": frozenset((_STRING,))}
_KIND_NAMES = {"int": "an integer type", "float": "FLOAT32 or FLOAT64", "bool": "BOOL",
               "str": "STRING"}
_REQUIRED = object()
_INT64_MAX = 2**63 - 1
_MAX_DIMS = 4           # GGML_MAX_DIMS
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class GGUFTensor:
    """One tensor: name, GGML type name, torch-order shape, and its raw bytes (a flat
    read-only uint8 view of the memory-mapped file)."""

    __slots__ = ("name", "qtype", "shape", "raw", "offset")

    def __init__(self, name, qtype, shape, raw, offset=0):
        self.name, self.qtype, self.shape, self.raw, self.offset = name, qtype, shape, raw, offset

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        if self.qtype not in _quant.BLOCK_SIZES:
            kind = "an integer type" if self.qtype[0] == "I" and self.qtype[1:].isdigit() \
                else "a format we cannot dequantise"
            raise ValueError(f"tensor {self.name!r} is {self.qtype}, {kind}, where a float "
                             f"weight is expected (supported: {', '.join(_quant.SUPPORTED)})")
        return _quant.dequantize(self.raw, self.qtype, self.shape, dtype)

    def blocks(self) -> np.ndarray:
        """Raw bytes as (rows, bytes_per_row) uint8 (for GPU upload of quantised weights)."""
        rows = math.prod(self.shape[:-1])
        return self.raw.reshape(rows, -1)

    def __repr__(self):
        return f"GGUFTensor({self.name!r}, {self.qtype}, shape={self.shape})"


class _Reader:
    """Bounds-checked little-endian reads from the mapped file."""

    def __init__(self, buf, where):
        self.buf, self.off, self.size, self.where = buf, 0, len(buf), where

    def need(self, n, what):
        if n < 0 or self.off + n > self.size:
            raise ValueError(f"{self.where}: truncated or corrupt: {what} needs {n} bytes at "
                             f"offset {self.off}, the file has {self.size}")

    def u32(self, what):
        self.need(4, what)
        v = _U32.unpack_from(self.buf, self.off)[0]
        self.off += 4
        return v

    def u64(self, what):
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.off)[0]
        self.off += 8
        return v

    def string(self, what):
        n = self.u64(what)
        self.need(n, what)
        s = self.buf[self.off:self.off + n].decode("utf-8", errors="surrogateescape")
        self.off += n
        return s

    def strings(self, count, what):
        # the hot loop of a vocabulary: locals, no per-item bound check beyond the slice's
        buf, off, size, out = self.buf, self.off, self.size, []
        unpack, append = _U64.unpack_from, out.append
        for i in range(count):
            if off + 8 > size:
                self.off = off
                self.need(8, f"{what}[{i}]")
            n = unpack(buf, off)[0]
            off += 8
            if off + n > size:
                self.off = off
                self.need(n, f"{what}[{i}]")
            append(buf[off:off + n].decode("utf-8", errors="surrogateescape"))
            off += n
        self.off = off
        return out

    def value(self, vtype, what, depth=0):
        if vtype in _SCALAR:
            fmt = "<" + _SCALAR[vtype]
            n = struct.calcsize(fmt)
            self.need(n, what)
            v = struct.unpack_from(fmt, self.buf, self.off)[0]
            self.off += n
            return v
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            if depth > 8:
                raise ValueError(f"{self.where}: corrupt: {what} nests arrays too deep")
            etype = self.u32(what)
            count = self.u64(what)
            if etype in _NP:
                dt = np.dtype(_NP[etype]).newbyteorder("<")
                self.need(count * dt.itemsize, what)
                a = np.frombuffer(self.buf, dt, count, self.off)
                self.off += count * dt.itemsize
                return a
            if etype == _STRING:
                self.need(count * 8, what)          # at least the lengths: rejects absurd counts
                return self.strings(count, what)
            if etype == _ARRAY:
                self.need(count * 12, what)
                return [self.value(_ARRAY, f"{what}[{i}]", depth + 1) for i in range(count)]
            raise ValueError(f"{self.where}: corrupt: {what} has array element type {etype}")
        raise ValueError(f"{self.where}: corrupt: {what} has value type {vtype} (known: 0-12)")


class GGUFFile:
    """An open GGUF file. `get(key)` returns metadata as Python values (arrays as lists,
    `array(key)` as NumPy); `tensors` maps names to GGUFTensor (raw bytes stay
    memory-mapped until dequantised or uploaded)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        where = f"GGUF {self.path!r}"
        self._where = where
        regular_file(self.path, "GGUF file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
            size = os.fstat(f.fileno()).st_size
            if magic != b"GGUF":
                raise ValueError(f"{where}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._mm = mm
        r = _Reader(mm, where)
        r.off = 4
        version = r.u32("the version")
        if version not in (2, 3):
            hint = " (big-endian files are not supported)" if version > 0xFFFF else ""
            raise ValueError(f"{where}: GGUF version {version} is not supported (2 or 3){hint}")
        n_tensors = r.u64("the tensor count")
        n_kv = r.u64("the metadata count")
        # each entry takes >= 12 (kv) / 24 (tensor info) bytes: bounds absurd counts early
        if n_kv * 12 + n_tensors * 24 > size:
            raise ValueError(f"{where}: truncated or corrupt: header claims {n_kv} metadata "
                             f"entries and {n_tensors} tensors in a {size}-byte file")
        self._raw_meta, self._types = self._read_metadata(r, n_kv)
        infos = self._read_tensor_infos(r, n_tensors)
        self._meta: dict = {}
        align = self.typed("general.alignment", "int", 32)
        if align <= 0 or align & (align - 1):
            raise ValueError(f"{where}: corrupt: general.alignment {align!r} is not a power of two")
        data_start = -(-r.off // align) * align
        self.data_offset = data_start
        self.alignment = align
        self.version = version
        self.tensors = self._place_tensors(infos, np.frombuffer(mm, np.uint8), data_start,
                                           align, size)

    def _read_metadata(self, r, n_kv):
        """key -> raw value, and key -> (value type, array element type or None)."""
        where, meta, types = self._where, {}, {}
        for i in range(n_kv):
            key = r.string(f"metadata key {i}")
            if key in meta:
                raise ValueError(f"{where}: corrupt: metadata key {key!r} appears twice")
            vtype = r.u32(f"metadata {key!r} type")
            if vtype == _ARRAY:       # the element type, for typed reads (read again below)
                r.need(4, f"metadata {key!r}")
                types[key] = (vtype, _U32.unpack_from(r.buf, r.off)[0])
            else:
                types[key] = (vtype, None)
            meta[key] = r.value(vtype, f"metadata {key!r}")
        return meta, types

    def _read_tensor_infos(self, r, n_tensors):
        """[(name, dims innermost first, GGML type id, data offset)] in file order."""
        where, infos = self._where, []
        for i in range(n_tensors):
            name = r.string(f"tensor {i} name")
            nd = r.u32(f"tensor {name!r} n_dims")
            if nd > _MAX_DIMS:
                raise ValueError(f"{where}: corrupt: tensor {name!r} has {nd} dimensions "
                                 f"(max {_MAX_DIMS})")
            ne = [r.u64(f"tensor {name!r} shape") for _ in range(nd)]
            tid = r.u32(f"tensor {name!r} type")
            off = r.u64(f"tensor {name!r} offset")
            infos.append((name, ne, tid, off))
        return infos

    def _place_tensors(self, infos, base, data_start, align, size):
        """name -> GGUFTensor over the mapped bytes, each checked against the file.
        gguf.cpp's rule: in file order, each tensor's offset is the running total of the
        sizes before it, each padded to the alignment (no overlap, no gap, no reordering)."""
        where, tensors = self._where, {}
        expect = 0
        for name, ne, tid, off in infos:
            if name in tensors:
                raise ValueError(f"{where}: corrupt: tensor {name!r} appears twice")
            if tid not in GGML_TYPES:
                raise ValueError(f"{where}: tensor {name!r} has unknown GGML type id {tid}")
            qtype, bs, ts = GGML_TYPES[tid]
            shape = tuple(int(n) for n in reversed(ne))
            numel = math.prod(shape)
            # an empty tensor's other dims count too: NumPy cannot make (0, 2**62) either
            if any(n > _INT64_MAX for n in ne) or math.prod(max(n, 1) for n in shape) * 8 > \
                    _INT64_MAX:
                raise ValueError(f"{where}: corrupt: tensor {name!r} has shape {shape}, whose "
                                 f"size in bytes does not fit int64")
            row = shape[-1] if shape else 1
            if row % bs:
                raise ValueError(f"{where}: tensor {name!r} ({qtype}, shape {shape}): rows of "
                                 f"{row} are not a multiple of the block size {bs}")
            want = numel // bs * ts
            if off != expect:
                raise ValueError(f"{where}: corrupt: tensor {name!r} has data offset {off}, "
                                 f"expected {expect} (the padded sizes of the tensors before it, "
                                 f"alignment {align})")
            begin = data_start + off
            if begin + want > size:
                raise ValueError(f"{where}: truncated: tensor {name!r} ({qtype}, shape {shape}) "
                                 f"needs {want} bytes at offset {begin}, file has {size}")
            tensors[name] = GGUFTensor(name, qtype, shape, base[begin:begin + want], begin)
            expect += -(-want // align) * align
        return tensors

    def get(self, key, default=None):
        """A metadata value: int/float/bool/str, or a list for arrays (None-safe default)."""
        if key not in self._raw_meta:
            return default
        v = self._meta.get(key)
        if v is None:
            v = self._raw_meta[key]
            if isinstance(v, np.ndarray):
                v = v.tolist()
            self._meta[key] = v
        return v

    def typed(self, key, kind: str, default=_REQUIRED, *, positive: bool = False):
        """The value of `key` read by its declared type, as llama.cpp reads: `kind` is 'int'
        (any integer width), 'float' (FLOAT32/64), 'bool' or 'str', or one of those with '[]'
        for an array of it (a list). A key of another type raises ValueError "key K has type
        T, expected U"; a missing key returns `default`, or raises when none is given.
        positive=True refuses a value <= 0 (counts where zero is meaningless)."""
        if key not in self._raw_meta:
            if default is _REQUIRED:
                raise ValueError(f"{self._where}: missing metadata key {key!r}")
            return default
        vtype, etype = self._types[key]
        base = kind[:-2] if kind.endswith("[]") else kind
        ok = _KINDS[base]
        if kind.endswith("[]"):
            good = vtype == _ARRAY and etype in ok
            want = f"ARRAY of {_KIND_NAMES[base]}"
        else:
            good = vtype in ok
            want = _KIND_NAMES[base]
        if not good:
            got = _TYPE_NAMES.get(vtype, str(vtype)) + (
                f" of {_TYPE_NAMES.get(etype, str(etype))}" if vtype == _ARRAY else "")
            raise ValueError(f"{self._where}: key {key!r} has type {got}, expected {want}")
        v = self.get(key)
        if positive and (v <= 0 if not isinstance(v, list) else not all(x > 0 for x in v)):
            raise ValueError(f"{self._where}: key {key!r} is {v!r:.80}, expected > 0")
        if base == "float" and not isinstance(v, list) and not math.isfinite(v):
            raise ValueError(f"{self._where}: key {key!r} is {v!r:.80}, expected a finite number")
        return v

    def n_vocab(self) -> int | None:
        """The vocabulary size: the token list's length, else token_embd's rows (None when
        the file has neither)."""
        if "tokenizer.ggml.tokens" in self._raw_meta:
            return len(self.typed("tokenizer.ggml.tokens", "str[]"))
        t = self.tensors.get("token_embd.weight")
        return t.shape[0] if t is not None and t.shape else None

    def token_id(self, key, vocab: int | None = None) -> int | None:
        """A special-token id (`tokenizer.ggml.*_token_id`): an integer in [0, vocab)
        (vocab: n_vocab() unless given); None when the key is absent."""
        v = self.typed(key, "int", None)
        if v is None:
            return None
        n = self.n_vocab() if vocab is None else vocab
        if v < 0 or (n is not None and v >= n):
            raise ValueError(f"{self._where}: key {key!r} is {v}, outside the vocabulary "
                             f"[0, {n})" if n is not None else
                             f"{self._where}: key {key!r} is {v}, a token id must be >= 0")
        return v

    def stop_token_ids(self, vocab: int | None = None) -> list:
        """The end-of-sequence id, then the end-of-turn id when it differs (chat models end a
        reply with EOT): the ids generation stops at."""
        ids = []
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
            v = self.token_id(key, vocab)
            if v is not None and v not in ids:
                ids.append(v)
        return ids

    def array(self, key) -> np.ndarray | list:
        """An array value as stored: a NumPy array (numeric) or a list of str."""
        v = self._raw_meta.get(key)
        if v is None:
            raise KeyError(f"GGUF {self.path!r}: no metadata key {key!r}")
        if not isinstance(v, (np.ndarray, list)):
            raise TypeError(f"GGUF {self.path!r}: metadata {key!r} is a "
                            f"{type(v).__name__}, not an array")
        return v

    def __contains__(self, key):
        return key in self._raw_meta

    def keys(self):
        return list(self._raw_meta)

    @property
    def architecture(self) -> str:
        return self.typed("general.architecture", "str", None)

    def tensor(self, name) -> GGUFTensor:
        t = self.tensors.get(name)
        if t is None:
            raise KeyError(f"GGUF {self.path!r}: no tensor named {name!r}")
        return t

    def token_list(self, key) -> list:
        """A string array (vocabulary, merges)."""
        if key not in self._raw_meta:
            raise KeyError(f"GGUF {self.path!r}: no metadata key {key!r}")
        return self.typed(key, "str[]")


def load_gguf(path) -> GGUFFile:
    return GGUFFile(path)
