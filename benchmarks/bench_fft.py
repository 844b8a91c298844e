"""nbx.fft against torch.fft (cuFFT) in the same run, on cuda (torch skipped where absent).

    python benchmarks/bench_fft.py [--device cuda] [--reps 20]

Batched complex64 1-D FFTs of 2**10 .. 2**20 points (2**24 points per call), 2-D 1024x1024,
rfft, and non-power-of-two lengths (Bluestein); then the STFT of 30 s of 16 kHz audio
(Whisper's n_fft 400, hop 160, periodic Hann) against torch.stft, and Whisper's whole log-mel
front end. Prints ms per call and the ratio to torch.
"""
import argparse
import time

import numpy as np

import nbxtensor as nbx


def _time(fn, sync, reps):
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
    sync = nbx.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    tsync = torch.cuda.synchronize if torch is not None else (lambda: None)
    g = np.random.default_rng(0)
    cases = [("fft", (2 ** 24 // n, n), -1) for n in (2 ** k for k in range(10, 21))]
    cases += [("fft2", (4, 1024, 1024), None), ("rfft", (2 ** 14, 1024), -1)]
    cases += [("fft", (2 ** 24 // n // 2, n), -1) for n in (1000, 1009, 4095, 48000)]
    for op, shape, _ in cases:
        real = op == "rfft"
        a = g.standard_normal(shape).astype(np.float32)
        if not real:
            a = (a + 1j * g.standard_normal(shape)).astype(np.complex64)
        x = nbx.tensor(a, device=args.device)
        f = getattr(nbx.fft, op)
        ms = _time(lambda: f(x), sync, args.reps)
        line = f"{op:5s} {str(shape):22s} nbx {ms:8.3f} ms"
        if torch is not None and torch.cuda.is_available():
            tx = torch.from_numpy(a).cuda()
            tf = getattr(torch.fft, op)
            tms = _time(lambda: tf(tx), tsync, args.reps)
            line += f"  torch {tms:8.3f} ms  ratio {tms / ms:5.2f}x"
        print(line, flush=True)
    _stft_rows(args, torch, sync, tsync, g)


def _stft_rows(args, torch, sync, tsync, g):
    """STFT of 30 s of 16 kHz audio, one signal and a batch of 8; Whisper's log-mel."""
    for batch in (1, 8):
        a = (0.1 * g.standard_normal((batch, 480000))).astype(np.float32)
        x = nbx.tensor(a, device=args.device)
        w = nbx.hann_window(400, device=args.device)
        ms = _time(lambda: nbx.stft(x, 400, 160, window=w, return_complex=True), sync,
                   args.reps)
        line = f"stft  {str(a.shape):22s} nbx {ms:8.3f} ms"
        if torch is not None and torch.cuda.is_available():
            tx, tw = torch.from_numpy(a).cuda(), torch.hann_window(400, device="cuda")
            tms = _time(lambda: torch.stft(tx, 400, 160, window=tw, return_complex=True),
                        tsync, args.reps)
            line += f"  torch {tms:8.3f} ms  ratio {tms / ms:5.2f}x"
        print(line, flush=True)
    a = (0.1 * g.standard_normal(480000)).astype(np.float32)
    x = nbx.tensor(a, device=args.device)
    ms = _time(lambda: nbx.audio.log_mel_spectrogram(x), sync, args.reps)
    line = f"logmel {str(a.shape):21s} nbx {ms:8.3f} ms"
    if torch is not None and torch.cuda.is_available():
        tx, tw = torch.from_numpy(a).cuda(), torch.hann_window(400, device="cuda")
        tf = torch.from_numpy(nbx.audio.mel_filters(16000, 400, 80).numpy()).cuda()

        def whisper():   # openai-whisper's log_mel_spectrogram body
            s = torch.stft(tx, 400, 160, window=tw, return_complex=True)
            m = tf @ (s[..., :-1].abs() ** 2)
            lg = torch.clamp(m, min=1e-10).log10()
            return (torch.maximum(lg, lg.max() - 8.0) + 4.0) / 4.0
        tms = _time(whisper, tsync, args.reps)
        line += f"  torch {tms:8.3f} ms  ratio {tms / ms:5.2f}x"
    print(line, flush=True)


if __name__ == "__main__":
    main()
