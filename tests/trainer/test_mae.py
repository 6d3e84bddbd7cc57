"""Masked-autoencoder pretraining: masks, visible-only encoding, patch targets, the masked-only
loss, training on tiny encoders, the encoder's weights for the next stage and FLOP counting."""

from __future__ import annotations

import pytest
import torch

from trainer.encoders import EATEncoder, SmallEncoder, build_encoder
from trainer.features import FbankParams
from trainer.mae import (
    MaskedAutoencoder,
    encoder_state,
    flops_per_step,
    masked_mse,
    model_flops_utilisation,
    normalised_targets,
    patchify,
    random_mask,
    unpatchify,
)

TINY_FBANK = FbankParams(num_mel_bins=64, target_frames=128)  # 8 x 4 = 32 patches of 16 x 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_vit(seed: int = 0) -> EATEncoder:
    torch.manual_seed(seed)
    return EATEncoder(dim=32, depth=2, heads=2, fbank=TINY_FBANK)


def tiny_cnn(seed: int = 0) -> SmallEncoder:
    torch.manual_seed(seed)
    return SmallEncoder(width=32, fbank=TINY_FBANK)


def waves(n: int, seed: int = 1) -> torch.Tensor:
    """Harmonic tones at per-clip pitches with a little noise: structure a decoder can learn."""
    g = torch.Generator().manual_seed(seed)
    samples = tiny_vit().fbank.input_samples()
    t = torch.arange(samples) / 16000
    f0 = 200 + 600 * torch.rand(n, 1, generator=g)
    x = sum(torch.sin(2 * torch.pi * k * f0 * t) / k for k in (1, 2, 3))
    return 0.3 * x + 0.01 * torch.randn(n, samples, generator=g)


def test_mask_ratio_is_exact_per_example_and_seeded():
    n = 32
    keep, mask = random_mask(6, n, 0.8, torch.Generator().manual_seed(3))
    assert mask.shape == (6, n) and keep.shape == (6, n - round(0.8 * n))
    assert (mask.sum(dim=1) == round(0.8 * n)).all()  # 26 of 32 (25.6 rounds up)
    assert not mask.gather(1, keep).any()  # the kept indices are exactly the unmasked ones
    assert len({tuple(row.tolist()) for row in mask}) == 6  # each example draws its own mask
    again, mask2 = random_mask(6, n, 0.8, torch.Generator().manual_seed(3))
    assert torch.equal(keep, again) and torch.equal(mask, mask2)
    assert not torch.equal(mask, random_mask(6, n, 0.8, torch.Generator().manual_seed(4))[1])
    mae = MaskedAutoencoder(tiny_vit(), decoder_dim=32, decoder_depth=1, decoder_heads=2)
    out = mae(waves(3), torch.Generator().manual_seed(0))
    assert mae.num_patches == 32 and (out.mask.sum(dim=1) == 26).all()


def test_patchify_is_the_patch_embedding_convolution():
    enc = tiny_vit()
    spec = torch.randn(2, 128, 64)
    patches = patchify(spec, 16)  # (2, 32, 256)
    conv = enc.patch_embed(spec.unsqueeze(1)).flatten(2).transpose(1, 2)  # (2, 32, 32), time-major
    linear = torch.nn.functional.linear(patches, enc.patch_embed.weight.flatten(1), enc.patch_embed.bias)
    torch.testing.assert_close(linear, conv, atol=1e-5, rtol=1e-5)
    assert torch.equal(unpatchify(patches, 8, 16), spec)


def test_encoder_sees_only_visible_patches():
    mae = MaskedAutoencoder(tiny_vit(), decoder_dim=32, decoder_depth=1, decoder_heads=2)
    seen = []
    mae.encoder.blocks[0].register_forward_hook(lambda m, args, out: seen.append(args[0].shape))
    mae(waves(3), torch.Generator().manual_seed(0))
    assert seen == [torch.Size([3, 1 + 32 - 26, 32])]  # CLS + 6 visible tokens, not 1 + 32


def test_visible_encoding_equals_the_encoder_on_those_tokens():
    """With nothing masked, the MAE's encoder pass is the encoder's own forward."""
    enc = tiny_vit().eval()
    mae = MaskedAutoencoder(enc, decoder_dim=32, decoder_depth=1, decoder_heads=2, mask_ratio=0.0)
    wave = waves(2)
    spec = enc.features(wave)
    keep = torch.arange(32).expand(2, -1)
    cls, dense = enc(wave)
    x = mae.encode_visible(patchify(spec, 16), keep)
    torch.testing.assert_close(x[:, 0], cls, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x[:, 1:], dense.flatten(1, 2), atol=1e-5, rtol=1e-5)


