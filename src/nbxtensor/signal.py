"""Signal helpers with torch's names and semantics: the window functions and stft / istft.

The windows are computed on the host in float64 (kaiser's I0 too) and rounded once to the
requested dtype; torch computes them in that dtype, so float32 results differ from torch's
by an ulp or so. `periodic=True` (the default) is the symmetric window of length n + 1 with
its last point dropped, as torch does; lengths 0 and 1 give an empty tensor and [1.].

stft and istft are compositions, so they run on every device with the kernels of the other
families: `pad` for `center`, an `as_strided` view of overlapping frames times the window,
nbx.fft's rfft / fft of the frames; istft inverts each frame, weights it by the window and
overlap-adds the frames with ceil(n_fft / hop_length) strided adds (each add touches
non-overlapping samples), then divides by the overlap-added squared window. Where this
differs from torch: a complex input is padded through its real view (the same values); istft with
length=0 returns an empty tensor (torch fails in its envelope check); torch 2.x's
`align_to_window` is not taken.
"""
from __future__ import annotations

import math

import numpy as np

from . import dtypes as _dt
from .device import factory_device
from .tensor import Tensor, _real_view

__all__ = ["stft", "istft", "hann_window", "hamming_window", "blackman_window",
           "bartlett_window", "kaiser_window"]

_PAD_MODES = ("constant", "reflect", "replicate", "circular")
_ENVELOPE_MIN = 1e-11     # torch's threshold for "window overlap add min"


# ------------------------------------------------------------------ windows
def _window(op, window_length, periodic, dtype, device, formula):
    """formula(k, N): the symmetric window of length N at the float64 points k = 0..N-1."""
    if not isinstance(window_length, (int, np.integer)) or isinstance(window_length, bool):
        raise TypeError(f"{op}: window_length must be an int, got "
                        f"{type(window_length).__name__}")
    if window_length < 0:
        raise ValueError(f"{op}: window_length must be non-negative, got {window_length}")
    d = _dt.get_default_dtype() if dtype is None else _dt.as_dtype(dtype)
    if not d.is_floating_point or d.is_float8:
        raise TypeError(f"{op}: expects a floating point dtype (float16, bfloat16, float32, "
                        f"float64), got {d.name}")
    n = int(window_length)
    if n <= 1:
        w = np.ones(n)
    else:
        big = n + 1 if periodic else n
        w = formula(np.arange(big, dtype=np.float64), big)[:n]
    return Tensor._from_numpy_unchecked(_dt.cast(w, d)).to(factory_device(device))


def hamming_window(window_length, periodic=True, alpha=0.54, beta=0.46, *, dtype=None,
                   device=None):
    """torch.hamming_window: alpha - beta cos(2 pi k / (N - 1))."""
    a, b = float(alpha), float(beta)
    return _window("hamming_window", window_length, periodic, dtype, device,
                   lambda k, N: a - b * np.cos(2 * math.pi * k / (N - 1)))


def hann_window(window_length, periodic=True, *, dtype=None, device=None):
    """torch.hann_window: 0.5 - 0.5 cos(2 pi k / (N - 1))."""
    return _window("hann_window", window_length, periodic, dtype, device,
                   lambda k, N: 0.5 - 0.5 * np.cos(2 * math.pi * k / (N - 1)))


def blackman_window(window_length, periodic=True, *, dtype=None, device=None):
    """torch.blackman_window: 0.42 - 0.5 cos(2 pi k / (N - 1)) + 0.08 cos(4 pi k / (N - 1))."""
    return _window("blackman_window", window_length, periodic, dtype, device,
                   lambda k, N: 0.42 - 0.5 * np.cos(2 * math.pi * k / (N - 1))
                   + 0.08 * np.cos(4 * math.pi * k / (N - 1)))


def bartlett_window(window_length, periodic=True, *, dtype=None, device=None):
    """torch.bartlett_window: the triangle 1 - |2k / (N - 1) - 1|."""
    return _window("bartlett_window", window_length, periodic, dtype, device,
                   lambda k, N: 1.0 - np.abs(2.0 * k / (N - 1) - 1.0))


