"""nbx.nn.functional: torch.nn.functional's names, re-exported from the op families.

Nothing is implemented here: each name is looked up lazily (on first use) in the family
module that defines it. List a name only once its family provides it: __all__ is built from
the table, so a missing one breaks `from nbxtensor.nn.functional import *`
(tests/nn/test_nn.py checks).
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
    # mixture of experts (ops/moe.py; vLLM's names, torch has none)
    **{n: ("moe", n) for n in ("fused_moe", "fused_experts", "moe_topk",
                               "moe_align_block_size")},
    # losses, distances, encodings (ops/losses.py)
    **{n: ("losses", n) for n in ("one_hot", "normalize", "cosine_similarity",
                                  "pairwise_distance", "cdist", "cross_entropy", "nll_loss",
                                  "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                                  "kl_div", "binary_cross_entropy",
                                  "binary_cross_entropy_with_logits")},
    # convolutions (ops/conv.py)
    **{n: ("conv", n) for n in ("conv1d", "conv2d", "conv3d", "conv_transpose1d",
                                "conv_transpose2d", "conv_transpose3d")},
    # pooling (ops/pooling.py) and resampling (ops/resample.py)
    **{n: ("pooling", n) for n in ("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d",
                                   "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d",
                                   "adaptive_avg_pool2d", "adaptive_avg_pool3d",
                                   "adaptive_max_pool1d", "adaptive_max_pool2d",
                                   "adaptive_max_pool3d")},
    **{n: ("resample", n) for n in ("interpolate", "upsample", "upsample_nearest",
                                    "upsample_bilinear", "grid_sample", "affine_grid",
                                    "pixel_shuffle", "pixel_unshuffle", "unfold", "fold")},
}

__all__ = sorted(_SOURCES)

# entries written over the op surface (nn/_compose.py): plain module attributes, so the
# look-up above never sees them
from ._compose import (alpha_dropout, bilinear, celu, dropout, dropout1d, dropout2d,  # noqa: E402
                       dropout3d, embedding_bag, feature_alpha_dropout, hardshrink, hardtanh,
                       hardtanh_, instance_norm, logsigmoid, prelu, relu6, rrelu, selu,
                       softmin, softshrink, softsign, tanhshrink, threshold)
from . import _compose as _c  # noqa: E402
__all__ = sorted(set(__all__) | set(_c.__all__))


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