def test_targets_are_normalised_per_patch():
    patches = torch.randn(2, 32, 256) * 3 + torch.arange(32).view(1, 32, 1)
    t = normalised_targets(patches)
    torch.testing.assert_close(t.mean(dim=-1), torch.zeros(2, 32), atol=1e-5, rtol=0)
    torch.testing.assert_close(t.var(dim=-1), torch.ones(2, 32), atol=1e-4, rtol=0)
    mae = MaskedAutoencoder(tiny_vit(), decoder_dim=32, decoder_depth=1, decoder_heads=2)
    out = mae(waves(2), torch.Generator().manual_seed(0))
    torch.testing.assert_close(out.target.mean(dim=-1), torch.zeros(2, 32), atol=1e-4, rtol=0)
    torch.testing.assert_close(out.target.var(dim=-1), torch.ones(2, 32), atol=1e-3, rtol=0)
    raw = MaskedAutoencoder(tiny_vit(), decoder_dim=32, decoder_depth=1, decoder_heads=2, norm_targets=False)
    spec = raw.encoder.features(waves(2))
    assert torch.equal(raw.reconstruct(spec).target, patchify(spec, 16))


def test_loss_ignores_visible_patches():
    g = torch.Generator().manual_seed(0)
    target, prediction = torch.randn(2, 32, 256, generator=g), torch.randn(2, 32, 256, generator=g)
    _, mask = random_mask(2, 32, 0.8, g)
    loss = masked_mse(prediction, target, mask)
    changed = prediction.clone()
    changed[~mask] += 100.0
    assert masked_mse(changed, target, mask) == loss
    changed[mask] += 1.0
    assert masked_mse(changed, target, mask) != loss
    per_patch = (prediction - target).pow(2).mean(-1)
    torch.testing.assert_close(loss, per_patch[mask].mean())


@pytest.mark.parametrize("make", [tiny_vit, tiny_cnn], ids=["vit", "cnn"])
def test_a_few_steps_lower_the_loss(make):
    mae = MaskedAutoencoder(make(), decoder_dim=32, decoder_depth=1, decoder_heads=2)
    opt = torch.optim.AdamW(mae.parameters(), lr=5e-3, weight_decay=0.01)
    wave = waves(8)
    spec = mae.encoder.features(wave)

    def loss_at(seed: int) -> float:
        mae.eval()
        with torch.no_grad():
            return mae.reconstruct(spec, torch.Generator().manual_seed(seed)).loss.item()

    before = sum(loss_at(s) for s in range(3))
    mae.train()
    g = torch.Generator().manual_seed(1)
    for _ in range(30):
        loss = mae.reconstruct(spec, g).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = sum(loss_at(s) for s in range(3))
    assert after < 0.85 * before, (before, after)


def test_simmim_zeroes_masked_input_and_predicts_every_patch():
    mae = MaskedAutoencoder(tiny_cnn(), mask_ratio=0.8)
    seen = []
    mae.encoder.blocks.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    out = mae(waves(2), torch.Generator().manual_seed(0))
    x = patchify(seen[0].squeeze(1), 16)  # the CNN's input, cut into the same patches
    assert (x[out.mask] == 0).all() and (x[~out.mask] != 0).any()
    assert out.prediction.shape == (2, 32, 256)
    with pytest.raises(ValueError, match="multiple of the CNN's stride"):
        MaskedAutoencoder(tiny_cnn(), patch=12)
    with pytest.raises(ValueError, match="its own 16x16 patches"):
        MaskedAutoencoder(tiny_vit(), patch=8)


@pytest.mark.parametrize("name", ["tiny-vit", "small"])
def test_encoder_state_loads_strictly_into_a_fresh_encoder(name):
    torch.manual_seed(0)
    mae = MaskedAutoencoder(build_encoder(name), decoder_dim=32, decoder_depth=1, decoder_heads=2)
    with torch.no_grad():
        for p in mae.encoder.parameters():
            p.add_(0.5)
    state = encoder_state(mae)
    assert not any(k.startswith("decoder") or k == "mask_token" for k in state)
    fresh = build_encoder(name)
    fresh.load_state_dict(state, strict=True)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, mae.encoder.state_dict()[k]), k


def test_flops_are_counted_without_touching_the_model():
    mae = MaskedAutoencoder(tiny_vit(), decoder_dim=32, decoder_depth=1, decoder_heads=2)
    before = {k: v.clone() for k, v in mae.state_dict().items()}
    flops = flops_per_step(mae, batch=2, seconds=1.28)
    assert flops > 0
    assert flops_per_step(mae, batch=4, seconds=1.28) == pytest.approx(2 * flops, rel=0.01)  # linear in the batch
    assert all(p.grad is None for p in mae.parameters())
    assert all(torch.equal(v, before[k]) for k, v in mae.state_dict().items())
    cnn = MaskedAutoencoder(tiny_cnn())
    assert flops_per_step(cnn, batch=2, seconds=1.28) > 0
    assert model_flops_utilisation(flops, step_s=0.5, peak_flops_per_s=4 * flops) == 0.5
