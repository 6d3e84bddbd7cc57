"""FineLAP: an audio encoder, a decoupled audio adapter and a text tower in one embedding space.

Inputs: waveforms ``(B, S)``, captions (B strings) and phrases (B x N strings). Outputs
(:class:`Embeddings`): unit-norm clip embeddings ``(B, d)`` from the global projector on the
encoder's CLS token, unit-norm frame embeddings ``(B, L, d)`` from the local adapter on the
dense tokens (mean over frequency, linear to d, then 2 Transformer layers), and unit-norm
caption ``(B, d)`` and phrase ``(B, N, d)`` embeddings from the shared 2-layer text projector.
With ``per_text_logits`` (FLAM) it also returns each phrase's logit scale and bias from two
small MLPs on the text feature.

Adapter variants (FineLAP Table 5/6): ``transformer`` (the paper's), ``bigru``, ``linear``, and
``shared`` (one projector for clip and frames: the "w/o decoupled projector" ablation).

The embeddings also carry the encoder's own frames ``(B, L, D)`` (its dense tokens averaged over
frequency, before any projection): what a captioning decoder cross-attends to (Cacophony: "a
cross-attention layer that attends to the full output of our audio encoder"). The model keeps
``caption_decoder``, the settings of that decoder, which :class:`~trainer.objective.Objective` builds
when ``train.loss.caption_weight > 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from trainer.encoders import AudioEncoder, build_encoder
from trainer.text import TextEncoder, to_device


def projector(width: int, dim: int) -> nn.Sequential:
    """The paper's "two linear layers" (a GELU between them)."""
    return nn.Sequential(nn.Linear(width, dim), nn.GELU(), nn.Linear(dim, dim))


