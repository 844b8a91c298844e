"""nbx.audio: Whisper's log-mel front end, librosa's mel filter bank, and WAV loading.

`log_mel_spectrogram` computes what openai-whisper's function of that name does: the stft
of a periodic Hann window (n_fft 400, hop 160 at 16 kHz), the power of every frame but the
last, a Slaney mel filter bank, log10 clamped at 1e-10, floored at 8 below the maximum (of
the whole tensor, as Whisper does, so the items of a batch share one floor), then
(x + 4) / 4. `mel_filters` is librosa.filters.mel's formula with its defaults (fmin 0,
fmax sr / 2, the Slaney mel scale and area normalisation), computed here.

`load_wav` reads PCM WAV (8-bit unsigned, 16/24/32-bit signed) through the standard
library's `wave` module and IEEE-float WAV (format 3, 32/64-bit; `wave` refuses it) and
WAVE_FORMAT_EXTENSIBLE with a PCM or float sub-format through a small RIFF chunk parser.
A file whose header disagrees with its data (truncated, sizes that lie, impossible
formats) raises WavFormatError (a ValueError) naming the file. There is no resampler:
log_mel_spectrogram refuses a WAV file that is not 16 kHz mono.
"""
from __future__ import annotations

import functools
import math
import os
import struct
import wave

import numpy as np

from . import dtypes as _dt
from .device import as_device
from .tensor import Tensor

__all__ = ["log_mel_spectrogram", "mel_filters", "load_wav", "WavFormatError", "SAMPLE_RATE",
           "N_FFT", "HOP_LENGTH"]

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160


# ------------------------------------------------------------------ mel filter bank
_F_SP = 200.0 / 3           # Slaney: linear below 1 kHz, 200/3 Hz a mel
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0


def _hz_to_mel(f):
    f = np.asarray(f, dtype=np.float64)
    lin = f / _F_SP
    log = _MIN_LOG_MEL + np.log(np.maximum(f, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(f >= _MIN_LOG_HZ, log, lin)


def _mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    lin = _F_SP * m
    log = _MIN_LOG_HZ * np.exp(_LOGSTEP * (m - _MIN_LOG_MEL))
    return np.where(m >= _MIN_LOG_MEL, log, lin)


@functools.lru_cache(maxsize=16)
def _mel_bank(sr: int, n_fft: int, n_mels: int) -> np.ndarray:
    fft_freqs = np.fft.rfftfreq(n_fft, 1.0 / sr)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sr / 2.0), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    # librosa rounds the triangles to float32 before it scales them (in place, float32)
    tri = np.maximum(0.0, np.minimum(lower, upper)).astype(np.float32)
    enorm = 2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels])
    bank = (tri * enorm[:, None]).astype(np.float32)
    bank.setflags(write=False)
    return bank


def mel_filters(sr, n_fft, n_mels, *, device=None) -> Tensor:
    """librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels): a float32 (n_mels,
    1 + n_fft // 2) matrix of triangles on the Slaney mel scale, each of unit area in Hz."""
    for name, v in (("sr", sr), ("n_fft", n_fft), ("n_mels", n_mels)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"mel_filters: {name} must be a positive int, got {v!r}")
    bank = _mel_bank(int(sr), int(n_fft), int(n_mels))
    return Tensor._from_numpy_unchecked(bank.copy()).to(as_device(device))


