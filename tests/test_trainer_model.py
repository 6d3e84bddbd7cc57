"""The trainer's model side: losses, fbank front end, EAT weight loading, FineLAP, the loop.

Losses are checked against formulas written out by hand, the chunked frame loss against the
unchunked one (values and gradients), the fbank against the mel scale it claims (and against
torchaudio's Kaldi fbank where torchaudio is installed), EAT checkpoints in both public
namings against the module they were taken from, and the training loop end to end on CPU:
its outputs, a checkpoint round trip and a resume that continues exactly where it stopped.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.conftest import tiny_train_params
from trainer import checkpoint
from trainer.data.stream import Batch
from trainer.encoders import (
    EATEncoder,
    EncoderError,
    SmallEncoder,
    build_encoder,
    eat_state_dict,
    load_eat_weights,
    sincos_2d,
)
from trainer.features import Fbank, FbankParams, mel_banks
from trainer.heldout import auroc, recall_at_1
from trainer.losses import FrameSigmoidLoss, InfoNCEClipLoss, PriorLoss, SigmoidClipLoss
from trainer.model import FineLAP, build_model
from trainer.objective import Objective
from trainer.train import (
    compatible,
    config_of,
    lr_lambda,
    make_stream,
    optimizer_for,
    run,
)


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------- losses


def test_loss_init_values():
    for loss in (SigmoidClipLoss(), FrameSigmoidLoss()):
        assert loss.log_scale.exp().item() == pytest.approx(10.0)
        assert loss.bias.item() == -10.0
    assert InfoNCEClipLoss().log_scale.exp().item() == pytest.approx(10.0)


def test_sigmoid_clip_loss_matches_hand_computation():
    audio = unit(torch.tensor([[1.0, 0.2], [0.3, -1.0], [-0.6, 0.8]], dtype=torch.float64))
    text = unit(torch.tensor([[0.9, 0.1], [0.5, -0.7], [0.2, 1.0]], dtype=torch.float64))
    loss_fn = SigmoidClipLoss()
    out = loss_fn(audio, text)

    t, b, B = 10.0, -10.0, 3
    expected, d_bias = 0.0, 0.0
    for i in range(B):
        for j in range(B):
            cos = sum(audio[i, k].item() * text[j, k].item() for k in range(2))
            z = 1.0 if i == j else -1.0
            logit = t * cos + b
            expected += -math.log(1.0 / (1.0 + math.exp(-z * logit)))
            d_bias += -z / (1.0 + math.exp(z * logit))  # d/db of -log sigmoid(z * logit)
    assert out["clip"].item() == pytest.approx(expected / B, rel=1e-6)
    assert out["clip_t"].item() == pytest.approx(10.0) and out["clip_b"].item() == -10.0

    out["clip"].backward()
    assert loss_fn.log_scale.grad is not None and loss_fn.bias.grad is not None
    assert torch.isfinite(loss_fn.log_scale.grad) and loss_fn.log_scale.grad.item() != 0.0
    assert loss_fn.bias.grad.item() == pytest.approx(d_bias / B, rel=1e-5)


def test_infonce_clip_loss_matches_cross_entropy_reference():
    g = torch.Generator().manual_seed(3)
    audio = unit(torch.randn(4, 5, generator=g, dtype=torch.float64))
    text = unit(torch.randn(4, 5, generator=g, dtype=torch.float64))
    out = InfoNCEClipLoss()(audio, text)
    logits = 10.0 * audio @ text.T
    target = torch.arange(4)
    reference = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
    assert torch.allclose(out["clip"], reference, rtol=1e-6)
    # and by hand: mean of -log softmax on the diagonal, both directions
    by_hand = -(torch.log_softmax(logits, 1).diagonal().mean() + torch.log_softmax(logits, 0).diagonal().mean()) / 2
    assert torch.allclose(out["clip"], by_hand, rtol=1e-6)


def _frame_inputs(seed: int = 0, B: int = 5, N: int = 4, L: int = 7, d: int = 3):
    g = torch.Generator().manual_seed(seed)
    frames = unit(torch.randn(B, L, d, generator=g, dtype=torch.float64))
    phrases = unit(torch.randn(B, N, d, generator=g, dtype=torch.float64))
    labels = torch.rand(B, N, L, generator=g) < 0.4
    mask = torch.rand(B, N, generator=g) < 0.7
    mask[0, :] = True
    mask[1, -1] = False  # some invalid phrases for sure
    mask[3, :] = False  # a clip without frame labels
    return frames, phrases, labels, mask


def _frame_run(chunk: int, frames, phrases, labels, mask, scale=None, bias=None):
    loss_fn = FrameSigmoidLoss(chunk_clips=chunk).double()
    f = frames.clone().requires_grad_(True)
    p = phrases.clone().requires_grad_(True)
    s = bias_t = None
    if scale is not None:
        s = scale.clone().requires_grad_(True)
        bias_t = bias.clone().requires_grad_(True)
    out = loss_fn(f, p, labels, mask, s, bias_t)
    out["frame"].backward()
    return out, f.grad, p.grad, loss_fn, s, bias_t


def test_frame_loss_matches_formula_and_ignores_invalid_phrases():
    frames, phrases, labels, mask = _frame_inputs()
    out, _, p_grad, loss_fn, _, _ = _frame_run(0, frames, phrases, labels, mask)
    total, count = 0.0, 0
    for b in range(frames.shape[0]):
        for n in range(phrases.shape[1]):
            if not mask[b, n]:
                continue
            for l in range(frames.shape[1]):
                z = 1.0 if labels[b, n, l] else -1.0
                logit = 10.0 * float(frames[b, l] @ phrases[b, n]) - 10.0
                total += math.log1p(math.exp(-z * logit))
                count += 1
    assert out["frame"].item() == pytest.approx(total / count, rel=1e-6)  # t = exp(float32 log 10)
    assert out["frame_t"].item() == pytest.approx(10.0) and out["frame_b"].item() == -10.0
    assert loss_fn.log_scale.grad is not None and loss_fn.bias.grad is not None
    # invalid phrases get no gradient and do not change the loss
    assert torch.all(p_grad[~mask] == 0) and torch.any(p_grad[mask] != 0)
    moved = phrases.clone()
    moved[~mask] = unit(torch.ones_like(moved[~mask]))
    assert _frame_run(0, frames, moved, labels, mask)[0]["frame"].item() == pytest.approx(out["frame"].item(), rel=1e-12)


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_frame_loss_chunked_equals_unchunked(chunk):
    frames, phrases, labels, mask = _frame_inputs(seed=1)
    ref, rf, rp, rloss, _, _ = _frame_run(0, frames, phrases, labels, mask)
    out, f, p, loss, _, _ = _frame_run(chunk, frames, phrases, labels, mask)
    assert torch.allclose(out["frame"], ref["frame"], rtol=1e-12, atol=0)
    assert torch.allclose(f, rf, rtol=1e-10, atol=1e-14)
    assert torch.allclose(p, rp, rtol=1e-10, atol=1e-14)
    assert torch.allclose(loss.log_scale.grad, rloss.log_scale.grad, rtol=1e-10)
    assert torch.allclose(loss.bias.grad, rloss.bias.grad, rtol=1e-10)


@pytest.mark.parametrize("chunk", [0, 2])
def test_frame_loss_per_text_bias_gets_no_gradient(chunk):
    frames, phrases, labels, mask = _frame_inputs(seed=2)
    g = torch.Generator().manual_seed(9)
    scale = torch.rand(mask.shape, generator=g, dtype=torch.float64) * 5 + 5
    bias = -8 + torch.randn(mask.shape, generator=g, dtype=torch.float64)
    out, f, _, loss_fn, s, b = _frame_run(chunk, frames, phrases, labels, mask, scale, bias)
    assert b.grad is None  # only the prior loss trains the per-text bias
    assert s.grad is not None and torch.all(s.grad[~mask] == 0) and torch.any(s.grad[mask] != 0)
    assert loss_fn.log_scale.grad is None and loss_fn.bias.grad is None  # t', b' are replaced
    assert "frame_t" not in out and "frame_b" not in out
    ref = _frame_run(0, frames, phrases, labels, mask, scale, bias)
    assert torch.allclose(out["frame"], ref[0]["frame"], rtol=1e-12)
    assert torch.allclose(f, ref[1], rtol=1e-10, atol=1e-14) and torch.allclose(s.grad, ref[4].grad, rtol=1e-10, atol=1e-14)
    # the per-text scale and bias are really used: logit = s * cos + b
    sim = torch.einsum("bld,bnd->bnl", frames, phrases)
    z = labels.double() * 2 - 1
    w = mask.unsqueeze(-1).expand_as(labels).double()
    expected = -(F.logsigmoid(z * (scale.unsqueeze(-1) * sim + bias.unsqueeze(-1))) * w).sum() / w.sum()
    assert torch.allclose(out["frame"], expected, rtol=1e-12)


def test_prior_loss_targets_are_positive_frame_shares():
    L = 4
    phrases = [["dog", "cat", ""], ["dog", "car", "x"], ["bird", "dog", "cat"], ["", "", ""]]
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    has_frames = torch.tensor([True, True, True, False])
    labels = torch.zeros(4, 3, L, dtype=torch.bool)
    labels[0, 0, :2] = True  # dog: 2 frames
    labels[0, 1, :] = True  # cat: 4 frames
    labels[1, 0, 1:] = True  # dog: 3 frames
    labels[1, 2, :] = True  # masked: must not count
    labels[2, 1, 0] = True  # dog: 1 frame
    labels[2, 2, 3] = True  # cat: 1 frame
    bias = torch.tensor([[-1.0, -2.0, 5.0], [-3.0, -4.0, 5.0], [-5.0, -6.0, -7.0], [5.0, 5.0, 5.0]], requires_grad=True)
    out = PriorLoss()(phrases, labels, mask, bias, has_frames)

    frames_total = 3 * L  # three frame-labelled clips
    targets = {"bird": 0 / frames_total, "car": 0 / frames_total, "cat": 5 / frames_total, "dog": 6 / frames_total}
    logits = {"bird": -5.0, "car": -4.0, "cat": -2.0, "dog": -1.0}  # each phrase's first occurrence
    expected = 0.0
    for name, y in targets.items():
        x = logits[name]
        sig = 1 / (1 + math.exp(-x))
        expected += -(y * math.log(sig) + (1 - y) * math.log(1 - sig))
    assert out["prior"].item() == pytest.approx(expected / len(targets), rel=1e-6)
    out["prior"].backward()
    grad = bias.grad
    assert grad[0, 0] != 0 and grad[0, 1] != 0 and grad[1, 1] != 0 and grad[2, 0] != 0
    assert grad[1, 0] == 0 and grad[2, 1] == 0 and grad[2, 2] == 0  # repeats use the first occurrence
    assert torch.all(grad[~mask] == 0)

    empty = PriorLoss()(phrases, labels, torch.zeros_like(mask), bias, has_frames)
    assert empty["prior"].item() == 0.0


# --------------------------------------------------------------------------- fbank


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
    n = p.frames_for(8000)
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
    assert p.frames_for(fbank.input_samples()) == p.target_frames


def test_fbank_matches_torchaudio_kaldi():
    try:
        import torchaudio.compliance.kaldi
    except (ImportError, OSError, RuntimeError) as e:  # absent, or built for another torch (its extension fails to load)
        pytest.skip(f"torchaudio does not import ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                    "parity with torchaudio.compliance.kaldi.fbank not checked")
    p = FbankParams()
    g = torch.Generator().manual_seed(1)
    t = torch.arange(3 * p.sample_rate_hz) / p.sample_rate_hz
    wave = (0.3 * torch.sin(2 * math.pi * 440 * t) + 0.05 * torch.randn(t.shape, generator=g) + 0.01).float()
    ours = Fbank(p)(wave.unsqueeze(0))[0]
    x = wave - wave.mean()  # EAT's loader
    ref = torchaudio.compliance.kaldi.fbank(x.unsqueeze(0), htk_compat=True, sample_frequency=16000, use_energy=False,
                                            window_type="hanning", num_mel_bins=128, dither=0.0, frame_shift=10)
    ref = torch.nn.functional.pad(ref, (0, 0, 0, p.target_frames - ref.shape[0]))
    ref = (ref - p.norm_mean) / (p.norm_std * 2)
    assert ours.shape == ref.shape
    difference = float((ours - ref).abs().max())
    print(f"fbank vs torchaudio {torchaudio.__version__} kaldi.fbank: max |difference| {difference:.1e} (normalised features)")
    assert difference < 1e-3


# --------------------------------------------------------------------------- EAT weights and token layout


FAIRSEQ = (("patch_embed.", "modality_encoders.IMAGE.local_encoder.proj."), ("cls_token", "modality_encoders.IMAGE.extra_tokens"),
           ("pre_norm.", "modality_encoders.IMAGE.context_encoder.norm."), ("blocks.", "blocks."))
HUGGING_FACE = (("patch_embed.", "model.local_encoder.proj."), ("cls_token", "model.extra_tokens"),
                ("pre_norm.", "model.pre_norm."), ("blocks.", "model.blocks."))


def _rename(state: dict, names) -> dict:
    out = {}
    for key, value in state.items():
        for ours, theirs in names:
            if key.startswith(ours):
                out[theirs + key[len(ours):]] = value.clone()
                break
        else:
            raise AssertionError(f"unmapped key {key}")
    return out


def _small_eat(seed: int, dim: int = 64) -> EATEncoder:
    torch.manual_seed(seed)
    enc = EATEncoder(dim=dim, depth=2, heads=2).eval()
    with torch.no_grad():
        enc.cls_token.normal_()  # zeros at init: make it distinguishable
    return enc


@pytest.fixture(scope="module")
def eat_wave():
    g = torch.Generator().manual_seed(4)
    return torch.randn(2, Fbank(FbankParams()).input_samples(), generator=g) * 0.1


def test_eat_fairseq_checkpoint_loads(tmp_path, eat_wave):
    source = _small_eat(0)
    raw = _rename(source.state_dict(), FAIRSEQ)
    junk = {"_ema.blocks.0.attn.qkv.weight": torch.randn(3, 3), "modality_encoders.IMAGE.decoder.blocks.0.0.weight": torch.randn(4),
            "modality_encoders.IMAGE.fixed_positional_encoder.positions": torch.randn(1, 512, 64), "_ema": torch.zeros(1),
            "recon_proj.weight": torch.randn(5, 64), "step": 7}
    path = tmp_path / "EAT-base_epoch30_pt.pt"
    torch.save({"model": raw | junk, "cfg": {"model": {"embed_dim": 64}}}, path)

    target = _small_eat(1)
    with torch.no_grad():
        before = target(eat_wave)
        expected = source(eat_wave)
    assert not torch.allclose(before[0], expected[0])
    report = load_eat_weights(target, str(path))
    assert report == {"loaded": len(source.state_dict()), "missing": []}
    assert set(eat_state_dict(torch.load(path, weights_only=True))) == set(source.state_dict())
    for k, v in source.state_dict().items():
        assert torch.equal(target.state_dict()[k], v), k
    with torch.no_grad():
        got = target(eat_wave)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_eat_hugging_face_safetensors_loads(tmp_path, eat_wave):
    from safetensors.torch import save_file

    source = _small_eat(2)
    raw = _rename(source.state_dict(), HUGGING_FACE)
    raw["model.decoder.weight"] = torch.randn(3)  # not an encoder weight
    folder = tmp_path / "EAT-base_hf"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in raw.items()}, str(folder / "model.safetensors"))
    for where in (folder / "model.safetensors", folder):
        target = _small_eat(3)
        assert load_eat_weights(target, str(where))["missing"] == []
        with torch.no_grad():
            got, expected = target(eat_wave), source(eat_wave)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_eat_checkpoint_errors(tmp_path):
    wrong = tmp_path / "wrong.pt"
    torch.save({"model": _rename(_small_eat(0, dim=32).state_dict(), FAIRSEQ)}, wrong)
    with pytest.raises(EncoderError, match="does not fit"):
        load_eat_weights(_small_eat(1), str(wrong))
    unrelated = tmp_path / "unrelated.pt"
    torch.save({"model": {"encoder.weight": torch.zeros(2)}}, unrelated)
    with pytest.raises(EncoderError):
        load_eat_weights(_small_eat(1), str(unrelated))
    with pytest.raises(EncoderError, match="not found"):
        load_eat_weights(_small_eat(1), str(tmp_path / "missing.pt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(EncoderError):
        load_eat_weights(_small_eat(1), str(tmp_path / "empty"))


def test_eat_token_layout(eat_wave):
    enc = _small_eat(5)
    with torch.no_grad():
        cls, dense = enc(eat_wave)
    assert cls.shape == (2, 64)
    assert dense.shape == (2, 64, 8, 64)  # 1024 frames / 16, 128 bins / 16
    assert enc.num_frames == 64 and enc.frame_spans_s().shape == (64, 2)
    assert enc.positions.shape == (1, 64 * 8, 64)  # no row for CLS: it has no position
    assert torch.equal(enc.positions[0], sincos_2d(64, 8, 64))
    table = enc.positions[0].reshape(64, 8, 64)  # time-major rows
    half = 32
    assert torch.equal(table[:, :1, half:].expand(-1, 8, -1), table[:, :, half:])  # time channels: same along frequency
    assert torch.equal(table[:1, :, :half].expand(64, -1, -1), table[:, :, :half])  # frequency channels: same along time
    assert torch.allclose(table[0, 0], torch.cat([torch.zeros(16), torch.ones(16), torch.zeros(16), torch.ones(16)]))
    # without blocks: CLS comes out as pre_norm(cls_token) (no position), the grid time-major with its positions
    torch.manual_seed(6)
    bare = EATEncoder(dim=64, depth=0, heads=2).eval()
    with torch.no_grad():
        bare.cls_token.normal_()
        cls, dense = bare(eat_wave)
        patches = bare.patch_embed(bare.fbank(eat_wave).unsqueeze(1))  # (B, D, 64, 8)
        grid = bare.pre_norm(patches.permute(0, 2, 3, 1) + bare.positions[0].reshape(64, 8, 64))
    assert torch.allclose(cls, bare.pre_norm(bare.cls_token[0]).expand(2, -1), atol=1e-6)
    assert torch.allclose(dense, grid, atol=1e-5)
    spans = enc.frame_spans_s()
    assert spans[0, 0] == 0.0 and spans[1, 0] == pytest.approx(16 * 0.01)


# --------------------------------------------------------------------------- model


class StubText(nn.Module):
    """A tiny text tower: a hashed bag of characters -> (n, width)."""

    frozen = False

    def __init__(self, width: int = 24):
        super().__init__()
        self.width = width
        self.embed = nn.EmbeddingBag(128, width, mode="mean")

    def forward(self, texts: list[str]) -> torch.Tensor:
        ids = [torch.tensor([ord(c) % 128 for c in (t or " ")]) for t in texts]
        offsets = torch.tensor([0] + [len(i) for i in ids[:-1]]).cumsum(0)
        return self.embed(torch.cat(ids), offsets)


def _tiny_small_encoder() -> SmallEncoder:
    return SmallEncoder(width=32, fbank=FbankParams(num_mel_bins=64, target_frames=128))


@pytest.mark.parametrize("adapter", ["transformer", "bigru", "linear", "shared"])
def test_finelap_shapes_and_unit_norms(adapter):
    torch.manual_seed(0)
    model = FineLAP(_tiny_small_encoder(), StubText(), dim=16, adapter=adapter, adapter_ffn=32, adapter_heads=4).eval()
    assert (model.local is None) == (adapter == "shared")
    B, N = 3, 4
    wave = torch.randn(B, model.encoder.fbank.input_samples()) * 0.1
    phrases = [["dog bark", "cat", "", "rain"], ["cat", "dog bark", "x", ""], ["rain", "", "", "siren"]]
    e = model(wave, ["a dog", "a cat", "rain"], phrases)
    L = model.encoder.num_frames
    assert L == 16
    assert e.clip.shape == (B, 16) and e.frames.shape == (B, L, 16)
    assert e.caption.shape == (B, 16) and e.phrases.shape == (B, N, 16)
    for x in (e.clip, e.frames, e.caption, e.phrases):
        assert torch.allclose(x.norm(dim=-1), torch.ones(x.shape[:-1]), atol=1e-5)
    assert e.phrase_scale is None and e.phrase_bias is None
    # one string, one embedding, wherever it appears
    assert torch.allclose(e.phrases[0, 0], e.phrases[1, 1]) and torch.allclose(e.phrases[0, 3], e.phrases[2, 0])
    assert not torch.allclose(e.phrases[0, 0], e.phrases[0, 1])
    if adapter == "shared":
        with torch.no_grad():
            _, dense = model.encoder(wave)
            expected = F.normalize(model.global_proj(dense.mean(dim=2)), dim=-1)
        assert torch.allclose(e.frames, expected, atol=1e-6)


def test_finelap_per_text_logits():
    torch.manual_seed(0)
    model = FineLAP(_tiny_small_encoder(), StubText(), dim=16, adapter="linear", per_text_logits=True).eval()
    wave = torch.randn(2, model.encoder.fbank.input_samples()) * 0.1
    e = model(wave, ["a", "b"], [["dog", "cat", ""], ["rain", "dog", "siren"]])
    assert e.phrase_scale.shape == (2, 3) and e.phrase_bias.shape == (2, 3)
    assert torch.all(e.phrase_scale > 0)
    assert torch.allclose(e.phrase_scale, torch.full((2, 3), 10.0)) and torch.allclose(e.phrase_bias, torch.full((2, 3), -8.0))
    # they are functions of the text: after a change of the MLP's last layer, different phrases differ
    with torch.no_grad():
        model.per_text.scale[-1].weight.normal_()
        model.per_text.bias[-1].weight.normal_()
    e = model(wave, ["a", "b"], [["dog", "cat", ""], ["rain", "dog", "siren"]])
    assert torch.all(e.phrase_scale > 0)
    assert torch.allclose(e.phrase_bias[0, 0], e.phrase_bias[1, 1]) and not torch.allclose(e.phrase_bias[0, 0], e.phrase_bias[0, 1])


# --------------------------------------------------------------------------- the training loop


@pytest.fixture(scope="module")
def smoke_run(shard_folder, tmp_path_factory):
    params, folder = shard_folder
    out = tmp_path_factory.mktemp("smoke")
    base = tiny_train_params(params, folder, out)
    p = replace(base, train=replace(base.train, optim=replace(base.train.optim, max_steps=3)))
    summary = run(p)
    return p, out, summary


def test_train_smoke_run_writes_outputs(smoke_run):
    p, out, summary = smoke_run
    for name in ("checkpoints/latest.pt", "checkpoints/best.pt", "train_log.csv", "valid_log.csv", "metrics.json", "curves.png",
                 "config.json", "skipped.csv"):
        assert (out / name).is_file(), name
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    train_rows = read_csv(out / "train_log.csv")
    assert [int(r["step"]) for r in train_rows] == [1, 2, 3]
    for r in train_rows:
        assert math.isfinite(float(r["loss"])) and math.isfinite(float(r["clip"])) and math.isfinite(float(r["frame"]))
        assert float(r["lr"]) >= 0
    valid_rows = read_csv(out / "valid_log.csv")
    assert int(valid_rows[0]["epoch"]) == 0 and int(valid_rows[0]["step"]) == 0  # the untrained model
    assert int(valid_rows[-1]["step"]) == 3
    for r in valid_rows:
        assert math.isfinite(float(r["valid_loss"]))
        assert 0 <= float(r["frame_auroc"]) <= 1 and 0 <= float(r["a2t_r1"]) <= 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == summary["steps"] == 3
    assert metrics["untrained"]["epoch"] == 0
    assert metrics["best"]["valid_loss"] == pytest.approx(min(float(r["valid_loss"]) for r in valid_rows[1:]), rel=1e-5)
    latest = torch.load(out / "checkpoints" / "latest.pt", weights_only=True)
    assert latest["step"] == 3 and latest["config"] == config_of(p, latest["config"]["data_fingerprint"])
    assert len(latest["config"]["data_fingerprint"]) == 16
    assert not any(k.startswith("model.text.model.") for k in latest["model"])  # the frozen text tower is not saved


def _fake_batch(model, B: int = 2, N: int = 3, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    L = model.encoder.num_frames
    labels = torch.rand(B, N, L, generator=g) < 0.3
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 2] = False
    return Batch(ids=[str(i) for i in range(B)], wave=torch.randn(B, 16000, generator=g) * 0.1,
                 captions=["a dog barks", "rain falls"][:B], phrases=[["dog bark", "rain", "car"], ["rain", "dog bark", ""]][:B],
                 labels=labels, mask=mask, has_frames=torch.ones(B, dtype=torch.bool), skips=[])


def test_checkpoint_round_trip(smoke_run, tmp_path):
    p, _, _ = smoke_run
    t = p.train
    torch.manual_seed(0)
    first = Objective(build_model(t.model), t.loss)
    optimizer = optimizer_for(first, t.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(2, 10))
    batch = _fake_batch(first.model)
    for _ in range(2):  # move weights, batch-norm statistics, optimizer moments
        first(batch)["loss"].backward()
        optimizer.step(), scheduler.step(), optimizer.zero_grad()
    path = tmp_path / "ck" / "latest.pt"
    checkpoint.save(path, first, optimizer, scheduler, step=2, epoch=1, batches_in_epoch=5, config={"train": {"x": 1}}, metrics={"best": {"a": 1}})
    rng = torch.get_rng_state()
    torch.rand(10)  # move the generator on

    torch.manual_seed(1)
    second = Objective(build_model(t.model), t.loss)
    optimizer2 = optimizer_for(second, t.optim)
    scheduler2 = torch.optim.lr_scheduler.LambdaLR(optimizer2, lr_lambda(2, 10))
    state = checkpoint.load(path, second, optimizer2, scheduler2)
    assert (state["step"], state["epoch"], state["batches_in_epoch"], state["config"], state["metrics"]) == (2, 1, 5, {"train": {"x": 1}}, {"best": {"a": 1}})
    assert torch.equal(torch.get_rng_state(), rng)
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert scheduler2.last_epoch == scheduler.last_epoch == 2
    assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    sa, sb = optimizer.state_dict()["state"], optimizer2.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa[k][name], sb[k][name])
    first.eval(), second.eval()
    with torch.no_grad():
        ta, tb = first(batch), second(batch)
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k
    # a model of another shape does not load
    third = Objective(build_model(replace(t.model, embed_dim=16)), t.loss)
    with pytest.raises((ValueError, RuntimeError)):
        checkpoint.load(path, third)


def _train_rows(out) -> dict[int, dict]:
    return {int(r["step"]): r for r in read_csv(out / "train_log.csv")}


def test_resume_continues_exactly(shard_folder, tmp_path, capsys):
    params, folder = shard_folder

    def config(out, max_steps, **changes):
        base = tiny_train_params(params, folder, out, checkpoint_every_steps=2, log_every_steps=1, **changes)
        return replace(base, train=replace(base.train, optim=replace(base.train.optim, max_steps=max_steps)))

    # the train split gives at least 4 steps of batch 4 in one epoch
    probe = config(tmp_path / "probe", 4)
    stream = make_stream(probe, build_encoder("small"), probe.train.data.sources, shuffle=True)
    assert stream.rows_per_worker(1) // 4 >= 4

    a_out, b_out = tmp_path / "a", tmp_path / "b"
    run(config(a_out, 4))
    a_rows = _train_rows(a_out)
    assert sorted(a_rows) == [1, 2, 3, 4] and all(int(r["epoch"]) == 0 for r in a_rows.values())

    run(config(b_out, 2))
    stopped = torch.load(b_out / "checkpoints" / "latest.pt", weights_only=True)
    assert stopped["step"] == 2
    assert sorted(_train_rows(b_out)) == [1, 2]
    capsys.readouterr()
    summary = run(config(b_out, 4))
    assert "resuming from" in capsys.readouterr().out
    assert summary["steps"] == 4
    b_rows = _train_rows(b_out)
    assert sorted(b_rows) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        ra, rb = a_rows[step], b_rows[step]
        assert int(ra["epoch"]) == int(rb["epoch"]), step
        for key in ("loss", "clip", "frame", "lr", "clip_t", "clip_b", "frame_t", "frame_b"):
            assert float(rb[key]) == pytest.approx(float(ra[key]), abs=1e-5), (step, key)
    a_state = torch.load(a_out / "checkpoints" / "latest.pt", weights_only=True)
    b_state = torch.load(b_out / "checkpoints" / "latest.pt", weights_only=True)
    for k, v in a_state["model"].items():
        assert torch.allclose(v.float(), b_state["model"][k].float(), atol=1e-5), k

    # another setting: no resume, a fresh start (and a fresh log)
    capsys.readouterr()
    summary = run(config(b_out, 1, model=replace(params.train.model, encoder="small", embed_dim=16, adapter_heads=4,
                                                         adapter_ffn=64, freeze_text=True)))
    assert "not resuming" in capsys.readouterr().out
    assert summary["steps"] == 1
    assert sorted(_train_rows(b_out)) == [1]
    assert torch.load(b_out / "checkpoints" / "latest.pt", weights_only=True)["config"]["train"]["model"]["embed_dim"] == 16


# --------------------------------------------------------------------------- schedule and config checks


def test_lr_lambda_warmup_then_cosine():
    f = lr_lambda(4, 12)
    assert [f(s) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f(4) == pytest.approx(1.0)
    assert f(8) == pytest.approx(0.5)
    assert f(6) == pytest.approx(0.5 * (1 + math.cos(math.pi * 2 / 8)))
    assert f(12) == pytest.approx(0.0, abs=1e-12) and f(50) == pytest.approx(0.0, abs=1e-12)
    after = [f(s) for s in range(4, 13)]
    assert all(x >= y for x, y in itertools.pairwise(after))
    # through the scheduler: the lr the optimizer sees
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, f)
    seen = []
    for _ in range(12):
        seen.append(opt.param_groups[0]["lr"])
        opt.step(), sched.step()
    assert seen[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0]) and seen[8] == pytest.approx(1.0)


def test_compatible_ignores_resumable_keys_only():
    from pipeline.params import Params

    base = Params()
    t = base.train
    same = replace(base, train=replace(t, out_dir="elsewhere", resume=False, log_every_steps=3, checkpoint_every_steps=7, threads=2,
                                       device="cpu", compile=True, data=replace(t.data, num_workers=9),
                                       optim=replace(t.optim, epochs=99, max_steps=5)))
    assert compatible(config_of(base), config_of(same)) == []
    changed = replace(base, seed=base.seed + 1,
                      train=replace(t, model=replace(t.model, embed_dim=16), optim=replace(t.optim, lr=1.0),
                                    data=replace(t.data, batch_size=3)))
    assert compatible(config_of(base), config_of(changed)) == ["seed", "train.data.batch_size", "train.model.embed_dim", "train.optim.lr"]
    assert compatible(config_of(base), config_of(replace(base, train=replace(t, loss=replace(t.loss, frame_chunk_clips=2))))) == [
        "train.loss.frame_chunk_clips"]


# --------------------------------------------------------------------------- held-out scores


def test_auroc_equals_pairwise_count_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(5):
        scores = rng.integers(0, 6, size=60).astype(float)  # many ties
        labels = rng.random(60) < 0.4
        pos, neg = scores[labels], scores[~labels]
        brute = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
        assert auroc(scores, labels) == pytest.approx(brute, abs=1e-12)
    assert auroc(np.array([0.1, 0.9, 0.5]), np.array([False, True, False])) == 1.0
    assert math.isnan(auroc(np.array([0.1, 0.2]), np.array([True, True])))


def test_recall_at_1_on_crafted_matrix():
    sim = np.array([
        [0.9, 0.1, 0.2, 0.0],  # own column best: hit
        [0.8, 0.5, 0.1, 0.0],  # another column best: miss
        [0.3, 0.7, 0.7, 0.1],  # tie with another column: miss
        [0.0, 0.2, 0.1, 0.4],  # hit
    ])
    assert recall_at_1(sim) == 0.5
    assert recall_at_1(np.eye(5)) == 1.0
    assert recall_at_1(np.ones((3, 3))) == 0.0
