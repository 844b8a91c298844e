"""Window functions, stft/istft and nbx.audio (Whisper's log-mel, librosa's mel bank, WAV).

References: NumPy's own window functions and float64 NumPy stft/istft written here (frames,
numpy.fft), torch's results where its semantics are subtle (fixtures/signal/torch_signal.npz,
tests/fixtures/make_signal_fixtures.py) and librosa's mel banks
(fixtures/signal/librosa_mel.npz, tests/fixtures/make_mel_fixtures.py).
"""
import json
import math
import os
import struct
import wave

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor.audio import WavFormatError
from nbxtensor.files import NotARegularFileError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH = np.load(os.path.join(HERE, "fixtures", "signal", "torch_signal.npz"))
MEL = np.load(os.path.join(HERE, "fixtures", "signal", "librosa_mel.npz"))

WINDOWS = ["hann_window", "hamming_window", "blackman_window", "bartlett_window",
           "kaiser_window"]


def _np_window(fn, n, periodic, **kw):
    """NumPy's window functions (symmetric), made periodic by dropping the last of n + 1."""
    if n == 0:
        return np.zeros(0)
    if n == 1:
        return np.ones(1)
    m = n + 1 if periodic else n
    if fn == "hamming_window" and kw:
        k = np.arange(m)
        w = kw["alpha"] - kw["beta"] * np.cos(2 * np.pi * k / (m - 1))
    else:
        w = {"hann_window": np.hanning, "hamming_window": np.hamming,
             "blackman_window": np.blackman, "bartlett_window": np.bartlett,
             "kaiser_window": lambda m: np.kaiser(m, kw.get("beta", 12.0))}[fn](m)
    return w[:n]


def _close(got, want, tol):
    got = got.cpu().numpy() if isinstance(got, nbx.Tensor) else got
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(float(np.abs(want).max()) if want.size else 1.0, 1.0)
    err = float(np.abs(got.astype(np.complex128) - want).max()) if want.size else 0.0
    assert err <= tol * scale, f"max error {err:.3e} > {tol * scale:.3e}"


def _tol(dtype):
    return 2e-5 if dtype in (nbx.float32, nbx.complex64) else 1e-12


# ------------------------------------------------------------------ windows
@pytest.mark.parametrize("fn", WINDOWS)
def test_windows_against_numpy(device, fn):
    for n in (0, 1, 2, 7, 33):
        for periodic in (True, False):
            for dt in (nbx.float32, nbx.float64):
                w = getattr(nbx, fn)(n, periodic, dtype=dt, device=device)
                assert w.dtype is dt and w.device.type == device and w.shape == (n,)
                _close(w, _np_window(fn, n, periodic), 1e-7 if dt is nbx.float32 else 1e-14)
    assert getattr(nbx, fn)(10).dtype is nbx.get_default_dtype()
    _close(getattr(nbx, fn)(10), _np_window(fn, 10, True), 1e-7)     # periodic by default


def test_window_parameters(device):
    _close(nbx.hamming_window(9, False, 0.6, 0.3, dtype=nbx.float64, device=device),
           _np_window("hamming_window", 9, False, alpha=0.6, beta=0.3), 1e-14)
    for beta in (0.0, 3.5, 20.0):
        _close(nbx.kaiser_window(12, True, beta, dtype=nbx.float64, device=device),
               _np_window("kaiser_window", 12, True, beta=beta), 1e-14)
    for dt in (nbx.float16, nbx.bfloat16):
        w = nbx.hann_window(8, dtype=dt, device=device)
        assert w.dtype is dt
        _close(w.to(nbx.float32), _np_window("hann_window", 8, True), 1e-2)


def test_windows_match_torch():
    assert str(TORCH["torch_version"]).startswith("2.")
    keys = [k[:-len("/y")] for k in TORCH.files if k.startswith("win/") and k.endswith("/y")]
    assert len(keys) == 8
    for k in keys:
        args = json.loads(str(TORCH[k + "/args"]))
        fn, lengths = args.pop("fn"), args.pop("lengths")
        want = TORCH[k + "/y"]
        got = np.concatenate([getattr(nbx, fn)(n, periodic, *args.values(),
                                               dtype=nbx.float64).numpy()
                              for n in lengths for periodic in (True, False)])
        _close(got, want, 1e-13)


