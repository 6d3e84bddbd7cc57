"""The fbank front end against the mel scale it claims, and against torchaudio's Kaldi fbank
where torchaudio is installed."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from trainer.features import Fbank, FbankParams, mel_banks


def _inverse_mel(m: float) -> float:
    return 700.0 * (math.exp(m / 1127.0) - 1.0)


@pytest.mark.parametrize("bins", [64, 128])
def test_mel_banks_shape_peaks_and_nyquist(bins):
    p = FbankParams(num_mel_bins=bins)
    banks = mel_banks(p)
    assert banks.shape == (bins, p.fft_size // 2 + 1)
    assert torch.all(banks >= 0) and float(banks.max()) <= 1.0
    assert torch.all(banks[:, -1] == 0)
    spacing = p.sample_rate_hz / p.fft_size
    mel_low, mel_high = 1127 * math.log1p(p.low_freq_hz / 700), 1127 * math.log1p(p.sample_rate_hz / 2 / 700)
    delta = (mel_high - mel_low) / (bins + 1)
    empty = (banks.sum(1) == 0).nonzero().flatten().tolist()
    # Kaldi's narrowest low filters can fall between two FFT bins (one at 128 bins); never above 150 Hz
    assert len(empty) <= 1 and all(_inverse_mel(mel_low + (b + 1) * delta) < 150 for b in empty)
    centers = []
    for b in range(bins):
        if b in empty:
            continue
        center = _inverse_mel(mel_low + (b + 1) * delta)
        left, right = _inverse_mel(mel_low + b * delta), _inverse_mel(mel_low + (b + 2) * delta)
        peak = int(banks[b].argmax()) * spacing
        assert abs(peak - center) <= spacing / 2 + 1e-6 or (left < peak < right and abs(peak - center) <= spacing)
        nz = banks[b].nonzero().flatten() * spacing
        assert float(nz.min()) > left and float(nz.max()) < right  # support inside the triangle
        centers.append(center)
    assert centers == sorted(centers)


def test_pure_tone_lands_in_its_mel_bin():
    p = FbankParams(num_mel_bins=64, target_frames=100)
    fbank = Fbank(p)
    spacing = p.sample_rate_hz / p.fft_size
    banks = mel_banks(p)
    for k in (40, 96, 160):  # FFT bins: 1250, 3000, 5000 Hz
        freq = k * spacing
        t = torch.arange(p.sample_rate_hz) / p.sample_rate_hz
        wave = (0.5 * torch.sin(2 * math.pi * freq * t)).unsqueeze(0)
        out = fbank(wave)[0].mean(0)  # (bins,)
        expected = int(banks[:, k].argmax())
        assert int(out.argmax()) == expected
        far = [b for b in range(64) if abs(b - expected) > 4]
        assert float(out[expected] - out[far].max()) > 1.0  # more than e^9 more energy than far bins


def test_fbank_shape_and_padding_value():
    p = FbankParams()
    fbank = Fbank(p)
    g = torch.Generator().manual_seed(0)
    wave = torch.randn(2, 8000, generator=g) * 0.1  # 0.5 s: 48 frames
    n = 1 + (8000 - p.window_samples) // p.shift_samples  # the frames Kaldi computes (snip_edges)
    assert n == 48
    out = fbank(wave)
    assert out.shape == (2, p.target_frames, p.num_mel_bins)
    pad = (0 - p.norm_mean) / (2 * p.norm_std)
    assert torch.allclose(out[:, n:], torch.full_like(out[:, n:], pad))
    assert not torch.any(torch.isclose(out[:, :n], torch.tensor(pad)).all(-1))
    # longer input is cut to target_frames; the frames kept are the same ones
    short = Fbank(replace(p, target_frames=20))(wave)
    assert short.shape == (2, 20, p.num_mel_bins)
    assert torch.allclose(short, out[:, :20])
    assert fbank.input_samples() == (p.target_frames - 1) * p.shift_samples + p.window_samples
    assert 1 + (fbank.input_samples() - p.window_samples) // p.shift_samples == p.target_frames


def test_fbank_matches_torchaudio_kaldi():
    try:
        import torchaudio.compliance.kaldi
    except (ImportError, OSError, RuntimeError) as e:  # absent, or built for another torch (its extension fails to load)
        pytest.skip(
            f"torchaudio does not import ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "parity with torchaudio.compliance.kaldi.fbank not checked"
        )
    p = FbankParams()
    g = torch.Generator().manual_seed(1)
    t = torch.arange(3 * p.sample_rate_hz) / p.sample_rate_hz
    wave = (0.3 * torch.sin(2 * math.pi * 440 * t) + 0.05 * torch.randn(t.shape, generator=g) + 0.01).float()
    ours = Fbank(p)(wave.unsqueeze(0))[0]
    x = wave - wave.mean()  # EAT's loader
    ref = torchaudio.compliance.kaldi.fbank(
        x.unsqueeze(0),
        htk_compat=True,
        sample_frequency=16000,
        use_energy=False,
        window_type="hanning",
        num_mel_bins=128,
        dither=0.0,
        frame_shift=10,
    )
    ref = torch.nn.functional.pad(ref, (0, 0, 0, p.target_frames - ref.shape[0]))
    ref = (ref - p.norm_mean) / (p.norm_std * 2)
    assert ours.shape == ref.shape
    difference = float((ours - ref).abs().max())
    print(f"fbank vs torchaudio {torchaudio.__version__} kaldi.fbank: max |difference| {difference:.1e} (normalised features)")
    assert difference < 1e-3


def _plain_fbank(fbank: Fbank, wave: torch.Tensor) -> torch.Tensor:
    """Kaldi's steps one after another on every frame, as written before the padded FFT buffer."""
    p = fbank.params
    x = wave.float()
    if p.remove_mean:
        x = x - x.mean(dim=-1, keepdim=True)
    frames = x.unfold(-1, p.window_samples, p.shift_samples)
    frames = frames - frames.mean(dim=-1, keepdim=True)
    if p.preemphasis:
        emphasized = frames.clone()
        emphasized[..., 1:] -= p.preemphasis * frames[..., :-1]
        emphasized[..., 0] -= p.preemphasis * frames[..., 0]
        frames = emphasized
    spectrum = torch.view_as_real(torch.fft.rfft(frames * fbank.window, n=p.fft_size)).pow(2).sum(-1)
    out = torch.clamp(torch.matmul(spectrum, fbank.banks.T), min=torch.finfo(torch.float32).eps).log()
    missing = p.target_frames - out.shape[1]
    out = torch.nn.functional.pad(out, (0, 0, 0, missing)) if missing > 0 else out[:, : p.target_frames]
    return (out - p.norm_mean) / (p.norm_std * 2)


@pytest.mark.parametrize(
    "params",
    [
        FbankParams(num_mel_bins=64),
        FbankParams(),
        FbankParams(window="povey", preemphasis=0.0, remove_mean=False, num_mel_bins=80),
        FbankParams(frame_length_ms=32.0),
    ],
    ids=["small", "eat", "povey-no-preemphasis", "window-is-the-fft"],
)
def test_fbank_is_bit_for_bit_the_plain_formulation(params):
    """The padded-buffer FFT changes the speed, not one bit of the (eager) features training depends on."""
    fbank = Fbank(params)
    for samples, seed in ((fbank.input_samples(), 0), (3 * params.sample_rate_hz + 17, 1), (params.window_samples, 2)):
        wave = torch.randn(3, samples, generator=torch.Generator().manual_seed(seed)) * 0.3
        assert torch.equal(fbank(wave), _plain_fbank(fbank, wave)), samples


def test_fbank_compiles_as_one_graph():
    """``train.compile`` traces the fbank inside the encoder: no op in it may break the graph
    (an ``out=`` into a strided view did)."""
    explanation = torch._dynamo.explain(Fbank(FbankParams(target_frames=16)))(torch.randn(2, 4000))
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
