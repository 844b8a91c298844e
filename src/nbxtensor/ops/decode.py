"""The decode step's fused ops, and GGML-quantised weights, as an op family.

    QuantWeight(blocks, qtype, shape)    a GGML-quantised (out, in) weight kept as raw blocks
    quant_linear(x, w, b=None)           x @ dequant(w).T (+ b), w a QuantWeight
    quant_embedding(ids, w)              rows of dequant(w) at integer ids
    decode_linear(x, w, *, norm_weight=None, eps=1e-6, bias=None, residual=None, glu=False,
                  out_dtype=None)        one projection with its neighbours fused in
    decode_qkv_rope(x, w, cache, layer, positions, *, num_heads, ...)
                                         QKV projection + RoPE + KV-cache append
    greedy_commit(logits, tokens, positions), commit_tokens(nxt, tokens, positions)
                                         the end of a decode step, on the device

Each validates here and dispatches like any op: cpu to backends/cpu/decode.py and
backends/cpu/quant.py, cuda/interp to kernels/decode_fused.py, kernels/quant_fused.py,
kernels/quant.py and kernels/sampling.py. `decode_linear` is not `nbx.fused_linear` (a
GEMM with an activation epilogue for any shape): it fuses an RMSNorm in front and a SwiGLU
or residual behind, for the few rows of a decode step.
"""
from __future__ import annotations

from .. import dtypes as _dt
from ..dispatch import impl
from ..tensor import Tensor

__all__ = ["QuantWeight", "quant_linear", "quant_embedding", "decode_linear",
           "decode_qkv_rope", "greedy_commit", "commit_tokens"]


class QuantWeight:
    """A GGML-quantised (out, in) weight kept as raw blocks on its device."""

    __slots__ = ("blocks", "qtype", "shape")

    def __init__(self, blocks, qtype, shape):
        self.blocks, self.qtype, self.shape = blocks, qtype, tuple(shape)

    @property
    def device(self):
        return self.blocks.device


def _described(t):
    return tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__


# ------------------------------------------------------------------------ quantised weights
def quant_linear(x, w, b=None):
    """x (..., K) @ dequant(w).T (+ b) -> (..., N). cuda/interp: the fused dequantise-GEMV
    (kernels/quant.py), K-quant prefills dequantise once and run the GEMM; cpu: float32
    x through backends/cpu/quant.py's compiled GEMV."""
    if w.device.type != "cpu" and _dequantised_prefill(x, w):
        from .linalg import linear
        wd = impl("quant_dequantize", w.device)(
            w, x.dtype if x.dtype is not _dt.float64 else _dt.float32)
        return linear(x.to(wd.dtype), wd, None if b is None else b.to(wd.dtype)).to(x.dtype)
    return impl("quant_linear", w.device)(x, w, b)


def _dequantised_prefill(x, w) -> bool:
    """A K-quant weight times more rows than its GEMV serves well (kernels/quant.py's rule):
    dequantised once, then one GEMM."""
    from ..kernels import quant as kq
    if w.qtype not in kq.KQUANTS or x.shape[-1] != w.shape[1] or not w.shape[0]:
        return False
    M = 1
    for s in x.shape[:-1]:
        M *= s
    return M > kq.KQ_GEMV_MAX_M


def quant_embedding(ids, w):
    """Rows of the QuantWeight `w` at the integer Tensor `ids`: (*ids.shape, in_features)."""
    return impl("quant_embedding", w.device)(ids, w)


# ------------------------------------------------------------------------ fused decode GEMV
def _check_epilogue_args(op, x, norm_weight, bias, residual, N):
    """The optional operands of decode_linear: norm_weight (K,), bias (N,), residual (M, N)
    Tensors on x's device, for x (M, K)."""
    M, K = x.shape
    for name, t, shape in (("norm_weight", norm_weight, (K,)), ("bias", bias, (N,)),
                           ("residual", residual, (M, N))):
        if t is None:
            continue
        if not isinstance(t, Tensor) or tuple(t.shape) != shape:
            raise ValueError(f"{op}: {name} must be a Tensor of shape {shape}, got "
                             f"{_described(t)}")
        if t.device != x.device:
            raise ValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")


