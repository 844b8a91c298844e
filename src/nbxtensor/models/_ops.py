"""The ops the models use, in one place.

Ops are being written concurrently by their families, so which implementation runs is
an explicit choice, not a guess:

* cuda / interp: always the public nbxtensor op (nbx.linear, nbx.rms_norm, ...); a
  missing one raises NotImplementedOnDevice -- never a silent detour through the host.
* cpu: the public op for names in `REAL_ON_CPU` (ops verified against the golden
  tests), else a NumPy stand-in on `t.numpy()` views (`_np` branches; TODO: delete
  each when its op is verified on cpu). NBX_MODELS_OPS=real uses every public op that
  exists on cpu too; NBX_MODELS_OPS=numpy forces the stand-ins.

Quantised weights (`QuantWeight`) go to the fused dequantise-GEMV kernel
(kernels/quant.py) on cuda/interp and are dequantised on the host for cpu.
"""
from __future__ import annotations

import math
import os

import numpy as np

import nbxtensor as nbx
from ..dispatch import NotImplementedOnDevice

# verified against the golden tests on cpu (2026-11-29); the rest use the stand-ins
REAL_ON_CPU: set[str] = {"linear", "add", "mul", "rms_norm", "layer_norm", "silu", "gelu",
                         "embedding", "scaled_dot_product_attention"}
_MODE = os.environ.get("NBX_MODELS_OPS", "auto")


def _real(name, t):
    """The public op `name` to use for tensor `t`, or None for the cpu stand-in."""
    f = getattr(nbx, name, None)
    if t.device.type == "cpu":
        if _MODE == "numpy" or (_MODE != "real" and name not in REAL_ON_CPU):
            return None
        return f
    if f is None:
        raise NotImplementedOnDevice(f"models: nbx.{name} does not exist yet, so this model "
                                     f"cannot run on {t.device} (the NumPy stand-in is cpu-only)")
    return f


def _host(t, what):
    if t.device.type != "cpu":
        raise NotImplementedOnDevice(f"models: nbx.{what} is not available yet and its NumPy "
                                     f"stand-in runs on cpu only (tensor on {t.device})")
    return t.numpy()


def _wrap(a):
    return nbx.from_numpy(np.ascontiguousarray(a))


class QuantWeight:
    """A GGML-quantised (out, in) weight kept as raw blocks on its device."""

    __slots__ = ("blocks", "qtype", "shape")

    def __init__(self, blocks, qtype, shape):
        self.blocks, self.qtype, self.shape = blocks, qtype, tuple(shape)

    @property
    def device(self):
        return self.blocks.device


# ------------------------------------------------------------------------ linear algebra
def linear(x, w, b=None):
    """x @ w.T (+ b); w is (out, in) or a QuantWeight."""
    if isinstance(w, QuantWeight):
        from ..kernels.quant import quant_linear
        return quant_linear(x, w, b)
    f = _real("linear", x)
    if f is not None:
        return f(x, w, b)
    xa, wa = _host(x, "linear"), _host(w, "linear")
    y = xa @ wa.T
    if b is not None:
        y += _host(b, "linear")
    return _wrap(y)


def add(a, b):
    f = _real("add", a)
    if f is not None:
        return f(a, b)
    return _wrap(_host(a, "add") + _host(b, "add"))


def mul(a, b):
    f = _real("mul", a)
    if f is not None:
        return f(a, b)
    return _wrap(_host(a, "mul") * _host(b, "mul"))


# ------------------------------------------------------------------------ normalisation
def rms_norm(x, w, eps):
    f = _real("rms_norm", x)
    if f is not None:
        return f(x, (x.shape[-1],), w, eps)
    xa = _host(x, "rms_norm")
    acc = xa.astype(np.float32)
    y = acc / np.sqrt(np.mean(acc * acc, axis=-1, keepdims=True) + eps)
    return _wrap((y * _host(w, "rms_norm")).astype(xa.dtype))


def layer_norm(x, w, b, eps):
    f = _real("layer_norm", x)
    if f is not None:
        return f(x, (x.shape[-1],), w, b, eps)
    xa = _host(x, "layer_norm").astype(np.float32)
    mu = xa.mean(-1, keepdims=True)
    var = ((xa - mu) ** 2).mean(-1, keepdims=True)
    y = (xa - mu) / np.sqrt(var + eps) * _host(w, "layer_norm") + _host(b, "layer_norm")
    return _wrap(y.astype(x.dtype.np))


