"""cpu: GGML-quantised weights kept as their GGUF blocks, computed by compiled kernels.

The kernels are numba functions (backends/cpu/_quant_numba.py, an optional dependency:
the `cpu` extra). numba is imported on first use, never by `import nbxtensor`; its
compiled code is cached on disk (`cache=True`), so a second process does not recompile.
Without numba, `available()` is False and the models keep today's path (weights
dequantised to float32 at load, NumPy matmuls); `describe()` says which path runs.

Entry points work on NumPy arrays (the model's decode loop calls them directly, so a step
costs a few calls per layer, not a Tensor op per line) and on Tensors through dispatch
(`quant_linear`, `quant_embedding`, registered for the numpy family like every cpu op):
  quant_linear(x, blocks, qtype, out=, residual=)  x (M, K) @ dequant(blocks).T (+ residual)
  quantize_activation(x)                           the int8 blocks of x the GEMVs use
  dequantize(blocks, qtype, K, out=)               the float32 weight (N, K)
  rms_norm, silu_mul, rope_attend                  the decode step's small ops, fused
Threads: `set_threads(n)`; the default is NBX_CPU_THREADS, or the cores this process may
run on (os.sched_getaffinity). NBX_CPU_INT8 (on by default) quantises the GEMVs' activation
to int8 per block of 32 for integer dot products, as llama.cpp does; off, x stays float32
(docs/design/cpu-decode.md).
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np

from ... import config as _config
from ...dispatch import register

__all__ = ["QTYPES", "available", "describe", "threads", "set_threads", "quant_linear",
           "int8_activations", "quantize_activation",
           "dequantize", "dequantize_rows", "rms_norm", "silu_mul", "rope_attend", "warm"]

# name -> (weights per block, bytes per block): the formats with a cpu GEMV
QTYPES = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144),
          "Q5_K": (256, 176), "Q6_K": (256, 210)}

_K = None            # the kernel module, once imported
_threads = None
_active = 0          # the thread count numba's pool was last set to

# work (weights, or attention scores x head dim) below which a call runs on one thread: a
# parallel region waits for every thread it wakes, and on a 2-core machine shared with
# other work that wait cost more than the split saved for the decode step's small GEMVs
PARALLEL_MIN_WORK = 1 << 22


def available() -> bool:
    """True when numba can be imported (checked without importing it)."""
    return importlib.util.find_spec("numba") is not None


def describe() -> str:
    """One line: which cpu path quantised GGUF weights take on this machine."""
    if not available():
        return ("NumPy float32 (GGUF weights dequantised at load); install numba "
                "(pip install 'nbxtensor[cpu]') for the quantised kernels")
    from importlib.metadata import version
    act = "int8 activations" if int8_activations() else "float32 activations"
    return f"quantised kernels (numba {version('numba')}, {threads()} threads, {act})"


def _kernels():
    global _K
    if _K is None:
        if not available():
            raise RuntimeError("cpu quantised kernels need numba, which is not installed "
                               "(pip install 'nbxtensor[cpu]'); load the model with "
                               "quantized=False for the NumPy path")
        _config.set_omp_env()          # before numba's thread pool starts
        from . import _quant_numba
        _K = _quant_numba
        set_threads(_threads or _default_threads())
    return _K


def _default_threads() -> int:
    n = _config.get("NBX_CPU_THREADS")
    return n if n > 0 else len(os.sched_getaffinity(0))


def threads() -> int:
    """The thread count the kernels use."""
    return _threads or _default_threads()


def set_threads(n: int) -> None:
    """Run the kernels on n threads (at most numba's pool size, the machine's cores)."""
    global _threads, _active
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_threads: n must be a positive int, got {n!r}")
    _threads = n
    if _K is not None:
        import numba
        n = min(n, numba.config.NUMBA_NUM_THREADS)
        numba.set_num_threads(n)
        _threads = _active = n


def _use_threads(work: int) -> int:
    """Set numba's pool to the threads this call should use (one below PARALLEL_MIN_WORK)."""
    global _active
    n = 1 if work < PARALLEL_MIN_WORK else threads()
    if n != _active:
        import numba
        numba.set_num_threads(n)
        _active = n
    return n