def decode_linear(x, w, *, norm_weight=None, eps=1e-6, bias=None, residual=None, glu=False,
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
    op = "decode_linear"
    if not isinstance(x, Tensor) or x.ndim != 2:
        raise ValueError(f"{op}: x must be a 2-D Tensor (M, K), got {_described(x)}")
    quant = isinstance(w, QuantWeight)
    if quant:
        if len(w.shape) != 2 or w.shape[1] != x.shape[1]:
            raise ValueError(f"{op}: w must be (N, {x.shape[1]}), got {w.qtype} "
                             f"{tuple(w.shape)}")
    elif not isinstance(w, Tensor) or w.ndim != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"{op}: w must be a 2-D Tensor (N, {x.shape[1]}), got "
                         f"{_described(w)}")
    if glu and w.shape[0] % 2:
        raise ValueError(f"{op}: glu needs w = [gate; up] with an even row count, got {w.shape[0]}")
    if glu and bias is not None:
        raise ValueError(f"{op}: bias with glu is not supported")
    M, K = x.shape
    N = w.shape[0] // 2 if glu else w.shape[0]
    _check_epilogue_args(op, x, norm_weight, bias, residual, N)
    if w.device != x.device:
        raise ValueError(f"{op}: w is on {w.device} but x is on {x.device}")
    if quant and not x.dtype.is_floating_point:
        raise ValueError(f"{op}: x must be floating point, got {x.dtype.name}")
    if not quant and (w.dtype != x.dtype or not x.dtype.is_floating_point):
        raise ValueError(f"{op}: x and w must share one floating dtype, got {x.dtype.name} "
                         f"and {w.dtype.name}")
    if residual is not None and residual.dtype != x.dtype:
        raise ValueError(f"{op}: residual must be {x.dtype.name}, got {residual.dtype.name}")
    odt = _dt.as_dtype(out_dtype or x.dtype)
    if not odt.is_floating_point:
        raise ValueError(f"{op}: out_dtype must be floating point, got {odt.name}")
    return impl("decode_linear_quant" if quant else "decode_linear", x.device)(
        x, w, norm_weight=norm_weight, eps=eps, bias=bias, residual=residual, glu=glu,
        out_dtype=odt)


def decode_qkv_rope(x, w, cache, layer, positions, *, num_heads, norm_weight=None, eps=1e-6,
                    bias=None, theta=10000.0, scaling=None):
    """The decode step's attention input in one kernel (cuda/interp, plain or Q8_0/Q4_1
    weights, up to SMALL_M rows on cuda): q, k, v = split(rms_norm?(x) @ w.T (+ bias)), RoPE
    (rotate_half) on q and k at the device positions, k and v appended to `cache` layer
    `layer` (its lengths set to positions + 1). x (B, K); w = [wq; wk; wv]
    ((Hq + 2 Hkv) * D, K); positions (B, 1) int. Returns q (B, Hq, 1, D), rotated.
    Elsewhere (cpu, other quantised formats, more than SMALL_M rows on cuda, x's dtype !=
    the cache's, value_dim != head_dim, odd D) the same composed of decode_linear and
    KVCache.append_rope."""
    from ..kv_cache import KVCache
    op = "decode_qkv_rope"
    if not isinstance(cache, KVCache):
        raise TypeError(f"{op}: cache must be an nbx.KVCache, got {type(cache).__name__}")
    Hkv, D = cache.num_kv_heads, cache.head_dim
    if not isinstance(num_heads, int) or num_heads <= 0 or num_heads % Hkv:
        raise ValueError(f"{op}: num_heads must be a positive multiple of the cache's "
                         f"{Hkv} kv heads, got {num_heads!r}")
    if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[0] != cache.batch:
        raise ValueError(f"{op}: x must be a 2-D Tensor ({cache.batch}, K), got "
                         f"{_described(x)}")
    B = x.shape[0]
    nq, nk = num_heads * D, Hkv * D
    if tuple(w.shape) != (nq + 2 * nk, x.shape[1]):
        raise ValueError(f"{op}: w must have shape ({nq + 2 * nk}, {x.shape[1]}) = [wq; wk; wv], "
                         f"got {tuple(w.shape)}")
    if not isinstance(positions, Tensor) or tuple(positions.shape) != (B, 1) \
            or positions.dtype.is_floating_point:
        raise ValueError(f"{op}: positions must be an int Tensor of shape ({B}, 1), got "
                         f"{_described(positions)}")
    if not _one_kernel(x, w, cache, B, D):
        qkv = decode_linear(x, w, norm_weight=norm_weight, eps=eps, bias=bias)
        q = qkv[:, :nq].view(B, 1, num_heads, D).transpose(1, 2)
        k = qkv[:, nq:nq + nk].view(B, 1, Hkv, D).transpose(1, 2)
        v = qkv[:, nq + nk:].view(B, 1, Hkv, D).transpose(1, 2)
        cache.append_rope(layer, q, k, v, positions, theta=theta, scaling=scaling)
        return q
    cache._check_layer(layer)
    for name, t, shape in (("norm_weight", norm_weight, (x.shape[1],)),
                           ("bias", bias, (nq + 2 * nk,))):
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != shape
                              or t.device != x.device or t.stride(0) != 1):
            raise ValueError(f"{op}: {name} must be a contiguous Tensor of shape {shape} on "
                             f"{x.device}")
    if w.device != x.device or positions.device != x.device or cache.device != x.device:
        raise ValueError(f"{op}: x, w, positions and cache must share one device")
    quant = isinstance(w, QuantWeight)
    if not quant and (w.dtype != x.dtype or w.stride(1) != 1):
        raise ValueError(f"{op}: w must be {x.dtype.name} with unit stride along K, got "
                         f"{w.dtype.name}, strides {w.stride()}")
    from .attention import _inv_freq_tensor
    if x.stride(1) != 1:
        x = x.contiguous()
    q = Tensor._empty((B, nq), x.dtype, x.device)
    ck, cv, lengths = cache.view(layer)
    impl("decode_qkv_rope_quant" if quant else "decode_qkv_rope", x.device)(
        x, w, q, ck, cv, lengths, positions, _inv_freq_tensor(D, theta, scaling, x.device),
        num_heads=num_heads, num_kv_heads=Hkv, norm_weight=norm_weight, eps=eps, bias=bias)
    return q.view(B, 1, num_heads, D).transpose(1, 2)


