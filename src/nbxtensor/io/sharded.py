"""Hugging Face style checkpoint folders: the shards an index names, merged into one state dict."""
from __future__ import annotations

import json
import os

__all__ = ["load_sharded"]

_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_SINGLE = ("model.safetensors", "pytorch_model.bin")


def _load_file(path, device):
    if path.endswith(".safetensors"):
        from .safetensors import load_file
        return load_file(path, device=device)
    from .torch_checkpoint import load_torch
    return load_torch(path, map_location=device)


def load_sharded(folder, device=None) -> dict:
    """The state dict of a Hugging Face style checkpoint folder: the shards named by
    model.safetensors.index.json (or pytorch_model.bin.index.json), merged; a folder with a
    single model.safetensors / pytorch_model.bin reads that file. Each shard is checked to
    hold exactly the tensors the index gives it."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"load_sharded: {folder!r} is not a directory")
    for index_name in _INDEXES:
        index_path = os.path.join(folder, index_name)
        if os.path.isfile(index_path):
            break
    else:
        for name in _SINGLE:
            if os.path.isfile(os.path.join(folder, name)):
                return dict(_load_file(os.path.join(folder, name), device))
        raise FileNotFoundError(f"load_sharded: {folder!r} has none of {_INDEXES + _SINGLE}")
    with open(index_path, encoding="utf-8") as f:
        index = json.load(f)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"load_sharded: {index_path} has no 'weight_map' object")
    shards: dict = {}
    for key, shard in weight_map.items():
        if not isinstance(shard, str) or os.path.basename(shard) != shard:
            raise ValueError(f"load_sharded: {index_path} maps {key!r} to {shard!r}; expected "
                             f"a file name in the folder")
        shards.setdefault(shard, set()).add(key)
    out = {}
    for shard, keys in shards.items():
        part = _load_file(os.path.join(folder, shard), device)
        missing = sorted(keys - set(part))
        if missing:
            raise KeyError(f"load_sharded: {shard} lacks {missing[:5]} that {index_name} "
                           f"places there")
        out.update({k: part[k] for k in keys})
    return out
