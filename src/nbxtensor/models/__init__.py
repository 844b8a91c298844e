"""Models: a Llama-family decoder, a BERT sentence encoder, generation and sampling."""
from __future__ import annotations

from .bert import BertModel
from .generate import GenerationResult, generate
from ..kv_cache import KVCache
from .llama import LlamaModel
from .registry import resolve
from .sampling import Sampler

__all__ = ["LlamaModel", "BertModel", "KVCache", "Sampler", "generate", "GenerationResult",
           "load_model", "resolve"]


def load_model(model: str, device=None, dtype=None):
    """Load MODEL (folder, GGUF file, or a known name such as 'smollm2' or 'minilm')."""
    from ..device import as_device
    kind, path = resolve(model)
    dev = as_device(device) if device is not None else default_device()
    if kind == "llama-gguf":
        return LlamaModel.from_gguf(path, device=dev, dtype=dtype)
    if kind == "llama-folder":
        return LlamaModel.from_folder(path, device=dev, dtype=dtype)
    if kind == "moe-folder":
        from .moe import MoeModel
        return MoeModel.from_folder(path, device=dev, dtype=dtype)
    return BertModel.from_folder(path, device=dev, dtype=dtype)


def default_device():
    """cuda when a GPU answers, else cpu."""
    from ..device import as_device
    try:
        from .. import cuda
        if cuda.is_available():
            return as_device("cuda")
    except Exception:  # noqa: BLE001 - no cuda module / no libcuda: cpu
        pass
    return as_device("cpu")
