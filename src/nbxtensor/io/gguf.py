"""GGUF: metadata and tensors. The `gguf` package parses the container; dequantisation
to float is ours (io/quant.py on the host, kernels/quant.py on the GPU).

Shapes are given in torch order (rows first): ggml's [ne0, ne1] becomes (ne1, ne0), so
a linear layer's weight is (out_features, in_features) as in HF checkpoints.
"""
from __future__ import annotations

import math
import os

import numpy as np

from . import quant as _quant

__all__ = ["GGUFFile", "GGUFTensor", "load_gguf"]


class GGUFTensor:
    """One tensor: name, GGML type name, torch-order shape, and its raw bytes (a memory map)."""

    __slots__ = ("name", "qtype", "shape", "raw")

    def __init__(self, name, qtype, shape, raw):
        self.name, self.qtype, self.shape, self.raw = name, qtype, shape, raw

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        return _quant.dequantize(self.raw, self.qtype, self.shape, dtype)

    def blocks(self) -> np.ndarray:
        """Raw bytes as (rows, bytes_per_row) uint8 (for GPU upload of quantised weights)."""
        rows = math.prod(self.shape[:-1])
        return np.asarray(self.raw).reshape(-1).view(np.uint8).reshape(rows, -1)

    def __repr__(self):
        return f"GGUFTensor({self.name!r}, {self.qtype}, shape={self.shape})"


def _field_value(field):
    try:
        v = field.contents()
    except Exception:  # noqa: BLE001 - fall back to the raw parts for odd field types
        v = [np.asarray(field.parts[i]).tolist() for i in field.data]
    if isinstance(v, np.generic):
        v = v.item()
    return v


class GGUFFile:
    """An open GGUF file. `metadata` maps keys to Python values; `tensors` maps names to
    GGUFTensor (raw bytes stay memory-mapped until dequantised)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        where = f"GGUF {self.path!r}"
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"{where}: no such file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ValueError(f"{where}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        try:
            import gguf
        except ImportError:
            raise ImportError("reading GGUF needs the `gguf` package: pip install gguf") from None
        try:
            reader = gguf.GGUFReader(self.path, "r")
        except Exception as e:  # the reader raises many kinds on a damaged file
            raise ValueError(f"{where}: cannot parse the file (truncated or corrupt?): "
                             f"{type(e).__name__}: {e}") from None
        self._reader = reader
        # the large arrays (vocabulary, merges) are decoded on demand in `metadata`
        self._fields = reader.fields
        self._meta: dict = {}
        self.tensors: dict[str, GGUFTensor] = {}
        size = os.path.getsize(self.path)
        for t in reader.tensors:
            qtype = t.tensor_type.name
            shape = tuple(int(n) for n in reversed([int(x) for x in t.shape]))
            if qtype in _quant.BLOCK_SIZES:
                want = math.prod(shape) // _quant.BLOCK_SIZES[qtype][0] * _quant.BLOCK_SIZES[qtype][1]
                if t.data.nbytes != want or t.data_offset + want > size:
                    raise ValueError(f"{where}: tensor {t.name!r} ({qtype}, shape {shape}) needs "
                                     f"{want} bytes at offset {t.data_offset}, file has {size}")
            self.tensors[t.name] = GGUFTensor(t.name, qtype, shape, t.data)

    def get(self, key, default=None):
        if key in self._meta:
            return self._meta[key]
        f = self._fields.get(key)
        if f is None:
            return default
        v = self._meta[key] = _field_value(f)
        return v

    def __contains__(self, key):
        return key in self._fields

    def keys(self):
        return list(self._fields)

    @property
    def architecture(self) -> str:
        return self.get("general.architecture")

    def tensor(self, name) -> GGUFTensor:
        t = self.tensors.get(name)
        if t is None:
            raise KeyError(f"GGUF {self.path!r}: no tensor named {name!r}")
        return t

    def token_list(self, key) -> list:
        """A string array (vocabulary, merges) decoded fast from the raw parts."""
        f = self._fields[key]
        return [bytes(f.parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data]


def load_gguf(path) -> GGUFFile:
    return GGUFFile(path)