def _check_blocks(blocks, qtype, K, who):
    if qtype not in QTYPES:
        raise ValueError(f"{who}: qtype must be one of {sorted(QTYPES)}, got {qtype!r}")
    bs, ts = QTYPES[qtype]
    if not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint8 or blocks.ndim != 2 \
            or not blocks.flags.c_contiguous:
        raise ValueError(f"{who}: blocks must be a C-contiguous 2-D uint8 array (rows, bytes), "
                         f"got {getattr(blocks, 'dtype', type(blocks).__name__)} "
                         f"{getattr(blocks, 'shape', '')}")
    if K % bs or blocks.shape[1] != K // bs * ts:
        raise ValueError(f"{who}: {qtype} rows of K={K} weights need K a multiple of {bs} "
                         f"and {K // bs * ts} bytes a row, got {blocks.shape[1]} bytes")


def _f32_2d(a, name, who, shape=None):
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.ndim != 2 or \
            (shape is not None and a.shape != shape):
        raise ValueError(f"{who}: {name} must be a 2-D float32 array"
                         f"{f' of shape {shape}' if shape else ''}, got "
                         f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")


_NO_RES = np.zeros((0, 0), np.float32)


def quant_linear(x: np.ndarray, blocks: np.ndarray, qtype: str, *, out=None,
                 residual=None) -> np.ndarray:
    """x (M, K) float32 @ dequant(blocks).T (+ residual (M, N)) -> (M, N) float32; with
    NBX_CPU_INT8, x as quantize_activation rounds it. `out` may be `residual` itself (the
    add happens per element, after its row's dot)."""
    who = "quant_linear"
    _f32_2d(x, "x", who)
    M, K = x.shape
    _check_blocks(blocks, qtype, K, who)
    N = blocks.shape[0]
    if residual is not None:
        _f32_2d(residual, "residual", who, (M, N))
    if out is None:
        out = np.empty((M, N), np.float32)
    else:
        _f32_2d(out, "out", who, (M, N))
    k = _kernels()
    x = np.ascontiguousarray(x)
    nt = _use_threads(M * N * K)
    # a few chunks a thread: rows of one GEMV cost the same, so this only evens out the
    # threads' start times
    gemv = (k.GEMV_INT8 if int8_activations() else k.GEMV)[qtype]
    gemv(blocks, blocks.view(np.int8), x, k.H2F, out,
         _NO_RES if residual is None else residual, min(N, 4 * nt), blocks.view(np.uint16))
    return out


def int8_activations() -> bool:
    """True when the GEMVs quantise the activation to 8 bits (NBX_CPU_INT8, on by default)."""
    return _config.get("NBX_CPU_INT8")


def quantize_activation(x: np.ndarray):
    """The int8 form of x (M, K) float32 that the GEMVs compute with, per block of 32 values:
    (qx int8 (M, K), dx float32 (M, K // 32), xs float32 (M, K // 32)) with
    dx = max|x| / 127, qx = rint(x / dx) (0 where dx is 0), xs = dx * sum(qx) per block.
    A block holding NaN or inf gets dx = NaN."""
    _f32_2d(x, "x", "quantize_activation")
    M, K = x.shape
    if K % 32:
        raise ValueError(f"quantize_activation: K must be a multiple of 32, got {K}")
    return _kernels().quantized_py(np.ascontiguousarray(x))


def dequantize(blocks: np.ndarray, qtype: str, K: int, *, out=None) -> np.ndarray:
    """The float32 weight (rows, K) of `blocks` (the values backends/cpu/ggml_blocks.py gives)."""
    who = "dequantize"
    _check_blocks(blocks, qtype, K, who)
    if out is None:
        out = np.empty((blocks.shape[0], K), np.float32)
    else:
        _f32_2d(out, "out", who, (blocks.shape[0], K))
    k = _kernels()
    k.DEQUANT[qtype](blocks, blocks.view(np.int8), k.H2F, out)
    return out


def dequantize_rows(blocks: np.ndarray, qtype: str, K: int, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` (int array) of the weight, float32 (len(ids), K): an embedding lookup."""
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu" or ids.ndim != 1:
        raise ValueError(f"dequantize_rows: ids must be a 1-D int array, got {ids.dtype} "
                         f"{ids.shape}")
    bad = (ids < 0) | (ids >= blocks.shape[0])
    if bad.any():
        raise IndexError(f"dequantize_rows: id {int(ids[bad][0])} is out of range for a "
                         f"weight of {blocks.shape[0]} rows")
    return dequantize(np.ascontiguousarray(blocks[ids]), qtype, K)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float, out=None) -> np.ndarray:
    """x (M, K) / sqrt(mean(x^2) + eps) * w (K,), float32."""
    if out is None:
        out = np.empty_like(x)
    _kernels().rms_norm(x, w, np.float32(eps), out)
    return out


def silu_mul(gu: np.ndarray, out=None) -> np.ndarray:
    """silu(gu[:, :N]) * gu[:, N:] for gu (M, 2N) = [gate | up]."""
    if out is None:
        out = np.empty((gu.shape[0], gu.shape[1] // 2), np.float32)
    _kernels().silu_mul(gu, out)
    return out


def rope_attend(qkv, cos, sin, kc, vc, pos: int, n_heads: int, out=None) -> np.ndarray:
    """T tokens after `pos` cached ones: RoPE on q, k of qkv (T, (Hq + 2 Hkv) * D) with
    cos/sin (T, D), k and v stored in kc, vc (Hkv, L, D) at pos.., causal attention (GQA)
    -> (T, Hq * D)."""
    T = qkv.shape[0]
    if pos < 0 or pos + T > kc.shape[1]:
        raise ValueError(f"rope_attend: positions {pos}..{pos + T - 1} do not fit a cache of "
                         f"{kc.shape[1]}")
    if out is None:
        out = np.empty((T, n_heads * kc.shape[2]), np.float32)
    k = _kernels()
    _use_threads(T * (pos + T) * n_heads * kc.shape[2])
    k.rope_attend(qkv, cos, sin, kc, vc, pos, n_heads, out)
    return out


def warm() -> None:
    """Compile every kernel now (or load it from numba's disk cache): scripts/setup calls
    this so the first `nbx generate` on cpu does not spend its first half-minute compiling."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    for qtype, (bs, ts) in QTYPES.items():
        blocks = np.zeros((2, 256 // bs * ts), np.uint8)
        for int8 in (True, False):
            with _config.override(NBX_CPU_INT8=int8):
                quant_linear(x, blocks, qtype)
        dequantize(blocks, qtype, 256)
    rms_norm(x, np.ones(256, np.float32), 1e-6)
    silu_mul(x)
    kc = np.zeros((1, 4, 16), np.float32)
    rope_attend(np.zeros((1, 48), np.float32), np.ones((1, 16), np.float32),
                np.zeros((1, 16), np.float32), kc, kc.copy(), 0, 1)


# ------------------------------------------------------------------ the ops, through dispatch
@register("quant_linear", "numpy")
def quant_linear_op(x, w, b=None):
    """Tensor x (..., K) @ dequant(w).T (+ b) for a QuantWeight w on cpu (float32)."""
    if x.dtype.name != "float32":
        raise ValueError(f"quant_linear: x must be float32 on cpu, got {x.dtype.name}")
    K = w.shape[1]
    xa = np.ascontiguousarray(x.numpy()).reshape(-1, K)
    y = quant_linear(xa, w.blocks.numpy(), w.qtype)
    if b is not None:
        y += b.numpy().astype(np.float32)
    return _wrap(y.reshape(*x.shape[:-1], w.shape[0]))


@register("quant_embedding", "numpy")
def quant_embedding_op(ids, w):
    """Rows of a QuantWeight w on cpu at the int Tensor ids, float32 (*ids.shape, K)."""
    a = ids.numpy()
    return _wrap(dequantize_rows(w.blocks.numpy(), w.qtype, w.shape[1],
                                 a.reshape(-1)).reshape(*a.shape, w.shape[1]))


def _wrap(a):
    from ...creation import from_numpy
    return from_numpy(np.ascontiguousarray(a))