def kaiser_window(window_length, periodic=True, beta=12.0, *, dtype=None, device=None):
    """torch.kaiser_window: I0(beta sqrt(1 - ((k - a) / a)^2)) / I0(beta), a = (N - 1) / 2;
    I0 (NumPy's, the same Chebyshev series as torch's) in float64."""
    b = float(beta)

    def formula(k, N):
        a = (N - 1) / 2.0
        return np.i0(b * np.sqrt(np.abs(1.0 - ((k - a) / a) ** 2))) / np.i0(b)
    return _window("kaiser_window", window_length, periodic, dtype, device, formula)


# ------------------------------------------------------------------ shared checks
def _int_arg(v, name, op):
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
        raise TypeError(f"{op}: {name} must be an int, got {type(v).__name__}")
    return int(v)


def _check_layout(x, ndims, layout, op):
    """x has one of `ndims` dims (`layout` names them)."""
    if x.ndim not in ndims:
        raise ValueError(f"{op}: expected {layout} input, got shape {tuple(x.shape)}")


def _lengths(op, n_fft, hop_length, win_length):
    n_fft = _int_arg(n_fft, "n_fft", op)
    hop = n_fft // 4 if hop_length is None else _int_arg(hop_length, "hop_length", op)
    win = n_fft if win_length is None else _int_arg(win_length, "win_length", op)
    if n_fft <= 0:
        raise ValueError(f"{op}: expected n_fft > 0, got n_fft={n_fft}")
    if not 0 < win <= n_fft:
        raise ValueError(f"{op}: expected 0 < win_length <= n_fft={n_fft}, got win_length={win}")
    return n_fft, hop, win


