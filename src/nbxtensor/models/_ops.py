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
(kernels/quant.py) on cuda/interp and to backends/cpu/quant.py's kernels on cpu.
"""
from __future__ import annotations

import math

import numpy as np

import nbxtensor as nbx
from .. import config as _config
from ..dispatch import NotImplementedOnDevice

# verified against the golden tests on cpu (2026-11-29); the rest use the stand-ins
REAL_ON_CPU: set[str] = {"linear", "add", "mul", "rms_norm", "layer_norm", "silu", "gelu",
                         "embedding", "scaled_dot_product_attention"}
_MODE = _config.get("NBX_MODELS_OPS")


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
        if w.device.type == "cpu":          # backends/cpu/quant.py (numba)
            from ..dispatch import impl
            return impl("quant_linear", w.device)(x, w, b)
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
def _silu_np(g):
    # exp(-g) overflows to inf for very negative g, where silu is -0.0: the right value,
    # computed without NumPy's overflow warning (the kernels compute it silently too)
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g))


def silu_mul(gate, up):
    """silu(gate) * up (SwiGLU)."""
    if _real("silu", gate) is not None and _real("mul", gate) is not None:
        return nbx.mul(nbx.silu(gate), up)
    g, u = _host(gate, "silu"), _host(up, "silu")
    return _wrap(_silu_np(g) * u)


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
        if w.device.type == "cpu":          # backends/cpu/quant.py (numba)
            from ..dispatch import impl
            return impl("quant_embedding", w.device)(ids, w)
        from ..kernels.quant import dequantize_rows
        return dequantize_rows(w, ids)
    f = _real("embedding", w)
    if f is not None:
        return f(ids, w)
    wh, ih = _host(w, "embedding"), _host(ids, "embedding")
    bad = (ih < 0) | (ih >= wh.shape[0])        # NumPy would wrap negative ids
    if bad.any():
        from ..ops.indexing import _oob_error
        raise _oob_error(("embedding", f"a weight of {wh.shape[0]} rows", 0, wh.shape[0]),
                         int(ih[bad].max()))
    return _wrap(wh[ih])


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


# ------------------------------------------------------------------------ decode step: PDL
# The PDL policy of the decode kernels is kernels/_pdl.py (re-exported by decode_fused): on for
# cuda, off on interp/cpu, NBX_PDL=0 or set_pdl(False) turns it off. Re-exported here for the
# model code and for kernels outside this area that take a `pdl` flag (pass pdl_enabled(dev)).
from ..kernels.decode_fused import pdl_enabled, set_pdl  # noqa: E402,F401


def _check_commit(tokens, positions, B, op):
    from ..tensor import Tensor
    for n, t in (("tokens", tokens), ("positions", positions)):
        # int32/int64 only: a narrower int would wrap a token id or a position silently
        if not isinstance(t, Tensor) or tuple(t.shape) != (B, 1) or \
                t.dtype not in (nbx.int32, nbx.int64):
            raise ValueError(f"{op}: {n} must be an int32 or int64 Tensor of shape ({B}, 1), "
                             f"got {(tuple(t.shape), t.dtype.name) if isinstance(t, Tensor) else type(t).__name__}")


def greedy_commit(logits, tokens, positions):
    """The greedy end of a decode step, in place: tokens[b, 0] = argmax(logits[b]) (the first
    index of the max, NaN counting as the max, as torch) and positions[b, 0] += 1.
    cuda/interp: one kernel (kernels/sampling.argmax_commit); cpu and float64 logits:
    nbx.argmax + copy + add."""
    from ..tensor import Tensor
    op = "greedy_commit"
    if not isinstance(logits, Tensor) or logits.ndim != 2 or not logits.dtype.is_floating_point:
        raise ValueError(f"{op}: logits must be a 2-D float Tensor (B, V), got "
                         f"{(tuple(logits.shape), logits.dtype.name) if isinstance(logits, Tensor) else type(logits).__name__}")
    B = logits.shape[0]
    _check_commit(tokens, positions, B, op)
    for n, t in (("tokens", tokens), ("positions", positions)):
        if t.device != logits.device:
            raise ValueError(f"{op}: {n} is on {t.device} but logits on {logits.device}")
    # float64: the kernel compares in fp32 (values closer than fp32 resolves would tie)
    if logits.device.type == "cpu" or logits.shape[1] == 0 or logits.dtype.itemsize > 4:
        tokens.copy_(nbx.argmax(logits, dim=-1).reshape(B, 1))
        nbx.add(positions, 1, out=positions)
        return tokens
    from ..kernels.sampling import argmax_commit
    argmax_commit(logits, tokens, positions)
    return tokens


def commit_tokens(nxt, tokens, positions):
    """tokens[b, 0] = nxt[b]; positions[b, 0] += 1 (one kernel on cuda/interp)."""
    from ..tensor import Tensor
    op = "commit_tokens"
    B = tokens.shape[0] if isinstance(tokens, Tensor) else -1
    if not isinstance(nxt, Tensor) or tuple(nxt.shape) != (B,) or nxt.dtype.is_floating_point:
        raise ValueError(f"{op}: nxt must be an int Tensor of shape ({B},), got "
                         f"{tuple(nxt.shape) if isinstance(nxt, Tensor) else type(nxt).__name__}")
    _check_commit(tokens, positions, B, op)
    if nxt.device.type == "cpu":
        tokens.copy_(nxt.reshape(B, 1))
        nbx.add(positions, 1, out=positions)
        return tokens
    from ..kernels.sampling import commit
    commit(nxt, tokens, positions)
    return tokens


def fused_qkv_rope(x, w, cache, layer, positions, *, num_heads, norm_weight=None, eps=1e-6,
                   bias=None, theta=10000.0, scaling=None):
    """The decode step's attention input in one kernel (cuda/interp, plain weights, up to
    SMALL_M rows on cuda): q, k, v = split(rms_norm?(x) @ w.T (+ bias)), RoPE (rotate_half)
    on q and k at the device positions, k and v appended to `cache` layer `layer` (its
    lengths set to positions + 1). x (B, K); w = [wq; wk; wv] ((Hq + 2 Hkv) * D, K);
    positions (B, 1) int. Returns q (B, Hq, 1, D), rotated. A Q8_0/Q4_1 QuantWeight w takes
    kernels/quant_fused.py's kernel under the same conditions. Elsewhere (cpu, other
    quantised formats, more than SMALL_M rows on cuda, x's dtype != the cache's, value_dim
    != head_dim, odd D) the same composed of fused_linear and KVCache.append_rope."""
    from ..kv_cache import KVCache
    from ..tensor import Tensor
    op = "fused_qkv_rope"
    if not isinstance(cache, KVCache):
        raise TypeError(f"{op}: cache must be an nbx.KVCache, got {type(cache).__name__}")
    Hkv, D = cache.num_kv_heads, cache.head_dim
    if not isinstance(num_heads, int) or num_heads <= 0 or num_heads % Hkv:
        raise ValueError(f"{op}: num_heads must be a positive multiple of the cache's "
                         f"{Hkv} kv heads, got {num_heads!r}")
    if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[0] != cache.batch:
        raise ValueError(f"{op}: x must be a 2-D Tensor ({cache.batch}, K), got "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    B = x.shape[0]
    nq, nk = num_heads * D, Hkv * D
    if tuple(w.shape) != (nq + 2 * nk, x.shape[1]):
        raise ValueError(f"{op}: w must have shape ({nq + 2 * nk}, {x.shape[1]}) = [wq; wk; wv], "
                         f"got {tuple(w.shape)}")
    if not isinstance(positions, Tensor) or tuple(positions.shape) != (B, 1) \
            or positions.dtype.is_floating_point:
        raise ValueError(f"{op}: positions must be an int Tensor of shape ({B}, 1), got "
                         f"{tuple(positions.shape) if isinstance(positions, Tensor) else type(positions).__name__}")
    from ..kernels.decode_fused import SMALL_M
    # [quantfused] Q8_0/Q4_1 weights: the same kernel over their blocks (kernels/quant_fused.py)
    from ..kernels.quant_fused import QTYPES as _QFUSED
    quant = isinstance(w, QuantWeight) and w.qtype in _QFUSED
    plain = (isinstance(w, Tensor) and not isinstance(w, QuantWeight)) or quant
    if x.device.type == "cpu" or not plain or D % 2 or x.dtype != cache.dtype \
            or cache.value_dim != D \
            or (x.device.type == "cuda" and B > SMALL_M):
        qkv = fused_linear(x, w, norm_weight=norm_weight, eps=eps, bias=bias)
        q = qkv[:, :nq].view(B, 1, num_heads, D).transpose(1, 2)
        k = qkv[:, nq:nq + nk].view(B, 1, Hkv, D).transpose(1, 2)
        v = qkv[:, nq + nk:].view(B, 1, Hkv, D).transpose(1, 2)
        cache.append_rope(layer, q, k, v, positions, theta=theta, scaling=scaling)
        return q
    if quant:
        from ..kernels.quant_fused import fused_qkv_rope_quant
        return fused_qkv_rope_quant(x, w, cache, layer, positions, num_heads=num_heads,
                                    norm_weight=norm_weight, eps=eps, bias=bias, theta=theta,
                                    scaling=scaling)
    # [/quantfused]
    cache._check_layer(layer)
    for name, t, shape in (("norm_weight", norm_weight, (x.shape[1],)),
                           ("bias", bias, (nq + 2 * nk,))):
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != shape
                              or t.device != x.device or t.stride(0) != 1):
            raise ValueError(f"{op}: {name} must be a contiguous Tensor of shape {shape} on "
                             f"{x.device}")
    if w.device != x.device or positions.device != x.device or cache.device != x.device:
        raise ValueError(f"{op}: x, w, positions and cache must share one device")
    if w.dtype != x.dtype or w.stride(1) != 1:
        raise ValueError(f"{op}: w must be {x.dtype.name} with unit stride along K, got "
                         f"{w.dtype.name}, strides {w.stride()}")
    from ..kernels.decode_fused import fused_qkv_rope as _kernel
    from ..ops.attention import _inv_freq_tensor
    if x.stride(1) != 1:
        x = x.contiguous()
    q = Tensor._empty((B, nq), x.dtype, x.device)
    ck, cv, lengths = cache.view(layer)
    _kernel(x, w, q, ck, cv, lengths, positions, _inv_freq_tensor(D, theta, scaling, x.device),
            num_heads=num_heads, num_kv_heads=Hkv, norm_weight=norm_weight, eps=eps, bias=bias)
    return q.view(B, 1, num_heads, D).transpose(1, 2)


# ------------------------------------------------------------------------ fused decode GEMV
def _check_epilogue_args(op, x, norm_weight, bias, residual, N):
    """fused_linear's (plain and quantised) optional operands: norm_weight (K,), bias (N,),
    residual (M, N) Tensors on x's device, for x (M, K)."""
    from ..tensor import Tensor
    M, K = x.shape
    for name, t, shape in (("norm_weight", norm_weight, (K,)), ("bias", bias, (N,)),
                           ("residual", residual, (M, N))):
        if t is None:
            continue
        if not isinstance(t, Tensor) or tuple(t.shape) != shape:
            raise ValueError(f"{op}: {name} must be a Tensor of shape {shape}, got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
        if t.device != x.device:
            raise ValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")


def fused_linear(x, w, *, norm_weight=None, eps=1e-6, bias=None, residual=None, glu=False,
                 out_dtype=None):
    """One projection of the decode step with its neighbours fused in:

        h = rms_norm(x, norm_weight, eps) if norm_weight is given else x
        y = h @ w.T (+ bias)            w (N, K); with glu w is [gate; up] (2N, K) and
        y = silu(h @ gate.T) * (h @ up.T)
        y = y + residual                if residual is given
    x (M, K); the result (M, N) has x's dtype (or out_dtype); all sums in fp32, one rounding.
    cuda/interp: kernels/decode_fused.py (one kernel); cpu: the same in NumPy (fp32).
    w may be a Q8_0/Q4_1 QuantWeight: kernels/quant_fused.py (same semantics).
    Contract on cuda with PDL on (kernels/_pdl.py, the default): the kernel starts reading w
    before it waits for the kernel launched just before it, as the decode step's weights are
    never written there. A w written by the immediately preceding kernel on the stream must
    be synchronised first (or PDL turned off: NBX_PDL=0, `set_pdl(False)`).
    """
    # [quantfused] quantised weights: their own fused kernel (checks there too)
    if isinstance(w, QuantWeight):
        from ..kernels.quant_fused import fused_linear_quant
        return fused_linear_quant(x, w, norm_weight=norm_weight, eps=eps, bias=bias,
                                  residual=residual, glu=glu, out_dtype=out_dtype)
    # [/quantfused]
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
    _check_epilogue_args(op, x, norm_weight, bias, residual, N)
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
            y = _silu_np(g) * u
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
