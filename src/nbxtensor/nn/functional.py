"""nbx.nn.functional: torch.nn.functional's names, re-exported from the op families.

Nothing is implemented here: each name is looked up lazily (on first use) in the family
module that defines it. List a name only once its family provides it: __all__ is built from
the table, so a missing one breaks `from nbxtensor.nn.functional import *`
(tests/test_nn.py checks).
"""
from __future__ import annotations

import importlib

# name -> (family module, attribute there)
_SOURCES = {
    # matrix products (ops/linalg.py)
    "linear": ("linalg", "linear"), "fused_linear": ("linalg", "fused_linear"),
    # softmax and normalisation (ops/nn.py)
    "softmax": ("nn", "softmax"), "log_softmax": ("nn", "log_softmax"),
    "layer_norm": ("nn", "layer_norm"), "rms_norm": ("nn", "rms_norm"),
    "group_norm": ("nn", "group_norm"), "batch_norm": ("nn", "batch_norm"),
    "add_rms_norm": ("nn", "add_rms_norm"), "add_layer_norm": ("nn", "add_layer_norm"),
    # activations (ops/elementwise.py)
    "gelu": ("elementwise", "gelu"), "silu": ("elementwise", "silu"),
    "relu": ("elementwise", "relu"), "relu_": ("elementwise", "relu_"),
    "sigmoid": ("elementwise", "sigmoid"), "tanh": ("elementwise", "tanh"),
    "softplus": ("elementwise", "softplus"), "leaky_relu": ("elementwise", "leaky_relu"),
    "elu": ("elementwise", "elu"), "mish": ("elementwise", "mish"),
    "hardswish": ("elementwise", "hardswish"), "hardsigmoid": ("elementwise", "hardsigmoid"),
    "glu": ("elementwise", "glu"),
    # indexing and shape (ops/indexing.py, ops/shape.py)
    "embedding": ("indexing", "embedding"), "pad": ("shape", "pad"),
    # attention (ops/attention.py)
    "scaled_dot_product_attention": ("attention", "scaled_dot_product_attention"),
}

__all__ = sorted(_SOURCES)


def __getattr__(name):
    src = _SOURCES.get(name)
    if src is None:
        raise AttributeError(f"module 'nbxtensor.nn.functional' has no attribute {name!r}")
    mod = importlib.import_module(f"nbxtensor.ops.{src[0]}")
    try:
        fn = getattr(mod, src[1])
    except AttributeError:
        raise AttributeError(f"nbxtensor.nn.functional.{name}: not provided yet by "
                             f"nbxtensor.ops.{src[0]}") from None
    globals()[name] = fn   # cache: later look-ups skip __getattr__
    return fn


def __dir__():
    return __all__