def test_window_errors():
    for fn in WINDOWS:
        f = getattr(nbx, fn)
        with pytest.raises(ValueError, match="non-negative"):
            f(-1)
        for bad in (4.0, True):
            with pytest.raises(TypeError, match="window_length must be an int"):
                f(bad)
        for dt in (nbx.int64, nbx.complex64, nbx.float8_e4m3fn):
            with pytest.raises(TypeError, match="floating point dtype"):
                f(4, dtype=dt)


# ------------------------------------------------------------------ stft
def _np_full_window(w, win, n_fft):
    w = np.ones(win) if w is None else np.asarray(w)
    left = (n_fft - win) // 2
    full = np.zeros(n_fft, dtype=w.dtype)
    full[left:left + win] = w
    return full


def _np_stft(x, n_fft, hop, win, window, center, pad_mode, normalized, onesided):
    """float64/complex128 stft of a (B, L) or (L,) NumPy signal, frame by frame."""
    x = np.atleast_2d(x).astype(np.complex128 if np.iscomplexobj(x) else np.float64)
    if center:
        mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
                "circular": "wrap"}[pad_mode]
        x = np.pad(x, ((0, 0), (n_fft // 2, n_fft // 2)), mode=mode)
    w = _np_full_window(window, win, n_fft)
    n_frames = 1 + (x.shape[1] - n_fft) // hop
    frames = np.stack([x[:, f * hop:f * hop + n_fft] * w for f in range(n_frames)], axis=1)
    spec = np.fft.rfft(frames, axis=-1) if onesided else np.fft.fft(frames, axis=-1)
    if normalized:
        spec = spec / math.sqrt(n_fft)
    return spec.transpose(0, 2, 1)


# (signal shape, n_fft, hop, win_length, window fn or None, center, pad_mode, normalized,
#  onesided); odd lengths, hops that do not divide n_fft
STFT_CASES = [
    ((2, 67), 16, 4, None, "hann_window", True, "reflect", False, True),
    ((53,), 12, 5, None, "hamming_window", True, "constant", False, True),
    ((2, 41), 16, 3, None, "blackman_window", True, "replicate", True, True),
    ((2, 41), 10, 7, None, "kaiser_window", True, "circular", False, False),
    ((2, 50), 16, 6, None, "bartlett_window", False, "reflect", False, True),
    ((45,), 20, 4, 9, "hann_window", True, "reflect", False, True),       # odd padding: left 5
    ((2, 45), 15, 5, 8, None, False, "reflect", True, False),
]


@pytest.mark.parametrize("case", range(len(STFT_CASES)))
@pytest.mark.parametrize("dt", [nbx.float32, nbx.float64])
def test_stft_against_numpy(device, case, dt):
    shape, n_fft, hop, win, wfn, center, pad_mode, normalized, onesided = STFT_CASES[case]
    g = np.random.default_rng(case)
    x = g.standard_normal(shape).astype(dt.np)
    wl = win or n_fft
    wnp = None if wfn is None else _np_window(wfn, wl, True).astype(dt.np)
    w = None if wnp is None else nbx.tensor(wnp, device=device)
    got = nbx.stft(nbx.tensor(x, device=device), n_fft, hop, win, w, center, pad_mode,
                   normalized, onesided, return_complex=True)
    want = _np_stft(x, n_fft, hop, wl, wnp, center, pad_mode, normalized, onesided)
    want = want if len(shape) == 2 else want[0]
    assert got.dtype is (nbx.complex64 if dt is nbx.float32 else nbx.complex128)
    _close(got, want, _tol(dt))


def test_stft_strided_input_and_return_complex_false(device):
    g = np.random.default_rng(5)
    base = g.standard_normal((3, 130)).astype(np.float32)
    x = nbx.tensor(base, device=device)[::2, ::2]          # (2, 65), strides (260, 2)
    w = nbx.hann_window(16, device=device)
    want = _np_stft(base[::2, ::2], 16, 4, 16, _np_window("hann_window", 16, True), True,
                    "reflect", False, True)
    _close(nbx.stft(x, 16, window=w, return_complex=True), want, 2e-5)
    r = x.stft(16, window=w, return_complex=False)          # the Tensor method too
    assert r.dtype is nbx.float32 and tuple(r.shape) == want.shape + (2,)
    _close(r.cpu().numpy()[..., 0] + 1j * r.cpu().numpy()[..., 1], want, 2e-5)
    want = _np_stft(base[::2, ::2], 16, 5, 16, None, False, None, False, True)
    _close(nbx.stft(x, 16, 5, center=False, return_complex=True), want, 2e-5)


def test_stft_nan_stays_in_its_frames(device):
    x = np.random.default_rng(6).standard_normal(64).astype(np.float32)
    x[40] = np.nan
    got = nbx.stft(nbx.tensor(x, device=device), 16, 8, window=nbx.hann_window(16,
                   device=device), center=False, return_complex=True).cpu().numpy()
    bad = np.isnan(got).any(axis=0)
    # frames f cover samples 8f .. 8f + 15: 40 is in frames 4 and 5 (at its first sample,
    # where hann(16) is 0, but 0 * NaN is NaN: torch multiplies by the window too)
    assert bad.tolist() == [f in (4, 5) for f in range(7)]


def test_stft_promotes_with_the_window(device):
    x = nbx.tensor(np.random.default_rng(7).standard_normal(40).astype(np.float32),
                   device=device)
    w64 = nbx.hann_window(16, dtype=nbx.float64, device=device)
    assert nbx.stft(x, 16, window=w64, return_complex=True).dtype is nbx.complex128
    r = nbx.stft(x.to(nbx.complex64), 16, window=nbx.hann_window(16, device=device))
    assert r.dtype is nbx.complex64 and r.shape[0] == 16     # complex input: two-sided


def _fixture_cases(kind):
    return sorted({k.split("/")[1] for k in TORCH.files if k.startswith(kind + "/")})


def _fixture(kind, name, device):
    x = TORCH[f"{kind}/{name}/x"]
    wkey = f"{kind}/{name}/w"
    w = nbx.tensor(TORCH[wkey], device=device) if wkey in TORCH.files else None
    return (nbx.tensor(x, device=device), w, TORCH[f"{kind}/{name}/y"],
            json.loads(str(TORCH[f"{kind}/{name}/args"])))


@pytest.mark.parametrize("name", _fixture_cases("stft"))
def test_stft_matches_torch(device, name):
    x, w, want, kw = _fixture("stft", name, device)
    got = nbx.stft(x, window=w, **kw)
    if not kw["return_complex"]:
        assert got.dtype is nbx.float64
        got = got.cpu().numpy()[..., 0] + 1j * got.cpu().numpy()[..., 1]
        want = want[..., 0] + 1j * want[..., 1]
    _close(got, want, 1e-12)


@pytest.mark.parametrize("name", _fixture_cases("istft"))
def test_istft_matches_torch(device, name):
    x, w, want, kw = _fixture("istft", name, device)
    got = nbx.istft(x, window=w, **kw)
    assert got.dtype is (nbx.complex128 if kw.get("return_complex") else nbx.float64)
    _close(got, want, 1e-12)


# ------------------------------------------------------------------ istft
def _np_istft(spec, n_fft, hop, window, center, length):
    """float64 overlap-add of the irfft of each frame, divided by the squared-window
    envelope (the least-squares inverse of the stft)."""
    spec = np.atleast_3d(spec) if spec.ndim == 3 else spec[None]
    frames = np.fft.irfft(spec.transpose(0, 2, 1), n=n_fft, axis=-1) * window
    B, F, _ = frames.shape
    L = n_fft + hop * (F - 1)
    y, env = np.zeros((B, L)), np.zeros(L)
    for f in range(F):
        y[:, f * hop:f * hop + n_fft] += frames[:, f]
        env[f * hop:f * hop + n_fft] += window ** 2
    start = n_fft // 2 if center else 0
    end = start + length if length is not None else (L - n_fft // 2 if center else L)
    out = y[:, start:end] / env[start:end]
    return np.pad(out, ((0, 0), (0, max(0, end - L))))


@pytest.mark.parametrize("center,length", [(True, None), (True, 70), (False, None)])
def test_istft_against_numpy(device, center, length):
    g = np.random.default_rng(8)
    spec = g.standard_normal((2, 9, 10)) + 1j * g.standard_normal((2, 9, 10))
    w = _np_window("hamming_window", 16, True)
    got = nbx.istft(nbx.tensor(spec.astype(np.complex64), device=device), 16, 5,
                    window=nbx.tensor(w.astype(np.float32), device=device), center=center,
                    length=length)
    assert got.dtype is nbx.float32
    _close(got, _np_istft(spec, 16, 5, w, center, length), 2e-5)


@pytest.mark.parametrize("n_fft,hop,win,wfn,center", [
    (16, 4, None, "hann_window", True), (25, 6, None, "hann_window", True),
    (16, 5, None, "hamming_window", False), (20, 5, 12, "hann_window", True),
    (16, 16, None, None, False)])
def test_round_trip(device, n_fft, hop, win, wfn, center):
    g = np.random.default_rng(n_fft + hop)
    L = 73
    x = g.standard_normal((2, L)).astype(np.float32)
    wl = win or n_fft
    w = None if wfn is None else getattr(nbx, wfn)(wl, device=device)
    t = nbx.tensor(x, device=device)
    if not center:   # without padding, the last partial frame's samples are not covered
        L = n_fft + hop * ((L - n_fft) // hop)
    S = nbx.stft(t, n_fft, hop, win, w, center=center, return_complex=True)
    y = nbx.istft(S, n_fft, hop, win, w, center=center, length=L)
    _close(y, x[:, :L].astype(np.float64), 2e-5)
    if device == "cpu":   # complex signals, two-sided, through ifft
        xc = x + 1j * g.standard_normal((2, 73)).astype(np.float32)
        tc = nbx.tensor(xc.astype(np.complex64), device=device)
        Sc = nbx.stft(tc, n_fft, hop, win, w, center=center)
        yc = Sc.istft(n_fft, hop, win, w, center=center, length=L, return_complex=True)
        _close(yc, xc[:, :L].astype(np.complex128), 2e-5)


def test_istft_length_pads_and_trims(device):
    x = nbx.tensor(np.random.default_rng(9).standard_normal(64).astype(np.float32),
                   device=device)
    w = nbx.hann_window(16, device=device)
    S = nbx.stft(x, 16, 4, window=w, return_complex=True)
    longer = nbx.istft(S, 16, 4, window=w, length=80).cpu().numpy()
    # samples 64..71 are the reflect padding's (x[62], x[61], ...), zeros only after the
    # 80 - 8 samples that frames cover
    xs = x.cpu().numpy().astype(np.float64)
    _close(longer, np.concatenate([xs, xs[62:54:-1], np.zeros(8)]), 2e-5)
    _close(nbx.istft(S, 16, 4, window=w, length=30), xs[:30], 2e-5)
    assert nbx.istft(S, 16, 4, window=w, length=0).shape == (0,)


def test_stft_errors():
    x = nbx.tensor(np.random.default_rng(10).standard_normal(64).astype(np.float32))
    w = nbx.hann_window(16)
    with pytest.raises(ValueError, match="return_complex must be given"):
        nbx.stft(x, 16, window=w)
    with pytest.raises(ValueError, match="onesided=True"):
        nbx.stft(x.to(nbx.complex64), 16, window=w, onesided=True)
    with pytest.raises(ValueError, match="win_length"):
        nbx.stft(x, 16, win_length=17, return_complex=True)
    with pytest.raises(ValueError, match="win_length"):
        nbx.stft(x, 16, win_length=0, return_complex=True)
    with pytest.raises(ValueError, match="hop_length > 0"):
        nbx.stft(x, 16, hop_length=0, return_complex=True)
    with pytest.raises(ValueError, match="n_fft > 0"):
        nbx.stft(x, 0, return_complex=True)
    with pytest.raises(ValueError, match="window of shape"):
        nbx.stft(x, 16, window=nbx.hann_window(15), return_complex=True)
    with pytest.raises(ValueError, match="window of shape"):
        nbx.stft(x, 16, window=nbx.ones(16, 1), return_complex=True)
    with pytest.raises(ValueError, match="pad_mode"):
        nbx.stft(x, 16, pad_mode="symmetric", return_complex=True)
    with pytest.raises(TypeError, match="floating point or complex"):
        nbx.stft(nbx.arange(64), 16, return_complex=True)
    with pytest.raises(ValueError, match="1-D"):
        nbx.stft(x.reshape(2, 2, 16), 4, return_complex=True)
    with pytest.raises(ValueError, match="n_fft <= 10"):
        nbx.stft(x[:10], 16, center=False, return_complex=True)
    with pytest.raises(ValueError, match="fewer than the 8 samples"):
        nbx.stft(x[:8], 16, return_complex=True)
    with pytest.raises(TypeError, match="n_fft must be an int"):
        nbx.stft(x, 16.0, return_complex=True)
    from importlib.util import find_spec
    if find_spec("triton") is not None:
        with pytest.raises(ValueError, match="window is on"):
            nbx.stft(x, 16, window=nbx.hann_window(16, device="interp"), return_complex=True)


def test_istft_errors():
    x = nbx.tensor(np.random.default_rng(11).standard_normal(64).astype(np.float32))
    w = nbx.hann_window(16)
    S = nbx.stft(x, 16, 4, window=w, return_complex=True)
    with pytest.raises(TypeError, match="complex input"):
        nbx.istft(nbx.view_as_real(S), 16, 4, window=w)
    with pytest.raises(ValueError, match="window overlap add min"):
        nbx.istft(S, 16, 4, window=w, center=False)        # hann(16)[0] == 0 at sample 0
    with pytest.raises(ValueError, match="window overlap add min"):
        nbx.istft(S, 16, 4, window=nbx.zeros(16), length=10)
    with pytest.raises(ValueError, match="expected 16 frequencies"):
        nbx.istft(S, 16, 4, window=w, onesided=False)
    with pytest.raises(ValueError, match="expected 8 frequencies"):
        nbx.istft(S, 14, window=nbx.hann_window(14))
    with pytest.raises(ValueError, match="return_complex=True needs"):
        nbx.istft(S, 16, 4, window=w, return_complex=True)
    Sc = nbx.stft(x.to(nbx.complex64), 16, 4, window=w)
    with pytest.raises(TypeError, match="complex window"):
        nbx.istft(Sc, 16, 4, window=w.to(nbx.complex64))
    with pytest.raises(ValueError, match="hop_length <= win_length"):
        nbx.istft(S, 16, 17, window=w)
    with pytest.raises(ValueError, match="no frames"):
        nbx.istft(S.narrow(1, 0, 0), 16, 4, window=w)
    with pytest.raises(ValueError, match="dims|input"):
        nbx.istft(S[0], 16, 4, window=w)
    with pytest.raises(ValueError, match="length must be non-negative"):
        nbx.istft(S, 16, 4, window=w, length=-1)


# ------------------------------------------------------------------ mel bank and log-mel
@pytest.mark.parametrize("key", sorted(k for k in MEL.files if k.startswith("mel/")))
def test_mel_filters_match_librosa(key):
    sr, n_fft, n_mels = map(int, key.split("/")[1].split("_"))
    got = nbx.audio.mel_filters(sr, n_fft, n_mels)
    want = MEL[key]
    assert got.dtype is nbx.float32 and tuple(got.shape) == want.shape
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-9)
    assert str(MEL["librosa_version"])


def test_mel_filters_errors():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="n_mels must be a positive int"):
            nbx.audio.mel_filters(16000, 400, bad)


def _np_log_mel(audio, n_mels):
    """Whisper's log_mel_spectrogram in float64 NumPy with librosa's bank."""
    spec = _np_stft(audio, 400, 160, 400, _np_window("hann_window", 400, True), True,
                    "reflect", False, True)[..., :-1]
    mel = MEL[f"mel/16000_400_{n_mels}"].astype(np.float64) @ (np.abs(spec) ** 2)
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def _speechlike(n, seed):
    g = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    x = 0.3 * np.sin(2 * np.pi * 440 * t) * np.sin(2 * np.pi * 3 * t) + 0.05 * g.standard_normal(n)
    x[n // 4: 3 * n // 4] *= 1e-6     # a near-silent stretch reaches the max - 8 floor
    return x.astype(np.float32)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_against_numpy(device, n_mels):
    if device == "interp" and n_mels == 128:
        pytest.skip("interp runs one bank (a 400-point Bluestein FFT is slow there)")
    n = 1600 if device == "interp" else 16000
    x = _speechlike(n, n_mels)
    got = nbx.audio.log_mel_spectrogram(nbx.tensor(x, device=device), n_mels=n_mels)
    want = _np_log_mel(x.astype(np.float64), n_mels)[0]
    assert got.dtype is nbx.float32 and tuple(got.shape) == (n_mels, n // 160)
    assert want.min() == want.max() - 8.0 / 4.0      # the floor is active in this signal
    _close(got, want, 2e-5)


def test_log_mel_batch_padding_and_inputs(tmp_path):
    x = np.stack([_speechlike(4000, 1), _speechlike(4000, 2)])
    got = nbx.audio.log_mel_spectrogram(x, padding=480)     # a NumPy array, batched
    want = _np_log_mel(np.pad(x.astype(np.float64), ((0, 0), (0, 480))), 80)
    assert tuple(got.shape) == (2, 80, 28)
    _close(got, want, 2e-5)
    got64 = nbx.audio.log_mel_spectrogram(nbx.tensor(x[0].astype(np.float64)))
    assert got64.dtype is nbx.float64
    _close(got64, _np_log_mel(x[0].astype(np.float64), 80)[0], 1e-6)
    # from a 16 kHz mono WAV file: the same as its decoded samples
    p = tmp_path / "a.wav"
    pcm = np.round(x[0] * 32767).astype("<i2")
    _write_wave(p, 1, 2, 16000, pcm.tobytes())
    _close(nbx.audio.log_mel_spectrogram(str(p)),
           _np_log_mel(pcm.astype(np.float64) / 32768, 80)[0], 2e-5)
    _write_wave(p, 1, 2, 8000, pcm.tobytes())
    with pytest.raises(ValueError, match="8000 Hz with 1 channels"):
        nbx.audio.log_mel_spectrogram(p)
    with pytest.raises(TypeError, match="float32 or float64"):
        nbx.audio.log_mel_spectrogram(nbx.tensor(pcm.astype(np.int32)))
    with pytest.raises(ValueError, match="padding"):
        nbx.audio.log_mel_spectrogram(x[0], padding=-1)


def test_log_mel_30_seconds():
    x = _speechlike(480000, 3)      # Whisper's 30 s window: 3000 frames
    got = nbx.audio.log_mel_spectrogram(x, device="cpu")
    assert tuple(got.shape) == (80, 3000)
    _close(got, _np_log_mel(x.astype(np.float64), 80)[0], 2e-5)


# ------------------------------------------------------------------ WAV
def _write_wave(path, channels, width, rate, frames):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(frames)


def _riff(chunks):
    body = b"WAVE" + b"".join(cid + struct.pack("<I", len(d)) + d + b"\0" * (len(d) % 2)
                              for cid, d in chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _fmt(tag, channels, rate, bits, extensible_sub=None):
    block = channels * bits // 8
    b = struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)
    if extensible_sub is not None:
        # KSDATAFORMAT_SUBTYPE_*: the format tag, then a fixed GUID tail
        guid = struct.pack("<H", extensible_sub) + bytes.fromhex("000000001000800000aa00389b71")
        b += struct.pack("<HHI", 22, bits, 0) + guid
    return b


def test_load_pcm_wav(tmp_path):
    g = np.random.default_rng(12)
    n = 37
    for width in (1, 2, 3, 4):
        bits = 8 * width
        if width == 1:
            raw = g.integers(0, 256, (n, 2), dtype=np.uint8)
            want = (raw.astype(np.float64) - 128) / 128
            data = raw.tobytes()
        else:
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            v = g.integers(lo, hi, (n, 2), endpoint=True, dtype=np.int64)
            v[0] = (lo, hi)
            want = v / float(1 << (bits - 1))
            data = b"".join(int(s).to_bytes(width, "little", signed=True) for s in v.ravel())
        p = tmp_path / f"pcm{bits}.wav"
        _write_wave(p, 2, width, 22050, data)
        t, sr = nbx.audio.load_wav(p)
        assert sr == 22050 and t.dtype is nbx.float32 and tuple(t.shape) == (2, n)
        np.testing.assert_allclose(t.numpy(), want.T.astype(np.float32), rtol=0, atol=0)
        assert t.numpy().min() >= -1 and t.numpy().max() <= 1


def test_load_float_and_extensible_wav(tmp_path):
    g = np.random.default_rng(13)
    a = g.uniform(-1, 1, (29, 3))
    cases = [("f32", _fmt(3, 3, 48000, 32), a.astype("<f4").tobytes(), a.astype(np.float32)),
             ("f64", _fmt(3, 3, 48000, 64), a.astype("<f8").tobytes(), a.astype(np.float32)),
             ("ext_f32", _fmt(0xFFFE, 3, 48000, 32, 3), a.astype("<f4").tobytes(),
              a.astype(np.float32))]
    v = np.round(a * 8388607).astype(np.int64)
    b24 = b"".join(int(s).to_bytes(3, "little", signed=True) for s in v.ravel())
    cases.append(("ext_pcm24", _fmt(0xFFFE, 3, 48000, 24, 1), b24,
                  (v / float(1 << 23)).astype(np.float32)))
    for name, fmt, data, want in cases:
        p = tmp_path / f"{name}.wav"
        # an odd-sized LIST chunk before the data: its pad byte must be skipped
        p.write_bytes(_riff([(b"fmt ", fmt), (b"LIST", b"INFOabc"), (b"data", data)]))
        t, sr = nbx.audio.load_wav(str(p))
        assert sr == 48000 and tuple(t.shape) == (3, 29), name
        np.testing.assert_array_equal(t.numpy(), want.T, err_msg=name)


def test_hostile_wav_files(tmp_path):
    good = _riff([(b"fmt ", _fmt(1, 1, 16000, 16)), (b"data", bytes(range(200)))])
    fgood = _riff([(b"fmt ", _fmt(3, 1, 16000, 32)), (b"data", bytes(200))])

    def refused(data, match, name="bad.wav"):
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(WavFormatError, match=match):
            nbx.audio.load_wav(p)

    assert nbx.audio.load_wav(_write(tmp_path / "ok.wav", good))[0].shape == (1, 100)
    refused(good[:-10], "claims 200 bytes, but only 190")             # truncated data
    refused(fgood[:-1], "claims 200 bytes, but only 199")
    refused(good[:30], "claims 16 bytes|ends at byte")                 # cut inside fmt
    refused(good[:36], "without a data chunk")                          # no data chunk
    lying = bytearray(good)
    lying[40:44] = struct.pack("<I", 10 ** 9)                           # data size lies
    refused(bytes(lying), "claims 1000000000 bytes")
    refused(b"RIFX" + good[4:], "not a RIFF/WAVE")
    refused(b"", "not a RIFF/WAVE")
    refused(_riff([(b"data", bytes(4)), (b"fmt ", _fmt(1, 1, 16000, 16))]), "before a fmt")
    refused(_riff([(b"fmt ", _fmt(1, 0, 16000, 16)), (b"data", bytes(4))]), "0 channels")
    refused(_riff([(b"fmt ", _fmt(1, 1, 16000, 12)), (b"data", bytes(4))]), "12-bit")
    refused(_riff([(b"fmt ", _fmt(2, 1, 16000, 16)), (b"data", bytes(4))]), "format tag 0x2")
    refused(_riff([(b"fmt ", _fmt(3, 1, 16000, 16)), (b"data", bytes(4))]), "16-bit samples")
    refused(_riff([(b"fmt ", _fmt(1, 2, 16000, 16)), (b"data", bytes(6))]), "not whole frames")
    refused(_riff([(b"fmt ", _fmt(1, 1, 16000, 16)[:12]), (b"data", bytes(4))]), "fmt chunk has 12")
    bad_block = bytearray(_fmt(1, 2, 16000, 16))
    bad_block[12:14] = struct.pack("<H", 3)
    refused(_riff([(b"fmt ", bytes(bad_block)), (b"data", bytes(8))]), "block align 3")
    refused(_riff([(b"fmt ", _fmt(0xFFFE, 1, 16000, 16)), (b"data", bytes(4))]), "expected 40")
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    with pytest.raises(NotARegularFileError, match="FIFO"):
        nbx.audio.load_wav(fifo)
    with pytest.raises(NotARegularFileError, match="directory"):
        nbx.audio.load_wav(tmp_path)
    with pytest.raises(FileNotFoundError):
        nbx.audio.load_wav(tmp_path / "missing.wav")


def _write(p, data):
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("n_fft,hop", [(400, 160), (512, 128), (255, 100)])
def test_stft_whisper_framing_on_the_fast_kernels(device, n_fft, hop):
    # n_fft 400: the half-length rfft (200 points) by the one-launch Bluestein; 512: the
    # on-chip power of two; 255: odd, the complex transform. istft inverts each.
    g = np.random.default_rng(n_fft)
    x = (0.1 * g.standard_normal((2, 4000))).astype(np.float32)
    wnp = _np_window("hann_window", n_fft, True)
    w = nbx.tensor(wnp.astype(np.float32), device=device)
    t = nbx.tensor(x, device=device)
    got = nbx.stft(t, n_fft, hop, window=w, return_complex=True)
    want = _np_stft(x, n_fft, hop, n_fft, wnp, True, "reflect", False, True)
    _close(got, want, _tol(nbx.float32))
    back = nbx.istft(got, n_fft, hop, window=w, length=4000)
    _close(back, x.astype(np.float64), _tol(nbx.float32))