def _full_window(op, window, win, n_fft, dtype, device):
    """The window as a length-n_fft tensor: ones when None, zero-padded at both ends (the
    left side gets (n_fft - win_length) // 2) when shorter than n_fft, as torch does."""
    if window is None:
        w = Tensor._empty((win,), dtype, device)
        w.fill_(1)
    else:
        if not isinstance(window, Tensor):
            raise TypeError(f"{op}: window must be a Tensor or None, got {type(window).__name__}")
        if window.ndim != 1 or window._shape[0] != win:
            raise ValueError(f"{op}: expected a 1-D window of size win_length={win}, got a "
                             f"window of shape {tuple(window.shape)}")
        if window.device != device:
            raise ValueError(f"{op}: window is on {window.device} but input is on {device}")
        w = window
    if win == n_fft:
        return w
    full = Tensor._empty((n_fft,), w._dtype, device)
    full.fill_(0)
    full.narrow(0, (n_fft - win) // 2, win).copy_(w)
    return full


def _norm(normalized):
    return "ortho" if normalized else "backward"


# ------------------------------------------------------------------ stft
def _pad_center(x, p, mode):
    """x (B, L) padded by p on both sides of L; a complex x through its real view."""
    from .ops.shape import pad
    if x._dtype.kind != "c":
        return pad(x, (p, p), mode=mode)
    from .ops.complex import view_as_complex
    return view_as_complex(pad(_real_view(x), (0, 0, p, p), mode=mode))


def stft(input, n_fft, hop_length=None, win_length=None, window=None, center=True,  # noqa: A002
         pad_mode="reflect", normalized=False, onesided=None, return_complex=None):
    """torch.stft: the (B,) n_freq x n_frames spectrum of a 1-D (L) or 2-D (B, L) signal.

    Frames start every hop_length (default n_fft // 4) samples; with `center` the signal is
    padded by n_fft // 2 on both sides with `pad_mode` first. The window (default: ones of
    win_length, default n_fft) is zero-padded to n_fft at its centre. `onesided` (default for
    real input and window) keeps the n_fft // 2 + 1 non-negative frequencies; `normalized`
    scales by n_fft ** -0.5. return_complex must be given for real input (torch 2.x):
    False returns view_as_real of the complex result (torch's deprecated form).
    """
    op = "stft"
    from .ops.elementwise import mul
    from . import fft as _fft
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    x = input
    if not (x._dtype.is_floating_point or x._dtype.kind == "c"):
        raise TypeError(f"{op}: expected a tensor of floating point or complex values, got "
                        f"{x._dtype.name}")
    _check_layout(x, (1, 2), "a 1-D (L) or 2-D (B, L)", op)
    n_fft, hop, win = _lengths(op, n_fft, hop_length, win_length)
    if hop <= 0:
        raise ValueError(f"{op}: expected hop_length > 0, got hop_length={hop}")
    if pad_mode not in _PAD_MODES:
        raise ValueError(f"{op}: pad_mode must be one of {_PAD_MODES}, got {pad_mode!r}")
    if window is not None and not isinstance(window, Tensor):
        raise TypeError(f"{op}: window must be a Tensor or None, got {type(window).__name__}")
    is_complex = x._dtype.kind == "c" or (window is not None and window._dtype.kind == "c")
    if return_complex is None:
        if not is_complex:
            raise ValueError(f"{op}: return_complex must be given for real input and window "
                             f"(torch 2.x); return_complex=True is the supported form")
        return_complex = True
    if onesided is None:
        onesided = not is_complex
    elif onesided and is_complex:
        raise ValueError(f"{op}: onesided=True is impossible for a complex input or window")
    dev = x._storage.device
    w = _full_window(op, window, win, n_fft, x._dtype if x._dtype.kind != "c" else
                     _dt.to_real(x._dtype), dev)

    x2 = x.unsqueeze(0) if x.ndim == 1 else x
    if center:
        p = n_fft // 2
        if pad_mode == "reflect" and p >= x2._shape[-1]:
            raise ValueError(f"{op}: center=True with pad_mode='reflect' pads n_fft // 2 = {p} "
                             f"samples, which must be fewer than the {x2._shape[-1]} samples "
                             f"of the signal")
        x2 = _pad_center(x2, p, pad_mode)
    x2 = x2.contiguous()
    B, L = x2._shape
    if n_fft > L:
        raise ValueError(f"{op}: expected 0 < n_fft <= {L} (the length of the "
                         f"{'padded ' if center else ''}signal), got n_fft={n_fft}")
    n_frames = 1 + (L - n_fft) // hop
    frames = x2.as_strided((B, n_frames, n_fft), (L, hop, 1))
    frames = mul(frames, w)
    norm = _norm(normalized)
    spec = _fft.rfft(frames, norm=norm) if onesided else _fft.fft(frames, norm=norm)
    out = spec.transpose(1, 2)
    if x.ndim == 1:
        out = out.squeeze(0)
    if not return_complex:
        from .ops.complex import view_as_real
        out = view_as_real(out)
    return out


# ------------------------------------------------------------------ istft
def _overlap_add(frames, hop):
    """frames (B, F, N) summed into (B, N + hop (F - 1)), frame f starting at f * hop."""
    from .ops.elementwise import add
    B, F, N = frames._shape
    L = N + hop * (F - 1)
    y = Tensor._empty((B, L), frames._dtype, frames._storage.device)
    y.fill_(0)
    for j in range(0, N, hop):   # frame samples j .. j + seg of all frames at once
        seg = min(hop, N - j)
        v = y.as_strided((B, F, seg), (L, hop, 1), j)
        add(v, frames.narrow(2, j, seg), out=v)
    return y


def istft(input, n_fft, hop_length=None, win_length=None, window=None, center=True,  # noqa: A002
          normalized=False, onesided=None, length=None, return_complex=False):
    """torch.istft: the signal whose stft (same n_fft, hop, window, center, normalized) is
    `input`, a complex (n_freq, n_frames) or (B, n_freq, n_frames) tensor; the overlap-added
    frames are divided by the overlap-added squared window, which must nowhere be ~0 (torch's
    "window overlap add min" check). `length` trims or zero-pads the result."""
    op = "istft"
    from .ops.elementwise import abs as _abs, div, mul
    from .ops.reduction import amin
    from . import fft as _fft
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    x = input
    if x._dtype.kind != "c":
        raise TypeError(f"{op}: requires a complex input tensor (stft's return_complex=True "
                        f"output), got {x._dtype.name}")
    _check_layout(x, (2, 3), "a (n_freq, n_frames) or (B, n_freq, n_frames)", op)
    n_fft, hop, win = _lengths(op, n_fft, hop_length, win_length)
    if not 0 < hop <= win:
        raise ValueError(f"{op}: expected 0 < hop_length <= win_length={win}, got "
                         f"hop_length={hop}")
    x3 = x.unsqueeze(0) if x.ndim == 2 else x
    B, n_freq, n_frames = x3._shape
    if n_frames == 0:
        raise ValueError(f"{op}: input has no frames (shape {tuple(x.shape)})")
    if onesided is None:
        onesided = n_freq != n_fft
    want = n_fft // 2 + 1 if onesided else n_fft
    if n_freq != want:
        raise ValueError(f"{op}: expected {want} frequencies (dim -2) for n_fft={n_fft} and "
                         f"onesided={onesided}, got {n_freq}")
    if window is not None and not isinstance(window, Tensor):
        raise TypeError(f"{op}: window must be a Tensor or None, got {type(window).__name__}")
    if return_complex:
        if onesided:
            raise ValueError(f"{op}: return_complex=True needs the two-sided spectrum "
                             f"(onesided=False)")
    elif window is not None and window._dtype.kind == "c":
        raise TypeError(f"{op}: a complex window needs return_complex=True")
    if length is not None:
        length = _int_arg(length, "length", op)
        if length < 0:
            raise ValueError(f"{op}: length must be non-negative, got {length}")
    dev = x._storage.device
    w = _full_window(op, window, win, n_fft, _dt.to_real(x._dtype), dev)

    frames = x3.transpose(1, 2)                           # (B, n_frames, n_freq)
    norm = _norm(normalized)
    if return_complex:
        frames = _fft.ifft(frames, n=n_fft, norm=norm)
    else:   # torch inverts a two-sided spectrum through its first half (c2r) too
        frames = _fft.irfft(frames.narrow(2, 0, n_fft // 2 + 1), n=n_fft, norm=norm)
    y = _overlap_add(mul(frames, w), hop)
    sq = mul(w, w)
    env = _overlap_add(sq.expand(1, n_frames, n_fft), hop)
    total = y._shape[1]
    start = n_fft // 2 if center else 0
    end = start + length if length is not None else (total - n_fft // 2 if center else total)
    stop = max(start, min(end, total))
    y = y.narrow(1, start, stop - start)
    env = env.narrow(1, start, stop - start)
    if stop > start:
        low = float(amin(_abs(env)).item())
        if not low >= _ENVELOPE_MIN:
            raise ValueError(f"{op}: window overlap add min: the overlap-added squared window "
                             f"falls to {low:.3g} (< {_ENVELOPE_MIN}) inside the output, so "
                             f"the signal cannot be recovered there; use a window and "
                             f"hop_length whose frames overlap everywhere (center=False with "
                             f"a window that is 0 at its ends cannot)")
        y = div(y, env)
    if end > total:   # torch pads the tail with zeros (and warns)
        from .ops.shape import pad
        y = _pad_tail(y, end - total, pad)
    if x.ndim == 2:
        y = y.squeeze(0)
    return y


def _pad_tail(y, n, pad):
    if y._dtype.kind != "c":
        return pad(y, (0, n))
    from .ops.complex import view_as_complex
    return view_as_complex(pad(_real_view(y), (0, 0, 0, n)))


def _install():
    from .ops import _methods
    _methods.install(stft=stft, istft=istft)


_install()
