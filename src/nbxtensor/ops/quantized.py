"""QuantizedTensor: int4 group-quantised linear weights in the GPTQ and AWQ checkpoint layouts,
and `linear(x, qt)` over them (what nbx.linear / nn.functional.linear call for such a weight).

    qt = nbx.QuantizedTensor(qweight, scales, qzeros, format="gptq", group_size=128,
                             g_idx=None)          # tensors as the safetensors checkpoint has them
    y = nbx.nn.functional.linear(x, qt, bias)     # x (..., in_features) -> (..., out_features)
    w = qt.dequantize(nbx.float16)                # (out_features, in_features), F.linear's weight

Layouts (kernels/int4.py has the bit-level definitions): W is (K, N) = (in, out).
  format="gptq": qweight int32 (K/8, N) packed along K, qzeros int32 (K/g, N/8), scales
    (K/g, N), g_idx int32 (K,) optional (desc_act: row k uses group g_idx[k]). The zeros
    follow the classic GPTQ checkpoint format (AutoGPTQ/GPTQ-for-LLaMa, transformers'
    checkpoint_format "gptq", sym=True): a stored zero z means z + 1.
  format="awq": qweight int32 (K, N/8), qzeros int32 (K/g, N/8), scales (K/g, N), nibbles in
    AWQ's column order [0, 2, 4, 6, 1, 3, 5, 7]; zeros as stored (no offset).
bits must be 4; group_size -1 means one group over K. A g_idx equal to k // group_size
(GPTQ checkpoints carry one even without desc_act) is dropped at construction: the fast path.

linear on cuda/interp: up to SMALL_M rows, the fused int4 GEMV (kernels/int4.py: nibbles
unpacked in registers, fp32 accumulation). More rows (prefill) dequantise the weight once
per call into a (K, N) workspace of x's dtype and run the GEMM: the tuned matmul keeps
its tensor-core path, and writing K*N elements once costs little next to the 2*M*K*N
flops for M in the hundreds; a dequantise-in-the-GEMM kernel would have to re-derive the
GEMM's tiling per device. cpu: NumPy dequantisation (fp32), the product in fp32, one
rounding to x's dtype.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from ..tensor import Tensor

__all__ = ["QuantizedTensor", "linear", "matmul", "dequantize_int4_numpy"]

FORMATS = ("gptq", "awq")
SMALL_M = 8                     # rows up to which linear runs the GEMV
_AWQ_REV = np.array([0, 4, 1, 5, 2, 6, 3, 7])   # column 8c + j sits in nibble _AWQ_REV[j]


def _nib(w: np.ndarray, axis: int, order=None) -> np.ndarray:
    """int32 words -> their 8 nibbles along `axis` (nibble i from bits 4i..4i+3), with
    `order[j]` the nibble of output position j."""
    sh = (np.arange(8) if order is None else order) * 4
    u = w.astype(np.uint32)
    q = (u[..., None] >> sh.astype(np.uint32)) & 15                    # (..., 8)
    q = np.moveaxis(q, -1, axis + 1) if axis != w.ndim - 1 else q
    shape = list(w.shape)
    shape[axis] *= 8
    return q.reshape(shape).astype(np.int32)


def dequantize_int4_numpy(qweight, qzeros, scales, g_idx, group_size, fmt) -> np.ndarray:
    """W (K, N) float32 from host arrays of the checkpoint layout (the cpu path)."""
    s = np.asarray(scales).astype(np.float32)
    if fmt == "gptq":
        q = _nib(np.asarray(qweight), 0)                                 # (K, N)
        z = _nib(np.asarray(qzeros), 1) + 1                              # (K/g, N)
    else:
        q = _nib(np.asarray(qweight), 1, _AWQ_REV)
        z = _nib(np.asarray(qzeros), 1, _AWQ_REV)
    K = q.shape[0]
    G = np.asarray(g_idx).astype(np.int64) if g_idx is not None else np.arange(K) // group_size
    return s[G] * (q - z[G]).astype(np.float32)


def _need(t, name, dtypes, shape, who):
    if not isinstance(t, Tensor):
        raise TypeError(f"{who}: {name} must be a Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{who}: {name} must be {' or '.join(d.name for d in dtypes)}, got "
                        f"{t.dtype.name}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{who}: {name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


class QuantizedTensor:
    """An int4 group-quantised (out_features, in_features) linear weight (see the module
    docstring for the layouts). Not a Tensor: linear / matmul / dequantize know it."""

    _nbx_quantized = True

    def __init__(self, qweight, scales, qzeros, *, bits=4, group_size=128, format="gptq",
                 g_idx=None):
        who = "QuantizedTensor"
        if format not in FORMATS:
            raise ValueError(f"{who}: format must be one of {FORMATS}, got {format!r}")
        if bits != 4:
            raise ValueError(f"{who}: only bits=4 is supported, got {bits!r}")
        if not isinstance(qweight, Tensor) or qweight.ndim != 2:
            raise TypeError(f"{who}: qweight must be a 2-D int32 Tensor, got "
                            f"{type(qweight).__name__}")
        a, b = qweight.shape
        K, N = (a * 8, b) if format == "gptq" else (a, b * 8)
        if group_size == -1:
            group_size = K
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0 \
                or K % group_size or group_size % 8:
            raise ValueError(f"{who}: group_size must be a positive multiple of 8 dividing "
                             f"in_features {K} (or -1), got {group_size!r}")
        ng = K // group_size
        if N % 8:
            raise ValueError(f"{who}: out_features must be a multiple of 8, got {N}")
        _need(qweight, "qweight", (_dt.int32,), qweight.shape, who)
        _need(qzeros, "qzeros", (_dt.int32,), (ng, N // 8), who)
        _need(scales, "scales", (_dt.float16, _dt.bfloat16, _dt.float32), (ng, N), who)
        dev = qweight.device
        for n, t in (("qzeros", qzeros), ("scales", scales), ("g_idx", g_idx)):
            if t is not None and t.device != dev:
                raise ValueError(f"{who}: {n} is on {t.device}, qweight on {dev}")
        if g_idx is not None:
            if format != "gptq":
                raise ValueError(f"{who}: g_idx is a GPTQ (desc_act) field; AWQ has none")
            _need(g_idx, "g_idx", (_dt.int32, _dt.int64), (K,), who)
            gh = np.asarray(g_idx.numpy()).astype(np.int64)
            if gh.size and (gh.min() < 0 or gh.max() >= ng):
                raise IndexError(f"{who}: g_idx values must lie in [0, {ng}), got "
                                 f"[{gh.min()}, {gh.max()}]")
            if np.array_equal(gh, np.arange(K) // group_size):
                g_idx = None                      # the trivial order: the fast path
            elif g_idx.dtype is not _dt.int32:
                g_idx = g_idx.to(_dt.int32)
        self.qweight = qweight.contiguous()
        self.qzeros = qzeros.contiguous()
        self.scales = scales.contiguous()
        self.g_idx = None if g_idx is None else g_idx.contiguous()
        self.bits, self.group_size, self.format = 4, group_size, format
        self.in_features, self.out_features = K, N

    # the fields under the names
    weight = property(lambda self: self.qweight)
    zeros = property(lambda self: self.qzeros)

    @property
    def shape(self):
        """(out_features, in_features): F.linear's weight shape."""
        return (self.out_features, self.in_features)

    @property
    def device(self):
        return self.qweight.device

    def __repr__(self):
        return (f"QuantizedTensor({self.format}, int{self.bits}, group {self.group_size}, "
                f"shape={self.shape}, device={self.device}"
                f"{', desc_act' if self.g_idx is not None else ''})")

    def to(self, device):
        mv = lambda t: None if t is None else t.to(device)   # noqa: E731
        out = object.__new__(QuantizedTensor)
        out.__dict__.update(self.__dict__)
        out.qweight, out.qzeros, out.scales, out.g_idx = (mv(self.qweight), mv(self.qzeros),
                                                         mv(self.scales), mv(self.g_idx))
        return out

    def cuda(self, device="cuda"):
        return self.to(device)

    def cpu(self):
        return self.to("cpu")

    def _numpy_kn(self) -> np.ndarray:
        return dequantize_int4_numpy(
            self.qweight.numpy(), self.qzeros.numpy(), self.scales.to(_dt.float32).numpy(),
            None if self.g_idx is None else self.g_idx.numpy(), self.group_size, self.format)

    def dequantize(self, dtype=None) -> Tensor:
        """The (out_features, in_features) weight in `dtype` (default the scales' dtype):
        bit-equal to the fp32 definition s * (q - z), rounded once."""
        from ..creation import from_numpy
        dt = _dt.as_dtype(dtype) if dtype is not None else self.scales.dtype
        if not dt.is_floating_point:
            raise TypeError(f"QuantizedTensor.dequantize: dtype must be floating point, got "
                            f"{dt.name}")
        if self.device.type == "cpu":
            return from_numpy(_dt.cast(np.ascontiguousarray(self._numpy_kn().T), dt))
        if dt is _dt.float64:
            raise TypeError("QuantizedTensor.dequantize: float64 is supported on cpu only")
        from ..kernels.int4 import int4_dequantize
        y = Tensor._empty(self.shape, dt, self.device)
        return int4_dequantize(self, y, transpose=True)


