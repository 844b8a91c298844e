"""nbx.fft: torch.fft's discrete Fourier transforms.

Names, signatures and `norm` modes are torch's: "backward" (default: no scaling forward,
1/n inverse), "ortho" (1/sqrt(n) both ways), "forward" (1/n forward, none inverse).

  * cpu: numpy.fft (pocketfft) on the input in complex128/float64, rounded once to the
    result dtype.
  * cuda and interp: kernels/fft.py (on-chip DFT-by-dot kernels, the four-step form for
    long powers of two, Bluestein's chirp-z for other lengths; rfft / irfft of even length
    through one complex FFT of half the length). See docs/design/fft.md.

Dtypes: float32 and integer/bool inputs give complex64, float64 gives complex128 (torch's
promotion); float16/bfloat16 are refused (torch computes half only on cuda for powers of
two), so are float8. Real-input transforms (rfft, ihfft, rfftn) refuse complex input, as
torch does.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from . import dtypes as _dt
from .device import as_device
from .tensor import Tensor, _real_view, normalize_dim

__all__ = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2", "rfft2", "irfft2",
           "fftn", "ifftn", "rfftn", "irfftn", "fftfreq", "rfftfreq", "fftshift", "ifftshift"]

_NORMS = (None, "backward", "ortho", "forward")


# ------------------------------------------------------------------ argument checks
def _input(x, op, real_only=False) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(x).__name__}")
    d = x._dtype
    if d.kind == "c":
        if real_only:
            raise TypeError(f"{op}: expects a real input tensor, but got {d.name}")
        return x
    if d in (_dt.float16, _dt.bfloat16) or d.is_float8:
        raise TypeError(f"{op}: {d.name} input is not supported; cast to float32 or float64")
    return x


def _norm(norm, op):
    if norm not in _NORMS:
        raise ValueError(f"{op}: norm must be one of 'backward', 'ortho', 'forward' or None, got "
                         f"{norm!r}")
    return norm or "backward"


def _scale(norm, n, inverse):
    if norm == "ortho":
        return 1.0 / math.sqrt(n)
    if (norm == "forward") != inverse:
        return 1.0 / n
    return 1.0


def _swap(norm):
    return {"backward": "forward", "forward": "backward", "ortho": "ortho"}[norm]


def _complex_dtype(x):
    d = x._dtype
    return d if d.kind == "c" else _dt.to_complex(d if d.kind == "f" else _dt.get_default_dtype())


def _dims_sizes(x, s, dim, op, default_all):
    """Normalised (dims, sizes) of an n-dimensional transform (torch's s= / dim= rules; a
    size None where s leaves it to the input)."""
    if dim is None:
        if s is None:
            dims = list(range(x.ndim)) if default_all else [x.ndim - 2, x.ndim - 1]
        else:
            dims = list(range(x.ndim - len(s), x.ndim))
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
        dims = [normalize_dim(d, x.ndim) for d in dims]
        if len(set(dims)) != len(dims):
            raise RuntimeError(f"{op}: dims must be unique, got {tuple(dim)}")
    if s is None:
        sizes = [None] * len(dims)
    else:
        if not isinstance(s, Sequence):
            raise TypeError(f"{op}: s must be a sequence of ints, got {s!r}")
        if len(s) != len(dims):
            raise ValueError(f"{op}: s has {len(s)} sizes but {len(dims)} dims are transformed")
        sizes = [None if v == -1 else v for v in s]
    if any(d < 0 for d in dims):
        raise ValueError(f"{op}: input of {x.ndim} dims has too few dims for s={s}")
    for v in sizes:
        _check_n(v, op, "s")
    return dims, sizes


def _check_n(n, op, what="n"):
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ValueError(f"{op}: invalid number of data points ({n!r}) specified")
    return n


# ------------------------------------------------------------------ the device path
def _resize(x, dim, n):
    """x along `dim` trimmed or zero-padded to n (torch's n= / s=)."""
    m = x._shape[dim]
    if n == m:
        return x
    if n < m:
        return x.narrow(dim, 0, n)
    shape = list(x._shape)
    shape[dim] = n
    out = Tensor._empty(tuple(shape), x._dtype, x._storage.device)
    out.fill_(0)
    out.narrow(dim, 0, m).copy_(x)
    return out


def _c2c_dim(x, dim, inverse, scale):
    """The complex DFT of x (complex) along dim on cuda/interp, times `scale`."""
    from .kernels.fft import c2c
    return c2c(x, dim, inverse, scale)


def _last_contiguous(x, dim):
    """x with dim moved last, contiguous and at an even offset (a complex view of it exists)."""
    last = x.ndim - 1
    xt = x.transpose(dim, last).contiguous() if dim != last else x.contiguous()
    return xt.clone() if xt._offset % 2 else xt


def _flip_conj(x, dim):
    """conj(x[(n - k) % n]) along dim: the hermitian mirror of a complex x."""
    from .ops.elementwise import neg
    from .ops.shape import roll, flip
    r = roll(flip(_real_view(x), [dim]), 1, dim)        # x[(n - k) % n], on the real view
    v = r.contiguous()
    neg(v.select(-1, 1), out=v.select(-1, 1))
    from .ops.complex import view_as_complex
    return view_as_complex(v)


def _dev_fft(x, n, dim, norm, inverse):
    ct = _complex_dtype(x)
    x = _resize(x, dim, n)
    return _c2c_dim(x.to(ct), dim, inverse, _scale(norm, n, inverse))


def _dev_irfft(x, n, dim, norm):
    """c2r: the hermitian spectrum X[0..n//2] of a real signal of length n, inverted."""
    from .kernels.fft import irfft_rows
    from .ops.complex import real
    ct = _complex_dtype(x)
    half = n // 2 + 1
    x = _resize(x.to(ct), dim, half)
    if n % 2 == 0:
        # one inverse complex FFT of length n // 2 (kernels/fft.py: irfft_rows)
        last = x.ndim - 1
        xt = x.transpose(dim, last).contiguous() if dim != last else x.contiguous()
        y = irfft_rows(xt, n, _scale(norm, n, True))
        return y.transpose(dim, last).contiguous() if dim != last else y
    full = _resize(x, dim, n)                 # X[k] for k <= n // 2, zeros above
    mirror = _flip_conj(full, dim)            # conj(X[n - k])
    # k > n // 2 takes the mirror; X[0] keeps only its real part, which the real part of
    # the inverse below gives anyway
    if n - half > 0:
        full.narrow(dim, half, n - half).copy_(mirror.narrow(dim, half, n - half))
    y = _c2c_dim(full, dim, True, _scale(norm, n, True))
    return real(y).contiguous()


def _dev_rfft(x, n, dim, norm):
    if n % 2 == 0:
        # one complex FFT of length n // 2 and a post-twiddle (kernels/fft.py: rfft_rows)
        from .kernels.fft import rfft_rows
        rt = _dt.to_real(_complex_dtype(x))
        x = _resize(x.to(rt), dim, n)
        last = x.ndim - 1
        y = rfft_rows(_last_contiguous(x, dim), _scale(norm, n, False))
        return y.transpose(dim, last).contiguous() if dim != last else y
    y = _dev_fft(x, n, dim, norm, False)
    return y.narrow(dim, 0, n // 2 + 1).contiguous()


# ------------------------------------------------------------------ cpu (NumPy)
def _np_call(fname, x, ct_of, **kw):
    a = x.numpy()
    a = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
    r = getattr(np.fft, fname)(a, **kw)
    out = ct_of if isinstance(ct_of, _dt.DType) else ct_of(r)
    return Tensor._from_numpy_unchecked(np.ascontiguousarray(r.astype(out.np)))


# ------------------------------------------------------------------ the public transforms
def _one_dim(op, x, n, dim, norm, real_only=False):
    x = _input(x, op, real_only)
    norm = _norm(norm, op)
    _check_n(n, op)
    if x.ndim == 0:
        raise IndexError(f"{op}: a 0-dim tensor has no dim to transform")
    d = normalize_dim(dim, x.ndim)
    return x, d, norm


def _c2c(op, input, n, dim, norm, out, inverse):  # noqa: A002
    x, d, norm = _one_dim(op, input, n, dim, norm)
    n = n or x._shape[d]
    if x.device.type == "cpu":
        r = _np_call(op, x, _complex_dtype(x), n=n, axis=d, norm=norm)
    else:
        r = _dev_fft(x, n, d, norm, inverse)
    return _finish(r, out, op)


def _r2c(op, input, n, dim, norm, out, hermitian):  # noqa: A002
    """rfft, and ihfft: the conjugate of the rfft with the norm's direction swapped."""
    x, d, norm = _one_dim(op, input, n, dim, norm, real_only=True)
    n = n or x._shape[d]
    if x.device.type == "cpu":
        r = _np_call(op, x, _complex_dtype(x), n=n, axis=d, norm=norm)
    elif hermitian:
        from .ops.complex import conj
        r = conj(_dev_rfft(x, n, d, _swap(norm)))
    else:
        r = _dev_rfft(x, n, d, norm)
    return _finish(r, out, op)


def _c2r(op, input, n, dim, norm, out, hermitian):  # noqa: A002
    """irfft, and hfft: the irfft of the conjugate with the norm's direction swapped."""
    x, d, norm = _one_dim(op, input, n, dim, norm)
    n = n or 2 * (x._shape[d] - 1)
    _check_n(n, op)
    if x.device.type == "cpu":
        r = _np_call(op, x, _dt.to_real(_complex_dtype(x)), n=n, axis=d, norm=norm)
    elif hermitian:
        from .ops.complex import conj
        r = _dev_irfft(conj(x.to(_complex_dtype(x))), n, d, _swap(norm))
    else:
        r = _dev_irfft(x, n, d, norm)
    return _finish(r, out, op)


def fft(input, n=None, dim=-1, norm=None, *, out=None):  # noqa: A002
    return _c2c("fft", input, n, dim, norm, out, inverse=False)


def ifft(input, n=None, dim=-1, norm=None, *, out=None):  # noqa: A002
    return _c2c("ifft", input, n, dim, norm, out, inverse=True)


def rfft(input, n=None, dim=-1, norm=None, *, out=None):  # noqa: A002
    return _r2c("rfft", input, n, dim, norm, out, hermitian=False)


def ihfft(input, n=None, dim=-1, norm=None, *, out=None):  # noqa: A002
    return _r2c("ihfft", input, n, dim, norm, out, hermitian=True)


def irfft(input, n=None, dim=-1, norm=None, *, out=None):  # noqa: A002
    return _c2r("irfft", input, n, dim, norm, out, hermitian=False)


def hfft(input, n=None, dim=-1, norm=None, *, out=None):  # noqa: A002
    """The real spectrum of a signal with hermitian symmetry given by its first half."""
    return _c2r("hfft", input, n, dim, norm, out, hermitian=True)


def _nd(op, input, s, dim, norm, default_all, inverse, out):
    x = _input(input, op)
    norm = _norm(norm, op)
    dims, sizes = _dims_sizes(x, s, dim, op, default_all)
    sizes = [v or x._shape[d] for v, d in zip(sizes, dims)]
    if x.device.type == "cpu":
        r = _np_call("ifftn" if inverse else "fftn", x, _complex_dtype(x), s=sizes, axes=dims,
                     norm=norm)
    else:
        r = x
        for d, n in zip(dims, sizes):
            r = _dev_fft(r, n, d, norm, inverse)
    return _finish(r, out, op)


def fftn(input, s=None, dim=None, norm=None, *, out=None):  # noqa: A002
    return _nd("fftn", input, s, dim, norm, True, False, out)


def ifftn(input, s=None, dim=None, norm=None, *, out=None):  # noqa: A002
    return _nd("ifftn", input, s, dim, norm, True, True, out)


def fft2(input, s=None, dim=(-2, -1), norm=None, *, out=None):  # noqa: A002
    return _nd("fft2", input, s, dim, norm, False, False, out)


def ifft2(input, s=None, dim=(-2, -1), norm=None, *, out=None):  # noqa: A002
    return _nd("ifft2", input, s, dim, norm, False, True, out)


def _rnd(op, input, s, dim, norm, default_all, out):
    x = _input(input, op, real_only=True)
    norm = _norm(norm, op)
    dims, sizes = _dims_sizes(x, s, dim, op, default_all)
    sizes = [v or x._shape[d] for v, d in zip(sizes, dims)]
    if x.device.type == "cpu":
        r = _np_call("rfftn", x, _complex_dtype(x), s=sizes, axes=dims, norm=norm)
    else:
        r = _dev_rfft(x, sizes[-1], dims[-1], norm)
        for d, n in zip(dims[:-1], sizes[:-1]):
            r = _dev_fft(r, n, d, norm, False)
    return _finish(r, out, op)


def rfftn(input, s=None, dim=None, norm=None, *, out=None):  # noqa: A002
    return _rnd("rfftn", input, s, dim, norm, True, out)


def rfft2(input, s=None, dim=(-2, -1), norm=None, *, out=None):  # noqa: A002
    return _rnd("rfft2", input, s, dim, norm, False, out)


def _irnd(op, input, s, dim, norm, default_all, out):
    x = _input(input, op)
    norm = _norm(norm, op)
    dims, sizes = _dims_sizes(x, s, dim, op, default_all)
    sizes = [v or x._shape[d] for v, d in zip(sizes[:-1], dims[:-1])] + [
        sizes[-1] or 2 * (x._shape[dims[-1]] - 1)]
    _check_n(sizes[-1], op, "s")
    if x.device.type == "cpu":
        r = _np_call("irfftn", x, _dt.to_real(_complex_dtype(x)), s=sizes, axes=dims, norm=norm)
    else:
        r = x
        for d, n in zip(dims[:-1], sizes[:-1]):
            r = _dev_fft(r, n, d, norm, True)
        r = _dev_irfft(r, sizes[-1], dims[-1], norm)
    return _finish(r, out, op)


def irfftn(input, s=None, dim=None, norm=None, *, out=None):  # noqa: A002
    return _irnd("irfftn", input, s, dim, norm, True, out)


def irfft2(input, s=None, dim=(-2, -1), norm=None, *, out=None):  # noqa: A002
    return _irnd("irfft2", input, s, dim, norm, False, out)


def _finish(r, out, op):
    if out is None:
        return r
    from .ops._common import check_out
    check_out(out, r.shape, r.dtype, r.device, op)
    return out.copy_(r)


# ------------------------------------------------------------------ helpers
def fftfreq(n, d=1.0, *, dtype=None, device=None):
    """The sample frequencies [0, 1, ..., n/2-1, -n/2, ..., -1] / (d n) (torch.fft.fftfreq)."""
    return _freq("fftfreq", n, d, dtype, device)


def rfftfreq(n, d=1.0, *, dtype=None, device=None):
    return _freq("rfftfreq", n, d, dtype, device)


def _freq(op, n, d, dtype, device):
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"{op}: n must be a non-negative int, got {n!r}")
    dtype = _dt.get_default_dtype() if dtype is None else _dt.as_dtype(dtype)
    if not dtype.is_floating_point:
        raise TypeError(f"{op}: dtype must be floating point, got {dtype.name}")
    f = getattr(np.fft, op)(n, d) if n else np.zeros(0)
    return Tensor._from_numpy_unchecked(_dt.cast(f, dtype)).to(as_device(device))


def _shift(op, x, dim, sign):
    from .ops.shape import roll
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(x).__name__}")
    dims = list(range(x.ndim)) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    dims = [normalize_dim(d, x.ndim) for d in dims]
    if not dims:
        return x.clone()
    shifts = [sign * (x._shape[d] // 2) if sign > 0 else -(x._shape[d] // 2) for d in dims]
    if x._dtype.kind == "c":
        from .ops.complex import view_as_complex
        return view_as_complex(roll(_real_view(x), shifts, dims).contiguous())
    return roll(x, shifts, dims)


def fftshift(input, dim=None):  # noqa: A002
    """The zero frequency moved to the centre: a roll by n // 2 along each dim."""
    return _shift("fftshift", input, dim, 1)


def ifftshift(input, dim=None):  # noqa: A002
    return _shift("ifftshift", input, dim, -1)
