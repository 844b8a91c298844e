"""The decode step's fused projection on cpu ("numpy" family): ops/decode.decode_linear in
NumPy, every sum in float32 and one rounding to the output dtype, as the kernels do."""
from __future__ import annotations

import numpy as np

from ...dispatch import register


def _silu(g):
    # exp(-g) overflows to inf for very negative g, where silu is -0.0: the right value,
    # computed without NumPy's overflow warning (the kernels compute it silently too)
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g))


def _f32(t):
    return t.numpy().astype(np.float32)


def _project(xa, wa, *, norm_weight, eps, bias, residual, glu, out_dtype):
    """The fused projection over float32 arrays x (M, K), w (N or 2N, K)."""
    from ...creation import from_numpy
    if norm_weight is not None:
        xa = xa / np.sqrt(np.mean(xa * xa, axis=-1, keepdims=True) + np.float32(eps))
        xa = xa * _f32(norm_weight)
    y = xa @ wa.T
    if bias is not None:
        y = y + _f32(bias)
    if glu:
        n = wa.shape[0] // 2
        y = _silu(y[:, :n]) * y[:, n:]
    if residual is not None:
        y = y + _f32(residual)
    return from_numpy(np.ascontiguousarray(y.astype(out_dtype.np)))


@register("decode_linear", "numpy")
def decode_linear(x, w, *, norm_weight, eps, bias, residual, glu, out_dtype):
    return _project(_f32(x), _f32(w), norm_weight=norm_weight, eps=eps, bias=bias,
                    residual=residual, glu=glu, out_dtype=out_dtype)


@register("decode_linear_quant", "numpy")
def decode_linear_quant(x, w, *, norm_weight, eps, bias, residual, glu, out_dtype):
    """A QuantWeight's blocks decoded on the host (ggml_blocks.py), then the same fp32 sums."""
    from .ggml_blocks import check_blocks, dequantize
    FUSED = ("Q8_0", "Q4_1")    # the formats the fused kernels take (kernels/quant_fused.py)
    if w.qtype not in FUSED:
        raise ValueError(f"decode_linear: quantised weight type {w.qtype!r} has no fused "
                         f"kernel; supported: {', '.join(FUSED)}")
    check_blocks(w, "decode_linear")
    wa = dequantize(w.blocks.numpy(), w.qtype, w.shape, np.float32)
    return _project(_f32(x), wa, norm_weight=norm_weight, eps=eps, bias=bias,
                    residual=residual, glu=glu, out_dtype=out_dtype)
