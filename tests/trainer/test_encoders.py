"""EAT weight loading (the fairseq and Hugging Face namings, against the module they were taken
from, and the errors), EAT's token layout, and the small encoder's clip pooling over the columns
that hold audio."""

from __future__ import annotations

import pytest
import torch

from trainer.encoders import (
    EATEncoder,
    EncoderError,
    SmallEncoder,
    eat_state_dict,
    fit_eat_weights,
    read_eat_checkpoint,
    sincos_2d,
)
from trainer.features import Fbank, FbankParams


def load_eat_weights(encoder: EATEncoder, path: str) -> dict:
    """Read the EAT checkpoint at ``path`` and fit it into ``encoder``, as ``build_encoder`` does for eat-base."""
    source, state = read_eat_checkpoint(path)
    return fit_eat_weights(encoder, state, source)


FAIRSEQ = (
    ("patch_embed.", "modality_encoders.IMAGE.local_encoder.proj."),
    ("cls_token", "modality_encoders.IMAGE.extra_tokens"),
    ("pre_norm.", "modality_encoders.IMAGE.context_encoder.norm."),
    ("blocks.", "blocks."),
)
HUGGING_FACE = (
    ("patch_embed.", "model.local_encoder.proj."),
    ("cls_token", "model.extra_tokens"),
    ("pre_norm.", "model.pre_norm."),
    ("blocks.", "model.blocks."),
)


def _rename(state: dict, names) -> dict:
    out = {}
    for key, value in state.items():
        for ours, theirs in names:
            if key.startswith(ours):
                out[theirs + key[len(ours) :]] = value.clone()
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
    junk = {
        "_ema.blocks.0.attn.qkv.weight": torch.randn(3, 3),
        "modality_encoders.IMAGE.decoder.blocks.0.0.weight": torch.randn(4),
        "modality_encoders.IMAGE.fixed_positional_encoder.positions": torch.randn(1, 512, 64),
        "_ema": torch.zeros(1),
        "recon_proj.weight": torch.randn(5, 64),
        "step": 7,
    }
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


def test_audio_columns_end_at_the_last_non_zero_sample():
    enc = SmallEncoder()
    column = enc.time_stride_frames * enc.fbank.params.shift_samples  # 1280 samples, 80 ms
    window = 10 * enc.sample_rate_hz
    wave = torch.ones(5, window)
    wave[1, 3 * column :] = 0  # audio in 3 columns, then padding
    wave[2, 3 * column + 1 :] = 0  # one sample into the 4th column
    wave[3] = 0  # silence: counted as full
    wave[4, -column // 2 :] = 0  # a few zero samples at the very end are sound's own, not padding
    assert enc.audio_columns(wave).tolist() == [enc.num_frames, 3, 4, enc.num_frames, enc.num_frames]
    assert enc.audio_columns(torch.ones(1, 2 * column)).tolist() == [enc.num_frames]  # a short input ending in sound


def test_a_full_window_pools_every_column_bit_for_bit():
    torch.manual_seed(0)
    enc = SmallEncoder().eval()
    wave = torch.randn(2, 10 * enc.sample_rate_hz) * 0.1
    with torch.no_grad():
        cls, dense = enc(wave)
    frames = dense.mean(dim=2)
    assert torch.equal(cls, frames.amax(dim=1) + frames.mean(dim=1))


def test_a_short_clip_embeds_alike_whatever_the_padding_after_it():
    """A 2 s clip zero-padded to a 10 s window (as the detector pads it) and to a 5 s one: the clip
    embedding pools its own columns only, so the padding's length leaves it as it was. Pooled over
    every column, as before, the two differ far more."""
    torch.manual_seed(0)
    enc = SmallEncoder().eval()
    rate = enc.sample_rate_hz
    clip = torch.randn(1, 2 * rate) * 0.1
    padded = [torch.cat([clip, torch.zeros(1, (seconds - 2) * rate)], dim=1) for seconds in (10, 5)]
    with torch.no_grad():
        (a, dense_a), (b, dense_b) = (enc(w) for w in padded)
    assert torch.allclose(a, b, atol=1e-5)
    everything = [d.mean(dim=2).amax(dim=1) + d.mean(dim=2).mean(dim=1) for d in (dense_a, dense_b)]
    assert (everything[0] - everything[1]).abs().max() > 100 * (a - b).abs().max()