# ------------------------------------------------------------------------ activations
def silu_mul(gate, up):
    """silu(gate) * up (SwiGLU)."""
    if _real("silu", gate) is not None and _real("mul", gate) is not None:
        return nbx.mul(nbx.silu(gate), up)
    g, u = _host(gate, "silu"), _host(up, "silu")
    return _wrap(g / (1.0 + np.exp(-g)) * u)


_ERF = np.frompyfunc(math.erf, 1, 1)


def gelu(x):
    """Exact (erf) GELU, as BERT's 'gelu'."""
    f = _real("gelu", x)
    if f is not None:
        return f(x)
    xa = _host(x, "gelu")
    # float64 erf through a table-free rational approximation would drift; use math.erf
    e = _ERF(xa.astype(np.float64) / math.sqrt(2.0)).astype(np.float64)
    return _wrap((0.5 * xa * (1.0 + e)).astype(xa.dtype))


# ------------------------------------------------------------------------ lookups
def embedding(ids, w):
    """Rows of `w` (a Tensor or QuantWeight) at integer `ids` (a Tensor)."""
    if isinstance(w, QuantWeight):
        from ..kernels.quant import dequantize_rows
        return dequantize_rows(w, ids)
    f = _real("embedding", w)
    if f is not None:
        return f(ids, w)
    return _wrap(_host(w, "embedding")[_host(ids, "embedding")])


# ------------------------------------------------------------------------ RoPE + attention
def rope(x, cos, sin):
    """HF rotate_half RoPE. x: (B, H, T, D); cos, sin: (T, D) -- computed in float32."""
    # TODO(issue 6): the device RoPE kernel; composed from public ops meanwhile
    if x.device.type != "cpu" or _MODE == "real":
        return _rope_ops(x, cos, sin)
    xa = _host(x, "rope").astype(np.float32)
    c, s = _host(cos, "rope"), _host(sin, "rope")
    h = xa.shape[-1] // 2
    rot = np.concatenate([-xa[..., h:], xa[..., :h]], axis=-1)
    return _wrap((xa * c + rot * s).astype(x.dtype.np))


def _rope_ops(x, cos, sin):
    h = x.shape[-1] // 2
    xf = x.to(nbx.float32)
    rot = nbx.cat([nbx.neg(xf[..., h:]), xf[..., :h]], dim=-1)
    return nbx.add(nbx.mul(xf, cos), nbx.mul(rot, sin)).to(x.dtype)