def _one_kernel(x, w, cache, B, D) -> bool:
    """Whether decode_qkv_rope's fused kernel takes this case (else it is composed)."""
    if x.device.type == "cpu" or D % 2 or x.dtype != cache.dtype or cache.value_dim != D:
        return False
    from ..kernels.decode_fused import SMALL_M
    if x.device.type == "cuda" and B > SMALL_M:
        return False
    if isinstance(w, QuantWeight):
        from ..kernels.quant_fused import QTYPES
        return w.qtype in QTYPES
    return isinstance(w, Tensor)


# ------------------------------------------------------------------------ the step's end
def _check_commit(tokens, positions, B, op):
    for n, t in (("tokens", tokens), ("positions", positions)):
        # int32/int64 only: a narrower int would wrap a token id or a position silently
        if not isinstance(t, Tensor) or tuple(t.shape) != (B, 1) or \
                t.dtype not in (_dt.int32, _dt.int64):
            raise ValueError(f"{op}: {n} must be an int32 or int64 Tensor of shape ({B}, 1), "
                             f"got {(tuple(t.shape), t.dtype.name) if isinstance(t, Tensor) else type(t).__name__}")


def greedy_commit(logits, tokens, positions):
    """The greedy end of a decode step, in place: tokens[b, 0] = argmax(logits[b]) (the first
    index of the max, NaN counting as the max, as torch) and positions[b, 0] += 1.
    cuda/interp: one kernel (kernels/sampling.argmax_commit); cpu and float64 logits:
    argmax + copy + add."""
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
        from .elementwise import add
        from .reduction import argmax
        tokens.copy_(argmax(logits, dim=-1).reshape(B, 1))
        add(positions, 1, out=positions)
        return tokens
    impl("argmax_commit", logits.device)(logits, tokens, positions)
    return tokens


def commit_tokens(nxt, tokens, positions):
    """tokens[b, 0] = nxt[b]; positions[b, 0] += 1 (one kernel on cuda/interp)."""
    op = "commit_tokens"
    B = tokens.shape[0] if isinstance(tokens, Tensor) else -1
    if not isinstance(nxt, Tensor) or tuple(nxt.shape) != (B,) or nxt.dtype.is_floating_point:
        raise ValueError(f"{op}: nxt must be an int Tensor of shape ({B},), got "
                         f"{_described(nxt)}")
    _check_commit(tokens, positions, B, op)
    if nxt.device.type == "cpu":
        from .elementwise import add
        tokens.copy_(nxt.reshape(B, 1))
        add(positions, 1, out=positions)
        return tokens
    impl("commit_tokens", nxt.device)(nxt, tokens, positions)
    return tokens