# ------------------------------------------------------------------ log-mel
def log_mel_spectrogram(audio, n_mels=80, n_fft=N_FFT, hop_length=HOP_LENGTH, padding=0,
                        device=None) -> Tensor:
    """Whisper's log-mel spectrogram of 16 kHz audio: (n_mels, n_frames) for (samples,)
    input, (B, n_mels, n_frames) for (B, samples); n_frames = samples // hop_length for the
    defaults. `audio` is a Tensor, a NumPy array or the path of a 16 kHz mono WAV file;
    float32 and float64 keep their dtype. `padding` zero samples are appended first."""
    from .ops.elementwise import add, clamp, log10, maximum, mul
    from .ops.linalg import matmul
    from .ops.shape import pad
    from .signal import hann_window, stft
    if isinstance(audio, (str, os.PathLike)):
        wav, sr = load_wav(audio)
        if sr != SAMPLE_RATE or wav.shape[0] != 1:
            raise ValueError(f"log_mel_spectrogram: {os.fspath(audio)!r} is {sr} Hz with "
                             f"{wav.shape[0]} channels; expected {SAMPLE_RATE} Hz mono "
                             f"(nbx.audio has no resampler; downmix and resample first)")
        audio = wav[0]
    elif isinstance(audio, np.ndarray):
        audio = Tensor._from_numpy_unchecked(np.ascontiguousarray(audio))
    elif not isinstance(audio, Tensor):
        raise TypeError(f"log_mel_spectrogram: audio must be a Tensor, a NumPy array or a path, "
                        f"got {type(audio).__name__}")
    if audio._dtype not in (_dt.float32, _dt.float64):
        raise TypeError(f"log_mel_spectrogram: audio must be float32 or float64, got "
                        f"{audio._dtype.name}")
    if not isinstance(padding, (int, np.integer)) or isinstance(padding, bool) or padding < 0:
        raise ValueError(f"log_mel_spectrogram: padding must be a non-negative int, got "
                         f"{padding!r}")
    if device is not None:
        audio = audio.to(as_device(device))
    if padding:
        audio = pad(audio, (0, int(padding)))
    dev = audio._storage.device
    window = hann_window(n_fft, dtype=audio._dtype, device=dev)
    spec = stft(audio, n_fft, hop_length, window=window, return_complex=True)
    spec = spec.narrow(-1, 0, spec.shape[-1] - 1)
    re, im = spec.real, spec.imag
    power = add(mul(re, re), mul(im, im))               # |X|^2 without the square root
    bank = mel_filters(SAMPLE_RATE, n_fft, n_mels, device=dev).to(audio._dtype)
    log_spec = log10(clamp(matmul(bank, power), min=1e-10))
    log_spec = maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


# ------------------------------------------------------------------ WAV
class WavFormatError(ValueError):
    """A WAV file whose header is malformed or disagrees with its data."""


_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE


