"""The one seam between an op and its implementation.

An op (in `nbxtensor.ops`) validates its inputs, works out the result's shape and
dtype, allocates the output, and then calls `impl(name, device)(...)` to fill it.

Two implementation families exist:
  "numpy"   for the cpu device       -- modules in nbxtensor.backends.cpu
  "triton"  for cuda and interp      -- modules in nbxtensor.kernels (the same kernels;
                                         the launcher picks the driver from the device)

Implementations register themselves with `@register("name", "numpy")` at import time.
A module is imported on the first dispatch of an op it implements (`HOMES` says which),
so `import nbxtensor` never imports triton and the first `x + x` on cuda imports the
element-wise kernels only, not every kernel family.
"""
from __future__ import annotations

import importlib

from .device import Device

__all__ = ["register", "impl", "family_of", "home_of", "NotImplementedOnDevice", "HOMES"]

_FAMILY_PACKAGES = {"numpy": "nbxtensor.backends.cpu", "triton": "nbxtensor.kernels"}
_IMPLS: dict[tuple[str, str], object] = {}
_loaded: set[str] = set()          # families whose every module is imported
_imported: set[str] = set()        # family modules imported by `_load_home`

# Which module of a family registers an op: {family: {module: op names}}. An op listed
# nowhere is element-wise (the hand-written entries and the declared ops of ops/_declare.py
# register in the `elementwise` modules, or in ops/elementwise.py itself for cpu).
# tests/runtime/test_import.py fails when a module registers an op this table places
# elsewhere; an op missing here still dispatches (its family loads whole), only slower.
HOMES = {
    "numpy": {
        "attention": ("sdpa", "decode_attention", "rope", "kv_append"),
        "conv": ("conv", "conv_transpose"),
        "core": ("copy_", "fill_"),
        "decode": ("decode_linear", "decode_linear_quant"),
        "indexing": ("index_gather", "index_scatter", "index_linearize", "masked_fill",
                     "scatter_mean_finish"),
        "linalg": ("matmul",),
        "moe": ("moe_topk", "moe_align_block_size", "fused_experts"),
        "nn": ("softmax", "layer_norm", "rms_norm", "group_norm", "batch_norm"),
        "paged_attention": ("paged_decode_attention", "paged_kv_append"),
        "pooling": ("pool",),
        "quant": ("quant_linear", "quant_embedding"),
        "reduction": ("reduce", "scan"),
        "resample": ("resample", "grid_sample"),
        "rnn": ("lstm_scan",),
        "sampling": ("sample",),
        "scan": ("logcumsumexp",),
        "shape": ("cat", "flip", "roll", "repeat", "repeat_interleave", "tril", "triu", "pad"),
        "sort": ("sort", "topk", "nonzero", "unique", "unique_dim", "svdvals"),
    },
    "triton": {
        "attention": ("sdpa",),
        "conv": ("conv", "conv_transpose"),
        "decode_attention": ("decode_attention",),
        "decode_fused": ("decode_linear", "decode_qkv_rope"),
        "elementwise": ("copy_", "fill_"),
        "indexing": ("index_gather", "index_scatter", "index_linearize", "masked_fill",
                     "scatter_mean_finish"),
        "linalg": ("lu_factor", "cholesky", "solve_triangular", "qr", "eigh"),
        "matmul": ("matmul",),
        "moe": ("moe_topk", "moe_align_block_size", "fused_experts"),
        "norm": ("layer_norm", "rms_norm", "group_norm", "batch_norm"),
        "paged_attention": ("paged_decode_attention", "paged_kv_append"),
        "pooling": ("pool",),
        "quant": ("quant_linear", "quant_dequantize", "quant_embedding"),
        "quant_fused": ("decode_linear_quant", "decode_qkv_rope_quant"),
        "reduction": ("reduce", "scan"),
        "resample": ("resample", "grid_sample", "pixel_shuffle"),
        "rnn": ("lstm_scan",),
        "rope": ("rope", "kv_append"),
        "sampling": ("sample", "argmax_commit", "commit_tokens"),
        "scan": ("logcumsumexp",),
        "shape": ("cat", "flip", "roll", "repeat", "repeat_interleave", "tril", "triu", "pad"),
        "softmax": ("softmax",),
        "sort": ("sort", "topk", "nonzero", "unique"),
    },
}
DEFAULT_HOME = "elementwise"
_HOME_OF = {(op, fam): mod for fam, mods in HOMES.items() for mod, ops in mods.items()
            for op in ops}
_BY_DEVTYPE: dict[tuple[str, str], object] = {}   # (name, device.type) -> fn: impl()'s hot path


class DeviceValueError(str):
    """The `what` of an error record (kernels/indexing's flag) for a value check a kernel
    makes rather than an index range: the flag reports it as ValueError(f"{op}: {what}")."""


class NotImplementedOnDevice(NotImplementedError):
    """An op has no implementation for the device it was called on."""


def family_of(device: Device) -> str:
    return "numpy" if device.type == "cpu" else "triton"


def register(name: str, family: str):
    """Decorator: register `fn` as the `family` implementation of op `name`."""
    if family not in _FAMILY_PACKAGES:
        raise ValueError(f"register: family must be one of {sorted(_FAMILY_PACKAGES)}, got {family!r}")

    def deco(fn):
        key = (name, family)
        if key in _IMPLS and _IMPLS[key] is not fn:
            raise RuntimeError(f"register: op {name!r} already has a {family} implementation "
                               f"({_IMPLS[key].__module__})")
        _IMPLS[key] = fn
        _BY_DEVTYPE.clear()
        return fn
    return deco


def home_of(name: str, family: str) -> str:
    """The module (`package.module`) that registers op `name` of `family`."""
    return f"{_FAMILY_PACKAGES[family]}.{_HOME_OF.get((name, family), DEFAULT_HOME)}"


def _load_home(name: str, family: str) -> None:
    mod = home_of(name, family)
    if mod not in _imported:
        importlib.import_module(mod)      # its ImportError surfaces, as in _load
        _imported.add(mod)


def _load(family: str) -> None:
    """Every module of `family` (an op registered where HOMES does not say; the ops table)."""
    if family in _loaded:
        return
    import pkgutil
    pkg = importlib.import_module(_FAMILY_PACKAGES[family])
    for mod in pkgutil.iter_modules(pkg.__path__):
        if not mod.name.startswith("_"):
            # a module that fails to import raises here, every time, instead of leaving its
            # ops silently "not implemented on this device"
            importlib.import_module(f"{pkg.__name__}.{mod.name}")
    _loaded.add(family)


def impl(name: str, device: Device):
    """The implementation of op `name` for `device`, or NotImplementedOnDevice."""
    fn = _BY_DEVTYPE.get((name, device.type))
    if fn is not None:
        return fn
    family = family_of(device)
    fn = _IMPLS.get((name, family))
    if fn is None:
        _load_home(name, family)
        fn = _IMPLS.get((name, family))
    if fn is None:
        _load(family)
        fn = _IMPLS.get((name, family))
        if fn is None:
            raise NotImplementedOnDevice(f"{name} is not implemented on device {device}")
    _BY_DEVTYPE[(name, device.type)] = fn
    return fn