def attention(q, k, v, *, causal: bool, q_offset: int = 0, key_mask=None):
    """Softmax attention with GQA. q: (B, Hq, T, D); k, v: (B, Hkv, S, D).

    causal: query i (absolute position q_offset + i) sees keys 0..q_offset+i.
    key_mask: optional (B, S) bool, False = padding (never attended).
    """
    f = _real("scaled_dot_product_attention", q)
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if f is not None:
        mask = None
        if causal and q_offset:
            i = np.arange(T)[:, None] + q_offset
            mask = nbx.tensor(np.arange(S)[None, :] <= i, device=q.device)
        if key_mask is not None:
            km = key_mask.reshape(B, 1, 1, S)
            mask = km if mask is None else nbx.logical_and(mask, km)
        return f(q, k, v, attn_mask=mask, is_causal=causal and not q_offset,
                 enable_gqa=Hq != Hkv)
    qa, ka, va = _host(q, "sdpa"), _host(k, "sdpa"), _host(v, "sdpa")
    g = Hq // Hkv
    qa = qa.astype(np.float32).reshape(B, Hkv, g * T, D)
    s = qa @ ka.astype(np.float32).transpose(0, 1, 3, 2) / math.sqrt(D)   # (B, Hkv, g*T, S)
    s = s.reshape(B, Hkv, g, T, S)
    if causal:
        allowed = np.arange(S)[None, :] <= (np.arange(T) + q_offset)[:, None]
        s = np.where(allowed, s, -np.inf)
    if key_mask is not None:
        km = _host(key_mask, "sdpa").reshape(B, 1, 1, 1, S)
        s = np.where(km, s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    o = s.reshape(B, Hkv, g * T, S) @ va.astype(np.float32)
    return _wrap(o.reshape(B, Hq, T, D).astype(q.dtype.np))


def mean_pool_normalize(x, mask):
    """sentence-transformers pooling: mean over unmasked tokens, then L2 normalisation.
    x: (B, T, D); mask: (B, T) bool."""
    if x.device.type != "cpu":
        # small (B, D) epilogue: the pooled sums come back to the host once per batch
        x, mask = x.cpu(), mask.cpu()
    xa, m = _host(x, "mean pooling").astype(np.float32), _host(mask, "mean pooling")
    mf = m[..., None].astype(np.float32)
    pooled = (xa * mf).sum(1) / np.maximum(mf.sum(1), 1e-9)
    n = np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return _wrap(pooled / n)


# ------------------------------------------------------------------------ fused decode GEMV
def fused_linear(x, w, *, norm_weight=None, eps=1e-6, bias=None, residual=None, glu=False,
                 out_dtype=None):
    """One projection of the decode step with its neighbours fused in:

        h = rms_norm(x, norm_weight, eps) if norm_weight is given else x
        y = h @ w.T (+ bias)            w (N, K); with glu w is [gate; up] (2N, K) and
        y = silu(h @ gate.T) * (h @ up.T)
        y = y + residual                if residual is given
    x (M, K); the result (M, N) has x's dtype (or out_dtype); all sums in fp32, one rounding.
    cuda/interp: kernels/decode_fused.py (one kernel); cpu: the same in NumPy (fp32).
    """
    from ..tensor import Tensor
    op = "fused_linear"
    if not isinstance(x, Tensor) or x.ndim != 2:
        raise ValueError(f"{op}: x must be a 2-D Tensor (M, K), got "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    if not isinstance(w, Tensor) or w.ndim != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"{op}: w must be a 2-D Tensor (N, {x.shape[1]}), got "
                         f"{tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__}")
    if glu and w.shape[0] % 2:
        raise ValueError(f"{op}: glu needs w = [gate; up] with an even row count, got {w.shape[0]}")
    if glu and bias is not None:
        raise ValueError(f"{op}: bias with glu is not supported")
    M, K = x.shape
    N = w.shape[0] // 2 if glu else w.shape[0]
    for name, t, shape in (("norm_weight", norm_weight, (K,)), ("bias", bias, (N,)),
                           ("residual", residual, (M, N))):
        if t is None:
            continue
        if not isinstance(t, Tensor) or tuple(t.shape) != shape:
            raise ValueError(f"{op}: {name} must be a Tensor of shape {shape}, got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
        if t.device != x.device:
            raise ValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")
    if w.device != x.device:
        raise ValueError(f"{op}: w is on {w.device} but x is on {x.device}")
    if w.dtype != x.dtype or not x.dtype.is_floating_point:
        raise ValueError(f"{op}: x and w must share one floating dtype, got {x.dtype.name} "
                         f"and {w.dtype.name}")
    if residual is not None and residual.dtype != x.dtype:
        raise ValueError(f"{op}: residual must be {x.dtype.name}, got {residual.dtype.name}")
    if x.device.type == "cpu":
        xa = x.numpy().astype(np.float32)
        if norm_weight is not None:
            xa = xa / np.sqrt(np.mean(xa * xa, axis=-1, keepdims=True) + np.float32(eps))
            xa = xa * norm_weight.numpy().astype(np.float32)
        y = xa @ w.numpy().astype(np.float32).T
        if bias is not None:
            y = y + bias.numpy().astype(np.float32)
        if glu:
            g, u = y[:, :N], y[:, N:]
            y = g / (1.0 + np.exp(-g)) * u
        if residual is not None:
            y = y + residual.numpy().astype(np.float32)
        return _wrap(y.astype((out_dtype or x.dtype).np))
    from ..kernels.decode_fused import fused_gemv
    # unit stride along K (16-byte loads); the decode step's tensors already are
    if x.stride(1) != 1:
        x = x.contiguous()
    if w.stride(1) != 1:
        raise ValueError(f"{op}: w must have unit stride along K (prepare it at load)")
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()
    for name, t in (("norm_weight", norm_weight), ("bias", bias)):
        if t is not None and t.stride(0) != 1:
            raise ValueError(f"{op}: {name} must be contiguous")
    out = Tensor._empty((M, N), nbx.dtypes.as_dtype(out_dtype or x.dtype), x.device)
    return fused_gemv(x, w, norm_weight=norm_weight, eps=eps, bias=bias, residual=residual,
                      glu=glu, out=out)