class LocalAdapter(nn.Module):
    """Dense tokens ``(B, L, F, D)`` -> frame features ``(B, L, d)``."""

    def __init__(self, kind: str, width: int, dim: int, layers: int = 2, heads: int = 8, ffn: int = 4096, dropout: float = 0.1):
        super().__init__()
        self.kind = kind
        self.inp = nn.Linear(width, dim)
        if kind == "transformer":
            layer = nn.TransformerEncoderLayer(dim, heads, ffn, dropout, activation="gelu", batch_first=True)
            self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        elif kind == "bigru":
            self.body = nn.GRU(dim, dim // 2, num_layers=layers, batch_first=True, bidirectional=True)
        elif kind == "linear":
            self.body = nn.Sequential(nn.GELU(), nn.Linear(dim, dim))
        else:
            raise ValueError(f"model: unknown adapter {kind!r}; use transformer, bigru, linear or shared")

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        x = self.inp(dense.mean(dim=2))  # (B, L, d)
        x = self.body(x)
        return x[0] if isinstance(x, tuple) else x


class PerTextLogits(nn.Module):
    """FLAM's per-text logit scale and bias: two MLPs on the text feature ``(n, H)`` -> ``(n,)`` each."""

    def __init__(self, width: int, hidden: int = 256, init_scale: float = 10.0, init_bias: float = -8.0):
        super().__init__()
        self.scale = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, 1))
        self.bias = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, 1))
        for mlp, value in ((self.scale, math.log(init_scale)), (self.bias, init_bias)):
            nn.init.zeros_(mlp[-1].weight)
            nn.init.constant_(mlp[-1].bias, value)

    def forward(self, feature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.scale(feature).squeeze(-1).exp(), self.bias(feature).squeeze(-1)


@dataclass
class Embeddings:
    clip: torch.Tensor  # (B, d) unit norm
    frames: torch.Tensor  # (B, L, d) unit norm
    caption: torch.Tensor  # (B, d) unit norm
    phrases: torch.Tensor  # (B, N, d) unit norm
    phrase_scale: torch.Tensor | None = None  # (B, N) FLAM per-text scale
    phrase_bias: torch.Tensor | None = None  # (B, N) FLAM per-text bias
    encoder_frames: torch.Tensor | None = None  # (B, L, D) the encoder's dense tokens, mean over frequency (not normalised)


def _unit(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.normalize(x.float(), dim=-1)


class FineLAP(nn.Module):
    def __init__(
        self,
        encoder: AudioEncoder,
        text: TextEncoder,
        *,
        dim: int = 1024,
        adapter: Literal["transformer", "bigru", "linear", "shared"] = "transformer",
        adapter_ffn: int = 4096,
        adapter_heads: int = 8,
        dropout: float = 0.1,
        per_text_logits: bool = False,
        caption_decoder=None,
    ):
        super().__init__()
        self.encoder, self.text = encoder, text
        self.caption_decoder = caption_decoder  # train.model.caption_decoder (settings, not a module), for the objective
        # A BERT/RoBERTa pooler is never used (pooling reads the hidden states); left trainable it
        # gets no gradient, and DDP (find_unused_parameters=False) stops at the second step.
        pooler = getattr(getattr(text, "model", None), "pooler", None)
        if isinstance(pooler, nn.Module):
            pooler.requires_grad_(False)
        self.global_proj = projector(encoder.width, dim)
        self.adapter_kind = adapter
        self.local = (
            None
            if adapter == "shared"
            else LocalAdapter(adapter, encoder.width, dim, heads=adapter_heads, ffn=adapter_ffn, dropout=dropout)
        )
        self.text_proj = projector(text.width, dim)
        self.per_text = PerTextLogits(text.width) if per_text_logits else None

    def encode_audio(self, wave: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, S)`` -> clip ``(B, d)`` and frames ``(B, L, d)``, unit norm."""
        clip, frames, _ = self.encode_audio_frames(wave)
        return clip, frames

    def encode_audio_frames(self, wave: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(B, S)`` -> :meth:`encode_audio`'s clip and frames, and the encoder's frames ``(B, L, D)``
        (dense tokens averaged over frequency, as the encoder gives them)."""
        cls, dense = self.encoder(wave)
        clip = self.global_proj(cls)
        frames = self.global_proj(dense.mean(dim=2)) if self.local is None else self.local(dense)
        return _unit(clip), _unit(frames), dense.mean(dim=2)

    def encode_text(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Strings -> unit-norm embeddings ``(n, d)`` and the raw text features ``(n, H)``."""
        unique = sorted(set(texts))
        feature = self.text(unique)
        where = {t: i for i, t in enumerate(unique)}
        index = to_device(torch.tensor([where[t] for t in texts]), feature.device)
        return _unit(self.text_proj(feature))[index], feature[index]

    def forward(self, wave: torch.Tensor, captions: list[str], phrases: list[list[str]]) -> Embeddings:
        clip, frames, encoder_frames = self.encode_audio_frames(wave)
        b, n = len(phrases), len(phrases[0]) if phrases else 0
        flat = list(captions) + [p for row in phrases for p in row]
        text, feature = self.encode_text(flat)
        out = Embeddings(clip, frames, text[:b], text[b:].reshape(b, n, -1), encoder_frames=encoder_frames)
        if self.per_text is not None:
            scale, bias = self.per_text(feature[b:].float())
            out.phrase_scale, out.phrase_bias = scale.reshape(b, n), bias.reshape(b, n)
        return out


def compile_model(model: FineLAP, mode: str = "default") -> None:
    """``torch.compile`` the modules that hold the step's FLOPs, in place, in torch.compile's
    ``mode``: the audio encoder, the text tower when it trains, and the frame adapter. The losses
    stay eager (their shapes and host-side bookkeeping change from batch to batch)."""
    model.encoder.compile(mode=mode)
    if not model.text.frozen:  # padded texts: a static graph per padded shape, not one dynamic graph
        model.text.model.compile(mode=mode, **({"dynamic": False} if model.text.pad_rows else {}))
    if model.local is not None:
        model.local.compile(mode=mode)


def build_model(p) -> FineLAP:
    """A :class:`FineLAP` from ``train.model`` params."""
    encoder = build_encoder(p.encoder, p.encoder_checkpoint)
    text = TextEncoder(p.text_model, p.text_pooling, p.text_max_tokens, frozen=p.freeze_text, pad_rows=p.text_pad_rows)
    return FineLAP(
        encoder,
        text,
        dim=p.embed_dim,
        adapter=p.adapter,
        adapter_ffn=p.adapter_ffn,
        adapter_heads=p.adapter_heads,
        dropout=p.dropout,
        per_text_logits=p.per_text_logits,
        caption_decoder=p.caption_decoder,
    )