def _check_x(x, qt, bias, op):
    if not isinstance(qt, QuantizedTensor):
        raise TypeError(f"{op}: weight must be a QuantizedTensor, got {type(qt).__name__}")
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point or x.ndim == 0:
        raise TypeError(f"{op}: input must be a floating-point Tensor of >= 1 dims, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.shape[-1] != qt.in_features:
        raise ValueError(f"{op}: input has {x.shape[-1]} features, the weight expects "
                         f"{qt.in_features} ({qt!r})")
    if x.device != qt.device:
        raise ValueError(f"{op}: input is on {x.device}, the weight on {qt.device}")
    if x.device.type != "cpu" and x.dtype is _dt.float64:
        raise TypeError(f"{op}: float64 input is supported on cpu only")
    if bias is not None and (not isinstance(bias, Tensor) or tuple(bias.shape) !=
                             (qt.out_features,) or bias.device != x.device):
        raise ValueError(f"{op}: bias must be a ({qt.out_features},) Tensor on {x.device}")


def linear(input, weight, bias=None, *, block_n=None, split_k=None):  # noqa: A002
    """input (..., K) @ W + bias -> (..., N) in input's dtype, W the QuantizedTensor `weight`.
    block_n / split_k override the GEMV's columns per program and K slices (tests force
    tails and the split-K partials with them)."""
    op = "linear"
    _check_x(input, weight, bias, op)
    shape = input._shape
    lead = tuple(shape[:-1])
    M = math.prod(lead)
    K, N = weight.in_features, weight.out_features
    if input.device.type == "cpu":
        from ..creation import from_numpy
        wt = np.float64 if input.dtype is _dt.float64 else np.float32
        y = input.numpy().reshape(M, K).astype(wt) @ weight._numpy_kn().astype(wt)
        if bias is not None:
            y += bias.numpy().astype(wt)
        return from_numpy(_dt.cast(y, input.dtype)).reshape(*lead, N)
    x2 = input if len(shape) == 2 else input.reshape(M, K)
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    if M <= SMALL_M:
        y = Tensor._empty((M, N), input._dtype, input.device)
        if M:
            _kernels().int4_gemv(x2, weight, bias, y, block_n=block_n, split=split_k)
        return y if len(shape) == 2 else y.reshape(*lead, N)
    from .linalg import matmul as _mm
    w = _kernels().int4_dequantize(weight, Tensor._empty((K, N), input.dtype, input.device),
                                   transpose=False)
    y = _mm(x2, w)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.reshape(*lead, N)


_K4 = None


def _kernels():
    """kernels/int4.py, imported on the first device call (it imports Triton)."""
    global _K4
    if _K4 is None:
        from ..kernels import int4
        _K4 = int4
    return _K4


def matmul(input, weight):  # noqa: A002
    """input (..., K) @ W (K, N): linear without a bias."""
    return linear(input, weight)
