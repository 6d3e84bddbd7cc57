"""Kaldi-style log-mel filterbank features in plain torch (no torchaudio).

Input: waveforms ``(B, samples)`` float in [-1, 1] at ``sample_rate_hz``. Output: normalised
log-mel frames ``(B, target_frames, num_mel_bins)``, padded with zeros or cut to
``target_frames``. The computation follows Kaldi's ``compute-fbank`` as torchaudio's
``compliance.kaldi.fbank`` implements it (snip_edges, DC removal per frame, pre-emphasis 0.97,
povey or hanning window, power spectrum, HTK mel scale ``1127 ln(1 + f/700)``, log with a
float32-epsilon floor), so checkpoints trained on those features (EAT, AST, BEATs) see the same
input. EAT's front end: 128 bins, 25 ms window, 10 ms shift, hanning, no dither, waveform mean
removed, 1024 frames, normalised as ``(fbank + 4.268) / (4.569 * 2)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn


@dataclass(frozen=True)
class FbankParams:
    sample_rate_hz: int = 16000
    num_mel_bins: int = 128
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    window: Literal["hanning", "povey", "hamming"] = "hanning"
    preemphasis: float = 0.97
    low_freq_hz: float = 20.0
    high_freq_hz: float = 0.0  # <= 0: offset from the Nyquist frequency (Kaldi's convention)
    target_frames: int = 1024
    norm_mean: float = -4.268  # EAT / AudioSet statistics
    norm_std: float = 4.569
    remove_mean: bool = True  # subtract the waveform's mean before framing (EAT)

    @property
    def window_samples(self) -> int:
        return int(self.sample_rate_hz * self.frame_length_ms * 0.001)

    @property
    def shift_samples(self) -> int:
        return int(self.sample_rate_hz * self.frame_shift_ms * 0.001)

    @property
    def fft_size(self) -> int:
        return 1 << (self.window_samples - 1).bit_length()

    def frame_span_s(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end time in seconds of fbank frames ``index`` (window extent)."""
        start = index.double() * self.shift_samples / self.sample_rate_hz
        return start, start + self.window_samples / self.sample_rate_hz


def _mel(f: torch.Tensor) -> torch.Tensor:
    return 1127.0 * torch.log1p(f / 700.0)


def mel_banks(p: FbankParams) -> torch.Tensor:
    """Triangular HTK-mel filters ``(num_mel_bins, fft_size // 2 + 1)``; the Nyquist column is zero."""
    n_fft_bins = p.fft_size // 2
    nyquist = 0.5 * p.sample_rate_hz
    high = p.high_freq_hz if p.high_freq_hz > 0 else nyquist + p.high_freq_hz
    if not 0 <= p.low_freq_hz < high <= nyquist:
        raise ValueError(f"fbank: need 0 <= low_freq_hz < high_freq_hz <= {nyquist} Hz, got {p.low_freq_hz} and {high}")
    mel_low, mel_high = _mel(torch.tensor(p.low_freq_hz, dtype=torch.float64)), _mel(torch.tensor(high, dtype=torch.float64))
    delta = (mel_high - mel_low) / (p.num_mel_bins + 1)
    b = torch.arange(p.num_mel_bins, dtype=torch.float64).unsqueeze(1)
    left, center, right = mel_low + b * delta, mel_low + (b + 1) * delta, mel_low + (b + 2) * delta
    mel = _mel(p.sample_rate_hz / p.fft_size * torch.arange(n_fft_bins, dtype=torch.float64)).unsqueeze(0)
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    banks = torch.clamp(torch.minimum(up, down), min=0.0)
    return torch.nn.functional.pad(banks, (0, 1)).float()


def _window(p: FbankParams) -> torch.Tensor:
    n = p.window_samples
    if p.window == "hanning":
        return torch.hann_window(n, periodic=False, dtype=torch.float64).float()
    if p.window == "hamming":
        return torch.hamming_window(n, periodic=False, alpha=0.54, beta=0.46, dtype=torch.float64).float()
    return torch.hann_window(n, periodic=False, dtype=torch.float64).pow(0.85).float()


class Fbank(nn.Module):
    """``(B, samples)`` -> normalised log-mel ``(B, target_frames, num_mel_bins)``; no parameters."""

    def __init__(self, params: FbankParams):
        super().__init__()
        self.params = params
        self.register_buffer("banks", mel_banks(params), persistent=False)
        self.register_buffer("window", _window(params), persistent=False)

    @torch.no_grad()
    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        p = self.params
        x = wave.float()
        if p.remove_mean:
            x = x - x.mean(dim=-1, keepdim=True)
        frames = x.unfold(-1, p.window_samples, p.shift_samples)  # (B, T, W)
        frames = frames - frames.mean(dim=-1, keepdim=True)
        # each frame goes once into its zero-padded FFT buffer: torch's rfft of a padded, contiguous
        # input is 5x faster than its own padding (rfft(frames, n=fft_size)), and the arithmetic per
        # sample is the same, so eager features are bit for bit what they were (plain assignments,
        # not out= into a strided view, which torch.compile would break its graph at)
        w = p.window_samples
        padded = frames.new_zeros(*frames.shape[:-1], p.fft_size)
        if p.preemphasis:
            padded[..., 1:w] = frames[..., 1:] - p.preemphasis * frames[..., :-1]
            padded[..., :1] = frames[..., :1] - p.preemphasis * frames[..., :1]
        else:
            padded[..., :w] = frames
        padded[..., :w] *= self.window
        spectrum = torch.fft.rfft(padded)
        spectrum = spectrum.real.square() + spectrum.imag.square()  # power, (B, T, fft/2 + 1)
        fbank = torch.matmul(spectrum, self.banks.T)
        fbank = torch.clamp(fbank, min=torch.finfo(torch.float32).eps).log()
        missing = p.target_frames - fbank.shape[1]
        fbank = torch.nn.functional.pad(fbank, (0, 0, 0, missing)) if missing > 0 else fbank[:, : p.target_frames]
        return (fbank - p.norm_mean) / (p.norm_std * 2)

    def input_samples(self) -> int:
        """Samples whose frames fill ``target_frames`` exactly."""
        p = self.params
        return (p.target_frames - 1) * p.shift_samples + p.window_samples
