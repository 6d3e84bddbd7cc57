"""FineLAP itself: output shapes and unit norms for every adapter, one embedding per string,
and FLAM's per-text logit scale and bias."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainer.encoders import SmallEncoder
from trainer.features import FbankParams
from trainer.model import FineLAP


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
    assert torch.allclose(e.phrase_bias[0, 0], e.phrase_bias[1, 1]) and not torch.allclose(
        e.phrase_bias[0, 0], e.phrase_bias[0, 1]
    )