def load_wav(path):
    """(samples, sample_rate) of a WAV file: a float32 (channels, frames) cpu tensor in
    [-1, 1] (PCM scaled by 2 ** (bits - 1), 8-bit centred on 128; float samples as stored).
    Only regular files are opened."""
    from .files import regular_file
    p = os.fspath(path)
    regular_file(p, "WAV file")
    with open(p, "rb") as f:
        fmt, channels, rate, bits, start, nbytes = _read_riff(f, p)
        block = channels * (bits // 8)
        if nbytes % block:
            raise WavFormatError(f"WAV file {p!r}: {nbytes} data bytes are not whole frames of "
                                 f"{block} bytes")
        if fmt == _PCM:
            raw = _read_pcm_wave(p, channels, rate, bits, nbytes)
        else:
            f.seek(start)
            raw = f.read(nbytes)
    a = _decode(raw, bits, fmt == _FLOAT).reshape(-1, channels)
    return Tensor._from_numpy_unchecked(np.ascontiguousarray(a.T)), rate


def _read_pcm_wave(p, channels, rate, bits, nbytes):
    """The PCM data bytes through the wave module, checked against the chunk parser's view."""
    try:
        with wave.open(p, "rb") as w:
            wc, wr, ww, n = w.getnchannels(), w.getframerate(), w.getsampwidth(), w.getnframes()
            raw = w.readframes(n)
    except (wave.Error, EOFError, struct.error) as e:
        raise WavFormatError(f"WAV file {p!r}: {e}") from None
    if (wc, wr, ww * 8) != (channels, rate, bits) or len(raw) != nbytes:
        raise WavFormatError(f"WAV file {p!r}: the wave module read {wc} channels, {wr} Hz, "
                             f"{ww * 8}-bit, {len(raw)} bytes; the header says {channels}, "
                             f"{rate}, {bits}-bit, {nbytes} bytes")
    return raw


def _read_riff(f, p):
    """(format, channels, rate, bits, data offset, data size) from the RIFF chunks of an open
    WAV file, with every size checked against the bytes that are really there."""
    size = os.fstat(f.fileno()).st_size
    head = f.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise WavFormatError(f"WAV file {p!r}: not a RIFF/WAVE file (the first 12 bytes are "
                             f"{head!r})")
    fmt = None
    pos = 12
    while True:
        ch = f.read(8)
        if len(ch) < 8:
            what = "a fmt chunk" if fmt is None else "a data chunk"
            raise WavFormatError(f"WAV file {p!r}: the file ends at byte {pos + len(ch)} "
                                 f"without {what}")
        cid, n = ch[:4], struct.unpack("<I", ch[4:])[0]
        pos += 8
        if pos + n > size:
            raise WavFormatError(f"WAV file {p!r}: chunk {cid!r} at byte {pos - 8} claims {n} "
                                 f"bytes, but only {size - pos} follow (truncated, or a lying "
                                 f"size)")
        if cid == b"fmt ":
            fmt = _parse_fmt(f.read(n), p)
        elif cid == b"data":
            if fmt is None:
                raise WavFormatError(f"WAV file {p!r}: the data chunk comes before a fmt chunk")
            return (*fmt, pos, n)
        else:
            f.seek(n, os.SEEK_CUR)
        if n % 2:   # chunks are padded to an even size
            f.seek(1, os.SEEK_CUR)
        pos += n + n % 2


def _parse_fmt(b, p):
    if len(b) < 16:
        raise WavFormatError(f"WAV file {p!r}: the fmt chunk has {len(b)} bytes, expected >= 16")
    tag, channels, rate, _byte_rate, block, bits = struct.unpack("<HHIIHH", b[:16])
    if tag == _EXTENSIBLE:
        if len(b) < 40:
            raise WavFormatError(f"WAV file {p!r}: a WAVE_FORMAT_EXTENSIBLE fmt chunk of "
                                 f"{len(b)} bytes, expected 40")
        tag = struct.unpack("<H", b[24:26])[0]     # the sub-format GUID starts with the tag
        if tag == _PCM:
            tag = -_PCM   # PCM in an extensible header: decoded here, wave refuses it
    kinds = {_PCM: (8, 16, 24, 32), -_PCM: (8, 16, 24, 32), _FLOAT: (32, 64)}
    if tag not in kinds:
        raise WavFormatError(f"WAV file {p!r}: format tag {tag:#x} is not supported; expected "
                             f"PCM (1) or IEEE float (3)")
    if bits not in kinds[tag]:
        raise WavFormatError(f"WAV file {p!r}: {bits}-bit samples are not supported for "
                             f"{'float' if tag == _FLOAT else 'PCM'}; expected one of "
                             f"{kinds[tag]}")
    if channels == 0 or rate == 0:
        raise WavFormatError(f"WAV file {p!r}: {channels} channels at {rate} Hz")
    if block != channels * bits // 8:
        raise WavFormatError(f"WAV file {p!r}: block align {block} is not channels * bytes per "
                             f"sample = {channels * bits // 8}")
    return (_PCM if tag == _PCM else (_FLOAT if tag == _FLOAT else -_PCM)), channels, rate, bits


def _decode(raw, bits, is_float):
    """Little-endian samples as float32 in [-1, 1]."""
    if is_float:
        return np.frombuffer(raw, dtype="<f4" if bits == 32 else "<f8").astype(np.float32)
    if bits == 8:
        return (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    if bits == 24:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        v = np.where(v >= 1 << 23, v - (1 << 24), v)
        return v.astype(np.float64).astype(np.float32) / np.float32(1 << 23)
    dt = "<i2" if bits == 16 else "<i4"
    return (np.frombuffer(raw, dtype=dt).astype(np.float64) / float(1 << (bits - 1))).astype(
        np.float32)
